// A test-only libcublas.so.13 beside the fake libcuda.so.1: handles bound to a stream and a
// workspace, and cublasGemmEx checked as cuBLAS checks it (sizes, leading dimensions, type
// combinations, the compute type) and queued on the handle's stream through the fake driver
// (lmi_fake_enqueue_gemm, found with dlopen("libcuda.so.1") like the real library finds the
// driver), which computes it when the stream reaches it (gemm.cpp).
#include <dlfcn.h>

#include <cstdio>
#include <mutex>

#include "cuda_abi.h"

namespace {

// cublasStatus_t.
enum : int {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
constexpr int kComputeF32 = 68;  // CUBLAS_COMPUTE_32F
constexpr int kVersion[3] = {13, 1, 0};

struct Handle {
    CUstream stream = nullptr;
    CUdeviceptr workspace = 0;
    size_t workspace_bytes = 0;
};

struct Driver {
    int (*has_context)() = nullptr;
    int (*is_stream)(CUstream) = nullptr;
    int (*is_device_range)(CUdeviceptr, size_t) = nullptr;
    CUresult (*enqueue_gemm)(CUstream, const LmiFakeGemm*) = nullptr;
};

// The fake driver, already loaded by whoever loads cuBLAS (a real libcuda has no such
// symbols: this cuBLAS only works beside the fake).
const Driver* driver() {
    static Driver d;
    static std::once_flag once;
    std::call_once(once, [] {
        void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (!lib) return;
        d.has_context = (int (*)())dlsym(lib, "lmi_fake_has_context");
        d.is_stream = (int (*)(CUstream))dlsym(lib, "lmi_fake_is_stream");
        d.is_device_range = (int (*)(CUdeviceptr, size_t))dlsym(lib, "lmi_fake_is_device_range");
        d.enqueue_gemm =
            (CUresult(*)(CUstream, const LmiFakeGemm*))dlsym(lib, "lmi_fake_enqueue_gemm");
    });
    if (!d.has_context || !d.is_stream || !d.is_device_range || !d.enqueue_gemm) {
        fprintf(stderr, "lmi fake cuBLAS: the fake libcuda.so.1 is not loaded\n");
        return nullptr;
    }
    return &d;
}

bool supported(int a, int b, int c) {
    using namespace fake;
    return (a == CUDA_R_16BF && b == CUDA_R_16BF && (c == CUDA_R_16BF || c == CUDA_R_32F)) ||
           (a == CUDA_R_32F && b == CUDA_R_32F && c == CUDA_R_32F);
}

}  // namespace

#define API extern "C" __attribute__((visibility("default")))

API int cublasCreate_v2(Handle** handle) {
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    const Driver* d = driver();
    if (!d || !d->has_context()) return CUBLAS_STATUS_NOT_INITIALIZED;
    *handle = new Handle;
    return CUBLAS_STATUS_SUCCESS;
}

API int cublasDestroy_v2(Handle* handle) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

API int cublasGetProperty(int type, int* value) {
    if (!value || type < 0 || type > 2) return CUBLAS_STATUS_INVALID_VALUE;
    *value = kVersion[type];
    return CUBLAS_STATUS_SUCCESS;
}

API int cublasGetVersion_v2(Handle* handle, int* version) {
    (void)handle;
    if (!version) return CUBLAS_STATUS_INVALID_VALUE;
    *version = kVersion[0] * 10000 + kVersion[1] * 100 + kVersion[2];
    return CUBLAS_STATUS_SUCCESS;
}

API int cublasSetStream_v2(Handle* handle, CUstream stream) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    const Driver* d = driver();
    if (!d || !d->is_stream(stream)) return CUBLAS_STATUS_INVALID_VALUE;
    handle->stream = stream;
    // As cuBLAS documents: setting the stream drops a user workspace for the default pool.
    handle->workspace = 0;
    handle->workspace_bytes = 0;
    return CUBLAS_STATUS_SUCCESS;
}

API int cublasSetWorkspace_v2(Handle* handle, void* workspace, size_t bytes) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    const Driver* d = driver();
    const CUdeviceptr p = (CUdeviceptr)(uintptr_t)workspace;
    if (!d || (bytes > 0 && (p % 256 != 0 || !d->is_device_range(p, bytes))))
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->workspace = p;
    handle->workspace_bytes = bytes;
    return CUBLAS_STATUS_SUCCESS;
}

API int cublasGemmEx(Handle* handle, int transa, int transb, int m, int n, int k,
                     const void* alpha, const void* A, int a_type, int lda, const void* B,
                     int b_type, int ldb, const void* beta, void* C, int c_type, int ldc,
                     int compute, int algo) {
    (void)algo;
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    const Driver* d = driver();
    if (!d) return CUBLAS_STATUS_NOT_INITIALIZED;
    const bool ta = transa != 0, tb = transb != 0;
    if (transa < 0 || transa > 2 || transb < 0 || transb > 2 || m < 0 || n < 0 || k < 0 ||
        !alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    const int min_lda = ta ? k : m, min_ldb = tb ? n : k;
    if (lda < (min_lda > 1 ? min_lda : 1) || ldb < (min_ldb > 1 ? min_ldb : 1) ||
        ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (compute != kComputeF32 || !supported(a_type, b_type, c_type)) {
        fprintf(stderr,
                "lmi fake cuBLAS: cublasGemmEx with types A %d, B %d, C %d and compute type %d "
                "is not implemented (bf16·bf16 → bf16/f32 and f32, compute 32F are)\n",
                a_type, b_type, c_type, compute);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    LmiFakeGemm g{};
    g.transa = ta;
    g.transb = tb;
    g.m = m;
    g.n = n;
    g.k = k;
    g.alpha = *(const float*)alpha;
    g.beta = *(const float*)beta;
    g.a = (CUdeviceptr)(uintptr_t)A;
    g.b = (CUdeviceptr)(uintptr_t)B;
    g.c = (CUdeviceptr)(uintptr_t)C;
    g.a_type = a_type;
    g.b_type = b_type;
    g.c_type = c_type;
    g.lda = lda;
    g.ldb = ldb;
    g.ldc = ldc;
    return d->enqueue_gemm(handle->stream, &g) == fake::CUDA_SUCCESS
               ? CUBLAS_STATUS_SUCCESS
               : CUBLAS_STATUS_EXECUTION_FAILED;
}
