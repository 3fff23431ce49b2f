// The paged KV pools: [num_blocks, kv_heads, BLOCK, head_dim] bf16 per layer, K and V apart.
#include "common.cuh"

#define KV_BLOCK 16u
// A slot the step does not write (padding of a batch replayed as a CUDA graph).
#define NO_SLOT 0xffffffffu

// Block per token: each token's k and v heads (f32 in its fused QKV row) stored at its slot,
// rounded to bf16.
extern "C" __global__ void write_kv(bf16* __restrict__ k_cache, bf16* __restrict__ v_cache,
                                    const float* __restrict__ qkv,
                                    const unsigned* __restrict__ slots, unsigned row_width,
                                    unsigned q_heads, unsigned kv_heads, unsigned head_dim) {
    const unsigned slot = slots[blockIdx.x];
    if (slot == NO_SLOT) return;
    const unsigned long long block = slot / KV_BLOCK, off = slot % KV_BLOCK;
    const float* row = qkv + (unsigned long long)blockIdx.x * row_width;
    const float* k = row + (unsigned long long)q_heads * head_dim;
    const float* v = k + (unsigned long long)kv_heads * head_dim;
    const unsigned n = kv_heads * head_dim;
    for (unsigned e = threadIdx.x; e < n; e += blockDim.x) {
        const unsigned g = e / head_dim, i = e % head_dim;
        const unsigned long long dst = ((block * kv_heads + g) * KV_BLOCK + off) * head_dim + i;
        k_cache[dst] = f32_to_bf16(k[e]);
        v_cache[dst] = f32_to_bf16(v[e]);
    }
}

// Block per (src, dst) pair: copies whole blocks of `block_elems` bf16 values (copy-on-write
// of a block shared by parallel sequences).
extern "C" __global__ void copy_blocks(bf16* __restrict__ cache, const unsigned* __restrict__ pairs,
                                       unsigned block_elems) {
    const unsigned long long src = pairs[2 * blockIdx.x], dst = pairs[2 * blockIdx.x + 1];
    const bf16* s = cache + src * block_elems;
    bf16* d = cache + dst * block_elems;
    for (unsigned i = threadIdx.x; i < block_elems; i += blockDim.x) d[i] = s[i];
}
