//! Load-time work on a device with memory of its own (a GPU): one step of the largest shape
//! the scheduler will run, on a provisional KV cache, so that every step buffer is as large as
//! it will ever be and the memory the engine takes besides the KV cache is measured, not
//! guessed (weights, activations, the sampler's buffers, workspaces, the context: `total -
//! free`); the KV cache then gets the rest of the configured share. Then every decode graph is
//! captured over the real cache, so a capture failure shows at load and no step pays for one.

use std::time::Instant;

use super::{Engine, StepEngine};
use crate::backend::{Backend, GraphKey};
use crate::batch::{LogitsWanted, SeqChunk};
use crate::error::{EngineError, Result};
use crate::kv::BLOCK_SIZE;
use crate::sampling::SamplingParams;
use crate::step::{SampleRequest, StepBatch, TokenMask};

/// The largest step the scheduler runs, from its settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepShape {
    /// Sequences in a step (`option.max_rolling_batch_size`).
    pub seqs: usize,
    /// Tokens in a step (the prefill budget, `option.max_rolling_batch_prefill_tokens`).
    pub tokens: usize,
    /// Tokens one sequence may hold, prompt and output (`option.max_model_len`); None: the
    /// model's `max_position_embeddings`.
    pub context: Option<usize>,
}

impl Default for StepShape {
    /// The scheduler's GPU defaults.
    fn default() -> Self {
        StepShape {
            seqs: 256,
            tokens: 4096,
            context: None,
        }
    }
}

/// Memory graphs take on top of what the warm-up measured: their nodes' parameters (a few KB
/// per launch, hundreds of launches per decode step), and a margin for what the allocator
/// rounds up.
const GRAPH_BYTES: usize = 2 << 20;
const MARGIN_BYTES: usize = 256 << 20;
/// The smallest KV cache worth serving with.
const MIN_KV_BYTES: usize = 64 << 20;

/// Draws of the warm-up: sampled, with top logprobs (and masks, below), so the sampler's
/// buffers and scratch reach the sizes real requests make them.
fn warmup_params() -> SamplingParams {
    SamplingParams {
        temperature: 0.7,
        top_p: 0.9,
        top_logprobs: 20,
        ..Default::default()
    }
}

/// KV blocks the warm-up steps of `shape` write into (each sequence its own).
pub(crate) fn warmup_blocks(shape: StepShape) -> usize {
    let mut next = 0;
    prefill_chunks(shape.seqs.min(shape.tokens).max(1), shape.tokens, &mut next);
    prefill_chunks(shape.seqs.max(1), shape.seqs.max(1), &mut next);
    next as usize
}

/// `count` sequences sharing `tokens` new tokens, each with blocks of its own from `next`.
fn prefill_chunks(count: usize, tokens: usize, next: &mut u32) -> Vec<SeqChunk> {
    (0..count)
        .map(|s| {
            let len = tokens / count + usize::from(s < tokens % count);
            let blocks = len.div_ceil(BLOCK_SIZE) as u32;
            let table = (*next..*next + blocks).collect();
            *next += blocks;
            SeqChunk {
                tokens: (0..len as u32).collect(),
                start_pos: 0,
                block_table: table,
                window_table: Vec::new(),
                logits: LogitsWanted::Last,
                adapter: None,
            }
        })
        .collect()
}

impl<B: Backend> Engine<B> {
    /// Runs the largest prefill-shaped and decode-shaped steps on the provisional cache this
    /// engine holds, then returns the KV blocks the rest of `fraction` of the device holds.
    pub(crate) fn measure_kv_blocks(&mut self, shape: StepShape, fraction: f32) -> Result<usize> {
        let started = Instant::now();
        let params = warmup_params();
        let seqs = shape.seqs.min(shape.tokens).max(1);
        // Every draw constrained, as a batch of structured-output requests uploads a mask per
        // row (4 MiB at batch 256 of a 128k vocabulary): the sampler's buffers reach that size.
        let vocab = self.model_config().vocab_size;
        let mask = TokenMask::ready(vec![u32::MAX; vocab.div_ceil(32)]);
        let mut next = 0;
        for chunks in [
            prefill_chunks(seqs, shape.tokens, &mut next),
            prefill_chunks(shape.seqs.max(1), shape.seqs.max(1), &mut next),
        ] {
            let mut samples = SampleRequest::at_each_last_token(&chunks, &params);
            for s in &mut samples {
                s.allowed = Some(&mask);
            }
            // A model with recurrent layers: one slot per chunk (as many as it keeps).
            let states: Vec<crate::state::ChunkState> = match self.state_config() {
                Some(s) => (0..chunks.len().min(s.slots) as u32)
                    .map(crate::state::ChunkState::in_slot)
                    .collect(),
                None => Vec::new(),
            };
            self.step(&StepBatch {
                chunks: &chunks,
                samples: &samples,
                prompt_logprobs: &[],
                media: &[],
                rope_deltas: &[],
                states: &states,
                pools: &[],
                mtp: &[],
            })?;
        }
        self.backend().finish_warmup()?;
        let (free, total) = self.backend().memory_info()?.ok_or_else(|| {
            EngineError::Backend("the warm-up measures a device's own memory".into())
        })?;
        let provisional = self.kv_bytes();
        let engine = (total - free.min(total)).saturating_sub(provisional);
        let keys = self.graph_keys(shape).len();
        let reserve = MARGIN_BYTES + keys * GRAPH_BYTES;
        let usable = (total as f64 * f64::from(fraction)) as usize;
        let mib = |b: usize| b >> 20;
        // The recurrent-state slots stay as allocated; the K/V get the rest.
        let states = self.state_config().map_or(0, |s| s.bytes());
        let budget = usable.saturating_sub(engine + reserve + states);
        if budget < MIN_KV_BYTES {
            return Err(EngineError::Backend(format!(
                "the engine takes {} MiB of the device's {} MiB after a step of {} sequences and \
                 {} tokens (weights, activations, workspaces, the context), and {} MiB are \
                 kept for {keys} CUDA graphs: {fraction} of the device leaves no room for a KV \
                 cache. Raise option.gpu_memory_utilization, or lower \
                 option.max_rolling_batch_size or option.max_rolling_batch_prefill_tokens",
                mib(engine),
                mib(total),
                shape.seqs,
                shape.tokens,
                mib(reserve)
            )));
        }
        tracing::info!(
            "KV cache: {} MiB ({fraction} of {} MiB, less {} MiB measured after a step of {} \
             sequences and {} tokens, and {} MiB for {keys} CUDA graphs); warm-up {:.2?}",
            mib(budget),
            mib(total),
            mib(engine),
            shape.seqs,
            shape.tokens,
            mib(reserve),
            started.elapsed()
        );
        Ok(self.global_blocks_for(budget).max(1))
    }

    /// The decode graphs for `shape`'s batches and contexts.
    fn graph_keys(&self, shape: StepShape) -> Vec<GraphKey> {
        let context = shape
            .context
            .unwrap_or(self.model_config().max_position_embeddings);
        self.backend()
            .graph_keys(shape.seqs, context.div_ceil(BLOCK_SIZE))
    }

    /// Captures every decode graph of `shape` (largest first, so none is captured over step
    /// buffers a larger one would move), each key run twice: once to warm up, once captured.
    /// Their sequences write into blocks no request holds yet.
    pub(crate) fn capture_graphs(&mut self, shape: StepShape) -> Result<()> {
        let mut keys = self.graph_keys(shape);
        if keys.is_empty() {
            return Ok(());
        }
        keys.sort_by_key(|k| std::cmp::Reverse((k.seqs, k.block_stride)));
        let started = Instant::now();
        let blocks = self.kv_config().num_blocks as u32;
        let window_blocks = self.window().map(|w| w.blocks as u32);
        for key in &keys {
            let chunks: Vec<SeqChunk> = (0..key.seqs)
                .map(|s| SeqChunk {
                    tokens: vec![s as u32],
                    start_pos: 0,
                    block_table: vec![s as u32 % blocks; key.block_stride],
                    window_table: window_blocks
                        .map_or(Vec::new(), |w| vec![s as u32 % w; key.block_stride]),
                    logits: LogitsWanted::Last,
                    adapter: None,
                })
                .collect();
            for _ in 0..2 {
                self.run_device_pass(&chunks)?;
            }
        }
        let stats = self.backend().graph_stats().unwrap_or_default();
        if stats.failed > 0 {
            tracing::error!(
                "{} of {} decode graphs failed to capture (see above): those steps run \
                 directly, slower",
                stats.failed,
                keys.len()
            );
        } else {
            tracing::info!(
                "captured {} decode graphs (batch sizes up to {}, block tables up to {} \
                 blocks) in {:.2?}",
                stats.captured,
                keys[0].seqs,
                keys.iter().map(|k| k.block_stride).max().unwrap_or(0),
                started.elapsed()
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefill_warm_up_spreads_the_tokens_over_fresh_blocks() {
        let mut next = 0;
        let chunks = prefill_chunks(3, 40, &mut next);
        let lens: Vec<usize> = chunks.iter().map(|c| c.tokens.len()).collect();
        assert_eq!(lens, [14, 13, 13]);
        assert_eq!(chunks[1].block_table, [1]);
        assert_eq!(next, 3);
        let more = prefill_chunks(2, 2, &mut next);
        assert_eq!(more[1].block_table, [4]);
    }
}
