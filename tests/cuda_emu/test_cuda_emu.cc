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
//   kvf_cuda_geglu               CPU backend geglu
//   kvf_cuda_scale, _softcap     exact; kvf_det_softcap
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
// Prints PASS or FAIL per case and exits 1 when any failed. The cases are
// in the files test_cuda_emu.h lists, one concept each; this file holds
// the harness they share and main(), which runs them in a fixed order.

#include "test_cuda_emu.h"

#include <stdarg.h>
#include <stdlib.h>
#include <time.h>

namespace kvf_emu_test
{

// ---- harness -----------------------------------------------------------------

int g_passed, g_failed;
kvf_backend_t g_cpu;
std::mt19937 g_rng(20240531);

float urand(float lo, float hi)
{
    return std::uniform_real_distribution<float>(lo, hi)(g_rng);
}

std::vector<float> random_floats(size_t n, float lo, float hi)
{
    std::vector<float> v(n);
    for (float &x : v)
        x = urand(lo, hi);
    return v;
}

check::~check()
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

void check::fail(const char *fmt, ...)
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

std::string fmt(const char *f, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, sizeof buf, f, ap);
    va_end(ap);
    return buf;
}

void append(std::vector<unsigned char> &dst, const void *p, size_t n)
{
    dst.insert(dst.end(), (const unsigned char *)p, (const unsigned char *)p + n);
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

// ---- activation buffers (f32, bf16 or f16) -----------------------------------

float act_get(const void *buf, kvf_dtype_t dt, size_t i)
{
    if (dt == KVF_DTYPE_F32)
        return ((const float *)buf)[i];
    uint16_t h;
    memcpy(&h, (const unsigned char *)buf + 2 * i, 2);
    return dt == KVF_DTYPE_BF16 ? kvf_bf16_to_f32(h) : kvf_f16_to_f32(h);
}

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

} // namespace kvf_emu_test

int main(void)
{
    using namespace kvf_emu_test;
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
    test_geglu();
    test_scale_softcap();
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
