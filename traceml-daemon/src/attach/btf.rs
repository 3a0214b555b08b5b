//! Member offsets of kernel structs from the kernel's own BTF (`/sys/kernel/btf/vmlinux`), for
//! the scheduler program: it reads `task_struct::pid` of the thread switched in and
//! `task_struct::__state` of the one leaving, at offsets that differ with every kernel build.
//! aya-ebpf has no CO-RE relocations for Rust programs, so userspace finds the offsets here and
//! hands them to the program as globals.
//!
//! Only what that needs is parsed (format: the kernel's `Documentation/bpf/btf.rst`): the header,
//! the string section, and the type section walked record by record; a named struct's direct
//! members. Every malformed input is an error, never a panic.
use std::collections::HashMap;

/// Where a member sits in its struct.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    /// Byte offset from the start of the struct.
    pub offset: u64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BtfError {
    #[error("BTF: {0}")]
    Malformed(&'static str),
    #[error("BTF: no struct {0}")]
    NoStruct(String),
    #[error("BTF: struct {0} has no member {1}")]
    NoMember(String, String),
    #[error("BTF: {0}.{1} is a bit field")]
    BitField(String, String),
}

const MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;

/// The kernel's BTF, read from `/sys/kernel/btf/vmlinux`.
pub fn kernel() -> Result<Vec<u8>, std::io::Error> {
    std::fs::read("/sys/kernel/btf/vmlinux")
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, BtfError> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or(BtfError::Malformed("truncated"))
}

fn name_at(strings: &[u8], off: u32) -> Result<&[u8], BtfError> {
    let s = strings
        .get(off as usize..)
        .ok_or(BtfError::Malformed("string offset out of range"))?;
    let end = s
        .iter()
        .position(|&c| c == 0)
        .ok_or(BtfError::Malformed("unterminated string"))?;
    Ok(&s[..end])
}

/// The direct members of the struct named `name` that are in `wanted`, by name.
pub fn members(
    btf: &[u8],
    name: &str,
    wanted: &[&str],
) -> Result<HashMap<String, Member>, BtfError> {
    if btf.len() < 24 || u16::from_le_bytes([btf[0], btf[1]]) != MAGIC {
        return Err(BtfError::Malformed("not little-endian BTF"));
    }
    let hdr_len = u32_at(btf, 4)? as usize;
    let (type_off, type_len) = (u32_at(btf, 8)? as usize, u32_at(btf, 12)? as usize);
    let (str_off, str_len) = (u32_at(btf, 16)? as usize, u32_at(btf, 20)? as usize);
    let section = |off: usize, len: usize| {
        hdr_len
            .checked_add(off)
            .and_then(|s| Some((s, s.checked_add(len)?)))
            .and_then(|(s, e)| btf.get(s..e))
            .ok_or(BtfError::Malformed("section out of range"))
    };
    let types = section(type_off, type_len)?;
    let strings = section(str_off, str_len)?;
    let mut at = 0usize;
    while at < types.len() {
        let name_off = u32_at(types, at)?;
        let info = u32_at(types, at + 4)?;
        let kind = (info >> 24) & 0x1f;
        let vlen = (info & 0xffff) as usize;
        let kind_flag = info >> 31 == 1;
        let extra = match kind {
            1 | 14 | 17 => 4,          // INT, VAR, DECL_TAG
            3 => 12,                   // ARRAY
            4 | 5 => 12 * vlen,        // STRUCT, UNION
            6 | 13 => 8 * vlen,        // ENUM, FUNC_PROTO
            15 | 19 => 12 * vlen,      // DATASEC, ENUM64
            2 | 7..=12 | 16 | 18 => 0, // PTR, FWD, TYPEDEF, qualifiers, FUNC, FLOAT, TYPE_TAG
            _ => return Err(BtfError::Malformed("unknown type kind")),
        };
        let body = at + 12;
        if kind == KIND_STRUCT && name_at(strings, name_off)? == name.as_bytes() && vlen > 0 {
            let mut out = HashMap::new();
            for i in 0..vlen {
                let m = body + 12 * i;
                let m_name = name_at(strings, u32_at(types, m)?)?;
                let Some(w) = wanted.iter().find(|w| w.as_bytes() == m_name) else {
                    continue;
                };
                let raw = u32_at(types, m + 8)?;
                // With kind_flag the top 8 bits are a bit field's size.
                let (bits, size) = if kind_flag {
                    (raw & 0x00ff_ffff, raw >> 24)
                } else {
                    (raw, 0)
                };
                if size != 0 || bits % 8 != 0 {
                    return Err(BtfError::BitField(name.into(), (*w).into()));
                }
                out.insert(
                    (*w).to_owned(),
                    Member {
                        offset: u64::from(bits / 8),
                    },
                );
            }
            return Ok(out);
        }
        at = body + extra;
    }
    Err(BtfError::NoStruct(name.into()))
}

/// Offsets in `task_struct` the scheduler program reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskOffsets {
    /// `pid` (the thread id).
    pub pid: u64,
    /// The task's state (`__state`, `state` before Linux 5.14; `None` when neither is found:
    /// every off-CPU interval is then called a sleep).
    pub state: Option<u64>,
    /// `tgid` sits right after `pid` (one 8-byte read gives both).
    pub tgid_after_pid: bool,
}

pub fn task_offsets(btf: &[u8]) -> Result<TaskOffsets, BtfError> {
    let m = members(btf, "task_struct", &["pid", "tgid", "__state", "state"])?;
    let pid = m
        .get("pid")
        .ok_or_else(|| BtfError::NoMember("task_struct".into(), "pid".into()))?
        .offset;
    let state = m
        .get("__state")
        .or_else(|| m.get("state"))
        .map(|m| m.offset);
    let tgid_after_pid = m.get("tgid").is_some_and(|t| t.offset == pid + 4);
    Ok(TaskOffsets {
        pid,
        state,
        tgid_after_pid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob with an INT, a struct `task_struct { int x; int pid; int tgid; unsigned int
    /// __state; }` and a trailing PTR.
    fn blob(kind_flag: bool) -> Vec<u8> {
        let strings = b"\0int\0task_struct\0x\0pid\0tgid\0__state\0".to_vec();
        let s = |n: &str| {
            let hay = std::str::from_utf8(&strings).unwrap();
            hay.find(&format!("\0{n}\0")).unwrap() as u32 + 1
        };
        let mut types = Vec::new();
        let push = |t: &mut Vec<u8>, v: u32| t.extend_from_slice(&v.to_le_bytes());
        // INT "int", size 4, encoding word.
        push(&mut types, s("int"));
        push(&mut types, 1 << 24);
        push(&mut types, 4);
        push(&mut types, 32);
        // STRUCT task_struct, 4 members.
        push(&mut types, s("task_struct"));
        push(
            &mut types,
            (4 << 24) | 4 | if kind_flag { 1 << 31 } else { 0 },
        );
        push(&mut types, 64);
        for (n, off) in [
            ("x", 0u32),
            ("pid", 32 * 8),
            ("tgid", 36 * 8),
            ("__state", 40 * 8),
        ] {
            push(&mut types, s(n));
            push(&mut types, 1);
            push(&mut types, off);
        }
        // PTR to int.
        push(&mut types, 0);
        push(&mut types, 2 << 24);
        push(&mut types, 1);
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.push(1);
        out.push(0);
        for v in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&types);
        out.extend_from_slice(&strings);
        out
    }

    #[test]
    fn finds_task_struct_offsets() {
        for kf in [false, true] {
            assert_eq!(
                task_offsets(&blob(kf)),
                Ok(TaskOffsets {
                    pid: 32,
                    state: Some(40),
                    tgid_after_pid: true
                })
            );
        }
    }

    #[test]
    fn malformed_input_is_an_error() {
        let b = blob(false);
        for n in 0..b.len() {
            // Any truncation: an error or (past the struct) the same answer, never a panic.
            let _ = task_offsets(&b[..n]);
        }
        assert!(matches!(
            members(&b, "mm_struct", &["pid"]),
            Err(BtfError::NoStruct(_))
        ));
        assert!(task_offsets(b"nonsense").is_err());
    }

    /// The running kernel's own BTF (readable by anyone; the daemon requires a kernel with it).
    #[test]
    fn the_running_kernels_task_struct() {
        let b = kernel().expect("/sys/kernel/btf/vmlinux (the daemon needs a kernel with BTF)");
        let TaskOffsets {
            pid,
            state,
            tgid_after_pid,
        } = task_offsets(&b).expect("task_struct in the kernel's BTF");
        assert!(pid > 0 && pid < 16384, "pid at {pid}");
        assert!(state.is_some_and(|s| s < pid), "state at {state:?}");
        // `pid_t pid; pid_t tgid;` in every kernel so far: the fast path of the switch program.
        assert!(tgid_after_pid);
    }
}
