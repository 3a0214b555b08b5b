//! Root test of issue 16: a target that names everything with hostile text cannot reach the
//! daemon's terminal, logs or files through those names, and is still diagnosed right.
//!
//! The workload (tests/workloads/hostile.py, CPython 3.11 on the fake torch) renames its code
//! objects (escape sequences, HTML/JS, a 16 MB qualname, an OSC 8 link and a bidi override in a
//! file name), its dataset and optimizer classes, its process (`prctl`, with invalid UTF-8), maps a
//! file whose name is invalid UTF-8, loads the CUDA runtime from a directory with an escape
//! sequence and markup in its name, and gets a command-line argument with an OSC sequence and
//! invalid UTF-8. The daemon runs with `--color never`: no ESC byte may appear in its stdout,
//! stderr (info logs included) or final_summary.txt; final_summary.json must be valid JSON that
//! holds the names (escaped by JSON, bounded with a cut marker); the verdict is RESIDUAL-HEAVY.
mod support;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::process::Command;
use std::time::Duration;

use support::*;
use traceml_daemon::event::StreamItem;
use traceml_daemon::sanitize::NAME_MAX;

#[test]
fn hostile_names_reach_no_output_unescaped() {
    if !root_or_skip() {
        return;
    }
    let dir = scratch("hostile");
    let libdir = dir.join("lib\x1b[2J<script>alert(1)</script>");
    std::fs::create_dir_all(&libdir).unwrap();
    let cudart = libdir.join("libcudart.so.12");
    std::fs::copy(fake_cudart(), &cudart).unwrap();

    let mut cmd = Command::new(python(11));
    cmd.arg(workspace().join("tests/workloads/hostile.py"))
        .args(["--steps", "40", "--map"])
        .arg(&dir)
        .arg(OsStr::from_bytes(b"--tag=\x1b]0;argv\x07\xff<b>"))
        .env("FAKECUDA_LIB", &cudart);
    let mut target = spawn(cmd, &dir);
    let out = run_daemon(&mut target, &dir, &[], Duration::from_secs(120));
    assert_eq!(out.status.code(), Some(0), "stderr:\n{}", out.stderr);
    assert!(
        out.target_stdout.iter().any(|l| l.contains("\"done\": 40")),
        "the target finished its loop: {:?}",
        out.target_stdout
    );

    // No ESC (nor any other control byte but newlines) from a name in what people read.
    let txt = std::fs::read(out.out_dir.join("final_summary.txt")).unwrap();
    for (what, bytes) in [
        ("stdout", out.stdout.as_bytes()),
        ("stderr", out.stderr.as_bytes()),
        ("final_summary.txt", &txt[..]),
    ] {
        let bad: Vec<u8> = bytes
            .iter()
            .copied()
            .filter(|&b| b < 0x20 && b != b'\n' || b == 0x7f)
            .collect();
        assert!(
            bad.is_empty(),
            "{what} holds control bytes {bad:x?}:\n{}",
            String::from_utf8_lossy(bytes)
        );
    }
    assert_eq!(
        String::from_utf8_lossy(&txt),
        out.stdout,
        "the card printed is the one written"
    );

    // Valid JSON, the right verdict, and the names in it (JSON-escaped, bounded).
    let json = std::fs::read(out.out_dir.join("final_summary.json")).unwrap();
    assert!(!json.iter().any(|&b| b < 0x20 && b != b'\n'));
    let s = &out.summary;
    assert_eq!(
        s["primary_diagnosis"]["kind"], "RESIDUAL_HEAVY",
        "card:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    assert_eq!(s["target"]["comm"], "\x1b[2J\u{fffd}\u{fffd}<x>");
    let cmdline: Vec<&str> = s["target"]["cmdline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        cmdline.contains(&"--tag=\x1b]0;argv\x07\u{fffd}<b>"),
        "{cmdline:?}"
    );
    let top = s["phases"]["residual"]["top_functions"].as_array().unwrap();
    let first = top.first().expect("residual stack samples");
    let function = first["function"].as_str().unwrap();
    assert!(
        function.starts_with("\x1b]0;title\x07QQQ"),
        "{:.100}",
        function
    );
    assert!(
        function.ends_with(&format!(
            "…[cut {} chars]",
            "\x1b]0;title\x07".chars().count() + (16 << 20) - NAME_MAX
        )),
        "the 16 MB qualname is cut to {NAME_MAX} bytes and marked: {:?}",
        &function[function.len() - 40..]
    );
    assert!(
        first["file"].as_str().unwrap().contains("\u{202e}"),
        "{first}"
    );
    // The card quotes the function, written visibly.
    assert!(out.stdout.contains("\\x1b]0;title\\x07QQQ") || out.stdout.contains("…QQQ"));
    assert!(
        out.stdout.contains("\\x1b]8;;") && out.stdout.contains("evil\\u{202e}yp.py"),
        "the hostile file name, escaped, in the card:\n{}",
        out.stdout
    );
    // The CUDA runtime in the hostile directory was probed; its path is in the JSON as is.
    let libs = s["data_quality"]["cuda_libraries"].as_array().unwrap();
    assert!(
        libs.iter()
            .any(|l| l.as_str().unwrap().contains("lib\x1b[2J<script>")),
        "{libs:?}"
    );
    assert!(s["cuda"]["launches_per_step"].as_f64().unwrap() > 0.0);
    // The dataset's renamed __getitem__ was resolved with its hostile names.
    assert!(
        out.items.iter().any(|i| matches!(i, StreamItem::Code(c)
            if c.qualname.contains("<script>alert(1)</script>.__getitem__")
                && c.filename.contains("<img src=x onerror=alert(1)>"))),
        "the hostile __getitem__ was resolved"
    );
}
