//! The crate's modules import one way: each may use only modules of a lower layer (or its own).
//! Read from the sources (outside `#[cfg(test)]` and comments), so a cycle such as
//! summary → render → diagnosis → summary fails here instead of growing back.
use std::collections::BTreeSet;
use std::path::Path;

/// Layers, lowest first. A module not listed here is not checked.
const LAYERS: &[&[&str]] = &[
    // Shared helpers.
    &["units", "text", "stats", "sanitize", "phase"],
    // Plain data: samples, then the event stream that carries them.
    &["sample"],
    &["event"],
    // Readers of the target and the stream format.
    &["procinfo", "users"],
    &[
        "classify", "record", "attach", "sampler", "ending", "identity",
    ],
    // Events → steps and probe governance, then what code fills each phase.
    &["engine", "overhead"],
    &["profile"],
    // The summary model (serde types, schema).
    &["summary"],
    // Verdict rules: read the model, write findings.
    &["diagnosis"],
    // Aggregation: steps and samples → the model, diagnosed.
    &["analysis"],
    // Two models → a comparison.
    &["compare"],
    // Many pairs of models → a sweep of comparisons.
    &["sweep"],
    // Presentation: card, JSON, comparison output, the Prometheus exposition.
    &["render", "metrics"],
    // The shell: the live run loop, and `top`'s loop around it.
    &["live"],
    &["top"],
    // The shell's settings: flags, config file and defaults, validated once.
    &["settings"],
];

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The source without comments and without the `#[cfg(test)]` module at the end.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or(text);
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules named after `crate::` (also inside `use crate::{a, b::c}`).
fn uses(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for part in group[..end].split(',') {
                let name: String = part
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            out.insert(name);
        }
    }
    out
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
    let mut wrong = Vec::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs").to_owned();
        let Some(own) = layer(&module) else { continue };
        let text = std::fs::read_to_string(&f).unwrap();
        for used in uses(&code(&text)) {
            if used == module {
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
                "engine", "analysis", "procinfo", "attach", "live", "sampler",
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

#[test]
fn the_parser_sees_grouped_and_plain_uses() {
    let u = uses("use crate::{a::B, c};\nlet x = crate::d::e();\n");
    assert_eq!(u, ["a", "c", "d"].map(String::from).into_iter().collect());
    assert!(code("// crate::x\nfn f() {}\n#[cfg(test)]\nmod tests { crate::y }").contains("fn f"));
    assert!(uses(&code("// crate::x\n#[cfg(test)]\nmod tests { crate::y }")).is_empty());
}
