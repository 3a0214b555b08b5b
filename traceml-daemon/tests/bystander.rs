//! A torch process that does not train is left alone (issue 23), with real torch on CPU
//! (tests/workloads/bystander.py: an inference-like loop of `torch.no_grad()` forwards with
//! Python pre/post-processing, no DataLoader, optimizer or backward; its truth says what it did).
//!
//! - `serve` finds it and keeps to torch's marker probes: its summary says NOT-TRAINING, the
//!   markers counted are the truth's (none), nothing costly was placed, the estimate is 0.
//! - The same process starting to train later under `serve` (a notebook calling `fit`): the
//!   markers find it, the other probes are placed within seconds of its first step, and the
//!   steps and markers counted are the truth's.
//! - `--pid` on it: every probe to learn the loop, bounded (10 s), then only the markers; the
//!   card says NOT-TRAINING ("not training: no optimizer step, backward or DataLoader iteration
//!   in N s") and the frame evaluator fires no more after the back-off.
mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use support::*;
use traceml_daemon::event::{ProbeSet, ProbeStats, StreamItem};

fn markers(v: &serde_json::Value) -> [u64; 3] {
    [
        "dataloader_iterations",
        "optimizer_steps",
        "backward_passes",
    ]
    .map(|k| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}")))
}

/// The bystander with `args` under `serve`: released once serve attached, then run to its
/// end; (its job's final summary, its truth).
fn under_serve(label: &str, args: &[&str]) -> Option<(serde_json::Value, serde_json::Value)> {
    if !root_or_skip() {
        return None;
    }
    let py = torch_python();
    let dir = scratch(label);
    let (state, log, ready, truth) = (
        dir.join("state"),
        dir.join("serve.log"),
        dir.join("ready"),
        dir.join("truth.json"),
    );
    let mut serve = Proc(
        Command::new(daemon())
            .arg("serve")
            .arg("--state-dir")
            .arg(&state)
            .args(["--scan-interval", "0.2", "--include", "*bystander.py*"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start serve"),
    );
    let mut by = Proc(
        Command::new(py)
            .arg(workspace().join("tests/workloads/bystander.py"))
            .args(args)
            .arg("--truth")
            .arg(&truth)
            .arg("--ready")
            .arg(&ready)
            .stdout(Stdio::null())
            .spawn()
            .expect("start bystander.py"),
    );
    let pid = by.0.id();
    wait_for("serve to attach", Duration::from_secs(60), || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains(&format!("attached to {pid} in"))
    });
    std::fs::write(&ready, "go\n").unwrap();
    assert!(by.0.wait().unwrap().success());
    wait_for("the job's final summary", Duration::from_secs(30), || {
        job_dir(&state, pid).is_some_and(|d| d.join("final_summary.json").exists())
    });
    let s = json(&job_dir(&state, pid).unwrap().join("final_summary.json"));
    // SAFETY: kill(2) of our own child.
    unsafe { libc::kill(serve.0.id() as i32, libc::SIGTERM) };
    assert!(serve.0.wait().unwrap().success());
    Some((s, json(&truth)))
}

#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn serve_leaves_a_process_that_does_not_train_alone() {
    let Some((s, truth)) = under_serve("bystander-serve", &["--mode", "infer", "--seconds", "6"])
    else {
        return;
    };
    assert_eq!(s["primary_diagnosis"]["kind"], "NOT_TRAINING", "{s:#}");
    let why = s["primary_diagnosis"]["why"].as_str().unwrap();
    let secs = s["run"]["duration_s"].as_f64().unwrap();
    assert!(
        why.starts_with(&format!(
            "not training: no optimizer step, backward or DataLoader iteration in {secs:.0} s"
        )),
        "{why}"
    );
    // The truth: it did none of them, and the daemon counted none.
    assert_eq!(markers(&truth["markers"]), [0, 0, 0]);
    assert_eq!(markers(&s["steps"]["markers"]), [0, 0, 0], "{}", s["steps"]);
    assert!(truth["units"].as_array().unwrap().len() > 1000, "it worked");
    // Left alone: torch's marker probes only, the whole run, and nothing they cost.
    let o = &s["daemon_overhead"];
    let sets = o["probe_sets"].as_array().unwrap();
    assert_eq!(sets.len(), 1, "{sets:#?}");
    assert_eq!(
        (&sets[0]["watching"], &sets[0]["python"]),
        (&true.into(), &false.into())
    );
    assert_eq!(o["estimated_pct_of_cpu"].as_f64(), Some(0.0), "{o:#}");
    assert_eq!(s["data_quality"]["cuda_libraries"], serde_json::json!([]));
}

#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn serve_finds_a_process_that_starts_training() {
    let args = [
        "--mode",
        "infer",
        "--seconds",
        "3",
        "--train-after",
        "3.5",
        "--train-steps",
        "40",
    ];
    let Some((s, truth)) = under_serve("bystander-fit", &args) else {
        return;
    };
    let train = &truth["train"];
    let want = train["steps"].as_u64().unwrap();
    let got = s["steps"]["count"].as_u64().unwrap();
    // The first step starts at the first marker, the last ends at its StopIteration fetch.
    assert!(
        got + 1 >= want && got <= want,
        "{got} steps, the truth {want}"
    );
    assert_eq!(
        markers(&s["steps"]["markers"]),
        markers(&truth["markers"]),
        "{}",
        s["steps"]
    );
    let sets = s["daemon_overhead"]["probe_sets"].as_array().unwrap();
    assert_eq!(sets[0]["watching"], true, "{sets:#?}");
    let found = sets
        .iter()
        .find(|p| p["python"] == true)
        .unwrap_or_else(|| panic!("never armed: {sets:#?}"));
    assert!(
        found["reason"]
            .as_str()
            .unwrap()
            .contains("training markers")
    );
    assert!(found.get("watching").is_none_or(|w| w == false));
    // Found within seconds of the first training step: the governor looks every 250 ms while
    // it watches (the bound leaves room for a busy machine; it is no performance target).
    let armed = s["run"]["attach_unix_s"].as_f64().unwrap() + found["at_s"].as_f64().unwrap();
    let latency_s = armed - train["t_start_unix_s"].as_f64().unwrap();
    eprintln!(
        "training found {:.0} ms after its first step",
        latency_s * 1e3
    );
    assert!(
        (-0.05..3.0).contains(&latency_s),
        "armed {latency_s:.2} s after the first step"
    );
    assert_ne!(s["primary_diagnosis"]["kind"], "NOT_TRAINING");
}

#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn pid_on_a_process_that_does_not_train_backs_off_and_says_not_training() {
    if !root_or_skip() {
        return;
    }
    let py = torch_python();
    let dir = scratch("bystander-pid");
    let truth = dir.join("truth.json");
    let mut cmd = Command::new(py);
    cmd.arg(workspace().join("tests/workloads/bystander.py"))
        .args(["--mode", "infer", "--seconds", "16", "--truth"])
        .arg(&truth);
    let mut target = spawn(cmd, &dir);
    let out = run_daemon(
        &mut target,
        &dir,
        &["--duration", "14"],
        Duration::from_secs(120),
    );
    assert_eq!(out.status.code(), Some(0), "stderr:\n{}", out.stderr);
    let (s, truth) = (&out.summary, json(&truth));
    assert_eq!(
        s["primary_diagnosis"]["kind"], "NOT_TRAINING",
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("NOT-TRAINING"), "{}", out.stdout);
    assert_eq!(markers(&truth["markers"]), [0, 0, 0]);
    assert_eq!(markers(&s["steps"]["markers"]), [0, 0, 0]);
    // Learned with every probe from the attach, bounded: detached after 10 s.
    let sets: Vec<&ProbeSet> = out
        .items
        .iter()
        .filter_map(|i| match i {
            StreamItem::ProbeSet(p) => Some(&**p),
            _ => None,
        })
        .collect();
    assert_eq!(sets.len(), 2, "{sets:#?}");
    assert!(sets[0].python && !sets[1].python, "{sets:#?}");
    assert!(
        sets[1].reason.contains("no loop learned"),
        "{}",
        sets[1].reason
    );
    let learned_s = (sets[1].ts - sets[0].ts) as f64 / 1e9;
    assert!(
        (9.5..12.0).contains(&learned_s),
        "learned for {learned_s:.1} s"
    );
    // After the back-off the frame evaluator fires no more: its entry counter stands still
    // from the first settled reading on.
    let stats: Vec<&ProbeStats> = out
        .items
        .iter()
        .filter_map(|i| match i {
            StreamItem::ProbeStats(st) if st.ts > sets[1].ts && !st.switching => Some(st),
            _ => None,
        })
        .collect();
    let (first, last) = (stats.first().unwrap(), stats.last().unwrap());
    assert!(last.ts > first.ts, "{stats:?}");
    assert_eq!(first.py_enter, last.py_enter, "{first:?} → {last:?}");
}
