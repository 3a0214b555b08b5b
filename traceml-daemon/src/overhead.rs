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
use crate::event::ProbeStats;

/// Added target time per probe hit, in ns.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CostModel {
    pub py_enter_ns: f64,
    pub exit_ns: f64,
    pub call_enter_ns: f64,
    pub record_ns: f64,
    pub launch_event_ns: f64,
    pub launch_count_ns: f64,
}

pub const COSTS: CostModel = CostModel {
    py_enter_ns: 800.0,
    exit_ns: 700.0,
    call_enter_ns: 800.0,
    record_ns: 900.0,
    launch_event_ns: 950.0,
    launch_count_ns: 500.0,
};

impl CostModel {
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
}

/// How the governor may choose probes (`--probe-set`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Policy {
    /// Learn the loop with every probe, then keep only what the budget allows.
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
    pub policy: Policy,
    /// Budget as a fraction of step time (0.005 = 0.5 %).
    pub budget: f64,
    /// Shortest learning period with the frame-evaluator probe armed.
    pub learn_min_ns: u64,
    /// Steps the markers must have delimited while learning before the probe is detached.
    pub learn_steps: u64,
    /// Longest wait for the training thread's interpreter state (for stack samples) before
    /// detaching anyway.
    pub learn_max_ns: u64,
    /// No step marker for this long while detached: the loop changed; learn it again.
    pub relearn_after_ns: u64,
}

impl GovernorConfig {
    pub fn new(policy: Policy, budget: f64) -> Self {
        GovernorConfig {
            policy,
            budget,
            // Every probe costs ~26 % of a HF Trainer's step while learning (BENCHMARKS.md
            // section 6): learn no longer than the markers need (the live loop looks every
            // 250 ms while learning).
            learn_min_ns: 500_000_000,
            learn_steps: 3,
            learn_max_ns: 10_000_000_000,
            relearn_after_ns: 30_000_000_000,
        }
    }
}

/// What the governor saw in one tick.
#[derive(Clone, Copy, Debug)]
pub struct Tick {
    pub now: u64,
    /// Counters now (cumulative).
    pub stats: ProbeStats,
    /// Markers since the last tick.
    pub markers: Markers,
    /// The training thread's interpreter state is known (stack samples can run without the
    /// frame-evaluator probe).
    pub stacks_ready: bool,
}

/// The probe set the governor wants from now on.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub python: bool,
    pub launch_events: bool,
    pub reason: String,
}

/// Chooses the probe set from the probes' hit rates and the step rate.
#[derive(Debug)]
pub struct Governor {
    cfg: GovernorConfig,
    python: bool,
    launch_events: bool,
    /// When the current learning period started (frame-evaluator probe armed by the governor).
    learning_since: Option<u64>,
    learn_steps: u64,
    learn_backward: u64,
    last: Option<ProbeStats>,
    last_marker_ns: u64,
}

impl Governor {
    /// `python`/`launch_events`: the probe set at attach.
    pub fn new(cfg: GovernorConfig, now: u64, python: bool, launch_events: bool) -> Self {
        Governor {
            cfg,
            python,
            launch_events,
            learning_since: (cfg.policy == Policy::Auto && python).then_some(now),
            learn_steps: 0,
            learn_backward: 0,
            last: None,
            last_marker_ns: now,
        }
    }

    /// Learning the loop with the frame-evaluator probe armed (the live loop then ticks faster).
    pub fn learning(&self) -> bool {
        self.learning_since.is_some()
    }

    /// The probe set to start with under `policy`.
    pub fn initial(policy: Policy) -> bool {
        policy != Policy::Markers
    }

    /// One look at the counters (about once a second); `Some` when the probe set should change.
    pub fn tick(&mut self, t: Tick) -> Option<Decision> {
        let prev = self.last.replace(t.stats);
        let d = prev.map(|p| delta(&p, &t.stats)).unwrap_or_default();
        let steps = t.markers.steps();
        if steps > 0 {
            self.last_marker_ns = t.now;
        }
        let mut want = Decision {
            python: self.python,
            launch_events: self.launch_events,
            reason: String::new(),
        };
        let mut reasons = Vec::new();
        if self.cfg.policy == Policy::Auto {
            if let Some(since) = self.learning_since {
                self.learn_steps += steps;
                self.learn_backward += t.markers.backward;
                let learned = t.now.saturating_sub(since) >= self.cfg.learn_min_ns
                    && self.learn_steps >= self.cfg.learn_steps;
                let waited = t.now.saturating_sub(since) >= self.cfg.learn_max_ns;
                if learned && (t.stacks_ready || waited) {
                    want.python = false;
                    reasons.push(format!(
                        "torch's markers delimit the steps ({} steps, {} backward passes while \
                         learning): frame-evaluator probe detached",
                        self.learn_steps, self.learn_backward
                    ));
                    self.learning_since = None;
                }
            } else if !self.python
                && t.now.saturating_sub(self.last_marker_ns) >= self.cfg.relearn_after_ns
            {
                want.python = true;
                reasons.push(format!(
                    "no step marker for {:.0} s: the loop changed; frame-evaluator probe re-armed \
                     to learn it",
                    t.now.saturating_sub(self.last_marker_ns) as f64 / 1e9
                ));
                self.learning_since = Some(t.now);
                self.learn_steps = 0;
                self.learn_backward = 0;
                self.last_marker_ns = t.now;
            }
        }
        // Launch storms: per-launch events cost more than half the budget per step.
        if self.launch_events && self.cfg.policy != Policy::Full && steps > 0 {
            let interval = t.now.saturating_sub(prev.map(|p| p.ts).unwrap_or(t.now));
            let step_ns = interval as f64 / steps as f64;
            let per_step = d.launch as f64 / steps as f64 * COSTS.launch_event_ns;
            if step_ns > 0.0 && per_step > step_ns * self.cfg.budget / 2.0 {
                want.launch_events = false;
                reasons.push(format!(
                    "{:.0} kernel launches per step would cost {:.2} % of the step as events: \
                     launches are counted in the kernel from now on",
                    d.launch as f64 / steps as f64,
                    per_step / step_ns * 100.0
                ));
            }
        }
        if want.python == self.python && want.launch_events == self.launch_events {
            return None;
        }
        self.python = want.python;
        self.launch_events = want.launch_events;
        want.reason = reasons.join("; ");
        Some(want)
    }
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
}

/// What the estimate reads from the stream, in stream order.
#[derive(Clone, Copy, Debug)]
pub enum Observation {
    /// Cumulative counters.
    Stats(ProbeStats),
    /// A probe-set change; whether launches are events from then on.
    Set { launch_events: bool },
}

/// Sums the cost of every counter delta, costing launches in the mode in force when the delta
/// ends (a change applies to the deltas after it in the stream). The steady state starts at
/// the first reading after the last change that is not `switching`.
pub fn estimate(seq: &[Observation], initial_launch_events: bool) -> Estimate {
    let mut out = Estimate::default();
    let last_set = seq
        .iter()
        .rposition(|o| matches!(o, Observation::Set { .. }));
    let mut mode = initial_launch_events;
    let mut prev = ProbeStats::default();
    let mut steady_base: Option<ProbeStats> = None;
    for (i, o) in seq.iter().enumerate() {
        match *o {
            Observation::Set { launch_events } => mode = launch_events,
            Observation::Stats(s) => {
                let c = COSTS.cost(&delta(&prev, &s), mode);
                out.added_ns += c;
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

    #[test]
    fn detaches_python_once_markers_carry_steps_and_stacks_are_ready() {
        let mut g = Governor::new(GovernorConfig::new(Policy::Auto, 0.005), 0, true, true);
        let m = Markers {
            dataloader: 10,
            optimizer: 10,
            backward: 10,
        };
        let tick = |now, stacks_ready| Tick {
            now,
            stats: stats(now, now / 1000, 0),
            markers: m,
            stacks_ready,
        };
        assert!(g.learning());
        // Too early.
        assert_eq!(g.tick(tick(S / 4, true)), None);
        // Learned, but the training thread's state is unknown: wait (up to learn_max).
        assert_eq!(g.tick(tick(S, false)), None);
        let d = g.tick(tick(2 * S, true)).expect("detach");
        assert!(!d.python && d.launch_events, "{d:?}");
        assert!(d.reason.contains("detached"), "{}", d.reason);
        assert!(!g.learning());
        assert_eq!(g.tick(tick(4 * S, true)), None);
    }

    #[test]
    fn keeps_python_without_markers_and_relearns_when_markers_stop() {
        let mut g = Governor::new(GovernorConfig::new(Policy::Auto, 0.005), 0, true, true);
        let none = Markers::default();
        for i in 1..20 {
            let t = Tick {
                now: i * S,
                stats: stats(i * S, i * 1000, 0),
                markers: none,
                stacks_ready: true,
            };
            assert_eq!(g.tick(t), None, "no markers: the probe stays");
        }
        let steps = Markers {
            dataloader: 5,
            optimizer: 5,
            backward: 5,
        };
        let d = g
            .tick(Tick {
                now: 20 * S,
                stats: stats(20 * S, 20_000, 0),
                markers: steps,
                stacks_ready: true,
            })
            .expect("markers appeared");
        assert!(!d.python);
        // 30 s without a marker: re-arm.
        let d = g
            .tick(Tick {
                now: 51 * S,
                stats: stats(51 * S, 20_000, 0),
                markers: none,
                stacks_ready: true,
            })
            .expect("re-arm");
        assert!(d.python && d.reason.contains("re-armed"), "{d:?}");
    }

    #[test]
    fn full_and_markers_policies_never_switch_python() {
        for (policy, python) in [(Policy::Full, true), (Policy::Markers, false)] {
            let mut g = Governor::new(GovernorConfig::new(policy, 0.005), 0, python, true);
            for i in 1..40 {
                let m = if i < 5 {
                    Markers {
                        dataloader: 10,
                        optimizer: 10,
                        backward: 10,
                    }
                } else {
                    Markers::default()
                };
                let d = g.tick(Tick {
                    now: i * S,
                    stats: stats(i * S, 0, 0),
                    markers: m,
                    stacks_ready: true,
                });
                assert!(d.is_none_or(|d| d.python == python), "{policy:?}");
            }
        }
    }

    #[test]
    fn launch_storm_switches_to_count_mode() {
        let mut g = Governor::new(GovernorConfig::new(Policy::Markers, 0.005), 0, false, true);
        let m = Markers {
            dataloader: 100,
            optimizer: 100,
            backward: 100,
        };
        // 100 steps of 10 ms, 10 launches each: 9.5 µs of 10 ms = 0.095 % < 0.25 %: keep.
        g.tick(Tick {
            now: S,
            stats: stats(S, 0, 0),
            markers: m,
            stacks_ready: true,
        });
        assert_eq!(
            g.tick(Tick {
                now: 2 * S,
                stats: stats(2 * S, 0, 1000),
                markers: m,
                stacks_ready: true,
            }),
            None
        );
        // 500 launches a step: 475 µs of 10 ms = 4.75 %: count mode.
        let d = g
            .tick(Tick {
                now: 3 * S,
                stats: stats(3 * S, 0, 51_000),
                markers: m,
                stacks_ready: true,
            })
            .expect("count mode");
        assert!(
            !d.launch_events && d.reason.contains("500 kernel launches"),
            "{d:?}"
        );
    }

    #[test]
    fn estimate_costs_launches_in_the_mode_in_force() {
        use Observation::{Set, Stats};
        let switching = ProbeStats {
            switching: true,
            ..stats(2 * S + 1, 5000, 250)
        };
        let seq = [
            Stats(stats(S, 1000, 100)),
            Stats(stats(2 * S, 2000, 200)),
            Set {
                launch_events: false,
            },
            // The detach is still under way: its hits are paid, but not the steady state.
            Stats(switching),
            Stats(stats(3 * S, 5000, 300)),
            Stats(stats(4 * S, 5000, 400)),
        ];
        let e = estimate(&seq, true);
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
        // Without any change, the steady state is the whole run.
        let e = estimate(&[Stats(stats(S, 10, 0)), Stats(stats(2 * S, 20, 0))], true);
        assert_eq!(e.steady_from_ns, S);
        assert_eq!(e.steady_hits.py_enter, 10);
    }
}
