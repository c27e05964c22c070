// Bias add over the rows of a GEMM output (Qwen2's q/k/v biases).
#include "cuda_common.cuh"

__global__ void kvf_bias_kernel(float *x, int ld, const float *bias, int n)
{
    float *row = x + (size_t)blockIdx.x * (size_t)ld;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        row[i] += bias[i];
}

kvf_status_t kvf_cuda_bias_add(cudaStream_t st, float *x, int ld, const float *bias, int m, int n)
{
    kvf_status_t s = kvf_cuda_check_bias(m, n, ld);
    if (s != KVF_OK || m == 0)
        return s;
    kvf_bias_kernel<<<m, 256, 0, st>>>(x, ld, bias, n);
    return KVF_CUDA_LAUNCHED("bias_add");
}
