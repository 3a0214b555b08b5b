//! `traceml-daemon sweep` speed: two trees of job pairs whose summaries are the largest a run
//! writes (1,000 step samples each), swept end to end by the release binary (directory walk,
//! reading and parsing both trees, one `compare` per pair, the JSON table to /dev/null).
//!
//! The summaries are replays of two recorded runs (the input-bound one and its fix) whose
//! per-step arrays are stretched to 1,000 values with a little jitter, so every pair runs the
//! rank tests at full size. Every tenth job regresses (fix → input-bound); the run checks that
//! the sweep flags exactly those and exits 1, so the number is for a sweep that did its work.
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context as _, ensure};

use crate::root;

/// Job pairs swept.
pub const PAIRS: usize = 1000;
/// Timed sweeps (after one untimed sweep that warms the page cache).
const RUNS: usize = 5;
/// Step samples per summary (the most `final_summary.json` holds).
const SAMPLES: usize = 1000;

/// What the sweep bench measured.
pub struct SweepBench {
    pub pairs: usize,
    pub regressed: usize,
    pub summary_bytes: usize,
    pub threads: usize,
    /// Wall seconds of each timed sweep.
    pub runs_s: Vec<f64>,
    /// CPU seconds (user + system, all threads) of each timed sweep: what the sweep costs
    /// whatever else the machine runs.
    pub cpu_s: Vec<f64>,
}

/// Builds the trees under `scratch/sweep` and times `daemon sweep` over them.
pub fn measure(daemon: &Path, scratch: &Path) -> anyhow::Result<SweepBench> {
    let dir = scratch.join("sweep");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let fixed = replayed(daemon, &dir, "input_bound_fixed")?;
    let bound = replayed(daemon, &dir, "input_bound_single")?;
    let variants = [
        stretch(&fixed, 1)?,
        stretch(&fixed, 2)?,
        stretch(&bound, 3)?,
    ];
    let (base, cand) = (dir.join("baseline"), dir.join("candidate"));
    let mut regressed = 0;
    for i in 0..PAIRS {
        // Nested like a fleet's layout: team/job/rank.
        let job = format!("team{}/job{:04}/rank0", i % 10, i);
        let regress = i % 10 == 3;
        regressed += usize::from(regress);
        for (root, text) in [
            (&base, &variants[0]),
            (&cand, &variants[if regress { 2 } else { 1 }]),
        ] {
            let d = root.join(&job);
            std::fs::create_dir_all(&d)?;
            std::fs::write(d.join("final_summary.json"), text)?;
        }
    }
    let sweep = || -> anyhow::Result<(f64, f64, String)> {
        let cpu0 = children_cpu_s();
        let start = Instant::now();
        let out = Command::new(daemon)
            .arg("sweep")
            .arg(&base)
            .arg(&cand)
            .args(["--format", "json"])
            .stderr(Stdio::inherit())
            .output()
            .context("running traceml-daemon sweep")?;
        let secs = start.elapsed().as_secs_f64();
        let cpu = children_cpu_s() - cpu0;
        ensure!(
            out.status.code() == Some(1),
            "sweep exited {:?}, want 1 (regressions)",
            out.status.code()
        );
        Ok((secs, cpu, String::from_utf8_lossy(&out.stdout).into_owned()))
    };
    let (_, _, json) = sweep()?;
    let flagged = json.matches("\"verdict\": \"REGRESSION\"").count();
    ensure!(
        flagged == regressed,
        "sweep flagged {flagged} regressions, {regressed} were planted"
    );
    let (mut runs_s, mut cpu_s) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let (wall, cpu, _) = sweep()?;
        runs_s.push(wall);
        cpu_s.push(cpu);
    }
    Ok(SweepBench {
        pairs: PAIRS,
        regressed,
        summary_bytes: variants[0].len(),
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        runs_s,
        cpu_s,
    })
}

/// CPU seconds used so far by this process's waited-for children (`cutime + cstime` of
/// /proc/self/stat, in clock ticks of 1/100 s on Linux).
fn children_cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at the state, field 3.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    // cutime and cstime are fields 16 and 17: indices 13 and 14 from field 3.
    (f.get(13).copied().unwrap_or(0.0) + f.get(14).copied().unwrap_or(0.0)) / 100.0
}

/// The summary of a recorded run, replayed by the daemon.
fn replayed(daemon: &Path, dir: &Path, name: &str) -> anyhow::Result<String> {
    let out: PathBuf = dir.join(format!("replay-{name}"));
    let status = Command::new(daemon)
        .arg("replay")
        .arg(root().join(format!("tests/fixtures/recordings/{name}.jsonl.gz")))
        .arg("--output")
        .arg(&out)
        .arg("--quiet")
        .stderr(Stdio::null())
        .status()
        .context("running traceml-daemon replay")?;
    ensure!(status.success(), "replay of {name} failed ({status})");
    std::fs::read_to_string(out.join("final_summary.json")).context("reading the replay")
}

/// The summary with each per-step array of `step_samples` stretched to [`SAMPLES`] values (the
/// recorded ones repeated, each times 1 ± 2 % from a seeded generator). The writer keeps those
/// arrays on one line each, which is what this edits.
fn stretch(json: &str, seed: u64) -> anyhow::Result<String> {
    let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut out = Vec::new();
    let mut inside = false;
    let mut stretched = 0;
    for line in json.lines() {
        if line.trim_start().starts_with("\"step_samples\": {") {
            inside = true;
        }
        let array = line
            .find(": [")
            .filter(|_| inside && line.trim_end().trim_end_matches(',').ends_with(']'));
        let Some(at) = array else {
            out.push(line.to_owned());
            continue;
        };
        let body = line.trim_end().trim_end_matches(',');
        let values: Vec<f64> = body[at + 3..body.len() - 1]
            .split(',')
            .filter_map(|v| v.trim().parse().ok())
            .collect();
        if values.is_empty() {
            // A phase no step had (collective_wait on one rank): nothing to stretch.
            out.push(line.to_owned());
            continue;
        }
        let longer: Vec<String> = (0..SAMPLES)
            .map(|i| {
                let v = values[i % values.len()] * (1.0 + 0.04 * (next() - 0.5));
                format!("{:.2}", v)
            })
            .collect();
        let comma = if line.trim_end().ends_with(',') {
            ","
        } else {
            ""
        };
        out.push(format!("{}: [{}]{comma}", &line[..at], longer.join(", ")));
        stretched += 1;
    }
    // step_ms and one array per phase.
    ensure!(
        stretched >= 8,
        "found {stretched} per-step arrays in the replayed summary, expected step_ms and the phases"
    );
    Ok(out.join("\n") + "\n")
}

/// The BENCHMARKS.md section.
pub fn section(b: &SweepBench, daemon: &str, load: &str) -> String {
    let mut sorted = b.runs_s.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    let mut cpu = b.cpu_s.clone();
    cpu.sort_by(f64::total_cmp);
    let cpu_median = cpu[cpu.len() / 2];
    format!(
        "{HEADING}\n\n\
         `{daemon} sweep BASELINE CANDIDATE --format json` over {} job pairs (nested \
         `teamN/jobNNNN/rank0`), each summary {:.0} KB with {SAMPLES} step samples (the most a \
         summary holds); {} jobs regressed and were flagged, exit 1. {} timed sweeps after one \
         warm-up, {} threads; load average before: {load}. Wall time depends on what else the \
         shared machine runs; CPU time (user + system, all threads) does not.\n\n\
         | pairs | wall median | wall min | wall max | CPU median | CPU per pair |\n\
         |---|---|---|---|---|---|\n\
         | {} | {:.2} s | {:.2} s | {:.2} s | {:.2} s | {:.2} ms |\n",
        b.pairs,
        b.summary_bytes as f64 / 1e3,
        b.regressed,
        b.runs_s.len(),
        b.threads,
        b.pairs,
        median,
        sorted[0],
        sorted[sorted.len() - 1],
        cpu_median,
        cpu_median * 1e3 / b.pairs as f64,
    )
}

/// The section's heading (what [`splice_at`] replaces).
pub const HEADING: &str = "## Regression sweep: `traceml-daemon sweep` over 1,000 job pairs";

/// `old` with the section under `heading` replaced, or inserted before the notes (or at the
/// end).
pub fn splice_at(old: &str, heading: &str, section: &str) -> String {
    let section = section.trim_matches('\n');
    if let Some(start) = old.find(heading) {
        let after = start + heading.len();
        let end = old[after..]
            .find("\n## ")
            .map(|i| after + i + 1)
            .unwrap_or(old.len());
        return format!("{}{section}\n\n{}", &old[..start], &old[end..]);
    }
    if let Some(notes) = old.find("\n## Reading the numbers") {
        return format!(
            "{}\n\n{section}\n{}",
            old[..notes].trim_end(),
            &old[notes..]
        );
    }
    format!("{}\n\n{section}\n", old.trim_end())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stretches_the_per_step_arrays_only() {
        let json = "{\n  \"x\": [1, 2],\n  \"step_samples\": {\n    \"stride\": 1,\n    \
                    \"step_ms\": [10.0, 20.0],\n    \"phase_ms\": {\n"
            .to_owned()
            + &[
                "input_wait",
                "h2d",
                "forward",
                "backward",
                "optimizer",
                "gpu_wait",
            ]
            .map(|p| format!("      \"{p}\": [1.0, 2.0],\n"))
            .concat()
            + "      \"residual\": [3.0, 4.0]\n    }\n  }\n}\n";
        let s = stretch(&json, 1).unwrap();
        assert!(s.contains("\"x\": [1, 2],"));
        let step = s.lines().find(|l| l.contains("\"step_ms\"")).unwrap();
        assert_eq!(step.matches(',').count(), SAMPLES);
        assert!(step.ends_with("],"));
        assert!(
            s.lines()
                .any(|l| l.trim_start().starts_with("\"residual\"") && l.ends_with(']'))
        );
    }

    #[test]
    fn splices_before_the_notes() {
        let old = "# B\n\n## 5. X\n\nx\n\n## Reading the numbers\n\nn\n";
        let new = splice_at(old, HEADING, &format!("{HEADING}\n\ns1\n"));
        assert!(new.contains(&format!("x\n\n{HEADING}\n\ns1\n\n## Reading the numbers")));
        let again = splice_at(&new, HEADING, &format!("{HEADING}\n\ns2\n"));
        assert!(again.contains("s2") && !again.contains("s1"), "{again}");
        assert!(again.contains("## Reading the numbers\n\nn"));
    }
}
