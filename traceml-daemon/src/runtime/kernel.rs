//! What the live run holds of the kernel side: the attacher and its maps (the ring buffer, the
//! code classes, the pending counts, the loss and hit counters), read into stream items; the
//! eBPF side's log; the clock the probes stamp events with.
use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use traceml_common::CodeClass;

use crate::attach::Attacher;
use crate::event::{Class, LaunchTotals, ProbeStats};

/// `CLOCK_MONOTONIC` now, in ns: the clock `bpf_ktime_get_ns` uses.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What the live loop needs from the kernel side.
pub(super) struct Kernel {
    /// Out only while a placement runs on a blocking thread (see `Run::with_attacher`): the
    /// target's own loop awaits it, so nothing else of the run sees it missing.
    attacher: Option<Attacher>,
    /// Set by the thread detaching probes when it is done (see `target::apply`).
    pub(super) detaching: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    pub(super) ring: RingBuf<MapData>,
    pub(super) classes: BpfHashMap<MapData, u64, u32>,
    pub(super) pending: BpfHashMap<MapData, u64, traceml_common::Pending>,
    pub(super) loss: PerCpuArray<MapData, u64>,
    /// The eBPF side's rare-path log (see [`ebpf_log`]); `None` when the object has none.
    pub(super) log: Option<aya_log::EbpfLogger<EbpfLog>>,
    /// The CUDA and NCCL libraries are not probed yet: the governor watches for training
    /// markers first (a process that does not train is left alone).
    pub(super) held_back: bool,
}

impl Kernel {
    /// The live loop's side of a loaded attacher: its ring, code classes, pending counts and
    /// loss counters taken out, and its log.
    pub(super) fn from_attacher(mut attacher: Attacher, held_back: bool) -> Result<Kernel, String> {
        fn take<T>(a: &mut Attacher, name: &str) -> Result<T, String>
        where
            T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
        {
            let map = a
                .ebpf
                .take_map(name)
                .ok_or_else(|| format!("map {name} missing from the eBPF object"))?;
            T::try_from(map).map_err(|e| e.to_string())
        }
        let log = ebpf_log(&mut attacher.ebpf);
        Ok(Kernel {
            ring: take(&mut attacher, "EVENTS")?,
            classes: take(&mut attacher, "CODE_CLASS")?,
            pending: take(&mut attacher, "PENDING")?,
            loss: take(&mut attacher, "LOSS")?,
            attacher: Some(attacher),
            detaching: None,
            log,
            held_back,
        })
    }

    const OUT: &str = "the attacher is out only while its own run awaits a placement";

    pub(super) fn attacher(&self) -> &Attacher {
        self.attacher.as_ref().expect(Self::OUT)
    }

    pub(super) fn attacher_mut(&mut self) -> &mut Attacher {
        self.attacher.as_mut().expect(Self::OUT)
    }

    /// The attacher, lent to a blocking thread (`Run::with_attacher`).
    pub(super) fn lend(&mut self) -> Attacher {
        self.attacher.take().expect(Self::OUT)
    }

    /// The attacher, back from a blocking thread.
    pub(super) fn give_back(&mut self, a: Attacher) {
        self.attacher = Some(a);
    }

    /// The kernel's probe hit counters now.
    pub(super) fn probe_stats(&mut self) -> ProbeStats {
        let switching = self.switching();
        probe_stats(self.attacher(), switching)
    }

    /// A probe-set change is still being carried out by the kernel.
    pub(super) fn switching(&mut self) -> bool {
        match &self.detaching {
            Some(done) if !done.load(std::sync::atomic::Ordering::Acquire) => true,
            Some(_) => {
                self.detaching = None;
                false
            }
            None => false,
        }
    }

    /// Writes a code object's class for the kernel and ends its pending count.
    pub(super) fn publish(&mut self, code: u64, class: Class) {
        if let Err(e) = self.classes.insert(code, CodeClass::from(class) as u32, 0) {
            tracing::debug!("cannot write the class of {code:#x}: {e}");
        }
        let _ = self.pending.remove(&code);
    }
}

/// An fd that becomes readable when the kernel wakes the ring buffer's consumer.
pub(super) fn ring_readiness(
    ring: &RingBuf<MapData>,
) -> Result<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>, String> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: dup of a valid, open fd; the new fd is owned by the OwnedFd.
    let dup = unsafe { libc::dup(ring.as_raw_fd()) };
    if dup < 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!("dup of the ring buffer fd: {e}"));
    }
    // SAFETY: `dup` is a fresh fd nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(dup) };
    // SAFETY: the OwnedFd stays open, with the same fd, for the AsyncFd's whole life (it owns it).
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(|e| format!("watching the ring buffer: {e}"))
}

/// One slot of a per-CPU counter array, summed over CPUs (0 when unreadable).
pub(super) fn percpu_sum<T: std::borrow::Borrow<MapData>>(
    map: &PerCpuArray<T, u64>,
    index: u32,
) -> u64 {
    map.get(&index, 0).map(|v| v.iter().sum()).unwrap_or(0)
}

/// The kernel's probe hit counters now; `switching` while a probe-set change is under way.
pub(super) fn probe_stats(attacher: &Attacher, switching: bool) -> ProbeStats {
    use traceml_common::Stat;
    let ts = monotonic_ns();
    let mut out = ProbeStats {
        ts,
        switching,
        ..ProbeStats::default()
    };
    if let Some(m) = attacher.ebpf.map("STATS")
        && let Ok(stats) = PerCpuArray::<_, u64>::try_from(m)
    {
        let get = |s: Stat| percpu_sum(&stats, s as u32);
        out.py_enter = get(Stat::PyEnter);
        out.exit = get(Stat::Exit);
        out.call_enter = get(Stat::CallEnter);
        out.record = get(Stat::RecordEnter) + get(Stat::RecordExit);
        out.switch = get(Stat::Switch);
    }
    let t = launch_totals(attacher);
    out.launch = t.runtime + t.driver;
    out
}

/// Sums the kernel's per-CPU launch counters (indexed by path and probe id: see
/// [`traceml_common::LaunchPath`]).
pub(super) fn launch_totals(attacher: &Attacher) -> LaunchTotals {
    use traceml_common::{LAUNCH_PROBE_SLOTS, LaunchPath as K, ProbeId as P};
    let Some(m) = attacher.ebpf.map("LAUNCHES") else {
        return LaunchTotals::default();
    };
    let Ok(counters) = PerCpuArray::<_, u64>::try_from(m) else {
        return LaunchTotals::default();
    };
    let count = |path: K, probes: &[P]| {
        probes
            .iter()
            .map(|&p| percpu_sum(&counters, path as u32 * LAUNCH_PROBE_SLOTS + p as u32))
            .sum::<u64>()
    };
    let runtime = [
        P::CudaLaunchKernel,
        P::CudaLaunchKernelExC,
        P::CudaGraphLaunch,
    ];
    let driver = [
        P::CuLaunchKernel,
        P::CuLaunchKernelEx,
        P::CuLaunchCooperativeKernel,
    ];
    let (nested, library, direct) = (
        count(K::Nested, &driver),
        count(K::Library, &driver),
        count(K::Direct, &driver),
    );
    LaunchTotals {
        runtime: count(K::Runtime, &runtime),
        driver: nested + library + direct,
        nested,
        library,
        direct,
    }
}

/// Where the eBPF side's log lines go in `tracing` (`TRACEML_LOG=traceml_daemon::ebpf=debug`).
const EBPF_LOG_TARGET: &str = "traceml_daemon::ebpf";

/// Reads the eBPF side's rare-path log (aya-log's ring buffer: failed reads, full state, ring
/// buffer full; rate-limited in the kernel) into `tracing`. An object without the log map runs
/// without it.
pub(super) fn ebpf_log(ebpf: &mut aya::Ebpf) -> Option<aya_log::EbpfLogger<EbpfLog>> {
    aya_log::EbpfLogger::init_with_logger(ebpf, EbpfLog)
        .inspect_err(|e| tracing::debug!("no eBPF log: {e}"))
        .ok()
}

/// Forwards aya-log's records (through the `log` facade) to `tracing` at their level; the
/// message says which probe and what failed, with the pid and tid.
pub(super) struct EbpfLog;

impl log::Log for EbpfLog {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, r: &log::Record<'_>) {
        let msg = r.args();
        match r.level() {
            log::Level::Error => tracing::error!(target: EBPF_LOG_TARGET, "{msg}"),
            log::Level::Warn => tracing::warn!(target: EBPF_LOG_TARGET, "{msg}"),
            log::Level::Info => tracing::info!(target: EBPF_LOG_TARGET, "{msg}"),
            log::Level::Debug => tracing::debug!(target: EBPF_LOG_TARGET, "{msg}"),
            log::Level::Trace => tracing::trace!(target: EBPF_LOG_TARGET, "{msg}"),
        }
    }

    fn flush(&self) {}
}
