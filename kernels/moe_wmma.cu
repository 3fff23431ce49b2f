// moe.cu's two grouped products on tensor cores (bf16 in, f32 accumulation), for layers whose
// hidden size and expert width are multiples of 16: engine-cuda/src/moe.rs decides per layer at load, so
// every step of a model runs the same kernels whatever its rows. The routing, the sort (with
// tiles of MOE_WTILE rows) and the final sum are moe.cu's.
//
// Design:
// - Grid (ceil(columns / MOE_W_COLS), tiles), MOE_W_WARPS warps: a block takes one tile (up
//   to 16 assignments of one expert, zero rows past its count) and MOE_W_COLS output
//   columns, 16 per warp (moe_gate_up: 16 activation columns, from a gate and an up
//   fragment). An expert's weights are read once per tile: at decode, once per step for every
//   expert at most 16 of the step's rows picked; a prefill's busy experts take a tile per 16
//   of their rows, each product a tensor-core MMA instead of moe.cu's CUDA-core dot products.
// - The tile's rows are gathered into shared memory MOE_W_CHUNK of K at a time (bf16, as the
//   dense products' inputs are); B fragments load straight from the weights, a row-major
//   [n, k] matrix read as the column-major K × N operand (ldm = k, 32-byte aligned because k
//   is a multiple of 16).
// - The epilogue goes through shared memory (a fragment's element-to-lane mapping is
//   unspecified): bias, activation, and the rows the tile has.
// - Batch invariance: an output element is its row's MMA sums over k in a fixed order, which
//   the other rows of the tile (or their zeros) do not touch.
#include "common.cuh"
#include "moe.cuh"
#include "wmma.cuh"

using namespace nvcuda;

#define MOE_WTILE 16
#define MOE_W_WARPS 4
#define MOE_W_THREADS 128  // 32 · MOE_W_WARPS (a literal: the emulator's kernel finder reads it)
#define MOE_W_COLS (16 * MOE_W_WARPS)
#define MOE_W_CHUNK 256
// Shared row stride in bf16: rows 32-byte aligned (wmma's rule), shifted 32 bytes a row.
#define MOE_W_LD (MOE_W_CHUNK + 16)

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> MoeAcc;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> MoeA;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> MoeB;

__device__ __forceinline__ const __nv_bfloat16* moe_w(const bf16* p) {
    return reinterpret_cast<const __nv_bfloat16*>(p);
}

// xs[r][c] = src row r's values k0 .. k0 + kc (bf16), zeros for rows at or past `count`.
template <typename TX>
__device__ __forceinline__ void moe_w_stage(bf16* xs, const TX* src, const unsigned long long* rows,
                                            unsigned count, unsigned k, unsigned k0,
                                            unsigned kc) {
    for (unsigned i = threadIdx.x; i < MOE_WTILE * kc; i += MOE_W_THREADS) {
        const unsigned r = i / kc, c = i % kc;
        xs[r * MOE_W_LD + c] = r < count ? moe_bf16(src[rows[r] * k + k0 + c]) : (bf16)0;
    }
}

// act [n, width] (sorted order): grid (ceil(width / MOE_W_COLS), max_tiles).
template <typename TX>
__device__ __forceinline__ void moe_gate_up_w(bf16* __restrict__ act, const TX* __restrict__ x,
                                              const MoeExpert* __restrict__ experts,
                                              const MoeTile* __restrict__ tiles,
                                              const unsigned* __restrict__ order, unsigned top_k,
                                              unsigned hidden, unsigned width,
                                              unsigned activation, float alpha, float limit) {
    __shared__ __align__(32) bf16 xs[MOE_WTILE * MOE_W_LD];
    __shared__ __align__(32) float cs[MOE_W_WARPS][2][16 * 16];
    __shared__ unsigned long long xrow[MOE_WTILE];
    const MoeTile tile = tiles[blockIdx.y];
    if (tile.count == 0) return;  // the whole block, before any barrier
    const MoeExpert ex = experts[tile.expert];
    const unsigned tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const unsigned col0 = blockIdx.x * MOE_W_COLS + warp * 16;
    const bool live = col0 < width;  // the whole warp
    if (tid < MOE_WTILE)
        xrow[tid] = tid < tile.count ? (unsigned long long)(order[tile.start + tid] / top_k) : 0;

    MoeAcc g, u;
    wmma::fill_fragment(g, 0.0f);
    wmma::fill_fragment(u, 0.0f);
    const bf16* wg = ex.gate_up + (unsigned long long)col0 * hidden;
    const bf16* wu = ex.gate_up + (unsigned long long)(width + col0) * hidden;
    for (unsigned k0 = 0; k0 < hidden; k0 += MOE_W_CHUNK) {
        const unsigned kc = min((unsigned)MOE_W_CHUNK, hidden - k0);
        __syncthreads();  // xrow written; the previous chunk's readers are done with xs
        moe_w_stage(xs, x, xrow, tile.count, hidden, k0, kc);
        __syncthreads();
        if (live) {
            for (unsigned kk = 0; kk < kc; kk += 16) {
                MoeA a;
                MoeB b;
                wmma::load_matrix_sync(a, moe_w(xs + kk), MOE_W_LD);
                wmma::load_matrix_sync(b, moe_w(wg + k0 + kk), hidden);
                wmma::mma_sync(g, a, b, g);
                wmma::load_matrix_sync(b, moe_w(wu + k0 + kk), hidden);
                wmma::mma_sync(u, a, b, u);
            }
        }
    }
    if (!live) return;
    float* cg = cs[warp][0];
    float* cu = cs[warp][1];
    wmma::store_matrix_sync(cg, g, 16, wmma::mem_row_major);
    wmma::store_matrix_sync(cu, u, 16, wmma::mem_row_major);
    __syncwarp();
    for (unsigned e = lane; e < 16 * 16; e += 32) {
        const unsigned r = e / 16, col = col0 + e % 16;
        if (r >= tile.count) continue;
        const float bg = ex.gate_up_bias != nullptr ? ex.gate_up_bias[col] : 0.0f;
        const float bu = ex.gate_up_bias != nullptr ? ex.gate_up_bias[width + col] : 0.0f;
        act[(unsigned long long)(tile.start + r) * width + col] =
            f32_to_bf16(moe_activate(cg[e] + bg, cu[e] + bu, activation, alpha, limit));
    }
}

extern "C" __global__ void __launch_bounds__(MOE_W_THREADS) moe_gate_up_wmma_f32(
    bf16* act, const float* x, const MoeExpert* experts, const MoeTile* tiles,
    const unsigned* order, unsigned top_k, unsigned hidden, unsigned width, unsigned activation,
    float alpha, float limit) {
    moe_gate_up_w(act, x, experts, tiles, order, top_k, hidden, width, activation, alpha, limit);
}

extern "C" __global__ void __launch_bounds__(MOE_W_THREADS) moe_gate_up_wmma_bf16(
    bf16* act, const bf16* x, const MoeExpert* experts, const MoeTile* tiles,
    const unsigned* order, unsigned top_k, unsigned hidden, unsigned width, unsigned activation,
    float alpha, float limit) {
    moe_gate_up_w(act, x, experts, tiles, order, top_k, hidden, width, activation, alpha, limit);
}

// y [n, hidden] (sorted order) = act · downᵀ + bias: grid (ceil(hidden / MOE_W_COLS),
// max_tiles).
extern "C" __global__ void __launch_bounds__(MOE_W_THREADS) moe_down_wmma(
    float* __restrict__ y, const bf16* __restrict__ act, const MoeExpert* __restrict__ experts,
    const MoeTile* __restrict__ tiles, unsigned hidden, unsigned width) {
    __shared__ __align__(32) bf16 xs[MOE_WTILE * MOE_W_LD];
    __shared__ __align__(32) float cs[MOE_W_WARPS][16 * 16];
    __shared__ unsigned long long xrow[MOE_WTILE];
    const MoeTile tile = tiles[blockIdx.y];
    if (tile.count == 0) return;
    const MoeExpert ex = experts[tile.expert];
    const unsigned tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const unsigned col0 = blockIdx.x * MOE_W_COLS + warp * 16;
    const bool live = col0 < hidden;
    // The tile's activation rows are consecutive in sorted order.
    if (tid < MOE_WTILE) xrow[tid] = tile.start + tid;

    MoeAcc o;
    wmma::fill_fragment(o, 0.0f);
    const bf16* w = ex.down + (unsigned long long)col0 * width;
    for (unsigned k0 = 0; k0 < width; k0 += MOE_W_CHUNK) {
        const unsigned kc = min((unsigned)MOE_W_CHUNK, width - k0);
        __syncthreads();
        moe_w_stage(xs, act, xrow, tile.count, width, k0, kc);
        __syncthreads();
        if (live) {
            for (unsigned kk = 0; kk < kc; kk += 16) {
                MoeA a;
                MoeB b;
                wmma::load_matrix_sync(a, moe_w(xs + kk), MOE_W_LD);
                wmma::load_matrix_sync(b, moe_w(w + k0 + kk), width);
                wmma::mma_sync(o, a, b, o);
            }
        }
    }
    if (!live) return;
    float* c = cs[warp];
    wmma::store_matrix_sync(c, o, 16, wmma::mem_row_major);
    __syncwarp();
    for (unsigned e = lane; e < 16 * 16; e += 32) {
        const unsigned r = e / 16, col = col0 + e % 16;
        if (r >= tile.count) continue;
        const float b = ex.down_bias != nullptr ? ex.down_bias[col] : 0.0f;
        y[(unsigned long long)(tile.start + r) * hidden + col] = c[e] + b;
    }
}
