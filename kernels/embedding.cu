// Token embeddings: out[t, :] = table[ids[t], :], bf16 table to f32 rows.
#include "common.cuh"

// One block per token. An id outside the table (never produced by the tokenizer, but a
// request may carry raw ids) gives a zero row instead of reading out of bounds.
extern "C" __global__ void embedding_bf16(float* __restrict__ out, const bf16* __restrict__ table,
                                          const unsigned* __restrict__ ids, unsigned width,
                                          unsigned vocab) {
    const unsigned t = blockIdx.x;
    const unsigned id = ids[t];
    float* o = out + (unsigned long long)t * width;
    if (id >= vocab) {
        for (unsigned i = threadIdx.x; i < width; i += blockDim.x) o[i] = 0.0f;
        return;
    }
    const bf16* row = table + (unsigned long long)id * width;
    for (unsigned i = threadIdx.x; i < width; i += blockDim.x) o[i] = bf16_to_f32(row[i]);
}
