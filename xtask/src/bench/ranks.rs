//! `--ranks-only` (issue 23): attach and stop at node scale. `tests/workloads/bench/stop_job.py`
//! starts an N-rank gloo DDP job (torchrun, real torch on CPU) and the daemon on it — `--pid
//! <launcher>`, or `serve` finding the ranks itself — and measures the time from the daemon's
//! start until every rank is attached (its `attached to <pid>` log lines), and from SIGINT
//! (`--pid`) or SIGTERM (`serve`) to the summary and to the daemon's exit, with the ranks still
//! running. 1, 2 and 4 ranks (8 need more than this machine's 2 cores and 23 GiB to mean anything).
//! Then what the daemon with its collective ledger costs a 4-rank job's step
//! (`tests/workloads/bench/ledger_job.py`: on/off windows of one job, issue 41).
use std::process::Command;

use anyhow::{Context as _, ensure};

use super::runs::Ctx;
use crate::root;

pub const HEADING: &str = "## Attach and stop at node scale";

/// Seconds the job runs attached before the stop signal.
const WAIT_S: u32 = 3;
pub const RANKS: [u32; 3] = [1, 2, 4];

pub struct Row {
    pub mode: &'static str,
    pub ranks: u32,
    pub attach_all_s: f64,
    pub signal_to_summary_s: Option<f64>,
    pub signal_to_exit_s: f64,
    pub ranks_alive: u64,
    pub rc: i64,
}

/// Runs `tests/workloads/bench/<script> WORKSPACE DAEMON ARGS...` with the torch venv and reads
/// the one JSON line it prints last.
fn run_job_script(ctx: &Ctx, script: &str, args: &[String]) -> anyhow::Result<serde_json::Value> {
    let py = ctx
        .torch_py
        .clone()
        .context("no virtualenv with real torch (run `cargo xtask setup --torch`)")?;
    let out = Command::new(&ctx.py)
        .arg(root().join("tests/workloads/bench").join(script))
        .arg(root())
        .arg(&ctx.daemon)
        .args(args)
        .env("TRACEML_TORCH_PYTHON", py)
        .output()
        .with_context(|| format!("running {script}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "{script} {}: {}\n{stdout}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).with_context(|| format!("{script} said {line:?}"))
}

pub fn measure(ctx: &Ctx, mode: &'static str, ranks: u32) -> anyhow::Result<Row> {
    let v = run_job_script(
        ctx,
        "stop_job.py",
        &[ranks.to_string(), WAIT_S.to_string(), mode.to_owned()],
    )?;
    let f = |k: &str| v[k].as_f64();
    Ok(Row {
        mode,
        ranks,
        attach_all_s: f("attach_all_s").context("attach_all_s")?,
        signal_to_summary_s: f("sigint_to_summary_s"),
        signal_to_exit_s: f("sigint_to_exit_s").context("sigint_to_exit_s")?,
        ranks_alive: v["ranks_alive_at_exit"].as_u64().unwrap_or(0),
        rc: v["rc"].as_i64().unwrap_or(-1),
    })
}

/// Seconds of each on and off window of the ledger measurement, and how many on windows.
const LEDGER_WINDOW_S: u32 = 10;
const LEDGER_ON_WINDOWS: u32 = 3;

/// A 4-rank job's step time with the daemon (and its ledger) attached and not.
pub struct LedgerRow {
    pub ranks: u32,
    /// Rank 0's median step ms of each window, off and on in turn (off first and last).
    pub windows: Vec<(bool, u64, Option<f64>)>,
    /// Per on window: its median step / the mean of its off neighbours'.
    pub ratios: Vec<f64>,
    /// Per on window: the collectives the job summary compared across ranks.
    pub joined: Vec<Option<u64>>,
}

pub fn measure_ledger(ctx: &Ctx, ranks: u32) -> anyhow::Result<LedgerRow> {
    let v = run_job_script(
        ctx,
        "ledger_job.py",
        &[
            ranks.to_string(),
            LEDGER_WINDOW_S.to_string(),
            LEDGER_ON_WINDOWS.to_string(),
        ],
    )?;
    let windows = v["windows"]
        .as_array()
        .context("windows")?
        .iter()
        .map(|w| {
            (
                w["kind"] == "on",
                w["steps"].as_u64().unwrap_or(0),
                w["median_ms"].as_f64(),
            )
        })
        .collect();
    let ratios = v["ratios"]
        .as_array()
        .context("ratios")?
        .iter()
        .filter_map(|r| r.as_f64())
        .collect();
    let joined = v["joined"]
        .as_array()
        .context("joined")?
        .iter()
        .map(|j| j.as_u64())
        .collect();
    Ok(LedgerRow {
        ranks,
        windows,
        ratios,
        joined,
    })
}

/// The ledger table (appended to [`section`]).
pub fn ledger_section(r: &LedgerRow) -> String {
    let mut s = format!(
        "\n### What the daemon with its collective ledger costs a {}-rank job's step\n\n\
         `tests/workloads/bench/ledger_job.py`: one torchrun gloo DDP job ({} ranks, real torch on \
         CPU, one all_reduce a step) runs throughout; `traceml-daemon --pid <launcher>` is attached \
         in the *on* windows ({LEDGER_WINDOW_S} s from every rank attached to the daemon's end) and \
         absent in the *off* ones ({LEDGER_WINDOW_S} s), off first and last. Rank 0's median step \
         per window (its progress log, CLOCK_MONOTONIC at each step's end); each on window against \
         the mean of the off windows beside it. The whole daemon is on in the on windows (every \
         probe, the ledger's among them): an upper bound on the ledger's own cost. *Joined*: the \
         collectives the job summary compared across ranks (the ledger at work).\n\n\
         | window | steps | median step | on / off neighbours | collectives joined |\n\
         |---|---|---|---|---|\n",
        r.ranks, r.ranks
    );
    // Every on window lies between two off windows: its ratio and its joined count share its index.
    let mut on_i = 0usize;
    for (i, (on, steps, ms)) in r.windows.iter().enumerate() {
        let (ratio, joined) = if *on {
            let out = (
                r.ratios
                    .get(on_i)
                    .map_or("—".to_owned(), |x| format!("{x:.4}")),
                r.joined
                    .get(on_i)
                    .copied()
                    .flatten()
                    .map_or("—".to_owned(), |j| j.to_string()),
            );
            on_i += 1;
            out
        } else {
            ("".to_owned(), "".to_owned())
        };
        s += &format!(
            "| {} {} | {steps} | {} | {ratio} | {joined} |\n",
            if *on { "on" } else { "off" },
            i + 1,
            ms.map_or("—".to_owned(), |m| format!("{m:.2} ms")),
        );
    }
    if !r.ratios.is_empty() {
        let mut v = r.ratios.clone();
        v.sort_by(f64::total_cmp);
        let med = v[v.len() / 2];
        s += &format!(
            "\nOn / off, median of the on windows: **{med:.4}** ({:+.1} %), min {:.4}, max {:.4}.\n",
            (med - 1.0) * 100.0,
            v[0],
            v[v.len() - 1]
        );
    }
    s
}

pub fn section(rows: &[Row], daemon: &str, load: &str) -> String {
    let mut s = format!(
        "{HEADING}\n\n\
         Written by `cargo xtask bench --ranks-only`; `{daemon}`; `tests/workloads/bench/stop_job.py` \
         on a torchrun gloo DDP job (real torch on CPU). *Attached* is the time from the \
         daemon's start until every rank's probes are in; the stop is SIGINT for `--pid \
         <launcher>`, SIGTERM for `serve`, {WAIT_S} s after the attach, with every rank still \
         running. Issue 23's bounds for 4 ranks: attached ≤ 3 s; `--pid` exits ≤ 3 s after \
         SIGINT; `serve` exits ≤ 5 s after SIGTERM. Load average before: {load}.\n\n\
         | daemon | ranks | attached | signal → summary | signal → exit | ranks alive at exit | exit status |\n\
         |---|---|---|---|---|---|---|\n"
    );
    for r in rows {
        s += &format!(
            "| `{}` | {} | {:.2} s | {} | **{:.2} s** | {} | {} |\n",
            if r.mode == "serve" {
                "serve"
            } else {
                "--pid <launcher>"
            },
            r.ranks,
            r.attach_all_s,
            r.signal_to_summary_s
                .map_or("—".to_owned(), |t| format!("{t:.2} s")),
            r.signal_to_exit_s,
            r.ranks_alive,
            r.rc,
        );
    }
    s.push_str(
        "\nEach file's probe sites are resolved in one pass over its symbol tables and cached by \
         file (device, inode, size, mtime): the first rank pays for libtorch's tables, the others \
         reuse them; the eBPF programs of the ranks are loaded (verified) on blocking threads \
         together. Links are `uprobe_multi` (one per program and file) and are dropped on their \
         own threads, waited for before the exit. Before issue 23: 4 ranks attached one after \
         another, 8.3 s after the start on a quiet machine (~22 s under load), and `--pid` \
         exited 26.7 s after SIGINT (one unregistration per perf link, ~120 ms each).\n",
    );
    s
}
