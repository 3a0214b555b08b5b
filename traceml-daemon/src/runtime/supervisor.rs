//! The supervisor of a fixed set of targets: `--pid` on a launcher or a rank of a multi-rank
//! job holds every rank of the job on this node in one [`Group`], follows ranks that start later
//! or restart (elastic) through the launcher's children, and ends when they all ended (and the
//! launcher is gone, or started no new rank within [`RESTART_WAIT`]), on SIGINT/SIGTERM/SIGHUP,
//! or after `--duration`. `serve` ([`super::serve`]) is the same with a /proc scanner.
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::event::EndReason;
use crate::host::jobs::JobSpec;
use crate::runtime::group::{Group, GroupConfig, job_info};
use crate::runtime::target::Options;
pub use crate::runtime::task::{Signals, block_on};
use crate::summary::Summary;

/// How long a job whose ranks all ended waits for its launcher to start new ones.
pub const RESTART_WAIT: Duration = Duration::from_secs(10);

/// How long stopping waits for the targets' summaries.
pub const STOP_WAIT: Duration = Duration::from_secs(8);

/// How `--pid` runs a multi-rank job.
pub struct JobRun {
    /// Settings of each rank's run (its pid is replaced).
    pub rank: Options,
    pub group: GroupConfig,
    pub duration: Option<Duration>,
    /// Written once every rank found is attached.
    pub ready_file: Option<PathBuf>,
    /// `top`: shown the job's summary every second.
    pub view: Option<JobViewFn>,
}

/// Shows the job's summary; true ends the run (the user detached).
pub type JobViewFn = Box<dyn FnMut(&Summary) -> bool>;

/// Whether process `pid` still runs (not a zombie).
fn alive(pid: u32) -> bool {
    crate::host::procinfo::start_state(pid).is_some_and(|(_, state)| state != 'Z')
}

/// Attaches to every rank of `job` and runs until they all end (or a signal, or the duration);
/// returns the job's summary. Each rank's own summary is written under `rank-<r>/`.
pub fn run_job(mut job: JobSpec, mut run: JobRun) -> Result<Summary, String> {
    block_on(async move {
        let Signals {
            mut term,
            mut int,
            mut hup,
        } = Signals::new().map_err(|e| e.to_string())?;
        let mut group = Group::new(run.group, job_info(&job));
        for p in job.ranks.drain(..) {
            group.add(p, &run.rank);
        }
        // A launcher still in rendezvous has no ranks yet: wait for them, saying so.
        if group.is_empty() {
            let l = job.launcher.map(|l| l.to_string()).unwrap_or_default();
            tracing::info!("launcher pid {l} has no ranks yet; waiting for them");
            eprintln!(
                "traceml-daemon: pid {l} launches a job whose ranks do not exist yet \
                 (rendezvous); waiting for them, attaching to each as it appears"
            );
        }
        let mut ready = run.ready_file.clone();
        let mut all_ended_at: Option<Instant> = None;
        // Fast at first (readiness), then every second.
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_second = Instant::now();
        let deadline = run.duration.map(|d| tokio::time::Instant::now() + d);
        let stopped = loop {
            tokio::select! {
                _ = tick.tick() => {
                    if let Some(f) = ready.as_ref().filter(|_| !group.is_empty() && group.attached()) {
                        let _ = std::fs::write(f, "attached\n");
                        ready = None;
                    }
                    let now = Instant::now();
                    if now < last_second + Duration::from_secs(1) {
                        continue;
                    }
                    last_second = now;
                    // Ranks that started later or restarted (elastic): new pids of the job.
                    if let Some(l) = job.launcher {
                        for (p, env) in crate::host::jobs::ranks_below(l) {
                            if !group.has(p.pid) {
                                // Attached during rendezvous: the job's description comes
                                // with its first ranks.
                                let (run_id, master) = crate::host::jobs::rendezvous_of(&env);
                                let info = &mut group.info;
                                info.world_size = info.world_size.or(p.world_size);
                                info.run_id = info.run_id.take().or(run_id);
                                info.master = info.master.take().or(master);
                                group.add(p, &run.rank);
                            }
                        }
                    }
                    group.tick(now);
                    if let Some(view) = &mut run.view
                        && let Some(s) = group.live_summary()
                        && view(&s)
                    {
                        break Some(EndReason::Interrupted);
                    }
                    if group.running() {
                        all_ended_at = None;
                    } else {
                        // Every rank ended: the job ends with its launcher, or when no rank
                        // restarted within RESTART_WAIT (an elastic agent restarts them at once).
                        let since = *all_ended_at.get_or_insert(now);
                        if !job.launcher.is_some_and(alive)
                            || (!group.is_empty() && since.elapsed() >= RESTART_WAIT)
                        {
                            break None;
                        }
                    }
                }
                _ = term.recv() => break Some(EndReason::Terminated),
                _ = int.recv() => break Some(EndReason::Interrupted),
                _ = hup.recv() => break Some(EndReason::Terminated),
                _ = async { match deadline { Some(d) => tokio::time::sleep_until(d).await, None => std::future::pending().await } } => {
                    break Some(EndReason::DurationElapsed);
                }
            }
        };
        if let Some(reason) = stopped {
            group.stop(reason);
        }
        group
            .finished_by(tokio::time::Instant::now() + STOP_WAIT)
            .await;
        group
            .settle()
            .ok_or_else(|| "no rank of the job could be attached".to_owned())
    })
    .map_err(|e| e.to_string())?
}
