//! The documentation says what the code does: every option the binary's `--help` lists and every
//! environment variable the code reads is in docs/cli.md, and the README names the verdicts as
//! the card prints them; nothing points outside the repository, every relative markdown link
//! resolves to a file in it, and docs/README.md lists every file of docs/. No root, no eBPF:
//! built with or without the `live` feature.
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::workspace;
use traceml_daemon::summary::DiagnosisKind;

fn read(rel: &str) -> String {
    std::fs::read_to_string(workspace().join(rel)).unwrap()
}

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_traceml-daemon"))
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?} --help failed");
    String::from_utf8(out.stdout).unwrap()
}

/// `--long-option` names in a help text.
fn long_options(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices("--") {
        let name: String = text[i + 2..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        let before = text[..i].chars().next_back();
        if !name.is_empty() && before.is_none_or(|c| c.is_whitespace() || c == '(' || c == ',') {
            out.push(format!("--{name}"));
        }
    }
    out.sort();
    out.dedup();
    out
}

/// `opt` appears in `doc` as a whole option name (not as the start of a longer one).
fn mentions(doc: &str, opt: &str) -> bool {
    doc.match_indices(opt).any(|(i, _)| {
        doc[i + opt.len()..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '-'))
    })
}

/// The subcommands listed under `Commands:`.
fn subcommands(top: &str) -> Vec<String> {
    top.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_option_is_in_docs_cli() {
    let doc = read("docs/cli.md");
    let top = help(&[]);
    let mut missing = Vec::new();
    let mut all = vec![(String::new(), top.clone())];
    for c in subcommands(&top) {
        let h = help(&[&c]);
        all.push((c, h));
    }
    assert!(all.len() >= 3, "no subcommands found in:\n{top}");
    for (cmd, text) in &all {
        if !cmd.is_empty() && !doc.contains(&format!("traceml-daemon {cmd}")) {
            missing.push(format!("subcommand {cmd}"));
        }
        for opt in long_options(text) {
            if !mentions(&doc, &opt) {
                missing.push(format!("{cmd} {opt}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "not documented in docs/cli.md: {missing:?}"
    );
}

/// Environment variable names read in `text`: `var("X")`, `var_os("X")`, `from_env("X")`, and
/// any `TRACEML_*` string (names built with `format!` are matched by their prefix).
fn env_names(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for call in ["var(\"", "var_os(\"", "from_env(\""] {
        for (i, _) in text.match_indices(call) {
            let rest = &text[i + call.len()..];
            out.push(rest[..rest.find('"').unwrap_or(0)].to_owned());
        }
    }
    for (i, _) in text.match_indices("\"TRACEML_") {
        let name: String = text[i + 1..]
            .chars()
            .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        out.push(name);
    }
    out.retain(|n| !n.is_empty());
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_environment_variable_is_in_docs_cli() {
    let doc = read("docs/cli.md");
    let root = workspace();
    let mut files = vec![root.join("traceml-daemon/build.rs")];
    for d in ["traceml-daemon/src", "traceml-daemon/tests", "xtask/src"] {
        rust_files(&root.join(d), &mut files);
    }
    // Generic variables, and those cargo sets for the build.
    let generic = [
        "HOME",
        "PATH",
        "OUT_DIR",
        "CARGO_MANIFEST_DIR",
        "CARGO_PKG_VERSION",
    ];
    let mut missing = Vec::new();
    for f in files {
        if f.ends_with("tests/docs.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        for name in env_names(&text) {
            if !generic.contains(&name.as_str()) && !doc.contains(&name) {
                missing.push(format!(
                    "{name} ({})",
                    f.strip_prefix(&root).unwrap().display()
                ));
            }
        }
    }
    missing.sort();
    missing.dedup();
    assert!(
        missing.is_empty(),
        "environment variables not documented in docs/cli.md: {missing:?}"
    );
}

#[test]
fn the_readme_names_the_verdicts_as_the_card_prints_them() {
    use DiagnosisKind::*;
    let all = [
        InputBound,
        H2dBound,
        ComputeBound,
        ResidualHeavy,
        MemoryCreep,
        LowGpuUtilizationUnexplained,
        Balanced,
        InsufficientData,
        Straggler,
        Hang,
        EvaluationHeavy,
        NotTraining,
    ];
    // A new kind fails to compile here until it is added above (and to the README).
    for k in all {
        match k {
            InputBound
            | H2dBound
            | ComputeBound
            | ResidualHeavy
            | MemoryCreep
            | LowGpuUtilizationUnexplained
            | Balanced
            | InsufficientData
            | Straggler
            | Hang
            | EvaluationHeavy
            | NotTraining => {}
        }
    }
    let readme = read("README.md");
    for k in all {
        assert!(
            readme.contains(&format!("`{}`", k.headline())),
            "README.md does not name {} as the card prints it",
            k.headline()
        );
    }
}

#[test]
fn the_parsers_see_what_they_should() {
    assert_eq!(
        long_options("  -o, --output <DIR>  x (--a-b)\n  x--no"),
        ["--a-b", "--output"]
    );
    assert!(mentions("a `--format text` b", "--format"));
    assert!(!mentions("a --format-x b", "--format"));
    assert_eq!(
        env_names(
            "var_os(\"A\") var(\"B\") from_env(\"C\") \"TRACEML_X_1\" format!(\"TRACEML_P_{m}\")"
        ),
        ["B", "A", "C", "TRACEML_X_1", "TRACEML_P_"]
    );
    assert_eq!(
        relative_links(
            "[a](x.md) [b](../y.md#z) [c](#top) [d](https://e.org/f) [g](mailto:h@i)\n\
             ```\n[j](in-code.md)\n```\n[k](<l.md> \"title\") ![m](n.svg)"
        ),
        ["x.md", "../y.md", "l.md", "n.svg"]
    );
    let root = workspace();
    assert_eq!(broken_link(&root, "docs/cli.md", "serve.md"), None);
    assert_eq!(broken_link(&root, "README.md", "docs/cli.md"), None);
    for target in ["missing.md", "../shared/x.md", "/etc/hostname", "../docs"] {
        assert!(
            broken_link(&root, "docs/cli.md", target).is_some(),
            "{target}"
        );
    }
}

/// The tracked files of the repository, relative to its root.
fn tracked_files(root: &Path) -> Vec<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["ls-files", "-z"])
        .output()
        .expect("git ls-files");
    assert!(out.status.success());
    let files: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .split('\0')
        .filter(|f| !f.is_empty())
        .map(str::to_owned)
        .collect();
    assert!(files.len() > 100, "{} tracked files", files.len());
    files
}

/// The repository stands alone: no tracked text file names a folder beside it or a path of a
/// build machine (its links: [`every_link_resolves_in_the_repository`]). (Recorded data — fuzz
/// seeds, fixtures, snapshots — keeps the paths it was recorded with.)
#[test]
fn nothing_points_outside_the_repository() {
    let root = workspace();
    let text_ext = [
        ".md", ".rs", ".toml", ".sh", ".py", ".c", ".h", ".yml", ".yaml",
    ];
    let data = [
        "fuzz/seeds/",
        "tests/fixtures/",
        "/snapshots/",
        "vendor/aya/aya",
    ];
    let outside = ["../shared", "/work/shared", "/work/main", "/check/work"];
    let mut bad = Vec::new();
    for f in &tracked_files(&root) {
        if !text_ext.iter().any(|e| f.ends_with(e)) || data.iter().any(|d| f.contains(d)) {
            continue;
        }
        // This test names them to look for them.
        if f.ends_with("tests/docs.rs") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(root.join(f)) else {
            continue;
        };
        for o in outside {
            if text.contains(o) {
                bad.push(format!("{f}: names {o}"));
            }
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

/// The targets of a markdown text's relative links, `[text](path)` or `[text](path#anchor)`:
/// the path part, without the anchor or a title. Web and mail links, pure `#anchor` links and
/// fenced code blocks are left out.
fn relative_links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        for (i, _) in line.match_indices("](") {
            let rest = &line[i + 2..];
            let Some(end) = rest.find(')') else { continue };
            let dest = rest[..end].split_whitespace().next().unwrap_or("");
            let dest = dest.trim_start_matches('<').trim_end_matches('>');
            let path = dest.split('#').next().unwrap_or("");
            if path.is_empty() || path.contains("://") || path.starts_with("mailto:") {
                continue;
            }
            out.push(path.to_owned());
        }
    }
    out
}

/// Why a link to `target` from the markdown file `file` (relative to `root`) does not resolve
/// to a file inside the repository; `None` when it does.
fn broken_link(root: &Path, file: &str, target: &str) -> Option<String> {
    if Path::new(target).is_absolute() {
        return Some(format!("{file}: link ({target}) is an absolute path"));
    }
    let dir = Path::new(file).parent().unwrap_or(Path::new(""));
    match root.join(dir).join(target).canonicalize() {
        Ok(p) if p.starts_with(root.canonicalize().unwrap()) && p.is_file() => None,
        Ok(p) if p.is_file() => Some(format!(
            "{file}: link ({target}) points outside the repository"
        )),
        _ => Some(format!(
            "{file}: link ({target}) does not resolve to a file in the repository"
        )),
    }
}

/// README.md, CONTRIBUTING.md and every `.md` file in docs/, as on the disk (a new document is
/// checked before it is committed).
fn user_docs(root: &Path) -> Vec<String> {
    let mut files = vec!["README.md".to_owned(), "CONTRIBUTING.md".to_owned()];
    let mut docs: Vec<String> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// Every relative markdown link resolves to a file inside the repository: in README.md,
/// CONTRIBUTING.md and docs/*.md, and in every other tracked markdown file (vendored upstream
/// files keep their own links, to their repository's files).
#[test]
fn every_link_resolves_in_the_repository() {
    let root = workspace();
    let mut files = user_docs(&root);
    for f in tracked_files(&root) {
        if f.ends_with(".md") && !f.starts_with("vendor/") && !files.contains(&f) {
            files.push(f);
        }
    }
    let mut bad = Vec::new();
    let mut links = 0;
    for f in &files {
        let text = std::fs::read_to_string(root.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        for target in relative_links(&text) {
            links += 1;
            bad.extend(broken_link(&root, f, &target));
        }
    }
    assert!(
        links > 50,
        "{links} relative links seen: the parser sees none"
    );
    assert!(bad.is_empty(), "{bad:#?}");
}

/// docs/README.md is the index of docs/: it links every other file there.
#[test]
fn the_docs_index_lists_every_document() {
    let root = workspace();
    let index = read("docs/README.md");
    let listed = relative_links(&index);
    let mut missing = Vec::new();
    for e in std::fs::read_dir(root.join("docs")).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name != "README.md" && !listed.contains(&name) {
            missing.push(name);
        }
    }
    missing.sort();
    assert!(
        missing.is_empty(),
        "docs/README.md does not link {missing:?}"
    );
}
