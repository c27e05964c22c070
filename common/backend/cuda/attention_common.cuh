// What the attention kernels share: finding a sequence's table row, a
// key's place in the pool, and a prefill CTA's tile. Ids are checked here
// as well as on the host: a bad sequence id, a position past the table row
// or a block id outside the pool is never dereferenced (the key then reads
// as zeros).
#ifndef KVF_ATTENTION_COMMON_CUH
#define KVF_ATTENTION_COMMON_CUH

#include "cuda_common.cuh"

#include <limits.h>

// The table row of sequence seq, or NULL for an id outside the batch.
__device__ __forceinline__ const int32_t *kvf_attn_table(const kvf_cuda_attn_t &a, int seq)
{
    return seq >= 0 && seq < a.n_seqs ? a.block_tables + (size_t)seq * (size_t)a.bt_stride
                                      : nullptr;
}

// Offset in the layer (elements) of K at position p of kv head g for the
// table row bt, or -1 where there is none. V is n_kv_heads * block_size *
// head_dim further on.
__device__ __forceinline__ long long kvf_attn_key_off(const kvf_cuda_attn_t &a, const int32_t *bt,
                                                      int p, int g)
{
    const int bs = a.block_size;
    if (!bt || p < 0 || p / bs >= a.bt_stride)
        return -1;
    const int blk = bt[p / bs];
    if (blk < 0 || blk >= a.n_pool_blocks)
        return -1;
    return (long long)blk * a.block_stride + ((long long)g * bs + p % bs) * a.head_dim;
}

// The first key position a query at pos attends to: pos - window + 1
// under a sliding window, else 0. Keys before it are masked like keys
// after pos.
__device__ __forceinline__ int kvf_attn_first_key(const kvf_cuda_attn_t &a, int pos)
{
    return a.window > 0 && pos >= a.window ? pos - a.window + 1 : 0;
}

// A scaled score, soft-capped when cap > 0 (Gemma2): cap * tanh(s / cap).
// Masked scores stay -inf: callers cap only the keys a query sees.
__device__ __forceinline__ float kvf_attn_softcap(float s, float cap)
{
    return cap > 0.0f ? tanhf(s / cap) * cap : s;
}

// The prefill tile of this CTA (blockIdx.x): its first batch row in
// *first_p and its token count, clamped to the batch and to rows_cap query
// rows (the host checks tiles; a bad one cannot reach outside). <= 0:
// nothing to do. The same in every thread of the CTA.
__device__ __forceinline__ int kvf_attn_prefill_tile(const kvf_cuda_attn_t &a, const int32_t *tiles,
                                                     int rows_cap, int group, int *first_p)
{
    const int first = tiles[2 * blockIdx.x];
    const int count = tiles[2 * blockIdx.x + 1];
    if (first < 0 || first >= a.n_tokens)
        return 0;
    *first_p = first;
    return min(count, min(rows_cap / group, a.n_tokens - first));
}

// Loads a chunk of n_keys keys of K and V (rows key_off[j], -1: zeros)
// into shared rows k_s[j * ld_k], v_s[j * ld_v], converted to T; the whole
// CTA (n_threads) takes part. Consecutive threads read consecutive
// elements of a key's row (coalesced).
template <typename T>
__device__ __forceinline__ void kvf_attn_load_kv(const kvf_cuda_attn_t &a, const long long *key_off,
                                                 int n_keys, long long v_delta, T *k_s, int ld_k,
                                                 T *v_s, int ld_v, int n_threads)
{
    const int hd = a.head_dim;
    for (int idx = threadIdx.x; idx < n_keys * hd; idx += n_threads) {
        const int j = idx / hd, d = idx - j * hd;
        const long long off = key_off[j];
        float kv = 0.0f, vv = 0.0f;
        if (off >= 0) {
            kv = __ldg(a.kv_layer + off + d);
            vv = __ldg(a.kv_layer + off + v_delta + d);
        }
        k_s[j * ld_k + d] = kvf_from_f32<T>(kv);
        v_s[j * ld_v + d] = kvf_from_f32<T>(vv);
    }
}

#endif
