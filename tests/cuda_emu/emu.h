// A CPU emulator for the part of CUDA our code uses, so that CI machines
// without a GPU run the real code of common/backend/cuda/*.cu: the kernels
// and the backend that drives them. The .cu files are compiled as C++
// against this header: cu_to_cc.cmake rewrites the launch and __shared__
// syntax, include/ stands in for <cuda_runtime.h>, <cuda_bf16.h>,
// <cuda_fp16.h>, <mma.h> (warp matrix products) and <cublas_v2.h>. Device
// code runs here (emu.cc and the files it lists); the host API (memory,
// streams, events, graphs, device queries, cuBLAS) is emu_runtime.h
// (emu_runtime.cc lists its files).
//
// What is emulated:
//  - A launch runs on the calling thread, CTA after CTA (blockIdx.x
//    fastest, then y, then z), when its stream runs it (emu_runtime.h): at
//    once on the legacy stream (nullptr, what the kernel tests use), queued
//    or recorded into a graph on a created stream.
//  - Every CUDA thread of a CTA is a fiber with its own stack, on one OS
//    thread. Fibers switch only at synchronization points (__syncthreads,
//    __syncwarp, warp shuffles, mma_sync, thread exit), so a thread runs
//    alone from one point to the next. Which runnable thread goes next is
//    set_order(): the lowest thread index (forward) or the highest
//    (reverse). Warps thus reach the code between two barriers first to
//    last or last to first, one running as far as it can before the next,
//    and lanes likewise. A kernel whose output depends on the order has a
//    race between two sync points (two threads write one location, or one
//    reads what another writes without a barrier between): the tests run
//    every launch in both orders and require identical bytes.
//  - __syncthreads waits for every thread of the CTA that has not exited
//    (sm_70 and later); warp operations wait for all 32 lanes of the warp.
//  - Shared memory (dynamic and static __shared__) is a fresh buffer per
//    CTA, filled with 0xff bytes (NaN as f32, -1 as int) so that reading
//    what no thread wrote shows in the results. Writes past the dynamic
//    size are reported; under ASan every access past it is.
//  - Launch checks as on an H100/H200: at most 1024 threads per block,
//    grid.y and grid.z at most 65535, dynamic shared memory above 48 KiB only
//    after cudaFuncSetAttribute(MaxDynamicSharedMemorySize), at most 227 KiB.
//    A refused launch runs nothing and its error comes back from
//    cudaGetLastError(), as on the device. On a created stream, a pointer
//    argument must be device memory (cudaMalloc) or pinned host memory, as
//    a GPU can reach no other (a fault otherwise).
//  - Faults: threads waiting at different barriers (a deadlock on the
//    device), a warp operation one of whose lanes exited or that the lanes
//    reach with different masks, a partial-warp mask. Each is printed with
//    the CTA and thread, stops the launch (later CTAs do not run) and makes
//    the next cudaGetLastError() return cudaErrorLaunchFailure (not sticky,
//    unlike the device's); faults() counts them.
//
// Limits (what this does not find):
//  - No memory model beyond the sync points: a thread's writes are seen by
//    the others at once. A missing __threadfence or volatile goes unnoticed,
//    and so does a race that gives the same bytes in both orders.
//  - No timing and no concurrency between CTAs: a kernel that waits for
//    another CTA (a grid-wide spin) never finishes.
//  - Not provided, so a kernel using them does not compile: atomics, warp
//    votes and matches, shuffles other than xor, textures, cooperative
//    groups.
//  - Device math is the host's libm (expf, sqrtf): within an ulp or two of
//    the device's, not bit-equal; nvcc contracts a * b + c into fmaf where
//    g++ does not; tensor cores round their sums their own way. Comparisons
//    need a tolerance of a few f32 ulps.
//  - One launch at a time per process: the state is global, and a kernel
//    must not launch kernels.
#ifndef KVF_CUDA_EMU_H
#define KVF_CUDA_EMU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

// ---- qualifiers ------------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__    __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) alignas(n)

// ---- runtime types ---------------------------------------------------------

struct uint3 {
    unsigned x, y, z;
};

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz)
    {
    }
};

typedef struct CUstream_st *cudaStream_t;

// The values of the real enum, for the errors the emulator gives.
enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidPitchValue = 12,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorIllegalState = 401,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchFailure = 719,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorStreamCaptureUnmatched = 903,
    cudaErrorStreamCaptureUnjoined = 904,
    cudaErrorStreamCaptureIsolation = 905,
    cudaErrorStreamCaptureImplicit = 906,
    cudaErrorCapturedEvent = 907,
    cudaErrorStreamCaptureWrongThread = 908,
};
typedef enum cudaError cudaError_t;

enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};

// Built-in variables of the running thread. Set by the emulator on every
// switch; kernels only read them.
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;

namespace kvf_emu
{

// Which runnable thread of a CTA runs next, at every switch.
enum class order {
    forward, // the lowest linear thread index
    reverse, // the highest
};
void set_order(order o);

struct stats {
    unsigned long long launches; // launch attempts, refused ones included
    unsigned long long grids;    // launches run (a replayed graph's count again)
    unsigned long long ctas;     // CTAs run
    unsigned long long switches; // fiber switches
    size_t max_dynamic_smem;     // largest dynamic shared memory of a launch (bytes)
};
stats get_stats();

// Faults found so far (each was printed when found).
unsigned long long faults();

// Static __shared__ storage of one declaration: one buffer per CTA.
struct shared_slot {
    unsigned long long cta; // the CTA (serial number) that buffer belongs to; 0: none
    void *buffer;
};

// ---- called by the builtins, include/mma.h and the converted .cu code ----
void sync_block();
void sync_warp(unsigned mask);
uint32_t shfl_xor(unsigned mask, uint32_t bits, int lane_mask, int width);
// A warp operation on what every lane holds (mma_sync): when the last lane
// of the warp arrives, complete(args, lanes) runs once, args[lane] being
// each lane's arg, then all go on. complete must be the same in every lane.
void warp_collective(unsigned mask, void *arg, void (*complete)(void *const *args, unsigned lanes));
void *dynamic_smem();
void *static_smem(shared_slot *slot, size_t bytes, size_t align);
cudaError_t set_max_dynamic_smem(const void *kernel, int bytes);
cudaError_t last_error(bool clear);
// Sets the error the next cudaGetLastError() returns (the runtime's failing
// calls).
void set_last_error(cudaError_t err);
// A fault found on the host side (emu_memory.cc: a launch or a cuBLAS
// call given memory the device cannot reach): printed, counted in faults(),
// and err becomes the last error.
void host_fault(cudaError_t err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// A launch in two steps, as the device takes it: admit() checks the
// configuration when the launch is made (counted in stats; a refused one
// sets the error and returns false), execute() runs the grid when the
// stream gets to it: body() is the kernel call with its arguments, run once
// per thread; a fault sets the error.
bool admit(const void *kernel, dim3 grid, dim3 block, size_t smem);
void execute(const void *kernel, dim3 grid, dim3 block, size_t smem,
             const std::function<void()> &body);
// Both at once.
void run(const void *kernel, dim3 grid, dim3 block, size_t smem, const std::function<void()> &body);

// Gives work to a stream (emu_stream.cc): op runs now, later or on every
// replay of the graph the stream is capturing, as the stream dictates.
// what names it in messages. Returns the error a launch into that stream
// gets (a capture broken by it, a destroyed stream).
cudaError_t submit(cudaStream_t stream, std::function<void()> op, const char *what);
// On a created stream, a kernel's pointer argument i must be memory the
// device reaches: false (after a host_fault) when it is not.
bool device_reachable_arg(cudaStream_t stream, const void *kernel, int i, const void *p);

template <typename T> bool reachable_arg(cudaStream_t, const void *, int, const T &)
{
    return true;
}
template <typename T> bool reachable_arg(cudaStream_t s, const void *kernel, int i, T *p)
{
    return device_reachable_arg(s, kernel, i, (const void *)p);
}

// kernel<<<grid, block, smem, stream>>>(args) is rewritten to
// launch(kernel, grid, block, smem, stream)(args).
template <typename... P> class launcher
{
  public:
    launcher(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream)
        : kernel_(kernel), grid_(grid), block_(block), smem_(smem), stream_(stream)
    {
    }
    template <typename... A> void operator()(A &&...args) const
    {
        // Converted to the parameter types once, as a launch copies them to
        // the device; every thread then gets its own by-value copy.
        std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
        if (!admit((const void *)kernel_, grid_, block_, smem_) ||
            !args_reachable(params, std::index_sequence_for<P...>{}))
            return;
        void (*kernel)(P...) = kernel_;
        const dim3 grid = grid_, block = block_;
        const size_t smem = smem_;
        cudaError_t err = submit(
            stream_,
            [=] {
                execute((const void *)kernel, grid, block, smem,
                        [&] { std::apply(kernel, params); });
            },
            "kernel launch");
        if (err != cudaSuccess)
            set_last_error(err);
    }

  private:
    template <typename T, size_t... I>
    bool args_reachable(const T &params, std::index_sequence<I...>) const
    {
        return (reachable_arg(stream_, (const void *)kernel_, (int)I, std::get<I>(params)) && ...);
    }

    void (*kernel_)(P...);
    dim3 grid_, block_;
    size_t smem_;
    cudaStream_t stream_;
};

template <typename... P>
launcher<P...> launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem = 0,
                      cudaStream_t stream = nullptr)
{
    return launcher<P...>(kernel, grid, block, smem, stream);
}

// Lane of the running thread in its warp (warps are runs of 32 linear
// thread indices, x fastest).
inline unsigned lane()
{
    return ((threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x) % 32;
}

} // namespace kvf_emu

// __shared__ T name dims; (cu_to_cc.cmake): a reference to this CTA's copy,
// which the first thread to get there allocates.
// clang-format off
#define KVF_EMU_SHARED(T, name, dims)                                                              \
    static kvf_emu::shared_slot name##_kvf_emu_slot;                                               \
    T(&name) dims = *static_cast<T(*) dims>(                                                       \
        kvf_emu::static_smem(&name##_kvf_emu_slot, sizeof(T dims), alignof(T dims)))
// clang-format on

// ---- device builtins -------------------------------------------------------

inline void __syncthreads(void)
{
    kvf_emu::sync_block();
}

inline void __syncwarp(unsigned mask = 0xffffffffu)
{
    kvf_emu::sync_warp(mask);
}

inline unsigned __shfl_xor_sync(unsigned mask, unsigned v, int lane_mask, int width = 32)
{
    return kvf_emu::shfl_xor(mask, v, lane_mask, width);
}

inline int __shfl_xor_sync(unsigned mask, int v, int lane_mask, int width = 32)
{
    return (int)kvf_emu::shfl_xor(mask, (uint32_t)v, lane_mask, width);
}

inline float __shfl_xor_sync(unsigned mask, float v, int lane_mask, int width = 32)
{
    uint32_t bits;
    memcpy(&bits, &v, sizeof(bits));
    bits = kvf_emu::shfl_xor(mask, bits, lane_mask, width);
    memcpy(&v, &bits, sizeof(v));
    return v;
}

template <typename T> inline T __ldg(const T *p)
{
    return *p;
}

// min/max as the CUDA math headers overload them (no std:: templates, so
// mixed argument types convert as they do under nvcc).
#define KVF_EMU_MINMAX(T)                                                                          \
    inline T min(T a, T b)                                                                         \
    {                                                                                              \
        return a < b ? a : b;                                                                      \
    }                                                                                              \
    inline T max(T a, T b)                                                                         \
    {                                                                                              \
        return a > b ? a : b;                                                                      \
    }
KVF_EMU_MINMAX(int)
KVF_EMU_MINMAX(unsigned)
KVF_EMU_MINMAX(long)
KVF_EMU_MINMAX(unsigned long)
KVF_EMU_MINMAX(long long)
KVF_EMU_MINMAX(unsigned long long)
#undef KVF_EMU_MINMAX
inline float min(float a, float b)
{
    return fminf(a, b);
}
inline float max(float a, float b)
{
    return fmaxf(a, b);
}

// ---- host runtime API ------------------------------------------------------

inline cudaError_t cudaGetLastError(void)
{
    return kvf_emu::last_error(true);
}

inline cudaError_t cudaPeekAtLastError(void)
{
    return kvf_emu::last_error(false);
}

const char *cudaGetErrorName(cudaError_t err);
const char *cudaGetErrorString(cudaError_t err);

template <typename T> cudaError_t cudaFuncSetAttribute(T *kernel, cudaFuncAttribute attr, int value)
{
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
        return cudaErrorInvalidValue;
    return kvf_emu::set_max_dynamic_smem((const void *)kernel, value);
}

#endif
