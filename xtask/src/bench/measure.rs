//! The paired sections of the bench (A = no daemon, B = daemon attached, a fresh process per
//! run): realistic stand-in loops, real PyTorch beside TraceML, probe-hit storms, the long
//! footprint run and the accuracy scenarios. Each returns what it measured; `report` formats it.
use std::path::PathBuf;

use super::Plan;
use super::runs::{Ctx, DaemonStats, run_traceml};
use super::stats::{Kv, f, med, storm_ns};

const BENCH_DIR: &str = "tests/workloads/bench";
const REC: [&str; 2] = ["--record", "{rec}"];

/// One row of the overhead table: the same workload run alone (A) and with the daemon (B).
pub struct Overhead {
    pub label: String,
    pub a_ms: Vec<f64>,
    pub b_ms: Vec<f64>,
    pub ratios: Vec<f64>,
}

/// Real PyTorch with nothing, the daemon and TraceML, over the rounds of one scenario.
pub struct SideBySide {
    pub scenario: String,
    pub overhead: Overhead,
    /// TraceML's step ms and its ratio to the plain run of the same round.
    pub c_ms: Vec<f64>,
    pub rc: Vec<f64>,
    /// Process wall seconds: plain, daemon, TraceML.
    pub wall: [Vec<f64>; 3],
    /// The first round's truth, daemon summary and TraceML summary.
    pub truth: Kv,
    pub ours: Kv,
    pub theirs: Option<Kv>,
    pub traceml_err: Option<String>,
}

pub struct Storm {
    pub what: &'static str,
    pub hits: &'static str,
    pub base: Vec<f64>,
    pub diffs: Vec<f64>,
    pub events: Vec<f64>,
    pub lost: Vec<f64>,
}

pub struct Accuracy {
    pub name: String,
    pub truth: Kv,
    pub summary: Kv,
}

/// Everything measured in one pass, in the order the sections ran.
#[derive(Default)]
pub struct Measured {
    pub overhead: Vec<Overhead>,
    /// None: no virtualenv with real torch.
    pub side: Option<Vec<SideBySide>>,
    pub storms: Vec<Storm>,
    /// The long run: its daemon numbers and step count.
    pub footprint: Option<(DaemonStats, f64)>,
    /// (group, daemon numbers, steps) of every B run of the overhead rows.
    pub footprints: Vec<(String, DaemonStats, f64)>,
    /// (target kind, time to attach s, time to verdict s).
    pub attach_times: Vec<(String, f64, f64)>,
    pub accuracy: Vec<Accuracy>,
}

/// Runs pair `i`'s two runs, A (`false`) then B (`true`) on even pairs and B then A on odd
/// ones (A B B A …): an effect of order or drift cancels over the pairs instead of reading as
/// the daemon's cost. Returns (A, B).
fn abba<R>(
    ctx: &mut Ctx,
    i: usize,
    mut run: impl FnMut(&mut Ctx, bool) -> anyhow::Result<R>,
) -> anyhow::Result<(R, R)> {
    if i.is_multiple_of(2) {
        let a = run(ctx, false)?;
        Ok((a, run(ctx, true)?))
    } else {
        let b = run(ctx, true)?;
        Ok((run(ctx, false)?, b))
    }
}

fn step_ms(kv: &Option<Kv>) -> f64 {
    kv.as_ref()
        .and_then(|t| f(t, "step_median_ms"))
        .unwrap_or(f64::NAN)
}

/// 1a. The realistic stand-in loops, A/B pairs.
pub fn realistic(ctx: &mut Ctx, plan: &Plan, m: &mut Measured) -> anyhow::Result<()> {
    for &ms in plan.realistic {
        let steps = plan
            .realistic_steps
            .iter()
            .find(|(m, _)| *m == ms)
            .unwrap()
            .1;
        let args = vec![
            format!("{BENCH_DIR}/realistic.py"),
            "--step-ms".into(),
            ms.to_string(),
            "--steps".into(),
            steps.to_string(),
        ];
        let mut row = Overhead {
            label: format!("realistic {ms} ms (stand-in CUDA, {steps} steps)"),
            a_ms: vec![],
            b_ms: vec![],
            ratios: vec![],
        };
        for i in 0..plan.pairs {
            eprintln!(
                "xtask bench: realistic {ms} ms, pair {}/{}",
                i + 1,
                plan.pairs
            );
            let py = ctx.py.clone();
            let (a, b) = abba(ctx, i, |ctx, on| {
                if on {
                    ctx.run(&format!("real{ms}-b"), &py, &args, Some(&REC))
                } else {
                    ctx.run(&format!("real{ms}-a"), &py, &args, None)
                }
            })?;
            let (ta, tb) = (step_ms(&a.truth), step_ms(&b.truth));
            row.ratios.push(tb / ta);
            row.a_ms.push(ta);
            row.b_ms.push(tb);
            let d = b.daemon.unwrap();
            m.attach_times.push((
                "stand-in runtime + fake torch".into(),
                d.attach_s,
                d.verdict_s.unwrap_or(f64::NAN),
            ));
            m.footprints.push((
                format!("realistic {ms} ms"),
                d,
                f(b.truth.as_ref().unwrap(), "steps").unwrap_or(0.0),
            ));
        }
        m.overhead.push(row);
    }
    Ok(())
}

/// 1b + 5. Real PyTorch on CPU: plain, daemon attached, TraceML (`traceml run`), alternating.
pub fn real_torch(ctx: &mut Ctx, plan: &Plan, m: &mut Measured) -> anyhow::Result<()> {
    let Some(tp) = ctx.torch_py.clone() else {
        return Ok(());
    };
    let mut side = vec![];
    for &sc in plan.traceml_scenarios {
        let args = vec![
            format!("{BENCH_DIR}/real_torch_loop.py"),
            "--scenario".into(),
            sc.into(),
        ];
        let mut s = SideBySide {
            scenario: sc.to_owned(),
            overhead: Overhead {
                label: format!("real PyTorch CPU `{sc}`"),
                a_ms: vec![],
                b_ms: vec![],
                ratios: vec![],
            },
            c_ms: vec![],
            rc: vec![],
            wall: [vec![], vec![], vec![]],
            truth: Kv::new(),
            ours: Kv::new(),
            theirs: None,
            traceml_err: ctx.traceml.as_ref().err().cloned(),
        };
        let mut first = true;
        for i in 0..plan.pairs {
            eprintln!(
                "xtask bench: real torch {sc}, round {}/{}",
                i + 1,
                plan.pairs
            );
            let (a, b) = abba(ctx, i, |ctx, on| {
                if on {
                    ctx.run(&format!("torch-{sc}-b"), &tp, &args, Some(&REC))
                } else {
                    ctx.run(&format!("torch-{sc}-a"), &tp, &args, None)
                }
            })?;
            let (ta, tb) = (step_ms(&a.truth), step_ms(&b.truth));
            s.overhead.a_ms.push(ta);
            s.overhead.b_ms.push(tb);
            s.overhead.ratios.push(tb / ta);
            s.wall[0].push(a.wall_s);
            s.wall[1].push(b.wall_s);
            let d = b.daemon.unwrap();
            m.attach_times.push((
                "real torch 2.15 (CPU)".into(),
                d.attach_s,
                d.verdict_s.unwrap_or(f64::NAN),
            ));
            if first {
                s.ours = d.summary.clone();
                s.truth = b.truth.clone().unwrap_or_default();
                first = false;
            }
            m.footprints.push((
                format!("real torch {sc}"),
                d,
                f(b.truth.as_ref().unwrap(), "steps").unwrap_or(0.0),
            ));
            if s.traceml_err.is_none() {
                match run_traceml(ctx, sc) {
                    Ok((t, summary, w)) => {
                        let tc = f(&t, "step_median_ms").unwrap();
                        s.c_ms.push(tc);
                        s.rc.push(tc / ta);
                        s.wall[2].push(w);
                        if s.theirs.is_none() {
                            s.theirs = Some(summary);
                        }
                    }
                    Err(e) => s.traceml_err = Some(format!("{e:#}")),
                }
            }
        }
        side.push(s);
    }
    m.side = Some(side);
    Ok(())
}

/// 1c. Storms: ns added per call of one kind of probe hit.
pub fn storms(ctx: &mut Ctx, plan: &Plan, m: &mut Measured) -> anyhow::Result<()> {
    let modes: [StormMode; 6] = [
        (
            "pyframe",
            "frame evaluator entered from C (uninteresting code: py_enter + return probe, no event)",
            &[],
            "1 enter + 1 return",
        ),
        (
            "module",
            "`Module.__call__` of an empty module (classified frames: events)",
            &[],
            "see events/call",
        ),
        (
            "launch",
            "`cudaLaunchKernel`, `--launch-mode events`",
            &[],
            "1 launch",
        ),
        (
            "launch",
            "`cudaLaunchKernel`, `--launch-mode count`",
            &["--launch-mode", "count"],
            "1 launch",
        ),
        (
            "sync",
            "`cudaStreamSynchronize` (copy/sync call: enter + return)",
            &[],
            "1 enter + 1 return",
        ),
        (
            "record",
            "`record_function` enter + exit (native)",
            &[],
            "1 enter + 1 exit",
        ),
    ];
    m.storms = storm_rows(ctx, plan, &modes)?;
    Ok(())
}

/// A storm: (storm.py mode, what the row says, the daemon's extra flags, hits per call).
pub type StormMode = (
    &'static str,
    &'static str,
    &'static [&'static str],
    &'static str,
);

/// The driver-path storms (issue 52): a vendor library's launches through its own runtime
/// copy (the driver's launch probe, its caller read), the same through pointers the daemon
/// followed, and `cuGetProcAddress` itself (entry and return probe, an event, the daemon's look).
pub const DRIVER_STORMS: [StormMode; 3] = [
    (
        "vendor",
        "`cuLaunchKernel` from a library's own runtime copy (exported entry point)",
        &[],
        "1 launch",
    ),
    (
        "vendor_internal",
        "`cuLaunchKernel` through a followed `cuGetProcAddress` pointer (not the export)",
        &[],
        "1 launch",
    ),
    (
        "procaddr",
        "`cuGetProcAddress_v2` (enter + return, an event; at library load only)",
        &[],
        "1 enter + 1 return",
    ),
];

/// Each storm of `modes` in `plan.pairs` ABBA pairs (without, then with the daemon).
pub fn storm_rows(ctx: &mut Ctx, plan: &Plan, modes: &[StormMode]) -> anyhow::Result<Vec<Storm>> {
    let mut rows = Vec::new();
    for &(mode, what, extra, hits) in modes {
        // Each launch queues an operation on the stand-in's device thread, which drains slowly on
        // two busy cores: fewer launches keep the run short (the loop itself is timed alone).
        let n = if matches!(mode, "launch" | "vendor" | "vendor_internal") {
            plan.storm_n / 5
        } else {
            plan.storm_n
        };
        let args = vec![
            format!("{BENCH_DIR}/storm.py"),
            "--mode".into(),
            mode.into(),
            "--n".into(),
            n.to_string(),
            "--reps".into(),
            plan.storm_reps.to_string(),
        ];
        let mut s = Storm {
            what,
            hits,
            base: vec![],
            diffs: vec![],
            events: vec![],
            lost: vec![],
        };
        for i in 0..plan.pairs {
            eprintln!(
                "xtask bench: storm {mode} {extra:?}, pair {}/{}",
                i + 1,
                plan.pairs
            );
            let py = ctx.py.clone();
            let (a, b) = abba(ctx, i, |ctx, on| {
                if on {
                    ctx.run(&format!("storm-{mode}-b"), &py, &args, Some(extra))
                } else {
                    ctx.run(&format!("storm-{mode}-a"), &py, &args, None)
                }
            })?;
            let (na, nb) = (
                storm_ns(&a.last_line).ok_or_else(|| anyhow::anyhow!("storm output"))?,
                storm_ns(&b.last_line).ok_or_else(|| anyhow::anyhow!("storm output"))?,
            );
            s.diffs.push(nb - na);
            s.base.push(na);
            let d = b.daemon.unwrap();
            s.events
                .push(f(&d.summary, "events").unwrap_or(0.0) / (n as f64 * plan.storm_reps as f64));
            s.lost.push(f(&d.summary, "lost_ratio").unwrap_or(0.0));
        }
        rows.push(s);
    }
    Ok(rows)
}

/// 2. Footprint: a long realistic run with recording.
pub fn footprint(ctx: &mut Ctx, plan: &Plan, m: &mut Measured) -> anyhow::Result<()> {
    eprintln!(
        "xtask bench: footprint run ({} steps)",
        plan.footprint_steps
    );
    let args = vec![
        format!("{BENCH_DIR}/realistic.py"),
        "--step-ms".into(),
        "20".into(),
        "--steps".into(),
        plan.footprint_steps.to_string(),
    ];
    let py = ctx.py.clone();
    let fp = ctx.run("footprint", &py, &args, Some(&REC))?;
    let steps = f(fp.truth.as_ref().unwrap(), "steps").unwrap_or(0.0);
    let d = fp.daemon.unwrap();
    m.attach_times.push((
        "stand-in runtime + fake torch".into(),
        d.attach_s,
        d.verdict_s.unwrap_or(f64::NAN),
    ));
    m.footprint = Some((d, steps));
    Ok(())
}

/// 4. Accuracy on the ground-truth scenarios: each once with the daemon.
pub fn accuracy(ctx: &mut Ctx, quick: bool, m: &mut Measured) -> anyhow::Result<()> {
    let mut scen: Vec<(String, PathBuf, Vec<String>)> = [
        "input_bound_single",
        "input_bound_workers",
        "h2d_bound",
        "compute_bound",
        "residual_heavy",
        "balanced",
    ]
    .iter()
    .map(|s| {
        (
            s.to_string(),
            ctx.py.clone(),
            vec![format!("tests/workloads/{s}.py")],
        )
    })
    .collect();
    if let Some(tp) = &ctx.torch_py {
        for (s, w) in [
            ("input_bound", "0"),
            ("input_bound", "2"),
            ("residual_heavy", "0"),
            ("balanced", "0"),
        ] {
            scen.push((
                format!(
                    "real_{s}{}",
                    if w == "0" {
                        String::new()
                    } else {
                        format!(" (workers {w})")
                    }
                ),
                tp.clone(),
                vec![
                    "tests/workloads/real_torch_train.py".into(),
                    "--scenario".into(),
                    s.into(),
                    "--workers".into(),
                    w.into(),
                ],
            ));
        }
    }
    if quick {
        // Development run: one scenario of each kind.
        scen.retain(|(n, _, _)| {
            ["input_bound_single", "compute_bound", "real_balanced"].contains(&n.as_str())
        });
    }
    for (name, py, args) in scen {
        eprintln!("xtask bench: accuracy {name}");
        let r = ctx.run(
            &format!("acc-{}", name.replace([' ', '(', ')'], "")),
            &py,
            &args,
            Some(&REC),
        )?;
        let d = r.daemon.unwrap();
        let label = if py == ctx.py {
            "stand-in runtime + fake torch"
        } else {
            "real torch 2.15 (CPU)"
        };
        m.attach_times
            .push((label.into(), d.attach_s, d.verdict_s.unwrap_or(f64::NAN)));
        m.accuracy.push(Accuracy {
            name,
            truth: r.truth.unwrap_or_default(),
            summary: d.summary,
        });
    }
    Ok(())
}

/// Median of a storm's added ns per call over the number of hits per call (NaN when the hits per
/// call are not fixed).
pub fn per_hit(s: &Storm) -> f64 {
    let nhits = if s.hits.starts_with("1 enter") {
        2.0
    } else if s.hits.starts_with("1 launch") {
        1.0
    } else {
        f64::NAN
    };
    med(&s.diffs) / nhits
}
