// K/V write into the paged pool: each token's k and v rows go to its block
// and slot, head by head ([block][layer][K,V][kv_head][slot][head_dim]).
// One CTA per token; consecutive threads write consecutive elements of a
// head's slot row.
#include "cuda_common.cuh"

__global__ void kvf_kv_write_kernel(float *pool, int64_t block_stride, int64_t layer_off,
                                    const float *k, const float *v, int ld,
                                    const int32_t *tok_block, const int32_t *pos, int n_kv_heads,
                                    int head_dim, int block_size, int n_pool_blocks)
{
    int t = blockIdx.x;
    int b = tok_block[t];
    if (b < 0 || b >= n_pool_blocks) // the host checked; never write outside the pool
        return;
    int slot = pos[t] % block_size;
    float *kd = pool + (int64_t)b * block_stride + layer_off;
    float *vd = kd + (size_t)n_kv_heads * block_size * head_dim;
    const float *ks = k + (size_t)t * ld, *vs = v + (size_t)t * ld;
    int kv_dim = n_kv_heads * head_dim;
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        int h = i / head_dim, d = i - h * head_dim;
        size_t off = ((size_t)h * block_size + slot) * head_dim + d;
        kd[off] = ks[i];
        vd[off] = vs[i];
    }
}

kvf_status_t kvf_cuda_kv_write(cudaStream_t st, float *pool, int64_t block_stride,
                               int64_t layer_off, const float *k, const float *v, int ld,
                               const int32_t *tok_block, const int32_t *pos, int n_tokens,
                               int n_kv_heads, int head_dim, int block_size, int n_pool_blocks)
{
    kvf_status_t s =
        kvf_cuda_check_kv_write(n_tokens, ld, n_kv_heads, head_dim, block_size, n_pool_blocks);
    if (s != KVF_OK || n_tokens == 0)
        return s;
    kvf_kv_write_kernel<<<n_tokens, 128, 0, st>>>(pool, block_stride, layer_off, k, v, ld,
                                                  tok_block, pos, n_kv_heads, head_dim, block_size,
                                                  n_pool_blocks);
    return KVF_CUDA_LAUNCHED("kv_write");
}
