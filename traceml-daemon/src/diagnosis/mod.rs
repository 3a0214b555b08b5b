//! Verdict rules: small types behind one [`Rule`] trait that read a [`Summary`]'s metrics and
//! return a finding (kind, severity, the evidence in numbers, the next thing to try), nothing, or
//! "not enough data"; and the choice of the primary diagnosis among the findings.
//!
//! Thresholds (from TraceML's documented ones, see `docs/summary-schema.md`):
//! - a phase outside compute (`input_wait`, `h2d`, `residual`) with a share of step time
//!   ≥ [`WARNING_SHARE`] is a warning, ≥ [`CRITICAL_SHARE`] critical; critical needs
//!   ≥ [`CRITICAL_MIN_STEPS`] steps, every step rule needs ≥ [`MIN_STEPS`];
//! - compute is `forward + backward + optimizer + gpu_wait` (`gpu_wait` is the host blocked on the
//!   device: the GPU is the one working). `h2d` is data movement, not compute. Compute-bound when
//!   compute ≥ [`COMPUTE_SHARE`] and no other phase ≥ [`WARNING_SHARE`];
//! - memory creep: RSS or the target's GPU memory rises from the early to the middle to the late
//!   third of the steps (≥ [`CREEP_MIN_STEPS`] steps), see [`MemoryCreep`];
//! - low GPU utilization (< [`LOW_GPU_UTIL_PCT`] %) that no phase outside compute explains.
//!
//! Primary diagnosis: the most severe finding, then the largest share, then rule order; with no
//! warning or critical finding it is `COMPUTE_BOUND` if found, else `BALANCED`; with fewer than
//! [`MIN_STEPS`] steps, `INSUFFICIENT_DATA`, or `NOT_TRAINING` when no step and no training
//! marker (DataLoader iteration, optimizer step, backward pass) was seen at all. The data-quality confidence is copied onto every
//! finding and the primary "why" says when it was lowered.
use crate::engine::Boundary;
use crate::phase::Phase;
use crate::summary::{Confidence, DiagnosisKind, Finding, Severity, Summary, WorkerState};
use crate::units::{bytes_bin, bytes_dec, ms, pct};

mod input;
mod knobs;
use input::input_next;
pub use input::{READ_SHARE, pipeline_line, reading_said};

/// Steps needed for any step-based finding.
pub const MIN_STEPS: u32 = 5;
/// Steps needed for a critical finding.
pub const CRITICAL_MIN_STEPS: u32 = 20;
/// Steps needed for the memory-creep rule.
pub const CREEP_MIN_STEPS: u32 = 50;
/// Share of step time from which a non-compute phase is a warning.
pub const WARNING_SHARE: f64 = 0.10;
/// Share of step time from which a non-compute phase is critical.
pub const CRITICAL_SHARE: f64 = 0.20;
/// Compute share from which a run is compute-bound.
pub const COMPUTE_SHARE: f64 = 0.90;
/// The `gpu_wait` share from which COMPUTE-BOUND's Why names the line the host waits at.
pub const GPU_WAIT_LINE_SHARE: f64 = 0.25;
/// Mean GPU utilization (%) below which it is low; critical below [`LOW_GPU_UTIL_CRITICAL_PCT`].
pub const LOW_GPU_UTIL_PCT: f64 = 50.0;
pub const LOW_GPU_UTIL_CRITICAL_PCT: f64 = 20.0;
/// Memory growth that counts as creep: at least this fraction of the early value...
pub const CREEP_MIN_FRACTION: f64 = 0.05;
/// ... and at least this many bytes.
pub const CREEP_MIN_BYTES: u64 = 64 << 20;
/// Growth from which creep is critical (fraction of the early value).
pub const CREEP_CRITICAL_FRACTION: f64 = 0.25;

/// The phases that count as compute.
pub const COMPUTE_PHASES: [Phase; 4] = [
    Phase::Forward,
    Phase::Backward,
    Phase::Optimizer,
    Phase::GpuWait,
];
/// The phases whose share makes a bottleneck finding.
pub const BOTTLENECK_PHASES: [Phase; 3] = [Phase::InputWait, Phase::H2d, Phase::Residual];

/// What a rule concluded.
#[derive(Clone, Debug, PartialEq)]
pub enum Check {
    /// Nothing to report.
    Ok,
    Finding(Finding),
    /// The rule could not decide; the reason.
    NotEnoughData(String),
}

/// One verdict rule.
pub trait Rule {
    fn name(&self) -> &'static str;
    fn check(&self, s: &Summary) -> Check;
}

/// The rules, in tie-breaking order.
pub fn rules() -> Vec<Box<dyn Rule>> {
    vec![
        Box::new(PhaseShare {
            phase: Phase::InputWait,
            kind: DiagnosisKind::InputBound,
        }),
        Box::new(PhaseShare {
            phase: Phase::H2d,
            kind: DiagnosisKind::H2dBound,
        }),
        Box::new(PhaseShare {
            phase: Phase::Residual,
            kind: DiagnosisKind::ResidualHeavy,
        }),
        Box::new(MemoryCreep),
        Box::new(LowGpuUtilization),
        Box::new(ComputeBound),
    ]
}

/// Runs every rule; returns the primary diagnosis and all findings, most severe first.
pub fn diagnose(s: &Summary) -> (Finding, Vec<Finding>) {
    let confidence = s.data_quality.confidence;
    let mut findings: Vec<Finding> = rules()
        .iter()
        .filter_map(|r| match r.check(s) {
            Check::Finding(f) => Some(Finding { confidence, ..f }),
            Check::Ok | Check::NotEnoughData(_) => None,
        })
        .collect();
    // Stable sort: rule order breaks the remaining ties.
    findings.sort_by(|a, b| {
        b.severity
            .cmp(&a.severity)
            .then_with(|| b.share.unwrap_or(-1.0).total_cmp(&a.share.unwrap_or(-1.0)))
    });
    let mut primary = match findings.first() {
        _ if s.steps.count == 0 && s.steps.markers.is_some_and(|m| !m.any()) => not_training(s),
        _ if s.steps.count < MIN_STEPS => insufficient(s),
        Some(f) if f.severity > Severity::Info || f.kind == DiagnosisKind::ComputeBound => {
            f.clone()
        }
        _ => balanced(s),
    };
    // Evaluation is no training step: its finding never is the verdict.
    findings.extend(evaluation_finding(s).map(|f| Finding { confidence, ..f }));
    primary.confidence = confidence;
    if confidence < Confidence::High && !s.data_quality.notes.is_empty() {
        if !primary.why.ends_with('.') {
            primary.why.push('.');
        }
        primary.why.push_str(&format!(
            " Confidence {}: {}.",
            confidence.as_str(),
            s.data_quality.notes.join("; ")
        ));
    }
    (primary, findings)
}

/// Evaluation at or above this share of the run's wall time is a finding (warning).
pub const EVALUATION_SHARE: f64 = 0.20;

/// `EVALUATION_HEAVY`: evaluation segments take a large share of the run's wall time; names the
/// phase that fills them (its own DataLoader, mostly).
fn evaluation_finding(s: &Summary) -> Option<Finding> {
    let e = &s.evaluation;
    let share = e.share_of_wall.filter(|&sh| sh >= EVALUATION_SHARE)?;
    let phases = e.phases.as_ref()?;
    let input = phases.input_wait.share;
    let (big, big_share) = phases
        .iter()
        .map(|(p, v)| (p, v.share))
        .max_by(|a, b| a.1.total_cmp(&b.1))?;
    let mut why = format!(
        "evaluation is {} of wall time ({} segments, {} batches, {:.1} s)",
        pct(share),
        e.segments,
        e.batches,
        e.wall_s
    );
    let next = if input >= CRITICAL_SHARE {
        why.push_str(&format!(
            "; its DataLoader is input-bound: input_wait is {} of it",
            pct(input)
        ));
        "give the evaluation DataLoader workers (num_workers, persistent_workers) or cache its \
         data, or evaluate less often (eval_steps, val_check_interval) or on fewer batches"
            .to_owned()
    } else {
        why.push_str(&format!("; {} is {} of it", big.name(), pct(big_share)));
        "evaluate less often (eval_steps, val_check_interval) or on fewer batches, or faster \
         (bf16 autocast, a larger evaluation batch)"
            .to_owned()
    };
    Some(Finding {
        share: Some(share),
        ..finding(DiagnosisKind::EvaluationHeavy, Severity::Warning, why, next)
    })
}

/// The primary diagnosis kind the step-share rules give for these phase shares of step time
/// (0–1, missing phases 0) over `steps` steps: the largest bottleneck phase at or above
/// [`WARNING_SHARE`], else compute-bound at [`COMPUTE_SHARE`], else balanced. It ignores the
/// rules that need more than shares (GPU utilization, memory creep). For tests that derive the
/// expected verdict from a workload's own measured truth, and the same logic the rules use.
pub fn kind_for_shares(shares: &[(Phase, f64)], steps: u32) -> DiagnosisKind {
    if steps < MIN_STEPS {
        return DiagnosisKind::InsufficientData;
    }
    let share = |p: Phase| {
        shares
            .iter()
            .filter(|(q, _)| *q == p)
            .map(|(_, s)| *s)
            .sum::<f64>()
    };
    let worst = BOTTLENECK_PHASES
        .iter()
        .map(|&p| (p, share(p)))
        .filter(|&(_, s)| s >= WARNING_SHARE)
        .max_by(|a, b| a.1.total_cmp(&b.1));
    match worst {
        Some((Phase::InputWait, _)) => DiagnosisKind::InputBound,
        Some((Phase::H2d, _)) => DiagnosisKind::H2dBound,
        Some(_) => DiagnosisKind::ResidualHeavy,
        None if COMPUTE_PHASES.iter().map(|&p| share(p)).sum::<f64>() >= COMPUTE_SHARE => {
            DiagnosisKind::ComputeBound
        }
        None => DiagnosisKind::Balanced,
    }
}

/// The value of `Summary::primary_diagnosis` before the rules ran.
pub(crate) fn placeholder() -> Finding {
    Finding {
        kind: DiagnosisKind::InsufficientData,
        severity: Severity::Info,
        why: String::new(),
        next: String::new(),
        phase: None,
        share: None,
        confidence: Confidence::High,
        culprit_rank: None,
    }
}

fn finding(kind: DiagnosisKind, severity: Severity, why: String, next: String) -> Finding {
    Finding {
        kind,
        severity,
        why,
        next,
        phase: None,
        share: None,
        confidence: Confidence::High,
        culprit_rank: None,
    }
}

/// `NOT_TRAINING`: the stream holds no training marker at all (the daemon watched with
/// torch's marker probes only, which such a process does not hit).
fn not_training(s: &Summary) -> Finding {
    let secs = s.run.duration_s.unwrap_or(0.0);
    let why = format!(
        "not training: no optimizer step, backward or DataLoader iteration in {secs:.0} s \
         ({} probe events)",
        s.data_quality.events_recorded
    );
    let next = "nothing to fix: traceml-daemon kept to torch's marker probes, which cost this \
                process nothing it can feel, and measures the steps once it trains (a notebook \
                calling fit, the next job stage); attach during training for a verdict"
        .to_owned();
    finding(DiagnosisKind::NotTraining, Severity::Info, why, next)
}

fn insufficient(s: &Summary) -> Finding {
    let n = s.steps.count;
    let why = match s.steps.boundary {
        None | Some(Boundary::None) => format!(
            "no step boundary was found ({} probe events, {} complete steps): no DataLoader \
             iteration, optimizer step or repeating sync pattern on one thread",
            s.data_quality.events_recorded, n
        ),
        Some(b) => format!(
            "only {n} complete steps were measured (boundary {}); at least {MIN_STEPS} are needed",
            crate::summary::boundary_name(b)
        ),
    };
    let mut next = String::from(
        "attach for longer: at least 5 complete steps for a verdict, 20 for a critical one, 50 for memory creep",
    );
    if !s.data_quality.probes_failed.is_empty() {
        next.push_str("; some probes did not attach (see data quality)");
    }
    if s.steps.boundary.is_none() || s.steps.boundary == Some(Boundary::None) {
        next = "check that the target is a Python training loop iterating a torch DataLoader or calling \
                optimizer.step(), and that the Python and CUDA probes attached (see data quality)"
            .to_owned();
    }
    finding(DiagnosisKind::InsufficientData, Severity::Info, why, next)
}

fn balanced(s: &Summary) -> Finding {
    let (big, big_share) = Phase::ALL
        .iter()
        .filter_map(|&p| s.phases[p].share.map(|sh| (p, sh)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap_or((Phase::Forward, 0.0));
    let (other, other_share) = BOTTLENECK_PHASES
        .iter()
        .filter_map(|&p| s.phases[p].share.map(|sh| (p, sh)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap_or((Phase::InputWait, 0.0));
    let why = format!(
        "no phase outside compute reaches {} of step time (largest: {} {}); compute is {} of a {} mean \
         step over {} steps",
        pct(WARNING_SHARE),
        other.name(),
        pct(other_share),
        pct(compute_share(s).unwrap_or(0.0)),
        ms(s.step_ms.mean),
        s.steps.count
    );
    let next = format!(
        "nothing dominates: the largest phase is {} ({}), make it faster; check each change with \
         `traceml-daemon compare`",
        big.name(),
        pct(big_share)
    );
    finding(DiagnosisKind::Balanced, Severity::Info, why, next)
}

fn compute_share(s: &Summary) -> Option<f64> {
    COMPUTE_PHASES.iter().map(|&p| s.phases[p].share).sum()
}

// ---------------------------------------------------------------------------------------------
// Rules.

/// `INPUT_BOUND`, `H2D_BOUND`, `RESIDUAL_HEAVY`: one non-compute phase takes too much step time.
pub struct PhaseShare {
    pub phase: Phase,
    pub kind: DiagnosisKind,
}

impl Rule for PhaseShare {
    fn name(&self) -> &'static str {
        self.kind.as_str()
    }

    fn check(&self, s: &Summary) -> Check {
        let n = s.steps.count;
        if n < MIN_STEPS {
            return Check::NotEnoughData(format!("{n} steps, {MIN_STEPS} needed"));
        }
        let Some(share) = s.phases[self.phase].share else {
            return Check::NotEnoughData("no step time".to_owned());
        };
        if share < WARNING_SHARE {
            return Check::Ok;
        }
        let severity = if share >= CRITICAL_SHARE && n >= CRITICAL_MIN_STEPS {
            Severity::Critical
        } else {
            Severity::Warning
        };
        let stats = &s.phases[self.phase];
        // The share is total phase time over total step time: the means say the same (the
        // median too, where it differs).
        let median = stats
            .median_ms
            .zip(stats.mean_ms)
            .filter(|&(med, mean)| (med - mean).abs() > 0.1 * mean.abs().max(0.01))
            .map(|(med, _)| format!("; median {}", ms(Some(med))))
            .unwrap_or_default();
        let mut why = format!(
            "{} is {} of step time (mean {} of a {} step{median}) over {n} steps",
            self.phase.name(),
            pct(share),
            ms(stats.mean_ms),
            ms(s.step_ms.mean),
        );
        if share >= CRITICAL_SHARE && n < CRITICAL_MIN_STEPS {
            why.push_str(&format!(" (critical needs ≥ {CRITICAL_MIN_STEPS} steps)"));
        }
        let next = match self.kind {
            DiagnosisKind::InputBound => input_next(s, &mut why),
            DiagnosisKind::H2dBound => h2d_next(s, &mut why),
            _ => residual_next(s, &mut why),
        };
        Check::Finding(Finding {
            phase: Some(self.phase),
            share: Some(share),
            ..finding(self.kind, severity, why, next)
        })
    }
}

fn h2d_next(s: &Summary, why: &mut String) -> String {
    let c = &s.cuda;
    if let (Some(b), Some(n)) = (c.h2d_bytes_per_step, c.h2d_copies_per_step) {
        why.push_str(&format!("; {} per step in {n:.0} copies", bytes_dec(b)));
        if let Some(per) = c.h2d_bytes_per_copy {
            why.push_str(&format!(" ({} each)", bytes_dec(per)));
        }
        if let Some(bw) = c.h2d_gb_per_s {
            why.push_str(&format!(", {bw:.1} GB/s effective"));
        }
    }
    let mut next = String::from(
        "if the source tensors are pageable, pin_memory=True in the DataLoader and \
         .to(device, non_blocking=True) let the copies run at full speed and overlap compute",
    );
    if c.h2d_copies_per_step.is_some_and(|n| n >= 16.0)
        && c.h2d_bytes_per_copy.is_some_and(|b| b < 1e6)
    {
        next.push_str("; many small copies per step: batch them into one tensor before copying");
    }
    if c.h2d_gb_per_s.is_some_and(|bw| bw < 5.0) {
        next.push_str("; the effective rate is far below PCIe (~25 GB/s for Gen4 x16)");
    }
    next.push_str("; send compact dtypes (uint8 images, normalize on the GPU)");
    next
}

fn residual_next(s: &Summary, why: &mut String) -> String {
    why.push_str(
        ": the loop's own time outside data loading, copies, forward, backward, \
         optimizer and GPU waits",
    );
    let code = code_in(s, Phase::Residual);
    if let Some(code) = &code {
        why.push_str(&format!("; stack samples: {code}"));
    }
    let mut next = String::from(
        "look at what the loop does between those phases: per-step logging and metrics, checkpointing, \
         CPU-side bookkeeping or sleeps; do it every N steps or on another thread",
    );
    if let Some(top) = s.phases[Phase::Residual].top_functions.first() {
        next = format!(
            "start with {}:{} ({:.0}% of the residual's samples); {next}",
            crate::profile::short_file(&top.file),
            short_function(&top.function),
            top.share * 100.0
        );
    }
    if s.cuda.syncs_per_step.is_some_and(|x| x >= 5.0) {
        next.push_str(&format!(
            " ({:.0} blocking syncs per step: avoid .item()/.cpu() in the loop)",
            s.cuda.syncs_per_step.unwrap_or(0.0)
        ));
    }
    next
}

/// "41% transformers/trainer.py:Trainer._maybe_log_save_evaluate, 22% …": the functions that
/// hold the phase's stack samples (at most three), or `None` without samples.
pub fn code_in(s: &Summary, phase: Phase) -> Option<String> {
    let top = &s.phases[phase].top_functions;
    if top.is_empty() {
        return None;
    }
    Some(
        top.iter()
            .take(3)
            .map(|t| {
                format!(
                    "{:.0}% {}:{}",
                    t.share * 100.0,
                    crate::profile::short_file(&t.file),
                    short_function(&t.function)
                )
            })
            .collect::<Vec<_>>()
            .join(", "),
    )
}

/// The GPU waits' counts a step, where counted: "3.0 syncs/step", "1.0 D2H copies/step".
pub fn wait_counts(s: &Summary) -> Vec<String> {
    let per_step =
        |n: Option<f64>, what: &str| n.filter(|&n| n > 0.0).map(|n| format!("{n:.1} {what}"));
    [
        per_step(s.cuda.syncs_per_step, "syncs/step"),
        per_step(s.cuda.d2h_copies_per_step, "D2H copies/step"),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Where the host waited for the device, by line (`phases.gpu_wait.wait_sites`): "92% at
/// train.py:88 in main (sync: cudaStreamSynchronize), 8% at train.py:91 in main (D2H copy:
/// cudaMemcpy)", with the syncs and D2H copies per step when counted.
pub fn waits_in(s: &Summary) -> Option<String> {
    let sites = &s.phases.gpu_wait.wait_sites;
    if sites.is_empty() {
        return None;
    }
    let at = sites
        .iter()
        .take(3)
        .map(|w| {
            let line = w.line.map_or(String::new(), |l| format!(":{l}"));
            format!(
                "{:.0}% at {}{line} in {} ({}: {})",
                w.share * 100.0,
                crate::profile::short_file(&w.file),
                short_function(&w.function),
                w.kind.said(),
                w.api
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    let counts = wait_counts(s);
    Some(if counts.is_empty() {
        at
    } else {
        format!("{} · {at}", counts.join(", "))
    })
}

/// A qualified name cut to its last 48 characters (`<locals>` chains of decorators and closures
/// run long), marked with `…` when cut.
fn short_function(f: &str) -> String {
    const MAX: usize = 48;
    let n = f.chars().count();
    if n <= MAX {
        return f.to_owned();
    }
    let tail: String = f.chars().skip(n - (MAX - 1)).collect();
    format!("…{tail}")
}

fn opt_pct(p: Option<f64>) -> String {
    p.map(|p| format!("{p:.0}%"))
        .unwrap_or_else(|| "unknown".to_owned())
}

/// `COMPUTE_BOUND` (info): the step is the model's own work.
pub struct ComputeBound;

impl Rule for ComputeBound {
    fn name(&self) -> &'static str {
        "COMPUTE_BOUND"
    }

    fn check(&self, s: &Summary) -> Check {
        if s.steps.count < MIN_STEPS {
            return Check::NotEnoughData(format!("{} steps, {MIN_STEPS} needed", s.steps.count));
        }
        let Some(compute) = compute_share(s) else {
            return Check::NotEnoughData("no step time".to_owned());
        };
        let other_max = BOTTLENECK_PHASES
            .iter()
            .filter_map(|&p| s.phases[p].share)
            .fold(0.0, f64::max);
        if compute < COMPUTE_SHARE || other_max >= WARNING_SHARE {
            return Check::Ok;
        }
        let mut why = format!(
            "forward+backward+optimizer+gpu_wait are {} of step time (gpu_wait {}), nothing else reaches {} \
             ({} steps)",
            pct(compute),
            pct(s.phases.gpu_wait.share.unwrap_or(0.0)),
            pct(WARNING_SHARE),
            s.steps.count
        );
        if let Some(w) = s.phases.gpu_wait.wait_sites.first()
            && s.phases.gpu_wait.share.unwrap_or(0.0) >= GPU_WAIT_LINE_SHARE
        {
            why.push_str(&format!(
                "; the host waits for the GPU at {}{} ({}, {:.0}% of the wait)",
                crate::profile::short_file(&w.file),
                w.line.map_or(String::new(), |l| format!(":{l}")),
                w.kind.said(),
                w.share * 100.0
            ));
        }
        if let Some(u) = s.gpu.as_ref().and_then(|g| g.util_pct_mean) {
            why.push_str(&format!("; GPU {u:.0}% busy"));
        }
        let mut next = String::from(
            "the model's own work is the limit: do it faster (bf16 autocast, torch.compile, fused \
             optimizer, fused attention kernels)",
        );
        if let (Some(used), Some(total)) = (
            s.gpu.as_ref().and_then(|g| g.process_mem_bytes_max),
            s.memory.gpu_mem_total_bytes,
        ) && total > 0
            && (used as f64) < 0.6 * total as f64
        {
            next.push_str(&format!(
                "; GPU memory peak {} of {} leaves room for a larger batch",
                bytes_bin(used),
                bytes_bin(total)
            ));
        }
        Check::Finding(Finding {
            share: Some(compute),
            ..finding(DiagnosisKind::ComputeBound, Severity::Info, why, next)
        })
    }
}

/// `MEMORY_CREEP`: host RSS or the target's GPU memory keeps rising over the run.
///
/// Rising means: median of the early third < middle < late, each increment ≥ 20 % of the total
/// rise, and the total rise ≥ [`CREEP_MIN_FRACTION`] of the early value and ≥ [`CREEP_MIN_BYTES`].
/// Critical when the rise is ≥ [`CREEP_CRITICAL_FRACTION`] of the early value or GPU memory ends
/// above 90 % of the GPU's capacity.
pub struct MemoryCreep;

/// `Some(rise)` when `[early, middle, late]` keeps rising enough.
pub fn creep(thirds: [u64; 3]) -> Option<u64> {
    let [a, b, c] = thirds;
    if !(a < b && b < c) {
        return None;
    }
    let rise = c - a;
    let steady = (b - a) as f64 >= 0.2 * rise as f64 && (c - b) as f64 >= 0.2 * rise as f64;
    (steady && rise >= CREEP_MIN_BYTES && rise as f64 >= CREEP_MIN_FRACTION * a as f64)
        .then_some(rise)
}

impl Rule for MemoryCreep {
    fn name(&self) -> &'static str {
        "MEMORY_CREEP"
    }

    fn check(&self, s: &Summary) -> Check {
        let n = s.steps.count;
        if n < CREEP_MIN_STEPS {
            return Check::NotEnoughData(format!("{n} steps, {CREEP_MIN_STEPS} needed"));
        }
        let m = &s.memory;
        if m.rss_bytes_by_third.is_none() && m.gpu_process_mem_bytes_by_third.is_none() {
            return Check::NotEnoughData("memory was not sampled".to_owned());
        }
        let mut parts = Vec::new();
        let mut critical = false;
        for (what, thirds) in [
            (
                "GPU memory of the process",
                m.gpu_process_mem_bytes_by_third,
            ),
            ("host RSS", m.rss_bytes_by_third),
        ] {
            let Some(t) = thirds else { continue };
            if let Some(rise) = creep(t) {
                parts.push(format!(
                    "{what} rose {} → {} → {} over the early, middle and late thirds of {n} steps (+{})",
                    bytes_bin(t[0]),
                    bytes_bin(t[1]),
                    bytes_bin(t[2]),
                    bytes_bin(rise)
                ));
                critical |= rise as f64 >= CREEP_CRITICAL_FRACTION * t[0] as f64;
                if what.starts_with("GPU") {
                    critical |= m
                        .gpu_mem_total_bytes
                        .is_some_and(|tot| t[2] as f64 >= 0.9 * tot as f64);
                }
            }
        }
        if parts.is_empty() {
            return Check::Ok;
        }
        let why = parts.join("; ");
        let next =
            "something keeps references across steps: accumulate losses with loss.item() or \
                    loss.detach(), not the loss tensor; bound caches and lists that grow per step; \
                    torch.cuda.memory_snapshot() shows who holds GPU memory"
                .to_owned();
        let severity = if critical {
            Severity::Critical
        } else {
            Severity::Warning
        };
        Check::Finding(finding(DiagnosisKind::MemoryCreep, severity, why, next))
    }
}

/// `LOW_GPU_UTILIZATION_UNEXPLAINED`: the GPU idles but no input, copy or residual phase is big.
pub struct LowGpuUtilization;

impl Rule for LowGpuUtilization {
    fn name(&self) -> &'static str {
        "LOW_GPU_UTILIZATION_UNEXPLAINED"
    }

    fn check(&self, s: &Summary) -> Check {
        let n = s.steps.count;
        if n < MIN_STEPS {
            return Check::NotEnoughData(format!("{n} steps, {MIN_STEPS} needed"));
        }
        let Some(util) = s.gpu.as_ref().and_then(|g| g.util_pct_mean) else {
            return Check::NotEnoughData("GPU metrics unavailable".to_owned());
        };
        if util >= LOW_GPU_UTIL_PCT {
            return Check::Ok;
        }
        if BOTTLENECK_PHASES
            .iter()
            .any(|&p| s.phases[p].share.is_some_and(|sh| sh >= WARNING_SHARE))
        {
            // Explained by a phase finding.
            return Check::Ok;
        }
        let mut why = format!(
            "the GPU was {util:.0}% busy on average, yet input, copies and residual each stay under {} of \
             step time; compute takes {} of a {} mean step",
            pct(WARNING_SHARE),
            pct(compute_share(s).unwrap_or(0.0)),
            ms(s.step_ms.mean)
        );
        let mut next = String::new();
        if let (Some(l), Some(step)) = (s.cuda.launches_per_step, s.step_ms.median)
            && l > 0.0
        {
            let us = step * 1000.0 / l;
            why.push_str(&format!(
                "; {l:.0} kernel launches per step, one per {us:.0} µs of step"
            ));
            if us < 50.0 {
                next.push_str(
                    "the host cannot launch kernels fast enough: fuse them (torch.compile) or replay the \
                     step as a CUDA graph (torch.compile(mode=\"reduce-overhead\")); ",
                );
            }
        }
        next.push_str(
            "the host side of the model is the limit (small kernels, CPU ops inside forward/backward): \
             raise the batch size so each kernel does more, look for CPU tensors or .item() in the model \
             with torch.profiler",
        );
        let severity = if util < LOW_GPU_UTIL_CRITICAL_PCT && n >= CRITICAL_MIN_STEPS {
            Severity::Critical
        } else {
            Severity::Warning
        };
        Check::Finding(finding(
            DiagnosisKind::LowGpuUtilizationUnexplained,
            severity,
            why,
            next,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary::{GpuStats, Summary};
    use crate::testkit::{self, Scenario};

    /// A summary with the given step count and shares (forward takes the rest).
    fn with_shares(steps: u32, shares: &[(Phase, f64)]) -> Summary {
        let mut s = testkit::summary(&Scenario {
            steps: 60,
            ..Scenario::default()
        });
        s.steps.count = steps;
        for p in Phase::ALL {
            s.phases[p].share = Some(0.0);
        }
        let rest: f64 = 1.0 - shares.iter().map(|x| x.1).sum::<f64>();
        s.phases[Phase::Forward].share = Some(rest);
        for &(p, sh) in shares {
            s.phases[p].share = Some(sh);
        }
        s
    }

    /// Evaluation taking 56 % of wall time, 80 % of it waiting for its DataLoader: a finding
    /// naming that, beside a training verdict it does not change; under the threshold, none.
    #[test]
    fn evaluation_is_a_finding_beside_the_verdict() {
        use crate::summary::{EvalPhase, Evaluation, Phases};
        let mut s = with_shares(60, &[]);
        let (before, _) = diagnose(&s);
        s.evaluation = Evaluation {
            segments: 4,
            batches: 64,
            wall_s: 5.6,
            share_of_wall: Some(0.56),
            phases: Some(Phases::from_fn(|p| EvalPhase {
                total_s: 0.0,
                share: match p {
                    Phase::InputWait => 0.8,
                    Phase::Forward => 0.2,
                    _ => 0.0,
                },
            })),
        };
        let (primary, findings) = diagnose(&s);
        assert_eq!(primary.kind, before.kind, "the training verdict stays");
        let f = findings
            .iter()
            .find(|f| f.kind == DiagnosisKind::EvaluationHeavy)
            .expect("an evaluation finding");
        assert_eq!(f.severity, Severity::Warning);
        assert!(
            f.why
                .starts_with("evaluation is 56% of wall time (4 segments, 64 batches")
                && f.why.contains("its DataLoader is input-bound"),
            "{}",
            f.why
        );
        assert!(f.next.contains("num_workers"), "{}", f.next);
        s.evaluation.share_of_wall = Some(EVALUATION_SHARE - 0.01);
        let (_, findings) = diagnose(&s);
        assert!(
            findings
                .iter()
                .all(|f| f.kind != DiagnosisKind::EvaluationHeavy)
        );
    }

    #[test]
    fn kind_for_shares_agrees_with_the_rules() {
        let cases: Vec<(u32, Vec<(Phase, f64)>)> = vec![
            (100, vec![(Phase::InputWait, 0.6)]),
            (100, vec![(Phase::InputWait, 0.15), (Phase::Residual, 0.12)]),
            (100, vec![(Phase::H2d, 0.3), (Phase::Residual, 0.2)]),
            (100, vec![(Phase::Residual, 0.11)]),
            (100, vec![(Phase::Residual, 0.05)]),
            (100, vec![(Phase::Residual, 0.05), (Phase::InputWait, 0.08)]),
            (100, vec![(Phase::InputWait, 0.099)]),
            (3, vec![(Phase::InputWait, 0.6)]),
        ];
        for (steps, shares) in cases {
            let s = with_shares(steps, &shares);
            let all: Vec<(Phase, f64)> = Phase::ALL
                .iter()
                .map(|&p| (p, s.phases[p].share.unwrap_or(0.0)))
                .collect();
            assert_eq!(
                kind_for_shares(&all, steps),
                diagnose(&s).0.kind,
                "{steps} steps, {shares:?}"
            );
        }
    }

    fn run(rule: &dyn Rule, s: &Summary) -> Check {
        rule.check(s)
    }

    fn severity(c: &Check) -> Option<Severity> {
        match c {
            Check::Finding(f) => Some(f.severity),
            _ => None,
        }
    }

    #[test]
    fn phase_share_thresholds() {
        let rule = PhaseShare {
            phase: Phase::InputWait,
            kind: DiagnosisKind::InputBound,
        };
        let at = |share: f64, steps: u32| {
            severity(&run(
                &rule,
                &with_shares(steps, &[(Phase::InputWait, share)]),
            ))
        };
        assert_eq!(at(0.0999, 100), None);
        assert_eq!(at(0.10, 100), Some(Severity::Warning));
        assert_eq!(at(0.1999, 100), Some(Severity::Warning));
        assert_eq!(at(0.20, 100), Some(Severity::Critical));
        assert_eq!(at(0.20, 20), Some(Severity::Critical));
        // Critical needs 20 steps.
        assert_eq!(at(0.50, 19), Some(Severity::Warning));
        assert_eq!(at(0.50, 5), Some(Severity::Warning));
        assert!(matches!(
            run(&rule, &with_shares(4, &[(Phase::InputWait, 0.5)])),
            Check::NotEnoughData(_)
        ));
    }

    #[test]
    fn input_bound_uses_worker_state() {
        let s = testkit::summary(&testkit::input_bound());
        let Check::Finding(f) = (PhaseShare {
            phase: Phase::InputWait,
            kind: DiagnosisKind::InputBound,
        })
        .check(&s) else {
            panic!("no finding")
        };
        assert!(
            f.why.contains("4 DataLoader workers were 98% busy"),
            "{}",
            f.why
        );
        assert!(
            f.next
                .contains("more workers, DataLoader(num_workers=N) (16 cores"),
            "{}",
            f.next
        );
        let mut idle = s.clone();
        idle.workers.state = Some(WorkerState::Idle);
        idle.workers.cpu_pct_one_core_mean = Some(12.0);
        let Check::Finding(f) = (PhaseShare {
            phase: Phase::InputWait,
            kind: DiagnosisKind::InputBound,
        })
        .check(&idle) else {
            panic!("no finding")
        };
        assert!(f.why.contains("mostly idle (12%"), "{}", f.why);
        assert!(f.next.contains("storage"), "{}", f.next);
        let mut none = s.clone();
        none.workers.count = Some(0);
        let Check::Finding(f) = (PhaseShare {
            phase: Phase::InputWait,
            kind: DiagnosisKind::InputBound,
        })
        .check(&none) else {
            panic!("no finding")
        };
        assert!(f.next.contains("num_workers"), "{}", f.next);
    }

    #[test]
    fn h2d_states_bytes_and_pinning() {
        let s = with_shares(100, &[(Phase::H2d, 0.3)]);
        let Check::Finding(f) = (PhaseShare {
            phase: Phase::H2d,
            kind: DiagnosisKind::H2dBound,
        })
        .check(&s) else {
            panic!("no finding")
        };
        assert_eq!(f.kind, DiagnosisKind::H2dBound);
        assert!(
            f.why.contains("12.6 MB per step in 2 copies (6.3 MB each)"),
            "{}",
            f.why
        );
        assert!(
            f.next
                .starts_with("if the source tensors are pageable, pin_memory=True"),
            "{}",
            f.next
        );
    }

    #[test]
    fn compute_bound_thresholds() {
        let fwd_gpu = |compute: f64, other: f64| {
            let mut s = with_shares(100, &[(Phase::Residual, other)]);
            s.phases.forward.share = Some(compute / 2.0);
            s.phases.gpu_wait.share = Some(compute / 2.0);
            s.phases.input_wait.share = Some((1.0 - compute - other).max(0.0));
            ComputeBound.check(&s)
        };
        assert_eq!(severity(&fwd_gpu(0.90, 0.05)), Some(Severity::Info));
        assert_eq!(severity(&fwd_gpu(0.8999, 0.05)), None);
        assert_eq!(severity(&fwd_gpu(0.90, 0.10)), None);
        assert_eq!(severity(&fwd_gpu(0.95, 0.0999)), Some(Severity::Info));
    }

    #[test]
    fn creep_thresholds() {
        const G: u64 = 1 << 30;
        assert_eq!(creep([G, G + G / 20, G + G / 10]), Some(G / 10));
        // Not rising at the end: warm-up then plateau.
        assert_eq!(creep([G, 2 * G, 2 * G]), None);
        // A jump then almost flat: middle-to-late rise is under 20 % of the total.
        assert_eq!(creep([G, 2 * G, 2 * G + G / 10]), None);
        // Under 5 %.
        assert_eq!(creep([20 * G, 20 * G + G / 4, 20 * G + G / 2]), None);
        // Under 64 MiB.
        assert_eq!(creep([G / 8, G / 8 + (16 << 20), G / 8 + (32 << 20)]), None);
        assert_eq!(creep([0, 0, 0]), None);
    }

    #[test]
    fn memory_creep_rule() {
        let s = testkit::summary(&Scenario {
            rss_growth: 8 << 20,
            ..Scenario::default()
        });
        let c = MemoryCreep.check(&s);
        let Check::Finding(f) = &c else {
            panic!("{c:?}")
        };
        assert_eq!(f.severity, Severity::Critical, "{}", f.why);
        assert!(f.why.contains("host RSS rose"), "{}", f.why);
        assert!(
            f.why.contains("GPU memory of the process rose"),
            "{}",
            f.why
        );
        let mut short = s.clone();
        short.steps.count = 49;
        assert!(matches!(MemoryCreep.check(&short), Check::NotEnoughData(_)));
        short.steps.count = 50;
        assert!(matches!(MemoryCreep.check(&short), Check::Finding(_)));
        let flat = testkit::summary(&Scenario::default());
        assert_eq!(MemoryCreep.check(&flat), Check::Ok);
        let mut warn = s.clone();
        warn.memory.gpu_process_mem_bytes_by_third = None;
        warn.memory.rss_bytes_by_third =
            Some([5 << 30, (5 << 30) + (200 << 20), (5 << 30) + (400 << 20)]);
        assert_eq!(severity(&MemoryCreep.check(&warn)), Some(Severity::Warning));
    }

    #[test]
    fn low_gpu_util_thresholds() {
        let mut s = with_shares(100, &[(Phase::InputWait, 0.05)]);
        let set = |s: &mut Summary, u: f64| {
            s.gpu = Some(GpuStats {
                util_pct_mean: Some(u),
                ..s.gpu.clone().unwrap_or_default()
            })
        };
        set(&mut s, 50.0);
        assert_eq!(severity(&LowGpuUtilization.check(&s)), None);
        set(&mut s, 49.9);
        assert_eq!(
            severity(&LowGpuUtilization.check(&s)),
            Some(Severity::Warning)
        );
        set(&mut s, 19.9);
        assert_eq!(
            severity(&LowGpuUtilization.check(&s)),
            Some(Severity::Critical)
        );
        // Explained by input.
        s.phases.input_wait.share = Some(0.10);
        assert_eq!(LowGpuUtilization.check(&s), Check::Ok);
        s.gpu = None;
        assert!(matches!(
            LowGpuUtilization.check(&s),
            Check::NotEnoughData(_)
        ));
    }

    #[test]
    fn primary_selection() {
        let k = |s: &Summary| diagnose(s).0.kind;
        assert_eq!(
            k(&testkit::summary(&testkit::input_bound())),
            DiagnosisKind::InputBound
        );
        assert_eq!(
            k(&testkit::summary(&testkit::compute_bound())),
            DiagnosisKind::ComputeBound
        );
        assert_eq!(
            k(&testkit::summary(&testkit::balanced())),
            DiagnosisKind::Balanced
        );
        assert_eq!(
            k(&testkit::summary(&Scenario {
                steps: 4,
                ..Scenario::default()
            })),
            DiagnosisKind::InsufficientData
        );
        // Both critical: the larger share wins.
        let s = with_shares(100, &[(Phase::InputWait, 0.25), (Phase::Residual, 0.30)]);
        let (p, all) = diagnose(&s);
        assert_eq!(p.kind, DiagnosisKind::ResidualHeavy);
        assert_eq!(all.len(), 2);
        // Critical beats a larger warning.
        let s = with_shares(19, &[(Phase::InputWait, 0.45)]);
        let mut s2 = s.clone();
        s2.steps.count = 100;
        s2.phases.h2d.share = Some(0.21);
        s2.phases.input_wait.share = Some(0.19);
        assert_eq!(diagnose(&s2).0.kind, DiagnosisKind::H2dBound);
        assert_eq!(diagnose(&s).0.severity, Severity::Warning);
    }
}
