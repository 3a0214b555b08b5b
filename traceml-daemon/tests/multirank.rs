//! Multi-rank jobs (issue 11) with real processes: DDP / explicit all-reduce with gloo on CPU
//! under `torchrun` (tests/workloads/ddp/ddp_train.py: every rank writes its own truth). The
//! daemon is attached to the launcher's pid or to a rank's pid and must find every rank, name the
//! injected straggler (2 and 4 ranks), find none in an even job, measure each rank's collective
//! wait within max(2 ms, 5 %) of the truth, write a HANG with stacks while a job is hung, name a
//! desync (another op, a skipped all-reduce) within 10 s with the rank, collective and ops the
//! truth gives, join the ranks' collective ledgers (the rank the job waited for is the truth's
//! culprit), and follow an elastic restart to the job's second attempt; `serve` must group the
//! ranks of a job it discovers and name the straggler.
mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

struct Job {
    torchrun: Child,
    dir: PathBuf,
    ranks: Vec<u32>,
}

impl Drop for Job {
    fn drop(&mut self) {
        // SAFETY: kill(2) of our own child's process group... torchrun forwards SIGTERM to ranks.
        unsafe { libc::kill(self.torchrun.id() as i32, libc::SIGTERM) };
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if self.torchrun.try_wait().ok().flatten().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.torchrun.kill();
        let _ = self.torchrun.wait();
        for pid in &self.ranks {
            // SAFETY: kill(2); the rank may be gone already.
            unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
        }
    }
}

/// Two ranks of DDP, rank 1 sleeping 15 ms at the start of every forward (60 steps).
const STRAGGLER_2: [&str; 12] = [
    "--mode",
    "ddp",
    "--steps",
    "60",
    "--straggler-rank",
    "1",
    "--straggler-phase",
    "compute",
    "--straggler-ms",
    "15",
    "--straggler-how",
    "sleep",
];

/// Two ranks of DDP (200 steps), rank 1 hanging in step 15 (asleep outside every collective,
/// before its all-reduce; rank 0 blocks in it).
const HANG_1: [&str; 8] = [
    "--mode",
    "ddp",
    "--steps",
    "200",
    "--hang-rank",
    "1",
    "--hang-after",
    "15",
];

/// Starts `torchrun --nproc_per_node=n ddp_train.py args`, waits until every rank is ready.
fn start(label: &str, n: u32, args: &[&str]) -> Option<Job> {
    start_with(label, n, &[], args)
}

/// [`start`] with torchrun options of its own (`--max-restarts=1`).
fn start_with(label: &str, n: u32, torchrun_args: &[String], args: &[&str]) -> Option<Job> {
    if !root_or_skip() {
        return None;
    }
    let dir = scratch(label);
    let child = Command::new(torchrun())
        .arg(format!("--nproc_per_node={n}"))
        .arg(format!("--master_port={}", free_port()))
        .args(torchrun_args)
        .arg(workspace().join("tests/workloads/ddp/ddp_train.py"))
        .arg("--truth-dir")
        .arg(&dir)
        .arg("--ready")
        .arg(dir.join("ready"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("torchrun");
    let mut job = Job {
        torchrun: child,
        dir,
        ranks: Vec::new(),
    };
    let t = Instant::now();
    while (0..n).any(|r| !job.dir.join(format!("rank{r}.pid")).exists()) {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "{label}: ranks not ready"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    job.ranks = (0..n)
        .map(|r| rank_field(&job.dir, r, "pid") as u32)
        .collect();
    Some(job)
}

fn rank_field(dir: &Path, r: u32, key: &str) -> u64 {
    json(&dir.join(format!("rank{r}.pid")))[key]
        .as_u64()
        .unwrap()
}

/// Steps of a rank's own summary.
fn steps_of(summary: &Path) -> u64 {
    json(summary)["steps"]["count"].as_u64().unwrap()
}

/// `traceml-daemon --pid <pid>` on `job`: the job's ready file, output in `<dir>/out`, no card.
fn daemon_cmd(job: &Job, pid: u32) -> Command {
    let mut cmd = Command::new(daemon());
    cmd.arg("--pid")
        .arg(pid.to_string())
        .arg("--ready-file")
        .arg(job.dir.join("ready"))
        .arg("--output")
        .arg(job.dir.join("out"))
        .args(["--color", "never", "--quiet"]);
    cmd
}

/// The daemon's log (`RUST_LOG=info`) says it attached to `pid`.
fn log_says_attached(log: &Path, pid: u64) -> bool {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .contains(&format!("attached to {pid} in"))
}

/// Runs the daemon on `pid` until the job ends; the job's summary.
fn daemon_on(job: &mut Job, pid: u32, extra: &[&str]) -> serde_json::Value {
    let out = job.dir.join("out");
    let child = daemon_cmd(job, pid)
        .args(extra)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let o = wait_with_timeout(child, Duration::from_secs(400));
    assert!(
        o.status.success(),
        "daemon: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let _ = job.torchrun.wait();
    json(&out.join("final_summary.json"))
}

/// `traceml-daemon --pid <launcher>` on `job` ([`daemon_cmd`], its log piped) until it has
/// written a HANG ([`hang_written`], within `budget`): the daemon, still running, the summary
/// and when it was seen.
fn daemon_until_hang(job: &Job, budget: Duration) -> (Child, serde_json::Value, u64) {
    let child = daemon_cmd(job, job.torchrun.id())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (summary, found_ns) = hang_written(&job.dir.join("out"), budget);
    (child, summary, found_ns)
}

/// SIGTERM to a daemon [`daemon_until_hang`] started, and its end awaited.
fn stop_daemon(mut child: Child) {
    // SAFETY: kill(2) of our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
}

/// Waits (at most `budget`) until the job's summary in `out` is a HANG, written while the job
/// runs: the summary and when it was seen (CLOCK_MONOTONIC ns).
fn hang_written(out: &Path, budget: Duration) -> (serde_json::Value, u64) {
    let t = Instant::now();
    loop {
        assert!(t.elapsed() < budget, "no HANG written");
        if let Ok(text) = std::fs::read_to_string(out.join("final_summary.json"))
            && let Ok(s) = serde_json::from_str::<serde_json::Value>(&text)
            && s["primary_diagnosis"]["kind"] == "HANG"
        {
            return (s, monotonic_ns());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn verdict(s: &serde_json::Value) -> (String, Option<u64>) {
    let d = &s["primary_diagnosis"];
    (
        d["kind"].as_str().unwrap_or("?").to_owned(),
        d["culprit_rank"].as_u64(),
    )
}

/// How far the truth must sit from the daemon's lines before the verdict must be the truth's:
/// 4 points of the step for the score, 15 points for the persistence. Inside that the daemon
/// may decide either way and its numbers are checked instead.
const SCORE_MARGIN: f64 = 0.04;
const PERSISTENCE_MARGIN: f64 = 0.15;

/// What the run's own truth requires of the verdict, by the daemon's straggler measure
/// ([`TruthStraggler`]) and these margins.
fn expect(truth: &TruthStraggler) -> Expect {
    truth.expect(SCORE_MARGIN, PERSISTENCE_MARGIN)
}

/// Rank `r`'s `what` against the truth's, both in ms: printed, and a failure noted in `failures`
/// when it is further than `tol` from the truth.
fn compare_ms(failures: &mut Vec<String>, r: u32, what: &str, got: f64, want: f64, tol: f64) {
    eprintln!("rank {r}: {what} {got:.2} ms, truth {want:.2} ms");
    if (got - want).abs() > tol {
        failures.push(format!(
            "rank {r}: {what} {got:.2} ms, truth {want:.2} ms (± {tol:.2})"
        ));
    }
}

/// The job's STRAGGLER against its truth: named (with the truth's culprit) when the truth is
/// clearly over the line, absent when clearly under; inside the margins each rank's median own
/// work within max(3 ms, 15 %) of the truth's. `designed` is the rank the workload slowed (or
/// none): a run whose truth disagrees with its design says so, and is judged by its truth.
fn check_straggler(s: &serde_json::Value, dir: &Path, out: &Path, n: u32, designed: Option<u32>) {
    let truth = truth_straggler(dir, n);
    let expect = expect(&truth);
    eprintln!("truth: {truth:?} → {expect:?} (designed: {designed:?})");
    if expect != designed.map_or(Expect::NoStraggler, Expect::Straggler) {
        eprintln!("NOTE: this run's truth is not its design (a busy host slows ranks unevenly)");
    }
    let found: Vec<&serde_json::Value> = s["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "STRAGGLER")
        .collect();
    // The ledger: the ranks' collectives joined; who entered last, by rank.
    let w = &s["collective_waits"];
    eprintln!(
        "ledger: {} collectives joined, waits for {}, last: {}",
        w["compared"],
        w["waits_for"],
        w["ranks"]
            .as_array()
            .map(|v| v
                .iter()
                .map(|r| format!("rank {} {} ({:.2})", r["rank"], r["last"], r["last_share"]))
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default()
    );
    match expect {
        Expect::Straggler(rank) => {
            assert_eq!(
                verdict(s),
                ("STRAGGLER".into(), Some(u64::from(rank))),
                "truth {truth:?}: {:#}",
                s["primary_diagnosis"]
            );
            // The job waited for the truth's culprit at its collectives.
            assert!(w["compared"].as_u64().unwrap_or(0) >= 20, "{w:#}");
            assert_eq!(w["waits_for"].as_u64(), Some(u64::from(rank)), "{w:#}");
        }
        Expect::NoStraggler => {
            assert!(found.is_empty(), "truth {truth:?}: {:#}", s["findings"]);
            assert!(w["compared"].as_u64().unwrap_or(0) >= 20, "{w:#}");
            assert!(w["waits_for"].is_null(), "{w:#}");
        }
        Expect::Either => {
            let mut failures = Vec::new();
            for r in 0..n {
                let rank = json(&out.join(format!("rank-{r}/final_summary.json")));
                let samples = &rank["step_samples"];
                let f = |v: &serde_json::Value| v.as_f64().unwrap_or(0.0);
                let cw = samples["phase_ms"]["collective_wait"].as_array();
                let own: Vec<f64> = samples["step_ms"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .enumerate()
                    .map(|(i, st)| f(st) - cw.and_then(|c| c.get(i)).map_or(0.0, f))
                    .collect();
                let (got, want) = (median(own), truth.own_ms[r as usize]);
                let tol = (want * 0.15).max(3.0);
                compare_ms(&mut failures, r, "own work", got, want, tol);
            }
            assert!(failures.is_empty(), "truth {truth:?}: {failures:#?}");
        }
    }
}

#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn launcher_pid_names_the_straggler_of_two_ranks() {
    let Some(mut job) = start("mr-2", 2, &STRAGGLER_2) else {
        return;
    };
    let launcher = job.torchrun.id();
    // `/metrics` while the job runs: every rank's series, scraped as Prometheus would.
    let addr = free_addr();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let scraper = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut last = String::new();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some((200, body)) = get(addr, "/metrics")
                    && body.contains("traceml_steps_total{")
                {
                    last = body;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            last
        })
    };
    let rec = job.dir.join("rec.trec");
    let s = daemon_on(
        &mut job,
        launcher,
        &[
            "--metrics-addr",
            &addr.to_string(),
            "--record",
            rec.to_str().unwrap(),
        ],
    );
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let scraped = scraper.join().unwrap();
    check_straggler(&s, &job.dir, &job.dir.join("out"), 2, Some(1));
    assert_eq!(s["ranks"].as_array().unwrap().len(), 2);
    // Each rank's steps on /metrics while it ran: more than none, no more than its summary's.
    for r in s["ranks"].as_array().unwrap() {
        let rank = r["rank"].as_u64().unwrap();
        let line = scraped
            .lines()
            .find(|l| {
                l.starts_with("traceml_steps_total{") && l.contains(&format!("rank=\"{rank}\""))
            })
            .unwrap_or_else(|| panic!("no steps of rank {rank} on /metrics:\n{scraped}"));
        let n: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(
            n > 0.0 && n <= r["steps"].as_f64().unwrap(),
            "rank {rank}: {n} steps on /metrics, {} in the summary",
            r["steps"]
        );
    }
    assert!(scraped.contains("traceml_job_info{"), "{scraped}");
    // The straggler class on /metrics while the job ran: where the run's own truth has rank R
    // clearly slow in most steps, a persistent straggler naming R.
    if let Expect::Straggler(r) = expect(&truth_straggler(&job.dir, 2)) {
        let want = format!("class=\"persistent\",rank=\"{r}\"}} 1");
        assert!(
            scraped
                .lines()
                .any(|l| l.starts_with("traceml_straggler_class{") && l.ends_with(&want)),
            "no persistent straggler {r} on /metrics:\n{}",
            scraped
                .lines()
                .filter(|l| l.starts_with("traceml_straggler") || l.starts_with("traceml_verdict"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    // `--record`: one recording per rank, each replaying to that rank's own step count.
    for r in s["ranks"].as_array().unwrap() {
        let rank = r["rank"].as_u64().unwrap();
        let file = job.dir.join(format!("rec.rank{rank}.trec"));
        let out = job.dir.join(format!("replayed-{rank}"));
        let o = Command::new(daemon())
            .arg("replay")
            .arg(&file)
            .arg("-o")
            .arg(&out)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let replayed = json(&out.join("final_summary.json"));
        assert_eq!(replayed["steps"]["count"], r["steps"], "rank {rank}");
    }
    assert_eq!(s["job"]["launcher_pid"].as_u64(), Some(u64::from(launcher)));
    if verdict(&s).0 == "STRAGGLER" {
        // The sleep is at the start of every forward.
        assert_eq!(s["primary_diagnosis"]["phase"], "forward");
    }
}

#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn a_rank_pid_finds_four_ranks_and_names_rank_two() {
    let args = [
        "--mode",
        "ddp",
        "--steps",
        "50",
        "--straggler-rank",
        "2",
        "--straggler-phase",
        "compute",
        // Four ranks share two cores here: while rank 2 sleeps the others compute faster, so
        // its own time exceeds theirs by ~60 % of the sleep only. 25 ms gave a score of
        // 0.10–0.12 of the step against the 0.10 threshold (a coin toss in CI); 40 ms ~0.2.
        "--straggler-ms",
        "40",
        "--straggler-how",
        "sleep",
    ];
    let Some(mut job) = start("mr-4", 4, &args) else {
        return;
    };
    let rank0 = job.ranks[0];
    let s = daemon_on(&mut job, rank0, &[]);
    assert_eq!(s["ranks"].as_array().unwrap().len(), 4, "{:#}", s["job"]);
    check_straggler(&s, &job.dir, &job.dir.join("out"), 4, Some(2));
}

#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn an_even_job_has_no_straggler_and_collective_wait_matches_truth() {
    // Explicit, flattened all-reduce: the truth times the collective from Python.
    let args = ["--mode", "allreduce", "--flatten", "--steps", "60"];
    let Some(mut job) = start("mr-even", 2, &args) else {
        return;
    };
    let launcher = job.torchrun.id();
    let s = daemon_on(&mut job, launcher, &[]);
    check_straggler(&s, &job.dir, &job.dir.join("out"), 2, None);
    let mut failures = Vec::new();
    for r in 0..2 {
        let truth = json(&job.dir.join(format!("truth-rank{r}.json")));
        let want = truth["median_phases_ns"]["collective_wait"]
            .as_f64()
            .unwrap()
            / 1e6;
        let rank = json(&job.dir.join(format!("out/rank-{r}/final_summary.json")));
        let got = rank["phases"]["collective_wait"]["median_ms"]
            .as_f64()
            .unwrap_or(f64::NAN);
        let tol = (want * 0.05).max(2.0);
        compare_ms(&mut failures, r, "collective wait", got, want, tol);
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn a_hung_rank_is_a_hang_with_stacks_while_the_job_is_hung() {
    let Some(job) = start("mr-hang", 2, &HANG_1) else {
        return;
    };
    // The default --hang-after (60 s): rank 0 waits in DDP's all-reduce while rank 1 sleeps
    // outside every collective, so the collective rule names the hang in seconds.
    let (child, summary, found_ns) = daemon_until_hang(&job, Duration::from_secs(180));
    // Named within 10 s of the hang, by the hung rank's own clock (its truth, written right
    // before it stopped).
    let hung = json(&job.dir.join("truth-rank1.json"));
    let since = hung["hang"]["t_ns"].as_f64().expect("hang.t_ns");
    let after_s = (found_ns as f64 - since) / 1e9;
    eprintln!("HANG written {after_s:.1} s after rank 1 stopped");
    assert!(after_s <= 10.0, "HANG named {after_s:.1} s after the hang");
    // Written while the job is still hung: both ranks alive.
    for pid in &job.ranks {
        assert!(
            Path::new(&format!("/proc/{pid}")).exists(),
            "rank {pid} gone"
        );
    }
    let stacks: Vec<usize> = summary["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["stack"].as_array().map_or(0, Vec::len))
        .collect();
    assert!(
        stacks.iter().all(|&n| n > 0),
        "stacks {stacks:?}: {:#}",
        summary["ranks"]
    );
    assert_eq!(
        summary["primary_diagnosis"]["culprit_rank"].as_u64(),
        Some(1),
        "{:#}",
        summary["primary_diagnosis"]
    );
    stop_daemon(child);
    drop(job);
}

/// The straggler's class on `/metrics` while a four-rank DDP job runs, against the workload's
/// truth: a rank slowed (40 ms sleep in forward) in steps 20–40 of 100 only (transient, naming
/// it), a rank slowed throughout (persistent, naming it), and a slowness that moves to the next
/// rank every 5 steps (rotating). Each class must be on `/metrics` (scraped every 200 ms) within
/// 15 s of the onset (the truth's first slowed step's start) and be the final summary's.
#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn stragglers_are_classified_within_seconds_of_their_onset() {
    let mut failures = Vec::new();
    for (class, rank, extra) in [
        (
            "transient",
            Some(2u32),
            &[
                "--steps",
                "100",
                "--straggler-rank",
                "2",
                "--straggler-from",
                "20",
                "--straggler-to",
                "40",
            ][..],
        ),
        (
            "persistent",
            Some(1),
            &["--steps", "60", "--straggler-rank", "1"][..],
        ),
        (
            "rotating",
            None,
            &["--steps", "100", "--straggler-every", "5"][..],
        ),
    ] {
        let mut args = vec![
            "--mode",
            "ddp",
            "--straggler-phase",
            "compute",
            "--straggler-ms",
            "40",
            "--straggler-how",
            "sleep",
        ];
        args.extend_from_slice(extra);
        let Some(mut job) = start(&format!("mr-class-{class}"), 4, &args) else {
            return;
        };
        let addr = free_addr();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let want_line = format!(
            "class=\"{class}\",rank=\"{}\"}} 1",
            rank.map(|r| r.to_string()).unwrap_or_default()
        );
        let scraper = {
            let (done, want_line) = (done.clone(), want_line.clone());
            std::thread::spawn(move || {
                let mut first: Option<u64> = None;
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    if first.is_none()
                        && let Some((200, body)) = get(addr, "/metrics")
                        && body.lines().any(|l| {
                            l.starts_with("traceml_straggler_class{") && l.ends_with(&want_line)
                        })
                    {
                        first = Some(monotonic_ns());
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
                first
            })
        };
        let launcher = job.torchrun.id();
        let s = daemon_on(&mut job, launcher, &["--metrics-addr", &addr.to_string()]);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let seen = scraper.join().unwrap();
        // The onset: the earliest start of a slowed step on any rank, by the ranks' own clocks.
        let onset = (0..4)
            .filter_map(|r| {
                let t = json(&job.dir.join(format!("truth-rank{r}.json")));
                t["steps"].as_array()?.iter().find_map(|st| {
                    (st["straggler_burn_ns"].as_u64().unwrap_or(0) > 0)
                        .then(|| st["t_start_ns"].as_u64().unwrap())
                })
            })
            .min()
            .expect("a slowed step in the truth");
        let after = seen.map(|t| (t as f64 - onset as f64) / 1e9);
        let final_class = s["stragglers"]["class"]
            .as_str()
            .unwrap_or("none")
            .to_owned();
        eprintln!(
            "{class}: on /metrics {after:?} s after the onset; final class {final_class}, rank {}; \
             {}",
            s["stragglers"]["rank"], s["stragglers"]["episodes"]
        );
        match after {
            Some(a) if a <= 15.0 => {}
            _ => failures.push(format!(
                "{class}: {want_line} on /metrics {after:?} s after the onset (at most 15 s)"
            )),
        }
        if final_class != class || s["stragglers"]["rank"].as_u64().map(|r| r as u32) != rank {
            failures.push(format!(
                "{class}: the summary's class {final_class}, rank {}",
                s["stragglers"]["rank"]
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// `top --pid <launcher>` on a two-rank job with stdout not a terminal: each second the job's
/// line and one line per rank, live (the ranks' step counts grow while the job runs, no more
/// than each rank's truth), the rank the others wait for marked where the truth has one.
#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn top_on_a_job_shows_a_row_per_rank_live() {
    let Some(mut job) = start("mr-top", 2, &STRAGGLER_2) else {
        return;
    };
    let launcher = job.torchrun.id();
    let child = Command::new(daemon())
        .arg("top")
        .arg("--pid")
        .arg(launcher.to_string())
        .arg("--ready-file")
        .arg(job.dir.join("ready"))
        .arg("--output")
        .arg(job.dir.join("out"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let o = wait_with_timeout(child, Duration::from_secs(300));
    let _ = job.torchrun.wait();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    // Per second: "t=…" and then "  rank R pid P steps=N …" lines.
    let mut blocks: Vec<Vec<(u32, u64, bool)>> = Vec::new();
    for line in text.lines() {
        if line.starts_with("t=") {
            blocks.push(Vec::new());
        } else if let (Some(b), Some(rest)) = (blocks.last_mut(), line.strip_prefix("  rank ")) {
            let rank: u32 = rest.split(' ').next().unwrap().parse().unwrap();
            let steps: u64 = rest
                .split(' ')
                .find_map(|w| w.strip_prefix("steps="))
                .unwrap()
                .parse()
                .unwrap();
            b.push((rank, steps, line.ends_with("◀ culprit")));
        }
    }
    let live: Vec<&Vec<(u32, u64, bool)>> = blocks
        .iter()
        .filter(|b| b.len() == 2 && b.iter().all(|r| r.1 > 0))
        .collect();
    assert!(
        live.len() >= 2,
        "fewer than two live blocks with both ranks:\n{text}"
    );
    let truth_steps: Vec<u64> = (0..2)
        .map(|r| {
            json(&job.dir.join(format!("truth-rank{r}.json")))["step_count"]
                .as_u64()
                .unwrap()
        })
        .collect();
    for b in &live {
        for &(rank, steps, _) in b.iter() {
            assert!(
                steps <= truth_steps[rank as usize],
                "rank {rank}: {steps} steps"
            );
        }
    }
    let (first, last) = (live[0], live[live.len() - 1]);
    assert!(
        last.iter().zip(first.iter()).all(|(l, f)| l.1 >= f.1) && last[0].1 > first[0].1,
        "steps did not grow:\n{text}"
    );
    if let Expect::Straggler(r) = expect(&truth_straggler(&job.dir, 2)) {
        assert!(
            last.iter().any(|&(rank, _, marked)| rank == r && marked),
            "rank {r} not marked:\n{text}"
        );
    }
}

/// Desyncs on four gloo ranks (explicit, flattened all-reduce, 30 steps): in step 15 rank 1
/// calls `dist.broadcast` where the others all-reduce (`op`), or no collective (`skip`: its calls
/// stay paired one ahead, so its final `dist.barrier()` meets the others' last all-reduce). The
/// daemon, on the launcher with the default `--hang-after` (60 s), must write a HANG within 10 s
/// of the point the workload's truth gives (rank 1's desync instant; for the skip, the end of its
/// loop), naming rank 1, the collective where the ops differ by the number the truth gives (the
/// collectives issued in the measured steps before it), and the ops there.
fn desync(how: &str) {
    let args = [
        "--mode",
        "allreduce",
        "--flatten",
        "--steps",
        "30",
        "--desync-rank",
        "1",
        "--desync-step",
        "15",
        "--desync-how",
        how,
    ];
    let Some(job) = start(&format!("mr-desync-{how}"), 4, &args) else {
        return;
    };
    let (child, summary, found_ns) = daemon_until_hang(&job, Duration::from_secs(120));
    let truth = json(&job.dir.join("truth-rank1.json"));
    let (seq, since, op) = if how == "op" {
        let d = &truth["desync"];
        (
            d["seq"].as_u64().unwrap(),
            d["t_ns"].as_f64().unwrap(),
            "broadcast",
        )
    } else {
        // The skipping rank's collectives over its whole loop: its barrier is the next one.
        let steps = truth["steps"].as_array().expect("rank 1 finished its loop");
        let calls: u64 = steps
            .iter()
            .map(|s| s["collective_calls"].as_u64().unwrap())
            .sum();
        let end = steps.last().unwrap()["t_end_ns"].as_f64().unwrap();
        (calls, end, "barrier")
    };
    let after_s = (found_ns as f64 - since) / 1e9;
    let w = &summary["collective_waits"];
    eprintln!(
        "{how}: HANG written {after_s:.1} s after the truth's instant; desyncs {}; why: {}",
        w["desyncs"], summary["primary_diagnosis"]["why"]
    );
    assert!(
        after_s <= 10.0,
        "HANG named {after_s:.1} s after the desync"
    );
    assert_eq!(
        summary["primary_diagnosis"]["culprit_rank"].as_u64(),
        Some(1),
        "{:#}",
        summary["primary_diagnosis"]
    );
    let d = w["desyncs"]
        .as_array()
        .and_then(|v| v.first())
        .unwrap_or_else(|| panic!("no desync named: {w:#}"));
    assert_eq!(d["seq"].as_u64(), Some(seq), "{d:#}");
    let ops: Vec<(u64, &str)> = d["ops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| (o["rank"].as_u64().unwrap(), o["op"].as_str().unwrap()))
        .collect();
    assert_eq!(
        ops,
        vec![
            (0, "all_reduce"),
            (1, op),
            (2, "all_reduce"),
            (3, "all_reduce")
        ],
        "{d:#}"
    );
    let why = summary["primary_diagnosis"]["why"].as_str().unwrap();
    assert!(
        why.contains(&format!(
            "rank 1 called {op} #{seq}, ranks 0,2,3 all_reduce #{seq}"
        )),
        "{why}"
    );
    stop_daemon(child);
    drop(job);
}

#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn a_rank_calling_another_op_is_a_desync_named_in_seconds() {
    desync("op");
}

#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn a_rank_that_skipped_an_all_reduce_is_named_where_the_calls_meet() {
    desync("skip");
}

/// An elastic restart (`torchrun --max-restarts=1`): rank 1 exits with status 1 after 20 steps
/// of the first attempt, the agent stops rank 0 and starts both again (TORCHELASTIC_RESTART_COUNT
/// 1), and `--pid <launcher>` follows them: the second attempt's ranks are attached while they
/// wait for their own ready file, each attempt's rank summaries are in their own directories with
/// the steps that attempt made (truth: each rank's truth or progress file), and the job's summary
/// is the last attempt's (its pids, `job.restarts` 1), not a four-rank job.
#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn an_elastic_restart_is_followed_and_the_job_is_its_last_attempt() {
    elastic_restart(false);
}

/// The same restart under `serve`, which finds both attempts' ranks by itself: every attempt in
/// its own directory of the job's, the job's summary the last attempt's.
#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn serve_keeps_every_attempt_of_a_restarted_job() {
    elastic_restart(true);
}

fn elastic_restart(serve: bool) {
    let args = [
        "--mode",
        "ddp",
        "--steps",
        "60",
        "--fail-rank",
        "1",
        "--fail-after",
        "20",
    ];
    let elastic = ["--max-restarts=1".to_owned()];
    let label = if serve {
        "mr-serve-elastic"
    } else {
        "mr-elastic"
    };
    let mut service = serve.then(|| start_serve(&format!("{label}-serve"), &[]));
    let Some(mut job) = start_with(label, 2, &elastic, &args) else {
        return;
    };
    let launcher = job.torchrun.id();
    let (daemon, log) = match &service {
        Some((serve, _, log)) => {
            release_when_attached(&job, log, serve.0.id());
            (None, log.clone())
        }
        None => {
            let log = job.dir.join("daemon.log");
            let child = daemon_cmd(&job, launcher)
                .env("RUST_LOG", "info")
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap();
            (Some(child), log)
        }
    };
    // The second attempt: both ranks ready again, released once the daemon attached to them.
    let again = |r: u32| job.dir.join(format!("rank{r}.restart1.pid"));
    wait_for("the restarted ranks", Duration::from_secs(180), || {
        again(0).exists() && again(1).exists()
    });
    let pids: Vec<u64> = (0..2)
        .map(|r| json(&again(r))["pid"].as_u64().unwrap())
        .collect();
    assert!(
        pids.iter().all(|p| !job.ranks.contains(&(*p as u32))),
        "new processes: {pids:?} vs {:?}",
        job.ranks
    );
    job.ranks.extend(pids.iter().map(|&p| p as u32));
    wait_for(
        "the daemon to attach the restarted ranks",
        Duration::from_secs(60),
        || pids.iter().all(|&p| log_says_attached(&log, p)),
    );
    std::fs::write(job.dir.join("ready.restart1"), "go\n").unwrap();
    let out = match daemon {
        Some(daemon) => {
            let status = wait_with_timeout(daemon, Duration::from_secs(300)).status;
            let log_text = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(status.success(), "daemon: {status}\n{log_text}");
            let _ = job.torchrun.wait();
            job.dir.join("out")
        }
        None => {
            job_ends(&mut job);
            let (serve, state, _) = service.as_mut().unwrap();
            // The job's summary once the last attempt's ranks are folded into it.
            wait_for("the job's summary", Duration::from_secs(30), || {
                job_dir(state, launcher).is_some_and(|d| {
                    let f = d.join("final_summary.json");
                    f.exists() && json(&f)["job"]["restarts"] == 1
                })
            });
            let jd = job_dir(state, launcher).unwrap();
            stop_serve(serve, Duration::from_secs(10));
            jd
        }
    };
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();

    // Truth per attempt: the failing rank's truth file (status "failed"), the killed rank's
    // progress log (one line per finished step), the second attempt's truth files.
    let first = |r: u32| -> u64 {
        let truth = job.dir.join(format!("truth-rank{r}.json"));
        if truth.exists() {
            let t = json(&truth);
            assert_eq!(t["status"], "failed", "rank {r}: {t:#}");
            t["step_count"].as_u64().unwrap()
        } else {
            std::fs::read_to_string(job.dir.join(format!("progress-rank{r}.log")))
                .unwrap()
                .lines()
                .count() as u64
        }
    };
    let mut failures = Vec::new();
    for r in 0..2u32 {
        let second = json(&job.dir.join(format!("truth-rank{r}.restart1.json")));
        assert_eq!(second["status"], "completed", "{second:#}");
        for (dir, want) in [
            (format!("rank-{r}"), first(r)),
            (
                format!("rank-{r}-restart-1"),
                second["step_count"].as_u64().unwrap(),
            ),
        ] {
            // A rank's last step ends where its next one starts: a rank that exits (or is
            // killed) inside a step leaves that one open, and the first step after the attach
            // may be cut (tolerance: 2 steps below, none above).
            let got = steps_of(&out.join(&dir).join("final_summary.json"));
            eprintln!("{dir}: {got} steps, truth {want}");
            if got > want || got + 2 < want {
                failures.push(format!("{dir}: {got} steps, truth {want}"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}\n{log_text}");
    let s = json(&out.join("final_summary.json"));
    assert_eq!(s["job"]["restarts"], 1, "{:#}", s["job"]);
    assert_eq!(s["job"]["ranks_measured"], 2, "{:#}", s["job"]);
    // The job's description survives the restart.
    assert_eq!(s["job"]["world_size"], 2, "{:#}", s["job"]);
    assert!(s["job"]["master"].is_string(), "{:#}", s["job"]);
    let rows: Vec<(u64, u64, u64)> = s["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let n = |k: &str| r[k].as_u64().unwrap();
            (n("rank"), n("pid"), n("restart"))
        })
        .collect();
    assert_eq!(rows, [(0, pids[0], 1), (1, pids[1], 1)], "{:#}", s["ranks"]);
    let card = std::fs::read_to_string(out.join("final_summary.txt")).unwrap();
    assert!(
        card.contains("restarted once (elastic): ranks of attempt 2"),
        "{card}"
    );
}

/// `serve` on ddp_train.py jobs (log to a file, which [`release_when_attached`] reads).
fn start_serve(label: &str, extra: &[&str]) -> (Proc, PathBuf, PathBuf) {
    let base = scratch(label);
    let state = base.join("state");
    let (ready, log) = (base.join("serving"), base.join("serve.log"));
    let mut args = vec!["--scan-interval", "0.2", "--include", "*ddp_train.py*"];
    args.extend_from_slice(extra);
    let serve = serve_until_ready(Command::new(daemon()), &state, &ready, &args, Some(&log));
    (serve, state, log)
}

/// Lets the job's ranks start their measured steps once serve has attached to every one (its
/// log line), as a user's serve would have been long before. A failure shows serve's log and
/// where its threads wait in the kernel.
fn release_when_attached(job: &Job, log: &Path, serve: u32) {
    wait_for_else(
        "serve to attach every rank",
        Duration::from_secs(120),
        || job.ranks.iter().all(|&p| log_says_attached(log, p.into())),
        || {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            format!(
                "serve's log (last 40 lines):\n{}\nserve's threads:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
                kernel_stacks(serve)
            )
        },
    );
    std::fs::write(job.dir.join("ready"), "go\n").unwrap();
}

/// Waits for the job's launcher to exit (300 s at most).
fn job_ends(job: &mut Job) {
    wait_for("the job's end", Duration::from_secs(300), || {
        job.torchrun.try_wait().unwrap().is_some()
    });
}

/// `serve` (no pid) groups the ranks of a torchrun job it discovers: one directory named after
/// the launcher, each rank's summary under `rank-<r>/`, and the job's summary at the top naming
/// the injected straggler.
#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn serve_groups_the_ranks_of_a_job_and_names_the_straggler() {
    if !root_or_skip() {
        return;
    }
    let (mut serve, state, log) = start_serve("mr-serve", &[]);
    let Some(mut job) = start("mr-serve-job", 2, &STRAGGLER_2) else {
        return;
    };
    release_when_attached(&job, &log, serve.0.id());
    let launcher = job.torchrun.id();
    job_ends(&mut job);
    wait_for("the job's summary", Duration::from_secs(20), || {
        job_dir(&state, launcher).is_some_and(|d| d.join("final_summary.json").exists())
    });
    let jd = job_dir(&state, launcher).unwrap();
    // Named after the ranks' script, not the launcher's process name (`pt_elastic`).
    let name = jd.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with(&format!("ddp_train-{launcher}-")),
        "{name}"
    );
    let s = json(&jd.join("final_summary.json"));
    check_straggler(&s, &job.dir, &jd, 2, Some(1));
    assert_eq!(s["job"]["launcher_pid"].as_u64(), Some(u64::from(launcher)));
    let ranks = s["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2, "{ranks:#?}");
    for r in 0..2u32 {
        let rs = json(&jd.join(format!("rank-{r}/final_summary.json")));
        let n = rs["steps"]["count"].as_u64().unwrap();
        // The truth: 60 measured steps per rank, all after the attach (the first one the
        // fragment before the first boundary).
        assert!((58..=60).contains(&n), "rank {r}: {n} steps");
        assert_eq!(
            ranks[r as usize]["pid"].as_u64(),
            Some(u64::from(job.ranks[r as usize]))
        );
    }
    // No per-rank directory of its own at the top of the state directory.
    for pid in &job.ranks {
        assert!(
            job_dir(&state, *pid).is_none(),
            "rank {pid} has its own job directory"
        );
    }
    stop_serve(&mut serve, Duration::from_secs(10));
}

/// `serve` finds a hung job by itself: the HANG (culprit rank, every rank's stack) is in the
/// job's summary while the ranks still hang, and stays in it after the job is killed.
#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn serve_writes_a_hang_with_stacks_while_the_job_is_hung() {
    if !root_or_skip() {
        return;
    }
    let (mut serve, state, log) = start_serve("mr-serve-hang", &["--hang-after", "5"]);
    let Some(job) = start("mr-serve-hang-job", 2, &HANG_1) else {
        return;
    };
    release_when_attached(&job, &log, serve.0.id());
    let launcher = job.torchrun.id();
    let hang = |s: &serde_json::Value| s["primary_diagnosis"]["kind"] == "HANG";
    let t = Instant::now();
    let summary = loop {
        assert!(t.elapsed() < Duration::from_secs(120), "no HANG written");
        if let Some(d) = job_dir(&state, launcher)
            && let Ok(text) = std::fs::read_to_string(d.join("final_summary.json"))
            && let Ok(s) = serde_json::from_str::<serde_json::Value>(&text)
            && hang(&s)
        {
            break s;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    // Written while the job is hung: both ranks alive.
    for pid in &job.ranks {
        assert!(
            Path::new(&format!("/proc/{pid}")).exists(),
            "rank {pid} gone"
        );
    }
    let culprit = |s: &serde_json::Value| s["primary_diagnosis"]["culprit_rank"].as_u64();
    assert_eq!(
        culprit(&summary),
        Some(1),
        "{:#}",
        summary["primary_diagnosis"]
    );
    let stacks = |s: &serde_json::Value| -> Vec<usize> {
        s["ranks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["stack"].as_array().map_or(0, Vec::len))
            .collect()
    };
    assert!(
        stacks(&summary).len() == 2 && stacks(&summary).iter().all(|&n| n > 0),
        "{:#}",
        summary["ranks"]
    );
    // The job is killed (its launcher told to stop, then its ranks): its final summary keeps
    // the HANG and the stacks read while it hung.
    drop(job);
    let d = job_dir(&state, launcher).unwrap();
    wait_for("every rank's own summary", Duration::from_secs(20), || {
        (0..2).all(|r| d.join(format!("rank-{r}/final_summary.json")).exists())
    });
    // Ranks killed a moment before SIGTERM still have their probes being taken out. With
    // `uprobe_multi` links that is one grace period for them all; with perf-event links (older
    // kernels, docs/overhead.md "Known limits") ~120 ms per link one after another in the kernel,
    // ~42 links per rank, and serve's exit waits for that: over 10 s in 2 of 3 CI runs, so that
    // case is allowed 60 s. The 10 s promise is tested in tests/serve.rs; here the HANG summary
    // is what is under test.
    let multi = traceml_daemon::attach::multi::supported().is_ok()
        && std::env::var_os(traceml_daemon::attach::LINKS_ENV).is_none_or(|v| v != "perf");
    stop_serve(&mut serve, Duration::from_secs(if multi { 10 } else { 60 }));
    let last = json(&d.join("final_summary.json"));
    // Seen once (2026-12-04, the whole file in parallel), and twice on 2026-12-07: the final
    // summary without the HANG, when SIGTERM came within a scan of the ranks' end (before the
    // scan wrote the job's summary): `Group::stop` looked again at no running rank and forgot
    // the hang (runtime::group::tests::a_job_stopped_after_its_hung_ranks_ended_stays_hung).
    // The serve log says what each rank's run did at the end.
    let serve_log = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        hang(&last),
        "{:#}\n{:#}\nserve log:\n{}",
        last["primary_diagnosis"],
        last["ranks"],
        serve_log()
    );
    assert_eq!(culprit(&last), Some(1), "serve log:\n{}", serve_log());
    assert!(stacks(&last).iter().all(|&n| n > 0), "{:#}", last["ranks"]);
}
