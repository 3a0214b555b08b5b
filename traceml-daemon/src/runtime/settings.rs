//! The settings a run is given, validated: what every target runs with ([`TargetSettings`],
//! `--pid`, `top` and each of `serve`'s targets) and `serve`'s own ([`ServeSettings`]). The
//! command line builds them once, from flags, the config file and the defaults, each setting
//! defined once (`cli::settings`, which also refuses bad values); here they are only typed
//! values.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::host::policy::Policy;
use crate::overhead::ProbePolicy;
use crate::runtime::options::Options;

/// What every target is run with, whichever mode holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct TargetSettings {
    /// Per-launch events (default) or launch counting only.
    pub launch_events: bool,
    pub ring_bytes: u32,
    pub policy: ProbePolicy,
    /// A fraction of step time (the setting's percent / 100).
    pub overhead_budget: f64,
    pub stack_rate: u32,
    /// Multi-rank jobs: the floor of the hang threshold.
    pub hang_after: Duration,
}

impl TargetSettings {
    /// A target's options with these settings.
    pub fn options(&self, pid: u32) -> Options {
        let mut o = Options::new(pid);
        o.launch_events = self.launch_events;
        o.ring_bytes = self.ring_bytes;
        o.policy = self.policy;
        o.overhead_budget = self.overhead_budget;
        o.stack_rate = self.stack_rate;
        o
    }
}

/// `serve`'s settings, validated.
#[derive(Clone, Debug)]
pub struct ServeSettings {
    pub config: PathBuf,
    /// The config file existed when read.
    pub config_found: bool,
    pub state_dir: PathBuf,
    pub window: Duration,
    pub scan_interval: Duration,
    pub target: TargetSettings,
    pub metrics_addr: Option<SocketAddr>,
    pub ready_file: Option<PathBuf>,
    pub policy: Policy,
}

impl ServeSettings {
    /// One line: what serve runs with (`--check-config`, and the start's log line).
    pub fn describe(&self) -> String {
        format!(
            "{} {}: state in {}, window {} s, overhead budget {} %, stack rate {}/s, hang after {} s, metrics {}",
            self.config.display(),
            if self.config_found {
                "is valid"
            } else {
                "does not exist (the defaults apply)"
            },
            self.state_dir.display(),
            self.window.as_secs_f64(),
            self.target.overhead_budget * 100.0,
            self.target.stack_rate,
            self.target.hang_after.as_secs_f64(),
            self.metrics_addr
                .map_or("off".to_owned(), |a| format!("at http://{a}/metrics")),
        )
    }
}
