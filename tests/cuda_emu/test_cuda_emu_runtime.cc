// The emulated runtime (emu_runtime.h) against what CUDA documents: device
// memory (poison, bounds, copy directions, host access and use after free
// crash), deferred streams and events, graph capture and replay and the
// calls a capture forbids, the device queries.
#include <cuda_runtime.h>

#include "test_cuda_emu.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>

namespace kvf_emu_test
{
namespace
{

// x[i] += v for i < n (one CTA of 64 threads per 64 elements).
__global__ void emu_add_kernel(float *x, float v, int n)
{
    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n)
        x[i] += v;
}

void add_on(cudaStream_t s, float *x, float v, int n)
{
    kvf_emu::launch(emu_add_kernel, (unsigned)(n + 63) / 64, 64, 0, s)(x, v, n);
}

// Runs f in a child process (its stderr silenced): true when the child
// dies (a signal, or a sanitizer's exit) rather than returning.
template <typename F> bool child_crashes(F f)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        if (fd >= 0)
            dup2(fd, 2);
        f();
        _exit(0);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid)
        return false;
    return !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

} // namespace

void test_runtime_memory()
{
    check c("emulated runtime: device memory (poison, bounds, direction, counts, host access)");
    kvf_emu::runtime_stats st0 = kvf_emu::get_runtime_stats();
    size_t free0 = 0, total = 0;
    if (cudaMemGetInfo(&free0, &total) != cudaSuccess || total != (size_t)16 << 30)
        c.fail("cudaMemGetInfo: %zu of %zu bytes", free0, total);
    float *d = nullptr;
    if (cudaMalloc(&d, 100 * sizeof(float)) != cudaSuccess || !d || (uintptr_t)d % 256 != 0)
        c.fail("cudaMalloc of 400 bytes: %p", (void *)d);
    size_t free1 = 0;
    cudaMemGetInfo(&free1, &total);
    if (free0 - free1 != 400)
        c.fail("cudaMemGetInfo: free went from %zu to %zu", free0, free1);
    for (float v : download(d, 100))
        if (!isnan(v)) {
            c.fail("fresh device memory reads %g, not the NaN poison", v);
            break;
        }
    std::vector<float> h(101, 1.0f);
    printf("      (4 refused copies and 2 refused frees expected below)\n");
    if (cudaMemcpy(d, h.data(), 101 * sizeof(float), cudaMemcpyHostToDevice) !=
        cudaErrorInvalidValue)
        c.fail("a copy past the end of an allocation was not refused");
    if (cudaGetLastError() != cudaErrorInvalidValue)
        c.fail("a refused copy left no error for cudaGetLastError");
    if (cudaMemcpy(h.data(), d, 4, cudaMemcpyHostToDevice) != cudaErrorInvalidValue)
        c.fail("a copy against its direction was not refused");
    if (cudaMemcpy(d + 1, h.data(), 4, cudaMemcpyDeviceToHost) != cudaErrorInvalidValue)
        c.fail("a device-to-host copy from host memory was not refused");
    if (cudaMemcpyAsync(d, h.data(), 4, cudaMemcpyHostToDevice, (cudaStream_t)h.data()) !=
        cudaErrorInvalidResourceHandle)
        c.fail("a copy on a stream that is not one was not refused");
    if (cudaFree(d + 1) != cudaErrorInvalidValue || cudaFreeHost(d) != cudaErrorInvalidValue)
        c.fail("freeing what is not an allocation's start (or of the other kind) was not refused");
    cudaGetLastError();
    upload(d, std::vector<float>(100, 2.5f));
    if (cudaMemset(d + 50, 0, 50 * sizeof(float)) != cudaSuccess)
        c.fail("cudaMemset failed");
    std::vector<float> back = download(d, 100);
    if (back[49] != 2.5f || back[50] != 0.0f || back[99] != 0.0f)
        c.fail("upload / memset / download: %g %g %g", back[49], back[50], back[99]);
    // On a GPU the host cannot touch device memory, a run past an
    // allocation faults, freed memory is gone: all three crash here too.
    if (!child_crashes([&] { *(volatile float *)d = 1.0f; }))
        c.fail("a host write to device memory did not crash");
    // (400 bytes end where a page ends, 512 rounded: index 128 is past it.)
    if (!child_crashes([&] { add_on(nullptr, d, 1.0f, 129); }))
        c.fail("a kernel writing past an allocation did not crash");
    float *pinned = nullptr;
    if (cudaMallocHost(&pinned, 8 * sizeof(float)) != cudaSuccess)
        c.fail("cudaMallocHost failed");
    pinned[0] = 3.0f; // the host's own memory
    if (cudaFree(d) != cudaSuccess || cudaFreeHost(pinned) != cudaSuccess)
        c.fail("cudaFree / cudaFreeHost failed");
    if (!child_crashes([&] { add_on(nullptr, d, 1.0f, 8); }))
        c.fail("a kernel writing freed device memory did not crash");
    kvf_emu::fail_allocation_after(1);
    float *a = nullptr, *b = nullptr;
    cudaError_t ea = cudaMalloc(&a, 64), eb = cudaMalloc(&b, 64);
    if (ea != cudaSuccess || eb != cudaErrorMemoryAllocation ||
        cudaGetLastError() != cudaErrorMemoryAllocation)
        c.fail("fail_allocation_after(1): %s, %s", cudaGetErrorName(ea), cudaGetErrorName(eb));
    cudaFree(a);
    kvf_emu::runtime_stats st1 = kvf_emu::get_runtime_stats();
    if (st1.device_allocations != st0.device_allocations ||
        st1.pinned_allocations != st0.pinned_allocations || st1.device_bytes != st0.device_bytes)
        c.fail("live allocations: %zu device, %zu pinned after, %zu and %zu before",
               st1.device_allocations, st1.pinned_allocations, st0.device_allocations,
               st0.pinned_allocations);
}

void test_runtime_streams()
{
    check c("emulated runtime: deferred streams, events, pinned copies, kernel arguments");
    kvf_emu::set_stream_mode(kvf_emu::stream_mode::deferred);
    cudaStream_t s1 = nullptr, s2 = nullptr;
    cudaEvent_t e = nullptr;
    float *d = nullptr, *pinned = nullptr;
    if (cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) != cudaSuccess ||
        cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess ||
        cudaMalloc(&d, 64 * sizeof(float)) != cudaSuccess ||
        cudaMallocHost(&pinned, 64 * sizeof(float)) != cudaSuccess) {
        c.fail("setup failed");
        return;
    }
    cudaMemsetAsync(d, 0, 64 * sizeof(float), s1);
    add_on(s1, d, 1.5f, 64);
    if (cudaGetLastError() != cudaSuccess)
        c.fail("a launch on a stream failed");
    cudaEventRecord(e, s1);
    cudaStreamWaitEvent(s2, e, 0);
    cudaMemcpyAsync(pinned, d, 64 * sizeof(float), cudaMemcpyDeviceToHost, s2);
    if (!isnan(pinned[0]))
        c.fail("deferred: the copy into pinned memory ran before the host waited (%g)", pinned[0]);
    if (cudaStreamSynchronize(s2) != cudaSuccess || pinned[0] != 1.5f || pinned[63] != 1.5f)
        c.fail("s2 waited for s1's event: %g %g, want 1.5", pinned[0], pinned[63]);
    // An event recorded before more work on s1: waiting for it leaves that
    // work queued.
    add_on(s1, d, 1.0f, 64);
    cudaEventRecord(e, s1);
    add_on(s1, d, 100.0f, 64);
    cudaEventSynchronize(e);
    cudaMemcpyAsync(pinned, d, 4, cudaMemcpyDeviceToHost, s2); // no wait: races s1
    cudaStreamSynchronize(s2);
    if (pinned[0] != 2.5f)
        c.fail("the copy saw %g, want s1 up to the event (2.5)", pinned[0]);
    cudaStreamSynchronize(s1);
    if (download(d, 1)[0] != 102.5f)
        c.fail("s1 after its sync: %g, want 102.5", download(d, 1)[0]);
    // The legacy stream's memset is asynchronous: a non-blocking stream does
    // not wait for it.
    cudaMemset(d, 0, 4);
    cudaMemcpyAsync(pinned, d, 4, cudaMemcpyDeviceToHost, s2);
    cudaStreamSynchronize(s2);
    if (pinned[0] != 102.5f)
        c.fail("a non-blocking stream waited for the legacy stream (%g)", pinned[0]);
    cudaDeviceSynchronize();
    if (download(d, 1)[0] != 0.0f)
        c.fail("the legacy memset did not run by cudaDeviceSynchronize");
    // A kernel argument on a created stream must be memory the device
    // reaches.
    std::vector<float> host(64, 0.0f);
    unsigned long long faults = kvf_emu::faults();
    printf("      (1 emulator fault message expected below)\n");
    add_on(s1, host.data(), 1.0f, 64);
    add_on(s1, pinned, 1.0f, 64); // pinned: reachable
    cudaStreamSynchronize(s1);
    if (kvf_emu::faults() != faults + 1 || cudaGetLastError() != cudaErrorIllegalAddress)
        c.fail("a pageable host pointer given to a kernel on a stream was not a fault");
    if (host[0] != 0.0f || pinned[0] != 103.5f)
        c.fail("the refused launch ran (%g), or the pinned one did not (%g)", host[0], pinned[0]);
    kvf_emu::set_stream_mode(kvf_emu::stream_mode::immediate);
    if (cudaEventDestroy(e) != cudaSuccess || cudaStreamDestroy(s1) != cudaSuccess ||
        cudaStreamDestroy(s2) != cudaSuccess || cudaFree(d) != cudaSuccess ||
        cudaFreeHost(pinned) != cudaSuccess)
        c.fail("teardown failed");
}

namespace
{

// What the graph cases share: two non-blocking streams, three events and
// 64 floats of device memory.
struct graph_rig {
    cudaStream_t s = nullptr, s2 = nullptr;
    cudaEvent_t outside = nullptr, fork = nullptr, join = nullptr;
    float *d = nullptr;
};

// Recorded, not run; every replay runs it again, on what memory holds
// then. Returns the executable graph (the caller destroys it).
cudaGraphExec_t capture_and_replay(check &c, graph_rig &r)
{
    cudaGraph_t g = nullptr;
    cudaGraphExec_t x = nullptr;
    if (cudaStreamBeginCapture(r.s, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
        c.fail("cudaStreamBeginCapture failed");
    cudaStreamCaptureStatus cs;
    if (cudaStreamIsCapturing(r.s, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusActive)
        c.fail("the stream does not say it is capturing");
    add_on(r.s, r.d, 1.0f, 64);
    add_on(r.s, r.d, 2.0f, 32);
    if (cudaStreamEndCapture(r.s, &g) != cudaSuccess || !g)
        c.fail("cudaStreamEndCapture failed");
    if (download(r.d, 1)[0] != 0.0f)
        c.fail("a captured launch ran");
    if (cudaGraphInstantiate(&x, g, 0) != cudaSuccess)
        c.fail("cudaGraphInstantiate failed");
    cudaGraphDestroy(g); // the executable graph keeps its nodes
    cudaGraphLaunch(x, r.s);
    cudaGraphLaunch(x, r.s);
    cudaStreamSynchronize(r.s);
    std::vector<float> v = download(r.d, 64);
    if (v[0] != 6.0f || v[40] != 2.0f)
        c.fail("two replays: %g and %g, want 6 and 2", v[0], v[40]);
    return x;
}

// What a capture forbids: it fails and the end gives no graph.
void forbidden_in_capture(check &c, graph_rig &r)
{
    printf("      (7 refused calls expected below)\n");
    struct forbidden {
        const char *what;
        cudaError_t want;
        std::function<cudaError_t()> call;
    };
    float *extra = nullptr;
    cudaEventRecord(r.outside, r.s2);
    const forbidden cases[] = {
        {"cudaMalloc", cudaErrorStreamCaptureUnsupported, [&] { return cudaMalloc(&extra, 256); }},
        {"cudaStreamSynchronize", cudaErrorStreamCaptureUnsupported,
         [&] { return cudaStreamSynchronize(r.s); }},
        {"cudaMemcpy", cudaErrorStreamCaptureUnsupported,
         [&] {
             float one = 1.0f;
             return cudaMemcpy(r.d, &one, 4, cudaMemcpyHostToDevice);
         }},
        {"cudaFree", cudaErrorStreamCaptureUnsupported, [&] { return cudaFree(r.d); }},
        {"a wait for an event recorded outside the capture", cudaErrorStreamCaptureIsolation,
         [&] { return cudaStreamWaitEvent(r.s, r.outside, 0); }},
    };
    for (const forbidden &f : cases) {
        cudaGraph_t g = nullptr;
        cudaStreamBeginCapture(r.s, cudaStreamCaptureModeThreadLocal);
        add_on(r.s, r.d, 1.0f, 64);
        cudaError_t err = f.call();
        cudaError_t end = cudaStreamEndCapture(r.s, &g);
        if (err != f.want || end != cudaErrorStreamCaptureInvalidated || g)
            c.fail("%s during a capture: %s, the end %s", f.what, cudaGetErrorName(err),
                   cudaGetErrorName(end));
        cudaGetLastError();
    }
    if (extra)
        c.fail("cudaMalloc during a capture allocated");
}

// A stream forked into a capture: refused when it does not join back;
// joined, both branches replay. *g_p and *x_p: the joined graph and its
// executable graph (the caller destroys them).
void fork_and_join(check &c, graph_rig &r, cudaGraph_t *g_p, cudaGraphExec_t *x_p)
{
    cudaGraph_t g = nullptr;
    cudaStreamBeginCapture(r.s, cudaStreamCaptureModeThreadLocal);
    cudaEventRecord(r.fork, r.s);
    cudaStreamWaitEvent(r.s2, r.fork, 0);
    add_on(r.s2, r.d, 10.0f, 64);
    if (cudaStreamEndCapture(r.s, &g) != cudaErrorStreamCaptureUnjoined || g)
        c.fail("an unjoined fork was not refused");
    cudaGetLastError();
    cudaStreamBeginCapture(r.s, cudaStreamCaptureModeThreadLocal);
    cudaEventRecord(r.fork, r.s);
    cudaStreamWaitEvent(r.s2, r.fork, 0);
    add_on(r.s2, r.d, 10.0f, 64);
    cudaEventRecord(r.join, r.s2);
    cudaStreamWaitEvent(r.s, r.join, 0);
    add_on(r.s, r.d, 1.0f, 64);
    if (cudaEventSynchronize(r.join) != cudaErrorCapturedEvent)
        c.fail("waiting on the host for an event recorded in an open capture was allowed");
    cudaGetLastError();
    if (cudaStreamEndCapture(r.s, &g) != cudaSuccess || !g)
        c.fail("a joined fork was refused");
    cudaGraphExec_t x = nullptr;
    cudaGraphInstantiate(&x, g, 0);
    cudaGraphLaunch(x, r.s);
    cudaStreamSynchronize(r.s);
    if (download(r.d, 1)[0] != 17.0f)
        c.fail("the forked capture replayed to %g, want 17", download(r.d, 1)[0]);
    *g_p = g;
    *x_p = x;
}

} // namespace

void test_runtime_graphs()
{
    check c("emulated runtime: graph capture, replay and the calls a capture forbids");
    graph_rig r;
    cudaStreamCreateWithFlags(&r.s, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&r.s2, cudaStreamNonBlocking);
    cudaEventCreate(&r.outside);
    cudaEventCreate(&r.fork);
    cudaEventCreate(&r.join);
    cudaMalloc(&r.d, 64 * sizeof(float));
    upload(r.d, std::vector<float>(64, 0.0f));
    kvf_emu::runtime_stats st0 = kvf_emu::get_runtime_stats();

    cudaGraphExec_t x = capture_and_replay(c, r);
    forbidden_in_capture(c, r);
    cudaGraph_t g = nullptr;
    cudaGraphExec_t x2 = nullptr;
    fork_and_join(c, r, &g, &x2);

    kvf_emu::runtime_stats st1 = kvf_emu::get_runtime_stats();
    if (st1.captures - st0.captures != 2 || st1.replays - st0.replays != 3)
        c.fail("%llu captures and %llu replays counted, want 2 and 3", st1.captures - st0.captures,
               st1.replays - st0.replays);
    cudaGraphDestroy(g);
    cudaGraphExecDestroy(x);
    cudaGraphExecDestroy(x2);
    cudaEventDestroy(r.outside);
    cudaEventDestroy(r.fork);
    cudaEventDestroy(r.join);
    cudaStreamDestroy(r.s);
    cudaStreamDestroy(r.s2);
    cudaFree(r.d);
    if (cudaGetLastError() != cudaSuccess)
        c.fail("an error was left behind");
}

void test_runtime_device()
{
    check c("emulated runtime: one device (sm_90, 8 SMs), or none");
    int n = -1, sms = 0, major = 0;
    cudaDeviceProp p;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n != 1 ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess ||
        sms != 8 || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) ||
        major != 9 || cudaGetDeviceProperties(&p, 0) != cudaSuccess || p.major != 9 ||
        p.multiProcessorCount != 8)
        c.fail("device 0: count %d, %d SMs, sm_%d", n, sms, major);
    if (cudaSetDevice(1) != cudaErrorInvalidDevice)
        c.fail("cudaSetDevice(1) succeeded");
    cudaGetLastError();
    kvf_emu::set_device_count(0);
    float *d = nullptr;
    if (cudaGetDeviceCount(&n) != cudaErrorNoDevice || n != 0 ||
        cudaMalloc(&d, 4) != cudaErrorNoDevice)
        c.fail("without a device: count %d", n);
    kvf_emu::set_device_count(1);
    cudaGetLastError();
}

} // namespace kvf_emu_test
