//! The daemon's own cost on the target (`daemon_overhead`): the probe counters and probe-set
//! changes of the stream through the cost model of [`crate::overhead`].
use super::*;

/// The daemon's estimated cost from the probe counters and the probe-set changes in the stream.
pub(super) fn daemon_overhead(
    steps: &[Step],
    step_count: u64,
    items: &[StreamItem],
    target: Option<&TargetInfo>,
) -> Option<DaemonOverhead> {
    use crate::overhead::Observation;
    let seq: Vec<Observation> = items
        .iter()
        .filter_map(|i| match i {
            StreamItem::ProbeStats(s) => Some(Observation::Stats(*s)),
            StreamItem::ProbeSet(p) => Some(Observation::Set {
                launch_events: p.launch_events,
                learning: p.python && !p.python_steady,
            }),
            _ => None,
        })
        .collect();
    if !seq.iter().any(|o| matches!(o, Observation::Stats(_))) {
        return None;
    }
    let sets: Vec<&crate::event::ProbeSet> = items
        .iter()
        .filter_map(|i| match i {
            StreamItem::ProbeSet(p) => Some(&**p),
            _ => None,
        })
        .collect();
    let initial_events = !target.is_some_and(|t| t.launch_count_only);
    let costs =
        crate::overhead::CostModel::for_machine(target.and_then(|t| t.calibration.as_ref()));
    let est = crate::overhead::estimate(&seq, initial_events, &costs);
    let median_step_ms = median(
        &steps
            .iter()
            .map(|s| ns_to_ms(duration_ns(s)))
            .collect::<Vec<_>>(),
    );
    // Steps since the last switch, scaled from the kept sample to the run's count.
    let steady_steps = if steps.is_empty() {
        0
    } else {
        let kept = steps
            .iter()
            .filter(|s| s.start_ns >= est.steady_from_ns)
            .count();
        (kept as f64 / steps.len() as f64 * step_count as f64).round() as usize
    };
    let all_steps = step_count as usize;
    let per_step = |ns: f64, n: usize| (n > 0).then(|| ns / n as f64 / 1e3);
    let pct = |us: Option<f64>| {
        us.zip(median_step_ms)
            .filter(|&(_, m)| m > 0.0)
            .map(|(us, m)| us / (m * 1e3) * 100.0)
    };
    let attach = target.map(|t| t.attach_ts_ns).unwrap_or(0);
    let cpu = cpu_seconds(items);
    let cpu_ns_from = |from: u64| cpu_ns_from(&cpu, from);
    let pct_of_cpu = |added: f64, from: u64| {
        cpu_ns_from(from)
            .and_then(|c| crate::overhead::share_of_cpu(added, c))
            .map(|f| f * 100.0)
    };
    let estimated = per_step(est.added_ns, all_steps);
    let steady = per_step(est.steady_added_ns, steady_steps);
    Some(DaemonOverhead {
        budget_pct: target.and_then(|t| t.overhead_budget_pct),
        estimated_us_per_step: estimated,
        estimated_pct_of_step: pct(estimated),
        steady_us_per_step: steady,
        steady_pct_of_step: pct(steady),
        hits_per_step: hits(&est.hits, all_steps),
        steady_hits_per_step: hits(&est.steady_hits, steady_steps),
        probe_sets: sets.iter().map(|p| probe_set(p, attach)).collect(),
        estimated_pct_of_cpu: pct_of_cpu(est.added_ns, 0),
        steady_pct_of_cpu: pct_of_cpu(est.steady_added_ns, est.steady_from_ns),
        learning_ms: (est.learnings > 0).then(|| est.learning_added_ns / 1e6),
        learning_periods: est.learnings,
        calibration: target.and_then(|t| t.calibration),
        cost_model: costs,
    })
}

/// Hits of each probe per step over `n` steps.
fn hits(h: &crate::event::ProbeStats, n: usize) -> ProbeHits {
    let f = |v: u64| (n > 0).then(|| v as f64 / n as f64);
    ProbeHits {
        python: f(h.py_enter),
        returns: f(h.exit),
        native_calls: f(h.call_enter),
        record_function: f(h.record),
        launches: f(h.launch),
        // Absent from recordings made before the switches were counted.
        switches: (h.switch > 0).then(|| f(h.switch)).flatten(),
    }
}

/// The target's CPU seconds from its /proc samples: (ts, seconds).
fn cpu_seconds(items: &[StreamItem]) -> Vec<(u64, f64)> {
    items
        .iter()
        .filter_map(|i| match i {
            StreamItem::Sample(s) => s
                .process
                .as_ref()
                .and_then(|p| p.cpu_seconds)
                .filter(|c| c.is_finite())
                .map(|c| (s.ts, c)),
            _ => None,
        })
        .collect()
}

/// The target's CPU time (ns) between its first and last sample from `from` on.
fn cpu_ns_from(cpu: &[(u64, f64)], from: u64) -> Option<f64> {
    let mut it = cpu.iter().filter(|(ts, _)| *ts >= from);
    let first = it.next()?;
    let last = it.next_back()?;
    Some((last.1 - first.1) * 1e9)
}

/// A probe-set change as the summary lists it (seconds from the attach).
fn probe_set(p: &crate::event::ProbeSet, attach: u64) -> ProbeSetChange {
    ProbeSetChange {
        at_s: p.ts.saturating_sub(attach) as f64 / 1e9,
        python: p.python,
        launch_events: p.launch_events,
        reason: p.reason.clone(),
        watching: p.watching,
    }
}
