//! The kernel side of traceml-daemon: uprobes on CPython's frame evaluator, torch's native entry
//! points and the CUDA runtime/driver, writing fixed-size [`RawEvent`]s into one ring buffer.
//!
//! Per-hit work is kept tiny (the measured costs: docs/overhead.md, BENCHMARKS.md): one map lookup,
//! at most one user-memory read, one ring-buffer reservation submitted without wakeup (userspace
//! polls). Every failure is counted in `LOSS` so the summary can say what was lost, and the rare
//! ones (a failed read, a full state map or stack, a full ring buffer) are also logged through
//! `aya-log`, rate-limited by that count (see [`lose`]).
#![no_std]
#![no_main]

use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns,
        bpf_probe_read_kernel, bpf_probe_read_user, bpf_probe_read_user_str_bytes,
        generated::bpf_get_attach_cookie,
    },
    macros::{map, raw_tracepoint, uprobe, uretprobe},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
    programs::{ProbeContext, RawTracePointContext, RetProbeContext},
};
use aya_log_ebpf::{debug, warn};
use traceml_common::{
    CALLER_RANGES, CONFIG_LEN, CallerRanges, CodeClass, Config, EventKind, FLAG_RAISED,
    FLAG_TRUNCATED, LAUNCH_PATHS, LAUNCH_PROBE_SLOTS, LOSS_REASONS, LaunchPath, LossReason,
    NAME_BYTES, OffCpuSince, OffCpuState, Pending, ProbeId, RawEvent, STATS_LEN, Stat, TRACK_STACK,
    ThreadState,
};

const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
const BPF_F_NO_PREALLOC: u32 = 1;
/// A code object userspace has not classified yet is reported for every call during its first
/// PENDING_GRACE_NS (userspace classifies within a poll or two, and a fast loop's first calls
/// count), then for PENDING_EMIT_LIMIT calls at most: a hot function nobody classifies (the
/// daemon fell behind) must not flood the ring buffer.
const PENDING_EMIT_LIMIT: u32 = 8;
const PENDING_GRACE_NS: u64 = 100_000_000;

// Globals set by the loader (`EbpfLoader::override_global`) for the target's CPython version.
/// Offset of the code object pointer in the frame passed to `_PyEval_EvalFrameDefault`.
#[unsafe(no_mangle)]
static FRAME_CODE_OFFSET: u64 = 0;
/// Mask applied to that pointer (3.14 tags `_PyStackRef`s in the low bits).
#[unsafe(no_mangle)]
static CODE_PTR_MASK: u64 = u64::MAX;
/// Offset of `co_name` in the code object (from `PyCode_Type.tp_members`); 0 to skip.
#[unsafe(no_mangle)]
static CODE_NAME_OFFSET: u64 = 0;

/// The target's process id (tgid), for the programs that run for every process.
#[unsafe(no_mangle)]
static TARGET_TGID: u32 = 0;

/// Offsets in `struct task_struct` of `pid` (the thread id) and `__state` (`state` before
/// Linux 5.14), from the kernel's BTF; 0: not known, and the scheduler program does nothing.
#[unsafe(no_mangle)]
static TASK_PID_OFFSET: u64 = 0;
#[unsafe(no_mangle)]
static TASK_STATE_OFFSET: u64 = 0;
/// 1 when `tgid` follows `pid` in `task_struct` (every kernel so far): one 8-byte read gives
/// both, and a switch to another process's thread returns before any map lookup.
#[unsafe(no_mangle)]
static TASK_TGID_AFTER_PID: u64 = 0;

#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(8 << 20, 0);
/// Code object address -> [`CodeClass`], written by userspace only. A plain hash map, allocated
/// on demand: an LRU map evicts classes of hot code objects under the churn of `import torch`
/// (tens of thousands of code objects), which silenced them.
#[map]
static CODE_CLASS: HashMap<u64, u32> = HashMap::with_max_entries(1 << 18, BPF_F_NO_PREALLOC);
/// Code object address -> calls reported while it is not classified.
#[map]
static PENDING: LruHashMap<u64, Pending> = LruHashMap::with_max_entries(1 << 14, 0);
/// Thread id -> open tracked calls.
#[map]
static THREADS: LruHashMap<u32, ThreadState> = LruHashMap::with_max_entries(1 << 14, 0);
/// One zeroed [`ThreadState`], the template for new threads.
#[map]
static ZERO_STATE: PerCpuArray<ThreadState> = PerCpuArray::with_max_entries(1, 0);
/// Per-CPU event sequence number.
#[map]
static SEQ: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
/// Per-CPU loss counters, indexed by [`LossReason`].
#[map]
static LOSS: PerCpuArray<u64> = PerCpuArray::with_max_entries(LOSS_REASONS, 0);
/// Per-CPU probe statistics, indexed by [`Stat`] (hits and why they emitted nothing).
#[map]
static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(STATS_LEN, 0);
/// Settings userspace may change while probes run (the overhead governor), indexed by
/// [`Config`]: 1 in `LaunchEvents` makes every kernel launch an event, 0 only counts it.
#[map]
static CONFIG: Array<u32> = Array::with_max_entries(CONFIG_LEN, 0);
/// Thread id -> when a watched thread of the target left its CPU, and why (see
/// [`sched_switch`]). LRU: a thread that exits while off its CPU never comes back to remove it.
#[map]
static OFFCPU: LruHashMap<u32, OffCpuSince> = LruHashMap::with_max_entries(1 << 12, 0);
/// Per-CPU launch counters (both modes), indexed by `path * LAUNCH_PROBE_SLOTS + probe id`
/// ([`LaunchPath`]).
#[map]
static LAUNCHES: PerCpuArray<u64> =
    PerCpuArray::with_max_entries(LAUNCH_PATHS * LAUNCH_PROBE_SLOTS, 0);
/// Entry `rsp` of an open `cuGetProcAddress` call -> (symbol name pointer, `pfn` pointer), for
/// [`procaddr_exit`]. Keyed by the stack pointer: unique among the threads of the target, and
/// a nested call (`_v2` calling the plain form) has its own.
#[map]
static PROCADDR: LruHashMap<u64, [u64; 2]> = LruHashMap::with_max_entries(1 << 10, 0);
/// The text ranges that decide a driver launch's path ([`CallerRanges`], one value), written by
/// userspace when the target maps a CUDA runtime or a library with its own runtime copy.
#[map]
static CALLERS: Array<CallerRanges> = Array::with_max_entries(1, 0);

#[inline(always)]
fn global<T: Copy>(g: &T) -> T {
    // SAFETY: the loader may rewrite the global before load; a volatile read keeps the compiler
    // from folding the compile-time value.
    unsafe { core::ptr::read_volatile(g) }
}

#[inline(always)]
fn bump(map: &PerCpuArray<u64>, index: u32) {
    if let Some(p) = map.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, and a CPU runs one BPF program at a time in this context.
        unsafe { *p += 1 };
    }
}

/// Counts one loss on this CPU; returns the new count when it is a power of two (1, 2, 4, ...),
/// the only times the caller logs it: a flood of failures costs a counter bump each and
/// log2(n) log lines per CPU. The log macros take no real context here (`&()`: aya-log-ebpf only
/// names it), so helpers without one can log too.
#[inline(always)]
fn lose(reason: LossReason) -> Option<u64> {
    let p = LOSS.get_ptr_mut(reason as u32)?;
    // SAFETY: per-CPU slot, and a CPU runs one BPF program at a time in this context.
    let n = unsafe {
        *p += 1;
        *p
    };
    (n & (n - 1) == 0).then_some(n)
}

/// (pid, tid) of the current thread, for log lines.
#[inline(always)]
fn current() -> (u32, u32) {
    let pid_tgid = bpf_get_current_pid_tgid();
    ((pid_tgid >> 32) as u32, pid_tgid as u32)
}

/// Reserves and fills one event; the caller may set `args`/`flags` through `fill`.
#[inline(always)]
fn emit(kind: EventKind, probe: u32, fill: impl FnOnce(&mut RawEvent)) {
    emit_with(kind, probe, BPF_RB_NO_WAKEUP, fill)
}

/// [`emit`] with explicit submit flags: events userspace must see at once (a code object it has
/// not classified) wake it; all others wait for its next poll.
#[inline(always)]
fn emit_with(kind: EventKind, probe: u32, submit: u64, fill: impl FnOnce(&mut RawEvent)) {
    let seq = match SEQ.get_ptr_mut(0) {
        // SAFETY: per-CPU slot.
        Some(p) => unsafe {
            *p += 1;
            *p
        },
        None => 0,
    };
    let Some(mut entry) = EVENTS.reserve::<RawEvent>(0) else {
        let reason = if kind == EventKind::OffCpu {
            LossReason::OffCpuRingFull
        } else {
            LossReason::RingFull
        };
        if let Some(n) = lose(reason) {
            let (pid, tid) = current();
            warn!(
                &(),
                "probe id {}: ring buffer full, event of kind {} dropped (pid {} tid {}); count on this CPU: {}",
                probe,
                kind as u32,
                pid,
                tid,
                n
            );
        }
        return;
    };
    let pid_tgid = bpf_get_current_pid_tgid();
    let mut ev = RawEvent::zeroed();
    ev.kind = kind as u32;
    ev.probe = probe;
    // SAFETY: helper without preconditions.
    ev.ts_ns = unsafe { bpf_ktime_get_ns() };
    ev.seq = seq;
    ev.tgid = (pid_tgid >> 32) as u32;
    ev.tid = pid_tgid as u32;
    // SAFETY: helper without preconditions.
    ev.cpu = unsafe { bpf_get_smp_processor_id() };
    fill(&mut ev);
    entry.write(ev);
    entry.submit(submit);
}

#[inline(always)]
fn thread_state(tid: u32, probe: u32) -> Option<*mut ThreadState> {
    if let Some(p) = THREADS.get_ptr_mut(tid) {
        return Some(p);
    }
    // A ThreadState is too large for the 512-byte eBPF stack: insert from a zeroed map slot.
    let fresh = ZERO_STATE.get_ptr(0)?;
    // SAFETY: a valid map value pointer, read by the helper.
    if THREADS.insert(tid, unsafe { &*fresh }, 0).is_err() {
        if let Some(n) = lose(LossReason::StateFull) {
            let (pid, _) = current();
            warn!(
                &(),
                "probe id {}: per-thread state map full, tid {} of pid {} not tracked; count on this CPU: {}",
                probe,
                tid,
                pid,
                n
            );
        }
        return None;
    }
    THREADS.get_ptr_mut(tid)
}

/// Pushes an open call; false when the stack is full (the call is then not reported).
#[inline(always)]
fn push(st: &mut ThreadState, sp: u64, id: u64, tag: u32) -> bool {
    if st.len as usize >= TRACK_STACK {
        st.overflow += 1;
        if let Some(n) = lose(LossReason::DepthLimit) {
            let (pid, tid) = current();
            debug!(
                &(),
                "probe id {}: per-thread stack of open calls full ({} deep), call not tracked (pid {} tid {}); count on this CPU: {}",
                tag >> 16,
                TRACK_STACK as u32,
                pid,
                tid,
                n
            );
        }
        return false;
    }
    // The mask (TRACK_STACK is a power of two) bounds the index in the very register used for
    // the access, which is what the verifier tracks; the compiler may check a copy instead.
    let i = st.len as usize & (TRACK_STACK - 1);
    // SAFETY: `i < TRACK_STACK` by the mask.
    unsafe {
        *st.entry_sp.get_unchecked_mut(i) = sp;
        *st.id.get_unchecked_mut(i) = id;
        *st.tag.get_unchecked_mut(i) = tag;
    }
    st.len += 1;
    true
}

/// Pops every open call deeper than the returning frame; returns the returning frame's entry
/// when it was tracked (its entry `rsp` is the return `rsp` - 8).
#[inline(always)]
fn pop_matching(st: &mut ThreadState, ret_sp: u64) -> Option<(u64, u32)> {
    for _ in 0..TRACK_STACK {
        let len = st.len as usize;
        if len == 0 || len > TRACK_STACK {
            return None;
        }
        let top = (len - 1) & (TRACK_STACK - 1);
        // SAFETY: `top < TRACK_STACK` by the mask (see `push`).
        let sp = unsafe { *st.entry_sp.get_unchecked(top) };
        if sp >= ret_sp {
            // The top entry belongs to an outer frame still running.
            return None;
        }
        st.len -= 1;
        if sp + 8 == ret_sp {
            // SAFETY: as above.
            return Some(unsafe { (*st.id.get_unchecked(top), *st.tag.get_unchecked(top)) });
        }
        // Deeper entry whose return was never seen.
        st.overflow += 1;
    }
    None
}

#[inline(always)]
fn cookie<C: EbpfContext>(ctx: &C) -> u32 {
    // SAFETY: the context pointer is the program's own context.
    unsafe { bpf_get_attach_cookie(ctx.as_ptr()) as u32 }
}

#[inline(always)]
fn regs_sp(ctx: &ProbeContext) -> u64 {
    // SAFETY: `regs` points at the probed thread's saved registers for the life of the program.
    unsafe { (*ctx.regs).rsp }
}

/// Entry of `_PyEval_EvalFrameDefault(tstate, frame, throwflag)` (3.9+).
#[uprobe]
pub fn py_enter(ctx: ProbeContext) -> u32 {
    let _ = try_py_enter(&ctx);
    0
}

fn try_py_enter(ctx: &ProbeContext) -> Option<()> {
    bump(&STATS, Stat::PyEnter as u32);
    let tstate: u64 = ctx.arg(0)?;
    let frame: u64 = ctx.arg(1)?;
    let at = frame.wrapping_add(global(&FRAME_CODE_OFFSET));
    // SAFETY: reading the target's memory through the checked helper.
    let code = match unsafe { bpf_probe_read_user(at as *const u64) } {
        Ok(c) => c & global(&CODE_PTR_MASK),
        Err(_) => {
            if let Some(n) = lose(LossReason::ReadFailed) {
                let (pid, tid) = current();
                debug!(
                    ctx,
                    "py_enter: cannot read the code object of frame {:x} (pid {} tid {}); failed reads on this CPU: {}",
                    frame,
                    pid,
                    tid,
                    n
                );
            }
            return None;
        }
    };
    // A code object's identity is its address mixed with its name's address: a freed code
    // object's address reused by another (common with exec'd or generated code) is then a new
    // identity, not a stale classification.
    let name_off = global(&CODE_NAME_OFFSET);
    let name = if name_off == 0 {
        0
    } else {
        // SAFETY: checked read of the target's memory.
        unsafe { bpf_probe_read_user((code + name_off) as *const u64) }.unwrap_or(0)
    };
    let id = code ^ name.rotate_left(32);
    let code_addr = code;
    let code = id;
    // Only userspace writes CODE_CLASS (the kernel writing through a value pointer while
    // userspace replaces the element would write into a recycled node). Unclassified code objects
    // are rate-limited through PENDING (see PENDING_GRACE_NS); userspace deletes the entry when
    // it classifies.
    let class = match CODE_CLASS.get_ptr(code) {
        // SAFETY: a plain copy out of the map value.
        Some(p) => unsafe { *p },
        None => {
            // SAFETY: helper without preconditions.
            let now = unsafe { bpf_ktime_get_ns() };
            match PENDING.get_ptr_mut(code) {
                // SAFETY: this key's value; a race between CPUs only miscounts the cap.
                Some(p) => unsafe {
                    let p = &mut *p;
                    if p.count >= PENDING_EMIT_LIMIT
                        && now.wrapping_sub(p.first_ns) > PENDING_GRACE_NS
                    {
                        bump(&STATS, Stat::PendingCapped as u32);
                        return Some(());
                    }
                    p.count += 1;
                },
                None => {
                    let _ = PENDING.insert(
                        code,
                        Pending {
                            first_ns: now,
                            count: 1,
                            _pad: 0,
                        },
                        0,
                    );
                }
            }
            CodeClass::Pending as u32
        }
    };
    if class == CodeClass::Ignore as u32 {
        bump(&STATS, Stat::PyIgnored as u32);
        return Some(());
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: pointer into the map value of this thread; only this thread touches it.
    let st = unsafe { &mut *thread_state(tid, ProbeId::PyEval as u32)? };
    let sp = regs_sp(ctx);
    let tag = ((ProbeId::PyEval as u32) << 16) | class;
    if !push(st, sp, code, tag) {
        return None;
    }
    let depth = st.len as u64;
    // Userspace reads the names of a new code object from the target's memory: wake it now,
    // while the object (and the process) still exist.
    let submit = if class == CodeClass::Pending as u32 {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    emit_with(EventKind::PyEnter, ProbeId::PyEval as u32, submit, |e| {
        e.args = [code, class as u64, depth, code_addr, tstate];
    });
    Some(())
}

/// Entry of a native call with an exit probe (copies, syncs, backward). The cookie is the
/// [`ProbeId`]; arguments are decoded here because they are gone at return.
#[uprobe]
pub fn call_enter(ctx: ProbeContext) -> u32 {
    let _ = try_call_enter(&ctx);
    0
}

fn try_call_enter(ctx: &ProbeContext) -> Option<()> {
    bump(&STATS, Stat::CallEnter as u32);
    let probe = cookie(ctx);
    let a0: u64 = ctx.arg(0).unwrap_or(0);
    let a1: u64 = ctx.arg(1).unwrap_or(0);
    let a2: u64 = ctx.arg(2).unwrap_or(0);
    let a3: u64 = ctx.arg(3).unwrap_or(0);
    let a4: u64 = ctx.arg(4).unwrap_or(0);
    // args: [bytes, memcpy kind, dst, src, stream] for copies, [handle, ...] otherwise.
    let args = if probe == ProbeId::CudaMemcpy as u32 || probe == ProbeId::CudaMemcpyAsync as u32 {
        [a2, a3, a0, a1, a4]
    } else if probe == ProbeId::CudaMemcpyPeerAsync as u32 {
        // `cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream)`: device to device.
        let a5: u64 = ctx.arg(5).unwrap_or(0);
        [a4, 3, a0, a2, a5]
    } else if probe == ProbeId::CuMemcpyHtoD as u32 || probe == ProbeId::CuMemcpyHtoDAsync as u32 {
        [a2, 1, a0, a1, a3]
    } else if probe == ProbeId::CuMemcpyDtoH as u32 || probe == ProbeId::CuMemcpyDtoHAsync as u32 {
        [a2, 2, a0, a1, a3]
    } else {
        [a0, a1, a2, a3, a4]
    };
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: this thread's map value.
    let st = unsafe { &mut *thread_state(tid, probe)? };
    if !push(st, regs_sp(ctx), a0, probe << 16) {
        return None;
    }
    emit(EventKind::CallEnter, probe, |e| e.args = args);
    Some(())
}

/// Return of `_PyEval_EvalFrameDefault` and of every `call_enter` function.
#[uretprobe]
pub fn any_exit(ctx: RetProbeContext) -> u32 {
    let _ = try_any_exit(&ctx);
    0
}

fn try_any_exit(ctx: &RetProbeContext) -> Option<()> {
    bump(&STATS, Stat::Exit as u32);
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: this thread's map value; absent means nothing of this thread is open.
    let st = unsafe { &mut *THREADS.get_ptr_mut(tid)? };
    // SAFETY: saved registers of the returning thread.
    let (sp, ret) = unsafe { ((*ctx.regs).rsp, (*ctx.regs).rax) };
    let (id, tag) = pop_matching(st, sp)?;
    let probe = tag >> 16;
    let depth = st.len as u64 + 1;
    if probe == ProbeId::PyEval as u32 {
        let class = (tag & 0xffff) as u64;
        emit(EventKind::PyExit, probe, |e| {
            e.args = [id, class, depth, ret, 0];
            if ret == 0 {
                e.flags = FLAG_RAISED;
            }
        });
    } else {
        emit(EventKind::CallExit, probe, |e| {
            e.args = [ret, id, depth, 0, 0]
        });
    }
    Some(())
}

/// Kernel launches: counted per probe and [`LaunchPath`], and an event each unless
/// `LAUNCH_EVENTS` is 0. A runtime entry point is the runtime's launch. A driver entry point's
/// path is its caller's: its return address (at `rsp` on entry, one read) inside a CUDA
/// runtime's text is the runtime's own launch (already counted, `Nested`), inside a library
/// with its own runtime copy `Library`, elsewhere `Direct` (see [`caller_path`]).
#[uprobe]
pub fn launch(ctx: ProbeContext) -> u32 {
    let probe = cookie(&ctx);
    let sp = regs_sp(&ctx);
    let (path, ret) = if ProbeId::is_driver_launch(probe) {
        // SAFETY: checked read of the target's stack.
        let ret = unsafe { bpf_probe_read_user(sp as *const u64) }.unwrap_or(0);
        (caller_path(ret), ret)
    } else {
        (LaunchPath::Runtime as u32, 0)
    };
    bump(&LAUNCHES, path * LAUNCH_PROBE_SLOTS + probe);
    if CONFIG
        .get(Config::LaunchEvents as u32)
        .is_some_and(|&v| v != 0)
    {
        let (f, stream) = launch_args(&ctx, probe, sp);
        emit(EventKind::Launch, probe, |e| {
            e.args = [f, stream, path as u64, ret, 0]
        });
    }
    0
}

/// The [`LaunchPath`] of a driver launch returning to `ret`: the first range of `CALLERS`
/// holding it, else `Direct`.
#[inline(always)]
fn caller_path(ret: u64) -> u32 {
    let Some(r) = CALLERS.get(0) else {
        return LaunchPath::Direct as u32;
    };
    let n = r.len as usize;
    for i in 0..CALLER_RANGES {
        if i >= n {
            break;
        }
        if r.start[i] <= ret && ret < r.end[i] {
            return r.path[i];
        }
    }
    LaunchPath::Direct as u32
}

/// (function or graph, stream) of a launch, each API's own way (event mode only: one more read
/// where the stream is on the stack or in a config struct):
/// `cudaLaunchKernel(func, dim3 grid, dim3 block, args, sharedMem, stream)`: the dim3s take two
/// registers each, so `stream` is the second stack argument; `cuLaunchKernel(f, gx, gy, gz, bx,
/// by, bz, sharedMem, hStream, …)` and `cuLaunchCooperativeKernel` (same head): the third; the `Ex` forms take a config whose stream is at
/// offset 32 (`cudaLaunchConfig_t` after two dim3s and a size_t; `CUlaunchConfig` after seven
/// unsigned ints and padding) and the function second; graph launches `(exec, stream)`.
#[inline(always)]
fn launch_args(ctx: &ProbeContext, probe: u32, sp: u64) -> (u64, u64) {
    let a = |i| ctx.arg::<u64>(i).unwrap_or(0);
    let at = |p: u64| {
        // SAFETY: checked read of the target's memory.
        unsafe { bpf_probe_read_user(p as *const u64) }.unwrap_or(0)
    };
    if probe == ProbeId::CudaLaunchKernel as u32 {
        (a(0), at(sp + 16))
    } else if probe == ProbeId::CuLaunchKernel as u32
        || probe == ProbeId::CuLaunchCooperativeKernel as u32
    {
        (a(0), at(sp + 24))
    } else if probe == ProbeId::CudaLaunchKernelExC as u32
        || probe == ProbeId::CuLaunchKernelEx as u32
    {
        (a(1), at(a(0) + 32))
    } else {
        (a(0), a(1))
    }
}

/// Entry of `cuGetProcAddress(symbol, pfn, …)` (and `_v2`): where its answer will be written,
/// for [`procaddr_exit`]. Runs at library load (a runtime copy asks for a few hundred entry
/// points once), never per launch.
#[uprobe]
pub fn procaddr_enter(ctx: ProbeContext) -> u32 {
    bump(&STATS, Stat::CallEnter as u32);
    let symbol: u64 = ctx.arg(0).unwrap_or(0);
    let pfn: u64 = ctx.arg(1).unwrap_or(0);
    let _ = PROCADDR.insert(&regs_sp(&ctx), &[symbol, pfn], 0);
    0
}

/// Return of `cuGetProcAddress`: on success (`CUDA_SUCCESS`, 0) a [`EventKind::ProcAddress`]
/// event with the pointer written to `*pfn` and the name asked for; it wakes userspace, which
/// places the probe of that entry point on the pointer before the library uses it.
#[uretprobe]
pub fn procaddr_exit(ctx: RetProbeContext) -> u32 {
    bump(&STATS, Stat::Exit as u32);
    // SAFETY: saved registers of the returning thread.
    let (sp, ret) = unsafe { ((*ctx.regs).rsp, (*ctx.regs).rax) };
    let key = sp.wrapping_sub(8);
    // SAFETY: a map value of this program's own map, copied out before removal.
    let Some(&[symbol, pfn]) = (unsafe { PROCADDR.get(&key) }) else {
        return 0;
    };
    let _ = PROCADDR.remove(&key);
    if ret as u32 != 0 {
        return 0;
    }
    // SAFETY: checked read of the target's memory.
    let Ok(ptr) = (unsafe { bpf_probe_read_user(pfn as *const u64) }) else {
        if let Some(n) = lose(LossReason::ReadFailed) {
            let (pid, tid) = current();
            debug!(
                &ctx,
                "procaddr_exit: cannot read the pointer written at {:x} (pid {} tid {}); failed reads on this CPU: {}",
                pfn,
                pid,
                tid,
                n
            );
        }
        return 0;
    };
    emit_with(
        EventKind::ProcAddress,
        ProbeId::CuGetProcAddress as u32,
        BPF_RB_FORCE_WAKEUP,
        |e| {
            let mut words = [0u64; 5];
            // SAFETY: a byte view of the last four words (32 bytes), plus the spare fifth.
            let buf =
                unsafe { core::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), 33) };
            // SAFETY: checked read of the target's memory into a local buffer.
            let _ = unsafe { bpf_probe_read_user_str_bytes(symbol as *const u8, buf) };
            e.args = [ptr, words[0], words[1], words[2], words[3]];
        },
    );
    0
}

/// `c10::intrusive_ptr<PythonRecordFunction> record_function_enter_new(const std::string& name,
/// const std::optional<std::string>& args)`. The result is a class with a non-trivial
/// destructor, so the Itanium ABI returns it through a hidden pointer in the first register: the
/// name is the *second* argument. Both libstdc++ string ABIs start with the pointer to the
/// NUL-terminated characters.
#[uprobe]
pub fn record_enter(ctx: ProbeContext) -> u32 {
    bump(&STATS, Stat::RecordEnter as u32);
    let probe = cookie(&ctx);
    let s: u64 = ctx.arg(1).unwrap_or(0);
    // SAFETY: checked read of the target's memory.
    let data = match unsafe { bpf_probe_read_user(s as *const u64) } {
        Ok(d) => d,
        Err(_) => {
            if let Some(n) = lose(LossReason::ReadFailed) {
                let (pid, tid) = current();
                debug!(
                    &ctx,
                    "record_enter (probe id {}): cannot read the record name's std::string at {:x} (pid {} tid {}); failed reads on this CPU: {}",
                    probe,
                    s,
                    pid,
                    tid,
                    n
                );
            }
            0
        }
    };
    emit(EventKind::RecordEnter, probe, |e| {
        // Read the name straight into the payload words (plus one spare word for the NUL), so no
        // byte shuffling (and no bounds checks) is needed.
        let mut words = [0u64; 6];
        // SAFETY: a byte view of `words` (48 bytes, u8 has no alignment needs).
        let buf = unsafe {
            core::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), NAME_BYTES + 1)
        };
        // SAFETY: checked read of the target's memory into a local buffer.
        if let Ok(bytes) = unsafe { bpf_probe_read_user_str_bytes(data as *const u8, buf) } {
            if bytes.len() >= NAME_BYTES {
                e.flags = FLAG_TRUNCATED;
            }
        }
        e.args = [words[0], words[1], words[2], words[3], words[4]];
    });
    0
}

/// `record_function_exit*`: closes the innermost open record of the thread.
#[uprobe]
pub fn record_exit(ctx: ProbeContext) -> u32 {
    bump(&STATS, Stat::RecordExit as u32);
    emit(EventKind::RecordExit, cookie(&ctx), |_| {});
    0
}

/// An entry marker of a native function that has no return probe (C++ that can throw, or a
/// call whose end is another function's entry): a `CallEnter` event with its first five
/// arguments, nothing pushed on the thread's stack of open calls (no return will pop it).
#[uprobe]
pub fn mark_enter(ctx: ProbeContext) -> u32 {
    bump(&STATS, Stat::CallEnter as u32);
    let probe = cookie(&ctx);
    let a = |i| ctx.arg::<u64>(i).unwrap_or(0);
    let args = [a(0), a(1), a(2), a(3), a(4)];
    emit(EventKind::CallEnter, probe, |e| e.args = args);
    0
}

/// The end of what a [`mark_enter`] of the same probe id started: the entry of the function
/// that follows it. A `CallExit` event, nothing popped.
#[uprobe]
pub fn mark_exit(ctx: ProbeContext) -> u32 {
    bump(&STATS, Stat::CallEnter as u32);
    emit(EventKind::CallExit, cookie(&ctx), |e| {
        e.args = [0, 0, 1, 0, 0]
    });
    0
}

/// `sched_process_exec` (every exec on the host: one compare for the others): the target
/// exec'd. The uprobes placed in its old program stay registered on its task and fire in the
/// new one (same libraries, same task) until userspace removes them; this event, in timestamp
/// order with the rest, is where the run ends. Wakes userspace. The exec'ing thread (now the
/// leader, `tid == tgid`; `old_pid` before) stops being watched: its switches in the new
/// program are not the old program's time.
#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn process_exec(ctx: RawTracePointContext) -> i32 {
    let (tgid, tid) = current();
    let target = global(&TARGET_TGID);
    if target == 0 || tgid != target {
        return 0;
    }
    emit_with(
        EventKind::Exec,
        ProbeId::ProcessExec as u32,
        BPF_RB_FORCE_WAKEUP,
        |_| {},
    );
    // TP_PROTO(struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm).
    let old_pid: u64 = ctx.arg(1);
    for t in [tid, old_pid as u32] {
        let _ = THREADS.remove(&t);
        let _ = OFFCPU.remove(&t);
    }
    0
}

/// `c10::GradMode::set_enabled(bool)`: the calling thread switched autograd's grad mode
/// (`torch.no_grad()`, `set_grad_enabled`, the optimizer's own guard around its update). A
/// [`EventKind::GradMode`] event with the new mode: how the engine tells evaluation (grad mode
/// off outside an optimizer step) from training.
#[uprobe]
pub fn grad_mode(ctx: ProbeContext) -> u32 {
    bump(&STATS, Stat::CallEnter as u32);
    let enabled = ctx.arg::<u64>(0).unwrap_or(1) & 1 != 0;
    emit(EventKind::GradMode, cookie(&ctx), |e| {
        e.args[0] = u64::from(enabled)
    });
    0
}

/// Reads a `T` at `base + offset` of kernel memory.
#[inline(always)]
fn kernel_read<T>(base: u64, offset: u64) -> Option<T> {
    // SAFETY: the helper checks the address; a failed read returns an error.
    unsafe { bpf_probe_read_kernel((base + offset) as *const T).ok() }
}

/// `sched_switch` (every context switch on the host): the on-CPU / off-CPU accounting of the
/// target's watched threads, those the probes keep state for (`THREADS`: the threads that run
/// the training loop's probed calls; not torch's intra-op pool). A watched thread leaving its
/// CPU notes when and why in `OFFCPU`; when it is switched back in, one [`EventKind::OffCpu`]
/// event carries the whole interval. A switch between other processes' threads costs a
/// compare and one kernel read (the incoming thread's pid and tgid), or one hash lookup more
/// where `tgid` does not follow `pid` (`BENCHMARKS.md`: the node's cost per context switch).
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn sched_switch(ctx: RawTracePointContext) -> i32 {
    let target = global(&TARGET_TGID);
    let pid_off = global(&TASK_PID_OFFSET);
    if target == 0 || pid_off == 0 {
        return 0;
    }
    // TP_PROTO(bool preempt, struct task_struct *prev, struct task_struct *next, ...).
    let prev: u64 = ctx.arg(1);
    let next: u64 = ctx.arg(2);
    let (tgid, tid) = current();
    if tgid == target && THREADS.get_ptr(tid).is_some() {
        let preempt: u64 = ctx.arg(0);
        let state_off = global(&TASK_STATE_OFFSET);
        let state: u32 = if state_off == 0 {
            1
        } else {
            kernel_read(prev, state_off).unwrap_or(1)
        };
        let since = OffCpuSince {
            // SAFETY: helper without preconditions.
            ts_ns: unsafe { bpf_ktime_get_ns() },
            state: OffCpuState::from_switch(preempt & 0xff != 0, state) as u32,
            _pad: 0,
        };
        let _ = OFFCPU.insert(tid, &since, 0);
        bump(&STATS, Stat::Switch as u32);
    }
    let next_tid = if global(&TASK_TGID_AFTER_PID) != 0 {
        // Little-endian (x86-64, arm64): pid in the low half, tgid in the high one.
        let Some(ids) = kernel_read::<u64>(next, pid_off) else {
            return 0;
        };
        if (ids >> 32) as u32 != target {
            return 0;
        }
        ids as u32
    } else {
        let Some(t) = kernel_read::<u32>(next, pid_off) else {
            return 0;
        };
        t
    };
    if next_tid == 0 {
        return 0;
    }
    // SAFETY: a copy is taken before the entry is removed.
    let Some(since) = (unsafe { OFFCPU.get(next_tid) }).copied() else {
        return 0;
    };
    let _ = OFFCPU.remove(next_tid);
    bump(&STATS, Stat::Switch as u32);
    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    emit(EventKind::OffCpu, ProbeId::SchedSwitch as u32, |e| {
        e.ts_ns = now;
        e.tgid = target;
        e.tid = next_tid;
        e.args[0] = since.ts_ns;
        e.args[1] = u64::from(since.state);
    });
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
