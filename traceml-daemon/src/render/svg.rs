//! Inline SVG charts for the HTML report: a line chart, a stacked-bar chart and a grouped-bar
//! chart (categorical x axis) with linear y axes, "nice" ticks and a legend, written as text.
//!
//! Written by hand rather than with a charting crate: the report needs three chart kinds, and a
//! hundred lines of SVG text give byte-for-byte deterministic output with no font, raster or
//! template dependency, and every label passes through one escaping function
//! ([`crate::sanitize::html`]). `plotters`' SVG backend would work too, but brings its font and
//! layout machinery for a few charts.
use std::fmt::Write as _;

use crate::sanitize::html;

/// Drawing area and margins, in SVG user units (CSS pixels at 100 %).
const W: f64 = 900.0;
const H: f64 = 260.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 36.0;

/// One line of a [`line_chart`].
pub struct Series<'a> {
    pub name: &'a str,
    pub color: &'a str,
    /// `(x, y)`; a `None` y breaks the line.
    pub points: Vec<(f64, Option<f64>)>,
    pub dashed: bool,
}

/// One band of a [`stacked_bars`] chart.
pub struct Band<'a> {
    pub name: &'a str,
    pub color: &'a str,
}

/// Axis labels: the quantity and how to print a tick value.
pub struct Axis<'a> {
    pub label: &'a str,
    pub fmt: &'a dyn Fn(f64) -> String,
}

/// What every chart has: its element id, title, axes and x range `[0, x_max]`.
pub struct Frame<'a> {
    pub id: &'a str,
    pub title: &'a str,
    pub x: Axis<'a>,
    pub y: Axis<'a>,
    pub x_max: f64,
}

/// A tick value: at most 2 decimals, trailing zeros dropped ("0.25", "1.5", "40").
pub fn num(v: f64) -> String {
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_owned()
    } else {
        s.to_owned()
    }
}

/// Ticks at 1, 2 or 5 × 10^k covering `[lo, hi]`, about `n` of them.
pub fn ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    if !(lo.is_finite() && hi.is_finite()) || hi <= lo {
        return vec![lo];
    }
    let raw = (hi - lo) / n.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let first = (lo / step).ceil() * step;
    (0..)
        .map(|i| first + i as f64 * step)
        .take_while(|t| *t <= hi + step * 1e-9)
        .collect()
}

/// A line chart of `series` over `[0, x_max]` × `[0, y_max]` (the y range rounded up to a tick).
pub fn line_chart(f: &Frame, series: &[Series]) -> String {
    let y_top = series
        .iter()
        .flat_map(|s| s.points.iter().filter_map(|p| p.1))
        .fold(0.0f64, f64::max);
    let y_ticks = ticks(0.0, nice_top(y_top), 5);
    let y_max = y_ticks
        .last()
        .copied()
        .unwrap_or(1.0)
        .max(f64::MIN_POSITIVE);
    let x_max = if f.x_max > 0.0 { f.x_max } else { 1.0 };
    let mut out = open(f.id, f.title);
    grid(&mut out, &f.x, &f.y, x_max, y_max, &y_ticks);
    for s in series {
        let mut d = String::new();
        let mut pen_down = false;
        for &(px, py) in &s.points {
            match py {
                Some(py) => {
                    let (sx, sy) = (sx(px, x_max), sy(py, y_max));
                    let _ = write!(d, "{}{sx:.1},{sy:.1}", if pen_down { "L" } else { "M" });
                    pen_down = true;
                }
                None => pen_down = false,
            }
        }
        let dash = if s.dashed {
            " stroke-dasharray=\"6 4\""
        } else {
            ""
        };
        let _ = write!(
            out,
            "<path class=\"series\" d=\"{d}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"{dash}><title>{}</title></path>",
            s.color,
            html(s.name)
        );
    }
    let legend: Vec<(&str, &str)> = series.iter().map(|s| (s.name, s.color)).collect();
    close(out, &legend)
}

/// Stacked bars: one bar per `(x_start, x_end, values)` with `values` aligned with `bands`,
/// stacked bottom-up, over `[0, x_max]` × `[0, y_max]`.
pub fn stacked_bars(
    f: &Frame,
    bands: &[Band],
    bars: &[(f64, f64, Vec<f64>)],
    y_max: f64,
) -> String {
    let x_max = if f.x_max > 0.0 { f.x_max } else { 1.0 };
    let y_ticks = ticks(0.0, y_max, 4);
    let mut out = open(f.id, f.title);
    grid(&mut out, &f.x, &f.y, x_max, y_max, &y_ticks);
    for (x0, x1, values) in bars {
        let (a, b) = (sx(*x0, x_max), sx(*x1, x_max));
        let mut base = 0.0;
        for (band, v) in bands.iter().zip(values) {
            if *v <= 0.0 {
                continue;
            }
            let (top, bottom) = (sy(base + v, y_max), sy(base, y_max));
            let _ = write!(
                out,
                "<rect class=\"bar\" x=\"{a:.1}\" y=\"{top:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\"><title>{} {}</title></rect>",
                (b - a).max(0.5),
                (bottom - top).max(0.0),
                band.color,
                html(band.name),
                html(&(f.y.fmt)(*v))
            );
            base += v;
        }
    }
    let legend: Vec<(&str, &str)> = bands.iter().map(|b| (b.name, b.color)).collect();
    close(out, &legend)
}

/// One group of a [`grouped_bars`] chart: its label under the axis (short: a number; the bar
/// tooltips read "`x_label` `label` band: value") and one value per band (`None`: not measured,
/// no bar).
pub struct BarGroup {
    pub label: String,
    pub values: Vec<Option<f64>>,
}

/// Most group labels under a [`grouped_bars`] chart; with more groups every k-th is labelled.
const MAX_GROUP_LABELS: usize = 32;

/// Grouped bars: one slot per group along a categorical x axis, the bands side by side in each,
/// over `[0, y_max]` (the y range rounded up to a tick; negative values drawn as 0).
pub fn grouped_bars(
    id: &str,
    title: &str,
    x_label: &str,
    y: &Axis,
    bands: &[Band],
    groups: &[BarGroup],
) -> String {
    let y_top = groups
        .iter()
        .flat_map(|g| g.values.iter().flatten())
        .copied()
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    let y_ticks = ticks(0.0, nice_top(y_top), 5);
    let y_max = y_ticks
        .last()
        .copied()
        .unwrap_or(1.0)
        .max(f64::MIN_POSITIVE);
    let mut out = open(id, title);
    y_grid(&mut out, y, y_max, &y_ticks);
    let slot = (W - LEFT - RIGHT) / groups.len().max(1) as f64;
    let gap = slot * 0.25;
    let bar_w = (slot - gap) / bands.len().max(1) as f64;
    let label_every = groups.len().div_ceil(MAX_GROUP_LABELS).max(1);
    for (i, g) in groups.iter().enumerate() {
        let x0 = LEFT + i as f64 * slot + gap / 2.0;
        for (j, (band, v)) in bands.iter().zip(&g.values).enumerate() {
            let Some(v) = v.filter(|v| v.is_finite()) else {
                continue;
            };
            let (top, bottom) = (sy(v.max(0.0), y_max), sy(0.0, y_max));
            let _ = write!(
                out,
                "<rect class=\"bar\" x=\"{:.1}\" y=\"{top:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\"><title>{} {} {}: {}</title></rect>",
                x0 + j as f64 * bar_w,
                bar_w.max(0.5),
                (bottom - top).max(0.0),
                band.color,
                html(x_label),
                html(&g.label),
                html(band.name),
                html(&(y.fmt)(v))
            );
        }
        if i % label_every == 0 {
            let _ = write!(
                out,
                "<text class=\"tick\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                LEFT + (i as f64 + 0.5) * slot,
                H - BOTTOM + 16.0,
                html(&g.label)
            );
        }
    }
    axes(&mut out, x_label, y.label);
    let legend: Vec<(&str, &str)> = bands.iter().map(|b| (b.name, b.color)).collect();
    close(out, &legend)
}

/// `top` rounded up so the axis ends on a tick a little above the data.
fn nice_top(top: f64) -> f64 {
    if top <= 0.0 || !top.is_finite() {
        return 1.0;
    }
    let t = ticks(0.0, top * 1.05, 5);
    let step = if t.len() > 1 { t[1] - t[0] } else { top };
    (top * 1.05 / step).ceil() * step
}

fn sx(x: f64, x_max: f64) -> f64 {
    LEFT + (x / x_max).clamp(0.0, 1.0) * (W - LEFT - RIGHT)
}

fn sy(y: f64, y_max: f64) -> f64 {
    H - BOTTOM - (y / y_max).clamp(0.0, 1.0) * (H - TOP - BOTTOM)
}

fn open(id: &str, title: &str) -> String {
    format!(
        "<svg id=\"{}\" class=\"chart\" viewBox=\"0 0 {W} {H}\" role=\"img\" aria-label=\"{t}\"><title>{t}</title>",
        html(id),
        t = html(title)
    )
}

fn grid(out: &mut String, x: &Axis, y: &Axis, x_max: f64, y_max: f64, y_ticks: &[f64]) {
    y_grid(out, y, y_max, y_ticks);
    for t in ticks(0.0, x_max, 8) {
        let px = sx(t, x_max);
        let _ = write!(
            out,
            "<line class=\"axis\" x1=\"{px:.1}\" x2=\"{px:.1}\" y1=\"{:.1}\" y2=\"{:.1}\"/><text class=\"tick\" x=\"{px:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            H - BOTTOM,
            H - BOTTOM + 4.0,
            H - BOTTOM + 16.0,
            html(&(x.fmt)(t))
        );
    }
    axes(out, x.label, y.label);
}

/// The horizontal grid lines at `y_ticks`, with their values on the left.
fn y_grid(out: &mut String, y: &Axis, y_max: f64, y_ticks: &[f64]) {
    for &t in y_ticks {
        let py = sy(t, y_max);
        let _ = write!(
            out,
            "<line class=\"grid\" x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{py:.1}\" y2=\"{py:.1}\"/><text class=\"tick\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            W - RIGHT,
            LEFT - 6.0,
            py + 4.0,
            html(&(y.fmt)(t))
        );
    }
}

/// The x axis line and the two axis labels.
fn axes(out: &mut String, x_label: &str, y_label: &str) {
    let _ = write!(
        out,
        "<line class=\"axis\" x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{b:.1}\" y2=\"{b:.1}\"/><text class=\"label\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text><text class=\"label\" x=\"{LEFT}\" y=\"{:.1}\">{}</text>",
        W - RIGHT,
        (LEFT + W - RIGHT) / 2.0,
        H - 4.0,
        html(x_label),
        TOP - 12.0,
        html(y_label),
        b = H - BOTTOM,
    );
}

fn close(mut out: String, legend: &[(&str, &str)]) -> String {
    // The legend, right-aligned on the top margin.
    let mut x = W - RIGHT;
    for (name, color) in legend.iter().rev() {
        let w = 16.0 + 7.0 * crate::text::width(name) as f64;
        x -= w + 10.0;
        let _ = write!(
            out,
            "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"10\" height=\"10\" fill=\"{color}\"/><text class=\"legend\" x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            TOP - 22.0,
            x + 14.0,
            TOP - 13.0,
            html(name)
        );
    }
    out.push_str("</svg>");
    out
}

/// One row of [`collective_timeline`]: its label and its bars (entry, exit, the rank the others
/// waited for), ns.
pub type TimelineRow = (String, Vec<(u64, u64, bool)>);

/// The collective timeline: one row per rank, one bar per joined collective from the rank's
/// entry to the collective's end on it (`rows`: (label, [(enter, exit, last)]) in ns), the last
/// rank to enter each collective drawn in red.
pub fn collective_timeline(id: &str, title: &str, rows: &[TimelineRow]) -> String {
    const ROW: f64 = 22.0;
    const LEFT: f64 = 70.0;
    const WIDTH: f64 = 900.0;
    let t0 = rows
        .iter()
        .flat_map(|r| r.1.iter().map(|b| b.0))
        .min()
        .unwrap_or(0);
    let t1 = rows
        .iter()
        .flat_map(|r| r.1.iter().map(|b| b.1.max(b.0)))
        .max()
        .unwrap_or(t0)
        .max(t0 + 1);
    let span = (t1 - t0) as f64;
    let x = |t: u64| LEFT + (t.saturating_sub(t0)) as f64 / span * (WIDTH - LEFT - 10.0);
    let height = ROW * rows.len() as f64 + 30.0;
    let mut out = format!(
        "<svg id=\"{}\" class=\"chart\" viewBox=\"0 0 {WIDTH} {height}\" role=\"img\" aria-label=\"{t}\"><title>{t}</title>",
        html(id),
        t = html(title)
    );
    for (i, (label, bars)) in rows.iter().enumerate() {
        let y = 8.0 + ROW * i as f64;
        out.push_str(&format!(
            "<text class=\"label\" x=\"4\" y=\"{}\">{}</text>",
            num(y + 13.0),
            html(label)
        ));
        for &(a, b, last) in bars {
            let (xa, xb) = (x(a), x(b.max(a)));
            let fill = if last { "#e45756" } else { "#9ecae9" };
            out.push_str(&format!(
                "<rect class=\"span\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"14\" fill=\"{fill}\"/>",
                num(xa),
                num(y + 2.0),
                num((xb - xa).max(1.5))
            ));
        }
    }
    out.push_str(&format!(
        "<text x=\"{LEFT}\" y=\"{}\">0</text><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{} ms</text>",
        num(height - 6.0),
        num(WIDTH - 10.0),
        num(height - 6.0),
        num(span / 1e6)
    ));
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_numbers() {
        assert_eq!(num(0.25), "0.25");
        assert_eq!(num(1.5), "1.5");
        assert_eq!(num(40.0), "40");
        assert_eq!(num(0.0), "0");
        assert_eq!(num(1e-9), "0");
    }

    #[test]
    fn nice_ticks() {
        assert_eq!(ticks(0.0, 10.0, 5), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(ticks(0.0, 0.9, 3), vec![0.0, 0.5]);
        assert_eq!(ticks(0.0, 0.0, 5), vec![0.0]);
        assert_eq!(ticks(0.0, 157.0, 5), vec![0.0, 50.0, 100.0, 150.0]);
        assert!(nice_top(157.0) >= 157.0 && nice_top(157.0) <= 200.0);
    }

    #[test]
    fn charts_are_svg_with_escaped_labels() {
        let fmt = |v: f64| format!("{v:.0}");
        let frame = |id| Frame {
            id,
            title: "a & b",
            x: Axis {
                label: "step",
                fmt: &fmt,
            },
            y: Axis {
                label: "ms <b>",
                fmt: &fmt,
            },
            x_max: 2.0,
        };
        let s = line_chart(
            &frame("c1"),
            &[Series {
                name: "<script>",
                color: "#123456",
                points: vec![(0.0, Some(1.0)), (1.0, None), (2.0, Some(3.0))],
                dashed: false,
            }],
        );
        assert!(s.starts_with("<svg id=\"c1\"") && s.ends_with("</svg>"));
        assert!(s.contains("a &amp; b") && s.contains("ms &lt;b&gt;"));
        assert!(!s.contains("<script>") && s.contains("&lt;script&gt;"));
        // The missing point breaks the line: two moves.
        let d = s.split(" d=\"").nth(1).unwrap();
        assert_eq!(d.split('"').next().unwrap().matches('M').count(), 2);
        let b = stacked_bars(
            &frame("c2"),
            &[
                Band {
                    name: "a",
                    color: "#111",
                },
                Band {
                    name: "b",
                    color: "#222",
                },
            ],
            &[(0.0, 1.0, vec![0.25, 0.75]), (1.0, 2.0, vec![0.5, 0.5])],
            1.0,
        );
        assert_eq!(b.matches("class=\"bar\"").count(), 4);
    }

    #[test]
    fn grouped_bars_one_slot_per_group() {
        let fmt = |v: f64| format!("{v:.1}");
        let y = Axis {
            label: "ms",
            fmt: &fmt,
        };
        let bands = [
            Band {
                name: "own",
                color: "#111",
            },
            Band {
                name: "wait",
                color: "#222",
            },
        ];
        let groups = [
            BarGroup {
                label: "<0>".into(),
                values: vec![Some(30.0), Some(15.0)],
            },
            BarGroup {
                label: "1".into(),
                values: vec![Some(45.0), None],
            },
        ];
        let s = grouped_bars("g", "t", "rank", &y, &bands, &groups);
        assert!(s.starts_with("<svg id=\"g\"") && s.ends_with("</svg>"));
        assert_eq!(s.matches("<rect class=\"bar\"").count(), 3);
        assert!(s.contains(">&lt;0&gt;</text>") && !s.contains("<0>"));
        assert!(s.contains("<title>rank 1 own: 45.0</title>"));
        // No groups: an empty frame, not a panic.
        let e = grouped_bars("e", "t", "rank", &y, &bands, &[]);
        assert!(!e.contains("class=\"bar\""));
    }
}
