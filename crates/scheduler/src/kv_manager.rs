//! The KV manager: the block pool, the prefix cache's keys and each sequence's blocks. It
//! decides nothing about who runs; the step loop asks it for room (`grow`, with copy-on-write
//! of a shared partial block), gives blocks back (`release`, `trim`), shares them with forks,
//! and registers or reuses full blocks by their chained hash. It knows sequences only as
//! their [`SeqBlocks`] and token ids, so strategies and sequences never reach into the pool.
//!
//! A model with linear-attention layers also keeps a recurrent state per sequence in slots
//! of the engine's ([`StatePool`]): a sequence takes one with its first blocks, a fork gets a
//! copy, a prefix hit needs a snapshot of the state where the hit ends (taken during an earlier
//! request's prefill, at the block where a later prompt branched off or at its prompt's last
//! full block), and a draft under verification a backup to roll back to. State copies queue
//! here for the engine to make before the step ([`KvManager::take_state_copies`]).
//!
//! When the engine keeps its sliding-window layers' K/V apart ([`KvWindow`]), a second pool
//! holds those, and each sequence a second table: a block leaves it (back to the pool, still
//! cached by its hash) once no later token's window reaches it. A prefix hit then also needs
//! the window blocks before its end, so it is cut back to the longest prefix that has them.

use lmi_engine_core::{BLOCK_SIZE, KvWindow, NO_BLOCK};

use lmi_engine_core::ChunkState;

use crate::block_pool::{BlockHash, BlockPool};
use crate::prefix_hash::block_hash;
use crate::prompt::{PlacedMedia, media_in};
use crate::request::AdapterId;
use crate::state_pool::StatePool;

pub(crate) fn blocks_for(tokens: usize) -> usize {
    tokens.div_ceil(BLOCK_SIZE)
}

/// A sequence's place in the KV cache.
#[derive(Debug, Clone, Default)]
pub(crate) struct SeqBlocks {
    /// Tokens whose K/V are in the cache.
    pub num_computed: usize,
    pub block_table: Vec<u32>,
    /// Blocks in the window pool, covering the same positions; [`NO_BLOCK`] where given
    /// back. Empty without a window pool.
    pub window_table: Vec<u32>,
    /// Entries of `window_table` before this one have been considered for giving back.
    pub window_from: usize,
    /// Full prompt blocks whose last window the window table keeps until release, so that
    /// the same prompt again (a retry, an evaluation's repeated context) continues from the
    /// prefix cache: its hit ends there and needs those blocks.
    pub hold_blocks: usize,
    /// Hashes of the full blocks registered in the prefix cache, in order.
    pub hashes: Vec<BlockHash>,
    /// Models with recurrent layers: the slot holding the state after `num_computed` tokens.
    pub state_slot: Option<u32>,
    /// Token counts after which to snapshot the state for the prefix cache (not planned yet).
    pub snapshot_at: Vec<usize>,
    /// Snapshots planned into steps: `(tokens, slot)`, cached once their block is registered.
    pub snapshots: Vec<(usize, u32)>,
    /// A draft under verification: the tokens computed before its step, and the slot holding
    /// the state then (restored if part of the draft is rejected).
    pub rollback: Option<(usize, u32)>,
}

impl SeqBlocks {
    /// A new sequence's (empty) blocks, holding the last window of its prompt's full blocks.
    pub fn for_prompt(prompt_len: usize) -> Self {
        SeqBlocks {
            hold_blocks: prompt_len.saturating_sub(1) / BLOCK_SIZE,
            ..Default::default()
        }
    }
}

/// Copy-on-write block copies for the engine, in each pool.
#[derive(Debug, Default)]
pub(crate) struct BlockCopies {
    pub full: Vec<(u32, u32)>,
    pub window: Vec<(u32, u32)>,
}

/// What a sequence's KV depends on besides its token ids: the prompt's media items and the
/// adapter.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CacheKey<'a> {
    pub media: &'a [PlacedMedia],
    pub adapter: Option<AdapterId>,
}

impl CacheKey<'_> {
    fn hash(&self, parent: Option<BlockHash>, block: usize, tokens: &[u32]) -> BlockHash {
        let range = block * BLOCK_SIZE..(block + 1) * BLOCK_SIZE;
        let media = media_in(self.media, range.clone());
        block_hash(parent, range.start, &tokens[range], media, self.adapter)
    }
}

#[derive(Debug)]
pub(crate) struct KvManager {
    pool: BlockPool,
    /// The sliding-window layers' pool and their window (tokens).
    window: Option<(BlockPool, usize)>,
    /// The recurrent-state slots, for a model with linear-attention layers.
    state: Option<StatePool>,
    /// State copies `src → dst` the engine makes before the next step, in order.
    state_copies: Vec<(u32, u32)>,
}

impl KvManager {
    #[cfg(test)]
    pub fn new(num_blocks: usize) -> Self {
        KvManager {
            pool: BlockPool::new(num_blocks),
            window: None,
            state: None,
            state_copies: Vec::new(),
        }
    }

    /// A manager for an engine that keeps `window` pools for its sliding-window layers.
    pub fn with_window(num_blocks: usize, window: Option<KvWindow>) -> Self {
        KvManager {
            pool: BlockPool::new(num_blocks),
            window: window.map(|w| (BlockPool::new(w.blocks), w.size)),
            state: None,
            state_copies: Vec::new(),
        }
    }

    /// Keeps `slots` recurrent-state slots (the engine's).
    pub fn with_states(mut self, slots: usize) -> Self {
        self.state = Some(StatePool::new(slots));
        self
    }

    pub fn state_pool(&self) -> Option<&StatePool> {
        self.state.as_ref()
    }

    /// The state copies to make before the next step.
    pub fn take_state_copies(&mut self) -> Vec<(u32, u32)> {
        std::mem::take(&mut self.state_copies)
    }

    /// A step's chunk of `kv` over tokens `start .. end`: its slot and the snapshots planned
    /// inside it. None for a model without recurrent layers.
    pub fn chunk_state(&self, kv: &SeqBlocks, start: usize, end: usize) -> Option<ChunkState> {
        self.state.as_ref()?;
        Some(ChunkState {
            slot: kv.state_slot?,
            snapshots: kv
                .snapshots
                .iter()
                .filter(|&&(at, _)| at > start && at <= end)
                .map(|&(at, slot)| ((at - start) as u32, slot))
                .collect(),
        })
    }

    /// Keeps the state as it is before a draft's verification step, to roll back to if part
    /// of the draft is rejected. False when no slot is free (verify without a draft then).
    pub fn checkpoint_state(&mut self, kv: &mut SeqBlocks) -> bool {
        let Some(state) = self.state.as_mut() else {
            return true;
        };
        let Some(own) = kv.state_slot else {
            return false;
        };
        if kv.rollback.is_some() {
            return true;
        }
        let Some(backup) = state.allocate() else {
            return false;
        };
        self.state_copies.push((own, backup));
        kv.rollback = Some((kv.num_computed, backup));
        true
    }

    /// After a draft's verification: with `all_accepted` the state stands; otherwise it goes
    /// back to the checkpoint and the tokens after it are computed again. Returns the tokens
    /// whose state and K/V stand.
    pub fn settle_state(&mut self, kv: &mut SeqBlocks, all_accepted: bool) -> Option<usize> {
        let (start, backup) = kv.rollback.take()?;
        let state = self.state.as_mut()?;
        if !all_accepted && let Some(own) = kv.state_slot {
            self.state_copies.push((backup, own));
            state.free(backup);
            return Some(start);
        }
        state.free(backup);
        None
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// The window pool, when there is one.
    pub fn window_pool(&self) -> Option<&BlockPool> {
        self.window.as_ref().map(|(p, _)| p)
    }

    /// Blocks a request may ever use (pinned prefixes hold theirs for good).
    pub fn usable_blocks(&self) -> usize {
        self.pool.num_blocks() - self.pool.num_pinned()
    }

    /// Makes room for `n` more tokens: copy-on-write of a shared partial block (recorded in
    /// `copies` for the engine), then new blocks. False when the pool is out of blocks.
    pub fn grow(&mut self, kv: &mut SeqBlocks, n: usize, copies: &mut BlockCopies) -> bool {
        let end = kv.num_computed + n;
        if let Some(state) = self.state.as_mut()
            && kv.state_slot.is_none()
        {
            match state.allocate() {
                Some(s) => kv.state_slot = Some(s),
                None => return false,
            }
        }
        if !self.grow_blocks(kv, end, copies) {
            return false;
        }
        // Snapshots inside this chunk, where a slot is to be had.
        if let Some(state) = self.state.as_mut() {
            let from = kv.num_computed;
            for at in std::mem::take(&mut kv.snapshot_at) {
                if at <= from {
                    continue;
                }
                if at > end {
                    kv.snapshot_at.push(at);
                    continue;
                }
                if let Some(slot) = state.allocate() {
                    kv.snapshots.push((at, slot));
                }
            }
        }
        true
    }

    fn grow_blocks(&mut self, kv: &mut SeqBlocks, end: usize, copies: &mut BlockCopies) -> bool {
        if !grow_table(
            &mut self.pool,
            &mut kv.block_table,
            kv.num_computed,
            end,
            &mut copies.full,
        ) {
            return false;
        }
        let Some((pool, size)) = self.window.as_mut() else {
            return true;
        };
        // Blocks no later token's window reaches go back first, so the room is there (but
        // the prompt's last window stays until release).
        let keep = KvWindow::first_needed(*size, kv.num_computed).min(kv.window_table.len());
        let hold = kv.hold_blocks;
        let held = KvWindow::first_needed(*size, hold * BLOCK_SIZE).min(hold)..hold;
        for i in kv.window_from.min(keep)..keep {
            let b = &mut kv.window_table[i];
            if *b != NO_BLOCK && !held.contains(&i) {
                pool.free(std::mem::replace(b, NO_BLOCK));
            }
        }
        kv.window_from = kv.window_from.max(keep);
        grow_table(
            pool,
            &mut kv.window_table,
            kv.num_computed,
            end,
            &mut copies.window,
        )
    }

    /// The same blocks for a fork: one more reference on each, and a copy of the state in a
    /// slot of its own. When no slot is left for it, the fork starts over from nothing (it
    /// recomputes its tokens, from the prefix cache where it can).
    pub fn share(&mut self, kv: &SeqBlocks) -> SeqBlocks {
        let mut fork = SeqBlocks {
            hold_blocks: kv.hold_blocks,
            ..Default::default()
        };
        if let Some(state) = self.state.as_mut() {
            match (kv.state_slot, state.allocate()) {
                (Some(src), Some(dst)) => {
                    self.state_copies.push((src, dst));
                    fork.state_slot = Some(dst);
                }
                (_, slot) => {
                    if let Some(s) = slot {
                        state.free(s);
                    }
                    return fork;
                }
            }
        }
        for &b in &kv.block_table {
            self.pool.share(b);
        }
        if let Some((pool, _)) = self.window.as_mut() {
            for &b in kv.window_table.iter().filter(|&&b| b != NO_BLOCK) {
                pool.share(b);
            }
        }
        SeqBlocks {
            num_computed: kv.num_computed,
            block_table: kv.block_table.clone(),
            window_table: kv.window_table.clone(),
            window_from: kv.window_from,
            hashes: kv.hashes.clone(),
            ..fork
        }
    }

    /// Gives every block back (full ones stay in the prefix cache until evicted).
    pub fn release(&mut self, kv: &mut SeqBlocks) {
        let hold = kv.hold_blocks;
        for &b in kv.block_table.iter().rev() {
            self.pool.free(b);
        }
        if let Some((pool, _)) = self.window.as_mut() {
            for &b in kv.window_table.iter().rev().filter(|&&b| b != NO_BLOCK) {
                pool.free(b);
            }
        }
        if let Some(state) = self.state.as_mut() {
            let snapshots = kv.snapshots.iter().map(|&(_, s)| s);
            let backup = kv.rollback.map(|(_, s)| s);
            for s in kv.state_slot.into_iter().chain(snapshots).chain(backup) {
                state.free(s);
            }
        }
        *kv = SeqBlocks {
            hold_blocks: hold,
            ..Default::default()
        };
    }

    /// Frees the blocks beyond what `len` tokens need (rejected draft tokens).
    pub fn trim(&mut self, kv: &mut SeqBlocks, len: usize) {
        while kv.block_table.len() > blocks_for(len) {
            if let Some(b) = kv.block_table.pop() {
                self.pool.free(b);
            }
        }
        if let Some((pool, _)) = self.window.as_mut() {
            while kv.window_table.len() > blocks_for(len).max(kv.window_from) {
                if let Some(b) = kv.window_table.pop().filter(|&b| b != NO_BLOCK) {
                    pool.free(b);
                }
            }
        }
    }

    /// Takes the longest cached prefix of full blocks of `tokens`, leaving at least one token
    /// to compute. A hit may end inside a media item (its first positions cached).
    pub fn reuse_prefix(&mut self, kv: &mut SeqBlocks, tokens: &[u32], key: CacheKey<'_>) {
        let max_blocks = (tokens.len() - 1) / BLOCK_SIZE;
        let mut hashes: Vec<BlockHash> = Vec::new();
        for b in 0..max_blocks {
            let h = key.hash(hashes.last().copied(), b, tokens);
            if !self.pool.is_cached(h) {
                break;
            }
            hashes.push(h);
        }
        // With a window pool: the longest hit whose last window is cached there too.
        let mut hit = hashes.len();
        if let Some((pool, size)) = &self.window {
            while hit > 0
                && !(KvWindow::first_needed(*size, hit * BLOCK_SIZE)..hit)
                    .all(|b| pool.is_cached(hashes[b]))
            {
                hit -= 1;
            }
        }
        // With recurrent layers: the longest hit whose state after it is snapshot, and the
        // state copied from there. The blocks cached beyond it mark where this prompt leaves
        // an earlier one: a snapshot there (and at this prompt's last full block) lets the
        // next request with either prefix skip it all.
        if let Some(state) = self.state.as_mut() {
            let cached = hit;
            while hit > 0 && !state.is_cached(hashes[hit - 1]) {
                hit -= 1;
            }
            let snap = match hit {
                0 => None,
                _ => state.lookup(hashes[hit - 1]),
            };
            if let Some(snap) = snap {
                match state.allocate() {
                    Some(own) => {
                        self.state_copies.push((snap, own));
                        kv.state_slot = Some(own);
                    }
                    None => hit = 0,
                }
            }
            let last_full = max_blocks * BLOCK_SIZE;
            kv.snapshot_at = [cached * BLOCK_SIZE, last_full]
                .into_iter()
                .filter(|&at| at > hit * BLOCK_SIZE)
                .collect();
            kv.snapshot_at.dedup();
        }
        hashes.truncate(hit);
        for &h in &hashes {
            if let Some(block) = self.pool.lookup(h) {
                kv.block_table.push(block);
            }
        }
        if let Some((pool, size)) = self.window.as_mut() {
            let from = KvWindow::first_needed(*size, hit * BLOCK_SIZE).min(hit);
            kv.window_table = vec![NO_BLOCK; from];
            kv.window_from = from;
            for &h in &hashes[from..] {
                if let Some(block) = pool.lookup(h) {
                    kv.window_table.push(block);
                }
            }
        }
        kv.hashes = hashes;
        kv.num_computed = kv.block_table.len() * BLOCK_SIZE;
    }

    /// Registers the newly full blocks of `kv` in the prefix cache, pinning those inside the
    /// first `pin_upto` tokens.
    pub fn register_full_blocks(
        &mut self,
        kv: &mut SeqBlocks,
        tokens: &[u32],
        key: CacheKey<'_>,
        pin_upto: usize,
    ) {
        // Window blocks a pinned prefix keeps: those a hit at its end needs.
        let pin_blocks = pin_upto / BLOCK_SIZE;
        let window_pin_from = self.window.as_ref().map_or(0, |(_, size)| {
            KvWindow::first_needed(*size, pin_blocks * BLOCK_SIZE)
        });
        while (kv.hashes.len() + 1) * BLOCK_SIZE <= kv.num_computed {
            let b = kv.hashes.len();
            let h = key.hash(kv.hashes.last().copied(), b, tokens);
            self.pool.register(kv.block_table[b], h);
            let pinned = b < pin_blocks;
            if pinned {
                self.pool.pin(h);
            }
            if let Some((pool, _)) = self.window.as_mut()
                && let Some(&wb) = kv.window_table.get(b)
                && wb != NO_BLOCK
            {
                pool.register(wb, h);
                if pinned && b >= window_pin_from {
                    pool.pin(h);
                }
            }
            if let Some(state) = self.state.as_mut()
                && let Some(i) = kv
                    .snapshots
                    .iter()
                    .position(|&(at, _)| at == (b + 1) * BLOCK_SIZE)
            {
                let (_, slot) = kv.snapshots.swap_remove(i);
                state.register(slot, h);
            }
            kv.hashes.push(h);
        }
    }
}

/// Makes `table` cover positions `..end` for tokens written from `start`: copy-on-write of a
/// shared block at `start` (recorded in `copies`), then new blocks. False when `pool` is out
/// of blocks.
fn grow_table(
    pool: &mut BlockPool,
    table: &mut Vec<u32>,
    start: usize,
    end: usize,
    copies: &mut Vec<(u32, u32)>,
) -> bool {
    let first = start / BLOCK_SIZE;
    if let Some(&b) = table.get(first)
        && b != NO_BLOCK
        && pool.ref_count(b) > 1
    {
        let Some(nb) = pool.allocate() else {
            return false;
        };
        copies.push((b, nb));
        pool.free(b);
        table[first] = nb;
    }
    let need = blocks_for(end).saturating_sub(table.len());
    if need > pool.num_free() {
        return false;
    }
    for _ in 0..need {
        if let Some(b) = pool.allocate() {
            table.push(b);
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prompt::{MediaSpan, Prompt, Span};

    const TEXT: CacheKey<'static> = CacheKey {
        media: &[],
        adapter: None,
    };

    #[test]
    fn a_fork_copies_the_shared_partial_block_before_writing_it() {
        let mut kv = KvManager::new(8);
        let mut a = SeqBlocks::default();
        let mut copies = BlockCopies::default();
        assert!(kv.grow(&mut a, 20, &mut copies));
        a.num_computed = 20;
        assert_eq!(a.block_table.len(), 2);
        let mut b = kv.share(&a);
        assert_eq!(kv.pool().num_used(), 2);
        // Writing position 20 of the fork: block 1 (positions 16..32) is shared, so copied.
        assert!(kv.grow(&mut b, 1, &mut copies));
        assert_eq!(copies.full, vec![(a.block_table[1], b.block_table[1])]);
        assert_eq!(a.block_table[0], b.block_table[0]);
        assert_eq!(kv.pool().ref_count(a.block_table[0]), 2);
        assert_eq!(kv.pool().ref_count(a.block_table[1]), 1);
        // The fork trims back to what 16 tokens need; both release everything.
        kv.trim(&mut b, 16);
        assert_eq!(b.block_table.len(), 1);
        kv.release(&mut a);
        kv.release(&mut b);
        assert_eq!(kv.pool().num_used(), 0);
        kv.pool().check_invariants().unwrap();
    }

    #[test]
    fn prefixes_are_reused_by_token_ids_and_media_hash() {
        let mut kv = KvManager::new(16);
        let image = |hash| {
            Prompt::from_spans([
                Span::Text(vec![1; 8]),
                Span::Media(MediaSpan {
                    placeholder: 7,
                    len: 30,
                    hash,
                    input: None,
                }),
                Span::Text(vec![2; 3]),
            ])
        };
        let (p1, p2) = (image(1), image(2));
        let mut a = SeqBlocks::default();
        assert!(kv.grow(&mut a, p1.len(), &mut BlockCopies::default()));
        a.num_computed = p1.len();
        kv.register_full_blocks(&mut a, &p1, key(&p1), 0);
        assert_eq!(a.hashes.len(), 2);

        let mut same = SeqBlocks::default();
        kv.reuse_prefix(&mut same, &p1, key(&p1));
        assert_eq!(same.num_computed, 32);
        let mut other = SeqBlocks::default();
        kv.reuse_prefix(&mut other, &p2, key(&p2));
        assert_eq!(other.num_computed, 0, "same placeholder ids, another item");
        let mut text = SeqBlocks::default();
        kv.reuse_prefix(&mut text, &p1, TEXT);
        assert_eq!(text.num_computed, 0, "the ids alone are not the item");
        for s in [&mut a, &mut same, &mut other, &mut text] {
            kv.release(s);
        }
        kv.pool().check_invariants().unwrap();
    }

    #[test]
    fn window_blocks_leave_the_table_and_a_hit_needs_its_last_window() {
        let window = KvWindow { blocks: 6, size: 8 };
        let mut kv = KvManager::with_window(32, Some(window));
        let tokens: Vec<u32> = (0..41).collect();
        let mut copies = BlockCopies::default();
        let mut a = SeqBlocks::default();
        assert!(kv.grow(&mut a, 40, &mut copies));
        a.num_computed = 40;
        kv.register_full_blocks(&mut a, &tokens, TEXT, 0);
        assert_eq!((a.block_table.len(), a.window_table.len()), (3, 3));
        // Position 40 reads keys 33..=40: blocks 0 and 1 leave the window table.
        assert!(kv.grow(&mut a, 1, &mut copies));
        assert_eq!(&a.window_table[..2], &[NO_BLOCK; 2]);
        assert_eq!(a.window_from, 2);
        assert_eq!(kv.window_pool().unwrap().num_used(), 1);
        assert_eq!(kv.pool().num_used(), 3);

        // The same tokens hit both full blocks: the window pool still caches block 1, the
        // only one a token at 32 reads.
        let mut b = SeqBlocks::default();
        kv.reuse_prefix(&mut b, &tokens, TEXT);
        assert_eq!(b.num_computed, 32);
        assert_eq!((b.window_from, b.window_table.len()), (1, 2));
        let mut fork = kv.share(&b);
        kv.release(&mut b);
        kv.release(&mut fork);
        // Another sequence takes the whole window pool: the cached window blocks are evicted
        // and a hit has nothing to continue from.
        let mut c = SeqBlocks::default();
        assert!(kv.grow(&mut c, 5 * BLOCK_SIZE, &mut copies));
        assert!(!kv.grow(&mut SeqBlocks::default(), 1, &mut copies));
        let mut d = SeqBlocks::default();
        kv.reuse_prefix(&mut d, &tokens, TEXT);
        assert_eq!(
            (d.num_computed, d.block_table.len(), d.window_table.len()),
            (0, 0, 0)
        );
        for s in [&mut a, &mut c, &mut d] {
            kv.release(s);
        }
        assert_eq!(kv.window_pool().unwrap().num_used(), 0);
        kv.pool().check_invariants().unwrap();
        kv.window_pool().unwrap().check_invariants().unwrap();
        assert!(copies.window.is_empty());
    }

    #[test]
    fn a_rejected_draft_trims_both_tables() {
        let window = KvWindow { blocks: 8, size: 8 };
        let mut kv = KvManager::with_window(16, Some(window));
        let mut copies = BlockCopies::default();
        let mut a = SeqBlocks::default();
        assert!(kv.grow(&mut a, 30, &mut copies));
        a.num_computed = 30;
        // Position 30 and a 20-token draft: blocks 1..4 in both tables, block 0 out of the
        // window (it reads from 23).
        assert!(kv.grow(&mut a, 21, &mut copies));
        assert_eq!((a.block_table.len(), a.window_table.len()), (4, 4));
        assert_eq!(a.window_table[0], NO_BLOCK);
        // Two tokens kept: 32 tokens need two blocks; the given-back entry stays given back.
        kv.trim(&mut a, 32);
        assert_eq!((a.block_table.len(), a.window_table.len()), (2, 2));
        assert_eq!(a.window_table[0], NO_BLOCK);
        assert_eq!(kv.window_pool().unwrap().num_used(), 1);
        kv.release(&mut a);
        assert_eq!(kv.window_pool().unwrap().num_used(), 0);
        kv.window_pool().unwrap().check_invariants().unwrap();
    }

    #[test]
    fn a_pinned_prefix_keeps_the_window_a_hit_at_its_end_needs() {
        let window = KvWindow {
            blocks: 8,
            size: 20,
        };
        let mut kv = KvManager::with_window(16, Some(window));
        let tokens: Vec<u32> = (100..170).collect();
        let mut a = SeqBlocks::default();
        assert!(kv.grow(&mut a, 64, &mut BlockCopies::default()));
        a.num_computed = 64;
        // 48 pinned tokens: the global pool pins blocks 0..3; a hit at 48 reads from 29, so
        // the window pool pins blocks 1 and 2 only.
        kv.register_full_blocks(&mut a, &tokens, TEXT, 48);
        assert_eq!(kv.pool().num_pinned(), 3);
        assert_eq!(kv.window_pool().unwrap().num_pinned(), 2);
        kv.release(&mut a);
        // Another sequence fills the window pool but for the pinned blocks: the pinned prefix
        // still hits in full.
        let mut c = SeqBlocks::default();
        assert!(kv.grow(&mut c, 6 * BLOCK_SIZE, &mut BlockCopies::default()));
        let mut b = SeqBlocks::default();
        kv.reuse_prefix(&mut b, &tokens[..49], TEXT);
        assert_eq!(b.num_computed, 48);
        assert_eq!(&b.window_table[..1], &[NO_BLOCK]);
        for s in [&mut b, &mut c] {
            kv.release(s);
        }
        kv.window_pool().unwrap().check_invariants().unwrap();
    }

    /// Recurrent state: a slot with the first blocks, a copy for a fork, a snapshot at the
    /// prompt's last full block that the same prefix resumes from, and one where a later
    /// prompt branches off an earlier one (its blocks were cached, its state was not).
    #[test]
    fn state_slots_follow_sequences_forks_and_prefix_snapshots() {
        let mut kv = KvManager::new(32).with_states(6);
        let tokens: Vec<u32> = (0..50).collect();
        let mut a = SeqBlocks::default();
        kv.reuse_prefix(&mut a, &tokens, TEXT);
        assert_eq!((a.num_computed, a.snapshot_at.clone()), (0, vec![48]));
        let mut copies = BlockCopies::default();
        assert!(kv.grow(&mut a, 50, &mut copies));
        let own = a.state_slot.unwrap();
        let cs = kv.chunk_state(&a, 0, 50).unwrap();
        assert_eq!(cs.slot, own);
        assert_eq!(cs.snapshots.len(), 1);
        assert_eq!(cs.snapshots[0].0, 48);
        let snap = cs.snapshots[0].1;
        a.num_computed = 50;
        kv.register_full_blocks(&mut a, &tokens, TEXT, 0);
        assert!(a.snapshots.is_empty(), "registered with block 2");
        // A fork: a slot of its own, the state copied into it before the next step.
        let mut f = kv.share(&a);
        let fs = f.state_slot.unwrap();
        assert_ne!(fs, own);
        assert_eq!(kv.take_state_copies(), vec![(own, fs)]);
        kv.release(&mut a);
        kv.release(&mut f);
        kv.state_pool().unwrap().check_invariants(0).unwrap();
        assert_eq!(kv.state_pool().unwrap().num_cached(), 1);

        // The same 48 tokens and another tail: the whole hit, its state from the snapshot.
        let mut b_tokens = tokens[..48].to_vec();
        b_tokens.extend([900, 901, 902]);
        let mut b = SeqBlocks::default();
        kv.reuse_prefix(&mut b, &b_tokens, TEXT);
        assert_eq!(b.num_computed, 48);
        let bs = b.state_slot.unwrap();
        assert_eq!(kv.take_state_copies(), vec![(snap, bs)]);
        kv.release(&mut b);

        // Only the first two blocks in common: their K/V are cached, their state is not, so
        // the prompt is computed from the start and snapshots where it branched off.
        let mut c_tokens = tokens[..40].to_vec();
        c_tokens.extend(700..730);
        let mut c = SeqBlocks::default();
        kv.reuse_prefix(&mut c, &c_tokens, TEXT);
        assert_eq!(c.num_computed, 0);
        assert_eq!(c.snapshot_at, vec![32, 64]);
        assert!(kv.take_state_copies().is_empty());
        assert!(kv.grow(&mut c, 40, &mut copies));
        assert_eq!(
            c.snapshots.len(),
            1,
            "32 is inside the first chunk, 64 is not"
        );
        assert_eq!(c.snapshot_at, vec![64]);
        kv.release(&mut c);
        kv.state_pool().unwrap().check_invariants(0).unwrap();
    }

    /// A draft's verification keeps the state before it; a rejected token rolls it back.
    #[test]
    fn a_rejected_draft_rolls_the_state_back() {
        let mut kv = KvManager::new(8).with_states(3);
        let mut a = SeqBlocks::default();
        assert!(kv.grow(&mut a, 10, &mut BlockCopies::default()));
        a.num_computed = 10;
        let own = a.state_slot.unwrap();
        assert!(kv.checkpoint_state(&mut a));
        let (at, backup) = a.rollback.unwrap();
        assert_eq!(at, 10);
        assert_eq!(kv.take_state_copies(), vec![(own, backup)]);
        assert_eq!(kv.settle_state(&mut a, false), Some(10));
        assert_eq!(kv.take_state_copies(), vec![(backup, own)]);
        assert!(kv.checkpoint_state(&mut a));
        assert_eq!(kv.settle_state(&mut a, true), None);
        kv.state_pool().unwrap().check_invariants(1).unwrap();
        // Every slot held: no checkpoint (the draft is dropped), no room for a new sequence.
        let mut b = SeqBlocks::default();
        let mut c = SeqBlocks::default();
        assert!(kv.grow(&mut b, 1, &mut BlockCopies::default()));
        assert!(kv.grow(&mut c, 1, &mut BlockCopies::default()));
        assert!(!kv.checkpoint_state(&mut a));
        assert!(!kv.grow(&mut SeqBlocks::default(), 1, &mut BlockCopies::default()));
        for s in [&mut a, &mut b, &mut c] {
            kv.release(s);
        }
        kv.state_pool().unwrap().check_invariants(0).unwrap();
    }

    fn key(p: &Prompt) -> CacheKey<'_> {
        CacheKey {
            media: p.media(),
            adapter: None,
        }
    }
}
