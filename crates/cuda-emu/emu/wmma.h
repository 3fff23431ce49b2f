// nvcuda::wmma on the host: the warp-level tensor-core API for bf16 inputs and f32 accumulators
// (shapes m16n16k16, m32n8k16, m8n32k16), as CUDA's <mma.h> declares it.
//
// - Warp-collective: load_matrix_sync, store_matrix_sync and mma_sync are rendezvous of the
//   whole warp (runtime.cpp's warp_collective). Every lane must reach the same call with the
//   same pointer, ldm and layout; the last lane to arrive performs the operation for all 32, so
//   a load reads and a store writes memory at one point, as one instruction would. A lane that
//   diverges, exits or waits elsewhere is a launch error, never a hang.
// - Checked per lane, as CUDA documents them: `ldm` a multiple of 8 elements for bf16 and of 4
//   for float (16 bytes), the pointer 256-bit (32-byte) aligned.
// - The element ↔ lane mapping of a fragment is unspecified in CUDA; here it is deliberately
//   NOT the hardware's, and differs between matrix_a, matrix_b and accumulator fragments: lane
//   `l`'s element `i` is element (97·(32i + l) + 13) mod size of the matrix (row-major order)
//   for matrix_a, (75·… + 41) for matrix_b and (53·… + 7) for accumulators. A kernel that
//   assumes which elements a lane holds gives wrong results here; elementwise operations on
//   x[] (scaling, adding two fragments of one type) are fine, as on a GPU.
// - mma_sync: D = A·B + C in f32, each d[m][n] = c[m][n] + a[m][0]·b[0][n] + a[m][1]·b[1][n] +
//   … in ascending k (a product of two bf16 values is exact in f32). A GPU's tensor cores add
//   in another order, so compare with a tolerance.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>

// cuda_bf16.h's type, as far as fragments need it: two bytes of bf16 bits.
struct __nv_bfloat16 {
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

namespace emu {

// The matrix a fragment holds: rows × cols, and the emulator's mapping constants.
template <typename Use, int M, int N, int K>
struct Shape;
template <int M, int N, int K>
struct Shape<matrix_a, M, N, K> {
    static constexpr int rows = M, cols = K, mult = 97, add = 13;
};
template <int M, int N, int K>
struct Shape<matrix_b, M, N, K> {
    static constexpr int rows = K, cols = N, mult = 75, add = 41;
};
template <int M, int N, int K>
struct Shape<accumulator, M, N, K> {
    static constexpr int rows = M, cols = N, mult = 53, add = 7;
};

template <int M, int N, int K>
constexpr bool supported_shape() {
    return (M == 16 && N == 16 && K == 16) || (M == 32 && N == 8 && K == 16) ||
           (M == 8 && N == 32 && K == 16);
}

inline float to_f32(__nv_bfloat16 v) {
    const uint32_t b = (uint32_t)v.__x << 16;
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}
inline float to_f32(float v) { return v; }

// Round to nearest even, NaN kept quiet: what a conversion to bf16 does on the GPU.
inline void from_f32(float f, __nv_bfloat16& out) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        out.__x = (unsigned short)((u >> 16) | 0x40u);
        return;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    out.__x = (unsigned short)(u >> 16);
}
inline void from_f32(float f, float& out) { out = f; }

// The warp-uniform arguments of a load or a store; lanes must agree on every byte.
struct MemKey {
    const void* type;  // the fragment type (a distinct address per instantiation)
    const void* ptr;
    unsigned ldm;
    int col_major;
};

inline void describe_mem(const void* key, char* out, size_t size) {
    const MemKey* k = static_cast<const MemKey*>(key);
    snprintf(out, size, "ptr %p, ldm %u, %s", k->ptr, k->ldm,
             k->col_major ? "column-major" : "row-major");
}

inline void describe_mma(const void*, char* out, size_t size) { snprintf(out, size, "d, a, b, c"); }

template <typename T>
struct TypeTag {
    static constexpr char id = 0;
};

// Checks CUDA's documented rules for a load or store, in the calling lane.
template <typename T>
inline void check_mem(const char* op, const void* p, unsigned ldm, const char* file, int line) {
    constexpr unsigned elems = 16 / sizeof(T);  // 8 bf16 or 4 float: 16 bytes
    char what[256];
    if (ldm % elems != 0) {
        snprintf(what, sizeof what,
                 "nvcuda::wmma::%s with ldm %u: ldm must be a multiple of %u for %u-byte elements",
                 op, ldm, elems, (unsigned)sizeof(T));
        ::lmi_emu::trap(what, file, line);
    }
    if (reinterpret_cast<uintptr_t>(p) % 32 != 0) {
        snprintf(what, sizeof what,
                 "nvcuda::wmma::%s with pointer %p: the pointer must be 256-bit (32-byte) aligned",
                 op, p);
        ::lmi_emu::trap(what, file, line);
    }
}

}  // namespace emu

// The fragment of one use, shape and element type (and, for matrix_a / matrix_b, memory layout).
template <typename Use, int m, int n, int k, typename T, typename Layout = void>
class fragment {
    static_assert(emu::supported_shape<m, n, k>(),
                  "the emulator's wmma has the bf16 shapes m16n16k16, m32n8k16 and m8n32k16");
    static_assert(
        std::is_same<Use, accumulator>::value
            ? std::is_same<T, float>::value && std::is_same<Layout, void>::value
            : std::is_same<T, __nv_bfloat16>::value &&
                  (std::is_same<Layout, row_major>::value || std::is_same<Layout, col_major>::value),
        "the emulator's wmma has bf16 matrix_a/matrix_b fragments with a row_major or col_major "
        "layout, and float accumulators without one");

  public:
    typedef emu::Shape<Use, m, n, k> shape;
    enum { num_elements = shape::rows * shape::cols / 32, num_storage_elements = num_elements };
    typedef T element_type;
    typedef T storage_element_type;
    T x[num_elements];

    // Row and column of lane `lane`'s element `i` (the emulator's own mapping, see above).
    static void position(unsigned lane, int i, int& row, int& col) {
        const unsigned size = shape::rows * shape::cols;  // a power of two: the map is a bijection
        const unsigned e = (shape::mult * (32u * (unsigned)i + lane) + shape::add) % size;
        row = (int)(e / shape::cols);
        col = (int)(e % shape::cols);
    }
};

template <typename Use, int m, int n, int k, typename T, typename Layout>
inline void fill_fragment(fragment<Use, m, n, k, T, Layout>& f, const T& v) {
    for (int i = 0; i < f.num_elements; i++) f.x[i] = v;
}

namespace emu {

// A load or store for the whole warp, run by the last lane to arrive.
template <typename Frag, typename Elem, bool Store>
struct MemOp {
    // One lane's part: the warp-uniform key (lanes compare it) and its fragment.
    struct Arg {
        MemKey key;
        Frag* frag;
    };

    static void run(void* const* args) {
        const MemKey& key = static_cast<const Arg*>(args[0])->key;
        Elem* p = static_cast<Elem*>(const_cast<void*>(key.ptr));
        for (unsigned lane = 0; lane < 32; ++lane) {
            Frag& f = *static_cast<const Arg*>(args[lane])->frag;
            for (int i = 0; i < Frag::num_elements; ++i) {
                int r, c;
                Frag::position(lane, i, r, c);
                Elem& at = key.col_major ? p[(size_t)c * key.ldm + r] : p[(size_t)r * key.ldm + c];
                if (Store)
                    at = f.x[i];
                else
                    f.x[i] = at;
            }
        }
    }
};

template <typename Frag, typename Elem, bool Store>
inline void mem_collective(const char* op, Frag& f, const Elem* p, unsigned ldm, bool col,
                           const char* file, int line) {
    check_mem<Elem>(op, p, ldm, file, line);
    typedef MemOp<Frag, Elem, Store> Op;
    typename Op::Arg arg{MemKey{&TypeTag<Frag>::id, p, ldm, col ? 1 : 0}, &f};
    const ::lmi_emu::Collective call{
        Store ? "nvcuda::wmma::store_matrix_sync" : "nvcuda::wmma::load_matrix_sync",
        &arg.key, sizeof arg.key, &arg, &Op::run, &describe_mem,
    };
    ::lmi_emu::warp_collective(call, file, line);
}

}  // namespace emu

template <int m, int n, int k, typename Layout>
inline void load_matrix_sync(fragment<matrix_a, m, n, k, __nv_bfloat16, Layout>& a,
                             const __nv_bfloat16* p, unsigned ldm,
                             const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    emu::mem_collective<fragment<matrix_a, m, n, k, __nv_bfloat16, Layout>, __nv_bfloat16, false>(
        "load_matrix_sync", a, p, ldm, std::is_same<Layout, col_major>::value, file, line);
}

template <int m, int n, int k, typename Layout>
inline void load_matrix_sync(fragment<matrix_b, m, n, k, __nv_bfloat16, Layout>& b,
                             const __nv_bfloat16* p, unsigned ldm,
                             const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    emu::mem_collective<fragment<matrix_b, m, n, k, __nv_bfloat16, Layout>, __nv_bfloat16, false>(
        "load_matrix_sync", b, p, ldm, std::is_same<Layout, col_major>::value, file, line);
}

template <int m, int n, int k>
inline void load_matrix_sync(fragment<accumulator, m, n, k, float>& c, const float* p,
                             unsigned ldm, layout_t layout, const char* file = __builtin_FILE(),
                             int line = __builtin_LINE()) {
    emu::mem_collective<fragment<accumulator, m, n, k, float>, float, false>(
        "load_matrix_sync", c, p, ldm, layout == mem_col_major, file, line);
}

template <int m, int n, int k>
inline void store_matrix_sync(float* p, const fragment<accumulator, m, n, k, float>& c,
                              unsigned ldm, layout_t layout, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
    emu::mem_collective<fragment<accumulator, m, n, k, float>, float, true>(
        "store_matrix_sync", const_cast<fragment<accumulator, m, n, k, float>&>(c), p, ldm,
        layout == mem_col_major, file, line);
}

namespace emu {

template <int M, int N, int K, typename LA, typename LB>
struct Mma {
    typedef fragment<accumulator, M, N, K, float> Acc;
    typedef fragment<matrix_a, M, N, K, __nv_bfloat16, LA> A;
    typedef fragment<matrix_b, M, N, K, __nv_bfloat16, LB> B;
    // One lane's fragments.
    struct Arg {
        Acc* d;
        const A* a;
        const B* b;
        const Acc* c;
    };

    // Gathers the warp's A, B and C, then writes D: every input is read before any output is
    // written, so d may be c (or share storage with a or b).
    static void run(void* const* args) {
        static_assert(M * K <= 512 && K * N <= 512 && M * N <= 256, "shapes of 16 x 16 elements");
        float a[M][K], b[K][N], c[M][N];
        for (unsigned lane = 0; lane < 32; ++lane) {
            const Arg& g = *static_cast<const Arg*>(args[lane]);
            for (int i = 0; i < A::num_elements; ++i) {
                int r, col;
                A::position(lane, i, r, col);
                a[r][col] = to_f32(g.a->x[i]);
            }
            for (int i = 0; i < B::num_elements; ++i) {
                int r, col;
                B::position(lane, i, r, col);
                b[r][col] = to_f32(g.b->x[i]);
            }
            for (int i = 0; i < Acc::num_elements; ++i) {
                int r, col;
                Acc::position(lane, i, r, col);
                c[r][col] = g.c->x[i];
            }
        }
        for (unsigned lane = 0; lane < 32; ++lane) {
            const Arg& g = *static_cast<const Arg*>(args[lane]);
            for (int i = 0; i < Acc::num_elements; ++i) {
                int r, col;
                Acc::position(lane, i, r, col);
                float s = c[r][col];
                for (int kk = 0; kk < K; ++kk) s += a[r][kk] * b[kk][col];
                g.d->x[i] = s;
            }
        }
    }
};

}  // namespace emu

template <int m, int n, int k, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, m, n, k, float>& d,
                     const fragment<matrix_a, m, n, k, __nv_bfloat16, LA>& a,
                     const fragment<matrix_b, m, n, k, __nv_bfloat16, LB>& b,
                     const fragment<accumulator, m, n, k, float>& c,
                     const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    typedef emu::Mma<m, n, k, LA, LB> Op;
    const emu::MemKey key{&emu::TypeTag<Op>::id, nullptr, 0, 0};
    typename Op::Arg arg{&d, &a, &b, &c};
    const ::lmi_emu::Collective call{
        "nvcuda::wmma::mma_sync", &key, sizeof key, &arg, &Op::run, &emu::describe_mma,
    };
    ::lmi_emu::warp_collective(call, file, line);
}

}  // namespace wmma
}  // namespace nvcuda
