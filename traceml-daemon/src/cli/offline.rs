//! The commands on files: `replay` (a recording → its summary), `export` (a recording into
//! another format), `report` (the HTML report), `compare` and `sweep`. No root, no kernel.
use std::path::{Path, PathBuf};

use anyhow::Context as _;

use super::{Common, Error, FailOnArg, TextOrJson, use_color};
use crate::event::{End, EndReason, StreamItem};
use crate::host::output::{self, Owner};
use crate::summary::Summary;
use crate::{analysis, record, render};

pub(super) fn replay(file: &Path, output: Option<PathBuf>, common: &Common) -> Result<u8, Error> {
    let summary = recorded_summary(file)?;
    let dir = output.unwrap_or_else(|| {
        let stem = file
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "replay".into());
        PathBuf::from("traceml-logs").join(format!("replay-{}", crate::sanitize::dir_name(&stem)))
    });
    let out = super::outputs::prepare(&dir)?;
    super::outputs::write(&summary, &out, common)?;
    Ok(0)
}

/// The summary of a recorded run (a recording without its end record is summarised up to its
/// last event, with a note).
pub(super) fn recorded_summary(file: &Path) -> Result<Summary, Error> {
    // Folded item by item, as live: memory does not grow with the recording's length.
    let mut reader = record::Reader::open(file).map_err(Error::usage)?;
    let mut collector = analysis::Collector::new();
    let (mut ended, mut last_event_ts) = (false, 0);
    while let Some(item) = reader.next_item().map_err(Error::usage)? {
        match &item {
            StreamItem::End(_) => ended = true,
            StreamItem::Event(e) => last_event_ts = e.ts,
            _ => {}
        }
        collector.push(&item);
    }
    report_tail(file, reader.tail());
    if !ended {
        eprintln!(
            "traceml-daemon: {} has no end record (the daemon was stopped abruptly); summarising what it holds",
            file.display()
        );
        collector.push(&StreamItem::End(End {
            ts: last_event_ts,
            reason: EndReason::Truncated,
            target: None,
        }));
    }
    Ok(collector.finish())
}

/// Says on stderr what a reader dropped or skipped at the end of a recording.
fn report_tail(file: &Path, tail: record::Tail) {
    if tail.truncated {
        eprintln!(
            "traceml-daemon: {} was cut short: its incomplete last block or line ({} bytes) was dropped",
            file.display(),
            tail.dropped_bytes
        );
    }
    if tail.skipped_frames > 0 {
        eprintln!(
            "traceml-daemon: {} holds {} frames of kinds this build does not know (written by a newer traceml-daemon); they were skipped",
            file.display(),
            tail.skipped_frames
        );
    }
}

/// `export`: a recording copied into the format of `output`'s name.
pub(super) fn export(input: &Path, output: &Path) -> Result<u8, Error> {
    if input == output {
        return Err(Error::usage(
            "export: give an output file other than the input",
        ));
    }
    let (items, tail) = record::export(input, output).map_err(Error::usage)?;
    report_tail(input, tail);
    eprintln!(
        "traceml-daemon: {items} items exported to {} ({:?})",
        output.display(),
        record::Format::for_path(output)
    );
    Ok(0)
}

/// `report`: the HTML report of a summary or a recording (told apart by their first bytes: a
/// recording is gzip, binary, or starts with its header line).
pub(super) fn report(input: &Path, output: &Path) -> Result<u8, Error> {
    let head = {
        use std::io::Read;
        let mut buf = [0u8; 64];
        let n = std::fs::File::open(input)
            .and_then(|mut f| f.read(&mut buf))
            .map_err(|e| Error::usage(format!("cannot read {}: {e}", input.display())))?;
        buf[..n].to_vec()
    };
    let summary = if record::looks_like_recording(&head) {
        recorded_summary(input)?
    } else {
        read_summary(input)?
    };
    output::create_file(output, Owner::from_sudo())
        .and_then(|mut f| {
            use std::io::Write as _;
            f.write_all(render::to_html(&summary).as_bytes())
        })
        .map_err(|e| Error::usage(format!("cannot write {}: {e}", output.display())))?;
    eprintln!("traceml-daemon: report written to {}", output.display());
    Ok(0)
}

fn read_summary(p: &Path) -> Result<Summary, Error> {
    let text = std::fs::read_to_string(p)
        .map_err(|e| Error::usage(format!("cannot read {}: {e}", p.display())))?;
    Summary::from_json(&text).map_err(|e| Error::usage(format!("{}: {e}", p.display())))
}

pub(super) fn compare(
    a: &Path,
    b: &Path,
    format: TextOrJson,
    common: &Common,
) -> Result<u8, Error> {
    let (sa, sb) = (read_summary(a)?, read_summary(b)?);
    let cmp = crate::compare::compare(&sa, &sb);
    let mut out = std::io::stdout().lock();
    match format {
        TextOrJson::Text => render::render_compare(&cmp, &mut out, use_color(common.color)),
        TextOrJson::Json => render::render_compare_json(&cmp, &mut out),
    }
    .context("printing the comparison")?;
    Ok(crate::compare::exit_code(&cmp))
}

pub(super) fn sweep(
    baseline: &Path,
    candidate: &Path,
    format: TextOrJson,
    fail_on: FailOnArg,
    common: &Common,
) -> Result<u8, Error> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let result = crate::sweep::run(baseline, candidate, threads).map_err(Error::usage)?;
    let mut out = std::io::stdout().lock();
    match format {
        TextOrJson::Text => render::render_sweep(&result, &mut out, use_color(common.color)),
        TextOrJson::Json => render::render_sweep_json(&result, &mut out),
    }
    .context("printing the sweep")?;
    Ok(result.exit_code(match fail_on {
        FailOnArg::Regression => crate::sweep::FailOn::Regression,
        FailOnArg::Any => crate::sweep::FailOn::Any,
    }))
}
