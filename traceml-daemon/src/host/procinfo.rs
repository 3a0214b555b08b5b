//! Everything the daemon reads from /proc, in one place and parsed by the `procfs` crate: the
//! processes there; a process's memory maps, stat (start time, state, CPU, RSS), owner, comm,
//! cmdline, environment, cgroup, executable and child processes; the machine's CPU times, memory,
//! boot time and hostname; the daemon's own capabilities.
//!
//! Each reader does one read; the parsing is procfs's and the pure `*_from` functions take the
//! bytes, so tests feed them recorded /proc files. A process that is gone (or a file the kernel
//! refuses) reads as `None` / empty: callers treat that as the expected race it is.
use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use procfs::process::{MMapPath, MemoryMaps, Process, Stat};
use procfs::{Current as _, CurrentSI as _, ExplicitSystemInfo, FromBufRead as _, FromReadSI};
pub use procfs::{KernelStats, Meminfo};

fn process(pid: u32) -> Option<Process> {
    Process::new(i32::try_from(pid).ok()?).ok()
}

/// The raw bytes of `/proc/<pid>/<name>` (`comm`, `cmdline`, `maps`): chosen by the target, so
/// read as bytes and decoded by the caller.
fn read_raw(pid: u32, name: &str) -> std::io::Result<Vec<u8>> {
    let p = process(pid).ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))?;
    let mut f = p.open_relative(name).map_err(std::io::Error::other)?;
    let mut out = Vec::new();
    f.read_to_end(&mut out)?;
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Memory maps.

/// One line of `/proc/<pid>/maps` that maps a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// The permission field, e.g. `r-xp`.
    pub perms: String,
    /// Offset in the file of `start`.
    pub offset: u64,
    pub path: PathBuf,
}

/// Reads `/proc/<pid>/maps`. The target names its files: a path that is not UTF-8 is read
/// lossily (that file cannot be opened by its name then) instead of failing the whole read.
pub fn maps(pid: u32) -> std::io::Result<Vec<Mapping>> {
    Ok(maps_from(&read_raw(pid, "maps")?))
}

/// Parses the text of a maps file with procfs (paths keep their spaces, runs of them
/// included); lines without a file path (anonymous, `[heap]`, ...) and deleted files are
/// skipped, and so are lines procfs cannot parse. Line by line, so one odd line costs only
/// itself.
pub fn maps_from(bytes: &[u8]) -> Vec<Mapping> {
    file_maps(bytes)
        .into_iter()
        .filter(|m| {
            !m.path
                .as_os_str()
                .as_encoded_bytes()
                .ends_with(b" (deleted)")
        })
        .collect()
}

/// The path of every file `pid` maps, one per mapping, deleted files included (the kernel names
/// them with a ` (deleted)` suffix): what a process loaded, even if the file went since.
pub fn mapped_paths(pid: u32) -> std::io::Result<Vec<PathBuf>> {
    Ok(file_maps(&read_raw(pid, "maps")?)
        .into_iter()
        .map(|m| m.path)
        .collect())
}

/// [`maps_from`] with deleted files kept.
fn file_maps(bytes: &[u8]) -> Vec<Mapping> {
    let text = String::from_utf8_lossy(bytes);
    text.lines()
        // SysV shared memory (`/SYSV<key>`) is never a library, and procfs slices its name
        // blindly: a file the target names `/SYSV1` must not reach it.
        .filter(|line| {
            !line
                .splitn(6, ' ')
                .nth(5)
                .is_some_and(|p| p.trim_start().starts_with("/SYSV"))
        })
        .filter_map(|line| MemoryMaps::from_buf_read(line.as_bytes()).ok())
        .flat_map(|m| m.0)
        .filter_map(|m| {
            let MMapPath::Path(path) = m.pathname else {
                return None;
            };
            Some(Mapping {
                start: m.address.0,
                end: m.address.1,
                perms: m.perms.as_str(),
                offset: m.offset,
                path,
            })
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The processes.

/// The ids of every process in /proc (the daemon's pid namespace); `None` when /proc cannot be
/// listed. A process that goes while it is listed is left out.
pub fn pids() -> Option<Vec<u32>> {
    let all = procfs::process::all_processes().ok()?;
    Some(
        all.flatten()
            .filter_map(|p| u32::try_from(p.pid()).ok())
            .collect(),
    )
}

// ---------------------------------------------------------------------------------------------
// One process.

/// `/proc/<pid>/stat`, parsed.
pub fn stat(pid: u32) -> Option<Stat> {
    stat_from(&read_raw(pid, "stat").ok()?)
}

/// Parses a stat line (procfs finds the command name by its last `)`, whatever it holds).
/// procfs slices the line around the parentheses before checking its length, so a line too
/// short for that is refused here first: `None`, never a panic.
pub fn stat_from(bytes: &[u8]) -> Option<Stat> {
    use procfs::FromRead as _;
    let text = String::from_utf8_lossy(bytes);
    let line = text.trim();
    let (open, close) = (line.find('(')?, line.rfind(')')?);
    if open < 2 || close < open || line.len() < close + 3 {
        return None;
    }
    Stat::from_read(line.as_bytes()).ok()
}

/// CPU time the process has used (user + system, every thread), ns.
pub fn cpu_ns(pid: u32) -> Option<u64> {
    let s = stat(pid)?;
    Some((s.utime + s.stime).saturating_mul(1_000_000_000) / ticks_per_second().max(1))
}

/// The process's start time (ticks since boot) and state letter (`R`, `S`, `Z`, ...): together
/// they tell an exit or a zombie from a live process, and a reused pid from the same process.
pub fn start_state(pid: u32) -> Option<(u64, char)> {
    stat(pid).map(|s| (s.starttime, s.state))
}

/// When the process started, in seconds since the epoch (boot time + stat's start time).
pub fn start_unix_secs(stat: &Stat) -> Option<u64> {
    Some(procfs::boot_time_secs().ok()? + stat.starttime / ticks_per_second())
}

/// The owner of `/proc/<pid>` (the process's effective uid).
pub fn uid(pid: u32) -> Option<u32> {
    process(pid)?.uid().ok()
}

/// `/proc/<pid>/comm` as bytes (the target chooses it).
pub fn comm(pid: u32) -> Option<Vec<u8>> {
    read_raw(pid, "comm").ok()
}

/// `/proc/<pid>/cmdline` as bytes: NUL-separated arguments (the target chooses them).
pub fn cmdline(pid: u32) -> Option<Vec<u8>> {
    read_raw(pid, "cmdline").ok()
}

/// The arguments of `/proc/<pid>/cmdline`, each decoded lossily (the target chooses them), empty
/// ones left out.
pub fn cmdline_args(pid: u32) -> Option<Vec<String>> {
    Some(args_from(&cmdline(pid)?))
}

/// Splits a cmdline's bytes into its NUL-separated arguments, lossily, without empty ones.
pub fn args_from(bytes: &[u8]) -> Vec<String> {
    bytes
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// `/proc/<pid>/environ`: the environment the process started with (the target chooses it).
pub fn environ(pid: u32) -> Option<HashMap<OsString, OsString>> {
    process(pid)?.environ().ok()
}

/// `/proc/<pid>/cgroup` as text (the paths may hold anything the container runtime chose).
pub fn cgroup_file(pid: u32) -> Option<String> {
    read_raw(pid, "cgroup")
        .ok()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// The process's cgroup path: the unified hierarchy's (0), else the first listed.
pub fn cgroup(pid: u32) -> Option<String> {
    let cgroups: Vec<_> = process(pid)?.cgroups().ok()?.into_iter().collect();
    cgroups
        .iter()
        .find(|c| c.hierarchy == 0)
        .or(cgroups.first())
        .map(|c| c.pathname.clone())
}

/// The process's executable, as the kernel names it.
pub fn exe(pid: u32) -> Option<PathBuf> {
    process(pid)?.exe().ok()
}

/// `path` as seen through the process's root (`/proc/<pid>/root/...`): how the daemon opens a
/// file the target maps, across mount namespaces (a target in a container).
pub fn root_path(pid: u32, path: &Path) -> PathBuf {
    let mut p = PathBuf::from(format!("/proc/{pid}/root"));
    p.push(path.strip_prefix("/").unwrap_or(path));
    p
}

/// The children of every thread of `pid` (DataLoader workers are forked from the training
/// process, possibly by a thread other than the main one), sorted, without duplicates.
pub fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    if let Some(tasks) = process(pid).and_then(|p| p.tasks().ok()) {
        for task in tasks.flatten() {
            out.extend(task.children().unwrap_or_default());
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The target's worker processes (DataLoader workers, a `multiprocessing` pool): its children
/// that run the target's own interpreter as a copy of it, forked (the target's command line) or
/// started by `multiprocessing`'s spawn, and the processes a `multiprocessing` fork server forked
/// for it. Other children are not workers: a compiler or shell command (`torch.compile` runs
/// `g++`), a Python started with its own command line (`torch.compile`'s compile-worker pool,
/// `multiprocessing`'s resource tracker) and the fork server itself.
pub fn workers(pid: u32) -> Vec<u32> {
    let (Some(exe0), Some(cmd0)) = (exe(pid), cmdline(pid)) else {
        return Vec::new();
    };
    let same_exe = |c: u32| exe(c).is_some_and(|e| e == exe0);
    let mut out = Vec::new();
    for c in children(pid) {
        let Some(cmd) = cmdline(c).filter(|_| same_exe(c)) else {
            continue;
        };
        let args = args_from(&cmd);
        if is_forkserver(&args) {
            out.extend(children(c).into_iter().filter(|&g| same_exe(g)));
        } else if cmd == cmd0 || is_mp_worker(&args) {
            out.push(c);
        }
    }
    out.sort_unstable();
    out
}

/// A process `multiprocessing` started: a spawned child, a fork server, or a child of one.
pub fn is_mp_worker(cmdline: &[String]) -> bool {
    is_forkserver(cmdline)
        || cmdline
            .iter()
            .any(|w| w.contains("multiprocessing.spawn") || w == "--multiprocessing-fork")
}

/// `multiprocessing`'s fork server (its command line runs `multiprocessing.forkserver`).
fn is_forkserver(cmdline: &[String]) -> bool {
    cmdline
        .iter()
        .any(|w| w.contains("multiprocessing.forkserver"))
}

/// The daemon's effective capability set (`CapEff` of `/proc/self/status`); `None` when it
/// cannot be read.
pub fn own_effective_caps() -> Option<u64> {
    Some(Process::myself().ok()?.status().ok()?.capeff)
}

// ---------------------------------------------------------------------------------------------
// The machine.

/// `/proc/meminfo`, parsed (sizes in bytes).
pub fn meminfo() -> Option<Meminfo> {
    Meminfo::current().ok()
}

/// Physical memory, in bytes.
pub fn mem_total_bytes() -> Option<u64> {
    meminfo().map(|m| m.mem_total)
}

/// `/proc/stat`, parsed.
pub fn kernel_stats() -> Option<KernelStats> {
    KernelStats::current().ok()
}

/// Parses a `/proc/stat` text.
pub fn kernel_stats_from(bytes: &[u8]) -> Option<KernelStats> {
    let si = ExplicitSystemInfo {
        boot_time_secs: 0,
        ticks_per_second: procfs::ticks_per_second(),
        page_size: procfs::page_size(),
        is_little_endian: cfg!(target_endian = "little"),
    };
    <KernelStats as FromReadSI>::from_read(bytes, &si).ok()
}

/// Busy and total ticks of all CPUs: user, nice, system, idle, iowait, irq, softirq and steal
/// make the total (guest time is already in user); idle and iowait are not busy.
pub fn cpu_busy_total(k: &KernelStats) -> (u64, u64) {
    let t = &k.total;
    let o = |x: Option<u64>| x.unwrap_or(0);
    let idle = t.idle + o(t.iowait);
    let total = t.user + t.nice + t.system + t.idle + o(t.iowait) + o(t.irq) + o(t.softirq);
    let total = total + o(t.steal);
    (total - idle, total)
}

/// The machine's name (`/proc/sys/kernel/hostname`); empty when unreadable.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Clock ticks per second (`_SC_CLK_TCK`), the unit of stat's CPU times.
pub fn ticks_per_second() -> u64 {
    procfs::ticks_per_second()
}

/// Bytes per page, the unit of stat's RSS.
pub fn page_size() -> u64 {
    procfs::page_size()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d4c8a00000-55d4c8a01000 r--p 00000000 fe:01 123                        /usr/bin/python3.11
7f00aa100000-7f00aa300000 r-xp 00100000 fe:01 456 /root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0
7f00bb000000-7f00bb010000 r-xp 00000000 fe:01 789                        /tmp/sp  ace/lib  python3.11.so
7f00cc000000-7f00cc001000 rw-p 00000000 00:00 0
7f00dd000000-7f00dd001000 r-xp 00000000 fe:01 790                        /tmp/gone.so (deleted)
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
7ffe00000000-7ffe00001000 rw-s 00000000 00:01 5                          /SYSV1
7ffe00001000-7ffe00002000 rw-s 00000000 00:01 6                          /SYSV0000abcd (deleted)
not a maps line
Rss:  4 kB
";

    #[test]
    fn maps_keep_runs_of_spaces_and_skip_the_rest() {
        let maps = maps_from(MAPS.as_bytes());
        let paths: Vec<&Path> = maps.iter().map(|m| m.path.as_path()).collect();
        assert_eq!(
            paths,
            [
                Path::new("/usr/bin/python3.11"),
                Path::new("/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0"),
                Path::new("/tmp/sp  ace/lib  python3.11.so"),
            ]
        );
        assert_eq!(maps[1].offset, 0x100000);
        assert_eq!(maps[1].perms, "r-xp");
        assert_eq!(
            (maps[2].start, maps[2].end),
            (0x7f00bb000000, 0x7f00bb010000)
        );
    }

    #[test]
    fn mapped_paths_keep_deleted_files() {
        let all: Vec<PathBuf> = file_maps(MAPS.as_bytes())
            .into_iter()
            .map(|m| m.path)
            .collect();
        assert_eq!(all.len(), 4);
        assert_eq!(all[3], Path::new("/tmp/gone.so (deleted)"));
        let me = mapped_paths(std::process::id()).unwrap();
        assert!(me.contains(&exe(std::process::id()).unwrap()), "{me:?}");
    }

    #[test]
    fn cmdline_args_split_lossily_without_empty_ones() {
        assert_eq!(
            args_from(b"python\0-c\0\0x\xff\0"),
            ["python", "-c", "x\u{fffd}"]
        );
        assert!(args_from(b"").is_empty());
    }

    #[test]
    fn maps_of_a_non_utf8_path_are_read_lossily() {
        let mut text = b"7f00bb000000-7f00bb010000 r-xp 00000000 fe:01 789 /tmp/\xff.so\n".to_vec();
        text.extend_from_slice(MAPS.as_bytes());
        assert_eq!(maps_from(&text).len(), 4);
    }

    /// A file under a directory whose name holds two spaces, mapped by this process: read back
    /// from the live /proc/self/maps with its name intact.
    #[test]
    fn a_mapped_file_under_a_directory_with_two_spaces() {
        let dir = std::env::temp_dir().join(format!("traceml sp  ace {}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lib  mapped.so");
        std::fs::write(&path, [7u8; 4096]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        use std::os::fd::AsRawFd as _;
        // SAFETY: a fresh private read-only mapping of a 4 KiB file we own; unmapped below.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED);
        let found = maps(std::process::id())
            .unwrap()
            .into_iter()
            .find(|m| m.start == addr as u64);
        // SAFETY: the mapping made above, of that length.
        unsafe { libc::munmap(addr, 4096) };
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(found.map(|m| m.path), Some(path));
    }

    #[test]
    fn short_or_odd_stat_lines_give_none_not_a_panic() {
        for line in [
            "",
            "1",
            "(x)",
            "1 (x)",
            "1 (x) ",
            "1 (x) R",
            ") 1 (",
            "1 (a) b) R",
            "1 (x) R 1 2",
        ] {
            assert!(stat_from(line.as_bytes()).is_none(), "{line:?}");
        }
        let line = "42 (py (thon) 3) S 1 42 42 0 -1 4194304 1000 0 0 0 7 3 0 0 20 0 5 0 12345 \
                    100000000 1000 18446744073709551615 1 1 0 0 0 0 0 16781312 134234626 0 0 0 \
                    17 1 0 0 0 0 0 0 0 0 0 0 0 0 0";
        let s = stat_from(line.as_bytes()).unwrap();
        assert_eq!(
            (s.pid, s.comm.as_str(), s.state, s.starttime),
            (42, "py (thon) 3", 'S', 12345)
        );
    }

    #[test]
    fn this_process_reads_back() {
        let me = std::process::id();
        let (start, state) = start_state(me).unwrap();
        assert!(start > 0);
        assert!(matches!(state, 'R' | 'S'), "{state}");
        assert!(!comm(me).unwrap().is_empty());
        assert!(cmdline(me).unwrap().contains(&0));
        assert!(exe(me).is_some());
        assert!(mem_total_bytes().unwrap() > 0);
        assert!(own_effective_caps().is_some());
        // SAFETY: geteuid has no preconditions.
        assert_eq!(uid(me), Some(unsafe { libc::geteuid() }));
        assert!(cmdline_args(me).is_some_and(|a| !a.is_empty()));
        assert!(environ(me).is_some());
        assert!(cgroup(me).is_some());
        assert!(pids().unwrap().contains(&me));
        let started = start_unix_secs(&stat(me).unwrap()).unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(
            started <= now + 1 && started + 3600 > now,
            "{started} {now}"
        );
        let k = kernel_stats().unwrap();
        let (busy, total) = cpu_busy_total(&k);
        assert!(busy <= total && total > 0);
        assert_eq!(start_state(u32::MAX), None);
        assert_eq!(comm(u32::MAX), None);
    }

    #[test]
    fn children_of_this_process() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let kids = children(std::process::id());
        let _ = child.kill();
        let _ = child.wait();
        assert!(kids.contains(&child.id()), "{kids:?}");
        assert!(children(u32::MAX).is_empty());
    }

    /// A Python with one child of each kind: forked, spawned, forked by a fork server (the
    /// workers), and a `sleep` and a `python -c` of its own (not workers); the fork server and
    /// `multiprocessing`'s resource tracker are children too and not workers.
    const CHILDREN: &str = r#"
import json, multiprocessing as mp, os, subprocess, sys, time
kids = {}
f = os.fork()
if f == 0:
    time.sleep(30)
    os._exit(0)
kids["fork"] = f
procs = [mp.get_context(m).Process(target=time.sleep, args=(30,)) for m in ("spawn", "forkserver")]
for p in procs:
    p.start()
kids["spawn"], kids["forkserver"] = procs[0].pid, procs[1].pid
others = [subprocess.Popen(["sleep", "30"]), subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])]
kids["others"] = [o.pid for o in others]
print(json.dumps(kids), flush=True)
sys.stdin.read()
os.kill(f, 9)
for p in procs:
    p.kill()
for o in others:
    o.kill()
"#;

    #[test]
    fn workers_are_copies_of_the_target_not_its_other_children() {
        use std::io::BufRead as _;
        let mut py = std::process::Command::new("python3")
            .args(["-c", CHILDREN])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 on PATH");
        let mut line = String::new();
        let mut out = std::io::BufReader::new(py.stdout.take().unwrap());
        out.read_line(&mut line).unwrap();
        let kids: serde_json::Value = serde_json::from_str(&line).expect(&line);
        let pid = py.id();
        let (found, all) = (workers(pid), children(pid));
        drop(py.stdin.take());
        let _ = py.wait();
        let id = |k: &str| kids[k].as_u64().unwrap() as u32;
        let mut want = vec![id("fork"), id("spawn"), id("forkserver")];
        want.sort_unstable();
        assert_eq!(found, want, "children {all:?}, {kids}");
        // The other children were there: a sleep, a python -c, the fork server, the tracker.
        for o in kids["others"].as_array().unwrap() {
            assert!(
                all.contains(&(o.as_u64().unwrap() as u32)),
                "{all:?} {kids}"
            );
        }
        assert!(all.len() >= 6, "children {all:?}, {kids}");
        assert!(workers(u32::MAX).is_empty());
    }

    #[test]
    fn cpu_times_from_a_recorded_proc_stat() {
        // /proc/stat recorded on a development machine (2 CPUs).
        let k = kernel_stats_from(include_bytes!("../sampler/fixtures/stat")).unwrap();
        // cpu  305093 22365 47090 31719 1254 0 406 260 0 0
        let total = 305093 + 22365 + 47090 + 31719 + 1254 + 406 + 260;
        assert_eq!(cpu_busy_total(&k), (total - 31719 - 1254, total));
        assert_eq!(k.cpu_time.len(), 2);
        assert!(kernel_stats_from(b"cpu  1 2 3\n").is_none());
    }

    #[test]
    fn root_path_joins_under_the_process_root() {
        assert_eq!(
            root_path(7, Path::new("/usr/lib/libpython3.so")),
            PathBuf::from("/proc/7/root/usr/lib/libpython3.so")
        );
    }
}
