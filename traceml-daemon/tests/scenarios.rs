//! The ground-truth scenario suite (issue 3): each workload in tests/workloads knows what it did
//! per step and writes it to a truth file; the daemon, attached by pid, must find the same steps
//! and phases. Checked: step count exact; each phase's median within max(1 ms, 10 %) of the
//! truth's median, and never 0 for a phase whose truth is over 1 ms; the verdict; where the
//! GPU waits, by line (`truth.waits`: the line of the loop's `loss.item()` or `out.cpu()` that
//! held the most time, named first in `phases.gpu_wait.wait_sites`). Run on every pyenv CPython
//! 3.9–3.13 with the stand-in CUDA runtime, and with real PyTorch on CPU for the input-bound,
//! residual-heavy and balanced loops.
//!
//! The expected verdict is what the published rules (docs/summary-schema.md, written out in
//! `support::published_verdict`, not read from the daemon) give on *this run's* truth: its phase
//! shares of step time, not the verdict the workload was designed for. On a busy machine a loop's real shares move; the daemon must follow them.
//! A run whose truth sits within [`SHARE_MARGIN`] of a decision line may get the verdict of
//! either side. The truth's shares are read over the steps the daemon's shares cover (it leaves
//! the steps taken under its learning probe set out): on a busy machine those first steps are
//! slower than the rest, and over all steps the truth's shares moved by up to 3 points. When the
//! truth left its designed band, the test says so (stderr) and goes on.
mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::*;
use traceml_daemon::phase::Phase;

const PHASES: [&str; 7] = [
    "input_wait",
    "h2d",
    "forward",
    "backward",
    "optimizer",
    "gpu_wait",
    "residual",
];

/// How far the daemon's share of a phase (or of compute) may sit from the truth's before the
/// verdict must be the truth's: replayed recordings of the scenarios stay within 1 point for
/// input_wait, h2d and residual and 0.6 for compute (tests/fixtures/recordings).
const SHARE_MARGIN: f64 = 0.02;

/// A line on stderr past the test harness's capture: shown even when the test passes.
fn note(msg: String) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "note: {msg}");
}

/// The truth's designed verdict names → the daemon's diagnosis kinds.
fn expected_kind(truth_verdict: &str) -> &'static str {
    match truth_verdict {
        "input_bound" => "INPUT_BOUND",
        "h2d_bound" => "H2D_BOUND",
        "gpu_bound" => "COMPUTE_BOUND",
        "residual_heavy" => "RESIDUAL_HEAVY",
        "balanced" => "BALANCED",
        other => panic!("unknown truth verdict {other}"),
    }
}

/// Tolerance of a phase median: max(1 ms, 10 % of the truth) (issue 39: a phase reported as 0 must
/// fail wherever the loop spent over 1 ms in it).
fn tolerance_ms(truth_ms: f64) -> f64 {
    (truth_ms * 0.10).max(1.0)
}

/// Mean of one per-step counter over the truth's steps the daemon's per-step means cover: all
/// but the first `steps.learning_excluded` (the steps run under the learning probe set), as
/// `support::truth_shares_over_daemon_steps` does for the shares. (Over all steps, a counter
/// that fires every 10th step matched only when 10 steps were left out.)
fn truth_step_mean(truth: &serde_json::Value, summary: &serde_json::Value, key: &str) -> f64 {
    let skip = summary["steps"]["learning_excluded"].as_u64().unwrap_or(0) as usize;
    let steps: Vec<f64> = truth["steps"]
        .as_array()
        .expect("truth steps")
        .iter()
        .skip(skip)
        .map(|st| st[key].as_f64().expect("numeric counter"))
        .collect();
    steps.iter().sum::<f64>() / steps.len() as f64
}

struct Checked {
    failures: Vec<String>,
    summary: serde_json::Value,
    truth: serde_json::Value,
}

/// Runs one workload under the daemon and compares the summary with its truth file.
fn run_scenario(
    py: &Path,
    script: &Path,
    args: &[&str],
    daemon_args: &[&str],
    label: &str,
    full: bool,
) -> Checked {
    run_scenario_env(py, script, args, daemon_args, label, full, &[])
}

/// [`run_scenario`] with the workload's environment extended by `env`.
fn run_scenario_env(
    py: &Path,
    script: &Path,
    args: &[&str],
    daemon_args: &[&str],
    label: &str,
    full: bool,
    env: &[(&str, &str)],
) -> Checked {
    let dir = scratch(label);
    let truth_path = dir.join("truth.json");
    let mut cmd = Command::new(py);
    cmd.arg(script).arg("--truth").arg(&truth_path).args(args);
    cmd.envs(env.iter().copied());
    let mut target = spawn(cmd, &dir);
    let mut extra = vec!["--quiet"];
    extra.extend_from_slice(daemon_args);
    let out = run_daemon(&mut target, &dir, &extra, Duration::from_secs(120));
    let mut failures = Vec::new();
    if !out.status.success() {
        failures.push(format!("{label}: daemon failed: {}", out.stderr));
        return Checked {
            failures,
            summary: out.summary,
            truth: serde_json::Value::Null,
        };
    }
    let truth: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&truth_path).unwrap_or_else(|e| panic!("{label}: truth: {e}")),
    )
    .unwrap();
    let s = &out.summary;
    // The card (issue 56): every line within 100 columns, no prose item over 2 lines.
    let card = std::fs::read_to_string(dir.join("out/final_summary.txt")).unwrap_or_default();
    let wide = traceml_daemon::render::lines_wider_than(&card, traceml_daemon::render::WIDTH);
    let long = traceml_daemon::render::prose_longer_than(&card, 2);
    if card.is_empty() || !wide.is_empty() || !long.is_empty() {
        failures.push(format!(
            "{label}: card over 100 columns {wide:#?}, prose over 2 lines {long:#?}\n{card}"
        ));
    }
    let steps = s["steps"]["count"].as_u64().unwrap_or(0);
    let truth_steps = truth["step_count"].as_u64().unwrap();
    if steps != truth_steps {
        failures.push(format!("{label}: {steps} steps, truth {truth_steps}"));
    }
    let shares = truth_shares_over_daemon_steps(&truth, s);
    let truth_steps_u32 = u32::try_from(truth_steps).unwrap_or(u32::MAX);
    let want = published_verdict(&shares, truth_steps_u32);
    let accepted = verdicts_near_by(SHARE_MARGIN, &shares, truth_steps_u32);
    let shown: Vec<String> = shares
        .iter()
        .map(|(p, v)| format!("{} {:.1}%", p.name(), v * 100.0))
        .collect();
    let designed = expected_kind(truth["expected_verdict"].as_str().unwrap());
    if designed != want {
        note(format!(
            "{label}: designed {designed}, but this run's own shares ({}) give {want}: the \
             machine was busy; the daemon is held to {want}",
            shown.join(", ")
        ));
    }
    let got = s["primary_diagnosis"]["kind"].as_str().unwrap_or("?");
    if !accepted.contains(got) {
        failures.push(format!(
            "{label}: verdict {got}, truth {want} (accepted {accepted:?}; truth shares {}; why: {})",
            shown.join(", "),
            s["primary_diagnosis"]["why"]
        ));
    } else if got != want {
        note(format!(
            "{label}: verdict {got}, truth {want}: within {:.0} points of the line ({})",
            SHARE_MARGIN * 100.0,
            shown.join(", ")
        ));
    }
    // Real torch (not `full`): input_wait and the model phases against the loop's own timers
    // (forward = the model call and the loss, backward = `loss.backward()`, optimizer =
    // `opt.step()`); its h2d, gpu_wait and residual are not clocked apart.
    let phases: &[&str] = if full {
        &PHASES
    } else {
        &["input_wait", "forward", "backward", "optimizer"]
    };
    for phase in phases {
        let truth_ms = truth["median_phases_ns"][phase].as_f64().unwrap() / 1e6;
        let got_ms = s["phases"][phase]["median_ms"].as_f64().unwrap_or(f64::NAN);
        let tol = tolerance_ms(truth_ms);
        // NaN (phase missing from the summary) must fail too, and so must 0 for a phase the
        // loop spent over 1 ms in.
        let within = (got_ms - truth_ms).abs() <= tol && (truth_ms <= 1.0 || got_ms > 0.0);
        if !within {
            failures.push(format!(
                "{label}: {phase} median {got_ms:.2} ms, truth {truth_ms:.2} ms (± {tol:.2})"
            ));
        }
    }
    if full {
        // The stand-in runtime counts what each step did: per-step means must match.
        for (field, key) in [
            ("h2d_bytes_per_step", "bytes_h2d"),
            ("d2h_bytes_per_step", "bytes_d2h"),
            ("launches_per_step", "launches"),
            ("syncs_per_step", "syncs"),
        ] {
            let want = truth_step_mean(&truth, s, key);
            let got = s["cuda"][field].as_f64().unwrap_or(f64::NAN);
            let within = (got - want).abs() <= want.abs() * 0.005 + 1e-9;
            if !within {
                failures.push(format!("{label}: cuda.{field} {got}, truth {want}"));
            }
        }
        check_wait_site(label, s, &truth, &mut failures);
        check_handover(label, s, &truth, &mut failures);
        check_switches(label, s, &truth, &mut failures);
        check_workers(label, s, &truth, &mut failures);
        check_step_groups(label, s, &truth, &mut failures);
    }
    Checked {
        failures,
        summary: out.summary,
        truth,
    }
}

/// Where the loop's own step times fall into two groups (the published rule,
/// `stats::two_groups`, on the truth's wall times: 2 workers delivering in pairs), the summary
/// names two groups whose counts and typical times are within 10 % of the truth's groups'.
fn check_step_groups(
    label: &str,
    s: &serde_json::Value,
    truth: &serde_json::Value,
    failures: &mut Vec<String>,
) {
    let walls: Vec<f64> = truth["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|st| st["wall_ns"].as_f64().unwrap() / 1e6)
        .collect();
    let Some((lo, hi)) = traceml_daemon::stats::two_groups(&walls) else {
        return;
    };
    // Held only where the truth's groups are clear of the rule's lines (twice its gap ratio and
    // spread): near them the daemon's own measure of the steps may fall either way.
    use traceml_daemon::stats::quantile;
    let iqr = |g: &[f64]| quantile(g, 0.75).unwrap_or(0.0) - quantile(g, 0.25).unwrap_or(0.0);
    let (top, bottom) = (lo[lo.len() - 1], hi[0]);
    let clear = bottom >= 2.0 * traceml_daemon::stats::GROUP_GAP_RATIO * top
        && bottom - top >= 2.0 * traceml_daemon::stats::GROUP_GAP_SPREADS * iqr(&lo).max(iqr(&hi));
    if !clear {
        note(format!(
            "{label}: the loop's steps form two groups near the rule's lines: not held"
        ));
        return;
    }
    let groups = s["step_ms"]["groups"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let want = [
        (hi.len(), median(hi.clone())),
        (lo.len(), median(lo.clone())),
    ];
    let got: Vec<(u64, f64)> = groups
        .iter()
        .map(|g| {
            (
                g["count"].as_u64().unwrap_or(0),
                g["typical_ms"].as_f64().unwrap_or(0.0),
            )
        })
        .collect();
    let close = |a: f64, b: f64| (a - b).abs() <= 0.10 * b;
    let ok = got.len() == 2
        && got
            .iter()
            .zip(want)
            .all(|(&(n, t), (wn, wt))| close(n as f64, wn as f64) && close(t, wt));
    note(format!(
        "{label}: step groups {got:?}, truth (count, typical ms) {want:?}"
    ));
    if !ok {
        failures.push(format!(
            "{label}: step groups {got:?}, truth (count, typical ms) {want:?}"
        ));
    }
}

/// The daemon's worker count against the DataLoader's own (`truth.worker_pids`): the workload
/// also runs two children that are not workers through its loop (a `tail --pid` and a `python -c`,
/// as `torch.compile`'s g++ and compile-worker pool are), which must not be counted.
fn check_workers(
    label: &str,
    s: &serde_json::Value,
    truth: &serde_json::Value,
    failures: &mut Vec<String>,
) {
    let want = truth["worker_pids"].as_array().map(Vec::len);
    let others = truth["other_children"].as_array().map_or(0, Vec::len);
    assert_eq!(others, 2, "{label}: the workload started no other children");
    let got = s["workers"]["count"].as_u64().map(|n| n as usize);
    if got != want {
        failures.push(format!(
            "{label}: workers.count {got:?}, truth {want:?} DataLoader workers (and {others} \
             other children that are not workers)"
        ));
    }
}

/// The thread-state program's runs the daemon costs (`daemon_overhead.hits_per_step.switches`)
/// against the training thread's own context switches over the loop (`truth.thread_switches`,
/// from its /proc status): each switch is one run as it leaves its CPU and one as it comes
/// back. The daemon's count also holds the switches from its attach to the loop's start (the
/// workload polls for the ready file) and after the loop's end, so it may be higher. Measured
/// over the suite: 2.00–2.30 runs a switch on CPython 3.11–3.13, but as low as 1.39 on 3.9 and
/// 3.10 in the scenarios with worker processes (input_bound_ipc/workers/mixed; three clean-clone
/// CI runs on 2026-12-07: 0.69–1.23 × the truth, `input_bound_ipc-310` lowest; not explained
/// yet: issue 40's note), and on 3.11 as low as 0.68 × in `input_bound_workers` while other
/// builds kept the host's cores busy (2026-12-08: 0.68 and 0.71 in two of three runs, 1.05–1.07
/// on a quiet host), as high as 1.45 × in `input_bound_ipc-310` in a fresh clone's CI run. Held
/// within [0.5, 2.0] × twice the truth per step, plus 2 a step: what it is for — a program that
/// stopped counting (0), or one that counted every switch of the node (many times the thread's)
/// — fails; the unexplained swing between runs does not.
fn check_switches(
    label: &str,
    s: &serde_json::Value,
    truth: &serde_json::Value,
    failures: &mut Vec<String>,
) {
    let Some(switches) = truth["thread_switches"].as_f64() else {
        failures.push(format!(
            "{label}: the truth has no thread_switches (no /proc status?)"
        ));
        return;
    };
    let steps = truth["step_count"].as_f64().unwrap_or(0.0).max(1.0);
    let want = 2.0 * switches / steps;
    let got = s["daemon_overhead"]["hits_per_step"]["switches"]
        .as_f64()
        .unwrap_or(f64::NAN);
    note(format!(
        "{label}: thread-state runs {got:.2} a step, truth 2 × {:.2} switches a step",
        switches / steps
    ));
    if !(got >= 0.5 * want && got <= 2.0 * want + 2.0) {
        failures.push(format!(
            "{label}: thread-state program runs {got:.2} a step, truth {want:.2} (2 × the \
             training thread's {switches} context switches over {steps} steps; held within \
             0.5 × and 2 × that + 2)"
        ));
    }
}

/// Where the GPU waits, by line: the loop's wait with the most time (`truth.waits`: the line of
/// `loss.item()` or `out.cpu()` in groundtruth.py), when it holds 10 % of the run or more (at
/// 100 stack samples a second, enough to name it), is the daemon's first wait site, with a
/// share of the waits' samples within 0.15 below the truth's share of the waits' time.
fn check_wait_site(
    label: &str,
    s: &serde_json::Value,
    truth: &serde_json::Value,
    failures: &mut Vec<String>,
) {
    let Some(waits) = truth["waits"].as_array().filter(|w| !w.is_empty()) else {
        return;
    };
    let ns = |w: &serde_json::Value| w["ns"].as_f64().unwrap_or(0.0);
    let top = waits
        .iter()
        .max_by(|a, b| ns(a).total_cmp(&ns(b)))
        .expect("non-empty");
    let wall = truth["totals"]["wall_ns"].as_f64().unwrap_or(f64::INFINITY);
    if ns(top) / wall < 0.10 {
        return;
    }
    let truth_share = ns(top) / waits.iter().map(ns).sum::<f64>();
    let (file, line) = (top["file"].as_str(), top["line"].as_u64());
    let site = &s["phases"]["gpu_wait"]["wait_sites"][0];
    let share = site["share"].as_f64().unwrap_or(0.0);
    let named = site["file"].as_str() == file && site["line"].as_u64() == line;
    note(format!(
        "{label}: gpu_wait's first line {}:{} ({:.0} % of the waits' samples, {}), truth {}:{}          `{}` ({:.0} % of the waits' time, {:.0} % of the run)",
        site["file"],
        site["line"],
        share * 100.0,
        site["api"],
        file.unwrap_or("?"),
        line.unwrap_or(0),
        top["statement"].as_str().unwrap_or("?"),
        truth_share * 100.0,
        ns(top) / wall * 100.0
    ));
    if !named || share < truth_share - 0.15 {
        failures.push(format!(
            "{label}: gpu_wait's first line {}:{} (share {share:.2}), truth {}:{} `{}` (share              {truth_share:.2}); sites: {}",
            site["file"],
            site["line"],
            file.unwrap_or("?"),
            line.unwrap_or(0),
            top["statement"].as_str().unwrap_or("?"),
            s["phases"]["gpu_wait"]["wait_sites"]
        ));
    }
}

/// The hand-over against the workload's clocks: the share of the input wait the training process
/// spent unpickling the workers' Records (each step's `handover_ns` over its input wait) within
/// 0.10 of the daemon's `workers.profile.ipc`; where the truth has Records, the bound `ipc`, the
/// function the truth names (`rebuild_record`) first among the hand-over's and a Next line that
/// names it and says more workers will not help (a truth over 0.6 of the wait; under 0.4 the
/// bound must not be `ipc`). A loader with workers and no Records has a
/// hand-over of about 0 (its batches are tiny), held to the same 0.10.
fn check_handover(
    label: &str,
    s: &serde_json::Value,
    truth: &serde_json::Value,
    failures: &mut Vec<String>,
) {
    let p = &s["workers"]["profile"];
    let records = truth["config"]["item_rebuild_ns"].as_u64().unwrap_or(0) > 0;
    if !records && !p["ipc"].is_number() {
        return;
    }
    let steps = truth["steps"].as_array().expect("truth steps");
    let sum = |f: &dyn Fn(&serde_json::Value) -> f64| steps.iter().map(f).sum::<f64>();
    let handover = sum(&|st| st["handover_ns"].as_f64().unwrap_or(0.0));
    let wait = sum(&|st| st["phases_ns"]["input_wait"].as_f64().unwrap_or(0.0));
    let want = if wait > 0.0 { handover / wait } else { 0.0 };
    let got = p["ipc"].as_f64();
    let first = p["ipc_in"][0]["function"].as_str().unwrap_or("");
    let next = s["primary_diagnosis"]["next"].as_str().unwrap_or("");
    note(format!(
        "{label}: hand-over {got:?} of the input wait, truth {want:.3}; bound {}; first {first}; \
         split {}",
        p["bound"], p["split"]
    ));
    match got {
        Some(g) if (g - want).abs() <= 0.10 => {}
        _ => failures.push(format!(
            "{label}: hand-over {got:?} of the input wait, truth {want:.3} (tolerance 0.10)"
        )),
    }
    // Far from the design's line (the hand-over limits the pipeline from half the wait): the
    // bound the truth gives.
    if records && want < 0.4 && p["bound"] == "ipc" {
        failures.push(format!(
            "{label}: pipeline bound ipc, truth {want:.2} of the wait in the hand-over"
        ));
    }
    if records && want > 0.6 {
        if p["bound"] != "ipc" {
            failures.push(format!("{label}: pipeline bound {}, truth ipc", p["bound"]));
        }
        if !first.ends_with("rebuild_record") {
            failures.push(format!(
                "{label}: the hand-over's first function {first}, truth rebuild_record"
            ));
        }
        if !(next.contains("rebuild_record") && next.contains("more workers will not help")) {
            failures.push(format!(
                "{label}: Next should name rebuild_record and say more workers will not help: \
                 {next}"
            ));
        }
    }
}

fn scenario_script(name: &str) -> std::path::PathBuf {
    workspace().join(format!("tests/workloads/{name}.py"))
}

fn suite(scenarios: &[&str], pythons: &[u32]) {
    if !root_or_skip() {
        return;
    }
    let _ = fake_cudart();
    let mut failures = Vec::new();
    for &minor in pythons {
        for name in scenarios {
            let label = format!("{name}-3{minor}");
            let c = run_scenario(
                &python(minor),
                &scenario_script(name),
                &[],
                &[],
                &label,
                true,
            );
            failures.extend(c.failures);
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches against ground truth:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

const ALL: [&str; 9] = [
    "input_bound_single",
    "input_bound_workers",
    "input_bound_ipc",
    "input_bound_mixed",
    "h2d_bound",
    "compute_bound",
    "gpu_wait_periodic",
    "residual_heavy",
    "balanced",
];

#[test]
fn scenarios_cpython_3_9() {
    suite(&ALL, &[9]);
}

#[test]
fn scenarios_cpython_3_10() {
    suite(&ALL, &[10]);
}

#[test]
fn scenarios_cpython_3_11() {
    suite(&ALL, &[11]);
}

#[test]
fn scenarios_cpython_3_12() {
    suite(&ALL, &[12]);
}

#[test]
fn scenarios_cpython_3_13() {
    suite(&ALL, &[13]);
}

/// The verdict a truth is held to, and the slack near a line (no root needed).
#[test]
fn verdicts_from_truth_shares() {
    let shares = |input: f64, residual: f64| {
        vec![
            (Phase::InputWait, input),
            (Phase::Residual, residual),
            (Phase::Forward, 1.0 - input - residual),
        ]
    };
    let one = |s: &[&'static str]| s.iter().copied().collect::<BTreeSet<_>>();
    assert_eq!(
        verdicts_near_by(SHARE_MARGIN, &shares(0.60, 0.02), 60),
        one(&["INPUT_BOUND"])
    );
    // Input 7 %, residual 6 %, compute 87 %: more than the margin from every line.
    assert_eq!(
        verdicts_near_by(SHARE_MARGIN, &shares(0.07, 0.06), 60),
        one(&["BALANCED"])
    );
    // Residual 9.5 %: balanced by the truth, residual-heavy within the margin.
    assert_eq!(published_verdict(&shares(0.07, 0.095), 60), "BALANCED");
    assert_eq!(
        verdicts_near_by(SHARE_MARGIN, &shares(0.07, 0.095), 60),
        one(&["BALANCED", "RESIDUAL_HEAVY"])
    );
    // Compute 89 %: balanced, or compute-bound within the margin.
    assert_eq!(
        verdicts_near_by(SHARE_MARGIN, &shares(0.055, 0.055), 60),
        one(&["BALANCED", "COMPUTE_BOUND"])
    );
    // Too few steps for any verdict.
    assert_eq!(
        verdicts_near_by(SHARE_MARGIN, &shares(0.6, 0.0), 3),
        one(&["INSUFFICIENT_DATA"])
    );
}

/// The daemon's rules are the published table: on a grid of shares (each bottleneck phase and the
/// compute sum at 0–40 % in 2.5-point steps, the rest idle) and step counts around the 5-step
/// minimum, `diagnosis::kind_for_shares` gives what `support::published_verdict` gives. The
/// scenario tests take their expectations from the table; this holds the code to it.
#[test]
fn the_rules_are_the_published_table() {
    use traceml_daemon::diagnosis::kind_for_shares;
    let grid: Vec<f64> = (0..=16).map(|i| f64::from(i) * 0.025).collect();
    let mut checked = 0;
    for &input in &grid {
        for &h2d in &grid {
            for &residual in &grid {
                let rest = 1.0 - input - h2d - residual;
                if rest < 0.0 {
                    continue;
                }
                for compute_of_rest in [0.5, 0.9, 1.0] {
                    let shares = [
                        (Phase::InputWait, input),
                        (Phase::H2d, h2d),
                        (Phase::Residual, residual),
                        (Phase::Forward, rest * compute_of_rest * 0.4),
                        (Phase::Backward, rest * compute_of_rest * 0.5),
                        (Phase::Optimizer, rest * compute_of_rest * 0.1),
                    ];
                    for steps in [4, 5, 60] {
                        assert_eq!(
                            kind_for_shares(&shares, steps).as_str(),
                            published_verdict(&shares, steps),
                            "{shares:?}, {steps} steps"
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 10_000, "{checked}");
    // The multi-rank tests' straggler lines are the published ones too.
    assert_eq!(
        traceml_daemon::ranks::STRAGGLER_WARNING,
        PUBLISHED_STRAGGLER_SCORE
    );
    assert_eq!(
        traceml_daemon::ranks::STRAGGLER_PERSISTENCE,
        PUBLISHED_STRAGGLER_PERSISTENCE
    );
}

/// What fixing it buys: an input-bound run's what-if for input_wait (its step if the batch were
/// ready when asked) within 10 % of that run's own step less its time in `__next__` (the
/// workload's timers), and within 10 % of the step that a rerun with the cause removed measures
/// by its own timers (`whatif_input` and `whatif_input_fixed`: the same model and loop, ~19 ms of
/// compute a step, samples ready in the fix). Both runs are read over their steady steps (each
/// summary's `steps.learning_excluded` first steps left out: an attach's learning period costs
/// the target a few ms of its first steps), and the fixed run's items still take 0.2 ms each,
/// which the what-if's assumption (the batch ready) removes: their own time, from the
/// workload's items log, comes off its step.
#[test]
fn input_bound_what_if_matches_the_fixed_rerun() {
    if !root_or_skip() {
        return;
    }
    let _ = fake_cudart();
    let py = python(11);
    // The mean of `per_step` (ms) over a run's steady steps (its first `learning_excluded` left
    // out).
    let steady = |c: &Checked, per_step: &dyn Fn(&serde_json::Value) -> f64| {
        let skip = c.summary["steps"]["learning_excluded"]
            .as_u64()
            .unwrap_or(0) as usize;
        let w: Vec<f64> = c.truth["steps"]
            .as_array()
            .expect("truth steps")
            .iter()
            .skip(skip)
            .map(|s| per_step(s) / 1e6)
            .collect();
        w.iter().sum::<f64>() / w.len().max(1) as f64
    };
    let wall = |s: &serde_json::Value| s["wall_ns"].as_f64().unwrap();
    let without_input =
        |s: &serde_json::Value| wall(s) - s["phases_ns"]["input_wait"].as_f64().unwrap();
    let steady_wall = |c: &Checked| steady(c, &wall);
    let steady_without_input = |c: &Checked| steady(c, &without_input);
    let before = run_scenario(
        &py,
        &scenario_script("whatif_input"),
        &[],
        &[],
        "whatif-before",
        false,
    );
    assert!(before.failures.is_empty(), "{:?}", before.failures);
    let w = &before.summary["what_if"][0];
    assert_eq!(w["phase"], "input_wait", "{}", before.summary["what_if"]);
    let predicted = w["step_ms_if"].as_f64().unwrap();
    let after = run_scenario(
        &py,
        &scenario_script("whatif_input_fixed"),
        &[],
        &[],
        "whatif-after",
        false,
    );
    // Only its own timers are read: the daemon's checks of that run are the suite's.
    assert!(after.truth.is_object(), "{:?}", after.failures);
    let log = after.truth["config"]["items_log"]
        .as_str()
        .expect("items_log");
    let items_ms: f64 = std::fs::read_to_string(log)
        .expect("items log")
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .sum::<f64>()
        / 1e6;
    let steps = after.truth["steps"]
        .as_array()
        .map_or(1, |v| v.len().max(1));
    let left_per_step = items_ms / steps as f64;
    let measured = steady_wall(&after) - left_per_step;
    let err = (predicted - measured).abs() / measured;
    note(format!(
        "what-if {} ({}): {predicted:.3} ms per step; the fixed rerun measured {measured:.3} ms \
         over its steady steps less its items' {left_per_step:.3} ms ({:.1} % apart); the run \
         before measured {:.3} ms, {:.3} ms of it not waiting for input",
        w["change"],
        w["assumption"],
        err * 100.0,
        steady_wall(&before),
        steady_without_input(&before)
    ));
    // The daemon's number against the run it measured: the workload's own timers, the same
    // steps, its step less its time in `__next__`.
    let own = steady_without_input(&before);
    assert!(
        (predicted - own).abs() / own <= 0.10,
        "what-if {predicted:.3} ms, the run's own step less its input wait {own:.3} ms"
    );
    // Against the fix: two runs, so the machine's run-to-run swing is in the tolerance; with
    // ~19 ms of compute a step it is a few per cent. A what-if that kept the wait (~30 ms) or
    // dropped the compute is far outside it.
    assert!(
        err <= 0.10,
        "what-if {predicted:.3} ms, fixed rerun {measured:.3} ms (steady, less its items' \
         {left_per_step:.3} ms)"
    );
}

/// The input pipeline's own profile against what the workers did by their own clocks: two
/// workers that sleep in `__getitem__` (20 ms an item), two that burn 12 ms of CPU an item in
/// `decode_sample`, and two blocked reading a named pipe fed every 10 ms (the pipe's path and
/// its share of their time asleep against the truth's). Each item's wall time, time on a CPU and time runnable (the kernel's
/// schedstat, read by the worker) is the truth: the daemon's share of busy worker samples not
/// asleep (`on_cpu`, state R) within 0.10 of theirs, the function the truth names first, the
/// bound the design gives (asleep → wait, burning → cpu), every worker sampled, and a Next line
/// that names the function and a worker count.
#[test]
fn worker_profiles_name_what_the_workers_do() {
    if !root_or_skip() {
        return;
    }
    let _ = fake_cudart();
    let py = python(11);
    let mut failures = Vec::new();
    for (script, function, bound) in [
        ("input_bound_workers", "__getitem__", "wait"),
        ("input_bound_cpu_workers", "decode_sample", "cpu"),
        ("input_bound_reads", "__getitem__", "wait"),
    ] {
        let c = run_scenario(
            &py,
            &scenario_script(script),
            &[],
            &[],
            &format!("pipeline-{script}"),
            false,
        );
        failures.extend(c.failures.iter().cloned());
        let p = &c.summary["workers"]["profile"];
        assert!(
            p.is_object(),
            "{script}: no worker profile: {}",
            c.summary["workers"]
        );
        let log = c.truth["config"]["items_log"].as_str().expect("items_log");
        let (mut wall, mut run, mut wait, mut read, mut items) = (0.0, 0.0, 0.0, 0.0, 0u64);
        for line in std::fs::read_to_string(log).expect("items log").lines() {
            let v: Vec<f64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
            wall += v[1];
            run += v[2];
            wait += v[3];
            read += v[4];
            items += 1;
        }
        // What the blocked workers read: the truth's named pipe, its share of the items' time
        // asleep (their wall less their CPU and runnable time) the workers' time in read(2).
        if let Some(fifo) = c.truth["config"]["fifo_path"].as_str() {
            let truth_share = read / (wall - run - wait);
            let r = &p["reads_from"][0];
            let share = r["share"].as_f64().unwrap_or(0.0);
            note(format!(
                "{script}: blocked workers read {} ({}, {share:.3} of their blocked samples), \
                 truth {fifo} ({truth_share:.3} of their time asleep)",
                r["path"], r["kind"]
            ));
            if r["path"] != fifo || r["kind"] != "pipe" || (share - truth_share).abs() > 0.10 {
                failures.push(format!(
                    "{script}: reads_from {}, truth {fifo} (a pipe, share {truth_share:.3})",
                    p["reads_from"]
                ));
            }
            let next = c.summary["primary_diagnosis"]["next"]
                .as_str()
                .unwrap_or("");
            if !next.contains(fifo) || next.contains("overlaps the waits") {
                failures.push(format!(
                    "{script}: Next should name the pipe {fifo} and no worker count (its writer \
                     sets the pace): {next}"
                ));
            }
        }
        let truth_on = (run + wait) / wall;
        let on = p["on_cpu"].as_f64().unwrap();
        note(format!(
            "{script}: on CPU or runnable {on:.3} of busy samples, truth {truth_on:.3} ({items} \
             items: wall {:.0} ms, CPU {:.0} ms, runnable {:.0} ms); busy {:.3}; bound {}; top {}; \
             batch CPU {} ms; next: {}",
            wall / 1e6,
            run / 1e6,
            wait / 1e6,
            p["busy"],
            p["bound"],
            p["top_functions"][0]["function"],
            p["batch_cpu_ms"],
            c.summary["primary_diagnosis"]["next"]
        ));
        if (on - truth_on).abs() > 0.10 {
            failures.push(format!("{script}: on_cpu {on:.3}, truth {truth_on:.3}"));
        }
        let top = p["top_functions"][0]["function"].as_str().unwrap_or("");
        if !top.ends_with(function) {
            failures.push(format!("{script}: top function {top}, truth {function}"));
        }
        if p["bound"] != bound {
            failures.push(format!("{script}: bound {}, design {bound}", p["bound"]));
        }
        let workers = c.truth["worker_pids"].as_array().map_or(0, |w| w.len());
        if p["workers_sampled"].as_u64() != Some(workers as u64) {
            failures.push(format!(
                "{script}: {} workers sampled, truth {workers}",
                p["workers_sampled"]
            ));
        }
        // The Next line names the function, and a worker count unless no core is free: the
        // workers' own CPU over the loop (their clocks), plus one core for the training
        // process, against this machine's cores.
        let next = c.summary["primary_diagnosis"]["next"]
            .as_str()
            .unwrap_or("");
        let loop_ns =
            c.truth["loop_end_ns"].as_f64().unwrap() - c.truth["loop_start_ns"].as_f64().unwrap();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let free = cores - run / loop_ns - 1.0;
        let says = if bound == "cpu" && free < 1.0 {
            "more workers will not help"
        } else {
            // The knob with the count that keeps pace: `DataLoader(num_workers=21)`.
            "DataLoader(num_workers="
        };
        note(format!(
            "{script}: workers used {:.2} cores of {cores}: expect \"{says}\"",
            run / loop_ns
        ));
        let piped = c.truth["config"]["fifo_path"].is_string();
        let named = next.contains(function) && next.contains(says);
        if !piped && !named {
            failures.push(format!(
                "{script}: Next should name {function} and say \"{says}\": {next}"
            ));
        }
        // The workers' CPU per batch against their own: every item's CPU time over the batches.
        if bound == "cpu" {
            let batch = c.truth["config"]["batch_size"].as_f64().unwrap();
            let truth_ms = run / items as f64 * batch / 1e6;
            let got = p["batch_cpu_ms"].as_f64().unwrap_or(f64::NAN);
            if got.is_nan() || (got - truth_ms).abs() > 0.15 * truth_ms {
                failures.push(format!(
                    "{script}: batch CPU {got:.1} ms, truth {truth_ms:.1} ms (tolerance 15 %)"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Real PyTorch on CPU (real DataLoader, nn.Module, autograd, SGD): step count exact, input_wait
/// within tolerance, forward/backward/optimizer present and non-zero, the verdict its own truth
/// gives (see the module's doc).
#[test]
#[ignore = "real PyTorch: cargo xtask test runs it (--include-ignored)"]
fn real_pytorch_cpu() {
    if !root_or_skip() {
        return;
    }
    let py = std::env::var_os("TRACEML_TORCH_PYTHON")
        .expect("TRACEML_TORCH_PYTHON is not set: run through `cargo xtask test` (setup builds the torch venv)");
    let mut failures = Vec::new();
    for scenario in ["input_bound", "residual_heavy", "balanced"] {
        let c = run_scenario(
            Path::new(&py),
            &scenario_script("real_torch_train"),
            &["--scenario", scenario],
            &[],
            &format!("torch-{scenario}"),
            false,
        );
        failures.extend(c.failures);
    }
    assert!(
        failures.is_empty(),
        "{} mismatches against ground truth:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// `--launch-mode count`: launches are only counted in the kernel. The verdict and phases are
/// unchanged, launches per phase are unknown (null, never 0) and launches per step is the run's
/// average (the workload launches nothing outside its steps, so it equals the truth).
#[test]
fn launch_count_mode() {
    if !root_or_skip() {
        return;
    }
    let _ = fake_cudart();
    let c = run_scenario(
        &python(11),
        &scenario_script("compute_bound"),
        &[],
        &["--launch-mode", "count"],
        "count-mode",
        false,
    );
    let mut failures: Vec<String> = c
        .failures
        .into_iter()
        .filter(|f| !f.contains("not seen"))
        .collect();
    let s = &c.summary;
    for phase in PHASES {
        if !s["phases"][phase]["launches_per_step"].is_null() {
            failures.push(format!(
                "{phase}: launches per phase must be null in count mode"
            ));
        }
    }
    let truth_launches = truth_step_mean(&c.truth, s, "launches");
    let got = s["cuda"]["launches_per_step"].as_f64().unwrap_or(f64::NAN);
    // The whole-run average also holds the launches of the final partial step and the set-up.
    let within = (got - truth_launches).abs() <= truth_launches * 0.1;
    if !within {
        failures.push(format!("launches per step {got}, truth {truth_launches}"));
    }
    let notes = s["data_quality"]["notes"].to_string();
    if !notes.contains("launch-mode count") {
        failures.push(format!("no count-mode note: {notes}"));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Issue 52: every path to the GPU counted once. The workloads launch through the stand-in
/// runtime (which reaches the stand-in driver through `cuGetProcAddress` pointers, as the real
/// one does; `compute_bound` only so), through a vendor library with its own runtime copy (the
/// cuBLAS/cuDNN/NCCL shape: no `cu*` import, its own `cuGetProcAddress`'d `cuLaunchKernel`) and
/// through the Triton shape
/// (`dlsym("cuLaunchKernelEx")`); each layer counts its own launches (the truth's per-step
/// `launches_by_path`). The daemon's `cuda.launches_by_path` must equal them per step in event
/// mode (0.5 %) and in count mode (10 %: a whole-run average, set-up included), and the
/// vendor library must be named in `data_quality.own_runtime_libraries`.
#[test]
fn launches_by_path_match_the_workload_in_both_modes() {
    if !root_or_skip() {
        return;
    }
    let _ = fake_cudart();
    let mut failures = Vec::new();
    for scenario in [
        "compute_bound",
        "driver_paths_mixed",
        "driver_paths_vendor",
        "driver_paths_triton",
    ] {
        for (mode, daemon_args, tol) in [
            ("events", &["--launch-mode", "events"][..], 0.005),
            ("count", &["--launch-mode", "count"][..], 0.1),
        ] {
            let label = format!("{scenario}-{mode}");
            let c = run_scenario(
                &python(11),
                &scenario_script(scenario),
                &[],
                daemon_args,
                &label,
                mode == "events",
            );
            failures.extend(c.failures);
            let s = &c.summary;
            if c.truth.is_null() {
                continue;
            }
            let mut any_library = false;
            for path in ["runtime", "library", "direct"] {
                let skip = s["steps"]["learning_excluded"].as_u64().unwrap_or(0) as usize;
                let per: Vec<f64> = c.truth["steps"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .skip(skip)
                    .map(|st| st["launches_by_path"][path].as_f64().unwrap())
                    .collect();
                let want = per.iter().sum::<f64>() / per.len() as f64;
                any_library |= path == "library" && want > 0.0;
                let got = s["cuda"]["launches_by_path"][path]
                    .as_f64()
                    .unwrap_or(f64::NAN);
                if (got - want).abs() > want * tol + 1e-9 {
                    failures.push(format!(
                        "{label}: launches_by_path.{path} {got}, truth {want} (± {:.1} %)",
                        tol * 100.0
                    ));
                }
            }
            let own = s["data_quality"]["own_runtime_libraries"].to_string();
            if any_library != own.contains("libfakeblasLt.so.13") {
                failures.push(format!(
                    "{label}: own_runtime_libraries {own}, the vendor library launched: \
                     {any_library}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Issue 52: `cuGetProcAddress` handing out pointers that are not the exported functions
/// (`FAKECUDA_PROCADDR=internal`: the stand-in driver's internal implementations). The vendor
/// library initialises its own runtime copy after the daemon attached (at the loop's first
/// kernel), asks for its entry points, and launches through them: the daemon reads each pointer
/// at `cuGetProcAddress`'s return, places the driver probe there, and counts the library's
/// launches per step as the workload does (0.5 %, over the steps the means cover; in count mode
/// 10 %, a whole-run average). Followed
/// pointers are named in `data_quality.driver_pointers_followed`; with the exports handed out
/// (the default), none is.
#[test]
fn driver_pointers_that_are_not_exports_are_followed() {
    if !root_or_skip() {
        return;
    }
    let _ = fake_cudart();
    let mut failures = Vec::new();
    let internal = &[("FAKECUDA_PROCADDR", "internal")][..];
    for (label, env, daemon_args, tol) in [
        (
            "procaddr-internal",
            internal,
            &["--launch-mode", "events"][..],
            0.005,
        ),
        (
            "procaddr-internal-count",
            internal,
            &["--launch-mode", "count"][..],
            0.1,
        ),
        ("procaddr-exported", &[][..], &[][..], 0.005),
    ] {
        let c = run_scenario_env(
            &python(11),
            &scenario_script("driver_paths_vendor"),
            &[],
            daemon_args,
            label,
            !label.ends_with("count"),
            env,
        );
        failures.extend(c.failures);
        if c.truth.is_null() {
            continue;
        }
        let s = &c.summary;
        let want = truth_step_mean(&c.truth, s, "launches");
        let got = s["cuda"]["launches_by_path"]["library"]
            .as_f64()
            .unwrap_or(f64::NAN);
        if (got - want).abs() > want * tol {
            failures.push(format!(
                "{label}: library launches {got}/step, truth {want} (± {:.1} %)",
                tol * 100.0
            ));
        }
        let followed: Vec<String> = s["data_quality"]["driver_pointers_followed"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let internal = c.truth["cuda_stats"]["procaddr_internal"]
            .as_u64()
            .unwrap_or(0);
        if env.is_empty() {
            if !followed.is_empty() || internal != 0 {
                failures.push(format!(
                    "{label}: exports handed out ({internal} internal), yet followed {followed:?}"
                ));
            }
        } else if internal == 0 || !followed.iter().any(|f| f.starts_with("cuLaunchKernel+")) {
            failures.push(format!(
                "{label}: {internal} internal pointers handed out, followed {followed:?}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Issue 52: the existing ground-truth scenarios keep their gpu_wait, H2D and verdicts (every
/// check of the scenario suite) when their kernels go through the vendor library's own runtime
/// copy instead of the runtime (`FAKETORCH_LAUNCH_PATH=vendor`).
#[test]
fn scenarios_hold_when_kernels_go_through_a_vendor_library() {
    if !root_or_skip() {
        return;
    }
    let _ = fake_cudart();
    let mut failures = Vec::new();
    for scenario in ["compute_bound", "h2d_bound", "gpu_wait_periodic"] {
        let c = run_scenario_env(
            &python(11),
            &scenario_script(scenario),
            &[],
            &[],
            &format!("{scenario}-vendor"),
            true,
            &[("FAKETORCH_LAUNCH_PATH", "vendor")],
        );
        failures.extend(c.failures);
        let lib = c.summary["cuda"]["launches_by_path"]["library"]
            .as_f64()
            .unwrap_or(0.0);
        if lib <= 0.0 {
            failures.push(format!("{scenario}-vendor: no launch on the library path"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
