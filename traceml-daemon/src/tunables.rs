//! The settings every target runs with, in every attaching mode (`--pid`, `top`, `serve`),
//! each defined once: a field of [`Tunables`] is a flag under the help heading [`SETTINGS`],
//! its id the config file's key, its `default_value_t` the default, its value parser (below)
//! its one range check (`cli::settings` merges the config file in; `runtime::settings` turns
//! them into a target's options). Adding a setting is one field here and its use.
use clap::ValueEnum;

use crate::overhead::ProbePolicy;

/// The help heading of the settings: a flag under it is also the config file's key of its id.
pub const SETTINGS: &str = "Settings (a flag, or its key in the config file)";

/// The settings every target runs with, in every mode (`--pid`, `top`, `serve`): each a flag
/// and the config file's key of its id (`cli::settings`).
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct Tunables {
    /// Kernel launches: one event each (per-phase launch counts), or counted in the kernel only
    /// (lower overhead for launch-heavy jobs).
    #[arg(long, value_enum, default_value_t = LaunchMode::Events, help_heading = SETTINGS)]
    pub launch_mode: LaunchMode,
    /// Ring buffer size in MiB, a power of two up to 1024 (a full ring drops events, counted
    /// in the summary).
    #[arg(long, value_name = "MIB", default_value_t = 8, value_parser = ring_mib, help_heading = SETTINGS)]
    pub ring_mib: u32,
    /// Which probes run: `auto` learns the loop with every probe, then keeps the daemon's
    /// estimated cost under --overhead-budget (the frame-evaluator probe is detached once
    /// torch's markers delimit the steps); `full` keeps every probe; `markers` never arms the
    /// frame-evaluator probe.
    #[arg(long, value_enum, default_value_t = ProbePolicy::Auto, help_heading = SETTINGS)]
    pub probe_set: ProbePolicy,
    /// The daemon's budget on each target, in percent of its step time (the governor's
    /// target).
    #[arg(long, value_name = "PCT", default_value_t = 0.5, value_parser = percent, help_heading = SETTINGS)]
    pub overhead_budget: f64,
    /// Python stack samples of the training thread per second (name the code inside each
    /// phase), at most 1000; 0 turns them off. Lower under serve: a service's runs are long
    /// and it holds many targets.
    #[arg(long, value_name = "HZ", default_value_t = 100, value_parser = stack_rate, help_heading = SETTINGS)]
    pub stack_rate: u32,
    /// Multi-rank jobs: a rank that completes no step for max(10 × its median step, this many
    /// seconds) is a HANG (written to the job's summary at once, with every rank's stack).
    #[arg(id = "hang_after_s", long = "hang-after", value_name = "SECS", default_value_t = 60.0, value_parser = seconds, help_heading = SETTINGS)]
    pub hang_after: f64,
}

/// How kernel launches are reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LaunchMode {
    Events,
    Count,
}

// The range checks: each setting's one, as its flag's value parser (serve's own settings use
// them too).

/// A percentage above 0 and at most 100.
pub fn percent(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| "must be a number".to_owned())?;
    if v.is_finite() && v > 0.0 && v <= 100.0 {
        Ok(v)
    } else {
        Err("must be a percentage above 0 and at most 100".to_owned())
    }
}

/// A positive number of seconds.
pub fn seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| "must be a number".to_owned())?;
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err("must be a positive number of seconds".to_owned())
    }
}

/// Seconds, at least one.
pub fn window(s: &str) -> Result<f64, String> {
    match seconds(s) {
        Ok(v) if v >= 1.0 => Ok(v),
        _ => Err("must be at least 1 second".to_owned()),
    }
}

/// Seconds above 0, at most 60.
pub fn scan_interval(s: &str) -> Result<f64, String> {
    match seconds(s) {
        Ok(v) if v <= 60.0 => Ok(v),
        _ => Err("must be between 0 and 60 seconds".to_owned()),
    }
}

/// The most Python stack samples per second a target may be read at.
pub const MAX_STACK_RATE: u32 = 1000;

/// Samples per second, at most [`MAX_STACK_RATE`].
pub fn stack_rate(s: &str) -> Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(v) if v <= MAX_STACK_RATE => Ok(v),
        Ok(_) => Err(format!("must be at most {MAX_STACK_RATE} per second")),
        Err(_) => Err("must be a whole number of samples per second".to_owned()),
    }
}

/// MiB, a power of two up to 1024.
pub fn ring_mib(s: &str) -> Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(v) if v.is_power_of_two() && v <= 1024 => Ok(v),
        _ => Err("must be a power of two up to 1024".to_owned()),
    }
}
