/* Engine tests (the golden outputs are test_engine_golden.c's): the
 * invariances of the forward pass
 * (cache vs recompute, chunking, batching, block sizes, GQA/MHA/MQA),
 * bit for bit, on every instruction set and thread count, and `kvf
 * generate` end to end. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kvf/backend.h"
#include "kvf/engine.h"
#include "kvf/kvcache.h"
#include "kvf/log.h"
#include "kvf/model.h"
#include "kvf/safetensors.h"
#include "kvf/sampling.h"
#include "support.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- helpers -------------------------------------------------------- */

/* A bf16 checkpoint held in bf16 (native) computes the bits it computes
 * widened to f32, on every instruction set, in half the bytes. */
static void test_bf16_weights(void **state)
{
    (void)state;
    kvf_model_t *model = kvf_test_load_golden(KVF_TEST_DATA, "tiny-qwen2-bf16");
    const int V = model->cfg.vocab, n = 29;
    uint32_t ids[29];
    kvf_test_random_ids(ids, n, V, 5);
    float *ref = malloc((size_t)n * V * sizeof(float)),
          *got = malloc((size_t)n * V * sizeof(float));
    kvf_cpu_isa_t isas[KVF_CPU_ISA_COUNT];
    int n_isa = kvf_test_cpu_isas(isas);
    size_t f32_bytes = 0;
    for (int i = 0; i < n_isa; i++)
        for (int wt = 0; wt < 2; wt++) {
            kvf_cpu_weights_t weights = wt ? KVF_CPU_WEIGHTS_NATIVE : KVF_CPU_WEIGHTS_F32;
            kvf_test_rig_t r;
            kvf_test_rig_open_isa(&r, model, 16, 64, isas[i], 2, weights);
            assert_int_equal(kvf_backend_cpu_weights_dtype(&r.be),
                             wt ? KVF_DTYPE_BF16 : KVF_DTYPE_F32);
            if (!wt)
                f32_bytes = kvf_backend_cpu_weight_bytes(&r.be);
            else
                assert_int_equal(kvf_backend_cpu_weight_bytes(&r.be) * 2, f32_bytes);
            kvf_block_table_t bt;
            kvf_block_table_init(&bt);
            kvf_test_run_chunked(&r, &bt, ids, n, 5, i == 0 && wt == 0 ? ref : got, NULL);
            kvf_block_table_release(&bt, r.pool);
            kvf_block_table_fini(&bt);
            if (i || wt)
                kvf_test_assert_bits(got, ref, (size_t)n * V, kvf_cpu_isa_name(isas[i]));
            kvf_test_rig_close(&r);
        }
    free(ref);
    free(got);
    kvf_model_destroy(model);
}

/* ---- invariance on random models ------------------------------------ */

/* A random 2-layer model with n_heads / n_kv_heads (support.h). */
static kvf_model_t *random_model(int n_heads, int n_kv_heads, bool qwen2, uint64_t seed)
{
    kvf_model_config_t c = kvf_test_model_config(n_heads, n_kv_heads, qwen2);
    return kvf_test_random_model(&c, seed);
}

/* Decode with the cache equals recomputing the whole sequence: n_prompt
 * prompt ids, then n_steps greedy steps (n_prompt + n_steps <= 64), with
 * a pool of KV format dt (both read the same quantized rows back). */
static void check_cache_vs_recompute_dt(kvf_model_t *m, int block_size, int n_prompt, int n_steps,
                                        kvf_kv_dtype_t dt)
{
    kvf_test_rig_t r;
    kvf_test_rig_open_kv(&r, m, block_size, 256, kvf_cpu_isa_best(), 2, KVF_CPU_WEIGHTS_NATIVE,
                         dt);
    const int V = m->cfg.vocab;
    uint32_t ids[64];
    assert_true(n_prompt + n_steps <= 64);
    kvf_test_random_ids(ids, n_prompt, V, 7);
    float *cached = malloc((size_t)V * sizeof(float));
    float *full = malloc((size_t)V * sizeof(float));
    kvf_block_table_t bt;
    kvf_block_table_init(&bt);
    kvf_test_run_chunked(&r, &bt, ids, n_prompt, n_prompt, NULL, cached);
    for (int s = 0; s < n_steps; s++) {
        int n = n_prompt + s;
        /* full recompute of ids[0..n) in a separate table */
        kvf_block_table_t bt2;
        kvf_block_table_init(&bt2);
        kvf_test_run_chunked(&r, &bt2, ids, n, n, NULL, full);
        kvf_block_table_release(&bt2, r.pool);
        kvf_block_table_fini(&bt2);
        char what[80];
        snprintf(what, sizeof(what), "kv %s, block size %d, step %d: cached vs recompute",
                 kvf_kv_dtype_name(dt), block_size, s);
        kvf_test_assert_bits(cached, full, (size_t)V, what);
        ids[n] = kvf_sample_argmax(cached, V);
        assert_int_equal(kvf_block_table_reserve(&bt, r.pool, (uint32_t)n + 1), KVF_OK);
        kvf_engine_seq_t q = {.tokens = &ids[n],
                              .n_tokens = 1,
                              .start_pos = (uint32_t)n,
                              .block_ids = bt.blocks,
                              .n_blocks = bt.n_blocks,
                              .logits = cached};
        assert_int_equal(kvf_engine_forward(r.engine, &q, 1, NULL), KVF_OK);
    }
    /* The K/V the decode steps wrote is the bytes a prefill of the same
     * tokens writes: every full block, generated positions included (what
     * lets a decode node cache blocks of generated tokens). */
    kvf_block_table_t bt3;
    kvf_block_table_init(&bt3);
    int n_all = n_prompt + n_steps;
    kvf_test_run_chunked(&r, &bt3, ids, n_all, n_all, NULL, full);
    const size_t bb = kvf_kv_block_bytes(kvf_kvpool_geometry(r.pool));
    const uint8_t *base = kvf_kvpool_base(r.pool);
    for (int b = 0; b < n_all / block_size; b++)
        if (memcmp(base + (size_t)bt.blocks[b] * bb, base + (size_t)bt3.blocks[b] * bb, bb))
            fail_msg("kv %s, block size %d: block %d written by decode steps differs from "
                     "the prefill's",
                     kvf_kv_dtype_name(dt), block_size, b);
    kvf_block_table_release(&bt3, r.pool);
    kvf_block_table_fini(&bt3);
    kvf_block_table_release(&bt, r.pool);
    kvf_block_table_fini(&bt);
    assert_int_equal(kvf_kvpool_used_blocks(r.pool), 0);
    free(cached);
    free(full);
    kvf_test_rig_close(&r);
}

/* The same in every KV format. */
static void check_cache_vs_recompute_n(kvf_model_t *m, int block_size, int n_prompt, int n_steps)
{
    for (int dt = 0; dt < KVF_KV_N_DTYPES; dt++)
        check_cache_vs_recompute_dt(m, block_size, n_prompt, n_steps, (kvf_kv_dtype_t)dt);
}

static void check_cache_vs_recompute(kvf_model_t *m, int block_size)
{
    check_cache_vs_recompute_n(m, block_size, 13, 6);
}

static void test_cache_vs_recompute_gqa_mha_mqa(void **state)
{
    (void)state;
    int kv[] = {2, 4, 1}; /* GQA 2:1, MHA, MQA */
    for (int i = 0; i < 3; i++) {
        kvf_model_t *m = random_model(4, kv[i], false, 11 + (uint64_t)i);
        check_cache_vs_recompute(m, 16);
        kvf_model_destroy(m);
    }
    kvf_model_t *m = random_model(6, 2, true, 21); /* qwen2: biases, tied */
    check_cache_vs_recompute(m, 16);
    kvf_model_destroy(m);
}

/* The same for the Qwen3, sliding-window and Gemma2 golden models, past
 * their windows (20, 16 and 16 positions), at block sizes 16 and 1. */
static void test_cache_vs_recompute_qwen3_window(void **state)
{
    (void)state;
    const char *names[] = {"tiny-qwen3-f32", "tiny-mistral-sw-f32", "tiny-gemma2-f32"};
    for (int i = 0; i < 3; i++) {
        kvf_model_t *m = kvf_test_load_golden(KVF_TEST_DATA, names[i]);
        check_cache_vs_recompute_n(m, 16, 37, 10);
        check_cache_vs_recompute_n(m, 1, 21, 6);
        kvf_model_destroy(m);
    }
}

/* Chunked prefill (1, 7, 16, whole) gives every position's logits of one
 * prefill; block sizes 1, 16, 32 give the same as well. */
static void test_chunked_prefill_and_block_sizes(void **state)
{
    (void)state;
    kvf_model_t *m = random_model(4, 2, false, 5);
    const int V = m->cfg.vocab, n = 37;
    uint32_t ids[37];
    kvf_test_random_ids(ids, n, V, 3);
    float *ref = malloc((size_t)n * V * sizeof(float));
    float *got = malloc((size_t)n * V * sizeof(float));
    kvf_test_rig_t r;
    kvf_test_rig_open(&r, m, 16, 64);
    kvf_block_table_t bt;
    kvf_block_table_init(&bt);
    kvf_test_run_chunked(&r, &bt, ids, n, n, ref, NULL);
    kvf_block_table_release(&bt, r.pool);
    int chunks[] = {1, 7, 16};
    for (int c = 0; c < 3; c++) {
        kvf_test_run_chunked(&r, &bt, ids, n, chunks[c], got, NULL);
        kvf_block_table_release(&bt, r.pool);
        char what[64];
        snprintf(what, sizeof(what), "chunk %d vs one prefill", chunks[c]);
        kvf_test_assert_bits(got, ref, (size_t)n * V, what);
    }
    kvf_test_rig_close(&r);
    int sizes[] = {1, 32, 256};
    for (int b = 0; b < 3; b++) {
        kvf_test_rig_open(&r, m, sizes[b], 64);
        kvf_test_run_chunked(&r, &bt, ids, n, 7, got, NULL);
        kvf_block_table_release(&bt, r.pool);
        assert_int_equal(kvf_kvpool_used_blocks(r.pool), 0);
        char what[64];
        snprintf(what, sizeof(what), "block size %d vs 16", sizes[b]);
        kvf_test_assert_bits(got, ref, (size_t)n * V, what);
        kvf_test_rig_close(&r);
    }
    for (int b = 0; b < 2; b++)
        check_cache_vs_recompute(m, b == 0 ? 1 : 32);
    kvf_block_table_fini(&bt);
    free(ref);
    free(got);
    kvf_model_destroy(m);
}

/* A batch mixing a fresh prefill, a decode and a mid-sequence chunk gives
 * each sequence what it gets alone. */
static void mixed_batch(kvf_model_t *m, kvf_kv_dtype_t dt)
{
    const int V = m->cfg.vocab;
    kvf_test_rig_t r;
    kvf_test_rig_open_kv(&r, m, 16, 128, kvf_cpu_isa_best(), 2, KVF_CPU_WEIGHTS_NATIVE, dt);
    uint32_t a[10], b[20], c[25];
    kvf_test_random_ids(a, 10, V, 1);
    kvf_test_random_ids(b, 20, V, 2);
    kvf_test_random_ids(c, 25, V, 3);
    /* Alone: A prefill 10; B 19 then 1; C 8 then 17 (all logits). */
    float *la = malloc((size_t)V * sizeof(float)), *lb = malloc((size_t)V * sizeof(float));
    float *lc = malloc((size_t)17 * V * sizeof(float));
    float *ma = malloc((size_t)V * sizeof(float)), *mb = malloc((size_t)V * sizeof(float));
    float *mc = malloc((size_t)17 * V * sizeof(float));
    kvf_block_table_t ta, tb, tc;
    kvf_block_table_init(&ta);
    kvf_block_table_init(&tb);
    kvf_block_table_init(&tc);
    kvf_test_run_chunked(&r, &ta, a, 10, 10, NULL, la);
    kvf_test_run_chunked(&r, &tb, b, 20, 19, NULL, lb);
    float *tmp = malloc((size_t)25 * V * sizeof(float));
    kvf_test_run_chunked(&r, &tc, c, 25, 8, tmp, NULL);
    memcpy(lc, tmp + (size_t)8 * V, (size_t)17 * V * sizeof(float));
    kvf_block_table_release(&ta, r.pool);
    kvf_block_table_release(&tb, r.pool);
    kvf_block_table_release(&tc, r.pool);
    /* Together: first the prefixes of B and C alone, then one batch. */
    assert_int_equal(kvf_block_table_reserve(&ta, r.pool, 10), KVF_OK);
    assert_int_equal(kvf_block_table_reserve(&tb, r.pool, 20), KVF_OK);
    assert_int_equal(kvf_block_table_reserve(&tc, r.pool, 25), KVF_OK);
    kvf_engine_seq_t pre[2] = {
        {.tokens = b,
         .n_tokens = 19,
         .start_pos = 0,
         .block_ids = tb.blocks,
         .n_blocks = tb.n_blocks},
        {.tokens = c,
         .n_tokens = 8,
         .start_pos = 0,
         .block_ids = tc.blocks,
         .n_blocks = tc.n_blocks},
    };
    assert_int_equal(kvf_engine_forward(r.engine, pre, 2, NULL), KVF_OK);
    kvf_engine_seq_t mix[3] = {
        {.tokens = b + 19,
         .n_tokens = 1,
         .start_pos = 19,
         .block_ids = tb.blocks,
         .n_blocks = tb.n_blocks,
         .logits = mb},
        {.tokens = a,
         .n_tokens = 10,
         .start_pos = 0,
         .block_ids = ta.blocks,
         .n_blocks = ta.n_blocks,
         .logits = ma},
        {.tokens = c + 8,
         .n_tokens = 17,
         .start_pos = 8,
         .block_ids = tc.blocks,
         .n_blocks = tc.n_blocks,
         .all_logits = true,
         .logits = mc},
    };
    assert_int_equal(kvf_engine_forward(r.engine, mix, 3, NULL), KVF_OK);
    kvf_test_assert_bits(ma, la, (size_t)V, "mixed batch vs alone: prefill");
    kvf_test_assert_bits(mb, lb, (size_t)V, "mixed batch vs alone: decode");
    kvf_test_assert_bits(mc, lc, (size_t)17 * V, "mixed batch vs alone: chunk");
    kvf_block_table_release(&ta, r.pool);
    kvf_block_table_release(&tb, r.pool);
    kvf_block_table_release(&tc, r.pool);
    assert_int_equal(kvf_kvpool_used_blocks(r.pool), 0);
    kvf_block_table_fini(&ta);
    kvf_block_table_fini(&tb);
    kvf_block_table_fini(&tc);
    free(tmp);
    free(la);
    free(lb);
    free(lc);
    free(ma);
    free(mb);
    free(mc);
    kvf_test_rig_close(&r);
}

static void test_mixed_batch(void **state)
{
    (void)state;
    kvf_model_t *m = random_model(4, 2, false, 9);
    for (int dt = 0; dt < KVF_KV_N_DTYPES; dt++)
        mixed_batch(m, (kvf_kv_dtype_t)dt);
    kvf_model_destroy(m);
}

/* Every instruction set, 1 to 3 threads, whole prefill or 3-token chunks:
 * every position's logits are the bits of the scalar kernels on one
 * thread, in every KV format (and each format's bits its own). */
static void isas_threads_chunks(kvf_model_t *m, kvf_kv_dtype_t dt, float *ref_f32)
{
    const int V = m->cfg.vocab, n = 40;
    uint32_t ids[40];
    kvf_test_random_ids(ids, n, V, 9);
    float *ref = malloc((size_t)n * V * sizeof(float)),
          *got = malloc((size_t)n * V * sizeof(float));
    kvf_cpu_isa_t isas[KVF_CPU_ISA_COUNT];
    int n_isa = kvf_test_cpu_isas(isas);
    kvf_test_rig_t r;
    kvf_block_table_t bt;
    kvf_block_table_init(&bt);
    kvf_test_rig_open_kv(&r, m, 16, 64, KVF_CPU_ISA_SCALAR, 1, KVF_CPU_WEIGHTS_NATIVE, dt);
    kvf_test_run_chunked(&r, &bt, ids, n, n, ref, NULL);
    if (dt == KVF_KV_F32)
        memcpy(ref_f32, ref, (size_t)n * V * sizeof(float));
    else
        assert_true(memcmp(ref, ref_f32, (size_t)n * V * sizeof(float)) != 0);
    kvf_block_table_release(&bt, r.pool);
    kvf_test_rig_close(&r);
    for (int i = 0; i < n_isa; i++)
        for (int threads = 1; threads <= 3; threads++) {
            kvf_test_rig_open_kv(&r, m, 16, 64, isas[i], threads, KVF_CPU_WEIGHTS_NATIVE, dt);
            const int chunks[] = {n, 3, 17};
            for (int c = 0; c < 3; c++) {
                kvf_test_run_chunked(&r, &bt, ids, n, chunks[c], got, NULL);
                kvf_block_table_release(&bt, r.pool);
                char what[96];
                snprintf(what, sizeof(what), "kv %s, %s, %d threads, chunks of %d",
                         kvf_kv_dtype_name(dt), kvf_cpu_isa_name(isas[i]), threads, chunks[c]);
                kvf_test_assert_bits(got, ref, (size_t)n * V, what);
            }
            kvf_test_rig_close(&r);
        }
    kvf_block_table_fini(&bt);
    free(ref);
    free(got);
}

static void test_isas_threads_chunks(void **state)
{
    (void)state;
    kvf_model_t *m = random_model(8, 2, true, 13);
    float *ref_f32 = malloc((size_t)40 * m->cfg.vocab * sizeof(float));
    for (int dt = 0; dt < KVF_KV_N_DTYPES; dt++)
        isas_threads_chunks(m, (kvf_kv_dtype_t)dt, ref_f32);
    free(ref_f32);
    kvf_model_destroy(m);
}

typedef struct {
    int calls;
    int next;
} hook_state_t;

static void on_layer(void *arg, int layer)
{
    hook_state_t *h = arg;
    assert_int_equal(layer, h->next);
    h->next++;
    h->calls++;
}

/* The per-layer hook runs once per layer, in order; bad batches are refused. */
static void test_hook_and_validation(void **state)
{
    (void)state;
    kvf_model_t *m = random_model(4, 2, false, 3);
    kvf_test_rig_t r;
    kvf_test_rig_open(&r, m, 16, 8);
    uint32_t ids[20];
    kvf_test_random_ids(ids, 20, m->cfg.vocab, 4);
    kvf_block_table_t bt;
    kvf_block_table_init(&bt);
    assert_int_equal(kvf_block_table_reserve(&bt, r.pool, 20), KVF_OK);
    hook_state_t hs = {0, 0};
    kvf_engine_hooks_t hooks = {.on_layer_done = on_layer, .arg = &hs};
    kvf_engine_seq_t q = {.tokens = ids,
                          .n_tokens = 20,
                          .start_pos = 0,
                          .block_ids = bt.blocks,
                          .n_blocks = bt.n_blocks};
    assert_int_equal(kvf_engine_forward(r.engine, &q, 1, &hooks), KVF_OK);
    assert_int_equal(hs.calls, m->cfg.n_layers);
    /* table too short, bad token, bad block id */
    q.n_blocks = 1;
    assert_int_equal(kvf_engine_forward(r.engine, &q, 1, NULL), KVF_ERR_INVAL);
    q.n_blocks = bt.n_blocks;
    uint32_t bad_tok = (uint32_t)m->cfg.vocab;
    kvf_engine_seq_t q2 = q;
    q2.tokens = &bad_tok;
    q2.n_tokens = 1;
    assert_int_equal(kvf_engine_forward(r.engine, &q2, 1, NULL), KVF_ERR_INVAL);
    uint32_t bad_blocks[2] = {0, 999};
    q.block_ids = bad_blocks;
    q.n_blocks = 2;
    assert_int_equal(kvf_engine_forward(r.engine, &q, 1, NULL), KVF_ERR_INVAL);
    assert_int_equal(kvf_engine_forward(r.engine, &q, 0, NULL), KVF_ERR_INVAL);
    /* a pool of the wrong geometry is refused */
    kvf_kv_geometry_t g = kvf_engine_kv_geometry(m, 16, KVF_KV_F32);
    g.n_kv_heads = 3;
    kvf_kvpool_t *other;
    assert_int_equal(kvf_kvpool_create(&g, 4, &other), KVF_OK);
    kvf_engine_t *e2;
    assert_int_equal(kvf_engine_create(m, &r.be, other, &e2), KVF_ERR_MISMATCH);
    kvf_kvpool_destroy(other);
    /* a pool in a format the backend does not compute with is refused */
    g = kvf_engine_kv_geometry(m, 16, KVF_KV_FP8);
    assert_int_equal(kvf_kvpool_create(&g, 4, &other), KVF_OK);
    kvf_backend_t lacking = r.be;
    lacking.kv_dtypes &= ~KVF_KV_DTYPE_BIT(KVF_KV_FP8);
    assert_int_equal(kvf_engine_create(m, &lacking, other, &e2), KVF_ERR_UNSUPPORTED);
    assert_int_equal(kvf_engine_create(m, &r.be, other, &e2), KVF_OK);
    kvf_engine_destroy(e2);
    kvf_kvpool_destroy(other);
    kvf_block_table_release(&bt, r.pool);
    kvf_block_table_fini(&bt);
    kvf_test_rig_close(&r);
    kvf_model_destroy(m);
}

/* `kvf generate --ids` prints the golden greedy continuation. */
static void test_generate_cli(void **state)
{
    (void)state;
    char kvf[1024];
    snprintf(kvf, sizeof(kvf), "%s/kvf", KVF_BIN_DIR);
    if (access(kvf, X_OK) != 0)
        skip();
    cJSON *root = kvf_test_load_expected(KVF_TEST_DATA);
    const char *names[] = {"tiny-llama-f32", "tiny-qwen2-bf16"};
    for (int mi = 0; mi < 2; mi++) {
        const cJSON *pj = cJSON_GetArrayItem(
            cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "models"), names[mi]),
                                "prompts"),
            1);
        char cmd[4096], want[1024] = "";
        int len = snprintf(cmd, sizeof(cmd),
                           "%s generate --model %s/golden/%s --threads 2 "
                           "--ids --ignore-eos --max-tokens 24 --prompt-ids ",
                           kvf, KVF_TEST_DATA, names[mi]);
        const cJSON *e;
        int i = 0;
        cJSON_ArrayForEach(e, cJSON_GetObjectItem(pj, "ids")) len +=
            snprintf(cmd + len, sizeof(cmd) - (size_t)len, "%s%d", i++ ? "," : "", e->valueint);
        i = 0;
        size_t wl = 0;
        cJSON_ArrayForEach(e, cJSON_GetObjectItem(pj, "greedy_ids")) wl +=
            (size_t)snprintf(want + wl, sizeof(want) - wl, "%s%d", i++ ? "," : "", e->valueint);
        FILE *p = popen(cmd, "r");
        assert_non_null(p);
        char got[1024] = "";
        if (!fgets(got, sizeof(got), p))
            got[0] = 0;
        assert_int_equal(pclose(p), 0);
        got[strcspn(got, "\n")] = 0;
        assert_string_equal(got, want);
    }
    cJSON_Delete(root);
}

/* `kvf bench engine --quick` runs and writes the promised JSON keys. */
static void test_bench_smoke(void **state)
{
    (void)state;
    char kvf[1024], cmd[4096], json[] = "/tmp/kvf_bench_json_XXXXXX";
    snprintf(kvf, sizeof(kvf), "%s/kvf", KVF_BIN_DIR);
    if (access(kvf, X_OK) != 0)
        skip();
    int fd = mkstemp(json);
    assert_true(fd >= 0);
    close(fd);
    snprintf(cmd, sizeof(cmd),
             "%s bench engine --model %s/golden/tiny-llama-f32 --threads 2 --quick --json %s "
             ">/dev/null",
             kvf, KVF_TEST_DATA, json);
    assert_int_equal(system(cmd), 0);
    FILE *fp = fopen(json, "rb");
    assert_non_null(fp);
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof(text) - 1, fp);
    text[n] = 0;
    fclose(fp);
    unlink(json);
    cJSON *root = cJSON_Parse(text);
    assert_non_null(root);
    const char *keys[] = {"decode_b1_roofline_ratio", "decode_b8_roofline_ratio",
                          "decode_b32_roofline_ratio", "prefill_512_sgemm_ratio"};
    for (int i = 0; i < 4; i++) {
        const cJSON *v = cJSON_GetObjectItem(root, keys[i]);
        assert_true(cJSON_IsNumber(v));
        assert_true(v->valuedouble > 0);
    }
    const cJSON *cache = cJSON_GetObjectItem(root, "cache_speedup");
    assert_true(cJSON_IsNumber(cJSON_GetObjectItem(cache, "128")));
    /* each decode step and prompt with its typical (median) repetition
     * beside its best, never better than the best */
    const char *pairs[][2] = {{"decode_b1_step_ms", "decode_b1_step_ms_median"},
                              {"decode_b8_step_ms", "decode_b8_step_ms_median"},
                              {"decode_b32_step_ms", "decode_b32_step_ms_median"},
                              {"prefill_512_tokens_per_s_median", "prefill_512_tokens_per_s"}};
    for (int i = 0; i < 4; i++) {
        const cJSON *lo = cJSON_GetObjectItem(root, pairs[i][0]);
        const cJSON *hi = cJSON_GetObjectItem(root, pairs[i][1]);
        assert_true(cJSON_IsNumber(lo) && cJSON_IsNumber(hi));
        assert_true(lo->valuedouble > 0 && lo->valuedouble <= hi->valuedouble);
    }
    const cJSON *row;
    int rows = 0;
    cJSON_ArrayForEach(row, cJSON_GetObjectItem(root, "kv_decode"))
    {
        const cJSON *b = cJSON_GetObjectItem(row, "step_ms");
        const cJSON *m = cJSON_GetObjectItem(row, "step_ms_median");
        assert_true(cJSON_IsNumber(b) && cJSON_IsNumber(m));
        assert_true(b->valuedouble > 0 && b->valuedouble <= m->valuedouble);
        rows++;
    }
    assert_true(rows > 0);
    cJSON_Delete(root);
}

/* A backend serves one model: a second engine on it with another model
 * is refused (its panels would change under the first engine), one with
 * the same model shares them; after the projections are dropped the
 * engines still compute, and a fresh backend cannot bind the model. */
static void test_one_model_per_backend(void **state)
{
    (void)state;
    kvf_model_t *a = random_model(4, 2, false, 31), *b = random_model(4, 2, false, 32);
    const int V = a->cfg.vocab;
    kvf_test_rig_t r;
    kvf_test_rig_open(&r, a, 16, 64);
    kvf_engine_t *e2 = NULL;
    assert_int_equal(kvf_engine_create(b, &r.be, r.pool, &e2), KVF_ERR_MISMATCH);
    assert_int_equal(kvf_engine_create(a, &r.be, r.pool, &e2), KVF_OK);
    uint32_t ids[9];
    kvf_test_random_ids(ids, 9, V, 2);
    float *l1 = malloc((size_t)V * sizeof(float)), *l2 = malloc((size_t)V * sizeof(float));
    kvf_block_table_t bt;
    kvf_block_table_init(&bt);
    kvf_test_run_chunked(&r, &bt, ids, 9, 9, NULL, l1);
    kvf_block_table_release(&bt, r.pool);
    kvf_model_drop_matrices(a);
    kvf_engine_t *first = r.engine;
    r.engine = e2;
    kvf_test_run_chunked(&r, &bt, ids, 9, 4, NULL, l2);
    kvf_block_table_release(&bt, r.pool);
    kvf_block_table_fini(&bt);
    kvf_test_assert_bits(l2, l1, (size_t)V, "second engine after the drop");
    kvf_backend_t be2;
    kvf_test_cpu_backend(&be2, 1, KVF_CPU_ISA_SCALAR, KVF_CPU_WEIGHTS_NATIVE);
    kvf_engine_t *e3 = NULL;
    assert_int_not_equal(kvf_engine_create(a, &be2, r.pool, &e3), KVF_OK);
    kvf_backend_destroy(&be2);
    kvf_engine_destroy(first);
    kvf_test_rig_close(&r);
    free(l1);
    free(l2);
    kvf_model_destroy(a);
    kvf_model_destroy(b);
}

/* kvf_engine_flops counts the keys each new token reads: all before it,
 * at most the window on a sliding-window layer; checked against a count
 * position by position across the window's edge. */
static void test_flops_windows(void **state)
{
    (void)state;
    kvf_model_config_t c = kvf_test_model_config(4, 2, false);
    c.n_layers = 3;
    double q_dim = (double)c.n_heads * c.head_dim;
    static const uint32_t starts[] = {0, 5, 15, 16, 17, 40};
    static const uint32_t news[] = {0, 1, 3, 16, 33};
    for (int window = 0; window <= 16; window += 8) {
        c.sliding_window = window;
        c.window_first_layer = 1;
        for (size_t a = 0; a < sizeof(starts) / sizeof(starts[0]); a++) {
            for (size_t b = 0; b < sizeof(news) / sizeof(news[0]); b++) {
                double keys = 0;
                for (int l = 0; l < c.n_layers; l++) {
                    for (uint32_t i = 0; i < news[b]; i++) {
                        double k = (double)starts[a] + i + 1;
                        keys += l >= 1 && window && k > window ? window : k;
                    }
                }
                double base = kvf_engine_flops(&c, starts[a], news[b], 1);
                c.sliding_window = 0;
                double full_keys = 0;
                for (uint32_t i = 0; i < news[b]; i++)
                    full_keys += c.n_layers * ((double)starts[a] + i + 1);
                double full = kvf_engine_flops(&c, starts[a], news[b], 1);
                c.sliding_window = window;
                /* the difference from full attention is the keys not read */
                assert_float_equal(full - base, 4.0 * q_dim * (full_keys - keys), 1e-6);
            }
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_weights),
        cmocka_unit_test(test_cache_vs_recompute_gqa_mha_mqa),
        cmocka_unit_test(test_cache_vs_recompute_qwen3_window),
        cmocka_unit_test(test_chunked_prefill_and_block_sizes),
        cmocka_unit_test(test_mixed_batch),
        cmocka_unit_test(test_isas_threads_chunks),
        cmocka_unit_test(test_one_model_per_backend),
        cmocka_unit_test(test_hook_and_validation),
        cmocka_unit_test(test_generate_cli),
        cmocka_unit_test(test_bench_smoke),
        cmocka_unit_test(test_flops_windows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
