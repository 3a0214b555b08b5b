//! The Prometheus exporter's model: what `/metrics` shows of each job's ranks, built from the
//! summary model and the engine's exact step sums ([`RankValues::from_summary`]), kept while a
//! job runs and for [`RETENTION`] after it ends, and encoded with `prometheus-client` in the
//! OpenMetrics text format ([`Exporter::encode`]). Pure: no socket, no clock (callers pass
//! `now`); [`http`] serves it.
//!
//! Series (base units; labels `job`, `rank`, `phase`, `kind`, `severity` only, so the number of
//! series is bounded by the jobs on the node; the pid and the command line are in
//! `traceml_job_info` alone):
//!
//! | series | type | labels |
//! |---|---|---|
//! | `traceml_steps_total` | counter (optimizer steps) | job, rank |
//! | `traceml_micro_batches_total` | counter (absent where no backward was seen) | job, rank |
//! | `traceml_evaluation_seconds_total`, `traceml_evaluation_batches_total` | counter | job, rank |
//! | `traceml_step_duration_seconds` | histogram ([`crate::engine::STEP_BUCKETS_NS`]) | job, rank |
//! | `traceml_phase_seconds_total` | counter | job, rank, phase |
//! | `traceml_h2d_bytes_total`, `traceml_kernel_launches_total` | counter (absent without a CUDA library) | job, rank |
//! | `traceml_gpu_utilization_ratio` | gauge (absent without NVML) | job, rank |
//! | `traceml_gpu_memory_used_bytes` | gauge (absent without NVML) | job, rank |
//! | `traceml_verdict` | gauge, 1 for the current primary verdict | job, kind, severity |
//! | `traceml_events_lost_total`, `traceml_probe_failures_total` | counter | job, rank |
//! | `traceml_daemon_overhead_ratio` | gauge | job, rank |
//! | `traceml_attached_jobs` | gauge | |
//! | `traceml_job_info` | info | job, rank, pid, comm, command, user, container, pod, unit |
//!
//! Counters never go backwards: each is the largest value reported so far for its series (a
//! snapshot of a run in progress closes its open step early, and a later harvest may measure
//! that step a little differently).
//!
//! Label values from a target pass through [`crate::sanitize::terminal_bounded`] (control
//! characters made visible, [`crate::sanitize::LABEL_MAX`] bytes): `prometheus-client` escapes
//! `\`, `"` and newlines itself, so [`crate::sanitize::prom_label`]'s escaping would be applied
//! twice.
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeMetric, NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::engine::{STEP_BUCKETS_NS, StepTotals};
use crate::phase::Phase;
use crate::sample::Sample;
use crate::sanitize::{LABEL_MAX, terminal_bounded};
use crate::summary::{DiagnosisKind, Severity, Summary};

mod exposition;
pub mod http;
use exposition::*;

/// The port `--metrics-addr` listens on when none is given (docs/metrics.md says why this one).
pub const DEFAULT_PORT: u16 = 9466;
/// How long a job's series stay after the job ended (the last values stay scrapable; the number
/// of series on a busy node stays bounded).
pub const RETENTION: Duration = Duration::from_secs(300);
/// How often the run loops refresh a running job's values.
pub const REFRESH: Duration = Duration::from_secs(2);

/// What the exporter shows of one rank of a job (one measured process).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RankValues {
    pub steps: u64,
    pub step_seconds_sum: f64,
    /// Steps per bucket of [`STEP_BUCKETS_NS`] (not cumulative), the last one beyond them.
    pub step_buckets: Vec<u64>,
    /// Seconds per phase, in [`Phase::ALL`] order.
    pub phase_seconds: Vec<(Phase, f64)>,
    /// `None` when no CUDA library was probed.
    pub h2d_bytes: Option<u64>,
    pub kernel_launches: Option<u64>,
    /// `None` without NVML (or before its first sample).
    pub gpu_utilization: Option<f64>,
    /// The rank's device memory over its GPUs at the latest sample; `None` without NVML.
    pub gpu_memory_bytes: Option<u64>,
    /// `None` when the stream carried no loss counters.
    pub events_lost: Option<u64>,
    pub probe_failures: u64,
    /// The daemon's estimated cost as a share of step time since the last probe-set change.
    pub overhead_ratio: Option<f64>,
    /// Micro-batches of the complete steps; `None` where no backward was seen.
    pub micro_batches: Option<u64>,
    /// Evaluation segments between optimizer steps: their wall time and batches.
    pub evaluation_seconds: f64,
    pub evaluation_batches: u64,
    /// The steps' own work: step time less collective wait (what the STRAGGLER rule compares).
    pub own_work_seconds: f64,
    /// The median step (of the steps the summary keeps), for the hang threshold.
    pub step_median_seconds: Option<f64>,
    /// When the rank's step count last grew, unix seconds (to within the refresh interval);
    /// `None` before its first step and after its run ended.
    pub last_step_end_unix: Option<f64>,
    /// Whether the rank's latest Python stack is inside a collective call
    /// ([`crate::ranks::in_collective`]); `None` without a stack.
    pub in_collective: Option<bool>,
}

impl RankValues {
    /// The values of a run's summary and the exact step sums behind it
    /// ([`crate::analysis::Collector::snapshot_with_totals`]); the GPUs' from the latest sample
    /// ([`GpuNow`]).
    pub fn from_summary(s: &Summary, t: &StepTotals, gpu: GpuNow) -> RankValues {
        let cuda = s.cuda.measured;
        RankValues {
            steps: t.count,
            step_seconds_sum: t.duration_ns as f64 / 1e9,
            step_buckets: t.step_buckets.to_vec(),
            phase_seconds: Phase::ALL
                .iter()
                .map(|&p| (p, t.phase_ns[p.index()] as f64 / 1e9))
                .collect(),
            h2d_bytes: cuda.then_some(t.h2d_bytes),
            // From the model: in `--launch-mode count` (or after the governor switched to it)
            // the kernel's whole-run counter, else the launches inside the measured steps.
            kernel_launches: s
                .cuda
                .launches_per_step
                .filter(|l| cuda && l.is_finite() && *l >= 0.0)
                .map(|l| (l * f64::from(s.steps.count)).round() as u64),
            gpu_utilization: gpu.utilization,
            gpu_memory_bytes: gpu.memory_bytes,
            events_lost: s.data_quality.events_lost.as_ref().map(|l| l.total),
            probe_failures: s.data_quality.probes_failed.len() as u64,
            overhead_ratio: s
                .daemon_overhead
                .as_ref()
                .and_then(|o| o.steady_pct_of_step)
                .filter(|p| p.is_finite())
                .map(|p| p / 100.0),
            micro_batches: (t.micro_batches > 0).then_some(t.micro_batches),
            evaluation_seconds: s.evaluation.wall_s,
            evaluation_batches: s.evaluation.batches,
            own_work_seconds: t
                .duration_ns
                .saturating_sub(t.phase_ns[Phase::CollectiveWait.index()])
                as f64
                / 1e9,
            step_median_seconds: s
                .step_ms
                .median
                .filter(|m| m.is_finite() && *m >= 0.0)
                .map(|m| m / 1e3),
            last_step_end_unix: None,
            in_collective: None,
        }
    }

    /// `self` with every counter at least `old`'s (counters never go backwards).
    fn at_least(mut self, old: &RankValues) -> RankValues {
        self.steps = self.steps.max(old.steps);
        self.step_seconds_sum = self.step_seconds_sum.max(old.step_seconds_sum);
        if self.step_buckets.len() == old.step_buckets.len() {
            for (b, o) in self.step_buckets.iter_mut().zip(&old.step_buckets) {
                *b = (*b).max(*o);
            }
        }
        for (p, s) in self.phase_seconds.iter_mut() {
            if let Some((_, o)) = old.phase_seconds.iter().find(|(q, _)| q == p) {
                *s = s.max(*o);
            }
        }
        let max = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.h2d_bytes = max(self.h2d_bytes, old.h2d_bytes);
        self.kernel_launches = max(self.kernel_launches, old.kernel_launches);
        self.events_lost = max(self.events_lost, old.events_lost);
        self.probe_failures = self.probe_failures.max(old.probe_failures);
        self.micro_batches = max(self.micro_batches, old.micro_batches);
        self.evaluation_seconds = self.evaluation_seconds.max(old.evaluation_seconds);
        self.evaluation_batches = self.evaluation_batches.max(old.evaluation_batches);
        self.own_work_seconds = self.own_work_seconds.max(old.own_work_seconds);
        self
    }
}

/// A rank's GPUs at its latest sample, as `/metrics` shows them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GpuNow {
    /// [`gpu_utilization`].
    pub utilization: Option<f64>,
    /// The target's device memory summed over the GPUs (0 on a GPU it does not use); `None`
    /// without NVML's process list.
    pub memory_bytes: Option<u64>,
}

impl GpuNow {
    pub fn of(s: &Sample) -> GpuNow {
        GpuNow {
            utilization: gpu_utilization(s),
            memory_bytes: s.gpu_process_mem(),
        }
    }
}

/// The GPU utilization (0–1) of a sample: the mean over the GPUs the target has memory on (over
/// all GPUs when it has none); `None` without GPU metrics.
pub fn gpu_utilization(s: &Sample) -> Option<f64> {
    let gpus = s.gpus.as_ref()?;
    let used = gpus
        .iter()
        .any(|g| g.process_mem_bytes.is_some_and(|m| m > 0));
    let utils: Vec<f64> = gpus
        .iter()
        .filter(|g| !used || g.process_mem_bytes.is_some_and(|m| m > 0))
        .filter_map(|g| g.util_pct)
        .filter(|u| u.is_finite())
        .collect();
    (!utils.is_empty()).then(|| utils.iter().sum::<f64>() / utils.len() as f64 / 100.0)
}

/// Who a rank is: only in `traceml_job_info`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobLabels {
    pub pid: u32,
    pub comm: String,
    /// The command line, joined with spaces.
    pub command: String,
    pub user: Option<String>,
    /// The container id (short, as `docker ps` shows it), from the cgroup path.
    pub container: Option<String>,
    /// `<namespace>/<name>` of the Kubernetes pod (or its uid when only that is known).
    pub pod: Option<String>,
    /// The systemd unit the process runs in (`slurmstepd`-style scopes included).
    pub unit: Option<String>,
    /// The job's identity across nodes ([`crate::host::jobs::job_identity`]); `None`: the `job_id`
    /// label is `<node>/<job>`.
    pub job_id: Option<String>,
    /// The rank's `LOCAL_RANK` and `WORLD_SIZE`, when its environment has them.
    pub local_rank: Option<u32>,
    pub world_size: Option<u32>,
    /// The node ([`crate::host::jobs::node_name`]); empty when unknown.
    pub node: String,
}

impl JobLabels {
    /// Pure: the series' values from what was read.
    pub fn with_identity(
        pid: u32,
        comm: String,
        command: String,
        id: &crate::event::Identity,
    ) -> JobLabels {
        let pod = match (&id.pod_namespace, &id.pod_name, &id.pod_uid) {
            (Some(ns), Some(name), _) => Some(format!("{ns}/{name}")),
            (None, Some(name), _) => Some(name.clone()),
            (_, None, Some(uid)) => Some(uid.clone()),
            _ => None,
        };
        JobLabels {
            pid,
            comm,
            command,
            user: id.user.clone().or_else(|| id.uid.map(|u| u.to_string())),
            container: id
                .container_id
                .as_ref()
                .map(|c| c.chars().take(12).collect()),
            pod,
            unit: id.unit.clone(),
            ..JobLabels::default()
        }
    }
}

/// A job's primary verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub kind: DiagnosisKind,
    pub severity: Severity,
}

impl Verdict {
    pub fn of(s: &Summary) -> Verdict {
        Verdict {
            kind: s.primary_diagnosis.kind,
            severity: s.primary_diagnosis.severity,
        }
    }
}

#[derive(Clone, Debug)]
struct RankSeries {
    info: JobLabels,
    values: Option<RankValues>,
    ended: Option<Instant>,
}

#[derive(Clone, Debug, Default)]
struct Job {
    ranks: BTreeMap<String, RankSeries>,
    verdict: Option<Verdict>,
    /// The job's straggler class (`ranks::classify_stragglers`), as of its last verdict.
    stragglers: Option<crate::summary::Stragglers>,
    /// The job's joined collective ledgers (`ledgers::join`), as of its last verdict.
    collectives: Option<crate::summary::CollectiveWaits>,
}

impl Job {
    fn running(&self) -> bool {
        self.ranks.values().any(|r| r.ended.is_none())
    }
}

/// Every job the daemon measures or measured within [`RETENTION`], by job and rank label.
#[derive(Clone, Debug)]
pub struct Exporter {
    jobs: BTreeMap<String, Job>,
    retention: Duration,
}

impl Default for Exporter {
    fn default() -> Self {
        Exporter::new(RETENTION)
    }
}

impl Exporter {
    pub fn new(retention: Duration) -> Exporter {
        Exporter {
            jobs: BTreeMap::new(),
            retention,
        }
    }

    /// A rank is being attached to (its info series appears; its values once [`Self::update`]d).
    pub fn attached(&mut self, job: &str, rank: &str, info: JobLabels) {
        self.jobs.entry(label(job)).or_default().ranks.insert(
            label(rank),
            RankSeries {
                info,
                values: None,
                ended: None,
            },
        );
    }

    /// A rank's latest values (a rank not [`Self::attached`] is added with an empty info).
    pub fn update(&mut self, job: &str, rank: &str, values: RankValues) {
        let r = self
            .jobs
            .entry(label(job))
            .or_default()
            .ranks
            .entry(label(rank))
            .or_insert_with(|| RankSeries {
                info: JobLabels::default(),
                values: None,
                ended: None,
            });
        r.values = Some(match &r.values {
            Some(old) => values.at_least(old),
            None => values,
        });
    }

    /// The job's current primary verdict.
    pub fn set_verdict(&mut self, job: &str, verdict: Verdict) {
        if let Some(j) = self.jobs.get_mut(&label(job)) {
            j.verdict = Some(verdict);
        }
    }

    /// The job's classified stragglers (none: no rank made the others wait above the noise).
    pub fn set_stragglers(&mut self, job: &str, stragglers: Option<&crate::summary::Stragglers>) {
        if let Some(j) = self.jobs.get_mut(&label(job)) {
            j.stragglers = stragglers.cloned();
        }
    }

    /// The job's joined collective ledgers (none: fewer than two ranks with one).
    pub fn set_collectives(&mut self, job: &str, w: Option<&crate::summary::CollectiveWaits>) {
        if let Some(j) = self.jobs.get_mut(&label(job)) {
            j.collectives = w.cloned();
        }
    }

    /// The rank's run ended at `now`: its series stay for the retention time.
    pub fn ended(&mut self, job: &str, rank: &str, now: Instant) {
        if let Some(r) = self
            .jobs
            .get_mut(&label(job))
            .and_then(|j| j.ranks.get_mut(&label(rank)))
        {
            r.ended.get_or_insert(now);
        }
    }

    /// The process whose series `job`/`rank` are now (`None`: no such rank, or not known).
    pub fn rank_pid(&self, job: &str, rank: &str) -> Option<u32> {
        let r = self.jobs.get(&label(job))?.ranks.get(&label(rank))?;
        (r.info.pid != 0).then_some(r.info.pid)
    }

    /// The rank was never measured (the attach failed): its series go now.
    pub fn forget(&mut self, job: &str, rank: &str) {
        let job = label(job);
        if let Some(j) = self.jobs.get_mut(&job) {
            j.ranks.remove(&label(rank));
            if j.ranks.is_empty() {
                self.jobs.remove(&job);
            }
        }
    }

    /// Drops the ranks that ended more than the retention time before `now`, and jobs left
    /// without ranks.
    pub fn prune(&mut self, now: Instant) {
        let keep = self.retention;
        for j in self.jobs.values_mut() {
            j.ranks.retain(|_, r| {
                r.ended
                    .is_none_or(|e| now.saturating_duration_since(e) < keep)
            });
        }
        self.jobs.retain(|_, j| !j.ranks.is_empty());
    }

    /// Jobs with at least one rank still running.
    pub fn attached_jobs(&self) -> usize {
        self.jobs.values().filter(|j| j.running()).count()
    }

    /// The OpenMetrics text exposition (ends with `# EOF`).
    pub fn encode(&self) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Exposition(self.clone())));
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }

    /// `(labels, values)` of every rank with values.
    fn values(&self) -> impl Iterator<Item = (Labels, &RankValues)> {
        self.jobs.iter().flat_map(|(j, job)| {
            job.ranks.iter().filter_map(move |(r, rank)| {
                Some((rank_labels(j, r, &rank.info), rank.values.as_ref()?))
            })
        })
    }
}

#[cfg(test)]
mod tests;
