//! Turning a pooling request's inputs into token ids: the longest input the server runs and
//! what sets it, truncation or the 4xx naming it, token ids checked against the vocabulary,
//! pair encodings and Qwen3-Reranker's prompt; all on the tokenizer off the async threads.

use lmi_api::error::ApiError;
use lmi_checkpoint::pooling::PoolerInfo;
use lmi_scheduler::PoolingRequest;
use lmi_text::{Tokenizer, Truncate, TruncationSide, qwen3_reranker};

use super::Truncation;
use crate::app::LoadedModel;

/// "the input" for a request with one, "input 3" among several.
#[derive(Clone, Copy)]
pub(super) struct Which(pub usize, pub usize);

impl std::fmt::Display for Which {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.1 {
            1 => f.write_str("the input"),
            _ => write!(f, "input {}", self.0),
        }
    }
}

/// The longest input the server runs, and what sets it: the model's maximum input length,
/// or a lower one of the maximum length, the step's token budget and the KV cache.
#[derive(Debug, Clone)]
pub(super) struct InputLimit {
    tokens: usize,
    what: String,
}

impl InputLimit {
    pub fn of(model: &LoadedModel, p: &PoolerInfo) -> Self {
        let l = model.handle.limits();
        let kv = l.num_blocks * lmi_engine::BLOCK_SIZE;
        let mut limits = vec![
            (
                p.max_input_tokens,
                "the model's maximum input length".to_string(),
            ),
            (
                l.config.max_model_len,
                "the maximum length (option.max_model_len)".to_string(),
            ),
            (
                l.config.max_batch_tokens,
                "the step's token budget (option.max_rolling_batch_prefill_tokens)".to_string(),
            ),
        ];
        if kv > 0 {
            limits.push((kv, "the KV cache (option.kv_cache_bytes)".to_string()));
        }
        // The first of the smallest: the model's own limit when it binds.
        let (tokens, what) = limits
            .into_iter()
            .reduce(|a, b| if b.0 < a.0 { b } else { a })
            .unwrap_or((p.max_input_tokens, String::new()));
        InputLimit { tokens, what }
    }

    fn too_long(&self, at: Which, len: usize) -> ApiError {
        ApiError::validation(format!(
            "{at} has {len} tokens, more than {} of {} tokens: shorten it or ask for truncation",
            self.what, self.tokens
        ))
    }

    fn truncate(&self, t: Truncation) -> Option<Truncate> {
        let side = match t {
            Truncation::Refuse => return None,
            Truncation::Right => TruncationSide::Right,
            Truncation::Left => TruncationSide::Left,
        };
        Some(Truncate {
            max_tokens: self.tokens,
            side,
        })
    }

    /// `text` with the tokenizer's special tokens (a decoder embedder's appended EOS too),
    /// cut or refused beyond the limit.
    pub fn encode(
        &self,
        tok: &Tokenizer,
        text: &str,
        t: Truncation,
        at: Which,
    ) -> Result<Vec<u32>, ApiError> {
        let ids = match self.truncate(t) {
            Some(cut) => tok.encode_truncated(text, true, cut),
            None => tok.encode(text, true),
        }
        .map_err(|e| ApiError::validation(format!("{at}: {e}")))?;
        if ids.len() > self.tokens {
            return Err(self.too_long(at, ids.len()));
        }
        Ok(ids)
    }

    /// Token ids as the client sent them (no special tokens added): known to the model, and
    /// cut or refused beyond the limit.
    pub fn cut_ids(
        &self,
        mut ids: Vec<u32>,
        vocab: usize,
        t: Truncation,
        at: Which,
    ) -> Result<Vec<u32>, ApiError> {
        if ids.is_empty() {
            return Err(ApiError::validation(format!(
                "{at} is empty: send at least one token id"
            )));
        }
        if let Some(id) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(ApiError::validation(format!(
                "{at}: token id {id} is not in the model's vocabulary (size {vocab})"
            )));
        }
        if ids.len() > self.tokens {
            match t {
                Truncation::Refuse => return Err(self.too_long(at, ids.len())),
                Truncation::Right => ids.truncate(self.tokens),
                Truncation::Left => {
                    ids.drain(..ids.len() - self.tokens);
                }
            }
        }
        Ok(ids)
    }

    /// A (query, document) pair as the tokenizer joins it, the second segment's start kept
    /// for its token types; cut longest first or refused beyond the limit.
    pub fn encode_pair(
        &self,
        tok: &Tokenizer,
        a: &str,
        b: &str,
        t: Truncation,
        at: Which,
    ) -> Result<PoolingRequest, ApiError> {
        let (tokens, segment_b) = match self.truncate(t) {
            Some(cut) => tok.encode_pair_truncated(a, b, true, cut),
            None => tok.encode_pair(a, b, true),
        }
        .map_err(|e| ApiError::validation(format!("{at}: {e}")))?;
        if tokens.len() > self.tokens {
            return Err(self.too_long(at, tokens.len()));
        }
        Ok(PoolingRequest { tokens, segment_b })
    }

    /// Qwen3-Reranker's prompt for the pair: its body cut (the frame kept) or refused beyond
    /// the limit.
    pub fn encode_qwen3_reranker(
        &self,
        tok: &Tokenizer,
        instruction: Option<&str>,
        query: &str,
        document: &str,
        t: Truncation,
        at: Which,
    ) -> Result<PoolingRequest, ApiError> {
        let tokens = qwen3_reranker::encode(tok, instruction, query, document, self.truncate(t))
            .map_err(|e| ApiError::validation(format!("{at}: {e}")))?
            .ok_or_else(|| {
                ApiError::validation(format!(
                    "{at}: {} of {} tokens leaves no room for the reranker's prompt",
                    self.what, self.tokens
                ))
            })?;
        if tokens.len() > self.tokens {
            return Err(self.too_long(at, tokens.len()));
        }
        Ok(PoolingRequest {
            tokens,
            segment_b: None,
        })
    }
}

/// Runs `f` on the model's tokenizer off the async threads (tokenizing a thousand inputs is
/// milliseconds of CPU).
pub(super) async fn tokenize<T, F>(model: &LoadedModel, f: F) -> Result<T, ApiError>
where
    T: Send + 'static,
    F: FnOnce(&Tokenizer) -> Result<T, ApiError> + Send + 'static,
{
    let tok = model.tokenizer.clone();
    tokio::task::spawn_blocking(move || f(&tok))
        .await
        .map_err(|e| ApiError::internal(format!("tokenizing the inputs: {e}")))?
}
