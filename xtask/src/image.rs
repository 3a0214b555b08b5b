//! `cargo xtask image`: the container image of the node service, for a Kubernetes DaemonSet
//! (`packaging/kubernetes/`). No base image is pulled: the image is the release binary (linked
//! for glibc 2.28, as the package's), the loader and the four glibc libraries it links, copied
//! from the Debian bullseye root `cargo xtask old-glibc` makes with debootstrap, and the default
//! config; nothing else (no shell, no package manager). Imported with podman (Debian's package)
//! as `traceml-daemon:<version>` and saved as an OCI archive under `target/image/`.
//!
//! `--check` then runs it as the DaemonSet does (`serve`, `--pid=host`, the capabilities, the
//! host's /sys, the outputs on a host path, /metrics on a port) beside a training process of
//! the host (`tests/workloads/input_bound_single.py`, fake torch), and requires that process's
//! INPUT_BOUND summary on the host path and its series from the container's /metrics.
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};

use crate::{deb, root, run, setup};

const TAG: &str = concat!("traceml-daemon:", env!("CARGO_PKG_VERSION"));
/// The libraries the release binary links (`elfneeds` checks it links no other), and the loader.
const LIBS: [&str; 5] = [
    "libc.so.6",
    "libm.so.6",
    "libpthread.so.0",
    "libdl.so.2",
    "ld-linux-x86-64.so.2",
];
const METRICS_PORT: u16 = 19466;

/// Copies `lib` (following symlinks) from the Debian root into the image root, same path.
fn copy_lib(debian: &Path, rootfs: &Path, lib: &str) -> anyhow::Result<()> {
    let from = debian.join("lib/x86_64-linux-gnu").join(lib);
    let to = rootfs.join("lib/x86_64-linux-gnu").join(lib);
    std::fs::copy(&from, &to).with_context(|| format!("copying {}", from.display()))?;
    Ok(())
}

pub fn build(check: bool) -> anyhow::Result<()> {
    let t0 = Instant::now();
    setup::apt_step(
        "podman (apt; builds and runs the image)",
        "/usr/bin/podman",
        &["podman"],
    )?;
    // The Debian root and the package (with its glibc 2.28 binary): old-glibc's.
    crate::oldglibc::debian_root()?;
    deb::build(deb::Profile::Release)?;
    let debian = crate::oldglibc::rootfs();
    let binary = root()
        .join("target")
        .join(setup::SHIP_TARGET)
        .join("release/traceml-daemon");
    let dir = root().join("target/image");
    let rootfs = dir.join("rootfs");
    let _ = std::fs::remove_dir_all(&rootfs);
    for d in [
        "usr/bin",
        "lib/x86_64-linux-gnu",
        "lib64",
        "etc/traceml",
        "var/lib/traceml",
        "tmp",
        "proc",
        "sys",
        "dev",
    ] {
        std::fs::create_dir_all(rootfs.join(d))?;
    }
    std::fs::copy(&binary, rootfs.join("usr/bin/traceml-daemon"))?;
    for lib in LIBS {
        copy_lib(&debian, &rootfs, lib)?;
    }
    std::os::unix::fs::symlink(
        "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
        rootfs.join("lib64/ld-linux-x86-64.so.2"),
    )?;
    std::fs::copy(
        root().join("packaging/deb/config.toml"),
        rootfs.join("etc/traceml/config.toml"),
    )?;
    let tar = dir.join("rootfs.tar");
    run(Command::new("tar")
        .arg("-C")
        .arg(&rootfs)
        .args(["--owner=0", "--group=0", "-cf"])
        .arg(&tar)
        .arg("."))?;
    run(Command::new("podman")
        .arg("import")
        .args([
            "--change",
            "ENTRYPOINT [\"/usr/bin/traceml-daemon\"]",
            "--change",
            "CMD [\"serve\", \"--config\", \"/etc/traceml/config.toml\"]",
            "--change",
            "ENV RUST_LOG=info",
            "--change",
            &format!(
                "LABEL org.opencontainers.image.version={}",
                env!("CARGO_PKG_VERSION")
            ),
        ])
        .arg(&tar)
        .arg(TAG)
        .stdout(Stdio::null()))?;
    let archive = dir.join(format!(
        "traceml-daemon-{}.oci.tar",
        env!("CARGO_PKG_VERSION")
    ));
    let _ = std::fs::remove_file(&archive);
    run(Command::new("podman")
        .args(["save", "--format", "oci-archive", "-o"])
        .arg(&archive)
        .arg(TAG))?;
    let files =
        String::from_utf8_lossy(&Command::new("tar").arg("-tvf").arg(&tar).output()?.stdout)
            .into_owned();
    eprintln!("xtask image: {TAG}, holding:\n{files}");
    eprintln!(
        "xtask image: saved {} ({:.1} MB) in {:.0} s",
        archive.display(),
        std::fs::metadata(&archive)?.len() as f64 / 1e6,
        t0.elapsed().as_secs_f64()
    );
    if check {
        run_beside_a_job(&dir)?;
    }
    Ok(())
}

/// Reads `http://127.0.0.1:<port>/metrics` (HTTP/1.0, no client crate for one request).
fn metrics(port: u16) -> anyhow::Result<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// `--ulimit` options at or under this machine's own hard limits. Without them podman asks crun
/// to raise `RLIMIT_NOFILE` and `RLIMIT_NPROC`, which needs `CAP_SYS_RESOURCE` (absent from some
/// development machines' root, this one's among them); lowering a limit needs nothing. A
/// Kubernetes runtime sets its own limits: the DaemonSet needs none of these.
/// Also refuses, with what to do, a host whose cgroups crun cannot run on: hybrid mode (v1
/// hierarchies mounted) with a controller left in the v2 one.
fn ulimits() -> anyhow::Result<Vec<String>> {
    let unified = Path::new("/sys/fs/cgroup/unified/cgroup.controllers");
    if let Ok(c) = std::fs::read_to_string(unified)
        && !c.trim().is_empty()
    {
        let first = c.split_whitespace().next().unwrap_or_default().to_owned();
        bail!(
            "crun refuses this host's cgroups: hybrid mode with controllers left in the v2 \
             hierarchy ({}: {}). Moving each to v1 lets it run, e.g. `mkdir -p \
             /sys/fs/cgroup/{first} && mount -t cgroup -o {first} cgroup /sys/fs/cgroup/{first}` \
             (as done on the development machine; a node with a container runtime needs none of it)",
            unified.display(),
            c.trim()
        );
    }
    let hard = |resource| {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the struct we pass.
        let ok = unsafe { libc::getrlimit(resource, &mut r) } == 0;
        if ok { r.rlim_max } else { 1024 }
    };
    let nofile = hard(libc::RLIMIT_NOFILE).min(1 << 20);
    // A daemon's threads are a few dozen.
    let nproc = hard(libc::RLIMIT_NPROC).min(4096) / 2;
    Ok(vec![
        format!("--ulimit=nofile={nofile}:{nofile}"),
        format!("--ulimit=nproc={nproc}:{nproc}"),
    ])
}

/// The image as the DaemonSet runs it, beside a training process of the host.
fn run_beside_a_job(dir: &Path) -> anyhow::Result<()> {
    let state = dir.join("state");
    let _ = std::fs::remove_dir_all(&state);
    std::fs::create_dir_all(&state)?;
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "metrics_addr = \"0.0.0.0:{METRICS_PORT}\"\nwindow_s = 5.0\ninclude = \
             [\"*input_bound_single.py*\"]\n"
        ),
    )?;
    let ready = dir.join("workload-ready");
    let _ = std::fs::remove_file(&ready);
    let mut target = setup::input_bound_workload(&ready)?;
    std::fs::write(&ready, b"")?;
    let pid = target.id();
    let name = "traceml-image-check";
    let _ = Command::new("podman").args(["rm", "-f", name]).output();
    let limits = ulimits()?;
    let result = (|| -> anyhow::Result<()> {
        run(Command::new("podman")
            .args(["run", "-d", "--name", name, "--pid=host", "--network=host"])
            .args(&limits)
            .args([
                "--cap-drop=ALL",
                "--cap-add=SYS_ADMIN,SYS_PTRACE,DAC_READ_SEARCH,BPF,PERFMON",
                "--security-opt=seccomp=unconfined",
                "--read-only",
                "-v",
                "/sys:/sys:ro",
            ])
            .arg("-v")
            .arg(format!("{}:/var/lib/traceml", state.display()))
            .arg("-v")
            .arg(format!("{}:/etc/traceml/config.toml:ro", config.display()))
            .arg(TAG)
            .stdout(Stdio::null()))?;
        // The job's series on /metrics, then (after a window) its summary on the host path.
        let t = Instant::now();
        let mut seen = String::new();
        while t.elapsed() < Duration::from_secs(60) {
            if let Ok(m) = metrics(METRICS_PORT)
                && m.contains(&format!("pid=\"{pid}\""))
                && m.contains("traceml_steps_total")
            {
                seen = m;
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        ensure!(
            !seen.is_empty(),
            "no series of pid {pid} on the container's /metrics in 60 s; podman logs {name}"
        );
        let lines = seen
            .lines()
            .filter(|l| l.contains(&format!("pid=\"{pid}\"")))
            .count();
        eprintln!("xtask image: /metrics from the container: {lines} series of pid {pid}");
        std::thread::sleep(Duration::from_secs(7));
        run(Command::new("podman")
            .args(["stop", "-t", "20", name])
            .stdout(Stdio::null()))?;
        let summary = find_summary(&state, pid).with_context(|| {
            format!(
                "no final_summary.json of pid {pid} under {}",
                state.display()
            )
        })?;
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&summary)?)?;
        let kind = v["primary_diagnosis"]["kind"].as_str().unwrap_or_default();
        eprintln!("xtask image: {} on the host: {kind}", summary.display());
        if kind != "INPUT_BOUND" {
            bail!("expected INPUT_BOUND (the workload's design), got {kind}");
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = Command::new("podman").args(["logs", name]).status();
    }
    let _ = Command::new("podman").args(["rm", "-f", name]).output();
    let _ = target.kill();
    let _ = target.wait();
    result?;
    eprintln!("xtask image: the image ran beside a training process: passed");
    Ok(())
}

fn find_summary(state: &Path, pid: u32) -> Option<PathBuf> {
    std::fs::read_dir(state)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().contains(&format!("-{pid}-")))
        .map(|p| p.join("final_summary.json"))
        .find(|p| p.exists())
}
