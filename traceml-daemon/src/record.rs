//! Recording and replaying the event stream.
//!
//! Format (documented in `docs/recording-format.md`): JSON Lines, UTF-8. The first line is a
//! header `{"format":"traceml-recording","version":1,...}`; every following line is one
//! [`StreamItem`]. A recording cut short (daemon killed) is still readable: the reader stops at
//! the last complete line and reports that the run has no `end` item.
use std::io::{BufRead, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::event::StreamItem;

pub const FORMAT: &str = "traceml-recording";
pub const VERSION: u32 = 1;

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
    #[error("{path} is not a traceml recording (first line: {first:.60})")]
    NotRecording { path: PathBuf, first: String },
    #[error(
        "{path} was written by a newer traceml-daemon (recording version {found}); this build reads \
         version {VERSION}"
    )]
    FutureVersion { path: PathBuf, found: u32 },
    #[error("{path}, line {line}: malformed item: {msg}")]
    Malformed {
        path: PathBuf,
        line: usize,
        msg: String,
    },
}

/// Writes items as they come; flushes on every `flush` (the live loop flushes each poll).
pub struct Writer {
    path: PathBuf,
    out: Box<dyn Write>,
    /// Bytes of JSON written (before compression).
    pub bytes: u64,
}

impl Writer {
    pub fn create(path: &Path) -> Result<Self, RecordError> {
        let file = std::fs::File::create(path).map_err(|source| RecordError::Open {
            path: path.into(),
            source,
        })?;
        let file = BufWriter::new(file);
        // A `.gz` name gets a gzip stream (about 20x smaller); each flush is a sync flush, so a
        // killed daemon leaves a readable prefix.
        let out: Box<dyn Write> = if path.extension().is_some_and(|e| e == "gz") {
            Box::new(flate2::write::GzEncoder::new(
                file,
                flate2::Compression::default(),
            ))
        } else {
            Box::new(file)
        };
        let mut w = Writer {
            path: path.into(),
            out,
            bytes: 0,
        };
        let header = Header {
            format: FORMAT.into(),
            version: VERSION,
            daemon_version: env!("CARGO_PKG_VERSION").into(),
        };
        w.line(&serde_json::to_string(&header).expect("header serializes"))?;
        Ok(w)
    }

    fn line(&mut self, s: &str) -> Result<(), RecordError> {
        let err = |source| RecordError::Write {
            path: self.path.clone(),
            source,
        };
        self.out.write_all(s.as_bytes()).map_err(err)?;
        self.out
            .write_all(b"\n")
            .map_err(|source| RecordError::Write {
                path: self.path.clone(),
                source,
            })?;
        self.bytes += s.len() as u64 + 1;
        Ok(())
    }

    pub fn write(&mut self, item: &StreamItem) -> Result<(), RecordError> {
        self.line(&serde_json::to_string(item).expect("stream items serialize"))
    }

    pub fn flush(&mut self) -> Result<(), RecordError> {
        self.out.flush().map_err(|source| RecordError::Write {
            path: self.path.clone(),
            source,
        })
    }
}

/// What a recording holds.
#[derive(Debug)]
pub struct Recording {
    pub items: Vec<StreamItem>,
    /// The last line was cut (the writer was killed mid-line); it was ignored.
    pub truncated_tail: bool,
}

/// Reads a whole recording.
/// Reads a whole recording, plain or gzip-compressed (recognised by its magic bytes).
pub fn read(path: &Path) -> Result<Recording, RecordError> {
    let open = |source| RecordError::Open {
        path: path.into(),
        source,
    };
    let mut file = std::io::BufReader::new(std::fs::File::open(path).map_err(open)?);
    let gzip = file
        .fill_buf()
        .map_err(|source| RecordError::Open {
            path: path.into(),
            source,
        })?
        .starts_with(&[0x1f, 0x8b]);
    if gzip {
        read_from(
            std::io::BufReader::new(flate2::bufread::MultiGzDecoder::new(file)),
            path,
        )
    } else {
        read_from(file, path)
    }
}

pub fn read_from(reader: impl BufRead, path: &Path) -> Result<Recording, RecordError> {
    let mut lines = reader.split(b'\n').enumerate().peekable();
    let first = match lines.next() {
        None => return Err(RecordError::Empty { path: path.into() }),
        Some((_, l)) => l.map_err(|source| RecordError::Open {
            path: path.into(),
            source,
        })?,
    };
    let first = String::from_utf8_lossy(&first).into_owned();
    let value: serde_json::Value =
        serde_json::from_str(&first).map_err(|_| RecordError::NotRecording {
            path: path.into(),
            first: first.clone(),
        })?;
    if value.get("format").and_then(|f| f.as_str()) != Some(FORMAT) {
        return Err(RecordError::NotRecording {
            path: path.into(),
            first,
        });
    }
    let version = value.get("version").and_then(|v| v.as_u64()).unwrap_or(0) as u32;
    if version > VERSION {
        return Err(RecordError::FutureVersion {
            path: path.into(),
            found: version,
        });
    }
    let mut items = Vec::new();
    let mut truncated_tail = false;
    while let Some((i, line)) = lines.next() {
        let line = match line {
            Ok(l) => l,
            // A compressed stream cut short (killed writer) ends in a read error: what came
            // before is intact.
            Err(e)
                if e.kind() == std::io::ErrorKind::UnexpectedEof
                    || e.kind() == std::io::ErrorKind::InvalidInput =>
            {
                truncated_tail = true;
                break;
            }
            Err(source) => {
                return Err(RecordError::Open {
                    path: path.into(),
                    source,
                });
            }
        };
        if line.is_empty() {
            continue;
        }
        match serde_json::from_slice::<StreamItem>(&line) {
            Ok(item) => items.push(item),
            // A cut last line is what a killed writer leaves: keep everything before it.
            Err(_) if lines.peek().is_none() => truncated_tail = true,
            Err(e) => {
                return Err(RecordError::Malformed {
                    path: path.into(),
                    line: i + 1,
                    msg: e.to_string(),
                });
            }
        }
    }
    Ok(Recording {
        items,
        truncated_tail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{End, EndReason, Event, Kind};

    fn items() -> Vec<StreamItem> {
        vec![
            StreamItem::Event(Event {
                ts: 5,
                tgid: 1,
                tid: 1,
                kind: Kind::RecordExit,
            }),
            StreamItem::End(End {
                ts: 9,
                reason: EndReason::TargetExited,
            }),
        ]
    }

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.jsonl");
        let mut w = Writer::create(&p).unwrap();
        for it in items() {
            w.write(&it).unwrap();
        }
        w.flush().unwrap();
        let r = read(&p).unwrap();
        assert_eq!(r.items, items());
        assert!(!r.truncated_tail);
    }

    #[test]
    fn gzip_round_trip_and_cut_stream() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.jsonl.gz");
        let mut w = Writer::create(&p).unwrap();
        for it in items() {
            w.write(&it).unwrap();
        }
        w.flush().unwrap();
        drop(w);
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(&bytes[..2], &[0x1f, 0x8b], "gzip magic");
        let r = read(&p).unwrap();
        assert_eq!(r.items, items());
        assert!(!r.truncated_tail);
        // A writer killed after a flush: no gzip trailer. Everything flushed is readable.
        let mut w = Writer::create(&p).unwrap();
        for it in items() {
            w.write(&it).unwrap();
        }
        w.flush().unwrap();
        let flushed = std::fs::read(&p).unwrap();
        std::mem::forget(w);
        let cut = dir.path().join("cut.jsonl.gz");
        std::fs::write(&cut, &flushed).unwrap();
        let r = read(&cut).unwrap();
        assert_eq!(r.items, items());
        assert!(r.truncated_tail);
    }

    #[test]
    fn truncated_tail_is_tolerated_and_said() {
        let text = "{\"format\":\"traceml-recording\",\"version\":1,\"daemon_version\":\"0\"}\n\
                    {\"t\":\"event\",\"ts\":5,\"tgid\":1,\"tid\":1,\"k\":\"record_exit\"}\n{\"t\":\"ev";
        let r = read_from(text.as_bytes(), Path::new("x")).unwrap();
        assert_eq!(r.items.len(), 1);
        assert!(r.truncated_tail);
    }

    #[test]
    fn bad_inputs_get_clear_errors() {
        let p = Path::new("x");
        assert!(matches!(
            read_from(&b""[..], p),
            Err(RecordError::Empty { .. })
        ));
        assert!(matches!(
            read_from(&b"hello\n"[..], p),
            Err(RecordError::NotRecording { .. })
        ));
        let future = b"{\"format\":\"traceml-recording\",\"version\":9}\n";
        let e = read_from(&future[..], p).unwrap_err();
        assert!(e.to_string().contains("newer traceml-daemon"), "{e}");
        let mid = b"{\"format\":\"traceml-recording\",\"version\":1}\nnot json\n{\"t\":\"end\",\"ts\":1,\"reason\":\"interrupted\"}\n";
        assert!(matches!(
            read_from(&mid[..], p),
            Err(RecordError::Malformed { line: 2, .. })
        ));
    }
}
