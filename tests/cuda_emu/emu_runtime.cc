// The emulator's host runtime (emu_runtime.h says what it emulates).
//
// Device memory: one private mapping per allocation, guard page, data
// pages, guard page, the allocation ending where the data pages end
// (rounded up to 256 bytes: cudaMalloc's alignment), so a run past its end
// reaches the guard page at once. The data pages are PROT_NONE while the
// host runs and opened only while device work runs (device_scope), which is
// what makes a host dereference of a device pointer crash here as it would
// on a GPU. Opening and closing costs two mprotect calls per allocation per
// unit of work: a few dozen allocations, thousands of units per test.
//
// Streams: a queue of work items (std::function) per stream. An item is run
// inside a device_scope; a fault in one (the kernel emulator counts them)
// becomes the error the next wait returns. Events are (stream, item count)
// pairs: complete once the stream has run that many. A capture is a list
// of items appended to instead of running them, shared by the streams
// forked into it, with per-stream counts to tell whether each fork joined
// back.

// The C++ library first: emu.h defines __noinline__, which its headers use.
#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "emu_runtime.h"

namespace kvf_emu
{
namespace
{

typedef std::vector<std::function<void()>> node_list;
struct capture;

} // namespace
} // namespace kvf_emu

struct CUstream_st {
    CUstream_st(unsigned f, bool l) : flags(f), legacy(l)
    {
    }
    unsigned flags;
    bool legacy;
    std::deque<std::function<void()>> queue; // deferred work, oldest first
    unsigned long long given = 0;            // items given outside captures
    unsigned long long done = 0;             // items run
    kvf_emu::capture *cap = nullptr;         // the capture this stream records into
};

struct CUevent_st {
    unsigned flags;
    cudaStream_t stream = nullptr; // where last recorded; nullptr: never
    unsigned long long pos = 0;    // stream->given at the record (outside a capture)
    unsigned long long cap_id = 0; // recorded in this capture (0: outside any)
    unsigned long long cap_pos = 0;
};

struct CUgraph_st {
    std::shared_ptr<const kvf_emu::node_list> nodes;
};

struct CUgraphExec_st {
    std::shared_ptr<const kvf_emu::node_list> nodes;
};

namespace kvf_emu
{
namespace
{

constexpr size_t k_total_device_bytes = (size_t)16 << 30;
constexpr size_t k_device_align = 256;

struct member {
    unsigned long long items = 0;  // items this stream recorded into the capture
    unsigned long long joined = 0; // of them, those another member waited for
};

struct capture {
    unsigned long long id;
    cudaStream_t origin;
    cudaStreamCaptureMode mode;
    pthread_t thread;
    bool invalidated = false;
    std::shared_ptr<node_list> nodes = std::make_shared<node_list>();
    std::map<cudaStream_t, member> members; // the origin and the forks
};

struct allocation {
    size_t bytes;
    bool device;        // else pinned host memory
    unsigned char *map; // device: the mapping (guard, data, guard)
    size_t map_bytes;
    unsigned char *data; // device: the data pages
    size_t data_bytes;
};

struct runtime {
    std::map<uintptr_t, allocation> allocs; // by address
    size_t device_bytes = 0, pinned_bytes = 0, n_device = 0, n_pinned = 0;
    CUstream_st legacy_stream{0, true}; // nullptr
    std::set<cudaStream_t> streams;     // created, live
    std::set<cudaEvent_t> events;
    std::set<cudaGraph_t> graphs;
    std::set<cudaGraphExec_t> execs;
    std::map<unsigned long long, capture *> captures; // open, by id
    unsigned long long next_capture = 1;
    stream_mode mode = stream_mode::immediate;
    int device_count = 1, device = 0;
    long fail_after = -1;
    cudaError_t async_error = cudaSuccess; // from queued or replayed work
    int scope_depth = 0;
    std::vector<std::pair<uintptr_t, size_t>> freed; // device mappings, reserved and closed
    struct sigaction prev_segv = {};
    size_t page = 4096;
    size_t blas_handles = 0;
    runtime_stats st = {};

    runtime()
    {
        page = (size_t)sysconf(_SC_PAGESIZE);
        const char *m = getenv("KVF_EMU_STREAMS");
        if (m && strcmp(m, "deferred") == 0)
            mode = stream_mode::deferred;
        else if (m && *m && strcmp(m, "immediate") != 0)
            fprintf(stderr, "cuda emu: KVF_EMU_STREAMS=%s: not deferred or immediate; immediate\n",
                    m);
    }
};

// Never destroyed: queued work and leaks outlive the static destructors.
runtime &rt()
{
    static runtime *r = new runtime;
    return *r;
}

void misuse(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void misuse(const char *fmt, ...)
{
    fprintf(stderr, "cuda emu: ");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

// Every failing call leaves its error for cudaGetLastError, as the runtime
// does.
cudaError_t fail(cudaError_t err)
{
    set_last_error(err);
    return err;
}

// ---- device memory ---------------------------------------------------------

void protect_device(int prot)
{
    for (auto &a : rt().allocs)
        if (a.second.device && mprotect(a.second.data, a.second.data_bytes, prot) != 0) {
            perror("cuda emu: mprotect");
            abort();
        }
}

// Device memory is open to the host while one of these lives: while device
// work runs.
struct device_scope {
    device_scope()
    {
        if (rt().scope_depth++ == 0)
            protect_device(PROT_READ | PROT_WRITE);
    }
    ~device_scope()
    {
        if (--rt().scope_depth == 0)
            protect_device(PROT_NONE);
    }
    device_scope(const device_scope &) = delete;
    device_scope &operator=(const device_scope &) = delete;
};

// The allocation p points into ([start, start + bytes]; the end too, for
// empty ranges), or nullptr.
const allocation *find(const void *p, uintptr_t *start_p = nullptr)
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

// ---- captures --------------------------------------------------------------

capture *open_capture(unsigned long long id)
{
    auto it = rt().captures.find(id);
    return it == rt().captures.end() ? nullptr : it->second;
}

void invalidate(capture *c, const char *why, cudaError_t err)
{
    if (!c->invalidated)
        misuse("%s: the stream capture is invalidated (%s)", why, cudaGetErrorName(err));
    c->invalidated = true;
}

// An unsafe call (emu_runtime.h) made now fails, invalidating the captures
// that forbid it: those of this thread not begun in relaxed mode, and the
// global-mode ones of any thread.
bool unsafe_during_capture(const char *what)
{
    bool refused = false;
    for (auto &kv : rt().captures) {
        capture *c = kv.second;
        if (c->mode == cudaStreamCaptureModeRelaxed)
            continue;
        if (pthread_equal(c->thread, pthread_self()) || c->mode == cudaStreamCaptureModeGlobal) {
            invalidate(c, what, cudaErrorStreamCaptureUnsupported);
            refused = true;
        }
    }
    return refused;
}

// ---- streams -----------------------------------------------------------------

CUstream_st *resolve(cudaStream_t s)
{
    if (!s)
        return &rt().legacy_stream;
    return rt().streams.count(s) ? s : nullptr;
}

// Runs one item as the device: device memory open, a fault in it kept for
// the next wait unless reported (an item run when it is given: its
// launcher reports the fault, as the kernel tests expect).
void run_item(const std::function<void()> &op, bool reported)
{
    device_scope scope;
    unsigned long long f0 = faults();
    op();
    if (faults() != f0 && !reported)
        rt().async_error = cudaErrorLaunchFailure;
}

// Runs s's queued items until it has run upto of them.
void flush(CUstream_st *s, unsigned long long upto)
{
    if (s->done >= upto || s->queue.empty())
        return;
    device_scope scope; // once for the whole run
    while (s->done < upto && !s->queue.empty()) {
        std::function<void()> op = std::move(s->queue.front());
        s->queue.pop_front();
        run_item(op, false);
        s->done++;
    }
}

// Runs the queued work of every stream (the device synchronizes), or that
// of the blocking ones (what the legacy stream waits for).
void flush_all(bool blocking_only)
{
    for (cudaStream_t s : rt().streams)
        if (!blocking_only || !(s->flags & cudaStreamNonBlocking))
            flush(s, s->given);
    if (!blocking_only)
        flush(&rt().legacy_stream, rt().legacy_stream.given);
}

// The legacy stream's work so far, and that of the blocking streams it
// waits for: what a synchronous call waits for.
void flush_legacy()
{
    flush_all(true);
    flush(&rt().legacy_stream, rt().legacy_stream.given);
}

cudaError_t take_async_error()
{
    cudaError_t e = rt().async_error;
    rt().async_error = cudaSuccess;
    return e;
}

// Work for stream s. counter: the stat counted when it runs.
cudaError_t give(cudaStream_t stream, std::function<void()> op, const char *what,
                 unsigned long long *counter)
{
    runtime &r = rt();
    CUstream_st *s = resolve(stream);
    if (!s) {
        misuse("%s on stream %p, which is not a live stream", what, (void *)stream);
        return cudaErrorInvalidResourceHandle;
    }
    std::function<void()> item = [op = std::move(op), counter] {
        if (counter)
            (*counter)++;
        op();
    };
    if (s->cap) {
        if (s->cap->invalidated)
            return cudaErrorStreamCaptureInvalidated;
        s->cap->nodes->push_back(std::move(item));
        s->cap->members[s].items++;
        return cudaSuccess;
    }
    if (s->legacy) {
        // The legacy stream waits for the blocking streams (their earlier
        // work runs first, here at once); one that is capturing cannot be
        // waited for.
        for (auto &kv : r.captures)
            for (auto &m : kv.second->members)
                if (!(m.first->flags & cudaStreamNonBlocking)) {
                    invalidate(kv.second, what, cudaErrorStreamCaptureImplicit);
                    return cudaErrorStreamCaptureImplicit;
                }
        flush_all(true);
    } else if (!(s->flags & cudaStreamNonBlocking)) {
        flush(&r.legacy_stream, r.legacy_stream.given); // and they wait for it
    }
    s->given++;
    if (r.mode == stream_mode::immediate) {
        run_item(item, s->legacy);
        s->done++;
    } else {
        s->queue.push_back(std::move(item));
        r.st.deferred++;
    }
    return cudaSuccess;
}

// Pageable host memory: neither device nor pinned.
bool pageable(const void *p)
{
    return find(p) == nullptr;
}

// Checks a copy's pointers against its direction; returns false (having
// said why) on a mismatch. dst_bytes / src_bytes: the extents touched;
// *dst_dev_p / *src_dev_p: which sides are device memory.
bool check_copy(void *dst, size_t dst_bytes, const void *src, size_t src_bytes, cudaMemcpyKind kind,
                const char *what, bool *dst_dev_p, bool *src_dev_p)
{
    bool dst_dev, src_dev;
    switch (kind) {
    case cudaMemcpyHostToHost:
        dst_dev = src_dev = false;
        break;
    case cudaMemcpyHostToDevice:
        dst_dev = true;
        src_dev = false;
        break;
    case cudaMemcpyDeviceToHost:
        dst_dev = false;
        src_dev = true;
        break;
    case cudaMemcpyDeviceToDevice:
        dst_dev = src_dev = true;
        break;
    case cudaMemcpyDefault: {
        const allocation *d = find(dst), *s = find(src);
        dst_dev = d && d->device;
        src_dev = s && s->device;
        break;
    }
    default:
        misuse("%s: copy kind %d", what, (int)kind);
        return false;
    }
    char buf[128];
    snprintf(buf, sizeof buf, "%s destination", what);
    if (!(dst_dev ? check_device(dst, dst_bytes, buf) : check_host(dst, dst_bytes, buf)))
        return false;
    snprintf(buf, sizeof buf, "%s source", what);
    if (!(src_dev ? check_device(src, src_bytes, buf) : check_host(src, src_bytes, buf)))
        return false;
    *dst_dev_p = dst_dev;
    *src_dev_p = src_dev;
    return true;
}

// One copy of height rows of width bytes on stream (sync: cudaMemcpy, on
// the legacy stream), done when CUDA's API synchronization behavior says:
//  - into host memory, and between host memories: by the return (a copy
//    from the device into pinned memory on a stream excepted: queued);
//  - into device memory: from pinned memory, by the return for cudaMemcpy,
//    queued on a stream; from pageable memory, the source is read (staged)
//    at the call and the device write queued, as with the driver's staging
//    buffer;
//  - device to device: queued (cudaMemcpy's on the legacy stream).
// A stream that captures records it, pointers and all.
cudaError_t copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                    size_t height, cudaMemcpyKind kind, cudaStream_t stream, bool sync,
                    const char *what)
{
    runtime &r = rt();
    CUstream_st *st = resolve(stream);
    if (!st) {
        misuse("%s on stream %p, which is not a live stream", what, (void *)stream);
        return fail(cudaErrorInvalidResourceHandle);
    }
    if (width > dpitch || width > spitch) {
        misuse("%s: width %zu above a pitch (%zu, %zu)", what, width, dpitch, spitch);
        return fail(cudaErrorInvalidPitchValue);
    }
    if (width == 0 || height == 0)
        return cudaSuccess;
    if (!dst || !src) {
        misuse("%s: a null pointer", what);
        return fail(cudaErrorInvalidValue);
    }
    bool dst_dev = false, src_dev = false;
    if (!check_copy(dst, dpitch * (height - 1) + width, src, spitch * (height - 1) + width, kind,
                    what, &dst_dev, &src_dev))
        return fail(kind > cudaMemcpyDefault ? cudaErrorInvalidMemcpyDirection
                                             : cudaErrorInvalidValue);
    if (sync) {
        if (unsafe_during_capture(what))
            return fail(cudaErrorStreamCaptureUnsupported);
        st = &r.legacy_stream;
        stream = nullptr;
    }
    unsigned char *d = (unsigned char *)dst;
    const unsigned char *s = (const unsigned char *)src;
    const bool src_pageable = !src_dev && pageable(src);
    const bool now = !st->cap && ((!dst_dev && (sync || !src_dev || pageable(dst))) ||
                                  (dst_dev && !src_dev && sync && !src_pageable));
    std::function<void()> op;
    if (!now && !st->cap && dst_dev && src_pageable) {
        auto staged = std::make_shared<std::vector<unsigned char>>(width * height);
        for (size_t row = 0; row < height; row++)
            memcpy(staged->data() + row * width, s + row * spitch, width);
        op = [=] {
            for (size_t row = 0; row < height; row++)
                memcpy(d + row * dpitch, staged->data() + row * width, width);
        };
    } else {
        op = [=] {
            for (size_t row = 0; row < height; row++)
                memmove(d + row * dpitch, s + row * spitch, width);
        };
    }
    if (!now) {
        cudaError_t err = give(stream, std::move(op), what, &r.st.copies);
        return err != cudaSuccess ? fail(err) : cudaSuccess;
    }
    // Done by the return: after the stream's earlier work, as its item.
    if (st->legacy)
        flush_legacy();
    else
        flush(st, st->given);
    st->given++;
    run_item(
        [&] {
            r.st.copies++;
            op();
        },
        true);
    st->done++;
    return cudaSuccess;
}

bool no_device()
{
    return rt().device_count <= 0;
}

} // namespace

// ---- controls ----------------------------------------------------------------

void set_stream_mode(stream_mode m)
{
    flush_all(false);
    rt().mode = m;
}

stream_mode get_stream_mode()
{
    return rt().mode;
}

void set_device_count(int n)
{
    rt().device_count = n;
}

void fail_allocation_after(long n)
{
    rt().fail_after = n;
}

runtime_stats get_runtime_stats()
{
    runtime &r = rt();
    runtime_stats s = r.st;
    s.device_allocations = r.n_device;
    s.device_bytes = r.device_bytes;
    s.pinned_allocations = r.n_pinned;
    s.pinned_bytes = r.pinned_bytes;
    s.streams = r.streams.size();
    s.events = r.events.size();
    s.graphs = r.graphs.size();
    s.graph_execs = r.execs.size();
    s.blas_handles = r.blas_handles;
    s.kernels = get_stats().grids;
    return s;
}

size_t report_leaks(FILE *out)
{
    runtime &r = rt();
    size_t n = 0;
    for (auto &a : r.allocs) {
        fprintf(out, "cuda emu: leaked: %s allocation of %zu bytes at %#lx\n",
                a.second.device ? "device" : "pinned host", a.second.bytes, (unsigned long)a.first);
        n++;
    }
    auto count = [&](size_t k, const char *what) {
        if (k)
            fprintf(out, "cuda emu: leaked: %zu %s\n", k, what);
        n += k;
    };
    count(r.streams.size(), "stream(s)");
    count(r.events.size(), "event(s)");
    count(r.graphs.size(), "graph(s)");
    count(r.execs.size(), "executable graph(s)");
    count(r.blas_handles, "cuBLAS handle(s)");
    count(r.captures.size(), "open stream capture(s)");
    return n;
}

bool is_device_range(const void *p, size_t bytes)
{
    uintptr_t start;
    const allocation *a = find(p, &start);
    return a && a->device && bytes <= a->bytes - ((uintptr_t)p - start);
}

void blas_handle_count(int delta)
{
    rt().blas_handles += (size_t)delta;
}

void count_gemm()
{
    rt().st.gemms++;
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

cudaError_t submit(cudaStream_t stream, std::function<void()> op, const char *what)
{
    // Kernels are counted where they run (stats.grids).
    return give(stream, std::move(op), what, nullptr);
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

using kvf_emu::fail;
using kvf_emu::misuse;
using kvf_emu::rt;

// ---- device ------------------------------------------------------------------

cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count)
        return fail(cudaErrorInvalidValue);
    *count = rt().device_count > 0 ? rt().device_count : 0;
    return *count ? cudaSuccess : fail(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device)
{
    if (kvf_emu::no_device())
        return fail(cudaErrorNoDevice);
    if (device < 0 || device >= rt().device_count)
        return fail(cudaErrorInvalidDevice);
    rt().device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    if (!device)
        return fail(cudaErrorInvalidValue);
    if (kvf_emu::no_device())
        return fail(cudaErrorNoDevice);
    *device = rt().device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device)
{
    if (!prop)
        return fail(cudaErrorInvalidValue);
    if (kvf_emu::no_device())
        return fail(cudaErrorNoDevice);
    if (device < 0 || device >= rt().device_count)
        return fail(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof(*prop));
    snprintf(prop->name, sizeof(prop->name), "kvferry CUDA emulator (CPU)");
    prop->totalGlobalMem = kvf_emu::k_total_device_bytes;
    prop->sharedMemPerBlock = 48 * 1024;
    prop->sharedMemPerBlockOptin = 227 * 1024;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = 8;
    prop->l2CacheSize = 50 << 20;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device)
{
    cudaDeviceProp p;
    if (!value)
        return fail(cudaErrorInvalidValue);
    cudaError_t err = cudaGetDeviceProperties(&p, device);
    if (err != cudaSuccess)
        return err;
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock:
        *value = p.maxThreadsPerBlock;
        break;
    case cudaDevAttrMaxSharedMemoryPerBlock:
        *value = (int)p.sharedMemPerBlock;
        break;
    case cudaDevAttrWarpSize:
        *value = p.warpSize;
        break;
    case cudaDevAttrMultiProcessorCount:
        *value = p.multiProcessorCount;
        break;
    case cudaDevAttrL2CacheSize:
        *value = p.l2CacheSize;
        break;
    case cudaDevAttrComputeCapabilityMajor:
        *value = p.major;
        break;
    case cudaDevAttrComputeCapabilityMinor:
        *value = p.minor;
        break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
        *value = (int)p.sharedMemPerBlockOptin;
        break;
    default:
        misuse("cudaDeviceGetAttribute: attribute %d is not emulated", (int)attr);
        return fail(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *version)
{
    if (!version)
        return fail(cudaErrorInvalidValue);
    *version = 13000;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *version)
{
    if (!version)
        return fail(cudaErrorInvalidValue);
    *version = kvf_emu::no_device() ? 0 : 13000;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    if (kvf_emu::unsafe_during_capture("cudaDeviceSynchronize"))
        return fail(cudaErrorStreamCaptureUnsupported);
    kvf_emu::flush_all(false);
    cudaError_t err = kvf_emu::take_async_error();
    return err != cudaSuccess ? fail(err) : cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    if (!free_bytes || !total_bytes)
        return fail(cudaErrorInvalidValue);
    if (kvf_emu::no_device())
        return fail(cudaErrorNoDevice);
    *total_bytes = kvf_emu::k_total_device_bytes;
    *free_bytes = kvf_emu::k_total_device_bytes - rt().device_bytes;
    return cudaSuccess;
}

// ---- memory ------------------------------------------------------------------

cudaError_t cudaMalloc(void **p, size_t bytes)
{
    using namespace kvf_emu;
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
    using namespace kvf_emu;
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
    using namespace kvf_emu;
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
    using namespace kvf_emu;
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

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    return kvf_emu::copy_2d(dst, bytes, src, bytes, bytes, 1, kind, nullptr, true, "cudaMemcpy");
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    return kvf_emu::copy_2d(dst, bytes, src, bytes, bytes, 1, kind, stream, false,
                            "cudaMemcpyAsync");
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind, cudaStream_t stream)
{
    return kvf_emu::copy_2d(dst, dpitch, src, spitch, width, height, kind, stream, false,
                            "cudaMemcpy2DAsync");
}

static cudaError_t memset_on(void *p, int value, size_t bytes, cudaStream_t stream, bool sync,
                             const char *what)
{
    using namespace kvf_emu;
    if (!resolve(stream)) {
        misuse("%s on stream %p, which is not a live stream", what, (void *)stream);
        return fail(cudaErrorInvalidResourceHandle);
    }
    if (bytes == 0)
        return cudaSuccess;
    if (!check_device(p, bytes, what))
        return fail(cudaErrorInvalidValue);
    if (sync && unsafe_during_capture(what))
        return fail(cudaErrorStreamCaptureUnsupported);
    cudaError_t err = give(
        sync ? nullptr : stream, [=] { memset(p, value, bytes); }, what, &rt().st.copies);
    return err != cudaSuccess ? fail(err) : cudaSuccess;
}

cudaError_t cudaMemset(void *p, int value, size_t bytes)
{
    return memset_on(p, value, bytes, nullptr, true, "cudaMemset");
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t stream)
{
    return memset_on(p, value, bytes, stream, false, "cudaMemsetAsync");
}

// ---- streams -----------------------------------------------------------------

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags)
{
    if (!stream || (flags & ~(unsigned)cudaStreamNonBlocking))
        return fail(cudaErrorInvalidValue);
    if (kvf_emu::no_device())
        return fail(cudaErrorNoDevice);
    cudaStream_t s = new CUstream_st(flags, false);
    rt().streams.insert(s);
    *stream = s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream)
{
    return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    using namespace kvf_emu;
    if (!stream || !rt().streams.count(stream)) {
        misuse("cudaStreamDestroy(%p): not a live stream", (void *)stream);
        return fail(cudaErrorInvalidResourceHandle);
    }
    if (stream->cap) {
        invalidate(stream->cap, "cudaStreamDestroy of a capturing stream",
                   cudaErrorStreamCaptureUnsupported);
        return fail(cudaErrorStreamCaptureUnsupported);
    }
    flush(stream, stream->given); // its work finishes first
    rt().streams.erase(stream);
    delete stream;
    return cudaSuccess;
}

static cudaError_t stream_wait_all(cudaStream_t stream, const char *what)
{
    using namespace kvf_emu;
    CUstream_st *s = resolve(stream);
    if (!s) {
        misuse("%s(%p): not a live stream", what, (void *)stream);
        return fail(cudaErrorInvalidResourceHandle);
    }
    if (s->cap) {
        invalidate(s->cap, what, cudaErrorStreamCaptureUnsupported);
        return fail(cudaErrorStreamCaptureUnsupported);
    }
    if (s->legacy)
        flush_legacy();
    else
        flush(s, s->given);
    cudaError_t err = take_async_error();
    return err != cudaSuccess ? fail(err) : cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    return stream_wait_all(stream, "cudaStreamSynchronize");
}

// Without timing, a stream's work may as well be done when asked about.
cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    return stream_wait_all(stream, "cudaStreamQuery");
}

static bool live_event(cudaEvent_t e, const char *what)
{
    if (e && rt().events.count(e))
        return true;
    misuse("%s(%p): not a live event", what, (void *)e);
    return false;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    using namespace kvf_emu;
    CUstream_st *s = resolve(stream);
    if (!s) {
        misuse("cudaStreamWaitEvent(%p): not a live stream", (void *)stream);
        return fail(cudaErrorInvalidResourceHandle);
    }
    if (!live_event(event, "cudaStreamWaitEvent"))
        return fail(cudaErrorInvalidResourceHandle);
    if (flags != 0)
        return fail(cudaErrorInvalidValue);
    if (!event->stream)
        return cudaSuccess; // never recorded: nothing to wait for
    capture *ec = event->cap_id ? open_capture(event->cap_id) : nullptr;
    if (s->cap) {
        if (ec != s->cap) {
            invalidate(s->cap, "cudaStreamWaitEvent in a capture on an event recorded outside it",
                       cudaErrorStreamCaptureIsolation);
            return fail(cudaErrorStreamCaptureIsolation);
        }
        // Inside the capture: the nodes replay in capture order, which
        // keeps the dependency; the recording stream's items up to the
        // event are joined.
        if (event->stream != s) {
            member &m = s->cap->members[event->stream];
            m.joined = std::max(m.joined, event->cap_pos);
        }
        return cudaSuccess;
    }
    if (ec) {
        // A fork: s records into the event's capture from now on.
        if (s->legacy) {
            invalidate(ec, "the legacy stream waiting for a capture",
                       cudaErrorStreamCaptureImplicit);
            return fail(cudaErrorStreamCaptureImplicit);
        }
        s->cap = ec;
        ec->members[s];
        return cudaSuccess;
    }
    CUstream_st *src = event->stream;
    unsigned long long pos = event->pos;
    if (s->legacy) {
        flush(src, pos);
        return cudaSuccess;
    }
    return give(
        s, [src, pos] { flush(src, pos); }, "cudaStreamWaitEvent", nullptr);
}

// ---- events ------------------------------------------------------------------

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    if (!event || (flags & ~0x7u))
        return fail(cudaErrorInvalidValue);
    if (kvf_emu::no_device())
        return fail(cudaErrorNoDevice);
    cudaEvent_t e = new CUevent_st{flags};
    rt().events.insert(e);
    *event = e;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    if (!live_event(event, "cudaEventDestroy"))
        return fail(cudaErrorInvalidResourceHandle);
    rt().events.erase(event);
    delete event;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    using namespace kvf_emu;
    if (!live_event(event, "cudaEventRecord"))
        return fail(cudaErrorInvalidResourceHandle);
    CUstream_st *s = resolve(stream);
    if (!s) {
        misuse("cudaEventRecord on stream %p: not a live stream", (void *)stream);
        return fail(cudaErrorInvalidResourceHandle);
    }
    event->stream = s;
    if (s->cap) {
        if (s->cap->invalidated)
            return fail(cudaErrorStreamCaptureInvalidated);
        event->cap_id = s->cap->id;
        event->cap_pos = s->cap->members[s].items;
        event->pos = 0;
    } else {
        event->cap_id = 0;
        event->pos = s->given;
    }
    return cudaSuccess;
}

static cudaError_t event_wait(cudaEvent_t event, const char *what)
{
    using namespace kvf_emu;
    if (!live_event(event, what))
        return fail(cudaErrorInvalidResourceHandle);
    if (event->cap_id && open_capture(event->cap_id)) {
        misuse("%s of an event recorded in a capture still open", what);
        return fail(cudaErrorCapturedEvent);
    }
    if (event->stream && !event->cap_id)
        flush(event->stream, event->pos);
    cudaError_t err = take_async_error();
    return err != cudaSuccess ? fail(err) : cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    return event_wait(event, "cudaEventSynchronize");
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    return event_wait(event, "cudaEventQuery");
}

// ---- graphs ------------------------------------------------------------------

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode)
{
    using namespace kvf_emu;
    runtime &r = rt();
    CUstream_st *s = resolve(stream);
    if (!s) {
        misuse("cudaStreamBeginCapture(%p): not a live stream", (void *)stream);
        return fail(cudaErrorInvalidResourceHandle);
    }
    if (s->legacy) {
        misuse("cudaStreamBeginCapture of the legacy stream");
        return fail(cudaErrorStreamCaptureUnsupported);
    }
    if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
        mode != cudaStreamCaptureModeRelaxed)
        return fail(cudaErrorInvalidValue);
    if (s->cap) {
        misuse("cudaStreamBeginCapture of a stream already capturing");
        return fail(cudaErrorIllegalState);
    }
    capture *c = new capture;
    c->id = r.next_capture++;
    c->origin = s;
    c->mode = mode;
    c->thread = pthread_self();
    c->members[s];
    r.captures[c->id] = c;
    s->cap = c;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph)
{
    using namespace kvf_emu;
    runtime &r = rt();
    if (!graph)
        return fail(cudaErrorInvalidValue);
    *graph = nullptr;
    CUstream_st *s = resolve(stream);
    if (!s) {
        misuse("cudaStreamEndCapture(%p): not a live stream", (void *)stream);
        return fail(cudaErrorInvalidResourceHandle);
    }
    capture *c = s->cap;
    if (!c) {
        misuse("cudaStreamEndCapture of a stream that is not capturing");
        return fail(cudaErrorIllegalState);
    }
    if (c->origin != s) {
        invalidate(c, "cudaStreamEndCapture on a forked stream", cudaErrorStreamCaptureUnmatched);
        return fail(cudaErrorStreamCaptureUnmatched);
    }
    if (c->mode != cudaStreamCaptureModeRelaxed && !pthread_equal(c->thread, pthread_self())) {
        misuse("cudaStreamEndCapture from another thread than the one that began it");
        return fail(cudaErrorStreamCaptureWrongThread);
    }
    cudaError_t err = c->invalidated ? cudaErrorStreamCaptureInvalidated : cudaSuccess;
    for (auto &m : c->members) {
        m.first->cap = nullptr;
        if (err == cudaSuccess && m.first != s && m.second.items > m.second.joined) {
            misuse("cudaStreamEndCapture: a forked stream has %llu captured items, %llu of "
                   "them joined back",
                   m.second.items, m.second.joined);
            err = cudaErrorStreamCaptureUnjoined;
        }
    }
    std::shared_ptr<node_list> nodes = c->nodes;
    r.captures.erase(c->id);
    delete c;
    if (err != cudaSuccess)
        return fail(err);
    cudaGraph_t g = new CUgraph_st{nodes};
    r.graphs.insert(g);
    r.st.captures++;
    *graph = g;
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus *status)
{
    using namespace kvf_emu;
    CUstream_st *s = resolve(stream);
    if (!s || !status)
        return fail(s ? cudaErrorInvalidValue : cudaErrorInvalidResourceHandle);
    *status = !s->cap               ? cudaStreamCaptureStatusNone
              : s->cap->invalidated ? cudaStreamCaptureStatusInvalidated
                                    : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags)
{
    if (!exec || flags != 0)
        return fail(cudaErrorInvalidValue);
    if (!graph || !rt().graphs.count(graph)) {
        misuse("cudaGraphInstantiate(%p): not a live graph", (void *)graph);
        return fail(cudaErrorInvalidValue);
    }
    // The nodes are never changed once captured: sharing them is a copy.
    cudaGraphExec_t x = new CUgraphExec_st{graph->nodes};
    rt().execs.insert(x);
    *exec = x;
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream)
{
    using namespace kvf_emu;
    if (!exec || !rt().execs.count(exec)) {
        misuse("cudaGraphLaunch(%p): not a live executable graph", (void *)exec);
        return fail(cudaErrorInvalidValue);
    }
    std::shared_ptr<const node_list> nodes = exec->nodes;
    cudaError_t err = give(
        stream,
        [nodes] {
            for (const auto &op : *nodes)
                op();
        },
        "cudaGraphLaunch", &rt().st.replays);
    return err != cudaSuccess ? fail(err) : cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    if (!graph || !rt().graphs.count(graph)) {
        misuse("cudaGraphDestroy(%p): not a live graph", (void *)graph);
        return fail(cudaErrorInvalidValue);
    }
    rt().graphs.erase(graph);
    delete graph;
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    if (!exec || !rt().execs.count(exec)) {
        misuse("cudaGraphExecDestroy(%p): not a live executable graph", (void *)exec);
        return fail(cudaErrorInvalidValue);
    }
    rt().execs.erase(exec);
    delete exec; // a replay still queued holds the nodes
    return cudaSuccess;
}
