//! Comparison of two runs' summaries (A = before, B = after): deltas of step time, each phase,
//! memory and utilization, and a verdict (`IMPROVEMENT`, `REGRESSION`, `MIXED`, `EQUIVALENT`,
//! `INCONCLUSIVE`) with its reason, and the exit status. Its text and JSON renderings are in
//! [`crate::render::compare`].
//!
//! A time difference counts only when it is both statistically clear on the per-step
//! distributions (two-sided Mann-Whitney U, normal approximation with tie correction,
//! p < [`ALPHA`]) and large enough to matter (|Δ median| ≥ [`MIN_EFFECT_FRACTION`] of A's median
//! step and ≥ [`MIN_EFFECT_MS`]); so a difference inside run-to-run noise is never a regression.
//! Steps of one run are not independent (warm-up, drifts), which makes the test optimistic: the
//! effect-size floor is what keeps small drifts out. Memory peaks have no distribution: they count
//! when they move by ≥ [`MEM_MIN_FRACTION`] and ≥ [`MEM_MIN_BYTES`].
use serde::{Deserialize, Serialize};

use crate::phase::Phase;
use crate::stats::{mann_whitney_p, median};
use crate::summary::{Phases, Summary};
use crate::units::{bytes_bin, ms, p_value};

/// Significance level of the rank test.
pub const ALPHA: f64 = 0.01;
/// Smallest step-time change that matters, as a fraction of A's median step.
pub const MIN_EFFECT_FRACTION: f64 = 0.05;
/// Smallest time change that matters, in ms.
pub const MIN_EFFECT_MS: f64 = 1.0;
/// Steps each run needs for a verdict.
pub const MIN_STEPS: usize = 10;
/// Smallest memory-peak change that matters: this fraction of A's peak...
pub const MEM_MIN_FRACTION: f64 = 0.10;
/// ... and this many bytes.
pub const MEM_MIN_BYTES: f64 = (256u64 << 20) as f64;

/// The overall judgement of B against A.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CompareVerdict {
    /// B is faster (or leaner) and nothing got worse.
    Improvement,
    /// B is slower (or uses clearly more memory) and nothing got better.
    Regression,
    /// Some things got better, others worse.
    Mixed,
    /// No difference beyond run-to-run noise.
    Equivalent,
    /// The runs cannot be compared (too few steps, different step boundaries).
    Inconclusive,
}

impl CompareVerdict {
    pub fn as_str(self) -> &'static str {
        match self {
            CompareVerdict::Improvement => "IMPROVEMENT",
            CompareVerdict::Regression => "REGRESSION",
            CompareVerdict::Mixed => "MIXED",
            CompareVerdict::Equivalent => "EQUIVALENT",
            CompareVerdict::Inconclusive => "INCONCLUSIVE",
        }
    }
}

/// Direction of a change that passed both the test and the effect-size floor.
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    Better,
    Worse,
    /// Within noise or below the minimum effect.
    Same,
    /// Not measured in one of the runs.
    #[default]
    Unknown,
}

/// A time distribution in A and B.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TimeDelta {
    pub a_median_ms: Option<f64>,
    pub b_median_ms: Option<f64>,
    pub delta_ms: Option<f64>,
    /// Relative to A's median of this series.
    pub delta_pct: Option<f64>,
    /// Two-sided Mann-Whitney U p-value on the per-step values.
    pub p_value: Option<f64>,
    pub change: Change,
}

/// A single value in A and B (no distribution).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ValueDelta {
    pub a: Option<f64>,
    pub b: Option<f64>,
    pub delta: Option<f64>,
    pub delta_pct: Option<f64>,
}

impl ValueDelta {
    fn new(a: Option<f64>, b: Option<f64>) -> ValueDelta {
        let delta = a.zip(b).map(|(a, b)| b - a);
        let delta_pct = a
            .zip(delta)
            .and_then(|(a, d)| (a.abs() > 0.0).then(|| 100.0 * d / a));
        ValueDelta {
            a,
            b,
            delta,
            delta_pct,
        }
    }
}

/// Memory peaks in A and B, bytes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemoryDeltas {
    pub rss_bytes_max: ValueDelta,
    pub gpu_process_mem_bytes_max: ValueDelta,
    pub change: Change,
}

/// Mean utilizations in A and B, percent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UtilizationDeltas {
    pub gpu_util_pct_mean: ValueDelta,
    pub process_cpu_pct_one_core_mean: ValueDelta,
    pub workers_cpu_pct_one_core_mean: ValueDelta,
    pub system_cpu_pct_mean: ValueDelta,
}

/// Which run is which.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunRef {
    pub pid: Option<u32>,
    pub cmdline: Vec<String>,
    pub steps: u32,
    pub diagnosis: String,
}

/// The result of [`compare`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub verdict: CompareVerdict,
    pub reason: String,
    pub a: RunRef,
    pub b: RunRef,
    pub step_ms: TimeDelta,
    pub phases: Phases<TimeDelta>,
    pub memory: MemoryDeltas,
    pub utilization: UtilizationDeltas,
    /// Evaluation's share of wall time (0–1) in A and B; absent when neither evaluated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evaluation_share_of_wall: Option<ValueDelta>,
    /// Caveats (decimated samples, data-quality differences).
    pub notes: Vec<String>,
    /// Multi-rank jobs: each rank of either run, side by side (empty for jobs of one process).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<RankDelta>,
    /// What fixing it buys in A and in B, per phase either run names a what-if for (A's order
    /// first): the bound moving between the runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub what_if: Vec<WhatIfDelta>,
}

/// One phase's what-if in run A and run B (`None`: that run names none for it: under 5 % of
/// its step, under a 1.1× gain, or no floor known).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WhatIfDelta {
    pub phase: Phase,
    pub a_step_ms_if: Option<f64>,
    pub b_step_ms_if: Option<f64>,
    pub a_factor: Option<f64>,
    pub b_factor: Option<f64>,
}

/// The what-ifs of A and B side by side, by phase.
fn what_if_deltas(a: &Summary, b: &Summary) -> Vec<WhatIfDelta> {
    let mut phases: Vec<Phase> = Vec::new();
    for w in a.what_if.iter().chain(&b.what_if) {
        if !phases.contains(&w.phase) {
            phases.push(w.phase);
        }
    }
    phases
        .into_iter()
        .map(|p| {
            let of = |s: &Summary| s.what_if.iter().find(|w| w.phase == p).cloned();
            let (wa, wb) = (of(a), of(b));
            WhatIfDelta {
                phase: p,
                a_step_ms_if: wa.as_ref().map(|w| w.step_ms_if),
                b_step_ms_if: wb.as_ref().map(|w| w.step_ms_if),
                a_factor: wa.map(|w| w.throughput_factor),
                b_factor: wb.map(|w| w.throughput_factor),
            }
        })
        .collect()
}

/// One rank of a multi-rank job in run A and run B (`None`: the rank is not in that run). Its
/// median step time and its own verdict; the job's verdict above is the judgement, these say
/// which rank moved.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankDelta {
    pub rank: u32,
    pub a_median_ms: Option<f64>,
    pub b_median_ms: Option<f64>,
    /// (B − A) / A, percent.
    pub delta_pct: Option<f64>,
    pub a_verdict: Option<String>,
    pub b_verdict: Option<String>,
}

/// The ranks of both runs, by rank number.
fn rank_deltas(a: &Summary, b: &Summary) -> Vec<RankDelta> {
    let mut ids: Vec<u32> = a.ranks.iter().chain(&b.ranks).map(|r| r.rank).collect();
    ids.sort_unstable();
    ids.dedup();
    ids.into_iter()
        .map(|rank| {
            let find = |s: &Summary| s.ranks.iter().find(|r| r.rank == rank).cloned();
            let (ra, rb) = (find(a), find(b));
            let med =
                |r: &Option<crate::summary::RankSummary>| r.as_ref().and_then(|r| r.step_ms.median);
            let (am, bm) = (med(&ra), med(&rb));
            RankDelta {
                rank,
                a_median_ms: am,
                b_median_ms: bm,
                delta_pct: am
                    .zip(bm)
                    .filter(|(x, _)| *x > 0.0)
                    .map(|(x, y)| (y - x) / x * 100.0),
                a_verdict: ra.map(|r| r.verdict.as_str().to_owned()),
                b_verdict: rb.map(|r| r.verdict.as_str().to_owned()),
            }
        })
        .collect()
}

/// "rank 1 (STRAGGLER)" or "none": the job's culprit rank, when its verdict names one.
fn culprit(s: &Summary) -> String {
    let d = &s.primary_diagnosis;
    d.culprit_rank.map_or("none".to_owned(), |r| {
        format!("rank {r} ({})", d.kind.headline())
    })
}

/// Compares run B against run A.
pub fn compare(a: &Summary, b: &Summary) -> Comparison {
    let a_step = median(&a.step_samples.step_ms);
    let floor = a_step.map_or(MIN_EFFECT_MS, |m| {
        (MIN_EFFECT_FRACTION * m).max(MIN_EFFECT_MS)
    });
    let step_ms = time_delta(&a.step_samples.step_ms, &b.step_samples.step_ms, floor);
    let phases = Phases::from_fn(|p| {
        time_delta(
            &a.step_samples.phase_ms[p],
            &b.step_samples.phase_ms[p],
            floor,
        )
    });
    let memory = memory_deltas(a, b);
    let utilization = UtilizationDeltas {
        gpu_util_pct_mean: ValueDelta::new(
            a.gpu.as_ref().and_then(|g| g.util_pct_mean),
            b.gpu.as_ref().and_then(|g| g.util_pct_mean),
        ),
        process_cpu_pct_one_core_mean: ValueDelta::new(
            a.process.cpu_pct_one_core_mean,
            b.process.cpu_pct_one_core_mean,
        ),
        workers_cpu_pct_one_core_mean: ValueDelta::new(
            a.workers.cpu_pct_one_core_mean,
            b.workers.cpu_pct_one_core_mean,
        ),
        system_cpu_pct_mean: ValueDelta::new(a.system.cpu_pct_mean, b.system.cpu_pct_mean),
    };
    let mut notes = Vec::new();
    for (name, s) in [("A", a), ("B", b)] {
        if s.step_samples.stride > 1 {
            notes.push(format!(
                "run {name}: every {}th of {} steps compared",
                s.step_samples.stride, s.steps.count
            ));
        }
        if s.data_quality.confidence < crate::summary::Confidence::High {
            notes.push(format!(
                "run {name}: data confidence {} ({})",
                s.data_quality.confidence.as_str(),
                s.data_quality.notes.join("; ")
            ));
        }
    }
    let micro = |s: &Summary| s.steps.micro_batches.as_ref().map(|m| m.mean);
    if let (Some(ma), Some(mb)) = (micro(a), micro(b))
        && (ma - mb).abs() >= 0.5
    {
        notes.push(format!(
            "a step is one optimizer step: A has {ma:.1} micro-batches per step, B {mb:.1} (compare \
             time per micro-batch, or the same accumulation)"
        ));
    }
    let evaluation_share_of_wall = (a.evaluation.segments > 0 || b.evaluation.segments > 0)
        .then(|| ValueDelta::new(a.evaluation.share_of_wall, b.evaluation.share_of_wall));
    let ranks = rank_deltas(a, b);
    if !ranks.is_empty() {
        let (ca, cb) = (culprit(a), culprit(b));
        if ca != cb {
            notes.push(format!("the job's culprit changed: A {ca} → B {cb}"));
        }
        if a.ranks.len() != b.ranks.len() {
            notes.push(format!(
                "ranks measured: A {}, B {}",
                a.ranks.len(),
                b.ranks.len()
            ));
        }
    }
    let (verdict, reason) = judge(a, b, &step_ms, &phases, &memory, floor);
    Comparison {
        verdict,
        reason,
        a: run_ref(a),
        b: run_ref(b),
        step_ms,
        phases,
        memory,
        utilization,
        evaluation_share_of_wall,
        notes,
        ranks,
        what_if: what_if_deltas(a, b),
    }
}

/// Process exit status for a comparison: 1 for `REGRESSION`, else 0.
pub fn exit_code(c: &Comparison) -> u8 {
    u8::from(c.verdict == CompareVerdict::Regression)
}

fn run_ref(s: &Summary) -> RunRef {
    RunRef {
        pid: s.target.pid,
        cmdline: s.target.cmdline.clone(),
        steps: s.steps.count,
        diagnosis: s.primary_diagnosis.kind.as_str().to_owned(),
    }
}

fn time_delta(a: &[f64], b: &[f64], floor_ms: f64) -> TimeDelta {
    let (am, bm) = (median(a), median(b));
    let delta_ms = am.zip(bm).map(|(a, b)| b - a);
    let delta_pct = am
        .zip(delta_ms)
        .and_then(|(a, d)| (a > 0.0).then(|| 100.0 * d / a));
    let p_value = mann_whitney_p(a, b);
    let change = match (delta_ms, p_value) {
        (Some(d), Some(p)) if p < ALPHA && d.abs() >= floor_ms => {
            if d < 0.0 {
                Change::Better
            } else {
                Change::Worse
            }
        }
        (Some(_), Some(_)) => Change::Same,
        _ => Change::Unknown,
    };
    TimeDelta {
        a_median_ms: am,
        b_median_ms: bm,
        delta_ms,
        delta_pct,
        p_value,
        change,
    }
}

fn memory_deltas(a: &Summary, b: &Summary) -> MemoryDeltas {
    let rss = ValueDelta::new(
        a.process.rss_bytes_max.map(|x| x as f64),
        b.process.rss_bytes_max.map(|x| x as f64),
    );
    let gpu = ValueDelta::new(
        a.gpu
            .as_ref()
            .and_then(|g| g.process_mem_bytes_max)
            .map(|x| x as f64),
        b.gpu
            .as_ref()
            .and_then(|g| g.process_mem_bytes_max)
            .map(|x| x as f64),
    );
    let moved = |v: &ValueDelta| match (v.a, v.delta) {
        (Some(a), Some(d)) if d.abs() >= MEM_MIN_BYTES && d.abs() >= MEM_MIN_FRACTION * a => {
            Some(if d < 0.0 {
                Change::Better
            } else {
                Change::Worse
            })
        }
        (Some(_), Some(_)) => Some(Change::Same),
        _ => None,
    };
    let changes: Vec<Change> = [moved(&rss), moved(&gpu)].into_iter().flatten().collect();
    let change = if changes.is_empty() {
        Change::Unknown
    } else if changes.contains(&Change::Worse) && changes.contains(&Change::Better) {
        // One up, one down: report as worse (memory that grows is what fails a run).
        Change::Worse
    } else if changes.contains(&Change::Worse) {
        Change::Worse
    } else if changes.contains(&Change::Better) {
        Change::Better
    } else {
        Change::Same
    };
    MemoryDeltas {
        rss_bytes_max: rss,
        gpu_process_mem_bytes_max: gpu,
        change,
    }
}

/// "122 ms → 51.5 ms (−58%)".
fn describe(d: &TimeDelta) -> String {
    let pctx = d
        .delta_pct
        .map(|p| format!(" ({}{p:.0}%)", if p >= 0.0 { "+" } else { "" }))
        .unwrap_or_default();
    format!("{} → {}{pctx}", ms(d.a_median_ms), ms(d.b_median_ms))
}

/// Why two runs' step times do not compare (too few steps, steps delimited differently).
fn not_comparable(a: &Summary, b: &Summary) -> Option<String> {
    let (na, nb) = (a.step_samples.step_ms.len(), b.step_samples.step_ms.len());
    if na < MIN_STEPS || nb < MIN_STEPS {
        return Some(format!(
            "run A has {na} and run B {nb} measured steps; at least {MIN_STEPS} each are needed"
        ));
    }
    match (a.steps.boundary, b.steps.boundary) {
        (Some(ba), Some(bb)) if ba != bb => Some(format!(
            "the runs delimit steps differently ({} vs {}): their step times do not compare",
            crate::summary::boundary_name(ba),
            crate::summary::boundary_name(bb)
        )),
        _ => None,
    }
}

/// The phase that moved most in direction `want`.
fn biggest(phases: &Phases<TimeDelta>, want: Change) -> Option<Phase> {
    Phase::ALL
        .iter()
        .filter(|&&p| phases[p].change == want)
        .max_by(|&&x, &&y| {
            phases[x]
                .delta_ms
                .unwrap_or(0.0)
                .abs()
                .total_cmp(&phases[y].delta_ms.unwrap_or(0.0).abs())
        })
        .copied()
}

/// The memory peaks that moved, `A → B`.
fn mem_text(mem: &MemoryDeltas) -> String {
    let mut parts = Vec::new();
    for (name, v) in [
        ("host RSS peak", &mem.rss_bytes_max),
        ("GPU memory peak", &mem.gpu_process_mem_bytes_max),
    ] {
        if let (Some(x), Some(y)) = (v.a, v.b) {
            parts.push(format!(
                "{name} {} → {}",
                bytes_bin(x as u64),
                bytes_bin(y as u64)
            ));
        }
    }
    parts.join(", ")
}

fn judge(
    a: &Summary,
    b: &Summary,
    step: &TimeDelta,
    phases: &Phases<TimeDelta>,
    mem: &MemoryDeltas,
    floor: f64,
) -> (CompareVerdict, String) {
    use CompareVerdict as V;
    if let Some(why) = not_comparable(a, b) {
        return (V::Inconclusive, why);
    }
    let biggest = |want: Change| biggest(phases, want);
    let phase_text = |p: Phase| format!("{} {}", p.name(), describe(&phases[p]));
    let mem_text = || mem_text(mem);
    let step_text = format!(
        "step median {} (p {})",
        describe(step),
        p_value(step.p_value)
    );
    match (step.change, mem.change) {
        (Change::Better, Change::Worse) => (V::Mixed, format!("{step_text}, but {}", mem_text())),
        (Change::Worse, Change::Better) => (V::Mixed, format!("{step_text}, but {}", mem_text())),
        (Change::Better, _) => {
            let mut r = step_text;
            if let Some(p) = biggest(Change::Better) {
                r.push_str(&format!("; mostly {}", phase_text(p)));
            }
            if let Some(p) = biggest(Change::Worse) {
                r.push_str(&format!("; though {} got slower", phase_text(p)));
            }
            (V::Improvement, r)
        }
        (Change::Worse, _) => {
            let mut r = step_text;
            if let Some(p) = biggest(Change::Worse) {
                r.push_str(&format!("; mostly {}", phase_text(p)));
            }
            if let Some(p) = biggest(Change::Better) {
                r.push_str(&format!("; though {} got faster", phase_text(p)));
            }
            (V::Regression, r)
        }
        (_, mem_change) => {
            let same = format!(
                "step time {} is within run-to-run noise or under the minimum effect ({} and {:.0}%)",
                describe(step),
                ms(Some(floor)),
                MIN_EFFECT_FRACTION * 100.0
            );
            match (biggest(Change::Better), biggest(Change::Worse), mem_change) {
                (_, _, Change::Worse) => (V::Regression, format!("{same}, but {}", mem_text())),
                (Some(x), Some(y), _) => (
                    V::Mixed,
                    format!(
                        "{same}, but time moved: {} while {}",
                        phase_text(x),
                        phase_text(y)
                    ),
                ),
                (_, _, Change::Better) => (V::Improvement, format!("{same}; {}", mem_text())),
                _ if step.change == Change::Unknown => {
                    (V::Inconclusive, "step times missing".to_owned())
                }
                _ => (V::Equivalent, same),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{self, Scenario};

    #[test]
    fn multi_rank_jobs_are_compared_rank_by_rank() {
        use crate::summary::{DiagnosisKind, RankSummary};
        let rank = |r: u32, median: f64, verdict: DiagnosisKind| RankSummary {
            rank: r,
            pid: 100 + r,
            steps: 60,
            step_ms: crate::summary::StepMs {
                median: Some(median),
                ..Default::default()
            },
            verdict,
            ..Default::default()
        };
        let mut a = testkit::summary(&testkit::input_fixed());
        let mut b = a.clone();
        a.ranks = vec![
            rank(0, 40.0, DiagnosisKind::ComputeBound),
            rank(1, 40.0, DiagnosisKind::ComputeBound),
        ];
        b.ranks = vec![
            rank(0, 40.0, DiagnosisKind::ComputeBound),
            rank(1, 55.0, DiagnosisKind::ComputeBound),
            rank(2, 41.0, DiagnosisKind::ComputeBound),
        ];
        b.primary_diagnosis.kind = DiagnosisKind::Straggler;
        b.primary_diagnosis.culprit_rank = Some(1);
        let c = compare(&a, &b);
        assert_eq!(c.ranks.len(), 3);
        assert_eq!(c.ranks[0].delta_pct, Some(0.0));
        assert!((c.ranks[1].delta_pct.unwrap() - 37.5).abs() < 1e-9);
        assert_eq!(
            (c.ranks[2].a_median_ms, c.ranks[2].b_median_ms),
            (None, Some(41.0))
        );
        assert!(
            c.notes
                .iter()
                .any(|n| n == "the job's culprit changed: A none → B rank 1 (STRAGGLER)"),
            "{:?}",
            c.notes
        );
        assert!(c.notes.iter().any(|n| n == "ranks measured: A 2, B 3"));
        // A job of one process has no rank table.
        let one = testkit::summary(&testkit::input_fixed());
        assert!(compare(&one, &one).ranks.is_empty());
    }

    #[test]
    fn input_bound_vs_fix_is_improvement_naming_input() {
        let a = testkit::summary(&testkit::input_bound());
        let b = testkit::summary(&testkit::input_fixed());
        let c = compare(&a, &b);
        assert_eq!(c.verdict, CompareVerdict::Improvement, "{}", c.reason);
        assert!(c.reason.contains("mostly input_wait"), "{}", c.reason);
        assert_eq!(c.phases.input_wait.change, Change::Better);
        assert_eq!(c.phases.forward.change, Change::Same);
        assert_eq!(exit_code(&c), 0);
        // And the other way round.
        let back = compare(&b, &a);
        assert_eq!(back.verdict, CompareVerdict::Regression, "{}", back.reason);
        assert_eq!(exit_code(&back), 1);
    }

    #[test]
    fn same_distribution_is_equivalent() {
        let a = testkit::summary(&Scenario {
            seed: 3,
            jitter: 0.3,
            ..Scenario::default()
        });
        let b = testkit::summary(&Scenario {
            seed: 4,
            jitter: 0.3,
            ..Scenario::default()
        });
        let c = compare(&a, &b);
        assert_eq!(c.verdict, CompareVerdict::Equivalent, "{}", c.reason);
        assert_eq!(exit_code(&c), 0);
    }

    #[test]
    fn noise_sized_shift_is_not_a_regression() {
        // 3 % slower with 30 % jitter: under the 5 % floor whatever the test says.
        let a = testkit::summary(&Scenario {
            seed: 3,
            jitter: 0.3,
            ..Scenario::default()
        });
        let mut slow = Scenario {
            seed: 4,
            jitter: 0.3,
            ..Scenario::default()
        };
        slow.phase_ms[Phase::Backward.index()] *= 1.06;
        let c = compare(&a, &testkit::summary(&slow));
        assert_ne!(c.verdict, CompareVerdict::Regression, "{}", c.reason);
    }

    #[test]
    fn clear_slowdown_is_regression() {
        let a = testkit::summary(&testkit::compute_bound());
        let mut slow = testkit::compute_bound();
        slow.seed = 9;
        slow.phase_ms[Phase::Forward.index()] *= 1.5;
        let c = compare(&a, &testkit::summary(&slow));
        assert_eq!(c.verdict, CompareVerdict::Regression, "{}", c.reason);
        assert!(c.reason.contains("mostly forward"), "{}", c.reason);
        assert_eq!(exit_code(&c), 1);
    }

    #[test]
    fn faster_but_more_memory_is_mixed() {
        let a = testkit::summary(&testkit::input_bound());
        let mut b = testkit::summary(&testkit::input_fixed());
        b.process.rss_bytes_max = a.process.rss_bytes_max.map(|m| m * 2);
        let c = compare(&a, &b);
        assert_eq!(c.verdict, CompareVerdict::Mixed, "{}", c.reason);
        assert!(c.reason.contains("host RSS peak"), "{}", c.reason);
    }

    #[test]
    fn time_moved_between_phases_is_mixed() {
        let a = testkit::summary(&Scenario {
            jitter: 0.02,
            ..Scenario::default()
        });
        let mut moved = Scenario {
            jitter: 0.02,
            seed: 5,
            ..Scenario::default()
        };
        moved.phase_ms[Phase::Forward.index()] += 10.0;
        moved.phase_ms[Phase::Backward.index()] -= 10.0;
        let c = compare(&a, &testkit::summary(&moved));
        assert_eq!(c.verdict, CompareVerdict::Mixed, "{}", c.reason);
    }

    #[test]
    fn too_few_steps_or_other_boundary_is_inconclusive() {
        let a = testkit::summary(&Scenario::default());
        let b = testkit::summary(&Scenario {
            steps: 4,
            ..Scenario::default()
        });
        assert_eq!(compare(&a, &b).verdict, CompareVerdict::Inconclusive);
        let mut c = a.clone();
        c.steps.boundary = Some(crate::engine::Boundary::SyncPattern);
        let r = compare(&a, &c);
        assert_eq!(r.verdict, CompareVerdict::Inconclusive);
        assert!(r.reason.contains("differently"), "{}", r.reason);
        let empty = crate::analysis::summarize(&Default::default(), &[]);
        let r = compare(&empty, &empty);
        assert_eq!(r.verdict, CompareVerdict::Inconclusive);
    }
}
