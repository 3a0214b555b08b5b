//! The JSON writer: pretty JSON with arrays of numbers (and nulls) kept on one line and
//! fractional numbers rounded, for `final_summary.json` and `compare --format json`.
use std::io::{self, Write};

use serde::Serialize;

/// Writes pretty JSON with arrays of numbers (and nulls) on one line, then a newline.
///
/// Fractional numbers are rounded (4 decimals from 1 up, 6 significant digits below) so the file
/// shows no float noise and reads back to the same text.
pub fn render_json<T: Serialize>(value: &T, w: &mut impl Write) -> io::Result<()> {
    let pretty = serde_json::to_string_pretty(value).map_err(io::Error::other)?;
    let rounded: Vec<String> = pretty.lines().map(round_line).collect();
    w.write_all(collapse_number_arrays(&rounded.join("\n")).as_bytes())?;
    w.write_all(b"\n")
}

/// Rounds a fractional number: 4 decimals from 1 up, 6 significant digits below.
fn round_number(x: f64) -> f64 {
    if !x.is_finite() || x == 0.0 {
        x
    } else if x.abs() >= 1.0 {
        (x * 1e4).round() / 1e4
    } else {
        let scale = 10f64.powi(5 - x.abs().log10().floor() as i32);
        (x * scale).round() / scale
    }
}

/// One line of pretty JSON with its number value (a field's or an array element's) rounded.
/// Only fractional numbers change; strings are never touched.
fn round_line(line: &str) -> String {
    let body = line.trim_end_matches(',');
    let comma = &line[body.len()..];
    let trimmed = body.trim_start();
    // `"key": value` (our keys are plain identifiers) or a bare array element.
    let (head, value) = if trimmed.starts_with('"') {
        match body.find("\": ") {
            Some(i) => body.split_at(i + 3),
            None => return line.to_owned(),
        }
    } else {
        body.split_at(body.len() - trimmed.len())
    };
    let fractional = value.contains(['.', 'e', 'E']);
    match value.parse::<f64>() {
        Ok(x) if fractional && x.is_finite() => {
            let r = serde_json::to_string(&round_number(x)).unwrap_or_else(|_| value.to_owned());
            format!("{head}{r}{comma}")
        }
        _ => line.to_owned(),
    }
}

/// Joins the lines of pretty-printed arrays whose elements are all numbers or nulls.
fn collapse_number_arrays(pretty: &str) -> String {
    let lines: Vec<&str> = pretty.lines().collect();
    let scalar = |l: &str| {
        let t = l.trim().trim_end_matches(',');
        t == "null" || (!t.is_empty() && t.parse::<f64>().is_ok())
    };
    let mut out = String::with_capacity(pretty.len());
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if line.ends_with('[') {
            let mut j = i + 1;
            while j < lines.len() && scalar(lines[j]) {
                j += 1;
            }
            let close = lines.get(j).map(|l| l.trim());
            if j > i + 1 && matches!(close, Some("]") | Some("],")) {
                out.push_str(line);
                let items: Vec<&str> = lines[i + 1..j]
                    .iter()
                    .map(|l| l.trim().trim_end_matches(','))
                    .collect();
                out.push_str(&items.join(","));
                out.push_str(close.unwrap_or("]"));
                out.push('\n');
                i = j + 1;
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
        i += 1;
    }
    out.pop();
    out
}

/// [`render_json`] into a string: the text of `final_summary.json`.
pub fn to_json<T: Serialize>(value: &T) -> String {
    let mut out = Vec::new();
    // Writing into a Vec cannot fail.
    let _ = render_json(value, &mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_touches_numbers_only() {
        assert_eq!(round_line("  \"a\": 1.23456789,"), "  \"a\": 1.2346,");
        assert_eq!(round_line("    0.000123456789"), "    0.000123457");
        assert_eq!(
            round_line("  \"s\": \"x\": 1.23456789\","),
            "  \"s\": \"x\": 1.23456789\","
        );
        assert_eq!(round_line("  \"n\": 12345678901,"), "  \"n\": 12345678901,");
        assert_eq!(round_line("  \"f\": 2.0"), "  \"f\": 2.0");
    }

    #[test]
    fn collapse_keeps_strings_and_objects() {
        let v = serde_json::json!({"a": [1, 2.5, null], "b": ["x", "1"], "c": [{"d": 1}], "e": []});
        let out = collapse_number_arrays(&serde_json::to_string_pretty(&v).unwrap());
        assert!(out.contains("\"a\": [1,2.5,null]"), "{out}");
        assert!(out.contains("\"x\",\n"), "{out}");
        let back: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(back, v);
    }
}
