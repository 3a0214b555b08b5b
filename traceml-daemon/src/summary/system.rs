//! The system around the steps in the summary: CUDA's calls, the host's and the process's
//! CPU, the input pipeline's workers, the GPUs and memory.
use serde::{Deserialize, Serialize};

/// Host-side CUDA activity per step (`null` when no CUDA library was probed or no steps).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CudaStats {
    /// A CUDA runtime or driver library was found and probed.
    pub measured: bool,
    pub launches_per_step: Option<f64>,
    pub h2d_bytes_per_step: Option<f64>,
    pub h2d_copies_per_step: Option<f64>,
    /// Mean bytes of one host-to-device copy (`null` without copies).
    pub h2d_bytes_per_copy: Option<f64>,
    /// Host time inside host-to-device copy calls per step.
    pub h2d_ms_per_step: Option<f64>,
    /// H2D bytes / host time inside H2D copy calls, in GB/s (10^9 bytes); `null` without copies.
    pub h2d_gb_per_s: Option<f64>,
    pub d2h_bytes_per_step: Option<f64>,
    pub d2h_copies_per_step: Option<f64>,
    pub d2h_ms_per_step: Option<f64>,
    /// Blocking syncs (stream/device/event) per step.
    pub syncs_per_step: Option<f64>,
    /// `launches_per_step` by how the launches reached the driver; absent without launches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launches_by_path: Option<LaunchesByPath>,
}

/// Launches per step by path, each launch once (they add up to `launches_per_step`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LaunchesByPath {
    /// Through a CUDA runtime entry point (`cudaLaunchKernel`…: eager torch kernels).
    pub runtime: f64,
    /// A driver entry point called by a library with its own copy of the runtime (cuBLAS,
    /// cuDNN, NCCL: `data_quality.own_runtime_libraries` names them).
    pub library: f64,
    /// A driver entry point called directly (Triton's launcher, inductor's static launcher).
    pub direct: f64,
}

impl LaunchesByPath {
    /// From per-path totals ([`crate::event::LaunchPath::COUNTED`] order) over `steps` steps;
    /// `None` without launches or steps.
    pub fn per_step(totals: [u64; 3], steps: u64) -> Option<LaunchesByPath> {
        if steps == 0 || totals == [0; 3] {
            return None;
        }
        let f = |n: u64| n as f64 / steps as f64;
        Some(LaunchesByPath {
            runtime: f(totals[0]),
            library: f(totals[1]),
            direct: f(totals[2]),
        })
    }
}

/// The machine, from the periodic samples.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SystemStats {
    /// Busy share of all CPUs, 0–100.
    pub cpu_pct_mean: Option<f64>,
    pub cpu_pct_max: Option<f64>,
    pub mem_used_bytes_mean: Option<u64>,
    pub mem_used_bytes_max: Option<u64>,
    pub mem_total_bytes: Option<u64>,
    pub num_cpus: Option<u32>,
}

/// The target process, from the periodic samples.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessStats {
    /// CPU as % of one core (can exceed 100).
    pub cpu_pct_one_core_mean: Option<f64>,
    pub cpu_pct_one_core_max: Option<f64>,
    /// CPU as % of the machine's capacity (one-core % / number of CPUs).
    pub cpu_pct_machine_mean: Option<f64>,
    pub rss_bytes_mean: Option<u64>,
    pub rss_bytes_max: Option<u64>,
    pub threads_max: Option<u32>,
    /// CPU seconds used while sampled (last cumulative value − first).
    pub cpu_seconds: Option<f64>,
}

/// Whether the DataLoader workers were busy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerState {
    /// Mean CPU of a worker ≥ 80 % of one core: decoding/transforms are the work.
    Busy,
    /// Between idle and busy.
    Moderate,
    /// Mean CPU of a worker < 30 % of one core: they wait (storage, IPC) or have nothing to do.
    Idle,
}

impl WorkerState {
    pub const BUSY_PCT: f64 = 80.0;
    pub const IDLE_PCT: f64 = 30.0;

    pub fn from_pct(pct: f64) -> WorkerState {
        if pct >= Self::BUSY_PCT {
            WorkerState::Busy
        } else if pct < Self::IDLE_PCT {
            WorkerState::Idle
        } else {
            WorkerState::Moderate
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Busy => "busy",
            WorkerState::Moderate => "moderate",
            WorkerState::Idle => "idle",
        }
    }
}

/// The target's child processes (DataLoader workers).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerStats {
    /// Most workers alive at once; `null` when the target was never sampled.
    pub count: Option<u32>,
    /// Mean over workers of each worker's mean CPU, % of one core.
    pub cpu_pct_one_core_mean: Option<f64>,
    /// The busiest worker's mean CPU, % of one core.
    pub cpu_pct_one_core_max: Option<f64>,
    pub state: Option<WorkerState>,
    /// Largest total RSS of all workers in one sample.
    pub rss_bytes_max_total: Option<u64>,
    /// What the workers did, from their Python stacks and scheduler states (absent: no worker
    /// stack was sampled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<WorkerProfile>,
}

/// The DataLoader workers' own profile: how often they were making a batch, in which state, in
/// which functions, and what a batch costs them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerProfile {
    /// Stack samples of the workers' main threads (about 10 a second each).
    pub samples: u64,
    /// Workers sampled.
    pub workers_sampled: u32,
    /// Share of the samples in which a worker was making a batch (inside the DataLoader's
    /// fetcher); in the others it waited for its next index: the loader was ahead.
    pub busy: f64,
    /// Of the busy samples: on a CPU or runnable (`R`), asleep (`S`: a lock, a queue, `sleep`, a
    /// pipe or network read), in uninterruptible I/O (`D`: disk).
    pub on_cpu: f64,
    pub blocked: f64,
    pub io: f64,
    /// What limits a busy worker: `cpu`, `wait` (asleep) or `io` (the largest of the three).
    pub bound: PipelineBound,
    /// The innermost Python functions of the busy samples, with their share of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top_functions: Vec<crate::profile::TopFunction>,
    /// Of those, the busy samples on a CPU and those asleep or in I/O.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpu_in: Vec<crate::profile::TopFunction>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocked_in: Vec<crate::profile::TopFunction>,
    /// The workers' CPU time per batch the training thread fetched, ms of one core (`null`:
    /// no fetch or no CPU reading).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_cpu_ms: Option<f64>,
    /// The hand-over: the share of the training thread's input-wait samples in which it was
    /// taking a finished batch over (reading it off the queue's pipe, unpickling it, rebuilding
    /// what it holds) rather than waiting for a worker to finish one (absent: no input-wait
    /// samples).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipc: Option<f64>,
    /// The innermost functions of those samples, with their share of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ipc_in: Vec<crate::profile::TopFunction>,
    /// The training thread's input wait split by what it waited on (absent: no input-wait
    /// samples): the hand-over (`ipc`), the rest shared out as the busy workers' states.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<PipelineSplit>,
    /// What the busy workers read while asleep or in I/O: the files (pipes, sockets) their
    /// read system calls named, most first, each with its share of those blocked samples.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reads_from: Vec<ReadShare>,
}

/// One file the workers read while blocked, and its share of their blocked busy samples.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReadShare {
    #[serde(flatten)]
    pub site: crate::event::ReadSite,
    pub share: f64,
    pub samples: u64,
}

/// The input wait by the pipeline's state, shares summing to 1: the workers on a CPU (`cpu`),
/// asleep (`blocked`), in uninterruptible I/O (`io`), or done, with the training process taking
/// the batch over (`ipc`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PipelineSplit {
    pub cpu: f64,
    pub blocked: f64,
    pub io: f64,
    pub ipc: f64,
}

/// What limits the input pipeline: a busy DataLoader worker's state, or the hand-over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PipelineBound {
    /// Running: decoding, transforms, collate.
    #[default]
    Cpu,
    /// Asleep: a lock, a queue, `sleep`, a network or pipe read.
    Wait,
    /// Uninterruptible I/O: storage.
    Io,
    /// The workers are done: most of the input wait is the training process taking their
    /// batches over (reading and unpickling them).
    Ipc,
}

impl PipelineBound {
    pub fn as_str(self) -> &'static str {
        match self {
            PipelineBound::Cpu => "cpu",
            PipelineBound::Wait => "wait",
            PipelineBound::Io => "io",
            PipelineBound::Ipc => "ipc",
        }
    }
}

/// The GPUs, from NVML. Present only when at least one sample had GPU metrics.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuStats {
    pub devices: Vec<GpuDeviceStats>,
    /// Mean utilization of the GPUs the target used (all GPUs when that is unknown).
    pub util_pct_mean: Option<f64>,
    /// Largest GPU memory of the target summed over GPUs in one sample.
    pub process_mem_bytes_max: Option<u64>,
}

/// One GPU.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuDeviceStats {
    pub index: u32,
    pub name: Option<String>,
    pub util_pct_mean: Option<f64>,
    pub util_pct_max: Option<f64>,
    pub mem_used_bytes_max: Option<u64>,
    pub mem_total_bytes: Option<u64>,
    pub temp_c_max: Option<f64>,
    pub power_w_mean: Option<f64>,
    pub power_limit_w: Option<f64>,
    pub process_mem_bytes_max: Option<u64>,
    pub process_util_pct_mean: Option<f64>,
    /// The target had memory on this GPU.
    pub used_by_target: bool,
}

/// Memory over the run, for the creep rule: the sample nearest each step's end, split into the
/// early, middle and late thirds of the steps, median of each third.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryStats {
    pub rss_bytes_by_third: Option<[u64; 3]>,
    /// GPU memory of the target summed over GPUs.
    pub gpu_process_mem_bytes_by_third: Option<[u64; 3]>,
    /// GPU memory capacity of the GPUs the target used.
    pub gpu_mem_total_bytes: Option<u64>,
    /// Memory over the run for the report's chart; `null` without samples (and in summaries
    /// written before this field).
    #[serde(default)]
    pub series: Option<MemorySeries>,
}

/// The target's memory at the periodic samples, at most [`MemorySeries::MAX`] points: a run with
/// more samples keeps, for each run of `stride` consecutive samples, the time of the first and
/// the largest value of each series (so no peak is lost).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MemorySeries {
    pub stride: u32,
    /// Seconds since attach (since the first sample when the attach time is unknown).
    pub t_s: Vec<f64>,
    /// Host RSS of the target; `null` where it was not sampled.
    pub rss_bytes: Vec<Option<u64>>,
    /// GPU memory of the target summed over GPUs; `null` where not reported (all `null` without
    /// NVML).
    pub gpu_process_mem_bytes: Vec<Option<u64>>,
}

impl MemorySeries {
    /// Most points kept.
    pub const MAX: usize = 100;
}
