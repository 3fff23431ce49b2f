// The MLP's down projection for a step of a few rows (decode at small batch), fused with the
// SwiGLU before it: out[m, n] = Σ_k act[m, k] · w[n, k], act = bf16(silu(gate) · up), the
// bits silu_mul_bf16 would write and cuBLAS would read. One launch instead of two, and no
// round trip of the activations through memory; at these row counts the product is bound by
// the bytes of w, which every block streams once.
//
// Design:
// - Grid ceil(N / MD_BLOCK_COLS) blocks of 256 threads; warp w of block b owns columns
//   (b · 8 + w) · MD_WARP_COLS ... Each lane reads 8 consecutive bf16 weights (16 bytes) of a
//   column per step, so a warp reads 512 contiguous bytes of a weight row at a time.
// - K is walked in chunks of MD_CHUNK: the block computes the chunk's activations for all
//   rows into shared memory (bf16, as the unfused path rounds them), then every warp runs
//   its columns over the chunk. Each block recomputes the activations (rows · K SwiGLUs per
//   block): cheap beside the weights' bytes for the few rows this kernel takes
//   (MD_MAX_ROWS), which is why larger steps go through silu_mul and cuBLAS.
// - `act_out` (nullable) receives the activations when a LoRA on the projection reads them:
//   chunk c is written by block c mod gridDim.x only.
// - Each column's sum is over lanes in a fixed order (per-lane partial sums in k order, then
//   a butterfly over the warp), so results do not change from run to run. They differ from
//   cuBLAS's order by rounding, not by bits of the inputs.
#include "common.cuh"

#define MD_THREADS 256
#define MD_WARPS 8
#define MD_MAX_ROWS 8
#define MD_WARP_COLS 2
#define MD_BLOCK_COLS (MD_WARPS * MD_WARP_COLS)
#define MD_CHUNK 2048

// rows <= MD_MAX_ROWS, k a multiple of 8 (16-byte weight loads), w's rows 16-byte aligned;
// the host checks all three (engine-cuda/src/backend.rs). gate_up rows hold [gate | up], 2k wide.
extern "C" __global__ void __launch_bounds__(MD_THREADS) silu_mul_down_bf16(
    float* __restrict__ out, bf16* __restrict__ act_out, const float* __restrict__ gate_up,
    const bf16* __restrict__ w, unsigned rows, unsigned n, unsigned k) {
    __shared__ __align__(16) bf16 act_s[MD_MAX_ROWS * MD_CHUNK];
    const unsigned tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const unsigned col0 = (blockIdx.x * MD_WARPS + warp) * MD_WARP_COLS;

    float acc[MD_WARP_COLS][MD_MAX_ROWS];
#pragma unroll
    for (int j = 0; j < MD_WARP_COLS; j++)
#pragma unroll
        for (int r = 0; r < MD_MAX_ROWS; r++) acc[j][r] = 0.0f;

    unsigned chunk = 0;
    for (unsigned k0 = 0; k0 < k; k0 += MD_CHUNK, chunk++) {
        const unsigned kc = min((unsigned)MD_CHUNK, k - k0);
        const bool write = act_out != nullptr && chunk % gridDim.x == blockIdx.x;
        __syncthreads();  // the previous chunk's readers are done with act_s
        for (unsigned r = 0; r < rows; r++) {
            const float* g = gate_up + (unsigned long long)r * 2 * k + k0;
            const float* u = g + k;
            for (unsigned c = tid; c < kc; c += MD_THREADS) {
                const bf16 a = f32_to_bf16(silu_mul_one(g[c], u[c]));
                act_s[r * MD_CHUNK + c] = a;
                if (write) act_out[(unsigned long long)r * k + k0 + c] = a;
            }
        }
        __syncthreads();

#pragma unroll
        for (int j = 0; j < MD_WARP_COLS; j++) {
            const unsigned col = col0 + j;
            if (col >= n) break;
            const bf16* wr = w + (unsigned long long)col * k + k0;
#pragma unroll 4
            for (unsigned c = lane * 8; c < kc; c += 256) {
                float wf[8];
                bf16x8_to_f32(*reinterpret_cast<const uint4*>(wr + c), wf);
#pragma unroll
                for (int r = 0; r < MD_MAX_ROWS; r++) {
                    if ((unsigned)r >= rows) break;
                    const uint4 av = *reinterpret_cast<const uint4*>(act_s + r * MD_CHUNK + c);
                    acc[j][r] = fma_bf16x8(av, wf, acc[j][r]);
                }
            }
        }
    }

#pragma unroll
    for (int j = 0; j < MD_WARP_COLS; j++) {
        const unsigned col = col0 + j;
#pragma unroll
        for (int r = 0; r < MD_MAX_ROWS; r++) {
            if ((unsigned)r >= rows) break;
            const float s = warp_sum(acc[j][r]);
            if (lane == 0 && col < n) out[(unsigned long long)r * n + col] = s;
        }
    }
}
