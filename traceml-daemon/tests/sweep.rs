//! `traceml-daemon sweep` end to end: two directory trees of summaries replayed from the recorded
//! runs (tests/fixtures/recordings), one job of which regressed (its input-bound run against the
//! fix as baseline); the binary must flag exactly that job and exit 1, name a malformed summary
//! and exit 2, and follow `--fail-on`.
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use traceml_daemon::{analysis, record, render};

fn recording(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/recordings")
        .join(format!("{name}.jsonl.gz"));
    let rec = record::read(&path).expect("recording");
    render::to_json(&analysis::analyze(&rec.items))
}

fn put(root: &Path, job: &str, json: &str) {
    let dir = root.join(job);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("final_summary.json"), json).unwrap();
}

fn sweep(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_traceml-daemon"))
        .arg("sweep")
        .args(args)
        .arg("--color=never")
        .output()
        .expect("run traceml-daemon")
}

/// Baseline and candidate trees: `vision/resnet` regressed (fixed → input-bound), the others ran
/// the same recordings in both, and `nlp/new-model` exists in the candidate only.
fn trees(dir: &Path) -> (PathBuf, PathBuf) {
    let (a, b) = (dir.join("last-week"), dir.join("this-week"));
    let fixed = recording("input_bound_fixed");
    let bound = recording("input_bound_single");
    put(&a, "vision/resnet", &fixed);
    put(&b, "vision/resnet", &bound);
    for (job, rec) in [
        ("vision/vit", "compute_bound"),
        ("nlp/bert/rank0", "balanced"),
        ("nlp/bert/rank1", "h2d_bound"),
    ] {
        let json = recording(rec);
        put(&a, job, &json);
        put(&b, job, &json);
    }
    put(&b, "nlp/new-model", &recording("residual_heavy"));
    (a, b)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn flags_exactly_the_regressed_job() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = trees(dir.path());
    let out = sweep(&[s(&a), s(&b)]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(1), "{text}");
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("REGRESSION  "))
        .collect();
    assert_eq!(rows.len(), 1, "{text}");
    assert!(rows[0].starts_with("vision/resnet "), "{text}");
    assert!(rows[0].contains("input_wait +"), "{text}");
    assert!(rows[0].contains("INPUT-BOUND  "), "{text}");
    // The bound moving: each run's first what-if, from its own summary file.
    let first_what_if = |root: &Path| -> String {
        let text = std::fs::read_to_string(root.join("vision/resnet/final_summary.json")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let w = &v["what_if"][0];
        format!(
            "{} {:.1}×",
            w["phase"].as_str().unwrap(),
            w["throughput_factor"].as_f64().unwrap()
        )
    };
    assert!(
        rows[0].ends_with(&format!("{} → {}", first_what_if(&a), first_what_if(&b))),
        "{text}"
    );
    for job in ["vision/vit", "nlp/bert/rank0", "nlp/bert/rank1"] {
        let row = text.lines().find(|l| l.starts_with(job)).unwrap();
        assert!(row.contains("EQUIVALENT"), "{row}");
    }
    let new = text
        .lines()
        .find(|l| l.starts_with("nlp/new-model"))
        .unwrap();
    assert!(
        new.contains("UNPAIRED") && new.contains("only in candidate"),
        "{new}"
    );
    assert!(text.contains("regression: vision/resnet\n"), "{text}");

    // JSON: one object per job.
    let out = sweep(&[s(&a), s(&b), "--format", "json"]);
    assert_eq!(out.status.code(), Some(1));
    let jobs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let verdicts: Vec<(&str, &str)> = jobs
        .as_array()
        .unwrap()
        .iter()
        .map(|j| (j["job"].as_str().unwrap(), j["verdict"].as_str().unwrap()))
        .collect();
    assert_eq!(
        verdicts,
        vec![
            ("nlp/bert/rank0", "EQUIVALENT"),
            ("nlp/bert/rank1", "EQUIVALENT"),
            ("nlp/new-model", "UNPAIRED"),
            ("vision/resnet", "REGRESSION"),
            ("vision/vit", "EQUIVALENT"),
        ]
    );

    // The other way round the resnet job improved: no regression, but an unpaired job, which
    // only `--fail-on any` fails on.
    assert_eq!(sweep(&[s(&b), s(&a)]).status.code(), Some(0));
    assert_eq!(
        sweep(&[s(&b), s(&a), "--fail-on", "any"]).status.code(),
        Some(1)
    );
    std::fs::remove_dir_all(b.join("nlp/new-model")).unwrap();
    assert_eq!(
        sweep(&[s(&b), s(&a), "--fail-on", "any"]).status.code(),
        Some(0)
    );
}

#[test]
fn malformed_summary_is_bad_input_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = trees(dir.path());
    let bad = b.join("vision/vit/final_summary.json");
    let json = std::fs::read_to_string(&bad).unwrap();
    std::fs::write(&bad, &json[..json.len() / 3]).unwrap();
    let out = sweep(&[s(&a), s(&b)]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains(s(&bad)), "{err}");
    assert!(err.contains("truncated"), "{err}");
    assert!(out.stdout.is_empty());

    let out = sweep(&[s(&a), s(&dir.path().join("nowhere"))]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8(out.stderr)
            .unwrap()
            .contains("nowhere is not a directory")
    );
}
