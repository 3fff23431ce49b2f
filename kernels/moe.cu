// Mixture-of-experts MLPs (Qwen3-MoE, Mixtral, gpt-oss) for every row of a step in six
// launches per layer, whatever the batch and whichever experts it wakes; never one per expert
// (engine-cuda/src/moe.rs launches them, in this order):
//   moe_router_*   logits[r, e] = x[r] · router[e] (+ bias[e]): f32 router, f32 sums
//   moe_route      each row's top_k experts and weights (crate::moe::route's rules), written
//                  in ascending expert order, the order of the final sum (moe_route_sigmoid
//                  for DeepSeek-style routing: sigmoid, correction bias, group limit)
//   moe_sort       the step's assignments (row, pick) grouped by expert, stable in row order,
//                  and the tiles the products take: up to MOE_TILE assignments of one expert
//   moe_gate_up_*  per tile: act = activation(x · gate_upᵀ + bias), bf16 (as the dense MLP
//                  rounds what feeds its down projection); a warp holds a column's gate and up
//   moe_down       per tile: y = act · downᵀ + bias, f32
//                  (both on tensor cores instead, moe_wmma.cu, where the layer's sizes are
//                  multiples of 16: the host picks per layer, so every step of a model runs
//                  the same kernels)
//   moe_combine    out[r] = Σ weight · y over the row's picks, ascending expert (transformers'
//                  index_add_ order, and the CPU backend's)
//
// A shared expert (Qwen2-MoE) runs the same launches as a layer of one expert that every row
// picks with weight σ(its gate's logit) (moe_route's MOE_SIGMOID_GATE), combined into a buffer
// of its own and added to the routed sum after it, as transformers adds it.
//
// The grouped products here: grid (column blocks, tiles), one block per (tile, MOE_BLOCK_COLS
// columns). A tile's rows are staged in shared memory MOE_CHUNK of K at a time; each warp
// streams its weight rows 16 bytes a lane (512 contiguous bytes per warp), so an expert's
// weights are read once per tile: once per step for an expert that at most MOE_TILE of the
// step's rows picked, which is every expert of a decode step of up to MOE_TILE rows. The tile
// list has a fixed length for a given step shape (unused tiles have count 0 and return at
// once), so launches depend on the row count only and decode steps replay from CUDA graphs.
//
// Batch invariance: every product is computed per (row, column) with the same lane split and
// k order whatever else shares its tile; routing and the final sum are per row. A row's result
// does not depend on the other rows of the step, nor on which experts they pick.
#include "common.cuh"
#include "moe.cuh"
#include "rows.cuh"

#define MOE_TILE 8
#define MOE_THREADS 256
#define MOE_WARPS 8
#define MOE_WARP_COLS 2
#define MOE_BLOCK_COLS (MOE_WARPS * MOE_WARP_COLS)
#define MOE_CHUNK 2048
#define MOE_SORT_THREADS 256

// logits [rows, experts]: grid (ceil(experts / 8), min(rows, 65535)), 256 threads, one warp
// per (row, expert), lanes over k in a fixed order.
template <typename TX>
__device__ __forceinline__ void moe_router(float* __restrict__ logits, const TX* __restrict__ x,
                                           const float* __restrict__ router,
                                           const float* __restrict__ bias, unsigned rows,
                                           unsigned experts, unsigned hidden) {
    const unsigned lane = threadIdx.x & 31u;
    const unsigned e = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (e >= experts) return;  // whole warps
    const float* w = router + (unsigned long long)e * hidden;
    for (unsigned long long r = blockIdx.y; r < rows; r += gridDim.y) {
        const TX* xr = x + r * hidden;
        float s = 0.0f;
        for (unsigned k = lane; k < hidden; k += 32) s = fmaf(load_f32(xr, k), w[k], s);
        s = warp_sum(s);
        if (lane == 0) logits[r * experts + e] = s + (bias != nullptr ? bias[e] : 0.0f);
    }
}

extern "C" __global__ void moe_router_f32(float* logits, const float* x, const float* router,
                                          const float* bias, unsigned rows, unsigned experts,
                                          unsigned hidden) {
    moe_router(logits, x, router, bias, rows, experts, hidden);
}

extern "C" __global__ void moe_router_bf16(float* logits, const bf16* x, const float* router,
                                           const float* bias, unsigned rows, unsigned experts,
                                           unsigned hidden) {
    moe_router(logits, x, router, bias, rows, experts, hidden);
}

// Whether (v, i) ranks before (w, j): the larger logit, the lower index among equals; an
// index of ~0 (a lane with nothing left) ranks last.
__device__ __forceinline__ bool moe_before(float v, unsigned i, float w, unsigned j) {
    if (j == ~0u) return i != ~0u;
    if (i == ~0u) return false;
    return v > w || (v == w && i < j);
}

// ids, weights [rows, top_k]: each row's picks in ascending expert order. One warp per row
// (grid ceil(rows / 8) of 256 threads); expert e is lane e % 32's, bit e / 32 of its mask.
// top_k <= min(experts, MOE_MAX_TOP_K) and experts <= MOE_MAX_EXPERTS (the host checks).
extern "C" __global__ void moe_route(unsigned* __restrict__ ids, float* __restrict__ weights,
                                     const float* __restrict__ logits, unsigned rows,
                                     unsigned experts, unsigned top_k, unsigned routing) {
    const unsigned lane = threadIdx.x & 31u;
    const unsigned r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;  // whole warps
    const float* l = logits + (unsigned long long)r * experts;
    unsigned taken = 0;
    unsigned pick[MOE_MAX_TOP_K];
    float val[MOE_MAX_TOP_K];
    for (unsigned p = 0; p < top_k; p++) {
        float best = LMI_NEG_INF;
        unsigned bi = ~0u;
        for (unsigned j = 0, e = lane; e < experts; j++, e += 32) {
            if ((taken >> j) & 1u) continue;
            if (moe_before(l[e], e, best, bi)) {
                best = l[e];
                bi = e;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(LMI_FULL_MASK, best, o);
            const unsigned oi = __shfl_xor_sync(LMI_FULL_MASK, bi, o);
            if (moe_before(ov, oi, best, bi)) {
                best = ov;
                bi = oi;
            }
        }
        pick[p] = bi;
        val[p] = best;
        if (bi % 32u == lane) taken |= 1u << (bi / 32u);
    }

    // Weights, in pick order (descending), as crate::moe::route computes them.
    float w[MOE_MAX_TOP_K];
    if (routing == MOE_ONE) {
        for (unsigned p = 0; p < top_k; p++) w[p] = 1.0f;
    } else if (routing == MOE_SIGMOID_GATE) {
        for (unsigned p = 0; p < top_k; p++) w[p] = 1.0f / (1.0f + expf(-val[p]));
    } else if (routing == MOE_TOPK_SOFTMAX) {
        float sum = 0.0f;
        for (unsigned p = 0; p < top_k; p++) {
            w[p] = expf(val[p] - val[0]);
            sum += w[p];
        }
        for (unsigned p = 0; p < top_k; p++) w[p] /= sum;
    } else {
        float part = 0.0f;
        for (unsigned e = lane; e < experts; e += 32) part += expf(l[e] - val[0]);
        const float sum = warp_sum(part);
        float total = 0.0f;
        for (unsigned p = 0; p < top_k; p++) {
            w[p] = expf(val[p] - val[0]) / sum;
            total += w[p];
        }
        if (routing == MOE_SOFTMAX_TOPK_RENORM)
            for (unsigned p = 0; p < top_k; p++) w[p] /= total;
    }

    // Ascending expert order (insertion sort of at most MOE_MAX_TOP_K picks).
    for (unsigned p = 1; p < top_k; p++) {
        const unsigned e = pick[p];
        const float x = w[p];
        unsigned q = p;
        for (; q > 0 && pick[q - 1] > e; q--) {
            pick[q] = pick[q - 1];
            w[q] = w[q - 1];
        }
        pick[q] = e;
        w[q] = x;
    }
    if (lane == 0) {
        for (unsigned p = 0; p < top_k; p++) {
            ids[(unsigned long long)r * top_k + p] = pick[p];
            weights[(unsigned long long)r * top_k + p] = w[p];
        }
    }
}

// DeepSeek-V3's routing (crate::moe::Routing::SigmoidGroupedTopK, crate::moe::route's rules):
// experts chosen by c[e] = σ(logit[e]) + bias[e] within the topk_group best of n_group equal
// groups (each ranked by the sum of its two best c), weighted by σ(logit) of the picks,
// divided by their sum (+ 1e-20) when renormalize, times scaling. ids, weights [rows, top_k]
// in ascending expert order, as moe_route writes them. One warp per row (grid ceil(rows / 8)
// of 256 threads); group g is lane g's (n_group <= MOE_MAX_GROUPS, the host checks); ties go
// to the lower index, groups' and experts' alike.
__device__ __forceinline__ float moe_choice(const float* l, const float* bias, unsigned e) {
    return 1.0f / (1.0f + expf(-l[e])) + (bias != nullptr ? bias[e] : 0.0f);
}

extern "C" __global__ void moe_route_sigmoid(unsigned* __restrict__ ids,
                                             float* __restrict__ weights,
                                             const float* __restrict__ logits,
                                             const float* __restrict__ bias, unsigned rows,
                                             unsigned experts, unsigned top_k, unsigned n_group,
                                             unsigned topk_group, unsigned renormalize,
                                             float scaling) {
    const unsigned lane = threadIdx.x & 31u;
    const unsigned r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;  // whole warps
    const float* l = logits + (unsigned long long)r * experts;
    const unsigned per = experts / n_group;
    // Which groups stay: all of them unless the limit drops some.
    unsigned kept = 0xffffffffu;
    if (n_group > 1 && topk_group < n_group) {
        float score = LMI_NEG_INF;
        unsigned mine = ~0u;
        if (lane < n_group) {
            float a = LMI_NEG_INF, b = LMI_NEG_INF;
            for (unsigned e = lane * per; e < (lane + 1) * per; e++) {
                const float c = moe_choice(l, bias, e);
                if (c > a) {
                    b = a;
                    a = c;
                } else if (c > b) {
                    b = c;
                }
            }
            score = a + b;
            mine = lane;
        }
        kept = 0;
        for (unsigned p = 0; p < topk_group; p++) {
            float best = (kept >> lane) & 1u ? LMI_NEG_INF : score;
            unsigned bi = (kept >> lane) & 1u ? ~0u : mine;
            for (int o = 16; o > 0; o >>= 1) {
                const float ov = __shfl_xor_sync(LMI_FULL_MASK, best, o);
                const unsigned oi = __shfl_xor_sync(LMI_FULL_MASK, bi, o);
                if (moe_before(ov, oi, best, bi)) {
                    best = ov;
                    bi = oi;
                }
            }
            kept |= 1u << bi;
        }
    }
    unsigned taken = 0;
    unsigned pick[MOE_MAX_TOP_K];
    for (unsigned p = 0; p < top_k; p++) {
        float best = LMI_NEG_INF;
        unsigned bi = ~0u;
        for (unsigned j = 0, e = lane; e < experts; j++, e += 32) {
            if ((taken >> j) & 1u) continue;
            if (!((kept >> (e / per)) & 1u)) continue;
            const float c = moe_choice(l, bias, e);
            if (moe_before(c, e, best, bi)) {
                best = c;
                bi = e;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(LMI_FULL_MASK, best, o);
            const unsigned oi = __shfl_xor_sync(LMI_FULL_MASK, bi, o);
            if (moe_before(ov, oi, best, bi)) {
                best = ov;
                bi = oi;
            }
        }
        pick[p] = bi;
        if (bi % 32u == lane) taken |= 1u << (bi / 32u);
    }
    // Weights in pick order (descending choice), summed in that order as the CPU does.
    float w[MOE_MAX_TOP_K];
    float total = 0.0f;
    for (unsigned p = 0; p < top_k; p++) {
        w[p] = 1.0f / (1.0f + expf(-l[pick[p]]));
        total += w[p];
    }
    total += 1e-20f;
    for (unsigned p = 0; p < top_k; p++) w[p] = (renormalize ? w[p] / total : w[p]) * scaling;
    // Ascending expert order (insertion sort of at most MOE_MAX_TOP_K picks).
    for (unsigned p = 1; p < top_k; p++) {
        const unsigned e = pick[p];
        const float x = w[p];
        unsigned q = p;
        for (; q > 0 && pick[q - 1] > e; q--) {
            pick[q] = pick[q - 1];
            w[q] = w[q - 1];
        }
        pick[q] = e;
        w[q] = x;
    }
    if (lane == 0) {
        for (unsigned p = 0; p < top_k; p++) {
            ids[(unsigned long long)r * top_k + p] = pick[p];
            weights[(unsigned long long)r * top_k + p] = w[p];
        }
    }
}

// One block of MOE_SORT_THREADS. order[s] = the assignment (r · top_k + p) at sorted position
// s, grouped by expert ascending and by assignment within an expert; slot[a] its inverse;
// tiles[0 .. max_tiles) the tiles of up to tile_rows assignments, in order, then unused ones
// (count 0). max_tiles bounds Σ_e ceil(count_e / tile_rows) (the host's `max_tiles`).
extern "C" __global__ void __launch_bounds__(MOE_SORT_THREADS) moe_sort(
    unsigned* __restrict__ order, unsigned* __restrict__ slot, MoeTile* __restrict__ tiles,
    const unsigned* __restrict__ ids, unsigned n, unsigned experts, unsigned max_tiles,
    unsigned tile_rows) {
    __shared__ unsigned count[MOE_MAX_EXPERTS];
    __shared__ unsigned cursor[MOE_MAX_EXPERTS];
    __shared__ unsigned chunk_ids[MOE_SORT_THREADS];
    const unsigned tid = threadIdx.x;
    for (unsigned e = tid; e < experts; e += MOE_SORT_THREADS) count[e] = 0;
    __syncthreads();
    // Counts do not depend on the order the additions land in.
    for (unsigned a = tid; a < n; a += MOE_SORT_THREADS) atomicAdd(&count[ids[a]], 1u);
    __syncthreads();
    if (tid == 0) {
        unsigned start = 0, t = 0;
        for (unsigned e = 0; e < experts; e++) {
            cursor[e] = start;
            for (unsigned s = 0; s < count[e] && t < max_tiles; s += tile_rows, t++) {
                MoeTile tile;
                tile.expert = e;
                tile.start = start + s;
                tile.count = min(tile_rows, count[e] - s);
                tile.pad_ = 0;
                tiles[t] = tile;
            }
            start += count[e];
        }
        for (; t < max_tiles; t++) {
            MoeTile none;
            none.expert = none.start = none.count = none.pad_ = 0;
            tiles[t] = none;
        }
    }
    __syncthreads();
    // Chunks of the assignments in order: an assignment's position is its expert's cursor
    // plus the earlier assignments of the chunk with the same expert.
    for (unsigned base = 0; base < n; base += MOE_SORT_THREADS) {
        const unsigned a = base + tid;
        const unsigned e = a < n ? ids[a] : ~0u;
        chunk_ids[tid] = e;
        __syncthreads();
        if (a < n) {
            unsigned rank = 0;
            for (unsigned i = 0; i < tid; i++) rank += chunk_ids[i] == e;
            const unsigned pos = cursor[e] + rank;
            order[pos] = a;
            slot[a] = pos;
        }
        __syncthreads();
        if (a < n) atomicAdd(&cursor[e], 1u);
        __syncthreads();
    }
}

// acc[j][i] += Σ_{c < kc} xs[i][c] · wrow[j][c] for the tile's `rows` staged rows, lanes
// taking 8 consecutive k at a time (kc a multiple of 8, rows 16-byte aligned).
template <int R>
__device__ __forceinline__ void moe_tile_dot(float (&acc)[R][MOE_TILE], const bf16* const* wrow,
                                             const bf16* xs, unsigned rows, unsigned kc,
                                             unsigned lane) {
#pragma unroll
    for (int j = 0; j < R; j++) {
        if (wrow[j] == nullptr) continue;
        for (unsigned c = lane * 8; c < kc; c += 256) {
            float wf[8];
            bf16x8_to_f32(*reinterpret_cast<const uint4*>(wrow[j] + c), wf);
#pragma unroll
            for (int i = 0; i < MOE_TILE; i++) {
                if ((unsigned)i >= rows) break;
                const uint4 av = *reinterpret_cast<const uint4*>(xs + i * MOE_CHUNK + c);
                acc[j][i] = fma_bf16x8(av, wf, acc[j][i]);
            }
        }
    }
}

// act [n, width] (sorted order): grid (ceil(width / MOE_BLOCK_COLS), max_tiles), MOE_THREADS.
// Warp w of a block owns act columns col0 + 0..MOE_WARP_COLS, i.e. gate rows col and up rows
// width + col of its tile's expert. hidden and width multiples of 8 (the host checks).
template <typename TX>
__device__ __forceinline__ void moe_gate_up(bf16* __restrict__ act, const TX* __restrict__ x,
                                            const MoeExpert* __restrict__ experts,
                                            const MoeTile* __restrict__ tiles,
                                            const unsigned* __restrict__ order, unsigned top_k,
                                            unsigned hidden, unsigned width,
                                            unsigned activation, float alpha, float limit) {
    __shared__ __align__(16) bf16 xs[MOE_TILE * MOE_CHUNK];
    __shared__ unsigned long long xrow[MOE_TILE];
    const MoeTile tile = tiles[blockIdx.y];
    if (tile.count == 0) return;  // the whole block, before any barrier
    const MoeExpert ex = experts[tile.expert];
    const unsigned tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const unsigned col0 = (blockIdx.x * MOE_WARPS + warp) * MOE_WARP_COLS;
    if (tid < tile.count) xrow[tid] = (unsigned long long)(order[tile.start + tid] / top_k);

    // Rows 2j and 2j + 1: column col0 + j's gate and up.
    const bf16* wrow[2 * MOE_WARP_COLS];
#pragma unroll
    for (int j = 0; j < MOE_WARP_COLS; j++) {
        const bool live = col0 + j < width;
        wrow[2 * j] = live ? ex.gate_up + (unsigned long long)(col0 + j) * hidden : nullptr;
        wrow[2 * j + 1] =
            live ? ex.gate_up + (unsigned long long)(width + col0 + j) * hidden : nullptr;
    }
    float acc[2 * MOE_WARP_COLS][MOE_TILE];
#pragma unroll
    for (int j = 0; j < 2 * MOE_WARP_COLS; j++)
#pragma unroll
        for (int i = 0; i < MOE_TILE; i++) acc[j][i] = 0.0f;

    for (unsigned k0 = 0; k0 < hidden; k0 += MOE_CHUNK) {
        const unsigned kc = min((unsigned)MOE_CHUNK, hidden - k0);
        __syncthreads();  // xrow written; the previous chunk's readers are done with xs
        for (unsigned i = 0; i < tile.count; i++) {
            const TX* xr = x + xrow[i] * hidden + k0;
            for (unsigned c = tid; c < kc; c += MOE_THREADS) xs[i * MOE_CHUNK + c] = moe_bf16(xr[c]);
        }
        __syncthreads();
        const bf16* w[2 * MOE_WARP_COLS];
#pragma unroll
        for (int j = 0; j < 2 * MOE_WARP_COLS; j++) w[j] = wrow[j] ? wrow[j] + k0 : nullptr;
        moe_tile_dot(acc, w, xs, tile.count, kc, lane);
    }

#pragma unroll
    for (int j = 0; j < MOE_WARP_COLS; j++) {
        const unsigned col = col0 + j;
        if (col >= width) break;  // the whole warp
        const float bg = ex.gate_up_bias != nullptr ? ex.gate_up_bias[col] : 0.0f;
        const float bu = ex.gate_up_bias != nullptr ? ex.gate_up_bias[width + col] : 0.0f;
        for (unsigned i = 0; i < tile.count; i++) {
            const float g = warp_sum(acc[2 * j][i]) + bg;
            const float u = warp_sum(acc[2 * j + 1][i]) + bu;
            if (lane == 0)
                act[(unsigned long long)(tile.start + i) * width + col] =
                    f32_to_bf16(moe_activate(g, u, activation, alpha, limit));
        }
    }
}

extern "C" __global__ void __launch_bounds__(MOE_THREADS) moe_gate_up_f32(
    bf16* act, const float* x, const MoeExpert* experts, const MoeTile* tiles,
    const unsigned* order, unsigned top_k, unsigned hidden, unsigned width, unsigned activation,
    float alpha, float limit) {
    moe_gate_up(act, x, experts, tiles, order, top_k, hidden, width, activation, alpha, limit);
}

extern "C" __global__ void __launch_bounds__(MOE_THREADS) moe_gate_up_bf16(
    bf16* act, const bf16* x, const MoeExpert* experts, const MoeTile* tiles,
    const unsigned* order, unsigned top_k, unsigned hidden, unsigned width, unsigned activation,
    float alpha, float limit) {
    moe_gate_up(act, x, experts, tiles, order, top_k, hidden, width, activation, alpha, limit);
}

// y [n, hidden] (sorted order) = act · downᵀ + bias: grid (ceil(hidden / MOE_BLOCK_COLS),
// max_tiles), MOE_THREADS; warp w owns output columns col0 + 0..MOE_WARP_COLS.
extern "C" __global__ void __launch_bounds__(MOE_THREADS) moe_down(
    float* __restrict__ y, const bf16* __restrict__ act, const MoeExpert* __restrict__ experts,
    const MoeTile* __restrict__ tiles, unsigned hidden, unsigned width) {
    __shared__ __align__(16) bf16 xs[MOE_TILE * MOE_CHUNK];
    const MoeTile tile = tiles[blockIdx.y];
    if (tile.count == 0) return;
    const MoeExpert ex = experts[tile.expert];
    const unsigned tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const unsigned col0 = (blockIdx.x * MOE_WARPS + warp) * MOE_WARP_COLS;
    const bf16* wrow[MOE_WARP_COLS];
#pragma unroll
    for (int j = 0; j < MOE_WARP_COLS; j++)
        wrow[j] = col0 + j < hidden ? ex.down + (unsigned long long)(col0 + j) * width : nullptr;
    float acc[MOE_WARP_COLS][MOE_TILE];
#pragma unroll
    for (int j = 0; j < MOE_WARP_COLS; j++)
#pragma unroll
        for (int i = 0; i < MOE_TILE; i++) acc[j][i] = 0.0f;

    for (unsigned k0 = 0; k0 < width; k0 += MOE_CHUNK) {
        const unsigned kc = min((unsigned)MOE_CHUNK, width - k0);
        __syncthreads();  // the previous chunk's readers are done with xs
        for (unsigned i = 0; i < tile.count; i++) {
            const bf16* ar = act + (unsigned long long)(tile.start + i) * width + k0;
            for (unsigned c = tid; c < kc; c += MOE_THREADS) xs[i * MOE_CHUNK + c] = ar[c];
        }
        __syncthreads();
        const bf16* w[MOE_WARP_COLS];
#pragma unroll
        for (int j = 0; j < MOE_WARP_COLS; j++) w[j] = wrow[j] ? wrow[j] + k0 : nullptr;
        moe_tile_dot(acc, w, xs, tile.count, kc, lane);
    }

#pragma unroll
    for (int j = 0; j < MOE_WARP_COLS; j++) {
        const unsigned col = col0 + j;
        if (col >= hidden) break;
        const float b = ex.down_bias != nullptr ? ex.down_bias[col] : 0.0f;
        for (unsigned i = 0; i < tile.count; i++) {
            const float s = warp_sum(acc[j][i]) + b;
            if (lane == 0) y[(unsigned long long)(tile.start + i) * hidden + col] = s;
        }
    }
}

// out [rows, hidden] = Σ_p weights[r, p] · y[slot[r, p]], p ascending (ascending expert).
// rows_cols launch (rows.cuh); n = rows · hidden.
extern "C" __global__ void moe_combine(float* __restrict__ out, const float* __restrict__ y,
                                       const float* __restrict__ weights,
                                       const unsigned* __restrict__ slot, unsigned top_k,
                                       unsigned hidden, unsigned long long n) {
    FOR_ROWS(r, hidden, n) {
        const unsigned long long a0 = r * top_k;
        FOR_COLS(c, hidden) {
            float s = 0.0f;
            for (unsigned p = 0; p < top_k; p++)
                s += weights[a0 + p] * y[(unsigned long long)slot[a0 + p] * hidden + c];
            out[r * hidden + c] = s;
        }
    }
}

