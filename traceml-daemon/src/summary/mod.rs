//! The summary model: what one run measured and concluded, as written to `final_summary.json`
//! (schema documented field by field in `docs/summary-schema.md`) and read back by `compare`.
//!
//! Every metric that may not have been measured is an `Option`: never measured is `null`, never 0.
//! Within one `schema_version` new fields may be added (readers ignore unknown fields); removing or
//! changing the meaning of a field bumps [`SCHEMA_VERSION`].
use std::ops::{Index, IndexMut};

use serde::{Deserialize, Serialize};

use crate::engine::Boundary;
use crate::event::EndReason;
use crate::phase::Phase;

mod framework;
mod jobs;
mod system;
pub use framework::*;
pub use jobs::*;
pub use system::*;

/// The schema version this build writes and reads.
/// 3: a step is one optimizer step (with its micro-batches) wherever the loop has one, and
/// evaluation between optimizer steps is its own segment ([`Evaluation`]), not steps.
pub const SCHEMA_VERSION: u32 = 3;

/// Everything one run measured and concluded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub schema_version: u32,
    /// Version of the traceml-daemon that measured the run.
    pub daemon_version: Option<String>,
    pub target: TargetSummary,
    pub run: RunInfo,
    /// The headline: the most severe finding (largest share on ties), or `BALANCED` /
    /// `INSUFFICIENT_DATA`.
    pub primary_diagnosis: Finding,
    /// Every finding of the rules, most severe first (the primary one included).
    pub findings: Vec<Finding>,
    pub steps: StepsInfo,
    /// Evaluation between optimizer steps (schema 3; zero segments when there was none).
    #[serde(default)]
    pub evaluation: Evaluation,
    pub step_ms: StepMs,
    pub phases: Phases<PhaseStats>,
    pub cuda: CudaStats,
    pub system: SystemStats,
    pub process: ProcessStats,
    pub workers: WorkerStats,
    /// `null`: GPU metrics unavailable (no NVML, no driver or no GPU).
    pub gpu: Option<GpuStats>,
    pub memory: MemoryStats,
    pub data_quality: DataQuality,
    /// The daemon's own estimated cost on the target and the probe sets that ran; `null` for
    /// streams recorded before the overhead governor (no probe counters in them).
    #[serde(default)]
    pub daemon_overhead: Option<DaemonOverhead>,
    /// Per-step distributions (decimated) for `compare`.
    pub step_samples: StepSamples,
    /// A multi-rank job (schema 2): what it is. Absent for a single process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobInfo>,
    /// A multi-rank job: one entry per rank, by rank. The rest of the summary is rank 0's (or
    /// the lowest rank measured), with the job-level findings (STRAGGLER, HANG) added.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<RankSummary>,
    /// What fixing it buys: for the cause and the next phases worth naming, the step time if
    /// that phase fell to its floor, each with the assumption that makes it a bound (see
    /// `whatif`). A multi-rank job with a straggler leads with the job's step at the median
    /// rank's pace. Empty: nothing to gain that the daemon can bound.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub what_if: Vec<WhatIf>,
    /// The collectives this process issued (its ledger, `engine::ledger`): totals and the newest
    /// entries, what a job's ranks are joined on. Absent: none seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collectives: Option<CollectiveLog>,
    /// A multi-rank job: who the job waited for at its collectives, and where the ranks' calls
    /// disagree (`ranks::join_ledgers`). Absent: fewer than two ranks with a ledger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collective_waits: Option<CollectiveWaits>,
    /// A multi-rank job whose ranks made each other wait: how the straggling is spread over
    /// the steps (`ranks::classify_stragglers`). Absent: no rank was slow in a step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stragglers: Option<Stragglers>,
}

/// One what-if: the step if `phase` fell to its floor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WhatIf {
    /// The phase that falls (`collective_wait` for a straggler running at the median pace).
    pub phase: Phase,
    /// What falls, and to what: `input_wait → 0`, `rank 2 at the median pace`.
    pub change: String,
    /// Mean step time now, ms.
    pub step_ms: f64,
    /// Mean step time with the change, ms.
    pub step_ms_if: f64,
    /// `step_ms / step_ms_if`: the factor on steps per second.
    pub throughput_factor: f64,
    /// Why the figure is a bound: what it assumes.
    pub assumption: String,
    /// Measured, not modelled: the run's own steps the figure is the median of (the steps that
    /// found their batch ready, for `input_wait`). Absent for a modelled floor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured: Option<MeasuredSteps>,
}

/// The run's steps a what-if was measured on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MeasuredSteps {
    /// How many of the kept steps (`step_samples`) qualified, and of how many.
    pub steps: u64,
    pub of: u64,
    /// What qualified them: an input wait at most this long, ms.
    pub input_wait_max_ms: f64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Summary {
    /// The phases a report lists: `collective_wait` only for a multi-rank job or where it
    /// occurred (a single process has none).
    pub fn shown_phases(&self) -> Vec<Phase> {
        Phase::ALL
            .into_iter()
            .filter(|&p| {
                p != Phase::CollectiveWait
                    || !self.ranks.is_empty()
                    || self.phases[p].share.is_some_and(|s| s > 0.0)
            })
            .collect()
    }
}

/// The daemon's estimated added time on the target (probe hits × measured per-hit cost, see
/// `overhead::COSTS`) and the probe sets the governor chose.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DaemonOverhead {
    /// The governor's budget, percent of step time (`null` when the stream does not say).
    pub budget_pct: Option<f64>,
    /// Over the whole run (the learning period with every probe included).
    pub estimated_us_per_step: Option<f64>,
    pub estimated_pct_of_step: Option<f64>,
    /// Since the last probe-set change: what the job pays from then on.
    pub steady_us_per_step: Option<f64>,
    pub steady_pct_of_step: Option<f64>,
    /// Probe hits per step over the whole run, by probe.
    pub hits_per_step: ProbeHits,
    /// Probe hits per step since the last probe-set change.
    pub steady_hits_per_step: ProbeHits,
    /// Probe-set changes in order (the first is the set at attach).
    pub probe_sets: Vec<ProbeSetChange>,
    /// The estimate against the target's own CPU time over the run (the probe handlers run on
    /// its threads): the slowdown of CPU-bound work, what a process without steps pays.
    /// `null` without /proc samples.
    #[serde(default)]
    pub estimated_pct_of_cpu: Option<f64>,
    /// The same since the last probe-set change.
    #[serde(default)]
    pub steady_pct_of_cpu: Option<f64>,
    /// The estimated target time the learning periods cost (the frame-evaluator probe armed on
    /// every Python call to learn the loop), ms over the run: paid once per attach (and once per
    /// new loop), not per step. `null` when no learning ran.
    #[serde(default)]
    pub learning_ms: Option<f64>,
    /// How many learning periods ran.
    #[serde(default)]
    pub learning_periods: u32,
    /// The per-hit costs measured on the machine at start (`null`: the reference model, e.g.
    /// a recording made before calibrations or a calibration that failed).
    #[serde(default)]
    pub calibration: Option<crate::event::Calibration>,
    /// The per-hit cost model the estimates used, ns per hit: the reference model scaled by
    /// the calibration.
    #[serde(default)]
    pub cost_model: crate::overhead::CostModel,
}

/// Hits per step of each probe.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProbeHits {
    /// `_PyEval_EvalFrameDefault` entries (every C→Python call while armed).
    pub python: Option<f64>,
    /// Return probes (frame-evaluator returns and native calls with an exit probe).
    pub returns: Option<f64>,
    /// Native calls with an exit probe (copies, syncs, backward).
    pub native_calls: Option<f64>,
    /// `record_function` entries and exits.
    pub record_function: Option<f64>,
    pub launches: Option<f64>,
    /// Runs of the thread-state program doing a watched thread's work (a switch out or back
    /// in); absent where not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switches: Option<f64>,
}

/// One probe-set change.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProbeSetChange {
    /// Seconds since attach.
    pub at_s: f64,
    /// The frame-evaluator probe was armed.
    pub python: bool,
    /// Every kernel launch was an event (else counted only).
    pub launch_events: bool,
    pub reason: String,
    /// Only torch's marker probes were placed, watching for training.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub watching: bool,
}

/// The process that was measured.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TargetSummary {
    pub pid: Option<u32>,
    pub comm: Option<String>,
    pub cmdline: Vec<String>,
    /// "3.11.7" when known.
    pub python: Option<String>,
    pub hostname: Option<String>,
    pub num_cpus: Option<u32>,
    pub mem_total_bytes: Option<u64>,
    /// Whose job: user, container, pod, systemd unit; absent when not read (recordings of
    /// older daemons, replayed summaries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<crate::event::Identity>,
}

/// When and how long the daemon watched.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// Wall-clock seconds since the epoch at attach.
    pub attach_unix_s: Option<f64>,
    /// Seconds from attach to the end of the run (or to the last item of a truncated recording).
    pub duration_s: Option<f64>,
    /// Seconds covered by complete steps.
    pub measured_s: Option<f64>,
    /// Seconds from attach to the start of the first complete step.
    pub first_step_s: Option<f64>,
    /// How the target ended (exit status, signal, program exec'd) when it did; absent when the
    /// daemon stopped first or the recording predates it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<crate::event::TargetEnd>,
}

/// What the rules say about the run.
#[derive(
    Default, Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum DiagnosisKind {
    InputBound,
    H2dBound,
    ComputeBound,
    ResidualHeavy,
    MemoryCreep,
    LowGpuUtilizationUnexplained,
    Balanced,
    #[default]
    InsufficientData,
    /// One rank of a multi-rank job makes the others wait at its collectives.
    Straggler,
    /// A rank completed no step for long: the job is stuck.
    Hang,
    /// Evaluation between optimizer steps takes a large share of wall time (a finding beside
    /// the training verdict, never the verdict).
    EvaluationHeavy,
    /// No training marker in the whole run: no DataLoader iteration, optimizer step or
    /// backward pass (an inference server, a notebook between runs).
    NotTraining,
}

impl DiagnosisKind {
    /// `INPUT_BOUND`, as in the JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            DiagnosisKind::InputBound => "INPUT_BOUND",
            DiagnosisKind::H2dBound => "H2D_BOUND",
            DiagnosisKind::ComputeBound => "COMPUTE_BOUND",
            DiagnosisKind::ResidualHeavy => "RESIDUAL_HEAVY",
            DiagnosisKind::MemoryCreep => "MEMORY_CREEP",
            DiagnosisKind::LowGpuUtilizationUnexplained => "LOW_GPU_UTILIZATION_UNEXPLAINED",
            DiagnosisKind::Balanced => "BALANCED",
            DiagnosisKind::InsufficientData => "INSUFFICIENT_DATA",
            DiagnosisKind::Straggler => "STRAGGLER",
            DiagnosisKind::Hang => "HANG",
            DiagnosisKind::EvaluationHeavy => "EVALUATION_HEAVY",
            DiagnosisKind::NotTraining => "NOT_TRAINING",
        }
    }

    /// `INPUT-BOUND`, as on the card.
    pub fn headline(self) -> String {
        self.as_str().replace('_', "-")
    }
}

/// How bad a finding is. Ordered: `Info < Warning < Critical`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Info,
    Warning,
    Critical,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }
}

/// How far the data behind a finding can be trusted (events lost, probes missing).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Confidence {
    Low,
    Medium,
    High,
}

impl Confidence {
    pub fn as_str(self) -> &'static str {
        match self {
            Confidence::Low => "low",
            Confidence::Medium => "medium",
            Confidence::High => "high",
        }
    }
}

/// One conclusion of one rule, with its evidence and the next thing to try.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub kind: DiagnosisKind,
    pub severity: Severity,
    /// The evidence, with the numbers.
    pub why: String,
    /// The next thing to try.
    pub next: String,
    /// The phase the finding is about, if any.
    pub phase: Option<Phase>,
    /// That phase's share of step time (0–1), used to order findings of equal severity.
    pub share: Option<f64>,
    pub confidence: Confidence,
    /// STRAGGLER and HANG: the rank the others wait for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub culprit_rank: Option<u32>,
}

/// How many steps, and what delimited them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepsInfo {
    /// Complete steps of the training thread.
    pub count: u32,
    /// `null` when the engine did not decide (no events).
    pub boundary: Option<Boundary>,
    pub training_tid: Option<u32>,
    /// Micro-batches (fetch, forward, backward) per step: more than 1 under gradient
    /// accumulation. `null` without steps, or where no backward was seen.
    #[serde(default)]
    pub micro_batches: Option<MicroBatches>,
    /// Steps taken while the learning probe set (the frame evaluator) ran: counted in `count`,
    /// kept out of `step_ms` and the phase statistics when steady steps exist.
    #[serde(default)]
    pub learning_excluded: u32,
    /// The training markers seen, steps or not: what tells a process that trains from one that
    /// does not (`NOT_TRAINING`). `null` where torch's marker probes were not placed, and in
    /// summaries from before they were counted.
    #[serde(default)]
    pub markers: Option<TrainingMarkers>,
    /// Threads of the training process that fetch batches but do not train (a background
    /// thread filling a queue the loop reads): the input side, like workers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub feeders: Vec<FeederStats>,
    /// The training framework and dataset kind the sampled stacks show (what the advice is
    /// said in). Absent for a plain loop over a map-style dataset (the default), and in
    /// summaries from before it was read.
    #[serde(default, skip_serializing_if = "LoopFramework::is_plain")]
    pub framework: LoopFramework,
}

/// A thread that fetches batches for the training thread.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FeederStats {
    pub tid: u32,
    /// Batches it fetched (DataLoader calls) over the run, and the time inside them.
    pub fetches: u64,
    pub fetch_ms: f64,
}

/// Signs of training in the stream, counted over the whole run.
pub use crate::engine::TrainingMarkers;

/// Micro-batches per optimizer step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MicroBatches {
    pub total: u64,
    pub mean: f64,
    pub min: u32,
    pub max: u32,
}

/// Evaluation segments: between two optimizer steps, the fetches and forwards that no backward
/// followed (HF `evaluate`, Lightning validation and sanity check, a `torch.no_grad()` loop).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    pub segments: u64,
    /// Batches fetched in them.
    pub batches: u64,
    pub wall_s: f64,
    /// `wall_s` over the run's wall time (`run.duration_s`); `null` without it.
    pub share_of_wall: Option<f64>,
    /// Exclusive time per phase in the segments; `null` without segments.
    pub phases: Option<Phases<EvalPhase>>,
}

/// One phase of the evaluation segments.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EvalPhase {
    pub total_s: f64,
    /// Of the segments' wall time (0–1).
    pub share: f64,
}

/// Step duration statistics, in milliseconds; `null` without steps.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepMs {
    pub median: Option<f64>,
    pub p90: Option<f64>,
    pub mean: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    /// When the steps' times fall into separate groups with a gap no step took (DataLoader
    /// workers delivering in pairs, a periodic checkpoint step): each group, slowest first. The
    /// median then describes no step. Empty when the times form one group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<StepGroup>,
}

/// One group of step times ([`StepMs::groups`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepGroup {
    /// Steps in the group (of the kept steps, scaled to every step of the run).
    pub count: u64,
    /// Its share of the steps (0–1).
    pub share: f64,
    /// Its median step time, ms.
    pub typical_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
}

/// One value per phase, with the phase names of the report as field names.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Phases<T> {
    pub input_wait: T,
    pub h2d: T,
    pub forward: T,
    pub backward: T,
    pub optimizer: T,
    pub gpu_wait: T,
    /// Absent from summaries written before multi-rank support (schema 1): the default then.
    #[serde(default)]
    pub collective_wait: T,
    pub residual: T,
}

impl<T> Phases<T> {
    /// Builds one value per phase.
    pub fn from_fn(mut f: impl FnMut(Phase) -> T) -> Phases<T> {
        Phases {
            input_wait: f(Phase::InputWait),
            h2d: f(Phase::H2d),
            forward: f(Phase::Forward),
            backward: f(Phase::Backward),
            optimizer: f(Phase::Optimizer),
            gpu_wait: f(Phase::GpuWait),
            collective_wait: f(Phase::CollectiveWait),
            residual: f(Phase::Residual),
        }
    }

    /// The phases in report order, with their values.
    pub fn iter(&self) -> impl Iterator<Item = (Phase, &T)> {
        Phase::ALL.into_iter().map(move |p| (p, &self[p]))
    }
}

impl<T> Index<Phase> for Phases<T> {
    type Output = T;
    fn index(&self, p: Phase) -> &T {
        match p {
            Phase::InputWait => &self.input_wait,
            Phase::H2d => &self.h2d,
            Phase::Forward => &self.forward,
            Phase::Backward => &self.backward,
            Phase::Optimizer => &self.optimizer,
            Phase::GpuWait => &self.gpu_wait,
            Phase::CollectiveWait => &self.collective_wait,
            Phase::Residual => &self.residual,
        }
    }
}

impl<T> IndexMut<Phase> for Phases<T> {
    fn index_mut(&mut self, p: Phase) -> &mut T {
        match p {
            Phase::InputWait => &mut self.input_wait,
            Phase::H2d => &mut self.h2d,
            Phase::Forward => &mut self.forward,
            Phase::Backward => &mut self.backward,
            Phase::Optimizer => &mut self.optimizer,
            Phase::GpuWait => &mut self.gpu_wait,
            Phase::CollectiveWait => &mut self.collective_wait,
            Phase::Residual => &mut self.residual,
        }
    }
}

/// One phase's statistics over the complete steps; `null` without steps.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PhaseStats {
    /// Median over steps of the phase's exclusive time in the step.
    pub median_ms: Option<f64>,
    pub mean_ms: Option<f64>,
    /// Total phase time / total step time (0–1).
    pub share: Option<f64>,
    /// Mean kernel launches per step in this phase (`null` when no CUDA library was probed).
    pub launches_per_step: Option<f64>,
    /// The functions that hold most of the phase's stack samples (see `profile`): in
    /// `residual` what the training loop called, elsewhere the innermost Python frame. Empty
    /// without stack samples.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top_functions: Vec<crate::profile::TopFunction>,
    /// Where the blocked time waited: the innermost Python functions of the phase's stack
    /// samples taken while the training thread was blocked (asleep or in I/O), with their share
    /// of those samples (`get_batch` reading a file, `Queue.get`, `time.sleep`). Empty without
    /// stack samples or thread states.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocked_in: Vec<crate::profile::TopFunction>,
    /// `gpu_wait` only: the lines that called the blocking syncs and device-to-host copies the
    /// training thread's stack samples fell in (the innermost Python frame and the line it
    /// executed), with the CUDA function and their share of those samples. Empty without
    /// stack samples in a wait.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub wait_sites: Vec<crate::profile::WaitSite>,
    /// Stack samples that fell in this phase (absent: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stack_samples: u64,
    /// The training thread's own time in this phase, mean per step, from the scheduler's
    /// switches (`null`: the thread-state source was not placed): on its CPU, blocked (asleep:
    /// a lock or queue, `sleep`, a read, a device sync), of which in uninterruptible I/O, and
    /// runnable but waiting for a CPU. `cpu_ms + blocked_ms + runnable_ms = mean_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runnable_ms: Option<f64>,
}

/// Events lost, per reason (the last cumulative counters of the run).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LostCounts {
    pub ring_full: u64,
    pub read_failed: u64,
    pub state_full: u64,
    pub undecodable: u64,
    pub seq_gaps: u64,
    /// Off-CPU records (sched_switch) the full ring buffer dropped; in `total`.
    #[serde(default)]
    pub off_cpu_ring_full: u64,
    /// Calls deeper than the probes follow, not reported (their time stays with their callers):
    /// not lost, not in `total`.
    #[serde(default)]
    pub too_deep: u64,
    /// Sum of the kernel-side reasons and undecodable events (`seq_gaps` and `too_deep` apart).
    pub total: u64,
}

/// A probe that could not be attached.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProbeFailed {
    pub probe: String,
    pub file: String,
    pub reason: String,
}

/// What could make the numbers wrong.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DataQuality {
    /// Probe events in the stream.
    pub events_recorded: u64,
    /// `null` when the stream carried no loss counters.
    pub events_lost: Option<LostCounts>,
    /// Lost / (lost + recorded), 0–1.
    pub lost_ratio: Option<f64>,
    pub probes_failed: Vec<ProbeFailed>,
    pub python_version: Option<String>,
    /// Paths of the CUDA runtime and driver libraries probed.
    pub cuda_libraries: Vec<String>,
    /// Libraries mapped in the target that carry their own copy of the CUDA runtime (cuBLAS,
    /// cuDNN, NCCL): their launches reach the driver from there (`cuda.launches_by_path`'s
    /// `library`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub own_runtime_libraries: Vec<String>,
    /// Driver entry points reached through a `cuGetProcAddress` pointer that is not the
    /// exported function, each probed where it points (`cuLaunchKernel+0x1a2b0` in its file).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub driver_pointers_followed: Vec<String>,
    pub boundary: Option<Boundary>,
    pub unmatched_events: u64,
    pub reordered_events: u64,
    /// Probe events left out because they came after the target's exec: the probes of the old
    /// program fire in the new one until the daemon removes them (not lost, not this run's).
    #[serde(default)]
    pub events_after_exec: u64,
    pub partial_steps_dropped: u32,
    /// Periodic samples in the stream.
    pub samples: u32,
    /// `truncated` when the stream had no end item.
    pub end_reason: EndReason,
    pub confidence: Confidence,
    /// Why the confidence is not high, one sentence each.
    pub notes: Vec<String>,
}

impl Default for DataQuality {
    fn default() -> Self {
        DataQuality {
            events_recorded: 0,
            events_lost: None,
            lost_ratio: None,
            probes_failed: Vec::new(),
            python_version: None,
            cuda_libraries: Vec::new(),
            own_runtime_libraries: Vec::new(),
            driver_pointers_followed: Vec::new(),
            boundary: None,
            unmatched_events: 0,
            reordered_events: 0,
            events_after_exec: 0,
            partial_steps_dropped: 0,
            samples: 0,
            end_reason: EndReason::Truncated,
            confidence: Confidence::High,
            notes: Vec::new(),
        }
    }
}

/// Per-step values for `compare`: every `stride`-th complete step (at most
/// [`StepSamples::MAX`] of them), in milliseconds rounded to 0.01 ms (0.1 ms from 100 ms).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepSamples {
    pub stride: u32,
    pub step_ms: Vec<f64>,
    pub phase_ms: Phases<Vec<f64>>,
}

impl StepSamples {
    /// Most steps kept; longer runs are decimated with a uniform stride.
    pub const MAX: usize = 1000;
}

/// The JSON name of a boundary (`dataloader_next`, ...).
pub fn boundary_name(b: Boundary) -> &'static str {
    match b {
        Boundary::DataloaderNext => "dataloader_next",
        Boundary::OptimizerStep => "optimizer_step",
        Boundary::SyncPattern => "sync_pattern",
        Boundary::None => "none",
    }
}

/// Why a summary file could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SummaryError {
    #[error("summary is empty")]
    Empty,
    #[error(
        "summary is truncated (input ends at line {line}, column {column}): was it still being written?"
    )]
    Truncated { line: usize, column: usize },
    #[error("summary is not valid JSON: {message} (line {line}, column {column})")]
    Malformed {
        message: String,
        line: usize,
        column: usize,
    },
    #[error("not a traceml-daemon summary: no numeric schema_version field")]
    NotASummary,
    #[error(
        "written by a newer traceml-daemon: schema_version {found}, this build reads {SCHEMA_VERSION}"
    )]
    NewerSchema { found: u64 },
    #[error("unsupported schema_version {found}: this build reads {SCHEMA_VERSION}")]
    UnsupportedSchema { found: u64 },
    #[error("summary does not match schema_version {SCHEMA_VERSION}: {0}")]
    Invalid(String),
}

impl Summary {
    /// Reads a summary, with a clear error for empty, truncated, malformed, foreign and
    /// newer-schema input. Unknown fields are ignored.
    pub fn from_json(s: &str) -> Result<Summary, SummaryError> {
        use serde_json::error::Category;
        if s.trim().is_empty() {
            return Err(SummaryError::Empty);
        }
        // Fast path (a sweep reads thousands of summaries): a valid summary of this schema
        // parses straight into the model, without building a `Value` tree first (about half the
        // time). Anything else (another version, an error to explain) takes the path below.
        if let Ok(summary) = serde_json::from_str::<Summary>(s)
            && summary.schema_version == SCHEMA_VERSION
        {
            return Ok(summary);
        }
        let value: serde_json::Value = serde_json::from_str(s).map_err(|e| match e.classify() {
            Category::Eof => SummaryError::Truncated {
                line: e.line(),
                column: e.column(),
            },
            _ => SummaryError::Malformed {
                message: strip_position(&e),
                line: e.line(),
                column: e.column(),
            },
        })?;
        let version = value
            .get("schema_version")
            .and_then(serde_json::Value::as_u64)
            .ok_or(SummaryError::NotASummary)?;
        if version > u64::from(SCHEMA_VERSION) {
            return Err(SummaryError::NewerSchema { found: version });
        }
        // Schemas 1 (before multi-rank jobs) and 2 (before optimizer steps) read as 3: what
        // they lack has defaults.
        if version < 1 {
            return Err(SummaryError::UnsupportedSchema { found: version });
        }
        serde_json::from_value(value).map_err(|e| SummaryError::Invalid(e.to_string()))
    }
}

/// serde_json's message without its " at line L column C" suffix (we print them separately).
fn strip_position(e: &serde_json::Error) -> String {
    let m = e.to_string();
    match m.rfind(" at line ") {
        Some(i) => m[..i].to_owned(),
        None => m,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::to_json;
    use crate::testkit;

    fn json() -> String {
        to_json(&testkit::summary(&testkit::Scenario {
            steps: 30,
            ..testkit::Scenario::default()
        }))
    }

    #[test]
    fn reads_back_what_it_writes() {
        let j = json();
        assert_eq!(to_json(&Summary::from_json(&j).unwrap()), j);
    }

    #[test]
    fn clear_errors() {
        let j = json();
        assert_eq!(Summary::from_json("  \n"), Err(SummaryError::Empty));
        assert!(matches!(
            Summary::from_json(&j[..j.len() / 2]),
            Err(SummaryError::Truncated { .. })
        ));
        let e = Summary::from_json("{\"schema_version\": 1,, }").unwrap_err();
        assert!(matches!(e, SummaryError::Malformed { line: 1, .. }), "{e}");
        assert_eq!(
            Summary::from_json("{\"hello\": 1}"),
            Err(SummaryError::NotASummary)
        );
        assert_eq!(Summary::from_json("[1, 2]"), Err(SummaryError::NotASummary));
        let newer = j.replacen("\"schema_version\": 3", "\"schema_version\": 4", 1);
        let e = Summary::from_json(&newer).unwrap_err();
        assert_eq!(
            e.to_string(),
            "written by a newer traceml-daemon: schema_version 4, this build reads 3"
        );
        let older = j.replacen("\"schema_version\": 3", "\"schema_version\": 0", 1);
        // Schema 1 (before multi-rank jobs) and 2 (before optimizer steps) summaries still read.
        for v in [1, 2] {
            let old = j.replacen(
                "\"schema_version\": 3",
                &format!("\"schema_version\": {v}"),
                1,
            );
            assert_eq!(Summary::from_json(&old).unwrap().steps.count, 30);
        }
        assert_eq!(
            Summary::from_json(&older),
            Err(SummaryError::UnsupportedSchema { found: 0 })
        );
        let missing = j.replacen("\"step_ms\": {", "\"step_msx\": {", 1);
        let e = Summary::from_json(&missing).unwrap_err();
        assert!(e.to_string().contains("missing field `step_ms`"), "{e}");
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let j = json().replacen('{', "{\n  \"added_later\": [1, 2],", 1);
        assert!(Summary::from_json(&j).is_ok());
    }

    #[test]
    fn never_measured_is_null() {
        let s = crate::analysis::summarize(&Default::default(), &[]);
        let v: serde_json::Value = serde_json::from_str(&to_json(&s)).unwrap();
        assert!(v["gpu"].is_null());
        assert!(v["step_ms"]["median"].is_null());
        assert!(v["phases"]["input_wait"]["share"].is_null());
        assert!(v["process"]["rss_bytes_max"].is_null());
        assert!(v["workers"]["count"].is_null());
        assert_eq!(v["primary_diagnosis"]["kind"], "INSUFFICIENT_DATA");
    }
}
