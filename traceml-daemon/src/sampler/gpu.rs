//! NVML sampling, loaded once and optional: per GPU utilization, memory, temperature, power and
//! power limit; per process GPU memory (the process list is queried every 5th tick only) and
//! per-process utilization where the driver supports it. Without a driver every GPU field of the
//! summary is null and it says "GPU metrics unavailable".
//!
//! Proven on real GPUs: not yet (no GPU on the development machines; see docs/gpu-validation.md).
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::device::UsedGpuMemory;

use crate::sample::GpuSample;

pub struct GpuSampler {
    nvml: Result<Nvml, String>,
    ticks: u64,
    /// Last per-process memory seen per GPU (refreshed every 5th tick).
    proc_mem: Vec<Option<u64>>,
    last_util_ts: u64,
}

impl GpuSampler {
    pub fn init() -> Self {
        GpuSampler {
            nvml: Nvml::init().map_err(|e| format!("NVML unavailable: {e}")),
            ticks: 0,
            proc_mem: Vec::new(),
            last_util_ts: 0,
        }
    }

    pub fn unavailable(&self) -> Option<&str> {
        self.nvml.as_ref().err().map(|s| s.as_str())
    }

    pub fn sample(&mut self, pid: u32) -> Option<Vec<GpuSample>> {
        let nvml = self.nvml.as_ref().ok()?;
        let count = nvml.device_count().ok()?;
        let refresh_procs = self.ticks.is_multiple_of(5);
        self.ticks += 1;
        self.proc_mem.resize(count as usize, None);
        let mut out = Vec::new();
        for i in 0..count {
            let Ok(dev) = nvml.device_by_index(i) else {
                continue;
            };
            let mem = dev.memory_info().ok();
            if refresh_procs {
                self.proc_mem[i as usize] = dev.running_compute_processes().ok().and_then(|ps| {
                    ps.iter()
                        .find(|p| p.pid == pid)
                        .and_then(|p| match p.used_gpu_memory {
                            UsedGpuMemory::Used(b) => Some(b),
                            UsedGpuMemory::Unavailable => None,
                        })
                });
            }
            let process_util_pct = dev
                .process_utilization_stats(self.last_util_ts)
                .ok()
                .and_then(|v| {
                    v.into_iter()
                        .filter(|s| s.pid == pid)
                        .map(|s| s.sm_util as f64)
                        .reduce(f64::max)
                });
            out.push(GpuSample {
                index: i,
                name: dev.name().ok(),
                util_pct: dev.utilization_rates().ok().map(|u| u.gpu as f64),
                mem_used_bytes: mem.as_ref().map(|m| m.used),
                mem_total_bytes: mem.as_ref().map(|m| m.total),
                temp_c: dev
                    .temperature(TemperatureSensor::Gpu)
                    .ok()
                    .map(|t| t as f64),
                power_w: dev.power_usage().ok().map(|mw| mw as f64 / 1000.0),
                power_limit_w: dev.enforced_power_limit().ok().map(|mw| mw as f64 / 1000.0),
                process_mem_bytes: self.proc_mem[i as usize],
                process_util_pct,
            });
        }
        self.last_util_ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    /// Without an NVIDIA driver NVML must fail to load, and say so, without panicking; with
    /// one (a GPU machine: `/dev/nvidiactl`) it must load and see a device.
    #[test]
    fn nvml_absent_is_reported_not_zero() {
        let mut g = super::GpuSampler::init();
        if std::path::Path::new("/dev/nvidiactl").exists() {
            assert!(g.unavailable().is_none(), "{:?}", g.unavailable());
            return;
        }
        assert!(g.unavailable().is_some());
        assert_eq!(g.sample(1), None);
    }
}
