//! The settings a run is given, validated: what every target runs with (a target's options
//! from [`Tunables`]: `--pid`, `top` and each of `serve`'s targets) and `serve`'s own
//! ([`ServeSettings`]). The
//! command line builds them once, from flags, the config file and the defaults, each setting
//! defined once (`cli::settings`, which also refuses bad values); here they are only typed
//! values.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::host::policy::Policy;
use crate::runtime::options::Options;
use crate::tunables::{LaunchMode, Tunables};

/// A target's options with the settings of its mode.
impl Tunables {
    pub fn options(&self, pid: u32) -> Options {
        let mut o = Options::new(pid);
        o.launch_events = matches!(self.launch_mode, LaunchMode::Events);
        o.ring_bytes = self.ring_mib << 20;
        o.policy = self.probe_set;
        o.overhead_budget = self.overhead_budget / 100.0;
        o.stack_rate = self.stack_rate;
        o
    }

    /// Multi-rank jobs: the floor of the hang threshold.
    pub fn hang_after(&self) -> Duration {
        Duration::from_secs_f64(self.hang_after)
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
    /// What each target runs with.
    pub target: Tunables,
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
            self.target.overhead_budget,
            self.target.stack_rate,
            self.target.hang_after,
            self.metrics_addr
                .map_or("off".to_owned(), |a| format!("at http://{a}/metrics")),
        )
    }
}
