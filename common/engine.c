/* Forward pass of a Llama-family decoder over a paged KV pool. See
 * kvf/engine.h. The math, per layer, for the batch's tokens x:
 *   h = rmsnorm(x) ; q,k,v = h·Wqkvᵀ (+b) ; [Qwen3: rmsnorm of each q and k head]
 *   rope(q, k) ; write k,v to the pool
 *   x += attention(q, pool, the layer's sliding window)·Woᵀ
 *   x += down(silu(gate(rmsnorm(x))) * up(rmsnorm(x)))
 * then logits = rmsnorm(x)·lm_headᵀ for the rows that want them.
 * Gemma2: x starts as the embedding times sqrt(hidden); the attention's
 * scores are scaled by query_pre_attn_scalar^-1/2 and soft-capped; each
 * block's output is RMS-normed before its residual add (x +=
 * rmsnorm(attention·Woᵀ), x += rmsnorm(down(...))); the MLP is
 * gelu_tanh(gate) * up; the logits are soft-capped. */
#include "kvf/engine.h"
#include "kvf/detmath.h"
#include "kvf/log.h"
#include "kvf/sampling.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct kvf_engine {
    const kvf_model_t *model;
    kvf_backend_t *be;
    kvf_kvpool_t *pool;
    int q_dim, kv_dim, qkv_dim;
    /* scratch for cap_tokens tokens */
    int cap_tokens;
    float *x;       /* (cap_tokens, hidden) residual stream */
    float *h;       /* (cap_tokens, hidden) normed input of a block */
    float *qkv;     /* (cap_tokens, qkv_dim) q | k | v per row */
    float *att;     /* (cap_tokens, q_dim) attention output */
    float *gu;      /* (cap_tokens, 2 * inter) gate | up per row */
    float *act;     /* (cap_tokens, inter) silu(gate) * up */
    float *cos_sin; /* (cap_tokens, head_dim) cos then sin of each rotation angle */
    int32_t *pos;   /* (cap_tokens) */
    int32_t *seq;   /* (cap_tokens) */
    int cap_seqs;
    const uint32_t **tables; /* (cap_seqs) */
    int cap_out;
    float *hout;   /* (cap_out, hidden) final-normed rows that want logits */
    float *logits; /* (cap_out, vocab) */
};

kvf_kv_geometry_t kvf_engine_kv_geometry(const kvf_model_t *model, int block_size,
                                         kvf_kv_dtype_t dtype)
{
    kvf_kv_geometry_t g = {
        .n_layers = model->cfg.n_layers,
        .n_kv_heads = model->cfg.n_kv_heads,
        .head_dim = model->cfg.head_dim,
        .block_size = block_size,
        .dtype = dtype,
    };
    return g;
}

kvf_status_t kvf_engine_create(const kvf_model_t *model, kvf_backend_t *backend, kvf_kvpool_t *pool,
                               kvf_engine_t **engine_p)
{
    const kvf_model_config_t *c = &model->cfg;
    const kvf_kv_geometry_t *g = kvf_kvpool_geometry(pool);
    if (g->n_layers != c->n_layers || g->n_kv_heads != c->n_kv_heads ||
        g->head_dim != c->head_dim) {
        kvf_log_error("engine: kv pool geometry (%d layers, %d kv heads, head dim %d) does "
                      "not fit the model (%d, %d, %d)",
                      g->n_layers, g->n_kv_heads, g->head_dim, c->n_layers, c->n_kv_heads,
                      c->head_dim);
        return KVF_ERR_MISMATCH;
    }
    if ((unsigned)g->dtype >= KVF_KV_N_DTYPES ||
        !(backend->kv_dtypes & KVF_KV_DTYPE_BIT(g->dtype))) {
        kvf_log_error("engine: the %s backend does not compute with a %s kv pool",
                      backend->ops->name, kvf_kv_dtype_name(g->dtype));
        return KVF_ERR_UNSUPPORTED;
    }
    if (!backend->ops->forward && kvf_kvpool_device_base(pool)) {
        kvf_log_error("engine: the %s backend cannot compute on a pool in device memory",
                      backend->ops->name);
        return KVF_ERR_MISMATCH;
    }
    if (model->matrices_dropped && !backend->ops->matmul_bound && !backend->ops->forward) {
        kvf_log_error("engine: the model's projections were dropped and the %s backend has no "
                      "copy of its own",
                      backend->ops->name);
        return KVF_ERR_MISMATCH;
    }
    const kvf_backend_ops_t *ops = backend->ops;
    const char *missing = ops->forward                                 ? NULL
                          : c->qk_norm && !ops->head_rmsnorm           ? "per-head RMSNorm"
                          : c->act == KVF_ACT_GELU_TANH && !ops->geglu ? "GeGLU"
                          : c->sandwich_norms && !ops->rmsnorm_add     ? "RMSNorm-and-add"
                                                                       : NULL;
    if (missing) {
        kvf_log_error("engine: the %s backend has no %s (%s needs it)", ops->name, missing,
                      c->arch_name);
        return KVF_ERR_UNSUPPORTED;
    }
    if (backend->ops->bind_model) {
        kvf_status_t st = backend->ops->bind_model(backend->ctx, model);
        if (st != KVF_OK)
            return st;
    }
    kvf_engine_t *e = calloc(1, sizeof(*e));
    if (!e)
        return KVF_ERR_NOMEM;
    e->model = model;
    e->be = backend;
    e->pool = pool;
    e->q_dim = c->n_heads * c->head_dim;
    e->kv_dim = c->n_kv_heads * c->head_dim;
    e->qkv_dim = e->q_dim + 2 * e->kv_dim;
    *engine_p = e;
    return KVF_OK;
}

static void free_token_scratch(kvf_engine_t *e)
{
    free(e->x);
    free(e->h);
    free(e->qkv);
    free(e->att);
    free(e->gu);
    free(e->act);
    free(e->cos_sin);
    free(e->pos);
    free(e->seq);
    e->x = e->h = e->qkv = e->att = e->gu = e->act = e->cos_sin = NULL;
    e->pos = e->seq = NULL;
    e->cap_tokens = 0;
}

void kvf_engine_destroy(kvf_engine_t *e)
{
    if (!e)
        return;
    free_token_scratch(e);
    free(e->tables);
    free(e->hout);
    free(e->logits);
    free(e);
}

static float *alloc_floats(size_t n)
{
    return aligned_alloc(64, (n * sizeof(float) + 63) & ~(size_t)63);
}

static kvf_status_t reserve(kvf_engine_t *e, int n_tokens, int n_seqs, int n_out)
{
    const kvf_model_config_t *c = &e->model->cfg;
    if (n_tokens > e->cap_tokens) {
        free_token_scratch(e);
        size_t n = (size_t)n_tokens;
        e->x = alloc_floats(n * (size_t)c->hidden);
        e->h = alloc_floats(n * (size_t)c->hidden);
        e->qkv = alloc_floats(n * (size_t)e->qkv_dim);
        e->att = alloc_floats(n * (size_t)e->q_dim);
        e->gu = alloc_floats(n * 2 * (size_t)c->inter);
        e->act = alloc_floats(n * (size_t)c->inter);
        e->cos_sin = alloc_floats(n * (size_t)c->head_dim);
        e->pos = malloc(n * sizeof(int32_t));
        e->seq = malloc(n * sizeof(int32_t));
        if (!e->x || !e->h || !e->qkv || !e->att || !e->gu || !e->act || !e->cos_sin || !e->pos ||
            !e->seq) {
            free_token_scratch(e);
            return KVF_ERR_NOMEM;
        }
        e->cap_tokens = n_tokens;
    }
    if (n_seqs > e->cap_seqs) {
        const uint32_t **t = realloc(e->tables, (size_t)n_seqs * sizeof(*t));
        if (!t)
            return KVF_ERR_NOMEM;
        e->tables = t;
        e->cap_seqs = n_seqs;
    }
    if (n_out > e->cap_out) {
        free(e->hout);
        free(e->logits);
        e->hout = alloc_floats((size_t)n_out * (size_t)c->hidden);
        e->logits = alloc_floats((size_t)n_out * (size_t)c->vocab);
        if (!e->hout || !e->logits) {
            free(e->hout);
            free(e->logits);
            e->hout = e->logits = NULL;
            e->cap_out = 0;
            return KVF_ERR_NOMEM;
        }
        e->cap_out = n_out;
    }
    return KVF_OK;
}

static kvf_status_t validate(const kvf_engine_t *e, const kvf_engine_seq_t *seqs, int n_seqs,
                             int *n_tokens_p, int *n_out_p)
{
    const kvf_model_config_t *c = &e->model->cfg;
    const kvf_kv_geometry_t *g = kvf_kvpool_geometry(e->pool);
    uint32_t num_blocks = kvf_kvpool_num_blocks(e->pool);
    int64_t n_tokens = 0, n_out = 0;
    if (n_seqs <= 0)
        return KVF_ERR_INVAL;
    for (int s = 0; s < n_seqs; s++) {
        const kvf_engine_seq_t *q = &seqs[s];
        if (q->n_tokens == 0 || !q->tokens || !q->block_ids) {
            kvf_log_error("engine: sequence %d of the batch has no tokens or no block table", s);
            return KVF_ERR_INVAL;
        }
        uint64_t end = (uint64_t)q->start_pos + q->n_tokens;
        if (end > (1u << 30)) {
            kvf_log_error("engine: sequence %d: position %llu too large", s,
                          (unsigned long long)end);
            return KVF_ERR_INVAL;
        }
        uint32_t need = kvf_kv_blocks_for_tokens(g, (uint32_t)end);
        if (q->n_blocks < need) {
            kvf_log_error("engine: sequence %d: %u blocks cover fewer than %llu positions", s,
                          q->n_blocks, (unsigned long long)end);
            return KVF_ERR_INVAL;
        }
        for (uint32_t b = 0; b < need; b++) {
            if (q->block_ids[b] >= num_blocks) {
                kvf_log_error("engine: sequence %d: block id %u out of range (%u blocks)", s,
                              q->block_ids[b], num_blocks);
                return KVF_ERR_INVAL;
            }
        }
        for (uint32_t i = 0; i < q->n_tokens; i++) {
            if (q->tokens[i] >= (uint32_t)c->vocab) {
                kvf_log_error("engine: sequence %d: token id %u not below vocab size %d", s,
                              q->tokens[i], c->vocab);
                return KVF_ERR_INVAL;
            }
        }
        n_tokens += q->n_tokens;
        if (q->logits)
            n_out += q->all_logits ? q->n_tokens : 1;
        else if (q->greedy_token)
            n_out += 1;
        if (n_tokens > (1 << 24)) {
            kvf_log_error("engine: batch of more than %d tokens", 1 << 24);
            return KVF_ERR_TOO_BIG;
        }
    }
    *n_tokens_p = (int)n_tokens;
    *n_out_p = (int)n_out;
    return KVF_OK;
}

/* y = x · wᵀ for weight index widx (KVF_WEIGHT_INDEX), in the backend's
 * own copy when it keeps one, else from the model's pointer w. */
static kvf_status_t project(const kvf_engine_t *e, float *y, const float *x, int widx,
                            const float *w, const float *bias, int m, int n, int k, int acc)
{
    const kvf_backend_ops_t *ops = e->be->ops;
    if (ops->matmul_bound)
        return ops->matmul_bound(e->be->ctx, y, x, widx, bias, m, n, k, acc);
    return ops->matmul(e->be->ctx, y, x, w, bias, m, n, k, acc);
}

#define CHECK(call)                                                                                \
    do {                                                                                           \
        kvf_status_t st_ = (call);                                                                 \
        if (st_ != KVF_OK) {                                                                       \
            kvf_log_error("engine: %s failed: %s", #call, kvf_status_str(st_));                    \
            return st_;                                                                            \
        }                                                                                          \
    } while (0)

/* The batch's token layout (position and sequence of each row, the block
 * tables), its embeddings into x and the cos/sin of its rotation angles. */
static void lay_out_batch(kvf_engine_t *e, const kvf_engine_seq_t *seqs, int n_seqs)
{
    const kvf_model_t *m = e->model;
    const int hidden = m->cfg.hidden, hd = m->cfg.head_dim, half = hd / 2;
    /* Gemma2's normalizer: sqrt(hidden) rounded to the activations' float */
    const float emb_scale = (float)sqrt((double)hidden);
    int t = 0;
    for (int s = 0; s < n_seqs; s++) {
        e->tables[s] = seqs[s].block_ids;
        for (uint32_t i = 0; i < seqs[s].n_tokens; i++, t++) {
            int32_t p = (int32_t)(seqs[s].start_pos + i);
            e->pos[t] = p;
            e->seq[t] = s;
            float *xt = e->x + (size_t)t * hidden;
            memcpy(xt, m->embed + (size_t)seqs[s].tokens[i] * hidden,
                   (size_t)hidden * sizeof(float));
            for (int d = 0; m->cfg.embed_scale && d < hidden; d++)
                xt[d] = xt[d] * emb_scale;
            float *cs = e->cos_sin + (size_t)t * hd;
            for (int d = 0; d < half; d++) {
                double a = (double)p * m->rope_inv_freq[d], sn, cn;
                kvf_det_sincos(a, &sn, &cn); /* the same bits on every CPU */
                cs[d] = (float)cn;
                cs[half + d] = (float)sn;
            }
        }
    }
}

/* x += in·wᵀ (in: n rows of k), or with a post-norm (Gemma2) x +=
 * rmsnorm(in·wᵀ) through h. */
static kvf_status_t residual(kvf_engine_t *e, const float *w, int widx, const float *in, int k,
                             const float *post_norm, int n)
{
    const kvf_model_config_t *c = &e->model->cfg;
    if (!post_norm)
        return project(e, e->x, in, widx, w, NULL, n, c->hidden, k, 1);
    CHECK(project(e, e->h, in, widx, w, NULL, n, c->hidden, k, 0));
    return e->be->ops->rmsnorm_add(e->be->ctx, e->x, e->h, post_norm, n, c->hidden,
                                   (float)c->rms_eps);
}

/* Decoder layer l over the batch's n rows of x, in place. */
static kvf_status_t forward_layer(kvf_engine_t *e, int l, int n, kvf_batch_layout_t *batch,
                                  const kvf_engine_hooks_t *hooks)
{
    const kvf_model_config_t *c = &e->model->cfg;
    const kvf_layer_weights_t *L = &e->model->layers[l];
    const kvf_backend_ops_t *ops = e->be->ops;
    void *bx = e->be->ctx;
    const int hidden = c->hidden, hd = c->head_dim;
    const float eps = (float)c->rms_eps;
    float *q = e->qkv, *k = e->qkv + e->q_dim, *v = k + e->kv_dim;
    CHECK(ops->rmsnorm(bx, e->h, e->x, L->attn_norm, n, hidden, eps));
    CHECK(project(e, e->qkv, e->h, KVF_WEIGHT_INDEX(l, KVF_WEIGHT_QKV), L->wqkv, L->bqkv, n,
                  e->qkv_dim, hidden, 0));
    if (L->q_norm) {
        CHECK(ops->head_rmsnorm(bx, q, e->qkv_dim, L->q_norm, n, c->n_heads, hd, eps));
        CHECK(ops->head_rmsnorm(bx, k, e->qkv_dim, L->k_norm, n, c->n_kv_heads, hd, eps));
    }
    CHECK(ops->rope(bx, q, e->qkv_dim, e->cos_sin, n, c->n_heads, hd));
    CHECK(ops->rope(bx, k, e->qkv_dim, e->cos_sin, n, c->n_kv_heads, hd));
    CHECK(ops->kv_write(bx, e->pool, l, k, v, e->qkv_dim, batch));
    if (hooks && hooks->on_layer_done) {
        if (ops->synchronize)
            CHECK(ops->synchronize(bx));
        hooks->on_layer_done(hooks->arg, l);
    }
    batch->window = kvf_model_layer_window(c, l);
    CHECK(ops->attention(bx, e->att, q, e->qkv_dim, e->pool, l, c->n_heads, batch));
    CHECK(residual(e, L->wo, KVF_WEIGHT_INDEX(l, KVF_WEIGHT_O), e->att, e->q_dim, L->post_attn_norm,
                   n));
    CHECK(ops->rmsnorm(bx, e->h, e->x, L->ffn_norm, n, hidden, eps));
    CHECK(project(e, e->gu, e->h, KVF_WEIGHT_INDEX(l, KVF_WEIGHT_GU), L->wgu, NULL, n, 2 * c->inter,
                  hidden, 0));
    if (c->act == KVF_ACT_GELU_TANH)
        CHECK(ops->geglu(bx, e->act, e->gu, n, c->inter));
    else
        CHECK(ops->swiglu(bx, e->act, e->gu, n, c->inter));
    CHECK(residual(e, L->wdown, KVF_WEIGHT_INDEX(l, KVF_WEIGHT_DOWN), e->act, c->inter,
                   L->post_ffn_norm, n));
    return KVF_OK;
}

/* The n_out rows of x that want logits into hout, normed, projected to
 * the vocabulary into logits. */
static kvf_status_t compute_logits(kvf_engine_t *e, const kvf_engine_seq_t *seqs, int n_seqs,
                                   int n_out)
{
    const kvf_model_t *m = e->model;
    const kvf_model_config_t *c = &m->cfg;
    const kvf_backend_ops_t *ops = e->be->ops;
    void *bx = e->be->ctx;
    const int hidden = c->hidden;
    int o = 0, t = 0;
    for (int s = 0; s < n_seqs; s++) {
        const kvf_engine_seq_t *q = &seqs[s];
        if (q->logits || q->greedy_token) {
            uint32_t first = q->logits && q->all_logits ? 0 : q->n_tokens - 1;
            for (uint32_t i = first; i < q->n_tokens; i++, o++)
                memcpy(e->hout + (size_t)o * hidden, e->x + (size_t)(t + (int)i) * hidden,
                       (size_t)hidden * sizeof(float));
        }
        t += (int)q->n_tokens;
    }
    CHECK(ops->rmsnorm(bx, e->hout, e->hout, m->final_norm, n_out, hidden, (float)c->rms_eps));
    CHECK(project(e, e->logits, e->hout, KVF_WEIGHT_INDEX(c->n_layers, 0), m->lm_head, NULL, n_out,
                  c->vocab, hidden, 0));
    if (ops->synchronize)
        CHECK(ops->synchronize(bx));
    if (c->final_softcap > 0) {
        /* host memory: only a backend without forward() gets here (the CPU's) */
        const float cap = (float)c->final_softcap;
        size_t count = (size_t)n_out * (size_t)c->vocab;
        for (size_t i = 0; i < count; i++)
            e->logits[i] = kvf_det_softcap(e->logits[i], cap);
    }
    return KVF_OK;
}

/* Each sequence's logits rows (all or the last) to its buffer, and the
 * argmax of its last row to its greedy token. */
static void deliver_logits(const kvf_engine_t *e, const kvf_engine_seq_t *seqs, int n_seqs)
{
    const int vocab = e->model->cfg.vocab;
    int o = 0;
    for (int s = 0; s < n_seqs; s++) {
        const kvf_engine_seq_t *q = &seqs[s];
        if (!q->logits && !q->greedy_token)
            continue;
        size_t rows = q->logits && q->all_logits ? q->n_tokens : 1;
        const float *rows_logits = e->logits + (size_t)o * vocab;
        if (q->logits)
            memcpy(q->logits, rows_logits, rows * (size_t)vocab * sizeof(float));
        if (q->greedy_token)
            *q->greedy_token = kvf_sample_argmax(rows_logits + (rows - 1) * (size_t)vocab, vocab);
        o += (int)rows;
    }
}

kvf_status_t kvf_engine_forward(kvf_engine_t *e, const kvf_engine_seq_t *seqs, int n_seqs,
                                const kvf_engine_hooks_t *hooks)
{
    const kvf_backend_ops_t *ops = e->be->ops;
    void *bx = e->be->ctx;
    int n, n_out;
    kvf_status_t st = validate(e, seqs, n_seqs, &n, &n_out);
    if (st != KVF_OK)
        return st;
    if (ops->forward)
        return ops->forward(bx, e->pool, seqs, n_seqs, hooks);
    st = reserve(e, n, n_seqs, n_out);
    if (st != KVF_OK) {
        kvf_log_error("engine: no memory for a batch of %d tokens", n);
        return st;
    }
    lay_out_batch(e, seqs, n_seqs);
    const kvf_model_config_t *c = &e->model->cfg;
    kvf_batch_layout_t batch = {.n_tokens = n,
                                .pos = e->pos,
                                .seq = e->seq,
                                .n_seqs = n_seqs,
                                .block_tables = e->tables,
                                .scale = kvf_model_attn_scale(c),
                                .softcap = (float)c->attn_softcap};
    for (int l = 0; l < e->model->cfg.n_layers; l++) {
        st = forward_layer(e, l, n, &batch, hooks);
        if (st != KVF_OK)
            return st;
    }
    if (n_out == 0)
        return ops->synchronize ? ops->synchronize(bx) : KVF_OK;
    st = compute_logits(e, seqs, n_seqs, n_out);
    if (st != KVF_OK)
        return st;
    deliver_logits(e, seqs, n_seqs);
    return KVF_OK;
}

/* The keys n_new tokens from start_pos read: min(p + 1, window) for each
 * position p (window 0: p + 1). */
static double keys_read(uint32_t start_pos, uint32_t n_new, int window)
{
    double first = (double)start_pos + 1, last = (double)start_pos + n_new;
    if (n_new == 0)
        return 0;
    if (window <= 0 || last <= window)
        return (first + last) * n_new / 2;
    if (first >= window)
        return (double)window * n_new;
    double below = (double)window - first; /* positions reading fewer than window keys */
    return (first + window - 1) * below / 2 + (double)window * (n_new - below);
}

double kvf_engine_flops(const kvf_model_config_t *c, uint32_t start_pos, uint32_t n_new,
                        uint32_t n_logits)
{
    double q_dim = (double)c->n_heads * c->head_dim, kv_dim = (double)c->n_kv_heads * c->head_dim;
    double per_token_layer = 2.0 * c->hidden * (q_dim + 2 * kv_dim) /* qkv */
                             + 2.0 * q_dim * c->hidden              /* o */
                             + 2.0 * 3.0 * c->hidden * c->inter;    /* gate, up, down */
    /* attention: each new token at position p reads p + 1 keys and values,
     * at most the window's on a sliding-window layer: 2 flops per element
     * for q·k and for p·v, per query head. */
    double attn = 0;
    for (int l = 0; l < c->n_layers; l++)
        attn += 4.0 * q_dim * keys_read(start_pos, n_new, kvf_model_layer_window(c, l));
    return c->n_layers * per_token_layer * n_new + attn +
           2.0 * (double)c->hidden * c->vocab * n_logits;
}
