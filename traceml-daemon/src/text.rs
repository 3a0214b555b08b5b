//! Plain-text layout shared by the renderers and the rules' messages: display width (the
//! columns a terminal gives a string, by [`unicode_width`]: two for a CJK character, none for a
//! combining mark), and word wrapping by it.
use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};

/// Columns `s` takes on a terminal.
pub fn width(s: &str) -> usize {
    s.width()
}

/// The longest start of `s` at most `max` columns wide.
pub fn head(s: &str, max: usize) -> &str {
    let mut used = 0;
    for (i, c) in s.char_indices() {
        used += c.width().unwrap_or(0);
        if used > max {
            return &s[..i];
        }
    }
    s
}

/// The longest end of `s` at most `max` columns wide.
pub fn tail(s: &str, max: usize) -> &str {
    let mut used = 0;
    for (i, c) in s.char_indices().rev() {
        used += c.width().unwrap_or(0);
        if used > max {
            return &s[i + c.len_utf8()..];
        }
    }
    s
}

/// Greedy word wrap to `width` columns (a word wider than that gets its own line).
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut cur = String::new();
    for word in text.split_whitespace() {
        let need = self::width(&cur) + usize::from(!cur.is_empty()) + self::width(word);
        if !cur.is_empty() && need > width {
            lines.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(word);
    }
    if !cur.is_empty() || lines.is_empty() {
        lines.push(cur);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_respects_width() {
        assert_eq!(wrap("a bb ccc dddd", 6), vec!["a bb", "ccc", "dddd"]);
        assert_eq!(wrap("", 10), vec![""]);
        assert_eq!(wrap("toolongword x", 4), vec!["toolongword", "x"]);
    }

    #[test]
    fn wrap_counts_columns_not_characters() {
        // Three CJK characters take six columns; "e" + a combining acute takes one.
        assert_eq!(width("数据集"), 6);
        assert_eq!(width("e\u{301}"), 1);
        assert_eq!(wrap("数据集 加载器 x", 8), vec!["数据集", "加载器 x"]);
        assert_eq!(
            wrap("cafe\u{301} cafe\u{301} cafe\u{301}", 9),
            vec!["cafe\u{301} cafe\u{301}", "cafe\u{301}"]
        );
    }

    #[test]
    fn head_and_tail_cut_at_columns() {
        assert_eq!(head("数据集", 3), "数");
        assert_eq!(head("数据集", 4), "数据");
        assert_eq!(tail("数据集", 5), "据集");
        assert_eq!(head("abc", 9), "abc");
        assert_eq!(tail("abc", 2), "bc");
        assert_eq!(head("e\u{301}x", 1), "e\u{301}");
    }
}
