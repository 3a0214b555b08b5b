//! The HTML report (`final_report.html`): one self-contained page with the verdict card, step
//! time and the training thread's time in each phase (the card's THREAD table), for a
//! multi-rank job the ranks (table, own work against collective wait, the stacks of a hang),
//! phase shares and memory over the run as inline SVG ([`super::svg`]), the code inside the
//! residual and the primary finding's phase (the card's CODE table), data quality and the
//! daemon's own cost.
//!
//! Self-contained: inline CSS, inline SVG, no script, no external resource, and a
//! Content-Security-Policy that forbids loading any (`default-src 'none'`), so opening it makes no
//! network request. The page is a [`maud`] template: every value spliced into it is HTML-escaped
//! unless marked otherwise (only the constant stylesheet and the charts [`super::svg`] wrote are).
//! Text of the model goes in as [`Text`], which also writes control and formatting characters
//! visibly ([`crate::sanitize::html`]): names from the target (functions, files, comm, command
//! line, library paths, probe failures) are hostile input.
use std::io::{self, Write};

use maud::{DOCTYPE, Markup, PreEscaped, Render, html};

use super::svg::{self, Axis, Band, BarGroup, Frame, Series};
use crate::phase::Phase;
use crate::summary::{DiagnosisKind, Severity, Summary};
use crate::units::{bytes_bin, duration, ms, pct};

mod quality;
mod ranks;
mod tables;
use quality::*;
use ranks::*;
use tables::code;

/// One color per phase, in [`Phase::ALL`] order.
pub const PHASE_COLORS: [&str; crate::phase::N_PHASES] = [
    "#e45756", "#f58518", "#4c78a8", "#72b7b2", "#54a24b", "#b279a2", "#eeca3b", "#9d9d9d",
];
/// Most bars in the phase-share chart (windows of consecutive sampled steps).
pub const SHARE_WINDOWS: usize = 80;

const CSS: &str = "\
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;color:#1d2330;\
background:#f5f6f8;margin:0;padding:24px}\
main{max-width:960px;margin:0 auto}\
h1{font-size:18px;margin:0 0 4px}h2{font-size:15px;margin:28px 0 8px}\
.meta{color:#5b6473;font-size:13px;word-break:break-all}\
.card{background:#fff;border-radius:6px;padding:16px 20px;margin:16px 0;\
border-left:6px solid #54a24b;box-shadow:0 1px 2px rgba(0,0,0,.08)}\
.card.warning{border-left-color:#f2a900}.card.critical{border-left-color:#d62728}\
.verdict{font-size:22px;font-weight:700;letter-spacing:.02em}\
.sev{font-size:13px;color:#5b6473;margin-left:10px}\
.card dl{display:grid;grid-template-columns:56px 1fr;gap:6px 12px;margin:12px 0 0}\
.card dt{font-weight:600;color:#5b6473}.card dd{margin:0}\
table{border-collapse:collapse;width:100%;background:#fff;font-size:13px}\
th,td{padding:4px 8px;text-align:left;border-bottom:1px solid #e6e8ec;vertical-align:top}\
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}\
span.bar{display:inline-block;height:10px;border-radius:2px}\
span.swatch{display:inline-block;width:10px;height:10px;border-radius:2px}\
.chart{width:100%;height:auto;background:#fff;border-radius:6px}\
.chart .grid{stroke:#e6e8ec}.chart .axis{stroke:#9aa1ad}\
.chart text{font-size:11px;fill:#5b6473}.chart .label{font-size:12px;fill:#1d2330}\
.note{color:#5b6473;font-size:13px}code{font-size:12px;word-break:break-all}\
tr.culprit td{background:#fdecea;font-weight:600}tr.group th{background:#f5f6f8}\
pre{background:#fff;border-radius:6px;padding:8px 12px;font-size:12px;overflow-x:auto;margin:4px 0 12px}\
footer{color:#8a919c;font-size:12px;margin:32px 0 0}";

/// Text of the model in the page: `& < > " '` as entities and control and formatting
/// characters written visibly, as [`crate::sanitize::html`] does. (A plain `(value)` is escaped
/// too, by maud; this also keeps a target's escape sequences out of the page.)
struct Text<'a>(&'a str);

impl Render for Text<'_> {
    fn render_to(&self, out: &mut String) {
        out.push_str(&crate::sanitize::html(self.0));
    }
}

/// A chart [`super::svg`] wrote (its labels escaped there) or the constant stylesheet.
fn trusted(markup: String) -> PreEscaped<String> {
    PreEscaped(markup)
}

/// Writes the report.
pub fn render_html(s: &Summary, w: &mut impl Write) -> io::Result<()> {
    w.write_all(to_html(s).as_bytes())
}

/// The report as a string.
pub fn to_html(s: &Summary) -> String {
    let d = &s.primary_diagnosis;
    let title = format!(
        "traceml-daemon · {} · {}",
        d.kind.headline(),
        s.target.comm.as_deref().unwrap_or("run")
    );
    let version = s.daemon_version.as_deref().unwrap_or("(unknown version)");
    let page = html! {
        (DOCTYPE) "\n"
        html lang="en" {
            head {
                meta charset="utf-8";
                meta http-equiv="Content-Security-Policy"
                    content="default-src 'none'; style-src 'unsafe-inline'";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (Text(&title)) }
                style { (PreEscaped(CSS)) }
            }
            body {
                main {
                    "\n"
                    (header(s))
                    (verdict(s))
                    (timing(s))
                    (ranks(s))
                    (charts(s))
                    (code(s))
                    (pipeline(s))
                    (findings(s))
                    (system(s))
                    (data_quality(s))
                    (overhead(s))
                    footer {
                        "Written by traceml-daemon " (Text(version)) " from final_summary.json \
                         (schema " (s.schema_version) "). Self-contained: no script, no network \
                         resource."
                    }
                    "\n"
                }
            }
        }
        "\n"
    };
    page.into_string()
}

fn header(s: &Summary) -> Markup {
    let t = &s.target;
    let mut first = vec!["traceml-daemon".to_owned()];
    if let Some(pid) = t.pid {
        first.push(format!("pid {pid}"));
    }
    if let Some(c) = &t.comm {
        first.push(c.clone());
    }
    let mut meta = Vec::new();
    if let Some(py) = &t.python {
        meta.push(format!("Python {py}"));
    }
    if let Some(h) = &t.hostname {
        meta.push(format!("host {h}"));
    }
    let boundary = s
        .steps
        .boundary
        .map(|b| format!(" (boundary {})", crate::summary::boundary_name(b)))
        .unwrap_or_default();
    meta.push(format!("{} steps{boundary}", s.steps.count));
    if let Some(d) = s.run.duration_s {
        meta.push(format!("attached {}", duration(d)));
    }
    meta.push(format!("ended: {}", super::end_reason(s)));
    html! {
        h1 { (Text(&first.join(" · "))) }
        @if !t.cmdline.is_empty() {
            div class="meta" { code { (Text(&t.cmdline.join(" "))) } }
        }
        div class="meta" { (Text(&meta.join(" · "))) }
        "\n"
    }
}

fn severity_class(sev: Severity) -> &'static str {
    match sev {
        Severity::Critical => "critical",
        Severity::Warning => "warning",
        Severity::Info => "info",
    }
}

fn verdict(s: &Summary) -> Markup {
    let d = &s.primary_diagnosis;
    html! {
        section id="verdict" class={ "card " (severity_class(d.severity)) } {
            span class="verdict" { (Text(&d.kind.headline())) }
            span class="sev" { (d.severity.as_str()) " · confidence " (d.confidence.as_str()) }
            dl {
                dt { "Why" } dd { (Text(&d.why)) }
                dt { "Next" } dd { (Text(&d.next)) }
            }
        }
        "\n"
        (what_if(s))
    }
}

/// What fixing it buys: one bar per what-if, the step now beside the step with the change.
fn what_if(s: &Summary) -> Markup {
    let widest = s.what_if.iter().map(|w| w.step_ms).fold(0.0_f64, f64::max);
    html! {
        @if !s.what_if.is_empty() && widest > 0.0 {
            h2 { "What if" }
            table id="what-if" {
                @for w in &s.what_if {
                    tr {
                        td { (Text(&w.change)) }
                        td {
                            span class="bar" style=(format!(
                                "width:{:.1}px;background:#bbb",
                                (w.step_ms / widest * 240.0).clamp(0.0, 240.0)
                            )) {}
                            br;
                            span class="bar" style=(format!(
                                "width:{:.1}px;background:#4c78a8",
                                (w.step_ms_if / widest * 240.0).clamp(0.0, 240.0)
                            )) {}
                        }
                        td {
                            (Text(&crate::whatif::sentence(w)))
                            br;
                            span class="note" { (Text(&w.assumption)) }
                        }
                    }
                }
            }
            "\n"
        }
    }
}

fn timing(s: &Summary) -> Markup {
    let p90 = s
        .step_ms
        .p90
        .map(|v| format!("p90 {}", ms(Some(v))))
        .unwrap_or_default();
    html! {
        h2 { "Step timing" }
        table id="timing" {
            tr {
                th {}
                th class="n" { "median" }
                th class="n" { "mean" }
                th class="n" { "share" }
                th {}
            }
            tr {
                th { "step" }
                td class="n" { (ms(s.step_ms.median)) }
                td class="n" { (ms(s.step_ms.mean)) }
                td class="n" { @if s.step_ms.median.is_some() { "100%" } @else { "—" } }
                td { (Text(&p90)) }
            }
            @for (phase, color) in Phase::ALL.into_iter().zip(PHASE_COLORS) {
                @let st = &s.phases[phase];
                tr {
                    td {
                        (phase.name())
                        @if s.primary_diagnosis.phase == Some(phase) { " ◀ cause" }
                    }
                    td class="n" { (ms(st.median_ms)) }
                    td class="n" { (ms(st.mean_ms)) }
                    td class="n" { (st.share.map(pct).unwrap_or_else(|| "—".to_owned())) }
                    td {
                        @if let Some(sh) = st.share {
                            span class="bar"
                                style=(format!(
                                    "width:{:.1}px;background:{color}",
                                    (sh * 240.0).clamp(0.0, 240.0)
                                )) {}
                        }
                    }
                }
            }
        }
        "\n"
        (tables::thread(s))
        @if let Some(cuda) = super::cuda_text(s) {
            p class="note" { "CUDA: " (Text(&cuda)) }
            "\n"
        }
    }
}

fn charts(s: &Summary) -> Markup {
    let ss = &s.step_samples;
    let n = ss.step_ms.len();
    html! {
        h2 { "Step time over the run" }
        @if n == 0 {
            p class="note" { "No complete steps: nothing to chart." }
            "\n"
        } @else {
            (trusted(step_time(s)))
            @if ss.stride > 1 {
                p class="note" { "Every " (ss.stride) "th of " (s.steps.count) " steps." }
            }
            "\n"
            h2 { "Phase shares over the run" }
            (trusted(phase_shares(s)))
            "\n"
        }
        h2 { "Memory over the run" }
        (memory(s))
        "\n"
    }
}

/// Step time over the sampled steps, with the median as a dashed line.
fn step_time(s: &Summary) -> String {
    let ss = &s.step_samples;
    let n = ss.step_ms.len();
    let stride = f64::from(ss.stride.max(1));
    let x_max = (n.saturating_sub(1) as f64 * stride).max(1.0);
    let mut series = vec![Series {
        name: "step",
        color: "#4c78a8",
        points: ss
            .step_ms
            .iter()
            .enumerate()
            .map(|(k, &v)| (k as f64 * stride, Some(v)))
            .collect(),
        dashed: false,
    }];
    if let Some(m) = s.step_ms.median {
        series.push(Series {
            name: "median",
            color: "#1d2330",
            points: vec![(0.0, Some(m)), (x_max, Some(m))],
            dashed: true,
        });
    }
    let ms_fmt = svg::num;
    let step_fmt = svg::num;
    svg::line_chart(
        &Frame {
            id: "chart-step-time",
            title: "Step time over the run",
            x: Axis {
                label: "step",
                fmt: &step_fmt,
            },
            y: Axis {
                label: "ms",
                fmt: &ms_fmt,
            },
            x_max,
        },
        &series,
    )
}

/// Stacked bars of each phase's share of step time, per window of consecutive sampled steps.
fn phase_shares(s: &Summary) -> String {
    let ss = &s.step_samples;
    let n = ss.step_ms.len();
    let stride = f64::from(ss.stride.max(1));
    let windows = n.clamp(1, SHARE_WINDOWS);
    let mut bars = Vec::with_capacity(windows);
    for wi in 0..windows {
        let (a, b) = (wi * n / windows, (wi + 1) * n / windows);
        if a == b {
            continue;
        }
        let sums: Vec<f64> = Phase::ALL
            .iter()
            .map(|&p| {
                ss.phase_ms[p]
                    .get(a..b)
                    .map_or(0.0, |v| v.iter().filter(|x| x.is_finite()).sum())
            })
            .collect();
        let total: f64 = sums.iter().sum();
        if total <= 0.0 {
            continue;
        }
        let shares = sums.iter().map(|v| 100.0 * v / total).collect();
        bars.push((a as f64 * stride, b as f64 * stride, shares));
    }
    let bands: Vec<Band> = Phase::ALL
        .iter()
        .zip(PHASE_COLORS)
        .map(|(p, c)| Band {
            name: p.name(),
            color: c,
        })
        .collect();
    let pct_fmt = |v: f64| format!("{}%", svg::num(v));
    let step_fmt = svg::num;
    svg::stacked_bars(
        &Frame {
            id: "chart-phase-shares",
            title: "Phase shares over the run",
            x: Axis {
                label: "step",
                fmt: &step_fmt,
            },
            y: Axis {
                label: "share of step time",
                fmt: &pct_fmt,
            },
            x_max: (n as f64 * stride).max(1.0),
        },
        &bands,
        &bars,
        100.0,
    )
}

fn memory(s: &Summary) -> Markup {
    let Some(m) = &s.memory.series else {
        return html! {
            p class="note" {
                "Memory was not sampled (or the summary predates the memory series)."
            }
        };
    };
    html! {
        (trusted(memory_chart(m)))
        @if s.gpu.is_none() {
            p class="note" { "GPU metrics unavailable." }
        }
    }
}

/// Host RSS and GPU memory of the target over the run, in MiB or GiB.
fn memory_chart(m: &crate::summary::MemorySeries) -> String {
    let top = m
        .rss_bytes
        .iter()
        .chain(&m.gpu_process_mem_bytes)
        .flatten()
        .copied()
        .max()
        .unwrap_or(0);
    let (unit, div) = if top >= 1 << 30 {
        ("GiB", (1u64 << 30) as f64)
    } else {
        ("MiB", (1u64 << 20) as f64)
    };
    let line = |v: &[Option<u64>]| -> Vec<(f64, Option<f64>)> {
        m.t_s
            .iter()
            .zip(v)
            .map(|(&t, b)| (t, b.map(|b| b as f64 / div)))
            .collect()
    };
    let mut series = vec![Series {
        name: "host RSS",
        color: "#4c78a8",
        points: line(&m.rss_bytes),
        dashed: false,
    }];
    if m.gpu_process_mem_bytes.iter().any(Option::is_some) {
        series.push(Series {
            name: "GPU memory",
            color: "#e45756",
            points: line(&m.gpu_process_mem_bytes),
            dashed: false,
        });
    }
    let y_fmt = svg::num;
    let x_fmt = svg::num;
    let y_label = format!("{unit} (target process)");
    svg::line_chart(
        &Frame {
            id: "chart-memory",
            title: "Memory over the run",
            x: Axis {
                label: "seconds since attach",
                fmt: &x_fmt,
            },
            y: Axis {
                label: &y_label,
                fmt: &y_fmt,
            },
            x_max: m.t_s.last().copied().unwrap_or(1.0),
        },
        &series,
    )
}

fn findings(s: &Summary) -> Markup {
    let primary = &s.primary_diagnosis;
    let others: Vec<_> = s
        .findings
        .iter()
        .filter(|f| !(f.kind == primary.kind && f.phase == primary.phase))
        .collect();
    if others.is_empty() {
        return html! {};
    }
    html! {
        h2 { "Other findings" }
        @for f in others {
            section class={ "card " (severity_class(f.severity)) } {
                b { (Text(&f.kind.headline())) }
                span class="sev" { (f.severity.as_str()) }
                dl {
                    dt { "Why" } dd { (Text(&f.why)) }
                    dt { "Next" } dd { (Text(&f.next)) }
                }
            }
        }
        "\n"
    }
}

/// A two-column table: a fixed name, then text of the model.
/// The input pipeline's own profile (`workers.profile`): the input wait by the pipeline's
/// state as one stacked bar, and the functions the workers' and the hand-over's samples were in.
fn pipeline(s: &Summary) -> Markup {
    const SPLIT: [(&str, &str); 4] = [
        ("workers on a CPU", "#e45756"),
        ("workers blocked", "#f58518"),
        ("workers in I/O", "#b279a2"),
        ("hand-over (IPC)", "#4c78a8"),
    ];
    let Some(p) = &s.workers.profile else {
        return html! {};
    };
    let split = p.split.map(|x| [x.cpu, x.blocked, x.io, x.ipc]);
    let lists: [(&str, &[crate::profile::TopFunction]); 4] = [
        ("workers making a batch", &p.top_functions),
        ("workers on a CPU", &p.cpu_in),
        ("workers blocked", &p.blocked_in),
        ("hand-over", &p.ipc_in),
    ];
    html! {
        h2 { "Input pipeline" }
        p id="pipeline-line" { (Text(&crate::diagnosis::pipeline_line(p))) }
        @if let Some(split) = split {
            table id="pipeline-split" {
                tr {
                    th { "the input wait" }
                    td {
                        @for ((_, color), share) in SPLIT.iter().zip(split) {
                            span class="bar" style=(format!(
                                "width:{:.1}px;background:{color}",
                                (share * 400.0).clamp(0.0, 400.0)
                            )) {}
                        }
                    }
                }
                @for ((name, color), share) in SPLIT.iter().zip(split) {
                    tr {
                        td {
                            span class="swatch" style=(format!("background:{color}")) {}
                            " " (name)
                        }
                        td class="n" { (pct(share)) }
                    }
                }
            }
        }
        @if !p.reads_from.is_empty() {
            table id="pipeline-reads" {
                tr {
                    th { "the blocked workers read" }
                    th { "kind" }
                    th { "file system" }
                    th class="n" { "share" }
                }
                @for r in &p.reads_from {
                    tr {
                        td { code { (Text(&r.site.path)) } }
                        td { (format!("{:?}", r.site.kind).to_lowercase()) }
                        td {
                            @if !r.site.fs_type.is_empty() {
                                (Text(&r.site.fs_type)) " at " code { (Text(&r.site.mount)) }
                            }
                        }
                        td class="n" { (pct(r.share)) }
                    }
                }
            }
        }
        table id="pipeline-functions" {
            tr {
                th { "samples" }
                th { "function" }
                th { "file" }
                th class="n" { "share" }
            }
            @for (what, list) in lists {
                @for t in list {
                    tr {
                        td { (what) }
                        td { code { (Text(&t.function)) } }
                        td { code { (Text(&t.file)) ":" (t.line) } }
                        td class="n" { (pct(t.share)) }
                    }
                }
            }
        }
        "\n"
    }
}

fn rows_table(id: &str, rows: &[(&str, String)]) -> Markup {
    html! {
        table id=(id) {
            @for (k, v) in rows {
                tr { th { (k) } td { (Text(v)) } }
            }
        }
    }
}

fn system(s: &Summary) -> Markup {
    let mut rows: Vec<(&str, String)> = Vec::new();
    let opt_pct = |x: Option<f64>| x.map_or("—".to_owned(), |v| format!("{v:.0}%"));
    rows.push((
        "system",
        format!(
            "CPU {} mean, {} peak{}",
            opt_pct(s.system.cpu_pct_mean),
            opt_pct(s.system.cpu_pct_max),
            s.system
                .num_cpus
                .map(|n| format!(" · {n} CPUs"))
                .unwrap_or_default()
        ),
    ));
    let mut process = format!(
        "CPU {} of one core",
        opt_pct(s.process.cpu_pct_one_core_mean)
    );
    if let Some(m) = s.process.rss_bytes_max {
        process.push_str(&format!(" · RSS peak {}", bytes_bin(m)));
    }
    rows.push(("process", process));
    rows.push((
        "workers",
        match (s.workers.count, s.workers.cpu_pct_one_core_mean) {
            (None, _) => "not sampled".to_owned(),
            (Some(0), _) => "none (data loading on the training process)".to_owned(),
            (Some(n), Some(c)) => format!("{n} · {c:.0}% of one core each"),
            (Some(n), None) => format!("{n} · CPU not measured"),
        },
    ));
    match &s.gpu {
        None => rows.push(("GPU", "GPU metrics unavailable".to_owned())),
        Some(g) => {
            for d in &g.devices {
                let mut parts = vec![d.name.clone().unwrap_or_else(|| "unknown GPU".into())];
                parts.push(format!("util {}", opt_pct(d.util_pct_mean)));
                if let (Some(u), Some(t)) = (d.mem_used_bytes_max, d.mem_total_bytes) {
                    parts.push(format!("memory {} of {}", bytes_bin(u), bytes_bin(t)));
                }
                rows.push(("GPU", parts.join(" · ")));
            }
        }
    }
    html! {
        h2 { "System and process" }
        (rows_table("system", &rows))
        "\n"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::TopFunction;
    use crate::sanitize::html;
    use crate::testkit::{self, Scenario};

    fn report(s: &Summary) -> String {
        let mut v = Vec::new();
        render_html(s, &mut v).unwrap();
        String::from_utf8(v).unwrap()
    }

    fn no_remote(h: &str) {
        for bad in [
            "http://", "https://", "<script", "<link", "<img", "<iframe", " src=\"", " href=\"",
            "@import", "url(",
        ] {
            assert!(!h.contains(bad), "report holds {bad}");
        }
    }

    #[test]
    fn report_holds_the_verdict_and_the_charts() {
        let s = testkit::summary(&testkit::input_bound());
        let h = report(&s);
        assert!(h.starts_with("<!DOCTYPE html>"));
        assert!(h.trim_end().ends_with("</html>"));
        assert!(
            h.contains("<span class=\"verdict\">INPUT-BOUND</span>"),
            "{h:.2000}"
        );
        assert!(h.contains(&html(&s.primary_diagnosis.why)));
        for id in ["chart-step-time", "chart-phase-shares", "chart-memory"] {
            assert!(h.contains(&format!("<svg id=\"{id}\"")), "{id}");
        }
        assert_eq!(h.matches("<svg").count(), h.matches("</svg>").count());
        assert!(h.contains("class=\"bar\""));
        assert!(h.contains("id=\"data-quality\""));
        // What fixing it buys: its table, the cause's sentence and assumption.
        assert!(h.contains("<table id=\"what-if\">"), "{h:.2000}");
        let w = &s.what_if[0];
        assert!(h.contains(&html(&crate::whatif::sentence(w))));
        assert!(h.contains(&html(&w.assumption)));
        no_remote(&h);
    }

    #[test]
    fn target_strings_are_escaped() {
        let mut s = testkit::summary(&testkit::input_bound());
        let evil = "<img src=x onerror=alert(1)>\"'&\x1b[2J";
        s.target.comm = Some(evil.into());
        s.target.cmdline = vec!["python".into(), evil.into()];
        s.data_quality.cuda_libraries = vec![format!("/lib/{evil}.so")];
        s.data_quality.probes_failed = vec![crate::summary::ProbeFailed {
            probe: evil.into(),
            file: evil.into(),
            reason: evil.into(),
        }];
        s.phases.residual.top_functions = vec![TopFunction {
            function: format!("Trainer.<locals>.{evil}"),
            file: format!("/src/{evil}.py"),
            line: 7,
            share: 0.5,
            samples: 12,
        }];
        let h = report(&s);
        assert!(!h.contains("<img"), "unescaped markup");
        assert!(!h.contains('\x1b'));
        assert!(h.contains("&lt;img src=x onerror=alert(1)&gt;&quot;&#39;&amp;\\x1b[2J"));
        assert!(h.contains("Trainer.&lt;locals&gt;."));
        assert!(h.contains("id=\"top-functions\""));
        no_remote(&h);
    }

    /// The `<table id="{id}">` of the report, without its tags.
    fn table_of(h: &str, id: &str) -> String {
        let table = h.split(&format!("<table id=\"{id}\">")).nth(1).expect(id);
        table.split("</table>").next().unwrap().to_owned()
    }

    /// The card's THREAD and CODE tables as HTML tables: a header row, a row per phase; a row
    /// per group of sites and per site, share first.
    #[test]
    fn report_shows_the_thread_and_code_tables() {
        let plain = testkit::summary(&testkit::compute_bound());
        assert!(
            !report(&plain).contains("id=\"thread\""),
            "no thread states"
        );
        let s = testkit::with_thread_and_stacks(plain);
        let h = report(&s);
        let thread = table_of(&h, "thread");
        assert!(
            thread.starts_with(
                "<tr><th>phase</th><th class=\"n\">on CPU</th><th class=\"n\">blocked</th>\
                 <th class=\"n\">in I/O</th><th class=\"n\">waiting for a CPU</th>\
                 <th>where it blocks</th></tr>"
            ),
            "{thread}"
        );
        let rows = super::super::card::tables::thread_rows(&s);
        assert_eq!(thread.matches("<tr>").count(), 1 + rows.len(), "{thread}");
        assert!(
            thread.contains(
                "<tr><td>input_wait</td><td class=\"n\">2%</td><td class=\"n\">97%</td>\
                 <td class=\"n\">10%</td><td class=\"n\">1%</td>\
                 <td><code>main.&lt;locals&gt;.get_batch</code> 100%</td></tr>"
            ),
            "{thread}"
        );
        let code = table_of(&h, "top-functions");
        let groups = super::super::card::tables::code_groups(&s);
        let sites: usize = groups.iter().map(|g| g.sites.len()).sum();
        assert_eq!(code.matches("<tr class=\"group\">").count(), groups.len());
        assert_eq!(
            code.matches("<tr><td class=\"n\">").count(),
            sites,
            "{code}"
        );
        assert!(
            code.contains(
                "<tr class=\"group\"><th colspan=\"4\">gpu_wait 60.2 ms/step (33%) · 1.0 \
                 syncs/step, 1.0 D2H copies/step</th></tr><tr><td class=\"n\">92%</td>\
                 <td><code>run</code> (D2H copy: <code>cudaMemcpyAsync</code>)</td>\
                 <td><code>/u/workloads/groundtruth.py:208</code></td><td class=\"n\">92</td>"
            ),
            "{code}"
        );
        assert!(
            !h.contains("id=\"wait-sites\""),
            "the waits are a group of the code table"
        );
    }

    #[test]
    fn empty_and_cpu_only_runs_render() {
        let empty = crate::analysis::summarize(&Default::default(), &[]);
        let h = report(&empty);
        assert!(h.contains("INSUFFICIENT-DATA"));
        assert!(h.contains("No complete steps"));
        assert!(!h.contains("<svg id=\"chart-step-time\""));
        no_remote(&h);
        let cpu = testkit::summary(&Scenario {
            gpu: false,
            cuda: false,
            ..Scenario::default()
        });
        let h = report(&cpu);
        assert!(h.contains("GPU metrics unavailable"));
        assert!(h.contains("<svg id=\"chart-memory\""));
        assert!(!h.contains("GPU memory</text>"), "no GPU line without NVML");
    }

    /// One rank of a job: `step` ms steps with `cw` ms of collective wait, `fwd` ms forward.
    fn rank_run(r: u32, step: f64, cw: f64, fwd: f64) -> crate::ranks::RankRun {
        let steps = 40;
        let mut s = testkit::summary(&Scenario {
            steps,
            ..Scenario::default()
        });
        s.step_samples.step_ms = (0..steps)
            .map(|i| step + 0.3 * ((i * 7 + r as usize * 3) % 5) as f64)
            .collect();
        s.step_samples.phase_ms[Phase::CollectiveWait] = (0..steps)
            .map(|i| cw + 0.3 * ((i * 3 + r as usize) % 4) as f64)
            .collect();
        s.step_ms.median = Some(step);
        s.phases[Phase::CollectiveWait].median_ms = Some(cw);
        s.phases[Phase::Forward].median_ms = Some(fwd);
        crate::ranks::RankRun {
            rank: r,
            local_rank: Some(r),
            pid: 4100 + r,
            restart: 0,
            summary: s,
            stack: Vec::new(),
        }
    }

    /// The `<tr>` of the ranks table that starts with `rank`.
    fn rank_row<'a>(h: &'a str, rank: &str) -> &'a str {
        let table = h.split("<table id=\"ranks\">").nth(1).expect("ranks table");
        let table = table.split("</table>").next().unwrap();
        table
            .split("<tr")
            .find(|row| row.contains(&format!("<td>{rank}")))
            .unwrap_or_else(|| panic!("no row for rank {rank}: {table}"))
    }

    #[test]
    fn a_multi_rank_job_has_a_ranks_section() {
        // Rank 1 forwards 15 ms longer; ranks 0 and 2 wait for it at the all-reduce.
        let runs = vec![
            rank_run(0, 45.0, 15.5, 10.0),
            rank_run(1, 45.0, 0.5, 25.0),
            rank_run(2, 45.0, 15.0, 10.0),
        ];
        let job = crate::summary::JobInfo {
            world_size: Some(3),
            run_id: Some("<b>job&1</b>".into()),
            ..Default::default()
        };
        let s = crate::ranks::combine(runs, job, &[]).unwrap();
        assert_eq!(s.primary_diagnosis.culprit_rank, Some(1));
        let h = report(&s);
        assert!(h.contains("<h2>Ranks</h2>"));
        assert!(h.contains("<table id=\"ranks\">"));
        assert!(h.contains("<th class=\"n\">collective_wait</th>"));
        assert_eq!(h.matches("<th class=\"n\">collective_wait</th>").count(), 1);
        // The culprit row is marked, and only it.
        let row = rank_row(&h, "1 (local 1)");
        assert!(row.starts_with(" class=\"culprit\""), "{row}");
        assert!(row.contains("◀ culprit"), "{row}");
        assert!(row.contains("<td class=\"n\">25.0 ms</td>"), "{row}");
        assert!(!rank_row(&h, "0 (local 0)").contains("culprit"));
        assert!(!rank_row(&h, "2 (local 2)").contains("culprit"));
        assert_eq!(h.matches("◀ culprit</td>").count(), 1);
        // The chart: two bars per rank, own work = step − collective_wait.
        assert!(h.contains("<svg id=\"chart-ranks\""));
        let chart = h.split("<svg id=\"chart-ranks\"").nth(1).unwrap();
        let chart = chart.split("</svg>").next().unwrap();
        assert_eq!(chart.matches("<rect class=\"bar\"").count(), 6);
        assert!(
            chart.contains("<title>rank 1 own work: 44.5</title>"),
            "{chart}"
        );
        assert!(chart.contains("<title>rank 0 collective_wait: 15.5</title>"));
        // Job strings escaped; no hang, no stacks.
        assert!(h.contains("run id &lt;b&gt;job&amp;1&lt;/b&gt;"));
        assert!(!h.contains("<b>job"));
        assert!(!h.contains("id=\"rank-stacks\""));
        assert_eq!(h.matches("<svg").count(), h.matches("</svg>").count());
        no_remote(&h);
        // A single process has no ranks section.
        let single = report(&testkit::summary(&testkit::input_bound()));
        assert!(!single.contains("id=\"ranks\"") && !single.contains("chart-ranks"));
    }

    #[test]
    fn a_hung_job_shows_each_ranks_stack_escaped() {
        let evil = "<script>alert(1)</script>\"'&\x1b[2J";
        let mut a = rank_run(0, 45.0, 2.0, 20.0);
        a.stack = vec!["<module>".into(), "train".into(), "all_reduce".into()];
        let mut b = rank_run(1, 45.0, 2.0, 20.0);
        b.stack = vec!["<module>".into(), "train".into(), evil.into()];
        let mut c = rank_run(2, 45.0, 2.0, 20.0);
        c.stack = (0..MAX_STACK_FRAMES + 5)
            .map(|i| format!("f{i}"))
            .chain(["barrier".to_owned()])
            .collect();
        let stuck = [crate::ranks::Stuck {
            rank: 0,
            idle_s: 70.0,
        }];
        let s = crate::ranks::combine(vec![a, b, c], Default::default(), &stuck).unwrap();
        assert_eq!(s.primary_diagnosis.kind, DiagnosisKind::Hang);
        assert_eq!(s.primary_diagnosis.culprit_rank, Some(1));
        let h = report(&s);
        assert!(h.contains("id=\"rank-stacks\""));
        let stacks = h.split("id=\"rank-stacks\"").nth(1).unwrap();
        let stacks = stacks.split("</div>").next().unwrap();
        assert_eq!(stacks.matches("<pre>").count(), 3);
        // Outermost first, innermost last, one frame a line.
        assert!(
            stacks.contains("<pre>&lt;module&gt;\ntrain\nall_reduce</pre>"),
            "{stacks}"
        );
        assert!(
            stacks.contains("rank 1 · pid 4101 ◀ culprit</p>"),
            "{stacks}"
        );
        assert!(stacks.contains(
            "<pre>&lt;module&gt;\ntrain\n&lt;script&gt;alert(1)&lt;/script&gt;&quot;&#39;&amp;\\x1b[2J</pre>"
        ));
        // A deep stack keeps its innermost frames.
        assert!(stacks.contains("<pre>… 6 outer frames\nf6\n"), "{stacks}");
        assert!(stacks.contains("f68\nbarrier</pre>"), "{stacks}");
        assert!(!h.contains("<script"));
        assert!(!h.contains('\x1b'));
        assert!(rank_row(&h, "1 (local 1)").contains("◀ culprit"));
        no_remote(&h);
    }

    #[test]
    fn long_runs_stay_small() {
        let s = testkit::summary(&Scenario {
            steps: 5000,
            ..Scenario::default()
        });
        let h = report(&s);
        assert!(h.len() < 120_000, "{} bytes", h.len());
        assert!(h.contains("Every 5th of 5000 steps"));
        assert!(h.matches("<rect class=\"bar\"").count() <= SHARE_WINDOWS * 7);
    }
}
