//! Binary recordings from outside, with no root and no eBPF: the committed fuzz seeds of the
//! binary decoder (fuzz/seeds/record_read_binary) go through it as the fuzz target feeds them;
//! `replay` refuses newer binary files with one sentence (exit 2), reads a cut one up to its last
//! whole block and says so; `export` converts between the formats without losing an item.
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::*;
use traceml_daemon::record::{self, binary};

fn seeds() -> PathBuf {
    workspace().join("fuzz/seeds/record_read_binary")
}

/// What the fuzz target reads: a file when the input starts with the magic, else the body of one
/// stored block behind a valid header.
fn as_fuzzed(data: &[u8]) -> Vec<u8> {
    if data.starts_with(&binary::MAGIC) {
        data.to_vec()
    } else {
        binary::file_of_block_body(data)
    }
}

#[test]
fn binary_fuzz_seeds_go_through_the_decoder_and_round_trip() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(seeds())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(
        files.len() >= 8,
        "seed corpus of record_read_binary is missing"
    );
    let mut ok = 0;
    for p in &files {
        let file = as_fuzzed(&std::fs::read(p).unwrap());
        let Ok(rec) = record::read_from(&file[..], p) else {
            continue;
        };
        ok += 1;
        let mut enc = binary::Encoder::new(Vec::new(), "test").unwrap();
        for item in &rec.items {
            enc.write(item).unwrap();
        }
        let again = enc.finish().unwrap();
        let back = record::read_from(&again[..], Path::new("again.trec")).unwrap();
        assert_eq!(back.items, rec.items, "{}", p.display());
    }
    assert!(ok >= 4, "valid seeds parse ({ok})");
    // The seeds that must parse, and what they hold.
    let read = |name: &str| {
        record::read_from(
            &as_fuzzed(&std::fs::read(seeds().join(name)).unwrap())[..],
            Path::new(name),
        )
    };
    let valid = read("valid_small.trec").unwrap();
    assert_eq!(valid.items.len(), 700);
    assert!(!valid.truncated_tail);
    let cut = read("cut_mid_block.trec").unwrap();
    assert!(cut.truncated_tail && cut.dropped_bytes > 0 && cut.items.is_empty());
    let hand = read("body_hand_made.bin").unwrap();
    assert_eq!((hand.items.len(), hand.skipped_frames), (5, 1));
    for bad in [
        "future_version.trec",
        "future_flags.trec",
        "bad_crc.trec",
        "cut_in_header.trec",
    ] {
        assert!(read(bad).is_err(), "{bad}");
    }
}

fn replay_of(p: &Path, out: &Path) -> Command {
    let mut c = Command::new(daemon());
    c.arg("replay")
        .arg(p)
        .arg("--output")
        .arg(out)
        .arg("--quiet");
    c
}

#[test]
fn replay_refuses_newer_and_broken_binary_files_with_one_sentence() {
    let dir = scratch("binfiles");
    let valid = std::fs::read(seeds().join("valid_small.trec")).unwrap();
    let write = |name: &str, body: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p
    };
    let mut newer = valid.clone();
    newer[8] = 9;
    fails_clearly(
        &mut replay_of(&write("newer.trec", &newer), &dir.join("o")),
        2,
        "newer traceml-daemon",
    );
    let mut flagged = valid.clone();
    flagged[10] = 4;
    fails_clearly(
        &mut replay_of(&write("flagged.trec", &flagged), &dir.join("o")),
        2,
        "newer traceml-daemon",
    );
    fails_clearly(
        &mut replay_of(&write("short.trec", &valid[..6]), &dir.join("o")),
        2,
        "ends inside its header",
    );
    let mut damaged = valid.clone();
    let last = damaged.len() - 10;
    damaged[last] ^= 0xff;
    fails_clearly(
        &mut replay_of(&write("damaged.trec", &damaged), &dir.join("o")),
        2,
        "corrupt recording",
    );
}

#[test]
fn a_cut_binary_recording_replays_and_says_what_was_dropped() {
    let dir = scratch("bincut");
    // A recording of two data blocks, the second cut in half.
    let rec = record::read(&seeds().join("valid_small.trec")).unwrap();
    let mut enc = binary::Encoder::new(Vec::new(), "0.1.0")
        .unwrap()
        .block_bytes(4_000);
    let half = rec.items.len() / 2;
    for item in &rec.items[..half] {
        enc.write(item).unwrap();
    }
    enc.flush().unwrap();
    for item in &rec.items[half..] {
        enc.write(item).unwrap();
    }
    let full = enc.finish().unwrap();
    let whole = record::read_from(&full[..], Path::new("x")).unwrap();
    assert_eq!(whole.items, rec.items);
    let cut_at = full.len() - 100;
    let p = dir.join("cut.trec");
    std::fs::write(&p, &full[..cut_at]).unwrap();
    let r = record::read(&p).unwrap();
    assert!(r.truncated_tail);
    assert!(r.dropped_bytes > 0);
    assert!(r.items.len() >= half && r.items.len() < rec.items.len());
    assert_eq!(r.items[..], rec.items[..r.items.len()]);

    let out = replay_of(&p, &dir.join("out")).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "was cut short: its incomplete last block or line ({} bytes) was dropped",
            r.dropped_bytes
        )),
        "{stderr}"
    );
    assert!(stderr.contains("no end record"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn export_converts_without_losing_an_item_and_replays_the_same() {
    let dir = scratch("export");
    let src = seeds().join("valid_small.trec");
    let export = |input: &Path, output: &Path| {
        let out = Command::new(daemon())
            .arg("export")
            .arg(input)
            .arg("-o")
            .arg(output)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let jsonl = dir.join("a.jsonl");
    let gz = dir.join("a.jsonl.gz");
    let back = dir.join("b.trec");
    export(&src, &jsonl);
    export(&jsonl, &gz);
    export(&gz, &back);
    let items = record::read(&src).unwrap().items;
    for p in [&jsonl, &gz, &back] {
        assert_eq!(record::read(p).unwrap().items, items, "{}", p.display());
    }
    assert!(std::fs::read_to_string(&jsonl).unwrap().starts_with(
        "{\"format\":\"traceml-recording\",\"version\":1,\"daemon_version\":\"0.1.0\"}\n"
    ));
    let summary = |p: &Path, name: &str| {
        let o = dir.join(name);
        let r = replay_of(p, &o).output().unwrap();
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        std::fs::read_to_string(o.join("final_summary.json")).unwrap()
    };
    assert_eq!(summary(&src, "s1"), summary(&jsonl, "s2"));
    assert_eq!(summary(&src, "s1"), summary(&back, "s3"));
    // Same file in and out is refused.
    let same = Command::new(daemon())
        .args(["export"])
        .arg(&back)
        .arg("-o")
        .arg(&back)
        .output()
        .unwrap();
    assert_eq!(same.status.code(), Some(2));
}
