// The emulator itself, checked before anything runs on it: its f16/bf16
// conversions against dtype.c, and small kernels that break the rules on
// purpose (a race, a missing barrier, a deadlock, ...), which it must catch,
// or the kernel tests could not fail.
#include <cuda_runtime.h>
#include <mma.h>

#include "test_cuda_emu.h"

namespace kvf_emu_test
{
namespace
{

// ---- conversions -------------------------------------------------------------

// __half / __nv_bfloat16 against kvf/dtype.h (two implementations written
// apart): every 16-bit value, every tie between neighbours, and a million
// f32 bit patterns spread over the range.
void f16_conversions()
{
    check c("emulator: f16 <-> f32 as the device rounds (all values, all ties)");
    for (uint32_t h = 0; h < 0x10000u; h++) {
        __half x;
        x.__x = (unsigned short)h;
        float f = __half2float(x), ref = kvf_f16_to_f32((uint16_t)h);
        if (memcmp(&f, &ref, 4) != 0 && !(isnan(f) && isnan(ref)))
            c.fail("__half2float(%#x) = %a, dtype.c %a", h, f, ref);
        if (!isnan(f) && __float2half_rn(f).__x != h)
            c.fail("%#x does not round-trip", h);
    }
    // Neighbours lo < hi (positive, finite): the midpoint goes to the
    // even one, a hair either side to the nearer.
    for (uint32_t h = 0; h < 0x7bffu; h++) {
        __half a, b;
        a.__x = (unsigned short)h;
        b.__x = (unsigned short)(h + 1);
        float lo = __half2float(a), hi = __half2float(b), mid = (lo + hi) / 2;
        uint32_t even = (h & 1u) ? h + 1 : h;
        for (float sgn : {1.0f, -1.0f}) {
            uint32_t s = sgn < 0 ? 0x8000u : 0;
            if (__float2half_rn(sgn * mid).__x != (even | s))
                c.fail("tie %a rounds to %#x", sgn * mid, __float2half_rn(sgn * mid).__x);
            if (__float2half_rn(sgn * nextafterf(mid, 0)).__x != (h | s))
                c.fail("below the tie %a", sgn * mid);
            if (__float2half_rn(sgn * nextafterf(mid, INFINITY)).__x != ((h + 1) | s))
                c.fail("above the tie %a", sgn * mid);
        }
    }
    if (__float2half_rn(65519.99f).__x != 0x7bffu || __float2half_rn(65520.0f).__x != 0x7c00u ||
        __float2half_rn(-INFINITY).__x != 0xfc00u || __float2half_rn(NAN).__x != 0x7fffu)
        c.fail("overflow, infinity or NaN");
    for (uint64_t k = 0; k < (1ull << 32); k += 4099) {
        uint32_t u = (uint32_t)k;
        float f;
        memcpy(&f, &u, 4);
        uint16_t got = __float2half_rn(f).__x, ref = kvf_f32_to_f16(f);
        if (isnan(f) ? got != 0x7fffu : got != ref)
            c.fail("__float2half_rn(%a) = %#x, dtype.c %#x", f, got, ref);
    }
}

void bf16_conversions()
{
    check c("emulator: bf16 <-> f32 as the device rounds (all values, all ties)");
    for (uint32_t h = 0; h < 0x10000u; h++) {
        __nv_bfloat16 x;
        x.__x = (unsigned short)h;
        float f = __bfloat162float(x), ref = kvf_bf16_to_f32((uint16_t)h);
        if (memcmp(&f, &ref, 4) != 0)
            c.fail("__bfloat162float(%#x) = %a, dtype.h %a", h, f, ref);
        if (!isnan(f) && __float2bfloat16_rn(f).__x != h)
            c.fail("%#x does not round-trip", h);
    }
    for (uint32_t h = 0; h < 0x7f7fu; h++) {
        __nv_bfloat16 a, b;
        a.__x = (unsigned short)h;
        b.__x = (unsigned short)(h + 1);
        float lo = __bfloat162float(a), hi = __bfloat162float(b);
        // The midpoint needs one bit more than bf16 has: exact in f32.
        float mid = lo + (hi - lo) / 2;
        uint32_t even = (h & 1u) ? h + 1 : h;
        if (__float2bfloat16_rn(mid).__x != even)
            c.fail("tie %a rounds to %#x", mid, __float2bfloat16_rn(mid).__x);
        if (__float2bfloat16_rn(nextafterf(mid, 0)).__x != h ||
            __float2bfloat16_rn(nextafterf(mid, INFINITY)).__x != h + 1)
            c.fail("next to the tie %a", mid);
    }
    if (__float2bfloat16_rn(NAN).__x != 0x7fffu || __float2bfloat16_rn(3.4e38f).__x != 0x7f80u)
        c.fail("NaN or overflow");
    for (uint64_t k = 0; k < (1ull << 32); k += 4099) {
        uint32_t u = (uint32_t)k;
        float f;
        memcpy(&f, &u, 4);
        uint16_t got = __float2bfloat16_rn(f).__x, ref = kvf_f32_to_bf16(f);
        if (isnan(f) ? got != 0x7fffu : got != ref)
            c.fail("__float2bfloat16_rn(%a) = %#x, dtype.h %#x", f, got, ref);
    }
}

// ---- kernels that break the rules -------------------------------------------

using kvf_emu::order;

// Small kernels that break the rules on purpose: the emulator must notice,
// or the tests below could not fail.
__global__ void emu_racy_kernel(int *out)
{
    out[threadIdx.x % 32] = (int)threadIdx.x; // 64 threads, 32 slots
}

__global__ void emu_no_barrier_kernel(float *out)
{
    KVF_EMU_SHARED(float, buf, [64]);
    buf[threadIdx.x] = (float)threadIdx.x;
    // Missing __syncthreads: the neighbour may not have written yet.
    out[threadIdx.x] = buf[(threadIdx.x + 1) % 64];
}

__global__ void emu_barrier_kernel(float *out)
{
    KVF_EMU_SHARED(float, buf, [64]);
    if (blockIdx.x == 0 && threadIdx.x >= 32)
        return; // exited threads do not hold up the barrier (sm_70+)
    buf[threadIdx.x] = (float)(threadIdx.x + 100 * blockIdx.x);
    __syncthreads();
    unsigned n = blockIdx.x == 0 ? 32 : 64;
    float v = buf[(threadIdx.x + 1) % n];
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    out[blockIdx.x * 64 + threadIdx.x] = v;
}

__global__ void emu_read_smem_kernel(float *out)
{
    float *dyn = static_cast<float *>(kvf_emu::dynamic_smem());
    out[threadIdx.x] = dyn[threadIdx.x]; // never written: the 0xff poison
}

__global__ void emu_deadlock_kernel(float *out)
{
    if (threadIdx.x % 32 < 16)
        __syncthreads();
    else
        out[0] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

__global__ void emu_exited_lane_kernel(float *out)
{
    if (threadIdx.x == 5)
        return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

#ifndef KVF_EMU_TEST_ASAN
__global__ void emu_smem_overrun_kernel(float *out)
{
    float *dyn = static_cast<float *>(kvf_emu::dynamic_smem());
    dyn[threadIdx.x + 32] = 1.0f; // 32 floats given
    out[0] = 0;
}
#endif

// D = A B + C for one 16 x 16 x 16 tile: A (16, 16) row-major with row
// stride 24, B given as B^T (column-major B) with stride 20, C and D f32
// with stride 16, C read column-major. One warp.
__global__ void emu_mma_kernel(const __half *a, const __half *bt, const float *c, float *d)
{
    using namespace nvcuda;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::load_matrix_sync(fa, a, 24);
    wmma::load_matrix_sync(fb, bt, 20);
    wmma::load_matrix_sync(acc, c, 16, wmma::mem_col_major);
    wmma::mma_sync(acc, fa, fb, acc);
    wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
}

// Launches a test kernel in one order; returns the last error.
template <typename K, typename... A>
cudaError_t emu_launch(kvf_emu::order o, K kernel, dim3 grid, dim3 block, size_t smem, A... args)
{
    kvf_emu::set_order(o);
    kvf_emu::launch(kernel, grid, block, smem)(args...);
    kvf_emu::set_order(kvf_emu::order::forward);
    return cudaGetLastError();
}

void emulator_race_shows()
{
    check c("emulator: a race between sync points shows as a difference between orders");
    std::vector<int> fwd(32, -1), rev(32, -1);
    emu_launch(order::forward, emu_racy_kernel, 1, 64, 0, fwd.data());
    emu_launch(order::reverse, emu_racy_kernel, 1, 64, 0, rev.data());
    if (fwd == rev)
        c.fail("the racy kernel gave the same output in both orders");
    std::vector<float> f2(64), r2(64);
    emu_launch(order::forward, emu_no_barrier_kernel, 1, 64, 0, f2.data());
    emu_launch(order::reverse, emu_no_barrier_kernel, 1, 64, 0, r2.data());
    if (bytes_of(f2) == bytes_of(r2))
        c.fail("a missing __syncthreads gave the same output in both orders");
}

void emulator_barriers_and_shuffles()
{
    check c("emulator: barriers, exited threads, shuffles and fresh shared memory per CTA");
    for (order o : {order::forward, order::reverse}) {
        std::vector<float> out(128, -1.0f);
        if (emu_launch(o, emu_barrier_kernel, 2, 64, 0, out.data()) != cudaSuccess)
            c.fail("launch failed");
        for (unsigned b = 0; b < 2; b++) {
            unsigned n = b == 0 ? 32 : 64;
            for (unsigned t = 0; t < n; t++) {
                float mine = (float)((t + 1) % n + 100 * b);
                float other = (float)(((t ^ 1) + 1) % n + 100 * b);
                if (out[b * 64 + t] != mine + other)
                    c.fail("CTA %u thread %u: %g, want %g", b, t, out[b * 64 + t], mine + other);
            }
        }
    }
    std::vector<float> out(64, 0.0f);
    emu_launch(order::forward, emu_read_smem_kernel, 1, 64, 256, out.data());
    for (float v : out)
        if (!isnan(v)) {
            c.fail("unwritten shared memory reads %g, not the NaN poison", v);
            break;
        }
}

void emulator_warp_mma()
{
    check c("emulator: warp matrix product (mma.h) against a loop");
    std::vector<__half> a(16 * 24), bt(16 * 20);
    std::vector<float> cm = random_floats(16 * 16), want(16 * 16);
    for (auto &x : a)
        x = __float2half_rn(urand());
    for (auto &x : bt)
        x = __float2half_rn(urand());
    for (int r = 0; r < 16; r++)
        for (int col = 0; col < 16; col++) {
            double acc = cm[(size_t)col * 16 + r]; // C column-major
            for (int k = 0; k < 16; k++)
                acc += (double)__half2float(a[(size_t)r * 24 + k]) *
                       __half2float(bt[(size_t)col * 20 + k]);
            want[(size_t)r * 16 + col] = (float)acc;
        }
    for (order o : {order::forward, order::reverse}) {
        std::vector<float> d(16 * 16, NAN);
        if (emu_launch(o, emu_mma_kernel, 1, 32, 0, a.data(), bt.data(), cm.data(), d.data()) !=
            cudaSuccess)
            c.fail("launch failed");
        for (int i = 0; i < 256; i++)
            if (!c.near(d[(size_t)i], want[(size_t)i], 1e-5)) {
                c.fail("D element %d is %g, want %g", i, d[(size_t)i], want[(size_t)i]);
                break;
            }
    }
}

void emulator_launch_limits()
{
    check c("emulator: launch limits refused as on the device, nothing run");
    printf("      (3 refused launches expected below)\n");
    std::vector<float> out(2048, 0.0f);
    unsigned long long ctas = kvf_emu::get_stats().ctas;
    if (emu_launch(order::forward, emu_read_smem_kernel, 1, 2048, 0, out.data()) !=
        cudaErrorInvalidConfiguration)
        c.fail("a 2048-thread block was not refused");
    if (emu_launch(order::forward, emu_read_smem_kernel, dim3(1, 70000), 32, 0, out.data()) !=
        cudaErrorInvalidConfiguration)
        c.fail("grid.y 70000 was not refused");
    if (emu_launch(order::forward, emu_read_smem_kernel, 1, 32, 64 * 1024, out.data()) !=
        cudaErrorInvalidValue)
        c.fail("64 KiB of dynamic shared memory without the attribute was not refused");
    if (kvf_emu::get_stats().ctas != ctas)
        c.fail("a refused launch ran CTAs");
    if (cudaFuncSetAttribute(emu_read_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             300 * 1024) != cudaErrorInvalidValue)
        c.fail("an opt-in past 227 KiB was accepted");
    if (cudaFuncSetAttribute(emu_read_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             64 * 1024) != cudaSuccess ||
        emu_launch(order::forward, emu_read_smem_kernel, 1, 32, 64 * 1024, out.data()) !=
            cudaSuccess)
        c.fail("64 KiB after the opt-in was refused");
}

void emulator_faults_reported()
{
    check c("emulator: deadlock, shuffle with an exited lane, shared memory overrun fault");
    // Under ASan a write past the dynamic shared memory is ASan's to
    // report (the canary is poisoned), and it ends the process.
#ifdef KVF_EMU_TEST_ASAN
    const unsigned long long expected = 2;
#else
    const unsigned long long expected = 3;
#endif
    printf("      (%llu emulator fault messages expected below)\n", expected);
    std::vector<float> out(64, 0.0f);
    unsigned long long faults = kvf_emu::faults();
    if (emu_launch(order::forward, emu_deadlock_kernel, 2, 64, 0, out.data()) !=
        cudaErrorLaunchFailure)
        c.fail("a deadlock was not reported");
    if (emu_launch(order::reverse, emu_exited_lane_kernel, 1, 32, 0, out.data()) !=
        cudaErrorLaunchFailure)
        c.fail("a shuffle with an exited lane was not reported");
#ifndef KVF_EMU_TEST_ASAN
    if (emu_launch(order::forward, emu_smem_overrun_kernel, 1, 32, 32 * sizeof(float),
                   out.data()) != cudaErrorLaunchFailure)
        c.fail("a write past the dynamic shared memory was not reported");
#endif
    if (kvf_emu::faults() != faults + expected)
        c.fail("%llu faults counted, want %llu", kvf_emu::faults() - faults, expected);
    // The emulator goes on: a good launch after the faults.
    std::vector<float> ok(128, 0.0f);
    if (emu_launch(order::forward, emu_barrier_kernel, 2, 64, 0, ok.data()) != cudaSuccess)
        c.fail("a launch after the faults failed");
}

} // namespace

void test_conversions()
{
    f16_conversions();
    bf16_conversions();
}

void test_emulator()
{
    emulator_race_shows();
    emulator_barriers_and_shuffles();
    emulator_warp_mma();
    emulator_launch_limits();
    emulator_faults_reported();
}

} // namespace kvf_emu_test
