// Rotate-half RoPE (the HF layout) on the q and k heads of every fused QKV row, in place.
#include "common.cuh"

// Block per token; thread i rotates pair (i, i + half) of every head. The angle is computed
// in f64, as the CPU backend does, so long positions keep their precision.
extern "C" __global__ void rope(float* __restrict__ qkv, const unsigned* __restrict__ positions,
                                const double* __restrict__ inv_freq, unsigned row_width,
                                unsigned heads, unsigned head_dim) {
    const unsigned half = head_dim / 2;
    float* row = qkv + (unsigned long long)blockIdx.x * row_width;
    const double pos = (double)positions[blockIdx.x];
    for (unsigned i = threadIdx.x; i < half; i += blockDim.x) {
        double s, c;
        sincos(pos * inv_freq[i], &s, &c);
        const float cs = (float)c, sn = (float)s;
        for (unsigned h = 0; h < heads; h++) {
            float* hd = row + (unsigned long long)h * head_dim;
            const float a = hd[i], b = hd[i + half];
            hd[i] = a * cs - b * sn;
            hd[i + half] = b * cs + a * sn;
        }
    }
}
