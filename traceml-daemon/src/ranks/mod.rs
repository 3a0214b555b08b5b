//! Multi-rank jobs: the per-rank summaries of one job joined into the job's summary, with the
//! job-level rules: STRAGGLER (one rank makes the others wait at the collectives) and HANG (a
//! rank completes no step). Pure: summaries in, summary out.
//!
//! # Straggler
//! In a data-parallel job every rank meets the others at each step's collectives, so all ranks
//! take about the same step time; the difference is who waits. A rank's *own work* in a step is
//! its step time less its `collective_wait`. Steps are aligned across ranks from the end of the
//! run (the ranks end together; the attach may have cut a different first step on each). Per
//! aligned step the rank with the most own work is that step's culprit. The job's culprit is the
//! rank with the largest median own work; its **score** is how much more than the median of the
//! other ranks, as a share of the job's median step, and its **persistence** the share of
//! aligned steps it was the culprit (a rotating culprit is noise, not a straggler). Thresholds
//! (the in-process tool's published ones as the floor): score ≥ [`STRAGGLER_WARNING`] is a
//! warning, ≥ [`STRAGGLER_CRITICAL`] with ≥ [`CRITICAL_MIN_STEPS`] aligned steps critical, and
//! persistence ≥ [`STRAGGLER_PERSISTENCE`] either way. The culprit's dominant phase is the phase
//! (other than collective_wait) where its median exceeds the other ranks' median the most.
//!
//! # Hang
//! A rank that completes no step for `max(10 × its median step, the floor)` (the floor is 60 s
//! by default, `--hang-after`) is HANG, critical, with every rank's current Python stack.
use crate::diagnosis::CRITICAL_MIN_STEPS;
use crate::phase::Phase;
use crate::stats::median;
use crate::summary::{
    Confidence, DiagnosisKind, Finding, JobInfo, Phases, RankSummary, Severity, Summary,
};

pub const STRAGGLER_WARNING: f64 = 0.10;
pub const STRAGGLER_CRITICAL: f64 = 0.20;
pub const STRAGGLER_PERSISTENCE: f64 = 0.6;
/// Aligned steps needed for any straggler finding.
pub const MIN_ALIGNED_STEPS: usize = 5;

mod stragglers;
pub use stragglers::*;

/// One rank's measurement.
#[derive(Clone, Debug)]
pub struct RankRun {
    pub rank: u32,
    pub local_rank: Option<u32>,
    pub pid: u32,
    /// The elastic attempt of the rank process (0: the job's first).
    pub restart: u32,
    pub summary: Summary,
    /// Its current Python stack (outermost first) when the job is hung.
    pub stack: Vec<String>,
}

/// A rank that stopped completing steps.
#[derive(Clone, Debug, PartialEq)]
pub struct Stuck {
    pub rank: u32,
    /// Seconds since its last completed step.
    pub idle_s: f64,
}

/// Per aligned step: (step ms, own work ms) of each rank, in `runs` order.
fn aligned(runs: &[RankRun]) -> Vec<Vec<(f64, f64)>> {
    let n = runs
        .iter()
        .map(|r| r.summary.step_samples.step_ms.len())
        .min()
        .unwrap_or(0);
    (0..n)
        .map(|k| {
            runs.iter()
                .map(|r| {
                    let s = &r.summary.step_samples;
                    let i = s.step_ms.len() - n + k;
                    let step = s.step_ms[i];
                    let cw = s.phase_ms[Phase::CollectiveWait]
                        .get(i)
                        .copied()
                        .unwrap_or(0.0);
                    (step, step - cw)
                })
                .collect()
        })
        .collect()
}

/// The median step time over every rank's aligned steps; `None` when there is none or it is 0.
fn step_median(steps: &[Vec<(f64, f64)>]) -> Option<f64> {
    median(
        &steps
            .iter()
            .flat_map(|st| st.iter().map(|x| x.0))
            .collect::<Vec<_>>(),
    )
    .filter(|&m| m > 0.0)
}

fn phase_median(s: &Summary, p: Phase) -> f64 {
    s.phases[p].median_ms.unwrap_or(0.0)
}

/// STRAGGLER, when one rank persistently makes the others wait.
pub fn straggler(runs: &[RankRun]) -> Option<Finding> {
    if runs.len() < 2 {
        return None;
    }
    let steps = aligned(runs);
    if steps.len() < MIN_ALIGNED_STEPS {
        return None;
    }
    let own_median: Vec<f64> = (0..runs.len())
        .map(|r| median(&steps.iter().map(|st| st[r].1).collect::<Vec<_>>()).unwrap_or(0.0))
        .collect();
    let step_median = step_median(&steps)?;
    let culprit = (0..runs.len()).max_by(|&a, &b| own_median[a].total_cmp(&own_median[b]))?;
    let others: Vec<f64> = (0..runs.len())
        .filter(|&r| r != culprit)
        .map(|r| own_median[r])
        .collect();
    let others_median = median(&others)?;
    let score = (own_median[culprit] - others_median) / step_median;
    let led = steps
        .iter()
        .filter(|st| (0..st.len()).max_by(|&a, &b| st[a].1.total_cmp(&st[b].1)) == Some(culprit))
        .count();
    let persistence = led as f64 / steps.len() as f64;
    if score < STRAGGLER_WARNING || persistence < STRAGGLER_PERSISTENCE {
        return None;
    }
    let severity = if score >= STRAGGLER_CRITICAL && steps.len() >= CRITICAL_MIN_STEPS as usize {
        Severity::Critical
    } else {
        Severity::Warning
    };
    let c = &runs[culprit];
    let rank = c.rank;
    // The culprit's own phases against the other ranks' medians.
    let excess = |p: Phase| phase_median(&c.summary, p) - others_phase_median(runs, culprit, p);
    let (dominant, by) = Phase::ALL
        .into_iter()
        .filter(|&p| p != Phase::CollectiveWait && p != Phase::Residual)
        .map(|p| (p, excess(p)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap_or((Phase::Forward, 0.0));
    let wait_others = others_phase_median(runs, culprit, Phase::CollectiveWait);
    let input_note = if dominant != Phase::InputWait && excess(Phase::InputWait) < 0.1 * by.max(1.0)
    {
        "; its input_wait is normal"
    } else {
        ""
    };
    let why = format!(
        "rank {rank} makes the others wait: its own work (step minus collective wait) is {:.1} ms \
         against {:.1} ms on the other ranks, {:.0}% of the {:.1} ms step, and it was the slowest \
         rank in {:.0}% of {} aligned steps; the other ranks wait {:.1} ms per step in \
         collectives, rank {rank} {:.1} ms. rank {rank}: {} {:.1} ms longer than the median \
         rank{input_note}",
        own_median[culprit],
        others_median,
        score * 100.0,
        step_median,
        persistence * 100.0,
        steps.len(),
        wait_others,
        phase_median(&c.summary, Phase::CollectiveWait),
        dominant.name(),
        by,
    ) + &gpu_evidence(runs, culprit);
    let next = straggler_next(rank, dominant);
    Some(Finding {
        kind: DiagnosisKind::Straggler,
        severity,
        why,
        next,
        phase: Some(dominant),
        share: Some(score),
        confidence: Confidence::High,
        culprit_rank: Some(rank),
    })
}

/// The culprit's GPU beside the other ranks' (NVML's busy share on the GPUs each rank used):
/// busier than theirs, the rank's device does more work (more or larger kernels); no busier,
/// its host side is the slow part. Empty when a rank's GPU figures are missing.
fn gpu_evidence(runs: &[RankRun], culprit: usize) -> String {
    let gpus: Vec<Option<crate::summary::RankGpu>> = runs
        .iter()
        .map(|r| r.summary.gpu.as_ref().and_then(crate::summary::RankGpu::of))
        .collect();
    let busy = |g: &Option<crate::summary::RankGpu>| g.as_ref().and_then(|g| g.util_pct_mean);
    let Some(mine) = busy(&gpus[culprit]) else {
        return String::new();
    };
    let others: Option<Vec<f64>> = (0..runs.len())
        .filter(|&r| r != culprit)
        .map(|r| busy(&gpus[r]))
        .collect();
    let Some(others) = others.and_then(|o| median(&o)) else {
        return String::new();
    };
    let devices = |g: &Option<crate::summary::RankGpu>| {
        g.as_ref()
            .map(|g| {
                g.devices
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default()
    };
    let reading = if mine >= others + 10.0 {
        "its device does more work"
    } else {
        "its device is no busier: the slow part is on the host"
    };
    format!(
        "; its GPU {} was busy {mine:.0}% of the time against {others:.0}% for the other          ranks' GPUs ({reading})",
        devices(&gpus[culprit])
    )
}

/// The median over the ranks other than `culprit` of their median `p` time (0 without one).
fn others_phase_median(runs: &[RankRun], culprit: usize, p: Phase) -> f64 {
    let o: Vec<f64> = runs
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != culprit)
        .map(|(_, r)| phase_median(&r.summary, p))
        .collect();
    median(&o).unwrap_or(0.0)
}

/// What to try for a straggler whose `dominant` phase is longer than the other ranks'.
fn straggler_next(rank: u32, dominant: Phase) -> String {
    match dominant {
        Phase::InputWait => format!(
            "rank {rank} waits for its data: check its shard (uneven sizes or slower storage), \
             give its DataLoader more workers"
        ),
        _ => format!(
            "find why rank {rank} does more {} work: uneven batches or sequence lengths on that \
             rank, extra work only it does (logging, checkpointing, evaluation on rank 0), or a \
             slower or shared host/GPU (check its clocks and neighbours)",
            dominant.name()
        ),
    }
}

/// Python functions a rank blocked in a collective sits in (explicit collectives, or DDP's
/// all-reduce inside backward).
const IN_COLLECTIVE: [&str; 8] = [
    "all_reduce",
    "barrier",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "wait",
    "backward",
    "_engine_run_backward",
];

/// Whether a stack (outermost first) is inside a collective call: one of its 4 innermost
/// frames names one (how HANG tells the ranks that wait from the one they wait for).
pub fn in_collective(stack: &[String]) -> bool {
    stack
        .iter()
        .rev()
        .take(4)
        .any(|f| IN_COLLECTIVE.iter().any(|k| f.contains(k)))
}

/// The floor of a collective hang: ranks waiting inside a collective this long (or 10 of the
/// job's mean steps, when longer) while another rank is outside it. A job with no rank in a
/// collective keeps the slower rule of the group (`hang_after`, 60 s by default).
pub const COLLECTIVE_HANG_FLOOR: std::time::Duration = std::time::Duration::from_secs(5);

/// One running rank at one look, for [`collective_hang`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Look {
    pub rank: u32,
    /// Since its last completed step (`None`: no step yet).
    pub idle: Option<std::time::Duration>,
    pub mean_step: std::time::Duration,
    /// How long it has been inside a collective, continuously (`None`: not in one now).
    pub in_collective_for: Option<std::time::Duration>,
}

/// A hang named in seconds: some ranks have waited inside a collective for
/// max(10 × the job's mean step, [`COLLECTIVE_HANG_FLOOR`]) while the others are outside every
/// collective (the one they wait for) or inside one just as long (a desync: calls that never
/// match, or a peer lost), and no rank completed a step for that long. Every rank is stuck then
/// ([`hang`] names the one outside from its stack; the ledgers name a desync).
pub fn collective_hang(looks: &[Look]) -> Option<Vec<Stuck>> {
    if looks.len() < 2 {
        return None;
    }
    let mean = looks.iter().map(|l| l.mean_step).max()?;
    let threshold = (mean * 10).max(COLLECTIVE_HANG_FLOOR);
    let waiting = looks.iter().filter(|l| l.in_collective_for.is_some());
    if waiting.clone().count() == 0
        || !waiting
            .clone()
            .all(|l| l.in_collective_for >= Some(threshold))
        || !looks.iter().all(|l| l.idle.is_some_and(|i| i >= threshold))
    {
        return None;
    }
    Some(
        looks
            .iter()
            .map(|l| Stuck {
                rank: l.rank,
                idle_s: l.idle.unwrap_or_default().as_secs_f64(),
            })
            .collect(),
    )
}

/// HANG for the stuck ranks, naming each rank's current stack's innermost frames.
pub fn hang(runs: &[RankRun], stuck: &[Stuck]) -> Option<Finding> {
    let first = stuck.iter().max_by(|a, b| a.idle_s.total_cmp(&b.idle_s))?;
    let stacks: Vec<String> = runs
        .iter()
        .map(|r| {
            let tail: Vec<&str> = r.stack.iter().rev().take(2).map(String::as_str).collect();
            if tail.is_empty() {
                format!("rank {}: stack unknown", r.rank)
            } else {
                format!("rank {}: in {}", r.rank, tail.join(" ← "))
            }
        })
        .collect();
    let ranks: Vec<String> = stuck.iter().map(|s| s.rank.to_string()).collect();
    Some(Finding {
        kind: DiagnosisKind::Hang,
        severity: Severity::Critical,
        why: format!(
            "rank{} {} completed no step for {:.0} s; {}",
            if stuck.len() > 1 { "s" } else { "" },
            ranks.join(", "),
            first.idle_s,
            stacks.join("; ")
        ),
        next: "look at the rank that is not in a collective: the others wait for it there (a \
               deadlock, an exception swallowed on one rank, uneven numbers of batches per rank); \
               set TORCH_NCCL_ASYNC_ERROR_HANDLING / a collective timeout so a hang fails fast"
            .into(),
        phase: Some(Phase::CollectiveWait),
        share: None,
        confidence: Confidence::High,
        culprit_rank: {
            // The rank whose stack is not in a collective call, when exactly one is.
            let outside: Vec<&RankRun> = runs.iter().filter(|r| !in_collective(&r.stack)).collect();
            (outside.len() == 1).then(|| outside[0].rank)
        },
    })
}

/// The job's what-if when rank `culprit` (an index into `runs`) ran at the median pace of the
/// others: per aligned step, the step less the culprit's own work beyond the median of the
/// others' (what the others waited for it); the mean over the aligned steps.
pub fn straggler_what_if(runs: &[RankRun], culprit: u32) -> Option<crate::summary::WhatIf> {
    let c = runs.iter().position(|r| r.rank == culprit)?;
    let steps = aligned(runs);
    if steps.is_empty() || runs.len() < 2 {
        return None;
    }
    let (mut now, mut then) = (0.0, 0.0);
    for st in &steps {
        let others: Vec<f64> = (0..st.len()).filter(|&r| r != c).map(|r| st[r].1).collect();
        let pace = median(&others)?;
        let step = st.iter().map(|x| x.0).fold(0.0, f64::max);
        now += step;
        then += step - (st[c].1 - pace).max(0.0);
    }
    let n = steps.len() as f64;
    let (now, then) = (now / n, (then / n).max(now / n * 1e-3));
    (now > 0.0).then(|| crate::summary::WhatIf {
        phase: Phase::CollectiveWait,
        change: format!("rank {culprit} at the median rank's pace"),
        step_ms: now,
        step_ms_if: then,
        throughput_factor: now / then,
        assumption: "the others' wait for it goes; the job's communication itself stays".into(),
        measured: None,
    })
}

/// The ranks' collective ledgers joined ([`crate::ledgers`]), with the job's median step.
pub fn collective_waits(runs: &[RankRun]) -> Option<crate::summary::CollectiveWaits> {
    let logs: Vec<(u32, &crate::summary::CollectiveLog)> = runs
        .iter()
        .filter_map(|r| r.summary.collectives.as_ref().map(|l| (r.rank, l)))
        .collect();
    let steps: Vec<f64> = runs
        .iter()
        .filter_map(|r| r.summary.step_ms.median)
        .collect();
    crate::ledgers::join(&logs, median(&steps))
}

/// The straggler finding with the ledger's word on it: the collectives the culprit was last at
/// (its evidence), or the rank the ledger names instead (the finding's culprit then, with the
/// disagreement said and the confidence lowered).
fn with_ledger(mut f: Finding, w: &crate::summary::CollectiveWaits) -> Finding {
    if w.compared < MIN_ALIGNED_STEPS as u64 {
        return f;
    }
    let said = |r: &crate::summary::RankArrivals| {
        format!(
            "at the collectives, rank {} entered last at {} of {} joined across the ranks{}",
            r.rank,
            r.last,
            w.compared,
            r.median_late_ms
                .map(|m| format!(" (median {m:.1} ms after the others)"))
                .unwrap_or_default()
        )
    };
    match (w.waits_for, f.culprit_rank) {
        (Some(l), Some(c)) if l == c => {
            if let Some(r) = w.ranks.iter().find(|r| r.rank == l) {
                f.why.push_str(&format!("; {}", said(r)));
            }
        }
        (Some(l), Some(c)) => {
            if let Some(r) = w.ranks.iter().find(|r| r.rank == l) {
                f.why.push_str(&format!(
                    "; but {}: the job waits for rank {l}, not rank {c}",
                    said(r)
                ));
                f.culprit_rank = Some(l);
                f.confidence = Confidence::Medium;
            }
        }
        (None, Some(c)) => {
            if let Some(r) = w.ranks.iter().find(|r| r.rank == c) {
                f.why
                    .push_str(&format!("; {} (no rank was last at half of them)", said(r)));
                f.confidence = Confidence::Medium;
            }
        }
        _ => {}
    }
    f
}

/// The hang as the ledgers see it: the newest collective ranks are inside, who is inside it and
/// who is not, and the desyncs (`None`: no rank inside a collective).
fn hang_in_ledger(
    w: &crate::summary::CollectiveWaits,
    ranks: &[u32],
) -> Option<(String, Vec<u32>)> {
    let (mut text, inside) = crate::ledgers::open_said(w)?;
    let missing: Vec<u32> = ranks
        .iter()
        .copied()
        .filter(|r| !inside.contains(r))
        .collect();
    let list = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let who = |v: &[u32]| format!("rank{} {}", if v.len() == 1 { "" } else { "s" }, list(v));
    if !missing.is_empty() {
        text.push_str(&format!("; {} not in it", who(&missing)));
    }
    for d in &w.desyncs {
        text.push_str(&format!("; desync: {}", crate::ledgers::said(d)));
    }
    Some((text, missing))
}

/// The one rank whose op differs from every other rank's at a desync (`None`: no single one).
fn odd_one_out(d: &crate::summary::Desync) -> Option<u32> {
    if d.kind != "op" || d.ops.len() < 3 {
        return None;
    }
    let alone: Vec<u32> = d
        .ops
        .iter()
        .filter(|o| d.ops.iter().filter(|x| x.op == o.op).count() == 1)
        .map(|o| o.rank)
        .collect();
    (alone.len() == 1).then(|| alone[0])
}

/// The job's summary: the lowest rank's summary with every rank's row, the job's description,
/// and the job-level findings first (HANG, then STRAGGLER) when they are warnings or worse.
/// After an elastic restart the job is its last attempt: the ranks of earlier attempts (their
/// own summaries are in their directories) are counted in `job.restarts`, not compared.
pub fn combine(mut runs: Vec<RankRun>, mut job: JobInfo, stuck: &[Stuck]) -> Option<Summary> {
    let last = runs.iter().map(|r| r.restart).max()?;
    job.restarts = job.restarts.max(last);
    runs.retain(|r| r.restart == last);
    runs.sort_by_key(|r| r.rank);
    let mut out = runs.first()?.summary.clone();
    out.ranks = runs
        .iter()
        .map(|r| RankSummary {
            rank: r.rank,
            local_rank: r.local_rank,
            pid: r.pid,
            restart: r.restart,
            steps: r.summary.steps.count,
            step_ms: r.summary.step_ms.clone(),
            phases: Phases::from_fn(|p| {
                let st = &r.summary.phases[p];
                crate::summary::PhaseStats {
                    median_ms: st.median_ms,
                    mean_ms: st.mean_ms,
                    share: st.share,
                    launches_per_step: st.launches_per_step,
                    ..Default::default()
                }
            }),
            verdict: r.summary.primary_diagnosis.kind,
            stack: if stuck.is_empty() {
                Vec::new()
            } else {
                r.stack.clone()
            },
            gpu: r.summary.gpu.as_ref().and_then(crate::summary::RankGpu::of),
        })
        .collect();
    out.job = Some(JobInfo {
        ranks_measured: runs.len() as u32,
        ..job
    });
    out.collective_waits = collective_waits(&runs);
    let mut job_findings: Vec<Finding> = Vec::new();
    job_findings.extend(hang(&runs, stuck).map(|mut f| {
        let ranks: Vec<u32> = runs.iter().map(|r| r.rank).collect();
        if let Some((text, missing)) = out
            .collective_waits
            .as_ref()
            .and_then(|w| hang_in_ledger(w, &ranks))
        {
            f.why.push_str(&format!("; at the collectives: {text}"));
            if missing.len() == 1 {
                f.culprit_rank = Some(missing[0]);
            } else if let Some(odd) = out
                .collective_waits
                .as_ref()
                .and_then(|w| w.desyncs.iter().find_map(odd_one_out))
            {
                f.culprit_rank = Some(odd);
            }
        }
        f
    }));
    job_findings.extend(straggler(&runs).map(|f| match &out.collective_waits {
        Some(w) => with_ledger(f, w),
        None => f,
    }));
    out.stragglers = classify_stragglers(&runs);
    if job_findings.is_empty()
        && let Some(s) = &out.stragglers
    {
        // The aligned steps' median step, the one the classes were judged on.
        let median_step = step_median(&aligned(&runs)).unwrap_or(0.0);
        job_findings.extend(episodes_finding(s, median_step));
    }
    if let Some(f) = job_findings.first() {
        out.primary_diagnosis = Finding {
            confidence: out.data_quality.confidence,
            ..f.clone()
        };
    }
    let straggler_rank = job_findings
        .iter()
        .find(|f| f.kind == crate::summary::DiagnosisKind::Straggler)
        .and_then(|f| f.culprit_rank);
    if let Some(w) = straggler_rank.and_then(|r| straggler_what_if(&runs, r)) {
        out.what_if.insert(0, w);
        out.what_if.truncate(crate::whatif::MAX_WHAT_IFS);
    }
    let mut findings = job_findings;
    findings.append(&mut out.findings);
    out.findings = findings;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{self, Scenario};

    /// A rank whose steps are `step` ms with `cw` ms of collective wait and `fwd` ms forward.
    fn rank(r: u32, steps: usize, step: f64, cw: f64, fwd: f64, jitter: f64) -> RankRun {
        let mut s = testkit::summary(&Scenario {
            steps,
            ..Scenario::default()
        });
        let n = steps;
        s.step_samples.step_ms = (0..n)
            .map(|i| step + jitter * ((i * 7 + r as usize * 3) % 5) as f64)
            .collect();
        s.step_samples.phase_ms[Phase::CollectiveWait] = (0..n)
            .map(|i| cw + jitter * ((i * 3 + r as usize) % 4) as f64)
            .collect();
        s.phases[Phase::CollectiveWait].median_ms = Some(cw);
        s.phases[Phase::Forward].median_ms = Some(fwd);
        s.phases[Phase::InputWait].median_ms = Some(1.0);
        RankRun {
            rank: r,
            local_rank: Some(r),
            pid: 100 + r,
            restart: 0,
            summary: s,
            stack: Vec::new(),
        }
    }

    #[test]
    fn a_slow_rank_is_named_with_its_phase() {
        // Rank 1 forwards 15 ms longer; ranks 0 and 2 wait for it at the all-reduce.
        let runs = vec![
            rank(0, 60, 45.0, 15.5, 10.0, 0.3),
            rank(1, 60, 45.0, 0.5, 25.0, 0.3),
            rank(2, 60, 45.0, 15.0, 10.0, 0.3),
        ];
        let f = straggler(&runs).expect("straggler");
        assert_eq!(f.culprit_rank, Some(1));
        assert_eq!(f.phase, Some(Phase::Forward));
        assert_eq!(f.severity, Severity::Critical);
        assert!(
            f.why.contains("rank 1: forward 15.0 ms longer"),
            "{}",
            f.why
        );
        assert!(f.why.contains("its input_wait is normal"), "{}", f.why);
        let s = combine(runs, JobInfo::default(), &[]).unwrap();
        assert_eq!(s.primary_diagnosis.kind, DiagnosisKind::Straggler);
        assert_eq!(s.ranks.len(), 3);
        assert_eq!(s.job.as_ref().unwrap().ranks_measured, 3);
        // At the median pace the job's step loses rank 1's excess: 44.5 − 29.75 ms of own
        // work, within the jitter (the job's step is its slowest rank's, per aligned step).
        let w = &s.what_if[0];
        assert_eq!(w.phase, Phase::CollectiveWait);
        assert!(w.change.contains("rank 1"), "{w:?}");
        assert!((w.step_ms - w.step_ms_if - 14.75).abs() < 0.6, "{w:?}");
        assert!((w.throughput_factor - w.step_ms / w.step_ms_if).abs() < 1e-9);
    }

    #[test]
    fn after_an_elastic_restart_the_job_is_its_last_attempt() {
        // Attempt 0: rank 1 straggled and failed; attempt 1 is even. The job is attempt 1:
        // no straggler from the first attempt's numbers, one row per rank, the restart counted.
        let mut runs = vec![
            rank(0, 60, 45.0, 15.5, 10.0, 0.3),
            rank(1, 60, 45.0, 0.5, 25.0, 0.3),
        ];
        for r in [0, 1] {
            let mut again = rank(r, 60, 45.0, 2.0, 20.0, 1.0);
            again.restart = 1;
            again.pid += 10;
            runs.push(again);
        }
        let s = combine(runs, JobInfo::default(), &[]).unwrap();
        assert_ne!(s.primary_diagnosis.kind, DiagnosisKind::Straggler);
        let job = s.job.as_ref().unwrap();
        assert_eq!((job.restarts, job.ranks_measured), (1, 2));
        let rows: Vec<(u32, u32, u32)> =
            s.ranks.iter().map(|r| (r.rank, r.pid, r.restart)).collect();
        assert_eq!(rows, [(0, 110, 1), (1, 111, 1)]);
        // Written only when there was a restart: a job that never restarted reads as before.
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["job"]["restarts"], 1);
        let even = combine(
            vec![rank(0, 60, 45.0, 2.0, 20.0, 1.0)],
            JobInfo::default(),
            &[],
        );
        let json = serde_json::to_value(even.unwrap()).unwrap();
        assert!(json["job"].get("restarts").is_none() && json["ranks"][0].get("restart").is_none());
    }

    #[test]
    fn an_even_job_has_no_straggler() {
        let runs = vec![
            rank(0, 60, 45.0, 2.0, 20.0, 1.0),
            rank(1, 60, 45.0, 2.2, 20.0, 1.0),
            rank(2, 60, 45.0, 1.8, 20.0, 1.0),
            rank(3, 60, 45.0, 2.1, 20.0, 1.0),
        ];
        assert_eq!(straggler(&runs), None);
        let s = combine(runs, JobInfo::default(), &[]).unwrap();
        assert_ne!(s.primary_diagnosis.kind, DiagnosisKind::Straggler);
    }

    #[test]
    fn few_steps_or_one_rank_is_no_straggler() {
        assert_eq!(straggler(&[rank(0, 60, 45.0, 0.0, 30.0, 0.0)]), None);
        let runs = vec![
            rank(0, 3, 45.0, 15.0, 10.0, 0.0),
            rank(1, 3, 45.0, 0.0, 25.0, 0.0),
        ];
        assert_eq!(straggler(&runs), None);
    }

    /// Ranks of `n` steps of 50 ms; `slow(step) -> Some(rank)` is 20 ms slower in that step
    /// (its own work 40 ms, the others' 20 ms: they wait 30 ms, it 10 ms).
    fn job(n: usize, ranks: u32, slow: impl Fn(usize) -> Option<u32>) -> Vec<RankRun> {
        job_by(n, ranks, |k| slow(k).map(|r| (r, 20.0)))
    }

    /// As [`job`], the slow rank's own work `by` ms longer than the others' in that step.
    fn job_by(n: usize, ranks: u32, slow: impl Fn(usize) -> Option<(u32, f64)>) -> Vec<RankRun> {
        (0..ranks)
            .map(|r| {
                let mut run = rank(r, n, 50.0, 30.0, 10.0, 0.0);
                run.summary.step_samples.step_ms = vec![50.0; n];
                run.summary.step_samples.phase_ms[Phase::CollectiveWait] = (0..n)
                    .map(|k| match slow(k) {
                        Some((s, by)) if s == r => 30.0 - by,
                        _ => 30.0,
                    })
                    .collect();
                run
            })
            .collect()
    }

    /// Issue 57's boundaries: the class follows who the slow steps' culprits are, not only how
    /// many steps are slow or how long the longest episode is.
    #[test]
    fn straggler_classes_follow_the_culprits() {
        use crate::summary::StragglerClass as C;
        // Rank 1 slowed throughout on a busy machine: its excess dips under the noise floor, so
        // its slow steps come in 3 episodes, none holding half of them (10, 8, 8 of 26 slow
        // steps over 60). Persistent, rank 1 named, each episode listed.
        let on = |k: usize| (0..10).contains(&k) || (20..28).contains(&k) || (45..53).contains(&k);
        let runs = job(60, 4, |k| on(k).then_some(1));
        let s = classify_stragglers(&runs).unwrap();
        assert_eq!((s.class, s.rank), (C::Persistent, Some(1)));
        let eps: Vec<_> = s
            .episodes
            .iter()
            .map(|e| (e.rank, e.from_step, e.to_step))
            .collect();
        assert_eq!(eps, [(1, 0, 10), (1, 20, 28), (1, 45, 53)]);
        assert!((s.lost_ms - 26.0 * 20.0).abs() < 1e-6, "{s:?}");
        // The persistence line alone misses it (rank 1's median own work is the others'); the
        // job's verdict names it from the episodes, with each stretch and the time lost.
        assert_eq!(straggler(&runs), None);
        let sum = combine(runs, JobInfo::default(), &[]).unwrap();
        let f = &sum.primary_diagnosis;
        assert_eq!(
            (f.kind, f.culprit_rank),
            (DiagnosisKind::Straggler, Some(1))
        );
        assert!(
            f.why.contains("3 episodes between steps 0 and 53"),
            "{}",
            f.why
        );
        assert!(f.why.contains("0.5 s of the others' time"), "{}", f.why);
        // Rank 1 slowed throughout, its excess over the floor (20 ms) only in steps 5–15 and
        // 25–35 of 60 (a span of half the run), 3 ms under the 5 ms floor in the others: still
        // the slowest rank in every step. Persistent.
        let s = classify_stragglers(&job_by(60, 4, |k| {
            Some((
                1,
                if (5..15).contains(&k) || (25..35).contains(&k) {
                    20.0
                } else {
                    3.0
                },
            ))
        }))
        .unwrap();
        assert_eq!(
            (s.class, s.rank, s.episodes.len()),
            (C::Persistent, Some(1), 2)
        );
        // The same two episodes with the rank no slower than the others elsewhere: transient.
        let s = classify_stragglers(&job_by(60, 4, |k| {
            ((5..15).contains(&k) || (25..35).contains(&k)).then_some((1, 20.0))
        }))
        .unwrap();
        assert_eq!((s.class, s.rank), (C::Transient, Some(1)));
        // On a noisy node (each rank's own work ±8 ms from step to step: 3σ ≈ 18 ms), the slow
        // rank 9 ms over the others, moving every 10 steps: 9 steps clear 3σ alone (no class),
        // the runs of one culprit make 45 slow. Rotating; and the same noise with no rank
        // slowed is nothing.
        let noisy = |slowed: bool| -> Vec<RankRun> {
            let jitter = |k: usize, r: u32| ((k * 7 + r as usize * 13) % 17) as f64 - 8.0;
            (0..4u32)
                .map(|r| {
                    let mut run = rank(r, 100, 50.0, 30.0, 10.0, 0.0);
                    run.summary.step_samples.step_ms = vec![50.0; 100];
                    run.summary.step_samples.phase_ms[Phase::CollectiveWait] = (0..100)
                        .map(|k| {
                            let by = if slowed && (k / 10) as u32 % 4 == r {
                                9.0
                            } else {
                                0.0
                            };
                            30.0 - by - jitter(k, r)
                        })
                        .collect();
                    run
                })
                .collect()
        };
        // One such run alone (rank 1, steps 20–30): chance makes a run now and then (two ranks
        // of an even job under load did in CI), so it makes no class.
        let one_run: Vec<RankRun> = noisy(false)
            .into_iter()
            .map(|mut run| {
                if run.rank == 1 {
                    for k in 20..30 {
                        run.summary.step_samples.phase_ms[Phase::CollectiveWait][k] -= 9.0;
                    }
                }
                run
            })
            .collect();
        assert_eq!(classify_stragglers(&one_run), None);
        let s = classify_stragglers(&noisy(true)).unwrap();
        assert_eq!((s.class, s.rank), (C::Rotating, None));
        assert!(s.slow_share >= 0.4, "{s:?}");
        assert_eq!(classify_stragglers(&noisy(false)), None);
        // Two ranks alternating every 4 steps (each about half of the slow steps): rotating.
        let s =
            classify_stragglers(&job(80, 4, |k| Some(if k / 4 % 2 == 0 { 0 } else { 2 }))).unwrap();
        assert_eq!((s.class, s.rank), (C::Rotating, None));
        // ... and three ranks at 50/30/20 of the slow steps, the first in episodes: no rank
        // holds most of them.
        let s = classify_stragglers(&job(80, 4, |k| match k % 10 {
            0..5 => Some(1),
            5..8 => Some(3),
            _ => Some(0),
        }))
        .unwrap();
        assert_eq!((s.class, s.rank), (C::Rotating, None));
        // One rank slow in 55 % of the steps (11 of every 20): under the 60 % line, in 4
        // episodes none holding half of them, spanning the run. Persistent, not rotating.
        let s = classify_stragglers(&job(80, 4, |k| (k % 20 < 11).then_some(3))).unwrap();
        assert_eq!((s.class, s.rank), (C::Persistent, Some(3)));
        assert!((s.slow_share - 0.55).abs() < 1e-9, "{s:?}");
        assert_eq!(s.episodes.len(), 4);
        // A transient episode (rank 2, steps 20–40 of 100) beside scattered noise on the other
        // ranks (5 single slow steps, 8 ms over): transient, rank 2, its one episode.
        let noise = [(5, 0), (50, 3), (61, 0), (70, 1), (88, 3)];
        let runs = job_by(100, 4, |k| {
            if (20..40).contains(&k) {
                Some((2, 20.0))
            } else {
                noise.iter().find(|n| n.0 == k).map(|n| (n.1, 8.0))
            }
        });
        let s = classify_stragglers(&runs).unwrap();
        assert_eq!((s.class, s.rank), (C::Transient, Some(2)));
        let eps: Vec<_> = s
            .episodes
            .iter()
            .map(|e| (e.rank, e.from_step, e.to_step))
            .collect();
        assert_eq!(eps, [(2, 20, 40)]);
        assert!((s.slow_share - 0.25).abs() < 1e-9, "{s:?}");
        let sum = combine(runs, JobInfo::default(), &[]).unwrap();
        assert_eq!(sum.primary_diagnosis.culprit_rank, Some(2));
        assert!(
            sum.primary_diagnosis.why.contains("steps 20–40 of 100"),
            "{}",
            sum.primary_diagnosis.why
        );
        // The same rank in two stretches of one part of the run (steps 20–30 and 36–46 of
        // 100): transient, both stretches.
        let s = classify_stragglers(&job(100, 4, |k| {
            ((20..30).contains(&k) || (36..46).contains(&k)).then_some(2)
        }))
        .unwrap();
        assert_eq!(
            (s.class, s.rank, s.episodes.len()),
            (C::Transient, Some(2), 2)
        );
        // A cheap episode (an even job on a busy CI host: rank 1 5.5 ms slower in steps 45–57
        // of 60 steps of 50 ms, 66 ms in all, 2.2 % of the run): its class and episode are in
        // the summary, no finding (under the 6 % a straggler at the published lines costs).
        let runs = job_by(60, 2, |k| (45..57).contains(&k).then_some((1, 5.5)));
        let s = classify_stragglers(&runs).unwrap();
        assert_eq!((s.class, s.rank), (C::Transient, Some(1)));
        let sum = combine(runs, JobInfo::default(), &[]).unwrap();
        assert!(
            sum.findings
                .iter()
                .all(|f| f.kind != DiagnosisKind::Straggler),
            "{:?}",
            sum.findings
        );
        // Rank 1 40 ms slower in steps 45–57: 480 ms, 16 % of the run. A finding.
        let runs = job_by(60, 2, |k| (45..57).contains(&k).then_some((1, 40.0)));
        let sum = combine(runs, JobInfo::default(), &[]).unwrap();
        assert_eq!(
            (
                sum.primary_diagnosis.kind,
                sum.primary_diagnosis.culprit_rank
            ),
            (DiagnosisKind::Straggler, Some(1))
        );
    }

    #[test]
    fn stragglers_are_persistent_transient_or_rotating() {
        use crate::summary::StragglerClass as C;
        // Rank 1 slow throughout.
        let s = classify_stragglers(&job(80, 4, |_| Some(1))).unwrap();
        assert_eq!((s.class, s.rank), (C::Persistent, Some(1)));
        assert_eq!(s.steps, 80);
        assert!((s.slow_share - 1.0).abs() < 1e-9);
        // Rank 2 slow in steps 20..40 only: one episode, the others lost 20 ms a step there.
        let runs = job(80, 4, |k| (20..40).contains(&k).then_some(2));
        let s = classify_stragglers(&runs).unwrap();
        assert_eq!((s.class, s.rank), (C::Transient, Some(2)));
        assert_eq!(s.episodes.len(), 1);
        let e = &s.episodes[0];
        assert_eq!((e.rank, e.from_step, e.to_step), (2, 20, 40));
        assert!((e.lost_ms - 20.0 * 20.0).abs() < 1e-6, "{e:?}");
        // ... which the persistent rule alone did not name, and the job's summary now does.
        assert_eq!(straggler(&runs), None);
        let sum = combine(runs, JobInfo::default(), &[]).unwrap();
        assert_eq!(sum.primary_diagnosis.kind, DiagnosisKind::Straggler);
        assert_eq!(sum.primary_diagnosis.culprit_rank, Some(2));
        assert!(
            sum.primary_diagnosis.why.contains("steps 20–40"),
            "{}",
            sum.primary_diagnosis.why
        );
        // The slow rank moves every 5 steps: rotating, no rank named.
        let s = classify_stragglers(&job(80, 2, |k| Some((k / 5 % 2) as u32))).unwrap();
        assert_eq!((s.class, s.rank), (C::Rotating, None));
        // An even job: nothing.
        assert_eq!(classify_stragglers(&job(80, 4, |_| None)), None);
        // A few scattered slow steps: nothing either.
        assert_eq!(
            classify_stragglers(&job(80, 4, |k| (k % 20 == 3).then_some(1))),
            None
        );
    }

    #[test]
    fn a_collective_hang_is_named_after_seconds_not_a_minute() {
        use std::time::Duration as D;
        let look = |rank, idle: u64, coll: Option<u64>| Look {
            rank,
            idle: Some(D::from_millis(idle)),
            mean_step: D::from_millis(50),
            in_collective_for: coll.map(D::from_millis),
        };
        // Rank 1 sleeps outside; rank 0 has waited 5.2 s in the all-reduce: a hang.
        let stuck = collective_hang(&[look(0, 5300, Some(5200)), look(1, 5300, None)]).unwrap();
        assert_eq!(stuck.len(), 2);
        assert!((stuck[0].idle_s - 5.3).abs() < 1e-9);
        // 4.9 s is not yet; a rank still stepping is progress.
        assert_eq!(
            collective_hang(&[look(0, 5000, Some(4900)), look(1, 5000, None)]),
            None
        );
        // Every rank inside a collective that long: calls that never match (a desync).
        assert_eq!(
            collective_hang(&[look(0, 9000, Some(9000)), look(1, 9000, Some(9000))])
                .map(|s| s.len()),
            Some(2)
        );
        assert_eq!(
            collective_hang(&[look(0, 9000, Some(9000)), look(1, 9000, Some(3000))]),
            None
        );
        assert_eq!(
            collective_hang(&[look(0, 9000, Some(9000)), look(1, 20, None)]),
            None
        );
        // Slow steps: 10 of them.
        let slow = |rank, coll| Look {
            mean_step: D::from_secs(2),
            ..look(rank, 15_000, coll)
        };
        assert_eq!(
            collective_hang(&[slow(0, Some(15_000)), slow(1, None)]),
            None
        );
        assert_eq!(collective_hang(&[look(0, 6000, Some(6000))]), None);
    }

    #[test]
    fn hang_names_the_rank_outside_the_collective() {
        let mut a = rank(0, 30, 45.0, 2.0, 20.0, 0.0);
        a.stack = vec!["<module>".into(), "train".into(), "all_reduce".into()];
        let mut b = rank(1, 30, 45.0, 2.0, 20.0, 0.0);
        b.stack = vec!["<module>".into(), "train".into(), "sleep_forever".into()];
        let stuck = [Stuck {
            rank: 0,
            idle_s: 70.0,
        }];
        let s = combine(vec![a, b], JobInfo::default(), &stuck).unwrap();
        assert_eq!(s.primary_diagnosis.kind, DiagnosisKind::Hang);
        assert_eq!(s.primary_diagnosis.culprit_rank, Some(1));
        assert!(
            s.primary_diagnosis.why.contains("rank 1: in sleep_forever"),
            "{}",
            s.primary_diagnosis.why
        );
        assert_eq!(s.ranks[1].stack.len(), 3);
    }
}
