//! The streaming engine's memory over run length: a synthetic recording of 10 M steps
//! (`traceml-daemon/examples/synth_recording.rs`, ~1 ms steps of the markers probe set) piped
//! into the release daemon's `replay /dev/stdin`, the same fold a live run uses. The daemon's
//! `RssAnon` is sampled every 200 ms; the section quotes it 10 s in and at the last sample
//! before the summary, and the peak. The run checks that the summary counted every step the
//! generator wrote (N: its stream starts at a step's start with every library's probes in place,
//! so the first step is whole, not an attach fragment, and each step ends at its sync), so the
//! number is for a replay that did its work.
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};

use super::runs::{number_after, proc_sample};

/// Steps in the synthetic recording.
pub const STEPS: u64 = 10_000_000;

pub struct ReplayBench {
    pub steps: u64,
    pub counted: u64,
    pub events: u64,
    pub collectives: u64,
    pub wall_s: f64,
    /// (seconds since start, RssAnon kB) of every sample.
    pub rss: Vec<(f64, u64)>,
}

impl ReplayBench {
    fn at(&self, s: f64) -> u64 {
        self.rss
            .iter()
            .find(|(t, _)| *t >= s)
            .or(self.rss.last())
            .map(|r| r.1)
            .unwrap_or(0)
    }
    fn last(&self) -> u64 {
        self.rss.last().map(|r| r.1).unwrap_or(0)
    }
    fn peak(&self) -> u64 {
        self.rss.iter().map(|r| r.1).max().unwrap_or(0)
    }
}

pub fn measure(
    daemon: &Path,
    synth: &Path,
    scratch: &Path,
    steps: u64,
) -> anyhow::Result<ReplayBench> {
    let out = scratch.join("replay");
    let _ = std::fs::remove_dir_all(&out);
    let clk: f64 = super::runs::sh("getconf CLK_TCK").parse().unwrap_or(100.0);
    let mut synth_gen = Command::new(synth)
        .arg(steps.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting synth_recording")?;
    let started = Instant::now();
    let mut replay = Command::new(daemon)
        .args(["replay", "/dev/stdin", "-o"])
        .arg(&out)
        .stdin(synth_gen.stdout.take().expect("piped"))
        .stdout(Stdio::null())
        .spawn()
        .context("starting the daemon's replay")?;
    let pid = replay.id();
    let mut rss = Vec::new();
    let status = loop {
        if let Some(st) = replay.try_wait()? {
            break st;
        }
        if let Some((_, _, anon)) = proc_sample(pid, clk) {
            rss.push((started.elapsed().as_secs_f64(), anon));
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let wall_s = started.elapsed().as_secs_f64();
    ensure!(synth_gen.wait()?.success(), "synth_recording failed");
    ensure!(status.success(), "replay failed: {status}");
    let json = std::fs::read_to_string(out.join("final_summary.json"))
        .context("reading the replay's summary")?;
    let counted = number_after(&json, "\"steps\": {", "count").context("steps.count")?;
    let events = number_after(&json, "\"data_quality\"", "events_recorded").context("events")?;
    ensure!(
        counted == steps,
        "the replay counted {counted} steps of the {steps} written"
    );
    // One all_reduce a step: the ledger counted every one (and kept the newest 4,096).
    let collectives = number_after(&json, "\"collectives\": {", "total").context("collectives")?;
    ensure!(
        collectives == steps,
        "the ledger counted {collectives} collectives of the {steps} written"
    );
    ensure!(
        rss.len() >= 2,
        "the replay ended before it could be sampled"
    );
    Ok(ReplayBench {
        steps,
        counted,
        events,
        collectives,
        wall_s,
        rss,
    })
}

/// The section's heading (what [`super::sweep::splice_at`] replaces).
pub const HEADING: &str = "## Streaming engine: memory over a 10 M-step replay";

pub fn section(b: &ReplayBench, daemon: &str, load: &str) -> String {
    let mb = |kb: u64| kb as f64 / 1024.0;
    let ten = b.at(10.0);
    let mid = b.at(b.wall_s / 2.0);
    format!(
        "{HEADING}\n\n\
         `traceml-daemon/examples/synth_recording {}` (a synthetic binary recording of ~1 ms \
         steps as the markers probe set sees them: DataLoader and Optimizer.step \
         `record_function`s, an H2D copy, 4 launches, backward, an all_reduce of the gradients \
         with its wait, a stream sync; ±25 % jitter) piped into `{daemon} replay /dev/stdin`: the \
         fold a live run uses. `RssAnon` of the replaying daemon from `/proc/<pid>/status` every \
         200 ms. The summary counted {} steps ({} events) of the {} written (the first is the \
         attach fragment), and its collective ledger {} collectives (one a step; the engine keeps \
         the newest 4,096, the summary 512): the ledger's memory is in these numbers. Load \
         average before: {load}.\n\n\
         | steps | events | wall | events/s | RssAnon at 10 s | at mid-run | last sample | peak | growth 10 s → end |\n\
         |---|---|---|---|---|---|---|---|---|\n\
         | {} | {} | {:.0} s | {:.1} M | {:.1} MB | {:.1} MB | {:.1} MB | {:.1} MB | **{:+.2} MB** |\n",
        b.steps,
        b.counted,
        b.events,
        b.steps,
        b.collectives,
        b.steps,
        b.events,
        b.wall_s,
        b.events as f64 / b.wall_s / 1e6,
        mb(ten),
        mb(mid),
        mb(b.last()),
        mb(b.peak()),
        mb(b.last()) - mb(ten),
    )
}
