//! The sinks a target's task hands its run to ([`Sink`]): its recording, its series on
//! `/metrics`, and its summary files (window summaries and the final one). Each exists once,
//! whichever mode runs the target (`--pid`, a rank of a job, a target of `serve`).
//!
//! A multi-rank job's group hands the job's summary the same way to the job's sinks
//! ([`JobSink`]): its files ([`JobFiles`]: the HANG summary at once, the final summary) and its
//! verdict on `/metrics` ([`JobMetrics`]). They only read: each look at the job ([`JobTick`])
//! joins the ranks once, for every sink, so their order does not matter either.
use std::cell::OnceCell;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::event::StreamItem;
use crate::host::output::Owner;
use crate::metrics::{self, JobLabels, RankValues, Verdict};
use crate::render::files::{Stem, verdict_line, write_summary_in};
use crate::runtime::task::{Ended, Folds, Sink, Tick};
use crate::summary::{DiagnosisKind, Summary};

/// The target's stream, written as it arrives (`--record`); replayable with `replay`.
pub struct RecordingSink {
    writer: crate::record::Writer,
}

impl RecordingSink {
    /// Creates the file (no planted link followed; under `sudo`, owned by the user).
    pub fn create(path: &Path) -> Result<RecordingSink, String> {
        let file = crate::host::output::create_file(path, Owner::from_sudo())
            .map_err(|e| format!("cannot open recording {}: {e}", path.display()))?;
        let writer = crate::record::Writer::from_file(file, path).map_err(|e| e.to_string())?;
        Ok(RecordingSink { writer })
    }
}

impl Sink for RecordingSink {
    fn item(&mut self, item: &StreamItem, _: &Folds) -> Result<(), String> {
        self.writer.write_live(item).map_err(|e| e.to_string())
    }

    fn end(&mut self, _: Option<&Ended<'_>>) -> Result<(), String> {
        self.writer
            .flush()
            .map_err(|e| format!("cannot finish the recording: {e}"))
    }
}

/// Who process `pid` is, as `traceml_job_info` shows it: read from the host here, so the
/// exporter only formats.
pub fn job_labels(pid: u32) -> JobLabels {
    use crate::host::{jobs, procinfo};
    let env = procinfo::environ(pid).unwrap_or_default();
    let get = |k: &str| {
        env.get(std::ffi::OsStr::new(k))
            .map(|v| v.to_string_lossy().into_owned())
    };
    let num = |k: &str| get(k).and_then(|v| v.trim().parse().ok());
    let info = JobLabels::with_identity(
        pid,
        procinfo::comm(pid)
            .map(|b| crate::sanitize::comm(&b))
            .unwrap_or_default(),
        procinfo::cmdline(pid)
            .map(|b| crate::sanitize::cmdline(&b).join(" "))
            .unwrap_or_default(),
        &crate::host::identity::of(pid),
    );
    JobLabels {
        job_id: jobs::job_identity(get, &procinfo::hostname()),
        local_rank: num("LOCAL_RANK"),
        world_size: num("WORLD_SIZE"),
        node: jobs::node_name(),
        ..info
    }
}

/// A target's series on `/metrics`: the shared exporter, the job and rank labels. Refreshed from
/// the folds every [`metrics::REFRESH`]; the rank's liveness (its last step's end, whether it
/// waits in a collective: what the cross-node hang rule reads) while it runs.
pub struct Metrics {
    exporter: metrics::http::Shared,
    job: String,
    rank: String,
    pid: u32,
    /// This target's verdict is its job's (a job of one process); a multi-rank job's verdict is
    /// set by its group from every rank.
    sets_verdict: bool,
    last: Option<Instant>,
    /// The in-collective state last exported, to log its changes (`traceml_daemon::runtime::sinks`
    /// at debug: what the cross-node hang rule saw, and why).
    in_collective: Option<bool>,
}

impl Metrics {
    /// Announces the target (`traceml_job_info`) under `job` and `rank`.
    pub fn attach(
        exporter: metrics::http::Shared,
        job: &str,
        rank: u32,
        pid: u32,
        sets_verdict: bool,
    ) -> Metrics {
        let m = Metrics {
            exporter,
            job: job.to_owned(),
            rank: rank.to_string(),
            pid,
            sets_verdict,
            last: None,
            in_collective: None,
        };
        // The rank's series are this process's from now on (a restarted rank takes them over).
        let info = job_labels(pid);
        m.exporter
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .attached(&m.job, &m.rank, info);
        m
    }

    /// `f` on the exporter while this target's process still owns its rank's series: a rank
    /// that an elastic agent restarted hands its labels to the new process, and the old one's
    /// late updates or end must not touch them.
    fn with(&self, f: impl FnOnce(&mut metrics::Exporter)) {
        let mut e = self.exporter.lock().unwrap_or_else(|p| p.into_inner());
        if e.rank_pid(&self.job, &self.rank)
            .is_none_or(|owner| owner == self.pid)
        {
            f(&mut e);
        }
    }

    fn update(&self, s: &Summary, values: RankValues, verdict: Verdict) {
        self.with(|e| {
            e.update(&self.job, &self.rank, values);
            if self.sets_verdict {
                e.set_verdict(&self.job, verdict);
            }
        });
        let _ = s;
    }
}

impl Sink for Metrics {
    fn tick(&mut self, tick: &Tick<'_>) {
        let (folds, now) = (tick.folds, tick.now);
        if folds.run.events() == 0 || self.last.is_some_and(|t| now < t + metrics::REFRESH) {
            return;
        }
        self.last = Some(now);
        let last_step = folds.progress.last_step_unix();
        let (s, t) = tick.so_far();
        let mut values = RankValues::from_summary(s, t, folds.gpu);
        values.last_step_end_unix = last_step;
        let in_collective = folds.in_collective();
        if self.in_collective != Some(in_collective) {
            self.in_collective = Some(in_collective);
            let stack = folds.run.last_stack();
            let inner: Vec<&str> = stack.iter().rev().take(4).map(String::as_str).collect();
            tracing::debug!(
                "rank {}: in_collective {in_collective} (wait probe open: {}; innermost frames: {})",
                self.rank,
                folds.run.in_collective_wait(),
                if inner.is_empty() {
                    "no stack".to_owned()
                } else {
                    inner.join(" <- ")
                }
            );
        }
        values.in_collective = Some(in_collective);
        // The verdict shown: the last window's, the run so far's before the first window.
        let verdict = Verdict::of(folds.last_window.as_ref().unwrap_or(s));
        self.update(s, values, verdict);
    }

    fn end(&mut self, ended: Option<&Ended<'_>>) -> Result<(), String> {
        let Some(end) = ended else {
            self.with(|e| e.forget(&self.job, &self.rank));
            return Ok(());
        };
        // Ended: no liveness series (a finished rank never looks hung).
        let values = RankValues::from_summary(end.summary, end.totals, end.folds.gpu);
        let verdict = Verdict::of(end.folds.last_window.as_ref().unwrap_or(end.summary));
        self.update(end.summary, values, verdict);
        self.with(|e| e.ended(&self.job, &self.rank, Instant::now()));
        Ok(())
    }
}

/// A target's summary files in its directory: where the folds close windows,
/// `summary-<n>.json` for each (and one log line: the window's verdict and the run's so far,
/// at warning when the verdict changed); at the end `final_summary.*`.
pub struct SummaryFiles {
    dir: PathBuf,
    owner: Option<Owner>,
    pid: u32,
    /// The verdict of the last window written.
    last_kind: Option<DiagnosisKind>,
}

impl SummaryFiles {
    pub fn new(dir: PathBuf, owner: Option<Owner>, pid: u32) -> Self {
        SummaryFiles {
            dir,
            owner,
            pid,
            last_kind: None,
        }
    }
}

impl Sink for SummaryFiles {
    fn tick(&mut self, tick: &Tick<'_>) {
        let (Some(n), Some(win)) = (tick.window, &tick.folds.last_window) else {
            return;
        };
        let pid = self.pid;
        if let Err(e) = write_summary_in(&self.dir, self.owner, Stem::Window(n), win) {
            tracing::warn!("pid {pid}: cannot write window summary {n}: {e}");
        }
        let line = format!(
            "pid {pid} window {n}: {} · run so far: {}",
            verdict_line(win),
            verdict_line(&tick.so_far().0)
        );
        let kind = win.primary_diagnosis.kind;
        match self.last_kind.replace(kind) {
            // From or to "no verdict yet" is no change of verdict.
            Some(k)
                if k != kind
                    && ![DiagnosisKind::InsufficientData, DiagnosisKind::NotTraining]
                        .iter()
                        .any(|&n| n == kind || n == k) =>
            {
                tracing::warn!("{line} (verdict changed from {})", k.headline())
            }
            _ => tracing::info!("{line}"),
        }
    }

    fn end(&mut self, ended: Option<&Ended<'_>>) -> Result<(), String> {
        let pid = self.pid;
        let Some(end) = ended else {
            // Never attached: the directory made for it goes (when still empty).
            let _ = std::fs::remove_dir(&self.dir);
            return Ok(());
        };
        let file = self.dir.join("final_summary.json");
        match write_summary_in(&self.dir, self.owner, Stem::Final, end.summary) {
            Ok(()) => {
                tracing::info!(
                    "pid {pid}: {} → {}",
                    verdict_line(end.summary),
                    file.display()
                );
                Ok(())
            }
            Err(e) => Err(format!("cannot write {}: {e}", file.display())),
        }
    }
}

/// One look at a multi-rank job (its group's tick, the hang check done), the same for every
/// job sink.
pub struct JobTick<'a> {
    pub now: Instant,
    /// A hang was found at this look (once per hang: again after the job made progress); the
    /// job's summary then carries every running rank's stack.
    pub hang: bool,
    summary: OnceCell<Option<Summary>>,
    join: &'a dyn Fn() -> Option<Summary>,
}

impl<'a> JobTick<'a> {
    /// A look at `now`; `join` joins the ranks into the job's summary when a sink asks.
    pub fn new(now: Instant, hang: bool, join: &'a dyn Fn() -> Option<Summary>) -> JobTick<'a> {
        JobTick {
            now,
            hang,
            summary: OnceCell::new(),
            join,
        }
    }

    /// The job's summary now (the running ranks' runs so far, joined; `None`: no rank yet),
    /// computed at the first call of this look.
    pub fn summary(&self) -> Option<&Summary> {
        self.summary.get_or_init(self.join).as_ref()
    }
}

/// The end of a multi-rank job as its sinks see it: no rank runs.
pub struct JobEnd<'a> {
    /// The job's summary (a job that ended hung says so, with the stacks read while it hung).
    pub summary: &'a Summary,
    /// The rank runs it joins, every attempt's.
    pub runs: usize,
}

/// Where a multi-rank job's summary goes. Every method has a default that does nothing; what
/// a sink cannot do it logs (the job goes on).
pub trait JobSink {
    /// About every [`crate::runtime::task::TICK`] while a rank of the job runs.
    fn tick(&mut self, _tick: &JobTick<'_>) {}

    /// No rank runs (again, after a restarted rank ended later).
    fn end(&mut self, _end: &JobEnd<'_>) {}
}

/// The job's files in its directory: at a hang, `final_summary.json` at once (the HANG, every
/// running rank's stack); once no rank runs, where asked, `final_summary.*`.
pub struct JobFiles {
    job: String,
    dir: PathBuf,
    owner: Option<Owner>,
    /// Writes the final summary (`serve`; `--pid` writes its own in the formats asked for).
    writes_final: bool,
}

impl JobFiles {
    pub fn new(job: &str, dir: PathBuf, owner: Option<Owner>, writes_final: bool) -> Self {
        JobFiles {
            job: job.to_owned(),
            dir,
            owner,
            writes_final,
        }
    }
}

impl JobSink for JobFiles {
    fn tick(&mut self, tick: &JobTick<'_>) {
        let Some(sum) = tick.summary().filter(|_| tick.hang) else {
            return;
        };
        if let Err(e) = write_summary_in(&self.dir, self.owner, Stem::FinalJson, sum) {
            tracing::warn!("job {}: cannot write the HANG summary: {e}", self.job);
        }
    }

    fn end(&mut self, end: &JobEnd<'_>) {
        if !self.writes_final {
            return;
        }
        let file = self.dir.join("final_summary.json");
        match write_summary_in(&self.dir, self.owner, Stem::Final, end.summary) {
            Ok(()) => tracing::info!(
                "job {} ({} ranks): {} → {}",
                self.job,
                end.runs,
                verdict_line(end.summary),
                file.display()
            ),
            Err(e) => tracing::warn!("job {}: cannot write its summary: {e}", self.job),
        }
    }
}

/// The job's verdict on `/metrics`, from every rank (its ranks' own [`Metrics`] set none):
/// every [`metrics::REFRESH`] while ranks run, and the job's summary at its end. With it the
/// job's classified stragglers and joined collective ledgers.
pub struct JobMetrics {
    exporter: metrics::http::Shared,
    job: String,
    last: Option<Instant>,
}

impl JobMetrics {
    pub fn new(exporter: metrics::http::Shared, job: &str) -> Self {
        JobMetrics {
            exporter,
            job: job.to_owned(),
            last: None,
        }
    }

    fn set(&self, s: &Summary) {
        let mut e = self.exporter.lock().unwrap_or_else(|p| p.into_inner());
        e.set_verdict(&self.job, Verdict::of(s));
        e.set_stragglers(&self.job, s.stragglers.as_ref());
        e.set_collectives(&self.job, s.collective_waits.as_ref());
    }
}

impl JobSink for JobMetrics {
    fn tick(&mut self, tick: &JobTick<'_>) {
        if self.last.is_some_and(|t| tick.now < t + metrics::REFRESH) {
            return;
        }
        self.last = Some(tick.now);
        if let Some(s) = tick.summary() {
            self.set(s);
        }
    }

    fn end(&mut self, end: &JobEnd<'_>) {
        self.set(end.summary);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The sinks read one tick: pushed in either order, `/metrics` and the window file say the
    /// same, and `/metrics` shows the verdict of the window closed at that tick. (Before, the
    /// summary files' sink closed the window and stored it for the metrics sink: with metrics
    /// pushed first, its verdict was one window behind: here the first, empty window's.)
    #[test]
    fn the_order_of_the_sinks_changes_nothing() {
        // A recorded input-bound run (tests/fixtures/recordings).
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/recordings/input_bound_single.jsonl.gz");
        let items = crate::record::read(&path).expect("recording").items;
        let pid = u32::MAX - 3;
        let outputs = |metrics_first: bool| {
            let dir = tempfile::tempdir().unwrap();
            let exporter: metrics::http::Shared = Default::default();
            let m: Box<dyn Sink> = Box::new(Metrics::attach(exporter.clone(), "job", 0, pid, true));
            let f: Box<dyn Sink> = Box::new(SummaryFiles::new(dir.path().into(), None, pid));
            let mut sinks = if metrics_first {
                vec![m, f]
            } else {
                vec![f, m]
            };
            // A window closes at every tick: the first before any item (empty), the second
            // with the whole run.
            let mut folds = Folds::windowed(Some(Duration::ZERO));
            let now = Instant::now();
            crate::runtime::task::tick(&mut folds, &mut sinks, now);
            for item in &items {
                folds.push(item);
            }
            crate::runtime::task::tick(&mut folds, &mut sinks, now + Duration::from_secs(1));
            let window = std::fs::read_to_string(dir.path().join("summary-2.json")).unwrap();
            let verdict = folds.last_window.as_ref().unwrap().primary_diagnosis.kind;
            // The time of the last step is now's: the same run, a few µs apart.
            let text: Vec<String> = exporter
                .lock()
                .unwrap()
                .encode()
                .lines()
                .filter(|l| !l.contains("last_step"))
                .map(str::to_owned)
                .collect();
            (text, window, verdict)
        };
        let (a, b) = (outputs(true), outputs(false));
        assert_eq!(a, b);
        let (text, _, verdict) = a;
        assert_eq!(verdict, DiagnosisKind::InputBound, "the second window's");
        let line = format!("kind=\"{}\"", verdict.as_str());
        assert!(
            text.iter()
                .any(|l| l.starts_with("traceml_verdict{") && l.contains(&line)),
            "{line} not set:\n{}",
            text.join("\n")
        );
    }

    /// An elastic restart: the rank's labels pass to the new process; the old process's late
    /// end neither marks the new one's series ended nor overwrites them.
    #[test]
    fn a_restarted_rank_owns_its_series() {
        let exporter: metrics::http::Shared = Default::default();
        let (old_pid, new_pid) = (u32::MAX - 1, u32::MAX - 2);
        let old = Metrics::attach(exporter.clone(), "job", 1, old_pid, false);
        let new = Metrics::attach(exporter.clone(), "job", 1, new_pid, false);
        assert_eq!(exporter.lock().unwrap().rank_pid("job", "1"), Some(new_pid));
        old.with(|e| e.ended("job", "1", Instant::now()));
        old.with(|e| e.forget("job", "1"));
        let e = exporter.lock().unwrap();
        assert_eq!(e.rank_pid("job", "1"), Some(new_pid));
        assert_eq!(e.attached_jobs(), 1, "the new rank still runs");
        drop(e);
        new.with(|e| e.ended("job", "1", Instant::now()));
        assert_eq!(exporter.lock().unwrap().attached_jobs(), 0);
    }
}
