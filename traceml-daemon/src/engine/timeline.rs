//! The training thread's exclusive phase timeline (precedence sweep over its phase intervals) and
//! the step boundaries cut from its DataLoader calls or its optimizer / sync exits.
use crate::phase::{N_PHASES, Phase};

/// Precedence, highest first: at each instant the first phase with an open interval wins;
/// nothing open is [`Phase::Residual`]. The order is the nesting order of the markers, so the
/// innermost marker wins: a sync or copy inside anything, backward and forward inside
/// `Optimizer.step(closure)` (Lightning), and `zero_grad` (a [`Phase::Residual`] interval)
/// carved out of the forward span.
pub(crate) const PRECEDENCE: [Phase; N_PHASES] = [
    Phase::CollectiveWait,
    Phase::GpuWait,
    Phase::H2d,
    Phase::InputWait,
    Phase::Residual,
    Phase::Backward,
    Phase::Forward,
    Phase::Optimizer,
];

/// Disjoint, sorted `[start, end)` segments of non-residual phases.
#[derive(Debug, Default)]
pub(crate) struct Timeline {
    segs: Vec<(u64, u64, Phase)>,
}

/// Where input preparation ranks: an [`Phase::InputWait`] below every marker but the forward
/// span and the optimizer (see `ThreadTrace::prep`).
const PREP_AFTER: Phase = Phase::Backward;

impl Timeline {
    /// Sweeps `[start, end, phase)` intervals (overlapping freely) and input-preparation
    /// intervals into exclusive segments.
    pub fn build(intervals: &[(u64, u64, Phase)], prep: &[(u64, u64)]) -> Timeline {
        // `None`: input preparation.
        let mut points: Vec<(u64, bool, Option<Phase>)> =
            Vec::with_capacity((intervals.len() + prep.len()) * 2);
        for &(s, e, p) in intervals {
            if e > s {
                points.push((s, true, Some(p)));
                points.push((e, false, Some(p)));
            }
        }
        for &(s, e) in prep {
            if e > s {
                points.push((s, true, None));
                points.push((e, false, None));
            }
        }
        points.sort_unstable_by_key(|p| p.0);
        let slot = |p: Option<Phase>| p.map_or(N_PHASES, |p| p.index());
        let mut open = [0u32; N_PHASES + 1];
        let mut segs: Vec<(u64, u64, Phase)> = Vec::new();
        let mut i = 0;
        while i < points.len() {
            let ts = points[i].0;
            while i < points.len() && points[i].0 == ts {
                let (_, enter, p) = points[i];
                if enter {
                    open[slot(p)] += 1;
                } else {
                    open[slot(p)] -= 1;
                }
                i += 1;
            }
            let Some(&(next, _, _)) = points.get(i) else {
                break;
            };
            let after = PRECEDENCE
                .iter()
                .position(|&p| p == PREP_AFTER)
                .expect("in the precedence");
            let winner = PRECEDENCE[..=after]
                .iter()
                .copied()
                .find(|p| open[p.index()] > 0)
                .or((open[N_PHASES] > 0).then_some(Phase::InputWait))
                .or_else(|| {
                    PRECEDENCE[after + 1..]
                        .iter()
                        .copied()
                        .find(|p| open[p.index()] > 0)
                });
            if let Some(p) = winner {
                match segs.last_mut() {
                    Some(last) if last.1 == ts && last.2 == p => last.1 = next,
                    _ => segs.push((ts, next, p)),
                }
            }
        }
        Timeline { segs }
    }

    /// The phase in force at `ts` (segments are half-open).
    pub fn phase_at(&self, ts: u64) -> Phase {
        let i = self.segs.partition_point(|s| s.1 <= ts);
        match self.segs.get(i) {
            Some(&(s, _, p)) if s <= ts => p,
            _ => Phase::Residual,
        }
    }

    /// Exclusive ns per phase in `[start, end)`; they sum to `end - start`.
    pub fn split(&self, start: u64, end: u64) -> [u64; N_PHASES] {
        let mut out = [0u64; N_PHASES];
        let mut covered = 0;
        let mut i = self.segs.partition_point(|s| s.1 <= start);
        while let Some(&(s, e, p)) = self.segs.get(i) {
            if s >= end {
                break;
            }
            let d = e.min(end) - s.max(start);
            out[p.index()] += d;
            covered += d;
            i += 1;
        }
        out[Phase::Residual.index()] += (end - start) - covered;
        out
    }
}

/// Steps cut from a thread's event range and its boundaries, with the partial ones counted.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Cut {
    pub steps: Vec<(u64, u64)>,
    /// Micro-batches of each step of `steps` where the cutter counted them (one optimizer step
    /// of a windowed loop); `None`: counted from the step's backward passes.
    pub micro: Vec<Option<u32>>,
    /// Evaluation segments `[start, end)` with their batches.
    pub evals: Vec<(u64, u64, u32)>,
    pub partial: u32,
}

pub(crate) fn push_step(cut: &mut Cut, start: u64, end: u64, micro: Option<u32>) {
    if end > start {
        cut.steps.push((start, end));
        cut.micro.push(micro);
    } else {
        // Two boundaries at the same instant: nothing to measure.
        cut.partial += 1;
    }
}
