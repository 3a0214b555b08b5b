//! Input preparation seen only in stack samples.
//!
//! With the frame-evaluator probe detached and no device (a CPU loop), nothing marks where the
//! model's forward starts after a fetch: the span from the fetch's return to backward is all
//! `forward`, augmentation on the training thread included. The stack samples say more. When
//! the loop is the user's own code (the deepest frame every sample of the steps holds is not in
//! an installed package: a hand-written loop, not a framework's), a step's forward samples
//! before the first one inside the model (a frame of `torch/nn/`), whose frame below the loop
//! is the user's code too (`augment(x)`, a `get_batch()`, a transform), are input preparation.
//! A sample in the loop's own frame (tensor ops written in the loop) neither ends the
//! preparation nor counts as one, and nothing moves where no sample ever shows the model (a model of raw tensor ops has no frame
//! that says where preparation ends). A framework's loop is left as it was.
//!
//! The share moved is pooled over the run's steps: each step moves the share of its forward
//! span that prep samples are of all forward samples of the steps harvested so far under the
//! same loop frames ([`Pool`], kept across harvests; with the off-CPU time in the same
//! proportion of off-CPU samples). Not each step's own share: the sampler is periodic, and a
//! step's count of samples in its span is larger exactly when one lands in the model's short
//! tail, so the per-step ratio under-counts the model (measured: a 3.9 ms forward after 33 ms
//! of augmentation, sampled every 10 ms, came out 0.3 ms short a step). Nor each harvest's
//! own: the last harvest of a run may hold a few steps, too few samples to find the loop or
//! see the model (measured: a nanoGPT loop's last 6 steps kept their 61 ms of `get_batch` in
//! forward, 3.5 % of the run's input share). The pooled ratio is the sampled share of all the
//! steps' forward spans: its error falls with the number of steps, not with the rate. At the
//! run's end the totals are brought to the final pooled share ([`Pool::settle`]: a step harvested
//! early moved the share known then). Under [`MIN_PREP_SHARE`] of the forward samples nothing
//! moves (bookkeeping, not a batch being built). The samples before the model that are neither
//! preparation nor the model (the loop's own statements, a library it calls, the previous step's
//! `zero_grad()`) move to `residual` at their pooled share, as the phases' rules would put them.

use std::collections::HashMap;

use super::{PhaseSample, Step, StepTotals};
use crate::phase::Phase;

/// What a sampled function is, by its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FuncKind {
    /// torch's `nn` package (modules, functional: the model and its loss) and autograd's
    /// Python entry (`Tensor.backward`, `torch/autograd/`): past it, nothing is input.
    Model,
    /// An installed package or the standard library.
    Library,
    /// The user's own code.
    User,
}

impl FuncKind {
    pub(crate) fn of(file: &str) -> FuncKind {
        if file.contains("/torch/nn/")
            || file.contains("/torch/autograd/")
            || file.ends_with("/torch/_tensor.py")
        {
            FuncKind::Model
        } else if file.contains("/site-packages/")
            || file.contains("/dist-packages/")
            || file.contains("/lib/python3")
            || file.starts_with('<')
        {
            FuncKind::Library
        } else {
            FuncKind::User
        }
    }
}

/// Fewest samples over the steps to find the loop frame.
const MIN_SAMPLES: usize = 3;

/// Least share of the forward samples in input preparation for any of it to move: below it,
/// the user's code before the model is bookkeeping (a timing wrapper around the fetch, a log
/// call), not a batch being built, and stays forward (measured: a test harness's timers around
/// `__next__` held 3 % of a 4 ms forward, 0.12 ms a step, 1 point of the input share).
const MIN_PREP_SHARE: f64 = 0.1;

/// Share of the samples that must hold a prefix for it to be the loop's (also the profile's
/// loop frame, `crate::profile`).
pub(crate) const LOOP_QUORUM: f64 = 0.9;

/// The loop's frames: the longest prefix that `share` of `stacks` start with (a stack too
/// short or torn, the sampler reading while the interpreter switches frames, counts against
/// it). Empty when none.
pub(crate) fn loop_prefix<'a>(stacks: impl Iterator<Item = &'a [u32]>, share: f64) -> Vec<u32> {
    let stacks: Vec<&[u32]> = stacks.collect();
    let need = ((stacks.len() as f64 * share).ceil() as usize).max(1);
    let mut prefix: Vec<u32> = Vec::new();
    loop {
        let d = prefix.len();
        let mut next: HashMap<u32, usize> = HashMap::new();
        for f in &stacks {
            if f.len() > d && f.starts_with(&prefix) {
                *next.entry(f[d]).or_default() += 1;
            }
        }
        match next
            .into_iter()
            .max_by_key(|&(id, n)| (n, std::cmp::Reverse(id)))
        {
            Some((id, n)) if n >= need => prefix.push(id),
            _ => return prefix,
        }
    }
}

/// The samples in the `n` steps from index `first` on, in time order: each step's forward
/// samples, and all of them.
fn in_steps(samples: &[PhaseSample], first: u32, n: usize) -> (Vec<Vec<usize>>, Vec<usize>) {
    let mut forward: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut inside: Vec<usize> = Vec::new();
    let mut order: Vec<usize> = (0..samples.len()).collect();
    order.sort_by_key(|&i| samples[i].ts);
    for i in order {
        let Some(k) = samples[i]
            .step
            .checked_sub(first)
            .map(|k| k as usize)
            .filter(|&k| k < n)
        else {
            continue;
        };
        inside.push(i);
        if samples[i].phase == Phase::Forward {
            forward[k].push(i);
        }
    }
    (forward, inside)
}

/// What the run's harvests have seen of its input preparation so far: the loop's frames and
/// the forward samples counted under them. A harvest whose samples find other loop frames (the
/// loop changed: another training function) starts it afresh; one with too few samples to find
/// any uses the frames found before.
#[derive(Clone, Debug, Default)]
pub(crate) struct Pool {
    prefix: Vec<u32>,
    /// A forward sample was inside the model (a `torch/nn` frame).
    model_seen: bool,
    /// Prep samples, the other samples before the model, forward samples, and the off-CPU ones
    /// of each.
    prep: u64,
    other: u64,
    all: u64,
    prep_off: u64,
    other_off: u64,
    all_off: u64,
    /// What the harvests moved, over every step and over the steady ones: each at the share
    /// pooled so far, [`Pool::settle`] brings the run's totals to the final share.
    moved_all: Moved,
    moved_steady: Moved,
}

/// Forward time before any move, and what moved out of it, summed over steps: the phase time
/// and the off-CPU arrays (`blocked`, `io`, `runnable`), to input_wait and to residual.
#[derive(Clone, Debug, Default)]
struct Moved {
    span: u64,
    off_span: [u64; 3],
    to: [u64; 2],
    off_to: [[u64; 3]; 2],
}

impl Moved {
    fn add(&mut self, m: &Moved) {
        self.span += m.span;
        for j in 0..3 {
            self.off_span[j] += m.off_span[j];
        }
        for k in 0..2 {
            self.to[k] += m.to[k];
            for j in 0..3 {
                self.off_to[k][j] += m.off_to[k][j];
            }
        }
    }
}

impl Pool {
    /// The loop frames to use for a harvest whose samples' own prefix is `found`: the pool's
    /// when one of the two extends the other (a torn harvest finds a shorter prefix; one whose
    /// samples nearly all sit in one function below the loop, a long `get_batch()`, a longer
    /// one), `found` with the counts reset when they differ (another loop), `found` when the pool
    /// has none yet.
    fn adopt(&mut self, found: Vec<u32>) {
        if found.is_empty() {
            return;
        }
        if self.prefix.is_empty() {
            self.prefix = found;
        } else if !self.prefix.starts_with(&found) && !found.starts_with(&self.prefix) {
            *self = Pool {
                prefix: found,
                moved_all: std::mem::take(&mut self.moved_all),
                moved_steady: std::mem::take(&mut self.moved_steady),
                ..Pool::default()
            };
        }
    }

    /// The pool for a window of the run (a new engine over the run's later events): the loop
    /// frames and samples so far, none of the run's moves (they are not in its totals).
    pub(crate) fn for_window(&self) -> Pool {
        Pool {
            moved_all: Moved::default(),
            moved_steady: Moved::default(),
            ..self.clone()
        }
    }

    /// At the run's end: the steps harvested early moved the share pooled until then; brings
    /// `totals` (every step) and `steady` (the steady steps) to the run's final share, so that
    /// the run's shares and means are the pooled estimate over all its samples (each kept
    /// step's own numbers stay as harvested).
    pub(crate) fn settle(&self, totals: &mut StepTotals, steady: &mut StepTotals) {
        let (p, n) = (self.prep, self.all);
        // Under the floor at the end (an early harvest was over it), every move goes back.
        let moves = p > 0 && self.model_seen && (p as f64) >= MIN_PREP_SHARE * n as f64;
        let shares = if moves {
            [(p, self.prep_off), (self.other, self.other_off)]
        } else {
            [(0, 0), (0, 0)]
        };
        for (t, m) in [(totals, &self.moved_all), (steady, &self.moved_steady)] {
            let fw = Phase::Forward.index();
            for (k, (to, (share, share_off))) in [Phase::InputWait.index(), Phase::Residual.index()]
                .into_iter()
                .zip(shares)
                .enumerate()
            {
                let want = scale(m.span, share, n);
                shift(&mut t.phase_ns, fw, to, want as i64 - m.to[k] as i64);
                let arrays = [&mut t.blocked_ns, &mut t.io_ns, &mut t.runnable_ns];
                for (j, a) in arrays.into_iter().enumerate() {
                    let want = scale(m.off_span[j], share_off, self.all_off);
                    shift(a, fw, to, want as i64 - m.off_to[k][j] as i64);
                }
            }
            // Never more off-CPU time in forward than forward has.
            for a in [&mut t.blocked_ns, &mut t.io_ns, &mut t.runnable_ns] {
                let over = a[fw].saturating_sub(t.phase_ns[fw]);
                shift(a, fw, Phase::InputWait.index(), over as i64);
            }
        }
    }
}

/// `ns × part / whole` without overflow (a day's forward time times a day's sample count does
/// not fit 64 bits), 0 when `whole` is 0.
fn scale(ns: u64, part: u64, whole: u64) -> u64 {
    (u128::from(ns) * u128::from(part))
        .checked_div(u128::from(whole))
        .map_or(0, |v| u64::try_from(v).unwrap_or(u64::MAX))
}

/// Moves `d` ns from `a[from]` to `a[to]` (back when negative), never below 0 on either side.
fn shift(a: &mut [u64], from: usize, to: usize, d: i64) {
    if d >= 0 {
        let d = d.unsigned_abs().min(a[from]);
        a[from] -= d;
        a[to] += d;
    } else {
        let d = d.unsigned_abs().min(a[to]);
        a[to] -= d;
        a[from] += d;
    }
}

/// The loop's frames in a harvest: the prefix `LOOP_QUORUM` of its samples hold, cut to the one
/// that many of the samples outside forward (backward, optimizer, the loop's own statements)
/// hold too when there are enough of them. A loop that spends more than the quorum of its time
/// in one function of its own (`get_batch()` sleeping on storage) would otherwise take that
/// function for the loop.
fn harvest_prefix(samples: &[PhaseSample], inside: &[usize]) -> Vec<u32> {
    let mut prefix = loop_prefix(
        inside.iter().map(|&i| samples[i].frames.as_slice()),
        LOOP_QUORUM,
    );
    let outside: Vec<&[u32]> = inside
        .iter()
        .filter(|&&i| samples[i].phase != Phase::Forward)
        .map(|&i| samples[i].frames.as_slice())
        .collect();
    if outside.len() >= MIN_SAMPLES {
        let theirs = loop_prefix(outside.into_iter(), LOOP_QUORUM);
        let same = prefix
            .iter()
            .zip(&theirs)
            .take_while(|(a, b)| a == b)
            .count();
        prefix.truncate(same);
    }
    prefix
}

/// Moves each step's input preparation found in `samples` from forward to input_wait (the
/// samples too), and the off-CPU time the samples saw (`PhaseSample::off_cpu`), at the share
/// pooled in `pool` over this harvest and the earlier ones.
pub(crate) fn apply(
    steps: &mut [Step],
    samples: &mut [PhaseSample],
    kinds: &HashMap<u32, FuncKind>,
    pool: &mut Pool,
) {
    let kind = |f: &u32| kinds.get(f).copied().unwrap_or(FuncKind::Library);
    let Some(first) = steps.first().map(|s| s.index) else {
        return;
    };
    let (mut forward, inside) = in_steps(samples, first, steps.len());
    // The loop frame: the deepest frame held by nearly every sample of the steps (a torn read
    // or an empty stack, the sampler reading while the interpreter switches frames, is no vote).
    if inside.len() >= MIN_SAMPLES {
        pool.adopt(harvest_prefix(samples, &inside));
    }
    let prefix = pool.prefix.clone();
    let common = prefix.len();
    let Some(&loop_frame) = prefix.last() else {
        return;
    };
    if kind(&loop_frame) != FuncKind::User {
        return;
    }
    // Forward samples without the loop's frames are left out of the counts.
    for v in &mut forward {
        v.retain(|&i| samples[i].frames.starts_with(&prefix));
    }
    let in_model = |s: &PhaseSample| s.frames.iter().any(|f| kind(f) == FuncKind::Model);
    // The model must be seen at all: a model of raw tensor ops in the user's file (no
    // `torch/nn` frame ever) gives no point where input preparation ends.
    pool.model_seen |= forward.iter().flatten().any(|&i| in_model(&samples[i]));
    // Per step: its forward samples, how many lead as preparation, and the off-CPU ones of each.
    // Only the model ends the preparation. A sample in the loop's own frame (between its
    // statements: `for` taking the batch, tensor ops written in the loop) or in a library called
    // from the loop (the previous step's `zero_grad()`, which the span also holds) is neither
    // and stays forward (measured: stopping at `zero_grad` dropped a whole step's `get_batch`
    // samples whenever one landed there, 2 ms of input a step left in forward on a busy host).
    let is_prep = |s: &PhaseSample| {
        !in_model(s)
            && s.frames
                .get(common)
                .is_some_and(|f| kind(f) == FuncKind::User)
    };
    // Before the model: preparation, and the rest (the loop's own statements, a library it
    // calls: the loop's own work, `residual` by the phases' rules).
    let (prep_samples, other): (Vec<Vec<usize>>, Vec<Vec<usize>>) = forward
        .iter()
        .map(|idx| {
            idx.iter()
                .copied()
                .take_while(|&i| !in_model(&samples[i]))
                .partition(|&i| samples[i].frames.len() > common && is_prep(&samples[i]))
        })
        .unzip();
    let off = |v: &[usize]| v.iter().filter(|&&i| samples[i].off_cpu.is_some()).count() as u64;
    let all: Vec<usize> = forward.iter().flatten().copied().collect();
    let prep: Vec<usize> = prep_samples.iter().flatten().copied().collect();
    let other: Vec<usize> = other.iter().flatten().copied().collect();
    pool.prep += prep.len() as u64;
    pool.other += other.len() as u64;
    pool.all += all.len() as u64;
    pool.prep_off += off(&prep);
    pool.other_off += off(&other);
    pool.all_off += off(&all);
    let (p, n) = (pool.prep, pool.all);
    if p == 0 || !pool.model_seen || (p as f64) < MIN_PREP_SHARE * n as f64 {
        return;
    }
    move_shares(steps, pool);
    for i in other.iter().copied() {
        samples[i].phase = Phase::Residual;
    }
    for i in prep_samples.into_iter().flatten() {
        samples[i].phase = Phase::InputWait;
    }
}

/// Each step moves the pooled shares of its forward span: preparation to input_wait, the loop's
/// own work before the model to residual (the off-CPU time in the same proportions of the
/// off-CPU samples); what moved is kept in `pool` for [`Pool::settle`].
fn move_shares(steps: &mut [Step], pool: &mut Pool) {
    let n = pool.all;
    let fw = Phase::Forward.index();
    let moves = [
        (Phase::InputWait.index(), pool.prep, pool.prep_off),
        (Phase::Residual.index(), pool.other, pool.other_off),
    ];
    for step in steps.iter_mut() {
        let span = step.phase_ns[fw];
        let off_span = [step.blocked_ns[fw], step.io_ns[fw], step.runnable_ns[fw]];
        let mut m = Moved {
            span,
            off_span,
            ..Moved::default()
        };
        for (k, &(to, share, share_off)) in moves.iter().enumerate() {
            let moved = scale(span, share, n).min(step.phase_ns[fw]);
            step.phase_ns[fw] -= moved;
            step.phase_ns[to] += moved;
            m.to[k] = moved;
            let arrays = [&mut step.blocked_ns, &mut step.io_ns, &mut step.runnable_ns];
            for (j, (a, whole)) in arrays.into_iter().zip(off_span).enumerate() {
                let want = scale(whole, share_off, pool.all_off);
                // Never more off-CPU time than the phase has left.
                let moved = want.max(a[fw].saturating_sub(step.phase_ns[fw])).min(a[fw]);
                a[fw] -= moved;
                a[to] += moved;
                m.off_to[k][j] = moved;
            }
        }
        pool.moved_all.add(&m);
        if !step.learning {
            pool.moved_steady.add(&m);
        }
    }
}
