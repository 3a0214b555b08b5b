//! The report's two tables of the card ([`super::super::card::tables`]), the same rows as HTML
//! tables: the training thread's own time in each phase, and the code inside the phases.
use maud::{Markup, html};

use super::Text;
use crate::render::card::tables::{code_groups, percent, shows_io, thread_rows};
use crate::summary::Summary;
use crate::units::pct;

/// The training thread's own time in each phase (`table#thread`): nothing without the
/// thread-state source.
pub(super) fn thread(s: &Summary) -> Markup {
    let rows = thread_rows(s);
    if rows.is_empty() {
        return html! {};
    }
    let io = shows_io(&rows);
    html! {
        h3 { "The training thread" }
        table id="thread" {
            tr {
                th { "phase" }
                th class="n" { "on CPU" }
                th class="n" { "blocked" }
                @if io { th class="n" { "in I/O" } }
                th class="n" { "waiting for a CPU" }
                th { "where it blocks" }
            }
            @for r in &rows {
                tr {
                    td { (r.phase.name()) }
                    td class="n" { (percent(Some(r.cpu))) }
                    td class="n" { (percent(Some(r.blocked))) }
                    @if io { td class="n" { (percent(r.io)) } }
                    td class="n" { (percent(r.runnable)) }
                    td {
                        @if let Some(f) = r.blocked_in {
                            code { (Text(&f.function)) } " " (pct(f.share))
                        }
                    }
                }
            }
        }
        "\n"
    }
}

/// The code inside the phases (`table#top-functions`): the card's CODE groups, a row for each
/// phase and one for each of its sites, share first.
pub(super) fn code(s: &Summary) -> Markup {
    let groups = code_groups(s);
    html! {
        h2 { "Code inside the phases" }
        @if groups.is_empty() {
            p class="note" id="top-functions" {
                "No Python stack samples: the functions inside the residual are not known \
                 (sampling off, or too few samples)."
            }
        } @else {
            table id="top-functions" {
                tr {
                    th class="n" { "share" }
                    th { "function" }
                    th { "file" }
                    th class="n" { "samples" }
                }
                @for g in &groups {
                    tr class="group" { th colspan="4" { (Text(&g.title)) } }
                    @for site in &g.sites {
                        tr {
                            td class="n" { (site.share_text()) }
                            td {
                                code { (Text(&site.function)) }
                                @if let Some((kind, api)) = &site.wait {
                                    " (" (kind) ": " code { (Text(api)) } ")"
                                }
                            }
                            td {
                                code {
                                    (Text(&site.file))
                                    @if let Some(l) = site.line { ":" (l) }
                                }
                            }
                            td class="n" { (site.samples) }
                        }
                    }
                }
            }
        }
        "\n"
    }
}
