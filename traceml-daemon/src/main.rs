//! `traceml-daemon`: the command line. Parses and validates arguments into options before any
//! kernel work, runs the live attach, `replay` or `compare`, and maps failures to one sentence and
//! a distinct exit status (see `--help`).
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
#[cfg(feature = "live")]
use std::time::Duration;

use anyhow::Context as _;
use clap::{CommandFactory as _, Parser, Subcommand, ValueEnum};
use traceml_daemon::event::{End, EndReason, StreamItem};
#[cfg(feature = "live")]
use traceml_daemon::live;
#[cfg(feature = "live")]
use traceml_daemon::metrics;
use traceml_daemon::output::{self, OutDir, Owner};
use traceml_daemon::overhead::Policy;
use traceml_daemon::sanitize::terminal;
use traceml_daemon::{analysis, compare, record, render, summary::Summary, sweep};

/// `--version`: the crate version and the commit it was built from (build.rs).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("TRACEML_GIT_COMMIT"),
    ")"
);

const AFTER_HELP: &str = "\
Exit status: 0 success; 1 unexpected failure, or compare or sweep found a REGRESSION (sweep \
--fail-on any: a job neither EQUIVALENT nor IMPROVEMENT); 2 bad arguments or input files; 3 the \
target cannot be profiled (no such pid, not Python); 4 missing privileges or kernel support.

Proven on real GPUs: not yet. The CUDA probes are exercised against a stand-in CUDA runtime and \
attached to the real libcudart from PyPI; see docs/gpu-validation.md.";

#[derive(Debug, Parser)]
#[command(name = "traceml-daemon", version = VERSION, about, after_help = AFTER_HELP, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    attach: AttachArgs,
}

#[derive(Debug, clap::Args)]
struct AttachArgs {
    /// Pid of the running training process to attach to.
    #[arg(long, short)]
    pid: Option<u32>,
    /// Directory for final_summary.json/.txt and final_report.html [default:
    /// traceml-logs/<name>-<pid>-<time>/].
    #[arg(long, short)]
    output: Option<PathBuf>,
    /// Also write the decoded event stream to this file, replayable with `replay`: `*.trec` is
    /// the compact binary format; `*.jsonl` (`*.jsonl.gz` compressed) is JSON Lines.
    #[arg(long)]
    record: Option<PathBuf>,
    /// Stop after this many seconds (default: when the target exits, or on SIGINT/SIGTERM).
    #[arg(long)]
    duration: Option<f64>,
    /// Write this file once the probes are attached.
    #[arg(long)]
    ready_file: Option<PathBuf>,
    /// Kernel launches: one event each (per-phase launch counts), or counted in the kernel only
    /// (lower overhead for launch-heavy jobs).
    #[arg(long, value_enum, default_value_t = LaunchMode::Events)]
    launch_mode: LaunchMode,
    /// Ring buffer size in MiB (power of two).
    #[arg(long, default_value_t = 8)]
    ring_mib: u32,
    /// Which probes run: `auto` learns the loop with every probe, then keeps the daemon's
    /// estimated cost under --overhead-budget (the frame-evaluator probe is detached once
    /// torch's markers delimit the steps); `full` keeps every probe; `markers` never arms the
    /// frame-evaluator probe.
    #[arg(long, value_enum, default_value_t = Policy::Auto)]
    probe_set: Policy,
    /// The daemon's budget on the target, in percent of step time (the governor's target).
    #[arg(long, default_value_t = 0.5)]
    overhead_budget: f64,
    /// Python stack samples of the training thread per second (names the code inside each
    /// phase); 0 turns them off.
    #[arg(long, default_value_t = 100)]
    stack_rate: u32,
    /// Multi-rank jobs: a rank that completes no step for max(10 × its median step, this many
    /// seconds) is a HANG (written to the summary at once, with every rank's stack).
    #[arg(long, default_value_t = 60.0)]
    hang_after: f64,
    /// Serve Prometheus metrics at http://ADDR/metrics while attached: HOST:PORT, HOST, :PORT;
    /// alone, 127.0.0.1:9466 (docs/metrics.md).
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "")]
    metrics_addr: Option<String>,
    #[command(flatten)]
    common: Common,
}

#[derive(Debug, Clone, clap::Args)]
struct Common {
    /// Do not print the verdict card to stdout.
    #[arg(long, short, global = true)]
    quiet: bool,
    /// Color: auto (when stdout is a terminal), always, never.
    #[arg(long, value_enum, default_value_t = Color::Auto, global = true)]
    color: Color,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LaunchMode {
    Events,
    Count,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq)]
enum Color {
    Auto,
    Always,
    Never,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Rebuild the summary of a recorded run offline (no root needed).
    Replay {
        file: PathBuf,
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
    /// Compare two final_summary.json files (A = before, B = after).
    Compare {
        a: PathBuf,
        b: PathBuf,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Copy a recording into another format, chosen by OUTPUT's name: `*.jsonl` (or
    /// `*.jsonl.gz`) JSON Lines, `*.trec` binary.
    Export {
        /// A recording of either format.
        input: PathBuf,
        #[arg(long, short)]
        output: PathBuf,
    },
    /// Write the self-contained HTML report of a final_summary.json or a recording.
    Report {
        /// A final_summary.json, or a recording (--record FILE) to summarise first.
        input: PathBuf,
        /// The HTML file to write.
        #[arg(long, short)]
        output: PathBuf,
    },
    /// Compare every job of two directory trees: jobs are the directories holding a
    /// final_summary.json, paired by their path under each root (docs/sweep.md).
    Sweep {
        baseline: PathBuf,
        candidate: PathBuf,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Exit 1 when a job regressed, or (`any`) when a job is anything but EQUIVALENT or
        /// IMPROVEMENT (unpaired jobs included).
        #[arg(long, value_enum, default_value_t = FailOn::Regression)]
        fail_on: FailOn,
    },
    /// Run as a service: find the node's training processes (Python processes that map
    /// libtorch) by itself, attach to each, write each job's summaries under --state-dir, and
    /// keep running as jobs come and go (SIGTERM: summaries written, exit 0; SIGHUP: re-read
    /// the config file).
    #[cfg(feature = "live")]
    Serve(ServeArgs),
    /// Attach to --pid like the default mode and show the run live, refreshed every second
    /// (verdict, step time, phases, CUDA, CPU, GPU, ranks, losses, the daemon's cost); `q` or
    /// Ctrl-C detaches and writes the summary. When stdout is not a terminal, one plain line per
    /// second instead.
    #[cfg(feature = "live")]
    Top(AttachArgs),
    /// Write the man pages (one per command) or a shell's completion script into DIR, generated
    /// from this command line's own definition: what `cargo xtask deb` packages. Hidden: a
    /// packaging step, not a user's command.
    #[command(hide = true)]
    Generate {
        #[arg(value_enum)]
        what: Generated,
        /// Created if missing; existing files of the same names are replaced.
        dir: PathBuf,
    },
}

/// What `generate` writes.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum Generated {
    /// `traceml-daemon.1` and `traceml-daemon-<command>.1` (roff, uncompressed).
    Man,
    /// `traceml-daemon.bash`.
    Bash,
    /// `_traceml-daemon`.
    Zsh,
    /// `traceml-daemon.fish`.
    Fish,
}

#[cfg(feature = "live")]
#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// One directory per job under it: <comm>-<pid>-<start time>/ [default: /var/lib/traceml].
    /// A flag given here wins over the config file's key (docs/serve.md).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Config file with the same keys (TOML; docs/serve.md); a missing default is fine
    /// [default: /etc/traceml/config.toml].
    #[arg(long)]
    config: Option<PathBuf>,
    /// Attach only to processes whose command line matches one of these globs.
    #[arg(long)]
    include: Vec<String>,
    /// Never attach to processes whose command line matches one of these globs.
    #[arg(long)]
    exclude: Vec<String>,
    /// Seconds between window summaries (summary-<n>.json) and verdict log lines [default: 300].
    #[arg(long)]
    window: Option<f64>,
    /// Seconds between scans of /proc for new training processes [default: 1].
    #[arg(long)]
    scan_interval: Option<f64>,
    #[arg(long, value_enum, default_value_t = Policy::Auto)]
    probe_set: Policy,
    /// Percent of each target's step time the probes may cost [default: 0.5].
    #[arg(long)]
    overhead_budget: Option<f64>,
    /// Python stack samples per second of each target's training thread: lower than a
    /// single-pid run's 100, since a service's runs are long (hours of samples) and it holds
    /// many targets; 0 turns them off [default: 10].
    #[arg(long)]
    stack_rate: Option<u32>,
    /// Multi-rank jobs: a rank that completes no step for max(10 × its median step, this many
    /// seconds) makes its job a HANG (written to the job's summary at once, with every rank's
    /// stack) [default: 60].
    #[arg(long)]
    hang_after: Option<f64>,
    /// Write this file once the service runs (for scripts and tests).
    #[arg(long)]
    ready_file: Option<PathBuf>,
    /// Serve Prometheus metrics of every job at http://ADDR/metrics: HOST:PORT, HOST, :PORT;
    /// alone, 127.0.0.1:9466 (docs/metrics.md).
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "")]
    metrics_addr: Option<String>,
    /// Check the config file with these flags as serve would start with them, say so in one
    /// line, and exit (0: serve would start; 2: it would not). Attaches nothing; no root needed.
    #[arg(long)]
    check_config: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum FailOn {
    Regression,
    Any,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
}

/// A failure with its exit status and the sentence for the user.
struct Failure {
    code: u8,
    msg: String,
}

impl Failure {
    fn new(code: u8, msg: impl std::fmt::Display) -> Self {
        Failure {
            code,
            msg: msg.to_string(),
        }
    }
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Failure::new(1, format!("{e:#}"))
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            // TRACEML_LOG, else RUST_LOG (same syntax: `info`, `traceml_daemon=debug`), else warn.
            tracing_subscriber::EnvFilter::try_from_env("TRACEML_LOG")
                .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        // journald and files get plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let result = match cli.cmd {
        Some(Cmd::Replay { file, output }) => replay(&file, output, &cli.attach.common),
        Some(Cmd::Export { input, output }) => run_export(&input, &output),
        Some(Cmd::Compare { a, b, format }) => run_compare(&a, &b, format, &cli.attach.common),
        Some(Cmd::Report { input, output }) => run_report(&input, &output),
        Some(Cmd::Sweep {
            baseline,
            candidate,
            format,
            fail_on,
        }) => run_sweep(&baseline, &candidate, format, fail_on, &cli.attach.common),
        #[cfg(feature = "live")]
        Some(Cmd::Serve(args)) => serve(args),
        #[cfg(feature = "live")]
        Some(Cmd::Top(args)) => attach(args, true),
        Some(Cmd::Generate { what, dir }) => generate(what, &dir),
        None => attach(cli.attach, false),
    };
    // Probes still being taken out are waited for here, not closed one by one at the exit.
    #[cfg(feature = "live")]
    traceml_daemon::live::wait_detached();
    match result {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            // Messages may quote the target's paths and names.
            eprintln!("traceml-daemon: {}", terminal(&f.msg));
            ExitCode::from(f.code)
        }
    }
}

#[cfg(feature = "live")]
fn serve(a: ServeArgs) -> Result<u8, Failure> {
    use traceml_daemon::serve;
    let flags = serve::ServeFlags {
        state_dir: a.state_dir,
        config: a.config,
        include: a.include,
        exclude: a.exclude,
        window_s: a.window,
        scan_interval_s: a.scan_interval,
        probe_policy: a.probe_set,
        overhead_budget: a.overhead_budget,
        stack_rate: a.stack_rate,
        hang_after_s: a.hang_after,
        metrics_addr: a.metrics_addr,
        ready_file: a.ready_file,
    };
    let fail = |e: serve::ServeError| Failure::new(e.exit_code(), e);
    if a.check_config {
        let said = serve::check_config(&flags).map_err(fail)?;
        println!("traceml-daemon: {}", terminal(&said));
        return Ok(0);
    }
    serve::run(flags).map_err(fail)?;
    Ok(0)
}

/// `generate`: man pages or a completion script, from the clap definition of this binary.
fn generate(what: Generated, dir: &Path) -> Result<u8, Failure> {
    use clap_complete::Shell;
    let fail =
        |e: std::io::Error| Failure::new(2, format!("cannot write to {}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(fail)?;
    let cmd = Cli::command();
    let shell = match what {
        Generated::Man => {
            clap_mangen::generate_to(cmd, dir).map_err(fail)?;
            return Ok(0);
        }
        Generated::Bash => Shell::Bash,
        Generated::Zsh => Shell::Zsh,
        Generated::Fish => Shell::Fish,
    };
    let mut cmd = cmd;
    clap_complete::generate_to(shell, &mut cmd, "traceml-daemon", dir).map_err(fail)?;
    Ok(0)
}

/// `--metrics-addr`'s address, validated before any kernel work.
#[cfg(feature = "live")]
fn metrics_addr(a: Option<&str>) -> Result<Option<std::net::SocketAddr>, Failure> {
    a.map(traceml_daemon::metrics::http::parse_addr)
        .transpose()
        .map_err(|e| Failure::new(2, e))
}

fn use_color(c: Color) -> bool {
    match c {
        Color::Always => true,
        Color::Never => false,
        Color::Auto => std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
    }
}

/// UTC `YYYYmmdd-HHMMSS` for directory names.
#[cfg_attr(not(feature = "live"), allow(dead_code))]
fn timestamp(unix_s: u64) -> String {
    traceml_daemon::units::utc_stamp(unix_s)
}

/// The files [`write_outputs`] writes in the output directory.
const OUTPUT_FILES: [&str; 3] = [
    "final_summary.json",
    "final_summary.txt",
    "final_report.html",
];

/// Creates the output directory now, so an unwritable one (or a symbolic link planted at it or
/// at one of its files) is refused before attaching. Under `sudo`, what the run creates goes to
/// the user who ran it (`crate::output`).
fn prepare_output(dir: &Path) -> Result<OutDir, Failure> {
    OutDir::create(dir, Owner::from_sudo())
        .and_then(|out| {
            out.check_writable()?;
            for name in OUTPUT_FILES {
                out.check_name(name)?;
            }
            Ok(out)
        })
        .map_err(|e| {
            Failure::new(
                2,
                format!("cannot write to output directory {}: {e}", dir.display()),
            )
        })
}

fn write_outputs(summary: &Summary, out: &OutDir, common: &Common) -> Result<(), Failure> {
    let dir = out.path();
    let write = |name: &str, bytes: &[u8]| {
        out.write(name, bytes)
            .map_err(|e| Failure::new(2, format!("cannot write {}: {e}", dir.join(name).display())))
    };
    let mut json = Vec::new();
    render::render_json(summary, &mut json).context("rendering the summary")?;
    write("final_summary.json", &json)?;
    let mut txt = Vec::new();
    render::render_card(summary, &mut txt, false).context("rendering the card")?;
    write("final_summary.txt", &txt)?;
    let report = dir.join("final_report.html");
    write("final_report.html", render::to_html(summary).as_bytes())?;
    if !common.quiet {
        // On a terminal the card follows its width (80 to 100 columns); the file keeps 100.
        let mut out = std::io::stdout().lock();
        render::render_card_width(summary, &mut out, use_color(common.color), card_width())
            .context("printing the card")?;
    }
    eprintln!(
        "traceml-daemon: summary written to {} (report: {})",
        dir.join("final_summary.json").display(),
        report.display()
    );
    Ok(())
}

/// Columns of the terminal on stdout; [`render::WIDTH`] when stdout is not a terminal (the
/// card clamps it to 80–100).
fn card_width() -> usize {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ only writes one `winsize` through the pointer, which points to `ws`;
    // on a non-terminal it fails with ENOTTY and writes nothing.
    let rc = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) };
    if rc == 0 && ws.ws_col > 0 {
        usize::from(ws.ws_col)
    } else {
        render::WIDTH
    }
}

/// Built without the `live` feature: no eBPF programs, no attach.
#[cfg(not(feature = "live"))]
fn attach(_args: AttachArgs, _top: bool) -> Result<u8, Failure> {
    Err(Failure::new(
        4,
        "this traceml-daemon was built without the `live` feature: it cannot attach, only run \
         the offline subcommands (replay, compare, ...); rebuild with default features",
    ))
}

/// The single-pid run: the default mode, or `top` (`top`: the live view).
#[cfg(feature = "live")]
fn attach(args: AttachArgs, top: bool) -> Result<u8, Failure> {
    let Some(pid) = args.pid else {
        return Err(Failure::new(
            2,
            "give --pid PID of the training process (or a subcommand: replay, compare; see --help)",
        ));
    };
    if !args.ring_mib.is_power_of_two() || args.ring_mib > 1024 {
        return Err(Failure::new(
            2,
            "--ring-mib must be a power of two up to 1024",
        ));
    }
    if let Some(d) = args.duration
        && !(d.is_finite() && d > 0.0)
    {
        return Err(Failure::new(
            2,
            "--duration must be a positive number of seconds",
        ));
    }
    let mut opts = live::Options::new(pid);
    opts.ready_file = args.ready_file.clone();
    opts.duration = args.duration.map(Duration::from_secs_f64);
    opts.launch_events = matches!(args.launch_mode, LaunchMode::Events);
    opts.ring_bytes = args.ring_mib << 20;
    if !(args.overhead_budget.is_finite()
        && args.overhead_budget > 0.0
        && args.overhead_budget <= 100.0)
    {
        return Err(Failure::new(
            2,
            "--overhead-budget must be a percentage above 0 and at most 100",
        ));
    }
    if args.stack_rate > traceml_daemon::settings::MAX_STACK_RATE {
        return Err(Failure::new(
            2,
            "--stack-rate must be at most 1000 per second",
        ));
    }
    opts.policy = args.probe_set;
    opts.overhead_budget = args.overhead_budget / 100.0;
    opts.stack_rate = args.stack_rate;
    let metrics_at = metrics_addr(args.metrics_addr.as_deref())?;

    live::preflight(pid).map_err(|e| Failure::new(e.exit_code() as u8, &e))?;
    let comm = traceml_daemon::procinfo::comm(pid)
        .map(|b| traceml_daemon::sanitize::comm(&b))
        .unwrap_or_default();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let dir = args.output.clone().unwrap_or_else(|| {
        PathBuf::from("traceml-logs").join(format!(
            "{}-{pid}-{}",
            traceml_daemon::sanitize::dir_name(&comm),
            timestamp(now)
        ))
    });
    let out = prepare_output(&dir)?;
    // `--pid` is an explicit request by an admin: a target's opt-out (honoured by `serve`) is
    // not, but the admin is told.
    if let Some(v) = traceml_daemon::procinfo::environ(pid)
        .and_then(|env| env.get(std::ffi::OsStr::new("TRACEML_DISABLE")).cloned())
        .filter(|v| !v.is_empty() && v != "0")
    {
        eprintln!(
            "traceml-daemon: pid {pid} opted out of profiling (TRACEML_DISABLE={}); attaching \
             anyway: --pid is an explicit request (serve skips such processes)",
            terminal(&v.to_string_lossy())
        );
    }
    // A launcher or a rank of a multi-rank job: every rank of the job on this node.
    let job = traceml_daemon::job::discover(pid);
    // A launcher is never the target itself: one still in rendezvous (no ranks yet) is waited on.
    if job.ranks.len() >= 2 || job.launcher == Some(pid) {
        if !(args.hang_after.is_finite() && args.hang_after > 0.0) {
            return Err(Failure::new(
                2,
                "--hang-after must be a positive number of seconds",
            ));
        }
        if top {
            eprintln!(
                "traceml-daemon: top has no live view of a multi-rank job yet; measuring every \
                 rank, the job's summary at the end"
            );
        }
        let metrics = match metrics_at {
            Some(addr) => {
                let exporter = metrics::http::Shared::default();
                let bound = metrics::http::serve(addr, exporter.clone()).map_err(|e| {
                    Failure::new(2, format!("--metrics-addr {addr}: cannot listen: {e}"))
                })?;
                eprintln!("traceml-daemon: metrics at http://{bound}/metrics");
                let label = dir
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| format!("pid-{pid}"));
                Some((exporter, label))
            }
            None => None,
        };
        let ranks: Vec<String> = job
            .ranks
            .iter()
            .map(|r| format!("{} (pid {})", r.rank, r.pid))
            .collect();
        if !ranks.is_empty() {
            eprintln!(
                "traceml-daemon: pid {pid} is part of a {}-rank job{}; attaching to ranks {}",
                job.ranks.len(),
                job.launcher
                    .map(|l| format!(" launched by pid {l}"))
                    .unwrap_or_default(),
                ranks.join(", ")
            );
        }
        let summary = traceml_daemon::multirank::run(
            job,
            traceml_daemon::multirank::JobOptions {
                rank: opts,
                hang_after: Duration::from_secs_f64(args.hang_after),
                dir: dir.clone(),
                duration: args.duration.map(Duration::from_secs_f64),
                metrics,
                record: args.record.clone(),
            },
        )
        .map_err(|e| Failure::new(3, e))?;
        write_outputs(&summary, &out, &args.common)?;
        return Ok(0);
    }
    let metrics = match metrics_at {
        Some(addr) => Some(SinglePidMetrics::start(addr, pid, &dir)?),
        None => None,
    };
    let mut writer = match &args.record {
        Some(p) => {
            let file = output::create_file(p, Owner::from_sudo()).map_err(|e| {
                Failure::new(2, format!("cannot open recording {}: {e}", p.display()))
            })?;
            Some(record::Writer::from_file(file, p).map_err(|e| Failure::new(2, e))?)
        }
        None => None,
    };

    // The stream is folded as it arrives (bounded memory over runs of any length), and shown
    // while it goes: `top`'s live view, or the liveness line on a terminal.
    let display = traceml_daemon::top::display_for(top, args.common.quiet);
    let outcome = traceml_daemon::top::run(opts, display, |item, collector| {
        if let Some(w) = writer.as_mut() {
            w.write_live(item).map_err(|e| e.to_string())?;
        }
        if let Some(m) = metrics.as_ref() {
            m.observe(item, collector);
        }
        Ok(())
    })
    .context("setting up the terminal")?;
    let (result, mut collector) = (outcome.result, outcome.collector);
    if let Some(w) = writer.as_mut() {
        w.flush().map_err(|e| Failure::new(1, e))?;
    }
    match result {
        Ok(reason) => tracing::info!("run ended: {reason:?}"),
        // Attached and then failed: keep what was gathered, say why, and still write the summary.
        Err(e) if collector.events() > 0 => {
            eprintln!(
                "traceml-daemon: {}; writing the summary of what was gathered",
                terminal(&e.to_string())
            );
            collector.push(&StreamItem::End(End {
                ts: live::monotonic_ns(),
                reason: EndReason::Truncated,
                target: None,
            }));
        }
        Err(e) => return Err(Failure::new(e.exit_code() as u8, &e)),
    }
    let (summary, totals) = collector.finish_with_totals();
    if let Some(m) = &metrics {
        m.finish(&summary, &totals);
    }
    write_outputs(&summary, &out, &args.common)?;
    Ok(0)
}

/// `--metrics-addr` in single-pid mode: the job is the output directory's name, rank 0; the
/// values are refreshed from the fold at most every [`metrics::REFRESH`] as items arrive.
#[cfg(feature = "live")]
struct SinglePidMetrics {
    exporter: metrics::http::Shared,
    job: String,
    last: std::cell::Cell<std::time::Instant>,
    gpu: std::cell::Cell<Option<f64>>,
}

#[cfg(feature = "live")]
impl SinglePidMetrics {
    fn start(addr: std::net::SocketAddr, pid: u32, dir: &Path) -> Result<Self, Failure> {
        let exporter = metrics::http::Shared::default();
        let bound = metrics::http::serve(addr, exporter.clone())
            .map_err(|e| Failure::new(2, format!("--metrics-addr {addr}: cannot listen: {e}")))?;
        let job = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| format!("pid-{pid}"));
        let info = metrics::JobInfo::of(pid);
        exporter
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .attached(&job, "0", info);
        eprintln!("traceml-daemon: metrics at http://{bound}/metrics");
        Ok(SinglePidMetrics {
            exporter,
            job,
            last: std::cell::Cell::new(std::time::Instant::now()),
            gpu: std::cell::Cell::new(None),
        })
    }

    fn observe(&self, item: &StreamItem, collector: &analysis::Collector) {
        if let StreamItem::Sample(s) = item {
            self.gpu.set(metrics::gpu_utilization(s));
        }
        if self.last.get().elapsed() >= metrics::REFRESH && collector.events() > 0 {
            self.last.set(std::time::Instant::now());
            let (s, t) = collector.snapshot_with_totals();
            self.update(&s, &t);
        }
    }

    fn update(&self, s: &Summary, t: &traceml_daemon::engine::StepTotals) {
        let values = metrics::RankValues::from_summary(s, t, self.gpu.get());
        let mut e = self.exporter.lock().unwrap_or_else(|p| p.into_inner());
        e.update(&self.job, "0", values);
        e.set_verdict(&self.job, metrics::Verdict::of(s));
    }

    fn finish(&self, s: &Summary, t: &traceml_daemon::engine::StepTotals) {
        self.update(s, t);
        let mut e = self.exporter.lock().unwrap_or_else(|p| p.into_inner());
        e.ended(&self.job, "0", std::time::Instant::now());
    }
}

fn replay(file: &Path, output: Option<PathBuf>, common: &Common) -> Result<u8, Failure> {
    let summary = recorded_summary(file)?;
    let dir = output.unwrap_or_else(|| {
        let stem = file
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "replay".into());
        PathBuf::from("traceml-logs").join(format!(
            "replay-{}",
            traceml_daemon::sanitize::dir_name(&stem)
        ))
    });
    let out = prepare_output(&dir)?;
    write_outputs(&summary, &out, common)?;
    Ok(0)
}

/// The summary of a recorded run (a recording without its end record is summarised up to its
/// last event, with a note).
fn recorded_summary(file: &Path) -> Result<Summary, Failure> {
    // Folded item by item, as live: memory does not grow with the recording's length.
    let mut reader = record::Reader::open(file).map_err(|e| Failure::new(2, e))?;
    let mut collector = analysis::Collector::new();
    let (mut ended, mut last_event_ts) = (false, 0);
    while let Some(item) = reader.next_item().map_err(|e| Failure::new(2, e))? {
        match &item {
            StreamItem::End(_) => ended = true,
            StreamItem::Event(e) => last_event_ts = e.ts,
            _ => {}
        }
        collector.push(&item);
    }
    report_tail(file, reader.tail());
    if !ended {
        eprintln!(
            "traceml-daemon: {} has no end record (the daemon was stopped abruptly); summarising what it holds",
            file.display()
        );
        collector.push(&StreamItem::End(End {
            ts: last_event_ts,
            reason: EndReason::Truncated,
            target: None,
        }));
    }
    Ok(collector.finish())
}

/// Says on stderr what a reader dropped or skipped at the end of a recording.
fn report_tail(file: &Path, tail: record::Tail) {
    if tail.truncated {
        eprintln!(
            "traceml-daemon: {} was cut short: its incomplete last block or line ({} bytes) was dropped",
            file.display(),
            tail.dropped_bytes
        );
    }
    if tail.skipped_frames > 0 {
        eprintln!(
            "traceml-daemon: {} holds {} frames of kinds this build does not know (written by a newer traceml-daemon); they were skipped",
            file.display(),
            tail.skipped_frames
        );
    }
}

/// `export`: a recording copied into the format of `output`'s name.
fn run_export(input: &Path, output: &Path) -> Result<u8, Failure> {
    if input == output {
        return Err(Failure::new(
            2,
            "export: give an output file other than the input",
        ));
    }
    let (items, tail) = record::export(input, output).map_err(|e| Failure::new(2, e))?;
    report_tail(input, tail);
    eprintln!(
        "traceml-daemon: {items} items exported to {} ({:?})",
        output.display(),
        record::Format::for_path(output)
    );
    Ok(0)
}

/// `report`: the HTML report of a summary or a recording (told apart by their first bytes: a
/// recording is gzip, binary, or starts with its header line).
fn run_report(input: &Path, output: &Path) -> Result<u8, Failure> {
    let head = {
        use std::io::Read;
        let mut buf = [0u8; 64];
        let n = std::fs::File::open(input)
            .and_then(|mut f| f.read(&mut buf))
            .map_err(|e| Failure::new(2, format!("cannot read {}: {e}", input.display())))?;
        buf[..n].to_vec()
    };
    let summary = if record::looks_like_recording(&head) {
        recorded_summary(input)?
    } else {
        read_summary(input)?
    };
    output::create_file(output, Owner::from_sudo())
        .and_then(|mut f| {
            use std::io::Write as _;
            f.write_all(render::to_html(&summary).as_bytes())
        })
        .map_err(|e| Failure::new(2, format!("cannot write {}: {e}", output.display())))?;
    eprintln!("traceml-daemon: report written to {}", output.display());
    Ok(0)
}

fn read_summary(p: &Path) -> Result<Summary, Failure> {
    let text = std::fs::read_to_string(p)
        .map_err(|e| Failure::new(2, format!("cannot read {}: {e}", p.display())))?;
    Summary::from_json(&text).map_err(|e| Failure::new(2, format!("{}: {e}", p.display())))
}

fn run_compare(a: &Path, b: &Path, format: Format, common: &Common) -> Result<u8, Failure> {
    let (sa, sb) = (read_summary(a)?, read_summary(b)?);
    let cmp = compare::compare(&sa, &sb);
    let mut out = std::io::stdout().lock();
    match format {
        Format::Text => render::render_compare(&cmp, &mut out, use_color(common.color)),
        Format::Json => render::render_compare_json(&cmp, &mut out),
    }
    .context("printing the comparison")?;
    Ok(compare::exit_code(&cmp))
}

fn run_sweep(
    baseline: &Path,
    candidate: &Path,
    format: Format,
    fail_on: FailOn,
    common: &Common,
) -> Result<u8, Failure> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let result = sweep::run(baseline, candidate, threads).map_err(|e| Failure::new(2, e))?;
    let mut out = std::io::stdout().lock();
    match format {
        Format::Text => render::render_sweep(&result, &mut out, use_color(common.color)),
        Format::Json => render::render_sweep_json(&result, &mut out),
    }
    .context("printing the sweep")?;
    Ok(result.exit_code(match fail_on {
        FailOn::Regression => sweep::FailOn::Regression,
        FailOn::Any => sweep::FailOn::Any,
    }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn timestamps() {
        assert_eq!(super::timestamp(0), "19700101-000000");
        assert_eq!(super::timestamp(1_798_675_200 + 3_661), "20261231-010101");
    }
}
