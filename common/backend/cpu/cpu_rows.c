/* The CPU backend's row-wise ops (cpu_backend_internal.h): each row on
 * its own, rows split across the thread pool, so the thread count changes
 * no bit. */
#include "cpu_backend_internal.h"

#include "kvf/detmath.h"

#include <math.h>

typedef struct {
    kvf_cpu_ctx_t *cx;
    float *y;
    const float *x, *w;
    const float *cos_sin;
    int m, dim, ld, n_heads, head_dim, rows_per_task;
    float eps;
    bool add;  /* rmsnorm: y += the norm */
    bool gelu; /* gated activation: gelu_tanh, else silu */
} rows_job_t;

/* One row: the sum of squares in double, in index order, the same on
 * every instruction set (plain C, no contraction). y may be x. */
static float rms_inv(const float *x, int dim, float eps)
{
    double ss = 0;
    for (int d = 0; d < dim; d++)
        ss += (double)x[d] * x[d];
    return (float)(1.0 / sqrt(ss / dim + eps));
}

static void rmsnorm_row(float *y, const float *x, const float *w, int dim, float eps)
{
    float inv = rms_inv(x, dim, eps);
    for (int d = 0; d < dim; d++)
        y[d] = w[d] * (x[d] * inv);
}

/* y += the row's rmsnorm, each element rounded as rmsnorm_row rounds it. */
static void rmsnorm_add_row(float *y, const float *x, const float *w, int dim, float eps)
{
    float inv = rms_inv(x, dim, eps);
    for (int d = 0; d < dim; d++)
        y[d] = y[d] + w[d] * (x[d] * inv);
}

static void rmsnorm_task(void *arg, int task, int thread)
{
    (void)thread;
    rows_job_t *j = arg;
    int i0 = task * j->rows_per_task, i1 = i0 + j->rows_per_task > j->m ? j->m : i0 + j->rows_per_task;
    for (int i = i0; i < i1; i++)
        (j->add ? rmsnorm_add_row : rmsnorm_row)(j->y + (size_t)i * (size_t)j->dim,
                                                 j->x + (size_t)i * (size_t)j->dim, j->w, j->dim,
                                                 j->eps);
}

/* Each head of each row, as a row of rmsnorm. */
static void head_rmsnorm_task(void *arg, int task, int thread)
{
    (void)thread;
    rows_job_t *j = arg;
    int i0 = task * j->rows_per_task, i1 = i0 + j->rows_per_task > j->m ? j->m : i0 + j->rows_per_task;
    for (int i = i0; i < i1; i++)
        for (int h = 0; h < j->n_heads; h++) {
            float *v = j->y + (size_t)i * (size_t)j->ld + (size_t)h * (size_t)j->head_dim;
            rmsnorm_row(v, v, j->w, j->head_dim, j->eps);
        }
}

static int rows_per_task(int m, int n_threads)
{
    int per = (m + 4 * n_threads - 1) / (4 * n_threads);
    return per < 1 ? 1 : per;
}

static kvf_status_t run_rmsnorm(kvf_cpu_ctx_t *cx, float *y, const float *x, const float *w,
                                int m, int dim, float eps, bool add)
{
    rows_job_t j = {.cx = cx, .y = y, .x = x, .w = w, .m = m, .dim = dim, .eps = eps, .add = add};
    j.rows_per_task = rows_per_task(m, cx->n_threads);
    kvf_threadpool_run(cx->pool, rmsnorm_task, &j, (m + j.rows_per_task - 1) / j.rows_per_task);
    return KVF_OK;
}

kvf_status_t kvf_cpu_op_rmsnorm(void *ctx, float *y, const float *x, const float *w, int m,
                                int dim, float eps)
{
    return run_rmsnorm(ctx, y, x, w, m, dim, eps, false);
}

kvf_status_t kvf_cpu_op_rmsnorm_add(void *ctx, float *y, const float *x, const float *w, int m,
                                    int dim, float eps)
{
    return run_rmsnorm(ctx, y, x, w, m, dim, eps, true);
}

kvf_status_t kvf_cpu_op_head_rmsnorm(void *ctx, float *x, int ld, const float *w, int m,
                                     int n_heads, int head_dim, float eps)
{
    kvf_cpu_ctx_t *cx = ctx;
    rows_job_t j = {.cx = cx, .y = x, .w = w, .m = m, .ld = ld, .n_heads = n_heads,
                    .head_dim = head_dim, .eps = eps};
    j.rows_per_task = rows_per_task(m, cx->n_threads);
    kvf_threadpool_run(cx->pool, head_rmsnorm_task, &j, (m + j.rows_per_task - 1) / j.rows_per_task);
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

kvf_status_t kvf_cpu_op_rope(void *ctx, float *x, int ld, const float *cos_sin, int m,
                             int n_heads, int head_dim)
{
    kvf_cpu_ctx_t *cx = ctx;
    rows_job_t j = {.cx = cx, .y = x, .cos_sin = cos_sin, .m = m, .ld = ld,
                    .n_heads = n_heads, .head_dim = head_dim};
    j.rows_per_task = rows_per_task(m, cx->n_threads);
    kvf_threadpool_run(cx->pool, rope_task, &j, (m + j.rows_per_task - 1) / j.rows_per_task);
    return KVF_OK;
}

/* GeGLU: one function for every instruction set (kvf_det_gelu_tanh). */
static void geglu_row(float *out, const float *gate, const float *up, int n)
{
    for (int i = 0; i < n; i++)
        out[i] = kvf_det_gelu_tanh(gate[i]) * up[i];
}

static void gated_task(void *arg, int task, int thread)
{
    (void)thread;
    rows_job_t *j = arg;
    int i0 = task * j->rows_per_task;
    int i1 = i0 + j->rows_per_task > j->m ? j->m : i0 + j->rows_per_task;
    for (int i = i0; i < i1; i++) {
        const float *gu = j->x + (size_t)i * 2 * (size_t)j->dim;
        float *out = j->y + (size_t)i * (size_t)j->dim;
        if (j->gelu)
            geglu_row(out, gu, gu + j->dim, j->dim);
        else
            j->cx->k->swiglu_row(out, gu, gu + j->dim, j->dim);
    }
}

static kvf_status_t run_gated(kvf_cpu_ctx_t *cx, float *out, const float *gu, int m, int n,
                              bool gelu)
{
    rows_job_t j = {.cx = cx, .y = out, .x = gu, .m = m, .dim = n, .gelu = gelu};
    j.rows_per_task = rows_per_task(m, cx->n_threads);
    kvf_threadpool_run(cx->pool, gated_task, &j, (m + j.rows_per_task - 1) / j.rows_per_task);
    return KVF_OK;
}

kvf_status_t kvf_cpu_op_swiglu(void *ctx, float *out, const float *gu, int m, int n)
{
    return run_gated(ctx, out, gu, m, n, false);
}

kvf_status_t kvf_cpu_op_geglu(void *ctx, float *out, const float *gu, int m, int n)
{
    return run_gated(ctx, out, gu, m, n, true);
}
