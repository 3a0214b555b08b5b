//! BENCHMARKS.md: formats what `measure` and `inprocess` measured (numbers from `stats`) into
//! the report's sections. The in-process section, and its splice into an existing report when
//! only that section was rerun, are in `inproc`.
use std::fmt::Write as _;

use super::Plan;
use super::inprocess::{InprocRun, Schedule};
use super::measure::{Measured, Overhead, Storm, per_hit};
use super::runs::{Ctx, DaemonStats, TRACEML_PIN, sh};
use super::stats::{Kv, f, med, mmm};

mod inproc;
pub use inproc::{inprocess, splice_inprocess};

const PHASES: [&str; 7] = [
    "input_wait",
    "h2d",
    "forward",
    "backward",
    "optimizer",
    "gpu_wait",
    "residual",
];

/// The heading that starts the in-process section (what `--inprocess-only` replaces).
pub const INPROCESS_HEADING: &str =
    "## 6. In-process overhead: the daemon attached and detached in windows of one run";

/// The report's prose, in markdown beside this file, with `{name}` where [`fill`] puts a value:
/// how the numbers are measured (section "Method"), how the in-process section measures, and the
/// notes that end the report.
const METHOD: &str = include_str!("report/method.md");
const INPROCESS: &str = include_str!("report/inprocess.md");
const NOTES: &str = include_str!("report/notes.md");

/// `template` with each `{name}` replaced by its value in `values`. Every placeholder must have
/// a value and every value a placeholder (a mismatch is a bug in this file: it panics).
fn fill(template: &str, values: &[(&str, String)]) -> String {
    let mut out = String::with_capacity(template.len() + 256);
    let mut used = vec![false; values.len()];
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let close = rest[open..]
            .find('}')
            .map(|c| open + c)
            .unwrap_or_else(|| panic!("an unclosed {{ in a report template"));
        let name = &rest[open + 1..close];
        let i = values
            .iter()
            .position(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("no value for {{{name}}} in a report template"));
        used[i] = true;
        out.push_str(&rest[..open]);
        out.push_str(&values[i].1);
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    if let Some(i) = used.iter().position(|u| !u) {
        panic!("{{{}}} is in no report template", values[i].0);
    }
    out
}

fn pass(ok: bool) -> &'static str {
    if ok { "pass" } else { "**FAIL**" }
}

fn first3(s: &str) -> String {
    s.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// What the report's header needs besides the measurements.
pub struct Header<'a> {
    pub quick: bool,
    pub plan: &'a Plan,
    pub load_start: String,
    pub minutes: f64,
}

/// The whole BENCHMARKS.md.
pub fn full(
    ctx: &Ctx,
    h: &Header,
    m: &Measured,
    inproc: &[InprocRun],
    schedule: &Schedule,
) -> String {
    let mut md = String::new();
    header(&mut md, ctx, h);
    overhead(&mut md, m);
    footprint(&mut md, ctx, m);
    attach(&mut md, m);
    accuracy(&mut md, m);
    side_by_side(&mut md, ctx, h.plan, m);
    let daemon = ctx
        .daemon
        .strip_prefix(crate::root())
        .unwrap_or(&ctx.daemon);
    md.push_str(&inprocess(inproc, schedule, &daemon.to_string_lossy()));
    md.push('\n');
    md.push_str(NOTES);
    md
}

fn header(md: &mut String, ctx: &Ctx, h: &Header) {
    let cpu = sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2");
    let _ = writeln!(md, "# Benchmarks\n");
    let _ = writeln!(
        md,
        "Written by `cargo xtask bench{}` — do not edit by hand; rerun it. Numbers are from **this \
         project's machine**, a small shared VM that was running other builds at the same time: \
         read them as medians of paired runs, not as lab measurements.\n",
        if h.quick { " --quick" } else { "" }
    );
    let _ = writeln!(md, "## Machine\n");
    let _ = writeln!(md, "| | |\n|---|---|");
    let _ = writeln!(md, "| date (UTC) | {} |", sh("date -u '+%Y-%m-%d %H:%M'"));
    let _ = writeln!(md, "| CPU | {} × {} |", sh("nproc"), cpu.trim());
    let _ = writeln!(
        md,
        "| memory | {} |",
        sh("grep MemTotal /proc/meminfo | tr -s ' ' | cut -d' ' -f2-")
    );
    let _ = writeln!(md, "| kernel | {} |", sh("uname -srm"));
    let _ = writeln!(
        md,
        "| load average (1/5/15 min) at start / end | {} / {} |",
        first3(&h.load_start),
        first3(&sh("cat /proc/loadavg"))
    );
    let _ = writeln!(
        md,
        "| traceml-daemon | release build, commit {} |",
        sh("git -C . rev-parse --short HEAD")
    );
    let _ = writeln!(
        md,
        "| targets | pyenv CPython {} (stand-in workloads); real torch: {} |",
        sh(&format!("{} -V", ctx.py.display())).replace("Python ", ""),
        ctx.torch_py
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or("none".into())
    );
    let _ = writeln!(
        md,
        "| mode | {} ({} pairs per comparison); bench wall time {:.1} min |",
        if h.quick { "quick" } else { "full" },
        h.plan.pairs,
        h.minutes
    );

    let _ = writeln!(md, "\n## Method\n");
    md.push_str(&fill(
        METHOD,
        &[
            ("pairs", h.plan.pairs.to_string()),
            ("storm_reps", h.plan.storm_reps.to_string()),
            ("storm_n", h.plan.storm_n.to_string()),
        ],
    ));
}

/// A row's verdict against `target`: pass or FAIL, or "not resolved at this noise" when the
/// row's spread (max − min over its pairs or windows) is wider than the target itself.
fn judged(ok: bool, spread: f64, target: f64) -> String {
    if spread.is_nan() || spread > target {
        "not resolved at this noise".to_owned()
    } else {
        pass(ok).to_owned()
    }
}

fn overhead_row(o: &Overhead) -> String {
    let (m, lo, hi) = mmm(&o.ratios);
    format!(
        "| {} | {:.2} | {:.2} | {m:.4} | {lo:.4} | {hi:.4} | {:.2} % | {:+.2} % | {} |\n",
        o.label,
        med(&o.a_ms),
        med(&o.b_ms),
        (hi - lo) * 100.0,
        (m - 1.0) * 100.0,
        judged(m <= 1.005, hi - lo, 0.005)
    )
}

fn overhead(md: &mut String, m: &Measured) {
    let _ = writeln!(md, "\n## 1. Overhead on the target\n");
    let _ = writeln!(
        md,
        "Target: ≤ 0.5 % added step time. The stand-in loops are host-bound on purpose (short kernels), so host time added by the probes shows fully. Pairs run A B, then B A, alternately (an order or drift effect cancels). Spread = max − min of the pairs' ratios; a row whose spread is wider than the target (0.5 %) is \"not resolved at this noise\": its median says nothing finer than its spread.\n"
    );
    let _ = writeln!(
        md,
        "| workload | A step (ms) | B step (ms) | ratio median | min | max | spread | added | ≤ 0.5 % |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
    for o in &m.overhead {
        md.push_str(&overhead_row(o));
    }
    match &m.side {
        Some(side) => {
            for s in side {
                md.push_str(&overhead_row(&s.overhead));
            }
        }
        None => {
            let _ = writeln!(
                md,
                "| real PyTorch CPU | not run: no virtualenv with torch (`cargo xtask setup --torch`) | | | | | | | |"
            );
        }
    }
    let _ = writeln!(
        md,
        "\nPer-step content of the stand-in loops (`realistic.py`): 20 ms ≈ 16 Linear layers, ~240 launches; 100 ms ≈ 48 layers, ~680 launches; 500 ms ≈ 96 layers, ~1,300 launches; each step also has a DataLoader `next`, 2 H2D copies, `zero_grad`, `backward`, `step`, `loss.item()` (D2H + sync)."
    );
    let _ = writeln!(md, "\n### Stress: time added per probe hit\n");
    let _ = writeln!(
        md,
        "Target: ≤ 1 µs (1,000 ns) per hit. \"events/call\" = probe events the daemon received per loop iteration; \"lost\" = its lost-event ratio.\n"
    );
    storm_table(md, &m.storms);
}

/// The storms' table: added time per call and per hit, with the daemon's events and loss.
fn storm_table(md: &mut String, storms: &[Storm]) {
    let _ = writeln!(
        md,
        "| storm | hits per call | A ns/call | added ns/call median | min | max | added ns per hit | events/call | lost | ≤ 1 µs per hit |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
    for s in storms {
        let (mid, lo, hi) = mmm(&s.diffs);
        let ph = per_hit(s);
        // The spread per hit: the pairs' added ns per call, over the hits per call.
        let hits_per_call = if ph.is_nan() || mid == 0.0 {
            f64::NAN
        } else {
            mid / ph
        };
        let verdict = if ph.is_nan() {
            "—".to_owned()
        } else {
            judged(ph <= 1000.0, (hi - lo) / hits_per_call, 1000.0)
        };
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} | {mid:.0} | {lo:.0} | {hi:.0} | {} | {:.2} | {:.4} | {verdict} |",
            s.what,
            s.hits,
            med(&s.base),
            if ph.is_nan() {
                "—".to_owned()
            } else {
                format!("{ph:.0}")
            },
            med(&s.events),
            med(&s.lost)
        );
    }
}

fn fp_row(name: &str, d: &DaemonStats, steps: f64) -> String {
    format!(
        "| {name} | {steps:.0} | {:.2} | {:.2} | {:.1} | {:.1} | {} | {:.0} |",
        100.0 * d.steady_cpu_s / d.steady_s.max(1e-9),
        d.attach_cpu_s,
        d.hwm_kb as f64 / 1024.0,
        d.anon_kb as f64 / 1024.0,
        d.summary_bytes,
        d.recording_bytes as f64 * 1000.0 / steps.max(1.0)
    )
}

fn footprint(md: &mut String, ctx: &Ctx, m: &Measured) {
    let (fpd, fp_steps) = m.footprint.clone().unwrap_or_default();
    let _ = writeln!(md, "\n## 2. Footprint of the daemon\n");
    let _ = writeln!(
        md,
        "Targets: ≤ 2 % of one core, ≤ 40 MB peak RSS, summary ≤ 50 KB, recording ≤ 1 MB per 1,000 steps.\n"
    );
    let _ = writeln!(
        md,
        "| run | steps | CPU % of one core (probes live → target exit) | attach CPU s | peak RSS MB (VmHWM) | peak anon RSS MB | summary bytes | recording bytes / 1,000 steps |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    let _ = writeln!(
        md,
        "{}",
        fp_row(
            &format!("**long run**: realistic 20 ms, {fp_steps:.0} steps"),
            &fpd,
            fp_steps
        )
    );
    let mut groups: Vec<String> = m.footprints.iter().map(|(n, _, _)| n.clone()).collect();
    groups.dedup();
    for g in &groups {
        let runs: Vec<&(String, DaemonStats, f64)> =
            m.footprints.iter().filter(|(n, _, _)| n == g).collect();
        let agg = DaemonStats {
            steady_cpu_s: runs.iter().map(|r| r.1.steady_cpu_s).sum(),
            steady_s: runs.iter().map(|r| r.1.steady_s).sum(),
            attach_cpu_s: med(&runs.iter().map(|r| r.1.attach_cpu_s).collect::<Vec<_>>()),
            hwm_kb: runs.iter().map(|r| r.1.hwm_kb).max().unwrap_or(0),
            anon_kb: runs.iter().map(|r| r.1.anon_kb).max().unwrap_or(0),
            summary_bytes: runs.iter().map(|r| r.1.summary_bytes).max().unwrap_or(0),
            recording_bytes: med(&runs
                .iter()
                .map(|r| r.1.recording_bytes as f64 * 1000.0 / r.2.max(1.0))
                .collect::<Vec<_>>()) as u64,
            ..Default::default()
        };
        let _ = writeln!(
            md,
            "{}",
            fp_row(
                &format!("{g} (B runs, CPU pooled, RSS/summary max)"),
                &agg,
                1000.0
            )
        );
    }
    let cpu_pct = 100.0 * fpd.steady_cpu_s / fpd.steady_s.max(1e-9);
    let rec_per_k = fpd.recording_bytes as f64 * 1000.0 / fp_steps.max(1.0);
    let max_rss = m
        .footprints
        .iter()
        .map(|r| r.1.hwm_kb)
        .chain([fpd.hwm_kb])
        .max()
        .unwrap_or(0) as f64
        / 1024.0;
    let max_sum = m
        .footprints
        .iter()
        .map(|r| r.1.summary_bytes)
        .chain([fpd.summary_bytes])
        .max()
        .unwrap_or(0);
    let _ = writeln!(
        md,
        "\nLong run against the targets: CPU {cpu_pct:.2} % ({}), peak RSS over all runs {max_rss:.1} MB ({}), \
         largest summary {max_sum} bytes ({}), recording {:.0} KB / 1,000 steps ({}). CPU ticks are \
         {} Hz, so short runs are coarse; the long run and the pooled rows are the ones to read.",
        pass(cpu_pct <= 2.0),
        pass(max_rss <= 40.0),
        pass(max_sum <= 50_000),
        rec_per_k / 1000.0,
        pass(rec_per_k <= 1_000_000.0),
        ctx.clk_tck
    );
}

fn attach(md: &mut String, m: &Measured) {
    let _ = writeln!(md, "\n## 3. Time to attach and time to verdict\n");
    let _ = writeln!(
        md,
        "| target | runs | attach s median | min | max | verdict s median | min | max |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    let mut kinds: Vec<String> = m.attach_times.iter().map(|a| a.0.clone()).collect();
    kinds.sort();
    kinds.dedup();
    for k in kinds {
        let of_kind = || m.attach_times.iter().filter(|a| a.0 == k);
        let at: Vec<f64> = of_kind().map(|a| a.1).collect();
        let vt: Vec<f64> = of_kind().map(|a| a.2).collect();
        let (a1, a2, a3) = mmm(&at);
        let (v1, v2, v3) = mmm(&vt);
        let _ = writeln!(
            md,
            "| {k} | {} | {a1:.3} | {a2:.3} | {a3:.3} | {v1:.3} | {v2:.3} | {v3:.3} |",
            at.len()
        );
    }
}

/// The verdict the daemon should give for a truth file's expected one.
fn wanted(expected: &str) -> String {
    match expected {
        "gpu_bound" => "COMPUTE_BOUND".to_owned(),
        e => e.to_uppercase(),
    }
}

fn accuracy(md: &mut String, m: &Measured) {
    let right = m
        .accuracy
        .iter()
        .filter(|a| {
            a.summary.get("verdict").cloned().unwrap_or_default()
                == wanted(a.truth.get("expected").map(String::as_str).unwrap_or(""))
        })
        .count();
    let _ = writeln!(md, "\n## 4. Accuracy on the ground-truth scenarios\n");
    let _ = writeln!(
        md,
        "Verdicts right: **{} of {}**. Phase columns: daemon median − truth median, ms.\n",
        right,
        m.accuracy.len()
    );
    let _ = write!(
        md,
        "| scenario | expected | verdict | step ms daemon / truth |"
    );
    for p in PHASES {
        let _ = write!(md, " {p} |");
    }
    let _ = writeln!(md, "\n|---|---|---|---|---|---|---|---|---|---|---|");
    for a in &m.accuracy {
        let (t, o) = (&a.truth, &a.summary);
        let want = wanted(t.get("expected").map(String::as_str).unwrap_or(""));
        let got = o.get("verdict").cloned().unwrap_or_default();
        let mut row = format!(
            "| `{}` | {want} | {got} {} | {:.2} / {:.2} |",
            a.name,
            if got == want { "✓" } else { "✗" },
            f(o, "step_median_ms").unwrap_or(f64::NAN),
            f(t, "step_median_ms").unwrap_or(f64::NAN)
        );
        for p in PHASES {
            let (x, y) = (
                f(o, &format!("{p}_median_ms")),
                f(t, &format!("{p}_median_ms")),
            );
            let _ = write!(
                row,
                " {} |",
                match (x, y) {
                    (Some(x), Some(y)) => format!("{:+.2}", x - y),
                    _ => "—".into(),
                }
            );
        }
        let _ = writeln!(md, "{row}");
    }
}

fn side_by_side(md: &mut String, ctx: &Ctx, plan: &Plan, m: &Measured) {
    let _ = writeln!(md, "\n## 5. Side by side with TraceML (`traceml-ai`)\n");
    match &ctx.traceml {
        Ok(bin) => {
            let _ = writeln!(
                md,
                "TraceML {TRACEML_PIN} from PyPI in its own venv ({}), with the same torch. Used as its \
                 README documents for a plain PyTorch loop: `import traceml_ai as traceml; \
                 traceml.init(mode=\"auto\")` and `with traceml.trace_step(model):` around the step \
                 (`real_torch_loop.py --traceml`), launched with `traceml run real_torch_loop.py --args …`. \
                 TraceML's phases are its window averages (means); ours and the truth's shares are totals \
                 over steps / total step time. The daemon needs no change to the script and no restart.\n",
                bin.display()
            );
        }
        Err(e) => {
            let _ = writeln!(md, "TraceML could not run here: {e}\n");
        }
    }
    let _ = writeln!(
        md,
        "Step time with each tool (median of the workload's own step medians over {} rounds of plain / daemon / TraceML):\n",
        plan.pairs
    );
    let _ = writeln!(
        md,
        "| scenario | plain step ms | traceml-daemon attached | TraceML | process wall s plain / daemon / TraceML |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|");
    let side = m.side.as_deref().unwrap_or_default();
    for s in side {
        let o = &s.overhead;
        let (mid, lo, hi) = mmm(&o.ratios);
        let _ = write!(
            md,
            "| `{}` | {:.2} | {:.2} ({:+.2} %, min {:.4}, max {:.4}) | ",
            s.scenario,
            med(&o.a_ms),
            med(&o.b_ms),
            (mid - 1.0) * 100.0,
            lo,
            hi
        );
        if s.rc.is_empty() {
            let _ = writeln!(
                md,
                "not run | {:.1} / {:.1} / — |",
                med(&s.wall[0]),
                med(&s.wall[1])
            );
        } else {
            let (m2, lo2, hi2) = mmm(&s.rc);
            let _ = writeln!(
                md,
                "{:.2} ({:+.2} %, min {lo2:.4}, max {hi2:.4}) | {:.1} / {:.1} / {:.1} |",
                med(&s.c_ms),
                (m2 - 1.0) * 100.0,
                med(&s.wall[0]),
                med(&s.wall[1]),
                med(&s.wall[2])
            );
        }
    }
    phase_shares(md, side);
    where_each_is_ahead(md, side);
}

/// Each scenario's phase shares (first round): the truth, the daemon and TraceML.
fn phase_shares(md: &mut String, side: &[super::measure::SideBySide]) {
    let _ = writeln!(md, "\nPhase shares (first round):");
    for s in side {
        let (t, o) = (&s.truth, &s.ours);
        let _ = writeln!(
            md,
            "\n**`{}`** (expected `{}`)\n",
            s.scenario,
            t.get("expected").map(String::as_str).unwrap_or("?")
        );
        let _ = writeln!(
            md,
            "| | verdict | input_wait | forward | backward | optimizer | residual | step (ms) |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
        let share = |kv: &Kv, p: &str| {
            f(kv, &format!("{p}_share"))
                .map(|x| format!("{:.1} %", x * 100.0))
                .unwrap_or("—".into())
        };
        let row = |name: &str, kv: &Kv, verdict: &str, step: &str| {
            let mut r = format!("| {name} | {verdict} |");
            for p in ["input_wait", "forward", "backward", "optimizer", "residual"] {
                let _ = write!(r, " {} |", share(kv, p));
            }
            let _ = write!(r, " {step} |");
            r
        };
        let _ = writeln!(
            md,
            "{}",
            row(
                "truth (in-script clocks)",
                t,
                "—",
                &format!("{:.2} median", f(t, "step_median_ms").unwrap_or(f64::NAN))
            )
        );
        let _ = writeln!(
            md,
            "{}",
            row(
                "traceml-daemon",
                o,
                o.get("verdict").map(String::as_str).unwrap_or("?"),
                &format!("{:.2} median", f(o, "step_median_ms").unwrap_or(f64::NAN))
            )
        );
        match (&s.theirs, &s.traceml_err) {
            (Some(th), _) => {
                let _ = writeln!(
                    md,
                    "{}",
                    row(
                        "TraceML 0.5.0",
                        th,
                        th.get("verdict").map(String::as_str).unwrap_or("?"),
                        &format!("{:.2} mean", f(th, "step_mean_ms").unwrap_or(f64::NAN))
                    )
                );
            }
            (None, Some(e)) => {
                let _ = writeln!(
                    md,
                    "| TraceML | could not run: {} | | | | | | |",
                    e.replace('\n', " ").replace('|', "/")
                );
            }
            _ => {}
        }
    }
}

/// One scenario both tools finished.
struct Cmp<'a> {
    scenario: &'a str,
    expected: String,
    ours: String,
    theirs: String,
    our_added_pct: f64,
    their_added_pct: f64,
    their_step_ms: f64,
    truth_step_ms: f64,
}

fn where_each_is_ahead(md: &mut String, side: &[super::measure::SideBySide]) {
    let cmp: Vec<Cmp> = side
        .iter()
        .filter_map(|s| {
            let theirs = s.theirs.as_ref()?.get("verdict").cloned()?;
            if theirs.is_empty() {
                return None;
            }
            Some(Cmp {
                scenario: s.scenario.as_str(),
                expected: s
                    .truth
                    .get("expected")
                    .cloned()
                    .unwrap_or_default()
                    .to_uppercase(),
                ours: s.ours.get("verdict").cloned().unwrap_or_default(),
                theirs,
                our_added_pct: (med(&s.overhead.ratios) - 1.0) * 100.0,
                their_added_pct: if s.rc.is_empty() {
                    f64::NAN
                } else {
                    (med(&s.rc) - 1.0) * 100.0
                },
                their_step_ms: s
                    .theirs
                    .as_ref()
                    .and_then(|t| f(t, "step_mean_ms"))
                    .unwrap_or(f64::NAN),
                truth_step_ms: f(&s.truth, "step_median_ms").unwrap_or(f64::NAN),
            })
        })
        .collect();
    if cmp.is_empty() {
        return;
    }
    let canon = |v: &str| match v {
        "NO_CLEAR_PERFORMANCE_BOTTLENECK" => "BALANCED".to_owned(),
        v => v.to_owned(),
    };
    let ours_right = cmp.iter().filter(|c| c.ours == c.expected).count();
    let theirs_right = cmp
        .iter()
        .filter(|c| canon(&c.theirs) == c.expected)
        .count();
    let _ = writeln!(md, "\n### Where each is ahead\n");
    let _ = writeln!(
        md,
        "- Verdicts against the expected one: traceml-daemon {ours_right} of {n}, TraceML {theirs_right} of {n} \
         (TraceML's `NO_CLEAR_PERFORMANCE_BOTTLENECK` counted as balanced).",
        n = cmp.len()
    );
    for c in cmp.iter().filter(|c| canon(&c.theirs) != c.expected) {
        let _ = writeln!(
            md,
            "- `{}`: TraceML says {} with a {:.2} ms step while the script's clocks say {:.2} ms: its step \
             is the DataLoader fetch plus the `trace_step` block, so time the loop spends after that \
             block (here the residual sleep, where a log or checkpoint call would sit) is not in its step.",
            c.scenario, c.theirs, c.their_step_ms, c.truth_step_ms
        );
    }
    let lower: Vec<&str> = cmp
        .iter()
        .filter(|c| c.their_added_pct < c.our_added_pct)
        .map(|c| c.scenario)
        .collect();
    let _ = writeln!(
        md,
        "- Added step time (median of rounds): {}. TraceML's in-process hooks cost less than the \
         daemon's probes on: {}. Both are at the noise level of this machine on some rows; read \
         min/max above.",
        cmp.iter()
            .map(|c| format!(
                "`{}` daemon {:+.2} % / TraceML {:+.2} %",
                c.scenario, c.our_added_pct, c.their_added_pct
            ))
            .collect::<Vec<_>>()
            .join(", "),
        if lower.is_empty() {
            "none".to_owned()
        } else {
            lower.join(", ")
        }
    );
    let _ = writeln!(
        md,
        "- TraceML is ahead by design on: no root, no eBPF and no uprobe-capable Linux kernel \
         needed (anything that runs Python); per-step GPU memory (allocated/reserved) through \
         torch; multi-rank (DDP) straggler diagnosis; trainer integrations (Hugging Face, \
         Lightning, …), live CLI/dashboard views, HTML report, W&B/MLflow export and a CI \
         regression gate. None of those are measured here (no GPU, one process).\n\
         - traceml-daemon is ahead on: no change to the script and no restart (attach by pid), \
         phases measured from the whole loop rather than a traced block, per-call CUDA launch, \
         copy and sync attribution at the runtime (GPU-side numbers: not yet validated on a GPU)."
    );
}

/// `--driver-only`: the driver-path probes' cost per hit (issue 52), ABBA pairs as the stress
/// table above.
pub fn driver_section(storms: &[Storm], daemon: &str, load: &str) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## Driver paths: time added per probe hit
"
    );
    let _ = writeln!(
        md,
        "Daemon: `{daemon}`; load at start: {load}. The stand-in vendor library (`libfakeblasLt`, the cuBLAS shape: its own runtime copy, `cuGetProcAddress`'d `cuLaunchKernel`) launching one 0 ns kernel a call, and `cuGetProcAddress_v2` called in a loop. A launch from a library's own runtime runs the `launch` program with one more user read (the return address) and a lookup in up to 32 caller ranges; a followed pointer runs the same program where the pointer points. `cuGetProcAddress` runs at library load: a runtime copy asks for its entry points once (the real CUDA 13 `libcudart` names 515 driver entry points in its read-only data, `libcublasLt` 505), never per launch. An eager launch through the runtime hits two probes when the driver is mapped (the runtime's and the runtime's own driver call, counted as one launch): twice the cost of the stress table's `cudaLaunchKernel` rows, which were measured before the stand-in runtime called a driver (the commit each section names). A `cuGetProcAddress` call costs about 10 µs with the daemon attached, so a runtime copy's ~500 requests add about 5 ms once, at its load.\n"
    );
    storm_table(&mut md, storms);
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splice_replaces_or_inserts_the_section() {
        let notes = "\n## Reading the numbers\n\n- x\n";
        let old = format!("# B\n\n## 5. Side\n\ntext\n{notes}");
        let sec = format!("\n{INPROCESS_HEADING}\n\nfirst\n");
        let once = splice_inprocess(&old, &sec);
        assert!(once.contains(&format!(
            "text\n\n{INPROCESS_HEADING}\n\nfirst\n\n## Reading"
        )));
        let sec2 = format!("\n{INPROCESS_HEADING}\n\nsecond\n");
        let twice = splice_inprocess(&once, &sec2);
        assert!(!twice.contains("first"));
        assert!(twice.contains(&format!("{INPROCESS_HEADING}\n\nsecond\n\n## Reading")));
        assert_eq!(twice.matches(INPROCESS_HEADING).count(), 1);
        let bare = splice_inprocess("# B\n", &sec);
        assert!(bare.ends_with("first\n"));
    }

    #[test]
    fn templates_are_filled_whole() {
        let filled = fill("a {x} b {y}{x}", &[("x", "1".into()), ("y", "2".into())]);
        assert_eq!(filled, "a 1 b 21");
        // Each template's placeholders are the ones its caller fills.
        let names = |t: &str| {
            let mut v: Vec<String> = t
                .split('{')
                .skip(1)
                .map(|p| p.split('}').next().unwrap().to_owned())
                .collect();
            v.sort();
            v.dedup();
            v
        };
        assert_eq!(names(METHOD), ["pairs", "storm_n", "storm_reps"]);
        assert_eq!(
            names(INPROCESS),
            [
                "commit",
                "daemon",
                "date",
                "guard_s",
                "load_end",
                "load_start",
                "secs",
                "windows"
            ]
        );
        assert!(names(NOTES).is_empty());
        assert!(NOTES.starts_with("## Reading the numbers\n"));
    }

    #[test]
    #[should_panic(expected = "no value for {y}")]
    fn a_placeholder_without_a_value_panics() {
        fill("{y}", &[]);
    }
}
