//! A summary's files in its directory: the one writer every mode uses (`--pid`, `replay`, the
//! ranks and jobs of `serve`): `final_summary.json`, `final_summary.txt` (the card) and
//! `final_report.html`, or a window's `summary-<n>.json`; each written atomically, no planted
//! link followed ([`OutDir`]).
use std::path::Path;

use crate::host::output::{OutDir, Owner};
use crate::summary::Summary;

/// The final summary's files, in the order they are written (the JSON last: a reader that
/// waits for it finds the card and the report in place).
pub const FINAL_FILES: [&str; 3] = [
    "final_summary.txt",
    "final_report.html",
    "final_summary.json",
];

/// Which summary [`write_summary`] writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stem {
    /// `final_summary.json`, `final_summary.txt` and `final_report.html`.
    Final,
    /// `summary-<n>.json`: the n-th window's summary alone (readable by `compare`).
    Window(u32),
    /// `final_summary.json` alone: a job in trouble (a HANG while its ranks still run), read by
    /// tools at once; the card and the report come with the final summary.
    FinalJson,
}

/// Writes a summary's files into `out`, each atomically ([`OutDir::write`]).
pub fn write_summary(out: &OutDir, stem: Stem, s: &Summary) -> std::io::Result<()> {
    let mut json = Vec::new();
    super::render_json(s, &mut json)?;
    match stem {
        Stem::Final => {
            let mut txt = Vec::new();
            super::render_card(s, &mut txt, false)?;
            out.write(FINAL_FILES[0], &txt)?;
            out.write(FINAL_FILES[1], super::to_html(s).as_bytes())?;
            out.write(FINAL_FILES[2], &json)
        }
        Stem::Window(n) => out.write(&format!("summary-{n}.json"), &json),
        Stem::FinalJson => out.write(FINAL_FILES[2], &json),
    }
}

/// [`write_summary`] into `dir`, created if missing.
pub fn write_summary_in(
    dir: &Path,
    owner: Option<Owner>,
    stem: Stem,
    s: &Summary,
) -> std::io::Result<()> {
    write_summary(&OutDir::create(dir, owner)?, stem, s)
}

/// One line for the log: `INPUT-BOUND warning (input_wait 34%), 120 steps`.
pub fn verdict_line(s: &Summary) -> String {
    let d = &s.primary_diagnosis;
    let share = d
        .phase
        .zip(d.share)
        .map(|(p, sh)| format!(" ({} {:.0}%)", p.name(), sh * 100.0))
        .unwrap_or_default();
    format!(
        "{} {}{share}, {} steps",
        d.kind.headline(),
        d.severity.as_str(),
        s.steps.count
    )
}
