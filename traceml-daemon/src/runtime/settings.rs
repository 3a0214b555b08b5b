//! `serve`'s settings: the flags, the config file and the defaults resolved once into one typed
//! value, with one precedence rule — **a flag given on the command line wins over the config
//! file's key, which wins over the default**; the lists (`include`, `exclude`, ...) are the
//! file's and the flags' together. Every value is range-checked after the merge, so a bad value
//! is refused wherever it came from, at start and when `SIGHUP` re-reads the file (a bad file
//! keeps the settings in force). Errors are [`SettingsError`]s with their exit status.
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::host::policy::{Policy, PolicyConfig};
use crate::overhead::ProbePolicy;

/// The defaults (docs/serve.md's table).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/traceml";
pub const DEFAULT_CONFIG: &str = "/etc/traceml/config.toml";
pub const DEFAULT_WINDOW_S: f64 = 300.0;
pub const DEFAULT_SCAN_INTERVAL_S: f64 = 1.0;
/// Percent of step time.
pub const DEFAULT_OVERHEAD_BUDGET: f64 = 0.5;
pub const DEFAULT_STACK_RATE: u32 = 10;
pub const DEFAULT_HANG_AFTER_S: f64 = 60.0;
/// The most Python stack samples per second a target may be read at.
pub const MAX_STACK_RATE: u32 = 1000;

/// The config file (`/etc/traceml/config.toml`): the same keys as the flags.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ServeConfig {
    pub state_dir: Option<PathBuf>,
    /// Seconds between window summaries.
    pub window_s: Option<f64>,
    /// Percent of step time.
    pub overhead_budget: Option<f64>,
    pub stack_rate: Option<u32>,
    /// Seconds, as `--hang-after`.
    pub hang_after_s: Option<f64>,
    pub include: Vec<String>,
    pub exclude: Vec<String>,
    pub include_users: Vec<String>,
    pub exclude_users: Vec<String>,
    pub include_cgroups: Vec<String>,
    pub exclude_cgroups: Vec<String>,
    /// `/metrics` address, as `--metrics-addr` (read at start only).
    pub metrics_addr: Option<String>,
}

impl ServeConfig {
    /// Reads a config file; a missing file is an empty config unless it `must_exist`.
    pub fn read(path: &Path, must_exist: bool) -> Result<ServeConfig, SettingsError> {
        let bad = |msg: String| SettingsError::Config {
            path: path.to_owned(),
            msg,
        };
        match std::fs::read_to_string(path) {
            Ok(s) => toml::from_str(&s).map_err(|e| bad(e.to_string())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !must_exist => {
                Ok(ServeConfig::default())
            }
            Err(e) => Err(bad(e.to_string())),
        }
    }
}

/// What the command line said: `None` where a flag was not given.
#[derive(Clone, Debug, Default)]
pub struct ServeFlags {
    pub state_dir: Option<PathBuf>,
    pub config: Option<PathBuf>,
    pub include: Vec<String>,
    pub exclude: Vec<String>,
    pub window_s: Option<f64>,
    pub scan_interval_s: Option<f64>,
    pub probe_policy: ProbePolicy,
    /// Percent of step time.
    pub overhead_budget: Option<f64>,
    pub stack_rate: Option<u32>,
    pub hang_after_s: Option<f64>,
    /// `Some("")`: the flag alone (the default address).
    pub metrics_addr: Option<String>,
    pub ready_file: Option<PathBuf>,
}

impl ServeFlags {
    /// The config file to read, and whether it must exist (it was named).
    pub fn config_path(&self) -> (PathBuf, bool) {
        match &self.config {
            Some(p) => (p.clone(), p != Path::new(DEFAULT_CONFIG)),
            None => (PathBuf::from(DEFAULT_CONFIG), false),
        }
    }
}

/// Where a value came from, for error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Flag,
    File,
    Default,
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
    pub probe_policy: ProbePolicy,
    /// A fraction of step time (the flag's and the file's percent / 100).
    pub overhead_budget: f64,
    pub stack_rate: u32,
    /// Multi-rank jobs: the floor of the hang threshold.
    pub hang_after: Duration,
    pub metrics_addr: Option<SocketAddr>,
    pub ready_file: Option<PathBuf>,
    pub policy: Policy,
}

/// Why `serve` cannot start (or keeps its settings on `SIGHUP`).
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("{}: {msg}", path.display())]
    Config { path: PathBuf, msg: String },
    #[error("{}: {msg}", name(key, *from, config))]
    Value {
        key: &'static str,
        from: Source,
        config: PathBuf,
        msg: String,
    },
}

impl SettingsError {
    /// Bad arguments or input files: 2 (docs/cli.md).
    pub fn exit_code(&self) -> u8 {
        2
    }
}

/// How the user wrote the setting: `--window`, or `window_s in /etc/traceml/config.toml`.
fn name(key: &str, source: Source, config: &Path) -> String {
    let file_key = match key {
        "window" => "window_s",
        "hang-after" => "hang_after_s",
        k => return name_of(k, source, config, &k.replace('-', "_")),
    };
    name_of(key, source, config, file_key)
}

fn name_of(flag: &str, source: Source, config: &Path, file_key: &str) -> String {
    match source {
        Source::Flag => format!("--{flag}"),
        Source::File => format!("{file_key} in {}", config.display()),
        Source::Default => format!("the default --{flag}"),
    }
}

/// The flag if given, else the file's key, else the default, and where it came from.
fn pick<T: Clone>(flag: &Option<T>, file: &Option<T>, default: T) -> (T, Source) {
    match (flag, file) {
        (Some(v), _) => (v.clone(), Source::Flag),
        (None, Some(v)) => (v.clone(), Source::File),
        (None, None) => (default, Source::Default),
    }
}

/// `--metrics-addr` over the file's `metrics_addr`, parsed (`None`: no exporter).
fn metrics_addr(
    flags: &ServeFlags,
    file: &ServeConfig,
    config: &Path,
) -> Result<Option<SocketAddr>, SettingsError> {
    let picked = match (&flags.metrics_addr, &file.metrics_addr) {
        (Some(a), _) => Some((a, Source::Flag)),
        (None, Some(a)) => Some((a, Source::File)),
        (None, None) => None,
    };
    picked
        .map(|(a, from)| {
            crate::metrics::http::parse_addr(a).map_err(|e| {
                // parse_addr's message names the flag; the file's key is named here instead.
                let why = e.split_once(": ").map_or(e.as_str(), |(_, w)| w).to_owned();
                SettingsError::Value {
                    key: "metrics-addr",
                    from,
                    config: config.to_owned(),
                    msg: format!("{a:?}: {why}"),
                }
            })
        })
        .transpose()
}

impl ServeSettings {
    /// Reads the config file the flags name (or the default one) and resolves the settings.
    pub fn load(
        flags: &ServeFlags,
        resolve_user: &dyn Fn(&str) -> Option<u32>,
    ) -> Result<ServeSettings, SettingsError> {
        let (path, must_exist) = flags.config_path();
        let file = ServeConfig::read(&path, must_exist)?;
        let found = path.exists();
        ServeSettings::resolve(flags, &file, &path, found, resolve_user)
    }

    /// Flags over `file` over the defaults, every value checked (pure: the tests' entry).
    pub fn resolve(
        flags: &ServeFlags,
        file: &ServeConfig,
        config: &Path,
        config_found: bool,
        resolve_user: &dyn Fn(&str) -> Option<u32>,
    ) -> Result<ServeSettings, SettingsError> {
        let bad = |key: &'static str, from: Source, msg: &str| SettingsError::Value {
            key,
            from,
            config: config.to_owned(),
            msg: msg.to_owned(),
        };
        let (state_dir, _) = pick(
            &flags.state_dir,
            &file.state_dir,
            PathBuf::from(DEFAULT_STATE_DIR),
        );
        let (window, src) = pick(&flags.window_s, &file.window_s, DEFAULT_WINDOW_S);
        if !(window.is_finite() && window >= 1.0) {
            return Err(bad("window", src, "must be at least 1 second"));
        }
        let (scan, src) = pick(&flags.scan_interval_s, &None, DEFAULT_SCAN_INTERVAL_S);
        if !(scan.is_finite() && scan > 0.0 && scan <= 60.0) {
            return Err(bad(
                "scan-interval",
                src,
                "must be between 0 and 60 seconds",
            ));
        }
        let (budget, src) = pick(
            &flags.overhead_budget,
            &file.overhead_budget,
            DEFAULT_OVERHEAD_BUDGET,
        );
        if !(budget.is_finite() && budget > 0.0 && budget <= 100.0) {
            return Err(bad(
                "overhead-budget",
                src,
                "must be a percentage above 0 and at most 100",
            ));
        }
        let (stack_rate, src) = pick(&flags.stack_rate, &file.stack_rate, DEFAULT_STACK_RATE);
        if stack_rate > MAX_STACK_RATE {
            return Err(bad("stack-rate", src, "must be at most 1000 per second"));
        }
        let (hang, src) = pick(
            &flags.hang_after_s,
            &file.hang_after_s,
            DEFAULT_HANG_AFTER_S,
        );
        if !(hang.is_finite() && hang > 0.0) {
            return Err(bad(
                "hang-after",
                src,
                "must be a positive number of seconds",
            ));
        }
        let metrics_addr = metrics_addr(flags, file, config)?;
        let cat = |a: &[String], b: &[String]| [a, b].concat();
        let policy = Policy::new(
            PolicyConfig {
                include: cat(&file.include, &flags.include),
                exclude: cat(&file.exclude, &flags.exclude),
                include_users: file.include_users.clone(),
                exclude_users: file.exclude_users.clone(),
                include_cgroups: file.include_cgroups.clone(),
                exclude_cgroups: file.exclude_cgroups.clone(),
            },
            resolve_user,
        )
        .map_err(|msg| SettingsError::Config {
            path: config.to_owned(),
            msg,
        })?;
        Ok(ServeSettings {
            config: config.to_owned(),
            config_found,
            state_dir,
            window: Duration::from_secs_f64(window),
            scan_interval: Duration::from_secs_f64(scan),
            probe_policy: flags.probe_policy,
            overhead_budget: budget / 100.0,
            stack_rate,
            hang_after: Duration::from_secs_f64(hang),
            metrics_addr,
            ready_file: flags.ready_file.clone(),
            policy,
        })
    }

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
            self.overhead_budget * 100.0,
            self.stack_rate,
            self.hang_after.as_secs_f64(),
            self.metrics_addr
                .map_or("off".to_owned(), |a| format!("at http://{a}/metrics")),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(toml: &str) -> ServeConfig {
        toml::from_str(toml).unwrap()
    }

    fn resolve(flags: &ServeFlags, f: &ServeConfig) -> Result<ServeSettings, SettingsError> {
        ServeSettings::resolve(
            flags,
            f,
            Path::new("/etc/traceml/config.toml"),
            true,
            &|_| None,
        )
    }

    /// Flags over the file over the defaults, for every key both can set.
    #[test]
    fn flags_win_over_the_file_which_wins_over_the_defaults() {
        let f = file(
            "state_dir = \"/srv/t\"\nwindow_s = 30.0\noverhead_budget = 2.0\nstack_rate = 50\n\
             hang_after_s = 90.0\nmetrics_addr = \":9500\"\ninclude = [\"*a*\"]\n",
        );
        let none = ServeFlags::default();
        let d = resolve(&none, &ServeConfig::default()).unwrap();
        assert_eq!(d.state_dir, Path::new(DEFAULT_STATE_DIR));
        assert_eq!(d.window, Duration::from_secs(300));
        assert_eq!(d.scan_interval, Duration::from_secs(1));
        assert_eq!(d.overhead_budget, 0.005);
        assert_eq!(d.stack_rate, 10);
        assert_eq!(d.hang_after, Duration::from_secs(60));
        assert_eq!(d.metrics_addr, None);
        let s = resolve(&none, &f).unwrap();
        assert_eq!(s.state_dir, Path::new("/srv/t"));
        assert_eq!(s.window, Duration::from_secs(30));
        assert_eq!(s.overhead_budget, 0.02);
        assert_eq!(s.stack_rate, 50);
        assert_eq!(s.hang_after, Duration::from_secs(90));
        assert_eq!(s.metrics_addr, Some("127.0.0.1:9500".parse().unwrap()));
        let flags = ServeFlags {
            state_dir: Some("/tmp/x".into()),
            window_s: Some(5.0),
            overhead_budget: Some(1.0),
            stack_rate: Some(0),
            hang_after_s: Some(20.0),
            metrics_addr: Some("127.0.0.1:9600".into()),
            include: vec!["*b*".into()],
            ..ServeFlags::default()
        };
        let s = resolve(&flags, &f).unwrap();
        assert_eq!(s.state_dir, Path::new("/tmp/x"));
        assert_eq!(s.window, Duration::from_secs(5));
        assert_eq!(s.overhead_budget, 0.01);
        assert_eq!(s.stack_rate, 0);
        assert_eq!(s.hang_after, Duration::from_secs(20));
        assert_eq!(s.metrics_addr, Some("127.0.0.1:9600".parse().unwrap()));
        // Lists add up.
        assert_eq!(s.policy.config().include, ["*a*", "*b*"]);
    }

    /// A bad value is refused wherever it came from, naming where.
    #[test]
    fn every_value_is_range_checked_after_the_merge() {
        let none = ServeFlags::default();
        for (toml, want) in [
            (
                "overhead_budget = 0.0",
                "overhead_budget in /etc/traceml/config.toml",
            ),
            ("overhead_budget = 250.0", "overhead_budget in"),
            ("stack_rate = 5000", "stack_rate in"),
            ("window_s = 0.5", "window_s in"),
            ("hang_after_s = -1.0", "hang_after_s in"),
            ("metrics_addr = \"nowhere:x\"", "metrics_addr in"),
        ] {
            let e = resolve(&none, &file(toml))
                .err()
                .unwrap_or_else(|| panic!("{toml}"));
            assert!(e.to_string().starts_with(want), "{toml}: {e}");
            assert_eq!(e.exit_code(), 2);
        }
        for (flags, want) in [
            (
                ServeFlags {
                    overhead_budget: Some(f64::NAN),
                    ..ServeFlags::default()
                },
                "--overhead-budget: ",
            ),
            (
                ServeFlags {
                    stack_rate: Some(1001),
                    ..ServeFlags::default()
                },
                "--stack-rate: must be at most 1000",
            ),
            (
                ServeFlags {
                    scan_interval_s: Some(0.0),
                    ..ServeFlags::default()
                },
                "--scan-interval: ",
            ),
        ] {
            let e = resolve(&flags, &ServeConfig::default()).err().unwrap();
            assert!(e.to_string().starts_with(want), "{e}");
        }
        // A good flag over a bad file value: the flag is what runs.
        let flags = ServeFlags {
            stack_rate: Some(20),
            ..ServeFlags::default()
        };
        assert_eq!(
            resolve(&flags, &file("stack_rate = 5000"))
                .unwrap()
                .stack_rate,
            20
        );
    }

    #[test]
    fn config_files_must_parse_and_a_named_one_must_exist() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.toml");
        assert!(ServeConfig::read(&missing, false).is_ok());
        let e = ServeConfig::read(&missing, true).unwrap_err();
        assert!(e.to_string().contains("missing.toml"), "{e}");
        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, "inclde = []\n").unwrap();
        let e = ServeConfig::read(&bad, false).unwrap_err();
        assert!(
            e.to_string().contains("bad.toml") && e.to_string().contains("inclde"),
            "{e}"
        );
    }
}
