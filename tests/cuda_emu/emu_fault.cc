// Faults and the error state of the kernel emulator: a kernel's faults
// (a deadlock, a warp operation gone wrong, shared memory overrun: emu.h),
// those the runtime finds on the host side, the last error, and the names
// and texts of the errors the emulator gives.

#include "emu_sched.h"

#include <stdarg.h>
#include <stdio.h>

using namespace kvf_emu::sched;

namespace kvf_emu
{
namespace sched
{
namespace
{

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

} // namespace

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

} // namespace sched

// ---- the error state -------------------------------------------------------------

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
