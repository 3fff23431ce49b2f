// Helpers shared by every kernel in this folder.
//
// Every .cu file here compiles on its own under NVRTC with no CUDA headers (bf16 values are
// handled as raw bits, so a deployment needs only libnvrtc, not the toolkit's include folder),
// and as host C++ under the test-only emulator (crates/cuda-emu), which defines LMI_EMU and
// force-includes its own header. Kernels keep to what the emulator supports on their tested
// paths: the thread/block built-ins, static and dynamic (LMI_DYNAMIC_SHARED) shared memory,
// __syncthreads, __syncwarp, the __shfl*_sync family, ballot/any/all, atomics, the math
// functions used below, and tensor cores through nvcuda::wmma (wmma.cuh). No inline PTX or
// TMA there.
//
// Conventions: kernels are `extern "C"` (names are looked up as written); device pointers are
// passed as pointers, sizes as `unsigned` (u32) or `unsigned long long` (u64); bf16 tensors are
// `bf16` (uint16 bit patterns); every float reduction has a fixed order for a given launch
// shape, so results do not change from run to run.
#pragma once

typedef unsigned short bf16;

// INFINITY is not defined under NVRTC.
#define LMI_INF __int_as_float(0x7f800000)
#define LMI_NEG_INF __int_as_float(0xff800000)
#define LMI_FULL_MASK 0xffffffffu

// `extern __shared__` under NVRTC; a per-block buffer under the emulator.
#ifdef LMI_EMU
#define LMI_DYNAMIC_SHARED(T, name) T* name = reinterpret_cast<T*>(lmi_emu_dynamic_shared())
#else
#define LMI_DYNAMIC_SHARED(T, name)                                    \
    extern __shared__ __align__(16) unsigned char lmi_dynamic_smem_[]; \
    T* name = reinterpret_cast<T*>(lmi_dynamic_smem_)
#endif

__device__ __forceinline__ float bf16_to_f32(bf16 v) {
    return __uint_as_float(((unsigned)v) << 16);
}

// Round to nearest even, as the CPU backend (half::bf16::from_f32) does; NaN stays a quiet NaN.
__device__ __forceinline__ bf16 f32_to_bf16(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}

// The 8 bf16 values of a 16-byte load as f32.
__device__ __forceinline__ void bf16x8_to_f32(uint4 v, float (&f)[8]) {
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int e = 0; e < 4; e++) {
        f[2 * e] = __uint_as_float(w[e] << 16);
        f[2 * e + 1] = __uint_as_float(w[e] & 0xffff0000u);
    }
}

// acc + Σ a[e] · w[e] over the 8 bf16 values of `a` (a 16-byte load), in order, one fma each.
__device__ __forceinline__ float fma_bf16x8(uint4 a, const float (&w)[8], float acc) {
    const unsigned b[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int e = 0; e < 4; e++) {
        acc = fmaf(__uint_as_float(b[e] << 16), w[2 * e], acc);
        acc = fmaf(__uint_as_float(b[e] & 0xffff0000u), w[2 * e + 1], acc);
    }
    return acc;
}

// Loads and stores of activations that are either f32 or bf16 (a template parameter).
__device__ __forceinline__ float load_f32(const float* p, unsigned long long i) { return p[i]; }
__device__ __forceinline__ float load_f32(const bf16* p, unsigned long long i) { return bf16_to_f32(p[i]); }
__device__ __forceinline__ void store_f32(float* p, unsigned long long i, float v) { p[i] = v; }
__device__ __forceinline__ void store_f32(bf16* p, unsigned long long i, float v) { p[i] = f32_to_bf16(v); }

// silu(g) · u, σ from exp(-|g|) so it never overflows (the CPU backend's formulation).
__device__ __forceinline__ float silu_mul_one(float g, float u) {
    const float x = expf(-fabsf(g));
    const float sigmoid = g >= 0.0f ? 1.0f / (1.0f + x) : x / (1.0f + x);
    return g * sigmoid * u;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(LMI_FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(LMI_FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(LMI_FULL_MASK, v, o));
    return v;
}

// Sum over a 1-D block whose size is a multiple of 32; every thread gets the result.
// `scratch` is shared memory for 32 values. Safe to call repeatedly with the same scratch.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const unsigned warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // the previous call's readers are done with scratch
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    T r = lane < warps ? scratch[lane] : (T)0;
    return warp_sum(r);
}

// Maximum over a 1-D block whose size is a multiple of 32; every thread gets the result.
__device__ __forceinline__ float block_max(float v, float* scratch) {
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const unsigned warps = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float r = lane < warps ? scratch[lane] : LMI_NEG_INF;
    return warp_max(r);
}
