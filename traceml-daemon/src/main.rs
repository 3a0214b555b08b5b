//! `traceml-daemon`: the command line ([`traceml_daemon::cli`] parses, validates and
//! dispatches; see `--help`).
fn main() -> std::process::ExitCode {
    traceml_daemon::cli::main()
}
