//! `traceml-daemon serve` (issue 12): started before a job, it finds the job without a pid,
//! skips a neighbour started with `TRACEML_DISABLE=1`, writes window summaries while the job
//! runs and its final summary within 5 s of its exit with the verdict the job's own truth gives,
//! and exits 0 within 10 s of SIGTERM, writing the summary of a job still running. The systemd
//! unit passes `systemd-analyze verify`, and its ExecStart line works under exactly the
//! capability set the unit grants, run with `setpriv` as an unprivileged user.
mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::*;
use traceml_daemon::phase::Phase;

/// `serve`, and a workload started without the daemon's handshake (serve finds it by itself):
/// both killed on drop.
type Serve = Proc;
type Job = Proc;

fn job(steps: u32, truth: &Path, opt_out: bool) -> Job {
    let mut cmd = faketorch_workload("input_bound_single.py");
    cmd.args([
        "--steps",
        &steps.to_string(),
        "--stop-on-sigterm",
        "--truth",
    ])
    .arg(truth)
    .stdout(Stdio::null())
    .stderr(Stdio::inherit());
    if opt_out {
        cmd.env("TRACEML_DISABLE", "1");
    }
    Proc(cmd.spawn().expect("start the workload"))
}

/// The verdict the share rules give on the truth's own totals.
fn truth_kind(truth: &Path) -> String {
    let t = json(truth);
    let wall = t["totals"]["wall_ns"].as_f64().unwrap();
    let shares: Vec<(Phase, f64)> = Phase::ALL
        .iter()
        .map(|&p| {
            // Single-process truth has no collective_wait: none happened.
            let ns = t["totals"][format!("{}_ns", p.name())]
                .as_f64()
                .unwrap_or(0.0);
            (p, ns / wall)
        })
        .collect();
    published_verdict(&shares, t["step_count"].as_u64().unwrap() as u32).to_owned()
}

fn summary(dir: &Path) -> serde_json::Value {
    json(&dir.join("final_summary.json"))
}

/// `serve` as `cmd` (root, or under setpriv), for the jobs of `steps` steps, windows of 2 s.
fn start_serve(cmd: Command, state: &Path, ready: &Path, steps: &[u32]) -> Serve {
    let includes: Vec<String> = steps
        .iter()
        .map(|s| format!("*input_bound_single.py --steps {s} *"))
        .collect();
    let mut args = vec!["--window", "2"];
    for i in &includes {
        args.extend(["--include", i]);
    }
    serve_until_ready(cmd, state, ready, &args, None)
}

fn stop(mut serve: Serve) {
    stop_serve(&mut serve, Duration::from_secs(10));
}

#[test]
fn serve_finds_jobs_skips_opt_outs_and_stops_cleanly() {
    if !root_or_skip() {
        return;
    }
    let dir = scratch("serve");
    let state = dir.join("state");
    // A config file that is named must exist and parse: exit 2, naming it.
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "inclde = []\n").unwrap();
    for config in [bad.clone(), dir.join("missing.toml")] {
        let out = Command::new(daemon())
            .arg("serve")
            .arg("--state-dir")
            .arg(&state)
            .arg("--config")
            .arg(&config)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&*config.to_string_lossy()), "{err}");
    }
    let serve = start_serve(
        Command::new(daemon()),
        &state,
        &dir.join("ready"),
        &[171, 172, 3001],
    );
    let (t1, t2) = (dir.join("t1.json"), dir.join("t2.json"));
    let mut a = job(171, &t1, false);
    let mut b = job(172, &t2, true);
    let (pa, pb) = (a.0.id(), b.0.id());
    assert!(a.0.wait().unwrap().success() && b.0.wait().unwrap().success());
    let ended = Instant::now();
    wait_for("the job's final summary", Duration::from_secs(5), || {
        job_dir(&state, pa).is_some_and(|d| d.join("final_summary.json").exists())
    });
    eprintln!("final summary {:?} after the job's exit", ended.elapsed());
    let d = job_dir(&state, pa).unwrap();
    let s = summary(&d);
    assert_eq!(s["primary_diagnosis"]["kind"], truth_kind(&t1), "{s:#}");
    assert!(
        s["steps"]["count"].as_u64().unwrap() >= 20,
        "{}",
        s["steps"]
    );
    assert!(
        job_dir(&state, pb).is_none(),
        "the opted-out job was attached"
    );
    // A long job: window summaries while it runs, its final summary at SIGTERM.
    let t3 = dir.join("t3.json");
    let c = job(3001, &t3, false);
    let pc = c.0.id();
    wait_for("two window summaries", Duration::from_secs(30), || {
        job_dir(&state, pc).is_some_and(|d| d.join("summary-2.json").exists())
    });
    let d = job_dir(&state, pc).unwrap();
    let w: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("summary-2.json")).unwrap()).unwrap();
    stop(serve);
    // The window's verdict is the truth's: the job, told to stop, writes the truth of its steps
    // so far (the same steady loop the windows saw).
    // SAFETY: kill(2) of our own child.
    unsafe { libc::kill(pc as i32, libc::SIGTERM) };
    let mut c = c;
    assert!(c.0.wait().unwrap().success());
    assert_eq!(w["primary_diagnosis"]["kind"], truth_kind(&t3), "{w:#}");
    let s = summary(&d);
    assert_eq!(
        s["data_quality"]["end_reason"], "terminated",
        "{}",
        s["data_quality"]
    );
    assert!(s["steps"]["count"].as_u64().unwrap() > 0);
    drop(c);
    // The state directory is private to the daemon's group.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&state).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o750);
}

/// The capabilities the unit grants, from its `AmbientCapabilities=` line.
fn unit_caps(unit: &str) -> Vec<String> {
    let bounding: Vec<String> = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("CapabilityBoundingSet")
        .split_whitespace()
        .map(String::from)
        .collect();
    let ambient: Vec<String> = unit
        .lines()
        .find_map(|l| l.strip_prefix("AmbientCapabilities="))
        .expect("AmbientCapabilities")
        .split_whitespace()
        .map(String::from)
        .collect();
    assert_eq!(bounding, ambient, "the unit grants what it bounds");
    ambient
}

#[test]
fn unit_file_verifies_and_its_capability_set_is_enough() {
    if !root_or_skip() {
        return;
    }
    let unit_path = workspace().join("packaging/traceml-daemon.service");
    let unit = std::fs::read_to_string(&unit_path).unwrap();
    let dir = scratch("unit");
    // systemd-analyze checks the ExecStart binary exists: point it at this build.
    let local = dir.join("traceml-daemon.service");
    std::fs::write(
        &local,
        unit.replace(
            "/usr/local/bin/traceml-daemon",
            &daemon().display().to_string(),
        ),
    )
    .unwrap();
    match Command::new("systemd-analyze")
        .arg("verify")
        .arg(&local)
        .output()
    {
        Ok(out) => assert!(
            out.status.success() && out.stderr.is_empty(),
            "systemd-analyze verify: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
        // Under `cargo xtask test` (CI) the tool is installed: missing, the test fails.
        Err(e) => {
            assert!(
                std::env::var_os("TRACEML_REQUIRE_ROOT").is_none(),
                "systemd-analyze not available ({e}): install systemd (cargo xtask setup does)"
            );
            eprintln!("skipped: systemd-analyze not available ({e}): unit not verified")
        }
    }
    // The same ExecStart, as an unprivileged user holding exactly the unit's capabilities.
    let caps: Vec<String> = unit_caps(&unit)
        .iter()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect();
    let caps = caps.join(",");
    let state = dir.join("state");
    std::fs::create_dir_all(&dir).unwrap();
    // `nobody` must be able to reach the scratch directory to create its state directory.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--no-new-privs",
    ])
    .arg(format!("--inh-caps=-all,{caps}"))
    .arg(format!("--ambient-caps=-all,{caps}"))
    .arg(format!("--bounding-set=-all,{caps}"))
    .arg(daemon());
    let serve = start_serve(cmd, &state, &dir.join("ready"), &[173]);
    let t = dir.join("t.json");
    let mut a = job(173, &t, false);
    let pa = a.0.id();
    assert!(a.0.wait().unwrap().success());
    wait_for("the job's final summary", Duration::from_secs(5), || {
        job_dir(&state, pa).is_some_and(|d| d.join("final_summary.json").exists())
    });
    let s = summary(&job_dir(&state, pa).unwrap());
    assert_eq!(s["primary_diagnosis"]["kind"], truth_kind(&t), "{s:#}");
    stop(serve);
}

/// A process that execs a new training program keeps its pid: `serve` ends the first run at the
/// exec (its summary says so) and attaches to the new program, in a directory of its own.
#[test]
fn serve_attaches_again_after_an_exec_in_a_new_directory() {
    if !root_or_skip() {
        return;
    }
    let dir = scratch("serve-exec");
    let state = dir.join("state");
    let ready = dir.join("ready");
    let (before, after) = (200u32, 203u32);
    let serve = serve_until_ready(
        Command::new(daemon()),
        &state,
        &ready,
        &[
            "--scan-interval",
            "0.2",
            "--include",
            "*exec_restart.py *",
            "--include",
            &format!("*input_bound_single.py --steps {after} *"),
        ],
        None,
    );
    let (t1, t2) = (dir.join("t1.json"), dir.join("t2.json"));
    let mut job = Proc(
        faketorch_workload("exec_restart.py")
            .args(["--steps", &before.to_string(), "--truth"])
            .arg(&t1)
            .args(["--steps-after", &after.to_string(), "--truth-after"])
            .arg(&t2)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the workload"),
    );
    let pid = job.0.id();
    assert!(job.0.wait().unwrap().success(), "the workload failed");
    // Two directories of this pid, the second named `...-2`, each with its final summary.
    let dirs = || -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(&state)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        v.retain(|p| p.to_string_lossy().contains(&format!("-{pid}-")));
        v.sort_by_key(|p| p.as_os_str().len());
        v
    };
    wait_for(
        "both runs' final summaries",
        Duration::from_secs(15),
        || {
            let d = dirs();
            d.len() == 2 && d.iter().all(|d| d.join("final_summary.json").exists())
        },
    );
    let d = dirs();
    assert!(d[1].to_string_lossy().ends_with("-2"), "{d:?}");
    let (first, second) = (summary(&d[0]), summary(&d[1]));
    assert_eq!(
        first["data_quality"]["end_reason"], "target_execed",
        "{}",
        first["data_quality"]
    );
    assert_eq!(second["data_quality"]["end_reason"], "target_exited");
    // Each run's steps are its own program's: no more than it ran, and most of them (serve
    // attaches within a scan or two of torch being mapped; each run lasts ~7 s).
    for (s, t, n) in [(&first, &t1, before), (&second, &t2, after)] {
        let count = s["steps"]["count"].as_u64().unwrap();
        assert!(
            count <= u64::from(n) && count >= u64::from(n) / 3,
            "{count} steps of {n}"
        );
        assert_eq!(s["primary_diagnosis"]["kind"], truth_kind(t), "{s:#}");
    }
    assert_ne!(first["target"]["cmdline"], second["target"]["cmdline"]);
    stop(serve);
}

/// A launcher's child caught between its fork and its exec is the launcher's copy (same
/// command line: a worker to the policy); once it execs the training program (same pid, same
/// start time) serve decides on it again and attaches (a torchrun restart's rank was missed
/// this way). The workload forks, pauses 1 s (five scans) and execs; its truth counts the
/// child's steps.
#[test]
fn serve_attaches_a_child_caught_before_its_exec() {
    if !root_or_skip() {
        return;
    }
    let dir = scratch("serve-fork-exec");
    let state = dir.join("state");
    let ready = dir.join("ready");
    let steps = 150u32;
    let serve = serve_until_ready(
        Command::new(daemon()),
        &state,
        &ready,
        &[
            "--scan-interval",
            "0.2",
            "--include",
            &format!("*input_bound_single.py --steps {steps} *"),
        ],
        None,
    );
    let truth = dir.join("truth.json");
    let mut job = Proc(
        faketorch_workload("fork_exec.py")
            .args(["--steps", &steps.to_string(), "--pause", "1.0", "--truth"])
            .arg(&truth)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the workload"),
    );
    assert!(job.0.wait().unwrap().success(), "the workload failed");
    let child = json(&truth)["pid"].as_u64().expect("the child's pid");
    let found = || -> Option<PathBuf> {
        std::fs::read_dir(&state)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.to_string_lossy().contains(&format!("-{child}-")))
            .filter(|p| p.join("final_summary.json").exists())
    };
    wait_for("the child's final summary", Duration::from_secs(15), || {
        found().is_some()
    });
    let s = summary(&found().unwrap());
    let count = s["steps"]["count"].as_u64().unwrap();
    // Attached within a scan or two of the exec: most of its ~5 s of steps.
    assert!(
        count <= u64::from(steps) && count >= u64::from(steps) / 3,
        "{count} steps of {steps}"
    );
    assert_eq!(s["primary_diagnosis"]["kind"], truth_kind(&truth), "{s:#}");
    stop(serve);
}

/// One precedence rule and distinct exit codes (issue 24): a flag wins over the config file's
/// key; a bad value is refused wherever it came from (2, naming where); without root or the
/// capabilities serve stops before it serves (4), not with the 2 of a bad argument.
#[test]
fn serve_flags_win_over_the_file_and_failures_have_their_exit_codes() {
    if !root_or_skip() {
        return;
    }
    let dir = scratch("serve-settings");
    let file = dir.join("config.toml");
    std::fs::write(&file, "stack_rate = 5000\nwindow_s = 30.0\n").unwrap();
    let check = |extra: &[&str]| {
        let out = Command::new(daemon())
            .args(["serve", "--check-config", "--config"])
            .arg(&file)
            .args(extra)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    };
    let (code, said) = check(&[]);
    assert_eq!(code, Some(2), "{said}");
    assert!(
        said.contains(&format!(
            "stack_rate in {}: must be at most 1000 per second",
            file.display()
        )),
        "{said}"
    );
    let (code, said) = check(&["--stack-rate", "20", "--window", "7"]);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains("stack rate 20/s") && said.contains("window 7 s"),
        "{said}"
    );
    let (code, said) = check(&["--stack-rate", "20", "--overhead-budget", "0"]);
    assert_eq!(code, Some(2), "{said}");
    assert!(
        said.contains("--overhead-budget") && said.contains("must be a percentage above 0"),
        "{said}"
    );
    // No capabilities at all: 4, before anything is bound or attached.
    std::fs::write(&file, "").unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .args(["--inh-caps=-all", "--bounding-set=-all"])
        .arg(daemon())
        .args(["serve", "--config"])
        .arg(&file)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("CAP_SYS_ADMIN"), "{err}");
    assert!(!dir.join("state").exists(), "nothing made before the check");
}
