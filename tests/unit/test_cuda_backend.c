/* The CUDA backend against the CPU backend and the golden data (label gpu).
 * Exits 77 (ctest: skipped) with a message where there is no GPU or the
 * build has no CUDA.
 *
 *  - golden: the golden models with f32 weights on the GPU: last logits
 *    within 1e-4 of expected.json, every position's argmax and 24 greedy
 *    ids identical; with bf16 weights, logits within bf16 tolerance of the
 *    CPU backend;
 *  - a model with Llama-1B-like heads (head_dim 64, 4 query heads per kv
 *    head) over 1,100 positions: prefill tiles and several decode splits,
 *    CPU vs CUDA;
 *  - invariances on the GPU: cache == recompute, chunked == one prefill,
 *    mixed prefill+decode batch == separate runs, block sizes 1/16/256,
 *    graphs on == off bit for bit, greedy_token == argmax(logits);
 *  - the host mirror: after a forward with kv_to_host, the hooks ran in
 *    layer order and the mirror holds the CPU backend's K/V; blocks copied
 *    into another pool's mirror and uploaded decode as the original. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kvf/backend.h"
#include "kvf/engine.h"
#include "kvf/gpu.h"
#include "kvf/kvcache.h"
#include "kvf/log.h"
#include "kvf/model.h"
#include "kvf/sampling.h"
#include "support.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_data[1024];

/* ---- rigs ------------------------------------------------------------ */

typedef struct {
    kvf_model_t *model;
    kvf_backend_t be;
    kvf_kvpool_t *pool;
    kvf_engine_t *engine;
} rig_t;

static void rig_cpu_kv(rig_t *r, kvf_model_t *model, int block_size, uint32_t num_blocks,
                       kvf_kv_dtype_t kv)
{
    memset(r, 0, sizeof(*r));
    r->model = model;
    assert_int_equal(kvf_backend_cpu_create(2, &r->be), KVF_OK);
    kvf_kv_geometry_t g = kvf_engine_kv_geometry(model, block_size, kv);
    assert_int_equal(kvf_kvpool_create(&g, num_blocks, &r->pool), KVF_OK);
    assert_int_equal(kvf_engine_create(model, &r->be, r->pool, &r->engine), KVF_OK);
}

static void rig_cpu(rig_t *r, kvf_model_t *model, int block_size, uint32_t num_blocks)
{
    rig_cpu_kv(r, model, block_size, num_blocks, KVF_KV_F32);
}

static void rig_cuda_kv(rig_t *r, kvf_model_t *model, int block_size, uint32_t num_blocks,
                        kvf_dtype_t wdt, bool graphs, bool mirror, kvf_kv_dtype_t kv)
{
    memset(r, 0, sizeof(*r));
    r->model = model;
    kvf_cuda_config_t cc = kvf_cuda_config_default();
    cc.wdtype = wdt;
    cc.cuda_graphs = graphs;
    assert_int_equal(kvf_backend_cuda_create(&cc, model, &r->be), KVF_OK);
    assert_true(kvf_backend_is_cuda(&r->be));
    kvf_kv_geometry_t g = kvf_engine_kv_geometry(model, block_size, kv);
    assert_int_equal(kvf_backend_cuda_kvpool_create(&r->be, &g, num_blocks, mirror, &r->pool),
                     KVF_OK);
    assert_non_null(kvf_kvpool_device_base(r->pool));
    assert_int_equal(kvf_engine_create(model, &r->be, r->pool, &r->engine), KVF_OK);
}

static void rig_cuda(rig_t *r, kvf_model_t *model, int block_size, uint32_t num_blocks,
                     kvf_dtype_t wdt, bool graphs, bool mirror)
{
    rig_cuda_kv(r, model, block_size, num_blocks, wdt, graphs, mirror, KVF_KV_F32);
}

static void rig_close(rig_t *r)
{
    kvf_engine_destroy(r->engine);
    kvf_kvpool_destroy(r->pool);
    kvf_backend_destroy(&r->be);
}

/* One forward of tokens [s, s + c) of ids for the table bt. */
static void forward(rig_t *r, kvf_block_table_t *bt, const uint32_t *ids, int s, int c,
                    float *logits, bool all)
{
    assert_int_equal(kvf_block_table_reserve(bt, r->pool, (uint32_t)(s + c)), KVF_OK);
    kvf_engine_seq_t q = {.tokens = ids + s,
                          .n_tokens = (uint32_t)c,
                          .start_pos = (uint32_t)s,
                          .block_ids = bt->blocks,
                          .n_blocks = bt->n_blocks,
                          .all_logits = all,
                          .logits = logits};
    assert_int_equal(kvf_engine_forward(r->engine, &q, 1, NULL), KVF_OK);
}

/* A random model of this geometry (support.h), 4096 positions. */
static kvf_model_t *random_model(int layers, int hidden, int heads, int kv_heads, int head_dim,
                                 int inter, int vocab, bool qwen2)
{
    kvf_model_config_t c = kvf_test_model_config(heads, kv_heads, qwen2);
    c.n_layers = layers;
    c.hidden = hidden;
    c.head_dim = head_dim;
    c.inter = inter;
    c.vocab = vocab;
    c.max_pos = 4096;
    c.rope_theta = 500000;
    return kvf_test_random_model(&c, 7);
}

/* ---- golden ---------------------------------------------------------- */

/* The rigs a golden model runs on (f32 and bf16 weights on the GPU, the CPU
 * backend), and what the bf16 rig gave over the prompts. */
typedef struct {
    const char *name;
    int V;
    rig_t r32, r16, cpu;
    float worst_bf16;
    int bf16_greedy_same, bf16_greedy_total;
} golden_t;

/* One prompt's runs on the three rigs: tables and every position's logits. */
typedef struct {
    int n;
    kvf_block_table_t bt, bt16, btc;
    float *all, *all16, *allc;
} golden_prompt_t;

/* The prompt ids[0, n) as one prefill on each rig, all logits kept. */
static void golden_prefill(golden_t *g, golden_prompt_t *p, const uint32_t *ids, int n)
{
    p->n = n;
    p->all = malloc((size_t)n * g->V * sizeof(float));
    p->all16 = malloc((size_t)n * g->V * sizeof(float));
    p->allc = malloc((size_t)n * g->V * sizeof(float));
    kvf_block_table_init(&p->bt);
    kvf_block_table_init(&p->bt16);
    kvf_block_table_init(&p->btc);
    forward(&g->r32, &p->bt, ids, 0, n, p->all, true);
    forward(&g->r16, &p->bt16, ids, 0, n, p->all16, true);
    forward(&g->cpu, &p->btc, ids, 0, n, p->allc, true);
}

/* f32 weights: last logits within 1e-4 of expected.json, every position's
 * argmax as recorded. */
static void golden_check_f32(const golden_t *g, const golden_prompt_t *p, const cJSON *pj,
                             int prompt)
{
    const int V = g->V;
    const cJSON *ll = cJSON_GetObjectItem(pj, "last_logits");
    const float *l32 = p->all + (size_t)(p->n - 1) * V;
    float worst = 0;
    for (int i = 0; i < V; i++) {
        float d = fabsf(l32[i] - (float)cJSON_GetArrayItem(ll, i)->valuedouble);
        worst = d > worst || isnan(d) ? d : worst;
    }
    if (!(worst <= 1e-4f))
        fail_msg("%s prompt %d (f32 weights on the GPU): max |logit - expected| = %g", g->name,
                 prompt, worst);
    const cJSON *pa = cJSON_GetObjectItem(pj, "position_argmax");
    for (int i = 0; i < p->n; i++)
        assert_int_equal(kvf_sample_argmax(p->all + (size_t)i * V, V),
                         cJSON_GetArrayItem(pa, i)->valueint);
}

/* One cached decode step of tok at pos on the f32 rig; returns the host's
 * argmax of its logits, which the device's greedy token must equal. */
static uint32_t golden_decode_f32(golden_t *g, golden_prompt_t *p, uint32_t tok, int pos,
                                  float *last)
{
    uint32_t dev = UINT32_MAX;
    assert_int_equal(kvf_block_table_reserve(&p->bt, g->r32.pool, (uint32_t)(pos + 1)), KVF_OK);
    kvf_engine_seq_t q = {.tokens = &tok,
                          .n_tokens = 1,
                          .start_pos = (uint32_t)pos,
                          .block_ids = p->bt.blocks,
                          .n_blocks = p->bt.n_blocks,
                          .logits = last,
                          .greedy_token = &dev};
    assert_int_equal(kvf_engine_forward(g->r32.engine, &q, 1, NULL), KVF_OK);
    uint32_t host = kvf_sample_argmax(last, g->V);
    assert_int_equal(dev, host); /* the device argmax agrees with the host's */
    return host;
}

/* One cached decode step of *tok at pos on the bf16 rig: it follows the
 * expected ids (teacher forcing) and only reports its own argmax. */
static void golden_decode_bf16(golden_t *g, golden_prompt_t *p, const uint32_t *tok, int pos,
                               uint32_t *tok16_p)
{
    assert_int_equal(kvf_block_table_reserve(&p->bt16, g->r16.pool, (uint32_t)(pos + 1)), KVF_OK);
    kvf_engine_seq_t q16 = {.tokens = tok,
                            .n_tokens = 1,
                            .start_pos = (uint32_t)pos,
                            .block_ids = p->bt16.blocks,
                            .n_blocks = p->bt16.n_blocks,
                            .greedy_token = tok16_p};
    assert_int_equal(kvf_engine_forward(g->r16.engine, &q16, 1, NULL), KVF_OK);
}

/* The greedy steps with the cache: f32 equal to the expected ids
 * (asserted), bf16 counted. */
static void golden_greedy(golden_t *g, golden_prompt_t *p, const uint32_t *greedy, int n_greedy)
{
    const int V = g->V, n = p->n;
    float *last = malloc((size_t)V * sizeof(float));
    uint32_t tok = kvf_sample_argmax(p->all + (size_t)(n - 1) * V, V),
             tok16 = kvf_sample_argmax(p->all16 + (size_t)(n - 1) * V, V);
    for (int s = 0; s < n_greedy; s++) {
        assert_int_equal(tok, greedy[s]);
        g->bf16_greedy_same += tok16 == greedy[s];
        g->bf16_greedy_total++;
        tok = golden_decode_f32(g, p, tok, n + s, last);
        golden_decode_bf16(g, p, &greedy[s], n + s, &tok16);
    }
    free(last);
}

static void golden_prompt_free(golden_t *g, golden_prompt_t *p)
{
    kvf_block_table_release(&p->bt, g->r32.pool);
    kvf_block_table_release(&p->bt16, g->r16.pool);
    kvf_block_table_release(&p->btc, g->cpu.pool);
    kvf_block_table_fini(&p->bt);
    kvf_block_table_fini(&p->bt16);
    kvf_block_table_fini(&p->btc);
    free(p->all);
    free(p->all16);
    free(p->allc);
}

/* One prompt of expected.json: the f32 checks, the bf16 logits against the
 * CPU backend's, then the greedy steps. */
static void golden_prompt(golden_t *g, const cJSON *pj, int prompt)
{
    int n, n_greedy;
    uint32_t *ids = kvf_test_json_ids(cJSON_GetObjectItem(pj, "ids"), &n);
    uint32_t *greedy = kvf_test_json_ids(cJSON_GetObjectItem(pj, "greedy_ids"), &n_greedy);
    golden_prompt_t p;
    golden_prefill(g, &p, ids, n);
    golden_check_f32(g, &p, pj, prompt);
    float rd = kvf_test_rel_diff(p.all16, p.allc, (size_t)n * g->V);
    g->worst_bf16 = rd > g->worst_bf16 || isnan(rd) ? rd : g->worst_bf16;
    golden_greedy(g, &p, greedy, n_greedy);
    golden_prompt_free(g, &p);
    free(greedy);
    free(ids);
}

static void golden(const char *name)
{
    cJSON *root = kvf_test_load_expected(g_data);
    const cJSON *mj = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "models"), name);
    assert_non_null(mj);
    kvf_model_t *model = kvf_test_load_golden(g_data, name);
    golden_t g = {.name = name, .V = model->cfg.vocab};
    rig_cuda(&g.r32, model, 16, 64, KVF_DTYPE_F32, true, false);
    rig_cuda(&g.r16, model, 16, 64, KVF_DTYPE_BF16, true, false);
    rig_cpu(&g.cpu, model, 16, 64);
    const cJSON *pj;
    int n_prompts = 0;
    cJSON_ArrayForEach(pj, cJSON_GetObjectItem(mj, "prompts"))
    {
        golden_prompt(&g, pj, n_prompts);
        n_prompts++;
    }
    assert_int_equal(n_prompts, 4);
    printf("%s: bf16 weights: max |logit - cpu| / max|logit| = %.4f; greedy ids equal to the "
           "f32 reference at %d of %d steps\n",
           name, (double)g.worst_bf16, g.bf16_greedy_same, g.bf16_greedy_total);
    if (!(g.worst_bf16 <= 3e-2f))
        fail_msg("%s: bf16 logits off the CPU backend's by %g of their scale", name,
                 (double)g.worst_bf16);
    rig_close(&g.r32);
    rig_close(&g.r16);
    rig_close(&g.cpu);
    kvf_model_destroy(model);
    cJSON_Delete(root);
}

static void test_golden_llama(void **state)
{
    (void)state;
    golden("tiny-llama-f32");
}

static void test_golden_qwen2(void **state)
{
    (void)state;
    golden("tiny-qwen2-bf16");
}

/* Qwen3 (q/k norms in qkv_rope_write, head_dim 24) and a 16-position
 * sliding window on every layer (all three attention kernels). */
static void test_golden_qwen3(void **state)
{
    (void)state;
    golden("tiny-qwen3-f32");
}

static void test_golden_sliding_window(void **state)
{
    (void)state;
    golden("tiny-mistral-sw-f32");
}

/* Gemma2: the embedding normalizer, post-norms, GeGLU, scaled and
 * soft-capped scores (the window on layers 0 and 2), soft-capped logits. */
static void test_golden_gemma2(void **state)
{
    (void)state;
    golden("tiny-gemma2-f32");
}

/* ---- production-like heads, long context ------------------------------- */

/* head_dim 64, 4 query heads per kv head (as Llama 3.2 1B), 1,100
 * positions: several prefill tiles per sequence and 3 decode splits. */
static void test_long_context_vs_cpu(void **state)
{
    (void)state;
    kvf_model_t *m = random_model(2, 512, 8, 2, 64, 1024, 1000, false);
    const int V = m->cfg.vocab, n = 1100;
    uint32_t ids[1104];
    kvf_test_random_ids(ids, n + 4, V, 99);
    rig_t g32, g16, cpu;
    rig_cuda(&g32, m, 16, 80, KVF_DTYPE_F32, true, false);
    rig_cuda(&g16, m, 16, 80, KVF_DTYPE_BF16, true, false);
    rig_cpu(&cpu, m, 16, 80);
    float *lg = malloc((size_t)V * sizeof(float)), *lg16 = malloc((size_t)V * sizeof(float)),
          *lc = malloc((size_t)V * sizeof(float));
    kvf_block_table_t a, b, c;
    kvf_block_table_init(&a);
    kvf_block_table_init(&b);
    kvf_block_table_init(&c);
    /* prefill in chunks of 300 (the last one 200), then 4 decode steps */
    for (int s = 0; s < n; s += 300) {
        int k = n - s < 300 ? n - s : 300;
        forward(&g32, &a, ids, s, k, lg, false);
        forward(&g16, &b, ids, s, k, lg16, false);
        forward(&cpu, &c, ids, s, k, lc, false);
    }
    for (int s = n; s <= n + 4; s++) {
        float r32 = kvf_test_rel_diff(lg, lc, (size_t)V),
              r16 = kvf_test_rel_diff(lg16, lc, (size_t)V);
        if (!(r32 <= 1e-4f) || !(r16 <= 3e-2f))
            fail_msg("position %d: f32 off by %g, bf16 by %g (relative)", s - 1, (double)r32,
                     (double)r16);
        if (s == n + 4)
            break;
        forward(&g32, &a, ids, s, 1, lg, false);
        forward(&g16, &b, ids, s, 1, lg16, false);
        forward(&cpu, &c, ids, s, 1, lc, false);
    }
    kvf_block_table_release(&a, g32.pool);
    kvf_block_table_release(&b, g16.pool);
    kvf_block_table_release(&c, cpu.pool);
    kvf_block_table_fini(&a);
    kvf_block_table_fini(&b);
    kvf_block_table_fini(&c);
    free(lg);
    free(lg16);
    free(lc);
    rig_close(&g32);
    rig_close(&g16);
    rig_close(&cpu);
    kvf_model_destroy(m);
}

/* Every KV format through the whole engine: the GPU (f32 weights) and the
 * CPU backend on pools of the same format agree on the logits of a
 * chunked prefill and decode steps: both write the same encoding of
 * nearly equal K/V and decode it exactly.
 *
 * Nearly equal: the two backends sum in different orders (cuBLAS; under
 * the emulator OpenBLAS, whose order depends on the CPU it runs on), so a
 * K or V value an ulp apart can round to the neighbouring code, one step
 * of the format, and the logits move with it (a code in the cache moves
 * every later position). So each format has its own tolerance, between
 * two clusters measured on an AVX2 host over token seeds 1-11 (the worst
 * position of each run): the same format on both sides differed by at
 * most f16 4.4e-5, bf16 9.7e-5, fp8 1.4e-4, int8 2.9e-4; the format on
 * the GPU against an f32 cache on the CPU (seeds 3-5, 8, 9, 11) by at
 * least f16 1.7e-4, bf16 1.4e-3, int8 4.0e-3, fp8 1.7e-2. That second
 * half is checked too (past twice the tolerance), so each tolerance
 * still tells its format from f32; f16 excepted, whose step is as small
 * as the flips. */
#define KV_VS_POS 5
static void test_kv_formats_vs_cpu(void **state)
{
    (void)state;
    kvf_model_t *m = random_model(2, 256, 8, 2, 32, 512, 500, false);
    const int V = m->cfg.vocab, n = 90;
    uint32_t ids[96];
    kvf_test_random_ids(ids, n + 3, V, 5);
    float *lg = malloc((size_t)V * sizeof(float)), *lc = malloc((size_t)V * sizeof(float));
    float *l32 = malloc((size_t)KV_VS_POS * V * sizeof(float));
    /* the CPU on an f32 cache, at the positions compared below */
    {
        rig_t c32;
        rig_cpu_kv(&c32, m, 16, 16, KVF_KV_F32);
        kvf_block_table_t t;
        kvf_block_table_init(&t);
        for (int s = 0, i = 0; s < n + 3; s += s < n ? 45 : 1, i++)
            forward(&c32, &t, ids, s, s < n ? 45 : 1, l32 + (size_t)i * V, false);
        kvf_block_table_release(&t, c32.pool);
        kvf_block_table_fini(&t);
        rig_close(&c32);
    }
    /* f16, bf16, fp8, int8 (kvf_kv_dtype_t order) */
    static const float tols[KVF_KV_N_DTYPES] = {0, 1.5e-4f, 4e-4f, 2e-3f, 1e-3f};
    for (int kv = KVF_KV_F16; kv < KVF_KV_N_DTYPES; kv++) {
        const float tol = tols[kv];
        rig_t gpu, cpu;
        rig_cuda_kv(&gpu, m, 16, 16, KVF_DTYPE_F32, true, false, (kvf_kv_dtype_t)kv);
        rig_cpu_kv(&cpu, m, 16, 16, (kvf_kv_dtype_t)kv);
        kvf_block_table_t a, b;
        kvf_block_table_init(&a);
        kvf_block_table_init(&b);
        float worst_f32 = 0;
        for (int s = 0, i = 0; s < n + 3; s += s < n ? 45 : 1, i++) {
            int k = s < n ? 45 : 1;
            forward(&gpu, &a, ids, s, k, lg, false);
            forward(&cpu, &b, ids, s, k, lc, false);
            float r = kvf_test_rel_diff(lg, lc, (size_t)V);
            if (!(r <= tol))
                fail_msg("kv %s, position %d: off by %g (relative; tolerance %g)",
                         kvf_kv_dtype_name((kvf_kv_dtype_t)kv), s + k - 1, (double)r,
                         (double)tol);
            float r32 = kvf_test_rel_diff(lg, l32 + (size_t)i * V, (size_t)V);
            worst_f32 = r32 > worst_f32 ? r32 : worst_f32;
        }
        if (kv != KVF_KV_F16 && !(worst_f32 > 2 * tol))
            fail_msg("kv %s against an f32 cache: off by only %g, not past twice the "
                     "tolerance %g",
                     kvf_kv_dtype_name((kvf_kv_dtype_t)kv), (double)worst_f32, (double)tol);
        kvf_block_table_release(&a, gpu.pool);
        kvf_block_table_release(&b, cpu.pool);
        kvf_block_table_fini(&a);
        kvf_block_table_fini(&b);
        rig_close(&gpu);
        rig_close(&cpu);
    }
    free(lg);
    free(lc);
    free(l32);
    kvf_model_destroy(m);
}

/* ---- invariances on the GPU ------------------------------------------- */

static void test_cache_chunks_blocks(void **state)
{
    (void)state;
    kvf_model_t *m = random_model(2, 256, 4, 2, 64, 512, 700, true);
    const int V = m->cfg.vocab, n = 150;
    uint32_t ids[150];
    kvf_test_random_ids(ids, n, V, 5);
    float *ref = malloc((size_t)V * sizeof(float)), *got = malloc((size_t)V * sizeof(float));
    float *all = malloc((size_t)n * V * sizeof(float));
    /* reference: one prefill, block size 16 */
    rig_t r;
    rig_cuda(&r, m, 16, 32, KVF_DTYPE_F32, true, false);
    kvf_block_table_t bt;
    kvf_block_table_init(&bt);
    forward(&r, &bt, ids, 0, n, all, true);
    memcpy(ref, all + (size_t)(n - 1) * V, (size_t)V * sizeof(float));
    kvf_block_table_release(&bt, r.pool);
    /* cache == recompute: token by token */
    for (int s = 0; s < n; s++)
        forward(&r, &bt, ids, s, 1, got, false);
    assert_true(kvf_test_rel_diff(got, ref, (size_t)V) <= 1e-4f);
    kvf_block_table_release(&bt, r.pool);
    /* chunks of 37 */
    for (int s = 0; s < n; s += 37)
        forward(&r, &bt, ids, s, n - s < 37 ? n - s : 37, got, false);
    assert_true(kvf_test_rel_diff(got, ref, (size_t)V) <= 1e-4f);
    kvf_block_table_release(&bt, r.pool);
    rig_close(&r);
    /* block sizes */
    const int sizes[] = {1, 256};
    for (int i = 0; i < 2; i++) {
        rig_cuda(&r, m, sizes[i], sizes[i] == 1 ? 200 : 2, KVF_DTYPE_F32, true, false);
        forward(&r, &bt, ids, 0, n - 1, got, false);
        forward(&r, &bt, ids, n - 1, 1, got, false);
        float d = kvf_test_rel_diff(got, ref, (size_t)V);
        if (!(d <= 1e-4f))
            fail_msg("block size %d: off by %g", sizes[i], (double)d);
        kvf_block_table_release(&bt, r.pool);
        rig_close(&r);
    }
    kvf_block_table_fini(&bt);
    free(ref);
    free(got);
    free(all);
    kvf_model_destroy(m);
}

/* A batch mixing decodes and a prompt chunk equals each run alone; decode
 * steps replayed from graphs equal launched ones bit for bit. Three
 * sequences prefilled on two bf16 rigs, graphs on and off: */
enum { MIX_NS = 3, MIX_IDS = 760, MIX_STEPS = 40, MIX_CHUNK = 16 };
static const int mix_lens[MIX_NS] = {40, 700, 90};

typedef struct {
    kvf_model_t *m;
    int V;
    uint32_t ids[MIX_NS][MIX_IDS];
    rig_t gr, ng; /* graphs on, off */
    kvf_block_table_t tg[MIX_NS], tn[MIX_NS];
    float *lg, *ln; /* MIX_NS rows of logits each */
} mix_t;

static void mix_setup(mix_t *x)
{
    x->m = random_model(2, 256, 4, 1, 64, 512, 700, false);
    const int V = x->V = x->m->cfg.vocab;
    for (int s = 0; s < MIX_NS; s++)
        kvf_test_random_ids(x->ids[s], MIX_IDS, V, 11 + s);
    rig_cuda(&x->gr, x->m, 16, 200, KVF_DTYPE_BF16, true, false);
    rig_cuda(&x->ng, x->m, 16, 200, KVF_DTYPE_BF16, false, false);
    x->lg = malloc((size_t)MIX_NS * V * sizeof(float));
    x->ln = malloc((size_t)MIX_NS * V * sizeof(float));
    for (int s = 0; s < MIX_NS; s++) {
        kvf_block_table_init(&x->tg[s]);
        kvf_block_table_init(&x->tn[s]);
        forward(&x->gr, &x->tg[s], x->ids[s], 0, mix_lens[s], x->lg, false);
        forward(&x->ng, &x->tn[s], x->ids[s], 0, mix_lens[s], x->ln, false);
    }
}

/* Decode step `step` of all three at once on both rigs: logits equal bit
 * for bit, greedy tokens equal and equal to the argmax of the logits. */
static void mix_decode_step(mix_t *x, int step)
{
    const int V = x->V;
    kvf_engine_seq_t qg[MIX_NS], qn[MIX_NS];
    uint32_t gg[MIX_NS], gn[MIX_NS];
    for (int s = 0; s < MIX_NS; s++) {
        int p = mix_lens[s] + step;
        assert_int_equal(kvf_block_table_reserve(&x->tg[s], x->gr.pool, (uint32_t)p + 1), KVF_OK);
        assert_int_equal(kvf_block_table_reserve(&x->tn[s], x->ng.pool, (uint32_t)p + 1), KVF_OK);
        qg[s] = (kvf_engine_seq_t){.tokens = &x->ids[s][p],
                                   .n_tokens = 1,
                                   .start_pos = (uint32_t)p,
                                   .block_ids = x->tg[s].blocks,
                                   .n_blocks = x->tg[s].n_blocks,
                                   .logits = x->lg + (size_t)s * V,
                                   .greedy_token = &gg[s]};
        qn[s] = qg[s];
        qn[s].block_ids = x->tn[s].blocks;
        qn[s].n_blocks = x->tn[s].n_blocks;
        qn[s].logits = x->ln + (size_t)s * V;
        qn[s].greedy_token = &gn[s];
    }
    assert_int_equal(kvf_engine_forward(x->gr.engine, qg, MIX_NS, NULL), KVF_OK);
    assert_int_equal(kvf_engine_forward(x->ng.engine, qn, MIX_NS, NULL), KVF_OK);
    if (memcmp(x->lg, x->ln, (size_t)MIX_NS * V * sizeof(float)) != 0)
        fail_msg("step %d: graph replay differs from launched kernels", step);
    for (int s = 0; s < MIX_NS; s++) {
        assert_int_equal(gg[s], gn[s]);
        assert_int_equal(gg[s], kvf_sample_argmax(x->lg + (size_t)s * V, V));
    }
}

/* Sequence 0 decodes while sequence 1 takes 16 prompt tokens, in one batch
 * on the graphs rig, against the two runs apart on the other rig (other
 * GEMM shapes, so within tolerance, not bit for bit). */
static void mix_decode_with_chunk(mix_t *x)
{
    const int V = x->V;
    int p0 = mix_lens[0] + MIX_STEPS, p1 = mix_lens[1] + MIX_STEPS;
    assert_int_equal(kvf_block_table_reserve(&x->tg[0], x->gr.pool, (uint32_t)p0 + 1), KVF_OK);
    assert_int_equal(kvf_block_table_reserve(&x->tg[1], x->gr.pool, (uint32_t)p1 + MIX_CHUNK),
                     KVF_OK);
    assert_int_equal(kvf_block_table_reserve(&x->tn[0], x->ng.pool, (uint32_t)p0 + 1), KVF_OK);
    assert_int_equal(kvf_block_table_reserve(&x->tn[1], x->ng.pool, (uint32_t)p1 + MIX_CHUNK),
                     KVF_OK);
    kvf_engine_seq_t mix[2] = {{.tokens = &x->ids[0][p0],
                                .n_tokens = 1,
                                .start_pos = (uint32_t)p0,
                                .block_ids = x->tg[0].blocks,
                                .n_blocks = x->tg[0].n_blocks,
                                .logits = x->lg},
                               {.tokens = &x->ids[1][p1],
                                .n_tokens = MIX_CHUNK,
                                .start_pos = (uint32_t)p1,
                                .block_ids = x->tg[1].blocks,
                                .n_blocks = x->tg[1].n_blocks,
                                .logits = x->lg + V}};
    assert_int_equal(kvf_engine_forward(x->gr.engine, mix, 2, NULL), KVF_OK);
    for (int s = 0; s < 2; s++) {
        kvf_engine_seq_t one = mix[s];
        one.block_ids = x->tn[s].blocks;
        one.n_blocks = x->tn[s].n_blocks;
        one.logits = x->ln + (size_t)s * V;
        assert_int_equal(kvf_engine_forward(x->ng.engine, &one, 1, NULL), KVF_OK);
    }
    assert_true(kvf_test_rel_diff(x->lg, x->ln, (size_t)V) <= 2e-2f);
    assert_true(kvf_test_rel_diff(x->lg + V, x->ln + V, (size_t)V) <= 2e-2f);
}

/* Tables released (the graphs rig's pool ends empty), rigs closed. */
static void mix_teardown(mix_t *x)
{
    for (int s = 0; s < MIX_NS; s++) {
        kvf_block_table_release(&x->tg[s], x->gr.pool);
        kvf_block_table_release(&x->tn[s], x->ng.pool);
        kvf_block_table_fini(&x->tg[s]);
        kvf_block_table_fini(&x->tn[s]);
    }
    assert_int_equal(kvf_kvpool_used_blocks(x->gr.pool), 0);
    free(x->lg);
    free(x->ln);
    rig_close(&x->gr);
    rig_close(&x->ng);
    kvf_model_destroy(x->m);
}

static void test_mixed_batch_and_graphs(void **state)
{
    (void)state;
    mix_t x;
    mix_setup(&x);
    /* MIX_STEPS decode steps of all three at once: contexts cross
     * table-width buckets (and so graph shapes) on the way. */
    for (int step = 0; step < MIX_STEPS; step++)
        mix_decode_step(&x, step);
    mix_decode_with_chunk(&x);
    mix_teardown(&x);
}

/* ---- host mirror -------------------------------------------------------- */

typedef struct {
    int next;
    int bad;
} hook_order_t;

static void on_layer(void *arg, int layer)
{
    hook_order_t *h = arg;
    if (layer != h->next)
        h->bad++;
    h->next = layer + 1;
}

static void test_mirror_and_upload(void **state)
{
    (void)state;
    kvf_model_t *m = random_model(3, 256, 4, 2, 64, 512, 700, false);
    const int V = m->cfg.vocab, n = 100;
    uint32_t ids[101];
    kvf_test_random_ids(ids, n + 1, V, 3);
    rig_t src, dst, cpu;
    rig_cuda(&src, m, 16, 16, KVF_DTYPE_F32, true, true);
    rig_cuda(&dst, m, 16, 16, KVF_DTYPE_F32, true, true);
    rig_cpu(&cpu, m, 16, 16);
    kvf_block_table_t bs, bd, bc;
    kvf_block_table_init(&bs);
    kvf_block_table_init(&bd);
    kvf_block_table_init(&bc);
    assert_int_equal(kvf_block_table_reserve(&bs, src.pool, n + 1), KVF_OK);
    hook_order_t ho = {0, 0};
    kvf_engine_hooks_t hooks = {.on_layer_done = on_layer, .arg = &ho, .kv_to_host = true};
    kvf_engine_seq_t q = {.tokens = ids,
                          .n_tokens = n,
                          .start_pos = 0,
                          .block_ids = bs.blocks,
                          .n_blocks = bs.n_blocks};
    assert_int_equal(kvf_engine_forward(src.engine, &q, 1, &hooks), KVF_OK);
    assert_int_equal(ho.bad, 0);
    assert_int_equal(ho.next, m->cfg.n_layers);
    float *lc = malloc((size_t)V * sizeof(float)), *ld = malloc((size_t)V * sizeof(float)),
          *ls = malloc((size_t)V * sizeof(float));
    forward(&cpu, &bc, ids, 0, n, lc, false);
    /* The mirror holds the CPU's K/V for every written position. */
    const kvf_kv_geometry_t *g = kvf_kvpool_geometry(src.pool);
    float worst = 0;
    for (int p = 0; p < n; p++)
        for (int l = 0; l < g->n_layers; l++)
            for (int kv = 0; kv < 2; kv++)
                for (int h = 0; h < g->n_kv_heads; h++) {
                    const float *a =
                        (float *)kvf_kvpool_head_data(src.pool, bs.blocks[p / 16], l, kv, h) +
                        (size_t)(p % 16) * g->head_dim;
                    const float *b =
                        (float *)kvf_kvpool_head_data(cpu.pool, bc.blocks[p / 16], l, kv, h) +
                        (size_t)(p % 16) * g->head_dim;
                    float d = kvf_test_rel_diff(a, b, (size_t)g->head_dim);
                    worst = d > worst || isnan(d) ? d : worst;
                }
    if (!(worst <= 1e-4f))
        fail_msg("host mirror K/V off the CPU backend's by %g", (double)worst);
    /* "Ship" the blocks into dst's mirror, upload, decode: same logits as
     * decoding on src. */
    assert_int_equal(kvf_block_table_reserve(&bd, dst.pool, n + 1), KVF_OK);
    size_t bb = kvf_kv_block_bytes(g);
    for (uint32_t b = 0; b < bs.n_blocks; b++)
        memcpy((uint8_t *)kvf_kvpool_base(dst.pool) + (size_t)bd.blocks[b] * bb,
               (const uint8_t *)kvf_kvpool_base(src.pool) + (size_t)bs.blocks[b] * bb, bb);
    assert_int_equal(kvf_kvpool_upload(dst.pool, bd.blocks, bd.n_blocks), KVF_OK);
    uint32_t bad_id = kvf_kvpool_num_blocks(dst.pool);
    assert_int_equal(kvf_kvpool_upload(dst.pool, &bad_id, 1), KVF_ERR_INVAL);
    forward(&src, &bs, ids, n, 1, ls, false);
    forward(&dst, &bd, ids, n, 1, ld, false);
    assert_memory_equal(ls, ld, (size_t)V * sizeof(float));
    kvf_block_table_release(&bs, src.pool);
    kvf_block_table_release(&bd, dst.pool);
    kvf_block_table_release(&bc, cpu.pool);
    kvf_block_table_fini(&bs);
    kvf_block_table_fini(&bd);
    kvf_block_table_fini(&bc);
    free(lc);
    free(ld);
    free(ls);
    rig_close(&src);
    rig_close(&dst);
    rig_close(&cpu);
    kvf_model_destroy(m);
}

int main(void)
{
    const char *env = getenv("KVF_TEST_DATA");
    snprintf(g_data, sizeof(g_data), "%s", env && *env ? env : KVF_TEST_DATA);
    if (!kvf_gpu_built_with_cuda()) {
        printf("test_cuda_backend: skipped: this build has no CUDA backend\n");
        return 77;
    }
    if (kvf_gpu_count() == 0) {
        char d[256];
        kvf_gpu_describe(d, sizeof(d));
        printf("test_cuda_backend: skipped: no GPU here (%s)\n", d);
        return 77;
    }
    kvf_log_set_level(KVF_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_llama),           cmocka_unit_test(test_golden_qwen2),
        cmocka_unit_test(test_golden_qwen3),           cmocka_unit_test(test_golden_sliding_window),
        cmocka_unit_test(test_golden_gemma2),          cmocka_unit_test(test_long_context_vs_cpu),
        cmocka_unit_test(test_kv_formats_vs_cpu),      cmocka_unit_test(test_cache_chunks_blocks),
        cmocka_unit_test(test_mixed_batch_and_graphs), cmocka_unit_test(test_mirror_and_upload),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
