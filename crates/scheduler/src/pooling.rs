//! Embedding and scoring requests on the scheduler's side: what one waits with, and the
//! submit-time checks. A pooling request is prefill-only: its whole input runs in one step
//! (a bidirectional encoder must see all of it at once), on blocks taken for that step and
//! freed when it ends, never in the prefix cache and never preempted. The step loop's side is
//! `scheduler/pooling.rs`.

use std::time::Instant;

use lmi_engine_core::BLOCK_SIZE;
use tokio::sync::mpsc::Sender;

use crate::error::SubmitError;
use crate::event::Event;
use crate::kv_manager::{SeqBlocks, blocks_for};
use crate::request::PoolingRequest;
use crate::scheduler::SchedulerConfig;
use crate::sequence::RequestId;

/// A pooling request waiting for its step, or running in it.
pub(crate) struct PoolEntry {
    pub id: RequestId,
    /// Admission order, shared with generation requests (first come, first served).
    pub arrival: u64,
    pub req: PoolingRequest,
    pub tx: Sender<Event>,
    pub submitted: Instant,
    pub scheduled: Option<Instant>,
    /// The blocks of its step (empty while it waits).
    pub kv: SeqBlocks,
}

/// Whether `req` can ever run: a model with a pooler, a non-empty input of known token ids,
/// a second segment inside it, and an input that fits one step's token budget, the model's
/// length and (`kv_blocks`: the blocks it may ever use; None for an engine that keeps no KV
/// cache) the KV pool.
pub(crate) fn check_pooling(
    req: &PoolingRequest,
    cfg: &SchedulerConfig,
    kv_blocks: Option<usize>,
    vocab_size: usize,
    has_pooler: bool,
) -> Result<(), SubmitError> {
    if !has_pooler {
        return Err(SubmitError::InvalidParams(
            "this model has no pooler: it generates text; embeddings and scores need an \
             embedding or scoring model (option.task=text-embedding or rerank)"
                .into(),
        ));
    }
    let n = req.tokens.len();
    if n == 0 {
        return Err(SubmitError::EmptyPrompt);
    }
    if let Some(t) = req.tokens.iter().find(|&&t| t as usize >= vocab_size) {
        return Err(SubmitError::InvalidParams(format!(
            "token id {t} is not in the vocabulary (size {vocab_size})"
        )));
    }
    if let Some(b) = req.segment_b
        && (b == 0 || b >= n)
    {
        return Err(SubmitError::InvalidParams(format!(
            "segment_b {b} is not inside the input of {n} tokens: the second segment starts \
             after the first token and holds at least one"
        )));
    }
    if n > cfg.max_model_len {
        return Err(SubmitError::InputTooLong {
            tokens: n,
            limit: format!("the model's maximum length of {} tokens", cfg.max_model_len),
        });
    }
    if n > cfg.max_batch_tokens {
        return Err(SubmitError::InputTooLong {
            tokens: n,
            limit: format!(
                "the step's token budget of {} tokens (option.max_rolling_batch_prefill_tokens; \
                 an embedding or scoring input runs whole in one step)",
                cfg.max_batch_tokens
            ),
        });
    }
    if let Some(blocks) = kv_blocks
        && blocks_for(n) > blocks
    {
        return Err(SubmitError::InputTooLong {
            tokens: n,
            limit: format!(
                "the KV cache's {blocks} usable blocks ({} tokens; option.kv_cache_bytes)",
                blocks * BLOCK_SIZE
            ),
        });
    }
    Ok(())
}
