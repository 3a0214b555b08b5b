//! The phases of a training step: the vocabulary the engine cuts steps into and the summary
//! model reports. Here, below both, and imported from here only (`crate::phase::Phase`), so
//! presentation names a phase without importing the engine.
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
    /// The training thread blocked waiting for a collective (all-reduce, barrier, ...) of a
    /// multi-rank job to complete: the other ranks' arrival.
    CollectiveWait,
    Residual,
}

/// Number of phases.
pub const N_PHASES: usize = 8;

impl Phase {
    pub const ALL: [Phase; N_PHASES] = [
        Phase::InputWait,
        Phase::H2d,
        Phase::Forward,
        Phase::Backward,
        Phase::Optimizer,
        Phase::GpuWait,
        Phase::CollectiveWait,
        Phase::Residual,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Phase::InputWait => "input_wait",
            Phase::H2d => "h2d",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer",
            Phase::GpuWait => "gpu_wait",
            Phase::CollectiveWait => "collective_wait",
            Phase::Residual => "residual",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}
