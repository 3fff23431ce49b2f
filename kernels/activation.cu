// SwiGLU: out[r, i] = silu(gate[r, i]) * up[r, i], each input row holding [gate | up].
#include "common.cuh"

// σ from exp(-|g|) never overflows (the CPU backend's formulation).
template <typename TOut>
__device__ __forceinline__ void silu_mul_at(TOut* out, const float* gate_up, unsigned width,
                                            unsigned long long e) {
    const unsigned long long r = e / width, i = e % width;
    const float g = gate_up[r * 2 * width + i], u = gate_up[r * 2 * width + width + i];
    const float x = expf(-fabsf(g));
    const float sigmoid = g >= 0.0f ? 1.0f / (1.0f + x) : x / (1.0f + x);
    store_f32(out, e, g * sigmoid * u);
}

#define SILU_MUL(NAME, TOut)                                                                   \
    extern "C" __global__ void NAME(TOut* __restrict__ out, const float* __restrict__ gate_up, \
                                    unsigned width, unsigned long long n) {                    \
        for (unsigned long long e = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; \
             e < n; e += (unsigned long long)gridDim.x * blockDim.x)                          \
            silu_mul_at(out, gate_up, width, e);                                              \
    }
SILU_MUL(silu_mul_f32, float)
SILU_MUL(silu_mul_bf16, bf16)
