// A test-only libcuda.so.1: the CUDA driver API on the CPU, so that lmi_cuda's real host code
// (CudaDevice through cudarc) runs without a GPU. One emulated sm_90 device; kernels are those
// of the CUBINs the host loads (parsed: cubin.cpp), run by the emulator's runtime (the same .cu
// files compiled as host C++, linked into this library); streams queue work and run it at
// synchronization and copy-back points; graphs record by value and replay. It refuses what a
// driver refuses, with the driver's error codes: launches over the block, grid, register or
// shared-memory limits, work on freed memory, unsafe calls during stream capture; a fault in a
// kernel (a guard page, a misaligned vector access) is a sticky error, as it is on a GPU.
//
// Environment: LMI_FAKE_CUDA_MEMORY_MB (the device's memory, default 4096),
// LMI_FAKE_CUDA_CONTEXT_MB (what the context takes of it, default 256), LMI_EMU_THREAD_ORDER
// and LMI_EMU_BLOCK_ORDER (`reverse`: run threads or blocks last to first).
#include <sys/mman.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "state.h"

extern "C" {
// The emulator's runtime (emu/runtime.cpp), linked into this library.
size_t lmi_emu_kernel_param_count(size_t k);
size_t lmi_emu_kernel_param_size(size_t k, size_t p);
long lmi_emu_kernel_index(const char* name);
int lmi_emu_launch_recoverable(size_t kernel, const uint32_t grid[3], const uint32_t block[3],
                               uint32_t shared_bytes, int reverse_threads, int reverse_blocks,
                               void** params);
const char* lmi_emu_last_error();
}

namespace fake {

namespace {

constexpr int kDriverVersion = 13000;  // CUDA 13.0
constexpr uint32_t kSm = 90;
constexpr int kMultiprocessors = 132;
constexpr uint32_t kDefaultShared = 48 * 1024;
constexpr uint32_t kMaxSharedOptin = 227 * 1024;
constexpr uint32_t kRegistersPerBlock = 64 * 1024;
constexpr size_t kAlign = 256;
constexpr uint8_t kPoison = 0xff;
// Allocations this large are not poisoned (but for their slack): filling them would touch every
// page, and tests use them sparsely (a KV pool with block ids above 2^20).
constexpr size_t kSparseBytes = (size_t)1 << 30;
// Work queued without a synchronization is run once this many ops wait (bounds the memory
// pageable copies hold).
constexpr size_t kMaxQueued = 1 << 16;

size_t env_mb(const char* name, size_t fallback) {
    const char* v = getenv(name);
    if (!v || !*v) return fallback;
    const long long mb = strtoll(v, nullptr, 10);
    return mb > 0 ? (size_t)mb << 20 : fallback;
}

bool env_reverse(const char* name) {
    const char* v = getenv(name);
    return v && (strcmp(v, "reverse") == 0 || strcmp(v, "Reverse") == 0 ||
                 strcmp(v, "REVERSE") == 0);
}

size_t page_size() {
    static const size_t p = (size_t)sysconf(_SC_PAGESIZE);
    return p;
}

thread_local FakeContext* t_current = nullptr;

using Lock = std::lock_guard<std::recursive_mutex>;

// ---- Checks shared by the entry points --------------------------------------------------------

// The context every call that touches the device needs, and the sticky error.
CUresult need_context() {
    State& S = state();
    if (!S.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!t_current) return CUDA_ERROR_INVALID_CONTEXT;
    if (!t_current->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    return S.sticky;
}

#define NEED_CONTEXT()                              \
    do {                                            \
        const CUresult rc_ = need_context();        \
        if (rc_ != CUDA_SUCCESS) return rc_;        \
    } while (0)

FakeStream* stream_of(CUstream h) {
    State& S = state();
    if (!h) return &S.legacy;
    return S.streams.count(h) ? h : nullptr;
}

void invalidate(FakeStream* s, const std::string& why) {
    if (s->invalidated.empty()) s->invalidated = why;
}

// A call that is not allowed while this thread (or, in global mode, any thread) captures:
// refused, and the capture invalidated, as the driver does.
CUresult unsafe_during_capture(const char* call) {
    State& S = state();
    CUresult rc = CUDA_SUCCESS;
    for (FakeStream* s : S.streams) {
        if (!s->capturing || s->capture_mode == CAPTURE_MODE_RELAXED) continue;
        if (s->capture_mode == CAPTURE_MODE_THREAD_LOCAL &&
            s->capture_thread != std::this_thread::get_id())
            continue;
        invalidate(s, std::string(call) + " was called while capturing");
        rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    return rc;
}

#define UNSAFE_DURING_CAPTURE(call)                           \
    do {                                                      \
        const CUresult rc_ = unsafe_during_capture(call);     \
        if (rc_ != CUDA_SUCCESS) return rc_;                  \
    } while (0)

// The page-locked allocation holding [p, p + bytes), if any.
bool is_pinned(const void* p, size_t bytes) {
    State& S = state();
    const uintptr_t a = (uintptr_t)p;
    auto it = S.pinned.upper_bound(a);
    if (it == S.pinned.begin()) return false;
    --it;
    return a + bytes <= it->first + it->second;
}

// ---- Device memory: each allocation its own mapping ending at a guard page, poisoned ----------

CUresult map_device(size_t bytes, bool from_pool, CUdeviceptr* out) {
    State& S = state();
    const size_t in_use = S.used + S.pool_reserved + S.context_bytes;
    size_t reuse = 0;
    if (from_pool) reuse = S.pool_reserved < bytes ? S.pool_reserved : bytes;
    if (in_use - reuse + bytes > S.total_memory) return CUDA_ERROR_OUT_OF_MEMORY;
    const size_t page = page_size();
    const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    const size_t data = (rounded + page - 1) / page * page;
    void* base = mmap(nullptr, data + page, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    mprotect((char*)base + data, page, PROT_NONE);
    char* start = (char*)base + data - rounded;
    if (bytes < kSparseBytes)
        memset(start, kPoison, rounded);
    else
        memset(start + bytes, kPoison, rounded - bytes);
    S.device[(uint64_t)(uintptr_t)start] =
        Allocation{(uintptr_t)base, data + page, bytes, rounded - bytes, from_pool};
    S.used += bytes;
    S.pool_reserved -= reuse;
    *out = (uint64_t)(uintptr_t)start;
    return CUDA_SUCCESS;
}

// Freed ranges kept reserved without access (a few thousand mappings, far below the kernel's
// vm.max_map_count of 65530; address space only, no memory).
constexpr size_t kQuarantine = 4096;

// Unmaps the allocation starting at `p`; its bytes go to the pool when it came from there.
bool unmap_device(uint64_t p) {
    State& S = state();
    auto it = S.device.find(p);
    if (it == S.device.end()) return false;
    const Allocation a = it->second;
    S.device.erase(it);
    S.used -= a.len;
    if (a.from_pool) S.pool_reserved += a.len;
    // The range stays reserved, without access, while it is among the latest kQuarantine
    // frees: unmapped at once, a later mmap anywhere in the process (another thread's malloc
    // arena) could land on it, and a use after free would then touch live memory instead of
    // faulting (it did, now and then, under load).
    void* kept = mmap((void*)a.map_base, a.map_len, PROT_NONE,
                      MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (kept == MAP_FAILED) {
        munmap((void*)a.map_base, a.map_len);
        return true;
    }
    S.quarantine.emplace_back(a.map_base, a.map_len);
    if (S.quarantine.size() > kQuarantine) {
        munmap((void*)S.quarantine.front().first, S.quarantine.front().second);
        S.quarantine.pop_front();
    }
    return true;
}

// Memory above the pool's release threshold goes back at a synchronization.
void release_pool() {
    State& S = state();
    if (S.pool_reserved > S.pool.release_threshold) S.pool_reserved = S.pool.release_threshold;
}

// ---- Running queued work ----------------------------------------------------------------------

// Sets the sticky error (once) and says what happened.
CUresult fail(CUresult code, const std::string& what) {
    State& S = state();
    if (S.sticky == CUDA_SUCCESS) {
        S.sticky = code;
        report("%s (error %d; the context is now unusable, as on a GPU)", what.c_str(), code);
    }
    return code;
}

std::string hex(uint64_t v) {
    char b[32];
    snprintf(b, sizeof b, "%#llx", (unsigned long long)v);
    return b;
}

CUresult check_range(uint64_t p, size_t bytes, const char* what) {
    if (bytes == 0 || device_range(p, bytes)) return CUDA_SUCCESS;
    return fail(CUDA_ERROR_ILLEGAL_ADDRESS,
                std::string(what) + ": " + std::to_string(bytes) + " bytes at " + hex(p) +
                    " are not inside one live device allocation (freed, or out of bounds)");
}

// Bytes a kernel wrote into the slack after an allocation (past its end).
CUresult check_overruns(const Op& op) {
    State& S = state();
    for (const fake::CubinParam& p : op.fn->meta->params) {
        if (p.size != 8) continue;
        uint64_t v;
        memcpy(&v, (const char*)op.params.data() + p.offset, 8);
        auto it = S.device.upper_bound(v);
        if (it == S.device.begin()) continue;
        --it;
        const Allocation& a = it->second;
        if (v > it->first + a.len || a.slack == 0) continue;
        uint8_t* end = (uint8_t*)(uintptr_t)(it->first + a.len);
        for (size_t i = 0; i < a.slack; ++i) {
            if (end[i] != kPoison) {
                memset(end, kPoison, a.slack);
                return fail(CUDA_ERROR_ILLEGAL_ADDRESS,
                            "kernel `" + op.fn->meta->name + "` wrote past the end of the " +
                                std::to_string(a.len) + "-byte allocation at " +
                                hex(it->first) + " (byte " + std::to_string(a.len + i) + ")");
            }
        }
    }
    return CUDA_SUCCESS;
}

CUresult run_launch(const Op& op) {
    const fake::CubinKernel& k = *op.fn->meta;
    std::vector<void*> ptrs(k.params.size());
    for (size_t i = 0; i < k.params.size(); ++i)
        ptrs[i] = (char*)op.params.data() + k.params[i].offset;
    State& S = state();
    const int rc = lmi_emu_launch_recoverable(op.fn->emu_index, op.grid, op.block, op.shared,
                                              S.reverse_threads, S.reverse_blocks, ptrs.data());
    if (rc == 0) return check_overruns(op);
    const std::string msg = "kernel `" + k.name + "`: " + lmi_emu_last_error();
    switch (rc) {
        case CUDA_ERROR_ILLEGAL_ADDRESS:
        case CUDA_ERROR_MISALIGNED_ADDRESS:
        case CUDA_ERROR_HARDWARE_STACK_ERROR: return fail(rc, msg);
        case 3: return fail(CUDA_ERROR_OUT_OF_MEMORY, msg);
        // A trap, or what would hang a GPU (a barrier some threads never reach).
        default: return fail(CUDA_ERROR_LAUNCH_FAILED, msg);
    }
}

size_t elem_size(int type) { return type == CUDA_R_32F ? 4 : 2; }

// Bytes a column-major `rows × cols` operand spans with leading dimension `ld`.
size_t span(int rows, int cols, int ld, int type) {
    if (rows <= 0 || cols <= 0) return 0;
    return ((size_t)(cols - 1) * (size_t)ld + (size_t)rows) * elem_size(type);
}

CUresult run_gemm(const LmiFakeGemm& g) {
    const bool ta = g.transa != 0, tb = g.transb != 0;
    CUresult rc = CUDA_SUCCESS;
    if (g.k > 0) {
        rc = check_range(g.a, span(ta ? g.k : g.m, ta ? g.m : g.k, g.lda, g.a_type), "gemm A");
        if (rc == CUDA_SUCCESS)
            rc = check_range(g.b, span(tb ? g.n : g.k, tb ? g.k : g.n, g.ldb, g.b_type),
                             "gemm B");
    }
    if (rc == CUDA_SUCCESS) rc = check_range(g.c, span(g.m, g.n, g.ldc, g.c_type), "gemm C");
    if (rc != CUDA_SUCCESS) return rc;
    host_gemm(g);
    return CUDA_SUCCESS;
}

CUresult run(const Op& op) {
    switch (op.kind) {
        case Op::kLaunch: return run_launch(op);
        case Op::kMemset: {
            const CUresult rc = check_range(op.dst, op.bytes, "cuMemsetD8Async");
            if (rc == CUDA_SUCCESS) memset((void*)(uintptr_t)op.dst, op.value, op.bytes);
            return rc;
        }
        case Op::kHtoD: {
            const CUresult rc = check_range(op.dst, op.bytes, "cuMemcpyHtoDAsync destination");
            if (rc != CUDA_SUCCESS) return rc;
            const void* from = op.pinned ? (const void*)(uintptr_t)op.src : op.data.data();
            if (op.pinned && memcmp(from, op.data.data(), op.bytes) != 0)
                return fail(CUDA_ERROR_LAUNCH_FAILED,
                            "the host wrote the page-locked source of an asynchronous copy (" +
                                std::to_string(op.bytes) + " bytes at " + hex(op.src) +
                                ") before the copy ran: page-locked memory handed to an async "
                                "copy must be left alone until the stream is synchronized");
            memcpy((void*)(uintptr_t)op.dst, from, op.bytes);
            return CUDA_SUCCESS;
        }
        case Op::kDtoH: {
            const CUresult rc = check_range(op.src, op.bytes, "cuMemcpyDtoHAsync source");
            if (rc == CUDA_SUCCESS)
                memcpy((void*)(uintptr_t)op.dst, (const void*)(uintptr_t)op.src, op.bytes);
            return rc;
        }
        case Op::kDtoD: {
            CUresult rc = check_range(op.src, op.bytes, "cuMemcpyDtoDAsync source");
            if (rc == CUDA_SUCCESS) rc = check_range(op.dst, op.bytes, "cuMemcpyDtoDAsync destination");
            if (rc == CUDA_SUCCESS)
                memmove((void*)(uintptr_t)op.dst, (const void*)(uintptr_t)op.src, op.bytes);
            return rc;
        }
        case Op::kFree:
            if (!unmap_device(op.dst))
                return fail(CUDA_ERROR_ILLEGAL_ADDRESS,
                            "cuMemFreeAsync of " + hex(op.dst) + ", which is no longer allocated");
            return CUDA_SUCCESS;
        case Op::kGemm: return run_gemm(op.gemm);
    }
    return CUDA_ERROR_UNKNOWN;
}

CUresult drain_one(FakeStream* s) {
    State& S = state();
    while (!s->queue.empty()) {
        if (S.sticky != CUDA_SUCCESS) {
            s->queue.clear();
            return S.sticky;
        }
        const Op op = std::move(s->queue.front());
        s->queue.pop_front();
        const CUresult rc = run(op);
        if (rc != CUDA_SUCCESS) {
            s->queue.clear();
            return rc;
        }
    }
    return S.sticky;
}

// Queues `op` on `s`, or records it when `s` is capturing.
CUresult enqueue(FakeStream* s, Op op) {
    if (s->capturing) {
        if (!s->invalidated.empty()) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        s->captured.push_back(std::move(op));
        return CUDA_SUCCESS;
    }
    if (op.kind == Op::kHtoD && op.pinned) {
        const uint8_t* src = (const uint8_t*)(uintptr_t)op.src;
        op.data.assign(src, src + op.bytes);
    }
    if (op.kind == Op::kDtoH && op.pinned)
        memset((void*)(uintptr_t)op.dst, kPoison, op.bytes);  // unreadable until it runs
    s->queue.push_back(std::move(op));
    if (s->queue.size() >= kMaxQueued) return drain_one(s);
    return CUDA_SUCCESS;
}

// ---- Launch checks ----------------------------------------------------------------------------

uint32_t max_threads(const FakeFunction* f) {
    const fake::CubinKernel& k = *f->meta;
    // Registers are allocated per warp in units of 256.
    const uint32_t per_warp = (k.registers * 32 + 255) / 256 * 256;
    uint32_t limit = 1024;
    if (per_warp > 0) {
        const uint32_t warps = kRegistersPerBlock / per_warp;
        if (warps * 32 < limit) limit = warps * 32;
    }
    if (k.max_threads && k.max_threads < limit) limit = k.max_threads;
    return limit;
}

CUresult check_launch(const FakeFunction* f, const uint32_t grid[3], const uint32_t block[3],
                      uint32_t shared) {
    const char* name = f->meta->name.c_str();
    if (!grid[0] || !grid[1] || !grid[2] || !block[0] || !block[1] || !block[2]) {
        report("cuLaunchKernel(%s): an empty grid or block", name);
        return CUDA_ERROR_INVALID_VALUE;
    }
    const uint64_t threads = (uint64_t)block[0] * block[1] * block[2];
    if (block[0] > 1024 || block[1] > 1024 || block[2] > 64 || threads > 1024 ||
        grid[0] > 0x7fffffffu || grid[1] > 65535 || grid[2] > 65535) {
        report("cuLaunchKernel(%s): grid (%u,%u,%u) or block (%u,%u,%u) over the device's limits",
               name, grid[0], grid[1], grid[2], block[0], block[1], block[2]);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (threads > max_threads(f)) {
        report("cuLaunchKernel(%s): %llu threads per block, but the kernel allows %u (%u "
               "registers per thread, __launch_bounds__ %u)",
               name, (unsigned long long)threads, max_threads(f), f->meta->registers,
               f->meta->max_threads);
        return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
    }
    if (shared > f->max_dynamic_shared) {
        report("cuLaunchKernel(%s): %u bytes of dynamic shared memory, over the kernel's limit of "
               "%u (raise it with cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES))",
               name, shared, f->max_dynamic_shared);
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

// The checks every device query starts with: an output, cuInit, device 0.
CUresult query_checks(const void* out, CUdevice dev) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    if (!state().initialized) return CUDA_ERROR_NOT_INITIALIZED;
    return dev == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

#define QUERY_CHECKS(out, dev)                               \
    do {                                                     \
        const CUresult rc_ = query_checks((out), (dev));     \
        if (rc_ != CUDA_SUCCESS) return rc_;                 \
    } while (0)

const char* error_name(CUresult e) {
    switch (e) {
#define NAME(x) \
    case x: return #x;
        NAME(CUDA_SUCCESS)
        NAME(CUDA_ERROR_INVALID_VALUE)
        NAME(CUDA_ERROR_OUT_OF_MEMORY)
        NAME(CUDA_ERROR_NOT_INITIALIZED)
        NAME(CUDA_ERROR_DEINITIALIZED)
        NAME(CUDA_ERROR_NO_DEVICE)
        NAME(CUDA_ERROR_INVALID_DEVICE)
        NAME(CUDA_ERROR_INVALID_IMAGE)
        NAME(CUDA_ERROR_INVALID_CONTEXT)
        NAME(CUDA_ERROR_NO_BINARY_FOR_GPU)
        NAME(CUDA_ERROR_INVALID_HANDLE)
        NAME(CUDA_ERROR_ILLEGAL_STATE)
        NAME(CUDA_ERROR_NOT_FOUND)
        NAME(CUDA_ERROR_NOT_READY)
        NAME(CUDA_ERROR_ILLEGAL_ADDRESS)
        NAME(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)
        NAME(CUDA_ERROR_CONTEXT_IS_DESTROYED)
        NAME(CUDA_ERROR_HARDWARE_STACK_ERROR)
        NAME(CUDA_ERROR_MISALIGNED_ADDRESS)
        NAME(CUDA_ERROR_LAUNCH_FAILED)
        NAME(CUDA_ERROR_NOT_SUPPORTED)
        NAME(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
        NAME(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
        NAME(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED)
        NAME(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD)
        NAME(CUDA_ERROR_UNKNOWN)
#undef NAME
    }
    return nullptr;
}

}  // namespace

State& state() {
    static State* s = [] {
        State* st = new State;  // never destroyed: entry points may run during exit
        st->total_memory = env_mb("LMI_FAKE_CUDA_MEMORY_MB", (size_t)4096 << 20);
        st->context_bytes = env_mb("LMI_FAKE_CUDA_CONTEXT_MB", (size_t)256 << 20);
        st->reverse_threads = env_reverse("LMI_EMU_THREAD_ORDER");
        st->reverse_blocks = env_reverse("LMI_EMU_BLOCK_ORDER");
        return st;
    }();
    return *s;
}

void report(const char* fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "lmi fake CUDA driver: %s\n", buf);
}

const Allocation* device_range(uint64_t p, size_t bytes) {
    State& S = state();
    auto it = S.device.upper_bound(p);
    if (it == S.device.begin()) return nullptr;
    --it;
    if (p + bytes > it->first + it->second.len || p + bytes < p) return nullptr;
    return &it->second;
}

CUresult drain(FakeStream* s) {
    State& S = state();
    S.synchronizations++;
    CUresult rc = CUDA_SUCCESS;
    if (s) {
        rc = drain_one(s);
    } else {
        rc = drain_one(&S.legacy);
        for (FakeStream* t : S.streams)
            if (rc == CUDA_SUCCESS) rc = drain_one(t);
    }
    if (rc == CUDA_SUCCESS) release_pool();
    return rc;
}

}  // namespace fake

using namespace fake;

// ---- The driver API ---------------------------------------------------------------------------

#define API extern "C" __attribute__((visibility("default")))

API CUresult cuInit(unsigned int flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    Lock lock(state().mu);
    state().initialized = true;
    return CUDA_SUCCESS;
}

API CUresult cuDriverGetVersion(int* version) {
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = kDriverVersion;
    return CUDA_SUCCESS;
}

API CUresult cuGetErrorName(CUresult error, const char** str) {
    if (!str) return CUDA_ERROR_INVALID_VALUE;
    *str = error_name(error);
    return *str ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuGetErrorString(CUresult error, const char** str) {
    return cuGetErrorName(error, str);
}

API CUresult cuDeviceGetCount(int* count) {
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    if (!state().initialized) return CUDA_ERROR_NOT_INITIALIZED;
    *count = 1;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGet(CUdevice* device, int ordinal) {
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (!state().initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
    *device = 0;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
    if (len <= 0) return CUDA_ERROR_INVALID_VALUE;
    QUERY_CHECKS(name, dev);
    snprintf(name, (size_t)len, "lmi fake GPU (sm_90, emulated on the CPU)");
    return CUDA_SUCCESS;
}

API CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
    QUERY_CHECKS(bytes, dev);
    *bytes = state().total_memory;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice dev) {
    QUERY_CHECKS(value, dev);
    int v;
    switch (attribute) {
        case ATTR_MAX_THREADS_PER_BLOCK: v = 1024; break;
        case ATTR_MAX_BLOCK_DIM_X:
        case ATTR_MAX_BLOCK_DIM_Y: v = 1024; break;
        case ATTR_MAX_BLOCK_DIM_Z: v = 64; break;
        case ATTR_MAX_GRID_DIM_X: v = 0x7fffffff; break;
        case ATTR_MAX_GRID_DIM_Y:
        case ATTR_MAX_GRID_DIM_Z: v = 65535; break;
        case ATTR_MAX_SHARED_MEMORY_PER_BLOCK: v = (int)kDefaultShared; break;
        case ATTR_TOTAL_CONSTANT_MEMORY: v = 64 * 1024; break;
        case ATTR_WARP_SIZE: v = 32; break;
        case ATTR_MAX_REGISTERS_PER_BLOCK:
        case ATTR_MAX_REGISTERS_PER_MULTIPROCESSOR: v = (int)kRegistersPerBlock; break;
        case ATTR_CLOCK_RATE: v = 1980000; break;
        case ATTR_MULTIPROCESSOR_COUNT: v = kMultiprocessors; break;
        case ATTR_INTEGRATED: v = 0; break;
        case ATTR_CAN_MAP_HOST_MEMORY:
        case ATTR_CONCURRENT_KERNELS:
        case ATTR_UNIFIED_ADDRESSING:
        case ATTR_MEMORY_POOLS_SUPPORTED: v = 1; break;
        case ATTR_MEMORY_CLOCK_RATE: v = 2619000; break;
        case ATTR_GLOBAL_MEMORY_BUS_WIDTH: v = 5120; break;
        case ATTR_L2_CACHE_SIZE: v = 50 << 20; break;
        case ATTR_MAX_THREADS_PER_MULTIPROCESSOR: v = 2048; break;
        case ATTR_ASYNC_ENGINE_COUNT: v = 2; break;
        case ATTR_COMPUTE_CAPABILITY_MAJOR: v = (int)kSm / 10; break;
        case ATTR_COMPUTE_CAPABILITY_MINOR: v = (int)kSm % 10; break;
        case ATTR_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: v = 228 * 1024; break;
        case ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: v = (int)kMaxSharedOptin; break;
        case ATTR_RESERVED_SHARED_MEMORY_PER_BLOCK: v = 1024; break;
        default:
            report("cuDeviceGetAttribute(%d): an attribute the fake driver does not model", attribute);
            return CUDA_ERROR_INVALID_VALUE;
    }
    *value = v;
    return CUDA_SUCCESS;
}

// ---- Contexts ---------------------------------------------------------------------------------

API CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice dev) {
    State& S = state();
    Lock lock(S.mu);
    QUERY_CHECKS(ctx, dev);
    if (S.primary.retained++ == 0) S.primary.alive = true;
    *ctx = &S.primary;
    return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    State& S = state();
    Lock lock(S.mu);
    if (!S.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    if (S.primary.retained == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (--S.primary.retained == 0) {
        // The context and everything in it go: device memory, modules, streams. The fault
        // state goes with them.
        drain(nullptr);
        while (!S.device.empty()) unmap_device(S.device.begin()->first);
        S.pool_reserved = 0;
        for (FakeModule* m : S.modules) m->loaded = false;
        for (FakeStream* s : S.streams) s->alive = false;
        S.streams.clear();
        S.primary.alive = false;
        S.sticky = CUDA_SUCCESS;
    }
    return CUDA_SUCCESS;
}

API CUresult cuCtxGetCurrent(CUcontext* ctx) {
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    if (!state().initialized) return CUDA_ERROR_NOT_INITIALIZED;
    *ctx = t_current;
    return CUDA_SUCCESS;
}

API CUresult cuCtxSetCurrent(CUcontext ctx) {
    State& S = state();
    if (!S.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (ctx && ctx != &S.primary) return CUDA_ERROR_INVALID_CONTEXT;
    t_current = ctx;
    return CUDA_SUCCESS;
}

API CUresult cuCtxSynchronize() {
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    UNSAFE_DURING_CAPTURE("cuCtxSynchronize");
    return drain(nullptr);
}

// ---- Memory -----------------------------------------------------------------------------------

API CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    if (!free_bytes || !total_bytes) return CUDA_ERROR_INVALID_VALUE;
    const size_t in_use = S.used + S.pool_reserved + S.context_bytes;
    *total_bytes = S.total_memory;
    *free_bytes = in_use < S.total_memory ? S.total_memory - in_use : 0;
    return CUDA_SUCCESS;
}

API CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t bytes) {
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    if (!p || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    UNSAFE_DURING_CAPTURE("cuMemAlloc");
    return map_device(bytes, false, p);
}

API CUresult cuMemFree_v2(CUdeviceptr p) {
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    UNSAFE_DURING_CAPTURE("cuMemFree");
    if (p == 0) return CUDA_SUCCESS;
    if (!S.device.count(p)) {
        report("cuMemFree(%#llx): not the start of a live allocation (double free?)",
               (unsigned long long)p);
        return CUDA_ERROR_INVALID_VALUE;
    }
    // cuMemFree waits for the device: the memory may be in use by queued work.
    const CUresult rc = drain(nullptr);
    if (rc != CUDA_SUCCESS) return rc;
    unmap_device(p);
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice dev) {
    QUERY_CHECKS(pool, dev);
    *pool = &state().pool;
    return CUDA_SUCCESS;
}

API CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void* value) {
    State& S = state();
    Lock lock(S.mu);
    if (pool != &S.pool || !value) return CUDA_ERROR_INVALID_VALUE;
    if (attr != MEMPOOL_ATTR_RELEASE_THRESHOLD) return CUDA_ERROR_INVALID_VALUE;
    memcpy(&S.pool.release_threshold, value, sizeof(uint64_t));
    return CUDA_SUCCESS;
}

API CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void* value) {
    State& S = state();
    Lock lock(S.mu);
    if (pool != &S.pool || !value) return CUDA_ERROR_INVALID_VALUE;
    uint64_t v = 0;
    size_t pool_used = 0;
    for (const auto& [start, a] : S.device)
        if (a.from_pool) pool_used += a.len;
    switch (attr) {
        case MEMPOOL_ATTR_RELEASE_THRESHOLD: v = S.pool.release_threshold; break;
        case MEMPOOL_ATTR_RESERVED_MEM_CURRENT: v = pool_used + S.pool_reserved; break;
        case MEMPOOL_ATTR_USED_MEM_CURRENT: v = pool_used; break;
        default: return CUDA_ERROR_INVALID_VALUE;
    }
    memcpy(value, &v, sizeof v);
    return CUDA_SUCCESS;
}

API CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
    State& S = state();
    Lock lock(S.mu);
    if (pool != &S.pool) return CUDA_ERROR_INVALID_VALUE;
    if (S.pool_reserved > keep) S.pool_reserved = keep;
    return CUDA_SUCCESS;
}

API CUresult cuMemAllocAsync(CUdeviceptr* p, size_t bytes, CUstream h) {
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    FakeStream* s = stream_of(h);
    if (!p || !s || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    if (s->capturing) {
        report("cuMemAllocAsync during stream capture: the fake driver does not model graph "
               "memory nodes");
        invalidate(s, "cuMemAllocAsync (not modelled by the fake driver)");
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    return map_device(bytes, true, p);
}

API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream h) {
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    FakeStream* s = stream_of(h);
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    if (!S.device.count(p)) {
        report("cuMemFreeAsync(%#llx): not the start of a live allocation (double free?)",
               (unsigned long long)p);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (s->capturing) {
        report("cuMemFreeAsync during stream capture: the fake driver does not model graph "
               "memory nodes");
        invalidate(s, "cuMemFreeAsync (not modelled by the fake driver)");
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    Op op{Op::kFree};
    op.dst = p;
    return enqueue(s, std::move(op));
}

API CUresult cuMemHostAlloc(void** p, size_t bytes, unsigned int flags) {
    (void)flags;
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    if (!p || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    UNSAFE_DURING_CAPTURE("cuMemHostAlloc");
    void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    memset(m, kPoison, bytes);
    S.pinned[(uintptr_t)m] = bytes;
    *p = m;
    return CUDA_SUCCESS;
}

API CUresult cuMemFreeHost(void* p) {
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    UNSAFE_DURING_CAPTURE("cuMemFreeHost");
    auto it = S.pinned.find((uintptr_t)p);
    if (it == S.pinned.end()) return CUDA_ERROR_INVALID_VALUE;
    const CUresult rc = drain(nullptr);  // copies from or to it may be queued
    munmap(p, it->second);
    S.pinned.erase(it);
    return rc;
}

API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream h) {
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    FakeStream* s = stream_of(h);
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    if (n == 0) return CUDA_SUCCESS;
    if (!device_range(dst, n)) return CUDA_ERROR_INVALID_VALUE;
    Op op{Op::kMemset};
    op.dst = dst;
    op.bytes = n;
    op.value = value;
    return enqueue(s, std::move(op));
}

API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, CUstream h) {
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    FakeStream* s = stream_of(h);
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    if (n == 0) return CUDA_SUCCESS;
    if (!src || !device_range(dst, n)) return CUDA_ERROR_INVALID_VALUE;
    Op op{Op::kHtoD};
    op.dst = dst;
    op.src = (uint64_t)(uintptr_t)src;
    op.bytes = n;
    op.pinned = is_pinned(src, n);
    if (s->capturing && !op.pinned) {
        invalidate(s, "an asynchronous copy from pageable memory");
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    // From pageable memory the driver stages the bytes before returning: the caller may reuse
    // them at once.
    if (!op.pinned) op.data.assign((const uint8_t*)src, (const uint8_t*)src + n);
    return enqueue(s, std::move(op));
}

API CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, CUstream h) {
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    FakeStream* s = stream_of(h);
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    if (n == 0) return CUDA_SUCCESS;
    if (!dst || !device_range(src, n)) return CUDA_ERROR_INVALID_VALUE;
    Op op{Op::kDtoH};
    op.dst = (uint64_t)(uintptr_t)dst;
    op.src = src;
    op.bytes = n;
    op.pinned = is_pinned(dst, n);
    if (op.pinned) return enqueue(s, std::move(op));
    if (s->capturing) {
        invalidate(s, "an asynchronous copy to pageable memory");
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    // To pageable memory the call returns once the copy (after the work before it) is done.
    const CUresult rc = enqueue(s, std::move(op));
    return rc == CUDA_SUCCESS ? drain(s) : rc;
}

API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    FakeStream* s = stream_of(h);
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    if (n == 0) return CUDA_SUCCESS;
    if (!device_range(dst, n) || !device_range(src, n)) return CUDA_ERROR_INVALID_VALUE;
    Op op{Op::kDtoD};
    op.dst = dst;
    op.src = src;
    op.bytes = n;
    return enqueue(s, std::move(op));
}

API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    UNSAFE_DURING_CAPTURE("cuMemcpyHtoD");
    const CUresult rc = drain(nullptr);
    if (rc != CUDA_SUCCESS) return rc;
    if (n == 0) return CUDA_SUCCESS;
    if (!src || !device_range(dst, n)) return CUDA_ERROR_INVALID_VALUE;
    memcpy((void*)(uintptr_t)dst, src, n);
    return CUDA_SUCCESS;
}

API CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    UNSAFE_DURING_CAPTURE("cuMemcpyDtoH");
    const CUresult rc = drain(nullptr);
    if (rc != CUDA_SUCCESS) return rc;
    if (n == 0) return CUDA_SUCCESS;
    if (!dst || !device_range(src, n)) return CUDA_ERROR_INVALID_VALUE;
    memcpy(dst, (const void*)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

// ---- Streams ----------------------------------------------------------------------------------

API CUresult cuStreamCreate(CUstream* out, unsigned int flags) {
    (void)flags;
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    FakeStream* s = new FakeStream;
    S.streams.insert(s);
    *out = s;
    return CUDA_SUCCESS;
}

API CUresult cuStreamDestroy_v2(CUstream h) {
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    if (!h || !S.streams.count(h)) return CUDA_ERROR_INVALID_HANDLE;
    // Work already queued completes (the driver destroys the stream once it has).
    const CUresult rc = drain(h);
    S.streams.erase(h);
    h->alive = false;
    return rc;
}

API CUresult cuStreamSynchronize(CUstream h) {
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    FakeStream* s = stream_of(h);
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    if (s->capturing) {
        invalidate(s, "cuStreamSynchronize on the capturing stream");
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    UNSAFE_DURING_CAPTURE("cuStreamSynchronize");
    return drain(s);
}

API CUresult cuStreamQuery(CUstream h) {
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    FakeStream* s = stream_of(h);
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    if (s->capturing) {
        invalidate(s, "cuStreamQuery on the capturing stream");
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    return drain(s);
}

API CUresult cuStreamBeginCapture_v2(CUstream h, int mode) {
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    if (!h) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;  // the legacy stream cannot capture
    if (!S.streams.count(h)) return CUDA_ERROR_INVALID_HANDLE;
    if (mode < CAPTURE_MODE_GLOBAL || mode > CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
    if (h->capturing) return CUDA_ERROR_ILLEGAL_STATE;
    h->capturing = true;
    h->capture_mode = mode;
    h->capture_thread = std::this_thread::get_id();
    h->invalidated.clear();
    h->captured.clear();
    return CUDA_SUCCESS;
}

API CUresult cuStreamIsCapturing(CUstream h, int* status) {
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    FakeStream* s = stream_of(h);
    if (!s || !status) return CUDA_ERROR_INVALID_VALUE;
    *status = !s->capturing              ? CAPTURE_STATUS_NONE
              : s->invalidated.empty() ? CAPTURE_STATUS_ACTIVE
                                       : CAPTURE_STATUS_INVALIDATED;
    return CUDA_SUCCESS;
}

API CUresult cuStreamEndCapture(CUstream h, CUgraph* graph) {
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    if (!graph) return CUDA_ERROR_INVALID_VALUE;
    *graph = nullptr;
    if (!h || !S.streams.count(h)) return CUDA_ERROR_INVALID_HANDLE;
    if (!h->capturing) return CUDA_ERROR_ILLEGAL_STATE;
    if (h->capture_mode != CAPTURE_MODE_RELAXED &&
        h->capture_thread != std::this_thread::get_id())
        return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    h->capturing = false;
    if (!h->invalidated.empty()) {
        report("the capture was invalidated: %s", h->invalidated.c_str());
        h->captured.clear();
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    FakeGraph* g = new FakeGraph{std::move(h->captured)};
    h->captured.clear();
    S.graphs.insert(g);
    *graph = g;
    return CUDA_SUCCESS;
}

// ---- Graphs -----------------------------------------------------------------------------------

API CUresult cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph,
                                         unsigned long long flags) {
    (void)flags;
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    if (!exec || !graph || !S.graphs.count(graph)) return CUDA_ERROR_INVALID_VALUE;
    FakeGraphExec* e = new FakeGraphExec{graph->ops};
    S.execs.insert(e);
    *exec = e;
    return CUDA_SUCCESS;
}

API CUresult cuGraphDestroy(CUgraph graph) {
    State& S = state();
    Lock lock(S.mu);
    if (!graph || !S.graphs.erase(graph)) return CUDA_ERROR_INVALID_VALUE;
    delete graph;
    return CUDA_SUCCESS;
}

API CUresult cuGraphExecDestroy(CUgraphExec exec) {
    State& S = state();
    Lock lock(S.mu);
    if (!exec || !S.execs.erase(exec)) return CUDA_ERROR_INVALID_VALUE;
    delete exec;
    return CUDA_SUCCESS;
}

API CUresult cuGraphUpload(CUgraphExec exec, CUstream h) {
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    if (!exec || !S.execs.count(exec)) return CUDA_ERROR_INVALID_VALUE;
    return stream_of(h) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

API CUresult cuGraphLaunch(CUgraphExec exec, CUstream h) {
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    if (!exec || !S.execs.count(exec)) return CUDA_ERROR_INVALID_VALUE;
    FakeStream* s = stream_of(h);
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    if (s->capturing) {
        report("cuGraphLaunch into a capturing stream: not modelled by the fake driver");
        invalidate(s, "cuGraphLaunch (not modelled by the fake driver)");
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    for (const Op& op : exec->ops) {
        if (op.kind == Op::kLaunch && !op.fn->module->loaded) return CUDA_ERROR_INVALID_HANDLE;
        const CUresult rc = enqueue(s, op);
        if (rc != CUDA_SUCCESS) return rc;
    }
    return CUDA_SUCCESS;
}

// ---- Modules and kernels ----------------------------------------------------------------------

API CUresult cuModuleLoadData(CUmodule* module, const void* image) {
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    if (!module || !image) return CUDA_ERROR_INVALID_VALUE;
    auto m = std::make_unique<FakeModule>();
    std::string error;
    if (!parse_cubin(image, &m->cubin, &error)) {
        report("cuModuleLoadData: %s (the fake driver loads CUBINs only, not PTX or fatbins)",
               error.c_str());
        return CUDA_ERROR_INVALID_IMAGE;
    }
    // SASS runs on the architecture it was built for: same major, minor not above.
    if (m->cubin.sm / 10 != kSm / 10 || m->cubin.sm % 10 > kSm % 10) {
        report("cuModuleLoadData: a CUBIN for sm_%u cannot run on this sm_%u device",
               m->cubin.sm, kSm);
        return CUDA_ERROR_NO_BINARY_FOR_GPU;
    }
    *module = m.get();
    S.modules.insert(m.release());
    return CUDA_SUCCESS;
}

API CUresult cuModuleUnload(CUmodule module) {
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    if (!module || !S.modules.count(module) || !module->loaded) return CUDA_ERROR_INVALID_HANDLE;
    // Kept allocated (handles may still be held), but unusable.
    module->loaded = false;
    return CUDA_SUCCESS;
}

API CUresult cuModuleGetFunction(CUfunction* out, CUmodule module, const char* name) {
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    if (!out || !name) return CUDA_ERROR_INVALID_VALUE;
    if (!module || !S.modules.count(module) || !module->loaded) return CUDA_ERROR_INVALID_HANDLE;
    for (auto& f : module->functions)
        if (f->meta->name == name) {
            *out = f.get();
            return CUDA_SUCCESS;
        }
    const fake::CubinKernel* meta = nullptr;
    for (const auto& k : module->cubin.kernels)
        if (k.name == name) meta = &k;
    if (!meta) return CUDA_ERROR_NOT_FOUND;
    const long emu = lmi_emu_kernel_index(name);
    if (emu < 0) {
        report("kernel `%s` is in the CUBIN but not in the emulator: is its .cu file in "
               "kernels/ (the fake driver runs the emulator's build of each kernel)?", name);
        return CUDA_ERROR_NOT_FOUND;
    }
    // The kernel NVRTC compiled and the one the emulator runs must take the same parameters.
    const size_t n = lmi_emu_kernel_param_count((size_t)emu);
    bool same = n == meta->params.size();
    for (size_t i = 0; same && i < n; ++i)
        same = lmi_emu_kernel_param_size((size_t)emu, i) == meta->params[i].size;
    if (!same) {
        report("kernel `%s`: the CUBIN's %zu parameters differ from the emulator's %zu (count or "
               "sizes)", name, meta->params.size(), n);
        return CUDA_ERROR_INVALID_IMAGE;
    }
    auto f = std::make_unique<FakeFunction>(FakeFunction{
        module, meta, (size_t)emu,
        meta->static_shared < kDefaultShared ? kDefaultShared - meta->static_shared : 0});
    *out = f.get();
    module->functions.push_back(std::move(f));
    return CUDA_SUCCESS;
}

static bool live_function(CUfunction f) {
    return f && state().modules.count(f->module) && f->module->loaded;
}

API CUresult cuFuncGetAttribute(int* value, int attr, CUfunction f) {
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    if (!live_function(f)) return CUDA_ERROR_INVALID_HANDLE;
    const fake::CubinKernel& k = *f->meta;
    switch (attr) {
        case FUNC_MAX_THREADS_PER_BLOCK: *value = (int)max_threads(f); break;
        case FUNC_SHARED_SIZE_BYTES: *value = (int)k.static_shared; break;
        case FUNC_CONST_SIZE_BYTES: *value = 0; break;
        case FUNC_LOCAL_SIZE_BYTES: *value = (int)k.frame_bytes; break;
        case FUNC_NUM_REGS: *value = (int)k.registers; break;
        case FUNC_PTX_VERSION:
        case FUNC_BINARY_VERSION: *value = (int)f->module->cubin.sm; break;
        case FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES: *value = (int)f->max_dynamic_shared; break;
        default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

API CUresult cuFuncSetAttribute(CUfunction f, int attr, int value) {
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    if (!live_function(f)) return CUDA_ERROR_INVALID_HANDLE;
    if (attr == FUNC_PREFERRED_SHARED_MEMORY_CARVEOUT) return CUDA_SUCCESS;
    if (attr != FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES) return CUDA_ERROR_INVALID_VALUE;
    if (value < 0 || (uint64_t)value + f->meta->static_shared > kMaxSharedOptin) {
        report("cuFuncSetAttribute(%s, MAX_DYNAMIC_SHARED_SIZE_BYTES, %d): with %u bytes of "
               "static shared memory, over the %u a block may opt in to",
               f->meta->name.c_str(), value, f->meta->static_shared, kMaxSharedOptin);
        return CUDA_ERROR_INVALID_VALUE;
    }
    f->max_dynamic_shared = (uint32_t)value;
    return CUDA_SUCCESS;
}

API CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                            unsigned int bx, unsigned int by, unsigned int bz,
                            unsigned int shared, CUstream h, void** params, void** extra) {
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    if (!live_function(f)) return CUDA_ERROR_INVALID_HANDLE;
    FakeStream* s = stream_of(h);
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    if (extra) {
        report("cuLaunchKernel: `extra` parameter buffers are not modelled by the fake driver");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    const fake::CubinKernel& k = *f->meta;
    if (!params && !k.params.empty()) return CUDA_ERROR_INVALID_VALUE;
    Op op{Op::kLaunch};
    op.fn = f;
    const uint32_t grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    const CUresult rc = check_launch(f, grid, block, shared);
    if (rc != CUDA_SUCCESS) return rc;
    memcpy(op.grid, grid, sizeof grid);
    memcpy(op.block, block, sizeof block);
    op.shared = shared;
    // The values are copied now, as the driver does: the caller's buffers may change after.
    uint32_t bytes = k.param_bytes;
    for (const fake::CubinParam& p : k.params)
        if (p.offset + p.size > bytes) bytes = p.offset + p.size;
    op.params.assign((bytes + 7) / 8, 0);
    for (size_t i = 0; i < k.params.size(); ++i)
        memcpy((char*)op.params.data() + k.params[i].offset, params[i], k.params[i].size);
    return enqueue(s, std::move(op));
}

// ---- For the fake cuBLAS (libcublas.so.13 finds these by dlsym) -------------------------------

API int lmi_fake_has_context() {
    Lock lock(state().mu);
    return state().initialized && t_current && t_current->alive;
}

API int lmi_fake_is_stream(CUstream h) {
    Lock lock(state().mu);
    return stream_of(h) != nullptr;
}

API int lmi_fake_is_device_range(CUdeviceptr p, size_t bytes) {
    Lock lock(state().mu);
    return device_range(p, bytes) != nullptr;
}

// For tests: how many times the host has waited for the device (synchronizations, blocking
// copies, frees that wait).
API unsigned long long lmi_fake_synchronizations() {
    Lock lock(state().mu);
    return state().synchronizations;
}

API CUresult lmi_fake_enqueue_gemm(CUstream h, const LmiFakeGemm* g) {
    State& S = state();
    Lock lock(S.mu);
    NEED_CONTEXT();
    FakeStream* s = stream_of(h);
    if (!s || !g) return CUDA_ERROR_INVALID_HANDLE;
    Op op{Op::kGemm};
    op.gemm = *g;
    return enqueue(s, std::move(op));
}

// NVRTC opens libcuda.so.1 itself and asks for the runtime's private export tables: the fake
// has none, which NVRTC takes as "no driver" (it then compiles as it does without one).
API CUresult cuGetExportTable(const void** table, const void* id) {
    (void)id;
    if (table) *table = nullptr;
    return CUDA_ERROR_NOT_SUPPORTED;
}
