//! Text that came from a target, made safe where it is read and where it is shown.
//!
//! A root daemon reads names out of processes it does not trust: code-object qualnames and
//! file names, `comm`, the command line, `record_function` names, library paths, DataLoader
//! class names. Any of them can hold terminal escape sequences, HTML, invalid UTF-8, NUL or
//! megabytes. Two rules:
//!
//! - **Where read**: bytes become text lossily ([`lossy_bounded`]) and every name is bounded
//!   ([`NAME_MAX`]), with a visible marker when cut (`…[cut 16773120 bytes]`).
//! - **Where shown**: [`terminal`] for the card and logs (every control, escape and
//!   bidirectional-formatting character written as a visible `\x1b` / `\u{202e}`), [`html`] for
//!   the HTML report, [`prom_label`] for Prometheus label values. JSON needs nothing more:
//!   serde escapes control characters and every Rust `String` is valid UTF-8.
use std::borrow::Cow;
use std::fmt::Write as _;

/// Bytes kept of one name read from a target (a qualname, file name, library path, class name,
/// one command-line argument). `PATH_MAX` is 4096.
pub const NAME_MAX: usize = 4096;
/// Command-line arguments kept.
pub const ARGS_MAX: usize = 256;
/// Bytes kept of a Prometheus label value.
pub const LABEL_MAX: usize = 128;

/// The marker appended where text was cut: `…[cut 16773120 bytes]`.
pub fn cut_marker(dropped: usize, unit: &str) -> String {
    format!("…[cut {dropped} {unit}]")
}

/// `s` cut to at most `max` bytes (at a character boundary), with [`cut_marker`] when cut.
pub fn bounded(s: &str, max: usize) -> Cow<'_, str> {
    if s.len() <= max {
        return Cow::Borrowed(s);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!(
        "{}{}",
        &s[..end],
        cut_marker(s.len() - end, "bytes")
    ))
}

/// `s` bounded in place (see [`bounded`]).
pub fn bound(s: &mut String, max: usize) {
    if let Cow::Owned(b) = bounded(s, max) {
        *s = b;
    }
}

/// Bytes from a target as text: invalid UTF-8 replaced by U+FFFD, at most `max` bytes of the
/// input kept (never splitting a character), the rest replaced by [`cut_marker`] counting the
/// input's bytes.
pub fn lossy_bounded(bytes: &[u8], max: usize) -> String {
    let mut out = String::new();
    let mut used = 0;
    for chunk in bytes.utf8_chunks() {
        let valid = chunk.valid();
        if used + valid.len() > max {
            let mut end = max - used;
            while !valid.is_char_boundary(end) {
                end -= 1;
            }
            out.push_str(&valid[..end]);
            used += end;
            break;
        }
        out.push_str(valid);
        used += valid.len();
        let invalid = chunk.invalid().len();
        if invalid > 0 {
            if used + invalid > max {
                break;
            }
            out.push(char::REPLACEMENT_CHARACTER);
            used += invalid;
        }
    }
    if used < bytes.len() {
        out.push_str(&cut_marker(bytes.len() - used, "bytes"));
    }
    out
}

/// `/proc/<pid>/comm` as read (16 bytes at most, trailing newline dropped).
pub fn comm(bytes: &[u8]) -> String {
    let bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    lossy_bounded(bytes, NAME_MAX)
}

/// `/proc/<pid>/cmdline` as read: NUL-separated arguments, empty ones dropped, each bounded to
/// [`NAME_MAX`], at most [`ARGS_MAX`] of them (the last one kept says how many were cut).
pub fn cmdline(bytes: &[u8]) -> Vec<String> {
    let args: Vec<&[u8]> = bytes.split(|&b| b == 0).filter(|a| !a.is_empty()).collect();
    let mut out: Vec<String> = args
        .iter()
        .take(ARGS_MAX)
        .map(|a| lossy_bounded(a, NAME_MAX))
        .collect();
    if args.len() > ARGS_MAX {
        out.push(cut_marker(args.len() - ARGS_MAX, "arguments"));
    }
    out
}

/// Characters that must not reach a terminal as they are: C0 controls (tab and newline
/// included: a name must not break or overwrite a line), DEL, C1 controls (8-bit CSI and OSC
/// among them), and the invisible formatting characters that reorder or hide text (bidi
/// embeddings, overrides and isolates, zero-width characters, BOM).
fn unsafe_char(c: char) -> bool {
    matches!(c,
        '\0'..='\x1f'
        | '\x7f'..='\u{9f}'
        | '\u{200b}'..='\u{200f}'
        | '\u{2028}'..='\u{202e}'
        | '\u{2060}'..='\u{2064}'
        | '\u{2066}'..='\u{2069}'
        | '\u{feff}'
        | '\u{fff9}'..='\u{fffb}')
}

/// `s` for a terminal: each [`unsafe_char`] written visibly (`\x1b`, `\x00`, `\u{202e}`), so
/// no escape sequence, line break or reordering reaches the screen, and the name stays
/// recognisable.
pub fn terminal(s: &str) -> Cow<'_, str> {
    if !s.chars().any(unsafe_char) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if !unsafe_char(c) {
            out.push(c);
        } else if (c as u32) < 0x80 {
            let _ = write!(out, "\\x{:02x}", c as u32);
        } else {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
    Cow::Owned(out)
}

/// `s` for a terminal ([`terminal`]) and at most `max` bytes long (marked when cut).
pub fn terminal_bounded(s: &str, max: usize) -> String {
    terminal(&bounded(s, max)).into_owned()
}

/// `s` as HTML text or a quoted attribute value: `& < > " '` as entities, and control and
/// formatting characters written visibly as in [`terminal`] (no element, script or entity can
/// come from a name).
/// A name for a directory (a job's, a replay's): ASCII letters, digits, `-` and `_`, every other
/// character `_`; `target` when nothing is left.
pub fn dir_name(s: &str) -> String {
    let s: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() { "target".into() } else { s }
}

pub fn html(s: &str) -> String {
    let s = terminal(s);
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `s` as a Prometheus label value, ready to go between the quotes of the text exposition
/// format: at most [`LABEL_MAX`] bytes of the name (marked when cut), control characters written
/// visibly, then `\` and `"` escaped (newlines are gone by then, see [`terminal`]).
pub fn prom_label(s: &str) -> String {
    let s = terminal_bounded(s, LABEL_MAX);
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Names a hostile target can give its functions, files, classes and process.
    pub(crate) fn hostile_names() -> Vec<String> {
        vec![
            "\x1b[2J\x1b[H".to_owned(),
            "\x1b]0;pwned title\x07".to_owned(),
            "\x1b]8;;http://evil/\x1b\\link\x1b]8;;\x1b\\".to_owned(),
            "\u{9b}31m8-bit CSI".to_owned(),
            "line\nbreak\rreturn\ttab\0nul\x7fdel".to_owned(),
            "<script>alert(1)</script><img src=x onerror=alert(2)>".to_owned(),
            "rtl\u{202e}gnp.exe".to_owned(),
            "\"quote\" back\\slash 'single'".to_owned(),
            String::from_utf8_lossy(b"bad \xff\xfe utf8").into_owned(),
            format!("\x1b[2J{}", "W".repeat(100_000)),
        ]
    }

    /// Characters no terminal rendering of a hostile name may hold.
    pub(crate) fn assert_terminal_safe(text: &str) {
        for c in text.chars() {
            assert!(
                c == '\n' || !unsafe_char(c),
                "{:?} in {:?}",
                c,
                &text[..text.len().min(200)]
            );
        }
    }

    #[test]
    fn terminal_writes_controls_visibly() {
        assert_eq!(terminal("plain name"), "plain name");
        assert!(matches!(terminal("Klass.method"), Cow::Borrowed(_)));
        assert_eq!(terminal("\x1b[2J"), "\\x1b[2J");
        assert_eq!(terminal("\x1b]0;t\x07"), "\\x1b]0;t\\x07");
        assert_eq!(terminal("a\nb\tc\0"), "a\\x0ab\\x09c\\x00");
        assert_eq!(terminal("\u{9b}1m"), "\\u{9b}1m");
        assert_eq!(terminal("a\u{202e}b"), "a\\u{202e}b");
        assert_eq!(terminal("ünïcødé 日本 ✓"), "ünïcødé 日本 ✓");
        for name in hostile_names() {
            let t = terminal(&name);
            assert_terminal_safe(&t);
            assert!(!t.contains('\n'));
        }
    }

    #[test]
    fn bounded_cuts_at_char_boundaries_with_a_marker() {
        assert_eq!(bounded("short", 10), "short");
        assert_eq!(bounded("abcdef", 3), "abc…[cut 3 bytes]");
        // "é" is two bytes: a cut in its middle backs up before it.
        assert_eq!(bounded("aé", 2), "a…[cut 2 bytes]");
        let big = "W".repeat(16 << 20);
        let b = bounded(&big, NAME_MAX);
        assert_eq!(
            b.len(),
            NAME_MAX + cut_marker((16 << 20) - NAME_MAX, "bytes").len()
        );
        assert!(b.ends_with("…[cut 16773120 bytes]"));
        let mut s = "x".repeat(10);
        bound(&mut s, 4);
        assert_eq!(s, "xxxx…[cut 6 bytes]");
    }

    #[test]
    fn lossy_bounded_replaces_invalid_utf8_and_counts_input_bytes() {
        assert_eq!(lossy_bounded(b"plain", 10), "plain");
        assert_eq!(lossy_bounded(b"a\xffb", 10), "a\u{fffd}b");
        assert_eq!(lossy_bounded(b"abcdef", 4), "abcd…[cut 2 bytes]");
        // A cut in a multi-byte character keeps the input whole up to it.
        assert_eq!(lossy_bounded("aé".as_bytes(), 2), "a…[cut 2 bytes]");
        assert_eq!(
            lossy_bounded(b"ab\xff\xffcd", 3),
            "ab\u{fffd}…[cut 3 bytes]"
        );
        assert_eq!(lossy_bounded(b"", 0), "");
        let big = vec![b'W'; 16 << 20];
        assert!(lossy_bounded(&big, NAME_MAX).ends_with("…[cut 16773120 bytes]"));
    }

    #[test]
    fn comm_and_cmdline_from_proc_bytes() {
        assert_eq!(comm(b"python3\n"), "python3");
        assert_eq!(comm(b"\x1b[2J\xff\n"), "\x1b[2J\u{fffd}");
        assert_eq!(
            cmdline(b"python\0train.py\0--lr\x000.1\0"),
            ["python", "train.py", "--lr", "0.1"]
        );
        let many: Vec<u8> = (0..300).flat_map(|_| *b"a\0").collect();
        let args = cmdline(&many);
        assert_eq!(args.len(), ARGS_MAX + 1);
        assert_eq!(args.last().unwrap(), "…[cut 44 arguments]");
        let long = [vec![b'x'; 1 << 20], b"\0\xff".to_vec()].concat();
        let args = cmdline(&long);
        assert_eq!(args.len(), 2);
        assert!(args[0].ends_with(&cut_marker((1 << 20) - NAME_MAX, "bytes")));
        assert_eq!(args[1], "\u{fffd}");
    }

    #[test]
    fn dir_names_keep_only_safe_characters() {
        assert_eq!(dir_name("python3.11"), "python3_11");
        assert_eq!(dir_name("../x y"), "___x_y");
        assert_eq!(dir_name("pt_elastic-1"), "pt_elastic-1");
        assert_eq!(dir_name(""), "target");
    }

    #[test]
    fn html_escapes_markup_and_controls() {
        assert_eq!(
            html("<script>alert('x')</script>"),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"
        );
        assert_eq!(html("a&b \"c\""), "a&amp;b &quot;c&quot;");
        assert_eq!(html("\x1b[2J"), "\\x1b[2J");
        for name in hostile_names() {
            let h = html(&name);
            assert!(!h.contains(['<', '>', '"', '\'']), "{h:.200}");
            assert_terminal_safe(&h);
            // Every `&` starts one of our entities.
            for (i, _) in h.match_indices('&') {
                let rest = &h[i..];
                assert!(
                    ["&amp;", "&lt;", "&gt;", "&quot;", "&#39;"]
                        .iter()
                        .any(|e| rest.starts_with(e)),
                    "{rest:.20}"
                );
            }
        }
    }

    #[test]
    fn prom_label_escapes_and_bounds() {
        assert_eq!(prom_label("python"), "python");
        assert_eq!(prom_label("a\"b\\c"), "a\\\"b\\\\c");
        assert_eq!(prom_label("a\nb"), "a\\\\x0ab");
        let long = prom_label(&"W".repeat(100_000));
        assert!(long.starts_with(&"W".repeat(LABEL_MAX)));
        assert!(long.ends_with("…[cut 99872 bytes]"));
        for name in hostile_names() {
            let l = prom_label(&name);
            assert_terminal_safe(&l);
            assert!(!l.contains('\n'));
            // Every quote is escaped: the value cannot end the label early.
            let b = l.as_bytes();
            for (i, _) in l.match_indices('"') {
                let backslashes = b[..i].iter().rev().take_while(|&&c| c == b'\\').count();
                assert_eq!(backslashes % 2, 1, "{l:.200}");
            }
            assert!(l.len() <= 4 * LABEL_MAX + 64, "bounded: {} bytes", l.len());
        }
    }
}
