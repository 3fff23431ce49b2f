// LoRA for every row of a step in one shrink and one expand launch per projection, whatever mix
// of adapters the rows hold (Punica's BGMV / SGMV). Rows reach their adapter through a device
// table with one slot per resident adapter, one table per (layer, projection): a slot holds
// A [rank, in] and Bᵀ [rank, out] (bf16, scale folded into B) and the pair's rank (0 where the
// adapter leaves the projection alone). The step lists its adapter rows as entries (token row,
// slot) sorted by slot, so a block's rows mostly share one A; an entry with slot LORA_NO_SLOT
// (padding of a graph-keyed step) is skipped.
//
// shrink: t[split][e][r] = Σ_{k in split} x[row_e, k] · A[r, k]      (one K split per grid z)
// expand: out[row_e, offset + n] += Σ_r (Σ_split t[split][e][r]) · Bᵀ[r, n]
//
// Launch shapes depend on the entry count, the rank bound (the largest rank the table has held,
// a power of two) and the widths only, never on which adapters a step holds: that is what
// lets a decode step with adapters replay from a CUDA graph. The host mirrors these constants
// in crates/engine-cuda/src/lora.rs.
#include "common.cuh"

#define LORA_NO_SLOT 0xffffffffu
#define LORA_THREADS 128
// Shrink: entries and ranks per block; 8-element chunks per thread per K split.
#define LORA_SHRINK_ROWS 4
#define LORA_RANKS 8
#define LORA_CHUNKS 2
#define LORA_K_SPLIT (LORA_THREADS * 8 * LORA_CHUNKS)
// Expand: entries per block; each thread takes two adjacent output columns.
#define LORA_EXPAND_ROWS 4
#define LORA_EXPAND_COLS (LORA_THREADS * 2)

struct LoraSlot {
    const bf16* a;
    const bf16* bt;
    unsigned rank;
    unsigned pad_;
};

// Ranks of rank tile `r0` an entry has at this projection (0: none, or no adapter).
__device__ __forceinline__ unsigned lora_tile_ranks(const LoraSlot* table,
                                                    const unsigned* slots, unsigned e,
                                                    unsigned entries, unsigned r0) {
    if (e >= entries) return 0;
    const unsigned slot = slots[e];
    if (slot == LORA_NO_SLOT) return 0;
    const unsigned rank = table[slot].rank;
    return rank > r0 ? min(rank - r0, (unsigned)LORA_RANKS) : 0;
}

// The bf16 bits of p[base + k .. base + k + 8], two per word: one 16-byte load when `vec`
// (width a multiple of 8, so aligned), else element by element with zeros past `width`.
__device__ __forceinline__ uint4 lora_load8_bits(const bf16* p, unsigned long long base,
                                                 unsigned k, unsigned width, bool vec) {
    if (vec) return *reinterpret_cast<const uint4*>(p + base + k);
    unsigned w[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const unsigned lo = k + 2 * j < width ? p[base + k + 2 * j] : 0u;
        const unsigned hi = k + 2 * j + 1 < width ? p[base + k + 2 * j + 1] : 0u;
        w[j] = lo | (hi << 16);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// Σ_j x[j] · bf16 value j of `a`.
__device__ __forceinline__ float lora_dot8(const float x[8], uint4 a) {
    const unsigned w[4] = {a.x, a.y, a.z, a.w};
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        s += x[2 * j] * __uint_as_float(w[j] << 16);
        s += x[2 * j + 1] * __uint_as_float(w[j] & 0xffff0000u);
    }
    return s;
}

// v = p[base + k .. base + k + 8] as f32 (see lora_load8_bits).
__device__ __forceinline__ void lora_load8(const bf16* p, unsigned long long base, unsigned k,
                                           unsigned width, bool vec, float v[8]) {
    const uint4 u = lora_load8_bits(p, base, k, width, vec);
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        v[2 * j] = __uint_as_float(w[j] << 16);
        v[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
    }
}

__device__ __forceinline__ void lora_load8(const float* p, unsigned long long base, unsigned k,
                                           unsigned width, bool vec, float v[8]) {
    if (vec) {
        const float4 lo = *reinterpret_cast<const float4*>(p + base + k);
        const float4 hi = *reinterpret_cast<const float4*>(p + base + k + 4);
        v[0] = lo.x; v[1] = lo.y; v[2] = lo.z; v[3] = lo.w;
        v[4] = hi.x; v[5] = hi.y; v[6] = hi.z; v[7] = hi.w;
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = k + j < width ? p[base + k + j] : 0.0f;
    }
}

// Grid (ceil(entries / LORA_SHRINK_ROWS), rank_bound / LORA_RANKS, ceil(x_width / LORA_K_SPLIT))
// of LORA_THREADS. A block holds the A chunk of its first entry in registers and reloads it
// only when the next entry's slot differs (entries are sorted by slot); thread partial sums
// are reduced per (entry, rank) through shared memory, in a fixed order.
template <typename TX>
__device__ __forceinline__ void lora_shrink_impl(float* __restrict__ t, const TX* __restrict__ x,
                                                 const LoraSlot* __restrict__ table,
                                                 const unsigned* __restrict__ rows,
                                                 const unsigned* __restrict__ slots,
                                                 unsigned entries, unsigned x_width,
                                                 unsigned rank_bound) {
    static_assert(LORA_SHRINK_ROWS * LORA_RANKS == 32, "one reduced value per lane of a warp");
    __shared__ float red[LORA_THREADS][33];
    __shared__ float quarter[LORA_THREADS / 32][32];
    const unsigned e0 = blockIdx.x * LORA_SHRINK_ROWS, r0 = blockIdx.y * LORA_RANKS;
    const unsigned tid = threadIdx.x;
    const bool vec = (x_width & 7u) == 0;

    unsigned nr[LORA_SHRINK_ROWS];
    const bf16* a[LORA_SHRINK_ROWS];
    unsigned long long xrow[LORA_SHRINK_ROWS];
    unsigned any = 0;
#pragma unroll
    for (int i = 0; i < LORA_SHRINK_ROWS; i++) {
        nr[i] = lora_tile_ranks(table, slots, e0 + i, entries, r0);
        a[i] = nr[i] ? table[slots[e0 + i]].a + (unsigned long long)r0 * x_width : nullptr;
        xrow[i] = nr[i] ? (unsigned long long)rows[e0 + i] * x_width : 0;
        any |= nr[i];
    }
    // Padding entries, rows without an adapter, rank tiles past every entry's rank: nothing
    // to do (the same in every thread of the block, so no barrier is skipped by some only).
    if (any == 0) return;

    float acc[LORA_SHRINK_ROWS][LORA_RANKS];
#pragma unroll
    for (int i = 0; i < LORA_SHRINK_ROWS; i++)
#pragma unroll
        for (int r = 0; r < LORA_RANKS; r++) acc[i][r] = 0.0f;

#pragma unroll
    for (int c = 0; c < LORA_CHUNKS; c++) {
        const unsigned k = blockIdx.z * LORA_K_SPLIT + (c * LORA_THREADS + tid) * 8;
        if (k >= x_width) break;
        uint4 av[LORA_RANKS];  // bf16 bits: half the registers of f32
        const bf16* held = nullptr;
#pragma unroll
        for (int i = 0; i < LORA_SHRINK_ROWS; i++) {
            if (nr[i] == 0) continue;
            if (a[i] != held) {
                held = a[i];
#pragma unroll
                for (int r = 0; r < LORA_RANKS; r++) {
                    av[r] = (unsigned)r < nr[i]
                                ? lora_load8_bits(held, (unsigned long long)r * x_width, k,
                                                  x_width, vec)
                                : make_uint4(0u, 0u, 0u, 0u);
                }
            }
            float xv[8];
            lora_load8(x, xrow[i], k, x_width, vec, xv);
#pragma unroll
            for (int r = 0; r < LORA_RANKS; r++) acc[i][r] += lora_dot8(xv, av[r]);
        }
    }

    // Transpose through shared memory (row stride 33: conflict-free both ways): thread q*32+v
    // sums value v (entry v / LORA_RANKS, rank v % LORA_RANKS) over threads q*32 .. q*32+31,
    // then the first warp adds the LORA_THREADS / 32 quarters.
#pragma unroll
    for (int i = 0; i < LORA_SHRINK_ROWS; i++)
#pragma unroll
        for (int r = 0; r < LORA_RANKS; r++) red[tid][i * LORA_RANKS + r] = acc[i][r];
    __syncthreads();
    const unsigned v = tid & 31u, q = tid >> 5;
    float part = 0.0f;
#pragma unroll 8
    for (unsigned j = 0; j < 32; j++) part += red[q * 32 + j][v];
    quarter[q][v] = part;
    __syncthreads();
    if (tid < 32) {
        const unsigned i = v / LORA_RANKS, r = v % LORA_RANKS, e = e0 + i;
        if (r < lora_tile_ranks(table, slots, e, entries, r0)) {
            float s = 0.0f;
#pragma unroll
            for (int w = 0; w < LORA_THREADS / 32; w++) s += quarter[w][v];
            t[((unsigned long long)blockIdx.z * entries + e) * rank_bound + r0 + r] = s;
        }
    }
}

#define LORA_SHRINK(NAME, TX)                                                                  \
    extern "C" __global__ void NAME(float* __restrict__ t, const TX* __restrict__ x,          \
                                    const LoraSlot* __restrict__ table,                       \
                                    const unsigned* __restrict__ rows,                        \
                                    const unsigned* __restrict__ slots, unsigned entries,     \
                                    unsigned x_width, unsigned rank_bound) {                  \
        lora_shrink_impl(t, x, table, rows, slots, entries, x_width, rank_bound);              \
    }
LORA_SHRINK(lora_shrink_f32, float)
LORA_SHRINK(lora_shrink_bf16, bf16)

// Grid (ceil(entries / LORA_EXPAND_ROWS), ceil(n_out / LORA_EXPAND_COLS)) of LORA_THREADS,
// dynamic shared memory LORA_EXPAND_ROWS * rank_bound floats: the block first sums its entries'
// K-split partials into shared memory, then each thread adds Σ_r t[e, r] · Bᵀ[r, n] for its two
// columns (one 4-byte load per rank when n_out is even: a warp reads 128 contiguous bytes).
extern "C" __global__ void lora_expand(float* __restrict__ out, const float* __restrict__ t,
                                       const LoraSlot* __restrict__ table,
                                       const unsigned* __restrict__ rows,
                                       const unsigned* __restrict__ slots, unsigned entries,
                                       unsigned rank_bound, unsigned splits, unsigned n_out,
                                       unsigned out_width, unsigned out_offset) {
    LMI_DYNAMIC_SHARED(float, ts);
    const unsigned e0 = blockIdx.x * LORA_EXPAND_ROWS, tid = threadIdx.x;
    bool any = false;
    for (unsigned i = 0; i < LORA_EXPAND_ROWS && e0 + i < entries; i++)
        any |= slots[e0 + i] != LORA_NO_SLOT;
    if (!any) return;  // uniform: no thread waits at the barrier below
    for (unsigned idx = tid; idx < LORA_EXPAND_ROWS * rank_bound; idx += LORA_THREADS) {
        const unsigned e = e0 + idx / rank_bound, r = idx % rank_bound;
        const unsigned slot = e < entries ? slots[e] : LORA_NO_SLOT;
        float s = 0.0f;
        if (slot != LORA_NO_SLOT && r < table[slot].rank)
            for (unsigned sp = 0; sp < splits; sp++)
                s += t[((unsigned long long)sp * entries + e) * rank_bound + r];
        ts[idx] = s;
    }
    __syncthreads();
    const unsigned n = blockIdx.y * LORA_EXPAND_COLS + 2 * tid;
    if (n >= n_out) return;
    const bool pair = n + 1 < n_out, vec = (n_out & 1u) == 0;
    for (unsigned i = 0; i < LORA_EXPAND_ROWS; i++) {
        const unsigned e = e0 + i;
        if (e >= entries) break;
        const unsigned slot = slots[e];
        if (slot == LORA_NO_SLOT) continue;
        const LoraSlot s = table[slot];
        const float* te = ts + i * rank_bound;
        const bf16* b = s.bt + n;
        float acc0 = 0.0f, acc1 = 0.0f;
        if (vec) {
#pragma unroll 4
            for (unsigned r = 0; r < s.rank; r++) {
                const unsigned w =
                    *reinterpret_cast<const unsigned*>(b + (unsigned long long)r * n_out);
                acc0 += te[r] * __uint_as_float(w << 16);
                acc1 += te[r] * __uint_as_float(w & 0xffff0000u);
            }
        } else {
            for (unsigned r = 0; r < s.rank; r++) {
                const bf16* br = b + (unsigned long long)r * n_out;
                acc0 += te[r] * bf16_to_f32(br[0]);
                if (pair) acc1 += te[r] * bf16_to_f32(br[1]);
            }
        }
        float* o = out + (unsigned long long)rows[e] * out_width + out_offset + n;
        o[0] += acc0;
        if (pair) o[1] += acc1;
    }
}
