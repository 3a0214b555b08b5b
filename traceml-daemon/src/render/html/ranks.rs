//! The report's multi-rank section: the ranks' table and chart, the timeline of the last
//! collectives around the culprit, and a hung job's stacks.
use super::*;

/// Colors of the ranks chart: own work (median step − median collective_wait) and collective wait.
pub(super) const OWN_WORK_COLOR: &str = "#4c78a8";
pub(super) const COLLECTIVE_WAIT_COLOR: &str = PHASE_COLORS[Phase::CollectiveWait as usize];
/// Most frames of one rank's stack shown (the innermost ones).
pub const MAX_STACK_FRAMES: usize = 64;

/// The rank the others wait for: the primary finding's, else a STRAGGLER's or HANG's.
pub(super) fn culprit_rank(s: &Summary) -> Option<u32> {
    s.primary_diagnosis.culprit_rank.or_else(|| {
        s.findings
            .iter()
            .filter(|f| matches!(f.kind, DiagnosisKind::Straggler | DiagnosisKind::Hang))
            .find_map(|f| f.culprit_rank)
    })
}

/// A multi-rank job: one row per rank, the culprit marked; each rank's own work against its
/// collective wait; each rank's stack when the job hung. Nothing for a single process.
pub(super) fn ranks(s: &Summary) -> Markup {
    if s.ranks.is_empty() {
        return html! {};
    }
    let culprit = culprit_rank(s);
    let job = s.job.as_ref().map(crate::render::job_line);
    let hung = s.primary_diagnosis.kind == DiagnosisKind::Hang
        || s.findings.iter().any(|f| f.kind == DiagnosisKind::Hang);
    html! {
        h2 { "Ranks" }
        @if let Some(job) = &job {
            div class="meta" { (Text(job)) }
        }
        (ranks_table(s, culprit))
        p class="note" {
            "Medians over each rank's complete steps, ms. The own verdict is the rank's as if it \
             ran alone; ◀ culprit marks the rank the others wait for."
        }
        "\n"
        (trusted(ranks_chart(s)))
        p class="note" {
            "Own work: median step − median collective_wait. The rank with the most own work is \
             the one the others wait for at the collectives."
        }
        "\n"
        @if let Some(w) = &s.collective_waits {
            h3 { "Collectives, by rank" }
            p id="collective-waits" { (Text(&crate::render::collective_waits_line(w))) }
            @if !w.timeline.is_empty() {
                (trusted(collective_timeline(w)))
                p class="note" {
                    "The newest collectives joined across the ranks: each bar runs from a rank's \
                     entry to the collective's end on it; red, the rank the others waited for \
                     (the last to enter, by more than the noise)."
                }
            }
            "\n"
        }
        @if hung {
            (hang_stacks(s, culprit))
        }
    }
}

/// The per-rank timeline of the newest joined collectives.
pub(super) fn collective_timeline(w: &crate::summary::CollectiveWaits) -> String {
    let mut ranks: Vec<u32> = w
        .timeline
        .iter()
        .flat_map(|c| c.ranks.iter().map(|r| r.rank))
        .collect();
    ranks.sort_unstable();
    ranks.dedup();
    let rows: Vec<crate::render::svg::TimelineRow> = ranks
        .iter()
        .map(|&rank| {
            let bars = w
                .timeline
                .iter()
                .filter_map(|c| {
                    let r = c.ranks.iter().find(|r| r.rank == rank)?;
                    Some((
                        r.enter_ts,
                        r.exit_ts.unwrap_or(r.enter_ts),
                        c.waited_for == Some(rank),
                    ))
                })
                .collect();
            (format!("rank {rank}"), bars)
        })
        .collect();
    crate::render::svg::collective_timeline(
        "chart-collectives",
        "The newest collectives, by rank",
        &rows,
    )
}

/// One row per rank: pid, steps, median step, each shown phase's median (collective_wait
/// last), its own verdict; the culprit's row marked.
pub(super) fn ranks_table(s: &Summary, culprit: Option<u32>) -> Markup {
    let columns: Vec<Phase> = s
        .shown_phases()
        .into_iter()
        .filter(|&p| p != Phase::CollectiveWait)
        .chain([Phase::CollectiveWait])
        .collect();
    html! {
        table id="ranks" {
            tr {
                th { "rank" }
                th class="n" { "pid" }
                th class="n" { "steps" }
                th class="n" { "median step" }
                @for p in &columns {
                    th class="n" { (Text(p.name())) }
                }
                th { "own verdict" }
                th {}
            }
            @for r in &s.ranks {
                @let is_culprit = culprit == Some(r.rank);
                @let local = r.local_rank.map(|l| format!(" (local {l})")).unwrap_or_default();
                tr class=[is_culprit.then_some("culprit")] {
                    td { (Text(&format!("{}{local}", r.rank))) }
                    td class="n" { (r.pid) }
                    td class="n" { (r.steps) }
                    td class="n" { (Text(&ms(r.step_ms.median))) }
                    @for &p in &columns {
                        td class="n" { (Text(&ms(r.phases[p].median_ms))) }
                    }
                    td { (Text(&r.verdict.headline())) }
                    td { @if is_culprit { "◀ culprit" } }
                }
            }
        }
    }
}

/// Each rank's Python stack when the job hung, the culprit marked.
pub(super) fn hang_stacks(s: &Summary, culprit: Option<u32>) -> Markup {
    html! {
        h2 { "Stacks at the hang" }
        div id="rank-stacks" {
            p class="note" {
                "Each rank's Python stack when the hang was found, outermost frame first, \
                 innermost last."
            }
            @for r in &s.ranks {
                p class="note" {
                    (Text(&format!("rank {} · pid {}", r.rank, r.pid)))
                    @if culprit == Some(r.rank) { " ◀ culprit" }
                }
                @if r.stack.is_empty() {
                    pre { "(stack unknown)" }
                } @else {
                    pre { (stack_text(&r.stack)) }
                }
            }
        }
        "\n"
    }
}

/// Own work and collective wait per rank, as grouped bars.
pub(super) fn ranks_chart(s: &Summary) -> String {
    let groups: Vec<BarGroup> = s
        .ranks
        .iter()
        .map(|r| {
            let wait = r.phases[Phase::CollectiveWait].median_ms;
            BarGroup {
                label: r.rank.to_string(),
                values: vec![r.step_ms.median.map(|m| m - wait.unwrap_or(0.0)), wait],
            }
        })
        .collect();
    let bands = [
        Band {
            name: "own work",
            color: OWN_WORK_COLOR,
        },
        Band {
            name: "collective_wait",
            color: COLLECTIVE_WAIT_COLOR,
        },
    ];
    let ms_fmt = svg::num;
    svg::grouped_bars(
        "chart-ranks",
        "Own work and collective wait per rank",
        "rank",
        &Axis {
            label: "ms (median)",
            fmt: &ms_fmt,
        },
        &bands,
        &groups,
    )
}

/// One rank's stack, one frame a line, outermost first: its innermost [`MAX_STACK_FRAMES`]
/// frames, after a line counting the outer ones left out.
pub(super) fn stack_text(stack: &[String]) -> Markup {
    let skip = stack.len().saturating_sub(MAX_STACK_FRAMES);
    let mut frames: Vec<&str> = stack[skip..].iter().map(String::as_str).collect();
    // No blank lines at the end of the block.
    while frames.last().is_some_and(|f| f.is_empty()) {
        frames.pop();
    }
    html! {
        @if skip > 0 {
            "… " (skip) " outer frames"
            @if !frames.is_empty() { "\n" }
        }
        @for (i, f) in frames.iter().enumerate() {
            @if i > 0 { "\n" }
            (Text(f))
        }
    }
}
