// The harness of test_cuda_emu, shared by its files (test_cuda_emu.cc says
// what is tested and runs the cases in a fixed order; the harness's
// functions are defined there):
//
//   test_cuda_emu_self.cc            the emulator itself: f16/bf16
//                                    conversions, kernels that break the rules
//   test_cuda_emu_runtime.cc         the emulated runtime: memory, streams and
//                                    events, graphs, the device queries
//   test_cuda_emu_gemm.cc            cublasGemmEx
//   test_cuda_emu_elementwise.cc     embed, add_rmsnorm, swiglu, argmax, gather
//   test_cuda_emu_kv.cc              paged-KV batches (test_cuda_emu_kv.h) and
//                                    qkv_rope_write
//   test_cuda_emu_attention.cc       attention against the CPU backend, and the
//                                    launchers' shape checks
//   test_cuda_emu_attention_raw.cc   attention against a double loop, with ids
//                                    outside the pool
//
// One random generator with a fixed seed serves every case, drawn in the
// order main() runs them: a failure reproduces.
#ifndef KVF_TEST_CUDA_EMU_H
#define KVF_TEST_CUDA_EMU_H

#include <cuda_runtime.h>

#include "kvf/backend.h"
#include "kvf/dtype.h"
#include "kvf/log.h"
#include "kvf/status.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

namespace kvf_emu_test
{

// ---- the cases, in the order main() runs them ----------------------------------

// test_cuda_emu_self.cc
void test_conversions();
void test_emulator();
// test_cuda_emu_runtime.cc
void test_runtime_memory();
void test_runtime_streams();
void test_runtime_graphs();
void test_runtime_device();
// test_cuda_emu_gemm.cc
void test_gemm();
// test_cuda_emu_elementwise.cc (and test_qkv_rope_write of test_cuda_emu_kv.cc
// between add_rmsnorm and swiglu)
void test_embed();
void test_add_rmsnorm();
void test_qkv_rope_write();
void test_swiglu();
void test_geglu();
void test_scale_softcap();
void test_argmax();
void test_gather();
// test_cuda_emu_attention.cc, test_cuda_emu_attention_raw.cc
void test_attention_shapes();
void test_attention_vs_cpu();
void test_attention_raw();

// ---- harness -----------------------------------------------------------------

extern int g_passed, g_failed;
extern kvf_backend_t g_cpu; // the reference backend
extern std::mt19937 g_rng;  // fixed: a failure reproduces

float urand(float lo = -1.0f, float hi = 1.0f);
std::vector<float> random_floats(size_t n, float lo = -1.0f, float hi = 1.0f);

// One case: collects failures, prints one PASS/FAIL line when it ends.
class check
{
  public:
    explicit check(std::string name) : name_(std::move(name))
    {
    }
    ~check();
    void fail(const char *fmt, ...) __attribute__((format(printf, 2, 3)));
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

template <typename T> std::vector<unsigned char> bytes_of(const std::vector<T> &v)
{
    const unsigned char *p = (const unsigned char *)v.data();
    return std::vector<unsigned char>(p, p + v.size() * sizeof(T));
}

void append(std::vector<unsigned char> &dst, const void *p, size_t n);

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

// Device memory from and to the host (cudaMemcpy); a failed download reads
// -12345.
std::vector<float> download(const float *dev, size_t n);
void upload(float *dev, const std::vector<float> &h);

// ---- activation buffers (f32, bf16 or f16) -----------------------------------

constexpr kvf_dtype_t k_adts[3] = {KVF_DTYPE_F32, KVF_DTYPE_BF16, KVF_DTYPE_F16};

float act_get(const void *buf, kvf_dtype_t dt, size_t i);

// Half a unit in the last place of the storage type at |x|: what rounding
// the f32 result to it may add.
double half_ulp(kvf_dtype_t dt, double x);

// Output bytes prefilled with this pattern: columns a kernel must not write
// keep it.
constexpr unsigned char k_sentinel = 0xa7;

std::vector<unsigned char> sentinel_buffer(size_t n, kvf_dtype_t dt);
bool is_sentinel(const std::vector<unsigned char> &buf, kvf_dtype_t dt, size_t i);

// Compares rows x cols of an act buffer (row stride ld) with want (row
// stride ld_want): within rel * max(1, |want|) plus the storage rounding.
// Columns cols .. ld - 1 must keep the sentinel.
void compare_rows(check &c, const char *what, const std::vector<unsigned char> &got, kvf_dtype_t dt,
                  int rows, int cols, int ld, const float *want, int ld_want, double rel);

} // namespace kvf_emu_test

#endif
