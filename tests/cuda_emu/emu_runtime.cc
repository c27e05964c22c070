// The emulator's host runtime (emu_runtime.h says what it emulates): its
// state, the controls and counts the tests read, and the device queries.
// The rest, by concept:
//
//   emu_memory.cc   device and pinned memory, the host-access fault
//   emu_copy.cc     copies and memsets
//   emu_stream.cc   streams and events
//   emu_graph.cc    stream capture, graphs and their replay
//
// emu_runtime_internal.h holds what they share.

#include "emu_runtime_internal.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

using namespace kvf_emu::detail;

namespace kvf_emu
{
namespace detail
{

runtime::runtime()
{
    page = (size_t)sysconf(_SC_PAGESIZE);
    const char *m = getenv("KVF_EMU_STREAMS");
    if (m && strcmp(m, "deferred") == 0)
        mode = stream_mode::deferred;
    else if (m && *m && strcmp(m, "immediate") != 0)
        fprintf(stderr, "cuda emu: KVF_EMU_STREAMS=%s: not deferred or immediate; immediate\n", m);
}

runtime &rt()
{
    static runtime *r = new runtime;
    return *r;
}

void misuse(const char *fmt, ...)
{
    fprintf(stderr, "cuda emu: ");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

cudaError_t fail(cudaError_t err)
{
    set_last_error(err);
    return err;
}

bool no_device()
{
    return rt().device_count <= 0;
}

} // namespace detail

// ---- controls and counts -----------------------------------------------------

void set_device_count(int n)
{
    rt().device_count = n;
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

void blas_handle_count(int delta)
{
    rt().blas_handles += (size_t)delta;
}

void count_gemm()
{
    rt().st.gemms++;
}

} // namespace kvf_emu

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
    if (no_device())
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
    if (no_device())
        return fail(cudaErrorNoDevice);
    *device = rt().device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device)
{
    if (!prop)
        return fail(cudaErrorInvalidValue);
    if (no_device())
        return fail(cudaErrorNoDevice);
    if (device < 0 || device >= rt().device_count)
        return fail(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof(*prop));
    snprintf(prop->name, sizeof(prop->name), "kvferry CUDA emulator (CPU)");
    prop->totalGlobalMem = k_total_device_bytes;
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
    *version = no_device() ? 0 : 13000;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    if (unsafe_during_capture("cudaDeviceSynchronize"))
        return fail(cudaErrorStreamCaptureUnsupported);
    flush_all(false);
    cudaError_t err = take_async_error();
    return err != cudaSuccess ? fail(err) : cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    if (!free_bytes || !total_bytes)
        return fail(cudaErrorInvalidValue);
    if (no_device())
        return fail(cudaErrorNoDevice);
    *total_bytes = k_total_device_bytes;
    *free_bytes = k_total_device_bytes - rt().device_bytes;
    return cudaSuccess;
}
