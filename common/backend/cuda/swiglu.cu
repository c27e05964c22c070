// SwiGLU: out = silu(gate) * up, gate and up the two halves of one GEMM
// output row, written in the down projection's input type; GeGLU (Gemma2)
// the same with gelu_tanh(gate).
#include "cuda_common.cuh"

template <typename T> __global__ void kvf_swiglu_kernel(T *out, const float *gu, int n)
{
    const float *g = gu + (size_t)blockIdx.x * 2 * (size_t)n, *u = g + n;
    T *o = out + (size_t)blockIdx.x * (size_t)n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float a = g[i];
        o[i] = kvf_from_f32<T>(a / (1.0f + expf(-a)) * u[i]);
    }
}

kvf_status_t kvf_cuda_swiglu(cudaStream_t st, void *out, kvf_dtype_t adt, const float *gu, int m,
                             int n)
{
    kvf_status_t s = kvf_cuda_check_swiglu(m, n, adt);
    if (s != KVF_OK || m == 0)
        return s;
    KVF_DISPATCH_ADT(adt, T, kvf_swiglu_kernel<T><<<m, 256, 0, st>>>((T *)out, gu, n));
    return KVF_CUDA_LAUNCHED("swiglu");
}

template <typename T> __global__ void kvf_geglu_kernel(T *out, const float *gu, int n)
{
    const float *g = gu + (size_t)blockIdx.x * 2 * (size_t)n, *u = g + n;
    T *o = out + (size_t)blockIdx.x * (size_t)n;
    const float k = 0.7978845608f; // sqrt(2 / pi)
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float a = g[i];
        float z = k * (a + 0.044715f * a * a * a);
        // 0.5 a (1 + tanh z) = a / (1 + e^-2z), without 1 + tanh's cancellation
        o[i] = kvf_from_f32<T>(a / (1.0f + expf(-2.0f * z)) * u[i]);
    }
}

kvf_status_t kvf_cuda_geglu(cudaStream_t st, void *out, kvf_dtype_t adt, const float *gu, int m,
                            int n)
{
    kvf_status_t s = kvf_cuda_check_swiglu(m, n, adt);
    if (s != KVF_OK || m == 0)
        return s;
    KVF_DISPATCH_ADT(adt, T, kvf_geglu_kernel<T><<<m, 256, 0, st>>>((T *)out, gu, n));
    return KVF_CUDA_LAUNCHED("geglu");
}
