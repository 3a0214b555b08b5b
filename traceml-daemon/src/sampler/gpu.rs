//! NVML, read on a thread of its own (one per daemon, shared by every run it drives): per GPU
//! utilization, memory, temperature, power and power limit, the compute processes with their
//! device memory and, where the driver supports it, each process's SM utilization. The runs'
//! samplers take the latest reading without waiting ([`GpuMonitor::sample`]): an NVML call that
//! takes hundreds of milliseconds (common on a busy 8-GPU node) or never returns delays no
//! drain of the ring buffer; it is said in the sample's `gpu_note`, and a reading older than
//! [`STALE`] is not used. A lost GPU, an init failure or per-process utilization the driver does
//! not support are said the same way. Without a driver every GPU field of the summary is null
//! and it says "GPU metrics unavailable".
//!
//! Proven on the stand-in NVML of the tests (tests/README.md); on real GPUs only by the device
//! check (docs/gpu-validation.md).
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;

use crate::sample::GpuSample;

/// How often the NVML thread reads every GPU (the live loop samples at most twice a second).
pub const POLL: Duration = Duration::from_millis(500);
/// A reading older than this beyond the time the last one took is not used: the sample has no
/// GPU figures and says why (a slow NVML's readings are late by their own length; one that stops
/// answering, later and later).
pub const STALE: Duration = Duration::from_secs(3);
/// An NVML call slower than this is said in data quality (sampling goes on).
pub const SLOW_CALL: Duration = Duration::from_millis(100);
/// A call running this long is said as not answering.
pub const STUCK_CALL: Duration = Duration::from_secs(1);

/// One GPU as the NVML thread last read it.
#[derive(Clone, Debug, Default)]
struct DeviceReading {
    index: u32,
    name: Option<String>,
    util_pct: Option<f64>,
    mem_used_bytes: Option<u64>,
    mem_total_bytes: Option<u64>,
    temp_c: Option<f64>,
    power_w: Option<f64>,
    power_limit_w: Option<f64>,
    /// The compute processes on it and their device memory (`None`: NVML does not say).
    procs: Vec<(u32, Option<u64>)>,
    /// Each process's SM utilization since the previous reading, where supported.
    proc_util: Vec<(u32, f64)>,
}

/// What the NVML thread shares with the samplers.
#[derive(Default)]
struct NvmlShared {
    /// Why NVML cannot be read at all (init failed), once known.
    unavailable: Option<String>,
    /// NVML's library is there and its init failed (a driver/library mismatch, no permission):
    /// said in data quality. Without the library (a machine with no NVIDIA driver) the card's
    /// "GPU metrics unavailable" says it.
    init_failed: bool,
    /// The latest reading, when it was complete and how long it took.
    reading: Option<(Instant, Vec<DeviceReading>)>,
    reading_took: Duration,
    /// The call now running and since when.
    in_call: Option<(&'static str, Instant)>,
    /// The slowest call so far and its name.
    slowest: Option<(&'static str, Duration)>,
    /// What went wrong while reading, once each (a lost GPU, an unsupported query).
    troubles: BTreeSet<String>,
}

/// The daemon's NVML reader: a thread polling every [`POLL`], and the latest reading.
pub struct GpuMonitor {
    shared: Arc<Mutex<NvmlShared>>,
}

static MONITOR: OnceLock<GpuMonitor> = OnceLock::new();

impl GpuMonitor {
    /// The daemon's monitor, its thread started at the first call.
    pub fn global() -> &'static GpuMonitor {
        MONITOR.get_or_init(|| {
            let shared = Arc::new(Mutex::new(NvmlShared::default()));
            let s = shared.clone();
            let spawned = std::thread::Builder::new()
                .name("traceml-nvml".into())
                .spawn(move || poll_forever(&s));
            if let Err(e) = spawned {
                lock(&shared).unavailable = Some(format!("NVML thread not started: {e}"));
            }
            GpuMonitor { shared }
        })
    }

    /// Why GPU metrics are unavailable, when it is known they are. Waits up to `wait` for NVML's
    /// init to answer (the attach says it once; the loop never waits).
    pub fn unavailable(&self, wait: Duration) -> Option<String> {
        let t = Instant::now();
        loop {
            {
                let s = lock(&self.shared);
                if s.unavailable.is_some() || s.reading.is_some() || t.elapsed() >= wait {
                    return s.unavailable.clone();
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The GPUs as last read, with the figures of the processes `pids` (a rank and its
    /// DataLoader workers) on each, and a note when the reading is late, missing or partial.
    /// `None` for the GPUs when NVML is unavailable or its reading is stale. Never waits.
    pub fn sample(&self, pids: &[u32]) -> (Option<Vec<GpuSample>>, Option<String>) {
        let s = lock(&self.shared);
        let now = Instant::now();
        let mut notes: Vec<String> = s.troubles.iter().cloned().collect();
        if s.init_failed
            && let Some(why) = &s.unavailable
        {
            notes.push(why.clone());
        }
        if let Some((call, since)) = s.in_call
            && now.duration_since(since) >= STUCK_CALL
        {
            notes.push(format!(
                "NVML's {call} has not answered for {} ms",
                now.duration_since(since).as_millis()
            ));
        } else if let Some((call, d)) = s.slowest
            && d >= SLOW_CALL
        {
            notes.push(format!(
                "NVML calls took up to {} ms ({call}), read off the event loop",
                d.as_millis()
            ));
        }
        let gpus = match &s.reading {
            Some((at, devices)) if now.duration_since(*at) < STALE + s.reading_took => {
                Some(devices.iter().map(|d| for_pids(d, pids)).collect())
            }
            Some((at, _)) => {
                notes.push(format!(
                    "no NVML reading for {:.1} s: GPU figures left out",
                    now.duration_since(*at).as_secs_f64()
                ));
                None
            }
            None => None,
        };
        let note = (!notes.is_empty()).then(|| notes.join("; "));
        (gpus, note)
    }
}

/// A device reading as a sample for processes `pids`: their memory and SM utilization summed.
fn for_pids(d: &DeviceReading, pids: &[u32]) -> GpuSample {
    let mems: Vec<Option<u64>> = d
        .procs
        .iter()
        .filter(|p| pids.contains(&p.0))
        .map(|p| p.1)
        .collect();
    let utils: Vec<f64> = d
        .proc_util
        .iter()
        .filter(|p| pids.contains(&p.0))
        .map(|p| p.1)
        .collect();
    GpuSample {
        index: d.index,
        name: d.name.clone(),
        util_pct: d.util_pct,
        mem_used_bytes: d.mem_used_bytes,
        mem_total_bytes: d.mem_total_bytes,
        temp_c: d.temp_c,
        power_w: d.power_w,
        power_limit_w: d.power_limit_w,
        process_mem_bytes: if mems.is_empty() {
            // Not among the device's processes: none of its memory, when the list was read.
            Some(0).filter(|_| d.mem_used_bytes.is_some())
        } else {
            mems.iter().copied().sum::<Option<u64>>()
        },
        process_util_pct: (!utils.is_empty()).then(|| utils.iter().sum::<f64>().min(100.0)),
    }
}

fn lock(m: &Mutex<NvmlShared>) -> std::sync::MutexGuard<'_, NvmlShared> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One NVML call, timed: the samplers see it running, the slowest is kept.
fn call<T>(shared: &Mutex<NvmlShared>, name: &'static str, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    lock(shared).in_call = Some((name, t));
    let out = f();
    let d = t.elapsed();
    let mut s = lock(shared);
    s.in_call = None;
    if s.slowest.is_none_or(|(_, x)| d > x) {
        s.slowest = Some((name, d));
    }
    out
}

/// The NVML thread: init once, then read every GPU every [`POLL`].
fn poll_forever(shared: &Mutex<NvmlShared>) {
    let nvml = match call(shared, "nvmlInit", Nvml::init) {
        Ok(n) => n,
        Err(e) => {
            let why = format!("NVML unavailable: {e}");
            tracing::info!("GPU metrics unavailable: {why}");
            let mut s = lock(shared);
            s.init_failed = !matches!(e, NvmlError::LibloadingError(_));
            s.unavailable = Some(why);
            return;
        }
    };
    // Init is slow on many nodes (hundreds of ms, once): only the readings' calls count.
    lock(shared).slowest = None;
    let mut reader = NvmlReader {
        nvml: &nvml,
        shared,
        started: Instant::now(),
        per_process_util: true,
        last_seen_us: 0,
    };
    loop {
        let t = Instant::now();
        let count = match call(shared, "nvmlDeviceGetCount", || nvml.device_count()) {
            Ok(n) => n,
            Err(e) => {
                trouble(shared, format!("NVML could not count the GPUs: {e}"));
                0
            }
        };
        let devices: Vec<DeviceReading> = (0..count).filter_map(|i| reader.device(i)).collect();
        reader.last_seen_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        let mut s = lock(shared);
        s.reading = Some((Instant::now(), devices));
        s.reading_took = t.elapsed();
        drop(s);
        std::thread::sleep(POLL.saturating_sub(t.elapsed()));
    }
}

/// What the NVML thread keeps between readings.
struct NvmlReader<'a> {
    nvml: &'a Nvml,
    shared: &'a Mutex<NvmlShared>,
    started: Instant,
    /// Cleared once the driver says it does not report per-process utilization.
    per_process_util: bool,
    /// When the last reading ended, µs since the epoch (NVML's per-process samples since then).
    last_seen_us: u64,
}

impl NvmlReader<'_> {
    /// GPU `i` now; `None` when it cannot be read (lost: said once in the notes).
    fn device(&mut self, i: u32) -> Option<DeviceReading> {
        let (nvml, shared) = (self.nvml, self.shared);
        let at = self.started.elapsed().as_secs_f64();
        let dev = match call(shared, "nvmlDeviceGetHandleByIndex", || {
            nvml.device_by_index(i)
        }) {
            Ok(d) => d,
            Err(e) => {
                trouble(shared, lost_or(&e, i, at));
                return None;
            }
        };
        let mut r = DeviceReading {
            index: i,
            ..DeviceReading::default()
        };
        match call(shared, "nvmlDeviceGetUtilizationRates", || {
            dev.utilization_rates()
        }) {
            Ok(u) => r.util_pct = Some(f64::from(u.gpu)),
            Err(e @ NvmlError::GpuLost) => {
                trouble(shared, lost_or(&e, i, at));
                return None;
            }
            Err(_) => {}
        }
        r.name = call(shared, "nvmlDeviceGetName", || dev.name()).ok();
        if let Ok(m) = call(shared, "nvmlDeviceGetMemoryInfo", || dev.memory_info()) {
            r.mem_used_bytes = Some(m.used);
            r.mem_total_bytes = Some(m.total);
        }
        r.temp_c = call(shared, "nvmlDeviceGetTemperature", || {
            dev.temperature(TemperatureSensor::Gpu)
        })
        .ok()
        .map(f64::from);
        r.power_w = call(shared, "nvmlDeviceGetPowerUsage", || dev.power_usage())
            .ok()
            .map(|mw| f64::from(mw) / 1000.0);
        r.power_limit_w = call(shared, "nvmlDeviceGetEnforcedPowerLimit", || {
            dev.enforced_power_limit()
        })
        .ok()
        .map(|mw| f64::from(mw) / 1000.0);
        if let Ok(ps) = call(shared, "nvmlDeviceGetComputeRunningProcesses", || {
            dev.running_compute_processes()
        }) {
            r.procs = ps
                .iter()
                .map(|p| {
                    let mem = match p.used_gpu_memory {
                        UsedGpuMemory::Used(b) => Some(b),
                        UsedGpuMemory::Unavailable => None,
                    };
                    (p.pid, mem)
                })
                .collect();
        }
        if self.per_process_util {
            match call(shared, "nvmlDeviceGetProcessUtilization", || {
                dev.process_utilization_stats(self.last_seen_us)
            }) {
                Ok(v) => r.proc_util = v.iter().map(|s| (s.pid, f64::from(s.sm_util))).collect(),
                // No sample since the last reading: no process ran a kernel.
                Err(NvmlError::NotFound) => {}
                Err(NvmlError::NotSupported) => {
                    self.per_process_util = false;
                    trouble(
                        shared,
                        "per-process GPU utilization is not supported by this GPU or driver".into(),
                    );
                }
                Err(_) => {}
            }
        }
        Some(r)
    }
}

/// What a failed device call says: a lost GPU by name and when, else the error.
fn lost_or(e: &NvmlError, index: u32, at_s: f64) -> String {
    match e {
        NvmlError::GpuLost => {
            format!("GPU {index} lost (NVML_ERROR_GPU_IS_LOST) {at_s:.0} s into sampling")
        }
        e => format!("NVML could not read GPU {index}: {e}"),
    }
}

/// Keeps `what` once, and logs it the first time.
fn trouble(shared: &Mutex<NvmlShared>, what: String) {
    // A lost GPU is said once, at its first time (the seconds would make it new each poll).
    let key = what.split(" lost (").next().unwrap_or(&what).to_owned();
    let mut s = lock(shared);
    if s.troubles.iter().any(|t| t.starts_with(&key)) {
        return;
    }
    tracing::warn!("{what}");
    s.troubles.insert(what);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without an NVIDIA driver (unit tests never put the stand-in on the library path) NVML
    /// must fail to load, and say so, without panicking; with one (`/dev/nvidiactl`) it must
    /// load.
    #[test]
    fn nvml_absent_is_reported_not_zero() {
        let m = GpuMonitor::global();
        let why = m.unavailable(Duration::from_secs(10));
        if std::path::Path::new("/dev/nvidiactl").exists() {
            assert!(why.is_none(), "{why:?}");
            return;
        }
        assert!(why.is_some());
        assert_eq!(m.sample(&[1]).0, None);
    }

    #[test]
    fn a_reading_gives_each_process_its_own_figures() {
        let d = DeviceReading {
            index: 1,
            util_pct: Some(60.0),
            mem_used_bytes: Some(3 << 30),
            mem_total_bytes: Some(80 << 30),
            procs: vec![(10, Some(1 << 30)), (11, Some(2 << 30)), (12, None)],
            proc_util: vec![(10, 20.0), (11, 40.0)],
            ..DeviceReading::default()
        };
        let g = for_pids(&d, &[11]);
        assert_eq!(
            (g.index, g.process_mem_bytes, g.process_util_pct),
            (1, Some(2 << 30), Some(40.0))
        );
        // A rank and its worker: summed.
        let g = for_pids(&d, &[10, 11]);
        assert_eq!(g.process_mem_bytes, Some(3 << 30));
        assert_eq!(g.process_util_pct, Some(60.0));
        // Not on the device: none of its memory, no utilization sample.
        let g = for_pids(&d, &[99]);
        assert_eq!((g.process_mem_bytes, g.process_util_pct), (Some(0), None));
        // On it, memory not reported: unknown, not 0.
        assert_eq!(for_pids(&d, &[12]).process_mem_bytes, None);
    }
}
