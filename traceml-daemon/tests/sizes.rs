//! Sizes a newcomer can read (issue 43): no source file over [`MAX_FILE_LINES`] lines and no
//! function over [`MAX_FN_LINES`] lines, outside tests. A file's tests are its inline test
//! module (`#[cfg(test)] mod x { … }`, at its end by the crate's convention) and the files of
//! test modules declared `#[cfg(test)] mod x;`.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 800;
const MAX_FN_LINES: usize = 100;

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The files of test modules declared `#[cfg(test)] mod x;` in `files`.
fn test_files(files: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for f in files {
        let text = std::fs::read_to_string(f).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for w in lines.windows(2) {
            let name = w[1]
                .trim()
                .strip_prefix("mod ")
                .and_then(|m| m.strip_suffix(';'));
            if let (true, Some(name)) = (w[0].trim() == "#[cfg(test)]", name) {
                let stem = f.file_stem().unwrap().to_string_lossy();
                let dir = if stem == "mod" || stem == "lib" {
                    f.parent().unwrap().to_path_buf()
                } else {
                    f.with_extension("")
                };
                out.insert(dir.join(format!("{name}.rs")));
            }
        }
    }
    out
}

/// The lines before the file's inline test module.
fn outside_tests(text: &str) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    let end = lines
        .windows(2)
        .position(|w| {
            w[0].trim() == "#[cfg(test)]"
                && ["mod ", "pub(crate) mod ", "pub(super) mod "]
                    .iter()
                    .any(|m| w[1].trim_start().starts_with(m))
                && w[1].trim_end().ends_with('{')
        })
        .unwrap_or(lines.len());
    lines[..end].to_vec()
}

/// Functions longer than `max` lines: (first line, length, signature). A function runs from
/// its `fn` line to the first line that is its indentation and `}`.
fn long_functions(lines: &[&str], max: usize) -> Vec<(usize, usize, String)> {
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let body = l.trim_start();
        let indent = &l[..l.len() - body.len()];
        let mut rest = body;
        for prefix in [
            "pub(crate) ",
            "pub(super) ",
            "pub ",
            "const ",
            "async ",
            "unsafe ",
        ] {
            rest = rest.strip_prefix(prefix).unwrap_or(rest);
        }
        if !rest.starts_with("fn ") || body.ends_with(';') {
            continue;
        }
        let close = format!("{indent}}}");
        if let Some(len) = lines[i..].iter().position(|x| *x == close)
            && len > max
        {
            out.push((i + 1, len, body.to_owned()));
        }
    }
    out
}

#[test]
fn no_file_or_function_is_too_long() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    files.sort();
    assert!(files.len() > 50, "found only {} sources", files.len());
    let tests = test_files(&files);
    let mut over = Vec::new();
    for f in files.iter().filter(|f| !tests.contains(*f)) {
        let text = std::fs::read_to_string(f).unwrap();
        let lines = outside_tests(&text);
        let rel = f.strip_prefix(&root).unwrap().display();
        if lines.len() > MAX_FILE_LINES {
            over.push(format!("{rel}: {} lines outside tests", lines.len()));
        }
        for (at, len, sig) in long_functions(&lines, MAX_FN_LINES) {
            over.push(format!("{rel}:{at}: {len} lines: {sig}"));
        }
    }
    assert!(
        over.is_empty(),
        "over {MAX_FILE_LINES} lines a file or {MAX_FN_LINES} a function:\n{}",
        over.join("\n")
    );
}

/// The checks can fail: a 101-line function and the end of the code before a test module.
#[test]
fn the_checks_see_what_they_check() {
    let mut f = vec!["    pub(crate) fn long(x: u32) -> u32 {"];
    f.extend(std::iter::repeat_n("        x;", 100));
    f.push("    }");
    assert_eq!(long_functions(&f, MAX_FN_LINES).len(), 1);
    assert_eq!(long_functions(&f[1..], MAX_FN_LINES).len(), 0);
    let text = "fn a() {}\n#[cfg(test)]\nmod tests {\n    fn b() {}\n}\n";
    assert_eq!(outside_tests(text), vec!["fn a() {}"]);
    let shared = "fn a() {}\n#[cfg(test)]\npub(super) mod tests {\n}\n";
    assert_eq!(outside_tests(shared), vec!["fn a() {}"]);
    let declared = "fn a() {}\n#[cfg(test)]\nmod tests;\n";
    assert_eq!(outside_tests(declared).len(), 3);
}
