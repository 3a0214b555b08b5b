//! The JSON Lines recording (`*.jsonl`, `*.jsonl.gz`): a header line, then one [`StreamItem`] per
//! line. Written by `--record FILE.jsonl[.gz]` and by `export`; read item by item. A cut last line
//! (what a killed writer leaves) is dropped and said; a malformed line elsewhere is an error.
use std::io::{self, BufRead, Write};
use std::iter::{Enumerate, Peekable};
use std::path::{Path, PathBuf};

use super::{FORMAT, Header, RecordError, Tail, VERSION};
use crate::event::StreamItem;

/// Writes one JSON object per line to `out`.
pub struct LineWriter {
    out: Box<dyn Write>,
    line: Vec<u8>,
    /// Bytes of JSON written (before any compression).
    pub bytes: u64,
}

impl LineWriter {
    pub fn new(out: Box<dyn Write>, daemon_version: &str) -> io::Result<Self> {
        let mut w = LineWriter {
            out,
            line: Vec::new(),
            bytes: 0,
        };
        let header = Header {
            format: FORMAT.into(),
            version: VERSION,
            daemon_version: daemon_version.into(),
        };
        serde_json::to_writer(&mut w.line, &header).expect("header serializes");
        w.end_line()?;
        Ok(w)
    }

    fn end_line(&mut self) -> io::Result<()> {
        self.line.push(b'\n');
        self.out.write_all(&self.line)?;
        self.bytes += self.line.len() as u64;
        self.line.clear();
        Ok(())
    }

    pub fn write(&mut self, item: &StreamItem) -> io::Result<()> {
        serde_json::to_writer(&mut self.line, item).expect("stream items serialize");
        self.end_line()
    }

    /// Flushes (a sync flush for gzip: what was written is readable even if the writer dies).
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

type SplitLines<R> = Peekable<Enumerate<io::Split<R>>>;

/// Reads a JSON Lines recording item by item.
pub struct LineReader<R: BufRead> {
    lines: SplitLines<R>,
    path: PathBuf,
    done: bool,
    pub(super) tail: Tail,
    pub(super) daemon_version: Option<String>,
}

impl<R: BufRead> LineReader<R> {
    /// Reads and checks the header line.
    pub fn new(reader: R, path: &Path) -> Result<Self, RecordError> {
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
        let version = value.get("version").and_then(|v| v.as_u64()).unwrap_or(0);
        if version > u64::from(VERSION) {
            return Err(RecordError::FutureVersion {
                path: path.into(),
                found: u32::try_from(version).unwrap_or(u32::MAX),
                known: VERSION,
            });
        }
        let daemon_version = value
            .get("daemon_version")
            .and_then(|v| v.as_str())
            .map(str::to_owned);
        Ok(LineReader {
            lines,
            path: path.into(),
            done: false,
            tail: Tail::default(),
            daemon_version,
        })
    }

    /// The next item; `None` at the end (or at a cut last line, said in `tail`).
    pub fn next_item(&mut self) -> Result<Option<StreamItem>, RecordError> {
        if self.done {
            return Ok(None);
        }
        let r = self.next_inner();
        if !matches!(r, Ok(Some(_))) {
            self.done = true;
        }
        r
    }

    fn next_inner(&mut self) -> Result<Option<StreamItem>, RecordError> {
        while let Some((i, line)) = self.lines.next() {
            let line = match line {
                Ok(l) => l,
                // A compressed stream cut short (killed writer) ends in a read error: what came
                // before is intact.
                Err(e)
                    if e.kind() == io::ErrorKind::UnexpectedEof
                        || e.kind() == io::ErrorKind::InvalidInput =>
                {
                    self.tail.truncated = true;
                    return Ok(None);
                }
                Err(source) => {
                    return Err(RecordError::Open {
                        path: self.path.clone(),
                        source,
                    });
                }
            };
            if line.is_empty() {
                continue;
            }
            match serde_json::from_slice::<StreamItem>(&line) {
                Ok(item) => return Ok(Some(item)),
                // A cut last line is what a killed writer leaves: keep everything before it.
                Err(_) if self.lines.peek().is_none() => {
                    self.tail.truncated = true;
                    self.tail.dropped_bytes = line.len() as u64;
                    return Ok(None);
                }
                Err(e) => {
                    return Err(RecordError::Malformed {
                        path: self.path.clone(),
                        line: i + 1,
                        msg: e.to_string(),
                    });
                }
            }
        }
        Ok(None)
    }
}
