//! The ranks of one multi-rank job on this node, as one group: each rank runs its own target
//! task ([`task::drive`]: summaries under `rank-<r>/`, its series under the job's label), and
//! the group holds what only the job can say: a HANG as soon as ranks have waited inside a
//! collective for `max(10 × the mean step, 5 s)` while another rank is outside every collective
//! ([`crate::ranks::collective_hang`]), or a rank completes no step for
//! `max(10 × its mean step, hang_after)` (written to the job's `final_summary.json` at once,
//! with every running rank's stack), the job's verdict on `/metrics` from every rank, and once
//! no rank runs the job's summary ([`crate::ranks::combine`]: STRAGGLER and the ranks table).
//! `--pid` on a launcher or rank ([`super::supervisor`]) and `serve` ([`super::serve`]) hold
//! their jobs in this same group.
//!
//! The group's output has a target's shape: at each of its ticks it looks at its ranks (the
//! hang check reads what each rank's task last folded, never advancing a rank's engine itself)
//! and hands one [`JobTick`] to the job's sinks ([`JobSink`]: the job's files, its verdict on
//! `/metrics`), which join the ranks once, for all of them; once no rank runs, the job's summary
//! goes to them as a [`JobEnd`].
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::event::EndReason;
use crate::host::jobs::{JobSpec, RankProc};
use crate::host::output::Owner;
use crate::ranks::{RankRun, Stuck};
use crate::runtime::sinks::{
    self, JobEnd, JobFiles, JobMetrics, JobSink, JobTick, RecordingSink, SummaryFiles,
};
use crate::runtime::target::Options;
use crate::runtime::task::{self, Folds, Sink, Sinks};
use crate::summary::{JobInfo, Summary};

/// The job as the summary describes it.
pub fn job_info(job: &JobSpec) -> JobInfo {
    JobInfo {
        launcher_pid: job.launcher,
        world_size: job.ranks.iter().find_map(|r| r.world_size),
        run_id: job.run_id.clone(),
        master: job.master.clone(),
        ranks_measured: 0,
        restarts: job.ranks.iter().map(|r| r.restart).max().unwrap_or(0),
    }
}

/// How the group's ranks are run and where their results go.
#[derive(Clone)]
pub struct GroupConfig {
    /// The job's name: its `job` label on `/metrics` and its directory's name.
    pub name: String,
    /// The job's directory: its summary at the top, each rank's under `rank-<r>/` (a restarted
    /// attempt's under `rank-<r>-restart-<k>/`, [`RankProc::dir_name`]).
    pub dir: PathBuf,
    /// Who owns what is written (`--pid` under `sudo`: the user).
    pub owner: Option<Owner>,
    /// The floor of the hang threshold.
    pub hang_after: Duration,
    /// Each rank's window summaries (`serve`'s `--window`).
    pub window: Option<Duration>,
    /// `/metrics`, when served.
    pub metrics: Option<crate::metrics::http::Shared>,
    /// The group writes the job's final summary in `dir` (`serve`); `--pid` writes it itself,
    /// in the formats asked for. The HANG summary is written either way.
    pub writes_final: bool,
    /// `--record FILE`: each rank's stream to `FILE` with `.rank<r>` (`.rank<r>.restart<k>` in a
    /// restarted attempt) before its extension ([`crate::record::rank_path`]).
    pub record: Option<PathBuf>,
}

struct GroupRank {
    proc: RankProc,
    folds: Rc<RefCell<Folds>>,
    stop: watch::Sender<Option<EndReason>>,
    done: tokio::task::JoinHandle<()>,
}

impl GroupRank {
    fn running(&self) -> bool {
        !self.done.is_finished()
    }

    /// The rank as the rules take it, with its current stack when asked.
    fn run(&self, stack: bool) -> RankRun {
        let f = self.folds.borrow();
        RankRun {
            rank: self.proc.rank,
            local_rank: self.proc.local_rank,
            pid: self.proc.pid,
            restart: self.proc.restart,
            summary: f.run.snapshot(),
            stack: if stack {
                f.run.last_stack()
            } else {
                Vec::new()
            },
        }
    }
}

/// The running ranks' runs so far, without their stacks.
fn running_runs(ranks: &[GroupRank]) -> Vec<RankRun> {
    let running = ranks.iter().filter(|r| r.running());
    running.map(|r| r.run(false)).collect()
}

/// One job's ranks on this node.
pub struct Group {
    pub cfg: GroupConfig,
    pub info: JobInfo,
    ranks: Vec<GroupRank>,
    /// Final summaries of the ranks that ended (pushed by their tasks).
    finished: Rc<RefCell<Vec<RankRun>>>,
    /// Rank summaries the job's summary was last written from.
    written: usize,
    /// The ranks stuck at the last check, and every rank's stack then (for the HANG).
    hung: Vec<Stuck>,
    hang_stacks: HashMap<u32, Vec<String>>,
    /// Since when each rank has been inside a collective (at the group's looks).
    in_collective: HashMap<u32, Instant>,
    /// Where the job's summary goes: its files, its verdict on `/metrics`.
    sinks: Vec<Box<dyn JobSink>>,
}

impl Group {
    pub fn new(cfg: GroupConfig, info: JobInfo) -> Group {
        let mut sinks: Vec<Box<dyn JobSink>> = vec![Box::new(JobFiles::new(
            &cfg.name,
            cfg.dir.clone(),
            cfg.owner,
            cfg.writes_final,
        ))];
        if let Some(exporter) = &cfg.metrics {
            sinks.push(Box::new(JobMetrics::new(exporter.clone(), &cfg.name)));
        }
        Group {
            cfg,
            info,
            ranks: Vec::new(),
            finished: Rc::default(),
            written: 0,
            hung: Vec::new(),
            hang_stacks: HashMap::new(),
            in_collective: HashMap::new(),
            sinks,
        }
    }

    /// Whether rank process `pid` is in the group.
    pub fn has(&self, pid: u32) -> bool {
        self.ranks.iter().any(|r| r.proc.pid == pid)
    }

    pub fn is_empty(&self) -> bool {
        self.ranks.is_empty()
    }

    /// A rank of the group still runs.
    pub fn running(&self) -> bool {
        self.ranks.iter().any(GroupRank::running)
    }

    /// Every rank is attached (or its run is over).
    pub fn attached(&self) -> bool {
        self.ranks
            .iter()
            .all(|r| !r.running() || r.folds.borrow().attached)
    }

    /// Attaches to rank `p` with `opts` (its pid replaced): its own task and sinks.
    pub fn add(&mut self, p: RankProc, opts: &Options) {
        let mut o = opts.clone();
        o.pid = p.pid;
        o.ready_file = None;
        o.duration = None;
        let (tx, rx) = watch::channel(None);
        o.stop = Some(rx);
        let rank_dir = self.cfg.dir.join(p.dir_name());
        let mut list: Vec<Box<dyn Sink>> = Vec::new();
        if let Some(path) = &self.cfg.record {
            let path = crate::record::rank_path(path, p.rank, p.restart);
            match RecordingSink::create(&path) {
                Ok(r) => {
                    tracing::info!("rank {}: recording to {}", p.rank, path.display());
                    list.push(Box::new(r));
                }
                // The other ranks and the summaries go on.
                Err(e) => tracing::warn!("rank {}: {e}", p.rank),
            }
        }
        if let Some(exporter) = &self.cfg.metrics {
            let m = sinks::Metrics::attach(exporter.clone(), &self.cfg.name, p.rank, p.pid, false);
            list.push(Box::new(m));
        }
        list.push(Box::new(SummaryFiles::new(rank_dir, self.cfg.owner, p.pid)));
        let sinks: Sinks = Rc::new(RefCell::new(list));
        let folds = Rc::new(RefCell::new(Folds::windowed(self.cfg.window)));
        let (task_folds, finished, proc) = (folds.clone(), self.finished.clone(), p.clone());
        let done = tokio::task::spawn_local(async move {
            let out = task::drive(&o, task_folds, sinks).await;
            for e in &out.sink_errors {
                tracing::warn!("rank {} (pid {}): {e}", proc.rank, proc.pid);
            }
            if let (Err(e), None) = (&out.result, &out.summary) {
                tracing::warn!("rank {} (pid {}): not attached: {e}", proc.rank, proc.pid);
            }
            if let Some((summary, _)) = out.summary {
                finished.borrow_mut().push(RankRun {
                    rank: proc.rank,
                    local_rank: proc.local_rank,
                    pid: proc.pid,
                    restart: proc.restart,
                    summary,
                    stack: Vec::new(),
                });
            }
        });
        tracing::info!(
            "job {}: attaching to rank {} (pid {})",
            self.cfg.name,
            p.rank,
            p.pid
        );
        self.ranks.push(GroupRank {
            proc: p,
            folds,
            stop: tx,
            done,
        });
    }

    /// Ranks that completed no step for max(10 × their mean step, the floor); else, when some
    /// ranks have waited in a collective for seconds while another is outside it, every rank
    /// ([`crate::ranks::collective_hang`]). Each rank as its task's last tick left its folds:
    /// the engine is advanced there only.
    fn stuck(&mut self, now: Instant) -> Vec<Stuck> {
        let floor = self.cfg.hang_after;
        let mut looks = Vec::new();
        let mut slow = Vec::new();
        for r in self.ranks.iter().filter(|r| r.running()) {
            let f = r.folds.borrow();
            let (progress, in_collective) = (f.progress, f.in_collective());
            drop(f);
            let since = if in_collective {
                Some(*self.in_collective.entry(r.proc.rank).or_insert(now))
            } else {
                self.in_collective.remove(&r.proc.rank);
                None
            };
            looks.push(crate::ranks::Look {
                rank: r.proc.rank,
                idle: progress.idle(now),
                mean_step: progress.mean(),
                in_collective_for: since.map(|s| now.duration_since(s)),
            });
            if let Some(idle) = progress.hung(now, floor) {
                slow.push(Stuck {
                    rank: r.proc.rank,
                    idle_s: idle.as_secs_f64(),
                });
            }
        }
        if !slow.is_empty() {
            return slow;
        }
        crate::ranks::collective_hang(&looks).unwrap_or_default()
    }

    /// Once a second while ranks run: the hang check (a HANG is logged at warning and handed to
    /// the sinks once per hang, again after the job made progress: the job's
    /// `final_summary.json` written at once), then the same look to every sink (every
    /// [`crate::metrics::REFRESH`] the job's verdict on `/metrics`).
    pub fn tick(&mut self, now: Instant) {
        let stuck = self.stuck(now);
        let mut hang = false;
        if stuck.is_empty() {
            self.hung.clear();
        } else {
            hang = self.hung.is_empty();
            self.hung = stuck;
        }
        // At a hang the ranks are joined with their stacks (kept for the job's summary).
        let stacks = std::cell::Cell::new(hang.then(|| self.read_stacks()));
        let Group {
            ranks,
            info,
            hung,
            sinks,
            cfg,
            ..
        } = self;
        let join = || {
            let runs = stacks.take().unwrap_or_else(|| running_runs(ranks));
            crate::ranks::combine(runs, info.clone(), hung)
        };
        let tick = JobTick::new(now, hang, &join);
        if let Some(sum) = tick.summary().filter(|_| hang) {
            tracing::warn!("job {}: HANG: {}", cfg.name, sum.primary_diagnosis.why);
        }
        for sink in sinks.iter_mut() {
            sink.tick(&tick);
        }
    }

    /// Every running rank's stack, kept for the job's summary while it is hung.
    fn read_stacks(&mut self) -> Vec<RankRun> {
        let runs: Vec<RankRun> = self
            .ranks
            .iter()
            .filter(|r| r.running())
            .map(|r| r.run(true))
            .collect();
        self.hang_stacks = runs.iter().map(|r| (r.rank, r.stack.clone())).collect();
        runs
    }

    /// The job's summary now: the running ranks' runs so far, joined (`None`: no rank yet).
    pub fn live_summary(&self) -> Option<Summary> {
        crate::ranks::combine(running_runs(&self.ranks), self.info.clone(), &self.hung)
    }

    /// Asks every running rank to end (`reason`), reading their stacks first when the job is
    /// hung (the summary shows where each rank waits). Once no rank runs there is nothing to
    /// look at: the hang of the last look stands (ranks killed while hung leave a hung job).
    pub fn stop(&mut self, reason: EndReason) {
        if self.running() {
            self.hung = self.stuck(Instant::now());
            if !self.hung.is_empty() {
                self.read_stacks();
            }
        }
        for r in &self.ranks {
            let _ = r.stop.send(Some(reason));
        }
    }

    /// Waits for every rank's task, until `deadline` at most.
    pub async fn finished_by(&mut self, deadline: tokio::time::Instant) {
        for r in &mut self.ranks {
            if tokio::time::timeout_at(deadline, &mut r.done)
                .await
                .is_err()
            {
                tracing::warn!(
                    "job {}: rank {} did not finish its summary in time",
                    self.cfg.name,
                    r.proc.rank
                );
            }
        }
    }

    /// The job's summary once no rank runs, when a rank ended since the last one (a job that
    /// ended hung says so, with the stacks read while it hung), handed to the job's sinks: on
    /// `/metrics` and, with [`GroupConfig::writes_final`], in the job's directory. `None` when
    /// nothing is new or no rank was measured.
    pub fn settle(&mut self) -> Option<Summary> {
        if self.running() {
            return None;
        }
        let mut runs = self.finished.borrow().clone();
        if runs.len() <= self.written {
            return None;
        }
        self.written = runs.len();
        if !self.hung.is_empty() {
            for r in &mut runs {
                r.stack = self.hang_stacks.get(&r.rank).cloned().unwrap_or_default();
            }
        }
        let n = runs.len();
        let Some(sum) = crate::ranks::combine(runs, self.info.clone(), &self.hung) else {
            tracing::warn!("job {}: no rank could be measured", self.cfg.name);
            return None;
        };
        let end = JobEnd {
            summary: &sum,
            runs: n,
        };
        for sink in &mut self.sinks {
            sink.end(&end);
        }
        Some(sum)
    }

    /// The job's directory.
    pub fn dir(&self) -> &Path {
        &self.cfg.dir
    }
}

#[cfg(test)]
mod tests {
    use super::task::Progress;
    use super::*;
    use crate::metrics::http::Shared;
    use crate::summary::DiagnosisKind;

    /// A recorded input-bound run (tests/fixtures/recordings).
    fn recorded() -> Vec<crate::event::StreamItem> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/recordings/input_bound_single.jsonl.gz");
        crate::record::read(&path).expect("recording").items
    }

    /// Two running ranks of `items` (no eBPF: a task that never ends on `rt`), their folds as
    /// their tasks left them at their last step, at `t0`; on `/metrics` when served.
    fn add_two_ranks(
        g: &mut Group,
        items: &[crate::event::StreamItem],
        rt: &tokio::runtime::Runtime,
        t0: Instant,
    ) {
        for rank in 0..2 {
            let pid = u32::MAX - 10 - rank;
            if let Some(exporter) = &g.cfg.metrics {
                sinks::Metrics::attach(exporter.clone(), &g.cfg.name, rank, pid, false);
            }
            let mut folds = Folds::windowed(None);
            for item in items {
                folds.push(item);
            }
            folds.progress.update(10, 1_000_000_000, t0);
            g.ranks.push(GroupRank {
                proc: RankProc {
                    pid,
                    rank,
                    local_rank: Some(rank),
                    world_size: Some(2),
                    restart: 0,
                },
                folds: Rc::new(RefCell::new(folds)),
                stop: watch::channel(None).0,
                done: rt.spawn(std::future::pending()),
            });
        }
    }

    /// The ranks' runs ended (their tasks handed back their summaries).
    fn end_ranks(g: &mut Group) {
        let runs: Vec<RankRun> = g.ranks.drain(..).map(|r| r.run(false)).collect();
        g.finished.borrow_mut().extend(runs);
    }

    fn config(dir: &Path, metrics: Option<Shared>) -> GroupConfig {
        GroupConfig {
            name: "job".into(),
            dir: dir.into(),
            owner: None,
            hang_after: Duration::from_secs(5),
            window: None,
            metrics,
            writes_final: true,
            record: None,
        }
    }

    /// The job's sinks read one look: pushed in either order, the job's files (the HANG summary
    /// at once, then the final summary) and `/metrics` (the job's verdict, set from the same
    /// joined summary at the hang) say the same. Two ranks of a recorded run (no eBPF): their
    /// folds as their tasks left them, the last step 100 s before the group's look.
    #[test]
    fn the_order_of_the_job_sinks_changes_nothing() {
        let items = recorded();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let t0 = Instant::now();
        let text = |e: &Shared| -> Vec<String> {
            let text = e.lock().unwrap().encode();
            text.lines()
                .filter(|l| !l.contains("last_step"))
                .map(str::to_owned)
                .collect()
        };
        let outputs = |metrics_first: bool| {
            let dir = tempfile::tempdir().unwrap();
            let exporter: Shared = Default::default();
            let cfg = config(dir.path(), Some(exporter.clone()));
            let info = JobInfo {
                world_size: Some(2),
                ..JobInfo::default()
            };
            let mut g = Group::new(cfg, info);
            let f: Box<dyn JobSink> = Box::new(JobFiles::new("job", dir.path().into(), None, true));
            let m: Box<dyn JobSink> = Box::new(JobMetrics::new(exporter.clone(), "job"));
            g.sinks = if metrics_first {
                vec![m, f]
            } else {
                vec![f, m]
            };
            add_two_ranks(&mut g, &items, &rt, t0);
            g.tick(t0 + Duration::from_secs(100));
            let hang = std::fs::read_to_string(dir.path().join("final_summary.json")).unwrap();
            let hung_text = text(&exporter);
            // The ranks ended (killed while hung): the job's final summary.
            end_ranks(&mut g);
            let sum = g.settle().expect("the job's summary");
            let mut files: Vec<(String, String)> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().path())
                .map(|p| {
                    let name = p.file_name().unwrap().to_string_lossy().into_owned();
                    (name, std::fs::read_to_string(&p).unwrap())
                })
                .collect();
            files.sort();
            (
                hang,
                hung_text,
                files,
                text(&exporter),
                sum.primary_diagnosis.kind,
            )
        };
        let (a, b) = (outputs(true), outputs(false));
        assert_eq!(a, b);
        let (hang, hung_text, files, _, kind) = a;
        assert!(hang.contains("\"HANG\""), "{hang}");
        assert_eq!(kind, DiagnosisKind::Hang, "the job ended hung");
        let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
        assert!(names.contains(&"final_summary.txt"), "{names:?}");
        let line = format!("kind=\"{}\"", DiagnosisKind::Hang.as_str());
        assert!(
            hung_text
                .iter()
                .any(|l| l.starts_with("traceml_verdict{") && l.contains(&line)),
            "{line} not set at the hang:\n{}",
            hung_text.join("\n")
        );
    }

    /// Ranks killed while hung, and the daemon stopped before its next look (`serve`'s SIGTERM
    /// within a scan of the ranks' end): the job's final summary keeps the HANG and the stacks
    /// read while it hung. Before, `stop` looked again at no running rank and forgot the hang.
    #[test]
    fn a_job_stopped_after_its_hung_ranks_ended_stays_hung() {
        let items = recorded();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut g = Group::new(config(dir.path(), None), JobInfo::default());
        let t0 = Instant::now();
        add_two_ranks(&mut g, &items, &rt, t0);
        g.tick(t0 + Duration::from_secs(100));
        assert_eq!(g.hung.len(), 2, "both ranks completed no step for 100 s");
        end_ranks(&mut g);
        g.stop(EndReason::Terminated);
        let sum = g.settle().expect("the job's summary");
        assert_eq!(sum.primary_diagnosis.kind, DiagnosisKind::Hang);
        let file = std::fs::read_to_string(dir.path().join("final_summary.json")).unwrap();
        assert!(file.contains("\"HANG\""), "{file}");
    }

    #[test]
    fn a_hung_rank_stays_hung_when_its_folds_are_handed_back_empty() {
        let t0 = Instant::now();
        let floor = Duration::from_secs(5);
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut p = Progress::new();
        let observe = |p: &mut Progress, steps: u64, total: u64, now| {
            p.update(steps, total, now);
            p.hung(now, floor)
        };
        assert_eq!(observe(&mut p, 0, 0, at(0)), None, "no step yet");
        assert_eq!(observe(&mut p, 0, 0, at(100)), None, "no step is no hang");
        assert_eq!(observe(&mut p, 10, 1_000_000_000, at(100)), None);
        assert_eq!(
            observe(&mut p, 10, 1_000_000_000, at(104)),
            None,
            "under the floor"
        );
        assert_eq!(
            observe(&mut p, 10, 1_000_000_000, at(106)),
            Some(Duration::from_secs(6))
        );
        // The run ended: its folds are new (no step), the rank is still hung.
        assert_eq!(observe(&mut p, 0, 0, at(107)), Some(Duration::from_secs(7)));
        // A new step is progress.
        assert_eq!(observe(&mut p, 11, 1_100_000_000, at(108)), None);
        // 10 × a long mean step is the threshold when over the floor: 10 × 2 s.
        let mut p = Progress::new();
        observe(&mut p, 3, 6_000_000_000, at(0));
        assert_eq!(observe(&mut p, 3, 6_000_000_000, at(19)), None);
        assert!(observe(&mut p, 3, 6_000_000_000, at(20)).is_some());
    }
}
