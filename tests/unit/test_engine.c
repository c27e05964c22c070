/* Engine tests: golden outputs of both golden models (expected.json, from
 * an independent float64 reference), and invariances of the forward pass
 * (cache vs recompute, chunking, batching, block sizes, GQA/MHA/MQA),
 * portable vs AVX-512 kernels, and `kvf generate` end to end. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kvf/backend.h"
#include "kvf/engine.h"
#include "kvf/kvcache.h"
#include "kvf/log.h"
#include "kvf/model.h"
#include "kvf/sampling.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- helpers -------------------------------------------------------- */

typedef struct {
    kvf_model_t *model;
    kvf_backend_t be;
    kvf_kvpool_t *pool;
    kvf_engine_t *engine;
} rig_t;

static void rig_open(rig_t *r, kvf_model_t *model, int block_size, uint32_t num_blocks,
                     bool simd)
{
    memset(r, 0, sizeof(*r));
    r->model = model;
    assert_int_equal(kvf_backend_cpu_create_ex(2, simd, &r->be), KVF_OK);
    kvf_kv_geometry_t g = kvf_engine_kv_geometry(model, block_size);
    assert_int_equal(kvf_kvpool_create(&g, num_blocks, &r->pool), KVF_OK);
    assert_int_equal(kvf_engine_create(model, &r->be, r->pool, &r->engine), KVF_OK);
}

static void rig_close(rig_t *r)
{
    kvf_engine_destroy(r->engine);
    kvf_kvpool_destroy(r->pool);
    kvf_backend_destroy(&r->be);
}

static kvf_model_t *load_golden(const char *name)
{
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s/golden/%s", KVF_TEST_DATA, name);
    kvf_model_t *m = NULL;
    assert_int_equal(kvf_model_load(dir, &m), KVF_OK);
    return m;
}

static cJSON *load_expected(void)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/golden/expected.json", KVF_TEST_DATA);
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    rewind(fp);
    char *text = malloc((size_t)n + 1);
    assert_non_null(text);
    assert_int_equal(fread(text, 1, (size_t)n, fp), (size_t)n);
    text[n] = 0;
    fclose(fp);
    cJSON *root = cJSON_Parse(text);
    free(text);
    assert_non_null(root);
    return root;
}

static uint32_t *json_ids(const cJSON *arr, int *n_p)
{
    int n = cJSON_GetArraySize(arr);
    uint32_t *ids = malloc((size_t)n * sizeof(*ids));
    assert_non_null(ids);
    for (int i = 0; i < n; i++)
        ids[i] = (uint32_t)cJSON_GetArrayItem(arr, i)->valueint;
    *n_p = n;
    return ids;
}

/* Runs a sequence of `chunks` forward calls over prompt (sizes chunk each,
 * last one smaller) into a fresh block table; returns logits of every
 * position in all (n, vocab) when all != NULL, and the last position's in
 * last (vocab). Leaves the table allocated in *bt. */
static void run_chunked(rig_t *r, kvf_block_table_t *bt, const uint32_t *ids, int n, int chunk,
                        float *all, float *last)
{
    int V = r->model->cfg.vocab;
    assert_int_equal(kvf_block_table_reserve(bt, r->pool, (uint32_t)n), KVF_OK);
    for (int s = 0; s < n; s += chunk) {
        int c = n - s < chunk ? n - s : chunk;
        kvf_engine_seq_t q = {.tokens = ids + s, .n_tokens = (uint32_t)c,
                              .start_pos = (uint32_t)s, .block_ids = bt->blocks,
                              .n_blocks = bt->n_blocks, .all_logits = all != NULL,
                              .logits = all ? all + (size_t)s * V : NULL};
        if (!all && s + c == n)
            q.logits = last;
        assert_int_equal(kvf_engine_forward(r->engine, &q, 1, NULL), KVF_OK);
    }
    if (all && last)
        memcpy(last, all + (size_t)(n - 1) * V, (size_t)V * sizeof(float));
}

static float max_abs_diff(const float *a, const float *b, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        m = d > m ? d : m;
    }
    return m;
}

/* max |a-b| / max(1, max|b|): relative to the logits' scale. */
__attribute__((unused)) static float rel_diff(const float *a, const float *b, size_t n)
{
    float scale = 1;
    for (size_t i = 0; i < n; i++)
        scale = fabsf(b[i]) > scale ? fabsf(b[i]) : scale;
    return max_abs_diff(a, b, n) / scale;
}

/* ---- golden --------------------------------------------------------- */

static void check_golden(const char *name, bool simd)
{
    cJSON *root = load_expected();
    const cJSON *mj = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "models"), name);
    assert_non_null(mj);
    kvf_model_t *model = load_golden(name);
    rig_t r;
    rig_open(&r, model, 16, 64, simd);
    const int V = model->cfg.vocab;
    const cJSON *pj;
    int n_prompts = 0;
    cJSON_ArrayForEach(pj, cJSON_GetObjectItem(mj, "prompts"))
    {
        int n;
        uint32_t *ids = json_ids(cJSON_GetObjectItem(pj, "ids"), &n);
        float *all = malloc((size_t)n * V * sizeof(float));
        float *last = malloc((size_t)V * sizeof(float));
        kvf_block_table_t bt;
        kvf_block_table_init(&bt);
        run_chunked(&r, &bt, ids, n, n, all, last);
        /* last_logits within 1e-4 */
        const cJSON *ll = cJSON_GetObjectItem(pj, "last_logits");
        assert_int_equal(cJSON_GetArraySize(ll), V);
        float worst = 0;
        for (int i = 0; i < V; i++) {
            float d = fabsf(last[i] - (float)cJSON_GetArrayItem(ll, i)->valuedouble);
            worst = d > worst ? d : worst;
        }
        if (worst > 1e-4f)
            fail_msg("%s prompt %d: max |logit - expected| = %g", name, n_prompts, worst);
        /* position_argmax */
        const cJSON *pa = cJSON_GetObjectItem(pj, "position_argmax");
        assert_int_equal(cJSON_GetArraySize(pa), n);
        for (int i = 0; i < n; i++)
            assert_int_equal(kvf_sample_argmax(all + (size_t)i * V, V),
                             cJSON_GetArrayItem(pa, i)->valueint);
        /* 24 greedy steps with the cache */
        int n_greedy;
        uint32_t *greedy = json_ids(cJSON_GetObjectItem(pj, "greedy_ids"), &n_greedy);
        uint32_t tok = kvf_sample_argmax(last, V);
        for (int s = 0; s < n_greedy; s++) {
            assert_int_equal(tok, greedy[s]);
            uint32_t pos = (uint32_t)(n + s);
            assert_int_equal(kvf_block_table_reserve(&bt, r.pool, pos + 1), KVF_OK);
            kvf_engine_seq_t q = {.tokens = &tok, .n_tokens = 1, .start_pos = pos,
                                  .block_ids = bt.blocks, .n_blocks = bt.n_blocks,
                                  .logits = last};
            assert_int_equal(kvf_engine_forward(r.engine, &q, 1, NULL), KVF_OK);
            tok = kvf_sample_argmax(last, V);
        }
        kvf_block_table_release(&bt, r.pool);
        kvf_block_table_fini(&bt);
        assert_int_equal(kvf_kvpool_used_blocks(r.pool), 0);
        free(greedy);
        free(all);
        free(last);
        free(ids);
        n_prompts++;
    }
    assert_int_equal(n_prompts, 4);
    rig_close(&r);
    kvf_model_destroy(model);
    cJSON_Delete(root);
}

static void test_golden_llama(void **state)
{
    (void)state;
    check_golden("tiny-llama-f32", true);
}

static void test_golden_qwen2(void **state)
{
    (void)state;
    check_golden("tiny-qwen2-bf16", true);
}

static void test_golden_portable(void **state)
{
    (void)state;
    check_golden("tiny-llama-f32", false);
    check_golden("tiny-qwen2-bf16", false);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_llama),
        cmocka_unit_test(test_golden_qwen2),
        cmocka_unit_test(test_golden_portable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
