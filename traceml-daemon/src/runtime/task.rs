//! One target's task: its live run ([`target::run`]) folded as it streams into the target's
//! [`Folds`], every item and a once-a-second [`Tick`] handed to its [`Sink`]s (a recording,
//! `/metrics`, summary files, the live view), and at the end its final summary handed to them
//! too. `--pid`, the ranks of a job and every target of `serve` run this same task.
//!
//! The sinks only read: the task brings the folds up to date at each tick (the engine advanced,
//! the progress noted, a window closed when one is due) and then hands every sink the same
//! [`Tick`], whose run-so-far summary is computed once, by the first sink that asks. What one
//! sink shows never depends on another having run before it. Only the task advances the folds:
//! a job's group ([`super::group`]) reads the progress its last tick noted.
use std::cell::{OnceCell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::analysis::Collector;
use crate::engine::StepTotals;
use crate::event::{End, EndReason, StreamItem};
use crate::runtime::target::{self, LiveError, Options};
use crate::summary::Summary;

/// How often the sinks' [`Sink::tick`] runs.
pub const TICK: Duration = Duration::from_secs(1);

/// What a target's stream has been folded into: the run's bounded collector and what the sinks
/// read beside it.
#[derive(Default)]
pub struct Folds {
    pub run: Collector,
    /// The target's GPUs at the latest sample (utilization, its device memory).
    pub gpu: crate::metrics::GpuNow,
    /// The probes are attached (the first probe set was announced).
    pub attached: bool,
    /// The window being folded, where the run is summarised by windows (`serve`'s `--window`).
    window: Option<SummaryWindow>,
    /// The latest window's summary (`None` before the first window closed).
    pub last_window: Option<Summary>,
    /// When the run last completed a step, as of the task's last [`tick`]: the hang check's and
    /// `/metrics`' liveness.
    pub progress: Progress,
}

/// The window being folded: its own collector (what the run's keeps besides steps, carried
/// over: see [`Collector::fresh_window`]), when it closes, and its number.
struct SummaryWindow {
    every: Duration,
    fold: Collector,
    next: Instant,
    n: u32,
}

impl Folds {
    /// Folds that also summarise the run every `window` (`None`: the run as a whole only).
    pub fn windowed(window: Option<Duration>) -> Folds {
        Folds {
            window: window.map(|every| SummaryWindow {
                every,
                fold: Collector::new(),
                next: Instant::now() + every,
                n: 0,
            }),
            ..Folds::default()
        }
    }

    pub fn push(&mut self, item: &StreamItem) {
        match item {
            StreamItem::Sample(s) => self.gpu = crate::metrics::GpuNow::of(s),
            StreamItem::ProbeSet(_) => self.attached = true,
            _ => {}
        }
        if let Some(w) = &mut self.window {
            w.fold.push(item);
        }
        self.run.push(item);
    }

    /// Closes the window when it is due: its summary becomes [`Folds::last_window`]; its
    /// number (from 1) is returned.
    fn close_window(&mut self, now: Instant) -> Option<u32> {
        let w = self.window.as_mut().filter(|w| now >= w.next)?;
        w.next = now + w.every;
        w.n += 1;
        let fresh = self.run.fresh_window();
        self.last_window = Some(std::mem::replace(&mut w.fold, fresh).finish());
        Some(w.n)
    }

    /// Brings the engine up to now and notes whether steps were completed since the last look
    /// ([`Folds::progress`]). Only the task's [`tick`] does: what else reads the folds (a job's
    /// hang check) reads what the last tick left, and never advances the engine itself.
    fn observe(&mut self, now: Instant) {
        self.run.advance(target::monotonic_ns());
        let (n, total_ns) = self.run.steps();
        self.progress.update(n, total_ns, now);
    }

    /// In a collective now: a wait probe entered and not returned, or (where the wait is not
    /// probed) the latest Python stack inside a collective call.
    pub fn in_collective(&self) -> bool {
        self.run.in_collective_wait() || crate::ranks::in_collective(&self.run.last_stack())
    }
}

/// A run's progress between looks: its steps at the last change, when, and its mean step then.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    steps: u64,
    since: Instant,
    mean: Duration,
}

impl Progress {
    pub fn new() -> Self {
        Self {
            steps: 0,
            since: Instant::now(),
            mean: Duration::ZERO,
        }
    }

    /// Given the run's `steps` (and their total time) now. Only more steps are progress: a run
    /// that ended hands back fresh folds (fewer steps), and a hung rank killed stays hung.
    pub fn update(&mut self, steps: u64, total_ns: u64, now: Instant) {
        if steps > self.steps {
            *self = Progress {
                steps,
                since: now,
                mean: Duration::from_nanos(total_ns / steps),
            };
        }
    }

    /// How long since the run's last completed step (`None`: no step yet).
    pub fn idle(&self, now: Instant) -> Option<Duration> {
        (self.steps > 0).then(|| now.duration_since(self.since))
    }

    /// The run's mean step when its step count last grew.
    pub fn mean(&self) -> Duration {
        self.mean
    }

    /// How long the run has completed no step, when that is a hang: over max(10 × its mean
    /// step, `floor`) with at least one step done.
    pub fn hung(&self, now: Instant, floor: Duration) -> Option<Duration> {
        let idle = now.duration_since(self.since);
        (self.steps > 0 && idle >= (self.mean * 10).max(floor)).then_some(idle)
    }

    /// When the step count last grew, unix seconds; `None` before the first step.
    pub fn last_step_unix(&self) -> Option<f64> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?;
        (self.steps > 0).then(|| (now.saturating_sub(self.since.elapsed())).as_secs_f64())
    }
}

impl Default for Progress {
    fn default() -> Self {
        Self::new()
    }
}

/// The end of a run as the sinks see it.
pub struct Ended<'a> {
    pub summary: &'a Summary,
    pub totals: &'a StepTotals,
    pub folds: &'a Folds,
}

/// One look at the run, the same for every sink: the folds brought up to `now`.
pub struct Tick<'a> {
    pub now: Instant,
    pub folds: &'a Folds,
    /// The number of the window closed at this tick (its summary: [`Folds::last_window`]).
    pub window: Option<u32>,
    so_far: OnceCell<(Summary, StepTotals)>,
}

impl<'a> Tick<'a> {
    pub fn new(now: Instant, folds: &'a Folds, window: Option<u32>) -> Tick<'a> {
        Tick {
            now,
            folds,
            window,
            so_far: OnceCell::new(),
        }
    }

    /// The run so far and its step totals, computed at the first call of this tick.
    pub fn so_far(&self) -> &(Summary, StepTotals) {
        self.so_far
            .get_or_init(|| self.folds.run.snapshot_with_totals())
    }
}

/// Brings `folds` up to `now` (the engine, the progress, a window due) and hands every sink
/// the same [`Tick`].
pub fn tick(folds: &mut Folds, sinks: &mut [Box<dyn Sink>], now: Instant) {
    folds.observe(now);
    let window = folds.close_window(now);
    let tick = Tick::new(now, folds, window);
    for sink in sinks {
        sink.tick(&tick);
    }
}

/// Where a target's run goes besides its folds, which it only reads. Every method has a
/// default that does nothing.
pub trait Sink {
    /// Each item once the folds took it; an error ends the run (a recording that cannot be
    /// written).
    fn item(&mut self, _item: &StreamItem, _folds: &Folds) -> Result<(), String> {
        Ok(())
    }

    /// About every [`TICK`] while the run goes.
    fn tick(&mut self, _tick: &Tick<'_>) {}

    /// The run ended: its final summary, or `None` when it was never attached (nothing was
    /// gathered). An error is said by the caller.
    fn end(&mut self, _ended: Option<&Ended<'_>>) -> Result<(), String> {
        Ok(())
    }
}

/// A target's sinks, shared by its stream (items) and its timer (ticks).
pub type Sinks = Rc<RefCell<Vec<Box<dyn Sink>>>>;

/// What a finished task leaves.
pub struct Outcome {
    /// How the run ended: `Err` when it failed (before or after attaching).
    pub result: Result<EndReason, LiveError>,
    /// The final summary and step totals; `None` when nothing was gathered.
    pub summary: Option<(Summary, StepTotals)>,
    /// What the sinks could not do at the end (written to the user by the caller).
    pub sink_errors: Vec<String>,
}

/// Runs the target to its end: attaches with `opts`, folds every item into `folds`, hands items
/// and ticks to `sinks`, and at the end the final summary. A run that failed after gathering
/// events is summarised up to there (its end marked truncated).
pub async fn drive(opts: &Options, folds: Rc<RefCell<Folds>>, sinks: Sinks) -> Outcome {
    let result = {
        let (f, s) = (folds.clone(), sinks.clone());
        let run = target::run(opts, move |item| {
            let mut f = f.borrow_mut();
            f.push(item);
            for sink in s.borrow_mut().iter_mut() {
                sink.item(item, &f)?;
            }
            Ok(())
        });
        tokio::pin!(run);
        let mut timer = tokio::time::interval_at(tokio::time::Instant::now() + TICK, TICK);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                r = &mut run => break r,
                _ = timer.tick() => {
                    tick(&mut folds.borrow_mut(), &mut sinks.borrow_mut(), Instant::now());
                }
            }
        }
    };
    let pid = opts.pid;
    // The run's collector leaves the folds; what else holds them (a job's hang check) sees an
    // empty run from now on, with the progress kept.
    let mut run = std::mem::take(&mut folds.borrow_mut().run);
    let mut sink_errors = Vec::new();
    match &result {
        Ok(reason) => tracing::info!("pid {pid}: run ended ({reason:?})"),
        Err(e) if run.events() == 0 => {
            // Said by the caller: `--pid` in one sentence, `serve` in its log.
            tracing::debug!("pid {pid}: not attached: {e}");
            for sink in sinks.borrow_mut().iter_mut() {
                if let Err(e) = sink.end(None) {
                    sink_errors.push(e);
                }
            }
            return Outcome {
                result,
                summary: None,
                sink_errors,
            };
        }
        Err(e) => {
            // Attached and then failed: keep what was gathered, say why, and still summarise.
            tracing::warn!("pid {pid}: {e}; summarising what was gathered");
            run.push(&StreamItem::End(End {
                ts: target::monotonic_ns(),
                reason: EndReason::Truncated,
                target: None,
            }));
        }
    }
    let (summary, totals) = run.finish_with_totals();
    {
        let f = folds.borrow();
        let ended = Ended {
            summary: &summary,
            totals: &totals,
            folds: &f,
        };
        for sink in sinks.borrow_mut().iter_mut() {
            if let Err(e) = sink.end(Some(&ended)) {
                sink_errors.push(e);
            }
        }
    }
    Outcome {
        result,
        summary: Some((summary, totals)),
        sink_errors,
    }
}

/// The signals a supervisor of many runs handles itself (its runs leave them to it).
pub struct Signals {
    pub term: tokio::signal::unix::Signal,
    pub int: tokio::signal::unix::Signal,
    pub hup: tokio::signal::unix::Signal,
}

impl Signals {
    /// Registers the handlers (inside the runtime).
    pub fn new() -> std::io::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }
}

/// A single-threaded runtime and a local set: every target of a daemon runs on one thread.
pub fn block_on<F: std::future::Future>(f: F) -> std::io::Result<F::Output> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    Ok(tokio::task::LocalSet::new().block_on(&rt, f))
}
