//! The KV block pool: a fixed arena of blocks with reference counts, an intrusive doubly-linked
//! free list (O(1) allocate, free and remove-from-middle), and the prefix cache: full blocks
//! addressable by a hash of their contents, kept while free until their slot is reused (the free
//! list is the LRU order of eviction). Pinned blocks hold an extra reference and are never evicted.

use std::collections::HashMap;

pub type BlockHash = u128;

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Block {
    ref_cnt: u32,
    hash: Option<BlockHash>,
    prev: u32,
    next: u32,
    in_free_list: bool,
}

#[derive(Debug)]
pub struct BlockPool {
    blocks: Vec<Block>,
    head: u32,
    tail: u32,
    num_free: usize,
    cached: HashMap<BlockHash, u32>,
    pinned: HashMap<BlockHash, u32>,
}

impl BlockPool {
    pub fn new(num_blocks: usize) -> Self {
        let n = num_blocks as u32;
        let blocks = (0..n)
            .map(|i| Block {
                ref_cnt: 0,
                hash: None,
                prev: if i == 0 { NIL } else { i - 1 },
                next: if i + 1 == n { NIL } else { i + 1 },
                in_free_list: true,
            })
            .collect();
        BlockPool {
            blocks,
            head: if n == 0 { NIL } else { 0 },
            tail: if n == 0 { NIL } else { n - 1 },
            num_free: num_blocks,
            cached: HashMap::new(),
            pinned: HashMap::new(),
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks with no reference (some may still hold cached prefixes).
    pub fn num_free(&self) -> usize {
        self.num_free
    }

    pub fn num_used(&self) -> usize {
        self.blocks.len() - self.num_free
    }

    pub fn num_pinned(&self) -> usize {
        self.pinned.len()
    }

    pub fn ref_count(&self, b: u32) -> u32 {
        self.blocks[b as usize].ref_cnt
    }

    /// Takes the least recently freed block, evicting its cached prefix if it had one.
    pub fn allocate(&mut self) -> Option<u32> {
        let b = self.head;
        if b == NIL {
            return None;
        }
        self.unlink(b);
        let blk = &mut self.blocks[b as usize];
        blk.ref_cnt = 1;
        if let Some(h) = blk.hash.take() {
            self.cached.remove(&h);
        }
        Some(b)
    }

    /// Drops one reference. A block that reaches zero joins the free list: at the tail (evicted
    /// last) when it holds a cached prefix, at the head (reused first) otherwise.
    pub fn free(&mut self, b: u32) {
        let blk = &mut self.blocks[b as usize];
        debug_assert!(blk.ref_cnt > 0, "double free of block {b}");
        blk.ref_cnt = blk.ref_cnt.saturating_sub(1);
        if blk.ref_cnt == 0 {
            if blk.hash.is_some() {
                self.push_tail(b);
            } else {
                self.push_head(b);
            }
        }
    }

    /// Adds a reference to a block already in use (sharing between parallel sequences).
    pub fn share(&mut self, b: u32) {
        debug_assert!(self.blocks[b as usize].ref_cnt > 0);
        self.blocks[b as usize].ref_cnt += 1;
    }

    /// Finds a cached block by hash and takes a reference to it.
    pub fn lookup(&mut self, h: BlockHash) -> Option<u32> {
        let &b = self.cached.get(&h)?;
        if self.blocks[b as usize].ref_cnt == 0 {
            self.unlink(b);
        }
        self.blocks[b as usize].ref_cnt += 1;
        Some(b)
    }

    /// Whether a prefix with this hash is cached (without taking it).
    pub fn is_cached(&self, h: BlockHash) -> bool {
        self.cached.contains_key(&h)
    }

    /// Makes a just-filled block addressable by its content hash. A second block with the same
    /// content stays private (block tables are append-only, so duplicates are tolerated).
    pub fn register(&mut self, b: u32, h: BlockHash) {
        if self.blocks[b as usize].hash.is_some() || self.cached.contains_key(&h) {
            return;
        }
        self.blocks[b as usize].hash = Some(h);
        self.cached.insert(h, b);
    }

    /// Pins the cached block with hash `h` (an extra reference held by the pool) so it survives
    /// eviction. Pinning the same prefix twice holds one reference.
    pub fn pin(&mut self, h: BlockHash) -> bool {
        if self.pinned.contains_key(&h) {
            return true;
        }
        match self.lookup(h) {
            Some(b) => {
                self.pinned.insert(h, b);
                true
            }
            None => false,
        }
    }

    pub fn unpin(&mut self, h: BlockHash) {
        if let Some(b) = self.pinned.remove(&h) {
            self.free(b);
        }
    }

    fn unlink(&mut self, b: u32) {
        let (prev, next) = {
            let blk = &self.blocks[b as usize];
            debug_assert!(blk.in_free_list);
            (blk.prev, blk.next)
        };
        if prev == NIL {
            self.head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        let blk = &mut self.blocks[b as usize];
        blk.prev = NIL;
        blk.next = NIL;
        blk.in_free_list = false;
        self.num_free -= 1;
    }

    fn push_tail(&mut self, b: u32) {
        let old = self.tail;
        {
            let blk = &mut self.blocks[b as usize];
            blk.prev = old;
            blk.next = NIL;
            blk.in_free_list = true;
        }
        if old == NIL {
            self.head = b;
        } else {
            self.blocks[old as usize].next = b;
        }
        self.tail = b;
        self.num_free += 1;
    }

    fn push_head(&mut self, b: u32) {
        let old = self.head;
        {
            let blk = &mut self.blocks[b as usize];
            blk.prev = NIL;
            blk.next = old;
            blk.in_free_list = true;
        }
        if old == NIL {
            self.tail = b;
        } else {
            self.blocks[old as usize].prev = b;
        }
        self.head = b;
        self.num_free += 1;
    }

    /// Checks every structural invariant; returns a description of the first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut seen = vec![false; self.blocks.len()];
        let mut count = 0;
        let mut prev = NIL;
        let mut cur = self.head;
        while cur != NIL {
            let blk = &self.blocks[cur as usize];
            if seen[cur as usize] {
                return Err(format!("block {cur} twice in the free list"));
            }
            seen[cur as usize] = true;
            if blk.ref_cnt != 0 || !blk.in_free_list || blk.prev != prev {
                return Err(format!("free-list block {cur} is inconsistent: {blk:?}"));
            }
            count += 1;
            prev = cur;
            cur = blk.next;
        }
        if prev != self.tail {
            return Err("free-list tail is wrong".into());
        }
        if count != self.num_free {
            return Err(format!(
                "free list has {count} blocks, counter says {}",
                self.num_free
            ));
        }
        for (i, blk) in self.blocks.iter().enumerate() {
            if (blk.ref_cnt == 0) != seen[i] {
                return Err(format!(
                    "block {i} with ref {} free-list membership wrong",
                    blk.ref_cnt
                ));
            }
            if let Some(h) = blk.hash
                && self.cached.get(&h) != Some(&(i as u32))
            {
                return Err(format!("block {i} has a hash the cache does not map to it"));
            }
        }
        for (h, &b) in &self.cached {
            if self.blocks[b as usize].hash != Some(*h) {
                return Err(format!(
                    "cache maps a hash to block {b} which holds another"
                ));
            }
        }
        for &b in self.pinned.values() {
            if self.blocks[b as usize].ref_cnt == 0 {
                return Err(format!("pinned block {b} has no reference"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn lru_evicts_oldest_cached_first_and_reuses_uncached_first() {
        let mut p = BlockPool::new(4);
        let a: Vec<u32> = (0..4).map(|_| p.allocate().unwrap()).collect();
        assert!(p.allocate().is_none());
        p.register(a[0], 10);
        p.register(a[1], 11);
        p.free(a[0]); // cached: tail
        p.free(a[1]); // cached: tail, after a0
        p.free(a[2]); // uncached: head
        assert_eq!(p.allocate(), Some(a[2]));
        assert!(p.is_cached(10));
        assert_eq!(
            p.allocate(),
            Some(a[0]),
            "oldest cached block evicted first"
        );
        assert!(!p.is_cached(10) && p.is_cached(11));
        assert_eq!(p.lookup(11), Some(a[1]));
        p.check_invariants().unwrap();
    }

    #[test]
    fn pinned_blocks_survive_eviction() {
        let mut p = BlockPool::new(2);
        let b = p.allocate().unwrap();
        p.register(b, 7);
        assert!(p.pin(7));
        assert!(p.pin(7), "pinning twice is idempotent");
        p.free(b);
        assert_eq!(p.num_free(), 1);
        let other = p.allocate().unwrap();
        assert_ne!(other, b);
        assert!(p.allocate().is_none());
        assert!(p.is_cached(7));
        p.unpin(7);
        assert_eq!(p.num_free(), 1);
        p.check_invariants().unwrap();
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc,
        Free(usize),
        Share(usize),
        Register(usize, u8),
        Lookup(u8),
        Pin(u8),
        Unpin(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => Just(Op::Alloc),
            3 => any::<usize>().prop_map(Op::Free),
            1 => any::<usize>().prop_map(Op::Share),
            2 => (any::<usize>(), any::<u8>()).prop_map(|(i, h)| Op::Register(i, h % 16)),
            2 => any::<u8>().prop_map(|h| Op::Lookup(h % 16)),
            1 => any::<u8>().prop_map(|h| Op::Pin(h % 16)),
            1 => any::<u8>().prop_map(|h| Op::Unpin(h % 16)),
        ]
    }

    proptest! {
        /// Random submit/cancel/finish-like sequences of pool operations keep every invariant,
        /// and reference counts always equal the references the model holds.
        #[test]
        fn random_operations_keep_invariants(ops in proptest::collection::vec(op(), 1..300)) {
            let mut p = BlockPool::new(8);
            let mut held: Vec<u32> = Vec::new();
            let mut pinned: std::collections::HashSet<u8> = Default::default();
            for op in ops {
                match op {
                    Op::Alloc => if let Some(b) = p.allocate() { held.push(b) } else { prop_assert_eq!(p.num_free(), 0) },
                    Op::Free(i) => if !held.is_empty() { let b = held.swap_remove(i % held.len()); p.free(b) },
                    Op::Share(i) => if !held.is_empty() { let b = held[i % held.len()]; p.share(b); held.push(b) },
                    Op::Register(i, h) => if !held.is_empty() { p.register(held[i % held.len()], h as u128) },
                    Op::Lookup(h) => if let Some(b) = p.lookup(h as u128) { held.push(b) },
                    Op::Pin(h) => if p.pin(h as u128) { pinned.insert(h); },
                    Op::Unpin(h) => { p.unpin(h as u128); pinned.remove(&h); },
                }
                p.check_invariants().map_err(TestCaseError::fail)?;
                for b in 0..8u32 {
                    let refs = held.iter().filter(|&&x| x == b).count() as u32
                        + p.pinned.values().filter(|&&x| x == b).count() as u32;
                    prop_assert_eq!(p.ref_count(b), refs, "block {}", b);
                }
            }
            for b in held { p.free(b); }
            for h in pinned { p.unpin(h as u128); }
            prop_assert_eq!(p.num_free(), 8, "pool whole again");
        }
    }
}
