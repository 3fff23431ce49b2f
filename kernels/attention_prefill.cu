// Paged causal attention for prefill steps on tensor cores (bf16 wmma, f32 accumulation), for
// head_dim 64 and 128. attention.cu has the decode kernels, and the 256-wide padded family;
// crates/engine-cuda/src/attention.rs picks among them.
//
// FlashAttention-2 tiling, with the launch and outputs of attention.cu's kernels:
// - Grid (tiles, kv_heads, splits), 256 threads (8 warps). A tile is up to 16 query tokens of
//   one sequence; its block takes every q head of one KV head's GQA group, rows token-major
//   (row = token * group + head in group), in passes of 64 rows (four row tiles of 16).
// - The pass's q rows (scaled by scale·log2(e), rounded to bf16) stay in shared memory; keys
//   and values stream through it in chunks of 64 (four KV blocks of the block table).
// - Warps split the rows and the keys: with three or four row tiles, warp w takes row tile
//   w % 4 and keys 32·(w / 4) .. + 32 of each chunk; with one or two, row tile w % 2 and 16
//   keys. Each warp keeps its own online softmax (running max m and sum l per row, base 2)
//   and its own output accumulators O (16 × head_dim, f32 fragments) over its keys; at the
//   end of the pass the key groups merge in group order (O = Σ 2^(m_g - M) O_g, likewise l).
// - Per warp and chunk: S = Q·Kᵀ with mma_sync (bf16 in, f32 out) into the warp's score tile
//   in shared memory; the softmax there (two lanes per row, causal mask by absolute position,
//   rows of context 0 see nothing); P = 2^(S - m) rounded to bf16, written over the scores; l
//   sums the rounded weights, so the output is the exact average under the weights applied.
//   O is rescaled by each row's 2^(m_old - m_new): the fragment layout is unspecified, so the
//   factors reach the fragments as a 16 × 16 matrix (each row's factor along its row) loaded
//   into an accumulator fragment, which is multiplied into O element by element. Then
//   O += P·V with mma_sync.
// - Split-KV as in attention.cu (attention_split.cuh): a tile uses att_tile_splits of the
//   gridDim.z splits; blocks past them end at once; with one split the block writes the
//   normalized output, with more each split takes an equal share of the pass's KV blocks and
//   writes unnormalized partials (O, and max and sum), merged by the tile's last block
//   (att_merge_if_last).
// - Every reduction has a fixed order for a given launch shape; the emulator checks the warp
//   rules (crates/cuda-emu: its wmma has a layout of its own, so nothing here may assume one).
#include "common.cuh"
#include "attention_split.cuh"
#include "wmma.cuh"

using namespace nvcuda;

#define PF_THREADS 256
#define PF_WARPS 8
// Query rows per pass: four row tiles of 16.
#define PF_ROWS 64
// Keys per iteration: four KV blocks.
#define PF_CHUNK 64
// Tokens per KV block (kv_cache.cu's pool layout [blocks, kv_heads, 16, head_dim]).
#define PF_KV_BLOCK 16u
#define PF_LOG2E 1.4426950408889634f

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> AccFrag;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> RowA;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> RowB;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> ColB;

// One head size's shared memory layout (byte offsets, each a multiple of 128).
// crates/engine-cuda/src/attention.rs mirrors SHARED_BYTES.
template <int D_>
struct PrefillShape {
    static constexpr int D = D_;
    static constexpr int FRAGS = D / 16;  // output fragments per warp
    // bf16 row stride of q, K and V: 16 bytes of padding put consecutive rows in other banks.
    static constexpr int LD = D + 8;
    // A warp's score tile: 16 rows of up to 32 f32 scores; the bf16 weights overwrite the first
    // half of each row and the rescale factors its second half.
    static constexpr int S_LD = 36;
    static constexpr int P_LD = 2 * S_LD;
    // The pass's summed outputs (f32), over K and V after the last chunk.
    static constexpr int O_LD = D + 4;
    static constexpr int VECS = PF_CHUNK * D / 8 / PF_THREADS;  // 16-byte loads per thread
    static constexpr int Q_OFF = 0;
    static constexpr int K_OFF = Q_OFF + PF_ROWS * LD * 2;
    static constexpr int V_OFF = K_OFF + PF_CHUNK * LD * 2;
    static constexpr int S_OFF = V_OFF + PF_CHUNK * LD * 2;
    // Per warp and row: m, l; per pass row: causal limit, M, L.
    static constexpr int STAT_OFF = S_OFF + PF_WARPS * 16 * S_LD * 4;
    static constexpr int STAT_BYTES = 2 * PF_WARPS * 16 * 4 + 3 * PF_ROWS * 4;
    // 128 bytes of slack: the kernel aligns the dynamic shared memory's start to 128.
    static constexpr int SHARED_BYTES = STAT_OFF + STAT_BYTES + 128;

    static_assert(VECS * PF_THREADS * 8 == PF_CHUNK * D, "a chunk is whole 16-byte loads");
    static_assert(PF_ROWS * O_LD * 4 <= S_OFF - K_OFF, "the summed outputs fit over K and V");
    static_assert(K_OFF % 128 == 0 && V_OFF % 128 == 0 && S_OFF % 128 == 0 &&
                      STAT_OFF % 128 == 0 && (16 * S_LD * 4) % 32 == 0,
                  "wmma pointers are 32-byte aligned");
};

typedef PrefillShape<64> PrefillHd64;
typedef PrefillShape<128> PrefillHd128;
static_assert(PrefillHd64::SHARED_BYTES == 48000 && PrefillHd128::SHARED_BYTES == 72576,
              "crates/engine-cuda/src/attention.rs's figures");

// This thread's share of keys [k0, k0 + PF_CHUNK) of one KV head into registers; keys at or
// past `end` are zeros, so stale pool contents (NaN included) never reach the products.
template <typename S>
__device__ __forceinline__ void pf_load_chunk(uint4 (&kr)[S::VECS], uint4 (&vr)[S::VECS],
                                              const bf16* __restrict__ k_cache,
                                              const bf16* __restrict__ v_cache,
                                              const unsigned* __restrict__ table, unsigned k0,
                                              unsigned end, unsigned kvh, unsigned kv_heads) {
#pragma unroll
    for (int i = 0; i < S::VECS; i++) {
        const unsigned v = threadIdx.x + i * PF_THREADS;
        const unsigned key = k0 + v / (S::D / 8), col = v % (S::D / 8) * 8;
        kr[i] = make_uint4(0u, 0u, 0u, 0u);
        vr[i] = make_uint4(0u, 0u, 0u, 0u);
        if (key < end) {
            const unsigned long long block = table[key / PF_KV_BLOCK];
            const unsigned long long at =
                ((block * kv_heads + kvh) * PF_KV_BLOCK + key % PF_KV_BLOCK) * S::D + col;
            kr[i] = *reinterpret_cast<const uint4*>(k_cache + at);
            vr[i] = *reinterpret_cast<const uint4*>(v_cache + at);
        }
    }
}

template <typename S>
__device__ __forceinline__ void pf_store_chunk(const uint4 (&kr)[S::VECS],
                                               const uint4 (&vr)[S::VECS], bf16* k_s, bf16* v_s) {
#pragma unroll
    for (int i = 0; i < S::VECS; i++) {
        const unsigned v = threadIdx.x + i * PF_THREADS;
        const unsigned at = v / (S::D / 8) * S::LD + v % (S::D / 8) * 8;
        *reinterpret_cast<uint4*>(k_s + at) = kr[i];
        *reinterpret_cast<uint4*>(v_s + at) = vr[i];
    }
}

__device__ __forceinline__ const __nv_bfloat16* as_wmma(const bf16* p) {
    return reinterpret_cast<const __nv_bfloat16*>(p);
}

// Multiplies the warp's O fragments row by row by the 16 factors `f` holds (row r's factor
// repeated along row r of a 16 × 16 matrix, at `m` with stride ld).
template <typename S>
__device__ __forceinline__ void scale_rows(AccFrag (&o)[S::FRAGS], const float* m, unsigned ld) {
    AccFrag f;
    wmma::load_matrix_sync(f, m, ld, wmma::mem_row_major);
#pragma unroll
    for (int j = 0; j < S::FRAGS; j++)
#pragma unroll
        for (int i = 0; i < f.num_elements; i++) o[j].x[i] *= f.x[i];
}

// One warp's work on one chunk: its 16 rows (row tile `rt`) against keys key0 .. key0 + 16·NT
// of the chunk in shared memory (at k_s / v_s row `j0`): scores, online softmax, O += P·V.
// `lim_s` holds the pass rows' causal limits, `m_w` / `l_w` the warp's running max and sum.
template <typename S, int NT>
__device__ __forceinline__ void pf_warp_chunk(AccFrag (&o)[S::FRAGS], const bf16* q_s,
                                              const bf16* k_s, const bf16* v_s, float* s_w,
                                              float* m_w, float* l_w, const unsigned* lim_s,
                                              unsigned rt, unsigned j0, unsigned key0,
                                              unsigned end) {
    const unsigned lane = threadIdx.x & 31u;

    // S = Q·Kᵀ: K's rows are Kᵀ's columns, so K in shared memory is a column-major B.
    AccFrag acc[NT];
#pragma unroll
    for (int n = 0; n < NT; n++) wmma::fill_fragment(acc[n], 0.0f);
#pragma unroll
    for (int ks = 0; ks < S::D / 16; ks++) {
        RowA qa;
        wmma::load_matrix_sync(qa, as_wmma(q_s + rt * 16 * S::LD + ks * 16), S::LD);
#pragma unroll
        for (int n = 0; n < NT; n++) {
            ColB kb;
            wmma::load_matrix_sync(kb, as_wmma(k_s + (j0 + n * 16) * S::LD + ks * 16), S::LD);
            wmma::mma_sync(acc[n], qa, kb, acc[n]);
        }
    }
#pragma unroll
    for (int n = 0; n < NT; n++)
        wmma::store_matrix_sync(s_w + n * 16, acc[n], S::S_LD, wmma::mem_row_major);
    __syncwarp();

    // Softmax: lanes 2r and 2r + 1 take halves of row r's 16·NT scores.
    constexpr int HALF = 8 * NT;
    const unsigned r = lane >> 1, c0 = (lane & 1u) * HALF;
    const unsigned lim = min(lim_s[rt * 16 + r], end);
    float s[HALF];
    float mx = LMI_NEG_INF;
#pragma unroll
    for (int j = 0; j < HALF; j += 4) {
        const float4 v = *reinterpret_cast<const float4*>(s_w + r * S::S_LD + c0 + j);
        const unsigned k = key0 + c0 + j;
        s[j] = k < lim ? v.x : LMI_NEG_INF;
        s[j + 1] = k + 1 < lim ? v.y : LMI_NEG_INF;
        s[j + 2] = k + 2 < lim ? v.z : LMI_NEG_INF;
        s[j + 3] = k + 3 < lim ? v.w : LMI_NEG_INF;
        mx = fmaxf(mx, fmaxf(fmaxf(s[j], s[j + 1]), fmaxf(s[j + 2], s[j + 3])));
    }
    mx = fmaxf(mx, __shfl_xor_sync(LMI_FULL_MASK, mx, 1));
    const float m_old = m_w[r];
    const float m_new = fmaxf(m_old, mx);
    // A row with nothing to see yet keeps max -inf: weights 0, not NaN.
    const float base = m_new == LMI_NEG_INF ? 0.0f : m_new;
    __syncwarp();  // every lane has read its scores before the weights overwrite them

    bf16* p_w = reinterpret_cast<bf16*>(s_w);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < HALF; j += 2) {
        const bf16 a = f32_to_bf16(exp2f(s[j] - base)), b = f32_to_bf16(exp2f(s[j + 1] - base));
        sum += bf16_to_f32(a);
        sum += bf16_to_f32(b);
        *reinterpret_cast<unsigned*>(p_w + r * S::P_LD + c0 + j) = (unsigned)a | (unsigned)b << 16;
    }
    sum += __shfl_xor_sync(LMI_FULL_MASK, sum, 1);
    const float alpha = exp2f(m_old - base);
    // Row r's rescale factor along its row, in columns 16..31 of the score tile (the weights
    // use bytes 0..63 of each row: columns 0..15).
    float* a_row = s_w + r * S::S_LD + 16 + (lane & 1u) * 8;
    *reinterpret_cast<float4*>(a_row) = make_float4(alpha, alpha, alpha, alpha);
    *reinterpret_cast<float4*>(a_row + 4) = make_float4(alpha, alpha, alpha, alpha);
    if ((lane & 1u) == 0) {
        m_w[r] = m_new;
        l_w[r] = l_w[r] * alpha + sum;
    }
    __syncwarp();

    scale_rows<S>(o, s_w + 16, S::S_LD);
#pragma unroll
    for (int kk = 0; kk < NT; kk++) {
        RowA pa;
        wmma::load_matrix_sync(pa, as_wmma(p_w + kk * 16), S::P_LD);
#pragma unroll
        for (int f = 0; f < S::FRAGS; f++) {
            RowB vb;
            wmma::load_matrix_sync(vb, as_wmma(v_s + (j0 + kk * 16) * S::LD + f * 16), S::LD);
            wmma::mma_sync(o[f], pa, vb, o[f]);
        }
    }
}

// One block: tile blockIdx.x, KV head blockIdx.y, split blockIdx.z of the tile's splits
// (att_tile_splits, at most gridDim.z). out: [tokens, q_heads, head_dim] (written when the
// tile has one split); otherwise part_o [gridDim.z, tokens, q_heads, head_dim] and part_ml
// [gridDim.z, tokens, q_heads] (max, sum), of which the tile's rows of its splits are written.
template <typename S, typename TOut>
__device__ __forceinline__ void prefill_attention(
    TOut* __restrict__ out, float* __restrict__ part_o, float2* __restrict__ part_ml,
    unsigned* __restrict__ tile_counters,
    const float* __restrict__ qkv, const bf16* __restrict__ k_cache,
    const bf16* __restrict__ v_cache, const unsigned* __restrict__ tiles,
    const unsigned* __restrict__ positions, const unsigned* __restrict__ context_lens,
    const unsigned* __restrict__ block_tables, unsigned block_stride, unsigned num_tokens,
    unsigned q_heads, unsigned kv_heads, float scale) {
    LMI_DYNAMIC_SHARED(unsigned char, raw);
    // wmma needs 32-byte aligned pointers; align the start to 128 whatever the declaration says.
    unsigned char* smem = raw + ((128u - (unsigned)(reinterpret_cast<unsigned long long>(raw) & 127u)) & 127u);
    bf16* q_s = reinterpret_cast<bf16*>(smem + S::Q_OFF);
    bf16* k_s = reinterpret_cast<bf16*>(smem + S::K_OFF);
    bf16* v_s = reinterpret_cast<bf16*>(smem + S::V_OFF);
    float* s_all = reinterpret_cast<float*>(smem + S::S_OFF);
    float* m_all = reinterpret_cast<float*>(smem + S::STAT_OFF);
    float* l_all = m_all + PF_WARPS * 16;
    unsigned* lim_s = reinterpret_cast<unsigned*>(l_all + PF_WARPS * 16);
    float* big_m = reinterpret_cast<float*>(lim_s + PF_ROWS);
    float* big_l = big_m + PF_ROWS;
    // After the last chunk, K and V hold the pass's summed outputs.
    float* o_s = reinterpret_cast<float*>(smem + S::K_OFF);

    constexpr unsigned hd = S::D;
    const unsigned tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const unsigned kvh = blockIdx.y, split = blockIdx.z;
    const unsigned seq = tiles[3 * blockIdx.x], first = tiles[3 * blockIdx.x + 1];
    const unsigned count = tiles[3 * blockIdx.x + 2];
    const unsigned group = q_heads / kv_heads;
    // The sequence's context length and the tile's split count (attention_split.cuh) live in
    // shared memory, not in registers through the passes (registers peak where q is loaded).
    // A block of a split past the tile's count has no rows to do: it ends at once.
    __shared__ unsigned ctx_s, splits_s;
    if (tid == 0) {
        ctx_s = context_lens[seq];
        splits_s =
            att_tile_splits(att_tile_keys(tiles, positions, context_lens, blockIdx.x), gridDim.z);
    }
    __syncthreads();
    const unsigned tile_rows = split < splits_s ? count * group : 0u;
    const unsigned long long row_width = (unsigned long long)(q_heads + 2 * kv_heads) * hd;
    const unsigned* table = block_tables + (unsigned long long)seq * block_stride;
    const float q_scale = scale * PF_LOG2E;
    float* s_w = s_all + warp * 16 * S::S_LD;
    float* m_w = m_all + warp * 16;
    float* l_w = l_all + warp * 16;

    for (unsigned base = 0; base < tile_rows; base += PF_ROWS) {
        const unsigned rows = min((unsigned)PF_ROWS, tile_rows - base);
        // Row tiles in use; key groups split each chunk's keys among the other warps.
        const unsigned row_tiles = (rows + 15) / 16;
        const unsigned tile_slots = row_tiles <= 2 ? 2u : 4u;
        const unsigned groups = PF_WARPS / tile_slots;
        const unsigned rt = warp % tile_slots, kg = warp / tile_slots;
        const unsigned keys_per_group = PF_CHUNK / groups;
        const bool active = rt < row_tiles;

        // The pass's q rows, scaled and rounded to bf16 (zeros past the rows), and row limits.
        for (unsigned i = tid; i < PF_ROWS * (hd / 4); i += PF_THREADS) {
            const unsigned r = i / (hd / 4), c = i % (hd / 4) * 4;
            float4 q = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (r < rows) {
                const unsigned row = base + r;
                const unsigned long long t = first + row / group;
                const unsigned h = kvh * group + row % group;
                q = *reinterpret_cast<const float4*>(qkv + t * row_width + h * hd + c);
            }
            const unsigned lo = (unsigned)f32_to_bf16(q.x * q_scale) | (unsigned)f32_to_bf16(q.y * q_scale) << 16;
            const unsigned hi = (unsigned)f32_to_bf16(q.z * q_scale) | (unsigned)f32_to_bf16(q.w * q_scale) << 16;
            *reinterpret_cast<uint2*>(q_s + r * S::LD + c) = make_uint2(lo, hi);
        }
        const unsigned ctx = ctx_s;
        if (tid < PF_ROWS)
            lim_s[tid] = tid < rows ? min(positions[first + (base + tid) / group] + 1u, ctx) : 0u;
        if (lane < 16) {
            m_w[lane] = LMI_NEG_INF;
            l_w[lane] = 0.0f;
        }

        // This split's share of the keys the pass's last (furthest) token sees, in KV blocks.
        const unsigned keys = min(positions[first + (base + rows - 1) / group] + 1u, ctx);
        const unsigned blocks = (keys + PF_KV_BLOCK - 1) / PF_KV_BLOCK;
        const unsigned splits = splits_s;
        const unsigned share = (blocks + splits - 1) / splits;
        const unsigned b0 = min(split * share, blocks), b1 = min(b0 + share, blocks);
        const unsigned begin = b0 * PF_KV_BLOCK, end = min(b1 * PF_KV_BLOCK, keys);

        AccFrag o[S::FRAGS];
#pragma unroll
        for (int f = 0; f < S::FRAGS; f++) wmma::fill_fragment(o[f], 0.0f);
        __syncthreads();

        // The furthest key any of this warp's rows sees (the warp skips chunks past it).
        unsigned warp_lim = 0;
        if (active)
            for (unsigned r = 0; r < 16; r++) warp_lim = max(warp_lim, lim_s[rt * 16 + r]);
        warp_lim = min(warp_lim, end);

        for (unsigned k0 = begin; k0 < end; k0 += PF_CHUNK) {
            uint4 kr[S::VECS], vr[S::VECS];
            pf_load_chunk<S>(kr, vr, k_cache, v_cache, table, k0, end, kvh, kv_heads);
            pf_store_chunk<S>(kr, vr, k_s, v_s);
            __syncthreads();
            const unsigned j0 = kg * keys_per_group;
            if (active && k0 + j0 < warp_lim) {  // uniform over the warp
                if (groups == 2)
                    pf_warp_chunk<S, 2>(o, q_s, k_s, v_s, s_w, m_w, l_w, lim_s, rt, j0, k0 + j0, end);
                else
                    pf_warp_chunk<S, 1>(o, q_s, k_s, v_s, s_w, m_w, l_w, lim_s, rt, j0, k0 + j0, end);
            }
            __syncthreads();
        }

        // Merge the key groups: per row, M = max of the groups' maxima, L = Σ 2^(m_g - M) l_g
        // (groups in order), and each group's factor 2^(m_g - M) along the row of its warp's
        // score tile. (Rows of row tiles past tile_slots have no warps.)
        if (tid < tile_slots * 16) {
            const unsigned r = tid, t = r / 16, i = r % 16;
            float m = LMI_NEG_INF;
            for (unsigned g = 0; g < groups; g++) m = fmaxf(m, m_all[(g * tile_slots + t) * 16 + i]);
            const float mb = m == LMI_NEG_INF ? 0.0f : m;
            float l = 0.0f;
            for (unsigned g = 0; g < groups; g++) {
                const unsigned w = g * tile_slots + t;
                const float f = exp2f(m_all[w * 16 + i] - mb);
                l += f * l_all[w * 16 + i];
                float* row = s_all + (w * 16 + i) * S::S_LD;
#pragma unroll
                for (int c = 0; c < 16; c += 4) *reinterpret_cast<float4*>(row + c) = make_float4(f, f, f, f);
            }
            big_m[r] = m;
            big_l[r] = l;
        }
        __syncthreads();
        // O = Σ_g factor_g · O_g over the groups in order, summed in o_s.
        for (unsigned g = 0; g < groups; g++) {
            if (active && kg == g) {  // uniform over the warp
                scale_rows<S>(o, s_w, S::S_LD);
                float* dst = o_s + rt * 16 * S::O_LD;
#pragma unroll
                for (int f = 0; f < S::FRAGS; f++) {
                    if (g > 0) {
                        AccFrag t;
                        wmma::load_matrix_sync(t, dst + f * 16, S::O_LD, wmma::mem_row_major);
#pragma unroll
                        for (int i = 0; i < t.num_elements; i++) o[f].x[i] = t.x[i] + o[f].x[i];
                    }
                    wmma::store_matrix_sync(dst + f * 16, o[f], S::O_LD, wmma::mem_row_major);
                }
            }
            __syncthreads();
        }

        // Write each row: normalized, or as this split's partial.
        for (unsigned i = tid; i < rows * hd; i += PF_THREADS) {
            const unsigned r = i / hd, d = i % hd;
            const float sum = o_s[r * S::O_LD + d];
            const unsigned row = base + r;
            const unsigned long long o_row =
                (unsigned long long)(first + row / group) * q_heads + kvh * group + row % group;
            if (splits_s > 1) {
                const unsigned long long po = (unsigned long long)split * num_tokens * q_heads + o_row;
                part_o[po * hd + d] = sum;
                if (d == 0) part_ml[po] = make_float2(big_m[r], big_l[r]);
            } else {
                const float l = big_l[r];
                store_f32(out, o_row * hd + d, l > 0.0f ? sum / l : 0.0f);
            }
        }
        __syncthreads();
    }
    if (splits_s > 1 && split < splits_s)
        att_merge_if_last(out, part_o, part_ml, tile_counters, tiles, splits_s, num_tokens, q_heads,
                          hd);
}

#define PREFILL_ATTENTION(NAME, SHAPE, TOut)                                                      \
    extern "C" __global__ void __launch_bounds__(PF_THREADS, 2)                                   \
        NAME(TOut* __restrict__ out, float* __restrict__ part_o, float2* __restrict__ part_ml,    \
             unsigned* __restrict__ tile_counters, const float* __restrict__ qkv, const bf16* __restrict__ k_cache,                     \
             const bf16* __restrict__ v_cache, const unsigned* __restrict__ tiles,                \
             const unsigned* __restrict__ positions, const unsigned* __restrict__ context_lens,   \
             const unsigned* __restrict__ block_tables, unsigned block_stride,                   \
             unsigned num_tokens, unsigned q_heads, unsigned kv_heads, unsigned head_dim,        \
             float scale) {                                                                      \
        prefill_attention<SHAPE>(out, part_o, part_ml, tile_counters, qkv, k_cache, v_cache, tiles, positions,  \
                                 context_lens, block_tables, block_stride, num_tokens, q_heads,  \
                                 kv_heads, scale);                                               \
    }

PREFILL_ATTENTION(attention_prefill_hd64_f32, PrefillHd64, float)
PREFILL_ATTENTION(attention_prefill_hd64_bf16, PrefillHd64, bf16)
PREFILL_ATTENTION(attention_prefill_hd128_f32, PrefillHd128, float)
PREFILL_ATTENTION(attention_prefill_hd128_bf16, PrefillHd128, bf16)
