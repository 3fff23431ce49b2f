//! Stop strings matched on the detokenized output across token boundaries.
//!
//! Text that could be the beginning of a stop string is held back until it is known not to be
//! one, so a streaming client never receives text that the final output then cuts.

#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    include_stop: bool,
    max_len: usize,
    text: String,
    emitted: usize,
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

impl StopMatcher {
    pub fn new(stops: &[String], include_stop: bool) -> Self {
        let stops: Vec<String> = stops.iter().filter(|s| !s.is_empty()).cloned().collect();
        let max_len = stops.iter().map(|s| s.len()).max().unwrap_or(0);
        StopMatcher {
            stops,
            include_stop,
            max_len,
            text: String::new(),
            emitted: 0,
        }
    }

    /// Appends a decoded delta. Returns the text that is safe to emit now, and whether a stop
    /// string matched (the output then ends there).
    pub fn push(&mut self, delta: &str) -> (String, bool) {
        if self.stops.is_empty() {
            self.text.push_str(delta);
            self.emitted = self.text.len();
            return (delta.to_string(), false);
        }
        let old_len = self.text.len();
        self.text.push_str(delta);
        // A new match must end inside the delta, so it starts at most max_len-1 bytes earlier.
        let from = floor_boundary(&self.text, old_len.saturating_sub(self.max_len - 1));
        let hit = self
            .stops
            .iter()
            .filter_map(|s| {
                self.text[from..]
                    .find(s.as_str())
                    .map(|p| (from + p, s.len()))
            })
            .min();
        if let Some((pos, len)) = hit {
            let end = if self.include_stop { pos + len } else { pos };
            self.text.truncate(end);
            let start = self.emitted.min(end);
            self.emitted = end;
            return (self.text[start..end].to_string(), true);
        }
        let safe_end = self.text.len() - self.held_suffix_len();
        let start = self.emitted.min(safe_end);
        let out = self.text[start..safe_end.max(start)].to_string();
        self.emitted = self.emitted.max(safe_end);
        (out, false)
    }

    /// Length of the longest suffix of the text that is a proper prefix of a stop string.
    fn held_suffix_len(&self) -> usize {
        let n = self.text.len();
        let lo = n.saturating_sub(self.max_len - 1);
        (lo..n)
            .filter(|&i| self.text.is_char_boundary(i))
            .find(|&i| {
                let tail = &self.text[i..];
                self.stops
                    .iter()
                    .any(|s| s.len() > tail.len() && s.starts_with(tail))
            })
            .map_or(0, |i| n - i)
    }

    /// Releases the held-back text when generation ends for another reason.
    pub fn finish(&mut self) -> String {
        let start = self.emitted.min(self.text.len());
        self.emitted = self.text.len();
        self.text[start..].to_string()
    }

    pub fn text(&self) -> &str {
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], include: bool, deltas: &[&str]) -> (Vec<String>, bool, String) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops, include);
        let mut out = vec![];
        for d in deltas {
            let (t, hit) = m.push(d);
            out.push(t);
            if hit {
                return (out, true, m.text().to_string());
            }
        }
        out.push(m.finish());
        (out, false, m.text().to_string())
    }

    #[test]
    fn matches_across_token_boundaries_and_cuts() {
        let (out, hit, text) = run(
            &["\n\nUser:"],
            false,
            &["Hi", " there", "\n", "\nUs", "er:", " more"],
        );
        assert!(hit);
        assert_eq!(text, "Hi there");
        assert_eq!(out.concat(), "Hi there");
        // "\n" was held back rather than emitted.
        assert_eq!(out[2], "");
    }

    #[test]
    fn include_stop_str_keeps_it() {
        let (out, hit, text) = run(&["END"], true, &["a E", "N", "D b"]);
        assert!(hit);
        assert_eq!(text, "a END");
        assert_eq!(out.concat(), "a END");
    }

    #[test]
    fn held_text_is_released_when_no_stop_follows() {
        let (out, hit, text) = run(&["abc"], false, &["xa", "b", "d"]);
        assert!(!hit);
        assert_eq!(out, vec!["x", "", "abd", ""]);
        assert_eq!(text, "xabd");
        let (out, _, _) = run(&["abc"], false, &["xab"]);
        assert_eq!(out.concat(), "xab", "finish releases the held tail");
    }

    #[test]
    fn earliest_of_several_stops_wins_and_unicode_is_safe() {
        let (_, hit, text) = run(&["é!", "b"], false, &["aé", "!b"]);
        assert!(hit);
        assert_eq!(text, "a");
        let (out, hit, _) = run(&["日本"], false, &["x日", "x"]);
        assert!(!hit);
        assert_eq!(out.concat(), "x日x");
    }
}
