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

use crate::engine::{Phase, STEP_BUCKETS_NS, StepTotals};
use crate::sample::Sample;
use crate::sanitize::{LABEL_MAX, terminal_bounded};
use crate::summary::{DiagnosisKind, Severity, Summary};

pub mod http;

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
    /// ([`crate::analysis::Collector::snapshot_with_totals`]); `gpu_utilization` from the
    /// latest sample ([`gpu_utilization`]).
    pub fn from_summary(s: &Summary, t: &StepTotals, gpu_utilization: Option<f64>) -> RankValues {
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
            gpu_utilization,
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

/// A label value from a target: control characters made visible, bounded.
fn label(s: &str) -> String {
    terminal_bounded(s, LABEL_MAX)
}

/// The registry's view of the exporter at one scrape.
#[derive(Debug)]
struct Exposition(Exporter);

type Labels = Vec<(&'static str, String)>;

/// The identity labels of a series: `job` (this node's job directory), `job_id` (the job across
/// nodes: [`crate::host::jobs::job_identity`], else `<node>/<job>`), and where known `node`.
fn job_labels(job: &str, info: &JobLabels) -> Labels {
    let mut l = vec![
        ("job", job.to_owned()),
        (
            "job_id",
            label(
                &info
                    .job_id
                    .clone()
                    .unwrap_or_else(|| format!("{}/{job}", info.node)),
            ),
        ),
    ];
    if !info.node.is_empty() {
        l.push(("node", label(&info.node)));
    }
    l
}

/// A rank's labels: [`job_labels`], `rank` (the global `RANK`), and where known `local_rank`
/// and `world_size`.
fn rank_labels(job: &str, rank: &str, info: &JobLabels) -> Labels {
    let mut l = job_labels(job, info);
    l.insert(1, ("rank", rank.to_owned()));
    if let Some(lr) = info.local_rank {
        l.push(("local_rank", lr.to_string()));
    }
    if let Some(w) = info.world_size {
        l.push(("world_size", w.to_string()));
    }
    l
}

/// One metric family: its descriptor, then one sample per label set.
fn family<M: EncodeMetric>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    samples: Vec<(Labels, M)>,
) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, kind)?;
    for (labels, metric) in &samples {
        metric.encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

fn counters<'a, N: EncodeCounterValue + std::fmt::Debug, F: Fn(&'a RankValues) -> Option<N>>(
    e: &'a Exporter,
    f: F,
) -> Vec<(Labels, ConstCounter<N>)> {
    e.values()
        .filter_map(|(l, v)| Some((l, ConstCounter::new(f(v)?))))
        .collect()
}

fn gauges<'a, F: Fn(&'a RankValues) -> Option<f64>>(
    e: &'a Exporter,
    f: F,
) -> Vec<(Labels, ConstGauge<f64>)> {
    e.values()
        .filter_map(|(l, v)| Some((l, ConstGauge::new(f(v)?))))
        .collect()
}

impl Collector for Exposition {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let e = &self.0;
        step_families(&mut enc, e)?;
        step_histogram(&mut enc, e)?;
        phase_and_verdict_families(&mut enc, e)?;
        rank_state_families(&mut enc, e)?;
        cuda_and_cost_families(&mut enc, e)?;
        job_info(&mut enc, e)
    }
}

/// Steps, micro-batches and the evaluation segments: counters per rank.
fn step_families(enc: &mut DescriptorEncoder, e: &Exporter) -> std::fmt::Result {
    family(
        enc,
        "traceml_steps",
        "Complete training steps measured.",
        MetricType::Counter,
        counters(e, |v| Some(v.steps)),
    )?;
    family(
        enc,
        "traceml_micro_batches",
        "Micro-batches (fetch, forward, backward) of the complete steps: more than the steps \
         under gradient accumulation (absent where no backward was seen).",
        MetricType::Counter,
        counters(e, |v| v.micro_batches),
    )?;
    family(
        enc,
        "traceml_evaluation_seconds",
        "Wall time of the evaluation segments between optimizer steps (fetches and forwards \
         no backward followed): not in the steps.",
        MetricType::Counter,
        counters(e, |v| Some(v.evaluation_seconds)),
    )?;
    family(
        enc,
        "traceml_evaluation_batches",
        "Batches fetched in the evaluation segments.",
        MetricType::Counter,
        counters(e, |v| Some(v.evaluation_batches)),
    )?;
    Ok(())
}

/// `traceml_step_duration_seconds`: the step-time histogram per rank.
fn step_histogram(enc: &mut DescriptorEncoder, e: &Exporter) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(
        "traceml_step_duration_seconds",
        "Duration of the complete training steps.",
        None,
        MetricType::Histogram,
    )?;
    for (labels, v) in e.values() {
        let bounds = STEP_BUCKETS_NS
            .iter()
            .map(|&ns| ns as f64 / 1e9)
            .chain([f64::INFINITY]);
        let buckets: Vec<(f64, u64)> = bounds.zip(v.step_buckets.iter().copied()).collect();
        let count = v.step_buckets.iter().sum();
        m.encode_family(&labels)?.encode_histogram::<NoLabelSet>(
            v.step_seconds_sum,
            count,
            &buckets,
            None,
        )?;
    }
    Ok(())
}

/// Time per phase (a `phase` label on each rank's series) and each job's primary verdict.
fn phase_and_verdict_families(enc: &mut DescriptorEncoder, e: &Exporter) -> std::fmt::Result {
    let phases: Vec<(Labels, ConstCounter<f64>)> = e
        .values()
        .flat_map(|(l, v)| {
            v.phase_seconds.iter().map(move |(p, s)| {
                let mut l = l.clone();
                l.insert(2, ("phase", p.name().to_owned()));
                (l, ConstCounter::new(*s))
            })
        })
        .collect();
    family(
        enc,
        "traceml_phase_seconds",
        "Time of the complete steps spent in each phase (exclusive; the phases add up to the \
         step time).",
        MetricType::Counter,
        phases,
    )?;
    let verdicts: Vec<(Labels, ConstGauge<i64>)> = e
        .jobs
        .iter()
        .filter_map(|(j, job)| {
            let v = job.verdict?;
            let info = job.ranks.values().next().map(|r| r.info.clone());
            let mut l = job_labels(j, &info.unwrap_or_default());
            l.push(("kind", v.kind.as_str().to_owned()));
            l.push(("severity", v.severity.as_str().to_owned()));
            Some((l, ConstGauge::new(1)))
        })
        .collect();
    family(
        enc,
        "traceml_verdict",
        "1 for the job's current primary verdict (the last window's in serve, the run so far \
         before it).",
        MetricType::Gauge,
        verdicts,
    )?;
    // The straggler class: 1 for the class, with the rank it names ("" when rotating), and the
    // others' wait it cost.
    let straggler_labels = |j: &String, job: &Job| {
        let st = job.stragglers.as_ref()?;
        let info = job.ranks.values().next().map(|r| r.info.clone());
        let mut l = job_labels(j, &info.unwrap_or_default());
        l.push(("class", st.class.as_str().to_owned()));
        l.push(("rank", st.rank.map(|r| r.to_string()).unwrap_or_default()));
        Some((l, st.lost_ms / 1e3))
    };
    let classes: Vec<(Labels, ConstGauge<i64>)> = e
        .jobs
        .iter()
        .filter_map(|(j, job)| straggler_labels(j, job).map(|(l, _)| (l, ConstGauge::new(1))))
        .collect();
    family(
        enc,
        "traceml_straggler_class",
        "1 for the job's straggler class (persistent, transient, rotating) and the rank it names \
         (empty when rotating), from the aligned steps of every rank so far.",
        MetricType::Gauge,
        classes,
    )?;
    let lost: Vec<(Labels, ConstGauge<f64>)> = e
        .jobs
        .iter()
        .filter_map(|(j, job)| straggler_labels(j, job).map(|(l, s)| (l, ConstGauge::new(s))))
        .collect();
    family(
        enc,
        "traceml_straggler_lost_seconds",
        "The other ranks' wait the slow steps cost so far (each slow step's excess, summed).",
        MetricType::Gauge,
        lost,
    )?;
    collective_families(enc, e)
}

/// The joined ledgers: per rank the collectives it entered last and the wait that cost the
/// others, the collectives joined, the desyncs named and the ranks inside an open collective.
fn collective_families(enc: &mut DescriptorEncoder, e: &Exporter) -> std::fmt::Result {
    fn of<'a>(j: &str, job: &'a Job) -> Option<(Labels, &'a crate::summary::CollectiveWaits)> {
        let w = job.collectives.as_ref()?;
        let info = job.ranks.values().next().map(|r| r.info.clone());
        Some((job_labels(j, &info.unwrap_or_default()), w))
    }
    let per_rank = |f: &dyn Fn(&crate::summary::RankArrivals) -> f64| -> Vec<(Labels, f64)> {
        e.jobs
            .iter()
            .filter_map(|(j, job)| of(j, job))
            .flat_map(|(l, w)| {
                w.ranks.iter().map(move |r| {
                    let mut l = l.clone();
                    l.push(("rank", r.rank.to_string()));
                    (l, f(r))
                })
            })
            .collect()
    };
    let job_value = |f: &dyn Fn(&crate::summary::CollectiveWaits) -> f64| -> Vec<(Labels, f64)> {
        e.jobs
            .iter()
            .filter_map(|(j, job)| of(j, job))
            .map(|(l, w)| (l, f(w)))
            .collect()
    };
    let ints = |v: Vec<(Labels, f64)>| -> Vec<(Labels, ConstGauge<i64>)> {
        v.into_iter()
            .map(|(l, x)| (l, ConstGauge::new(x as i64)))
            .collect()
    };
    let floats = |v: Vec<(Labels, f64)>| -> Vec<(Labels, ConstGauge<f64>)> {
        v.into_iter()
            .map(|(l, x)| (l, ConstGauge::new(x)))
            .collect()
    };
    family(
        enc,
        "traceml_collective_last",
        "Collectives (of those joined across the ranks, the newest 512 per rank) the rank \
         entered last, by more than the noise: the one the others waited for.",
        MetricType::Gauge,
        ints(per_rank(&|r| r.last as f64)),
    )?;
    family(
        enc,
        "traceml_collective_caused_seconds",
        "The others' wait at those collectives: the rank's entry less the others' median entry, \
         summed.",
        MetricType::Gauge,
        floats(per_rank(&|r| r.caused_ms / 1e3)),
    )?;
    family(
        enc,
        "traceml_collectives_joined",
        "Collectives joined across every rank (their ledgers' newest entries).",
        MetricType::Gauge,
        ints(job_value(&|w| w.compared as f64)),
    )?;
    family(
        enc,
        "traceml_collective_desyncs",
        "Collectives where the ranks' ops differ (a desync: the job hangs or computes garbage).",
        MetricType::Gauge,
        ints(job_value(&|w| w.desyncs.len() as f64)),
    )?;
    let inside: Vec<(Labels, ConstGauge<f64>)> = e
        .jobs
        .iter()
        .filter_map(|(j, job)| of(j, job))
        .flat_map(|(l, w)| {
            w.open.iter().map(move |o| {
                let mut l = l.clone();
                l.push(("rank", o.rank.to_string()));
                l.push(("op", o.op.clone()));
                l.push(("seq", o.seq.to_string()));
                (l, ConstGauge::new(o.enter_ts as f64 / 1e9))
            })
        })
        .collect();
    family(
        enc,
        "traceml_collective_open_since_seconds",
        "A rank inside a collective with no end yet (op, aligned sequence number): its entry, \
         CLOCK_MONOTONIC seconds.",
        MetricType::Gauge,
        inside,
    )?;
    Ok(())
}

/// What the hang and straggler rules read: own work, the recent median, the last step end, in a
/// collective.
fn rank_state_families(enc: &mut DescriptorEncoder, e: &Exporter) -> std::fmt::Result {
    family(
        enc,
        "traceml_own_work_seconds",
        "Own work of the complete steps: step time less collective wait (the slowest rank's \
         is what the others wait for).",
        MetricType::Counter,
        counters(e, |v| Some(v.own_work_seconds)),
    )?;
    family(
        enc,
        "traceml_step_median_seconds",
        "Median duration of the rank's recent steps (the hang threshold is 10 times it).",
        MetricType::Gauge,
        gauges(e, |v| v.step_median_seconds),
    )?;
    family(
        enc,
        "traceml_last_step_end_timestamp_seconds",
        "When the rank last completed a step (unix time, to within 1 s); absent before its \
         first step and once its run ended.",
        MetricType::Gauge,
        gauges(e, |v| v.last_step_end_unix),
    )?;
    family(
        enc,
        "traceml_in_collective",
        "1 when the rank's latest Python stack is inside a collective (all_reduce, barrier, \
         DDP's backward...), 0 when not; absent without a stack.",
        MetricType::Gauge,
        gauges(e, |v| v.in_collective.map(|b| if b { 1.0 } else { 0.0 })),
    )?;
    Ok(())
}

/// CUDA activity, GPU utilization and the daemon's own cost (lost events, failed probes, overhead)
/// per rank; the attached jobs.
fn cuda_and_cost_families(enc: &mut DescriptorEncoder, e: &Exporter) -> std::fmt::Result {
    family(
        enc,
        "traceml_h2d_bytes",
        "Bytes copied host to device in the complete steps (absent when no CUDA library was \
         probed).",
        MetricType::Counter,
        counters(e, |v| v.h2d_bytes),
    )?;
    family(
        enc,
        "traceml_kernel_launches",
        "CUDA kernel launches (absent when no CUDA library was probed).",
        MetricType::Counter,
        counters(e, |v| v.kernel_launches),
    )?;
    family(
        enc,
        "traceml_gpu_utilization_ratio",
        "Utilization (0-1) of the GPUs the target uses, at the latest NVML sample (absent \
         without NVML).",
        MetricType::Gauge,
        gauges(e, |v| v.gpu_utilization),
    )?;
    family(
        enc,
        "traceml_events_lost",
        "Probe events lost (ring buffer full, read failures, undecodable).",
        MetricType::Counter,
        counters(e, |v| v.events_lost),
    )?;
    family(
        enc,
        "traceml_probe_failures",
        "Probes that could not be attached.",
        MetricType::Counter,
        counters(e, |v| Some(v.probe_failures)),
    )?;
    family(
        enc,
        "traceml_daemon_overhead_ratio",
        "The daemon's estimated added time on the target, as a share of step time, since the \
         last probe-set change.",
        MetricType::Gauge,
        gauges(e, |v| v.overhead_ratio),
    )?;
    family(
        enc,
        "traceml_attached_jobs",
        "Jobs the daemon is attached to.",
        MetricType::Gauge,
        vec![(Vec::new(), ConstGauge::new(e.attached_jobs() as i64))],
    )?;
    Ok(())
}

/// `traceml_job_info`: who each job's rank is (pids only here).
fn job_info(enc: &mut DescriptorEncoder, e: &Exporter) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(
        "traceml_job",
        "Who each job's rank is.",
        None,
        MetricType::Info,
    )?;
    for (j, job) in &e.jobs {
        for (r, rank) in &job.ranks {
            let pid = rank.info.pid.to_string();
            let (comm, command) = (label(&rank.info.comm), label(&rank.info.command));
            let opt = |v: &Option<String>| label(v.as_deref().unwrap_or(""));
            let user = opt(&rank.info.user);
            let (container, pod, unit) = (
                opt(&rank.info.container),
                opt(&rank.info.pod),
                opt(&rank.info.unit),
            );
            let mut labels = rank_labels(j, r, &rank.info);
            labels.extend([
                ("pid", pid),
                ("comm", comm),
                ("command", command),
                ("user", user),
                ("container", container),
                ("pod", pod),
                ("unit", unit),
            ]);
            m.encode_info(&labels)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
