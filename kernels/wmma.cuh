// nvcuda::wmma for the bf16 tensor-core products the kernels use (m16n16k16, f32
// accumulators), without CUDA's headers.
//
// NVRTC reaches <mma.h> only through the CUDA toolkit's include folder or, in recent releases
// (13.5 has it, 13.0 not), through --use-bundled-headers (which writes the headers to disk
// first); the kernels compile with neither, so a deployment needs only libnvrtc. This file
// declares the same names over the same compiler builtins that CUDA's crt/mma.hpp calls (NVRTC
// knows them without any header), for sm_80 and later: a kernel written against it is written
// against <mma.h>, and compiles to the same PTX (checked against NVRTC 13.5's bundled header
// for every layout combination). Under the CPU emulator (LMI_EMU), crates/cuda-emu/emu/wmma.h
// provides nvcuda::wmma instead, with its own element layout.
#pragma once

#ifndef LMI_EMU

// cuda_bf16.h's type, as far as fragments need it: two bytes of bf16 bits.
struct __align__(2) __nv_bfloat16 {
    unsigned short __x;
};

namespace nvcuda {
namespace wmma {

struct row_major;
struct col_major;
struct matrix_a;
struct matrix_b;
struct accumulator;

enum layout_t { mem_row_major, mem_col_major };

// The builtins read and write fragments as arrays of registers; the alignment is the header's.
template <typename T, int size>
struct __align__(8) __frag_base {
    enum { num_elements = size, num_storage_elements = size };
    typedef T element_type;
    typedef T storage_element_type;
    T x[size];
};

template <typename T, int size>
static __device__ __inline__ void fill_fragment(__frag_base<T, size>& f, const T& v) {
#pragma unroll
    for (int i = 0; i < size; i++) f.x[i] = v;
}

template <typename Use, int m, int n, int k, typename T, typename Layout = void>
class fragment;
template <>
class fragment<matrix_a, 16, 16, 16, __nv_bfloat16, row_major> : public __frag_base<__nv_bfloat16, 8> {};
template <>
class fragment<matrix_a, 16, 16, 16, __nv_bfloat16, col_major> : public __frag_base<__nv_bfloat16, 8> {};
template <>
class fragment<matrix_b, 16, 16, 16, __nv_bfloat16, row_major> : public __frag_base<__nv_bfloat16, 8> {};
template <>
class fragment<matrix_b, 16, 16, 16, __nv_bfloat16, col_major> : public __frag_base<__nv_bfloat16, 8> {};
template <>
class fragment<accumulator, 16, 16, 16, float> : public __frag_base<float, 8> {};

// The last argument of the load builtins: 0 row-major, 1 column-major.
static __device__ __inline__ void load_matrix_sync(
    fragment<matrix_a, 16, 16, 16, __nv_bfloat16, row_major>& a, const __nv_bfloat16* p, unsigned ldm) {
    __mma_bf16_m16n16k16_ld_a((int*)&a, (const int*)p, ldm, 0);
}
static __device__ __inline__ void load_matrix_sync(
    fragment<matrix_a, 16, 16, 16, __nv_bfloat16, col_major>& a, const __nv_bfloat16* p, unsigned ldm) {
    __mma_bf16_m16n16k16_ld_a((int*)&a, (const int*)p, ldm, 1);
}
static __device__ __inline__ void load_matrix_sync(
    fragment<matrix_b, 16, 16, 16, __nv_bfloat16, row_major>& b, const __nv_bfloat16* p, unsigned ldm) {
    __mma_bf16_m16n16k16_ld_b((int*)&b, (const int*)p, ldm, 0);
}
static __device__ __inline__ void load_matrix_sync(
    fragment<matrix_b, 16, 16, 16, __nv_bfloat16, col_major>& b, const __nv_bfloat16* p, unsigned ldm) {
    __mma_bf16_m16n16k16_ld_b((int*)&b, (const int*)p, ldm, 1);
}
static __device__ __inline__ void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& c,
                                                   const float* p, unsigned ldm, layout_t layout) {
    if (layout == mem_row_major)
        __hmma_m16n16k16_ld_c_f32((float*)&c, (const float*)p, ldm, 0);
    else
        __hmma_m16n16k16_ld_c_f32((float*)&c, (const float*)p, ldm, 1);
}
static __device__ __inline__ void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& c,
                                                    unsigned ldm, layout_t layout) {
    if (layout == mem_row_major)
        __hmma_m16n16k16_st_c_f32((float*)p, (float*)&c, ldm, 0);
    else
        __hmma_m16n16k16_st_c_f32((float*)p, (float*)&c, ldm, 1);
}

// The layout argument of the product builtin: 2 if A is column-major, + 1 if B is.
template <typename Layout>
struct __mma_layout_bit;
template <>
struct __mma_layout_bit<row_major> {
    enum { value = 0 };
};
template <>
struct __mma_layout_bit<col_major> {
    enum { value = 1 };
};

template <typename LA, typename LB>
static __device__ __inline__ void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
                                           const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA>& a,
                                           const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB>& b,
                                           const fragment<accumulator, 16, 16, 16, float>& c) {
    __mma_bf16_m16n16k16_mma_f32((float*)&d, (const int*)&a, (const int*)&b, (const float*)&c,
                                 2 * __mma_layout_bit<LA>::value + __mma_layout_bit<LB>::value, 0);
}

}  // namespace wmma
}  // namespace nvcuda

#endif  // LMI_EMU
