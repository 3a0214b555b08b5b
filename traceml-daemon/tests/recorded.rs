//! Tests on recorded runs (tests/fixtures/recordings, made by tests/fixtures/record.sh from the
//! ground-truth scenarios): no root needed. Each recording is replayed into a summary and its
//! card and JSON are compared with reviewed snapshots; the replayed phases are checked against
//! the run's truth file; and compare is checked on real pairs: an input-bound run against its
//! fix must be an IMPROVEMENT that names input_wait.
use std::path::PathBuf;

use traceml_daemon::compare::{self, CompareVerdict as Verdict};
use traceml_daemon::summary::Summary;
use traceml_daemon::{analysis, record, render};

const SCENARIOS: [&str; 8] = [
    "input_bound_single",
    "input_bound_fixed",
    "input_bound_workers",
    "input_bound_ipc",
    "h2d_bound",
    "compute_bound",
    "residual_heavy",
    "balanced",
];

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/recordings")
}

fn summary(name: &str) -> Summary {
    let rec = record::read(&fixtures().join(format!("{name}.jsonl.gz"))).expect("recording");
    assert!(!rec.truncated_tail, "{name}: complete recording");
    analysis::analyze(&rec.items)
}

fn truth(name: &str) -> serde_json::Value {
    let text =
        std::fs::read_to_string(fixtures().join(format!("{name}.truth.json"))).expect("truth");
    serde_json::from_str(&text).expect("truth json")
}

#[test]
fn cards_and_json_of_recorded_runs() {
    for name in SCENARIOS {
        let s = summary(name);
        let mut card = Vec::new();
        render::render_card(&s, &mut card, false).unwrap();
        let card = String::from_utf8(card).unwrap();
        // Every line within the card's width, at 100 columns and at 80.
        let over = render::lines_wider_than(&card, render::WIDTH);
        assert!(
            over.is_empty(),
            "{name}: over {} columns: {over:#?}",
            render::WIDTH
        );
        // No prose item (a labelled line, a "· " item) over 2 lines at 100 columns.
        let long = render::prose_longer_than(&card, 2);
        assert!(
            long.is_empty(),
            "{name}: prose over 2 lines: {long:#?}\n{card}"
        );
        let mut narrow = Vec::new();
        render::render_card_width(&s, &mut narrow, false, render::MIN_WIDTH).unwrap();
        let narrow = String::from_utf8(narrow).unwrap();
        let over = render::lines_wider_than(&narrow, render::MIN_WIDTH);
        assert!(
            over.is_empty(),
            "{name}: over {} columns: {over:#?}",
            render::MIN_WIDTH
        );
        insta::assert_snapshot!(format!("card_{name}"), card);
        let mut json = Vec::new();
        render::render_json(&s, &mut json).unwrap();
        let json = String::from_utf8(json).unwrap();
        // The JSON reads back to the same summary.
        let back = Summary::from_json(&json).unwrap();
        insta::assert_snapshot!(format!("json_{name}"), json);
        assert_eq!(back.steps.count, s.steps.count, "{name}");
    }
}

/// The replayed summaries agree with what each workload says it did: steps exact, phase
/// medians within max(1 ms, 10 %), never 0 for a phase whose truth is over 1 ms.
#[test]
fn recorded_runs_match_their_truth() {
    let mut failures = Vec::new();
    for name in SCENARIOS {
        let s = summary(name);
        let t = truth(name);
        if u64::from(s.steps.count) != t["step_count"].as_u64().unwrap() {
            failures.push(format!(
                "{name}: {} steps, truth {}",
                s.steps.count, t["step_count"]
            ));
        }
        for p in traceml_daemon::phase::Phase::ALL {
            // Single-process truth has no collective_wait: none happened.
            let want = t["median_phases_ns"][p.name()].as_f64().unwrap_or(0.0) / 1e6;
            let got = s.phases[p].median_ms.unwrap_or(f64::NAN);
            let tol = (want * 0.10).max(1.0);
            // A phase the loop spent over 1 ms in is never 0.
            let within = (got - want).abs() <= tol && (want <= 1.0 || got > 0.0);
            if !within {
                failures.push(format!(
                    "{name}: {} {got:.2} ms, truth {want:.2} ms",
                    p.name()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn input_bound_run_against_its_fix_is_an_improvement_naming_input_wait() {
    let before = summary("input_bound_single");
    let after = summary("input_bound_fixed");
    let c = compare::compare(&before, &after);
    assert_eq!(c.verdict, Verdict::Improvement, "{c:?}");
    assert!(
        c.reason.contains("input_wait"),
        "the reason names the input phase: {}",
        c.reason
    );
    assert_eq!(compare::exit_code(&c), 0);
    // The bound moved: fixing input bought A ~9× and buys B little.
    let w = c
        .what_if
        .iter()
        .find(|w| w.phase == traceml_daemon::phase::Phase::InputWait)
        .expect("input_wait what-if in the comparison");
    assert!(
        w.a_factor.unwrap() > 5.0 && w.b_factor.is_none_or(|f| f < 1.5),
        "{w:?}"
    );
    let mut text = Vec::new();
    render::render_compare_text(&c, &mut text).unwrap();
    insta::assert_snapshot!(
        "compare_input_bound_vs_fixed",
        String::from_utf8(text).unwrap()
    );

    // The other way round it is a regression, and the exit status says so.
    let c = compare::compare(&after, &before);
    assert_eq!(c.verdict, Verdict::Regression, "{c:?}");
    assert_eq!(compare::exit_code(&c), 1);
}

#[test]
fn a_run_against_itself_is_equivalent() {
    let s = summary("balanced");
    let c = compare::compare(&s, &s);
    assert_eq!(c.verdict, Verdict::Equivalent, "{c:?}");
}

/// What fixing it buys, against the fix itself. These recordings carry no stack samples, so
/// the input what-if is the upper bound (input wait → 0): the fixed run, by its own timers, can
/// be no faster than it (2 % for noise between runs), and no slower than it plus the input
/// wait the fix left (the fixed run's own truth: its samples still take 0.2 ms each).
#[test]
fn input_bound_what_if_brackets_the_fixed_runs_measured_step() {
    let before = summary("input_bound_single");
    let w = before
        .what_if
        .first()
        .expect("an input-bound run has a what-if");
    assert_eq!(w.phase, traceml_daemon::phase::Phase::InputWait, "{w:?}");
    assert!(w.assumption.contains("upper bound"), "{w:?}");
    let fixed = truth("input_bound_fixed");
    let steps = fixed["steps"].as_array().unwrap();
    let mean = |f: &dyn Fn(&serde_json::Value) -> f64| {
        steps.iter().map(f).sum::<f64>() / steps.len() as f64 / 1e6
    };
    let wall = mean(&|s| s["wall_ns"].as_f64().unwrap());
    let input = mean(&|s| s["phases_ns"]["input_wait"].as_f64().unwrap());
    eprintln!(
        "what-if {:.3} ms per step; the fixed run measured {wall:.3} ms, {input:.3} ms of it \
         input wait",
        w.step_ms_if
    );
    assert!(w.step_ms_if <= wall * 1.02, "{} vs {wall}", w.step_ms_if);
    assert!(
        w.step_ms_if >= (wall - input) * 0.98,
        "{} vs {}",
        w.step_ms_if,
        wall - input
    );
    // The step it starts from is the one the run before measured.
    let own: Vec<f64> = truth("input_bound_single")["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["wall_ns"].as_f64().unwrap() / 1e6)
        .collect();
    let own = own.iter().sum::<f64>() / own.len() as f64;
    assert!(
        (w.step_ms - own).abs() / own <= 0.05,
        "{} vs {own}",
        w.step_ms
    );
}
