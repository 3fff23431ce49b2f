//! A draft model (option.speculative_draft_model): a second, smaller engine with the same
//! vocabulary proposes drafts by decoding greedily ahead of the target, all drafting sequences
//! in one batch per draft token. It keeps its own paged KV cache: each sequence holds blocks of
//! the draft's pool and remembers which draft tokens it fed beyond the confirmed output, so its
//! cache is rolled back to what the target accepted before the next proposal.

use lmi_engine::engine::StepEngine;
use lmi_engine::sampling::SamplingParams;
use lmi_engine::{LogitsWanted, SampleRequest, SeqChunk, StepBatch};

use super::{Scheduler, blocks_for};
use crate::block_pool::BlockPool;
use crate::sequence::Sequence;

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

impl Scheduler {
    /// Runs the draft model for the running sequences that may speculate this step, leaving
    /// each one's proposal in `draft_kv.proposal` (see `speculation::propose`). `room` is the
    /// most tokens a sequence may draft.
    pub(super) fn run_draft_model(&mut self, room: usize) {
        let Some(dm) = self.draft_model.as_mut() else {
            return;
        };
        let max_draft = self.cfg.speculative.max_draft.max(1);
        // (running index, draft length) of the sequences that draft.
        let mut rows: Vec<(usize, usize)> = Vec::new();
        for (i, s) in self.running.iter_mut().enumerate() {
            s.draft_kv.proposal.clear();
            let Some(r) = self.requests.get(&s.req) else {
                continue;
            };
            let p = &r.params;
            if s.remaining() != 1
                || s.constraint.is_some()
                || p.beam.is_some()
                || !r.forked
                || !p.draft.is_empty()
            {
                continue;
            }
            let generated = s.tokens.len() - s.prompt_len;
            let k = room
                .min(s.spec_k.clamp(1, max_draft))
                .min(p.stopping.max_new_tokens.saturating_sub(generated + 1))
                .min(self.cfg.max_model_len.saturating_sub(s.tokens.len() + 1));
            if k == 0 {
                continue;
            }
            let kv = &mut s.draft_kv;
            kv.roll_back(&s.tokens);
            // Blocks for every position fed: the catch-up through the last token, then k - 1
            // draft tokens.
            let need = blocks_for(s.tokens.len() + k - 1).saturating_sub(kv.blocks.len());
            if need > dm.pool.num_free() {
                continue;
            }
            for _ in 0..need {
                if let Some(b) = dm.pool.allocate() {
                    kv.blocks.push(b);
                }
            }
            kv.tail_start = s.tokens.len();
            rows.push((i, k));
        }
        let greedy = SamplingParams::default();
        let rounds = rows.iter().map(|&(_, k)| k).max().unwrap_or(0);
        for round in 0..rounds {
            let active: Vec<usize> = rows
                .iter()
                .filter(|&&(_, k)| round < k)
                .map(|&(i, _)| i)
                .collect();
            let chunks: Vec<SeqChunk> = active
                .iter()
                .map(|&i| {
                    let s = &self.running[i];
                    let kv = &s.draft_kv;
                    let tokens = match kv.proposal.last() {
                        None => s.tokens[kv.computed..].to_vec(),
                        Some(&t) => vec![t],
                    };
                    SeqChunk {
                        tokens,
                        start_pos: kv.computed,
                        block_table: kv.blocks.clone(),
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
            };
            let out = match dm.engine.step(&batch) {
                Ok(o) => o,
                Err(e) => {
                    tracing::warn!("draft model step failed, no drafts this step: {e}");
                    for &(i, _) in &rows {
                        let kv = &mut self.running[i].draft_kv;
                        kv.proposal.clear();
                        kv.computed = kv.tail_start.saturating_sub(1).min(kv.computed);
                    }
                    return;
                }
            };
            for ((&i, chunk), smp) in active.iter().zip(&chunks).zip(out.samples) {
                let kv = &mut self.running[i].draft_kv;
                kv.computed += chunk.tokens.len();
                if round > 0 {
                    kv.tail.push(chunk.tokens[0]);
                }
                kv.proposal.push(smp.token);
            }
        }
    }

    /// Frees a sequence's blocks in the draft model's pool.
    pub(super) fn release_draft(&mut self, s: &mut Sequence) {
        if let Some(dm) = self.draft_model.as_mut() {
            dm.release(&mut s.draft_kv);
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
