//! The verdict card: the summary as text, 80–100 columns as the caller asks, ANSI color only on
//! request (`final_summary.txt`, the end of a `--pid` run).
use std::io::{self, Write};

use crate::diagnosis::COMPUTE_PHASES;
use crate::phase::Phase;
use crate::sanitize::{cut_marker, terminal};
use crate::summary::{DiagnosisKind, Finding, Severity, Summary};
use crate::text::{self, wrap};
use crate::units::{bytes_bin, bytes_dec, duration, ms, pct};
use unicode_width::UnicodeWidthChar;

mod prose;
mod quality;
mod ranks;
use prose::clauses;
pub use prose::prose_longer_than;
pub(super) mod tables;
use quality::{data_quality, overhead};
use ranks::ranks;
pub use ranks::{collective_waits_line, job_line, restarted, stragglers_line};

/// Widest line of the card, in columns (the width of `final_summary.txt`).
pub const WIDTH: usize = 100;
/// Narrowest card, in columns (a terminal narrower than this wraps the lines).
pub const MIN_WIDTH: usize = 80;
/// Width of the label column.
const LABEL: usize = 10;
/// Width of a share bar.
const BAR: usize = 20;

/// Writes the verdict card, [`WIDTH`] columns wide.
pub fn render_card(s: &Summary, w: &mut impl Write, color: bool) -> io::Result<()> {
    render_card_width(s, w, color, WIDTH)
}

/// Writes the verdict card at most `width` columns wide (clamped to [`MIN_WIDTH`]..=[`WIDTH`]):
/// text wraps and the share bars shorten; the columns stay where they are.
pub fn render_card_width(
    s: &Summary,
    w: &mut impl Write,
    color: bool,
    width: usize,
) -> io::Result<()> {
    let p = Painter(color);
    let mut out = Lines {
        v: Vec::new(),
        width: width.clamp(MIN_WIDTH, WIDTH),
    };
    header(s, &mut out);
    out.rule('═');
    verdict(s, &p, &mut out);
    out.rule('─');
    timing(s, &p, &mut out);
    out.rule('─');
    memory(s, &p, &mut out);
    out.rule('─');
    system(s, &p, &mut out);
    let primary = &s.primary_diagnosis;
    let others: Vec<&Finding> = s
        .findings
        .iter()
        .filter(|f| !(f.kind == primary.kind && f.phase == primary.phase))
        .collect();
    if !others.is_empty() {
        out.rule('─');
        out.push(p.bold("OTHER FINDINGS"));
        for f in others {
            let sev = f.severity.as_str();
            let text = format!(
                "[{sev}] {}: {}. Next: {}.",
                f.kind.headline(),
                f.why.trim_end_matches('.'),
                f.next.trim_end_matches('.')
            );
            for (i, line) in wrap_safe(&text, out.width - 2).into_iter().enumerate() {
                let line = if i == 0 {
                    line.replacen(sev, &p.severity(f.severity, sev), 1)
                } else {
                    format!("  {line}")
                };
                out.push(line);
            }
        }
    }
    ranks(s, &mut out);
    tables::code(s, &mut out);
    out.rule('─');
    data_quality(s, &p, &mut out);
    overhead(s, &mut out);
    for line in out.v {
        writeln!(w, "{}", line.trim_end())?;
    }
    Ok(())
}

/// ANSI styling, or none.
pub(crate) struct Painter(pub bool);

impl Painter {
    fn paint(&self, code: &str, s: &str) -> String {
        if self.0 {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_owned()
        }
    }
    pub(crate) fn bold(&self, s: &str) -> String {
        self.paint("1", s)
    }
    pub(crate) fn dim(&self, s: &str) -> String {
        self.paint("2", s)
    }
    pub(crate) fn red(&self, s: &str) -> String {
        self.paint("1;31", s)
    }
    pub(crate) fn green(&self, s: &str) -> String {
        self.paint("1;32", s)
    }
    pub(crate) fn yellow(&self, s: &str) -> String {
        self.paint("1;33", s)
    }
    fn severity(&self, sev: Severity, s: &str) -> String {
        match sev {
            Severity::Critical => self.red(s),
            Severity::Warning => self.yellow(s),
            Severity::Info => self.green(s),
        }
    }
}

/// The card's lines as they are built, and its width in columns.
struct Lines {
    v: Vec<String>,
    width: usize,
}

impl Lines {
    fn push(&mut self, line: String) {
        self.v.push(line);
    }

    /// A rule across the card.
    fn rule(&mut self, c: char) {
        self.v.push(c.to_string().repeat(self.width));
    }
}

/// `label` in the label column, then `text` wrapped with a hanging indent.
fn labeled(out: &mut Lines, label: &str, text: &str) {
    for (i, line) in wrap_safe(text, out.width - LABEL).into_iter().enumerate() {
        let l = if i == 0 { label } else { "" };
        out.push(format!("{l:<LABEL$}{line}"));
    }
}

/// `label` (in `indent` columns) and the first of `parts` on its line, each other part a "· "
/// item under it (every part one when there is no label), every item wrapped under its own
/// text and painted with `paint`: items, none of them a paragraph.
fn items(
    out: &mut Lines,
    label: Option<&str>,
    indent: usize,
    parts: &[&str],
    paint: impl Fn(&str) -> String,
) {
    for (k, part) in parts.iter().enumerate() {
        let headline = k == 0 && label.is_some();
        let hang = if headline { 0 } else { 2 };
        for (i, line) in wrap_safe(part, out.width - indent - hang)
            .into_iter()
            .enumerate()
        {
            let lead = match (headline, i) {
                (true, 0) => format!("{:indent$}", label.unwrap_or_default()),
                (false, 0) => format!("{:indent$}· ", ""),
                _ => " ".repeat(indent + hang),
            };
            out.push(format!("{lead}{}", paint(&line)));
        }
    }
}

/// Model text wrapped to `width` columns for the card. The model holds names read from the
/// target (functions, files, command line, libraries, notes that quote them): control and escape
/// characters are written visibly ([`terminal`]) and a word longer than a line is cut with a
/// marker. Every piece of the card that can hold such a name goes through here or [`cut`].
pub(crate) fn wrap_safe(text: &str, width: usize) -> Vec<String> {
    wrap(&terminal(text), width)
        .into_iter()
        .map(|l| fit(l, width))
        .collect()
}

/// `line` cut to `width` columns, ending in `…[cut N chars]` when cut.
fn fit(line: String, width: usize) -> String {
    if text::width(&line) <= width {
        return line;
    }
    let chars = line.chars().count();
    let mut keep = width.saturating_sub(12);
    loop {
        let kept = text::head(&line, keep);
        let marker = cut_marker(chars - kept.chars().count(), "chars");
        if keep == 0 || text::width(kept) + text::width(&marker) <= width {
            return format!("{kept}{marker}");
        }
        keep -= 1;
    }
}

/// Columns `s` takes on a terminal (ANSI escapes take none).
fn visible_len(s: &str) -> usize {
    let mut n = 0;
    let mut esc = false;
    for c in s.chars() {
        match (esc, c) {
            (false, '\x1b') => esc = true,
            (true, 'm') => esc = false,
            (true, _) => {}
            (false, c) => n += c.width().unwrap_or(0),
        }
    }
    n
}

/// The lines of a card wider than `width` columns (ANSI color takes none): none in a card that
/// [`render_card_width`] wrote at that width. The card's tests, unit and on recorded runs, check
/// with it.
pub fn lines_wider_than(text: &str, width: usize) -> Vec<&str> {
    text.lines().filter(|l| visible_len(l) > width).collect()
}

/// `s` padded with spaces to `width` visible columns.
fn pad(s: &str, width: usize) -> String {
    format!("{s}{}", " ".repeat(width.saturating_sub(visible_len(s))))
}

fn cut(s: &str, max: usize) -> String {
    if text::width(s) <= max {
        s.to_owned()
    } else {
        format!("{}…", text::head(s, max - 1))
    }
}

/// `s` shortened in the middle to `max` columns, `…` where it was cut: a path's start and a
/// function's name at its end both stay.
fn middle(s: &str, max: usize) -> String {
    if text::width(s) <= max {
        return s.to_owned();
    }
    let Some(keep) = max.checked_sub(1) else {
        return String::new();
    };
    let head = text::head(s, keep / 2);
    let tail = text::tail(s, keep - text::width(head));
    format!("{head}…{tail}")
}

fn header(s: &Summary, out: &mut Lines) {
    let t = &s.target;
    let mut first = String::from("traceml-daemon");
    if let Some(pid) = t.pid {
        first.push_str(&format!(" · pid {pid}"));
    }
    if !t.cmdline.is_empty() {
        first.push_str(" · ");
        first.push_str(&t.cmdline.join(" "));
    }
    out.push(cut(&terminal(&first), out.width));
    let mut second = who(s);
    if let Some(py) = &t.python {
        second.push(format!("Python {py}"));
    }
    let boundary = s
        .steps
        .boundary
        .map(|b| format!(" (boundary {})", crate::summary::boundary_name(b)))
        .unwrap_or_default();
    let micro = s
        .steps
        .micro_batches
        .as_ref()
        .filter(|m| m.max > 1)
        .map(|m| {
            if m.min == m.max {
                format!(" of {} micro-batches", m.max)
            } else {
                format!(" of {:.1} micro-batches", m.mean)
            }
        })
        .unwrap_or_default();
    second.push(format!("{} steps{micro}{boundary}", s.steps.count));
    if let Some(d) = s.run.duration_s {
        second.push(format!("attached {}", duration(d)));
    }
    second.push(format!("ended: {}", end_reason(s)));
    // Wrapped, not cut: how the run ended comes last. The program a target exec'd is named by
    // the target.
    for line in wrap_safe(&second.join(" · "), out.width) {
        out.push(line);
    }
}

/// Whose job it is: user, pod or container, or systemd unit (named by the target's cgroup and
/// environment: shown through [`wrap_safe`]).
fn who(s: &Summary) -> Vec<String> {
    let Some(id) = &s.target.identity else {
        return Vec::new();
    };
    let mut out = Vec::new();
    match (&id.user, id.uid) {
        (Some(u), _) => out.push(format!("user {u}")),
        (None, Some(uid)) => out.push(format!("uid {uid}")),
        _ => {}
    }
    match (&id.pod_namespace, &id.pod_name) {
        (Some(ns), Some(n)) => out.push(format!("pod {ns}/{n}")),
        (None, Some(n)) => out.push(format!("pod {n}")),
        _ => {}
    }
    if let Some(c) = &id.container_id {
        let runtime = id.container_runtime.as_deref().unwrap_or("container");
        let short: String = c.chars().take(12).collect();
        out.push(format!("{runtime} {short}"));
    } else if let Some(unit) = &id.unit {
        out.push(unit.clone());
    }
    out
}

/// How the run ended, with the target's exit status, signal or new program when known.
pub(super) fn end_reason(s: &Summary) -> String {
    use crate::event::EndReason as E;
    let end = s.run.end.as_ref();
    match s.data_quality.end_reason {
        E::TargetExited => match (end, end.and_then(|e| e.exit_status)) {
            (_, Some(c)) => format!("target exited, status {c}"),
            (Some(_), None) => "target exited, status unknown".into(),
            (None, None) => "target exited".into(),
        },
        E::TargetKilled => {
            let sig = end.and_then(|e| {
                e.signal_name
                    .clone()
                    .or_else(|| e.signal.map(|n| format!("signal {n}")))
            });
            let core = if end.is_some_and(|e| e.core_dumped) {
                " (core dumped)"
            } else {
                ""
            };
            match sig {
                Some(sig) => format!("target killed by {sig}{core}"),
                None => "target killed by a signal".into(),
            }
        }
        E::TargetExeced => match end.and_then(|e| e.exec.as_deref()) {
            Some(p) => format!("target exec'd {p}"),
            None => "target exec'd".into(),
        },
        E::Interrupted => "interrupted".into(),
        E::Terminated => "terminated".into(),
        E::DurationElapsed => "duration elapsed".into(),
        E::Truncated => "truncated".into(),
    }
}

fn verdict(s: &Summary, p: &Painter, out: &mut Lines) {
    let d = &s.primary_diagnosis;
    out.push(format!(
        "{}{}   {} · confidence {}",
        pad(&p.bold("VERDICT"), LABEL),
        p.severity(d.severity, &d.kind.headline()),
        p.severity(d.severity, d.severity.as_str()),
        d.confidence.as_str()
    ));
    labeled_clauses(out, "Why", &d.why);
    labeled_clauses(out, "Next", &d.next);
    for (i, w) in s.what_if.iter().enumerate() {
        let label = if i == 0 { "What if" } else { "" };
        labeled(out, label, &crate::whatif::sentence(w));
        items(out, None, LABEL, &clauses(&w.assumption), str::to_owned);
    }
}

/// `label`, then `text` one clause per item (split at its top-level "; "): the first on the
/// label's line, each other on a line of its own after "· ", so that no item of the verdict
/// block runs into a paragraph.
fn labeled_clauses(out: &mut Lines, label: &str, text: &str) {
    items(out, Some(label), LABEL, &clauses(text), str::to_owned);
}

fn timing(s: &Summary, p: &Painter, out: &mut Lines) {
    out.push(format!(
        "{}{:>10}{:>11}{:>9}",
        pad(&p.bold("STEP TIMING"), 34),
        "median",
        "mean",
        "share"
    ));
    let step_tail = s
        .step_ms
        .p90
        .map(|v| format!("   p90 {}", ms(Some(v))))
        .unwrap_or_default();
    out.push(format!(
        "{:<34}{:>10}{:>11}{:>9}{step_tail}",
        "step",
        ms(s.step_ms.median),
        ms(s.step_ms.mean),
        if s.steps.count > 0 && s.step_ms.median.is_some() {
            "100%"
        } else {
            "—"
        }
    ));
    step_groups(s, out);
    let d = &s.primary_diagnosis;
    let shown = s.shown_phases();
    for (i, &phase) in shown.iter().enumerate() {
        let st = &s.phases[phase];
        let branch = if i + 1 == shown.len() {
            "└─"
        } else {
            "├─"
        };
        let mark = if d.phase == Some(phase) {
            "◀ cause"
        } else if d.kind == DiagnosisKind::ComputeBound && COMPUTE_PHASES.contains(&phase) {
            "◀ compute"
        } else if s
            .findings
            .iter()
            .any(|f| f.phase == Some(phase) && f.severity > Severity::Info)
        {
            "◀ also"
        } else {
            ""
        };
        let share = st.share.map(pct).unwrap_or_else(|| "—".to_owned());
        // The bar fills what the columns leave (20 at 100 columns, 13 at 80).
        let bar_max = BAR.min(out.width.saturating_sub(67));
        let bar = st
            .share
            .map(|sh| "█".repeat((sh * bar_max as f64).round().clamp(0.0, bar_max as f64) as usize))
            .unwrap_or_default();
        let name = format!(
            "{branch} {:<12}{}",
            phase.name(),
            pad(
                &if mark == "◀ cause" {
                    p.bold(mark)
                } else {
                    mark.to_owned()
                },
                10
            )
        );
        let bar = if mark == "◀ cause" {
            p.severity(d.severity, &bar)
        } else {
            bar
        };
        out.push(format!(
            "{}{:>10}{:>11}{share:>9}   {bar}",
            pad(&name, 34),
            ms(st.median_ms),
            ms(st.mean_ms)
        ));
    }
    tables::thread(s, out);
    if let Some(text) = evaluation_text(s) {
        labeled(out, "EVAL", &text);
    }
    if let Some(text) = cuda_text(s) {
        labeled(out, "CUDA", &text);
    }
}

/// Step times in separate groups: the median describes no step; each group does.
fn step_groups(s: &Summary, out: &mut Lines) {
    let [slow, fast] = s.step_ms.groups.as_slice() else {
        return;
    };
    let groups = format!(
        "  in 2 groups: {} × {} and {} × {}",
        slow.count,
        ms(Some(slow.typical_ms)),
        fast.count,
        ms(Some(fast.typical_ms)),
    );
    let gap = format!(
        "(no step between {} and {})",
        ms(Some(fast.max_ms)),
        ms(Some(slow.min_ms)),
    );
    // The gap on a line of its own where the card is narrow.
    if text::width(&groups) + 1 + text::width(&gap) <= out.width {
        out.push(format!("{groups} {gap}"));
    } else {
        out.push(groups);
        out.push(format!("    {gap}"));
    }
}

/// The evaluation line: segments, batches, wall time and its share, and the phases that fill
/// it; `None` without evaluation.
pub(crate) fn evaluation_text(s: &Summary) -> Option<String> {
    let e = &s.evaluation;
    if e.segments == 0 {
        return None;
    }
    let share = e
        .share_of_wall
        .map(|sh| format!(" = {} of wall time", pct(sh)))
        .unwrap_or_default();
    let mut phases: Vec<(Phase, f64)> = e
        .phases
        .iter()
        .flat_map(|ph| ph.iter().map(|(p, v)| (p, v.share)))
        .filter(|&(_, sh)| sh >= 0.005)
        .collect();
    phases.sort_by(|a, b| b.1.total_cmp(&a.1));
    let parts: Vec<String> = phases
        .iter()
        .take(3)
        .map(|(p, sh)| format!("{} {}", p.name(), pct(*sh)))
        .collect();
    Some(format!(
        "{} segment{} outside the steps, {} batches, {:.1} s{share}; {}",
        e.segments,
        if e.segments == 1 { "" } else { "s" },
        e.batches,
        e.wall_s,
        parts.join(", ")
    ))
}

/// The CUDA line of the card and the report: per-step launches, copies and syncs; "no CUDA
/// activity" when a CUDA library was probed and the steps made none (a CPU-only run); `None`
/// without steps.
pub(super) fn cuda_text(s: &Summary) -> Option<String> {
    let c = &s.cuda;
    if !c.measured {
        return Some(
            "no CUDA library was probed: launches, copies and syncs not measured".to_owned(),
        );
    }
    if s.steps.count == 0 {
        return None;
    }
    let none = |x: Option<f64>| x.is_none_or(|v| v == 0.0);
    if none(c.launches_per_step)
        && none(c.h2d_copies_per_step)
        && none(c.d2h_copies_per_step)
        && none(c.syncs_per_step)
    {
        return Some(
            "no CUDA activity: a CUDA library was probed, but the steps made no kernel launches, \
             copies or syncs"
                .to_owned(),
        );
    }
    let mut parts = Vec::new();
    if let Some(l) = c.launches_per_step {
        parts.push(format!("{l:.0} launches/step{}", by_path(s)));
    }
    if let (Some(b), Some(n)) = (c.h2d_bytes_per_step, c.h2d_copies_per_step) {
        let mut h = format!("H2D {}/step in {n:.0} copies", bytes_dec(b));
        match (c.h2d_bytes_per_copy, c.h2d_gb_per_s) {
            (Some(per), Some(bw)) => {
                h.push_str(&format!(" ({} each, {bw:.1} GB/s)", bytes_dec(per)))
            }
            (Some(per), None) => h.push_str(&format!(" ({} each)", bytes_dec(per))),
            _ => {}
        }
        parts.push(h);
    }
    if let Some(b) = c.d2h_bytes_per_step {
        parts.push(format!("D2H {}/step", bytes_dec(b)));
    }
    if let Some(n) = c.syncs_per_step {
        parts.push(format!("{n:.1} syncs/step"));
    }
    Some(parts.join(" · "))
}

/// " (120 runtime, 40 from libcublasLt.so.13's own runtime, 8 direct to the driver)": where
/// the launches reached the driver, when any did other than through the runtime.
fn by_path(s: &Summary) -> String {
    let Some(b) = &s.cuda.launches_by_path else {
        return String::new();
    };
    if b.library == 0.0 && b.direct == 0.0 {
        return String::new();
    }
    let mut parts = Vec::new();
    if b.runtime > 0.0 {
        parts.push(format!("{:.0} runtime", b.runtime));
    }
    if b.library > 0.0 {
        let libs: Vec<&str> = s
            .data_quality
            .own_runtime_libraries
            .iter()
            .map(|p| p.rsplit('/').next().unwrap_or(p))
            .collect();
        parts.push(match libs.as_slice() {
            [] => format!("{:.0} from libraries' own runtimes", b.library),
            [one] => format!("{:.0} from {one}'s own runtime", b.library),
            [one, ..] => format!(
                "{:.0} from {one} and {} more with their own runtime",
                b.library,
                libs.len() - 1
            ),
        });
    }
    if b.direct > 0.0 {
        parts.push(format!("{:.0} direct to the driver", b.direct));
    }
    format!(" ({})", parts.join(", "))
}

fn thirds(t: Option<[u64; 3]>) -> Option<String> {
    t.map(|[a, b, c]| {
        format!(
            "early→middle→late {} → {} → {}",
            bytes_bin(a),
            bytes_bin(b),
            bytes_bin(c)
        )
    })
}

fn memory(s: &Summary, p: &Painter, out: &mut Lines) {
    out.push(p.bold("MEMORY"));
    let mut rss = Vec::new();
    if let Some(m) = s.process.rss_bytes_max {
        rss.push(format!("peak {}", bytes_bin(m)));
    }
    if let Some(m) = s.process.rss_bytes_mean {
        rss.push(format!("mean {}", bytes_bin(m)));
    }
    rss.extend(thirds(s.memory.rss_bytes_by_third));
    labeled(
        out,
        "host RSS",
        &if rss.is_empty() {
            "not sampled".to_owned()
        } else {
            rss.join(" · ")
        },
    );
    let mut gpu = Vec::new();
    match (
        s.gpu.as_ref().and_then(|g| g.process_mem_bytes_max),
        s.memory.gpu_mem_total_bytes,
    ) {
        (Some(m), Some(t)) => gpu.push(format!("peak {} of {}", bytes_bin(m), bytes_bin(t))),
        (Some(m), None) => gpu.push(format!("peak {}", bytes_bin(m))),
        _ => {}
    }
    gpu.extend(thirds(s.memory.gpu_process_mem_bytes_by_third));
    let text = if s.gpu.is_none() {
        "GPU metrics unavailable".to_owned()
    } else if gpu.is_empty() {
        "per-process GPU memory not reported".to_owned()
    } else {
        gpu.join(" · ")
    };
    labeled(out, "GPU mem", &text);
}

fn opt(x: Option<f64>, f: impl Fn(f64) -> String) -> String {
    x.map(f).unwrap_or_else(|| "—".to_owned())
}

fn system(s: &Summary, p: &Painter, out: &mut Lines) {
    out.push(p.bold("SYSTEM & PROCESS"));
    let sys = &s.system;
    let mut parts = vec![format!(
        "CPU {} mean, {} peak",
        opt(sys.cpu_pct_mean, |c| format!("{c:.0}%")),
        opt(sys.cpu_pct_max, |c| format!("{c:.0}%"))
    )];
    match (sys.mem_used_bytes_max, sys.mem_total_bytes) {
        (Some(u), Some(t)) => parts.push(format!("RAM peak {} of {}", bytes_bin(u), bytes_bin(t))),
        (Some(u), None) => parts.push(format!("RAM peak {}", bytes_bin(u))),
        _ => parts.push("RAM —".to_owned()),
    }
    if let Some(n) = sys.num_cpus {
        parts.push(format!("{n} CPUs"));
    }
    labeled(out, "system", &parts.join(" · "));
    let pr = &s.process;
    let mut parts = vec![format!(
        "CPU {} of one core",
        opt(pr.cpu_pct_one_core_mean, |c| format!("{c:.0}%"))
    )];
    if let (Some(m), Some(n)) = (pr.cpu_pct_machine_mean, sys.num_cpus) {
        parts[0].push_str(&format!(" ({m:.1}% of {n} CPUs)"));
    }
    if let Some(t) = pr.threads_max {
        parts.push(format!("{t} threads"));
    }
    if let Some(c) = pr.cpu_seconds {
        parts.push(format!("{c:.1} CPU s"));
    }
    labeled(out, "process", &parts.join(" · "));
    let w = &s.workers;
    let text = match (w.count, w.cpu_pct_one_core_mean) {
        (None, _) => "not sampled".to_owned(),
        (Some(0), _) => "none (data loading on the training process)".to_owned(),
        (Some(n), Some(c)) => {
            let state = w
                .state
                .map(|s| format!(" ({})", s.as_str()))
                .unwrap_or_default();
            let max = w
                .cpu_pct_one_core_max
                .map(|m| format!(", busiest {m:.0}%"))
                .unwrap_or_default();
            format!("{n} · {c:.0}% of one core each{max}{state}")
        }
        (Some(n), None) => format!("{n} · CPU not measured"),
    };
    labeled(out, "workers", &text);
    if let Some(p) = &w.profile {
        let line = crate::diagnosis::pipeline_line(p);
        let parts: Vec<&str> = line.split(" · ").collect();
        items(out, Some(""), LABEL, &parts, str::to_owned);
    }
    match &s.gpu {
        None => labeled(out, "GPU", "GPU metrics unavailable"),
        Some(g) => {
            for d in &g.devices {
                let mut parts = vec![d.name.clone().unwrap_or_else(|| "unknown GPU".to_owned())];
                parts.push(format!(
                    "util {}",
                    opt(d.util_pct_mean, |u| format!("{u:.0}%"))
                ));
                match (d.mem_used_bytes_max, d.mem_total_bytes) {
                    (Some(u), Some(t)) => {
                        parts.push(format!("memory {} of {}", bytes_bin(u), bytes_bin(t)))
                    }
                    (Some(u), None) => parts.push(format!("memory {}", bytes_bin(u))),
                    _ => {}
                }
                if let Some(t) = d.temp_c_max {
                    parts.push(format!("{t:.0} °C"));
                }
                match (d.power_w_mean, d.power_limit_w) {
                    (Some(pw), Some(l)) => parts.push(format!("{pw:.0} of {l:.0} W")),
                    (Some(pw), None) => parts.push(format!("{pw:.0} W")),
                    _ => {}
                }
                if !d.used_by_target && g.devices.iter().any(|d| d.used_by_target) {
                    parts.push("not used by the target".to_owned());
                }
                labeled(out, &format!("GPU {}", d.index), &parts.join(" · "));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::to_json;
    use crate::testkit::{self, Scenario};

    fn card(s: &Summary, color: bool) -> String {
        let mut v = Vec::new();
        render_card(s, &mut v, color).unwrap();
        String::from_utf8(v).unwrap()
    }

    fn strip_ansi(s: &str) -> String {
        let mut out = String::new();
        let mut it = s.chars();
        while let Some(c) = it.next() {
            if c == '\x1b' {
                for c in it.by_ref() {
                    if c == 'm' {
                        break;
                    }
                }
            } else {
                out.push(c);
            }
        }
        out
    }

    /// Steps, but none after the last probe change: the cost is a share of CPU time, and the
    /// card does not say "no steps" of a run that had some.
    #[test]
    fn cost_without_steady_steps_is_not_called_no_steps() {
        let mut s = testkit::summary(&Scenario::default());
        assert!(s.steps.count > 0);
        let o = s
            .daemon_overhead
            .get_or_insert_with(crate::summary::DaemonOverhead::default);
        o.steady_us_per_step = None;
        o.steady_pct_of_step = None;
        o.steady_pct_of_cpu = None;
        o.estimated_pct_of_cpu = Some(1.88);
        let text = card(&s, false);
        assert!(
            text.contains("est. 1.88% of the target's CPU time (no step after the last probe"),
            "{text}"
        );
        assert!(!text.contains("(no steps)"), "{text}");
    }

    fn check_width(text: &str) {
        check_width_at(text, WIDTH);
    }

    fn check_width_at(text: &str, width: usize) {
        let over = lines_wider_than(text, width);
        assert!(over.is_empty(), "over {width} columns: {over:#?}\n{text}");
    }

    /// No prose item over 2 lines (names of ordinary length: a name longer than a line takes
    /// one of its own, `wide_names_fit_the_card_by_columns`).
    fn check_prose(text: &str) {
        let long = prose_longer_than(text, 2);
        assert!(long.is_empty(), "prose over 2 lines: {long:#?}\n{text}");
    }

    fn scenario_card(name: &str, sc: &Scenario) -> String {
        let s = testkit::summary(sc);
        let text = card(&s, false);
        check_width(&text);
        check_prose(&text);
        assert!(!text.contains('\x1b'), "{name}: color without color");
        let colored = card(&s, true);
        assert!(colored.contains("\x1b["));
        assert_eq!(
            strip_ansi(&colored),
            text,
            "{name}: color changes the layout"
        );
        text
    }

    #[test]
    fn card_input_bound() {
        insta::assert_snapshot!(
            "card_input_bound",
            scenario_card("input", &testkit::input_bound())
        );
    }

    #[test]
    fn card_compute_bound() {
        insta::assert_snapshot!(
            "card_compute_bound",
            scenario_card("compute", &testkit::compute_bound())
        );
    }

    #[test]
    fn card_balanced() {
        insta::assert_snapshot!(
            "card_balanced",
            scenario_card("balanced", &testkit::balanced())
        );
    }

    #[test]
    fn card_insufficient_data() {
        let sc = Scenario {
            steps: 3,
            ..Scenario::default()
        };
        insta::assert_snapshot!("card_insufficient_data", scenario_card("insufficient", &sc));
    }

    /// Steps delivered in pairs (20 of ~110 ms, 20 of ~20 ms): the card names both groups and
    /// the gap the median falls in.
    #[test]
    fn card_names_the_groups_of_step_times() {
        let mut s = testkit::summary(&testkit::input_bound());
        let ms: Vec<f64> = (0..40)
            .map(|i| {
                if i % 2 == 0 {
                    108.0 + (i % 5) as f64
                } else {
                    20.0
                }
            })
            .collect();
        s.step_ms.groups = crate::analysis::step_groups_of(&ms, 40);
        let text = card(&s, false);
        check_width(&text);
        assert!(
            text.contains(
                "  in 2 groups: 20 × 110 ms and 20 × 20.0 ms (no step between 20.0 ms and 108 ms)"
            ),
            "{text}"
        );
        // Where the line is wider than the card, the gap goes on a line of its own.
        assert!(card_at(&s, false, MIN_WIDTH).contains("20.0 ms (no step between"));
        s.step_ms.groups[0].count = 2000;
        s.step_ms.groups[1].count = 2000;
        let narrow = card_at(&s, false, MIN_WIDTH);
        check_width_at(&narrow, MIN_WIDTH);
        assert!(
            narrow.contains(
                "  in 2 groups: 2000 × 110 ms and 2000 × 20.0 ms\n    (no step between 20.0 ms and 108 ms)"
            ),
            "{narrow}"
        );
        assert!(card(&s, false).contains("20.0 ms (no step between"));
        s.step_ms.groups.clear();
        assert!(!card(&s, false).contains("in 2 groups"));
    }

    /// An input-bound run without GPU or CUDA, host memory creeping, events lost.
    fn no_gpu_with_creep_and_losses() -> Scenario {
        Scenario {
            gpu: false,
            cuda: false,
            rss_growth: 8 << 20,
            lost: 300,
            workers: 0,
            ..testkit::input_bound()
        }
    }

    #[test]
    fn card_gpu_unavailable_with_creep_and_losses() {
        let sc = no_gpu_with_creep_and_losses();
        let text = scenario_card("nogpu", &sc);
        assert!(text.contains("GPU metrics unavailable"));
        insta::assert_snapshot!("card_gpu_unavailable", text);
    }

    #[test]
    fn wide_names_fit_the_card_by_columns() {
        // Four CJK characters, eight columns, 30 times: 240 columns in 120 characters.
        let name = "训练循环".repeat(30);
        let mut s = testkit::summary(&Scenario {
            phase_ms: [3.0, 1.0, 20.0, 25.0, 4.0, 0.5, 60.0],
            ..testkit::input_bound()
        });
        s.target.comm = Some(name.clone());
        s.target.cmdline = vec!["python".into(), name.clone()];
        for p in Phase::ALL {
            s.phases[p].top_functions = vec![crate::profile::TopFunction {
                function: format!("训练 {name}"),
                file: format!("/src/{name}.py"),
                line: 1,
                share: 0.5,
                samples: 3,
            }];
        }
        let (primary, findings) = crate::diagnosis::diagnose(&s);
        s.primary_diagnosis = primary;
        s.findings = findings;
        let text = card(&s, false);
        check_width(&text);
        assert!(text.contains("训练循环训练循环"), "{text}");
        assert!(text.contains("chars]"), "a cut marker:\n{text}");
    }

    #[test]
    fn card_follows_the_width_it_is_given() {
        let s = testkit::summary(&testkit::input_bound());
        for (asked, want) in [(40, MIN_WIDTH), (80, 80), (91, 91), (200, WIDTH)] {
            let mut v = Vec::new();
            render_card_width(&s, &mut v, false, asked).unwrap();
            let text = String::from_utf8(v).unwrap();
            let widest = text.lines().map(crate::text::width).max().unwrap();
            assert!(widest <= want, "{asked}: {widest} columns\n{text}");
            // The header's second line wraps when narrow (how the run ended comes last).
            let rule = text.lines().find(|l| l.starts_with('═')).unwrap();
            assert_eq!(crate::text::width(rule), want, "the rule");
            assert!(text.contains("VERDICT   INPUT-BOUND"));
        }
    }

    #[test]
    fn cpu_only_run_says_no_cuda_activity() {
        let mut s = testkit::summary(&Scenario {
            cuda: false,
            workers: 0,
            ..testkit::input_bound()
        });
        s.cuda = crate::summary::CudaStats {
            measured: true,
            launches_per_step: Some(0.0),
            h2d_bytes_per_step: Some(0.0),
            h2d_copies_per_step: Some(0.0),
            d2h_bytes_per_step: Some(0.0),
            d2h_copies_per_step: Some(0.0),
            syncs_per_step: Some(0.0),
            ..Default::default()
        };
        let text = card(&s, false);
        assert!(text.contains("CUDA      no CUDA activity"), "{text}");
        assert!(!text.contains("0 launches/step"), "{text}");
        // The rules ran before the CUDA numbers were replaced: run them again.
        let (primary, _) = crate::diagnosis::diagnose(&s);
        assert_eq!(primary.kind, DiagnosisKind::InputBound);
        assert!(primary.next.contains("num_workers"), "{}", primary.next);
        assert!(!primary.next.contains("pin_memory"), "{}", primary.next);
    }

    #[test]
    fn card_of_empty_summary() {
        let s = crate::analysis::summarize(&Default::default(), &[]);
        let text = card(&s, false);
        check_width(&text);
        check_prose(&text);
        insta::assert_snapshot!("card_empty", text);
    }

    #[test]
    fn json_input_bound() {
        let s = testkit::summary(&Scenario {
            steps: 12,
            ..testkit::input_bound()
        });
        let json = to_json(&s);
        assert!(json.contains("\"step_ms\": ["));
        insta::assert_snapshot!("json_input_bound", json);
        let back = Summary::from_json(&json).unwrap();
        assert_eq!(to_json(&back), json);
        assert_eq!(back.primary_diagnosis.why, s.primary_diagnosis.why);
        assert_eq!(back.step_samples, s.step_samples);
    }

    fn card_at(s: &Summary, color: bool, width: usize) -> String {
        let mut v = Vec::new();
        render_card_width(s, &mut v, color, width).unwrap();
        String::from_utf8(v).unwrap()
    }

    /// The lines of the section whose first line starts with `label`, up to the next rule.
    fn section<'a>(text: &'a str, label: &str) -> Vec<&'a str> {
        let mut lines = text.lines().skip_while(|l| !l.starts_with(label));
        let first = lines.next().into_iter();
        first
            .chain(
                lines.take_while(|l| {
                    !l.starts_with(['─', '═']) && (l.starts_with(' ') || l.is_empty())
                }),
            )
            .collect()
    }

    /// The THREAD table: its header row, then one row per phase with thread states, named
    /// first, its shares under the header's columns.
    fn check_thread_table(name: &str, s: &Summary, text: &str, width: usize) {
        let table = section(text, "THREAD");
        let want: Vec<Phase> = s
            .shown_phases()
            .into_iter()
            .filter(|&p| s.phases[p].mean_ms.is_some_and(|m| m >= 0.05))
            .collect();
        let [title, header, rows @ ..] = table.as_slice() else {
            panic!("{name}: no THREAD table\n{text}");
        };
        // The header in two lines: "waiting" over "for a CPU".
        let waiting = title.find("waiting").expect(title) + "waiting".len();
        assert_eq!(
            header.find("for a CPU").map(|i| i + 9),
            Some(waiting),
            "{header}"
        );
        for column in ["phase", "on CPU", "blocked", "in I/O", "where it blocks"] {
            assert!(header.contains(column), "{name}: {column}: {header}");
        }
        let named: Vec<&str> = rows
            .iter()
            .map(|r| r.split_whitespace().next().unwrap())
            .collect();
        let names: Vec<&str> = want.iter().map(|p| p.name()).collect();
        assert_eq!(named, names, "{name}: one row per phase\n{text}");
        // Each share under its column's header, right-aligned.
        let under = |r: &str, column: &str| {
            let end = header.find(column).unwrap() + column.len();
            r[end - 4..end].trim().to_owned()
        };
        for (r, &p) in rows.iter().zip(&want) {
            let (shares, within) = testkit::thread_states(p);
            for (column, share) in ["on CPU", "blocked", "in I/O", "for a CPU"]
                .into_iter()
                .zip(shares)
            {
                assert_eq!(under(r, column), pct_of(share), "{name}: {column}: {r}");
            }
            // Where it blocks, under its header: whole where it fits, else shortened in the
            // middle to the card's width, its share kept; only where a fifth of the phase was
            // blocked in a function that holds 30 % of it.
            let cell = r
                .get(header.find("where it blocks").unwrap()..)
                .unwrap_or("");
            let whole = match within {
                Some((f, share)) if shares[1] >= 0.2 && share >= 0.3 => {
                    format!("{f} {}", pct(share))
                }
                _ => String::new(),
            };
            let (head, tail) = cell.split_once('…').unwrap_or((&whole, ""));
            assert!(
                cell == whole
                    || (crate::text::width(r) == width
                        && whole.starts_with(head)
                        && whole.ends_with(tail)
                        && tail.ends_with('%')),
                "{name}: {r}"
            );
        }
    }

    /// The CODE table: its header row, then each group's phase and one row per site, share
    /// first, the name whole where it fits.
    fn check_code_table(name: &str, s: &Summary, text: &str, width: usize) {
        let groups = tables::code_groups(s);
        let table = section(text, "CODE");
        let [header, rest @ ..] = table.as_slice() else {
            panic!("{name}: no CODE table\n{text}");
        };
        let mut rows = rest;
        assert_eq!(*header, "CODE      share  file:function", "{name}");
        assert!(!groups.is_empty(), "{name}");
        for g in &groups {
            let [title, rest @ ..] = rows else {
                panic!("{name}: no row for {}\n{text}", g.title);
            };
            assert_eq!(title.trim(), g.title, "{name}");
            let (sites, after) = rest.split_at(g.sites.len());
            for (row, site) in sites.iter().zip(&g.sites) {
                let share = format!("{:>15}  ", site.share_text());
                let whole = format!("{share}{}", site.text());
                // Whole where it fits, else shortened to the card's width on the same row.
                let shortened = crate::text::width(&whole) > width
                    && crate::text::width(row) == width
                    && row.starts_with(&share)
                    && row.contains('…');
                assert!(*row == whole || shortened, "{name}: a site's row: {row}");
            }
            rows = after;
        }
        assert!(rows.is_empty(), "{name}: rows after the groups: {rows:#?}");
    }

    fn pct_of(share: f64) -> String {
        format!("{:.0}%", share * 100.0)
    }

    /// Every scenario's card, plain and with thread states and stack samples, at 100 and 80
    /// columns: no line over the width, THREAD and CODE as tables, color changes no layout.
    #[test]
    fn every_scenario_fits_the_width_with_its_tables() {
        let scenarios = [
            ("default", Scenario::default()),
            ("input", testkit::input_bound()),
            ("fixed", testkit::input_fixed()),
            ("compute", testkit::compute_bound()),
            ("balanced", testkit::balanced()),
            (
                "insufficient",
                Scenario {
                    steps: 3,
                    ..Scenario::default()
                },
            ),
            ("nogpu", no_gpu_with_creep_and_losses()),
        ];
        for (name, sc) in scenarios {
            let plain = testkit::summary(&sc);
            let full = testkit::with_thread_and_stacks(plain.clone());
            for width in [WIDTH, MIN_WIDTH] {
                let text = card_at(&plain, false, width);
                check_width_at(&text, width);
                assert!(!text.contains("THREAD"), "{name}: no thread states\n{text}");
                let text = card_at(&full, false, width);
                check_width_at(&text, width);
                if width == WIDTH {
                    check_prose(&text);
                }
                check_thread_table(name, &full, &text, width);
                check_code_table(name, &full, &text, width);
                let colored = card_at(&full, true, width);
                check_width_at(&colored, width);
                assert_eq!(
                    strip_ansi(&colored),
                    text,
                    "{name}: color changes the layout"
                );
            }
        }
        // The I/O column only where a phase spent time in I/O.
        let mut s = testkit::with_thread_and_stacks(testkit::summary(&testkit::input_bound()));
        s.phases.input_wait.io_ms = Some(0.0);
        let text = card(&s, false);
        let header = section(&text, "THREAD")[1];
        assert!(!header.contains("in I/O"), "{header}");
        assert!(header.contains("blocked  for a CPU"), "{header}");
    }

    /// The tables of a live input-bound run, at 100 and at 80 columns, and of a compute-bound
    /// one at 80.
    #[test]
    fn card_tables() {
        let s = testkit::with_thread_and_stacks(testkit::summary(&testkit::input_bound()));
        let wide = card_at(&s, false, WIDTH);
        let narrow = card_at(&s, false, MIN_WIDTH);
        let tables = |text: &str| {
            let mut v = section(text, "THREAD");
            v.extend(section(text, "CODE"));
            v.join("\n")
        };
        // The GPU's waits by line, at 80 columns.
        let compute = testkit::with_thread_and_stacks(testkit::summary(&testkit::compute_bound()));
        let compute = card_at(&compute, false, MIN_WIDTH);
        insta::assert_snapshot!(
            "card_tables",
            [wide, narrow, compute].map(|t| tables(&t)).join("\n\n")
        );
    }

    /// A name longer than the card is shortened in the middle: the file and the function's
    /// start and end stay (the whole name's start and end, where the file alone is too long),
    /// and the share stays on its row.
    #[test]
    fn long_names_are_shortened_in_the_middle() {
        let mut s = testkit::with_thread_and_stacks(testkit::summary(&testkit::input_bound()));
        let long = format!("Trainer.{}inner_step", "<locals>.wrapper.".repeat(8));
        let file = format!("/srv/{}loop.py", "very_long_directory_name/".repeat(6));
        let wide_file = format!("/srv/{}/recipes.py", "d".repeat(120));
        s.phases.input_wait.top_functions = vec![
            testkit::top_function(&long, &file, 0.42),
            testkit::top_function("tok", &wide_file, 0.21),
        ];
        let wide = format!("{}:tok", crate::profile::short_file(&wide_file));
        s.phases.input_wait.blocked_in = vec![testkit::top_function(&long, &file, 0.8)];
        let whole = format!("{}:{long}", crate::profile::short_file(&file));
        for width in [WIDTH, MIN_WIDTH] {
            let text = card_at(&s, false, width);
            check_width_at(&text, width);
            let code = section(&text, "CODE");
            let row = code
                .iter()
                .find(|l| l.contains("…"))
                .unwrap_or_else(|| panic!("no shortened row\n{text}"));
            assert_eq!(crate::text::width(row), width, "{row}");
            let name = row.strip_prefix("            42%  ").expect(row);
            let (head, tail) = name.split_once('…').unwrap();
            assert!(whole.starts_with(head) && whole.ends_with(tail), "{row}");
            // The file whole, the function's start and end.
            assert!(
                head.starts_with("very_long_directory_name/loop.py:Trainer."),
                "{row}"
            );
            assert!(tail.ends_with(".inner_step"), "{row}");
            // A file wider than the card: the whole name shortened in the middle.
            let row = code
                .iter()
                .find(|l| l.starts_with("            21%"))
                .unwrap();
            let name = row.strip_prefix("            21%  ").unwrap();
            let (head, tail) = name.split_once('…').expect(row);
            assert!(wide.starts_with(head) && wide.ends_with(tail), "{row}");
            assert!(head.len() > 20 && tail.ends_with(":tok"), "{row}");
            assert_eq!(crate::text::width(row), width, "{row}");
            let thread = section(&text, "THREAD");
            let row = thread
                .iter()
                .find(|l| l.starts_with("  input_wait"))
                .unwrap();
            let cell = &row[thread[1].find("where it blocks").unwrap()..];
            let (head, tail) = cell.split_once('…').expect(row);
            assert!(
                head.starts_with("Trainer") && long.starts_with(head),
                "{row}"
            );
            assert!(
                tail.len() > 4 && format!("{long} 80%").ends_with(tail),
                "{row}"
            );
            assert_eq!(crate::text::width(row), width, "{row}");
        }
    }

    #[test]
    fn middle_keeps_both_ends() {
        assert_eq!(middle("abcdefghij", 10), "abcdefghij");
        assert_eq!(middle("abcdefghij", 7), "abc…hij");
        assert_eq!(middle("abcdefghij", 6), "ab…hij");
        assert_eq!(middle("abcdefghij", 1), "…");
        assert_eq!(middle("abcdefghij", 0), "");
        // By columns: a CJK character takes two.
        let m = middle(&"训练".repeat(10), 9);
        assert_eq!(crate::text::width(&m), 9, "{m}");
        assert!(m.starts_with("训练") && m.ends_with("训练"), "{m}");
    }
}
