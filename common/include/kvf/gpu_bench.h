/* GPU ceilings for benchmarks: the HBM bandwidth a device-to-device copy
 * reaches and the rate of a cuBLAS GEMM, measured on the GPU the benchmark
 * runs on (common/backend/cuda/ceilings.cu). `kvf bench engine --backend
 * cuda` divides by them to turn step times into roofline ratios.
 *
 * Each call allocates its own device buffers, stream and events on device
 * (and sets that device current on the calling thread for the call, then
 * restores the previous one) and frees them before it returns, on every
 * path. Times come from CUDA events around the work on one stream; the
 * result is the best of reps timed runs after one warm-up run: on a shared
 * machine, other tenants only ever add time.
 *
 * A build without CUDA has versions that log "built without CUDA" and
 * return KVF_ERR_UNSUPPORTED (common/gpu_bench.c). */
#ifndef KVF_GPU_BENCH_H
#define KVF_GPU_BENCH_H

#include <stddef.h>

#include "kvf/dtype.h"
#include "kvf/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Device-to-device cudaMemcpyAsync of bytes (> 0) between two buffers of
 * device. *bytes_per_s_p = 2 * bytes / time: every byte is read once and
 * written once, so this is the HBM traffic rate a roofline divides by.
 * KVF_ERR_INVAL for bytes == 0 or reps < 1, KVF_ERR_NOMEM when the two
 * buffers do not fit, KVF_ERR_DEVICE for any other CUDA failure (no such
 * device included); each logged. */
kvf_status_t kvf_gpu_copy_bandwidth(int device, size_t bytes, int reps, double *bytes_per_s_p);

/* C(m, n) = A(m, k) · B(n, k)ᵀ with cublasGemmEx (the layout of the
 * backend's projections: B is a weight in HF Linear layout), A and B in
 * dtype (bf16, f16 or f32) filled with non-zero pseudo-random values,
 * compute type CUBLAS_COMPUTE_32F. For bf16 and f16 it is timed with C in
 * f32 and with C in dtype, and the faster counts. *flops_p = 2 m n k /
 * time in FLOP/s. KVF_ERR_INVAL for a non-positive size, reps < 1 or
 * another dtype, KVF_ERR_NOMEM when the matrices do not fit,
 * KVF_ERR_DEVICE for any other CUDA or cuBLAS failure; each logged. */
kvf_status_t kvf_gpu_gemm_rate(int device, int m, int n, int k, kvf_dtype_t dtype, int reps,
                               double *flops_p);

#ifdef __cplusplus
}
#endif

#endif
