//! Periodic samplers: /proc ([`proc`]) for the machine, the target and its DataLoader workers,
//! and NVML (`gpu`) for the GPUs. Reading is separated from computing: `proc::read_snapshot`
//! does the I/O, `proc::to_sample` is pure and tested on recorded /proc fixtures. NVML and the
//! `Sampler` that drives both belong to the live attach (`live` feature).
#[cfg(feature = "live")]
pub mod gpu;
pub mod proc;

#[cfg(feature = "live")]
use crate::sample::Sample;

/// Samples the target at a fixed cadence (the live loop calls `tick` at ≤ 2 Hz).
#[cfg(feature = "live")]
pub struct Sampler {
    pid: u32,
    prev: Option<proc::Snapshot>,
    gpu: &'static gpu::GpuMonitor,
}

#[cfg(feature = "live")]
impl Sampler {
    pub fn new(pid: u32) -> Self {
        Sampler {
            pid,
            prev: None,
            gpu: gpu::GpuMonitor::global(),
        }
    }

    /// Why GPU metrics are unavailable, when they are (NVML's init waited for up to `wait`).
    pub fn gpu_unavailable(&self, wait: std::time::Duration) -> Option<String> {
        self.gpu.unavailable(wait)
    }

    /// One sample; `None` for the first call (CPU percentages need two snapshots).
    pub fn tick(&mut self, ts: u64) -> Option<Sample> {
        let cur = proc::read_snapshot(self.pid, ts);
        let out = self.prev.as_ref().map(|prev| {
            let mut s = proc::to_sample(prev, &cur, proc::ticks_per_second(), proc::page_size());
            // The target's and its DataLoader workers' figures on each GPU (never waits on NVML).
            let pids: Vec<u32> = std::iter::once(self.pid)
                .chain(s.workers.iter().map(|w| w.pid))
                .collect();
            (s.gpus, s.gpu_note) = self.gpu.sample(&pids);
            s
        });
        self.prev = Some(cur);
        out
    }
}
