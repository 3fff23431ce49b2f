// RMSNorm: out = x / sqrt(mean(x²) + eps) * w, per row; the fused residual form; the
// per-head form of Qwen3's q_norm / k_norm; and LayerNorm with a bias (encoders, vision
// towers). One block per row (or per head), every sum reduced in a fixed order.
#include "common.cuh"

template <typename TOut>
__device__ __forceinline__ void rms_norm_row(TOut* __restrict__ out, const float* __restrict__ x,
                                             const float* __restrict__ w, unsigned width, float eps) {
    __shared__ float scratch[32];
    float ss = 0.0f;
    for (unsigned i = threadIdx.x; i < width; i += blockDim.x) ss += x[i] * x[i];
    ss = block_sum(ss, scratch);
    const float inv = rsqrtf(ss / (float)width + eps);
    for (unsigned i = threadIdx.x; i < width; i += blockDim.x) store_f32(out, i, x[i] * inv * w[i]);
}

#define RMS_NORM(NAME, TOut)                                                                   \
    extern "C" __global__ void NAME(TOut* __restrict__ out, const float* __restrict__ x,     \
                                    const float* __restrict__ w, unsigned width, float eps) { \
        const unsigned long long r = blockIdx.x;                                              \
        rms_norm_row(out + r * width, x + r * width, w, width, eps);                         \
    }
RMS_NORM(rms_norm_f32, float)
RMS_NORM(rms_norm_bf16, bf16)

// residual += delta, then out = rms_norm(residual) * w. Each thread re-reads only the
// elements it wrote, so no barrier is needed between the two passes.
#define ADD_RMS_NORM(NAME, TOut)                                                              \
    extern "C" __global__ void NAME(TOut* __restrict__ out, float* __restrict__ residual,    \
                                    const float* __restrict__ delta,                         \
                                    const float* __restrict__ w, unsigned width, float eps) { \
        const unsigned long long r = blockIdx.x;                                             \
        float* res = residual + r * width;                                                   \
        const float* d = delta + r * width;                                                  \
        for (unsigned i = threadIdx.x; i < width; i += blockDim.x) res[i] += d[i];           \
        rms_norm_row(out + r * width, res, w, width, eps);                                   \
    }
ADD_RMS_NORM(add_rms_norm_f32, float)
ADD_RMS_NORM(add_rms_norm_bf16, bf16)

// In place, heads first_head .. first_head + gridDim.y of every row of width row_width:
// block (row, head). blockDim.x is a multiple of 32.
extern "C" __global__ void head_rms_norm(float* __restrict__ x, const float* __restrict__ w,
                                         unsigned row_width, unsigned first_head,
                                         unsigned head_dim, float eps) {
    __shared__ float scratch[32];
    float* h = x + (unsigned long long)blockIdx.x * row_width +
               (unsigned long long)(first_head + blockIdx.y) * head_dim;
    float ss = 0.0f;
    for (unsigned i = threadIdx.x; i < head_dim; i += blockDim.x) ss += h[i] * h[i];
    ss = block_sum(ss, scratch);
    const float inv = rsqrtf(ss / (float)head_dim + eps);
    for (unsigned i = threadIdx.x; i < head_dim; i += blockDim.x) h[i] = h[i] * inv * w[i];
}

// In place, columns offset .. offset + width of every row of row_width: one block per row (q or
// k normalized over its whole projection, OLMo 2/3). blockDim.x is a multiple of 32.
extern "C" __global__ void span_rms_norm(float* __restrict__ x, const float* __restrict__ w,
                                         unsigned row_width, unsigned offset, unsigned width,
                                         float eps) {
    __shared__ float scratch[32];
    float* h = x + (unsigned long long)blockIdx.x * row_width + offset;
    float ss = 0.0f;
    for (unsigned i = threadIdx.x; i < width; i += blockDim.x) ss += h[i] * h[i];
    ss = block_sum(ss, scratch);
    const float inv = rsqrtf(ss / (float)width + eps);
    for (unsigned i = threadIdx.x; i < width; i += blockDim.x) h[i] = h[i] * inv * w[i];
}

// out = (x - mean) / sqrt(var + eps) * w + b per row of `width`; one block per row, f32
// statistics (two passes over the row: the mean, then the variance about it, which keeps
// the variance of rows with a large mean exact where E[x²] - mean² would cancel).
template <typename TOut>
__device__ __forceinline__ void layer_norm_row(TOut* __restrict__ o, const float* __restrict__ row,
                                               const float* __restrict__ w,
                                               const float* __restrict__ b, unsigned width,
                                               float eps) {
    __shared__ float scratch[32];
    float s = 0.0f;
    for (unsigned i = threadIdx.x; i < width; i += blockDim.x) s += row[i];
    const float mean = block_sum(s, scratch) / (float)width;
    float v = 0.0f;
    for (unsigned i = threadIdx.x; i < width; i += blockDim.x) {
        const float d = row[i] - mean;
        v = fmaf(d, d, v);
    }
    const float inv = rsqrtf(block_sum(v, scratch) / (float)width + eps);
    for (unsigned i = threadIdx.x; i < width; i += blockDim.x)
        store_f32(o, i, fmaf((row[i] - mean) * inv, w[i], b[i]));
}

#define LAYER_NORM(NAME, TOut)                                                                 \
    extern "C" __global__ void NAME(TOut* __restrict__ out, const float* __restrict__ x,      \
                                    const float* __restrict__ w, const float* __restrict__ b, \
                                    unsigned width, float eps) {                               \
        const unsigned long long r = blockIdx.x;                                               \
        layer_norm_row(out + r * width, x + r * width, w, b, width, eps);                      \
    }
LAYER_NORM(layer_norm_f32, float)
LAYER_NORM(layer_norm_bf16, bf16)
