//! The command line: arguments parsed and validated into options before any kernel work, one
//! command dispatched, and every failure one sentence with a distinct exit status ([`Error`]).
//! `main.rs` only calls [`main`]. The attach (`--pid`, `top`) is [`attach`]; the commands on
//! files (`replay`, `export`, `report`, `compare`, `sweep`) are [`offline`]. Every mode's
//! settings (flags, the config file, defaults) are merged once by [`settings`].
use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
#[cfg(feature = "live")]
use std::time::Duration;

use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand, ValueEnum};

use crate::sanitize::terminal;
#[cfg(feature = "live")]
use crate::tunables::SETTINGS;
use crate::tunables::{self, Tunables};

mod attach;
mod error;
mod offline;
mod outputs;
pub mod settings;

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
    #[arg(long, value_parser = tunables::seconds)]
    pub duration: Option<f64>,
    /// Write this file once the probes are attached.
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
    /// Config file whose keys set the settings below (TOML; a flag wins over its key; docs/cli.md);
    /// a missing default is fine [default: /etc/traceml/config.toml].
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics while attached: HOST:PORT, HOST, :PORT;
    /// alone, 127.0.0.1:9466 (docs/metrics.md). A flag only: the config file's `metrics_addr`
    /// is serve's (two daemons cannot listen on one port).
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "", value_parser = settings::metrics_addr)]
    pub metrics_addr: Option<String>,
    #[command(flatten)]
    pub tunables: Tunables,
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
    /// One directory per job under it: <comm>-<pid>-<start time>/ (read at start only).
    #[arg(long, value_name = "DIR", default_value = "/var/lib/traceml", help_heading = SETTINGS)]
    pub state_dir: PathBuf,
    /// Config file whose keys set the settings below (TOML; a flag wins over its key;
    /// docs/serve.md); a missing default is fine [default: /etc/traceml/config.toml].
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Attach only to processes whose command line (arguments joined by spaces) matches one of
    /// these globs; the file's list and the flags' together.
    #[arg(long, value_name = "GLOB", help_heading = SETTINGS)]
    pub include: Vec<String>,
    /// Never attach to processes whose command line matches one of these globs (an exclude
    /// always wins).
    #[arg(long, value_name = "GLOB", help_heading = SETTINGS)]
    pub exclude: Vec<String>,
    /// Attach only to processes of these users (names or uids).
    #[arg(id = "include_users", long = "include-user", value_name = "USER", help_heading = SETTINGS)]
    pub include_users: Vec<String>,
    /// Never attach to processes of these users (names or uids).
    #[arg(id = "exclude_users", long = "exclude-user", value_name = "USER", help_heading = SETTINGS)]
    pub exclude_users: Vec<String>,
    /// Attach only to processes whose cgroup path matches one of these globs (a systemd slice,
    /// a container, a Kubernetes pod).
    #[arg(id = "include_cgroups", long = "include-cgroup", value_name = "GLOB", help_heading = SETTINGS)]
    pub include_cgroups: Vec<String>,
    /// Never attach to processes whose cgroup path matches one of these globs.
    #[arg(id = "exclude_cgroups", long = "exclude-cgroup", value_name = "GLOB", help_heading = SETTINGS)]
    pub exclude_cgroups: Vec<String>,
    /// Seconds between window summaries (summary-<n>.json) and verdict log lines, at least 1.
    #[arg(id = "window_s", long = "window", value_name = "S", default_value_t = 300.0, value_parser = tunables::window, help_heading = SETTINGS)]
    pub window: f64,
    /// Seconds between scans of /proc for new training processes, up to 60.
    #[arg(id = "scan_interval_s", long = "scan-interval", value_name = "S", default_value_t = 1.0, value_parser = tunables::scan_interval, help_heading = SETTINGS)]
    pub scan_interval: f64,
    /// Serve Prometheus metrics of every job at http://ADDR/metrics (read at start only):
    /// HOST:PORT, HOST, :PORT; alone, 127.0.0.1:9466 (docs/metrics.md).
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "", value_parser = settings::metrics_addr, help_heading = SETTINGS)]
    pub metrics_addr: Option<String>,
    #[command(flatten)]
    pub tunables: Tunables,
    /// Write this file once the service runs (for scripts and tests).
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
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
    let argv: Vec<OsString> = std::env::args_os().collect();
    let (cli, sources) = match parse(&argv) {
        Ok(parsed) => parsed,
        Err(settings::Refusal::Clap(e)) => e.exit(),
        Err(settings::Refusal::Settings(e)) => {
            eprintln!("traceml-daemon: {}", terminal(&e.to_string()));
            return ExitCode::from(e.exit_code());
        }
    };
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
    #[cfg(not(feature = "live"))]
    let _ = sources; // only the attaching modes read settings
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
        Some(Cmd::Serve(args)) => serve(argv, args, sources),
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

/// The command line's definition: the derive's, where a repeated flag's last value wins (the
/// config file's values go ahead of the command line's: `cli::settings`), with `serve`'s own
/// defaults.
pub fn command() -> clap::Command {
    let cmd = Cli::command().args_override_self(true);
    // A service's runs are long (hours of samples) and it holds many targets.
    #[cfg(feature = "live")]
    let cmd = cmd.mut_subcommand("serve", |s| {
        s.mut_arg("stack_rate", |a| a.default_value("10"))
    });
    cmd
}

/// `argv` parsed with [`command`], the mode's config file merged in.
pub fn parse(argv: &[OsString]) -> Result<(Cli, Option<settings::Sources>), settings::Refusal> {
    let (matches, sources) = settings::parse(&command(), argv)?;
    Ok((Cli::from_arg_matches(&matches)?, sources))
}

#[cfg(feature = "live")]
fn serve(
    argv: Vec<OsString>,
    a: ServeArgs,
    sources: Option<settings::Sources>,
) -> Result<u8, Error> {
    use crate::runtime::serve;
    let sources = sources.ok_or_else(|| Error::unexpected("serve read no settings"))?;
    let settings = serve_settings(&a, &sources)?;
    if a.check_config {
        let said = serve::check_config(&settings);
        println!("traceml-daemon: {}", terminal(&said));
        return Ok(0);
    }
    // SIGHUP: the same command line, the config file read again.
    let reload = move || match parse(&argv) {
        Ok((
            Cli {
                cmd: Some(Cmd::Serve(a)),
                ..
            },
            Some(sources),
        )) => serve_settings(&a, &sources),
        Ok(_) => unreachable!("the command line was serve's"),
        Err(settings::Refusal::Settings(e)) => Err(e),
        Err(settings::Refusal::Clap(e)) => Err(settings::SettingsError::Config {
            path: PathBuf::from(settings::DEFAULT_CONFIG),
            msg: e.to_string(),
        }),
    };
    serve::run(settings, &|| reload().map_err(|e| e.to_string()))?;
    Ok(0)
}

/// `serve`'s settings from its arguments (flags and config file merged).
#[cfg(feature = "live")]
fn serve_settings(
    a: &ServeArgs,
    sources: &settings::Sources,
) -> Result<crate::runtime::settings::ServeSettings, settings::SettingsError> {
    use crate::host::policy::{Policy, PolicyConfig};
    let policy = Policy::new(
        PolicyConfig {
            include: a.include.clone(),
            exclude: a.exclude.clone(),
            include_users: a.include_users.clone(),
            exclude_users: a.exclude_users.clone(),
            include_cgroups: a.include_cgroups.clone(),
            exclude_cgroups: a.exclude_cgroups.clone(),
        },
        &crate::host::users::uid_of,
    )
    .map_err(|msg| settings::SettingsError::Config {
        path: sources.config.clone(),
        msg,
    })?;
    let metrics_addr = a
        .metrics_addr
        .as_deref()
        .map(crate::metrics::http::parse_addr)
        .transpose()
        .map_err(|msg| sources.refusal("metrics-addr", "metrics_addr", msg))?;
    Ok(crate::runtime::settings::ServeSettings {
        config: sources.config.clone(),
        config_found: sources.found,
        state_dir: a.state_dir.clone(),
        window: Duration::from_secs_f64(a.window),
        scan_interval: Duration::from_secs_f64(a.scan_interval),
        target: a.tunables.clone(),
        metrics_addr,
        ready_file: a.ready_file.clone(),
        policy,
    })
}

/// `generate`: man pages or a completion script, from the clap definition of this binary.
fn generate(what: Generated, dir: &Path) -> Result<u8, Error> {
    use clap_complete::Shell;
    let fail = |e: std::io::Error| Error::usage(format!("cannot write to {}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(fail)?;
    let cmd = command();
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
