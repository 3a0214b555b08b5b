//! Taking probes out, off every path that must not wait for it.
//!
//! Closing a `uprobe_multi` link makes the kernel wait for an RCU-tasks-trace grace period and
//! then for every return probe still pending anywhere on the host (`uretprobes_srcu`): tens of
//! milliseconds, usually. But a process that exec'd while its return probes were being taken
//! out keeps that wait open until it exits (Linux 6.18, seen in the serve exec test: every
//! link closed on the host waited the exec'd program's 22 s). So no attach, event loop or
//! summary waits for a link to close: the links go to threads of their own, and the daemon's
//! exit waits for them a bounded time ([`wait`]).
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::TakenLink;

/// Threads taking probes out (see [`wait`]).
static RELEASING: Mutex<Vec<JoinHandle<()>>> = Mutex::new(Vec::new());

/// Drops each link on its own thread and waits for them all: taking a `uprobe_multi` link out
/// waits for an RCU-tasks-trace grace period, and links taken out concurrently share one (a
/// thread that drops them one after another waits for each). Perf-event links gain nothing:
/// the kernel releases those one at a time under a mutex.
pub fn release(links: Vec<TakenLink>) {
    let threads: Vec<_> = links
        .into_iter()
        .map(|l| std::thread::spawn(move || drop(l)))
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

/// Runs `work` (taking probes out) on a thread of its own, kept for [`wait`].
pub fn in_background(work: impl FnOnce() + Send + 'static) {
    let thread = std::thread::spawn(work);
    let mut all = RELEASING.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|t| !t.is_finished());
    all.push(thread);
}

/// Drops `links` in the background (see [`in_background`]), one after another in their order.
pub fn drop_in_background(links: Vec<TakenLink>) {
    if !links.is_empty() {
        in_background(move || links.into_iter().for_each(drop));
    }
}

/// Waits until every probe is out of its target, for `limit` at most; the number of threads
/// still taking probes out when it gives up (0: all done). The daemon calls it before it
/// exits: the kernel would otherwise close the links left at the exit itself, one after
/// another, where the threads take them out concurrently (with `uprobe_multi`, a 4-rank job's
/// ~40 links in about the time of one).
pub fn wait(limit: Duration) -> usize {
    let deadline = Instant::now() + limit;
    loop {
        let left = {
            let mut all = RELEASING.lock().unwrap_or_else(|e| e.into_inner());
            all.retain(|t| !t.is_finished());
            all.len()
        };
        if left == 0 || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_gives_up_at_its_limit_and_counts_what_is_left() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        in_background(move || {
            let _ = rx.recv();
        });
        drop_in_background(vec![Box::new(5u8) as TakenLink]);
        // One thread blocks until told; the other is done at once.
        assert_eq!(wait(Duration::from_millis(50)), 1);
        assert_eq!(wait(Duration::ZERO), 1, "still kept after giving up");
        drop(tx);
        assert_eq!(wait(Duration::from_secs(10)), 0);
    }
}
