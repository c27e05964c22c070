/* The CPU backend: the ops table over the kernels of cpu_kernels.h (one
 * instruction set, chosen at creation), split across a thread pool. Work
 * is split by output columns (matmul), rows (norms, swiglu) and query
 * tiles (attention), never inside a sum, so the thread count changes no
 * bit of a result. See kvf/backend.h and docs/numerics.md. */
#include "kvf/log.h"

#include "cpu_backend_internal.h"

#include <fenv.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Attention keeps four block-pointer lists in float scratch, 2 floats each. */
_Static_assert(sizeof(float *) <= 2 * sizeof(float), "pointer wider than two floats");

/* Query tokens per attention work item. */
#define ATTN_TILE_TOKENS 16

/* ---- matmul --------------------------------------------------------- */

typedef struct {
    const kvf_cpu_kernels_t *k;
    kvf_cpu_gemm_t g;
    int panels_per_task;
    float *const *scratch;
} matmul_job_t;

static void matmul_task(void *arg, int task, int thread)
{
    matmul_job_t *j = arg;
    int p0 = task * j->panels_per_task;
    int p1 = p0 + j->panels_per_task > j->g.w->n_panels ? j->g.w->n_panels
                                                        : p0 + j->panels_per_task;
    j->k->gemm(&j->g, p0, p1, j->scratch[thread]);
}

static kvf_status_t run_matmul(kvf_cpu_ctx_t *cx, float *y, const float *x,
                               const kvf_cpu_packed_t *pw, const float *bias, int m,
                               int accumulate)
{
    size_t need = KVF_CPU_GEMM_SCRATCH_FLOATS(pw->k);
    if (need > cx->gemm_scratch_floats) {
        for (int i = 0; i < cx->n_threads; i++) {
            free(cx->gemm_scratch[i]);
            cx->gemm_scratch[i] = aligned_alloc(64, need * sizeof(float));
            if (!cx->gemm_scratch[i]) {
                cx->gemm_scratch_floats = 0;
                return KVF_ERR_NOMEM;
            }
        }
        cx->gemm_scratch_floats = need;
    }
    matmul_job_t j = {.k = cx->k,
                      .scratch = cx->gemm_scratch,
                      .g = {.y = y, .x = x, .bias = bias, .w = pw, .m = m,
                            .accumulate = accumulate}};
    if (m <= cx->k->small_m) {
        j.panels_per_task = cx->k->small_panels_per_task;
    } else {
        /* About four tasks a thread, in whole pairs of panels. */
        int per = (pw->n_panels + 4 * cx->n_threads - 1) / (4 * cx->n_threads);
        j.panels_per_task = (per + 1) & ~1;
    }
    int tasks = (pw->n_panels + j.panels_per_task - 1) / j.panels_per_task;
    kvf_threadpool_run(cx->pool, matmul_task, &j, tasks);
    return KVF_OK;
}

static kvf_status_t cpu_matmul(void *ctx, float *y, const float *x, const float *w,
                               const float *bias, int m, int n, int k, int accumulate)
{
    kvf_cpu_ctx_t *cx = ctx;
    if (m <= 0 || n <= 0 || k <= 0)
        return m == 0 ? KVF_OK : KVF_ERR_INVAL;
    /* A matrix given by pointer (a test's or a tool's; the engine projects
     * through matmul_bound): the same kernels over a per-call f32 pack. */
    kvf_cpu_packed_free(&cx->adhoc);
    kvf_status_t st = kvf_cpu_pack(&cx->adhoc, w, n, k, KVF_DTYPE_F32);
    if (st != KVF_OK)
        return st;
    const kvf_cpu_packed_t *pw = &cx->adhoc;
    return run_matmul(cx, y, x, pw, bias, m, accumulate);
}

static kvf_status_t cpu_matmul_bound(void *ctx, float *y, const float *x, int weight,
                                     const float *bias, int m, int n, int k, int accumulate)
{
    kvf_cpu_ctx_t *cx = ctx;
    if (weight < 0 || weight >= cx->n_packed || m < 0 || cx->packed[weight].n != n ||
        cx->packed[weight].k != k)
        return KVF_ERR_INVAL;
    if (m == 0)
        return KVF_OK;
    return run_matmul(cx, y, x, &cx->packed[weight], bias, m, accumulate);
}

/* ---- binding a model ------------------------------------------------ */

static void unbind(kvf_cpu_ctx_t *cx)
{
    for (int i = 0; i < cx->n_packed; i++)
        kvf_cpu_packed_free(&cx->packed[i]);
    free(cx->packed);
    cx->packed = NULL;
    cx->n_packed = 0;
    cx->model = NULL;
    cx->weight_bytes = 0;
    cx->wdtype = KVF_DTYPE_F32;
}

typedef struct {
    kvf_cpu_ctx_t *cx;
    const float *const *w;
    const int *n, *k;
    kvf_dtype_t dtype;
    kvf_status_t *st; /* (tasks) */
} pack_job_t;

/* Packs one matrix in j->dtype, or in f32 when its values are not all
 * exact in that type (a matrix kept at higher precision in the files). */
static void pack_task(void *arg, int task, int thread)
{
    (void)thread;
    pack_job_t *j = arg;
    kvf_cpu_packed_t *p = &j->cx->packed[task];
    j->st[task] = kvf_cpu_pack(p, j->w[task], j->n[task], j->k[task], j->dtype);
    if (j->st[task] == KVF_ERR_INVAL && j->dtype != KVF_DTYPE_F32)
        j->st[task] = kvf_cpu_pack(p, j->w[task], j->n[task], j->k[task], KVF_DTYPE_F32);
}

static kvf_status_t pack_all(kvf_cpu_ctx_t *cx, const float **w, const int *n, const int *k, int count,
                             kvf_dtype_t dtype)
{
    kvf_status_t *st = calloc((size_t)count, sizeof(*st));
    cx->packed = calloc((size_t)count, sizeof(*cx->packed));
    if (!st || !cx->packed) {
        free(st);
        free(cx->packed);
        cx->packed = NULL;
        return KVF_ERR_NOMEM;
    }
    cx->n_packed = count;
    pack_job_t j = {cx, w, n, k, dtype, st};
    kvf_threadpool_run(cx->pool, pack_task, &j, count);
    kvf_status_t worst = KVF_OK;
    for (int i = 0; i < count; i++)
        if (st[i] != KVF_OK)
            worst = st[i];
    free(st);
    if (worst != KVF_OK) {
        unbind(cx);
        return worst;
    }
    int widened = 0;
    for (int i = 0; i < count; i++) {
        cx->weight_bytes += kvf_cpu_packed_bytes(&cx->packed[i]);
        widened += cx->packed[i].dtype != dtype;
    }
    if (widened)
        kvf_log_warn("cpu backend: %d of %d matrices are not exact in %s; those are held in f32",
                     widened, count, kvf_dtype_name(dtype));
    cx->wdtype = widened == count ? KVF_DTYPE_F32 : dtype;
    return KVF_OK;
}

static kvf_status_t cpu_bind_model(void *ctx, const kvf_model_t *model)
{
    kvf_cpu_ctx_t *cx = ctx;
    if (cx->model == model)
        return KVF_OK;
    if (cx->model) {
        /* Engines on this backend project through the bound model's
         * panels by index: another model would change them under them. */
        kvf_log_error("cpu backend: already bound to model %s; one backend serves one model",
                      kvf_model_fingerprint(cx->model));
        return KVF_ERR_MISMATCH;
    }
    if (model->matrices_dropped || !model->lm_head) {
        kvf_log_error("cpu backend: the model's host weights were dropped");
        return KVF_ERR_INVAL;
    }
    const kvf_model_config_t *c = &model->cfg;
    int q_dim = c->n_heads * c->head_dim, kv_dim = c->n_kv_heads * c->head_dim;
    int count = 4 * c->n_layers + 1;
    const float **w = calloc((size_t)count, sizeof(*w));
    int *n = calloc((size_t)count, sizeof(*n)), *k = calloc((size_t)count, sizeof(*k));
    kvf_status_t st = KVF_ERR_NOMEM;
    if (!w || !n || !k)
        goto fail_lists;
    for (int l = 0; l < c->n_layers; l++) {
        const kvf_layer_weights_t *L = &model->layers[l];
        const float *lw[4] = {L->wqkv, L->wo, L->wgu, L->wdown};
        int ln[4] = {q_dim + 2 * kv_dim, c->hidden, 2 * c->inter, c->hidden};
        int lk[4] = {c->hidden, q_dim, c->hidden, c->inter};
        for (int i = 0; i < 4; i++) {
            w[4 * l + i] = lw[i];
            n[4 * l + i] = ln[i];
            k[4 * l + i] = lk[i];
        }
    }
    w[count - 1] = model->lm_head;
    n[count - 1] = c->vocab;
    k[count - 1] = c->hidden;
    kvf_dtype_t dtype = KVF_DTYPE_F32;
    if (cx->cfg.weights == KVF_CPU_WEIGHTS_NATIVE &&
        (model->matrix_dtype == KVF_DTYPE_BF16 || model->matrix_dtype == KVF_DTYPE_F16))
        dtype = model->matrix_dtype;
    st = pack_all(cx, w, n, k, count, dtype);
    if (st != KVF_OK) {
        kvf_log_error("cpu backend: repacking the weights: %s", kvf_status_str(st));
        goto fail_lists;
    }
    cx->model = model;
fail_lists:
    free(w);
    free(n);
    free(k);
    return st;
}

/* ---- KV write and attention ----------------------------------------- */

/* Each (token, kv head) row is encoded once, in the pool's format
 * (kvf/kv_format.h), with its scale for fp8/int8. */
static kvf_status_t cpu_kv_write(void *ctx, kvf_kvpool_t *pool, int layer, const float *k,
                                 const float *v, int ld, const kvf_batch_layout_t *b)
{
    (void)ctx;
    const kvf_kv_geometry_t *g = kvf_kvpool_geometry(pool);
    const kvf_kv_dtype_t dt = g->dtype;
    const size_t row_bytes = (size_t)g->head_dim * kvf_kv_elem_bytes(dt);
    const bool scaled = kvf_kv_scaled(dt);
    for (int t = 0; t < b->n_tokens; t++) {
        int pos = b->pos[t];
        uint32_t block = b->block_tables[b->seq[t]][pos / g->block_size];
        int slot = pos % g->block_size;
        for (int h = 0; h < g->n_kv_heads; h++) {
            for (int kv = 0; kv < 2; kv++) {
                const float *src = (kv ? v : k) + (size_t)t * (size_t)ld + (size_t)h * g->head_dim;
                char *dst = (char *)kvf_kvpool_head_data(pool, block, layer, kv, h) +
                            (size_t)slot * row_bytes;
                float *sc = scaled ? kvf_kvpool_head_scales(pool, block, layer, kv, h) + slot
                                   : NULL;
                kvf_kv_encode_row(dt, src, g->head_dim, dst, sc);
            }
        }
    }
    return KVF_OK;
}

typedef struct {
    kvf_cpu_ctx_t *cx;
    float *out;
    const float *q;
    int ld_q;
    const kvf_kvpool_t *pool;
    int layer, n_heads, group, n_tiles;
    bool heads; /* a task is a tile's every kv head (attention_heads) */
    size_t kfloats; /* the kernel's scratch floats; the block pointer lists follow */
    const kvf_batch_layout_t *b;
} attn_job_t;

/* Tile `tile`'s work item for kv head kvh into *t, its block pointer lists
 * (4 x n_blocks) at ptrs. */
static void make_tile(const attn_job_t *j, int tile, int kvh, const void **ptrs,
                      kvf_cpu_attn_tile_t *t)
{
    const kvf_kv_geometry_t *g = kvf_kvpool_geometry(j->pool);
    int t0 = j->cx->tiles[2 * tile], nt = j->cx->tiles[2 * tile + 1];
    int max_pos = 0;
    for (int i = 0; i < nt; i++)
        max_pos = j->b->pos[t0 + i] > max_pos ? j->b->pos[t0 + i] : max_pos;
    int n_blocks = max_pos / g->block_size + 1;
    const void **keys = ptrs, **values = keys + n_blocks;
    const float **kscales = (const float **)(values + n_blocks);
    const float **vscales = kscales + n_blocks;
    const uint32_t *bt = j->b->block_tables[j->b->seq[t0]];
    for (int b = 0; b < n_blocks; b++) {
        keys[b] = kvf_kvpool_head_data(j->pool, bt[b], j->layer, 0, kvh);
        values[b] = kvf_kvpool_head_data(j->pool, bt[b], j->layer, 1, kvh);
        kscales[b] = kvf_kvpool_head_scales(j->pool, bt[b], j->layer, 0, kvh);
        vscales[b] = kvf_kvpool_head_scales(j->pool, bt[b], j->layer, 1, kvh);
    }
    int hd = g->head_dim;
    *t = (kvf_cpu_attn_tile_t){
        .n_tok = nt,
        .pos = j->b->pos + t0,
        .q = j->q + (size_t)t0 * (size_t)j->ld_q + (size_t)kvh * j->group * hd,
        .ld_q = j->ld_q,
        .out = j->out + (size_t)t0 * (size_t)j->n_heads * hd + (size_t)kvh * j->group * hd,
        .ld_out = j->n_heads * hd,
        .group = j->group,
        .head_dim = hd,
        .block_size = g->block_size,
        .dtype = g->dtype,
        .keys = keys,
        .values = values,
        .kscales = kscales,
        .vscales = vscales,
        .scale = j->b->scale > 0 ? j->b->scale : (float)(1.0 / sqrt((double)hd)),
        .softcap = j->b->softcap,
        .window = j->b->window,
    };
}

static void attention_task(void *arg, int task, int thread)
{
    attn_job_t *j = arg;
    const kvf_kv_geometry_t *g = kvf_kvpool_geometry(j->pool);
    float *scratch = j->cx->scratch[thread];
    const void **ptrs = (const void **)(void *)(scratch + j->kfloats);
    if (j->heads) {
        const int tile = task, t0 = j->cx->tiles[2 * tile];
        const size_t list = 4 * ((size_t)j->b->pos[t0] / g->block_size + 1);
        kvf_cpu_attn_tile_t t[KVF_CPU_MAX_KV_HEADS];
        for (int h = 0; h < g->n_kv_heads; h++)
            make_tile(j, tile, h, ptrs + (size_t)h * list, &t[h]);
        j->cx->k->attention_heads(t, g->n_kv_heads, scratch);
        return;
    }
    kvf_cpu_attn_tile_t t;
    make_tile(j, task % j->n_tiles, task / j->n_tiles, ptrs, &t);
    j->cx->k->attention(&t, scratch);
}

static kvf_status_t cpu_attention(void *ctx, float *out, const float *q, int ld_q,
                                  const kvf_kvpool_t *pool, int layer, int n_heads,
                                  const kvf_batch_layout_t *b)
{
    kvf_cpu_ctx_t *cx = ctx;
    const kvf_kv_geometry_t *g = kvf_kvpool_geometry(pool);
    if (n_heads % g->n_kv_heads != 0)
        return KVF_ERR_INVAL;
    int group = n_heads / g->n_kv_heads;
    /* Tiles: runs of up to ATTN_TILE_TOKENS consecutive tokens of one sequence. */
    if (cx->cap_tiles < b->n_tokens) {
        int *grown = realloc(cx->tiles, (size_t)b->n_tokens * 2 * sizeof(int));
        if (!grown)
            return KVF_ERR_NOMEM;
        cx->tiles = grown;
        cx->cap_tiles = b->n_tokens;
    }
    int n_tiles = 0, max_pos = 0;
    bool one_token = true;
    for (int t = 0; t < b->n_tokens;) {
        int e = t + 1;
        while (e < b->n_tokens && e - t < ATTN_TILE_TOKENS && b->seq[e] == b->seq[t])
            e++;
        cx->tiles[2 * n_tiles] = t;
        cx->tiles[2 * n_tiles + 1] = e - t;
        one_token &= e - t == 1;
        n_tiles++;
        t = e;
    }
    for (int t = 0; t < b->n_tokens; t++)
        max_pos = b->pos[t] > max_pos ? b->pos[t] : max_pos;
    /* A decode step of enough sequences to keep every thread busy takes
     * each token's kv heads together: its blocks are then read whole, in
     * address order (attention_heads); otherwise (prefill tiles, few
     * sequences) a task is one tile's one kv head. The same bits either
     * way. */
    const bool heads = one_token && g->n_kv_heads > 1 && g->n_kv_heads <= KVF_CPU_MAX_KV_HEADS &&
                       n_tiles >= 2 * cx->n_threads;
    const int rows = heads ? g->n_kv_heads * group : ATTN_TILE_TOKENS * group;
    /* Scratch: the tile kernel's floats plus four block pointer lists a
     * kv head the task takes. */
    size_t kfloats = (kvf_cpu_attn_scratch_floats(g->head_dim, rows) + 15) & ~(size_t)15;
    size_t need = kfloats + 8 * (size_t)(heads ? g->n_kv_heads : 1) *
                                ((size_t)max_pos / g->block_size + 1); /* 4 pointers of 2 floats */
    if (need > cx->scratch_floats) {
        for (int i = 0; i < cx->n_threads; i++) {
            free(cx->scratch[i]);
            cx->scratch[i] = aligned_alloc(64, ((need * sizeof(float)) + 63) & ~(size_t)63);
            if (!cx->scratch[i]) {
                for (int k = 0; k <= i; k++) {
                    free(cx->scratch[k]);
                    cx->scratch[k] = NULL;
                }
                for (int k = i + 1; k < cx->n_threads; k++) {
                    free(cx->scratch[k]);
                    cx->scratch[k] = NULL;
                }
                cx->scratch_floats = 0;
                return KVF_ERR_NOMEM;
            }
        }
        cx->scratch_floats = need;
    }
    attn_job_t j = {cx, out, q, ld_q, pool, layer, n_heads, group, n_tiles, heads, kfloats, b};
    kvf_threadpool_run(cx->pool, attention_task, &j, heads ? n_tiles : n_tiles * g->n_kv_heads);
    return KVF_OK;
}

/* ---- lifecycle ------------------------------------------------------ */

static void cpu_destroy(void *ctx)
{
    kvf_cpu_ctx_t *cx = ctx;
    if (!cx)
        return;
    kvf_threadpool_destroy(cx->pool);
    for (int i = 0; cx->scratch && i < cx->n_threads; i++)
        free(cx->scratch[i]);
    free(cx->scratch);
    for (int i = 0; cx->gemm_scratch && i < cx->n_threads; i++)
        free(cx->gemm_scratch[i]);
    free(cx->gemm_scratch);
    free(cx->tiles);
    unbind(cx);
    kvf_cpu_packed_free(&cx->adhoc);
    free(cx);
}

static const kvf_backend_ops_t cpu_ops = {
    .name = "cpu",
    .matmul = cpu_matmul,
    .rmsnorm = kvf_cpu_op_rmsnorm,
    .head_rmsnorm = kvf_cpu_op_head_rmsnorm,
    .rope = kvf_cpu_op_rope,
    .kv_write = cpu_kv_write,
    .attention = cpu_attention,
    .swiglu = kvf_cpu_op_swiglu,
    .geglu = kvf_cpu_op_geglu,
    .rmsnorm_add = kvf_cpu_op_rmsnorm_add,
    .bind_model = cpu_bind_model,
    .matmul_bound = cpu_matmul_bound,
    .synchronize = NULL,
    .destroy = cpu_destroy,
};

kvf_cpu_config_t kvf_cpu_config_default(void)
{
    kvf_cpu_config_t c = {.n_threads = 0, .isa = KVF_CPU_ISA_AUTO,
                          .weights = KVF_CPU_WEIGHTS_NATIVE};
    return c;
}

kvf_status_t kvf_cpu_weights_parse(const char *name, kvf_cpu_weights_t *w_p)
{
    if (name && !strcmp(name, "native")) {
        *w_p = KVF_CPU_WEIGHTS_NATIVE;
        return KVF_OK;
    }
    if (name && !strcmp(name, "f32")) {
        *w_p = KVF_CPU_WEIGHTS_F32;
        return KVF_OK;
    }
    kvf_log_error("unknown --cpu-dtype '%s' (native or f32)", name ? name : "");
    return KVF_ERR_INVAL;
}

/* The canonical numerics assume IEEE defaults: round to nearest even, no
 * flush of subnormals to zero (a library built with -ffast-math can turn
 * that on for the process). */
static kvf_status_t check_fp_environment(void)
{
    if (fegetround() != FE_TONEAREST) {
        kvf_log_error("cpu backend: the floating-point rounding mode is not round-to-nearest");
        return KVF_ERR_UNSUPPORTED;
    }
#if defined(__x86_64__) && defined(__GNUC__)
    unsigned csr = __builtin_ia32_stmxcsr();
    if (csr & ((1u << 15) | (1u << 6))) {
        kvf_log_error("cpu backend: flush-to-zero or denormals-are-zero is on (MXCSR %#x)", csr);
        return KVF_ERR_UNSUPPORTED;
    }
#elif defined(__aarch64__)
    uint64_t fpcr;
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    if (fpcr & (1u << 24)) {
        kvf_log_error("cpu backend: flush-to-zero is on (FPCR %#llx)", (unsigned long long)fpcr);
        return KVF_ERR_UNSUPPORTED;
    }
#endif
    return KVF_OK;
}

kvf_status_t kvf_backend_cpu_create_cfg(const kvf_cpu_config_t *cfg, kvf_backend_t *be_p)
{
    kvf_cpu_isa_t isa;
    kvf_status_t st = check_fp_environment();
    if (st != KVF_OK)
        return st;
    st = kvf_cpu_isa_resolve(cfg->isa, &isa);
    if (st != KVF_OK)
        return st;
    kvf_cpu_ctx_t *cx = calloc(1, sizeof(*cx));
    if (!cx)
        return KVF_ERR_NOMEM;
    cx->cfg = *cfg;
    cx->cfg.isa = isa;
    cx->k = kvf_cpu_kernels(isa);
    cx->wdtype = KVF_DTYPE_F32;
    st = kvf_threadpool_create(cfg->n_threads, &cx->pool);
    if (st != KVF_OK) {
        free(cx);
        return st;
    }
    cx->n_threads = kvf_threadpool_size(cx->pool);
    cx->scratch = calloc((size_t)cx->n_threads, sizeof(*cx->scratch));
    cx->gemm_scratch = calloc((size_t)cx->n_threads, sizeof(*cx->gemm_scratch));
    if (!cx->scratch || !cx->gemm_scratch) {
        cpu_destroy(cx);
        return KVF_ERR_NOMEM;
    }
    be_p->ops = &cpu_ops;
    be_p->ctx = cx;
    be_p->kv_dtypes = KVF_KV_DTYPES_ALL;
    return KVF_OK;
}

kvf_status_t kvf_backend_cpu_create(int n_threads, kvf_backend_t *be_p)
{
    kvf_cpu_config_t c = kvf_cpu_config_default();
    c.n_threads = n_threads;
    return kvf_backend_cpu_create_cfg(&c, be_p);
}

int kvf_backend_cpu_threads(const kvf_backend_t *be)
{
    if (be->ops != &cpu_ops)
        return 0;
    return ((const kvf_cpu_ctx_t *)be->ctx)->n_threads;
}

kvf_cpu_isa_t kvf_backend_cpu_isa(const kvf_backend_t *be)
{
    if (be->ops != &cpu_ops)
        return KVF_CPU_ISA_AUTO;
    return ((const kvf_cpu_ctx_t *)be->ctx)->cfg.isa;
}

kvf_dtype_t kvf_backend_cpu_weights_dtype(const kvf_backend_t *be)
{
    if (be->ops != &cpu_ops)
        return KVF_DTYPE_F32;
    return ((const kvf_cpu_ctx_t *)be->ctx)->wdtype;
}

size_t kvf_backend_cpu_weight_bytes(const kvf_backend_t *be)
{
    if (be->ops != &cpu_ops)
        return 0;
    return ((const kvf_cpu_ctx_t *)be->ctx)->weight_bytes;
}

void kvf_backend_destroy(kvf_backend_t *be)
{
    if (be && be->ops && be->ops->destroy)
        be->ops->destroy(be->ctx);
    if (be) {
        be->ops = NULL;
        be->ctx = NULL;
    }
}
