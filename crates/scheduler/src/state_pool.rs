//! The engine's recurrent-state slots (models with linear-attention layers, see
//! `lmi_engine_core::state`), as the KV manager hands them out: one per running sequence, a
//! backup for a sequence whose draft is being verified, and prefix snapshots — the state
//! after a full block, cached under that block's hash so that a later request with the same
//! prefix resumes from it. Cached snapshots are evicted least recently used when a slot is
//! needed. The pool knows slots, not what fills them.

use std::collections::HashMap;

use crate::block_pool::BlockHash;

#[derive(Debug)]
pub(crate) struct StatePool {
    slots: usize,
    free: Vec<u32>,
    /// Snapshot slots by the hash of the block they end, with their last use.
    cached: HashMap<BlockHash, (u32, u64)>,
    clock: u64,
}

impl StatePool {
    pub fn new(slots: usize) -> Self {
        StatePool {
            slots,
            free: (0..slots as u32).rev().collect(),
            cached: HashMap::new(),
            clock: 0,
        }
    }

    pub fn num_slots(&self) -> usize {
        self.slots
    }

    /// Slots held by sequences (not free, not cached snapshots).
    pub fn num_used(&self) -> usize {
        self.slots - self.free.len() - self.cached.len()
    }

    pub fn num_cached(&self) -> usize {
        self.cached.len()
    }

    /// A slot: a free one, else the least recently used snapshot's. None when every slot is
    /// held by a sequence.
    pub fn allocate(&mut self) -> Option<u32> {
        if let Some(s) = self.free.pop() {
            return Some(s);
        }
        let (&h, &(slot, _)) = self.cached.iter().min_by_key(|(_, (_, used))| *used)?;
        self.cached.remove(&h);
        Some(slot)
    }

    pub fn free(&mut self, slot: u32) {
        debug_assert!(!self.free.contains(&slot), "state slot {slot} freed twice");
        self.free.push(slot);
    }

    pub fn is_cached(&self, h: BlockHash) -> bool {
        self.cached.contains_key(&h)
    }

    /// The snapshot after block `h`, marked as just used.
    pub fn lookup(&mut self, h: BlockHash) -> Option<u32> {
        self.clock += 1;
        let e = self.cached.get_mut(&h)?;
        e.1 = self.clock;
        Some(e.0)
    }

    /// Keeps `slot` as the snapshot after block `h` (or frees it when `h` has one already).
    pub fn register(&mut self, slot: u32, h: BlockHash) {
        self.clock += 1;
        if self.cached.contains_key(&h) {
            self.free(slot);
        } else {
            self.cached.insert(h, (slot, self.clock));
        }
    }

    /// Every slot accounted for exactly once (tests).
    #[cfg(test)]
    pub fn check_invariants(&self, held: usize) -> Result<(), String> {
        let cached: Vec<u32> = self.cached.values().map(|&(s, _)| s).collect();
        let mut all: Vec<u32> = self.free.iter().chain(&cached).copied().collect();
        all.sort_unstable();
        all.dedup();
        if all.len() != self.free.len() + cached.len() {
            return Err("a slot is both free and cached, or twice in one".into());
        }
        if self.num_used() != held {
            return Err(format!("{} slots in use, {held} held", self.num_used()));
        }
        Ok(())
    }
}
