//! A multi-rank job in the summary: who it is, its ranks, their collective ledgers joined
//! collective by collective, and its stragglers.
use serde::{Deserialize, Serialize};

use super::{DiagnosisKind, PhaseStats, Phases, StepMs};

/// One process's collective ledger in the summary.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CollectiveLog {
    /// Collectives issued in all, and per group (by order of first use).
    pub total: u64,
    pub per_group: Vec<u64>,
    /// The newest collectives (at most [`COLLECTIVES_KEPT`]), oldest first.
    pub recent: Vec<crate::engine::ledger::LedgerEntry>,
}

/// Collectives a summary keeps of its ledger.
pub const COLLECTIVES_KEPT: usize = 512;

/// Who a job waited for at its collectives: the ranks' ledgers joined collective by collective
/// (the same collective ends at the same instant on every rank: the entries of each rank whose
/// exit is nearest are one collective).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CollectiveWaits {
    /// Collectives joined across every rank.
    pub compared: u64,
    /// Per rank: how often it arrived last, and what that cost the others.
    pub ranks: Vec<RankArrivals>,
    /// The rank the job waited for (the last to arrive at the largest share of the compared
    /// collectives, at least 60 % of them, with a lateness over the noise); `null`: none.
    pub waits_for: Option<u32>,
    /// Where the ranks' calls disagree: a different op at the same collective.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub desyncs: Vec<Desync>,
    /// The collectives open now (a rank inside one, no exit yet), by rank, at their aligned
    /// sequence numbers: in a hang, who is inside which collective and who is not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub open: Vec<OpenCollective>,
    /// The newest joined collectives (at most [`TIMELINE_KEPT`]), each rank's entry and exit:
    /// the HTML report's per-rank timeline.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<JoinedCollective>,
}

/// Joined collectives the job's summary keeps for its timeline.
pub const TIMELINE_KEPT: usize = 16;

/// One collective joined across the ranks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JoinedCollective {
    pub seq: u64,
    pub group: u32,
    /// The rank the others waited for there (last to enter by more than the noise; `null`:
    /// none).
    pub waited_for: Option<u32>,
    /// Each rank's entry and exit (CLOCK_MONOTONIC ns; exit `null`: still inside), by rank.
    pub ranks: Vec<RankSpan>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankSpan {
    pub rank: u32,
    pub op: String,
    pub enter_ts: u64,
    pub exit_ts: Option<u64>,
}

/// One rank's arrivals at the joined collectives.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankArrivals {
    pub rank: u32,
    /// Collectives it entered last (by more than the noise).
    pub last: u64,
    pub last_share: f64,
    /// The time the others waited for it there, summed: its entry less the median entry of
    /// the others, ms.
    pub caused_ms: f64,
    /// Its median lateness when last, ms.
    pub median_late_ms: Option<f64>,
}

/// Ranks that disagree at one collective.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Desync {
    /// The collective, in the lowest rank's numbering on its group.
    pub seq: u64,
    pub group: u32,
    /// `op`: the ranks' ops differ there.
    pub kind: String,
    /// Each rank's op there.
    pub ops: Vec<RankOp>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankOp {
    pub rank: u32,
    pub op: String,
}

/// A collective a rank is inside now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OpenCollective {
    pub rank: u32,
    /// Aligned to the lowest rank's numbering on the group.
    pub seq: u64,
    pub group: u32,
    pub op: String,
    /// Its entry, CLOCK_MONOTONIC ns.
    pub enter_ts: u64,
}

/// How a job's straggling is spread over its steps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stragglers {
    pub class: StragglerClass,
    /// The rank: the persistent one, or the longest episode's; `null` when rotating.
    pub rank: Option<u32>,
    /// Aligned steps compared, and the share in which one rank made the others wait (its own
    /// work over the others' median by at least the straggler warning share of the step).
    pub steps: u64,
    pub slow_share: f64,
    /// Episodes: runs of slow steps with the same culprit (gaps of up to 2 steps), of at least
    /// 5 steps, in step order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub episodes: Vec<StragglerEpisode>,
    /// The others' wait the slow steps cost, in all: the sum of each slow step's excess, ms.
    pub lost_ms: f64,
    /// The class came from runs of steps with one slowest rank at 1σ of the noise (the steps
    /// over the 3σ floor made none): evidence for the class, too weak for a STRAGGLER finding.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub from_runs: bool,
}

/// Persistent (one rank most of the time), transient (an episode: one rank for a stretch), or
/// rotating (the slow rank changes every few steps: noise, or a cause the ranks share).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StragglerClass {
    Persistent,
    Transient,
    Rotating,
}

impl StragglerClass {
    pub fn as_str(self) -> &'static str {
        match self {
            StragglerClass::Persistent => "persistent",
            StragglerClass::Transient => "transient",
            StragglerClass::Rotating => "rotating",
        }
    }
}

/// One rank slow for a stretch of steps (aligned steps, from the end of the run; `from`
/// inclusive, `to` exclusive, counted in steps: decimated samples scaled by their stride).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StragglerEpisode {
    pub rank: u32,
    pub from_step: u64,
    pub to_step: u64,
    /// The others' wait it cost: the sum of its steps' excess, ms.
    pub lost_ms: f64,
}

/// A multi-rank job, as its ranks' environments describe it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobInfo {
    /// The launcher (torchrun, accelerate, deepspeed, mpirun-style) when one was found.
    pub launcher_pid: Option<u32>,
    pub world_size: Option<u32>,
    /// `TORCHELASTIC_RUN_ID`.
    pub run_id: Option<String>,
    /// `MASTER_ADDR:MASTER_PORT`.
    pub master: Option<String>,
    /// Ranks measured on this node.
    pub ranks_measured: u32,
    /// How often the elastic agent had restarted the job's ranks (the highest
    /// `TORCHELASTIC_RESTART_COUNT` of the ranks measured; absent: never). The ranks table and
    /// the job's findings are the last attempt's; each attempt's rank summaries stay in its own
    /// directory (`rank-<r>/`, then `rank-<r>-restart-<k>/`).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub restarts: u32,
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

/// One rank of a multi-rank job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankSummary {
    pub rank: u32,
    pub local_rank: Option<u32>,
    pub pid: u32,
    /// The attempt this rank process belongs to (`TORCHELASTIC_RESTART_COUNT`, 0: the first).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub restart: u32,
    pub steps: u32,
    pub step_ms: StepMs,
    /// Median and share per phase (collective_wait included).
    pub phases: Phases<PhaseStats>,
    /// The rank's own verdict (as if it ran alone).
    pub verdict: DiagnosisKind,
    /// Its Python stack when a HANG was found (outermost first), else empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stack: Vec<String>,
    /// The GPUs this rank used, as NVML saw them; absent without GPU metrics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<RankGpu>,
}

/// A rank's GPUs: those it (or its DataLoader workers) had memory on.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankGpu {
    /// NVML's indices of the GPUs (physical, not `CUDA_VISIBLE_DEVICES` ordinals).
    pub devices: Vec<u32>,
    /// Their mean utilization (NVML's: the share of time a kernel ran), percent.
    pub util_pct_mean: Option<f64>,
    /// The rank's own SM utilization on them, where the driver reports it per process.
    pub process_util_pct_mean: Option<f64>,
    /// The rank's largest device memory, summed over its GPUs.
    pub process_mem_bytes_max: Option<u64>,
}

impl RankGpu {
    /// A rank's GPUs from its summary's GPU statistics; `None` without GPU metrics or when it
    /// had memory on none.
    pub fn of(g: &super::GpuStats) -> Option<RankGpu> {
        let used: Vec<&super::GpuDeviceStats> =
            g.devices.iter().filter(|d| d.used_by_target).collect();
        if used.is_empty() {
            return None;
        }
        use crate::stats::mean;
        Some(RankGpu {
            devices: used.iter().map(|d| d.index).collect(),
            util_pct_mean: mean(used.iter().filter_map(|d| d.util_pct_mean)),
            process_util_pct_mean: mean(used.iter().filter_map(|d| d.process_util_pct_mean)),
            process_mem_bytes_max: g.process_mem_bytes_max,
        })
    }
}
