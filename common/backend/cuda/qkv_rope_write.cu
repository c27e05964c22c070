// What follows the qkv projection, in one pass over each token's qkv row:
// the q/k/v bias (Qwen2), the per-head RMSNorm of q and k (Qwen3), the rotary embedding of q and k (HF half-split
// pairs (d, d + half), angles from the host's cos|sin table) and the write
// of k and v into the token's (block, slot) of the paged pool, encoded in
// the pool's format (kvf/kv_format.h). q stays in the row, rotated, for
// attention; k (rotated) and v (biased) are staged in their columns of the
// row, then each (token, kv head) row is encoded whole: fp8 and int8 need
// the row's amax for its scale before any element is written. One launch instead of four per layer:
// in a batch-1 decode step each of them is a few microseconds of launch and
// tail for a few kilobytes of work.
//
// One CTA per token. Threads walk the row's rotation pairs (q heads, then k
// heads) and then v's elements; pairs and elements are disjoint, so no
// thread reads what another writes until the barrier before the encoding,
// where one warp takes each k or v row.
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

// The scale of a row of a scaled format from lane parts of its amax: the
// largest |x| (NaN skipped, as kvf_kv_row_scale's comparison skips it),
// exact in any order, then kvf_kv_scale_of_amax.
__device__ __forceinline__ float kvf_kv_warp_row_scale(kvf_kv_dtype_t dt, const float *x, int n)
{
    const int lane = threadIdx.x & 31;
    float amax = 0.0f;
    for (int d = lane; d < n; d += 32) {
        const float v = x[d] < 0 ? -x[d] : x[d];
        amax = v > amax ? v : amax;
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(0xffffffffu, amax, o);
        amax = v > amax ? v : amax;
    }
    return kvf_kv_scale_of_amax(dt, amax);
}

// Element d of a row, encoded as kvf_kv_encode_row encodes it (scale: the
// row's, for fp8 and int8).
__device__ __forceinline__ void kvf_kv_put(kvf_kv_dtype_t dt, unsigned char *dst, int d, float x,
                                           float scale)
{
    switch (dt) {
    case KVF_KV_F32:
        ((float *)dst)[d] = x;
        break;
    case KVF_KV_F16:
        ((uint16_t *)dst)[d] = kvf_kv_f16_encode(x);
        break;
    case KVF_KV_BF16:
        ((uint16_t *)dst)[d] = kvf_kv_bf16_encode(x);
        break;
    case KVF_KV_FP8:
        dst[d] = kvf_kv_fp8_encode(x / scale);
        break;
    case KVF_KV_INT8:
        ((int8_t *)dst)[d] = kvf_kv_int8_encode(x, scale);
        break;
    }
}

// The staged k and v rows of a token (row + q_dim, 2 * n_kv_heads rows of
// head_dim) to its slot of the pool's slice (bytes): one warp per row, its
// scale from a warp reduction of amax, then each lane's elements.
__device__ __forceinline__ void kvf_kv_write_rows(kvf_kv_dtype_t dt, const float *kv_rows,
                                                  unsigned char *slice, int n_kv_heads,
                                                  int head_dim, int block_size, int slot)
{
    const int lane = threadIdx.x & 31, n_warps = blockDim.x / 32;
    const size_t eb = kvf_kv_elem_bytes(dt);
    for (int r = threadIdx.x / 32; r < 2 * n_kv_heads; r += n_warps) {
        const int kv = r / n_kv_heads, h = r - kv * n_kv_heads;
        const float *x = kv_rows + (size_t)r * head_dim;
        unsigned char *dst = slice +
                             kvf_kv_data_offset(dt, n_kv_heads, block_size, head_dim, kv, h) +
                             (size_t)slot * head_dim * eb;
        float scale = 1.0f;
        if (kvf_kv_scaled(dt)) {
            scale = kvf_kv_warp_row_scale(dt, x, head_dim);
            if (lane == 0)
                ((float *)(slice + kvf_kv_scale_offset(dt, n_kv_heads, block_size, head_dim, kv,
                                                       h)))[slot] = scale;
        }
        for (int d = lane; d < head_dim; d += 32)
            kvf_kv_put(dt, dst, d, x[d], scale);
    }
}

__global__ void kvf_qkv_rope_write_kernel(float *qkv, int ld, const float *bias,
                                          const float *q_norm, const float *k_norm, float eps,
                                          const float *cos_sin, unsigned char *pool,
                                          int64_t block_stride, int64_t layer_off,
                                          kvf_kv_dtype_t dt, const int32_t *tok_block,
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
    // With the norms the q/k bias is added by the norm pass.
    const float *qk_bias = bias;
    if (q_norm) {
        kvf_qk_head_norm(row, bias, q_norm, k_norm, eps, n_heads, n_kv_heads, head_dim);
        qk_bias = nullptr;
        __syncthreads();
    }

    // Rotation pairs of q (heads 0..n_heads-1) then k (n_kv_heads more),
    // rotated in place: q for attention, k staged for the pool.
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
        row[c0] = x0 * c - x1 * s;
        row[c1] = x1 * c + x0 * s;
    }
    // v: bias, staged in place.
    if (bias)
        for (int i = threadIdx.x; i < kv_dim; i += blockDim.x)
            row[q_dim + kv_dim + i] += bias[q_dim + kv_dim + i];
    if (!write)
        return; // the same in every thread of the CTA
    // Rows are encoded whole (a scale per row): every element staged first.
    __syncthreads();
    kvf_kv_write_rows(dt, row + q_dim, pool + (int64_t)b * block_stride + layer_off, n_kv_heads,
                      head_dim, block_size, slot);
}

kvf_status_t kvf_cuda_qkv_rope_write(cudaStream_t st, float *qkv, int ld, const float *bias,
                                     const float *q_norm, const float *k_norm, float eps,
                                     const float *cos_sin, void *pool, int64_t block_stride,
                                     int64_t layer_off, kvf_kv_dtype_t kv_dtype,
                                     const int32_t *tok_block, const int32_t *pos, int n_tokens,
                                     int n_heads, int n_kv_heads, int head_dim, int block_size,
                                     int n_pool_blocks)
{
    kvf_status_t s = kvf_cuda_check_qkv_rope_write(n_tokens, ld, n_heads, n_kv_heads, head_dim,
                                                   block_size, n_pool_blocks, kv_dtype);
    if (s != KVF_OK || n_tokens == 0)
        return s;
    kvf_qkv_rope_write_kernel<<<n_tokens, 128, 0, st>>>(
        qkv, ld, bias, q_norm, k_norm, eps, cos_sin, (unsigned char *)pool, block_stride,
        layer_off, kv_dtype, tok_block, pos, n_heads, n_kv_heads, head_dim, block_size,
        n_pool_blocks);
    return KVF_CUDA_LAUNCHED("qkv_rope_write");
}
