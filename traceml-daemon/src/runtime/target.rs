//! The live run: check the target and our privileges, attach, then stream events until the
//! target exits or we are told to stop. Each poll drains the ring buffer, resolves new code
//! objects, notices libraries mapped since the last look (torch loads libcudart lazily) and
//! samples /proc and NVML. Everything it learns leaves as [`StreamItem`]s through one sink, so a
//! recording replays to the same summary.
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::time::Duration;

use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use traceml_common::{CodeClass, LossReason, RawEvent};

use crate::attach::memory::TargetMemory;
use crate::attach::pystack::StackReader;
use crate::attach::python::{self, CodeReader};
use crate::attach::{self, AttachError, Attacher, LoadConfig, maps};
use crate::classify::{self, RecordClass};
use crate::event::{
    self, Api, Class, CodeInfo, End, EndReason, FuncInfo, Kind, LaunchTotals, LibraryInfo, Lost,
    ProbeSet, ProbeStats, StackSample, StreamItem, TargetInfo, WorkerStackSample,
};
use crate::host::ending;
use crate::host::procinfo;
use crate::overhead::{Governor, GovernorConfig, Markers, ProbePolicy, Stage, Tick};
use crate::sampler::Sampler;
use crate::sanitize::{self, terminal};

/// Options of a live run (validated CLI).
#[derive(Clone, Debug)]
pub struct Options {
    pub pid: u32,
    /// Written once every initial probe is attached (for scripts and tests).
    pub ready_file: Option<PathBuf>,
    pub duration: Option<Duration>,
    /// Per-launch events (default) or launch counting only.
    pub launch_events: bool,
    pub ring_bytes: u32,
    pub sample_interval: Duration,
    /// How often `/proc/<pid>/maps` is re-read for new libraries (must stay under 1 s).
    pub rescan_interval: Duration,
    /// How the overhead governor may choose probes.
    pub policy: ProbePolicy,
    /// The governor's budget, a fraction of step time.
    pub overhead_budget: f64,
    /// Python stack samples of the training thread per second (0: none).
    pub stack_rate: u32,
    /// `--probe-set auto` starts by watching for training markers with torch's marker probes
    /// only (`serve`: a process found on the node may not train at all) instead of learning the
    /// loop with every probe from the attach (`--pid`: the user pointed at a training job).
    pub watch_first: bool,
    /// Ends the run when it holds a reason (a supervisor holding many targets: `serve`). With
    /// it, the run leaves SIGINT/SIGTERM/SIGHUP to the supervisor; without, it ends on them.
    pub stop: Option<tokio::sync::watch::Receiver<Option<EndReason>>>,
}

/// DataLoader workers' stacks per second each, at most (fewer when the training thread's rate
/// is lower: they are taken on its ticks).
pub const WORKER_STACK_RATE: u32 = 10;

/// Workers are sampled every this many training-thread stack ticks.
fn worker_every(stack_rate: u32) -> u64 {
    u64::from((stack_rate / WORKER_STACK_RATE).max(1))
}

impl Options {
    pub fn new(pid: u32) -> Self {
        Options {
            pid,
            ready_file: None,
            duration: None,
            launch_events: true,
            ring_bytes: 8 << 20,
            sample_interval: Duration::from_millis(500),
            rescan_interval: Duration::from_millis(250),
            policy: ProbePolicy::Auto,
            overhead_budget: 0.005,
            stack_rate: 100,
            watch_first: false,
            stop: None,
        }
    }
}

/// Why a live run could not start. Each message is one sentence for the user.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("no process with pid {0} (is it still running?)")]
    NoSuchProcess(u32),
    #[error(transparent)]
    NotPython(#[from] python::PythonError),
    #[error(
        "traceml-daemon needs root, or the capabilities CAP_SYS_ADMIN and CAP_SYS_PTRACE (kernels \
         with the 2025 uprobe fix refuse uprobes without CAP_SYS_ADMIN; see docs/privileges.md); \
         this process lacks {0}"
    )]
    Privileges(String),
    #[error("this kernel cannot run traceml-daemon: {0}")]
    Kernel(String),
    #[error(transparent)]
    Attach(#[from] AttachError),
    #[error("cannot read the target's code objects: {0}")]
    Memory(String),
    #[error("cannot write: {0}")]
    Sink(String),
}

impl LiveError {
    /// Distinct exit codes: 3 for target problems, 4 for privileges/kernel, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            LiveError::NotPython(python::PythonError::Unreadable { .. }) => 4,
            LiveError::NoSuchProcess(_) | LiveError::NotPython(_) | LiveError::Memory(_) => 3,
            LiveError::Privileges(_) | LiveError::Kernel(_) => 4,
            _ => 1,
        }
    }
}

const CAP_SYS_PTRACE: u32 = 19;
/// Covers CAP_BPF and CAP_PERFMON in the kernel (`bpf_capable`, `perfmon_capable`), and is what
/// kernels since the 2025 fix "perf: Revert to requiring CAP_SYS_ADMIN for uprobes" (6.15 and
/// stable backports) require to create a uprobe through perf_event_open.
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Checks everything that can be checked before touching the kernel.
pub fn preflight(pid: u32) -> Result<(), LiveError> {
    if pid == 0 || process_gone(pid, None) {
        return Err(LiveError::NoSuchProcess(pid));
    }
    preflight_node()
}

/// What any attach on this node needs, whatever the target: root or the capabilities, and a
/// kernel with uprobes (`serve` checks it before it serves).
pub fn preflight_node() -> Result<(), LiveError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        let eff = procinfo::own_effective_caps().unwrap_or(0);
        let has = |bit: u32| eff & (1 << bit) != 0;
        let mut missing = Vec::new();
        // CAP_SYS_ADMIN covers CAP_BPF and CAP_PERFMON, and current kernels need it for uprobes.
        // CAP_BPF + CAP_PERFMON without it still pass here: older kernels accept them, and on a
        // newer one the uprobe's EACCES names CAP_SYS_ADMIN (see `run`).
        let admin_or_pair = has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON));
        if !admin_or_pair {
            missing.push("CAP_SYS_ADMIN");
        }
        if !has(CAP_SYS_PTRACE) {
            missing.push("CAP_SYS_PTRACE");
        }
        if !missing.is_empty() {
            return Err(LiveError::Privileges(missing.join(", ")));
        }
    }
    if !Path::new("/sys/bus/event_source/devices/uprobe/type").exists() {
        return Err(LiveError::Kernel(
            "it has no uprobe support (CONFIG_UPROBE_EVENTS is off)".into(),
        ));
    }
    Ok(())
}

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

/// True when the process is gone, a zombie, or another process now holds the pid.
fn process_gone(pid: u32, start: Option<u64>) -> bool {
    match procinfo::start_state(pid) {
        None => true,
        Some((_, 'Z' | 'X' | 'x')) => true,
        Some((s, _)) => start.is_some_and(|st| st != s),
    }
}

/// What the live loop needs from the kernel side.
struct Kernel {
    attacher: Attacher,
    /// Set by the thread detaching probes when it is done (see [`apply`]).
    detaching: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    ring: RingBuf<MapData>,
    classes: BpfHashMap<MapData, u64, u32>,
    pending: BpfHashMap<MapData, u64, traceml_common::Pending>,
    loss: PerCpuArray<MapData, u64>,
    /// The eBPF side's rare-path log (see [`ebpf_log`]); `None` when the object has none.
    log: Option<aya_log::EbpfLogger<EbpfLog>>,
    /// The CUDA and NCCL libraries are not probed yet: the governor watches for training
    /// markers first (a process that does not train is left alone).
    held_back: bool,
}

impl Kernel {
    /// The kernel's probe hit counters now.
    fn probe_stats(&mut self) -> ProbeStats {
        let switching = self.switching();
        probe_stats(&self.attacher, switching)
    }

    /// A probe-set change is still being carried out by the kernel.
    fn switching(&mut self) -> bool {
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
    fn publish(&mut self, code: u64, class: Class) {
        if let Err(e) = self.classes.insert(code, CodeClass::from(class) as u32, 0) {
            tracing::debug!("cannot write the class of {code:#x}: {e}");
        }
        let _ = self.pending.remove(&code);
    }
}

/// The state of a live run.
struct Run<'a, F: FnMut(&StreamItem) -> Result<(), String>> {
    opts: &'a Options,
    sink: F,
    mem: TargetMemory,
    reader: CodeReader,
    /// Classified code objects and when their class was last written to the kernel.
    known: HashMap<u64, (Class, u64)>,
    last_seq: HashMap<u32, u64>,
    seq_gaps: u64,
    undecodable: u64,
    /// Code classes written to the kernel again (a first write did not land).
    reinserted: u64,
    /// Events of uninteresting code objects dropped before they reached the stream.
    ignored_events: u64,
    /// Drained events not yet turned into stream items.
    backlog: std::collections::VecDeque<RawEvent>,
    /// Classified code objects whose `Code` item is not in the stream yet.
    unannounced: HashMap<u64, CodeInfo>,
    python_path: PathBuf,
    python_base: Option<u64>,
    /// Each thread's `PyThreadState*`, learned from the frame-evaluator probe's events.
    tstates: HashMap<u32, u64>,
    /// Step markers decoded since the governor's last tick.
    markers: Markers,
    /// Per thread: (DataLoader records, optimizer records, backward calls) since attach, to
    /// find the training thread while running.
    thread_markers: HashMap<u32, (u64, u64, u64)>,
    stacks: Option<StackReader>,
    /// The DataLoader workers' stack readers, and the stack ticks so far (workers are sampled
    /// every [`WORKER_EVERY`]th).
    workers: super::workers::WorkerStacks,
    stack_ticks: u64,
    /// Stack sample functions named so far.
    funcs: HashMap<(std::sync::Arc<str>, std::sync::Arc<str>, u32), u32>,
    stack_errors: u64,
    /// The kernel marked the target's exec in the ring: the run is over (the loop confirms
    /// with the connector or the memory map at once, not at the next rescan).
    execed: bool,
    /// This machine's per-hit probe costs, when measured (in the stream's target item).
    calibration: Option<crate::event::Calibration>,
}

impl<F: FnMut(&StreamItem) -> Result<(), String>> Run<'_, F> {
    fn emit(&mut self, item: StreamItem) -> Result<(), LiveError> {
        (self.sink)(&item).map_err(LiveError::Sink)
    }

    /// Drains the ring buffer and classifies every new code object at once; the events then
    /// wait in `backlog` for [`Run::process`]. Until the kernel knows a class it reports only a
    /// code object's first few calls, so classification must not wait behind the processing of
    /// a large backlog (the burst of events while the target imports torch).
    /// Reads every event the ring holds into the backlog; how many.
    fn drain(&mut self, k: &mut Kernel) -> usize {
        if let Some(log) = &mut k.log {
            log.flush();
        }
        let first = self.backlog.len();
        while let Some(item) = k.ring.next() {
            if item.len() < size_of::<RawEvent>() {
                self.undecodable += 1;
                continue;
            }
            // SAFETY: the kernel wrote a `RawEvent` (size checked); read unaligned by copy.
            let raw: RawEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            self.backlog.push_back(raw);
        }
        for i in first..self.backlog.len() {
            let raw = self.backlog[i];
            if raw.kind == traceml_common::EventKind::PyEnter as u32 {
                self.tstates.insert(raw.tid, raw.args[4]);
                self.classify(k, &raw);
            } else if raw.kind == traceml_common::EventKind::Exec as u32 {
                self.execed = true;
            }
        }
        self.backlog.len() - first
    }

    fn classify(&mut self, k: &mut Kernel, raw: &RawEvent) {
        let code = raw.args[0];
        match self.known.get(&code) {
            None => {
                let info = self.resolve(code, raw.args[3]);
                self.known.insert(code, (info.class, monotonic_ns()));
                k.publish(code, info.class);
                self.unannounced.insert(code, info);
            }
            // Reported as pending after we told the kernel: the class did not reach the map
            // (full, or the write failed). Write it again.
            Some(&(class, at))
                if raw.args[1] == u64::from(CodeClass::Pending as u32) && raw.ts_ns > at =>
            {
                self.reinserted += 1;
                self.known.insert(code, (class, monotonic_ns()));
                k.publish(code, class);
            }
            Some(_) => {}
        }
    }

    /// Turns drained events into stream items (each code object's description before its first
    /// event), for at most `budget`, so the loop keeps draining, rescanning and sampling.
    fn process(&mut self, budget: Option<Duration>) -> Result<(), LiveError> {
        let start = std::time::Instant::now();
        let mut done = 0u32;
        while let Some(raw) = self.backlog.pop_front() {
            // The clock is read every 64 events only.
            done += 1;
            if done.is_multiple_of(64) && budget.is_some_and(|b| start.elapsed() >= b) {
                self.backlog.push_front(raw);
                break;
            }
            if let Some(last) = self.last_seq.insert(raw.cpu, raw.seq)
                && raw.seq > last + 1
            {
                self.seq_gaps += raw.seq - last - 1;
            }
            match event::decode(&raw) {
                Ok(ev) => {
                    let code = match ev.kind {
                        Kind::PyEnter { code, .. } | Kind::PyExit { code, .. } => Some(code),
                        _ => None,
                    };
                    // Calls the kernel reported before the class was known, of code objects
                    // that turned out uninteresting, carry nothing: keep them out of the stream
                    // (and the recording).
                    if let Some(code) = code
                        && self
                            .known
                            .get(&code)
                            .is_some_and(|&(class, _)| class == Class::Ignore)
                    {
                        self.unannounced.remove(&code);
                        self.ignored_events += 1;
                        continue;
                    }
                    if let Kind::PyEnter { code, .. } = ev.kind
                        && let Some(info) = self.unannounced.remove(&code)
                    {
                        self.emit(StreamItem::Code(Box::new(info)))?;
                    }
                    self.count_marker(ev.tid, &ev.kind);
                    self.emit(StreamItem::Event(ev))?;
                }
                Err(_) => self.undecodable += 1,
            }
        }
        Ok(())
    }

    /// Counts the step markers the governor and the stack sampler go by.
    fn count_marker(&mut self, tid: u32, kind: &Kind) {
        let t = self.thread_markers.entry(tid).or_default();
        match kind {
            Kind::RecordEnter { name } => match classify::classify_record(name) {
                Some(RecordClass::DataLoaderNext) => {
                    self.markers.dataloader += 1;
                    t.0 += 1;
                }
                Some(RecordClass::OptimizerStep) => {
                    self.markers.optimizer += 1;
                    t.1 += 1;
                }
                _ => {}
            },
            Kind::CallEnter {
                api: Api::TorchBackward,
                ..
            } => {
                self.markers.backward += 1;
                t.2 += 1;
            }
            _ => {}
        }
    }

    /// The thread that looks like the training thread so far, as the engine decides it: the one
    /// that runs the most optimizer steps and backward passes (a feeder thread iterating the
    /// DataLoader into a queue runs none), then the most DataLoader records; with its
    /// `PyThreadState*` when known.
    fn training_thread(&self) -> Option<(u32, Option<u64>)> {
        self.thread_markers
            .iter()
            .filter(|(_, m)| **m != (0, 0, 0))
            .max_by_key(|(tid, m)| (m.1 + m.2, m.0, std::cmp::Reverse(**tid)))
            .map(|(&tid, _)| (tid, self.tstates.get(&tid).copied()))
    }

    /// Samples the training thread's Python stack (one `process_vm_readv` per frame).
    fn sample_stack(&mut self) -> Result<(), LiveError> {
        let Some((tid, Some(tstate))) = self.training_thread() else {
            return Ok(());
        };
        let Some(reader) = self.stacks.as_mut() else {
            return Ok(());
        };
        let ts = monotonic_ns();
        let stack = match reader.read(&self.mem, tstate) {
            Ok(s) => s,
            Err(e) => {
                // The target runs on while we read: a torn read is expected now and then.
                self.stack_errors += 1;
                tracing::debug!("stack sample of thread {tid}: {e}");
                return Ok(());
            }
        };
        let lines = stack.lines.iter().map(|l| l.unwrap_or(0)).collect();
        let frames = self.intern(stack)?;
        self.emit(StreamItem::Stack(Box::new(StackSample {
            ts,
            tid,
            frames,
            lines,
        })))
    }

    /// The frames of `stack` as function ids, naming each new function in the stream first.
    fn intern(&mut self, stack: crate::attach::pystack::Stack) -> Result<Vec<u32>, LiveError> {
        let mut frames = Vec::with_capacity(stack.frames.len());
        for f in stack.frames {
            let key = (f.function, f.file, f.line);
            let next = self.funcs.len() as u32;
            let id = match self.funcs.get(&key) {
                Some(&id) => id,
                None => {
                    self.funcs.insert(key.clone(), next);
                    self.emit(StreamItem::Func(Box::new(FuncInfo {
                        id: next,
                        function: key.0.to_string(),
                        file: key.1.to_string(),
                        line: key.2,
                    })))?;
                    next
                }
            };
            frames.push(id);
        }
        Ok(frames)
    }

    /// Samples each DataLoader worker's Python stack (see [`super::workers`]).
    fn sample_workers(&mut self) -> Result<(), LiveError> {
        let ts = monotonic_ns();
        for w in self.workers.sample(self.opts.pid) {
            let frames = self.intern(w.stack)?;
            self.emit(StreamItem::WorkerStack(Box::new(WorkerStackSample {
                ts,
                pid: w.pid,
                state: w.state,
                frames,
                reading: w.reading,
            })))?;
        }
        Ok(())
    }

    /// Reads and classifies the code object at `address`, known to events as `id`.
    fn resolve(&self, id: u64, address: u64) -> CodeInfo {
        let (qualname, filename, class) = match self.reader.read(&self.mem, address) {
            Ok(Some(names)) => {
                let class = classify::classify(&names.qualname, &names.filename);
                (names.qualname, names.filename, class)
            }
            Ok(None) => ("<not a code object>".into(), String::new(), Class::Ignore),
            Err(e) => {
                tracing::debug!("code object {address:#x}: {e}");
                ("<unreadable>".into(), String::new(), Class::Ignore)
            }
        };
        CodeInfo {
            ptr: id,
            address,
            qualname,
            filename,
            class,
        }
    }

    /// Attaches to every interesting file mapped since the last scan.
    fn rescan(&mut self, k: &mut Kernel, mappings: &[maps::Mapping]) -> Result<(), LiveError> {
        for (path, role) in to_probe(&k.attacher, mappings, k.held_back) {
            let report = k.attacher.attach_file(&path, role)?;
            self.probed(Probed {
                path,
                role,
                report,
                ts: monotonic_ns(),
            })?;
        }
        Ok(())
    }

    /// Puts a probed file in the stream: its failed probes, and the library with its probes.
    fn probed(&mut self, p: Probed) -> Result<(), LiveError> {
        for f in p.report.failures {
            tracing::warn!(
                "probe {} in {} not attached: {}",
                f.probe,
                terminal(&f.file),
                terminal(&f.reason)
            );
            self.emit(StreamItem::ProbeFailed(Box::new(f)))?;
        }
        if !p.report.attached.is_empty() || p.role != maps::Role::Torch {
            tracing::info!(
                "probing {} ({}): {} probes",
                terminal(&p.path.display().to_string()),
                p.role.name(),
                p.report.attached.len()
            );
            self.emit(StreamItem::Library(Box::new(LibraryInfo {
                path: p.path.display().to_string(),
                role: p.role.name().into(),
                probes: p.report.attached,
                ts: p.ts,
            })))?;
        }
        Ok(())
    }

    /// The rescan: the maps first, then the process's state (see [`crate::host::ending`]: a
    /// process tearing down its memory on exit is not an exec); libraries mapped since the
    /// last look are probed and changed loss counters reported. `Some` when the run is over.
    fn look(
        &mut self,
        k: &mut Kernel,
        watch: &mut ending::Watch,
        last_lost: &mut Lost,
    ) -> Result<Option<EndReason>, LiveError> {
        let mappings = maps::read(self.opts.pid).ok();
        let base = mappings
            .as_ref()
            .map(|m| maps::base_of(m, &self.python_path));
        if let Some(reason) = watch.check(base) {
            return Ok(Some(reason));
        }
        if let Some(mappings) = mappings {
            self.rescan(k, &mappings)?;
        }
        let lost = self.lost(k);
        if lost != *last_lost {
            self.emit(StreamItem::Lost(lost.clone()))?;
            *last_lost = lost;
        }
        Ok(None)
    }

    /// The governor's look: markers brought up to date (they are counted as events are
    /// processed), the counters in the stream, and its decision carried out.
    fn govern(&mut self, k: &mut Kernel, governor: &mut Governor) -> Result<(), LiveError> {
        self.drain(k);
        self.process(Some(Duration::from_millis(20)))?;
        let stats = k.probe_stats();
        self.emit(StreamItem::ProbeStats(stats))?;
        let tick = Tick {
            now: stats.ts,
            stats,
            markers: std::mem::take(&mut self.markers),
            stacks_ready: self.stacks.is_none()
                || self.training_thread().is_some_and(|(_, t)| t.is_some()),
            cpu_ns: procinfo::cpu_ns(self.opts.pid),
        };
        if let Some(d) = governor.tick(tick) {
            apply(self, k, d)?;
        }
        Ok(())
    }

    fn lost(&self, k: &Kernel) -> Lost {
        let count = |r: LossReason| percpu_sum(&k.loss, r as u32);
        let ring_full = count(LossReason::RingFull);
        let off_cpu_ring_full = count(LossReason::OffCpuRingFull);
        Lost {
            ring_full,
            read_failed: count(LossReason::ReadFailed),
            state_full: count(LossReason::StateFull) + count(LossReason::DepthLimit),
            undecodable: self.undecodable,
            seq_gaps: self.seq_gaps.saturating_sub(ring_full + off_cpu_ring_full),
            off_cpu_ring_full,
        }
    }
}

/// An fd that becomes readable when the kernel wakes the ring buffer's consumer.
fn ring_readiness(
    ring: &RingBuf<MapData>,
) -> Result<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>, LiveError> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: dup of a valid, open fd; the new fd is owned by the OwnedFd.
    let dup = unsafe { libc::dup(ring.as_raw_fd()) };
    if dup < 0 {
        let e = std::io::Error::last_os_error();
        return Err(LiveError::Kernel(format!("dup of the ring buffer fd: {e}")));
    }
    // SAFETY: `dup` is a fresh fd nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(dup) };
    // SAFETY: the OwnedFd stays open, with the same fd, for the AsyncFd's whole life (it owns it).
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(|e| LiveError::Kernel(format!("watching the ring buffer: {e}")))
}

/// One slot of a per-CPU counter array, summed over CPUs (0 when unreadable).
fn percpu_sum<T: std::borrow::Borrow<MapData>>(map: &PerCpuArray<T, u64>, index: u32) -> u64 {
    map.get(&index, 0).map(|v| v.iter().sum()).unwrap_or(0)
}

/// The kernel's probe hit counters now; `switching` while a probe-set change is under way.
fn probe_stats(attacher: &Attacher, switching: bool) -> ProbeStats {
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

/// Sums the kernel's per-CPU launch counters (indexed by probe id).
fn launch_totals(attacher: &Attacher) -> LaunchTotals {
    use traceml_common::ProbeId as P;
    let Some(m) = attacher.ebpf.map("LAUNCHES") else {
        return LaunchTotals::default();
    };
    let Ok(counters) = PerCpuArray::<_, u64>::try_from(m) else {
        return LaunchTotals::default();
    };
    let count = |p: P| percpu_sum(&counters, p as u32);
    LaunchTotals {
        runtime: count(P::CudaLaunchKernel)
            + count(P::CudaLaunchKernelExC)
            + count(P::CudaGraphLaunch),
        driver: count(P::CuLaunchKernel) + count(P::CuLaunchKernelEx),
    }
}

/// A file probed, as the stream reports it.
struct Probed {
    path: PathBuf,
    role: maps::Role,
    report: attach::FileReport,
    ts: u64,
}

/// The files of `mappings` to probe now: those with a role, not Python's (probed first, on its
/// own), not probed yet, and only torch's while the other libraries are held back.
fn to_probe(
    attacher: &Attacher,
    mappings: &[maps::Mapping],
    held_back: bool,
) -> Vec<(PathBuf, maps::Role)> {
    maps::files(mappings)
        .into_iter()
        .filter_map(|path| Some((maps::role_of(&path)?, path)))
        .filter(|(role, path)| *role != maps::Role::Python && !attacher.has_file(path))
        .filter(|(role, _)| !held_back || *role == maps::Role::Torch)
        .map(|(role, path)| (path, role))
        .collect()
}

/// The kernel side of a target, attached: its programs loaded and its probes placed in Python
/// and the libraries mapped now; what was placed, and when the first probe went in.
struct Loaded {
    kernel: Kernel,
    mem: TargetMemory,
    reader: CodeReader,
    probed: Vec<Probed>,
    attach_ts: u64,
    /// This machine's per-hit probe costs, when measured.
    calibration: Option<crate::event::Calibration>,
}

/// Reads the target's code object layout, loads the eBPF programs for it and places the probes,
/// on a blocking thread: the verifier and the uprobe registrations are the long part of an
/// attach, and the ranks of a job (the targets of a node) go through them in parallel.
async fn load(
    opts: &Options,
    py: &python::PythonTarget,
    mappings: &[maps::Mapping],
) -> Result<Loaded, LiveError> {
    let pid = opts.pid;
    // The code object layout is read from the target first: the kernel side needs co_name's
    // offset for code identities.
    let mem = TargetMemory::new(pid);
    let offsets = python::code_offsets(&mem, py.code_type_addr)
        .map_err(|e| LiveError::Memory(e.to_string()))?;
    let reader = CodeReader {
        layout: py.layout,
        offsets,
        code_type_addr: py.code_type_addr,
    };
    let cfg = LoadConfig {
        frame_code_offset: py.layout.code_offset,
        code_ptr_mask: py.layout.code_mask,
        code_name_offset: offsets.name,
        launch_events: opts.launch_events,
        ring_bytes: opts.ring_bytes,
    };
    let pid_nz = NonZeroU32::new(pid).ok_or(LiveError::NoSuchProcess(pid))?;
    // Armed at attach only where the governor starts with it (`--probe-set full`).
    let arm = Governor::initial(opts.policy, opts.watch_first);
    let held_back = Governor::defers_libraries(opts.policy, opts.watch_first);
    let (py_path, mappings) = (py.path.clone(), mappings.to_vec());
    let loaded = tokio::task::spawn_blocking(move || {
        // This machine's per-hit costs (cached after the first daemon), before any probe is in
        // the target: the estimate and the governor's budget are of this machine.
        let calibration = super::calibration::this_machine();
        let mut a = Attacher::load(pid_nz, cfg)?;
        a.set_arm_python_at_attach(arm);
        let attach_ts = monotonic_ns();
        // The libraries first, Python last: an armed frame-evaluator probe fires on every
        // Python call of the target (a quarter of a HF Trainer's step), and placing the
        // libraries' probes takes up to a second; the learning starts once everything is in.
        let mut probed = vec![];
        for (path, role) in to_probe(&a, &mappings, held_back) {
            let report = a.attach_file(&path, role)?;
            probed.push(Probed {
                path,
                role,
                report,
                ts: monotonic_ns(),
            });
        }
        let report = a.attach_file(&py_path, maps::Role::Python)?;
        // Without Python's probe the attach fails (the caller says why).
        probed.insert(
            0,
            Probed {
                path: py_path,
                role: maps::Role::Python,
                report,
                ts: monotonic_ns(),
            },
        );
        Ok::<_, AttachError>((a, probed, attach_ts, calibration))
    })
    .await
    .map_err(|e| LiveError::Kernel(format!("loading the eBPF programs: {e}")))?;
    let (mut attacher, probed, attach_ts, calibration) = match loaded {
        Ok(l) => l,
        Err(e) => {
            let msg = attach::error_chain(&e);
            if msg.contains("Operation not permitted") {
                return Err(LiveError::Privileges(format!(
                    "the permission to load eBPF programs ({msg})"
                )));
            }
            return Err(e.into());
        }
    };
    let log = ebpf_log(&mut attacher.ebpf);
    let take = |a: &mut Attacher, name: &str| {
        a.ebpf
            .take_map(name)
            .ok_or_else(|| LiveError::Kernel(format!("map {name} missing from the eBPF object")))
    };
    let ring = RingBuf::try_from(take(&mut attacher, "EVENTS")?)
        .map_err(|e| LiveError::Kernel(e.to_string()))?;
    let classes = BpfHashMap::try_from(take(&mut attacher, "CODE_CLASS")?)
        .map_err(|e| LiveError::Kernel(e.to_string()))?;
    let loss = PerCpuArray::try_from(take(&mut attacher, "LOSS")?)
        .map_err(|e| LiveError::Kernel(e.to_string()))?;
    let pending = BpfHashMap::try_from(take(&mut attacher, "PENDING")?)
        .map_err(|e| LiveError::Kernel(e.to_string()))?;
    let kernel = Kernel {
        attacher,
        detaching: None,
        ring,
        classes,
        pending,
        loss,
        log,
        held_back: Governor::defers_libraries(opts.policy, opts.watch_first),
    };
    Ok(Loaded {
        kernel,
        mem,
        reader,
        probed,
        attach_ts,
        calibration,
    })
}

/// Attaches to `opts.pid` and streams until the run ends; every item goes to `sink`.
pub async fn run(
    opts: &Options,
    sink: impl FnMut(&StreamItem) -> Result<(), String>,
) -> Result<EndReason, LiveError> {
    preflight(opts.pid)?;
    let pid = opts.pid;
    let start = procinfo::start_state(pid).map(|(s, _)| s);
    let mappings = maps::read(pid).map_err(|_| LiveError::NoSuchProcess(pid))?;
    let py = python::find(pid, &mappings)?;
    tracing::info!(
        "target {pid}: Python {} in {}",
        py.version,
        terminal(&py.path.display().to_string())
    );
    let t0 = std::time::Instant::now();
    let Loaded {
        kernel: mut k,
        mem,
        reader,
        probed,
        attach_ts,
        calibration,
    } = load(opts, &py, &mappings).await?;
    let mut run = Run {
        opts,
        sink,
        mem,
        reader,
        known: HashMap::new(),
        last_seq: HashMap::new(),
        seq_gaps: 0,
        undecodable: 0,
        reinserted: 0,
        ignored_events: 0,
        backlog: std::collections::VecDeque::new(),
        unannounced: HashMap::new(),
        python_path: py.path.clone(),
        python_base: maps::base_of(&mappings, &py.path),
        tstates: HashMap::new(),
        markers: Markers::default(),
        thread_markers: HashMap::new(),
        stacks: None,
        workers: Default::default(),
        stack_ticks: 0,
        funcs: HashMap::new(),
        stack_errors: 0,
        execed: false,
        calibration,
    };
    if opts.stack_rate > 0 {
        match StackReader::from_target(&py, &run.mem) {
            Ok(r) => run.stacks = Some(r),
            Err(e) => tracing::warn!("no Python stack samples: {e}"),
        }
    }
    run.emit(StreamItem::Target(Box::new(TargetInfo {
        pid,
        comm: procinfo::comm(pid)
            .map(|b| sanitize::comm(&b))
            .unwrap_or_default(),
        cmdline: procinfo::cmdline(pid)
            .map(|b| sanitize::cmdline(&b))
            .unwrap_or_default(),
        python_version: Some(py.version.to_string()),
        python_elf: Some(py.path.display().to_string()),
        attach_ts_ns: attach_ts,
        attach_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0),
        num_cpus: std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1),
        mem_total_bytes: procinfo::mem_total_bytes(),
        hostname: procinfo::hostname(),
        daemon_version: env!("CARGO_PKG_VERSION").into(),
        launch_count_only: !opts.launch_events,
        overhead_budget_pct: Some(opts.overhead_budget * 100.0),
        identity: Some(crate::host::identity::of(pid)),
        calibration: run.calibration,
    })))?;

    let report = &probed[0].report;
    if report.attached.is_empty() {
        let reason = report
            .failures
            .first()
            .map(|f| f.reason.clone())
            .unwrap_or_default();
        // EACCES from perf_event_open without root: the kernel wants CAP_SYS_ADMIN for uprobes.
        // SAFETY: geteuid has no preconditions.
        if reason.contains("Permission denied") && unsafe { libc::geteuid() } != 0 {
            return Err(LiveError::Privileges(format!(
                "CAP_SYS_ADMIN, which this kernel requires to create uprobes (probing {}: {reason})",
                python::EVAL_SYMBOL
            )));
        }
        return Err(LiveError::Kernel(format!(
            "cannot probe {} in {}: {reason}",
            python::EVAL_SYMBOL,
            py.path.display()
        )));
    }
    for p in probed {
        run.probed(p)?;
    }
    // Every probe is in from here: the attach's probe set is stamped now, before the ready file
    // lets a waiting workload start (the engine drops marks from before it as the attach's
    // fragment).
    let armed_at = monotonic_ns();
    if let Some(f) = &opts.ready_file {
        std::fs::write(f, "attached\n")
            .map_err(|e| LiveError::Sink(format!("{}: {e}", f.display())))?;
    }
    tracing::info!(
        "attached to {pid} in {:.0} ms",
        t0.elapsed().as_secs_f64() * 1e3
    );
    let (mut sampler, mut governor) = start_governing(&mut run, &mut k, armed_at)?;
    // Subscribed before the loop: the target's exit or exec is reported while it happens.
    let mut watch = ending::Watch::new(pid, start, run.python_base);
    let reason = event_loop(&mut run, &mut k, &mut sampler, &mut governor, &mut watch).await?;
    finish(run, k, watch, reason)
}

/// The samplers and the governor, started; the first counters and probe set (stamped
/// `armed_at`, when the last probe went in) in the stream.
fn start_governing<F: FnMut(&StreamItem) -> Result<(), String>>(
    run: &mut Run<'_, F>,
    k: &mut Kernel,
    armed_at: u64,
) -> Result<(Sampler, Governor), LiveError> {
    let opts = run.opts;
    let pid = opts.pid;
    let mut sampler = Sampler::new(pid);
    if let Some(why) = sampler.gpu_unavailable() {
        tracing::info!("GPU metrics unavailable: {why}");
    }
    let _ = sampler.tick(monotonic_ns());
    let python = Governor::initial(opts.policy, opts.watch_first);
    let governor = Governor::new(
        GovernorConfig {
            costs: crate::overhead::CostModel::for_machine(run.calibration.as_ref()),
            ..GovernorConfig::new(opts.policy, opts.overhead_budget)
        },
        monotonic_ns(),
        opts.launch_events,
        opts.watch_first,
    );
    run.emit(StreamItem::ProbeStats(k.probe_stats()))?;
    run.emit(StreamItem::ProbeSet(Box::new(ProbeSet {
        ts: armed_at,
        python,
        launch_events: opts.launch_events,
        reason: match opts.policy {
            ProbePolicy::Auto if opts.watch_first => {
                "attach: torch's markers only, watching for training (a DataLoader iteration, \
                 an optimizer step or a backward pass)"
                    .into()
            }
            ProbePolicy::Auto => "attach: every probe, to learn the loop (10 s at most)".into(),
            ProbePolicy::Full => "--probe-set full: every probe for the whole run".into(),
            ProbePolicy::Markers => "--probe-set markers: no frame-evaluator probe".into(),
        },
        watching: k.held_back,
        python_steady: false,
    })))?;
    Ok((sampler, governor))
}

/// The run's end: the last events drained, the final counters and the end in the stream, and
/// the probes taken out off the path to the verdict.
fn finish<F: FnMut(&StreamItem) -> Result<(), String>>(
    mut run: Run<'_, F>,
    mut k: Kernel,
    mut watch: ending::Watch,
    reason: EndReason,
) -> Result<EndReason, LiveError> {
    let pid = run.opts.pid;
    // Final drain: what the kernel wrote before we stopped.
    run.drain(&mut k);
    run.process(None)?;
    if tracing::enabled!(tracing::Level::DEBUG) {
        if let Some(m) = k.attacher.ebpf.map("STATS")
            && let Ok(stats) = PerCpuArray::<_, u64>::try_from(m)
        {
            let v: Vec<u64> = (0..traceml_common::STATS_LEN)
                .map(|i| percpu_sum(&stats, i))
                .collect();
            tracing::debug!(
                "probe stats [py_enter, ignored, pending capped, call_enter, exit]: {v:?}"
            );
        }
        if let Some(m) = k.attacher.ebpf.map("THREADS")
            && let Ok(threads) = BpfHashMap::<_, u32, traceml_common::ThreadState>::try_from(m)
        {
            for (tid, st) in threads.iter().flatten() {
                tracing::debug!(
                    "thread {tid}: {} open calls, {} overflowed, sp {:x?}",
                    st.len,
                    st.overflow,
                    &st.entry_sp[..(st.len as usize).min(traceml_common::TRACK_STACK)]
                );
            }
        }
    }
    tracing::info!(
        "{} calls of uninteresting code objects reported before classification were dropped",
        run.ignored_events
    );
    if run.reinserted > 0 {
        tracing::info!(
            "{} code classes written to the kernel again",
            run.reinserted
        );
    }
    run.emit(StreamItem::ProbeStats(k.probe_stats()))?;
    if run.stack_errors > 0 {
        tracing::info!("{} stack samples could not be read", run.stack_errors);
    }
    run.emit(StreamItem::LaunchTotals(launch_totals(&k.attacher)))?;
    let lost = run.lost(&k);
    run.emit(StreamItem::Lost(lost))?;
    run.emit(StreamItem::End(End {
        ts: monotonic_ns(),
        reason,
        target: watch.take_end().map(Box::new),
    }))?;
    // Taking the probes out costs the kernel one RCU-tasks-trace grace period per link: ~35 ms
    // per `uprobe_multi` link (one per program and file, about ten for a torch target; links
    // of several targets taken out from several threads share them), but ~130 ms per
    // perf-event link, one after another whichever thread drops them (released under the
    // kernel's `event_mutex`), on kernels without uprobe_multi: ~5 s for the ~40 links of a
    // torch target. Off the path to the verdict: the summary is written meanwhile, and the
    // kernel releases whatever is left when the daemon exits (which then waits for it).
    let links = k.attacher.link_count();
    attach::release::in_background(move || {
        let t0 = std::time::Instant::now();
        match k.attacher.take_links() {
            Ok(l) => attach::release(l),
            Err(e) => tracing::warn!("target {pid}: probes left to the attacher's drop: {e}"),
        }
        drop(k);
        tracing::info!(
            "target {pid}: probes detached ({links} links) in {} ms",
            t0.elapsed().as_millis()
        );
    });
    Ok(reason)
}

/// Waits until every probe is out of its targets, [`DETACH_WAIT`] at most (see
/// [`attach::release`]); says what is left to the kernel.
pub fn wait_detached() {
    let left = attach::release::wait(DETACH_WAIT);
    if left > 0 {
        tracing::warn!(
            "{left} threads still taking probes out after {} s: the kernel holds the links' \
             release while a process that exec'd with return probes pending lives (it releases \
             them when that process exits, and this exit waits for it)",
            DETACH_WAIT.as_secs()
        );
    }
}

/// How long the daemon's exit waits for the probes it took out.
const DETACH_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The next delivery of a signal the run listens to; never, when it does not.
async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
    match s {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// The reason the supervisor gives to stop; never, without a supervisor (or once it is gone).
async fn stopped(stop: &mut Option<tokio::sync::watch::Receiver<Option<EndReason>>>) -> EndReason {
    let Some(rx) = stop else {
        return std::future::pending().await;
    };
    match rx.wait_for(|r| r.is_some()).await {
        Ok(r) => (*r).unwrap_or(EndReason::Terminated),
        // The supervisor dropped its end: it is going away.
        Err(_) => EndReason::Terminated,
    }
}

/// Carries out a governor decision and records it in the stream.
fn apply<F: FnMut(&StreamItem) -> Result<(), String>>(
    run: &mut Run<'_, F>,
    k: &mut Kernel,
    d: crate::overhead::ProbeDecision,
) -> Result<(), LiveError> {
    let mut reason = d.reason;
    if d.attach_all && k.held_back {
        // The libraries held back while watching, before the frame evaluator is armed: the
        // first steps learned see their copies and launches.
        k.held_back = false;
        if let Ok(mappings) = maps::read(run.opts.pid) {
            run.rescan(k, &mappings)?;
        }
    }
    let switched = if d.python {
        k.attacher.arm_python()
    } else {
        k.attacher.take_python().map(|links| {
            // The kernel unregisters each link after an RCU grace period (tens of ms, up to
            // seconds under load): off the event loop, which keeps draining meanwhile.
            let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            k.detaching = Some(done.clone());
            attach::release::in_background(move || {
                let t0 = std::time::Instant::now();
                let n = links.len();
                // One after another, entry first (see `Attacher::take_python`).
                for l in links {
                    drop(l);
                }
                tracing::info!(
                    "frame-evaluator probe unregistered ({n} links) in {} ms",
                    t0.elapsed().as_millis()
                );
                done.store(true, std::sync::atomic::Ordering::Release);
            });
        })
    };
    if let Err(e) = switched {
        tracing::warn!("cannot switch the frame-evaluator probe: {e}");
        reason.push_str(&format!(" (failed: {e})"));
    }
    if let Err(e) = k.attacher.set_launch_events(d.launch_events) {
        tracing::warn!("cannot switch the launch mode: {e}");
    }
    tracing::info!("probe set: {reason}");
    run.emit(StreamItem::ProbeSet(Box::new(ProbeSet {
        ts: monotonic_ns(),
        python: k.attacher.python_armed(),
        launch_events: d.launch_events,
        reason,
        watching: k.held_back,
        python_steady: d.python_steady && k.attacher.python_armed(),
    })))
}

/// SIGINT, SIGTERM and SIGHUP: a run of its own ends on them; a supervised run (`stop` set)
/// leaves them to its supervisor and gets none.
fn own_signals(opts: &Options) -> Result<[Option<tokio::signal::unix::Signal>; 3], LiveError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut out = [None, None, None];
    if opts.stop.is_none() {
        let kinds = [
            SignalKind::interrupt(),
            SignalKind::terminate(),
            SignalKind::hangup(),
        ];
        for (slot, kind) in out.iter_mut().zip(kinds) {
            *slot = Some(signal(kind).map_err(|e| LiveError::Kernel(e.to_string()))?);
        }
    }
    Ok(out)
}

async fn event_loop<F: FnMut(&StreamItem) -> Result<(), String>>(
    run: &mut Run<'_, F>,
    k: &mut Kernel,
    sampler: &mut Sampler,
    governor: &mut Governor,
    watch: &mut ending::Watch,
) -> Result<EndReason, LiveError> {
    use tokio::time::{MissedTickBehavior, interval, interval_at};
    let pid = run.opts.pid;
    // The ring is polled every 10 ms while events flow fast, every 50 ms while they trickle
    // (a plain loop after the frame-evaluator probe's detach: tens of events per step): at
    // the slow pace a drain that finds more than 1/256 of the ring (with the default 8 MiB,
    // ~400 events: a rate over 8,000 events/s) goes back to 10 ms; a burst would have to
    // exceed 256 times that rate within 50 ms to fill the ring. Most of an idle daemon's
    // wake-ups were these polls.
    let ring_events = run.opts.ring_bytes as usize / size_of::<RawEvent>();
    let (poll_fast, poll_slow) = (Duration::from_millis(10), Duration::from_millis(50));
    let poll = tokio::time::sleep(poll_fast);
    tokio::pin!(poll);
    // /proc/<pid>/maps of a torch process is thousands of lines: read every `rescan_interval`
    // for the first 10 s (libraries loaded at start-up: CUDA is initialised lazily), then every
    // second (a library loaded later, NCCL at the first collective, is probed within 1 s).
    let mut rescan = interval(run.opts.rescan_interval);
    let rescan_started = tokio::time::Instant::now();
    let mut rescan_slow = false;
    let mut sample = interval(run.opts.sample_interval);
    // The governor looks once a second, every 250 ms while it learns the loop with every probe
    // (the costly set: it is left as soon as the markers carry the steps) or watches for the
    // first training marker (to place the other probes within a step or two).
    // While learning, every Python call pays the frame-evaluator probe: look often, to end it
    // as soon as the loop is known. While watching (no probe hit), start within a second.
    let govern_every = |stage: Stage| {
        Duration::from_millis(match stage {
            Stage::Learning => 50,
            Stage::Watching => 250,
            Stage::Steady => 1000,
        })
    };

    let mut govern_stage = governor.stage();
    let mut govern = interval(govern_every(govern_stage));
    let mut stack = interval(Duration::from_secs(1) / run.opts.stack_rate.max(1));
    for i in [&mut rescan, &mut sample, &mut govern, &mut stack] {
        i.set_missed_tick_behavior(MissedTickBehavior::Delay);
    }
    // Readiness of the ring buffer (a duplicate of its fd: the `RingBuf` itself is drained
    // through `k`). The kernel wakes us for events of unclassified code objects only; the rest
    // waits for the 10 ms poll.
    let ready = ring_readiness(&k.ring)?;
    let [mut sigint, mut sigterm, mut sighup] = own_signals(run.opts)?;
    let mut stop = run.opts.stop.clone();
    let deadline = run.opts.duration.map(|d| tokio::time::Instant::now() + d);
    let mut last_lost = Lost::default();
    loop {
        tokio::select! {
            _ = &mut poll => {
                let n = run.drain(k);
                run.process(Some(Duration::from_millis(20)))?;
                let every = if n > ring_events / 256 { poll_fast } else { poll_slow };
                poll.as_mut().reset(tokio::time::Instant::now() + every);
            }
            guard = ready.readable() => {
                if let Ok(mut guard) = guard {
                    guard.clear_ready();
                }
                run.drain(k);
            }
            // The exec is in the stream (the engine ends the trace there): the run is over.
            _ = std::future::ready(()), if run.execed => {
                watch.mark_exec();
                let mappings = maps::read(pid).ok();
                let base = mappings.as_ref().map(|m| maps::base_of(m, &run.python_path));
                if let Some(reason) = watch.check(base) {
                    return Ok(reason);
                }
                // Exiting already: its status is on the way; look again shortly.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            _ = rescan.tick() => {
                if !rescan_slow && rescan_started.elapsed() >= Duration::from_secs(10) {
                    rescan_slow = true;
                    let every = run.opts.rescan_interval.max(Duration::from_secs(1));
                    rescan = interval_at(tokio::time::Instant::now() + every, every);
                    rescan.set_missed_tick_behavior(MissedTickBehavior::Delay);
                }
                if let Some(reason) = run.look(k, watch, &mut last_lost)? {
                    return Ok(reason);
                }
            }
            _ = sample.tick() => {
                if let Some(s) = sampler.tick(monotonic_ns()) {
                    run.emit(StreamItem::Sample(Box::new(s)))?;
                }
            }
            _ = stack.tick(), if run.opts.stack_rate > 0 && run.stacks.is_some() => {
                run.sample_stack()?;
                run.stack_ticks += 1;
                if run.stack_ticks.is_multiple_of(worker_every(run.opts.stack_rate)) {
                    run.sample_workers()?;
                }
            }
            _ = govern.tick() => {
                run.govern(k, governor)?;
                if governor.stage() != govern_stage {
                    govern_stage = governor.stage();
                    let every = govern_every(govern_stage);
                    govern = interval_at(tokio::time::Instant::now() + every, every);
                    govern.set_missed_tick_behavior(MissedTickBehavior::Delay);
                }
            }
            _ = recv(&mut sigint) => return Ok(EndReason::Interrupted),
            _ = recv(&mut sigterm) => return Ok(EndReason::Terminated),
            // A daemon started from a terminal that closes ends like on SIGTERM, with its
            // summary.
            _ = recv(&mut sighup) => return Ok(EndReason::Terminated),
            reason = stopped(&mut stop) => return Ok(reason),
            _ = async { match deadline { Some(d) => tokio::time::sleep_until(d).await, None => std::future::pending().await } } => {
                return Ok(EndReason::DurationElapsed);
            }
        }
    }
}

/// Where the eBPF side's log lines go in `tracing` (`TRACEML_LOG=traceml_daemon::ebpf=debug`).
const EBPF_LOG_TARGET: &str = "traceml_daemon::ebpf";

/// Reads the eBPF side's rare-path log (aya-log's ring buffer: failed reads, full state, ring
/// buffer full; rate-limited in the kernel) into `tracing`. An object without the log map runs
/// without it.
fn ebpf_log(ebpf: &mut aya::Ebpf) -> Option<aya_log::EbpfLogger<EbpfLog>> {
    aya_log::EbpfLogger::init_with_logger(ebpf, EbpfLog)
        .inspect_err(|e| tracing::debug!("no eBPF log: {e}"))
        .ok()
}

/// Forwards aya-log's records (through the `log` facade) to `tracing` at their level; the
/// message says which probe and what failed, with the pid and tid.
struct EbpfLog;

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
