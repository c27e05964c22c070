// Residual add fused with the RMSNorm that follows it: one pass over x adds
// the block's output (delta) into the residual stream and sums squares; a
// second writes the normed row in the GEMM input type. One CTA per row.
#include "cuda_common.cuh"

#define RMSNORM_THREADS 256

template <typename T>
__global__ void kvf_add_rmsnorm_kernel(float *x, const float *delta, const float *w, T *out,
                                       int ld_out, int dim, float eps)
{
    __shared__ float scratch[32];
    float *xr = x + (size_t)blockIdx.x * (size_t)dim;
    const float *dr = delta ? delta + (size_t)blockIdx.x * (size_t)dim : nullptr;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = xr[i];
        if (dr) {
            v += dr[i];
            xr[i] = v; // read back below by this same thread only
        }
        ss += v * v;
    }
    ss = kvf_block_sum(ss, scratch);
    float rinv = 1.0f / sqrtf(ss / (float)dim + eps);
    T *o = out + (size_t)blockIdx.x * (size_t)ld_out;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        o[i] = kvf_from_f32<T>(w[i] * (xr[i] * rinv));
}

kvf_status_t kvf_cuda_add_rmsnorm(cudaStream_t st, float *x, const float *delta, const float *w,
                                  void *out, int ld_out, kvf_dtype_t adt, int m, int dim, float eps)
{
    kvf_status_t s = kvf_cuda_check_rmsnorm(m, dim, ld_out, adt, eps);
    if (s != KVF_OK || m == 0)
        return s;
    KVF_DISPATCH_ADT(adt, T,
                     kvf_add_rmsnorm_kernel<T>
                     <<<m, RMSNORM_THREADS, 0, st>>>(x, delta, w, (T *)out, ld_out, dim, eps));
    return KVF_CUDA_LAUNCHED("add_rmsnorm");
}
