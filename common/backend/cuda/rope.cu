// Rotary embedding, in place, HF half-split layout: the pair (d, d + half)
// of each head rotates by the token's angle a_d. The angles come as a
// (rows, head_dim) cos|sin table the host computed in double, so the
// rotation is the CPU backend's to the last bit of its inputs.
#include "cuda_common.cuh"

__global__ void kvf_rope_kernel(float *x, int ld, const float *cos_sin, int n_heads, int head_dim)
{
    int half = head_dim / 2;
    float *row = x + (size_t)blockIdx.x * (size_t)ld;
    const float *cs = cos_sin + (size_t)blockIdx.x * (size_t)head_dim;
    for (int i = threadIdx.x; i < n_heads * half; i += blockDim.x) {
        int h = i / half, d = i - h * half;
        float *v = row + (size_t)h * head_dim;
        float x0 = v[d], x1 = v[d + half], c = cs[d], s = cs[half + d];
        v[d] = x0 * c - x1 * s;
        v[d + half] = x1 * c + x0 * s;
    }
}

kvf_status_t kvf_cuda_rope(cudaStream_t st, float *x, int ld, const float *cos_sin, int m,
                           int n_heads, int head_dim)
{
    kvf_status_t s = kvf_cuda_check_rope(m, ld, n_heads, head_dim);
    if (s != KVF_OK || m == 0)
        return s;
    kvf_rope_kernel<<<m, 128, 0, st>>>(x, ld, cos_sin, n_heads, head_dim);
    return KVF_CUDA_LAUNCHED("rope");
}
