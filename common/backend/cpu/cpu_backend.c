/* The CPU backend: ops table over OpenBLAS and the kernels of
 * cpu_kernels.h, split across a thread pool. See kvf/backend.h. */
#include "kvf/backend.h"
#include "kvf/log.h"
#include "kvf/threadpool.h"

#include "cpu_kernels.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Rows of a weight per gemv task: small enough to balance threads, large
 * enough that a task streams a few hundred KB. */
#define GEMV_ROWS_PER_TASK 64
/* Attention keeps two block-pointer lists in float scratch, 2 floats each. */
_Static_assert(sizeof(float *) <= 2 * sizeof(float), "pointer wider than two floats");

/* Query tokens per attention work item. */
#define ATTN_TILE_TOKENS 16

typedef struct {
    kvf_threadpool_t *pool;
    int n_threads;
    bool avx512;
    float **scratch;       /* (n_threads) per-thread attention scratch */
    size_t scratch_floats; /* capacity of each */
    /* attention work list, rebuilt per call */
    int *tiles;            /* (cap_tiles, 2): first token, token count */
    int cap_tiles;
} cpu_ctx_t;

/* ---- matmul --------------------------------------------------------- */

typedef struct {
    cpu_ctx_t *cx;
    float *y;
    const float *x, *w, *bias;
    int m, n, k, accumulate;
    int chunk; /* rows of w (columns of y) per task */
} matmul_job_t;

static void gemv_task(void *arg, int task, int thread)
{
    (void)thread;
    matmul_job_t *j = arg;
    int r0 = task * j->chunk, r1 = r0 + j->chunk > j->n ? j->n : r0 + j->chunk;
    if (j->cx->avx512)
        kvf_cpu_gemv_rows_avx512(j->y, j->x, j->w, j->bias, j->m, j->n, j->k, r0, r1,
                                 j->accumulate);
    else
        kvf_cpu_gemv_rows(j->y, j->x, j->w, j->bias, j->m, j->n, j->k, r0, r1, j->accumulate);
}

static void sgemm_task(void *arg, int task, int thread)
{
    (void)thread;
    matmul_job_t *j = arg;
    int c0 = task * j->chunk, c1 = c0 + j->chunk > j->n ? j->n : c0 + j->chunk;
    int nc = c1 - c0;
    float beta = j->accumulate ? 1.0f : 0.0f;
    if (j->bias) {
        for (int i = 0; i < j->m; i++) {
            float *yr = j->y + (size_t)i * (size_t)j->n + c0;
            for (int c = 0; c < nc; c++)
                yr[c] = (j->accumulate ? yr[c] : 0.0f) + j->bias[c0 + c];
        }
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->m, nc, j->k, 1.0f, j->x, j->k,
                j->w + (size_t)c0 * (size_t)j->k, j->k, beta, j->y + c0, j->n);
}

static kvf_status_t cpu_matmul(void *ctx, float *y, const float *x, const float *w,
                               const float *bias, int m, int n, int k, int accumulate)
{
    cpu_ctx_t *cx = ctx;
    if (m <= 0 || n <= 0 || k <= 0)
        return m == 0 ? KVF_OK : KVF_ERR_INVAL;
    matmul_job_t j = {cx, y, x, w, bias, m, n, k, accumulate, 0};
    if (m <= KVF_CPU_GEMV_MAX_M) {
        j.chunk = GEMV_ROWS_PER_TASK;
        kvf_threadpool_run(cx->pool, gemv_task, &j, (n + j.chunk - 1) / j.chunk);
    } else {
        /* One column range per thread, multiples of 16 columns. */
        int parts = cx->n_threads;
        j.chunk = ((n + parts - 1) / parts + 15) & ~15;
        kvf_threadpool_run(cx->pool, sgemm_task, &j, (n + j.chunk - 1) / j.chunk);
    }
    return KVF_OK;
}

/* ---- row-wise ops --------------------------------------------------- */

typedef struct {
    cpu_ctx_t *cx;
    float *y;
    const float *x, *w;
    const float *cos_sin;
    int m, dim, ld, n_heads, head_dim, rows_per_task;
    float eps;
} rows_job_t;

static void rmsnorm_task(void *arg, int task, int thread)
{
    (void)thread;
    rows_job_t *j = arg;
    int i0 = task * j->rows_per_task, i1 = i0 + j->rows_per_task > j->m ? j->m : i0 + j->rows_per_task;
    for (int i = i0; i < i1; i++) {
        const float *x = j->x + (size_t)i * (size_t)j->dim;
        float *y = j->y + (size_t)i * (size_t)j->dim;
        double ss = 0;
        for (int d = 0; d < j->dim; d++)
            ss += (double)x[d] * x[d];
        float inv = (float)(1.0 / sqrt(ss / j->dim + j->eps));
        for (int d = 0; d < j->dim; d++)
            y[d] = j->w[d] * (x[d] * inv);
    }
}

static int rows_per_task(int m, int n_threads)
{
    int per = (m + 4 * n_threads - 1) / (4 * n_threads);
    return per < 1 ? 1 : per;
}

static kvf_status_t cpu_rmsnorm(void *ctx, float *y, const float *x, const float *w, int m,
                                int dim, float eps)
{
    cpu_ctx_t *cx = ctx;
    rows_job_t j = {.cx = cx, .y = y, .x = x, .w = w, .m = m, .dim = dim, .eps = eps};
    j.rows_per_task = rows_per_task(m, cx->n_threads);
    kvf_threadpool_run(cx->pool, rmsnorm_task, &j, (m + j.rows_per_task - 1) / j.rows_per_task);
    return KVF_OK;
}

static void rope_task(void *arg, int task, int thread)
{
    (void)thread;
    rows_job_t *j = arg;
    int half = j->head_dim / 2;
    int i0 = task * j->rows_per_task, i1 = i0 + j->rows_per_task > j->m ? j->m : i0 + j->rows_per_task;
    for (int i = i0; i < i1; i++) {
        const float *cs = j->cos_sin + (size_t)i * (size_t)j->head_dim;
        for (int h = 0; h < j->n_heads; h++) {
            float *v = j->y + (size_t)i * (size_t)j->ld + (size_t)h * (size_t)j->head_dim;
            for (int d = 0; d < half; d++) {
                float x0 = v[d], x1 = v[d + half], c = cs[d], s = cs[half + d];
                v[d] = x0 * c - x1 * s;
                v[d + half] = x1 * c + x0 * s;
            }
        }
    }
}

static kvf_status_t cpu_rope(void *ctx, float *x, int ld, const float *cos_sin, int m,
                             int n_heads, int head_dim)
{
    cpu_ctx_t *cx = ctx;
    rows_job_t j = {.cx = cx, .y = x, .cos_sin = cos_sin, .m = m, .ld = ld,
                    .n_heads = n_heads, .head_dim = head_dim};
    j.rows_per_task = rows_per_task(m, cx->n_threads);
    kvf_threadpool_run(cx->pool, rope_task, &j, (m + j.rows_per_task - 1) / j.rows_per_task);
    return KVF_OK;
}

static void swiglu_task(void *arg, int task, int thread)
{
    (void)thread;
    rows_job_t *j = arg;
    int i0 = task * j->rows_per_task, i1 = i0 + j->rows_per_task > j->m ? j->m : i0 + j->rows_per_task;
    for (int i = i0; i < i1; i++) {
        const float *gu = j->x + (size_t)i * 2 * (size_t)j->dim;
        float *out = j->y + (size_t)i * (size_t)j->dim;
        if (j->cx->avx512)
            kvf_cpu_swiglu_row_avx512(out, gu, gu + j->dim, j->dim);
        else
            kvf_cpu_swiglu_row(out, gu, gu + j->dim, j->dim);
    }
}

static kvf_status_t cpu_swiglu(void *ctx, float *out, const float *gu, int m, int n)
{
    cpu_ctx_t *cx = ctx;
    rows_job_t j = {.cx = cx, .y = out, .x = gu, .m = m, .dim = n};
    j.rows_per_task = rows_per_task(m, cx->n_threads);
    kvf_threadpool_run(cx->pool, swiglu_task, &j, (m + j.rows_per_task - 1) / j.rows_per_task);
    return KVF_OK;
}

/* ---- KV write and attention ----------------------------------------- */

static kvf_status_t cpu_kv_write(void *ctx, kvf_kvpool_t *pool, int layer, const float *k,
                                 const float *v, int ld, const kvf_batch_layout_t *b)
{
    (void)ctx;
    const kvf_kv_geometry_t *g = kvf_kvpool_geometry(pool);
    size_t row_bytes = (size_t)g->head_dim * sizeof(float);
    for (int t = 0; t < b->n_tokens; t++) {
        int pos = b->pos[t];
        uint32_t block = b->block_tables[b->seq[t]][pos / g->block_size];
        int slot = pos % g->block_size;
        for (int h = 0; h < g->n_kv_heads; h++) {
            float *kd = kvf_kvpool_head(pool, block, layer, 0, h) + (size_t)slot * g->head_dim;
            float *vd = kvf_kvpool_head(pool, block, layer, 1, h) + (size_t)slot * g->head_dim;
            memcpy(kd, k + (size_t)t * (size_t)ld + (size_t)h * g->head_dim, row_bytes);
            memcpy(vd, v + (size_t)t * (size_t)ld + (size_t)h * g->head_dim, row_bytes);
        }
    }
    return KVF_OK;
}

typedef struct {
    cpu_ctx_t *cx;
    float *out;
    const float *q;
    int ld_q;
    const kvf_kvpool_t *pool;
    int layer, n_heads, group, n_tiles;
    const kvf_batch_layout_t *b;
} attn_job_t;

static void attention_task(void *arg, int task, int thread)
{
    attn_job_t *j = arg;
    const kvf_kv_geometry_t *g = kvf_kvpool_geometry(j->pool);
    int tile = task % j->n_tiles, kvh = task / j->n_tiles;
    int t0 = j->cx->tiles[2 * tile], nt = j->cx->tiles[2 * tile + 1];
    int seq = j->b->seq[t0];
    int max_pos = 0;
    for (int i = 0; i < nt; i++)
        max_pos = j->b->pos[t0 + i] > max_pos ? j->b->pos[t0 + i] : max_pos;
    int n_blocks = max_pos / g->block_size + 1;
    /* Block pointer lists live at the end of the thread's scratch. */
    float *scratch = j->cx->scratch[thread];
    size_t kfloats = (kvf_cpu_attn_scratch_floats(nt, j->group, g->head_dim, g->block_size) + 15) &
                     ~(size_t)15;
    const float **keys = (const float **)(void *)(scratch + kfloats);
    const float **values = keys + n_blocks;
    const uint32_t *bt = j->b->block_tables[seq];
    for (int b = 0; b < n_blocks; b++) {
        keys[b] = kvf_kvpool_head(j->pool, bt[b], j->layer, 0, kvh);
        values[b] = kvf_kvpool_head(j->pool, bt[b], j->layer, 1, kvh);
    }
    int hd = g->head_dim;
    kvf_cpu_attn_tile_t t = {
        .n_tok = nt,
        .pos = j->b->pos + t0,
        .q = j->q + (size_t)t0 * (size_t)j->ld_q + (size_t)kvh * j->group * hd,
        .ld_q = j->ld_q,
        .out = j->out + (size_t)t0 * (size_t)j->n_heads * hd + (size_t)kvh * j->group * hd,
        .ld_out = j->n_heads * hd,
        .group = j->group,
        .head_dim = hd,
        .block_size = g->block_size,
        .keys = keys,
        .values = values,
        .scale = (float)(1.0 / sqrt((double)hd)),
    };
    if (j->cx->avx512)
        kvf_cpu_attention_tile_avx512(&t, scratch);
    else
        kvf_cpu_attention_tile(&t, scratch);
}

static kvf_status_t cpu_attention(void *ctx, float *out, const float *q, int ld_q,
                                  const kvf_kvpool_t *pool, int layer, int n_heads,
                                  const kvf_batch_layout_t *b)
{
    cpu_ctx_t *cx = ctx;
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
    for (int t = 0; t < b->n_tokens;) {
        int e = t + 1;
        while (e < b->n_tokens && e - t < ATTN_TILE_TOKENS && b->seq[e] == b->seq[t])
            e++;
        cx->tiles[2 * n_tiles] = t;
        cx->tiles[2 * n_tiles + 1] = e - t;
        n_tiles++;
        t = e;
    }
    for (int t = 0; t < b->n_tokens; t++)
        max_pos = b->pos[t] > max_pos ? b->pos[t] : max_pos;
    /* Scratch: the tile kernel's floats plus two block pointer lists. */
    size_t need = kvf_cpu_attn_scratch_floats(ATTN_TILE_TOKENS, group, g->head_dim,
                                              g->block_size) +
                  16 + 4 * ((size_t)max_pos / g->block_size + 1); /* 2 pointers of 2 floats */
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
    attn_job_t j = {cx, out, q, ld_q, pool, layer, n_heads, group, n_tiles, b};
    kvf_threadpool_run(cx->pool, attention_task, &j, n_tiles * g->n_kv_heads);
    return KVF_OK;
}

/* ---- lifecycle ------------------------------------------------------ */

static void cpu_destroy(void *ctx)
{
    cpu_ctx_t *cx = ctx;
    if (!cx)
        return;
    kvf_threadpool_destroy(cx->pool);
    for (int i = 0; cx->scratch && i < cx->n_threads; i++)
        free(cx->scratch[i]);
    free(cx->scratch);
    free(cx->tiles);
    free(cx);
}

static const kvf_backend_ops_t cpu_ops = {
    .name = "cpu",
    .matmul = cpu_matmul,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .kv_write = cpu_kv_write,
    .attention = cpu_attention,
    .swiglu = cpu_swiglu,
    .synchronize = NULL,
    .destroy = cpu_destroy,
};


kvf_status_t kvf_backend_cpu_create_ex(int n_threads, bool allow_simd, kvf_backend_t *be_p)
{
    cpu_ctx_t *cx = calloc(1, sizeof(*cx));
    if (!cx)
        return KVF_ERR_NOMEM;
    kvf_status_t st = kvf_threadpool_create(n_threads, &cx->pool);
    if (st != KVF_OK) {
        free(cx);
        return st;
    }
    cx->n_threads = kvf_threadpool_size(cx->pool);
    cx->scratch = calloc((size_t)cx->n_threads, sizeof(*cx->scratch));
    if (!cx->scratch) {
        cpu_destroy(cx);
        return KVF_ERR_NOMEM;
    }
    cx->avx512 = allow_simd && kvf_cpu_has_avx512();
    /* Our pool splits every sgemm; OpenBLAS threads on top would fight it
     * for the same cores. */
    openblas_set_num_threads(1);
    be_p->ops = &cpu_ops;
    be_p->ctx = cx;
    return KVF_OK;
}

kvf_status_t kvf_backend_cpu_create(int n_threads, kvf_backend_t *be_p)
{
    return kvf_backend_cpu_create_ex(n_threads, true, be_p);
}

int kvf_backend_cpu_threads(const kvf_backend_t *be)
{
    if (be->ops != &cpu_ops)
        return 0;
    return ((const cpu_ctx_t *)be->ctx)->n_threads;
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
