//! The class of a job's straggling over its aligned steps (persistent, transient, rotating):
//! which steps were slow, by whom, in which episodes, and the finding a class makes where the
//! persistence line of [`super::straggler`] misses it.
use super::{
    Finding, MIN_ALIGNED_STEPS, Phase, RankRun, STRAGGLER_PERSISTENCE, STRAGGLER_WARNING, aligned,
    median, step_median,
};
use crate::summary::{Confidence, DiagnosisKind, Severity};

/// A slow step's excess is at least this many standard deviations of a rank's own step-to-step
/// noise (on a small shared machine one rank's own work moves by milliseconds between steps).
pub const NOISE_SIGMAS: f64 = 3.0;
/// In a run of [`MIN_EPISODE_STEPS`] or more steps (gaps of at most [`EPISODE_GAP`]) with the
/// same slowest rank, a step is slow at this many standard deviations of the noise (one step
/// alone needs [`NOISE_SIGMAS`]): the run is what chance does not make.
pub const EPISODE_SIGMAS: f64 = 1.0;
/// Slow steps with the same culprit at most this many steps apart are one episode.
pub const EPISODE_GAP: usize = 2;
/// An episode has at least this many slow steps.
pub const MIN_EPISODE_STEPS: usize = 5;
/// Rotating: at least this share of the aligned steps slow, with no rank holding most of them.
pub const ROTATING_SHARE: f64 = 0.2;
/// A straggler's episodes make a finding when they cost the other ranks at least this share of
/// the run's time: what a straggler just at the published lines costs (its excess
/// [`STRAGGLER_WARNING`] of the step in [`STRAGGLER_PERSISTENCE`] of the steps).
pub const EPISODE_FINDING_COST: f64 = STRAGGLER_WARNING * STRAGGLER_PERSISTENCE;
/// One rank holds "most" of the slow steps when it holds at least this share of them: below it
/// the culprit changes (two ranks alternating hold about half each, and noise moves a few
/// steps either way).
pub const STRAGGLER_DOMINANCE: f64 = 2.0 / 3.0;

/// How the straggling of a job is spread over its aligned steps: per step, the rank whose own
/// work exceeds the median of the others' the most is slow when that excess is at least
/// [`STRAGGLER_WARNING`] of the job's median step and [`NOISE_SIGMAS`] times the ranks' own
/// step-to-step noise. Episodes: runs of one rank slow (gaps of at most [`EPISODE_GAP`] steps,
/// at least [`MIN_EPISODE_STEPS`] slow steps). The class follows who the slow steps' culprits
/// are ([`straggler_class`]): one rank holding most of them is that rank's straggling,
/// persistent or transient by how much of the run its slowness spans; rotating only when no
/// rank holds most of them. `None` when too few steps are slow for any class.
pub fn classify_stragglers(runs: &[RankRun]) -> Option<crate::summary::Stragglers> {
    if runs.len() < 2 {
        return None;
    }
    let steps = aligned(runs);
    if steps.len() < MIN_ALIGNED_STEPS {
        return None;
    }
    let step_median = step_median(&steps)?;
    let stride = u64::from(
        runs.iter()
            .map(|r| r.summary.step_samples.stride)
            .max()
            .unwrap_or(1)
            .max(1),
    );
    // Per aligned step: the rank whose own work exceeds the others' median the most, by how
    // much (ms).
    let top: Vec<Option<(usize, f64)>> = steps
        .iter()
        .map(|st| {
            (0..st.len())
                .filter_map(|r| {
                    let others: Vec<f64> =
                        (0..st.len()).filter(|&o| o != r).map(|o| st[o].1).collect();
                    Some((r, st[r].1 - median(&others)?))
                })
                .max_by(|a, b| a.1.total_cmp(&b.1))
        })
        .collect();
    let noise = own_work_noise(&steps, &top, runs.len());
    let floor = (STRAGGLER_WARNING * step_median).max(NOISE_SIGMAS * noise);
    let slow: Vec<Option<(usize, f64)>> =
        top.iter().map(|t| t.filter(|&(_, x)| x >= floor)).collect();
    let job = AlignedSteps {
        runs,
        top: &top,
        stride,
    };
    job.stragglers(&slow).or_else(|| {
        // A slowness that moves between ranks on a busy node: the noise hides each step, not
        // the runs of one culprit. In runs of an episode's length, the slowest rank is slow at
        // [`EPISODE_SIGMAS`] of the noise; the steps so found make a rotating or transient
        // class, marked `from_runs` (a single run happens by chance: no finding from it).
        let low = (STRAGGLER_WARNING * step_median).max(EPISODE_SIGMAS * noise);
        let near: Vec<Option<(usize, f64)>> =
            top.iter().map(|t| t.filter(|&(_, x)| x >= low)).collect();
        let mut runs_slow = slow.clone();
        for (r, from, to, _, _) in episodes(&near) {
            for k in from..to {
                if near[k].is_some_and(|n| n.0 == r) {
                    runs_slow[k] = near[k];
                }
            }
        }
        // A transient class too (one rank's runs in one stretch), never a persistent one
        // (a chance run far from the real stretch would make the span); no finding either way.
        job.stragglers(&runs_slow)
            .filter(|s| s.class != crate::summary::StragglerClass::Persistent)
            .map(|s| crate::summary::Stragglers {
                from_runs: true,
                ..s
            })
    })
}

/// A job's aligned steps as [`classify_stragglers`] judges them: its ranks, each step's
/// slowest rank and excess (`top`), the steps' stride.
struct AlignedSteps<'a> {
    runs: &'a [RankRun],
    top: &'a [Option<(usize, f64)>],
    stride: u64,
}

impl AlignedSteps<'_> {
    /// The class and episodes `slow` (each aligned step's slow rank and excess) make.
    fn stragglers(&self, slow: &[Option<(usize, f64)>]) -> Option<crate::summary::Stragglers> {
        use crate::summary::{StragglerEpisode, Stragglers};
        let (runs, top, stride) = (self.runs, self.top, self.stride);
        let n_slow = slow.iter().flatten().count();
        if n_slow == 0 {
            return None;
        }
        let lost_ms = slow.iter().flatten().map(|s| s.1).sum::<f64>() * stride as f64;
        let episodes = episodes(slow);
        let mut per_rank = vec![0usize; runs.len()];
        for &(r, _) in slow.iter().flatten() {
            per_rank[r] += 1;
        }
        let (culprit, culprit_n) = per_rank
            .iter()
            .enumerate()
            .max_by_key(|&(_, n)| *n)
            .map(|(r, &n)| (r, n))?;
        // How much more often than chance (1 in as many ranks) the culprit was the slowest rank,
        // above the floor or not: a persistent straggler whose excess dips under the noise floor
        // is still the slowest in nearly every step; a transient one only in its episodes.
        let led = top
            .iter()
            .filter(|t| t.is_some_and(|(r, x)| r == culprit && x > 0.0))
            .count() as f64
            / top.len() as f64;
        let chance = 1.0 / runs.len() as f64;
        let lead = (led - chance) / (1.0 - chance);
        let (class, culprit) = straggler_class(slow, &episodes, (culprit, culprit_n), lead)?;
        let rank = culprit.map(|r| runs[r].rank);
        Some(Stragglers {
            class,
            rank,
            steps: top.len() as u64 * stride,
            slow_share: n_slow as f64 / top.len() as f64,
            episodes: episodes
                .iter()
                .map(|&(r, from, to, _, lost)| StragglerEpisode {
                    rank: runs[r].rank,
                    from_step: from as u64 * stride,
                    to_step: to as u64 * stride,
                    lost_ms: lost * stride as f64,
                })
                .collect(),
            lost_ms,
            from_runs: false,
        })
    }
}

/// The class of a job's straggling and the index of the rank it names, from `slow` (each
/// aligned step's slow rank and excess), its `episodes`, the rank holding the most slow steps
/// (`top`, `top_n` of them) and how much more often than chance it was the slowest rank in
/// any step, above the floor or not (`lead`: 0 as often as chance, 1 always):
/// - **persistent**: `top` slow in at least [`STRAGGLER_PERSISTENCE`] of the steps, or holding
///   [most](STRAGGLER_DOMINANCE) of the slow steps in episodes (or, with none, scattered slow
///   steps, at least [`ROTATING_SHARE`] of the run) that span at least that share of the run
///   from the first to the last, or with a `lead` of at least that share: a rank slowed
///   throughout whose excess dips under the noise floor now and then on a busy machine, its
///   slow steps cut into several episodes, is still the slowest in nearly every step;
/// - **transient**: `top` holding most of the slow steps in episodes spanning less of the run;
///   or, with no rank holding most, one episode holding at least half of the slow steps;
/// - **rotating**: else, at least [`ROTATING_SHARE`] of the steps slow, their culprits differing
///   (no rank holds most of them); it names no rank.
fn straggler_class(
    slow: &[Option<(usize, f64)>],
    episodes: &[(usize, usize, usize, usize, f64)],
    (top, top_n): (usize, usize),
    lead: f64,
) -> Option<(crate::summary::StragglerClass, Option<usize>)> {
    use crate::summary::StragglerClass;
    let n = slow.len() as f64;
    let n_slow = slow.iter().flatten().count();
    if top_n as f64 >= STRAGGLER_PERSISTENCE * n {
        return Some((StragglerClass::Persistent, Some(top)));
    }
    if top_n as f64 >= STRAGGLER_DOMINANCE * n_slow as f64 {
        // The slowest rank in nearly every step, over the floor or not, with an episode's
        // worth of steps over it: slowed throughout, its excess mostly under a busy node's
        // noise.
        if lead >= STRAGGLER_PERSISTENCE && top_n >= MIN_EPISODE_STEPS {
            return Some((StragglerClass::Persistent, Some(top)));
        }
        // The stretch of the run the rank's slowness spans: its episodes', or its scattered
        // slow steps' when they are many but form no episode.
        let own: Vec<(usize, usize)> = episodes
            .iter()
            .filter(|e| e.0 == top)
            .map(|e| (e.1, e.2))
            .collect();
        let stretch = if !own.is_empty() {
            Some((own[0].0, own[own.len() - 1].1))
        } else if top_n as f64 >= ROTATING_SHARE * n {
            let mut at = slow
                .iter()
                .enumerate()
                .filter(|(_, s)| s.is_some_and(|s| s.0 == top))
                .map(|(k, _)| k);
            let first = at.next()?;
            Some((first, at.next_back().unwrap_or(first) + 1))
        } else {
            None
        };
        if let Some((from, to)) = stretch {
            let class = if (to - from) as f64 >= STRAGGLER_PERSISTENCE * n
                || lead >= STRAGGLER_PERSISTENCE
            {
                StragglerClass::Persistent
            } else {
                StragglerClass::Transient
            };
            return Some((class, Some(top)));
        }
    }
    if let Some(e) = episodes.iter().max_by_key(|e| e.3)
        && e.3 * 2 >= n_slow
    {
        return Some((StragglerClass::Transient, Some(e.0)));
    }
    (n_slow as f64 >= ROTATING_SHARE * n && (top_n as f64) < STRAGGLER_DOMINANCE * n_slow as f64)
        .then_some((StragglerClass::Rotating, None))
}

/// The noise of one rank's own work from step to step, where it was not the slowest (`top`:
/// each aligned step's slowest rank): the median over ranks of its median absolute deviation
/// there, scaled to a standard deviation. A step is slow only well above it.
fn own_work_noise(steps: &[Vec<(f64, f64)>], top: &[Option<(usize, f64)>], ranks: usize) -> f64 {
    median(
        &(0..ranks)
            .filter_map(|r| {
                let own: Vec<f64> = steps
                    .iter()
                    .zip(top)
                    .filter(|(_, t)| t.is_none_or(|t| t.0 != r))
                    .map(|(st, _)| st[r].1)
                    .collect();
                let m = median(&own)?;
                median(&own.iter().map(|x| (x - m).abs()).collect::<Vec<_>>())
            })
            .collect::<Vec<_>>(),
    )
    .unwrap_or(0.0)
        * 1.4826
}

/// The episodes of `slow` (each aligned step's slow rank and its excess, ms): runs of one rank
/// slow with gaps of at most [`EPISODE_GAP`] steps, [`MIN_EPISODE_STEPS`] slow steps or more,
/// as (rank, from, to, slow steps, lost ms).
fn episodes(slow: &[Option<(usize, f64)>]) -> Vec<(usize, usize, usize, usize, f64)> {
    let mut episodes: Vec<(usize, usize, usize, usize, f64)> = Vec::new();
    for (k, s) in slow.iter().enumerate() {
        let Some((r, x)) = *s else { continue };
        match episodes.last_mut() {
            Some(e) if e.0 == r && k - (e.2 - 1) <= EPISODE_GAP + 1 => {
                e.2 = k + 1;
                e.3 += 1;
                e.4 += x;
            }
            _ => episodes.push((r, k, k + 1, 1, x)),
        }
    }
    episodes.retain(|e| e.3 >= MIN_EPISODE_STEPS);
    episodes
}

/// The finding of a straggler the persistence line of [`straggler`] misses but its episodes
/// show (rotating ones name no rank): a transient one (its episodes, one stretch of the run) or
/// a persistent one whose slow steps come in several episodes across the run (a busy machine's
/// noise cuts them). Warning, medium confidence, its share the named rank's lost time per slow
/// step against the job's median step. Only when its episodes cost the others at least
/// [`EPISODE_FINDING_COST`] of the run: below it the class and episodes are in the summary, and
/// no finding (a noisy neighbour slowing one rank by a few milliseconds for a dozen steps is
/// not worth the user's look).
pub fn episodes_finding(s: &crate::summary::Stragglers, step_median: f64) -> Option<Finding> {
    use crate::summary::StragglerClass;
    if s.from_runs {
        return None;
    }
    let rank = s.rank?;
    let own: Vec<&crate::summary::StragglerEpisode> =
        s.episodes.iter().filter(|e| e.rank == rank).collect();
    let (from, to) = (own.first()?.from_step, own.last()?.to_step);
    let n: u64 = own.iter().map(|e| (e.to_step - e.from_step).max(1)).sum();
    let lost: f64 = own.iter().map(|e| e.lost_ms).sum();
    if lost < EPISODE_FINDING_COST * s.steps as f64 * step_median {
        return None;
    }
    let per_step = lost / n as f64;
    let stretches = if own.len() == 1 {
        format!("steps {from}–{to}")
    } else {
        format!(
            "{} episodes between steps {from} and {to} ({})",
            own.len(),
            own.iter()
                .map(|e| format!("{}–{}", e.from_step, e.to_step))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let (kind, next) = match s.class {
        StragglerClass::Transient => (
            "a transient episode, not the whole run",
            format!(
                "look at what rank {rank} did in that stretch: a checkpoint or evaluation only it \
                 runs, a noisy neighbour or throttled device on its host, a shard with larger \
                 samples"
            ),
        ),
        StragglerClass::Persistent => (
            "slow across the run, its excess dipping under the noise now and then",
            format!(
                "find why rank {rank} does more work: uneven batches or sequence lengths on that \
                 rank, extra work only it does, or a slower or shared host/GPU (check its \
                 clocks and neighbours)"
            ),
        ),
        StragglerClass::Rotating => return None,
    };
    Some(Finding {
        kind: DiagnosisKind::Straggler,
        severity: Severity::Warning,
        why: format!(
            "rank {rank} made the others wait in {stretches} of {} ({n} steps, {:.0}% of the \
             run): {per_step:.1} ms of its own work per step beyond the other ranks', {:.1} s of \
             the others' time in all; {kind}",
            s.steps,
            n as f64 / s.steps.max(1) as f64 * 100.0,
            lost / 1e3,
        ),
        next,
        phase: Some(Phase::CollectiveWait),
        share: (step_median > 0.0).then(|| per_step / step_median),
        confidence: Confidence::Medium,
        culprit_rank: Some(rank),
    })
}
