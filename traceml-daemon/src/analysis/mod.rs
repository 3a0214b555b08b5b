//! Aggregation: the phase engine's steps and the stream's samples and bookkeeping items turned
//! into one [`Summary`] (statistics per step and phase, CUDA activity, system/process/worker/GPU
//! metrics, memory over time, data quality), then diagnosed by [`crate::diagnosis`].
//!
//! Pure: no clock, no I/O. A metric that was never measured stays `None`, never 0; non-finite
//! sample values are ignored.
use std::collections::{BTreeMap, HashMap};

use crate::engine::{EngineOutput, Step, StepTotals};
use crate::event::{EndReason, StreamItem, TargetInfo};
use crate::phase::Phase;
use crate::sample::Sample;
use crate::stats::{finite, mean, median, median_u64, quantile};
use crate::summary::{
    CudaStats, DaemonOverhead, DataQuality, EvalPhase, Evaluation, GpuDeviceStats, GpuStats,
    LostCounts, MemoryStats, MicroBatches, PhaseStats, Phases, ProbeFailed, ProbeHits,
    ProbeSetChange, ProcessStats, RunInfo, SCHEMA_VERSION, StepMs, StepSamples, StepsInfo, Summary,
    SystemStats, TargetSummary, WorkerState, WorkerStats,
};

mod cost;
mod quality;
mod samples;

use cost::daemon_overhead;
use quality::data_quality;
use samples::*;

/// Runs the phase engine over the stream, then [`summarize`]s: a [`Collector`] fed with every
/// item, so a replay and a live run go through the same code.
pub fn analyze(items: &[StreamItem]) -> Summary {
    let mut c = Collector::new();
    for i in items {
        c.push(i);
    }
    c.finish()
}

/// Most /proc + NVML samples kept for the summary (a time-ordered, thinned sample beyond).
pub const MAX_SAMPLES_KEPT: usize = 2048;

/// The bounded fold of a stream into what its summary needs: the streaming [`Engine`] gets the
/// events and stack samples; of the rest it keeps a thinned sample of the periodic samples, the
/// latest loss counters, the probe counters around each probe-set change, and the rare items
/// (target, libraries, failures, probe sets, names). Memory does not grow with the run's length.
pub struct Collector {
    engine: crate::engine::Engine,
    kept: Vec<StreamItem>,
    samples: crate::engine::Thinned<StreamItem>,
    stats: Option<StreamItem>,
    lost: Option<StreamItem>,
    events: u64,
    /// A probe-set change was seen; its first settled counter reading is kept.
    await_settled: bool,
    /// The last stack sample (what the training thread is doing now).
    last_stack: Option<crate::event::StackSample>,
}

impl Default for Collector {
    fn default() -> Self {
        Collector::new()
    }
}

impl Collector {
    pub fn new() -> Collector {
        Collector {
            engine: crate::engine::Engine::new(),
            kept: Vec::new(),
            samples: crate::engine::Thinned::new(MAX_SAMPLES_KEPT),
            stats: None,
            lost: None,
            events: 0,
            await_settled: false,
            last_stack: None,
        }
    }

    pub fn push(&mut self, item: &StreamItem) {
        match item {
            StreamItem::Event(_) => {
                self.events += 1;
                self.engine.push(item);
            }
            StreamItem::Stack(s) => {
                self.last_stack = Some((**s).clone());
                self.engine.push(item);
            }
            StreamItem::Code(_) | StreamItem::WorkerStack(_) => self.engine.push(item),
            StreamItem::Func(_) => {
                self.engine.push(item);
                self.kept.push(item.clone());
            }
            StreamItem::Sample(_) => self.samples.push(item.clone()),
            StreamItem::Lost(_) => self.lost = Some(item.clone()),
            // The cost estimate is linear in the counters' deltas: the reading before each
            // probe-set change, the first settled one after it, and the last one give the same
            // sums as every reading.
            StreamItem::ProbeStats(s) => {
                if self.await_settled && !s.switching {
                    self.kept.push(item.clone());
                    self.await_settled = false;
                } else {
                    self.stats = Some(item.clone());
                }
            }
            StreamItem::ProbeSet(_) => {
                self.kept.extend(self.stats.take());
                self.engine.push(item);
                self.kept.push(item.clone());
                self.await_settled = true;
            }
            _ => self.kept.push(item.clone()),
        }
    }

    /// Probe events seen so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// The stream's clock reached `now` with no new item (see [`crate::engine::Engine::advance`]).
    pub fn advance(&mut self, now: u64) {
        self.engine.advance(now);
    }

    /// Steps measured so far (and their total duration, ns): what a hang detector watches.
    pub fn steps(&self) -> (u64, u64) {
        self.engine.steps_so_far()
    }

    /// Whether the target waits for a collective now ([`crate::engine::Engine::in_collective_wait`]).
    pub fn in_collective_wait(&self) -> bool {
        self.engine.in_collective_wait()
    }

    /// The last stack sample, named: `file:function` per frame, outermost first.
    pub fn last_stack(&self) -> Vec<String> {
        let Some(s) = &self.last_stack else {
            return Vec::new();
        };
        let names: HashMap<u32, String> = self
            .kept
            .iter()
            .filter_map(|i| match i {
                StreamItem::Func(f) => Some((
                    f.id,
                    format!("{}:{}", crate::profile::short_file(&f.file), f.function),
                )),
                _ => None,
            })
            .collect();
        s.frames
            .iter()
            .map(|id| names.get(id).cloned().unwrap_or_else(|| "?".into()))
            .collect()
    }

    /// The summary of the run so far, leaving the fold as it is (a copy of its bounded state).
    pub fn snapshot(&self) -> Summary {
        self.fork().finish()
    }

    /// [`Collector::snapshot`] with the exact step sums behind it (the metrics exporter's
    /// counters and histogram).
    pub fn snapshot_with_totals(&self) -> (Summary, StepTotals) {
        self.fork().finish_with_totals()
    }

    /// A copy of the fold's bounded state.
    fn fork(&self) -> Collector {
        Collector {
            engine: self.engine.clone(),
            kept: self.kept.clone(),
            samples: self.samples.clone(),
            stats: self.stats.clone(),
            lost: self.lost.clone(),
            events: self.events,
            await_settled: self.await_settled,
            last_stack: None,
        }
    }

    /// An empty fold for a new window that knows what the run knows so far: the target, its
    /// libraries, code classes, function names, the probe set in force and its counters.
    pub fn fresh_window(&self) -> Collector {
        let mut c = Collector::new();
        c.engine = crate::engine::Engine::with_codes_of(&self.engine);
        let last_set = self
            .kept
            .iter()
            .rev()
            .find(|i| matches!(i, StreamItem::ProbeSet(_)))
            .cloned();
        for i in &self.kept {
            if !matches!(
                i,
                StreamItem::ProbeSet(_) | StreamItem::ProbeStats(_) | StreamItem::End(_)
            ) {
                c.kept.push(i.clone());
            }
        }
        // The window's cost starts from the counters now, in the probe set in force.
        c.kept.extend(self.stats.clone());
        c.kept.extend(last_set);
        c
    }

    pub fn finish(self) -> Summary {
        self.finish_with_totals().0
    }

    /// [`Collector::finish`] with the exact step sums behind the summary.
    pub fn finish_with_totals(self) -> (Summary, StepTotals) {
        let Collector {
            engine,
            mut kept,
            samples,
            stats,
            lost,
            ..
        } = self;
        kept.extend(stats);
        kept.extend(lost);
        kept.extend(samples.items);
        let out = engine.finish();
        (summarize(&out, &kept), out.totals)
    }
}

/// Builds the summary of a run from the engine's output and the stream it came from.
pub fn summarize(engine: &EngineOutput, items: &[StreamItem]) -> Summary {
    let target = items.iter().find_map(|i| match i {
        StreamItem::Target(t) => Some(&**t),
        _ => None,
    });
    let samples: Vec<&Sample> = items
        .iter()
        .filter_map(|i| match i {
            StreamItem::Sample(s) => Some(&**s),
            _ => None,
        })
        .collect();
    // `steps` is a bounded sample of the run's steps (all of them up to
    // `engine::MAX_STEPS_KEPT`); counts, means and shares come from the exact totals.
    let steps = &engine.steps;
    let totals = if engine.totals.count > 0 {
        engine.totals.clone()
    } else {
        StepTotals::from_steps(steps)
    };
    // The shape of a step (its duration and phases) from the steps not taken under the
    // learning probe set, whose cost inflates them, when there are any.
    let steady_kept: Vec<Step> = steps.iter().filter(|s| !s.learning).cloned().collect();
    let steady = if engine.totals.count > 0 {
        engine.steady.clone()
    } else {
        StepTotals::from_steps(&steady_kept)
    };
    let use_steady = steady.count > 0 && !steady_kept.is_empty();
    let shape_totals = if use_steady { &steady } else { &totals };
    let cuda_libraries = cuda_libraries(items);
    let num_cpus = target.map(|t| t.num_cpus).filter(|&n| n > 0);

    let mut summary = Summary {
        schema_version: SCHEMA_VERSION,
        daemon_version: target
            .map(|t| t.daemon_version.clone())
            .filter(|v| !v.is_empty()),
        target: target_summary(target),
        run: run_info(target, steps, &totals, engine.last_ts, items),
        primary_diagnosis: crate::diagnosis::placeholder(),
        findings: Vec::new(),
        steps: steps_info(engine, items, &totals, use_steady.then_some(&steady)),
        evaluation: Evaluation::default(),
        // Medians and the per-step series over every kept step (a median is robust to the few
        // learning steps, and bimodal steps, a DataLoader's workers delivering in bursts, make
        // it jump between modes when some are left out); means and shares over the steady ones.
        step_ms: step_ms(steps, shape_totals),
        phases: phase_stats(
            steps,
            shape_totals,
            !cuda_libraries.is_empty(),
            engine.thread_states,
        ),
        cuda: cuda_stats(shape_totals, !cuda_libraries.is_empty()),
        system: system_stats(&samples, target),
        process: process_stats(&samples, num_cpus),
        workers: worker_stats(&samples),
        gpu: gpu_stats(&samples::while_training(&samples, steps)),
        memory: memory_stats(steps, &samples, target.map(|t| t.attach_ts_ns)),
        data_quality: data_quality(engine, items, target, cuda_libraries, samples.len()),
        daemon_overhead: daemon_overhead(steps, totals.count, items, target),
        step_samples: step_samples(steps),
        job: None,
        ranks: Vec::new(),
        what_if: Vec::new(),
        collectives: collective_log(&engine.ledger),
        collective_waits: None,
        stragglers: None,
    };
    summary.evaluation = evaluation(&engine.evaluation, summary.run.duration_s);
    let switched_to_count = items
        .iter()
        .any(|i| matches!(i, StreamItem::ProbeSet(p) if !p.launch_events));
    if target.is_some_and(|t| t.launch_count_only) || switched_to_count {
        count_mode_launches(&mut summary, items);
    }
    summary.data_quality.own_runtime_libraries =
        samples::libraries_of(items, &[crate::event::OWN_RUNTIME_ROLE]);
    summary.data_quality.driver_pointers_followed = items
        .iter()
        .filter_map(|i| match i {
            StreamItem::Library(l) if l.role == crate::event::FOLLOWED_ROLE => Some(&l.probes),
            _ => None,
        })
        .flatten()
        .cloned()
        .collect();
    summary
        .data_quality
        .notes
        .extend(samples::gpu_notes(&samples));
    add_top_functions(&mut summary, engine, items);
    add_worker_profile(&mut summary, engine, items, &samples);
    blocked_compute(&mut summary);
    let (primary, findings) = crate::diagnosis::diagnose(&summary);
    summary.primary_diagnosis = primary;
    summary.findings = findings;
    summary.what_if = crate::whatif::what_if(&summary);
    summary
}

/// How the steps were found and counted; `steady`: the totals without the learning steps,
/// where those are left out of the shape.
fn steps_info(
    engine: &EngineOutput,
    items: &[StreamItem],
    totals: &StepTotals,
    steady: Option<&StepTotals>,
) -> StepsInfo {
    StepsInfo {
        count: u32::try_from(totals.count).unwrap_or(u32::MAX),
        boundary: engine.boundary,
        training_tid: engine.training_tid,
        micro_batches: micro_batches(&engine.steps, totals),
        learning_excluded: steady.map_or(0, |st| {
            u32::try_from(totals.count - st.count).unwrap_or(u32::MAX)
        }),
        // Only where torch's marker probes were placed could a marker have been seen.
        markers: items
            .iter()
            .any(|i| matches!(i, StreamItem::Library(l) if l.role == "torch" && !l.probes.is_empty()))
            .then_some(engine.markers),
        feeders: engine
            .feeders
            .iter()
            .map(|f| crate::summary::FeederStats {
                tid: f.tid,
                fetches: f.fetches,
                fetch_ms: ns_to_ms(f.fetch_ns),
            })
            .collect(),
        framework: crate::summary::LoopFramework::of(items.iter().filter_map(|i| match i {
            StreamItem::Func(f) => Some((f.function.as_str(), f.file.as_str())),
            _ => None,
        })),
    }
}

/// A compute phase whose own time is mostly spent blocked, with no device work in it to wait
/// for: its time is not compute, whatever the markers say (input read inside the loop with no
/// marker of the model's first call, a lock). Above this share of the phase.
pub const BLOCKED_COMPUTE_SHARE: f64 = 0.5;

/// The consistency check of the thread states against the phases (see
/// [`BLOCKED_COMPUTE_SHARE`]): such a phase lowers the confidence to low, with the numbers.
fn blocked_compute(summary: &mut Summary) {
    for p in [Phase::Forward, Phase::Backward, Phase::Optimizer] {
        let st = &summary.phases[p];
        let (Some(mean), Some(blocked)) = (st.mean_ms, st.blocked_ms) else {
            continue;
        };
        let device_work = st.launches_per_step.is_some_and(|l| l >= 1.0);
        if device_work
            || mean <= 0.0
            || blocked / mean < BLOCKED_COMPUTE_SHARE
            || st.share.unwrap_or(0.0) < 0.10
        {
            continue;
        }
        let q = &mut summary.data_quality;
        q.confidence = q.confidence.min(crate::summary::Confidence::Low);
        q.notes.push(format!(
            "{} is {:.0}% blocked ({blocked:.1} ms of {mean:.1} ms per step) with no device \
             work to wait for: its time is not compute (the loop may read its input there \
             without a marker)",
            p.name(),
            blocked / mean * 100.0
        ));
    }
}

/// Names the functions inside each phase from the stack samples the engine placed.
/// The stream's stack-sample function names, by id.
fn funcs_of(items: &[StreamItem]) -> HashMap<u32, crate::event::FuncInfo> {
    items
        .iter()
        .filter_map(|i| match i {
            StreamItem::Func(f) => Some((f.id, (**f).clone())),
            _ => None,
        })
        .collect()
}

fn add_top_functions(summary: &mut Summary, engine: &EngineOutput, items: &[StreamItem]) {
    if engine.samples.is_empty() {
        return;
    }
    let funcs = funcs_of(items);
    let profile = crate::profile::profile(&engine.samples, &funcs);
    for p in Phase::ALL {
        let stats = &mut summary.phases[p];
        stats.stack_samples = profile.samples[p.index()];
        stats.top_functions = profile.top[p.index()].clone();
        stats.blocked_in = profile.blocked[p.index()].clone();
    }
    summary.phases.gpu_wait.wait_sites = profile.wait_sites;
}

/// The ledger's totals and its newest entries ([`crate::summary::COLLECTIVES_KEPT`]).
fn collective_log(l: &crate::engine::ledger::Ledger) -> Option<crate::summary::CollectiveLog> {
    (l.total > 0).then(|| crate::summary::CollectiveLog {
        total: l.total,
        per_group: l.per_group.clone(),
        recent: l
            .entries
            .iter()
            .skip(
                l.entries
                    .len()
                    .saturating_sub(crate::summary::COLLECTIVES_KEPT),
            )
            .cloned()
            .collect(),
    })
}

/// The workers' profile ([`crate::pipeline`]): their folded stack samples, their CPU seconds
/// between the first and the last /proc reading that saw them (per worker, last reading minus
/// first), and the batches the training thread fetched between those readings (the
/// micro-batches of the steps inside that window).
fn add_worker_profile(
    summary: &mut Summary,
    engine: &EngineOutput,
    items: &[StreamItem],
    samples: &[&Sample],
) {
    if engine.workers.samples == 0 {
        return;
    }
    let funcs = funcs_of(items);
    let mut span: BTreeMap<u32, (f64, f64)> = BTreeMap::new();
    let mut window: Option<(u64, u64)> = None;
    for s in samples {
        for w in &s.workers {
            if let Some(c) = w.cpu_seconds.filter(|c| c.is_finite()) {
                let e = span.entry(w.pid).or_insert((c, c));
                e.0 = e.0.min(c);
                e.1 = e.1.max(c);
                let (a, b) = window.get_or_insert((s.ts, s.ts));
                *a = (*a).min(s.ts);
                *b = (*b).max(s.ts);
            }
        }
    }
    let cpu_s = (!span.is_empty()).then(|| span.values().map(|(a, b)| b - a).sum::<f64>());
    let batches = window
        .map(|(a, b)| {
            engine
                .steps
                .iter()
                .filter(|s| s.start_ns >= a && s.end_ns <= b)
                .map(|s| u64::from(s.micro_batches.max(1)))
                .sum::<u64>()
                * engine.step_stride.max(1)
        })
        .filter(|&b| b > 0);
    let handover = crate::profile::handover(&engine.samples, &funcs);
    summary.workers.profile =
        crate::pipeline::worker_profile(&engine.workers, &funcs, cpu_s, batches, &handover);
}

/// `--launch-mode count`: no launch events, only the kernel's whole-run counters. Launches per
/// phase are unknown (null) and launches per step is the run's average, said in a note.
fn count_mode_launches(summary: &mut Summary, items: &[StreamItem]) {
    let totals = items.iter().rev().find_map(|i| match i {
        StreamItem::LaunchTotals(t) => Some(t),
        _ => None,
    });
    for p in Phase::ALL {
        summary.phases[p].launches_per_step = None;
    }
    let steps = summary.steps.count;
    summary.cuda.launches_per_step = match totals {
        Some(t) if summary.cuda.measured && steps > 0 => {
            // Each launch once: a runtime launch's own driver call is not another.
            let by_path = t.by_path();
            Some(by_path.iter().sum::<u64>() as f64 / f64::from(steps))
        }
        _ => None,
    };
    summary.cuda.launches_by_path = totals
        .filter(|_| summary.cuda.measured)
        .and_then(|t| crate::summary::LaunchesByPath::per_step(t.by_path(), steps.into()));
    summary.data_quality.notes.push(
        "launches counted in the kernel (--launch-mode count): launches per step is a whole-run \
         average and launches per phase are unknown"
            .to_owned(),
    );
}

fn ns_to_ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn duration_ns(s: &Step) -> u64 {
    s.end_ns.saturating_sub(s.start_ns)
}

/// Rounds a millisecond value for [`StepSamples`]: 0.01 ms below 100 ms, 0.1 ms above.
fn round_ms(x: f64) -> f64 {
    if x.abs() >= 100.0 {
        (x * 10.0).round() / 10.0
    } else {
        (x * 100.0).round() / 100.0
    }
}

// ---------------------------------------------------------------------------------------------
// Sections.

fn target_summary(t: Option<&TargetInfo>) -> TargetSummary {
    let Some(t) = t else {
        return TargetSummary::default();
    };
    TargetSummary {
        pid: Some(t.pid),
        comm: Some(t.comm.clone()).filter(|c| !c.is_empty()),
        cmdline: t.cmdline.clone(),
        python: t.python_version.clone(),
        hostname: Some(t.hostname.clone()).filter(|h| !h.is_empty()),
        num_cpus: Some(t.num_cpus).filter(|&n| n > 0),
        mem_total_bytes: t.mem_total_bytes,
        identity: t.identity.clone(),
    }
}

fn run_info(
    t: Option<&TargetInfo>,
    steps: &[Step],
    totals: &StepTotals,
    last_event_ts: Option<u64>,
    items: &[StreamItem],
) -> RunInfo {
    let attach_ns = t.map(|t| t.attach_ts_ns);
    let end_ns = items
        .iter()
        .find_map(|i| match i {
            StreamItem::End(e) => Some(e.ts),
            _ => None,
        })
        .or_else(|| last_ts(items).max(last_event_ts));
    let secs = |from: u64, to: u64| to.checked_sub(from).map(|d| d as f64 / 1e9);
    RunInfo {
        attach_unix_s: t.and_then(|t| finite(t.attach_unix_s)).filter(|&s| s > 0.0),
        duration_s: attach_ns.zip(end_ns).and_then(|(a, e)| secs(a, e)),
        measured_s: (totals.count > 0).then(|| totals.duration_ns as f64 / 1e9),
        first_step_s: attach_ns
            .zip(steps.first())
            .and_then(|(a, s)| secs(a, s.start_ns)),
        end: items.iter().find_map(|i| match i {
            StreamItem::End(e) => e.target.as_deref().cloned(),
            _ => None,
        }),
    }
}

/// Largest timestamp of any event, sample or library item.
fn last_ts(items: &[StreamItem]) -> Option<u64> {
    items
        .iter()
        .filter_map(|i| match i {
            StreamItem::Event(e) => Some(e.ts),
            StreamItem::Sample(s) => Some(s.ts),
            StreamItem::Library(l) => Some(l.ts),
            StreamItem::End(e) => Some(e.ts),
            _ => None,
        })
        .max()
}

/// Micro-batches per step; `null` without steps or where no step had one.
fn micro_batches(steps: &[Step], totals: &StepTotals) -> Option<MicroBatches> {
    if totals.count == 0 || totals.micro_batches == 0 {
        return None;
    }
    Some(MicroBatches {
        total: totals.micro_batches,
        mean: totals.micro_batches as f64 / totals.count as f64,
        min: steps.iter().map(|s| s.micro_batches).min().unwrap_or(0),
        max: steps.iter().map(|s| s.micro_batches).max().unwrap_or(0),
    })
}

/// The evaluation segments in seconds and shares: of the run's wall time, and per phase of
/// their own.
fn evaluation(e: &crate::engine::EvalTotals, run_s: Option<f64>) -> Evaluation {
    let wall_s = e.wall_ns as f64 / 1e9;
    Evaluation {
        segments: e.segments,
        batches: e.batches,
        wall_s,
        share_of_wall: run_s
            .filter(|&r| r > 0.0)
            .map(|r| (wall_s / r).clamp(0.0, 1.0)),
        phases: (e.wall_ns > 0).then(|| {
            Phases::from_fn(|p| EvalPhase {
                total_s: e.phase_ns[p.index()] as f64 / 1e9,
                share: e.phase_ns[p.index()] as f64 / e.wall_ns as f64,
            })
        }),
    }
}

fn step_ms(steps: &[Step], totals: &StepTotals) -> StepMs {
    let ms: Vec<f64> = steps.iter().map(|s| ns_to_ms(duration_ns(s))).collect();
    StepMs {
        median: median(&ms),
        p90: quantile(&ms, 0.9),
        mean: totals.per_step(totals.duration_ns).map(|ns| ns / 1e6),
        min: quantile(&ms, 0.0),
        max: quantile(&ms, 1.0),
        groups: step_groups_of(&ms, totals.count),
    }
}

/// The step times' groups ([`crate::stats::two_groups`]) of the kept steps `ms` of a run of
/// `total` steps, slowest first, their counts scaled to the run.
pub fn step_groups_of(ms: &[f64], total: u64) -> Vec<crate::summary::StepGroup> {
    let Some((lo, hi)) = crate::stats::two_groups(ms) else {
        return Vec::new();
    };
    let n = (lo.len() + hi.len()) as f64;
    let total = total.max(n as u64) as f64;
    let group = |g: &[f64]| crate::summary::StepGroup {
        count: (g.len() as f64 / n * total).round() as u64,
        share: g.len() as f64 / n,
        typical_ms: median(g).unwrap_or(0.0),
        min_ms: g[0],
        max_ms: g[g.len() - 1],
    };
    vec![group(&hi), group(&lo)]
}

fn phase_stats(
    steps: &[Step],
    totals: &StepTotals,
    cuda_measured: bool,
    thread_states: bool,
) -> Phases<PhaseStats> {
    let total = totals.duration_ns;
    Phases::from_fn(|p| {
        let ms: Vec<f64> = steps
            .iter()
            .map(|s| ns_to_ms(s.phase_ns[p.index()]))
            .collect();
        let phase_total = totals.phase_ns[p.index()];
        PhaseStats {
            median_ms: median(&ms),
            mean_ms: totals.per_step(phase_total).map(|ns| ns / 1e6),
            share: (total > 0).then(|| (phase_total as f64 / total as f64).clamp(0.0, 1.0)),
            launches_per_step: if cuda_measured {
                totals.per_step(totals.launches[p.index()])
            } else {
                None
            },
            cpu_ms: thread_states
                .then(|| {
                    let off = totals.blocked_ns[p.index()] + totals.runnable_ns[p.index()];
                    totals.per_step(phase_total.saturating_sub(off))
                })
                .flatten()
                .map(|ns| ns / 1e6),
            blocked_ms: thread_states
                .then(|| totals.per_step(totals.blocked_ns[p.index()]))
                .flatten()
                .map(|ns| ns / 1e6),
            io_ms: thread_states
                .then(|| totals.per_step(totals.io_ns[p.index()]))
                .flatten()
                .map(|ns| ns / 1e6),
            runnable_ms: thread_states
                .then(|| totals.per_step(totals.runnable_ns[p.index()]))
                .flatten()
                .map(|ns| ns / 1e6),
            ..PhaseStats::default()
        }
    })
}

fn cuda_stats(t: &StepTotals, measured: bool) -> CudaStats {
    if !measured || t.count == 0 {
        return CudaStats {
            measured,
            ..CudaStats::default()
        };
    }
    let (h2d_bytes, h2d_copies, h2d_ns) = (t.h2d_bytes, t.h2d_copies, t.h2d_ns);
    CudaStats {
        measured,
        launches_per_step: t.per_step(t.launches.iter().sum()),
        h2d_bytes_per_step: t.per_step(h2d_bytes),
        h2d_copies_per_step: t.per_step(h2d_copies),
        h2d_bytes_per_copy: (h2d_copies > 0).then(|| h2d_bytes as f64 / h2d_copies as f64),
        h2d_ms_per_step: t.per_step(h2d_ns).map(|ns| ns / 1e6),
        // bytes per ns is GB/s.
        h2d_gb_per_s: (h2d_copies > 0 && h2d_ns > 0).then(|| h2d_bytes as f64 / h2d_ns as f64),
        d2h_bytes_per_step: t.per_step(t.d2h_bytes),
        d2h_copies_per_step: t.per_step(t.d2h_copies),
        d2h_ms_per_step: t.per_step(t.d2h_ns).map(|ns| ns / 1e6),
        syncs_per_step: t.per_step(t.syncs),
        launches_by_path: crate::summary::LaunchesByPath::per_step(t.launches_by_path, t.count),
    }
}

fn step_samples(steps: &[Step]) -> StepSamples {
    let stride = steps.len().div_ceil(StepSamples::MAX).max(1);
    let kept: Vec<&Step> = steps.iter().step_by(stride).collect();
    StepSamples {
        stride: u32::try_from(stride).unwrap_or(u32::MAX),
        step_ms: kept
            .iter()
            .map(|s| round_ms(ns_to_ms(duration_ns(s))))
            .collect(),
        // A phase that never occurred (collective_wait of a single process) keeps no series.
        phase_ms: Phases::from_fn(|p: Phase| {
            if p == Phase::CollectiveWait && kept.iter().all(|s| s.phase_ns[p.index()] == 0) {
                return Vec::new();
            }
            kept.iter()
                .map(|s| round_ms(ns_to_ms(s.phase_ns[p.index()])))
                .collect()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary::DiagnosisKind;
    use crate::testkit::*;

    /// What went wrong reading the GPUs is said once per trouble: a slow call's growing
    /// milliseconds by their last wording, each lost GPU apart, in order of first appearance.
    #[test]
    fn gpu_notes_say_each_trouble_once() {
        let at = |note: &str| Sample {
            gpu_note: Some(note.to_owned()),
            ..Sample::default()
        };
        let samples = [
            at("NVML calls took up to 120 ms (nvmlDeviceGetName), read off the event loop"),
            Sample::default(),
            at("GPU 0 lost (NVML_ERROR_GPU_IS_LOST) 2 s into sampling; \
                NVML calls took up to 410 ms (nvmlDeviceGetComputeRunningProcesses), read off the \
                event loop"),
            at("GPU 0 lost (NVML_ERROR_GPU_IS_LOST) 2 s into sampling; \
                GPU 1 lost (NVML_ERROR_GPU_IS_LOST) 3 s into sampling"),
        ];
        let refs: Vec<&Sample> = samples.iter().collect();
        assert_eq!(
            samples::gpu_notes(&refs),
            [
                "GPU: NVML calls took up to 410 ms (nvmlDeviceGetComputeRunningProcesses), read \
                 off the event loop",
                "GPU: GPU 0 lost (NVML_ERROR_GPU_IS_LOST) 2 s into sampling",
                "GPU: GPU 1 lost (NVML_ERROR_GPU_IS_LOST) 3 s into sampling",
            ]
        );
    }

    #[test]
    fn empty_stream_gives_nulls_not_zeros() {
        let s = summarize(&EngineOutput::default(), &[]);
        assert_eq!(s.steps.count, 0);
        assert_eq!(s.step_ms.median, None);
        assert_eq!(s.phases.forward.share, None);
        assert_eq!(s.cuda.launches_per_step, None);
        assert_eq!(s.process.rss_bytes_max, None);
        assert_eq!(s.workers.count, None);
        assert!(s.gpu.is_none());
        assert_eq!(s.data_quality.end_reason, EndReason::Truncated);
        assert_eq!(s.primary_diagnosis.kind, DiagnosisKind::InsufficientData);
    }

    #[test]
    fn aggregates_steps_phases_and_copies() {
        let sc = Scenario {
            jitter: 0.0,
            ..Scenario::default()
        };
        let s = summary(&sc);
        assert_eq!(s.steps.count, 200);
        assert!((s.step_ms.median.unwrap() - 100.0).abs() < 0.01);
        assert!((s.phases.backward.share.unwrap() - 0.5).abs() < 1e-6);
        assert!((s.phases.forward.median_ms.unwrap() - 30.0).abs() < 1e-6);
        let share_sum: f64 = s.phases.iter().map(|(_, p)| p.share.unwrap()).sum();
        assert!((share_sum - 1.0).abs() < 1e-9);
        assert_eq!(s.cuda.launches_per_step, Some(392.0));
        assert_eq!(s.cuda.h2d_bytes_per_copy, Some(6_291_456.0));
        // 12.6 MB in 1 ms.
        assert!((s.cuda.h2d_gb_per_s.unwrap() - 12.582912).abs() < 1e-6);
        assert_eq!(s.cuda.syncs_per_step, Some(1.0));
        assert_eq!(s.step_samples.step_ms.len(), 200);
        assert_eq!(s.data_quality.cuda_libraries.len(), 2);
        assert_eq!(s.target.pid, Some(4242));
        assert_eq!(
            s.run.duration_s.map(|d| (d * 10.0).round() / 10.0),
            Some(20.6)
        );
    }

    #[test]
    fn samples_give_process_worker_and_gpu_metrics() {
        let s = summary(&input_bound());
        assert_eq!(s.workers.count, Some(4));
        assert_eq!(s.workers.state, Some(WorkerState::Busy));
        let p = s.process.cpu_pct_machine_mean.unwrap();
        assert!(p > 6.0 && p < 6.7, "{p}");
        assert_eq!(s.process.threads_max, Some(37));
        let g = s.gpu.as_ref().unwrap();
        assert_eq!(g.util_pct_mean, Some(30.0));
        assert!(g.devices[0].used_by_target);
        let no_gpu = summary(&Scenario {
            gpu: false,
            ..Scenario::default()
        });
        assert!(no_gpu.gpu.is_none());
        assert_eq!(no_gpu.memory.gpu_process_mem_bytes_by_third, None);
    }

    #[test]
    fn memory_thirds_follow_growth() {
        let s = summary(&Scenario {
            rss_growth: 4 << 20,
            ..Scenario::default()
        });
        let [a, b, c] = s.memory.rss_bytes_by_third.unwrap();
        assert!(a < b && b < c, "{a} {b} {c}");
    }

    #[test]
    fn long_runs_are_decimated_and_small() {
        let s = summary(&Scenario {
            steps: 5000,
            ..Scenario::default()
        });
        assert_eq!(s.step_samples.stride, 5);
        assert_eq!(s.step_samples.step_ms.len(), 1000);
        let s = summary(&Scenario {
            steps: 1000,
            ..Scenario::default()
        });
        let json = crate::render::to_json(&s);
        assert!(
            json.len() <= 50_000,
            "summary of 1000 steps is {} bytes",
            json.len()
        );
    }

    #[test]
    fn losses_lower_confidence() {
        let s = summary(&Scenario {
            lost: 1_000,
            ..Scenario::default()
        });
        // 1000 lost of 3000 events.
        assert_eq!(s.data_quality.confidence, crate::summary::Confidence::Low);
        assert_eq!(
            s.primary_diagnosis.confidence,
            crate::summary::Confidence::Low
        );
        assert!(
            s.primary_diagnosis.why.contains("1000 events lost"),
            "{}",
            s.primary_diagnosis.why
        );
    }

    #[test]
    fn calls_too_deep_to_follow_are_said_not_lost() {
        // torch.compile's first step recurses past the probes' depth thousands of times.
        let (e, mut items) = build(&input_bound());
        for i in &mut items {
            if let StreamItem::Lost(l) = i {
                l.too_deep = 7_526;
            }
        }
        let s = summarize(&e, &items);
        let q = &s.data_quality;
        assert_eq!(
            q.events_lost.as_ref().map(|l| (l.too_deep, l.total)),
            Some((7_526, 0))
        );
        assert_eq!(q.lost_ratio, Some(0.0));
        assert_eq!(q.confidence, crate::summary::Confidence::High);
        assert!(
            q.notes.iter().any(|n| n.starts_with("7526 calls deeper")),
            "{:?}",
            q.notes
        );
        assert!(
            !s.primary_diagnosis.why.contains("lost"),
            "{}",
            s.primary_diagnosis.why
        );
    }

    #[test]
    fn analyze_runs_the_engine() {
        let s = analyze(&[]);
        assert_eq!(s.steps.count, 0);
        assert_eq!(s.primary_diagnosis.kind, DiagnosisKind::InsufficientData);
    }

    #[test]
    fn weird_steps_do_not_panic() {
        let mut e = EngineOutput::default();
        e.steps.push(Step {
            start_ns: 10,
            end_ns: 5,
            ..Step::default()
        });
        e.steps.push(Step {
            start_ns: 0,
            end_ns: 0,
            ..Step::default()
        });
        let s = summarize(&e, &[]);
        assert_eq!(s.steps.count, 2);
        assert_eq!(s.phases.forward.share, None);
        let _ = crate::render::to_json(&s);
    }
}
