// Split-KV's per-tile rule and merge, shared by the attention kernels (attention.cu,
// attention_prefill.cu), which must agree on the rule for every tile.
//
// The host launches gridDim.z splits, an upper bound chosen from the step's shape alone (a
// CUDA graph's key bounds the contexts: crates/engine-cuda/src/attention.rs). Each tile then
// uses only as many of them as its own keys are worth, one per ATT_MIN_SPLIT_KEYS keys that
// its furthest token sees (at least one, at most gridDim.z), read from device memory at run
// time, so a replayed graph adapts to every step's contexts:
// - blocks of splits at or past the tile's count end at once (no rows, no K/V loads);
// - a tile of one split writes its normalized output itself (no partials) and the merge
//   leaves its rows alone;
// - otherwise splits 0 .. count - 1 write partials, and the last of the tile's blocks to
//   finish (over its KV heads and splits, counted in tile_counters) merges exactly those, in
//   split order (att_merge_if_last): no merge launch, and the same bits whichever block
//   finishes last.
// crates/engine-cuda/src/attention.rs mirrors ATT_MIN_SPLIT_KEYS (MIN_SPLIT_KEYS) and the
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

// Keys `count` tokens from `first` see together where each token's row sees through
// `through[t]` (at least its own position): the furthest min(limit + 1, context length).
__device__ __forceinline__ unsigned att_seen_keys(const unsigned* __restrict__ positions,
                                                  const unsigned* __restrict__ through,
                                                  unsigned first, unsigned count, unsigned ctx) {
    unsigned keys = 0u;
    for (unsigned t = first; t < first + count; t++)
        keys = max(keys, min(max(positions[t], through[t]) + 1u, ctx));
    return keys;
}

// The splits a tile of `keys` keys uses out of the launch's `bound` (gridDim.z).
__device__ __forceinline__ unsigned att_tile_splits(unsigned keys, unsigned bound) {
    return max(1u, min(keys / ATT_MIN_SPLIT_KEYS, bound));
}

// Called by every block of a tile that wrote partials (the tile has `splits` > 1), after its
// last write. The tile's counter (zeroed by the step upload, crates/engine-cuda/src/step.rs)
// counts its finished blocks; the one that brings it to gridDim.y * splits merges the tile's
// rows for all q heads, then zeroes the counter for the next launch (the next layer, or a
// graph replay). Each writer fences its partials before the count (the classic last-block
// reduction), and the merger reads them through L2 (__ldcg), never a stale L1 line.
// out[row] = sum_s 2^(m_s - M) o_s / sum_s 2^(m_s - M) l_s, M = max_s m_s, in split order.
template <typename TOut>
__device__ __forceinline__ void att_merge_if_last(TOut* __restrict__ out,
                                                  const float* __restrict__ part_o,
                                                  const float2* __restrict__ part_ml,
                                                  unsigned* __restrict__ tile_counters,
                                                  const unsigned* __restrict__ tiles,
                                                  unsigned splits, unsigned num_tokens,
                                                  unsigned q_heads, unsigned head_dim) {
    __shared__ unsigned last_s;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned done = atomicAdd(&tile_counters[blockIdx.x], 1u) + 1u;
        last_s = done == gridDim.y * splits;
    }
    __syncthreads();
    if (!last_s) return;
    __threadfence();
    const unsigned lane = threadIdx.x & 31u, warps = blockDim.x >> 5;
    const unsigned long long rows = (unsigned long long)num_tokens * q_heads;
    const unsigned long long first = (unsigned long long)tiles[3 * blockIdx.x + 1] * q_heads;
    const unsigned tile_rows = tiles[3 * blockIdx.x + 2] * q_heads;
    for (unsigned r = threadIdx.x >> 5; r < tile_rows; r += warps) {
        const unsigned long long row = first + r;
        float m = LMI_NEG_INF;
        for (unsigned s = 0; s < splits; s++) m = fmaxf(m, __ldcg(&part_ml[s * rows + row]).x);
        const float base = m == LMI_NEG_INF ? 0.0f : m;
        float l = 0.0f;
        for (unsigned s = 0; s < splits; s++) {
            const float2 ml = __ldcg(&part_ml[s * rows + row]);
            l += exp2f(ml.x - base) * ml.y;
        }
        for (unsigned d = lane; d < head_dim; d += 32) {
            float o = 0.0f;
            for (unsigned s = 0; s < splits; s++)
                o += exp2f(__ldcg(&part_ml[s * rows + row]).x - base) *
                     __ldcg(&part_o[(s * rows + row) * head_dim + d]);
            store_f32(out, row * head_dim + d, l > 0.0f ? o / l : 0.0f);
        }
    }
    if (threadIdx.x == 0) tile_counters[blockIdx.x] = 0u;
}
