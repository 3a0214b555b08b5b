//! `--sched-only` (issue 38): what the thread-state source costs the node. The daemon's
//! `sched_switch` program runs on every context switch of the machine, the target's or not, and
//! exits at once for any thread it does not watch (a map lookup). Measured on a bystander that
//! does nothing but switch: two threads of this process ping-pong one byte over a socket pair, so
//! every round trip is context switches and little else. The daemon is attached (`--pid`) to a
//! sleeping Python process in some windows and not in others, inside one run of the ping-pong (windows in the order off, on, on, off, …: drift and
//! order effects cancel). The node's switches come from `/proc/stat`'s `ctxt`; the cost per
//! switch is the round trip's added time over the switches per round trip.
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};

use super::runs::{Ctx, Killer};
use super::stats::med as median;

pub const HEADING: &str = "## Thread-state source: the node's cost per context switch";

/// Seconds of each measured window, the settling time before it, and the pairs of windows.
const WINDOW_S: f64 = 3.0;
const SETTLE_S: f64 = 0.5;
const PAIRS: usize = 6;

/// One measured window: round trips, the node's context switches, seconds.
#[derive(Clone, Copy)]
pub struct Window {
    pub on: bool,
    pub round_trips: u64,
    pub switches: u64,
    pub secs: f64,
}

impl Window {
    fn ns_per_round_trip(&self) -> f64 {
        self.secs * 1e9 / self.round_trips.max(1) as f64
    }
    fn switches_per_round_trip(&self) -> f64 {
        self.switches as f64 / self.round_trips.max(1) as f64
    }
}

pub struct Sched {
    pub windows: Vec<Window>,
    /// The node's context switches per second with no ping-pong (before it starts).
    pub idle_rate: f64,
}

fn ctxt() -> u64 {
    std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("ctxt ").map(|v| v.trim().parse().ok()))
        })
        .flatten()
        .unwrap_or(0)
}

/// Pins the calling thread to CPU 0: both ping-pong threads on one CPU switch to each other
/// directly (two switches a round trip, no idle CPU to wake: an idle wake-up's latency, tens of
/// µs and noisy, would hide a cost of tens of ns).
fn pin_to_cpu0() -> anyhow::Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set)
    };
    ensure!(
        rc == 0,
        "sched_setaffinity: {}",
        std::io::Error::last_os_error()
    );
    Ok(())
}

/// Two threads bouncing one byte; `count` holds the round trips so far.
fn ping_pong(stop: Arc<AtomicBool>, count: Arc<AtomicU64>) -> anyhow::Result<()> {
    pin_to_cpu0()?;
    let (mut a, mut b) = UnixStream::pair()?;
    let echo = std::thread::spawn(move || {
        if let Err(e) = pin_to_cpu0() {
            eprintln!("xtask bench: {e}");
        }
        let mut buf = [0u8; 1];
        while b.read_exact(&mut buf).is_ok() {
            if b.write_all(&buf).is_err() {
                break;
            }
        }
    });
    let mut buf = [0u8; 1];
    while !stop.load(Ordering::Relaxed) {
        a.write_all(b"x")?;
        a.read_exact(&mut buf)?;
        count.fetch_add(1, Ordering::Relaxed);
    }
    drop(a);
    let _ = echo.join();
    Ok(())
}

fn window(on: bool, count: &AtomicU64) -> Window {
    let (c0, s0, t0) = (count.load(Ordering::Relaxed), ctxt(), Instant::now());
    std::thread::sleep(Duration::from_secs_f64(WINDOW_S));
    let (c1, s1, secs) = (
        count.load(Ordering::Relaxed),
        ctxt(),
        t0.elapsed().as_secs_f64(),
    );
    Window {
        on,
        round_trips: c1 - c0,
        switches: s1 - s0,
        secs,
    }
}

pub fn measure(ctx: &mut Ctx) -> anyhow::Result<Sched> {
    let dir = ctx.dir("sched")?;
    // The process the daemon attaches to: a Python process that sleeps (no probe of it is hit
    // and none of its threads is watched), so that the windows differ by the `sched_switch`
    // program's exit path on every switch of the node and nothing else the daemon does for a
    // training job (that is the in-process rows' and the footprint's).
    let target = Killer(Some(
        Command::new(&ctx.py)
            .args(["-c", "import time\nwhile True: time.sleep(1)"])
            .stdout(Stdio::null())
            .stderr(File::create(dir.join("target.stderr"))?)
            .spawn()
            .context("starting the sleeping target")?,
    ));
    let tpid = target.0.as_ref().unwrap().id();
    let (s0, t0) = (ctxt(), Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    let idle_rate = (ctxt() - s0) as f64 / t0.elapsed().as_secs_f64();

    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let pinger = {
        let (stop, count) = (stop.clone(), count.clone());
        std::thread::spawn(move || ping_pong(stop, count))
    };
    std::thread::sleep(Duration::from_secs(1));
    let mut windows = Vec::new();
    let result = (|| -> anyhow::Result<()> {
        for i in 0..PAIRS * 2 {
            // off on | on off | off on | …
            let on = matches!(i % 4, 1 | 2);
            if !on {
                std::thread::sleep(Duration::from_secs_f64(SETTLE_S));
                windows.push(window(false, &count));
                continue;
            }
            let out = dir.join(format!("out-{i}"));
            let ready = dir.join(format!("ready-{i}"));
            let mut d = Killer(Some(
                Command::new(&ctx.daemon)
                    .args(["--pid", &tpid.to_string(), "--quiet", "--output"])
                    .arg(&out)
                    .arg("--ready-file")
                    .arg(&ready)
                    .stdout(Stdio::null())
                    .stderr(File::create(dir.join(format!("daemon-{i}.stderr")))?)
                    .spawn()
                    .context("starting traceml-daemon")?,
            ));
            let t = Instant::now();
            while !ready.exists() {
                if t.elapsed() > Duration::from_secs(30) {
                    bail!("the daemon did not attach; see {}", dir.display());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            std::thread::sleep(Duration::from_secs_f64(SETTLE_S));
            windows.push(window(true, &count));
            let child = d.0.take().unwrap();
            let _ = Command::new("kill")
                .args(["-INT", &child.id().to_string()])
                .status();
            let st = child.wait_with_output()?.status;
            ensure!(st.success(), "traceml-daemon: {st}");
            ensure!(
                out.join("final_summary.json").exists(),
                "no summary in {}",
                out.display()
            );
        }
        Ok(())
    })();
    stop.store(true, Ordering::Relaxed);
    let _ = pinger.join();
    drop(target);
    result?;
    Ok(Sched { windows, idle_rate })
}

pub fn section(s: &Sched, daemon: &str, load: &str, commit: &str) -> String {
    let pairs: Vec<(Window, Window)> = s
        .windows
        .chunks(2)
        .filter_map(|c| match c {
            [a, b] if a.on != b.on => Some(if a.on { (*a, *b) } else { (*b, *a) }),
            _ => None,
        })
        .collect();
    let mut ratio: Vec<f64> = Vec::new();
    let mut per_k: Vec<f64> = Vec::new();
    let mut out = format!(
        "{HEADING}\n\n\
         Written by `cargo xtask bench --sched-only` at commit {commit}; `{daemon}`. The \
         daemon's `sched_switch` program (the source of each phase's on-CPU / blocked time) runs \
         on every context switch of the node and returns at once for threads it does not watch. \
         A bystander that does nothing but switch — two threads of the bench, pinned to CPU 0, \
         bouncing one byte over a socket pair (each round trip two direct switches, no idle CPU \
         woken) — runs for the whole measurement; `traceml-daemon --pid` is attached \
         to a sleeping Python process (no probe hit, no thread watched: every switch takes the \
         program's exit path, and the daemon has nothing else to do) in the *on* windows and is \
         stopped in the *off* ones, {WINDOW_S:.0} s each after {SETTLE_S} s of settling, in \
         the order off on · on off · … (order and drift cancel over the pairs). Switches are the \
         node's, from `/proc/stat` `ctxt`. Cost per 1,000 switches = (round trip on − round trip \
         off) ÷ switches per round trip × 1,000. The node switched {:.0} times a second before the \
         bystander started. Load average before: {load}.\n\n\
         | pair | round trip off / on | switches per round trip | on/off | added per 1,000 switches |\n\
         |---|---|---|---|---|\n",
        s.idle_rate
    );
    for (k, (on, off)) in pairs.iter().enumerate() {
        let r = on.ns_per_round_trip() / off.ns_per_round_trip();
        let per = (on.ns_per_round_trip() - off.ns_per_round_trip())
            / on.switches_per_round_trip().max(1e-9);
        ratio.push(r);
        per_k.push(per);
        out += &format!(
            "| {} | {:.2} / {:.2} µs | {:.2} | {:.4} | {:.1} µs |\n",
            k + 1,
            off.ns_per_round_trip() / 1e3,
            on.ns_per_round_trip() / 1e3,
            on.switches_per_round_trip(),
            r,
            per
        );
    }
    let (mr, mp) = (median(&ratio), median(&per_k));
    let (lo, hi) = per_k
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
    out += &format!(
        "\n**Median: {mp:.1} µs per 1,000 context switches of the node** (pairs {lo:.1} … \
         {hi:.1} µs; round trip on/off {mr:.4}). At the {:.0} switches a second this node made \
         at rest that is {:.3} ms of CPU a second ({:.4} % of one core); a busy GPU node at \
         50,000 switches a second would pay {:.2} % of one core. The target's own watched threads pay \
         more per switch (an event to the ring, folded by the daemon): that cost is in the \
         in-process rows (section 6).\n",
        s.idle_rate,
        mp * s.idle_rate / 1e6,
        mp * s.idle_rate / 1e7,
        mp * 50_000.0 / 1e7,
    );
    out
}
