// The emulator's runtime: the kernel registry, the block scheduler (one fiber per CUDA thread),
// the barrier and warp rendezvous semantics, the fault handler, and the C API used by Rust.
//
// A launch runs its blocks one after another (linear order, x fastest, or reversed). Within a
// block, the scheduler makes passes over the threads in linear order (or reversed); each
// runnable thread runs until it reaches a synchronization point or returns. Running kernels in
// both orders is how tests catch a missing __syncthreads: with one order a reader runs before
// its writer.
#include <cxxabi.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "emu_runtime.h"
#include "fiber.h"

namespace lmi_emu {

uint3 g_thread_idx;
uint3 g_block_idx;
dim3 g_block_dim;
dim3 g_grid_dim;
void* g_dynamic_shared;
unsigned g_lane;

namespace {

constexpr unsigned kMaxThreads = 1024;
constexpr unsigned kMaxDynamicShared = 227 * 1024;
constexpr unsigned kNoThread = ~0u;

struct Kernel {
    const char* name;
    const char* file;
    void (*fn)();
    Invoker invoke;
    std::vector<size_t> sizes;
    std::vector<std::string> types;
};

std::vector<Kernel>& kernels() {
    static std::vector<Kernel> k;
    return k;
}

const std::vector<Kernel>& registry() {
    static std::once_flag once;
    std::call_once(once, [] { register_all_kernels(); });
    return kernels();
}

enum class State : uint8_t { kRunnable, kAtBlockBarrier, kAtWarpBarrier, kExited };

// What the scheduler knows of one CUDA thread of the running block.
struct ThreadSlot {
    State state;
    uint8_t op;  // BlockOp or WarpOp while waiting
    unsigned mask;
    unsigned src;  // shuffles: the source lane
    uint64_t value;
    uint64_t result;
    const char* file;
    int line;
    unsigned epoch;  // barriers passed (tells lanes that exited long ago from converged ones)
};

struct Launch {
    const Kernel* kernel;
    dim3 grid, block;
    unsigned nthreads;
    unsigned shared_bytes;
    bool reverse_threads;
    bool reverse_blocks;
    void** params;

    unsigned current = kNoThread;  // linear id of the thread being run
    unsigned live = 0;              // threads of the block not exited
    // The block barrier being gathered.
    unsigned at_barrier = 0;
    uint8_t barrier_op = 0;
    const char* barrier_file = nullptr;
    int barrier_line = 0;
    int barrier_acc = 0;
    int barrier_result = 0;

    std::vector<ThreadSlot> threads;
    Fiber* fibers = nullptr;
    Fiber sched;

    bool failed = false;
    std::string error;

    // Set for a recoverable launch (the fake driver's): a fault ends the launch with an error
    // code (lmi_emu_launch_recoverable) instead of aborting the process.
    sigjmp_buf* recover = nullptr;
};

// What the fault handler leaves for a recoverable launch: the error code and the report.
int g_fault_code = 0;
char g_fault_report[4096];

Launch* volatile g_launch = nullptr;  // the launch in progress (the fault handler reads it)
pthread_t g_launch_thread;
std::mutex g_launch_mutex;
StackPool g_stacks;
thread_local std::string g_last_error;

// The dynamic shared buffer: its end is followed by a guard page, so reading past the launch's
// size faults (the buffer is placed to end there).
char* g_dyn_end = nullptr;

const char* basename_of(const char* path) {
    if (!path) return "?";
    const char* s = strrchr(path, '/');
    return s ? s + 1 : path;
}

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}

const char* warp_op_name(uint8_t op) {
    switch (op) {
        case kSyncwarp: return "__syncwarp";
        case kShflIdx: return "__shfl_sync";
        case kShflUp: return "__shfl_up_sync";
        case kShflDown: return "__shfl_down_sync";
        case kShflXor: return "__shfl_xor_sync";
        case kBallot: return "__ballot_sync/__any_sync/__all_sync";
        case kMatchAny: return "__match_any_sync";
        case kMatchAll: return "__match_all_sync";
        case kReduceAdd: return "__reduce_add_sync";
        case kReduceMinU:
        case kReduceMinI: return "__reduce_min_sync";
        case kReduceMaxU:
        case kReduceMaxI: return "__reduce_max_sync";
        case kReduceAnd: return "__reduce_and_sync";
        case kReduceOr: return "__reduce_or_sync";
        case kReduceXor: return "__reduce_xor_sync";
        case kCollective: return "nvcuda::wmma operation";
    }
    return "warp intrinsic";
}

const char* block_op_name(uint8_t op) {
    switch (op) {
        case kSyncthreads: return "__syncthreads";
        case kSyncthreadsCount: return "__syncthreads_count";
        case kSyncthreadsAnd: return "__syncthreads_and";
        case kSyncthreadsOr: return "__syncthreads_or";
    }
    return "block barrier";
}

std::string thread_name(const Launch& L, unsigned tid) {
    if (L.block.y == 1 && L.block.z == 1) return format("thread %u", tid);
    return format("thread %u (%u,%u,%u)", tid, tid % L.block.x, (tid / L.block.x) % L.block.y,
                  tid / (L.block.x * L.block.y));
}

// "kernel `k` (file.cu), block (x,y,z)": the prefix of every launch error.
std::string where(const Launch& L) {
    return format("kernel `%s` (%s), block (%u,%u,%u) of grid (%u,%u,%u), block size (%u,%u,%u)",
                  L.kernel->name, L.kernel->file, g_block_idx.x, g_block_idx.y, g_block_idx.z,
                  L.grid.x, L.grid.y, L.grid.z, L.block.x, L.block.y, L.block.z);
}

std::string site(const char* file, int line) { return format("%s:%d", basename_of(file), line); }

// Where a waiting thread is, for deadlock and mismatch reports: "__syncthreads() [k.cu:12]".
std::string wait_site(const ThreadSlot& t) {
    if (t.state == State::kAtBlockBarrier)
        return format("%s() [%s]", block_op_name(t.op), site(t.file, t.line).c_str());
    if (t.op == kCollective) {
        // `value` points to the waiting lane's Collective, alive while it waits.
        const Collective* c = reinterpret_cast<const Collective*>(t.value);
        char args[256];
        c->describe(c->key, args, sizeof args);
        return format("%s(%s) [%s]", c->name, args, site(t.file, t.line).c_str());
    }
    return format("%s(mask 0x%08x) [%s]", warp_op_name(t.op), t.mask, site(t.file, t.line).c_str());
}

// A thread's state as a predicate, singular or plural: "waits at __syncthreads() [k.cu:12]".
std::string describe_state(const ThreadSlot& t, bool plural) {
    switch (t.state) {
        case State::kRunnable: return plural ? "are running" : "is running";
        case State::kExited: return plural ? "have exited" : "has exited";
        default: return (plural ? "wait at " : "waits at ") + wait_site(t);
    }
}

// Every thread's state, consecutive threads in the same state grouped: "threads 0-31 wait at
// __syncthreads() [k.cu:12]; threads 32-63 have exited".
std::string describe_block(const Launch& L) {
    std::string out;
    unsigned groups = 0;
    for (unsigned i = 0; i < L.nthreads;) {
        const std::string d = describe_state(L.threads[i], false);
        unsigned j = i + 1;
        while (j < L.nthreads && describe_state(L.threads[j], false) == d) ++j;
        if (groups == 16) {
            out += "; ...";
            break;
        }
        if (!out.empty()) out += "; ";
        out += j == i + 1 ? format("thread %u %s", i, d.c_str())
                          : format("threads %u-%u %s", i, j - 1,
                                   describe_state(L.threads[i], true).c_str());
        ++groups;
        i = j;
    }
    return out;
}

Launch& launch() { return *g_launch; }

// Records the launch's first error.
void set_error(const std::string& msg) {
    Launch& L = launch();
    if (!L.failed) {
        L.failed = true;
        L.error = msg;
    }
}

// Ends the launch from inside a thread: the thread is never resumed.
[[noreturn]] void fail_in_thread(const std::string& msg) {
    Launch& L = launch();
    set_error(msg);
    fiber_switch(&L.fibers[L.current], &L.sched, true);
    abort();  // unreachable: a failed launch never resumes its threads
}

void yield_to_scheduler() {
    Launch& L = launch();
    fiber_switch(&L.fibers[L.current], &L.sched);
}

void complete_block_barrier(Launch& L) {
    L.barrier_result = L.barrier_acc;
    for (ThreadSlot& t : L.threads) {
        if (t.state == State::kAtBlockBarrier) {
            t.state = State::kRunnable;
            t.epoch++;
        }
    }
    L.at_barrier = 0;
}

// Every lane of warp `base` waits at a collective: check they are at the same call with the same
// arguments, run it once for the warp, and release the lanes.
void run_collective(Launch& L, unsigned base) {
    ThreadSlot* lanes = &L.threads[base];
    const ThreadSlot& me = L.threads[L.current];
    const Collective* mine = reinterpret_cast<const Collective*>(me.value);
    void* args[32];
    for (unsigned j = 0; j < 32; ++j) {
        const Collective* c = reinterpret_cast<const Collective*>(lanes[j].value);
        const bool same = lanes[j].line == me.line && strcmp(lanes[j].file, me.file) == 0 &&
                          strcmp(c->name, mine->name) == 0 && c->key_bytes == mine->key_bytes &&
                          memcmp(c->key, mine->key, c->key_bytes) == 0;
        if (!same) {
            fail_in_thread(format(
                "%s: the lanes of warp %u disagree: %s calls %s while %s calls %s (a wmma "
                "operation is warp-wide: every lane of the warp must make the same call with the "
                "same arguments)",
                where(L).c_str(), base / 32, thread_name(L, L.current).c_str(),
                wait_site(me).c_str(), thread_name(L, base + j).c_str(),
                wait_site(lanes[j]).c_str()));
        }
        args[j] = c->arg;
    }
    mine->run(args);
    for (unsigned j = 0; j < 32; ++j) {
        lanes[j].state = State::kRunnable;
        lanes[j].epoch++;
    }
}

// All lanes of `mask` in warp `base` have arrived: check they agree, compute every lane's
// result, and release them.
void complete_warp(Launch& L, unsigned base, unsigned mask) {
    ThreadSlot* lanes = &L.threads[base];
    const ThreadSlot& me = L.threads[L.current];
    for (unsigned j = 0; j < 32; ++j) {
        if (!(mask >> j & 1)) continue;
        if (lanes[j].op != me.op || lanes[j].mask != me.mask) {
            fail_in_thread(format(
                "%s: the lanes of warp %u disagree: %s waits at %s while %s waits at %s (every "
                "lane named in a warp intrinsic's mask must call the same intrinsic with the "
                "same mask)",
                where(L).c_str(), base / 32, thread_name(L, L.current).c_str(),
                wait_site(me).c_str(), thread_name(L, base + j).c_str(),
                wait_site(lanes[j]).c_str()));
        }
    }
    if (me.op == kCollective) {
        run_collective(L, base);
        return;
    }
    uint64_t agg = 0;
    switch (me.op) {
        case kBallot:
            for (unsigned j = 0; j < 32; ++j)
                if ((mask >> j & 1) && lanes[j].value) agg |= 1ull << j;
            break;
        case kReduceAdd:
        case kReduceAnd:
        case kReduceOr:
        case kReduceXor:
        case kReduceMinU:
        case kReduceMaxU:
        case kReduceMinI:
        case kReduceMaxI: {
            bool first = true;
            uint32_t acc = 0;
            for (unsigned j = 0; j < 32; ++j) {
                if (!(mask >> j & 1)) continue;
                const uint32_t v = (uint32_t)lanes[j].value;
                if (first) {
                    acc = v;
                    first = false;
                    continue;
                }
                switch (me.op) {
                    case kReduceAdd: acc += v; break;
                    case kReduceAnd: acc &= v; break;
                    case kReduceOr: acc |= v; break;
                    case kReduceXor: acc ^= v; break;
                    case kReduceMinU: acc = v < acc ? v : acc; break;
                    case kReduceMaxU: acc = v > acc ? v : acc; break;
                    case kReduceMinI: acc = (int32_t)v < (int32_t)acc ? v : acc; break;
                    default: acc = (int32_t)v > (int32_t)acc ? v : acc; break;
                }
            }
            agg = acc;
            break;
        }
        case kMatchAll: {
            agg = mask;
            for (unsigned j = 0; j < 32; ++j)
                if ((mask >> j & 1) && lanes[j].value != me.value) agg = 0;
            break;
        }
        default: break;
    }
    for (unsigned j = 0; j < 32; ++j) {
        if (!(mask >> j & 1)) continue;
        ThreadSlot& t = lanes[j];
        switch (t.op) {
            case kShflIdx:
            case kShflUp:
            case kShflDown:
            case kShflXor: t.result = lanes[t.src].value; break;
            case kMatchAny: {
                uint64_t m = 0;
                for (unsigned k = 0; k < 32; ++k)
                    if ((mask >> k & 1) && lanes[k].value == t.value) m |= 1ull << k;
                t.result = m;
                break;
            }
            default: t.result = agg; break;
        }
        t.state = State::kRunnable;
        t.epoch++;
    }
}

[[noreturn]] void thread_exit() {
    Launch& L = launch();
    const unsigned tid = L.current;
    L.threads[tid].state = State::kExited;
    L.live--;
    // A warp mate waiting for this lane can never complete.
    const unsigned base = tid & ~31u, lane = tid & 31u;
    for (unsigned j = 0; j < 32 && base + j < L.nthreads; ++j) {
        const ThreadSlot& t = L.threads[base + j];
        if (t.state == State::kAtWarpBarrier && (t.mask >> lane & 1)) {
            fail_in_thread(format("%s: %s exited while %s waits for it at %s (every lane named "
                                  "in a warp intrinsic's mask must reach it)",
                                  where(L).c_str(), thread_name(L, tid).c_str(),
                                  thread_name(L, base + j).c_str(), wait_site(t).c_str()));
        }
    }
    // Exited threads no longer count at __syncthreads.
    if (L.live > 0 && L.at_barrier == L.live) complete_block_barrier(L);
    fiber_switch(&L.fibers[tid], &L.sched, true);
    abort();  // unreachable: an exited fiber is never resumed
}

void fiber_entry() {
    fiber_started();
    Launch& L = launch();
    L.kernel->invoke(L.kernel->fn, L.params);
    thread_exit();
}

void resume(Launch& L, unsigned tid) {
    L.current = tid;
    g_thread_idx = uint3{tid % L.block.x, (tid / L.block.x) % L.block.y,
                         tid / (L.block.x * L.block.y)};
    g_lane = tid & 31u;
    fiber_switch(&L.sched, &L.fibers[tid]);
    L.current = kNoThread;
}

void run_block(Launch& L, uint3 block_idx) {
    g_block_idx = block_idx;
    if (L.shared_bytes) memset(g_dynamic_shared, 0xff, L.shared_bytes);
    for (unsigned t = 0; t < L.nthreads; ++t) {
        L.threads[t] = ThreadSlot{State::kRunnable, 0, 0, 0, 0, 0, nullptr, 0, 0};
        fiber_reset(&L.fibers[t], &fiber_entry);
    }
    L.live = L.nthreads;
    L.at_barrier = 0;
    while (L.live > 0) {
        bool ran = false;
        for (unsigned k = 0; k < L.nthreads; ++k) {
            const unsigned tid = L.reverse_threads ? L.nthreads - 1 - k : k;
            if (L.threads[tid].state != State::kRunnable) continue;
            ran = true;
            resume(L, tid);
            if (L.failed) return;
        }
        if (!ran) {
            set_error(format("%s: deadlock: every live thread waits and no barrier can complete: "
                             "%s (a __syncthreads must be reached by every non-exited thread of "
                             "the block, a warp intrinsic by every lane its mask names)",
                             where(L).c_str(), describe_block(L).c_str()));
            return;
        }
    }
}

size_t stack_bytes() {
    static const size_t bytes = [] {
        size_t kb = 128;
        if (const char* s = getenv("LMI_EMU_STACK_KB")) {
            const long v = strtol(s, nullptr, 10);
            if (v >= 16) kb = (size_t)v;
        }
        return kb * 1024;
    }();
    return bytes;
}

// ---- Fault handler ---------------------------------------------------------------------------

// CUresult values of the faults a recoverable launch reports.
constexpr int kFaultIllegalAddress = 700;  // CUDA_ERROR_ILLEGAL_ADDRESS
constexpr int kFaultStack = 714;           // CUDA_ERROR_HARDWARE_STACK_ERROR
constexpr int kFaultMisaligned = 716;      // CUDA_ERROR_MISALIGNED_ADDRESS

struct sigaction g_old_segv, g_old_bus;

void write_str(const char* s) {
    size_t n = strlen(s);
    while (n > 0) {
        const ssize_t w = write(2, s, n);
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

void chain(int sig, siginfo_t* si, void* ctx) {
    struct sigaction& old = sig == SIGSEGV ? g_old_segv : g_old_bus;
    if (old.sa_flags & SA_SIGINFO) {
        old.sa_sigaction(sig, si, ctx);
    } else if (old.sa_handler == SIG_DFL || old.sa_handler == SIG_IGN) {
        signal(sig, SIG_DFL);  // the faulting instruction runs again and the default kills
    } else {
        old.sa_handler(sig);
    }
}

// Runs on the alternate signal stack. snprintf is not async-signal-safe in general, but the
// process is about to abort and glibc's is safe for these conversions in practice.
void on_fault(int sig, siginfo_t* si, void* ctx) {
    Launch* L = g_launch;
    if (!L || !pthread_equal(pthread_self(), g_launch_thread)) {
        chain(sig, si, ctx);
        return;
    }
    static char buf[4096];
    size_t n = 0;
    auto put = [&](const char* fmt, auto... args) {
        if (n < sizeof buf) n += (size_t)snprintf(buf + n, sizeof buf - n, fmt, args...);
    };
    const uintptr_t addr = (uintptr_t)si->si_addr;
    put("\nlmi-cuda-emu: %s in kernel `%s` (%s)\n", sig == SIGSEGV ? "SIGSEGV" : "SIGBUS",
        L->kernel->name, L->kernel->file);
    put("  block (%u,%u,%u) of grid (%u,%u,%u), block size (%u,%u,%u)\n", g_block_idx.x,
        g_block_idx.y, g_block_idx.z, L->grid.x, L->grid.y, L->grid.z, L->block.x, L->block.y,
        L->block.z);
    if (L->current == kNoThread) {
        put("  in the emulator's scheduler, between threads\n");
    } else {
        put("  thread %u = threadIdx (%u,%u,%u), warp %u lane %u\n", L->current, g_thread_idx.x,
            g_thread_idx.y, g_thread_idx.z, L->current / 32, L->current % 32);
    }
    put("  faulting address 0x%lx: ", (unsigned long)addr);
    const long stack_owner = g_stacks.guard_page_owner((void*)addr);
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    // The codes a GPU reports for the same faults (CUresult).
    int fault_code = kFaultIllegalAddress;
    if (sig == SIGSEGV && addr == 0 && si->si_code == SI_KERNEL) {
        fault_code = kFaultMisaligned;
        put("general protection fault: most likely a misaligned vector access (float4/uint4/"
            "int4/double2 need 16-byte alignment, float2/uint2 8) or a non-canonical pointer\n");
    } else if (addr < 65536) {
        put("a null pointer, or a small offset from one\n");
    } else if (g_dyn_end && addr >= (uintptr_t)g_dyn_end && addr < (uintptr_t)g_dyn_end + page) {
        put("past the end of the dynamic shared memory (the launch gave %u bytes)\n",
            L->shared_bytes);
    } else if (stack_owner >= 0) {
        fault_code = kFaultStack;
        put("stack overflow of thread %ld's fiber (stacks are %zu KiB: raise LMI_EMU_STACK_KB)\n",
            stack_owner, g_stacks.stack_bytes() / 1024);
    } else if (sig == SIGBUS) {
        fault_code = kFaultMisaligned;
        put("a misaligned or unbacked access\n");
    } else {
        put("outside every live allocation: past an allocation's end (each is followed by a "
            "guard page), freed memory, or a wrong pointer\n");
    }
    put("  kernel arguments:");
    for (size_t i = 0; i < L->kernel->sizes.size() && i < 24; ++i) {
        uint64_t v = 0;
        memcpy(&v, L->params[i], L->kernel->sizes[i] < 8 ? L->kernel->sizes[i] : 8);
        put(" [%zu] %s = 0x%llx", i, L->kernel->types[i].c_str(), (unsigned long long)v);
    }
    put("\n");
    if (L->recover) {
        memcpy(g_fault_report, buf, sizeof buf);
        g_fault_report[sizeof g_fault_report - 1] = 0;
        g_fault_code = fault_code;
        siglongjmp(*L->recover, 1);
    }
    write_str(buf);
#ifdef LMI_EMU_ASAN
    chain(sig, si, ctx);  // AddressSanitizer's report, with a stack trace
#endif
    abort();
}

void install_fault_handler() {
    static std::once_flag once;
    std::call_once(once, [] {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = &on_fault;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, &g_old_segv);
        sigaction(SIGBUS, &sa, &g_old_bus);
    });
    // The handler must run on an alternate stack: a fault may be a fiber's stack overflow.
    thread_local bool have_altstack = false;
    if (!have_altstack) {
        stack_t ss;
        if (sigaltstack(nullptr, &ss) == 0 && (ss.ss_flags & SS_DISABLE)) {
            const size_t size = 64 * 1024;
            void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                           -1, 0);
            if (p != MAP_FAILED) {
                ss.ss_sp = p;
                ss.ss_size = size;
                ss.ss_flags = 0;
                sigaltstack(&ss, nullptr);
            }
        }
        have_altstack = true;
    }
}

// ---- Launch ----------------------------------------------------------------------------------

int fail_launch(int code, const std::string& msg) {
    g_last_error = msg;
    return code;
}

bool ensure_dynamic_shared() {
    if (g_dyn_end) return true;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t cap = (kMaxDynamicShared + page - 1) / page * page;
    void* p = mmap(nullptr, cap + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    g_dyn_end = (char*)p + cap;
    mprotect(g_dyn_end, page, PROT_NONE);
    return true;
}

// Runs every block of `L`; with `L.recover` set, a fault lands back here through siglongjmp and
// the launch ends with the fault's code (the fibers it abandons are reset by the next launch).
int run_blocks(Launch& L, sigjmp_buf* recover) {
    if (recover) {
        if (sigsetjmp(*recover, 1) != 0) {
            g_launch = nullptr;
            return fail_launch(g_fault_code, g_fault_report);
        }
        L.recover = recover;
    }
    const uint64_t blocks = (uint64_t)L.grid.x * L.grid.y * L.grid.z;
    for (uint64_t b = 0; b < blocks && !L.failed; ++b) {
        const uint64_t lb = L.reverse_blocks ? blocks - 1 - b : b;
        run_block(L, uint3{(unsigned)(lb % L.grid.x), (unsigned)(lb / L.grid.x % L.grid.y),
                           (unsigned)(lb / ((uint64_t)L.grid.x * L.grid.y))});
    }
    g_launch = nullptr;
    fflush(stdout);  // device printf
    if (L.failed) return fail_launch(2, L.error);
    return 0;
}

int run_launch(size_t k, const uint32_t grid[3], const uint32_t block[3], uint32_t shared_bytes,
               bool reverse_threads, bool reverse_blocks, void** params, sigjmp_buf* recover) {
    const std::vector<Kernel>& ks = registry();
    if (k >= ks.size()) return fail_launch(1, format("no kernel with index %zu", k));
    const Kernel& kernel = ks[k];
    const auto bad = [&](const std::string& what) {
        return fail_launch(1, format("launch of `%s`: %s", kernel.name, what.c_str()));
    };
    const uint64_t nthreads = (uint64_t)block[0] * block[1] * block[2];
    if (block[0] == 0 || block[1] == 0 || block[2] == 0 || grid[0] == 0 || grid[1] == 0 ||
        grid[2] == 0)
        return bad(format("grid (%u,%u,%u) and block (%u,%u,%u) must be non-zero", grid[0],
                          grid[1], grid[2], block[0], block[1], block[2]));
    if (nthreads > kMaxThreads || block[0] > 1024 || block[1] > 1024 || block[2] > 64)
        return bad(format("block (%u,%u,%u) exceeds the limits (x, y <= 1024, z <= 64, "
                          "x*y*z <= 1024)",
                          block[0], block[1], block[2]));
    if (grid[0] > 0x7fffffffu || grid[1] > 65535 || grid[2] > 65535)
        return bad(format("grid (%u,%u,%u) exceeds the limits (x < 2^31, y, z <= 65535)", grid[0],
                          grid[1], grid[2]));
    if (shared_bytes > kMaxDynamicShared)
        return bad(format("%u bytes of dynamic shared memory exceed the %u a block can have",
                          shared_bytes, kMaxDynamicShared));
    if (!ensure_dynamic_shared()) return fail_launch(3, "mmap of the dynamic shared buffer failed");

    Launch L;
    L.kernel = &kernel;
    L.grid = dim3(grid[0], grid[1], grid[2]);
    L.block = dim3(block[0], block[1], block[2]);
    L.nthreads = (unsigned)nthreads;
    L.shared_bytes = shared_bytes;
    L.reverse_threads = reverse_threads;
    L.reverse_blocks = reverse_blocks;
    L.params = params;
    L.threads.resize(L.nthreads);
    L.fibers = g_stacks.fibers(L.nthreads, stack_bytes());
    if (!L.fibers) return fail_launch(3, "mmap of fiber stacks failed");

    g_grid_dim = L.grid;
    g_block_dim = L.block;
    g_dynamic_shared = g_dyn_end - ((shared_bytes + 15u) & ~15u);
    install_fault_handler();
    g_launch_thread = pthread_self();
    g_launch = &L;

    return run_blocks(L, recover);
}

std::string demangle(const char* mangled) {
    int status = 0;
    char* s = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
    std::string out = status == 0 && s ? s : mangled;
    free(s);
    return out;
}

}  // namespace

// ---- Entry points of the device-side header ---------------------------------------------------

int block_sync(BlockOp op, int pred, const char* file, int line) {
    Launch& L = launch();
    ThreadSlot& t = L.threads[L.current];
    if (L.at_barrier == 0) {
        L.barrier_op = op;
        L.barrier_file = file;
        L.barrier_line = line;
        L.barrier_acc = op == kSyncthreadsAnd ? 1 : 0;
    } else if (op != L.barrier_op || line != L.barrier_line || strcmp(file, L.barrier_file) != 0) {
        ThreadSlot probe{State::kAtBlockBarrier, (uint8_t)op, 0, 0, 0, 0, file, line, 0};
        fail_in_thread(format("%s: divergent barriers: %s reached %s while another barrier "
                              "gathers threads: %s (every non-exited thread of a block must "
                              "reach the same __syncthreads)",
                              where(L).c_str(), thread_name(L, L.current).c_str(),
                              wait_site(probe).c_str(), describe_block(L).c_str()));
    }
    t.state = State::kAtBlockBarrier;
    t.op = op;
    t.file = file;
    t.line = line;
    switch (op) {
        case kSyncthreadsCount: L.barrier_acc += pred; break;
        case kSyncthreadsAnd: L.barrier_acc &= pred; break;
        case kSyncthreadsOr: L.barrier_acc |= pred; break;
        default: break;
    }
    if (++L.at_barrier == L.live) complete_block_barrier(L);
    yield_to_scheduler();
    return L.barrier_result;
}

uint64_t warp_sync(WarpOp op, unsigned mask, uint64_t value, int lane_param, int width,
                   const char* file, int line) {
    Launch& L = launch();
    const unsigned tid = L.current, lane = tid & 31u, base = tid - lane;
    const unsigned lanes = L.nthreads - base < 32 ? L.nthreads - base : 32;
    const unsigned existing = lanes == 32 ? ~0u : (1u << lanes) - 1;
    // The call, as error messages name it (formatted only when one is raised).
    const auto here = [&] {
        ThreadSlot probe{State::kAtWarpBarrier, (uint8_t)op, mask, 0, value, 0, file, line, 0};
        return wait_site(probe);
    };
    if (!(mask >> lane & 1))
        fail_in_thread(format("%s: %s calls %s, whose mask does not name its own lane %u",
                              where(L).c_str(), thread_name(L, tid).c_str(), here().c_str(), lane));
    if (mask & ~existing)
        fail_in_thread(format("%s: %s calls %s, whose mask names lanes that do not exist (warp "
                              "%u has %u threads in a block of %u)",
                              where(L).c_str(), thread_name(L, tid).c_str(), here().c_str(),
                              base / 32, lanes, L.nthreads));
    for (unsigned j = 0; j < 32; ++j)
        if ((mask >> j & 1) && L.threads[base + j].state == State::kExited)
            fail_in_thread(format("%s: %s calls %s, whose mask names lane %u (%s), which has "
                                  "exited",
                                  where(L).c_str(), thread_name(L, tid).c_str(), here().c_str(), j,
                                  thread_name(L, base + j).c_str()));

    unsigned src = lane;
    if (op == kShflIdx || op == kShflUp || op == kShflDown || op == kShflXor) {
        if (width < 1 || width > 32 || (width & (width - 1)))
            fail_in_thread(format("%s: %s calls %s with width %d (must be a power of two up to "
                                  "32)",
                                  where(L).c_str(), thread_name(L, tid).c_str(), here().c_str(),
                                  width));
        const unsigned w = (unsigned)width, seg = lane & ~(w - 1), p = (unsigned)lane_param;
        switch (op) {
            case kShflIdx: src = seg + (p & (w - 1)); break;
            case kShflUp: src = lane - seg >= p ? lane - p : lane; break;
            case kShflDown: src = lane - seg + p < w ? lane + p : lane; break;
            default: {
                // Lanes of later groups of `width` give the caller's own value (CUDA's rule).
                const unsigned s = lane ^ (p & 31u);
                src = s < seg + w ? s : lane;
                break;
            }
        }
        if (!(mask >> src & 1)) src = lane;  // a source outside the mask: own value
    }

    ThreadSlot& t = L.threads[tid];
    t.state = State::kAtWarpBarrier;
    t.op = op;
    t.mask = mask;
    t.src = src;
    t.value = value;
    t.file = file;
    t.line = line;
    bool all = true;
    for (unsigned j = 0; j < 32 && all; ++j)
        if ((mask >> j & 1) && L.threads[base + j].state != State::kAtWarpBarrier) all = false;
    if (all) complete_warp(L, base, mask);
    yield_to_scheduler();
    return t.result;
}

void warp_collective(const Collective& c, const char* file, int line) {
    Launch& L = launch();
    const unsigned tid = L.current, lane = tid & 31u, base = tid - lane;
    const unsigned lanes = L.nthreads - base < 32 ? L.nthreads - base : 32;
    if (lanes < 32) {
        char args[256];
        c.describe(c.key, args, sizeof args);
        fail_in_thread(format("%s: %s calls %s(%s) [%s], but warp %u has only %u threads in a "
                              "block of %u (wmma operations take a full warp of 32)",
                              where(L).c_str(), thread_name(L, tid).c_str(), c.name, args,
                              site(file, line).c_str(), base / 32, lanes, L.nthreads));
    }
    warp_sync(kCollective, ~0u, reinterpret_cast<uint64_t>(&c), 0, 32, file, line);
}

// Lanes run one after another here, so a lane that already returned may have been converged
// with the caller on a GPU: it counts unless it exited before the caller's last barrier.
unsigned active_mask() {
    Launch& L = launch();
    const unsigned base = L.current & ~31u, epoch = L.threads[L.current].epoch;
    unsigned m = 0;
    for (unsigned j = 0; j < 32 && base + j < L.nthreads; ++j) {
        const ThreadSlot& t = L.threads[base + j];
        if (t.state != State::kExited || t.epoch >= epoch) m |= 1u << j;
    }
    return m;
}

void trap(const char* what, const char* file, int line) {
    Launch& L = launch();
    fail_in_thread(format("%s: %s: %s at %s", where(L).c_str(), thread_name(L, L.current).c_str(),
                          what, site(file, line).c_str()));
}

void register_kernel_raw(const char* name, const char* file, void (*fn)(), Invoker invoke,
                         size_t nparams, const size_t* sizes, const char* const* type_names) {
    Kernel k{name, file, fn, invoke, {}, {}};
    for (size_t i = 0; i < nparams; ++i) {
        k.sizes.push_back(sizes[i]);
        k.types.push_back(demangle(type_names[i]));
    }
    kernels().push_back(std::move(k));
}

}  // namespace lmi_emu

// ---- C API (src/ffi.rs) -------------------------------------------------------------------------

using lmi_emu::registry;

extern "C" {

size_t lmi_emu_kernel_count() { return registry().size(); }

const char* lmi_emu_kernel_name(size_t k) { return registry()[k].name; }

const char* lmi_emu_kernel_file(size_t k) { return registry()[k].file; }

size_t lmi_emu_kernel_param_count(size_t k) { return registry()[k].sizes.size(); }

size_t lmi_emu_kernel_param_size(size_t k, size_t p) { return registry()[k].sizes[p]; }

const char* lmi_emu_kernel_param_type(size_t k, size_t p) { return registry()[k].types[p].c_str(); }

// 0 on success; otherwise an error code (1: invalid launch, 2: the kernel failed, 3: out of
// memory) with lmi_emu_last_error() saying what happened.
int lmi_emu_launch(size_t kernel, const uint32_t grid[3], const uint32_t block[3],
                   uint32_t shared_bytes, int reverse_threads, int reverse_blocks, void** params) {
    std::lock_guard<std::mutex> lock(lmi_emu::g_launch_mutex);
    return lmi_emu::run_launch(kernel, grid, block, shared_bytes, reverse_threads != 0,
                               reverse_blocks != 0, params, nullptr);
}

// As lmi_emu_launch, but a fault in the kernel (a guard page, a misaligned vector access, a
// fiber stack overflow) ends the launch with the CUresult a GPU would report (700, 716, 714)
// and the fault report as the error, instead of aborting the process. For the fake driver.
int lmi_emu_launch_recoverable(size_t kernel, const uint32_t grid[3], const uint32_t block[3],
                               uint32_t shared_bytes, int reverse_threads, int reverse_blocks,
                               void** params) {
    std::lock_guard<std::mutex> lock(lmi_emu::g_launch_mutex);
    sigjmp_buf recover;
    return lmi_emu::run_launch(kernel, grid, block, shared_bytes, reverse_threads != 0,
                               reverse_blocks != 0, params, &recover);
}

// The index of the kernel named `name`, or -1.
long lmi_emu_kernel_index(const char* name) {
    const auto& ks = registry();
    for (size_t i = 0; i < ks.size(); ++i)
        if (strcmp(ks[i].name, name) == 0) return (long)i;
    return -1;
}

// The calling OS thread's last launch error.
const char* lmi_emu_last_error() { return lmi_emu::g_last_error.c_str(); }

}  // extern "C"
