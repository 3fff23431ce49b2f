//! Counter-based randomness: every draw is a pure function of `(seed, position)`.
//!
//! There is no generator state to carry between steps, so a seeded sequence produces the
//! same tokens alone, inside any batch, after preemption/recompute, and (because the hash
//! is plain integer arithmetic) on the CUDA backend too.

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
/// Domain separators so `uniform` and `derive_seed` never hash the same input.
const UNIFORM_DOMAIN: u64 = 0x5EED_0000_0000_0001;
const DERIVE_DOMAIN: u64 = 0x5EED_0000_0000_0002;

/// SplitMix64 finalizer (Steele, Lea & Flood 2014), a bijective 64-bit mixer.
#[inline]
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(GOLDEN);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Uniform in `[0, 1)` (53 random bits) for output position `position` of the stream `seed`.
///
/// Both inputs are hashed before combining, so streams of different seeds are not shifted
/// copies of one another (as they would be with plain `splitmix64(seed + position)`).
#[inline]
pub fn uniform(seed: u64, position: u64) -> f64 {
    let h = splitmix64(splitmix64(seed) ^ splitmix64(position ^ UNIFORM_DOMAIN));
    (h >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Seed of the `index`-th parallel sequence of a request (`n > 1` / `best_of`).
///
/// Index 0 returns `seed` itself, so the first choice of an `n > 1` request reproduces the
/// `n = 1` request with the same seed.
#[inline]
pub fn derive_seed(seed: u64, index: u64) -> u64 {
    if index == 0 {
        seed
    } else {
        splitmix64(seed ^ splitmix64(index ^ DERIVE_DOMAIN))
    }
}
