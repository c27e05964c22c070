/* Shape checks of the CUDA launchers (cuda_ops.h). Plain C, in every build,
 * so the unit tests check them on machines without a GPU; each launcher
 * calls its check before it touches the device. */
#include "cuda_ops.h"

#include "kvf/log.h"

#include <limits.h>
#include <stdbool.h>

static bool adt_ok(kvf_dtype_t adt)
{
    return adt == KVF_DTYPE_F32 || adt == KVF_DTYPE_BF16 || adt == KVF_DTYPE_F16;
}

kvf_status_t kvf_cuda_check_embed(int n_tokens, int hidden, int vocab)
{
    if (n_tokens < 0 || hidden <= 0 || vocab <= 0) {
        kvf_log_error("cuda embed: bad shape (%d tokens, hidden %d, vocab %d)", n_tokens, hidden,
                      vocab);
        return KVF_ERR_INVAL;
    }
    return KVF_OK;
}

kvf_status_t kvf_cuda_check_rmsnorm(int m, int dim, int ld_out, kvf_dtype_t adt, float eps)
{
    if (m < 0 || dim <= 0 || ld_out < dim || !adt_ok(adt) || !(eps > 0.0f)) {
        kvf_log_error("cuda rmsnorm: bad shape (%d rows, dim %d, out stride %d, %s, eps %g)", m,
                      dim, ld_out, kvf_dtype_name(adt), (double)eps);
        return KVF_ERR_INVAL;
    }
    return KVF_OK;
}

static bool kv_dtype_ok(kvf_kv_dtype_t dt)
{
    return (unsigned)dt < KVF_KV_N_DTYPES;
}

kvf_status_t kvf_cuda_check_qkv_rope_write(int n_tokens, int ld, int n_heads, int n_kv_heads,
                                           int head_dim, int block_size, int n_pool_blocks,
                                           kvf_kv_dtype_t kv_dtype)
{
    if (!kv_dtype_ok(kv_dtype)) {
        kvf_log_error("cuda qkv rope write: KV format %d unknown", (int)kv_dtype);
        return KVF_ERR_INVAL;
    }
    if (n_tokens < 0 || n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0 || head_dim % 2 != 0 ||
        block_size <= 0 || n_pool_blocks <= 0 ||
        (long long)(n_heads + 2 * n_kv_heads) * head_dim > ld) {
        kvf_log_error("cuda qkv rope write: bad shape (%d tokens, stride %d, %d + 2 x %d heads "
                      "of %d, block size %d, %d blocks)",
                      n_tokens, ld, n_heads, n_kv_heads, head_dim, block_size, n_pool_blocks);
        return KVF_ERR_INVAL;
    }
    return KVF_OK;
}

kvf_status_t kvf_cuda_check_attention(const kvf_cuda_attn_t *a)
{
    if (!a->kv_layer || !a->q || !a->out || !a->pos || !a->seq || !a->block_tables) {
        kvf_log_error("cuda attention: a device pointer is missing");
        return KVF_ERR_INVAL;
    }
    if (a->n_heads <= 0 || a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads != 0) {
        kvf_log_error("cuda attention: %d query heads are not a multiple of %d kv heads",
                      a->n_heads, a->n_kv_heads);
        return KVF_ERR_INVAL;
    }
    int group = a->n_heads / a->n_kv_heads;
    if (group > KVF_CUDA_MAX_GROUP) {
        kvf_log_error("cuda attention: %d query heads per kv head (at most %d)", group,
                      KVF_CUDA_MAX_GROUP);
        return KVF_ERR_UNSUPPORTED;
    }
    if (a->head_dim <= 0 || a->head_dim % 8 != 0 || a->head_dim > KVF_CUDA_MAX_HEAD_DIM) {
        kvf_log_error("cuda attention: head dim %d (a multiple of 8 up to %d)", a->head_dim,
                      KVF_CUDA_MAX_HEAD_DIM);
        return KVF_ERR_UNSUPPORTED;
    }
    long long q_dim = (long long)a->n_heads * a->head_dim;
    if (a->ld_q < q_dim || a->ld_out < q_dim) {
        kvf_log_error("cuda attention: row strides q %d, out %d below %lld", a->ld_q, a->ld_out,
                      q_dim);
        return KVF_ERR_INVAL;
    }
    if (a->block_size <= 0 || a->n_pool_blocks <= 0 || a->n_tokens < 0 || a->n_seqs <= 0 ||
        a->bt_stride <= 0 || !adt_ok(a->adt)) {
        kvf_log_error("cuda attention: bad batch (block size %d, %d pool blocks, %d tokens, %d "
                      "sequences, table stride %d, %s)",
                      a->block_size, a->n_pool_blocks, a->n_tokens, a->n_seqs, a->bt_stride,
                      kvf_dtype_name(a->adt));
        return KVF_ERR_INVAL;
    }
    if (!kv_dtype_ok(a->kv_dtype)) {
        kvf_log_error("cuda attention: KV format %d unknown", (int)a->kv_dtype);
        return KVF_ERR_INVAL;
    }
    /* One layer's slice: K and V rows of data and scales (kvf/kv_format.h). */
    long long slice = 2LL * a->n_kv_heads * a->block_size *
                      (long long)kvf_kv_row_bytes(a->kv_dtype, a->head_dim);
    if (a->block_stride < slice) {
        kvf_log_error("cuda attention: block stride %lld bytes below one layer's slice %lld",
                      (long long)a->block_stride, slice);
        return KVF_ERR_INVAL;
    }
    if (!(a->scale > 0.0f) || !(a->softcap >= 0.0f)) {
        kvf_log_error("cuda attention: scale %g, soft-cap %g", (double)a->scale,
                      (double)a->softcap);
        return KVF_ERR_INVAL;
    }
    return KVF_OK;
}

kvf_status_t kvf_cuda_check_prefill_tiles(const kvf_cuda_attn_t *a,
                                          const kvf_cuda_prefill_tiles_t *t)
{
    if (t->n_tiles < 0 || (t->n_tiles > 0 && !t->tiles)) {
        kvf_log_error("cuda prefill attention: %d tiles without a tile list", t->n_tiles);
        return KVF_ERR_INVAL;
    }
    /* A tile covers positions up to max_tile_pos, whose block must be in a
     * table row. */
    if (t->n_tiles > 0 &&
        (t->max_tile_pos < 0 || t->max_tile_pos / a->block_size >= a->bt_stride)) {
        kvf_log_error("cuda prefill attention: position %d beyond a table of %d blocks of %d",
                      t->max_tile_pos, a->bt_stride, a->block_size);
        return KVF_ERR_INVAL;
    }
    return KVF_OK;
}

int kvf_cuda_decode_split_keys(int group, int block_size)
{
    if (group < 1)
        group = 1;
    if (block_size < 1)
        block_size = 1;
    /* 16 KiB of scores: 4096 floats over the group. */
    int keys = 4096 / group;
    if (keys > 512)
        keys = 512;
    keys -= keys % block_size;
    return keys >= block_size ? keys : block_size;
}

size_t kvf_cuda_decode_ws_floats(int n_dec, int n_heads, int n_splits, int head_dim)
{
    return (size_t)n_dec * (size_t)n_heads * (size_t)n_splits * ((size_t)head_dim + 2);
}

kvf_status_t kvf_cuda_check_decode_plan(const kvf_cuda_attn_t *a, const kvf_cuda_decode_plan_t *p)
{
    if (p->n_dec < 0 || (p->n_dec > 0 && (!p->tokens || !p->ws))) {
        kvf_log_error("cuda decode attention: %d tokens without a token list or workspace",
                      p->n_dec);
        return KVF_ERR_INVAL;
    }
    if (p->n_dec == 0)
        return KVF_OK;
    if (p->split_keys <= 0 || p->split_keys % a->block_size != 0 || p->n_splits <= 0 ||
        p->n_splits > 65535) {
        kvf_log_error("cuda decode attention: %d splits of %d keys (a multiple of block size %d)",
                      p->n_splits, p->split_keys, a->block_size);
        return KVF_ERR_INVAL;
    }
    int group = a->n_heads / a->n_kv_heads;
    if ((long long)group * p->split_keys > 4096) {
        kvf_log_error("cuda decode attention: %d keys per split for a group of %d exceed the "
                      "score buffer",
                      p->split_keys, group);
        return KVF_ERR_INVAL;
    }
    if ((long long)p->n_splits * p->split_keys >
        (long long)a->bt_stride * a->block_size + p->split_keys) {
        kvf_log_error("cuda decode attention: %d splits of %d keys reach past a table of %d "
                      "blocks",
                      p->n_splits, p->split_keys, a->bt_stride);
        return KVF_ERR_INVAL;
    }
    return KVF_OK;
}

kvf_status_t kvf_cuda_check_swiglu(int m, int n, kvf_dtype_t adt)
{
    if (m < 0 || n <= 0 || !adt_ok(adt)) {
        kvf_log_error("cuda swiglu: bad shape (%d x %d, %s)", m, n, kvf_dtype_name(adt));
        return KVF_ERR_INVAL;
    }
    return KVF_OK;
}

kvf_status_t kvf_cuda_check_argmax(int m, int n)
{
    if (m < 0 || n <= 0) {
        kvf_log_error("cuda argmax: bad shape (%d x %d)", m, n);
        return KVF_ERR_INVAL;
    }
    return KVF_OK;
}

kvf_status_t kvf_cuda_check_gemm(int m, int n, int k, kvf_dtype_t wdt)
{
    if (m < 0 || n <= 0 || k <= 0 || !adt_ok(wdt)) {
        kvf_log_error("cuda gemm: bad shape (%d x %d x %d, %s)", m, n, k, kvf_dtype_name(wdt));
        return KVF_ERR_INVAL;
    }
    /* cuBLAS takes int dimensions and leading dimensions. */
    if ((long long)m * n > INT_MAX * 8LL) {
        kvf_log_error("cuda gemm: %d x %d output too large", m, n);
        return KVF_ERR_TOO_BIG;
    }
    return KVF_OK;
}

kvf_status_t kvf_cuda_check_gather(size_t row_bytes, int n_rows)
{
    if (n_rows < 0 || row_bytes == 0 || row_bytes % 2 != 0) {
        kvf_log_error("cuda gather: bad shape (%d rows of %zu bytes)", n_rows, row_bytes);
        return KVF_ERR_INVAL;
    }
    return KVF_OK;
}

bool kvf_cuda_prefill_tc_ok(const kvf_cuda_attn_t *a)
{
    return (a->adt == KVF_DTYPE_BF16 || a->adt == KVF_DTYPE_F16) && a->head_dim % 16 == 0 &&
           a->head_dim <= 128;
}
