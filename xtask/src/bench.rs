//! `cargo xtask bench [--quick]`: measures traceml-daemon on this machine and (re)writes
//! BENCHMARKS.md. Every comparison is paired (A B A B …, a fresh process per run) and reported as
//! medians with min/max, because the project's machines are small and shared.
//!
//! Workloads: `tests/workloads/bench/` (storms, realistic loops, the real-PyTorch loop with the
//! optional TraceML lines) and the ground-truth scenarios of `tests/workloads/`. JSON files are
//! read through `tests/workloads/bench/bench_json.py` (xtask has no JSON parser).
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::{root, run, setup};

type Kv = BTreeMap<String, String>;
/// TraceML comparison row: (scenario, expected, our verdict, TraceML's verdict, our added %,
/// TraceML's added %, TraceML's step ms, truth step ms).
type Cmp = (String, String, String, String, f64, f64, f64, f64);

const PHASES: [&str; 7] = [
    "input_wait",
    "h2d",
    "forward",
    "backward",
    "optimizer",
    "gpu_wait",
    "residual",
];
const TRACEML_PIN: &str = "traceml-ai==0.5.0";

struct Plan {
    pairs: usize,
    storm_n: u32,
    storm_reps: u32,
    realistic: &'static [u32],
    realistic_steps: [(u32, u32); 3],
    footprint_steps: u32,
    traceml_scenarios: &'static [&'static str],
}

const FULL: Plan = Plan {
    pairs: 5,
    storm_n: 100_000,
    storm_reps: 3,
    realistic: &[20, 100, 500],
    realistic_steps: [(20, 60), (100, 24), (500, 8)],
    footprint_steps: 1000,
    traceml_scenarios: &["input_bound", "residual_heavy", "balanced"],
};

const QUICK: Plan = Plan {
    pairs: 3,
    storm_n: 30_000,
    storm_reps: 3,
    realistic: &[20],
    realistic_steps: [(20, 40), (100, 12), (500, 4)],
    footprint_steps: 200,
    traceml_scenarios: &["balanced"],
};

struct Ctx {
    py: PathBuf,
    torch_py: Option<PathBuf>,
    traceml: Result<PathBuf, String>,
    daemon: PathBuf,
    scratch: PathBuf,
    env: setup::TestEnv,
    clk_tck: f64,
    n: u32,
}

/// Daemon measurements of one run.
#[derive(Default, Clone)]
struct DaemonStats {
    attach_s: f64,
    verdict_s: Option<f64>,
    /// CPU seconds and wall seconds from probes live to target exit.
    steady_cpu_s: f64,
    steady_s: f64,
    attach_cpu_s: f64,
    hwm_kb: u64,
    /// Peak of RssAnon over the samples (heap, without file-backed pages).
    anon_kb: u64,
    summary_bytes: u64,
    recording_bytes: u64,
    summary: Kv,
}

struct RunOut {
    last_line: String,
    truth: Option<Kv>,
    daemon: Option<DaemonStats>,
    wall_s: f64,
}

struct Killer(Option<Child>);
impl Drop for Killer {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn proc_sample(pid: u32, clk: f64) -> Option<(f64, u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let cpu = (f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?) / clk;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Some((cpu, kb("VmHWM:"), kb("RssAnon:")))
}

impl Ctx {
    fn dir(&mut self, label: &str) -> anyhow::Result<PathBuf> {
        self.n += 1;
        let d = self.scratch.join(format!("{:04}-{label}", self.n));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d)?;
        Ok(d)
    }

    fn json(&self, kind: &str, file: &Path) -> anyhow::Result<Kv> {
        let out = Command::new(&self.py)
            .arg(root().join("tests/workloads/bench/bench_json.py"))
            .arg(kind)
            .arg(file)
            .output()
            .context("running bench_json.py")?;
        if !out.status.success() {
            bail!(
                "bench_json.py {kind} {}: {}",
                file.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
            .collect())
    }

    /// Runs a workload that speaks the ready/truth protocol, plain (the bench touches the ready
    /// file) or with the daemon attached (the daemon writes it once its probes are live).
    fn run(
        &mut self,
        label: &str,
        python: &Path,
        args: &[String],
        daemon: Option<&[&str]>,
    ) -> anyhow::Result<RunOut> {
        let dir = self.dir(label)?;
        let ready = dir.join("ready");
        let truth = dir.join("truth.json");
        let mut cmd = Command::new(python);
        cmd.args(args)
            .arg("--ready")
            .arg(&ready)
            .arg("--truth")
            .arg(&truth)
            .current_dir(root())
            .stdout(Stdio::piped())
            .stderr(File::create(dir.join("target.stderr"))?);
        self.env.apply(&mut cmd);
        let t0 = Instant::now();
        let mut target = Killer(Some(
            cmd.spawn().with_context(|| format!("starting {label}"))?,
        ));
        let mut stdout = BufReader::new(target.0.as_mut().unwrap().stdout.take().unwrap());
        let mut first = String::new();
        stdout.read_line(&mut first)?;
        if first.is_empty() {
            bail!(
                "{label}: the workload exited before its first line; see {}",
                dir.display()
            );
        }
        let stats = match daemon {
            None => {
                std::fs::write(&ready, b"")?;
                target.0.as_mut().unwrap().wait()?;
                None
            }
            Some(extra) => Some(self.attach(&dir, &ready, &mut target, extra)?),
        };
        let wall_s = t0.elapsed().as_secs_f64();
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut rest);
        let last_line = rest.lines().last().unwrap_or("").to_owned();
        let truth = if truth.exists() {
            Some(self.json("truth", &truth)?)
        } else {
            None
        };
        Ok(RunOut {
            last_line,
            truth,
            daemon: stats,
            wall_s,
        })
    }

    fn attach(
        &self,
        dir: &Path,
        ready: &Path,
        target: &mut Killer,
        extra: &[&str],
    ) -> anyhow::Result<DaemonStats> {
        let out = dir.join("out");
        let rec = dir.join("rec.jsonl");
        let tpid = target.0.as_ref().unwrap().id();
        let mut cmd = Command::new(&self.daemon);
        cmd.args(["--pid", &tpid.to_string(), "--quiet", "--output"])
            .arg(&out)
            .arg("--ready-file")
            .arg(ready)
            .args(
                extra
                    .iter()
                    .map(|a| a.replace("{rec}", &rec.to_string_lossy())),
            )
            .stdout(File::create(dir.join("daemon.stdout"))?)
            .stderr(File::create(dir.join("daemon.stderr"))?);
        let t0 = Instant::now();
        let mut d = Killer(Some(cmd.spawn().context("starting traceml-daemon")?));
        let dpid = d.0.as_ref().unwrap().id();
        let summary = out.join("final_summary.json");
        let mut s = DaemonStats::default();
        // (when, daemon CPU seconds then)
        let mut ready_at: Option<(Instant, f64)> = None;
        let mut exit_at: Option<(Instant, f64)> = None;
        let mut last = (0.0, 0u64, 0u64);
        let mut last_sample = Instant::now() - Duration::from_secs(1);
        let status = loop {
            if last_sample.elapsed() >= Duration::from_millis(20) {
                if let Some(x) = proc_sample(dpid, self.clk_tck) {
                    last = x;
                    s.anon_kb = s.anon_kb.max(x.2);
                    s.hwm_kb = s.hwm_kb.max(x.1);
                }
                last_sample = Instant::now();
            }
            if ready_at.is_none() && ready.exists() {
                s.attach_s = t0.elapsed().as_secs_f64();
                last = proc_sample(dpid, self.clk_tck).unwrap_or(last);
                ready_at = Some((Instant::now(), last.0));
            }
            match exit_at {
                None => {
                    if target.0.as_mut().unwrap().try_wait()?.is_some() {
                        last = proc_sample(dpid, self.clk_tck).unwrap_or(last);
                        exit_at = Some((Instant::now(), last.0));
                    }
                }
                Some((at, _)) => {
                    if s.verdict_s.is_none() && summary.exists() {
                        s.verdict_s = Some(at.elapsed().as_secs_f64());
                    }
                }
            }
            if let Some(st) = d.0.as_mut().unwrap().try_wait()? {
                d.0 = None;
                break st;
            }
            let limit = if exit_at.is_some() { 60 } else { 600 };
            if t0.elapsed() > Duration::from_secs(limit) {
                bail!("traceml-daemon did not finish; see {}", dir.display());
            }
            std::thread::sleep(Duration::from_millis(3));
        };
        if !status.success() {
            bail!(
                "traceml-daemon failed ({status}); see {}/daemon.stderr",
                dir.display()
            );
        }
        if let (Some((ri, rc)), Some((ei, ec))) = (ready_at, exit_at) {
            s.steady_s = ei.duration_since(ri).as_secs_f64();
            s.steady_cpu_s = ec - rc;
            s.attach_cpu_s = rc;
        }
        // A zombie's status has no VmHWM: keep the largest value seen.
        s.hwm_kb = s.hwm_kb.max(last.1);
        s.summary_bytes = std::fs::metadata(&summary).map(|m| m.len()).unwrap_or(0);
        s.recording_bytes = std::fs::metadata(&rec).map(|m| m.len()).unwrap_or(0);
        s.summary = self.json("summary", &summary)?;
        Ok(s)
    }
}

fn f(kv: &Kv, k: &str) -> Option<f64> {
    kv.get(k).and_then(|v| v.parse().ok())
}

fn med(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

fn mmm(v: &[f64]) -> (f64, f64, f64) {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (med(v), lo, hi)
}

fn pass(ok: bool) -> &'static str {
    if ok { "pass" } else { "**FAIL**" }
}

fn storm_ns(line: &str) -> Option<f64> {
    let i = line.find("\"median\": ")? + 10;
    line[i..].trim_end_matches(['}', ' ', '\n']).parse().ok()
}

fn sh(cmd: &str) -> String {
    Command::new("sh")
        .args(["-c", cmd])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

fn torch_python() -> Option<PathBuf> {
    let cached = setup::cache_dir().join("venv-torch-py3.11/bin/python");
    [
        std::env::var_os("TRACEML_TORCH_PYTHON").map(PathBuf::from),
        Some(cached),
        Some(PathBuf::from("/tmp/invest/venv311/bin/python")),
    ]
    .into_iter()
    .flatten()
    // A venv being rebuilt by `cargo xtask setup` exists without torch for a while.
    .find(|p| {
        Command::new(p)
            .args(["-c", "import torch"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// TraceML in its own venv; torch comes from the torch venv through a .pth file, so the same
/// torch build runs under both tools.
fn traceml_venv(torch_py: &Path) -> anyhow::Result<PathBuf> {
    let dir = setup::cache_dir().join("venv-traceml-ai-py3.11");
    let bin = dir.join("bin/traceml");
    let site = Command::new(torch_py)
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ])
        .output()
        .context("asking the torch venv for its site-packages")?;
    let site = String::from_utf8_lossy(&site.stdout).trim().to_owned();
    if !bin.exists() {
        run(Command::new(setup::pyenv_python("3.11")?)
            .args(["-m", "venv"])
            .arg(&dir))?;
    }
    std::fs::write(
        dir.join("lib/python3.11/site-packages/torchvenv.pth"),
        format!("{site}\n"),
    )?;
    // The torch venv may lack TraceML's dependencies (numpy): pip installs what is missing.
    let ok = Command::new(dir.join("bin/python"))
        .args(["-c", "import traceml_ai, numpy, torch"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok || !bin.exists() {
        run(Command::new(dir.join("bin/python")).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            TRACEML_PIN,
        ]))?;
    }
    Ok(bin)
}

pub fn bench(quick: bool) -> anyhow::Result<()> {
    let plan = if quick { &QUICK } else { &FULL };
    let started = Instant::now();
    setup::all(false)?;
    let root = root();
    run(Command::new("cargo")
        .args(["build", "--release", "-p", "traceml-daemon"])
        .current_dir(&root))?;
    let torch_py = torch_python();
    let traceml = match &torch_py {
        None => Err("no virtualenv with real torch (run `cargo xtask setup --torch`)".to_owned()),
        Some(t) => traceml_venv(t).map_err(|e| format!("{e:#}")),
    };
    let scratch = std::env::temp_dir().join("traceml-bench");
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch)?;
    let mut ctx = Ctx {
        py: setup::pyenv_python("3.11")?,
        torch_py,
        traceml,
        daemon: root.join("target/release/traceml-daemon"),
        scratch,
        env: setup::test_env()?,
        clk_tck: sh("getconf CLK_TCK").parse().unwrap_or(100.0),
        n: 0,
    };
    let load_start = sh("cat /proc/loadavg");
    let mut md = String::new();
    let mut attach_times: Vec<(String, f64, f64)> = Vec::new();
    let mut footprints: Vec<(String, DaemonStats, f64)> = Vec::new();
    let bench_dir = "tests/workloads/bench";
    let rec = ["--record", "{rec}"];

    // 1a. Realistic loops.
    let mut realistic = String::new();
    for &ms in plan.realistic {
        let steps = plan
            .realistic_steps
            .iter()
            .find(|(m, _)| *m == ms)
            .unwrap()
            .1;
        let args = vec![
            format!("{bench_dir}/realistic.py"),
            "--step-ms".into(),
            ms.to_string(),
            "--steps".into(),
            steps.to_string(),
        ];
        let (mut ratios, mut a_ms, mut b_ms) = (vec![], vec![], vec![]);
        for i in 0..plan.pairs {
            eprintln!(
                "xtask bench: realistic {ms} ms, pair {}/{}",
                i + 1,
                plan.pairs
            );
            let py = ctx.py.clone();
            let a = ctx.run(&format!("real{ms}-a"), &py, &args, None)?;
            let b = ctx.run(&format!("real{ms}-b"), &py, &args, Some(&rec))?;
            let (ta, tb) = (
                f(a.truth.as_ref().unwrap(), "step_median_ms").unwrap(),
                f(b.truth.as_ref().unwrap(), "step_median_ms").unwrap(),
            );
            ratios.push(tb / ta);
            a_ms.push(ta);
            b_ms.push(tb);
            let d = b.daemon.unwrap();
            attach_times.push((
                "stand-in runtime + fake torch".into(),
                d.attach_s,
                d.verdict_s.unwrap_or(f64::NAN),
            ));
            footprints.push((
                format!("realistic {ms} ms"),
                d,
                f(b.truth.as_ref().unwrap(), "steps").unwrap_or(0.0),
            ));
        }
        let (m, lo, hi) = mmm(&ratios);
        let _ = writeln!(
            realistic,
            "| realistic {ms} ms (stand-in CUDA, {steps} steps) | {:.2} | {:.2} | {:.4} | {:.4} | {:.4} | {:+.2} % | {} |",
            med(&a_ms),
            med(&b_ms),
            m,
            lo,
            hi,
            (m - 1.0) * 100.0,
            pass(m <= 1.005)
        );
    }

    // 1b + 5. Real PyTorch on CPU: plain, daemon attached, TraceML (`traceml run`), alternating.
    let mut side = String::new();
    let mut side_overhead = String::new();
    // (scenario, expected, our verdict, TraceML's verdict, our added %, TraceML's added %,
    // TraceML's step ms, truth step ms)
    let mut cmp: Vec<Cmp> = Vec::new();
    if let Some(tp) = ctx.torch_py.clone() {
        for &sc in plan.traceml_scenarios {
            let args = vec![
                format!("{bench_dir}/real_torch_loop.py"),
                "--scenario".into(),
                sc.into(),
            ];
            let (mut rb, mut rc, mut a_ms, mut b_ms, mut c_ms) =
                (vec![], vec![], vec![], vec![], vec![]);
            let (mut wa, mut wb, mut wc) = (vec![], vec![], vec![]);
            let mut ours: Option<Kv> = None;
            let mut theirs: Option<Kv> = None;
            let mut truth: Option<Kv> = None;
            let mut traceml_err: Option<String> = ctx.traceml.as_ref().err().cloned();
            for i in 0..plan.pairs {
                eprintln!(
                    "xtask bench: real torch {sc}, round {}/{}",
                    i + 1,
                    plan.pairs
                );
                let a = ctx.run(&format!("torch-{sc}-a"), &tp, &args, None)?;
                let b = ctx.run(&format!("torch-{sc}-b"), &tp, &args, Some(&rec))?;
                let ta = f(a.truth.as_ref().unwrap(), "step_median_ms").unwrap();
                let tb = f(b.truth.as_ref().unwrap(), "step_median_ms").unwrap();
                a_ms.push(ta);
                b_ms.push(tb);
                rb.push(tb / ta);
                wa.push(a.wall_s);
                wb.push(b.wall_s);
                let d = b.daemon.unwrap();
                attach_times.push((
                    "real torch 2.15 (CPU)".into(),
                    d.attach_s,
                    d.verdict_s.unwrap_or(f64::NAN),
                ));
                if ours.is_none() {
                    ours = Some(d.summary.clone());
                    truth = b.truth.clone();
                }
                footprints.push((
                    format!("real torch {sc}"),
                    d,
                    f(b.truth.as_ref().unwrap(), "steps").unwrap_or(0.0),
                ));
                if traceml_err.is_none() {
                    match run_traceml(&mut ctx, sc) {
                        Ok((t, s, w)) => {
                            let tc = f(&t, "step_median_ms").unwrap();
                            c_ms.push(tc);
                            rc.push(tc / ta);
                            wc.push(w);
                            if theirs.is_none() {
                                theirs = Some(s);
                            }
                        }
                        Err(e) => traceml_err = Some(format!("{e:#}")),
                    }
                }
            }
            let (m, lo, hi) = mmm(&rb);
            let _ = writeln!(
                realistic,
                "| real PyTorch CPU `{sc}` | {:.2} | {:.2} | {m:.4} | {lo:.4} | {hi:.4} | {:+.2} % | {} |",
                med(&a_ms),
                med(&b_ms),
                (m - 1.0) * 100.0,
                pass(m <= 1.005)
            );
            let _ = write!(
                side_overhead,
                "| `{sc}` | {:.2} | {:.2} ({:+.2} %, min {:.4}, max {:.4}) | ",
                med(&a_ms),
                med(&b_ms),
                (m - 1.0) * 100.0,
                lo,
                hi
            );
            if rc.is_empty() {
                let _ = writeln!(
                    side_overhead,
                    "not run | {:.1} / {:.1} / — |",
                    med(&wa),
                    med(&wb)
                );
            } else {
                let (m2, lo2, hi2) = mmm(&rc);
                let _ = writeln!(
                    side_overhead,
                    "{:.2} ({:+.2} %, min {lo2:.4}, max {hi2:.4}) | {:.1} / {:.1} / {:.1} |",
                    med(&c_ms),
                    (m2 - 1.0) * 100.0,
                    med(&wa),
                    med(&wb),
                    med(&wc)
                );
            }
            let t = truth.unwrap_or_default();
            let o = ours.unwrap_or_default();
            cmp.push((
                sc.to_owned(),
                t.get("expected")
                    .cloned()
                    .unwrap_or_default()
                    .to_uppercase(),
                o.get("verdict").cloned().unwrap_or_default(),
                theirs
                    .as_ref()
                    .and_then(|s| s.get("verdict").cloned())
                    .unwrap_or_default(),
                (m - 1.0) * 100.0,
                if rc.is_empty() {
                    f64::NAN
                } else {
                    (med(&rc) - 1.0) * 100.0
                },
                theirs
                    .as_ref()
                    .and_then(|s| f(s, "step_mean_ms"))
                    .unwrap_or(f64::NAN),
                f(&t, "step_median_ms").unwrap_or(f64::NAN),
            ));
            let _ = writeln!(
                side,
                "\n**`{sc}`** (expected `{}`)\n",
                t.get("expected").map(String::as_str).unwrap_or("?")
            );
            let _ = writeln!(
                side,
                "| | verdict | input_wait | forward | backward | optimizer | residual | step (ms) |"
            );
            let _ = writeln!(side, "|---|---|---|---|---|---|---|---|");
            let share = |kv: &Kv, p: &str| {
                f(kv, &format!("{p}_share"))
                    .map(|x| format!("{:.1} %", x * 100.0))
                    .unwrap_or("—".into())
            };
            let row = |name: &str, kv: &Kv, verdict: &str, step: &str| {
                let mut r = format!("| {name} | {verdict} |");
                for p in ["input_wait", "forward", "backward", "optimizer", "residual"] {
                    let _ = write!(r, " {} |", share(kv, p));
                }
                let _ = write!(r, " {step} |");
                r
            };
            let _ = writeln!(
                side,
                "{}",
                row(
                    "truth (in-script clocks)",
                    &t,
                    "—",
                    &format!("{:.2} median", f(&t, "step_median_ms").unwrap_or(f64::NAN))
                )
            );
            let _ = writeln!(
                side,
                "{}",
                row(
                    "traceml-daemon",
                    &o,
                    o.get("verdict").map(String::as_str).unwrap_or("?"),
                    &format!("{:.2} median", f(&o, "step_median_ms").unwrap_or(f64::NAN))
                )
            );
            match (&theirs, &traceml_err) {
                (Some(s), _) => {
                    let _ = writeln!(
                        side,
                        "{}",
                        row(
                            "TraceML 0.5.0",
                            s,
                            s.get("verdict").map(String::as_str).unwrap_or("?"),
                            &format!("{:.2} mean", f(s, "step_mean_ms").unwrap_or(f64::NAN))
                        )
                    );
                }
                (None, Some(e)) => {
                    let _ = writeln!(
                        side,
                        "| TraceML | could not run: {} | | | | | | |",
                        e.replace('\n', " ").replace('|', "/")
                    );
                }
                _ => {}
            }
        }
    } else {
        let _ = writeln!(
            realistic,
            "| real PyTorch CPU | not run: no virtualenv with torch (`cargo xtask setup --torch`) | | | | | | |"
        );
    }

    // 1c. Storms: ns added per call.
    let mut storms = String::new();
    let modes: [(&str, &str, &[&str], &str); 6] = [
        (
            "pyframe",
            "frame evaluator entered from C (uninteresting code: py_enter + return probe, no event)",
            &[],
            "1 enter + 1 return",
        ),
        (
            "module",
            "`Module.__call__` of an empty module (classified frames: events)",
            &[],
            "see events/call",
        ),
        (
            "launch",
            "`cudaLaunchKernel`, `--launch-mode events`",
            &[],
            "1 launch",
        ),
        (
            "launch",
            "`cudaLaunchKernel`, `--launch-mode count`",
            &["--launch-mode", "count"],
            "1 launch",
        ),
        (
            "sync",
            "`cudaStreamSynchronize` (copy/sync call: enter + return)",
            &[],
            "1 enter + 1 return",
        ),
        (
            "record",
            "`record_function` enter + exit (native)",
            &[],
            "1 enter + 1 exit",
        ),
    ];
    for (mode, what, extra, hits) in modes {
        // Each launch queues an operation on the stand-in's device thread, which drains slowly on
        // two busy cores: fewer launches keep the run short (the loop itself is timed alone).
        let n = if mode == "launch" {
            plan.storm_n / 5
        } else {
            plan.storm_n
        };
        let args = vec![
            format!("{bench_dir}/storm.py"),
            "--mode".into(),
            mode.into(),
            "--n".into(),
            n.to_string(),
            "--reps".into(),
            plan.storm_reps.to_string(),
        ];
        let (mut diffs, mut base, mut evs, mut lost) = (vec![], vec![], vec![], vec![]);
        for i in 0..plan.pairs {
            eprintln!(
                "xtask bench: storm {mode} {extra:?}, pair {}/{}",
                i + 1,
                plan.pairs
            );
            let py = ctx.py.clone();
            let a = ctx.run(&format!("storm-{mode}-a"), &py, &args, None)?;
            let b = ctx.run(&format!("storm-{mode}-b"), &py, &args, Some(extra))?;
            let (na, nb) = (
                storm_ns(&a.last_line).context("storm output")?,
                storm_ns(&b.last_line).context("storm output")?,
            );
            diffs.push(nb - na);
            base.push(na);
            let d = b.daemon.unwrap();
            evs.push(f(&d.summary, "events").unwrap_or(0.0) / (n as f64 * plan.storm_reps as f64));
            lost.push(f(&d.summary, "lost_ratio").unwrap_or(0.0));
        }
        let (m, lo, hi) = mmm(&diffs);
        let nhits = if hits.starts_with("1 enter") {
            2.0
        } else if hits.starts_with("1 launch") {
            1.0
        } else {
            f64::NAN
        };
        let per_hit = m / nhits;
        let verdict = if per_hit.is_nan() {
            "—".to_owned()
        } else {
            pass(per_hit <= 1000.0).to_owned()
        };
        let _ = writeln!(
            storms,
            "| {what} | {hits} | {:.0} | {m:.0} | {lo:.0} | {hi:.0} | {} | {:.2} | {:.4} | {verdict} |",
            med(&base),
            if per_hit.is_nan() {
                "—".to_owned()
            } else {
                format!("{per_hit:.0}")
            },
            med(&evs),
            med(&lost)
        );
    }

    // 2. Footprint: a long realistic run with recording.
    eprintln!(
        "xtask bench: footprint run ({} steps)",
        plan.footprint_steps
    );
    let args = vec![
        format!("{bench_dir}/realistic.py"),
        "--step-ms".into(),
        "20".into(),
        "--steps".into(),
        plan.footprint_steps.to_string(),
    ];
    let py = ctx.py.clone();
    let fp = ctx.run("footprint", &py, &args, Some(&rec))?;
    let fp_steps = f(fp.truth.as_ref().unwrap(), "steps").unwrap_or(0.0);
    let fpd = fp.daemon.unwrap();
    attach_times.push((
        "stand-in runtime + fake torch".into(),
        fpd.attach_s,
        fpd.verdict_s.unwrap_or(f64::NAN),
    ));

    // 4. Accuracy on the ground-truth scenarios.
    let mut acc = String::new();
    let mut right = (0, 0);
    let mut scen: Vec<(String, PathBuf, Vec<String>)> = [
        "input_bound_single",
        "input_bound_workers",
        "h2d_bound",
        "compute_bound",
        "residual_heavy",
        "balanced",
    ]
    .iter()
    .map(|s| {
        (
            s.to_string(),
            ctx.py.clone(),
            vec![format!("tests/workloads/{s}.py")],
        )
    })
    .collect();
    if let Some(tp) = &ctx.torch_py {
        for (s, w) in [
            ("input_bound", "0"),
            ("input_bound", "2"),
            ("residual_heavy", "0"),
            ("balanced", "0"),
        ] {
            scen.push((
                format!(
                    "real_{s}{}",
                    if w == "0" {
                        String::new()
                    } else {
                        format!(" (workers {w})")
                    }
                ),
                tp.clone(),
                vec![
                    "tests/workloads/real_torch_train.py".into(),
                    "--scenario".into(),
                    s.into(),
                    "--workers".into(),
                    w.into(),
                ],
            ));
        }
    }
    if quick {
        // Development run: one scenario of each kind.
        scen.retain(|(n, _, _)| {
            ["input_bound_single", "compute_bound", "real_balanced"].contains(&n.as_str())
        });
    }
    for (name, py, args) in scen {
        eprintln!("xtask bench: accuracy {name}");
        let r = ctx.run(
            &format!("acc-{}", name.replace([' ', '(', ')'], "")),
            &py,
            &args,
            Some(&rec),
        )?;
        let t = r.truth.unwrap_or_default();
        let d = r.daemon.unwrap();
        let o = &d.summary;
        let expected = t.get("expected").cloned().unwrap_or_default();
        let want = match expected.as_str() {
            "gpu_bound" => "COMPUTE_BOUND".to_owned(),
            e => e.to_uppercase(),
        };
        let got = o.get("verdict").cloned().unwrap_or_default();
        right.1 += 1;
        if got == want {
            right.0 += 1;
        }
        let label = if py == ctx.py {
            "stand-in runtime + fake torch"
        } else {
            "real torch 2.15 (CPU)"
        };
        attach_times.push((label.into(), d.attach_s, d.verdict_s.unwrap_or(f64::NAN)));
        let mut row = format!(
            "| `{name}` | {want} | {got} {} | {:.2} / {:.2} |",
            if got == want { "✓" } else { "✗" },
            f(o, "step_median_ms").unwrap_or(f64::NAN),
            f(&t, "step_median_ms").unwrap_or(f64::NAN)
        );
        for p in PHASES {
            let (a, b) = (
                f(o, &format!("{p}_median_ms")),
                f(&t, &format!("{p}_median_ms")),
            );
            let _ = write!(
                row,
                " {} |",
                match (a, b) {
                    (Some(a), Some(b)) => format!("{:+.2}", a - b),
                    _ => "—".into(),
                }
            );
        }
        let _ = writeln!(acc, "{row}");
    }

    // Write BENCHMARKS.md.
    let cpu = sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2");
    let _ = writeln!(md, "# Benchmarks\n");
    let _ = writeln!(
        md,
        "Written by `cargo xtask bench{}` — do not edit by hand; rerun it. Numbers are from **this \
         project's machine**, a small shared VM that was running other builds at the same time: \
         read them as medians of paired runs, not as lab measurements.\n",
        if quick { " --quick" } else { "" }
    );
    let _ = writeln!(md, "## Machine\n");
    let _ = writeln!(md, "| | |\n|---|---|");
    let _ = writeln!(md, "| date (UTC) | {} |", sh("date -u '+%Y-%m-%d %H:%M'"));
    let _ = writeln!(md, "| CPU | {} × {} |", sh("nproc"), cpu.trim());
    let _ = writeln!(
        md,
        "| memory | {} |",
        sh("grep MemTotal /proc/meminfo | tr -s ' ' | cut -d' ' -f2-")
    );
    let _ = writeln!(md, "| kernel | {} |", sh("uname -srm"));
    let _ = writeln!(
        md,
        "| load average (1/5/15 min) at start / end | {} / {} |",
        first3(&load_start),
        first3(&sh("cat /proc/loadavg"))
    );
    let _ = writeln!(
        md,
        "| traceml-daemon | release build, commit {} |",
        sh("git -C . rev-parse --short HEAD")
    );
    let _ = writeln!(
        md,
        "| targets | pyenv CPython {} (stand-in workloads); real torch: {} |",
        sh(&format!("{} -V", ctx.py.display())).replace("Python ", ""),
        ctx.torch_py
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or("none".into())
    );
    let _ = writeln!(
        md,
        "| mode | {} ({} pairs per comparison); bench wall time {:.1} min |",
        if quick { "quick" } else { "full" },
        plan.pairs,
        started.elapsed().as_secs_f64() / 60.0
    );

    let _ = writeln!(md, "\n## Method\n");
    let _ = writeln!(
        md,
        "- Every comparison runs the same workload as a fresh process, alternately **A** (no daemon) \
         and **B** (daemon attached), A B A B …, {} pairs. Each workload prints its pid, waits for a \
         ready file, then trains; in B the daemon writes the ready file once its probes are live \
         (`--ready-file`), in A the bench writes it. The daemon is the release build run as a user \
         would: `traceml-daemon --pid PID --quiet --output DIR` (+ `--record FILE` except in the \
         storms).\n\
         - Step time comes from the workload's own clocks (its truth file: median over steps). \
         Overhead = median over pairs of (B median step / A median step); min and max over pairs \
         show the noise. Per-hit cost = B − A in ns per call of a storm loop (median of {} \
         repetitions of {} calls within a run, a fifth of that for launches, then median/min/max over pairs).\n\
         - Footprint: `/proc/<daemon>/stat` (utime+stime) sampled every 20 ms, from probes live to \
         target exit, as % of one core; peak RSS = `VmHWM`.\n\
         - Time to attach: daemon start → ready file written (probes live). Time to verdict: the \
         target's exit (reaped by the bench) → `final_summary.json` exists. Polled every 3 ms.\n\
         - Accuracy: each ground-truth scenario once with the daemon; per-phase error = daemon's \
         median − truth's median (ms); verdict against the scenario's expected one.\n\
         - Workloads: `tests/workloads/bench/` (`realistic.py`, `storm.py`, `real_torch_loop.py`), \
         `tests/workloads/*.py`.",
        plan.pairs, plan.storm_reps, plan.storm_n
    );

    let _ = writeln!(md, "\n## 1. Overhead on the target\n");
    let _ = writeln!(
        md,
        "Target: ≤ 0.5 % added step time. The stand-in loops are host-bound on purpose (short kernels), so host time added by the probes shows fully.\n"
    );
    let _ = writeln!(
        md,
        "| workload | A step (ms) | B step (ms) | ratio median | min | max | added | ≤ 0.5 % |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    md.push_str(&realistic);
    let _ = writeln!(
        md,
        "\nPer-step content of the stand-in loops (`realistic.py`): 20 ms ≈ 16 Linear layers, ~240 launches; 100 ms ≈ 48 layers, ~680 launches; 500 ms ≈ 96 layers, ~1,300 launches; each step also has a DataLoader `next`, 2 H2D copies, `zero_grad`, `backward`, `step`, `loss.item()` (D2H + sync)."
    );
    let _ = writeln!(md, "\n### Stress: time added per probe hit\n");
    let _ = writeln!(
        md,
        "Target: ≤ 1 µs (1,000 ns) per hit. \"events/call\" = probe events the daemon received per loop iteration; \"lost\" = its lost-event ratio.\n"
    );
    let _ = writeln!(
        md,
        "| storm | hits per call | A ns/call | added ns/call median | min | max | added ns per hit | events/call | lost | ≤ 1 µs per hit |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
    md.push_str(&storms);

    let _ = writeln!(md, "\n## 2. Footprint of the daemon\n");
    let _ = writeln!(
        md,
        "Targets: ≤ 2 % of one core, ≤ 40 MB peak RSS, summary ≤ 50 KB, recording ≤ 1 MB per 1,000 steps.\n"
    );
    let _ = writeln!(
        md,
        "| run | steps | CPU % of one core (probes live → target exit) | attach CPU s | peak RSS MB (VmHWM) | peak anon RSS MB | summary bytes | recording bytes / 1,000 steps |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    let fp_row = |name: &str, d: &DaemonStats, steps: f64| {
        format!(
            "| {name} | {steps:.0} | {:.2} | {:.2} | {:.1} | {:.1} | {} | {:.0} |",
            100.0 * d.steady_cpu_s / d.steady_s.max(1e-9),
            d.attach_cpu_s,
            d.hwm_kb as f64 / 1024.0,
            d.anon_kb as f64 / 1024.0,
            d.summary_bytes,
            d.recording_bytes as f64 * 1000.0 / steps.max(1.0)
        )
    };
    let _ = writeln!(
        md,
        "{}",
        fp_row(
            &format!(
                "**long run**: realistic 20 ms, {} steps",
                plan.footprint_steps
            ),
            &fpd,
            fp_steps
        )
    );
    let mut groups: Vec<String> = footprints.iter().map(|(n, _, _)| n.clone()).collect();
    groups.dedup();
    for g in &groups {
        let runs: Vec<&(String, DaemonStats, f64)> =
            footprints.iter().filter(|(n, _, _)| n == g).collect();
        let cpu_s: f64 = runs.iter().map(|r| r.1.steady_cpu_s).sum();
        let wall: f64 = runs.iter().map(|r| r.1.steady_s).sum();
        let agg = DaemonStats {
            steady_cpu_s: cpu_s,
            steady_s: wall,
            attach_cpu_s: med(&runs.iter().map(|r| r.1.attach_cpu_s).collect::<Vec<_>>()),
            hwm_kb: runs.iter().map(|r| r.1.hwm_kb).max().unwrap_or(0),
            anon_kb: runs.iter().map(|r| r.1.anon_kb).max().unwrap_or(0),
            summary_bytes: runs.iter().map(|r| r.1.summary_bytes).max().unwrap_or(0),
            recording_bytes: med(&runs
                .iter()
                .map(|r| r.1.recording_bytes as f64 * 1000.0 / r.2.max(1.0))
                .collect::<Vec<_>>()) as u64,
            ..Default::default()
        };
        let _ = writeln!(
            md,
            "{}",
            fp_row(
                &format!("{g} (B runs, CPU pooled, RSS/summary max)"),
                &agg,
                1000.0
            )
        );
    }
    let cpu_pct = 100.0 * fpd.steady_cpu_s / fpd.steady_s.max(1e-9);
    let rec_per_k = fpd.recording_bytes as f64 * 1000.0 / fp_steps.max(1.0);
    let max_rss = footprints
        .iter()
        .map(|r| r.1.hwm_kb)
        .chain([fpd.hwm_kb])
        .max()
        .unwrap_or(0) as f64
        / 1024.0;
    let max_sum = footprints
        .iter()
        .map(|r| r.1.summary_bytes)
        .chain([fpd.summary_bytes])
        .max()
        .unwrap_or(0);
    let _ = writeln!(
        md,
        "\nLong run against the targets: CPU {cpu_pct:.2} % ({}), peak RSS over all runs {max_rss:.1} MB ({}), \
         largest summary {max_sum} bytes ({}), recording {:.0} KB / 1,000 steps ({}). CPU ticks are \
         {} Hz, so short runs are coarse; the long run and the pooled rows are the ones to read.",
        pass(cpu_pct <= 2.0),
        pass(max_rss <= 40.0),
        pass(max_sum <= 50_000),
        rec_per_k / 1000.0,
        pass(rec_per_k <= 1_000_000.0),
        ctx.clk_tck
    );

    let _ = writeln!(md, "\n## 3. Time to attach and time to verdict\n");
    let _ = writeln!(
        md,
        "| target | runs | attach s median | min | max | verdict s median | min | max |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    let mut kinds: Vec<String> = attach_times.iter().map(|a| a.0.clone()).collect();
    kinds.sort();
    kinds.dedup();
    for k in kinds {
        let at: Vec<f64> = attach_times
            .iter()
            .filter(|a| a.0 == k)
            .map(|a| a.1)
            .collect();
        let vt: Vec<f64> = attach_times
            .iter()
            .filter(|a| a.0 == k)
            .map(|a| a.2)
            .collect();
        let (a1, a2, a3) = mmm(&at);
        let (v1, v2, v3) = mmm(&vt);
        let _ = writeln!(
            md,
            "| {k} | {} | {a1:.3} | {a2:.3} | {a3:.3} | {v1:.3} | {v2:.3} | {v3:.3} |",
            at.len()
        );
    }

    let _ = writeln!(md, "\n## 4. Accuracy on the ground-truth scenarios\n");
    let _ = writeln!(
        md,
        "Verdicts right: **{} of {}**. Phase columns: daemon median − truth median, ms.\n",
        right.0, right.1
    );
    let _ = write!(
        md,
        "| scenario | expected | verdict | step ms daemon / truth |"
    );
    for p in PHASES {
        let _ = write!(md, " {p} |");
    }
    let _ = writeln!(md, "\n|---|---|---|---|---|---|---|---|---|---|---|");
    md.push_str(&acc);

    let _ = writeln!(md, "\n## 5. Side by side with TraceML (`traceml-ai`)\n");
    match &ctx.traceml {
        Ok(bin) => {
            let _ = writeln!(
                md,
                "TraceML {TRACEML_PIN} from PyPI in its own venv ({}), with the same torch. Used as its \
                 README documents for a plain PyTorch loop: `import traceml_ai as traceml; \
                 traceml.init(mode=\"auto\")` and `with traceml.trace_step(model):` around the step \
                 (`real_torch_loop.py --traceml`), launched with `traceml run real_torch_loop.py --args …`. \
                 TraceML's phases are its window averages (means); ours and the truth's shares are totals \
                 over steps / total step time. The daemon needs no change to the script and no restart.\n",
                bin.display()
            );
        }
        Err(e) => {
            let _ = writeln!(md, "TraceML could not run here: {e}\n");
        }
    }
    let _ = writeln!(
        md,
        "Step time with each tool (median of the workload's own step medians over {} rounds of plain / daemon / TraceML):\n",
        plan.pairs
    );
    let _ = writeln!(
        md,
        "| scenario | plain step ms | traceml-daemon attached | TraceML | process wall s plain / daemon / TraceML |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|");
    md.push_str(&side_overhead);
    let _ = writeln!(md, "\nPhase shares (first round):");
    md.push_str(&side);
    cmp.retain(|c| !c.3.is_empty());
    if !cmp.is_empty() {
        let canon = |v: &str| match v {
            "NO_CLEAR_PERFORMANCE_BOTTLENECK" => "BALANCED".to_owned(),
            v => v.to_owned(),
        };
        let ours_right = cmp.iter().filter(|c| c.2 == c.1).count();
        let theirs_right = cmp.iter().filter(|c| canon(&c.3) == c.1).count();
        let _ = writeln!(md, "\n### Where each is ahead\n");
        let _ = writeln!(
            md,
            "- Verdicts against the expected one: traceml-daemon {ours_right} of {n}, TraceML {theirs_right} of {n} \
             (TraceML's `NO_CLEAR_PERFORMANCE_BOTTLENECK` counted as balanced).",
            n = cmp.len()
        );
        for c in cmp.iter().filter(|c| canon(&c.3) != c.1) {
            let _ = writeln!(
                md,
                "- `{}`: TraceML says {} with a {:.2} ms step while the script's clocks say {:.2} ms: its step \
                 is the DataLoader fetch plus the `trace_step` block, so time the loop spends after that \
                 block (here the residual sleep, where a log or checkpoint call would sit) is not in its step.",
                c.0, c.3, c.6, c.7
            );
        }
        let lower: Vec<&str> = cmp
            .iter()
            .filter(|c| c.5 < c.4)
            .map(|c| c.0.as_str())
            .collect();
        let _ = writeln!(
            md,
            "- Added step time (median of rounds): {}. TraceML's in-process hooks cost less than the \
             daemon's probes on: {}. Both are at the noise level of this machine on some rows; read \
             min/max above.",
            cmp.iter()
                .map(|c| format!("`{}` daemon {:+.2} % / TraceML {:+.2} %", c.0, c.4, c.5))
                .collect::<Vec<_>>()
                .join(", "),
            if lower.is_empty() {
                "none".to_owned()
            } else {
                lower.join(", ")
            }
        );
        let _ = writeln!(
            md,
            "- TraceML is ahead by design on: no root, no eBPF and no uprobe-capable Linux kernel \
             needed (anything that runs Python); per-step GPU memory (allocated/reserved) through \
             torch; multi-rank (DDP) straggler diagnosis; trainer integrations (Hugging Face, \
             Lightning, …), live CLI/dashboard views, HTML report, W&B/MLflow export and a CI \
             regression gate. None of those are measured here (no GPU, one process).\n\
             - traceml-daemon is ahead on: no change to the script and no restart (attach by pid), \
             phases measured from the whole loop rather than a traced block, per-call CUDA launch, \
             copy and sync attribution at the runtime (GPU-side numbers: not yet validated on a GPU)."
        );
    }
    md.push_str(NOTES);
    std::fs::write(root.join("BENCHMARKS.md"), &md).context("writing BENCHMARKS.md")?;
    eprintln!(
        "xtask bench: wrote BENCHMARKS.md in {:.1} min (raw runs in {})",
        started.elapsed().as_secs_f64() / 60.0,
        ctx.scratch.display()
    );
    Ok(())
}

/// Facts behind the numbers that do not change from run to run.
const NOTES: &str = "
## Reading the numbers

- A uprobe whose first instruction the kernel can emulate (`push`) costs about 0.6–0.8 µs on \
  this VM; a uretprobe adds about 0.45 µs; an instruction the kernel must single-step out of \
  line costs about 10 µs (`../shared/TOOLCHAIN.md`). \"Enter + return\" storms are two hits per \
  call, so their per-hit column is half the per-call cost.
- The stand-in launch storm also wakes the simulated device thread for each launch; on 2 busy \
  cores that makes its A/B difference noisy (see min/max).
- Peak RSS (`VmHWM`) counts file-backed pages the daemon maps or reads (ELF symbol tables of \
  `libtorch_cpu.so` are hundreds of MB); the anon column is its own heap.
- The daemon keeps every stream item (56 bytes each) in memory until the target exits (`items` in \
  `traceml-daemon/src/main.rs`), so its heap grows with the run: compare the long run's anon RSS \
  with the short runs'. ELF files are memory-mapped (`attach/elf.rs`): the pages of \
  `libtorch_cpu.so`'s symbol tables it reads count in VmHWM as file-backed, not in the anon column.
- Time to verdict: the probes are detached on a background thread after the stream's last item, \
  so the summary no longer waits for the kernel's teardown of hundreds of uprobes (~2 s).
- TraceML runs the script under `torch.distributed.run` with an aggregator process, so its \
  process wall time includes that start-up; step times are from the script's own clocks in all \
  three columns.
";

fn first3(s: &str) -> String {
    s.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// One `traceml run` of real_torch_loop.py with its two lines on; returns the truth, TraceML's
/// summary and the wall time of the whole `traceml run`.
fn run_traceml(ctx: &mut Ctx, sc: &str) -> anyhow::Result<(Kv, Kv, f64)> {
    let bin = ctx.traceml.clone().map_err(anyhow::Error::msg)?;
    let dir = ctx.dir(&format!("traceml-{sc}"))?;
    let truth = dir.join("truth.json");
    let t0 = Instant::now();
    let status = Command::new(&bin)
        .arg("run")
        .arg("--logs-dir")
        .arg(dir.join("logs"))
        .args(["--run-name", "run"])
        .arg(root().join("tests/workloads/bench/real_torch_loop.py"))
        .args(["--args", "--traceml", "--scenario", sc, "--truth"])
        .arg(&truth)
        .current_dir(&dir)
        .stdout(File::create(dir.join("traceml.stdout"))?)
        .stderr(File::create(dir.join("traceml.stderr"))?)
        .status()
        .context("starting traceml run")?;
    let wall = t0.elapsed().as_secs_f64();
    if !status.success() {
        bail!("`traceml run` failed ({status}); see {}", dir.display());
    }
    let summary = dir.join("logs/run/final_summary.json");
    Ok((
        ctx.json("truth", &truth)?,
        ctx.json("traceml", &summary)?,
        wall,
    ))
}
