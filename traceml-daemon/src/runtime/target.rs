//! The live run: check the target and our privileges, attach, then stream events until the
//! target exits or we are told to stop. Each poll drains the ring buffer, resolves new code
//! objects, notices libraries mapped since the last look (torch loads libcudart lazily) and
//! samples /proc and NVML. Everything it learns leaves as [`StreamItem`]s through one sink, so a
//! recording replays to the same summary.
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::path::Path;
use std::time::Duration;

use aya::maps::{HashMap as BpfHashMap, PerCpuArray};
use traceml_common::RawEvent;

use crate::attach::memory::TargetMemory;
use crate::attach::pystack::StackReader;
use crate::attach::python::{self, CodeReader};
use crate::attach::{self, AttachError, Attacher, LoadConfig, maps};
use crate::event::{End, EndReason, Lost, ProbeSet, StreamItem, TargetInfo};
use crate::host::ending;
use crate::host::procinfo;
use crate::overhead::{Governor, GovernorConfig, Markers, ProbePolicy, Stage};
use crate::sampler::Sampler;
use crate::sanitize::{self, terminal};

pub use super::kernel::monotonic_ns;
use super::kernel::{Kernel, launch_totals, percpu_sum, ring_readiness};

pub use super::options::{LiveError, Options, WORKER_STACK_RATE};
use super::run::{Probed, Run, process_gone, to_probe};

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

/// The kernel side of a target, attached: its programs loaded and its probes placed in Python
/// and the libraries mapped now; what was placed, and when the first probe went in.
struct Loaded {
    kernel: Kernel,
    mem: TargetMemory,
    reader: CodeReader,
    probed: Vec<Probed>,
    /// Libraries mapped at attach that carry their own CUDA runtime.
    own_runtime: Vec<std::path::PathBuf>,
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
        // The caller ranges before Python's probe arms: every driver launch from here on is
        // told apart by its caller.
        let own_runtime = a.update_callers(&mappings)?;
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
        Ok::<_, AttachError>((a, probed, own_runtime, attach_ts, calibration))
    })
    .await
    .map_err(|e| LiveError::Kernel(format!("loading the eBPF programs: {e}")))?;
    let (attacher, probed, own_runtime, attach_ts, calibration) = match loaded {
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
    let kernel = Kernel::from_attacher(
        attacher,
        Governor::defers_libraries(opts.policy, opts.watch_first),
    )
    .map_err(LiveError::Kernel)?;
    Ok(Loaded {
        kernel,
        mem,
        reader,
        probed,
        own_runtime,
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
        own_runtime,
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
        proc_addresses: Vec::new(),
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
    let info = target_info(opts, &py, attach_ts, run.calibration);
    run.emit(StreamItem::Target(Box::new(info)))?;

    let report = &probed[0].report;
    if report.attached.is_empty() {
        return Err(not_probed(report, &py));
    }
    run.own_runtime(own_runtime, attach_ts)?;
    for p in probed {
        run.probed(p)?;
    }
    // Libraries the target mapped while the probes went in (an attach takes about a second: a
    // job still importing maps libcuda then) are probed now, with their caller ranges.
    if let Ok(m) = maps::read(pid) {
        run.rescan(&mut k, &m).await?;
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

/// What the stream says of the target at its start.
fn target_info(
    opts: &Options,
    py: &python::PythonTarget,
    attach_ts: u64,
    calibration: Option<crate::event::Calibration>,
) -> TargetInfo {
    let pid = opts.pid;
    TargetInfo {
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
        calibration,
    }
}

/// Why the frame evaluator could not be probed (without it there is no run).
fn not_probed(report: &attach::FileReport, py: &python::PythonTarget) -> LiveError {
    let reason = report
        .failures
        .first()
        .map(|f| f.reason.clone())
        .unwrap_or_default();
    // EACCES from perf_event_open without root: the kernel wants CAP_SYS_ADMIN for uprobes.
    // SAFETY: geteuid has no preconditions.
    if reason.contains("Permission denied") && unsafe { libc::geteuid() } != 0 {
        return LiveError::Privileges(format!(
            "CAP_SYS_ADMIN, which this kernel requires to create uprobes (probing {}: {reason})",
            python::EVAL_SYMBOL
        ));
    }
    LiveError::Kernel(format!(
        "cannot probe {} in {}: {reason}",
        python::EVAL_SYMBOL,
        py.path.display()
    ))
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
    // NVML's init answers on its own thread (said there once per daemon); the attach waits a
    // moment for it so the first sample has the GPUs.
    let _ = sampler.gpu_unavailable(std::time::Duration::from_millis(200));
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
        if let Some(m) = k.attacher().ebpf.map("STATS")
            && let Ok(stats) = PerCpuArray::<_, u64>::try_from(m)
        {
            let v: Vec<u64> = (0..traceml_common::STATS_LEN)
                .map(|i| percpu_sum(&stats, i))
                .collect();
            tracing::debug!(
                "probe stats [py_enter, ignored, pending capped, call_enter, exit]: {v:?}"
            );
        }
        if let Some(m) = k.attacher().ebpf.map("THREADS")
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
    run.emit(StreamItem::LaunchTotals(launch_totals(k.attacher())))?;
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
    let links = k.attacher().link_count();
    attach::release::in_background(move || {
        let t0 = std::time::Instant::now();
        match k.attacher_mut().take_links() {
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

/// How often the governor looks: once a second, every 250 ms while it watches for the first
/// training marker (to place the other probes within a step or two), every 50 ms while it
/// learns the loop with every probe (the costly set, in which every Python call pays the
/// frame-evaluator probe: left as soon as the markers carry the steps).
fn govern_every(stage: Stage) -> Duration {
    Duration::from_millis(match stage {
        Stage::Learning => 50,
        Stage::Watching => 250,
        Stage::Steady => 1000,
    })
}

/// A timer ticking every `period` from one period on; a late tick delays the next ones. The
/// samples use it: the attach took the first snapshot, and two snapshots a moment apart tell no
/// DataLoader worker (`sampler::proc::to_sample`).
fn every(period: Duration) -> tokio::time::Interval {
    let mut i = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    i
}

async fn event_loop<F: FnMut(&StreamItem) -> Result<(), String>>(
    run: &mut Run<'_, F>,
    k: &mut Kernel,
    sampler: &mut Sampler,
    governor: &mut Governor,
    watch: &mut ending::Watch,
) -> Result<EndReason, LiveError> {
    use tokio::time::{MissedTickBehavior, interval};
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
    let mut sample = every(run.opts.sample_interval); // not at once: see `proc::to_sample`
    let mut govern_stage = governor.stage();
    let mut govern = interval(govern_every(govern_stage));
    let mut stack = interval(Duration::from_secs(1) / run.opts.stack_rate.max(1));
    for i in [&mut rescan, &mut sample, &mut govern, &mut stack] {
        i.set_missed_tick_behavior(MissedTickBehavior::Delay);
    }
    // Readiness of the ring buffer (a duplicate of its fd: the `RingBuf` itself is drained
    // through `k`). The kernel wakes us for events of unclassified code objects only; the rest
    // waits for the 10 ms poll.
    let ready = ring_readiness(&k.ring).map_err(LiveError::Kernel)?;
    let [mut sigint, mut sigterm, mut sighup] = own_signals(run.opts)?;
    let mut stop = run.opts.stop.clone();
    let deadline = run.opts.duration.map(|d| tokio::time::Instant::now() + d);
    let mut last_lost = Lost::default();
    loop {
        tokio::select! {
            _ = &mut poll => {
                let n = run.drain_and_follow(k).await?;
                run.process(Some(Duration::from_millis(20)))?;
                let every = if n > ring_events / 256 { poll_fast } else { poll_slow };
                poll.as_mut().reset(tokio::time::Instant::now() + every);
            }
            guard = ready.readable() => {
                if let Ok(mut guard) = guard {
                    guard.clear_ready();
                }
                run.drain_and_follow(k).await?;
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
                    rescan = every(run.opts.rescan_interval.max(Duration::from_secs(1)));
                }
                if let Some(reason) = run.look(k, watch, &mut last_lost).await? {
                    return Ok(reason);
                }
            }
            _ = sample.tick() => {
                if let Some(s) = sampler.tick(monotonic_ns()) {
                    run.emit(StreamItem::Sample(Box::new(s)))?;
                }
            }
            _ = stack.tick(), if run.opts.stack_rate > 0 && run.stacks.is_some() => {
                run.stack_tick()?;
            }
            _ = govern.tick() => {
                run.govern(k, governor).await?;
                if governor.stage() != govern_stage {
                    govern_stage = governor.stage();
                    govern = every(govern_every(govern_stage));
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
