//! A sweep as a text table (one row per job, columns as wide as their widest cell, job names cut
//! in the middle past [`JOB_MAX`] columns) and as JSON (an array with one object per job).
use std::io::{self, Write};

use super::Painter;
use crate::compare::Change;
use crate::sweep::{JobRow, JobVerdict, Side, Sweep};
use crate::text::{self, width};
use crate::units::{ms, p_value};

/// Widest job name shown; longer ones keep their start and end.
pub const JOB_MAX: usize = 40;
/// Jobs named in the footer for each failing verdict before "and N more".
const NAMED: usize = 10;

/// Writes the sweep as a table, with ANSI color when `color`.
pub fn render_sweep(s: &Sweep, w: &mut impl Write, color: bool) -> io::Result<()> {
    let p = Painter(color);
    let paired = s.jobs.iter().filter(|j| j.only_in.is_none()).count();
    writeln!(
        w,
        "{}  baseline {} · candidate {} · {paired} jobs paired, {} unpaired",
        p.bold("traceml-daemon sweep"),
        s.baseline.display(),
        s.candidate.display(),
        s.jobs.len() - paired
    )?;
    let head = [
        "JOB",
        "VERDICT",
        "STEP TIME",
        "CHANGE",
        "p",
        "MOVED MOST",
        "DIAGNOSIS",
        "WHAT IF",
    ];
    let rows: Vec<[String; 8]> = s.jobs.iter().map(cells).collect();
    let mut widths = head.map(width);
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(width(c));
        }
    }
    // Right-aligned: the numbers.
    let right = [false, false, false, true, true, false, false, false];
    let line = |cells: [String; 8], verdict: Option<JobVerdict>| {
        let mut out = String::new();
        for (i, c) in cells.iter().enumerate() {
            let n = width(c);
            let padded = if right[i] {
                format!("{}{c}", " ".repeat(widths[i] - n))
            } else {
                format!("{c}{}", " ".repeat(widths[i] - n))
            };
            let painted = match (i, verdict) {
                (1, Some(JobVerdict::Regression)) => p.red(&padded),
                (1, Some(JobVerdict::Improvement)) => p.green(&padded),
                (1, Some(JobVerdict::Equivalent)) | (1, None) => padded,
                (1, Some(_)) => p.yellow(&padded),
                _ => padded,
            };
            if i > 0 {
                out.push_str("  ");
            }
            out.push_str(&painted);
        }
        out.trim_end().to_owned()
    };
    writeln!(w, "{}", p.bold(&line(head.map(String::from), None)))?;
    for (r, j) in rows.into_iter().zip(&s.jobs) {
        writeln!(w, "{}", line(r, Some(j.verdict)))?;
    }
    let tally: Vec<String> = JobVerdict::ALL
        .iter()
        .filter_map(|&v| {
            let n = s.count(v);
            (n > 0).then(|| format!("{n} {}", v.as_str()))
        })
        .collect();
    let total = if tally.is_empty() {
        "no jobs".to_owned()
    } else {
        tally.join(" · ")
    };
    writeln!(w, "{}", "─".repeat(widths.iter().sum::<usize>() + 14))?;
    writeln!(w, "{total}")?;
    for v in [JobVerdict::Regression, JobVerdict::Mixed] {
        let names: Vec<&str> = s
            .jobs
            .iter()
            .filter(|j| j.verdict == v)
            .map(|j| j.job.as_str())
            .collect();
        if names.is_empty() {
            continue;
        }
        let mut text = names
            .iter()
            .take(NAMED)
            .copied()
            .collect::<Vec<_>>()
            .join(", ");
        if names.len() > NAMED {
            text.push_str(&format!(" and {} more", names.len() - NAMED));
        }
        let label = format!("{}:", v.as_str().to_lowercase());
        let label = if v == JobVerdict::Regression {
            p.red(&label)
        } else {
            p.yellow(&label)
        };
        writeln!(w, "{label} {text}")?;
    }
    Ok(())
}

/// Writes the sweep as pretty JSON: an array with one object per job (`job`, `verdict`, ...).
pub fn render_sweep_json(s: &Sweep, w: &mut impl Write) -> io::Result<()> {
    super::render_json(&s.jobs, w)
}

/// The cells of one row: job, verdict, step medians, change, p, moved most, diagnosis, what-if.
fn cells(j: &JobRow) -> [String; 8] {
    let job = cut_middle(&j.job, JOB_MAX);
    let verdict = j.verdict.as_str().to_owned();
    if let Some(side) = j.only_in {
        let where_ = match side {
            Side::Baseline => "only in baseline",
            Side::Candidate => "only in candidate",
        };
        return [
            job,
            verdict,
            where_.to_owned(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
        ];
    }
    let (step, change, p) = match &j.step_ms {
        Some(d) => (
            format!("{} → {}", ms(d.a_median_ms), ms(d.b_median_ms)),
            match (d.delta_pct, d.change) {
                // Within noise or under compare's minimum effect.
                (Some(pc), Change::Same) => format!("same ({pc:+.0}%)"),
                (Some(pc), _) => format!("{pc:+.0}%"),
                (None, _) => "—".to_owned(),
            },
            p_value(d.p_value),
        ),
        None => ("—".to_owned(), "—".to_owned(), "—".to_owned()),
    };
    let moved = j
        .moved_most
        .as_ref()
        .map(|m| format!("{} {:+.1} ms", m.phase.name(), m.delta_ms))
        .unwrap_or_else(|| "—".to_owned());
    let kind = |k: &Option<String>| {
        k.as_deref()
            .map(|k| k.replace('_', "-"))
            .unwrap_or_else(|| "—".to_owned())
    };
    let (a, b) = (kind(&j.baseline_diagnosis), kind(&j.candidate_diagnosis));
    let diagnosis = if a == b { a } else { format!("{a} → {b}") };
    // What fixing the cause buys, baseline → candidate: the bound moving.
    let headroom = |h: &Option<crate::sweep::Headroom>| {
        h.as_ref()
            .map(|h| format!("{} {:.1}×", h.phase.name(), h.throughput_factor))
            .unwrap_or_else(|| "—".to_owned())
    };
    let what_if = match (&j.baseline_what_if, &j.candidate_what_if) {
        (None, None) => "—".to_owned(),
        (a, b) => format!("{} → {}", headroom(a), headroom(b)),
    };
    [job, verdict, step, change, p, moved, diagnosis, what_if]
}

/// `s` cut to `max` columns by replacing its middle with `…`.
fn cut_middle(s: &str, max: usize) -> String {
    if width(s) <= max {
        return s.to_owned();
    }
    let keep = max - 1;
    let (start, end) = (keep / 2, keep - keep / 2);
    format!("{}…{}", text::head(s, start), text::tail(s, end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary::DiagnosisKind;
    use crate::sweep::{row, unpaired};
    use crate::testkit;
    use std::path::PathBuf;

    fn sweep() -> Sweep {
        let fixed = testkit::summary(&testkit::input_fixed());
        let bound = testkit::summary(&testkit::input_bound());
        Sweep {
            baseline: PathBuf::from("runs/last-week"),
            candidate: PathBuf::from("runs/this-week"),
            jobs: vec![
                row("team/resnet/rank0", &fixed, &bound),
                row("team/resnet/rank1", &fixed, &fixed),
                unpaired("team/new-job", Side::Candidate),
                row(&"x".repeat(60), &bound, &fixed),
            ],
        }
    }

    fn text(s: &Sweep, color: bool) -> String {
        let mut v = Vec::new();
        render_sweep(s, &mut v, color).unwrap();
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn table_flags_the_regression() {
        let s = sweep();
        let t = text(&s, false);
        let line = |job: &str| t.lines().find(|l| l.starts_with(job)).unwrap().to_owned();
        let reg = line("team/resnet/rank0 ");
        assert!(reg.contains("REGRESSION"), "{t}");
        assert!(reg.contains("input_wait +"), "{t}");
        let kinds = format!(
            "{} → {}",
            testkit::summary(&testkit::input_fixed())
                .primary_diagnosis
                .kind
                .headline(),
            DiagnosisKind::InputBound.headline()
        );
        assert!(reg.contains(&format!("{kinds}  ")), "{reg}");
        // What fixing the cause buys, baseline → candidate: the regressed run's input wait.
        let factor = testkit::summary(&testkit::input_bound()).what_if[0].throughput_factor;
        assert!(
            reg.ends_with(&format!("— → input_wait {factor:.1}×")),
            "{reg}"
        );
        assert!(line("team/resnet/rank1").contains("EQUIVALENT"), "{t}");
        assert!(line("team/new-job").contains("only in candidate"), "{t}");
        assert!(
            t.contains("xxxxxxxxxxxxxxxxxxx…xxxxxxxxxxxxxxxxxxxx  IMPROVEMENT"),
            "{t}"
        );
        assert!(
            t.contains("1 REGRESSION · 1 UNPAIRED · 1 IMPROVEMENT · 1 EQUIVALENT"),
            "{t}"
        );
        assert!(t.contains("regression: team/resnet/rank0\n"), "{t}");
        // The columns line up: each verdict starts where the header's VERDICT does.
        let col = |l: &str, word: &str| width(&l[..l.find(word).unwrap()]);
        let header = t.lines().nth(1).unwrap();
        assert_eq!(col(header, "VERDICT"), JOB_MAX + 2, "{t}");
        for (l, j) in t.lines().skip(2).zip(&s.jobs) {
            assert_eq!(col(l, j.verdict.as_str()), JOB_MAX + 2, "{l}");
        }
        let colored = text(&s, true);
        assert!(colored.contains("\x1b[1;31mREGRESSION"), "{colored}");
    }

    #[test]
    fn wide_job_names_line_up_by_columns() {
        let fixed = testkit::summary(&testkit::input_fixed());
        let bound = testkit::summary(&testkit::input_bound());
        // CJK characters take two columns each, a combining accent none.
        let s = Sweep {
            baseline: PathBuf::from("a"),
            candidate: PathBuf::from("b"),
            jobs: vec![
                row("训练/模型", &fixed, &bound),
                row("cafe\u{301}/rank0", &fixed, &fixed),
                row(&"数".repeat(30), &bound, &fixed),
            ],
        };
        let t = text(&s, false);
        let col = |l: &str, word: &str| width(&l[..l.find(word).unwrap()]);
        let header = t.lines().nth(1).unwrap();
        // The widest name is the cut one, 39 columns (a CJK character does not split).
        let verdict = col(header, "VERDICT");
        assert_eq!(verdict, JOB_MAX - 1 + 2, "{t}");
        for (l, j) in t.lines().skip(2).zip(&s.jobs) {
            assert_eq!(col(l, j.verdict.as_str()), verdict, "{t}");
        }
        // 60 columns cut to 40 in the middle: 19 on the left (9 characters), 20 on the right.
        assert!(
            t.contains(&format!("{}…{}", "数".repeat(9), "数".repeat(10))),
            "{t}"
        );
    }

    #[test]
    fn json_has_one_object_per_job() {
        let s = sweep();
        let mut v = Vec::new();
        render_sweep_json(&s, &mut v).unwrap();
        let jobs: serde_json::Value = serde_json::from_slice(&v).unwrap();
        let jobs = jobs.as_array().unwrap();
        assert_eq!(jobs.len(), 4);
        assert_eq!(jobs[0]["job"], "team/resnet/rank0");
        assert_eq!(jobs[0]["verdict"], "REGRESSION");
        assert_eq!(jobs[0]["moved_most"]["phase"], "input_wait");
        assert_eq!(jobs[2]["verdict"], "UNPAIRED");
        assert_eq!(jobs[2]["only_in"], "candidate");
        let back: Vec<JobRow> = serde_json::from_slice(&v).unwrap();
        assert_eq!(back[1].verdict, JobVerdict::Equivalent);
    }

    #[test]
    fn cuts_long_names_in_the_middle() {
        assert_eq!(cut_middle("abcdef", 6), "abcdef");
        assert_eq!(cut_middle("abcdefgh", 5), "ab…gh");
    }
}
