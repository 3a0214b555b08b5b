//! `cargo xtask old-glibc`: the release package on an older node. Builds the package (its
//! binary linked for glibc 2.28 by cargo-zigbuild, checked by `elfneeds` at that floor), makes
//! a Debian bullseye root with `debootstrap` from the Debian archive (glibc 2.31, the class of
//! Ubuntu 20.04; cached under `target/old-glibc/`), installs the package in it with `dpkg -i`
//! (its `Depends:` must hold there), bind-mounts the host's `/proc`, `/sys` and BPF file system,
//! and inside the root runs `--version`, `serve --check-config`, and an attach to a training
//! process running outside it (`tests/workloads/input_bound_single.py`, fake torch), whose
//! summary must say INPUT_BOUND, the workload's design.
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context as _, bail, ensure};

use crate::{deb, root, run, setup};

const SUITE: &str = "bullseye";
const MIRROR: &str = "http://deb.debian.org/debian";

/// Bind mounts of the host inside the root, undone (lazily) on drop.
struct Mounts(Vec<PathBuf>);
impl Drop for Mounts {
    fn drop(&mut self) {
        for m in self.0.iter().rev() {
            let _ = Command::new("umount").arg("-l").arg(m).status();
        }
    }
}

fn bind(rootfs: &Path, what: &str, mounts: &mut Mounts) -> anyhow::Result<()> {
    let at = rootfs.join(what.trim_start_matches('/'));
    std::fs::create_dir_all(&at)?;
    run(Command::new("mount").args(["--bind", what]).arg(&at))?;
    mounts.0.push(at);
    Ok(())
}

fn chroot(rootfs: &Path) -> Command {
    let mut c = Command::new("chroot");
    c.arg(rootfs).env(
        "PATH",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    );
    c
}

fn said(c: &mut Command) -> anyhow::Result<(i32, String)> {
    let o = c.output().context("running a command in the root")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    Ok((o.status.code().unwrap_or(-1), text))
}

/// The Debian bullseye root (debootstrap, minbase), made once.
pub fn rootfs() -> PathBuf {
    root().join("target/old-glibc").join(SUITE)
}

/// Makes [`rootfs`] when it is not there yet.
pub fn debian_root() -> anyhow::Result<()> {
    setup::apt_step(
        "debootstrap (apt; the Debian bullseye root of `cargo xtask old-glibc`)",
        "/usr/sbin/debootstrap",
        &["debootstrap"],
    )?;
    let rootfs = rootfs();
    if !rootfs.join("usr/bin/dpkg").exists() {
        let _ = std::fs::remove_dir_all(&rootfs);
        std::fs::create_dir_all(rootfs.parent().expect("target/old-glibc"))?;
        eprintln!("xtask old-glibc: debootstrap {SUITE} (minbase) from {MIRROR}");
        run(Command::new("debootstrap")
            .args(["--variant=minbase", SUITE])
            .arg(&rootfs)
            .arg(MIRROR)
            .stdout(Stdio::null()))?;
    }
    Ok(())
}

pub fn check() -> anyhow::Result<()> {
    let t0 = Instant::now();
    let deb = deb::build(deb::Profile::Release)?;
    debian_root()?;
    let rootfs = rootfs();
    let (_, ldd) = said(chroot(&rootfs).args(["ldd", "--version"]))?;
    let glibc = ldd.lines().next().unwrap_or_default().to_owned();
    eprintln!("xtask old-glibc: the root's {glibc}");
    ensure!(
        glibc.ends_with("2.31"),
        "expected bullseye's glibc 2.31: {glibc}"
    );

    let mut mounts = Mounts(Vec::new());
    for m in ["/proc", "/sys", "/dev"] {
        bind(&rootfs, m, &mut mounts)?;
    }
    if Path::new("/sys/fs/bpf").is_dir() {
        bind(&rootfs, "/sys/fs/bpf", &mut mounts)?;
    }
    let pkg = rootfs.join("tmp/traceml-daemon.deb");
    std::fs::copy(&deb, &pkg)?;
    let (rc, out) = said(chroot(&rootfs).args(["dpkg", "-i", "/tmp/traceml-daemon.deb"]))?;
    ensure!(rc == 0, "dpkg -i in the {SUITE} root: {out}");
    eprintln!("xtask old-glibc: installed in the {SUITE} root");

    let (rc, version) = said(chroot(&rootfs).args(["traceml-daemon", "--version"]))?;
    ensure!(
        rc == 0 && version.starts_with("traceml-daemon "),
        "--version: {version}"
    );
    eprintln!("xtask old-glibc: {}", version.trim());
    let (rc, cfg) = said(chroot(&rootfs).args(["traceml-daemon", "serve", "--check-config"]))?;
    ensure!(rc == 0, "serve --check-config: {cfg}");
    eprintln!("xtask old-glibc: serve --check-config: {}", cfg.trim());

    // A training process outside the root, attached from inside it.
    let tmp = rootfs.join("tmp/attach");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    let mut target = setup::input_bound_workload(&tmp.join("ready"))?;
    let pid = target.id();
    let attach = said(chroot(&rootfs).args([
        "traceml-daemon",
        "--pid",
        &pid.to_string(),
        "--duration",
        "10",
        "--quiet",
        "--output",
        "/tmp/attach/out",
        "--ready-file",
        "/tmp/attach/ready",
    ]));
    let _ = target.kill();
    let _ = target.wait();
    let (rc, log) = attach?;
    ensure!(rc == 0, "the attach from the {SUITE} root failed: {log}");
    let summary = tmp.join("out/final_summary.json");
    let text = std::fs::read_to_string(&summary)
        .with_context(|| format!("no summary at {}: {log}", summary.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text)?;
    let kind = v["primary_diagnosis"]["kind"].as_str().unwrap_or_default();
    let steps = v["steps"]["count"].as_u64().unwrap_or(0);
    eprintln!(
        "xtask old-glibc: attached from the {SUITE} root to pid {pid} (outside it): {kind}, \
         {steps} steps"
    );
    if kind != "INPUT_BOUND" || steps == 0 {
        bail!("expected INPUT_BOUND with steps (the workload's design): {kind}, {steps} steps");
    }
    drop(mounts);
    eprintln!(
        "xtask old-glibc: passed in {:.0} s",
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
