// The fake cuBLAS's product, run by the driver when the stream reaches it: column-major
// C = alpha·op(A)·op(B) + beta·C with f32 accumulation (bf16 inputs widened exactly, a bf16
// output rounded to nearest even), C not read when beta is 0 (as cuBLAS). Rows of op(A) are
// split over the host's cores; each dot product keeps 8 partial sums (a fixed order, so the
// result does not depend on the split).
#include <cstring>
#include <thread>
#include <vector>

#include "state.h"

namespace fake {

namespace {

float load(uint64_t base, int type, size_t i) {
    if (type == CUDA_R_32F) {
        float v;
        memcpy(&v, (const char*)(uintptr_t)base + 4 * i, 4);
        return v;
    }
    uint16_t h;
    memcpy(&h, (const char*)(uintptr_t)base + 2 * i, 2);
    const uint32_t bits = (uint32_t)h << 16;
    float v;
    memcpy(&v, &bits, 4);
    return v;
}

void store(uint64_t base, int type, size_t i, float v) {
    if (type == CUDA_R_32F) {
        memcpy((char*)(uintptr_t)base + 4 * i, &v, 4);
        return;
    }
    uint32_t bits;
    memcpy(&bits, &v, 4);
    uint16_t h;
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        h = (uint16_t)((bits >> 16) | 0x40);  // NaN stays NaN
    } else {
        h = (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
    }
    memcpy((char*)(uintptr_t)base + 2 * i, &h, 2);
}

// Element (r, c) of op(X) for a column-major X with leading dimension ld.
float op_at(uint64_t x, int type, int ld, bool trans, int r, int c) {
    return trans ? load(x, type, (size_t)c + (size_t)r * ld)
                 : load(x, type, (size_t)r + (size_t)c * ld);
}

float dot(const float* a, const float* b, int k) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int l = 0;
    for (; l + 8 <= k; l += 8)
        for (int u = 0; u < 8; ++u) acc[u] += a[l + u] * b[l + u];
    for (; l < k; ++l) acc[0] += a[l] * b[l];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

}  // namespace

void host_gemm(const LmiFakeGemm& g) {
    const bool ta = g.transa != 0, tb = g.transb != 0;
    // op(B)'s columns, each a row of k values.
    std::vector<float> bcols((size_t)g.n * g.k);
    for (int j = 0; j < g.n; ++j)
        for (int l = 0; l < g.k; ++l)
            bcols[(size_t)j * g.k + l] = op_at(g.b, g.b_type, g.ldb, tb, l, j);
    auto rows = [&](int i0, int i1) {
        std::vector<float> arow((size_t)g.k);
        for (int i = i0; i < i1; ++i) {
            for (int l = 0; l < g.k; ++l) arow[l] = op_at(g.a, g.a_type, g.lda, ta, i, l);
            for (int j = 0; j < g.n; ++j) {
                const size_t at = (size_t)i + (size_t)j * g.ldc;
                float v = g.alpha * dot(arow.data(), &bcols[(size_t)j * g.k], g.k);
                if (g.beta != 0.0f) v += g.beta * load(g.c, g.c_type, at);
                store(g.c, g.c_type, at, v);
            }
        }
    };
    const double work = (double)g.m * g.n * (g.k + 1);
    unsigned threads = std::thread::hardware_concurrency();
    if (threads == 0 || work < 4e6) threads = 1;
    if (threads > (unsigned)g.m) threads = g.m > 0 ? (unsigned)g.m : 1;
    if (threads == 1) {
        rows(0, g.m);
        return;
    }
    std::vector<std::thread> pool;
    const int per = (g.m + (int)threads - 1) / (int)threads;
    for (unsigned t = 0; t < threads; ++t) {
        const int i0 = (int)t * per, i1 = i0 + per < g.m ? i0 + per : g.m;
        if (i0 < i1) pool.emplace_back(rows, i0, i1);
    }
    for (auto& th : pool) th.join();
}

}  // namespace fake
