// Paged causal attention for a step's ragged batch (prefill chunks, with or without a cached
// prefix, and decode tokens) in one launch, reading K/V through the block tables.
//
// Design:
// - Grid (tiles, kv_heads, splits), 256 threads. A tile is up to 16 query tokens of one
//   sequence; its block takes every q head of one KV head's GQA group, so each K/V block is
//   read once per group. Query rows are token-major (row = token * group + head in group);
//   a tile with more rows than the shape's ROWS is done in passes.
// - The block's keys are streamed in chunks of 64 (four KV blocks): 16-byte loads into
//   registers, stored to shared memory, then scores (CUDA-core FMAs, f32), an online softmax
//   (running max and sum per row, base 2 with log2(e) folded into q) and P·V. Shared memory
//   does not grow with the context. The decode shape issues the next chunk's loads before
//   computing the current one, so K/V stay in flight.
// - Decode (ROWS = 8, tiles of one token) for every head size: four lanes share each key's
//   dot product (shuffle-reduced) and P·V warps split the keys, so all warps work on a few
//   rows. Prefill for head sizes other than 64 and 128, zero-padded to 256 (ROWS = 32): score
//   threads own (key, rows) and P·V warps own rows. Prefill for head_dim 64 and 128 runs on
//   tensor cores: attention_prefill.cu.
// - Split-KV (attention_split.cuh): gridDim.z is an upper bound; each tile uses
//   att_tile_splits(keys its furthest token sees, gridDim.z) splits, computed here from the
//   positions and context lengths in device memory, so a CUDA graph captured for one step
//   replays correctly, and does only the work its contexts need, for any later step. Blocks
//   of the tile's later splits end after one barrier (no rows, no loads). With one split the
//   block writes the normalized output; with more, each takes an equal share of its pass's KV
//   blocks and writes unnormalized partials (accumulator, max, sum), which the tile's last
//   block to finish combines in split order (att_merge_if_last: no merge launch).
// - Causal per row: row of token t sees keys 0 ..= position(t), below its context length;
//   with a sliding window W (> 0: Gemma's local layers), only the last W of them. A pass's
//   keys start at the block of its first row's window, and a tile's splits count the keys
//   its window spans. Rows of context 0 (padding of decode batches) write zeros.
// - `through` (non-null: Gemma 4's images attending both ways in its sliding layers): per
//   token, the last position its row sees, which may be past its own (an image's soft tokens
//   see the whole image); the window still counts back from the token's own position. A
//   pass's and a tile's keys then reach the furthest of their tokens' limits.
// - Attention sinks (gpt-oss; `sinks` non-null, one logit per q head): an extra logit in
//   each row's softmax whose value is zero, which is the online softmax started from it
//   (max = the sink, sum = 1) instead of from nothing. Split 0 alone starts so; the merge of
//   the splits' (max, sum) then counts it once.
// - Every reduction has a fixed order for a given launch shape.
#include "common.cuh"
#include "attention_split.cuh"

#define ATT_THREADS 256
#define ATT_WARPS 8
// Keys per iteration: four KV blocks.
#define ATT_CHUNK 64
// Tokens per KV block (kv_cache.cu's pool layout [blocks, kv_heads, 16, head_dim]).
#define ATT_KV_BLOCK 16u
#define ATT_LOG2E 1.4426950408889634f

// One instantiation's geometry.
// D: head dims the layout holds (head_dim itself, or a bound padded with zeros);
// ROWS: query rows per pass; DP: score lanes per key, each summing D / DP dims;
// RPART: P·V row parts (the other ATT_WARPS / RPART warps split the chunk's keys);
// PREFETCH: load chunk c + 1 into registers while chunk c is computed.
// crates/engine-cuda/src/attention.rs mirrors SHARED_BYTES.
template <int D_, int ROWS_, int DP_, int RPART_, bool PREFETCH_>
struct AttnShape {
    static constexpr int D = D_, ROWS = ROWS_, DP = DP_, RPART = RPART_;
    static constexpr bool PREFETCH = PREFETCH_;
    static constexpr int E = D / 32;  // dims per P·V lane
    static constexpr int KPART = ATT_WARPS / RPART;
    static constexpr int PV_ROWS = ROWS / RPART;  // rows per P·V thread
    static constexpr int PV_KEYS = ATT_CHUNK / KPART;
    static constexpr int KEYS_PER_WARP = 32 / DP;
    static constexpr int KEY_WARPS = ATT_CHUNK / KEYS_PER_WARP;
    static constexpr int RP = ATT_WARPS / KEY_WARPS;  // score row parts
    static constexpr int S_ROWS = ROWS / RP;          // rows per score thread
    static constexpr int DPART = D / DP;
    // The DP parts of a q row sit 16 bytes apart from a bank-aligned stride.
    static constexpr int Q_PART = DPART + (DP > 1 ? 4 : 0);
    static constexpr int Q_STRIDE = DP * Q_PART;
    // 16 bytes of padding per key row: lanes reading different keys hit different banks.
    static constexpr int K_STRIDE = D + 8;
    static constexpr int VECS = ATT_CHUNK * D / 8 / ATT_THREADS;  // 16-byte loads per thread
    static constexpr int Q_BYTES = ROWS * Q_STRIDE * 4;
    static constexpr int K_BYTES = ATT_CHUNK * K_STRIDE * 2;
    static constexpr int V_BYTES = ATT_CHUNK * D * 2;
    static constexpr int S_BYTES = ROWS * ATT_CHUNK * 4;
    // Per row: max, sum, rescale factor, window limit, last key seen.
    static constexpr int SHARED_BYTES = Q_BYTES + K_BYTES + V_BYTES + S_BYTES + 5 * ROWS * 4;

    static_assert(VECS * ATT_THREADS * 8 == ATT_CHUNK * D, "a chunk is whole 16-byte loads");
    static_assert(KEY_WARPS * RP == ATT_WARPS && ROWS % RP == 0, "score threads tile the chunk");
    static_assert(ROWS % ATT_WARPS == 0 && ROWS % RPART == 0 && PV_KEYS % 4 == 0, "P·V tiling");
    static_assert(KPART * ROWS * D * 4 <= K_BYTES + V_BYTES + S_BYTES,
                  "the final reduction fits over K, V and S");
};

typedef AttnShape<64, 8, 4, 2, true> DecodeHd64;
typedef AttnShape<128, 8, 4, 2, true> DecodeHd128;
typedef AttnShape<256, 8, 4, 2, false> DecodeAny;
typedef AttnShape<256, 32, 1, 8, false> PrefillAny;
// Heads wider than 256 up to 512 (Gemma 4's global layers), zero-padded to 512: the decode
// shape for prefill too (8 rows a pass keep the shared memory at 148 KiB); a warp per row in
// P·V (RPART 8) keeps its 16 dims a lane in registers.
typedef AttnShape<512, 8, 4, 8, false> Wide;

__device__ __forceinline__ void unpack_bf16x2(unsigned w, float& lo, float& hi) {
    lo = __uint_as_float(w << 16);
    hi = __uint_as_float(w & 0xffff0000u);
}

// N consecutive bf16 values (N = 2, 4, 8 or 16, aligned to 2N bytes; 16 at 16) as f32.
template <int N>
__device__ __forceinline__ void load_bf16(const bf16* p, float* f) {
    if constexpr (N == 16) {
        load_bf16<8>(p, f);
        load_bf16<8>(p + 8, f + 8);
    } else if constexpr (N == 8) {
        const uint4 w = *reinterpret_cast<const uint4*>(p);
        unpack_bf16x2(w.x, f[0], f[1]);
        unpack_bf16x2(w.y, f[2], f[3]);
        unpack_bf16x2(w.z, f[4], f[5]);
        unpack_bf16x2(w.w, f[6], f[7]);
    } else if constexpr (N == 4) {
        const uint2 w = *reinterpret_cast<const uint2*>(p);
        unpack_bf16x2(w.x, f[0], f[1]);
        unpack_bf16x2(w.y, f[2], f[3]);
    } else {
        static_assert(N == 2, "2, 4 or 8 values");
        unpack_bf16x2(*reinterpret_cast<const unsigned*>(p), f[0], f[1]);
    }
}

// This thread's share of keys [k0, k0 + ATT_CHUNK) of one KV head; keys at or past `end`
// (and dims past head_dim) are zeros, so stale pool contents never reach the sums.
template <typename S, bool EXACT>
__device__ __forceinline__ void load_chunk(uint4 (&kr)[S::VECS], uint4 (&vr)[S::VECS],
                                           const bf16* __restrict__ k_cache,
                                           const bf16* __restrict__ v_cache,
                                           const unsigned* __restrict__ table, unsigned k0,
                                           unsigned end, unsigned kvh, unsigned kv_heads,
                                           unsigned hd) {
#pragma unroll
    for (int i = 0; i < S::VECS; i++) {
        const unsigned v = threadIdx.x + i * ATT_THREADS;
        const unsigned key = k0 + v / (S::D / 8), col = v % (S::D / 8) * 8;
        kr[i] = make_uint4(0u, 0u, 0u, 0u);
        vr[i] = make_uint4(0u, 0u, 0u, 0u);
        if (key < end && (EXACT || col < hd)) {
            const unsigned long long block = table[key / ATT_KV_BLOCK];
            const unsigned long long at =
                ((block * kv_heads + kvh) * ATT_KV_BLOCK + key % ATT_KV_BLOCK) * hd + col;
            kr[i] = *reinterpret_cast<const uint4*>(k_cache + at);
            vr[i] = *reinterpret_cast<const uint4*>(v_cache + at);
        }
    }
}

template <typename S>
__device__ __forceinline__ void store_chunk(const uint4 (&kr)[S::VECS], const uint4 (&vr)[S::VECS],
                                            bf16* k_s, bf16* v_s) {
#pragma unroll
    for (int i = 0; i < S::VECS; i++) {
        const unsigned v = threadIdx.x + i * ATT_THREADS;
        const unsigned key = v / (S::D / 8), col = v % (S::D / 8) * 8;
        *reinterpret_cast<uint4*>(k_s + key * S::K_STRIDE + col) = kr[i];
        *reinterpret_cast<uint4*>(v_s + key * S::D + col) = vr[i];
    }
}

// s_s[r][j] = q_r · k_j (base-2 logits) for the chunk's keys, -inf where row r may not look:
// keys at or past its limit hi_s[r], or (window > 0) before the last `window` keys up to its
// own position (lim_s[r] = position + 1).
template <typename S>
__device__ __forceinline__ void chunk_scores(float* s_s, const float* q_s, const bf16* k_s,
                                             const unsigned* lim_s, const unsigned* hi_s,
                                             unsigned rows, unsigned k0, unsigned end,
                                             unsigned window) {
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const unsigned dp = lane / S::KEYS_PER_WARP, rp = warp / S::KEY_WARPS;
    const unsigned j = warp % S::KEY_WARPS * S::KEYS_PER_WARP + lane % S::KEYS_PER_WARP;
    const bf16* kp = k_s + j * S::K_STRIDE + dp * S::DPART;
    const float* qp = q_s + dp * S::Q_PART;
    float acc[S::S_ROWS];
#pragma unroll
    for (int i = 0; i < S::S_ROWS; i++) acc[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < S::DPART; c += 8) {
        float k[8];
        load_bf16<8>(kp + c, k);
#pragma unroll
        for (int i = 0; i < S::S_ROWS; i++) {
            const unsigned r = rp + S::RP * i;
            if (r < rows) {
                const float4 a = *reinterpret_cast<const float4*>(qp + r * S::Q_STRIDE + c);
                const float4 b = *reinterpret_cast<const float4*>(qp + r * S::Q_STRIDE + c + 4);
                float s = acc[i];
                s += a.x * k[0];
                s += a.y * k[1];
                s += a.z * k[2];
                s += a.w * k[3];
                s += b.x * k[4];
                s += b.y * k[5];
                s += b.z * k[6];
                s += b.w * k[7];
                acc[i] = s;
            }
        }
    }
#pragma unroll
    for (int i = 0; i < S::S_ROWS; i++) {
        const unsigned r = rp + S::RP * i;
        if (r < rows) {  // uniform over the warp
            float s = acc[i];
#pragma unroll
            for (int o = S::KEYS_PER_WARP; o < 32; o <<= 1) s += __shfl_xor_sync(LMI_FULL_MASK, s, o);
            const unsigned key = k0 + j, lim = lim_s[r];
            const bool seen = key < min(hi_s[r], end) && (window == 0u || key + window >= lim);
            if (dp == 0) s_s[r * ATT_CHUNK + j] = seen ? s : LMI_NEG_INF;
        }
    }
}

// Online softmax, a warp per row: folds the chunk's maximum into the running one, turns the
// row's scores into weights in place, and leaves the rescale factor of the accumulators.
template <typename S>
__device__ __forceinline__ void chunk_softmax(float* s_s, float* m_s, float* l_s, float* a_s,
                                              unsigned rows) {
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
#pragma unroll
    for (int i = 0; i < S::ROWS / ATT_WARPS; i++) {
        const unsigned r = warp + ATT_WARPS * i;
        if (r >= rows) break;  // uniform over the warp
        float* sr = s_s + r * ATT_CHUNK;
        const float a = sr[lane], b = sr[lane + 32];
        const float m_old = m_s[r];
        const float m_new = fmaxf(m_old, warp_max(fmaxf(a, b)));
        // A row with nothing to see yet keeps max -inf: weights 0, not NaN.
        const float base = m_new == LMI_NEG_INF ? 0.0f : m_new;
        const float pa = exp2f(a - base), pb = exp2f(b - base);
        sr[lane] = pa;
        sr[lane + 32] = pb;
        const float sum = warp_sum(pa + pb);
        if (lane == 0) {
            const float alpha = exp2f(m_old - base);
            l_s[r] = l_s[r] * alpha + sum;
            m_s[r] = m_new;
            a_s[r] = alpha;
        }
    }
}

// acc = acc * alpha + P · V over this warp's keys of the chunk, for its rows and lane dims.
template <typename S>
__device__ __forceinline__ void chunk_pv(float (&acc)[S::PV_ROWS][S::E], const float* s_s,
                                         const bf16* v_s, const float* a_s, unsigned rows) {
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const unsigned rp = warp % S::RPART, kp = warp / S::RPART;
#pragma unroll
    for (int i = 0; i < S::PV_ROWS; i++) {
        const unsigned r = rp + S::RPART * i;
        if (r < rows) {
            const float alpha = a_s[r];
#pragma unroll
            for (int e = 0; e < S::E; e++) acc[i][e] *= alpha;
        }
    }
#pragma unroll
    for (int jj = 0; jj < S::PV_KEYS; jj += 4) {
        const unsigned j = kp * S::PV_KEYS + jj;
        float v[4][S::E];
#pragma unroll
        for (int u = 0; u < 4; u++) load_bf16<S::E>(v_s + (j + u) * S::D + lane * S::E, v[u]);
#pragma unroll
        for (int i = 0; i < S::PV_ROWS; i++) {
            const unsigned r = rp + S::RPART * i;
            if (r < rows) {
                const float4 p = *reinterpret_cast<const float4*>(s_s + r * ATT_CHUNK + j);
#pragma unroll
                for (int e = 0; e < S::E; e++) {
                    float o = acc[i][e];
                    o += p.x * v[0][e];
                    o += p.y * v[1][e];
                    o += p.z * v[2][e];
                    o += p.w * v[3][e];
                    acc[i][e] = o;
                }
            }
        }
    }
}

// One block: tile blockIdx.x, KV head blockIdx.y, split blockIdx.z of the tile's splits
// (att_tile_splits, at most gridDim.z). out: [tokens, q_heads, head_dim] (written when the
// tile has one split); otherwise part_o [gridDim.z, tokens, q_heads, head_dim] and part_ml
// [gridDim.z, tokens, q_heads] (max, sum), of which the tile's rows of its splits are written.
template <typename S, bool EXACT, typename TOut>
__device__ __forceinline__ void paged_attention(
    TOut* __restrict__ out, float* __restrict__ part_o, float2* __restrict__ part_ml,
    unsigned* __restrict__ tile_counters,
    const float* __restrict__ qkv, const bf16* __restrict__ k_cache,
    const bf16* __restrict__ v_cache, const unsigned* __restrict__ tiles,
    const unsigned* __restrict__ positions, const unsigned* __restrict__ context_lens,
    const unsigned* __restrict__ block_tables, unsigned block_stride, unsigned num_tokens,
    unsigned q_heads, unsigned kv_heads, unsigned head_dim, float scale, unsigned window,
    const float* __restrict__ sinks, const unsigned* __restrict__ through) {
    LMI_DYNAMIC_SHARED(unsigned char, smem);
    float* q_s = reinterpret_cast<float*>(smem);
    bf16* k_s = reinterpret_cast<bf16*>(smem + S::Q_BYTES);
    bf16* v_s = reinterpret_cast<bf16*>(smem + S::Q_BYTES + S::K_BYTES);
    float* s_s = reinterpret_cast<float*>(smem + S::Q_BYTES + S::K_BYTES + S::V_BYTES);
    float* m_s = s_s + S::ROWS * ATT_CHUNK;
    float* l_s = m_s + S::ROWS;
    float* a_s = l_s + S::ROWS;
    unsigned* lim_s = reinterpret_cast<unsigned*>(a_s + S::ROWS);
    unsigned* hi_s = lim_s + S::ROWS;
    // After the last chunk, K, V and S hold the per-key-part accumulators.
    float* red_s = reinterpret_cast<float*>(k_s);

    const unsigned hd = EXACT ? (unsigned)S::D : head_dim;
    const unsigned tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const unsigned kvh = blockIdx.y, split = blockIdx.z;
    const unsigned seq = tiles[3 * blockIdx.x], first = tiles[3 * blockIdx.x + 1];
    const unsigned count = tiles[3 * blockIdx.x + 2];
    const unsigned group = q_heads / kv_heads, ctx = context_lens[seq];
    // The tile's split count (attention_split.cuh) lives in shared memory, not in a register
    // through the passes. A block of a split past it has no rows to do: it ends at once.
    __shared__ unsigned splits_s;
    if (tid == 0) {
        unsigned span;
        if (through == nullptr) {
            // A window bounds the keys the tile's tokens see together: its width plus theirs.
            const unsigned keys = att_tile_keys(tiles, positions, context_lens, blockIdx.x);
            span = window ? min(keys, window + count) : keys;
        } else {
            // From the first token's window to the furthest limit of the tile's tokens.
            const unsigned keys = att_seen_keys(positions, through, first, count, ctx);
            const unsigned lim0 = min(positions[first] + 1u, ctx);
            span = keys - (window ? lim0 - min(lim0, window) : 0u);
        }
        splits_s = att_tile_splits(span, gridDim.z);
    }
    __syncthreads();
    const unsigned tile_rows = split < splits_s ? count * group : 0u;
    const unsigned long long row_width = (unsigned long long)(q_heads + 2 * kv_heads) * hd;
    const unsigned* table = block_tables + (unsigned long long)seq * block_stride;
    const float q_scale = scale * ATT_LOG2E;

    for (unsigned base = 0; base < tile_rows; base += S::ROWS) {
        const unsigned rows = min((unsigned)S::ROWS, tile_rows - base);

        // This pass's q rows (scaled; zeros past the rows and head_dim), limits and stats.
        for (unsigned i = tid; i < S::ROWS * (S::D / 4); i += ATT_THREADS) {
            const unsigned r = i / (S::D / 4), c = i % (S::D / 4) * 4;
            float4 q = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (r < rows && (EXACT || c < hd)) {
                const unsigned row = base + r;
                const unsigned long long t = first + row / group;
                const unsigned h = kvh * group + row % group;
                q = *reinterpret_cast<const float4*>(qkv + t * row_width + h * hd + c);
                q.x *= q_scale;
                q.y *= q_scale;
                q.z *= q_scale;
                q.w *= q_scale;
            }
            *reinterpret_cast<float4*>(q_s + r * S::Q_STRIDE + c / S::DPART * S::Q_PART +
                                       c % S::DPART) = q;
        }
        if (tid < S::ROWS) {
            const unsigned t = first + (base + tid) / group;
            lim_s[tid] = tid < rows ? min(positions[t] + 1u, ctx) : 0u;
            hi_s[tid] = tid < rows && through != nullptr
                            ? min(max(positions[t], through[t]) + 1u, ctx)
                            : lim_s[tid];
            // Base-2 logits, as the scores (q carries log2(e)); the sink is unscaled, as
            // transformers adds it beside the scaled scores.
            const bool sink = sinks != nullptr && split == 0 && tid < rows;
            m_s[tid] = sink ? sinks[kvh * group + (base + tid) % group] * ATT_LOG2E : LMI_NEG_INF;
            l_s[tid] = sink ? 1.0f : 0.0f;
        }

        // This split's share of the keys the pass's rows see, in KV blocks: up to the last
        // (furthest) token's (or the furthest limit of its tokens'), from the block of the
        // first token's window.
        const unsigned t0 = first + base / group, t1 = first + (base + rows - 1) / group;
        const unsigned keys = through == nullptr
                                  ? min(positions[t1] + 1u, ctx)
                                  : att_seen_keys(positions, through, t0, t1 - t0 + 1u, ctx);
        const unsigned blocks = (keys + ATT_KV_BLOCK - 1) / ATT_KV_BLOCK;
        const unsigned lim0 = min(positions[first + base / group] + 1u, ctx);
        const unsigned from = window ? (lim0 - min(lim0, window)) / ATT_KV_BLOCK : 0u;
        const unsigned splits = splits_s;
        const unsigned share = (blocks - from + splits - 1) / splits;
        const unsigned b0 = min(from + split * share, blocks), b1 = min(b0 + share, blocks);
        const unsigned begin = b0 * ATT_KV_BLOCK, end = min(b1 * ATT_KV_BLOCK, keys);

        float acc[S::PV_ROWS][S::E];
#pragma unroll
        for (int i = 0; i < S::PV_ROWS; i++)
#pragma unroll
            for (int e = 0; e < S::E; e++) acc[i][e] = 0.0f;
        __syncthreads();

        uint4 kr[S::VECS], vr[S::VECS];
        if (S::PREFETCH && begin < end)
            load_chunk<S, EXACT>(kr, vr, k_cache, v_cache, table, begin, end, kvh, kv_heads, hd);
        for (unsigned k0 = begin; k0 < end; k0 += ATT_CHUNK) {
            if (!S::PREFETCH)
                load_chunk<S, EXACT>(kr, vr, k_cache, v_cache, table, k0, end, kvh, kv_heads, hd);
            store_chunk<S>(kr, vr, k_s, v_s);
            __syncthreads();
            if (S::PREFETCH && k0 + ATT_CHUNK < end)
                load_chunk<S, EXACT>(kr, vr, k_cache, v_cache, table, k0 + ATT_CHUNK, end, kvh,
                                     kv_heads, hd);
            chunk_scores<S>(s_s, q_s, k_s, lim_s, hi_s, rows, k0, end, window);
            __syncthreads();
            chunk_softmax<S>(s_s, m_s, l_s, a_s, rows);
            __syncthreads();
            chunk_pv<S>(acc, s_s, v_s, a_s, rows);
            __syncthreads();
        }

        // Sum the key parts' accumulators (in part order) and write each row.
        const unsigned rp = warp % S::RPART, kp = warp / S::RPART;
#pragma unroll
        for (int i = 0; i < S::PV_ROWS; i++) {
            const unsigned r = rp + S::RPART * i;
            if (r < rows) {
#pragma unroll
                for (int e = 0; e < S::E; e++)
                    red_s[(kp * S::ROWS + r) * S::D + lane * S::E + e] = acc[i][e];
            }
        }
        __syncthreads();
        for (unsigned i = tid; i < rows * S::D; i += ATT_THREADS) {
            const unsigned r = i / S::D, d = i % S::D;
            if (!EXACT && d >= hd) continue;
            float sum = 0.0f;
#pragma unroll
            for (int p = 0; p < S::KPART; p++) sum += red_s[(p * S::ROWS + r) * S::D + d];
            const unsigned row = base + r;
            const unsigned long long o =
                (unsigned long long)(first + row / group) * q_heads + kvh * group + row % group;
            if (splits_s > 1) {
                const unsigned long long po = (unsigned long long)split * num_tokens * q_heads + o;
                part_o[po * hd + d] = sum;
                if (d == 0) part_ml[po] = make_float2(m_s[r], l_s[r]);
            } else {
                const float l = l_s[r];
                store_f32(out, o * hd + d, l > 0.0f ? sum / l : 0.0f);
            }
        }
        __syncthreads();
    }
    if (splits_s > 1 && split < splits_s)
        att_merge_if_last(out, part_o, part_ml, tile_counters, tiles, splits_s, num_tokens, q_heads,
                          hd);
}

#define ATTENTION(NAME, SHAPE, EXACT, TOut, MIN_BLOCKS)                                          \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS, MIN_BLOCKS)                        \
        NAME(TOut* __restrict__ out, float* __restrict__ part_o, float2* __restrict__ part_ml,   \
             unsigned* __restrict__ tile_counters, const float* __restrict__ qkv, const bf16* __restrict__ k_cache,                    \
             const bf16* __restrict__ v_cache, const unsigned* __restrict__ tiles,               \
             const unsigned* __restrict__ positions, const unsigned* __restrict__ context_lens,  \
             const unsigned* __restrict__ block_tables, unsigned block_stride,                  \
             unsigned num_tokens, unsigned q_heads, unsigned kv_heads, unsigned head_dim,       \
             float scale, unsigned window, const float* __restrict__ sinks,                     \
             const unsigned* __restrict__ through) {                                            \
        paged_attention<SHAPE, EXACT>(out, part_o, part_ml, tile_counters, qkv, k_cache, v_cache, tiles,       \
                                      positions, context_lens, block_tables, block_stride,      \
                                      num_tokens, q_heads, kv_heads, head_dim, scale, window,   \
                                      sinks, through);                                          \
    }

ATTENTION(attention_decode_hd64_f32, DecodeHd64, true, float, 2)
ATTENTION(attention_decode_hd64_bf16, DecodeHd64, true, bf16, 2)
ATTENTION(attention_decode_hd128_f32, DecodeHd128, true, float, 2)
ATTENTION(attention_decode_hd128_bf16, DecodeHd128, true, bf16, 2)
ATTENTION(attention_decode_any_f32, DecodeAny, false, float, 1)
ATTENTION(attention_decode_any_bf16, DecodeAny, false, bf16, 1)
ATTENTION(attention_prefill_any_f32, PrefillAny, false, float, 1)
ATTENTION(attention_prefill_any_bf16, PrefillAny, false, bf16, 1)
ATTENTION(attention_decode_wide_f32, Wide, false, float, 1)
ATTENTION(attention_decode_wide_bf16, Wide, false, bf16, 1)
ATTENTION(attention_prefill_wide_f32, Wide, false, float, 1)
ATTENTION(attention_prefill_wide_bf16, Wide, false, bf16, 1)
