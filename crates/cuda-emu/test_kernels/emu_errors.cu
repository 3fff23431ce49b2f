// Self-test kernels of the emulator: kernels that are wrong on purpose.
#include "common.cuh"

// A __syncthreads only half of each warp reaches, while the other half waits at a full-warp
// shuffle: neither can complete.
extern "C" __global__ void emu_divergent_sync(float* out) {
    float v = threadIdx.x;
    if (threadIdx.x % 32 < 16) {
        __syncthreads();
    } else {
        v = warp_sum(v);
    }
    out[threadIdx.x] = v;
}

// Two different __syncthreads reached by different threads.
extern "C" __global__ void emu_split_sync(float* out) {
    if (threadIdx.x < 32) {
        __syncthreads();
        out[threadIdx.x] = 1.0f;
    } else {
        __syncthreads();
        out[threadIdx.x] = 2.0f;
    }
}

// A full-mask shuffle after half the warp returned.
extern "C" __global__ void emu_exited_lane(float* out) {
    if (threadIdx.x >= 16) return;
    out[threadIdx.x] = __shfl_xor_sync(LMI_FULL_MASK, 1.0f, 1);
}

// Threads that leave before a __syncthreads do not block the others.
extern "C" __global__ void emu_early_exit(float* out) {
    __shared__ float s[64];
    if (threadIdx.x >= 48) return;
    s[threadIdx.x] = threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = s[47 - threadIdx.x];
}

extern "C" __global__ void emu_trap(unsigned* out) {
    if (threadIdx.x == 3) __trap();
    out[threadIdx.x] = 1;
}

// Parameters of every size: a u64 count and a double among pointers.
extern "C" __global__ void emu_signature(const float* x, unsigned long long n, double scale, unsigned k, float* y) {
    if (threadIdx.x == 0) y[0] = x[0] * (float)scale + (float)n + (float)k;
}

// Writes one element past `n` (the last thread).
extern "C" __global__ void emu_write_past_end(float* y, unsigned n) {
    y[threadIdx.x] = 1.0f;
}

// Reads far past the end: faults on the guard page (run in a child process by the tests).
extern "C" __global__ void emu_read_fault(const float* x, float* y, unsigned offset) {
    y[threadIdx.x] = x[threadIdx.x + (blockIdx.x == 1 && threadIdx.x == 5 ? offset : 0)];
}

// A 16-byte vector load from an address that is only 4-byte aligned.
extern "C" __global__ void emu_misaligned(const float* x, float4* y) {
    *y = *reinterpret_cast<const float4*>(x + 1);
}

// Recurses deep enough to overflow a fiber's stack.
__device__ __noinline__ float emu_deep(volatile float* p, int n) {
    volatile float pad[256];
    pad[n % 256] = *p;
    return n == 0 ? pad[0] : emu_deep(p, n - 1) + pad[n % 256];
}
extern "C" __global__ void emu_stack_overflow(float* y, int depth) {
    y[threadIdx.x] = emu_deep(y, depth);
}

// Reads past a static shared array: AddressSanitizer's redzones catch it in the sanitized build.
extern "C" __global__ void emu_shared_overrun(float* y, unsigned i) {
    __shared__ float s[32];
    s[threadIdx.x] = 1.0f;
    __syncthreads();
    y[threadIdx.x] = s[threadIdx.x + i];
}
