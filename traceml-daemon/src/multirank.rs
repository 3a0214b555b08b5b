//! One daemon for a multi-rank job: every rank of the job on this node attached at once (one
//! [`live::run`] per rank on one thread, each folded by its own bounded [`Collector`]), ranks
//! that start later or restart (elastic) followed through the launcher's children, a HANG
//! written as soon as a rank completes no step for `max(10 × its median step, --hang-after)`,
//! and at the end every rank's summary and the job's ([`crate::ranks::combine`]).
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::analysis::Collector;
use crate::event::EndReason;
use crate::job::{JobSpec, RankProc};
use crate::live;
use crate::ranks::{RankRun, Stuck};
use crate::summary::{JobInfo, Summary};

/// How a multi-rank run is carried out.
#[derive(Clone, Debug)]
pub struct JobOptions {
    /// Settings for each rank's run (its pid is replaced).
    pub rank: live::Options,
    /// The floor of the hang threshold.
    pub hang_after: Duration,
    /// Where each rank's own summary goes (`rank-<r>/`) and the interim HANG summary.
    pub dir: PathBuf,
    pub duration: Option<Duration>,
    /// Where the job's series go on `/metrics` (`--metrics-addr`), under this job label; each
    /// rank's with its rank label.
    pub metrics: Option<(crate::metrics::http::Shared, String)>,
    /// `--record FILE`: each rank's stream to `FILE` with `.rank<r>` before its extension
    /// ([`crate::record::rank_path`]).
    pub record: Option<PathBuf>,
}

struct Rank {
    proc: RankProc,
    fold: Rc<RefCell<Collector>>,
    /// Mean GPU utilization at the rank's latest sample, for `/metrics` (`None` without NVML).
    gpu: Rc<std::cell::Cell<Option<f64>>>,
    stop: watch::Sender<Option<EndReason>>,
    done: tokio::task::JoinHandle<()>,
    progress: Progress,
}

/// How long a job whose ranks all ended waits for its launcher to start new ones.
const RESTART_WAIT: Duration = Duration::from_secs(10);

/// Whether process `pid` still runs (not a zombie).
fn alive(pid: u32) -> bool {
    crate::procinfo::start_state(pid).is_some_and(|(_, state)| state != 'Z')
}

/// The job as the summary describes it.
pub(crate) fn job_info(job: &JobSpec) -> JobInfo {
    JobInfo {
        launcher_pid: job.launcher,
        world_size: job.ranks.iter().find_map(|r| r.world_size),
        run_id: job.run_id.clone(),
        master: job.master.clone(),
        ranks_measured: 0,
    }
}

/// Where a rank's run says it is attached.
fn ready_path(dir: &Path, pid: u32) -> PathBuf {
    dir.join(format!(".attached-{pid}"))
}

/// The rank's recording, when asked for; a file that cannot be created is said and skipped
/// (the other ranks and the summaries go on).
fn rank_writer(record: Option<&Path>, rank: u32) -> Option<crate::record::Writer> {
    let path = crate::record::rank_path(record?, rank);
    match crate::output::create_file(&path, crate::output::Owner::from_sudo())
        .map_err(|e| e.to_string())
        .and_then(|f| crate::record::Writer::from_file(f, &path).map_err(|e| e.to_string()))
    {
        Ok(w) => {
            tracing::info!("rank {rank}: recording to {}", path.display());
            Some(w)
        }
        Err(e) => {
            tracing::warn!("rank {rank}: cannot record to {}: {e}", path.display());
            None
        }
    }
}

fn start(p: RankProc, opts: &live::Options, dir: &Path, record: Option<&Path>) -> Rank {
    let fold = Rc::new(RefCell::new(Collector::new()));
    let (tx, rx) = watch::channel(None);
    let mut o = opts.clone();
    o.pid = p.pid;
    o.ready_file = Some(ready_path(dir, p.pid));
    o.duration = None;
    o.stop = Some(rx);
    let sink = fold.clone();
    let gpu = Rc::new(std::cell::Cell::new(None));
    let sink_gpu = gpu.clone();
    let pid = p.pid;
    let mut writer = rank_writer(record, p.rank);
    let done = tokio::task::spawn_local(async move {
        let r = live::run(&o, move |item| {
            if let crate::event::StreamItem::Sample(s) = item {
                sink_gpu.set(crate::metrics::gpu_utilization(s));
            }
            if let Some(w) = writer.as_mut() {
                w.write_live(item).map_err(|e| e.to_string())?;
            }
            sink.borrow_mut().push(item);
            Ok(())
        })
        .await;
        match r {
            Ok(reason) => tracing::info!("rank pid {pid}: run ended ({reason:?})"),
            Err(e) => tracing::warn!("rank pid {pid}: {e}"),
        }
    });
    tracing::info!("attached to rank {} (pid {})", p.rank, p.pid);
    Rank {
        proc: p,
        fold,
        gpu,
        stop: tx,
        done,
        progress: Progress::new(),
    }
}

/// The job on `/metrics`: each running rank's values so far, and the job's verdict from every
/// rank's snapshot (STRAGGLER/HANG as the rules see the job now).
fn export(
    m: &(crate::metrics::http::Shared, String),
    ranks: &[Rank],
    job: &JobSpec,
    stuck: &[Stuck],
) {
    let (exporter, label) = m;
    let mut runs = Vec::new();
    let mut values = Vec::new();
    for r in ranks.iter().filter(|r| !r.done.is_finished()) {
        let f = r.fold.borrow();
        if f.events() == 0 {
            continue;
        }
        let (s, t) = f.snapshot_with_totals();
        let mut v = crate::metrics::RankValues::from_summary(&s, &t, r.gpu.get());
        v.last_step_end_unix = r.progress.last_step_unix();
        // In a collective: a wait probe entered and not returned, or (where the wait is not
        // probed) the latest Python stack inside a collective call.
        let stack = f.last_stack();
        v.in_collective = Some(f.in_collective_wait() || crate::ranks::in_collective(&stack));
        values.push((r.proc.rank.to_string(), v));
        runs.push(RankRun {
            rank: r.proc.rank,
            local_rank: r.proc.local_rank,
            pid: r.proc.pid,
            summary: s,
            stack: Vec::new(),
        });
    }
    let verdict =
        crate::ranks::combine(runs, job_info(job), stuck).map(|s| crate::metrics::Verdict::of(&s));
    let mut e = exporter.lock().unwrap_or_else(|p| p.into_inner());
    for (rank, v) in values {
        e.update(label, &rank, v);
    }
    if let Some(v) = verdict {
        e.set_verdict(label, v);
    }
}

/// The job's runs as the rules take them (`stacks`: with each rank's current stack).
fn runs(ranks: &[&Rank], stacks: bool) -> Vec<RankRun> {
    ranks
        .iter()
        .map(|r| {
            let f = r.fold.borrow();
            RankRun {
                rank: r.proc.rank,
                local_rank: r.proc.local_rank,
                pid: r.proc.pid,
                summary: f.snapshot(),
                stack: if stacks { f.last_stack() } else { Vec::new() },
            }
        })
        .collect()
}

/// Ranks that completed no step for max(10 × their median step, `floor`).
fn stuck(ranks: &mut [Rank], floor: Duration) -> Vec<Stuck> {
    let now = Instant::now();
    let mut out = Vec::new();
    for r in ranks.iter_mut() {
        if r.done.is_finished() {
            continue;
        }
        if let Some(idle) = idle_rank(&mut r.fold.borrow_mut(), &mut r.progress, now, floor) {
            out.push(Stuck {
                rank: r.proc.rank,
                idle_s: idle.as_secs_f64(),
            });
        }
    }
    out
}

/// A rank's progress between hang checks: its steps at the last change, when, and its mean
/// step then.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Progress {
    steps: u64,
    since: Instant,
    mean: Duration,
}

impl Progress {
    pub(crate) fn new() -> Self {
        Self {
            steps: 0,
            since: Instant::now(),
            mean: Duration::ZERO,
        }
    }

    /// When the step count last grew, unix seconds; `None` before the first step.
    fn last_step_unix(&self) -> Option<f64> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?;
        (self.steps > 0).then(|| (now.saturating_sub(self.since.elapsed())).as_secs_f64())
    }

    /// How long the rank has completed no step, when that is a hang: over max(10 × its mean
    /// step, `floor`) with at least one step done, given its `steps` (and their total time)
    /// now. Only more steps are progress: a rank whose run ended hands its folds back empty
    /// (fewer steps) while its target finishes, and a hung rank killed that way stays hung.
    fn observe(
        &mut self,
        steps: u64,
        total_ns: u64,
        now: Instant,
        floor: Duration,
    ) -> Option<Duration> {
        if steps > self.steps {
            *self = Progress {
                steps,
                since: now,
                mean: Duration::from_nanos(total_ns / steps),
            };
            return None;
        }
        let idle = now.duration_since(self.since);
        (self.steps > 0 && idle >= (self.mean * 10).max(floor)).then_some(idle)
    }
}

/// [`Progress::observe`] of a running rank's folds.
pub(crate) fn idle_rank(
    fold: &mut Collector,
    progress: &mut Progress,
    now: Instant,
    floor: Duration,
) -> Option<Duration> {
    fold.advance(live::monotonic_ns());
    let (n, total_ns) = fold.steps();
    progress.observe(n, total_ns, now, floor)
}

/// Writes `final_summary.json` into `dir`, created if missing (atomically, no link followed;
/// under `sudo` both go to the user, as a single-pid run's outputs do; see `output`).
fn write_json(dir: &Path, s: &Summary) {
    let mut json = Vec::new();
    if crate::render::render_json(s, &mut json).is_ok()
        && let Err(e) = crate::output::OutDir::create(dir, crate::output::Owner::from_sudo())
            .and_then(|out| out.write("final_summary.json", &json))
    {
        tracing::warn!(
            "cannot write {}: {e}",
            dir.join("final_summary.json").display()
        );
    }
}

/// Attaches to every rank of `job` and runs until they all end (or SIGINT/SIGTERM/SIGHUP, or
/// the duration); returns the job's summary. Each rank's own summary is written under
/// `dir/rank-<r>/`.
pub fn run(mut job: JobSpec, opts: JobOptions) -> Result<Summary, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let crate::serve::Signals {
            mut term,
            mut int,
            mut hup,
        } = crate::serve::Signals::new()?;
        let announce = |p: &RankProc| {
            if let Some((exporter, label)) = &opts.metrics {
                exporter.lock().unwrap_or_else(|p| p.into_inner()).attached(
                    label,
                    &p.rank.to_string(),
                    crate::metrics::JobInfo::of(p.pid),
                );
            }
        };
        let mut ranks: Vec<Rank> = job
            .ranks
            .drain(..)
            .map(|p| {
                announce(&p);
                start(p, &opts.rank, &opts.dir, opts.record.as_deref())
            })
            .collect();
        // A launcher still in rendezvous has no ranks yet: wait for them, saying so.
        let mut ready_pending = ranks.is_empty() && opts.rank.ready_file.is_some();
        if ranks.is_empty() {
            let l = job.launcher.map(|l| l.to_string()).unwrap_or_default();
            tracing::info!("launcher pid {l} has no ranks yet; waiting for them");
            eprintln!(
                "traceml-daemon: pid {l} launches a job whose ranks do not exist yet \
                 (rendezvous); waiting for them, attaching to each as it appears"
            );
        }
        let mut all_ended_at: Option<Instant> = None;
        // Ready once every rank is attached (or has failed to).
        if let Some(ready) = opts.rank.ready_file.as_ref().filter(|_| !ranks.is_empty()) {
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(30)
                && !ranks
                    .iter()
                    .all(|r| r.done.is_finished() || ready_path(&opts.dir, r.proc.pid).exists())
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            for r in &ranks {
                let _ = std::fs::remove_file(ready_path(&opts.dir, r.proc.pid));
            }
            let _ = std::fs::write(ready, "attached\n");
        }
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let deadline = opts.duration.map(|d| tokio::time::Instant::now() + d);
        let mut hang_reported = false;
        let mut stopped = None;
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    // Ranks that started later or restarted (elastic): new pids of the job.
                    if let Some(l) = job.launcher {
                        let known: Vec<u32> = ranks.iter().map(|r| r.proc.pid).collect();
                        for (p, _) in crate::job::ranks_below(l) {
                            if !known.contains(&p.pid) {
                                announce(&p);
                                ranks.push(start(p, &opts.rank, &opts.dir, opts.record.as_deref()));
                            }
                        }
                    }
                    let s = stuck(&mut ranks, opts.hang_after);
                    if !s.is_empty() && !hang_reported {
                        hang_reported = true;
                        let live: Vec<&Rank> = ranks.iter().filter(|r| !r.done.is_finished()).collect();
                        if let Some(sum) = crate::ranks::combine(runs(&live, true), job_info(&job), &s) {
                            tracing::warn!("HANG: {}", sum.primary_diagnosis.why);
                            write_json(&opts.dir, &sum);
                        }
                    } else if s.is_empty() {
                        hang_reported = false;
                    }
                    if let Some(m) = &opts.metrics {
                        export(m, &ranks, &job, &s);
                    }
                    if ready_pending
                        && !ranks.is_empty()
                        && ranks
                            .iter()
                            .all(|r| r.done.is_finished() || ready_path(&opts.dir, r.proc.pid).exists())
                        && let Some(ready) = &opts.rank.ready_file
                    {
                        ready_pending = false;
                        for r in &ranks {
                            let _ = std::fs::remove_file(ready_path(&opts.dir, r.proc.pid));
                        }
                        let _ = std::fs::write(ready, "attached\n");
                    }
                    if ranks.iter().all(|r| r.done.is_finished()) {
                        // Every rank ended: the job ends with its launcher, or when no rank
                        // restarted within RESTART_WAIT (an elastic agent restarts them at once).
                        let launcher_alive = job.launcher.is_some_and(alive);
                        let since = *all_ended_at.get_or_insert_with(Instant::now);
                        if !launcher_alive
                            || (!ranks.is_empty() && since.elapsed() >= RESTART_WAIT)
                        {
                            break;
                        }
                    } else {
                        all_ended_at = None;
                    }
                }
                _ = term.recv() => { stopped = Some(EndReason::Terminated); break }
                _ = int.recv() => { stopped = Some(EndReason::Interrupted); break }
                _ = hup.recv() => { stopped = Some(EndReason::Terminated); break }
                _ = async { match deadline { Some(d) => tokio::time::sleep_until(d).await, None => std::future::pending().await } } => {
                    stopped = Some(EndReason::DurationElapsed);
                    break;
                }
            }
        }
        let hung = stuck(&mut ranks, opts.hang_after);
        let stacks = !hung.is_empty();
        // Stacks and the job's view are read before the ranks are detached.
        let live_stacks: HashMap<u32, Vec<String>> = if stacks {
            ranks.iter().map(|r| (r.proc.rank, r.fold.borrow().last_stack())).collect()
        } else {
            HashMap::new()
        };
        if let Some(reason) = stopped {
            for r in &ranks {
                let _ = r.stop.send(Some(reason));
            }
        }
        for r in &mut ranks {
            let _ = tokio::time::timeout(Duration::from_secs(8), &mut r.done).await;
        }
        let mut out = Vec::new();
        let mut finals = Vec::new();
        for r in ranks {
            let fold = Rc::try_unwrap(r.fold)
                .map(RefCell::into_inner)
                .unwrap_or_else(|rc| {
                    let f = rc.borrow();
                    let fresh = f.fresh_window();
                    drop(f);
                    rc.replace(fresh)
                });
            if fold.events() == 0 {
                continue;
            }
            let (summary, totals) = fold.finish_with_totals();
            let dir = opts.dir.join(format!("rank-{}", r.proc.rank));
            write_json(&dir, &summary);
            finals.push(crate::metrics::RankValues::from_summary(
                &summary,
                &totals,
                r.gpu.get(),
            ));
            out.push(RankRun {
                rank: r.proc.rank,
                local_rank: r.proc.local_rank,
                pid: r.proc.pid,
                summary,
                stack: live_stacks.get(&r.proc.rank).cloned().unwrap_or_default(),
            });
        }
        let ranks_ended: Vec<u32> = out.iter().map(|r| r.rank).collect();
        let summary = crate::ranks::combine(out, job_info(&job), &hung)
            .ok_or_else(|| "no rank of the job could be attached".to_owned())?;
        if let Some((exporter, label)) = &opts.metrics {
            let mut e = exporter.lock().unwrap_or_else(|p| p.into_inner());
            for (rank, values) in ranks_ended.iter().zip(finals) {
                e.update(label, &rank.to_string(), values);
                e.ended(label, &rank.to_string(), Instant::now());
            }
            e.set_verdict(label, crate::metrics::Verdict::of(&summary));
        }
        Ok(summary)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hung_rank_stays_hung_when_its_folds_are_handed_back_empty() {
        let t0 = Instant::now();
        let floor = Duration::from_secs(5);
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut p = Progress::new();
        assert_eq!(p.observe(0, 0, at(0), floor), None, "no step yet");
        assert_eq!(p.observe(0, 0, at(100), floor), None, "no step is no hang");
        assert_eq!(p.observe(10, 1_000_000_000, at(100), floor), None);
        assert_eq!(
            p.observe(10, 1_000_000_000, at(104), floor),
            None,
            "under the floor"
        );
        assert_eq!(
            p.observe(10, 1_000_000_000, at(106), floor),
            Some(Duration::from_secs(6))
        );
        // The run ended: its folds are new (no step), the rank is still hung.
        assert_eq!(
            p.observe(0, 0, at(107), floor),
            Some(Duration::from_secs(7))
        );
        // A new step is progress.
        assert_eq!(p.observe(11, 1_100_000_000, at(108), floor), None);
        // 10 × a long mean step is the threshold when over the floor: 10 × 2 s.
        let mut p = Progress::new();
        p.observe(3, 6_000_000_000, at(0), floor);
        assert_eq!(p.observe(3, 6_000_000_000, at(19), floor), None);
        assert!(p.observe(3, 6_000_000_000, at(20), floor).is_some());
    }
}
