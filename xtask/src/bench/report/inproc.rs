//! The in-process section of BENCHMARKS.md (what `--inprocess-only` rewrites): the wall-time and
//! CPU tables of the windowed runs, the probe hits per step and the cost of an attach.
use std::fmt::Write as _;

use super::{INPROCESS, INPROCESS_HEADING, fill, first3, pass};
use crate::bench::inprocess::{InprocRun, Schedule};
use crate::bench::runs::sh;
use crate::bench::stats::{
    Kv, Span, attach_cost_ms, compare_windows, cpu_ms_per_step, f, hits_by_probe, med, mmm,
    off_neighbours, on_off, window_steps_ms,
};

/// The in-process section: one row per workload run, then the probe hits per step.
pub fn inprocess(runs: &[InprocRun], s: &Schedule, daemon: &str) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "\n{INPROCESS_HEADING}\n");
    let (windows, secs) = (2 * s.on + 1, s.window_s);
    md.push_str(&fill(
        INPROCESS,
        &[
            ("date", sh("date -u '+%Y-%m-%d %H:%M'")),
            ("commit", sh("git -C . rev-parse --short HEAD")),
            (
                "load_start",
                runs.first()
                    .map(|r| first3(&r.load_start))
                    .unwrap_or_default(),
            ),
            ("load_end", first3(&sh("cat /proc/loadavg"))),
            ("windows", windows.to_string()),
            ("secs", format!("{secs:.0}")),
            ("daemon", daemon.to_owned()),
            ("guard_s", format!("{:.0}", s.guard_s)),
        ],
    ));
    let _ = writeln!(
        md,
        "| workload | steps off / on | wall ms/step off | on | ratio median (min–max) | added | off spread | after the last change: ratio / added µs | daemon verdict | attach s |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
    let mut cpu_rows = String::new();
    for r in runs {
        run_rows(r, &mut md, &mut cpu_rows);
    }
    let _ = writeln!(
        md,
        "\nCPU time of the training thread per step, and the daemon's own estimate. Off spread: \
         (largest − smallest off-window CPU per step) / smallest, this measure's noise floor on \
         the row (a loop that blocks on its workers many times a step wakes at times the load \
         decides, and its CPU per step moves with them):\n"
    );
    let _ = writeln!(
        md,
        "| workload | CPU ms/step off | on | ratio median (min–max) | off spread | measured added µs/step | after the last change: added µs/step | estimated µs/step (% of step) / steady µs/step | daemon CPU % of a core |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
    md.push_str(&cpu_rows);
    md.push_str(&probe_rows(runs));
    md.push_str(&attach_rows(runs));
    let _ = writeln!(
        md,
        "\nWorkloads: `tests/workloads/frameworks/hf_trainer.py --mode compute`, \
         `tests/workloads/frameworks/lightning_train.py --mode compute`, \
         `tests/workloads/real_torch_train.py --scenario balanced` (real torch on the cached venv's \
         CPython 3.11), `tests/workloads/bench/fake_loop.py` (the `balanced` ground-truth scenario \
         on the fake torch package and the stand-in CUDA runtime, pyenv CPython 3.9 and 3.13)."
    );
    md
}

/// A run's row of the wall-time table (into `md`) and of the CPU table (into `cpu_rows`).
fn run_rows(r: &InprocRun, md: &mut String, cpu_rows: &mut String) {
    if let Some(e) = &r.error {
        let _ = writeln!(
            md,
            "| {} | not run: {} | | | | | | | | |",
            r.name,
            e.replace('\n', " ").replace('|', "/")
        );
        return;
    }
    let on: Vec<bool> = r.windows.iter().map(|w| w.span.on).collect();
    let whole: Vec<_> = r.windows.iter().map(|w| Some(w.span)).collect();
    let steady: Vec<_> = r
        .windows
        .iter()
        .map(|w| if w.span.on { w.steady } else { Some(w.span) })
        .collect();
    let summaries: Vec<&Kv> = r
        .windows
        .iter()
        .filter_map(|w| w.summary.as_ref())
        .collect();
    wall_row(r, &on, &whole, &steady, &summaries, md);
    cpu_row(r, &on, &whole, &steady, &summaries, cpu_rows);
}

/// `s`, or "—" when `v` (the values `s` was made of) is empty.
fn or_dash(v: &[f64], s: String) -> String {
    if v.is_empty() { "—".to_owned() } else { s }
}

/// A run's row of the wall-time table: step times of the off and on windows (`whole`), after
/// the last probe-set change (`steady`), the daemon's verdicts and its attach time.
fn wall_row(
    r: &InprocRun,
    on: &[bool],
    whole: &[Option<Span>],
    steady: &[Option<Span>],
    summaries: &[&Kv],
    md: &mut String,
) {
    let a = on_off(&r.step_ends, whole, on);
    let st = on_off(&r.step_ends, steady, on);
    let (rm, rlo, rhi) = mmm(&a.ratios);
    let mut verdicts: Vec<String> = summaries
        .iter()
        .filter_map(|s| s.get("verdict").cloned())
        .collect();
    verdicts.sort();
    verdicts.dedup();
    let _ = writeln!(
        md,
        "| {} | {} / {} | {:.2} | {:.2} | {rm:.4} ({rlo:.4}–{rhi:.4}) | {:+.2} % | {:.1} % | {} / {} | {} | {:.1} |",
        r.name,
        a.steps_off,
        a.steps_on,
        a.off_ms,
        a.on_ms,
        (rm - 1.0) * 100.0,
        a.off_spread * 100.0,
        or_dash(&st.ratios, format!("{:.4}", med(&st.ratios))),
        or_dash(&st.added_us, format!("{:.0}", med(&st.added_us))),
        if verdicts.is_empty() {
            "—".to_owned()
        } else {
            verdicts.join(", ")
        },
        med(&r
            .windows
            .iter()
            .filter_map(|w| w.attach_s)
            .collect::<Vec<_>>())
    );
}

/// A run's row of the CPU table: CPU of the training thread per step, whole windows and after
/// the last change, beside the daemon's own estimate and CPU.
fn cpu_row(
    r: &InprocRun,
    on: &[bool],
    whole: &[Option<Span>],
    steady: &[Option<Span>],
    summaries: &[&Kv],
    cpu_rows: &mut String,
) {
    let field = |k: &str| -> Vec<f64> { summaries.iter().filter_map(|s| f(s, k)).collect() };
    // CPU of the training thread per step, whole windows and after the last change.
    let cpu_of = |spans: &[Option<Span>]| -> Vec<f64> {
        r.windows
            .iter()
            .zip(spans)
            .map(|(w, sp)| {
                sp.map(|sp| cpu_ms_per_step(&r.step_ends, &w.cpu, &sp))
                    .unwrap_or(f64::NAN)
            })
            .collect()
    };
    let cpu_whole = cpu_of(whole);
    let (c_off, c_on, c_ratios, c_added) = compare_windows(on, &cpu_whole);
    // The CPU measure's own noise: how far the off windows' CPU per step lies apart.
    let cpu_off: Vec<f64> = cpu_whole
        .iter()
        .zip(on)
        .filter(|&(v, &o)| !o && v.is_finite())
        .map(|(&v, _)| v)
        .collect();
    let cpu_spread = match (
        cpu_off.iter().copied().reduce(f64::min),
        cpu_off.iter().copied().reduce(f64::max),
    ) {
        (Some(lo), Some(hi)) if lo > 0.0 => format!("{:.1} %", (hi - lo) / lo * 100.0),
        _ => "—".to_owned(),
    };
    let (_, _, _, cs_added) = compare_windows(on, &cpu_of(steady));
    let (cm, clo, chi) = mmm(&c_ratios);
    let (est, est_pct, est_steady) = (
        field("overhead.estimated_us_per_step"),
        field("overhead.estimated_pct_of_step"),
        field("overhead.steady_us_per_step"),
    );
    let _ = writeln!(
        cpu_rows,
        "| {} | {c_off:.2} | {c_on:.2} | {cm:.4} ({clo:.4}–{chi:.4}) | {cpu_spread} | {:.0} | {} | {} / {} | {:.0} |",
        r.name,
        med(&c_added),
        or_dash(&cs_added, format!("{:.0}", med(&cs_added))),
        or_dash(&est, format!("{:.0} ({:.2} %)", med(&est), med(&est_pct))),
        or_dash(&est_steady, format!("{:.0}", med(&est_steady))),
        med(&r
            .windows
            .iter()
            .filter_map(|w| w.daemon_cpu_pct)
            .collect::<Vec<_>>()),
    );
}

/// The target time the learning period must cost at most on the HF Trainer (issue 39).
const ATTACH_GOAL_MS: f64 = 30.0;

/// Whether the daemon's estimate agrees with the measurement: within 2× or 20 ms.
fn estimate_agrees(est: f64, measured: f64) -> bool {
    (est - measured).abs() <= 20.0
        || (measured > 0.0 && est <= 2.0 * measured && est >= measured / 2.0)
}

/// The cost-of-an-attach table: per on window, the steps from the daemon's start to the end of
/// its learning (plus two steps, the detach) less the off windows' step time, summed; beside it
/// the daemon's own estimate (`daemon_overhead.learning_ms`).
fn attach_rows(runs: &[InprocRun]) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "\n### Cost of an attach\n\nWhat one attach costs the target once, on top of the steady \
         cost: per on window, each step that ended between the daemon's start and the end of its \
         learning period (its last probe-set change, plus two steps for the detach) less the mean \
         step of the off windows beside it (the mean: a slow step now and then is as likely there \
         as in the learning span), summed (wall time of the training thread). Beside it, \
         the daemon's own estimate of the same (`daemon_overhead.learning_ms`: the probe hits \
         counted while learning × the per-hit costs). The estimate agrees when within 2× or 20 ms \
         of the measurement. Goal: ≤ {ATTACH_GOAL_MS:.0} ms on the HF Trainer. Medians over the on \
         windows (min–max); a measurement whose min–max spread is wider than the goal is \
         \"not resolved at this noise\".\n"
    );
    let _ = writeln!(
        md,
        "| workload | learning s | measured ms, median (min–max) | estimated ms | estimate within 2× or 20 ms | ≤ {ATTACH_GOAL_MS:.0} ms |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|");
    for r in runs.iter().filter(|r| r.error.is_none()) {
        let spans: Vec<Span> = r.windows.iter().map(|w| w.span).collect();
        // The off windows' mean step, not their median: a loop whose steps are skewed (a slow
        // step now and then, from other jobs or its own sleeps) has as many slow steps in the
        // learning span as elsewhere, and the median would count them as the attach's.
        let means: Vec<f64> = spans
            .iter()
            .map(|sp| {
                let v = window_steps_ms(&r.step_ends, sp);
                if v.is_empty() {
                    f64::NAN
                } else {
                    v.iter().sum::<f64>() / v.len() as f64
                }
            })
            .collect();
        let (mut measured, mut est, mut learn_s) = (vec![], vec![], vec![]);
        for (i, w) in r.windows.iter().enumerate() {
            let (Some((from, learned)), Some(off)) =
                (w.attach_span, off_neighbours(&spans, &means, i))
            else {
                continue;
            };
            let to = learned + (2.0 * off * 1e6) as u64;
            if let Some(c) = attach_cost_ms(&r.step_ends, from, to, off) {
                measured.push(c);
            }
            learn_s.push(learned.saturating_sub(w.span.start_ns) as f64 / 1e9);
            if let Some(e) = w
                .summary
                .as_ref()
                .and_then(|s| f(s, "overhead.learning_ms"))
            {
                est.push(e);
            }
        }
        if measured.is_empty() {
            let _ = writeln!(md, "| {} | — | — | — | — | — |", r.name);
            continue;
        }
        let (m, lo, hi) = mmm(&measured);
        let e = med(&est);
        let agrees = if est.is_empty() {
            "— (no estimate in the summary)".to_owned()
        } else if estimate_agrees(e, m) {
            "yes".to_owned()
        } else {
            "**no**".to_owned()
        };
        let goal = if hi - lo > ATTACH_GOAL_MS {
            format!("not resolved at this noise (spread {:.0} ms)", hi - lo)
        } else {
            pass(m <= ATTACH_GOAL_MS).to_owned()
        };
        let _ = writeln!(
            md,
            "| {} | {:.2} | {m:.0} ({lo:.0}–{hi:.0}) | {} | {agrees} | {goal} |",
            r.name,
            med(&learn_s),
            if est.is_empty() {
                "—".to_owned()
            } else {
                format!("{e:.0}")
            },
        );
    }
    md
}

/// The probe-hits table: each run's probe sets and hits per step by probe.
fn probe_rows(runs: &[InprocRun]) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "\nProbe hits per step (`daemon_overhead.hits_per_step`, median over on windows) and the \
         daemon's probe sets (seconds from the daemon's start):\n"
    );
    let _ = writeln!(md, "| workload | probe sets | hits per step by probe |");
    let _ = writeln!(md, "|---|---|---|");
    for r in runs.iter().filter(|r| r.error.is_none()) {
        let summaries: Vec<&Kv> = r
            .windows
            .iter()
            .filter_map(|w| w.summary.as_ref())
            .collect();
        let hits = hits_by_probe(&summaries);
        let sets = summaries
            .iter()
            .find_map(|s| s.get("overhead.probe_sets").cloned())
            .unwrap_or_default();
        let _ = writeln!(
            md,
            "| {} | {} | {} |",
            r.name,
            if sets.is_empty() {
                "—"
            } else {
                sets.as_str()
            },
            if hits.is_empty() {
                "— (no `daemon_overhead` in the summary)".to_owned()
            } else {
                hits.iter()
                    .map(|(p, n)| format!("{p} {n:.1}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
    }
    md
}

/// `old` with its in-process section replaced by `section` (or `section` inserted before the
/// notes, or at the end, when it has none).
pub fn splice_inprocess(old: &str, section: &str) -> String {
    crate::bench::sweep::splice_at(old, INPROCESS_HEADING, section)
}
