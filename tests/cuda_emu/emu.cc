// The kernel emulator's scheduler (see emu.h for what it emulates and its
// limits): the fibers, how they switch, and the sync points where they do.
//
// One fiber per CUDA thread of the running CTA, all on the calling OS
// thread. A fiber starts on its own stack with makecontext/setcontext and
// switches with __builtin_setjmp/__builtin_longjmp: a few instructions, no
// system call (swapcontext makes one to save the signal mask) and nothing
// for ASan to intercept (its _longjmp interceptor makes one too, and clears
// the shadow of the stack it leaves). The kernels switch at every warp
// shuffle, tens of millions of times per test run.
//
// A fiber gives up the CPU only at a sync point or at its end. The next to
// run is the runnable fiber with the lowest thread index (order::forward)
// or the highest (order::reverse). So a warp runs as far as it can (its
// shuffles need only its own lanes) before the next one starts: in the two
// orders the warps of a CTA reach the code between two barriers first to
// last and last to first, and within a warp the lanes likewise, which is
// what makes an unsynchronized pair of accesses show as a difference.
//
// Under AddressSanitizer every switch is announced with the fiber API
// (__sanitizer_start/finish_switch_fiber), so ASan checks each fiber's
// stack accesses against that fiber's stack.
//
// The rest of the kernel emulator, by concept:
//
//   emu_cta.cc     launches: the configuration checks, grids and CTAs, shared
//                  memory
//   emu_fault.cc   faults and the error state, the runtime's error names
//
// emu_sched.h holds what they share.

#include "emu_sched.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

using namespace kvf_emu::sched;

namespace kvf_emu
{
namespace sched
{

engine g;

// ---- fibers ----------------------------------------------------------------

void die(const char *what)
{
    fprintf(stderr, "cuda emu: %s\n", what);
    abort();
}

fiber *slot_create()
{
    long page = sysconf(_SC_PAGESIZE);
    size_t bytes = k_stack_bytes + (size_t)page;
    void *mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED)
        die("cannot map a fiber stack");
    if (mprotect(mem, (size_t)page, PROT_NONE) != 0)
        die("cannot protect a fiber stack's guard page");
    fiber *f = new fiber();
    f->stack = (unsigned char *)mem + page;
    if (getcontext(&f->entry) != 0)
        die("getcontext failed");
    return f;
}

engine::~engine()
{
    long page = sysconf(_SC_PAGESIZE);
    for (fiber *f : slots) {
        munmap(f->stack - page, k_stack_bytes + (size_t)page);
        delete f;
    }
}

namespace
{

#ifdef KVF_EMU_ASAN
void asan_leave(void **fake_stack_save, const fiber *to)
{
    if (to)
        __sanitizer_start_switch_fiber(fake_stack_save, to->stack, k_stack_bytes);
    else
        __sanitizer_start_switch_fiber(fake_stack_save, g.main.stack_bottom, g.main.stack_size);
}

void asan_arrive(void *fake_stack)
{
    const void *bottom;
    size_t size;
    __sanitizer_finish_switch_fiber(fake_stack, &bottom, &size);
    if (g.from_main) {
        g.main.stack_bottom = bottom;
        g.main.stack_size = size;
    }
}
#else
void asan_leave(void **, const fiber *)
{
}
void asan_arrive(void *)
{
}
#endif

// GCC and Clang want __builtin_longjmp outside the function that calls
// __builtin_setjmp. ASan must not see a call that does not return: it would
// precede it with __asan_handle_no_return, a system call and a shadow clear
// of the stack being left, whose frames are live and must stay poisoned. So
// the jump is not instrumented, and is called through a volatile pointer so
// that the compiler cannot find out it never returns.
__attribute__((noinline, no_sanitize_address)) void jump_impl(jump_buf *to)
{
    __builtin_longjmp(*to, 1);
}
void (*volatile jump)(jump_buf *) = jump_impl;

} // namespace

// Switches from the running fiber (from; nullptr: the host) to another
// fiber (to; nullptr: the host). A dying fiber passes dying: nothing of it
// is saved, it never resumes.
__attribute__((noinline)) void switch_to(fiber *from, fiber *to, bool dying)
{
    g.st.switches++;
    void **fake_save = nullptr;
    if (!dying) {
        jump_buf *resume = from ? &from->resume : &g.main.resume;
        if (__builtin_setjmp(*resume)) {
            asan_arrive(from ? from->fake_stack : g.main.fake_stack);
            return;
        }
        fake_save = from ? &from->fake_stack : &g.main.fake_stack;
    } else if (from) {
#ifdef KVF_EMU_ASAN
        // The frames from here up were never unwound: clear their redzones
        // for the slot's next fiber.
        char here;
        unsigned char *lo = (unsigned char *)((uintptr_t)&here & ~(uintptr_t)63) - 4096;
        if (lo < from->stack)
            lo = from->stack;
        ASAN_UNPOISON_MEMORY_REGION(lo, (size_t)(from->stack + k_stack_bytes - lo));
#endif
    }
    g.from_main = from == nullptr;
    g.cur = to;
    asan_leave(fake_save, to);
    if (!to)
        jump(&g.main.resume);
    threadIdx = to->idx;
    if (!to->started) {
        to->started = true;
        setcontext(&to->entry);
        die("setcontext failed");
    }
    jump(&to->resume);
}

// The runnable slot that goes next: the lowest index (forward) or the
// highest (reverse). Some ready.
unsigned pop_ready()
{
    unsigned w, bit;
    if (g.run_order == order::forward) {
        for (w = 0; !g.ready[w]; w++) {
        }
        bit = (unsigned)__builtin_ctzll(g.ready[w]);
    } else {
        for (w = (unsigned)g.ready.size() - 1; !g.ready[w]; w--) {
        }
        bit = 63u - (unsigned)__builtin_clzll(g.ready[w]);
    }
    g.ready[w] &= ~(1ull << bit);
    g.n_ready--;
    return w * 64 + bit;
}

namespace
{

// Gives the CPU to the next runnable fiber; returns when f runs again
// (never when it is dying). No runnable fiber ends the CTA: all exited, or
// a deadlock.
void yield(fiber *f, bool dying)
{
    if (g.n_ready == 0) {
        // f is abandoned either way: it exited, or it waits for ever.
        if (!dying)
            report_deadlock();
        switch_to(f, nullptr, true);
        return;
    }
    unsigned next = pop_ready();
    if (g.slots[next] == f && !dying) {
        threadIdx = f->idx; // runs on without a switch
        return;
    }
    switch_to(f, g.slots[next], dying);
}

void thread_exit()
{
    fiber *f = g.cur;
    f->state = fiber_state::done;
    g.live--;
    warp &w = g.warps[f->tid / 32];
    w.exited++;
    if (w.arrived > 0)
        fault("exited while %u lanes of its warp wait in a warp operation with it in the mask",
              w.arrived);
    // An exited thread no longer counts at barriers: the others may be done.
    if (g.at_barrier > 0 && g.at_barrier == g.live) {
        g.at_barrier = 0;
        release(0, g.n_threads, [](const fiber *x) { return x->state == fiber_state::at_barrier; });
    }
    yield(f, true);
}

} // namespace

void fiber_entry()
{
    asan_arrive(nullptr);
    (*g.body)();
    thread_exit();
}

fiber *running(const char *what)
{
    if (!g.cur) {
        fprintf(stderr, "cuda emu: %s outside a kernel\n", what);
        abort();
    }
    return g.cur;
}

} // namespace sched

// ---- sync points -------------------------------------------------------------

void sync_block()
{
    fiber *f = running("__syncthreads");
    f->state = fiber_state::at_barrier;
    if (++g.at_barrier == g.live) {
        g.at_barrier = 0;
        release(0, g.n_threads, [](const fiber *x) { return x->state == fiber_state::at_barrier; });
    }
    yield(f, false);
}

// A warp operation: waits for every lane of f's warp, then returns what
// lane src of the warp passed (src >= 32: f's own value, as shfl.bfly does
// for a source lane out of range). A collective one runs complete() with
// every lane's arg when the last lane arrives.
static uint32_t warp_exchange(fiber *f, warp_op op, unsigned mask, uint32_t value, unsigned src,
                              void *arg = nullptr,
                              void (*complete)(void *const *, unsigned) = nullptr)
{
    warp &w = g.warps[f->tid / 32];
    const unsigned lane = f->tid % 32;
    const unsigned full = w.lanes == 32 ? 0xffffffffu : (1u << w.lanes) - 1u;
    if (mask != full)
        fault("warp operation with mask %#x: only the whole warp (%#x) is emulated", mask, full);
    if (w.exited > 0)
        fault("warp operation with mask %#x after %u of its lanes exited", mask, w.exited);
    if (w.arrived == 0) {
        w.op = op;
        w.mask = mask;
        w.complete = complete;
    } else if (w.op != op || w.mask != mask || w.complete != complete) {
        fault("lanes of one warp in different warp operations (or masks %#x, %#x)", w.mask, mask);
    }
    const unsigned buf = w.gen & 1u;
    w.xchg[buf][lane] = value;
    w.args[lane] = arg;
    f->state = fiber_state::at_warp;
    if (++w.arrived == w.lanes) {
        if (complete)
            complete(w.args, w.lanes);
        w.arrived = 0;
        w.gen++;
        const unsigned base = f->tid / 32 * 32;
        release(base, base + w.lanes,
                [](const fiber *x) { return x->state == fiber_state::at_warp; });
    }
    yield(f, false);
    return src < 32 ? w.xchg[buf][src] : value;
}

void sync_warp(unsigned mask)
{
    warp_exchange(running("__syncwarp"), warp_op::sync, mask, 0, 32);
}

uint32_t shfl_xor(unsigned mask, uint32_t bits, int lane_mask, int width)
{
    fiber *f = running("__shfl_xor_sync");
    if (width != 32)
        fault("__shfl_xor_sync with width %d: only 32 is emulated", width);
    return warp_exchange(f, warp_op::shfl, mask, bits, (f->tid % 32) ^ (unsigned)lane_mask);
}

void warp_collective(unsigned mask, void *arg, void (*complete)(void *const *args, unsigned lanes))
{
    warp_exchange(running("a warp matrix operation"), warp_op::collective, mask, 0, 32, arg,
                  complete);
}

} // namespace kvf_emu
