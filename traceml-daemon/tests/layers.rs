//! The crate's modules import one way: each may use only modules of a lower layer (or its own).
//! Read from the sources (outside `#[cfg(test)]` and comments), so a cycle such as
//! summary → render → diagnosis → summary fails here instead of growing back. And no file or
//! function grows past what a newcomer can read ([`MAX_FILE_LINES`], [`MAX_FN_LINES`]).
use std::collections::BTreeSet;
use std::path::Path;

/// Layers, lowest first. Modules of the shell's rooms (`cli`, `host`, `runtime`) are named with
/// their room (`host::users`); every module of the crate must be listed
/// (`every_module_is_in_a_layer`).
const LAYERS: &[&[&str]] = &[
    // Shared helpers.
    &["units", "text", "stats", "sanitize", "phase"],
    // Plain data: samples, then the event stream that carries them.
    &["sample"],
    &["event"],
    // The host's lowest readers: /proc, users through NSS, output files.
    &[
        "host::procinfo",
        "host::reads",
        "host::users",
        "host::output",
    ],
    // Readers of the target and the stream format; who a process is, how it ended, the policy.
    &[
        "classify",
        "record",
        "attach",
        "sampler",
        "host::ending",
        "host::identity",
        "host::policy",
    ],
    // Which processes make one job.
    &["host::jobs", "host"],
    // Events → steps and probe governance, then what code fills each phase.
    &["engine", "overhead"],
    // The settings every target runs with: each a flag and a config key, with its range check.
    &["tunables"],
    &["profile"],
    // The summary model (serde types, schema).
    &["summary"],
    // The input pipeline's profile: workers' folded stacks → the model's worker profile.
    &["pipeline"],
    // Verdict rules: read the model, write findings.
    &["diagnosis", "whatif"],
    // Aggregation: steps and samples → the model, diagnosed; a job's ranks → the job's model.
    &["analysis"],
    // The unit tests' synthetic runs (test builds only): scenarios → engine output → summaries.
    &["testkit"],
    // A job's ranks' collective ledgers joined, then the job's model.
    &["ledgers"],
    &["ranks"],
    // Two models → a comparison.
    &["compare"],
    // Many pairs of models → a sweep of comparisons.
    &["sweep"],
    // Presentation: card, JSON, HTML, summary files, the Prometheus exposition.
    &["render", "metrics"],
    // The runtime: a target's live run, its task and sinks, the view, a job's group, the
    // supervisors.
    // The live run: what it is given, the kernel side it holds, its state, then the run.
    &[
        "runtime::calibration",
        "runtime::workers",
        "runtime::kernel",
        "runtime::options",
    ],
    // The settings every mode runs with, validated (the command line builds them once).
    &["runtime::settings"],
    &["runtime::run"],
    &["runtime::target"],
    &["runtime::task"],
    &["runtime::sinks", "runtime::view"],
    &["runtime::group"],
    &["runtime::supervisor"],
    &["runtime::serve", "runtime"],
    // The command line: errors, outputs, the commands, dispatch.
    &["cli::error"],
    &["cli::outputs"],
    // Flags, the config file and the defaults: each setting from one definition.
    &["cli::settings"],
    &["cli::offline", "cli::attach"],
    &["cli"],
    // The crate root (the eBPF object) and the binary.
    &["lib", "main"],
];

/// The shell's rooms: their modules are named `room::module`.
const ROOMS: &[&str] = &["cli", "host", "runtime"];

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The source without comments and without its inline `#[cfg(test)]` modules (`mod x { … }`,
/// at a file's end by the crate's convention: everything from the first one on is cut). A
/// declaration of a test module in its own file (`#[cfg(test)] mod tests;`) cuts nothing: that
/// file is left out by [`test_files`], and the code around the declaration is checked.
fn code(text: &str) -> String {
    let mut end = text.len();
    for (i, _) in text.match_indices("#[cfg(test)]") {
        let rest = text[i + "#[cfg(test)]".len()..].trim_start();
        let rest = rest.strip_prefix("pub(crate) ").unwrap_or(rest);
        if let Some(m) = rest.strip_prefix("mod ") {
            let name_end = m
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(m.len());
            if m[name_end..].trim_start().starts_with('{') {
                end = i;
                break;
            }
        }
    }
    text[..end]
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The files of test modules declared `#[cfg(test)] mod x;` (`engine/tests.rs` for
/// `engine/mod.rs`'s, `render/x.rs` for `render.rs`'s): test code, which may use any layer.
fn test_files(files: &[std::path::PathBuf]) -> BTreeSet<std::path::PathBuf> {
    let mut out = BTreeSet::new();
    for f in files {
        let text = std::fs::read_to_string(f).unwrap();
        for (i, _) in text.match_indices("#[cfg(test)]") {
            let rest = text[i + "#[cfg(test)]".len()..].trim_start();
            let Some(m) = rest.strip_prefix("mod ") else {
                continue;
            };
            let Some(name) = m
                .split(';')
                .next()
                .filter(|n| n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            else {
                continue;
            };
            let stem = f.file_stem().unwrap().to_string_lossy();
            let dir = if stem == "mod" || stem == "lib" {
                f.parent().unwrap().to_path_buf()
            } else {
                f.with_extension("")
            };
            out.insert(dir.join(format!("{name}.rs")));
        }
    }
    out
}

/// The top-level modules named after `crate::` (also inside `use crate::{a, b::c}`).
fn uses(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for part in group[..end].split(',') {
                let name = path_name(part.trim());
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        } else {
            out.insert(path_name(rest));
        }
    }
    out
}

/// The module a path after `crate::` names: `host::users` for a room's module, else its first
/// segment.
fn path_name(rest: &str) -> String {
    let seg = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let first = seg(rest);
    if ROOMS.contains(&first.as_str())
        && let Some(tail) = rest[first.len()..].strip_prefix("::")
    {
        let second = seg(tail);
        if !second.is_empty()
            && second
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_lowercase())
        {
            return format!("{first}::{second}");
        }
    }
    first
}

/// The module of a source file: `host::users` for `host/users.rs`, `host` for `host/mod.rs`,
/// else the first component (`engine` for `engine/thread.rs`).
fn module_of(rel: &Path) -> String {
    let parts: Vec<String> = rel
        .components()
        .map(|c| {
            c.as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_owned()
        })
        .collect();
    match parts.as_slice() {
        [room, m, ..] if ROOMS.contains(&room.as_str()) && m != "mod" => format!("{room}::{m}"),
        [first, ..] => first.clone(),
        [] => String::new(),
    }
}

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn imports_go_down_the_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let tests = test_files(&files);
    assert!(
        tests.contains(&src.join("engine/tests.rs")),
        "test files not found: {tests:?}"
    );
    let mut wrong = Vec::new();
    for f in files.into_iter().filter(|f| !tests.contains(f)) {
        let rel = f.strip_prefix(&src).unwrap();
        let module = module_of(rel);
        let Some(own) = layer(&module) else {
            panic!("{} is in no layer", rel.display())
        };
        let text = std::fs::read_to_string(&f).unwrap();
        let mut used_here = uses(&code(&text));
        // A room's module may reach its siblings as `super::x`.
        if let Some((room, _)) = module.split_once("::") {
            for (i, _) in code(&text).match_indices("super::") {
                let rest = &code(&text)[i + "super::".len()..];
                used_here.insert(path_name(&format!("{room}::{rest}")));
            }
        }
        for used in used_here {
            if used == module || module.starts_with(&format!("{used}::")) {
                continue;
            }
            if let Some(l) = layer(&used)
                && l >= own
            {
                wrong.push(format!("{} uses crate::{used}", rel.display()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the layers (see LAYERS):\n{}",
        wrong.join("\n")
    );
}

/// Renderers read only the model (`summary`, and the rules' findings in it): never the engine,
/// the aggregation that builds the model, or the target. A `Phase` is named through the model.
#[test]
fn renderers_read_only_the_model() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![src.join("render.rs")];
    sources(&src.join("render"), &mut files);
    let mut wrong = Vec::new();
    for f in files
        .iter()
        .filter(|f| !f.to_string_lossy().ends_with("tests.rs"))
    {
        let text = std::fs::read_to_string(f).unwrap();
        for used in uses(&code(&text)) {
            if [
                "engine",
                "analysis",
                "host::procinfo",
                "attach",
                "runtime",
                "runtime::target",
                "runtime::task",
                "sampler",
            ]
            .contains(&used.as_str())
            {
                wrong.push(format!("{} uses crate::{used}", f.display()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "presentation reads the model only:\n{}",
        wrong.join("\n")
    );
}

/// Every source file of the crate belongs to a listed module: a new module cannot escape the
/// check by being left out.
#[test]
fn every_module_is_in_a_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let missing: Vec<String> = files
        .iter()
        .map(|f| module_of(f.strip_prefix(&src).unwrap()))
        .filter(|m| layer(m).is_none())
        .collect();
    assert!(missing.is_empty(), "modules in no layer: {missing:?}");
    assert_eq!(module_of(Path::new("host/users.rs")), "host::users");
    assert_eq!(module_of(Path::new("host/mod.rs")), "host");
    assert_eq!(module_of(Path::new("engine/thread.rs")), "engine");
    assert_eq!(path_name("runtime::task::Folds"), "runtime::task");
    assert_eq!(path_name("host::jobs"), "host::jobs");
}

#[test]
fn the_parser_sees_grouped_and_plain_uses() {
    let u = uses("use crate::{a::B, c};\nlet x = crate::d::e();\n");
    assert_eq!(u, ["a", "c", "d"].map(String::from).into_iter().collect());
    assert!(code("// crate::x\nfn f() {}\n#[cfg(test)]\nmod tests { crate::y }").contains("fn f"));
    assert!(uses(&code("// crate::x\n#[cfg(test)]\nmod tests { crate::y }")).is_empty());
    // A declared test module cuts nothing: the code after it is checked.
    assert!(code("#[cfg(test)]\nmod tests;\nuse crate::z;").contains("crate::z"));
}

// Sizes a newcomer can read (issue 43): no source file over [`MAX_FILE_LINES`] lines and no
// function over [`MAX_FN_LINES`] lines, outside tests (a file's inline test module, and the
// files of test modules declared `#[cfg(test)] mod x;`: [`test_files`]).
const MAX_FILE_LINES: usize = 800;
const MAX_FN_LINES: usize = 100;

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

/// No file over [`MAX_FILE_LINES`] lines and no function over [`MAX_FN_LINES`] outside tests,
/// in the daemon's sources and in xtask's (`xtask/src`: the build, test and bench tool is held
/// to the same sizes).
#[test]
fn no_file_or_function_is_too_long() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = manifest.parent().expect("the workspace");
    let mut files = Vec::new();
    sources(&manifest.join("src"), &mut files);
    assert!(files.len() > 50, "found only {} sources", files.len());
    let n = files.len();
    sources(&root.join("xtask/src"), &mut files);
    assert!(
        files.len() > n + 10,
        "found only {} xtask sources",
        files.len() - n
    );
    files.sort();
    let tests = test_files(&files);
    let mut over = Vec::new();
    for f in files.iter().filter(|f| !tests.contains(*f)) {
        let text = std::fs::read_to_string(f).unwrap();
        let lines = outside_tests(&text);
        let rel = f.strip_prefix(root).unwrap().display();
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

/// The types a source defines outside its tests (`struct`, `enum`, `trait`, `type`), by name.
fn type_names(lines: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for l in lines {
        let mut rest = l.trim_start();
        for prefix in ["pub(crate) ", "pub(super) ", "pub "] {
            rest = rest.strip_prefix(prefix).unwrap_or(rest);
        }
        for kind in ["struct ", "enum ", "trait ", "type "] {
            if let Some(r) = rest.strip_prefix(kind) {
                let end = r
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(r.len());
                if end > 0 && r.starts_with(|c: char| c.is_ascii_uppercase()) {
                    out.push(r[..end].to_owned());
                }
            }
        }
    }
    out
}

/// One name for one thing: no two types of the crate share a name outside tests (a reader
/// meeting `Tick` or `Policy` knows which one it is).
#[test]
fn no_two_types_share_a_name() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    files.sort();
    let tests = test_files(&files);
    let mut seen: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for f in files.iter().filter(|f| !tests.contains(*f)) {
        let text = std::fs::read_to_string(f).unwrap();
        let rel = f.strip_prefix(&root).unwrap().display().to_string();
        for name in type_names(&outside_tests(&text)) {
            seen.entry(name).or_default().push(rel.clone());
        }
    }
    assert!(seen.len() > 100, "found only {} types", seen.len());
    let pairs: Vec<String> = seen
        .iter()
        .filter(|(_, at)| at.len() > 1)
        .map(|(name, at)| format!("{name}: {}", at.join(", ")))
        .collect();
    assert!(
        pairs.is_empty(),
        "types sharing a name:\n{}",
        pairs.join("\n")
    );
    // The check sees a pair.
    let two = type_names(&["pub struct Tick {", "    enum Tick {", "type Alias = u8;"]);
    assert_eq!(two, ["Tick", "Tick", "Alias"]);
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
