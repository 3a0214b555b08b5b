//! The JSON writer: pretty JSON with arrays of numbers (and nulls) kept on one line and
//! fractional numbers rounded, for `final_summary.json` and `compare --format json`.
//!
//! Both are done while serialising, by a [`serde_json::ser::Formatter`] around serde_json's own
//! [`PrettyFormatter`]: it rounds each `f64` as it is written and holds back the elements of an
//! array for as long as they are all numbers or nulls, so it can write them on one line.
use std::io::{self, Write};

use serde::Serialize;
use serde_json::ser::{CharEscape, Formatter, PrettyFormatter};

/// Writes pretty JSON with arrays of numbers (and nulls) on one line, then a newline.
///
/// Fractional numbers are rounded (4 decimals from 1 up, 6 significant digits below) so the file
/// shows no float noise and reads back to the same text. Nothing is written when `value` cannot
/// be serialised.
pub fn render_json<T: Serialize>(value: &T, w: &mut impl Write) -> io::Result<()> {
    let mut out = Vec::with_capacity(16 * 1024);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, SummaryFormatter::default());
    value.serialize(&mut ser).map_err(io::Error::other)?;
    out.push(b'\n');
    w.write_all(&out)
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

/// serde_json's pretty layout (two-space indent) with the numbers of a value rounded
/// ([`round_number`]; map keys are left as they are) and every non-empty array whose elements
/// are all numbers or nulls on one line (`[1,2.5,null]`).
#[derive(Default)]
struct SummaryFormatter {
    pretty: PrettyFormatter<'static>,
    /// The innermost open array while every element so far is a number or null: the text of
    /// each element (the last one may be in progress). `None` once it holds anything else, and
    /// inside objects.
    held: Option<Vec<Vec<u8>>>,
    /// Writing a map key (serde_json writes number keys as strings through `write_*`).
    in_key: bool,
}

impl SummaryFormatter {
    /// An element that is not a number or null starts in the held array: writes the elements
    /// held so far the pretty way, one a line, and opens the current one the same way.
    fn release<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        let Some(items) = self.held.take() else {
            return Ok(());
        };
        let current = items.len() - 1;
        for (i, text) in items.iter().enumerate() {
            self.pretty.begin_array_value(w, i == 0)?;
            if i < current {
                w.write_all(text)?;
                self.pretty.end_array_value(w)?;
            }
        }
        Ok(())
    }
}

/// A number writer: into the held element when an array is held, else straight through.
macro_rules! numbers {
    ($($name:ident: $t:ty),* $(,)?) => {$(
        fn $name<W: ?Sized + Write>(&mut self, w: &mut W, value: $t) -> io::Result<()> {
            match self.held.as_mut().and_then(|items| items.last_mut()) {
                Some(item) => self.pretty.$name(item, value),
                None => self.pretty.$name(w, value),
            }
        }
    )*};
}

/// A writer of something that is not a number or null: the held array is released first.
macro_rules! others {
    ($($name:ident $(($arg:ident: $t:ty))?),* $(,)?) => {$(
        fn $name<W: ?Sized + Write>(&mut self, w: &mut W $(, $arg: $t)?) -> io::Result<()> {
            self.release(w)?;
            self.pretty.$name(w $(, $arg)?)
        }
    )*};
}

impl Formatter for SummaryFormatter {
    numbers!(
        write_i8: i8,
        write_i16: i16,
        write_i32: i32,
        write_i64: i64,
        write_i128: i128,
        write_u8: u8,
        write_u16: u16,
        write_u32: u32,
        write_u64: u64,
        write_u128: u128,
        write_number_str: &str,
    );

    others!(
        write_bool(value: bool),
        begin_string,
        end_string,
        write_string_fragment(fragment: &str),
        write_char_escape(char_escape: CharEscape),
        write_raw_fragment(fragment: &str),
        begin_object,
        end_object,
        begin_object_value,
        end_object_value,
    );

    fn write_null<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        match self.held.as_mut().and_then(|items| items.last_mut()) {
            Some(item) => self.pretty.write_null(item),
            None => self.pretty.write_null(w),
        }
    }

    fn write_f64<W: ?Sized + Write>(&mut self, w: &mut W, value: f64) -> io::Result<()> {
        let value = if self.in_key {
            value
        } else {
            round_number(value)
        };
        match self.held.as_mut().and_then(|items| items.last_mut()) {
            Some(item) => self.pretty.write_f64(item, value),
            None => self.pretty.write_f64(w, value),
        }
    }

    fn write_f32<W: ?Sized + Write>(&mut self, w: &mut W, value: f32) -> io::Result<()> {
        if self.in_key {
            return self.pretty.write_f32(w, value);
        }
        // Widened through its shortest decimal, so 0.1f32 rounds as 0.1.
        let wide = value.to_string().parse().unwrap_or(f64::from(value));
        self.write_f64(w, wide)
    }

    fn begin_array<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.release(w)?;
        self.held = Some(Vec::new());
        self.pretty.begin_array(w)
    }

    fn begin_array_value<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        match self.held.as_mut() {
            Some(items) => {
                items.push(Vec::new());
                Ok(())
            }
            None => self.pretty.begin_array_value(w, first),
        }
    }

    fn end_array_value<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        match self.held {
            Some(_) => Ok(()),
            None => self.pretty.end_array_value(w),
        }
    }

    fn end_array<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        // Still held: numbers and nulls only, on one line. The pretty formatter saw no element,
        // so it closes with a bare `]`.
        if let Some(items) = self.held.take() {
            w.write_all(&items.join(&b","[..]))?;
        }
        self.pretty.end_array(w)
    }

    fn begin_object_key<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.in_key = true;
        self.pretty.begin_object_key(w, first)
    }

    fn end_object_key<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.in_key = false;
        self.pretty.end_object_key(w)
    }
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
    use serde_json::json;

    #[test]
    fn rounding_touches_numbers_only() {
        let v = json!({
            "a": 1.23456789,
            "b": 0.000123456789,
            "c": "x\": 1.23456789",
            "d": 12345678901u64,
            "e": 2.0,
            "f": 1.234567e-9,
            "g": -2.71234567,
        });
        assert_eq!(
            to_json(&v),
            "{\n  \"a\": 1.2346,\n  \"b\": 0.000123457,\n  \"c\": \"x\\\": 1.23456789\",\n  \
             \"d\": 12345678901,\n  \"e\": 2.0,\n  \"f\": 1.23457e-9,\n  \"g\": -2.7123\n}\n"
        );
    }

    #[test]
    fn number_keys_are_not_rounded() {
        struct FloatKey;
        impl Serialize for FloatKey {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeMap;
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry(&0.123456789f64, &0.123456789f64)?;
                m.end()
            }
        }
        assert_eq!(to_json(&FloatKey), "{\n  \"0.123456789\": 0.123457\n}\n");
    }

    #[test]
    fn arrays_of_numbers_and_nulls_on_one_line() {
        let v = json!({
            "a": [1, 2.5, null],
            "b": ["x", "1"],
            "c": [{"d": [0.1234567, 2]}],
            "e": [],
            "f": [1, "x", 2],
            "g": [[1, 2], [3.0]],
            "h": [true, 1],
            "i": [null],
        });
        let out = to_json(&v);
        assert_eq!(
            out,
            r#"{
  "a": [1,2.5,null],
  "b": [
    "x",
    "1"
  ],
  "c": [
    {
      "d": [0.123457,2]
    }
  ],
  "e": [],
  "f": [
    1,
    "x",
    2
  ],
  "g": [
    [1,2],
    [3.0]
  ],
  "h": [
    true,
    1
  ],
  "i": [null]
}
"#
        );
        let back: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(back["b"], v["b"]);
        assert_eq!(back["g"], v["g"]);
    }

    #[test]
    fn a_top_level_array_of_numbers() {
        assert_eq!(to_json(&[0.5f64, 1.0]), "[0.5,1.0]\n");
        assert_eq!(to_json(&[0.1f32]), "[0.1]\n");
        assert_eq!(to_json(&Vec::<u8>::new()), "[]\n");
    }
}
