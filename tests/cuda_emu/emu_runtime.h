// The CUDA runtime's host API under the CPU emulator (emu.h): device
// memory, pinned host memory, copies, streams, events, graphs and device
// queries, as the CUDA backend (cuda_backend.cu) uses them; <cublas_v2.h>
// (include/) adds the GEMMs. Reached through include/cuda_runtime.h;
// emu_runtime.cc and the files it lists implement it. One device, "sm_90"
// with 8 multiprocessors and 16 GiB.
//
// What is emulated:
//  - Device memory (cudaMalloc) is host memory the host cannot touch: each
//    allocation has pages of its own between guard pages, filled with 0xff
//    bytes (NaN as f32, bf16 and f16, -1 as int) so that reading what
//    nothing wrote shows, and kept PROT_NONE except while device work runs.
//    A host access (a device pointer dereferenced in host code) is a
//    SIGSEGV, as a read past an allocation's end is. Pinned host memory
//    (cudaMallocHost, cudaHostAlloc) is ordinary memory (ASan sees its
//    bounds), reachable by both sides as on a UVA system. Every copy, memset
//    and GEMM checks that its device ranges lie inside one allocation and
//    that its direction matches the pointers.
//  - Streams run their work in order on the calling thread. Immediate mode
//    (the default) runs it when it is given; deferred mode
//    (set_stream_mode(), or KVF_EMU_STREAMS=deferred in the environment)
//    queues it until the host waits for it (cudaStreamSynchronize, an
//    event, a call that waits for the device or for the legacy stream), as
//    a GPU that is very slow would: a missing wait or cross-stream
//    dependency then reads stale or poisoned data. That includes the legacy
//    stream (nullptr), which waits for the blocking streams and they for it,
//    while streams made with cudaStreamNonBlocking do neither: cudaMemset
//    and device-to-device cudaMemcpy are queued on it as CUDA documents
//    them asynchronous. The kernel tests launch on the legacy stream and
//    read the results straight away: immediate mode.
//  - Copies complete when CUDA's API synchronization behavior says: by the
//    return into host memory (a device-to-pinned copy on a stream excepted)
//    and for cudaMemcpy from pinned memory; a pageable source is read at
//    the call and the device write queued (the driver's staging buffer).
//  - Events mark a point in a stream; waiting for one (cudaEventSynchronize,
//    cudaStreamWaitEvent) runs that stream up to it in deferred mode.
//  - Graph capture: cudaStreamBeginCapture switches a created stream to
//    recording. Launches, copies, memsets, GEMMs, graph launches and event
//    waits given to it become nodes of the capture instead of running;
//    cudaStreamWaitEvent on an event recorded in the capture forks another
//    stream into it (it must join back, cudaErrorStreamCaptureUnjoined
//    otherwise). cudaStreamEndCapture returns the graph, cudaGraphInstantiate
//    copies it, cudaGraphLaunch replays the nodes in capture order (an order
//    the dependencies allow). As in CUDA, what the capture forbids fails and
//    invalidates it (the end then returns cudaErrorStreamCaptureInvalidated
//    and no graph): in a capture not begun in relaxed mode, an unsafe call
//    from the capturing thread (cudaMalloc, cudaMallocHost, cudaHostAlloc,
//    cudaFree, cudaFreeHost, cudaMemcpy, cudaMemset, cudaDeviceSynchronize);
//    cudaStreamSynchronize or cudaStreamQuery of a capturing stream; waiting
//    in a capture for an event recorded outside it
//    (cudaErrorStreamCaptureIsolation); cudaEventSynchronize or
//    cudaEventQuery of an event recorded in a capture still open
//    (cudaErrorCapturedEvent).
//  - Errors: each call checks its arguments and returns the runtime's error
//    (printed to stderr when it is a misuse). A kernel fault during queued
//    or replayed work comes back from the next call that waits
//    (cudaErrorLaunchFailure).
//  - Resource counts (get_runtime_stats(), report_leaks()) so tests can
//    require that everything created was destroyed.
//
// Limits: one device and one host thread driving it (the state is global
// and unlocked); no timing (cudaEventElapsedTime is not provided); no
// concurrency between streams; flags and priorities are accepted and
// ignored.
#ifndef KVF_CUDA_EMU_RUNTIME_API_H
#define KVF_CUDA_EMU_RUNTIME_API_H

#include <stddef.h>
#include <stdio.h>

#include "emu.h"

typedef struct CUevent_st *cudaEvent_t;
typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;

// The values of the real enums and flags.
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2,
};

enum cudaStreamCaptureStatus {
    cudaStreamCaptureStatusNone = 0,
    cudaStreamCaptureStatusActive = 1,
    cudaStreamCaptureStatusInvalidated = 2,
};

enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1,
    cudaDevAttrMaxSharedMemoryPerBlock = 8,
    cudaDevAttrWarpSize = 10,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrL2CacheSize = 38,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};

#define cudaStreamDefault          0x00
#define cudaStreamNonBlocking      0x01
#define cudaEventDefault           0x00
#define cudaEventBlockingSync      0x01
#define cudaEventDisableTiming     0x02
#define cudaHostAllocDefault       0x00
#define cudaHostAllocPortable      0x01
#define cudaHostAllocMapped        0x02
#define cudaHostAllocWriteCombined 0x04

// The fields of the real struct that code reads (its others are absent).
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    size_t sharedMemPerBlockOptin;
    int warpSize;
    int maxThreadsPerBlock;
    int major, minor;
    int multiProcessorCount;
    int l2CacheSize;
};

// ---- device ----------------------------------------------------------------

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device);
cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device);
cudaError_t cudaRuntimeGetVersion(int *version);
cudaError_t cudaDriverGetVersion(int *version);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);

// ---- memory ----------------------------------------------------------------

cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned int flags);
cudaError_t cudaFreeHost(void *p);

// The runtime's C++ conveniences.
template <typename T> cudaError_t cudaMalloc(T **p, size_t bytes)
{
    return cudaMalloc((void **)p, bytes);
}
template <typename T> cudaError_t cudaMallocHost(T **p, size_t bytes)
{
    return cudaMallocHost((void **)p, bytes);
}
template <typename T> cudaError_t cudaHostAlloc(T **p, size_t bytes, unsigned int flags)
{
    return cudaHostAlloc((void **)p, bytes, flags);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind,
                              cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void *p, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t stream = nullptr);

// ---- streams and events ------------------------------------------------------

cudaError_t cudaStreamCreate(cudaStream_t *stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags = 0);

cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);

// ---- graphs ----------------------------------------------------------------

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus *status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);

namespace kvf_emu
{

// ---- controls and counts (tests) -------------------------------------------

enum class stream_mode {
    immediate, // work runs when it is given
    deferred,  // work runs when the host waits for it
};
// The initial mode is KVF_EMU_STREAMS from the environment ("deferred" or
// "immediate"), immediate if unset. Change it only with no work queued.
void set_stream_mode(stream_mode m);
stream_mode get_stream_mode();

// Devices cudaGetDeviceCount reports (1; 0 emulates a machine without a
// GPU, where the other calls fail with cudaErrorNoDevice).
void set_device_count(int n);

// Makes the next n allocations (cudaMalloc, cudaMallocHost, cudaHostAlloc)
// succeed and the one after fail with cudaErrorMemoryAllocation, once; -1
// (the initial state): none fails. For tests of error paths.
void fail_allocation_after(long n);

struct runtime_stats {
    // Live now.
    size_t device_allocations, device_bytes;
    size_t pinned_allocations, pinned_bytes;
    size_t streams, events, graphs, graph_execs, blas_handles;
    // Counted since the start.
    unsigned long long kernels;            // kernel launches run (replays included)
    unsigned long long gemms;              // cublasGemmEx run (replays included)
    unsigned long long copies;             // memcpys and memsets run (replays included)
    unsigned long long captures;           // graphs captured (cudaStreamEndCapture with a graph)
    unsigned long long replays;            // cudaGraphLaunch run
    unsigned long long deferred;           // work items queued in deferred mode
    unsigned long long failed_allocations; // made to fail by fail_allocation_after()
};
runtime_stats get_runtime_stats();

// Prints each live runtime resource (device and pinned allocations with
// their sizes, streams, events, graphs, cuBLAS handles) to out; returns how
// many there are.
size_t report_leaks(FILE *out);

// Whether [p, p + bytes) lies in one device allocation (false for pinned
// host memory).
bool is_device_range(const void *p, size_t bytes);

// ---- for include/cublas_v2.h -------------------------------------------------

// Counts cuBLAS handles in runtime_stats.
void blas_handle_count(int delta);
// Counts a GEMM run.
void count_gemm();
// Checks that [p, p + bytes) is memory the device reaches (device or
// pinned): a host_fault naming what otherwise.
bool device_reachable(const void *p, size_t bytes, const char *what);

} // namespace kvf_emu

#endif
