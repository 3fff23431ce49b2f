// Self-test kernels of the emulator: warp intrinsics.
#include "common.cuh"

// out[0..n): __shfl_sync(v, src, width); [n..2n): up; [2n..3n): down; [3n..4n): xor, where
// v = thread id * 10 + 0.5 and every thread of the (1-D) block takes part.
extern "C" __global__ void emu_shuffles(float* out, int src, unsigned delta, int lane_mask, int width) {
    const unsigned t = threadIdx.x, n = blockDim.x;
    const float v = t * 10.0f + 0.5f;
    out[t] = __shfl_sync(LMI_FULL_MASK, v, src, width);
    out[n + t] = __shfl_up_sync(LMI_FULL_MASK, v, delta, width);
    out[2 * n + t] = __shfl_down_sync(LMI_FULL_MASK, v, delta, width);
    out[3 * n + t] = __shfl_xor_sync(LMI_FULL_MASK, v, lane_mask, width);
}

// The shuffle family on every value type: each writes lane (t ^ 1)'s value back as a bit
// pattern; out has 8 slots per thread.
extern "C" __global__ void emu_shuffle_types(unsigned long long* out) {
    const unsigned t = threadIdx.x;
    unsigned long long* o = out + 8ull * t;
    o[0] = (unsigned)__shfl_xor_sync(LMI_FULL_MASK, (int)t - 100, 1);
    o[1] = __shfl_xor_sync(LMI_FULL_MASK, t + 7u, 1);
    o[2] = (unsigned long long)__shfl_xor_sync(LMI_FULL_MASK, (long long)t - (1ll << 40), 1);
    o[3] = __shfl_xor_sync(LMI_FULL_MASK, (unsigned long long)t + (1ull << 40), 1);
    o[4] = __float_as_uint(__shfl_xor_sync(LMI_FULL_MASK, t + 0.25f, 1));
    o[5] = (unsigned long long)__double_as_longlong(__shfl_xor_sync(LMI_FULL_MASK, t + 0.125, 1));
    // a partial mask: only the even lanes exchange (lane ^ 2 stays even)
    if ((t & 1) == 0) o[6] = __shfl_xor_sync(0x55555555u, t, 2);
    else o[6] = 0;
    // a source outside the mask gives the caller's own value
    if ((t & 1) == 0) o[7] = __shfl_sync(0x55555555u, t, 1);
    else o[7] = 0;
}

// Votes: out[4 per thread] = ballot, any, all, and __syncwarp + __activemask.
extern "C" __global__ void emu_votes(unsigned* out, unsigned modulus) {
    const unsigned t = threadIdx.x;
    const int p = (t % modulus) == 0;
    out[4 * t] = __ballot_sync(LMI_FULL_MASK, p);
    out[4 * t + 1] = __any_sync(LMI_FULL_MASK, p);
    out[4 * t + 2] = __all_sync(LMI_FULL_MASK, t < 1000u);
    __syncwarp();
    out[4 * t + 3] = __activemask();
}

// match and reduce: out[4 per thread] = match_any(t / 4), match_all(7) (pred in bit 31 of the
// mask slot's neighbour), reduce_add(t), reduce_max(t).
extern "C" __global__ void emu_match_reduce(unsigned* out) {
    const unsigned t = threadIdx.x;
    int pred = 0;
    out[4 * t] = __match_any_sync(LMI_FULL_MASK, t / 4);
    out[4 * t + 1] = __match_all_sync(LMI_FULL_MASK, 7u, &pred) + (unsigned)pred;
    out[4 * t + 2] = __reduce_add_sync(LMI_FULL_MASK, t);
    out[4 * t + 3] = __reduce_max_sync(LMI_FULL_MASK, t);
}

// __syncthreads_count / _and / _or.
extern "C" __global__ void emu_sync_reductions(int* out, unsigned modulus) {
    const unsigned t = threadIdx.x;
    const int c = __syncthreads_count(t % modulus == 0);
    const int a = __syncthreads_and(t < 100000u);
    const int o = __syncthreads_or(t == 5);
    const int none = __syncthreads_or(0);
    if (t == 0) { out[0] = c; out[1] = a; out[2] = o; out[3] = none; }
}
