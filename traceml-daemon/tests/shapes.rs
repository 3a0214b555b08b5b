//! Training-loop shapes that popular code writes (issue 38, item 7), in real PyTorch on CPU
//! (`tests/workloads/frameworks/loop_shapes.py`, one mode per test): two DataLoaders zipped
//! (slow one first, slow one second), nanoGPT's `get_batch()` without a DataLoader, a feeder
//! thread filling a `queue.Queue`, CPU augmentation between fetch and forward, evaluation under
//! `torch.no_grad()` with and without a DataLoader and under `torch.inference_mode()`, epochs
//! with a pause between them, 128-micro-batch gradient accumulation attached mid-run, and a
//! `torch.compile`d model compiled under the daemon. Each
//! workload clocks its own phases (truth format: tests/README.md); the daemon is held to that
//! truth over the part of the run it measured ([`support::truth_view`]: the truth's steps by
//! time, from the attach on (once the probes were placed), less those the daemon's shares
//! leave out as learning steps):
//!
//! - the verdict the truth implies, by these bands (the documented meaning of the verdicts,
//!   not the daemon's code): input_wait ≥ 0.50 of step time → `INPUT_BOUND`; compute
//!   (forward + backward + optimizer + gpu_wait) ≥ 0.90 with input_wait and residual each
//!   < 0.10 → `COMPUTE_BOUND`. A truth within 0.05 of one of these lines, or in neither band,
//!   is not judged (the test prints why);
//! - the input_wait share within 0.02 of the truth's;
//! - forward, backward and optimizer shares each within 0.05 of the truth's;
//! - the step count between the truth's steps begun after every probe was in place (the
//!   recording's first probe set) − 1 and its steps begun after the attach + 1 (the probes
//!   are placed one library after another, up to a second: a step begun meanwhile may be
//!   seen in part);
//! - evaluation's share of the run's wall time (`evaluation.share_of_wall`) within 0.05 of the
//!   truth's (its evaluation spans after the attach over `run.duration_s`; 0 where the loop
//!   has no evaluation), and its segments: none where the loop has no evaluation, the truth's
//!   count after the attach ±1 elsewhere;
//! - feeder_queue: the training thread (`steps.training_tid`) is the main thread, the one that
//!   called `q.get()` and the optimizer (the truth's `training_tid`), not the feeder;
//! - compiled: the worker count the workload's (0: inductor's g++ children are not workers);
//! - accum128: 128 micro-batches in every step (`steps.micro_batches` min and max): the window
//!   the attach cut is partial, no step.
//!
//! Every check prints the truth's number beside the daemon's, passed or not. Needs the torch
//! venv (`cargo xtask setup --torch`, `TRACEML_TORCH_PYTHON`): `#[ignore]`d, run by `cargo xtask
//! test` (see `support::torch_python`).
mod support;

use support::*;
use traceml_daemon::phase::Phase;

/// input_wait at or above this share of step time: the truth is input-bound.
const INPUT_BOUND_LINE: f64 = 0.50;
/// Compute at or above this share, with input and residual below [`MINOR_LINE`]: compute-bound.
const COMPUTE_BOUND_LINE: f64 = 0.90;
const MINOR_LINE: f64 = 0.10;
/// A truth this close to a line is not judged on its verdict.
const EDGE: f64 = 0.05;
const INPUT_TOLERANCE: f64 = 0.02;
const COMPUTE_PHASE_TOLERANCE: f64 = 0.05;
const EVAL_TOLERANCE: f64 = 0.05;

/// Checks and their outcome, printed as one table per mode.
struct Checks {
    mode: &'static str,
    lines: Vec<String>,
    failures: Vec<String>,
}

impl Checks {
    fn new(mode: &'static str) -> Checks {
        Checks {
            mode,
            lines: Vec::new(),
            failures: Vec::new(),
        }
    }

    /// One check: `ok` or FAIL, with the numbers.
    fn check(&mut self, ok: bool, what: String) {
        let line = format!("{} {what}", if ok { "ok  " } else { "FAIL" });
        if !ok {
            self.failures.push(format!("{}: {what}", self.mode));
        }
        self.lines.push(line);
    }

    fn note(&mut self, what: String) {
        self.lines.push(format!("note {what}"));
    }

    fn share(&mut self, phase: &str, got: Option<f64>, want: f64, tol: f64) {
        let ok = got.is_some_and(|g| (g - want).abs() <= tol);
        self.check(
            ok,
            format!(
                "{phase:<10} share: daemon {}, truth {want:.3} (tolerance {tol})",
                fmt(got)
            ),
        );
    }

    fn finish(self, r: &TruthRun) {
        println!("=== loop_shapes {}", self.mode);
        for l in &self.lines {
            println!("  {l}");
        }
        assert!(self.failures.is_empty(), "{:#?}\n{}", self.failures, r.card);
    }
}

fn fmt(v: Option<f64>) -> String {
    v.map_or("null".into(), |v| format!("{v:.3}"))
}

fn share_of(shares: &[(Phase, f64)], p: Phase) -> f64 {
    shares
        .iter()
        .find(|(q, _)| *q == p)
        .map_or(0.0, |(_, s)| *s)
}

/// The verdict the truth's shares imply by the bands of the module's doc, or why none is
/// expected.
fn expected_verdict(shares: &[(Phase, f64)]) -> Result<&'static str, String> {
    let input = share_of(shares, Phase::InputWait);
    let residual = share_of(shares, Phase::Residual);
    let compute: f64 = [
        Phase::Forward,
        Phase::Backward,
        Phase::Optimizer,
        Phase::GpuWait,
    ]
    .iter()
    .map(|&p| share_of(shares, p))
    .sum();
    let near = |v: f64, line: f64| (v - line).abs() < EDGE;
    if near(input, INPUT_BOUND_LINE) {
        return Err(format!(
            "truth input share {input:.3} is within {EDGE} of the INPUT_BOUND line {INPUT_BOUND_LINE}"
        ));
    }
    if input >= INPUT_BOUND_LINE {
        return Ok("INPUT_BOUND");
    }
    for (name, v, line) in [
        ("compute", compute, COMPUTE_BOUND_LINE),
        ("input", input, MINOR_LINE),
        ("residual", residual, MINOR_LINE),
    ] {
        if near(v, line) {
            return Err(format!(
                "truth {name} share {v:.3} is within {EDGE} of the COMPUTE_BOUND band's line {line}"
            ));
        }
    }
    if compute >= COMPUTE_BOUND_LINE && input < MINOR_LINE && residual < MINOR_LINE {
        return Ok("COMPUTE_BOUND");
    }
    Err(format!(
        "truth (input {input:.3}, compute {compute:.3}, residual {residual:.3}) is in neither band"
    ))
}

/// What a mode checks beyond the common checks.
#[derive(Default)]
struct Extra {
    /// The daemon's training thread must be the truth's (the main thread).
    training_tid: bool,
    /// Micro-batches per optimizer step.
    micro_batches: Option<f64>,
    /// The Python function the loop's input wait blocks in, by the workload's code (the
    /// innermost Python frame: `get_batch` sleeps in itself; `q.get()` waits in
    /// `Condition.wait`): the first of `input_wait.blocked_in`.
    blocked_in: Option<&'static str>,
    /// Words the Next line must hold (docs/advice.md's row for the loop's shape).
    next_says: &'static [&'static str],
}

fn check_mode(mode: &'static str, extra: Extra) {
    let Some(r) =
        run_framework_workload("loop_shapes", &["--mode", mode], &format!("shapes-{mode}"))
    else {
        return;
    };
    let s = &r.summary;
    let t = &r.truth;
    let mut c = Checks::new(mode);
    let view = truth_view(t, s, &r.items);
    let attach = attach_ns(&r.items);
    c.note(format!(
        "truth: {} steps ({} from the attach, {} in the daemon's shares), loop {:.2} s; daemon: \
         boundary {}, {} steps, learning_excluded {}, attached for {} s, verdict {}",
        t["step_count"],
        view.seen.len(),
        view.shared.len(),
        (t["run_end_ns"].as_f64().unwrap_or(0.0) - t["run_start_ns"].as_f64().unwrap_or(0.0)) / 1e9,
        s["steps"]["boundary"],
        s["steps"]["count"],
        s["steps"]["learning_excluded"],
        s["run"]["duration_s"],
        s["primary_diagnosis"]["kind"],
    ));
    if let (Some(a), Some(first)) = (attach, t["steps"][0]["t_start_ns"].as_u64())
        && t["ready_gated"] == false
    {
        let during = |ts: u64| {
            t["steps"]
                .as_array()
                .and_then(|v| v.iter().position(|st| st["t_end_ns"].as_u64() > Some(ts)))
                .map_or("?".into(), |w| w.to_string())
        };
        let probes = events(&r.items).map(|e| e.ts).min().unwrap_or(a);
        c.note(format!(
            "attached {:.3} s after the truth's first step started (during its step {}), first \
             probe event at {:.3} s (during its step {})",
            (a as f64 - first as f64) / 1e9,
            during(a),
            (probes as f64 - first as f64) / 1e9,
            during(probes)
        ));
    }
    // When the learning probe set ran, from the loop's start (epochs: it should end in the
    // first epoch, whose end is the first epoch gap's start).
    let loop_start = t["run_start_ns"].as_u64().unwrap_or(0);
    let rel = |ns: u64| (ns as f64 - loop_start as f64) / 1e9;
    let spans: Vec<String> = learning_spans(&r.items)
        .iter()
        .map(|&(a, b)| {
            format!(
                "{:.2} s to {}",
                rel(a),
                b.map_or("the end".into(), |b| format!("{:.2} s", rel(b)))
            )
        })
        .collect();
    let first_epoch = t["epoch_gaps_ns"][0][0]
        .as_u64()
        .map(|e| format!("; the first epoch ended at {:.2} s", rel(e)))
        .unwrap_or_default();
    c.note(format!(
        "learning probe set (from the loop's start): {}{first_epoch}",
        spans.join(", ")
    ));
    if view.seen.is_empty() || view.shared.is_empty() {
        c.check(
            false,
            "the truth has no step in the daemon's span: nothing to compare".into(),
        );
        c.finish(&r);
        return;
    }
    let shares = truth_shares_of(&view.shared);
    let daemon_share = |p: Phase| s["phases"][p.name()]["share"].as_f64();

    // The verdict.
    let got = s["primary_diagnosis"]["kind"].as_str().unwrap_or("?");
    match expected_verdict(&shares) {
        Ok(want) => c.check(
            got == want,
            format!("verdict: daemon {got}, truth {want} (by the truth's own shares)"),
        ),
        Err(why) => c.note(format!("verdict not judged: {why} (daemon {got})")),
    }
    // The shares.
    c.share(
        "input_wait",
        daemon_share(Phase::InputWait),
        share_of(&shares, Phase::InputWait),
        INPUT_TOLERANCE,
    );
    for p in [Phase::Forward, Phase::Backward, Phase::Optimizer] {
        c.share(
            p.name(),
            daemon_share(p),
            share_of(&shares, p),
            COMPUTE_PHASE_TOLERANCE,
        );
    }
    c.note(format!(
        "residual   share: daemon {}, truth {:.3} (not judged)",
        fmt(daemon_share(Phase::Residual)),
        share_of(&shares, Phase::Residual)
    ));
    // The step count over the same span: the steps begun after the attach, less those begun
    // while the probes were being placed (the daemon may see them in part), ±1.
    let probes_in = probes_in_ns(&r.items).unwrap_or(0);
    let after_probes = view
        .seen
        .iter()
        .filter(|st| st["t_start_ns"].as_u64().is_some_and(|a| a >= probes_in))
        .count() as i64;
    let (got_steps, want_steps) = (s["steps"]["count"].as_i64(), view.seen.len() as i64);
    c.check(
        got_steps.is_some_and(|g| g >= after_probes - 1 && g <= want_steps + 1),
        format!(
            "steps: daemon {}, truth {want_steps} begun after the attach, {after_probes} after \
             every probe was in (from {} - 1 to {} + 1)",
            got_steps.map_or("null".into(), |g| g.to_string()),
            after_probes,
            want_steps
        ),
    );
    // Evaluation's segments: none where the loop evaluates nothing (an epoch's end is no
    // evaluation), the truth's count after the attach (±1: one cut by the attach) elsewhere.
    let want_segments = t["evaluation"]["spans_ns"].as_array().map_or(0, |v| {
        v.iter()
            .filter(|sp| attach.is_none_or(|at| sp[0].as_u64().is_some_and(|a| a >= at)))
            .count() as u64
    });
    let got_segments = s["evaluation"]["segments"].as_u64().unwrap_or(u64::MAX);
    c.check(
        if want_segments == 0 {
            got_segments == 0
        } else {
            got_segments.abs_diff(want_segments) <= 1
        },
        format!(
            "evaluation segments: daemon {got_segments}, truth {want_segments} after the attach"
        ),
    );
    // Evaluation's share of the run's wall time.
    let eval_ns: f64 = t["evaluation"]["spans_ns"]
        .as_array()
        .map(|v| {
            v.iter()
                .filter_map(|sp| Some((sp[0].as_u64()?, sp[1].as_u64()?)))
                .filter(|&(a, _)| attach.is_none_or(|at| a >= at))
                .map(|(a, b)| (b - a) as f64)
                .fold(0.0, |x, y| x + y)
        })
        .unwrap_or(0.0);
    match s["run"]["duration_s"].as_f64() {
        Some(run_s) if run_s > 0.0 => {
            let want = eval_ns / 1e9 / run_s;
            let got = s["evaluation"]["share_of_wall"].as_f64();
            c.check(
                got.is_some_and(|g| (g - want).abs() <= EVAL_TOLERANCE),
                format!(
                    "evaluation share of wall: daemon {} ({} segments, {} batches), truth \
                     {want:.3} ({} segments, {:.2} s of {run_s:.2} s) (tolerance {EVAL_TOLERANCE})",
                    fmt(got),
                    s["evaluation"]["segments"],
                    s["evaluation"]["batches"],
                    t["evaluation"]["segments"],
                    eval_ns / 1e9
                ),
            );
        }
        _ => c.check(false, "the summary has no run.duration_s".into()),
    }
    if extra.training_tid {
        let (got, want) = (
            s["steps"]["training_tid"].as_u64(),
            t["training_tid"].as_u64(),
        );
        c.check(
            got.is_some() && got == want,
            format!(
                "training thread: daemon {got:?}, truth {want:?} (the main thread; the feeder \
                 thread is {})",
                t["feeder"]["tid"]
            ),
        );
    }
    if let Some(want) = extra.blocked_in {
        let first = &s["phases"]["input_wait"]["blocked_in"][0];
        c.check(
            first["function"]
                .as_str()
                .is_some_and(|f| f.ends_with(want)),
            format!(
                "input wait blocked in: daemon {} ({}), workload's code {want}",
                first["function"],
                fmt(first["share"].as_f64())
            ),
        );
    }
    let next = s["primary_diagnosis"]["next"].as_str().unwrap_or("");
    for w in extra.next_says {
        c.check(next.contains(w), format!("Next says {w:?}: {next}"));
    }
    if let Some(want) = t["worker_processes"].as_u64() {
        // The workload's own count of DataLoader worker processes; its other children
        // (compile's g++) are not workers.
        let got = s["workers"]["count"].as_u64();
        c.check(
            got == Some(want),
            format!("worker processes: daemon {got:?}, truth {want}"),
        );
        let q = &s["data_quality"];
        c.note(format!(
            "events lost {}, calls too deep to follow {}, confidence {}",
            q["events_lost"]["total"], q["events_lost"]["too_deep"], q["confidence"]
        ));
    }
    if let Some(micro) = extra.micro_batches {
        let mb = &s["steps"]["micro_batches"];
        let (min, max) = (mb["min"].as_f64(), mb["max"].as_f64());
        c.check(
            min == Some(micro) && max == Some(micro),
            format!(
                "micro-batches per step: daemon min {}, max {} (mean {}), truth {micro} in every \
                 step (a window cut by the attach is partial, not a step)",
                mb["min"],
                mb["max"],
                fmt(mb["mean"].as_f64())
            ),
        );
    }
    c.finish(&r);
}

#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn zipped_loaders_slow_first() {
    check_mode("zipped_slow_first", Extra::default());
}

#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn zipped_loaders_slow_second() {
    check_mode("zipped_slow_second", Extra::default());
}

#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn nanogpt_get_batch_without_a_dataloader() {
    check_mode(
        "get_batch",
        Extra {
            blocked_in: Some("get_batch"),
            next_says: &["background thread", "memory-mapped array"],
            ..Extra::default()
        },
    );
}

#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn feeder_thread_and_queue() {
    check_mode(
        "feeder_queue",
        Extra {
            training_tid: true,
            blocked_in: Some("Condition.wait"),
            ..Extra::default()
        },
    );
}

#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn cpu_augmentation_is_input() {
    check_mode("cpu_augment", Extra::default());
}

#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn no_grad_evaluation_over_a_dataloader() {
    check_mode("nograd_eval_dl", Extra::default());
}

#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn no_grad_evaluation_over_preloaded_tensors() {
    check_mode("nograd_eval_nodl", Extra::default());
}

#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn inference_mode_evaluation() {
    check_mode("inference_eval", Extra::default());
}

#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn epochs_with_a_pause_between_them() {
    check_mode("epochs", Extra::default());
}

#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn accumulation_of_128_micro_batches_attached_mid_window() {
    check_mode(
        "accum128",
        Extra {
            micro_batches: Some(128.0),
            ..Extra::default()
        },
    );
}

#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn a_torch_compiled_model_compiled_under_the_daemon() {
    check_mode("compiled", Extra::default());
}
