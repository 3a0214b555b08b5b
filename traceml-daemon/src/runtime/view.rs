//! The single-pid run as people watch it: `traceml-daemon top` and the default attach's liveness
//! line. The run is the target's task ([`task::drive`]) with one more sink, the display, which
//! folds two overlapping windows (so "the last window" always reaches 5 to 10 s back) and on its
//! tick summarises them and shows them:
//!
//! - [`Display::Screen`]: the full-screen view ([`crate::render::top`]) on the terminal, refreshed
//!   every second; `q`, Esc or Ctrl-C (and SIGINT/SIGTERM/SIGHUP) detach. The terminal is put
//!   back (raw mode off, main screen, cursor shown) by a guard's `Drop` on every path, and what
//!   was written to stderr meanwhile (the daemon's own log) is kept aside and shown after it.
//! - [`Display::Lines`]: `top` with stdout not a terminal: one plain line per second.
//! - [`Display::Liveness`]: the default attach on a terminal: one line on stderr, refreshed in
//!   place every few seconds and cleared before the caller prints the card.
//!
//! The caller writes the summary files from the returned outcome, as for any run.
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
use crate::render::top::{LiveView, draw, liveness_line, plain_line};
use crate::runtime::target::Options;
use crate::runtime::task::{self, Ended, Folds, Outcome, Sink, Sinks};

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
/// Refresh period of the liveness line.
const LIVENESS_REFRESH: Duration = Duration::from_secs(2);
/// How often keys are read (non-blocking) while the screen is up.
const KEY_POLL: Duration = Duration::from_millis(50);

/// Two overlapping windows: `older` began up to [`WINDOW`] ago, `newer` half a window later;
/// every half window the older is dropped and a fresh one starts.
struct Windows {
    older: Collector,
    newer: Collector,
    older_since: Instant,
    newer_since: Instant,
}

impl Windows {
    fn new(start: Instant) -> Windows {
        Windows {
            older: Collector::new(),
            newer: Collector::new(),
            older_since: start,
            newer_since: start,
        }
    }

    fn rotate(&mut self, run: &Collector, now: Instant) {
        if now.duration_since(self.newer_since) >= WINDOW / 2 {
            self.older = std::mem::replace(&mut self.newer, run.fresh_window());
            self.older_since = std::mem::replace(&mut self.newer_since, now);
        }
    }
}

/// Where the view goes.
enum Shown {
    Screen(Rc<RefCell<Screen>>),
    Lines,
    Liveness(LivenessLine),
}

/// The display as a sink of the target's task.
struct View {
    pid: u32,
    start: Instant,
    windows: Option<Windows>,
    shown: Shown,
    last: Instant,
}

impl View {
    fn show(&mut self, f: &Folds, now: Instant) {
        let elapsed_s = now.duration_since(self.start).as_secs_f64();
        if let Shown::Liveness(line) = &mut self.shown {
            let text = liveness_line(
                self.pid,
                elapsed_s,
                f.attached,
                &f.run.snapshot(),
                columns(),
            );
            line.show(&text);
            return;
        }
        let run = f.run.snapshot();
        let (window, window_s) = match &self.windows {
            Some(w) => (
                w.older.snapshot(),
                now.duration_since(w.older_since).as_secs_f64(),
            ),
            None => (run.clone(), 0.0),
        };
        let v = LiveView {
            pid: self.pid,
            elapsed_s,
            attached: f.attached,
            window_s,
            window: &window,
            run: &run,
        };
        match &self.shown {
            Shown::Screen(screen) => {
                let _ = screen.borrow_mut().draw(&v);
            }
            Shown::Lines => {
                let mut out = io::stdout().lock();
                let _ = writeln!(out, "{}", plain_line(&v)).and_then(|_| out.flush());
            }
            Shown::Liveness(_) => {}
        }
    }
}

impl Sink for View {
    fn item(&mut self, item: &StreamItem, _: &Folds) -> Result<(), String> {
        if let Some(w) = &mut self.windows {
            w.older.push(item);
            w.newer.push(item);
        }
        Ok(())
    }

    fn tick(&mut self, tick: &task::Tick<'_>) {
        let (f, now) = (tick.folds, tick.now);
        let every = match self.shown {
            Shown::Liveness(_) => LIVENESS_REFRESH,
            _ => task::TICK,
        };
        if now < self.last + every {
            return;
        }
        self.last = now;
        if let Some(w) = &mut self.windows {
            w.rotate(&f.run, now);
        }
        self.show(f, now);
    }

    fn end(&mut self, _: Option<&Ended<'_>>) -> Result<(), String> {
        // The liveness line is cleared before the caller prints anything.
        if let Shown::Liveness(line) = &mut self.shown {
            line.clear();
        }
        Ok(())
    }
}

/// Attaches with `opts` and runs until the target ends, or the user or a signal stops it; every
/// item also goes to `sinks` (a recording, an exporter). Fails only when the terminal cannot be
/// set up.
pub fn run(
    mut opts: Options,
    display: Display,
    mut sinks: Vec<Box<dyn Sink>>,
) -> io::Result<Outcome> {
    let start = Instant::now();
    let screen = match display {
        Display::Screen => Some(Rc::new(RefCell::new(Screen::enter()?))),
        _ => None,
    };
    let shown = match (display, &screen) {
        (Display::Screen, Some(s)) => Some(Shown::Screen(s.clone())),
        (Display::Lines, _) => Some(Shown::Lines),
        (Display::Liveness, _) => {
            let mut line = LivenessLine::default();
            line.show(&liveness_line(
                opts.pid,
                0.0,
                false,
                &Collector::new().snapshot(),
                columns(),
            ));
            Some(Shown::Liveness(line))
        }
        _ => None,
    };
    if let Some(shown) = shown {
        sinks.push(Box::new(View {
            pid: opts.pid,
            start,
            windows: matches!(display, Display::Screen | Display::Lines)
                .then(|| Windows::new(start)),
            shown,
            last: start,
        }));
    }
    let folds = Rc::new(RefCell::new(Folds::default()));
    let sinks: Sinks = Rc::new(RefCell::new(sinks));
    let outcome = match screen {
        Some(screen) => {
            // The run leaves the signals to us: raw mode turns Ctrl-C into a key.
            let (tx, rx) = watch::channel(None);
            opts.stop = Some(rx);
            crate::runtime::task::block_on(screen_loop(&opts, folds, sinks, tx, screen))??
        }
        None => crate::runtime::task::block_on(task::drive(&opts, folds, sinks))?,
    };
    Ok(outcome)
}

/// The run under the full-screen view: redraws on resize, reads keys, and turns `q`/Esc/Ctrl-C
/// and signals into a stop.
async fn screen_loop(
    opts: &Options,
    folds: Rc<RefCell<Folds>>,
    sinks: Sinks,
    stop: watch::Sender<Option<EndReason>>,
    screen: Rc<RefCell<Screen>>,
) -> io::Result<Outcome> {
    let crate::runtime::task::Signals {
        mut int,
        mut term,
        mut hup,
    } = crate::runtime::task::Signals::new()?;
    let redraw = |sinks: &Sinks, folds: &Rc<RefCell<Folds>>| {
        // The view is the last sink: a forced tick redraws at once.
        if let Some(view) = sinks.borrow_mut().last_mut() {
            let f = folds.borrow();
            view.tick(&task::Tick::new(Instant::now() + task::TICK, &f, None));
        }
    };
    redraw(&sinks, &folds);
    let run = task::drive(opts, folds.clone(), sinks.clone());
    tokio::pin!(run);
    let mut keys = tokio::time::interval(KEY_POLL);
    keys.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let request = |reason| {
        stop.send_if_modified(|r| {
            let first = r.is_none();
            r.get_or_insert(reason);
            first
        });
    };
    loop {
        tokio::select! {
            r = &mut run => {
                drop(screen);
                return Ok(r);
            }
            _ = keys.tick() => match read_keys() {
                Keys::Quit => request(EndReason::Interrupted),
                Keys::Redraw => redraw(&sinks, &folds),
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

    fn draw(&mut self, v: &LiveView<'_>) -> io::Result<()> {
        self.terminal.draw(|frame| draw(frame, v))?;
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

    fn clear(&mut self) {
        if std::mem::take(&mut self.shown) {
            let mut err = io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K").and_then(|_| err.flush());
        }
    }
}

impl Drop for LivenessLine {
    fn drop(&mut self) {
        self.clear();
    }
}

/// `top` on a multi-rank job: the job's summary (every rank's run so far, the job's findings)
/// shown each second, full screen on a terminal (one row per rank) or as plain lines (the job's
/// line, then one line per rank).
pub struct JobView {
    pid: u32,
    start: Instant,
    screen: Option<Screen>,
}

impl JobView {
    /// The view for `display` (`None`: nothing to show).
    pub fn new(pid: u32, display: Display) -> io::Result<Option<JobView>> {
        let screen = match display {
            Display::Screen => Some(Screen::enter()?),
            Display::Lines => None,
            _ => return Ok(None),
        };
        Ok(Some(JobView {
            pid,
            start: Instant::now(),
            screen,
        }))
    }

    /// Shows the job's summary `s`; true when the user asked to detach (`q`, Esc, Ctrl-C).
    pub fn show(&mut self, s: &crate::summary::Summary) -> bool {
        let v = LiveView {
            pid: self.pid,
            elapsed_s: self.start.elapsed().as_secs_f64(),
            attached: true,
            window_s: 0.0,
            window: s,
            run: s,
        };
        match &mut self.screen {
            Some(screen) => {
                if matches!(read_keys(), Keys::Quit) {
                    return true;
                }
                if let Err(e) = screen.draw(&v) {
                    tracing::warn!("top: cannot draw: {e}");
                }
            }
            None => {
                let mut out = io::stdout().lock();
                let _ = writeln!(out, "{}", crate::render::top::plain_line(&v));
                for line in crate::render::top::plain_rank_lines(s) {
                    let _ = writeln!(out, "  {line}");
                }
                let _ = out.flush();
            }
        }
        false
    }
}

/// Columns of the terminal (80 when unknown), less one so the line never wraps.
fn columns() -> usize {
    let cols = terminal::size().map_or(80, |(c, _)| usize::from(c));
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
