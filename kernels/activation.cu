// Gated MLP activations, each input row holding [gate | up]: SwiGLU, out[r, i] =
// silu(gate[r, i]) * up[r, i], and GeGLU (Gemma), gelu_tanh(gate[r, i]) * up[r, i]; and the
// plain GELUs in place (encoders' MLPs, a vision merger's), erf or tanh form.
#include "common.cuh"
#include "rows.cuh"

// gelu_pytorch_tanh: g/2 · (1 + tanh(√(2/π) · (g + 0.044715 g³))) (the CPU backend's formula).
__device__ __forceinline__ float gelu_tanh_one(float g) {
    const float t = tanhf(0.7978846f * (g + 0.044715f * g * g * g));
    return 0.5f * g * (1.0f + t);
}

__device__ __forceinline__ float gelu_tanh_mul_one(float g, float u) { return gelu_tanh_one(g) * u; }

// nn.GELU() / BERT's `gelu`: x/2 · (1 + erf(x / √2)).
__device__ __forceinline__ float gelu_erf_one(float x) {
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
}

// Rows of `width` outputs, `n` in all: rows in y, columns in x (rows.cuh: no division).
#define GATED(NAME, TOut, ONE)                                                                 \
    extern "C" __global__ void NAME(TOut* __restrict__ out, const float* __restrict__ gate_up, \
                                    unsigned width, unsigned long long n) {                    \
        FOR_ROWS(r, width, n) {                                                                \
            TOut* o = out + r * width;                                                         \
            const float* g = gate_up + 2 * r * width;                                          \
            const float* u = g + width;                                                        \
            FOR_COLS(c, width) store_f32(o, c, ONE(g[c], u[c]));                               \
        }                                                                                      \
    }
GATED(silu_mul_f32, float, silu_mul_one)
GATED(silu_mul_bf16, bf16, silu_mul_one)
GATED(gelu_tanh_mul_f32, float, gelu_tanh_mul_one)
GATED(gelu_tanh_mul_bf16, bf16, gelu_tanh_mul_one)

// In place over n values (grid-stride).
#define GELU_IN_PLACE(NAME, ONE)                                                                 \
    extern "C" __global__ void NAME(float* __restrict__ x, unsigned long long n) {               \
        for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;   \
             i < n; i += (unsigned long long)gridDim.x * blockDim.x)                             \
            x[i] = ONE(x[i]);                                                                    \
    }
GELU_IN_PLACE(gelu_erf_f32, gelu_erf_one)
GELU_IN_PLACE(gelu_tanh_f32, gelu_tanh_one)

// Gemma 4's per-layer input gate, in place: x[r, c] = gelu_tanh(x[r, c]) · other[r · stride +
// offset + c] for rows of `width`, `n` values of x in all (its layer's slice of the per-layer
// inputs).
extern "C" __global__ void gelu_tanh_mul_slice_f32(float* __restrict__ x,
                                                   const float* __restrict__ other, unsigned width,
                                                   unsigned stride, unsigned offset,
                                                   unsigned long long n) {
    FOR_ROWS(r, width, n) {
        float* row = x + r * width;
        const float* u = other + r * stride + offset;
        FOR_COLS(c, width) row[c] = gelu_tanh_mul_one(row[c], u[c]);
    }
}
