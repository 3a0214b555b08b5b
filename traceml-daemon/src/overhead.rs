//! The daemon's own cost on the target: the per-hit cost model of each probe, the estimate of
//! added time per step from the probes' hit counters, and the overhead governor that chooses the
//! probe set to keep that estimate under `--overhead-budget`.
//!
//! Pure: the live loop feeds [`Governor::tick`] with the kernel's counters and the step markers
//! it decoded, and carries out what it returns; the analysis calls [`estimate`] on the recorded
//! [`ProbeStats`] and [`ProbeSet`] items, so a replay reports the same estimate.
//!
//! # Cost model
//! Per-hit costs are the medians measured by `cargo xtask bench` (paired A/B runs of probe-hit
//! storms, BENCHMARKS.md) rounded up, and checked against the in-process measurement on a HF
//! Trainer (1.3–2 µs per frame-evaluator entry + return pair, cache effects included). They
//! are what an uprobe costs on x86-64 with a kernel that emulates the probed instruction; a
//! single-stepped site costs ~10 µs and is never chosen (see `attach::elf`).
use crate::event::{Calibration, ProbeStats};

/// Added target time per probe hit, in ns.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CostModel {
    pub py_enter_ns: f64,
    pub exit_ns: f64,
    pub call_enter_ns: f64,
    pub record_ns: f64,
    pub launch_event_ns: f64,
    pub launch_count_ns: f64,
    /// One run of the `sched_switch` program doing a watched thread's work (see
    /// [`COSTS`]); summaries written before it was costed read the reference value.
    #[serde(default = "reference_switch_ns")]
    pub switch_ns: f64,
}

fn reference_switch_ns() -> f64 {
    COSTS.switch_ns
}

pub const COSTS: CostModel = CostModel {
    py_enter_ns: 800.0,
    exit_ns: 700.0,
    call_enter_ns: 800.0,
    record_ns: 900.0,
    launch_event_ns: 950.0,
    launch_count_ns: 500.0,
    // Not timed on its own: the watched path's work (two hash-map operations, a clock read and,
    // coming back, a ring-buffer record) costed like a uprobe's program without its trap, above
    // the unwatched path's 0.1–0.5 µs per switch measured by `cargo xtask bench --sched-only`.
    switch_ns: 500.0,
};

impl Default for CostModel {
    fn default() -> Self {
        COSTS
    }
}

/// What [`crate::attach::calibrate`] measured on the machine [`COSTS`] was measured on (this
/// project's 2-vCPU VM, Linux 6.18): the yardstick a machine's own calibration is read against.
/// The median of 5 runs on the quiet machine (`cargo test -p traceml-daemon --lib calibrate --
/// --nocapture` prints one; 2026-12-06: uprobe 532–554 ns, uretprobe
/// 789–805 ns; under load the same machine read 550–1190 and 790–1350).
pub const REFERENCE: Calibration = Calibration {
    uprobe_ns: 545.0,
    uretprobe_ns: 795.0,
};

impl CostModel {
    /// [`COSTS`] scaled to a machine by its calibration: entry probes by its uprobe cost
    /// against [`REFERENCE`]'s, return probes by its uretprobe cost (each factor held within
    /// 0.25–8: a calibration that far off is more likely a busy machine than a kernel).
    /// Without a calibration, [`COSTS`].
    pub fn for_machine(c: Option<&Calibration>) -> CostModel {
        let Some(c) = c else {
            return COSTS;
        };
        let factor = |ns: f64, reference: f64| (ns / reference).clamp(0.25, 8.0);
        let (u, r) = (
            factor(c.uprobe_ns, REFERENCE.uprobe_ns),
            factor(c.uretprobe_ns, REFERENCE.uretprobe_ns),
        );
        CostModel {
            py_enter_ns: COSTS.py_enter_ns * u,
            exit_ns: COSTS.exit_ns * r,
            call_enter_ns: COSTS.call_enter_ns * u,
            record_ns: COSTS.record_ns * u,
            launch_event_ns: COSTS.launch_event_ns * u,
            launch_count_ns: COSTS.launch_count_ns * u,
            switch_ns: COSTS.switch_ns * u,
        }
    }

    /// What `py_enter` frame-evaluator entries cost the target (each with its return probe), ns.
    pub fn python(&self, py_enter: u64) -> f64 {
        py_enter as f64 * (self.py_enter_ns + self.exit_ns)
    }

    /// Added ns for the hits between two counter readings, launches costed in `launch_events`
    /// mode.
    pub fn cost(&self, d: &ProbeStats, launch_events: bool) -> f64 {
        let launch = if launch_events {
            self.launch_event_ns
        } else {
            self.launch_count_ns
        };
        d.py_enter as f64 * self.py_enter_ns
            + d.exit as f64 * self.exit_ns
            + d.call_enter as f64 * self.call_enter_ns
            + d.record as f64 * self.record_ns
            + d.launch as f64 * launch
            + d.switch as f64 * self.switch_ns
    }
}

/// `b - a`, counter by counter (saturating: a counter never goes back, but a replayed file may
/// be cut or edited).
pub fn delta(a: &ProbeStats, b: &ProbeStats) -> ProbeStats {
    ProbeStats {
        ts: b.ts,
        switching: b.switching,
        py_enter: b.py_enter.saturating_sub(a.py_enter),
        exit: b.exit.saturating_sub(a.exit),
        call_enter: b.call_enter.saturating_sub(a.call_enter),
        record: b.record.saturating_sub(a.record),
        launch: b.launch.saturating_sub(a.launch),
        switch: b.switch.saturating_sub(a.switch),
    }
}

/// Step markers decoded from the stream since the last tick (any thread of the target).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Markers {
    /// Outermost `enumerate(DataLoader)#` records.
    pub dataloader: u64,
    /// `Optimizer.step#` records.
    pub optimizer: u64,
    /// Entries of the autograd engine (`loss.backward()`).
    pub backward: u64,
}

impl Markers {
    /// Steps the markers delimit (a DataLoader call or an optimizer step per step).
    pub fn steps(&self) -> u64 {
        self.dataloader.max(self.optimizer)
    }

    /// Any sign of training: a DataLoader iteration, an optimizer step or a backward pass.
    pub fn any(&self) -> bool {
        self.dataloader + self.optimizer + self.backward > 0
    }
}

/// How the governor may choose probes (`--probe-set`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ProbePolicy {
    /// Watch with torch's markers only until the process trains, then learn the loop with every
    /// probe for a bounded time, then keep only what the budget allows.
    #[default]
    Auto,
    /// Every probe for the whole run (the frame evaluator included): the most detail, the most
    /// cost on Python-heavy code.
    Full,
    /// Never the frame-evaluator probe: torch's markers and the CUDA probes only.
    Markers,
}

/// Governor settings.
#[derive(Clone, Copy, Debug)]
pub struct GovernorConfig {
    pub policy: ProbePolicy,
    /// Budget as a fraction of step time, or of the target's CPU time where no step is found
    /// (0.005 = 0.5 %).
    pub budget: f64,
    /// Shortest learning period with the frame-evaluator probe armed.
    pub learn_min_ns: u64,
    /// Steps the markers must have delimited while learning before the probe is detached.
    pub learn_steps: u64,
    /// Longest learning period: the probe is detached then whatever was learned (the stack
    /// sampler may lack the training thread's state; a loop the markers do not delimit stays
    /// unlearned).
    pub learn_max_ns: u64,
    /// Markers that come back after a pause this long are a new loop (a new `fit`, the next
    /// phase of a pipeline): it is learned again.
    pub relearn_after_ns: u64,
    /// A learning that delimited no step doubles the pause needed before the next, up to this.
    pub relearn_max_ns: u64,
    /// Per-hit costs on this machine ([`CostModel::for_machine`]).
    pub costs: CostModel,
}

impl GovernorConfig {
    pub fn new(policy: ProbePolicy, budget: f64) -> Self {
        GovernorConfig {
            policy,
            budget,
            // The frame evaluator on every Python call costs ~26 % of a HF Trainer's step
            // while learning (BENCHMARKS.md, "Cost of an attach"): learn no longer than it
            // takes to see one training step (a backward among the markers) and the training
            // thread's interpreter state; the live loop looks every 50 ms while learning. At
            // 100 ms a HF Trainer's attach cost 32 ms (27-52) of its time; at 50 ms, half.
            learn_min_ns: 50_000_000,
            learn_steps: 1,
            learn_max_ns: 10_000_000_000,
            relearn_after_ns: 30_000_000_000,
            relearn_max_ns: 960_000_000_000,
            costs: COSTS,
        }
    }
}

/// What the governor saw in one tick.
#[derive(Clone, Copy, Debug)]
pub struct GovernorTick {
    pub now: u64,
    /// Counters now (cumulative).
    pub stats: ProbeStats,
    /// Markers since the last tick.
    pub markers: Markers,
    /// The training thread's interpreter state is known (stack samples can run without the
    /// frame-evaluator probe).
    pub stacks_ready: bool,
    /// The target's CPU time so far (every thread, ns), when /proc says.
    pub cpu_ns: Option<u64>,
}

/// The probe set the governor wants from now on.
#[derive(Clone, Debug, PartialEq)]
pub struct ProbeDecision {
    pub python: bool,
    pub launch_events: bool,
    /// Place the probes held back while watching (CUDA runtime and driver, NCCL).
    pub attach_all: bool,
    /// The frame-evaluator probe stays armed as part of the steady set: its cost with the other
    /// probes' over the learned steps is within the budget (it then marks each step's first model call:
    /// input preparation outside any DataLoader is measured, not guessed).
    pub python_steady: bool,
    pub reason: String,
}

/// Where the governor is with the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// No training marker yet (`auto`): only torch's marker probes are placed, which a process
    /// that does not train never hits.
    Watching,
    /// The frame-evaluator probe is armed to learn the loop (bounded in time).
    Learning,
    /// The steady probe set.
    Steady,
}

/// Chooses the probe set from the probes' hit rates, the step rate and the target's CPU time.
#[derive(Debug)]
pub struct Governor {
    cfg: GovernorConfig,
    python: bool,
    launch_events: bool,
    stage: Stage,
    /// When the current learning period started.
    learning_since: u64,
    /// What `learn_min_ns` counts from: the attach for the first learning (the time spent
    /// watching counts: a loop already running when the daemon attached is learned in its
    /// first steps, as when learning started at the attach), the arming for a re-learning.
    learn_min_from: u64,
    learn_steps: u64,
    learn_backward: u64,
    last: Option<ProbeStats>,
    last_cpu_ns: Option<u64>,
    last_marker_ns: u64,
    /// The pause after which markers are learned again (doubled by fruitless learnings).
    relearn_after_ns: u64,
    /// A training marker was seen (the first ones after a learning that saw none are learned
    /// at once).
    seen_markers: bool,
    /// Frame-evaluator hits and wall time over the learning ticks from the first that delimited
    /// steps.
    learn_py: u64,
    learn_wall_ns: u64,
    /// What the other probes cost over the same ticks (ns).
    learn_other_ns: f64,
    /// The probe is kept armed in the steady set.
    python_kept: bool,
    /// The cost read at the end of the learning was near the budget: measured again over
    /// [`REMEASURE_NS`] of steps after the first (whose ticks hold the loop's start-up).
    remeasuring: bool,
}

/// A learned cost within this many budgets is measured again before the probe is detached:
/// the first ticks that delimit steps also hold the loop's start-up (an iterator and its
/// threads created, the first batch's imports), read over a tenth of a second.
const MARGINAL_BUDGETS: f64 = 4.0;
/// How long the re-measure lasts, in ticks that delimited steps.
const REMEASURE_NS: u64 = 500_000_000;

impl Governor {
    /// `launch_events`: the launch mode at attach; `watch_first`: under [`ProbePolicy::Auto`], watch
    /// for training markers before anything costly (else learn from the attach, bounded).
    pub fn new(cfg: GovernorConfig, now: u64, launch_events: bool, watch_first: bool) -> Self {
        Governor {
            cfg,
            python: Self::initial(cfg.policy, watch_first),
            launch_events,
            stage: match cfg.policy {
                ProbePolicy::Auto if watch_first => Stage::Watching,
                ProbePolicy::Auto => Stage::Learning,
                _ => Stage::Steady,
            },
            learning_since: now,
            learn_min_from: now,
            learn_steps: 0,
            learn_backward: 0,
            last: None,
            last_cpu_ns: None,
            last_marker_ns: now,
            relearn_after_ns: cfg.relearn_after_ns,
            seen_markers: false,
            learn_py: 0,
            learn_wall_ns: 0,
            learn_other_ns: 0.0,
            python_kept: false,
            remeasuring: false,
        }
    }

    pub fn stage(&self) -> Stage {
        self.stage
    }

    /// Learning the loop with the frame-evaluator probe armed (the live loop then ticks faster).
    pub fn learning(&self) -> bool {
        self.stage == Stage::Learning
    }

    /// Watching for training markers (the live loop ticks faster, to start within a second).
    pub fn watching(&self) -> bool {
        self.stage == Stage::Watching
    }

    /// Whether the frame-evaluator probe is armed at attach under `policy`.
    pub fn initial(policy: ProbePolicy, watch_first: bool) -> bool {
        policy == ProbePolicy::Full || (policy == ProbePolicy::Auto && !watch_first)
    }

    /// Whether the CUDA and NCCL probes wait for the first training marker under `policy`.
    pub fn defers_libraries(policy: ProbePolicy, watch_first: bool) -> bool {
        policy == ProbePolicy::Auto && watch_first
    }

    /// One look at the counters (about once a second, 4× while watching or learning); `Some`
    /// when the probe set should change.
    pub fn tick(&mut self, t: GovernorTick) -> Option<ProbeDecision> {
        let prev = self.last.replace(t.stats);
        let prev_cpu = std::mem::replace(&mut self.last_cpu_ns, t.cpu_ns);
        let d = prev.map(|p| delta(&p, &t.stats)).unwrap_or_default();
        let steps = t.markers.steps();
        let paused_ns = t.now.saturating_sub(self.last_marker_ns);
        let first_markers = t.markers.any() && !self.seen_markers;
        if t.markers.any() {
            self.last_marker_ns = t.now;
            self.seen_markers = true;
        }
        let mut want = ProbeDecision {
            python: self.python,
            launch_events: self.launch_events,
            attach_all: false,
            python_steady: self.python_kept,
            reason: String::new(),
        };
        let was_kept = self.python_kept;
        let interval = t.now.saturating_sub(prev.map(|p| p.ts).unwrap_or(t.now));
        let mut reasons = Vec::new();
        match self.stage {
            Stage::Watching if t.markers.any() => self.end_watching(&t, &mut want, &mut reasons),
            Stage::Watching => {}
            Stage::Learning => {
                // From the first tick that delimited steps on, every tick: a tick between
                // two markers (steps longer than the tick) is the steps' time too.
                if steps > 0 || self.learn_steps > 0 {
                    self.learn_py += d.py_enter;
                    self.learn_wall_ns += interval;
                    // The other probes' cost, less the thread-state program's: no probe set
                    // changes it (it runs while the daemon is attached), so it does not weigh on
                    // keeping the frame evaluator (the estimate counts it).
                    self.learn_other_ns += (self.cfg.costs.cost(&d, self.launch_events)
                        - self.cfg.costs.python(d.py_enter)
                        - d.switch as f64 * self.cfg.costs.switch_ns)
                        .max(0.0);
                }
                self.tick_learning(&t, steps, &mut want, &mut reasons)
            }
            Stage::Steady => {
                self.tick_steady(&t, first_markers, paused_ns, &mut want, &mut reasons);
                if self.python_kept && steps > 0 && !want.python_steady_over(&d, interval, self) {
                    want.python = false;
                    want.python_steady = false;
                    self.python_kept = false;
                    reasons.push(format!(
                        "the frame evaluator's {} calls in {:.1} s would cost {:.2} % of the \
                         steps: probe detached",
                        d.py_enter,
                        interval as f64 / 1e9,
                        self.cfg.costs.python(d.py_enter) / interval.max(1) as f64 * 100.0
                    ));
                }
            }
        }
        // The budget, whatever the stage but learning (bounded in time): the added time
        // against the wall time of the steps when the markers delimit steps, else against the
        // target's own CPU time.
        if self.launch_events && self.cfg.policy != ProbePolicy::Full && !self.learning() {
            let base = if steps > 0 {
                interval
            } else {
                t.cpu_ns
                    .zip(prev_cpu)
                    .map_or(0, |(c, p)| c.saturating_sub(p))
            };
            if let Some(reason) = self.launch_budget(&d, steps, interval, base) {
                want.launch_events = false;
                reasons.push(reason);
            }
        }
        if want.python == self.python
            && want.launch_events == self.launch_events
            && want.python_steady == was_kept
            && !want.attach_all
        {
            return None;
        }
        self.python = want.python;
        self.launch_events = want.launch_events;
        want.reason = reasons.join("; ");
        Some(want)
    }

    /// Watching, and training markers came: every probe placed, the loop learned.
    fn end_watching(
        &mut self,
        t: &GovernorTick,
        want: &mut ProbeDecision,
        reasons: &mut Vec<String>,
    ) {
        want.attach_all = true;
        want.python = true;
        reasons.push(format!(
            "training markers ({} DataLoader iterations, {} optimizer steps, {} backward \
             passes): CUDA probes placed, frame-evaluator probe armed to learn the loop",
            t.markers.dataloader, t.markers.optimizer, t.markers.backward
        ));
        self.start_learning(t.now);
    }

    /// Learning: count the markers; detach the frame-evaluator probe once the loop is learned
    /// or the learning ran out of time.
    fn tick_learning(
        &mut self,
        t: &GovernorTick,
        steps: u64,
        want: &mut ProbeDecision,
        reasons: &mut Vec<String>,
    ) {
        if t.markers.any()
            && self.learn_steps + self.learn_backward == 0
            && steps + t.markers.backward > 0
        {
            // The loop starts while the probe is armed (a job still setting up when
            // the daemon attached, slower on a busy machine): the bound counts from its
            // first marker, so its first steps are learned.
            self.learning_since = self.learning_since.max(t.now);
        }
        self.learn_steps += steps;
        self.learn_backward += t.markers.backward;
        let elapsed = t.now.saturating_sub(self.learning_since);
        // Learned once the steps train (a backward among them): a validation pass
        // before training (Lightning's sanity check) delimits steps of its own and
        // would end the learning before the first training window is seen.
        let learned = t.now.saturating_sub(self.learn_min_from) >= self.cfg.learn_min_ns
            && self.learn_steps >= self.cfg.learn_steps
            && self.learn_backward > 0
            && (!self.remeasuring || self.learn_wall_ns >= REMEASURE_NS);
        let waited = elapsed >= self.cfg.learn_max_ns;
        if learned && (t.stacks_ready || waited) {
            let wall = self.learn_wall_ns.max(1) as f64;
            let cost = self.cfg.costs.python(self.learn_py) / wall;
            let others = self.learn_other_ns / wall;
            if self.cfg.policy == ProbePolicy::Auto
                && !waited
                && !self.remeasuring
                && cost + others > self.cfg.budget
                && cost + others <= self.cfg.budget * MARGINAL_BUDGETS
            {
                // Near the budget over the first steps: read again without them (a cheap loop
                // whose probe stays armed sees each step's first model call; a feeder thread's
                // queue is found that way).
                self.remeasuring = true;
                self.learn_py = 0;
                self.learn_wall_ns = 0;
                self.learn_other_ns = 0.0;
                return;
            }
            if self.cfg.policy == ProbePolicy::Auto
                && self.learn_wall_ns > 0
                && cost + others <= self.cfg.budget
            {
                // Cheap here (few calls from C into Python per step): kept, so each step's
                // first model call is seen.
                want.python_steady = true;
                self.python_kept = true;
                reasons.push(format!(
                    "torch's markers delimit the steps ({} steps, {} backward passes while \
                     learning); the frame evaluator's {} calls cost {:.3} % of the steps, \
                     within the budget with the other probes: probe kept armed",
                    self.learn_steps,
                    self.learn_backward,
                    self.learn_py,
                    cost * 100.0
                ));
            } else {
                want.python = false;
                reasons.push(format!(
                    "torch's markers delimit the steps ({} steps, {} backward passes while \
                     learning): frame-evaluator probe detached",
                    self.learn_steps, self.learn_backward
                ));
            }
            self.relearn_after_ns = self.cfg.relearn_after_ns;
            self.stage = Stage::Steady;
        } else if waited {
            want.python = false;
            self.relearn_after_ns = (self.relearn_after_ns * 2).min(self.cfg.relearn_max_ns);
            reasons.push(format!(
                "no loop learned in {:.0} s ({} steps, {} backward passes): \
                 frame-evaluator probe detached; learned again only after {:.0} s \
                 without a marker",
                elapsed as f64 / 1e9,
                self.learn_steps,
                self.learn_backward,
                self.relearn_after_ns as f64 / 1e9
            ));
            self.stage = Stage::Steady;
        }
    }

    /// Steady: under `auto`, markers that are the first or come back after a long pause are a
    /// new loop, learned again.
    fn tick_steady(
        &mut self,
        t: &GovernorTick,
        first_markers: bool,
        paused_ns: u64,
        want: &mut ProbeDecision,
        reasons: &mut Vec<String>,
    ) {
        if self.cfg.policy == ProbePolicy::Auto
            && !self.python
            && t.markers.any()
            && (first_markers || paused_ns >= self.relearn_after_ns)
        {
            want.python = true;
            reasons.push(if first_markers {
                "training markers, the first: frame-evaluator probe re-armed to learn \
                 the loop"
                    .to_owned()
            } else {
                format!(
                    "training markers again after {:.0} s without: a new loop; \
                     frame-evaluator probe re-armed to learn it",
                    paused_ns as f64 / 1e9
                )
            });
            self.start_learning(t.now);
        }
    }

    /// Why launches should be counted in the kernel rather than sent as events, when their
    /// cost over `base` ns (the steps' wall time, or the target's CPU time) exceeds half the
    /// budget; `None` when it does not.
    fn launch_budget(
        &self,
        d: &ProbeStats,
        steps: u64,
        interval: u64,
        base: u64,
    ) -> Option<String> {
        let launch_cost = d.launch as f64 * self.cfg.costs.launch_event_ns;
        if !(base > 0 && launch_cost > base as f64 * self.cfg.budget / 2.0) {
            return None;
        }
        let per = if steps > 0 {
            format!(
                "{:.0} kernel launches per step would cost {:.2} % of the step",
                d.launch as f64 / steps as f64,
                launch_cost / base as f64 * 100.0
            )
        } else {
            format!(
                "{} kernel launches in {:.1} s would cost {:.2} % of the target's CPU time",
                d.launch,
                interval as f64 / 1e9,
                launch_cost / base as f64 * 100.0
            )
        };
        Some(format!(
            "{per} as events: launches are counted in the kernel from now on"
        ))
    }

    fn start_learning(&mut self, now: u64) {
        if self.stage != Stage::Watching {
            self.learn_min_from = now;
        }
        self.learn_py = 0;
        self.learn_wall_ns = 0;
        self.learn_other_ns = 0.0;
        self.python_kept = false;
        self.remeasuring = false;
        self.stage = Stage::Learning;
        self.learning_since = now;
        self.learn_steps = 0;
        self.learn_backward = 0;
    }
}

impl ProbeDecision {
    /// Whether the frame evaluator's hits `d` over `interval` ns of steps stay within the
    /// governor's budget (kept armed: re-checked each tick, detached past the whole budget).
    fn python_steady_over(&self, d: &ProbeStats, interval: u64, g: &Governor) -> bool {
        interval == 0 || g.cfg.costs.python(d.py_enter) <= interval as f64 * g.cfg.budget
    }
}

/// The added time of a run against the target's CPU time over it, as a fraction: what a
/// process without steps pays (the probe handlers run on its threads, so their time is in its
/// CPU time; the share of what is left is the slowdown of CPU-bound work).
pub fn share_of_cpu(added_ns: f64, cpu_ns: f64) -> Option<f64> {
    (cpu_ns > added_ns && added_ns >= 0.0).then(|| added_ns / (cpu_ns - added_ns))
}

/// The daemon's estimated cost on the target over a run.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Estimate {
    /// Estimated added ns over the whole run.
    pub added_ns: f64,
    /// Added ns in the steady state: since the last probe-set change was carried out.
    pub steady_added_ns: f64,
    /// When the steady state starts (its first counter reading).
    pub steady_from_ns: u64,
    /// Hits over the whole run.
    pub hits: ProbeStats,
    /// Hits in the steady state.
    pub steady_hits: ProbeStats,
    /// Added ns while the frame-evaluator probe was armed to learn the loop (every learning
    /// period of the run): what each attach costs the target once, on top of the steady cost.
    pub learning_added_ns: f64,
    /// Learning periods (the first after the attach or the first markers, then one per new loop).
    pub learnings: u32,
}

/// What the estimate reads from the stream, in stream order.
#[derive(Clone, Copy, Debug)]
pub enum Observation {
    /// Cumulative counters.
    Stats(ProbeStats),
    /// A probe-set change: whether launches are events from then on, and whether the
    /// frame-evaluator probe is armed to learn the loop (not as part of the steady set).
    Set { launch_events: bool, learning: bool },
}

/// Sums the cost of every counter delta, costing launches in the mode in force when the delta
/// ends (a change applies to the deltas after it in the stream). The steady state starts at
/// the first reading after the last change that is not `switching`.
pub fn estimate(seq: &[Observation], initial_launch_events: bool, costs: &CostModel) -> Estimate {
    let mut out = Estimate::default();
    let last_set = seq
        .iter()
        .rposition(|o| matches!(o, Observation::Set { .. }));
    let mut mode = initial_launch_events;
    // The first probe set is the one placed at attach: it is in force from the stream's start
    // (counter readings may come before the item that names it).
    let mut learning = seq
        .iter()
        .find_map(|o| match o {
            Observation::Set { learning, .. } => Some(*learning),
            Observation::Stats(_) => None,
        })
        .unwrap_or(false);
    out.learnings = u32::from(learning);
    // A learning just ended: the readings taken while the detach is under way (`switching`)
    // still pay the frame evaluator's hits.
    let mut learning_tail = false;
    let mut prev = ProbeStats::default();
    let mut steady_base: Option<ProbeStats> = None;
    for (i, o) in seq.iter().enumerate() {
        match *o {
            Observation::Set {
                launch_events,
                learning: l,
            } => {
                mode = launch_events;
                out.learnings += u32::from(l && !learning);
                learning_tail = learning && !l;
                learning = l;
            }
            Observation::Stats(s) => {
                let c = costs.cost(&delta(&prev, &s), mode);
                out.added_ns += c;
                learning_tail &= s.switching;
                if learning || learning_tail {
                    out.learning_added_ns += c;
                }
                if steady_base.is_some() {
                    out.steady_added_ns += c;
                } else if last_set.is_none_or(|l| i > l) && !s.switching {
                    steady_base = Some(s);
                    out.steady_from_ns = s.ts;
                }
                prev = s;
            }
        }
    }
    out.hits = prev;
    if let Some(base) = steady_base {
        out.steady_hits = delta(&base, &prev);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(ts: u64, py: u64, launch: u64) -> ProbeStats {
        ProbeStats {
            ts,
            py_enter: py,
            exit: py,
            launch,
            ..ProbeStats::default()
        }
    }

    const S: u64 = 1_000_000_000;

    fn tick(now: u64, markers: Markers, stacks_ready: bool) -> GovernorTick {
        GovernorTick {
            now,
            stats: stats(now, now / 1000, 0),
            markers,
            stacks_ready,
            cpu_ns: Some(now),
        }
    }

    const TRAINING: Markers = Markers {
        dataloader: 10,
        optimizer: 10,
        backward: 10,
    };
    const NONE: Markers = Markers {
        dataloader: 0,
        optimizer: 0,
        backward: 0,
    };

    #[test]
    fn watches_until_training_markers_then_learns_and_detaches() {
        let mut g = Governor::new(GovernorConfig::new(ProbePolicy::Auto, 0.005), 0, true, true);
        assert!(g.watching() && !Governor::initial(ProbePolicy::Auto, true));
        // No marker: nothing is armed, nothing changes, for as long as it lasts.
        for i in 1..100 {
            assert_eq!(g.tick(tick(i * S, NONE, true)), None);
        }
        assert!(g.watching());
        let d = g
            .tick(tick(100 * S, TRAINING, false))
            .expect("training found");
        assert!(d.python && d.attach_all && d.launch_events, "{d:?}");
        assert!(d.reason.contains("training markers"), "{}", d.reason);
        assert!(g.learning());
        // Learned (the minimum counts from the attach: the watching time counts), but the
        // training thread's state is unknown: wait (up to learn_max).
        assert_eq!(g.tick(tick(100 * S + S / 4, TRAINING, false)), None);
        assert_eq!(g.tick(tick(101 * S, TRAINING, false)), None);
        let d = g.tick(tick(102 * S, TRAINING, true)).expect("detach");
        assert!(!d.python && d.launch_events && !d.attach_all, "{d:?}");
        assert!(d.reason.contains("detached"), "{}", d.reason);
        assert_eq!(g.stage(), Stage::Steady);
        assert_eq!(g.tick(tick(104 * S, TRAINING, true)), None);
    }

    #[test]
    fn pid_mode_learns_from_the_attach_bounded_then_learns_the_first_markers() {
        assert!(Governor::initial(ProbePolicy::Auto, false));
        assert!(!Governor::defers_libraries(ProbePolicy::Auto, false));
        let mut g = Governor::new(
            GovernorConfig::new(ProbePolicy::Auto, 0.005),
            0,
            true,
            false,
        );
        assert!(g.learning());
        // A process that does not train: the probe goes after 10 s.
        for i in 1..10 {
            assert_eq!(g.tick(tick(i * S, NONE, true)), None);
        }
        let d = g.tick(tick(10 * S, NONE, true)).expect("bounded");
        assert!(!d.python && d.reason.contains("no loop learned"), "{d:?}");
        // It starts training 5 s later: its first markers are learned at once.
        let d = g.tick(tick(15 * S, TRAINING, true)).expect("first markers");
        assert!(
            d.python && !d.attach_all && d.reason.contains("the first"),
            "{d:?}"
        );
        assert!(
            g.tick(tick(16 * S, TRAINING, true))
                .is_some_and(|d| !d.python)
        );
    }

    #[test]
    fn steps_without_a_backward_do_not_end_the_learning() {
        let mut g = Governor::new(
            GovernorConfig::new(ProbePolicy::Auto, 0.005),
            0,
            true,
            false,
        );
        let validation = Markers {
            dataloader: 3,
            ..NONE
        };
        assert_eq!(
            g.tick(tick(S, validation, true)),
            None,
            "a sanity check is no loop"
        );
        assert_eq!(g.tick(tick(2 * S, validation, true)), None);
        let d = g.tick(tick(3 * S, TRAINING, true)).expect("training steps");
        assert!(!d.python, "{d:?}");
    }

    #[test]
    fn the_bound_counts_from_the_first_marker_when_the_loop_starts_while_learning() {
        // Three steps to learn (the default needs one): the bound, not the count, is tested.
        let cfg = GovernorConfig {
            learn_steps: 3,
            ..GovernorConfig::new(ProbePolicy::Auto, 0.005)
        };
        let mut g = Governor::new(cfg, 0, true, false);
        for i in 1..9 {
            assert_eq!(g.tick(tick(i * S, NONE, true)), None);
        }
        // A slow start: the first marker at 9 s, a step a second (under 3 steps until 11 s).
        let one = Markers {
            dataloader: 1,
            optimizer: 1,
            backward: 1,
        };
        for i in 9..11 {
            assert_eq!(
                g.tick(tick(i * S, one, true)),
                None,
                "still learning at {i} s"
            );
        }
        let d = g.tick(tick(11 * S, one, true)).expect("learned");
        assert!(d.reason.contains("delimit the steps"), "{d:?}");
    }

    #[test]
    fn learning_is_bounded_and_a_fruitless_one_backs_off() {
        let mut g = Governor::new(GovernorConfig::new(ProbePolicy::Auto, 0.005), 0, true, true);
        // A backward now and then (a process that trains something tiny, or fine-tunes once),
        // no DataLoader or optimizer step: no step is delimited.
        let rare = Markers {
            backward: 1,
            ..NONE
        };
        assert!(g.tick(tick(S, rare, true)).is_some_and(|d| d.python));
        for i in 2..11 {
            assert_eq!(g.tick(tick(i * S, NONE, true)), None, "learning at {i} s");
        }
        let d = g.tick(tick(11 * S, NONE, true)).expect("bounded");
        assert!(!d.python && d.reason.contains("no loop learned"), "{d:?}");
        assert!(d.reason.contains("60 s"), "{}", d.reason);
        // Markers 40 s later: under the doubled pause, nothing.
        assert_eq!(g.tick(tick(51 * S, rare, true)), None);
        // 61 s after that: learned again; fruitless again: 120 s.
        assert!(g.tick(tick(112 * S, rare, true)).is_some_and(|d| d.python));
        let d = g.tick(tick(123 * S, NONE, true)).expect("bounded");
        assert!(d.reason.contains("120 s"), "{}", d.reason);
        // The pause never grows past its cap.
        let mut g = Governor::new(GovernorConfig::new(ProbePolicy::Auto, 0.005), 0, true, true);
        let mut now = 0;
        for _ in 0..20 {
            now += 2000 * S;
            g.tick(tick(now, rare, true));
            now += 11 * S;
            g.tick(tick(now, NONE, true));
        }
        assert_eq!(
            g.relearn_after_ns,
            GovernorConfig::new(ProbePolicy::Auto, 0.0).relearn_max_ns
        );
    }

    #[test]
    fn a_cost_near_the_budget_is_measured_again_without_the_loops_start_up() {
        const MS: u64 = 1_000_000;
        // Frame-evaluator calls per 50 ms tick: 1.5 µs each against a 0.5 % budget, 166 fit.
        // `tick(i)`: the calls and markers of the i-th tick (50 ms each) after the first.
        let run = |first: u64, tick: &dyn Fn(u64) -> (u64, Markers)| {
            let mut g = Governor::new(GovernorConfig::new(ProbePolicy::Auto, 0.005), 0, true, true);
            let mut py = 0;
            let mut at = |now: u64, calls: u64, markers: Markers, g: &mut Governor| {
                py += calls;
                g.tick(GovernorTick {
                    now,
                    stats: stats(now, py, 0),
                    markers,
                    stacks_ready: true,
                    cpu_ns: Some(now),
                })
            };
            assert!(at(50 * MS, 0, TRAINING, &mut g).is_some_and(|d| d.python));
            // The first tick that delimits steps holds the loop's start-up.
            let mut out = vec![(100, at(100 * MS, first, TRAINING, &mut g))];
            for i in 3..40 {
                let (calls, markers) = tick(i);
                out.push((i * 50, at(i * 50 * MS, calls, markers, &mut g)));
            }
            out.into_iter()
                .find_map(|(ms, d)| d.map(|d| (ms, d)))
                .expect("decided")
        };
        let every = |calls| move |_| (calls, TRAINING);
        // 400 calls (1.2 % of the tick) then 50 (0.15 %): measured again over 0.5 s, kept.
        let (ms, d) = run(400, &every(50));
        assert!(d.python && d.python_steady, "{d:?}");
        assert_eq!(ms, 600, "{}", d.reason);
        // Still over the budget when measured again: detached then.
        let (ms, d) = run(400, &every(400));
        assert!(!d.python, "{d:?}");
        assert_eq!(ms, 600);
        // Far over (26 % of the tick, a HF Trainer): detached at once.
        let (ms, d) = run(8_700, &every(8_700));
        assert!(!d.python, "{d:?}");
        assert_eq!(ms, 100);
        // Steps of 150 ms: the calls and markers come every third tick (250 calls: 0.75 % of
        // that tick, 0.25 % of the steps' time). The ticks between count: kept.
        let (_, d) = run(250, &|i| {
            if i % 3 == 0 {
                (250, TRAINING)
            } else {
                (0, NONE)
            }
        });
        assert!(d.python && d.python_steady, "{d:?}");
    }

    #[test]
    fn relearns_when_markers_return_after_a_pause() {
        let mut g = Governor::new(GovernorConfig::new(ProbePolicy::Auto, 0.005), 0, true, true);
        g.tick(tick(S, TRAINING, true)).expect("training");
        g.tick(tick(2 * S, TRAINING, true)).expect("learned");
        // Silence does not re-arm anything (an inference phase, a long pause).
        for i in 3..100 {
            assert_eq!(g.tick(tick(i * S, NONE, true)), None);
        }
        let d = g.tick(tick(100 * S, TRAINING, true)).expect("a new loop");
        assert!(
            d.python && !d.attach_all && d.reason.contains("re-armed"),
            "{d:?}"
        );
        // A re-learning's minimum counts from its arming.
        assert_eq!(
            g.tick(tick(100 * S + S / 40, TRAINING, true)),
            None,
            "too early"
        );
        // Markers without a pause are the same loop.
        let d = g.tick(tick(101 * S, TRAINING, true)).expect("learned");
        assert!(!d.python);
        assert_eq!(g.tick(tick(102 * S, TRAINING, true)), None);
    }

    #[test]
    fn full_and_markers_policies_never_switch_python() {
        for (policy, python) in [(ProbePolicy::Full, true), (ProbePolicy::Markers, false)] {
            assert_eq!(Governor::initial(policy, true), python);
            assert!(!Governor::defers_libraries(policy, true));
            let mut g = Governor::new(GovernorConfig::new(policy, 0.005), 0, true, true);
            assert!(!g.watching());
            for i in 1..100 {
                let m = if (5..60).contains(&i) { NONE } else { TRAINING };
                let d = g.tick(tick(i * S, m, true));
                assert!(
                    d.is_none_or(|d| d.python == python && !d.attach_all),
                    "{policy:?}"
                );
            }
        }
    }

    #[test]
    fn launch_storm_switches_to_count_mode() {
        let mut g = Governor::new(
            GovernorConfig::new(ProbePolicy::Markers, 0.005),
            0,
            true,
            true,
        );
        let m = Markers {
            dataloader: 100,
            optimizer: 100,
            backward: 100,
        };
        let at = |now: u64, launch: u64| GovernorTick {
            stats: stats(now, 0, launch),
            ..tick(now, m, true)
        };
        // 100 steps of 10 ms, 10 launches each: 9.5 µs of 10 ms = 0.095 % < 0.25 %: keep.
        g.tick(at(S, 0));
        assert_eq!(g.tick(at(2 * S, 1000)), None);
        // 500 launches a step: 475 µs of 10 ms = 4.75 %: count mode.
        let d = g.tick(at(3 * S, 51_000)).expect("count mode");
        assert!(
            !d.launch_events && d.reason.contains("500 kernel launches"),
            "{d:?}"
        );
    }

    #[test]
    fn without_steps_the_budget_is_a_share_of_the_targets_cpu_time() {
        // An inference server: launches, no marker. 0.5 s of CPU a second.
        let mut g = Governor::new(
            GovernorConfig::new(ProbePolicy::Markers, 0.005),
            0,
            true,
            true,
        );
        let at = |now: u64, launch: u64, cpu: u64| GovernorTick {
            stats: stats(now, 0, launch),
            cpu_ns: Some(cpu),
            ..tick(now, NONE, true)
        };
        g.tick(at(S, 0, S / 2));
        // 1,000 launches in 0.5 s of CPU: 0.95 ms = 0.19 % < 0.25 %: keep.
        assert_eq!(g.tick(at(2 * S, 1000, S)), None);
        // 2,000: 1.9 ms = 0.38 %: count mode.
        let d = g.tick(at(3 * S, 3000, 3 * S / 2)).expect("count mode");
        assert!(
            !d.launch_events && d.reason.contains("of the target's CPU time"),
            "{d:?}"
        );
        // Without /proc: no judgement, no switch.
        let mut g = Governor::new(
            GovernorConfig::new(ProbePolicy::Markers, 0.005),
            0,
            true,
            true,
        );
        let blind = |now: u64, launch: u64| GovernorTick {
            stats: stats(now, 0, launch),
            cpu_ns: None,
            ..tick(now, NONE, true)
        };
        g.tick(blind(S, 0));
        assert_eq!(g.tick(blind(2 * S, 1_000_000)), None);
    }

    #[test]
    fn share_of_cpu_is_the_slowdown_of_what_is_left() {
        assert_eq!(share_of_cpu(0.0, 1e9), Some(0.0));
        assert!((share_of_cpu(1e7, 1.01e9).unwrap() - 0.01).abs() < 1e-12);
        assert_eq!(share_of_cpu(1e9, 1e9), None);
        assert_eq!(share_of_cpu(1.0, 0.0), None);
    }

    #[test]
    fn estimate_costs_launches_in_the_mode_in_force() {
        use Observation::{Set, Stats};
        let switching = ProbeStats {
            switching: true,
            ..stats(2 * S + 1, 5000, 250)
        };
        let seq = [
            Set {
                launch_events: true,
                learning: true,
            },
            Stats(stats(S, 1000, 100)),
            Stats(stats(2 * S, 2000, 200)),
            Set {
                launch_events: false,
                learning: false,
            },
            // The detach is still under way: its hits are paid, but not the steady state.
            Stats(switching),
            Stats(stats(3 * S, 5000, 300)),
            Stats(stats(4 * S, 5000, 400)),
        ];
        let e = estimate(&seq, true, &COSTS);
        let py = |n: f64| n * (COSTS.py_enter_ns + COSTS.exit_ns);
        let want = py(1000.0)
            + 100.0 * COSTS.launch_event_ns
            + py(1000.0)
            + 100.0 * COSTS.launch_event_ns
            + py(3000.0)
            + 50.0 * COSTS.launch_count_ns
            + 50.0 * COSTS.launch_count_ns
            + 100.0 * COSTS.launch_count_ns;
        assert!((e.added_ns - want).abs() < 1e-6, "{e:?}");
        // Steady: from the first settled reading after the change (3 s) on.
        assert_eq!(e.steady_from_ns, 3 * S);
        assert_eq!(e.steady_hits.py_enter, 0);
        assert_eq!(e.steady_hits.launch, 100);
        assert!((e.steady_added_ns - 100.0 * COSTS.launch_count_ns).abs() < 1e-6);
        assert_eq!(e.hits.launch, 400);
        // The learning: from the attach to the detach carried out (the switching reading).
        let learned = py(1000.0)
            + 100.0 * COSTS.launch_event_ns
            + py(1000.0)
            + 100.0 * COSTS.launch_event_ns
            + py(3000.0)
            + 50.0 * COSTS.launch_count_ns;
        assert!((e.learning_added_ns - learned).abs() < 1e-6, "{e:?}");
        assert_eq!(e.learnings, 1);
        // Without any change, the steady state is the whole run.
        let e = estimate(
            &[Stats(stats(S, 10, 0)), Stats(stats(2 * S, 20, 0))],
            true,
            &COSTS,
        );
        assert_eq!(e.steady_from_ns, S);
        assert_eq!(e.steady_hits.py_enter, 10);
    }
}
