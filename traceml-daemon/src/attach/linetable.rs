//! The line a code object is executing, from its line table and an instruction offset: the
//! three formats CPython 3.9–3.13 use, decoded as CPython's own `PyCode_Addr2Line` does. Pure:
//! bytes in, a line out. The offset is in bytes of bytecode (3.9: `f_lasti`; 3.10: `f_lasti`
//! × 2; 3.11+: the frame's instruction pointer less the code's first code unit, × 2).
//!
//! - 3.9, `co_lnotab`: pairs (address increment, line increment as a signed byte); the line of
//!   an offset is the line after every pair whose accumulated address is ≤ the offset
//!   (`Objects/codeobject.c`, 3.9).
//! - 3.10, `co_linetable` (PEP 626): pairs (address delta, line delta as a signed byte; −128: the
//!   range has no line), each pair one address range (`Objects/lnotab_notes.txt`, 3.10).
//! - 3.11–3.13, `co_linetable` (the location table): entries of a first byte (bit 7 set; bits
//!   3–6 the kind; bits 0–2 the length in code units − 1) and kind-specific varints
//!   (`Objects/locations.md`, 3.11): 15 no location, 14 long form (signed line delta, end line,
//!   columns), 13 no columns (signed line delta), 10–12 one line (delta = kind − 10, then two
//!   column bytes), 0–9 short form (same line, one column byte).
//!
//! A malformed table (the target's memory read while it runs) gives `None`, never a panic.

/// Which table format a code object of this CPython minor version carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableFormat {
    /// 3.9's `co_lnotab`.
    Lnotab,
    /// 3.10's `co_linetable`.
    Pep626,
    /// 3.11+'s location table.
    Locations,
}

impl TableFormat {
    /// The format of CPython 3.`minor`; `None` outside 3.9–3.13.
    pub fn of_minor(minor: u32) -> Option<TableFormat> {
        match minor {
            9 => Some(TableFormat::Lnotab),
            10 => Some(TableFormat::Pep626),
            11..=13 => Some(TableFormat::Locations),
            _ => None,
        }
    }
}

/// The line executing at byte offset `offset` of a code object whose first line is
/// `first_line`, as CPython reports it (0 for 3.11+'s prologue, `RESUME` and the like, before
/// the first line); `None` when the table says the instruction has no line or cannot be read.
pub fn line_at(format: TableFormat, table: &[u8], first_line: u32, offset: u64) -> Option<u32> {
    let line = match format {
        TableFormat::Lnotab => lnotab(table, i64::from(first_line), offset),
        TableFormat::Pep626 => pep626(table, i64::from(first_line), offset),
        TableFormat::Locations => locations(table, i64::from(first_line), offset),
    }?;
    u32::try_from(line).ok()
}

fn lnotab(table: &[u8], mut line: i64, offset: u64) -> Option<i64> {
    let mut addr = 0u64;
    for pair in table.chunks_exact(2) {
        addr += u64::from(pair[0]);
        if addr > offset {
            break;
        }
        line += i64::from(pair[1] as i8);
    }
    Some(line)
}

fn pep626(table: &[u8], mut line: i64, offset: u64) -> Option<i64> {
    let mut end = 0u64;
    for pair in table.chunks_exact(2) {
        let start = end;
        end += u64::from(pair[0]);
        let delta = pair[1] as i8;
        let this = if delta == -128 {
            None
        } else {
            line += i64::from(delta);
            Some(line)
        };
        if (start..end).contains(&offset) {
            return this;
        }
    }
    None
}

/// Reads the location table's varints.
struct TableReader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl TableReader<'_> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.bytes.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    /// 6-bit chunks, least significant first; bit 6 says another follows.
    fn varint(&mut self) -> Option<u64> {
        let mut value = 0u64;
        let mut shift = 0u32;
        loop {
            let b = self.byte()?;
            value |= u64::from(b & 0x3f).checked_shl(shift)?;
            if b & 0x40 == 0 {
                return Some(value);
            }
            shift += 6;
            if shift > 60 {
                return None;
            }
        }
    }

    /// A varint whose low bit is the sign.
    fn svarint(&mut self) -> Option<i64> {
        let v = self.varint()?;
        let magnitude = i64::try_from(v >> 1).ok()?;
        Some(if v & 1 == 1 { -magnitude } else { magnitude })
    }
}

fn locations(table: &[u8], mut line: i64, offset: u64) -> Option<i64> {
    let mut r = TableReader {
        bytes: table,
        pos: 0,
    };
    let mut end = 0u64;
    while r.pos < table.len() {
        let first = r.byte()?;
        if first & 0x80 == 0 {
            return None;
        }
        let kind = (first >> 3) & 0x0f;
        let start = end;
        end += 2 * (u64::from(first & 0x07) + 1);
        let this = match kind {
            15 => None,
            14 => {
                line += r.svarint()?;
                r.varint()?;
                r.varint()?;
                r.varint()?;
                Some(line)
            }
            13 => {
                line += r.svarint()?;
                Some(line)
            }
            10..=12 => {
                line += i64::from(kind - 10);
                r.byte()?;
                r.byte()?;
                Some(line)
            }
            _ => {
                r.byte()?;
                Some(line)
            }
        };
        if (start..end).contains(&offset) {
            return this;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lnotab_adds_line_increments_up_to_the_offset() {
        // Lines 10 (bytes 0–5), 11 (6–9), 13 (10–).
        let table = [6, 1, 4, 2];
        assert_eq!(line_at(TableFormat::Lnotab, &table, 10, 0), Some(10));
        assert_eq!(line_at(TableFormat::Lnotab, &table, 10, 5), Some(10));
        assert_eq!(line_at(TableFormat::Lnotab, &table, 10, 6), Some(11));
        assert_eq!(line_at(TableFormat::Lnotab, &table, 10, 12), Some(13));
        // A negative increment (a loop's jump back to an earlier line).
        assert_eq!(
            line_at(TableFormat::Lnotab, &[4, 3, 2, 0xfe], 5, 7),
            Some(6)
        );
    }

    #[test]
    fn pep626_ranges_and_lines_without_a_number() {
        // 0–3 line 5, 4–7 no line, 8–11 line 7.
        let table = [4, 0, 4, 0x80, 4, 2];
        assert_eq!(line_at(TableFormat::Pep626, &table, 5, 2), Some(5));
        assert_eq!(line_at(TableFormat::Pep626, &table, 5, 4), None);
        assert_eq!(line_at(TableFormat::Pep626, &table, 5, 10), Some(7));
        assert_eq!(line_at(TableFormat::Pep626, &table, 5, 12), None);
    }

    #[test]
    fn location_table_entries_of_every_kind() {
        let table = [
            // 1 code unit (bytes 0–1): kind 13 (no columns), line delta +1 (svarint 2).
            0x80 | (13 << 3),
            2,
            // 2 code units (2–5): short form, same line, one column byte.
            0x80 | 1,
            0x05,
            // 1 code unit (6–7): one-line form, delta +2, two column bytes.
            0x80 | (12 << 3),
            1,
            4,
            // 1 code unit (8–9): no location.
            0x80 | (15 << 3),
            // 1 code unit (10–11): long form, delta −3 (svarint 7), end line, columns.
            0x80 | (14 << 3),
            7,
            0,
            1,
            2,
        ];
        let at = |o| line_at(TableFormat::Locations, &table, 20, o);
        assert_eq!(at(0), Some(21));
        assert_eq!(at(4), Some(21));
        assert_eq!(at(6), Some(23));
        assert_eq!(at(8), None);
        assert_eq!(at(10), Some(20));
        assert_eq!(at(12), None);
    }

    /// Prints, for every code object of a sample module (loops, a comprehension, a nested
    /// function, a multi-line call, try/except), its table and first line, and CPython's own
    /// line for each instruction: `co_lines()` (3.10+) or `dis.findlinestarts` (3.9). The oracle
    /// is the interpreter, not this module.
    const ORACLE_PY: &str = r#"
import dis, json, sys
SRC = """
def f(xs):
    total = 0
    for i, x in enumerate(xs):
        if x % 3 == 0:
            total += sum(
                y * 2
                for y in range(x)
            )
        else:
            try:
                total -= int('7') // (x - 1)
            except ZeroDivisionError:
                total += 1
    def g(a,
          b=[k for k in range(3)]):
        return a + len(b)
    return g(total)
"""
out = []
todo = [compile(SRC, 'sample.py', 'exec')]
while todo:
    c = todo.pop()
    todo.extend(k for k in c.co_consts if hasattr(k, 'co_code'))
    n = len(c.co_code)
    if sys.version_info >= (3, 10):
        lines = [None] * n
        for s, e, l in c.co_lines():
            for o in range(s, min(e, n)):
                lines[o] = l
        table = c.co_linetable
    else:
        starts = dict(dis.findlinestarts(c))
        lines, cur = [], c.co_firstlineno
        for o in range(n):
            cur = starts.get(o, cur)
            lines.append(cur)
        table = c.co_lnotab
    out.append({'first': c.co_firstlineno, 'table': table.hex(), 'lines': lines[::2]})
print(json.dumps(out))
"#;

    #[test]
    fn every_instruction_has_the_line_cpython_gives() {
        let mut checked = 0;
        for minor in 9..=13 {
            let format = TableFormat::of_minor(minor).unwrap();
            for prefix in crate::attach::pystack::tests::pyenv_dirs(minor) {
                let py = prefix.join("bin/python3");
                let out = std::process::Command::new(&py)
                    .args(["-c", ORACLE_PY])
                    .output()
                    .unwrap_or_else(|e| panic!("{}: {e}", py.display()));
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let codes: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                for c in codes.as_array().unwrap() {
                    let hex = c["table"].as_str().unwrap();
                    let table: Vec<u8> = (0..hex.len())
                        .step_by(2)
                        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                        .collect();
                    let first = c["first"].as_u64().unwrap() as u32;
                    for (i, want) in c["lines"].as_array().unwrap().iter().enumerate() {
                        let got = line_at(format, &table, first, 2 * i as u64);
                        let want = want.as_u64().map(|l| l as u32);
                        assert_eq!(got, want, "3.{minor} offset {} of {c}", 2 * i);
                        checked += 1;
                    }
                }
            }
        }
        if checked == 0 {
            println!("skip: no pyenv CPython 3.9-3.13 here");
        } else {
            println!("{checked} instructions: the line CPython gives");
        }
    }

    #[test]
    fn garbage_gives_none_not_a_panic() {
        for table in [&[0x7f][..], &[0x80 | (14 << 3), 0x40, 0x40], &[0xff; 3]] {
            for o in 0..8 {
                let _ = line_at(TableFormat::Locations, table, 1, o);
            }
        }
        assert_eq!(line_at(TableFormat::Locations, &[0x05], 1, 0), None);
        assert_eq!(TableFormat::of_minor(14), None);
    }
}
