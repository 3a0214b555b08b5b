//! The compact payloads of the binary recording (`docs/recording-format.md`): LEB128 varints,
//! zigzag deltas, and the `event` and `stack` frames with the state writer and reader share
//! (the previous event's timestamp, tgid and tid; the table of code identities). Pure: bytes in,
//! items out; every malformed input is an error, never a panic.
use std::collections::HashMap;

use crate::event::{Api, CopyKind, Event, Kind, LaunchPath, StackSample};

/// Code identities remembered for `py_enter`/`py_exit` (both sides stop adding at this size,
/// so memory stays bounded; later identities are written in full).
pub const CODE_TABLE_MAX: usize = 16_384;

// Bits of an event's flag byte.
const TID_MASK: u8 = 0b11;
const TID_SAME: u8 = 0;
const TID_IS_TGID: u8 = 1;
const TID_VARINT: u8 = 2;
const TGID_VARINT: u8 = 1 << 2;
const CODE_LITERAL: u8 = 1 << 3;
const HAS_BYTES: u8 = 1 << 4;
const HAS_COPY: u8 = 1 << 5;
const RAISED: u8 = 1 << 6;

/// Why a payload could not be decoded.
#[derive(Debug, PartialEq, Eq)]
pub struct Bad(pub &'static str);

pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub fn zigzag(d: i64) -> u64 {
    ((d << 1) ^ (d >> 63)) as u64
}

pub fn unzigzag(z: u64) -> i64 {
    ((z >> 1) as i64) ^ -((z & 1) as i64)
}

/// A cursor over a byte slice whose reads fail on a short or malformed input.
pub struct Bytes<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Bytes<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Bytes { buf, pos: 0 }
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    pub fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }

    pub fn u8(&mut self) -> Result<u8, Bad> {
        let b = *self.buf.get(self.pos).ok_or(Bad("payload ends early"))?;
        self.pos += 1;
        Ok(b)
    }

    pub fn varint(&mut self) -> Result<u64, Bad> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.u8()?;
            if i == 9 && b > 1 {
                return Err(Bad("varint overflows 64 bits"));
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(Bad("varint longer than 10 bytes"))
    }

    pub fn u32(&mut self) -> Result<u32, Bad> {
        u32::try_from(self.varint()?).map_err(|_| Bad("value does not fit 32 bits"))
    }

    pub fn take(&mut self, n: u64) -> Result<&'a [u8], Bad> {
        let left = self.buf.len() - self.pos;
        if n > left as u64 {
            return Err(Bad("payload ends early"));
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }
}

/// Kind codes: the top 3 bits of an event's first byte. Values are never reused.
fn kind_code(k: &Kind) -> u8 {
    match k {
        Kind::PyEnter { .. } => 0,
        Kind::PyExit { .. } => 1,
        Kind::CallEnter { .. } => 2,
        Kind::CallExit { .. } => 3,
        Kind::Launch { .. } => 4,
        Kind::RecordEnter { .. } => 5,
        Kind::RecordExit => 6,
        // 7, the last 3-bit code, stays free for an escape; an exec (once a run), an off-CPU
        // interval and a grad-mode switch (a few a step) are written as JSON `item` frames
        // (see [`EventEncoder::encode`]).
        Kind::Exec | Kind::OffCpu { .. } | Kind::GradMode { .. } => {
            unreachable!("no compact code")
        }
    }
}

/// Api codes: the low 5 bits of an event's first byte, an api's code being its index here.
/// Append only; values are never reused. An api not (yet) listed has no code: its events are
/// written as JSON `item` frames, which lose nothing.
const APIS: [Api; 27] = [
    Api::CudaLaunchKernel,
    Api::CudaLaunchKernelExC,
    Api::CudaGraphLaunch,
    Api::CudaMemcpy,
    Api::CudaMemcpyAsync,
    Api::CudaStreamSynchronize,
    Api::CudaDeviceSynchronize,
    Api::CudaEventSynchronize,
    Api::CuLaunchKernel,
    Api::CuLaunchKernelEx,
    Api::CuStreamSynchronize,
    Api::CuCtxSynchronize,
    Api::CuEventSynchronize,
    Api::CuMemcpyHtoD,
    Api::CuMemcpyDtoH,
    Api::CuMemcpyHtoDAsync,
    Api::CuMemcpyDtoHAsync,
    Api::TorchBackward,
    Api::CollectiveWait,
    Api::Collective,
    Api::NcclAllReduce,
    Api::NcclReduceScatter,
    Api::NcclAllGather,
    Api::NcclBroadcast,
    Api::NcclReduce,
    Api::NcclSend,
    Api::NcclRecv,
];

fn api_code(a: Api) -> Option<u8> {
    APIS.iter().position(|x| *x == a).map(|i| i as u8)
}

fn api_of(code: u8) -> Result<Api, Bad> {
    APIS.get(usize::from(code))
        .copied()
        .ok_or(Bad("unknown api code"))
}

fn copy_code(c: CopyKind) -> u8 {
    match c {
        CopyKind::HostToHost => 0,
        CopyKind::HostToDevice => 1,
        CopyKind::DeviceToHost => 2,
        CopyKind::DeviceToDevice => 3,
        CopyKind::Default => 4,
        CopyKind::Unknown => 5,
    }
}

fn copy_of(code: u8) -> Result<CopyKind, Bad> {
    Ok(match code {
        0 => CopyKind::HostToHost,
        1 => CopyKind::HostToDevice,
        2 => CopyKind::DeviceToHost,
        3 => CopyKind::DeviceToDevice,
        4 => CopyKind::Default,
        5 => CopyKind::Unknown,
        _ => return Err(Bad("unknown copy kind")),
    })
}

/// The writer's side of the event state.
#[derive(Default)]
pub struct EventEncoder {
    ts: u64,
    tgid: Option<u32>,
    tid: Option<u32>,
    codes: HashMap<u64, u32>,
}

impl EventEncoder {
    /// Appends the payload of `e`'s `event` frame to `out` and returns its zigzag timestamp
    /// delta (which goes to the block's timestamp column); `None`, writing nothing, for an api
    /// without a code or an exec (the caller writes the event as JSON).
    pub fn encode(&mut self, e: &Event, out: &mut Vec<u8>) -> Option<u64> {
        let api = match &e.kind {
            Kind::Exec | Kind::OffCpu { .. } | Kind::GradMode { .. } => return None,
            // A collective's group has no compact field: a JSON `item` frame keeps it.
            Kind::CallEnter { group: Some(_), .. } => return None,
            Kind::CallEnter { api, .. } | Kind::CallExit { api, .. } | Kind::Launch { api, .. } => {
                api_code(*api)?
            }
            _ => 0,
        };
        let delta = zigzag(e.ts.wrapping_sub(self.ts) as i64);
        self.ts = e.ts;
        out.push(kind_code(&e.kind) << 5 | api);
        let flags_at = out.len();
        out.push(0);
        let mut flags = 0u8;
        if self.tgid != Some(e.tgid) {
            flags |= TGID_VARINT;
            put_varint(out, e.tgid.into());
        }
        // Otherwise TID_SAME (0): the previous event's tid.
        if self.tid != Some(e.tid) {
            if e.tid == e.tgid {
                flags |= TID_IS_TGID;
            } else {
                flags |= TID_VARINT;
                put_varint(out, e.tid.into());
            }
        }
        self.tgid = Some(e.tgid);
        self.tid = Some(e.tid);
        match &e.kind {
            Kind::PyEnter { code, depth } => {
                flags |= self.code(*code, out);
                put_varint(out, (*depth).into());
            }
            Kind::PyExit { code, raised } => {
                flags |= self.code(*code, out);
                if *raised {
                    flags |= RAISED;
                }
            }
            Kind::CallEnter { bytes, copy, .. } => {
                if let Some(b) = bytes {
                    flags |= HAS_BYTES;
                    put_varint(out, *b);
                }
                if let Some(c) = copy {
                    flags |= HAS_COPY;
                    out.push(copy_code(*c));
                }
            }
            Kind::CallExit { ret, .. } => put_varint(out, *ret),
            Kind::RecordEnter { name } => {
                put_varint(out, name.len() as u64);
                out.extend_from_slice(name.as_bytes());
            }
            // Added within version 1: the launch's path, one trailing byte (absent: unknown).
            Kind::Launch { path, .. } => {
                if let Some(p) = path {
                    out.push(p.code());
                }
            }
            Kind::RecordExit | Kind::Exec | Kind::OffCpu { .. } | Kind::GradMode { .. } => {}
        }
        out[flags_at] = flags;
        Some(delta)
    }

    /// Writes a code identity as a table index, or in full (added to the table while it has
    /// room); returns the flag to set.
    fn code(&mut self, code: u64, out: &mut Vec<u8>) -> u8 {
        if let Some(i) = self.codes.get(&code) {
            put_varint(out, (*i).into());
            return 0;
        }
        if self.codes.len() < CODE_TABLE_MAX {
            let i = self.codes.len() as u32;
            self.codes.insert(code, i);
        }
        put_varint(out, code);
        CODE_LITERAL
    }

    /// Appends the payload of a `stack` frame to `out`.
    pub fn encode_stack(&self, s: &StackSample, out: &mut Vec<u8>) {
        put_varint(out, zigzag(s.ts.wrapping_sub(self.ts) as i64));
        put_varint(out, s.tid.into());
        put_varint(out, s.frames.len() as u64);
        for f in &s.frames {
            put_varint(out, (*f).into());
        }
        // Added within version 1: the innermost frames' lines. Readers that predate them ignore
        // the bytes after the frames.
        put_varint(out, s.lines.len() as u64);
        for l in &s.lines {
            put_varint(out, (*l).into());
        }
    }
}

/// The reader's side of the event state.
#[derive(Default)]
pub struct EventDecoder {
    ts: u64,
    tgid: u32,
    tid: u32,
    codes: Vec<u64>,
}

impl EventDecoder {
    /// Decodes an `event` frame's payload; `delta` is its entry of the timestamp column.
    /// Bytes after the fields the kind has are ignored (fields may be added within a version).
    pub fn decode(&mut self, payload: &[u8], delta: u64) -> Result<Event, Bad> {
        let mut b = Bytes::new(payload);
        let head = b.u8()?;
        let flags = b.u8()?;
        let api = head & 0x1f;
        let tgid = if flags & TGID_VARINT != 0 {
            b.u32()?
        } else {
            self.tgid
        };
        let tid = match flags & TID_MASK {
            TID_SAME => self.tid,
            TID_IS_TGID => tgid,
            TID_VARINT => b.u32()?,
            _ => return Err(Bad("unknown tid mode")),
        };
        let kind = match head >> 5 {
            0 => Kind::PyEnter {
                code: self.code(&mut b, flags)?,
                depth: b.u32()?,
            },
            1 => Kind::PyExit {
                code: self.code(&mut b, flags)?,
                raised: flags & RAISED != 0,
            },
            2 => Kind::CallEnter {
                api: api_of(api)?,
                bytes: if flags & HAS_BYTES != 0 {
                    Some(b.varint()?)
                } else {
                    None
                },
                copy: if flags & HAS_COPY != 0 {
                    Some(copy_of(b.u8()?)?)
                } else {
                    None
                },
                group: None,
            },
            3 => Kind::CallExit {
                api: api_of(api)?,
                ret: b.varint()?,
            },
            4 => {
                let api = api_of(api)?;
                Kind::Launch {
                    api,
                    path: b.u8().ok().map(|c| LaunchPath::of(api, Some(c.into()))),
                }
            }
            5 => {
                let n = b.varint()?;
                let name =
                    std::str::from_utf8(b.take(n)?).map_err(|_| Bad("record name is not UTF-8"))?;
                Kind::RecordEnter { name: name.into() }
            }
            6 => Kind::RecordExit,
            _ => return Err(Bad("unknown event kind")),
        };
        self.ts = self.ts.wrapping_add(unzigzag(delta) as u64);
        self.tgid = tgid;
        self.tid = tid;
        Ok(Event {
            ts: self.ts,
            tgid,
            tid,
            kind,
        })
    }

    fn code(&mut self, b: &mut Bytes, flags: u8) -> Result<u64, Bad> {
        let v = b.varint()?;
        if flags & CODE_LITERAL != 0 {
            if self.codes.len() < CODE_TABLE_MAX {
                self.codes.push(v);
            }
            Ok(v)
        } else {
            usize::try_from(v)
                .ok()
                .and_then(|i| self.codes.get(i).copied())
                .ok_or(Bad("code index beyond the code table"))
        }
    }

    /// Decodes a `stack` frame's payload.
    pub fn decode_stack(&self, payload: &[u8]) -> Result<StackSample, Bad> {
        let mut b = Bytes::new(payload);
        let ts = self.ts.wrapping_add(unzigzag(b.varint()?) as u64);
        let tid = b.u32()?;
        let n = b.varint()?;
        // Each id takes at least a byte: a count beyond the payload is malformed (and no
        // allocation follows a hostile count).
        if n > payload.len() as u64 {
            return Err(Bad("stack longer than its frame"));
        }
        let frames = (0..n).map(|_| b.u32()).collect::<Result<Vec<_>, _>>()?;
        // Absent in recordings written before they were added.
        let lines = if b.is_empty() {
            Vec::new()
        } else {
            let n = b.varint()?;
            if n > payload.len() as u64 {
                return Err(Bad("stack lines longer than their frame"));
            }
            (0..n).map(|_| b.u32()).collect::<Result<Vec<_>, _>>()?
        };
        Ok(StackSample {
            ts,
            tid,
            frames,
            lines,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_zigzag_round_trip_and_reject_overlong() {
        for v in [0, 1, 127, 128, 300, u32::MAX as u64, u64::MAX - 1, u64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(Bytes::new(&out).varint(), Ok(v));
        }
        for d in [0i64, 1, -1, 63, -64, i64::MAX, i64::MIN] {
            assert_eq!(unzigzag(zigzag(d)), d);
        }
        assert!(Bytes::new(&[0xff; 11]).varint().is_err());
        assert!(
            Bytes::new(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02])
                .varint()
                .is_err()
        );
        assert!(Bytes::new(&[0x80]).varint().is_err());
    }

    #[test]
    fn every_api_and_copy_code_round_trips() {
        for c in 0..=255u8 {
            if let Ok(a) = api_of(c) {
                assert_eq!(api_code(a), Some(c), "{a:?} listed once");
            }
            if let Ok(k) = copy_of(c) {
                assert_eq!(copy_code(k), c);
            }
        }
        assert_eq!(api_of(17), Ok(Api::TorchBackward), "codes never move");
        assert!(APIS.len() <= 32, "5 bits");
    }

    #[test]
    fn events_share_state_and_round_trip() {
        let evs = [
            Event {
                ts: 1_000,
                tgid: 7,
                tid: 7,
                kind: Kind::PyEnter {
                    code: u64::MAX,
                    depth: 3,
                },
            },
            Event {
                ts: 900,
                tgid: 7,
                tid: 8,
                kind: Kind::PyExit {
                    code: u64::MAX,
                    raised: true,
                },
            },
            Event {
                ts: 2_000,
                tgid: 7,
                tid: 8,
                kind: Kind::Launch {
                    api: Api::CuLaunchKernel,
                    path: Some(LaunchPath::Library),
                },
            },
            Event {
                ts: 2_000,
                tgid: 9,
                tid: 9,
                kind: Kind::RecordEnter {
                    name: "é#x".into()
                },
            },
            Event {
                ts: 2_100,
                tgid: 9,
                tid: 10,
                kind: Kind::CallEnter {
                    api: Api::NcclRecv,
                    bytes: Some(4 << 20),
                    copy: None,
                    group: None,
                },
            },
        ];
        let mut enc = EventEncoder::default();
        let mut dec = EventDecoder::default();
        for e in &evs {
            let mut p = Vec::new();
            let d = enc.encode(e, &mut p).unwrap();
            assert_eq!(&dec.decode(&p, d).unwrap(), e);
        }
        // The repeated code is an index the second time: a short payload.
        let mut p = Vec::new();
        let e = Event {
            ts: 3_000,
            tgid: 9,
            tid: 9,
            kind: Kind::PyExit {
                code: u64::MAX,
                raised: false,
            },
        };
        let d = enc.encode(&e, &mut p).unwrap();
        assert_eq!(p.len(), 3);
        assert_eq!(dec.decode(&p, d).unwrap(), e);
        let mut s = StackSample {
            ts: 2_500,
            tid: 9,
            frames: vec![0, 5, 70_000],
            lines: vec![88, 0, 70_001],
        };
        let mut p = Vec::new();
        enc.encode_stack(&s, &mut p);
        assert_eq!(dec.decode_stack(&p).unwrap(), s);
        s.lines.clear();
        p.clear();
        enc.encode_stack(&s, &mut p);
        assert_eq!(dec.decode_stack(&p).unwrap(), s);
        // Written before the line was added: the frames end the payload.
        p.pop();
        assert_eq!(dec.decode_stack(&p).unwrap(), s);
    }

    #[test]
    fn malformed_payloads_are_errors() {
        let mut dec = EventDecoder::default();
        for p in [
            &[][..],
            &[0x00][..],
            &[7 << 5, 0][..],                // unknown kind
            &[4 << 5 | 31, 0][..],           // unknown api
            &[0, 3][..],                     // tid mode 3
            &[0, 0, 5, 0][..],               // code index beyond the table
            &[2 << 5, HAS_COPY, 9][..],      // unknown copy kind
            &[5 << 5, 0, 2, 0xff, 0xfe][..], // name not UTF-8
            &[5 << 5, 0, 200, b'a'][..],     // name longer than the payload
        ] {
            assert!(dec.decode(p, 0).is_err(), "{p:?}");
        }
        assert!(dec.decode_stack(&[0, 1, 100, 1]).is_err());
    }
}
