/* kvf bench engine --backend cuda: the CUDA engine against ceilings measured
 * on the same GPU in the same run (docs/DESIGN.md, "Measuring performance").
 *
 *  - HBM bandwidth: device-to-device copies of a 2 GiB buffer and of one the
 *    size of the weights on the device, counted as bytes read + written
 *    (kvf_gpu_copy_bandwidth); the larger is the ceiling.
 *  - GEMM rate: cuBLAS in the weight dtype at 8192^3 and at the prefill
 *    projection shape (2048 tokens x inter x hidden); the larger.
 *    Both ceilings are sampled before the engine runs and again after it;
 *    the best sample of the run counts (a low ceiling would flatter the
 *    ratios).
 *  - Decode steps at batch 1, 8 and 64 over contexts of 1024 and 8192: the
 *    median step time (kvf_engine_forward returns with the logits on the
 *    host) against roofline = (weight bytes streamed + batch * (ctx + 1) *
 *    KV bytes per token) / bandwidth. The device pool starts zeroed and
 *    attention reads the same bytes whatever they hold, so the contexts are
 *    not prefilled: only their blocks are reserved.
 *    Each step brings every sequence's logits row to host memory, as a
 *    decode node that samples on the host needs; --greedy asks for the
 *    greedy token instead (the rows stay on the device), which separates
 *    that download from the model's own time.
 *  - Prefill of one 2048-token prompt, best of 3: forward FLOPs / time
 *    against the GEMM rate.
 * The pool is sized for the largest case; a case that does not fit in it
 * (a smaller GPU) is skipped with a note. The table is printed last. */
#include "bench_engine.h"

#include "kvf/backend.h"
#include "kvf/backend_flags.h"
#include "kvf/engine.h"
#include "kvf/flags.h"
#include "kvf/gpu.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    const char *model_dir;
    const char *json;
    kvf_cuda_config_t cuda; /* device, weight dtype, graphs */
    bool greedy;            /* greedy tokens instead of logits rows on the host */
    bool quick;
} cuda_bench_opts_t;

#ifdef KVF_HAVE_CUDA
#include "bench_util.h"
#include "kvf/clock.h"
#include "kvf/gpu_bench.h"
#include "kvf/kvcache.h"
#include "kvf/log.h"
#include "kvf/model.h"

#include <cjson/cJSON.h>
#include <stdlib.h>

#define MAX_BATCH      64
#define PREFILL_TOKENS 2048u
#define N_DECODE_CASES 6

/* ---- ceilings ----------------------------------------------------------- */

/* Copy bandwidth on two buffers and GEMM rate at two shapes; each keeps the
 * best sample of the run (0: never measured, e.g. did not fit). */
typedef struct {
    int device;
    kvf_dtype_t dtype;
    size_t copy_bytes[2]; /* 2 GiB; the weights on the device */
    double copy_best[2];  /* bytes/s */
    int gemm_mnk[2][3];   /* 8192^3; (prefill tokens, inter, hidden) */
    double gemm_best[2];  /* FLOP/s */
} ceil_meter_t;

/* One sample of every ceiling. A buffer that does not fit next to the
 * weights is noted and skipped; any other failure is returned. */
static kvf_status_t ceil_sample(ceil_meter_t *m, int reps)
{
    for (int i = 0; i < 2; i++) {
        if (m->copy_bytes[i] == 0)
            continue;
        double bw = 0;
        kvf_status_t st = kvf_gpu_copy_bandwidth(m->device, m->copy_bytes[i], reps, &bw);
        if (st == KVF_ERR_NOMEM) {
            printf("note: copy of %.2f GB does not fit on the GPU now; sample skipped\n",
                   (double)m->copy_bytes[i] / 1e9);
            continue;
        }
        if (st != KVF_OK)
            return st;
        m->copy_best[i] = bw > m->copy_best[i] ? bw : m->copy_best[i];
    }
    for (int i = 0; i < 2; i++) {
        const int *s = m->gemm_mnk[i];
        double rate = 0;
        kvf_status_t st = kvf_gpu_gemm_rate(m->device, s[0], s[1], s[2], m->dtype, reps, &rate);
        if (st == KVF_ERR_NOMEM) {
            printf("note: GEMM %dx%dx%d does not fit on the GPU now; sample skipped\n", s[0], s[1],
                   s[2]);
            continue;
        }
        if (st != KVF_OK)
            return st;
        m->gemm_best[i] = rate > m->gemm_best[i] ? rate : m->gemm_best[i];
    }
    return KVF_OK;
}

static double max2(double a, double b)
{
    return a > b ? a : b;
}

/* ---- engine runs -------------------------------------------------------- */

typedef struct {
    kvf_model_t *model;
    kvf_backend_t be;
    kvf_kvpool_t *pool;
    kvf_engine_t *engine;
    kvf_block_table_t bts[MAX_BATCH];
    kvf_engine_seq_t seqs[MAX_BATCH];
    float *logits; /* (MAX_BATCH, vocab), host; NULL with --greedy */
    uint32_t greedy[MAX_BATCH];
    uint32_t *tokens; /* (PREFILL_TOKENS + MAX_BATCH) random ids */
} cuda_rig_t;

/* One forward of r->seqs[0..n_seqs) and a wait for the backend's stream;
 * *seconds_p is the wall time of both. */
static kvf_status_t timed_forward(cuda_rig_t *r, int n_seqs, double *seconds_p)
{
    uint64_t t0 = kvf_clock_ns();
    kvf_status_t st = kvf_engine_forward(r->engine, r->seqs, n_seqs, NULL);
    if (st == KVF_OK && r->be.ops->synchronize)
        st = r->be.ops->synchronize(r->be.ctx);
    *seconds_p = (double)(kvf_clock_ns() - t0) * 1e-9;
    return st;
}

static void release_tables(cuda_rig_t *r)
{
    for (int i = 0; i < MAX_BATCH; i++)
        kvf_block_table_release(&r->bts[i], r->pool);
}

/* Reserves n tables of n_tokens positions and points r->seqs[i] at them:
 * n_new tokens each starting at start_pos. */
static kvf_status_t setup_seqs(cuda_rig_t *r, int n, uint32_t n_tokens, uint32_t start_pos,
                               uint32_t n_new)
{
    for (int i = 0; i < n; i++) {
        kvf_status_t st = kvf_block_table_reserve(&r->bts[i], r->pool, n_tokens);
        if (st != KVF_OK) {
            release_tables(r);
            return st;
        }
        r->seqs[i] = (kvf_engine_seq_t){
            .tokens = r->tokens + (n_new == 1 ? (uint32_t)i : 0),
            .n_tokens = n_new,
            .start_pos = start_pos,
            .block_ids = r->bts[i].blocks,
            .n_blocks = r->bts[i].n_blocks,
            .logits = r->logits ? r->logits + (size_t)i * (size_t)r->model->cfg.vocab : NULL,
            .greedy_token = r->logits ? NULL : &r->greedy[i],
        };
    }
    return KVF_OK;
}

typedef struct {
    int batch;
    uint32_t ctx;
    uint32_t blocks; /* the pool blocks it needs */
    bool skipped;    /* did not fit in the pool */
    double step_s;   /* median step time */
} decode_case_t;

/* Median decode step of c->batch sequences at position c->ctx, after
 * warmup steps (the first ones capture CUDA graphs). */
static kvf_status_t run_decode_case(cuda_rig_t *r, decode_case_t *c, int warmup, int steps)
{
    double t[32];
    if (steps > 32)
        steps = 32;
    kvf_status_t st = setup_seqs(r, c->batch, c->ctx + 1, c->ctx, 1);
    if (st != KVF_OK)
        return st;
    for (int s = 0; s < warmup + steps && st == KVF_OK; s++) {
        double sec = 0;
        st = timed_forward(r, c->batch, &sec);
        if (s >= warmup)
            t[s - warmup] = sec;
    }
    release_tables(r);
    if (st != KVF_OK)
        return st;
    c->step_s = kvf_bench_median(t, (size_t)steps);
    return KVF_OK;
}

/* Best of reps forwards of one PREFILL_TOKENS-token prompt, after one
 * warm-up. */
static kvf_status_t run_prefill(cuda_rig_t *r, int reps, double *best_s_p)
{
    kvf_status_t st = setup_seqs(r, 1, PREFILL_TOKENS, 0, PREFILL_TOKENS);
    double best = -1;
    for (int i = 0; i < reps + 1 && st == KVF_OK; i++) {
        double sec = 0;
        st = timed_forward(r, 1, &sec);
        if (st == KVF_OK && i > 0 && (best < 0 || sec < best))
            best = sec;
    }
    release_tables(r);
    if (st == KVF_OK)
        *best_s_p = best;
    return st;
}

/* ---- report -------------------------------------------------------------- */

static void table_row(cJSON *out, const char *name, double s, double ceil_s)
{
    printf("%-26s %12.3f %14.3f %9.1f%%\n", name, s * 1e3, ceil_s * 1e3, 100 * ceil_s / s);
    char key[96];
    snprintf(key, sizeof(key), "%s_ms", name);
    cJSON_AddNumberToObject(out, key, s * 1e3);
    snprintf(key, sizeof(key), "%s_ceiling_ms", name);
    cJSON_AddNumberToObject(out, key, ceil_s * 1e3);
    snprintf(key, sizeof(key), "%s_ratio", name);
    cJSON_AddNumberToObject(out, key, ceil_s / s);
}

/* ---- the run ------------------------------------------------------------- */

/* Everything one run holds; cuda_run_fini() frees what was made. */
typedef struct {
    const char *prog;
    const cuda_bench_opts_t *o;
    kvf_gpu_info_t gpu;
    cuda_rig_t r;
    ceil_meter_t cm;
    kvf_kv_geometry_t g;
    double kv_tok;      /* KV bytes per token */
    size_t block_bytes; /* of one KV block */
    double weight_dev;  /* weight bytes on the device */
    double weight_step; /* weight bytes one decode step streams */
    decode_case_t dec[N_DECODE_CASES];
    uint32_t need;        /* pool blocks the largest case needs */
    uint32_t pool_blocks; /* pool blocks there are */
    double prefill_s;
    bool prefill_skipped;
    double bw, gemm; /* the best ceilings of the run */
    cJSON *out;
} cuda_run_t;

static double gib(double bytes)
{
    return bytes / (1024.0 * 1024 * 1024);
}

static void cuda_run_init(cuda_run_t *e, const char *prog, const cuda_bench_opts_t *o)
{
    memset(e, 0, sizeof(*e));
    e->prog = prog;
    e->o = o;
    for (int i = 0; i < MAX_BATCH; i++)
        kvf_block_table_init(&e->r.bts[i]);
    e->prefill_s = -1;
}

/* The GPU's properties, the model on the CUDA backend, and the lines that
 * describe both. */
static kvf_status_t load_model(cuda_run_t *e)
{
    const int device = e->o->cuda.device;
    const kvf_dtype_t wdtype = e->o->cuda.wdtype;
    if (kvf_gpu_info(device, &e->gpu) != KVF_OK) {
        fprintf(stderr, "%s: cannot read the properties of GPU %d\n", e->prog, device);
        return KVF_ERR_DEVICE;
    }
    uint64_t t0 = kvf_clock_ns();
    kvf_status_t st = kvf_model_load(e->o->model_dir, &e->r.model);
    if (st != KVF_OK) {
        fprintf(stderr, "%s: cannot load %s: %s\n", e->prog, e->o->model_dir, kvf_status_str(st));
        return st;
    }
    const kvf_model_config_t *c = &e->r.model->cfg;
    st = kvf_backend_cuda_create(&e->o->cuda, e->r.model, &e->r.be);
    if (st != KVF_OK) {
        fprintf(stderr, "%s: cannot create the CUDA backend on GPU %d: %s\n", e->prog, device,
                kvf_status_str(st));
        return st;
    }
    e->weight_dev = (double)kvf_backend_cuda_weight_bytes(&e->r.be);
    e->weight_step = kvf_bench_step_weight_bytes(c, e->weight_dev, kvf_dtype_size(wdtype));
    printf("GPU %d: %s (sm_%d%d, %.1f GiB, %d SMs)\n", device, e->gpu.name, e->gpu.major,
           e->gpu.minor, gib((double)e->gpu.total_mem), e->gpu.multiprocessors);
    printf("model %s: %s, %d layers, hidden %d, %d/%d heads, inter %d, vocab %d%s; loaded and "
           "uploaded in %.1f s; %.2f GB of %s weights on the device, %.2f GB streamed per "
           "decode step; CUDA graphs %s\n",
           e->o->model_dir, c->arch_name, c->n_layers, c->hidden, c->n_heads, c->n_kv_heads,
           c->inter, c->vocab, c->tie_embeddings ? " (tied)" : "",
           (double)(kvf_clock_ns() - t0) * 1e-9, e->weight_dev / 1e9, kvf_dtype_name(wdtype),
           e->weight_step / 1e9, e->o->cuda.cuda_graphs ? "on" : "off");
    return KVF_OK;
}

/* One sample of every ceiling (kvf_bench_engine_cuda's first and last). */
static kvf_status_t sample_ceilings(cuda_run_t *e)
{
    kvf_status_t st = ceil_sample(&e->cm, e->o->quick ? 3 : 10);
    if (st != KVF_OK)
        fprintf(stderr, "%s: measuring the ceilings failed: %s\n", e->prog, kvf_status_str(st));
    return st;
}

/* The decode cases, and the pool blocks the largest case (or the
 * prefill) needs. */
static void plan_cases(cuda_run_t *e)
{
    static const uint32_t ctxs[2] = {1024, 8192};
    static const int batches[3] = {1, 8, MAX_BATCH};
    e->need = kvf_kv_blocks_for_tokens(&e->g, PREFILL_TOKENS);
    for (int i = 0; i < N_DECODE_CASES; i++) {
        decode_case_t *d = &e->dec[i];
        *d = (decode_case_t){.batch = batches[i % 3], .ctx = ctxs[i / 3]};
        d->blocks = (uint32_t)d->batch * kvf_kv_blocks_for_tokens(&e->g, d->ctx + 1);
        e->need = d->blocks > e->need ? d->blocks : e->need;
    }
}

/* The pool: what the largest case needs, if free memory allows (90% of
 * it, keeping at least 1 GiB for the engine's activations); the engine on
 * it; host logits rows and the prompt tokens. */
static kvf_status_t create_pool_and_engine(cuda_run_t *e)
{
    cuda_rig_t *r = &e->r;
    size_t free_b = 0, total_b = 0;
    kvf_status_t st = kvf_backend_cuda_mem_info(&r->be, &free_b, &total_b);
    if (st != KVF_OK) {
        fprintf(stderr, "%s: cannot read the GPU's free memory: %s\n", e->prog,
                kvf_status_str(st));
        return st;
    }
    size_t reserve = free_b / 10 > ((size_t)1 << 30) ? free_b / 10 : (size_t)1 << 30;
    uint64_t fit = free_b > reserve ? (free_b - reserve) / e->block_bytes : 0;
    e->pool_blocks = fit < e->need ? (uint32_t)fit : e->need;
    printf("KV pool: %u blocks of %zu tokens (%.2f GiB; the largest case needs %u, %.2f GiB "
           "free of %.2f GiB)\n",
           e->pool_blocks, (size_t)e->g.block_size,
           gib((double)e->pool_blocks * (double)e->block_bytes), e->need, gib((double)free_b),
           gib((double)total_b));
    fflush(stdout);
    if (e->pool_blocks == 0) {
        fprintf(stderr, "%s: no room for a KV pool on GPU %d\n", e->prog, e->o->cuda.device);
        return KVF_ERR_NO_SPACE;
    }
    st = kvf_backend_cuda_kvpool_create(&r->be, &e->g, e->pool_blocks, false, &r->pool);
    if (st == KVF_OK)
        st = kvf_engine_create(r->model, &r->be, r->pool, &r->engine);
    if (st != KVF_OK) {
        fprintf(stderr, "%s: cannot create the KV pool and engine: %s\n", e->prog,
                kvf_status_str(st));
        return st;
    }
    const int vocab = r->model->cfg.vocab;
    if (!e->o->greedy) /* pinned, as the decode node's */
        r->logits =
            kvf_backend_host_alloc(&r->be, (size_t)MAX_BATCH * (size_t)vocab * sizeof(float));
    r->tokens = malloc((size_t)(PREFILL_TOKENS + MAX_BATCH) * sizeof(uint32_t));
    if ((!e->o->greedy && !r->logits) || !r->tokens) {
        fprintf(stderr, "%s: out of host memory\n", e->prog);
        return KVF_ERR_NOMEM;
    }
    kvf_bench_random_tokens(r->tokens, PREFILL_TOKENS + MAX_BATCH, vocab);
    return KVF_OK;
}

/* Every decode case that fits in the pool, printed as it ends. */
static kvf_status_t run_decode_cases(cuda_run_t *e)
{
    const kvf_model_config_t *c = &e->r.model->cfg;
    const int warmup = e->o->quick ? 2 : 3, steps = e->o->quick ? 5 : 20;
    for (int i = 0; i < N_DECODE_CASES; i++) {
        decode_case_t *d = &e->dec[i];
        if (d->blocks > e->pool_blocks) {
            d->skipped = true;
            printf("note: decode batch %d, context %u skipped: needs %u KV blocks (%.2f GiB), "
                   "the pool holds %u\n",
                   d->batch, d->ctx, d->blocks, gib((double)d->blocks * (double)e->block_bytes),
                   e->pool_blocks);
            continue;
        }
        if (c->max_pos > 0 && d->ctx + 1 > (uint32_t)c->max_pos)
            printf("note: context %u is beyond the model's max_position_embeddings %d (timing "
                   "is the same)\n",
                   d->ctx, c->max_pos);
        kvf_status_t st = run_decode_case(&e->r, d, warmup, steps);
        if (st != KVF_OK) {
            fprintf(stderr, "%s: decode batch %d, context %u failed: %s\n", e->prog, d->batch,
                    d->ctx, kvf_status_str(st));
            return st;
        }
        printf("decode batch %d, context %u: %.3f ms per step (median of %d; %.1f MB of logits "
               "to the host)\n",
               d->batch, d->ctx, d->step_s * 1e3, steps,
               e->o->greedy ? 0.0 : (double)d->batch * c->vocab * sizeof(float) / 1e6);
        fflush(stdout);
    }
    return KVF_OK;
}

/* The prefill case, unless the pool is too small for it. */
static kvf_status_t run_prefill_case(cuda_run_t *e)
{
    e->prefill_skipped = kvf_kv_blocks_for_tokens(&e->g, PREFILL_TOKENS) > e->pool_blocks;
    if (e->prefill_skipped) {
        printf("note: prefill of %u tokens skipped: the pool is too small\n", PREFILL_TOKENS);
        return KVF_OK;
    }
    kvf_status_t st = run_prefill(&e->r, e->o->quick ? 1 : 3, &e->prefill_s);
    if (st != KVF_OK) {
        fprintf(stderr, "%s: prefill of %u tokens failed: %s\n", e->prog, PREFILL_TOKENS,
                kvf_status_str(st));
        return st;
    }
    printf("prefill %u tokens: %.3f ms (best of %d)\n", PREFILL_TOKENS, e->prefill_s * 1e3,
           e->o->quick ? 1 : 3);
    return KVF_OK;
}

/* Ceilings, second sample, with the pool's memory given back; then the
 * best of the run. */
static kvf_status_t final_ceilings(cuda_run_t *e)
{
    kvf_engine_destroy(e->r.engine);
    e->r.engine = NULL;
    kvf_kvpool_destroy(e->r.pool);
    e->r.pool = NULL;
    kvf_status_t st = sample_ceilings(e);
    if (st != KVF_OK)
        return st;
    e->bw = max2(e->cm.copy_best[0], e->cm.copy_best[1]);
    e->gemm = max2(e->cm.gemm_best[0], e->cm.gemm_best[1]);
    if (e->bw <= 0 || e->gemm <= 0) {
        fprintf(stderr, "%s: no ceiling could be measured (copy buffers or GEMMs did not fit)\n",
                e->prog);
        return KVF_ERR_DEVICE;
    }
    return KVF_OK;
}

/* The run's settings and ceilings: JSON fields and two lines. */
static void report_ceilings(cuda_run_t *e)
{
    const cuda_bench_opts_t *o = e->o;
    const ceil_meter_t *cm = &e->cm;
    const char *wdtype = kvf_dtype_name(o->cuda.wdtype);
    cJSON *out = e->out;
    cJSON_AddStringToObject(out, "backend", "cuda");
    cJSON_AddStringToObject(out, "gpu", e->gpu.name);
    cJSON_AddNumberToObject(out, "device", o->cuda.device);
    cJSON_AddStringToObject(out, "model", o->model_dir);
    cJSON_AddStringToObject(out, "wdtype", wdtype);
    cJSON_AddBoolToObject(out, "cuda_graphs", o->cuda.cuda_graphs);
    cJSON_AddStringToObject(out, "outputs", o->greedy ? "greedy" : "logits");
    cJSON_AddNumberToObject(out, "weight_bytes_device", e->weight_dev);
    cJSON_AddNumberToObject(out, "weight_bytes_per_step", e->weight_step);
    cJSON_AddNumberToObject(out, "kv_bytes_per_token", e->kv_tok);
    cJSON_AddNumberToObject(out, "bandwidth_gbs", e->bw / 1e9);
    cJSON_AddNumberToObject(out, "copy_2gib_gbs", cm->copy_best[0] / 1e9);
    cJSON_AddNumberToObject(out, "copy_weights_gbs", cm->copy_best[1] / 1e9);
    cJSON_AddNumberToObject(out, "gemm_tflops", e->gemm / 1e12);
    cJSON_AddNumberToObject(out, "gemm_8192_tflops", cm->gemm_best[0] / 1e12);
    cJSON_AddNumberToObject(out, "gemm_prefill_tflops", cm->gemm_best[1] / 1e12);
    printf("\nceilings (best of the run): copy %.1f GB/s (2 GiB %.1f, weights-sized %.1f); "
           "GEMM %s %.1f TFLOP/s (8192^3 %.1f, %dx%dx%d %.1f)\n",
           e->bw / 1e9, cm->copy_best[0] / 1e9, cm->copy_best[1] / 1e9, wdtype, e->gemm / 1e12,
           cm->gemm_best[0] / 1e12, cm->gemm_mnk[1][0], cm->gemm_mnk[1][1], cm->gemm_mnk[1][2],
           cm->gemm_best[1] / 1e12);
    printf("\n%s, GPU %d: HBM %.1f GB/s, GEMM %.1f TFLOP/s (%s weights, graphs %s, %s)\n",
           e->gpu.name, o->cuda.device, e->bw / 1e9, e->gemm / 1e12, wdtype,
           o->cuda.cuda_graphs ? "on" : "off", o->greedy ? "greedy tokens" : "logits to the host");
}

/* One row per case against its ceiling, printed and in the JSON. */
static void report_table(cuda_run_t *e)
{
    printf("%-26s %12s %14s %10s\n", "case", "ms", "ceiling ms", "ratio");
    for (int i = 0; i < N_DECODE_CASES; i++) {
        const decode_case_t *d = &e->dec[i];
        char name[64];
        snprintf(name, sizeof(name), "decode_b%d_ctx%u", d->batch, d->ctx);
        if (d->skipped) {
            printf("%-26s %12s %14s %10s\n", name, "skipped", "-", "-");
            char key[96];
            snprintf(key, sizeof(key), "%s_skipped", name);
            cJSON_AddBoolToObject(e->out, key, true);
            continue;
        }
        /* each sequence reads its ctx + 1 positions of K/V per step */
        double bytes = e->weight_step + (double)d->batch * (d->ctx + 1) * e->kv_tok;
        table_row(e->out, name, d->step_s, bytes / e->bw);
    }
    char name[64];
    snprintf(name, sizeof(name), "prefill_%u", PREFILL_TOKENS);
    if (e->prefill_skipped) {
        printf("%-26s %12s %14s %10s\n", name, "skipped", "-", "-");
        cJSON_AddBoolToObject(e->out, "prefill_2048_skipped", true);
    } else {
        double flops = kvf_engine_flops(&e->r.model->cfg, 0, PREFILL_TOKENS, 1);
        table_row(e->out, name, e->prefill_s, flops / e->gemm);
    }
    fflush(stdout);
}

static void cuda_run_fini(cuda_run_t *e)
{
    cuda_rig_t *r = &e->r;
    cJSON_Delete(e->out);
    if (r->pool)
        release_tables(r);
    for (int i = 0; i < MAX_BATCH; i++)
        kvf_block_table_fini(&r->bts[i]);
    kvf_backend_host_free(&r->be, r->logits);
    free(r->tokens);
    kvf_engine_destroy(r->engine);
    kvf_kvpool_destroy(r->pool);
    kvf_backend_destroy(&r->be);
    kvf_model_destroy(r->model);
}

static int run_cuda_bench(const char *prog, const cuda_bench_opts_t *o)
{
    cuda_run_t e;
    cuda_run_init(&e, prog, o);
    int rc = 1;
    if (load_model(&e) != KVF_OK)
        goto done;
    const kvf_model_config_t *c = &e.r.model->cfg;
    /* Ceilings, first sample: before the pool takes its memory. */
    e.cm = (ceil_meter_t){
        .device = o->cuda.device,
        .dtype = o->cuda.wdtype,
        .copy_bytes = {(size_t)2 << 30, (size_t)e.weight_dev},
        .gemm_mnk = {{8192, 8192, 8192}, {(int)PREFILL_TOKENS, c->inter, c->hidden}},
    };
    if (sample_ceilings(&e) != KVF_OK)
        goto done;
    e.g = kvf_engine_kv_geometry(e.r.model, KVF_KV_BLOCK_SIZE_DEFAULT, KVF_KV_F32);
    e.kv_tok = (double)kvf_kv_bytes_per_token(&e.g);
    e.block_bytes = kvf_kv_block_bytes(&e.g);
    plan_cases(&e);
    if (create_pool_and_engine(&e) != KVF_OK || run_decode_cases(&e) != KVF_OK ||
        run_prefill_case(&e) != KVF_OK || final_ceilings(&e) != KVF_OK)
        goto done;
    /* The table, last. */
    e.out = cJSON_CreateObject();
    report_ceilings(&e);
    report_table(&e);
    rc = o->json ? kvf_bench_write_json(e.out, o->json, prog) : 0;
done:
    cuda_run_fini(&e);
    return rc;
}

#endif /* KVF_HAVE_CUDA */

/* Returns -1 to run, else the exit code (help printed, or a bad flag). */
static int parse_cuda_opts(int argc, char **argv, cuda_bench_opts_t *o)
{
    const char *dtype_alias = NULL, *graphs = NULL;
    kvf_backend_flags_t bf = {.backend = "cuda"};
    memset(o, 0, sizeof(*o));
    const kvf_flag_t flags[] = {
        {"model", KVF_FLAG_STRING, &o->model_dir, "DIR", "model directory (e.g. from kvf mkmodel)",
         NULL},
        KVF_BACKEND_FLAG_ENTRIES(&bf),
        {"dtype", KVF_FLAG_STRING, &dtype_alias, "bf16|f16|f32", "same as --gpu-dtype", NULL},
        {"graphs", KVF_FLAG_STRING, &graphs, "on|off", "off: same as --no-cuda-graphs", NULL},
        {"greedy", KVF_FLAG_BOOL, &o->greedy, NULL,
         "greedy tokens instead of logits rows copied to the host each step", NULL},
        {"json", KVF_FLAG_STRING, &o->json, "FILE", "also write the results as JSON", NULL},
        {"quick", KVF_FLAG_BOOL, &o->quick, NULL, "fewer repetitions (smoke test)", NULL},
    };
    kvf_flagset_t set = {
        .prog = argv[0],
        .usage = "--model DIR --backend cuda [--device N] [--dtype bf16|f16|f32] "
                 "[--graphs on|off] [--greedy] [--json FILE] [--quick]",
        .summary = "Measures the GPU's copy bandwidth and cuBLAS GEMM rate, then decode step "
                   "time (batch 1, 8, 64; context 1024 and 8192) against the HBM roofline and "
                   "a 2048-token prefill against the GEMM rate, with the CUDA engine. Without "
                   "--backend cuda: the CPU benchmark.",
        .flags = flags,
        .n_flags = KVF_NFLAGS(flags),
    };
    int rc = kvf_flags_parse(&set, argc, argv);
    if (rc == KVF_FLAGS_EXIT)
        return 0;
    if (rc < 0)
        return 2;
    if (!o->model_dir) {
        fprintf(stderr, "%s: --model DIR is required\n", argv[0]);
        return 2;
    }
    if (graphs && strcmp(graphs, "on") != 0 && strcmp(graphs, "off") != 0) {
        fprintf(stderr, "%s: --graphs must be on or off, not '%s'\n", argv[0], graphs);
        return 2;
    }
    if (dtype_alias)
        bf.gpu_dtype = dtype_alias;
    if (graphs)
        bf.no_graphs = !strcmp(graphs, "off");
    kvf_engine_stack_config_t sc;
    memset(&sc, 0, sizeof(sc));
    if (kvf_backend_flags_apply(&bf, &sc) != KVF_OK)
        return 2; /* logged */
    if (sc.backend != KVF_BACKEND_CUDA) {
        fprintf(stderr, "%s: this is the CUDA benchmark; --backend must be cuda\n", argv[0]);
        return 2;
    }
    o->cuda = sc.cuda;
    return -1;
}

/* Returns -1 when this kvf has CUDA and the machine the GPU asked for,
 * else the exit code after one line on stderr. */
static int check_gpu(const char *prog, int device)
{
    if (!kvf_gpu_built_with_cuda()) {
        fprintf(stderr,
                "%s: --backend cuda: this kvf was built without CUDA (configure with "
                "-DKVF_CUDA=ON where nvcc is installed)\n",
                prog);
        return 1;
    }
    int n_gpus = kvf_gpu_count();
    if (n_gpus == 0) {
        char why[256];
        kvf_gpu_describe(why, sizeof(why));
        fprintf(stderr, "%s: --backend cuda: no GPU on this machine (%s)\n", prog, why);
        return 1;
    }
    if (device >= n_gpus) {
        fprintf(stderr, "%s: --device %d: this machine has GPUs 0..%d\n", prog, device,
                n_gpus - 1);
        return 2;
    }
    return -1;
}

int kvf_bench_engine_cuda(int argc, char **argv)
{
    cuda_bench_opts_t o;
    int rc = parse_cuda_opts(argc, argv, &o);
    if (rc < 0)
        rc = check_gpu(argv[0], o.cuda.device);
    if (rc >= 0)
        return rc;
#ifdef KVF_HAVE_CUDA
    return run_cuda_bench(argv[0], &o);
#else
    return 1; /* not reached: kvf_gpu_built_with_cuda() said no above */
#endif
}
