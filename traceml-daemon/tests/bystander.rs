//! A torch process that does not train is left alone (issue 23), with real torch on CPU
//! (tests/workloads/bystander.py: an inference-like loop of `torch.no_grad()` forwards with
//! Python pre/post-processing, no DataLoader, optimizer or backward; its truth says what it did).
//!
//! - `--pid` on it: the card says NOT-TRAINING ("not training: no optimizer step, backward or
//!   DataLoader iteration in N s"), the markers counted are the truth's (none), the frame
//!   evaluator never fired, and only torch's marker probes were placed (no CUDA library).
//! - The same process starting to train later (a notebook calling `fit`): the markers find it,
//!   the other probes are placed and the loop is learned within seconds of its first step, and
//!   the steps and markers counted are the truth's.
mod support;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use support::*;

fn torch_python() -> Option<PathBuf> {
    if std::env::var_os("TRACEML_SKIP_TORCH").is_some() {
        eprintln!("TRACEML_SKIP_TORCH is set: bystander tests skipped on request");
        return None;
    }
    Some(PathBuf::from(std::env::var_os("TRACEML_TORCH_PYTHON").expect(
        "TRACEML_TORCH_PYTHON is not set: run through `cargo xtask test` (setup builds the torch venv)",
    )))
}

fn json(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(
        &std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap()
}

/// The bystander with `args`, the daemon attached with `extra`: (outcome, truth).
fn run(label: &str, args: &[&str], extra: &[&str]) -> Option<(Outcome, serde_json::Value)> {
    if !root_or_skip() {
        return None;
    }
    let py = torch_python()?;
    let dir = scratch(label);
    let truth = dir.join("truth.json");
    let mut cmd = Command::new(py);
    cmd.arg(workspace().join("tests/workloads/bystander.py"))
        .args(args)
        .arg("--truth")
        .arg(&truth);
    let mut target = spawn(cmd, &dir);
    let out = run_daemon(&mut target, &dir, extra, Duration::from_secs(120));
    assert_eq!(out.status.code(), Some(0), "stderr:\n{}", out.stderr);
    let t = json(&truth);
    Some((out, t))
}

fn probe_stats(
    items: &[traceml_daemon::event::StreamItem],
) -> Vec<traceml_daemon::event::ProbeStats> {
    items
        .iter()
        .filter_map(|i| match i {
            traceml_daemon::event::StreamItem::ProbeStats(s) => Some(*s),
            _ => None,
        })
        .collect()
}

fn markers(v: &serde_json::Value) -> [u64; 3] {
    [
        "dataloader_iterations",
        "optimizer_steps",
        "backward_passes",
    ]
    .map(|k| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}")))
}

#[test]
fn a_process_that_does_not_train_is_not_training_and_is_left_alone() {
    let Some((out, truth)) = run(
        "bystander-infer",
        &["--mode", "infer", "--seconds", "6"],
        &["--duration", "4"],
    ) else {
        return;
    };
    let s = &out.summary;
    assert_eq!(
        s["primary_diagnosis"]["kind"], "NOT_TRAINING",
        "{}",
        out.stdout
    );
    let why = s["primary_diagnosis"]["why"].as_str().unwrap();
    let secs = s["run"]["duration_s"].as_f64().unwrap();
    assert!(
        why.starts_with(&format!(
            "not training: no optimizer step, backward or DataLoader iteration in {secs:.0} s"
        )),
        "{why}"
    );
    assert!(out.stdout.contains("NOT-TRAINING"), "{}", out.stdout);
    // The truth: it did none of them, and the daemon counted none.
    assert_eq!(markers(&truth["markers"]), [0, 0, 0]);
    assert_eq!(markers(&s["steps"]["markers"]), [0, 0, 0], "{}", s["steps"]);
    assert!(
        truth["units"].as_array().unwrap().len() > 1000,
        "the bystander worked"
    );
    // Left alone: the frame evaluator never fired, no launch was probed, only torch's marker
    // probes were placed, and the probe set never changed.
    let stats = probe_stats(&out.items);
    let last = stats.last().expect("probe counters in the recording");
    assert_eq!(
        (last.py_enter, last.exit, last.launch),
        (0, 0, 0),
        "{last:?}"
    );
    let sets = s["daemon_overhead"]["probe_sets"].as_array().unwrap();
    assert_eq!(sets.len(), 1, "{sets:#?}");
    assert_eq!(sets[0]["watching"], true);
    assert_eq!(sets[0]["python"], false);
    let roles: Vec<String> = out
        .items
        .iter()
        .filter_map(|i| match i {
            traceml_daemon::event::StreamItem::Library(l) => Some(l.role.clone()),
            _ => None,
        })
        .collect();
    assert!(
        roles.iter().all(|r| r == "python" || r == "torch"),
        "{roles:?}"
    );
    assert!(roles.iter().any(|r| r == "torch"), "{roles:?}");
    assert!(
        out.stdout.contains("watching for training"),
        "the card says what ran:\n{}",
        out.stdout
    );
}

#[test]
fn a_process_that_starts_training_is_found_by_its_markers() {
    let Some((out, truth)) = run(
        "bystander-fit",
        &[
            "--mode",
            "infer",
            "--seconds",
            "3",
            "--train-after",
            "3.5",
            "--train-steps",
            "40",
        ],
        &[],
    ) else {
        return;
    };
    let s = &out.summary;
    let train = &truth["train"];
    let want = train["steps"].as_u64().unwrap();
    let got = s["steps"]["count"].as_u64().unwrap();
    // The first step starts at the first marker, the last ends at its StopIteration fetch.
    assert!(
        got + 1 >= want && got <= want,
        "{got} steps, the truth {want}\n{}",
        out.stdout
    );
    assert_eq!(
        markers(&s["steps"]["markers"]),
        markers(&truth["markers"]),
        "{}",
        s["steps"]
    );
    // Before training nothing but the markers ran: no frame-evaluator hit until the switch.
    let sets: Vec<&traceml_daemon::event::ProbeSet> = out
        .items
        .iter()
        .filter_map(|i| match i {
            traceml_daemon::event::StreamItem::ProbeSet(p) => Some(&**p),
            _ => None,
        })
        .collect();
    assert!(sets[0].watching && !sets[0].python, "{sets:#?}");
    let found = sets
        .iter()
        .find(|p| p.python)
        .unwrap_or_else(|| panic!("never armed: {sets:#?}"));
    assert!(
        found.reason.contains("training markers"),
        "{}",
        found.reason
    );
    assert!(!found.watching);
    let before = probe_stats(&out.items)
        .into_iter()
        .rfind(|st| st.ts < found.ts)
        .expect("counters before the switch");
    assert_eq!(before.py_enter, 0, "{before:?}");
    // Found within seconds of the first training step: the governor looks every 250 ms while
    // it watches (the bound here leaves room for a busy machine; it is no performance target).
    let t_train = train["t_start_ns"].as_u64().unwrap();
    let latency_s = found.ts.saturating_sub(t_train) as f64 / 1e9;
    assert!(
        found.ts >= t_train && latency_s < 3.0,
        "armed {latency_s:.2} s after the first step"
    );
    eprintln!(
        "training found {:.0} ms after its first step",
        latency_s * 1e3
    );
    assert_ne!(s["primary_diagnosis"]["kind"], "NOT_TRAINING");
}
