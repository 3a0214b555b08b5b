//! Runs of the bench: starting workloads that speak the ready/truth protocol, attaching the
//! daemon and sampling its /proc footprint, the virtualenvs (torch, TraceML) and `traceml run`.
//! Everything here starts processes or touches files; the numbers are computed in `stats`.
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use super::stats::Kv;
use crate::{root, run, setup};

pub const TRACEML_PIN: &str = "traceml-ai==0.5.0";

/// What every run needs: the interpreters, the daemon binary, the scratch directory (one numbered
/// folder per run) and the environment `setup` prepared.
pub struct Ctx {
    pub py: PathBuf,
    pub torch_py: Option<PathBuf>,
    pub traceml: Result<PathBuf, String>,
    pub daemon: PathBuf,
    pub scratch: PathBuf,
    pub env: setup::TestEnv,
    pub clk_tck: f64,
    pub n: u32,
}

/// Daemon measurements of one run.
#[derive(Default, Clone)]
pub struct DaemonStats {
    pub attach_s: f64,
    pub verdict_s: Option<f64>,
    /// CPU seconds and wall seconds from probes live to target exit.
    pub steady_cpu_s: f64,
    pub steady_s: f64,
    pub attach_cpu_s: f64,
    pub hwm_kb: u64,
    /// Peak of RssAnon over the samples (heap, without file-backed pages).
    pub anon_kb: u64,
    pub summary_bytes: u64,
    pub recording_bytes: u64,
    pub summary: Kv,
}

/// One run of a workload: its last stdout line, its truth file and the daemon's numbers (when
/// attached).
pub struct RunOut {
    pub last_line: String,
    pub truth: Option<Kv>,
    pub daemon: Option<DaemonStats>,
    pub wall_s: f64,
}

/// Kills and reaps the child (a workload or the daemon) when a run fails half-way.
pub struct Killer(pub Option<Child>);
impl Drop for Killer {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// (CPU seconds, VmHWM kB, RssAnon kB) of a process.
pub fn proc_sample(pid: u32, clk: f64) -> Option<(f64, u64, u64)> {
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
    pub fn dir(&mut self, label: &str) -> anyhow::Result<PathBuf> {
        self.n += 1;
        let d = self.scratch.join(format!("{:04}-{label}", self.n));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d)?;
        Ok(d)
    }

    pub fn json(&self, kind: &str, file: &Path) -> anyhow::Result<Kv> {
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
    pub fn run(
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

    pub fn attach(
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

/// A number after `"key": ` following `after` in a JSON text (xtask has no JSON parser; the
/// daemon's summaries and the truths are pretty-printed or compact, both work).
pub fn number_after(text: &str, after: &str, key: &str) -> Option<u64> {
    let rest = &text[text.find(after)?..];
    let rest = &rest[rest.find(&format!("\"{key}\":"))? + key.len() + 3..];
    let rest = rest.trim_start();
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

pub fn sh(cmd: &str) -> String {
    Command::new("sh")
        .args(["-c", cmd])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

pub fn torch_python() -> Option<PathBuf> {
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
pub fn traceml_venv(torch_py: &Path) -> anyhow::Result<PathBuf> {
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

/// One `traceml run` of real_torch_loop.py with its two lines on; returns the truth, TraceML's
/// summary and the wall time of the whole `traceml run`.
pub fn run_traceml(ctx: &mut Ctx, sc: &str) -> anyhow::Result<(Kv, Kv, f64)> {
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

/// CLOCK_MONOTONIC in ns: the clock of the workloads' steps logs (`time.monotonic_ns()`) and of
/// the daemon's events. `Instant` reads the same clock but does not expose its value.
pub fn monotonic_ns() -> u64 {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    unsafe extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    const CLOCK_MONOTONIC: i32 = 1;
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: clock_gettime (libc, linked by std) writes one timespec (two longs on x86_64 Linux)
    // into the pointer it is given, which points to a live, properly aligned local.
    let rc = unsafe { clock_gettime(CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    ts.sec as u64 * 1_000_000_000 + ts.nsec as u64
}
