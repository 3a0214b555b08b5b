//! /proc sampling: system CPU and RAM, the target's CPU, RSS and threads, and the same for its
//! worker processes (DataLoader workers: [`procinfo::workers`], not every child).
use procfs::process::Stat;

use crate::host::procinfo::{self, Meminfo};
use crate::sample::{ProcessSample, Sample, SystemSample};

/// Raw /proc readings at one instant.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub ts: u64,
    /// Busy and total ticks of all CPUs (`/proc/stat` first line).
    pub cpu_busy_total: Option<(u64, u64)>,
    pub meminfo: Option<Meminfo>,
    pub target: Option<Stat>,
    /// The target's workers ([`procinfo::workers`]).
    pub children: Vec<Stat>,
}

pub fn ticks_per_second() -> u64 {
    procinfo::ticks_per_second()
}

pub fn page_size() -> u64 {
    procinfo::page_size()
}

/// Reads everything one sample needs (through [`crate::host::procinfo`]). Missing pieces (a worker
/// that just exited) are skipped.
pub fn read_snapshot(pid: u32, ts: u64) -> Snapshot {
    Snapshot {
        ts,
        cpu_busy_total: procinfo::kernel_stats().map(|k| procinfo::cpu_busy_total(&k)),
        meminfo: procinfo::meminfo(),
        target: procinfo::stat(pid),
        children: procinfo::workers(pid)
            .into_iter()
            .filter_map(procinfo::stat)
            .collect(),
    }
}

fn process_sample(
    prev: Option<&Stat>,
    cur: &Stat,
    dt_s: f64,
    tps: u64,
    page: u64,
) -> ProcessSample {
    let secs = |s: &Stat| (s.utime + s.stime) as f64 / tps as f64;
    ProcessSample {
        pid: cur.pid as u32,
        cpu_pct_one_core: prev
            .filter(|_| dt_s > 0.0)
            .map(|p| (secs(cur) - secs(p)).max(0.0) / dt_s * 100.0),
        rss_bytes: Some(cur.rss * page),
        threads: u32::try_from(cur.num_threads).ok(),
        cpu_seconds: Some(secs(cur)),
    }
}

/// Two snapshots closer than this (seconds) tell no worker: see [`to_sample`].
pub const WORKER_MIN_GAP_S: f64 = 0.2;

/// Turns two snapshots into a sample (pure).
pub fn to_sample(prev: &Snapshot, cur: &Snapshot, tps: u64, page: u64) -> Sample {
    let dt_s = cur.ts.saturating_sub(prev.ts) as f64 / 1e9;
    let cpu_pct = match (prev.cpu_busy_total, cur.cpu_busy_total) {
        (Some((b0, t0)), Some((b1, t1))) if t1 > t0 => {
            Some((b1.saturating_sub(b0)) as f64 / (t1 - t0) as f64 * 100.0)
        }
        _ => None,
    };
    let system = SystemSample {
        cpu_pct,
        mem_used_bytes: cur
            .meminfo
            .as_ref()
            .and_then(|m| m.mem_available.map(|a| m.mem_total.saturating_sub(a))),
        mem_total_bytes: cur.meminfo.as_ref().map(|m| m.mem_total),
    };
    let process = cur.target.as_ref().map(|t| {
        let p = prev
            .target
            .as_ref()
            .filter(|p| p.pid == t.pid && p.starttime == t.starttime);
        process_sample(p, t, dt_s, tps, page)
    });
    // A worker is one seen as such in two snapshots in a row, at least [`WORKER_MIN_GAP_S`]
    // apart: a child the target forks to run another program (`subprocess`, inductor's g++) is a
    // copy of it until it execs, and one snapshot — or two taken a moment apart, on a busy
    // machine where the child waits for a CPU before its exec — may catch it then.
    let workers = cur
        .children
        .iter()
        .filter(|_| dt_s >= WORKER_MIN_GAP_S)
        .filter_map(|c| {
            let p = prev
                .children
                .iter()
                .find(|p| p.pid == c.pid && p.starttime == c.starttime)?;
            Some(process_sample(Some(p), c, dt_s, tps, page))
        })
        .collect();
    Sample {
        ts: cur.ts,
        system,
        process,
        workers,
        gpus: None,
        gpu_note: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use procfs::FromRead as _;

    fn stat(pid: i32, utime: u64, stime: u64, threads: i64, rss: u64) -> Stat {
        // A real /proc/<pid>/stat line with the fields we use substituted.
        let line = format!(
            "{pid} (python3.11) S 1 {pid} {pid} 0 -1 4194304 1000 0 0 0 {utime} {stime} 0 0 20 0 {threads} 0 \
             12345 100000000 {rss} 18446744073709551615 1 1 0 0 0 0 0 16781312 134234626 0 0 0 17 1 0 0 0 0 0 \
             0 0 0 0 0 0 0 0"
        );
        Stat::from_read(line.as_bytes()).unwrap()
    }

    #[test]
    fn sample_from_fixtures() {
        // A /proc/meminfo recorded on a development machine.
        let meminfo = Meminfo::from_read(include_str!("fixtures/meminfo").as_bytes()).unwrap();
        let prev = Snapshot {
            ts: 0,
            cpu_busy_total: Some((100, 1000)),
            meminfo: Some(meminfo.clone()),
            target: Some(stat(42, 100, 0, 5, 1000)),
            children: vec![stat(43, 0, 0, 1, 10)],
        };
        let cur = Snapshot {
            ts: 500_000_000,
            cpu_busy_total: Some((200, 1200)),
            meminfo: Some(meminfo),
            target: Some(stat(42, 140, 10, 6, 2000)),
            children: vec![stat(43, 25, 0, 1, 10), stat(44, 5, 0, 1, 10)],
        };
        let s = to_sample(&prev, &cur, 100, 4096);
        assert_eq!(s.system.cpu_pct, Some(50.0));
        assert_eq!(s.system.mem_total_bytes, Some(24_684_092 * 1024));
        assert_eq!(
            s.system.mem_used_bytes,
            Some((24_684_092 - 23_947_440) * 1024)
        );
        let p = s.process.unwrap();
        // 50 ticks at 100/s over 0.5 s = one full core
        assert_eq!(p.cpu_pct_one_core, Some(100.0));
        assert_eq!(p.rss_bytes, Some(2000 * 4096));
        assert_eq!(p.threads, Some(6));
        // 44, new in this snapshot, is not a worker yet (it may be a fork about to exec).
        assert_eq!(s.workers.len(), 1);
        assert_eq!(s.workers[0].pid, 43);
        assert_eq!(s.workers[0].cpu_pct_one_core, Some(50.0));
        assert_eq!(s.gpus, None);
        // Two snapshots 5 ms apart (a child forked to exec another program, caught twice
        // before its exec on a busy machine): no worker from them.
        let soon = Snapshot {
            ts: prev.ts + 5_000_000,
            ..cur.clone()
        };
        assert!(to_sample(&prev, &soon, 100, 4096).workers.is_empty());
    }
}
