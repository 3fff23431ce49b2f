// Multi-head latent attention (DeepSeek-V3, GLM-4.7-Flash) on the device, the CPU's
// engine-cpu/src/mla.rs: each token's latent queries and cache record, then its attention over
// the cached records in the latent space with the value up-projection applied per head.
//
//   mla_qkv        block (token, head), and one more per token for its record: the latent query
//                  W_UKᵀ · q_nope (w_uk [heads, lora, nope] f32) and q's rotary part turned; the
//                  record: rms_norm(latent) · w and the key's rotary part turned. Rows of
//                  `(heads + 1) · cw` f32, cw = lora + rope, as Backend::mla_qkv lays them out
//                  (write_kv then stores each record's halves in the K and V pools).
//   mla_attention  block (token, head): scores of the latent query against the sequence's
//                  records 0 ..= position (both halves), an online softmax over tiles of keys,
//                  the weighted sum of the latents, then times W_UV (w_uv [heads, v, lora]).
//
// Grids depend only on the step's shape (decode replays from CUDA graphs); contexts and block
// tables come from the step upload. No value depends on another token of the step, and every
// reduction has a fixed order for a launch shape (batch invariant).
#include "common.cuh"
#include "rope.cuh"

#define MLA_THREADS 128
#define MLA_BLOCK 16

// Rotate-half of `x` (2·half values) into `out`, pair i by (cos, sin) of rope_steps[i] at
// position `pos`, times `factor`.
__device__ __forceinline__ void mla_turn(const float* __restrict__ x, float* __restrict__ out,
                                         unsigned half, unsigned pos,
                                         const unsigned long long* __restrict__ rope_steps,
                                         float factor) {
    for (unsigned i = threadIdx.x; i < half; i += blockDim.x) {
        float c, s;
        rope_cos_sin(pos, rope_steps[i], &c, &s);
        c *= factor;
        s *= factor;
        const float a = x[i], b = x[i + half];
        out[i] = a * c - b * s;
        out[i + half] = b * c + a * s;
    }
}

extern "C" __global__ void __launch_bounds__(MLA_THREADS)
mla_qkv(const float* __restrict__ q, const float* __restrict__ kva,
        const unsigned* __restrict__ positions, const unsigned long long* __restrict__ rope_steps,
        const float* __restrict__ kv_norm, const float* __restrict__ w_uk,
        float* __restrict__ out, unsigned heads, unsigned lora, unsigned nope, unsigned rope,
        float rope_factor, float eps) {
    __shared__ float scratch[32];
    const unsigned t = blockIdx.x, h = blockIdx.y;
    const unsigned cw = lora + rope, half = rope / 2, pos = positions[t];
    float* row = out + (unsigned long long)t * (heads + 1) * cw;
    if (h < heads) {
        const float* qh = q + ((unsigned long long)t * heads + h) * (nope + rope);
        float* o = row + (unsigned long long)h * cw;
        for (unsigned j = threadIdx.x; j < lora; j += blockDim.x) {
            const float* w = w_uk + ((unsigned long long)h * lora + j) * nope;
            float acc = 0.0f;
            for (unsigned i = 0; i < nope; ++i) acc = fmaf(qh[i], w[i], acc);
            o[j] = acc;
        }
        mla_turn(qh + nope, o + lora, half, pos, rope_steps, rope_factor);
        return;
    }
    const float* x = kva + (unsigned long long)t * cw;
    float* rec = row + (unsigned long long)heads * cw;
    float ss = 0.0f;
    for (unsigned i = threadIdx.x; i < lora; i += blockDim.x) ss = fmaf(x[i], x[i], ss);
    ss = block_sum(ss, scratch);
    const float inv = rsqrtf(ss / (float)lora + eps);
    for (unsigned i = threadIdx.x; i < lora; i += blockDim.x) rec[i] = x[i] * inv * kv_norm[i];
    mla_turn(x + lora, rec + lora, half, pos, rope_steps, rope_factor);
}

// Element j of the record of key `k`: the first half in the K pool, the second in the V pool
// ([blocks, MLA_BLOCK, cw / 2] bf16 each, one "kv head").
__device__ __forceinline__ float mla_record(const bf16* __restrict__ k_cache,
                                            const bf16* __restrict__ v_cache,
                                            const unsigned* __restrict__ table, unsigned k,
                                            unsigned j, unsigned half) {
    const unsigned long long at =
        ((unsigned long long)table[k / MLA_BLOCK] * MLA_BLOCK + k % MLA_BLOCK) * half;
    return j < half ? bf16_to_f32(k_cache[at + j]) : bf16_to_f32(v_cache[at + j - half]);
}

// Dynamic shared memory: the query (cw), the latent accumulator (lora), a tile's weights
// (MLA_THREADS) floats.
template <typename O>
__device__ __forceinline__ void mla_attend(
    const float* __restrict__ qkv, const bf16* __restrict__ k_cache,
    const bf16* __restrict__ v_cache, const unsigned* __restrict__ positions,
    const unsigned* __restrict__ token_seq, const unsigned* __restrict__ block_tables,
    unsigned block_stride, const float* __restrict__ w_uv, O* __restrict__ out, unsigned heads,
    unsigned lora, unsigned rope, unsigned v, float scale) {
    LMI_DYNAMIC_SHARED(float, sh);
    __shared__ float scratch[32];
    const unsigned t = blockIdx.x, h = blockIdx.y;
    const unsigned cw = lora + rope, half = cw / 2;
    float* q = sh;
    float* acc = sh + cw;
    float* p = acc + lora;
    const float* qrow = qkv + ((unsigned long long)t * (heads + 1) + h) * cw;
    for (unsigned i = threadIdx.x; i < cw; i += blockDim.x) q[i] = qrow[i];
    for (unsigned j = threadIdx.x; j < lora; j += blockDim.x) acc[j] = 0.0f;
    __syncthreads();
    const unsigned ctx = positions[t] + 1;
    const unsigned* table = block_tables + (unsigned long long)token_seq[t] * block_stride;
    float m = LMI_NEG_INF, l = 0.0f;
    for (unsigned k0 = 0; k0 < ctx; k0 += blockDim.x) {
        const unsigned k = k0 + threadIdx.x;
        float s = LMI_NEG_INF;
        if (k < ctx) {
            float dot = 0.0f;
            for (unsigned i = 0; i < cw; ++i)
                dot = fmaf(q[i], mla_record(k_cache, v_cache, table, k, i, half), dot);
            s = dot * scale;
        }
        const float m_new = fmaxf(m, block_max(s, scratch));
        const float corr = m == LMI_NEG_INF ? 0.0f : expf(m - m_new);
        const float e = k < ctx ? expf(s - m_new) : 0.0f;
        p[threadIdx.x] = e;
        l = l * corr + block_sum(e, scratch);
        const unsigned n = min(blockDim.x, ctx - k0);
        for (unsigned j = threadIdx.x; j < lora; j += blockDim.x) {
            float a = acc[j] * corr;
            for (unsigned kk = 0; kk < n; ++kk)
                a = fmaf(p[kk], mla_record(k_cache, v_cache, table, k0 + kk, j, half), a);
            acc[j] = a;
        }
        m = m_new;
        __syncthreads();
    }
    const float inv = 1.0f / l;
    for (unsigned j = threadIdx.x; j < lora; j += blockDim.x) acc[j] *= inv;
    __syncthreads();
    for (unsigned o = threadIdx.x; o < v; o += blockDim.x) {
        const float* w = w_uv + ((unsigned long long)h * v + o) * lora;
        float r = 0.0f;
        for (unsigned j = 0; j < lora; ++j) r = fmaf(acc[j], w[j], r);
        store_f32(out, ((unsigned long long)t * heads + h) * v + o, r);
    }
}

extern "C" __global__ void __launch_bounds__(MLA_THREADS)
mla_attention_f32(const float* __restrict__ qkv, const bf16* __restrict__ k_cache,
                  const bf16* __restrict__ v_cache, const unsigned* __restrict__ positions,
                  const unsigned* __restrict__ token_seq, const unsigned* __restrict__ block_tables,
                  unsigned block_stride, const float* __restrict__ w_uv, float* __restrict__ out,
                  unsigned heads, unsigned lora, unsigned rope, unsigned v, float scale) {
    mla_attend(qkv, k_cache, v_cache, positions, token_seq, block_tables, block_stride, w_uv, out,
               heads, lora, rope, v, scale);
}

extern "C" __global__ void __launch_bounds__(MLA_THREADS)
mla_attention_bf16(const float* __restrict__ qkv, const bf16* __restrict__ k_cache,
                   const bf16* __restrict__ v_cache, const unsigned* __restrict__ positions,
                   const unsigned* __restrict__ token_seq, const unsigned* __restrict__ block_tables,
                   unsigned block_stride, const float* __restrict__ w_uv, bf16* __restrict__ out,
                   unsigned heads, unsigned lora, unsigned rope, unsigned v, float scale) {
    mla_attend(qkv, k_cache, v_cache, positions, token_seq, block_tables, block_stride, w_uv, out,
               heads, lora, rope, v, scale);
}
