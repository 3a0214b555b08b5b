//! The single-pid run as people watch it: `traceml-daemon top` and the default attach's liveness
//! line. Runs [`live::run`] on one thread while folding its stream into the run's [`Collector`]
//! (and, for `top`, two overlapping window collectors, so "the last window" always reaches 5 to
//! 10 s back), and on a timer summarises them and shows them:
//!
//! - [`Display::Screen`]: the full-screen view ([`crate::render::top`]) on the terminal, refreshed
//!   every second; `q`, Esc or Ctrl-C (and SIGINT/SIGTERM/SIGHUP) detach. The terminal is put
//!   back (raw mode off, main screen, cursor shown) by a guard's `Drop` on every path, and what
//!   was written to stderr meanwhile (the daemon's own log) is kept aside and shown after it.
//! - [`Display::Lines`]: `top` with stdout not a terminal: one plain line per second.
//! - [`Display::Liveness`]: the default attach on a terminal: one line on stderr, refreshed in
//!   place every few seconds and cleared before the caller prints the card.
//!
//! The caller writes the summary files from the returned collector, as for any run.
use std::cell::RefCell;
use std::fs::File;
use std::io::{self, IsTerminal, Read, Seek, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::crossterm::{cursor, execute, terminal};
use tokio::sync::watch;

use crate::analysis::Collector;
use crate::event::{EndReason, StreamItem};
use crate::live::{self, LiveError};
use crate::render::top::{LiveView, draw, liveness_line, plain_line};

/// How the run is shown while it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Display {
    /// The full-screen live view (stdout is a terminal).
    Screen,
    /// One plain line per second on stdout (`top` when stdout is not a terminal).
    Lines,
    /// A liveness line on stderr, refreshed in place (the default attach on a terminal).
    Liveness,
    /// Nothing.
    Silent,
}

/// How long "the last window" reaches back at most; a new window starts every half of it.
pub const WINDOW: Duration = Duration::from_secs(10);
/// Refresh period of the screen and of the plain lines.
const REFRESH: Duration = Duration::from_secs(1);
/// Refresh period of the liveness line.
const LIVENESS_REFRESH: Duration = Duration::from_secs(2);
/// How often keys are read (non-blocking) while the screen is up.
const KEY_POLL: Duration = Duration::from_millis(50);

/// What a driven run leaves: how it ended, and the fold of everything it streamed.
pub struct Outcome {
    pub result: Result<EndReason, LiveError>,
    pub collector: Collector,
}

/// The run's fold, and the two window folds when something shows them.
struct Folds {
    run: Collector,
    windows: Option<Windows>,
    /// The probes are attached (the first probe set was announced).
    attached: bool,
}

/// Two overlapping windows: `older` began up to [`WINDOW`] ago, `newer` half a window later;
/// every half window the older is dropped and a fresh one starts.
struct Windows {
    older: Collector,
    newer: Collector,
    older_since: Instant,
    newer_since: Instant,
}

impl Folds {
    fn push(&mut self, item: &StreamItem) {
        if matches!(item, StreamItem::ProbeSet(_)) {
            self.attached = true;
        }
        self.run.push(item);
        if let Some(w) = &mut self.windows {
            w.older.push(item);
            w.newer.push(item);
        }
    }

    fn rotate(&mut self, now: Instant) {
        let Some(w) = &mut self.windows else { return };
        if now.duration_since(w.newer_since) >= WINDOW / 2 {
            w.older = std::mem::replace(&mut w.newer, self.run.fresh_window());
            w.older_since = std::mem::replace(&mut w.newer_since, now);
        }
    }
}

/// Attaches with `opts` and runs until the target ends, or the user or a signal stops it; every
/// item, once folded, also goes to `sink` with the run's fold (a recording, an exporter). Fails
/// only when the terminal cannot be set up.
pub fn run(
    mut opts: live::Options,
    display: Display,
    sink: impl FnMut(&StreamItem, &Collector) -> Result<(), String>,
) -> io::Result<Outcome> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let start = Instant::now();
    let folds = Rc::new(RefCell::new(Folds {
        run: Collector::new(),
        windows: matches!(display, Display::Screen | Display::Lines).then(|| Windows {
            older: Collector::new(),
            newer: Collector::new(),
            older_since: start,
            newer_since: start,
        }),
        attached: false,
    }));
    let result = match display {
        Display::Screen => {
            // The run leaves the signals to us: raw mode turns Ctrl-C into a key.
            let (tx, rx) = watch::channel(None);
            opts.stop = Some(rx);
            let mut screen = Screen::enter()?;
            let show = |f: &Folds, now: Instant, screen: &mut Screen| {
                let _ = screen.draw(f, opts.pid, start, now);
            };
            rt.block_on(screen_loop(&opts, &folds, sink, tx, &mut screen, show))?
        }
        Display::Lines => rt.block_on(timed_loop(&opts, &folds, sink, REFRESH, |f, now| {
            let (window, run, window_s) = snapshots(f, now);
            let v = LiveView {
                pid: opts.pid,
                elapsed_s: now.duration_since(start).as_secs_f64(),
                attached: f.attached,
                window_s,
                window: &window,
                run: &run,
            };
            let mut out = io::stdout().lock();
            let _ = writeln!(out, "{}", plain_line(&v)).and_then(|_| out.flush());
        })),
        Display::Liveness => {
            let mut line = LivenessLine::default();
            line.show(&liveness_line(
                opts.pid,
                0.0,
                false,
                &Collector::new().snapshot(),
                columns(),
            ));
            let pid = opts.pid;
            rt.block_on(timed_loop(
                &opts,
                &folds,
                sink,
                LIVENESS_REFRESH,
                |f, now| {
                    line.show(&liveness_line(
                        pid,
                        now.duration_since(start).as_secs_f64(),
                        f.attached,
                        &f.run.snapshot(),
                        columns(),
                    ))
                },
            ))
            // `line` is cleared when dropped, before the caller prints anything.
        }
        Display::Silent => rt.block_on(timed_loop(&opts, &folds, sink, REFRESH, |_, _| {})),
    };
    let Ok(folds) = Rc::try_unwrap(folds).map(RefCell::into_inner) else {
        unreachable!("the run and its sink are gone");
    };
    Ok(Outcome {
        result,
        collector: folds.run,
    })
}

/// The window's and the run's summaries now, and how far back the window reaches.
fn snapshots(f: &Folds, now: Instant) -> (crate::summary::Summary, crate::summary::Summary, f64) {
    let run = f.run.snapshot();
    match &f.windows {
        Some(w) => (
            w.older.snapshot(),
            run,
            now.duration_since(w.older_since).as_secs_f64(),
        ),
        None => (run.clone(), run, 0.0),
    }
}

/// The sink of the live run: folds each item, then hands it on.
fn folding(
    folds: &Rc<RefCell<Folds>>,
    mut sink: impl FnMut(&StreamItem, &Collector) -> Result<(), String>,
) -> impl FnMut(&StreamItem) -> Result<(), String> {
    let folds = folds.clone();
    move |item| {
        let mut f = folds.borrow_mut();
        f.push(item);
        sink(item, &f.run)
    }
}

/// The run with a timer: `show` every `every` until the run ends (signals are the run's own).
async fn timed_loop(
    opts: &live::Options,
    folds: &Rc<RefCell<Folds>>,
    sink: impl FnMut(&StreamItem, &Collector) -> Result<(), String>,
    every: Duration,
    mut show: impl FnMut(&Folds, Instant),
) -> Result<EndReason, LiveError> {
    let run = live::run(opts, folding(folds, sink));
    tokio::pin!(run);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            r = &mut run => return r,
            _ = tick.tick() => {
                let now = Instant::now();
                let mut f = folds.borrow_mut();
                f.rotate(now);
                show(&f, now);
            }
        }
    }
}

/// The run under the full-screen view: redraws every second and on resize, reads keys, and
/// turns `q`/Esc/Ctrl-C and signals into a stop.
async fn screen_loop(
    opts: &live::Options,
    folds: &Rc<RefCell<Folds>>,
    sink: impl FnMut(&StreamItem, &Collector) -> Result<(), String>,
    stop: watch::Sender<Option<EndReason>>,
    screen: &mut Screen,
    mut show: impl FnMut(&Folds, Instant, &mut Screen),
) -> io::Result<Result<EndReason, LiveError>> {
    use tokio::signal::unix::{SignalKind, signal};
    let (mut int, mut term, mut hup) = (
        signal(SignalKind::interrupt())?,
        signal(SignalKind::terminate())?,
        signal(SignalKind::hangup())?,
    );
    show(&folds.borrow(), Instant::now(), screen);
    let run = live::run(opts, folding(folds, sink));
    tokio::pin!(run);
    let mut refresh = tokio::time::interval(REFRESH);
    let mut keys = tokio::time::interval(KEY_POLL);
    for t in [&mut refresh, &mut keys] {
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    }
    let request = |reason| {
        stop.send_if_modified(|r| {
            let first = r.is_none();
            r.get_or_insert(reason);
            first
        });
    };
    loop {
        tokio::select! {
            r = &mut run => return Ok(r),
            _ = refresh.tick() => {
                let now = Instant::now();
                let mut f = folds.borrow_mut();
                f.rotate(now);
                show(&f, now, screen);
            }
            _ = keys.tick() => match read_keys() {
                Keys::Quit => request(EndReason::Interrupted),
                Keys::Redraw => show(&folds.borrow(), Instant::now(), screen),
                Keys::None => {}
            },
            _ = int.recv() => request(EndReason::Interrupted),
            _ = term.recv() => request(EndReason::Terminated),
            _ = hup.recv() => request(EndReason::Terminated),
        }
    }
}

enum Keys {
    None,
    Quit,
    Redraw,
}

/// The keys pressed since the last look, without waiting.
fn read_keys() -> Keys {
    let mut out = Keys::None;
    while let Ok(true) = event::poll(Duration::ZERO) {
        match event::read() {
            Ok(Event::Key(k)) if k.kind != KeyEventKind::Release => {
                let ctrl_c =
                    k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                if ctrl_c || matches!(k.code, KeyCode::Char('q' | 'Q') | KeyCode::Esc) {
                    return Keys::Quit;
                }
            }
            Ok(Event::Resize(..)) => out = Keys::Redraw,
            Ok(_) => {}
            Err(_) => break,
        }
    }
    out
}

/// The terminal while the live view is up. Dropping it puts the terminal back (raw mode off,
/// the main screen, the cursor) and then shows what was written to stderr meanwhile.
struct Screen {
    terminal: Terminal<CrosstermBackend<io::Stdout>>,
    /// Declared after `terminal`: restored after the terminal is.
    _stderr: Option<StderrAside>,
}

impl Screen {
    fn enter() -> io::Result<Screen> {
        // Set aside first: from here on a log line would draw over the view.
        let stderr = StderrAside::new()?;
        terminal::enable_raw_mode()?;
        // Built before anything can fail, so that the guard restores from here on.
        let mut s = Screen {
            terminal: Terminal::new(CrosstermBackend::new(io::stdout()))?,
            _stderr: stderr,
        };
        // Not `Terminal::clear`: it asks the terminal where the cursor is, and waits for an
        // answer some terminals never give.
        execute!(
            s.terminal.backend_mut(),
            terminal::EnterAlternateScreen,
            cursor::Hide,
            terminal::Clear(terminal::ClearType::All)
        )?;
        Ok(s)
    }

    fn draw(&mut self, f: &Folds, pid: u32, start: Instant, now: Instant) -> io::Result<()> {
        let (window, run, window_s) = snapshots(f, now);
        let v = LiveView {
            pid,
            elapsed_s: now.duration_since(start).as_secs_f64(),
            attached: f.attached,
            window_s,
            window: &window,
            run: &run,
        };
        self.terminal.draw(|frame| draw(frame, &v))?;
        Ok(())
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = execute!(
            self.terminal.backend_mut(),
            terminal::LeaveAlternateScreen,
            cursor::Show
        );
        let _ = terminal::disable_raw_mode();
        let _ = io::stdout().flush();
    }
}

/// Stderr redirected into an anonymous memory file while the live view is up (when stderr is
/// that terminal); on drop, restored and what was written meanwhile copied to it.
struct StderrAside {
    saved: OwnedFd,
    file: File,
}

impl StderrAside {
    fn new() -> io::Result<Option<StderrAside>> {
        if !io::stderr().is_terminal() {
            // A file or a pipe: the log cannot draw over the view, and goes there as it comes.
            return Ok(None);
        }
        let saved = io::stderr().as_fd().try_clone_to_owned()?;
        // SAFETY: the name is a NUL-terminated string; the call returns a new fd or -1.
        let fd = unsafe { libc::memfd_create(c"traceml-top-stderr".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by memfd_create and is owned by nothing else.
        let file = unsafe { File::from_raw_fd(fd) };
        redirect(file.as_raw_fd(), libc::STDERR_FILENO)?;
        Ok(Some(StderrAside { saved, file }))
    }
}

impl Drop for StderrAside {
    fn drop(&mut self) {
        if redirect(self.saved.as_raw_fd(), libc::STDERR_FILENO).is_err() {
            return;
        }
        let mut held = Vec::new();
        if self.file.rewind().is_ok() && self.file.read_to_end(&mut held).is_ok() {
            let _ = io::stderr().write_all(&held);
        }
    }
}

/// Makes `to` a copy of `from` (`dup2`).
fn redirect(from: i32, to: i32) -> io::Result<()> {
    // SAFETY: dup2 only changes the fd table; both fds are open (`from` is owned by the caller,
    // `to` is stderr) and Rust's `Stderr` holds no state about the fd besides its number.
    if unsafe { libc::dup2(from, to) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The liveness line on stderr; cleared when dropped.
#[derive(Default)]
struct LivenessLine {
    shown: bool,
}

impl LivenessLine {
    fn show(&mut self, text: &str) {
        let mut err = io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{text}").and_then(|_| err.flush());
        self.shown = true;
    }
}

impl Drop for LivenessLine {
    fn drop(&mut self) {
        if self.shown {
            let mut err = io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K").and_then(|_| err.flush());
        }
    }
}

/// Columns of the terminal on stderr (80 when unknown), less one so the line never wraps.
fn columns() -> usize {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ only writes one `winsize` through the pointer, which points to `ws`;
    // on a non-terminal it fails with ENOTTY and writes nothing.
    let rc = unsafe { libc::ioctl(libc::STDERR_FILENO, libc::TIOCGWINSZ, &mut ws) };
    let cols = if rc == 0 && ws.ws_col > 0 {
        usize::from(ws.ws_col)
    } else {
        80
    };
    cols.saturating_sub(1).max(20)
}

/// The display for a run: `top` shows the screen on a terminal and plain lines elsewhere; the
/// default attach shows the liveness line when stderr is a terminal (and not `quiet`).
pub fn display_for(top: bool, quiet: bool) -> Display {
    match (top, quiet) {
        (true, _) if io::stdout().is_terminal() => Display::Screen,
        (true, _) => Display::Lines,
        (false, false) if io::stderr().is_terminal() => Display::Liveness,
        _ => Display::Silent,
    }
}
