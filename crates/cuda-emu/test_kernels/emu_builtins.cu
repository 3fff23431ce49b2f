// Self-test kernels of the emulator: built-in variables and shared memory.
#include "common.cuh"

// Writes every built-in of every thread: 12 values at the thread's global linear index.
extern "C" __global__ void emu_builtins(unsigned* out) {
    const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned* o = out + 12ull * (block * blockDim.x * blockDim.y * blockDim.z + thread);
    o[0] = threadIdx.x; o[1] = threadIdx.y; o[2] = threadIdx.z;
    o[3] = blockIdx.x; o[4] = blockIdx.y; o[5] = blockIdx.z;
    o[6] = blockDim.x; o[7] = blockDim.y; o[8] = blockDim.z;
    o[9] = gridDim.x; o[10] = gridDim.y; o[11] = gridDim.z + (warpSize - 32);
}

// Reverses each block's slice of `x` through static shared memory.
extern "C" __global__ void __launch_bounds__(256) emu_reverse_static(const float* __restrict__ x, float* __restrict__ y) {
    __shared__ float s[256];
    const unsigned t = threadIdx.x, n = blockDim.x, base = blockIdx.x * n;
    s[t] = x[base + t];
    __syncthreads();
    y[base + t] = s[n - 1 - t];
}

// The same without the barrier: a thread may read s[n-1-t] before its writer ran.
extern "C" __global__ void emu_reverse_racy(const float* __restrict__ x, float* __restrict__ y) {
    __shared__ float s[256];
    const unsigned t = threadIdx.x, n = blockDim.x, base = blockIdx.x * n;
    s[t] = x[base + t];
    y[base + t] = s[n - 1 - t];
}

// Reverses through dynamic shared memory (blockDim.x floats), and reports the buffer's
// alignment and the poison found in it before the write.
extern "C" __global__ void emu_reverse_dynamic(const float* x, float* y, unsigned* poison, unsigned* align) {
    LMI_DYNAMIC_SHARED(float, s);
    const unsigned t = threadIdx.x, n = blockDim.x, base = blockIdx.x * n;
    poison[base + t] = __float_as_uint(s[t]);
    __syncthreads();
    s[t] = x[base + t];
    __syncthreads();
    y[base + t] = s[n - 1 - t];
    if (t == 0) align[blockIdx.x] = (unsigned)(reinterpret_cast<unsigned long long>(s) % 256);
}

// block_sum, warp_sum and block_max of common.cuh: out[0] = block sum, out[1] = block sum of
// 2x (scratch reused), out[2] = 1 if any thread got another sum, out[3 + w] = warp w's sum,
// out[35] = block max; out64[0] = block sum in double.
extern "C" __global__ void emu_block_sum(const float* x, float* out, double* out64) {
    __shared__ float scratch[32];
    __shared__ double scratch64[32];
    const float v = x[threadIdx.x];
    const float s = block_sum(v, scratch);
    const double s64 = block_sum((double)v, scratch64);
    const float again = block_sum(v * 2.0f, scratch);  // the same scratch, reused
    const float w = warp_sum(v);
    if (threadIdx.x == 0) { out[0] = s; out[1] = again; out64[0] = s64; }
    // every thread must get the same sums
    if (s != (float)s64 || again != 2.0f * s) out[2] = 1.0f;
    if ((threadIdx.x & 31) == 0) out[3 + (threadIdx.x >> 5)] = w;
    float m = block_max(v, scratch);
    if (threadIdx.x == 0) out[35] = m;
}
