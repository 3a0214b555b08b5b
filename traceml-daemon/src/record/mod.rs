//! Recording and replaying the event stream, in two formats (`docs/recording-format.md`): the
//! compact binary one (`*.trec`, [`binary`]) and JSON Lines (`*.jsonl`, `*.jsonl.gz`, [`jsonl`]),
//! kept as an export. [`Writer`] picks the format by file name; [`Reader`] by the file's first
//! bytes, and yields items one at a time (replay folds them as they come, in bounded memory).
//! A recording cut short (daemon killed) is read up to its last whole block or line, and the
//! reader says how much it dropped.
pub mod binary;
mod compact;
mod jsonl;
#[cfg(test)]
mod tests;

use std::io::{BufRead, BufWriter, Cursor, Read};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::event::StreamItem;

pub const FORMAT: &str = "traceml-recording";
/// Version of the item schema: the JSON Lines header's `version`, and the binary header
/// frame's. (The binary container has its own, [`binary::BINARY_VERSION`].)
pub const VERSION: u32 = 1;
/// The version this build writes into recordings.
pub const DAEMON_VERSION: &str = env!("CARGO_PKG_VERSION");

/// A live binary recording closes a block at least this often, so a killed daemon loses at
/// most this much of the run (or one block, whichever is less).
pub const BLOCK_MAX_AGE: Duration = Duration::from_secs(1);

/// The header line of a JSON Lines recording, and the binary recording's header frame.
#[derive(Debug, Serialize, Deserialize)]
struct Header {
    format: String,
    version: u32,
    daemon_version: String,
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("cannot open recording {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write recording {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is empty: not a traceml recording")]
    Empty { path: PathBuf },
    #[error("{path} ends inside its header: the recording was cut before any item")]
    CutHeader { path: PathBuf },
    #[error("{path} is not a traceml recording (first line: {first:.60})")]
    NotRecording { path: PathBuf, first: String },
    #[error(
        "{path} was written by a newer traceml-daemon (recording version {found}); this build \
         reads version {known}"
    )]
    FutureVersion {
        path: PathBuf,
        found: u32,
        known: u32,
    },
    #[error(
        "{path} was written by a newer traceml-daemon: it uses recording features this build \
         does not know (flags {flags:#06x})"
    )]
    FutureFeatures { path: PathBuf, flags: u16 },
    #[error("{path}, line {line}: malformed item: {msg}")]
    Malformed {
        path: PathBuf,
        line: usize,
        msg: String,
    },
    #[error("{path}, block at byte {offset}: corrupt recording: {msg}")]
    Corrupt {
        path: PathBuf,
        offset: u64,
        msg: String,
    },
}

/// The two formats (JSON Lines plain or gzip-compressed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Binary,
    Jsonl,
    JsonlGz,
}

impl Format {
    /// By file name: `*.trec` binary, `*.gz` gzip-compressed JSON Lines, anything else JSON
    /// Lines (as before the binary format existed).
    pub fn for_path(path: &Path) -> Format {
        match path.extension().and_then(|e| e.to_str()) {
            Some("trec") => Format::Binary,
            Some("gz") => Format::JsonlGz,
            _ => Format::Jsonl,
        }
    }
}

/// The recording of one rank of a multi-rank job, next to `path`: `run.trec` → `run.rank1.trec`,
/// and in the job's `restart`-th restarted attempt (elastic) `run.rank1.restart<k>.trec`
/// (`.jsonl`, `.jsonl.gz` and `.trec` kept last, so the format stays the one asked for).
pub fn rank_path(path: &Path, rank: u32, restart: u32) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (stem, ext) = [".jsonl.gz", ".jsonl", ".trec", ".gz"]
        .iter()
        .find_map(|e| name.strip_suffix(e).map(|s| (s.to_owned(), *e)))
        .unwrap_or((name, ""));
    let attempt = match restart {
        0 => String::new(),
        k => format!(".restart{k}"),
    };
    path.with_file_name(format!("{stem}.rank{rank}{attempt}{ext}"))
}

/// Whether a live run flushes its recording after writing `item`: at the attach (target,
/// libraries), at probe-set changes and loss reports, with the probe counters (about once a
/// second) and at the end; a daemon killed with SIGKILL loses at most about its last second.
fn flush_after(item: &StreamItem) -> bool {
    matches!(
        item,
        StreamItem::End(_)
            | StreamItem::Lost(_)
            | StreamItem::Target(_)
            | StreamItem::Library(_)
            | StreamItem::ProbeSet(_)
            | StreamItem::ProbeStats(_)
    )
}

/// Whether a file starting with `head` is a recording of either format (a gzip stream counts:
/// recordings are the only gzip files the daemon reads).
pub fn looks_like_recording(head: &[u8]) -> bool {
    head.starts_with(&[0x1f, 0x8b])
        || head.starts_with(&binary::MAGIC)
        || String::from_utf8_lossy(head)
            .trim_start()
            .starts_with(&format!("{{\"format\":\"{FORMAT}\""))
}

/// Writes items as they come in the format of the file's name. The binary writer closes a
/// block every 64 KiB or [`BLOCK_MAX_AGE`]; `flush` closes it at once (the live loop flushes at
/// the attach, loss reports, probe-set changes, about once a second and at the end). Dropping
/// the writer flushes it.
pub struct Writer {
    path: PathBuf,
    sink: Destination,
}

enum Destination {
    Lines(jsonl::LineWriter),
    Binary(Box<binary::Encoder<BufWriter<std::fs::File>>>),
}

impl Writer {
    /// A recording in the format its name says, stamped with this build's version.
    pub fn create(path: &Path) -> Result<Self, RecordError> {
        Self::create_as(path, Format::for_path(path), DAEMON_VERSION)
    }

    /// A recording in `format`, stamped with `daemon_version` (an export keeps the original's).
    pub fn create_as(
        path: &Path,
        format: Format,
        daemon_version: &str,
    ) -> Result<Self, RecordError> {
        let file = std::fs::File::create(path).map_err(|source| RecordError::Open {
            path: path.into(),
            source,
        })?;
        Self::from_file_as(file, path, format, daemon_version)
    }

    /// A recording written to `file`, opened for it by the caller (the daemon opens it with
    /// `crate::host::output::create_file`: no planted symbolic link is followed, and under `sudo` the
    /// user gets the file); `path` names it in errors and its extension chooses the format.
    pub fn from_file(file: std::fs::File, path: &Path) -> Result<Self, RecordError> {
        Self::from_file_as(file, path, Format::for_path(path), DAEMON_VERSION)
    }

    fn from_file_as(
        file: std::fs::File,
        path: &Path,
        format: Format,
        daemon_version: &str,
    ) -> Result<Self, RecordError> {
        let file = BufWriter::new(file);
        let sink = match format {
            Format::Binary => binary::Encoder::new(file, daemon_version)
                .map(|e| Destination::Binary(Box::new(e.max_age(Some(BLOCK_MAX_AGE))))),
            // Each flush of the gzip stream is a sync flush: a killed daemon leaves a readable
            // prefix.
            Format::JsonlGz => jsonl::LineWriter::new(
                Box::new(flate2::write::GzEncoder::new(
                    file,
                    flate2::Compression::default(),
                )),
                daemon_version,
            )
            .map(Destination::Lines),
            Format::Jsonl => {
                jsonl::LineWriter::new(Box::new(file), daemon_version).map(Destination::Lines)
            }
        }
        .map_err(|source| RecordError::Write {
            path: path.into(),
            source,
        })?;
        Ok(Writer {
            path: path.into(),
            sink,
        })
    }

    fn err(&self, source: std::io::Error) -> RecordError {
        RecordError::Write {
            path: self.path.clone(),
            source,
        }
    }

    pub fn write(&mut self, item: &StreamItem) -> Result<(), RecordError> {
        match &mut self.sink {
            Destination::Lines(w) => w.write(item),
            Destination::Binary(e) => e.write(item),
        }
        .map_err(|e| self.err(e))
    }

    /// Writes an item of a live run, flushing where [`flush_after`] says.
    pub fn write_live(&mut self, item: &StreamItem) -> Result<(), RecordError> {
        self.write(item)?;
        if flush_after(item) {
            self.flush()?;
        }
        Ok(())
    }

    pub fn flush(&mut self) -> Result<(), RecordError> {
        match &mut self.sink {
            Destination::Lines(w) => w.flush(),
            Destination::Binary(e) => e.flush(),
        }
        .map_err(|e| self.err(e))
    }

    /// Bytes written before compression (JSON text, or binary frames).
    pub fn bytes(&self) -> u64 {
        match &self.sink {
            Destination::Lines(w) => w.bytes,
            Destination::Binary(e) => e.raw_bytes(),
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Best effort: an error here was already reported by the last explicit flush, or
        // the run is failing for another reason.
        let _ = self.flush();
    }
}

/// How a recording ended, beyond its items.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tail {
    /// The file was cut short (the writer was killed): an incomplete last block or line was
    /// dropped.
    pub truncated: bool,
    /// Bytes of that incomplete tail (of the decompressed stream for a `.gz` file; 0 when a gzip
    /// stream itself was cut).
    pub dropped_bytes: u64,
    /// Frames of types this build does not know (from a newer writer), skipped.
    pub skipped_frames: u64,
}

/// Reads a recording of either format item by item.
pub struct Reader<'a> {
    inner: Inner<'a>,
}

enum Inner<'a> {
    Lines(jsonl::LineReader<Box<dyn BufRead + 'a>>),
    Binary(binary::Decoder<Box<dyn BufRead + 'a>>),
}

impl Reader<'static> {
    /// Opens a recording file of either format, plain or gzip-compressed.
    pub fn open(path: &Path) -> Result<Self, RecordError> {
        let file = std::fs::File::open(path).map_err(|source| RecordError::Open {
            path: path.into(),
            source,
        })?;
        Reader::new(std::io::BufReader::new(file), path)
    }
}

impl<'a> Reader<'a> {
    /// Reads a recording from `reader`, recognising its format by its first bytes: gzip (then
    /// what it holds), the binary magic, or else JSON Lines. `path` names it in messages.
    pub fn new(reader: impl BufRead + 'a, path: &Path) -> Result<Self, RecordError> {
        let (head, reader) = peek(Box::new(reader), path)?;
        let (head, reader) = if head.starts_with(&[0x1f, 0x8b]) {
            let gz = std::io::BufReader::new(flate2::bufread::MultiGzDecoder::new(reader));
            peek(Box::new(gz), path)?
        } else {
            (head, reader)
        };
        let inner = if head.starts_with(&binary::MAGIC) {
            Inner::Binary(binary::Decoder::new(reader, path)?)
        } else if !head.is_empty()
            && head.len() < binary::MAGIC.len()
            && binary::MAGIC.starts_with(&head)
        {
            return Err(RecordError::CutHeader { path: path.into() });
        } else {
            Inner::Lines(jsonl::LineReader::new(reader, path)?)
        };
        Ok(Reader { inner })
    }

    /// The next item; `None` at the end of the recording (see [`Reader::tail`]).
    pub fn next_item(&mut self) -> Result<Option<StreamItem>, RecordError> {
        match &mut self.inner {
            Inner::Lines(r) => r.next_item(),
            Inner::Binary(r) => r.next_item(),
        }
    }

    /// Whether the recording was cut short and what was skipped; final once `next_item` has
    /// returned `None`.
    pub fn tail(&self) -> Tail {
        match &self.inner {
            Inner::Lines(r) => r.tail,
            Inner::Binary(r) => r.tail,
        }
    }

    /// The version of the daemon that wrote the recording, from its header.
    pub fn daemon_version(&self) -> Option<&str> {
        match &self.inner {
            Inner::Lines(r) => r.daemon_version.as_deref(),
            Inner::Binary(r) => r.daemon_version.as_deref(),
        }
    }

    pub fn format(&self) -> Format {
        match &self.inner {
            Inner::Lines(_) => Format::Jsonl,
            Inner::Binary(_) => Format::Binary,
        }
    }
}

impl Iterator for Reader<'_> {
    type Item = Result<StreamItem, RecordError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_item().transpose()
    }
}

/// The first bytes of `reader` (up to the magic's length) and a reader that still yields them.
fn peek<'a>(
    mut reader: Box<dyn BufRead + 'a>,
    path: &Path,
) -> Result<(Vec<u8>, Box<dyn BufRead + 'a>), RecordError> {
    let mut head = Vec::with_capacity(binary::MAGIC.len());
    (&mut reader)
        .take(binary::MAGIC.len() as u64)
        .read_to_end(&mut head)
        .map_err(|source| RecordError::Open {
            path: path.into(),
            source,
        })?;
    let again: Box<dyn BufRead + 'a> = Box::new(Cursor::new(head.clone()).chain(reader));
    Ok((head, again))
}

/// What a whole recording holds.
#[derive(Debug)]
pub struct Recording {
    pub items: Vec<StreamItem>,
    /// The last block or line was cut (the writer was killed); it was ignored.
    pub truncated_tail: bool,
    /// Bytes of that cut tail.
    pub dropped_bytes: u64,
    /// Frames of unknown types skipped.
    pub skipped_frames: u64,
}

/// Reads a whole recording file, of either format, plain or gzip-compressed.
pub fn read(path: &Path) -> Result<Recording, RecordError> {
    collect(Reader::open(path)?)
}

/// Reads a whole recording from `reader` (format recognised by its first bytes).
pub fn read_from(reader: impl BufRead, path: &Path) -> Result<Recording, RecordError> {
    collect(Reader::new(reader, path)?)
}

fn collect(mut r: Reader) -> Result<Recording, RecordError> {
    let mut items = Vec::new();
    while let Some(item) = r.next_item()? {
        items.push(item);
    }
    let tail = r.tail();
    Ok(Recording {
        items,
        truncated_tail: tail.truncated,
        dropped_bytes: tail.dropped_bytes,
        skipped_frames: tail.skipped_frames,
    })
}

/// Copies a recording into another file, in the format of `output`'s name (`export`); returns
/// the items copied and the input's tail.
pub fn export(input: &Path, output: &Path) -> Result<(u64, Tail), RecordError> {
    let mut r = Reader::open(input)?;
    let version = r.daemon_version().unwrap_or(DAEMON_VERSION).to_owned();
    let mut w = Writer::create_as(output, Format::for_path(output), &version)?;
    let mut n = 0u64;
    while let Some(item) = r.next_item()? {
        w.write(&item)?;
        n += 1;
    }
    w.flush()?;
    Ok((n, r.tail()))
}
