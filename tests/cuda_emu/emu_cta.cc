// Launches on the kernel emulator (emu.h says what is emulated): the
// configuration a launch must have, running a grid CTA after CTA, and each
// CTA's shared memory, fresh and poisoned.

#include "emu_sched.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>

using namespace kvf_emu::sched;

namespace kvf_emu
{
namespace
{

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

cudaError_t set_max_dynamic_smem(const void *kernel, int bytes)
{
    if (bytes < 0 || (size_t)bytes > k_max_smem)
        return cudaErrorInvalidValue;
    g.max_dyn_smem[kernel] = bytes;
    return cudaSuccess;
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

// ---- shared memory -------------------------------------------------------------

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
