//! The long-lived daemon's own cost (`--service-only`): `serve` with 8 jobs attached at once
//! (its CPU as a share of one core and its memory over a steady window, issue 12's budget:
//! ≤ 2 % of a core, ≤ 40 MB of anonymous memory), and `--long-live-only`: one `--pid` daemon on
//! a job of about an hour, its `RssAnon` sampled every 10 s. The workload is
//! `tests/workloads/bench/service_job.py` (~100 ms fake-torch steps, mostly asleep in the
//! DataLoader, so the jobs leave the cores to the daemon). Each run checks the daemon's step
//! counts against the workloads' truth, so the numbers are for runs that did their work.
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};

use super::runs::{Ctx, Killer, number_after, proc_sample};
use crate::root;

/// Jobs attached at once.
pub const JOBS: usize = 8;
/// Steps of each of the 8 jobs (~100 ms each).
const JOB_STEPS: u32 = 900;
/// The steady window the serve CPU is measured over (all jobs attached and stepping).
const WINDOW: Duration = Duration::from_secs(60);

/// (CPU seconds, VmHWM kB, RssAnon kB) at a time since the start.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub t_s: f64,
    pub cpu_s: f64,
    pub hwm_kb: u64,
    pub anon_kb: u64,
}

fn sample(pid: u32, clk: f64, t0: Instant) -> Option<Sample> {
    proc_sample(pid, clk).map(|(cpu_s, hwm_kb, anon_kb)| Sample {
        t_s: t0.elapsed().as_secs_f64(),
        cpu_s,
        hwm_kb,
        anon_kb,
    })
}

/// Steps the daemon counted (`steps.count` of a summary).
fn counted(summary: &Path) -> anyhow::Result<u64> {
    let text = std::fs::read_to_string(summary)
        .with_context(|| format!("reading {}", summary.display()))?;
    number_after(&text, "\"steps\": {", "count").context("steps.count")
}

/// Steps the workload ran (`step_count` of its truth).
fn truth_steps(truth: &Path) -> anyhow::Result<u64> {
    let text =
        std::fs::read_to_string(truth).with_context(|| format!("reading {}", truth.display()))?;
    number_after(&text, "{", "step_count").context("step_count")
}

fn workload(ctx: &Ctx, dir: &Path, i: usize, steps: u32) -> anyhow::Result<Killer> {
    let mut cmd = Command::new(&ctx.py);
    cmd.arg(root().join("tests/workloads/bench/service_job.py"))
        .args(["--steps", &steps.to_string(), "--ready"])
        .arg(dir.join(format!("ready-{i}")))
        .arg("--truth")
        .arg(dir.join(format!("truth-{i}.json")))
        .current_dir(root())
        .stdout(Stdio::null())
        .stderr(File::create(dir.join(format!("job-{i}.stderr")))?);
    ctx.env.apply(&mut cmd);
    Ok(Killer(Some(
        cmd.spawn().context("starting service_job.py")?,
    )))
}

pub struct ServeBench {
    pub jobs: usize,
    pub attach_all_s: f64,
    pub window: (Sample, Sample),
    pub peak_anon_kb: u64,
    pub peak_hwm_kb: u64,
    /// (daemon's count, truth's steps) per job.
    pub steps: Vec<(u64, u64)>,
}

/// `serve` with [`JOBS`] jobs attached at once.
pub fn eight_jobs(ctx: &mut Ctx) -> anyhow::Result<ServeBench> {
    let dir = ctx.dir("serve-8-jobs")?;
    let state = dir.join("state");
    let (ready, log) = (dir.join("serving"), dir.join("serve.log"));
    let mut serve = Killer(Some(
        Command::new(&ctx.daemon)
            .arg("serve")
            .arg("--state-dir")
            .arg(&state)
            .args(["--include", "*service_job.py*", "--ready-file"])
            .arg(&ready)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(File::create(&log)?)
            .spawn()
            .context("starting serve")?,
    ));
    let spid = serve.0.as_ref().unwrap().id();
    let t0 = Instant::now();
    while !ready.exists() {
        ensure!(
            t0.elapsed() < Duration::from_secs(10),
            "serve did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut jobs = (0..JOBS)
        .map(|i| workload(ctx, &dir, i, JOB_STEPS))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let pids: Vec<u32> = jobs.iter().map(|j| j.0.as_ref().unwrap().id()).collect();
    let attach_all_s = release_when_attached(&pids, &dir, &log)?;
    let (mut peak_anon_kb, mut peak_hwm_kb) = (0, 0);
    let clk = ctx.clk_tck;
    let mut watch = |until: Instant| -> Option<Sample> {
        let mut last = None;
        while Instant::now() < until {
            if let Some(s) = sample(spid, clk, t0) {
                peak_anon_kb = peak_anon_kb.max(s.anon_kb);
                peak_hwm_kb = peak_hwm_kb.max(s.hwm_kb);
                last = Some(s);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        last
    };
    // 5 s for the governor to detach the frame-evaluator probes, then the steady window.
    let a = watch(Instant::now() + Duration::from_secs(5)).context("serve vanished")?;
    let b = watch(Instant::now() + WINDOW).context("serve vanished")?;
    for (i, j) in jobs.iter_mut().enumerate() {
        let st = j.0.as_mut().unwrap().wait()?;
        j.0 = None;
        ensure!(st.success(), "job {i} failed: {st}");
    }
    // Every job's final summary, then SIGTERM.
    let summaries = final_summaries(&pids, &state, &log)?;
    sigterm(spid);
    let st = serve.0.as_mut().unwrap().wait()?;
    serve.0 = None;
    ensure!(st.success(), "serve exited with {st}");
    let steps = summaries
        .iter()
        .enumerate()
        .map(|(i, s)| {
            Ok((
                counted(s)?,
                truth_steps(&dir.join(format!("truth-{i}.json")))?,
            ))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    for (i, (n, truth)) in steps.iter().enumerate() {
        ensure!(
            *n + 1 >= *truth && n <= truth,
            "job {i}: the daemon counted {n} steps of the {truth} the job ran"
        );
    }
    Ok(ServeBench {
        jobs: JOBS,
        attach_all_s,
        window: (a, b),
        peak_anon_kb,
        peak_hwm_kb,
        steps,
    })
}

/// Each job of `pids` starts stepping (its ready file under `dir`) once serve says in `log`
/// that it is attached to it; the seconds until the last one was.
fn release_when_attached(pids: &[u32], dir: &Path, log: &Path) -> anyhow::Result<f64> {
    let mut released = [false; JOBS];
    let t_start = Instant::now();
    while released.iter().any(|r| !r) {
        ensure!(
            t_start.elapsed() < Duration::from_secs(180),
            "serve did not attach to every job; see {}",
            log.display()
        );
        let text = std::fs::read_to_string(log).unwrap_or_default();
        for (i, pid) in pids.iter().enumerate() {
            if !released[i] && text.contains(&format!("attached to {pid} in")) {
                std::fs::write(dir.join(format!("ready-{i}")), b"")?;
                released[i] = true;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(t_start.elapsed().as_secs_f64())
}

/// The final summary of each of `pids` under `state`, waited for up to 20 s each.
fn final_summaries(pids: &[u32], state: &Path, log: &Path) -> anyhow::Result<Vec<PathBuf>> {
    pids.iter()
        .map(|pid| {
            let t = Instant::now();
            loop {
                let found = std::fs::read_dir(state).ok().and_then(|d| {
                    d.flatten()
                        .map(|e| e.path())
                        .find(|p| p.to_string_lossy().contains(&format!("-{pid}-")))
                        .map(|p| p.join("final_summary.json"))
                        .filter(|p| p.exists())
                });
                if let Some(f) = found {
                    return Ok(f);
                }
                if t.elapsed() > Duration::from_secs(20) {
                    bail!("no final summary for pid {pid}; see {}", log.display());
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
        .collect()
}

/// SIGTERM to `pid` (xtask has no libc binding).
pub fn sigterm(pid: u32) {
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
}

pub struct LongBench {
    pub steps_truth: u64,
    pub steps_counted: u64,
    pub samples: Vec<Sample>,
}

/// One `--pid` daemon on a job of `steps` steps (~100 ms each).
pub fn long_live(ctx: &mut Ctx, steps: u32) -> anyhow::Result<LongBench> {
    let dir = ctx.dir("long-live")?;
    let mut job = workload(ctx, &dir, 0, steps)?;
    let pid = job.0.as_ref().unwrap().id();
    let out = dir.join("out");
    let mut d = Killer(Some(
        Command::new(&ctx.daemon)
            .args(["--pid", &pid.to_string(), "--quiet", "--output"])
            .arg(&out)
            .arg("--ready-file")
            .arg(dir.join("ready-0"))
            .stdout(File::create(dir.join("daemon.stdout"))?)
            .stderr(File::create(dir.join("daemon.stderr"))?)
            .spawn()
            .context("starting the daemon")?,
    ));
    let dpid = d.0.as_ref().unwrap().id();
    let t0 = Instant::now();
    let mut samples = Vec::new();
    let mut next = Duration::ZERO;
    let status = loop {
        if let Some(st) = d.0.as_mut().unwrap().try_wait()? {
            d.0 = None;
            break st;
        }
        // A zombie's status has no RssAnon (read as 0): the daemon exited between the two
        // checks; that is not a sample.
        if t0.elapsed() >= next
            && let Some(s) = sample(dpid, ctx.clk_tck, t0).filter(|s| s.anon_kb > 0)
        {
            samples.push(s);
            next += Duration::from_secs(10);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    ensure!(status.success(), "the daemon failed: {status}");
    let st = job.0.as_mut().unwrap().wait()?;
    job.0 = None;
    ensure!(st.success(), "the job failed: {st}");
    let steps_truth = truth_steps(&dir.join("truth-0.json"))?;
    let steps_counted = counted(&out.join("final_summary.json"))?;
    ensure!(
        steps_counted + 1 >= steps_truth && steps_counted <= steps_truth,
        "the daemon counted {steps_counted} steps of the {steps_truth} the job ran"
    );
    ensure!(samples.len() >= 2, "the run was too short to sample");
    // The raw series, for a second look.
    let csv: String = std::iter::once("t_s,cpu_s,rss_anon_kb,vm_hwm_kb\n".to_owned())
        .chain(
            samples
                .iter()
                .map(|s| format!("{:.1},{:.2},{},{}\n", s.t_s, s.cpu_s, s.anon_kb, s.hwm_kb)),
        )
        .collect();
    std::fs::write(dir.join("samples.csv"), csv)?;
    Ok(LongBench {
        steps_truth,
        steps_counted,
        samples,
    })
}

pub const SERVE_HEADING: &str = "## Long-lived daemon: 8 jobs attached at once under `serve`";
pub const LONG_HEADING: &str = "## Long-lived daemon: one job over a long run";

fn intro(heading: &str, flag: &str, daemon: &str, load: &str) -> String {
    format!(
        "{heading}\n\n\
         Written by `cargo xtask bench {flag}`; `{daemon}`; workload \
         `tests/workloads/bench/service_job.py` (fake torch on the stand-in CUDA runtime, ~100 ms \
         steps, ~5 ms of them on the CPU). Load average before: {load}. The run checks the \
         daemon's step counts against the workloads' truth.\n\n"
    )
}

fn mb(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

pub fn serve_section(b: &ServeBench, daemon: &str, load: &str) -> String {
    let mut s = intro(SERVE_HEADING, "--service-only", daemon, load);
    {
        let (a, z) = b.window;
        let cpu = (z.cpu_s - a.cpu_s) / (z.t_s - a.t_s) * 100.0;
        let counts: Vec<String> = b.steps.iter().map(|(n, t)| format!("{n}/{t}")).collect();
        s += &format!(
            "`serve --include '*service_job.py*'` with {} jobs started at once ({JOB_STEPS} steps \
             each); every job attached within {:.1} s; the window starts 5 s after the last \
             attach. Budget (issue 12): ≤ 2 % of a core, ≤ 40 MB plus file-backed mappings.\n\n\
             | jobs | serve CPU over {:.0} s (% of one core) | RssAnon peak | VmHWM peak (with file-backed) | steps counted / run, per job |\n\
             |---|---|---|---|---|\n\
             | {} | **{:.2} %** | **{:.1} MB** | {:.1} MB | {} |\n\n",
            b.jobs,
            b.attach_all_s,
            z.t_s - a.t_s,
            b.jobs,
            cpu,
            mb(b.peak_anon_kb),
            mb(b.peak_hwm_kb),
            counts.join(", "),
        );
    }
    s
}

pub fn long_section(l: &LongBench, daemon: &str, load: &str) -> String {
    let mut s = intro(LONG_HEADING, "--long-minutes M", daemon, load);
    {
        let first = l
            .samples
            .iter()
            .find(|x| x.t_s >= 10.0)
            .unwrap_or(&l.samples[0]);
        let last = l.samples.last().unwrap();
        let mid = l
            .samples
            .iter()
            .find(|x| x.t_s >= last.t_s / 2.0)
            .unwrap_or(last);
        let peak = l.samples.iter().map(|x| x.anon_kb).max().unwrap_or(0);
        let cpu = (last.cpu_s - first.cpu_s) / (last.t_s - first.t_s) * 100.0;
        s += &format!(
            "`traceml-daemon --pid` on one job of {} steps ({:.0} min); `RssAnon` every 10 s.\n\n\
             | steps counted / run | RssAnon at {:.0} s | at {:.0} min | at the end ({:.0} min) | peak | growth | daemon CPU (% of one core) |\n\
             |---|---|---|---|---|---|---|\n\
             | {}/{} | {:.1} MB | {:.1} MB | {:.1} MB | {:.1} MB | **{:+.2} MB** | {:.2} % |\n",
            l.steps_truth,
            last.t_s / 60.0,
            first.t_s,
            mid.t_s / 60.0,
            last.t_s / 60.0,
            l.steps_counted,
            l.steps_truth,
            mb(first.anon_kb),
            mb(mid.anon_kb),
            mb(last.anon_kb),
            mb(peak),
            mb(last.anon_kb) - mb(first.anon_kb),
            cpu,
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_numbers_after_a_key() {
        let j = "{\n  \"steps\": {\n    \"count\": 9999,\n  },\n  \"x\": {\"count\": 3}}";
        assert_eq!(number_after(j, "\"steps\": {", "count"), Some(9999));
        assert_eq!(number_after(j, "\"x\"", "count"), Some(3));
        assert_eq!(number_after(j, "\"y\"", "count"), None);
    }

    #[test]
    fn reads_counts() {
        let j = "{\n  \"steps\": {\n    \"count\": 899,\n  }}";
        assert_eq!(number_after(j, "\"steps\": {", "count"), Some(899));
        let t = "{\"format\": 1, \"step_count\": 900, \"steps\": []}";
        assert_eq!(number_after(t, "{", "step_count"), Some(900));
    }
}
