// What the files of the kernel emulator share (emu.cc lists them): the
// fibers, warps and CTA state of the scheduler, and the calls between its
// parts. Not for code run on the emulator: that sees emu.h only.
#ifndef KVF_CUDA_EMU_SCHED_H
#define KVF_CUDA_EMU_SCHED_H

// The C++ library first: emu.h defines __noinline__, which its headers use.
#include <functional>
#include <map>
#include <vector>

#include <stdint.h>
#include <ucontext.h>

#include "emu.h"

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

namespace kvf_emu
{
namespace sched
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

// The one engine (emu.cc).
extern engine g;

// ---- fibers and switching (emu.cc) --------------------------------------------

// Prints what went wrong and aborts: the emulator cannot go on.
void die(const char *what);
// A fiber slot: a stack of k_stack_bytes above a guard page.
fiber *slot_create();
// Where every fiber starts: runs the kernel body, then exits the thread.
void fiber_entry();
// The running fiber; outside a kernel, says that what is called there and
// aborts.
fiber *running(const char *what);
// Switches from the running fiber (from; nullptr: the host) to another
// fiber (to; nullptr: the host). A dying fiber passes dying: nothing of it
// is saved, it never resumes.
void switch_to(fiber *from, fiber *to, bool dying);

inline void push_ready(unsigned slot)
{
    g.ready[slot / 64] |= 1ull << (slot % 64);
    g.n_ready++;
}

// The runnable slot that goes next: the lowest index (forward) or the
// highest (reverse). Some ready.
unsigned pop_ready();

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

// ---- faults (emu_fault.cc) --------------------------------------------------------

// A kernel error: printed, the launch stops. From a fiber, switches to the
// host for good.
void fault(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// No runnable thread while some live: printed and counted, the launch
// stops.
void report_deadlock();

} // namespace sched
} // namespace kvf_emu

#endif
