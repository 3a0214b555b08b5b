use std::ffi::OsString;
use std::path::Path;
#[cfg(feature = "live")]
use std::time::Duration;

use super::*;
#[cfg(feature = "live")]
use crate::cli::{Cli, Cmd};
use crate::cli::{command, parse as parse_cli};

fn argv(args: &[&str]) -> Vec<OsString> {
    std::iter::once("traceml-daemon")
        .chain(args.iter().copied())
        .map(OsString::from)
        .collect()
}

/// A config file in `dir` holding `toml` (one file per content: a test keeps several).
fn config(dir: &Path, toml: &str) -> String {
    let n = std::fs::read_dir(dir).unwrap().count();
    let p = dir.join(format!("config-{n}.toml"));
    std::fs::write(&p, toml).unwrap();
    p.to_string_lossy().into_owned()
}

/// The settings `serve` runs with for these arguments.
#[cfg(feature = "live")]
fn serve(args: &[&str]) -> Result<crate::runtime::settings::ServeSettings, String> {
    let mut all = vec!["serve"];
    all.extend_from_slice(args);
    match parse_cli(&argv(&all)) {
        Ok((
            Cli {
                cmd: Some(Cmd::Serve(a)),
                ..
            },
            Some(sources),
        )) => crate::cli::serve_settings(&a, &sources).map_err(|e| e.to_string()),
        Ok(_) => panic!("not serve"),
        Err(Refusal::Settings(e)) => Err(e.to_string()),
        Err(Refusal::Clap(e)) => Err(e.to_string()),
    }
}

/// Flags over the file over the defaults, for every key both can set; lists joined.
#[cfg(feature = "live")]
#[test]
fn flags_win_over_the_file_which_wins_over_the_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let empty = config(dir.path(), "");
    let d = serve(&["--config", &empty]).unwrap();
    assert_eq!(d.state_dir, Path::new("/var/lib/traceml"));
    assert_eq!(d.window, Duration::from_secs(300));
    assert_eq!(d.scan_interval, Duration::from_secs(1));
    assert_eq!(d.target.options(1).overhead_budget, 0.005);
    assert_eq!(d.target.stack_rate, 10, "serve's own default");
    assert_eq!(d.target.hang_after(), Duration::from_secs(60));
    assert_eq!(d.target.options(1).ring_bytes, 8 << 20);
    assert!(d.target.options(1).launch_events);
    assert_eq!(d.metrics_addr, None);
    let file = config(
        dir.path(),
        "state_dir = \"/srv/t\"\nwindow_s = 30.0\noverhead_budget = 2.0\nstack_rate = 50\n\
         hang_after_s = 90\nmetrics_addr = \":9500\"\ninclude = [\"*a*\"]\nring_mib = 16\n\
         launch_mode = \"count\"\nscan_interval_s = 2\nprobe_set = \"markers\"\n",
    );
    let s = serve(&["--config", &file]).unwrap();
    assert_eq!(s.state_dir, Path::new("/srv/t"));
    assert_eq!(s.window, Duration::from_secs(30));
    assert_eq!(s.scan_interval, Duration::from_secs(2));
    assert_eq!(s.target.options(1).overhead_budget, 0.02);
    assert_eq!(s.target.stack_rate, 50);
    assert_eq!(s.target.hang_after(), Duration::from_secs(90));
    assert_eq!(s.target.options(1).ring_bytes, 16 << 20);
    assert!(!s.target.options(1).launch_events);
    assert_eq!(s.target.probe_set, crate::overhead::ProbePolicy::Markers);
    assert_eq!(s.metrics_addr, Some("127.0.0.1:9500".parse().unwrap()));
    let flags = [
        "--config",
        &file,
        "--state-dir",
        "/tmp/x",
        "--window",
        "5",
        "--overhead-budget",
        "1",
        "--stack-rate",
        "0",
        "--hang-after",
        "20",
        "--metrics-addr",
        "127.0.0.1:9600",
        "--include",
        "*b*",
    ];
    let s = serve(&flags).unwrap();
    assert_eq!(s.state_dir, Path::new("/tmp/x"));
    assert_eq!(s.window, Duration::from_secs(5));
    assert_eq!(s.target.options(1).overhead_budget, 0.01);
    assert_eq!(s.target.stack_rate, 0);
    assert_eq!(s.target.hang_after(), Duration::from_secs(20));
    assert_eq!(s.metrics_addr, Some("127.0.0.1:9600".parse().unwrap()));
    // The file's list and the flag's together: each admits its own command line.
    let (cli, _) = parse_cli(&argv(&["serve", "--config", &file, "--include", "*b*"])).unwrap();
    let Some(Cmd::Serve(a)) = cli.cmd else {
        panic!("not serve")
    };
    assert_eq!(a.include, ["*a*", "*b*"]);
}

/// Every value is checked by its one parser wherever it came from, and the refusal names where.
#[cfg(feature = "live")]
#[test]
fn every_value_is_range_checked_wherever_it_came_from() {
    let dir = tempfile::tempdir().unwrap();
    for (toml, want) in [
        ("window_s = 0.5", "window_s in "),
        ("overhead_budget = 0", "overhead_budget in "),
        ("overhead_budget = 101", "overhead_budget in "),
        ("stack_rate = 1001", "stack_rate in "),
        ("hang_after_s = -1", "hang_after_s in "),
        ("scan_interval_s = 61", "scan_interval_s in "),
        ("ring_mib = 3", "ring_mib in "),
        ("metrics_addr = \":99999\"", "metrics_addr in "),
        ("probe_set = \"fulll\"", "probe_set in "),
        ("include = \"*a*\"", "include in "),
        ("window_s = [1]", "window_s in "),
    ] {
        let file = config(dir.path(), toml);
        let e = serve(&["--config", &file]).unwrap_err();
        assert!(e.starts_with(&format!("{want}{file}: ")), "{toml}: {e}");
    }
    // A flag: clap's refusal names the flag, with the same check's reason.
    for (flag, value, why) in [
        ("--window", "0.5", "must be at least 1 second"),
        (
            "--overhead-budget",
            "0",
            "must be a percentage above 0 and at most 100",
        ),
        ("--stack-rate", "1001", "must be at most 1000 per second"),
        ("--scan-interval", "0", "must be between 0 and 60 seconds"),
        ("--ring-mib", "3", "must be a power of two up to 1024"),
    ] {
        let empty = config(dir.path(), "");
        let e = serve(&["--config", &empty, flag, value]).unwrap_err();
        assert!(e.contains(flag) && e.contains(why), "{flag}: {e}");
    }
    // A good flag over a bad file value: the flag is what runs.
    let file = config(dir.path(), "stack_rate = 5000\n");
    assert_eq!(
        serve(&["--config", &file, "--stack-rate", "20"])
            .unwrap()
            .target
            .stack_rate,
        20
    );
}

#[cfg(feature = "live")]
#[test]
fn config_files_must_parse_and_a_named_one_must_exist() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.toml");
    let e = serve(&["--config", &missing.to_string_lossy()]).unwrap_err();
    assert!(e.contains("missing.toml"), "{e}");
    let bad = config(dir.path(), "inclde = []\n");
    let e = serve(&["--config", &bad]).unwrap_err();
    assert!(
        e.contains(&bad) && e.contains("unknown field `inclde`"),
        "{e}"
    );
    let bad = config(dir.path(), "window_s = \n");
    let e = serve(&["--config", &bad]).unwrap_err();
    assert!(e.starts_with(&bad), "{e}");
}

/// `--pid` and `top` read the same file: the keys they have apply, serve's own are ignored,
/// and a refusal names the file.
#[test]
fn the_attach_reads_the_config_file_too() {
    let dir = tempfile::tempdir().unwrap();
    let file = config(
        dir.path(),
        "stack_rate = 50\nstate_dir = \"/srv/t\"\nmetrics_addr = \":9500\"\nring_mib = 32\n",
    );
    let (cli, sources) = parse_cli(&argv(&["--pid", "1", "--config", &file])).unwrap();
    assert_eq!(cli.attach.tunables.stack_rate, 50);
    assert_eq!(cli.attach.tunables.ring_mib, 32);
    assert_eq!(
        cli.attach.metrics_addr, None,
        "the file's metrics_addr is serve's"
    );
    let sources = sources.unwrap();
    assert_eq!(sources.of["stack_rate"], Source::File);
    assert_eq!(sources.of["overhead_budget"], Source::Default);
    // The attach's own default where the file says nothing.
    let empty = config(dir.path(), "");
    let (cli, _) = parse_cli(&argv(&["--pid", "1", "--config", &empty])).unwrap();
    assert_eq!(cli.attach.tunables.stack_rate, 100);
    #[cfg(feature = "live")]
    {
        let (cli, _) = parse_cli(&argv(&["top", "--pid", "1", "--config", &file])).unwrap();
        let Some(Cmd::Top(a)) = cli.cmd else {
            panic!("not top")
        };
        assert_eq!(a.tunables.stack_rate, 50);
    }
    let bad = config(dir.path(), "stack_rate = 5000\n");
    match parse_cli(&argv(&["--pid", "1", "--config", &bad])) {
        Err(Refusal::Settings(e)) => assert!(
            e.to_string()
                .starts_with(&format!("stack_rate in {bad}: must be at most 1000")),
            "{e}"
        ),
        other => panic!("{:?}", other.map(|_| ())),
    }
    // Without a pid, the usage error comes first: the file is not read.
    assert!(parse_cli(&argv(&["--config", &bad])).is_ok());
    // The offline commands read no file.
    assert!(
        parse_cli(&argv(&["compare", "a.json", "b.json"]))
            .unwrap()
            .1
            .is_none()
    );
}

/// docs/cli.md's settings tables are these definitions' (run with TRACEML_BLESS_DOCS=1 to
/// write them).
#[test]
fn the_documented_settings_are_the_definitions() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cli.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let root = command();
    // `serve` is built with the `live` feature only.
    let tables: Vec<(&str, String)> = std::iter::once(("--pid, top", table(&root)))
        .chain(root.find_subcommand("serve").map(|s| ("serve", table(s))))
        .collect();
    let mut want = doc.clone();
    for (mode, t) in &tables {
        let start = format!("<!-- settings of {mode}: generated, see cli::settings -->\n");
        let end = "<!-- end of settings -->";
        let a = want
            .find(&start)
            .unwrap_or_else(|| panic!("docs/cli.md has no {start:?}"))
            + start.len();
        let b = a + want[a..].find(end).expect("the table's end marker");
        want.replace_range(a..b, t);
    }
    if std::env::var_os("TRACEML_BLESS_DOCS").is_some() {
        std::fs::write(&path, &want).unwrap();
    } else {
        assert!(
            doc == want,
            "docs/cli.md's settings tables drifted from the flags' definitions: run this test \
             with TRACEML_BLESS_DOCS=1 to write them"
        );
    }
}

/// Every setting has a long flag, a help text and a snake_case key; no two share a key.
#[test]
fn every_setting_is_a_flag_with_help_and_a_key() {
    let root = command();
    for mode in std::iter::once(&root).chain(root.get_subcommands()) {
        for a in settings(mode) {
            let id = a.get_id().as_str();
            assert!(a.get_long().is_some() && a.get_help().is_some(), "{id}");
            assert!(
                id.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{id}"
            );
        }
    }
    let keys = known_keys(&root);
    assert!(keys.len() >= 6, "{keys:?}");
}
