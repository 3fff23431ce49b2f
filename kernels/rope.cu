// Rotate-half RoPE (the HF layout) on the q and k heads of fused QKV rows, and the fused
// per-layer op around it: Qwen3's per-head RMS norm of q and k (optional), RoPE, and the
// K/V write to the paged pools (kv_cache.cuh).
//
// M-RoPE (Qwen2-VL): with `mpos` set, pair i turns with component comp[i] (0 time, 1 row,
// 2 column) of the token's three positions mpos[3t .. 3t + 3] instead of positions[t].
//
// Partial RoPE (Qwen3.5, Qwen3-Next: a quarter of each head turns): the table has `rot` <=
// head_dim / 2 frequencies; pair i is (i, i + rot) for i < rot, as the CPU's rope_by pairs
// them, and dimensions 2·rot .. head_dim are left as they are (but normalized and stored like
// the rest). With rot = head_dim / 2 this is the full rotation, bit for bit as before.
//
// Angles without f64: each frequency comes as its turns per position in 0.64 fixed point,
// `step = round(frac(inv_freq / 2π) · 2^64)` (host: engine-cuda/src/rope.rs). A position's phase is then
// `pos · step mod 2^64`, one wrapping integer product: exact whatever the position (the
// fractional turn is all that matters), so a long position loses nothing, unlike an f32
// product `pos · inv_freq` (an f32 angle near 131,072 rad is only known to 0.004 rad). The phase is
// reduced to the nearest quarter turn in integers, the remainder (|x| <= π/4) converted to
// radians in float-float and fed to f32 minimax polynomials (Cephes' sinf/cosf). Every step is
// an explicit fmaf or a lone product, so a GPU and the emulator compute the same bits.
#include "common.cuh"
#include "kv_cache.cuh"
#include "rope.cuh"

// The most pairs a head turns: rot <= 256 (head_dim <= 512, Gemma 4's global heads).
#define ROPE_MAX_PAIRS 256
// Warps per block: each takes one head at a time.
#define ROPE_WARPS 4

// One head of one token, by one warp, in place at x (or into k_out in bf16): lane takes pairs
// (i, i + rot) for i = lane + 32·j < rot; the unrotated tail 2·rot .. head_dim (partial RoPE)
// likewise. Normalized first when `norm` is set (head_dim weights: the sum of squares read
// from x before anything is written); rotated by the token's (cos, sin) of each pair, from
// shared memory. Nothing is held per pair in registers, so any width up to ROPE_MAX_PAIRS
// pairs takes the same registers.
__device__ __forceinline__ void rope_head(float* __restrict__ x, bf16* __restrict__ k_out,
                                          const float* __restrict__ norm, float eps,
                                          unsigned head_dim, unsigned rot, const float* cos_s,
                                          const float* sin_s) {
    const unsigned lane = threadIdx.x & 31u;
    float inv = 1.0f;
    if (norm != nullptr) {  // uniform: the same for every lane of the launch
        float ss = 0.0f;
        for (unsigned i = lane; i < head_dim; i += 32u) ss = fmaf(x[i], x[i], ss);
        ss = warp_sum(ss);
        inv = rsqrtf(ss / (float)head_dim + eps);
    }
    for (unsigned i = lane; i < rot; i += 32u) {
        float a = x[i], b = x[i + rot];
        if (norm != nullptr) {
            a = a * inv * norm[i];
            b = b * inv * norm[i + rot];
        }
        const float c = cos_s[i], s = sin_s[i];
        const float ra = fmaf(a, c, -b * s), rb = fmaf(b, c, a * s);
        if (k_out != nullptr) {
            k_out[i] = f32_to_bf16(ra);
            k_out[i + rot] = f32_to_bf16(rb);
        } else {
            x[i] = ra;
            x[i + rot] = rb;
        }
    }
    // The tail: normalized in place or stored (each lane its own elements).
    if (norm == nullptr && k_out == nullptr) return;
    for (unsigned i = 2u * rot + lane; i < head_dim; i += 32u) {
        const float v = norm != nullptr ? x[i] * inv * norm[i] : x[i];
        if (k_out != nullptr) {
            k_out[i] = f32_to_bf16(v);
        } else {
            x[i] = v;
        }
    }
}

// The heads of token blockIdx.x that block blockIdx.y takes: of the q, k and (with KV) v heads
// in that order, an even share of consecutive ones, a warp per head. The block first puts
// the token's (cos, sin) of every pair in shared memory when its share has a q or k head.
// With KV: q heads are normalized (q_norm) and rotated in place (attention reads them there),
// k heads normalized (k_norm) and rotated into the K pool, v heads copied to the V pool, all
// at the token's slot; the row's k and v heads are left as they were, and a padding token
// (slot NO_SLOT) is skipped whole. Without: q and k heads rotated in place (Backend::rope).
template <bool KV>
__device__ __forceinline__ void rope_token(float* __restrict__ qkv, bf16* __restrict__ k_cache,
                                           bf16* __restrict__ v_cache,
                                           const unsigned* __restrict__ positions,
                                           const unsigned* __restrict__ slots,
                                           const unsigned long long* __restrict__ steps,
                                           const unsigned* __restrict__ mpos,
                                           const unsigned* __restrict__ comp,
                                           const float* __restrict__ q_norm,
                                           const float* __restrict__ k_norm, float eps,
                                           unsigned q_heads, unsigned kv_heads, unsigned head_dim,
                                           unsigned rot) {
    __shared__ float cos_s[ROPE_MAX_PAIRS], sin_s[ROPE_MAX_PAIRS];
    const unsigned t = blockIdx.x;
    const unsigned slot = KV ? slots[t] : 0u;
    if (KV && slot == NO_SLOT) return;  // the whole block
    const unsigned rotary = q_heads + kv_heads, heads = rotary + (KV ? kv_heads : 0u);
    const unsigned share = (heads + gridDim.y - 1) / gridDim.y;
    const unsigned first = blockIdx.y * share, end = min(first + share, heads);
    if (first < rotary) {  // block-uniform
        const unsigned pos = positions[t];
        for (unsigned i = threadIdx.x; i < rot; i += blockDim.x) {
            const unsigned p = mpos != nullptr ? mpos[3u * t + comp[i]] : pos;
            rope_cos_sin(p, steps[i], &cos_s[i], &sin_s[i]);
        }
    }
    __syncthreads();
    const unsigned lane = threadIdx.x & 31u;
    const unsigned row_width = (rotary + kv_heads) * head_dim;
    float* row = qkv + (unsigned long long)t * row_width;
    for (unsigned h = first + (threadIdx.x >> 5); h < end; h += blockDim.x >> 5) {
        float* x = row + h * head_dim;
        if (h < q_heads) {
            rope_head(x, nullptr, q_norm, eps, head_dim, rot, cos_s, sin_s);
        } else if (!KV) {
            rope_head(x, nullptr, nullptr, 0.0f, head_dim, rot, cos_s, sin_s);
        } else if (h < rotary) {
            bf16* k = k_cache + kv_row(slot, kv_heads, h - q_heads, head_dim);
            rope_head(x, k, k_norm, eps, head_dim, rot, cos_s, sin_s);
        } else {
            bf16* v = v_cache + kv_row(slot, kv_heads, h - rotary, head_dim);
            for (unsigned i = lane; i < head_dim; i += 32u) v[i] = f32_to_bf16(x[i]);
        }
    }
}

// Backend::qk_norm_rope_write_kv: grid (tokens, blocks per token), ROPE_WARPS warps.
// q_norm and k_norm are both null for models without q/k norms; mpos and comp null but for
// M-RoPE; rot pairs turn (head_dim / 2 but for partial RoPE).
extern "C" __global__ void __launch_bounds__(32 * ROPE_WARPS)
    qk_norm_rope_write_kv(float* __restrict__ qkv, bf16* __restrict__ k_cache,
                          bf16* __restrict__ v_cache, const unsigned* __restrict__ positions,
                          const unsigned* __restrict__ slots,
                          const unsigned long long* __restrict__ steps,
                          const unsigned* __restrict__ mpos, const unsigned* __restrict__ comp,
                          const float* __restrict__ q_norm, const float* __restrict__ k_norm,
                          float eps, unsigned q_heads, unsigned kv_heads, unsigned head_dim,
                          unsigned rot) {
    rope_token<true>(qkv, k_cache, v_cache, positions, slots, steps, mpos, comp, q_norm, k_norm,
                     eps, q_heads, kv_heads, head_dim, rot);
}

// Backend::rope: q and k heads rotated in place (rot pairs each); grid (tokens, blocks per
// token), ROPE_WARPS warps.
extern "C" __global__ void __launch_bounds__(32 * ROPE_WARPS)
    rope(float* __restrict__ qkv, const unsigned* __restrict__ positions,
         const unsigned long long* __restrict__ steps, const unsigned* __restrict__ mpos,
         const unsigned* __restrict__ comp, unsigned q_heads, unsigned kv_heads,
         unsigned head_dim, unsigned rot) {
    rope_token<false>(qkv, nullptr, nullptr, positions, nullptr, steps, mpos, comp, nullptr,
                      nullptr, 0.0f, q_heads, kv_heads, head_dim, rot);
}
