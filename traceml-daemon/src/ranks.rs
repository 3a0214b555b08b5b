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
use crate::engine::Phase;
use crate::stats::median;
use crate::summary::{
    Confidence, DiagnosisKind, Finding, JobInfo, Phases, RankSummary, Severity, Summary,
};

pub const STRAGGLER_WARNING: f64 = 0.10;
pub const STRAGGLER_CRITICAL: f64 = 0.20;
pub const STRAGGLER_PERSISTENCE: f64 = 0.6;
/// Aligned steps needed for any straggler finding.
pub const MIN_ALIGNED_STEPS: usize = 5;

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
#[derive(Clone, Debug)]
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
    let step_median = median(
        &steps
            .iter()
            .flat_map(|st| st.iter().map(|x| x.0))
            .collect::<Vec<_>>(),
    )?;
    if step_median <= 0.0 {
        return None;
    }
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
    let excess = |p: Phase| {
        let o: Vec<f64> = runs
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != culprit)
            .map(|(_, r)| phase_median(&r.summary, p))
            .collect();
        phase_median(&c.summary, p) - median(&o).unwrap_or(0.0)
    };
    let (dominant, by) = Phase::ALL
        .into_iter()
        .filter(|&p| p != Phase::CollectiveWait && p != Phase::Residual)
        .map(|p| (p, excess(p)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap_or((Phase::Forward, 0.0));
    let wait_others = median(
        &runs
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != culprit)
            .map(|(_, r)| phase_median(&r.summary, Phase::CollectiveWait))
            .collect::<Vec<_>>(),
    )
    .unwrap_or(0.0);
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
    );
    let next = match dominant {
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
    };
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
        })
        .collect();
    out.job = Some(JobInfo {
        ranks_measured: runs.len() as u32,
        ..job
    });
    let mut job_findings: Vec<Finding> = Vec::new();
    job_findings.extend(hang(&runs, stuck));
    job_findings.extend(straggler(&runs));
    if let Some(f) = job_findings.first() {
        out.primary_diagnosis = Finding {
            confidence: out.data_quality.confidence,
            ..f.clone()
        };
    }
    let mut findings = job_findings;
    findings.append(&mut out.findings);
    out.findings = findings;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::fixtures::{self, Scenario};

    /// A rank whose steps are `step` ms with `cw` ms of collective wait and `fwd` ms forward.
    fn rank(r: u32, steps: usize, step: f64, cw: f64, fwd: f64, jitter: f64) -> RankRun {
        let mut s = fixtures::summary(&Scenario {
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
