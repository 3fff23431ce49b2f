//! Pair encodings (a cross-encoder's query and document) and truncation that keeps the
//! special tokens, as the HF tokenizer's own truncation does (TEI truncates through it):
//! the text is cut, then the post-processor adds `[CLS]` / `[SEP]` (or `<s>` / `</s>`, or a
//! decoder's appended EOS). Pairs are cut longest first.

use tokenizers::tokenizer::PostProcessor;
use tokenizers::utils::truncation::{
    TruncationDirection, TruncationParams, TruncationStrategy, truncate_encodings,
};
use tokenizers::{Encoding, InputSequence};

use super::Tokenizer;
use crate::error::{Result, TextError};

/// Which end of an input truncation cuts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TruncationSide {
    /// Keep the first tokens (TEI's default `truncation_direction: "Right"`).
    Right,
    /// Keep the last tokens.
    Left,
}

/// Cut an input to at most `max_tokens` tokens, special tokens included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncate {
    pub max_tokens: usize,
    pub side: TruncationSide,
}

fn err(what: &str, e: impl std::fmt::Display) -> TextError {
    TextError::Tokenizer(format!("{what}: {e}"))
}

/// The index of the first token of type 1 (the second segment), if any.
fn segment_b(enc: &Encoding) -> Option<usize> {
    enc.get_type_ids().iter().position(|&t| t == 1)
}

impl Tokenizer {
    /// Encodes a pair (query, document) as the tokenizer's post-processor joins them
    /// (`[CLS] a [SEP] b [SEP]`, `<s> a </s></s> b </s>`), and where the second segment starts
    /// when its tokens take token type 1 (BERT; None where every token is type 0, as in
    /// XLM-RoBERTa).
    pub fn encode_pair(
        &self,
        a: &str,
        b: &str,
        add_special_tokens: bool,
    ) -> Result<(Vec<u32>, Option<usize>)> {
        let enc = self
            .inner
            .hf
            .encode((a, b), add_special_tokens)
            .map_err(|e| err("encode pair", e))?;
        Ok((enc.get_ids().to_vec(), segment_b(&enc)))
    }

    /// Special tokens the post-processor adds to one input (`pair`: to a pair).
    pub fn num_special_tokens(&self, pair: bool) -> usize {
        self.inner
            .hf
            .get_post_processor()
            .map_or(0, |p| p.added_tokens(pair))
    }

    /// [`Tokenizer::encode`], cut to `t.max_tokens` tokens with the special tokens kept.
    pub fn encode_truncated(
        &self,
        text: &str,
        add_special_tokens: bool,
        t: Truncate,
    ) -> Result<Vec<u32>> {
        let ids = self.encode(text, add_special_tokens)?;
        if ids.len() <= t.max_tokens {
            return Ok(ids);
        }
        // transformers' add_bos_token may put a BOS before what the post-processor adds
        // (`encode`): one more token to make room for when it does.
        for reserved in [0, 1] {
            let enc = self.cut(text, None, add_special_tokens, t, reserved)?;
            let mut ids = enc.get_ids().to_vec();
            self.add_bos(&mut ids, add_special_tokens);
            if ids.len() <= t.max_tokens {
                return Ok(ids);
            }
        }
        Err(self.too_short(t))
    }

    /// [`Tokenizer::encode_pair`], cut to `t.max_tokens` tokens with the special tokens
    /// kept, the longer segment first (the HF tokenizer's `longest_first`).
    pub fn encode_pair_truncated(
        &self,
        a: &str,
        b: &str,
        add_special_tokens: bool,
        t: Truncate,
    ) -> Result<(Vec<u32>, Option<usize>)> {
        let enc = self.cut(a, Some(b), add_special_tokens, t, 0)?;
        if enc.len() > t.max_tokens {
            return Err(self.too_short(t));
        }
        Ok((enc.get_ids().to_vec(), segment_b(&enc)))
    }

    fn too_short(&self, t: Truncate) -> TextError {
        TextError::Tokenizer(format!(
            "cannot truncate to {} tokens: the special tokens alone take more",
            t.max_tokens
        ))
    }

    /// Encodes the segments without special tokens (the second with token type 1, as the
    /// tokenizer encodes a pair's second sequence), cuts them so that they, the special
    /// tokens and `reserved` more fit `t.max_tokens`, and post-processes them.
    fn cut(
        &self,
        a: &str,
        b: Option<&str>,
        add_special_tokens: bool,
        t: Truncate,
        reserved: usize,
    ) -> Result<Encoding> {
        let hf = &self.inner.hf;
        let one = |text: &str| {
            hf.encode(InputSequence::from(text), false)
                .map_err(|e| err("encode", e))
        };
        let first = one(a)?;
        let second = match b {
            Some(b) => {
                let mut e = one(b)?;
                e.set_type_ids(vec![1; e.len()]);
                Some(e)
            }
            None => None,
        };
        let specials = match add_special_tokens {
            true => self.num_special_tokens(second.is_some()),
            false => 0,
        };
        let params = TruncationParams {
            max_length: t.max_tokens.saturating_sub(specials + reserved),
            strategy: TruncationStrategy::LongestFirst,
            direction: match t.side {
                TruncationSide::Right => TruncationDirection::Right,
                TruncationSide::Left => TruncationDirection::Left,
            },
            stride: 0,
        };
        let (first, second) =
            truncate_encodings(first, second, &params).map_err(|e| err("truncate", e))?;
        hf.post_process(first, second, add_special_tokens)
            .map_err(|e| err("post-process", e))
    }
}
