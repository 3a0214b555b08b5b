//! The per-thread stack machine: matches entries with exits on one thread, survives lost events,
//! and reduces the thread's events to what the engine needs (phase intervals, DataLoader calls,
//! optimizer and sync exits, copies, syncs, launches each counted once).
//!
//! All open things of a thread (tracked Python frames, native calls with an exit probe,
//! `record_function`s) live on ONE stack in entry order. An exit pops its entry and everything
//! still open above it: whatever was entered after a frame and is still open when that frame
//! returns must have ended unseen (lost exit). Rules that bound the damage of a lost exit:
//! - `PyExit` matches the innermost open frame with the same code object; `CallExit` the innermost
//!   open call with the same api; `RecordExit` the innermost open record. Entries above the match
//!   are closed at the exit's timestamp and counted as unmatched; an exit with no match is counted
//!   and ignored.
//! - Blocking syncs and copies are leaves: nothing else happens on their thread until they return,
//!   except a driver call nested in a runtime call. Any other event of the thread closes an open
//!   leaf at its own timestamp (counted as unmatched).
//! - The DataLoader's `__next__` never recurses: entering it (frame or `enumerate(DataLoader)#`
//!   record) while the same kind is open closes the stale one (counted).
//!
//! Entries still open when the trace ends are closed at the trace end and not counted: the trace
//! cut them, no event was lost.
use std::collections::HashMap;

use crate::classify::{RecordClass, classify_record};
use crate::event::{Api, Class, CopyKind, Kind, LaunchPath, OffCpu};
use crate::phase::Phase;

/// Direction of a copy call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dir {
    H2d,
    D2h,
    /// Host-to-host, device-to-device, `cudaMemcpyDefault` or unknown: no direction we account.
    Other,
}

impl Dir {
    fn of(api: Api, copy: Option<CopyKind>) -> Dir {
        match copy {
            Some(CopyKind::HostToDevice) => Dir::H2d,
            Some(CopyKind::DeviceToHost) => Dir::D2h,
            Some(_) => Dir::Other,
            None => match api {
                Api::CuMemcpyHtoD | Api::CuMemcpyHtoDAsync => Dir::H2d,
                Api::CuMemcpyDtoH | Api::CuMemcpyDtoHAsync => Dir::D2h,
                _ => Dir::Other,
            },
        }
    }
}

/// One call of the DataLoader iterator (outermost `__next__` frame or `enumerate(DataLoader)#`
/// record of a thread).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct InputCall {
    pub ts: u64,
    /// Its frame returned NULL (StopIteration at the end of an epoch).
    pub raised: bool,
    /// When it returned (`None` while open).
    pub end: Option<u64>,
}

/// One outermost copy call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Copy {
    pub start: u64,
    /// `None` while open (closed at the trace end by [`ThreadFold::finish`]).
    pub end: Option<u64>,
    pub dir: Dir,
    pub bytes: u64,
}

/// What one thread's events reduce to.
#[derive(Clone, Debug, Default)]
pub(crate) struct ThreadTrace {
    pub tgid: u32,
    pub first_ts: u64,
    pub last_ts: u64,
    /// Closed intervals `[start, end)` during which the phase's cause was open on this thread.
    pub intervals: Vec<(u64, u64, Phase)>,
    pub input_calls: Vec<InputCall>,
    /// Matched exits of outermost optimizer steps.
    pub optimizer_exits: Vec<u64>,
    /// Starts of outermost backward passes (one per micro-batch of a training step).
    pub backward_starts: Vec<u64>,
    /// Matched exits of outermost blocking syncs.
    pub sync_exits: Vec<(Api, u64)>,
    /// Entries of outermost blocking syncs.
    pub syncs: Vec<u64>,
    /// The outermost spans in which the host waited for the device (a blocking sync or a
    /// device-to-host copy), with the API called, in time order: what a `gpu_wait` stack
    /// sample waited in.
    pub waits: Vec<(u64, u64, Api)>,
    pub copies: Vec<Copy>,
    /// Launches and how they reached the driver, each once (a driver call nested in a runtime
    /// launch is that launch: see [`ThreadFold::launch`]).
    pub launches: Vec<(u64, LaunchPath)>,
    /// Collectives issued: (entry, bytes when known).
    pub collectives: Vec<(u64, Option<u64>)>,
    /// Input preparation `[start, end)`: from the end of the last fetch or optimizer step to
    /// the model's first operation (module call or kernel launch) before a backward pass, where
    /// one was seen (see [`ThreadFold::open`]). A phase below the markers: `zero_grad`, copies and
    /// syncs inside it keep their own phase.
    pub prep: Vec<(u64, u64)>,
    /// Intervals `[since, end)` this thread spent off its CPU, and why (`sched_switch`).
    pub off_cpu: Vec<(u64, u64, OffCpu)>,
    /// Grad mode off `[start, end)` outside an optimizer step and a backward pass: evaluation
    /// (`torch.no_grad()`), and since when it is off now.
    pub grad_off: Vec<(u64, u64)>,
    pub grad_off_open: Option<u64>,
    /// Grad-mode switches seen on this thread (the probe is placed and the thread trains or
    /// evaluates: every optimizer step switches it).
    pub n_grad_switches: u64,
    /// Lost-event evidence: exits without entries, entries closed by the rules above.
    pub unmatched: u64,
    /// Since the thread's first event (the vectors above are pruned as steps are harvested):
    /// DataLoader calls, matched outermost optimizer exits, matched outermost sync exits by API.
    pub n_input_calls: u64,
    pub n_optimizer_exits: u64,
    pub n_backwards: u64,
    pub sync_api_counts: std::collections::BTreeMap<Api, u64>,
    /// Entries drained from the front of `input_calls` and `copies` (open entries keep absolute
    /// indexes).
    pub input_base: usize,
    pub copies_base: usize,
}

impl ThreadTrace {
    /// Drops what only concerns time before `cut` (the end of the last harvested step): closed
    /// intervals and copies that ended before it, launches, syncs and exits before it, and the
    /// first `consumed_calls` DataLoader calls (the cutter keeps the open step's start itself).
    pub fn prune(&mut self, cut: u64, consumed_calls: usize) {
        self.intervals.retain(|&(_, e, _)| e > cut);
        let n = consumed_calls.min(self.input_calls.len());
        self.input_calls.drain(..n);
        self.input_base += n;
        self.optimizer_exits.retain(|&t| t >= cut);
        self.backward_starts.retain(|&t| t >= cut);
        self.sync_exits.retain(|&(_, t)| t >= cut);
        self.syncs.retain(|&t| t >= cut);
        self.waits.retain(|&(_, e, _)| e > cut);
        self.launches.retain(|&(t, _)| t >= cut);
        self.collectives.retain(|&(t, _)| t >= cut);
        self.prep.retain(|&(_, e)| e > cut);
        self.off_cpu.retain(|&(_, e, _)| e > cut);
        self.grad_off.retain(|&(_, e)| e > cut);
        let done = self
            .copies
            .iter()
            .take_while(|c| c.start < cut && c.end.is_some())
            .count();
        self.copies.drain(..done);
        self.copies_base += done;
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Key {
    Code(u64),
    Api(Api),
    Record,
    DlFrame,
    DlRecord,
}

#[derive(Clone, Copy, Debug)]
enum What {
    Py,
    Call { api: Api },
    Record,
}

#[derive(Clone, Debug)]
struct Open {
    what: What,
    keys: [Option<Key>; 2],
    start: u64,
    phase: Option<Phase>,
    /// Index in `input_calls` when this entry started a DataLoader call.
    input_call: Option<usize>,
    /// Index in `copies` when this is an outermost copy.
    copy: Option<usize>,
    outer_optimizer: bool,
    outer_sync: bool,
    /// An outermost DataLoader call inside which another DataLoader entry (torch's
    /// `record_function`) was already seen.
    inner_input: bool,
    /// An outermost optimizer step inside which a nested optimizer entry (torch's
    /// `record_function` of the step) already returned: the update itself is over.
    inner_optimizer_done: bool,
}

impl Open {
    /// Blocking calls nothing else happens inside on their thread: syncs, copies, and waits for
    /// a collective (whose end may be unseen: the next event of the thread ends it).
    fn is_leaf(&self) -> bool {
        matches!(self.what, What::Call { api } if api.is_sync() || api.is_copy() || api == Api::CollectiveWait)
    }
}

/// The marks of a batch being ready in a forward span (see [`ThreadFold::forward_op`]).
#[derive(Clone, Copy, Debug, Default)]
struct ForwardOp {
    module: Option<u64>,
    copy: Option<u64>,
}

/// The fold over one thread's events, in timestamp order.
#[derive(Clone, Debug, Default)]
pub(crate) struct ThreadFold {
    out: ThreadTrace,
    stack: Vec<Open>,
    /// Stack positions of the open entries with each key, innermost last.
    index: HashMap<Key, Vec<usize>>,
    input_depth: u32,
    optimizer_depth: u32,
    backward_depth: u32,
    /// Where the forward span that the next backward closes started: the end of the last
    /// outermost DataLoader call or optimizer step (see [`ThreadFold::open`]).
    forward_from: Option<u64>,
    /// Where the batch is ready in that span: the model's first module call, or (no module call
    /// seen: the frame-evaluator probe detached) the batch's first host-to-device copy, outside
    /// any fetch, optimizer step or backward pass. Not a kernel launch: a model may do host work
    /// before its first kernel, and that is forward.
    forward_op: ForwardOp,
    /// A DataLoader call whose Python frame the frame-evaluator probe's detach closed before
    /// torch's `record_function` of the same fetch was entered: that entry continues the call
    /// instead of starting a batch of its own (see [`ThreadFold::close_python`]).
    input_cut: Option<usize>,
    sync_depth: u32,
    copy_depth: u32,
    seen: bool,
    /// The thread's previous event was this collective's issue (nothing happened on the
    /// thread since): a wait that follows starts there.
    issued: Option<u64>,
}

impl ThreadFold {
    /// Whether the thread is inside a wait for a collective now (entered, not yet returned).
    pub(crate) fn in_collective_wait(&self) -> bool {
        self.stack
            .iter()
            .any(|o| matches!(o.what, What::Call { api } if api == Api::CollectiveWait))
    }

    /// Folds one event; `class` resolves a code object address to its class.
    pub fn push(&mut self, ts: u64, tgid: u32, kind: &Kind, class: impl Fn(u64) -> Class) {
        if !self.seen {
            self.seen = true;
            self.out.tgid = tgid;
            self.out.first_ts = ts;
        }
        self.out.last_ts = ts;
        self.close_stale_leaves(ts, kind);
        let issued = self.issued.take();
        match *kind {
            Kind::PyEnter { code, .. } => self.py_enter(ts, code, class(code)),
            Kind::PyExit { code, raised } => self.close_matching(Key::Code(code), ts, raised),
            Kind::CallEnter { api, bytes, .. } if api.is_collective() => {
                // An entry marker: nothing opens.
                self.out.collectives.push((ts, bytes));
                self.issued = Some(ts);
            }
            Kind::CallEnter {
                api, bytes, copy, ..
            } => self.call_enter(ts, api, bytes, copy, issued),
            // The end marker of a collective wait also runs where no wait is open (at launch,
            // on other threads): only an open wait is closed.
            Kind::CallExit {
                api: Api::CollectiveWait,
                ..
            } if self
                .index
                .get(&Key::Api(Api::CollectiveWait))
                .is_none_or(|v| v.is_empty()) =>
            {
                // Part of the issue path (it also runs when a collective is launched): the
                // thread is still on its way from the issue to the wait.
                self.issued = issued;
            }
            Kind::CallExit { api, .. } => self.close_matching(Key::Api(api), ts, false),
            Kind::Launch { api, path } => {
                self.launch(ts, path.unwrap_or(LaunchPath::of(api, None)))
            }
            Kind::RecordEnter { ref name } => self.record_enter(ts, name),
            Kind::RecordExit => self.close_matching(Key::Record, ts, false),
            // The engine ends the process's trace there; nothing opens or closes.
            Kind::Exec => {}
            Kind::OffCpu { since, state } => {
                if ts > since {
                    self.out.off_cpu.push((since, ts, state));
                }
            }
            Kind::GradMode { enabled } => self.grad_mode(ts, enabled),
        }
    }

    /// Autograd's grad mode set: switched off outside an optimizer step and a backward pass (the
    /// optimizer's own guard is inside its step), it is evaluation until switched on again.
    fn grad_mode(&mut self, ts: u64, enabled: bool) {
        self.out.n_grad_switches += 1;
        if self.optimizer_depth > 0 || self.backward_depth > 0 {
            return;
        }
        match (enabled, self.out.grad_off_open) {
            (false, None) => self.out.grad_off_open = Some(ts),
            (true, Some(s)) => {
                self.out.grad_off_open = None;
                if ts > s {
                    self.out.grad_off.push((s, ts));
                }
            }
            _ => {}
        }
    }

    /// The model's first operation since the forward span started, if nothing else claims it.
    fn mark_forward_op(&mut self, ts: u64, module: bool) {
        if self.forward_from.is_some()
            && self.input_depth == 0
            && self.optimizer_depth == 0
            && self.backward_depth == 0
        {
            let slot = if module {
                &mut self.forward_op.module
            } else {
                &mut self.forward_op.copy
            };
            slot.get_or_insert(ts);
        }
    }

    /// A tracked Python frame entered, of class `class`: opened with its phase (a DataLoader
    /// `__next__` closes a stale one first).
    fn py_enter(&mut self, ts: u64, code: u64, class: Class) {
        if class == Class::ModuleCall {
            self.mark_forward_op(ts, true);
        }
        let dl = class == Class::DataLoaderNext;
        if dl {
            self.close_innermost(Key::DlFrame, ts);
        }
        let phase = match class {
            Class::DataLoaderNext => Some(Phase::InputWait),
            Class::ModuleCall => Some(Phase::Forward),
            Class::OptimizerStep => Some(Phase::Optimizer),
            Class::Backward => Some(Phase::Backward),
            Class::Pending | Class::Ignore => None,
        };
        self.open(
            What::Py,
            [Some(Key::Code(code)), dl.then_some(Key::DlFrame)],
            ts,
            phase,
        );
    }

    /// A native call with an exit probe entered (not a collective's issue): opened with its
    /// phase; an outermost copy is also recorded. `issued`: the thread's previous event was a
    /// collective's issue, at that time.
    fn call_enter(
        &mut self,
        ts: u64,
        api: Api,
        bytes: Option<u64>,
        copy: Option<CopyKind>,
        issued: Option<u64>,
    ) {
        let phase = if api.is_sync() {
            Some(Phase::GpuWait)
        } else if api.is_copy() {
            match Dir::of(api, copy) {
                Dir::D2h => Some(Phase::GpuWait),
                Dir::H2d => Some(Phase::H2d),
                Dir::Other => None,
            }
        } else if api == Api::TorchBackward {
            Some(Phase::Backward)
        } else if api == Api::CollectiveWait {
            Some(Phase::CollectiveWait)
        } else {
            None
        };
        // A thread that issues a collective and then waits for it, with nothing in
        // between (a synchronous `dist.all_reduce`, DDP's last bucket at the end of
        // backward), is blocked from the issue on: the issue's own work (dispatch,
        // enqueue to the backend's threads) is the collective's too.
        let start = match issued {
            Some(at) if api == Api::CollectiveWait => at,
            _ => ts,
        };
        if phase == Some(Phase::H2d) && self.copy_depth == 0 {
            // The batch goes to the device: what came before it prepared the batch.
            self.mark_forward_op(ts, false);
        }
        let idx = self.open(
            What::Call { api },
            [Some(Key::Api(api)), None],
            start,
            phase,
        );
        if api.is_copy() && self.copy_depth == 1 {
            self.out.copies.push(Copy {
                start: ts,
                end: None,
                dir: Dir::of(api, copy),
                bytes: bytes.unwrap_or(0),
            });
            self.stack[idx].copy = Some(self.out.copies_base + self.out.copies.len() - 1);
        }
    }

    /// A kernel launch. A driver entry point the kernel saw called from inside a CUDA
    /// runtime is that runtime launch's own driver call (counted at the runtime probe), not a
    /// launch; every other driver launch is one, however soon after a runtime launch.
    fn launch(&mut self, ts: u64, path: LaunchPath) {
        if path != LaunchPath::Nested {
            self.out.launches.push((ts, path));
        }
    }

    /// A `record_function` opened: opened with its phase (a DataLoader record closes a stale
    /// one first).
    fn record_enter(&mut self, ts: u64, name: &str) {
        let class = classify_record(name);
        let dl = class == Some(RecordClass::DataLoaderNext);
        if dl {
            self.close_innermost(Key::DlRecord, ts);
        }
        let phase = match class {
            Some(RecordClass::DataLoaderNext) => Some(Phase::InputWait),
            Some(RecordClass::OptimizerStep) => Some(Phase::Optimizer),
            Some(RecordClass::ZeroGrad) => Some(Phase::Residual),
            None => None,
        };
        self.open(
            What::Record,
            [Some(Key::Record), dl.then_some(Key::DlRecord)],
            ts,
            phase,
        );
    }

    /// A fold whose events are all in: its reduction, nothing open.
    pub fn finished(out: ThreadTrace) -> ThreadFold {
        ThreadFold {
            out,
            seen: true,
            ..ThreadFold::default()
        }
    }

    /// What the fold has reduced so far (pruned by the engine as steps are harvested).
    pub fn trace(&self) -> &ThreadTrace {
        &self.out
    }

    pub fn trace_mut(&mut self) -> &mut ThreadTrace {
        &mut self.out
    }

    /// The earliest instant something still open may yet add to: the start of the oldest open
    /// entry with a phase, or of the pending forward span. Steps ending after it are not final.
    pub fn open_since(&self) -> Option<u64> {
        self.stack
            .iter()
            .filter(|o| o.phase.is_some())
            .map(|o| o.start)
            .chain(self.forward_from)
            .chain(self.out.grad_off_open)
            .min()
    }

    /// Closes what is still open at `end` (not counted as lost) and returns the reduction.
    pub fn finish(mut self, end: u64) -> ThreadTrace {
        while let Some(top) = self.stack.pop() {
            self.close(top, end, false, false);
        }
        self.out
    }

    fn open(&mut self, what: What, keys: [Option<Key>; 2], ts: u64, phase: Option<Phase>) -> usize {
        let pos = self.stack.len();
        for k in keys.into_iter().flatten() {
            self.index.entry(k).or_default().push(pos);
        }
        let mut open = Open {
            what,
            keys,
            start: ts,
            phase,
            input_call: None,
            copy: None,
            outer_optimizer: false,
            outer_sync: false,
            inner_input: false,
            inner_optimizer_done: false,
        };
        if phase == Some(Phase::InputWait) {
            if let Some(i) = self.input_cut.take().filter(|_| self.input_depth == 0) {
                // The fetch the detach cut: this is its record_function, not a new batch.
                open.input_call = Some(i);
                open.inner_input = true;
            } else if self.input_depth == 0 {
                self.out.input_calls.push(InputCall {
                    ts,
                    raised: false,
                    end: None,
                });
                self.out.n_input_calls += 1;
                open.input_call = Some(self.out.input_base + self.out.input_calls.len() - 1);
                // A new batch before any backward: the span since the last one was no forward
                // pass we can delimit (an evaluation loop, a skipped batch).
                self.forward_from = None;
                self.forward_op = ForwardOp::default();
            } else if let Some(outer) = self.stack.iter_mut().find(|o| o.input_call.is_some()) {
                outer.inner_input = true;
            }
            self.input_depth += 1;
        } else {
            // Anything else entered after the cut: the fetch was over.
            self.input_cut = None;
        }
        if phase == Some(Phase::Backward) {
            // The forward span: from the end of the last batch fetch (or optimizer step) to the
            // start of backward. It holds the model's forward, the loss, and whatever the loop
            // does in between except what a more specific marker claims (copies, syncs,
            // `zero_grad`).
            if self.backward_depth == 0 {
                let op = std::mem::take(&mut self.forward_op);
                let op = op.module.or(op.copy);
                if let Some(from) = self.forward_from.take()
                    && ts > from
                {
                    // What ran before the model's first operation prepared its input (a
                    // `get_batch`, a queue fed by another thread, augmentation on this thread).
                    let op = op.filter(|&m| m > from && m < ts).unwrap_or(from);
                    if op > from {
                        self.out.prep.push((from, op));
                    }
                    self.out.intervals.push((from, ts, Phase::Forward));
                }
                self.out.backward_starts.push(ts);
                self.out.n_backwards += 1;
            }
            self.backward_depth += 1;
        }
        if phase == Some(Phase::Optimizer) {
            open.outer_optimizer = self.optimizer_depth == 0;
            self.optimizer_depth += 1;
        }
        if let What::Call { api } = what {
            if api.is_sync() {
                open.outer_sync = self.sync_depth == 0;
                if open.outer_sync {
                    self.out.syncs.push(ts);
                }
                self.sync_depth += 1;
            }
            if api.is_copy() {
                self.copy_depth += 1;
            }
        }
        self.stack.push(open);
        pos
    }

    /// Pops the top entry: `matched` when its own exit closed it.
    fn pop(&mut self, end: u64, matched: bool, raised: bool) {
        let Some(top) = self.stack.pop() else { return };
        let pos = self.stack.len();
        for k in top.keys.into_iter().flatten() {
            if let Some(v) = self.index.get_mut(&k) {
                debug_assert_eq!(v.last(), Some(&pos));
                v.pop();
            }
        }
        if !matched {
            self.out.unmatched += 1;
        }
        self.close(top, end, matched, raised);
    }

    fn close(&mut self, top: Open, end: u64, matched: bool, raised: bool) {
        if let Some(p) = top.phase {
            self.out.intervals.push((top.start, end.max(top.start), p));
        }
        if let (Some(Phase::GpuWait), What::Call { api }) = (top.phase, top.what)
            && !self.stack.iter().any(|o| o.phase == Some(Phase::GpuWait))
        {
            self.out.waits.push((top.start, end.max(top.start), api));
        }
        if p_is(top.phase, Phase::InputWait) {
            self.input_depth -= 1;
            if self.input_depth == 0 {
                self.forward_from = Some(end);
                self.forward_op = ForwardOp::default();
            }
        }
        if p_is(top.phase, Phase::Backward) {
            self.backward_depth -= 1;
            if self.backward_depth == 0 && self.optimizer_depth == 0 {
                // The next micro-batch's forward (gradient accumulation, a window of batches
                // fetched ahead) runs from here to its backward.
                self.forward_from = Some(end);
                self.forward_op = ForwardOp::default();
            }
        }
        if let Some(i) = top
            .input_call
            .and_then(|i| i.checked_sub(self.out.input_base))
            && let Some(call) = self.out.input_calls.get_mut(i)
        {
            call.raised = matched && raised;
            call.end = Some(end);
        }
        if p_is(top.phase, Phase::Optimizer) {
            self.optimizer_depth -= 1;
            if top.outer_optimizer && matched {
                self.out.optimizer_exits.push(end);
                self.out.n_optimizer_exits += 1;
            } else if matched && let Some(outer) = self.stack.iter_mut().find(|o| o.outer_optimizer)
            {
                outer.inner_optimizer_done = true;
            }
            if self.optimizer_depth == 0 {
                self.forward_from = Some(end);
                self.forward_op = ForwardOp::default();
            }
        }
        if let What::Call { api } = top.what {
            if api.is_sync() {
                self.sync_depth -= 1;
                if top.outer_sync && matched {
                    self.out.sync_exits.push((api, end));
                    *self.out.sync_api_counts.entry(api).or_default() += 1;
                }
            }
            if api.is_copy() {
                self.copy_depth -= 1;
            }
        }
        if let Some(i) = top.copy.and_then(|i| i.checked_sub(self.out.copies_base))
            && let Some(c) = self.out.copies.get_mut(i)
        {
            c.end = Some(end.max(top.start));
        }
    }

    /// The frame-evaluator probe was detached at `ts`: frames still open will report no exit.
    /// Closes them there (not counted as lost), keeping every other open entry in place.
    pub fn close_python(&mut self, ts: u64) {
        let mut stack = std::mem::take(&mut self.stack);
        self.index.clear();
        // An optimizer step whose Python frame is cut: torch's record_function of the step,
        // nested in the frame and still open, is now the outermost step and its exit the
        // step's; if that record already returned, the update is over and the step ends here.
        // (A frame cut before its record entered leaves the record to open as the outermost.)
        if let Some(i) = stack
            .iter()
            .position(|o| o.outer_optimizer && matches!(o.what, What::Py))
        {
            let done = stack[i].inner_optimizer_done;
            match stack[i + 1..]
                .iter_mut()
                .find(|o| !matches!(o.what, What::Py) && p_is(o.phase, Phase::Optimizer))
            {
                Some(inner) => inner.outer_optimizer = true,
                None if done => {
                    self.out.optimizer_exits.push(ts);
                    self.out.n_optimizer_exits += 1;
                }
                None => {}
            }
            stack[i].outer_optimizer = false;
        }
        for open in stack {
            if matches!(open.what, What::Py) {
                // A DataLoader `__next__` frame cut before torch's record_function of the
                // fetch was entered: that record, when it comes, is the same batch.
                if self.input_depth == 1 && open.input_call.is_some() && !open.inner_input {
                    self.input_cut = open.input_call;
                }
                self.close(open, ts, false, false);
            } else {
                let pos = self.stack.len();
                for k in open.keys.into_iter().flatten() {
                    self.index.entry(k).or_default().push(pos);
                }
                self.stack.push(open);
            }
        }
    }

    /// Exit of the innermost entry with `key`: pops everything above it as lost, then it.
    fn close_matching(&mut self, key: Key, ts: u64, raised: bool) {
        match self.index.get(&key).and_then(|v| v.last().copied()) {
            Some(pos) => {
                while self.stack.len() > pos + 1 {
                    self.pop(ts, false, false);
                }
                self.pop(ts, true, raised);
            }
            None => self.out.unmatched += 1,
        }
    }

    /// Closes the innermost entry with `key` and everything above it as lost (stale re-entry).
    fn close_innermost(&mut self, key: Key, ts: u64) {
        if let Some(pos) = self.index.get(&key).and_then(|v| v.last().copied()) {
            while self.stack.len() > pos {
                self.pop(ts, false, false);
            }
        }
    }

    /// Closes open leaf calls (syncs, copies) that `kind` proves have returned unseen.
    fn close_stale_leaves(&mut self, ts: u64, kind: &Kind) {
        while let Some(top) = self.stack.last() {
            if !top.is_leaf() {
                return;
            }
            let What::Call { api: top_api } = top.what else {
                return;
            };
            let allowed = match kind {
                Kind::CallExit { .. } => true,
                Kind::CallEnter { api, .. } => api.is_driver() && !top_api.is_driver(),
                // The scheduler's record of the thread coming back on CPU: inside a blocking
                // sync or copy that is the wait itself, not the thread's next action.
                Kind::OffCpu { .. } => true,
                _ => false,
            };
            if allowed {
                return;
            }
            self.pop(ts, false, false);
        }
    }
}

fn p_is(p: Option<Phase>, want: Phase) -> bool {
    p == Some(want)
}
