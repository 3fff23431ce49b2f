// A vision tower's own kernels (Qwen2-VL, Qwen2.5-VL; host code in engine-cuda/src/vision.rs):
// QuickGELU and non-causal attention inside segments of patches (a frame, or a window). Matrix
// products, LayerNorm and RMSNorm (norm.cu), erf GELU (activation.cu), SwiGLU, residual adds
// and the 2D rotary embedding are the language model's and the encoders' kernels.
#include "common.cuh"
#include "rows.cuh"

// In place over n values: x · σ(1.702 x) (Qwen2-VL's MLP).
extern "C" __global__ void quick_gelu_f32(float* __restrict__ x, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const float v = x[i];
        x[i] = v / (1.0f + expf(-1.702f * v));
    }
}

// Threads of a vision_attention block: one output dimension each (head_dim <= VA_THREADS).
#define VA_THREADS 128
// Keys scored at once (shared memory); a longer segment takes several, with online softmax.
#define VA_KEYS 1024

// Non-causal attention of patch blockIdx.x, head blockIdx.y, over the patches of its segment:
// segments are [bounds[i], bounds[i + 1]) for i < segments, covering every patch. qkv rows are
// [q | k | v], `heads` heads of `head_dim` each; out rows [heads · head_dim].
//
// The block scores a chunk of keys (a key per thread at a time, q in shared memory), takes
// the chunk's maximum and exponentials, then each thread adds its dimension's share of p · v;
// chunks combine by rescaling the running sums (online softmax).
extern "C" __global__ void __launch_bounds__(VA_THREADS)
    vision_attention(float* __restrict__ out, const float* __restrict__ qkv,
                     const unsigned* __restrict__ bounds, unsigned segments, unsigned heads,
                     unsigned head_dim, float scale) {
    __shared__ float q_s[VA_THREADS];
    __shared__ float p_s[VA_KEYS];
    __shared__ float scratch[32];
    const unsigned t = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
    // The segment holding t: the last bound <= t (binary search).
    unsigned lo = 0, hi = segments;
    while (hi - lo > 1) {
        const unsigned mid = (lo + hi) >> 1;
        if (bounds[mid] <= t) lo = mid; else hi = mid;
    }
    const unsigned first = bounds[lo], end = bounds[lo + 1];
    const unsigned width = heads * head_dim;
    const unsigned long long row = 3ull * width;
    if (d < head_dim) q_s[d] = qkv[t * row + h * head_dim + d] * scale;
    __syncthreads();
    const float* k_base = qkv + width + h * head_dim;
    const float* v_base = qkv + 2u * width + h * head_dim;
    float m = LMI_NEG_INF, l = 0.0f, acc = 0.0f;
    for (unsigned c0 = first; c0 < end; c0 += VA_KEYS) {
        const unsigned n = min(end - c0, (unsigned)VA_KEYS);
        float local_max = LMI_NEG_INF;
        for (unsigned j = threadIdx.x; j < n; j += blockDim.x) {
            const float* k = k_base + (c0 + j) * row;
            float s = 0.0f;
            for (unsigned i = 0; i < head_dim; i++) s = fmaf(q_s[i], k[i], s);
            p_s[j] = s;
            local_max = fmaxf(local_max, s);
        }
        const float m_new = fmaxf(m, block_max(local_max, scratch));
        float local_sum = 0.0f;
        for (unsigned j = threadIdx.x; j < n; j += blockDim.x) {
            const float e = expf(p_s[j] - m_new);
            p_s[j] = e;
            local_sum += e;
        }
        const float sum = block_sum(local_sum, scratch);  // its barriers publish p_s
        const float corr = expf(m - m_new);  // 0 for the first chunk (m = -inf)
        l = fmaf(l, corr, sum);
        if (d < head_dim) {
            float a = acc * corr;
            for (unsigned j = 0; j < n; j++) a = fmaf(p_s[j], v_base[(c0 + j) * row + d], a);
            acc = a;
        }
        m = m_new;
        __syncthreads();  // p_s is read by every thread before the next chunk overwrites it
    }
    if (d < head_dim) out[(unsigned long long)t * width + h * head_dim + d] = acc / l;
}
