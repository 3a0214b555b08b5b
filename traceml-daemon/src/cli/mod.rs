//! The command line: arguments parsed and validated into options before any kernel work, one
//! command dispatched, and every failure one sentence with a distinct exit status ([`Error`]).
//! `main.rs` only calls [`main`]. The attach (`--pid`, `top`) is [`attach`]; the commands on
//! files (`replay`, `export`, `report`, `compare`, `sweep`) are [`offline`]; `serve`'s flags and
//! config file resolve in [`crate::runtime::settings`].
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{CommandFactory as _, Parser, Subcommand, ValueEnum};

use crate::overhead::ProbePolicy;
use crate::sanitize::terminal;

mod attach;
mod error;
mod offline;
mod outputs;

pub use error::Error;

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
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Option<Cmd>,
    #[command(flatten)]
    pub attach: AttachArgs,
}

#[derive(Debug, clap::Args)]
pub struct AttachArgs {
    /// Pid of the running training process to attach to.
    #[arg(long, short)]
    pub pid: Option<u32>,
    /// Directory for final_summary.json/.txt and final_report.html [default:
    /// traceml-logs/<name>-<pid>-<time>/].
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// Also write the decoded event stream to this file, replayable with `replay`: `*.trec` is
    /// the compact binary format; `*.jsonl` (`*.jsonl.gz` compressed) is JSON Lines.
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// Stop after this many seconds (default: when the target exits, or on SIGINT/SIGTERM).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Write this file once the probes are attached.
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
    /// Kernel launches: one event each (per-phase launch counts), or counted in the kernel only
    /// (lower overhead for launch-heavy jobs).
    #[arg(long, value_enum, default_value_t = LaunchMode::Events)]
    pub launch_mode: LaunchMode,
    /// Ring buffer size in MiB (power of two).
    #[arg(long, default_value_t = 8)]
    pub ring_mib: u32,
    /// Which probes run: `auto` learns the loop with every probe, then keeps the daemon's
    /// estimated cost under --overhead-budget (the frame-evaluator probe is detached once
    /// torch's markers delimit the steps); `full` keeps every probe; `markers` never arms the
    /// frame-evaluator probe.
    #[arg(long, value_enum, default_value_t = ProbePolicy::Auto)]
    pub probe_set: ProbePolicy,
    /// The daemon's budget on the target, in percent of step time (the governor's target).
    #[arg(long, default_value_t = 0.5)]
    pub overhead_budget: f64,
    /// Python stack samples of the training thread per second (names the code inside each
    /// phase); 0 turns them off.
    #[arg(long, default_value_t = 100)]
    pub stack_rate: u32,
    /// Multi-rank jobs: a rank that completes no step for max(10 × its median step, this many
    /// seconds) is a HANG (written to the summary at once, with every rank's stack).
    #[arg(long, default_value_t = 60.0)]
    pub hang_after: f64,
    /// Serve Prometheus metrics at http://ADDR/metrics while attached: HOST:PORT, HOST, :PORT;
    /// alone, 127.0.0.1:9466 (docs/metrics.md).
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "")]
    pub metrics_addr: Option<String>,
    #[command(flatten)]
    pub common: Common,
}

#[derive(Debug, Clone, clap::Args)]
pub struct Common {
    /// Do not print the verdict card to stdout.
    #[arg(long, short, global = true)]
    pub quiet: bool,
    /// Color: auto (when stdout is a terminal), always, never.
    #[arg(long, value_enum, default_value_t = Color::Auto, global = true)]
    pub color: Color,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LaunchMode {
    Events,
    Count,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq)]
pub enum Color {
    Auto,
    Always,
    Never,
}

#[derive(Debug, Subcommand)]
pub enum Cmd {
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
        #[arg(long, value_enum, default_value_t = TextOrJson::Text)]
        format: TextOrJson,
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
        #[arg(long, value_enum, default_value_t = TextOrJson::Text)]
        format: TextOrJson,
        /// Exit 1 when a job regressed, or (`any`) when a job is anything but EQUIVALENT or
        /// IMPROVEMENT (unpaired jobs included).
        #[arg(long, value_enum, default_value_t = FailOnArg::Regression)]
        fail_on: FailOnArg,
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
pub enum Generated {
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
pub struct ServeArgs {
    /// One directory per job under it: <comm>-<pid>-<start time>/ [default: /var/lib/traceml].
    /// A flag given here wins over the config file's key (docs/serve.md).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Config file with the same keys (TOML; docs/serve.md); a missing default is fine
    /// [default: /etc/traceml/config.toml].
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Attach only to processes whose command line matches one of these globs.
    #[arg(long)]
    pub include: Vec<String>,
    /// Never attach to processes whose command line matches one of these globs.
    #[arg(long)]
    pub exclude: Vec<String>,
    /// Seconds between window summaries (summary-<n>.json) and verdict log lines [default: 300].
    #[arg(long)]
    pub window: Option<f64>,
    /// Seconds between scans of /proc for new training processes [default: 1].
    #[arg(long)]
    pub scan_interval: Option<f64>,
    #[arg(long, value_enum, default_value_t = ProbePolicy::Auto)]
    pub probe_set: ProbePolicy,
    /// Percent of each target's step time the probes may cost [default: 0.5].
    #[arg(long)]
    pub overhead_budget: Option<f64>,
    /// Python stack samples per second of each target's training thread: lower than a
    /// single-pid run's 100, since a service's runs are long (hours of samples) and it holds
    /// many targets; 0 turns them off [default: 10].
    #[arg(long)]
    pub stack_rate: Option<u32>,
    /// Multi-rank jobs: a rank that completes no step for max(10 × its median step, this many
    /// seconds) makes its job a HANG (written to the job's summary at once, with every rank's
    /// stack) [default: 60].
    #[arg(long)]
    pub hang_after: Option<f64>,
    /// Write this file once the service runs (for scripts and tests).
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
    /// Serve Prometheus metrics of every job at http://ADDR/metrics: HOST:PORT, HOST, :PORT;
    /// alone, 127.0.0.1:9466 (docs/metrics.md).
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "")]
    pub metrics_addr: Option<String>,
    /// Check the config file with these flags as serve would start with them, say so in one
    /// line, and exit (0: serve would start; 2: it would not). Attaches nothing; no root needed.
    #[arg(long)]
    pub check_config: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum FailOnArg {
    Regression,
    Any,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum TextOrJson {
    Text,
    Json,
}

/// The command line: parses, sets up the log, dispatches, and maps a failure to one sentence
/// and its exit status.
pub fn main() -> ExitCode {
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
        Some(Cmd::Replay { file, output }) => offline::replay(&file, output, &cli.attach.common),
        Some(Cmd::Export { input, output }) => offline::export(&input, &output),
        Some(Cmd::Compare { a, b, format }) => offline::compare(&a, &b, format, &cli.attach.common),
        Some(Cmd::Report { input, output }) => offline::report(&input, &output),
        Some(Cmd::Sweep {
            baseline,
            candidate,
            format,
            fail_on,
        }) => offline::sweep(&baseline, &candidate, format, fail_on, &cli.attach.common),
        #[cfg(feature = "live")]
        Some(Cmd::Serve(args)) => serve(args),
        #[cfg(feature = "live")]
        Some(Cmd::Top(args)) => attach::run(args, true),
        Some(Cmd::Generate { what, dir }) => generate(what, &dir),
        None => attach::run(cli.attach, false),
    };
    // Probes still being taken out are waited for here, not closed one by one at the exit.
    #[cfg(feature = "live")]
    crate::runtime::target::wait_detached();
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            // Messages may quote the target's paths and names.
            eprintln!("traceml-daemon: {}", terminal(&e.to_string()));
            ExitCode::from(e.exit_code())
        }
    }
}

#[cfg(feature = "live")]
fn serve(a: ServeArgs) -> Result<u8, Error> {
    use crate::runtime::serve;
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
    if a.check_config {
        let said = serve::check_config(&flags)?;
        println!("traceml-daemon: {}", terminal(&said));
        return Ok(0);
    }
    serve::run(flags)?;
    Ok(0)
}

/// `generate`: man pages or a completion script, from the clap definition of this binary.
fn generate(what: Generated, dir: &Path) -> Result<u8, Error> {
    use clap_complete::Shell;
    let fail = |e: std::io::Error| Error::usage(format!("cannot write to {}: {e}", dir.display()));
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

pub(crate) fn use_color(c: Color) -> bool {
    match c {
        Color::Always => true,
        Color::Never => false,
        Color::Auto => std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
    }
}
