// The CUDA device language mapped onto host C++, for the .cu files of kernels/ compiled by the
// emulator (build.rs includes this first in every generated wrapper, outside any namespace).
//
// Each CUDA thread is a fiber; blocks run one after another on one OS thread (runtime.cpp). So
// `__shared__` variables are plain `static`s (every thread of the running block sees the same
// object), atomics are plain read-modify-writes (fibers switch only inside synchronization
// calls), and warp intrinsics are rendezvous of the lanes their mask names.
//
// Tensor cores: nvcuda::wmma (bf16 inputs, f32 accumulators) in wmma.h, warp-collective, with
// its own fragment layout. What is not mapped fails to compile: inline asm (PTX), the `mma`
// PTX instructions, TMA, cooperative groups, the pre-Volta non-`_sync` warp intrinsics.
#pragma once

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "emu_runtime.h"
#include "wmma.h"

// ---- Qualifiers ------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __grid_constant__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// Static shared memory: one object per kernel, reused by every block run on this OS thread. It
// is not poisoned between blocks (a linker section per file would allow it, but GCC refuses to
// mix inline functions' statics with others in one section), so a read before any write sees
// the previous block's data; dynamic shared memory is poisoned.
#define __shared__ static

// ---- Built-in variables ----------------------------------------------------------------------
#define threadIdx (static_cast<const uint3&>(::lmi_emu::g_thread_idx))
#define blockIdx (static_cast<const uint3&>(::lmi_emu::g_block_idx))
#define blockDim (static_cast<const dim3&>(::lmi_emu::g_block_dim))
#define gridDim (static_cast<const dim3&>(::lmi_emu::g_grid_dim))
constexpr int warpSize = 32;

// The launch's dynamic shared memory for the running block (see LMI_DYNAMIC_SHARED).
inline void* lmi_emu_dynamic_shared() { return ::lmi_emu::g_dynamic_shared; }

namespace lmi_emu {
template <typename T>
inline uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8, "warp exchange of a value wider than 64 bits");
    uint64_t b = 0;
    std::memcpy(&b, &v, sizeof(T));
    return b;
}
template <typename T>
inline T from_bits(uint64_t b) {
    T v;
    std::memcpy(&v, &b, sizeof(T));
    return v;
}
}  // namespace lmi_emu

// ---- Block synchronization -------------------------------------------------------------------
// The call site (file, line) names the barrier in error messages and tells divergent
// __syncthreads (different call sites reached by different threads) apart.
inline void __syncthreads(const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
    ::lmi_emu::block_sync(::lmi_emu::kSyncthreads, 0, f, l);
}
inline int __syncthreads_count(int p, const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
    return ::lmi_emu::block_sync(::lmi_emu::kSyncthreadsCount, p != 0, f, l);
}
inline int __syncthreads_and(int p, const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
    return ::lmi_emu::block_sync(::lmi_emu::kSyncthreadsAnd, p != 0, f, l);
}
inline int __syncthreads_or(int p, const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
    return ::lmi_emu::block_sync(::lmi_emu::kSyncthreadsOr, p != 0, f, l);
}

// Memory fences order nothing on one OS thread; they only keep the compiler from caching
// values across them.
inline void __threadfence() { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_signal_fence(__ATOMIC_SEQ_CST); }

// ---- Warp intrinsics -------------------------------------------------------------------------
inline void __syncwarp(unsigned mask = 0xffffffffu, const char* f = __builtin_FILE(),
                       int l = __builtin_LINE()) {
    ::lmi_emu::warp_sync(::lmi_emu::kSyncwarp, mask, 0, 0, 32, f, l);
}
inline unsigned __activemask() { return ::lmi_emu::active_mask(); }

#define LMI_EMU_SHFL(T)                                                                          \
    inline T __shfl_sync(unsigned mask, T v, int src, int width = 32,                            \
                         const char* f = __builtin_FILE(), int l = __builtin_LINE()) {           \
        return ::lmi_emu::from_bits<T>(::lmi_emu::warp_sync(                                     \
            ::lmi_emu::kShflIdx, mask, ::lmi_emu::to_bits(v), src, width, f, l));                \
    }                                                                                            \
    inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32,                  \
                            const char* f = __builtin_FILE(), int l = __builtin_LINE()) {        \
        return ::lmi_emu::from_bits<T>(::lmi_emu::warp_sync(                                     \
            ::lmi_emu::kShflUp, mask, ::lmi_emu::to_bits(v), (int)delta, width, f, l));          \
    }                                                                                            \
    inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32,                \
                              const char* f = __builtin_FILE(), int l = __builtin_LINE()) {      \
        return ::lmi_emu::from_bits<T>(::lmi_emu::warp_sync(                                     \
            ::lmi_emu::kShflDown, mask, ::lmi_emu::to_bits(v), (int)delta, width, f, l));        \
    }                                                                                            \
    inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32,                  \
                             const char* f = __builtin_FILE(), int l = __builtin_LINE()) {       \
        return ::lmi_emu::from_bits<T>(::lmi_emu::warp_sync(                                     \
            ::lmi_emu::kShflXor, mask, ::lmi_emu::to_bits(v), lane_mask, width, f, l));          \
    }                                                                                            \
    inline unsigned __match_any_sync(unsigned mask, T v, const char* f = __builtin_FILE(),       \
                                     int l = __builtin_LINE()) {                                 \
        return (unsigned)::lmi_emu::warp_sync(::lmi_emu::kMatchAny, mask, ::lmi_emu::to_bits(v), \
                                              0, 32, f, l);                                      \
    }                                                                                            \
    inline unsigned __match_all_sync(unsigned mask, T v, int* pred,                              \
                                     const char* f = __builtin_FILE(), int l = __builtin_LINE()) { \
        unsigned r = (unsigned)::lmi_emu::warp_sync(::lmi_emu::kMatchAll, mask,                  \
                                                    ::lmi_emu::to_bits(v), 0, 32, f, l);         \
        *pred = r != 0;                                                                          \
        return r;                                                                                \
    }
LMI_EMU_SHFL(int)
LMI_EMU_SHFL(unsigned)
LMI_EMU_SHFL(long)
LMI_EMU_SHFL(unsigned long)
LMI_EMU_SHFL(long long)
LMI_EMU_SHFL(unsigned long long)
LMI_EMU_SHFL(float)
LMI_EMU_SHFL(double)
#undef LMI_EMU_SHFL

inline unsigned __ballot_sync(unsigned mask, int p, const char* f = __builtin_FILE(),
                              int l = __builtin_LINE()) {
    return (unsigned)::lmi_emu::warp_sync(::lmi_emu::kBallot, mask, p != 0, 0, 32, f, l);
}
inline int __any_sync(unsigned mask, int p, const char* f = __builtin_FILE(),
                      int l = __builtin_LINE()) {
    return __ballot_sync(mask, p, f, l) != 0;
}
inline int __all_sync(unsigned mask, int p, const char* f = __builtin_FILE(),
                      int l = __builtin_LINE()) {
    return __ballot_sync(mask, p, f, l) == mask;
}

#define LMI_EMU_REDUCE(name, op, T)                                                      \
    inline T name(unsigned mask, T v, const char* f = __builtin_FILE(),                  \
                  int l = __builtin_LINE()) {                                            \
        return (T)::lmi_emu::warp_sync(::lmi_emu::op, mask, (uint64_t)(uint32_t)v, 0, 32, f, \
                                       l);                                               \
    }
LMI_EMU_REDUCE(__reduce_add_sync, kReduceAdd, unsigned)
LMI_EMU_REDUCE(__reduce_add_sync, kReduceAdd, int)
LMI_EMU_REDUCE(__reduce_min_sync, kReduceMinU, unsigned)
LMI_EMU_REDUCE(__reduce_min_sync, kReduceMinI, int)
LMI_EMU_REDUCE(__reduce_max_sync, kReduceMaxU, unsigned)
LMI_EMU_REDUCE(__reduce_max_sync, kReduceMaxI, int)
LMI_EMU_REDUCE(__reduce_and_sync, kReduceAnd, unsigned)
LMI_EMU_REDUCE(__reduce_or_sync, kReduceOr, unsigned)
LMI_EMU_REDUCE(__reduce_xor_sync, kReduceXor, unsigned)
#undef LMI_EMU_REDUCE

// ---- Atomics (plain read-modify-write: no fiber switch can happen inside) ---------------------
#define LMI_EMU_ATOMIC(name, T, expr)   \
    inline T name(T* a, T v) {          \
        T old = *a;                     \
        *a = (expr);                    \
        return old;                     \
    }
#define LMI_EMU_ATOMIC_INT(T)                                       \
    LMI_EMU_ATOMIC(atomicAdd, T, (T)(old + v))                      \
    LMI_EMU_ATOMIC(atomicSub, T, (T)(old - v))                      \
    LMI_EMU_ATOMIC(atomicExch, T, v)                                \
    LMI_EMU_ATOMIC(atomicMax, T, old < v ? v : old)                 \
    LMI_EMU_ATOMIC(atomicMin, T, v < old ? v : old)                 \
    LMI_EMU_ATOMIC(atomicAnd, T, (T)(old & v))                      \
    LMI_EMU_ATOMIC(atomicOr, T, (T)(old | v))                       \
    LMI_EMU_ATOMIC(atomicXor, T, (T)(old ^ v))                      \
    inline T atomicCAS(T* a, T cmp, T v) {                          \
        T old = *a;                                                 \
        if (old == cmp) *a = v;                                     \
        return old;                                                 \
    }
LMI_EMU_ATOMIC_INT(int)
LMI_EMU_ATOMIC_INT(unsigned)
LMI_EMU_ATOMIC_INT(long long)
LMI_EMU_ATOMIC_INT(unsigned long long)
LMI_EMU_ATOMIC(atomicAdd, float, old + v)
LMI_EMU_ATOMIC(atomicAdd, double, old + v)
LMI_EMU_ATOMIC(atomicExch, float, v)
LMI_EMU_ATOMIC(atomicInc, unsigned, old >= v ? 0u : old + 1u)
LMI_EMU_ATOMIC(atomicDec, unsigned, (old == 0u || old > v) ? v : old - 1u)
#undef LMI_EMU_ATOMIC_INT
#undef LMI_EMU_ATOMIC
inline unsigned short atomicCAS(unsigned short* a, unsigned short cmp, unsigned short v) {
    unsigned short old = *a;
    if (old == cmp) *a = v;
    return old;
}
#define atomicAdd_block atomicAdd
#define atomicMax_block atomicMax
#define atomicMin_block atomicMin
#define atomicCAS_block atomicCAS
#define atomicExch_block atomicExch

// ---- Loads and stores with cache hints ---------------------------------------------------------
template <typename T>
inline T __ldg(const T* p) { return *p; }
template <typename T>
inline T __ldcg(const T* p) { return *p; }
template <typename T>
inline T __ldca(const T* p) { return *p; }
template <typename T>
inline T __ldcs(const T* p) { return *p; }
template <typename T>
inline T __ldlu(const T* p) { return *p; }
template <typename T>
inline T __ldcv(const T* p) { return *p; }
template <typename T>
inline void __stcg(T* p, T v) { *p = v; }
template <typename T>
inline void __stcs(T* p, T v) { *p = v; }
template <typename T>
inline void __stwb(T* p, T v) { *p = v; }
template <typename T>
inline void __stwt(T* p, T v) { *p = v; }

// ---- Bit casts and integer intrinsics ----------------------------------------------------------
inline float __int_as_float(int v) { return ::lmi_emu::from_bits<float>((uint32_t)v); }
inline int __float_as_int(float v) { return (int)(uint32_t)::lmi_emu::to_bits(v); }
inline float __uint_as_float(unsigned v) { return ::lmi_emu::from_bits<float>(v); }
inline unsigned __float_as_uint(float v) { return (uint32_t)::lmi_emu::to_bits(v); }
inline long long __double_as_longlong(double v) { return (long long)::lmi_emu::to_bits(v); }
inline double __longlong_as_double(long long v) { return ::lmi_emu::from_bits<double>((uint64_t)v); }
inline int __double2hiint(double v) { return (int)(::lmi_emu::to_bits(v) >> 32); }
inline int __double2loint(double v) { return (int)(uint32_t)::lmi_emu::to_bits(v); }
inline double __hiloint2double(int hi, int lo) {
    return ::lmi_emu::from_bits<double>(((uint64_t)(uint32_t)hi << 32) | (uint32_t)lo);
}

inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __popcll(unsigned long long v) { return __builtin_popcountll(v); }
inline int __clz(int v) { return v == 0 ? 32 : __builtin_clz((unsigned)v); }
inline int __clzll(long long v) { return v == 0 ? 64 : __builtin_clzll((unsigned long long)v); }
inline int __ffs(int v) { return __builtin_ffs(v); }
inline int __ffsll(long long v) { return __builtin_ffsll(v); }
inline unsigned __brev(unsigned v) {
    v = ((v >> 1) & 0x55555555u) | ((v & 0x55555555u) << 1);
    v = ((v >> 2) & 0x33333333u) | ((v & 0x33333333u) << 2);
    v = ((v >> 4) & 0x0f0f0f0fu) | ((v & 0x0f0f0f0fu) << 4);
    return __builtin_bswap32(v);
}
inline unsigned long long __brevll(unsigned long long v) {
    return ((unsigned long long)__brev((unsigned)v) << 32) | __brev((unsigned)(v >> 32));
}
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const uint64_t src = ((uint64_t)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)((src >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned s) {
    return (unsigned)(((((uint64_t)hi << 32) | lo) << (s & 31)) >> 32);
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned s) {
    return (unsigned)((((uint64_t)hi << 32) | lo) >> (s & 31));
}
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((uint64_t)a * b) >> 32); }
inline int __mulhi(int a, int b) { return (int)(((int64_t)a * b) >> 32); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
inline long long __mul64hi(long long a, long long b) {
    return (long long)(((__int128)a * b) >> 64);
}

// ---- min / max (CUDA's overloads, including its mixed signed/unsigned ones) --------------------
#define LMI_EMU_MINMAX(A, B, R)                                   \
    inline R min(A a, B b) { return (R)a < (R)b ? (R)a : (R)b; } \
    inline R max(A a, B b) { return (R)a < (R)b ? (R)b : (R)a; }
LMI_EMU_MINMAX(int, int, int)
LMI_EMU_MINMAX(unsigned, unsigned, unsigned)
LMI_EMU_MINMAX(int, unsigned, unsigned)
LMI_EMU_MINMAX(unsigned, int, unsigned)
LMI_EMU_MINMAX(long, long, long)
LMI_EMU_MINMAX(unsigned long, unsigned long, unsigned long)
LMI_EMU_MINMAX(long long, long long, long long)
LMI_EMU_MINMAX(unsigned long long, unsigned long long, unsigned long long)
LMI_EMU_MINMAX(long long, unsigned long long, unsigned long long)
LMI_EMU_MINMAX(unsigned long long, long long, unsigned long long)
#undef LMI_EMU_MINMAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
inline double min(float a, double b) { return fmin(a, b); }
inline double max(float a, double b) { return fmax(a, b); }
inline double min(double a, float b) { return fmin(a, b); }
inline double max(double a, float b) { return fmax(a, b); }

// ---- Math (libm for the standard names; the fast intrinsics at full precision) ----------------
inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return exp10f(x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __powf(float a, float b) { return powf(a, b); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline void __sincosf(float x, float* s, float* c) { sincosf(x, s, c); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __frsqrt_rn(float x) { return 1.0f / sqrtf(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fdividef(float a, float b) { return a / b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
inline float __saturatef(float x) { return x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f; }  // NaN -> 0

template <typename I>
inline I lmi_emu_float_to_int(double v) {
    if (v != v) return 0;
    if (v <= (double)std::numeric_limits<I>::min()) return std::numeric_limits<I>::min();
    if (v >= (double)std::numeric_limits<I>::max()) return std::numeric_limits<I>::max();
    return (I)v;
}
inline int __float2int_rn(float x) { return lmi_emu_float_to_int<int>(nearbyintf(x)); }
inline int __float2int_rz(float x) { return lmi_emu_float_to_int<int>(truncf(x)); }
inline int __float2int_rd(float x) { return lmi_emu_float_to_int<int>(floorf(x)); }
inline int __float2int_ru(float x) { return lmi_emu_float_to_int<int>(ceilf(x)); }
inline unsigned __float2uint_rn(float x) { return lmi_emu_float_to_int<unsigned>(nearbyintf(x)); }
inline unsigned __float2uint_rz(float x) { return lmi_emu_float_to_int<unsigned>(truncf(x)); }
inline long long __float2ll_rn(float x) { return lmi_emu_float_to_int<long long>(nearbyintf(x)); }
inline long long __float2ll_rz(float x) { return lmi_emu_float_to_int<long long>(truncf(x)); }
inline float __int2float_rn(int x) { return (float)x; }
inline float __uint2float_rn(unsigned x) { return (float)x; }
inline float __ll2float_rn(long long x) { return (float)x; }
inline int __double2int_rn(double x) { return lmi_emu_float_to_int<int>(nearbyint(x)); }
inline float __double2float_rn(double x) { return (float)x; }

// ---- Timing and control ------------------------------------------------------------------------
inline long long clock64() {
    static long long ticks = 0;  // monotonic, per process: enough for "time passes" loops
    return ticks += 32;
}
inline void __nanosleep(unsigned) {}
[[noreturn]] inline void __trap(const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
    ::lmi_emu::trap("__trap()", f, l);
}
[[noreturn]] inline void __brkpt(const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
    ::lmi_emu::trap("__brkpt()", f, l);
}
#ifndef assert
#define assert(e) ((e) ? (void)0 : ::lmi_emu::trap("assert(" #e ") failed", __FILE__, __LINE__))
#endif

// ---- Unsupported: fail to compile with a name that says why ------------------------------------
#define asm LMI_EMU_ERROR_inline_asm_PTX_is_not_supported_by_the_CPU_emulator
#define __asm LMI_EMU_ERROR_inline_asm_PTX_is_not_supported_by_the_CPU_emulator
#define __asm__ LMI_EMU_ERROR_inline_asm_PTX_is_not_supported_by_the_CPU_emulator
#define __shfl LMI_EMU_ERROR_use___shfl_sync_the_non_sync_warp_intrinsics_are_not_supported
#define __shfl_xor LMI_EMU_ERROR_use___shfl_xor_sync_the_non_sync_warp_intrinsics_are_not_supported
#define __shfl_up LMI_EMU_ERROR_use___shfl_up_sync_the_non_sync_warp_intrinsics_are_not_supported
#define __shfl_down LMI_EMU_ERROR_use___shfl_down_sync_the_non_sync_warp_intrinsics_are_not_supported
#define __ballot LMI_EMU_ERROR_use___ballot_sync_the_non_sync_warp_intrinsics_are_not_supported
#define __any LMI_EMU_ERROR_use___any_sync_the_non_sync_warp_intrinsics_are_not_supported
#define __all LMI_EMU_ERROR_use___all_sync_the_non_sync_warp_intrinsics_are_not_supported
#define cooperative_groups LMI_EMU_ERROR_cooperative_groups_are_not_supported_by_the_CPU_emulator
#define __pipeline_memcpy_async LMI_EMU_ERROR_async_copies_are_not_supported_by_the_CPU_emulator
#define __cvta_generic_to_shared LMI_EMU_ERROR_PTX_address_spaces_are_not_supported_by_the_CPU_emulator
