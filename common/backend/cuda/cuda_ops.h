/* The CUDA backend's ops: one .cu file per op, each with a host launcher
 * that checks shapes (the kvf_cuda_check_* functions below, plain C, so
 * tests run them on machines without a GPU), launches on an explicit stream
 * and checks the launch error.
 *
 * Conventions (all pointers are device memory unless said otherwise):
 *  - the residual stream x, q/k/v and GEMM outputs are f32;
 *  - the KV pool holds any format of kvf/kv_format.h (kv_dtype): kernels
 *    encode K/V rows when they write them and decode them to f32 (exactly)
 *    when they read them;
 *  - "act" buffers (GEMM inputs: normed rows, attention output, SwiGLU
 *    output) are in the weight dtype adt: bf16, f16 or f32;
 *  - row strides ("ld") are in elements;
 *  - a KV layer is addressed in bytes: kv_layer = pool + layer *
 *    kvf_kv_slice_bytes (one layer's slice of block 0) and block_stride =
 *    bytes from one block to the next; inside a slice K/V data and scales
 *    lie as kv_format.h lays them out (kvf_kv_data_offset,
 *    kvf_kv_scale_offset; docs/ARCHITECTURE.md, KV layout). */
#ifndef KVF_CUDA_OPS_H
#define KVF_CUDA_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
/* First: kv_format.h's device-code qualifiers (KVF_KV_HD) come from it. */
#include <cuda_runtime.h>
#endif

#include "kvf/dtype.h"
#include "kvf/kv_format.h"
#include "kvf/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest head_dim the attention kernels take (a multiple of 8 up to this). */
#define KVF_CUDA_MAX_HEAD_DIM 256
/* Largest query-head group (n_heads / n_kv_heads) the attention kernels take. */
#define KVF_CUDA_MAX_GROUP 32
/* Prefill attention: queries per tile (tokens x heads of one kv group). */
#define KVF_CUDA_PREFILL_ROWS 64
/* Decode attention: threads per CTA. */
#define KVF_CUDA_DECODE_THREADS 128

/* Attention over a paged pool for a batch's tokens (both kernels). */
typedef struct {
    const void *kv_layer;    /* one layer of the pool, see above */
    int64_t block_stride;    /* bytes per block (every layer) */
    kvf_kv_dtype_t kv_dtype; /* the pool's format */
    int n_pool_blocks;     /* blocks in the pool (ids below this) */
    int n_heads, n_kv_heads, head_dim, block_size;
    float scale;    /* 1 / sqrt(head_dim), or the model's (kvf_model_attn_scale) */
    float softcap;  /* > 0: scaled scores become softcap * tanh(s / softcap) (Gemma2); 0: none */
    const float *q; /* (n_tokens, n_heads * head_dim) rows of stride ld_q */
    int ld_q;
    void *out; /* (n_tokens, n_heads * head_dim) in adt, row stride ld_out */
    int ld_out;
    kvf_dtype_t adt;
    int n_tokens;                /* rows of q / out in the batch */
    const int32_t *pos;          /* (n_tokens) position of each token: it attends to 0..pos */
    const int32_t *seq;          /* (n_tokens) sequence of each token */
    const int32_t *block_tables; /* (n_seqs, bt_stride) block ids in position order */
    int bt_stride;
    int n_seqs;
    int window; /* sliding window W: a token at p attends to p - W + 1..p only; 0: none */
} kvf_cuda_attn_t;

/* Prefill tiles: runs of consecutive tokens of one sequence (consecutive
 * positions). tiles[2 i] = first token (batch row), tiles[2 i + 1] = count,
 * 1..kvf_cuda_prefill_tile_tokens(group). */
typedef struct {
    const int32_t *tiles; /* (n_tiles, 2) */
    int n_tiles;
    int max_tile_pos; /* host: largest position in any tile (bounds the key loop) */
} kvf_cuda_prefill_tiles_t;

/* Tokens per prefill tile for a query-head group: rows / group (>= 1). */
static inline int kvf_cuda_prefill_tile_tokens(int group)
{
    int t = KVF_CUDA_PREFILL_ROWS / (group > 0 ? group : 1);
    return t > 0 ? t : 1;
}

/* Decode attention, split over the context (flash-decoding): CTA (i, g, s)
 * handles token tokens[i], kv head g and keys [s * split_keys, (s + 1) *
 * split_keys) for all group query heads, and a second kernel merges the
 * splits. ws holds n_dec * n_heads * n_splits * (head_dim + 2) floats. */
typedef struct {
    const int32_t *tokens; /* (n_dec) batch rows to compute */
    int n_dec;
    int n_splits;   /* >= ceil((max pos + 1) / split_keys); splits past a token's
                       context do nothing */
    int split_keys; /* keys per split, a multiple of block_size */
    float *ws;      /* workspace, see above */
} kvf_cuda_decode_plan_t;

/* Keys per decode split for a geometry: a multiple of block_size that keeps
 * the CTA's score buffer (group * split_keys floats) within 16 KiB. */
int kvf_cuda_decode_split_keys(int group, int block_size);

/* Workspace floats a decode plan needs. */
size_t kvf_cuda_decode_ws_floats(int n_dec, int n_heads, int n_splits, int head_dim);

/* ---- shape checks (plain C; each logs what is wrong) ---- */

kvf_status_t kvf_cuda_check_embed(int n_tokens, int hidden, int vocab);
kvf_status_t kvf_cuda_check_rmsnorm(int m, int dim, int ld_out, kvf_dtype_t adt, float eps);
kvf_status_t kvf_cuda_check_qkv_rope_write(int n_tokens, int ld, int n_heads, int n_kv_heads,
                                           int head_dim, int block_size, int n_pool_blocks,
                                           kvf_kv_dtype_t kv_dtype);
kvf_status_t kvf_cuda_check_attention(const kvf_cuda_attn_t *a);
kvf_status_t kvf_cuda_check_prefill_tiles(const kvf_cuda_attn_t *a,
                                          const kvf_cuda_prefill_tiles_t *t);
/* True when the tensor-core prefill kernel takes this attention: bf16 or
 * f16 activations and a head dim that is a multiple of 16, at most 128. */
bool kvf_cuda_prefill_tc_ok(const kvf_cuda_attn_t *a);
kvf_status_t kvf_cuda_check_decode_plan(const kvf_cuda_attn_t *a, const kvf_cuda_decode_plan_t *p);
kvf_status_t kvf_cuda_check_swiglu(int m, int n, kvf_dtype_t adt);
kvf_status_t kvf_cuda_check_argmax(int m, int n);
kvf_status_t kvf_cuda_check_gather(size_t row_bytes, int n_rows);
kvf_status_t kvf_cuda_check_gemm(int m, int n, int k, kvf_dtype_t wdt);

#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
#include <cuda_runtime.h>

/* ---- launchers (CUDA translation units only) ---- */

/* x(n_tokens, hidden) f32 = embed[tokens[t]] (weights in wdt). */
kvf_status_t kvf_cuda_embed(cudaStream_t st, float *x, const void *embed, kvf_dtype_t wdt,
                            const int32_t *tokens, int n_tokens, int hidden, int vocab);

/* For each of m rows: if delta, x += delta (stored back to x); then
 * out = w * x / sqrt(mean(x^2) + eps) in adt (row stride ld_out). w is f32
 * (dim). The residual add fused with the norm that follows it. */
kvf_status_t kvf_cuda_add_rmsnorm(cudaStream_t st, float *x, const float *delta, const float *w,
                                  void *out, int ld_out, kvf_dtype_t adt, int m, int dim,
                                  float eps);

/* After the qkv GEMM, per token row of qkv (q | k | v, row stride ld): adds
 * bias (NULL: none), RMS-norms each q head with q_norm and each k head with
 * k_norm (head_dim weights, eps; NULL: no norm, Qwen3 has them), rotates q
 * in place and k (cos_sin as for rope), and writes k and v to the token's
 * block tok_block[t], slot pos[t] % block_size, of the pool layer at
 * layer_off, encoded in kv_dtype as kvf_kv_encode_row does (block_stride
 * and layer_off in bytes). k and v are staged in their columns of the row,
 * which hold them rotated (k) and biased afterwards. Bias, norms, rope and
 * kv_write in one launch. */
kvf_status_t kvf_cuda_qkv_rope_write(cudaStream_t st, float *qkv, int ld, const float *bias,
                                     const float *q_norm, const float *k_norm, float eps,
                                     const float *cos_sin, void *pool, int64_t block_stride,
                                     int64_t layer_off, kvf_kv_dtype_t kv_dtype,
                                     const int32_t *tok_block, const int32_t *pos, int n_tokens,
                                     int n_heads, int n_kv_heads, int head_dim, int block_size,
                                     int n_pool_blocks);

/* Causal attention for prefill tiles (tiled, online softmax). */
kvf_status_t kvf_cuda_attention_prefill(cudaStream_t st, const kvf_cuda_attn_t *a,
                                        const kvf_cuda_prefill_tiles_t *t);

/* The same on tensor cores (attention_prefill_tc.cu), for the attentions
 * kvf_cuda_prefill_tc_ok() accepts (KVF_ERR_UNSUPPORTED otherwise). */
kvf_status_t kvf_cuda_attention_prefill_tc(cudaStream_t st, const kvf_cuda_attn_t *a,
                                           const kvf_cuda_prefill_tiles_t *t);

/* Attention for single tokens (decode), split over the context. */
kvf_status_t kvf_cuda_attention_decode(cudaStream_t st, const kvf_cuda_attn_t *a,
                                       const kvf_cuda_decode_plan_t *p);

/* out(m, n) = silu(gu[:, :n]) * gu[:, n:] in adt; gu (m, 2n) f32. */
kvf_status_t kvf_cuda_swiglu(cudaStream_t st, void *out, kvf_dtype_t adt, const float *gu, int m,
                             int n);

/* The same with gelu_tanh(gate) (Gemma2's GeGLU), as x / (1 + e^(-2u)),
 * u = sqrt(2/pi) (x + 0.044715 x^3). */
kvf_status_t kvf_cuda_geglu(cudaStream_t st, void *out, kvf_dtype_t adt, const float *gu, int m,
                            int n);

/* x[i] = x[i] * s for i < n (f32): Gemma2's embedding normalizer. */
kvf_status_t kvf_cuda_scale(cudaStream_t st, float *x, size_t n, float s);

/* x[i] = cap * tanh(x[i] / cap) for i < n (f32), cap > 0: Gemma2's final
 * logit soft-capping, before the argmax. */
kvf_status_t kvf_cuda_softcap(cudaStream_t st, float *x, size_t n, float cap);

/* dst row i = src row rows[i] (n_rows rows of row_bytes, a multiple of 2). */
kvf_status_t kvf_cuda_gather_rows(cudaStream_t st, void *dst, const void *src, size_t row_bytes,
                                  const int32_t *rows, int n_rows);

/* ids[r] = first index of the largest of row r of x(m, n) (f32). */
kvf_status_t kvf_cuda_argmax(cudaStream_t st, int32_t *ids, const float *x, int m, int n);

/* Converts the CUDA error of a launch (or a call) to a status, logging it
 * with what failed; KVF_OK for cudaSuccess. */
kvf_status_t kvf_cuda_status(cudaError_t err, const char *what, const char *file, int line);
/* Converts a cuBLAS status (a cublasStatus_t) the same way, logging what
 * failed. */
kvf_status_t kvf_cuda_blas_status(int status, const char *what);

#define KVF_CUDA_TRY(call, what) kvf_cuda_status((call), (what), __FILE__, __LINE__)
#define KVF_CUDA_LAUNCHED(what)  kvf_cuda_status(cudaGetLastError(), (what), __FILE__, __LINE__)
#endif

#endif
