//! Periodic samples of the machine, the target, its DataLoader workers and its GPUs, as they
//! travel in the event stream. Every metric is an `Option`: never measured is `None`, never 0.
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// `CLOCK_MONOTONIC` ns.
    pub ts: u64,
    pub system: SystemSample,
    pub process: Option<ProcessSample>,
    /// Child processes of the target (DataLoader workers).
    pub workers: Vec<ProcessSample>,
    /// `None` when GPU metrics are unavailable (no NVML / no driver / no GPU).
    pub gpus: Option<Vec<GpuSample>>,
    /// What went wrong reading the GPUs, when something did: NVML slow or not answering, a GPU
    /// lost, a query the driver does not support (`sampler::gpu`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_note: Option<String>,
}

impl Sample {
    /// The target's GPU memory summed over the GPUs; `None` when no GPU reported it.
    pub fn gpu_process_mem(&self) -> Option<u64> {
        let mems: Vec<u64> = self
            .gpus
            .iter()
            .flatten()
            .filter_map(|g| g.process_mem_bytes)
            .collect();
        (!mems.is_empty()).then(|| mems.iter().sum())
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SystemSample {
    /// Busy share of all CPUs since the previous sample, 0–100.
    pub cpu_pct: Option<f64>,
    pub mem_used_bytes: Option<u64>,
    pub mem_total_bytes: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessSample {
    pub pid: u32,
    /// CPU time since the previous sample as % of one core (can exceed 100).
    pub cpu_pct_one_core: Option<f64>,
    pub rss_bytes: Option<u64>,
    pub threads: Option<u32>,
    /// Cumulative user+system CPU seconds.
    pub cpu_seconds: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuSample {
    pub index: u32,
    pub name: Option<String>,
    pub util_pct: Option<f64>,
    pub mem_used_bytes: Option<u64>,
    pub mem_total_bytes: Option<u64>,
    pub temp_c: Option<f64>,
    pub power_w: Option<f64>,
    pub power_limit_w: Option<f64>,
    /// GPU memory used by the target process (and its DataLoader workers) on this GPU; 0 when
    /// it is not among the GPU's processes.
    pub process_mem_bytes: Option<u64>,
    /// Their SM utilization on this GPU since the previous reading, where the driver supports it.
    pub process_util_pct: Option<f64>,
}
