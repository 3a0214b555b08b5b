//! The card's last lines: the daemon's own cost and the probe set that ran, and the data's
//! quality (what was lost, what was attached, how sure the verdict is).
use super::*;

/// The label column of the card's last two sections ("DATA QUALITY  ", "DAEMON COST   ").
const WIDE_LABEL: usize = 14;

/// The daemon's own cost and the probe set that ran.
pub(super) fn overhead(s: &Summary, out: &mut Lines) {
    let Some(o) = &s.daemon_overhead else {
        return;
    };
    let set = match o.probe_sets.last() {
        Some(last) if last.watching => {
            "torch markers only (watching for training: no CUDA or frame-evaluator probe)"
                .to_owned()
        }
        Some(last) if !last.python && o.probe_sets.len() > 1 => format!(
            "torch markers + CUDA probes (frame-evaluator probe detached at {:.1} s)",
            last.at_s
        ),
        Some(last) if !last.python => "torch markers + CUDA probes".to_owned(),
        Some(_) => "every probe, frame evaluator included".to_owned(),
        None => "unknown".to_owned(),
    };
    let launches = if o.probe_sets.last().is_some_and(|l| !l.launch_events) {
        " · launches counted only"
    } else {
        ""
    };
    let cost = match (o.steady_us_per_step, o.steady_pct_of_step) {
        (Some(us), Some(pct)) => format!("est. {us:.0} µs/step ({pct:.2}% of step)"),
        (Some(us), None) => format!("est. {us:.0} µs/step"),
        // Steps, but none once the last probe change was carried out (the run ended first):
        // the share of CPU time, said so rather than "no steps".
        _ if s.steps.count > 0 => match o.steady_pct_of_cpu.or(o.estimated_pct_of_cpu) {
            Some(pct) => format!(
                "est. {pct:.2}% of the target's CPU time (no step after the last probe change)"
            ),
            None => "estimate unavailable (no step after the last probe change)".to_owned(),
        },
        _ => match o.steady_pct_of_cpu.or(o.estimated_pct_of_cpu) {
            Some(pct) => format!("est. {pct:.2}% of the target's CPU time (no steps)"),
            None => "estimate unavailable (no steps)".to_owned(),
        },
    };
    let budget = o
        .budget_pct
        .map(|b| format!("; budget {b}%"))
        .unwrap_or_default();
    let whole = match o.estimated_pct_of_step {
        Some(p) if o.probe_sets.len() > 1 => format!("; {p:.2}% over the whole run"),
        _ => String::new(),
    };
    // What learning the loop cost, paid once per attach (and per new loop), not per step.
    let learning = match (o.learning_ms, o.learning_periods) {
        (Some(ms), n) => {
            let t = if ms >= 1000.0 {
                format!("{:.2} s", ms / 1e3)
            } else {
                format!("{ms:.0} ms")
            };
            let times = match n {
                0 | 1 => "once".to_owned(),
                n => format!("over {n} learnings"),
            };
            format!(" · learning: est. {t} of the target's time, {times}")
        }
        (None, _) => String::new(),
    };
    let text = format!("{set}{launches} · {cost}{budget}{whole}{learning}");
    let parts: Vec<&str> = text.split(" · ").collect();
    items(out, Some("DAEMON COST"), WIDE_LABEL, &parts, str::to_owned);
}

pub(super) fn data_quality(s: &Summary, p: &Painter, out: &mut Lines) {
    let q = &s.data_quality;
    let mut parts = Vec::new();
    let lost = match (&q.events_lost, q.lost_ratio) {
        (Some(l), Some(r)) if l.total + l.seq_gaps > 0 => {
            format!("{} lost ({})", l.total + l.seq_gaps, pct(r))
        }
        (Some(_), _) => "0 lost".to_owned(),
        (None, _) => "loss unknown".to_owned(),
    };
    parts.push(format!("events {} recorded, {lost}", q.events_recorded));
    if q.events_recorded == 0 {
        parts.push("no probe events".to_owned());
    } else if q.probes_failed.is_empty() {
        parts.push("all probes attached".to_owned());
    } else {
        let names: Vec<&str> = q.probes_failed.iter().map(|f| f.probe.as_str()).collect();
        parts.push(format!("probes not attached: {}", names.join(", ")));
    }
    let libs: Vec<&str> = q
        .cuda_libraries
        .iter()
        .map(|l| l.rsplit('/').next().unwrap_or(l))
        .collect();
    parts.push(if libs.is_empty() {
        "CUDA: none".to_owned()
    } else {
        format!("CUDA: {}", libs.join(", "))
    });
    parts.push(format!(
        "unmatched {}, reordered {}, partial steps dropped {}, {} samples",
        q.unmatched_events, q.reordered_events, q.partial_steps_dropped, q.samples
    ));
    // The headline first: what was recorded and lost, and how far to trust it.
    parts.insert(2, format!("confidence {}", q.confidence.as_str()));
    let head = parts[..3].join(" · ");
    let mut lines: Vec<&str> = vec![&head];
    lines.extend(parts[3..].iter().map(String::as_str));
    let label = p.bold("DATA QUALITY");
    let label = format!("{label}{}", " ".repeat(WIDE_LABEL - "DATA QUALITY".len()));
    items(out, Some(&label), WIDE_LABEL, &lines, str::to_owned);
    let notes: Vec<String> = q.notes.iter().map(|n| format!("note: {n}")).collect();
    let notes: Vec<&str> = notes.iter().map(String::as_str).collect();
    items(out, None, WIDE_LABEL, &notes, |l| p.dim(l));
}
