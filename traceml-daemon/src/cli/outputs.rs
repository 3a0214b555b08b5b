//! The output directory of a run on the command line (`--pid`, `top`, `replay`): checked before
//! anything is attached, then the final summary's files written by the one writer
//! ([`files::write_summary`]) and the card printed on stdout.
use std::io::IsTerminal;
use std::path::Path;

use anyhow::Context as _;

use super::{Common, Error, use_color};
use crate::host::output::{OutDir, Owner};
use crate::render::{self, files};
use crate::summary::Summary;

/// Creates the output directory now, so an unwritable one (or a symbolic link planted at it or
/// at one of its files) is refused before attaching. Under `sudo`, what the run creates goes to
/// the user who ran it (`crate::host::output`).
pub(super) fn prepare(dir: &Path) -> Result<OutDir, Error> {
    OutDir::create(dir, Owner::from_sudo())
        .and_then(|out| {
            out.check_writable()?;
            for name in files::FINAL_FILES {
                out.check_name(name)?;
            }
            Ok(out)
        })
        .map_err(|e| {
            Error::usage(format!(
                "cannot write to output directory {}: {e}",
                dir.display()
            ))
        })
}

/// Writes the final summary's files into `out` and, unless quiet, prints the card.
pub(super) fn write(summary: &Summary, out: &OutDir, common: &Common) -> Result<(), Error> {
    let dir = out.path();
    files::write_summary(out, files::Stem::Final, summary)
        .map_err(|e| Error::usage(format!("cannot write to {}: {e}", dir.display())))?;
    if !common.quiet {
        // On a terminal the card follows its width (80 to 100 columns); the file keeps 100.
        let mut out = std::io::stdout().lock();
        render::render_card_width(summary, &mut out, use_color(common.color), card_width())
            .context("printing the card")?;
    }
    eprintln!(
        "traceml-daemon: summary written to {} (report: {})",
        dir.join("final_summary.json").display(),
        dir.join("final_report.html").display()
    );
    Ok(())
}

/// Columns of the terminal on stdout; [`render::WIDTH`] when stdout is not a terminal (the
/// card clamps it to 80–100).
fn card_width() -> usize {
    if !std::io::stdout().is_terminal() {
        return render::WIDTH;
    }
    #[cfg(feature = "live")]
    if let Ok((cols, _)) = ratatui::crossterm::terminal::size()
        && cols > 0
    {
        return usize::from(cols);
    }
    render::WIDTH
}
