//! The report's last sections: the data's quality and the daemon's own cost.
use super::*;

pub(super) fn data_quality(s: &Summary) -> Markup {
    let q = &s.data_quality;
    let lost = match (&q.events_lost, q.lost_ratio) {
        (Some(l), Some(r)) if l.total + l.seq_gaps > 0 => {
            format!("{} lost ({})", l.total + l.seq_gaps, pct(r))
        }
        (Some(_), _) => "0 lost".to_owned(),
        (None, _) => "loss unknown".to_owned(),
    };
    let mut rows: Vec<(&str, String)> = vec![
        ("confidence", q.confidence.as_str().to_owned()),
        ("events", format!("{} recorded, {lost}", q.events_recorded)),
        (
            "engine",
            format!(
                "unmatched {} · reordered {} · partial steps dropped {}",
                q.unmatched_events, q.reordered_events, q.partial_steps_dropped
            ),
        ),
        ("samples", q.samples.to_string()),
        (
            "CUDA libraries",
            if q.cuda_libraries.is_empty() {
                "none".to_owned()
            } else {
                q.cuda_libraries.join(", ")
            },
        ),
    ];
    for f in &q.probes_failed {
        rows.push((
            "probe not attached",
            format!("{} in {}: {}", f.probe, f.file, f.reason),
        ));
    }
    for n in &q.notes {
        rows.push(("note", n.clone()));
    }
    html! {
        h2 { "Data quality" }
        (rows_table("data-quality", &rows))
        "\n"
    }
}

pub(super) fn overhead(s: &Summary) -> Markup {
    let Some(o) = &s.daemon_overhead else {
        return html! {
            h2 { "Daemon cost" }
            p class="note" id="daemon-cost" {
                "Not in this summary (a stream recorded before the daemon counted its probe hits)."
            }
            "\n"
        };
    };
    let f2 = |x: Option<f64>, unit: &str| x.map_or("—".to_owned(), |v| format!("{v:.2}{unit}"));
    let mut rows: Vec<(&str, String)> = vec![
        (
            "steady (since the last probe-set change)",
            format!(
                "{} per step · {} of step",
                f2(o.steady_us_per_step, " µs"),
                f2(o.steady_pct_of_step, "%")
            ),
        ),
        (
            "whole run",
            format!(
                "{} per step · {} of step",
                f2(o.estimated_us_per_step, " µs"),
                f2(o.estimated_pct_of_step, "%")
            ),
        ),
        ("budget", f2(o.budget_pct, "% of step")),
    ];
    for p in &o.probe_sets {
        rows.push((
            "probe set",
            format!(
                "at {:.1} s: {}{} — {}",
                p.at_s,
                if p.python {
                    "every probe (frame evaluator included)"
                } else {
                    "torch markers + CUDA probes"
                },
                if p.launch_events {
                    ""
                } else {
                    ", launches counted only"
                },
                p.reason
            ),
        ));
    }
    html! {
        h2 { "Daemon cost" }
        (rows_table("daemon-cost", &rows))
        p class="note" {
            "An estimate: probe hits × measured per-hit cost (docs/overhead.md), not a \
             measurement of the target."
        }
        "\n"
    }
}
