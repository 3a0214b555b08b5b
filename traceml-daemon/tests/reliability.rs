//! Root tests of reliability and safety (issue 7): the target never suffers (the daemon killed
//! with SIGKILL mid-run), every way a run can end leaves a valid summary that says how it ended
//! (target exit, exec, SIGINT, SIGTERM), threads and forks of the target are handled, ring-buffer
//! loss is counted exactly and lowers the verdict's confidence, bad input files and unwritable
//! outputs get one clear sentence, and two daemons can profile one target. (Bad input files and
//! the fuzz corpus, which need no root, are in tests/files.rs.)
//!
//! Ground truth comes from the workloads in tests/workloads/reliability/ (exact call counts and a
//! checksum the test recomputes). Nothing here asserts a duration: waits are for files, lines and
//! exits, with generous timeouts only to turn a hang into a failure.
mod support;

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use support::*;
use traceml_daemon::event::{Api, EndReason, Kind, Lost, StreamItem};
use traceml_daemon::summary::{Confidence, Summary};

const TIMEOUT: Duration = Duration::from_secs(120);

fn lifecycle(mode: &str) -> Command {
    let mut cmd = Command::new(python(12));
    cmd.arg(workspace().join("tests/workloads/reliability/lifecycle.py"))
        .arg(mode)
        .arg("--lib")
        .arg(fake_cudart());
    cmd
}

/// The target's stdout lines after its first one, read on a thread so a hung target fails the
/// test instead of hanging it.
struct Lines(mpsc::Receiver<String>);

impl Lines {
    fn of(target: &mut Target) -> Lines {
        let out = target.stdout.take().expect("stdout not taken yet");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines(rx)
    }

    /// The next line that holds `key`, parsed.
    fn next_with(&self, key: &str) -> serde_json::Value {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .0
                .recv_timeout(left)
                .unwrap_or_else(|e| panic!("no line with {key:?} from the target: {e}"));
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line)
                && let Some(x) = v.get(key)
            {
                return x.clone();
            }
        }
    }
}

/// A daemon started in the background on a target.
struct Daemon {
    child: Option<Child>,
    ready: PathBuf,
    recording: PathBuf,
    out_dir: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// What a finished daemon left.
struct Finished {
    code: Option<i32>,
    stderr: String,
    items: Vec<StreamItem>,
    summary_text: String,
    summary: Summary,
}

impl Daemon {
    fn start(pid: u32, dir: &Path, name: &str, extra: &[&str]) -> Daemon {
        Self::start_logging(pid, dir, name, extra, "info")
    }

    /// [`Daemon::start`] with its log at `log` (`TRACEML_LOG`).
    fn start_logging(pid: u32, dir: &Path, name: &str, extra: &[&str], log: &str) -> Daemon {
        let mut d = Daemon {
            child: None,
            ready: dir.join(format!("{name}.ready")),
            recording: dir.join(format!("{name}.jsonl")),
            out_dir: dir.join(format!("{name}-out")),
        };
        d.child = Some(
            Self::command(pid, &d, extra)
                .env("TRACEML_LOG", log)
                .spawn()
                .expect("start traceml-daemon"),
        );
        d
    }

    /// The workloads here do not train (no DataLoader, optimizer or backward): every probe
    /// from the attach on (`--probe-set full`) unless `extra` chooses, so that their exact
    /// counts are seen (the default set would watch them with torch's markers only).
    fn command(pid: u32, d: &Daemon, extra: &[&str]) -> Command {
        let mut cmd = Command::new(daemon());
        if !extra.contains(&"--probe-set") {
            cmd.args(["--probe-set", "full"]);
        }
        cmd.arg("--pid")
            .arg(pid.to_string())
            .arg("--ready-file")
            .arg(&d.ready)
            .arg("--record")
            .arg(&d.recording)
            .arg("--output")
            .arg(&d.out_dir)
            .args(["--color", "never", "--quiet"])
            .args(extra)
            .env("TRACEML_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        cmd
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Waits until the daemon has attached (its ready file exists); `false` if it exited first.
    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if self.ready.exists() {
                return true;
            }
            if self.child.as_mut().unwrap().try_wait().unwrap().is_some() {
                return self.ready.exists();
            }
            assert!(
                Instant::now() < deadline,
                "the daemon neither attached nor exited"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(
            unsafe { libc::kill(self.pid() as libc::pid_t, sig) },
            0,
            "kill({sig})"
        );
    }

    /// Waits for the daemon to exit and reads what it wrote; the summary must parse.
    fn finish(&mut self) -> Finished {
        let out = wait_with_timeout(self.child.take().unwrap(), TIMEOUT);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            !stderr.contains("panicked"),
            "the daemon panicked:\n{stderr}"
        );
        let items = traceml_daemon::record::read(&self.recording)
            .map(|r| r.items)
            .unwrap_or_default();
        let summary_text = std::fs::read_to_string(self.out_dir.join("final_summary.json"))
            .unwrap_or_else(|e| panic!("no final_summary.json ({e}); daemon stderr:\n{stderr}"));
        let summary = Summary::from_json(&summary_text)
            .unwrap_or_else(|e| panic!("final_summary.json does not parse: {e}"));
        Finished {
            code: out.status.code(),
            stderr,
            items,
            summary_text,
            summary,
        }
    }
}

fn touch(p: &Path) {
    std::fs::write(p, b"").unwrap();
}

/// The value of one batch of `lifecycle.py` and the checksum of batches 1..=n.
fn checksum(n: u64) -> u64 {
    (1..=n).fold(0, |t, i| (t + (i * i + 3 * i) % 1_000_003) % 1_000_000_007)
}

/// Probe events of process `pid`, counted the way the workloads count their calls.
#[derive(Debug, Default)]
struct Counts {
    launches_by_tid: BTreeMap<u32, u64>,
    /// Driver launch events whose caller was the runtime (its own driver call: one launch).
    nested_launches: u64,
    next_enter: u64,
    next_raised: u64,
    memcpy: u64,
    other_tgids: BTreeMap<u32, u64>,
}

impl Counts {
    fn launches(&self) -> u64 {
        self.launches_by_tid.values().sum()
    }
}

fn count(items: &[StreamItem], pid: u32) -> Counts {
    let next = code_ptrs(items, "__next__", "torch/utils/data/dataloader.py");
    let mut c = Counts::default();
    for e in events(items) {
        if e.tgid != pid {
            *c.other_tgids.entry(e.tgid).or_default() += 1;
            continue;
        }
        match &e.kind {
            Kind::PyEnter { code, .. } if next.contains(code) => c.next_enter += 1,
            Kind::PyExit { code, raised: true } if next.contains(code) => c.next_raised += 1,
            Kind::Launch {
                api: Api::CudaLaunchKernel,
                ..
            } => *c.launches_by_tid.entry(e.tid).or_default() += 1,
            Kind::Launch {
                api: Api::CuLaunchKernel,
                path: Some(traceml_daemon::event::LaunchPath::Nested),
            } => c.nested_launches += 1,
            Kind::CallEnter {
                api: Api::CudaMemcpy,
                ..
            } => c.memcpy += 1,
            _ => {}
        }
    }
    c
}

fn end_item(items: &[StreamItem]) -> Option<EndReason> {
    items.iter().rev().find_map(|i| match i {
        StreamItem::End(e) => Some(e.reason),
        _ => None,
    })
}

/// The recording's last count of lost events (its `Lost` item), which must be there.
fn last_lost(items: &[StreamItem]) -> Lost {
    items
        .iter()
        .rev()
        .find_map(|i| match i {
            StreamItem::Lost(l) => Some(l.clone()),
            _ => None,
        })
        .expect("a Lost item")
}

/// `replay` of the daemon's recording (into `out`) exits 0 and rebuilds the summary it wrote
/// byte for byte: the summary is complete.
fn replay_rebuilds(d: &Daemon, f: &Finished, out: &Path) {
    let (code, stderr, replayed) = replay(&d.recording, out);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        replayed.unwrap(),
        f.summary_text,
        "the summary is complete: replay rebuilds it"
    );
}

/// Ids of the eBPF programs process `pid` holds open (from /proc/<pid>/fdinfo).
fn bpf_prog_ids(pid: u32) -> Vec<u32> {
    let mut ids = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .unwrap()
        .flatten()
    {
        let info = std::fs::read_to_string(e.path()).unwrap_or_default();
        if let Some(id) = info.lines().find_map(|l| l.strip_prefix("prog_id:")) {
            ids.push(id.trim().parse().unwrap());
        }
    }
    ids.sort();
    ids.dedup();
    ids
}

fn loaded_prog_ids() -> Vec<u32> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .map(|p| p.id())
        .collect()
}

// ------------------------------------------------------------------------------- 1. SIGKILL

/// kill -9 the daemon while the target is hitting its probes: the target keeps running, every
/// device round trip stays intact, its checksum is right, and the daemon's programs (and with them
/// the uprobes) are gone from the kernel. The cut recording still replays, marked truncated.
#[test]
fn sigkill_of_the_daemon_leaves_the_target_running_correctly() {
    if !root_or_skip() {
        return;
    }
    let dir = scratch("kill9");
    let mut cmd = lifecycle("steady");
    cmd.arg("--stop")
        .arg(dir.join("stop"))
        .arg("--after")
        .arg(dir.join("killed"));
    cmd.args(["--warm", "30", "--tail", "300"]);
    let (mut target, pid, lines, mut d) = attached(cmd, &dir, &[]);
    lines.next_with("running");
    let progs = bpf_prog_ids(d.pid());
    assert!(!progs.is_empty(), "the attached daemon holds eBPF programs");
    d.signal(libc::SIGKILL);
    let out = wait_with_timeout(d.child.take().unwrap(), TIMEOUT);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(libc::SIGKILL)
    );
    touch(&dir.join("killed"));

    let truth = lines.next_with("truth");
    let status = target.child.wait().unwrap();
    assert!(
        status.success(),
        "the target must finish normally: {status}"
    );
    let batches = truth["batches"].as_u64().unwrap();
    assert!(
        batches >= 30 + 300,
        "the target ran on after the kill: {truth}"
    );
    assert_eq!(
        truth["checksum"].as_u64().unwrap(),
        checksum(batches),
        "the target computed correctly"
    );

    // Closing the daemon's fds released its programs (freed asynchronously: poll).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let loaded = loaded_prog_ids();
        let left: Vec<u32> = progs
            .iter()
            .copied()
            .filter(|p| loaded.contains(p))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "programs {left:?} of the killed daemon are still loaded"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // The recording was cut: it still replays, and says the run has no end.
    let rec = traceml_daemon::record::read(&d.recording).expect("a cut recording is readable");
    assert_eq!(end_item(&rec.items), None, "no end item after SIGKILL");
    let seen = count(&rec.items, pid).launches();
    assert!(
        seen <= truth["launch"].as_u64().unwrap(),
        "never more launches than made: {seen}"
    );
    let (code, stderr, summary) = replay(&d.recording, &dir.join("replayed"));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("no end record"), "{stderr}");
    let s = Summary::from_json(&summary.unwrap()).unwrap();
    assert_eq!(s.data_quality.end_reason, EndReason::Truncated);
}

/// Waits for the daemon's ready file, then creates the workload's (the harness passes its own
/// `--ready` to the workload).
fn wait_ready_as(d: &mut Daemon, workload_ready: &Path) {
    assert!(d.wait_ready(), "the daemon exited before attaching");
    touch(workload_ready);
}

/// Starts the workload `cmd` (see [`spawn`]) and one daemon on it (`d`, with `extra`), and lets
/// the workload run once the daemon has attached: the target, its pid, its stdout lines after
/// the first, and the daemon.
fn attached(cmd: Command, dir: &Path, extra: &[&str]) -> (Target, u32, Lines, Daemon) {
    attached_logging(cmd, dir, extra, "info")
}

/// [`attached`] with the daemon's log at `log` (`TRACEML_LOG`).
fn attached_logging(
    cmd: Command,
    dir: &Path,
    extra: &[&str],
    log: &str,
) -> (Target, u32, Lines, Daemon) {
    let mut target = spawn(cmd, dir);
    let pid = target.child.id();
    let lines = Lines::of(&mut target);
    let mut d = Daemon::start_logging(pid, dir, "d", extra, log);
    wait_ready_as(&mut d, &target.ready);
    (target, pid, lines, d)
}

/// The workload's truth line, then the daemon's end: it must exit 0.
fn truth_and_end(lines: &Lines, d: &mut Daemon) -> (serde_json::Value, Finished) {
    let truth = lines.next_with("truth");
    let f = d.finish();
    assert_eq!(f.code, Some(0), "{}", f.stderr);
    (truth, f)
}

// ------------------------------------------------------------------------------ 2. lifecycle

/// The target exits: exact counts, end reason `target_exited`, exit 0, and the summary replays
/// identically from the recording.
#[test]
fn target_exit_ends_the_run_with_a_valid_summary() {
    if !root_or_skip() {
        return;
    }
    let dir = scratch("exit");
    let mut cmd = lifecycle("exit");
    cmd.args(["--iters", "40", "--launches", "3"]);
    let (mut target, pid, lines, mut d) = attached(cmd, &dir, &[]);
    let (truth, f) = truth_and_end(&lines, &mut d);
    assert!(target.child.wait().unwrap().success());
    assert_eq!(f.summary.data_quality.end_reason, EndReason::TargetExited);
    assert_eq!(end_item(&f.items), Some(EndReason::TargetExited));
    let end = f.summary.run.end.as_ref().expect("how the target ended");
    assert_eq!(end.exit_status, Some(0), "{end:?}");
    let c = count(&f.items, pid);
    assert_eq!(c.launches(), truth["launch"].as_u64().unwrap());
    assert_eq!(c.next_enter, truth["next_calls"].as_u64().unwrap());
    assert_eq!(c.next_raised, 1);
    assert_eq!(c.memcpy, truth["memcpy"].as_u64().unwrap());
    replay_rebuilds(&d, &f, &dir.join("replayed"));
}

/// The target execs /bin/sh: the daemon notices (the exec is marked in the event stream), ends
/// with `target_execed` and exit 0, and the summary holds exactly what happened before the exec. The
/// new image runs normally.
#[test]
fn target_exec_ends_the_run_with_what_came_before() {
    if !root_or_skip() {
        return;
    }
    let dir = scratch("exec");
    let mut cmd = lifecycle("exec");
    cmd.arg("--stop")
        .arg(dir.join("stop"))
        .args(["--iters", "30", "--launches", "2"]);
    let (mut target, pid, lines, mut d) = attached(cmd, &dir, &[]);
    let (truth, f) = truth_and_end(&lines, &mut d);
    assert_eq!(
        f.summary.data_quality.end_reason,
        EndReason::TargetExeced,
        "{}",
        f.stderr
    );
    assert_eq!(end_item(&f.items), Some(EndReason::TargetExeced));
    // The kernel marks the exec in the stream (sched_process_exec), once, after everything the
    // old program did.
    let execs: Vec<u64> = events(&f.items)
        .filter(|e| e.tgid == pid && e.kind == Kind::Exec)
        .map(|e| e.ts)
        .collect();
    assert_eq!(execs.len(), 1, "{execs:?}");
    let after: Vec<_> = events(&f.items)
        .filter(|e| e.tgid == pid && e.ts > execs[0])
        .collect();
    assert!(
        after.is_empty(),
        "/bin/sh maps no probed library: nothing after the exec: {after:?}"
    );
    assert_eq!(f.summary.data_quality.events_after_exec, 0);
    let program = f.summary.run.end.as_ref().and_then(|e| e.exec.clone());
    assert!(
        program.as_deref().is_some_and(|p| p.ends_with("sh")),
        "the exec'd program is named (/bin/sh or what it links to): {program:?}"
    );
    let card = std::fs::read_to_string(d.out_dir.join("final_summary.txt")).unwrap();
    let words = card.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(words.contains("ended: target exec'd"), "{card}");
    let c = count(&f.items, pid);
    assert_eq!(c.launches(), truth["launch"].as_u64().unwrap());
    assert_eq!(c.next_enter, truth["next_calls"].as_u64().unwrap());
    assert_eq!(c.memcpy, truth["memcpy"].as_u64().unwrap());
    touch(&dir.join("stop"));
    assert_eq!(lines.next_with("execed"), 1, "the exec'd program ran");
    assert!(target.child.wait().unwrap().success());
}

/// Runs `lifecycle.py exit` with `extra` arguments (through `sh -c` when `via_shell`: then the
/// target is not the test's child, and its parent reaps it the moment it exits); returns what
/// the daemon left and the card it wrote.
fn ended(name: &str, extra: &[&str], via_shell: bool) -> (Finished, String) {
    let dir = scratch(name);
    let py = lifecycle("exit");
    let mut cmd = if via_shell {
        let mut sh = Command::new("/bin/sh");
        sh.args(["-c", "\"$@\"; echo reaped >&2", "sh"])
            .arg(py.get_program())
            .args(py.get_args());
        sh
    } else {
        py
    };
    cmd.args(["--iters", "10"]).args(extra);
    let mut target = spawn(cmd, &dir);
    let first: serde_json::Value = serde_json::from_str(&target.first_line).unwrap();
    let pid = first["pid"].as_u64().unwrap() as u32;
    let mut d = Daemon::start(pid, &dir, "d", &[]);
    wait_ready_as(&mut d, &target.ready);
    let f = d.finish();
    assert_eq!(f.code, Some(0), "{}", f.stderr);
    let _ = target.child.wait();
    let card = std::fs::read_to_string(d.out_dir.join("final_summary.txt")).unwrap();
    // Words as the card shows them, whatever the line breaks.
    (f, card.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// Each way a target ends is told apart: an exit status, a killing signal (and a core dump),
/// both in the summary and on the card.
#[test]
fn exit_status_and_killing_signal_are_reported() {
    if !root_or_skip() {
        return;
    }
    let (f, card) = ended("exit3", &["--code", "3"], false);
    assert_eq!(f.summary.data_quality.end_reason, EndReason::TargetExited);
    let end = f.summary.run.end.clone().unwrap();
    assert_eq!((end.exit_status, end.signal), (Some(3), None), "{end:?}");
    assert!(card.contains("ended: target exited, status 3"), "{card}");
    for (sig, name) in [(libc::SIGTERM, "SIGTERM"), (libc::SIGKILL, "SIGKILL")] {
        let (f, card) = ended(&format!("sig{sig}"), &["--signal", &sig.to_string()], false);
        assert_eq!(
            f.summary.data_quality.end_reason,
            EndReason::TargetKilled,
            "{}",
            f.stderr
        );
        let end = f.summary.run.end.clone().unwrap();
        assert_eq!(end.signal, Some(sig), "{end:?}");
        assert_eq!(end.signal_name.as_deref(), Some(name));
        assert_eq!(end.exit_status, None);
        assert!(
            card.contains(&format!("ended: target killed by {name}")),
            "{card}"
        );
    }
}

/// A target that is not the daemon's child, reaped by its own parent (a shell) the instant it
/// exits: no zombie to read, and still its status is known (the kernel's process events
/// connector, which this daemon subscribes to as root).
#[test]
fn the_status_of_a_target_reaped_by_its_parent_is_known() {
    if !root_or_skip() {
        return;
    }
    let (f, _) = ended("reaped", &["--code", "5"], true);
    let end = f.summary.run.end.clone().unwrap();
    assert_eq!(f.summary.data_quality.end_reason, EndReason::TargetExited);
    assert_eq!(end.exit_status, Some(5), "{end:?}\n{}", f.stderr);
    assert_eq!(end.source, "process events connector");
}

/// A target with a large address space exits: while the kernel tears its memory down its maps
/// read empty and its state is still `R`. That is an exit, not an exec (what plain HF Trainer
/// runs were reported as).
#[test]
fn a_large_target_exiting_is_not_an_exec() {
    if !root_or_skip() {
        return;
    }
    let (f, _) = ended("bigexit", &["--big-mib", "1536"], false);
    assert_eq!(
        f.summary.data_quality.end_reason,
        EndReason::TargetExited,
        "{}",
        f.stderr
    );
    assert_eq!(f.summary.run.end.clone().unwrap().exit_status, Some(0));
}

/// Threads started after attach, each ended before the next starts: every one of their launches
/// is counted, under its own thread id, and the main thread's too.
#[test]
fn threads_created_and_ended_after_attach_are_counted_exactly() {
    if !root_or_skip() {
        return;
    }
    let dir = scratch("threads");
    let mut cmd = lifecycle("threads");
    cmd.args([
        "--threads",
        "5",
        "--per-thread",
        "137",
        "--iters",
        "10",
        "--launches",
        "3",
    ]);
    let (_target, pid, lines, mut d) = attached(cmd, &dir, &[]);
    let (truth, f) = truth_and_end(&lines, &mut d);
    assert_eq!(f.summary.data_quality.end_reason, EndReason::TargetExited);
    let c = count(&f.items, pid);
    let mut expected = BTreeMap::new();
    expected.insert(
        truth["main_tid"].as_u64().unwrap() as u32,
        truth["main_launch"].as_u64().unwrap(),
    );
    for t in truth["thread_tids"].as_array().unwrap() {
        expected.insert(
            t.as_u64().unwrap() as u32,
            truth["per_thread"].as_u64().unwrap(),
        );
    }
    assert_eq!(
        expected.len(),
        6,
        "five new threads, distinct from the main one: {truth}"
    );
    assert_eq!(c.launches_by_tid, expected, "launches per thread id");
}

/// The target forks a child mid-run: the parent's calls before and after the fork are counted
/// exactly, the child runs correctly, and the daemon (attached by pid) reports nothing of it.
#[test]
fn a_forked_child_neither_suffers_nor_pollutes_the_counts() {
    if !root_or_skip() {
        return;
    }
    let dir = scratch("fork");
    let mut cmd = lifecycle("fork");
    cmd.args(["--iters", "20", "--launches", "3"]);
    let (mut target, pid, lines, mut d) = attached(cmd, &dir, &[]);
    let (truth, f) = truth_and_end(&lines, &mut d);
    assert!(target.child.wait().unwrap().success());
    assert_eq!(truth["child_status"], 0, "{truth}");
    assert_eq!(
        truth["child"]["checksum"].as_u64().unwrap(),
        checksum(20),
        "the child computed correctly"
    );
    assert_eq!(
        truth["checksum"].as_u64().unwrap(),
        2 * checksum(20) % 1_000_000_007
    );
    let c = count(&f.items, pid);
    assert_eq!(c.launches(), truth["launch"].as_u64().unwrap());
    assert_eq!(c.next_enter, truth["next_calls"].as_u64().unwrap());
    assert_eq!(c.next_raised, 2, "each phase's last __next__ raised");
    assert!(
        c.other_tgids.is_empty(),
        "events of other processes: {:?}",
        c.other_tgids
    );
    assert_eq!(f.summary.data_quality.end_reason, EndReason::TargetExited);
}

/// SIGINT or SIGTERM to the daemon mid-run: exit 0, end reason `interrupted`/`terminated`, a
/// summary that parses and that replay rebuilds byte for byte; the target runs on unharmed.
fn stopped_by(sig: libc::c_int, reason: EndReason, name: &str) {
    if !root_or_skip() {
        return;
    }
    let dir = scratch(name);
    let mut cmd = lifecycle("steady");
    cmd.arg("--stop")
        .arg(dir.join("stop"))
        .args(["--warm", "25"]);
    let (mut target, pid, lines, mut d) = attached(cmd, &dir, &[]);
    lines.next_with("running");
    d.signal(sig);
    let f = d.finish();
    assert_eq!(f.code, Some(0), "{}", f.stderr);
    assert_eq!(f.summary.data_quality.end_reason, reason);
    assert_eq!(end_item(&f.items), Some(reason));
    assert!(f.summary.data_quality.events_recorded > 0);
    replay_rebuilds(&d, &f, &dir.join("replayed"));
    let seen = count(&f.items, pid).launches();
    assert!(
        seen >= 25 * 3,
        "at least the warm-up launches were seen: {seen}"
    );

    touch(&dir.join("stop"));
    let truth = lines.next_with("truth");
    assert!(target.child.wait().unwrap().success());
    let batches = truth["batches"].as_u64().unwrap();
    assert_eq!(truth["checksum"].as_u64().unwrap(), checksum(batches));
    assert!(seen <= truth["launch"].as_u64().unwrap());
}

#[test]
fn sigint_writes_a_complete_summary() {
    stopped_by(libc::SIGINT, EndReason::Interrupted, "sigint");
}

#[test]
fn sigterm_writes_a_complete_summary() {
    stopped_by(libc::SIGTERM, EndReason::Terminated, "sigterm");
}

// ---------------------------------------------------------------------------------- 3. loss

/// Builds libflood.so from tests/workloads/reliability/flood.c.
fn flood_lib(dir: &Path) -> PathBuf {
    let out = dir.join("libflood.so");
    let src = workspace().join("tests/workloads/reliability/flood.c");
    let st = Command::new("gcc")
        .args([
            "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-pthread", "-o",
        ])
        .arg(&out)
        .arg(&src)
        .arg("-ldl")
        .status()
        .expect("gcc");
    assert!(st.success(), "building {}", src.display());
    out
}

/// A 1 MiB ring buffer (the smallest the CLI allows, about 12k events) against a million
/// launches from four C threads: the ring overruns, and the kernel's `ring_full` count plus the
/// launches delivered is exactly the number of calls. The summary reports the loss and the
/// verdict says its confidence is reduced.
#[test]
fn ring_buffer_overrun_is_counted_exactly_and_lowers_confidence() {
    if !root_or_skip() {
        return;
    }
    let dir = scratch("flood");
    let lib = flood_lib(&dir);
    let mut cmd = lifecycle("flood");
    cmd.arg("--flood-lib").arg(&lib).args([
        "--threads",
        "4",
        "--per-thread",
        "250000",
        "--settle",
        "1",
    ]);
    let (mut target, pid, lines, mut d) = attached(cmd, &dir, &["--ring-mib", "1"]);
    let (truth, f) = truth_and_end(&lines, &mut d);
    assert!(target.child.wait().unwrap().success());
    let calls = truth["launch"].as_u64().unwrap();
    assert_eq!(
        truth["ok"].as_u64(),
        Some(calls),
        "every launch succeeded: {truth}"
    );

    let lost = last_lost(&f.items);
    let c = count(&f.items, pid);
    let (delivered, nested) = (c.launches(), c.nested_launches);
    eprintln!(
        "flood: {calls} calls, {delivered} delivered (+ {nested} of the runtime's own driver calls), lost {lost:?}"
    );
    assert!(
        lost.ring_full > 0,
        "a 1 MiB ring must overrun under {calls} launches: {lost:?}"
    );
    // Each cudaLaunchKernel of the stand-in runtime calls the stand-in driver's (probed)
    // cuLaunchKernel, as the real runtime does: two events a call, the driver's `nested`.
    assert_eq!(
        delivered + nested + lost.ring_full,
        2 * calls,
        "delivered {delivered} + nested {nested} + ring_full {} = 2 × calls",
        lost.ring_full
    );
    assert_eq!(
        lost.seq_gaps, 0,
        "every sequence gap is explained by the kernel's counter: {lost:?}"
    );
    assert_eq!(lost.undecodable, 0);
    // The kernel says so too (aya-log, at warn: seen at the default level).
    assert!(
        f.stderr
            .contains("WARN traceml_daemon::ebpf: probe id 10: ring buffer full"),
        "{}",
        f.stderr
    );

    let q = &f.summary.data_quality;
    let reported = q.events_lost.as_ref().expect("data_quality.events_lost");
    assert_eq!(reported.ring_full, lost.ring_full);
    assert!(q.lost_ratio.unwrap() > 0.0);
    assert!(
        q.confidence < Confidence::High,
        "confidence must drop: {q:?}"
    );
    assert!(
        q.notes.iter().any(|n| n.contains("events lost")),
        "{:?}",
        q.notes
    );
    let p = &f.summary.primary_diagnosis;
    assert_eq!(p.confidence, q.confidence);
    assert!(
        p.why.contains("Confidence"),
        "the verdict says its confidence is reduced: {}",
        p.why
    );
}

/// The kernel's rare-path diagnostics reach the daemon's log through aya-log, rate-limited:
/// `deep.py` nests 100 tracked `__next__` calls, each entered from C, 50 times, so every entry
/// past the kernel's 64 per thread overflows the thread's stack of open calls. With
/// `TRACEML_LOG=debug` the daemon prints the kernel's line (which probe, what failed, pid and
/// tid), and only when a CPU's count of that loss reaches a power of two.
#[test]
fn an_overflowed_thread_stack_is_logged_from_the_kernel_rate_limited() {
    if !root_or_skip() {
        return;
    }
    let dir = scratch("deep");
    let mut cmd = Command::new(python(12));
    cmd.arg(workspace().join("tests/workloads/reliability/deep.py"))
        .args(["--depth", "100", "--rounds", "50"]);
    let (mut target, pid, lines, mut d) =
        attached_logging(cmd, &dir, &["--probe-set", "full"], "debug");
    let (truth, f) = truth_and_end(&lines, &mut d);
    assert!(target.child.wait().unwrap().success());
    assert_eq!(truth["next_calls"], 5000, "{truth}");

    let lost = last_lost(&f.items);
    // 36 of each round's 100 nested calls find the stack full: too deep to follow, not lost.
    assert!(lost.too_deep >= 50 * 36, "{lost:?}");
    assert_eq!(lost.total(), 0, "{lost:?}");
    let q = &f.summary.data_quality;
    assert_eq!(
        q.events_lost.as_ref().map(|l| l.too_deep),
        Some(lost.too_deep)
    );
    assert!(
        q.notes.iter().any(|n| n.starts_with(&format!(
            "{} calls deeper than the probes follow",
            lost.too_deep
        ))),
        "{:?}",
        q.notes
    );
    let logged: Vec<&str> = f
        .stderr
        .lines()
        .filter(|l| l.contains("per-thread stack of open calls full"))
        .collect();
    let first = logged
        .first()
        .unwrap_or_else(|| panic!("no kernel log line about the full stack:\n{}", f.stderr));
    assert!(
        first.contains("DEBUG traceml_daemon::ebpf")
            && first.contains("probe id 1:")
            && first.contains(&format!("(pid {pid} tid {pid})"))
            && first.ends_with("count on this CPU: 1"),
        "{first}"
    );
    // Rate-limited: per CPU, one line per power of two of its count.
    let cpus = std::thread::available_parallelism().unwrap().get() as u64;
    let per_cpu = u64::from(lost.too_deep.ilog2()) + 1;
    assert!(
        (logged.len() as u64) <= cpus * per_cpu,
        "{} lines for {} losses on {cpus} CPUs:\n{}",
        logged.len(),
        lost.too_deep,
        logged.join("\n")
    );
    for l in &logged {
        let n: u64 = l.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(n.is_power_of_two(), "{l}");
    }
}

// ----------------------------------------------------------------------------- 4. bad outputs

/// An output directory or recording that cannot be written is refused before attaching: one
/// sentence, exit 2, and no ready file (the daemon never attached).
#[test]
fn unwritable_outputs_are_refused_before_attaching() {
    if !root_or_skip() {
        return;
    }
    let dir = scratch("unwritable");
    let mut sleeper = Command::new(python(12))
        .args(["-c", "import time; time.sleep(60)"])
        .spawn()
        .unwrap();
    let pid = sleeper.id().to_string();
    let file = dir.join("a-file");
    touch(&file);
    let ready = dir.join("ready");
    let attach = |extra: &[&Path]| {
        let mut c = Command::new(daemon());
        c.args(["--pid", &pid, "--quiet", "--ready-file"])
            .arg(&ready);
        for (i, p) in extra.iter().enumerate() {
            c.arg(if i == 0 { "--output" } else { "--record" }).arg(p);
        }
        c
    };
    let under_file = file.join("out");
    let in_proc = Path::new("/proc/traceml-out");
    fails_clearly(
        &mut attach(&[&under_file]),
        2,
        "cannot write to output directory",
    );
    fails_clearly(
        &mut attach(&[in_proc]),
        2,
        "cannot write to output directory",
    );
    fails_clearly(
        &mut attach(&[&dir.join("ok"), &file.join("rec.jsonl")]),
        2,
        "cannot open recording",
    );
    fails_clearly(
        &mut attach(&[&dir.join("ok2"), Path::new("/proc/rec.jsonl")]),
        2,
        "cannot open recording",
    );
    let rec = dir.join("header-only.jsonl");
    std::fs::write(&rec, HEADER).unwrap();
    let mut replay_cmd = Command::new(daemon());
    replay_cmd
        .arg("replay")
        .arg(&rec)
        .arg("--output")
        .arg(&under_file)
        .arg("--quiet");
    let out = replay_cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("cannot write to output directory") && !err.contains("panicked"),
        "{err}"
    );
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert!(
        !ready.exists(),
        "the daemon must not attach when it cannot write its outputs"
    );
}

// ------------------------------------------------------------------------ 6. two daemons

/// Two daemons on one target at once both attach and both count the same phase exactly; after
/// both ended, a third attaches and counts the next phase exactly.
#[test]
fn two_daemons_at_once_and_a_second_attach_after_the_first() {
    if !root_or_skip() {
        return;
    }
    let dir = scratch("two");
    let (g1, g2) = (dir.join("gate1"), dir.join("gate2"));
    let mut cmd = lifecycle("phases");
    cmd.args(["--iters", "15", "--launches", "4", "--gates"])
        .arg(&g1)
        .arg(&g2);
    let mut target = spawn(cmd, &dir);
    let pid = target.child.id();
    let lines = Lines::of(&mut target);
    let mut a = Daemon::start(pid, &dir, "a", &[]);
    assert!(a.wait_ready(), "first daemon attaches");
    let mut b = Daemon::start(pid, &dir, "b", &[]);
    assert!(
        b.wait_ready(),
        "second daemon attaches while the first runs"
    );
    touch(&target.ready);
    touch(&g1);
    let t1 = lines.next_with("truth");
    a.signal(libc::SIGINT);
    b.signal(libc::SIGINT);
    for (name, d) in [("a", &mut a), ("b", &mut b)] {
        let f = d.finish();
        assert_eq!(f.code, Some(0), "{name}: {}", f.stderr);
        assert_eq!(f.summary.data_quality.end_reason, EndReason::Interrupted);
        let c = count(&f.items, pid);
        assert_eq!(
            c.launches(),
            t1["launch"].as_u64().unwrap(),
            "{name}: launches"
        );
        assert_eq!(
            c.next_enter,
            t1["next_calls"].as_u64().unwrap(),
            "{name}: __next__"
        );
        assert_eq!(c.memcpy, t1["memcpy"].as_u64().unwrap(), "{name}: memcpy");
    }

    let mut c3 = Daemon::start(pid, &dir, "c", &[]);
    assert!(c3.wait_ready(), "a later daemon attaches again");
    touch(&g2);
    let t2 = lines.next_with("truth");
    assert_eq!(t2["phase"], 1);
    let f = c3.finish();
    assert_eq!(f.code, Some(0), "{}", f.stderr);
    assert_eq!(f.summary.data_quality.end_reason, EndReason::TargetExited);
    assert!(target.child.wait().unwrap().success());
    let c = count(&f.items, pid);
    assert_eq!(
        c.launches(),
        t2["launch"].as_u64().unwrap(),
        "third daemon: launches"
    );
    assert_eq!(
        c.next_enter,
        t2["next_calls"].as_u64().unwrap(),
        "third daemon: __next__"
    );
    assert_eq!(c.next_raised, 1);
}
