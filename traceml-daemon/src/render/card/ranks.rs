//! The card's lines for a multi-rank job: its ranks, who it waited for at its collectives,
//! its stragglers, its restarts.
use super::*;

/// A multi-rank job: one row per rank (median step and phases, ms), the culprit marked.
pub(super) fn ranks(s: &Summary, out: &mut Lines) {
    if s.ranks.is_empty() {
        return;
    }
    out.rule('─');
    let culprit = s.primary_diagnosis.culprit_rank;
    let cols = [
        (Phase::InputWait, "input"),
        (Phase::Forward, "fwd"),
        (Phase::Backward, "bwd"),
        (Phase::Optimizer, "opt"),
        (Phase::GpuWait, "gpu_w"),
        (Phase::CollectiveWait, "coll_w"),
    ];
    let mut head = format!("{:<10}{:>6}{:>9}", "RANKS", "steps", "step");
    for (_, n) in cols {
        head.push_str(&format!("{n:>9}"));
    }
    out.push(head);
    for r in &s.ranks {
        let mut line = format!(
            "{:<10}{:>6}{:>9}",
            format!("rank {}", r.rank),
            r.steps,
            r.step_ms.median.map_or("—".into(), |v| format!("{v:.1}"))
        );
        for (p, _) in cols {
            line.push_str(&format!(
                "{:>9}",
                r.phases[p]
                    .median_ms
                    .map_or("—".into(), |v| format!("{v:.1}"))
            ));
        }
        if culprit == Some(r.rank) {
            line.push_str("  ◀ culprit");
        }
        out.push(line);
    }
    if let Some(j) = &s.job {
        labeled(out, "", &format!("(ms, medians) {}", job_line(j)));
    }
    if let Some(st) = &s.stragglers {
        labeled(out, "", &stragglers_line(st));
    }
    if let Some(w) = &s.collective_waits {
        labeled(out, "LEDGER", &collective_waits_line(w));
    }
}

/// The ledger's line: "48 collectives joined · the job waited for rank 2: last at 47 (98%),
/// median 33.3 ms after the others · desync: rank 1 called broadcast #15, ranks 0,2,3
/// all_reduce #15 · open: ranks 0,2,3 inside all_reduce #29".
pub fn collective_waits_line(w: &crate::summary::CollectiveWaits) -> String {
    let mut parts = vec![format!(
        "{} collectives joined across the ranks",
        w.compared
    )];
    match w
        .waits_for
        .and_then(|r| w.ranks.iter().find(|x| x.rank == r))
    {
        Some(r) => parts.push(format!(
            "the job waited for rank {}: last to enter at {} ({:.0}%){}",
            r.rank,
            r.last,
            r.last_share * 100.0,
            r.median_late_ms
                .map(|m| format!(", median {m:.1} ms after the others"))
                .unwrap_or_default()
        )),
        None if w.compared > 0 => parts.push("no rank was last at most of them".into()),
        None => {}
    }
    for d in &w.desyncs {
        parts.push(format!("desync: {}", crate::ledgers::said(d)));
    }
    if let Some((open, _)) = crate::ledgers::open_said(w) {
        parts.push(format!("open: {open}"));
    }
    parts.join(" · ")
}

/// The job's line, for the card and the HTML report alike: ranks measured, world size, launcher,
/// master, run id, restarts, as known.
pub fn job_line(j: &crate::summary::JobInfo) -> String {
    let mut parts = vec![format!("{} ranks measured", j.ranks_measured)];
    if let Some(w) = j.world_size {
        parts.push(format!("world size {w}"));
    }
    if let Some(l) = j.launcher_pid {
        parts.push(format!("launcher pid {l}"));
    }
    if let Some(m) = &j.master {
        parts.push(format!("master {m}"));
    }
    if let Some(r) = &j.run_id {
        parts.push(format!("run id {r}"));
    }
    if j.restarts > 0 {
        parts.push(restarted(j.restarts));
    }
    parts.join(" · ")
}

/// "stragglers: transient: rank 2 in steps 20–40 (20 steps), 0.4 s of the others' time · slow
/// steps 25% of 80".
pub fn stragglers_line(st: &crate::summary::Stragglers) -> String {
    let who = match st.rank {
        Some(r) => format!("rank {r}"),
        None => "the slow rank changes every few steps".to_owned(),
    };
    let episodes: Vec<String> = st
        .episodes
        .iter()
        .take(3)
        .map(|e| {
            format!(
                "rank {} in steps {}–{} ({:.1} s lost)",
                e.rank,
                e.from_step,
                e.to_step,
                e.lost_ms / 1e3
            )
        })
        .collect();
    let more = st.episodes.len().saturating_sub(3);
    let mut text = format!(
        "stragglers: {}: {who} · slow steps {:.0}% of {} · {:.1} s of the others' time",
        st.class.as_str(),
        st.slow_share * 100.0,
        st.steps,
        st.lost_ms / 1e3
    );
    if !episodes.is_empty() {
        text.push_str(&format!(" · episodes: {}", episodes.join(", ")));
        if more > 0 {
            text.push_str(&format!(" and {more} more"));
        }
    }
    text
}

/// An elastic job's restarts, as the job's line says them.
pub fn restarted(n: u32) -> String {
    let times = if n == 1 {
        "once".to_owned()
    } else {
        format!("{n} times")
    };
    format!("restarted {times} (elastic): ranks of attempt {}", n + 1)
}
