//! The comparison of two runs as text (≤ 100 columns) and JSON.
use std::io::{self, Write};

use super::{Painter, WIDTH, wrap_safe};
use crate::compare::{Change, CompareVerdict, Comparison, TimeDelta, ValueDelta};
use crate::phase::Phase;
use crate::units::{bytes_bin, ms, p_value};

/// Writes the comparison as text (≤ 100 columns).
pub fn render_compare_text(c: &Comparison, w: &mut impl Write) -> io::Result<()> {
    render_compare(c, w, false)
}

/// Writes the comparison as text, with ANSI color when `color`.
pub fn render_compare(c: &Comparison, w: &mut impl Write, color: bool) -> io::Result<()> {
    let p = Painter(color);
    let mut out: Vec<String> = Vec::new();
    heading(c, &p, &mut out);
    time_rows(c, &mut out);
    rank_rows(c, &mut out);
    what_if_rows(c, &mut out);
    value_rows(c, &mut out);
    for n in &c.notes {
        for line in wrap_safe(&format!("note: {n}"), WIDTH) {
            out.push(p.dim(&line));
        }
    }
    for line in out {
        writeln!(w, "{}", line.trim_end())?;
    }
    Ok(())
}

/// The title, one line per run, the verdict and its reason.
fn heading(c: &Comparison, p: &Painter, out: &mut Vec<String>) {
    out.push(p.bold("traceml-daemon compare"));
    for (name, r) in [("A", &c.a), ("B", &c.b)] {
        let pid = r.pid.map(|p| format!("pid {p} · ")).unwrap_or_default();
        let line = format!(
            "{name}  {pid}{} steps · {} · {}",
            r.steps,
            r.diagnosis.replace('_', "-"),
            r.cmdline.join(" ")
        );
        // The command lines come from the targets (and the files from anywhere).
        out.push(
            crate::sanitize::terminal(&line)
                .chars()
                .take(WIDTH)
                .collect(),
        );
    }
    out.push("═".repeat(WIDTH));
    let v = c.verdict.as_str();
    let painted = match c.verdict {
        CompareVerdict::Improvement => p.green(v),
        CompareVerdict::Regression => p.red(v),
        _ => p.yellow(v),
    };
    out.push(format!("{}  {painted}", p.bold("VERDICT")));
    for line in wrap_safe(&c.reason, WIDTH - 9) {
        out.push(format!("         {line}"));
    }
}

/// The step time and each shown phase's time, A against B.
fn time_rows(c: &Comparison, out: &mut Vec<String>) {
    out.push("─".repeat(WIDTH));
    out.push(format!(
        "{:<22}{:>11}{:>11}{:>20}{:>10}   change",
        "", "A median", "B median", "delta", "p"
    ));
    let row = |name: String, d: &TimeDelta| {
        let delta = match (d.delta_ms, d.delta_pct) {
            (Some(x), Some(pc)) => format!("{:+.2} ms ({pc:+.0}%)", x),
            (Some(x), None) => format!("{:+.2} ms", x),
            _ => "—".to_owned(),
        };
        format!(
            "{name:<22}{:>11}{:>11}{delta:>20}{:>10}   {}",
            ms(d.a_median_ms),
            ms(d.b_median_ms),
            p_value(d.p_value),
            change_word(d.change, "faster", "slower")
        )
    };
    out.push(row("step".to_owned(), &c.step_ms));
    // collective_wait only when either run measured one (multi-rank jobs).
    let shown: Vec<(Phase, &crate::compare::TimeDelta)> = c
        .phases
        .iter()
        .filter(|(p, d)| {
            *p != Phase::CollectiveWait
                || d.a_median_ms.is_some_and(|v| v > 0.0)
                || d.b_median_ms.is_some_and(|v| v > 0.0)
        })
        .collect();
    for (i, &(phase, d)) in shown.iter().enumerate() {
        let branch = if i + 1 == shown.len() {
            "└─"
        } else {
            "├─"
        };
        out.push(row(format!("{branch} {}", phase.name()), d));
    }
}

/// Each rank's median step and own verdict, A against B (multi-rank jobs; nothing otherwise).
fn rank_rows(c: &Comparison, out: &mut Vec<String>) {
    if !c.ranks.is_empty() {
        out.push("─".repeat(WIDTH));
        out.push(format!(
            "{:<22}{:>11}{:>11}{:>20}   own verdict A → B",
            "RANKS", "A median", "B median", "delta"
        ));
        for r in &c.ranks {
            let delta = r
                .delta_pct
                .map_or_else(|| "—".to_owned(), |pc| format!("{pc:+.0}%"));
            let v = |x: &Option<String>| x.as_deref().unwrap_or("—").replace('_', "-");
            out.push(format!(
                "{:<22}{:>11}{:>11}{delta:>20}   {} → {}",
                format!("rank {}", r.rank),
                ms(r.a_median_ms),
                ms(r.b_median_ms),
                v(&r.a_verdict),
                v(&r.b_verdict)
            ));
        }
    }
}

/// What fixing each phase would buy in A and in B (the throughput factor and the step it
/// leaves): the bound moving between the runs.
fn what_if_rows(c: &Comparison, out: &mut Vec<String>) {
    if c.what_if.is_empty() {
        return;
    }
    out.push("─".repeat(WIDTH));
    out.push(format!(
        "{:<22}{:>22}{:>22}",
        "WHAT IF (to its floor)", "A", "B"
    ));
    let cell = |step: Option<f64>, factor: Option<f64>| match (step, factor) {
        (Some(s), Some(f)) => format!("{f:.1}× ({})", ms(Some(s))),
        _ => "—".to_owned(),
    };
    for w in &c.what_if {
        out.push(format!(
            "{:<22}{:>22}{:>22}",
            w.phase.name(),
            cell(w.a_step_ms_if, w.a_factor),
            cell(w.b_step_ms_if, w.b_factor)
        ));
    }
}

/// Memory, utilization and the evaluation's share of the wall time, A against B.
fn value_rows(c: &Comparison, out: &mut Vec<String>) {
    out.push("─".repeat(WIDTH));
    out.push(format!("{:<22}{:>11}{:>11}{:>20}", "", "A", "B", "delta"));
    let vrow = |name: &str, v: &ValueDelta, f: &dyn Fn(f64) -> String| {
        let delta = match (v.delta, v.delta_pct) {
            (Some(d), Some(pc)) => format!(
                "{}{} ({pc:+.0}%)",
                if d >= 0.0 { "+" } else { "−" },
                f(d.abs())
            ),
            (Some(d), None) => format!("{}{}", if d >= 0.0 { "+" } else { "-" }, f(d.abs())),
            _ => "—".to_owned(),
        };
        let o = |x: Option<f64>| x.map(f).unwrap_or_else(|| "—".to_owned());
        format!("{name:<22}{:>11}{:>11}{delta:>20}", o(v.a), o(v.b))
    };
    let bytes = |x: f64| bytes_bin(x as u64);
    let pctf = |x: f64| format!("{x:.0}%");
    out.push(vrow("host RSS peak", &c.memory.rss_bytes_max, &bytes));
    out.push(vrow(
        "GPU memory peak",
        &c.memory.gpu_process_mem_bytes_max,
        &bytes,
    ));
    out.push(vrow(
        "GPU util mean",
        &c.utilization.gpu_util_pct_mean,
        &pctf,
    ));
    out.push(vrow(
        "process CPU (1 core)",
        &c.utilization.process_cpu_pct_one_core_mean,
        &pctf,
    ));
    out.push(vrow(
        "worker CPU (1 core)",
        &c.utilization.workers_cpu_pct_one_core_mean,
        &pctf,
    ));
    out.push(vrow(
        "system CPU",
        &c.utilization.system_cpu_pct_mean,
        &pctf,
    ));
    if let Some(e) = &c.evaluation_share_of_wall {
        let pct100 = |v: Option<f64>| v.map(|x| 100.0 * x);
        let e100 = ValueDelta {
            a: pct100(e.a),
            b: pct100(e.b),
            delta: pct100(e.delta),
            delta_pct: e.delta_pct,
        };
        out.push(vrow("evaluation of wall", &e100, &pctf));
    }
}

/// Writes the comparison as pretty JSON.
pub fn render_compare_json(c: &Comparison, w: &mut impl Write) -> io::Result<()> {
    super::render_json(c, w)
}

fn change_word(c: Change, better: &'static str, worse: &'static str) -> &'static str {
    match c {
        Change::Better => better,
        Change::Worse => worse,
        Change::Same => "same",
        Change::Unknown => "—",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::compare;
    use crate::testkit;

    fn text(c: &Comparison) -> String {
        let mut v = Vec::new();
        render_compare_text(c, &mut v).unwrap();
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn input_bound_vs_fix() {
        let a = testkit::summary(&testkit::input_bound());
        let b = testkit::summary(&testkit::input_fixed());
        let t = text(&compare(&a, &b));
        for line in t.lines() {
            assert!(crate::text::width(line) <= WIDTH, "{line}");
        }
        insta::assert_snapshot!("compare_input_fix", t);
    }

    #[test]
    fn ranks_side_by_side() {
        use crate::summary::{DiagnosisKind, RankSummary, StepMs};
        let rank = |r: u32, median: f64, verdict| RankSummary {
            rank: r,
            step_ms: StepMs {
                median: Some(median),
                ..Default::default()
            },
            verdict,
            ..Default::default()
        };
        let mut a = testkit::summary(&testkit::input_fixed());
        let mut b = a.clone();
        a.ranks = vec![rank(0, 40.0, DiagnosisKind::ComputeBound)];
        b.ranks = vec![
            rank(0, 50.0, DiagnosisKind::InputBound),
            rank(1, 41.0, DiagnosisKind::ComputeBound),
        ];
        let t = text(&compare(&a, &b));
        for line in t.lines() {
            assert!(crate::text::width(line) <= WIDTH, "{line}");
        }
        let row = |r: &str| t.lines().find(|l| l.starts_with(r)).unwrap_or_default();
        assert!(t.contains("RANKS"), "{t}");
        assert!(row("rank 0").contains("+25%"), "{t}");
        assert!(
            row("rank 0").ends_with("COMPUTE-BOUND → INPUT-BOUND"),
            "{t}"
        );
        assert!(row("rank 1").ends_with("— → COMPUTE-BOUND"), "{t}");
    }

    #[test]
    fn empty_runs_render() {
        let empty = crate::analysis::summarize(&Default::default(), &[]);
        let t = text(&compare(&empty, &empty));
        assert!(t.contains("INCONCLUSIVE"), "{t}");
    }

    #[test]
    fn json_round_trip() {
        let c = compare(
            &testkit::summary(&testkit::input_bound()),
            &testkit::summary(&testkit::input_fixed()),
        );
        let mut v = Vec::new();
        render_compare_json(&c, &mut v).unwrap();
        let back: Comparison = serde_json::from_slice(&v).unwrap();
        assert_eq!(back.verdict, c.verdict);
        assert!(
            String::from_utf8(v)
                .unwrap()
                .contains("\"verdict\": \"IMPROVEMENT\"")
        );
    }
}
