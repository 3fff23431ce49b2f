//! The engine's step boundary (the split vLLM v1 makes: the scheduler plans, the engine
//! computes). A step takes a ragged batch of [`SeqChunk`]s plus what to do with their logits
//! (draw tokens, score prompt tokens) and returns only what was asked for: token ids and the
//! requested log-probabilities. Logits never leave the engine, so a GPU backend samples on
//! the device and copies back a few bytes per sequence.
//!
//! Shaped for what plugs in later: a constrained-decoding mask is one more field of
//! [`SampleRequest`]; speculative verification samples several positions of one chunk (a
//! chunk with [`LogitsWanted::All`] and one request per position).

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::batch::{BatchLayout, ChunkMedia, LogitsWanted, SeqChunk};
use crate::error::{EngineError, Result};
use crate::sampling::{Sampled, SamplingParams, SequenceContext};

mod host;

pub use host::process_logits_host;

/// One draw from a sequence's next-token distribution.
#[derive(Debug, Clone, Copy)]
pub struct SampleRequest<'a> {
    /// Index of the chunk in [`StepBatch::chunks`].
    pub chunk: usize,
    /// The chunk's token (0-based) whose logits are sampled; the last one for ordinary
    /// decoding. Its logits must be among those the chunk asks for.
    pub position: usize,
    pub params: &'a SamplingParams,
    /// Seed of the draw (each parallel sequence of a request has its own); `params.seed`
    /// is ignored.
    pub seed: u64,
    /// The sequence the token extends (penalties, bans, and the draw's output position).
    pub ctx: SequenceContext<'a>,
    /// Constrained decoding: the tokens this draw may pick (waited for right before the
    /// draw, so it can be computed while the forward pass runs).
    pub allowed: Option<&'a TokenMask>,
}

impl<'a> SampleRequest<'a> {
    /// One draw at each chunk's last token, all with `params` (seeded by `params.seed`) and
    /// no sequence context: what benchmarks and tests that drive the engine directly need.
    pub fn at_each_last_token(chunks: &[SeqChunk], params: &'a SamplingParams) -> Vec<Self> {
        chunks
            .iter()
            .enumerate()
            .map(|(k, c)| SampleRequest {
                chunk: k,
                position: c.tokens.len().saturating_sub(1),
                params,
                seed: params.seed,
                ctx: SequenceContext::default(),
                allowed: None,
            })
            .collect()
    }
}

/// Log-probabilities of given tokens at each of a chunk's positions (prompt logprobs).
#[derive(Debug, Clone, Copy)]
pub struct PromptLogprobRequest<'a> {
    /// Index of the chunk in [`StepBatch::chunks`]; it must ask for [`LogitsWanted::All`].
    pub chunk: usize,
    /// `targets[j]` is scored under the logits of the chunk's token `j` (the prompt token
    /// that follows it). At most the chunk's length: the prompt may end inside the chunk.
    pub targets: &'a [u32],
    /// Alternatives reported per position.
    pub top_n: u32,
}

/// One engine step.
#[derive(Debug, Clone, Copy)]
pub struct StepBatch<'a> {
    pub chunks: &'a [SeqChunk],
    pub samples: &'a [SampleRequest<'a>],
    pub prompt_logprobs: &'a [PromptLogprobRequest<'a>],
    /// Which chunk positions stand for media items (empty for text): a vision model's
    /// encoder embeddings replace their placeholder tokens' embeddings.
    pub media: &'a [ChunkMedia],
    /// M-RoPE models: per chunk, how far its first token's rotary position trails its
    /// sequence index because of the media items that end before it (empty: none do).
    pub rope_deltas: &'a [i64],
    /// Models with recurrent layers ([`crate::engine::StepEngine::state_config`]): one per
    /// chunk, its state slot and snapshots; empty for the others.
    pub states: &'a [crate::state::ChunkState],
    /// Embedding and scoring models ([`crate::engine::StepEngine::pooler`]): the chunks whose
    /// pooled output the step returns. Such a chunk holds its sequence's whole input (from
    /// position 0; bidirectional encoders see all of it at once) and wants no logits.
    pub pools: &'a [PoolRequest],
    /// An engine with a multi-token-prediction head ([`crate::engine::StepEngine::mtp`]):
    /// what the head needs of each generating chunk beyond its tokens. Every chunk of a
    /// sequence that may draft should have one, so that the head's cache holds every position.
    pub mtp: &'a [MtpChunk],
}

/// A chunk's part in multi-token prediction ([`StepBatch::mtp`]). The head reads each
/// position's hidden state with the token after it: the chunk's own next token, then for its
/// last row `next`, or the step's draw there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MtpChunk {
    /// Index of the chunk in [`StepBatch::chunks`].
    pub chunk: usize,
    /// The token after the chunk's last where it is known (a prompt chunk that does not end
    /// the prompt); None: the step draws it (a [`SampleRequest`] at the chunk's last row).
    pub next: Option<u32>,
    /// The chunk's last `draft` tokens are a draft under verification (one draw per row
    /// from the last token before them): the head reads the rows up to the last draft token
    /// equal to the draw before it, then that row's draw, as the scheduler keeps them.
    pub draft: usize,
    /// Draft tokens wanted back ([`StepOutput::drafts`]); 0 keeps the head's cache current.
    pub propose: usize,
}

/// A chunk whose pooled output (an embedding, or a scoring model's scores) the step returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolRequest {
    /// Index of the chunk in [`StepBatch::chunks`].
    pub chunk: usize,
    /// BERT pair inputs (a cross-encoder's query and document): the first token of the second
    /// segment, whose tokens take token type 1 (None: every token is type 0).
    pub segment_b: Option<usize>,
}

/// The log-probability of one token and the most likely alternatives at its position.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub logprob: f32,
    /// `(id, logprob)`, logprob descending, ties id ascending.
    pub top: Vec<(u32, f32)>,
}

/// What a step returns.
#[derive(Debug, Clone, Default)]
pub struct StepOutput {
    /// One per [`StepBatch::samples`], in order.
    pub samples: Vec<Sampled>,
    /// One per [`StepBatch::prompt_logprobs`], in order, one entry per target.
    pub prompt_logprobs: Vec<Vec<TokenLogprob>>,
    /// One per [`StepBatch::pools`], in order: the model's output vector (an embedding after
    /// its pooling and dense modules, not normalized; or the scoring head's raw scores).
    pub pooled: Vec<Vec<f32>>,
    /// One per [`StepBatch::mtp`], in order: the head's greedy draft (up to its `propose`
    /// tokens; fewer where the sequence's blocks end, none where no row was read).
    pub drafts: Vec<Vec<u32>>,
    /// Time spent turning logits into these results (metrics).
    pub sample_time: Duration,
}

/// A draw from one row of the step's logits matrix.
#[derive(Debug, Clone, Copy)]
pub struct RowSample<'a> {
    pub row: usize,
    pub params: &'a SamplingParams,
    pub seed: u64,
    pub ctx: SequenceContext<'a>,
    pub allowed: Option<&'a TokenMask>,
}

/// The tokens a constrained draw may pick, as a bitset over the vocabulary (bit `i % 32` of
/// word `i / 32`), filled once, possibly by another thread while the forward pass runs; a
/// backend waits for it right before the draw.
#[derive(Debug, Default)]
pub struct TokenMask {
    state: Mutex<Option<Option<Arc<[u32]>>>>,
    ready: Condvar,
}

impl TokenMask {
    /// A mask still being computed.
    pub fn pending() -> Self {
        Self::default()
    }

    pub fn ready(bits: Vec<u32>) -> Self {
        let m = Self::default();
        m.set(Some(bits));
        m
    }

    /// Completes the mask; None when computing it failed (the draw is then unconstrained and
    /// whoever computed it fails the sequence).
    pub fn set(&self, bits: Option<Vec<u32>>) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.is_none() {
            *s = Some(bits.map(Arc::from));
            self.ready.notify_all();
        }
    }

    /// Waits until the mask is set.
    pub fn wait(&self) -> Option<Arc<[u32]>> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(bits) = &*s {
                return bits.clone();
            }
            s = self.ready.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// The log-probability of `token` under one row, with `top_n` alternatives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowScore {
    pub row: usize,
    pub token: u32,
    pub top_n: u32,
}

/// A step's requests mapped onto rows of its logits matrix (`layout.logits_rows` order):
/// what a backend's `process_logits` computes.
#[derive(Debug, Clone, Default)]
pub struct LogitsWork<'a> {
    pub samples: Vec<RowSample<'a>>,
    pub scores: Vec<RowScore>,
}

/// [`LogitsWork`]'s results, in its order.
#[derive(Debug, Clone, Default)]
pub struct LogitsOutput {
    pub samples: Vec<Sampled>,
    pub scores: Vec<TokenLogprob>,
}

impl<'a> LogitsWork<'a> {
    /// Maps `batch`'s requests onto the rows `layout` returns; an error names the request
    /// whose logits the chunk does not ask for.
    pub fn new(batch: &StepBatch<'a>, layout: &BatchLayout) -> Result<Self> {
        // First logits row of each chunk.
        let mut first = Vec::with_capacity(batch.chunks.len());
        let mut row = 0usize;
        for &n in &layout.logits_per_seq {
            first.push(row);
            row += n as usize;
        }
        let row_of = |chunk: usize, position: usize, what: &str| -> Result<usize> {
            let c = batch.chunks.get(chunk).ok_or_else(|| {
                EngineError::Batch(format!(
                    "{what} names chunk {chunk} of {}",
                    batch.chunks.len()
                ))
            })?;
            let len = c.tokens.len();
            match c.logits {
                LogitsWanted::All if position < len => Ok(first[chunk] + position),
                LogitsWanted::Last if position + 1 == len => Ok(first[chunk]),
                _ => Err(EngineError::Batch(format!(
                    "{what} reads the logits of token {position} of chunk {chunk} ({len} tokens, logits {:?})",
                    c.logits
                ))),
            }
        };
        let mut work = LogitsWork::default();
        for (i, s) in batch.samples.iter().enumerate() {
            work.samples.push(RowSample {
                row: row_of(s.chunk, s.position, &format!("sample request {i}"))?,
                params: s.params,
                seed: s.seed,
                ctx: s.ctx,
                allowed: s.allowed,
            });
        }
        for (i, p) in batch.prompt_logprobs.iter().enumerate() {
            for (j, &token) in p.targets.iter().enumerate() {
                work.scores.push(RowScore {
                    row: row_of(p.chunk, j, &format!("prompt logprob request {i}"))?,
                    token,
                    top_n: p.top_n,
                });
            }
        }
        Ok(work)
    }

    /// Regroups `out.scores` per prompt-logprob request of `batch`.
    pub fn into_step_output(
        batch: &StepBatch<'_>,
        out: LogitsOutput,
        sample_time: Duration,
    ) -> StepOutput {
        let mut scores = out.scores.into_iter();
        let prompt_logprobs = batch
            .prompt_logprobs
            .iter()
            .map(|p| scores.by_ref().take(p.targets.len()).collect())
            .collect();
        StepOutput {
            samples: out.samples,
            prompt_logprobs,
            pooled: Vec::new(),
            drafts: Vec::new(),
            sample_time,
        }
    }
}
