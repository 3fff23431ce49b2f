// Self-test kernels of the emulator: nvcuda::wmma (tests/wmma.rs).
#include "wmma.cuh"

#include "common.cuh"

using namespace nvcuda;

// D = A·B + C with one warp, A M×K, B K×N, C and D M×N, each at its pointer with its ldm and
// memory layout.
template <int M, int N, int K, typename LA, typename LB>
__device__ void product(const bf16* a, const bf16* b, const float* c, float* d, unsigned lda,
                        unsigned ldb, unsigned ldc, unsigned ldd, bool c_col, bool d_col) {
    wmma::fragment<wmma::matrix_a, M, N, K, __nv_bfloat16, LA> fa;
    wmma::fragment<wmma::matrix_b, M, N, K, __nv_bfloat16, LB> fb;
    wmma::fragment<wmma::accumulator, M, N, K, float> acc;
    wmma::load_matrix_sync(fa, reinterpret_cast<const __nv_bfloat16*>(a), lda);
    wmma::load_matrix_sync(fb, reinterpret_cast<const __nv_bfloat16*>(b), ldb);
    wmma::load_matrix_sync(acc, c, ldc, c_col ? wmma::mem_col_major : wmma::mem_row_major);
    wmma::mma_sync(acc, fa, fb, acc);
    wmma::store_matrix_sync(d, acc, ldd, d_col ? wmma::mem_col_major : wmma::mem_row_major);
}

template <int M, int N, int K>
__device__ void product_layouts(const bf16* a, const bf16* b, const float* c, float* d,
                                unsigned layouts, unsigned lda, unsigned ldb, unsigned ldc,
                                unsigned ldd) {
    const bool c_col = layouts & 4u, d_col = layouts & 8u;
    switch (layouts & 3u) {
        case 0: product<M, N, K, wmma::row_major, wmma::row_major>(a, b, c, d, lda, ldb, ldc, ldd, c_col, d_col); break;
        case 1: product<M, N, K, wmma::col_major, wmma::row_major>(a, b, c, d, lda, ldb, ldc, ldd, c_col, d_col); break;
        case 2: product<M, N, K, wmma::row_major, wmma::col_major>(a, b, c, d, lda, ldb, ldc, ldd, c_col, d_col); break;
        default: product<M, N, K, wmma::col_major, wmma::col_major>(a, b, c, d, lda, ldb, ldc, ldd, c_col, d_col); break;
    }
}

// Each warp w computes its own product at a + w * sa, b + w * sb, c + w * sc, d + w * sd.
// shape: 0 m16n16k16, 1 m32n8k16, 2 m8n32k16; layouts: bit 0 A column-major, bit 1 B
// column-major, bit 2 C, bit 3 D in column-major memory.
extern "C" __global__ void emu_wmma_product(const bf16* a, const bf16* b, const float* c, float* d,
                                            unsigned shape, unsigned layouts, unsigned lda,
                                            unsigned ldb, unsigned ldc, unsigned ldd, unsigned sa,
                                            unsigned sb, unsigned sc, unsigned sd) {
    const unsigned w = threadIdx.x / 32;
    a += w * sa;
    b += w * sb;
    c += w * sc;
    d += w * sd;
    if (shape == 0) product_layouts<16, 16, 16>(a, b, c, d, layouts, lda, ldb, ldc, ldd);
    else if (shape == 1) product_layouts<32, 8, 16>(a, b, c, d, layouts, lda, ldb, ldc, ldd);
    else product_layouts<8, 32, 16>(a, b, c, d, layouts, lda, ldb, ldc, ldd);
}

// out = 2 * c + 1 through an accumulator's x[] (16×16, row-major, ldm 16): elementwise work on
// fragments is layout-independent.
extern "C" __global__ void emu_wmma_elementwise(const float* c, float* out) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> f;
    wmma::fill_fragment(f, 0.0f);
    wmma::load_matrix_sync(f, c, 16, wmma::mem_row_major);
    for (int i = 0; i < f.num_elements; i++) f.x[i] = f.x[i] * 2.0f + 1.0f;
    wmma::store_matrix_sync(out, f, 16, wmma::mem_row_major);
}

// A kernel that assumes the sm_80 accumulator layout (lane l holds rows l/4 and l/4 + 8,
// columns 2(l%4) + {0, 1} and + 8) and writes x[] where it believes they belong: right on such
// a GPU, wrong on the emulator.
extern "C" __global__ void emu_wmma_assumed_layout(const float* c, float* out) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> f;
    wmma::load_matrix_sync(f, c, 16, wmma::mem_row_major);
    const unsigned lane = threadIdx.x & 31u;
    for (int i = 0; i < 8; i++) {
        const unsigned row = lane / 4 + 8 * ((i >> 1) & 1), col = lane % 4 * 2 + (i & 1) + 8 * (i >> 2);
        out[row * 16 + col] = f.x[i];
    }
}

// ---- Wrong on purpose ----------------------------------------------------------------------

// The upper half-warp loads from another address.
extern "C" __global__ void emu_wmma_divergent_pointer(const bf16* a, float* out) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> f;
    const unsigned lane = threadIdx.x & 31u;
    wmma::load_matrix_sync(f, reinterpret_cast<const __nv_bfloat16*>(a + (lane < 16 ? 0 : 256)), 16);
    out[threadIdx.x] = (float)f.x[0].__x;
}

// The two half-warps reach different (if identical) calls.
extern "C" __global__ void emu_wmma_divergent_sites(const float* c, float* out) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> f;
    if ((threadIdx.x & 31u) < 16)
        wmma::load_matrix_sync(f, c, 16, wmma::mem_row_major);
    else
        wmma::load_matrix_sync(f, c, 16, wmma::mem_row_major);
    out[threadIdx.x] = f.x[0];
}

// Only the lower half-warp stores; the upper half returns.
extern "C" __global__ void emu_wmma_half_warp(float* out) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> f;
    wmma::fill_fragment(f, 1.0f);
    if ((threadIdx.x & 31u) >= 16) return;
    wmma::store_matrix_sync(out, f, 16, wmma::mem_row_major);
}

// A load at a + offset elements with the given ldm (misaligned or a bad ldm on purpose).
extern "C" __global__ void emu_wmma_load_at(const float* c, unsigned offset, unsigned ldm, float* out) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> f;
    wmma::load_matrix_sync(f, c + offset, ldm, wmma::mem_row_major);
    out[threadIdx.x] = f.x[0];
}

// A bf16 load with the given ldm.
extern "C" __global__ void emu_wmma_load_b_ldm(const bf16* b, unsigned ldm, float* out) {
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> f;
    wmma::load_matrix_sync(f, reinterpret_cast<const __nv_bfloat16*>(b), ldm);
    out[threadIdx.x] = (float)f.x[0].__x;
}
