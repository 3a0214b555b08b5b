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
    gpu: gpu::GpuSampler,
}

#[cfg(feature = "live")]
impl Sampler {
    pub fn new(pid: u32) -> Self {
        Sampler {
            pid,
            prev: None,
            gpu: gpu::GpuSampler::init(),
        }
    }

    /// Why GPU metrics are unavailable, when they are.
    pub fn gpu_unavailable(&self) -> Option<&str> {
        self.gpu.unavailable()
    }

    /// One sample; `None` for the first call (CPU percentages need two snapshots).
    pub fn tick(&mut self, ts: u64) -> Option<Sample> {
        let cur = proc::read_snapshot(self.pid, ts);
        let out = self.prev.as_ref().map(|prev| {
            let mut s = proc::to_sample(prev, &cur, proc::ticks_per_second(), proc::page_size());
            s.gpus = self.gpu.sample(self.pid);
            s
        });
        self.prev = Some(cur);
        out
    }
}
