//! A step's layout on the device: every per-token and per-sequence array packed into one
//! upload, and the decode-batch padding that lets a captured CUDA graph serve every step of
//! the same shape.

use lmi_cuda::DevPtr;

use lmi_engine_core::batch::BatchLayout;
use lmi_engine_core::error::{EngineError, Result};
use lmi_engine_core::state::ChunkState;

/// Batch sizes decode steps are padded to; each (size, block-table width, adapters or not)
/// gets its own graph.
pub const GRAPH_BATCH_SIZES: [usize; 15] =
    [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256];

/// The slot of a token whose K/V are not written (padding rows).
pub const NO_SLOT: u32 = u32::MAX;

/// The LoRA slot of an entry that has no adapter (`LORA_NO_SLOT` in kernels/lora.cu).
pub const NO_LORA_SLOT: u32 = u32::MAX;

/// Query tokens of one sequence an attention block takes at once.
pub const ATTENTION_TILE_TOKENS: usize = 16;

pub use lmi_engine_core::backend::GraphKey;

/// The graph keys for batches of at most `max_seqs` sequences with block tables of at most
/// `max_blocks` entries: every padded batch size up to the one `max_seqs` pads to, times every
/// power-of-two width from 16 up to the one `max_blocks` pads to. Steps with adapter rows
/// (`lora`) are captured when first run: their launches depend on the adapters registered
/// by then.
pub fn graph_keys(max_seqs: usize, max_blocks: usize) -> Vec<GraphKey> {
    let largest = GRAPH_BATCH_SIZES
        .iter()
        .copied()
        .find(|&b| b >= max_seqs)
        .unwrap_or(GRAPH_BATCH_SIZES[GRAPH_BATCH_SIZES.len() - 1]);
    let widest = max_blocks.max(16).next_power_of_two();
    let mut keys = Vec::new();
    for &seqs in GRAPH_BATCH_SIZES.iter().filter(|&&b| b <= largest) {
        let mut block_stride = 16;
        while block_stride <= widest {
            keys.push(GraphKey {
                seqs,
                block_stride,
                lora: false,
            });
            block_stride *= 2;
        }
    }
    keys
}

/// Pads a decode-only batch (one new token per sequence) to the next graph batch size, and
/// its block tables to a power-of-two width, so steps of one shape are launched identically.
/// Padding sequences write no K/V (slot [`NO_SLOT`]), attend to nothing (context 0) and have
/// no adapter; their logits rows come after the real ones and are never read.
pub fn pad_decode(mut l: BatchLayout) -> BatchLayout {
    let seqs = l.num_seqs();
    let Some(&size) = GRAPH_BATCH_SIZES.iter().find(|&&b| b >= seqs) else {
        return l;
    };
    let decode_only = seqs > 0
        && l.num_tokens() == seqs
        && l.logits_rows.len() == seqs
        && l.logits_rows
            .iter()
            .enumerate()
            .all(|(i, &r)| r as usize == i);
    if !decode_only {
        return l;
    }
    // One width for both tables, so the window's do not change the graph key.
    let widest = l
        .window
        .as_ref()
        .map_or(0, |w| w.max_blocks)
        .max(l.max_blocks);
    let stride = widest.max(16).next_power_of_two();
    let pad = |tables: &[u32], width: usize| {
        let mut padded = vec![0u32; size * stride];
        for s in 0..seqs {
            padded[s * stride..s * stride + width]
                .copy_from_slice(&tables[s * width..(s + 1) * width]);
        }
        padded
    };
    l.block_tables = pad(&l.block_tables, l.max_blocks);
    l.max_blocks = stride;
    if let Some(w) = l.window.as_mut() {
        w.block_tables = pad(&w.block_tables, w.max_blocks);
        w.max_blocks = stride;
        w.slot_mapping.resize(size, NO_SLOT);
    }
    for s in seqs..size {
        l.token_ids.push(0);
        l.positions.push(0);
        l.slot_mapping.push(NO_SLOT);
        l.token_seq.push(s as u32);
        l.cu_tokens.push(s as u32 + 1);
        l.context_lens.push(0);
        l.logits_rows.push(s as u32);
        l.logits_per_seq.push(1);
        if !l.rope_positions.is_empty() {
            l.rope_positions.extend([0, 0, 0]);
        }
        if !l.states.is_empty() {
            l.states.push(ChunkState::default());
        }
    }
    l
}

/// The graph a layout can be replayed from, if any: padded decode batches.
pub fn graph_key(l: &BatchLayout) -> Option<GraphKey> {
    let seqs = l.num_seqs();
    let shaped = GRAPH_BATCH_SIZES.contains(&seqs)
        && l.num_tokens() == seqs
        && l.logits_rows.len() == seqs
        && l.max_blocks.is_power_of_two()
        && l.max_blocks >= 16
        && !l.host_embeds;
    shaped.then_some(GraphKey {
        seqs,
        block_stride: l.max_blocks,
        lora: !l.adapter_rows.is_empty(),
    })
}

/// A step's adapter rows as the LoRA kernels read them: entries (token row, device slot)
/// sorted by slot, so a kernel block's rows mostly share one adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraEntries {
    pub rows: Vec<u32>,
    pub slots: Vec<u32>,
    /// The device slot of each group of `BatchLayout::adapter_rows`.
    pub group_slots: Vec<u32>,
}

/// The entries of `l`'s adapter rows, each adapter id mapped to its slot by `slot_of`; None
/// without adapter rows. A graph-keyed step gets one entry per token (the rest padding with
/// [`NO_LORA_SLOT`]), so its launches depend on the key alone.
pub fn lora_entries(
    l: &BatchLayout,
    slot_of: impl Fn(u64) -> Option<u32>,
) -> Result<Option<LoraEntries>> {
    if l.adapter_rows.is_empty() {
        return Ok(None);
    }
    let group_slots = l
        .adapter_rows
        .iter()
        .map(|&(id, _)| {
            slot_of(id).ok_or_else(|| {
                EngineError::Batch(format!(
                    "LoRA adapter {id} is not loaded (load it with StepEngine::load_adapter)"
                ))
            })
        })
        .collect::<Result<Vec<u32>>>()?;
    let mut pairs: Vec<(u32, u32)> = l
        .adapter_rows
        .iter()
        .zip(&group_slots)
        .flat_map(|((_, rows), &slot)| rows.iter().map(move |&r| (slot, r)))
        .collect();
    pairs.sort_unstable();
    let (mut slots, mut rows): (Vec<u32>, Vec<u32>) = pairs.into_iter().unzip();
    if graph_key(l).is_some() {
        rows.resize(l.num_tokens(), 0);
        slots.resize(l.num_tokens(), NO_LORA_SLOT);
    }
    Ok(Some(LoraEntries {
        rows,
        slots,
        group_slots,
    }))
}

/// One attention block's queries: `count` tokens of sequence `seq` from flat token `first`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tile {
    pub seq: u32,
    pub first: u32,
    pub count: u32,
}

/// Splits every sequence's new tokens into tiles of at most [`ATTENTION_TILE_TOKENS`].
pub fn attention_tiles(l: &BatchLayout) -> Vec<Tile> {
    let mut tiles = Vec::new();
    for s in 0..l.num_seqs() {
        let (start, end) = (l.cu_tokens[s], l.cu_tokens[s + 1]);
        let mut t = start;
        while t < end {
            let count = (end - t).min(ATTENTION_TILE_TOKENS as u32);
            tiles.push(Tile {
                seq: s as u32,
                first: t,
                count,
            });
            t += count;
        }
    }
    tiles
}

/// The packed step arrays, in upload order (all u32).
#[derive(Debug, Clone, Default)]
pub struct Packed {
    pub bytes: Vec<u8>,
    offsets: Vec<usize>,
}

impl Packed {
    /// Empties the buffer, keeping its memory for the next step.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.offsets.clear();
    }

    fn push(&mut self, v: &[u32]) {
        // 16-byte aligned arrays, so kernels may load them as vectors.
        let at = self.bytes.len().next_multiple_of(16);
        self.bytes.resize(at, 0);
        self.offsets.push(at);
        for x in v {
            self.bytes.extend_from_slice(&x.to_le_bytes());
        }
    }

    fn push_zeros(&mut self, words: usize) {
        let at = self.bytes.len().next_multiple_of(16);
        self.offsets.push(at);
        self.bytes.resize(at + 4 * words, 0);
    }
}

/// Device addresses of a step's arrays (valid until the next step is uploaded).
#[derive(Debug, Clone)]
pub struct CudaStep {
    pub num_tokens: usize,
    pub num_seqs: usize,
    pub token_ids: DevPtr,
    pub positions: DevPtr,
    pub slots: DevPtr,
    pub token_seq: DevPtr,
    /// Per sequence, its first flat token (num_seqs + 1 entries).
    pub seq_start: DevPtr,
    pub context_lens: DevPtr,
    /// `[num_seqs, block_stride]`.
    pub block_tables: DevPtr,
    pub block_stride: usize,
    /// Longest context of the step, in tokens.
    pub max_context: usize,
    pub logits_rows: DevPtr,
    pub num_logits_rows: usize,
    /// `[num_tiles, 3]`: seq, first, count.
    pub tiles: DevPtr,
    pub num_tiles: usize,
    /// `[num_tiles]` u32, zero between launches: attention's count of a tile's finished
    /// split blocks, so the last one merges (kernels/attention_split.cuh).
    pub tile_counters: DevPtr,
    /// M-RoPE models: `[num_tokens, 3]` (time, row, column) rotary positions; null when the
    /// rotary positions are `positions`.
    pub rope_positions: DevPtr,
    /// The step's adapter rows (None without adapters).
    pub lora: Option<LoraRows>,
    /// The sliding-window layers' addressing in their own pools (`BatchLayout::window`).
    pub window: Option<WindowRows>,
    /// The recurrent layers' state slots (`BatchLayout::states`).
    pub states: StateRows,
    pub graph_key: Option<GraphKey>,
}

/// A step's [`ChunkState`]s on the device, packed after every other array so that a graph
/// key's arrays keep their addresses whatever snapshots a step takes (kernels/delta_net.cu).
#[derive(Debug, Clone, Copy)]
pub struct StateRows {
    /// Per sequence, its slot (`u32`; [`lmi_engine_core::state::NO_SLOT`] for padding, and
    /// for every sequence of a step that names no states: the load-time graph capture's).
    pub slots: DevPtr,
    /// Per sequence, its first snapshot (`num_seqs + 1` entries, `u32`).
    pub snap_start: DevPtr,
    /// `(tokens, slot)` pairs (`u32`), every sequence's in turn.
    pub snaps: DevPtr,
}

/// A step's [`lmi_engine_core::batch::WindowTables`] on the device.
#[derive(Debug, Clone, Copy)]
pub struct WindowRows {
    pub slots: DevPtr,
    /// `[num_seqs, block_stride]`, the step's block stride.
    pub block_tables: DevPtr,
    pub block_stride: usize,
}

impl CudaStep {
    /// The step as the sliding-window layers run it: their slots and block tables.
    pub fn on_window(&self) -> Option<CudaStep> {
        let w = self.window?;
        Some(CudaStep {
            slots: w.slots,
            block_tables: w.block_tables,
            block_stride: w.block_stride,
            window: None,
            ..self.clone()
        })
    }
}

/// A step's [`LoraEntries`] on the device.
#[derive(Debug, Clone)]
pub struct LoraRows {
    /// Per entry, its token row (`u32`).
    pub rows: DevPtr,
    /// Per entry, its adapter's slot (`u32`, [`NO_LORA_SLOT`] for padding).
    pub slots: DevPtr,
    pub entries: usize,
    pub group_slots: Vec<u32>,
}

/// Packs `l`'s arrays and its LoRA entries into `p` (cleared first) for one upload; returns
/// the attention tiles.
pub fn pack(l: &BatchLayout, lora: Option<&LoraEntries>, p: &mut Packed) -> Vec<Tile> {
    p.clear();
    let tiles = attention_tiles(l);
    p.push(&l.token_ids);
    p.push(&l.positions);
    p.push(&l.slot_mapping);
    p.push(&l.token_seq);
    p.push(&l.cu_tokens);
    p.push(&l.context_lens);
    p.push(&l.block_tables);
    p.push(&l.logits_rows);
    let flat: Vec<u32> = tiles
        .iter()
        .flat_map(|t| [t.seq, t.first, t.count])
        .collect();
    p.push(&flat);
    // Attention's per-tile counters of finished split blocks (kernels/attention_split.cuh),
    // zero at the start of every step; the kernels leave them at zero after each launch.
    p.push_zeros(tiles.len());
    p.push(&l.rope_positions);
    if let Some(e) = lora {
        p.push(&e.rows);
        p.push(&e.slots);
    }
    if let Some(w) = &l.window {
        p.push(&w.slot_mapping);
        p.push(&w.block_tables);
    }
    push_states(l, p);
    tiles
}

/// The three arrays of [`StateRows`]. Always packed, so that a step of a hybrid model that
/// names no states (the load-time graph capture) still has a slot per sequence: none.
fn push_states(l: &BatchLayout, p: &mut Packed) {
    let seqs = l.num_seqs();
    let state = |s: usize| l.states.get(s);
    let slots: Vec<u32> = (0..seqs)
        .map(|s| state(s).map_or(lmi_engine_core::state::NO_SLOT, |c| c.slot))
        .collect();
    let mut starts = Vec::with_capacity(seqs + 1);
    let mut snaps = Vec::new();
    starts.push(0);
    for s in 0..seqs {
        if let Some(c) = state(s) {
            snaps.extend(c.snapshots.iter().flat_map(|&(t, slot)| [t, slot]));
        }
        starts.push((snaps.len() / 2) as u32);
    }
    p.push(&slots);
    p.push(&starts);
    // Last: its length varies from step to step.
    p.push(&snaps);
}

/// The device view of a layout packed by [`pack`] and uploaded at `base`.
pub fn view(
    l: &BatchLayout,
    p: &Packed,
    tiles: &[Tile],
    lora: Option<LoraEntries>,
    base: DevPtr,
) -> CudaStep {
    let at = |i: usize| base.offset(p.offsets[i]);
    // After the adapter rows' two arrays and the window's two, when the step has them.
    let states = 11 + 2 * usize::from(lora.is_some()) + 2 * usize::from(l.window.is_some());
    CudaStep {
        num_tokens: l.num_tokens(),
        num_seqs: l.num_seqs(),
        token_ids: at(0),
        positions: at(1),
        slots: at(2),
        token_seq: at(3),
        seq_start: at(4),
        context_lens: at(5),
        block_tables: at(6),
        block_stride: l.max_blocks,
        max_context: l.context_lens.iter().copied().max().unwrap_or(0) as usize,
        logits_rows: at(7),
        num_logits_rows: l.logits_rows.len(),
        tiles: at(8),
        num_tiles: tiles.len(),
        tile_counters: at(9),
        rope_positions: if l.rope_positions.is_empty() {
            DevPtr::NULL
        } else {
            at(10)
        },
        window: l.window.as_ref().map(|w| {
            // After the adapter rows' two arrays, when the step has them.
            let i = if lora.is_some() { 13 } else { 11 };
            WindowRows {
                slots: at(i),
                block_tables: at(i + 1),
                block_stride: w.max_blocks,
            }
        }),
        states: StateRows {
            slots: at(states),
            snap_start: at(states + 1),
            snaps: at(states + 2),
        },
        lora: lora.map(|e| LoraRows {
            rows: at(11),
            slots: at(12),
            entries: e.rows.len(),
            group_slots: e.group_slots,
        }),
        graph_key: graph_key(l),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmi_engine_core::batch::{LogitsWanted, SeqChunk};

    fn decode(seqs: usize) -> BatchLayout {
        let chunks: Vec<SeqChunk> = (0..seqs)
            .map(|s| SeqChunk {
                tokens: vec![s as u32 + 1],
                start_pos: 20 + s % 10,
                block_table: vec![2 * s as u32, 2 * s as u32 + 1],
                window_table: Vec::new(),
                logits: LogitsWanted::Last,
                adapter: None,
            })
            .collect();
        BatchLayout::new(&chunks, 2 * seqs).unwrap()
    }

    #[test]
    fn decode_batches_pad_to_a_graph_size() {
        let l = pad_decode(decode(3));
        assert_eq!(l.num_seqs(), 4);
        assert_eq!(l.num_tokens(), 4);
        assert_eq!(l.max_blocks, 16);
        assert_eq!(&l.block_table(2)[..3], &[4, 5, 0]);
        assert_eq!(l.slot_mapping[3], NO_SLOT);
        assert_eq!(l.context_lens[3], 0);
        assert_eq!(l.logits_rows, vec![0, 1, 2, 3]);
        assert_eq!(l.cu_tokens, vec![0, 1, 2, 3, 4]);
        assert_eq!(
            graph_key(&l),
            Some(GraphKey {
                seqs: 4,
                block_stride: 16,
                lora: false,
            })
        );
        // Same shape, same key: the graph is reused.
        assert_eq!(graph_key(&pad_decode(decode(4))), graph_key(&l));
    }

    fn with_adapters(mut chunks: Vec<SeqChunk>, adapters: &[Option<u64>]) -> BatchLayout {
        for (c, &a) in chunks.iter_mut().zip(adapters) {
            c.adapter = a;
        }
        let blocks = 2 * chunks.len();
        BatchLayout::new(&chunks, blocks).unwrap()
    }

    fn decode_chunks(seqs: usize) -> Vec<SeqChunk> {
        (0..seqs)
            .map(|s| SeqChunk {
                tokens: vec![s as u32 + 1],
                start_pos: 20,
                block_table: vec![2 * s as u32, 2 * s as u32 + 1],
                window_table: Vec::new(),
                logits: LogitsWanted::Last,
                adapter: None,
            })
            .collect()
    }

    #[test]
    fn window_tables_pad_with_the_block_tables() {
        let mut chunks = decode_chunks(3);
        for (s, c) in chunks.iter_mut().enumerate() {
            c.window_table = vec![lmi_engine_core::batch::NO_BLOCK, s as u32];
        }
        let mut l = BatchLayout::new(&chunks, 6).unwrap();
        l.window = Some(l.window_tables(&chunks, 3, 4).unwrap());
        let l = pad_decode(l);
        let w = l.window.as_ref().unwrap();
        assert_eq!((l.max_blocks, w.max_blocks), (16, 16));
        assert_eq!(&w.block_tables[16..19], &[0, 1, 0]);
        assert_eq!(w.slot_mapping, vec![4, 16 + 4, 2 * 16 + 4, NO_SLOT]);
        assert_eq!(l.slot_mapping.len(), 4);
        // Packed after the other arrays: the view's window rows are its own.
        let mut p = Packed::default();
        let tiles = pack(&l, None, &mut p);
        let base = DevPtr::NULL.offset(4096);
        let v = view(&l, &p, &tiles, None, base);
        let on = v.on_window().unwrap();
        assert_ne!(on.slots, v.slots);
        assert_ne!(on.block_tables, v.block_tables);
        assert_eq!(on.block_stride, 16);
        assert!(on.window.is_none());
    }

    #[test]
    fn decode_batches_with_adapters_get_a_lora_key_and_one_entry_per_row() {
        let slot_of = |id: u64| [(7, 2), (9, 0)].iter().find(|p| p.0 == id).map(|p| p.1);
        let l = pad_decode(with_adapters(
            decode_chunks(5),
            &[Some(7), None, Some(9), Some(7), None],
        ));
        assert_eq!(l.num_seqs(), 8);
        let key = graph_key(&l).unwrap();
        assert!(key.lora);
        let e = lora_entries(&l, slot_of).unwrap().unwrap();
        // Sorted by slot, then padded with no-adapter entries to the key's row count.
        assert_eq!(e.rows, vec![2, 0, 3, 0, 0, 0, 0, 0]);
        assert_eq!(e.slots[..3], [0, 2, 2]);
        assert!(e.slots[3..].iter().all(|&s| s == NO_LORA_SLOT));
        assert_eq!(e.group_slots, vec![2, 0]);
        // Another mix of adapters, same key: the same launches replay.
        let other = pad_decode(with_adapters(
            decode_chunks(5),
            &[None, Some(9), None, None, Some(9)],
        ));
        assert_eq!(graph_key(&other), Some(key));
        let no_adapters = pad_decode(with_adapters(decode_chunks(5), &[]));
        assert!(!graph_key(&no_adapters).unwrap().lora);
        assert_eq!(lora_entries(&no_adapters, slot_of).unwrap(), None);

        // A prefill step lists only its adapter rows; an unknown adapter is refused.
        let mut chunks = decode_chunks(3);
        chunks[1].tokens = vec![4; 3];
        let ragged = with_adapters(chunks, &[Some(9), Some(7), None]);
        assert_eq!(graph_key(&ragged), None);
        let e = lora_entries(&ragged, slot_of).unwrap().unwrap();
        assert_eq!((e.rows, e.slots), (vec![0, 1, 2, 3], vec![0, 2, 2, 2]));
        let err = lora_entries(&ragged, |_| None).unwrap_err().to_string();
        assert!(err.contains("LoRA adapter 9 is not loaded"), "{err}");

        // The entries follow the tiles in the upload, 16-byte aligned.
        let mut p = Packed::default();
        let entries = lora_entries(&l, slot_of).unwrap();
        let tiles = pack(&l, entries.as_ref(), &mut p);
        let v = view(&l, &p, &tiles, entries, DevPtr(0x1000));
        let lora = v.lora.unwrap();
        assert_eq!(lora.entries, 8);
        assert!(lora.rows.0.is_multiple_of(16) && lora.slots.0.is_multiple_of(16));
        let o = (lora.slots.0 - 0x1000) as usize + 4;
        assert_eq!(p.bytes[o..o + 4], 2u32.to_le_bytes());
    }

    #[test]
    fn prefill_and_large_batches_are_not_padded() {
        let chunks = vec![SeqChunk {
            tokens: vec![1; 20],
            start_pos: 0,
            block_table: vec![0, 1],
            window_table: Vec::new(),
            logits: LogitsWanted::Last,
            adapter: None,
        }];
        let l = pad_decode(BatchLayout::new(&chunks, 4).unwrap());
        assert_eq!(l.num_tokens(), 20);
        assert_eq!(graph_key(&l), None);
        let tiles = attention_tiles(&l);
        assert_eq!(
            tiles,
            vec![
                Tile {
                    seq: 0,
                    first: 0,
                    count: 16
                },
                Tile {
                    seq: 0,
                    first: 16,
                    count: 4
                }
            ]
        );
        let big = pad_decode(decode(300));
        assert_eq!(big.num_seqs(), 300);
        assert_eq!(graph_key(&big), None);
    }

    /// Each sequence's state slot and snapshots go up after every other array; padding
    /// sequences, and every sequence of a step that names no states, have no slot; a graph
    /// key's state arrays keep their addresses whatever snapshots a step takes.
    #[test]
    fn state_slots_pack_last_and_padding_has_none() {
        let read = |p: &Packed, base: u64, ptr: DevPtr, n: usize| -> Vec<u32> {
            let o = (ptr.0 - base) as usize;
            p.bytes[o..o + 4 * n]
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
                .collect()
        };
        let with_states = |snaps: Vec<(u32, u32)>| {
            let mut l = decode(3);
            l.states = vec![
                ChunkState::in_slot(5),
                ChunkState {
                    slot: 6,
                    snapshots: snaps,
                },
                ChunkState::in_slot(7),
            ];
            pad_decode(l)
        };
        let base = 0x1000;
        let (mut p, mut q) = (Packed::default(), Packed::default());
        let l = with_states(vec![(1, 9)]);
        let tiles = pack(&l, None, &mut p);
        let v = view(&l, &p, &tiles, None, DevPtr(base));
        let none = lmi_engine_core::state::NO_SLOT;
        assert_eq!(read(&p, base, v.states.slots, 4), vec![5, 6, 7, none]);
        assert_eq!(read(&p, base, v.states.snap_start, 5), vec![0, 0, 1, 1, 1]);
        assert_eq!(read(&p, base, v.states.snaps, 2), vec![1, 9]);
        let last = *p.offsets.last().unwrap();
        assert_eq!((v.states.snaps.0 - base) as usize, last, "snapshots last");

        let other = with_states(Vec::new());
        let tiles = pack(&other, None, &mut q);
        let w = view(&other, &q, &tiles, None, DevPtr(base));
        assert_eq!(graph_key(&other), graph_key(&l));
        assert_eq!(
            (w.states.slots, w.states.snap_start, w.states.snaps),
            (v.states.slots, v.states.snap_start, v.states.snaps)
        );

        // The load-time capture's steps name no states: no sequence has a slot.
        let bare = pad_decode(decode(3));
        let tiles = pack(&bare, None, &mut q);
        let b = view(&bare, &q, &tiles, None, DevPtr(base));
        assert_eq!(read(&q, base, b.states.slots, 4), vec![none; 4]);
        assert_eq!(read(&q, base, b.states.snap_start, 5), vec![0; 5]);
    }

    #[test]
    fn packs_aligned_arrays() {
        let l = pad_decode(decode(3));
        let mut p = Packed::default();
        let tiles = pack(&l, None, &mut p);
        let v = view(&l, &p, &tiles, None, DevPtr(0x1000));
        assert_eq!(v.token_ids, DevPtr(0x1000));
        for ptr in [v.positions, v.slots, v.block_tables, v.tiles] {
            assert_eq!(ptr.0 % 16, 0);
        }
        let read = |ptr: DevPtr, i: usize| {
            let o = (ptr.0 - 0x1000) as usize + 4 * i;
            u32::from_le_bytes(p.bytes[o..o + 4].try_into().unwrap())
        };
        assert_eq!(read(v.positions, 2), 22);
        assert_eq!(read(v.block_tables, 16 + 1), 3);
        assert_eq!(v.num_tiles, 4);
        assert_eq!(v.max_context, 23);
    }
}
