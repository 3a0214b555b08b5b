//! Step cutters: where steps start and end on the training thread, from its DataLoader calls,
//! backward starts and optimizer / sync exits. Stateful across harvests ([`Cutter`]); each call
//! is given the marks not yet cut and appends to a [`Cut`].
//!
//! # Optimizer-step windows
//! A loop with DataLoader calls and optimizer steps is cut by its optimizer steps: the marks
//! between two optimizer exits form a window (fetches `F`, outermost backward starts `B`). A
//! window with `n` fetches and `b` backwards holds `min(n, b)` training micro-batches; the
//! fetches before them that no backward consumed are evaluation batches (fetch + forward, no
//! backward: `torch.no_grad()`, `model.eval()` loops, HF `evaluate`, Lightning validation). So:
//! - the training step in progress ends at the window's first evaluation fetch, or at a
//!   StopIteration that ended its epoch, or else at the fetch of the window's first training
//!   micro-batch, where the next step starts: a step is one optimizer step with all its
//!   micro-batches, however their fetches are grouped ahead (transformers fetches the whole
//!   accumulation window before the first forward);
//! - the evaluation fetches and everything up to the first training fetch are one evaluation
//!   segment, never a step;
//! - a window without fetches (two optimizers per batch, a GAN) continues the step in progress.
//!
//! Prefetching iterators (Lightning's fetcher, accelerate's `DataLoaderShard`) call the
//! DataLoader one batch ahead: the first window of an epoch then holds one fetch more than its
//! micro-batches. The cutter learns that a loop prefetches when an epoch's StopIteration comes
//! right before a backward (the prefetch of a batch that does not exist, while the last batch
//! still trains), and then allows one extra fetch in the first window of each epoch (and in the
//! run's first window when the extra is exactly one). A StopIteration followed by another fetch
//! ends an epoch (or an evaluation loop) and is no batch. Seen through torch's markers only
//! (the frame-evaluator probe detached), a StopIteration returns like a batch: a window's one
//! leading fetch more than its backwards, grad mode on at it, is taken for that epoch end.
//!
//! # Which fetches are evaluation
//! A fetch is an evaluation batch when autograd's grad mode is off at it, outside an optimizer
//! step (`torch.no_grad()`: `ThreadTrace::grad_off`), or when it belongs to a group of fetches
//! no backward consumed. Fetches come in groups: fetches back to back (less than
//! [`GROUP_GAP_NS`], and than a tenth of the longer fetch, between one's return and the next
//! one's entry, no backward between; time the thread spent preempted in between does not
//! count) are one group: loaders zipped (`zip(labelled, unlabelled)`: every loader's fetch is
//! the step's input)
//! or a window fetched ahead (transformers). A window's groups are counted against its
//! backwards as fetches were before: `g` groups and `b` backwards leave `g - min(g, b)` groups
//! unconsumed, the leading ones evaluation (an evaluation loop under `model.eval()` alone
//! separates its fetches by forwards). A grad-off span with no fetch in the window
//! (evaluation over tensors already loaded) is an evaluation segment too. With
//! `OptimizerStep` boundaries (no DataLoader on the training thread), the grad-off spans inside
//! a step are an evaluation segment and the step starts after the last one.
use super::thread::{InputCall, ThreadTrace};
use super::timeline::{Cut, push_step};

/// Fetches closer than this (one's return to the next one's entry, time preempted excluded),
/// and than a tenth of the longer of the two, are one group: loaders zipped, or a window
/// fetched ahead. An evaluation's forward between two fetches is longer. 10 ms: between two
/// zipped loaders' fetches run `zip`'s and the DataLoader's own Python, measured at 0.5–2.2 ms
/// of running time with the frame-evaluator probe armed (zipped_slow_first: at 0.2 ms its slow
/// fetch fell out of most steps under load, input 0.17 against truth 0.67; at 2 ms out of 9 of
/// 100 on a quiet machine, 0.672 against 0.695). The tenth-of-the-fetch rule keeps a short
/// fetch and a forward apart.
pub(crate) const GROUP_GAP_NS: u64 = 10_000_000;

/// A grad-off span with no fetch is evaluation only when it lasts at least this share of a
/// training step: `clip_grad_norm_`, an EMA update or a logged `.item()` run under
/// `torch.no_grad()` in every step and take a fraction of it; an evaluation runs the model
/// over batches, at least a forward pass each.
pub(crate) const GRAD_EVAL_STEP_SHARE: f64 = 0.5;

/// Whether a grad-off span of `len` ns is long enough to be evaluation, against the last
/// training step's length (`reference`, the step in progress when none was complete).
fn long_enough(len: u64, reference: u64) -> bool {
    reference > 0 && len as f64 >= GRAD_EVAL_STEP_SHARE * reference as f64
}

/// How long the thread was runnable but not running (preempted) within `[a, b)`, from its
/// off-CPU intervals (none without the thread-state source).
fn preempted(t: &ThreadTrace, a: u64, b: u64) -> u64 {
    t.off_cpu
        .iter()
        .filter(|&&(_, _, s)| s == crate::event::OffCpu::Runnable)
        .map(|&(s, e, _)| e.min(b).saturating_sub(s.max(a)))
        .sum()
}

/// Whether grad mode was off at `ts` outside an optimizer step (evaluation).
fn grad_off_at(t: &ThreadTrace, ts: u64) -> bool {
    t.grad_off.iter().any(|&(a, b)| a <= ts && ts < b) || t.grad_off_open.is_some_and(|a| a <= ts)
}

/// Where the step cutter of the training thread stands between harvests.
#[derive(Clone, Debug, Default)]
pub(crate) struct Cutter {
    /// The first boundary was consumed (the attach fragment before it is counted once).
    pub started: bool,
    /// Start of the step in progress.
    pub open: Option<u64>,
    /// Windowed: micro-batches of the step in progress so far.
    micro: u32,
    /// Windowed: marks before this instant were taken into `window`.
    cursor: u64,
    /// Windowed: marks since the last optimizer exit.
    window: Vec<Mark>,
    /// The loop's iterator fetches one batch ahead (learned, see the module doc).
    prefetch: bool,
    /// An epoch ended in the last window: the next one is an epoch's first.
    fresh: bool,
    /// Most training micro-batches seen in one window (a trailing window with more fetches and
    /// no backward is an evaluation).
    max_micro: u32,
    /// The optimizer exit that closed the last window.
    last_exit: u64,
    /// Length of the last training step cut (the reference of [`GRAD_EVAL_STEP_SHARE`]).
    last_step_ns: u64,
    /// Every probe of the attach in place from here: marks before it are the attach fragment's
    /// (one library's markers seen, another's not yet: fetches without their backwards).
    pub armed: u64,
    /// The step in progress is the attach window's: the attach may have cut its window, so it
    /// is a step only when it has as many micro-batches as the next window.
    first_window: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mark {
    Fetch(InputCall),
    Backward(u64),
}

/// DataLoader boundaries: step = [entry of call i, entry of call i+1); a call that raised
/// (StopIteration) ends the current step at its entry and starts none. The part before the
/// first call (the attach point) is a partial step.
pub(crate) fn cut_dataloader(c: &mut Cutter, calls: &[InputCall], first_ts: u64, cut: &mut Cut) {
    for call in calls {
        if !c.started {
            c.started = true;
            if call.ts > first_ts {
                cut.partial += 1;
            }
        }
        if let Some(s) = c.open.take() {
            push_step(cut, s, call.ts, Some(1));
        }
        if !call.raised {
            c.open = Some(call.ts);
        }
    }
}

/// Exit boundaries: step = [exit i, exit i+1); events before the first exit are a partial step.
/// Grad-off spans inside a step (`grad_off`, evaluation) are an evaluation segment from the
/// first one's start to the last one's end, and the step starts there.
pub(crate) fn cut_exits(
    c: &mut Cutter,
    exits: &[u64],
    first_ts: u64,
    grad_off: &[(u64, u64)],
    cut: &mut Cut,
) {
    for &x in exits {
        if !c.started {
            c.started = true;
            if x > first_ts {
                cut.partial += 1;
            }
        }
        if let Some(s) = c.open.replace(x) {
            let reference = if c.last_step_ns > 0 {
                c.last_step_ns
            } else {
                x - s
            };
            let inside = grad_off
                .iter()
                .filter(|&&(a, b)| a >= s && b <= x && long_enough(b - a, reference));
            let (from, to) = inside.fold((u64::MAX, 0), |(f, t), &(a, b)| (f.min(a), t.max(b)));
            if to > from {
                cut.evals.push((from, to, 0));
                push_step(cut, to, x, None);
                c.last_step_ns = x - to;
            } else {
                push_step(cut, s, x, None);
                c.last_step_ns = x - s;
            }
        }
    }
}

/// Optimizer-step windows (module doc): takes the marks of `t` in `[cursor, w)`, closes a window
/// at each optimizer exit, and at the trace's end (`at_end`) the window still open.
pub(crate) fn cut_windows(c: &mut Cutter, t: &ThreadTrace, w: u64, at_end: bool, cut: &mut Cut) {
    // (ts, order, mark): at one instant an exit comes before what the next call enters.
    let mut marks: Vec<(u64, u8, Option<Mark>)> = Vec::new();
    let fresh = |ts: u64| ts >= c.cursor.max(c.armed) && ts < w;
    for &x in t.optimizer_exits.iter().filter(|&&x| fresh(x)) {
        marks.push((x, 0, None));
    }
    for call in t.input_calls.iter().filter(|x| fresh(x.ts)) {
        marks.push((call.ts, 1, Some(Mark::Fetch(*call))));
    }
    for &b in t.backward_starts.iter().filter(|&&b| fresh(b)) {
        marks.push((b, 2, Some(Mark::Backward(b))));
    }
    marks.sort_unstable_by_key(|m| (m.0, m.1));
    for (ts, _, m) in marks {
        match m {
            Some(m) => c.window.push(m),
            None => {
                close_window(c, t, false, cut);
                c.last_exit = ts;
            }
        }
    }
    c.cursor = c.cursor.max(w);
    if at_end {
        close_window(c, t, true, cut);
    }
}

/// A window's marks read: its fetches that are batches (with their group, see the module
/// doc), the first StopIteration that ended an epoch, its backwards.
struct WindowMarks {
    fetches: Vec<u64>,
    group_of: Vec<u32>,
    groups: u32,
    epoch_end: Option<u64>,
    /// A fetch raised (StopIteration).
    raised: bool,
    /// Backwards.
    b: u32,
}

/// Reads a window's marks; `prefetch` is set where a raised fetch is the prefetch past the
/// last batch while the last batch trains.
fn scan(marks: &[Mark], t: &ThreadTrace, prefetch: &mut bool) -> WindowMarks {
    let mut out = WindowMarks {
        fetches: Vec::new(),
        group_of: Vec::new(),
        groups: 0,
        epoch_end: None,
        raised: false,
        b: 0,
    };
    // The previous fetch of the group in progress: (its return, its duration).
    let mut last_end: Option<(u64, u64)> = None;
    let group = |f: &InputCall, last_end: &mut Option<(u64, u64)>, groups: &mut u32| {
        let dur = f.end.unwrap_or(f.ts) - f.ts;
        let joined = last_end.is_some_and(|(e, prev)| {
            // The time the loop ran between the two fetches: a preemption in between (the
            // thread runnable, not running: a busy machine) is not the loop's.
            let gap = f.ts.saturating_sub(e).saturating_sub(preempted(t, e, f.ts));
            gap <= GROUP_GAP_NS && gap.saturating_mul(10) <= prev.max(dur)
        });
        if !joined {
            *groups += 1;
        }
        *last_end = Some((f.end.unwrap_or(f.ts), dur));
        *groups - 1
    };
    for (i, m) in marks.iter().enumerate() {
        match *m {
            Mark::Fetch(f) if !f.raised => {
                out.group_of.push(group(&f, &mut last_end, &mut out.groups));
                out.fetches.push(f.ts);
            }
            Mark::Fetch(f) => {
                out.raised = true;
                if matches!(marks.get(i + 1), Some(Mark::Backward(_))) {
                    // The prefetch past the last batch while the last batch trains.
                    *prefetch = true;
                    out.group_of.push(group(&f, &mut last_end, &mut out.groups));
                    out.fetches.push(f.ts);
                } else {
                    out.epoch_end.get_or_insert(f.ts);
                    last_end = None;
                }
            }
            Mark::Backward(_) => {
                out.b += 1;
                last_end = None;
            }
        }
    }
    out
}

/// The window's fetches beyond its backwards (`n` fetches, `b` backwards) that are evaluation
/// by count (a prefetching iterator's extra fetch allowed for); `no_epoch_end`: no epoch
/// ended in the window.
fn excess_fetches(c: &Cutter, n: u32, b: u32, at_end: bool, no_epoch_end: bool) -> u32 {
    let unconsumed = n - b.min(n);
    if b == 0 {
        // No backward: a training window whose backward we cannot see (one step of `n`
        // micro-batches), unless the trace ends in a run of fetches longer than any training
        // window (a final evaluation).
        if at_end && c.started && n > c.max_micro.max(1) {
            n
        } else {
            0
        }
    } else if at_end {
        // The trace cut the window before its optimizer step: its fetches may all be training
        // micro-batches yet to run.
        0
    } else {
        let first = !c.started;
        let allowance =
            u32::from((c.fresh && c.prefetch) || (first && unconsumed == 1 && no_epoch_end));
        unconsumed.saturating_sub(allowance)
    }
}

/// Evaluation with no fetch of its own (tensors already loaded): grad mode off after the last
/// optimizer exit and before the training batch, for long enough to run the model.
fn grad_eval(c: &Cutter, t: &ThreadTrace, train_start: Option<u64>) -> Option<u64> {
    let reference = if c.last_step_ns > 0 {
        c.last_step_ns
    } else {
        c.open.map_or(0, |s| c.last_exit.saturating_sub(s))
    };
    t.grad_off
        .iter()
        .copied()
        .chain(t.grad_off_open.map(|a| (a, t.last_ts)))
        .find(|&(a, b)| {
            a >= c.last_exit
                && train_start.is_none_or(|s| a < s)
                && long_enough(b.saturating_sub(a), reference)
        })
        .map(|(a, _)| a)
}

/// A window without a batch fetched (`b` backwards, `epoch_end` where an epoch ended).
fn no_batch(c: &mut Cutter, cut: &mut Cut, epoch_end: Option<u64>, b: u32, at_end: bool) {
    match epoch_end {
        // The epoch's end after the step's optimizer exit (the trace's end, an epoch's
        // last window): the step in progress ends there.
        Some(e) if b == 0 => {
            if let Some(s) = c.open.take() {
                push_step(cut, s, e, Some(c.micro));
            }
            c.fresh = true;
        }
        // The trace ended after the step's optimizer exit with nothing begun since (the
        // loop's last step, stopped at `max_steps`): complete up to that exit.
        None if at_end && b == 0 => {
            if let Some(s) = c.open.take_if(|&mut s| c.last_exit > s) {
                push_step(cut, s, c.last_exit, Some(c.micro));
            }
        }
        // No batch fetched: the optimizer step continues the step in progress.
        _ => c.micro += b,
    }
}

/// The last thing seen of an evaluation begun at `e` that no training batch follows (the
/// run's final one): its last fetch's return, its last module call, or grad mode switched
/// back on; not the trace's end (the process may save, log and tear down for seconds after).
fn last_seen(marks: &[Mark], t: &ThreadTrace, e: u64) -> Option<u64> {
    let fetched = marks.iter().filter_map(|m| match m {
        Mark::Fetch(f) => f.end.or(Some(f.ts)),
        Mark::Backward(_) => None,
    });
    let grad = t
        .grad_off
        .iter()
        .map(|&(_, b)| b)
        .chain(t.grad_off_open.map(|_| t.last_ts));
    let model = t
        .intervals
        .iter()
        .filter(|&&(_, _, p)| p == crate::phase::Phase::Forward)
        .map(|&(_, b, _)| b);
    fetched.chain(grad).chain(model).filter(|&x| x > e).max()
}

/// Closes the window at an optimizer exit (or the trace's end): see the module doc.
fn close_window(c: &mut Cutter, t: &ThreadTrace, at_end: bool, cut: &mut Cut) {
    let marks = std::mem::take(&mut c.window);
    let WindowMarks {
        mut fetches,
        mut group_of,
        groups,
        mut epoch_end,
        mut raised,
        b,
    } = scan(&marks, t, &mut c.prefetch);
    let n = u32::try_from(fetches.len()).unwrap_or(u32::MAX);
    if n == 0 {
        no_batch(c, cut, epoch_end, b, at_end);
        return;
    }
    // Counted in fetches (a prefetching iterator's extra fetch allowed for), and in groups
    // (loaders zipped are one group): a fetch is evaluation by count only when both say so.
    let excess_fetches = excess_fetches(c, n, b, at_end, epoch_end.is_none());
    let unconsumed_groups = if b == 0 {
        groups
    } else {
        groups - b.min(groups)
    };
    let in_groups = group_of.iter().filter(|&&g| g < unconsumed_groups).count() as u32;
    let mut by_count = excess_fetches.min(in_groups);
    if by_count == 1
        && excess_fetches == 1
        && b > 0
        && epoch_end.is_none()
        && !grad_off_at(t, fetches[0])
    {
        // One leading fetch more than the window's backwards, grad mode on at it: an epoch's
        // last `__next__`, whose StopIteration only the frame-evaluator probe sees (torch's
        // `record_function` returns either way). A one-batch evaluation without
        // `torch.no_grad()` looks the same; the epoch's end is the common case.
        epoch_end = Some(fetches.remove(0));
        group_of.remove(0);
        raised = true;
        by_count = 0;
    }
    // The leading fetches that are evaluation: by count, or under grad mode off.
    let excess = fetches
        .iter()
        .enumerate()
        .take_while(|&(i, &ts)| (i as u32) < by_count || grad_off_at(t, ts))
        .count() as u32;
    let train_start = fetches.get(excess as usize).copied();
    let grad_eval = grad_eval(c, t, train_start);
    let eval_start = [(excess > 0).then(|| fetches[0]), grad_eval]
        .into_iter()
        .flatten()
        .min();
    let boundary = [
        eval_start,
        epoch_end.filter(|&e| train_start.is_none_or(|s| e < s)),
        train_start,
    ]
    .into_iter()
    .flatten()
    .min()
    .expect("a window with fetches has a boundary");
    let first_window = std::mem::take(&mut c.first_window);
    if let Some(s) = c.open.take() {
        if first_window && b > c.micro {
            // The attach window, cut by the attach: fewer micro-batches than this window.
            cut.partial += 1;
        } else {
            push_step(cut, s, boundary, Some(c.micro));
            c.last_step_ns = boundary.saturating_sub(s);
        }
    } else if !c.started && boundary > t.first_ts {
        // The attach fragment before the first boundary.
        cut.partial += 1;
        c.first_window = true;
    }
    c.started = true;
    if let Some(e) = eval_start {
        // An evaluation no training batch follows (the run's final one) ends with what we
        // saw of it: its last fetch's return, its last module call, or grad mode switched
        // back on; not with the trace (the process may save, log and tear down for seconds
        // after).
        let seen = || last_seen(&marks, t, e);
        let end = train_start.or_else(seen).unwrap_or(t.last_ts);
        if end > e {
            cut.evals.push((e, end, excess));
        }
    }
    c.fresh = raised;
    if let Some(s) = train_start {
        c.open = Some(s);
        c.micro = if b > 0 { b } else { n };
        c.max_micro = c.max_micro.max(c.micro);
    }
}
