//! Root tests of the foundation: real probes attached by pid to real CPython 3.9–3.13, the
//! stand-in CUDA runtime and the real libcudart from PyPI (loaded after attach), with exact
//! counts checked against what the workload says it did; replay equals live; bad targets get one
//! clear sentence and a non-zero exit. `probe_counts.py` does not train (no DataLoader, optimizer
//! or backward), so the exact counts run with `--probe-set full`: every probe from the attach on
//! (the default set would watch it with torch's markers only, see tests/bystander.rs).
mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::*;
use traceml_daemon::event::{Api, CopyKind, Kind, StreamItem};

/// What the workload says it did (its last stdout line).
fn truth(lines: &[String]) -> serde_json::Value {
    let last = lines
        .iter()
        .rev()
        .find(|l| l.contains("\"truth\""))
        .unwrap_or_else(|| panic!("no truth line in {lines:?}"));
    serde_json::from_str::<serde_json::Value>(last).unwrap()["truth"].clone()
}

#[derive(Debug, Default, PartialEq)]
struct Counts {
    next_enter: u64,
    next_raised: u64,
    enters: BTreeMap<String, u64>,
    exits: BTreeMap<String, u64>,
    launches: u64,
    h2d_bytes: Vec<u64>,
    d2h_bytes: Vec<u64>,
}

fn count(items: &[StreamItem], pid: u32) -> Counts {
    let next = code_ptrs(items, "__next__", "torch/utils/data/dataloader.py");
    assert_eq!(
        next.len(),
        1,
        "one __next__ code object expected, got {next:?}"
    );
    let mut c = Counts::default();
    for e in events(items).filter(|e| e.tgid == pid) {
        match &e.kind {
            Kind::PyEnter { code, .. } if *code == next[0] => c.next_enter += 1,
            Kind::PyExit { code, raised: true } if *code == next[0] => c.next_raised += 1,
            Kind::CallEnter {
                api, bytes, copy, ..
            } => {
                *c.enters.entry(format!("{api:?}")).or_default() += 1;
                // The stand-in runtime reaches the (probed) stand-in driver for its copies, as
                // the real one does: the runtime's calls are the workload's.
                if api.is_driver() {
                    continue;
                }
                match (copy, bytes) {
                    (Some(CopyKind::HostToDevice), Some(b)) => c.h2d_bytes.push(*b),
                    (Some(CopyKind::DeviceToHost), Some(b)) => c.d2h_bytes.push(*b),
                    _ => {}
                }
            }
            Kind::CallExit { api, .. } => *c.exits.entry(format!("{api:?}")).or_default() += 1,
            Kind::Launch {
                api: Api::CudaLaunchKernel,
                ..
            } => c.launches += 1,
            _ => {}
        }
    }
    c
}

fn check_counts(items: &[StreamItem], pid: u32, t: &serde_json::Value, ctx: &str) {
    let c = count(items, pid);
    let n = |k: &str| t[k].as_u64().unwrap();
    let bytes = n("bytes");
    assert_eq!(c.next_enter, n("next_calls"), "{ctx}: __next__ entries");
    assert_eq!(
        c.next_raised, 1,
        "{ctx}: exactly the last __next__ raised StopIteration"
    );
    assert_eq!(c.launches, n("launch"), "{ctx}: cudaLaunchKernel");
    let get = |m: &BTreeMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0);
    assert_eq!(
        get(&c.enters, "CudaMemcpy"),
        n("h2d"),
        "{ctx}: cudaMemcpy entries"
    );
    assert_eq!(
        get(&c.enters, "CudaMemcpyAsync"),
        n("d2h"),
        "{ctx}: cudaMemcpyAsync entries"
    );
    assert_eq!(
        get(&c.enters, "CudaStreamSynchronize"),
        n("stream_sync"),
        "{ctx}: stream syncs"
    );
    assert_eq!(
        get(&c.enters, "CudaDeviceSynchronize"),
        n("device_sync"),
        "{ctx}: device syncs"
    );
    assert_eq!(c.enters, c.exits, "{ctx}: every native call returned");
    assert_eq!(
        c.h2d_bytes,
        vec![bytes; n("h2d") as usize],
        "{ctx}: H2D kind and bytes from the arguments"
    );
    assert_eq!(
        c.d2h_bytes,
        vec![bytes; n("d2h") as usize],
        "{ctx}: D2H kind and bytes from the arguments"
    );
}

fn workload(py: &std::path::Path, lib: &std::path::Path) -> Command {
    let mut cmd = Command::new(py);
    cmd.arg(workspace().join("tests/workloads/probe_counts.py"))
        .arg("--lib")
        .arg(lib);
    cmd
}

/// Runs the workload `cmd` (see [`spawn`]) under the daemon with every probe (`--probe-set
/// full`, no card) until it exits (60 s at most): its pid and what the daemon left.
fn run_counted(cmd: Command, dir: &Path) -> (u32, Outcome) {
    let mut target = spawn(cmd, dir);
    let pid = target.child.id();
    let out = run_daemon(
        &mut target,
        dir,
        &["--quiet", "--probe-set", "full"],
        Duration::from_secs(60),
    );
    (pid, out)
}

#[test]
fn exact_counts_on_every_cpython_with_the_stand_in_runtime() {
    if !root_or_skip() {
        return;
    }
    let lib = fake_cudart();
    for minor in PYTHONS {
        let dir = scratch(&format!("counts-3{minor}"));
        let mut cmd = workload(&python(minor), &lib);
        cmd.args(["--iters", "25", "--launches", "4", "--bytes", "65536"]);
        let (pid, out) = run_counted(cmd, &dir);
        assert!(
            out.status.success(),
            "3.{minor}: daemon failed: {}",
            out.stderr
        );
        let t = truth(&out.target_stdout);
        check_counts(&out.items, pid, &t, &format!("CPython 3.{minor}"));
        let version = out.items.iter().find_map(|i| match i {
            StreamItem::Target(t) => t.python_version.clone(),
            _ => None,
        });
        assert!(
            version.unwrap().starts_with(&format!("3.{minor}")),
            "3.{minor}: version"
        );
    }
}

/// The real libcudart from PyPI, loaded by the target only after the daemon attached: the daemon
/// must notice it (within 1 s: the workload waits 1 s before its first call) and count every
/// call with kind and bytes read from the arguments. Without a GPU the calls fail (error 35).
#[test]
fn real_libcudart_loaded_after_attach() {
    if !root_or_skip() {
        return;
    }
    let Some(lib) = std::env::var_os("TRACEML_REAL_CUDART") else {
        panic!(
            "TRACEML_REAL_CUDART is not set: run through `cargo xtask test` (setup installs nvidia-cuda-runtime)"
        );
    };
    let dir = scratch("real-cudart");
    let mut cmd = workload(&python(11), std::path::Path::new(&lib));
    cmd.args([
        "--late-load",
        "--settle",
        "1.0",
        "--iters",
        "12",
        "--launches",
        "3",
        "--bytes",
        "1048576",
    ]);
    let (pid, out) = run_counted(cmd, &dir);
    assert!(out.status.success(), "daemon failed: {}", out.stderr);
    let libs: Vec<_> = out
        .items
        .iter()
        .filter_map(|i| match i {
            StreamItem::Library(l) if l.role == "cudart" => Some(l.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(libs.len(), 1, "libcudart noticed once: {libs:?}");
    assert!(
        libs[0].path.ends_with("libcudart.so.13"),
        "{}",
        libs[0].path
    );
    // libcudart functions start with `push %rbp`: probes sit on the symbol itself.
    assert!(
        libs[0].probes.iter().any(|p| p == "cudaLaunchKernel+0"),
        "{:?}",
        libs[0].probes
    );
    check_counts(
        &out.items,
        pid,
        &truth(&out.target_stdout),
        "real libcudart",
    );
}

/// The replay tests' workload, started in `dir`: `probe_counts.py` on CPython 3.12 and the
/// stand-in runtime, 30 iterations.
fn replay_workload(dir: &Path) -> Target {
    let mut cmd = workload(&python(12), &fake_cudart());
    cmd.args(["--iters", "30"]);
    spawn(cmd, dir)
}

/// Replays `recording` into `replay_dir` (no colours): it must succeed and write the live run's
/// final_summary.json (in `out_dir`) byte for byte. Returns the card it printed (its stdout).
fn replay_rebuilds(recording: &Path, out_dir: &Path, replay_dir: &Path) -> Vec<u8> {
    let r = Command::new(daemon())
        .arg("replay")
        .arg(recording)
        .arg("--output")
        .arg(replay_dir)
        .args(["--color", "never"])
        .output()
        .unwrap();
    assert!(
        r.status.success(),
        "replay failed: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    let live = std::fs::read_to_string(out_dir.join("final_summary.json")).unwrap();
    let replayed = std::fs::read_to_string(replay_dir.join("final_summary.json")).unwrap();
    assert_eq!(live, replayed, "replay must rebuild the same summary");
    r.stdout
}

/// `replay` of the recording rebuilds exactly the live summary.
#[test]
fn replay_prints_the_live_summary() {
    if !root_or_skip() {
        return;
    }
    let dir = scratch("replay");
    let mut target = replay_workload(&dir);
    let out = run_daemon(&mut target, &dir, &[], Duration::from_secs(60));
    assert!(out.status.success(), "daemon failed: {}", out.stderr);
    let card = replay_rebuilds(&out.recording, &out.out_dir, &dir.join("replayed"));
    assert_eq!(
        String::from_utf8_lossy(&card),
        out.stdout,
        "same card on stdout"
    );
    assert!(
        out.stdout.contains("traceml"),
        "the live run printed the card: {}",
        out.stdout
    );
}

/// The same with a binary recording (`--record FILE.trec`): its replay writes the live run's
/// `final_summary.json` byte for byte, and its export to JSON Lines holds the same items.
#[test]
fn replay_of_a_binary_recording_prints_the_live_summary() {
    if !root_or_skip() {
        return;
    }
    let dir = scratch("replay-trec");
    let mut target = replay_workload(&dir);
    let recording = dir.join("rec.trec");
    let out_dir = dir.join("out");
    let child = daemon_command(&daemon(), &target, &recording, &out_dir)
        .args(["--probe-set", "full"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_with_timeout(child, Duration::from_secs(60));
    let _ = target.child.wait();
    assert!(
        out.status.success(),
        "daemon failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = std::fs::read(&recording).unwrap();
    assert!(
        bytes.starts_with(&traceml_daemon::record::binary::MAGIC),
        "a .trec recording is binary"
    );
    let card = replay_rebuilds(&recording, &out_dir, &dir.join("replayed"));
    assert_eq!(card, out.stdout, "same card on stdout");
    let rec = traceml_daemon::record::read(&recording).unwrap();
    assert!(!rec.truncated_tail);
    assert!(matches!(rec.items.last(), Some(StreamItem::End(_))));
    assert!(events(&rec.items).count() > 100, "events recorded");
    let jsonl = dir.join("rec.jsonl");
    let e = Command::new(daemon())
        .arg("export")
        .arg(&recording)
        .arg("-o")
        .arg(&jsonl)
        .output()
        .unwrap();
    assert!(e.status.success(), "{}", String::from_utf8_lossy(&e.stderr));
    assert_eq!(
        traceml_daemon::record::read(&jsonl).unwrap().items,
        rec.items
    );
}

fn daemon_fails(args: &[&str]) -> (i32, String) {
    let out = Command::new(daemon()).args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "no panics: {stderr}");
    (out.status.code().unwrap_or(-1), stderr)
}

#[test]
fn bad_targets_get_one_clear_sentence() {
    if !root_or_skip() {
        return;
    }
    // No such pid.
    let (code, err) = daemon_fails(&["--pid", "999999999"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("no process with pid 999999999"), "{err}");
    // A process that is not Python.
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = sleeper.id().to_string();
    let (code, err) = daemon_fails(&[
        "--pid",
        &pid,
        "--output",
        &scratch("notpy").display().to_string(),
    ]);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("does not look like Python"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one sentence: {err}");
    // No pid at all.
    let (code, err) = daemon_fails(&[]);
    assert_eq!(code, 2, "{err}");
}

/// Without root (and without CAP_BPF/CAP_PERFMON/CAP_SYS_PTRACE) the daemon says which
/// capabilities it lacks.
#[test]
fn without_privileges_it_names_the_missing_capabilities() {
    if !root_or_skip() {
        return;
    }
    let dir = scratch("noroot");
    let mut sleeper = Command::new(python(11))
        .args(["-c", "import time; time.sleep(30)"])
        .spawn()
        .unwrap();
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
        ])
        .arg(daemon())
        .args(["--pid", &sleeper.id().to_string(), "--output"])
        .arg(dir.join("out"))
        .output()
        .expect("setpriv (util-linux)");
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    // Every capability dropped: the sentence names what current kernels need, not the
    // CAP_BPF + CAP_PERFMON pair they refuse uprobes with.
    assert!(
        err.contains("needs root")
            && err.contains("lacks CAP_SYS_ADMIN, CAP_SYS_PTRACE")
            && !err.contains("CAP_BPF"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// The bpf links this process holds open (`anon_inode:bpf_link` fds).
fn open_bpf_links() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| l.as_os_str() == "anon_inode:bpf_link")
        .count()
}

/// The first byte of the target's text at `file_offset` of `path` (0xCC while a uprobe's
/// breakpoint sits there).
fn text_byte(pid: u32, path: &std::path::Path, file_offset: u64) -> u8 {
    use std::io::{Read, Seek, SeekFrom};
    let maps = traceml_daemon::attach::maps::read(pid).unwrap();
    let m = maps
        .iter()
        .find(|m| {
            m.path == path
                && m.perms.contains('x')
                && (m.offset..m.offset + (m.end - m.start)).contains(&file_offset)
        })
        .unwrap_or_else(|| panic!("{} +{file_offset:#x} not mapped", path.display()));
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    mem.seek(SeekFrom::Start(m.start + file_offset - m.offset))
        .unwrap();
    let mut b = [0u8];
    mem.read_exact(&mut b).unwrap();
    b[0]
}

/// Dropping the attacher takes every probe out of the target: the breakpoints the kernel wrote
/// into its text are gone and no bpf link is left open. Where the kernel has `uprobe_multi`
/// links, a file's probes share one link per program (taking a link out costs the kernel one
/// grace period, not one per probe). The time the drop took is printed, not asserted (the
/// benchmark measures it).
#[test]
fn dropping_the_attacher_takes_every_probe_out() {
    use traceml_daemon::attach::{self, Attacher, LoadConfig, maps::Role};
    if !root_or_skip() {
        return;
    }
    let lib = std::fs::canonicalize(fake_cudart()).unwrap();
    let dir = scratch("detach");
    let mut cmd = Command::new(python(11));
    cmd.arg("-c")
        .arg("import ctypes, sys, time; ctypes.CDLL(sys.argv[1]); print('loaded', flush=True); time.sleep(120)")
        .arg(&lib);
    let target = spawn(cmd, &dir);
    let pid = target.child.id();
    let cfg = LoadConfig {
        frame_code_offset: 0,
        code_ptr_mask: u64::MAX,
        code_name_offset: 0,
        launch_events: false,
        ring_bytes: 1 << 16,
    };
    let before = open_bpf_links();
    let mut attacher = Attacher::load(std::num::NonZeroU32::new(pid).unwrap(), cfg).unwrap();
    let report = attacher.attach_file(&lib, Role::CudaRuntime).unwrap();
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    let placed = report.attached.len();
    assert!(placed >= 8, "{:?}", report.attached);
    // Where the probes sit, as the attacher finds them.
    let elf = attach::open_elf(pid, &lib).unwrap();
    let sites: Vec<u64> = attach::CUDA_RUNTIME
        .iter()
        .filter_map(|spec| {
            let attach::Matcher::Exact(name) = spec.matcher else {
                return None;
            };
            let sym = elf.find(|s| s == name).unwrap()?;
            Some(elf.probe_site(&sym, spec.movable).unwrap().file_offset)
        })
        .collect();
    assert_eq!(sites.len(), placed);
    for &off in &sites {
        assert_eq!(text_byte(pid, &lib, off), 0xCC, "breakpoint at +{off:#x}");
    }
    let links = open_bpf_links() - before;
    eprintln!(
        "{placed} probes in {} kernel links ({}), {links} bpf link fds (the exec and \
         sched_switch tracepoints' included)",
        attacher.link_count(),
        if attacher.uses_multi_links() {
            "uprobe_multi"
        } else {
            "perf-event"
        }
    );
    if attacher.uses_multi_links() {
        // launch, call_enter, any_exit; and the exec and sched_switch tracepoints.
        assert_eq!(attacher.link_count(), 3);
        assert_eq!(links, 5);
    }
    let t0 = std::time::Instant::now();
    drop(attacher);
    eprintln!("probes taken out in {} ms", t0.elapsed().as_millis());
    assert_eq!(open_bpf_links(), before, "bpf links left open");
    for &off in &sites {
        assert_ne!(
            text_byte(pid, &lib, off),
            0xCC,
            "breakpoint left at +{off:#x}"
        );
    }
}
