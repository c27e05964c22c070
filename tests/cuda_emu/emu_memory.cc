// Device and pinned memory of the emulated runtime (emu_runtime.h says
// what is emulated): allocation, the checks every copy, kernel argument and
// GEMM makes, and the SIGSEGV that a host access to device memory becomes.
//
// Device memory: one private mapping per allocation, guard page, data
// pages, guard page, the allocation ending where the data pages end
// (rounded up to 256 bytes: cudaMalloc's alignment), so a run past its end
// reaches the guard page at once. The data pages are PROT_NONE while the
// host runs and opened only while device work runs (device_scope), which is
// what makes a host dereference of a device pointer crash here as it would
// on a GPU. Opening and closing costs two mprotect calls per allocation per
// unit of work: a few dozen allocations, thousands of units per test.

#include "emu_runtime_internal.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

using namespace kvf_emu::detail;

namespace kvf_emu
{
namespace detail
{

void protect_device(int prot)
{
    for (auto &a : rt().allocs)
        if (a.second.device && mprotect(a.second.data, a.second.data_bytes, prot) != 0) {
            perror("cuda emu: mprotect");
            abort();
        }
}

// The allocation p points into ([start, start + bytes]; the end too, for
// empty ranges), or nullptr.
const allocation *find(const void *p, uintptr_t *start_p)
{
    auto &allocs = rt().allocs;
    uintptr_t u = (uintptr_t)p;
    auto it = allocs.upper_bound(u);
    if (it == allocs.begin())
        return nullptr;
    --it;
    if (u > it->first + it->second.bytes)
        return nullptr;
    if (start_p)
        *start_p = it->first;
    return &it->second;
}

namespace
{

// Whether p is in device memory that was freed (kept reserved, closed).
bool in_freed(const void *p)
{
    for (auto &f : rt().freed)
        if ((uintptr_t)p >= f.first && (uintptr_t)p < f.first + f.second)
            return true;
    return false;
}

// SIGSEGV: says which device memory the address is in, then lets the
// previous handler (ASan's, or the default) report the crash.
void on_segv(int sig, siginfo_t *info, void *uctx)
{
    runtime &r = rt();
    uintptr_t a = (uintptr_t)info->si_addr;
    const char *what = nullptr;
    for (auto &kv : r.allocs) {
        const allocation &al = kv.second;
        if (!al.device || a < (uintptr_t)al.map || a >= (uintptr_t)al.map + al.map_bytes)
            continue;
        if (a < (uintptr_t)al.data || a >= (uintptr_t)al.data + al.data_bytes)
            what = "a guard page of a device allocation (a run past its start or end)";
        else if (r.scope_depth == 0)
            what = "device memory, touched by host code (on a GPU: a crash)";
        else
            what = "the slack of a device allocation";
    }
    if (in_freed(info->si_addr))
        what = "freed device memory (cudaFree'd: a use after free)";
    if (what) {
        char msg[256];
        int n = snprintf(msg, sizeof msg, "cuda emu: SIGSEGV at %p: %s\n", info->si_addr, what);
        if (n > 0 && write(2, msg, (size_t)n) < 0) {
        }
    }
    if (r.prev_segv.sa_flags & SA_SIGINFO) {
        r.prev_segv.sa_sigaction(sig, info, uctx);
    } else {
        sigaction(SIGSEGV, &r.prev_segv, nullptr);
        // Returning re-runs the access, which faults into that handler.
    }
}

// (Again at each allocation: a test harness, cmocka, puts back the
// handler it found when a test ends.)
void install_segv()
{
    runtime &r = rt();
    struct sigaction cur;
    if (sigaction(SIGSEGV, nullptr, &cur) == 0 && (cur.sa_flags & SA_SIGINFO) &&
        cur.sa_sigaction == on_segv)
        return;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &r.prev_segv);
}

bool take_allocation()
{
    runtime &r = rt();
    if (r.fail_after < 0)
        return true;
    if (r.fail_after-- > 0)
        return true;
    r.fail_after = -1;
    r.st.failed_allocations++;
    return false;
}

} // namespace

const char *host_or_device(const void *p)
{
    const allocation *a = find(p);
    if (a)
        return a->device ? "device memory" : "pinned host memory";
    return in_freed(p) ? "freed device memory" : "pageable host memory";
}

// [p, p + bytes) inside one device allocation; else says why (what: the
// call and operand) and returns false.
bool check_device(const void *p, size_t bytes, const char *what)
{
    uintptr_t start;
    const allocation *a = find(p, &start);
    if (!a || !a->device) {
        misuse("%s: %p is %s, not device memory", what, p, host_or_device(p));
        return false;
    }
    size_t off = (uintptr_t)p - start;
    if (bytes > a->bytes - off) {
        misuse("%s: %zu bytes at offset %zu run past the end of a device allocation of %zu bytes",
               what, bytes, off, a->bytes);
        return false;
    }
    return true;
}

// [p, p + bytes) is host memory: anything but device memory.
bool check_host(const void *p, size_t bytes, const char *what)
{
    uintptr_t start;
    const allocation *a = find(p, &start);
    if (a && a->device) {
        misuse("%s: %p is device memory where host memory is expected", what, p);
        return false;
    }
    if (a && bytes > a->bytes - ((uintptr_t)p - start)) {
        misuse("%s: %zu bytes run past the end of a pinned allocation of %zu bytes", what, bytes,
               a->bytes);
        return false;
    }
    return true;
}

} // namespace detail

void fail_allocation_after(long n)
{
    rt().fail_after = n;
}

bool is_device_range(const void *p, size_t bytes)
{
    uintptr_t start;
    const allocation *a = find(p, &start);
    return a && a->device && bytes <= a->bytes - ((uintptr_t)p - start);
}

bool device_reachable(const void *p, size_t bytes, const char *what)
{
    uintptr_t start;
    const allocation *a = find(p, &start);
    if (!a) {
        host_fault(cudaErrorIllegalAddress, "%s: %p is %s, which the device cannot reach", what, p,
                   host_or_device(p));
        return false;
    }
    if (bytes > a->bytes - ((uintptr_t)p - start)) {
        host_fault(cudaErrorIllegalAddress,
                   "%s: %zu bytes at offset %zu run past the end of an allocation of %zu bytes",
                   what, bytes, (size_t)((uintptr_t)p - start), a->bytes);
        return false;
    }
    return true;
}

bool device_reachable_arg(cudaStream_t stream, const void *kernel, int i, const void *p)
{
    if (!stream || !p || find(p))
        return true;
    host_fault(cudaErrorIllegalAddress,
               "kernel %p launched on stream %p: pointer argument %d (%p) is %s, which the "
               "device cannot reach",
               kernel, (void *)stream, i, p, host_or_device(p));
    return false;
}

} // namespace kvf_emu

// ---- memory ------------------------------------------------------------------

cudaError_t cudaMalloc(void **p, size_t bytes)
{
    runtime &r = rt();
    if (!p)
        return fail(cudaErrorInvalidValue);
    if (no_device())
        return fail(cudaErrorNoDevice);
    if (unsafe_during_capture("cudaMalloc"))
        return fail(cudaErrorStreamCaptureUnsupported);
    if (bytes == 0) {
        *p = nullptr;
        return cudaSuccess;
    }
    if (bytes > k_total_device_bytes - r.device_bytes || !take_allocation())
        return fail(cudaErrorMemoryAllocation);
    size_t rounded = (bytes + k_device_align - 1) / k_device_align * k_device_align;
    size_t data_bytes = (rounded + r.page - 1) / r.page * r.page;
    size_t map_bytes = data_bytes + 2 * r.page;
    void *map =
        mmap(nullptr, map_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (map == MAP_FAILED)
        return fail(cudaErrorMemoryAllocation);
    install_segv();
    allocation a;
    a.bytes = bytes;
    a.device = true;
    a.map = (unsigned char *)map;
    a.map_bytes = map_bytes;
    a.data = a.map + r.page;
    a.data_bytes = data_bytes;
    // Poisoned: what nothing wrote reads as NaN (or -1).
    if (mprotect(a.data, data_bytes, PROT_READ | PROT_WRITE) != 0) {
        munmap(map, map_bytes);
        return fail(cudaErrorMemoryAllocation);
    }
    memset(a.data, 0xff, data_bytes);
    if (r.scope_depth == 0)
        mprotect(a.data, data_bytes, PROT_NONE);
    unsigned char *user = a.data + data_bytes - rounded;
    r.allocs[(uintptr_t)user] = a;
    r.device_bytes += bytes;
    r.n_device++;
    *p = user;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    runtime &r = rt();
    if (!p)
        return cudaSuccess;
    if (unsafe_during_capture("cudaFree"))
        return fail(cudaErrorStreamCaptureUnsupported);
    flush_all(false); // cudaFree waits for the device
    auto it = r.allocs.find((uintptr_t)p);
    if (it == r.allocs.end() || !it->second.device) {
        misuse("cudaFree(%p): not the start of a live device allocation (%s)", p,
               host_or_device(p));
        return fail(cudaErrorInvalidValue);
    }
    // Kept reserved, inaccessible, its pages given back: a later access
    // (a graph replayed after its buffers were freed) faults instead of
    // reaching memory a new allocation got.
    madvise(it->second.map, it->second.map_bytes, MADV_DONTNEED);
    mprotect(it->second.map, it->second.map_bytes, PROT_NONE);
    r.freed.push_back({(uintptr_t)it->second.map, it->second.map_bytes});
    r.device_bytes -= it->second.bytes;
    r.n_device--;
    r.allocs.erase(it);
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned int flags)
{
    runtime &r = rt();
    if (!p || (flags & ~0x7u))
        return fail(cudaErrorInvalidValue);
    if (no_device())
        return fail(cudaErrorNoDevice);
    if (unsafe_during_capture("cudaHostAlloc"))
        return fail(cudaErrorStreamCaptureUnsupported);
    if (bytes == 0) {
        *p = nullptr;
        return cudaSuccess;
    }
    void *mem = nullptr;
    if (!take_allocation() || posix_memalign(&mem, k_device_align, bytes) != 0)
        return fail(cudaErrorMemoryAllocation);
    memset(mem, 0xff, bytes); // as fresh pinned memory holds garbage
    allocation a = {bytes, false, nullptr, 0, nullptr, 0};
    r.allocs[(uintptr_t)mem] = a;
    r.pinned_bytes += bytes;
    r.n_pinned++;
    *p = mem;
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t bytes)
{
    return cudaHostAlloc(p, bytes, cudaHostAllocDefault);
}

cudaError_t cudaFreeHost(void *p)
{
    runtime &r = rt();
    if (!p)
        return cudaSuccess;
    if (unsafe_during_capture("cudaFreeHost"))
        return fail(cudaErrorStreamCaptureUnsupported);
    flush_all(false); // cudaFreeHost waits for the device
    auto it = r.allocs.find((uintptr_t)p);
    if (it == r.allocs.end() || it->second.device) {
        misuse("cudaFreeHost(%p): not the start of a live pinned allocation (%s)", p,
               host_or_device(p));
        return fail(cudaErrorInvalidValue);
    }
    r.pinned_bytes -= it->second.bytes;
    r.n_pinned--;
    r.allocs.erase(it);
    free(p);
    return cudaSuccess;
}
