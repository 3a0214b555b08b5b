//! `cargo xtask deb`: the Debian package of the node service. Builds the release binary (its
//! eBPF object embedded, as every build), refuses it if it would not run on older nodes
//! ([`crate::elfneeds`]), generates what the package holds but the repository does not (man
//! pages and shell completions from the binary's own CLI, the units with the package's /usr/bin
//! paths) into `target/release/deb-assets/`, and packs it all with cargo-deb (installed at
//! [`CARGO_DEB_VERSION`] when missing) as `[package.metadata.deb]` in traceml-daemon/Cargo.toml
//! describes. Output: `target/debian/traceml-daemon_<version>_amd64.deb`. Layout:
//! docs/install.md.
//!
//! `cargo xtask test` packages the dev build instead (`--dev`, into `target/debian-dev/`): the
//! same package around the binary the tests build anyway, so CI does not pay for a second,
//! release build of the workspace (measured: 6 min on 2 cores from scratch).
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context as _, bail};

use crate::{root, run, setup};

/// cargo-deb's release this package is built and tested with (builds with Rust 1.85 and later).
pub const CARGO_DEB_VERSION: &str = "3.8.0";

/// The units the package ships in a variant of their own: the repository's files name
/// /usr/local/bin, where README's manual install (and `cargo install`) puts the binaries, and the
/// package installs them in /usr/bin. (unit file, the man page its Documentation= adds)
const UNITS: [(&str, &str); 2] = [
    ("traceml-daemon.service", "traceml-daemon-serve"),
    ("traceml-weekly-sweep.service", "traceml-daemon-sweep"),
];

/// Which build goes into the package.
#[derive(Clone, Copy, PartialEq)]
pub enum Profile {
    /// What is shipped: `target/release`, packaged into `target/debian/`.
    Release,
    /// What `cargo xtask test` installs: the dev build (`target/debug`), into
    /// `target/debian-dev/`.
    Dev,
}

impl Profile {
    /// (cargo's profile name, its directory under target/, the package's directory)
    fn dirs(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Profile::Release => ("release", "release", "debian"),
            Profile::Dev => ("dev", "debug", "debian-dev"),
        }
    }
}

/// Builds the package; returns its path.
pub fn build(profile: Profile) -> anyhow::Result<PathBuf> {
    let (cargo_profile, build_dir, out) = profile.dirs();
    let t = Instant::now();
    setup::toolchain()?;
    setup::apt_step(
        "dpkg-shlibdeps (apt dpkg-dev; the package's Depends from the binary's libraries)",
        "/usr/bin/dpkg-shlibdeps",
        &["dpkg-dev"],
    )?;
    cargo_deb()?;
    let root = root();
    let mut build = Command::new("cargo");
    let build_dir = match profile {
        // Linked by zig against glibc 2.28's symbols (RHEL/Rocky 8, Ubuntu 20.04 and newer).
        Profile::Release => {
            build
                .args(["zigbuild", "--release", "-p", "traceml-daemon", "--target"])
                .arg(format!("{}.{}", setup::SHIP_TARGET, setup::SHIP_GLIBC))
                .env("PATH", setup::zig()?);
            root.join("target").join(setup::SHIP_TARGET).join(build_dir)
        }
        // The binary the integration tests run (`CARGO_BIN_EXE_traceml-daemon`, built with the
        // dev-dependencies' features, which a plain `cargo build` leaves out): after the tests'
        // build in `cargo xtask test` nothing is compiled again. Linked on this machine: its
        // floor is the build machine's glibc (`GLIBC_MAX_HOST_BUILD`).
        Profile::Dev => {
            build.args(["test", "-p", "traceml-daemon", "--tests", "--no-run"]);
            root.join("target").join(build_dir)
        }
    };
    run(build.current_dir(&root))?;
    let daemon = build_dir.join("traceml-daemon");
    let floor = match profile {
        Profile::Release => crate::elfneeds::GLIBC_MAX,
        Profile::Dev => crate::elfneeds::GLIBC_MAX_HOST_BUILD,
    };
    let needs = crate::elfneeds::check(&daemon, floor).map_err(anyhow::Error::msg)?;
    eprintln!(
        "xtask deb: {} needs {} at most and links {}",
        daemon.display(),
        crate::elfneeds::newest_glibc(&needs),
        needs.libs.join(", ")
    );
    // cargo-deb reads the assets named `target/release/...` from the profile's directory
    // (`target/<triple>/release/...` with `--target`).
    write_assets(&root, &daemon, &build_dir.join("deb-assets"))?;
    let out_dir = root.join("target").join(out);
    let deb = out_dir.join(format!(
        "traceml-daemon_{}_amd64.deb",
        env!("CARGO_PKG_VERSION")
    ));
    // A package left from an earlier build is never taken for this one.
    let _ = std::fs::remove_file(&deb);
    run(Command::new("cargo")
        .args([
            "deb",
            "-p",
            "traceml-daemon",
            "--no-build",
            "--profile",
            cargo_profile,
        ])
        .args(match profile {
            Profile::Release => vec!["--target", setup::SHIP_TARGET, "--variant", "glibc228"],
            Profile::Dev => vec![],
        })
        .arg("--output")
        .arg(&out_dir)
        .current_dir(&root))?;
    let size = std::fs::metadata(&deb)
        .with_context(|| format!("cargo deb did not write {}", deb.display()))?
        .len();
    eprintln!(
        "xtask deb: {} ({:.1} MB) in {:.0} s",
        deb.display(),
        size as f64 / 1e6,
        t.elapsed().as_secs_f64()
    );
    Ok(deb)
}

/// cargo-deb at [`CARGO_DEB_VERSION`], installed with `cargo install --locked` when missing.
fn cargo_deb() -> anyhow::Result<()> {
    setup::cargo_tool("deb", "cargo-deb", CARGO_DEB_VERSION)
}

/// The generated assets `[package.metadata.deb]` names, written afresh into `dir`.
fn write_assets(root: &Path, daemon: &Path, dir: &Path) -> anyhow::Result<()> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let man = dir.join("man");
    for what in ["man", "bash", "zsh", "fish"] {
        let into = if what == "man" { &man } else { dir };
        run(Command::new(daemon).args(["generate", what]).arg(into))?;
    }
    gzip_pages(&man)?;
    for (unit, page) in UNITS {
        let src = root.join("packaging").join(unit);
        let text =
            std::fs::read_to_string(&src).with_context(|| format!("reading {}", src.display()))?;
        let packaged = packaged_unit(&text, page).with_context(|| src.display().to_string())?;
        std::fs::write(dir.join(unit), packaged).context("writing a packaged unit")?;
    }
    Ok(())
}

/// Compresses each `*.1` in `dir` to `*.1.gz` (Debian's manual pages are gzipped; no name or
/// time in the header, so equal pages give equal files), removing the plain page.
fn gzip_pages(dir: &Path) -> anyhow::Result<()> {
    let mut n = 0;
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = e?.path();
        if path.extension().is_none_or(|x| x != "1") {
            continue;
        }
        let page = std::fs::read(&path)?;
        let mut gz = path.clone().into_os_string();
        gz.push(".gz");
        let mut enc = flate2::GzBuilder::new().write(
            std::fs::File::create(&gz).with_context(|| format!("creating {gz:?}"))?,
            flate2::Compression::best(),
        );
        enc.write_all(&page)?;
        enc.finish()?;
        std::fs::remove_file(&path)?;
        n += 1;
    }
    if n < 2 {
        bail!(
            "`traceml-daemon generate man` wrote {n} pages into {}",
            dir.display()
        );
    }
    Ok(())
}

/// The package's variant of a repository unit: binaries in /usr/bin, docs in /usr/share/doc,
/// and `man:PAGE(1)` added to Documentation=. Fails when the unit no longer looks as expected
/// (no `ExecStart=/usr/local/bin/`), so a changed unit cannot ship with paths that do not exist.
fn packaged_unit(text: &str, page: &str) -> anyhow::Result<String> {
    if !text.contains("\nExecStart=/usr/local/bin/") {
        bail!("no `ExecStart=/usr/local/bin/...` line to adjust for the package");
    }
    let doc = "\nDocumentation=file:/usr/local/share/doc/";
    if !text.contains(doc) {
        bail!("no `Documentation=file:/usr/local/share/doc/...` line to adjust for the package");
    }
    let out = format!(
        "# The traceml-daemon package's variant of this unit (cargo xtask deb): binaries in \
         /usr/bin.\n{}",
        text.replace(
            doc,
            &format!("\nDocumentation=man:{page}(1) file:/usr/share/doc/")
        )
        .replace("/usr/local/bin/", "/usr/bin/")
    );
    if let Some(line) = out.lines().find(|l| l.contains("/usr/local")) {
        bail!("still names /usr/local after adjusting for the package: {line}");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_repository_units_have_a_packaged_variant() {
        for (unit, page) in UNITS {
            let text = std::fs::read_to_string(root().join("packaging").join(unit)).unwrap();
            let p = packaged_unit(&text, page).unwrap();
            assert!(p.contains("\nExecStart=/usr/bin/traceml-"), "{p}");
            assert!(p.contains(&format!(
                "\nDocumentation=man:{page}(1) file:/usr/share/doc/"
            )));
            assert!(!p.contains("/usr/local"), "{p}");
        }
        let daemon =
            std::fs::read_to_string(root().join("packaging/traceml-daemon.service")).unwrap();
        let p = packaged_unit(&daemon, "traceml-daemon-serve").unwrap();
        assert!(p.contains("\nExecStart=/usr/bin/traceml-daemon serve "));
        // A unit whose paths changed is refused rather than shipped half-adjusted.
        assert!(packaged_unit(&daemon.replace("/usr/local/bin/", "/opt/bin/"), "x").is_err());
        let odd = daemon.replace("Environment=", "Environment=PATH=/usr/local/sbin ");
        assert!(packaged_unit(&odd, "x").is_err());
    }
}
