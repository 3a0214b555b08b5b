//! The live view of `traceml-daemon top`, drawn from two summaries (the last window and the run
//! so far) into any ratatui buffer, and its one-line forms: the periodic line `top` prints when
//! stdout is not a terminal and the liveness line of the default attach mode. Pure: no clock, no
//! terminal (`crate::runtime::view` owns the loop, the terminal and the keys).
//!
//! Every line is laid out to the frame's width before it is drawn (text wrapped at words, lists
//! of `a · b · c` parts shortened by whole parts), so at 80 columns nothing is cut mid-word.
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Sparkline};

use crate::phase::Phase;
use crate::render::wrap_safe;
use crate::sanitize::terminal;
use crate::summary::{DiagnosisKind, Finding, Severity, Summary};
use crate::units::{bytes_bin, bytes_dec, duration, ms, pct};

/// What one refresh of the live view shows.
#[derive(Clone, Copy, Debug)]
pub struct LiveView<'a> {
    pub pid: u32,
    /// Seconds since the daemon started watching.
    pub elapsed_s: f64,
    /// The probes are attached (before that the view says "attaching").
    pub attached: bool,
    /// How far back the window reaches, in seconds.
    pub window_s: f64,
    /// The summary of the last window.
    pub window: &'a Summary,
    /// The summary of the run so far.
    pub run: &'a Summary,
}

impl LiveView<'_> {
    /// The window when it holds steps, else the run so far (right after attach, or for steps
    /// longer than the window), with the words that say which.
    fn steps_source(&self) -> (&Summary, String) {
        if self.window.steps.count > 0 {
            (self.window, format!("last {:.0} s", self.window_s))
        } else {
            (self.run, "run so far".to_owned())
        }
    }

    /// The window when it holds periodic samples, else the run so far.
    fn samples_source(&self) -> &Summary {
        if self.window.data_quality.samples > 0 {
            self.window
        } else {
            self.run
        }
    }
}

/// Width of the label column of the verdict and resource sections.
const LABEL: usize = 6;
/// Width of a phase name in the phase bars (`collective_wait`).
const PHASE_NAME: usize = 15;

/// Draws the live view over the whole frame.
pub fn draw(f: &mut Frame, v: &LiveView) {
    let area = f.area();
    let width = usize::from(area.width).max(20);
    let resources = resource_lines(v, width);
    let ranks = rank_lines(v, width);
    let footer = footer_lines(v, width);
    let (src, when) = v.steps_source();
    let spark_rows = if area.height >= 28 { 2 } else { 1 };
    let mut rows = vec![
        Constraint::Length(1),
        Constraint::Min(3),
        Constraint::Length(2 + spark_rows),
        Constraint::Length(1 + src.shown_phases().len() as u16),
        Constraint::Length(1 + resources.len() as u16),
    ];
    if !ranks.is_empty() {
        rows.push(Constraint::Length(1 + ranks.len() as u16));
    }
    rows.push(Constraint::Length(1 + footer.len() as u16));
    let parts = Layout::vertical(rows).split(area);
    f.render_widget(Paragraph::new(header_line(v, width)), parts[0]);
    let verdict = section(f, parts[1], &format!("VERDICT · {when}"));
    f.render_widget(Paragraph::new(verdict_lines(v, width)), verdict);
    steps(f, parts[2], v, width);
    let phases = section(f, parts[3], &format!("PHASES · share of step time, {when}"));
    f.render_widget(Paragraph::new(phase_lines(src, width)), phases);
    let res = section(f, parts[4], "CUDA · CPU · GPU");
    f.render_widget(Paragraph::new(resources), res);
    let mut next = 5;
    if !ranks.is_empty() {
        let r = section(f, parts[next], "RANKS");
        f.render_widget(Paragraph::new(ranks), r);
        next += 1;
    }
    let d = section(f, parts[next], "DATA · DAEMON");
    f.render_widget(Paragraph::new(footer), d);
}

/// A section: a rule with its title across the top; returns the area under it.
fn section(f: &mut Frame, area: Rect, title: &str) -> Rect {
    let block = Block::new()
        .borders(Borders::TOP)
        .border_style(Style::new().fg(Color::DarkGray))
        .title(Span::styled(
            format!(" {title} "),
            Style::new().add_modifier(Modifier::BOLD),
        ));
    let inner = block.inner(area);
    f.render_widget(block, area);
    inner
}

fn severity_style(s: Severity) -> Style {
    let c = match s {
        Severity::Critical => Color::Red,
        Severity::Warning => Color::Yellow,
        Severity::Info => Color::Green,
    };
    Style::new().fg(c).add_modifier(Modifier::BOLD)
}

/// `parts` joined with ` · `, leaving out the trailing parts that do not fit in `width`.
fn join_fit(parts: &[String], width: usize) -> String {
    let mut out = String::new();
    for p in parts {
        let need = out.chars().count() + if out.is_empty() { 0 } else { 3 } + p.chars().count();
        if need > width {
            break;
        }
        if !out.is_empty() {
            out.push_str(" · ");
        }
        out.push_str(p);
    }
    out
}

fn header_line(v: &LiveView, width: usize) -> Line<'static> {
    let comm = v
        .run
        .target
        .comm
        .as_deref()
        .map(|c| format!(" ({})", terminal(c)))
        .unwrap_or_default();
    let state = if v.attached {
        format!("attached {}", duration(v.elapsed_s))
    } else {
        "attaching…".to_owned()
    };
    let left = join_fit(
        &[
            "traceml-daemon top".to_owned(),
            format!("pid {}{comm}", v.pid),
            state,
        ],
        width,
    );
    let right = "q: detach";
    let gap = width.saturating_sub(left.chars().count() + right.len());
    let mut spans = vec![Span::styled(
        left,
        Style::new().add_modifier(Modifier::BOLD),
    )];
    if gap >= 2 {
        spans.push(Span::raw(" ".repeat(gap)));
        spans.push(Span::styled(right, Style::new().fg(Color::DarkGray)));
    }
    Line::from(spans)
}

/// `text` wrapped to `width` columns, one line each.
fn wrapped(text: &str, width: usize, style: Style) -> Vec<Line<'static>> {
    wrap_safe(text, width.max(10))
        .into_iter()
        .map(|l| Line::from(Span::styled(l, style)))
        .collect()
}

/// `label` then `text` wrapped with a hanging indent.
fn labeled(label: &str, text: &str, width: usize, style: Style) -> Vec<Line<'static>> {
    wrap_safe(text, width.saturating_sub(LABEL).max(10))
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            let label = if i == 0 { label } else { "" };
            Line::from(vec![
                Span::styled(
                    format!("{label:<LABEL$}"),
                    Style::new().add_modifier(Modifier::BOLD),
                ),
                Span::styled(l, style),
            ])
        })
        .collect()
}

/// `INPUT-BOUND (input_wait 86%)`.
fn verdict_short(d: &Finding) -> String {
    match (d.phase, d.share) {
        (Some(p), Some(s)) => format!("{} ({} {})", d.kind.headline(), p.name(), pct(s)),
        _ => d.kind.headline(),
    }
}

fn verdict_lines(v: &LiveView, width: usize) -> Vec<Line<'static>> {
    // The window's verdict once it has steps; the run's before.
    let (src, _) = v.steps_source();
    let d = &src.primary_diagnosis;
    let head = format!(
        "{}  {} · confidence {}",
        d.kind.headline(),
        d.severity.as_str(),
        d.confidence.as_str()
    );
    let mut first = vec![
        Span::styled(d.kind.headline(), severity_style(d.severity)),
        Span::raw(head[d.kind.headline().len()..].to_owned()),
    ];
    let so_far = format!("   run so far: {}", verdict_short(&v.run.primary_diagnosis));
    let mut lines = Vec::new();
    if head.chars().count() + so_far.chars().count() <= width {
        first.push(Span::styled(so_far, Style::new().fg(Color::DarkGray)));
        lines.push(Line::from(first));
    } else {
        lines.push(Line::from(first));
        lines.extend(labeled(
            "",
            so_far.trim(),
            width,
            Style::new().fg(Color::DarkGray),
        ));
    }
    lines.extend(labeled("Why", &d.why, width, Style::new()));
    if d.kind != DiagnosisKind::InsufficientData {
        lines.extend(labeled("Next", &d.next, width, Style::new()));
    }
    lines
}

fn steps(f: &mut Frame, area: Rect, v: &LiveView, width: usize) {
    let (src, when) = v.steps_source();
    let inner = section(f, area, &format!("STEP TIME · {when}"));
    let [text, spark] =
        Layout::vertical([Constraint::Length(1), Constraint::Min(1)]).areas::<2>(inner);
    let recent = recent_steps(src, width.saturating_sub(LABEL));
    let parts = vec![
        format!("last {}", ms(recent.last().map(|&us| us as f64 / 1000.0))),
        format!("median {}", ms(src.step_ms.median)),
        format!("p90 {}", ms(src.step_ms.p90)),
        format!("{} steps in the run", v.run.steps.count),
    ];
    f.render_widget(Paragraph::new(join_fit(&parts, width)), text);
    let [label, bars] = Layout::horizontal([Constraint::Length(LABEL as u16), Constraint::Min(1)])
        .areas::<2>(spark);
    f.render_widget(
        Paragraph::new(Span::styled("steps", Style::new().fg(Color::DarkGray))),
        label,
    );
    if recent.is_empty() {
        f.render_widget(
            Paragraph::new(Span::styled(
                "waiting for complete steps",
                Style::new().fg(Color::DarkGray),
            )),
            bars,
        );
    } else {
        f.render_widget(
            Sparkline::default()
                .data(&recent)
                .style(Style::new().fg(Color::Cyan)),
            bars,
        );
    }
}

/// The last `n` step durations of the summary's per-step samples, in µs (the sparkline's
/// integer heights).
pub fn recent_steps(s: &Summary, n: usize) -> Vec<u64> {
    let all = &s.step_samples.step_ms;
    all[all.len().saturating_sub(n)..]
        .iter()
        .map(|&m| (m.max(0.0) * 1000.0).round() as u64)
        .collect()
}

/// A bar of `share` (0–1) in `width` cells, in eighths.
fn bar(share: f64, width: usize) -> String {
    let eighths = (share.clamp(0.0, 1.0) * (width * 8) as f64).round() as usize;
    let mut s = "█".repeat(eighths / 8);
    if let Some(i) = (eighths % 8).checked_sub(1) {
        s.push(['▏', '▎', '▍', '▌', '▋', '▊', '▉'][i]);
    }
    s
}

fn phase_lines(s: &Summary, width: usize) -> Vec<Line<'static>> {
    // name, bar, share (6), median (10), cause mark (2)
    let bar_w = width.saturating_sub(PHASE_NAME + 1 + 6 + 10 + 3).max(4);
    let d = &s.primary_diagnosis;
    s.shown_phases()
        .into_iter()
        .map(|p| {
            let st = &s.phases[p];
            let cause = d.phase == Some(p) && d.kind != DiagnosisKind::Balanced;
            let share = st.share.map(pct).unwrap_or_else(|| "—".to_owned());
            let b = bar(st.share.unwrap_or(0.0), bar_w);
            let style = if cause {
                severity_style(d.severity)
            } else {
                Style::new().fg(Color::Cyan)
            };
            Line::from(vec![
                Span::raw(format!("{:<PHASE_NAME$} ", p.name())),
                Span::styled(format!("{b:<bar_w$}"), style),
                Span::raw(format!("{share:>6}{:>10}", ms(st.median_ms))),
                Span::styled(if cause { " ◀" } else { "" }, style),
            ])
        })
        .collect()
}

/// Host-side CUDA activity per step, short.
fn cuda_text(s: &Summary) -> String {
    let c = &s.cuda;
    if !c.measured {
        return "not measured: no CUDA library probed (yet)".to_owned();
    }
    if s.steps.count == 0 {
        return "waiting for complete steps".to_owned();
    }
    let none = |x: Option<f64>| x.is_none_or(|v| v == 0.0);
    if none(c.launches_per_step)
        && none(c.h2d_copies_per_step)
        && none(c.d2h_copies_per_step)
        && none(c.syncs_per_step)
    {
        return "no CUDA activity (no launches, copies or syncs in the steps)".to_owned();
    }
    let mut parts = Vec::new();
    if let Some(l) = c.launches_per_step {
        parts.push(format!("{l:.0} launches/step"));
    }
    if let Some(b) = c.h2d_bytes_per_step {
        let bw = c
            .h2d_gb_per_s
            .map(|g| format!(" at {}/s", bytes_dec(g * 1e9)))
            .unwrap_or_default();
        parts.push(format!("H2D {}/step{bw}", bytes_dec(b)));
    }
    if let Some(b) = c.d2h_bytes_per_step.filter(|&b| b > 0.0) {
        parts.push(format!("D2H {}/step", bytes_dec(b)));
    }
    if let Some(n) = c.syncs_per_step {
        parts.push(format!("{n:.1} syncs/step"));
    }
    parts.join(" · ")
}

fn cpu_text(s: &Summary) -> String {
    let mut parts = Vec::new();
    if let Some(c) = s.process.cpu_pct_one_core_mean {
        parts.push(format!("training process {c:.0}% of a core"));
    }
    let w = &s.workers;
    parts.push(match (w.count, w.cpu_pct_one_core_mean) {
        (None, _) => "workers not sampled yet".to_owned(),
        (Some(0), _) => "no DataLoader workers".to_owned(),
        (Some(n), Some(c)) => {
            let state = w
                .state
                .map(|s| format!(" ({})", s.as_str()))
                .unwrap_or_default();
            format!("{n} workers at {c:.0}% of a core{state}")
        }
        (Some(n), None) => format!("{n} workers"),
    });
    if let Some(c) = s.system.cpu_pct_mean {
        let n = s
            .system
            .num_cpus
            .map(|n| format!(" of {n} CPUs"))
            .unwrap_or_default();
        parts.push(format!("system {c:.0}%{n}"));
    }
    parts.join(" · ")
}

fn gpu_text(s: &Summary) -> String {
    let Some(g) = &s.gpu else {
        return "GPU metrics unavailable".to_owned();
    };
    let used: Vec<_> = g.devices.iter().filter(|d| d.used_by_target).collect();
    let devices = if used.is_empty() {
        g.devices.iter().collect()
    } else {
        used
    };
    let mut parts = Vec::new();
    if devices.len() > 1 {
        parts.push(format!("{} GPUs", devices.len()));
    }
    parts.push(format!(
        "util {}",
        g.util_pct_mean
            .map(|u| format!("{u:.0}%"))
            .unwrap_or_else(|| "—".to_owned())
    ));
    let total: Option<u64> = devices.iter().map(|d| d.mem_total_bytes).sum();
    match (g.process_mem_bytes_max, total) {
        (Some(m), Some(t)) => parts.push(format!(
            "target's memory {} of {}",
            bytes_bin(m),
            bytes_bin(t)
        )),
        (Some(m), None) => parts.push(format!("target's memory {}", bytes_bin(m))),
        _ => {
            let used: Option<u64> = devices.iter().map(|d| d.mem_used_bytes_max).sum();
            if let (Some(u), Some(t)) = (used, total) {
                parts.push(format!("memory {} of {}", bytes_bin(u), bytes_bin(t)));
            }
        }
    }
    parts.join(" · ")
}

fn resource_lines(v: &LiveView, width: usize) -> Vec<Line<'static>> {
    let (steps, _) = v.steps_source();
    let samples = v.samples_source();
    let mut lines = labeled("CUDA", &cuda_text(steps), width, Style::new());
    lines.extend(labeled("CPU", &cpu_text(samples), width, Style::new()));
    let gpu_style = if samples.gpu.is_none() {
        Style::new().fg(Color::DarkGray)
    } else {
        Style::new()
    };
    lines.extend(labeled("GPU", &gpu_text(samples), width, gpu_style));
    lines
}

/// Most rank rows shown; a larger job gets a last row saying how many more.
const MAX_RANK_ROWS: usize = 8;

/// One row per rank of a multi-rank job (none for a single process): its step count and median,
/// its collective wait, its own verdict, and a mark on the rank the others wait for.
fn rank_lines(v: &LiveView, width: usize) -> Vec<Line<'static>> {
    let s = if v.window.ranks.is_empty() {
        v.run
    } else {
        v.window
    };
    let culprit = s
        .findings
        .iter()
        .find(|f| matches!(f.kind, DiagnosisKind::Straggler | DiagnosisKind::Hang))
        .and_then(|f| f.culprit_rank.map(|r| (r, f)));
    let mut lines: Vec<Line<'static>> = s
        .ranks
        .iter()
        .take(if s.ranks.len() > MAX_RANK_ROWS {
            MAX_RANK_ROWS - 1
        } else {
            MAX_RANK_ROWS
        })
        .map(|r| {
            let wait = r.phases[Phase::CollectiveWait]
                .share
                .map(|sh| format!("collective_wait {}", pct(sh)))
                .unwrap_or_default();
            let text = join_fit(
                &[
                    format!("rank {:<3} pid {:<7}", r.rank, r.pid),
                    format!("{} steps", r.steps),
                    format!("median {}", ms(r.step_ms.median)),
                    wait,
                    r.verdict.headline(),
                ]
                .into_iter()
                .filter(|p| !p.is_empty())
                .collect::<Vec<_>>(),
                width.saturating_sub(4),
            );
            match culprit {
                Some((c, f)) if c == r.rank => Line::from(vec![
                    Span::styled(text, severity_style(f.severity)),
                    Span::styled(" ◀", severity_style(f.severity)),
                ]),
                _ => Line::from(text),
            }
        })
        .collect();
    if s.ranks.len() > MAX_RANK_ROWS {
        lines.push(Line::from(format!(
            "… and {} more ranks",
            s.ranks.len() - (MAX_RANK_ROWS - 1)
        )));
    }
    lines
}

fn footer_lines(v: &LiveView, width: usize) -> Vec<Line<'static>> {
    let q = &v.run.data_quality;
    let mut parts = vec![match (&q.events_lost, q.lost_ratio) {
        (Some(l), Some(r)) if l.total + l.seq_gaps > 0 => {
            format!("{} events lost ({})", l.total + l.seq_gaps, pct(r))
        }
        (Some(_), _) => "no events lost".to_owned(),
        // The run reports its loss counters when they change: none yet is none lost.
        (None, _) => "no events lost so far".to_owned(),
    }];
    parts.push(format!("{} events", q.events_recorded));
    if let Some(o) = &v.run.daemon_overhead {
        let budget = o
            .budget_pct
            .map(|b| format!(", budget {b}%"))
            .unwrap_or_default();
        parts.push(match (o.steady_us_per_step, o.steady_pct_of_step) {
            (Some(us), Some(p)) => {
                format!(
                    "daemon cost est. {} µs/step ({p:.2}% of step{budget})",
                    micros(us)
                )
            }
            (Some(us), None) => format!("daemon cost est. {} µs/step", micros(us)),
            _ => "daemon cost: no steps yet".to_owned(),
        });
    }
    wrapped(&parts.join(" · "), width, Style::new())
}

/// "12", "3.4", "0.25": microseconds with two significant digits below 10.
fn micros(us: f64) -> String {
    if us >= 10.0 {
        format!("{us:.0}")
    } else if us >= 1.0 {
        format!("{us:.1}")
    } else {
        format!("{us:.2}")
    }
}

/// The periodic line of `top` when stdout is not a terminal:
/// `t=12s steps=340 step=35.1ms verdict=INPUT-BOUND input_wait 86%`.
pub fn plain_line(v: &LiveView) -> String {
    let (src, _) = v.steps_source();
    let step = src
        .step_ms
        .median
        .map(|m| ms(Some(m)).replace(' ', ""))
        .unwrap_or_else(|| "—".to_owned());
    let d = &src.primary_diagnosis;
    let phase = match (d.phase, d.share) {
        (Some(p), Some(s)) => format!(" {} {}", p.name(), pct(s)),
        _ => String::new(),
    };
    format!(
        "t={:.0}s steps={} step={step} verdict={}{phase}",
        v.elapsed_s,
        v.run.steps.count,
        d.kind.headline()
    )
}

/// `top`'s plain lines for the ranks of a job, one per rank: `rank 2 pid 4242 steps=340
/// step=35.1ms coll_w=2.0ms own=COMPUTE-BOUND ◀ culprit`.
pub fn plain_rank_lines(s: &Summary) -> Vec<String> {
    let culprit = s.primary_diagnosis.culprit_rank;
    let m = |v: Option<f64>| {
        v.map(|m| ms(Some(m)).replace(' ', ""))
            .unwrap_or_else(|| "—".to_owned())
    };
    s.ranks
        .iter()
        .map(|r| {
            format!(
                "rank {} pid {} steps={} step={} coll_w={} own={}{}",
                r.rank,
                r.pid,
                r.steps,
                m(r.step_ms.median),
                m(r.phases[crate::phase::Phase::CollectiveWait].median_ms),
                r.verdict.headline(),
                if culprit == Some(r.rank) {
                    " ◀ culprit"
                } else {
                    ""
                }
            )
        })
        .collect()
}

/// The liveness line of the default attach mode (on stderr, refreshed in place), at most
/// `width` columns: `traceml-daemon: attached to pid 1234 · 12.0 s · 340 steps · INPUT-BOUND
/// (input_wait 86%)`.
pub fn liveness_line(
    pid: u32,
    elapsed_s: f64,
    attached: bool,
    run: &Summary,
    width: usize,
) -> String {
    let mut parts = vec![if attached {
        format!("traceml-daemon: attached to pid {pid}")
    } else {
        format!("traceml-daemon: attaching to pid {pid}…")
    }];
    if attached {
        parts.push(duration(elapsed_s));
        parts.push(format!("{} steps", run.steps.count));
        if run.steps.count > 0 {
            parts.push(verdict_short(&run.primary_diagnosis));
        }
        parts.push("Ctrl-C detaches".to_owned());
    }
    join_fit(&parts, width)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{self, Scenario};
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;

    fn screen(v: &LiveView, w: u16, h: u16) -> Vec<String> {
        let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
        t.draw(|f| draw(f, v)).unwrap();
        let buf = t.backend().buffer().clone();
        (0..h)
            .map(|y| (0..w).map(|x| buf[(x, y)].symbol().to_owned()).collect())
            .collect()
    }

    fn view<'a>(window: &'a Summary, run: &'a Summary) -> LiveView<'a> {
        LiveView {
            pid: 4242,
            elapsed_s: 12.0,
            attached: true,
            window_s: 9.6,
            window,
            run,
        }
    }

    /// The summary of a replayed recording of a real daemon run.
    fn recorded(name: &str) -> Summary {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/recordings")
            .join(format!("{name}.jsonl.gz"));
        crate::analysis::analyze(&crate::record::read(&p).unwrap().items)
    }

    /// Words of a screen, without the bars and sparklines (whose length follows the width).
    fn words(lines: &[String]) -> Vec<String> {
        const BLOCKS: &str = "█▏▎▍▌▋▊▉▁▂▃▄▅▆▇─";
        lines
            .iter()
            .flat_map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
            .filter(|w| !w.chars().all(|c| BLOCKS.contains(c)))
            .collect()
    }

    fn check_layout(s: &Summary, w: u16) -> Vec<String> {
        let v = view(s, s);
        let lines = screen(&v, w, 30);
        let text = lines.join("\n");
        let d = &s.primary_diagnosis;
        assert!(text.contains(&d.kind.headline()), "verdict:\n{text}");
        assert!(text.contains("Why"), "why:\n{text}");
        for p in s.shown_phases() {
            let row = lines
                .iter()
                .find(|l| l.starts_with(p.name()))
                .unwrap_or_else(|| panic!("{} row:\n{text}", p.name()));
            if let Some(sh) = s.phases[p].share {
                assert!(row.contains(&pct(sh)), "{} share in {row:?}", p.name());
            }
        }
        // The sparkline: the step row's second line holds bars.
        let spark = lines
            .iter()
            .find(|l| l.starts_with("steps "))
            .unwrap_or_else(|| panic!("sparkline row:\n{text}"));
        assert!(
            spark.chars().filter(|c| "▁▂▃▄▅▆▇█".contains(*c)).count() >= 10,
            "sparkline: {spark:?}"
        );
        // The first words of the why are shown whole.
        let why: Vec<&str> = d.why.split_whitespace().take(6).collect();
        assert!(
            words(&lines).windows(6).any(|w| w == why.as_slice()),
            "why {why:?} in:\n{text}"
        );
        lines
    }

    /// Nothing is cut mid-word: every word at `w` columns is a word of the same view drawn
    /// 300 columns wide (where every line fits whole).
    fn no_cut_words(s: &Summary, w: u16, h: u16) {
        let v = view(s, s);
        let narrow = words(&screen(&v, w, h));
        let wide = words(&screen(&v, 300, 40));
        let mut model: Vec<String> = wide;
        model.extend(
            s.primary_diagnosis
                .why
                .split_whitespace()
                .map(str::to_owned),
        );
        model.extend(
            s.primary_diagnosis
                .next
                .split_whitespace()
                .map(str::to_owned),
        );
        for word in &narrow {
            assert!(
                model.contains(word),
                "{word:?} at {w} columns is not a whole word of the view:\n{}",
                screen(&v, w, h).join("\n")
            );
        }
    }

    #[test]
    fn fixture_at_80_and_120_columns() {
        let s = testkit::summary(&testkit::input_bound());
        assert_eq!(s.primary_diagnosis.kind, DiagnosisKind::InputBound);
        for w in [80, 120] {
            let lines = check_layout(&s, w);
            let text = lines.join("\n");
            eprintln!("{w} columns:\n{text}");
            assert!(text.contains("input_wait"), "{text}");
            assert!(text.contains("◀"), "cause marked:\n{text}");
            assert!(text.contains("workers"), "{text}");
            no_cut_words(&s, w, 30);
            no_cut_words(&s, w, 24);
        }
    }

    #[test]
    fn replayed_recording_at_80_and_120_columns() {
        let s = recorded("input_bound_single");
        assert_eq!(s.primary_diagnosis.kind, DiagnosisKind::InputBound);
        for w in [80, 120] {
            check_layout(&s, w);
            no_cut_words(&s, w, 30);
            no_cut_words(&s, w, 24);
        }
        let text = screen(&view(&s, &s), 80, 30).join("\n");
        // A recording without NVML samples: said, never zero.
        if s.gpu.is_none() {
            assert!(text.contains("GPU metrics unavailable"), "{text}");
        }
        assert!(
            text.contains("daemon cost") || s.daemon_overhead.is_none(),
            "{text}"
        );
    }

    #[test]
    fn multi_rank_jobs_get_a_row_per_rank() {
        let mut s = testkit::summary(&testkit::input_bound());
        assert!(!screen(&view(&s, &s), 80, 30).join("\n").contains("RANKS"));
        s.ranks = (0..12)
            .map(|r| crate::summary::RankSummary {
                rank: r,
                pid: 1000 + r,
                steps: 200,
                step_ms: s.step_ms.clone(),
                verdict: DiagnosisKind::InputBound,
                ..Default::default()
            })
            .collect();
        let mut straggler = s.primary_diagnosis.clone();
        straggler.kind = DiagnosisKind::Straggler;
        straggler.culprit_rank = Some(3);
        s.findings.insert(0, straggler);
        let lines = screen(&view(&s, &s), 80, 40);
        let text = lines.join("\n");
        assert!(text.contains("RANKS"), "{text}");
        let culprit = lines
            .iter()
            .find(|l| l.starts_with("rank 3 "))
            .unwrap_or_else(|| panic!("rank 3 row:\n{text}"));
        assert!(culprit.contains('◀'), "{culprit}");
        assert!(text.contains("rank 0 "), "{text}");
        assert!(text.contains("and 5 more ranks"), "{text}");
        // collective_wait gets its row in a multi-rank job.
        assert!(
            lines.iter().any(|l| l.starts_with("collective_wait")),
            "{text}"
        );
        no_cut_words(&s, 80, 40);
    }

    #[test]
    fn gpu_and_lost_events_are_shown() {
        let s = testkit::summary(&Scenario {
            lost: 500,
            ..testkit::compute_bound()
        });
        let text = screen(&view(&s, &s), 80, 30).join("\n");
        assert!(text.contains("util "), "{text}");
        assert!(!text.contains("GPU metrics unavailable"), "{text}");
        assert!(text.contains("events lost"), "{text}");
        let no_gpu = testkit::summary(&Scenario {
            gpu: false,
            ..testkit::input_bound()
        });
        let text = screen(&view(&no_gpu, &no_gpu), 80, 30).join("\n");
        assert!(text.contains("GPU metrics unavailable"), "{text}");
    }

    #[test]
    fn an_empty_window_falls_back_to_the_run() {
        let run = testkit::summary(&testkit::input_bound());
        let empty = crate::analysis::Collector::new().snapshot();
        let v = LiveView {
            window: &empty,
            ..view(&run, &run)
        };
        let text = screen(&v, 80, 30).join("\n");
        assert!(text.contains("run so far"), "{text}");
        assert!(text.contains("INPUT-BOUND"), "{text}");
        // Before any step at all: no panic, and the view says it waits.
        let v = LiveView {
            attached: false,
            ..view(&empty, &empty)
        };
        let text = screen(&v, 80, 24).join("\n");
        assert!(text.contains("attaching"), "{text}");
        assert!(text.contains("waiting for complete steps"), "{text}");
        // Tiny terminals do not panic.
        screen(&v, 20, 5);
        screen(&view(&run, &run), 30, 10);
    }

    #[test]
    fn plain_and_liveness_lines() {
        let s = testkit::summary(&testkit::input_bound());
        let line = plain_line(&view(&s, &s));
        assert!(
            line.starts_with(&format!("t=12s steps={} step=", s.steps.count)),
            "{line}"
        );
        assert!(line.contains("verdict=INPUT-BOUND input_wait "), "{line}");
        assert!(
            !line.contains(' ') || line.split(' ').count() == 6,
            "{line}"
        );
        let l = liveness_line(7, 12.0, true, &s, 200);
        assert!(l.contains("attached to pid 7"), "{l}");
        assert!(l.contains(&format!("{} steps", s.steps.count)), "{l}");
        assert!(l.contains("INPUT-BOUND (input_wait"), "{l}");
        // Shortened by whole parts to the terminal's width.
        let short = liveness_line(7, 12.0, true, &s, 60);
        assert!(short.chars().count() <= 60, "{short}");
        assert!(l.starts_with(&short), "{short} / {l}");
        assert!(liveness_line(7, 0.5, false, &s, 80).contains("attaching to pid 7"));
    }
}
