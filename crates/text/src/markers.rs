//! Finding markers (tags, special tokens' texts) in text that arrives in deltas: what the
//! reasoning splitter, the harmony parser and the tool-call parser share.

/// The earliest of `markers` in `text`: its byte offset and which one (the first listed wins
/// a tie at one offset).
pub(crate) fn first<'m>(text: &str, markers: &[&'m str]) -> Option<(usize, &'m str)> {
    markers
        .iter()
        .filter_map(|&m| text.find(m).map(|at| (at, m)))
        .min_by_key(|&(at, _)| at)
}

/// The length of the longest suffix of `text` that is a proper prefix of one of `markers`:
/// text the next delta may complete into a marker, held back until it does or does not (on a
/// char boundary).
pub(crate) fn held_back(text: &str, markers: &[&str]) -> usize {
    markers
        .iter()
        .filter_map(|m| {
            (1..m.len().min(text.len() + 1))
                .rev()
                .find(|&n| text.is_char_boundary(text.len() - n) && text.ends_with(&m[..n]))
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_marker_and_partial_ends() {
        assert_eq!(first("a <b> <c>", &["<c>", "<b>"]), Some((2, "<b>")));
        assert_eq!(first("abc", &["<b>"]), None);
        assert_eq!(held_back("text <|ch", &["<|channel|>", "<|start|>"]), 4);
        assert_eq!(held_back("text <", &["</think>"]), 1);
        // A whole marker is not "partial"; text that cannot begin one is not held.
        assert_eq!(held_back("a</think>", &["</think>"]), 0);
        assert_eq!(held_back("a <x", &["<|end|>"]), 0);
        assert_eq!(held_back("é", &["\u{e9}x"]), 2);
    }
}
