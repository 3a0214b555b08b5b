//! The decoded event stream: what the probes saw, as typed events, plus the userspace facts the
//! analysis needs (code objects resolved, samples, losses, how the run ended). It is the boundary
//! between the kernel-facing shell and the pure core: a live run and a replayed recording produce
//! the same `StreamItem`s.
use serde::{Deserialize, Serialize};
use traceml_common::{
    CodeClass, EventKind, FLAG_RAISED, NAME_BYTES, OffCpuState, ProbeId, RawEvent,
};

mod api;
pub use api::*;

/// One item of the event stream. Rare, large variants are boxed so a stream of millions of
/// events stays compact in memory (an item is 56 bytes).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum StreamItem {
    /// Facts about the target, written once at attach.
    Target(Box<TargetInfo>),
    /// A code object resolved in userspace (qualname, file, class).
    Code(Box<CodeInfo>),
    /// A probe event.
    Event(Event),
    /// A periodic /proc + NVML sample.
    Sample(Box<crate::sample::Sample>),
    /// Events known to be lost (kernel counters or sequence gaps), cumulative per reason.
    Lost(Lost),
    /// A probe that could not be attached, and why.
    ProbeFailed(Box<ProbeFailure>),
    /// A library found in the target (at attach or later), with the probes placed in it.
    Library(Box<LibraryInfo>),
    /// Kernel-side launch counters at the end of the run (all launches, both modes).
    LaunchTotals(LaunchTotals),
    /// The probe set changed (the overhead governor armed or detached probes).
    ProbeSet(Box<ProbeSet>),
    /// Cumulative probe hit counters, read from the kernel about once a second.
    ProbeStats(ProbeStats),
    /// A Python function seen in a stack sample, named once (samples refer to it by `id`).
    Func(Box<FuncInfo>),
    /// A Python stack sample of one thread (outermost frame first).
    Stack(Box<StackSample>),
    /// A Python stack sample of a DataLoader worker process's main thread, with its
    /// scheduler state when sampled.
    WorkerStack(Box<WorkerStackSample>),
    /// The end of the run.
    End(End),
}

/// Launches counted in the kernel over the whole run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LaunchTotals {
    /// `cudaLaunchKernel`, `cudaLaunchKernelExC`, `cudaGraphLaunch` (and `_ptsz`).
    pub runtime: u64,
    /// `cuLaunchKernel`, `cuLaunchKernelEx` (and `_ptsz`): every hit, whatever its caller.
    pub driver: u64,
    /// Of `driver`: called by a CUDA runtime (its own launches, counted in `runtime`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub nested: u64,
    /// Of `driver`: called by a library with its own runtime copy.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub library: u64,
    /// Of `driver`: called directly.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub direct: u64,
}

impl LaunchTotals {
    /// Launches by [`LaunchPath::COUNTED`] (each launch once). Totals recorded before the
    /// kernel told paths apart (`driver` hits, none split): the driver's launches are the
    /// runtime's own when the runtime launched at all, else direct ones.
    pub fn by_path(&self) -> [u64; 3] {
        if self.nested + self.library + self.direct == 0 && self.driver > 0 {
            return if self.runtime > 0 {
                [self.runtime, 0, 0]
            } else {
                [0, 0, self.driver]
            };
        }
        [self.runtime, self.library, self.direct]
    }
}

/// Which probes run from `ts` on.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProbeSet {
    pub ts: u64,
    /// The frame-evaluator probe (`_PyEval_EvalFrameDefault` entry and return) is armed.
    pub python: bool,
    /// Every kernel launch is an event (otherwise launches are only counted in the kernel).
    pub launch_events: bool,
    /// Why the governor chose this set, for the report.
    pub reason: String,
    /// Only torch's marker probes are placed (the CUDA and NCCL ones wait for the first
    /// training marker).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub watching: bool,
    /// The frame-evaluator probe is armed as part of the steady set (cheap enough for this
    /// loop), not to learn it: steps under it are steady steps.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub python_steady: bool,
}

/// Probe hits since attach, summed over CPUs (the kernel's `STATS` and `LAUNCHES` counters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeStats {
    pub ts: u64,
    /// Frame-evaluator entries (every C→Python call while the probe is armed).
    pub py_enter: u64,
    /// Return-probe hits (frame-evaluator returns and native calls with an exit probe).
    pub exit: u64,
    /// Entries of native calls with an exit probe (copies, syncs, backward).
    pub call_enter: u64,
    /// `record_function` entries and exits.
    pub record: u64,
    /// Kernel launches seen (both modes).
    pub launch: u64,
    /// Runs of the `sched_switch` program that did a watched thread's work (it left its CPU
    /// or came back); 0 in recordings made before they were counted.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub switch: u64,
    /// A probe-set change was still being carried out by the kernel at this reading (detaching
    /// uprobes takes seconds): the steady state starts after it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub switching: bool,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A Python function named in stack samples.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FuncInfo {
    pub id: u32,
    /// Qualified name where the interpreter has one (3.11+), else the name.
    pub function: String,
    pub file: String,
    /// First line of the function's code object.
    pub line: u32,
}

/// One sample of a thread's Python stack: [`FuncInfo`] ids, outermost first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StackSample {
    pub ts: u64,
    pub tid: u32,
    pub frames: Vec<u32>,
    /// The lines the innermost frames execute (where each called the next, the innermost
    /// where it called what the thread waits in), innermost first, at most
    /// `attach::pystack::INNER_LINES`; 0: not read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lines: Vec<u32>,
}

/// A process's scheduler state as `/proc/<pid>/stat` shows it at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcState {
    /// `R`: on a CPU, or runnable and waiting for one.
    Running,
    /// `S`: asleep, interruptibly (a lock, a queue, `sleep`, a pipe or network read).
    Sleeping,
    /// `D`: in uninterruptible sleep (disk I/O, page faults from storage).
    DiskSleep,
    /// Anything else (stopped, zombie, idle kernel state).
    Other,
}

impl ProcState {
    pub fn from_stat(state: char) -> ProcState {
        match state {
            'R' => ProcState::Running,
            'S' => ProcState::Sleeping,
            'D' => ProcState::DiskSleep,
            _ => ProcState::Other,
        }
    }
}

/// One sample of a DataLoader worker's Python stack (its main thread: the worker loop), with
/// [`FuncInfo`] ids, outermost first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerStackSample {
    pub ts: u64,
    pub pid: u32,
    pub state: ProcState,
    pub frames: Vec<u32>,
    /// What the worker was reading, where it slept in a read system call (`None`: on a CPU, in
    /// another call, or not known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reading: Option<ReadSite>,
}

/// The file a task blocked in a read was reading (`host::reads`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ReadSite {
    /// The descriptor's link: a path, or `pipe:[…]` / `socket:[…]`.
    pub path: String,
    pub kind: ReadKind,
    /// For a file or a device: the mount that holds it, its file-system type and source
    /// (empty when not found).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mount: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub fs_type: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
}

/// File systems whose reads cross a network.
const NETWORK_FS: [&str; 12] = [
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "9p",
    "ceph",
    "lustre",
    "glusterfs",
    "gpfs",
    "beegfs",
    "afs",
    "virtiofs",
];

impl ReadSite {
    /// Whether its file system reads over a network (FUSE file systems count: most are remote
    /// stores).
    pub fn network(&self) -> bool {
        NETWORK_FS.contains(&self.fs_type.as_str()) || self.fs_type.starts_with("fuse")
    }
}

/// What kind of file a read was reading.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum ReadKind {
    /// A regular file: storage.
    File,
    /// A pipe (anonymous or named): whatever writes it is slow.
    Pipe,
    Socket,
    /// A block or character device.
    Device,
    #[default]
    Other,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TargetInfo {
    pub pid: u32,
    pub comm: String,
    pub cmdline: Vec<String>,
    /// "3.11.7" when known.
    pub python_version: Option<String>,
    /// File holding `_PyEval_EvalFrameDefault`.
    pub python_elf: Option<String>,
    /// `CLOCK_MONOTONIC` ns when the daemon attached.
    pub attach_ts_ns: u64,
    /// Wall-clock seconds since the epoch when the daemon attached.
    pub attach_unix_s: f64,
    /// CPU cores of the machine (for "% of machine capacity").
    pub num_cpus: u32,
    /// Bytes of RAM of the machine.
    pub mem_total_bytes: Option<u64>,
    pub hostname: String,
    pub daemon_version: String,
    /// `--launch-mode count`: launches are counted in the kernel only (no per-launch events).
    #[serde(default)]
    pub launch_count_only: bool,
    /// `--overhead-budget`, percent of step time.
    #[serde(default)]
    pub overhead_budget_pct: Option<f64>,
    /// Whose job this is: user, container, pod, systemd unit (`crate::host::identity`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<Identity>,
    /// What a probe hit costs on this machine, measured at start (`crate::attach::calibrate`);
    /// `None`: the reference cost model (a recording made before calibrations, or one failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<Calibration>,
}

/// The per-hit cost of a uprobe and a uretprobe measured on the machine the daemon ran on.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// An entry probe running the cheapest program (a counter bump), ns per hit.
    pub uprobe_ns: f64,
    /// A return probe whose program returns at once, ns per hit.
    pub uretprobe_ns: f64,
}

/// Who a target is on the node (`crate::host::identity`); every field `None` when unknown.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Identity {
    /// The target's (effective) uid and its name in the node's passwd.
    pub uid: Option<u32>,
    pub user: Option<String>,
    /// Its cgroup path (v2, or the v1 hierarchy that names its container).
    pub cgroup: Option<String>,
    /// `docker`, `containerd`, `cri-o`, `podman` (`None` when the path does not say).
    pub container_runtime: Option<String>,
    /// The 64-hex-digit container id.
    pub container_id: Option<String>,
    /// The Kubernetes pod's UID, its name and namespace (from the target's `POD_NAME` or
    /// `HOSTNAME`, and `POD_NAMESPACE`).
    pub pod_uid: Option<String>,
    pub pod_name: Option<String>,
    pub pod_namespace: Option<String>,
    /// The systemd unit of a target outside containers (`train.service`, `session-3.scope`).
    pub unit: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CodeInfo {
    /// The identity events use for this code object (`code` of `py_enter`/`py_exit`): its address
    /// mixed with its name's, so a reused address is a new identity.
    pub ptr: u64,
    /// The code object's address in the target.
    #[serde(default)]
    pub address: u64,
    pub qualname: String,
    pub filename: String,
    pub class: Class,
}

/// Userspace mirror of [`CodeClass`] with serde names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    Pending,
    Ignore,
    DataLoaderNext,
    ModuleCall,
    OptimizerStep,
    Backward,
}

impl From<CodeClass> for Class {
    fn from(c: CodeClass) -> Self {
        match c {
            CodeClass::Pending => Class::Pending,
            CodeClass::Ignore => Class::Ignore,
            CodeClass::DataLoaderNext => Class::DataLoaderNext,
            CodeClass::ModuleCall => Class::ModuleCall,
            CodeClass::OptimizerStep => Class::OptimizerStep,
            CodeClass::Backward => Class::Backward,
        }
    }
}

impl From<Class> for CodeClass {
    fn from(c: Class) -> Self {
        match c {
            Class::Pending => CodeClass::Pending,
            Class::Ignore => CodeClass::Ignore,
            Class::DataLoaderNext => CodeClass::DataLoaderNext,
            Class::ModuleCall => CodeClass::ModuleCall,
            Class::OptimizerStep => CodeClass::OptimizerStep,
            Class::Backward => CodeClass::Backward,
        }
    }
}

/// One probe event, decoded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// `CLOCK_MONOTONIC` ns.
    pub ts: u64,
    pub tgid: u32,
    pub tid: u32,
    #[serde(flatten)]
    pub kind: Kind,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "k", rename_all = "snake_case")]
pub enum Kind {
    /// A frame of a tracked code object started (entered from C).
    PyEnter { code: u64, depth: u32 },
    /// That frame ended; `raised` when it returned NULL (exception, e.g. StopIteration).
    PyExit { code: u64, raised: bool },
    /// A blocking/enter-exit native call started: copies carry kind and bytes.
    CallEnter {
        api: Api,
        bytes: Option<u64>,
        copy: Option<CopyKind>,
        /// A c10d collective's process group (its address in the rank: an identity within
        /// one process only).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        group: Option<u64>,
    },
    /// The innermost open native call of this thread with this api returned.
    CallExit { api: Api, ret: u64 },
    /// A kernel (or graph) launch, and how it reached the driver (absent in recordings made
    /// before the kernel read it: see [`LaunchPath::of`]).
    Launch {
        api: Api,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        path: Option<LaunchPath>,
    },
    /// `record_function` opened with this name (possibly truncated).
    RecordEnter { name: String },
    /// The innermost open `record_function` of this thread closed.
    RecordExit,
    /// The process called `execve`: its program is gone, and whatever the probes report after
    /// this instant comes from the new program (they stay registered on the task until the
    /// daemon removes them). The engine ends the process's trace here.
    Exec,
    /// The thread was off its CPU from `since` to this event's `ts` (the scheduler's own
    /// accounting: `sched_switch`), for the reason `state`.
    OffCpu { since: u64, state: OffCpu },
    /// The thread set autograd's grad mode (`torch.no_grad()` and the like).
    GradMode { enabled: bool },
}

/// Why a thread was off its CPU (mirror of [`OffCpuState`] with serde names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum OffCpu {
    /// Runnable, waiting for a CPU (preempted).
    Runnable,
    /// Interruptible sleep: a lock, queue or condition (futex), `sleep`, a pipe, `poll`.
    Sleeping,
    /// Uninterruptible sleep: disk I/O, a page fault served from storage.
    Uninterruptible,
}

impl OffCpu {
    pub fn from_raw(v: u64) -> OffCpu {
        match u32::try_from(v)
            .ok()
            .and_then(|v| OffCpuState::try_from(v).ok())
        {
            Some(OffCpuState::Runnable) => OffCpu::Runnable,
            Some(OffCpuState::Uninterruptible) => OffCpu::Uninterruptible,
            _ => OffCpu::Sleeping,
        }
    }

    pub fn raw(self) -> u64 {
        (match self {
            OffCpu::Runnable => OffCpuState::Runnable,
            OffCpu::Sleeping => OffCpuState::Sleeping,
            OffCpu::Uninterruptible => OffCpuState::Uninterruptible,
        }) as u64
    }

    /// Blocked (waiting for something other than a CPU).
    pub fn blocked(self) -> bool {
        self != OffCpu::Runnable
    }
}

/// Why a raw event could not be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("unknown event kind {0}")]
    Kind(u32),
    #[error("unknown probe id {0}")]
    Probe(u32),
    #[error("probe {probe:?} cannot produce a {kind:?} event")]
    Mismatch { kind: EventKind, probe: ProbeId },
}

/// A [`EventKind::ProcAddress`] event: the driver entry point `cuGetProcAddress` was asked for
/// (its name, at most 32 bytes) and the pointer it handed out.
pub fn proc_address(raw: &RawEvent) -> Option<(String, u64)> {
    if raw.kind != EventKind::ProcAddress as u32 {
        return None;
    }
    let mut bytes = [0u8; 32];
    for (i, w) in raw.args[1..].iter().enumerate() {
        bytes[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    let name = std::str::from_utf8(&bytes[..end]).ok()?;
    (!name.is_empty()).then(|| (name.to_owned(), raw.args[0]))
}

/// Decodes one raw kernel event.
pub fn decode(raw: &RawEvent) -> Result<Event, DecodeError> {
    let kind = EventKind::try_from(raw.kind).map_err(DecodeError::Kind)?;
    let probe = ProbeId::try_from(raw.probe).map_err(DecodeError::Probe)?;
    let mismatch = || DecodeError::Mismatch { kind, probe };
    let k = match kind {
        EventKind::PyEnter => Kind::PyEnter {
            code: raw.args[0],
            depth: raw.args[2] as u32,
        },
        EventKind::PyExit => Kind::PyExit {
            code: raw.args[0],
            raised: raw.flags & FLAG_RAISED != 0,
        },
        EventKind::CallEnter => {
            let api = Api::from_probe(probe).ok_or_else(mismatch)?;
            if api.is_copy() {
                Kind::CallEnter {
                    api,
                    bytes: Some(raw.args[0]),
                    copy: Some(CopyKind::from_raw(raw.args[1])),
                    group: None,
                }
            } else if let Some(bytes) = api.nccl_bytes(&raw.args) {
                Kind::CallEnter {
                    api,
                    bytes: Some(bytes),
                    copy: None,
                    group: None,
                }
            } else {
                Kind::CallEnter {
                    api,
                    bytes: None,
                    copy: None,
                    group: api.has_group().then_some(raw.args[1]),
                }
            }
        }
        EventKind::CallExit => Kind::CallExit {
            api: Api::from_probe(probe).ok_or_else(mismatch)?,
            ret: raw.args[0],
        },
        EventKind::Launch => {
            let api = Api::from_probe(probe).ok_or_else(mismatch)?;
            Kind::Launch {
                api,
                path: Some(LaunchPath::of(api, Some(raw.args[2]))),
            }
        }
        EventKind::RecordEnter => {
            let mut bytes = [0u8; NAME_BYTES];
            for (i, w) in raw.args.iter().enumerate() {
                bytes[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
            }
            let end = bytes.iter().position(|&b| b == 0).unwrap_or(NAME_BYTES);
            Kind::RecordEnter {
                name: String::from_utf8_lossy(&bytes[..end]).into_owned(),
            }
        }
        EventKind::RecordExit => Kind::RecordExit,
        EventKind::Exec if probe == ProbeId::ProcessExec => Kind::Exec,
        EventKind::Exec => return Err(mismatch()),
        EventKind::OffCpu if probe == ProbeId::SchedSwitch => Kind::OffCpu {
            since: raw.args[0].min(raw.ts_ns),
            state: OffCpu::from_raw(raw.args[1]),
        },
        EventKind::GradMode if probe == ProbeId::TorchGradMode => Kind::GradMode {
            enabled: raw.args[0] != 0,
        },
        // Read by the live loop itself (`proc_address`), never a stream event.
        EventKind::OffCpu | EventKind::GradMode | EventKind::ProcAddress => {
            return Err(mismatch());
        }
    };
    Ok(Event {
        ts: raw.ts_ns,
        tgid: raw.tgid,
        tid: raw.tid,
        kind: k,
    })
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Lost {
    /// Ring buffer full when the kernel tried to write.
    pub ring_full: u64,
    /// Reads of the target's memory that failed in the kernel.
    pub read_failed: u64,
    /// Per-thread state map full (too many threads): a thread not tracked.
    pub state_full: u64,
    /// Raw events that did not decode.
    pub undecodable: u64,
    /// Sequence gaps seen by userspace that the kernel counters do not explain.
    pub seq_gaps: u64,
    /// Off-CPU records (sched_switch) dropped because the ring buffer was full; apart from
    /// `ring_full`, which counts the probes' events.
    #[serde(default)]
    pub off_cpu_ring_full: u64,
    /// Calls deeper than the probes follow (past 64 open calls on a thread, or the kernel's
    /// uretprobe nesting limit): neither the call nor its return reported, its time left with
    /// its caller. Not lost, and not in [`Lost::total`].
    #[serde(default)]
    pub too_deep: u64,
}

impl Lost {
    pub fn total(&self) -> u64 {
        self.ring_full
            + self.read_failed
            + self.state_full
            + self.undecodable
            + self.off_cpu_ring_full
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProbeFailure {
    pub probe: String,
    pub file: String,
    pub reason: String,
}

/// The [`LibraryInfo::role`] of a driver entry point reached through a `cuGetProcAddress`
/// pointer that is not the exported function: one probe, `name+offset` in the file.
pub const FOLLOWED_ROLE: &str = "followed";

/// The [`LibraryInfo::role`] of a library that carries its own copy of the CUDA runtime (no
/// probes of its own: its launches reach the driver's, counted on the `library` path).
pub const OWN_RUNTIME_ROLE: &str = "own_runtime";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LibraryInfo {
    pub path: String,
    /// "python", "cudart", "cuda_driver", "torch", "torch_core", "nccl", or
    /// [`OWN_RUNTIME_ROLE`].
    pub role: String,
    /// Probes attached in it.
    pub probes: Vec<String>,
    /// `CLOCK_MONOTONIC` ns when it was attached.
    pub ts: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct End {
    pub ts: u64,
    pub reason: EndReason,
    /// How the target ended, when it did (exit status, signal, program exec'd); absent when
    /// the daemon stopped first, and in recordings of older daemons.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Box<TargetEnd>>,
}

/// What the daemon learned of the target's end (`crate::host::ending`). Every field is `None` (or
/// false) when unknown; `source` says where the facts came from or why they are unknown.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TargetEnd {
    /// Exit status (0–255) of a target that exited.
    pub exit_status: Option<i32>,
    /// The signal that killed the target.
    pub signal: Option<i32>,
    /// Its name (`SIGKILL`).
    pub signal_name: Option<String>,
    /// The kernel wrote a core dump.
    pub core_dumped: bool,
    /// The program the target exec'd (its new `/proc/<pid>/exe`, else its new `comm`).
    pub exec: Option<String>,
    /// `process events connector`, `/proc/<pid>/stat of the zombie`, or `status unknown: why`.
    pub source: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    /// The target process exited.
    TargetExited,
    /// The target called exec: its program is gone (the probes of the old one would fire in the
    /// new one until removed; the engine ends the trace at the exec, see [`Kind::Exec`]).
    TargetExeced,
    /// The target was killed by a signal (which: [`TargetEnd::signal`]).
    TargetKilled,
    /// SIGINT / Ctrl-C.
    Interrupted,
    /// SIGTERM.
    Terminated,
    /// `--duration` elapsed.
    DurationElapsed,
    /// The recording ended without an `End` item (the daemon was killed).
    Truncated,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proc_address_event_names_the_entry_point_and_its_pointer() {
        let mut raw = RawEvent::zeroed();
        raw.kind = EventKind::ProcAddress as u32;
        raw.probe = ProbeId::CuGetProcAddress as u32;
        let name = b"cuLaunchKernel\0";
        let mut bytes = [0u8; 32];
        bytes[..name.len()].copy_from_slice(name);
        raw.args[0] = 0x7f00_1234_5678;
        for i in 0..4 {
            raw.args[1 + i] = u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap());
        }
        assert_eq!(
            proc_address(&raw),
            Some(("cuLaunchKernel".to_owned(), 0x7f00_1234_5678))
        );
        // Not a stream event: the live loop reads it.
        assert!(decode(&raw).is_err());
        raw.kind = EventKind::Launch as u32;
        assert_eq!(proc_address(&raw), None);
    }

    #[test]
    fn launch_totals_count_each_launch_once_by_path() {
        // The runtime's 7 launches made 5 nested driver calls (one runtime form calls none),
        // a library's own runtime 2 and a direct caller 1: 10 launches.
        let t = LaunchTotals {
            runtime: 7,
            driver: 8,
            nested: 5,
            library: 2,
            direct: 1,
        };
        assert_eq!(t.by_path(), [7, 2, 1]);
        // Recorded before paths: the driver's hits are the runtime's own when it launched.
        let old = |runtime, driver| LaunchTotals {
            runtime,
            driver,
            ..LaunchTotals::default()
        };
        assert_eq!(old(7, 7).by_path(), [7, 0, 0]);
        assert_eq!(old(0, 9).by_path(), [0, 0, 9]);
        assert_eq!(
            LaunchPath::of(Api::CuLaunchKernel, Some(0)),
            LaunchPath::Direct
        );
        assert_eq!(
            LaunchPath::of(Api::CudaLaunchKernel, None),
            LaunchPath::Runtime
        );
        assert_eq!(
            LaunchPath::of(Api::CuLaunchKernel, Some(2)),
            LaunchPath::Nested
        );
    }

    fn raw(kind: EventKind, probe: ProbeId, args: [u64; 5]) -> RawEvent {
        let mut r = RawEvent::zeroed();
        r.kind = kind as u32;
        r.probe = probe as u32;
        r.ts_ns = 42;
        r.tid = 7;
        r.tgid = 7;
        r.args = args;
        r
    }

    #[test]
    fn decodes_copy_with_kind_and_bytes() {
        let e = decode(&raw(
            EventKind::CallEnter,
            ProbeId::CudaMemcpyAsync,
            [4096, 1, 0, 0, 0],
        ))
        .unwrap();
        assert_eq!(
            e.kind,
            Kind::CallEnter {
                api: Api::CudaMemcpyAsync,
                bytes: Some(4096),
                copy: Some(CopyKind::HostToDevice),
                group: None,
            }
        );
    }

    #[test]
    fn decodes_a_peer_copy_as_device_to_device() {
        // `call_enter`'s layout for `cudaMemcpyPeerAsync(dst, 1, src, 0, 1 << 20, stream)`.
        let e = decode(&raw(
            EventKind::CallEnter,
            ProbeId::CudaMemcpyPeerAsync,
            [1 << 20, 3, 0xd000, 0x5000, 0x77],
        ))
        .unwrap();
        assert_eq!(
            e.kind,
            Kind::CallEnter {
                api: Api::CudaMemcpyPeerAsync,
                bytes: Some(1 << 20),
                copy: Some(CopyKind::DeviceToDevice),
                group: None,
            }
        );
        let l = decode(&raw(
            EventKind::Launch,
            ProbeId::CuLaunchCooperativeKernel,
            [0; 5],
        ))
        .unwrap();
        assert_eq!(
            l.kind,
            Kind::Launch {
                api: Api::CuLaunchCooperativeKernel,
                path: Some(LaunchPath::Direct),
            }
        );
        assert!(Api::CuLaunchCooperativeKernel.is_driver());
    }

    /// Each NCCL call's first five arguments as `mark_enter` sends them, in nccl.h's order
    /// (NCCL 2.30): the bytes are count × the datatype's size, each read at its own position.
    #[test]
    fn nccl_bytes_read_each_signatures_count_and_datatype() {
        use CollectiveOp as O;
        use ProbeId as P;
        let (send, recv, comm, root, peer, op_sum) = (0x1000, 0x2000, 0xc0, 1, 1, 0);
        let (count, f32, bf16) = (1000, 7, 9);
        let cases: [(ProbeId, [u64; 5], u64, O); 10] = [
            // (sendbuff, recvbuff, count, datatype, op, comm, stream)
            (
                P::NcclAllReduce,
                [send, recv, count, f32, op_sum],
                4000,
                O::AllReduce,
            ),
            // (sendbuff, recvbuff, recvcount, datatype, op, comm, stream)
            (
                P::NcclReduceScatter,
                [send, recv, count, bf16, op_sum],
                2000,
                O::ReduceScatter,
            ),
            // (sendbuff, recvbuff, sendcount, datatype, comm, stream)
            (
                P::NcclAllGather,
                [send, recv, count, f32, comm],
                4000,
                O::AllGather,
            ),
            // (sendbuff, recvbuff, count, datatype, root, comm, stream)
            (
                P::NcclBroadcast,
                [send, recv, count, f32, root],
                4000,
                O::Broadcast,
            ),
            // (sendbuff, recvbuff, count, datatype, op, root, comm, stream)
            (
                P::NcclReduce,
                [send, recv, count, f32, op_sum],
                4000,
                O::Reduce,
            ),
            // (sendbuff, recvbuff, count, datatype, comm, stream)
            (
                P::NcclAllToAll,
                [send, recv, count, bf16, comm],
                2000,
                O::AllToAll,
            ),
            // (sendbuff, recvbuff, count, datatype, root, comm, stream)
            (
                P::NcclGather,
                [send, recv, count, f32, root],
                4000,
                O::Gather,
            ),
            (
                P::NcclScatter,
                [send, recv, count, f32, root],
                4000,
                O::Scatter,
            ),
            // (sendbuff, count, datatype, peer, comm, stream)
            (P::NcclSend, [send, count, bf16, peer, comm], 2000, O::Send),
            // (recvbuff, count, datatype, peer, comm, stream)
            (P::NcclRecv, [recv, count, f32, peer, comm], 4000, O::Recv),
        ];
        for (probe, args, bytes, op) in cases {
            let e = decode(&raw(EventKind::CallEnter, probe, args)).unwrap();
            let Kind::CallEnter { api, bytes: b, .. } = e.kind else {
                panic!("{probe:?}: {:?}", e.kind)
            };
            assert_eq!(b, Some(bytes), "{probe:?}");
            assert!(api.is_collective(), "{probe:?}");
            assert_eq!(api.collective_op(), Some(op), "{probe:?}");
        }
    }

    #[test]
    fn decodes_record_name() {
        let mut args = [0u64; 5];
        let name = b"Optimizer.step#SGD.step";
        let mut bytes = [0u8; 40];
        bytes[..name.len()].copy_from_slice(name);
        for (i, w) in args.iter_mut().enumerate() {
            *w = u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap());
        }
        let e = decode(&raw(
            EventKind::RecordEnter,
            ProbeId::TorchRecordEnter,
            args,
        ))
        .unwrap();
        assert_eq!(
            e.kind,
            Kind::RecordEnter {
                name: "Optimizer.step#SGD.step".into()
            }
        );
    }

    #[test]
    fn rejects_unknown_and_mismatched() {
        let mut r = raw(EventKind::PyEnter, ProbeId::PyEval, [0; 5]);
        r.kind = 99;
        assert_eq!(decode(&r), Err(DecodeError::Kind(99)));
        let r = raw(EventKind::Launch, ProbeId::PyEval, [0; 5]);
        assert!(matches!(decode(&r), Err(DecodeError::Mismatch { .. })));
        let r = raw(EventKind::Exec, ProbeId::PyEval, [0; 5]);
        assert!(matches!(decode(&r), Err(DecodeError::Mismatch { .. })));
        let r = raw(EventKind::Exec, ProbeId::ProcessExec, [0; 5]);
        assert_eq!(decode(&r).unwrap().kind, Kind::Exec);
    }

    #[test]
    fn stream_item_json_round_trip() {
        let item = StreamItem::Event(Event {
            ts: 1,
            tgid: 2,
            tid: 3,
            kind: Kind::CallEnter {
                api: Api::CudaMemcpy,
                bytes: Some(8),
                copy: Some(CopyKind::DeviceToHost),
                group: None,
            },
        });
        let s = serde_json::to_string(&item).unwrap();
        let back: StreamItem = serde_json::from_str(&s).unwrap();
        assert_eq!(item, back);
    }
}
