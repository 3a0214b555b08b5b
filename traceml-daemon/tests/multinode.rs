//! Jobs across nodes (issue 25), two nodes on one machine: two `torchrun` node agents
//! (`--nnodes=2 --node_rank=0|1 --nproc_per_node=2`, static rendezvous on 127.0.0.1, gloo,
//! tests/workloads/ddp/ddp_train.py in DDP mode), one daemon per agent (its own
//! `--metrics-addr`, `TRACEML_NODE=node-<k>`) started while the agents are still in rendezvous
//! (no rank exists yet): `--pid <agent>` for the straggler tests, `serve` (the fleet's path,
//! including only its node's command lines) for the hang test; and one real Prometheus (`/usr/bin/prometheus`) scraping both every
//! second with packaging/prometheus/traceml-rules.yml loaded (evaluated every second; the hang
//! floor set to 5 s, the only change). Checked:
//! - both daemons' series carry one `job_id`, the same, for the 4 ranks on 2 nodes;
//! - a straggler at rank 3 (second agent): `TraceMLStraggler` fires naming rank 3 and `node-1`
//!   within 2 minutes of the job's start, when the run's own truth (each rank's own work per step,
//!   the daemon's measure) is clearly over the line; no other rank is named;
//! - an even job: no `TraceMLStraggler`, when its truth is clearly under the line;
//! - a hung rank 3, under `serve`: `TraceMLHang` names it (the truth's hung rank); blocked ranks
//!   named too are reported (a known gap, tests/README.md).
mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

/// The hang floor of the shipped rules (60 s) and the test's.
const HANG_FLOOR: &str = "expr: vector(60)";
const TEST_HANG_FLOOR: &str = "expr: vector(5)";

struct Agents {
    agents: Vec<Child>,
    dir: PathBuf,
}

impl Drop for Agents {
    fn drop(&mut self) {
        for a in &self.agents {
            // SAFETY: kill(2) of our own child; torchrun forwards SIGTERM to its ranks.
            unsafe { libc::kill(a.id() as i32, libc::SIGTERM) };
        }
        let t = Instant::now();
        for a in &mut self.agents {
            while t.elapsed() < Duration::from_secs(10) && a.try_wait().ok().flatten().is_none() {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = a.kill();
            let _ = a.wait();
        }
        for r in 0..4 {
            if let Some(pid) = pid_file(&self.dir, r) {
                // SAFETY: kill(2); the rank may be gone already.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
    }
}

fn pid_file(dir: &Path, r: u32) -> Option<u32> {
    let t = std::fs::read_to_string(dir.join(format!("rank{r}.pid"))).ok()?;
    let v: serde_json::Value = serde_json::from_str(&t).ok()?;
    v["pid"].as_u64().map(|p| p as u32)
}

/// An instant query's series (labels, value); empty while Prometheus is not up yet.
fn query(prom: SocketAddr, q: &str) -> Vec<(serde_json::Value, f64)> {
    match prom_query(prom, q) {
        Ok(series) => series,
        Err(PromError::Unready(_)) => Vec::new(),
        Err(e) => panic!("{e}"),
    }
}

/// Whether `pid` still runs (not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()
                .map(|r| r.split_whitespace().next() != Some("Z"))
        })
        .unwrap_or(false)
}

/// The two nodes of a job: the agents, their daemons, and Prometheus.
struct Cluster {
    agents: Agents,
    daemons: Vec<Proc>,
    _prometheus: Proc,
    prom: SocketAddr,
    /// When the first agent was started: the job's start.
    t0: Instant,
    /// The same instant on `CLOCK_MONOTONIC` (ns), the workloads' clock.
    t0_ns: u64,
}

/// The shipped rules, with the test's hang floor, for [`start_prometheus`].
fn test_rules(dir: &Path) -> PathBuf {
    let shipped =
        std::fs::read_to_string(workspace().join("packaging/prometheus/traceml-rules.yml"))
            .unwrap();
    assert_eq!(
        shipped.matches(HANG_FLOOR).count(),
        1,
        "the hang floor moved"
    );
    let rules = dir.join("traceml-rules.yml");
    std::fs::write(&rules, shipped.replace(HANG_FLOOR, TEST_HANG_FLOOR)).unwrap();
    rules
}

/// How each node's daemon watches its agent.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// `--pid <agent>`, attached while the agent is still in rendezvous.
    Pid,
    /// `serve`, as the fleet deploys it: it finds the agent's ranks itself (`--include` of the
    /// node's tag, which only that agent's command lines carry: two nodes share this machine).
    Serve,
}

/// Starts agent `k`, waits until it runs torchrun, and starts its node's daemon while the agent
/// has no rank yet (rendezvous).
fn agent_and_daemon(
    dir: &Path,
    k: u32,
    port: u16,
    args: &[&str],
    metrics: SocketAddr,
    mode: Mode,
) -> (Child, Proc) {
    let log = std::fs::File::create(dir.join(format!("agent{k}.log"))).unwrap();
    let agent = Command::new(torchrun())
        .args([
            "--nnodes=2",
            &format!("--node_rank={k}"),
            "--nproc_per_node=2",
            "--master_addr=127.0.0.1",
            &format!("--master_port={port}"),
        ])
        .arg(workspace().join("tests/workloads/ddp/ddp_train.py"))
        .arg("--truth-dir")
        .arg(dir)
        .args(args)
        .args(["--node-tag", &format!("node-{k}")])
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("torchrun");
    let pid = agent.id();
    wait_for("the agent's exec", Duration::from_secs(10), || {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains("torchrun"))
    });
    // Still in rendezvous: the agent has started no rank.
    assert!(
        traceml_daemon::host::jobs::ranks_below(pid).is_empty(),
        "agent {k} has ranks already"
    );
    let log = std::fs::File::create(dir.join(format!("daemon{k}.log"))).unwrap();
    let mut cmd = Command::new(daemon());
    match mode {
        Mode::Pid => {
            cmd.arg("--pid")
                .arg(pid.to_string())
                .arg("--output")
                .arg(dir.join(format!("out{k}")))
                .args(["--color", "never", "--quiet"]);
        }
        Mode::Serve => {
            // An empty config: the defaults and the flags, whatever /etc/traceml holds.
            let config = dir.join(format!("serve{k}.toml"));
            std::fs::write(&config, "").unwrap();
            cmd.arg("serve")
                .arg("--config")
                .arg(config)
                .arg("--state-dir")
                .arg(dir.join(format!("state{k}")))
                .args(["--scan-interval", "0.5", "--include"])
                .arg(format!("*--node-tag node-{k}*"));
        }
    }
    let daemon = Proc(
        cmd.arg("--metrics-addr")
            .arg(metrics.to_string())
            .args(["--hang-after", "5"])
            .env("TRACEML_NODE", format!("node-{k}"))
            // The sink's debug lines: each rank's in-collective changes and why (what
            // TraceMLHang read).
            .env("RUST_LOG", "info,traceml_daemon::runtime::sinks=debug")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("daemon"),
    );
    (agent, daemon)
}

fn start(label: &str, args: &[&str], mode: Mode) -> Option<Cluster> {
    if !root_or_skip() || !tool_or_skip(PROMETHEUS, "prometheus") {
        return None;
    }
    // The torch venv is set up (or the test fails here, before anything starts).
    torchrun();
    let dir = scratch(label);
    let metrics: Vec<SocketAddr> = (0..2).map(|_| free_addr()).collect();
    let (prometheus, prom) = start_prometheus(&dir, &metrics, Some(&test_rules(&dir)));
    let port = free_port();
    let (t0, t0_ns) = (Instant::now(), monotonic_ns());
    let (a0, d0) = agent_and_daemon(&dir, 0, port, args, metrics[0], mode);
    // The second node joins a little later, as on a real cluster.
    std::thread::sleep(Duration::from_secs(2));
    let (a1, d1) = agent_and_daemon(&dir, 1, port, args, metrics[1], mode);
    Some(Cluster {
        agents: Agents {
            agents: vec![a0, a1],
            dir,
        },
        daemons: vec![d0, d1],
        _prometheus: prometheus,
        prom,
        t0,
        t0_ns,
    })
}

/// One firing alert: its name, rank, node and job_id.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Fired {
    alert: String,
    rank: String,
    node: String,
    job_id: String,
}

impl Cluster {
    fn firing(&self) -> Vec<Fired> {
        query(self.prom, "ALERTS{alertstate=\"firing\"}")
            .into_iter()
            .map(|(m, _)| {
                let s = |k: &str| m[k].as_str().unwrap_or("").to_owned();
                Fired {
                    alert: s("alertname"),
                    rank: s("rank"),
                    node: s("node"),
                    job_id: s("job_id"),
                }
            })
            .collect()
    }

    /// `(job_id, node) → ranks` of the scraped step counters.
    fn identities(&self) -> Vec<(String, String, f64)> {
        query(self.prom, "count by (job_id, node) (traceml_steps_total)")
            .into_iter()
            .map(|(m, x)| {
                (
                    m["job_id"].as_str().unwrap_or("").to_owned(),
                    m["node"].as_str().unwrap_or("").to_owned(),
                    x,
                )
            })
            .collect()
    }

    /// Polls every second until `done` (or `timeout` from the job's start): every alert seen
    /// firing with when it first fired (seconds from the job's start), and whether both nodes'
    /// series were seen under one job_id for the 4 ranks.
    fn watch(
        &mut self,
        timeout: Duration,
        mut done: impl FnMut(&mut Self, &[(Fired, f64)]) -> bool,
    ) -> (Vec<(Fired, f64)>, bool) {
        let mut seen: Vec<(Fired, f64)> = Vec::new();
        let mut one_job = false;
        while self.t0.elapsed() < timeout {
            for f in self.firing() {
                if !seen.iter().any(|(s, _)| *s == f) {
                    let at = self.t0.elapsed().as_secs_f64();
                    eprintln!("{at:.0} s: firing {f:?}");
                    seen.push((f, at));
                }
            }
            let ids = self.identities();
            if ids.len() == 2
                && ids[0].0 == ids[1].0
                && ids.iter().all(|(_, _, n)| *n == 2.0)
                && ids.iter().any(|(_, node, _)| node == "node-0")
                && ids.iter().any(|(_, node, _)| node == "node-1")
            {
                if !one_job {
                    eprintln!(
                        "{:.0} s: one job_id on both nodes: {ids:?}",
                        self.t0.elapsed().as_secs_f64()
                    );
                }
                one_job = true;
            }
            if done(self, &seen) {
                break;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        (seen, one_job)
    }

    fn job_ended(&mut self) -> bool {
        self.agents
            .agents
            .iter_mut()
            .all(|a| a.try_wait().ok().flatten().is_some())
    }

    /// Both daemons exit on their own once their agent's ranks are gone.
    fn daemons_end(&mut self) {
        for d in &mut self.daemons {
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(60) && d.0.try_wait().ok().flatten().is_none() {
                std::thread::sleep(Duration::from_millis(200));
            }
            let status = d.0.try_wait().ok().flatten();
            assert!(
                status.is_some_and(|s| s.success()),
                "daemon: {status:?}, see {}",
                self.agents.dir.display()
            );
        }
    }

    fn log(&self, k: u32) -> String {
        std::fs::read_to_string(self.agents.dir.join(format!("daemon{k}.log"))).unwrap_or_default()
    }
}

/// How far the truth must sit from the rule's lines (0.10 and 0.6, the published ones) for the
/// alert to be required (or forbidden): the rule sees means over a minute where the truth has
/// medians over the run, so the margins are wider than tests/multirank.rs's.
const SCORE_MARGIN: f64 = 0.05;
const PERSISTENCE_MARGIN: f64 = 0.15;

/// The rank's node: static rendezvous gives node k the ranks 2k and 2k+1.
fn node_of(rank: u32) -> String {
    format!("node-{}", rank / 2)
}

/// Runs a job to its end under both daemons and judges `TraceMLStraggler` by the truth.
fn straggler_job(label: &str, args: &[&str], designed: Option<u32>) {
    let Some(mut c) = start(label, args, Mode::Pid) else {
        return;
    };
    let (seen, one_job) = c.watch(Duration::from_secs(400), |c, _| c.job_ended());
    assert!(c.job_ended(), "the job did not end in time");
    // Give Prometheus the last scrapes, then read what the daemons said.
    c.daemons_end();
    let log0 = c.log(0);
    assert!(
        log0.contains("waiting for them"),
        "the daemon did not say it waits for the ranks:\n{log0}"
    );
    assert!(
        one_job,
        "no single job_id across both nodes: {:?}",
        c.identities()
    );
    // The daemon's STRAGGLER measure over the run's own truth (as tests/multirank.rs does).
    let t = truth_straggler(&c.agents.dir, 4);
    let e = t.expect(SCORE_MARGIN, PERSISTENCE_MARGIN);
    eprintln!("truth {t:?} → {e:?} (designed {designed:?})");
    let stragglers: Vec<&(Fired, f64)> = seen
        .iter()
        .filter(|(f, _)| f.alert == "TraceMLStraggler")
        .collect();
    match e {
        Expect::Straggler(r) => {
            let hit = stragglers
                .iter()
                .find(|(f, _)| f.rank == r.to_string())
                .unwrap_or_else(|| panic!("TraceMLStraggler never named rank {r}: {seen:?}"));
            assert_eq!(hit.0.node, node_of(r), "{hit:?}");
            assert!(
                hit.1 <= 120.0,
                "TraceMLStraggler fired {:.0} s after the job's start",
                hit.1
            );
            assert!(
                stragglers.iter().all(|(f, _)| f.rank == r.to_string()),
                "other ranks named: {stragglers:?}"
            );
            eprintln!(
                "TraceMLStraggler named rank {r} on {} {:.0} s after the job's start",
                hit.0.node, hit.1
            );
        }
        Expect::NoStraggler => assert!(stragglers.is_empty(), "truth {t:?}: {stragglers:?}"),
        Expect::Either => eprintln!("NOTE: truth within the margins; alerts {stragglers:?}"),
    }
}

#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn a_straggler_on_the_second_node_is_named_by_prometheus() {
    // Rank 3 (second agent) sleeps 40 ms at the start of every forward.
    straggler_job(
        "mn-straggler",
        &[
            "--mode",
            "ddp",
            "--steps",
            "1400",
            "--straggler-rank",
            "3",
            "--straggler-phase",
            "compute",
            "--straggler-ms",
            "40",
            "--straggler-how",
            "sleep",
        ],
        Some(3),
    );
}

#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn an_even_job_across_nodes_has_no_straggler() {
    straggler_job("mn-even", &["--mode", "ddp", "--steps", "1400"], None);
}

#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn a_hung_rank_on_the_second_node_is_named_by_prometheus_under_serve() {
    let Some(mut c) = start(
        "mn-hang",
        &[
            "--mode",
            "ddp",
            "--steps",
            "900",
            "--hang-rank",
            "3",
            "--hang-after",
            "450",
        ],
        Mode::Serve,
    ) else {
        return;
    };
    let dir = c.agents.dir.clone();
    let (seen, one_job) = c.watch(Duration::from_secs(240), |_, seen| {
        seen.iter()
            .any(|(f, _)| f.alert == "TraceMLHang" && f.rank == "3")
    });
    // The truth: the rank that wrote status "hung" (the others "blocked"), all still alive.
    let hung: Vec<u32> = (0..4)
        .filter(|r| {
            std::fs::read_to_string(dir.join(format!("truth-rank{r}.json")))
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                .is_some_and(|t| t["status"] == "hung")
        })
        .collect();
    assert_eq!(hung, vec![3], "the workload did not hang as designed");
    for r in 0..4 {
        let pid = pid_file(&dir, r).unwrap();
        assert!(alive(pid), "rank {r} is gone: not a hang");
    }
    assert!(
        one_job,
        "no single job_id across both nodes: {:?}",
        c.identities()
    );
    let hangs: Vec<&(Fired, f64)> = seen
        .iter()
        .filter(|(f, _)| f.alert == "TraceMLHang")
        .collect();
    assert!(!hangs.is_empty(), "no TraceMLHang: {seen:?}\n{}", c.log(1));
    let state = |q: &str| -> Vec<(String, f64)> {
        query(c.prom, q)
            .into_iter()
            .map(|(m, x)| (m["rank"].as_str().unwrap_or("").to_owned(), x))
            .collect()
    };
    assert!(
        hangs
            .iter()
            .any(|(f, _)| f.rank == "3" && f.node == "node-1"),
        "the hung rank is not named: {hangs:?}; in_collective {:?}; idle {:?}",
        state("traceml_in_collective"),
        state("traceml:rank_idle_seconds"),
    );
    // Known gap: a blocked rank whose wait the daemon did not see open (traceml_in_collective 0)
    // is named too; said, not failed (tests/README.md, "Multi-node").
    let others: Vec<&&(Fired, f64)> = hangs.iter().filter(|(f, _)| f.rank != "3").collect();
    if !others.is_empty() {
        let changes: Vec<String> = (0..2)
            .flat_map(|k| {
                c.log(k)
                    .lines()
                    .filter(|l| l.contains("in_collective"))
                    .map(|l| format!("node-{k}: {l}"))
                    .collect::<Vec<_>>()
            })
            .collect();
        eprintln!(
            "NOTE: blocked ranks named too: {others:?}; in_collective {:?}; its changes:\n{}",
            state("traceml_in_collective"),
            changes.join("\n")
        );
    }
    // The hang's onset: the end of rank 3's last step (its progress log, CLOCK_MONOTONIC ns).
    let onset = std::fs::read_to_string(dir.join("progress-rank3.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .max()
        .expect("rank 3 ended steps");
    let named = hangs
        .iter()
        .find(|(f, _)| f.rank == "3")
        .map(|(_, at)| *at)
        .unwrap();
    eprintln!(
        "TraceMLHang named rank 3 on node-1 {named:.0} s after the job's start, {:.1} s after \
         its last step ended (the shipped rules with the hang floor at 5 s: max(10 x median \
         step, 5 s) stalled, then `for: 15s`)",
        named - onset.saturating_sub(c.t0_ns) as f64 / 1e9
    );
}
