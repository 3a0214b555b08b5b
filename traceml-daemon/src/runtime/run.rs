//! The state of one live run ([`Run`]): the stream it emits, the code objects it classifies, the
//! events it drains from the ring and turns into stream items, the stacks it samples, the
//! libraries it probes as they are mapped, and the governor's decisions it carries out.
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use traceml_common::{CodeClass, LossReason, RawEvent};

use crate::attach::memory::TargetMemory;
use crate::attach::pystack::StackReader;
use crate::attach::python::CodeReader;
use crate::attach::{self, Attacher, maps};
use crate::classify::{self, RecordClass};
use crate::event::{
    self, Api, Class, CodeInfo, EndReason, FOLLOWED_ROLE, FuncInfo, Kind, LibraryInfo, Lost,
    OWN_RUNTIME_ROLE, ProbeSet, StackSample, StreamItem, WorkerStackSample,
};
use crate::host::ending;
use crate::host::procinfo;
use crate::overhead::{Governor, GovernorTick, Markers};
use crate::sanitize::terminal;

use super::kernel::monotonic_ns;
use super::kernel::{Kernel, percpu_sum};

use super::options::{LiveError, Options, worker_every};

/// True when the process is gone, a zombie, or another process now holds the pid.
pub(super) fn process_gone(pid: u32, start: Option<u64>) -> bool {
    match procinfo::start_state(pid) {
        None => true,
        Some((_, 'Z' | 'X' | 'x')) => true,
        Some((s, _)) => start.is_some_and(|st| st != s),
    }
}

/// The state of a live run.
pub(super) struct Run<'a, F: FnMut(&StreamItem) -> Result<(), String>> {
    pub(super) opts: &'a Options,
    pub(super) sink: F,
    pub(super) mem: TargetMemory,
    pub(super) reader: CodeReader,
    /// Classified code objects and when their class was last written to the kernel.
    pub(super) known: HashMap<u64, (Class, u64)>,
    pub(super) last_seq: HashMap<u32, u64>,
    pub(super) seq_gaps: u64,
    pub(super) undecodable: u64,
    /// Driver entry points `cuGetProcAddress` handed out since the last [`Run::follow`]: (name,
    /// pointer).
    pub(super) proc_addresses: Vec<(String, u64)>,
    /// Code classes written to the kernel again (a first write did not land).
    pub(super) reinserted: u64,
    /// Events of uninteresting code objects dropped before they reached the stream.
    pub(super) ignored_events: u64,
    /// Drained events not yet turned into stream items.
    pub(super) backlog: std::collections::VecDeque<RawEvent>,
    /// Classified code objects whose `Code` item is not in the stream yet.
    pub(super) unannounced: HashMap<u64, CodeInfo>,
    pub(super) python_path: PathBuf,
    pub(super) python_base: Option<u64>,
    /// Each thread's `PyThreadState*`, learned from the frame-evaluator probe's events.
    pub(super) tstates: HashMap<u32, u64>,
    /// Step markers decoded since the governor's last tick.
    pub(super) markers: Markers,
    /// Per thread: (DataLoader records, optimizer records, backward calls) since attach, to
    /// find the training thread while running.
    pub(super) thread_markers: HashMap<u32, (u64, u64, u64)>,
    pub(super) stacks: Option<StackReader>,
    /// The DataLoader workers' stack readers, and the stack ticks so far (workers are sampled
    /// every [`WORKER_EVERY`]th).
    pub(super) workers: super::workers::WorkerStacks,
    pub(super) stack_ticks: u64,
    /// Stack sample functions named so far.
    pub(super) funcs: HashMap<(std::sync::Arc<str>, std::sync::Arc<str>, u32), u32>,
    pub(super) stack_errors: u64,
    /// The kernel marked the target's exec in the ring: the run is over (the loop confirms
    /// with the connector or the memory map at once, not at the next rescan).
    pub(super) execed: bool,
    /// This machine's per-hit probe costs, when measured (in the stream's target item).
    pub(super) calibration: Option<crate::event::Calibration>,
}

impl<F: FnMut(&StreamItem) -> Result<(), String>> Run<'_, F> {
    pub(super) fn emit(&mut self, item: StreamItem) -> Result<(), LiveError> {
        (self.sink)(&item).map_err(LiveError::Sink)
    }

    /// Drains the ring buffer and classifies every new code object at once; the events then
    /// wait in `backlog` for [`Run::process`]. Until the kernel knows a class it reports only a
    /// code object's first few calls, so classification must not wait behind the processing of
    /// a large backlog (the burst of events while the target imports torch).
    /// Reads every event the ring holds into the backlog; how many.
    pub(super) fn drain(&mut self, k: &mut Kernel) -> usize {
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
            } else if let Some(p) = event::proc_address(&raw) {
                self.proc_addresses.push(p);
            }
        }
        self.backlog.len() - first
    }

    pub(super) fn classify(&mut self, k: &mut Kernel, raw: &RawEvent) {
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
    pub(super) fn process(&mut self, budget: Option<Duration>) -> Result<(), LiveError> {
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
            // Read when drained (`Run::follow`), no stream event.
            if raw.kind == traceml_common::EventKind::ProcAddress as u32 {
                continue;
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
    pub(super) fn count_marker(&mut self, tid: u32, kind: &Kind) {
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
    pub(super) fn training_thread(&self) -> Option<(u32, Option<u64>)> {
        self.thread_markers
            .iter()
            .filter(|(_, m)| **m != (0, 0, 0))
            .max_by_key(|(tid, m)| (m.1 + m.2, m.0, std::cmp::Reverse(**tid)))
            .map(|(&tid, _)| (tid, self.tstates.get(&tid).copied()))
    }

    /// One tick of the stack sampler: the training thread's stack, and every
    /// [`worker_every`] ticks the workers'.
    pub(super) fn stack_tick(&mut self) -> Result<(), LiveError> {
        self.sample_stack()?;
        self.stack_ticks += 1;
        if self
            .stack_ticks
            .is_multiple_of(worker_every(self.opts.stack_rate))
        {
            self.sample_workers()?;
        }
        Ok(())
    }

    /// Samples the training thread's Python stack (one `process_vm_readv` per frame).
    pub(super) fn sample_stack(&mut self) -> Result<(), LiveError> {
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
    pub(super) fn intern(
        &mut self,
        stack: crate::attach::pystack::Stack,
    ) -> Result<Vec<u32>, LiveError> {
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
    pub(super) fn sample_workers(&mut self) -> Result<(), LiveError> {
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
    pub(super) fn resolve(&self, id: u64, address: u64) -> CodeInfo {
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

    /// Runs `f` with the attacher on a blocking thread, draining the ring meanwhile. Placing a
    /// probe makes the kernel visit every process that maps the file, taking each one's
    /// memory-map lock under a host-wide lock that fork and every other placement or removal
    /// of a uprobe share: on a busy node (or behind a removal the kernel holds back, see
    /// `attach::release`) it can wait long, and the loop's thread serves every target of a
    /// `serve`.
    pub(super) async fn with_attacher<T, G>(&mut self, k: &mut Kernel, f: G) -> T
    where
        T: Send + 'static,
        G: FnOnce(&mut Attacher) -> T + Send + 'static,
    {
        let mut a = k.lend();
        let job = tokio::task::spawn_blocking(move || {
            let out = f(&mut a);
            (a, out)
        });
        tokio::pin!(job);
        let mut drain = tokio::time::interval(Duration::from_millis(10));
        drain.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                done = &mut job => match done {
                    Ok((a, out)) => {
                        k.give_back(a);
                        return out;
                    }
                    // A panic while placing is the daemon's bug: it goes on as a panic.
                    Err(e) => std::panic::resume_unwind(e.into_panic()),
                },
                _ = drain.tick() => {
                    self.drain(k);
                }
            }
        }
    }

    /// Attaches to every interesting file mapped since the last scan (off the loop's thread:
    /// see [`Run::with_attacher`]).
    pub(super) async fn rescan(
        &mut self,
        k: &mut Kernel,
        mappings: &[maps::Mapping],
    ) -> Result<(), LiveError> {
        if k.attacher().callers_pending(mappings) {
            let m = mappings.to_vec();
            let found = self.with_attacher(k, move |a| a.update_callers(&m)).await;
            match found {
                Ok(libs) => self.own_runtime(libs, monotonic_ns())?,
                Err(e) => tracing::warn!(
                    "driver launches' callers not updated: {}",
                    attach::error_chain(&e)
                ),
            }
        }
        let files = to_probe(k.attacher(), mappings, k.held_back);
        if files.is_empty() {
            return Ok(());
        }
        // Every file placed before an error still goes in the stream.
        let (placed, error) = self
            .with_attacher(k, move |a| {
                let mut placed = Vec::new();
                for (path, role) in files {
                    match a.attach_file(&path, role) {
                        Ok(report) => placed.push(Probed {
                            path,
                            role,
                            report,
                            ts: monotonic_ns(),
                        }),
                        Err(e) => return (placed, Some(e)),
                    }
                }
                (placed, None)
            })
            .await;
        for p in placed {
            self.probed(p)?;
        }
        match error {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// [`Run::drain`], then [`Run::follow`]: how many events were drained.
    pub(super) async fn drain_and_follow(&mut self, k: &mut Kernel) -> Result<usize, LiveError> {
        let n = self.drain(k);
        self.follow(k).await?;
        Ok(n)
    }

    /// Follows the driver entry points `cuGetProcAddress` handed out since the last call (off
    /// the loop's thread, which keeps draining): a probe on each that is not an exported
    /// function's address, reported in the stream as a library item of role `followed` (one
    /// probe each). The target's maps are read again first: the library that asked is often
    /// mapped since the last rescan, and its caller range goes to the kernel at once too.
    pub(super) async fn follow(&mut self, k: &mut Kernel) -> Result<(), LiveError> {
        if self.proc_addresses.is_empty() {
            return Ok(());
        }
        let asked = std::mem::take(&mut self.proc_addresses);
        let Ok(mappings) = maps::read(self.opts.pid) else {
            return Ok(());
        };
        self.rescan(k, &mappings).await?;
        let followed = self
            .with_attacher(k, move |a| {
                asked
                    .iter()
                    .map(|(name, ptr)| a.follow(name, *ptr, &mappings))
                    .collect::<Vec<_>>()
            })
            .await;
        for f in followed {
            match f {
                Ok(Some(f)) => {
                    tracing::info!(
                        "{} reached through a pointer that is not the exported function: probed at \
                         {}+{:#x}",
                        f.name,
                        terminal(&f.path.display().to_string()),
                        f.offset
                    );
                    self.emit(StreamItem::Library(Box::new(LibraryInfo {
                        path: f.path.display().to_string(),
                        role: FOLLOWED_ROLE.into(),
                        probes: vec![format!("{}+{:#x}", f.name, f.offset)],
                        ts: monotonic_ns(),
                    })))?;
                }
                Ok(None) => {}
                Err(e) => tracing::warn!("driver pointer not followed: {}", terminal(&e)),
            }
        }
        Ok(())
    }

    /// Puts the libraries found to carry their own CUDA runtime in the stream (role
    /// `own_runtime`, no probes of their own: their launches reach the driver's probes).
    pub(super) fn own_runtime(&mut self, libs: Vec<PathBuf>, ts: u64) -> Result<(), LiveError> {
        for path in libs {
            tracing::info!(
                "{} carries its own CUDA runtime: its launches reach the driver directly",
                terminal(&path.display().to_string())
            );
            self.emit(StreamItem::Library(Box::new(LibraryInfo {
                path: path.display().to_string(),
                role: OWN_RUNTIME_ROLE.into(),
                probes: Vec::new(),
                ts,
            })))?;
        }
        Ok(())
    }

    /// Puts a probed file in the stream: its failed probes, and the library with its probes.
    pub(super) fn probed(&mut self, p: Probed) -> Result<(), LiveError> {
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
    pub(super) async fn look(
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
            self.rescan(k, &mappings).await?;
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
    pub(super) async fn govern(
        &mut self,
        k: &mut Kernel,
        governor: &mut Governor,
    ) -> Result<(), LiveError> {
        self.drain(k);
        self.process(Some(Duration::from_millis(20)))?;
        let stats = k.probe_stats();
        self.emit(StreamItem::ProbeStats(stats))?;
        let tick = GovernorTick {
            now: stats.ts,
            stats,
            markers: std::mem::take(&mut self.markers),
            stacks_ready: self.stacks.is_none()
                || self.training_thread().is_some_and(|(_, t)| t.is_some()),
            cpu_ns: procinfo::cpu_ns(self.opts.pid),
        };
        if let Some(d) = governor.tick(tick) {
            apply(self, k, d).await?;
        }
        Ok(())
    }

    pub(super) fn lost(&self, k: &Kernel) -> Lost {
        let count = |r: LossReason| percpu_sum(&k.loss, r as u32);
        let ring_full = count(LossReason::RingFull);
        let off_cpu_ring_full = count(LossReason::OffCpuRingFull);
        Lost {
            ring_full,
            read_failed: count(LossReason::ReadFailed),
            state_full: count(LossReason::StateFull),
            too_deep: count(LossReason::DepthLimit),
            undecodable: self.undecodable,
            seq_gaps: self.seq_gaps.saturating_sub(ring_full + off_cpu_ring_full),
            off_cpu_ring_full,
        }
    }
}

/// A file probed, as the stream reports it.
pub(super) struct Probed {
    pub(super) path: PathBuf,
    pub(super) role: maps::Role,
    pub(super) report: attach::FileReport,
    pub(super) ts: u64,
}

/// The files of `mappings` to probe now: those with a role, not Python's (probed first, on its
/// own), not probed yet, and only torch's while the other libraries are held back.
pub(super) fn to_probe(
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

/// Carries out a governor decision and records it in the stream.
pub(super) async fn apply<F: FnMut(&StreamItem) -> Result<(), String>>(
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
            run.rescan(k, &mappings).await?;
        }
    }
    let switched = if d.python {
        run.with_attacher(k, |a| a.arm_python()).await
    } else {
        k.attacher_mut().take_python().map(|links| {
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
    if let Err(e) = k.attacher_mut().set_launch_events(d.launch_events) {
        tracing::warn!("cannot switch the launch mode: {e}");
    }
    tracing::info!("probe set: {reason}");
    run.emit(StreamItem::ProbeSet(Box::new(ProbeSet {
        ts: monotonic_ns(),
        python: k.attacher().python_armed(),
        launch_events: d.launch_events,
        reason,
        watching: k.held_back,
        python_steady: d.python_steady && k.attacher().python_armed(),
    })))
}
