//! The host-side layout of one engine step: a ragged batch of sequences, each contributing
//! any number of new tokens (a prefill chunk, or one decode token), with paged KV addressing.

use crate::error::{EngineError, Result};
use crate::kv::BLOCK_SIZE;

/// A block-table entry that holds no block: a sliding-window layer's block that left the
/// window and went back to its pool.
pub const NO_BLOCK: u32 = u32::MAX;

/// Which logits rows a sequence needs back from this step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsWanted {
    /// A prefill chunk that does not finish the prompt: nothing to sample yet.
    None,
    /// The last new token only (the next-token distribution).
    Last,
    /// Every new token (prompt logprobs), the last one included.
    All,
}

/// One sequence's part of a step.
#[derive(Debug, Clone)]
pub struct SeqChunk {
    /// Tokens to run this step (their K/V are written to the cache).
    pub tokens: Vec<u32>,
    /// Tokens of this sequence already in the KV cache, before `tokens`.
    pub start_pos: usize,
    /// Physical block ids covering positions `0 .. start_pos + tokens.len()`.
    pub block_table: Vec<u32>,
    /// Where the engine keeps its sliding-window layers' K/V in pools of their own
    /// ([`crate::engine::StepEngine::kv_window`]): those layers' block ids, covering the same
    /// positions; blocks wholly before the window of the chunk's first token may be
    /// [`NO_BLOCK`] (given back, never read). Empty: `block_table`'s ids serve there too.
    pub window_table: Vec<u32>,
    pub logits: LogitsWanted,
    /// LoRA adapter applied to this sequence's tokens (loaded with `StepEngine::load_adapter`).
    pub adapter: Option<u64>,
}

/// A run of a chunk's positions that stand for one media item (an image's placeholder tokens),
/// whose embeddings a vision encoder supplies. A run covers the rest of its item from
/// `item_offset`: the scheduler never cuts an item between steps, but a prefix-cache hit may
/// already hold its first positions.
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkMedia {
    /// Index of the chunk in the step.
    pub chunk: usize,
    /// First position of the run in the chunk's `tokens`.
    pub offset: usize,
    pub len: usize,
    /// Which of the item's placeholder positions the run starts at.
    pub item_offset: usize,
    /// The item's content hash (what its encoder output is cached by).
    pub hash: u128,
    /// Its patches, for the vision tower (None: the engine must have its embeddings cached).
    pub input: Option<std::sync::Arc<crate::vision::VisionInput>>,
}

/// Flat per-token and per-sequence metadata, computed once per step and shared by every layer.
#[derive(Debug, Clone, Default)]
pub struct BatchLayout {
    pub token_ids: Vec<u32>,
    pub positions: Vec<u32>,
    /// KV slot of each token: `block_table[pos / BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE`.
    pub slot_mapping: Vec<u32>,
    /// Sequence index of each token.
    pub token_seq: Vec<u32>,
    /// Per sequence: its first token index in the flat batch (length num_seqs + 1).
    pub cu_tokens: Vec<u32>,
    /// Per sequence: tokens in the cache after this step (`start_pos + new tokens`).
    pub context_lens: Vec<u32>,
    /// Block tables, flattened `[num_seqs, max_blocks]`, padded with 0.
    pub block_tables: Vec<u32>,
    pub max_blocks: usize,
    /// Token indices whose logits are returned, in order.
    pub logits_rows: Vec<u32>,
    /// Per sequence: how many rows of `logits_rows` belong to it.
    pub logits_per_seq: Vec<u32>,
    /// Token indices of each LoRA adapter used in this step.
    pub adapter_rows: Vec<(u64, Vec<u32>)>,
    /// M-RoPE models: each token's (time, height, width) rotary positions, 3 per token;
    /// empty when the rotary position is `positions`.
    pub rope_positions: Vec<u32>,
    /// Rows of this step take their input embedding from the host (a media encoder's, by
    /// `Backend::write_rows`): such a step uploads them as it runs, so a backend never
    /// captures or replays it as a graph.
    pub host_embeds: bool,
    /// The sliding-window layers' addressing when they keep pools of their own.
    pub window: Option<WindowTables>,
    /// Models with recurrent (linear-attention) layers: each sequence's state slot and the
    /// snapshots to take ([`crate::state::ChunkState`]); empty for the others.
    pub states: Vec<crate::state::ChunkState>,
}

impl BatchLayout {
    /// Lays out `chunks`; `num_blocks` is the pool size, to reject out-of-range block ids.
    pub fn new(chunks: &[SeqChunk], num_blocks: usize) -> Result<Self> {
        let total: usize = chunks.iter().map(|c| c.tokens.len()).sum();
        let max_blocks = chunks
            .iter()
            .map(|c| c.block_table.len())
            .max()
            .unwrap_or(0);
        let mut l = BatchLayout {
            token_ids: Vec::with_capacity(total),
            positions: Vec::with_capacity(total),
            slot_mapping: Vec::with_capacity(total),
            token_seq: Vec::with_capacity(total),
            cu_tokens: Vec::with_capacity(chunks.len() + 1),
            context_lens: Vec::with_capacity(chunks.len()),
            block_tables: vec![0; chunks.len() * max_blocks],
            max_blocks,
            logits_rows: Vec::new(),
            logits_per_seq: Vec::with_capacity(chunks.len()),
            adapter_rows: Vec::new(),
            rope_positions: Vec::new(),
            host_embeds: false,
            window: None,
            states: Vec::new(),
        };
        l.cu_tokens.push(0);
        for (s, c) in chunks.iter().enumerate() {
            if c.tokens.is_empty() {
                return Err(EngineError::Batch(format!(
                    "sequence {s} has no new tokens"
                )));
            }
            let end = c.start_pos + c.tokens.len();
            let needed = end.div_ceil(BLOCK_SIZE);
            if c.block_table.len() < needed {
                return Err(EngineError::Batch(format!(
                    "sequence {s}: {end} tokens need {needed} blocks, block table has {}",
                    c.block_table.len()
                )));
            }
            if let Some(&b) = c.block_table.iter().find(|&&b| b as usize >= num_blocks) {
                return Err(EngineError::Batch(format!(
                    "sequence {s}: block id {b} is outside the pool of {num_blocks} blocks"
                )));
            }
            l.block_tables[s * max_blocks..s * max_blocks + c.block_table.len()]
                .copy_from_slice(&c.block_table);
            let first = l.token_ids.len() as u32;
            for (i, &t) in c.tokens.iter().enumerate() {
                let pos = c.start_pos + i;
                l.token_ids.push(t);
                l.positions.push(pos as u32);
                let block = c.block_table[pos / BLOCK_SIZE];
                l.slot_mapping
                    .push(block * BLOCK_SIZE as u32 + (pos % BLOCK_SIZE) as u32);
                l.token_seq.push(s as u32);
            }
            let last = l.token_ids.len() as u32;
            if let Some(a) = c.adapter {
                match l.adapter_rows.iter_mut().find(|(id, _)| *id == a) {
                    Some((_, rows)) => rows.extend(first..last),
                    None => l.adapter_rows.push((a, (first..last).collect())),
                }
            }
            l.cu_tokens.push(last);
            l.context_lens.push(end as u32);
            let rows: Vec<u32> = match c.logits {
                LogitsWanted::None => vec![],
                LogitsWanted::Last => vec![last - 1],
                LogitsWanted::All => (first..last).collect(),
            };
            l.logits_per_seq.push(rows.len() as u32);
            l.logits_rows.extend(rows);
        }
        Ok(l)
    }

    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }

    pub fn num_seqs(&self) -> usize {
        self.context_lens.len()
    }

    /// Tokens of sequence `seq` computed before this step.
    pub fn start_pos(&self, seq: usize) -> usize {
        let n = self.cu_tokens[seq + 1] - self.cu_tokens[seq];
        (self.context_lens[seq] - n) as usize
    }

    pub fn block_table(&self, seq: usize) -> &[u32] {
        &self.block_tables[seq * self.max_blocks..(seq + 1) * self.max_blocks]
    }

    /// Lays out the chunks' window tables (`self` is their layout) for sliding-window layers
    /// with pools of their own (`num_blocks` blocks). A token at position p reads keys from
    /// `p + 1 - window` on, so a chunk needs real blocks from the one holding
    /// `start_pos + 1 - window`; entries before it may be [`NO_BLOCK`] and are laid out as
    /// block 0, which attention never reads for them.
    pub fn window_tables(
        &self,
        chunks: &[SeqChunk],
        num_blocks: usize,
        window: usize,
    ) -> Result<WindowTables> {
        fn table(c: &SeqChunk) -> &[u32] {
            if c.window_table.is_empty() {
                &c.block_table
            } else {
                &c.window_table
            }
        }
        let max_blocks = chunks.iter().map(|c| table(c).len()).max().unwrap_or(0);
        let mut l = WindowTables {
            slot_mapping: Vec::with_capacity(self.slot_mapping.len()),
            block_tables: vec![0; chunks.len() * max_blocks],
            max_blocks,
        };
        for (s, c) in chunks.iter().enumerate() {
            let t = table(c);
            let end = c.start_pos + c.tokens.len();
            let needed = end.div_ceil(BLOCK_SIZE);
            if t.len() < needed {
                return Err(EngineError::Batch(format!(
                    "sequence {s}: {end} tokens need {needed} window blocks, its window table has {}",
                    t.len()
                )));
            }
            let first = crate::kv::KvWindow::first_needed(window, c.start_pos);
            if let Some(&b) = t[first..].iter().find(|&&b| b as usize >= num_blocks) {
                let what = if b == NO_BLOCK {
                    "no block".to_string()
                } else {
                    format!("block id {b}, outside the window pool of {num_blocks} blocks")
                };
                return Err(EngineError::Batch(format!(
                    "sequence {s}: its window table holds {what} inside the window"
                )));
            }
            let row = &mut l.block_tables[s * max_blocks..s * max_blocks + t.len()];
            row[first..].copy_from_slice(&t[first..]);
            for i in 0..c.tokens.len() {
                let pos = c.start_pos + i;
                let block = t[pos / BLOCK_SIZE];
                l.slot_mapping
                    .push(block * BLOCK_SIZE as u32 + (pos % BLOCK_SIZE) as u32);
            }
        }
        Ok(l)
    }

    /// This step as the sliding-window layers see it: its window tables (when it has them)
    /// in place of the block tables.
    pub fn on_window(&self) -> Option<BatchLayout> {
        let w = self.window.as_ref()?;
        Some(BatchLayout {
            slot_mapping: w.slot_mapping.clone(),
            block_tables: w.block_tables.clone(),
            max_blocks: w.max_blocks,
            window: None,
            ..self.clone()
        })
    }
}

/// A step's K/V addressing in the sliding-window layers' own pools
/// ([`crate::kv::KvWindow`]), laid out as [`BatchLayout`]'s.
#[derive(Debug, Clone, Default)]
pub struct WindowTables {
    pub slot_mapping: Vec<u32>,
    /// `[num_seqs, max_blocks]`, padded with 0.
    pub block_tables: Vec<u32>,
    pub max_blocks: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lays_out_mixed_prefill_and_decode() {
        let chunks = vec![
            SeqChunk {
                tokens: vec![5; 18],
                start_pos: 0,
                block_table: vec![3, 7],
                window_table: Vec::new(),
                logits: LogitsWanted::Last,
                adapter: None,
            },
            SeqChunk {
                tokens: vec![9],
                start_pos: 16,
                block_table: vec![1, 2],
                window_table: Vec::new(),
                logits: LogitsWanted::All,
                adapter: None,
            },
        ];
        let l = BatchLayout::new(&chunks, 8).unwrap();
        assert_eq!(l.num_tokens(), 19);
        assert_eq!(l.slot_mapping[0], 3 * 16);
        assert_eq!(l.slot_mapping[17], 7 * 16 + 1);
        assert_eq!(l.slot_mapping[18], 2 * 16);
        assert_eq!(l.positions[18], 16);
        assert_eq!(l.context_lens, vec![18, 17]);
        assert_eq!(l.logits_rows, vec![17, 18]);
        assert_eq!(l.cu_tokens, vec![0, 18, 19]);
    }

    #[test]
    fn rejects_short_block_table_and_bad_ids() {
        let mut c = SeqChunk {
            tokens: vec![1; 17],
            start_pos: 0,
            block_table: vec![0],
            window_table: Vec::new(),
            logits: LogitsWanted::Last,
            adapter: None,
        };
        assert!(BatchLayout::new(std::slice::from_ref(&c), 4).is_err());
        c.block_table = vec![0, 4];
        let e = BatchLayout::new(&[c], 4).unwrap_err().to_string();
        assert!(e.contains("block id 4"), "{e}");
    }
}
