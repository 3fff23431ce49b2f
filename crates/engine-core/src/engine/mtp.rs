//! Speculative drafts from the checkpoint's multi-token-prediction head
//! ([`Model::load_mtp`]), run inside the target's step: the target returns the final-normed
//! hidden state of every row of the chunks that ask ([`StepBatch::mtp`]), the step draws its
//! tokens, then the head reads each row's hidden state with the token after it (the chunk's
//! next token, or the step's draw after its last accepted row) and writes its own K/V at the
//! same positions, in blocks of the same ids. So its cache always holds what the target has
//! confirmed (a prefix-cache hit brings the head's K/V with the target's), and a draft costs
//! one layer per token beyond the target's step.
//!
//! Draft tokens are the head's greedy picks: its first from the last row it read, each next
//! one from a pass at the following position over its own output (before the head's norm)
//! and the token it drafted. Those passes' K/V sit past the sequence's confirmed positions,
//! in its own blocks (the chunk's table, never past it), and are rewritten when the target
//! confirms those positions. Drafts only propose: the scheduler verifies them against the
//! target's draws, so the head changes how fast tokens come, never which.

use std::collections::HashMap;

use crate::backend::Backend;
use crate::batch::{BatchLayout, LogitsWanted, SeqChunk};
use crate::error::{EngineError, Result};
use crate::kv::{BLOCK_SIZE, KvCacheConfig};
use crate::model::{InputEmbeds, KvCache, Model};
use crate::sampling::Sampled;
use crate::step::StepBatch;

pub(crate) struct MtpDraft<B: Backend> {
    pub model: Model<B>,
    pub kv: KvCache<B>,
}

/// One chunk's rows the head reads in a step.
struct Feed {
    /// Index into [`StepBatch::mtp`].
    mtp: usize,
    chunk: SeqChunk,
    /// Its rows' hidden states, `[tokens, hidden]`.
    hidden: Vec<f32>,
    propose: usize,
}

impl<B: Backend> MtpDraft<B> {
    pub fn new(
        backend: &B,
        model: Model<B>,
        num_blocks: usize,
        dtype: crate::DType,
    ) -> Result<Self> {
        let cfg = KvCacheConfig::new(&model.config, num_blocks, dtype);
        let kv = KvCache::new(backend, cfg)?;
        Ok(MtpDraft { model, kv })
    }

    /// Rebuilds the head's cache with `num_blocks` (the target's were resized).
    pub fn resize(&mut self, backend: &B, num_blocks: usize) -> Result<()> {
        let cfg = KvCacheConfig {
            num_blocks,
            ..self.kv.cfg
        };
        self.kv = KvCache::empty(cfg);
        self.kv = KvCache::new(backend, cfg)?;
        Ok(())
    }

    /// Reads the step's rows and drafts: one list per [`StepBatch::mtp`] entry. `hidden`
    /// holds the target's final-normed states of the chunks' rows, chunk after chunk in
    /// `batch.mtp`'s order ([`pool_rows`]); `samples` the step's draws.
    pub fn run(
        &mut self,
        backend: &B,
        batch: &StepBatch<'_>,
        samples: &[Sampled],
        hidden: &[f32],
    ) -> Result<Vec<Vec<u32>>> {
        let feeds = feeds(batch, samples, hidden, self.model.config.hidden_size)?;
        let mut drafts = vec![Vec::new(); batch.mtp.len()];
        if feeds.is_empty() {
            return Ok(drafts);
        }
        // The pass over the confirmed rows: drafts from the rows that end a feed.
        let chunks: Vec<SeqChunk> = feeds.iter().map(|f| f.chunk.clone()).collect();
        let hidden: Vec<f32> = feeds
            .iter()
            .flat_map(|f| f.hidden.iter().copied())
            .collect();
        let (mut tokens, mut states) = self.pass(backend, &chunks, hidden)?;
        let mut live: Vec<usize> = (0..feeds.len()).filter(|&i| feeds[i].propose > 0).collect();
        let h = self.model.config.hidden_size;
        // Each further draft: one token per drafting sequence, at the next position.
        let mut next_pos: Vec<usize> = feeds
            .iter()
            .map(|f| f.chunk.start_pos + f.chunk.tokens.len())
            .collect();
        for step in 0.. {
            for (j, &i) in live.iter().enumerate() {
                drafts[feeds[i].mtp].push(tokens[j]);
            }
            let (mut keep, mut state_rows) = (Vec::new(), Vec::new());
            for (j, &i) in live.iter().enumerate() {
                let f = &feeds[i];
                let room = f.chunk.block_table.len() * BLOCK_SIZE;
                if step + 1 < f.propose && next_pos[i] < room {
                    keep.push((i, tokens[j]));
                    state_rows.extend_from_slice(&states[j * h..(j + 1) * h]);
                }
            }
            if keep.is_empty() {
                break;
            }
            let chunks: Vec<SeqChunk> = keep
                .iter()
                .map(|&(i, t)| SeqChunk {
                    tokens: vec![t],
                    start_pos: next_pos[i],
                    logits: LogitsWanted::Last,
                    ..feeds[i].chunk.clone()
                })
                .collect();
            for &(i, _) in &keep {
                next_pos[i] += 1;
            }
            (tokens, states) = self.pass(backend, &chunks, state_rows)?;
            live = keep.into_iter().map(|(i, _)| i).collect();
        }
        Ok(drafts)
    }

    /// One pass of the head over `chunks` (their rows' hidden states `hidden`): the greedy
    /// token and the layer's output at each chunk that wants logits, in order.
    fn pass(
        &mut self,
        backend: &B,
        chunks: &[SeqChunk],
        hidden: Vec<f32>,
    ) -> Result<(Vec<u32>, Vec<f32>)> {
        let (logits, states) = self.forward(backend, chunks, hidden, true)?;
        let vocab = self.model.config.vocab_size.max(1);
        Ok((logits.chunks_exact(vocab).map(argmax).collect(), states))
    }

    /// The head over `chunks` (their rows' hidden states `hidden`): the logits of the rows
    /// that want them, `[rows, vocab]`, and with `states` the layer's output at those rows
    /// (before the head's norm), `[rows, hidden]`.
    fn forward(
        &mut self,
        backend: &B,
        chunks: &[SeqChunk],
        hidden: Vec<f32>,
        states: bool,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let mut layout = BatchLayout::new(chunks, self.kv.cfg.num_blocks)?;
        let rows = layout.logits_rows.len();
        // The same rows again as pool rows: the layer's output there, unnormed.
        let pooled = if states {
            layout.logits_rows.extend_from_within(..);
            rows
        } else {
            0
        };
        let embeds = InputEmbeds {
            mtp_hidden: hidden,
            ..Default::default()
        };
        let (model, kv) = (&self.model, &mut self.kv);
        let (vocab, h) = (model.config.vocab_size, model.config.hidden_size);
        backend.run_forward(|| {
            let step = backend.upload_step(&layout)?;
            let adapters = HashMap::new();
            let (logits, out) = model.forward_pooled(
                backend,
                &layout,
                &step,
                kv,
                &adapters,
                Some(&embeds),
                pooled,
            )?;
            let logits = match logits {
                Some(b) => backend.to_host(b, rows * vocab)?,
                None => Vec::new(),
            };
            let out = match out {
                Some(b) => backend.to_host(b, (rows + pooled) * h)?,
                None => Vec::new(),
            };
            Ok((logits, out.get(rows * h..).unwrap_or_default().to_vec()))
        })
    }

    /// The head's logits at every row it reads this step (a test of its arithmetic), in
    /// `batch.mtp`'s order.
    pub fn logits(
        &mut self,
        backend: &B,
        batch: &StepBatch<'_>,
        samples: &[Sampled],
        hidden: &[f32],
    ) -> Result<Vec<f32>> {
        let feeds = feeds(batch, samples, hidden, self.model.config.hidden_size)?;
        let chunks: Vec<SeqChunk> = feeds
            .iter()
            .map(|f| SeqChunk {
                logits: LogitsWanted::All,
                ..f.chunk.clone()
            })
            .collect();
        let hidden: Vec<f32> = feeds
            .iter()
            .flat_map(|f| f.hidden.iter().copied())
            .collect();
        Ok(self.forward(backend, &chunks, hidden, false)?.0)
    }
}

/// Appends every row of the chunks `batch.mtp` names to `layout.logits_rows` (after any
/// pooled rows), in that order: the target then returns their final-normed hidden states.
pub(crate) fn pool_rows(batch: &StepBatch<'_>, layout: &mut BatchLayout) -> Result<usize> {
    let mut added = 0;
    for (i, m) in batch.mtp.iter().enumerate() {
        if m.chunk >= batch.chunks.len() {
            return Err(EngineError::Batch(format!(
                "mtp entry {i} names chunk {} of {}",
                m.chunk,
                batch.chunks.len()
            )));
        }
        let rows = layout.cu_tokens[m.chunk]..layout.cu_tokens[m.chunk + 1];
        added += rows.len();
        layout.logits_rows.extend(rows);
    }
    Ok(added)
}

/// What the head reads of each chunk: its rows up to the last one whose next token is known
/// (the draft tokens the step's draws confirm, as the scheduler keeps them; see
/// [`crate::step::MtpChunk`]), each with that next token.
fn feeds(
    batch: &StepBatch<'_>,
    samples: &[Sampled],
    hidden: &[f32],
    h: usize,
) -> Result<Vec<Feed>> {
    let draw = |chunk: usize, pos: usize| {
        batch
            .samples
            .iter()
            .zip(samples)
            .find(|(r, _)| r.chunk == chunk && r.position == pos)
            .map(|(_, s)| s.token)
    };
    let mut feeds = Vec::new();
    let mut at = 0;
    for (i, m) in batch.mtp.iter().enumerate() {
        let c = &batch.chunks[m.chunk];
        let len = c.tokens.len();
        let rows = &hidden.get(at * h..(at + len) * h).ok_or_else(|| {
            EngineError::Backend("the target returned fewer hidden states than rows".into())
        })?;
        at += len;
        if len == 0 {
            continue;
        }
        let d = m.draft.min(len - 1);
        let base = len - 1 - d;
        let accepted = (0..d)
            .take_while(|&j| draw(m.chunk, base + j) == Some(c.tokens[base + 1 + j]))
            .count();
        let last = base + accepted;
        let next = draw(m.chunk, last).or(m.next.filter(|_| last == len - 1));
        // Rows 0 ..= last continue with tokens 1 ..= last, then `next` (unknown: the last
        // row waits).
        let mut tokens: Vec<u32> = c.tokens[1..=last].to_vec();
        tokens.extend(next);
        if tokens.is_empty() {
            continue;
        }
        let n = tokens.len();
        feeds.push(Feed {
            mtp: i,
            chunk: SeqChunk {
                tokens,
                start_pos: c.start_pos,
                block_table: c.block_table.clone(),
                window_table: Vec::new(),
                logits: match (m.propose, next) {
                    (p, Some(_)) if p > 0 => LogitsWanted::Last,
                    _ => LogitsWanted::None,
                },
                adapter: None,
            },
            hidden: rows[..n * h].to_vec(),
            propose: if next.is_some() { m.propose } else { 0 },
        });
    }
    Ok(feeds)
}

/// The greedy pick: the largest logit, the lowest id among equals.
fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best as u32
}
