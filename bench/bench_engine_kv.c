/* kvf bench engine, long contexts (see bench_engine_kv.h).
 *
 * For each KV format the backend computes with: one pool holding
 * N_SEQ sequences of the longest context, one engine over it. The contexts
 * are filled without a 16k-token prefill per sequence (quadratic, minutes
 * on a small CPU): one sequence of TEMPLATE_TOKENS real tokens goes through
 * the engine and its blocks are copied, slice by slice, into every block of
 * every table (the values attention reads are then real K/V rows of the
 * format; which positions they came from does not change the time). Then
 * decode steps of batch 1 and N_SEQ at each context, in rounds that visit
 * every format in turn (all pools held at once): best step time
 * against roofline = (weight bytes + batch x (ctx + 1) x KV bytes per
 * token) / bandwidth, and each format's speedup over f32 at the same
 * (context, batch). */
#include "bench_engine_kv.h"
#include "bench_util.h"

#include "kvf/clock.h"
#include "kvf/engine.h"
#include "kvf/kv_format.h"
#include "kvf/kvcache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_SEQ           16
#define TEMPLATE_TOKENS 256u
#define N_CTX           2
#define N_FMT           5

static const uint32_t contexts[N_CTX] = {4096, 16384};
static const int batches[2] = {1, N_SEQ};
static const kvf_kv_dtype_t fmts[N_FMT] = {KVF_KV_F32, KVF_KV_BF16, KVF_KV_F16, KVF_KV_FP8,
                                           KVF_KV_INT8};

/* One format's pool, engine and tables. */
typedef struct {
    kvf_kv_geometry_t g;
    kvf_kvpool_t *pool;
    kvf_engine_t *engine;
    kvf_block_table_t bts[N_SEQ];
    float *logits;   /* (N_SEQ, vocab) */
    uint32_t *tokens; /* (TEMPLATE_TOKENS + N_SEQ) */
} kv_rig_t;

static void rig_fini(kv_rig_t *k)
{
    for (int i = 0; i < N_SEQ; i++) {
        if (k->pool)
            kvf_block_table_release(&k->bts[i], k->pool);
        kvf_block_table_fini(&k->bts[i]);
    }
    kvf_engine_destroy(k->engine);
    kvf_kvpool_destroy(k->pool);
    free(k->logits);
    free(k->tokens);
    memset(k, 0, sizeof(*k));
}

/* Every block of every table filled from the template sequence's blocks. */
static void fill_from_template(kv_rig_t *k, int n_layers)
{
    const uint32_t n_tpl = kvf_kv_blocks_for_tokens(&k->g, TEMPLATE_TOKENS);
    const size_t slice = kvf_kvpool_slice_bytes(k->pool);
    uint8_t *base = kvf_kvpool_base(k->pool);
    const uint32_t *tpl = k->bts[0].blocks;
    for (int s = 0; s < N_SEQ; s++) {
        for (uint32_t b = s == 0 ? n_tpl : 0; b < k->bts[s].n_blocks; b++) {
            uint32_t src = tpl[b % n_tpl], dst = k->bts[s].blocks[b];
            for (int l = 0; l < n_layers; l++)
                memcpy(base + kvf_kvpool_slice_offset(k->pool, dst, l),
                       base + kvf_kvpool_slice_offset(k->pool, src, l), slice);
        }
    }
}

/* The pool for N_SEQ sequences of max_ctx + 1 positions in format dt,
 * the engine, and the contexts filled. */
static kvf_status_t rig_init(kv_rig_t *k, const kvf_bench_kv_decode_t *in, kvf_kv_dtype_t dt,
                             uint32_t max_ctx)
{
    memset(k, 0, sizeof(*k));
    for (int i = 0; i < N_SEQ; i++)
        kvf_block_table_init(&k->bts[i]);
    const kvf_model_config_t *c = &in->model->cfg;
    k->g = kvf_engine_kv_geometry(in->model, KVF_KV_BLOCK_SIZE_DEFAULT, dt);
    uint32_t blocks = N_SEQ * kvf_kv_blocks_for_tokens(&k->g, max_ctx + 1);
    kvf_status_t st = kvf_kvpool_create(&k->g, blocks, &k->pool);
    if (st == KVF_OK)
        st = kvf_engine_create(in->model, in->backend, k->pool, &k->engine);
    k->logits = malloc((size_t)N_SEQ * (size_t)c->vocab * sizeof(float));
    k->tokens = malloc((TEMPLATE_TOKENS + N_SEQ) * sizeof(uint32_t));
    if (st == KVF_OK && (!k->logits || !k->tokens))
        st = KVF_ERR_NOMEM;
    for (int i = 0; i < N_SEQ && st == KVF_OK; i++)
        st = kvf_block_table_reserve(&k->bts[i], k->pool, max_ctx + 1);
    if (st != KVF_OK)
        return st;
    kvf_bench_random_tokens(k->tokens, TEMPLATE_TOKENS + N_SEQ, c->vocab);
    kvf_engine_seq_t q = {.tokens = k->tokens, .n_tokens = TEMPLATE_TOKENS, .start_pos = 0,
                          .block_ids = k->bts[0].blocks, .n_blocks = k->bts[0].n_blocks,
                          .logits = k->logits};
    st = kvf_engine_forward(k->engine, &q, 1, NULL);
    if (st == KVF_OK)
        fill_from_template(k, c->n_layers);
    return st;
}

/* The most steps one (format, context, batch) times over all rounds. */
#define MAX_STEPS 16

/* Best of steps decode steps (after one warm-up) of batch b at ctx; each
 * step's time appended to all[*n_all] (up to MAX_STEPS). */
static double best_step(kv_rig_t *k, int vocab, int b, uint32_t ctx, int steps, double *all,
                        int *n_all)
{
    kvf_engine_seq_t q[N_SEQ];
    for (int i = 0; i < b; i++)
        q[i] = (kvf_engine_seq_t){.tokens = k->tokens + TEMPLATE_TOKENS + i, .n_tokens = 1,
                                  .start_pos = ctx, .block_ids = k->bts[i].blocks,
                                  .n_blocks = k->bts[i].n_blocks,
                                  .logits = k->logits + (size_t)i * (size_t)vocab};
    double best = -1;
    for (int s = 0; s < steps + 1; s++) {
        uint64_t t0 = kvf_clock_ns();
        if (kvf_engine_forward(k->engine, q, b, NULL) != KVF_OK)
            return -1;
        double t = (double)(kvf_clock_ns() - t0) * 1e-9;
        if (s > 0 && (best < 0 || t < best))
            best = t;
        if (s > 0 && *n_all < MAX_STEPS)
            all[(*n_all)++] = t;
    }
    return best;
}

static void report_row(const kvf_bench_kv_decode_t *in, kvf_kv_dtype_t dt, uint32_t ctx, int b,
                       double t, double t_med, double kv_tok, double t_f32, cJSON *arr)
{
    double bytes = in->weight_bytes + (double)b * (double)(ctx + 1) * kv_tok;
    double roof = bytes / in->bandwidth;
    printf("%-5s %6u %6d %10.2f %12.2f %9.1f%% %10.1f %8.2fx\n", kvf_kv_dtype_name(dt), ctx, b,
           t * 1e3, roof * 1e3, 100 * roof / t, b / t, t_f32 / t);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "kv", kvf_kv_dtype_name(dt));
    cJSON_AddNumberToObject(j, "context", ctx);
    cJSON_AddNumberToObject(j, "batch", b);
    cJSON_AddNumberToObject(j, "step_ms", t * 1e3);
    cJSON_AddNumberToObject(j, "step_ms_median", t_med * 1e3); /* the typical step */
    cJSON_AddNumberToObject(j, "roofline_ms", roof * 1e3);
    cJSON_AddNumberToObject(j, "roofline_ratio", roof / t);
    cJSON_AddNumberToObject(j, "speedup_vs_f32", t_f32 / t);
    cJSON_AddItemToArray(arr, j);
}

int kvf_bench_engine_kv_decode(const kvf_bench_kv_decode_t *in, cJSON *out)
{
    const int n_ctx = in->quick ? 1 : N_CTX;
    double t[N_FMT][N_CTX][2], kv_tok[N_FMT];
    static double all[N_FMT][N_CTX][2][MAX_STEPS]; /* every step, for the median */
    int n_all[N_FMT][N_CTX][2] = {{{0}}};
    bool have[N_FMT] = {false};
    static kv_rig_t rigs[N_FMT];
    cJSON *arr = cJSON_AddArrayToObject(out, "kv_decode");
    printf("\n%-5s %6s %6s %10s %12s %10s %10s %9s   (KV formats: roofline = weights + "
           "batch x (ctx + 1) x KV bytes/token)\n",
           "kv", "ctx", "batch", "step ms", "roofline ms", "ratio", "tokens/s", "vs f32");
    /* Every format's pool at once, then rounds that visit each format in
     * turn: a slow stretch of a shared machine then lands on all formats
     * alike instead of on one, and each keeps its best step. */
    for (int f = 0; f < N_FMT; f++) {
        if (!(in->backend->kv_dtypes & KVF_KV_DTYPE_BIT(fmts[f]))) {
            printf("%-5s (the backend does not compute with this format)\n",
                   kvf_kv_dtype_name(fmts[f]));
            continue;
        }
        kvf_status_t st = rig_init(&rigs[f], in, fmts[f], contexts[n_ctx - 1]);
        have[f] = st == KVF_OK;
        kv_tok[f] = (double)kvf_kv_bytes_per_token(&rigs[f].g);
        if (!have[f]) {
            fprintf(stderr, "kv decode %s: %s\n", kvf_kv_dtype_name(fmts[f]), kvf_status_str(st));
            rig_fini(&rigs[f]);
        }
        for (int ci = 0; ci < N_CTX; ci++)
            t[f][ci][0] = t[f][ci][1] = -1;
    }
    const int rounds = in->quick ? 1 : 3;
    for (int r = 0; r < rounds; r++)
        for (int ci = 0; ci < n_ctx; ci++)
            for (int bi = 0; bi < 2; bi++)
                for (int f = 0; f < N_FMT; f++) {
                    if (!have[f])
                        continue;
                    const int steps = in->quick ? 2 : (batches[bi] == 1 ? 4 : 2);
                    double s = best_step(&rigs[f], in->model->cfg.vocab, batches[bi],
                                         contexts[ci], steps, all[f][ci][bi], &n_all[f][ci][bi]);
                    if (s <= 0) {
                        fprintf(stderr, "kv decode %s: a step failed\n",
                                kvf_kv_dtype_name(fmts[f]));
                        have[f] = false;
                        continue;
                    }
                    if (t[f][ci][bi] < 0 || s < t[f][ci][bi])
                        t[f][ci][bi] = s;
                }
    for (int f = 0; f < N_FMT; f++)
        rig_fini(&rigs[f]);
    if (!have[0]) {
        fprintf(stderr, "kv decode: the f32 pool failed; no table\n");
        return 1;
    }
    for (int ci = 0; ci < n_ctx; ci++)
        for (int bi = 0; bi < 2; bi++)
            for (int f = 0; f < N_FMT; f++)
                if (have[f])
                    report_row(in, fmts[f], contexts[ci], batches[bi], t[f][ci][bi],
                               kvf_bench_median(all[f][ci][bi], (size_t)n_all[f][ci][bi]),
                               kv_tok[f], t[0][ci][bi], arr);
    return 0;
}
