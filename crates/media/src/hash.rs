//! A content hash for caching preprocessed media.

use sha2::{Digest, Sha256};

/// The first 128 bits of the SHA-256 of `bytes`, read big-endian: stable across runs, machines
/// and versions (a cache key for the encoded media).
pub fn content_hash(bytes: &[u8]) -> u128 {
    let digest = Sha256::digest(bytes);
    let mut first = [0u8; 16];
    first.copy_from_slice(&digest[..16]);
    u128::from_be_bytes(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_the_start_of_sha256() {
        // sha256("abc") = ba7816bf8f01cfea414140de5dae2223 b00361a396177a9cb410ff61f20015ad
        assert_eq!(content_hash(b"abc"), 0xba7816bf8f01cfea414140de5dae2223);
        // sha256("") = e3b0c44298fc1c149afbf4c8996fb924 27ae41e4649b934ca495991b7852b855
        assert_eq!(content_hash(b""), 0xe3b0c44298fc1c149afbf4c8996fb924);
        assert_ne!(content_hash(b"abd"), content_hash(b"abc"));
    }
}
