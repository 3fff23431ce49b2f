// Split-KV's per-tile rule, shared by the attention kernels (attention.cu,
// attention_prefill.cu) and attention_merge, which must agree on it for every tile.
//
// The host launches gridDim.z splits, an upper bound chosen from the step's shape alone (a
// CUDA graph's key bounds the contexts: crates/engine/src/cuda/attention.rs). Each tile then
// uses only as many of them as its own keys are worth, one per ATT_MIN_SPLIT_KEYS keys that
// its furthest token sees (at least one, at most gridDim.z), read from device memory at run
// time, so a replayed graph adapts to every step's contexts:
// - blocks of splits at or past the tile's count end at once (no rows, no K/V loads);
// - a tile of one split writes its normalized output itself (no partials) and the merge
//   leaves its rows alone;
// - otherwise splits 0 .. count - 1 write partials and the merge combines exactly those, in
//   split order.
// crates/engine/src/cuda/attention.rs mirrors ATT_MIN_SPLIT_KEYS (MIN_SPLIT_KEYS) and the
// rule (tile_splits).
#pragma once

#define ATT_MIN_SPLIT_KEYS 128u

// Keys the furthest token of tile `tile` sees: min(position + 1, context length). Tiles are
// (seq, first, count) triples; a padding row (context 0) sees none.
__device__ __forceinline__ unsigned att_tile_keys(const unsigned* __restrict__ tiles,
                                                  const unsigned* __restrict__ positions,
                                                  const unsigned* __restrict__ context_lens,
                                                  unsigned tile) {
    const unsigned seq = tiles[3 * tile], first = tiles[3 * tile + 1];
    const unsigned count = tiles[3 * tile + 2];
    return min(positions[first + count - 1] + 1u, context_lens[seq]);
}

// The splits a tile of `keys` keys uses out of the launch's `bound` (gridDim.z).
__device__ __forceinline__ unsigned att_tile_splits(unsigned keys, unsigned bound) {
    return max(1u, min(keys / ATT_MIN_SPLIT_KEYS, bound));
}
