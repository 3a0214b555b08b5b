//! How far the summary can be trusted: events lost and why, probes that failed, the engine's
//! own counts of what it could not place (`data_quality`).
use super::*;

/// Loss ratio from which confidence is medium, and from which it is low.
pub(super) const LOSS_MEDIUM: f64 = 0.01;
pub(super) const LOSS_LOW: f64 = 0.10;

pub(super) fn data_quality(
    engine: &EngineOutput,
    items: &[StreamItem],
    t: Option<&TargetInfo>,
    cuda_libraries: Vec<String>,
    samples: usize,
) -> DataQuality {
    use crate::summary::Confidence;
    let events_recorded = if engine.events > 0 {
        engine.events
    } else {
        items
            .iter()
            .filter(|i| matches!(i, StreamItem::Event(_)))
            .count() as u64
    };
    let lost = lost_counts(items);
    let lost_n = lost.as_ref().map(|l| l.total + l.seq_gaps);
    let lost_ratio = lost_n.map(|n| {
        if n == 0 {
            0.0
        } else {
            n as f64 / (n + events_recorded) as f64
        }
    });
    let probes_failed = probes_failed(items);
    let end_reason = items
        .iter()
        .find_map(|i| match i {
            StreamItem::End(e) => Some(e.reason),
            _ => None,
        })
        .unwrap_or(EndReason::Truncated);

    let mut confidence = Confidence::High;
    let mut notes = Vec::new();
    let mut lower = |to: Confidence, note: String| {
        confidence = confidence.min(to);
        notes.push(note);
    };
    if let (Some(n), Some(r)) = (lost_n, lost_ratio) {
        if r >= LOSS_LOW {
            lower(
                Confidence::Low,
                format!("{n} events lost ({:.1}% of events)", r * 100.0),
            );
        } else if r >= LOSS_MEDIUM {
            lower(
                Confidence::Medium,
                format!("{n} events lost ({:.1}% of events)", r * 100.0),
            );
        }
    }
    let odd = engine.unmatched_events;
    if events_recorded > 0 && odd as f64 / events_recorded as f64 >= LOSS_MEDIUM {
        lower(
            Confidence::Medium,
            format!("{odd} events could not be placed in a step"),
        );
    }
    if !probes_failed.is_empty() {
        let names: Vec<&str> = probes_failed.iter().map(|p| p.probe.as_str()).collect();
        lower(
            Confidence::Medium,
            format!("probes not attached: {}", names.join(", ")),
        );
    }
    if let Some(deep) = lost.as_ref().map(|l| l.too_deep).filter(|&n| n > 0) {
        // Not lost: the probes do not follow calls past their depth (TRACK_STACK open calls, or
        // the kernel's uretprobe nesting); each such call's time stays with its caller, so the
        // phases, delimited by shallow frames, keep it. Said, not counted against confidence.
        notes.push(format!(
            "{deep} calls deeper than the probes follow ({} open calls on a thread) were not \
             reported; their time stays with their callers",
            traceml_common::TRACK_STACK
        ));
    }
    if end_reason == EndReason::Truncated {
        notes.push("the recording ended without an end record".to_owned());
    }
    DataQuality {
        events_recorded,
        events_lost: lost,
        lost_ratio,
        probes_failed,
        python_version: t.and_then(|t| t.python_version.clone()),
        cuda_libraries,
        own_runtime_libraries: Vec::new(),
        driver_pointers_followed: Vec::new(),
        boundary: engine.boundary,
        unmatched_events: engine.unmatched_events,
        reordered_events: engine.reordered_events,
        events_after_exec: engine.after_exec_events,
        partial_steps_dropped: engine.partial_steps_dropped,
        samples: u32::try_from(samples).unwrap_or(u32::MAX),
        end_reason,
        confidence,
        notes,
    }
}

/// The last loss counts in the stream.
fn lost_counts(items: &[StreamItem]) -> Option<LostCounts> {
    items.iter().rev().find_map(|i| match i {
        StreamItem::Lost(l) => Some(LostCounts {
            ring_full: l.ring_full,
            read_failed: l.read_failed,
            state_full: l.state_full,
            undecodable: l.undecodable,
            seq_gaps: l.seq_gaps,
            off_cpu_ring_full: l.off_cpu_ring_full,
            too_deep: l.too_deep,
            total: l.total(),
        }),
        _ => None,
    })
}

/// Every probe that could not be placed.
fn probes_failed(items: &[StreamItem]) -> Vec<ProbeFailed> {
    items
        .iter()
        .filter_map(|i| match i {
            StreamItem::ProbeFailed(p) => Some(ProbeFailed {
                probe: p.probe.clone(),
                file: p.file.clone(),
                reason: p.reason.clone(),
            }),
            _ => None,
        })
        .collect()
}
