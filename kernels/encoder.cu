// An encoder's own kernels (BERT, XLM-RoBERTa; host code in engine-cuda/src/encoder.rs): the
// position and token-type embeddings added by ids uploaded from the host, and bidirectional
// attention within each sequence of a step, without a KV cache. LayerNorm is in norm.cu, the
// GELUs in activation.cu.
#include "common.cuh"
#include "rows.cuh"

// out[r, :] += table[ids[r], :] for the n / width rows of out (rows.cuh: no division); the
// host checks every id against the table's rows.
#define GATHER_ADD(NAME, TTable)                                                              \
    extern "C" __global__ void NAME(float* __restrict__ out, const TTable* __restrict__ table, \
                                    const unsigned* __restrict__ ids, unsigned width,          \
                                    unsigned long long n) {                                    \
        FOR_ROWS(r, width, n) {                                                                \
            float* o = out + r * width;                                                        \
            const TTable* src = table + (unsigned long long)ids[r] * width;                    \
            FOR_COLS(c, width) o[c] += load_f32(src, c);                                       \
        }                                                                                      \
    }
GATHER_ADD(gather_add_bf16, bf16)
GATHER_ADD(gather_add_f32, float)

// A block's query tile, its warps, and the key chunk staged in shared memory (one key per
// lane). engine-cuda/src/encoder.rs checks its copies of EA_QUERIES and EA_MAX_HEAD_DIM.
#define EA_QUERIES 16
#define EA_WARPS 4
#define EA_ROWS (EA_QUERIES / EA_WARPS)
#define EA_KEYS 32
#define EA_MAX_HEAD_DIM 128
#define EA_DIMS (EA_MAX_HEAD_DIM / 32)

// Bidirectional attention of one tile of queries of one sequence, head blockIdx.y. Tile
// blockIdx.x is tiles[3 x] = (its first query row, its sequence's first row, the row after
// the sequence): rows of qkv are [q | k | v], `heads` heads of `head_dim` each (a multiple of
// 4, at most EA_MAX_HEAD_DIM); out rows are [heads · head_dim].
//
// Each warp owns EA_ROWS query rows (scaled q in shared memory). The block stages the
// sequence's keys and values EA_KEYS at a time; lane j of each warp scores key j against
// the warp's rows (16-byte loads of k and q: four dimensions each), the warp reduces the
// chunk's maximum and sum with shuffles (online softmax in f32: earlier sums rescaled by
// exp(m_old - m_new)), and each lane accumulates its output dimensions (lane + 32 e) over
// the chunk's keys in order, taking each key's weight from its lane by a shuffle. Every sum
// has a fixed order, so results do not depend on the launch beyond its shape. Query rows
// past the sequence are computed on zeros and never stored.
template <typename TOut>
__device__ __forceinline__ void encoder_attention_tile(TOut* __restrict__ out,
                                                       const float* __restrict__ qkv,
                                                       const unsigned* __restrict__ tiles,
                                                       unsigned heads, unsigned head_dim,
                                                       float scale) {
    // float4 rows, so that the scores read q and k 16 bytes at a time.
    __shared__ float4 q_s[EA_QUERIES][EA_MAX_HEAD_DIM / 4];
    // One float4 of padding: lane j reads row j, and a stride of 4 mod 32 banks keeps each
    // quarter warp's 16-byte loads on distinct banks.
    __shared__ float4 k_s[EA_KEYS][EA_MAX_HEAD_DIM / 4 + 1];
    __shared__ float v_s[EA_KEYS][EA_MAX_HEAD_DIM];
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const unsigned q0 = tiles[3 * blockIdx.x], first = tiles[3 * blockIdx.x + 1],
                   end = tiles[3 * blockIdx.x + 2];
    const unsigned width = heads * head_dim;
    const unsigned long long row = 3ull * width;
    const float* q_base = qkv + (unsigned long long)blockIdx.y * head_dim;
    const float* k_base = q_base + width;
    const float* v_base = q_base + 2ull * width;

    for (unsigned r = warp; r < EA_QUERIES; r += EA_WARPS) {
        const unsigned t = q0 + r;
        float* q = reinterpret_cast<float*>(q_s[r]);
        for (unsigned i = lane; i < head_dim; i += 32)
            q[i] = t < end ? q_base[t * row + i] * scale : 0.0f;
    }
    float m[EA_ROWS], l[EA_ROWS], acc[EA_ROWS][EA_DIMS];
#pragma unroll
    for (int r = 0; r < EA_ROWS; r++) {
        m[r] = LMI_NEG_INF;
        l[r] = 0.0f;
#pragma unroll
        for (int e = 0; e < EA_DIMS; e++) acc[r][e] = 0.0f;
    }
    for (unsigned c0 = first; c0 < end; c0 += EA_KEYS) {
        const unsigned n = min(end - c0, (unsigned)EA_KEYS);
        __syncthreads();  // q_s is written; the previous chunk's readers are done
        for (unsigned j = warp; j < n; j += EA_WARPS) {
            const unsigned long long off = (unsigned long long)(c0 + j) * row;
            float* k = reinterpret_cast<float*>(k_s[j]);
            for (unsigned i = lane; i < head_dim; i += 32) {
                k[i] = k_base[off + i];
                v_s[j][i] = v_base[off + i];
            }
        }
        __syncthreads();
        float s[EA_ROWS];
#pragma unroll
        for (int r = 0; r < EA_ROWS; r++) s[r] = 0.0f;
        if (lane < n) {
            for (unsigned c = 0; c < head_dim / 4; c++) {
                const float4 k = k_s[lane][c];
#pragma unroll
                for (int r = 0; r < EA_ROWS; r++) {
                    const float4 q = q_s[warp * EA_ROWS + r][c];
                    s[r] = fmaf(q.x, k.x, s[r]);
                    s[r] = fmaf(q.y, k.y, s[r]);
                    s[r] = fmaf(q.z, k.z, s[r]);
                    s[r] = fmaf(q.w, k.w, s[r]);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < EA_ROWS; r++) {
            const float score = lane < n ? s[r] : LMI_NEG_INF;
            const float m_new = fmaxf(m[r], warp_max(score));
            const float p = expf(score - m_new);  // 0 for a lane without a key
            const float corr = expf(m[r] - m_new);  // 0 for the first chunk (m = -inf)
            l[r] = fmaf(l[r], corr, warp_sum(p));
            m[r] = m_new;
#pragma unroll
            for (int e = 0; e < EA_DIMS; e++) acc[r][e] *= corr;
            s[r] = p;
        }
        for (unsigned j = 0; j < n; j++) {
#pragma unroll
            for (int r = 0; r < EA_ROWS; r++) {
                const float p = __shfl_sync(LMI_FULL_MASK, s[r], j);
#pragma unroll
                for (int e = 0; e < EA_DIMS; e++) {
                    const unsigned d = lane + 32u * e;
                    if (d < head_dim) acc[r][e] = fmaf(p, v_s[j][d], acc[r][e]);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < EA_ROWS; r++) {
        const unsigned t = q0 + warp * EA_ROWS + r;
        if (t >= end) continue;
        TOut* o = out + (unsigned long long)t * width + (unsigned long long)blockIdx.y * head_dim;
#pragma unroll
        for (int e = 0; e < EA_DIMS; e++) {
            const unsigned d = lane + 32u * e;
            if (d < head_dim) store_f32(o, d, acc[r][e] / l[r]);
        }
    }
}

#define ENCODER_ATTENTION(NAME, TOut)                                                           \
    extern "C" __global__ void __launch_bounds__(EA_WARPS * 32)                                \
        NAME(TOut* __restrict__ out, const float* __restrict__ qkv,                             \
             const unsigned* __restrict__ tiles, unsigned heads, unsigned head_dim, float scale) { \
        encoder_attention_tile(out, qkv, tiles, heads, head_dim, scale);                        \
    }
ENCODER_ATTENTION(encoder_attention_f32, float)
ENCODER_ATTENTION(encoder_attention_bf16, bf16)
