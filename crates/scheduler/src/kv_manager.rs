//! The KV manager: the block pool, the prefix cache's keys and each sequence's blocks. It
//! decides nothing about who runs; the step loop asks it for room (`grow`, with copy-on-write
//! of a shared partial block), gives blocks back (`release`, `trim`), shares them with forks,
//! and registers or reuses full blocks by their chained hash. It knows sequences only as
//! their [`SeqBlocks`] and token ids, so strategies and sequences never reach into the pool.

use lmi_engine::BLOCK_SIZE;

use crate::block_pool::{BlockHash, BlockPool};
use crate::prefix_hash::block_hash;
use crate::prompt::{PlacedMedia, media_in};
use crate::request::AdapterId;

pub(crate) fn blocks_for(tokens: usize) -> usize {
    tokens.div_ceil(BLOCK_SIZE)
}

/// A sequence's place in the KV cache.
#[derive(Debug, Clone, Default)]
pub(crate) struct SeqBlocks {
    /// Tokens whose K/V are in the cache.
    pub num_computed: usize,
    pub block_table: Vec<u32>,
    /// Hashes of the full blocks registered in the prefix cache, in order.
    pub hashes: Vec<BlockHash>,
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
}

impl KvManager {
    pub fn new(num_blocks: usize) -> Self {
        KvManager {
            pool: BlockPool::new(num_blocks),
        }
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Blocks a request may ever use (pinned prefixes hold theirs for good).
    pub fn usable_blocks(&self) -> usize {
        self.pool.num_blocks() - self.pool.num_pinned()
    }

    /// Makes room for `n` more tokens: copy-on-write of a shared partial block (recorded in
    /// `copies` for the engine), then new blocks. False when the pool is out of blocks.
    pub fn grow(&mut self, kv: &mut SeqBlocks, n: usize, copies: &mut Vec<(u32, u32)>) -> bool {
        let first = kv.num_computed / BLOCK_SIZE;
        if let Some(&b) = kv.block_table.get(first)
            && self.pool.ref_count(b) > 1
        {
            let Some(nb) = self.pool.allocate() else {
                return false;
            };
            copies.push((b, nb));
            self.pool.free(b);
            kv.block_table[first] = nb;
        }
        let need = blocks_for(kv.num_computed + n).saturating_sub(kv.block_table.len());
        if need > self.pool.num_free() {
            return false;
        }
        for _ in 0..need {
            if let Some(b) = self.pool.allocate() {
                kv.block_table.push(b);
            }
        }
        true
    }

    /// The same blocks for a fork: one more reference on each.
    pub fn share(&mut self, kv: &SeqBlocks) -> SeqBlocks {
        for &b in &kv.block_table {
            self.pool.share(b);
        }
        kv.clone()
    }

    /// Gives every block back (full ones stay in the prefix cache until evicted).
    pub fn release(&mut self, kv: &mut SeqBlocks) {
        for &b in kv.block_table.iter().rev() {
            self.pool.free(b);
        }
        *kv = SeqBlocks::default();
    }

    /// Frees the blocks beyond what `len` tokens need (rejected draft tokens).
    pub fn trim(&mut self, kv: &mut SeqBlocks, len: usize) {
        while kv.block_table.len() > blocks_for(len) {
            if let Some(b) = kv.block_table.pop() {
                self.pool.free(b);
            }
        }
    }

    /// Takes the longest cached prefix of full blocks of `tokens`, leaving at least one token
    /// to compute. A hit may end inside a media item (its first positions cached).
    pub fn reuse_prefix(&mut self, kv: &mut SeqBlocks, tokens: &[u32], key: CacheKey<'_>) {
        let max_blocks = (tokens.len() - 1) / BLOCK_SIZE;
        let mut parent = None;
        for b in 0..max_blocks {
            let h = key.hash(parent, b, tokens);
            match self.pool.lookup(h) {
                Some(block) => {
                    kv.block_table.push(block);
                    kv.hashes.push(h);
                    parent = Some(h);
                }
                None => break,
            }
        }
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
        while (kv.hashes.len() + 1) * BLOCK_SIZE <= kv.num_computed {
            let b = kv.hashes.len();
            let h = key.hash(kv.hashes.last().copied(), b, tokens);
            self.pool.register(kv.block_table[b], h);
            if (b + 1) * BLOCK_SIZE <= pin_upto {
                self.pool.pin(h);
            }
            kv.hashes.push(h);
        }
    }
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
        let mut copies = Vec::new();
        assert!(kv.grow(&mut a, 20, &mut copies));
        a.num_computed = 20;
        assert_eq!(a.block_table.len(), 2);
        let mut b = kv.share(&a);
        assert_eq!(kv.pool().num_used(), 2);
        // Writing position 20 of the fork: block 1 (positions 16..32) is shared, so copied.
        assert!(kv.grow(&mut b, 1, &mut copies));
        assert_eq!(copies, vec![(a.block_table[1], b.block_table[1])]);
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
        assert!(kv.grow(&mut a, p1.len(), &mut Vec::new()));
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

    fn key(p: &Prompt) -> CacheKey<'_> {
        CacheKey {
            media: p.media(),
            adapter: None,
        }
    }
}
