//! A draft model (option.speculative_draft_model): a second, smaller engine with the same
//! vocabulary proposes drafts by decoding greedily ahead of the target, all drafting sequences
//! in one batch per draft token. It keeps its own paged KV cache: each sequence holds blocks of
//! the draft's pool and remembers which draft tokens it fed beyond the confirmed output, so its
//! cache is rolled back to what the target accepted before the next proposal.

use lmi_engine_core::engine::StepEngine;
use lmi_engine_core::sampling::SamplingParams;
use lmi_engine_core::{LogitsWanted, SampleRequest, SeqChunk, StepBatch};

use crate::block_pool::BlockPool;
use crate::kv_manager::blocks_for;

pub(crate) struct DraftModel {
    engine: Box<dyn StepEngine>,
    pool: BlockPool,
}

impl DraftModel {
    pub(crate) fn new(engine: Box<dyn StepEngine>) -> Self {
        let pool = BlockPool::new(engine.num_blocks());
        DraftModel { engine, pool }
    }

    pub(crate) fn vocab_size(&self) -> usize {
        self.engine.model_config().vocab_size
    }

    /// Blocks for every position a row will feed (the catch-up through its last token, then
    /// `k - 1` draft tokens); false when the pool cannot hold them (the row does not draft).
    pub(crate) fn reserve(&mut self, tokens: &[u32], kv: &mut DraftKv, k: usize) -> bool {
        kv.roll_back(tokens);
        let need = blocks_for(tokens.len() + k - 1).saturating_sub(kv.blocks.len());
        if need > self.pool.num_free() {
            return false;
        }
        for _ in 0..need {
            if let Some(b) = self.pool.allocate() {
                kv.blocks.push(b);
            }
        }
        kv.tail_start = tokens.len();
        true
    }

    /// Gives a sequence's draft blocks back.
    pub(crate) fn release(&mut self, kv: &mut DraftKv) {
        for &b in kv.blocks.iter().rev() {
            self.pool.free(b);
        }
        *kv = DraftKv::default();
    }
}

/// A sequence's state in the draft model's cache.
#[derive(Debug, Clone, Default)]
pub(crate) struct DraftKv {
    blocks: Vec<u32>,
    /// Positions whose K/V the draft model holds.
    computed: usize,
    /// Draft tokens fed at positions `tail_start..`, not yet confirmed by the target.
    tail_start: usize,
    tail: Vec<u32>,
    /// This step's proposal.
    pub proposal: Vec<u32>,
}

impl DraftKv {
    /// Keeps the cache only as far as the fed tokens agree with the sequence's.
    fn roll_back(&mut self, tokens: &[u32]) {
        let agree = self
            .tail
            .iter()
            .enumerate()
            .take_while(|&(j, t)| tokens.get(self.tail_start + j) == Some(t))
            .count();
        if !self.tail.is_empty() {
            self.computed = self.computed.min(self.tail_start + agree);
        }
        self.tail.clear();
        // The last token is never in the cache: it is the one to feed.
        self.computed = self.computed.min(tokens.len().saturating_sub(1));
    }
}

/// One sequence drafting this step: its tokens (prompt then output), its state in the draft
/// model's cache, and how many tokens to propose (after [`DraftModel::reserve`]).
pub(crate) struct DraftRow<'a> {
    pub tokens: &'a [u32],
    pub kv: &'a mut DraftKv,
    pub k: usize,
}

impl DraftModel {
    /// Decodes greedily ahead of every row, all rows batched per draft token, leaving each
    /// row's proposal in `kv.proposal`. A failed step leaves no proposals.
    pub(crate) fn propose(&mut self, rows: &mut [DraftRow<'_>]) {
        let greedy = SamplingParams::default();
        let rounds = rows.iter().map(|r| r.k).max().unwrap_or(0);
        for round in 0..rounds {
            let active: Vec<usize> = (0..rows.len()).filter(|&j| round < rows[j].k).collect();
            let chunks: Vec<SeqChunk> = active
                .iter()
                .map(|&j| {
                    let (tokens, kv) = (rows[j].tokens, &rows[j].kv);
                    let tokens = match kv.proposal.last() {
                        None => tokens[kv.computed..].to_vec(),
                        Some(&t) => vec![t],
                    };
                    SeqChunk {
                        tokens,
                        start_pos: kv.computed,
                        block_table: kv.blocks.clone(),
                        window_table: Vec::new(),
                        logits: LogitsWanted::Last,
                        adapter: None,
                    }
                })
                .collect();
            let samples = SampleRequest::at_each_last_token(&chunks, &greedy);
            let batch = StepBatch {
                chunks: &chunks,
                samples: &samples,
                prompt_logprobs: &[],
                media: &[],
                rope_deltas: &[],
                states: &[],
                pools: &[],
                mtp: &[],
            };
            let out = match self.engine.step(&batch) {
                Ok(o) => o,
                Err(e) => {
                    tracing::warn!("draft model step failed, no drafts this step: {e}");
                    for r in rows.iter_mut() {
                        let kv = &mut *r.kv;
                        kv.proposal.clear();
                        kv.computed = kv.tail_start.saturating_sub(1).min(kv.computed);
                    }
                    return;
                }
            };
            for ((&j, chunk), smp) in active.iter().zip(&chunks).zip(out.samples) {
                let kv = &mut *rows[j].kv;
                kv.computed += chunk.tokens.len();
                if round > 0 {
                    kv.tail.push(chunk.tokens[0]);
                }
                kv.proposal.push(smp.token);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_rolls_back_to_the_confirmed_tokens() {
        let mut kv = DraftKv {
            computed: 12,
            tail_start: 10,
            tail: vec![7, 8],
            ..DraftKv::default()
        };
        // Positions 10, 11 hold 7 then 9: only the first fed draft token was right.
        kv.roll_back(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 9, 4]);
        assert_eq!(kv.computed, 11);
        assert!(kv.tail.is_empty());
        // Never past the last token.
        kv.computed = 20;
        kv.roll_back(&[1, 2, 3]);
        assert_eq!(kv.computed, 2);
    }
}
