// Gemma2's elementwise f32 steps: the embedding normalizer (x * s) and the
// final logits' soft-capping (cap * tanh(x / cap)), over n values.
#include "cuda_common.cuh"
#include "kvf/log.h"

#include <math.h>

#define SCALE_CAP_THREADS 256

__global__ void kvf_scale_kernel(float *x, size_t n, float s)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = x[i] * s;
}

__global__ void kvf_softcap_kernel(float *x, size_t n, float cap)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = tanhf(x[i] / cap) * cap;
}

static unsigned blocks_for(size_t n)
{
    return (unsigned)((n + SCALE_CAP_THREADS - 1) / SCALE_CAP_THREADS);
}

kvf_status_t kvf_cuda_scale(cudaStream_t st, float *x, size_t n, float s)
{
    if (n == 0)
        return KVF_OK;
    kvf_scale_kernel<<<blocks_for(n), SCALE_CAP_THREADS, 0, st>>>(x, n, s);
    return KVF_CUDA_LAUNCHED("scale");
}

kvf_status_t kvf_cuda_softcap(cudaStream_t st, float *x, size_t n, float cap)
{
    if (n == 0)
        return KVF_OK;
    if (!(cap > 0.0f)) {
        kvf_log_error("cuda softcap: cap %g", (double)cap);
        return KVF_ERR_INVAL;
    }
    kvf_softcap_kernel<<<blocks_for(n), SCALE_CAP_THREADS, 0, st>>>(x, n, cap);
    return KVF_CUDA_LAUNCHED("softcap");
}
