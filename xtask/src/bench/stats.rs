//! Statistics of the bench: medians and spreads over runs, the numbers read out of the
//! `key=value` files, and the per-window step times of the in-process overhead windows. Pure: no
//! processes, no files.
use std::collections::BTreeMap;

/// `key=value` lines of `bench_json.py`.
pub type Kv = BTreeMap<String, String>;

pub fn f(kv: &Kv, k: &str) -> Option<f64> {
    kv.get(k).and_then(|v| v.parse().ok())
}

/// Median of the finite values; NaN when there are none.
pub fn med(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// (median, min, max).
pub fn mmm(v: &[f64]) -> (f64, f64, f64) {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (med(v), lo, hi)
}

/// The `median` of a storm's last output line.
pub fn storm_ns(line: &str) -> Option<f64> {
    let i = line.find("\"median\": ")? + 10;
    line[i..].trim_end_matches(['}', ' ', '\n']).parse().ok()
}

/// A window of the in-process run: the daemon attached (`on`) or not, over
/// `[start_ns, end_ns]` of CLOCK_MONOTONIC.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Span {
    pub on: bool,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// Step times (ms) of the steps that lie wholly inside the window: a step runs from the previous
/// line of the steps log to its own.
pub fn window_steps_ms(step_ends: &[u64], w: &Span) -> Vec<f64> {
    step_ends
        .windows(2)
        .filter(|p| p[0] >= w.start_ns && p[1] <= w.end_ns)
        .map(|p| (p[1] - p[0]) as f64 / 1e6)
        .collect()
}

/// What an attach cost the target, ms: each step that ends in `(from_ns, to_ns]` (from the
/// daemon's start to the end of its learning period plus a margin) less `ref_ms` (the step time
/// of the off windows beside it), summed. `None` when no step ended there.
pub fn attach_cost_ms(step_ends: &[u64], from_ns: u64, to_ns: u64, ref_ms: f64) -> Option<f64> {
    let excess: Vec<f64> = step_ends
        .windows(2)
        .filter(|p| p[1] > from_ns && p[1] <= to_ns)
        .map(|p| (p[1] - p[0]) as f64 / 1e6 - ref_ms)
        .collect();
    (!excess.is_empty() && ref_ms.is_finite()).then(|| excess.iter().sum())
}

/// The mean of the values of the off windows next to window `i` (both when there are two).
pub fn off_neighbours(windows: &[Span], values: &[f64], i: usize) -> Option<f64> {
    let n: Vec<f64> = [i.checked_sub(1), Some(i + 1)]
        .into_iter()
        .flatten()
        .filter(|&j| j < windows.len() && !windows[j].on && values[j].is_finite())
        .map(|j| values[j])
        .collect();
    (!n.is_empty()).then(|| n.iter().sum::<f64>() / n.len() as f64)
}

/// Per on-window: its value (median step ms) over the mean of its off neighbours' values.
/// `None` where a window has no value.
pub fn on_ratios(windows: &[Span], values: &[f64]) -> Vec<Option<f64>> {
    (0..windows.len())
        .filter(|&i| windows[i].on)
        .map(|i| {
            let off = off_neighbours(windows, values, i)?;
            values[i].is_finite().then(|| values[i] / off)
        })
        .collect()
}

/// Per on-window: its value (ms) minus the mean of its off neighbours', in µs.
pub fn on_added_us(windows: &[Span], values: &[f64]) -> Vec<Option<f64>> {
    (0..windows.len())
        .filter(|&i| windows[i].on)
        .map(|i| {
            let off = off_neighbours(windows, values, i)?;
            values[i].is_finite().then(|| (values[i] - off) * 1000.0)
        })
        .collect()
}

/// CPU ms per step over a span: the CPU time between the first sample at or after its start and
/// the last one at or before its end, over the steps that ended between those two samples.
pub fn cpu_ms_per_step(step_ends: &[u64], cpu: &[(u64, u64)], span: &Span) -> f64 {
    let a = cpu.iter().find(|(t, _)| *t >= span.start_ns);
    let b = cpu.iter().rev().find(|(t, _)| *t <= span.end_ns);
    let (Some(&(ta, ca)), Some(&(tb, cb))) = (a, b) else {
        return f64::NAN;
    };
    let steps = step_ends.iter().filter(|&&e| e > ta && e <= tb).count();
    if tb <= ta || steps == 0 {
        return f64::NAN;
    }
    (cb.saturating_sub(ca)) as f64 / 1e6 / steps as f64
}

/// Per-window values (NaN where none) of on windows against their off neighbours: (median off,
/// median on, per-on-window ratios, per-on-window added µs).
pub fn compare_windows(on: &[bool], values: &[f64]) -> (f64, f64, Vec<f64>, Vec<f64>) {
    let windows: Vec<Span> = on
        .iter()
        .map(|&on| Span {
            on,
            start_ns: 0,
            end_ns: 0,
        })
        .collect();
    let pick = |want: bool| -> Vec<f64> {
        values
            .iter()
            .zip(on)
            .filter(|(v, o)| **o == want && v.is_finite())
            .map(|(v, _)| *v)
            .collect()
    };
    (
        med(&pick(false)),
        med(&pick(true)),
        on_ratios(&windows, values).into_iter().flatten().collect(),
        on_added_us(&windows, values)
            .into_iter()
            .flatten()
            .collect(),
    )
}

/// Step times of one run under its windows.
pub struct OnOff {
    pub steps_off: usize,
    pub steps_on: usize,
    /// Medians over windows of the windows' median step ms.
    pub off_ms: f64,
    pub on_ms: f64,
    /// Per on-window (those with steps on both sides): ratio and added µs per step.
    pub ratios: Vec<f64>,
    pub added_us: Vec<f64>,
    /// (largest − smallest off-window median) / smallest.
    pub off_spread: f64,
}

/// `None` spans (an on window without the part asked for) count as windows without steps.
pub fn on_off(step_ends: &[u64], spans: &[Option<Span>], on: &[bool]) -> OnOff {
    let per: Vec<Vec<f64>> = spans
        .iter()
        .map(|s| {
            s.map(|s| window_steps_ms(step_ends, &s))
                .unwrap_or_default()
        })
        .collect();
    let medians: Vec<f64> = per.iter().map(|v| med(v)).collect();
    let windows: Vec<Span> = on
        .iter()
        .map(|&on| Span {
            on,
            start_ns: 0,
            end_ns: 0,
        })
        .collect();
    let pick = |want: bool| -> Vec<f64> {
        medians
            .iter()
            .zip(on)
            .filter(|(_, o)| **o == want)
            .map(|(m, _)| *m)
            .filter(|m| m.is_finite())
            .collect()
    };
    let count = |want: bool| -> usize {
        per.iter()
            .zip(on)
            .filter(|(_, o)| **o == want)
            .map(|(v, _)| v.len())
            .sum()
    };
    let off = pick(false);
    let (lo, hi) = (
        off.iter().copied().fold(f64::INFINITY, f64::min),
        off.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    );
    OnOff {
        steps_off: count(false),
        steps_on: count(true),
        off_ms: med(&off),
        on_ms: med(&pick(true)),
        ratios: on_ratios(&windows, &medians)
            .into_iter()
            .flatten()
            .collect(),
        added_us: on_added_us(&windows, &medians)
            .into_iter()
            .flatten()
            .collect(),
        off_spread: hi / lo - 1.0,
    }
}

/// Median over on-windows of each `hits.<probe>` value of their summaries.
pub fn hits_by_probe(summaries: &[&Kv]) -> Vec<(String, f64)> {
    let mut by: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for s in summaries {
        for (k, v) in s.iter() {
            if let (Some(p), Ok(x)) = (k.strip_prefix("hits."), v.parse::<f64>()) {
                by.entry(p.to_owned()).or_default().push(x);
            }
        }
    }
    let mut out: Vec<(String, f64)> = by.into_iter().map(|(p, v)| (p, med(&v))).collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(on: bool, s: u64, e: u64) -> Span {
        Span {
            on,
            start_ns: s,
            end_ns: e,
        }
    }

    #[test]
    fn median_and_spread() {
        assert_eq!(med(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(med(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(med(&[f64::NAN]).is_nan());
        assert_eq!(mmm(&[2.0, 5.0, 1.0]), (2.0, 1.0, 5.0));
    }

    #[test]
    fn attach_cost_sums_the_excess_of_the_steps_it_covers() {
        // 10 ms steps, two of them 13 ms while learning.
        let ends = [0, 10, 20, 33, 46, 56, 66].map(|ms| ms * 1_000_000u64);
        assert_eq!(
            attach_cost_ms(&ends, 15_000_000, 56_000_000, 10.0),
            Some(6.0)
        );
        assert_eq!(attach_cost_ms(&ends, 70_000_000, 80_000_000, 10.0), None);
    }

    #[test]
    fn steps_inside_a_window_only() {
        let ends = [0, 10_000_000, 20_000_000, 32_000_000, 40_000_000];
        let w = span(false, 5_000_000, 35_000_000);
        assert_eq!(window_steps_ms(&ends, &w), vec![10.0, 12.0]);
    }

    #[test]
    fn ratio_against_both_neighbours() {
        let w = [
            span(false, 0, 1),
            span(true, 1, 2),
            span(false, 2, 3),
            span(true, 3, 4),
        ];
        let m = [10.0, 12.0, 14.0, 15.0];
        let r = on_ratios(&w, &m);
        assert_eq!(r, vec![Some(1.0), Some(15.0 / 14.0)]);
        let added = on_added_us(&w, &m);
        assert!((added[0].unwrap() - 0.0).abs() < 1e-9);
        assert!((added[1].unwrap() - 1000.0).abs() < 1e-6);
        let m = [f64::NAN, 12.0, f64::NAN, 15.0];
        assert_eq!(on_ratios(&w, &m), vec![None, None]);
    }

    #[test]
    fn on_off_of_a_steps_log() {
        // 10 ms steps, except 11 ms in the on window [100, 200) ms.
        let mut ends = vec![];
        let mut t = 0u64;
        while t < 300_000_000 {
            t += if (100_000_000..200_000_000).contains(&t) {
                11_000_000
            } else {
                10_000_000
            };
            ends.push(t);
        }
        let ms = 1_000_000;
        let spans = [
            Some(span(false, 0, 100 * ms)),
            Some(span(true, 100 * ms, 200 * ms)),
            Some(span(false, 200 * ms, 300 * ms)),
        ];
        let r = on_off(&ends, &spans, &[false, true, false]);
        assert_eq!((r.off_ms, r.on_ms), (10.0, 11.0));
        assert_eq!(r.ratios, vec![1.1]);
        assert!((r.added_us[0] - 1000.0).abs() < 1e-6);
        assert_eq!(r.off_spread, 0.0);
        let r = on_off(&ends, &[spans[0], None, spans[2]], &[false, true, false]);
        assert!(r.ratios.is_empty() && r.on_ms.is_nan() && r.steps_on == 0);
    }

    #[test]
    fn cpu_per_step_between_samples() {
        let ends = [10, 20, 30, 40, 50];
        let cpu = [(5, 0), (25, 4_000_000), (45, 8_000_000)];
        // samples at 5 and 45: steps ending 10..40, 4 of them, 8 ms of CPU
        assert_eq!(cpu_ms_per_step(&ends, &cpu, &span(true, 0, 50)), 2.0);
        assert!(cpu_ms_per_step(&ends, &cpu, &span(true, 20, 30)).is_nan());
        let (off, on, r, added) = compare_windows(&[false, true, false], &[2.0, 3.0, 2.0]);
        assert_eq!((off, on, r, added), (2.0, 3.0, vec![1.5], vec![1000.0]));
    }

    #[test]
    fn hits_are_medians_by_probe() {
        let a: Kv = [("hits.py_enter", "100"), ("hits.launch", "5"), ("x", "1")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let b: Kv = [("hits.py_enter", "120")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        assert_eq!(
            hits_by_probe(&[&a, &b]),
            vec![("py_enter".to_owned(), 110.0), ("launch".to_owned(), 5.0)]
        );
    }

    #[test]
    fn storm_line() {
        assert_eq!(
            storm_ns("{\"mode\": \"x\", \"median\": 812.5}\n"),
            Some(812.5)
        );
    }
}
