//! Streaming detokenization with the prefix/read-offset method of TGI and vLLM.
//!
//! Decoding one token at a time is wrong twice over: byte-level BPE splits multi-byte
//! characters across tokens, and SentencePiece decoders strip the leading space of the first
//! token they see. So we always decode a window `ids[prefix_offset..]` that starts a few tokens
//! back, and emit only what it adds over `ids[prefix_offset..read_offset]`.

use crate::error::Result;
use crate::tokenizer::Tokenizer;

/// How many prompt tokens [`IncrementalDetokenizer::with_prompt_tail`] keeps as left context
/// (the value vLLM uses).
const PROMPT_CONTEXT_TOKENS: usize = 5;

/// Turns a stream of generated ids into text deltas.
#[derive(Debug, Clone)]
pub struct IncrementalDetokenizer {
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
    skip_special_tokens: bool,
    text: String,
}

impl IncrementalDetokenizer {
    pub fn new(skip_special_tokens: bool) -> Self {
        Self {
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
            skip_special_tokens,
            text: String::new(),
        }
    }

    /// Starts from the last few prompt tokens so that the first generated token is decoded in
    /// context (its leading space survives with SentencePiece). Prompt text is never emitted.
    pub fn with_prompt_tail(
        prompt_ids: &[u32],
        tok: &Tokenizer,
        skip_special_tokens: bool,
    ) -> Self {
        let mut ids: Vec<u32> = prompt_ids
            .iter()
            .copied()
            .filter(|&id| !(skip_special_tokens && tok.is_special(id)))
            .collect();
        let start = ids.len().saturating_sub(PROMPT_CONTEXT_TOKENS);
        ids.drain(..start);
        let read_offset = ids.len();
        Self {
            ids,
            prefix_offset: 0,
            read_offset,
            skip_special_tokens,
            text: String::new(),
        }
    }

    /// Adds one generated id; returns the text it completes ("" while a character is
    /// still incomplete, or for a skipped special token).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String> {
        if self.skip_special_tokens && tok.is_special(id) {
            return Ok(String::new());
        }
        self.ids.push(id);
        let prefix_text = self.decode(tok, self.prefix_offset..self.read_offset)?;
        let new_text = self.decode(tok, self.prefix_offset..self.ids.len())?;
        if new_text.len() > prefix_text.len() && !new_text.ends_with('\u{FFFD}') {
            // `get` rather than indexing: a window that does not extend its prefix
            // (possible only with odd decoders) waits instead of panicking.
            if let Some(delta) = new_text.get(prefix_text.len()..) {
                let delta = delta.to_owned();
                self.prefix_offset = self.read_offset;
                self.read_offset = self.ids.len();
                self.text.push_str(&delta);
                return Ok(delta);
            }
        }
        Ok(String::new())
    }

    /// Emits whatever is still held back, even an incomplete character (as U+FFFD),
    /// so that all deltas together equal `decode(all ids)`.
    pub fn flush(&mut self, tok: &Tokenizer) -> Result<String> {
        if self.read_offset == self.ids.len() {
            return Ok(String::new());
        }
        let prefix_text = self.decode(tok, self.prefix_offset..self.read_offset)?;
        let new_text = self.decode(tok, self.prefix_offset..self.ids.len())?;
        let delta = match new_text.strip_prefix(prefix_text.as_str()) {
            Some(rest) => rest.to_owned(),
            // Fall back to the longest common char-aligned prefix so that nothing is lost.
            None => {
                let common = common_prefix_len(&prefix_text, &new_text);
                new_text[common..].to_owned()
            }
        };
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        self.text.push_str(&delta);
        Ok(delta)
    }

    /// All text emitted so far (excluding any prompt context).
    pub fn text_so_far(&self) -> &str {
        &self.text
    }

    /// Ids pushed so far (including prompt context, excluding skipped specials).
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    fn decode(&self, tok: &Tokenizer, range: std::ops::Range<usize>) -> Result<String> {
        tok.decode(&self.ids[range], self.skip_special_tokens)
    }
}

fn common_prefix_len(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .find(|((_, ca), cb)| ca != cb)
        .map_or_else(|| a.len().min(b.len()), |((i, _), _)| i)
}

#[cfg(test)]
mod tests {
    use super::common_prefix_len;

    #[test]
    fn common_prefix_is_char_aligned() {
        assert_eq!(common_prefix_len("ab€", "ab€x"), 5);
        assert_eq!(common_prefix_len("a€", "a£"), 1);
        assert_eq!(common_prefix_len("", "x"), 0);
    }
}
