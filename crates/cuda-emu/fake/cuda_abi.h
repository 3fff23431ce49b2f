// The part of the CUDA 13 driver and cuBLAS ABI the fake libraries implement: handle types,
// and the enum values the entry points take or return (as cuda.h and cublas_api.h number them;
// cudarc's bindings, generated from those headers, are what the host code calls with).
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {
typedef int CUresult;
typedef int CUdevice;
typedef uint64_t CUdeviceptr;
typedef struct FakeContext* CUcontext;
typedef struct FakeModule* CUmodule;
typedef struct FakeFunction* CUfunction;
typedef struct FakeStream* CUstream;
typedef struct FakeGraph* CUgraph;
typedef struct FakeGraphExec* CUgraphExec;
typedef struct FakePool* CUmemoryPool;
typedef struct FakeEvent* CUevent;
}

namespace fake {

enum : int {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
    CUDA_ERROR_HARDWARE_STACK_ERROR = 714,
    CUDA_ERROR_MISALIGNED_ADDRESS = 716,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    CUDA_ERROR_STREAM_CAPTURE_UNMATCHED = 903,
    CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908,
    CUDA_ERROR_UNKNOWN = 999,
};

// CUdevice_attribute.
enum : int {
    ATTR_MAX_THREADS_PER_BLOCK = 1,
    ATTR_MAX_BLOCK_DIM_X = 2,
    ATTR_MAX_BLOCK_DIM_Y = 3,
    ATTR_MAX_BLOCK_DIM_Z = 4,
    ATTR_MAX_GRID_DIM_X = 5,
    ATTR_MAX_GRID_DIM_Y = 6,
    ATTR_MAX_GRID_DIM_Z = 7,
    ATTR_MAX_SHARED_MEMORY_PER_BLOCK = 8,
    ATTR_TOTAL_CONSTANT_MEMORY = 9,
    ATTR_WARP_SIZE = 10,
    ATTR_MAX_REGISTERS_PER_BLOCK = 12,
    ATTR_CLOCK_RATE = 13,
    ATTR_MULTIPROCESSOR_COUNT = 16,
    ATTR_INTEGRATED = 18,
    ATTR_CAN_MAP_HOST_MEMORY = 19,
    ATTR_CONCURRENT_KERNELS = 31,
    ATTR_MEMORY_CLOCK_RATE = 36,
    ATTR_GLOBAL_MEMORY_BUS_WIDTH = 37,
    ATTR_L2_CACHE_SIZE = 38,
    ATTR_MAX_THREADS_PER_MULTIPROCESSOR = 39,
    ATTR_ASYNC_ENGINE_COUNT = 40,
    ATTR_UNIFIED_ADDRESSING = 41,
    ATTR_COMPUTE_CAPABILITY_MAJOR = 75,
    ATTR_COMPUTE_CAPABILITY_MINOR = 76,
    ATTR_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81,
    ATTR_MAX_REGISTERS_PER_MULTIPROCESSOR = 82,
    ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
    ATTR_RESERVED_SHARED_MEMORY_PER_BLOCK = 111,
    ATTR_MEMORY_POOLS_SUPPORTED = 115,
};

// CUfunction_attribute.
enum : int {
    FUNC_MAX_THREADS_PER_BLOCK = 0,
    FUNC_SHARED_SIZE_BYTES = 1,
    FUNC_CONST_SIZE_BYTES = 2,
    FUNC_LOCAL_SIZE_BYTES = 3,
    FUNC_NUM_REGS = 4,
    FUNC_PTX_VERSION = 5,
    FUNC_BINARY_VERSION = 6,
    FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
    FUNC_PREFERRED_SHARED_MEMORY_CARVEOUT = 9,
};

// CUstreamCaptureMode and CUstreamCaptureStatus.
enum : int { CAPTURE_MODE_GLOBAL = 0, CAPTURE_MODE_THREAD_LOCAL = 1, CAPTURE_MODE_RELAXED = 2 };
enum : int { CAPTURE_STATUS_NONE = 0, CAPTURE_STATUS_ACTIVE = 1, CAPTURE_STATUS_INVALIDATED = 2 };

// CUmemPool_attribute.
enum : int {
    MEMPOOL_ATTR_RELEASE_THRESHOLD = 4,
    MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5,
    MEMPOOL_ATTR_USED_MEM_CURRENT = 7,
};

// cudaDataType (cuBLAS).
enum : int { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 };

}  // namespace fake

// What libcublas.so.13 hands to libcuda.so.1 (lmi_fake_enqueue_gemm): one cublasGemmEx,
// already checked, as column-major C = alpha·op(A)·op(B) + beta·C.
struct LmiFakeGemm {
    int transa, transb;  // 0: N, 1: T (C, the conjugate transpose, is T for real types)
    int m, n, k;
    float alpha, beta;
    CUdeviceptr a, b, c;
    int a_type, b_type, c_type;  // fake::CUDA_R_*
    int lda, ldb, ldc;
};
