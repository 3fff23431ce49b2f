// Fibers: one per CUDA thread of the running block, plus the scheduler's (the launching OS
// thread's own stack). On x86-64 a hand-written switch saves only the callee-saved registers,
// MXCSR and the x87 control word (a few ns); elsewhere, and in the AddressSanitizer build,
// ucontext is used (a system call per switch, but portable and understood by ASan).
#pragma once

#include <cstddef>
#include <vector>

#if !defined(__x86_64__) || defined(LMI_EMU_ASAN)
#define LMI_EMU_UCONTEXT 1
#include <ucontext.h>
#endif

namespace lmi_emu {

struct Fiber {
#ifdef LMI_EMU_UCONTEXT
    ucontext_t uc;
#else
    void* sp = nullptr;  // saved stack pointer while switched out
#endif
    char* stack_lo = nullptr;  // lowest usable byte (the guard page is just below)
    size_t stack_size = 0;     // usable bytes, 0 for the scheduler's fiber
};

// Prepares `f` (which owns a stack) to start `entry` at its next switch-in. `entry` must never
// return: it ends by switching away for good.
void fiber_reset(Fiber* f, void (*entry)());
// Saves the current context into `from` and resumes `to`. `from_exits` tells the sanitizer that
// `from` will never be resumed.
void fiber_switch(Fiber* from, Fiber* to, bool from_exits = false);
// To call first thing in a fiber's entry function (sanitizer bookkeeping).
void fiber_started();

// Stacks with a guard page below each, kept across launches.
class StackPool {
   public:
    // Gives `n` fibers with stacks of at least `bytes` (rounded to pages).
    Fiber* fibers(size_t n, size_t bytes);
    // The fiber whose guard page contains `addr`, or -1 (for the fault handler: no locking).
    long guard_page_owner(const void* addr) const;
    size_t stack_bytes() const { return stack_bytes_; }

   private:
    std::vector<Fiber> fibers_;
    size_t stack_bytes_ = 0;
};

}  // namespace lmi_emu
