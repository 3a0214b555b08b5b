//! Every mode's settings, each from one definition: a flag of the command line's clap definition
//! under the help heading [`SETTINGS`], whose id is its config file key, whose
//! `default_value_t` is its default and whose value parser is its one range check. The config
//! file (`--config`, default [`DEFAULT_CONFIG`]; read by `--pid`, `top` and `serve`) is a
//! second source of the same arguments: each key is checked by its flag's own parser (a refusal
//! names the file and the key), then handed to clap ahead of the command line's own arguments,
//! so **a flag given on the command line wins over the file's key, which wins over the
//! default**, and a list (`include = [...]`) is the file's and the flags' together. A key of
//! another mode (`state_dir` read by `--pid`) is ignored; a key of no mode is refused.
//!
//! Pure but for reading the file: the tests build a command, a file and an argv.
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Command};

pub use crate::tunables::SETTINGS;
/// The config file read when `--config` is not given; a missing one is no error.
pub const DEFAULT_CONFIG: &str = "/etc/traceml/config.toml";

/// Where a value came from, for refusals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Flag,
    File,
    Default,
}

/// Why a mode cannot start (or `serve` keeps its settings on `SIGHUP`).
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("{}: {msg}", path.display())]
    Config { path: PathBuf, msg: String },
    #[error("{}: {msg}", name(flag, key, *from, config))]
    Value {
        /// The flag's long name (`window`) and the file's key (`window_s`).
        flag: String,
        key: String,
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
fn name(flag: &str, key: &str, source: Source, config: &Path) -> String {
    match source {
        Source::Flag => format!("--{flag}"),
        Source::File => format!("{key} in {}", config.display()),
        Source::Default => format!("the default --{flag}"),
    }
}

/// A setting refused (a flag or the config file): 2.
impl From<SettingsError> for super::error::Error {
    fn from(e: SettingsError) -> Self {
        super::error::Error::Usage(e.to_string())
    }
}

/// Where each setting of the mode came from, and which file was read.
#[derive(Clone, Debug)]
pub struct Sources {
    pub config: PathBuf,
    /// The file existed when read.
    pub found: bool,
    pub of: BTreeMap<String, Source>,
}

impl Sources {
    /// A refusal of setting `id` (flag `--flag`) made after the parse, naming where its value
    /// came from (`--window`, `window_s in FILE`).
    pub fn refusal(&self, flag: &str, id: &str, msg: String) -> SettingsError {
        SettingsError::Value {
            flag: flag.to_owned(),
            key: id.to_owned(),
            from: self.of.get(id).copied().unwrap_or(Source::Default),
            config: self.config.clone(),
            msg,
        }
    }
}

/// The settings of one mode's command.
pub fn settings(cmd: &Command) -> impl Iterator<Item = &Arg> {
    cmd.get_arguments()
        .filter(|a| a.get_help_heading() == Some(SETTINGS))
}

/// Parses `argv` with `root` (whose subcommands are the modes): where the chosen mode has
/// settings, its config file is read and merged. `Ok`: the matches and, for a mode with
/// settings, where each came from.
pub fn parse(root: &Command, argv: &[OsString]) -> Result<(ArgMatches, Option<Sources>), Refusal> {
    let first = root.clone().try_get_matches_from(argv)?;
    let (mode, matches, at) = match first.subcommand() {
        Some((name, sub)) => {
            let at = argv
                .iter()
                .skip(1)
                .position(|a| a.as_os_str() == OsStr::new(name))
                .map(|i| i + 2);
            (root.find_subcommand(name), sub, at)
        }
        None => (Some(root), &first, Some(1)),
    };
    let (Some(mode), Some(at)) = (mode, at) else {
        return Ok((first, None));
    };
    if settings(mode).next().is_none() || !reads_config(mode, matches) {
        return Ok((first, None));
    }
    let given: Option<&PathBuf> = matches.get_one("config");
    let config = given
        .cloned()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG));
    let (table, found) = read(&config, given.is_some())?;
    let (file_args, of) = from_file(root, mode, matches, &table, &config)?;
    let mut merged = argv.to_vec();
    merged.splice(at..at, file_args);
    let matches = root.clone().try_get_matches_from(merged)?;
    Ok((matches, Some(Sources { config, found, of })))
}

/// A mode reads its config file when it has a `config` argument and is to run: the attach
/// only with a pid (without, the usage error comes first).
fn reads_config(mode: &Command, m: &ArgMatches) -> bool {
    let has = |id: &str| mode.get_arguments().any(|a| a.get_id() == id);
    has("config") && (!has("pid") || m.contains_id("pid"))
}

/// The file as a TOML table; a missing file is an empty one unless it was named.
fn read(path: &Path, must_exist: bool) -> Result<(toml::Table, bool), SettingsError> {
    let bad = |msg: String| SettingsError::Config {
        path: path.to_owned(),
        msg,
    };
    match std::fs::read_to_string(path) {
        Ok(s) => Ok((
            s.parse::<toml::Table>().map_err(|e| bad(e.to_string()))?,
            true,
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !must_exist => {
            Ok((toml::Table::new(), false))
        }
        Err(e) => Err(bad(e.to_string())),
    }
}

/// The file's keys for `mode` as arguments (`--window=30`), each checked by its flag's own
/// parser, and where every setting of the mode comes from.
fn from_file(
    root: &Command,
    mode: &Command,
    given: &ArgMatches,
    table: &toml::Table,
    config: &Path,
) -> Result<(Vec<OsString>, BTreeMap<String, Source>), SettingsError> {
    let mut args = Vec::new();
    for (key, value) in table {
        let Some(arg) = settings(mode).find(|a| a.get_id() == key.as_str()) else {
            if known_keys(root).iter().any(|k| k == key) {
                continue; // another mode's key
            }
            return Err(SettingsError::Config {
                path: config.to_owned(),
                msg: format!(
                    "unknown field `{key}`, expected one of {}",
                    known_keys(root)
                        .iter()
                        .map(|k| format!("`{k}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        };
        let refusal = |msg: String| SettingsError::Value {
            flag: arg.get_long().unwrap_or(key).to_owned(),
            key: key.clone(),
            from: Source::File,
            config: config.to_owned(),
            msg,
        };
        let append = matches!(arg.get_action(), ArgAction::Append);
        if !append && given.value_source(key) == Some(ValueSource::CommandLine) {
            continue; // the flag wins: the file's value is neither checked nor used
        }
        for v in values(value, append).map_err(refusal)? {
            check(mode, arg, &v).map_err(refusal)?;
            args.push(OsString::from(format!(
                "--{}={v}",
                arg.get_long().unwrap_or(key)
            )));
        }
    }
    let of = settings(mode)
        .map(|a| {
            let id = a.get_id().as_str();
            let from = if given.value_source(id) == Some(ValueSource::CommandLine) {
                Source::Flag
            } else if table.contains_key(id) {
                Source::File
            } else {
                Source::Default
            };
            (id.to_owned(), from)
        })
        .collect();
    Ok((args, of))
}

/// Every mode's config keys, sorted.
pub fn known_keys(root: &Command) -> Vec<String> {
    let mut keys: Vec<String> = std::iter::once(root)
        .chain(root.get_subcommands())
        .flat_map(|c| settings(c).map(|a| a.get_id().to_string()))
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// A TOML value as the argument's values: one scalar, or (a list argument) an array of them.
fn values(v: &toml::Value, list: bool) -> Result<Vec<String>, String> {
    let one = |v: &toml::Value| match v {
        toml::Value::String(s) => Ok(s.clone()),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Float(f) => Ok(f.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        _ => Err("must be a string or a number".to_owned()),
    };
    match v {
        toml::Value::Array(items) if list => items.iter().map(one).collect(),
        _ if list => Err("must be a list, e.g. [\"a\", \"b\"]".to_owned()),
        toml::Value::Array(_) => Err("must be one value, not a list".to_owned()),
        v => Ok(vec![one(v)?]),
    }
}

/// `value` through the argument's own parser (the mode's command given just this flag): its
/// range check, or its possible values.
fn check(mode: &Command, arg: &Arg, value: &str) -> Result<(), String> {
    let flag = format!("--{}={value}", arg.get_long().unwrap_or_default());
    match mode
        .clone()
        .no_binary_name(true)
        .try_get_matches_from([flag])
    {
        Ok(_) => Ok(()),
        Err(e) => Err(match std::error::Error::source(&e) {
            Some(why) => why.to_string(),
            None if !arg.get_possible_values().is_empty() => {
                let possible: Vec<String> = arg
                    .get_possible_values()
                    .iter()
                    .map(|p| p.get_name().to_owned())
                    .collect();
                format!("{value:?} is not one of {}", possible.join(", "))
            }
            None => e.kind().to_string(),
        }),
    }
}

/// Why the command line was not taken: clap's own (help and version included, which it prints
/// itself), or a setting refused.
#[derive(Debug)]
pub enum Refusal {
    Clap(clap::Error),
    Settings(SettingsError),
}

impl From<clap::Error> for Refusal {
    fn from(e: clap::Error) -> Self {
        Refusal::Clap(e)
    }
}

impl From<SettingsError> for Refusal {
    fn from(e: SettingsError) -> Self {
        Refusal::Settings(e)
    }
}

/// The settings of `cmd` as the Markdown table of docs/cli.md: flag, config key, default and
/// help, from the definitions themselves (`tests` fail when the document drifts).
pub fn table(cmd: &Command) -> String {
    let mut out =
        String::from("| flag | config key | default | what it does |\n|---|---|---|---|\n");
    for a in settings(cmd) {
        let possible: Vec<String> = a
            .get_possible_values()
            .iter()
            .map(|p| p.get_name().to_owned())
            .collect();
        let value = if possible.is_empty() {
            a.get_value_names()
                .and_then(|v| v.first())
                .map(|v| format!(" {v}"))
                .unwrap_or_default()
        } else {
            format!(" {}", possible.join("\\|"))
        };
        let default: Vec<String> = a
            .get_default_values()
            .iter()
            .map(|d| format!("`{}`", d.to_string_lossy()))
            .collect();
        let help = a
            .get_long_help()
            .or(a.get_help())
            .map(|h| h.to_string().replace('\n', " ").replace('|', "\\|"))
            .unwrap_or_default();
        out.push_str(&format!(
            "| `--{}{value}` | `{}` | {} | {help} |\n",
            a.get_long().unwrap_or_default(),
            a.get_id(),
            if default.is_empty() {
                "none".to_owned()
            } else {
                default.join(", ")
            },
        ));
    }
    out
}

/// A `/metrics` address as [`crate::metrics::http::parse_addr`] takes it (kept as written).
pub fn metrics_addr(s: &str) -> Result<String, String> {
    crate::metrics::http::parse_addr(s)
        .map(|_| s.to_owned())
        // parse_addr's message starts with the flag and the value: the caller names both.
        .map_err(|e| e.split_once(": ").map_or(e.clone(), |(_, w)| w.to_owned()))
}

#[cfg(test)]
mod tests;
