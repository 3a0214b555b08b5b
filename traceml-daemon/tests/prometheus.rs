//! `/metrics` scraped by a real Prometheus (Debian's `prometheus`, every second): `traceml-daemon
//! serve` with `metrics_addr` in its config file measures a ground-truth workload it finds by itself, and through
//! Prometheus's HTTP query API `traceml_steps_total` equals the daemon's own final step count and
//! the truth's steps after the attach point, `traceml_phase_seconds_total{phase="input_wait"}`
//! matches the truth's input wait over those same steps (within max(5 %, 2 ms per step)), the
//! series were live while the job ran and stay after it ended, and every query of the Grafana
//! dashboard (packaging/grafana/traceml.json) is valid PromQL that Prometheus answers.
mod support;

use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

/// A step count no other test uses (serve includes only this workload's command line).
const STEPS: u32 = 251;

/// The single value of `q`, if it has exactly one series.
fn one(prom: SocketAddr, q: &str) -> Option<f64> {
    match prom_query(prom, q).ok()?.as_slice() {
        [(_, x)] => Some(*x),
        _ => None,
    }
}

#[test]
fn prometheus_scrapes_steps_and_phases_consistent_with_the_truth() {
    if !root_or_skip() {
        return;
    }
    if !tool_or_skip(PROMETHEUS, "prometheus") {
        return;
    }
    let dir = scratch("prometheus");
    let state = dir.join("state");
    let metrics = free_addr();

    let ready = dir.join("ready");
    // As docs/fleet.md's recipe: the address in the config file.
    let config = dir.join("config.toml");
    std::fs::write(&config, format!("metrics_addr = \"{metrics}\"\n")).unwrap();
    let mut serve = serve_until_ready(
        Command::new(daemon()),
        &state,
        &ready,
        &[
            "--scan-interval",
            "0.2",
            "--config",
            config.to_str().unwrap(),
            "--include",
            &format!("*input_bound_single.py --steps {STEPS} *"),
        ],
        None,
    );
    let (status, body) = get(metrics, "/metrics").expect("/metrics answers");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("traceml_attached_jobs 0\n"), "{body}");

    let (_prometheus, prom) = start_prometheus(&dir, &[metrics], None);
    wait_for("Prometheus ready", Duration::from_secs(60), || {
        get(prom, "/-/ready").is_some_and(|(s, _)| s == 200)
    });
    wait_for("the first scrape", Duration::from_secs(30), || {
        one(prom, r#"up{job="traceml"}"#) == Some(1.0)
    });

    // The workload starts at once: serve finds it within its scan interval and attaches.
    let truth_file = dir.join("truth.json");
    let mut job = Proc(
        faketorch_workload("input_bound_single.py")
            .args(["--steps", &STEPS.to_string(), "--truth"])
            .arg(&truth_file)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the workload"),
    );
    let pid = job.0.id();
    let sel = format!(r#"job=~".*-{pid}-.*""#);
    // Live: Prometheus holds steps of the job while it still runs.
    let mut live = None;
    let started = Instant::now();
    while job.0.try_wait().unwrap().is_none() {
        if live.is_none()
            && let Some(x) = one(prom, &format!("traceml_steps_total{{{sel}}}"))
            && x > 0.0
        {
            live = Some((x, started.elapsed()));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(job.0.wait().unwrap().success(), "the workload failed");
    let ran = started.elapsed();
    let (live_steps, at) = live.expect("no steps in Prometheus while the job ran");
    eprintln!("live: {live_steps} steps in Prometheus {at:?} into a {ran:?} job");

    wait_for("the final summary", Duration::from_secs(10), || {
        job_dir(&state, pid).is_some_and(|d| d.join("final_summary.json").exists())
    });
    let jd = job_dir(&state, pid).unwrap();
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(jd.join("final_summary.json")).unwrap())
            .unwrap();
    let n = summary["steps"]["count"].as_u64().unwrap();
    // The series stay after the job ended, with its final values.
    wait_for(
        "Prometheus to hold the final step count",
        Duration::from_secs(15),
        || one(prom, &format!("traceml_steps_total{{{sel}}}")) == Some(n as f64),
    );
    let job_label = jd.file_name().unwrap().to_string_lossy().into_owned();
    let l = format!(r#"job="{job_label}",rank="0""#);
    assert_eq!(
        one(prom, &format!("traceml_step_duration_seconds_count{{{l}}}")),
        Some(n as f64)
    );

    // Against the truth: the daemon measured the truth's last `n` steps (everything after the
    // attach fragment).
    let truth: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&truth_file).unwrap()).unwrap();
    let steps = truth["steps"].as_array().unwrap();
    assert_eq!(steps.len(), STEPS as usize);
    assert!(
        n <= STEPS as u64 && n >= STEPS as u64 / 2,
        "{n} steps measured of {STEPS}"
    );
    let tail = &steps[steps.len() - n as usize..];
    let sum = |k: &str| -> f64 {
        tail.iter()
            .map(|s| s["phases_ns"][k].as_f64().unwrap())
            .sum::<f64>()
            / 1e9
    };
    let truth_input = sum("input_wait");
    let truth_wall: f64 = tail
        .iter()
        .map(|s| s["wall_ns"].as_f64().unwrap())
        .sum::<f64>()
        / 1e9;
    let input = one(
        prom,
        &format!(r#"traceml_phase_seconds_total{{{l},phase="input_wait"}}"#),
    )
    .expect("input_wait seconds");
    let wall = one(prom, &format!("traceml_step_duration_seconds_sum{{{l}}}")).unwrap();
    let tol = |truth: f64| (0.05 * truth).max(0.002 * n as f64);
    eprintln!(
        "steps {n} of {STEPS}; input_wait {input:.4} s (truth {truth_input:.4} s, tolerance \
         {:.4}); step time {wall:.4} s (truth {truth_wall:.4} s)",
        tol(truth_input)
    );
    assert!(
        (input - truth_input).abs() <= tol(truth_input),
        "input_wait {input} s vs truth {truth_input} s over {n} steps"
    );
    assert!(
        (wall - truth_wall).abs() <= tol(truth_wall),
        "step time {wall} s vs truth {truth_wall} s over {n} steps"
    );
    // The same numbers as the daemon's own summary.
    let mean_ms = summary["phases"]["input_wait"]["mean_ms"].as_f64().unwrap();
    // The summary's mean is rounded (4 decimals of a ms from 1 ms up: render/json.rs), so its
    // product with n is exact to n × 0.05 µs.
    let rounding_s = n as f64 * 0.5e-4 / 1e3;
    // The counters sum every step; the summary's means leave out the steps taken under the
    // learning probe set when steadier ones exist (`steps.learning_excluded`): exact without
    // them, within the truth tolerance with them.
    let excluded = summary["steps"]["learning_excluded"].as_u64().unwrap_or(0);
    let slack = if excluded == 0 {
        rounding_s + 1e-9
    } else {
        tol(truth_input)
    };
    assert!(
        (input - mean_ms * n as f64 / 1e3).abs() <= slack,
        "input_wait {input} s vs the summary's mean {mean_ms} ms × {n} ({excluded} learning \
         steps left out of the mean)"
    );
    let kind = summary["primary_diagnosis"]["kind"].as_str().unwrap();
    assert_eq!(
        one(
            prom,
            &format!(r#"traceml_verdict{{job="{job_label}",kind="{kind}"}}"#)
        ),
        Some(1.0),
        "verdict {kind}"
    );
    let info = prom_query(prom, &format!(r#"traceml_job_info{{pid="{pid}"}}"#)).unwrap();
    assert_eq!(info.len(), 1, "{info:?}");
    assert!(
        info[0].0["command"]
            .as_str()
            .unwrap()
            .contains("input_bound_single.py"),
        "{info:?}"
    );
    assert_eq!(one(prom, "traceml_attached_jobs"), Some(0.0));

    // Every query of the dashboard is valid PromQL; those on steps, phases and verdicts have
    // data for this job.
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(workspace().join("packaging/grafana/traceml.json")).unwrap(),
    )
    .unwrap();
    let mut empty = Vec::new();
    let mut checked = 0;
    for panel in dash["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap();
            let q = expr
                .replace("$__rate_interval", "30s")
                .replace("$job_id", ".*")
                .replace("$job", ".*")
                .replace("$rank", ".*");
            let r = prom_query(prom, &q).unwrap_or_else(|e| panic!("{}: {e}", panel["title"]));
            checked += 1;
            if r.is_empty() {
                empty.push(panel["title"].as_str().unwrap().to_owned());
            }
        }
    }
    eprintln!("dashboard: {checked} queries valid; without data here: {empty:?}");
    for must in [
        "Step time",
        "Steps per second",
        "Phase shares",
        "Verdict",
        "straggler",
        "attached jobs",
    ] {
        assert!(
            !empty.iter().any(|t| t.contains(must)),
            "the dashboard's {must} panel has no data: {empty:?}"
        );
    }

    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(serve.0.id() as i32, libc::SIGTERM) };
    let t = Instant::now();
    while serve.0.try_wait().unwrap().is_none() {
        assert!(t.elapsed() < Duration::from_secs(10), "serve did not stop");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Single-pid mode: `--metrics-addr` serves the run while attached (job label = the output
/// directory's name, rank 0), its final values match the summary it writes; an address that
/// cannot be used is exit status 2 before attaching.
#[test]
fn single_pid_mode_serves_metrics_while_attached() {
    if !root_or_skip() {
        return;
    }
    let dir = scratch("metrics-single");
    let bad = Command::new(daemon())
        .args(["--pid", "1", "--metrics-addr", ":99999"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("port"),
        "{bad:?}"
    );

    let mut target = spawn(faketorch_workload("input_bound_single.py"), &dir);
    // A port in use: exit 2, and the target is left alone (it still waits for its ready file).
    let busy = TcpListener::bind("127.0.0.1:0").unwrap();
    let out = Command::new(daemon())
        .args(["--pid", &target.child.id().to_string(), "--quiet"])
        .arg("--output")
        .arg(dir.join("busy"))
        .arg("--metrics-addr")
        .arg(busy.local_addr().unwrap().to_string())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot listen"),
        "{out:?}"
    );
    drop(busy);

    let addr = free_addr();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poller = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut seen: Option<String> = None;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some((200, body)) = get(addr, "/metrics")
                    && let Some(line) = body
                        .lines()
                        .find(|l| l.starts_with("traceml_steps_total{") && !l.ends_with(" 0"))
                {
                    seen = Some(line.to_owned());
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            seen
        })
    };
    let o = run_daemon(
        &mut target,
        &dir,
        &["--quiet", "--metrics-addr", &addr.to_string()],
        Duration::from_secs(60),
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = poller.join().unwrap();
    assert!(o.status.success(), "{}", o.stderr);
    assert!(
        o.stderr
            .contains(&format!("metrics at http://{addr}/metrics")),
        "{}",
        o.stderr
    );
    let line = seen.expect("no steps on /metrics during the run");
    eprintln!("while attached: {line}");
    let (series, value) = line.rsplit_once(' ').unwrap();
    // A job of one process: its job_id is `<node>/<job>` (docs/metrics.md, "Jobs across nodes").
    let node = traceml_daemon::host::jobs::node_name();
    assert_eq!(
        series,
        format!(r#"traceml_steps_total{{job="out",rank="0",job_id="{node}/out",node="{node}"}}"#)
    );
    let n = o.summary["steps"]["count"].as_f64().unwrap();
    let v: f64 = value.parse().unwrap();
    assert!(
        v > 0.0 && v <= n,
        "{v} steps on /metrics, {n} in the summary"
    );
}
