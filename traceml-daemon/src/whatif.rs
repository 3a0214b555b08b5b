//! What fixing it buys: the step time if one phase fell to its floor, for the verdict's cause and
//! the next phases worth naming, each a bound with its assumption stated. Pure: reads the
//! summary's per-phase means (exclusive times that sum to the step), writes [`WhatIf`]s.
//!
//! Floors, by phase (the mean step minus what falls):
//! - `input_wait` → measured where the run has the answer: when at least [`READY_MIN_STEPS`]
//!   and [`READY_MIN_SHARE`] of the kept steps found their batch ready (an input wait at most
//!   [`READY_WAIT_SHARE`] of the mean wait: workers delivering in bursts), the median of those
//!   steps is the step (compute after a long wait can run colder than compute back to back: a
//!   floor taken from the waiting steps' compute would be too high). Else the DataLoader's own work on the training thread: its share of the phase's
//!   stack samples in `torch/utils/data` (collate), at most the phase's on-CPU time, plus the
//!   hand-over (`workers.profile.ipc`: reading and unpickling the workers' batches), which stays
//!   when the batch is ready; without samples → 0, an upper bound. Where the hand-over limits the
//!   pipeline (`PipelineBound::Ipc`) the what-if is the hand-over's: its work done in the k
//!   workers, the step less it but no shorter than its k-th part.
//! - `h2d` → 0: the copies overlapped with compute (pinned memory, `non_blocking=True`).
//! - `gpu_wait` → the device's own time: with no blocking sync the host queues ahead, but the
//!   step cannot be shorter than the GPU's busy time (its utilisation × the step) where NVML
//!   says it; without GPU metrics the wait may be the device's own work: no what-if.
//! - `residual` → 0: the loop's own work between the phases (logging, metrics, a checkpoint)
//!   moved off the step.
//! - `forward`, `backward`, `optimizer` → their time on a CPU: only where the thread states show
//!   the phase mostly blocked with no device work in it (then its blocked time is waiting, not
//!   compute); compute itself has no floor the daemon can know.
//!
//! A straggler's what-if (the job's step at the median rank's pace) is the job's: `ranks`.
use crate::phase::Phase;
use crate::summary::{Summary, WhatIf};

/// Phases below this share of the step are not worth a what-if line.
pub const MIN_SHARE: f64 = 0.05;
/// What-ifs on the card and in the summary: the cause and the next two.
pub const MAX_WHAT_IFS: usize = 3;
/// A compute phase gets a what-if when at least this share of it is blocked.
pub const BLOCKED_SHARE: f64 = 0.5;
/// Gains below this throughput factor are not worth a line (a 10 % gain).
pub const MIN_FACTOR: f64 = 1.1;
/// A step found its batch ready when its input wait was at most this share of the run's mean
/// input wait per step.
pub const READY_WAIT_SHARE: f64 = 0.1;
/// Fewest kept steps, and least share of them, that found their batch ready for the input
/// what-if to be measured on them rather than modelled.
pub const READY_MIN_STEPS: usize = 8;
pub const READY_MIN_SHARE: f64 = 0.1;

/// The what-ifs of `s`: the cause's first, then the largest gains.
pub fn what_if(s: &Summary) -> Vec<WhatIf> {
    let Some(step) = s.step_ms.mean.filter(|&m| m > 0.0) else {
        return Vec::new();
    };
    let mut out: Vec<WhatIf> = Phase::ALL
        .into_iter()
        .filter(|&p| s.phases[p].share.unwrap_or(0.0) >= MIN_SHARE)
        .filter_map(|p| floor(s, p, step))
        .filter(|w| w.throughput_factor >= MIN_FACTOR)
        .collect();
    let cause = s.primary_diagnosis.phase;
    out.sort_by(|a, b| {
        (Some(b.phase) == cause)
            .cmp(&(Some(a.phase) == cause))
            .then(a.step_ms_if.total_cmp(&b.step_ms_if))
    });
    out.truncate(MAX_WHAT_IFS);
    out
}

/// The what-if of phase `p` in a step of `step` ms (mean), if it has a floor.
fn floor(s: &Summary, p: Phase, step: f64) -> Option<WhatIf> {
    let st = &s.phases[p];
    let mean = st.mean_ms.filter(|&m| m > 0.0)?;
    // An input wait bound by the hand-over moves that work to the workers.
    let handover = if p == Phase::InputWait {
        handover_bound(s)
    } else {
        None
    };
    if p == Phase::InputWait
        && handover.is_none()
        && let Some(w) = ready_steps(s, step, mean)
    {
        return Some(w);
    }
    let (to, left, assumption) = match p {
        Phase::InputWait => input_floor(s, st, step, mean, handover),
        Phase::H2d => (
            "0".to_owned(),
            0.0,
            "an upper bound: the copies overlapped with compute, from pinned memory with \
             non_blocking=True"
                .to_owned(),
        ),
        Phase::GpuWait => gpu_floor(s, step, mean)?,
        Phase::Residual => (
            "0".to_owned(),
            0.0,
            "an upper bound: the loop's own work between phases moved off the step".to_owned(),
        ),
        Phase::Forward | Phase::Backward | Phase::Optimizer => compute_floor(st, mean)?,
        // A single process's collective wait has no floor of its own: the straggler's
        // what-if is the job's (`ranks`).
        Phase::CollectiveWait => return None,
    };
    let step_if = (step - mean + left).max(step * 1e-3);
    let what = if handover.is_some() {
        "input_wait's hand-over".to_owned()
    } else {
        p.name().to_owned()
    };
    Some(WhatIf {
        phase: p,
        change: format!("{what} → {to}"),
        step_ms: step,
        step_ms_if: step_if,
        throughput_factor: step / step_if,
        assumption,
        measured: None,
    })
}

/// The input what-if measured on the run's own steps that found their batch ready (see the
/// module's doc), `None` where too few did.
fn ready_steps(s: &Summary, step: f64, mean: f64) -> Option<WhatIf> {
    let ss = &s.step_samples;
    let waits = &ss.phase_ms[Phase::InputWait];
    let limit = mean * READY_WAIT_SHARE;
    // The steady steps: the first ones ran under the learning probe set (`learning_excluded`),
    // which costs a Python-heavy step more than the probes that stay.
    let skip = (s.steps.learning_excluded as usize).div_ceil(ss.stride.max(1) as usize);
    let ready: Vec<f64> = ss
        .step_ms
        .iter()
        .zip(waits)
        .skip(skip)
        .filter(|&(_, &w)| w <= limit)
        .map(|(&t, _)| t)
        .collect();
    let of = ss.step_ms.len().min(waits.len()).saturating_sub(skip);
    let need = READY_MIN_STEPS.max((of as f64 * READY_MIN_SHARE).ceil() as usize);
    if ready.len() < need {
        return None;
    }
    let step_if = crate::stats::median(&ready)?.max(step * 1e-3);
    let sampled = if ss.stride > 1 { " sampled" } else { "" };
    Some(WhatIf {
        phase: Phase::InputWait,
        change: "input_wait → a ready batch".to_owned(),
        step_ms: step,
        step_ms_if: step_if,
        throughput_factor: step / step_if,
        assumption: format!(
            "measured: the median of the {} of {of}{sampled} steady steps whose batch was \
             ready, input wait ≤ {}",
            ready.len(),
            crate::units::ms(Some(limit))
        ),
        measured: Some(crate::summary::MeasuredSteps {
            steps: ready.len() as u64,
            of: of as u64,
            input_wait_max_ms: limit,
        }),
    })
}

/// A floor: what the phase falls to (in words), the ms a step left of it, the assumption.
type Floor = (String, f64, String);

/// Input wait's floor: the hand-over moved to the `k` workers (`handover`: its ms a step and
/// k), else the loader's own work on this thread, else 0.
fn input_floor(
    s: &Summary,
    st: &crate::summary::PhaseStats,
    step: f64,
    mean: f64,
    handover: Option<(f64, u32)>,
) -> Floor {
    if let Some((h, k)) = handover {
        // The hand-over's work goes to the k workers, in parallel: the step loses it but
        // cannot be shorter than one worker's share of it.
        let without = step - h;
        let step_if = without.max(h / f64::from(k));
        return (
            format!("the {}", plural_workers(k)),
            (step_if - (step - mean)).clamp(0.0, mean),
            format!(
                "an upper bound: the hand-over's {} a step on this thread (unpickling, \
                 rebuilding) done in the {} and what arrives cheap to take over; the step \
                 no shorter than their share of it, {} each",
                crate::units::ms(Some(h)),
                plural_workers(k),
                crate::units::ms(Some(h / f64::from(k)))
            ),
        );
    }
    match loader_floor(s, st, mean) {
        Some((floor, share)) => (
            format!("the loader's own {}", crate::units::ms(Some(floor))),
            floor,
            format!(
                "the next batch ready when the loop asks, loading overlapped with compute; \
                 the DataLoader's own work on this thread stays (collate and hand-over: \
                 {:.0} % of its samples)",
                share * 100.0
            ),
        ),
        None => (
            "0".to_owned(),
            0.0,
            "an upper bound: the next batch ready when the loop asks, loading fully \
             overlapped with compute"
                .to_owned(),
        ),
    }
}

/// gpu_wait's floor: the device's busy time a step stays, what the host waited beyond it goes.
/// `None` without the device's busy time (the wait may be the device's own work).
fn gpu_floor(s: &Summary, step: f64, mean: f64) -> Option<Floor> {
    let util = s.gpu.as_ref().and_then(|g| g.util_pct_mean)?;
    let busy = step * (util / 100.0).clamp(0.0, 1.0);
    let without = step - mean;
    let left = (busy - without).clamp(0.0, mean);
    Some((
        "GPU busy time".to_owned(),
        left,
        format!(
            "no blocking sync: the host queues work ahead; the GPU's busy time ({util:.0} % of \
             the step) stays"
        ),
    ))
}

/// A host compute phase mostly blocked (no device work in it) falls to its on-CPU time.
fn compute_floor(st: &crate::summary::PhaseStats, mean: f64) -> Option<Floor> {
    let blocked = st.blocked_ms?;
    let device_work = st.launches_per_step.is_some_and(|l| l >= 1.0);
    if device_work || blocked / mean < BLOCKED_SHARE {
        return None;
    }
    let cpu = (mean - blocked).max(0.0);
    let wait = st
        .blocked_in
        .first()
        .map(|f| format!(", in {},", f.function))
        .unwrap_or_default();
    Some((
        format!("its on-CPU {}", crate::units::ms(Some(cpu))),
        cpu,
        format!("its blocked time{wait} is waiting, not compute, and goes"),
    ))
}

/// Where DataLoader code runs on the training thread (collate, fetch, hand-over): what stays
/// when the data is ready.
const LOADER_FILES: &str = "torch/utils/data";

/// The hand-over's share of the input wait below which it is not part of its floor.
const HANDOVER_SHARE: f64 = 0.05;

/// The hand-over of an input wait the hand-over limits (`PipelineBound::Ipc`): its time per
/// step (ms) and the workers that could take it over.
fn handover_bound(s: &Summary) -> Option<(f64, u32)> {
    let p = s.workers.profile.as_ref()?;
    let k = s.workers.count.filter(|&k| k > 0)?;
    let mean = s.phases.input_wait.mean_ms.filter(|&m| m > 0.0)?;
    (p.bound == crate::summary::PipelineBound::Ipc)
        .then_some(())
        .and(p.ipc)
        .map(|i| (mean * i.clamp(0.0, 1.0), k))
}

fn plural_workers(k: u32) -> String {
    if k == 1 {
        "1 worker".to_owned()
    } else {
        format!("{k} workers")
    }
}

/// The input wait that stays when the batch is ready, from the phase's stack samples: its
/// mean × the share of samples in the DataLoader's own code, at most its on-CPU time (a worker
/// queue's wait is not work), plus the hand-over (taking a finished batch over: reading,
/// unpickling) where it holds at least [`HANDOVER_SHARE`] of the wait. `None` without samples:
/// then the floor is 0. Returns (floor ms, the share of the samples that stays).
fn loader_floor(s: &Summary, st: &crate::summary::PhaseStats, mean: f64) -> Option<(f64, f64)> {
    if st.stack_samples == 0 || st.top_functions.is_empty() {
        return None;
    }
    let share: f64 = st
        .top_functions
        .iter()
        .filter(|f| f.file.contains(LOADER_FILES) || f.function.contains(LOADER_FILES))
        .map(|f| f.share)
        .sum();
    let handover = s
        .workers
        .profile
        .as_ref()
        .and_then(|p| p.ipc)
        .filter(|&i| i >= HANDOVER_SHARE)
        .unwrap_or(0.0);
    if share + handover <= 0.0 {
        return None;
    }
    let mut floor = mean * share.clamp(0.0, 1.0);
    if let Some(cpu) = st.cpu_ms {
        floor = floor.min(cpu.max(0.0));
    }
    floor = (floor + mean * handover).min(mean);
    Some((floor, (share + handover).min(1.0)))
}

/// The card's and the HTML's sentence for `w`: "input_wait → 0: 34.3 → 3.6 ms per step, 9.5×
/// the throughput".
pub fn sentence(w: &WhatIf) -> String {
    format!(
        "{}: {} → {} per step, {:.1}× the throughput",
        w.change,
        crate::units::ms(Some(w.step_ms)),
        crate::units::ms(Some(w.step_ms_if)),
        w.throughput_factor
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{self, Scenario};

    fn approx(a: f64, b: f64, tol: f64) {
        assert!((a - b).abs() <= tol, "{a} vs {b} (± {tol})");
    }

    #[test]
    fn the_cause_leads_and_its_floor_removes_its_mean() {
        let s = testkit::summary(&testkit::input_bound());
        assert_eq!(s.primary_diagnosis.phase, Some(Phase::InputWait));
        let w = &s.what_if;
        assert!(!w.is_empty() && w.len() <= MAX_WHAT_IFS, "{w:?}");
        assert_eq!(w[0].phase, Phase::InputWait);
        let step = s.step_ms.mean.unwrap();
        let input = s.phases.input_wait.mean_ms.unwrap();
        approx(w[0].step_ms, step, 1e-9);
        approx(w[0].step_ms_if, step - input, 1e-9);
        approx(w[0].throughput_factor, step / (step - input), 1e-9);
        assert!(w[0].assumption.contains("upper bound"));
        // Compute phases with no blocked time have no floor: never a what-if.
        assert!(
            w.iter()
                .all(|x| !matches!(x.phase, Phase::Forward | Phase::Backward)),
            "{w:?}"
        );
    }

    #[test]
    fn the_loaders_own_samples_stay_in_the_input_floor() {
        let mut s = testkit::summary(&testkit::input_bound());
        let input = s.phases.input_wait.mean_ms.unwrap();
        let f = |file: &str, share: f64| crate::profile::TopFunction {
            function: format!("{file}:f"),
            file: file.to_owned(),
            line: 1,
            share,
            samples: (share * 100.0) as u64,
        };
        s.phases.input_wait.stack_samples = 100;
        s.phases.input_wait.top_functions = vec![
            f("train.py", 0.9),
            f(
                "/venv/lib/python3.11/site-packages/torch/utils/data/_utils/collate.py",
                0.06,
            ),
            f(
                "/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py",
                0.04,
            ),
        ];
        s.phases.input_wait.cpu_ms = Some(input * 0.5);
        let w = what_if(&s);
        let step = s.step_ms.mean.unwrap();
        approx(w[0].step_ms_if, step - input + input * 0.10, 1e-6);
        assert!(!w[0].assumption.contains("upper bound"), "{w:?}");
        // The floor is never more than the phase's time on a CPU.
        s.phases.input_wait.cpu_ms = Some(input * 0.02);
        approx(what_if(&s)[0].step_ms_if, step - input + input * 0.02, 1e-6);
    }

    /// Workers delivering in pairs: every other step waits 78 ms, the next finds its batch
    /// ready and takes 1.8 ms. The what-if is those steps' median, not the waiting steps'
    /// compute; with too few ready steps it is modelled again.
    #[test]
    fn steps_that_found_their_batch_ready_measure_the_input_what_if() {
        let mut s = testkit::summary(&testkit::input_bound());
        let pairs = |s: &mut Summary, n: usize, ready: &dyn Fn(usize) -> bool| {
            let ss = &mut s.step_samples;
            ss.stride = 1;
            ss.step_ms = (0..n)
                .map(|k| {
                    if ready(k) {
                        1.8 + (k % 3) as f64 * 0.01
                    } else {
                        80.0
                    }
                })
                .collect();
            ss.phase_ms[Phase::InputWait] =
                (0..n).map(|k| if ready(k) { 0.05 } else { 78.0 }).collect();
        };
        pairs(&mut s, 100, &|k| k % 2 == 1);
        s.phases.input_wait.mean_ms = Some(39.0);
        s.step_ms.mean = Some(40.9);
        let w = what_if(&s);
        assert_eq!(w[0].phase, Phase::InputWait, "{w:?}");
        approx(w[0].step_ms_if, 1.81, 1e-9);
        let m = w[0].measured.as_ref().expect("measured");
        assert_eq!((m.steps, m.of), (50, 100));
        approx(m.input_wait_max_ms, 3.9, 1e-9);
        assert!(
            w[0].assumption.contains("50 of 100 steady steps")
                && !w[0].assumption.contains("upper"),
            "{w:?}"
        );
        // 7 ready steps of 100 (under READY_MIN_STEPS): the modelled floor.
        pairs(&mut s, 100, &|k| k % 14 == 1);
        let w = what_if(&s);
        assert_eq!(w[0].phase, Phase::InputWait, "{w:?}");
        assert!(w[0].measured.is_none(), "{w:?}");
        approx(w[0].step_ms_if, 40.9 - 39.0, 1e-9);
    }

    fn with_handover(s: &mut Summary, ipc: f64, bound: crate::summary::PipelineBound) {
        s.workers.count = Some(2);
        s.workers.profile = Some(crate::summary::WorkerProfile {
            ipc: Some(ipc),
            bound,
            ..Default::default()
        });
    }

    #[test]
    fn a_hand_over_stays_in_the_input_floor() {
        let mut s = testkit::summary(&testkit::input_bound());
        let input = s.phases.input_wait.mean_ms.unwrap();
        let step = s.step_ms.mean.unwrap();
        s.phases.input_wait.stack_samples = 100;
        s.phases.input_wait.top_functions = vec![crate::profile::TopFunction {
            function: "Queue.get".into(),
            file: "/usr/lib/python3.11/multiprocessing/queues.py".into(),
            line: 1,
            share: 1.0,
            samples: 100,
        }];
        with_handover(&mut s, 0.3, crate::summary::PipelineBound::Wait);
        let w = what_if(&s);
        assert_eq!(w[0].phase, Phase::InputWait);
        approx(w[0].step_ms_if, step - input + input * 0.3, 1e-6);
        assert!(
            w[0].change.starts_with("input_wait → the loader's own"),
            "{w:?}"
        );
    }

    #[test]
    fn a_hand_over_bound_moves_to_the_workers() {
        let mut s = testkit::summary(&testkit::input_bound());
        let input = s.phases.input_wait.mean_ms.unwrap();
        let step = s.step_ms.mean.unwrap();
        with_handover(&mut s, 0.9, crate::summary::PipelineBound::Ipc);
        let w = what_if(&s);
        assert_eq!(w[0].phase, Phase::InputWait);
        assert_eq!(w[0].change, "input_wait's hand-over → the 2 workers");
        let h = input * 0.9;
        approx(w[0].step_ms_if, (step - h).max(h / 2.0), 1e-6);
        assert!(
            w[0].assumption.contains("no shorter than their share"),
            "{w:?}"
        );
    }

    #[test]
    fn gpu_wait_keeps_the_devices_busy_time() {
        let sc = Scenario {
            // input, h2d, fwd, bwd, opt, gpu_wait, residual
            phase_ms: [1.0, 1.0, 10.0, 10.0, 2.0, 60.0, 1.0],
            gpu_util: 80.0,
            jitter: 0.0,
            ..Scenario::default()
        };
        let s = testkit::summary(&sc);
        let w = s
            .what_if
            .iter()
            .find(|w| w.phase == Phase::GpuWait)
            .expect("gpu_wait what-if");
        let step = s.step_ms.mean.unwrap();
        let util = s.gpu.as_ref().unwrap().util_pct_mean.unwrap();
        // The step cannot fall below the device's busy time.
        approx(w.step_ms_if, step * util / 100.0, 1e-6);
        assert!(w.step_ms_if > step - s.phases.gpu_wait.mean_ms.unwrap());
    }

    #[test]
    fn a_mostly_blocked_forward_falls_to_its_cpu_time() {
        let mut s = testkit::summary(&Scenario {
            phase_ms: [1.0, 0.0, 60.0, 10.0, 2.0, 0.0, 1.0],
            cuda: false,
            gpu: false,
            jitter: 0.0,
            ..Scenario::default()
        });
        let f = s.phases.forward.mean_ms.unwrap();
        s.phases.forward.blocked_ms = Some(f * 0.9);
        s.phases.forward.launches_per_step = None;
        let w = what_if(&s);
        let fw = w
            .iter()
            .find(|w| w.phase == Phase::Forward)
            .expect("forward what-if");
        approx(fw.step_ms_if, s.step_ms.mean.unwrap() - f * 0.9, 1e-6);
        // Not blocked: no floor.
        s.phases.forward.blocked_ms = Some(f * 0.1);
        assert!(what_if(&s).iter().all(|w| w.phase != Phase::Forward));
    }

    #[test]
    fn small_phases_and_empty_runs_have_none() {
        let mut s = testkit::summary(&Scenario {
            steps: 0,
            ..Scenario::default()
        });
        assert!(what_if(&s).is_empty());
        s = testkit::summary(&Scenario::default());
        for w in what_if(&s) {
            assert!(s.phases[w.phase].share.unwrap() >= MIN_SHARE, "{w:?}");
        }
    }
}
