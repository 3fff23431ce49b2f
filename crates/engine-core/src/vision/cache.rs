//! The encoder cache: a media item's embeddings by content hash, kept outside the KV cache in
//! a least-recently-used set bounded in bytes, so an item repeated within a request (or sent
//! again soon after) is encoded once.

use std::collections::HashMap;
use std::sync::Arc;

pub struct EncoderCache {
    items: HashMap<u128, (Arc<Vec<f32>>, u64)>,
    bytes: usize,
    capacity: usize,
    clock: u64,
    pub hits: u64,
    pub misses: u64,
}

impl EncoderCache {
    /// A cache holding at most `capacity` bytes of embeddings (an item larger than that is
    /// still returned, just not kept).
    pub fn new(capacity: usize) -> Self {
        EncoderCache {
            items: HashMap::new(),
            bytes: 0,
            capacity,
            clock: 0,
            hits: 0,
            misses: 0,
        }
    }

    pub fn get(&mut self, hash: u128) -> Option<Arc<Vec<f32>>> {
        self.clock += 1;
        let now = self.clock;
        match self.items.get_mut(&hash) {
            Some((e, used)) => {
                *used = now;
                self.hits += 1;
                Some(e.clone())
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    pub fn insert(&mut self, hash: u128, embeds: Arc<Vec<f32>>) {
        let size = embeds.len() * 4;
        if size > self.capacity || self.items.contains_key(&hash) {
            return;
        }
        while self.bytes + size > self.capacity {
            let Some((&oldest, _)) = self.items.iter().min_by_key(|(_, (_, used))| *used) else {
                break;
            };
            if let Some((e, _)) = self.items.remove(&oldest) {
                self.bytes -= e.len() * 4;
            }
        }
        self.clock += 1;
        self.bytes += size;
        self.items.insert(hash, (embeds, self.clock));
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_least_recently_used_within_its_bytes() {
        let mut c = EncoderCache::new(3 * 16);
        for h in 0..3u128 {
            c.insert(h, Arc::new(vec![h as f32; 4]));
        }
        assert!(c.get(0).is_some());
        c.insert(3, Arc::new(vec![3.0; 4]));
        assert!(c.get(1).is_none(), "1 was the least recently used");
        assert!(c.get(0).is_some() && c.get(2).is_some() && c.get(3).is_some());
        assert_eq!(c.bytes(), 48);
        c.insert(9, Arc::new(vec![0.0; 100]));
        assert!(c.get(9).is_none(), "larger than the cache: not kept");
    }
}
