//! Content hashes of full KV blocks, chained over the parent block's hash so that a hash names
//! the whole prefix up to and including its block. 128 bits of SHA-256: a collision would
//! silently serve another prompt's KV, so a fast non-cryptographic 64-bit hash is not enough.

use sha2::{Digest, Sha256};

use crate::block_pool::BlockHash;
use crate::request::AdapterId;

pub fn block_hash(
    parent: Option<BlockHash>,
    tokens: &[u32],
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
        let a = block_hash(None, &t, None);
        assert_eq!(a, block_hash(None, &t, None));
        assert_ne!(a, block_hash(Some(a), &t, None));
        assert_ne!(a, block_hash(None, &t, Some(1)));
        assert_ne!(a, block_hash(None, &t[..15], None));
    }
}
