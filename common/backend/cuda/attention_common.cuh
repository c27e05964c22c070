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

// Where one key's rows are, as byte offsets in the layer: k, its K data
// row (head_dim elements of the pool's format; V's is kvf_attn_v_delta()
// further on), and ks, its K scale (fp8, int8; V's is kvf_attn_vs_delta()
// further on). k = -1 where there is none.
struct kvf_attn_key_t {
    long long k, ks;
};

// The key at position p of kv head g for the table row bt.
__device__ __forceinline__ kvf_attn_key_t kvf_attn_key(const kvf_cuda_attn_t &a, const int32_t *bt,
                                                       int p, int g)
{
    kvf_attn_key_t key = {-1, -1};
    const int bs = a.block_size;
    if (!bt || p < 0 || p / bs >= a.bt_stride)
        return key;
    const int blk = bt[p / bs];
    if (blk < 0 || blk >= a.n_pool_blocks)
        return key;
    const kvf_kv_dtype_t dt = a.kv_dtype;
    const long long slice = (long long)blk * a.block_stride;
    const long long slot = p % bs;
    key.k = slice + (long long)kvf_kv_data_offset(dt, a.n_kv_heads, bs, a.head_dim, 0, g) +
            slot * a.head_dim * (long long)kvf_kv_elem_bytes(dt);
    key.ks = slice + (long long)kvf_kv_scale_offset(dt, a.n_kv_heads, bs, a.head_dim, 0, g) +
             slot * (long long)sizeof(float);
    return key;
}

// Bytes from a key's K data row to its V data row.
__device__ __forceinline__ long long kvf_attn_v_delta(const kvf_cuda_attn_t &a)
{
    return (long long)kvf_kv_data_offset(a.kv_dtype, a.n_kv_heads, a.block_size, a.head_dim, 1, 0);
}

// Bytes from a key's K scale to its V scale.
__device__ __forceinline__ long long kvf_attn_vs_delta(const kvf_cuda_attn_t &a)
{
    return (long long)a.n_kv_heads * a.block_size * (long long)sizeof(float);
}

// The scale at byte offset off of the layer: 1 for an unscaled format or
// off < 0 (no key).
__device__ __forceinline__ float kvf_attn_scale_at(const kvf_cuda_attn_t &a, long long off)
{
    if (!kvf_kv_scaled(a.kv_dtype) || off < 0)
        return 1.0f;
    return __ldg((const float *)((const unsigned char *)a.kv_layer + off));
}

// Element d of the row at byte offset off of the layer, decoded to f32
// (exact; times the row's scale for fp8 / int8).
__device__ __forceinline__ float kvf_attn_elem(const kvf_cuda_attn_t &a, long long off, int d,
                                               float scale)
{
    return kvf_kv_decode_one(a.kv_dtype, (const unsigned char *)a.kv_layer + off, d, scale);
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

// True when K/V of format dt are already T's bits (bf16 for
// __nv_bfloat16, f16 for __half): the load copies them.
template <typename T> __device__ __forceinline__ bool kvf_attn_kv_is(kvf_kv_dtype_t dt);
template <> __device__ __forceinline__ bool kvf_attn_kv_is<float>(kvf_kv_dtype_t)
{
    return false; // f32 rows are read as any other format (kvf_kv_decode_one's copy)
}
template <> __device__ __forceinline__ bool kvf_attn_kv_is<__nv_bfloat16>(kvf_kv_dtype_t dt)
{
    return dt == KVF_KV_BF16;
}
template <> __device__ __forceinline__ bool kvf_attn_kv_is<__half>(kvf_kv_dtype_t dt)
{
    return dt == KVF_KV_F16;
}

// A 16-bit value of T from its bits (only called for the 16-bit types).
template <typename T> __device__ __forceinline__ T kvf_bits_as(unsigned short b);
template <> __device__ __forceinline__ float kvf_bits_as<float>(unsigned short)
{
    return 0.0f; // not reached: kvf_attn_kv_is<float> is false
}
template <> __device__ __forceinline__ __nv_bfloat16 kvf_bits_as<__nv_bfloat16>(unsigned short b)
{
    return __ushort_as_bfloat16(b);
}
template <> __device__ __forceinline__ __half kvf_bits_as<__half>(unsigned short b)
{
    return __ushort_as_half(b);
}

// Loads a chunk of n_keys keys of K and V (K data rows key_off[j], -1:
// zeros; their scales k_sc[j], v_sc[j]) into shared rows k_s[j * ld_k],
// v_s[j * ld_v], converted to T; the whole CTA (n_threads) takes part.
// Consecutive threads read consecutive elements of a key's row
// (coalesced). A 16-bit pool in T's own format is copied as it is: the
// same bits as decoding it to f32 and rounding back.
// i8_int: an int8 pool's rows are loaded as their integers (scale 1), for
// the kernels that score them as integers (kvf_attn_i8 below).
template <typename T>
__device__ __forceinline__ void kvf_attn_load_kv(const kvf_cuda_attn_t &a, const long long *key_off,
                                                 const float *k_sc, const float *v_sc, int n_keys,
                                                 T *k_s, int ld_k, T *v_s, int ld_v, int n_threads,
                                                 bool i8_int = false)
{
    const int hd = a.head_dim;
    const long long v_delta = kvf_attn_v_delta(a);
    const bool raw = kvf_attn_kv_is<T>(a.kv_dtype);
    const bool unscaled = i8_int && a.kv_dtype == KVF_KV_INT8;
    for (int idx = threadIdx.x; idx < n_keys * hd; idx += n_threads) {
        const int j = idx / hd, d = idx - j * hd;
        const long long off = key_off[j];
        if (raw) {
            unsigned short kb = 0, vb = 0;
            if (off >= 0) {
                const unsigned char *kr = (const unsigned char *)a.kv_layer + off;
                kb = __ldg((const unsigned short *)kr + d);
                vb = __ldg((const unsigned short *)(kr + v_delta) + d);
            }
            k_s[j * ld_k + d] = kvf_bits_as<T>(kb);
            v_s[j * ld_v + d] = kvf_bits_as<T>(vb);
            continue;
        }
        float kv = 0.0f, vv = 0.0f;
        if (off >= 0) {
            kv = kvf_attn_elem(a, off, d, unscaled ? 1.0f : k_sc[j]);
            vv = kvf_attn_elem(a, off + v_delta, d, unscaled ? 1.0f : v_sc[j]);
        }
        k_s[j * ld_k + d] = kvf_from_f32<T>(kv);
        v_s[j * ld_v + d] = kvf_from_f32<T>(vv);
    }
}

// int8 pools are scored from the integers, as the CPU backend does
// (docs/numerics.md, "KV formats"): each query row rounded once to int16
// by kv_format.h's rules, score = (float)(sum qi * k) * (sq * sk) with the
// sum in int32 (exact), and the value scale on p, acc += (p * sv) * v.
__device__ __forceinline__ bool kvf_attn_i8(const kvf_cuda_attn_t &a)
{
    return a.kv_dtype == KVF_KV_INT8;
}

// The query row q (hd floats) rounded in place to its integers (as floats,
// exact) by one warp; returns its scale in every lane.
__device__ __forceinline__ float kvf_attn_i8_quant_row(float *q, int hd, int lane)
{
    float amax = 0.0f;
    for (int d = lane; d < hd; d += 32)
        amax = fmaxf(amax, fabsf(q[d])); // NaN skipped, as the CPU's max
    amax = kvf_warp_max(amax);
    const float s = kvf_kv_i8_qscale(amax, hd);
    for (int d = lane; d < hd; d += 32)
        q[d] = (float)kvf_kv_i8_qround(q[d], s, hd);
    __syncwarp();
    return s;
}

// Key j of a chunk starting at k0 (j < n_keys_chunk, positions below
// n_keys): its K data row in key_off[j], its scales in k_sc[j], v_sc[j].
// One thread per key.
__device__ __forceinline__ void kvf_attn_chunk_key(const kvf_cuda_attn_t &a, const int32_t *bt,
                                                   int p, int n_keys, int g, long long *key_off,
                                                   float *k_sc, float *v_sc, int j)
{
    kvf_attn_key_t key = {-1, -1};
    if (p < n_keys)
        key = kvf_attn_key(a, bt, p, g);
    key_off[j] = key.k;
    k_sc[j] = key.k >= 0 ? kvf_attn_scale_at(a, key.ks) : 1.0f;
    v_sc[j] = key.k >= 0 ? kvf_attn_scale_at(a, key.ks + kvf_attn_vs_delta(a)) : 1.0f;
}

#endif
