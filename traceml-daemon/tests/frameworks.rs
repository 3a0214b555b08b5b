//! Real frameworks under the daemon (issue 10): a Hugging Face `Trainer` and a PyTorch Lightning
//! `Trainer` on CPU (tests/workloads/frameworks), each knowing its own phases from its hooks and
//! clocks (truth format: tests/README.md). Checked against that truth:
//! - HF compute-bound: the verdict the rules give on the truth's own shares (COMPUTE-BOUND when
//!   the run sits in its band), the frame-evaluator probe detached by the governor, and the
//!   residual named by the stack samples (a Trainer or torch function);
//! - HF input-bound: INPUT-BOUND with the input share within 0.01 of the truth's;
//! - Lightning: forward and backward (run inside `optimizer.step(closure)`) carry their own time,
//!   within max(2 ms, 5 %) of the truth's medians, and the optimizer only the update's.
//!
//! Needs real PyTorch with transformers and pytorch-lightning (`cargo xtask setup --torch`).
mod support;

use support::*;

/// A framework workload's run: its summary, truth and card.
type Run = TruthRun;

fn run(workload: &str, mode: &str, steps: u32) -> Option<Run> {
    let steps = steps.to_string();
    run_framework_workload(
        workload,
        &["--mode", mode, "--steps", &steps],
        &format!("{workload}-{mode}"),
    )
}

fn phase_ms(s: &serde_json::Value, phase: &str) -> f64 {
    s["phases"][phase]["median_ms"].as_f64().unwrap_or(f64::NAN)
}

fn truth_ms(t: &serde_json::Value, phase: &str) -> f64 {
    t["median_phases_ns"][phase].as_f64().unwrap() / 1e6
}

/// The truth's share of one phase over the steps the daemon's shares cover
/// ([`truth_shares_over_daemon_steps`]).
fn truth_share(r: &Run, phase: &str) -> f64 {
    truth_shares(r)
        .into_iter()
        .find(|(p, _)| p.name() == phase)
        .map_or(0.0, |(_, v)| v)
}

/// Tolerance of a phase median: max(2 ms, 5 % of the truth).
fn tolerance_ms(truth_ms: f64) -> f64 {
    (truth_ms * 0.05).max(2.0)
}

/// How far the daemon's shares may sit from the truth's before its verdict must be the truth's:
/// the scenario suite's 2 points, plus 1 for a difference of definitions — the daemon's forward
/// span holds the Trainer's bookkeeping between the batch fetch and backward (`_prepare_inputs`,
/// the training_step prologue), which the workload's clocks count as residual (measured: HF
/// residual 8 % in the daemon's, up to ~11 % in the truth's on a loaded machine).
const FRAMEWORK_MARGIN: f64 = 0.03;
/// Lightning's the same, wider by its own difference of definitions: its training_step wrapper
/// and the hooks it runs inside the optimizer's closure (on_before_backward,
/// on_before_optimizer_step, logging) are the workload clocks' residual and the daemon's
/// forward/backward/optimizer (measured on `lightning val` in a clean-clone CI run: truth
/// residual 9.9 %, the daemon's 3.7 %; forward 21.3 % against 27.8 %). A known gap, in the stop
/// note: the verdict is held to the truth's shares within it.
const LIGHTNING_MARGIN: f64 = 0.07;

fn truth_shares(r: &Run) -> Vec<(traceml_daemon::phase::Phase, f64)> {
    truth_shares_over_daemon_steps(&r.truth, &r.summary)
}

/// The verdicts near the truth's own shares (one when the run sits clear of every line).
fn truth_verdicts(r: &Run, label: &str) -> std::collections::BTreeSet<&'static str> {
    let steps = r.truth["step_count"].as_u64().unwrap() as u32;
    let margin = if label.starts_with("lightning") {
        LIGHTNING_MARGIN
    } else {
        FRAMEWORK_MARGIN
    };
    verdicts_near_by(margin, &truth_shares(r), steps)
}

/// The verdict the published rules give on the truth's own shares (under load the run may leave its band).
fn truth_verdict(r: &Run) -> String {
    let steps = r.truth["step_count"].as_u64().unwrap() as u32;
    published_verdict(&truth_shares(r), steps).to_owned()
}

/// The median over the truth's steps of the sum of these phases, in ms.
fn truth_median_sum_ms(t: &serde_json::Value, phases: &[&str]) -> f64 {
    let mut sums: Vec<f64> = t["steps"]
        .as_array()
        .expect("the truth's steps")
        .iter()
        .map(|s| {
            phases
                .iter()
                .map(|p| s["phases_ns"][*p].as_f64().unwrap_or(0.0))
                .sum::<f64>()
                / 1e6
        })
        .collect();
    sums.sort_by(f64::total_cmp);
    sums[sums.len() / 2]
}

/// Each phase's median within [`tolerance_ms`] of the truth's. The forward and optimizer spans
/// are where the definitions differ (see [`FRAMEWORK_MARGIN`]): the daemon's forward runs from
/// the batch's fetch to backward and its optimizer is the optimizer step's record less what is
/// nested in it, so they hold the framework's bookkeeping around `training_step` and around
/// Lightning's closure, which the workload's clocks count as residual. Each may reach the
/// truth's phase + residual (the median of their per-step sum), which grows with the machine's
/// load (measured under two CPU burners: forward 31.1 ms against 27.6 ms, optimizer 19.2 against
/// 16.5, steps 2.4× as long as on a quiet machine).
fn check_phases(label: &str, r: &Run, phases: &[&str], failures: &mut Vec<String>) {
    for p in phases {
        let (got, want) = (phase_ms(&r.summary, p), truth_ms(&r.truth, p));
        let tol = tolerance_ms(want);
        let high = if *p == "forward" || *p == "optimizer" {
            truth_median_sum_ms(&r.truth, &[p, "residual"]).max(want) + tol
        } else {
            want + tol
        };
        if got < want - tol || got > high {
            failures.push(format!(
                "{label}: {p} median {got:.2} ms, truth {want:.2} ms (from {:.2} to {high:.2})",
                want - tol
            ));
        }
    }
}

#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn hf_trainer_compute_bound_with_markers_and_a_named_residual() {
    let Some(r) = run("hf_trainer", "compute", 120) else {
        return;
    };
    let s = &r.summary;
    let mut failures = Vec::new();
    assert_eq!(s["steps"]["count"], r.truth["step_count"], "{}", r.card);
    let want = truth_verdicts(&r, "hf");
    let got = s["primary_diagnosis"]["kind"].as_str().unwrap_or("?");
    if !want.contains(got) {
        failures.push(format!(
            "verdict {got}, the truth's shares give {} (near: {want:?})",
            truth_verdict(&r)
        ));
    }
    check_phases("hf compute", &r, &["forward", "backward"], &mut failures);
    check_loop_structure("hf compute", &r, &mut failures);
    // The governor detached the frame-evaluator probe once the markers carried the steps.
    let sets = s["daemon_overhead"]["probe_sets"]
        .as_array()
        .expect("probe sets");
    if !sets.last().is_some_and(|p| p["python"] == false) {
        failures.push(format!("frame-evaluator probe still armed: {sets:?}"));
    }
    let steady = s["daemon_overhead"]["steady_hits_per_step"]["python"]
        .as_f64()
        .unwrap_or(f64::NAN);
    if steady != 0.0 {
        failures.push(format!(
            "{steady} frame-evaluator hits per step after the detach"
        ));
    }
    // The residual is named: functions of the Trainer (or torch) fill it.
    let top = s["phases"]["residual"]["top_functions"]
        .as_array()
        .expect("top functions");
    if !top.iter().any(|f| {
        let file = f["file"].as_str().unwrap_or("");
        file.contains("transformers/") || file.contains("torch/") || file.contains("accelerate/")
    }) {
        failures.push(format!("residual not named by framework code: {top:?}"));
    }
    if !r.card.contains("DAEMON COST") || !r.card.contains("CODE") {
        failures.push("the card lacks its CODE or DAEMON COST line".into());
    }
    assert!(failures.is_empty(), "{failures:#?}\n{}", r.card);
}

#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn hf_trainer_input_bound_share_within_one_point() {
    let Some(r) = run("hf_trainer", "input", 40) else {
        return;
    };
    let s = &r.summary;
    let got = s["primary_diagnosis"]["kind"].as_str().unwrap_or("?");
    assert!(truth_verdicts(&r, "hf").contains(got), "{got}\n{}", r.card);
    let share = s["phases"]["input_wait"]["share"].as_f64().unwrap();
    let want = truth_share(&r, "input_wait");
    assert!(
        (share - want).abs() <= 0.01,
        "input share {share:.3}, truth {want:.3}\n{}",
        r.card
    );
    // The input wait is named by the dataset's code.
    let top = s["phases"]["input_wait"]["top_functions"]
        .as_array()
        .unwrap();
    assert!(
        top.first()
            .is_some_and(|f| f["function"].as_str().unwrap().contains("__getitem__")),
        "{top:?}"
    );
    // docs/advice.md's row: the Trainer's own argument, not a DataLoader the user never built.
    check_advice(
        &r,
        "hf_trainer",
        None,
        &["TrainingArguments(dataloader_num_workers="],
    );
}

/// Runs a framework workload alone (no daemon), `steps` steps, and returns its median step by
/// its own clocks (ms).
fn rerun_median_step_ms(workload: &str, mode: &str, steps: u32) -> f64 {
    let dir = scratch(&format!("{workload}-{mode}-alone"));
    let truth = dir.join("truth.json");
    let out = std::process::Command::new(torch_python())
        .arg(workspace().join(format!("tests/workloads/frameworks/{workload}.py")))
        .args(["--mode", mode, "--steps", &steps.to_string(), "--truth"])
        .arg(&truth)
        .output()
        .expect("the workload runs");
    assert!(out.status.success(), "{workload} {mode}: {out:?}");
    let t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&truth).expect("its truth")).unwrap();
    t["median_step_ns"].as_f64().expect("median_step_ns") / 1e6
}

/// An input-bound run's framework (`steps.framework`) and Next line against what the workload
/// is: its trainer, its iterable dataset if any, and the knob words of docs/advice.md's row.
fn check_advice(r: &Run, trainer: &str, iterable: Option<&str>, words: &[&str]) {
    let s = &r.summary;
    let mut failures = Vec::new();
    if s["primary_diagnosis"]["kind"] != "INPUT_BOUND" {
        failures.push(format!(
            "verdict {}, the workload is input-bound",
            s["primary_diagnosis"]["kind"]
        ));
    }
    let fw = &s["steps"]["framework"];
    let got_trainer = fw["trainer"].as_str().unwrap_or("plain");
    if got_trainer != trainer || fw["iterable_dataset"].as_str() != iterable {
        failures.push(format!(
            "steps.framework {fw}, the workload: trainer {trainer}, iterable dataset {iterable:?}"
        ));
    }
    let next = s["primary_diagnosis"]["next"].as_str().unwrap_or("");
    for w in words {
        if !next.contains(w) {
            failures.push(format!("Next does not say {w:?}: {next}"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}\n{}", r.card);
}

/// docs/advice.md's Trainer-over-a-streaming-dataset row: the Trainer's workers argument and the
/// shards a `datasets` IterableDataset needs before more workers help.
#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn hf_trainer_over_a_streaming_dataset_is_told_its_shards() {
    let Some(r) = run("hf_trainer", "input_iterable", 40) else {
        return;
    };
    check_advice(
        &r,
        "hf_trainer",
        Some("datasets"),
        &["TrainingArguments(dataloader_num_workers=", "num_shards"],
    );
}

/// docs/advice.md's Lightning row: the DataModule's train_dataloader().
#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn lightning_input_bound_is_told_its_datamodules_loader() {
    let Some(r) = run("lightning_train", "input", 40) else {
        return;
    };
    check_advice(
        &r,
        "lightning",
        None,
        &["train_dataloader()", "num_workers="],
    );
}

/// docs/advice.md's accelerate row: the DataLoader handed to accelerator.prepare().
#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn accelerate_input_bound_is_told_its_prepared_loader() {
    let Some(r) = run("plain_loop", "accelerate", 40) else {
        return;
    };
    check_advice(
        &r,
        "accelerate",
        None,
        &["accelerator.prepare()", "num_workers="],
    );
}

/// Issue 56's what-if: 2 DataLoader workers that sleep 128 ms a batch deliver in pairs, so
/// about every other step finds its batch ready; the input what-if is measured on those steps:
/// within 5 % of the same steps' median by the workload's own clocks, and within 25 % (two
/// runs: the machine's ±15 % swing between paired runs, measured 2.7-16.3 % apart) of the step that the same model behind the same DataLoader takes
/// when its 2 workers never sleep (`workers_ready`: every batch ready when the loop asks, which
/// is what the what-if assumes; under the daemon as well, its median step by its own clocks).
/// The same batches built in memory (`in_memory`, no DataLoader) are reported beside
/// it, not judged: they drop the hand-over of a ready batch too (measured here: ~1 ms a step
/// of GIL-held unpickling and index feeding on this 2-core machine, and compute ~40 % colder
/// beside two live workers). Also docs/advice.md's plain-DataLoader row.
#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn input_what_if_matches_the_rerun_with_ready_batches() {
    let Some(r) = run("plain_loop", "workers_sleep", 160) else {
        return;
    };
    check_advice(&r, "plain", None, &["DataLoader(num_workers="]);
    let w = &r.summary["what_if"][0];
    assert_eq!(w["phase"], "input_wait", "{}", r.summary["what_if"]);
    let predicted = w["step_ms_if"].as_f64().unwrap();
    let measured = w["measured"]["steps"].as_u64().unwrap_or(0);
    // Under the daemon too, so that the probes' cost is in both steps.
    let Some(rerun) = run("plain_loop", "workers_ready", 1200) else {
        return;
    };
    // Its steady steps, as the what-if's (the first `learning_excluded` ran under the learning
    // probe set).
    let skip = rerun.summary["steps"]["learning_excluded"]
        .as_u64()
        .unwrap_or(0) as usize;
    let steps: Vec<f64> = rerun.truth["steps"]
        .as_array()
        .expect("truth steps")
        .iter()
        .skip(skip)
        .map(|st| st["wall_ns"].as_f64().unwrap() / 1e6)
        .collect();
    let ready = traceml_daemon::stats::median(&steps).expect("steady steps");
    let in_memory = rerun_median_step_ms("plain_loop", "in_memory", 1200);
    let err = (predicted - ready).abs() / ready;
    eprintln!(
        "what-if {} ({}): {predicted:.3} ms a step; the rerun with ready batches {ready:.3} ms \
         ({:.1} % apart); in memory {in_memory:.3} ms; the run's own median step {:.3} ms",
        w["change"],
        w["assumption"],
        err * 100.0,
        r.truth["median_step_ns"].as_f64().unwrap_or(0.0) / 1e6
    );
    assert!(
        measured >= 8,
        "not measured on ready steps: {w}\n{}",
        r.card
    );
    // The same steps by the workload's own clocks: its steady steps whose input wait (its
    // `__next__` timer) was within the what-if's limit, their median step.
    let limit = w["measured"]["input_wait_max_ms"].as_f64().unwrap();
    let skip = r.summary["steps"]["learning_excluded"]
        .as_u64()
        .unwrap_or(0) as usize;
    let own: Vec<f64> = r.truth["steps"]
        .as_array()
        .expect("truth steps")
        .iter()
        .skip(skip)
        .filter(|st| st["phases_ns"]["input_wait"].as_f64().unwrap() / 1e6 <= limit)
        .map(|st| st["wall_ns"].as_f64().unwrap() / 1e6)
        .collect();
    let own_median = traceml_daemon::stats::median(&own).expect("ready steps in the truth");
    eprintln!(
        "the workload's own ready steps: {} of them, median {own_median:.3} ms",
        own.len()
    );
    assert!(
        (predicted - own_median).abs() / own_median <= 0.05,
        "what-if {predicted:.3} ms, the workload's own {} ready steps {own_median:.3} ms",
        own.len()
    );
    // Two runs: this machine's run-to-run swing (±15 % measured between paired runs here) is
    // in the tolerance; a what-if taken from the waiting steps' compute (~6 ms) or a step with
    // the wait kept (~60 ms) is far outside it.
    assert!(
        err <= 0.25,
        "what-if {predicted:.3} ms, the rerun with ready batches {ready:.3} ms\n{}",
        r.card
    );
}

#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn lightning_forward_and_backward_inside_the_optimizer_step() {
    let Some(r) = run("lightning_train", "compute", 120) else {
        return;
    };
    let mut failures = Vec::new();
    // Lightning stops at max_steps without a final DataLoader call: the last step has no end
    // boundary and is dropped as partial (counted in data_quality.partial_steps_dropped).
    let (got, want) = (
        r.summary["steps"]["count"].as_i64().unwrap(),
        r.truth["step_count"].as_i64().unwrap(),
    );
    assert!(
        got == want || got == want - 1,
        "{got} steps, truth {want}\n{}",
        r.card
    );
    check_phases(
        "lightning",
        &r,
        &["forward", "backward", "optimizer"],
        &mut failures,
    );
    assert!(failures.is_empty(), "{failures:#?}\n{}", r.card);
}

/// Checks of issue 22 on a training run: steps within ±1 of the optimizer steps the truth
/// counted, the truth's verdict, the training input share within 0.01 of the truth's, and the
/// evaluation the truth saw (none: 0 segments; else its share of the run's wall time within
/// 0.05, the truth's evaluation wall over the run's attached wall time).
fn check_loop_structure(label: &str, r: &Run, failures: &mut Vec<String>) {
    let s = &r.summary;
    let steps = s["steps"]["count"].as_i64().unwrap();
    let opt = r.truth["counts"]["optimizer_steps"].as_i64().unwrap();
    if (steps - opt).abs() > 1 {
        failures.push(format!("{label}: {steps} steps, {opt} optimizer steps"));
    }
    let got = s["primary_diagnosis"]["kind"].as_str().unwrap_or("?");
    let want = truth_verdicts(r, label);
    if !want.contains(got) {
        failures.push(format!(
            "{label}: verdict {got}, the truth's shares give {want:?}"
        ));
    }
    let share = s["phases"]["input_wait"]["share"]
        .as_f64()
        .unwrap_or(f64::NAN);
    let truth_input = truth_share(r, "input_wait");
    if (share - truth_input).abs() > 0.01 {
        failures.push(format!(
            "{label}: training input share {share:.3}, truth {truth_input:.3}"
        ));
    }
    let micro = r.truth["counts"]["micro_batches_per_step"]
        .as_f64()
        .unwrap_or(1.0);
    let got_micro = s["steps"]["micro_batches"]["mean"]
        .as_f64()
        .unwrap_or(f64::NAN);
    if (got_micro - micro).abs() > 0.1 {
        failures.push(format!(
            "{label}: {got_micro} micro-batches per step, truth {micro}"
        ));
    }
    let e = &s["evaluation"];
    let truth_eval = r.truth["evaluation"]["wall_ns"].as_f64().unwrap_or(0.0) / 1e9;
    let segments = e["segments"].as_u64().unwrap();
    if truth_eval == 0.0 {
        if segments != 0 {
            failures.push(format!("{label}: {segments} evaluation segments, none ran"));
        }
    } else {
        let run_s = s["run"]["duration_s"].as_f64().unwrap();
        let (got, want) = (
            e["share_of_wall"].as_f64().unwrap_or(f64::NAN),
            truth_eval / run_s,
        );
        if (got - want).abs() > 0.05 {
            failures.push(format!(
                "{label}: evaluation {got:.3} of wall time, truth {want:.3} ({truth_eval:.2} s of {run_s:.2} s)"
            ));
        }
        let want_segments = r.truth["evaluation"]["segments"].as_u64().unwrap();
        if segments != want_segments {
            failures.push(format!(
                "{label}: {segments} evaluation segments, truth {want_segments}"
            ));
        }
        if !r.card.contains("EVAL ") {
            failures.push(format!("{label}: the card has no EVAL line"));
        }
    }
}

/// HF `Trainer` with gradient_accumulation_steps=4: one step per optimizer step (not per
/// micro-batch), COMPUTE-BOUND as the truth, 4 micro-batches each.
#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn hf_trainer_gradient_accumulation_counts_optimizer_steps() {
    let Some(r) = run("hf_trainer", "accum", 40) else {
        return;
    };
    let mut failures = Vec::new();
    check_loop_structure("hf accum", &r, &mut failures);
    assert!(failures.is_empty(), "{failures:#?}\n{}", r.card);
}

/// HF `Trainer` evaluating every 10 steps on slow evaluation data: the evaluation is its own
/// segment with its share of the wall time, the training verdict the training steps'.
#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn hf_trainer_evaluation_is_a_segment_not_input_wait() {
    let Some(r) = run("hf_trainer", "eval", 60) else {
        return;
    };
    let mut failures = Vec::new();
    check_loop_structure("hf eval", &r, &mut failures);
    let findings = r.summary["findings"].as_array().unwrap();
    let eval_share = r.summary["evaluation"]["share_of_wall"]
        .as_f64()
        .unwrap_or(0.0);
    let named = findings.iter().any(|f| {
        f["kind"] == "EVALUATION_HEAVY"
            && f["why"]
                .as_str()
                .is_some_and(|w| w.contains("its DataLoader is input-bound"))
    });
    if eval_share >= traceml_daemon::diagnosis::EVALUATION_SHARE && !named {
        failures.push(format!(
            "no EVALUATION_HEAVY finding naming its DataLoader: {findings:?}"
        ));
    }
    assert!(failures.is_empty(), "{failures:#?}\n{}", r.card);
}

/// Lightning with accumulate_grad_batches=4: one step per optimizer step, 4 micro-batches each
/// (Lightning's fetcher prefetches a batch ahead: no step is split by it).
#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn lightning_gradient_accumulation_counts_optimizer_steps() {
    let Some(r) = run("lightning_train", "accum", 30) else {
        return;
    };
    let mut failures = Vec::new();
    check_loop_structure("lightning accum", &r, &mut failures);
    assert!(failures.is_empty(), "{failures:#?}\n{}", r.card);
}

/// Lightning validating every 10 batches on slow validation data: validation is evaluation,
/// the training verdict the training steps'.
#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn lightning_validation_is_a_segment_not_input_wait() {
    let Some(r) = run("lightning_train", "val", 60) else {
        return;
    };
    let mut failures = Vec::new();
    check_loop_structure("lightning val", &r, &mut failures);
    assert!(failures.is_empty(), "{failures:#?}\n{}", r.card);
}

/// A hand-written loop accumulating 4 micro-batches per optimizer step.
#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn plain_loop_manual_accumulation_counts_optimizer_steps() {
    let Some(r) = run("plain_loop", "accum", 30) else {
        return;
    };
    let mut failures = Vec::new();
    check_loop_structure("plain accum", &r, &mut failures);
    assert!(failures.is_empty(), "{failures:#?}\n{}", r.card);
}

/// A hand-written loop with a `torch.no_grad()` evaluation every 10 steps, and one whose
/// evaluation only calls `model.eval()` (autograd on, no backward): both are evaluation.
#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn plain_loop_evaluation_with_and_without_no_grad_is_a_segment() {
    let mut failures = Vec::new();
    for mode in ["nograd_eval", "evalmode_eval"] {
        let Some(r) = run("plain_loop", mode, 60) else {
            return;
        };
        check_loop_structure(mode, &r, &mut failures);
        if !failures.is_empty() {
            failures.push(r.card.clone());
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
