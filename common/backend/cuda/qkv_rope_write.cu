// What follows the qkv projection, in one pass over each token's qkv row:
// the q/k/v bias (Qwen2), the per-head RMSNorm of q and k (Qwen3), the rotary embedding of q and k (HF half-split
// pairs (d, d + half), angles from the host's cos|sin table) and the write
// of k and v into the token's (block, slot) of the paged pool. q stays in
// the row, rotated, for attention; k and v go to the pool only. One launch instead of four per layer:
// in a batch-1 decode step each of them is a few microseconds of launch and
// tail for a few kilobytes of work.
//
// One CTA per token. Threads walk the row's rotation pairs (q heads, then k
// heads) and then v's elements; pairs and elements are disjoint, so no
// thread reads what another writes.
#include "cuda_common.cuh"

// Qwen3: bias, then each q and k head RMS-normed in place in the row (one
// warp per head: its sum of squares, then the scaled values). The rotation
// pass that follows reads the normed values, without adding the bias again.
__device__ __forceinline__ void kvf_qk_head_norm(float *row, const float *bias,
                                                 const float *q_norm, const float *k_norm,
                                                 float eps, int n_heads, int n_kv_heads,
                                                 int head_dim)
{
    const int lane = threadIdx.x & 31, n_warps = blockDim.x / 32;
    for (int h = threadIdx.x / 32; h < n_heads + n_kv_heads; h += n_warps) {
        const float *w = h < n_heads ? q_norm : k_norm;
        float *v = row + (size_t)h * head_dim;
        const float *b = bias ? bias + (size_t)h * head_dim : nullptr;
        float ss = 0.0f;
        for (int d = lane; d < head_dim; d += 32) {
            float x = b ? v[d] + b[d] : v[d];
            v[d] = x; // read back below by this same lane only
            ss += x * x;
        }
        ss = kvf_warp_sum(ss);
        const float rinv = 1.0f / sqrtf(ss / (float)head_dim + eps);
        for (int d = lane; d < head_dim; d += 32)
            v[d] = w[d] * (v[d] * rinv);
    }
}

__global__ void kvf_qkv_rope_write_kernel(float *qkv, int ld, const float *bias,
                                          const float *q_norm, const float *k_norm, float eps,
                                          const float *cos_sin, float *pool, int64_t block_stride,
                                          int64_t layer_off, const int32_t *tok_block,
                                          const int32_t *pos, int n_heads, int n_kv_heads,
                                          int head_dim, int block_size, int n_pool_blocks)
{
    const int t = blockIdx.x, half = head_dim / 2;
    const int q_dim = n_heads * head_dim, kv_dim = n_kv_heads * head_dim;
    float *row = qkv + (size_t)t * (size_t)ld;
    const float *cs = cos_sin + (size_t)t * (size_t)head_dim;
    const int b = tok_block[t];
    // The host checked the ids; an id outside the pool is never written.
    const bool write = b >= 0 && b < n_pool_blocks;
    const int slot = pos[t] % block_size;
    float *kd = pool + (int64_t)(write ? b : 0) * block_stride + layer_off;
    float *vd = kd + (size_t)kv_dim * block_size;
    // With the norms the q/k bias is added by the norm pass.
    const float *qk_bias = bias;
    if (q_norm) {
        kvf_qk_head_norm(row, bias, q_norm, k_norm, eps, n_heads, n_kv_heads, head_dim);
        qk_bias = nullptr;
        __syncthreads();
    }

    // Rotation pairs of q (heads 0..n_heads-1) then k (n_kv_heads more).
    const int n_pairs = (n_heads + n_kv_heads) * half;
    for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) {
        const int h = i / half, d = i - h * half;
        const int c0 = h * head_dim + d, c1 = c0 + half; // columns in the row
        float x0 = row[c0], x1 = row[c1];
        if (qk_bias) {
            x0 += qk_bias[c0];
            x1 += qk_bias[c1];
        }
        const float c = cs[d], s = cs[half + d];
        const float y0 = x0 * c - x1 * s, y1 = x1 * c + x0 * s;
        if (h < n_heads) {
            row[c0] = y0; // q, rotated in place for attention
            row[c1] = y1;
        } else if (write) { // k goes to the pool only
            float *dst = kd + ((size_t)(h - n_heads) * block_size + slot) * head_dim;
            dst[d] = y0;
            dst[d + half] = y1;
        }
    }
    // v: bias, then the pool.
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        const int c = q_dim + kv_dim + i;
        const float v = bias ? row[c] + bias[c] : row[c];
        if (write) {
            const int vh = i / head_dim, d = i - vh * head_dim;
            vd[((size_t)vh * block_size + slot) * head_dim + d] = v;
        }
    }
}

kvf_status_t kvf_cuda_qkv_rope_write(cudaStream_t st, float *qkv, int ld, const float *bias,
                                     const float *q_norm, const float *k_norm, float eps,
                                     const float *cos_sin, float *pool, int64_t block_stride,
                                     int64_t layer_off, const int32_t *tok_block,
                                     const int32_t *pos, int n_tokens, int n_heads,
                                     int n_kv_heads, int head_dim, int block_size,
                                     int n_pool_blocks)
{
    kvf_status_t s = kvf_cuda_check_qkv_rope_write(n_tokens, ld, n_heads, n_kv_heads, head_dim,
                                                   block_size, n_pool_blocks);
    if (s != KVF_OK || n_tokens == 0)
        return s;
    kvf_qkv_rope_write_kernel<<<n_tokens, 128, 0, st>>>(
        qkv, ld, bias, q_norm, k_norm, eps, cos_sin, pool, block_stride, layer_off, tok_block, pos, n_heads,
        n_kv_heads, head_dim, block_size, n_pool_blocks);
    return KVF_CUDA_LAUNCHED("qkv_rope_write");
}
