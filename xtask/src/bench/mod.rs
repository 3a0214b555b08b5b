//! `cargo xtask bench [--quick] [--inprocess-only]`: measures traceml-daemon on this machine and
//! (re)writes BENCHMARKS.md. Every comparison is paired (A B · B A · …, a fresh process per run) and
//! reported as medians with min/max, because the project's machines are small and shared; the
//! in-process section instead attaches and detaches the daemon in windows of one long run.
//!
//! Split by phase of work: `runs` (processes, the daemon, virtualenvs), `measure` (the paired
//! sections) and `inprocess` (the windowed runs) measure; `stats` computes; `report` writes.
//! Workloads: `tests/workloads/bench/`, `tests/workloads/frameworks/` and the ground-truth
//! scenarios of `tests/workloads/`. JSON files are read through
//! `tests/workloads/bench/bench_json.py` (xtask has no JSON parser).
//!
//! For iterating on the in-process section: `TRACEML_BENCH_WORKLOADS=<name substring>`,
//! `TRACEML_BENCH_ON_WINDOWS=<n>` and `TRACEML_BENCH_WINDOW_S=<s>` narrow it.
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::Context as _;

use crate::{root, run, setup};

mod bystander;
mod inprocess;
mod measure;
mod ranks;
mod replay;
mod report;
mod runs;
mod sched;
mod service;
mod stats;
mod sweep;

use runs::{Ctx, sh, torch_python, traceml_venv};

/// How much of each section to run.
pub struct Plan {
    pairs: usize,
    storm_n: u32,
    storm_reps: u32,
    realistic: &'static [u32],
    realistic_steps: [(u32, u32); 3],
    footprint_steps: u32,
    traceml_scenarios: &'static [&'static str],
}

const FULL: Plan = Plan {
    pairs: 5,
    storm_n: 100_000,
    storm_reps: 3,
    realistic: &[20, 100, 500],
    realistic_steps: [(20, 60), (100, 24), (500, 8)],
    footprint_steps: 1000,
    traceml_scenarios: &["input_bound", "residual_heavy", "balanced"],
};

const QUICK: Plan = Plan {
    pairs: 3,
    storm_n: 30_000,
    storm_reps: 3,
    realistic: &[20],
    realistic_steps: [(20, 40), (100, 12), (500, 4)],
    footprint_steps: 200,
    traceml_scenarios: &["balanced"],
};

/// Prepares the context every run shares: the daemon build, interpreters, scratch directory.
fn prepare(release: bool, traceml: bool) -> anyhow::Result<Ctx> {
    setup::all(false)?;
    let root = root();
    let mut build = Command::new("cargo");
    build.args(["build", "-p", "traceml-daemon"]);
    if release {
        build.arg("--release");
    }
    run(build.current_dir(&root))?;
    let torch_py = torch_python();
    let traceml = match (&torch_py, traceml) {
        (_, false) => Err("not run".to_owned()),
        (None, true) => {
            Err("no virtualenv with real torch (run `cargo xtask setup --torch`)".to_owned())
        }
        (Some(t), true) => traceml_venv(t).map_err(|e| format!("{e:#}")),
    };
    let scratch = std::env::temp_dir().join("traceml-bench");
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch)?;
    // A copy: other builds in the shared target directory (other features, other commits) may
    // replace the binary while the bench runs.
    let built = root.join(if release {
        "target/release/traceml-daemon"
    } else {
        "target/debug/traceml-daemon"
    });
    let daemon = scratch.join("traceml-daemon");
    std::fs::copy(&built, &daemon).with_context(|| format!("copying {}", built.display()))?;
    Ok(Ctx {
        py: setup::pyenv_python("3.11")?,
        torch_py,
        traceml,
        daemon,
        scratch,
        env: setup::test_env()?,
        clk_tck: sh("getconf CLK_TCK").parse().unwrap_or(100.0),
        n: 0,
    })
}

/// Which sections `cargo xtask bench` runs (none of the `_only` flags: all of them).
pub struct Only {
    pub quick: bool,
    pub inprocess_only: bool,
    pub sweep_only: bool,
    pub replay_only: bool,
    pub service_only: bool,
    pub long_minutes: Option<u32>,
    pub bystander_only: bool,
    pub ranks_only: bool,
    pub sched_only: bool,
    pub driver_only: bool,
}

pub fn bench(only: Only) -> anyhow::Result<()> {
    let Only {
        quick,
        inprocess_only,
        sweep_only,
        replay_only,
        service_only,
        long_minutes,
        bystander_only,
        ranks_only,
        sched_only,
        driver_only,
    } = only;
    let started = Instant::now();
    let path: PathBuf = root().join("BENCHMARKS.md");
    if bystander_only {
        return bystander_section(&path);
    }
    if ranks_only {
        return ranks_section(&path);
    }
    if sched_only {
        return sched_section(&path);
    }
    if driver_only {
        return driver_section(&path, quick);
    }
    if sweep_only {
        return sweep_section(&path);
    }
    if service_only || long_minutes.is_some() {
        return service_section(&path, service_only, long_minutes);
    }
    if replay_only {
        return replay_section(&path, quick);
    }
    if inprocess_only {
        return inprocess_section(&path, started);
    }
    all_sections(&path, quick, started)
}

/// `--inprocess-only`: the in-process windows (release build), spliced into BENCHMARKS.md.
fn inprocess_section(path: &std::path::Path, started: Instant) -> anyhow::Result<()> {
    // The release build, as users install it (`cargo install`) and as the full bench runs
    // it (this section's runs before 2026-12-01 evening used the dev build).
    let mut ctx = prepare(true, false)?;
    let schedule = inprocess::schedule();
    let runs = inprocess::run_all(&mut ctx, &schedule);
    let section = report::inprocess(&runs, &schedule, "target/release/traceml-daemon");
    let old = std::fs::read_to_string(path).unwrap_or_default();
    std::fs::write(path, report::splice_inprocess(&old, &section))
        .context("writing BENCHMARKS.md")?;
    eprintln!(
        "xtask bench: wrote the in-process section of BENCHMARKS.md in {:.1} min (raw runs in {})",
        started.elapsed().as_secs_f64() / 60.0,
        ctx.scratch.display()
    );
    Ok(())
}

/// The whole bench (no `--*-only` flag): the paired sections and every other section, measured
/// in this one run, written as a new BENCHMARKS.md.
fn all_sections(path: &std::path::Path, quick: bool, started: Instant) -> anyhow::Result<()> {
    let plan = if quick { &QUICK } else { &FULL };
    let mut ctx = prepare(true, true)?;
    let load_start = sh("cat /proc/loadavg");
    let mut m = measure::Measured::default();
    measure::realistic(&mut ctx, plan, &mut m)?;
    measure::real_torch(&mut ctx, plan, &mut m)?;
    measure::storms(&mut ctx, plan, &mut m)?;
    measure::footprint(&mut ctx, plan, &mut m)?;
    measure::accuracy(&mut ctx, quick, &mut m)?;
    let schedule = if quick {
        inprocess::QUICK
    } else {
        inprocess::schedule()
    };
    let inproc = inprocess::run_all(&mut ctx, &schedule);
    let header = report::Header {
        quick,
        plan,
        load_start,
        minutes: started.elapsed().as_secs_f64() / 60.0,
    };
    // Every section of the report from this one run, at this commit: the paired sections, then
    // each of the others as its `--*-only` flag measures it. A section that fails says so in
    // its place instead of keeping an older one.
    let stamp = Stamp::now(quick);
    let mut text = report::full(&ctx, &header, &m, &inproc, &schedule);
    let daemon = "target/release/traceml-daemon";
    let mut section = |heading: &str, r: anyhow::Result<String>| {
        let body = r.unwrap_or_else(|e| {
            eprintln!("xtask bench: section {heading:?} failed: {e:#}");
            format!("{heading}\n\nNot measured in this run: {e:#}\n")
        });
        text = sweep::splice_at(&text, heading, &stamp.on(&body));
    };
    let load = || sh("cat /proc/loadavg");
    section(
        sweep::HEADING,
        sweep::measure(&ctx.daemon, &ctx.scratch).map(|b| sweep::section(&b, daemon, &load())),
    );
    section(replay::HEADING, replay_bench(quick));
    section(
        service::SERVE_HEADING,
        service::eight_jobs(&mut ctx).map(|b| service::serve_section(&b, daemon, &load())),
    );
    let minutes = if quick { 2 } else { 10 };
    section(
        service::LONG_HEADING,
        service::long_live(&mut ctx, minutes * 600)
            .map(|b| service::long_section(&b, daemon, &load())),
    );
    section(bystander::HEADING, bystander_bench(&mut ctx));
    section(ranks::HEADING, ranks_bench(&ctx));
    section(DRIVER_HEADING, driver_bench(&mut ctx, plan));
    section(
        sched::HEADING,
        sched::measure(&mut ctx).map(|s| {
            let commit = sh("git -C . rev-parse --short HEAD");
            sched::section(&s, daemon, &load(), &commit)
        }),
    );
    std::fs::write(path, text).context("writing BENCHMARKS.md")?;
    eprintln!(
        "xtask bench: wrote BENCHMARKS.md in {:.1} min (raw runs in {})",
        started.elapsed().as_secs_f64() / 60.0,
        ctx.scratch.display()
    );
    Ok(())
}

/// The line under each section's heading that says which code and which run measured it.
struct Stamp(String);

impl Stamp {
    fn now(quick: bool) -> Self {
        Stamp(format!(
            "_Measured at commit `{}` (release build), {} UTC, by `cargo xtask bench{}`._",
            sh("git -C . rev-parse --short HEAD"),
            sh("date -u '+%Y-%m-%d %H:%M'"),
            if quick { " --quick" } else { "" }
        ))
    }

    /// `section` with the stamp after its heading line.
    fn on(&self, section: &str) -> String {
        let section = section.trim_start_matches('\n');
        match section.split_once('\n') {
            Some((heading, rest)) => format!("{heading}\n\n{}\n{rest}", self.0),
            None => format!("{section}\n\n{}\n", self.0),
        }
    }
}

/// Writes one section alone into BENCHMARKS.md (a `--*-only` run), stamped.
fn write_section(path: &std::path::Path, heading: &str, section: &str) -> anyhow::Result<()> {
    eprint!("{section}");
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let stamped = Stamp::now(false).on(section);
    std::fs::write(path, sweep::splice_at(&old, heading, &stamped)).context("writing BENCHMARKS.md")
}

/// The replay section's measurement (the release build of the example it replays first).
fn replay_bench(quick: bool) -> anyhow::Result<String> {
    let root = root();
    run(Command::new("cargo")
        .args(["build", "--release", "-p", "traceml-daemon"])
        .args(["--bin", "traceml-daemon", "--example", "synth_recording"])
        .current_dir(&root))?;
    let scratch = std::env::temp_dir().join("traceml-bench-replay");
    std::fs::create_dir_all(&scratch)?;
    let load = sh("cat /proc/loadavg");
    let b = replay::measure(
        &root.join("target/release/traceml-daemon"),
        &root.join("target/release/examples/synth_recording"),
        &scratch,
        if quick { 1_000_000 } else { replay::STEPS },
    )?;
    Ok(replay::section(&b, "target/release/traceml-daemon", &load))
}

fn bystander_bench(ctx: &mut Ctx) -> anyhow::Result<String> {
    let load = sh("cat /proc/loadavg");
    let runs = ["infer", "python"]
        .into_iter()
        .map(|m| bystander::measure(ctx, m))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(bystander::section(
        &runs,
        "target/release/traceml-daemon",
        &load,
    ))
}

fn ranks_bench(ctx: &Ctx) -> anyhow::Result<String> {
    let load = sh("cat /proc/loadavg");
    let mut rows = Vec::new();
    for mode in ["pid", "serve"] {
        for n in ranks::RANKS {
            rows.push(ranks::measure(ctx, mode, n)?);
        }
    }
    let mut md = ranks::section(&rows, "target/release/traceml-daemon", &load);
    md += &match ranks::measure_ledger(ctx, 4) {
        Ok(r) => ranks::ledger_section(&r),
        Err(e) => format!("\nThe ledger's cost on a 4-rank job: not measured in this run: {e:#}\n"),
    };
    Ok(md)
}

/// `--sweep-only`: the release daemon's `sweep` over 1,000 job pairs, spliced into
/// BENCHMARKS.md (no root, no setup beyond the build).
fn sweep_section(path: &std::path::Path) -> anyhow::Result<()> {
    let root = root();
    run(Command::new("cargo")
        .args(["build", "--release", "-p", "traceml-daemon"])
        .current_dir(&root))?;
    // Its own scratch directory: a full bench running meanwhile empties `traceml-bench`.
    let scratch = std::env::temp_dir().join("traceml-bench-sweep");
    std::fs::create_dir_all(&scratch)?;
    let load = sh("cat /proc/loadavg");
    let b = sweep::measure(&root.join("target/release/traceml-daemon"), &scratch)?;
    let section = sweep::section(&b, "target/release/traceml-daemon", &load);
    write_section(path, sweep::HEADING, &section)
}

/// `--replay-only`: the release daemon replaying a synthetic 10 M-step recording from a pipe,
/// its memory sampled, spliced into BENCHMARKS.md (no root; with `--quick`, 1 M steps).
fn replay_section(path: &std::path::Path, quick: bool) -> anyhow::Result<()> {
    write_section(path, replay::HEADING, &replay_bench(quick)?)
}

/// `--bystander-only`: torch processes that do not train under `serve` (release build).
fn bystander_section(path: &std::path::Path) -> anyhow::Result<()> {
    let mut ctx = prepare(true, false)?;
    write_section(path, bystander::HEADING, &bystander_bench(&mut ctx)?)
}

/// `--sched-only`: the `sched_switch` program's cost per context switch of the node (release
/// build), spliced into BENCHMARKS.md.
fn sched_section(path: &std::path::Path) -> anyhow::Result<()> {
    let mut ctx = prepare(true, false)?;
    let load = sh("cat /proc/loadavg");
    let s = sched::measure(&mut ctx)?;
    let commit = sh("git -C . rev-parse --short HEAD");
    let section = sched::section(&s, "target/release/traceml-daemon", &load, &commit);
    write_section(path, sched::HEADING, &section)
}

/// The driver-path section's heading.
const DRIVER_HEADING: &str = "## Driver paths: time added per probe hit";

/// The driver-path probes' storms (release build), as [`report::driver_section`] writes them.
fn driver_bench(ctx: &mut Ctx, plan: &Plan) -> anyhow::Result<String> {
    let load = sh("cat /proc/loadavg");
    let rows = measure::storm_rows(ctx, plan, &measure::DRIVER_STORMS)?;
    Ok(report::driver_section(
        &rows,
        "target/release/traceml-daemon",
        &load,
    ))
}

/// `--driver-only`: the driver-path probes' cost per hit, spliced into BENCHMARKS.md.
fn driver_section(path: &std::path::Path, quick: bool) -> anyhow::Result<()> {
    let mut ctx = prepare(true, false)?;
    let plan = if quick { &QUICK } else { &FULL };
    write_section(path, DRIVER_HEADING, &driver_bench(&mut ctx, plan)?)
}

/// `--ranks-only`: attach and stop of 1, 2 and 4 ranks, `--pid` and `serve` (release build).
fn ranks_section(path: &std::path::Path) -> anyhow::Result<()> {
    let ctx = prepare(true, false)?;
    write_section(path, ranks::HEADING, &ranks_bench(&ctx)?)
}

/// `--service-only` (serve with 8 jobs at once) and `--long-minutes M` (one `--pid` daemon on a
/// job of about M minutes): the release daemon's own CPU and memory, spliced into BENCHMARKS.md.
fn service_section(
    path: &std::path::Path,
    eight: bool,
    long_minutes: Option<u32>,
) -> anyhow::Result<()> {
    let mut ctx = prepare(true, false)?;
    let daemon = "target/release/traceml-daemon";
    if eight {
        let load = sh("cat /proc/loadavg");
        let b = service::eight_jobs(&mut ctx)?;
        write_section(
            path,
            service::SERVE_HEADING,
            &service::serve_section(&b, daemon, &load),
        )?;
    }
    if let Some(m) = long_minutes {
        let load = sh("cat /proc/loadavg");
        // ~100 ms steps: 600 a minute.
        let b = service::long_live(&mut ctx, m.max(1) * 600)?;
        write_section(
            path,
            service::LONG_HEADING,
            &service::long_section(&b, daemon, &load),
        )?;
    }
    Ok(())
}
