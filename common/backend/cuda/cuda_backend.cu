// The CUDA backend: the engine's forward pass on one GPU.
//
// Weights live on the device in the configured dtype (bf16 by default, f16,
// or f32 for exact comparisons), in one slab; norms and biases stay f32.
// GEMMs are cuBLAS (tensor cores for 16-bit weights) with f32 outputs, so
// the residual stream, q/k/v and the KV pool are f32 as on the CPU
// backend: a split cluster can mix CPU and GPU nodes, and the layout and
// numbers of the KV that travels are the same. Per layer, for the batch's
// rows x (docs/DESIGN.md; engine.c has the same math for the CPU ops):
//
//   h = rmsnorm(x += delta)          add_rmsnorm (delta: previous MLP out)
//   qkv = h . Wqkv^T                 cuBLAS
//   + b, rope(q), rope(k), kv write  qkv_rope_write (one kernel)
//   att = attention(q, pool)         attention_prefill(_tc).cu / _decode.cu
//   delta = att . Wo^T               cuBLAS
//   h = rmsnorm(x += delta)          add_rmsnorm
//   act = swiglu(h . Wgu^T)          cuBLAS + swiglu
//   delta = act . Wdown^T            cuBLAS
//
// then logits = rmsnorm(x += delta) . lm_head^T for the rows that want them,
// and a device argmax for rows that only want the greedy token.
//
// Every per-batch input (token ids, positions, block tables, rotation
// angles, tile lists) is packed on the host into one pinned buffer and
// uploaded with one copy. Decode-only batches without host copies are
// captured as CUDA graphs keyed by their shape (batch size, block-table
// width bucket, rows with logits) and replayed: one launch instead of ~15
// per layer.
//
// Thread rules: the backend belongs to one compute thread, as the engine.
#include <cublas_v2.h>

#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"
#include "kvf/backend.h"
#include "kvf/engine.h"
#include "kvf/gpu.h"
#include "kvf/log.h"
#include "kvf/model.h"

#define TRY(call, what)                                                                            \
    do {                                                                                           \
        kvf_status_t st_ = KVF_CUDA_TRY((call), (what));                                           \
        if (st_ != KVF_OK)                                                                         \
            return st_;                                                                            \
    } while (0)

#define CHECK(call)                                                                                \
    do {                                                                                           \
        kvf_status_t st_ = (call);                                                                 \
        if (st_ != KVF_OK)                                                                         \
            return st_;                                                                            \
    } while (0)

#define GRAPH_CACHE          16
#define BLAS_WORKSPACE_BYTES ((size_t)32 << 20)
#define UPLOAD_CHUNK_BYTES   ((size_t)64 << 20)

typedef struct {
    float *attn_norm, *ffn_norm; // (hidden) f32
    const void *wqkv;            // (q_dim + 2 kv_dim, hidden) wdt
    const float *bqkv;           // (q_dim + 2 kv_dim) f32, or NULL
    const void *wo;              // (hidden, q_dim)
    const void *wgu;             // (2 inter, hidden)
    const void *wdown;           // (hidden, inter)
} cuda_layer_t;

// Offsets (bytes) of the per-batch inputs in the metadata buffer; the same
// numbers for the same shape, so a captured graph finds them where it
// expects.
typedef struct {
    size_t tokens, pos, seq, tok_block, cos_sin, tables, tiles, dec, out_rows, total;
} meta_layout_t;

// What a forward computes: the host-side plan of a batch.
typedef struct {
    int n, n_seqs, n_out, bt_stride;
    int n_tiles, max_tile_pos, n_dec, n_splits, split_keys;
    bool decode_only;
    meta_layout_t ml;
} batch_plan_t;

typedef struct {
    bool used;
    int n, bt_stride, n_out, n_splits, split_keys;
    const void *pool_dev; // the pool the graph's kernels address (base, size, layout)
    uint32_t pool_blocks;
    int pool_block_size;
    uint64_t last_use;
    cudaGraphExec_t exec;
} graph_entry_t;

typedef struct cuda_ctx {
    kvf_cuda_config_t cfg;
    const kvf_model_t *model;
    kvf_dtype_t wdt;
    size_t wsz; // bytes per weight element
    cudaStream_t stream, copy_stream;
    cublasHandle_t blas;
    void *blas_ws;

    void *wslab; // every weight on the device
    size_t wslab_bytes;
    const void *embed;   // (vocab, hidden) wdt
    const void *lm_head; // (vocab, hidden) wdt; = embed when tied
    float *final_norm;   // (hidden)
    cuda_layer_t *layers;

    int q_dim, kv_dim, qkv_dim;
    // activations for cap_tokens rows
    int cap_tokens;
    float *x;     // (cap, hidden) residual stream
    float *delta; // (cap, hidden) a block's output, added into x by the next norm
    float *qkv;   // (cap, qkv_dim)
    float *gu;    // (cap, 2 inter)
    void *h;      // (cap, hidden) adt: normed rows
    void *att;    // (cap, q_dim) adt
    void *act;    // (cap, inter) adt
    int cap_out;
    void *hout;        // (cap_out, hidden) adt
    float *logits;     // (cap_out, vocab)
    int32_t *ids;      // (cap_out) device argmax
    int32_t *ids_host; // (cap_out) pinned
    size_t cap_ws;
    float *dec_ws; // decode split partials
    size_t cap_meta;
    void *meta_dev, *meta_host; // per-batch inputs (pinned host copy)
    cudaEvent_t *layer_done;    // (n_layers) compute of layer l's K/V done
    cudaEvent_t *copy_done;     // (n_layers) layer l's K/V in the host mirror
    uint32_t *touched;          // (cap_touched) blocks a batch writes (host)
    size_t cap_touched;

    int n_sms; // multiprocessors: sizes the decode split

    graph_entry_t graphs[GRAPH_CACHE];
    uint64_t use_clock;
} cuda_ctx_t;

// ---- memory ---------------------------------------------------------------

static void dev_free(void *p)
{
    if (p)
        cudaFree(p);
}

static kvf_status_t dev_alloc(void **p, size_t bytes, const char *what)
{
    *p = NULL;
    if (bytes == 0)
        bytes = 256;
    cudaError_t err = cudaMalloc(p, bytes);
    if (err != cudaSuccess) {
        cudaGetLastError();
        kvf_log_error("cuda: cannot allocate %zu bytes of device memory for %s: %s", bytes, what,
                      cudaGetErrorString(err));
        *p = NULL;
        return KVF_ERR_NOMEM;
    }
    return KVF_OK;
}

static void graphs_clear(cuda_ctx_t *c)
{
    for (int i = 0; i < GRAPH_CACHE; i++) {
        if (c->graphs[i].used)
            cudaGraphExecDestroy(c->graphs[i].exec);
        memset(&c->graphs[i], 0, sizeof(c->graphs[i]));
    }
}

static void free_token_buffers(cuda_ctx_t *c)
{
    dev_free(c->x);
    dev_free(c->delta);
    dev_free(c->qkv);
    dev_free(c->gu);
    dev_free(c->h);
    dev_free(c->att);
    dev_free(c->act);
    c->x = c->delta = c->qkv = c->gu = NULL;
    c->h = c->att = c->act = NULL;
    c->cap_tokens = 0;
}

static void free_out_buffers(cuda_ctx_t *c)
{
    dev_free(c->hout);
    dev_free(c->logits);
    dev_free(c->ids);
    if (c->ids_host)
        cudaFreeHost(c->ids_host);
    c->hout = NULL;
    c->logits = NULL;
    c->ids = c->ids_host = NULL;
    c->cap_out = 0;
}

// Grows the activation buffers (and drops the graphs that captured the old
// ones).
static kvf_status_t reserve(cuda_ctx_t *c, const batch_plan_t *p)
{
    const kvf_model_config_t *m = &c->model->cfg;
    size_t asz = c->wsz;
    if (p->n > c->cap_tokens) {
        graphs_clear(c);
        free_token_buffers(c);
        // Round up so a growing batch does not reallocate every step.
        int cap = p->n < 64 ? 64 : p->n;
        size_t n = (size_t)cap;
        if (dev_alloc((void **)&c->x, n * m->hidden * sizeof(float), "activations") ||
            dev_alloc((void **)&c->delta, n * m->hidden * sizeof(float), "activations") ||
            dev_alloc((void **)&c->qkv, n * c->qkv_dim * sizeof(float), "activations") ||
            dev_alloc((void **)&c->gu, n * 2 * m->inter * sizeof(float), "activations") ||
            dev_alloc(&c->h, n * m->hidden * asz, "activations") ||
            dev_alloc(&c->att, n * c->q_dim * asz, "activations") ||
            dev_alloc(&c->act, n * m->inter * asz, "activations")) {
            free_token_buffers(c);
            return KVF_ERR_NOMEM;
        }
        c->cap_tokens = cap;
    }
    if (p->n_out > c->cap_out) {
        graphs_clear(c);
        free_out_buffers(c);
        int cap = p->n_out < 64 ? 64 : p->n_out;
        size_t n = (size_t)cap;
        if (dev_alloc(&c->hout, n * m->hidden * asz, "logits") ||
            dev_alloc((void **)&c->logits, n * m->vocab * sizeof(float), "logits") ||
            dev_alloc((void **)&c->ids, n * sizeof(int32_t), "logits") ||
            KVF_CUDA_TRY(cudaMallocHost((void **)&c->ids_host, n * sizeof(int32_t)),
                         "pinned ids")) {
            free_out_buffers(c);
            return KVF_ERR_NOMEM;
        }
        c->cap_out = cap;
    }
    size_t ws = kvf_cuda_decode_ws_floats(p->n_dec, m->n_heads, p->n_splits, m->head_dim);
    if (ws > c->cap_ws) {
        graphs_clear(c);
        dev_free(c->dec_ws);
        c->dec_ws = NULL;
        c->cap_ws = 0;
        ws += ws / 2;
        CHECK(dev_alloc((void **)&c->dec_ws, ws * sizeof(float), "decode workspace"));
        c->cap_ws = ws;
    }
    if (p->ml.total > c->cap_meta) {
        graphs_clear(c);
        dev_free(c->meta_dev);
        if (c->meta_host)
            cudaFreeHost(c->meta_host);
        c->meta_dev = c->meta_host = NULL;
        c->cap_meta = 0;
        size_t bytes = p->ml.total + p->ml.total / 2;
        CHECK(dev_alloc(&c->meta_dev, bytes, "batch inputs"));
        CHECK(KVF_CUDA_TRY(cudaMallocHost(&c->meta_host, bytes), "pinned batch inputs"));
        c->cap_meta = bytes;
    }
    return KVF_OK;
}

// ---- batch plan -----------------------------------------------------------

static size_t align256(size_t x)
{
    return (x + 255) & ~(size_t)255;
}

static int next_pow2(int x)
{
    int p = 1;
    while (p < x)
        p <<= 1;
    return p;
}

static int n_out_rows(const kvf_engine_seq_t *q)
{
    if (q->logits)
        return q->all_logits ? (int)q->n_tokens : 1;
    return q->greedy_token ? 1 : 0;
}

static void plan_batch(const cuda_ctx_t *c, const kvf_kv_geometry_t *g,
                       const kvf_engine_seq_t *seqs, int n_seqs, bool to_host, batch_plan_t *p)
{
    const kvf_model_config_t *m = &c->model->cfg;
    int group = m->n_heads / m->n_kv_heads, tile = kvf_cuda_prefill_tile_tokens(group);
    memset(p, 0, sizeof(*p));
    p->n_seqs = n_seqs;
    p->decode_only = !to_host && c->cfg.cuda_graphs;
    int need_blocks = 1, max_dec_pos = 0;
    for (int s = 0; s < n_seqs; s++) {
        const kvf_engine_seq_t *q = &seqs[s];
        p->n += (int)q->n_tokens;
        p->n_out += n_out_rows(q);
        int nb = (int)kvf_kv_blocks_for_tokens(g, q->start_pos + q->n_tokens);
        if (nb > need_blocks)
            need_blocks = nb;
        if (q->n_tokens == 1) {
            p->n_dec++;
            if ((int)q->start_pos > max_dec_pos)
                max_dec_pos = (int)q->start_pos;
        } else {
            p->decode_only = false;
            p->n_tiles += ((int)q->n_tokens + tile - 1) / tile;
            int last = (int)(q->start_pos + q->n_tokens - 1);
            if (last > p->max_tile_pos)
                p->max_tile_pos = last;
        }
    }
    // Graphs replay one shape: bucket the table width (and with it the
    // number of decode splits) so growing contexts reuse a graph.
    int bucket = next_pow2(need_blocks);
    p->bt_stride = p->decode_only ? bucket : need_blocks;
    // Decode splits: enough CTAs to fill the GPU twice over (a batch of one
    // sequence has only n_kv_heads of them per split), each split at most
    // the score buffer's keys and a whole number of blocks. Chosen from the
    // bucket in every mode, so a replayed graph and launched kernels split
    // (and sum) the same way; splits past a token's context do nothing.
    int max_keys = kvf_cuda_decode_split_keys(group, g->block_size);
    int bucket_keys = bucket * g->block_size;
    int want = p->n_dec > 0
                   ? (2 * c->n_sms + p->n_dec * m->n_kv_heads - 1) / (p->n_dec * m->n_kv_heads)
                   : 1;
    int keys_per = (bucket_keys + want - 1) / want;
    keys_per = (keys_per + g->block_size - 1) / g->block_size * g->block_size;
    if (keys_per < 64)
        keys_per = (64 + g->block_size - 1) / g->block_size * g->block_size;
    p->split_keys = keys_per < max_keys ? keys_per : max_keys;
    int keys = p->decode_only ? bucket_keys : max_dec_pos + 1;
    p->n_splits = (keys + p->split_keys - 1) / p->split_keys;
    if (p->n_splits < 1)
        p->n_splits = 1;

    meta_layout_t *ml = &p->ml;
    size_t off = 0, n = (size_t)p->n;
    ml->tokens = off;
    off = align256(off + n * 4);
    ml->pos = off;
    off = align256(off + n * 4);
    ml->seq = off;
    off = align256(off + n * 4);
    ml->tok_block = off;
    off = align256(off + n * 4);
    ml->cos_sin = off;
    off = align256(off + n * m->head_dim * sizeof(float));
    ml->tables = off;
    off = align256(off + (size_t)n_seqs * p->bt_stride * 4);
    ml->tiles = off;
    off = align256(off + (size_t)p->n_tiles * 8);
    ml->dec = off;
    off = align256(off + (size_t)p->n_dec * 4);
    ml->out_rows = off;
    off = align256(off + (size_t)p->n_out * 4);
    ml->total = off;
}

// Fills the pinned metadata buffer for the batch.
static void fill_meta(const cuda_ctx_t *c, const kvf_kv_geometry_t *g, const kvf_engine_seq_t *seqs,
                      const batch_plan_t *p)
{
    const kvf_model_t *m = c->model;
    const int hd = m->cfg.head_dim, half = hd / 2;
    int group = m->cfg.n_heads / m->cfg.n_kv_heads, tile = kvf_cuda_prefill_tile_tokens(group);
    uint8_t *base = (uint8_t *)c->meta_host;
    int32_t *tokens = (int32_t *)(base + p->ml.tokens), *pos = (int32_t *)(base + p->ml.pos),
            *seq = (int32_t *)(base + p->ml.seq), *tok_block = (int32_t *)(base + p->ml.tok_block),
            *tables = (int32_t *)(base + p->ml.tables), *tiles = (int32_t *)(base + p->ml.tiles),
            *dec = (int32_t *)(base + p->ml.dec), *out_rows = (int32_t *)(base + p->ml.out_rows);
    float *cos_sin = (float *)(base + p->ml.cos_sin);
    int t = 0, n_tiles = 0, n_dec = 0, o = 0;
    for (int s = 0; s < p->n_seqs; s++) {
        const kvf_engine_seq_t *q = &seqs[s];
        int nb = (int)kvf_kv_blocks_for_tokens(g, q->start_pos + q->n_tokens);
        int32_t *row = tables + (size_t)s * p->bt_stride;
        for (int b = 0; b < p->bt_stride; b++)
            row[b] = b < nb ? (int32_t)q->block_ids[b] : 0; // padding is never read
        if (q->n_tokens == 1)
            dec[n_dec++] = t;
        else
            for (int i = 0; i < (int)q->n_tokens; i += tile) {
                tiles[2 * n_tiles] = t + i;
                tiles[2 * n_tiles + 1] = (int)q->n_tokens - i < tile ? (int)q->n_tokens - i : tile;
                n_tiles++;
            }
        int rows = n_out_rows(q);
        for (int r = 0; r < rows; r++)
            out_rows[o++] = t + (int)q->n_tokens - rows + r;
        for (uint32_t i = 0; i < q->n_tokens; i++, t++) {
            int32_t ps = (int32_t)(q->start_pos + i);
            tokens[t] = (int32_t)q->tokens[i];
            pos[t] = ps;
            seq[t] = s;
            tok_block[t] = (int32_t)q->block_ids[ps / g->block_size];
            float *cs = cos_sin + (size_t)t * hd;
            for (int d = 0; d < half; d++) {
                double a = (double)ps * m->rope_inv_freq[d];
                cs[d] = (float)cos(a);
                cs[half + d] = (float)sin(a);
            }
        }
    }
}

// ---- forward --------------------------------------------------------------

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

// The batch's blocks that this forward writes, sorted, without repeats.
static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static kvf_status_t collect_touched(cuda_ctx_t *c, const kvf_kv_geometry_t *g,
                                    const kvf_engine_seq_t *seqs, int n_seqs, size_t *n_p)
{
    size_t n = 0;
    for (int s = 0; s < n_seqs; s++) {
        uint32_t b0 = seqs[s].start_pos / (uint32_t)g->block_size;
        uint32_t b1 = (seqs[s].start_pos + seqs[s].n_tokens - 1) / (uint32_t)g->block_size;
        n += b1 - b0 + 1;
    }
    if (n > c->cap_touched) {
        uint32_t *t = (uint32_t *)realloc(c->touched, n * sizeof(uint32_t));
        if (!t)
            return KVF_ERR_NOMEM;
        c->touched = t;
        c->cap_touched = n;
    }
    n = 0;
    for (int s = 0; s < n_seqs; s++) {
        uint32_t b0 = seqs[s].start_pos / (uint32_t)g->block_size;
        uint32_t b1 = (seqs[s].start_pos + seqs[s].n_tokens - 1) / (uint32_t)g->block_size;
        for (uint32_t b = b0; b <= b1; b++)
            c->touched[n++] = seqs[s].block_ids[b];
    }
    qsort(c->touched, n, sizeof(uint32_t), cmp_u32);
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        if (u == 0 || c->touched[i] != c->touched[u - 1])
            c->touched[u++] = c->touched[i];
    *n_p = u;
    return KVF_OK;
}

// Enqueues the whole forward (after the metadata upload) on c->stream:
// what a graph captures. With n_touched > 0 it also enqueues the per-layer
// copies to the host mirror; with mark_layers, it records layer_done[l]
// once layer l's K/V is in the pool (for the hooks).
static kvf_status_t enqueue_forward(cuda_ctx_t *c, kvf_kvpool_t *pool, const batch_plan_t *p,
                                    size_t n_touched, bool mark_layers)
{
    const kvf_model_t *mdl = c->model;
    const kvf_model_config_t *m = &mdl->cfg;
    const kvf_kv_geometry_t *g = kvf_kvpool_geometry(pool);
    cudaStream_t st = c->stream;
    const int n = p->n, hidden = m->hidden, hd = m->head_dim;
    const float eps = (float)m->rms_eps;
    uint8_t *md = (uint8_t *)c->meta_dev;
    const int32_t *tokens = (const int32_t *)(md + p->ml.tokens);
    const int32_t *pos = (const int32_t *)(md + p->ml.pos);
    const int32_t *seq = (const int32_t *)(md + p->ml.seq);
    const int32_t *tok_block = (const int32_t *)(md + p->ml.tok_block);
    const float *cos_sin = (const float *)(md + p->ml.cos_sin);
    const int32_t *tables = (const int32_t *)(md + p->ml.tables);
    const int32_t *tiles = (const int32_t *)(md + p->ml.tiles);
    const int32_t *dec = (const int32_t *)(md + p->ml.dec);
    const int32_t *out_rows = (const int32_t *)(md + p->ml.out_rows);
    float *pool_dev = (float *)kvf_kvpool_device_base(pool);
    const int64_t block_stride = (int64_t)(kvf_kv_block_bytes(g) / sizeof(float));
    const int64_t slice_elems = (int64_t)(kvf_kvpool_slice_bytes(pool) / sizeof(float));
    const int n_pool_blocks = (int)kvf_kvpool_num_blocks(pool);

    CHECK(kvf_cuda_embed(st, c->x, c->embed, c->wdt, tokens, n, hidden, m->vocab));
    for (int l = 0; l < m->n_layers; l++) {
        const cuda_layer_t *L = &c->layers[l];
        float *q = c->qkv;
        CHECK(kvf_cuda_add_rmsnorm(st, c->x, l > 0 ? c->delta : NULL, L->attn_norm, c->h, hidden,
                                   c->wdt, n, hidden, eps));
        CHECK(gemm(c, c->qkv, c->h, L->wqkv, n, c->qkv_dim, hidden));
        CHECK(kvf_cuda_qkv_rope_write(st, c->qkv, c->qkv_dim, L->bqkv, cos_sin, pool_dev,
                                      block_stride, (int64_t)l * slice_elems, tok_block, pos, n,
                                      m->n_heads, m->n_kv_heads, hd, g->block_size, n_pool_blocks));
        if (n_touched > 0)
            CHECK(copy_layer_to_host(c, pool, l, n_touched));
        else if (mark_layers)
            TRY(cudaEventRecord(c->layer_done[l], st), "event record");
        kvf_cuda_attn_t a;
        memset(&a, 0, sizeof(a));
        a.kv_layer = pool_dev + (int64_t)l * slice_elems;
        a.block_stride = block_stride;
        a.n_pool_blocks = n_pool_blocks;
        a.n_heads = m->n_heads;
        a.n_kv_heads = m->n_kv_heads;
        a.head_dim = hd;
        a.block_size = g->block_size;
        a.scale = 1.0f / sqrtf((float)hd);
        a.q = q;
        a.ld_q = c->qkv_dim;
        a.out = c->att;
        a.ld_out = c->q_dim;
        a.adt = c->wdt;
        a.n_tokens = n;
        a.pos = pos;
        a.seq = seq;
        a.block_tables = tables;
        a.bt_stride = p->bt_stride;
        a.n_seqs = p->n_seqs;
        if (p->n_tiles > 0) {
            kvf_cuda_prefill_tiles_t t = {tiles, p->n_tiles, p->max_tile_pos};
            CHECK(kvf_cuda_prefill_tc_ok(&a) ? kvf_cuda_attention_prefill_tc(st, &a, &t)
                                             : kvf_cuda_attention_prefill(st, &a, &t));
        }
        if (p->n_dec > 0) {
            kvf_cuda_decode_plan_t dp = {dec, p->n_dec, p->n_splits, p->split_keys, c->dec_ws};
            CHECK(kvf_cuda_attention_decode(st, &a, &dp));
        }
        CHECK(gemm(c, c->delta, c->att, L->wo, n, hidden, c->q_dim));
        CHECK(kvf_cuda_add_rmsnorm(st, c->x, c->delta, L->ffn_norm, c->h, hidden, c->wdt, n, hidden,
                                   eps));
        CHECK(gemm(c, c->gu, c->h, L->wgu, n, 2 * m->inter, hidden));
        CHECK(kvf_cuda_swiglu(st, c->act, c->wdt, c->gu, n, m->inter));
        CHECK(gemm(c, c->delta, c->act, L->wdown, n, hidden, m->inter));
    }
    if (p->n_out == 0)
        return KVF_OK;
    // The last MLP's output joins the stream for every row (cheap), the
    // final norm writes h; the rows that want logits are gathered into hout.
    CHECK(kvf_cuda_add_rmsnorm(st, c->x, c->delta, c->final_norm, c->h, hidden, c->wdt, n, hidden,
                               eps));
    CHECK(kvf_cuda_gather_rows(st, c->hout, c->h, (size_t)hidden * c->wsz, out_rows, p->n_out));
    CHECK(gemm(c, c->logits, c->hout, c->lm_head, p->n_out, m->vocab, hidden));
    CHECK(kvf_cuda_argmax(st, c->ids, c->logits, p->n_out, m->vocab));
    return KVF_OK;
}

// A graph for plan p over pool: the same shape and the same pool (a graph
// bakes in the pool's address, size and layout).
static graph_entry_t *graph_find(cuda_ctx_t *c, const kvf_kvpool_t *pool, const batch_plan_t *p)
{
    const void *dev = kvf_kvpool_device_base(pool);
    uint32_t blocks = kvf_kvpool_num_blocks(pool);
    int block_size = kvf_kvpool_geometry(pool)->block_size;
    for (int i = 0; i < GRAPH_CACHE; i++) {
        graph_entry_t *e = &c->graphs[i];
        if (e->used && e->n == p->n && e->bt_stride == p->bt_stride && e->n_out == p->n_out &&
            e->n_splits == p->n_splits && e->split_keys == p->split_keys && e->pool_dev == dev &&
            e->pool_blocks == blocks && e->pool_block_size == block_size)
            return e;
    }
    return NULL;
}

// Captures the forward of plan p into a graph (evicting the least recently
// used one when the cache is full).
static kvf_status_t graph_capture(cuda_ctx_t *c, kvf_kvpool_t *pool, const batch_plan_t *p,
                                  graph_entry_t **e_p)
{
    graph_entry_t *e = NULL;
    for (int i = 0; i < GRAPH_CACHE && !e; i++)
        if (!c->graphs[i].used)
            e = &c->graphs[i];
    if (!e) {
        e = &c->graphs[0];
        for (int i = 1; i < GRAPH_CACHE; i++)
            if (c->graphs[i].last_use < e->last_use)
                e = &c->graphs[i];
        cudaGraphExecDestroy(e->exec);
        memset(e, 0, sizeof(*e));
    }
    TRY(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal), "graph capture");
    kvf_status_t st = enqueue_forward(c, pool, p, 0, false);
    cudaGraph_t graph = NULL;
    cudaError_t err = cudaStreamEndCapture(c->stream, &graph);
    if (st != KVF_OK || err != cudaSuccess) {
        if (graph)
            cudaGraphDestroy(graph);
        cudaGetLastError();
        if (st == KVF_OK)
            st = KVF_CUDA_TRY(err, "graph capture");
        return st;
    }
    err = cudaGraphInstantiate(&e->exec, graph, 0);
    cudaGraphDestroy(graph);
    TRY(err, "graph instantiate");
    e->used = true;
    e->n = p->n;
    e->bt_stride = p->bt_stride;
    e->n_out = p->n_out;
    e->n_splits = p->n_splits;
    e->split_keys = p->split_keys;
    e->pool_dev = kvf_kvpool_device_base(pool);
    e->pool_blocks = kvf_kvpool_num_blocks(pool);
    e->pool_block_size = kvf_kvpool_geometry(pool)->block_size;
    *e_p = e;
    return KVF_OK;
}

static kvf_status_t cuda_forward(void *ctx, kvf_kvpool_t *pool, const kvf_engine_seq_t *seqs,
                                 int n_seqs, const kvf_engine_hooks_t *hooks)
{
    cuda_ctx_t *c = (cuda_ctx_t *)ctx;
    const kvf_model_config_t *m = &c->model->cfg;
    const kvf_kv_geometry_t *g = kvf_kvpool_geometry(pool);
    if (!kvf_kvpool_device_base(pool)) {
        kvf_log_error("cuda forward: the kv pool is in host memory (make it with "
                      "kvf_backend_cuda_kvpool_create)");
        return KVF_ERR_INVAL;
    }
    bool to_host = hooks && hooks->kv_to_host;
    if (to_host && !kvf_kvpool_base(pool)) {
        kvf_log_error("cuda forward: K/V wanted on the host but the pool has no host mirror");
        return KVF_ERR_INVAL;
    }
    TRY(cudaSetDevice(c->cfg.device), "set device");
    batch_plan_t p;
    plan_batch(c, g, seqs, n_seqs, to_host, &p);
    if (p.n_splits > 65535 || p.n > (1 << 24)) {
        kvf_log_error("cuda forward: batch of %d tokens / %d splits too large", p.n, p.n_splits);
        return KVF_ERR_TOO_BIG;
    }
    CHECK(reserve(c, &p));
    size_t n_touched = 0;
    if (to_host)
        CHECK(collect_touched(c, g, seqs, n_seqs, &n_touched));
    fill_meta(c, g, seqs, &p);
    TRY(cudaMemcpyAsync(c->meta_dev, c->meta_host, p.ml.total, cudaMemcpyHostToDevice, c->stream),
        "batch inputs upload");

    bool replayed = false;
    if (p.decode_only) {
        graph_entry_t *e = graph_find(c, pool, &p);
        if (!e && graph_capture(c, pool, &p, &e) != KVF_OK) {
            kvf_log_warn("cuda forward: graph capture failed; running without graphs");
            c->cfg.cuda_graphs = false;
            e = NULL;
        }
        if (e) {
            e->last_use = ++c->use_clock;
            TRY(cudaGraphLaunch(e->exec, c->stream), "graph launch");
            replayed = true;
        }
    }
    if (!replayed) {
        kvf_status_t st = enqueue_forward(c, pool, &p, n_touched, hooks && hooks->on_layer_done);
        if (st != KVF_OK) {
            cudaStreamSynchronize(c->stream);
            cudaStreamSynchronize(c->copy_stream);
            return st;
        }
    }
    // Hooks in layer order, each once its layer's K/V is in the pool (and,
    // with host copies, in the mirror) while later layers still compute. A
    // replayed graph has no per-layer marks: its hooks run once it is done.
    if (hooks && hooks->on_layer_done) {
        if (replayed)
            TRY(cudaStreamSynchronize(c->stream), "forward");
        for (int l = 0; l < m->n_layers; l++) {
            if (n_touched > 0)
                TRY(cudaEventSynchronize(c->copy_done[l]), "kv copy wait");
            else if (!replayed)
                TRY(cudaEventSynchronize(c->layer_done[l]), "layer wait");
            hooks->on_layer_done(hooks->arg, l);
        }
    }
    // Results, after the hooks: a copy into pageable memory (the callers'
    // logits arrays, unless pinned) blocks the host until the stream gets
    // there, which would hold every hook back to the end of the forward.
    int o = 0;
    bool any_ids = false;
    for (int s = 0; s < n_seqs; s++) {
        const kvf_engine_seq_t *q = &seqs[s];
        int rows = n_out_rows(q);
        if (q->logits)
            TRY(cudaMemcpyAsync(q->logits, c->logits + (size_t)o * m->vocab,
                                (size_t)rows * m->vocab * sizeof(float), cudaMemcpyDeviceToHost,
                                c->stream),
                "logits download");
        any_ids |= q->greedy_token != NULL;
        o += rows;
    }
    if (any_ids)
        TRY(cudaMemcpyAsync(c->ids_host, c->ids, (size_t)p.n_out * sizeof(int32_t),
                            cudaMemcpyDeviceToHost, c->stream),
            "ids download");
    TRY(cudaStreamSynchronize(c->stream), "forward");
    if (n_touched > 0)
        TRY(cudaStreamSynchronize(c->copy_stream), "kv copy");
    o = 0;
    for (int s = 0; s < n_seqs; s++) {
        const kvf_engine_seq_t *q = &seqs[s];
        int rows = n_out_rows(q);
        if (q->greedy_token)
            *q->greedy_token = (uint32_t)c->ids_host[o + rows - 1];
        o += rows;
    }
    return KVF_OK;
}

static kvf_status_t cuda_synchronize(void *ctx)
{
    cuda_ctx_t *c = (cuda_ctx_t *)ctx;
    TRY(cudaStreamSynchronize(c->stream), "synchronize");
    return KVF_OK;
}

static void cuda_destroy(void *ctx)
{
    cuda_ctx_t *c = (cuda_ctx_t *)ctx;
    if (!c)
        return;
    cudaSetDevice(c->cfg.device);
    if (c->stream)
        cudaStreamSynchronize(c->stream);
    if (c->copy_stream)
        cudaStreamSynchronize(c->copy_stream);
    graphs_clear(c);
    free_token_buffers(c);
    free_out_buffers(c);
    dev_free(c->dec_ws);
    dev_free(c->meta_dev);
    if (c->meta_host)
        cudaFreeHost(c->meta_host);
    if (c->layer_done)
        for (int l = 0; l < c->model->cfg.n_layers; l++) {
            if (c->layer_done[l])
                cudaEventDestroy(c->layer_done[l]);
            if (c->copy_done[l])
                cudaEventDestroy(c->copy_done[l]);
        }
    free(c->layer_done);
    free(c->copy_done);
    free(c->touched);
    free(c->layers);
    dev_free(c->wslab);
    dev_free(c->blas_ws);
    if (c->blas)
        cublasDestroy(c->blas);
    if (c->stream)
        cudaStreamDestroy(c->stream);
    if (c->copy_stream)
        cudaStreamDestroy(c->copy_stream);
    free(c);
}

static void *cuda_host_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    void *p = NULL;
    if (cudaMallocHost(&p, bytes) != cudaSuccess) {
        cudaGetLastError();
        kvf_log_error("cuda: cannot allocate %zu bytes of pinned host memory", bytes);
        return NULL;
    }
    return p;
}

static void cuda_host_free(void *ctx, void *p)
{
    (void)ctx;
    cudaFreeHost(p);
}

// Positional: nvcc's C++ takes designated initializers only in order, and
// the per-op slots are unused (forward owns the whole pass).
static const kvf_backend_ops_t cuda_ops = {
    "cuda",
    NULL,
    NULL,
    NULL,
    NULL,
    NULL,
    NULL,
    cuda_forward,
    NULL, // bind_model: the weights were uploaded at creation
    NULL, // matmul_bound: forward owns the whole pass
    cuda_synchronize,
    cuda_destroy,
    cuda_host_alloc,
    cuda_host_free,
};

// ---- weights --------------------------------------------------------------

typedef struct {
    cuda_ctx_t *c;
    uint8_t *dev; // slab cursor base
    size_t off;   // bytes used
    void *stage;  // pinned staging buffer (UPLOAD_CHUNK_BYTES)
    bool dry;     // only count bytes
} uploader_t;

// Places n f32 values (converted to dtype) at the slab's next 256-byte
// boundary; returns the device address (NULL on a dry run).
static kvf_status_t upload(uploader_t *u, const float *src, size_t n, kvf_dtype_t dtype,
                           void **dst_p)
{
    size_t esz = kvf_dtype_size(dtype), bytes = n * esz;
    u->off = align256(u->off);
    void *dst = u->dry ? NULL : u->dev + u->off;
    if (!u->dry) {
        size_t per = UPLOAD_CHUNK_BYTES / esz;
        for (size_t i = 0; i < n; i += per) {
            size_t cnt = n - i < per ? n - i : per;
            if (dtype == KVF_DTYPE_F32) {
                memcpy(u->stage, src + i, cnt * sizeof(float));
            } else {
                uint16_t *h = (uint16_t *)u->stage;
                for (size_t j = 0; j < cnt; j++)
                    h[j] = dtype == KVF_DTYPE_BF16 ? kvf_f32_to_bf16(src[i + j])
                                                   : kvf_f32_to_f16(src[i + j]);
            }
            TRY(cudaMemcpy((uint8_t *)dst + i * esz, u->stage, cnt * esz, cudaMemcpyHostToDevice),
                "weight upload");
        }
    }
    u->off += bytes;
    *dst_p = dst;
    return KVF_OK;
}

static kvf_status_t upload_model(uploader_t *u)
{
    cuda_ctx_t *c = u->c;
    const kvf_model_t *mdl = c->model;
    const kvf_model_config_t *m = &mdl->cfg;
    const size_t h = (size_t)m->hidden, qkv = (size_t)c->qkv_dim, in = (size_t)m->inter;
    void *p;
    CHECK(upload(u, mdl->embed, (size_t)m->vocab * h, c->wdt, &p));
    c->embed = p;
    if (mdl->lm_head == mdl->embed) {
        c->lm_head = c->embed;
    } else {
        CHECK(upload(u, mdl->lm_head, (size_t)m->vocab * h, c->wdt, &p));
        c->lm_head = p;
    }
    CHECK(upload(u, mdl->final_norm, h, KVF_DTYPE_F32, &p));
    c->final_norm = (float *)p;
    for (int l = 0; l < m->n_layers; l++) {
        const kvf_layer_weights_t *W = &mdl->layers[l];
        cuda_layer_t *L = &c->layers[l];
        CHECK(upload(u, W->attn_norm, h, KVF_DTYPE_F32, &p));
        L->attn_norm = (float *)p;
        CHECK(upload(u, W->ffn_norm, h, KVF_DTYPE_F32, &p));
        L->ffn_norm = (float *)p;
        CHECK(upload(u, W->wqkv, qkv * h, c->wdt, &p));
        L->wqkv = p;
        L->bqkv = NULL;
        if (W->bqkv) {
            CHECK(upload(u, W->bqkv, qkv, KVF_DTYPE_F32, &p));
            L->bqkv = (const float *)p;
        }
        CHECK(upload(u, W->wo, h * (size_t)c->q_dim, c->wdt, &p));
        L->wo = p;
        CHECK(upload(u, W->wgu, 2 * in * h, c->wdt, &p));
        L->wgu = p;
        CHECK(upload(u, W->wdown, h * in, c->wdt, &p));
        L->wdown = p;
    }
    u->off = align256(u->off);
    return KVF_OK;
}

static kvf_status_t create(const kvf_cuda_config_t *cfg, const kvf_model_t *model, cuda_ctx_t *c)
{
    const kvf_model_config_t *m = &model->cfg;
    int n_dev = 0;
    cudaError_t err = cudaGetDeviceCount(&n_dev);
    if (err != cudaSuccess || n_dev == 0) {
        cudaGetLastError();
        kvf_log_error("cuda backend: no GPU (%s)",
                      err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device");
        return KVF_ERR_DEVICE;
    }
    if (cfg->device < 0 || cfg->device >= n_dev) {
        kvf_log_error("cuda backend: no device %d (%d GPU%s)", cfg->device, n_dev,
                      n_dev == 1 ? "" : "s");
        return KVF_ERR_DEVICE;
    }
    if (cfg->wdtype != KVF_DTYPE_BF16 && cfg->wdtype != KVF_DTYPE_F16 &&
        cfg->wdtype != KVF_DTYPE_F32) {
        kvf_log_error("cuda backend: weight dtype %s (bf16, f16 or f32)",
                      kvf_dtype_name(cfg->wdtype));
        return KVF_ERR_INVAL;
    }
    int group = m->n_heads / m->n_kv_heads;
    if (m->head_dim % 8 != 0 || m->head_dim > KVF_CUDA_MAX_HEAD_DIM || group > KVF_CUDA_MAX_GROUP) {
        kvf_log_error("cuda backend: head dim %d / %d query heads per kv head not supported "
                      "(a multiple of 8 up to %d; at most %d)",
                      m->head_dim, group, KVF_CUDA_MAX_HEAD_DIM, KVF_CUDA_MAX_GROUP);
        return KVF_ERR_UNSUPPORTED;
    }
    TRY(cudaSetDevice(cfg->device), "set device");
    TRY(cudaDeviceGetAttribute(&c->n_sms, cudaDevAttrMultiProcessorCount, cfg->device),
        "device attribute");
    TRY(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "stream create");
    TRY(cudaStreamCreateWithFlags(&c->copy_stream, cudaStreamNonBlocking), "stream create");
    CHECK(kvf_cuda_blas_status(cublasCreate(&c->blas), "create"));
    CHECK(kvf_cuda_blas_status(cublasSetStream(c->blas, c->stream), "set stream"));
    // A fixed workspace: cuBLAS must not allocate while a graph captures.
    CHECK(dev_alloc(&c->blas_ws, BLAS_WORKSPACE_BYTES, "cublas workspace"));
    CHECK(kvf_cuda_blas_status(cublasSetWorkspace(c->blas, c->blas_ws, BLAS_WORKSPACE_BYTES),
                               "set workspace"));
    CHECK(kvf_cuda_blas_status(cublasSetMathMode(c->blas, c->wdt == KVF_DTYPE_F32
                                                              ? CUBLAS_PEDANTIC_MATH
                                                              : CUBLAS_DEFAULT_MATH),
                               "math mode"));
    c->layers = (cuda_layer_t *)calloc((size_t)m->n_layers, sizeof(cuda_layer_t));
    c->layer_done = (cudaEvent_t *)calloc((size_t)m->n_layers, sizeof(cudaEvent_t));
    c->copy_done = (cudaEvent_t *)calloc((size_t)m->n_layers, sizeof(cudaEvent_t));
    if (!c->layers || !c->layer_done || !c->copy_done)
        return KVF_ERR_NOMEM;
    for (int l = 0; l < m->n_layers; l++) {
        TRY(cudaEventCreateWithFlags(&c->layer_done[l], cudaEventDisableTiming), "event create");
        TRY(cudaEventCreateWithFlags(&c->copy_done[l], cudaEventDisableTiming), "event create");
    }
    uploader_t u;
    memset(&u, 0, sizeof(u));
    u.c = c;
    u.dry = true;
    CHECK(upload_model(&u));
    c->wslab_bytes = u.off;
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    if (c->wslab_bytes > free_b) {
        kvf_log_error("cuda backend: %.2f GB of %s weights do not fit in %.2f GB free on device "
                      "%d",
                      c->wslab_bytes / 1e9, kvf_dtype_name(c->wdt), free_b / 1e9, cfg->device);
        return KVF_ERR_NOMEM;
    }
    CHECK(dev_alloc(&c->wslab, c->wslab_bytes, "weights"));
    TRY(cudaMallocHost(&u.stage, UPLOAD_CHUNK_BYTES), "pinned staging");
    u.dry = false;
    u.dev = (uint8_t *)c->wslab;
    u.off = 0;
    kvf_status_t st = upload_model(&u);
    cudaFreeHost(u.stage);
    return st;
}

extern "C" kvf_status_t kvf_backend_cuda_create(const kvf_cuda_config_t *cfg,
                                                const kvf_model_t *model, kvf_backend_t *be_p)
{
    const kvf_model_config_t *m = &model->cfg;
    cuda_ctx_t *c = (cuda_ctx_t *)calloc(1, sizeof(*c));
    if (!c)
        return KVF_ERR_NOMEM;
    c->cfg = *cfg;
    c->model = model;
    c->wdt = cfg->wdtype;
    c->wsz = kvf_dtype_size(cfg->wdtype);
    c->q_dim = m->n_heads * m->head_dim;
    c->kv_dim = m->n_kv_heads * m->head_dim;
    c->qkv_dim = c->q_dim + 2 * c->kv_dim;
    kvf_status_t st = create(cfg, model, c);
    if (st != KVF_OK) {
        cuda_destroy(c);
        return st;
    }
    kvf_gpu_info_t info;
    if (kvf_gpu_info(cfg->device, &info) == KVF_OK)
        kvf_log_info("cuda backend: %s (sm_%d%d), %.2f GB of %s weights, graphs %s", info.name,
                     info.major, info.minor, c->wslab_bytes / 1e9, kvf_dtype_name(c->wdt),
                     cfg->cuda_graphs ? "on" : "off");
    be_p->ops = &cuda_ops;
    be_p->ctx = c;
    return KVF_OK;
}

extern "C" bool kvf_backend_is_cuda(const kvf_backend_t *be)
{
    return be && be->ops == &cuda_ops;
}

extern "C" size_t kvf_backend_cuda_weight_bytes(const kvf_backend_t *be)
{
    return kvf_backend_is_cuda(be) ? ((const cuda_ctx_t *)be->ctx)->wslab_bytes : 0;
}

extern "C" kvf_status_t kvf_backend_cuda_mem_info(const kvf_backend_t *be, size_t *free_p,
                                                  size_t *total_p)
{
    if (!kvf_backend_is_cuda(be))
        return KVF_ERR_INVAL;
    TRY(cudaSetDevice(((const cuda_ctx_t *)be->ctx)->cfg.device), "set device");
    size_t f = 0, t = 0;
    TRY(cudaMemGetInfo(&f, &t), "memory info");
    *free_p = f;
    *total_p = t;
    return KVF_OK;
}

// ---- KV pool in device memory -----------------------------------------------

typedef struct {
    int device;
    cudaStream_t stream; // the backend's: uploads are ordered with compute
    void *dev, *host;
} pool_mem_t;

static kvf_status_t pool_upload(void *arg, size_t off, size_t bytes)
{
    pool_mem_t *pm = (pool_mem_t *)arg;
    TRY(cudaSetDevice(pm->device), "set device");
    TRY(cudaMemcpyAsync((uint8_t *)pm->dev + off, (const uint8_t *)pm->host + off, bytes,
                        cudaMemcpyHostToDevice, pm->stream),
        "kv upload");
    TRY(cudaStreamSynchronize(pm->stream), "kv upload");
    return KVF_OK;
}

static void pool_release(void *arg)
{
    pool_mem_t *pm = (pool_mem_t *)arg;
    cudaSetDevice(pm->device);
    if (pm->dev)
        cudaFree(pm->dev);
    if (pm->host)
        cudaFreeHost(pm->host);
    free(pm);
}

extern "C" kvf_status_t kvf_backend_cuda_kvpool_create(kvf_backend_t *be,
                                                       const kvf_kv_geometry_t *geo,
                                                       uint32_t num_blocks, bool host_mirror,
                                                       kvf_kvpool_t **pool_p)
{
    if (!kvf_backend_is_cuda(be))
        return KVF_ERR_INVAL;
    cuda_ctx_t *c = (cuda_ctx_t *)be->ctx;
    kvf_status_t st = kvf_kv_geometry_validate(geo);
    if (st != KVF_OK)
        return st;
    if (num_blocks == 0)
        return KVF_ERR_INVAL;
    size_t bytes = kvf_kv_block_bytes(geo) * (size_t)num_blocks;
    TRY(cudaSetDevice(c->cfg.device), "set device");
    pool_mem_t *pm = (pool_mem_t *)calloc(1, sizeof(*pm));
    if (!pm)
        return KVF_ERR_NOMEM;
    pm->device = c->cfg.device;
    pm->stream = c->stream;
    st = dev_alloc(&pm->dev, bytes, "kv pool");
    // On the backend's stream: its non-blocking streams do not wait for the
    // legacy stream a plain cudaMemset uses, so that clear could land after
    // the first forward's K/V.
    if (st == KVF_OK)
        st = KVF_CUDA_TRY(cudaMemsetAsync(pm->dev, 0, bytes, pm->stream), "kv pool clear");
    if (st == KVF_OK && host_mirror) {
        st = KVF_CUDA_TRY(cudaHostAlloc(&pm->host, bytes, cudaHostAllocPortable),
                          "kv pool host mirror");
        if (st == KVF_OK)
            memset(pm->host, 0, bytes);
        else
            pm->host = NULL;
    }
    if (st != KVF_OK) {
        pool_release(pm);
        return st;
    }
    kvf_kvpool_memory_t mem;
    mem.host_base = pm->host;
    mem.device_base = pm->dev;
    mem.arg = pm;
    mem.upload = pool_upload;
    mem.release = pool_release;
    st = kvf_kvpool_create_on(geo, num_blocks, &mem, pool_p);
    if (st != KVF_OK)
        pool_release(pm);
    return st;
}
