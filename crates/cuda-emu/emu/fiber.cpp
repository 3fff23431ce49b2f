// Fiber stacks and context switches (see fiber.h).
#include "fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#ifdef LMI_EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

namespace lmi_emu {

namespace {

size_t page_size() {
    static const size_t p = (size_t)sysconf(_SC_PAGESIZE);
    return p;
}

#ifdef LMI_EMU_ASAN
// The scheduler's stack, learnt when the first fiber starts (ASan needs the bounds of the stack
// it switches to).
const void* g_sched_stack_lo = nullptr;
size_t g_sched_stack_size = 0;
#endif

}  // namespace

#ifndef LMI_EMU_UCONTEXT
// lmi_emu_ctx_switch(void** save_sp, void* new_sp): pushes the callee-saved registers and the
// FP control state on the current stack, saves the stack pointer, loads the other one and pops
// the same frame from it. A new fiber's stack is given a frame whose return address is
// lmi_emu_ctx_start, which calls the entry function held in r12.
extern "C" void lmi_emu_ctx_switch(void** save_sp, void* new_sp);
extern "C" void lmi_emu_ctx_start();
asm(R"(
    .text
    .globl lmi_emu_ctx_switch
    .type lmi_emu_ctx_switch, @function
    .p2align 4
lmi_emu_ctx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size lmi_emu_ctx_switch, .-lmi_emu_ctx_switch

    .globl lmi_emu_ctx_start
    .type lmi_emu_ctx_start, @function
    .p2align 4
lmi_emu_ctx_start:
    xorl %ebp, %ebp
    callq *%r12
    ud2
    .size lmi_emu_ctx_start, .-lmi_emu_ctx_start
)");

void fiber_reset(Fiber* f, void (*entry)()) {
    // Frame popped by lmi_emu_ctx_switch, lowest address first: MXCSR + x87 control word,
    // r15, r14, r13, r12 (= entry), rbx, rbp, return address (= lmi_emu_ctx_start). After the
    // `ret` the stack pointer is the 16-byte aligned top, as a `call` from lmi_emu_ctx_start
    // expects.
    uintptr_t top = ((uintptr_t)(f->stack_lo + f->stack_size)) & ~(uintptr_t)15;
    uint64_t* frame = (uint64_t*)(top - 64);
    const uint32_t mxcsr = 0x1f80;  // round to nearest, no flush-to-zero, exceptions masked
    const uint16_t fpucw = 0x037f;  // x87 default: extended precision, exceptions masked
    frame[0] = (uint64_t)mxcsr | ((uint64_t)fpucw << 32);
    frame[1] = 0;                  // r15
    frame[2] = 0;                  // r14
    frame[3] = 0;                  // r13
    frame[4] = (uint64_t)entry;    // r12
    frame[5] = 0;                  // rbx
    frame[6] = 0;                  // rbp
    frame[7] = (uint64_t)&lmi_emu_ctx_start;
    f->sp = frame;
}

void fiber_switch(Fiber* from, Fiber* to, bool /*from_exits*/) { lmi_emu_ctx_switch(&from->sp, to->sp); }

void fiber_started() {}

#else  // LMI_EMU_UCONTEXT

void fiber_reset(Fiber* f, void (*entry)()) {
    if (getcontext(&f->uc) != 0) {
        perror("lmi-cuda-emu: getcontext");
        abort();
    }
    f->uc.uc_stack.ss_sp = f->stack_lo;
    f->uc.uc_stack.ss_size = f->stack_size;
    f->uc.uc_link = nullptr;
    makecontext(&f->uc, entry, 0);
}

void fiber_switch(Fiber* from, Fiber* to, bool from_exits) {
#ifdef LMI_EMU_ASAN
    const void* lo = to->stack_size ? to->stack_lo : g_sched_stack_lo;
    size_t size = to->stack_size ? to->stack_size : g_sched_stack_size;
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(from_exits ? nullptr : &fake, lo, size);
    swapcontext(&from->uc, &to->uc);
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
    (void)from_exits;
    swapcontext(&from->uc, &to->uc);
#endif
}

void fiber_started() {
#ifdef LMI_EMU_ASAN
    // The first switch into a fiber comes from the scheduler: learn its stack's bounds.
    const void* lo = nullptr;
    size_t size = 0;
    __sanitizer_finish_switch_fiber(nullptr, &lo, &size);
    if (lo) {
        g_sched_stack_lo = lo;
        g_sched_stack_size = size;
    }
#endif
}

#endif  // LMI_EMU_UCONTEXT

Fiber* StackPool::fibers(size_t n, size_t bytes) {
    const size_t page = page_size();
    bytes = (bytes + page - 1) / page * page;
    if (bytes != stack_bytes_) {
        for (Fiber& f : fibers_) munmap(f.stack_lo - page, f.stack_size + page);
        fibers_.clear();
        stack_bytes_ = bytes;
    }
    while (fibers_.size() < n) {
        // MAP_NORESERVE: 1024 fibers reserve 128 MiB of address space, but only the pages a
        // kernel's threads actually touch become memory.
        void* p = mmap(nullptr, bytes + page, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) return nullptr;
        mprotect(p, page, PROT_NONE);  // guard page: a stack overflow faults
        Fiber f;
        f.stack_lo = (char*)p + page;
        f.stack_size = bytes;
        fibers_.push_back(f);
    }
    return fibers_.data();
}

long StackPool::guard_page_owner(const void* addr) const {
    const size_t page = page_size();
    const char* a = (const char*)addr;
    for (size_t i = 0; i < fibers_.size(); ++i) {
        const char* lo = fibers_[i].stack_lo;
        if (a >= lo - page && a < lo) return (long)i;
    }
    return -1;
}

}  // namespace lmi_emu
