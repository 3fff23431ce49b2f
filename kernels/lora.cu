// LoRA for the rows of one adapter (rows grouped by adapter, as SGMV does):
// shrink t = x[rows] · Aᵀ, then expand out[rows, offset ..] += t · Bᵀ (scale folded into B).
#include "common.cuh"

// Block per row; warp w computes ranks w, w + warps, ...; lanes split the input width.
template <typename TX>
__device__ __forceinline__ void lora_shrink_row(float* __restrict__ t, const TX* __restrict__ x,
                                                const bf16* __restrict__ a,
                                                const unsigned* __restrict__ rows,
                                                unsigned x_width, unsigned rank) {
    const unsigned i = blockIdx.x;
    const TX* xr = x + (unsigned long long)rows[i] * x_width;
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (unsigned r = warp; r < rank; r += warps) {
        const bf16* ar = a + (unsigned long long)r * x_width;
        float s = 0.0f;
        for (unsigned k = lane; k < x_width; k += 32) s += load_f32(xr, k) * bf16_to_f32(ar[k]);
        s = warp_sum(s);
        if (lane == 0) t[(unsigned long long)i * rank + r] = s;
    }
}

#define LORA_SHRINK(NAME, TX)                                                                   \
    extern "C" __global__ void NAME(float* __restrict__ t, const TX* __restrict__ x,           \
                                    const bf16* __restrict__ a,                                \
                                    const unsigned* __restrict__ rows, unsigned x_width,       \
                                    unsigned rank) {                                           \
        lora_shrink_row(t, x, a, rows, x_width, rank);                                          \
    }
LORA_SHRINK(lora_shrink_f32, float)
LORA_SHRINK(lora_shrink_bf16, bf16)

// Grid (output tiles, rows): thread n of row i adds Σ_r t[i, r] · b[n, r].
extern "C" __global__ void lora_expand(float* __restrict__ out, const float* __restrict__ t,
                                       const bf16* __restrict__ b,
                                       const unsigned* __restrict__ rows, unsigned rank,
                                       unsigned n_out, unsigned out_width, unsigned out_offset) {
    const unsigned i = blockIdx.y;
    const unsigned n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= n_out) return;
    const float* ti = t + (unsigned long long)i * rank;
    const bf16* bn = b + (unsigned long long)n * rank;
    float s = 0.0f;
    for (unsigned r = 0; r < rank; r++) s += ti[r] * bf16_to_f32(bn[r]);
    out[(unsigned long long)rows[i] * out_width + out_offset + n] += s;
}
