//! The Debian package (issue 26, `cargo xtask deb`). Without root: the binary needs no glibc
//! symbol version newer than Ubuntu 22.04's 2.35 and no library outside the base system (read
//! from its ELF dynamic section and version needs with `object`), and the packaged example
//! config is valid as shipped and with every key set. As root: the package `cargo xtask deb`
//! built (its path in `TRACEML_DEB`; `cargo xtask test` builds it and sets it) installs with
//! `dpkg -i` without starting or enabling anything, its binary attaches to a workload, its units
//! pass `systemd-analyze verify`, `man -w` finds its pages, its completions load, and `dpkg -r`
//! then `dpkg --purge` leave the file lists of /usr, /etc and /var/lib as they were before.
mod support;
// The ELF reader `cargo xtask deb` checks the package's binary with.
#[path = "../../xtask/src/elfneeds.rs"]
mod elfneeds;

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use elfneeds::*;
use support::*;

const PKG: &str = "traceml-daemon";
/// The packages that ship `elfneeds::BASE_LIBS` on Debian and Ubuntu.
const BASE_PACKAGES: [&str; 2] = ["libc6", "libgcc-s1"];

/// [`elfneeds::check`] as a test, at the floor of a binary linked on this machine (the test
/// build, the dev package `cargo xtask test` installs): fails on any problem; says what the
/// binary needs. The release package's floor (glibc 2.28, linked by zig) is checked by
/// `cargo xtask deb` and proven on a glibc 2.31 root by `cargo xtask old-glibc`.
fn check_elf(path: &Path) -> Needs {
    let n = check(path, GLIBC_MAX_HOST_BUILD).unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "{}: newest glibc version needed {}; links {}",
        path.display(),
        newest_glibc(&n),
        n.libs.join(", ")
    );
    n
}

/// The test build of the binary (the package's own binary is checked the same way by
/// [`the_package_installs_attaches_verifies_and_purges_clean`]).
#[test]
fn the_binary_needs_glibc_2_35_at_most_and_only_base_libraries() {
    check_elf(&daemon());
}

/// `serve --check-config --config FILE` with `daemon`: (exit code, stdout + stderr).
fn check_config(daemon: &Path, file: &Path) -> (Option<i32>, String) {
    let out = Command::new(daemon)
        .args(["serve", "--check-config", "--config"])
        .arg(file)
        .output()
        .unwrap();
    (out.status.code(), text(&out))
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The config file's keys, from the daemon's own message for an unknown one ("expected one of
/// `exclude`, `exclude_cgroups`, ...").
fn config_keys() -> Vec<String> {
    let dir = scratch("config-keys");
    let file = dir.join("unknown.toml");
    std::fs::write(&file, "not_a_key = 1\n").unwrap();
    let (code, err) = check_config(&daemon(), &file);
    assert_eq!(code, Some(2), "an unknown key is an error: {err}");
    let list = err
        .split_once("expected one of")
        .unwrap_or_else(|| panic!("no key list in {err:?}"))
        .1;
    list.lines()
        .next()
        .unwrap_or_default()
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_example_config_is_valid_as_shipped_and_with_every_key_set() {
    let shipped = workspace().join("packaging/deb/config.toml");
    let (code, said) = check_config(&daemon(), &shipped);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains("is valid") && said.contains("metrics off"),
        "{said}"
    );
    // Each `# key = value` line uncommented: every key of the config is shown, and each example
    // value is one serve accepts.
    let text = std::fs::read_to_string(&shipped).unwrap();
    let mut keys = config_keys();
    keys.sort();
    let mut set = Vec::new();
    let every: String = text
        .lines()
        .map(|l| {
            let key = l
                .strip_prefix("# ")
                .and_then(|r| r.split_once(" = "))
                .map(|(k, _)| k)
                .filter(|k| keys.iter().any(|c| c == k));
            match key {
                Some(k) => {
                    set.push(k.to_owned());
                    format!("{}\n", &l[2..])
                }
                None => format!("{l}\n"),
            }
        })
        .collect();
    set.sort();
    assert!(keys.len() >= 10, "{keys:?}");
    assert_eq!(set, keys, "the example shows every key once");
    let dir = scratch("example-config");
    let all = dir.join("every-key.toml");
    std::fs::write(&all, &every).unwrap();
    let (code, said) = check_config(&daemon(), &all);
    assert_eq!(code, Some(0), "{said}\n{every}");
    assert!(
        said.contains("metrics at http://0.0.0.0:9466/metrics"),
        "{said}"
    );
    // And the check fails where serve would not start: a misspelt key.
    let typo = dir.join("typo.toml");
    std::fs::write(&typo, every.replace("window_s", "window")).unwrap();
    let (code, said) = check_config(&daemon(), &typo);
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("unknown field `window`"), "{said}");
}

/// The package to install: `TRACEML_DEB`. Unset: skipped with a message, or a failure under
/// `cargo xtask test` (`TRACEML_REQUIRE_ROOT`), which builds the package and sets it.
fn package() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TRACEML_DEB") {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "TRACEML_DEB={}: no such file", p.display());
        return Some(p);
    }
    assert!(
        std::env::var_os("TRACEML_REQUIRE_ROOT").is_none(),
        "TRACEML_DEB is not set: cargo xtask test builds the package (cargo xtask deb) and sets it"
    );
    eprintln!(
        "skipped the package install test: build the package with `cargo xtask deb` and set \
         TRACEML_DEB=target/debian/traceml-daemon_<version>_amd64.deb"
    );
    None
}

fn ok(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `dpkg-query`'s status of the package: `install ok installed`, `deinstall ok config-files`,
/// or empty when dpkg knows nothing of it.
fn status() -> String {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", PKG])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// Purges the package when dropped, so a test that fails half-way leaves the machine clean.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        if !status().is_empty() {
            let _ = Command::new("dpkg").args(["--purge", PKG]).status();
        }
    }
}

/// The trees a package can touch, as `path type` lines (type `d`, `f`, `l` or `o`), without
/// following symbolic links. Contents and times are left out: dpkg rewrites its own database.
const SNAPSHOT_ROOTS: [&str; 7] = [
    "/usr",
    "/etc",
    "/lib/systemd",
    "/var/lib/traceml",
    "/var/lib/traceml-sweep",
    "/var/lib/dpkg/info",
    "/var/lib/systemd",
];

fn snapshot() -> BTreeSet<String> {
    fn walk(p: &Path, out: &mut BTreeSet<String>) {
        let Ok(m) = std::fs::symlink_metadata(p) else {
            return;
        };
        let t = m.file_type();
        let kind = if t.is_dir() {
            'd'
        } else if t.is_file() {
            'f'
        } else if t.is_symlink() {
            'l'
        } else {
            'o'
        };
        out.insert(format!("{} {kind}", p.display()));
        if t.is_dir()
            && let Ok(rd) = std::fs::read_dir(p)
        {
            for e in rd.flatten() {
                walk(&e.path(), out);
            }
        }
    }
    let mut out = BTreeSet::new();
    for r in SNAPSHOT_ROOTS {
        // Where /lib is a link to /usr/lib (merged /usr), /lib/systemd is /usr/lib/systemd:
        // walked once, by its real path.
        let real = std::fs::canonicalize(r).unwrap_or_else(|_| PathBuf::from(r));
        walk(&real, &mut out);
    }
    out
}

fn path_of(line: &str) -> &str {
    line.rsplit_once(' ').map_or(line, |(p, _)| p)
}

/// Paths in `a` and not in `b`, for a message.
fn minus(a: &BTreeSet<String>, b: &BTreeSet<String>) -> Vec<String> {
    a.difference(b).cloned().collect()
}

/// Files the package installs, from the archive (`dpkg-deb -c`), as absolute paths.
fn archive_files(deb: &Path) -> Vec<String> {
    ok(Command::new("dpkg-deb").arg("-c").arg(deb))
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .map(|p| p.trim_start_matches('.').trim_end_matches('/').to_owned())
        .filter(|p| !p.is_empty())
        .collect()
}

/// The package's control fields and member lists, before installing it.
fn check_archive(deb: &Path) {
    let files = archive_files(deb);
    for want in [
        "/usr/bin/traceml-daemon",
        "/usr/bin/traceml-weekly-sweep",
        "/usr/lib/systemd/system/traceml-daemon.service",
        "/usr/lib/systemd/system/traceml-weekly-sweep.service",
        "/usr/lib/systemd/system/traceml-weekly-sweep.timer",
        "/etc/traceml/config.toml",
        "/usr/share/man/man1/traceml-daemon.1.gz",
        "/usr/share/man/man1/traceml-daemon-serve.1.gz",
        "/usr/share/bash-completion/completions/traceml-daemon",
        "/usr/share/zsh/vendor-completions/_traceml-daemon",
        "/usr/share/fish/vendor_completions.d/traceml-daemon.fish",
        "/usr/share/doc/traceml-daemon/README.md",
        "/usr/share/doc/traceml-daemon/copyright",
        "/usr/share/doc/traceml-daemon/docs/serve.md",
        "/usr/share/doc/traceml-daemon/docs/install.md",
    ] {
        assert!(files.iter().any(|f| f == want), "{want} not in {files:#?}");
    }
    // Nothing under /usr/local (a package never writes there), and no generated manual page
    // for the hidden `generate` command.
    assert!(
        !files
            .iter()
            .any(|f| f.starts_with("/usr/local") || f.contains("generate")),
        "{files:#?}"
    );
    let field = |f: &str| ok(Command::new("dpkg-deb").arg("-f").arg(deb).arg(f));
    assert_eq!(field("Package").trim(), PKG);
    assert_eq!(field("Architecture").trim(), "amd64");
    assert_eq!(
        field("Version").trim(),
        env!("CARGO_PKG_VERSION"),
        "the version is the crate's, without a Debian revision"
    );
    // Depends, from the binary's libraries (dpkg-shlibdeps): the base system's only, and a
    // libc6 that Ubuntu 22.04 (2.35) satisfies (2.28 for the release package).
    let depends = field("Depends");
    eprintln!("Depends: {}", depends.trim());
    for dep in depends.split(',') {
        let name = dep.split_whitespace().next().unwrap_or_default();
        assert!(BASE_PACKAGES.contains(&name), "Depends on {dep:?}");
        if let Some(v) = dep
            .split_once("(>= ")
            .map(|(_, v)| v.trim().trim_end_matches(')'))
            && name == "libc6"
        {
            let v = glibc_version(&format!("GLIBC_{v}")).expect("libc6 version");
            assert!(v <= GLIBC_MAX_HOST_BUILD, "Depends: {dep}");
        }
    }
    let conffiles = ok(Command::new("dpkg-deb").arg("-I").arg(deb).arg("conffiles"));
    assert_eq!(conffiles.trim(), "/etc/traceml/config.toml");
    for script in ["postinst", "prerm", "postrm"] {
        ok(Command::new("dpkg-deb").arg("-I").arg(deb).arg(script));
    }
}

/// Each library the installed binary loads (`ldd`) belongs to a base-system package.
fn check_libraries_are_the_base_systems(bin: &Path) {
    let ldd = ok(Command::new("ldd").arg(bin));
    let mut seen = 0;
    for line in ldd.lines() {
        let path = match line.split_once("=>") {
            Some((_, r)) => r.split_whitespace().next(),
            None => line
                .split_whitespace()
                .next()
                .filter(|p| p.starts_with('/')),
        };
        let Some(path) = path else { continue };
        let owner = ok(Command::new("dpkg").arg("-S").arg(path));
        let package = owner.split(':').next().unwrap_or_default();
        assert!(
            BASE_PACKAGES.contains(&package),
            "{path} comes from {owner:?}"
        );
        seen += 1;
    }
    assert!(seen >= 2, "ldd found too little: {ldd}");
}

/// No process runs the installed binary (dpkg started nothing).
fn nothing_runs(bin: &Path) {
    for p in procfs::process::all_processes().unwrap().flatten() {
        if let Ok(exe) = p.exe() {
            assert_ne!(exe, bin, "pid {} runs {}", p.pid(), bin.display());
        }
    }
}

/// No `*.wants/` link to the package's units anywhere systemd looks for them.
fn nothing_enabled() {
    for dir in ["/etc/systemd/system", "/usr/lib/systemd/system"] {
        let Ok(rd) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in rd.flatten() {
            if !e.file_name().to_string_lossy().ends_with(".wants") {
                continue;
            }
            for link in std::fs::read_dir(e.path()).into_iter().flatten().flatten() {
                let name = link.file_name().to_string_lossy().into_owned();
                assert!(
                    !name.starts_with("traceml"),
                    "{} enables {name}",
                    e.path().display()
                );
            }
        }
    }
}

fn check_units() {
    for unit in [
        "traceml-daemon.service",
        "traceml-weekly-sweep.service",
        "traceml-weekly-sweep.timer",
    ] {
        let path = Path::new("/usr/lib/systemd/system").join(unit);
        let body = std::fs::read_to_string(&path).unwrap();
        assert!(!body.contains("/usr/local"), "{unit} names /usr/local");
        // `verify` also checks that ExecStart's binary and the man pages named in
        // Documentation= exist.
        let out = Command::new("systemd-analyze")
            .arg("verify")
            .arg(&path)
            .output()
            .expect("systemd-analyze (apt systemd; cargo xtask setup installs it)");
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "systemd-analyze verify {unit}: {}",
            text(&out)
        );
    }
    let unit = std::fs::read_to_string("/usr/lib/systemd/system/traceml-daemon.service").unwrap();
    assert!(
        unit.contains("\nExecStart=/usr/bin/traceml-daemon serve "),
        "{unit}"
    );
}

fn check_man_pages() {
    let mut sub = vec![String::new()];
    sub.extend(
        [
            "replay", "compare", "export", "report", "sweep", "serve", "top",
        ]
        .map(|s| format!("-{s}")),
    );
    for s in sub {
        let page = format!("traceml-daemon{s}");
        let at = ok(Command::new("man").args(["-w", &page]));
        assert_eq!(
            at.trim(),
            format!("/usr/share/man/man1/{page}.1.gz"),
            "man -w {page}"
        );
    }
    // The page renders, and holds the options of its command.
    let serve = ok(Command::new("man")
        .args(["-P", "cat", "traceml-daemon-serve"])
        .env("MANWIDTH", "100"));
    for opt in [
        "--state-dir",
        "--config",
        "--check-config",
        "--metrics-addr",
    ] {
        assert!(
            serve.contains(opt),
            "{opt} not in man traceml-daemon-serve:\n{serve}"
        );
    }
}

fn check_completions() {
    let bash = "/usr/share/bash-completion/completions/traceml-daemon";
    let registered = ok(Command::new("bash").args([
        "-c",
        &format!("source {bash} && complete -p traceml-daemon"),
    ]));
    assert!(registered.contains("traceml-daemon"), "{registered}");
    let zsh = std::fs::read_to_string("/usr/share/zsh/vendor-completions/_traceml-daemon").unwrap();
    assert!(zsh.starts_with("#compdef traceml-daemon"), "{zsh}");
    let fish = std::fs::read_to_string("/usr/share/fish/vendor_completions.d/traceml-daemon.fish")
        .unwrap();
    assert!(fish.contains("complete -c traceml-daemon"), "{fish}");
    for (text, what) in [(&zsh, "zsh"), (&fish, "fish")] {
        for cmd in ["serve", "replay", "sweep"] {
            assert!(text.contains(cmd), "{what} completion lacks {cmd}");
        }
    }
}

/// The installed binary attached to a ground-truth workload: a summary with steps.
fn check_attach(bin: &Path) {
    let _ = fake_cudart();
    let dir = scratch("installed-attach");
    let mut cmd = Command::new(python(11));
    cmd.arg(workspace().join("tests/workloads/compute_bound.py"))
        .arg("--truth")
        .arg(dir.join("truth.json"));
    let mut target = spawn(cmd, &dir);
    let out = run_daemon_at(
        bin,
        &mut target,
        &dir,
        &["--quiet"],
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "{}", out.stderr);
    assert!(out.out_dir.join("final_summary.json").is_file());
    let steps = out.summary["steps"]["count"].as_u64().unwrap_or(0);
    assert!(steps > 0, "{}", out.summary);
    eprintln!(
        "installed daemon: {steps} steps, {}",
        out.summary["primary_diagnosis"]["kind"]
    );
}

#[test]
fn the_package_installs_attaches_verifies_and_purges_clean() {
    if !root_or_skip() {
        return;
    }
    let Some(deb) = package() else {
        return;
    };
    let bin = Path::new("/usr/bin/traceml-daemon");
    // The test installs and purges the package: not on a machine that has it, or its files.
    assert!(
        status().is_empty(),
        "{PKG} is installed here ({}): the test would replace and purge it; `dpkg --purge {PKG}` first",
        status()
    );
    for p in [
        bin,
        Path::new("/etc/traceml"),
        Path::new("/var/lib/traceml"),
    ] {
        assert!(
            !p.exists(),
            "{} exists: the test would remove it on purge",
            p.display()
        );
    }
    check_archive(&deb);
    let before = snapshot();
    let _cleanup = Installed;

    ok(Command::new("dpkg").arg("-i").arg(&deb));
    assert_eq!(status(), "install ok installed");
    // Everything new is the package's (`dpkg -L`), its state directories, or dpkg's record of it.
    let installed = snapshot();
    let listed: BTreeSet<String> = ok(Command::new("dpkg").args(["-L", PKG]))
        .lines()
        .map(str::to_owned)
        .collect();
    let unexplained: Vec<String> = minus(&installed, &before)
        .into_iter()
        .filter(|l| {
            let p = path_of(l);
            !(listed.contains(p)
                || p.starts_with("/var/lib/traceml")
                || p.starts_with(&format!("/var/lib/dpkg/info/{PKG}.")))
        })
        .collect();
    assert!(unexplained.is_empty(), "dpkg -i added {unexplained:#?}");
    // The state directories, as the units' StateDirectory= would make them.
    for d in ["/var/lib/traceml", "/var/lib/traceml-sweep"] {
        let m = std::fs::metadata(d).unwrap_or_else(|e| panic!("{d}: {e}"));
        assert!(m.is_dir());
        assert_eq!((m.mode() & 0o7777, m.uid(), m.gid()), (0o750, 0, 0), "{d}");
    }
    nothing_enabled();
    nothing_runs(bin);

    let version = ok(Command::new(bin).arg("--version"));
    assert!(
        version.starts_with(&format!(
            "traceml-daemon {} (commit ",
            env!("CARGO_PKG_VERSION")
        )),
        "{version}"
    );
    check_elf(bin);
    check_libraries_are_the_base_systems(bin);
    let (code, said) = check_config(bin, Path::new("/etc/traceml/config.toml"));
    assert_eq!(code, Some(0), "{said}");
    check_units();
    check_man_pages();
    check_completions();
    check_attach(bin);
    nothing_runs(bin);

    // A job's directory, as serve writes it: purge takes it, remove keeps it.
    let job = Path::new("/var/lib/traceml/python3-1-20260101-000000");
    std::fs::create_dir_all(job).unwrap();
    std::fs::write(job.join("final_summary.json"), "{}").unwrap();
    ok(Command::new("dpkg").args(["-r", PKG]));
    assert_eq!(status(), "deinstall ok config-files");
    for gone in [
        bin,
        Path::new("/usr/lib/systemd/system/traceml-daemon.service"),
        Path::new("/usr/share/man/man1/traceml-daemon.1.gz"),
    ] {
        assert!(!gone.exists(), "{} left after dpkg -r", gone.display());
    }
    for kept in [
        Path::new("/etc/traceml/config.toml"),
        &job.join("final_summary.json"),
    ] {
        assert!(kept.exists(), "dpkg -r removed {}", kept.display());
    }

    ok(Command::new("dpkg").args(["--purge", PKG]));
    assert_eq!(status(), "", "dpkg still knows {PKG}");
    let after = snapshot();
    let (added, removed) = (minus(&after, &before), minus(&before, &after));
    assert!(
        added.is_empty() && removed.is_empty(),
        "install + purge changed the system: left {added:#?}, removed {removed:#?}"
    );
    eprintln!(
        "install + purge: {} paths under {} compared, the same",
        before.len(),
        SNAPSHOT_ROOTS.join(", ")
    );
}
