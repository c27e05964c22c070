// Helpers shared by the CUDA ops: element conversions for the "act"
// buffers (f32, bf16 or f16, see cuda_ops.h) and warp/block reductions.
#ifndef KVF_CUDA_COMMON_CUH
#define KVF_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda_ops.h"

template <typename T> __device__ __forceinline__ T kvf_from_f32(float x);
template <> __device__ __forceinline__ float kvf_from_f32<float>(float x)
{
    return x;
}
template <> __device__ __forceinline__ __nv_bfloat16 kvf_from_f32<__nv_bfloat16>(float x)
{
    return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ __half kvf_from_f32<__half>(float x)
{
    return __float2half_rn(x);
}

__device__ __forceinline__ float kvf_to_f32(float x)
{
    return x;
}
__device__ __forceinline__ float kvf_to_f32(__nv_bfloat16 x)
{
    return __bfloat162float(x);
}
__device__ __forceinline__ float kvf_to_f32(__half x)
{
    return __half2float(x);
}

__device__ __forceinline__ float kvf_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ int kvf_warp_sum_i(int v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float kvf_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024);
// every thread gets the result. scratch: 32 floats of shared memory.
__device__ __forceinline__ float kvf_block_sum(float v, float *scratch)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = kvf_warp_sum(v);
    __syncthreads(); // scratch may still be read from a previous call
    if (lane == 0)
        scratch[warp] = v;
    __syncthreads();
    v = lane < n_warps ? scratch[lane] : 0.0f;
    return kvf_warp_sum(v);
}

// Runs f.template operator()<T>() with T the C++ type of an act dtype.
#define KVF_DISPATCH_ADT(adt, T, ...)                                                              \
    do {                                                                                           \
        switch (adt) {                                                                             \
        case KVF_DTYPE_F32: {                                                                      \
            typedef float T;                                                                       \
            __VA_ARGS__;                                                                           \
        } break;                                                                                   \
        case KVF_DTYPE_BF16: {                                                                     \
            typedef __nv_bfloat16 T;                                                               \
            __VA_ARGS__;                                                                           \
        } break;                                                                                   \
        case KVF_DTYPE_F16: {                                                                      \
            typedef __half T;                                                                      \
            __VA_ARGS__;                                                                           \
        } break;                                                                                   \
        default:                                                                                   \
            return KVF_ERR_INVAL;                                                                  \
        }                                                                                          \
    } while (0)

#endif
