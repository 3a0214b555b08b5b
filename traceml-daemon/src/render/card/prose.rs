//! The card's prose, item by item: a clause a line where a paragraph would run on, and the check
//! that no item of it runs past two lines (issue 56: a reader scans items, not paragraphs).
use super::LABEL;

/// `text` split at each "; " outside parentheses, the parts trimmed, empty ones dropped.
pub(super) fn clauses(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    let bytes = text.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'(' => depth += 1,
            b')' => depth -= 1,
            b';' if depth <= 0 && bytes.get(i + 1) == Some(&b' ') => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&text[start..]);
    out.into_iter()
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

/// The card's prose items that take more than `max` lines, with their line counts: an item is
/// a labelled line (a label in the label column, text after it) or a "· " item under one, with
/// the lines wrapped under it. THREAD's and CODE's tables are no prose and are left out. The
/// card's tests, unit and on recorded and scenario runs, check with it.
pub fn prose_longer_than(card: &str, max: usize) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    // The item being counted: its first line, its lines, the indent of its wrapped lines.
    let mut item: Option<(String, usize, usize)> = None;
    let mut table = false;
    let mut close = |item: &mut Option<(String, usize, usize)>| {
        if let Some((first, n, _)) = item.take()
            && n > max
        {
            out.push((first, n));
        }
    };
    for line in card.lines() {
        let lead = line.len() - line.trim_start_matches(' ').len();
        let labelled = lead == 0 && !line.is_empty();
        // A "· " item under a label (10 columns) or under a wide one (DATA QUALITY's 14).
        let bullet = lead >= LABEL && line.trim_start().starts_with("· ");
        if labelled {
            close(&mut item);
            table = line.starts_with("THREAD") || line.starts_with("CODE");
            item = (!table).then(|| (line.to_owned(), 1, LABEL));
        } else if table && lead >= LABEL {
            continue;
        } else if bullet {
            close(&mut item);
            item = Some((line.to_owned(), 1, lead + 2));
        } else if let Some((_, n, _)) = item.as_mut().filter(|i| lead >= i.2) {
            *n += 1;
        } else if lead >= LABEL && !line.trim().is_empty() {
            // An item of its own under the label column (a second what-if).
            close(&mut item);
            item = Some((line.to_owned(), 1, lead));
        } else {
            close(&mut item);
            table = false;
        }
    }
    close(&mut item);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clauses_split_outside_parentheses() {
        assert_eq!(clauses("a (x; y); b;c; "), vec!["a (x; y)", "b;c"]);
    }

    #[test]
    fn items_are_counted_tables_aside() {
        let card = "Why       one\n          two\n          · three\n            four\n            \
                    five\n          six\n          seven\nTHREAD    t\n          x\n          y\n  \
                    z\nCUDA      c\n";
        assert_eq!(
            prose_longer_than(card, 2),
            vec![("          · three".to_owned(), 3)]
        );
        assert!(prose_longer_than(card, 3).is_empty());
    }
}
