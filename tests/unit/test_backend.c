/* Backend ops tests: every op of the CPU backend, on every instruction set
 * this machine runs (scalar, AVX2, AVX-512), against plain double-precision
 * references, on shapes that hit the vector and panel tails, and paged
 * attention over several block sizes, sequences and GQA groups. Then the
 * guarantee of docs/numerics.md: every op gives the same bits on every
 * instruction set, for every batch shape and thread count. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kvf/backend.h"
#include "kvf/detmath.h"
#include "kvf/kvcache.h"
#include "support.h"
#include "../../common/backend/cpu/cpu_kernels.h"

#include <fenv.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint32_t g_rng = 1;

static float frand(void)
{
    g_rng = g_rng * 1664525u + 1013904223u;
    return (float)((g_rng >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static float *rand_floats(size_t n)
{
    float *p = malloc(n * sizeof(float));
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = frand();
    return p;
}

static void assert_close(const float *got, const double *want, size_t n, double tol,
                         const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (fabs(got[i] - want[i]) > tol * (1 + fabs(want[i])))
            fail_msg("%s: [%zu] = %.8g, want %.8g", what, i, got[i], want[i]);
}

static void each_backend(void (*fn)(kvf_backend_t *be))
{
    kvf_cpu_isa_t isas[KVF_CPU_ISA_COUNT];
    int n = kvf_test_cpu_isas(isas);
    for (int i = 0; i < n; i++) {
        kvf_backend_t be;
        kvf_test_cpu_backend(&be, 2, isas[i], KVF_CPU_WEIGHTS_NATIVE);
        fn(&be);
        kvf_backend_destroy(&be);
    }
}

static void matmul_cases(kvf_backend_t *be)
{
    const int ms[] = {1, 2, 3, 4, 5, 7, 8, 9, 13, 33}, n = 77, k = 50;
    for (size_t mi = 0; mi < sizeof(ms) / sizeof(ms[0]); mi++) {
        int m = ms[mi];
        for (int variant = 0; variant < 3; variant++) {
            float *x = rand_floats((size_t)m * k), *w = rand_floats((size_t)n * k);
            float *bias = variant == 1 ? rand_floats((size_t)n) : NULL;
            int acc = variant == 2;
            float *y = rand_floats((size_t)m * n);
            double *want = malloc((size_t)m * n * sizeof(double));
            for (int i = 0; i < m; i++)
                for (int r = 0; r < n; r++) {
                    double s = acc ? y[(size_t)i * n + r] : 0;
                    for (int d = 0; d < k; d++)
                        s += (double)x[(size_t)i * k + d] * w[(size_t)r * k + d];
                    want[(size_t)i * n + r] = s + (bias ? bias[r] : 0);
                }
            assert_int_equal(be->ops->matmul(be->ctx, y, x, w, bias, m, n, k, acc), KVF_OK);
            assert_close(y, want, (size_t)m * n, 1e-5, "matmul");
            free(x);
            free(w);
            free(bias);
            free(y);
            free(want);
        }
    }
}

static void test_matmul(void **state)
{
    (void)state;
    each_backend(matmul_cases);
}

static void rowwise_cases(kvf_backend_t *be)
{
    const int m = 5, dim = 37, hd = 20, heads = 3, ld = 70;
    /* rmsnorm */
    float *x = rand_floats((size_t)m * dim), *w = rand_floats((size_t)dim);
    float *y = malloc((size_t)m * dim * sizeof(float));
    double *want = malloc((size_t)m * ld * 2 * sizeof(double));
    for (int i = 0; i < m; i++) {
        double ss = 0;
        for (int d = 0; d < dim; d++)
            ss += (double)x[i * dim + d] * x[i * dim + d];
        double inv = 1 / sqrt(ss / dim + 1e-5);
        for (int d = 0; d < dim; d++)
            want[i * dim + d] = w[d] * x[i * dim + d] * inv;
    }
    assert_int_equal(be->ops->rmsnorm(be->ctx, y, x, w, m, dim, 1e-5f), KVF_OK);
    assert_close(y, want, (size_t)m * dim, 1e-5, "rmsnorm");
    /* swiglu: gu (m, 2*dim) */
    float *gu = rand_floats((size_t)m * 2 * dim);
    for (size_t i = 0; i < (size_t)m * 2 * dim; i++)
        gu[i] *= 8; /* reach the tails of exp */
    for (int i = 0; i < m; i++)
        for (int d = 0; d < dim; d++) {
            double g = gu[i * 2 * dim + d], u = gu[i * 2 * dim + dim + d];
            want[i * dim + d] = g / (1 + exp(-g)) * u;
        }
    assert_int_equal(be->ops->swiglu(be->ctx, y, gu, m, dim), KVF_OK);
    assert_close(y, want, (size_t)m * dim, 1e-5, "swiglu");
    /* rope over heads of a strided buffer, half-split pairs */
    float *q = rand_floats((size_t)m * ld), *cs = malloc((size_t)m * hd * sizeof(float));
    for (int i = 0; i < m; i++)
        for (int d = 0; d < hd / 2; d++) {
            double a = (i + 3) * pow(10000.0, -2.0 * d / hd);
            cs[i * hd + d] = (float)cos(a);
            cs[i * hd + hd / 2 + d] = (float)sin(a);
        }
    for (int i = 0; i < m; i++)
        for (int c = 0; c < ld; c++)
            want[i * ld + c] = q[i * ld + c];
    for (int i = 0; i < m; i++)
        for (int h = 0; h < heads; h++)
            for (int d = 0; d < hd / 2; d++) {
                double c = cs[i * hd + d], s = cs[i * hd + hd / 2 + d];
                double x0 = q[i * ld + h * hd + d], x1 = q[i * ld + h * hd + d + hd / 2];
                want[i * ld + h * hd + d] = x0 * c - x1 * s;
                want[i * ld + h * hd + d + hd / 2] = x1 * c + x0 * s;
            }
    assert_int_equal(be->ops->rope(be->ctx, q, ld, cs, m, heads, hd), KVF_OK);
    assert_close(q, want, (size_t)m * ld, 1e-6, "rope");
    free(x);
    free(w);
    free(y);
    free(want);
    free(gu);
    free(q);
    free(cs);
}

static void test_rowwise(void **state)
{
    (void)state;
    each_backend(rowwise_cases);
}

/* Paged attention: two sequences written through kv_write (one from 0, one
 * continuing at 13), queried at their new positions. One case's state: */
typedef struct {
    int head_dim, n_heads, n_kv, kv_dim, q_dim;
    kvf_kvpool_t *pool;
    kvf_block_table_t bt[2];
    float *k_all[2], *v_all[2]; /* every position's K and V rows, per sequence */
    int n_tok;                  /* the batch: the new positions of both */
    int32_t *pos, *seq;
    const uint32_t *tables[2];
    kvf_batch_layout_t b;
} attn_case_t;

enum { ATTN_LAYERS = 2, ATTN_LAYER = 1, ATTN_EARLIER = 13 };
static const int attn_n_ctx[2] = {23, 40}, attn_start[2] = {0, ATTN_EARLIER};

/* The pool, both sequences' block tables and their random K/V rows. */
static void attn_setup(attn_case_t *a, int block_size, int head_dim, int n_heads, int n_kv,
                       kvf_kv_dtype_t dt)
{
    memset(a, 0, sizeof(*a));
    a->head_dim = head_dim;
    a->n_heads = n_heads;
    a->n_kv = n_kv;
    a->kv_dim = n_kv * head_dim;
    a->q_dim = n_heads * head_dim;
    kvf_kv_geometry_t g = {.n_layers = ATTN_LAYERS, .n_kv_heads = n_kv, .head_dim = head_dim,
                           .block_size = block_size, .dtype = dt};
    assert_int_equal(kvf_kvpool_create(&g, 64, &a->pool), KVF_OK);
    for (int s = 0; s < 2; s++) {
        kvf_block_table_init(&a->bt[s]);
        assert_int_equal(kvf_block_table_reserve(&a->bt[s], a->pool, (uint32_t)attn_n_ctx[s]),
                         KVF_OK);
        a->k_all[s] = rand_floats((size_t)attn_n_ctx[s] * a->kv_dim);
        a->v_all[s] = rand_floats((size_t)attn_n_ctx[s] * a->kv_dim);
    }
}

/* Sequence 1's first 13 positions, written earlier: k and v rows
 * interleaved in one buffer with ld = 2 * kv_dim. */
static void attn_write_earlier(kvf_backend_t *be, attn_case_t *a)
{
    const int kv_dim = a->kv_dim;
    int32_t pos[ATTN_EARLIER], seq[ATTN_EARLIER];
    for (int i = 0; i < ATTN_EARLIER; i++) {
        pos[i] = i;
        seq[i] = 0;
    }
    const uint32_t *tables[1] = {a->bt[1].blocks};
    kvf_batch_layout_t b = {.n_tokens = ATTN_EARLIER, .pos = pos, .seq = seq, .n_seqs = 1,
                            .block_tables = tables};
    float *kv = malloc((size_t)ATTN_EARLIER * 2 * kv_dim * sizeof(float));
    for (int i = 0; i < ATTN_EARLIER; i++) {
        memcpy(kv + (size_t)i * 2 * kv_dim, a->k_all[1] + (size_t)i * kv_dim,
               (size_t)kv_dim * sizeof(float));
        memcpy(kv + (size_t)i * 2 * kv_dim + kv_dim, a->v_all[1] + (size_t)i * kv_dim,
               (size_t)kv_dim * sizeof(float));
    }
    assert_int_equal(
        be->ops->kv_write(be->ctx, a->pool, ATTN_LAYER, kv, kv + kv_dim, 2 * kv_dim, &b), KVF_OK);
    free(kv);
}

/* The batch (all 23 of sequence 0, positions 13..39 of sequence 1), its
 * K/V rows written through kv_write. */
static void attn_write_batch(kvf_backend_t *be, attn_case_t *a)
{
    const int kv_dim = a->kv_dim;
    a->n_tok = (attn_n_ctx[0] - attn_start[0]) + (attn_n_ctx[1] - attn_start[1]);
    a->pos = malloc((size_t)a->n_tok * sizeof(int32_t));
    a->seq = malloc((size_t)a->n_tok * 4);
    float *k = malloc((size_t)a->n_tok * kv_dim * sizeof(float));
    float *v = malloc((size_t)a->n_tok * kv_dim * sizeof(float));
    int t = 0;
    for (int s = 0; s < 2; s++)
        for (int p = attn_start[s]; p < attn_n_ctx[s]; p++, t++) {
            a->pos[t] = p;
            a->seq[t] = s;
            memcpy(k + (size_t)t * kv_dim, a->k_all[s] + (size_t)p * kv_dim,
                   (size_t)kv_dim * sizeof(float));
            memcpy(v + (size_t)t * kv_dim, a->v_all[s] + (size_t)p * kv_dim,
                   (size_t)kv_dim * sizeof(float));
        }
    a->tables[0] = a->bt[0].blocks;
    a->tables[1] = a->bt[1].blocks;
    a->b = (kvf_batch_layout_t){.n_tokens = a->n_tok, .pos = a->pos, .seq = a->seq, .n_seqs = 2,
                                .block_tables = a->tables};
    assert_int_equal(be->ops->kv_write(be->ctx, a->pool, ATTN_LAYER, k, v, kv_dim, &a->b), KVF_OK);
    free(k);
    free(v);
}

/* Causal softmax attention of q over the sequences' K/V, in double. */
static double *attn_reference(const attn_case_t *a, const float *q)
{
    const int head_dim = a->head_dim, kv_dim = a->kv_dim, q_dim = a->q_dim;
    const int group = a->n_heads / a->n_kv;
    double *want = malloc((size_t)a->n_tok * q_dim * sizeof(double));
    double *sc = malloc(64 * sizeof(double));
    for (int t = 0; t < a->n_tok; t++) {
        int s = a->seq[t];
        for (int h = 0; h < a->n_heads; h++) {
            int kvh = h / group;
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j <= a->pos[t]; j++) {
                double d = 0;
                for (int c = 0; c < head_dim; c++)
                    d += (double)q[(size_t)t * q_dim + h * head_dim + c] *
                         a->k_all[s][(size_t)j * kv_dim + kvh * head_dim + c];
                sc[j] = d / sqrt((double)head_dim);
                mx = sc[j] > mx ? sc[j] : mx;
            }
            for (int j = 0; j <= a->pos[t]; j++)
                sum += (sc[j] = exp(sc[j] - mx));
            for (int c = 0; c < head_dim; c++) {
                double o = 0;
                for (int j = 0; j <= a->pos[t]; j++)
                    o += sc[j] * a->v_all[s][(size_t)j * kv_dim + kvh * head_dim + c];
                want[(size_t)t * q_dim + h * head_dim + c] = o / sum;
            }
        }
    }
    free(sc);
    return want;
}

/* Tables released (the pool ends empty), pool and rows freed. */
static void attn_teardown(attn_case_t *a)
{
    for (int s = 0; s < 2; s++) {
        kvf_block_table_release(&a->bt[s], a->pool);
        kvf_block_table_fini(&a->bt[s]);
        free(a->k_all[s]);
        free(a->v_all[s]);
    }
    assert_int_equal(kvf_kvpool_used_blocks(a->pool), 0);
    kvf_kvpool_destroy(a->pool);
    free(a->pos);
    free(a->seq);
}

/* Every (position, kv head) row of rows through dt's encoder and decoder:
 * the values a pool of dt holds. */
static void kv_round_trip(float *rows, int n_rows, int head_dim, kvf_kv_dtype_t dt)
{
    void *enc = malloc((size_t)head_dim * 4);
    for (int r = 0; r < n_rows; r++) {
        float scale = 1;
        kvf_kv_encode_row(dt, rows + (size_t)r * head_dim, head_dim, enc, &scale);
        kvf_kv_decode_row(dt, enc, scale, head_dim, rows + (size_t)r * head_dim);
    }
    free(enc);
}

/* Against the double reference over the values the pool holds: the
 * kernels read every format back exactly. */
static void attention_case(kvf_backend_t *be, int block_size, int head_dim, int n_heads,
                           int n_kv, kvf_kv_dtype_t dt)
{
    attn_case_t a;
    attn_setup(&a, block_size, head_dim, n_heads, n_kv, dt);
    attn_write_earlier(be, &a);
    attn_write_batch(be, &a);
    for (int s = 0; s < 2; s++) {
        kv_round_trip(a.k_all[s], attn_n_ctx[s] * n_kv, head_dim, dt);
        kv_round_trip(a.v_all[s], attn_n_ctx[s] * n_kv, head_dim, dt);
    }
    float *q = rand_floats((size_t)a.n_tok * a.q_dim);
    float *out = malloc((size_t)a.n_tok * a.q_dim * sizeof(float));
    double *want = attn_reference(&a, q);
    assert_int_equal(
        be->ops->attention(be->ctx, out, q, a.q_dim, a.pool, ATTN_LAYER, n_heads, &a.b), KVF_OK);
    char what[96];
    snprintf(what, sizeof(what), "attention (kv %s, block %d, head dim %d, %d/%d heads)",
             kvf_kv_dtype_name(dt), block_size, head_dim, n_heads, n_kv);
    assert_close(out, want, (size_t)a.n_tok * a.q_dim, 2e-5, what);
    attn_teardown(&a);
    free(q);
    free(out);
    free(want);
}

static void attention_cases(kvf_backend_t *be)
{
    const int blocks[] = {1, 4, 16, 32};
    for (int dt = 0; dt < KVF_KV_N_DTYPES; dt++) {
        for (int i = 0; i < 4; i++) {
            attention_case(be, blocks[i], 20, 4, 2, (kvf_kv_dtype_t)dt); /* masked tails, generic p·v */
            attention_case(be, blocks[i], 64, 6, 2, (kvf_kv_dtype_t)dt); /* register p·v, 3:1 */
        }
        attention_case(be, 16, 16, 4, 4, (kvf_kv_dtype_t)dt);  /* MHA */
        attention_case(be, 16, 128, 4, 1, (kvf_kv_dtype_t)dt); /* MQA, head_dim 128 */
    }
}

static void test_attention(void **state)
{
    (void)state;
    each_backend(attention_cases);
}

/* ---- one set of numerics -------------------------------------------- */

/* y of one matmul on a backend, for rows [r0, r1) of x only. */
static void matmul_rows(kvf_backend_t *be, float *y, const float *x, const float *w,
                        const float *bias, int r0, int r1, int n, int k, int acc)
{
    assert_int_equal(be->ops->matmul(be->ctx, y + (size_t)r0 * n, x + (size_t)r0 * k, w, bias,
                                     r1 - r0, n, k, acc),
                     KVF_OK);
}

/* matmul: every instruction set, 1/2/3 threads, the batch whole, row by
 * row and in uneven chunks: the same bits as the scalar kernels on the
 * whole batch. */
static void test_matmul_invariance(void **state)
{
    (void)state;
    kvf_cpu_isa_t isas[KVF_CPU_ISA_COUNT];
    int n_isa = kvf_test_cpu_isas(isas);
    const int m = 29, n = 200, k = 173;
    float *x = rand_floats((size_t)m * k), *w = rand_floats((size_t)n * k);
    float *bias = rand_floats((size_t)n), *y0 = rand_floats((size_t)m * n);
    float *ref = malloc((size_t)m * n * sizeof(float)), *got = malloc((size_t)m * n * sizeof(float));
    for (int acc = 0; acc < 2; acc++) {
        kvf_backend_t be;
        kvf_test_cpu_backend(&be, 1, KVF_CPU_ISA_SCALAR, KVF_CPU_WEIGHTS_NATIVE);
        memcpy(ref, y0, (size_t)m * n * sizeof(float));
        matmul_rows(&be, ref, x, w, bias, 0, m, n, k, acc);
        kvf_backend_destroy(&be);
        for (int i = 0; i < n_isa; i++)
            for (int threads = 1; threads <= 3; threads++) {
                kvf_test_cpu_backend(&be, threads, isas[i], KVF_CPU_WEIGHTS_NATIVE);
                const int splits[] = {m, 1, 2, 3, 4, 5, 6, 7, 8, 9, 13};
                for (size_t si = 0; si < sizeof(splits) / sizeof(splits[0]); si++) {
                    memcpy(got, y0, (size_t)m * n * sizeof(float));
                    for (int r = 0; r < m; r += splits[si])
                        matmul_rows(&be, got, x, w, bias, r,
                                    r + splits[si] > m ? m : r + splits[si], n, k, acc);
                    char what[128];
                    snprintf(what, sizeof(what), "matmul %s, %d threads, chunks of %d rows%s",
                             kvf_cpu_isa_name(isas[i]), threads, splits[si],
                             acc ? ", accumulate" : "");
                    kvf_test_assert_bits(got, ref, (size_t)m * n, what);
                }
                kvf_backend_destroy(&be);
            }
    }
    free(x);
    free(w);
    free(bias);
    free(y0);
    free(ref);
    free(got);
}

/* swiglu, geglu, rmsnorm and rmsnorm_add: every instruction set, every
 * row count, the same bits as the scalar kernels (exp's tails included). */
static void test_rowwise_invariance(void **state)
{
    (void)state;
    kvf_cpu_isa_t isas[KVF_CPU_ISA_COUNT];
    int n_isa = kvf_test_cpu_isas(isas);
    const int m = 9, dim = 203;
    float *gu = rand_floats((size_t)m * 2 * dim), *x = rand_floats((size_t)m * dim);
    float *w = rand_floats((size_t)dim);
    for (size_t i = 0; i < (size_t)m * 2 * dim; i++)
        gu[i] *= (float)(i % 7) * 20; /* 0, and out to exp's clamps */
    float *ref = malloc((size_t)m * dim * sizeof(float)), *got = malloc((size_t)m * dim * 4);
    float *nref = malloc((size_t)m * dim * sizeof(float)), *ngot = malloc((size_t)m * dim * 4);
    float *gref = malloc((size_t)m * dim * sizeof(float)), *y0 = rand_floats((size_t)m * dim);
    float *aref = malloc((size_t)m * dim * sizeof(float)), *agot = malloc((size_t)m * dim * 4);
    kvf_backend_t be;
    kvf_test_cpu_backend(&be, 1, KVF_CPU_ISA_SCALAR, KVF_CPU_WEIGHTS_NATIVE);
    assert_int_equal(be.ops->swiglu(be.ctx, ref, gu, m, dim), KVF_OK);
    assert_int_equal(be.ops->rmsnorm(be.ctx, nref, x, w, m, dim, 1e-6f), KVF_OK);
    assert_int_equal(be.ops->geglu(be.ctx, gref, gu, m, dim), KVF_OK);
    memcpy(aref, y0, (size_t)m * dim * sizeof(float));
    assert_int_equal(be.ops->rmsnorm_add(be.ctx, aref, x, w, m, dim, 1e-6f), KVF_OK);
    for (size_t i = 0; i < (size_t)m * dim; i++) /* y + the rmsnorm's own bits */
        assert_true(aref[i] == y0[i] + nref[i]);
    for (size_t i = 0; i < (size_t)m * dim; i++) {
        size_t r = i / dim, c = i % dim;
        float g = gu[r * 2 * dim + c], u = gu[r * 2 * dim + dim + c];
        assert_true(gref[i] == kvf_det_gelu_tanh(g) * u);
    }
    kvf_backend_destroy(&be);
    for (int i = 0; i < n_isa; i++)
        for (int threads = 1; threads <= 2; threads++) {
            kvf_test_cpu_backend(&be, threads, isas[i], KVF_CPU_WEIGHTS_NATIVE);
            for (int r = 0; r < m; r++) {
                assert_int_equal(be.ops->swiglu(be.ctx, got + (size_t)r * dim,
                                                gu + (size_t)r * 2 * dim, 1, dim),
                                 KVF_OK);
                assert_int_equal(be.ops->rmsnorm(be.ctx, ngot + (size_t)r * dim,
                                                 x + (size_t)r * dim, w, 1, dim, 1e-6f),
                                 KVF_OK);
            }
            kvf_test_assert_bits(got, ref, (size_t)m * dim, kvf_cpu_isa_name(isas[i]));
            kvf_test_assert_bits(ngot, nref, (size_t)m * dim, kvf_cpu_isa_name(isas[i]));
            assert_int_equal(be.ops->swiglu(be.ctx, got, gu, m, dim), KVF_OK);
            kvf_test_assert_bits(got, ref, (size_t)m * dim, kvf_cpu_isa_name(isas[i]));
            assert_int_equal(be.ops->geglu(be.ctx, got, gu, m, dim), KVF_OK);
            kvf_test_assert_bits(got, gref, (size_t)m * dim, kvf_cpu_isa_name(isas[i]));
            memcpy(agot, y0, (size_t)m * dim * sizeof(float));
            assert_int_equal(be.ops->rmsnorm_add(be.ctx, agot, x, w, m, dim, 1e-6f), KVF_OK);
            kvf_test_assert_bits(agot, aref, (size_t)m * dim, kvf_cpu_isa_name(isas[i]));
            kvf_backend_destroy(&be);
        }
    free(gref);
    free(y0);
    free(aref);
    free(agot);
    free(gu);
    free(x);
    free(w);
    free(ref);
    free(got);
    free(nref);
    free(ngot);
}

/* Attention: a batch of three sequences (a prefill from 0, a chunk from
 * 21, a decode at 70) on every instruction set, thread count and block
 * size gives each token the bits the scalar kernels give it when it is
 * queried alone. */
static void attention_alone(kvf_backend_t *be, int block_size, int head_dim, int n_heads,
                            int n_kv, float *out, bool one_by_one, float softcap,
                            kvf_kv_dtype_t dt)
{
    const float scale = softcap > 0 ? 0.3f : 0; /* Gemma2's scale of its own with its cap */
    const int layer = 0, n_seq = 3;
    const int start[3] = {0, 21, 70}, end[3] = {37, 40, 71};
    kvf_kv_geometry_t g = {.n_layers = 1, .n_kv_heads = n_kv, .head_dim = head_dim,
                           .block_size = block_size, .dtype = dt};
    kvf_kvpool_t *pool;
    assert_int_equal(kvf_kvpool_create(&g, 256, &pool), KVF_OK);
    const int kv_dim = n_kv * head_dim, q_dim = n_heads * head_dim;
    kvf_block_table_t bt[3];
    const uint32_t *tables[3];
    g_rng = 77;
    int n_tok = 0;
    for (int s = 0; s < n_seq; s++) {
        kvf_block_table_init(&bt[s]);
        assert_int_equal(kvf_block_table_reserve(&bt[s], pool, (uint32_t)end[s]), KVF_OK);
        tables[s] = bt[s].blocks;
        /* every position's K/V, written as one batch per sequence */
        int32_t *pos = malloc((size_t)end[s] * sizeof(int32_t)), *seq = calloc((size_t)end[s], 4);
        for (int p = 0; p < end[s]; p++)
            pos[p] = p;
        float *k = rand_floats((size_t)end[s] * kv_dim), *v = rand_floats((size_t)end[s] * kv_dim);
        const uint32_t *t1[1] = {bt[s].blocks};
        kvf_batch_layout_t b = {.n_tokens = end[s], .pos = pos, .seq = seq, .n_seqs = 1,
                                .block_tables = t1};
        assert_int_equal(be->ops->kv_write(be->ctx, pool, layer, k, v, kv_dim, &b), KVF_OK);
        free(pos);
        free(seq);
        free(k);
        free(v);
        n_tok += end[s] - start[s];
    }
    int32_t *pos = malloc((size_t)n_tok * sizeof(int32_t)), *seq = malloc((size_t)n_tok * 4);
    for (int s = 0, t = 0; s < n_seq; s++)
        for (int p = start[s]; p < end[s]; p++, t++) {
            pos[t] = p;
            seq[t] = s;
        }
    float *q = rand_floats((size_t)n_tok * q_dim);
    if (one_by_one) {
        for (int t = 0; t < n_tok; t++) {
            const uint32_t *t1[1] = {tables[seq[t]]};
            int32_t s0 = 0;
            kvf_batch_layout_t b = {.n_tokens = 1, .pos = &pos[t], .seq = &s0, .n_seqs = 1,
                                    .block_tables = t1, .scale = scale, .softcap = softcap};
            assert_int_equal(be->ops->attention(be->ctx, out + (size_t)t * q_dim,
                                                q + (size_t)t * q_dim, q_dim, pool, layer,
                                                n_heads, &b),
                             KVF_OK);
        }
    } else {
        kvf_batch_layout_t b = {.n_tokens = n_tok, .pos = pos, .seq = seq, .n_seqs = n_seq,
                                .block_tables = tables, .scale = scale, .softcap = softcap};
        assert_int_equal(be->ops->attention(be->ctx, out, q, q_dim, pool, layer, n_heads, &b),
                         KVF_OK);
    }
    for (int s = 0; s < n_seq; s++) {
        kvf_block_table_release(&bt[s], pool);
        kvf_block_table_fini(&bt[s]);
    }
    kvf_kvpool_destroy(pool);
    free(pos);
    free(seq);
    free(q);
}

/* One shape in one KV format: every instruction set, thread count, block
 * size and batching gives the scalar kernels' bits of a token alone. */
static void attention_invariance(int hd, int nh, int nkv, kvf_kv_dtype_t dt)
{
    kvf_cpu_isa_t isas[KVF_CPU_ISA_COUNT];
    int n_isa = kvf_test_cpu_isas(isas);
    const int n_tok = 37 + 19 + 1;
    size_t n_out = (size_t)n_tok * nh * hd;
    float *ref = malloc(n_out * sizeof(float)), *got = malloc(n_out * sizeof(float));
    kvf_backend_t be;
    kvf_test_cpu_backend(&be, 1, KVF_CPU_ISA_SCALAR, KVF_CPU_WEIGHTS_NATIVE);
    attention_alone(&be, 16, hd, nh, nkv, ref, true, 0, dt);
    kvf_backend_destroy(&be);
    for (int i = 0; i < n_isa; i++)
        for (int threads = 1; threads <= 2; threads++) {
            kvf_test_cpu_backend(&be, threads, isas[i], KVF_CPU_WEIGHTS_NATIVE);
            const int blocks[] = {1, 16, 48};
            for (int bi = 0; bi < 3; bi++)
                for (int alone = 0; alone < 2; alone++) {
                    attention_alone(&be, blocks[bi], hd, nh, nkv, got, alone, 0, dt);
                    char what[128];
                    snprintf(what, sizeof(what),
                             "attention kv %s, %s, %d threads, block %d, head dim %d, %s",
                             kvf_kv_dtype_name(dt), kvf_cpu_isa_name(isas[i]), threads,
                             blocks[bi], hd, alone ? "token by token" : "one batch");
                    kvf_test_assert_bits(got, ref, n_out, what);
                }
            kvf_backend_destroy(&be);
        }
    free(ref);
    free(got);
}

static void test_attention_invariance(void **state)
{
    (void)state;
    const int shapes[][3] = {{64, 8, 2}, {20, 3, 3}, {128, 4, 1}, {80, 2, 1}};
    for (int dt = 0; dt < KVF_KV_N_DTYPES; dt++)
        for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++)
            attention_invariance(shapes[si][0], shapes[si][1], shapes[si][2], (kvf_kv_dtype_t)dt);
}

/* Gemma2's scale and soft-capped scores: the same bits on every
 * instruction set, thread count and batching, and not those without the
 * cap (the cap is applied). */
static void test_attention_softcap_invariance(void **state)
{
    (void)state;
    kvf_cpu_isa_t isas[KVF_CPU_ISA_COUNT];
    int n_isa = kvf_test_cpu_isas(isas);
    const int hd = 64, nh = 8, nkv = 2, n_tok = 37 + 19 + 1;
    size_t n_out = (size_t)n_tok * nh * hd;
    float *ref = malloc(n_out * sizeof(float)), *got = malloc(n_out * sizeof(float));
    kvf_backend_t be;
    kvf_test_cpu_backend(&be, 1, KVF_CPU_ISA_SCALAR, KVF_CPU_WEIGHTS_NATIVE);
    attention_alone(&be, 16, hd, nh, nkv, ref, true, 1.5f, KVF_KV_F32);
    attention_alone(&be, 16, hd, nh, nkv, got, true, 0, KVF_KV_F32);
    assert_true(kvf_test_max_abs_diff(got, ref, n_out) > 1e-3f);
    kvf_backend_destroy(&be);
    for (int i = 0; i < n_isa; i++)
        for (int threads = 1; threads <= 2; threads++) {
            kvf_test_cpu_backend(&be, threads, isas[i], KVF_CPU_WEIGHTS_NATIVE);
            for (int alone = 0; alone < 2; alone++) {
                attention_alone(&be, alone ? 16 : 1, hd, nh, nkv, got, alone, 1.5f, KVF_KV_F32);
                kvf_test_assert_bits(got, ref, n_out, kvf_cpu_isa_name(isas[i]));
            }
            kvf_backend_destroy(&be);
        }
    free(ref);
    free(got);
}

/* KVF_CPU_ISA forces a path; an unknown name or one this CPU lacks is
 * refused with an error, not run. */
static void test_isa_selection(void **state)
{
    (void)state;
    kvf_cpu_isa_t isa;
    assert_int_equal(kvf_cpu_isa_parse("avx2", &isa), KVF_OK);
    assert_int_equal(isa, KVF_CPU_ISA_AVX2);
    assert_int_equal(kvf_cpu_isa_parse("sse9", &isa), KVF_ERR_INVAL);
    setenv("KVF_CPU_ISA", "scalar", 1);
    kvf_backend_t be;
    assert_int_equal(kvf_backend_cpu_create(1, &be), KVF_OK);
    assert_int_equal(kvf_backend_cpu_isa(&be), KVF_CPU_ISA_SCALAR);
    kvf_backend_destroy(&be);
    setenv("KVF_CPU_ISA", "sse9", 1);
    assert_int_equal(kvf_backend_cpu_create(1, &be), KVF_ERR_INVAL);
    for (int i = KVF_CPU_ISA_SCALAR; i < KVF_CPU_ISA_COUNT; i++) {
        setenv("KVF_CPU_ISA", kvf_cpu_isa_name((kvf_cpu_isa_t)i), 1);
        kvf_status_t st = kvf_backend_cpu_create(1, &be);
        if (kvf_cpu_isa_supported((kvf_cpu_isa_t)i)) {
            assert_int_equal(st, KVF_OK);
            assert_int_equal(kvf_backend_cpu_isa(&be), i);
            kvf_backend_destroy(&be);
        } else {
            assert_int_equal(st, KVF_ERR_UNSUPPORTED);
        }
    }
    unsetenv("KVF_CPU_ISA");
    assert_int_equal(kvf_backend_cpu_create(1, &be), KVF_OK);
    assert_int_equal(kvf_backend_cpu_isa(&be), kvf_cpu_isa_best());
    kvf_backend_destroy(&be);
}

/* The numerics assume round-to-nearest and no flush of subnormals: a
 * process that changed either is refused, not silently different. */
static void test_fp_environment(void **state)
{
    (void)state;
    kvf_backend_t be;
    assert_int_equal(fesetround(FE_UPWARD), 0);
    assert_int_equal(kvf_backend_cpu_create(1, &be), KVF_ERR_UNSUPPORTED);
    assert_int_equal(fesetround(FE_TONEAREST), 0);
#if defined(__x86_64__) && defined(__GNUC__)
    unsigned csr = __builtin_ia32_stmxcsr();
    __builtin_ia32_ldmxcsr(csr | (1u << 15)); /* flush to zero */
    kvf_status_t st = kvf_backend_cpu_create(1, &be);
    __builtin_ia32_ldmxcsr(csr);
    assert_int_equal(st, KVF_ERR_UNSUPPORTED);
#endif
    assert_int_equal(kvf_backend_cpu_create(1, &be), KVF_OK);
    kvf_backend_destroy(&be);
}

/* Every KV element value of the 8- and 16-bit formats (all 256 bytes, all
 * 65536 halves; NaN, infinities, subnormals, signed zeros included)
 * decodes, through every instruction set this CPU runs, to the bits of
 * kvf_kv_decode_row, with scales that round (0.3) and one that does not
 * (1). */
static void test_decode_every_value(void **state)
{
    (void)state;
    enum { N = 65536 };
    uint8_t *src = malloc(2 * N);
    float *want = malloc(N * sizeof(float)), *got = malloc(N * sizeof(float));
    assert_non_null(src);
    assert_non_null(want);
    assert_non_null(got);
    for (int i = 0; i < N; i++) {
        src[2 * i] = (uint8_t)i;
        src[2 * i + 1] = (uint8_t)(i >> 8);
    }
    const kvf_kv_dtype_t dts[] = {KVF_KV_BF16, KVF_KV_F16, KVF_KV_FP8, KVF_KV_INT8};
    const float scales[] = {1.0f, 0.3f};
    for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++)
        for (int s = 0; s < 2; s++) {
            kvf_kv_dtype_t dt = dts[d];
            bool scaled = dt == KVF_KV_FP8 || dt == KVF_KV_INT8;
            int n = kvf_kv_elem_bytes(dt) == 1 ? 256 : N;
            const int row = 64; /* n rows of 64: every element, vector and tail alike */
            float row_scales[N / 64];
            for (int r = 0; r < n / row; r++)
                row_scales[r] = scales[s];
            for (int r = 0; r < n / row; r++)
                kvf_kv_decode_row(dt, src + (size_t)r * row * kvf_kv_elem_bytes(dt),
                                  scaled ? scales[s] : 1.0f, row, want + (size_t)r * row);
            for (int isa = 0; isa < KVF_CPU_ISA_COUNT; isa++) {
                if (!kvf_cpu_isa_supported((kvf_cpu_isa_t)isa))
                    continue;
                const kvf_cpu_kernels_t *k = kvf_cpu_kernels((kvf_cpu_isa_t)isa);
                memset(got, 0xa5, (size_t)n * sizeof(float));
                k->decode_row(dt, src, scaled ? row_scales : NULL, n / row, row, got, row);
                for (int i = 0; i < n; i++)
                    if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
                        fail_msg("%s %s scale %g: element 0x%x decodes to %a, not %a",
                                 kvf_cpu_isa_name((kvf_cpu_isa_t)isa), kvf_kv_dtype_name(dt),
                                 scales[s], i, (double)got[i], (double)want[i]);
            }
        }
    free(src);
    free(want);
    free(got);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_rowwise),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_matmul_invariance),
        cmocka_unit_test(test_rowwise_invariance),
        cmocka_unit_test(test_attention_invariance),
        cmocka_unit_test(test_decode_every_value),
        cmocka_unit_test(test_attention_softcap_invariance),
        cmocka_unit_test(test_isa_selection),
        cmocka_unit_test(test_fp_environment),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
