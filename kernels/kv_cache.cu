// The paged KV pools (kv_cache.cuh): K/V writes and copy-on-write block copies.
#include "common.cuh"
#include "kv_cache.cuh"

// Block (token, KV head): the head's k and v values (f32 in the token's fused QKV row) stored
// at its slot, rounded to bf16. (The model's layers write K/V through qk_norm_rope_write_kv in
// rope.cu; this is Backend::write_kv.)
extern "C" __global__ void write_kv(bf16* __restrict__ k_cache, bf16* __restrict__ v_cache,
                                    const float* __restrict__ qkv,
                                    const unsigned* __restrict__ slots, unsigned row_width,
                                    unsigned q_heads, unsigned kv_heads, unsigned head_dim) {
    const unsigned slot = slots[blockIdx.x];
    if (slot == NO_SLOT) return;
    const unsigned g = blockIdx.y;
    const float* k = qkv + (unsigned long long)blockIdx.x * row_width + (q_heads + g) * head_dim;
    const float* v = k + kv_heads * head_dim;
    const unsigned long long dst = kv_row(slot, kv_heads, g, head_dim);
    for (unsigned i = threadIdx.x; i < head_dim; i += blockDim.x) {
        k_cache[dst + i] = f32_to_bf16(k[i]);
        v_cache[dst + i] = f32_to_bf16(v[i]);
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
