/* Engine golden tests: the golden models' outputs (expected.json, from an
 * independent float64 reference; tests/data/golden/README.md) on every
 * instruction set this machine runs: last logits within 1e-4, every
 * position's argmax and 24 greedy steps with the cache exact; and the hash
 * of every logit bit against tests/data/numerics_bits.json. */
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

/* ---- golden --------------------------------------------------------- */

/* Checks name's golden outputs on isa; returns a hash of every logit bit
 * it computed (each prompt's positions, then each greedy step's). */
static uint64_t check_golden(const char *name, kvf_cpu_isa_t isa)
{
    cJSON *root = kvf_test_load_expected(KVF_TEST_DATA);
    const cJSON *mj = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "models"), name);
    assert_non_null(mj);
    kvf_model_t *model = kvf_test_load_golden(KVF_TEST_DATA, name);
    kvf_test_rig_t r;
    kvf_test_rig_open_isa(&r, model, 16, 64, isa, 2, KVF_CPU_WEIGHTS_NATIVE);
    const int V = model->cfg.vocab;
    uint64_t h = 0xcbf29ce484222325ull;
    const cJSON *pj;
    int n_prompts = 0;
    cJSON_ArrayForEach(pj, cJSON_GetObjectItem(mj, "prompts"))
    {
        int n;
        uint32_t *ids = kvf_test_json_ids(cJSON_GetObjectItem(pj, "ids"), &n);
        float *all = malloc((size_t)n * V * sizeof(float));
        float *last = malloc((size_t)V * sizeof(float));
        kvf_block_table_t bt;
        kvf_block_table_init(&bt);
        kvf_test_run_chunked(&r, &bt, ids, n, n, all, last);
        h = kvf_fnv64(h, all, (size_t)n * V * sizeof(float));
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
        uint32_t *greedy = kvf_test_json_ids(cJSON_GetObjectItem(pj, "greedy_ids"), &n_greedy);
        uint32_t tok = kvf_sample_argmax(last, V);
        for (int s = 0; s < n_greedy; s++) {
            assert_int_equal(tok, greedy[s]);
            uint32_t pos = (uint32_t)(n + s);
            assert_int_equal(kvf_block_table_reserve(&bt, r.pool, pos + 1), KVF_OK);
            kvf_engine_seq_t q = {.tokens = &tok,
                                  .n_tokens = 1,
                                  .start_pos = pos,
                                  .block_ids = bt.blocks,
                                  .n_blocks = bt.n_blocks,
                                  .logits = last};
            assert_int_equal(kvf_engine_forward(r.engine, &q, 1, NULL), KVF_OK);
            h = kvf_fnv64(h, last, (size_t)V * sizeof(float));
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
    kvf_test_rig_close(&r);
    kvf_model_destroy(model);
    cJSON_Delete(root);
    return h;
}

/* Golden outputs on every instruction set this machine runs. */
static void test_golden_llama(void **state)
{
    (void)state;
    kvf_cpu_isa_t isas[KVF_CPU_ISA_COUNT];
    int n = kvf_test_cpu_isas(isas);
    for (int i = 0; i < n; i++)
        check_golden("tiny-llama-f32", isas[i]);
}

static void test_golden_qwen2(void **state)
{
    (void)state;
    kvf_cpu_isa_t isas[KVF_CPU_ISA_COUNT];
    int n = kvf_test_cpu_isas(isas);
    for (int i = 0; i < n; i++)
        check_golden("tiny-qwen2-bf16", isas[i]);
}

/* Qwen3 (q/k norms, head_dim 24 != hidden / heads, the window on layer 1
 * only) and Mistral with a 16-position window on every layer, over
 * prompts and greedy steps that cross the window and block boundaries. */
static void test_golden_qwen3(void **state)
{
    (void)state;
    kvf_cpu_isa_t isas[KVF_CPU_ISA_COUNT];
    int n = kvf_test_cpu_isas(isas);
    for (int i = 0; i < n; i++)
        check_golden("tiny-qwen3-f32", isas[i]);
}

static void test_golden_sliding_window(void **state)
{
    (void)state;
    kvf_cpu_isa_t isas[KVF_CPU_ISA_COUNT];
    int n = kvf_test_cpu_isas(isas);
    for (int i = 0; i < n; i++)
        check_golden("tiny-mistral-sw-f32", isas[i]);
}

/* Gemma2: scaled embeddings, four (1 + w) norms per layer, GeGLU, scores
 * scaled by query_pre_attn_scalar 24 (not head_dim 16) and soft-capped at
 * 5, the window of 16 on layers 0 and 2 and not on layer 1, final logits
 * capped at 10: each of them moves the logits far beyond 1e-4. */
static void test_golden_gemma2(void **state)
{
    (void)state;
    kvf_cpu_isa_t isas[KVF_CPU_ISA_COUNT];
    int n = kvf_test_cpu_isas(isas);
    for (int i = 0; i < n; i++)
        check_golden("tiny-gemma2-f32", isas[i]);
}

/* ---- the bits themselves -------------------------------------------- */

/* tests/data/numerics_bits.json, parsed. */
static cJSON *load_recorded_bits(void)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/numerics_bits.json", KVF_TEST_DATA);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char text[8192];
    size_t len = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    assert_true(len < sizeof(text) - 1);
    text[len] = 0;
    cJSON *rec = cJSON_Parse(text);
    assert_non_null(rec);
    return rec;
}

/* The hash of every logit bit of the golden models' prompts (all
 * positions, then the greedy steps) on every ISA this machine runs,
 * against the value recorded in tests/data/numerics_bits.json on another
 * machine: the numerics do not depend on the CPU the tests run on. A
 * deliberate change of the numerics records new values: KVF_RECORD_BITS=1
 * prints them. */
static void test_recorded_bits(void **state)
{
    (void)state;
    cJSON *rec = load_recorded_bits();
    const char *names[] = {"tiny-llama-f32", "tiny-qwen2-bf16", "tiny-qwen3-f32",
                           "tiny-mistral-sw-f32", "tiny-gemma2-f32"};
    const int n_names = (int)(sizeof(names) / sizeof(names[0]));
    kvf_cpu_isa_t isas[KVF_CPU_ISA_COUNT];
    int n_isa = kvf_test_cpu_isas(isas);
    bool record = getenv("KVF_RECORD_BITS") != NULL;
    for (int m = 0; m < n_names; m++) {
        const cJSON *want = cJSON_GetObjectItem(rec, names[m]);
        assert_true(record || cJSON_IsString(want));
        for (int i = 0; i < n_isa; i++) {
            char got[32];
            snprintf(got, sizeof(got), "%016llx",
                     (unsigned long long)check_golden(names[m], isas[i]));
            if (record)
                printf("\"%s\": \"%s\" (%s)\n", names[m], got, kvf_cpu_isa_name(isas[i]));
            else if (strcmp(got, want->valuestring) != 0)
                fail_msg("%s on %s: logit bits hash %s, recorded %s (numerics changed; "
                         "KVF_RECORD_BITS=1 prints new values)",
                         names[m], kvf_cpu_isa_name(isas[i]), got, want->valuestring);
        }
    }
    cJSON_Delete(rec);
}

/* ---- KV formats ------------------------------------------------------ */

/* name's golden prompts with a pool of dt on isa, the f32 greedy ids
 * forced: how many of the greedy steps' argmax agree with f32's (the
 * reference's, which f32 matches exactly), out of *steps_p; *hash_p the
 * hash of every logit bit. */
static int kv_agreement(const char *name, kvf_kv_dtype_t dt, kvf_cpu_isa_t isa, int *steps_p,
                        uint64_t *hash_p)
{
    cJSON *root = kvf_test_load_expected(KVF_TEST_DATA);
    const cJSON *mj = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "models"), name);
    kvf_model_t *model = kvf_test_load_golden(KVF_TEST_DATA, name);
    kvf_test_rig_t r;
    kvf_test_rig_open_kv(&r, model, 16, 64, isa, 2, KVF_CPU_WEIGHTS_NATIVE, dt);
    const int V = model->cfg.vocab;
    float *last = malloc((size_t)V * sizeof(float));
    uint64_t h = 0xcbf29ce484222325ull;
    int agree = 0, steps = 0;
    const cJSON *pj;
    cJSON_ArrayForEach(pj, cJSON_GetObjectItem(mj, "prompts"))
    {
        int n, n_greedy;
        uint32_t *ids = kvf_test_json_ids(cJSON_GetObjectItem(pj, "ids"), &n);
        uint32_t *greedy = kvf_test_json_ids(cJSON_GetObjectItem(pj, "greedy_ids"), &n_greedy);
        kvf_block_table_t bt;
        kvf_block_table_init(&bt);
        kvf_test_run_chunked(&r, &bt, ids, n, n, NULL, last);
        for (int s = 0; s < n_greedy; s++) {
            h = kvf_fnv64(h, last, (size_t)V * sizeof(float));
            agree += kvf_sample_argmax(last, V) == greedy[s];
            steps++;
            if (s + 1 == n_greedy)
                break;
            uint32_t pos = (uint32_t)(n + s);
            assert_int_equal(kvf_block_table_reserve(&bt, r.pool, pos + 1), KVF_OK);
            kvf_engine_seq_t q = {.tokens = &greedy[s],
                                  .n_tokens = 1,
                                  .start_pos = pos,
                                  .block_ids = bt.blocks,
                                  .n_blocks = bt.n_blocks,
                                  .logits = last};
            assert_int_equal(kvf_engine_forward(r.engine, &q, 1, NULL), KVF_OK);
        }
        kvf_block_table_release(&bt, r.pool);
        kvf_block_table_fini(&bt);
        free(greedy);
        free(ids);
    }
    free(last);
    kvf_test_rig_close(&r);
    kvf_model_destroy(model);
    cJSON_Delete(root);
    *steps_p = steps;
    *hash_p = h;
    return agree;
}

/* Every golden model with f16, bf16, fp8 and int8 pools: the same logit
 * bits on every instruction set, recorded in numerics_bits.json as
 * "<model>/kv-<format>"; f16 and bf16 agree with f32's greedy steps on at
 * least 99% of them (each format's count printed). */
static void test_kv_formats(void **state)
{
    (void)state;
    cJSON *rec = load_recorded_bits();
    const char *names[] = {"tiny-llama-f32", "tiny-qwen2-bf16", "tiny-qwen3-f32",
                           "tiny-mistral-sw-f32", "tiny-gemma2-f32"};
    kvf_cpu_isa_t isas[KVF_CPU_ISA_COUNT];
    int n_isa = kvf_test_cpu_isas(isas);
    bool record = getenv("KVF_RECORD_BITS") != NULL;
    for (int dt = KVF_KV_F16; dt < KVF_KV_N_DTYPES; dt++) {
        int agree = 0, steps = 0;
        for (int m = 0; m < 5; m++) {
            char key[64];
            snprintf(key, sizeof(key), "%s/kv-%s", names[m], kvf_kv_dtype_name(dt));
            const cJSON *want = cJSON_GetObjectItem(rec, key);
            assert_true(record || cJSON_IsString(want));
            for (int i = 0; i < n_isa; i++) {
                int st;
                uint64_t h;
                int a = kv_agreement(names[m], (kvf_kv_dtype_t)dt, isas[i], &st, &h);
                char got[32];
                snprintf(got, sizeof(got), "%016llx", (unsigned long long)h);
                if (record)
                    printf("\"%s\": \"%s\" (%s)\n", key, got, kvf_cpu_isa_name(isas[i]));
                else if (strcmp(got, want->valuestring) != 0)
                    fail_msg("%s on %s: logit bits hash %s, recorded %s", key,
                             kvf_cpu_isa_name(isas[i]), got, want->valuestring);
                if (i == 0) {
                    agree += a;
                    steps += st;
                }
            }
        }
        printf("kv %s: greedy agreement with f32 %d of %d steps (%.1f%%)\n",
               kvf_kv_dtype_name(dt), agree, steps, 100.0 * agree / steps);
        if (dt == KVF_KV_F16 || dt == KVF_KV_BF16)
            assert_true(agree * 100 >= steps * 99);
    }
    cJSON_Delete(rec);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_llama),  cmocka_unit_test(test_golden_qwen2),
        cmocka_unit_test(test_golden_qwen3),  cmocka_unit_test(test_golden_sliding_window),
        cmocka_unit_test(test_golden_gemma2), cmocka_unit_test(test_recorded_bits),
        cmocka_unit_test(test_kv_formats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
