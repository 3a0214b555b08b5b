//! The phase engine: a pure fold over the event stream that finds the training thread, its step
//! boundaries and each step's exclusive phase times. No clock, no I/O: only event timestamps.
//!
//! [`run`] is the whole engine; this module documents its rules, `thread` matches entries and
//! exits per thread (and says how lost events are survived), `timeline` turns intervals into
//! exclusive phases and boundaries into steps.
//!
//! # Input
//! `Code` items give each code object address its [`Class`] (the last non-pending one wins). They
//! may come after the events that use them (classification is lazy), so the code map is built
//! from the whole stream before folding. Frames of code objects that stay pending or ignored are
//! still tracked (they take part in matching) but carry no phase. Events are stably sorted by
//! timestamp first (per-CPU ring buffers interleave); events older than one already seen are
//! counted in [`EngineOutput::reordered_events`].
//!
//! # Training thread
//! The thread with the most DataLoader calls (outermost `__next__` frame or
//! `enumerate(DataLoader)#` record; a record nested in the frame is the same call). Without any,
//! the thread with the most optimizer steps, then the one with the most blocking syncs; ties go
//! to the process's main thread, then to the lowest tid. Only its events make phases and
//! boundaries. Launches and copies of the other threads of its process count toward the step and
//! the training thread's phase at their timestamp (autograd's device threads launch the backward
//! kernels while the training thread sits in `Engine::execute`).
//!
//! # Step boundaries ([`Boundary`]), in order of preference
//! - `DataloaderNext`: step i = [entry of DataLoader call i, entry of call i+1). A call whose frame
//!   raised (StopIteration at the end of an epoch) ends the current step at its entry and starts
//!   none; the next call (next epoch) starts a new step, so the epoch gap (evaluation,
//!   checkpointing, worker restarts) is no step. With only `record_function` events (no Python
//!   probe) a StopIteration cannot be seen: the epoch gap then becomes one long step.
//! - `OptimizerStep` (no DataLoader call): step i = [exit of optimizer step i, exit of step i+1),
//!   using matched exits of outermost `Optimizer.step#` records or optimizer frames.
//! - `SyncPattern` (neither): the blocking sync API the training thread calls most; step i =
//!   [exit of its i-th sync, exit of the (i+1)-th). A loop that syncs k times per iteration gets k
//!   steps per iteration.
//! - `None`: no steps.
//!
//! The part before the first boundary (attach point) and an unterminated last step are dropped and
//! counted in [`EngineOutput::partial_steps_dropped`], as are zero-length steps.
//!
//! # Phases and precedence
//! Each phase is caused by an open interval on the training thread. At each instant the
//! highest-precedence open interval wins, so the phase times of a step are exclusive and sum
//! exactly to its duration (intervals are split at step boundaries):
//! 1. `gpu_wait`: a blocking sync ([`Api::is_sync`]) or a device-to-host copy (any copy API: D2H
//!    copies wait for the device to reach them).
//! 2. `h2d`: a host-to-device copy. Copies of other kinds (host-to-host, device-to-device,
//!    `cudaMemcpyDefault`, unknown) are neither: we do not guess a direction, and their time stays
//!    with whatever encloses them.
//! 3. `input_wait`: a DataLoader `__next__` frame or `enumerate(DataLoader)#` record.
//! 4. `optimizer`: an `Optimizer.step#` record or optimizer-step frame (`zero_grad` is not
//!    classified, see [`crate::classify::classify_record`]).
//! 5. `backward`: a backward frame or a `torch::autograd::Engine::execute` call.
//! 6. `forward`: a module-call frame (nested module calls are one interval: any open one counts).
//! 7. `residual`: nothing of the above open.
//!
//! So an H2D copy inside `__next__` (collate on the main thread) is `h2d`, a sync inside forward
//! (`.item()`) is `gpu_wait`, a module call inside backward (checkpoint recompute) is `backward`.
//!
//! # Per-step counts
//! - Launches (any thread of the process), in the training thread's phase at their timestamp.
//!   Launches have no exit, so runtime/driver duplicates are removed by time: a driver launch
//!   ([`Api::is_driver`]) on the same thread within 20 µs after a runtime launch counts once
//!   (each runtime launch pairs with at most one driver launch).
//! - H2D/D2H bytes and copies: outermost copy calls (a driver copy nested in a runtime copy is
//!   the same copy) of any thread of the process, by their entry time. `h2d_ns`/`d2h_ns`: host time
//!   inside the training thread's copies, clipped to the step.
//! - Syncs: outermost blocking syncs of the training thread, by entry time.
//!
//! # Lost events
//! Never panics. Exits without entries, and entries closed because a later event proved them
//! ended, are counted in [`EngineOutput::unmatched_events`] (rules in `thread`). Entries still
//! open at the end of the trace are not: the trace cut them.
use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::event::{Api, Class, StreamItem};

#[cfg(test)]
mod tests;
mod thread;
mod timeline;

use thread::{Dir, ThreadFold, ThreadTrace};
use timeline::{Cut, Timeline};

/// The phases of a step, in the order the report lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    InputWait,
    H2d,
    Forward,
    Backward,
    Optimizer,
    GpuWait,
    Residual,
}

impl Phase {
    pub const ALL: [Phase; 7] = [
        Phase::InputWait,
        Phase::H2d,
        Phase::Forward,
        Phase::Backward,
        Phase::Optimizer,
        Phase::GpuWait,
        Phase::Residual,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Phase::InputWait => "input_wait",
            Phase::H2d => "h2d",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer",
            Phase::GpuWait => "gpu_wait",
            Phase::Residual => "residual",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// What delimits steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Boundary {
    /// Entry of the DataLoader iterator's `__next__` on the training thread.
    DataloaderNext,
    /// End of `Optimizer.step` (no DataLoader seen).
    OptimizerStep,
    /// The repeating pattern of blocking CUDA syncs (no DataLoader, no optimizer seen).
    SyncPattern,
    /// No boundary found: no steps.
    None,
}

/// One training step of the training thread.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// 0-based index among complete steps.
    pub index: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    /// Exclusive time per phase, indexed by [`Phase::index`]; sums to `end_ns - start_ns`.
    pub phase_ns: [u64; 7],
    /// Kernel launches per phase (runtime and driver launches counted once).
    pub launches: [u32; 7],
    pub h2d_bytes: u64,
    pub d2h_bytes: u64,
    pub h2d_copies: u32,
    pub d2h_copies: u32,
    /// Host time inside H2D copy calls.
    pub h2d_ns: u64,
    /// Host time inside D2H copy calls (synchronous: they wait for the device).
    pub d2h_ns: u64,
    /// Blocking syncs (stream/device/event).
    pub syncs: u32,
}

impl Step {
    pub fn duration_ns(&self) -> u64 {
        self.end_ns - self.start_ns
    }
    pub fn phase(&self, p: Phase) -> u64 {
        self.phase_ns[p.index()]
    }
}

/// What the engine found.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineOutput {
    pub steps: Vec<Step>,
    pub boundary: Option<Boundary>,
    pub training_tid: Option<u32>,
    /// Events that could not be placed (exit without entry, entry never closed, ...).
    pub unmatched_events: u64,
    /// Events that arrived out of timestamp order (reordered before folding).
    pub reordered_events: u64,
    /// Steps not measured: the fragment before the first boundary (attach point), an unterminated
    /// last step (end of trace), steps of zero length.
    pub partial_steps_dropped: u32,
    /// Stack samples of the training thread taken inside a step, with the phase in force.
    #[serde(default)]
    pub samples: Vec<PhaseSample>,
}

/// A stack sample placed in the training thread's timeline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhaseSample {
    pub ts: u64,
    /// Index of the step it fell in.
    pub step: u32,
    pub phase: Phase,
    /// [`crate::event::FuncInfo`] ids, outermost first.
    pub frames: Vec<u32>,
}

/// Folds an event stream into the training thread's steps. Pure: only event timestamps.
pub fn run(items: &[StreamItem]) -> EngineOutput {
    let mut codes: HashMap<u64, Class> = HashMap::new();
    let mut events = Vec::new();
    let mut python_off: Vec<u64> = Vec::new();
    let mut stacks = Vec::new();
    let mut reordered = 0u64;
    let mut max_ts = 0u64;
    for item in items {
        match item {
            StreamItem::Code(c) if c.class != Class::Pending => {
                codes.insert(c.ptr, c.class);
            }
            StreamItem::ProbeSet(p) if !p.python => python_off.push(p.ts),
            StreamItem::Stack(s) => stacks.push(s.as_ref()),
            StreamItem::Event(e) => {
                if e.ts < max_ts {
                    reordered += 1;
                } else {
                    max_ts = e.ts;
                }
                events.push(e);
            }
            _ => {}
        }
    }
    events.sort_by_key(|e| e.ts);
    python_off.sort_unstable();
    let mut out = EngineOutput {
        reordered_events: reordered,
        boundary: Some(Boundary::None),
        ..EngineOutput::default()
    };
    let Some(end) = events.last().map(|e| e.ts) else {
        return out;
    };

    let mut folds: HashMap<u32, ThreadFold> = HashMap::new();
    let class = |code: u64| codes.get(&code).copied().unwrap_or(Class::Pending);
    let mut off = python_off.iter().peekable();
    for e in &events {
        while let Some(&&ts) = off.peek() {
            if ts > e.ts {
                break;
            }
            folds.values_mut().for_each(|f| f.close_python(ts));
            off.next();
        }
        folds
            .entry(e.tid)
            .or_default()
            .push(e.ts, e.tgid, &e.kind, class);
    }
    let mut threads: Vec<(u32, ThreadTrace)> = folds
        .into_iter()
        .map(|(tid, f)| (tid, f.finish(end)))
        .collect();
    threads.sort_unstable_by_key(|t| t.0);
    out.unmatched_events = threads.iter().map(|t| t.1.unmatched).sum();

    let Some((tid, main)) = threads
        .iter()
        .filter(|(_, t)| {
            !t.input_calls.is_empty() || !t.optimizer_exits.is_empty() || !t.sync_exits.is_empty()
        })
        .max_by_key(|(tid, t)| {
            (
                t.input_calls.len(),
                t.optimizer_exits.len(),
                t.sync_exits.len(),
                *tid == t.tgid,
                std::cmp::Reverse(*tid),
            )
        })
    else {
        return out;
    };
    out.training_tid = Some(*tid);

    let (boundary, cut) = if !main.input_calls.is_empty() {
        (
            Boundary::DataloaderNext,
            timeline::dataloader_steps(&main.input_calls, main.first_ts),
        )
    } else if !main.optimizer_exits.is_empty() {
        (
            Boundary::OptimizerStep,
            timeline::exit_steps(&main.optimizer_exits, main.first_ts, main.last_ts),
        )
    } else {
        (
            Boundary::SyncPattern,
            timeline::exit_steps(&sync_pattern(&main.sync_exits), main.first_ts, main.last_ts),
        )
    };
    out.boundary = Some(boundary);
    out.partial_steps_dropped = cut.partial;
    let timeline = Timeline::build(&main.intervals);
    out.steps = measure(&cut, *tid, main, &threads, &timeline);
    out.samples = place_samples(&stacks, *tid, &out.steps, &timeline);
    out
}

/// The training thread's stack samples that fell inside a step, with the phase at their instant.
fn place_samples(
    stacks: &[&crate::event::StackSample],
    tid: u32,
    steps: &[Step],
    timeline: &Timeline,
) -> Vec<PhaseSample> {
    let mut out: Vec<PhaseSample> = stacks
        .iter()
        .filter(|s| s.tid == tid)
        .filter_map(|s| {
            let i = steps.partition_point(|st| st.end_ns <= s.ts);
            let step = steps.get(i).filter(|st| st.start_ns <= s.ts)?;
            Some(PhaseSample {
                ts: s.ts,
                step: step.index,
                phase: timeline.phase_at(s.ts),
                frames: s.frames.clone(),
            })
        })
        .collect();
    out.sort_by_key(|s| s.ts);
    out
}

/// Exits of the training thread's most frequent blocking sync API (ties: the lowest [`Api`]).
fn sync_pattern(exits: &[(Api, u64)]) -> Vec<u64> {
    let mut counts: HashMap<Api, usize> = HashMap::new();
    for (api, _) in exits {
        *counts.entry(*api).or_default() += 1;
    }
    let best = counts
        .into_iter()
        .max_by_key(|&(api, n)| (n, std::cmp::Reverse(api)))
        .map(|(api, _)| api);
    exits
        .iter()
        .filter(|(api, _)| Some(*api) == best)
        .map(|&(_, ts)| ts)
        .collect()
}

/// Phase times and counts of each step.
fn measure(
    cut: &Cut,
    tid: u32,
    main: &ThreadTrace,
    threads: &[(u32, ThreadTrace)],
    timeline: &Timeline,
) -> Vec<Step> {
    let mut steps: Vec<Step> = cut
        .steps
        .iter()
        .enumerate()
        .map(|(i, &(start_ns, end_ns))| Step {
            index: i as u32,
            start_ns,
            end_ns,
            phase_ns: timeline.split(start_ns, end_ns),
            ..Step::default()
        })
        .collect();
    let find = |steps: &[Step], ts: u64| {
        let i = steps.partition_point(|s| s.end_ns <= ts);
        (i < steps.len() && steps[i].start_ns <= ts).then_some(i)
    };
    for (t, trace) in threads.iter().filter(|(_, t)| t.tgid == main.tgid) {
        for &ts in &trace.launches {
            if let Some(i) = find(&steps, ts) {
                steps[i].launches[timeline.phase_at(ts).index()] += 1;
            }
        }
        for c in &trace.copies {
            let Some(i) = find(&steps, c.start) else {
                continue;
            };
            let s = &mut steps[i];
            let host_ns = if *t == tid {
                c.end.unwrap_or(c.start).min(s.end_ns) - c.start
            } else {
                0
            };
            match c.dir {
                Dir::H2d => {
                    s.h2d_bytes += c.bytes;
                    s.h2d_copies += 1;
                    s.h2d_ns += host_ns;
                }
                Dir::D2h => {
                    s.d2h_bytes += c.bytes;
                    s.d2h_copies += 1;
                    s.d2h_ns += host_ns;
                }
                Dir::Other => {}
            }
        }
    }
    for &ts in &main.syncs {
        if let Some(i) = find(&steps, ts) {
            steps[i].syncs += 1;
        }
    }
    steps
}
