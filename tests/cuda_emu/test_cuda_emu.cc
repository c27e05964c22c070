// Every kernel of common/backend/cuda/*.cu, run for real on the CPU: the
// launchers are called on host memory, the kernels run under the emulator
// (emu.h), and each result is compared with something independent, the CPU
// backend's op where there is one, else a direct loop in double:
//
//   kvf_cuda_embed               dtype.c's conversions (exact)
//   kvf_cuda_add_rmsnorm         CPU backend rmsnorm after x += delta
//   kvf_cuda_qkv_rope_write      a loop for the bias, then CPU rope and kv_write
//   kvf_cuda_attention_prefill,  CPU backend attention over pools filled by
//   kvf_cuda_attention_prefill_tc, qkv_rope_write and the CPU kv_write (mixed
//   kvf_cuda_attention_decode    prefill tiles and decode tokens), and a double
//                                loop for tables with ids outside the pool
//                                (read as zero K, V)
//   kvf_cuda_swiglu              CPU backend swiglu
//   kvf_cuda_argmax              kvf_sample_argmax (ties, NaN, infinities)
//   kvf_cuda_gather_rows         memcpy (exact)
//
// Every launch runs twice, the lowest-index runnable thread going first at
// every switch and then the highest, and the two must give identical bytes:
// a difference is a race the device may or may not show. Each launcher is
// also given bad shapes, which must return its shape-check error without a
// launch, and an empty batch, which must launch nothing; a launch the
// device would refuse must come back as an error (cuda_status.cu).
//
// The emulator itself is checked first: its f16/bf16 conversions against
// dtype.c, and small kernels that break the rules on purpose (a race, a
// missing barrier, a deadlock, ...) must be caught. Then the emulated
// runtime (emu_runtime.h) against what CUDA documents: device memory
// (poison, bounds, copy directions, host access and use after free crash),
// deferred streams and events, graph capture and replay and the calls a
// capture forbids, the device queries; and cublasGemmEx against a double
// loop (every transpose, f32/f16/bf16, padded leading dimensions, beta 0
// not reading C) with cuBLAS' answers to bad arguments.
//
// Prints PASS or FAIL per case and exits 1 when any failed.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <mma.h>

#include "cuda_ops.h"
#include "kvf/backend.h"
#include "kvf/dtype.h"
#include "kvf/kvcache.h"
#include "kvf/log.h"
#include "kvf/status.h"
extern "C" {
#include "kvf/sampling.h"
}

#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

namespace
{

// ---- harness -----------------------------------------------------------------

int g_passed, g_failed;
kvf_backend_t g_cpu;          // the reference backend
std::mt19937 g_rng(20240531); // fixed: a failure reproduces

float urand(float lo = -1.0f, float hi = 1.0f)
{
    return std::uniform_real_distribution<float>(lo, hi)(g_rng);
}

std::vector<float> random_floats(size_t n, float lo = -1.0f, float hi = 1.0f)
{
    std::vector<float> v(n);
    for (float &x : v)
        x = urand(lo, hi);
    return v;
}

// One case: collects failures, prints one PASS/FAIL line when it ends.
class check
{
  public:
    explicit check(std::string name) : name_(std::move(name))
    {
    }
    ~check()
    {
        if (failures_ == 0) {
            g_passed++;
            if (worst_ > 0)
                printf("PASS  %s (worst error %.2f of tolerance)\n", name_.c_str(), worst_);
            else
                printf("PASS  %s\n", name_.c_str());
        } else {
            g_failed++;
            printf("FAIL  %s (%d problems)\n", name_.c_str(), failures_);
        }
        fflush(stdout);
    }
    void fail(const char *fmt, ...) __attribute__((format(printf, 2, 3)))
    {
        if (failures_++ >= 6)
            return;
        printf("      %s: ", name_.c_str());
        va_list ap;
        va_start(ap, fmt);
        vprintf(fmt, ap);
        va_end(ap);
        putchar('\n');
    }
    // |got - want| against tol (0: must be equal); NaN must meet NaN.
    bool near(double got, double want, double tol)
    {
        if (isnan(want) || isnan(got))
            return isnan(want) && isnan(got);
        if (isinf(want) || isinf(got))
            return got == want;
        double err = fabs(got - want);
        if (tol > 0 && err / tol > worst_)
            worst_ = err / tol;
        return tol > 0 ? err <= tol : err == 0;
    }
    int failures() const
    {
        return failures_;
    }

  private:
    std::string name_;
    int failures_ = 0;
    double worst_ = 0;
};

std::string fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char *f, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, sizeof buf, f, ap);
    va_end(ap);
    return buf;
}

template <typename T> std::vector<unsigned char> bytes_of(const std::vector<T> &v)
{
    const unsigned char *p = (const unsigned char *)v.data();
    return std::vector<unsigned char>(p, p + v.size() * sizeof(T));
}

void append(std::vector<unsigned char> &dst, const void *p, size_t n)
{
    dst.insert(dst.end(), (const unsigned char *)p, (const unsigned char *)p + n);
}

// Runs a launcher: it must return KVF_OK, no kernel may fault and no error
// may be left behind.
template <typename F> void launch_ok(check &c, const char *what, F call)
{
    unsigned long long faults = kvf_emu::faults();
    kvf_status_t s = call();
    if (s != KVF_OK)
        c.fail("%s returned %s", what, kvf_status_str(s));
    if (kvf_emu::faults() != faults)
        c.fail("%s: a kernel faulted (see above)", what);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        c.fail("%s left error %s", what, cudaGetErrorName(e));
}

// run() sets up its inputs, launches and returns the bytes produced; it runs
// in both thread orders, which must agree. Returns the first run's bytes.
template <typename F> std::vector<unsigned char> both_orders(check &c, F run)
{
    kvf_emu::set_order(kvf_emu::order::forward);
    std::vector<unsigned char> fwd = run();
    kvf_emu::set_order(kvf_emu::order::reverse);
    std::vector<unsigned char> rev = run();
    kvf_emu::set_order(kvf_emu::order::forward);
    if (fwd.size() != rev.size()) {
        c.fail("the two thread orders produced different amounts of output");
    } else {
        auto d = std::mismatch(fwd.begin(), fwd.end(), rev.begin());
        if (d.first != fwd.end())
            c.fail("output differs between thread orders at byte %zu of %zu (a race)",
                   (size_t)(d.first - fwd.begin()), fwd.size());
    }
    return fwd;
}

// A bad shape: the launcher returns want and launches nothing.
template <typename F> void refused(check &c, const char *what, kvf_status_t want, F call)
{
    unsigned long long launches = kvf_emu::get_stats().launches;
    kvf_log_set_level(KVF_LOG_OFF); // the launcher logs the bad shape: expected
    kvf_status_t s = call();
    kvf_log_set_level(KVF_LOG_ERROR);
    if (s != want)
        c.fail("%s: returned %s, want %s", what, kvf_status_str(s), kvf_status_str(want));
    if (kvf_emu::get_stats().launches != launches)
        c.fail("%s: launched a kernel", what);
}

// Empty batch: KVF_OK without a launch.
template <typename F> void empty_ok(check &c, const char *what, F call)
{
    unsigned long long launches = kvf_emu::get_stats().launches;
    kvf_status_t s = call();
    if (s != KVF_OK)
        c.fail("%s with nothing to do: returned %s", what, kvf_status_str(s));
    if (kvf_emu::get_stats().launches != launches)
        c.fail("%s with nothing to do: launched a kernel", what);
}

// ---- activation buffers (f32, bf16 or f16) -----------------------------------

const kvf_dtype_t k_adts[3] = {KVF_DTYPE_F32, KVF_DTYPE_BF16, KVF_DTYPE_F16};

float act_get(const void *buf, kvf_dtype_t dt, size_t i)
{
    if (dt == KVF_DTYPE_F32)
        return ((const float *)buf)[i];
    uint16_t h;
    memcpy(&h, (const unsigned char *)buf + 2 * i, 2);
    return dt == KVF_DTYPE_BF16 ? kvf_bf16_to_f32(h) : kvf_f16_to_f32(h);
}

// Half a unit in the last place of the storage type at |x|: what rounding
// the f32 result to it may add.
double half_ulp(kvf_dtype_t dt, double x)
{
    if (dt == KVF_DTYPE_F32)
        return 0;
    int mant = dt == KVF_DTYPE_BF16 ? 7 : 10;
    double min_normal = dt == KVF_DTYPE_BF16 ? ldexp(1.0, -126) : ldexp(1.0, -14);
    double a = fabs(x) < min_normal ? min_normal : fabs(x);
    int e;
    frexp(a, &e); // a = f * 2^e, f in [0.5, 1)
    return ldexp(1.0, e - 1 - mant) / 2;
}

// Output bytes prefilled with this pattern: columns a kernel must not write
// keep it.
constexpr unsigned char k_sentinel = 0xa7;

std::vector<unsigned char> sentinel_buffer(size_t n, kvf_dtype_t dt)
{
    return std::vector<unsigned char>(n * kvf_dtype_size(dt), k_sentinel);
}

bool is_sentinel(const std::vector<unsigned char> &buf, kvf_dtype_t dt, size_t i)
{
    size_t es = kvf_dtype_size(dt);
    for (size_t b = 0; b < es; b++)
        if (buf[i * es + b] != k_sentinel)
            return false;
    return true;
}

// Compares rows x cols of an act buffer (row stride ld) with want (row
// stride ld_want): within rel * max(1, |want|) plus the storage rounding.
// Columns cols .. ld - 1 must keep the sentinel.
void compare_rows(check &c, const char *what, const std::vector<unsigned char> &got, kvf_dtype_t dt,
                  int rows, int cols, int ld, const float *want, int ld_want, double rel)
{
    int shown = 0;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < ld; j++) {
            size_t i = (size_t)r * ld + j;
            if (j >= cols) {
                if (!is_sentinel(got, dt, i) && shown++ < 3)
                    c.fail("%s: row %d column %d (past %d) was written", what, r, j, cols);
                continue;
            }
            double w = want[(size_t)r * ld_want + j];
            double tol = rel * std::max(1.0, fabs(w)) + half_ulp(dt, w) * 1.0001;
            float g = act_get(got.data(), dt, i);
            if (!c.near(g, w, tol) && shown++ < 3)
                c.fail("%s: row %d column %d is %.9g, want %.9g (tolerance %.3g)", what, r, j, g, w,
                       tol);
        }
}

// ---- the emulator itself -------------------------------------------------------

// __half / __nv_bfloat16 against kvf/dtype.h (two implementations written
// apart): every 16-bit value, every tie between neighbours, and a million
// f32 bit patterns spread over the range.
void test_conversions()
{
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
}

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

void test_emulator()
{
    using kvf_emu::order;
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
                        c.fail("CTA %u thread %u: %g, want %g", b, t, out[b * 64 + t],
                               mine + other);
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
}

// ---- the emulated runtime and cuBLAS (emu_runtime.h, include/cublas_v2.h) ------

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

std::vector<float> download(const float *dev, size_t n)
{
    std::vector<float> h(n);
    if (cudaMemcpy(h.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess)
        h.assign(n, -12345.0f);
    return h;
}

void upload(float *dev, const std::vector<float> &h)
{
    cudaMemcpy(dev, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice);
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

void test_runtime_graphs()
{
    check c("emulated runtime: graph capture, replay and the calls a capture forbids");
    cudaStream_t s = nullptr, s2 = nullptr;
    cudaEvent_t outside = nullptr, fork = nullptr, join = nullptr;
    float *d = nullptr;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    cudaEventCreate(&outside);
    cudaEventCreate(&fork);
    cudaEventCreate(&join);
    cudaMalloc(&d, 64 * sizeof(float));
    upload(d, std::vector<float>(64, 0.0f));
    kvf_emu::runtime_stats st0 = kvf_emu::get_runtime_stats();

    // Recorded, not run; every replay runs it again, on what memory holds
    // then.
    cudaGraph_t g = nullptr;
    cudaGraphExec_t x = nullptr;
    if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
        c.fail("cudaStreamBeginCapture failed");
    cudaStreamCaptureStatus cs;
    if (cudaStreamIsCapturing(s, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusActive)
        c.fail("the stream does not say it is capturing");
    add_on(s, d, 1.0f, 64);
    add_on(s, d, 2.0f, 32);
    if (cudaStreamEndCapture(s, &g) != cudaSuccess || !g)
        c.fail("cudaStreamEndCapture failed");
    if (download(d, 1)[0] != 0.0f)
        c.fail("a captured launch ran");
    if (cudaGraphInstantiate(&x, g, 0) != cudaSuccess)
        c.fail("cudaGraphInstantiate failed");
    cudaGraphDestroy(g); // the executable graph keeps its nodes
    cudaGraphLaunch(x, s);
    cudaGraphLaunch(x, s);
    cudaStreamSynchronize(s);
    std::vector<float> v = download(d, 64);
    if (v[0] != 6.0f || v[40] != 2.0f)
        c.fail("two replays: %g and %g, want 6 and 2", v[0], v[40]);

    // What a capture forbids: it fails and the end gives no graph.
    printf("      (7 refused calls expected below)\n");
    struct forbidden {
        const char *what;
        cudaError_t want;
        std::function<cudaError_t()> call;
    };
    float *extra = nullptr;
    cudaEventRecord(outside, s2);
    const forbidden cases[] = {
        {"cudaMalloc", cudaErrorStreamCaptureUnsupported, [&] { return cudaMalloc(&extra, 256); }},
        {"cudaStreamSynchronize", cudaErrorStreamCaptureUnsupported,
         [&] { return cudaStreamSynchronize(s); }},
        {"cudaMemcpy", cudaErrorStreamCaptureUnsupported,
         [&] {
             float one = 1.0f;
             return cudaMemcpy(d, &one, 4, cudaMemcpyHostToDevice);
         }},
        {"cudaFree", cudaErrorStreamCaptureUnsupported, [&] { return cudaFree(d); }},
        {"a wait for an event recorded outside the capture", cudaErrorStreamCaptureIsolation,
         [&] { return cudaStreamWaitEvent(s, outside, 0); }},
    };
    for (const forbidden &f : cases) {
        g = nullptr;
        cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
        add_on(s, d, 1.0f, 64);
        cudaError_t err = f.call();
        cudaError_t end = cudaStreamEndCapture(s, &g);
        if (err != f.want || end != cudaErrorStreamCaptureInvalidated || g)
            c.fail("%s during a capture: %s, the end %s", f.what, cudaGetErrorName(err),
                   cudaGetErrorName(end));
        cudaGetLastError();
    }
    if (extra)
        c.fail("cudaMalloc during a capture allocated");
    // A fork not joined back.
    g = nullptr;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    cudaEventRecord(fork, s);
    cudaStreamWaitEvent(s2, fork, 0);
    add_on(s2, d, 10.0f, 64);
    if (cudaStreamEndCapture(s, &g) != cudaErrorStreamCaptureUnjoined || g)
        c.fail("an unjoined fork was not refused");
    cudaGetLastError();
    // Joined: both branches replay.
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    cudaEventRecord(fork, s);
    cudaStreamWaitEvent(s2, fork, 0);
    add_on(s2, d, 10.0f, 64);
    cudaEventRecord(join, s2);
    cudaStreamWaitEvent(s, join, 0);
    add_on(s, d, 1.0f, 64);
    if (cudaEventSynchronize(join) != cudaErrorCapturedEvent)
        c.fail("waiting on the host for an event recorded in an open capture was allowed");
    cudaGetLastError();
    if (cudaStreamEndCapture(s, &g) != cudaSuccess || !g)
        c.fail("a joined fork was refused");
    cudaGraphExec_t x2 = nullptr;
    cudaGraphInstantiate(&x2, g, 0);
    cudaGraphLaunch(x2, s);
    cudaStreamSynchronize(s);
    if (download(d, 1)[0] != 17.0f)
        c.fail("the forked capture replayed to %g, want 17", download(d, 1)[0]);
    kvf_emu::runtime_stats st1 = kvf_emu::get_runtime_stats();
    if (st1.captures - st0.captures != 2 || st1.replays - st0.replays != 3)
        c.fail("%llu captures and %llu replays counted, want 2 and 3", st1.captures - st0.captures,
               st1.replays - st0.replays);
    cudaGraphDestroy(g);
    cudaGraphExecDestroy(x);
    cudaGraphExecDestroy(x2);
    cudaEventDestroy(outside);
    cudaEventDestroy(fork);
    cudaEventDestroy(join);
    cudaStreamDestroy(s);
    cudaStreamDestroy(s2);
    cudaFree(d);
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

// C = alpha op(A) op(B) + beta C against a double loop, column-major as
// cuBLAS documents it.
void test_gemm()
{
    const cudaDataType_t types[] = {CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF};
    cublasHandle_t h = nullptr;
    cudaStream_t s = nullptr;
    cublasCreate(&h);
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cublasSetStream(h, s);
    for (cudaDataType_t t : types)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (float beta : {0.0f, 0.5f}) {
                    const char *tn = t == CUDA_R_32F ? "f32" : t == CUDA_R_16F ? "f16" : "bf16";
                    check c(fmt("cublasGemmEx %s op(A)=%s op(B)=%s beta %g", tn, ta ? "T" : "N",
                                tb ? "T" : "N", (double)beta));
                    const int m = 37, n = 5, k = 70;
                    const int a_rows = ta ? k : m, a_cols = ta ? m : k;
                    const int b_rows = tb ? n : k, b_cols = tb ? k : n;
                    const int lda = a_rows + 3, ldb = b_rows + 1, ldc = m + 2;
                    const size_t esz = t == CUDA_R_32F ? 4 : 2;
                    std::vector<float> af = random_floats((size_t)lda * a_cols);
                    std::vector<float> bf = random_floats((size_t)ldb * b_cols);
                    std::vector<float> c0 = random_floats((size_t)ldc * n);
                    // Stored in the type, and read back as the exact inputs.
                    std::vector<unsigned char> ab(af.size() * esz), bb(bf.size() * esz);
                    auto store = [&](std::vector<float> &f, std::vector<unsigned char> &b) {
                        for (size_t i = 0; i < f.size(); i++) {
                            if (t == CUDA_R_32F) {
                                memcpy(&b[4 * i], &f[i], 4);
                                continue;
                            }
                            uint16_t x =
                                t == CUDA_R_16F ? kvf_f32_to_f16(f[i]) : kvf_f32_to_bf16(f[i]);
                            memcpy(&b[2 * i], &x, 2);
                            f[i] = t == CUDA_R_16F ? kvf_f16_to_f32(x) : kvf_bf16_to_f32(x);
                        }
                    };
                    store(af, ab);
                    store(bf, bb);
                    if (beta == 0.0f) // not read: a NaN must not reach the result
                        for (int j = 0; j < n; j++)
                            c0[(size_t)j * ldc + 3] = NAN;
                    void *da = nullptr, *db = nullptr;
                    float *dc = nullptr;
                    cudaMalloc(&da, ab.size());
                    cudaMalloc(&db, bb.size());
                    cudaMalloc(&dc, c0.size() * sizeof(float));
                    cudaMemcpy(da, ab.data(), ab.size(), cudaMemcpyHostToDevice);
                    cudaMemcpy(db, bb.data(), bb.size(), cudaMemcpyHostToDevice);
                    upload(dc, c0);
                    const float alpha = 1.5f;
                    cublasStatus_t st = cublasGemmEx(
                        h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k,
                        &alpha, da, t, lda, db, t, ldb, &beta, dc, CUDA_R_32F, ldc,
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
                    if (st != CUBLAS_STATUS_SUCCESS)
                        c.fail("cublasGemmEx: %s", cublasGetStatusString(st));
                    cudaStreamSynchronize(s);
                    std::vector<float> got = download(dc, c0.size());
                    int shown = 0;
                    for (int j = 0; j < n; j++)
                        for (int i = 0; i < ldc; i++) {
                            size_t at = (size_t)j * ldc + i;
                            if (i >= m) { // padding rows of C: untouched
                                if (memcmp(&got[at], &c0[at], 4) != 0 && shown++ < 3)
                                    c.fail("C(%d, %d) past m was written", i, j);
                                continue;
                            }
                            double acc = 0;
                            for (int l = 0; l < k; l++) {
                                double a = ta ? af[(size_t)i * lda + l] : af[(size_t)l * lda + i];
                                double b = tb ? bf[(size_t)l * ldb + j] : bf[(size_t)j * ldb + l];
                                acc += a * b;
                            }
                            double want = alpha * acc + (beta != 0.0f ? beta * c0[at] : 0.0);
                            if (!c.near(got[at], want, 1e-5 * (1 + fabs(want))) && shown++ < 3)
                                c.fail("C(%d, %d) = %.9g, want %.9g", i, j, got[at], want);
                        }
                    cudaFree(da);
                    cudaFree(db);
                    cudaFree(dc);
                }
    check c("cublasGemmEx: bad arguments refused as cuBLAS does, host operands a fault");
    float *dev = nullptr;
    cudaMalloc(&dev, 64 * sizeof(float));
    std::vector<float> host(64);
    const float one = 1.0f, zero = 0.0f;
    auto gemm = [&](int m, int lda, const void *a, cudaDataType_t at, cudaDataType_t ct) {
        return cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, 4, 4, &one, a, at, lda, dev, at, 4,
                            &zero, dev, ct, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    };
    if (gemm(4, 4, dev, CUDA_R_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS)
        c.fail("a good call was refused");
    if (gemm(8, 4, dev, CUDA_R_32F, CUDA_R_32F) != CUBLAS_STATUS_INVALID_VALUE)
        c.fail("lda below m was accepted");
    if (gemm(4, 4, dev, CUDA_R_32F, CUDA_R_16F) != CUBLAS_STATUS_NOT_SUPPORTED)
        c.fail("an f16 output was accepted");
    if (cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, dev, CUDA_R_16F, 4, dev,
                     CUDA_R_32F, 4, &zero, dev, CUDA_R_32F, 4, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_NOT_SUPPORTED)
        c.fail("mixed input types were accepted");
    unsigned long long faults = kvf_emu::faults();
    printf("      (1 emulator fault message expected below)\n");
    if (gemm(4, 4, host.data(), CUDA_R_32F, CUDA_R_32F) != CUBLAS_STATUS_EXECUTION_FAILED ||
        kvf_emu::faults() != faults + 1)
        c.fail("a host operand was not a fault");
    cudaGetLastError();
    cudaStreamSynchronize(s);
    cudaFree(dev);
    cublasDestroy(h);
    cudaStreamDestroy(s);
    kvf_emu::runtime_stats rs = kvf_emu::get_runtime_stats();
    if (rs.blas_handles != 0 || rs.streams != 0 || rs.device_allocations != 0 || rs.events != 0 ||
        rs.graphs != 0 || rs.graph_execs != 0)
        c.fail("resources left after the runtime tests");
}

// ---- elementwise ops ---------------------------------------------------------

void test_embed()
{
    const int vocab = 50, n = 7;
    const int32_t tokens[n] = {3, 0, 49, 3, 17, 17, 8};
    for (kvf_dtype_t wdt : k_adts)
        for (int hidden : {64, 300}) {
            check c(fmt("embed %s hidden %d", kvf_dtype_name(wdt), hidden));
            std::vector<float> table = random_floats((size_t)vocab * hidden, -4, 4);
            std::vector<unsigned char> w((size_t)vocab * hidden * kvf_dtype_size(wdt));
            for (size_t i = 0; i < table.size(); i++) {
                if (wdt == KVF_DTYPE_F32) {
                    memcpy(&w[4 * i], &table[i], 4);
                } else {
                    uint16_t h = wdt == KVF_DTYPE_BF16 ? kvf_f32_to_bf16(table[i])
                                                       : kvf_f32_to_f16(table[i]);
                    memcpy(&w[2 * i], &h, 2);
                }
            }
            // One row more than the batch: it must keep the sentinel.
            auto x = both_orders(c, [&] {
                auto out = sentinel_buffer((size_t)(n + 1) * hidden, KVF_DTYPE_F32);
                launch_ok(c, "embed", [&] {
                    return kvf_cuda_embed(nullptr, (float *)out.data(), w.data(), wdt, tokens, n,
                                          hidden, vocab);
                });
                return out;
            });
            std::vector<float> want((size_t)(n + 1) * hidden);
            for (int t = 0; t < n; t++)
                kvf_dtype_to_f32(&want[(size_t)t * hidden],
                                 &w[(size_t)tokens[t] * hidden * kvf_dtype_size(wdt)], wdt,
                                 (size_t)hidden);
            compare_rows(c, "x", x, KVF_DTYPE_F32, n, hidden, hidden, want.data(), hidden, 0);
            for (size_t i = (size_t)n * hidden; i < (size_t)(n + 1) * hidden; i++)
                if (!is_sentinel(x, KVF_DTYPE_F32, i)) {
                    c.fail("wrote past the batch's rows");
                    break;
                }
        }
    check c("embed: bad shapes refused, empty batch launches nothing");
    float x[4];
    float table[4];
    int32_t tok[1] = {0};
    refused(c, "hidden 0", KVF_ERR_INVAL,
            [&] { return kvf_cuda_embed(nullptr, x, table, KVF_DTYPE_F32, tok, 1, 0, 4); });
    refused(c, "-1 tokens", KVF_ERR_INVAL,
            [&] { return kvf_cuda_embed(nullptr, x, table, KVF_DTYPE_F32, tok, -1, 4, 4); });
    refused(c, "vocab 0", KVF_ERR_INVAL,
            [&] { return kvf_cuda_embed(nullptr, x, table, KVF_DTYPE_F32, tok, 1, 4, 0); });
    refused(c, "unknown dtype", KVF_ERR_INVAL,
            [&] { return kvf_cuda_embed(nullptr, x, table, KVF_DTYPE_UNKNOWN, tok, 1, 4, 4); });
    empty_ok(c, "embed",
             [&] { return kvf_cuda_embed(nullptr, x, table, KVF_DTYPE_F32, tok, 0, 4, 4); });
}

void test_add_rmsnorm()
{
    const int m = 3;
    const float eps = 1e-5f;
    for (int dim : {64, 300, 2048})
        for (kvf_dtype_t adt : k_adts)
            for (bool with_delta : {false, true}) {
                if (dim == 2048 && !with_delta)
                    continue; // the large row once per dtype is enough
                check c(fmt("add_rmsnorm %s dim %d %s", kvf_dtype_name(adt), dim,
                            with_delta ? "with delta" : "no delta"));
                const int ld_out = dim + 5;
                std::vector<float> x0 = random_floats((size_t)m * dim, -3, 3);
                std::vector<float> delta = random_floats((size_t)m * dim, -1, 1);
                std::vector<float> w = random_floats((size_t)dim, 0.5f, 1.5f);
                std::vector<float> x_after;
                auto out = both_orders(c, [&] {
                    std::vector<float> x = x0;
                    auto o = sentinel_buffer((size_t)m * ld_out, adt);
                    launch_ok(c, "add_rmsnorm", [&] {
                        return kvf_cuda_add_rmsnorm(nullptr, x.data(),
                                                    with_delta ? delta.data() : nullptr, w.data(),
                                                    o.data(), ld_out, adt, m, dim, eps);
                    });
                    x_after = x;
                    append(o, x.data(), x.size() * sizeof(float));
                    return o;
                });
                // x += delta is one f32 add: exact. Then the CPU backend's norm.
                std::vector<float> x_want = x0, y((size_t)m * dim);
                if (with_delta)
                    for (size_t i = 0; i < x_want.size(); i++)
                        x_want[i] += delta[i];
                if (x_after != x_want)
                    c.fail("x after the residual add differs");
                g_cpu.ops->rmsnorm(g_cpu.ctx, y.data(), x_want.data(), w.data(), m, dim, eps);
                out.resize((size_t)m * ld_out * kvf_dtype_size(adt));
                compare_rows(c, "out", out, adt, m, dim, ld_out, y.data(), dim, 1e-5);
            }
    check c("add_rmsnorm: bad shapes refused, empty batch launches nothing");
    float x[8] = {0}, w[8] = {0}, o[8];
    refused(c, "ld_out < dim", KVF_ERR_INVAL, [&] {
        return kvf_cuda_add_rmsnorm(nullptr, x, nullptr, w, o, 7, KVF_DTYPE_F32, 1, 8, 1e-5f);
    });
    refused(c, "eps 0", KVF_ERR_INVAL, [&] {
        return kvf_cuda_add_rmsnorm(nullptr, x, nullptr, w, o, 8, KVF_DTYPE_F32, 1, 8, 0.0f);
    });
    refused(c, "unknown dtype", KVF_ERR_INVAL, [&] {
        return kvf_cuda_add_rmsnorm(nullptr, x, nullptr, w, o, 8, KVF_DTYPE_UNKNOWN, 1, 8, 1e-5f);
    });
    empty_ok(c, "add_rmsnorm", [&] {
        return kvf_cuda_add_rmsnorm(nullptr, x, nullptr, w, o, 8, KVF_DTYPE_F32, 0, 8, 1e-5f);
    });
}

// cos|sin rows of the rotation angles pos * theta^(-2d / head_dim), computed
// in double as the engine and the CUDA backend do.
std::vector<float> rope_table(const std::vector<int32_t> &pos, int hd)
{
    int half = hd / 2;
    std::vector<float> cs(pos.size() * (size_t)hd);
    for (size_t t = 0; t < pos.size(); t++)
        for (int d = 0; d < half; d++) {
            double a = (double)pos[t] * pow(500000.0, -2.0 * d / hd);
            cs[t * hd + d] = (float)cos(a);
            cs[t * hd + half + d] = (float)sin(a);
        }
    return cs;
}

void test_swiglu()
{
    const int m = 3;
    for (int n : {96, 300, 8192})
        for (kvf_dtype_t adt : k_adts) {
            if (n == 8192 && adt != KVF_DTYPE_BF16)
                continue; // Llama 1B's width once
            check c(fmt("swiglu %s %d x %d", kvf_dtype_name(adt), m, n));
            std::vector<float> gu = random_floats((size_t)m * 2 * n, -8, 8);
            auto got = both_orders(c, [&] {
                auto out = sentinel_buffer((size_t)m * n + 7, adt);
                launch_ok(c, "swiglu", [&] {
                    return kvf_cuda_swiglu(nullptr, out.data(), adt, gu.data(), m, n);
                });
                return out;
            });
            std::vector<float> want((size_t)m * n);
            g_cpu.ops->swiglu(g_cpu.ctx, want.data(), gu.data(), m, n);
            compare_rows(c, "out", got, adt, 1, m * n, m * n + 7, want.data(), m * n, 1e-5);
        }
    check c("swiglu: bad shapes refused, empty batch launches nothing");
    float gu[16] = {0}, out[8];
    refused(c, "n 0", KVF_ERR_INVAL,
            [&] { return kvf_cuda_swiglu(nullptr, out, KVF_DTYPE_F32, gu, 1, 0); });
    refused(c, "unknown dtype", KVF_ERR_INVAL,
            [&] { return kvf_cuda_swiglu(nullptr, out, KVF_DTYPE_UNKNOWN, gu, 1, 8); });
    empty_ok(c, "swiglu", [&] { return kvf_cuda_swiglu(nullptr, out, KVF_DTYPE_F32, gu, 0, 8); });
}

void test_argmax()
{
    for (int n : {1, 7, 1000, 1025, 32000, 128256}) {
        check c(fmt("argmax rows of %d (ties, NaN, infinities)", n));
        std::vector<std::vector<float>> rows;
        auto add = [&](std::vector<float> r) { rows.push_back(std::move(r)); };
        add(random_floats((size_t)n, -10, 10));
        {
            // The largest value at several indices, the lowest of which sits
            // in a later thread and warp than another copy.
            std::vector<float> r = random_floats((size_t)n, -10, 10);
            for (int i : {n - 1, n / 2, 1500, 40000, 5})
                if (i >= 0 && i < n)
                    r[(size_t)i] = 50.0f;
            add(r);
        }
        {
            std::vector<float> r = random_floats((size_t)n, -10, 10);
            for (int i : {0, 3, n / 3, n - 1})
                if (i < n)
                    r[(size_t)i] = NAN;
            if (n > 4)
                r[(size_t)n / 2] = 20.0f;
            add(r);
        }
        add(std::vector<float>((size_t)n, NAN));
        add(std::vector<float>((size_t)n, -INFINITY));
        add(std::vector<float>((size_t)n, 0.25f));
        {
            std::vector<float> r((size_t)n, -INFINITY);
            r[(size_t)n - 1] = INFINITY;
            if (n > 2)
                r[(size_t)n / 2] = NAN;
            add(r);
        }
        {
            std::vector<float> r = random_floats((size_t)n, -5, -1);
            r[(size_t)n - 1] = -0.5f; // the last index
            add(r);
        }
        {
            // One -inf among NaNs: it wins, also over the threads that saw
            // no element (n < 1024) and hold -inf as their empty value.
            std::vector<float> r((size_t)n, NAN);
            r[(size_t)(n / 2 + 1) % (size_t)n] = -INFINITY;
            add(r);
        }
        const int m = (int)rows.size();
        std::vector<float> x;
        for (auto &r : rows)
            x.insert(x.end(), r.begin(), r.end());
        auto got = both_orders(c, [&] {
            std::vector<int32_t> ids((size_t)m + 1, -7);
            launch_ok(c, "argmax",
                      [&] { return kvf_cuda_argmax(nullptr, ids.data(), x.data(), m, n); });
            return bytes_of(ids);
        });
        const int32_t *ids = (const int32_t *)got.data();
        for (int r = 0; r < m; r++) {
            int32_t want = (int32_t)kvf_sample_argmax(&x[(size_t)r * n], n);
            if (ids[r] != want)
                c.fail("row %d: %d, kvf_sample_argmax %d", r, ids[r], want);
        }
        if (ids[m] != -7)
            c.fail("wrote past the ids");
    }
    check c("argmax: bad shapes refused, empty batch launches nothing");
    float x[4] = {0};
    int32_t ids[1];
    refused(c, "n 0", KVF_ERR_INVAL, [&] { return kvf_cuda_argmax(nullptr, ids, x, 1, 0); });
    refused(c, "-1 rows", KVF_ERR_INVAL, [&] { return kvf_cuda_argmax(nullptr, ids, x, -1, 4); });
    empty_ok(c, "argmax", [&] { return kvf_cuda_argmax(nullptr, ids, x, 0, 4); });
}

void test_gather()
{
    const int32_t rows[] = {4, 0, 4, 2, 1};
    const int n_rows = 5, n_src = 6;
    // 1200 bytes: the 4-byte path; 66 bytes (33 bf16): the 2-byte path.
    for (size_t row_bytes : {(size_t)1200, (size_t)66}) {
        check c(fmt("gather_rows %d rows of %zu bytes", n_rows, row_bytes));
        std::vector<unsigned char> src((size_t)n_src * row_bytes);
        for (auto &b : src)
            b = (unsigned char)g_rng();
        auto got = both_orders(c, [&] {
            std::vector<unsigned char> dst((size_t)(n_rows + 1) * row_bytes, k_sentinel);
            launch_ok(c, "gather_rows", [&] {
                return kvf_cuda_gather_rows(nullptr, dst.data(), src.data(), row_bytes, rows,
                                            n_rows);
            });
            return dst;
        });
        std::vector<unsigned char> want((size_t)(n_rows + 1) * row_bytes, k_sentinel);
        for (int i = 0; i < n_rows; i++)
            memcpy(&want[(size_t)i * row_bytes], &src[(size_t)rows[i] * row_bytes], row_bytes);
        if (got != want)
            c.fail("gathered rows differ from memcpy");
    }
    check c("gather_rows: bad shapes refused, empty batch launches nothing");
    unsigned char buf[16];
    int32_t r[1] = {0};
    refused(c, "odd row size", KVF_ERR_INVAL,
            [&] { return kvf_cuda_gather_rows(nullptr, buf, buf, 7, r, 1); });
    refused(c, "row size 0", KVF_ERR_INVAL,
            [&] { return kvf_cuda_gather_rows(nullptr, buf, buf, 0, r, 1); });
    refused(c, "-1 rows", KVF_ERR_INVAL,
            [&] { return kvf_cuda_gather_rows(nullptr, buf, buf, 8, r, -1); });
    empty_ok(c, "gather_rows", [&] { return kvf_cuda_gather_rows(nullptr, buf, buf, 8, r, 0); });
}

// ---- paged KV: a batch of sequences over a pool --------------------------------

struct geometry {
    int n_heads, n_kv_heads, head_dim, block_size;
};

struct seq_spec {
    int start_pos, n_tokens; // tokens start_pos .. start_pos + n_tokens - 1 in this batch
};

// A batch over two identical pools: the CPU backend works on one, the
// emulated kernels on the other.
struct kv_batch {
    geometry g;
    kvf_kv_geometry_t geo;
    int layer = 1; // of 2: a nonzero layer offset
    uint32_t n_blocks = 0;
    kvf_kvpool_t *cpu_pool = nullptr, *emu_pool = nullptr;
    std::vector<seq_spec> seqs;
    std::vector<std::vector<uint32_t>> tables; // per sequence, block ids in position order
    int bt_stride = 0;
    std::vector<int32_t> bt;                  // (n_seqs, bt_stride), what the kernels read
    std::vector<int32_t> pos, seq, tok_block; // per token
    int n_tokens = 0;

    kv_batch(geometry geom, std::vector<seq_spec> specs) : g(geom), seqs(std::move(specs))
    {
        geo = kvf_kv_geometry_t{2, g.n_kv_heads, g.head_dim, g.block_size, KVF_DTYPE_F32};
        for (auto &s : seqs) {
            int nb = (s.start_pos + s.n_tokens + g.block_size - 1) / g.block_size;
            n_blocks += (uint32_t)nb;
            bt_stride = std::max(bt_stride, nb);
        }
        n_blocks += 3;  // blocks no sequence uses
        bt_stride += 1; // padding past every table, as the backend's buckets leave
        if (kvf_kvpool_create(&geo, n_blocks, &cpu_pool) != KVF_OK ||
            kvf_kvpool_create(&geo, n_blocks, &emu_pool) != KVF_OK) {
            fprintf(stderr, "test_cuda_emu: cannot create a KV pool\n");
            exit(1);
        }
        // Earlier context: random K/V in every block, the same in both pools.
        float *a = (float *)kvf_kvpool_base(cpu_pool);
        size_t n = kvf_kvpool_bytes(cpu_pool) / sizeof(float);
        for (size_t i = 0; i < n; i++)
            a[i] = urand();
        memcpy(kvf_kvpool_base(emu_pool), a, n * sizeof(float));
        // Tables: a shuffled assignment, so no sequence has consecutive blocks.
        std::vector<uint32_t> ids(n_blocks);
        for (uint32_t i = 0; i < n_blocks; i++)
            ids[i] = i;
        std::shuffle(ids.begin(), ids.end(), g_rng);
        bt.assign(seqs.size() * (size_t)bt_stride, 0); // padding is never read
        size_t k = 0;
        for (size_t s = 0; s < seqs.size(); s++) {
            int nb = (seqs[s].start_pos + seqs[s].n_tokens + g.block_size - 1) / g.block_size;
            tables.emplace_back(ids.begin() + (long)k, ids.begin() + (long)k + nb);
            for (int b = 0; b < nb; b++)
                bt[s * bt_stride + b] = (int32_t)ids[k + b];
            k += (size_t)nb;
            for (int i = 0; i < seqs[s].n_tokens; i++) {
                int p = seqs[s].start_pos + i;
                pos.push_back(p);
                seq.push_back((int32_t)s);
                tok_block.push_back((int32_t)tables[s][(size_t)(p / g.block_size)]);
            }
        }
        n_tokens = (int)pos.size();
    }
    ~kv_batch()
    {
        kvf_kvpool_destroy(cpu_pool);
        kvf_kvpool_destroy(emu_pool);
    }
    kv_batch(const kv_batch &) = delete;
    kv_batch &operator=(const kv_batch &) = delete;

    std::vector<const uint32_t *> table_ptrs() const
    {
        std::vector<const uint32_t *> p;
        for (auto &t : tables)
            p.push_back(t.data());
        return p;
    }
    kvf_batch_layout_t layout(const std::vector<const uint32_t *> &ptrs) const
    {
        return kvf_batch_layout_t{n_tokens, pos.data(), seq.data(), (int)seqs.size(), ptrs.data()};
    }
    int64_t block_stride() const
    {
        return (int64_t)(kvf_kv_block_bytes(&geo) / sizeof(float));
    }
    int64_t layer_off() const
    {
        return (int64_t)layer * (int64_t)(kvf_kvpool_slice_bytes(emu_pool) / sizeof(float));
    }
    float *emu_base() const
    {
        return (float *)kvf_kvpool_base(emu_pool);
    }
    std::vector<unsigned char> emu_pool_bytes() const
    {
        const unsigned char *p = (const unsigned char *)kvf_kvpool_base(emu_pool);
        return std::vector<unsigned char>(p, p + kvf_kvpool_bytes(emu_pool));
    }
    void reset_emu_pool(const std::vector<unsigned char> &bytes) const
    {
        memcpy(kvf_kvpool_base(emu_pool), bytes.data(), bytes.size());
    }
    std::string describe() const
    {
        std::string s = fmt("h%d/%d hd%d bs%d", g.n_heads, g.n_kv_heads, g.head_dim, g.block_size);
        for (auto &q : seqs)
            s += q.n_tokens == 1 ? fmt(" [dec %d]", q.start_pos)
                                 : fmt(" [%d+%d]", q.start_pos, q.n_tokens);
        return s;
    }
};

// Pools compared as floats (rel 0: bit for bit).
void compare_pools(check &c, const kv_batch &b, const std::vector<unsigned char> &emu, double rel)
{
    const float *want = (const float *)kvf_kvpool_base(b.cpu_pool);
    const float *got = (const float *)emu.data();
    size_t n = emu.size() / sizeof(float);
    int shown = 0;
    for (size_t i = 0; i < n; i++)
        if (!c.near(got[i], want[i], rel * std::max(1.0f, fabsf(want[i]))) && shown++ < 3)
            c.fail("pool float %zu is %.9g, the CPU backend's %.9g", i, got[i], want[i]);
}

void test_qkv_rope_write()
{
    struct qkv_case {
        geometry g;
        std::vector<seq_spec> seqs;
        bool bias;
    };
    const qkv_case cases[] = {
        {{4, 2, 16, 16}, {{0, 20}, {37, 9}, {5, 1}}, false},
        {{8, 2, 64, 16}, {{100, 17}, {3, 1}}, true},
        {{4, 4, 128, 1}, {{0, 4}, {9, 1}}, true},
        {{6, 2, 96, 256}, {{250, 12}, {0, 2}}, false},
        {{4, 1, 80, 16}, {{30, 5}}, true},
    };
    for (const qkv_case &qc : cases) {
        kv_batch b(qc.g, qc.seqs);
        check c("qkv_rope_write " + b.describe() + (qc.bias ? " bias" : ""));
        const int hd = b.g.head_dim, q_dim = b.g.n_heads * hd, kv_dim = b.g.n_kv_heads * hd;
        const int ld = q_dim + 2 * kv_dim + 3;
        // Two more tokens whose blocks are outside the pool: their q is
        // rotated, their k and v are never written.
        std::vector<int32_t> tok_block = b.tok_block, pos = b.pos;
        tok_block.push_back(-1);
        tok_block.push_back((int32_t)b.n_blocks);
        pos.push_back(3);
        pos.push_back(b.g.block_size + 1);
        const int n_rows = b.n_tokens + 2;
        std::vector<float> qkv0 = random_floats((size_t)n_rows * ld, -2, 2);
        std::vector<float> bias = random_floats((size_t)(q_dim + 2 * kv_dim));
        std::vector<float> cs = rope_table(pos, hd);
        const auto start = b.emu_pool_bytes();
        std::vector<float> q_after;
        auto got = both_orders(c, [&] {
            b.reset_emu_pool(start);
            std::vector<float> qkv = qkv0;
            launch_ok(c, "qkv_rope_write", [&] {
                return kvf_cuda_qkv_rope_write(
                    nullptr, qkv.data(), ld, qc.bias ? bias.data() : nullptr, cs.data(),
                    b.emu_base(), b.block_stride(), b.layer_off(), tok_block.data(), pos.data(),
                    n_rows, b.g.n_heads, b.g.n_kv_heads, hd, b.g.block_size, (int)b.n_blocks);
            });
            q_after = qkv;
            auto out = b.emu_pool_bytes();
            append(out, qkv.data(), qkv.size() * sizeof(float));
            return out;
        });
        // The reference: bias (a loop), then the CPU backend's rope and kv_write.
        std::vector<float> want = qkv0;
        if (qc.bias)
            for (int t = 0; t < n_rows; t++)
                for (int j = 0; j < q_dim + 2 * kv_dim; j++)
                    want[(size_t)t * ld + j] += bias[j];
        g_cpu.ops->rope(g_cpu.ctx, want.data(), ld, cs.data(), n_rows, b.g.n_heads, hd);
        g_cpu.ops->rope(g_cpu.ctx, want.data() + q_dim, ld, cs.data(), n_rows, b.g.n_kv_heads, hd);
        auto ptrs = b.table_ptrs();
        kvf_batch_layout_t lay = b.layout(ptrs);
        g_cpu.ops->kv_write(g_cpu.ctx, b.cpu_pool, b.layer, want.data() + q_dim,
                            want.data() + q_dim + kv_dim, ld, &lay);
        got.resize(kvf_kvpool_bytes(b.emu_pool));
        compare_pools(c, b, got, 3e-7);
        // q, rotated in place; the padding past q|k|v untouched.
        int shown = 0;
        for (int t = 0; t < n_rows; t++) {
            for (int j = 0; j < q_dim; j++) {
                size_t i = (size_t)t * ld + j;
                if (!c.near(q_after[i], want[i], 3e-7 * std::max(1.0f, fabsf(want[i]))) &&
                    shown++ < 3)
                    c.fail("q row %d column %d: %.9g, want %.9g", t, j, q_after[i], want[i]);
            }
            for (int j = q_dim + 2 * kv_dim; j < ld; j++)
                if (q_after[(size_t)t * ld + j] != qkv0[(size_t)t * ld + j] && shown++ < 3)
                    c.fail("row %d: padding column %d written", t, j);
        }
    }
    check c("qkv_rope_write: bad shapes refused, empty batch launches nothing");
    float qkv[64] = {0}, cs[16] = {0}, pool[64] = {0};
    int32_t ids[1] = {0}, pos[1] = {0};
    refused(c, "odd head_dim", KVF_ERR_INVAL, [&] {
        return kvf_cuda_qkv_rope_write(nullptr, qkv, 64, nullptr, cs, pool, 64, 0, ids, pos, 1, 1,
                                       1, 15, 1, 1);
    });
    refused(c, "row shorter than q|k|v", KVF_ERR_INVAL, [&] {
        return kvf_cuda_qkv_rope_write(nullptr, qkv, 40, nullptr, cs, pool, 64, 0, ids, pos, 1, 1,
                                       1, 16, 1, 1);
    });
    empty_ok(c, "qkv_rope_write", [&] {
        return kvf_cuda_qkv_rope_write(nullptr, qkv, 64, nullptr, cs, pool, 64, 0, ids, pos, 0, 1,
                                       1, 16, 1, 1);
    });
}

// ---- attention against the CPU backend -------------------------------------------

// Prefill tiles on CUDA cores (attention_prefill.cu) or tensor cores
// (attention_prefill_tc.cu, bf16/f16 and head dims of 16 k up to 128).
enum class prefill_kernel { cores, tensor_cores };

// A mixed batch as the engine builds one: sequences of several tokens
// (prefill, chunked when start_pos > 0) go to prefill tiles, single tokens
// to decode. K/V of the batch is written into both pools first, then both
// attentions read their pool. split_keys 0: kvf_cuda_decode_split_keys();
// extra_splits: splits past every context.
void attention_case(geometry g, std::vector<seq_spec> specs, kvf_dtype_t adt, int split_keys,
                    int extra_splits, prefill_kernel pk = prefill_kernel::cores)
{
    kv_batch b(g, std::move(specs));
    const int group = g.n_heads / g.n_kv_heads, hd = g.head_dim, q_dim = g.n_heads * hd;
    const int kv_dim = g.n_kv_heads * hd, ld_qkv = q_dim + 2 * kv_dim + 8, ld_out = q_dim + 4;
    if (split_keys <= 0)
        split_keys = kvf_cuda_decode_split_keys(group, g.block_size);

    // Tiles and decode tokens.
    const int tile = kvf_cuda_prefill_tile_tokens(group);
    std::vector<int32_t> tiles, dec;
    int max_tile_pos = 0, max_dec_pos = 0, t = 0;
    for (auto &s : b.seqs) {
        if (s.n_tokens == 1) {
            dec.push_back(t);
            max_dec_pos = std::max(max_dec_pos, s.start_pos);
        } else {
            for (int i = 0; i < s.n_tokens; i += tile) {
                tiles.push_back(t + i);
                tiles.push_back(std::min(tile, s.n_tokens - i));
            }
            max_tile_pos = std::max(max_tile_pos, s.start_pos + s.n_tokens - 1);
        }
        t += s.n_tokens;
    }
    int n_splits = (max_dec_pos + 1 + split_keys - 1) / split_keys + extra_splits;
    while ((long long)n_splits * split_keys > (long long)b.bt_stride * g.block_size + split_keys)
        n_splits--;

    const bool tc = pk == prefill_kernel::tensor_cores;
    check c(fmt("attention %s %s: %zu tiles%s, %zu decode x %d splits of %d", b.describe().c_str(),
                kvf_dtype_name(adt), tiles.size() / 2, tc ? " on tensor cores" : "", dec.size(),
                n_splits, split_keys));
    std::vector<float> qkv = random_floats((size_t)b.n_tokens * ld_qkv);
    for (int r = 0; r < b.n_tokens; r++) // sharper softmax than uniform q
        for (int j = 0; j < q_dim; j++)
            qkv[(size_t)r * ld_qkv + j] *= 3.0f;
    const float *q = qkv.data(), *k = q + q_dim, *v = k + kv_dim;
    // K/V go into the pool through qkv_rope_write with a rotation by 0 (cos
    // 1, sin 0: x * 1 - y * 0 is x exactly, FMA or not), so the pool holds
    // the k and v rows as the CPU backend's kv_write stores them and q keeps
    // its bits.
    std::vector<float> identity((size_t)b.n_tokens * hd, 0.0f);
    for (int r = 0; r < b.n_tokens; r++)
        std::fill_n(identity.begin() + (long)r * hd, hd / 2, 1.0f);

    const auto start = b.emu_pool_bytes();
    auto got = both_orders(c, [&] {
        b.reset_emu_pool(start);
        std::vector<float> qkv_dev = qkv;
        launch_ok(c, "qkv_rope_write", [&] {
            return kvf_cuda_qkv_rope_write(
                nullptr, qkv_dev.data(), ld_qkv, nullptr, identity.data(), b.emu_base(),
                b.block_stride(), b.layer_off(), b.tok_block.data(), b.pos.data(), b.n_tokens,
                g.n_heads, g.n_kv_heads, hd, g.block_size, (int)b.n_blocks);
        });
        if (qkv_dev != qkv)
            c.fail("a rotation by 0 changed q");
        auto out = sentinel_buffer((size_t)b.n_tokens * ld_out, adt);
        kvf_cuda_attn_t a{};
        a.kv_layer = b.emu_base() + b.layer_off();
        a.block_stride = b.block_stride();
        a.n_pool_blocks = (int)b.n_blocks;
        a.n_heads = g.n_heads;
        a.n_kv_heads = g.n_kv_heads;
        a.head_dim = hd;
        a.block_size = g.block_size;
        a.scale = 1.0f / sqrtf((float)hd);
        a.q = q;
        a.ld_q = ld_qkv;
        a.out = out.data();
        a.ld_out = ld_out;
        a.adt = adt;
        a.n_tokens = b.n_tokens;
        a.pos = b.pos.data();
        a.seq = b.seq.data();
        a.block_tables = b.bt.data();
        a.bt_stride = b.bt_stride;
        a.n_seqs = (int)b.seqs.size();
        if (!tiles.empty()) {
            kvf_cuda_prefill_tiles_t pt = {tiles.data(), (int)tiles.size() / 2, max_tile_pos};
            if (tc && !kvf_cuda_prefill_tc_ok(&a))
                c.fail("kvf_cuda_prefill_tc_ok() refuses a tensor-core case");
            launch_ok(c, "attention_prefill", [&] {
                return tc ? kvf_cuda_attention_prefill_tc(nullptr, &a, &pt)
                          : kvf_cuda_attention_prefill(nullptr, &a, &pt);
            });
        }
        if (!dec.empty()) {
            // The workspace starts as NaN: nothing may read what no split wrote.
            std::vector<float> ws(
                kvf_cuda_decode_ws_floats((int)dec.size(), g.n_heads, n_splits, hd), NAN);
            kvf_cuda_decode_plan_t dp = {dec.data(), (int)dec.size(), n_splits, split_keys,
                                         ws.data()};
            launch_ok(c, "attention_decode",
                      [&] { return kvf_cuda_attention_decode(nullptr, &a, &dp); });
        }
        append(out, kvf_kvpool_base(b.emu_pool), kvf_kvpool_bytes(b.emu_pool));
        return out;
    });

    auto ptrs = b.table_ptrs();
    kvf_batch_layout_t lay = b.layout(ptrs);
    g_cpu.ops->kv_write(g_cpu.ctx, b.cpu_pool, b.layer, k, v, ld_qkv, &lay);
    std::vector<float> want((size_t)b.n_tokens * q_dim);
    kvf_status_t s = g_cpu.ops->attention(g_cpu.ctx, want.data(), q, ld_qkv, b.cpu_pool, b.layer,
                                          g.n_heads, &lay);
    if (s != KVF_OK)
        c.fail("the CPU backend's attention returned %s", kvf_status_str(s));
    const size_t out_bytes = (size_t)b.n_tokens * ld_out * kvf_dtype_size(adt);
    std::vector<unsigned char> pool(got.begin() + (long)out_bytes, got.end());
    got.resize(out_bytes);
    compare_pools(c, b, pool, 0);
    if (!tc) {
        compare_rows(c, "out", got, adt, b.n_tokens, q_dim, ld_out, want.data(), q_dim, 2e-5);
        return;
    }
    // Tensor cores take q, K, V and the probabilities in the 16-bit type:
    // each rounding is half an ulp (2^-9 bf16, 2^-12 f16) of an input, and
    // the outputs (averages of V rows within [-1, 1]) move by a few of
    // them. Decode rows stay on CUDA cores in f32.
    const double tc_rel = adt == KVF_DTYPE_BF16 ? 1.2e-2 : 1.5e-3;
    std::vector<char> is_dec((size_t)b.n_tokens, 0);
    for (int32_t d : dec)
        is_dec[(size_t)d] = 1;
    for (int r = 0; r < b.n_tokens; r++) {
        std::vector<unsigned char> row(
            got.begin() + (long)((size_t)r * ld_out * kvf_dtype_size(adt)),
            got.begin() + (long)((size_t)(r + 1) * ld_out * kvf_dtype_size(adt)));
        compare_rows(c, is_dec[(size_t)r] ? "decode out" : "prefill out", row, adt, 1, q_dim,
                     ld_out, want.data() + (size_t)r * q_dim, q_dim,
                     is_dec[(size_t)r] ? 2e-5 : tc_rel);
    }
}

void test_attention_vs_cpu()
{
    // The golden models' head_dim 16: fresh and chunked prefill, decode.
    for (kvf_dtype_t adt : k_adts)
        attention_case({4, 2, 16, 16}, {{0, 20}, {37, 9}, {5, 1}, {60, 1}}, adt, 0, 0);
    // Llama 1B's head_dim 64 with group 4; long prefill over several tiles.
    attention_case({8, 2, 64, 16}, {{0, 30}, {100, 17}, {150, 1}, {20, 1}}, KVF_DTYPE_BF16, 0, 0);
    attention_case({8, 2, 64, 16}, {{150, 1}, {20, 1}, {7, 1}}, KVF_DTYPE_F32, 32, 2);
    // head_dim 128, group 1.
    attention_case({4, 4, 128, 16}, {{40, 30}, {130, 1}}, KVF_DTYPE_F32, 64, 1);
    attention_case({4, 4, 128, 16}, {{0, 6}, {77, 1}}, KVF_DTYPE_F16, 0, 0);
    // head_dim 96 and 80 do not divide the decode CTA's 128 threads: threads
    // past the columns must stay out of the store (the n_kg == 1 race).
    for (kvf_dtype_t adt : k_adts)
        attention_case({4, 2, 96, 16}, {{0, 5}, {200, 1}, {33, 1}}, adt, 32, 2);
    attention_case({4, 1, 80, 16}, {{0, 12}, {50, 1}, {7, 1}}, KVF_DTYPE_F16, 16, 1);
    attention_case({6, 3, 80, 16}, {{20, 8}, {90, 1}}, KVF_DTYPE_F32, 0, 0);
    // Block sizes 1 and 256.
    attention_case({4, 2, 16, 1}, {{0, 9}, {20, 1}, {3, 1}}, KVF_DTYPE_F32, 8, 1);
    attention_case({4, 2, 64, 256}, {{0, 40}, {280, 1}, {600, 2}}, KVF_DTYPE_BF16, 256, 1);
    // Group 16 (a GCAP of its own) and 32, the largest.
    attention_case({16, 1, 32, 16}, {{0, 5}, {70, 1}}, KVF_DTYPE_F32, 0, 0);
    attention_case({32, 1, 16, 8}, {{10, 4}, {45, 1}}, KVF_DTYPE_F32, 0, 1);

    // Prefill on tensor cores, as the backend runs bf16/f16 head dims of
    // 16 k: over a chunk of 64 keys, several chunks, chunked prefill, the
    // head dims above, masked rows of a partial tile.
    const prefill_kernel tc = prefill_kernel::tensor_cores;
    attention_case({4, 2, 16, 16}, {{0, 20}, {37, 9}, {5, 1}}, KVF_DTYPE_BF16, 0, 0, tc);
    attention_case({4, 2, 16, 16}, {{0, 20}, {37, 9}, {5, 1}}, KVF_DTYPE_F16, 0, 0, tc);
    attention_case({8, 2, 64, 16}, {{0, 30}, {100, 17}, {150, 1}}, KVF_DTYPE_BF16, 0, 0, tc);
    attention_case({4, 4, 128, 16}, {{40, 30}, {130, 1}}, KVF_DTYPE_F16, 64, 1, tc);
    attention_case({4, 2, 96, 1}, {{0, 5}, {70, 1}}, KVF_DTYPE_F16, 32, 1, tc);
    attention_case({4, 1, 80, 256}, {{0, 12}, {250, 9}}, KVF_DTYPE_BF16, 0, 0, tc);
    attention_case({32, 1, 16, 16}, {{10, 4}, {45, 1}}, KVF_DTYPE_F16, 0, 0, tc);
}

// ---- attention against a double loop, with ids outside the pool --------------------
//
// The cases of the first emulator harness: random pool contents and tables
// with ids outside the pool (or a position past the table), which the
// kernels read as zero K and V; the CPU backend cannot take those, so the
// reference is a loop in double.

struct raw_batch {
    geometry g;
    int n_layers = 2, layer = 1, n_blocks = 0, bt_stride = 0, n_seqs = 0, n_tokens = 0;
    long long block_stride = 0;
    std::vector<float> pool;
    std::vector<int32_t> bt, pos, seq; // bt (n_seqs, bt_stride)
    std::vector<float> q;
    int ld_q = 0, ld_out = 0;
    std::vector<double> ref; // (n_tokens, n_heads * head_dim)
};

// rows[s] = (first position, count) of sequence s's tokens in the batch;
// bad_ids table entries are replaced with ids outside the pool.
raw_batch make_raw_batch(geometry g, const std::vector<std::pair<int, int>> &rows, int bad_ids)
{
    raw_batch b;
    b.g = g;
    b.n_seqs = (int)rows.size();
    auto blocks_of = [&](const std::pair<int, int> &r) {
        return (r.first + r.second - 1) / g.block_size + 1;
    };
    int need = 0, widest = 0;
    for (auto &r : rows) {
        need += blocks_of(r);
        widest = std::max(widest, blocks_of(r));
    }
    b.bt_stride = widest + 2;
    b.n_blocks = need + 3;
    b.block_stride = (long long)b.n_layers * 2 * g.n_kv_heads * g.block_size * g.head_dim;
    b.pool = random_floats((size_t)b.n_blocks * b.block_stride);
    std::vector<int> perm((size_t)b.n_blocks);
    for (int i = 0; i < b.n_blocks; i++)
        perm[(size_t)i] = i;
    std::shuffle(perm.begin(), perm.end(), g_rng);
    b.bt.assign((size_t)b.n_seqs * b.bt_stride, -7);
    int k = 0;
    for (int s = 0; s < b.n_seqs; s++)
        for (int i = 0; i < blocks_of(rows[(size_t)s]); i++)
            b.bt[(size_t)s * b.bt_stride + i] = perm[(size_t)k++];
    for (int i = 0; i < bad_ids; i++) {
        int s = (int)(g_rng() % (unsigned)b.n_seqs);
        int at = (int)(g_rng() % (unsigned)blocks_of(rows[(size_t)s]));
        b.bt[(size_t)s * b.bt_stride + at] = (i & 1) ? -3 : b.n_blocks + (int)(g_rng() % 5);
    }
    for (int s = 0; s < b.n_seqs; s++)
        for (int i = 0; i < rows[(size_t)s].second; i++) {
            b.pos.push_back(rows[(size_t)s].first + i);
            b.seq.push_back(s);
        }
    b.n_tokens = (int)b.pos.size();
    const int q_dim = g.n_heads * g.head_dim, group = g.n_heads / g.n_kv_heads;
    b.ld_q = q_dim + 8;
    b.ld_out = q_dim + 4;
    b.q = random_floats((size_t)b.n_tokens * b.ld_q, -3, 3);
    b.ref.assign((size_t)b.n_tokens * q_dim, 0);
    for (int t = 0; t < b.n_tokens; t++)
        for (int h = 0; h < g.n_heads; h++) {
            const int kvh = h / group, last = b.pos[(size_t)t];
            // K (kv = 0) or V (1) row of position p; nullptr: reads as zeros.
            auto row = [&](int p, int kv) -> const float * {
                int blk = b.bt[(size_t)b.seq[(size_t)t] * b.bt_stride + p / g.block_size];
                if (blk < 0 || blk >= b.n_blocks)
                    return nullptr;
                return b.pool.data() + (size_t)blk * b.block_stride +
                       (size_t)b.layer * 2 * g.n_kv_heads * g.block_size * g.head_dim +
                       (size_t)kv * g.n_kv_heads * g.block_size * g.head_dim +
                       ((size_t)kvh * g.block_size + p % g.block_size) * g.head_dim;
            };
            std::vector<double> sc((size_t)last + 1);
            double mx = -INFINITY;
            for (int p = 0; p <= last; p++) {
                const float *kr = row(p, 0);
                double d = 0;
                for (int j = 0; j < g.head_dim; j++)
                    d += (double)b.q[(size_t)t * b.ld_q + h * g.head_dim + j] * (kr ? kr[j] : 0.0);
                sc[(size_t)p] = d / sqrt((double)g.head_dim);
                mx = std::max(mx, sc[(size_t)p]);
            }
            double l = 0;
            std::vector<double> o((size_t)g.head_dim, 0);
            for (int p = 0; p <= last; p++) {
                double e = exp(sc[(size_t)p] - mx);
                l += e;
                if (const float *vr = row(p, 1))
                    for (int j = 0; j < g.head_dim; j++)
                        o[(size_t)j] += e * vr[j];
            }
            for (int j = 0; j < g.head_dim; j++)
                b.ref[(size_t)t * q_dim + h * g.head_dim + j] = o[(size_t)j] / l;
        }
    return b;
}

kvf_cuda_attn_t raw_attn(raw_batch &b, void *out, kvf_dtype_t adt)
{
    kvf_cuda_attn_t a{};
    a.kv_layer =
        b.pool.data() + (size_t)b.layer * 2 * b.g.n_kv_heads * b.g.block_size * b.g.head_dim;
    a.block_stride = b.block_stride;
    a.n_pool_blocks = b.n_blocks;
    a.n_heads = b.g.n_heads;
    a.n_kv_heads = b.g.n_kv_heads;
    a.head_dim = b.g.head_dim;
    a.block_size = b.g.block_size;
    a.scale = (float)(1.0 / sqrt((double)b.g.head_dim));
    a.q = b.q.data();
    a.ld_q = b.ld_q;
    a.out = out;
    a.ld_out = b.ld_out;
    a.adt = adt;
    a.n_tokens = b.n_tokens;
    a.pos = b.pos.data();
    a.seq = b.seq.data();
    a.block_tables = b.bt.data();
    a.bt_stride = b.bt_stride;
    a.n_seqs = b.n_seqs;
    return a;
}

// written[t]: row t must hold a result; other rows keep the sentinel.
void compare_raw(check &c, raw_batch &b, const std::vector<unsigned char> &out, kvf_dtype_t adt,
                 const std::vector<char> &written)
{
    const int q_dim = b.g.n_heads * b.g.head_dim;
    int shown = 0;
    for (int t = 0; t < b.n_tokens; t++)
        for (int j = 0; j < b.ld_out; j++) {
            size_t i = (size_t)t * b.ld_out + j;
            if (!written[(size_t)t] || j >= q_dim) {
                if (!is_sentinel(out, adt, i) && shown++ < 3)
                    c.fail("row %d column %d written", t, j);
                continue;
            }
            double w = b.ref[(size_t)t * q_dim + j];
            double tol = 2e-5 * (1 + fabs(w)) + half_ulp(adt, w) * 1.0001;
            float gv = act_get(out.data(), adt, i);
            if (!c.near(gv, w, tol) && shown++ < 3)
                c.fail("row %d column %d: %.9g, want %.9g", t, j, gv, w);
        }
}

// tile_cap > 0: tiles of at most that many tokens.
void raw_prefill(geometry g, std::vector<std::pair<int, int>> rows, int bad_ids, kvf_dtype_t adt,
                 int tile_cap)
{
    raw_batch b = make_raw_batch(g, rows, bad_ids);
    int tt = kvf_cuda_prefill_tile_tokens(g.n_heads / g.n_kv_heads);
    if (tile_cap > 0 && tile_cap < tt)
        tt = tile_cap;
    std::vector<int32_t> tiles;
    int max_pos = 0;
    for (int t = 0; t < b.n_tokens;) {
        int e = t + 1;
        while (e < b.n_tokens && e - t < tt && b.seq[(size_t)e] == b.seq[(size_t)t])
            e++;
        tiles.push_back(t);
        tiles.push_back(e - t);
        max_pos = std::max(max_pos, b.pos[(size_t)e - 1]);
        t = e;
    }
    check c(fmt("prefill (double ref) h%d/%d hd%d bs%d %zu tiles %s, %d ids outside the pool",
                g.n_heads, g.n_kv_heads, g.head_dim, g.block_size, tiles.size() / 2,
                kvf_dtype_name(adt), bad_ids));
    auto out = both_orders(c, [&] {
        auto o = sentinel_buffer((size_t)b.n_tokens * b.ld_out, adt);
        kvf_cuda_attn_t a = raw_attn(b, o.data(), adt);
        kvf_cuda_prefill_tiles_t pt = {tiles.data(), (int)tiles.size() / 2, max_pos};
        launch_ok(c, "attention_prefill",
                  [&] { return kvf_cuda_attention_prefill(nullptr, &a, &pt); });
        return o;
    });
    compare_raw(c, b, out, adt, std::vector<char>((size_t)b.n_tokens, 1));
}

// Decode tokens: the last row of each sequence and every third row, in
// reverse batch order. split_keys 0: the default for the geometry.
void raw_decode(geometry g, std::vector<std::pair<int, int>> rows, int bad_ids, kvf_dtype_t adt,
                int split_keys, int extra_splits)
{
    raw_batch b = make_raw_batch(g, rows, bad_ids);
    if (split_keys <= 0)
        split_keys = kvf_cuda_decode_split_keys(g.n_heads / g.n_kv_heads, g.block_size);
    std::vector<int32_t> toks;
    std::vector<char> written((size_t)b.n_tokens, 0);
    int max_pos = 0;
    for (int t = 0; t < b.n_tokens; t++)
        if (t % 3 == 0 || t + 1 == b.n_tokens || b.seq[(size_t)t + 1] != b.seq[(size_t)t]) {
            toks.push_back(t);
            written[(size_t)t] = 1;
            max_pos = std::max(max_pos, b.pos[(size_t)t]);
        }
    std::reverse(toks.begin(), toks.end());
    int n_splits = (max_pos + 1 + split_keys - 1) / split_keys + extra_splits;
    while ((long long)n_splits * split_keys > (long long)b.bt_stride * g.block_size + split_keys)
        n_splits--;
    check c(fmt("decode (double ref) h%d/%d hd%d bs%d %zu tokens x %d splits of %d %s, %d ids "
                "outside the pool",
                g.n_heads, g.n_kv_heads, g.head_dim, g.block_size, toks.size(), n_splits,
                split_keys, kvf_dtype_name(adt), bad_ids));
    auto out = both_orders(c, [&] {
        std::vector<float> ws(
            kvf_cuda_decode_ws_floats((int)toks.size(), g.n_heads, n_splits, g.head_dim), NAN);
        auto o = sentinel_buffer((size_t)b.n_tokens * b.ld_out, adt);
        kvf_cuda_attn_t a = raw_attn(b, o.data(), adt);
        kvf_cuda_decode_plan_t p = {toks.data(), (int)toks.size(), n_splits, split_keys, ws.data()};
        launch_ok(c, "attention_decode",
                  [&] { return kvf_cuda_attention_decode(nullptr, &a, &p); });
        return o;
    });
    compare_raw(c, b, out, adt, written);
}

void test_attention_raw()
{
    const kvf_dtype_t f32 = KVF_DTYPE_F32, bf16 = KVF_DTYPE_BF16, f16 = KVF_DTYPE_F16;
    // Chunked prefill (nonzero start), several sequences, partial tiles.
    raw_prefill({4, 2, 16, 16}, {{0, 20}, {37, 9}, {5, 1}}, 0, f32, 0);
    raw_prefill({2, 2, 8, 3}, {{0, 7}, {10, 40}}, 0, f32, 0);
    raw_prefill({7, 1, 24, 5}, {{3, 12}, {0, 2}}, 0, bf16, 0);
    raw_prefill({32, 1, 16, 16}, {{0, 3}, {70, 4}}, 0, f32, 0);
    raw_prefill({8, 2, 64, 16}, {{0, 20}, {100, 17}}, 0, f16, 0);
    raw_prefill({4, 4, 128, 16}, {{40, 70}}, 0, f32, 0);
    raw_prefill({2, 1, 136, 4}, {{0, 5}, {30, 33}}, 0, f32, 0);
    raw_prefill({4, 2, 256, 16}, {{0, 3}, {45, 20}}, 0, f32, 0);
    raw_prefill({4, 2, 32, 1}, {{0, 70}}, 0, f32, 5);
    raw_prefill({4, 2, 16, 16}, {{0, 40}, {60, 30}}, 3, f32, 0);
    raw_prefill({6, 3, 48, 7}, {{13, 11}}, 2, f32, 0);
    raw_prefill({32, 1, 256, 16}, {{0, 5}, {40, 3}}, 0, bf16, 0);
    raw_prefill({64, 2, 8, 2}, {{0, 9}}, 1, f32, 0);
    raw_prefill({4, 2, 96, 16}, {{0, 9}, {30, 12}}, 2, f32, 0);
    raw_prefill({4, 1, 80, 8}, {{5, 20}}, 1, bf16, 0);

    raw_decode({4, 2, 16, 16}, {{0, 20}, {37, 9}, {5, 1}}, 0, f32, 0, 0);
    raw_decode({4, 2, 16, 16}, {{0, 20}, {37, 9}, {5, 1}}, 0, f32, 16, 2);
    raw_decode({2, 2, 8, 3}, {{0, 7}, {10, 40}}, 0, f32, 6, 1);
    raw_decode({7, 1, 24, 5}, {{3, 12}, {0, 2}}, 0, bf16, 10, 1);
    raw_decode({32, 1, 16, 16}, {{0, 3}, {70, 4}}, 0, f32, 32, 0);
    raw_decode({8, 2, 64, 16}, {{0, 20}, {100, 17}}, 0, f16, 48, 1);
    raw_decode({4, 4, 128, 16}, {{40, 70}}, 0, f32, 32, 0);
    raw_decode({2, 1, 136, 4}, {{0, 5}, {30, 33}}, 0, f32, 8, 2);
    raw_decode({4, 2, 256, 16}, {{0, 3}, {45, 20}}, 0, f32, 0, 0);
    raw_decode({4, 2, 256, 16}, {{0, 3}, {45, 20}}, 0, f32, 16, 1);
    raw_decode({32, 2, 256, 16}, {{300, 3}}, 0, f32, 128, 0);
    raw_decode({4, 2, 32, 1}, {{0, 70}}, 0, f32, 7, 1);
    raw_decode({4, 2, 16, 16}, {{0, 40}, {60, 30}}, 3, f32, 16, 1);
    raw_decode({6, 3, 48, 7}, {{13, 11}}, 2, f32, 7, 0);
    raw_decode({32, 1, 256, 16}, {{200, 2}, {0, 1}}, 0, f32, 128, 1);
    raw_decode({64, 2, 8, 2}, {{0, 9}}, 1, f32, 64, 0);
    raw_decode({4, 2, 96, 16}, {{0, 9}, {30, 12}}, 2, f32, 16, 2);
    raw_decode({4, 1, 80, 8}, {{5, 20}}, 1, bf16, 24, 1);
    // head_dim 200: a second column pass of 72, again n_kg == 1.
    raw_decode({2, 1, 200, 16}, {{0, 6}, {50, 4}}, 0, f32, 32, 1);
}

void test_attention_shapes()
{
    check c("attention: bad shapes refused, empty batches launch nothing, launch errors surface");
    float pool[64] = {0}, q[64] = {0}, ws[64];
    unsigned char out[256];
    int32_t pos[1] = {0}, seq[1] = {0}, bt[1] = {0}, tiles[2] = {0, 1}, toks[1] = {0};
    kvf_cuda_attn_t ok{};
    ok.kv_layer = pool;
    ok.block_stride = 2 * 16;
    ok.n_pool_blocks = 1;
    ok.n_heads = ok.n_kv_heads = 1;
    ok.head_dim = 16;
    ok.block_size = 1;
    ok.scale = 0.25f;
    ok.q = q;
    ok.ld_q = 16;
    ok.out = out;
    ok.ld_out = 16;
    ok.adt = KVF_DTYPE_F32;
    ok.n_tokens = 1;
    ok.pos = pos;
    ok.seq = seq;
    ok.block_tables = bt;
    ok.bt_stride = 1;
    ok.n_seqs = 1;
    kvf_cuda_prefill_tiles_t pt = {tiles, 1, 0};
    kvf_cuda_decode_plan_t dp = {toks, 1, 1, 1, ws};

    auto both = [&](const char *what, kvf_status_t want, kvf_cuda_attn_t a) {
        refused(c, what, want, [&] { return kvf_cuda_attention_prefill(nullptr, &a, &pt); });
        refused(c, what, want, [&] { return kvf_cuda_attention_decode(nullptr, &a, &dp); });
    };
    kvf_cuda_attn_t a = ok;
    a.head_dim = 12;
    a.ld_q = a.ld_out = 12;
    both("head_dim 12", KVF_ERR_UNSUPPORTED, a);
    a = ok;
    a.n_heads = 33;
    a.ld_q = a.ld_out = 33 * 16;
    both("group 33", KVF_ERR_UNSUPPORTED, a);
    a = ok;
    a.q = nullptr;
    both("no q", KVF_ERR_INVAL, a);
    a = ok;
    a.block_stride = 8;
    both("block stride below a slice", KVF_ERR_INVAL, a);
    a = ok;
    a.adt = KVF_DTYPE_UNKNOWN;
    both("unknown dtype", KVF_ERR_INVAL, a);

    kvf_cuda_prefill_tiles_t far = {tiles, 1, 5}; // position 5 past a 1-block table
    refused(c, "tile past the table", KVF_ERR_INVAL,
            [&] { return kvf_cuda_attention_prefill(nullptr, &ok, &far); });
    kvf_cuda_attn_t a2 = ok;
    a2.block_size = 2;
    a2.block_stride = 2 * 2 * 16;
    kvf_cuda_decode_plan_t odd = {toks, 1, 1, 3, ws}; // 3 keys: not a multiple of 2
    refused(c, "split not a multiple of the block", KVF_ERR_INVAL,
            [&] { return kvf_cuda_attention_decode(nullptr, &a2, &odd); });
    kvf_cuda_decode_plan_t wide = {toks, 1, 1, 8192, ws}; // past the score buffer
    refused(c, "split past the score buffer", KVF_ERR_INVAL,
            [&] { return kvf_cuda_attention_decode(nullptr, &ok, &wide); });

    // Tensor cores: 16-bit activations and head dims of 16 k up to 128 only.
    refused(c, "tensor cores, f32", KVF_ERR_UNSUPPORTED,
            [&] { return kvf_cuda_attention_prefill_tc(nullptr, &ok, &pt); });
    for (int hd : {24, 136}) {
        a = ok;
        a.adt = KVF_DTYPE_BF16;
        a.head_dim = hd;
        a.ld_q = a.ld_out = hd;
        a.block_stride = 2 * hd;
        refused(c, "tensor cores, head dim not 16 k up to 128", KVF_ERR_UNSUPPORTED,
                [&] { return kvf_cuda_attention_prefill_tc(nullptr, &a, &pt); });
    }
    a = ok;
    a.head_dim = 12;
    a.ld_q = a.ld_out = 12;
    refused(c, "tensor cores, head_dim 12", KVF_ERR_UNSUPPORTED,
            [&] { return kvf_cuda_attention_prefill_tc(nullptr, &a, &pt); });

    kvf_cuda_prefill_tiles_t none = {tiles, 0, 0};
    empty_ok(c, "attention_prefill",
             [&] { return kvf_cuda_attention_prefill(nullptr, &ok, &none); });
    kvf_cuda_attn_t ok16 = ok;
    ok16.adt = KVF_DTYPE_F16;
    empty_ok(c, "attention_prefill_tc",
             [&] { return kvf_cuda_attention_prefill_tc(nullptr, &ok16, &none); });
    kvf_cuda_decode_plan_t nodec = {toks, 0, 1, 1, ws};
    empty_ok(c, "attention_decode",
             [&] { return kvf_cuda_attention_decode(nullptr, &ok, &nodec); });

    // A shape the checks pass but the device cannot launch: 70000 kv heads
    // make grid.y too large. The launch is refused before any thread runs (so
    // the small buffers are never read) and the launcher reports it.
    a = ok;
    a.n_heads = a.n_kv_heads = 70000;
    a.ld_q = a.ld_out = 70000 * 16;
    a.block_stride = 2LL * 70000 * 16;
    unsigned long long ctas = kvf_emu::get_stats().ctas;
    printf("      (2 refused launches expected below)\n");
    kvf_log_set_level(KVF_LOG_OFF);
    kvf_status_t s1 = kvf_cuda_attention_prefill(nullptr, &a, &pt);
    kvf_status_t s2 = kvf_cuda_attention_decode(nullptr, &a, &dp);
    kvf_log_set_level(KVF_LOG_ERROR);
    if (s1 != KVF_ERR_INVAL || s2 != KVF_ERR_INVAL)
        c.fail("a refused launch returned %s and %s, want %s", kvf_status_str(s1),
               kvf_status_str(s2), kvf_status_str(KVF_ERR_INVAL));
    if (kvf_emu::get_stats().ctas != ctas)
        c.fail("a refused launch ran CTAs");
    if (cudaGetLastError() != cudaSuccess)
        c.fail("the launcher left the launch error behind");
}

} // namespace

int main(void)
{
    // One line at a time, so PASS/FAIL lines and the emulator's messages
    // (stderr) interleave in order in a ctest log.
    setvbuf(stdout, nullptr, _IOLBF, 0);
    kvf_log_set_level(KVF_LOG_ERROR);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    printf("test_cuda_emu: the kernels of common/backend/cuda under the CPU emulator, every launch "
           "in both thread orders\n");
    if (kvf_backend_cpu_create(1, &g_cpu) != KVF_OK) {
        fprintf(stderr, "test_cuda_emu: cannot create the CPU backend\n");
        return 1;
    }
    test_conversions();
    test_emulator();
    test_runtime_memory();
    test_runtime_streams();
    test_runtime_graphs();
    test_runtime_device();
    test_gemm();
    test_embed();
    test_add_rmsnorm();
    test_qkv_rope_write();
    test_swiglu();
    test_argmax();
    test_gather();
    test_attention_shapes();
    test_attention_vs_cpu();
    test_attention_raw();
    kvf_backend_destroy(&g_cpu);

    clock_gettime(CLOCK_MONOTONIC, &t1);
    kvf_emu::stats st = kvf_emu::get_stats();
    printf("emulated: %llu launches, %llu CTAs, %.1fM fiber switches, largest dynamic shared "
           "memory %zu bytes, %.1f s\n",
           st.launches, st.ctas, (double)st.switches / 1e6, st.max_dynamic_smem,
           (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
    printf("test_cuda_emu: %d passed, %d failed\n", g_passed, g_failed);
    return g_failed ? 1 : 0;
}
