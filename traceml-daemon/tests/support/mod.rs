//! Shared pieces of the root integration tests: where the interpreters and test libraries are,
//! starting a workload that waits for the daemon, running the daemon on it, reading back the
//! recording and the summary. Targets are killed on drop.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use traceml_daemon::event::StreamItem;

pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

pub fn daemon() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_traceml-daemon"))
}

/// Whether the tests run as root (they load eBPF programs and read other processes' memory).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// For a root test's first line: `if !root_or_skip() { return; }`. As root: true. Otherwise the
/// test is skipped with a message on stderr (written past the test harness's capture, so a plain
/// `cargo test` shows it), unless `TRACEML_REQUIRE_ROOT` is set (`cargo xtask test` sets it):
/// then a run without root is a setup error, not a pass.
pub fn root_or_skip() -> bool {
    if is_root() {
        return true;
    }
    let test = std::thread::current()
        .name()
        .unwrap_or("a root test")
        .to_owned();
    assert!(
        std::env::var_os("TRACEML_REQUIRE_ROOT").is_none(),
        "{test}: the root tests load eBPF programs: run them as root (cargo xtask test)"
    );
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "skipped {test}: needs root (loads eBPF programs); `sudo cargo xtask test` runs it"
    );
    false
}

/// For a test that needs a system tool (Prometheus, Chromium, an NSS module): true when `path`
/// exists. Otherwise the test is skipped with a message on stderr, unless
/// `TRACEML_REQUIRE_ROOT` is set (`cargo xtask test`, CI): then a missing tool is a setup error
/// (`cargo xtask setup` installs `package`), never a silent pass.
pub fn tool_or_skip(path: &str, package: &str) -> bool {
    if Path::new(path).exists() {
        return true;
    }
    let test = std::thread::current().name().unwrap_or("a test").to_owned();
    assert!(
        std::env::var_os("TRACEML_REQUIRE_ROOT").is_none(),
        "{test}: {path} is missing: install the Debian package {package} (cargo xtask setup does)"
    );
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "skipped {test}: {path} is missing (Debian package {package})"
    );
    false
}

pub fn tests_build() -> PathBuf {
    std::env::var_os("TRACEML_TESTS_BUILD")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("tests/build"))
}

/// The stand-in CUDA runtime built by tests/build.sh.
pub fn fake_cudart() -> PathBuf {
    let p = tests_build().join("fakecuda/libcudart.so.12");
    assert!(
        p.exists(),
        "{} is missing: run tests/build.sh (cargo xtask setup does)",
        p.display()
    );
    p
}

/// pyenv's CPython `3.<minor>` (or `TRACEML_PYTHON_3<minor>` from xtask); fails the test when
/// there is none ([`python_if_any`] for a test that skips it).
pub fn python(minor: u32) -> PathBuf {
    python_if_any(minor).unwrap_or_else(|| panic!("pyenv has no CPython 3.{minor}"))
}

/// The interpreter for 3.<minor>: `TRACEML_PYTHON_3<minor>`, else pyenv's newest 3.<minor>.*
/// (`PYENV_ROOT`, or /root/.pyenv); `None` when there is none.
pub fn python_if_any(minor: u32) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(format!("TRACEML_PYTHON_3{minor}")) {
        return Some(PathBuf::from(p));
    }
    let root = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root/.pyenv"));
    let prefix = format!("3.{minor}.");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root.join("versions"))
        .ok()?
        .flatten()
        .filter(|e| {
            e.file_name().to_str().is_some_and(|n| {
                n.strip_prefix(&prefix)
                    .is_some_and(|r| !r.is_empty() && r.chars().all(|c| c.is_ascii_digit()))
            })
        })
        .map(|e| e.path())
        .collect();
    dirs.sort();
    let exe = dirs.pop()?.join(format!("bin/python3.{minor}"));
    exe.exists().then_some(exe)
}

pub const PYTHONS: [u32; 5] = [9, 10, 11, 12, 13];

/// `python3.11 tests/workloads/<script>` on the stand-in torch (tests/faketorch, its CUDA
/// runtime the stand-in of [`tests_build`]): a workload of the `serve`, `top` and Prometheus
/// tests, which the caller gives its arguments.
pub fn faketorch_workload(script: &str) -> Command {
    let mut cmd = Command::new(python(11));
    cmd.arg(workspace().join("tests/workloads").join(script))
        .env("PYTHONPATH", workspace().join("tests/faketorch"))
        .env("TRACEML_TESTS_BUILD", tests_build());
    cmd
}

/// A spawned workload, killed on drop.
pub struct Target {
    pub child: Child,
    pub ready: PathBuf,
    pub stdout: Option<BufReader<std::process::ChildStdout>>,
    pub first_line: String,
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A scratch directory per test.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("traceml-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Starts `cmd` (which must wait for `--ready FILE` before its measured work) with stdout piped,
/// and waits for its first stdout line: the workloads print it once their imports and libraries
/// are loaded, so the daemon attaches to a process that has started, as a user's would.
pub fn spawn(mut cmd: Command, dir: &Path) -> Target {
    let ready = dir.join("ready");
    let _ = std::fs::remove_file(&ready);
    cmd.arg("--ready")
        .arg(&ready)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut first = String::new();
    stdout.read_line(&mut first).expect("workload stdout");
    assert!(
        !first.is_empty(),
        "workload {cmd:?} exited before printing its start line"
    );
    Target {
        child,
        ready,
        stdout: Some(stdout),
        first_line: first,
    }
}

/// What one daemon run produced.
pub struct Outcome {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub items: Vec<StreamItem>,
    pub summary: serde_json::Value,
    pub out_dir: PathBuf,
    pub recording: PathBuf,
    pub target_stdout: Vec<String>,
}

/// Runs the daemon on the target until the target exits (or `timeout`), recording the stream.
pub fn run_daemon(target: &mut Target, dir: &Path, extra: &[&str], timeout: Duration) -> Outcome {
    run_daemon_at(&daemon(), target, dir, extra, timeout)
}

/// [`run_daemon`] with another build of the daemon (the installed package's, `tests/install.rs`).
pub fn run_daemon_at(
    daemon: &Path,
    target: &mut Target,
    dir: &Path,
    extra: &[&str],
    timeout: Duration,
) -> Outcome {
    run_daemon_with(daemon, target, dir, extra, &[], timeout)
}

/// [`run_daemon`] with variables in the daemon's environment (the stand-in NVML's library path
/// and switches, `tests/gpu.rs`).
pub fn run_daemon_env(
    target: &mut Target,
    dir: &Path,
    extra: &[&str],
    env: &[(String, std::ffi::OsString)],
    timeout: Duration,
) -> Outcome {
    run_daemon_with(&daemon(), target, dir, extra, env, timeout)
}

fn run_daemon_with(
    daemon: &Path,
    target: &mut Target,
    dir: &Path,
    extra: &[&str],
    env: &[(String, std::ffi::OsString)],
    timeout: Duration,
) -> Outcome {
    let out_dir = dir.join("out");
    let recording = dir.join("rec.jsonl");
    let child = daemon_command(daemon, target, &recording, &out_dir)
        .args(extra)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("TRACEML_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start traceml-daemon");
    let out = wait_with_timeout(child, timeout);
    // A daemon that failed before attaching never wrote the ready file the workload waits for.
    if !target.ready.exists() {
        let _ = target.child.kill();
    }
    let stdout = target
        .stdout
        .take()
        .map(|s| s.lines().map_while(Result::ok).collect())
        .unwrap_or_default();
    let _ = target.child.wait();
    let items = if recording.exists() {
        traceml_daemon::record::read(&recording)
            .map(|r| r.items)
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    let summary = std::fs::read_to_string(out_dir.join("final_summary.json"))
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(serde_json::Value::Null);
    Outcome {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        items,
        summary,
        out_dir,
        recording,
        target_stdout: stdout,
    }
}

/// `daemon --pid <target>` as [`run_daemon_at`] starts it: it makes the target's ready file once
/// attached, records to `recording`, writes its summaries to `out_dir`, without colours. The
/// caller adds its own options, environment and output handling.
pub fn daemon_command(daemon: &Path, target: &Target, recording: &Path, out_dir: &Path) -> Command {
    let mut cmd = Command::new(daemon);
    cmd.arg("--pid")
        .arg(target.child.id().to_string())
        .arg("--ready-file")
        .arg(&target.ready)
        .arg("--record")
        .arg(recording)
        .arg("--output")
        .arg(out_dir)
        .args(["--color", "never"]);
    cmd
}

/// Waits for a child; kills it (and fails the test) past the timeout.
pub fn wait_with_timeout(mut child: Child, timeout: Duration) -> std::process::Output {
    let start = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "traceml-daemon did not finish within {timeout:?}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Decoded events of the recording.
pub fn events(items: &[StreamItem]) -> impl Iterator<Item = &traceml_daemon::event::Event> {
    items.iter().filter_map(|i| match i {
        StreamItem::Event(e) => Some(e),
        _ => None,
    })
}

/// Code pointers the daemon resolved to `qualname_suffix` in a file ending with `file_suffix`.
pub fn code_ptrs(items: &[StreamItem], qualname_suffix: &str, file_suffix: &str) -> Vec<u64> {
    items
        .iter()
        .filter_map(|i| match i {
            StreamItem::Code(c)
                if c.qualname.ends_with(qualname_suffix) && c.filename.ends_with(file_suffix) =>
            {
                Some(c.ptr)
            }
            _ => None,
        })
        .collect()
}

/// Runs `replay` on a recording; returns (exit code, stderr, summary text if written).
pub fn replay(recording: &Path, out: &Path) -> (Option<i32>, String, Option<String>) {
    let r = Command::new(daemon())
        .arg("replay")
        .arg(recording)
        .arg("--output")
        .arg(out)
        .args(["--color", "never", "--quiet"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&r.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "replay panicked:\n{stderr}");
    (
        r.status.code(),
        stderr,
        std::fs::read_to_string(out.join("final_summary.json")).ok(),
    )
}

/// Runs `cmd`, which must fail with `want_code` and one line on stderr containing `want`.
pub fn fails_clearly(cmd: &mut Command, want_code: i32, want: &str) {
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "no panics: {err}");
    assert_eq!(out.status.code(), Some(want_code), "{cmd:?}: {err}");
    assert!(err.contains(want), "{cmd:?}: expected {want:?} in: {err}");
    assert_eq!(err.trim().lines().count(), 1, "one sentence: {err}");
}

/// A recording's header line.
pub const HEADER: &str =
    "{\"format\":\"traceml-recording\",\"version\":1,\"daemon_version\":\"0.1.0\"}\n";

/// The truth's phase shares of step time over the steps the daemon's shares cover: the daemon
/// keeps the steps taken under its learning probe set (`steps.learning_excluded`, the run's
/// first ones: learning repeats only after 30 s without markers) out of its shares, so the
/// truth is read over the same steps. Each phase's total over the total wall time, as the
/// summary computes `phases.<p>.share`; all steps when the summary excluded none (or the truth
/// has no per-step phases).
pub fn truth_shares_over_daemon_steps(
    truth: &serde_json::Value,
    summary: &serde_json::Value,
) -> Vec<(traceml_daemon::phase::Phase, f64)> {
    use traceml_daemon::phase::Phase;
    let skip = summary["steps"]["learning_excluded"].as_u64().unwrap_or(0) as usize;
    let steps: Vec<&serde_json::Value> = truth["steps"]
        .as_array()
        .map(|v| v.iter().skip(skip).collect())
        .unwrap_or_default();
    let per_step = !steps.is_empty() && steps.iter().all(|s| s["wall_ns"].is_number());
    let wall: f64 = if per_step {
        steps.iter().filter_map(|s| s["wall_ns"].as_f64()).sum()
    } else {
        truth["totals"]["wall_ns"].as_f64().unwrap_or(0.0)
    };
    Phase::ALL
        .iter()
        .map(|&p| {
            // Single-process truth has no collective_wait: none happened.
            let ns: f64 = if per_step {
                // (A fold from +0.0: an empty f64 `sum` is -0.0.)
                steps
                    .iter()
                    .filter_map(|s| s["phases_ns"][p.name()].as_f64())
                    .fold(0.0, |a, b| a + b)
            } else {
                truth["totals"][format!("{}_ns", p.name())]
                    .as_f64()
                    .unwrap_or(0.0)
            };
            (p, if wall > 0.0 { ns / wall } else { 0.0 })
        })
        .collect()
}

/// The verdict the published rules give for these shares of step time over `steps` complete
/// steps: the table of docs/summary-schema.md ("Kinds and their rules"), written out here and not
/// read from the daemon's code, so a test's expectation cannot move with the code it checks
/// (`scenarios::the_rules_are_the_published_table` holds the code to this table):
/// - fewer than 5 complete steps → `INSUFFICIENT_DATA`;
/// - else the largest of `input_wait`, `h2d`, `residual` at ≥ 10 % of step time names the
///   verdict (`INPUT_BOUND`, `H2D_BOUND`, `RESIDUAL_HEAVY`);
/// - else compute (`forward + backward + optimizer + gpu_wait`) ≥ 90 % → `COMPUTE_BOUND`;
/// - else `BALANCED`.
pub fn published_verdict(
    shares: &[(traceml_daemon::phase::Phase, f64)],
    steps: u32,
) -> &'static str {
    use traceml_daemon::phase::Phase;
    const MIN_STEPS: u32 = 5;
    const WARNING: f64 = 0.10;
    const COMPUTE: f64 = 0.90;
    if steps < MIN_STEPS {
        return "INSUFFICIENT_DATA";
    }
    let share = |p: Phase| -> f64 {
        shares
            .iter()
            .filter(|(q, _)| *q == p)
            .map(|(_, s)| *s)
            .sum()
    };
    let bottleneck = [
        (Phase::InputWait, "INPUT_BOUND"),
        (Phase::H2d, "H2D_BOUND"),
        (Phase::Residual, "RESIDUAL_HEAVY"),
    ]
    .into_iter()
    .map(|(p, kind)| (share(p), kind))
    .filter(|&(s, _)| s >= WARNING)
    .max_by(|a, b| a.0.total_cmp(&b.0));
    if let Some((_, kind)) = bottleneck {
        return kind;
    }
    let compute: f64 = [
        Phase::Forward,
        Phase::Backward,
        Phase::Optimizer,
        Phase::GpuWait,
    ]
    .into_iter()
    .map(share)
    .sum();
    if compute >= COMPUTE {
        "COMPUTE_BOUND"
    } else {
        "BALANCED"
    }
}

/// The verdicts the published rules ([`published_verdict`]) give for shares within `margin` of
/// the truth's: each
/// bottleneck phase (input_wait, h2d, residual) and the compute sum moved by −margin, 0 or
/// +margin. One verdict when the run sits clear of every line, two (or more) near one.
pub fn verdicts_near_by(
    margin: f64,
    shares: &[(traceml_daemon::phase::Phase, f64)],
    steps: u32,
) -> std::collections::BTreeSet<&'static str> {
    use traceml_daemon::phase::Phase;
    // The published table's phases (see [`published_verdict`]).
    const BOTTLENECK_PHASES: [Phase; 3] = [Phase::InputWait, Phase::H2d, Phase::Residual];
    const COMPUTE_PHASES: [Phase; 4] = [
        Phase::Forward,
        Phase::Backward,
        Phase::Optimizer,
        Phase::GpuWait,
    ];
    let share = |p: Phase| {
        shares
            .iter()
            .find(|(q, _)| *q == p)
            .map_or(0.0, |(_, s)| *s)
    };
    let compute: f64 = COMPUTE_PHASES.iter().map(|&p| share(p)).sum();
    let mut quantities: Vec<(Phase, f64)> =
        BOTTLENECK_PHASES.iter().map(|&p| (p, share(p))).collect();
    // The compute sum rides on one compute phase: the rules only add them up.
    quantities.push((COMPUTE_PHASES[0], compute));
    let mut out = std::collections::BTreeSet::new();
    let n = quantities.len() as u32;
    for combo in 0..3u32.pow(n) {
        let moved: Vec<(Phase, f64)> = quantities
            .iter()
            .enumerate()
            .map(|(i, &(p, v))| {
                let step = (combo / 3u32.pow(i as u32)) % 3;
                (p, (v + (f64::from(step) - 1.0) * margin).max(0.0))
            })
            .collect();
        out.insert(published_verdict(&moved, steps));
    }
    out
}

/// Polls `f` until it holds; fails the test with `what` past `timeout`.
pub fn wait_for(what: &str, timeout: Duration, f: impl FnMut() -> bool) {
    wait_for_else(what, timeout, f, String::new);
}

/// [`wait_for`], and the failure says what `why` finds then (a log, the kernel's stacks).
pub fn wait_for_else(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> bool,
    why: impl FnOnce() -> String,
) {
    let t = Instant::now();
    while !f() {
        if t.elapsed() >= timeout {
            panic!("timed out waiting for {what}\n{}", why());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Each thread of `pid`: its name, state and kernel stack (`/proc/<pid>/task/*/stack`, root
/// only): where a process waits in the kernel, for a test's failure message.
pub fn kernel_stacks(pid: u32) -> String {
    let mut out = String::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return format!("pid {pid}: gone\n");
    };
    for t in tasks.flatten() {
        let dir = t.path();
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
        let state = read("stat")
            .rsplit_once(") ")
            .map_or(String::new(), |(_, r)| r.chars().take(1).collect());
        out += &format!(
            "thread {} ({}) {state}\n{}",
            t.file_name().to_string_lossy(),
            read("comm").trim(),
            read("stack")
        );
    }
    out
}

/// The job directory `serve` made for `pid` under its state directory (`<comm>-<pid>-<start>`).
pub fn job_dir(state: &Path, pid: u32) -> Option<PathBuf> {
    std::fs::read_dir(state)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.contains(&format!("-{pid}-")))
        })
}

/// A child process killed (SIGKILL) and reaped when dropped: a test that fails half-way leaves
/// nothing running.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `traceml-daemon serve`, run by `cmd` (the daemon, or a wrapper such as `setpriv` that runs
/// it), its state in `state`, with `args`, logging (`RUST_LOG=info`) to the file `log` or else
/// to the test's stderr: started, and ready (its `--ready-file` made, within 10 s).
pub fn serve_until_ready(
    mut cmd: Command,
    state: &Path,
    ready: &Path,
    args: &[&str],
    log: Option<&Path>,
) -> Proc {
    let stderr = log.map_or_else(Stdio::inherit, |l| {
        Stdio::from(std::fs::File::create(l).unwrap())
    });
    cmd.arg("serve")
        .arg("--state-dir")
        .arg(state)
        .arg("--ready-file")
        .arg(ready)
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(stderr);
    let serve = Proc(cmd.spawn().expect("start serve"));
    wait_for("serve's ready file", Duration::from_secs(10), || {
        ready.exists()
    });
    serve
}

/// SIGTERM to `serve`: it must exit 0 within `budget` (10 s: the service's promise).
pub fn stop_serve(serve: &mut Proc, budget: Duration) {
    // SAFETY: kill(2) of our own child.
    unsafe { libc::kill(serve.0.id() as i32, libc::SIGTERM) };
    let t = Instant::now();
    let status = loop {
        if let Some(st) = serve.0.try_wait().unwrap() {
            break st;
        }
        assert!(t.elapsed() < budget, "serve still running after {budget:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "serve exited with {status}");
}

/// A TCP port free on 127.0.0.1 now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// `127.0.0.1:<a free port>` ([`free_port`]).
pub fn free_addr() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], free_port()))
}

/// `GET path` (HTTP/1.0: the answer is the rest of the connection): status and body.
pub fn get(addr: std::net::SocketAddr, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// The torch venv's interpreter (`TRACEML_TORCH_PYTHON`, set by `cargo xtask test` once
/// `cargo xtask setup --torch` built it). The real-PyTorch tests are `#[ignore]`d: `cargo xtask
/// test` runs them (`--include-ignored`), `--no-torch` leaves them reported as ignored, never as
/// passed. Run without the variable, a test fails.
pub fn torch_python() -> PathBuf {
    std::env::var_os("TRACEML_TORCH_PYTHON").map(PathBuf::from).expect(
        "TRACEML_TORCH_PYTHON is not set: run through `cargo xtask test` (setup builds the torch venv)",
    )
}

/// The torch venv's `torchrun`, beside [`torch_python`].
pub fn torchrun() -> PathBuf {
    torch_python().parent().unwrap().join("torchrun")
}

/// A real-PyTorch workload of `tests/workloads/frameworks` run under the daemon, with its truth.
pub struct TruthRun {
    pub summary: serde_json::Value,
    pub truth: serde_json::Value,
    /// The daemon's card (its stdout).
    pub card: String,
    /// The daemon's recording.
    pub items: Vec<StreamItem>,
}

/// Runs `tests/workloads/frameworks/<workload>.py args --truth FILE` and the daemon on it,
/// attached after the workload's start line (as [`spawn`] and [`run_daemon`] do), until the
/// workload exits. `None` when the test is skipped (no root, see [`root_or_skip`]). Fails the test when the daemon fails or the
/// workload wrote no truth.
pub fn run_framework_workload(workload: &str, args: &[&str], label: &str) -> Option<TruthRun> {
    if !root_or_skip() {
        return None;
    }
    let py = torch_python();
    let dir = scratch(label);
    let truth_path = dir.join("truth.json");
    let mut cmd = Command::new(py);
    cmd.arg(workspace().join(format!("tests/workloads/frameworks/{workload}.py")))
        .args(args)
        .arg("--truth")
        .arg(&truth_path);
    let mut target = spawn(cmd, &dir);
    let out = run_daemon(&mut target, &dir, &[], Duration::from_secs(300));
    assert!(
        out.status.success(),
        "{label}: daemon failed: {}",
        out.stderr
    );
    let text = std::fs::read_to_string(&truth_path).unwrap_or_else(|e| {
        panic!(
            "{label}: truth {}: {e} (the workload ended before writing it)\nworkload stdout:\n{}\n\
             daemon stderr:\n{}",
            truth_path.display(),
            out.target_stdout.join("\n"),
            out.stderr
        )
    });
    let truth = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{label}: truth: {e}"));
    Some(TruthRun {
        summary: out.summary,
        truth,
        card: out.stdout,
        items: out.items,
    })
}

/// When every probe of the attach was in place (CLOCK_MONOTONIC ns): the recording's first
/// probe set, written before any event. Between [`attach_ns`] and this instant the libraries
/// are probed one after another (up to a second on a loaded machine).
pub fn probes_in_ns(items: &[StreamItem]) -> Option<u64> {
    items.iter().find_map(|i| match i {
        StreamItem::ProbeSet(p) => Some(p.ts),
        _ => None,
    })
}

/// The daemon's attach instant (CLOCK_MONOTONIC ns) from the recording's target record.
pub fn attach_ns(items: &[StreamItem]) -> Option<u64> {
    items.iter().find_map(|i| match i {
        StreamItem::Target(t) => Some(t.attach_ts_ns),
        _ => None,
    })
}

/// When the daemon's learning probe set ran (the frame-evaluator probe armed to learn the loop,
/// not kept as part of the steady set, or only the markers placed while it watched for
/// training), from the recording's probe-set changes:
/// `(from, to)` in CLOCK_MONOTONIC ns, `to` `None` while it ran to the end. The engine marks
/// the steps that overlap one `learning` and leaves them out of the shares
/// (`steps.learning_excluded`).
pub fn learning_spans(items: &[StreamItem]) -> Vec<(u64, Option<u64>)> {
    let mut sets: Vec<(u64, bool)> = items
        .iter()
        .filter_map(|i| match i {
            StreamItem::ProbeSet(p) => Some((p.ts, (p.python && !p.python_steady) || p.watching)),
            _ => None,
        })
        .collect();
    sets.sort_by_key(|&(ts, _)| ts);
    let mut out: Vec<(u64, Option<u64>)> = Vec::new();
    for (ts, learning) in sets {
        match out.last_mut() {
            Some((_, end @ None)) if !learning => *end = Some(ts),
            Some((_, None)) => {}
            _ if learning => out.push((ts, None)),
            _ => {}
        }
    }
    out
}

/// The truth's steps (tests/README.md's per-step `t_start_ns`/`t_end_ns`) over the span of the
/// run the daemon measured, chosen by time rather than by count, so that a daemon that splits
/// or merges steps is still compared over the same part of the run.
pub struct TruthView<'a> {
    /// The steps that started at or after the daemon's attach instant ([`attach_ns`]; its probes
    /// are placed in the second after it): every step of a workload that waited for the daemon's
    /// ready file; the comparison for `steps.count`.
    pub seen: Vec<&'a serde_json::Value>,
    /// Those of them the daemon's shares cover: when the summary left its learning steps out
    /// (`steps.learning_excluded` > 0), the steps that overlap no [`learning_spans`] span (all
    /// of `seen` when none is left).
    pub shared: Vec<&'a serde_json::Value>,
}

/// [`TruthView`] of a truth file for the daemon run that produced `summary` and `items`.
pub fn truth_view<'a>(
    truth: &'a serde_json::Value,
    summary: &serde_json::Value,
    items: &[StreamItem],
) -> TruthView<'a> {
    let attach = attach_ns(items).unwrap_or(0);
    let seen: Vec<&serde_json::Value> = truth["steps"]
        .as_array()
        .map(|v| {
            v.iter()
                .filter(|s| s["t_start_ns"].as_u64().is_some_and(|t| t >= attach))
                .collect()
        })
        .unwrap_or_default();
    let excluded = summary["steps"]["learning_excluded"].as_u64().unwrap_or(0);
    let spans = learning_spans(items);
    let steady: Vec<&serde_json::Value> = seen
        .iter()
        .copied()
        .filter(|s| {
            let (a, b) = (
                s["t_start_ns"].as_u64().unwrap_or(0),
                s["t_end_ns"].as_u64().unwrap_or(u64::MAX),
            );
            !spans
                .iter()
                .any(|&(from, to)| from < b && to.is_none_or(|to| to > a))
        })
        .collect();
    let shared = if excluded > 0 && !steady.is_empty() {
        steady
    } else {
        seen.clone()
    };
    TruthView { seen, shared }
}

/// Each phase's total over these truth steps' total wall time, as the summary computes
/// `phases.<p>.share` (0 for a phase the truth does not have).
pub fn truth_shares_of(steps: &[&serde_json::Value]) -> Vec<(traceml_daemon::phase::Phase, f64)> {
    use traceml_daemon::phase::Phase;
    let wall: f64 = steps.iter().filter_map(|s| s["wall_ns"].as_f64()).sum();
    Phase::ALL
        .iter()
        .map(|&p| {
            let ns = steps
                .iter()
                .filter_map(|s| s["phases_ns"][p.name()].as_f64())
                .fold(0.0, |a, b| a + b);
            (p, if wall > 0.0 { ns / wall } else { 0.0 })
        })
        .collect()
}

/// `CLOCK_MONOTONIC` now, ns: the workloads' clock (their progress logs and truth files).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A JSON file (a summary, a truth file), or a panic naming it.
pub fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(
        &std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The median of `xs` (the mean of the middle two for an even count; NaN when empty): the crate's
/// own `stats::median`.
pub fn median(xs: Vec<f64>) -> f64 {
    traceml_daemon::stats::median(&xs).unwrap_or(f64::NAN)
}

/// The STRAGGLER rule's published lines (docs/metrics.md, the alert table; the daemon's own rule
/// is the same, `scenarios::the_rules_are_the_published_table` checks it): the slowest rank's
/// own work per step exceeds the others' median by at least this share of the job's median step
/// ...
pub const PUBLISHED_STRAGGLER_SCORE: f64 = 0.10;
/// ... and it was the slowest in at least this share of the aligned steps.
pub const PUBLISHED_STRAGGLER_PERSISTENCE: f64 = 0.60;

/// What a multi-rank job's own truth says of a straggler, by the daemon's measure
/// (`ranks::straggler`): each rank's own work per step (its step less its collective wait; the
/// DDP estimate where the wait is inside backward), the last steps every rank has aligned, the
/// culprit the rank with the largest median own work, its score how far that median exceeds the
/// other ranks' median as a share of the median step, its persistence how often it was the
/// slowest.
#[derive(Debug)]
pub struct TruthStraggler {
    pub culprit: u32,
    pub score: f64,
    pub persistence: f64,
    /// Each rank's median own work per step, ms.
    pub own_ms: Vec<f64>,
}

/// What a test requires of a straggler verdict, by the truth ([`TruthStraggler::expect`]).
#[derive(Debug, PartialEq)]
pub enum Expect {
    Straggler(u32),
    NoStraggler,
    /// The truth sits within the margins of a line.
    Either,
}

/// [`TruthStraggler`] of the `n` ranks' truth files (`truth-rank<r>.json` in `dir`, written by
/// tests/workloads/ddp/ddp_train.py).
pub fn truth_straggler(dir: &Path, n: u32) -> TruthStraggler {
    let steps: Vec<Vec<(f64, f64)>> = (0..n)
        .map(|r| {
            let t = json(&dir.join(format!("truth-rank{r}.json")));
            t["steps"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| {
                    let wall = s["wall_ns"].as_f64().unwrap() / 1e6;
                    let own = s["own_work_ns"].as_f64().map_or(wall, |v| v / 1e6);
                    (wall, own)
                })
                .collect()
        })
        .collect();
    let len = steps.iter().map(Vec::len).min().unwrap_or(0);
    let tail = |r: usize| &steps[r][steps[r].len() - len..];
    let own_ms: Vec<f64> = (0..n as usize)
        .map(|r| median(tail(r).iter().map(|x| x.1).collect()))
        .collect();
    let step = median(
        (0..n as usize)
            .flat_map(|r| tail(r).iter().map(|x| x.0))
            .collect(),
    );
    let culprit = (0..n as usize)
        .max_by(|&a, &b| own_ms[a].total_cmp(&own_ms[b]))
        .unwrap();
    let others = median(
        (0..n as usize)
            .filter(|&r| r != culprit)
            .map(|r| own_ms[r])
            .collect(),
    );
    let led = (0..len)
        .filter(|&k| {
            (0..n as usize).max_by(|&a, &b| tail(a)[k].1.total_cmp(&tail(b)[k].1)) == Some(culprit)
        })
        .count();
    TruthStraggler {
        culprit: culprit as u32,
        score: (own_ms[culprit] - others) / step,
        persistence: led as f64 / len.max(1) as f64,
        own_ms,
    }
}

impl TruthStraggler {
    /// The verdict the published lines ([`PUBLISHED_STRAGGLER_SCORE`],
    /// [`PUBLISHED_STRAGGLER_PERSISTENCE`]) require of this truth: a straggler when it is over
    /// both by the margins, none when it is under either by its margin, else either.
    pub fn expect(&self, score_margin: f64, persistence_margin: f64) -> Expect {
        if self.score >= PUBLISHED_STRAGGLER_SCORE + score_margin
            && self.persistence >= PUBLISHED_STRAGGLER_PERSISTENCE + persistence_margin
        {
            Expect::Straggler(self.culprit)
        } else if self.score < PUBLISHED_STRAGGLER_SCORE - score_margin
            || self.persistence < PUBLISHED_STRAGGLER_PERSISTENCE - persistence_margin
        {
            Expect::NoStraggler
        } else {
            Expect::Either
        }
    }
}

/// Debian's Prometheus server.
pub const PROMETHEUS: &str = "/usr/bin/prometheus";

/// A Prometheus server on a free port of 127.0.0.1 ([`free_addr`]), its data in `dir`, scraping
/// `targets` every second with the scrape config of the README's fleet recipe (`honor_labels`),
/// evaluating `rules` (a rules file) every second when given: the server (killed on drop) and
/// its address, for [`prom_query`]. It answers once it has started (`/-/ready`).
pub fn start_prometheus(
    dir: &Path,
    targets: &[std::net::SocketAddr],
    rules: Option<&Path>,
) -> (Proc, std::net::SocketAddr) {
    let addr = free_addr();
    let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
    let rule_files = rules
        .map(|r| format!("rule_files: ['{}']\n", r.display()))
        .unwrap_or_default();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n{rule_files}\
             scrape_configs:\n  - job_name: traceml\n    honor_labels: true\n    \
             scrape_interval: 1s\n    scrape_timeout: 1s\n    static_configs:\n      \
             - targets: [{}]\n",
            targets.join(", ")
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let server = Proc(
        Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus"),
    );
    (server, addr)
}

/// `s` percent-encoded for a URL's query string (all but RFC 3986's unreserved characters).
pub fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Why a Prometheus query gave no series.
#[derive(Debug)]
pub enum PromError {
    /// No answer, or one that is not JSON: Prometheus is not up (or not ready) yet.
    Unready(String),
    /// Prometheus's own error: an invalid query.
    Refused(String),
}

impl std::fmt::Display for PromError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PromError::Unready(e) | PromError::Refused(e) => f.write_str(e),
        }
    }
}

/// An instant query of the Prometheus at `prom` (its HTTP API): `(labels, value)` of each
/// series.
pub fn prom_query(
    prom: std::net::SocketAddr,
    q: &str,
) -> Result<Vec<(serde_json::Value, f64)>, PromError> {
    let (status, body) = get(prom, &format!("/api/v1/query?query={}", url_encode(q)))
        .ok_or_else(|| PromError::Unready(format!("no answer from Prometheus to {q}")))?;
    let v: serde_json::Value = serde_json::from_str(&body)
        .map_err(|e| PromError::Unready(format!("{status}: {e}: {body}")))?;
    if v["status"] != "success" {
        return Err(PromError::Refused(format!("{q}: {status} {body}")));
    }
    Ok(v["data"]["result"]
        .as_array()
        .map(|r| {
            r.iter()
                .map(|s| {
                    let x = s["value"][1].as_str().unwrap_or("NaN").parse().unwrap();
                    (s["metric"].clone(), x)
                })
                .collect()
        })
        .unwrap_or_default())
}
