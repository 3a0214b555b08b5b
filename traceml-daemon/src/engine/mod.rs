//! The phase engine: a pure fold over the event stream that finds the training thread, its step
//! boundaries and each step's exclusive phase times. No clock, no I/O: only event timestamps.
use serde::{Deserialize, Serialize};

/// The phases of a step, in the order the report lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    InputWait,
    H2d,
    Forward,
    Backward,
    Optimizer,
    GpuWait,
    Residual,
}

impl Phase {
    pub const ALL: [Phase; 7] =
        [Phase::InputWait, Phase::H2d, Phase::Forward, Phase::Backward, Phase::Optimizer, Phase::GpuWait, Phase::Residual];

    pub fn name(self) -> &'static str {
        match self {
            Phase::InputWait => "input_wait",
            Phase::H2d => "h2d",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer",
            Phase::GpuWait => "gpu_wait",
            Phase::Residual => "residual",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

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
    pub phase_ns: [u64; 7],
    /// Kernel launches per phase (runtime and driver launches counted once).
    pub launches: [u32; 7],
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
    /// Steps cut because they spanned an epoch end, a gap in the trace or the attach point.
    pub partial_steps_dropped: u32,
}
