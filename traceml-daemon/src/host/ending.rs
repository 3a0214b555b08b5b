//! How the target's run ended: it exited (with its exit status when knowable), was killed by a
//! signal (which), or exec'd another program (which).
//!
//! Two sources, the first preferred:
//!
//! - The kernel's **process events connector** (netlink `NETLINK_CONNECTOR`, `CN_IDX_PROC`):
//!   the exit of every process with its wait status, and every `execve`, for any process on the
//!   host, children or not. Needs `CAP_NET_ADMIN` in the initial namespaces (root on the host) and
//!   `CONFIG_PROC_EVENTS`; unavailable otherwise (a daemon in a container), and events can be lost
//!   when the socket's buffer overflows on a busy node.
//! - **/proc**: `/proc/<pid>/stat` gives the state, the start time (a reused pid is another
//!   process), the `PF_EXITING` flag (set when `do_exit` starts, before the address space is torn
//!   down) and, for a zombie, the wait status (field 52). A target that is not the daemon's
//!   child is usually reaped by its parent within microseconds of becoming a zombie: then its
//!   status is unknown, and the summary says so.
//!
//! Why `PF_EXITING` matters: a process tearing down a large address space (a training job with
//! gigabytes mapped) spends tens to hundreds of milliseconds in `exit_mm`, still in state `R`,
//! with `/proc/<pid>/maps` partly or entirely empty. The previous check ("libpython is no longer
//! mapped at its base") read that as an `execve`: the "ended: target exec'd" of plain exits. An
//! exec is now only what the connector reports, or a changed map of a process that is not
//! exiting (maps are read before stat, so a process that had started exiting when its maps
//! were read shows `PF_EXITING`).
use std::time::{Duration, Instant};

use crate::event::{EndReason, TargetEnd};
use crate::host::procinfo;
use crate::sanitize;

/// `PF_EXITING` (`include/linux/sched.h`): the task has entered `do_exit`. Never cleared.
const PF_EXITING: u64 = 0x4;
/// How long the watch waits, once the target is exiting, for its status (zombie or connector).
const EXIT_WAIT: Duration = Duration::from_secs(2);

/// The fields of `/proc/<pid>/stat` that tell how a process is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    /// `R`, `S`, `D`, `Z`, ...
    pub state: char,
    /// Field 9.
    pub flags: u64,
    /// Field 22, clock ticks after boot: a pid reused by another process has another.
    pub start: u64,
    /// Field 52, a `wait(2)` status: meaningful for a zombie only, and shown only to a reader
    /// allowed to ptrace the process (0 otherwise).
    pub exit_code: Option<i32>,
}

impl Stat {
    pub fn exiting(&self) -> bool {
        self.flags & PF_EXITING != 0
    }

    pub fn zombie(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

impl From<&procfs::process::Stat> for Stat {
    fn from(s: &procfs::process::Stat) -> Self {
        Stat {
            state: s.state,
            flags: u64::from(s.flags),
            start: s.starttime,
            exit_code: s.exit_code,
        }
    }
}

/// Reads `/proc/<pid>/stat` ([`procinfo::stat`]); `None` when the process is gone.
pub fn read_stat(pid: u32) -> Option<Stat> {
    procinfo::stat(pid).as_ref().map(Stat::from)
}

/// The end a `wait(2)` status describes: exited with a status, or killed by a signal.
pub fn from_wait_status(status: i32, source: &str) -> (EndReason, TargetEnd) {
    let sig = status & 0x7f;
    if sig == 0 {
        (
            EndReason::TargetExited,
            TargetEnd {
                exit_status: Some((status >> 8) & 0xff),
                source: source.to_owned(),
                ..TargetEnd::default()
            },
        )
    } else {
        (
            EndReason::TargetKilled,
            TargetEnd {
                signal: Some(sig),
                signal_name: signal_name(sig).map(str::to_owned),
                core_dumped: status & 0x80 != 0,
                source: source.to_owned(),
                ..TargetEnd::default()
            },
        )
    }
}

/// `SIGKILL` for 9, on Linux x86_64 and aarch64 numbering.
pub fn signal_name(sig: i32) -> Option<&'static str> {
    Some(match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        5 => "SIGTRAP",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        10 => "SIGUSR1",
        11 => "SIGSEGV",
        12 => "SIGUSR2",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        16 => "SIGSTKFLT",
        24 => "SIGXCPU",
        25 => "SIGXFSZ",
        26 => "SIGVTALRM",
        27 => "SIGPROF",
        29 => "SIGIO",
        30 => "SIGPWR",
        31 => "SIGSYS",
        _ => return None,
    })
}

/// The program a process runs now: `/proc/<pid>/exe`, else its `comm`.
fn program_of(pid: u32) -> Option<String> {
    use std::os::unix::ffi::OsStrExt;
    if let Some(exe) = procinfo::exe(pid) {
        return Some(sanitize::lossy_bounded(
            exe.as_os_str().as_bytes(),
            sanitize::NAME_MAX,
        ));
    }
    procinfo::comm(pid).map(|b| sanitize::comm(&b))
}

/// What the process events connector said about the target.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// The wait status of the target's exit (its main thread's exit event).
    pub exit: Option<i32>,
    pub exec: bool,
}

/// A process event, as the connector sends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcEvent {
    Exec {
        pid: u32,
        tgid: u32,
    },
    Exit {
        pid: u32,
        tgid: u32,
        /// A `wait(2)` status.
        code: i32,
    },
    Other,
}

const PROC_EVENT_EXEC: u32 = 0x2;
const PROC_EVENT_EXIT: u32 = 0x8000_0000;
const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
const NLMSG_HDRLEN: usize = 16;
/// `struct cn_msg`: `cb_id {idx, val}`, `seq`, `ack`, `len` (u16), `flags` (u16).
const CN_MSG_LEN: usize = 20;
/// `struct proc_event` up to its union: `what`, `cpu`, `timestamp_ns`.
const PROC_EVENT_HEAD: usize = 16;

/// The process events in one datagram from the connector (netlink messages of `cn_msg`s of
/// `proc_event`s, native endian). Malformed parts are skipped.
pub fn parse_datagram(buf: &[u8]) -> Vec<ProcEvent> {
    let u32_at = |b: &[u8], o: usize| {
        b.get(o..o + 4)
            .map(|s| u32::from_ne_bytes(s.try_into().expect("4 bytes")))
    };
    let mut out = Vec::new();
    let mut off = 0;
    while let Some(len) = u32_at(buf, off) {
        let len = len as usize;
        if len < NLMSG_HDRLEN || off + len > buf.len() {
            break;
        }
        let msg = &buf[off + NLMSG_HDRLEN..off + len];
        if u32_at(msg, 0) == Some(CN_IDX_PROC) && u32_at(msg, 4) == Some(CN_VAL_PROC) {
            let ev = msg.get(CN_MSG_LEN..).unwrap_or(&[]);
            let data = PROC_EVENT_HEAD;
            let e = match u32_at(ev, 0) {
                Some(PROC_EVENT_EXEC) => match (u32_at(ev, data), u32_at(ev, data + 4)) {
                    (Some(pid), Some(tgid)) => ProcEvent::Exec { pid, tgid },
                    _ => ProcEvent::Other,
                },
                Some(PROC_EVENT_EXIT) => {
                    match (u32_at(ev, data), u32_at(ev, data + 4), u32_at(ev, data + 8)) {
                        (Some(pid), Some(tgid), Some(code)) => ProcEvent::Exit {
                            pid,
                            tgid,
                            code: code as i32,
                        },
                        _ => ProcEvent::Other,
                    }
                }
                _ => ProcEvent::Other,
            };
            out.push(e);
        }
        // NLMSG_ALIGN
        off += len.div_ceil(4) * 4;
    }
    out
}

/// What the events say about process `pid`, folded into `seen`.
pub fn fold(seen: &mut Seen, events: &[ProcEvent], pid: u32) {
    for e in events {
        match *e {
            ProcEvent::Exec { tgid, .. } if tgid == pid => seen.exec = true,
            // The main thread's exit carries the process's status (exit_group sets it on every
            // thread); other threads' exits are not the end.
            ProcEvent::Exit {
                pid: p, tgid, code, ..
            } if tgid == pid && p == pid => seen.exit = Some(code),
            _ => {}
        }
    }
}

/// A subscription to the kernel's process events connector.
pub struct ProcEvents {
    fd: std::os::fd::OwnedFd,
    /// Datagrams lost to a full socket buffer (ENOBUFS) since subscribing.
    pub overflows: u64,
}

impl ProcEvents {
    /// Subscribes; fails without the privilege, the kernel option or the initial namespaces.
    pub fn subscribe() -> std::io::Result<ProcEvents> {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        let err = std::io::Error::last_os_error;
        // SAFETY: socket(2) with constant arguments; the fd is owned below.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                libc::NETLINK_CONNECTOR,
            )
        };
        if raw < 0 {
            return Err(err());
        }
        // SAFETY: a fresh fd nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // A large buffer: the connector reports every process of the host.
        let size: libc::c_int = 8 << 20;
        for opt in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
            // SAFETY: `size` is a c_int that outlives the call, its length given.
            let r = unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    (&size as *const libc::c_int).cast(),
                    size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if r == 0 {
                break;
            }
        }
        // SAFETY: zeroed sockaddr_nl is a valid value (all integer fields).
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        addr.nl_groups = CN_IDX_PROC;
        // SAFETY: `addr` is a valid sockaddr_nl, its size given.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_nl).cast(),
                size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(err());
        }
        let events = ProcEvents { fd, overflows: 0 };
        events.control(1)?; // PROC_CN_MCAST_LISTEN
        Ok(events)
    }

    /// Sends `PROC_CN_MCAST_LISTEN` (1) or `PROC_CN_MCAST_IGNORE` (2) to the kernel.
    fn control(&self, op: u32) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        let total = NLMSG_HDRLEN + CN_MSG_LEN + 4;
        let mut msg = Vec::with_capacity(total);
        msg.extend_from_slice(&(total as u32).to_ne_bytes()); // nlmsg_len
        msg.extend_from_slice(&(libc::NLMSG_DONE as u16).to_ne_bytes()); // nlmsg_type
        msg.extend_from_slice(&0u16.to_ne_bytes()); // nlmsg_flags
        msg.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_seq
        msg.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_pid
        msg.extend_from_slice(&CN_IDX_PROC.to_ne_bytes());
        msg.extend_from_slice(&CN_VAL_PROC.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes()); // seq
        msg.extend_from_slice(&0u32.to_ne_bytes()); // ack
        msg.extend_from_slice(&4u16.to_ne_bytes()); // len
        msg.extend_from_slice(&0u16.to_ne_bytes()); // flags
        msg.extend_from_slice(&op.to_ne_bytes());
        // SAFETY: zeroed sockaddr_nl is valid; pid 0 is the kernel.
        let mut to: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        to.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        // SAFETY: `msg` and `to` outlive the call, their lengths given.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                0,
                (&to as *const libc::sockaddr_nl).cast(),
                size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Reads every datagram waiting (never blocks) and folds what concerns `pid` into `seen`.
    pub fn drain(&mut self, pid: u32, seen: &mut Seen) {
        use std::os::fd::AsRawFd;
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: `buf` is writable for its length.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                match std::io::Error::last_os_error().raw_os_error() {
                    Some(libc::ENOBUFS) => {
                        self.overflows += 1;
                        continue;
                    }
                    Some(libc::EINTR) => continue,
                    _ => return,
                }
            }
            if n == 0 {
                return;
            }
            fold(seen, &parse_datagram(&buf[..n as usize]), pid);
        }
    }
}

impl Drop for ProcEvents {
    fn drop(&mut self) {
        // The kernel counts listeners and builds events while any listens.
        let _ = self.control(2); // PROC_CN_MCAST_IGNORE
    }
}

/// Watches one target for the end of its run.
pub struct Watch {
    pid: u32,
    start: Option<u64>,
    /// Where libpython (or the python executable) was mapped at attach.
    python_base: Option<u64>,
    events: Option<ProcEvents>,
    seen: Seen,
    /// The kernel marked the target's exec in the event stream (`sched_process_exec`).
    exec_marked: bool,
    end: Option<TargetEnd>,
}

impl Watch {
    /// Starts watching `pid` (started at `start`, with the evaluator's file mapped at
    /// `python_base`); subscribes to the connector when it can.
    pub fn new(pid: u32, start: Option<u64>, python_base: Option<u64>) -> Watch {
        let events = match ProcEvents::subscribe() {
            Ok(e) => Some(e),
            Err(e) => {
                tracing::info!(
                    "process events connector unavailable ({e}): exit statuses only when the \
                     target is seen as a zombie"
                );
                None
            }
        };
        Watch {
            pid,
            start,
            python_base,
            events,
            seen: Seen::default(),
            exec_marked: false,
            end: None,
        }
    }

    /// Whether the run has ended, and why ([`Watch::take_end`] then tells how).
    /// `python_base_now` is where the evaluator's file is mapped now, from maps read just before
    /// (`None` when the maps could not be read).
    pub fn check(&mut self, python_base_now: Option<Option<u64>>) -> Option<EndReason> {
        let (reason, end) = self.look(python_base_now)?;
        tracing::info!(
            "target {}: {reason:?} ({})",
            self.pid,
            sanitize::terminal(&end.source)
        );
        self.end = Some(end);
        Some(reason)
    }

    /// The event stream holds the target's exec: [`Watch::check`] says so from now on (unless
    /// the new program already exits).
    pub fn mark_exec(&mut self) {
        self.exec_marked = true;
    }

    /// How the target ended, once [`Watch::check`] said it did.
    pub fn take_end(&mut self) -> Option<TargetEnd> {
        self.end.take()
    }

    fn look(&mut self, python_base_now: Option<Option<u64>>) -> Option<(EndReason, TargetEnd)> {
        let stat = read_stat(self.pid);
        if let Some(ev) = self.events.as_mut() {
            ev.drain(self.pid, &mut self.seen);
        }
        let seen = Seen {
            exec: self.seen.exec || self.exec_marked,
            ..self.seen
        };
        let decision = decide(
            self.start,
            self.python_base,
            python_base_now,
            stat,
            seen,
            self.events.is_some(),
        );
        match decision {
            Fate::Running => None,
            Fate::Exiting => Some(self.wait_for_status(EXIT_WAIT, None)),
            // The kernel queues the exit event just after the process becomes a zombie, and
            // its parent may reap it at once: a process gone without a word may have its
            // event on the way.
            Fate::Ended(r, e) if e.exit_status.is_none() && e.signal.is_none() => {
                if self.events.is_some() {
                    Some(self.wait_for_status(Duration::from_millis(100), Some((r, e))))
                } else {
                    Some((r, e))
                }
            }
            Fate::Ended(r, e) => Some((r, e)),
            Fate::Execed => Some((
                EndReason::TargetExeced,
                TargetEnd {
                    exec: program_of(self.pid),
                    source: if self.seen.exec {
                        "process events connector".into()
                    } else if self.exec_marked {
                        "sched_process_exec tracepoint".into()
                    } else {
                        "the target's memory map changed".into()
                    },
                    ..TargetEnd::default()
                },
            )),
        }
    }

    /// The target is exiting or gone: wait (at most `limit`) for its status, from the
    /// connector or its zombie. Past the limit (or gone, with no connector to hear from), the
    /// end without a status: `fallback`, or why the status is unknown.
    fn wait_for_status(
        &mut self,
        limit: Duration,
        fallback: Option<(EndReason, TargetEnd)>,
    ) -> (EndReason, TargetEnd) {
        let deadline = Instant::now() + limit;
        loop {
            let stat = read_stat(self.pid);
            if let Some(ev) = self.events.as_mut() {
                ev.drain(self.pid, &mut self.seen);
            }
            let connector = self.events.is_some();
            let unknown = match decide(self.start, None, None, stat, self.seen, connector) {
                Fate::Ended(r, e) if e.exit_status.is_some() || e.signal.is_some() => {
                    return (r, e);
                }
                Fate::Ended(r, e) => Some((r, e)),
                _ => None,
            };
            let late = Instant::now() >= deadline;
            if late || (unknown.is_some() && !connector) {
                return fallback.or(unknown).unwrap_or_else(|| {
                    (
                        EndReason::TargetExited,
                        TargetEnd {
                            source: format!(
                                "status unknown: still exiting after {:.1} s",
                                limit.as_secs_f64()
                            ),
                            ..TargetEnd::default()
                        },
                    )
                });
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// What one look at the target concludes.
#[derive(Clone, Debug, PartialEq)]
pub enum Fate {
    Running,
    /// In `do_exit`: the status comes soon.
    Exiting,
    Execed,
    Ended(EndReason, TargetEnd),
}

/// The pure part of [`Watch::check`]: from the attach-time facts, the maps and stat read now
/// (maps first) and what the connector said.
pub fn decide(
    start: Option<u64>,
    python_base: Option<u64>,
    python_base_now: Option<Option<u64>>,
    stat: Option<Stat>,
    seen: Seen,
    connector: bool,
) -> Fate {
    let unknown = |why: &str| {
        Fate::Ended(
            EndReason::TargetExited,
            TargetEnd {
                source: format!("status unknown: {why}"),
                ..TargetEnd::default()
            },
        )
    };
    let gone_why = if connector {
        "its exit event was not received (connector buffer overflow?)"
    } else {
        "reaped by its parent before the daemon looked (not the daemon's child; the process \
         events connector, which would have reported it, is unavailable)"
    };
    if let Some(code) = seen.exit {
        // The main thread has exited: the process ends (or lingers as a zombie leader).
        let (r, e) = from_wait_status(code, "process events connector");
        return Fate::Ended(r, e);
    }
    let Some(st) = stat else {
        return unknown(gone_why);
    };
    if start.is_some_and(|s| s != st.start) {
        return unknown(&format!(
            "{gone_why}; its pid now belongs to another process"
        ));
    }
    if st.zombie() {
        return match st.exit_code {
            Some(code) => {
                let (r, e) = from_wait_status(code, "/proc/<pid>/stat of the zombie");
                Fate::Ended(r, e)
            }
            None => unknown("the kernel does not show a zombie's exit code"),
        };
    }
    if st.exiting() {
        return Fate::Exiting;
    }
    if seen.exec {
        return Fate::Execed;
    }
    match python_base_now {
        // The evaluator's file moved or is gone from a process that is not exiting: execve.
        Some(now) if now != python_base => Fate::Execed,
        _ => Fate::Running,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Recorded on this kernel (6.18): a running process, a process in `do_exit` (state `R`,
    /// `PF_EXITING` in flags, its memory already gone: address fields 0) and a zombie that
    /// exited with status 3 (field 52 = 768). Start times set to one value.
    const RUNNING: &str = "4242 (python3.12) S 7502 7500 10908 0 -1 4194304 76 0 0 0 0 0 0 0 20 0 \
        1 0 1234567 2990080 406 18446744073709551615 94079714770944 94079714788873 \
        140724328794544 0 0 0 0 0 0 1 0 0 17 0 0 0 0 0 0 94079714802960 94079714804224 \
        94079924084736 140724328798521 140724328798529 140724328798529 140724328800233 0\n";
    const EXITING: &str = "4242 (python3.12) R 7502 7500 10908 0 -1 4227076 1933 0 0 0 3 0 0 0 20 \
        0 1 0 1234567 0 0 18446744073709551615 0 0 0 0 0 0 0 16781312 0 1 0 0 17 1 0 0 0 0 0 0 \
        0 0 0 0 0 0 0\n";
    const ZOMBIE: &str = "4242 (python3.12) Z 7502 7500 10908 0 -1 4227084 1933 0 0 0 3 0 0 0 20 \
        0 1 0 1234567 0 0 18446744073709551615 0 0 0 0 0 0 0 16781312 0 1 0 0 17 1 0 0 0 0 0 0 \
        0 0 0 0 0 0 768\n";

    fn stat(text: &str) -> Option<Stat> {
        procinfo::stat_from(text.as_bytes())
            .as_ref()
            .map(Stat::from)
    }

    #[test]
    fn stat_fields() {
        let r = stat(RUNNING).unwrap();
        assert_eq!(
            (r.state, r.start, r.exiting(), r.zombie()),
            ('S', 1234567, false, false)
        );
        let e = stat(EXITING).unwrap();
        assert!(e.exiting() && !e.zombie());
        let z = stat(ZOMBIE).unwrap();
        assert_eq!(z.exit_code, Some(768));
        assert!(z.zombie());
        // A comm with spaces, parentheses and invalid UTF-8.
        let odd = RUNNING.replace("(python3.12)", "(a) b (\u{fffd}c)");
        assert_eq!(stat(&odd).unwrap(), r);
        assert_eq!(stat("garbage"), None);
    }

    #[test]
    fn wait_statuses() {
        let (r, e) = from_wait_status(3 << 8, "x");
        assert_eq!(
            (r, e.exit_status, e.signal),
            (EndReason::TargetExited, Some(3), None)
        );
        let (r, e) = from_wait_status(9, "x");
        assert_eq!(r, EndReason::TargetKilled);
        assert_eq!(
            (e.signal, e.signal_name.as_deref()),
            (Some(9), Some("SIGKILL"))
        );
        let (_, e) = from_wait_status(11 | 0x80, "x");
        assert!(e.core_dumped);
        assert_eq!(e.signal_name.as_deref(), Some("SIGSEGV"));
    }

    const BASE: Option<u64> = Some(0x7f00_0000_0000);

    fn decide_now(now: Option<Option<u64>>, line: &str, seen: Seen) -> Fate {
        decide(Some(1234567), BASE, now, stat(line), seen, false)
    }

    #[test]
    fn an_exiting_process_is_not_an_exec() {
        // Maps emptied by exit_mm, state still R: the misreport this module fixes.
        assert_eq!(
            decide_now(Some(None), EXITING, Seen::default()),
            Fate::Exiting
        );
        assert_eq!(decide_now(None, EXITING, Seen::default()), Fate::Exiting);
        assert_eq!(
            decide_now(Some(BASE), RUNNING, Seen::default()),
            Fate::Running
        );
        // Not exiting, libpython gone or moved: execve.
        assert_eq!(
            decide_now(Some(None), RUNNING, Seen::default()),
            Fate::Execed
        );
        assert_eq!(
            decide_now(Some(Some(1)), RUNNING, Seen::default()),
            Fate::Execed
        );
        let exec = Seen {
            exec: true,
            exit: None,
        };
        assert_eq!(decide_now(Some(BASE), RUNNING, exec), Fate::Execed);
    }

    #[test]
    fn ends_with_the_status_when_known() {
        match decide_now(Some(None), ZOMBIE, Seen::default()) {
            Fate::Ended(EndReason::TargetExited, e) => assert_eq!(e.exit_status, Some(3)),
            d => panic!("{d:?}"),
        }
        let killed = Seen {
            exit: Some(15),
            exec: false,
        };
        match decide_now(Some(None), EXITING, killed) {
            Fate::Ended(EndReason::TargetKilled, e) => {
                assert_eq!(e.signal_name.as_deref(), Some("SIGTERM"));
                assert_eq!(e.source, "process events connector");
            }
            d => panic!("{d:?}"),
        }
        // Gone without a word: exited, status unknown, and why.
        match decide(Some(1), BASE, None, None, Seen::default(), false) {
            Fate::Ended(EndReason::TargetExited, e) => {
                assert_eq!(e.exit_status, None);
                assert!(e.source.contains("not the daemon's child"), "{}", e.source);
            }
            d => panic!("{d:?}"),
        }
        // The pid now belongs to another process.
        match decide(
            Some(1),
            BASE,
            Some(BASE),
            stat(RUNNING),
            Seen::default(),
            true,
        ) {
            Fate::Ended(EndReason::TargetExited, e) => {
                assert!(e.source.contains("another process"), "{}", e.source)
            }
            d => panic!("{d:?}"),
        }
    }

    /// Datagrams as the kernel sends them (x86_64, little endian): an exec, then two exits of
    /// the target's threads (a worker thread's, then the main thread's with status 0x0100),
    /// and a fork event of another process.
    fn datagram(what: u32, data: &[u32]) -> Vec<u8> {
        let mut ev = Vec::new();
        ev.extend_from_slice(&what.to_le_bytes());
        ev.extend_from_slice(&3u32.to_le_bytes()); // cpu
        ev.extend_from_slice(&123_456_789u64.to_le_bytes());
        for d in data {
            ev.extend_from_slice(&d.to_le_bytes());
        }
        let mut cn = Vec::new();
        for v in [CN_IDX_PROC, CN_VAL_PROC, 7, 0] {
            cn.extend_from_slice(&v.to_le_bytes());
        }
        cn.extend_from_slice(&(ev.len() as u16).to_le_bytes());
        cn.extend_from_slice(&0u16.to_le_bytes());
        cn.extend_from_slice(&ev);
        let mut nl = Vec::new();
        nl.extend_from_slice(&((NLMSG_HDRLEN + cn.len()) as u32).to_le_bytes());
        nl.extend_from_slice(&3u16.to_le_bytes());
        nl.extend_from_slice(&[0; 10]);
        nl.extend_from_slice(&cn);
        nl
    }

    #[test]
    fn connector_datagrams() {
        let exec = datagram(PROC_EVENT_EXEC, &[4242, 4242]);
        assert_eq!(
            parse_datagram(&exec),
            [ProcEvent::Exec {
                pid: 4242,
                tgid: 4242
            }]
        );
        let thread_exit = datagram(PROC_EVENT_EXIT, &[4250, 4242, 0x100, 17, 4200, 4200]);
        let main_exit = datagram(PROC_EVENT_EXIT, &[4242, 4242, 0x100, 17, 4200, 4200]);
        let fork = datagram(1, &[4200, 4200, 5000, 5000]);
        let mut seen = Seen::default();
        fold(&mut seen, &parse_datagram(&thread_exit), 4242);
        assert_eq!(seen.exit, None, "a thread's exit is not the end");
        fold(&mut seen, &parse_datagram(&fork), 4242);
        fold(&mut seen, &parse_datagram(&main_exit), 4242);
        assert_eq!(seen.exit, Some(0x100));
        let mut other = Seen::default();
        fold(&mut other, &parse_datagram(&exec), 1);
        assert_eq!(other, Seen::default());
        // Truncated and garbage datagrams parse to nothing, without panicking.
        for cut in 0..main_exit.len() {
            let _ = parse_datagram(&main_exit[..cut]);
        }
        assert!(parse_datagram(&[0xff; 64]).is_empty());
    }
}
