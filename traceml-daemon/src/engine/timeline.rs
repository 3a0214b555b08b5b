//! The training thread's exclusive phase timeline (precedence sweep over its phase intervals) and
//! the step boundaries cut from its DataLoader calls or its optimizer / sync exits.
use super::Phase;
use super::thread::InputCall;

/// Precedence, highest first: at each instant the first phase with an open interval wins;
/// nothing open is [`Phase::Residual`]. The order is the nesting order of the markers, so the
/// innermost marker wins: a sync or copy inside anything, backward and forward inside
/// `Optimizer.step(closure)` (Lightning), and `zero_grad` (a [`Phase::Residual`] interval)
/// carved out of the forward span.
pub(crate) const PRECEDENCE: [Phase; 7] = [
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

impl Timeline {
    /// Sweeps `[start, end, phase)` intervals (overlapping freely) into exclusive segments.
    pub fn build(intervals: &[(u64, u64, Phase)]) -> Timeline {
        let mut points: Vec<(u64, bool, Phase)> = Vec::with_capacity(intervals.len() * 2);
        for &(s, e, p) in intervals {
            if e > s {
                points.push((s, true, p));
                points.push((e, false, p));
            }
        }
        points.sort_unstable_by_key(|p| p.0);
        let mut open = [0u32; 7];
        let mut segs: Vec<(u64, u64, Phase)> = Vec::new();
        let mut i = 0;
        while i < points.len() {
            let ts = points[i].0;
            while i < points.len() && points[i].0 == ts {
                let (_, enter, p) = points[i];
                if enter {
                    open[p.index()] += 1;
                } else {
                    open[p.index()] -= 1;
                }
                i += 1;
            }
            let Some(&(next, _, _)) = points.get(i) else {
                break;
            };
            if let Some(p) = PRECEDENCE.into_iter().find(|p| open[p.index()] > 0) {
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
    pub fn split(&self, start: u64, end: u64) -> [u64; 7] {
        let mut out = [0u64; 7];
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
    pub partial: u32,
}

/// Step i = [entry of call i, entry of call i+1); a call that raised (StopIteration) ends the
/// current step at its entry and starts none. `first_ts` is the thread's first event: anything
/// before the first call is a step cut by the attach point.
pub(crate) fn dataloader_steps(calls: &[InputCall], first_ts: u64) -> Cut {
    let mut cut = Cut::default();
    if calls.first().is_some_and(|c| c.ts > first_ts) {
        cut.partial += 1;
    }
    let mut open: Option<u64> = None;
    for c in calls {
        if let Some(s) = open.take() {
            push_step(&mut cut, s, c.ts);
        }
        if !c.raised {
            open = Some(c.ts);
        }
    }
    if open.is_some() {
        cut.partial += 1;
    }
    cut
}

/// Steps between consecutive exits: [exit i, exit i+1). Events before the first exit or after
/// the last one (`first_ts`/`last_ts` of the thread) are partial steps.
pub(crate) fn exit_steps(exits: &[u64], first_ts: u64, last_ts: u64) -> Cut {
    let mut cut = Cut::default();
    let (Some(&first), Some(&last)) = (exits.first(), exits.last()) else {
        return cut;
    };
    if first > first_ts {
        cut.partial += 1;
    }
    for w in exits.windows(2) {
        push_step(&mut cut, w[0], w[1]);
    }
    if last_ts > last {
        cut.partial += 1;
    }
    cut
}

fn push_step(cut: &mut Cut, start: u64, end: u64) {
    if end > start {
        cut.steps.push((start, end));
    } else {
        // Two boundaries at the same instant: nothing to measure.
        cut.partial += 1;
    }
}
