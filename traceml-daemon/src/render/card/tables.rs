//! The card's two tables, and the rows the HTML report shows too: THREAD, the training thread's
//! own time in each phase (one row a phase), and CODE, the code that holds a phase's stack
//! samples (a row a site, under its phase). A row is never wrapped: a name too long for the
//! card is shortened in the middle ([`middle`]), its share kept whole on the same row.
use super::*;
use crate::profile::{TopFunction, short_file};

/// The smallest `gpu_wait` share whose lines the CODE section shows (below it the waits cost
/// little, whatever their line).
const WAIT_LINES_SHARE: f64 = 0.05;
/// The THREAD table's number columns, their headers in two lines (a cell is right-aligned to
/// the wider); the I/O column only where a phase spent 1 % or more in I/O.
const ON_CPU: [&str; 2] = ["", "on CPU"];
const BLOCKED: [&str; 2] = ["", "blocked"];
const IN_IO: [&str; 2] = ["", "in I/O"];
const RUNNABLE: [&str; 2] = ["waiting", "for a CPU"];
const WHERE: &str = "where it blocks";
/// Columns between two cells of a table.
const GAP: usize = 2;
/// Indent of a THREAD row under the table's title.
const ROW_INDENT: usize = 2;
/// Width of the CODE table's share column ("share", "100%").
const SHARE: usize = 5;
/// The fewest columns a function shortened alone keeps ([`CodeSite::shortened`]).
const MIN_FUNCTION: usize = 16;

/// One phase of the THREAD table: the training thread's own time in it, in percent of the
/// phase's mean (rounded).
pub(crate) struct ThreadRow<'a> {
    pub(crate) phase: Phase,
    pub(crate) cpu: f64,
    pub(crate) blocked: f64,
    /// Of the blocked time, in uninterruptible I/O.
    pub(crate) io: Option<f64>,
    /// Runnable, waiting for a CPU.
    pub(crate) runnable: Option<f64>,
    /// Where a fifth or more of the phase was blocked: the function that holds 30 % or more of
    /// the blocked samples.
    pub(crate) blocked_in: Option<&'a TopFunction>,
}

/// The THREAD table's rows: each shown phase with thread states and a mean of 0.05 ms or more.
/// Empty without the thread-state source.
pub(crate) fn thread_rows(s: &Summary) -> Vec<ThreadRow<'_>> {
    s.shown_phases()
        .into_iter()
        .filter_map(|phase| {
            let st = &s.phases[phase];
            let (mean, cpu, blocked) = (st.mean_ms?, st.cpu_ms?, st.blocked_ms?);
            if mean < 0.05 {
                return None;
            }
            let share = |v: f64| (v / mean * 100.0).round();
            Some(ThreadRow {
                phase,
                cpu: share(cpu),
                blocked: share(blocked),
                io: st.io_ms.map(share),
                runnable: st.runnable_ms.map(share),
                blocked_in: st
                    .blocked_in
                    .first()
                    .filter(|f| share(blocked) >= 20.0 && f.share >= 0.3),
            })
        })
        .collect()
}

/// Whether the THREAD table has its I/O column: a phase spent 1 % or more in I/O.
pub(crate) fn shows_io(rows: &[ThreadRow]) -> bool {
    rows.iter().any(|r| r.io.is_some_and(|v| v >= 1.0))
}

/// "98%", or "—" where not measured.
pub(crate) fn percent(v: Option<f64>) -> String {
    v.map_or_else(|| "—".to_owned(), |v| format!("{v:.0}%"))
}

/// One group of the CODE table: a phase ("input_wait 119 ms/step") and its sites.
pub(crate) struct CodeGroup {
    pub(crate) title: String,
    pub(crate) sites: Vec<CodeSite>,
}

/// One site of the CODE table: a function that holds the phase's samples, or a line where the
/// host waited for the device.
pub(crate) struct CodeSite {
    /// Of the phase's samples (of its samples in a wait, for `gpu_wait`'s lines), 0..1.
    pub(crate) share: f64,
    pub(crate) function: String,
    pub(crate) file: String,
    /// A function's first line; a wait's line, where read.
    pub(crate) line: Option<u32>,
    pub(crate) samples: u64,
    /// A wait's kind and CUDA function ("sync", "cudaStreamSynchronize").
    pub(crate) wait: Option<(&'static str, String)>,
}

impl CodeSite {
    /// "workloads/recipes.py:tok", or for a wait "train.py:88 in main (sync:
    /// cudaStreamSynchronize)": the whole name, as the card shows it where it fits.
    pub(crate) fn text(&self) -> String {
        let [lead, function, trail] = self.parts();
        format!("{lead}{function}{trail}")
    }

    /// The file (and a wait's line) before the function ("train.py:88 in "), the function, and
    /// for a wait what it waited in (" (sync: cudaStreamSynchronize)").
    fn parts(&self) -> [String; 3] {
        let file = short_file(&self.file);
        match &self.wait {
            None => [format!("{file}:"), self.function.clone(), String::new()],
            Some((kind, api)) => {
                let line = self.line.map_or(String::new(), |l| format!(":{l}"));
                [
                    format!("{file}{line} in "),
                    self.function.clone(),
                    format!(" ({kind}: {api})"),
                ]
            }
        }
    }

    /// "53%": the share, as both tables show it.
    pub(crate) fn share_text(&self) -> String {
        format!("{:.0}%", self.share * 100.0)
    }

    /// [`CodeSite::text`] for a terminal, at most `room` columns, shortened in the middle: of
    /// the function, the file and the wait kept whole, where that leaves the function
    /// [`MIN_FUNCTION`] columns; else of the file and function, the wait kept whole, where it
    /// takes at most half the room; else of the whole.
    fn shortened(&self, room: usize) -> String {
        let whole = terminal(&self.text()).into_owned();
        if text::width(&whole) <= room {
            return whole;
        }
        let [lead, function, trail] = self.parts().map(|p| terminal(&p).into_owned());
        let fixed = text::width(&lead) + text::width(&trail);
        if fixed + MIN_FUNCTION <= room {
            format!("{lead}{}{trail}", middle(&function, room - fixed))
        } else if text::width(&trail) * 2 <= room {
            let at = middle(&format!("{lead}{function}"), room - text::width(&trail));
            format!("{at}{trail}")
        } else {
            middle(&whole, room)
        }
    }
}

/// The CODE table's groups: where the GPU waits, by line, when it waits for
/// [`WAIT_LINES_SHARE`] of the step or more; then the primary finding's phase and the
/// residual, from the stack samples (at most three sites each; none without samples).
pub(crate) fn code_groups(s: &Summary) -> Vec<CodeGroup> {
    let mut phases = vec![Phase::Residual];
    if let Some(p) = s.primary_diagnosis.phase
        && p != Phase::Residual
    {
        phases.insert(0, p);
    }
    let waits = wait_group(s);
    let mut groups: Vec<CodeGroup> = waits.into_iter().collect();
    let has_waits = !groups.is_empty();
    groups.extend(
        phases
            .into_iter()
            .filter(|&p| !(p == Phase::GpuWait && has_waits))
            .filter(|&p| !s.phases[p].top_functions.is_empty())
            .map(|p| CodeGroup {
                title: format!("{} {}/step", p.name(), ms(s.phases[p].median_ms)),
                sites: s.phases[p]
                    .top_functions
                    .iter()
                    .take(3)
                    .map(|t| CodeSite {
                        share: t.share,
                        function: t.function.clone(),
                        file: t.file.clone(),
                        line: Some(t.line),
                        samples: t.samples,
                        wait: None,
                    })
                    .collect(),
            }),
    );
    groups
}

/// `gpu_wait`'s lines (at most three) with the syncs and D2H copies per step, when `gpu_wait`
/// is [`WAIT_LINES_SHARE`] of the step or more and its samples name a line.
fn wait_group(s: &Summary) -> Option<CodeGroup> {
    let gw = &s.phases.gpu_wait;
    let share = gw.share.unwrap_or(0.0);
    if gw.wait_sites.is_empty() || share < WAIT_LINES_SHARE {
        return None;
    }
    let counts = crate::diagnosis::wait_counts(s);
    let mut title = format!("gpu_wait {}/step ({})", ms(gw.mean_ms), pct(share));
    if !counts.is_empty() {
        title.push_str(&format!(" · {}", counts.join(", ")));
    }
    Some(CodeGroup {
        title,
        sites: gw
            .wait_sites
            .iter()
            .take(3)
            .map(|w| CodeSite {
                share: w.share,
                function: w.function.clone(),
                file: w.file.clone(),
                line: w.line,
                samples: w.samples,
                wait: Some((w.kind.said(), w.api.clone())),
            })
            .collect(),
    })
}

/// `first` padded to `first_w`, then each cell right-aligned to its column's width, then
/// `last`: one line of the THREAD table.
fn thread_line(first: &str, first_w: usize, cells: &[(usize, String)], last: &str) -> String {
    let mut line = pad(first, first_w);
    for (w, cell) in cells {
        line.push_str(&" ".repeat(GAP + w.saturating_sub(visible_len(cell))));
        line.push_str(cell);
    }
    line.push_str(&" ".repeat(GAP));
    line.push_str(last);
    line
}

/// THREAD: a header naming the columns (its first line the table's name), then one row per
/// phase ([`thread_rows`]): on CPU, blocked, of it in I/O (where any phase was), waiting for a
/// CPU, and where it blocks (the function and its share, the name shortened in the middle to
/// the card's width).
pub(super) fn thread(s: &Summary, out: &mut Lines) {
    let rows = thread_rows(s);
    if rows.is_empty() {
        return;
    }
    let io = shows_io(&rows);
    let columns: Vec<[&str; 2]> = [ON_CPU, BLOCKED, IN_IO, RUNNABLE]
        .into_iter()
        .filter(|&c| io || c != IN_IO)
        .collect();
    let widths: Vec<usize> = columns.iter().map(|c| c[0].len().max(c[1].len())).collect();
    let indent = " ".repeat(ROW_INDENT);
    let first_w = rows
        .iter()
        .map(|r| r.phase.name().len())
        .chain(["phase".len()])
        .max()
        .unwrap_or(0)
        + ROW_INDENT
        + GAP;
    let header = |i: usize| -> Vec<(usize, String)> {
        widths
            .iter()
            .zip(&columns)
            .map(|(&w, c)| (w, c[i].to_owned()))
            .collect()
    };
    out.push(thread_line("THREAD", first_w, &header(0), ""));
    let names = thread_line(&format!("{indent}phase"), first_w, &header(1), "");
    // What the last column has left.
    let room = out.width.saturating_sub(visible_len(&names));
    out.push(format!("{names}{}", cut(WHERE, room)));
    for r in &rows {
        let mut cells = vec![percent(Some(r.cpu)), percent(Some(r.blocked))];
        if io {
            cells.push(percent(r.io));
        }
        cells.push(percent(r.runnable));
        let within = r
            .blocked_in
            .map(|f| {
                let share = pct(f.share);
                let name = terminal(&f.function);
                let keep = room.saturating_sub(share.len() + 1);
                format!("{} {share}", middle(&name, keep))
            })
            .unwrap_or_default();
        let cells: Vec<(usize, String)> = widths.iter().copied().zip(cells).collect();
        let name = format!("{indent}{}", r.phase.name());
        out.push(thread_line(&name, first_w, &cells, &within));
    }
}

/// CODE: a header row, then for each group ([`code_groups`]) its phase's row and a row per
/// site: the share, then the whole name shortened in the middle to the card's width.
pub(super) fn code(s: &Summary, out: &mut Lines) {
    let groups = code_groups(s);
    if groups.is_empty() {
        return;
    }
    out.rule('─');
    out.push(format!(
        "{:<LABEL$}{:>SHARE$}{}file:function",
        "CODE",
        "share",
        " ".repeat(GAP)
    ));
    let room = out.width - LABEL - SHARE - GAP;
    for g in &groups {
        labeled(out, "", &g.title);
        for site in &g.sites {
            let name = site.shortened(room);
            out.push(format!(
                "{:<LABEL$}{:>SHARE$}{}{name}",
                "",
                site.share_text(),
                " ".repeat(GAP)
            ));
        }
    }
}
