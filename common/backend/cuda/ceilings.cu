// GPU ceilings for benchmarks (kvf/gpu_bench.h): device-to-device copy
// bandwidth and the cuBLAS GEMM rate, each timed with CUDA events on its
// own stream, best of reps after a warm-up.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_common.cuh"
#include "cuda_ops.h"
#include "kvf/dtype.h"
#include "kvf/gpu_bench.h"
#include "kvf/log.h"
#include "kvf/status.h"

// ---- timing context ------------------------------------------------------

// The device a measurement runs on, made current for the call (the caller's
// device is restored in ceil_rig_fini), a stream and two events.
typedef struct {
    int prev_device;
    bool restore_device;
    cudaStream_t stream;
    cudaEvent_t start, stop;
} ceil_rig_t;

// Also clears the thread's last CUDA error: a failure here (a buffer that
// did not fit) must not be reported again by the next launch check of
// whoever uses CUDA on this thread after us.
static void ceil_rig_fini(ceil_rig_t *r)
{
    if (r->stop)
        cudaEventDestroy(r->stop);
    if (r->start)
        cudaEventDestroy(r->start);
    if (r->stream)
        cudaStreamDestroy(r->stream);
    if (r->restore_device)
        cudaSetDevice(r->prev_device);
    cudaGetLastError();
}

// On success the rig is the caller's to ceil_rig_fini(); on failure nothing
// is left to free.
static kvf_status_t ceil_rig_init(ceil_rig_t *r, int device)
{
    *r = ceil_rig_t{};
    kvf_status_t st = KVF_CUDA_TRY(cudaGetDevice(&r->prev_device), "cudaGetDevice");
    if (st == KVF_OK)
        st = KVF_CUDA_TRY(cudaSetDevice(device), "cudaSetDevice (gpu bench)");
    if (st != KVF_OK) {
        cudaGetLastError();
        return st;
    }
    r->restore_device = true;
    st = KVF_CUDA_TRY(cudaStreamCreateWithFlags(&r->stream, cudaStreamNonBlocking),
                      "cudaStreamCreate");
    if (st == KVF_OK)
        st = KVF_CUDA_TRY(cudaEventCreate(&r->start), "cudaEventCreate");
    if (st == KVF_OK)
        st = KVF_CUDA_TRY(cudaEventCreate(&r->stop), "cudaEventCreate");
    if (st != KVF_OK)
        ceil_rig_fini(r);
    return st;
}

// Best milliseconds of reps runs of op() (enqueues work on r->stream and
// returns a status), each between two events, after one warm-up run.
template <typename Op>
static kvf_status_t ceil_time_best(ceil_rig_t *r, int reps, Op op, float *best_ms_p)
{
    float best_ms = -1;
    kvf_status_t st = KVF_OK;
    for (int rep = 0; rep <= reps && st == KVF_OK; rep++) {
        st = KVF_CUDA_TRY(cudaEventRecord(r->start, r->stream), "cudaEventRecord");
        if (st == KVF_OK)
            st = op();
        if (st == KVF_OK)
            st = KVF_CUDA_TRY(cudaEventRecord(r->stop, r->stream), "cudaEventRecord");
        if (st == KVF_OK)
            st = KVF_CUDA_TRY(cudaEventSynchronize(r->stop), "cudaEventSynchronize");
        float ms = 0;
        if (st == KVF_OK)
            st = KVF_CUDA_TRY(cudaEventElapsedTime(&ms, r->start, r->stop), "cudaEventElapsedTime");
        if (st == KVF_OK && rep > 0 && ms > 0 && (best_ms < 0 || ms < best_ms))
            best_ms = ms;
    }
    if (st == KVF_OK && best_ms <= 0) {
        kvf_log_error("gpu bench: the timed work took no measurable time");
        st = KVF_ERR_DEVICE;
    }
    if (st == KVF_OK)
        *best_ms_p = best_ms;
    return st;
}

// ---- fill ----------------------------------------------------------------

// p[i] = a pseudo-random value of magnitude in [0.25, 0.75) and random sign:
// never zero in any dtype, so no zero-skipping can flatter the GEMM rate.
template <typename T> __global__ void ceil_fill_kernel(T *p, size_t n, uint32_t seed)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        uint32_t h = (uint32_t)i * 0x9e3779b1u ^ (uint32_t)(i >> 32) ^ seed;
        h ^= h >> 16;
        h *= 0x7feb352du;
        h ^= h >> 15;
        h *= 0x846ca68bu;
        h ^= h >> 16;
        float mag = 0.25f + 0.5f * (float)(h >> 8) * (1.0f / 16777216.0f);
        p[i] = kvf_from_f32<T>((h & 1u) ? -mag : mag);
    }
}

// Fills n elements of dtype at p (device memory) on stream st.
static kvf_status_t ceil_fill(cudaStream_t st, void *p, kvf_dtype_t dtype, size_t n, uint32_t seed)
{
    if (n == 0)
        return KVF_OK;
    const int threads = 256;
    size_t want = (n + threads - 1) / threads;
    unsigned blocks = want < 65536 ? (unsigned)want : 65536u;
    KVF_DISPATCH_ADT(dtype, T, ceil_fill_kernel<T><<<blocks, threads, 0, st>>>((T *)p, n, seed));
    return KVF_CUDA_LAUNCHED("ceil_fill_kernel");
}

// ---- copy bandwidth ------------------------------------------------------

extern "C" kvf_status_t kvf_gpu_copy_bandwidth(int device, size_t bytes, int reps,
                                               double *bytes_per_s_p)
{
    if (bytes == 0 || reps < 1) {
        kvf_log_error("gpu bench: copy bandwidth needs bytes > 0 and reps >= 1 (got %zu, %d)",
                      bytes, reps);
        return KVF_ERR_INVAL;
    }
    ceil_rig_t r;
    kvf_status_t st = ceil_rig_init(&r, device);
    if (st != KVF_OK)
        return st;
    void *src = NULL, *dst = NULL;
    float best_ms = -1;
    st = KVF_CUDA_TRY(cudaMalloc(&src, bytes), "cudaMalloc (copy source)");
    if (st != KVF_OK)
        goto fail_src;
    st = KVF_CUDA_TRY(cudaMalloc(&dst, bytes), "cudaMalloc (copy destination)");
    if (st != KVF_OK)
        goto fail_dst;
    // Both buffers touched once, so no first-use cost lands in a timed copy.
    st = KVF_CUDA_TRY(cudaMemsetAsync(src, 0x5a, bytes, r.stream), "cudaMemsetAsync");
    if (st == KVF_OK)
        st = KVF_CUDA_TRY(cudaMemsetAsync(dst, 0, bytes, r.stream), "cudaMemsetAsync");
    if (st == KVF_OK)
        st = ceil_time_best(
            &r, reps,
            [&] {
                return KVF_CUDA_TRY(
                    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, r.stream),
                    "cudaMemcpyAsync (device to device)");
            },
            &best_ms);
    if (st == KVF_OK)
        *bytes_per_s_p = 2.0 * (double)bytes / (best_ms * 1e-3);
    cudaStreamSynchronize(r.stream); // nothing may still use the buffers
    cudaFree(dst);
fail_dst:
    cudaFree(src);
fail_src:
    ceil_rig_fini(&r);
    return st;
}

// ---- GEMM rate -----------------------------------------------------------

static bool ceil_cuda_type(kvf_dtype_t dtype, cudaDataType_t *type_p)
{
    switch (dtype) {
    case KVF_DTYPE_F32:
        *type_p = CUDA_R_32F;
        return true;
    case KVF_DTYPE_F16:
        *type_p = CUDA_R_16F;
        return true;
    case KVF_DTYPE_BF16:
        *type_p = CUDA_R_16BF;
        return true;
    default:
        return false;
    }
}

// One GEMM y(m, n) = x(m, k) · w(n, k)ᵀ, row-major: cuBLAS sees the
// column-major yᵀ(n, m) = op_T(w) · xᵀ, the backend's projection layout.
static kvf_status_t ceil_gemm(cublasHandle_t h, int m, int n, int k, const void *x, const void *w,
                              cudaDataType_t ab_type, void *y, cudaDataType_t c_type)
{
    const float alpha = 1.0f, beta = 0.0f;
    return kvf_cuda_blas_status(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w,
                                             ab_type, k, x, ab_type, k, &beta, y, c_type, n,
                                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                                "cublasGemmEx");
}

extern "C" kvf_status_t kvf_gpu_gemm_rate(int device, int m, int n, int k, kvf_dtype_t dtype,
                                          int reps, double *flops_p)
{
    cudaDataType_t ab_type;
    if (m <= 0 || n <= 0 || k <= 0 || reps < 1 || !ceil_cuda_type(dtype, &ab_type)) {
        kvf_log_error("gpu bench: GEMM rate needs positive sizes, reps >= 1 and f32, f16 or "
                      "bf16 (got %dx%dx%d, %d reps, %s)",
                      m, n, k, reps, kvf_dtype_name(dtype));
        return KVF_ERR_INVAL;
    }
    const size_t es = kvf_dtype_size(dtype);
    ceil_rig_t r;
    kvf_status_t st = ceil_rig_init(&r, device);
    if (st != KVF_OK)
        return st;
    void *x = NULL, *w = NULL, *y = NULL;
    cublasHandle_t h = NULL;
    float best_ms = -1;
    st = KVF_CUDA_TRY(cudaMalloc(&x, (size_t)m * k * es), "cudaMalloc (GEMM x)");
    if (st != KVF_OK)
        goto fail_x;
    st = KVF_CUDA_TRY(cudaMalloc(&w, (size_t)n * k * es), "cudaMalloc (GEMM w)");
    if (st != KVF_OK)
        goto fail_w;
    // f32-sized, so it also holds y in a 16-bit dtype.
    st = KVF_CUDA_TRY(cudaMalloc(&y, (size_t)m * n * sizeof(float)), "cudaMalloc (GEMM y)");
    if (st != KVF_OK)
        goto fail_y;
    st = kvf_cuda_blas_status(cublasCreate(&h), "cublasCreate");
    if (st != KVF_OK)
        goto fail_handle;
    st = kvf_cuda_blas_status(cublasSetStream(h, r.stream), "cublasSetStream");
    if (st == KVF_OK)
        st = ceil_fill(r.stream, x, dtype, (size_t)m * k, 0x1234u);
    if (st == KVF_OK)
        st = ceil_fill(r.stream, w, dtype, (size_t)n * k, 0xabcdu);
    if (st == KVF_OK) {
        // y in f32 (what the backend's projections write), then, for 16-bit
        // inputs, y in the input type; the faster is the ceiling.
        const cudaDataType_t c_types[2] = {CUDA_R_32F, ab_type};
        const int n_c_types = es == 2 ? 2 : 1;
        for (int i = 0; i < n_c_types && st == KVF_OK; i++) {
            float ms = 0;
            st = ceil_time_best(
                &r, reps, [&] { return ceil_gemm(h, m, n, k, x, w, ab_type, y, c_types[i]); }, &ms);
            if (st == KVF_OK && (best_ms < 0 || ms < best_ms))
                best_ms = ms;
        }
    }
    if (st == KVF_OK)
        *flops_p = 2.0 * (double)m * n * k / (best_ms * 1e-3);
    cudaStreamSynchronize(r.stream); // nothing may still use the buffers
    cublasDestroy(h);
fail_handle:
    cudaFree(y);
fail_y:
    cudaFree(w);
fail_w:
    cudaFree(x);
fail_x:
    ceil_rig_fini(&r);
    return st;
}
