//! The GPU's own side on the stand-ins (issue 53): the stand-in NVML
//! (`tests/build/fakecuda/libnvidia-ml.so.1`, on the daemon's library path) answers from the
//! simulated devices of the stand-in driver, and each workload knows what its device did (the
//! simulated kernel time it finished per step, the device memory it holds: truth
//! `device_busy_ns`, `device_reserved_bytes`). Checked against that truth: NVML's utilization
//! within 5 points of the device's busy share over the loop, the process's and the device's
//! memory exact, on the physical device `CUDA_VISIBLE_DEVICES` picked; an NVML whose every call
//! takes 200 ms delays no event (steps exact, phases within the scenario suite's tolerances,
//! nothing lost) and is said in data quality; a GPU lost mid-run and an init that fails give a
//! data-quality line and a summary; LOW-GPU-UTILIZATION-UNEXPLAINED and MEMORY_CREEP where the
//! truth, read by the published lines, says so and not elsewhere; each rank of a two-rank job
//! on its own device gets its own GPU in the job's summary and on `/metrics`.
mod support;

use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::*;
use traceml_daemon::stats::median_u64;

/// The published lines (docs/summary-schema.md): LOW-GPU-UTILIZATION-UNEXPLAINED under 50 %
/// busy with input, copies and residual each under 10 % of the step; MEMORY_CREEP from a
/// 64 MiB rise.
const LOW_GPU_UTIL_PCT: f64 = 50.0;
const PHASE_WARNING_SHARE: f64 = 0.10;
const CREEP_MIN_BYTES: u64 = 64 << 20;

/// NVML's utilization against the device's busy share of the loop, in points.
const UTIL_TOLERANCE_PCT: f64 = 5.0;

/// The environment of the stand-in GPUs for a workload and the daemon: `devices` simulated
/// GPUs whose records go to `dir/nvml`, the stand-in NVML first on the library path, and the
/// `extra` switches.
fn gpu_env(dir: &Path, devices: u32, extra: &[(&str, &str)]) -> Vec<(String, OsString)> {
    let mut env = vec![
        (
            "FAKECUDA_NVML_DIR".to_owned(),
            dir.join("nvml").into_os_string(),
        ),
        ("FAKECUDA_DEVICES".to_owned(), devices.to_string().into()),
        (
            "LD_LIBRARY_PATH".to_owned(),
            tests_build().join("fakecuda").into_os_string(),
        ),
    ];
    env.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), OsString::from(v))),
    );
    env
}

/// One ground-truth scenario under the daemon with the stand-in GPUs (2, unless `env` sets
/// `FAKECUDA_DEVICES`: the later value wins): the outcome and the truth.
fn run(
    label: &str,
    script: &str,
    steps: u32,
    env: &[(&str, &str)],
    workload_env: &[(&str, &str)],
) -> Option<(Outcome, serde_json::Value)> {
    if !root_or_skip() {
        return None;
    }
    let dir = scratch(label);
    let truth = dir.join("truth.json");
    let vars = gpu_env(&dir, 2, env);
    let mut cmd = faketorch_workload(script);
    cmd.arg("--truth")
        .arg(&truth)
        .arg("--steps")
        .arg(steps.to_string());
    for (k, v) in &vars {
        cmd.env(k, v);
    }
    for (k, v) in workload_env {
        cmd.env(k, v);
    }
    let mut target = spawn(cmd, &dir);
    let out = run_daemon_env(&mut target, &dir, &[], &vars, Duration::from_secs(180));
    assert!(
        out.status.success(),
        "{label}: daemon {}\n{}",
        out.status,
        out.stderr
    );
    Some((out, json(&truth)))
}

/// The device's busy share (percent) over the loop's steps, and the largest device memory the
/// process held at a step's end.
fn device_truth(truth: &serde_json::Value) -> (f64, u64) {
    let steps = truth["steps"].as_array().unwrap();
    let sum = |k: &str| steps.iter().map(|s| s[k].as_f64().unwrap()).sum::<f64>();
    let reserved = steps
        .iter()
        .map(|s| s["device_reserved_bytes"].as_u64().unwrap())
        .max()
        .unwrap();
    (sum("device_busy_ns") / sum("wall_ns") * 100.0, reserved)
}

fn findings(s: &serde_json::Value) -> Vec<String> {
    s["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["kind"].as_str().unwrap_or("?").to_owned())
        .collect()
}

/// The GPU figures of device `index` in the summary.
fn device(s: &serde_json::Value, index: u64) -> &serde_json::Value {
    s["gpu"]["devices"]
        .as_array()
        .unwrap_or_else(|| panic!("no GPU devices: {:#}", s["gpu"]))
        .iter()
        .find(|d| d["index"].as_u64() == Some(index))
        .unwrap_or_else(|| panic!("no device {index}: {:#}", s["gpu"]))
}

/// The truth's phase shares of the loop (each phase's total over the steps' wall time).
fn truth_share(truth: &serde_json::Value, phase: &str) -> f64 {
    let t = &truth["totals"];
    t[format!("{phase}_ns")].as_f64().unwrap() / t["wall_ns"].as_f64().unwrap()
}

/// What the published lines say of LOW-GPU-UTILIZATION-UNEXPLAINED on this truth: `Some(true)`
/// clearly under them, `Some(false)` clearly over, `None` within the margins.
fn low_util_expected(truth: &serde_json::Value) -> Option<bool> {
    let (busy, _) = device_truth(truth);
    let phases = ["input_wait", "h2d", "residual", "gpu_wait"];
    let top = phases
        .iter()
        .map(|p| truth_share(truth, p))
        .fold(0.0, f64::max);
    if busy < LOW_GPU_UTIL_PCT - UTIL_TOLERANCE_PCT && top < PHASE_WARNING_SHARE - 0.03 {
        Some(true)
    } else if busy >= LOW_GPU_UTIL_PCT + UTIL_TOLERANCE_PCT || top >= PHASE_WARNING_SHARE + 0.03 {
        Some(false)
    } else {
        None
    }
}

/// A compute-bound loop on physical GPU 1 of 2 (`CUDA_VISIBLE_DEVICES=1`): NVML's utilization
/// of that GPU within 5 points of the device's busy share, the process's and the device's
/// memory exact, GPU 0 idle and empty, no LOW-GPU or creep finding (the truth has neither).
#[test]
fn nvml_figures_are_the_simulated_devices() {
    let Some((out, truth)) = run(
        "gpu-figures",
        "compute_bound.py",
        60,
        &[],
        &[("CUDA_VISIBLE_DEVICES", "1")],
    ) else {
        return;
    };
    let s = &out.summary;
    let (busy, reserved) = device_truth(&truth);
    let d1 = device(s, 1);
    let util = d1["util_pct_mean"].as_f64().unwrap();
    eprintln!(
        "GPU 1: NVML {util:.1} %, truth {busy:.1} %; memory {} B, truth {reserved} B",
        d1["process_mem_bytes_max"]
    );
    assert!(
        (util - busy).abs() <= UTIL_TOLERANCE_PCT,
        "utilization {util:.1} % vs the device's {busy:.1} %"
    );
    assert_eq!(d1["process_mem_bytes_max"].as_u64(), Some(reserved));
    assert_eq!(d1["mem_used_bytes_max"].as_u64(), Some(reserved));
    assert_eq!(d1["used_by_target"], true);
    let d0 = device(s, 0);
    assert_eq!(d0["util_pct_mean"].as_f64(), Some(0.0), "{d0:#}");
    assert_eq!(d0["mem_used_bytes_max"].as_u64(), Some(0), "{d0:#}");
    assert_eq!(d0["used_by_target"], false);
    assert!((s["gpu"]["util_pct_mean"].as_f64().unwrap() - util).abs() < 1e-6);
    let f = findings(s);
    assert_eq!(low_util_expected(&truth), Some(false));
    assert!(
        !f.iter()
            .any(|k| k == "LOW_GPU_UTILIZATION_UNEXPLAINED" || k == "MEMORY_CREEP"),
        "{f:?}"
    );
}

/// Every NVML call takes 200 ms: the daemon reads NVML on its own thread, so the steps are the
/// truth's (count exact, each phase's median within max(1 ms, 10 %), the scenario suite's
/// tolerance), no event is lost, the GPU figures still come, and data quality says it.
#[test]
fn a_slow_nvml_delays_no_event() {
    // One GPU and 120 steps (~10 s): a reading of 12 calls takes ~2.4 s, and several must land
    // inside the loop.
    let Some((out, truth)) = run(
        "gpu-slow",
        "compute_bound.py",
        120,
        &[("FAKENVML_SLOW_MS", "200"), ("FAKECUDA_DEVICES", "1")],
        &[],
    ) else {
        return;
    };
    let s = &out.summary;
    assert_eq!(
        s["steps"]["count"].as_u64(),
        truth["step_count"].as_u64(),
        "{:#}",
        s["steps"]
    );
    for (phase, want) in truth["median_phases_ns"].as_object().unwrap() {
        let want = want.as_f64().unwrap() / 1e6;
        let got = s["phases"][phase]["median_ms"].as_f64().unwrap_or(0.0);
        let tol = (want * 0.10).max(1.0);
        assert!(
            (got - want).abs() <= tol,
            "{phase}: {got:.2} ms, truth {want:.2} ms (± {tol:.2})"
        );
    }
    let lost = &s["data_quality"]["events_lost"];
    assert_eq!(lost["total"].as_u64(), Some(0), "{lost:#}");
    // A wrapper call can be two NVML calls (the size query of a list, then the list).
    let notes = s["data_quality"]["notes"].to_string();
    let slowest: Option<u64> = notes
        .split("NVML calls took up to ")
        .nth(1)
        .and_then(|t| t.split(' ').next()?.parse().ok());
    assert!(slowest.is_some_and(|ms| ms >= 200), "{notes}");
    // The figures still come (a reading takes seconds: each is late by its own length).
    let (_, reserved) = device_truth(&truth);
    assert_eq!(
        device(s, 0)["process_mem_bytes_max"].as_u64(),
        Some(reserved)
    );
}

/// A GPU lost 1.5 s into the run, and an NVML whose init fails (driver/library mismatch): each
/// run ends with its summary (steps exact) and a data-quality line saying what happened.
#[test]
fn a_lost_gpu_and_a_failed_init_are_said() {
    for (label, switch, said) in [
        (
            "gpu-lost",
            ("FAKENVML_LOST_AFTER_MS", "1500"),
            "GPU: GPU 0 lost (NVML_ERROR_GPU_IS_LOST)",
        ),
        (
            "gpu-init",
            ("FAKENVML_INIT", "mismatch"),
            "GPU: NVML unavailable",
        ),
    ] {
        let Some((out, truth)) = run(label, "compute_bound.py", 40, &[switch], &[]) else {
            return;
        };
        let s = &out.summary;
        assert_eq!(
            s["steps"]["count"].as_u64(),
            truth["step_count"].as_u64(),
            "{label}"
        );
        let notes: Vec<&str> = s["data_quality"]["notes"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|n| n.as_str())
            .collect();
        assert!(
            notes.iter().any(|n| n.starts_with(said)),
            "{label}: {notes:?}"
        );
        if label == "gpu-init" {
            assert!(s["gpu"].is_null(), "{:#}", s["gpu"]);
        }
    }
}

/// The verdicts that need the GPU's view, against the truth read by the published lines: a loop
/// whose host side is the limit (the device 2 % busy, no input, copy or residual phase large):
/// LOW-GPU-UTILIZATION-UNEXPLAINED; a loop keeping 4 MiB of device memory each step:
/// MEMORY_CREEP naming the GPU memory, its rise within two steps' growth of the truth's.
#[test]
fn gpu_verdicts_follow_the_devices_truth() {
    let Some((out, truth)) = run("gpu-low", "gpu_low_util.py", 160, &[], &[]) else {
        return;
    };
    let (busy, _) = device_truth(&truth);
    let f = findings(&out.summary);
    let low = f.iter().any(|k| k == "LOW_GPU_UTILIZATION_UNEXPLAINED");
    eprintln!("gpu_low_util: device {busy:.1} % busy; findings {f:?}");
    match low_util_expected(&truth) {
        Some(want) => assert_eq!(low, want, "device {busy:.1} % busy: {f:?}"),
        // A busy host moved an input, copy or residual share near its line: either verdict.
        None => eprintln!("NOTE: gpu_low_util's truth is near the lines: {f:?} accepted"),
    }
    assert!(!f.iter().any(|k| k == "MEMORY_CREEP"), "{f:?}");

    let Some((out, truth)) = run("gpu-creep", "gpu_memory_creep.py", 60, &[], &[]) else {
        return;
    };
    let steps = truth["steps"].as_array().unwrap();
    let reserved: Vec<u64> = steps
        .iter()
        .map(|s| s["device_reserved_bytes"].as_u64().unwrap())
        .collect();
    let grow = truth["config"]["grow_bytes"].as_u64().unwrap();
    let rise = reserved[reserved.len() - 1] - reserved[0];
    assert!(rise >= 2 * CREEP_MIN_BYTES, "truth rise {rise}");
    let s = &out.summary;
    let f: Vec<&serde_json::Value> = s["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "MEMORY_CREEP")
        .collect();
    assert_eq!(f.len(), 1, "{:#}", s["findings"]);
    let why = f[0]["why"].as_str().unwrap();
    assert!(why.contains("GPU memory of the process"), "{why}");
    let thirds: Vec<u64> = s["memory"]["gpu_process_mem_bytes_by_third"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let n = reserved.len();
    let truth_thirds = [
        median_u64(&reserved[..n / 3]).unwrap(),
        median_u64(&reserved[n / 3..2 * n / 3]).unwrap(),
        median_u64(&reserved[2 * n / 3..]).unwrap(),
    ];
    // The samples' thirds are NVML's readings, each up to a second behind the step it is
    // paired with (a reading every 500 ms, taken by a sample up to 500 ms later): within one
    // second's growth of the truth's.
    let step_ms = median(
        steps
            .iter()
            .map(|s| s["wall_ns"].as_f64().unwrap() / 1e6)
            .collect(),
    );
    let tol = grow * (1000.0 / step_ms).ceil() as u64;
    let (got, want) = (thirds[2] - thirds[0], truth_thirds[2] - truth_thirds[0]);
    eprintln!("creep: thirds {thirds:?}, truth {truth_thirds:?} (± {tol})");
    assert!(
        got.abs_diff(want) <= tol,
        "rise {got} vs the truth's {want} (± {tol})"
    );
}

/// Two ranks under torchrun, each on the GPU of its `LOCAL_RANK` (the stand-in torch's
/// `set_device`): the job's summary gives each rank its own device and memory, and `/metrics`
/// each rank's device memory while the job runs.
#[test]
#[ignore = "torchrun from real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn each_rank_of_a_job_gets_its_own_gpu() {
    if !root_or_skip() {
        return;
    }
    let dir = scratch("gpu-ranks");
    let vars = gpu_env(&dir, 2, &[]);
    let mut torchrun = Command::new(torchrun());
    torchrun
        .arg("--nproc_per_node=2")
        .arg(format!("--master_port={}", free_port()))
        .arg(workspace().join("tests/workloads/compute_bound.py"))
        .arg("--ready")
        .arg(dir.join("ready"))
        .arg("--truth")
        .arg(dir.join("truth-{rank}.json"))
        .args(["--steps", "80"])
        .env("TRACEML_TESTS_BUILD", tests_build())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for (k, v) in &vars {
        // The library path is the daemon's: the ranks' real torch launcher needs its own.
        if k != "LD_LIBRARY_PATH" {
            torchrun.env(k, v);
        }
    }
    let mut launcher = Proc(torchrun.spawn().expect("torchrun"));
    // The ranks: the launcher's two children (they wait for the ready file the daemon makes
    // once it has attached to both).
    let children = format!("/proc/{0}/task/{0}/children", launcher.0.id());
    wait_for("two ranks", Duration::from_secs(120), || {
        std::fs::read_to_string(&children).is_ok_and(|c| c.split_whitespace().count() >= 2)
    });
    let addr = free_addr();
    let mut daemon = Command::new(daemon());
    daemon
        .arg("--pid")
        .arg(launcher.0.id().to_string())
        .arg("--ready-file")
        .arg(dir.join("ready"))
        .arg("--output")
        .arg(dir.join("out"))
        .args(["--color", "never", "--quiet"])
        .args(["--metrics-addr", &addr.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in &vars {
        daemon.env(k, v);
    }
    let daemon = daemon.spawn().unwrap();
    // /metrics while the job runs: each rank's device memory.
    let mut seen: Vec<Option<f64>> = vec![None, None];
    let mut last = String::new();
    let t = std::time::Instant::now();
    while t.elapsed() < Duration::from_secs(120) && seen.iter().any(Option::is_none) {
        if let Some((200, body)) = get(addr, "/metrics") {
            last = body
                .lines()
                .filter(|l| l.starts_with("traceml_gpu") || l.starts_with("traceml_steps_total"))
                .collect::<Vec<_>>()
                .join("\n");
            for (r, slot) in seen.iter_mut().enumerate() {
                // `rank="<r>"` followed by another label or the end of the labels.
                let want = [format!("rank=\"{r}\","), format!("rank=\"{r}\"}}")];
                if let Some(line) = body.lines().find(|l| {
                    l.starts_with("traceml_gpu_memory_used_bytes{")
                        && want.iter().any(|w| l.contains(w.as_str()))
                }) {
                    *slot = line.rsplit(' ').next().and_then(|v| v.parse().ok());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let o = wait_with_timeout(daemon, Duration::from_secs(300));
    assert!(
        o.status.success(),
        "daemon: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let _ = launcher.0.wait();
    let s = json(&dir.join("out/final_summary.json"));
    let ranks = s["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2, "{:#}", s["job"]);
    for (r, rank) in ranks.iter().enumerate() {
        let truth = json(&dir.join(format!("truth-{r}.json")));
        let (busy, reserved) = device_truth(&truth);
        let g = &rank["gpu"];
        eprintln!("rank {r}: {g}, truth busy {busy:.1} % memory {reserved} B");
        assert_eq!(g["devices"], serde_json::json!([r]), "rank {r}: {g:#}");
        assert_eq!(g["process_mem_bytes_max"].as_u64(), Some(reserved));
        let util = g["util_pct_mean"].as_f64().unwrap();
        assert!(
            (util - busy).abs() <= UTIL_TOLERANCE_PCT,
            "rank {r}: utilization {util:.1} % vs its device's {busy:.1} %"
        );
        assert_eq!(
            seen[r],
            Some(reserved as f64),
            "rank {r} on /metrics; last seen:\n{last}"
        );
    }
}
