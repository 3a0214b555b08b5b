//! The binary recording (`*.trec`, `docs/recording-format.md`): a file header, then blocks of
//! frames, each block compressed on its own and checked by a CRC-32, so a file cut short loses
//! at most its last block. Events and stack samples have compact frames ([`super::compact`]);
//! every other item is a frame of JSON. The writer holds one block (about 64 KiB) at a time,
//! the reader one decoded block.
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use flate2::{Compress, Compression, Crc, Decompress, FlushCompress, FlushDecompress, Status};

use super::compact::{Bad, Bytes, EventDecoder, EventEncoder, put_varint};
use super::{FORMAT, Header, RecordError, Tail, VERSION};
use crate::event::StreamItem;

/// The first 8 bytes of a binary recording (PNG-style: a non-ASCII byte, a name, and the line
/// endings and EOF byte that a text-mode transfer would mangle).
pub const MAGIC: [u8; 8] = *b"\x89TREC\r\n\x1a";
/// Version of the container (header, blocks, frames, compact payloads).
pub const BINARY_VERSION: u16 = 1;
/// Bytes of the file header: magic, version (u16 LE), flags (u16 LE).
pub const HEADER_LEN: usize = 12;
/// Flag bits a reader must know to read the file (bits 0–7); bits 8–15 may be ignored.
pub const REQUIRED_FLAGS: u16 = 0x00ff;

/// Frame types. Values are never reused; a reader skips types it does not know.
pub const FRAME_HEADER: u8 = 1;
pub const FRAME_EVENT: u8 = 2;
pub const FRAME_ITEM: u8 = 3;
pub const FRAME_STACK: u8 = 4;

/// Block codecs.
pub const CODEC_STORED: u8 = 0;
pub const CODEC_DEFLATE: u8 = 1;

/// A writer closes its block once the block holds this many bytes.
pub const BLOCK_BYTES: usize = 64 * 1024;
/// Largest block body a reader accepts.
pub const MAX_BLOCK_BYTES: usize = 16 << 20;

/// Writes a binary recording to `W`, one block at a time.
pub struct Encoder<W: Write> {
    out: W,
    frames: Vec<u8>,
    /// The timestamp column: low bytes, second bytes, then varints of the rest.
    ts_lo: Vec<u8>,
    ts_mid: Vec<u8>,
    ts_hi: Vec<u8>,
    payload: Vec<u8>,
    body: Vec<u8>,
    packed: Vec<u8>,
    deflate: Compress,
    events: EventEncoder,
    block_bytes: usize,
    /// Close a block once its first frame is this old (a killed writer loses at most that).
    max_age: Option<Duration>,
    opened: Option<Instant>,
    raw_bytes: u64,
}

impl<W: Write> Encoder<W> {
    /// Writes the file header and a first block holding the header frame.
    pub fn new(mut out: W, daemon_version: &str) -> io::Result<Self> {
        let mut head = Vec::with_capacity(HEADER_LEN);
        head.extend_from_slice(&MAGIC);
        head.extend_from_slice(&BINARY_VERSION.to_le_bytes());
        head.extend_from_slice(&0u16.to_le_bytes());
        out.write_all(&head)?;
        let mut e = Encoder {
            out,
            frames: Vec::new(),
            ts_lo: Vec::new(),
            ts_mid: Vec::new(),
            ts_hi: Vec::new(),
            payload: Vec::new(),
            body: Vec::new(),
            packed: Vec::new(),
            deflate: Compress::new(Compression::default(), false),
            events: EventEncoder::default(),
            block_bytes: BLOCK_BYTES,
            max_age: None,
            opened: None,
            raw_bytes: 0,
        };
        let header = Header {
            format: FORMAT.into(),
            version: VERSION,
            daemon_version: daemon_version.into(),
        };
        let json = serde_json::to_vec(&header).expect("header serializes");
        e.frame(FRAME_HEADER, &json)?;
        e.flush()?;
        Ok(e)
    }

    /// Closes blocks at `bytes` instead of [`BLOCK_BYTES`] (tests make many small blocks).
    pub fn block_bytes(mut self, bytes: usize) -> Self {
        self.block_bytes = bytes.clamp(1, MAX_BLOCK_BYTES / 2);
        self
    }

    /// Closes a block once its first frame is `age` old.
    pub fn max_age(mut self, age: Option<Duration>) -> Self {
        self.max_age = age;
        self
    }

    /// Bytes of frames and timestamps written, before compression.
    pub fn raw_bytes(&self) -> u64 {
        self.raw_bytes
    }

    pub fn write(&mut self, item: &StreamItem) -> io::Result<()> {
        let mut payload = std::mem::take(&mut self.payload);
        payload.clear();
        let r = match item {
            StreamItem::Event(e) => match self.events.encode(e, &mut payload) {
                Some(delta) => {
                    // The frame first: adding it may close the block, and its timestamp
                    // belongs to the block that holds it.
                    let r = self.frame(FRAME_EVENT, &payload);
                    if r.is_ok() {
                        self.ts_lo.push(delta as u8);
                        self.ts_mid.push((delta >> 8) as u8);
                        put_varint(&mut self.ts_hi, delta >> 16);
                    }
                    r
                }
                None => {
                    serde_json::to_writer(&mut payload, item).expect("stream items serialize");
                    self.frame(FRAME_ITEM, &payload)
                }
            },
            StreamItem::Stack(s) => {
                self.events.encode_stack(s, &mut payload);
                self.frame(FRAME_STACK, &payload)
            }
            other => {
                serde_json::to_writer(&mut payload, other).expect("stream items serialize");
                self.frame(FRAME_ITEM, &payload)
            }
        };
        self.payload = payload;
        r?;
        let full = self.frames.len() + 2 * self.ts_lo.len() + self.ts_hi.len() >= self.block_bytes;
        let old = match (self.max_age, self.opened) {
            (Some(age), Some(t)) => t.elapsed() >= age,
            _ => false,
        };
        if full || old { self.emit() } else { Ok(()) }
    }

    fn frame(&mut self, kind: u8, payload: &[u8]) -> io::Result<()> {
        if payload.len() + 16 > MAX_BLOCK_BYTES / 2 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a stream item too large for a recording block",
            ));
        }
        if self.frames.len() + payload.len() + 16 > MAX_BLOCK_BYTES / 2 {
            self.emit()?;
        }
        let before = self.frames.len();
        put_varint(&mut self.frames, payload.len() as u64);
        self.frames.push(kind);
        self.frames.extend_from_slice(payload);
        self.raw_bytes += (self.frames.len() - before) as u64;
        self.opened.get_or_insert_with(Instant::now);
        Ok(())
    }

    /// Compresses and writes the open block.
    fn emit(&mut self) -> io::Result<()> {
        if self.frames.is_empty() {
            return Ok(());
        }
        self.body.clear();
        put_varint(&mut self.body, self.frames.len() as u64);
        self.body.extend_from_slice(&self.frames);
        // Where each section of the body starts: each is compressed with its own Huffman
        // tables (the timestamp bytes are near random, the frames very repetitive).
        let sections = [
            0,
            self.body.len(),
            self.body.len() + self.ts_lo.len(),
            self.body.len() + 2 * self.ts_lo.len(),
        ];
        self.body.extend_from_slice(&self.ts_lo);
        self.body.extend_from_slice(&self.ts_mid);
        self.body.extend_from_slice(&self.ts_hi);
        self.raw_bytes += (2 * self.ts_lo.len() + self.ts_hi.len()) as u64;
        let mut crc = Crc::new();
        crc.update(&self.body);
        deflate(&mut self.deflate, &self.body, &sections, &mut self.packed)?;
        let (codec, data) = if self.packed.len() < self.body.len() {
            (CODEC_DEFLATE, &self.packed)
        } else {
            (CODEC_STORED, &self.body)
        };
        let mut head = Vec::with_capacity(32);
        head.push(codec);
        put_varint(&mut head, self.body.len() as u64);
        put_varint(&mut head, data.len() as u64);
        head.extend_from_slice(&crc.sum().to_le_bytes());
        let written = self
            .out
            .write_all(&head)
            .and_then(|()| self.out.write_all(data))
            .and_then(|()| self.out.flush());
        // Cleared even when the write failed: a retry must not write the block twice.
        self.frames.clear();
        self.ts_lo.clear();
        self.ts_mid.clear();
        self.ts_hi.clear();
        self.opened = None;
        written
    }

    /// Writes the open block (a reader sees everything written so far).
    pub fn flush(&mut self) -> io::Result<()> {
        self.emit()?;
        self.out.flush()
    }

    /// Writes the open block and returns the output.
    pub fn finish(mut self) -> io::Result<W> {
        self.flush()?;
        Ok(self.out)
    }
}

/// Raw DEFLATE of `input` into `out` (cleared first), reusing the compressor. A sync flush ends
/// the deflate block at each of `sections` (offsets into `input`, the first 0), so each section
/// gets Huffman tables of its own; the reader sees one ordinary deflate stream.
fn deflate(
    c: &mut Compress,
    input: &[u8],
    sections: &[usize],
    out: &mut Vec<u8>,
) -> io::Result<()> {
    c.reset();
    out.clear();
    let ends = sections.iter().skip(1).copied().chain([input.len()]);
    let n = sections.len().max(1);
    for (i, end) in ends.enumerate() {
        let last = i + 1 == n;
        let flush = if last {
            FlushCompress::Finish
        } else {
            FlushCompress::Sync
        };
        loop {
            // Room for the section even if it does not compress, so one call usually ends it.
            let left = end - c.total_in() as usize;
            if out.capacity() - out.len() < left + left / 8 + 1024 {
                out.reserve(left + left / 8 + 1024);
            }
            let start = c.total_in() as usize;
            let status = c
                .compress_vec(&input[start..end], out, flush)
                .map_err(io::Error::other)?;
            if last {
                if status == Status::StreamEnd {
                    return Ok(());
                }
            } else if c.total_in() as usize == end && out.len() < out.capacity() {
                break;
            }
        }
    }
    Ok(())
}

/// A file holding `body` as the body of one stored block (after a valid header and header
/// frame), for fuzzing the frame decoders without forging checksums: `body` is read as a frame
/// section (its first varint is the section's length) and the timestamp column after it.
#[doc(hidden)]
pub fn file_of_block_body(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 64);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&BINARY_VERSION.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    // The header frame in a block of its own.
    let mut header = Vec::new();
    let json =
        format!("{{\"format\":\"{FORMAT}\",\"version\":{VERSION},\"daemon_version\":\"fuzz\"}}");
    put_varint(&mut header, json.len() as u64);
    header.push(FRAME_HEADER);
    header.extend_from_slice(json.as_bytes());
    let mut first = Vec::new();
    put_varint(&mut first, header.len() as u64);
    first.extend_from_slice(&header);
    for b in [&first[..], body] {
        let mut crc = Crc::new();
        crc.update(b);
        out.push(CODEC_STORED);
        put_varint(&mut out, b.len() as u64);
        put_varint(&mut out, b.len() as u64);
        out.extend_from_slice(&crc.sum().to_le_bytes());
        out.extend_from_slice(b);
    }
    out
}

/// Reads a binary recording item by item.
pub struct Decoder<R: Read> {
    input: R,
    path: PathBuf,
    /// Bytes of the file consumed.
    offset: u64,
    /// Where the current block starts in the file (for messages).
    block_at: u64,
    body: Vec<u8>,
    packed: Vec<u8>,
    inflate: Decompress,
    /// Cursor in `body` over the frame section, its end, and the timestamp column's cursors.
    pos: usize,
    frames_end: usize,
    lo: usize,
    lo_end: usize,
    mid: usize,
    hi: usize,
    events: EventDecoder,
    done: bool,
    pub(super) tail: Tail,
    pub(super) daemon_version: Option<String>,
}

/// Why a block could not be loaded.
enum Load {
    /// A clean end of file between blocks.
    End,
    /// The file ends inside this block.
    Cut,
}

impl<R: Read> Decoder<R> {
    /// Reads and checks the file header.
    pub fn new(mut input: R, path: &Path) -> Result<Self, RecordError> {
        let mut head = [0u8; HEADER_LEN];
        let n = read_full(&mut input, &mut head).map_err(|source| RecordError::Open {
            path: path.into(),
            source,
        })?;
        if n < HEADER_LEN {
            return Err(RecordError::CutHeader { path: path.into() });
        }
        if head[..8] != MAGIC {
            return Err(RecordError::NotRecording {
                path: path.into(),
                first: String::from_utf8_lossy(&head).into_owned(),
            });
        }
        let version = u16::from_le_bytes([head[8], head[9]]);
        let flags = u16::from_le_bytes([head[10], head[11]]);
        if version > BINARY_VERSION {
            return Err(RecordError::FutureVersion {
                path: path.into(),
                found: version.into(),
                known: BINARY_VERSION.into(),
            });
        }
        if version == 0 {
            return Err(RecordError::Corrupt {
                path: path.into(),
                offset: 8,
                msg: "binary format version 0".into(),
            });
        }
        if flags & REQUIRED_FLAGS != 0 {
            return Err(RecordError::FutureFeatures {
                path: path.into(),
                flags,
            });
        }
        let mut d = Decoder {
            input,
            path: path.into(),
            offset: HEADER_LEN as u64,
            block_at: HEADER_LEN as u64,
            body: Vec::new(),
            packed: Vec::new(),
            inflate: Decompress::new(false),
            pos: 0,
            frames_end: 0,
            lo: 0,
            lo_end: 0,
            mid: 0,
            hi: 0,
            events: EventDecoder::default(),
            done: false,
            tail: Tail::default(),
            daemon_version: None,
        };
        d.first_block()?;
        Ok(d)
    }

    /// Loads the first block and reads its header frame (a file cut before it has none).
    fn first_block(&mut self) -> Result<(), RecordError> {
        match self.load()? {
            Some(Load::End) => self.done = true,
            Some(Load::Cut) => self.cut(),
            None => {
                let (kind, start, end) = self.frame().map_err(|e| self.corrupt(e.0))?;
                if kind != FRAME_HEADER {
                    return Err(self.corrupt("the first frame is not the header"));
                }
                self.header(start, end)?;
            }
        }
        Ok(())
    }

    /// The frame at the cursor: its type and where its payload lies in the block.
    fn frame(&mut self) -> Result<(u8, usize, usize), Bad> {
        let mut b = Bytes::new(&self.body[self.pos..self.frames_end]);
        let len = b.varint()?;
        let kind = b.u8()?;
        b.take(len)?;
        let (start, end) = (self.pos + b.pos() - len as usize, self.pos + b.pos());
        self.pos = end;
        Ok((kind, start, end))
    }

    /// The file ends inside the current block: drop it, counting its bytes.
    fn cut(&mut self) {
        let rest = io::copy(&mut self.input, &mut io::sink()).unwrap_or(0);
        self.tail.truncated = true;
        self.tail.dropped_bytes = self.offset + rest - self.block_at;
        self.done = true;
    }

    fn corrupt(&self, msg: impl Into<String>) -> RecordError {
        RecordError::Corrupt {
            path: self.path.clone(),
            offset: self.block_at,
            msg: msg.into(),
        }
    }

    fn io(&self, source: io::Error) -> RecordError {
        RecordError::Open {
            path: self.path.clone(),
            source,
        }
    }

    /// The next item; `None` at the end of the file or of its last whole block.
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
        loop {
            if self.pos < self.frames_end {
                let (kind, start, end) = self.frame().map_err(|e| self.corrupt(e.0))?;
                let payload = &self.body[start..end];
                let item = match kind {
                    FRAME_EVENT => {
                        let delta = self.delta()?;
                        let payload = &self.body[start..end];
                        StreamItem::Event(
                            self.events
                                .decode(payload, delta)
                                .map_err(|e| self.corrupt(format!("event: {}", e.0)))?,
                        )
                    }
                    FRAME_STACK => StreamItem::Stack(Box::new(
                        self.events
                            .decode_stack(payload)
                            .map_err(|e| self.corrupt(format!("stack sample: {}", e.0)))?,
                    )),
                    FRAME_ITEM => serde_json::from_slice::<StreamItem>(payload)
                        .map_err(|e| self.corrupt(format!("malformed item: {e}")))?,
                    FRAME_HEADER => return Err(self.corrupt("a second header frame")),
                    _ => {
                        self.tail.skipped_frames += 1;
                        continue;
                    }
                };
                return Ok(Some(item));
            }
            if self.frames_end > 0 && (self.lo != self.lo_end || self.hi != self.body.len()) {
                return Err(self.corrupt("timestamp column does not match the block's events"));
            }
            match self.load()? {
                None => {}
                Some(Load::End) => return Ok(None),
                Some(Load::Cut) => {
                    self.cut();
                    return Ok(None);
                }
            }
        }
    }

    fn header(&mut self, start: usize, end: usize) -> Result<(), RecordError> {
        let h: Header = serde_json::from_slice(&self.body[start..end])
            .map_err(|e| self.corrupt(format!("header frame: {e}")))?;
        if h.format != FORMAT {
            return Err(self.corrupt(format!("header frame names format {:?}", h.format)));
        }
        if h.version > VERSION {
            return Err(RecordError::FutureVersion {
                path: self.path.clone(),
                found: h.version,
                known: VERSION,
            });
        }
        self.daemon_version = Some(h.daemon_version);
        Ok(())
    }

    /// The next entry of the block's timestamp column.
    fn delta(&mut self) -> Result<u64, RecordError> {
        // `lo` and `mid` run over the first and second bytes (one each per event), `hi` over
        // the varints after them; the planes were sized when the block was loaded.
        let lo = self.body[self.lo];
        let mid = self.body[self.mid];
        self.lo += 1;
        self.mid += 1;
        let mut b = Bytes::new(&self.body[self.hi..]);
        let hi = b
            .varint()
            .map_err(|e| self.corrupt(format!("timestamp: {}", e.0)))?;
        self.hi += b.pos();
        if hi > u64::MAX >> 16 {
            return Err(self.corrupt("timestamp delta overflows 64 bits"));
        }
        Ok(hi << 16 | u64::from(mid) << 8 | u64::from(lo))
    }

    /// Reads, decompresses and checks the next block; `Some` at the end of the file.
    fn load(&mut self) -> Result<Option<Load>, RecordError> {
        self.block_at = self.offset;
        self.pos = 0;
        self.frames_end = 0;
        let mut codec = [0u8; 1];
        if self.read(&mut codec)? == 0 {
            return Ok(Some(Load::End));
        }
        let Some(raw_len) = self.read_varint()? else {
            return Ok(Some(Load::Cut));
        };
        let Some(data_len) = self.read_varint()? else {
            return Ok(Some(Load::Cut));
        };
        let mut crc = [0u8; 4];
        if self.read(&mut crc)? < 4 {
            return Ok(Some(Load::Cut));
        }
        if raw_len > MAX_BLOCK_BYTES as u64 || data_len > MAX_BLOCK_BYTES as u64 {
            return Err(self.corrupt(format!(
                "block of {raw_len} bytes ({data_len} stored): larger than any writer makes"
            )));
        }
        let (raw_len, data_len) = (raw_len as usize, data_len as usize);
        let mut packed = std::mem::take(&mut self.packed);
        packed.resize(data_len, 0);
        let n = self.read(&mut packed);
        self.packed = packed;
        if n? < data_len {
            return Ok(Some(Load::Cut));
        }
        match codec[0] {
            CODEC_STORED if data_len == raw_len => {
                std::mem::swap(&mut self.body, &mut self.packed);
            }
            CODEC_STORED => return Err(self.corrupt("stored block whose lengths differ")),
            CODEC_DEFLATE => {
                self.inflate.reset(false);
                self.body.clear();
                // One byte of room past the promised length, so a stream that would exceed it
                // stops there and fails the length check.
                self.body.reserve_exact(raw_len + 1);
                let status = self.inflate.decompress_vec(
                    &self.packed,
                    &mut self.body,
                    FlushDecompress::Finish,
                );
                if !matches!(status, Ok(Status::StreamEnd)) || self.body.len() != raw_len {
                    return Err(self.corrupt("compressed block does not decompress"));
                }
            }
            c => return Err(self.corrupt(format!("unknown block codec {c}"))),
        }
        let mut sum = Crc::new();
        sum.update(&self.body);
        if sum.sum() != u32::from_le_bytes(crc) {
            return Err(self.corrupt("block checksum mismatch"));
        }
        self.index().map_err(|e| self.corrupt(e.0))?;
        Ok(None)
    }

    /// Checks the frame boundaries of the loaded block and places the timestamp column.
    fn index(&mut self) -> Result<(), Bad> {
        let mut b = Bytes::new(&self.body);
        let frames_len = b.varint()?;
        let start = b.pos();
        b.take(frames_len)?;
        let end = b.pos();
        let mut f = Bytes::new(&self.body[start..end]);
        let mut events = 0usize;
        while !f.is_empty() {
            let len = f.varint()?;
            if f.u8()? == FRAME_EVENT {
                events += 1;
            }
            f.take(len)?;
        }
        // Two bytes and a varint of at least one byte per event.
        if events.saturating_mul(3) > self.body.len() - end {
            return Err(Bad("timestamp column shorter than the block's events"));
        }
        self.pos = start;
        self.frames_end = end;
        self.lo = end;
        self.lo_end = end + events;
        self.mid = end + events;
        self.hi = end + 2 * events;
        Ok(())
    }

    /// Reads as much of `buf` as the file holds; counts what was read.
    fn read(&mut self, buf: &mut [u8]) -> Result<usize, RecordError> {
        let n = read_full(&mut self.input, buf).map_err(|e| self.io(e))?;
        self.offset += n as u64;
        Ok(n)
    }

    /// A varint of the block header; `None` when the file ends inside it.
    fn read_varint(&mut self) -> Result<Option<u64>, RecordError> {
        let mut v = 0u64;
        for i in 0..10 {
            let mut byte = [0u8; 1];
            if self.read(&mut byte)? == 0 {
                return Ok(None);
            }
            let b = byte[0];
            if i == 9 && b > 1 {
                return Err(self.corrupt("block length overflows 64 bits"));
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(Some(v));
            }
        }
        Err(self.corrupt("block length longer than 10 bytes"))
    }
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
