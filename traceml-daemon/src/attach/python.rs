//! The target's CPython: which mapped file holds the frame evaluator, which version it is, the
//! layout facts the probes need (where the code object sits in the evaluator's frame argument),
//! and reading code objects (qualname, filename) out of the target's memory.
//!
//! Layout facts are discovered at run time where CPython offers them: the code object's field
//! offsets come from `PyCode_Type.tp_members`. The rest is a small per-version table
//! ([`frame_layout`]), checked by the root tests against every pyenv interpreter (3.9–3.13).
//! 3.14 is supported from its published layout and is untested here.
use std::path::{Path, PathBuf};

use super::elf::{ElfError, ElfFile};
use super::maps::{self, Mapping};
use super::memory::{MemError, TargetMemory};
use crate::sanitize::{NAME_MAX, cut_marker};

pub const EVAL_SYMBOL: &str = "_PyEval_EvalFrameDefault";

#[derive(Debug, thiserror::Error)]
pub enum PythonError {
    #[error(
        "process {pid} does not look like Python: no mapped file holds {EVAL_SYMBOL} (looked in {looked})"
    )]
    NotPython { pid: u32, looked: String },
    #[error(
        "cannot read {path} (permission denied): the daemon needs read access to the target's \
         files (root, or CAP_DAC_READ_SEARCH)"
    )]
    Unreadable { path: PathBuf },
    #[error("cannot tell the Python version of {path}")]
    UnknownVersion { path: PathBuf },
    #[error("Python {major}.{minor} is not supported (3.9 to 3.14 are)")]
    Unsupported { major: u32, minor: u32 },
    #[error(transparent)]
    Elf(#[from] ElfError),
    #[error(transparent)]
    Mem(#[from] MemError),
    #[error("{what} not found in {path}")]
    Missing { what: String, path: PathBuf },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    /// Micro version when the file says it (`Py_Version`, 3.11+).
    pub micro: Option<u32>,
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.micro {
            Some(m) => write!(f, "{}.{}.{}", self.major, self.minor, m),
            None => write!(f, "{}.{}", self.major, self.minor),
        }
    }
}

/// Where the code object is found from the `frame` argument of `_PyEval_EvalFrameDefault`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameLayout {
    /// Offset of the code object pointer in the frame.
    pub code_offset: u64,
    /// Mask for tagged pointers (`_PyStackRef` in 3.14).
    pub code_mask: u64,
    /// `sizeof(PyASCIIObject)`: where compact ASCII string data starts.
    pub ascii_header: u64,
    /// `sizeof(PyCompactUnicodeObject)`: where other compact string data starts.
    pub compact_header: u64,
    /// Whether code objects have `co_qualname`.
    pub has_qualname: bool,
}

/// The per-version layout table.
///
/// - 3.9/3.10: the argument is a `PyFrameObject*`; `f_code` follows `PyObject_VAR_HEAD` and
///   `f_back` (offset 32).
/// - 3.11: `_PyInterpreterFrame*`; `f_code` after `f_func, f_globals, f_builtins, f_locals` (32).
/// - 3.12: `_PyInterpreterFrame*` starts with `f_code` (0).
/// - 3.13: starts with `f_executable` (0; `_Py_DebugOffsets.interpreter_frame.executable`).
/// - 3.14: `f_executable` is a `_PyStackRef` whose low bits are tags (0, masked). Untested here.
///
/// String headers: `PyASCIIObject` lost its `wstr` pointer in 3.12 (48 → 40 bytes) and
/// `PyCompactUnicodeObject` its `wstr_length` (72 → 56).
pub fn frame_layout(v: Version) -> Result<FrameLayout, PythonError> {
    let (code_offset, code_mask) = match (v.major, v.minor) {
        (3, 9) | (3, 10) | (3, 11) => (32, u64::MAX),
        (3, 12) | (3, 13) => (0, u64::MAX),
        (3, 14) => (0, !3u64),
        (major, minor) => return Err(PythonError::Unsupported { major, minor }),
    };
    let old_strings = v.minor <= 11;
    Ok(FrameLayout {
        code_offset,
        code_mask,
        ascii_header: if old_strings { 48 } else { 40 },
        compact_header: if old_strings { 72 } else { 56 },
        has_qualname: v.minor >= 11,
    })
}

/// The Python runtime found in a target.
#[derive(Debug)]
pub struct PythonTarget {
    /// The file holding the evaluator (as seen from inside the target: use `host_path` to open).
    pub path: PathBuf,
    pub version: Version,
    pub layout: FrameLayout,
    pub elf: ElfFile,
    /// Runtime address of `PyCode_Type`.
    pub code_type_addr: u64,
}

/// The path through which the daemon opens a file the target maps (works across mount
/// namespaces, e.g. a target in a container).
pub fn host_path(pid: u32, path: &Path) -> PathBuf {
    let inside = crate::host::procinfo::root_path(pid, path);
    if inside.exists() {
        inside
    } else {
        path.to_path_buf()
    }
}

impl std::fmt::Debug for ElfFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ElfFile({})", self.path.display())
    }
}

/// Finds the file holding the evaluator among the target's executable and `libpython*`.
pub fn find(pid: u32, mappings: &[Mapping]) -> Result<PythonTarget, PythonError> {
    let exe = crate::host::procinfo::exe(pid);
    let mut candidates: Vec<PathBuf> = maps::files(mappings)
        .into_iter()
        .filter(|p| maps::role_of(p) == Some(maps::Role::Python) || Some(p) == exe.as_ref())
        .collect();
    // libpython first: with --enable-shared the executable is a thin launcher.
    candidates.sort_by_key(|p| maps::role_of(p) != Some(maps::Role::Python));
    let mut looked = Vec::new();
    for path in candidates {
        looked.push(path.display().to_string());
        let elf = match ElfFile::open(&host_path(pid, &path)) {
            Ok(elf) => elf,
            Err(ElfError::Read { source, .. })
                if source.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                return Err(PythonError::Unreadable { path });
            }
            Err(_) => continue,
        };
        if elf.find(|n| n == EVAL_SYMBOL)?.is_none() {
            continue;
        }
        let version = version_of(&elf, &path)?;
        let layout = frame_layout(version)?;
        let base = maps::base_of(mappings, &path).ok_or_else(|| PythonError::Missing {
            what: "load address".into(),
            path: path.clone(),
        })?;
        let code_type = elf.symbol("PyCode_Type")?;
        let code_type_addr = base + code_type.addr - elf.first_segment_vaddr();
        return Ok(PythonTarget {
            path,
            version,
            layout,
            elf,
            code_type_addr,
        });
    }
    Err(PythonError::NotPython {
        pid,
        looked: if looked.is_empty() {
            "no python executable or libpython mapped".into()
        } else {
            looked.join(", ")
        },
    })
}

/// The version: `Py_Version` (3.11+) from the file, else the `python3.X`/`libpython3.X` name.
pub fn version_of(elf: &ElfFile, path: &Path) -> Result<Version, PythonError> {
    if let Some(sym) = elf.find(|n| n == "Py_Version")?
        && let Some(b) = elf.read_at_vaddr(sym.addr, 4)
    {
        let hex = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        return Ok(Version {
            major: hex >> 24,
            minor: (hex >> 16) & 0xff,
            micro: Some((hex >> 8) & 0xff),
        });
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let rest = name
        .strip_prefix("libpython")
        .or_else(|| name.strip_prefix("python"))
        .unwrap_or("");
    let digits: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let mut it = digits
        .split('.')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u32>());
    match (it.next(), it.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => Ok(Version {
            major,
            minor,
            micro: None,
        }),
        _ => Err(PythonError::UnknownVersion { path: path.into() }),
    }
}

/// Offsets of the code object fields we read, from `PyCode_Type.tp_members`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CodeOffsets {
    pub filename: u64,
    pub name: u64,
    pub qualname: Option<u64>,
}

/// `offsetof(PyTypeObject, tp_members)`: part of the stable type-object layout since 3.0.
const TP_MEMBERS: u64 = 240;
/// `sizeof(PyMemberDef)`: name, type (+pad), offset, flags (+pad), doc.
const MEMBER_DEF: u64 = 40;

/// Reads `PyCode_Type.tp_members` in the target to learn the code object's field offsets.
pub fn code_offsets(mem: &TargetMemory, code_type_addr: u64) -> Result<CodeOffsets, PythonError> {
    let members = mem.read_u64(code_type_addr + TP_MEMBERS)?;
    let mut out = CodeOffsets::default();
    let (mut got_file, mut got_name) = (false, false);
    for i in 0..128 {
        let def = members + i * MEMBER_DEF;
        let name_ptr = mem.read_u64(def)?;
        if name_ptr == 0 {
            break;
        }
        let name = mem.read_cstr(name_ptr, 64)?;
        let offset = mem.read_u64(def + 16)?;
        match name.as_str() {
            "co_filename" => {
                out.filename = offset;
                got_file = true;
            }
            "co_name" => {
                out.name = offset;
                got_name = true;
            }
            "co_qualname" => out.qualname = Some(offset),
            _ => {}
        }
    }
    if !(got_file && got_name) {
        return Err(PythonError::Missing {
            what: "co_filename/co_name in PyCode_Type.tp_members".into(),
            path: PathBuf::from(format!("pid {}", mem.pid())),
        });
    }
    Ok(out)
}

/// Reads code objects out of the target.
pub struct CodeReader {
    pub layout: FrameLayout,
    pub offsets: CodeOffsets,
    pub code_type_addr: u64,
}

/// A code object's names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeNames {
    pub qualname: String,
    pub filename: String,
}

impl CodeReader {
    /// Reads one code object; `None` when the pointer is not a live code object (freed, or a
    /// non-code executable in 3.13+ shim frames). Three reads in the common case (the code
    /// object's head, then each string's header with its first bytes): importing torch hands
    /// the daemon tens of thousands of new code objects within seconds.
    pub fn read(&self, mem: &TargetMemory, code: u64) -> Result<Option<CodeNames>, MemError> {
        let name_off = self.offsets.qualname.unwrap_or(self.offsets.name);
        let head_len = (name_off.max(self.offsets.filename) + 8) as usize;
        let mut head = vec![0u8; head_len];
        let field = |head: &[u8], off: u64| {
            let o = off as usize;
            u64::from_le_bytes(head[o..o + 8].try_into().expect("8 bytes"))
        };
        let (ob_type, name_ptr, file_ptr) = match mem.read(code, &mut head) {
            Ok(()) => (
                field(&head, 8),
                field(&head, name_off),
                field(&head, self.offsets.filename),
            ),
            // The object may end near an unmapped page: read field by field.
            Err(_) => (
                mem.read_u64(code + 8)?,
                mem.read_u64(code + name_off)?,
                mem.read_u64(code + self.offsets.filename)?,
            ),
        };
        if ob_type != self.code_type_addr {
            return Ok(None);
        }
        let qualname = self.read_str(mem, name_ptr)?;
        let filename = self.read_str(mem, file_ptr)?;
        Ok(Some(CodeNames { qualname, filename }))
    }

    /// Reads a compact `str` object (the only kind code objects hold). The target chooses its
    /// names: at most [`NAME_MAX`] characters are read and at most as many bytes kept, the rest
    /// replaced by a `…[cut N chars]` marker; a lone surrogate becomes U+FFFD.
    fn read_str(&self, mem: &TargetMemory, obj: u64) -> Result<String, MemError> {
        // Header and the first bytes of an ASCII string in one read when possible.
        const INLINE: usize = 128;
        let header = self.layout.ascii_header as usize;
        let mut buf = vec![0u8; header + INLINE];
        let whole = mem.read(obj, &mut buf).is_ok();
        if !whole {
            buf.truncate(header);
            mem.read(obj, &mut buf)?;
        }
        let full_len = u64::from_le_bytes(buf[16..24].try_into().expect("8 bytes"));
        let len = full_len.min(NAME_MAX as u64) as usize;
        let state = u32::from_le_bytes(buf[32..36].try_into().expect("4 bytes"));
        let kind = (state >> 2) & 7;
        let compact = (state >> 5) & 1 == 1;
        let ascii = (state >> 6) & 1 == 1;
        if !compact {
            return Ok(String::from("<non-compact str>"));
        }
        if ascii && whole && len <= INLINE {
            let s = buf[header..header + len]
                .iter()
                .map(|&b| b as char)
                .collect();
            return Ok(mark_cut(s, full_len));
        }
        let data = obj
            + if ascii {
                self.layout.ascii_header
            } else {
                self.layout.compact_header
            };
        let width = match kind {
            1 => 1,
            2 => 2,
            4 => 4,
            _ => return Ok(String::from("<bad str>")),
        };
        let mut buf = vec![0u8; len * width];
        mem.read(data, &mut buf)?;
        let char_of = |u: u32| char::from_u32(u).unwrap_or(char::REPLACEMENT_CHARACTER);
        let s = match width {
            1 => buf.iter().map(|&b| b as char).collect(),
            2 => buf
                .chunks_exact(2)
                .map(|c| char_of(u16::from_le_bytes([c[0], c[1]]) as u32))
                .collect(),
            _ => buf
                .chunks_exact(4)
                .map(|c| char_of(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect(),
        };
        Ok(mark_cut(s, full_len))
    }
}

/// `s`, read from a string of `full_len` characters, cut to [`NAME_MAX`] bytes and marked with
/// the number of characters left out.
fn mark_cut(mut s: String, full_len: u64) -> String {
    if s.len() > NAME_MAX {
        let mut end = NAME_MAX;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    let kept = s.chars().count() as u64;
    if full_len > kept {
        s.push_str(&cut_marker((full_len - kept) as usize, "chars"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_table() {
        let v = |minor| Version {
            major: 3,
            minor,
            micro: None,
        };
        assert_eq!(frame_layout(v(9)).unwrap().code_offset, 32);
        assert_eq!(frame_layout(v(11)).unwrap().code_offset, 32);
        assert_eq!(frame_layout(v(12)).unwrap().code_offset, 0);
        assert_eq!(frame_layout(v(14)).unwrap().code_mask, !3);
        assert!(!frame_layout(v(10)).unwrap().has_qualname);
        assert!(matches!(
            frame_layout(v(8)),
            Err(PythonError::Unsupported { .. })
        ));
        assert!(matches!(
            frame_layout(v(15)),
            Err(PythonError::Unsupported { .. })
        ));
    }

    /// A compact `str` laid out as CPython 3.12 does (`PyASCIIObject` 40 bytes, compact 56), in
    /// this process's memory: `len` is the length field, `data` the characters' bytes.
    fn fake_str(len: u64, kind: u32, ascii: bool, data: &[u8]) -> Vec<u64> {
        let header = if ascii { 40 } else { 56 };
        let mut bytes = vec![0u8; header + data.len() + 8];
        bytes[16..24].copy_from_slice(&len.to_le_bytes());
        let state = (kind << 2) | (1 << 5) | (u32::from(ascii) << 6);
        bytes[32..36].copy_from_slice(&state.to_le_bytes());
        bytes[header..header + data.len()].copy_from_slice(data);
        bytes
            .chunks(8)
            .map(|c| {
                let mut w = [0u8; 8];
                w[..c.len()].copy_from_slice(c);
                u64::from_le_bytes(w)
            })
            .collect()
    }

    #[test]
    fn hostile_strs_are_bounded_and_marked() {
        let reader = CodeReader {
            layout: frame_layout(Version {
                major: 3,
                minor: 12,
                micro: None,
            })
            .unwrap(),
            offsets: CodeOffsets::default(),
            code_type_addr: 0,
        };
        let mem = TargetMemory::new(std::process::id());
        let read = |words: &[u64]| reader.read_str(&mem, words.as_ptr() as u64).unwrap();
        let esc = b"\x1b]0;title\x07\x1b[2J";
        assert_eq!(
            read(&fake_str(esc.len() as u64, 1, true, esc)),
            String::from_utf8_lossy(esc)
        );
        // A 16 MB name: only NAME_MAX characters are read (the fake holds no more).
        let ws = vec![b'W'; NAME_MAX];
        let s = read(&fake_str(16 << 20, 1, true, &ws));
        assert_eq!(
            s,
            format!(
                "{}…[cut {} chars]",
                "W".repeat(NAME_MAX),
                (16 << 20) - NAME_MAX
            )
        );
        // UCS-2 with a lone surrogate: replaced, not dropped.
        let ucs2: Vec<u8> = [0x41u16, 0xd800, 0x42]
            .iter()
            .flat_map(|c| c.to_le_bytes())
            .collect();
        assert_eq!(read(&fake_str(3, 2, false, &ucs2)), "A\u{fffd}B");
        // UCS-4 of 4-byte characters: at most NAME_MAX bytes kept.
        let ucs4: Vec<u8> = std::iter::repeat_n(0x1f600u32, NAME_MAX)
            .flat_map(|c| c.to_le_bytes())
            .collect();
        let s = read(&fake_str(NAME_MAX as u64, 4, false, &ucs4));
        assert!(s.starts_with("😀😀"));
        assert!(
            s.ends_with(&format!("…[cut {} chars]", NAME_MAX - NAME_MAX / 4)),
            "{s:.80}"
        );
    }

    /// Every pyenv interpreter on the machine: the evaluator symbol is found and the version read
    /// from the file matches the interpreter's own idea of it.
    #[test]
    fn versions_of_installed_interpreters() {
        let root = std::env::var_os("PYENV_ROOT")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| "/root/.pyenv".into());
        let Ok(dir) = std::fs::read_dir(root.join("versions")) else {
            // `cargo xtask test` (CI) installs them: there a missing pyenv is a setup error.
            assert!(
                std::env::var_os("TRACEML_REQUIRE_ROOT").is_none(),
                "no pyenv interpreters under {}",
                root.display()
            );
            eprintln!("skipped: no pyenv interpreters under {}", root.display());
            return;
        };
        for entry in dir.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let mut parts = name.split('.').map(|p| p.parse::<u32>().ok());
            let (Some(Some(3)), Some(Some(minor))) = (parts.next(), parts.next()) else {
                continue;
            };
            if !(9..=14).contains(&minor) {
                continue;
            }
            let lib = entry.path().join(format!("lib/libpython3.{minor}.so.1.0"));
            let Ok(elf) = ElfFile::open(&lib) else {
                continue;
            };
            assert!(
                elf.find(|n| n == EVAL_SYMBOL).unwrap().is_some(),
                "{}",
                lib.display()
            );
            let v = version_of(&elf, &lib).unwrap();
            assert_eq!((v.major, v.minor), (3, minor), "{}", lib.display());
            if minor >= 11 {
                assert_eq!(v.to_string(), name, "Py_Version of {}", lib.display());
            }
        }
    }
}
