//! Content hashes of full KV blocks, chained over the parent block's hash so that a hash names
//! the whole prefix up to and including its block. 128 bits of SHA-256: a collision would
//! silently serve another prompt's KV, so a fast non-cryptographic 64-bit hash is not enough.
//! Positions inside a media item are keyed by the item's content hash too (their token ids are
//! only its placeholder); a block without media hashes exactly as it did before media existed.

use sha2::{Digest, Sha256};

use crate::block_pool::BlockHash;
use crate::prompt::PlacedMedia;
use crate::request::AdapterId;

/// The hash of the block holding positions `start .. start + tokens.len()`; `media` are the
/// prompt's items overlapping it.
pub fn block_hash(
    parent: Option<BlockHash>,
    start: usize,
    tokens: &[u32],
    media: &[PlacedMedia],
    adapter: Option<AdapterId>,
) -> BlockHash {
    let mut h = Sha256::new();
    h.update(parent.unwrap_or(0).to_le_bytes());
    h.update([parent.is_some() as u8]);
    match adapter {
        Some(a) => {
            h.update([1u8]);
            h.update(a.to_le_bytes());
        }
        None => h.update([0u8]),
    }
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    for m in media {
        // Which of the item's positions this block holds, and where.
        let from = m.start.max(start);
        h.update([2u8]);
        h.update(m.item.hash.to_le_bytes());
        h.update(((from - m.start) as u64).to_le_bytes());
        h.update(((from - start) as u64).to_le_bytes());
    }
    let d = h.finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(&d[..16]);
    u128::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_depends_on_parent_tokens_and_adapter() {
        let t: Vec<u32> = (0..16).collect();
        let a = block_hash(None, 0, &t, &[], None);
        assert_eq!(a, block_hash(None, 0, &t, &[], None));
        assert_ne!(a, block_hash(Some(a), 0, &t, &[], None));
        assert_ne!(a, block_hash(None, 0, &t, &[], Some(1)));
        assert_ne!(a, block_hash(None, 0, &t[..15], &[], None));
    }

    #[test]
    fn media_positions_are_keyed_by_the_item_hash() {
        use crate::prompt::{MediaSpan, PlacedMedia};
        let item = |hash, start| PlacedMedia {
            start,
            item: MediaSpan {
                placeholder: 9,
                len: 20,
                hash,
                input: None,
            },
        };
        let t = vec![9u32; 16];
        let a = block_hash(None, 16, &t, &[item(1, 10)], None);
        assert_eq!(a, block_hash(None, 16, &t, &[item(1, 10)], None));
        assert_ne!(
            a,
            block_hash(None, 16, &t, &[item(2, 10)], None),
            "another item"
        );
        assert_ne!(
            a,
            block_hash(None, 16, &t, &[item(1, 12)], None),
            "another part of it"
        );
        assert_ne!(a, block_hash(None, 16, &t, &[], None), "placeholders alone");
    }
}
