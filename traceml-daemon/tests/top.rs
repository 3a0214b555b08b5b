//! `traceml-daemon top` on a real pseudo-terminal (issue 14): attached to a running input-bound
//! fake-torch loop, the screen (read back through a VT100 emulator) shows the live phases with
//! input_wait's share while the job runs; `q` (and, attached again, Ctrl-C) detaches with status
//! 0, the terminal is put back (alternate screen left, cursor shown, raw mode off), the daemon's
//! log written meanwhile is shown after it, and the summary files and card are written.
mod support;

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::*;

const ROWS: u16 = 30;
const COLS: u16 = 80;

/// A pseudo-terminal of ROWS × COLS: (master, slave).
fn openpty() -> (OwnedFd, OwnedFd) {
    let (mut master, mut slave) = (-1, -1);
    let ws = libc::winsize {
        ws_row: ROWS,
        ws_col: COLS,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: openpty writes two fds through the pointers, which point to live locals; the name
    // and termios pointers may be null; `ws` outlives the call.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            &ws,
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both fds were just opened by openpty and are owned by nothing else.
    unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) }
}

/// A daemon process, killed on drop.
struct Daemon(std::process::Child);
impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The screen the bytes written so far draw, as text.
fn screen(bytes: &[u8]) -> (String, bool) {
    let mut p = vt100::Parser::new(
        std::num::NonZeroU16::new(ROWS).unwrap(),
        std::num::NonZeroU16::new(COLS).unwrap(),
        0,
    );
    p.process(bytes);
    (p.screen().contents(), p.screen().alternate_screen())
}

/// The input_wait row of the live view with a measured share (`input_wait ███… 83%  30.1 ms`).
fn input_wait_share(screen: &str) -> Option<u32> {
    let row = screen
        .lines()
        .find(|l| l.trim_start().starts_with("input_wait"))?;
    let pct = row.split_whitespace().find(|w| w.ends_with('%'))?;
    pct.trim_end_matches('%')
        .parse::<f64>()
        .ok()
        .map(|p| p as u32)
}

#[test]
fn top_on_a_pty_shows_live_phases_and_detaches_on_q() {
    if !root_or_skip() {
        return;
    }
    let dir = scratch("top-pty");
    let mut cmd = faketorch_workload("input_bound_single.py");
    cmd.args(["--steps", "5000"]);
    let target = spawn(cmd, &dir);
    // `q`, then (the job still running) a second attach detached with Ctrl-C, which raw mode
    // delivers as a key.
    top_until_key(&target, &dir.join("out-q"), b"q");
    top_until_key(&target, &dir.join("out-ctrl-c"), b"\x03");
    drop(target);
}

/// Runs `top` on the target in a pty until the live phases show, then presses `key` and checks
/// a clean detach.
fn top_until_key(target: &Target, out: &std::path::Path, key: &[u8]) {
    let (master, slave) = openpty();
    let stdio = || Stdio::from(slave.try_clone().unwrap());
    let mut daemon = Command::new(daemon());
    daemon
        .arg("top")
        .arg("--pid")
        .arg(target.child.id().to_string())
        .arg("--ready-file")
        .arg(&target.ready)
        .arg("--output")
        .arg(out)
        .env("TERM", "xterm-256color")
        .env("TRACEML_LOG", "info")
        .stdin(stdio())
        .stdout(stdio())
        .stderr(stdio());
    // SAFETY: setsid and ioctl are async-signal-safe; the closure touches no memory of the
    // parent. A session of its own with the pty as controlling terminal: /dev/tty is the pty.
    unsafe {
        daemon.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut daemon = Daemon(daemon.spawn().expect("start traceml-daemon top"));

    // Everything the daemon writes, read as it comes (a full pty would block it).
    let bytes = Arc::new(Mutex::new(Vec::new()));
    let mut reader = std::fs::File::from(master.try_clone().unwrap());
    {
        let bytes = bytes.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                bytes.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
    }

    // Live phases while the job runs.
    let t = Instant::now();
    let live = loop {
        let (text, alternate) = screen(&bytes.lock().unwrap());
        if alternate
            && text.contains("INPUT-BOUND")
            && input_wait_share(&text).is_some_and(|p| p >= 40)
        {
            break text;
        }
        if let Ok(Some(status)) = daemon.0.try_wait() {
            panic!(
                "top exited ({status}) before showing live phases:\n{}",
                String::from_utf8_lossy(&bytes.lock().unwrap())
            );
        }
        assert!(
            t.elapsed() < Duration::from_secs(90),
            "no live input_wait share within 90 s; screen:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(live.contains("PHASES"), "{live}");
    assert!(live.contains("STEP TIME"), "{live}");
    for line in live.lines() {
        assert!(line.chars().count() <= usize::from(COLS), "{line:?}");
    }
    eprintln!("live screen:\n{live}");

    let mut keys = std::fs::File::from(master.try_clone().unwrap());
    keys.write_all(key).unwrap();
    let t = Instant::now();
    let status = loop {
        if let Some(s) = daemon.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "top did not exit within 30 s of {key:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    // The last bytes reach the reader.
    std::thread::sleep(Duration::from_millis(500));
    let all = bytes.lock().unwrap().clone();
    let text = String::from_utf8_lossy(&all);
    assert!(status.success(), "top exited with {status}:\n{text}");

    // The terminal is put back: the alternate screen entered and left, the cursor shown again,
    // raw mode off (the line discipline echoes and reads lines again).
    let enter = text.find("\x1b[?1049h").expect("alternate screen entered");
    let leave = text.rfind("\x1b[?1049l").expect("alternate screen left");
    assert!(leave > enter, "left after entering");
    assert!(
        text[leave..].contains("\x1b[?25h"),
        "cursor shown after leaving"
    );
    let (after, alternate) = screen(&all);
    assert!(!alternate, "back on the main screen:\n{after}");
    // SAFETY: tcgetattr writes one termios through the pointer, which points to a local.
    let mut tio: libc::termios = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::tcgetattr(slave.as_raw_fd(), &mut tio) }, 0);
    assert!(
        tio.c_lflag & libc::ICANON != 0 && tio.c_lflag & libc::ECHO != 0,
        "raw mode left on the terminal"
    );

    // The daemon's log (info here) did not draw over the view: written while the view was up,
    // it is shown after the terminal is put back.
    assert!(
        !text[enter..leave].contains("attached to"),
        "log line inside the view:\n{text}"
    );
    assert!(text[leave..].contains("attached to"), "log kept:\n{text}");

    // The usual end of a run: the card on the terminal, the summary files.
    assert!(text[leave..].contains("VERDICT"), "card printed:\n{text}");
    assert!(out.join("final_summary.json").exists(), "{text}");
    assert!(out.join("final_report.html").exists());
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("final_summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["data_quality"]["end_reason"], "interrupted");
    assert!(summary["steps"]["count"].as_u64().unwrap() > 0);
}
