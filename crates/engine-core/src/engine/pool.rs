//! A decoder's pooled sequences (Qwen3-Embedding, Qwen3-Reranker): each pool chunk is a whole
//! sequence whose last token's final-normed hidden state the step returns, through the
//! model's host head. Their rows ride at the end of the step's logits rows, past every row
//! whose logits are wanted, so the LM head reads only the rows before them
//! ([`crate::model::Model::forward_pooled`]).

use crate::batch::{BatchLayout, LogitsWanted};
use crate::error::{EngineError, Result};
use crate::pooler::HostHead;
use crate::step::StepBatch;

/// Checks `batch`'s pool requests and moves their chunks' last tokens to the end of
/// `layout.logits_rows` (their chunks then count no logits rows of their own). Returns how
/// many rows it appended.
pub(crate) fn layout_pools(
    batch: &StepBatch<'_>,
    layout: &mut BatchLayout,
    head: Option<&HostHead>,
) -> Result<usize> {
    if batch.pools.is_empty() {
        return Ok(0);
    }
    if head.is_none() {
        return Err(EngineError::Batch(
            "pool requests for a model without a pooler (serve it with option.task \
             text-embedding or rerank)"
                .into(),
        ));
    }
    let n = batch.chunks.len();
    let mut pooled = vec![false; n];
    for (i, p) in batch.pools.iter().enumerate() {
        let c = batch.chunks.get(p.chunk).ok_or_else(|| {
            EngineError::Batch(format!("pool request {i} names chunk {} of {n}", p.chunk))
        })?;
        if std::mem::replace(&mut pooled[p.chunk], true) {
            return Err(EngineError::Batch(format!(
                "chunk {} has two pool requests",
                p.chunk
            )));
        }
        if c.start_pos != 0 || c.logits == LogitsWanted::All {
            return Err(EngineError::Batch(format!(
                "pool request {i}: chunk {} must hold its whole sequence from position 0 and \
                 want no logits (start {}, logits {:?})",
                p.chunk, c.start_pos, c.logits
            )));
        }
    }
    let sampled = batch.samples.iter().map(|s| s.chunk);
    let scored = batch.prompt_logprobs.iter().map(|p| p.chunk);
    if let Some(k) = sampled
        .chain(scored)
        .find(|&k| pooled.get(k) == Some(&true))
    {
        return Err(EngineError::Batch(format!(
            "chunk {k} is pooled: it has no tokens to draw or score"
        )));
    }
    let mut rows = Vec::with_capacity(layout.logits_rows.len() + batch.pools.len());
    let mut first = 0usize;
    for (s, count) in layout.logits_per_seq.iter_mut().enumerate() {
        let own = &layout.logits_rows[first..first + *count as usize];
        first += *count as usize;
        match pooled[s] {
            true => *count = 0,
            false => rows.extend_from_slice(own),
        }
    }
    rows.extend(
        batch
            .pools
            .iter()
            .map(|p| layout.cu_tokens[p.chunk + 1] - 1),
    );
    layout.logits_rows = rows;
    Ok(batch.pools.len())
}

/// The step's pooled outputs from the final-normed states of every logits row (`states`,
/// `[rows, hidden]`): the last `pools` rows, through `head`.
pub(crate) fn outputs(
    head: &HostHead,
    states: &[f32],
    hidden: usize,
    pools: usize,
) -> Vec<Vec<f32>> {
    let rows = states.len() / hidden.max(1);
    (rows - pools..rows)
        .map(|r| head.apply(states[r * hidden..(r + 1) * hidden].to_vec()))
        .collect()
}
