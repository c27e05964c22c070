/* GPU ceilings (kvf/gpu_bench.h) in a build without CUDA: each says so and
 * fails. The CUDA build has the real ones in backend/cuda/ceilings.cu. */
#include "kvf/gpu_bench.h"

#ifndef KVF_HAVE_CUDA
#include "kvf/log.h"

kvf_status_t kvf_gpu_copy_bandwidth(int device, size_t bytes, int reps, double *bytes_per_s_p)
{
    (void)device;
    (void)bytes;
    (void)reps;
    (void)bytes_per_s_p;
    kvf_log_error("gpu bench: built without CUDA: no copy bandwidth to measure");
    return KVF_ERR_UNSUPPORTED;
}

kvf_status_t kvf_gpu_gemm_rate(int device, int m, int n, int k, kvf_dtype_t dtype, int reps,
                               double *flops_p)
{
    (void)device;
    (void)m;
    (void)n;
    (void)k;
    (void)dtype;
    (void)reps;
    (void)flops_p;
    kvf_log_error("gpu bench: built without CUDA: no GEMM rate to measure");
    return KVF_ERR_UNSUPPORTED;
}
#endif
