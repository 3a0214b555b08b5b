//! `--pid` and `top`: the arguments validated into a target's options, the output directory
//! checked, then one target run with its sinks (recording, `/metrics`, the live view), or, for a
//! launcher or a rank of a multi-rank job, every rank of the job on this node
//! ([`crate::runtime::supervisor::run_job`]); the final summary written and the card printed.
#[cfg(feature = "live")]
use std::path::{Path, PathBuf};
#[cfg(feature = "live")]
use std::time::Duration;

#[cfg(feature = "live")]
use super::outputs;
use super::{AttachArgs, Error};
#[cfg(feature = "live")]
use crate::runtime::{sinks, target, task::Sink};

/// Built without the `live` feature: no eBPF programs, no attach.
#[cfg(not(feature = "live"))]
pub(super) fn run(_args: AttachArgs, _top: bool) -> Result<u8, Error> {
    Err(Error::Unsupported(
        "this traceml-daemon was built without the `live` feature: it cannot attach, only run \
         the offline subcommands (replay, compare, ...); rebuild with default features"
            .into(),
    ))
}

/// The target's options from the arguments (every value checked by its parser: `cli::settings`).
#[cfg(feature = "live")]
fn options(args: &AttachArgs, pid: u32) -> target::Options {
    let mut opts = args.tunables.options(pid);
    opts.ready_file = args.ready_file.clone();
    opts.duration = args.duration.map(Duration::from_secs_f64);
    opts
}

/// `traceml-logs/<comm>-<pid>-<UTC time>/` unless `--output` says.
#[cfg(feature = "live")]
fn output_dir(args: &AttachArgs, pid: u32) -> PathBuf {
    args.output.clone().unwrap_or_else(|| {
        let comm = crate::host::procinfo::comm(pid)
            .map(|b| crate::sanitize::comm(&b))
            .unwrap_or_default();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        PathBuf::from("traceml-logs").join(format!(
            "{}-{pid}-{}",
            crate::sanitize::dir_name(&comm),
            crate::units::utc_stamp(now)
        ))
    })
}

/// `/metrics` served at `addr` (validated before any kernel work), when asked.
#[cfg(feature = "live")]
fn metrics(addr: Option<&str>) -> Result<Option<crate::metrics::http::Shared>, Error> {
    let Some(addr) = addr
        .map(crate::metrics::http::parse_addr)
        .transpose()
        .map_err(Error::Usage)?
    else {
        return Ok(None);
    };
    let exporter = crate::metrics::http::Shared::default();
    let bound = crate::metrics::http::serve(addr, exporter.clone())
        .map_err(|e| Error::Usage(format!("--metrics-addr {addr}: cannot listen: {e}")))?;
    eprintln!("traceml-daemon: metrics at http://{bound}/metrics");
    Ok(Some(exporter))
}

/// The job's label on `/metrics`: the output directory's name.
#[cfg(feature = "live")]
fn job_label(dir: &Path, pid: u32) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| format!("pid-{pid}"))
}

/// The single-pid run: the default mode, or `top` (`top`: the live view).
#[cfg(feature = "live")]
pub(super) fn run(args: AttachArgs, top: bool) -> Result<u8, Error> {
    let Some(pid) = args.pid else {
        return Err(Error::Usage(
            "give --pid PID of the training process (or a subcommand: replay, compare; see --help)"
                .into(),
        ));
    };
    // Every value was checked when parsed (`--metrics-addr` too); it is served once the run
    // starts.
    let opts = options(&args, pid);
    target::preflight(pid)?;
    let dir = output_dir(&args, pid);
    let out = outputs::prepare(&dir)?;
    // `--pid` is an explicit request by an admin: a target's opt-out (honoured by `serve`) is
    // not, but the admin is told.
    if let Some(v) = crate::host::jobs::opt_out(pid).filter(|v| !v.is_empty() && v != "0") {
        eprintln!(
            "traceml-daemon: pid {pid} opted out of profiling (TRACEML_DISABLE={}); attaching \
             anyway: --pid is an explicit request (serve skips such processes)",
            crate::sanitize::terminal(&v)
        );
    }
    // A launcher or a rank of a multi-rank job: every rank of the job on this node.
    let job = crate::host::jobs::discover(pid);
    // A launcher is never the target itself: one still in rendezvous (no ranks yet) is waited on.
    let summary = if job.ranks.len() >= 2 || job.launcher == Some(pid) {
        run_job(&args, opts, job, &dir, top)?
    } else {
        match run_one(&args, opts, &dir, top)? {
            Some(s) => s,
            None => return Ok(0),
        }
    };
    outputs::write(&summary, &out, &args.common)?;
    Ok(0)
}

#[cfg(feature = "live")]
fn run_job(
    args: &AttachArgs,
    opts: target::Options,
    job: crate::host::jobs::JobSpec,
    dir: &Path,
    top: bool,
) -> Result<crate::summary::Summary, Error> {
    use crate::runtime::{group::GroupConfig, supervisor};
    // `top`: the job's summary every second, one row per rank.
    let view: Option<supervisor::JobViewFn> = if top {
        let display = crate::runtime::view::display_for(true, args.common.quiet);
        crate::runtime::view::JobView::new(opts.pid, display)
            .map_err(|e| Error::Unexpected(format!("setting up the terminal: {e}")))?
            .map(|mut v| Box::new(move |s: &crate::summary::Summary| v.show(s)) as Box<_>)
    } else {
        None
    };
    if !job.ranks.is_empty() {
        let ranks: Vec<String> = job
            .ranks
            .iter()
            .map(|r| format!("{} (pid {})", r.rank, r.pid))
            .collect();
        eprintln!(
            "traceml-daemon: pid {} is part of a {}-rank job{}; attaching to ranks {}",
            opts.pid,
            job.ranks.len(),
            job.launcher
                .map(|l| format!(" launched by pid {l}"))
                .unwrap_or_default(),
            ranks.join(", ")
        );
    }
    let run = supervisor::JobRun {
        group: GroupConfig {
            name: job_label(dir, opts.pid),
            dir: dir.to_path_buf(),
            owner: crate::host::output::Owner::from_sudo(),
            hang_after: args.tunables.hang_after(),
            window: None,
            metrics: metrics(args.metrics_addr.as_deref())?,
            // The job's summary is written by `run`, in the formats asked for.
            writes_final: false,
            record: args.record.clone(),
        },
        duration: opts.duration,
        ready_file: opts.ready_file.clone(),
        rank: opts,
        view,
    };
    supervisor::run_job(job, run).map_err(Error::Target)
}

/// One target; `None` when it failed before anything was gathered (said, exit 0 is not used:
/// the error is returned).
#[cfg(feature = "live")]
fn run_one(
    args: &AttachArgs,
    opts: target::Options,
    dir: &Path,
    top: bool,
) -> Result<Option<crate::summary::Summary>, Error> {
    let mut list: Vec<Box<dyn Sink>> = Vec::new();
    if let Some(p) = &args.record {
        list.push(Box::new(
            sinks::RecordingSink::create(p).map_err(Error::Usage)?,
        ));
    }
    if let Some(exporter) = metrics(args.metrics_addr.as_deref())? {
        let label = job_label(dir, opts.pid);
        list.push(Box::new(sinks::Metrics::attach(
            exporter, &label, 0, opts.pid, true,
        )));
    }
    // The stream is folded as it arrives (bounded memory over runs of any length), and shown
    // while it goes: `top`'s live view, or the liveness line on a terminal.
    let display = crate::runtime::view::display_for(top, args.common.quiet);
    let outcome = crate::runtime::view::run(opts, display, list)
        .map_err(|e| Error::Unexpected(format!("setting up the terminal: {e}")))?;
    if let Some(e) = outcome.sink_errors.first() {
        return Err(Error::Unexpected(e.clone()));
    }
    match (outcome.result, outcome.summary) {
        (Ok(reason), Some((summary, _))) => {
            tracing::info!("run ended: {reason:?}");
            Ok(Some(summary))
        }
        // Attached and then failed: what was gathered is summarised, and why is said.
        (Err(e), Some((summary, _))) => {
            eprintln!(
                "traceml-daemon: {}; writing the summary of what was gathered",
                crate::sanitize::terminal(&e.to_string())
            );
            Ok(Some(summary))
        }
        (Err(e), None) => Err(Error::Live(e)),
        (Ok(_), None) => Ok(None),
    }
}
