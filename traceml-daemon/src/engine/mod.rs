//! The phase engine: a pure fold over the event stream that finds the training thread, its step
//! boundaries and each step's exclusive phase times. No clock, no I/O: only event timestamps.
//!
//! [`run`] is the whole engine; this module documents its rules, `thread` matches entries and
//! exits per thread (and says how lost events are survived), `timeline` turns intervals into
//! exclusive phases and boundaries into steps.
//!
//! # Input, and memory
//! [`Engine`] is a fold: [`Engine::push`] each stream item as it arrives, [`Engine::finish`] at
//! the end ([`run`] does both over a slice, so a replay and a live run share the code). `Code`
//! items give each code object identity its [`Class`] (the last non-pending one wins); the live
//! loop emits them before the first event of their code object, and events wait
//! [`REORDER_NS`] of stream time in a reorder buffer before they are folded (per-CPU ring
//! buffer reservations interleave), which also gives a late `Code` item that much slack. Events
//! older than one already seen are counted in [`EngineOutput::reordered_events`] (folded in
//! timestamp order when they arrive within the window, late otherwise).
//!
//! Every [`HARVEST_NS`] of stream time the engine measures the training thread's steps that end
//! before anything still open on it (an open call with a phase, a pending forward span) and
//! before the reorder window, adds them to [`EngineOutput::totals`] (exact sums) and to a
//! bounded, time-ordered sample of steps ([`MAX_STEPS_KEPT`], thinned by doubling the stride),
//! and prunes what those steps no longer need. So memory is bounded by the nesting of open
//! calls, the reorder window, one harvest period, the code objects and threads seen, and the
//! kept samples — never by the run's length. The training thread and its boundary are chosen
//! at each harvest from what was seen so far (the rules below); a change starts the step cutter
//! afresh.
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

use crate::event::{Class, Kind, StreamItem};

mod cutter;
pub mod ledger;
mod measure;
mod output;
mod prep;
pub(crate) use prep::{LOOP_QUORUM, loop_prefix};
#[cfg(test)]
mod tests;
mod thread;
mod timeline;
mod workers;

use cutter::{Cutter, cut_dataloader, cut_exits, cut_windows};
use thread::{Dir, InputCall, ThreadFold, ThreadTrace};
use timeline::{Cut, Timeline};

use crate::phase::{N_PHASES, Phase};
use measure::{measure, place_samples};
pub use output::*;
pub use workers::{FETCH_FILE, WorkerFold};

/// Most steps kept in [`EngineOutput::steps`]; past it the sample is thinned (every other one
/// dropped, the stride doubled), so it stays a uniform, time-ordered sample of the run.
pub const MAX_STEPS_KEPT: usize = 4096;
/// Most stack samples kept in [`EngineOutput::samples`] (thinned the same way).
pub const MAX_SAMPLES_KEPT: usize = 8192;
/// Events may arrive this much out of timestamp order (per-CPU ring buffer reservations, the
/// live loop's drains); older ones are folded late and counted as reordered.
pub const REORDER_NS: u64 = 200_000_000;
/// A loop with DataLoader calls and backward passes but no optimizer step yet is not cut into
/// steps until this many backwards (a gradient-accumulation window of that length); past it,
/// its steps are DataLoader steps (a hand-written update without `torch.optim`).
pub const ACCUMULATION_WAIT: u64 = 1024;
/// Steps are harvested into the bounded output about this often (stream time).
pub const HARVEST_NS: u64 = 2_000_000_000;

/// A time-ordered sample of at most `max` items with a doubling stride: item `i` is kept when
/// `i % stride == 0`.
#[derive(Clone, Debug)]
pub(crate) struct Thinned<T> {
    pub(crate) items: Vec<T>,
    stride: u64,
    seen: u64,
    max: usize,
}

impl<T> Thinned<T> {
    pub(crate) fn new(max: usize) -> Self {
        Thinned {
            items: Vec::new(),
            stride: 1,
            seen: 0,
            max,
        }
    }

    pub(crate) fn push(&mut self, item: T) {
        let i = self.seen;
        self.seen += 1;
        if !i.is_multiple_of(self.stride) {
            return;
        }
        self.items.push(item);
        if self.items.len() > self.max {
            let mut k = 0;
            self.items.retain(|_| {
                k += 1;
                (k - 1) % 2 == 0
            });
            self.stride *= 2;
        }
    }
}

/// An event waiting in the reorder buffer (ordered by timestamp, then arrival).
#[derive(Clone, Debug)]
struct Queued {
    ts: u64,
    seq: u64,
    event: crate::event::Event,
}

impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        (self.ts, self.seq) == (o.ts, o.seq)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Queued {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.ts, self.seq).cmp(&(o.ts, o.seq))
    }
}

/// The phase engine as a fold: [`Engine::push`] each stream item, [`Engine::finish`] for the
/// output. Memory is bounded by the nesting of open calls, the reorder window, the time since
/// the last harvest, the number of code objects and threads, and the kept samples — never by
/// the run's length.
#[derive(Clone, Debug)]
pub struct Engine {
    codes: HashMap<u64, Class>,
    queue: std::collections::BinaryHeap<std::cmp::Reverse<Queued>>,
    arrivals: u64,
    max_ts: u64,
    released_ts: u64,
    reordered: u64,
    /// Probe-set switches `(ts, frame evaluator armed, watching, frame evaluator steady)`,
    /// applied in timestamp order.
    python_marks: std::collections::BinaryHeap<std::cmp::Reverse<(u64, bool, bool, bool)>>,
    /// The attach's probe set's instant (a probe set ahead of every event): every probe of the
    /// attach in place (the libraries are probed one after another, for up to a second or so:
    /// before it, one library's markers are seen and another's not yet).
    armed_ts: Option<u64>,
    /// What each sampled function is (the model's, a library's, the user's): see [`prep`].
    func_kinds: HashMap<u32, prep::FuncKind>,
    /// The input preparation's samples pooled over the harvests (see [`prep`]).
    prep_pool: prep::Pool,
    /// Python events are folded (false from a detach to a re-arm: frames entered while the
    /// kernel was still detaching would never report an exit).
    python_on: bool,
    folds: HashMap<u32, ThreadFold>,
    /// Processes (tgid) that exec'd, and when: their later events are the new program's.
    execs: HashMap<u32, u64>,
    after_exec: u64,
    stacks: Vec<crate::event::StackSample>,
    events: u64,
    first_ts: Option<u64>,
    last_ts: u64,
    next_harvest: u64,
    /// Training thread, boundary, and whether steps are optimizer-step windows, of the last
    /// harvest.
    choice: Option<(u32, Boundary, bool)>,
    cutter: Cutter,
    partial: u32,
    steps: Thinned<Step>,
    samples: Thinned<PhaseSample>,
    totals: StepTotals,
    steady: StepTotals,
    evaluation: EvalTotals,
    /// The frame-evaluator probe was armed, or the probe set was incomplete (watching for
    /// training: no CUDA probe yet), over these intervals (`None`: still so): steps overlapping
    /// them are [`Step::learning`].
    armed: Vec<(u64, Option<u64>)>,
    /// The trace ended: the last harvest also closes the window in progress.
    ending: bool,
    markers: TrainingMarkers,
    feeders: std::collections::BTreeMap<u32, Feeder>,
    thread_states: bool,
    workers: WorkerFold,
    ledger: ledger::Ledger,
}

impl Default for Engine {
    fn default() -> Self {
        Engine::new()
    }
}

impl Engine {
    pub fn new() -> Engine {
        Engine {
            codes: HashMap::new(),
            queue: Default::default(),
            arrivals: 0,
            max_ts: 0,
            released_ts: 0,
            reordered: 0,
            python_marks: Default::default(),
            armed_ts: None,
            func_kinds: HashMap::new(),
            prep_pool: prep::Pool::default(),
            python_on: true,
            folds: HashMap::new(),
            execs: HashMap::new(),
            after_exec: 0,
            stacks: Vec::new(),
            events: 0,
            first_ts: None,
            last_ts: 0,
            next_harvest: 0,
            choice: None,
            cutter: Cutter::default(),
            partial: 0,
            steps: Thinned::new(MAX_STEPS_KEPT),
            samples: Thinned::new(MAX_SAMPLES_KEPT),
            totals: StepTotals::default(),
            steady: StepTotals::default(),
            evaluation: EvalTotals::default(),
            armed: Vec::new(),
            ending: false,
            markers: TrainingMarkers::default(),
            feeders: Default::default(),
            thread_states: false,
            workers: WorkerFold::default(),
            ledger: ledger::Ledger::default(),
        }
    }

    /// Tells the engine the stream's clock reached `now` (`CLOCK_MONOTONIC` ns) without new
    /// events: events older than the reorder window are folded and due steps harvested. A
    /// stream that stops (a hung process) still gets its finished steps measured.
    pub fn advance(&mut self, now: u64) {
        if let Some(upto) = now.checked_sub(REORDER_NS) {
            self.release(upto);
            if self.first_ts.is_some() && upto >= self.next_harvest {
                self.harvest(self.released_ts);
                self.next_harvest = upto + HARVEST_NS;
            }
        }
    }

    /// Whether a thread of the target waits for a collective now (a wait entered and not yet
    /// returned, in the events folded so far): what tells the ranks that wait in a hang from
    /// the one they wait for.
    pub fn in_collective_wait(&self) -> bool {
        self.folds.values().any(ThreadFold::in_collective_wait)
    }

    /// The collective ledger so far (the events folded so far).
    pub fn ledger(&self) -> &ledger::Ledger {
        &self.ledger
    }

    /// Steps harvested so far and their total duration (ns).
    pub fn steps_so_far(&self) -> (u64, u64) {
        (self.totals.count, self.totals.duration_ns)
    }

    /// A new engine that knows `other`'s code classes and input preparation so far (a window of
    /// a run in progress).
    pub fn with_codes_of(other: &Engine) -> Engine {
        Engine {
            codes: other.codes.clone(),
            func_kinds: other.func_kinds.clone(),
            prep_pool: other.prep_pool.for_window(),
            workers: other.workers.with_funcs(),
            ..Engine::new()
        }
    }

    /// Folds one stream item.
    pub fn push(&mut self, item: &StreamItem) {
        match item {
            StreamItem::Code(c) if c.class != Class::Pending => {
                self.codes.insert(c.ptr, c.class);
            }
            StreamItem::ProbeSet(p) => {
                if self.events == 0 {
                    // The attach's probe set, written before the first event is read.
                    self.armed_ts.get_or_insert(p.ts);
                }
                self.python_marks.push(std::cmp::Reverse((
                    p.ts,
                    p.python,
                    p.watching,
                    p.python_steady,
                )));
            }
            StreamItem::Stack(s) => self.stacks.push((**s).clone()),
            StreamItem::WorkerStack(s) => self.workers.push(s),
            StreamItem::Func(f) => {
                self.func_kinds.insert(f.id, prep::FuncKind::of(&f.file));
                self.workers.func(f);
            }
            StreamItem::Event(e) => {
                self.events += 1;
                if e.ts < self.max_ts {
                    self.reordered += 1;
                } else {
                    self.max_ts = e.ts;
                }
                self.arrivals += 1;
                self.queue.push(std::cmp::Reverse(Queued {
                    ts: e.ts,
                    seq: self.arrivals,
                    event: e.clone(),
                }));
                if let Some(upto) = self.max_ts.checked_sub(REORDER_NS) {
                    self.release(upto);
                }
                if self.first_ts.is_some() && self.released_ts >= self.next_harvest {
                    self.harvest(self.released_ts);
                    self.next_harvest = self.released_ts + HARVEST_NS;
                }
            }
            _ => {}
        }
    }

    /// Folds queued events up to `upto` in timestamp order.
    fn release(&mut self, upto: u64) {
        while let Some(std::cmp::Reverse(q)) = self.queue.peek() {
            if q.ts > upto {
                break;
            }
            let std::cmp::Reverse(q) = self.queue.pop().expect("peeked");
            self.fold(q.event);
        }
    }

    fn fold(&mut self, e: crate::event::Event) {
        // Folded in timestamp order: everything of the process after its exec is the new
        // program's (its stacks of open calls end with the trace, closed at its end).
        if self.execs.get(&e.tgid).is_some_and(|&at| e.ts >= at) {
            self.after_exec += 1;
            return;
        }
        if matches!(e.kind, Kind::Exec) {
            self.execs.insert(e.tgid, e.ts);
            self.last_ts = self.last_ts.max(e.ts);
            self.released_ts = self.released_ts.max(e.ts);
            return;
        }
        self.apply_python_marks(e.ts);
        if !self.python_on && matches!(e.kind, Kind::PyEnter { .. } | Kind::PyExit { .. }) {
            return;
        }
        if self.first_ts.is_none() {
            self.first_ts = Some(e.ts);
            self.next_harvest = e.ts + HARVEST_NS;
        }
        self.released_ts = self.released_ts.max(e.ts);
        self.last_ts = self.last_ts.max(e.ts);
        self.markers.count(&e.kind);
        self.ledger.push(e.ts, e.tid, &e.kind);
        let codes = &self.codes;
        let class = |code: u64| codes.get(&code).copied().unwrap_or(Class::Pending);
        self.folds
            .entry(e.tid)
            .or_default()
            .push(e.ts, e.tgid, &e.kind, class);
    }

    /// Applies the probe switches up to `ts`: a detach closes every open Python frame there.
    fn apply_python_marks(&mut self, ts: u64) {
        while let Some(&std::cmp::Reverse((at, on, watching, steady))) = self.python_marks.peek() {
            if at > ts {
                break;
            }
            if !on && self.python_on {
                self.folds.values_mut().for_each(|f| f.close_python(at));
            }
            let learning = (on && !steady) || watching;
            match self.armed.last_mut() {
                Some((_, end @ None)) if !learning => *end = Some(at),
                Some((_, None)) => {}
                _ if learning => self.armed.push((at, None)),
                _ => {}
            }
            self.python_on = on;
            self.python_marks.pop();
        }
    }

    /// The training thread, its boundary, and whether its steps are optimizer-step windows, from
    /// what was seen so far (see the module doc). `None` while a loop with DataLoader calls and
    /// backward passes has not reached its first optimizer step yet (gradient accumulation: its
    /// micro-batches are no steps), for at most [`ACCUMULATION_WAIT`] backwards.
    fn choose(&self) -> Option<(u32, Boundary, bool)> {
        let (tid, t) = self
            .folds
            .iter()
            .map(|(tid, f)| (*tid, f.trace()))
            .filter(|(_, t)| {
                t.n_input_calls > 0 || t.n_optimizer_exits > 0 || !t.sync_api_counts.is_empty()
            })
            .max_by_key(|(tid, t)| {
                (
                    // The thread that trains (backward passes, optimizer steps); a thread that
                    // only fetches feeds it.
                    t.n_backwards + t.n_optimizer_exits > 0,
                    t.n_input_calls,
                    t.n_optimizer_exits,
                    t.sync_api_counts.values().sum::<u64>(),
                    *tid == t.tgid,
                    std::cmp::Reverse(*tid),
                )
            })?;
        let boundary = if t.n_input_calls > 0 {
            Boundary::DataloaderNext
        } else if t.n_optimizer_exits > 0 {
            Boundary::OptimizerStep
        } else {
            Boundary::SyncPattern
        };
        let windowed = t.n_input_calls > 0 && t.n_optimizer_exits > 0;
        if !windowed
            && !self.ending
            && t.n_input_calls > 0
            && (1..ACCUMULATION_WAIT).contains(&t.n_backwards)
        {
            return None;
        }
        Some((tid, boundary, windowed))
    }

    /// Measures the training thread's steps that end before `watermark` (and before anything
    /// still open on it), adds them to the output, and prunes what they no longer need.
    fn harvest(&mut self, watermark: u64) {
        let Some((tid, boundary, windowed)) = self.choose() else {
            return;
        };
        if self.choice.is_some_and(|c| c != (tid, boundary, windowed)) {
            // The leading thread or boundary changed: start cutting afresh.
            self.cutter = Cutter::default();
        }
        self.choice = Some((tid, boundary, windowed));
        let main = &self.folds[&tid];
        let w = main.open_since().map_or(watermark, |o| o.min(watermark));
        let mut cut = Cut::default();
        let consumed = self.cut_trace(tid, boundary, windowed, w, &mut cut);
        let t = self.folds[&tid].trace();
        self.partial += cut.partial;
        if cut.steps.is_empty() && cut.evals.is_empty() {
            return;
        }
        let timeline = Timeline::build(&t.intervals, &t.prep);
        for &(start, end, batches) in &cut.evals {
            let e = &mut self.evaluation;
            e.segments += 1;
            e.batches += u64::from(batches);
            e.wall_ns += end - start;
            for (sum, ns) in e.phase_ns.iter_mut().zip(timeline.split(start, end)) {
                *sum += ns;
            }
        }
        let Some(&(_, last_end)) = cut.steps.last() else {
            return;
        };
        let mut steps = measure(
            &cut,
            self.totals.count,
            tid,
            t,
            self.folds.iter().map(|(k, f)| (*k, f.trace())),
            &timeline,
        );
        for s in &mut steps {
            s.learning = self
                .armed
                .iter()
                .any(|&(a, b)| a < s.end_ns && b.is_none_or(|b| b > s.start_ns));
        }
        let mut stacks = std::mem::take(&mut self.stacks);
        stacks.sort_by_key(|s| s.ts);
        let (placed, later): (Vec<_>, Vec<_>) = stacks.into_iter().partition(|s| s.ts < last_end);
        let mut placed = place_samples(&placed, tid, &steps, &timeline);
        mark_samples(&mut placed, t);
        prep::apply(
            &mut steps,
            &mut placed,
            &self.func_kinds,
            &mut self.prep_pool,
        );
        for p in placed {
            self.samples.push(p);
        }
        self.stacks = later;
        for s in steps {
            self.totals.add(&s);
            if !s.learning {
                self.steady.add(&s);
            }
            self.steps.push(s);
        }
        self.thread_states |= !t.off_cpu.is_empty();
        self.prune(tid, consumed, last_end);
        self.armed.retain(|&(_, b)| b.is_none_or(|b| b > last_end));
    }

    /// Cuts the training thread's trace up to `w` by `boundary` into `cut`; how many of its
    /// input calls were consumed.
    fn cut_trace(
        &mut self,
        tid: u32,
        boundary: Boundary,
        windowed: bool,
        w: u64,
        cut: &mut Cut,
    ) -> usize {
        let t = self.folds[&tid].trace();
        match boundary {
            _ if windowed => {
                self.cutter.armed = self.armed_ts.unwrap_or(0);
                cut_windows(&mut self.cutter, t, w, self.ending, cut);
                t.input_calls.iter().take_while(|c| c.ts < w).count()
            }
            Boundary::DataloaderNext => {
                let calls: Vec<InputCall> =
                    t.input_calls.iter().filter(|c| c.ts < w).copied().collect();
                cut_dataloader(&mut self.cutter, &calls, t.first_ts, cut);
                calls.len()
            }
            Boundary::OptimizerStep => {
                let exits: Vec<u64> = t
                    .optimizer_exits
                    .iter()
                    .copied()
                    .filter(|&x| x < w)
                    .collect();
                cut_exits(&mut self.cutter, &exits, t.first_ts, &t.grad_off, cut);
                0
            }
            _ => {
                let best = t
                    .sync_api_counts
                    .iter()
                    .max_by_key(|&(api, n)| (*n, std::cmp::Reverse(*api)))
                    .map(|(api, _)| *api);
                let exits: Vec<u64> = t
                    .sync_exits
                    .iter()
                    .filter(|&&(api, x)| Some(api) == best && x < w)
                    .map(|&(_, x)| x)
                    .collect();
                cut_exits(&mut self.cutter, &exits, t.first_ts, &[], cut);
                0
            }
        }
    }

    /// Every thread's trace pruned up to `last_end`: the training thread's `consumed` input
    /// calls; another thread's finished fetches, a feeder's (same process) input side, counted.
    fn prune(&mut self, tid: u32, consumed: usize, last_end: u64) {
        let tgid = self.folds[&tid].trace().tgid;
        for (k, f) in self.folds.iter_mut() {
            let n = if *k == tid {
                consumed
            } else {
                let t = f.trace();
                let done: Vec<&InputCall> = t
                    .input_calls
                    .iter()
                    .take_while(|c| c.end.is_some_and(|e| e <= last_end))
                    .collect();
                if !done.is_empty() && t.tgid == tgid {
                    let fd = self.feeders.entry(*k).or_insert(Feeder {
                        tid: *k,
                        ..Feeder::default()
                    });
                    fd.fetches += done.len() as u64;
                    fd.fetch_ns += done
                        .iter()
                        .map(|c| c.end.unwrap_or(c.ts) - c.ts)
                        .sum::<u64>();
                }
                done.len()
            };
            f.trace_mut().prune(last_end, n);
        }
    }

    /// The engine's output: every event folded, open entries closed at the last event (not
    /// counted as lost), the last steps harvested.
    pub fn finish(mut self) -> EngineOutput {
        self.release(u64::MAX);
        self.apply_python_marks(self.last_ts);
        let mut out = EngineOutput {
            reordered_events: self.reordered,
            boundary: Some(Boundary::None),
            events: self.events,
            last_ts: self.first_ts.map(|_| self.last_ts),
            after_exec_events: self.after_exec,
            markers: self.markers,
            workers: std::mem::take(&mut self.workers),
            ledger: std::mem::take(&mut self.ledger),
            ..EngineOutput::default()
        };
        if self.first_ts.is_none() {
            return out;
        }
        let end = self.last_ts;
        let folds = std::mem::take(&mut self.folds);
        for (tid, f) in folds {
            self.folds.insert(tid, ThreadFold::finished(f.finish(end)));
        }
        self.ending = true;
        self.harvest(u64::MAX);
        if let Some((tid, _, _)) = self.choice {
            // The step still open at the end of the trace is cut by it.
            let t = self.folds[&tid].trace();
            let tail = match self.choice.map(|c| c.1) {
                Some(Boundary::DataloaderNext) => self.cutter.open.is_some(),
                _ => self.cutter.open.is_some_and(|o| t.last_ts > o),
            };
            if tail {
                self.partial += 1;
            }
        }
        out.unmatched_events = self.folds.values().map(|f| f.trace().unmatched).sum();
        out.training_tid = self.choice.map(|c| c.0);
        out.boundary = Some(self.choice.map_or(Boundary::None, |c| c.1));
        out.partial_steps_dropped = self.partial;
        out.steps = self.steps.items;
        out.step_stride = self.steps.stride;
        out.samples = self.samples.items;
        self.prep_pool.settle(&mut self.totals, &mut self.steady);
        out.totals = self.totals;
        out.steady = self.steady;
        out.evaluation = self.evaluation;
        out.feeders = self.feeders.into_values().collect();
        out.thread_states = self.thread_states;
        out
    }
}

/// Folds a whole stream: [`Engine::push`] every item, then [`Engine::finish`].
pub fn run(items: &[StreamItem]) -> EngineOutput {
    let mut e = Engine::new();
    for i in items {
        e.push(i);
    }
    e.finish()
}

/// Each stack sample's thread state (the thread's off-CPU intervals, disjoint and in time
/// order) and the wait it was in (the outermost waits, disjoint and in time order too).
fn mark_samples(placed: &mut [PhaseSample], t: &ThreadTrace) {
    let off = &t.off_cpu;
    let off_at = |ts: u64| {
        let i = off.partition_point(|&(_, b, _)| b <= ts);
        off.get(i)
            .filter(|&&(a, _, _)| a <= ts)
            .map(|&(_, _, st)| st)
    };
    let waits = &t.waits;
    let wait_at = |ts: u64| {
        let i = waits.partition_point(|&(_, b, _)| b <= ts);
        waits
            .get(i)
            .filter(|&&(a, _, _)| a <= ts)
            .map(|&(_, _, api)| api)
    };
    for p in placed {
        p.off_cpu = off_at(p.ts);
        p.wait = wait_at(p.ts);
    }
}
