// Small row-wise ops: residual adds, scaling, biases, row gathers and f32 → bf16 conversion.
#include "common.cuh"
#include "rows.cuh"

#define GRID_STRIDE(e, n)                                                                    \
    for (unsigned long long e = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; \
         e < (n); e += (unsigned long long)gridDim.x * blockDim.x)

// residual += delta
extern "C" __global__ void add_f32(float* __restrict__ residual, const float* __restrict__ delta,
                                   unsigned long long n) {
    GRID_STRIDE(e, n) residual[e] += delta[e];
}

// x *= s (Gemma's embedding scale)
extern "C" __global__ void scale_f32(float* __restrict__ x, float s, unsigned long long n) {
    GRID_STRIDE(e, n) x[e] *= s;
}

// x = cap · tanh(x / cap) (Gemma 4's final logit soft-capping)
extern "C" __global__ void softcap_f32(float* __restrict__ x, float cap, unsigned long long n) {
    GRID_STRIDE(e, n) x[e] = tanhf(x[e] / cap) * cap;
}

// out[r, :] += bias, rows of `width`, `n` values in all (rows.cuh: no division).
extern "C" __global__ void add_bias_f32(float* __restrict__ out, const float* __restrict__ bias,
                                        unsigned width, unsigned long long n) {
    FOR_ROWS(r, width, n) {
        float* o = out + r * width;
        FOR_COLS(c, width) o[c] += bias[c];
    }
}

// out[i, :] = x[rows[i], :], rows of `width` f32, `n` values of out in all.
extern "C" __global__ void gather_rows_f32(float* __restrict__ out, const float* __restrict__ x,
                                           const unsigned* __restrict__ rows, unsigned width,
                                           unsigned long long n) {
    FOR_ROWS(r, width, n) {
        float* o = out + r * width;
        const float* src = x + (unsigned long long)rows[r] * width;
        FOR_COLS(c, width) o[c] = src[c];
    }
}

// out[rows[i], :] = x[i, :]: host rows (a vision encoder's embeddings) put in place of the
// placeholder tokens' embeddings; rows of `width` f32, `n` values of x in all.
extern "C" __global__ void scatter_rows_f32(float* __restrict__ out, const float* __restrict__ x,
                                            const unsigned* __restrict__ rows, unsigned width,
                                            unsigned long long n) {
    FOR_ROWS(r, width, n) {
        float* o = out + (unsigned long long)rows[r] * width;
        const float* src = x + r * width;
        FOR_COLS(c, width) o[c] = src[c];
    }
}

// out[rows[i], :] += x[i, :]: host rows (Qwen3-VL's DeepStack features) added to the hidden
// states of the media tokens; rows are distinct, so no two blocks write one row.
extern "C" __global__ void scatter_add_rows_f32(float* __restrict__ out, const float* __restrict__ x,
                                                const unsigned* __restrict__ rows, unsigned width,
                                                unsigned long long n) {
    FOR_ROWS(r, width, n) {
        float* o = out + (unsigned long long)rows[r] * width;
        const float* src = x + r * width;
        FOR_COLS(c, width) o[c] += src[c];
    }
}

extern "C" __global__ void f32_to_bf16_rows(bf16* __restrict__ out, const float* __restrict__ x,
                                            unsigned long long n) {
    GRID_STRIDE(e, n) out[e] = f32_to_bf16(x[e]);
}

extern "C" __global__ void bf16_to_f32_rows(float* __restrict__ out, const bf16* __restrict__ x,
                                            unsigned long long n) {
    GRID_STRIDE(e, n) out[e] = bf16_to_f32(x[e]);
}
