// Greedy sampling on the device: the index of each row's largest logit,
// the lowest index on ties (as the CPU sampler). One CTA per row; only the
// ids go back to the host, not vocab-sized rows of logits.
#include "cuda_common.cuh"

#define ARGMAX_THREADS 1024

__device__ __forceinline__ bool kvf_argmax_better(float v, int i, float bv, int bi)
{
    // NaN never wins; equal values keep the lower index.
    return v > bv || (v == bv && i < bi) || (bi < 0 && v == v);
}

__global__ void kvf_argmax_kernel(int32_t *ids, const float *x, int n)
{
    __shared__ float sv[ARGMAX_THREADS / 32];
    __shared__ int si[ARGMAX_THREADS / 32];
    const float *row = x + (size_t)blockIdx.x * (size_t)n;
    float bv = -INFINITY;
    int bi = -1;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = row[i];
        if (kvf_argmax_better(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi >= 0 && kvf_argmax_better(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            if (si[w] >= 0 && kvf_argmax_better(sv[w], si[w], bv, bi)) {
                bv = sv[w];
                bi = si[w];
            }
        ids[blockIdx.x] = bi < 0 ? 0 : bi; // an all-NaN row: token 0, as the CPU sampler
    }
}

kvf_status_t kvf_cuda_argmax(cudaStream_t st, int32_t *ids, const float *x, int m, int n)
{
    kvf_status_t s = kvf_cuda_check_argmax(m, n);
    if (s != KVF_OK || m == 0)
        return s;
    kvf_argmax_kernel<<<m, ARGMAX_THREADS, 0, st>>>(ids, x, n);
    return KVF_CUDA_LAUNCHED("argmax");
}
