// The paged KV pools: [num_blocks, kv_heads, KV_BLOCK, head_dim] bf16 per layer, K and V apart.
#pragma once

#define KV_BLOCK 16u
// A slot the step does not write (padding of a batch replayed as a CUDA graph).
#define NO_SLOT 0xffffffffu

// Offset of KV head g's row for a token at `slot` (block slot / KV_BLOCK, row slot % KV_BLOCK),
// in 64 bits: a pool may pass 2^32 elements.
__device__ __forceinline__ unsigned long long kv_row(unsigned slot, unsigned kv_heads, unsigned g,
                                                     unsigned head_dim) {
    return (((unsigned long long)(slot / KV_BLOCK) * kv_heads + g) * KV_BLOCK + slot % KV_BLOCK) *
           head_dim;
}
