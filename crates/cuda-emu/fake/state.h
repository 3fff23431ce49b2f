// The fake driver's state: one emulated sm_90 device, its primary context, device and
// page-locked memory, modules, streams with their queued work, captures and graphs. Every entry
// point holds `State::mu`; queued work runs when a synchronization or a copy back to pageable
// memory needs it (drain), which is when a host-side race shows.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cuda_abi.h"
#include "cubin.h"

struct FakeContext {
    int retained = 0;
    bool alive = false;
};

struct FakeModule {
    fake::Cubin cubin;
    bool loaded = true;
    std::vector<std::unique_ptr<struct FakeFunction>> functions;
};

struct FakeFunction {
    FakeModule* module;
    const fake::CubinKernel* meta;
    size_t emu_index;  // in the emulator's kernel registry
    uint32_t max_dynamic_shared;
};

namespace fake {

// One unit of work on a stream (or recorded in a graph), with everything it needs by value.
struct Op {
    enum Kind : uint8_t { kLaunch, kMemset, kHtoD, kDtoH, kDtoD, kFree, kGemm } kind;
    // kLaunch: the parameter buffer as the kernel's KPARAM layout places it.
    const FakeFunction* fn = nullptr;
    uint32_t grid[3] = {1, 1, 1}, block[3] = {1, 1, 1}, shared = 0;
    std::vector<uint64_t> params;
    // Copies, memsets, frees.
    uint64_t dst = 0, src = 0;
    size_t bytes = 0;
    uint8_t value = 0;
    // The host side of a copy is page-locked: read or written when the op runs, so the host
    // must leave it alone until then. For kHtoD: `data` is what it held at enqueue (compared
    // when the copy runs); from pageable memory, `data` is the copy itself, taken at enqueue.
    bool pinned = false;
    std::vector<uint8_t> data;
    LmiFakeGemm gemm{};
};

}  // namespace fake

struct FakeStream {
    bool alive = true;
    std::deque<fake::Op> queue;
    // Stream capture.
    bool capturing = false;
    int capture_mode = 0;
    std::thread::id capture_thread;
    std::string invalidated;  // why the capture is invalid, or empty
    std::vector<fake::Op> captured;
};

struct FakeGraph {
    std::vector<fake::Op> ops;
};

struct FakeGraphExec {
    std::vector<fake::Op> ops;
};

struct FakePool {
    uint64_t release_threshold = 0;
};

namespace fake {

struct Allocation {
    uintptr_t map_base;
    size_t map_len;
    size_t len;
    size_t slack;  // poisoned bytes between the end and the guard page
    bool from_pool;
};

struct State {
    std::recursive_mutex mu;
    bool initialized = false;
    size_t total_memory = 0;
    size_t context_bytes = 0;  // what a context and its runtime take on a GPU
    size_t used = 0;           // live device allocations
    size_t pool_reserved = 0;  // freed into the default pool and kept (release threshold)
    std::map<uint64_t, Allocation> device;
    // The address ranges of the latest frees, still reserved without access (see
    // unmap_device): (mapping base, length), oldest first.
    std::deque<std::pair<uintptr_t, size_t>> quarantine;
    std::map<uintptr_t, size_t> pinned;
    FakeContext primary;
    FakePool pool;
    FakeStream legacy;  // the NULL stream
    std::set<FakeStream*> streams;
    std::set<FakeModule*> modules;
    std::set<FakeGraph*> graphs;
    std::set<FakeGraphExec*> execs;
    CUresult sticky = CUDA_SUCCESS;  // a fault poisons the context, as on a GPU
    unsigned long long synchronizations = 0;  // times the host waited (drain)
    bool reverse_threads = false, reverse_blocks = false;
};

State& state();

// Runs the work queued on `s` (every stream when null) in order. The first failure is sticky.
CUresult drain(FakeStream* s);
// Prints "lmi fake CUDA driver: ..." on stderr.
void report(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// The live allocation holding [p, p + bytes), or null.
const Allocation* device_range(uint64_t p, size_t bytes);
// Column-major C = alpha·op(A)·op(B) + beta·C on the host (gemm.cpp).
void host_gemm(const LmiFakeGemm& g);

}  // namespace fake
