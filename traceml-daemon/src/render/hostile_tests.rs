//! Hostile names from a target in every renderer: the card (with and without color), the JSON, the
//! HTML report and the comparison. Every string of the model that can come from a target holds
//! ANSI CSI and OSC sequences, an 8-bit CSI, NUL and line breaks, HTML/JS, a bidi override,
//! invalid UTF-8 (as the readers convert it) and a 100 000-character name.
use super::*;
use crate::phase::Phase;
use crate::profile::TopFunction;
use crate::sanitize::tests::{assert_terminal_safe, hostile_names};
use crate::summary::ProbeFailed;
use crate::summary::{DiagnosisKind, Summary};
use crate::testkit::{self, Scenario};

/// A residual-heavy run whose every target-derived string is hostile; the rules run again so
/// their messages quote the hostile function and file names.
fn hostile_summary() -> Summary {
    let names = hostile_names();
    let mut s = testkit::summary(&Scenario {
        phase_ms: [3.0, 1.0, 20.0, 25.0, 4.0, 0.5, 60.0],
        ..testkit::input_bound()
    });
    s.target.comm = Some(names[0].clone());
    s.target.cmdline = names.clone();
    for p in Phase::ALL {
        s.phases[p].top_functions = names
            .iter()
            .enumerate()
            .map(|(i, n)| TopFunction {
                function: n.clone(),
                file: format!("/site-packages/{n}.py"),
                line: i as u32,
                share: 0.1,
                samples: 1,
            })
            .collect();
    }
    let (primary, findings) = crate::diagnosis::diagnose(&s);
    s.primary_diagnosis = primary;
    s.findings = findings;
    s.data_quality.notes = names.clone();
    s.data_quality.cuda_libraries = names.iter().map(|n| format!("/lib/{n}")).collect();
    s.data_quality.probes_failed = names
        .iter()
        .map(|n| ProbeFailed {
            probe: n.clone(),
            file: n.clone(),
            reason: n.clone(),
        })
        .collect();
    s.target.identity = Some(crate::event::Identity {
        user: Some(names[0].clone()),
        pod_name: Some(names[5].clone()),
        pod_namespace: Some(names[1].clone()),
        container_runtime: Some("docker".into()),
        container_id: Some(names[9].clone()),
        ..Default::default()
    });
    if let Some(g) = s.gpu.as_mut() {
        for d in &mut g.devices {
            d.name = Some(names[1].clone());
        }
    }
    s
}

fn card(s: &Summary, color: bool) -> String {
    let mut v = Vec::new();
    render_card(s, &mut v, color).unwrap();
    String::from_utf8(v).unwrap()
}

/// `text` without the painter's own sequences (`ESC [ digits/; m`).
fn unpaint(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("\x1b[") {
        out.push_str(&rest[..i]);
        let tail = &rest[i + 2..];
        let n = tail
            .find(|c: char| !(c.is_ascii_digit() || c == ';'))
            .unwrap_or(tail.len());
        assert!(
            tail[n..].starts_with('m'),
            "an escape sequence the painter does not write: {:?}",
            &rest[i..(i + 20).min(rest.len())]
        );
        rest = &tail[n + 1..];
    }
    out.push_str(rest);
    out
}

fn check_lines(text: &str) {
    assert_terminal_safe(text);
    for line in text.lines() {
        let columns = crate::text::width(line);
        assert!(columns <= WIDTH, "{columns} columns: {line:.120}");
    }
}

#[test]
fn card_shows_hostile_names_escaped_within_the_width() {
    let s = hostile_summary();
    assert_eq!(s.primary_diagnosis.kind, DiagnosisKind::ResidualHeavy);
    let text = card(&s, false);
    assert!(!text.contains('\x1b'), "an ESC byte without color");
    check_lines(&text);
    // The names are there, recognisable, and harmless.
    assert!(text.contains("\\x1b[2J"), "{text}");
    assert!(text.contains("\\x1b]0;pwned title\\x07"), "{text}");
    assert!(text.contains("<script>alert(1)</script>"), "{text}");
    assert!(
        text.contains("chars]"),
        "a cut marker on the long name:\n{text}"
    );
    assert!(
        text.contains("user \\x1b[2J"),
        "the identity, escaped:\n{text}"
    );
    // With color, the only escape sequences are the painter's, and the layout is the same.
    let colored = card(&s, true);
    let plain = unpaint(&colored);
    assert_eq!(plain, text);
}

#[test]
fn json_of_hostile_names_is_valid_and_holds_no_control_byte() {
    let mut s = hostile_summary();
    // A 16 MB name survives the round trip intact (the readers bound names; JSON need not).
    s.target.cmdline.push("\x1b".repeat(16 << 20));
    let json = to_json(&s);
    assert!(
        !json.bytes().any(|b| b < 0x20 && b != b'\n'),
        "a raw control byte in the JSON"
    );
    let back = Summary::from_json(&json).unwrap();
    assert_eq!(back.target.cmdline, s.target.cmdline);
    assert_eq!(back.primary_diagnosis.why, s.primary_diagnosis.why);
    assert_eq!(
        back.phases[Phase::Residual].top_functions,
        s.phases[Phase::Residual].top_functions
    );
}

#[test]
fn comparison_of_hostile_runs_is_escaped() {
    let s = hostile_summary();
    let cmp = crate::compare::compare(&s, &s);
    for color in [false, true] {
        let mut v = Vec::new();
        render_compare(&cmp, &mut v, color).unwrap();
        let text = unpaint(&String::from_utf8(v).unwrap());
        check_lines(&text);
        assert!(text.contains("\\x1b[2J"), "{text}");
    }
    let mut v = Vec::new();
    render_compare_json(&cmp, &mut v).unwrap();
    assert!(!v.iter().any(|&b| b < 0x20 && b != b'\n'));
}

#[test]
fn html_report_of_hostile_names_is_escaped() {
    let h = to_html(&hostile_summary());
    // Every name is text of the page: no element, no raw control or bidi character.
    for bad in [
        "<script", "<img", "\x1b", "\u{9b}", "\u{202e}", "\0", "\r", "\t",
    ] {
        assert!(!h.contains(bad), "{bad:?} in the report");
    }
    assert_terminal_safe(&h.replace("\n", ""));
    assert!(h.contains("&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;"));
    assert!(h.contains("&quot;quote&quot; back\\slash &#39;single&#39;"));
    assert!(h.contains("\\x1b[2J"), "escapes written visibly");
    assert!(h.contains("rtl\\u{202e}gnp.exe"));
}

/// The CODE table keeps an escaped file name whole and shortens the function instead (the root
/// test, tests/hostile.rs, finds the workload's file and function on the card): the OSC 8 link
/// and bidi override of tests/workloads/hostile.py's file, its 16 MB qualname as the reader
/// bounds it.
#[test]
fn code_table_keeps_a_hostile_file_whole() {
    let mut s = testkit::summary(&testkit::input_bound());
    let huge = format!("\x1b]0;title\x07{}", "Q".repeat(1 << 20));
    s.phases.residual.top_functions = vec![TopFunction {
        function: crate::sanitize::bounded(&huge, crate::sanitize::NAME_MAX).into_owned(),
        file: "\x1b]8;;http://evil/\x1b\\link\x1b]8;;\x1b\\/evil\u{202e}yp.py".into(),
        line: 1,
        share: 1.0,
        samples: 40,
    }];
    for width in [WIDTH, MIN_WIDTH] {
        let mut v = Vec::new();
        render_card_width(&s, &mut v, false, width).unwrap();
        let text = String::from_utf8(v).unwrap();
        assert_terminal_safe(&text);
        assert!(lines_wider_than(&text, width).is_empty(), "{text}");
        let row = text
            .lines()
            .find(|l| l.starts_with("           100%  "))
            .unwrap_or_else(|| panic!("no CODE row:\n{text}"));
        assert!(
            row.contains("\\x1b\\link\\x1b]8;;\\x1b\\/evil\\u{202e}yp.py:\\x1b]0;tit"),
            "{row}"
        );
        // At 100 columns (final_summary.txt) the function's start as the root test reads it.
        assert!(
            width < WIDTH || row.contains(":\\x1b]0;title\\x07QQQ"),
            "{row}"
        );
        assert!(row.ends_with(" bytes]"), "the cut marker at the end: {row}");
    }
}
