//! Files from outside, with no root and no eBPF: `replay` and `compare` refuse bad recordings
//! and summaries with one clear sentence (exit 2), and the committed fuzz seeds go through both
//! parsers. Built with or without the `live` feature (the binary keeps `replay` and `compare`).
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::*;
use traceml_daemon::event::EndReason;
use traceml_daemon::render::to_json;
use traceml_daemon::summary::Summary;

/// `replay` and `compare` refuse malformed, empty, foreign and future-version files with one
/// sentence and exit 2. A recording cut mid-line (what SIGKILL leaves) is accepted by design.
#[test]
fn bad_replay_and_compare_files_get_one_clear_sentence() {
    let dir = scratch("badfiles");
    let write = |name: &str, body: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p
    };
    let replay_of = |p: &Path| {
        let mut c = Command::new(daemon());
        c.arg("replay")
            .arg(p)
            .arg("--output")
            .arg(dir.join("out"))
            .arg("--quiet");
        c
    };
    fails_clearly(&mut replay_of(&write("empty.jsonl", b"")), 2, "is empty");
    fails_clearly(
        &mut replay_of(&write("foreign.jsonl", b"hello world\n")),
        2,
        "not a traceml recording",
    );
    fails_clearly(
        &mut replay_of(&write("binary.jsonl", &[0xff, 0xfe, 0, 1, 2, b'\n', 9])),
        2,
        "not a traceml recording",
    );
    let future = "{\"format\":\"traceml-recording\",\"version\":99,\"daemon_version\":\"9.0\"}\n";
    fails_clearly(
        &mut replay_of(&write("future.jsonl", future.as_bytes())),
        2,
        "newer traceml-daemon",
    );
    let mid = format!(
        "{HEADER}{{\"t\":\"end\",\"ts\":1}}\n{{\"t\":\"end\",\"ts\":2,\"reason\":\"interrupted\"}}\n"
    );
    fails_clearly(
        &mut replay_of(&write("malformed.jsonl", mid.as_bytes())),
        2,
        "line 2: malformed item",
    );
    fails_clearly(
        &mut replay_of(&dir.join("missing.jsonl")),
        2,
        "cannot open recording",
    );
    fails_clearly(&mut replay_of(&dir), 2, "cannot open recording");

    // Cut mid-line: readable, said, summarised as truncated.
    let cut = format!(
        "{HEADER}{{\"t\":\"event\",\"ts\":5,\"tgid\":1,\"tid\":1,\"k\":\"record_exit\"}}\n{{\"t\":\"ev"
    );
    let (code, stderr, summary) = replay(&write("cut.jsonl", cut.as_bytes()), &dir.join("cut-out"));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("no end record"), "{stderr}");
    let good = summary.unwrap();
    assert_eq!(
        Summary::from_json(&good).unwrap().data_quality.end_reason,
        EndReason::Truncated
    );

    let good_path = write("good.json", good.as_bytes());
    let compare = |a: &Path, b: &Path| {
        let mut c = Command::new(daemon());
        c.arg("compare").arg(a).arg(b);
        c
    };
    for (name, body, want) in [
        ("empty.json", String::new(), "summary is empty"),
        (
            "truncated.json",
            good[..good.len() / 2].to_owned(),
            "summary is truncated",
        ),
        (
            "malformed.json",
            "{\"schema_version\": 1,, }".to_owned(),
            "not valid JSON",
        ),
        (
            "foreign.json",
            "{\"hello\": 1}".to_owned(),
            "not a traceml-daemon summary",
        ),
        (
            "newer.json",
            good.replacen("\"schema_version\": 3", "\"schema_version\": 7", 1),
            "newer traceml-daemon",
        ),
        (
            "invalid.json",
            good.replacen("\"data_quality\"", "\"data_qualityx\"", 1),
            "does not match schema_version",
        ),
        (
            "binary.json",
            "\u{0}\u{1}garbage".to_owned(),
            "not valid JSON",
        ),
    ] {
        let p = write(name, body.as_bytes());
        fails_clearly(&mut compare(&p, &good_path), 2, want);
        fails_clearly(&mut compare(&good_path, &p), 2, want);
    }
    fails_clearly(
        &mut compare(&dir.join("missing.json"), &good_path),
        2,
        "cannot read",
    );
}

/// The committed fuzz seeds (fuzz/seeds/) through both parsers, without nightly or root: no
/// panics, and the seeds that are valid files parse.
#[test]
fn fuzz_seed_corpus_goes_through_both_parsers() {
    let seeds = workspace().join("fuzz/seeds");
    let files = |target: &str| -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(seeds.join(target))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_file())
            .collect();
        v.sort();
        assert!(v.len() >= 5, "seed corpus of {target} is missing");
        v
    };
    let mut ok = 0;
    for p in files("record_read_from") {
        let data = std::fs::read(&p).unwrap();
        if traceml_daemon::record::read_from(&data[..], &p).is_ok() {
            ok += 1;
        }
    }
    assert!(ok >= 2, "valid recordings among the seeds parse");
    let mut ok = 0;
    for p in files("summary_from_json") {
        let data = std::fs::read(&p).unwrap();
        let Ok(text) = std::str::from_utf8(&data) else {
            continue;
        };
        if let Ok(s) = Summary::from_json(text) {
            assert_eq!(
                to_json(&Summary::from_json(&to_json(&s)).unwrap()),
                to_json(&s),
                "{}",
                p.display()
            );
            ok += 1;
        }
    }
    assert!(ok >= 1, "valid summaries among the seeds parse");
}
