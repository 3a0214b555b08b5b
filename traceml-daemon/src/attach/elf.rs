//! Reading the ELF files the target maps: symbol lookup (exact or by predicate, dynamic and static
//! symbol tables), virtual address → file offset, and the check of the first instruction at each
//! probe site (place probes past `endbr64`, refuse LOCK-prefixed sites).
use std::path::{Path, PathBuf};

use object::{Object, ObjectSegment, ObjectSymbol};

#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not an ELF file we can read: {source}")]
    Parse {
        path: PathBuf,
        source: object::Error,
    },
    #[error("symbol {symbol} is not in {path}")]
    NoSymbol { symbol: String, path: PathBuf },
    #[error("symbol {symbol} at {addr:#x} in {path} is not inside a loadable segment")]
    NotLoaded {
        symbol: String,
        addr: u64,
        path: PathBuf,
    },
    #[error(
        "cannot place a probe on {symbol} in {path}: its first instruction is LOCK-prefixed, which \
         the kernel refuses to probe"
    )]
    LockPrefixed { symbol: String, path: PathBuf },
}

/// A loaded ELF file (the whole file in memory; read once per file).
pub struct ElfFile {
    pub path: PathBuf,
    /// The file, mapped read-only: only the pages we touch (headers, symbol tables, a few bytes
    /// of code) are read, which matters for libtorch_cpu.so (~500 MB).
    data: memmap2::Mmap,
}

/// A resolved function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    pub name: String,
    /// Virtual address in the file's address space.
    pub addr: u64,
    pub size: u64,
}

/// Where a uprobe goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeSite {
    pub symbol: String,
    /// File offset of the probed instruction (what the kernel's uprobe API takes).
    pub file_offset: u64,
    /// Bytes skipped at the start of the function (4 when it starts with `endbr64`).
    pub skipped: u64,
}

const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

impl ElfFile {
    pub fn open(path: &Path) -> Result<Self, ElfError> {
        let read = |source| ElfError::Read {
            path: path.into(),
            source,
        };
        let file = std::fs::File::open(path).map_err(read)?;
        // SAFETY: a read-only private mapping. The mapped library could be replaced on disk while
        // we read it; writers replace such files (new inode) rather than write into them, and the
        // target maps the same inode.
        let data = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| ElfError::Read {
            path: path.into(),
            source,
        })?;
        let f = ElfFile {
            path: path.into(),
            data,
        };
        f.parse()?;
        Ok(f)
    }

    fn parse(&self) -> Result<object::File<'_>, ElfError> {
        object::File::parse(&*self.data).map_err(|source| ElfError::Parse {
            path: self.path.clone(),
            source,
        })
    }

    /// Whether the file imports (an undefined dynamic symbol) a name satisfying `pred`.
    pub fn imports(&self, pred: impl Fn(&str) -> bool) -> Result<bool, ElfError> {
        let obj = self.parse()?;
        Ok(obj
            .dynamic_symbols()
            .filter(|s| s.is_undefined())
            .any(|s| s.name().map(&pred).unwrap_or(false)))
    }

    /// Whether its read-only data (`.rodata`) holds every one of `needles` (one pass).
    pub fn rodata_holds_all(&self, needles: &[&[u8]]) -> Result<bool, ElfError> {
        use object::ObjectSection;
        let obj = self.parse()?;
        let Some(data) = obj.section_by_name(".rodata").and_then(|s| s.data().ok()) else {
            return Ok(false);
        };
        let Ok(ac) = aho_corasick::AhoCorasick::new(needles) else {
            return Ok(false);
        };
        let mut seen = vec![false; needles.len()];
        for m in ac.find_overlapping_iter(data) {
            seen[m.pattern().as_usize()] = true;
            if seen.iter().all(|&x| x) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The first defined function whose name satisfies `pred`, from the dynamic symbol table and
    /// then the static one.
    pub fn find(&self, pred: impl Fn(&str) -> bool) -> Result<Option<Symbol>, ElfError> {
        let obj = self.parse()?;
        let found = obj
            .dynamic_symbols()
            .chain(obj.symbols())
            .filter(|s| s.is_definition() && s.address() != 0)
            .find(|s| s.name().map(&pred).unwrap_or(false))
            .map(|s| Symbol {
                name: s.name().unwrap_or_default().to_owned(),
                addr: s.address(),
                size: s.size(),
            });
        Ok(found)
    }

    /// For each matcher, the first defined function whose name it matches (dynamic symbol table,
    /// then the static one), as [`find`](Self::find) would give it, in one pass over the tables
    /// with one automaton over all the names sought: libtorch's tables hold hundreds of
    /// thousands of names, and a file's probes are resolved together.
    pub fn find_all(&self, matchers: &[super::Matcher]) -> Result<Vec<Option<Symbol>>, ElfError> {
        use super::Matcher;
        let needles: Vec<&str> = matchers
            .iter()
            .map(|m| match *m {
                Matcher::Exact(n) | Matcher::Contains(n) => n,
            })
            .collect();
        let ac = aho_corasick::AhoCorasick::new(&needles).expect("a handful of plain names");
        let obj = self.parse()?;
        let mut found: Vec<Option<Symbol>> = vec![None; matchers.len()];
        let mut left = matchers.len();
        for s in obj.dynamic_symbols().chain(obj.symbols()) {
            if left == 0 {
                break;
            }
            let Ok(name) = s.name_bytes() else { continue };
            for m in ac.find_overlapping_iter(name) {
                let i = m.pattern().as_usize();
                let whole = m.start() == 0 && m.end() == name.len();
                if found[i].is_some()
                    || (matches!(matchers[i], Matcher::Exact(_)) && !whole)
                    || !s.is_definition()
                    || s.address() == 0
                {
                    continue;
                }
                found[i] = Some(Symbol {
                    name: String::from_utf8_lossy(name).into_owned(),
                    addr: s.address(),
                    size: s.size(),
                });
                left -= 1;
            }
        }
        Ok(found)
    }

    /// The function named exactly `name`.
    pub fn symbol(&self, name: &str) -> Result<Symbol, ElfError> {
        self.find(|n| n == name)?.ok_or_else(|| ElfError::NoSymbol {
            symbol: name.into(),
            path: self.path.clone(),
        })
    }

    /// Translates a virtual address to a file offset through the loadable segments.
    pub fn file_offset(&self, addr: u64) -> Option<u64> {
        let obj = self.parse().ok()?;
        obj.segments().find_map(|seg| {
            let (off, size) = seg.file_range();
            (addr >= seg.address() && addr < seg.address() + size)
                .then(|| addr - seg.address() + off)
        })
    }

    /// The virtual address of the first loadable segment (0 for shared objects and PIE
    /// executables), page-aligned: runtime address = load base + (addr - this).
    pub fn first_segment_vaddr(&self) -> u64 {
        self.parse()
            .ok()
            .and_then(|obj| obj.segments().map(|s| s.address()).min())
            .map(|a| a & !0xfff)
            .unwrap_or(0)
    }

    /// Bytes of the file at a file offset.
    pub fn bytes_at(&self, file_offset: u64, len: usize) -> &[u8] {
        let start = (file_offset as usize).min(self.data.len());
        let end = start.saturating_add(len).min(self.data.len());
        &self.data[start..end]
    }

    /// Decides where to put a probe on `sym`: past an `endbr64` (a probe on it is single-stepped
    /// at ~10 µs a hit; past it the kernel emulates the next instruction), never on a LOCK-prefixed
    /// instruction (the kernel refuses those).
    ///
    /// With `movable`, for probes that read neither arguments nor the stack, the probe may also
    /// move down the function's straight-line start to the first instruction the kernel emulates
    /// (push, jmp, jcc, call): every call still passes it, and a single-stepped first instruction
    /// (`mov (%rdi),%rdi` in torch's `record_function_exit_new`) costs ~20 µs a hit.
    pub fn probe_site(&self, sym: &Symbol, movable: bool) -> Result<ProbeSite, ElfError> {
        let off = self
            .file_offset(sym.addr)
            .ok_or_else(|| ElfError::NotLoaded {
                symbol: sym.name.clone(),
                addr: sym.addr,
                path: self.path.clone(),
            })?;
        let head = self.bytes_at(off, 64);
        let mut skipped = if head.starts_with(&ENDBR64) { 4 } else { 0 };
        if movable && let Some(at) = first_emulated(&head[skipped as usize..], sym.addr + skipped) {
            skipped += at;
        }
        if has_lock_prefix(&head[skipped as usize..]) {
            return Err(ElfError::LockPrefixed {
                symbol: sym.name.clone(),
                path: self.path.clone(),
            });
        }
        Ok(ProbeSite {
            symbol: sym.name.clone(),
            file_offset: off + skipped,
            skipped,
        })
    }

    /// Where a probe goes on a function known only by its file offset (a pointer followed):
    /// past an `endbr64`, never on a LOCK-prefixed instruction, as [`Self::probe_site`].
    pub fn site_at(&self, file_offset: u64) -> Result<u64, ElfError> {
        let head = self.bytes_at(file_offset, 16);
        let skipped = if head.starts_with(&ENDBR64) { 4 } else { 0 };
        if head.is_empty() || has_lock_prefix(&head[skipped as usize..]) {
            return Err(ElfError::LockPrefixed {
                symbol: format!("+{file_offset:#x}"),
                path: self.path.clone(),
            });
        }
        Ok(file_offset + skipped)
    }

    /// Reads `len` bytes at a virtual address from the file's initialised data (e.g. a constant
    /// such as `Py_Version`).
    pub fn read_at_vaddr(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let off = self.file_offset(addr)?;
        let b = self.bytes_at(off, len);
        (b.len() == len).then_some(b)
    }
}

/// Offset of the first instruction the kernel's x86 uprobes emulate (push of a register, jmp,
/// jcc, call), if it is reached from the start through straight-line code only (no other
/// control flow before it) within the first few instructions.
fn first_emulated(code: &[u8], ip: u64) -> Option<u64> {
    use iced_x86::{Code, Decoder, DecoderOptions, FlowControl, Mnemonic};
    let mut dec = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
    let mut at = 0u64;
    for _ in 0..8 {
        if !dec.can_decode() {
            return None;
        }
        let insn = dec.decode();
        if insn.code() == Code::INVALID {
            return None;
        }
        let emulated = match insn.flow_control() {
            FlowControl::UnconditionalBranch
            | FlowControl::ConditionalBranch
            | FlowControl::Call => {
                // Only the relative forms are emulated; indirect ones are single-stepped.
                !insn.is_jmp_near_indirect() && !insn.is_call_near_indirect() && !insn.is_jmp_far()
            }
            FlowControl::Next => {
                insn.mnemonic() == Mnemonic::Push && insn.op0_register() != iced_x86::Register::None
            }
            _ => return None,
        };
        if emulated {
            return (at > 0).then_some(at);
        }
        if insn.has_lock_prefix() || insn.flow_control() != FlowControl::Next {
            return None;
        }
        at += insn.len() as u64;
    }
    None
}

/// True when the instruction starting at `code` carries a LOCK (0xF0) prefix among its legacy
/// prefixes.
fn has_lock_prefix(code: &[u8]) -> bool {
    for &b in code.iter().take(4) {
        match b {
            0xf0 => return true,
            // other legacy prefixes (operand/address size, segment, rep) and REX may precede it
            0x66 | 0x67 | 0x2e | 0x36 | 0x3e | 0x26 | 0x64 | 0x65 | 0xf2 | 0xf3 => continue,
            0x40..=0x4f => continue,
            _ => return false,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn movable_probes_go_to_the_first_emulated_instruction() {
        // torch 2.15's record_function_exit_new: mov (%rdi),%rdi; add $0x10,%rdi; jmp rel32
        let real = [0x48, 0x8b, 0x3f, 0x48, 0x83, 0xc7, 0x10, 0xe9, 0, 0, 0, 0];
        assert_eq!(first_emulated(&real, 0x1000), Some(7));
        // the stand-in: mov (%rdi),%rdi; test %rdi,%rdi; je +0x18
        let fake = [0x48, 0x8b, 0x3f, 0x48, 0x85, 0xff, 0x74, 0x18];
        assert_eq!(first_emulated(&fake, 0x1000), Some(6));
        // already on a push: stay
        assert_eq!(first_emulated(&[0x55, 0x48, 0x89, 0xe5], 0x1000), None);
        // a ret before any emulated instruction: do not move
        assert_eq!(first_emulated(&[0x48, 0x8b, 0x3f, 0xc3], 0x1000), None);
        // an indirect jump is single-stepped anyway: do not move past straight-line code to it
        assert_eq!(
            first_emulated(&[0x48, 0x8b, 0x3f, 0xff, 0xe0], 0x1000),
            None
        );
    }

    #[test]
    fn lock_prefix_detection() {
        assert!(has_lock_prefix(&[0xf0, 0x48, 0x83, 0x05]));
        assert!(has_lock_prefix(&[0x66, 0xf0, 0x0f, 0xb1]));
        assert!(!has_lock_prefix(&[0x55, 0x48, 0x89, 0xe5]));
        assert!(!has_lock_prefix(&[0x48, 0x83, 0xec, 0x08]));
        assert!(!has_lock_prefix(&[]));
    }

    /// The test binary itself is an ELF with symbols we know.
    #[test]
    fn resolves_own_symbols_and_offsets() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let f = ElfFile::open(&exe).unwrap();
        let sym = f
            .find(|n| n.contains("resolves_own_symbols_and_offsets"))
            .unwrap()
            .expect("own test fn");
        assert!(sym.addr != 0);
        let site = f.probe_site(&sym, false).unwrap();
        assert!(site.file_offset > 0);
        assert!(f.symbol("definitely_not_a_symbol_here").is_err());
    }

    /// One pass for many matchers gives what one `find` per matcher gives: the first match in
    /// table order, exact names only whole, absent names `None`.
    #[test]
    fn find_all_agrees_with_find() {
        use super::super::Matcher;
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let f = ElfFile::open(&exe).unwrap();
        let exact = f
            .find(|n| n.contains("find_all_agrees_with_find"))
            .unwrap()
            .unwrap();
        let exact: &'static str = Box::leak(exact.name.into_boxed_str());
        let matchers = [
            Matcher::Contains("find_all_agrees_with_find"),
            Matcher::Exact(exact),
            Matcher::Contains("resolves_own_symbols"),
            Matcher::Contains("probe_site"),
            Matcher::Exact("probe_site"),
            Matcher::Contains("definitely_not_a_symbol_here"),
            Matcher::Exact("malloc"),
        ];
        let all = f.find_all(&matchers).unwrap();
        for (m, got) in matchers.iter().zip(&all) {
            let want = match *m {
                Matcher::Exact(n) => f.find(|s| s == n).unwrap(),
                Matcher::Contains(n) => f.find(|s| s.contains(n)).unwrap(),
            };
            assert_eq!(got, &want, "{m:?}");
        }
        assert!(all[0].is_some() && all[1].is_some() && all[3].is_some());
        assert_eq!(all[4], None, "no function is called exactly probe_site");
        assert_eq!(all[5], None);
    }

    #[test]
    fn synthetic_elf_endbr_and_lock() {
        use object::write::{Object as WObject, StandardSection, Symbol as WSymbol, SymbolSection};
        use object::{
            Architecture, BinaryFormat, Endianness, SymbolFlags, SymbolKind, SymbolScope,
        };
        // Relocatable objects have no segments, so build the check on bytes directly instead.
        let mut obj = WObject::new(BinaryFormat::Elf, Architecture::X86_64, Endianness::Little);
        let text = obj.section_id(StandardSection::Text);
        let code = [
            0xf3, 0x0f, 0x1e, 0xfa, 0xf0, 0x48, 0x83, 0x05, 0, 0, 0, 0, 1, 0xc3,
        ];
        let off = obj.append_section_data(text, &code, 16);
        obj.add_symbol(WSymbol {
            name: b"locked_fn".to_vec(),
            value: off,
            size: code.len() as u64,
            kind: SymbolKind::Text,
            scope: SymbolScope::Dynamic,
            weak: false,
            section: SymbolSection::Section(text),
            flags: SymbolFlags::None,
        });
        let bytes = obj.write().unwrap();
        let parsed = object::File::parse(&*bytes).unwrap();
        let s = parsed
            .symbols()
            .find(|s| s.name() == Ok("locked_fn"))
            .unwrap();
        assert_eq!(s.size(), code.len() as u64);
        // endbr64 then a LOCK-prefixed add: the site past endbr64 must be refused.
        assert!(code.starts_with(&ENDBR64));
        assert!(has_lock_prefix(&code[4..]));
    }
}
