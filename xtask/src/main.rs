//! `cargo xtask`: what cargo alone cannot do. `setup` installs the toolchain pieces and test
//! environments (idempotent, each step says what failed), `demo` shows the daemon diagnosing the
//! bundled demo workload, `test` runs every check CI runs (fmt, clippy, unit and root tests with
//! real eBPF), `bench` measures overhead and accuracy into BENCHMARKS.md, `deb` builds the
//! Debian package.
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};

mod bench;
mod deb;
mod elfneeds;
mod image;
mod oldglibc;
mod setup;

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what is missing: apt's LLVM, bpf-linker, the pinned nightly's rust-src, test libraries and
    /// the Python environments the tests use (real PyTorch on CPU with --torch or for `test`).
    Setup {
        /// Also build the cached virtualenv with real PyTorch (about 3 GB download once).
        #[arg(long)]
        torch: bool,
    },
    /// Set up, build, and run the daemon against the bundled input-bound demo training run: a
    /// look-alike `torch` on a simulated GPU (the stand-in CUDA runtime), no GPU needed.
    Demo {
        /// Real PyTorch on CPU instead (an input-bound DataLoader loop; sets up the torch
        /// virtualenv first, about 3 GB once).
        #[arg(long)]
        real: bool,
    },
    /// Set up and run every test: fmt, clippy (warnings denied), unit tests, root eBPF tests.
    Test {
        /// Skip the tests that need real PyTorch (no large download).
        #[arg(long)]
        no_torch: bool,
        /// Keep N cores busy (default: all of them) with CPU-bound processes while the tests
        /// run: the suite's expectations must hold on a loaded machine (issue 27).
        #[arg(long, num_args = 0..=1, default_missing_value = "0", value_name = "N")]
        stress: Option<usize>,
        /// Extra arguments for `cargo test` (e.g. a test name filter).
        #[arg(last = true)]
        rest: Vec<String>,
    },
    /// Build the Debian package: target/debian/traceml-daemon_<version>_amd64.deb (release
    /// binary, systemd units, example config, sweep timer, man pages, completions, docs; see
    /// docs/install.md). Installs the eBPF toolchain and cargo-deb first when missing.
    Deb {
        /// Package the dev build instead, into target/debian-dev/ (what `cargo xtask test`
        /// installs: the same package around an unoptimised binary; not for nodes).
        #[arg(long)]
        dev: bool,
    },
    /// The release package on an older node: builds it (binary linked for glibc 2.28), installs
    /// it in a Debian bullseye root (glibc 2.31, debootstrap, cached in target/old-glibc/) and
    /// runs --version, serve --check-config and an attach to a training process outside it.
    OldGlibc,
    /// The container image of the node service (podman, from the bullseye root's libraries and
    /// the glibc 2.28 binary; no base image pulled): traceml-daemon:<version>, saved as an OCI
    /// archive in target/image/. --check runs it beside a training process.
    Image {
        #[arg(long)]
        check: bool,
    },
    /// The prepared GPU check (tests/gpu/gpu_check.sh): with --prepare, build the release daemon
    /// into .gpu/ here (to carry to the GPU machine); without, run the check on this machine
    /// (it must have a GPU, CUDA PyTorch and .gpu/traceml-daemon; the 2-process NCCL step needs 2
    /// GPUs and is skipped, saying so, with fewer). Results go to $OUT.
    GpuCheck {
        #[arg(long)]
        prepare: bool,
    },
    /// Measure overhead, footprint, attach/verdict times and accuracy (and TraceML side by side)
    /// on this machine; (re)writes BENCHMARKS.md. Not part of `test`.
    Bench {
        /// A short run for development (~3 min): fewer pairs, smaller storms, fewer workloads.
        #[arg(long)]
        quick: bool,
        /// Only the in-process overhead section (daemon attached and detached in windows of one
        /// long run of each workload; dev build), spliced into the existing BENCHMARKS.md.
        #[arg(long)]
        inprocess_only: bool,
        /// Only the `sweep` section: 1,000 job pairs swept by the release daemon, spliced into
        /// the existing BENCHMARKS.md.
        #[arg(long)]
        sweep_only: bool,
        /// Only the streaming-engine memory section: the release daemon replays a synthetic
        /// 10 M-step recording from a pipe (1 M with --quick), spliced into BENCHMARKS.md.
        #[arg(long)]
        replay_only: bool,
        /// Only `serve` with 8 jobs attached at once: its CPU and memory over a steady minute
        /// (release build), spliced into BENCHMARKS.md.
        #[arg(long)]
        service_only: bool,
        /// Only one `--pid` daemon on a job of about this many minutes (60 for the hour-long
        /// run): its RssAnon every 10 s, spliced into BENCHMARKS.md.
        #[arg(long, value_name = "M")]
        long_minutes: Option<u32>,
        /// Only the bystander rows: a torch process that does not train (inference-like, and
        /// plain Python) under `serve`, its slowdown measured inside it, spliced into
        /// BENCHMARKS.md.
        #[arg(long)]
        bystander_only: bool,
        /// Only the node-scale rows: time to attach every rank and to stop, for 1, 2 and 4
        /// ranks of a gloo job, `--pid <launcher>` and `serve`, and a 4-rank job's step time
        /// with the daemon (its collective ledger) attached and not, spliced into BENCHMARKS.md.
        #[arg(long)]
        ranks_only: bool,
        /// Only the thread-state source's node cost: a context-switching bystander with the
        /// daemon attached to a training loop in some windows and not in others, per 1,000
        /// context switches of the node, spliced into BENCHMARKS.md.
        #[arg(long)]
        sched_only: bool,
        /// Only the driver-path probes' cost per hit (a vendor library's launches through its
        /// own runtime copy, through followed `cuGetProcAddress` pointers, and
        /// `cuGetProcAddress` itself), spliced into BENCHMARKS.md.
        #[arg(long)]
        driver_only: bool,
    },
}

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// Runs a command, echoing it and, when it took a while, how long (what a CI run's time goes
/// to); fails with the command line when it fails.
pub fn run(cmd: &mut Command) -> anyhow::Result<()> {
    eprintln!("xtask: $ {}", show(cmd));
    let t0 = std::time::Instant::now();
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {}", show(cmd)))?;
    let took = t0.elapsed().as_secs();
    if took >= 5 {
        eprintln!("xtask: {}:{:02} for $ {}", took / 60, took % 60, show(cmd));
    }
    if !status.success() {
        bail!("`{}` failed ({status})", show(cmd));
    }
    Ok(())
}

pub fn show(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Setup { torch } => setup::all(torch),
        Cmd::Demo { real } => demo(real),
        Cmd::GpuCheck { prepare } => gpu_check(prepare),
        Cmd::OldGlibc => oldglibc::check(),
        Cmd::Image { check } => image::build(check),
        Cmd::Deb { dev } => deb::build(if dev {
            deb::Profile::Dev
        } else {
            deb::Profile::Release
        })
        .map(|_| ()),
        Cmd::Test {
            no_torch,
            stress,
            rest,
        } => test(!no_torch, stress, &rest),
        Cmd::Bench {
            quick,
            inprocess_only,
            sweep_only,
            replay_only,
            service_only,
            long_minutes,
            bystander_only,
            ranks_only,
            sched_only,
            driver_only,
        } => bench::bench(bench::Only {
            quick,
            inprocess_only,
            sweep_only,
            replay_only,
            service_only,
            long_minutes,
            bystander_only,
            ranks_only,
            sched_only,
            driver_only,
        }),
    }
}

/// Kills the spawned workload if the demo fails half-way.
struct Workload(Child);
impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn demo(real: bool) -> anyhow::Result<()> {
    let env = setup::demo(real).and_then(|_| setup::test_env())?;
    let root = root();
    // Only the binary, in the `quick` profile (Cargo.toml: dev without optimised dependencies or
    // debug info), the quickest cold build on a fresh machine, sharing its dependencies with
    // this xtask's build; the eBPF object is always built optimised.
    run(Command::new("cargo")
        .args(["build", "-p", "traceml-daemon", "--bin", "traceml-daemon"])
        .args(["--profile", "quick"])
        .current_dir(&root))?;
    let daemon = root.join("target/quick/traceml-daemon");
    let ready = std::env::temp_dir().join(format!("traceml-demo-ready-{}", std::process::id()));
    let _ = std::fs::remove_file(&ready);
    let mut cmd = if real {
        let python = setup::torch_python();
        eprintln!(
            "xtask: starting the real-PyTorch demo run on CPU: a DataLoader whose items take 8 ms \
             each (input-bound by construction), a 3-layer MLP, SGD"
        );
        let mut cmd = Command::new(python);
        cmd.arg(root.join("tests/workloads/real_torch_train.py"))
            .args(["--scenario", "input_bound"]);
        cmd
    } else {
        let python =
            setup::pyenv_python("3.11").context("the demo runs on pyenv's CPython 3.11")?;
        eprintln!(
            "xtask: starting the demo training run (input-bound by construction; a look-alike \
             torch on a simulated GPU)"
        );
        let mut cmd = Command::new(&python);
        cmd.arg(root.join("tests/workloads/demo_train.py"));
        cmd
    };
    cmd.arg("--ready").arg(&ready).current_dir(&root);
    env.apply(&mut cmd);
    let child = Workload(
        cmd.stdout(Stdio::inherit())
            .spawn()
            .context("starting the demo workload")?,
    );
    let pid = child.0.id();
    // Attach after the workload has started, as a user would.
    std::thread::sleep(Duration::from_millis(500));
    let out = root.join(if real {
        "traceml-logs/demo-real"
    } else {
        "traceml-logs/demo"
    });
    eprintln!(
        "xtask: $ sudo traceml-daemon --pid {pid} --output {}",
        out.display()
    );
    let t = Instant::now();
    let status = Command::new(&daemon)
        .args(["--pid", &pid.to_string(), "--output"])
        .arg(&out)
        .arg("--ready-file")
        .arg(&ready)
        .status()
        .context("starting traceml-daemon")?;
    let _ = std::fs::remove_file(&ready);
    if !status.success() {
        bail!("traceml-daemon failed ({status})");
    }
    eprintln!(
        "xtask: demo done in {:.1} s; summary in {}",
        t.elapsed().as_secs_f64(),
        out.display()
    );
    Ok(())
}

fn gpu_check(prepare: bool) -> anyhow::Result<()> {
    let root = root();
    if prepare {
        setup::all(false)?;
        run(Command::new("cargo")
            .args(["build", "--release", "-p", "traceml-daemon"])
            .current_dir(&root))?;
        let dir = root.join(".gpu");
        std::fs::create_dir_all(&dir).context("creating .gpu/")?;
        std::fs::copy(
            root.join("target/release/traceml-daemon"),
            dir.join("traceml-daemon"),
        )
        .context("copying the release daemon into .gpu/")?;
        eprintln!(
            "xtask: .gpu/traceml-daemon ready; on the GPU machine run `bash tests/gpu/gpu_check.sh` \
             (carry .gpu)"
        );
        return Ok(());
    }
    run(Command::new("bash")
        .arg(root.join("tests/gpu/gpu_check.sh"))
        .current_dir(&root))
}

/// CPU-bound busy loops, killed when dropped.
struct Stress(Vec<std::process::Child>);

impl Stress {
    fn start(n: usize) -> anyhow::Result<Stress> {
        let n = if n == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            n
        };
        eprintln!("xtask test: --stress: {n} busy processes during the tests");
        let mut v = Vec::new();
        for _ in 0..n {
            v.push(
                Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .spawn()
                    .context("starting a --stress busy loop")?,
            );
        }
        Ok(Stress(v))
    }
}

impl Drop for Stress {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn test(torch: bool, stress: Option<usize>, rest: &[String]) -> anyhow::Result<()> {
    setup::all(torch)?;
    let env = setup::test_env()?;
    let root = root();
    run(Command::new("cargo")
        .args(["fmt", "--all", "--check"])
        .current_dir(&root))?;
    run(Command::new("cargo")
        .args(["clippy", "--all-targets", "--", "-D", "warnings"])
        .current_dir(&root))?;
    // The pure core without the `live` feature (no eBPF build, no aya): what a non-root user
    // with stable Rust builds and tests; checked here so the feature gates stay right.
    run(Command::new("cargo")
        .args([
            "clippy",
            "-p",
            "traceml-daemon",
            "--no-default-features",
            "--all-targets",
        ])
        .args(["--", "-D", "warnings"])
        .current_dir(&root))?;
    // Unit tests (no root) in parallel, then the integration tests, with the root tests that
    // attach real probes, one at a time: they measure time, and two cores are easily
    // oversubscribed. TRACEML_REQUIRE_ROOT: a root test that finds no root fails, not skips.
    // Built before the load starts: the load is for the tests, not the compiler.
    run(Command::new("cargo")
        .args(["test", "--lib", "--bins", "--no-run"])
        .current_dir(&root))?;
    // `--test '*'`: the integration tests only (`--tests` would build and run the unit tests
    // a second time, one at a time).
    run(Command::new("cargo")
        .args(["test", "-p", "traceml-daemon", "--test", "*", "--no-run"])
        .current_dir(&root))?;
    // The package tests/install.rs installs and purges, around the dev build just made (a
    // release build would add 6 minutes on 2 cores; `cargo xtask deb` builds that one).
    let deb = deb::build(deb::Profile::Dev)?;
    let _stress = stress.map(Stress::start).transpose()?;
    // --no-fail-fast, and the integration tests run even when a unit test failed: one failure
    // does not hide the others.
    let unit = run(Command::new("cargo")
        .args(["test", "--lib", "--bins", "--no-fail-fast"])
        .args(rest)
        .env("TRACEML_REQUIRE_ROOT", "1")
        .current_dir(&root));
    let mut cmd = Command::new("cargo");
    cmd.args([
        "test",
        "-p",
        "traceml-daemon",
        "--test",
        "*",
        "--no-fail-fast",
    ])
    .args(rest)
    .args(["--", "--test-threads=1"])
    .env("TRACEML_REQUIRE_ROOT", "1")
    .env("TRACEML_DEB", &deb)
    .current_dir(&root);
    env.apply(&mut cmd);
    // The real-PyTorch tests are #[ignore]d: run here unless --no-torch, which leaves them
    // reported as ignored.
    if torch {
        cmd.arg("--include-ignored");
    }
    let integration = run(&mut cmd);
    unit.context("unit tests failed")?;
    integration
}
