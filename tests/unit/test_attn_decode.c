/* The CPU backend's decode attention (one query token) over long
 * contexts: the kernels take a decode tile's chunks several at a time
 * through scores, softmax and p·v (cpu_kernels_vec.h), so contexts past
 * one such run (256 keys), ends and window starts at every offset in a
 * chunk, odd GQA groups, block sizes that split chunks and every KV
 * format must still give each instruction set, thread count and batching
 * (a task a kv head, or a token's kv heads together) the scalar kernels'
 * bits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kvf/backend.h"
#include "kvf/kvcache.h"
#include "support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CTX 700

static uint32_t g_rng = 1;

static float frand(void)
{
    g_rng = g_rng * 1664525u + 1013904223u;
    return (float)((g_rng >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static float *rand_floats(size_t n, float mul)
{
    float *p = malloc(n * sizeof(float));
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = frand() * mul;
    return p;
}

/* Query positions: ends of one chunk, of one run of chunks and past it. */
static const int32_t qpos[] = {0, 15, 16, 255, 256, 257, 271, 272, 300, 511, 512, 600, 699};
#define N_Q ((int)(sizeof(qpos) / sizeof(qpos[0])))

typedef struct {
    int head_dim, n_heads, n_kv, block_size, window;
    kvf_kv_dtype_t dt;
    float softcap;
} shape_t;

/* Every query of qpos against one sequence of CTX positions, into out
 * (N_Q x n_heads x head_dim): one call a token (batched: one call). */
static void decode_all(kvf_backend_t *be, const shape_t *s, float *out, bool batched)
{
    kvf_kv_geometry_t g = {.n_layers = 1, .n_kv_heads = s->n_kv, .head_dim = s->head_dim,
                           .block_size = s->block_size, .dtype = s->dt};
    kvf_kvpool_t *pool;
    assert_int_equal(kvf_kvpool_create(&g, (uint32_t)(CTX / s->block_size + 2), &pool), KVF_OK);
    kvf_block_table_t bt;
    kvf_block_table_init(&bt);
    assert_int_equal(kvf_block_table_reserve(&bt, pool, CTX), KVF_OK);
    const int kv_dim = s->n_kv * s->head_dim, q_dim = s->n_heads * s->head_dim;
    g_rng = 5;
    /* scores of a few units: the running max moves from chunk to chunk */
    float *k = rand_floats((size_t)CTX * kv_dim, 2.0f), *v = rand_floats((size_t)CTX * kv_dim, 1);
    int32_t *pos = malloc(CTX * sizeof(int32_t)), *seq = calloc(CTX, sizeof(int32_t));
    assert_non_null(pos);
    assert_non_null(seq);
    for (int p = 0; p < CTX; p++)
        pos[p] = p;
    const uint32_t *tables[N_Q];
    for (int i = 0; i < N_Q; i++)
        tables[i] = bt.blocks;
    kvf_batch_layout_t w = {.n_tokens = CTX, .pos = pos, .seq = seq, .n_seqs = 1,
                            .block_tables = tables};
    assert_int_equal(be->ops->kv_write(be->ctx, pool, 0, k, v, kv_dim, &w), KVF_OK);
    float *q = rand_floats((size_t)N_Q * q_dim, 1);
    int32_t qseq[N_Q];
    for (int i = 0; i < N_Q; i++)
        qseq[i] = i;
    const float scale = s->softcap > 0 ? 0.3f : 0;
    if (batched) {
        kvf_batch_layout_t b = {.n_tokens = N_Q, .pos = qpos, .seq = qseq, .n_seqs = N_Q,
                                .block_tables = tables, .scale = scale, .softcap = s->softcap,
                                .window = s->window};
        assert_int_equal(be->ops->attention(be->ctx, out, q, q_dim, pool, 0, s->n_heads, &b),
                         KVF_OK);
    } else {
        for (int i = 0; i < N_Q; i++) {
            int32_t s0 = 0;
            kvf_batch_layout_t b = {.n_tokens = 1, .pos = &qpos[i], .seq = &s0, .n_seqs = 1,
                                    .block_tables = tables, .scale = scale,
                                    .softcap = s->softcap, .window = s->window};
            assert_int_equal(be->ops->attention(be->ctx, out + (size_t)i * q_dim,
                                                q + (size_t)i * q_dim, q_dim, pool, 0,
                                                s->n_heads, &b),
                             KVF_OK);
        }
    }
    kvf_block_table_release(&bt, pool);
    kvf_block_table_fini(&bt);
    kvf_kvpool_destroy(pool);
    free(k);
    free(v);
    free(pos);
    free(seq);
    free(q);
}

static void check_shape(const shape_t *s)
{
    kvf_cpu_isa_t isas[KVF_CPU_ISA_COUNT];
    const int n_isa = kvf_test_cpu_isas(isas);
    const size_t n_out = (size_t)N_Q * s->n_heads * s->head_dim;
    float *ref = malloc(n_out * sizeof(float)), *got = malloc(n_out * sizeof(float));
    assert_non_null(ref);
    assert_non_null(got);
    kvf_backend_t be;
    kvf_test_cpu_backend(&be, 1, KVF_CPU_ISA_SCALAR, KVF_CPU_WEIGHTS_NATIVE);
    decode_all(&be, s, ref, false);
    kvf_backend_destroy(&be);
    for (int i = 0; i < n_isa; i++)
        for (int threads = 1; threads <= 2; threads++) {
            kvf_test_cpu_backend(&be, threads, isas[i], KVF_CPU_WEIGHTS_NATIVE);
            for (int batched = 0; batched < 2; batched++) {
                decode_all(&be, s, got, batched);
                char what[160];
                snprintf(what, sizeof(what),
                         "decode kv %s, %s, %d threads, hd %d, %d/%d heads, block %d, "
                         "window %d, softcap %g, %s",
                         kvf_kv_dtype_name(s->dt), kvf_cpu_isa_name(isas[i]), threads,
                         s->head_dim, s->n_heads, s->n_kv, s->block_size, s->window,
                         (double)s->softcap, batched ? "batched" : "token by token");
                kvf_test_assert_bits(got, ref, n_out, what);
            }
            kvf_backend_destroy(&be);
        }
    free(ref);
    free(got);
}

/* Every KV format, GQA groups 2 and 3 and MHA, head dims 64, 80 (not
 * a vector multiple on AVX-512), 72 (not one on AVX2 either: the element
 * tails) and 128, block sizes 16, 40 (chunks
 * split across blocks) and 1, 1 to 8 kv heads: batched, the 13 queries
 * are enough tiles for a task to take a token's kv heads together
 * (attention_heads, in runs of 1 to 16 chunks by the heads' bytes). */
static void test_long_decode(void **state)
{
    (void)state;
    const shape_t shapes[] = {
        {64, 4, 2, 16, 0, KVF_KV_F32, 0},  {128, 6, 2, 16, 0, KVF_KV_F32, 0},
        {80, 2, 2, 40, 0, KVF_KV_F32, 0},  {64, 3, 1, 1, 0, KVF_KV_F32, 0},
        {64, 16, 8, 16, 0, KVF_KV_F32, 0},  {72, 4, 2, 40, 0, KVF_KV_F32, 0},
    };
    for (int dt = 0; dt < KVF_KV_N_DTYPES; dt++)
        for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
            shape_t s = shapes[i];
            s.dt = (kvf_kv_dtype_t)dt;
            check_shape(&s);
        }
}

/* A sliding window whose first key falls at every kind of offset in a
 * chunk (the queries' windows start at 0, inside a chunk and on its
 * start), and Gemma2's soft-capped scores. */
static void test_window_and_softcap(void **state)
{
    (void)state;
    const shape_t shapes[] = {
        {64, 4, 2, 16, 100, KVF_KV_F32, 0}, {64, 4, 2, 16, 256, KVF_KV_BF16, 0},
        {64, 6, 2, 16, 37, KVF_KV_INT8, 0}, {64, 4, 2, 16, 0, KVF_KV_F32, 1.5f},
        {64, 4, 2, 40, 300, KVF_KV_FP8, 1.5f},
    };
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
        check_shape(&shapes[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_long_decode),
        cmocka_unit_test(test_window_and_softcap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
