//! The in-process overhead runs: one long run of a workload that logs each step's end
//! (`--steps-log`), with the daemon attached and detached in alternating windows (off, on, off,
//! …, off). This module starts and times the processes; `stats` turns the steps log into
//! per-window step times and ratios, `report` writes the section.
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use super::runs::{Ctx, Killer, monotonic_ns, proc_sample, sh};
use super::stats::{Kv, Span, f};
use crate::{root, setup};

/// Windows and their length.
pub struct Schedule {
    /// On windows; there are `2 * on + 1` windows, starting and ending off.
    pub on: usize,
    pub window_s: f64,
    /// Steps before the first window (first-step allocations, lazy init).
    pub warmup_s: f64,
    /// Wait after the daemon exited before the next off window.
    pub guard_s: f64,
}

/// Six on windows of 20 s: one window's median step moves by ±2–3 % with the machine's noise
/// (measured: off windows of the HF Trainer 37.3–38.5 ms), so a 1 % question needs several
/// pairs; windows much shorter than 20 s would be dominated by the 2 s the daemon learns the
/// loop with every probe.
pub const FULL: Schedule = Schedule {
    on: 6,
    window_s: 20.0,
    warmup_s: 10.0,
    guard_s: 1.0,
};

/// `cargo xtask bench --quick`: three on windows of 10 s (the attach cost and the order of
/// magnitude; the full schedule for the 1 % question).
pub const QUICK: Schedule = Schedule {
    on: 3,
    window_s: 10.0,
    warmup_s: 5.0,
    guard_s: 1.0,
};

/// A workload of the section: how to start it, and roughly how long a step takes (to size its
/// `--steps` so that it outlives the windows).
pub struct Workload {
    pub name: String,
    pub python: PathBuf,
    /// Script and arguments, without `--steps`, `--ready` and `--steps-log`.
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub step_ms: f64,
}

pub struct Window {
    pub span: Span,
    /// On windows whose daemon changed its probe set while attached (`daemon_overhead.probe_sets`):
    /// the part of the window after the last change, when at least a second long.
    pub steady: Option<Span>,
    /// The daemon's summary of an on window (`bench_json.py overhead`).
    pub summary: Option<Kv>,
    /// On windows: daemon start → ready file, seconds.
    pub attach_s: Option<f64>,
    /// (CLOCK_MONOTONIC ns, CPU ns of the training thread), sampled every ~20 ms over the window.
    pub cpu: Vec<(u64, u64)>,
    /// On windows: the daemon's CPU time over the window, % of one core.
    pub daemon_cpu_pct: Option<f64>,
    /// On windows: when the daemon was started and when its last probe-set change (the end of
    /// its learning period) came, CLOCK_MONOTONIC ns: the span whose steps an attach costs.
    pub attach_span: Option<(u64, u64)>,
}

/// CPU time the target's main (training) thread has run, ns (`/proc/P/schedstat`). Uprobe
/// handlers run in the thread's context and count here; time it waits for a core does not.
fn cpu_ns(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn sample(pid: u32, into: &mut Vec<(u64, u64)>) {
    if let Some(c) = cpu_ns(pid) {
        into.push((monotonic_ns(), c));
    }
}

pub struct InprocRun {
    pub name: String,
    pub windows: Vec<Window>,
    pub step_ends: Vec<u64>,
    pub load_start: String,
    /// Why the run did not happen or stopped early.
    pub error: Option<String>,
}

/// The section's workloads, those that can run here (a missing interpreter is reported as a
/// row that did not run).
pub fn workloads(torch_py: Option<&Path>) -> Vec<(Workload, Option<String>)> {
    let fw = "tests/workloads/frameworks";
    let mut out = vec![];
    let no_torch = "no virtualenv with real torch (`cargo xtask setup --torch`)";
    let torch = |name: &str, args: &[&str], step_ms: f64| {
        let w = Workload {
            name: name.to_owned(),
            python: torch_py.map(Path::to_path_buf).unwrap_or_default(),
            args: args.iter().map(|s| s.to_string()).collect(),
            env: vec![],
            step_ms,
        };
        (w, torch_py.is_none().then(|| no_torch.to_owned()))
    };
    out.push(torch(
        "HF Trainer, tiny BERT (compute)",
        &[&format!("{fw}/hf_trainer.py"), "--mode", "compute"],
        40.0,
    ));
    out.push(torch(
        "Lightning MLP (compute)",
        &[&format!("{fw}/lightning_train.py"), "--mode", "compute"],
        30.0,
    ));
    out.push(torch(
        "plain real-torch loop (`balanced`)",
        &[
            "tests/workloads/real_torch_train.py",
            "--scenario",
            "balanced",
        ],
        // ~11 ms steps on this machine (sized at 40 ms, it ran out of steps before the windows
        // were done).
        8.0,
    ));
    // The DataLoader workers' stack sampling (10 a second a worker, read from the daemon) and
    // the reads of their /proc: a job whose 4 workers sleep 8 ms an item (input-bound, ~8 ms
    // steps).
    out.push(torch(
        "real-torch input-bound loop, 4 DataLoader workers",
        &[
            "tests/workloads/real_torch_train.py",
            "--scenario",
            "input_bound",
            "--workers",
            "4",
        ],
        6.0,
    ));
    for v in ["3.9", "3.13"] {
        let (python, err) = match setup::pyenv_python(v) {
            Ok(p) => (p, None),
            Err(e) => (PathBuf::new(), Some(format!("{e:#}"))),
        };
        out.push((
            Workload {
                name: format!("fake torch loop (`balanced`), CPython {v}"),
                python,
                args: vec![
                    "tests/workloads/bench/fake_loop.py".into(),
                    "--scenario".into(),
                    "balanced".into(),
                ],
                env: vec![(
                    "PYTHONPATH".into(),
                    root().join("tests/faketorch").display().to_string(),
                )],
                step_ms: 45.0,
            },
            err,
        ));
    }
    out
}

/// `FULL`, or for a development iteration `TRACEML_BENCH_ON_WINDOWS` on windows of
/// `TRACEML_BENCH_WINDOW_S` seconds.
pub fn schedule() -> Schedule {
    let var = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<f64>().ok());
    Schedule {
        on: var("TRACEML_BENCH_ON_WINDOWS").map_or(FULL.on, |v| v.max(1.0) as usize),
        window_s: var("TRACEML_BENCH_WINDOW_S").map_or(FULL.window_s, |v| v.max(1.0)),
        ..FULL
    }
}

/// Runs every workload under the schedule (those whose name contains
/// `TRACEML_BENCH_WORKLOADS`, when set); a workload that fails becomes a row with its error.
pub fn run_all(ctx: &mut Ctx, s: &Schedule) -> Vec<InprocRun> {
    let torch_py = ctx.torch_py.clone();
    let only = std::env::var("TRACEML_BENCH_WORKLOADS").unwrap_or_default();
    workloads(torch_py.as_deref())
        .into_iter()
        .filter(|(w, _)| w.name.contains(only.as_str()))
        .map(|(w, err)| {
            let load_start = sh("cat /proc/loadavg");
            let failed = |e: String| InprocRun {
                name: w.name.clone(),
                windows: vec![],
                step_ends: vec![],
                load_start: load_start.clone(),
                error: Some(e),
            };
            if let Some(e) = err {
                return failed(e);
            }
            eprintln!("xtask bench: in-process windows, {}", w.name);
            match run_one(ctx, &w, s) {
                Ok(mut r) => {
                    r.load_start = load_start;
                    r
                }
                Err(e) => failed(format!("{e:#}")),
            }
        })
        .collect()
}

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> anyhow::Result<()> {
    let t0 = Instant::now();
    while !f() {
        if t0.elapsed() > timeout {
            bail!("{what}: nothing after {:.0} s", timeout.as_secs_f64());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

fn sleep_s(s: f64) {
    std::thread::sleep(Duration::from_secs_f64(s));
}

/// One long run of `w`: warm-up, then off / on / … / off windows, then the workload is killed.
fn run_one(ctx: &mut Ctx, w: &Workload, s: &Schedule) -> anyhow::Result<InprocRun> {
    let label: String = w
        .name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let dir = ctx.dir(&format!("inproc-{label}"))?;
    let ready = dir.join("ready");
    let steps_log = dir.join("steps.log");
    let stdout = dir.join("target.stdout");
    // Long enough for the warm-up, every window and generous attach/teardown times, at 1.5×
    // the expected step time; the workload is killed when the schedule is done.
    let budget_s =
        s.warmup_s + (2 * s.on + 1) as f64 * s.window_s + s.on as f64 * (60.0 + s.guard_s);
    let steps = (budget_s * 1000.0 / w.step_ms * 1.5).ceil() as u64;
    let mut cmd = Command::new(&w.python);
    cmd.args(&w.args)
        .arg("--steps")
        .arg(steps.to_string())
        .arg("--ready")
        .arg(&ready)
        .arg("--steps-log")
        .arg(&steps_log)
        .current_dir(root())
        .stdin(Stdio::null())
        .stdout(File::create(&stdout)?)
        .stderr(File::create(dir.join("target.stderr"))?);
    ctx.env.apply(&mut cmd);
    for (k, v) in &w.env {
        cmd.env(k, v);
    }
    let mut target = Killer(Some(
        cmd.spawn()
            .with_context(|| format!("starting {}", w.name))?,
    ));
    let pid = target.0.as_ref().unwrap().id();
    let exited = |t: &mut Killer| -> anyhow::Result<()> {
        if let Some(st) = t.0.as_mut().unwrap().try_wait()? {
            bail!(
                "the workload exited ({st}) before the windows were done; see {}",
                dir.display()
            );
        }
        Ok(())
    };
    // The start line: torch and the framework imported, the model built.
    wait_for(
        "the workload's start line",
        Duration::from_secs(180),
        || {
            std::fs::read_to_string(&stdout).is_ok_and(|s| s.contains('\n'))
                || target
                    .0
                    .as_mut()
                    .unwrap()
                    .try_wait()
                    .ok()
                    .flatten()
                    .is_some()
        },
    )?;
    exited(&mut target)?;
    std::fs::write(&ready, b"")?;
    sleep_s(s.warmup_s);
    let mut windows = vec![];
    for i in 0..2 * s.on + 1 {
        exited(&mut target)?;
        if i % 2 == 0 {
            windows.push(off_window(pid, s));
            continue;
        }
        eprintln!(
            "xtask bench:   on window {}/{} (pid {pid})",
            i / 2 + 1,
            s.on
        );
        windows.push(on_window(ctx, &dir.join(format!("w{i}")), pid, s)?);
        sleep_s(s.guard_s);
    }
    exited(&mut target)?;
    drop(target);
    let step_ends = std::fs::read_to_string(&steps_log)
        .with_context(|| format!("reading {}", steps_log.display()))?
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    Ok(InprocRun {
        name: w.name.clone(),
        windows,
        step_ends,
        load_start: String::new(),
        error: None,
    })
}

/// An off window: `window_s` seconds of the target alone, its training thread's CPU sampled
/// every ~20 ms.
fn off_window(pid: u32, s: &Schedule) -> Window {
    let mut cpu = vec![];
    let start_ns = monotonic_ns();
    let end_ns = start_ns + (s.window_s * 1e9) as u64;
    sample(pid, &mut cpu);
    while monotonic_ns() < end_ns {
        std::thread::sleep(Duration::from_millis(20));
        sample(pid, &mut cpu);
    }
    Window {
        span: Span {
            on: false,
            start_ns,
            end_ns: monotonic_ns(),
        },
        steady: None,
        summary: None,
        attach_s: None,
        cpu,
        daemon_cpu_pct: None,
        attach_span: None,
    }
}

/// The daemon attached for `window_s` seconds from its ready file on.
fn on_window(ctx: &Ctx, dir: &Path, pid: u32, s: &Schedule) -> anyhow::Result<Window> {
    std::fs::create_dir_all(dir)?;
    let ready = dir.join("ready");
    let out = dir.join("out");
    let t0 = Instant::now();
    let daemon_start_ns = monotonic_ns();
    let mut d = Killer(Some(
        Command::new(&ctx.daemon)
            .args(["--pid", &pid.to_string(), "--quiet", "--duration"])
            .arg(format!("{}", s.window_s))
            .arg("--output")
            .arg(&out)
            .arg("--ready-file")
            .arg(&ready)
            .stdout(File::create(dir.join("daemon.stdout"))?)
            .stderr(File::create(dir.join("daemon.stderr"))?)
            .spawn()
            .context("starting traceml-daemon")?,
    ));
    let mut status = None;
    wait_for("the daemon's ready file", Duration::from_secs(120), || {
        if status.is_none() {
            status = d.0.as_mut().unwrap().try_wait().ok().flatten();
        }
        ready.exists() || status.is_some()
    })?;
    if !ready.exists() {
        bail!(
            "traceml-daemon exited ({}) before attaching; see {}/daemon.stderr",
            status.map(|s| s.to_string()).unwrap_or_default(),
            dir.display()
        );
    }
    let mut cpu = vec![];
    sample(pid, &mut cpu);
    let start_ns = monotonic_ns();
    let attach_s = t0.elapsed().as_secs_f64();
    let window_end = start_ns + (s.window_s * 1e9) as u64;
    let dpid = d.0.as_ref().unwrap().id();
    let daemon_cpu = || proc_sample(dpid, ctx.clk_tck).map(|x| x.0);
    let daemon_start = daemon_cpu();
    let mut daemon_end = None;
    let mut last = Instant::now();
    let st = loop {
        if monotonic_ns() <= window_end && last.elapsed() >= Duration::from_millis(20) {
            sample(pid, &mut cpu);
            last = Instant::now();
        }
        if daemon_end.is_none() && monotonic_ns() >= window_end {
            daemon_end = daemon_cpu();
        }
        if let Some(st) = d.0.as_mut().unwrap().try_wait()? {
            d.0 = None;
            break st;
        }
        if t0.elapsed() > Duration::from_secs_f64(attach_s + s.window_s + 120.0) {
            bail!("traceml-daemon did not finish; see {}", dir.display());
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let end_ns = (start_ns + (s.window_s * 1e9) as u64).min(monotonic_ns());
    if !st.success() {
        bail!(
            "traceml-daemon failed ({st}); see {}/daemon.stderr",
            dir.display()
        );
    }
    let summary = ctx.json("overhead", &out.join("final_summary.json")).ok();
    let last_change = summary
        .as_ref()
        .and_then(|kv| f(kv, "overhead.last_change_s"))
        .map(|s| start_ns + (s.max(0.0) * 1e9) as u64);
    let steady = last_change
        .filter(|&from| from + 1_000_000_000 <= end_ns)
        .map(|from| Span {
            on: true,
            start_ns: from,
            end_ns,
        });
    Ok(Window {
        span: Span {
            on: true,
            start_ns,
            end_ns,
        },
        steady,
        summary,
        attach_s: Some(attach_s),
        cpu,
        daemon_cpu_pct: daemon_start
            .zip(daemon_end)
            .map(|(a, b)| 100.0 * (b - a) / s.window_s),
        attach_span: Some((daemon_start_ns, last_change.unwrap_or(start_ns))),
    })
}
