//! What the engine hands out: the steps (each one's exclusive phase times), the run's exact
//! totals and what else it found (the boundary, the training thread, feeders, evaluation).
use super::*;

/// What delimits steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Boundary {
    /// Entry of the DataLoader iterator's `__next__` on the training thread.
    DataloaderNext,
    /// End of `Optimizer.step` (no DataLoader seen).
    OptimizerStep,
    /// The repeating pattern of blocking CUDA syncs (no DataLoader, no optimizer seen).
    SyncPattern,
    /// No boundary found: no steps.
    None,
}

/// One training step of the training thread.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// 0-based index among complete steps.
    pub index: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    /// Exclusive time per phase, indexed by [`Phase::index`]; sums to `end_ns - start_ns`.
    pub phase_ns: [u64; N_PHASES],
    /// Kernel launches per phase (each launch once: a runtime launch's own driver call is
    /// not another).
    pub launches: [u32; N_PHASES],
    /// The same launches by how they reached the driver ([`LaunchPath::COUNTED`]: the
    /// runtime, a library's own runtime copy, the driver called directly).
    ///
    /// [`LaunchPath::COUNTED`]: crate::event::LaunchPath::COUNTED
    #[serde(default, skip_serializing_if = "is_zero3")]
    pub launches_by_path: [u32; 3],
    pub h2d_bytes: u64,
    pub d2h_bytes: u64,
    pub h2d_copies: u32,
    pub d2h_copies: u32,
    /// Host time inside H2D copy calls.
    pub h2d_ns: u64,
    /// Host time inside D2H copy calls (synchronous: they wait for the device).
    pub d2h_ns: u64,
    /// Blocking syncs (stream/device/event).
    pub syncs: u32,
    /// Collectives issued (c10d or NCCL calls of any thread of the process).
    #[serde(default)]
    pub collectives: u32,
    /// Their bytes, where the call says (NCCL).
    #[serde(default)]
    pub collective_bytes: u64,
    /// Micro-batches (fetch, forward, backward) in this optimizer step: more than one under
    /// gradient accumulation. 0 where none was seen (no backward probe, an inference loop).
    #[serde(default)]
    pub micro_batches: u32,
    /// Off-CPU time of the training thread per phase (indexed by [`Phase::index`]), from the
    /// scheduler's switches: blocked (asleep: a lock, queue, sleep, read, device sync), of which
    /// in uninterruptible I/O (`io_ns`), and runnable but waiting for a CPU. On-CPU time is the
    /// phase's time less both. All 0 where the thread-state source was not placed.
    #[serde(default)]
    pub blocked_ns: [u64; N_PHASES],
    #[serde(default)]
    pub io_ns: [u64; N_PHASES],
    #[serde(default)]
    pub runnable_ns: [u64; N_PHASES],
    /// Taken while the frame-evaluator probe was armed (the governor's learning period, whose
    /// probe cost inflates the step) or before the CUDA probes were placed (watching for
    /// training): kept out of the shares when steady steps exist.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub learning: bool,
}

impl Step {
    pub fn duration_ns(&self) -> u64 {
        self.end_ns - self.start_ns
    }
    pub fn phase(&self, p: Phase) -> u64 {
        self.phase_ns[p.index()]
    }
}

/// What the engine found.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineOutput {
    pub steps: Vec<Step>,
    pub boundary: Option<Boundary>,
    pub training_tid: Option<u32>,
    /// Events that could not be placed (exit without entry, entry never closed, ...).
    pub unmatched_events: u64,
    /// Events that arrived out of timestamp order (reordered before folding).
    pub reordered_events: u64,
    /// Steps not measured: the fragment before the first boundary (attach point), an unterminated
    /// last step (end of trace), steps of zero length.
    pub partial_steps_dropped: u32,
    /// Stack samples of the training thread taken inside a step, with the phase in force (a
    /// bounded, time-ordered sample: see [`MAX_SAMPLES_KEPT`]).
    #[serde(default)]
    pub samples: Vec<PhaseSample>,
    /// Sums over every measured step; `steps` holds a sample of at most [`MAX_STEPS_KEPT`]
    /// (every `step_stride`-th step).
    #[serde(default)]
    pub totals: StepTotals,
    #[serde(default)]
    pub step_stride: u64,
    /// Probe events folded.
    #[serde(default)]
    pub events: u64,
    /// Timestamp of the last event.
    #[serde(default)]
    pub last_ts: Option<u64>,
    /// Events left out because they came after their process's exec (the probes of the old
    /// program fire in the new one until they are removed): not of this run, not lost.
    #[serde(default)]
    pub after_exec_events: u64,
    /// Sums over the measured steps not taken under the learning probe set ([`Step::learning`]).
    #[serde(default)]
    pub steady: StepTotals,
    /// Evaluation segments between optimizer steps (see [`cutter`]'s doc).
    #[serde(default)]
    pub evaluation: EvalTotals,
    /// Signs of training over the whole trace, steps or not.
    #[serde(default)]
    pub markers: TrainingMarkers,
    /// Threads of the training thread's process that fetch batches but do not train (a
    /// background thread filling a queue the loop reads): the input side, like workers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub feeders: Vec<Feeder>,
    /// Off-CPU intervals of the training thread were reported (the scheduler program runs).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub thread_states: bool,
    /// DataLoader workers' stack samples, folded (see [`WorkerFold`]).
    #[serde(skip)]
    pub workers: WorkerFold,
    /// The collectives this process issued (see [`ledger`]).
    #[serde(default)]
    pub ledger: ledger::Ledger,
}

/// A thread that fetches batches for the training thread (see [`EngineOutput::feeders`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Feeder {
    pub tid: u32,
    /// Batches it fetched (DataLoader calls) and the time inside them.
    pub fetches: u64,
    pub fetch_ns: u64,
}

/// Signs of training in a trace, counted whether or not they make steps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrainingMarkers {
    /// DataLoader iterations (`enumerate(DataLoader)#` records).
    pub dataloader_iterations: u64,
    /// `Optimizer.step#` records.
    pub optimizer_steps: u64,
    /// `loss.backward()` calls (the autograd engine's entry from Python).
    pub backward_passes: u64,
}

impl TrainingMarkers {
    pub fn any(&self) -> bool {
        self.dataloader_iterations + self.optimizer_steps + self.backward_passes > 0
    }

    pub(super) fn count(&mut self, kind: &Kind) {
        use crate::classify::{RecordClass, classify_record};
        match kind {
            Kind::RecordEnter { name } => match classify_record(name) {
                Some(RecordClass::DataLoaderNext) => self.dataloader_iterations += 1,
                Some(RecordClass::OptimizerStep) => self.optimizer_steps += 1,
                _ => {}
            },
            Kind::CallEnter {
                api: crate::event::Api::TorchBackward,
                ..
            } => self.backward_passes += 1,
            _ => {}
        }
    }
}

/// Sums over the evaluation segments: fetches and forwards with no backward between two
/// optimizer steps.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EvalTotals {
    pub segments: u64,
    /// Batches fetched in them.
    pub batches: u64,
    pub wall_ns: u64,
    /// Exclusive time per phase, indexed by [`Phase::index`]; sums to `wall_ns`.
    pub phase_ns: [u64; N_PHASES],
}

/// A stack sample placed in the training thread's timeline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhaseSample {
    pub ts: u64,
    /// Index of the step it fell in.
    pub step: u32,
    pub phase: Phase,
    /// [`crate::event::FuncInfo`] ids, outermost first.
    pub frames: Vec<u32>,
    /// The thread was off its CPU at the sample, and why (`None`: on CPU, or no thread-state
    /// source): the blocked time's functions (`PhaseStats::blocked_in`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub off_cpu: Option<crate::event::OffCpu>,
    /// The lines the innermost frames executed, innermost first (`StackSample::lines`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lines: Vec<u32>,
    /// The blocking sync or device-to-host copy the thread was in at the sample, by the API
    /// called (`None`: not waiting for the device): where the GPU waits, by line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<crate::event::Api>,
}

/// Per-step sums over every step the engine measured (the stored [`EngineOutput::steps`] are a
/// bounded sample of them).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepTotals {
    pub count: u64,
    pub duration_ns: u64,
    pub phase_ns: [u64; N_PHASES],
    pub launches: [u64; N_PHASES],
    /// Launches by path (see [`Step::launches_by_path`]).
    #[serde(default, skip_serializing_if = "is_zero3_u64")]
    pub launches_by_path: [u64; 3],
    pub h2d_bytes: u64,
    pub d2h_bytes: u64,
    pub h2d_copies: u64,
    pub d2h_copies: u64,
    pub h2d_ns: u64,
    pub d2h_ns: u64,
    pub syncs: u64,
    #[serde(default)]
    pub collectives: u64,
    #[serde(default)]
    pub collective_bytes: u64,
    /// Micro-batches summed over the steps.
    #[serde(default)]
    pub micro_batches: u64,
    /// Off-CPU time per phase (see [`Step::blocked_ns`]).
    #[serde(default)]
    pub blocked_ns: [u64; N_PHASES],
    #[serde(default)]
    pub io_ns: [u64; N_PHASES],
    #[serde(default)]
    pub runnable_ns: [u64; N_PHASES],
    /// Steps per duration bucket: `step_buckets[i]` counts the steps longer than
    /// `STEP_BUCKETS_NS[i - 1]` and at most `STEP_BUCKETS_NS[i]`; the last one, the longer steps
    /// (the exact histogram behind `traceml_step_duration_seconds`).
    #[serde(default)]
    pub step_buckets: [u64; STEP_BUCKETS_NS.len() + 1],
}

/// Upper bounds of the step-duration buckets, 1 ms to 5 min (Prometheus's `le`).
pub const STEP_BUCKETS_NS: [u64; 16] = [
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
    30_000_000_000,
    60_000_000_000,
    300_000_000_000,
];

impl StepTotals {
    /// The totals of these steps (for outputs built without the engine, e.g. test fixtures).
    pub fn from_steps(steps: &[Step]) -> StepTotals {
        let mut t = StepTotals::default();
        for s in steps {
            t.add(s);
        }
        t
    }

    /// Mean per step of a summed quantity; `None` without steps.
    pub fn per_step(&self, sum: u64) -> Option<f64> {
        (self.count > 0).then(|| sum as f64 / self.count as f64)
    }

    pub(super) fn add(&mut self, s: &Step) {
        self.count += 1;
        let d = s.end_ns.saturating_sub(s.start_ns);
        self.duration_ns += d;
        self.step_buckets[STEP_BUCKETS_NS.partition_point(|&le| le < d)] += 1;
        for i in 0..N_PHASES {
            self.phase_ns[i] += s.phase_ns[i];
            self.launches[i] += u64::from(s.launches[i]);
            self.blocked_ns[i] += s.blocked_ns[i];
            self.io_ns[i] += s.io_ns[i];
            self.runnable_ns[i] += s.runnable_ns[i];
        }
        for (t, &n) in self.launches_by_path.iter_mut().zip(&s.launches_by_path) {
            *t += u64::from(n);
        }
        self.h2d_bytes += s.h2d_bytes;
        self.d2h_bytes += s.d2h_bytes;
        self.h2d_copies += u64::from(s.h2d_copies);
        self.d2h_copies += u64::from(s.d2h_copies);
        self.h2d_ns += s.h2d_ns;
        self.d2h_ns += s.d2h_ns;
        self.syncs += u64::from(s.syncs);
        self.collectives += u64::from(s.collectives);
        self.collective_bytes += s.collective_bytes;
        self.micro_batches += u64::from(s.micro_batches);
    }
}

fn is_zero3(v: &[u32; 3]) -> bool {
    *v == [0; 3]
}

fn is_zero3_u64(v: &[u64; 3]) -> bool {
    *v == [0; 3]
}
