// The CUDA backend's forward pass (cuda_backend.cuh; the math per layer is
// in cuda_backend.cu's header comment): the kernels and GEMMs of a batch
// enqueued on the backend's stream, the per-layer hooks, the results.
#include <math.h>
#include <string.h>

#include "cuda_backend.cuh"
#include "kvf/log.h"

// The batch's inputs on the device: c->meta_dev at the plan's offsets.
typedef struct {
    const int32_t *tokens, *pos, *seq, *tok_block, *tables, *tiles, *dec, *out_rows;
    const float *cos_sin;
} batch_inputs_t;

// How the kernels address a pool in device memory.
typedef struct {
    unsigned char *base;
    int64_t block_stride; // bytes per block
    int64_t slice_bytes;  // bytes of one layer's slice of a block (kvf_kv_slice_bytes)
    kvf_kv_dtype_t dtype; // the pool's KV format
    int n_blocks;
    int block_size;
} pool_view_t;

static batch_inputs_t batch_inputs(const cuda_ctx_t *c, const batch_plan_t *p)
{
    const uint8_t *md = (const uint8_t *)c->meta_dev;
    batch_inputs_t in;
    in.tokens = (const int32_t *)(md + p->ml.tokens);
    in.pos = (const int32_t *)(md + p->ml.pos);
    in.seq = (const int32_t *)(md + p->ml.seq);
    in.tok_block = (const int32_t *)(md + p->ml.tok_block);
    in.cos_sin = (const float *)(md + p->ml.cos_sin);
    in.tables = (const int32_t *)(md + p->ml.tables);
    in.tiles = (const int32_t *)(md + p->ml.tiles);
    in.dec = (const int32_t *)(md + p->ml.dec);
    in.out_rows = (const int32_t *)(md + p->ml.out_rows);
    return in;
}

static pool_view_t pool_view(kvf_kvpool_t *pool)
{
    pool_view_t v;
    v.base = (unsigned char *)kvf_kvpool_device_base(pool);
    v.block_stride = (int64_t)kvf_kv_block_bytes(kvf_kvpool_geometry(pool));
    v.slice_bytes = (int64_t)kvf_kvpool_slice_bytes(pool);
    v.dtype = kvf_kvpool_geometry(pool)->dtype;
    v.n_blocks = (int)kvf_kvpool_num_blocks(pool);
    v.block_size = kvf_kvpool_geometry(pool)->block_size;
    return v;
}

static kvf_status_t gemm(cuda_ctx_t *c, float *y, const void *x, const void *w, int m, int n, int k)
{
    CHECK(kvf_cuda_check_gemm(m, n, k, c->wdt));
    if (m == 0)
        return KVF_OK;
    // Row-major y(m, n) = x(m, k) . w(n, k)^T is, column-major, y^T(n, m) =
    // w^T . x^T with w read as a (k, n) matrix transposed.
    cudaDataType_t t = c->wdt == KVF_DTYPE_BF16  ? CUDA_R_16BF
                       : c->wdt == KVF_DTYPE_F16 ? CUDA_R_16F
                                                 : CUDA_R_32F;
    const float one = 1.0f, zero = 0.0f;
    return kvf_cuda_blas_status(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, w, t,
                                             k, x, t, k, &zero, y, CUDA_R_32F, n,
                                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                                "gemm");
}

// Copies the batch's blocks of layer l to the host mirror on the copy
// stream, after the layer's kv_write; runs of consecutive block ids are one
// strided copy.
static kvf_status_t copy_layer_to_host(cuda_ctx_t *c, kvf_kvpool_t *pool, int l, size_t n_touched)
{
    size_t block_bytes = kvf_kv_block_bytes(kvf_kvpool_geometry(pool));
    size_t slice = kvf_kvpool_slice_bytes(pool);
    uint8_t *host = (uint8_t *)kvf_kvpool_base(pool);
    const uint8_t *dev = (const uint8_t *)kvf_kvpool_device_base(pool);
    TRY(cudaEventRecord(c->layer_done[l], c->stream), "event record");
    TRY(cudaStreamWaitEvent(c->copy_stream, c->layer_done[l], 0), "stream wait");
    for (size_t i = 0; i < n_touched;) {
        size_t j = i + 1;
        while (j < n_touched && c->touched[j] == c->touched[j - 1] + 1)
            j++;
        size_t off = (size_t)c->touched[i] * block_bytes + (size_t)l * slice;
        TRY(cudaMemcpy2DAsync(host + off, block_bytes, dev + off, block_bytes, slice, j - i,
                              cudaMemcpyDeviceToHost, c->copy_stream),
            "kv copy to host");
        i = j;
    }
    TRY(cudaEventRecord(c->copy_done[l], c->copy_stream), "event record");
    return KVF_OK;
}

// Attention of layer l over the pool for every token: prefill tiles and
// decode tokens, each with its kernel.
static kvf_status_t enqueue_attention(cuda_ctx_t *c, const batch_plan_t *p,
                                      const batch_inputs_t *in, const pool_view_t *pv, int l)
{
    const kvf_model_config_t *m = &c->model->cfg;
    cudaStream_t st = c->stream;
    kvf_cuda_attn_t a;
    memset(&a, 0, sizeof(a));
    a.kv_layer = pv->base + (int64_t)l * pv->slice_bytes;
    a.block_stride = pv->block_stride;
    a.kv_dtype = pv->dtype;
    a.n_pool_blocks = pv->n_blocks;
    a.n_heads = m->n_heads;
    a.n_kv_heads = m->n_kv_heads;
    a.head_dim = m->head_dim;
    a.block_size = pv->block_size;
    // Gemma2: query_pre_attn_scalar^-1/2 and its soft-cap; else 1 / sqrt(head_dim)
    a.scale = m->attn_scalar > 0 ? kvf_model_attn_scale(m) : 1.0f / sqrtf((float)m->head_dim);
    a.softcap = (float)m->attn_softcap;
    a.q = c->qkv;
    a.ld_q = c->qkv_dim;
    a.out = c->att;
    a.ld_out = c->q_dim;
    a.adt = c->wdt;
    a.n_tokens = p->n;
    a.pos = in->pos;
    a.seq = in->seq;
    a.block_tables = in->tables;
    a.bt_stride = p->bt_stride;
    a.n_seqs = p->n_seqs;
    a.window = kvf_model_layer_window(m, l);
    if (p->n_tiles > 0) {
        kvf_cuda_prefill_tiles_t t = {in->tiles, p->n_tiles, p->max_tile_pos};
        CHECK(kvf_cuda_prefill_tc_ok(&a) ? kvf_cuda_attention_prefill_tc(st, &a, &t)
                                         : kvf_cuda_attention_prefill(st, &a, &t));
    }
    if (p->n_dec > 0) {
        kvf_cuda_decode_plan_t dp = {in->dec, p->n_dec, p->n_splits, p->split_keys, c->dec_ws};
        CHECK(kvf_cuda_attention_decode(st, &a, &dp));
    }
    return KVF_OK;
}

// A block's output in delta, RMS-normed in place with its post-norm
// (Gemma2; NULL: none) before the next norm adds it in.
static kvf_status_t post_norm(cuda_ctx_t *c, const float *w, int n)
{
    const kvf_model_config_t *m = &c->model->cfg;
    if (!w)
        return KVF_OK;
    return kvf_cuda_add_rmsnorm(c->stream, c->delta, NULL, w, c->delta, m->hidden, KVF_DTYPE_F32,
                                n, m->hidden, (float)m->rms_eps);
}

// Layer l for every row: attention block (norm, qkv, rope and K/V write,
// attention, output projection), then the MLP block (norm, gate/up,
// SwiGLU or GeGLU, down projection), whose output the next norm adds in
// (Gemma2: each block's output RMS-normed first).
static kvf_status_t enqueue_layer(cuda_ctx_t *c, kvf_kvpool_t *pool, const batch_plan_t *p,
                                  const batch_inputs_t *in, const pool_view_t *pv, int l,
                                  size_t n_touched, bool mark_layers)
{
    const kvf_model_config_t *m = &c->model->cfg;
    const cuda_layer_t *L = &c->layers[l];
    cudaStream_t st = c->stream;
    const int n = p->n, hidden = m->hidden;
    const float eps = (float)m->rms_eps;
    CHECK(kvf_cuda_add_rmsnorm(st, c->x, l > 0 ? c->delta : NULL, L->attn_norm, c->h, hidden,
                               c->wdt, n, hidden, eps));
    CHECK(gemm(c, c->qkv, c->h, L->wqkv, n, c->qkv_dim, hidden));
    CHECK(kvf_cuda_qkv_rope_write(st, c->qkv, c->qkv_dim, L->bqkv, L->q_norm, L->k_norm, eps,
                                  in->cos_sin, pv->base, pv->block_stride,
                                  (int64_t)l * pv->slice_bytes, pv->dtype, in->tok_block, in->pos, n, m->n_heads, m->n_kv_heads, m->head_dim,
                                  pv->block_size, pv->n_blocks));
    if (n_touched > 0)
        CHECK(copy_layer_to_host(c, pool, l, n_touched));
    else if (mark_layers)
        TRY(cudaEventRecord(c->layer_done[l], st), "event record");
    CHECK(enqueue_attention(c, p, in, pv, l));
    CHECK(gemm(c, c->delta, c->att, L->wo, n, hidden, c->q_dim));
    CHECK(post_norm(c, L->post_attn_norm, n));
    CHECK(kvf_cuda_add_rmsnorm(st, c->x, c->delta, L->ffn_norm, c->h, hidden, c->wdt, n, hidden,
                               eps));
    CHECK(gemm(c, c->gu, c->h, L->wgu, n, 2 * m->inter, hidden));
    if (m->act == KVF_ACT_GELU_TANH)
        CHECK(kvf_cuda_geglu(st, c->act, c->wdt, c->gu, n, m->inter));
    else
        CHECK(kvf_cuda_swiglu(st, c->act, c->wdt, c->gu, n, m->inter));
    CHECK(gemm(c, c->delta, c->act, L->wdown, n, hidden, m->inter));
    return post_norm(c, L->post_ffn_norm, n);
}

// Logits and greedy ids of the rows that want them. The last MLP's output
// joins the stream for every row (cheap), the final norm writes h; the
// rows that want logits are gathered into hout.
static kvf_status_t enqueue_logits(cuda_ctx_t *c, const batch_plan_t *p, const batch_inputs_t *in)
{
    const kvf_model_config_t *m = &c->model->cfg;
    cudaStream_t st = c->stream;
    const int n = p->n, hidden = m->hidden;
    CHECK(kvf_cuda_add_rmsnorm(st, c->x, c->delta, c->final_norm, c->h, hidden, c->wdt, n, hidden,
                               (float)m->rms_eps));
    CHECK(kvf_cuda_gather_rows(st, c->hout, c->h, (size_t)hidden * c->wsz, in->out_rows, p->n_out));
    CHECK(gemm(c, c->logits, c->hout, c->lm_head, p->n_out, m->vocab, hidden));
    if (m->final_softcap > 0)
        CHECK(kvf_cuda_softcap(st, c->logits, (size_t)p->n_out * m->vocab,
                               (float)m->final_softcap));
    CHECK(kvf_cuda_argmax(st, c->ids, c->logits, p->n_out, m->vocab));
    return KVF_OK;
}

kvf_status_t kvf_cuda__enqueue_forward(cuda_ctx_t *c, kvf_kvpool_t *pool, const batch_plan_t *p,
                                       size_t n_touched, bool mark_layers)
{
    const kvf_model_config_t *m = &c->model->cfg;
    const batch_inputs_t in = batch_inputs(c, p);
    const pool_view_t pv = pool_view(pool);
    CHECK(kvf_cuda_embed(c->stream, c->x, c->embed, c->wdt, in.tokens, p->n, m->hidden, m->vocab));
    if (m->embed_scale) // sqrt(hidden) rounded to float, as the CPU engine's
        CHECK(kvf_cuda_scale(c->stream, c->x, (size_t)p->n * m->hidden,
                             (float)sqrt((double)m->hidden)));
    for (int l = 0; l < m->n_layers; l++)
        CHECK(enqueue_layer(c, pool, p, &in, &pv, l, n_touched, mark_layers));
    if (p->n_out == 0)
        return KVF_OK;
    return enqueue_logits(c, p, &in);
}

// The pool must be in device memory, and have a host mirror when the hooks
// want K/V on the host.
static kvf_status_t check_pool(const kvf_kvpool_t *pool, bool to_host)
{
    if (!kvf_kvpool_device_base(pool)) {
        kvf_log_error("cuda forward: the kv pool is in host memory (make it with "
                      "kvf_backend_cuda_kvpool_create)");
        return KVF_ERR_INVAL;
    }
    if (to_host && !kvf_kvpool_base(pool)) {
        kvf_log_error("cuda forward: K/V wanted on the host but the pool has no host mirror");
        return KVF_ERR_INVAL;
    }
    return KVF_OK;
}

// Plans the batch, grows the buffers, lists the blocks to copy to the host
// (to_host) and uploads the batch's inputs.
static kvf_status_t prepare_batch(cuda_ctx_t *c, const kvf_kv_geometry_t *g,
                                  const kvf_engine_seq_t *seqs, int n_seqs, bool to_host,
                                  batch_plan_t *p, size_t *n_touched_p)
{
    kvf_cuda__plan_batch(c, g, seqs, n_seqs, to_host, p);
    if (p->n_splits > 65535 || p->n > (1 << 24)) {
        kvf_log_error("cuda forward: batch of %d tokens / %d splits too large", p->n, p->n_splits);
        return KVF_ERR_TOO_BIG;
    }
    CHECK(kvf_cuda__reserve(c, p));
    size_t n_touched = 0;
    if (to_host)
        CHECK(kvf_cuda__collect_touched(c, g, seqs, n_seqs, &n_touched));
    kvf_cuda__fill_meta(c, g, seqs, p);
    TRY(cudaMemcpyAsync(c->meta_dev, c->meta_host, p->ml.total, cudaMemcpyHostToDevice, c->stream),
        "batch inputs upload");
    *n_touched_p = n_touched;
    return KVF_OK;
}

// Replays (or captures, then replays) the graph of a decode-only batch;
// launches every kernel otherwise, or when capture fails (graphs are then
// off for good). *replayed_p: whether a graph ran.
static kvf_status_t launch_forward(cuda_ctx_t *c, kvf_kvpool_t *pool, const batch_plan_t *p,
                                   size_t n_touched, bool mark_layers, bool *replayed_p)
{
    *replayed_p = false;
    if (p->decode_only) {
        graph_entry_t *e = kvf_cuda__graph_find(c, pool, p);
        if (!e && kvf_cuda__graph_capture(c, pool, p, &e) != KVF_OK) {
            kvf_log_warn("cuda forward: graph capture failed; running without graphs");
            c->cfg.cuda_graphs = false;
            e = NULL;
        }
        if (e) {
            e->last_use = ++c->use_clock;
            TRY(cudaGraphLaunch(e->exec, c->stream), "graph launch");
            *replayed_p = true;
            return KVF_OK;
        }
    }
    kvf_status_t st = kvf_cuda__enqueue_forward(c, pool, p, n_touched, mark_layers);
    if (st != KVF_OK) {
        cudaStreamSynchronize(c->stream);
        cudaStreamSynchronize(c->copy_stream);
    }
    return st;
}

// Hooks in layer order, each once its layer's K/V is in the pool (and,
// with host copies, in the mirror) while later layers still compute. A
// replayed graph has no per-layer marks: its hooks run once it is done.
static kvf_status_t run_hooks(cuda_ctx_t *c, const kvf_engine_hooks_t *hooks, bool replayed,
                              size_t n_touched)
{
    if (replayed)
        TRY(cudaStreamSynchronize(c->stream), "forward");
    for (int l = 0; l < c->model->cfg.n_layers; l++) {
        if (n_touched > 0)
            TRY(cudaEventSynchronize(c->copy_done[l]), "kv copy wait");
        else if (!replayed)
            TRY(cudaEventSynchronize(c->layer_done[l]), "layer wait");
        hooks->on_layer_done(hooks->arg, l);
    }
    return KVF_OK;
}

// Results, after the hooks: a copy into pageable memory (the callers'
// logits arrays, unless pinned) blocks the host until the stream gets
// there, which would hold every hook back to the end of the forward.
// Waits for the forward (and the K/V copies) to finish.
static kvf_status_t download_results(cuda_ctx_t *c, const kvf_engine_seq_t *seqs, int n_seqs,
                                     const batch_plan_t *p, size_t n_touched)
{
    const int vocab = c->model->cfg.vocab;
    int o = 0;
    bool any_ids = false;
    for (int s = 0; s < n_seqs; s++) {
        const kvf_engine_seq_t *q = &seqs[s];
        int rows = kvf_cuda__out_rows(q);
        if (q->logits)
            TRY(cudaMemcpyAsync(q->logits, c->logits + (size_t)o * vocab,
                                (size_t)rows * vocab * sizeof(float), cudaMemcpyDeviceToHost,
                                c->stream),
                "logits download");
        any_ids |= q->greedy_token != NULL;
        o += rows;
    }
    if (any_ids)
        TRY(cudaMemcpyAsync(c->ids_host, c->ids, (size_t)p->n_out * sizeof(int32_t),
                            cudaMemcpyDeviceToHost, c->stream),
            "ids download");
    TRY(cudaStreamSynchronize(c->stream), "forward");
    if (n_touched > 0)
        TRY(cudaStreamSynchronize(c->copy_stream), "kv copy");
    o = 0;
    for (int s = 0; s < n_seqs; s++) {
        const kvf_engine_seq_t *q = &seqs[s];
        int rows = kvf_cuda__out_rows(q);
        if (q->greedy_token)
            *q->greedy_token = (uint32_t)c->ids_host[o + rows - 1];
        o += rows;
    }
    return KVF_OK;
}

kvf_status_t kvf_cuda__forward(void *ctx, kvf_kvpool_t *pool, const kvf_engine_seq_t *seqs,
                               int n_seqs, const kvf_engine_hooks_t *hooks)
{
    cuda_ctx_t *c = (cuda_ctx_t *)ctx;
    bool to_host = hooks && hooks->kv_to_host;
    bool want_hooks = hooks && hooks->on_layer_done;
    CHECK(check_pool(pool, to_host));
    TRY(cudaSetDevice(c->cfg.device), "set device");
    batch_plan_t p;
    size_t n_touched = 0;
    CHECK(prepare_batch(c, kvf_kvpool_geometry(pool), seqs, n_seqs, to_host, &p, &n_touched));
    bool replayed = false;
    CHECK(launch_forward(c, pool, &p, n_touched, want_hooks, &replayed));
    if (want_hooks)
        CHECK(run_hooks(c, hooks, replayed, n_touched));
    return download_results(c, seqs, n_seqs, &p, n_touched);
}
