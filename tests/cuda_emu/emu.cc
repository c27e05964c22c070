// The emulator's scheduler (see emu.h for what it emulates and its limits).
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

#include "emu.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define KVF_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVF_EMU_ASAN 1
#endif
#endif
#ifdef KVF_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

namespace kvf_emu
{
namespace
{

// Per fiber. The kernels keep a few hundred bytes of locals; ASan's frames
// are larger. A guard page below each stack turns an overflow into SIGSEGV.
constexpr size_t k_stack_bytes = 128 * 1024;
constexpr unsigned k_max_threads = 1024;
constexpr size_t k_default_smem = 48 * 1024; // without the opt-in attribute
constexpr size_t k_max_smem = 227 * 1024;    // sm_90 opt-in limit per CTA
constexpr size_t k_canary_bytes = 64;        // after the dynamic shared memory
constexpr unsigned char k_canary = 0xa5;

enum class fiber_state : unsigned char {
    ready,      // runnable (or running)
    at_barrier, // in __syncthreads
    at_warp,    // in a warp operation
    done,
};

enum class warp_op : unsigned char { none, shfl, sync, collective };

// __builtin_setjmp's buffer: frame pointer, resume address, stack pointer
// and two words the target may use.
typedef void *jump_buf[5];

struct fiber {
    jump_buf resume;      // where a switched-out fiber continues
    ucontext_t entry;     // start on this fiber's stack (getcontext once per slot)
    unsigned char *stack; // k_stack_bytes, above a guard page
    uint3 idx;
    unsigned tid; // linear index in the CTA
    fiber_state state;
    bool started;
    bool abandoned;   // left mid-kernel by a fault: its frames were never unwound
    void *fake_stack; // ASan's fake stack of a switched-out fiber
};

struct warp {
    unsigned lanes;   // threads of the CTA in this warp: 32, fewer in a last partial warp
    unsigned arrived; // lanes in the current operation
    unsigned exited;
    unsigned gen; // operations completed; gen & 1 picks the exchange buffer
    warp_op op;   // of the current operation, which every lane must share
    unsigned mask;
    uint32_t xchg[2][32];
    void *args[32]; // warp_collective: each lane's argument
    void (*complete)(void *const *, unsigned);
};

struct main_context {
    jump_buf resume;
    void *fake_stack;
    const void *stack_bottom; // as ASan reported it on the first switch away
    size_t stack_size;
};

struct engine {
    std::vector<fiber *> slots; // reused by every CTA; slots[i] runs thread i
    main_context main;
    fiber *cur = nullptr;   // running fiber; nullptr on the host
    bool from_main = false; // the switch in progress left the host
    const std::function<void()> *body = nullptr;

    // The running CTA.
    unsigned n_threads = 0, live = 0, at_barrier = 0;
    std::vector<warp> warps;
    std::vector<uint64_t> ready; // bit i: slot i is runnable
    unsigned n_ready = 0;
    unsigned long long cta_serial = 0;
    unsigned char *dyn_smem = nullptr;
    size_t dyn_bytes = 0, static_bytes = 0;
    std::vector<void *> static_buffers;
    bool aborted = false;

    order run_order = order::forward;
    std::map<const void *, int> max_dyn_smem; // cudaFuncSetAttribute per kernel
    cudaError_t error = cudaSuccess;
    stats st = {};
    unsigned long long n_faults = 0;

    ~engine();
};

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

void fiber_entry();

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

void push_ready(unsigned slot)
{
    g.ready[slot / 64] |= 1ull << (slot % 64);
    g.n_ready++;
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

void fault(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void report_deadlock();

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

// Makes the fibers of slots [lo, hi) that waiting(f) picks runnable.
template <typename Pred> void release(unsigned lo, unsigned hi, Pred waiting)
{
    for (unsigned i = lo; i < hi; i++) {
        fiber *f = g.slots[i];
        if (waiting(f)) {
            f->state = fiber_state::ready;
            push_ready(i);
        }
    }
}

const char *state_name(fiber_state s)
{
    switch (s) {
    case fiber_state::ready:
        return "runnable";
    case fiber_state::at_barrier:
        return "at __syncthreads";
    case fiber_state::at_warp:
        return "in a warp operation";
    case fiber_state::done:
        return "exited";
    }
    return "?";
}

void print_where(const fiber *f)
{
    fprintf(stderr, "cuda emu: fault in CTA (%u,%u,%u)", blockIdx.x, blockIdx.y, blockIdx.z);
    if (f)
        fprintf(stderr, " thread (%u,%u,%u)", f->idx.x, f->idx.y, f->idx.z);
    fprintf(stderr, ": ");
}

// The rest of a fault's line (after where it happened), counted; err
// becomes the last error.
void count_fault(cudaError_t err, const char *fmt, va_list ap)
{
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    g.n_faults++;
    g.error = err;
}

// A kernel error: printed, the launch stops. From a fiber, switches to the
// host for good.
void fault(const char *fmt, ...)
{
    print_where(g.cur);
    va_list ap;
    va_start(ap, fmt);
    count_fault(cudaErrorLaunchFailure, fmt, ap);
    va_end(ap);
    g.aborted = true;
    if (g.cur)
        switch_to(g.cur, nullptr, true);
}

void report_deadlock()
{
    print_where(nullptr);
    fprintf(stderr, "deadlock: %u threads live, none can run:", g.live);
    // Runs of threads in one state, e.g. "0-95 at __syncthreads".
    unsigned i = 0;
    while (i < g.n_threads) {
        unsigned j = i;
        while (j + 1 < g.n_threads && g.slots[j + 1]->state == g.slots[i]->state)
            j++;
        fprintf(stderr, " %u-%u %s;", i, j, state_name(g.slots[i]->state));
        i = j + 1;
    }
    fputc('\n', stderr);
    g.n_faults++;
    g.aborted = true;
    g.error = cudaErrorLaunchFailure;
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

// ---- one CTA -----------------------------------------------------------------

void run_cta(dim3 block)
{
    g.cta_serial++;
    g.st.ctas++;
    const unsigned n = g.n_threads;
    g.live = n;
    g.at_barrier = 0;
    g.aborted = false;
    std::fill(g.ready.begin(), g.ready.end(), 0);
    g.n_ready = 0;
    for (unsigned w = 0; w < g.warps.size(); w++) {
        warp &wp = g.warps[w];
        memset(&wp, 0, sizeof(wp));
        wp.lanes = w + 1 < g.warps.size() || n % 32 == 0 ? 32 : n % 32;
    }
    // Fresh shared memory: 0xff bytes, then the canary.
    memset(g.dyn_smem, 0xff, g.dyn_bytes);
    memset(g.dyn_smem + g.dyn_bytes, k_canary, k_canary_bytes);
#ifdef KVF_EMU_ASAN
    ASAN_POISON_MEMORY_REGION(g.dyn_smem + g.dyn_bytes, k_canary_bytes);
#endif
    g.static_bytes = 0;

    for (unsigned i = 0; i < n; i++) {
        fiber *f = g.slots[i];
        f->tid = i;
        f->idx = uint3{i % block.x, i / block.x % block.y, i / (block.x * block.y)};
        f->state = fiber_state::ready;
        f->started = false;
        f->fake_stack = nullptr;
#ifdef KVF_EMU_ASAN
        // A fiber abandoned mid-kernel leaves poisoned frames behind (one
        // that exits clears its own, see switch_to).
        if (f->abandoned)
            ASAN_UNPOISON_MEMORY_REGION(f->stack, k_stack_bytes);
#endif
        f->abandoned = false;
        f->entry.uc_stack.ss_sp = f->stack;
        f->entry.uc_stack.ss_size = k_stack_bytes;
        f->entry.uc_link = nullptr;
        makecontext(&f->entry, fiber_entry, 0);
    }
    for (unsigned i = 0; i < n; i++)
        push_ready(i);

    unsigned first = pop_ready();
    switch_to(nullptr, g.slots[first], false);
    // Back on the host: every thread exited, or the CTA stopped.
    g.cur = nullptr;
    for (unsigned i = 0; i < n; i++)
        if (g.slots[i]->started && g.slots[i]->state != fiber_state::done)
            g.slots[i]->abandoned = true;

#ifdef KVF_EMU_ASAN
    ASAN_UNPOISON_MEMORY_REGION(g.dyn_smem + g.dyn_bytes, k_canary_bytes);
#endif
    for (size_t i = 0; i < k_canary_bytes; i++)
        if (g.dyn_smem[g.dyn_bytes + i] != k_canary) {
            fault("wrote past the %zu bytes of dynamic shared memory (byte %zu)", g.dyn_bytes,
                  g.dyn_bytes + i);
            break;
        }
    if (g.static_bytes > k_default_smem || g.static_bytes + g.dyn_bytes > k_max_smem)
        fault("%zu bytes of static and %zu of dynamic shared memory: more than a CTA gets",
              g.static_bytes, g.dyn_bytes);
    for (void *p : g.static_buffers)
        free(p);
    g.static_buffers.clear();
}

const char *check_config(const void *kernel, dim3 grid, dim3 block, size_t smem)
{
    unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (!block.x || !block.y || !block.z || threads > k_max_threads || block.x > 1024 ||
        block.y > 1024 || block.z > 64)
        return "block shape";
    if (!grid.x || !grid.y || !grid.z || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535)
        return "grid shape";
    auto it = g.max_dyn_smem.find(kernel);
    size_t allowed = it != g.max_dyn_smem.end() && (size_t)it->second > k_default_smem
                         ? (size_t)it->second
                         : k_default_smem;
    if (smem > allowed)
        return "dynamic shared memory (over 48 KiB needs cudaFuncSetAttribute)";
    return nullptr;
}

} // namespace

// ---- API -------------------------------------------------------------------

void set_order(order o)
{
    g.run_order = o;
}

stats get_stats()
{
    return g.st;
}

unsigned long long faults()
{
    return g.n_faults;
}

cudaError_t last_error(bool clear)
{
    cudaError_t e = g.error;
    if (clear)
        g.error = cudaSuccess;
    return e;
}

cudaError_t set_max_dynamic_smem(const void *kernel, int bytes)
{
    if (bytes < 0 || (size_t)bytes > k_max_smem)
        return cudaErrorInvalidValue;
    g.max_dyn_smem[kernel] = bytes;
    return cudaSuccess;
}

void set_last_error(cudaError_t err)
{
    g.error = err;
}

void host_fault(cudaError_t err, const char *fmt, ...)
{
    fprintf(stderr, "cuda emu: fault: ");
    va_list ap;
    va_start(ap, fmt);
    count_fault(err, fmt, ap);
    va_end(ap);
}

bool admit(const void *kernel, dim3 grid, dim3 block, size_t smem)
{
    g.st.launches++;
    if (g.cur) {
        fprintf(stderr, "cuda emu: a kernel launched a kernel (not emulated)\n");
        abort();
    }
    if (const char *bad = check_config(kernel, grid, block, smem)) {
        fprintf(stderr,
                "cuda emu: launch refused: %s (grid %u,%u,%u, block %u,%u,%u, %zu bytes of "
                "dynamic shared memory)\n",
                bad, grid.x, grid.y, grid.z, block.x, block.y, block.z, smem);
        g.error = cudaErrorInvalidConfiguration;
        if (strncmp(bad, "dynamic", 7) == 0)
            g.error = cudaErrorInvalidValue;
        return false;
    }
    if (smem > g.st.max_dynamic_smem)
        g.st.max_dynamic_smem = smem;
    return true;
}

void run(const void *kernel, dim3 grid, dim3 block, size_t smem, const std::function<void()> &body)
{
    if (admit(kernel, grid, block, smem))
        execute(kernel, grid, block, smem, body);
}

void execute(const void *kernel, dim3 grid, dim3 block, size_t smem,
             const std::function<void()> &body)
{
    (void)kernel;
    if (g.cur) {
        fprintf(stderr, "cuda emu: a kernel launched a kernel (not emulated)\n");
        abort();
    }
    g.st.grids++;
    const unsigned n = block.x * block.y * block.z;
    while (g.slots.size() < n)
        g.slots.push_back(slot_create());
    g.n_threads = n;
    g.warps.assign((n + 31) / 32, warp{});
    g.ready.assign((n + 63) / 64, 0);
    g.body = &body;
    g.dyn_bytes = smem;
    g.dyn_smem = (unsigned char *)aligned_alloc(256, (smem + k_canary_bytes + 255) & ~(size_t)255);
    if (!g.dyn_smem)
        die("out of memory for shared memory");
    blockDim = block;
    gridDim = grid;
    for (unsigned z = 0; z < grid.z && !g.aborted; z++)
        for (unsigned y = 0; y < grid.y && !g.aborted; y++)
            for (unsigned x = 0; x < grid.x && !g.aborted; x++) {
                blockIdx = uint3{x, y, z};
                run_cta(block);
            }
    g.aborted = false;
    free(g.dyn_smem);
    g.dyn_smem = nullptr;
    g.body = nullptr;
}

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

void *dynamic_smem()
{
    running("extern __shared__");
    return g.dyn_smem;
}

void *static_smem(shared_slot *slot, size_t bytes, size_t align)
{
    running("__shared__");
    if (slot->cta != g.cta_serial) {
        size_t a = align < sizeof(void *) ? sizeof(void *) : align;
        void *p = aligned_alloc(a, (bytes + a - 1) / a * a);
        if (!p)
            die("out of memory for shared memory");
        memset(p, 0xff, bytes);
        g.static_buffers.push_back(p);
        g.static_bytes += bytes;
        slot->cta = g.cta_serial;
        slot->buffer = p;
    }
    return slot->buffer;
}

} // namespace kvf_emu

// ---- runtime API -------------------------------------------------------------

// Name and text of each error the emulator gives, as the runtime spells
// them.
static const struct {
    cudaError_t err;
    const char *name, *text;
} k_errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
     "invalid configuration argument"},
    {cudaErrorInvalidPitchValue, "cudaErrorInvalidPitchValue", "invalid pitch argument"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorIllegalState, "cudaErrorIllegalState",
     "the operation cannot be performed in the present state"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress",
     "an illegal memory access was encountered (emulator fault, see above)"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure",
     "unspecified launch failure (emulator fault, see above)"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureUnmatched, "cudaErrorStreamCaptureUnmatched",
     "capture was not initiated in this stream"},
    {cudaErrorStreamCaptureUnjoined, "cudaErrorStreamCaptureUnjoined",
     "capturing stream has unjoined work"},
    {cudaErrorStreamCaptureIsolation, "cudaErrorStreamCaptureIsolation",
     "dependency created on uncaptured work in another stream"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorCapturedEvent, "cudaErrorCapturedEvent",
     "operation not permitted on an event last recorded in a capturing stream"},
    {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread",
     "attempt to terminate a thread-local capture sequence from another thread"},
};

const char *cudaGetErrorName(cudaError_t err)
{
    for (const auto &e : k_errors)
        if (e.err == err)
            return e.name;
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t err)
{
    for (const auto &e : k_errors)
        if (e.err == err)
            return e.text;
    return "unknown error";
}
