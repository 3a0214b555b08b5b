//! The shipped Prometheus rules (packaging/prometheus/traceml-rules.yml): `promtool check rules`
//! accepts them, `promtool test rules` runs their unit tests
//! (packaging/prometheus/traceml-rules.test.yml: a straggler on the second node, a two-rank
//! job, a hang, an input-bound job, and the jobs that must not alert), and every `traceml_*`
//! series they read is one the exporter writes. Needs `/usr/bin/promtool` (Debian's
//! `prometheus` package; `cargo xtask setup` installs it): without it the test is skipped, and
//! fails under `TRACEML_REQUIRE_ROOT` (`cargo xtask test`).
mod support;

use std::process::Command;

use support::*;

const PROMTOOL: &str = "/usr/bin/promtool";

fn promtool(args: &[&str]) {
    let dir = workspace().join("packaging/prometheus");
    let o = Command::new(PROMTOOL)
        .args(args)
        .current_dir(&dir)
        .output()
        .expect("run promtool");
    assert!(
        o.status.success(),
        "promtool {args:?}:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn promtool_checks_and_tests_the_shipped_rules() {
    if !tool_or_skip(PROMTOOL, "prometheus") {
        return;
    }
    promtool(&["check", "rules", "traceml-rules.yml"]);
    promtool(&["test", "rules", "traceml-rules.test.yml"]);
}

/// Every `traceml_*` series the rules read (a metric name, not a recorded `traceml:` rule) is in
/// the exposition of a rank with every value known (and of its job's straggler class).
#[test]
fn the_rules_read_only_exported_series() {
    use traceml_daemon::metrics::{Exporter, JobLabels, RankValues};
    let mut e = Exporter::default();
    e.attached(
        "j",
        "0",
        JobLabels {
            job_id: Some("id".into()),
            node: "n".into(),
            ..Default::default()
        },
    );
    e.update(
        "j",
        "0",
        RankValues {
            steps: 1,
            step_buckets: vec![0; 17],
            phase_seconds: traceml_daemon::phase::Phase::ALL
                .iter()
                .map(|&p| (p, 0.0))
                .collect(),
            step_median_seconds: Some(0.1),
            last_step_end_unix: Some(1.0),
            in_collective: Some(false),
            ..Default::default()
        },
    );
    // A job-level series: written for a job whose verdict classified a straggler.
    e.set_stragglers(
        "j",
        Some(&traceml_daemon::summary::Stragglers {
            class: traceml_daemon::summary::StragglerClass::Transient,
            rank: Some(0),
            steps: 100,
            slow_share: 0.2,
            episodes: Vec::new(),
            lost_ms: 5000.0,
            from_runs: false,
        }),
    );
    // And one whose ranks' ledgers were joined.
    e.set_collectives(
        "j",
        Some(&traceml_daemon::summary::CollectiveWaits {
            compared: 10,
            ..Default::default()
        }),
    );
    let text = e.encode();
    let rules = std::fs::read_to_string(workspace().join("packaging/prometheus/traceml-rules.yml"))
        .unwrap();
    let code: String = rules
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let mut names: Vec<&str> = code
        .match_indices("traceml_")
        .map(|(i, _)| {
            let rest = &code[i..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect();
    names.sort();
    names.dedup();
    assert!(names.len() >= 5, "{names:?}");
    for n in names {
        assert!(
            text.lines().any(|l| l.starts_with(n)),
            "the rules read {n}, which the exporter does not write:\n{text}"
        );
    }
}
