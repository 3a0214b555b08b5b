//! Plain data shared by the eBPF programs and the daemon: the fixed-size event that crosses the
//! ring buffer, its kinds, the probe identifiers and the loss counters.
//!
//! Layout rules: `#[repr(C)]`, only `u32`/`u64`, no `bool`, no implicit
//! padding, a size assertion beside each struct, kinds with explicit values that are never reused.
#![no_std]

use core::mem::size_of;

/// Number of name bytes a [`RawEvent`] can carry (record_function names, truncated).
pub const NAME_BYTES: usize = 40;

/// One event as written by the kernel side into the ring buffer. 80 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawEvent {
    /// [`EventKind`] as `u32`.
    pub kind: u32,
    /// [`ProbeId`] as `u32`: which probed function produced the event.
    pub probe: u32,
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) at the probe hit.
    pub ts_ns: u64,
    /// Per-CPU sequence number; it also advances when the event could not be written, so a gap
    /// between two events of one CPU is a loss the decoder can see.
    pub seq: u64,
    pub tgid: u32,
    pub tid: u32,
    pub cpu: u32,
    /// Kind-specific flags (e.g. [`FLAG_RAISED`]).
    pub flags: u32,
    /// Kind-specific payload; see [`EventKind`] for each kind's meaning.
    pub args: [u64; 5],
}
const _: () = assert!(size_of::<RawEvent>() == 80);

impl RawEvent {
    pub const fn zeroed() -> Self {
        RawEvent {
            kind: 0,
            probe: 0,
            ts_ns: 0,
            seq: 0,
            tgid: 0,
            tid: 0,
            cpu: 0,
            flags: 0,
            args: [0; 5],
        }
    }
}

/// The exit of a Python frame returned NULL (an exception was raised, e.g. StopIteration).
pub const FLAG_RAISED: u32 = 1;
/// The event's name payload was cut at [`NAME_BYTES`].
pub const FLAG_TRUNCATED: u32 = 2;

/// What an event says. Values are explicit and never reused.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EventKind {
    /// A frame of a tracked code object entered `_PyEval_EvalFrameDefault`.
    /// args: [code identity (address ^ rotl(name address, 32)), class (see [`CodeClass`]),
    /// open tracked calls, code object address, `PyThreadState*` of the calling thread].
    PyEnter = 1,
    /// That frame returned. args: [code identity, class, depth, return value, 0]; flags:
    /// [`FLAG_RAISED`].
    PyExit = 2,
    /// Entry of a native function with enter/exit semantics (CUDA copy, sync, torch backward).
    /// args: see [`ProbeId`].
    CallEnter = 3,
    /// Return of the function of the matching [`EventKind::CallEnter`]. args: [return value, ...].
    CallExit = 4,
    /// A kernel launch (count-only semantics: no exit event). args: [function/graph pointer,
    /// stream, [`LaunchPath`], the launch probe's return address, 0].
    Launch = 5,
    /// `torch::autograd::profiler::record_function_enter_new(name, ...)`. args: the first
    /// [`NAME_BYTES`] bytes of the name, NUL-padded.
    RecordEnter = 6,
    /// `record_function_exit` of the innermost open record on this thread.
    RecordExit = 7,
    /// The target process called `execve` (the `sched_process_exec` tracepoint, emitted for the
    /// target's tgid only): its program is gone, yet the uprobes placed in it stay registered
    /// on its task and fire in the new program (same files, same task) until they are removed.
    /// Nothing after this event belongs to the run. args: none.
    Exec = 8,
    /// A watched thread of the target (one the probes keep state for) ran again after being off
    /// its CPU (the `sched_switch` tracepoint, filtered in the kernel to the target's threads).
    /// `ts_ns` is when it was switched back in; args: [when it was switched out, [`OffCpuState`]
    /// as `u64`, 0, 0, 0]. `tid`/`tgid` are the thread's, not the current task's.
    OffCpu = 9,
    /// The calling thread set autograd's grad mode (`c10::GradMode::set_enabled`: `torch.no_grad`,
    /// `torch.enable_grad`, `torch.set_grad_enabled`, the optimizer's own guard).
    /// args: [1 enabled / 0 disabled, 0, 0, 0, 0].
    GradMode = 10,
    /// `cuGetProcAddress` handed out a driver entry point. args: [the pointer it wrote, then
    /// the first 32 bytes of the symbol name asked for, NUL-padded]. The daemon places the
    /// entry point's probe there when it is not the exported function's address.
    ProcAddress = 11,
}

/// Why a thread was off its CPU ([`EventKind::OffCpu`] `args[1]`), from the switch's `preempt`
/// flag and the task's state as it left the CPU.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OffCpuState {
    /// Preempted or yielded while runnable: it waited for a CPU.
    Runnable = 0,
    /// Interruptible sleep (`S`): a futex (lock, queue, condition), `sleep`, a pipe or socket,
    /// `poll`/`epoll`.
    Sleeping = 1,
    /// Uninterruptible sleep (`D`): disk I/O, a page fault served from storage.
    Uninterruptible = 2,
}

impl OffCpuState {
    /// From the raw tracepoint's `preempt` flag and `task_struct::__state` of the task leaving.
    pub const fn from_switch(preempt: bool, state: u32) -> Self {
        // TASK_UNINTERRUPTIBLE 0x2 without TASK_NOLOAD 0x400 (TASK_IDLE is not I/O).
        if preempt || state == 0 {
            OffCpuState::Runnable
        } else if state & 0x2 != 0 && state & 0x400 == 0 {
            OffCpuState::Uninterruptible
        } else {
            OffCpuState::Sleeping
        }
    }
}

impl TryFrom<u32> for OffCpuState {
    type Error = u32;
    fn try_from(v: u32) -> Result<Self, u32> {
        Ok(match v {
            0 => OffCpuState::Runnable,
            1 => OffCpuState::Sleeping,
            2 => OffCpuState::Uninterruptible,
            other => return Err(other),
        })
    }
}

/// The kernel's note of a watched thread that left its CPU (the `OFFCPU` map).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct OffCpuSince {
    pub ts_ns: u64,
    /// [`OffCpuState`] as `u32`.
    pub state: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<OffCpuSince>() == 16);

impl TryFrom<u32> for EventKind {
    type Error = u32;
    fn try_from(v: u32) -> Result<Self, u32> {
        Ok(match v {
            1 => EventKind::PyEnter,
            2 => EventKind::PyExit,
            3 => EventKind::CallEnter,
            4 => EventKind::CallExit,
            5 => EventKind::Launch,
            6 => EventKind::RecordEnter,
            7 => EventKind::RecordExit,
            8 => EventKind::Exec,
            9 => EventKind::OffCpu,
            10 => EventKind::GradMode,
            11 => EventKind::ProcAddress,
            other => return Err(other),
        })
    }
}

/// The probed function an event comes from. Values are explicit and never reused.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProbeId {
    PyEval = 1,
    // CUDA runtime (libcudart)
    CudaLaunchKernel = 10,
    CudaLaunchKernelExC = 11,
    CudaGraphLaunch = 12,
    /// `cudaMemcpy(dst, src, count, kind)`: CallEnter args [bytes, kind, dst, src, 0].
    CudaMemcpy = 13,
    /// `cudaMemcpyAsync(dst, src, count, kind, stream)`: CallEnter args [bytes, kind, dst, src, stream].
    CudaMemcpyAsync = 14,
    /// CallEnter args [stream, ...].
    CudaStreamSynchronize = 15,
    CudaDeviceSynchronize = 16,
    /// CallEnter args [event, ...].
    CudaEventSynchronize = 17,
    // CUDA driver (libcuda)
    CuLaunchKernel = 30,
    CuLaunchKernelEx = 31,
    CuStreamSynchronize = 32,
    CuCtxSynchronize = 33,
    CuEventSynchronize = 34,
    /// `cuMemcpyHtoD(dst, src, bytes)`: CallEnter args [bytes, 1 (H2D), ...].
    CuMemcpyHtoD = 35,
    CuMemcpyDtoH = 36,
    CuMemcpyHtoDAsync = 37,
    CuMemcpyDtoHAsync = 38,
    // torch native
    /// `record_function_enter_new(const std::string& name, ...)`.
    TorchRecordEnter = 50,
    /// `record_function_exit*`.
    TorchRecordExit = 51,
    /// `THPEngine_run_backward` (Python's `loss.backward()` enters the autograd engine here).
    TorchBackward = 52,
    /// The training thread starts blocking on a collective's completion (entry marker; the
    /// wait's end is the entry of the function that follows it, same id, as a `CallExit`).
    TorchCollectiveWait = 53,
    /// A c10d collective was issued (entry marker: counted per step).
    TorchCollective = 54,
    /// `c10::GradMode::set_enabled(bool)`: a [`EventKind::GradMode`] event.
    TorchGradMode = 55,
    // NCCL (libnccl): entry markers, `count` and `datatype` in args [2], [3] (send/recv: [1], [2]).
    NcclAllReduce = 60,
    NcclReduceScatter = 61,
    NcclAllGather = 62,
    NcclBroadcast = 63,
    NcclReduce = 64,
    NcclSend = 65,
    NcclRecv = 66,
    // kernel
    /// The `sched_process_exec` tracepoint (an [`EventKind::Exec`]).
    ProcessExec = 70,
    /// The `sched_switch` tracepoint (an [`EventKind::OffCpu`]).
    SchedSwitch = 71,
    // c10d collectives issued through gloo, by op (entry markers; `this`, the process group, in
    // args[1], after the hidden return pointer): a rank's arrival at one collective of the
    // ledger. (54, `TorchCollective`, is the
    // same without the op, in recordings made before these.)
    C10dAllReduce = 80,
    C10dBroadcast = 81,
    C10dAllGather = 82,
    C10dReduceScatter = 83,
    C10dBarrier = 84,
    // Added for torch 2.15's CUDA 13.2 wheel (issue 52), with values in the free slots of their
    // families (never used before): a launch's id also indexes the kernel's per-probe launch
    // counters (`LAUNCHES`, [`LAUNCH_PROBE_SLOTS`] a path).
    /// `cuLaunchCooperativeKernel(f, grid x/y/z, block x/y/z, sharedMem, stream, params)`
    /// (libcuda; libcaffe2_nvrtc imports it): a kernel launch, as [`ProbeId::CuLaunchKernel`].
    CuLaunchCooperativeKernel = 39,
    /// `cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream)` (libc10_cuda imports
    /// it): CallEnter args [bytes, 3 (D2D), dst, src, stream].
    CudaMemcpyPeerAsync = 18,
    /// `ncclAlltoAll(sendbuff, recvbuff, count, datatype, comm, stream)`: entry marker, `count`
    /// and `datatype` in args [2], [3] (count per peer).
    NcclAllToAll = 67,
    /// `ncclGather(sendbuff, recvbuff, count, datatype, root, comm, stream)`: as above.
    NcclGather = 68,
    /// `ncclScatter(sendbuff, recvbuff, count, datatype, root, comm, stream)`: as above.
    NcclScatter = 69,
    /// `cuGetProcAddress(symbol, pfn, cudaVersion, flags)` and `cuGetProcAddress_v2(…,
    /// symbolStatus)` (libcuda): a [`EventKind::ProcAddress`] event at each successful return.
    CuGetProcAddress = 40,
}

impl TryFrom<u32> for ProbeId {
    type Error = u32;
    fn try_from(v: u32) -> Result<Self, u32> {
        use ProbeId::*;
        Ok(match v {
            1 => PyEval,
            10 => CudaLaunchKernel,
            11 => CudaLaunchKernelExC,
            12 => CudaGraphLaunch,
            13 => CudaMemcpy,
            14 => CudaMemcpyAsync,
            15 => CudaStreamSynchronize,
            16 => CudaDeviceSynchronize,
            17 => CudaEventSynchronize,
            18 => CudaMemcpyPeerAsync,
            30 => CuLaunchKernel,
            31 => CuLaunchKernelEx,
            32 => CuStreamSynchronize,
            33 => CuCtxSynchronize,
            34 => CuEventSynchronize,
            35 => CuMemcpyHtoD,
            36 => CuMemcpyDtoH,
            37 => CuMemcpyHtoDAsync,
            38 => CuMemcpyDtoHAsync,
            39 => CuLaunchCooperativeKernel,
            40 => CuGetProcAddress,
            50 => TorchRecordEnter,
            51 => TorchRecordExit,
            52 => TorchBackward,
            53 => TorchCollectiveWait,
            54 => TorchCollective,
            55 => TorchGradMode,
            60 => NcclAllReduce,
            61 => NcclReduceScatter,
            62 => NcclAllGather,
            63 => NcclBroadcast,
            64 => NcclReduce,
            65 => NcclSend,
            66 => NcclRecv,
            67 => NcclAllToAll,
            68 => NcclGather,
            69 => NcclScatter,
            80 => C10dAllReduce,
            81 => C10dBroadcast,
            82 => C10dAllGather,
            83 => C10dReduceScatter,
            84 => C10dBarrier,
            70 => ProcessExec,
            71 => SchedSwitch,
            other => return Err(other),
        })
    }
}

/// Classification of a code object, written by userspace into the kernel's code map.
/// [`CodeClass::Pending`] is what the kernel inserts for a code object it sees first; userspace
/// then resolves the object and replaces it with a final class.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CodeClass {
    /// Seen by the kernel, not yet classified by userspace: events are still emitted.
    Pending = 0,
    /// Not interesting: the kernel emits nothing for it.
    Ignore = 1,
    /// `DataLoader` iterator `__next__`.
    DataLoaderNext = 2,
    /// `nn.Module.__call__` (`_wrapped_call_impl` / `_call_impl`).
    ModuleCall = 3,
    /// `Optimizer.step` (Python side; the record_function hook is preferred).
    OptimizerStep = 4,
    /// `Tensor.backward` / `torch.autograd.backward` (Python side, 3.9/3.10 only see it).
    Backward = 5,
}

impl TryFrom<u32> for CodeClass {
    type Error = u32;
    fn try_from(v: u32) -> Result<Self, u32> {
        Ok(match v {
            0 => CodeClass::Pending,
            1 => CodeClass::Ignore,
            2 => CodeClass::DataLoaderNext,
            3 => CodeClass::ModuleCall,
            4 => CodeClass::OptimizerStep,
            5 => CodeClass::Backward,
            other => return Err(other),
        })
    }
}

/// Indexes of the per-CPU loss counters (`LOSS` map).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossReason {
    /// `bpf_ringbuf_reserve` failed: the ring buffer was full.
    RingFull = 0,
    /// A `bpf_probe_read_user` of the target's memory failed.
    ReadFailed = 1,
    /// A per-thread state map was full.
    StateFull = 2,
    /// A call deeper than the probes follow: past the thread's stack of `TRACK_STACK` open
    /// calls, or past the kernel's uretprobe nesting limit. Neither it nor its return is
    /// reported (its time stays with its caller): not a lost event.
    DepthLimit = 3,
    /// `bpf_ringbuf_reserve` failed for an off-CPU record (sched_switch): counted apart, so the
    /// probes' own losses stay exact.
    OffCpuRingFull = 4,
}
pub const LOSS_REASONS: u32 = 5;

/// The kernel's record of a code object userspace has not classified yet.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Pending {
    /// `bpf_ktime_get_ns` of its first call.
    pub first_ns: u64,
    /// Calls reported so far.
    pub count: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<Pending>() == 16);

/// Indexes of the per-CPU probe statistics (`STATS` map): how often each program ran and why
/// a hit emitted nothing. For benchmarks and debugging; losses are in `LOSS`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stat {
    /// `py_enter` ran.
    PyEnter = 0,
    /// ... for a code object classified as uninteresting.
    PyIgnored = 1,
    /// ... for a not-yet-classified code object past its report limit.
    PendingCapped = 2,
    /// `call_enter` ran.
    CallEnter = 3,
    /// `any_exit` ran.
    Exit = 4,
    /// `record_enter` ran.
    RecordEnter = 5,
    /// `record_exit` ran.
    RecordExit = 6,
    /// `sched_switch` did a watched thread's work: the thread left its CPU (noted) or came
    /// back (its interval sent). Switches of other threads return at once and are not counted.
    Switch = 7,
}
pub const STATS_LEN: u32 = 8;

/// Indexes of the `CONFIG` array: settings userspace changes while the probes run.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Config {
    /// 1: every kernel launch is an event; 0: launches are only counted.
    LaunchEvents = 0,
}
pub const CONFIG_LEN: u32 = 4;

/// How a kernel launch reached the GPU, decided in the kernel from the launch probe's caller:
/// a driver entry point's return address lies in the text of a CUDA runtime (the runtime's own
/// launch, already counted at its runtime probe), of a library that carries its own static copy
/// of the runtime (cuBLAS, cuDNN, NCCL: they take driver pointers from `cuGetProcAddress`), or
/// elsewhere (Triton's launcher, inductor's static launcher: the driver called directly).
/// `Launch` events carry it in `args[2]`; the `LAUNCHES` counters are indexed by
/// `path * LAUNCH_PROBE_SLOTS + probe id`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LaunchPath {
    /// Recorded before launch paths were read: a runtime probe's launch is `Runtime`, a driver
    /// probe's `Direct`.
    Unknown = 0,
    /// A runtime entry point (`cudaLaunchKernel`…).
    Runtime = 1,
    /// A driver entry point called from inside a CUDA runtime's text: the same launch as the
    /// runtime probe's, not counted again.
    Nested = 2,
    /// A driver entry point called from a library with its own copy of the runtime.
    Library = 3,
    /// A driver entry point called from anywhere else.
    Direct = 4,
}
impl ProbeId {
    /// A driver launch entry point (`cuLaunchKernel`, `cuLaunchKernelEx`,
    /// `cuLaunchCooperativeKernel`, their `_ptsz` forms): its [`LaunchPath`] comes from its
    /// caller.
    pub const fn is_driver_launch(probe: u32) -> bool {
        probe == ProbeId::CuLaunchKernel as u32
            || probe == ProbeId::CuLaunchKernelEx as u32
            || probe == ProbeId::CuLaunchCooperativeKernel as u32
    }
}

/// Launch paths, for the `LAUNCHES` counters.
pub const LAUNCH_PATHS: u32 = 5;
/// Probe-id slots per launch path in the `LAUNCHES` counters (probe ids are below this).
pub const LAUNCH_PROBE_SLOTS: u32 = 128;

impl LaunchPath {
    pub fn from_u64(v: u64) -> LaunchPath {
        match v {
            1 => LaunchPath::Runtime,
            2 => LaunchPath::Nested,
            3 => LaunchPath::Library,
            4 => LaunchPath::Direct,
            _ => LaunchPath::Unknown,
        }
    }
}

/// Address ranges of the target's text that decide a driver launch's [`LaunchPath`]: one
/// value in the `CALLERS` array, written by userspace whenever the target maps a runtime or a
/// library with its own runtime. Ranges past `len` are ignored; a caller in none is `Direct`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CallerRanges {
    pub len: u32,
    pub _pad: u32,
    pub start: [u64; CALLER_RANGES],
    pub end: [u64; CALLER_RANGES],
    /// [`LaunchPath`] as `u32`: `Nested` for a runtime's text, `Library` for the others.
    pub path: [u32; CALLER_RANGES],
}
/// At most this many executable ranges are told apart (each library maps one or two).
pub const CALLER_RANGES: usize = 32;

impl CallerRanges {
    pub const fn empty() -> Self {
        CallerRanges {
            len: 0,
            _pad: 0,
            start: [0; CALLER_RANGES],
            end: [0; CALLER_RANGES],
            path: [0; CALLER_RANGES],
        }
    }
}

/// Per-thread state the eBPF side keeps: a small stack of the open calls it reported (tracked
/// Python frames and native calls with an exit probe). Each entry holds the stack pointer at entry,
/// so the return probe matches its frame exactly (after `ret`, `rsp` is the entry `rsp` + 8) and
/// drops entries whose return was never seen (the kernel omits uretprobes past its nesting limit).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ThreadState {
    /// Number of valid entries.
    pub len: u32,
    /// Entries that did not fit, or whose return was never seen.
    pub overflow: u32,
    /// `rsp` at entry of each open call.
    pub entry_sp: [u64; TRACK_STACK],
    /// Code object address (Python frames) or first argument (native calls).
    pub id: [u64; TRACK_STACK],
    /// `probe << 16 | class` (see [`ProbeId`] and [`CodeClass`]).
    pub tag: [u32; TRACK_STACK],
}
/// Depth of that stack; a power of two (the eBPF side masks indexes with it).
/// As deep as the kernel's uretprobe nesting limit: deeper calls get no return probe anyway.
pub const TRACK_STACK: usize = 64;
const _: () = assert!(TRACK_STACK.is_power_of_two());
const _: () =
    assert!(size_of::<ThreadState>() == 8 + 8 * TRACK_STACK + 8 * TRACK_STACK + 4 * TRACK_STACK);

const _: () = assert!(size_of::<CallerRanges>() == 8 + 16 * CALLER_RANGES + 4 * CALLER_RANGES);
const _: () = assert!(LAUNCH_PATHS * LAUNCH_PROBE_SLOTS <= 1024);

#[cfg(feature = "user")]
mod user {
    // SAFETY: plain `#[repr(C)]` data of integers only, no padding (size asserted above).
    unsafe impl aya::Pod for super::RawEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ThreadState {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Pending {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::OffCpuSince {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::CallerRanges {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip() {
        for k in 0..100u32 {
            if let Ok(kind) = EventKind::try_from(k) {
                assert_eq!(kind as u32, k);
            }
            if let Ok(p) = ProbeId::try_from(k) {
                assert_eq!(p as u32, k);
            }
            if let Ok(c) = CodeClass::try_from(k) {
                assert_eq!(c as u32, k);
            }
        }
        assert_eq!(EventKind::try_from(0), Err(0));
        assert_eq!(ProbeId::try_from(52), Ok(ProbeId::TorchBackward));
        assert_eq!(ProbeId::try_from(18), Ok(ProbeId::CudaMemcpyPeerAsync));
        assert_eq!(
            ProbeId::try_from(39),
            Ok(ProbeId::CuLaunchCooperativeKernel)
        );
        assert_eq!(ProbeId::try_from(69), Ok(ProbeId::NcclScatter));
        // Launch ids index the kernel's per-probe launch counters of each path.
        for p in [
            ProbeId::CudaLaunchKernel,
            ProbeId::CudaLaunchKernelExC,
            ProbeId::CudaGraphLaunch,
            ProbeId::CuLaunchKernel,
            ProbeId::CuLaunchKernelEx,
            ProbeId::CuLaunchCooperativeKernel,
        ] {
            assert!((p as u32) < LAUNCH_PROBE_SLOTS);
        }
        assert!(ProbeId::is_driver_launch(
            ProbeId::CuLaunchCooperativeKernel as u32
        ));
        assert!(!ProbeId::is_driver_launch(ProbeId::CudaLaunchKernel as u32));
        for k in 0..4u32 {
            if let Ok(s) = OffCpuState::try_from(k) {
                assert_eq!(s as u32, k);
            }
        }
    }

    #[test]
    fn off_cpu_state_from_the_switch() {
        assert_eq!(OffCpuState::from_switch(true, 1), OffCpuState::Runnable);
        assert_eq!(OffCpuState::from_switch(false, 0), OffCpuState::Runnable);
        assert_eq!(OffCpuState::from_switch(false, 1), OffCpuState::Sleeping);
        assert_eq!(
            OffCpuState::from_switch(false, 2),
            OffCpuState::Uninterruptible
        );
        // TASK_IDLE (uninterruptible, not counted as load): not I/O.
        assert_eq!(
            OffCpuState::from_switch(false, 0x402),
            OffCpuState::Sleeping
        );
    }
}
