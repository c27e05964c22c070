/* kvf bench engine: the CPU engine against ceilings measured in the same
 * run (docs/DESIGN.md, "Measuring performance").
 *
 *  - Memory read bandwidth: every thread streams its share of a buffer with
 *    512-bit loads (AVX-512 CPUs; 256-bit otherwise), best of several
 *    passes, for a buffer the size of the weights and one of 1 GiB; the
 *    larger result is the ceiling (a low ceiling would flatter the ratios).
 *  - sgemm rate: OpenBLAS on 2048^3 with its own threads (the engine has
 *    its own kernels; OpenBLAS is the reference rate).
 *  - Decode at batch 1, 8, 32 (context 256 each): step time against
 *    roofline = (weight bytes + KV bytes read per step) / bandwidth, the
 *    weight bytes those the backend holds (2 a parameter for bf16/f16
 *    weights kept native). With 16-bit weights, batch 1 is also timed on
 *    the same weights widened to f32 (--cpu-dtype f32), for the speedup.
 *  - Prefill of 128/512/2048-token prompts: forward FLOPs / time against the
 *    sgemm rate.
 *  - KV-cache experiment: generating n tokens with the cache vs recomputing
 *    the whole sequence every step. Step times are measured at 8 context
 *    lengths spread over 1..n and integrated (trapezoid); the measured ratio
 *    is printed beside 2n/3, the ratio of the attention term alone.
 *  - Decode at contexts 4k and 16k for every KV format (bench_engine_kv.c).
 * Times are the best of their repetitions: on a shared machine, other
 * tenants only ever add time. Decode steps and prompts also report their
 * median repetition (the typical step, which a serving run sees: kvf
 * simulate --profile measure takes it). */
#include "bench_engine.h"
#include "bench_engine_kv.h"
#include "bench_util.h"

#include "kvf/backend.h"
#include "kvf/clock.h"
#include "kvf/engine.h"
#include "kvf/flags.h"
#include "kvf/kvcache.h"
#include "kvf/log.h"
#include "kvf/model.h"
#include "kvf/threadpool.h"

#include <cblas.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define BENCH_X86 1
#endif

/* ---- memory bandwidth ---------------------------------------------- */

typedef struct {
    const float *buf;
    size_t n_floats;
    int n_parts;
    bool avx512;
    float sink[64]; /* per task, so the loads are not optimized away */
} bw_job_t;

#ifdef BENCH_X86
__attribute__((target("avx512f"))) static float read_avx512(const float *p, size_t n)
{
    /* Eight independent 64-byte loads per iteration (eight cache lines in
     * flight per pass of the loop), so the load queue, not the adds,
     * sets the pace. */
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
           a7 = a0;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        a0 = _mm512_add_ps(a0, _mm512_load_ps(p + i));
        a1 = _mm512_add_ps(a1, _mm512_load_ps(p + i + 16));
        a2 = _mm512_add_ps(a2, _mm512_load_ps(p + i + 32));
        a3 = _mm512_add_ps(a3, _mm512_load_ps(p + i + 48));
        a4 = _mm512_add_ps(a4, _mm512_load_ps(p + i + 64));
        a5 = _mm512_add_ps(a5, _mm512_load_ps(p + i + 80));
        a6 = _mm512_add_ps(a6, _mm512_load_ps(p + i + 96));
        a7 = _mm512_add_ps(a7, _mm512_load_ps(p + i + 112));
    }
    a0 = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
    a4 = _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7));
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a4));
}

__attribute__((target("avx2"))) static float read_avx2(const float *p, size_t n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 32 <= n; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
        a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}
#endif

static void bw_task(void *arg, int task, int thread)
{
    (void)thread;
    bw_job_t *j = arg;
    size_t per = (j->n_floats / (size_t)j->n_parts) & ~(size_t)127;
    const float *p = j->buf + per * (size_t)task;
    float s = 0;
#ifdef BENCH_X86
    s = j->avx512 ? read_avx512(p, per) : read_avx2(p, per);
#else
    for (size_t i = 0; i < per; i++)
        s += p[i];
#endif
    j->sink[task % 64] += s;
}

/* Read-bandwidth ceiling: buffers allocated once, sampled again and again
 * through the run; the best sample is the ceiling. */
typedef struct {
    kvf_threadpool_t *tp;
    float *buf[2];
    size_t bytes[2];
    double best[2]; /* bytes/s per buffer */
} bw_meter_t;

static kvf_status_t bw_meter_init(bw_meter_t *m, int threads, size_t weights_bytes,
                                  size_t big_bytes)
{
    memset(m, 0, sizeof(*m));
    kvf_status_t st = kvf_threadpool_create(threads, &m->tp);
    if (st != KVF_OK)
        return st;
    m->bytes[0] = (weights_bytes + 4095) & ~(size_t)4095;
    m->bytes[1] = big_bytes;
    for (int i = 0; i < 2; i++) {
        m->buf[i] = aligned_alloc(4096, m->bytes[i]);
        if (!m->buf[i])
            return KVF_ERR_NOMEM;
        for (size_t k = 0; k < m->bytes[i] / sizeof(float); k++)
            m->buf[i][k] = (float)(k & 7);
    }
    return KVF_OK;
}

static void bw_meter_fini(bw_meter_t *m)
{
    kvf_threadpool_destroy(m->tp);
    free(m->buf[0]);
    free(m->buf[1]);
}

static void bw_sample(bw_meter_t *m, int passes)
{
    for (int i = 0; i < 2; i++) {
        bw_job_t j = {.buf = m->buf[i], .n_floats = m->bytes[i] / sizeof(float),
                      .n_parts = kvf_threadpool_size(m->tp)};
#ifdef BENCH_X86
        __builtin_cpu_init();
        j.avx512 = __builtin_cpu_supports("avx512f");
#endif
        size_t per = (j.n_floats / (size_t)j.n_parts) & ~(size_t)127;
        for (int p = 0; p < passes; p++) {
            uint64_t t0 = kvf_clock_ns();
            kvf_threadpool_run(m->tp, bw_task, &j, j.n_parts);
            double s = (double)(kvf_clock_ns() - t0) * 1e-9;
            double bw = (double)(per * (size_t)j.n_parts * sizeof(float)) / s;
            m->best[i] = bw > m->best[i] ? bw : m->best[i];
        }
    }
}

static double bw_best(const bw_meter_t *m)
{
    return m->best[0] > m->best[1] ? m->best[0] : m->best[1];
}

/* ---- sgemm rate ------------------------------------------------------ */

/* sgemm ceiling: n^3 products by OpenBLAS with its own threads (as many
 * as the engine's); best sample of the run. (The engine does not call
 * OpenBLAS: its own kernels are measured against this.) */
typedef struct {
    int n, threads;
    float *a, *b, *c; /* (n, n) each */
    double best;
} sgemm_meter_t;

static kvf_status_t sgemm_meter_init(sgemm_meter_t *m, int n, int threads)
{
    memset(m, 0, sizeof(*m));
    m->n = n;
    m->threads = threads;
    m->a = aligned_alloc(64, (size_t)n * n * sizeof(float));
    m->b = aligned_alloc(64, (size_t)n * n * sizeof(float));
    m->c = aligned_alloc(64, (size_t)n * n * sizeof(float));
    if (!m->a || !m->b || !m->c)
        return KVF_ERR_NOMEM;
    for (size_t i = 0; i < (size_t)n * n; i++) {
        m->a[i] = (float)((i * 7) % 13) * 0.01f;
        m->b[i] = (float)((i * 5) % 11) * 0.01f;
    }
    return KVF_OK;
}

static void sgemm_meter_fini(sgemm_meter_t *m)
{
    free(m->a);
    free(m->b);
    free(m->c);
}

static void sgemm_sample(sgemm_meter_t *m, int reps)
{
    const int n = m->n;
    const double flops = 2.0 * n * (double)n * n;
    openblas_set_num_threads(m->threads);
    for (int r = 0; r < reps + 1; r++) {
        uint64_t t0 = kvf_clock_ns();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, m->a, n, m->b, n,
                    0.0f, m->c, n);
        double rate = flops / ((double)(kvf_clock_ns() - t0) * 1e-9);
        if (r > 0) /* the first warms up OpenBLAS's buffers and threads */
            m->best = rate > m->best ? rate : m->best;
    }
    openblas_set_num_threads(1); /* its threads idle between samples */
}

/* ---- engine runs ------------------------------------------------------ */

typedef struct {
    kvf_model_t *model;
    kvf_backend_t be;
    kvf_kvpool_t *pool;
    kvf_engine_t *engine;
    float *logits;     /* (max_batch, vocab) */
    uint32_t *tokens;  /* (max_tokens) */
} bench_rig_t;

/* A sequence of n_ctx tokens (start_pos 0) through the engine; returns the
 * seconds it took. The table must cover the positions. */
static double run_forward(bench_rig_t *r, kvf_block_table_t *bt, uint32_t start, uint32_t n)
{
    kvf_engine_seq_t q = {.tokens = r->tokens + start, .n_tokens = n, .start_pos = start,
                          .block_ids = bt->blocks, .n_blocks = bt->n_blocks,
                          .logits = r->logits};
    uint64_t t0 = kvf_clock_ns();
    kvf_status_t st = kvf_engine_forward(r->engine, &q, 1, NULL);
    double s = (double)(kvf_clock_ns() - t0) * 1e-9;
    return st == KVF_OK ? s : -1;
}

/* One decode step for a batch of b sequences of context ctx each. */
static double run_decode_step(bench_rig_t *r, kvf_block_table_t *bts, int b, uint32_t ctx)
{
    kvf_engine_seq_t *q = calloc((size_t)b, sizeof(*q));
    if (!q)
        return -1;
    for (int i = 0; i < b; i++) {
        q[i].tokens = r->tokens + ctx + (uint32_t)i;
        q[i].n_tokens = 1;
        q[i].start_pos = ctx;
        q[i].block_ids = bts[i].blocks;
        q[i].n_blocks = bts[i].n_blocks;
        q[i].logits = r->logits + (size_t)i * r->model->cfg.vocab;
    }
    uint64_t t0 = kvf_clock_ns();
    kvf_status_t st = kvf_engine_forward(r->engine, q, b, NULL);
    double s = (double)(kvf_clock_ns() - t0) * 1e-9;
    free(q);
    return st == KVF_OK ? s : -1;
}

static double best_of(double a, double b)
{
    if (a < 0)
        return b;
    if (b < 0)
        return a;
    return a < b ? a : b;
}

/* True when argv asks for the CUDA engine (--backend cuda, --backend=cuda). */
static bool wants_cuda(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend=cuda") ||
            (!strcmp(argv[i], "--backend") && i + 1 < argc && !strcmp(argv[i + 1], "cuda")))
            return true;
    }
    return false;
}

/* ---- the run ------------------------------------------------------------ */

#define DEC_CTX   256u        /* context of every decode sequence */
#define MAX_SEQ   (2048 + 8u) /* the longest prefill, with room to spare */
#define N_DEC_SEQ 32          /* decode sequences: the largest batch */

/* 2 and 4: the batches a small node serves at moderate load, where a
 * CPU's step is neither the batch-1 weight stream nor the batch-8 rate
 * (kvf simulate --profile measure fits each) */
#define N_DEC_BATCHES 5
static const int dec_batches[N_DEC_BATCHES] = {1, 2, 4, 8, N_DEC_SEQ};
#define DEC_B8 3 /* dec_batches' batch 8 */
static const uint32_t prefill_prompts[3] = {128, 512, 2048};

typedef struct {
    const char *model_dir, *json;
    int threads;
    bool quick;
    kvf_cpu_config_t ccfg; /* threads and weight dtype of the backend */
} engine_opts_t;

/* Everything one run holds; engine_run_fini() frees what was made. */
typedef struct {
    const engine_opts_t *o;
    bench_rig_t r;   /* the backend as configured */
    bench_rig_t r32; /* 16-bit weights: an f32 twin of the backend (shares r's pool) */
    kvf_block_table_t bts[N_DEC_SEQ], bt; /* decode sequences; the prefill sequence */
    bw_meter_t bwm;
    sgemm_meter_t sgm;
    kvf_kv_geometry_t g;
    double weight_bytes; /* streamed per decode step, as the backend holds them */
    double kv_tok;       /* KV bytes per token */
    kvf_dtype_t wdtype;
    cJSON *out;
    double decode_s[N_DEC_BATCHES], decode_f32_s, prefill_s[3]; /* best times */
    double decode_med_s[N_DEC_BATCHES], prefill_med_s[3];      /* typical (median) times */
    int n_prompts;
} engine_run_t;

/* Returns -1 to run, else the exit code (help printed, or a bad flag). */
static int parse_engine_opts(int argc, char **argv, engine_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    const char *cpu_dtype = NULL;
    const kvf_flag_t flags[] = {
        {"model", KVF_FLAG_STRING, &o->model_dir, "DIR", "model directory (e.g. from kvf mkmodel)",
         NULL},
        {"threads", KVF_FLAG_INT, &o->threads, "N", "compute threads (default: all cores)", NULL},
        {"json", KVF_FLAG_STRING, &o->json, "FILE", "also write the results as JSON", NULL},
        {"quick", KVF_FLAG_BOOL, &o->quick, NULL, "fewer sizes and repetitions (smoke test)",
         NULL},
        {"cpu-dtype", KVF_FLAG_STRING, &cpu_dtype, "native|f32",
         "weights as the checkpoint stores them (default) or widened to f32", NULL},
    };
    kvf_flagset_t set = {
        .prog = argv[0],
        .usage = "--model DIR [--threads N] [--cpu-dtype native|f32] [--json FILE] [--quick]",
        .summary = "Measures memory read bandwidth and the OpenBLAS sgemm rate, then decode "
                   "latency (batch 1, 8, 32) against the memory roofline, prefill throughput "
                   "against the sgemm rate, generation with vs without the KV cache, and decode "
                   "at contexts 4k and 16k for each KV cache format (batch 1, 16). "
                   "With --backend cuda: the CUDA engine against the GPU's ceilings (see "
                   "--backend cuda --help).",
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
    o->ccfg = kvf_cpu_config_default();
    if (cpu_dtype && kvf_cpu_weights_parse(cpu_dtype, &o->ccfg.weights) != KVF_OK)
        return 2;
    if (o->threads <= 0)
        o->threads = kvf_cpu_count();
    o->ccfg.n_threads = o->threads;
    return -1;
}

static void engine_run_init(engine_run_t *e, const engine_opts_t *o)
{
    memset(e, 0, sizeof(*e));
    e->o = o;
    for (int i = 0; i < N_DEC_SEQ; i++)
        kvf_block_table_init(&e->bts[i]);
    kvf_block_table_init(&e->bt);
    e->decode_f32_s = -1;
}

/* The backend and the ceilings' meters, and their first samples. */
static kvf_status_t setup_backend_and_ceilings(engine_run_t *e)
{
    const bool quick = e->o->quick;
    /* f32 bytes of the weights a step reads size the bandwidth buffer */
    double f32_bytes = kvf_bench_step_weight_bytes(
        &e->r.model->cfg, (double)kvf_model_weight_bytes(e->r.model), sizeof(float));
    if (bw_meter_init(&e->bwm, e->o->threads, (size_t)f32_bytes,
                      (size_t)1 << (quick ? 28 : 30)) != KVF_OK ||
        kvf_backend_cpu_create_cfg(&e->o->ccfg, &e->r.be) != KVF_OK ||
        sgemm_meter_init(&e->sgm, quick ? 1024 : 2048, e->o->threads) != KVF_OK)
        return KVF_ERR_NOMEM;
    /* Ceilings: sampled now, before every measurement and at the end. */
    bw_sample(&e->bwm, quick ? 3 : 6);
    sgemm_sample(&e->sgm, quick ? 2 : 3);
    return KVF_OK;
}

/* The pool (32 sequences of DEC_CTX + one of MAX_SEQ), the engine, the
 * prompt tokens; prints the model line and starts the JSON report. */
static kvf_status_t setup_engine(engine_run_t *e)
{
    bench_rig_t *r = &e->r;
    const kvf_model_config_t *c = &r->model->cfg;
    e->g = kvf_engine_kv_geometry(r->model, KVF_KV_BLOCK_SIZE_DEFAULT, KVF_KV_F32);
    uint32_t blocks = N_DEC_SEQ * kvf_kv_blocks_for_tokens(&e->g, DEC_CTX + 1) +
                      kvf_kv_blocks_for_tokens(&e->g, MAX_SEQ) + 4;
    if (kvf_kvpool_create(&e->g, blocks, &r->pool) != KVF_OK ||
        kvf_engine_create(r->model, &r->be, r->pool, &r->engine) != KVF_OK)
        return KVF_ERR_INTERNAL;
    r->logits = malloc((size_t)N_DEC_SEQ * c->vocab * sizeof(float));
    r->tokens = malloc((size_t)(MAX_SEQ + 64) * sizeof(uint32_t));
    if (!r->logits || !r->tokens)
        return KVF_ERR_NOMEM;
    /* Weight bytes one decode step streams: the matrices as the backend
     * holds them (the lm_head among them). */
    e->weight_bytes = (double)kvf_backend_cpu_weight_bytes(&r->be);
    e->wdtype = kvf_backend_cpu_weights_dtype(&r->be);
    const char *isa = kvf_cpu_isa_name(kvf_backend_cpu_isa(&r->be));
    printf("model %s: %s, %d layers, hidden %d, %d/%d heads, inter %d, vocab %d; %s weights, "
           "%.1f MB streamed per decode step; %d threads, %s kernels\n",
           e->o->model_dir, c->arch_name, c->n_layers, c->hidden, c->n_heads, c->n_kv_heads,
           c->inter, c->vocab, kvf_dtype_name(e->wdtype), e->weight_bytes / 1e6, e->o->threads,
           isa);
    kvf_bench_random_tokens(r->tokens, MAX_SEQ + 64, c->vocab);
    e->kv_tok = (double)kvf_kv_bytes_per_token(&e->g);
    e->out = cJSON_CreateObject();
    cJSON_AddNumberToObject(e->out, "threads", e->o->threads);
    cJSON_AddStringToObject(e->out, "isa", isa);
    cJSON_AddStringToObject(e->out, "weights_dtype", kvf_dtype_name(e->wdtype));
    cJSON_AddNumberToObject(e->out, "weight_bytes_per_step", e->weight_bytes);
    return KVF_OK;
}

/* The most repetitions one measurement times. */
#define MAX_REPS 32

/* Best decode step of batch b on r over steps timed after one warm-up;
 * the median of those that ran (at most MAX_REPS) into *med_p when not
 * NULL (-1 when none did, as the best). */
static double best_decode_step(engine_run_t *e, bench_rig_t *r, int b, int steps, double *med_p)
{
    double best = -1, all[MAX_REPS];
    int n = 0;
    for (int s = 0; s < steps + 1; s++) {
        double t = run_decode_step(r, e->bts, b, DEC_CTX);
        if (s > 0) {
            best = best_of(best, t);
            if (t >= 0 && n < MAX_REPS)
                all[n++] = t;
        }
    }
    if (med_p)
        *med_p = best < 0 ? best : kvf_bench_median(all, (size_t)n);
    return best;
}

/* Decode steps at each batch over N_DEC_SEQ contexts of DEC_CTX tokens. */
static kvf_status_t measure_decode(engine_run_t *e)
{
    for (int i = 0; i < N_DEC_SEQ; i++) {
        if (kvf_block_table_reserve(&e->bts[i], e->r.pool, DEC_CTX + 1) != KVF_OK)
            return KVF_ERR_NO_SPACE;
    }
    /* Fill the 32 contexts: one prefill, copied by running it per table. */
    for (int i = 0; i < N_DEC_SEQ; i++)
        if (run_forward(&e->r, &e->bts[i], 0, DEC_CTX) < 0)
            return KVF_ERR_INTERNAL;
    for (int bi = 0; bi < N_DEC_BATCHES; bi++) {
        int b = dec_batches[bi];
        bw_sample(&e->bwm, 2);
        e->decode_s[bi] = best_decode_step(e, &e->r, b, e->o->quick ? 5 : (b == 1 ? 30 : 10),
                                           &e->decode_med_s[bi]);
    }
    return KVF_OK;
}

/* 16-bit weights: batch 1 again on an f32 twin of the backend (same
 * model, pool and contexts). */
static kvf_status_t measure_decode_f32(engine_run_t *e)
{
    if (e->wdtype == KVF_DTYPE_F32)
        return KVF_OK;
    kvf_cpu_config_t c32 = e->o->ccfg;
    c32.weights = KVF_CPU_WEIGHTS_F32;
    e->r32 = e->r;
    e->r32.engine = NULL;
    memset(&e->r32.be, 0, sizeof(e->r32.be));
    if (kvf_backend_cpu_create_cfg(&c32, &e->r32.be) != KVF_OK ||
        kvf_engine_create(e->r.model, &e->r32.be, e->r.pool, &e->r32.engine) != KVF_OK)
        return KVF_ERR_INTERNAL;
    bw_sample(&e->bwm, 2);
    e->decode_f32_s = best_decode_step(e, &e->r32, 1, e->o->quick ? 5 : 30, NULL);
    return KVF_OK;
}

/* Best and median forward of each prompt length, each timed after one
 * untimed forward of that length (its first touch of larger activations,
 * a serving node's steady state), an odd number of times so the median is
 * one forward's; then the ceilings' last samples. */
static kvf_status_t measure_prefill(engine_run_t *e)
{
    const bool quick = e->o->quick;
    if (kvf_block_table_reserve(&e->bt, e->r.pool, MAX_SEQ) != KVF_OK)
        return KVF_ERR_NO_SPACE;
    e->n_prompts = quick ? 2 : 3;
    for (int pi = 0; pi < e->n_prompts; pi++) {
        uint32_t n = prefill_prompts[pi];
        int reps = quick ? 3 : (n <= 512 ? 5 : 3);
        sgemm_sample(&e->sgm, 1);
        double best = -1, all[MAX_REPS];
        int ran = 0;
        (void)run_forward(&e->r, &e->bt, 0, n); /* a failure shows in the timed ones */
        for (int i = 0; i < reps; i++) {
            const double t = run_forward(&e->r, &e->bt, 0, n);
            best = best_of(best, t);
            if (t >= 0)
                all[ran++] = t;
        }
        e->prefill_s[pi] = best;
        e->prefill_med_s[pi] = ran > 0 ? kvf_bench_median(all, (size_t)ran) : -1;
    }
    bw_sample(&e->bwm, quick ? 2 : 4);
    sgemm_sample(&e->sgm, quick ? 1 : 2);
    return KVF_OK;
}

static void report_ceilings(engine_run_t *e)
{
    const double bw = bw_best(&e->bwm), sgemm = e->sgm.best;
    printf("memory read bandwidth: %.2f GB/s (best of the run; weights-sized buffer %.2f, "
           "%zu MiB %.2f)\n",
           bw / 1e9, e->bwm.best[0] / 1e9, e->bwm.bytes[1] >> 20, e->bwm.best[1] / 1e9);
    printf("sgemm %d^3: %.1f GFLOP/s (OpenBLAS, %d threads, best of the run)\n", e->sgm.n,
           sgemm / 1e9, e->o->threads);
    cJSON_AddNumberToObject(e->out, "bandwidth_gbs", bw / 1e9);
    cJSON_AddNumberToObject(e->out, "bandwidth_large_gbs", e->bwm.best[1] / 1e9);
    cJSON_AddNumberToObject(e->out, "sgemm_gflops", sgemm / 1e9);
}

/* Decode rows against the roofline, the best bandwidth of the run. */
static void report_decode(engine_run_t *e)
{
    const double bw = bw_best(&e->bwm);
    cJSON *out = e->out;
    printf("\n%-8s %12s %12s %12s %10s %12s\n", "decode", "step ms", "roofline ms", "tokens/s",
           "ratio", "median ms");
    for (int bi = 0; bi < N_DEC_BATCHES; bi++) {
        int b = dec_batches[bi];
        double best = e->decode_s[bi];
        /* each sequence reads its DEC_CTX + 1 positions of K/V per step */
        double bytes = e->weight_bytes + (double)b * (DEC_CTX + 1) * e->kv_tok;
        double roof = bytes / bw;
        double ratio = roof / best;
        printf("batch %-2d %12.3f %12.3f %12.1f %9.1f%% %12.3f\n", b, best * 1e3, roof * 1e3,
               b / best, 100 * ratio, e->decode_med_s[bi] * 1e3);
        char key[64];
        snprintf(key, sizeof(key), "decode_b%d_roofline_ratio", b);
        cJSON_AddNumberToObject(out, key, ratio);
        snprintf(key, sizeof(key), "decode_b%d_step_ms", b);
        cJSON_AddNumberToObject(out, key, best * 1e3);
        snprintf(key, sizeof(key), "decode_b%d_step_ms_median", b);
        cJSON_AddNumberToObject(out, key, e->decode_med_s[bi] * 1e3);
    }
    if (e->decode_f32_s > 0) {
        double f32_s = e->decode_f32_s;
        double bytes32 =
            (double)kvf_backend_cpu_weight_bytes(&e->r32.be) + (DEC_CTX + 1) * e->kv_tok;
        double roof32 = bytes32 / bw;
        printf("batch 1  %12.3f %12.3f %12.1f %9.1f%%   (the same weights widened to f32; %s is "
               "%.2fx its tokens/s)\n",
               f32_s * 1e3, roof32 * 1e3, 1 / f32_s, 100 * roof32 / f32_s,
               kvf_dtype_name(e->wdtype), f32_s / e->decode_s[0]);
        cJSON_AddNumberToObject(out, "decode_b1_f32_step_ms", f32_s * 1e3);
        cJSON_AddNumberToObject(out, "decode_b1_f32_roofline_ratio", roof32 / f32_s);
        cJSON_AddNumberToObject(out, "decode_b1_speedup_vs_f32", f32_s / e->decode_s[0]);
    }
    printf("decode batch 8 step / batch 1 step: %.2f\n", e->decode_s[DEC_B8] / e->decode_s[0]);
    cJSON_AddNumberToObject(out, "decode_b8_over_b1", e->decode_s[DEC_B8] / e->decode_s[0]);
}

/* Prefill rows against the best sgemm rate of the run. */
static void report_prefill(engine_run_t *e)
{
    const kvf_model_config_t *c = &e->r.model->cfg;
    printf("\n%-8s %12s %12s %12s %10s %12s\n", "prefill", "ms", "tokens/s", "GFLOP/s", "of sgemm",
           "median ms");
    for (int pi = 0; pi < e->n_prompts; pi++) {
        uint32_t n = prefill_prompts[pi];
        double best = e->prefill_s[pi];
        double flops = kvf_engine_flops(c, 0, n, 1);
        double ratio = flops / best / e->sgm.best;
        printf("%-8u %12.1f %12.1f %12.1f %9.1f%% %12.1f\n", n, best * 1e3, n / best,
               flops / best / 1e9, 100 * ratio, e->prefill_med_s[pi] * 1e3);
        char key[64];
        snprintf(key, sizeof(key), "prefill_%u_sgemm_ratio", n);
        cJSON_AddNumberToObject(e->out, key, ratio);
        snprintf(key, sizeof(key), "prefill_%u_tokens_per_s", n);
        cJSON_AddNumberToObject(e->out, key, n / best);
        snprintf(key, sizeof(key), "prefill_%u_tokens_per_s_median", n);
        cJSON_AddNumberToObject(e->out, key, n / e->prefill_med_s[pi]);
    }
}

/* Seconds to generate n tokens with the cache and by recomputing, each
 * integrated (trapezoid) over step times at n_points context lengths. */
static kvf_status_t cache_vs_recompute(engine_run_t *e, uint32_t n, int n_points, double *cached_p,
                                       double *recompute_p)
{
    double prev_l = 0, prev_c = 0, prev_r = 0, tot_c = 0, tot_r = 0;
    for (int k = 0; k < n_points; k++) {
        uint32_t L = 1 + (uint32_t)((double)(n - 1) * k / (n_points - 1));
        /* recompute: the whole sequence of L tokens, from scratch */
        double t_r = run_forward(&e->r, &e->bt, 0, L);
        if (L <= 512)
            t_r = best_of(t_r, run_forward(&e->r, &e->bt, 0, L));
        /* cached: one token at position L - 1 over L - 1 cached ones
         * (the recompute above left them in the cache) */
        double t_c = -1;
        for (int i = 0; i < 3; i++)
            t_c = best_of(t_c, run_forward(&e->r, &e->bt, L - 1, 1));
        if (t_r < 0 || t_c < 0)
            return KVF_ERR_INTERNAL;
        if (k > 0) {
            tot_c += 0.5 * (t_c + prev_c) * (L - prev_l);
            tot_r += 0.5 * (t_r + prev_r) * (L - prev_l);
        } else {
            tot_c += t_c;
            tot_r += t_r;
        }
        prev_l = L;
        prev_c = t_c;
        prev_r = t_r;
    }
    *cached_p = tot_c;
    *recompute_p = tot_r;
    return KVF_OK;
}

/* The KV-cache experiment, printed row by row. */
static kvf_status_t measure_cache_speedup(engine_run_t *e)
{
    static const uint32_t ns[] = {128, 512, 1024, 2048};
    const int n_points = e->o->quick ? 4 : 8;
    cJSON *cache = cJSON_AddObjectToObject(e->out, "cache_speedup");
    printf("\n%-8s %14s %14s %10s %10s   (step times at %d context lengths, integrated)\n",
           "n", "cached s", "recompute s", "ratio", "2n/3", n_points);
    for (int ni = 0; ni < (e->o->quick ? 2 : 4); ni++) {
        uint32_t n = ns[ni];
        double tot_c, tot_r;
        kvf_status_t st = cache_vs_recompute(e, n, n_points, &tot_c, &tot_r);
        if (st != KVF_OK)
            return st;
        double ratio = tot_r / tot_c;
        printf("%-8u %14.2f %14.2f %10.1f %10.1f\n", n, tot_c, tot_r, ratio, 2.0 * n / 3);
        char key[32];
        snprintf(key, sizeof(key), "%u", n);
        cJSON_AddNumberToObject(cache, key, ratio);
    }
    return KVF_OK;
}

static void engine_run_fini(engine_run_t *e)
{
    bench_rig_t *r = &e->r;
    bw_meter_fini(&e->bwm);
    sgemm_meter_fini(&e->sgm);
    cJSON_Delete(e->out);
    for (int i = 0; i < N_DEC_SEQ; i++) {
        if (r->pool)
            kvf_block_table_release(&e->bts[i], r->pool);
        kvf_block_table_fini(&e->bts[i]);
    }
    if (r->pool)
        kvf_block_table_release(&e->bt, r->pool);
    kvf_block_table_fini(&e->bt);
    free(r->logits);
    free(r->tokens);
    kvf_engine_destroy(e->r32.engine);
    kvf_backend_destroy(&e->r32.be);
    kvf_engine_destroy(r->engine);
    kvf_kvpool_destroy(r->pool);
    kvf_backend_destroy(&r->be);
    kvf_model_destroy(r->model);
}

int kvf_bench_engine(int argc, char **argv)
{
    if (wants_cuda(argc, argv))
        return kvf_bench_engine_cuda(argc, argv);
    engine_opts_t o;
    int rc = parse_engine_opts(argc, argv, &o);
    if (rc >= 0)
        return rc;
    engine_run_t e;
    engine_run_init(&e, &o);
    rc = 1;
    kvf_status_t st = kvf_model_load(o.model_dir, &e.r.model);
    if (st != KVF_OK) {
        fprintf(stderr, "%s: cannot load %s: %s\n", argv[0], o.model_dir, kvf_status_str(st));
        goto done;
    }
    if (setup_backend_and_ceilings(&e) != KVF_OK || setup_engine(&e) != KVF_OK ||
        measure_decode(&e) != KVF_OK || measure_decode_f32(&e) != KVF_OK)
        goto fail_run;
    for (int i = 0; i < N_DEC_SEQ; i++)
        kvf_block_table_release(&e.bts[i], e.r.pool);
    if (measure_prefill(&e) != KVF_OK)
        goto fail_run;
    /* Ratios against the best ceilings seen in the whole run. */
    report_ceilings(&e);
    report_decode(&e);
    report_prefill(&e);
    if (measure_cache_speedup(&e) != KVF_OK)
        goto fail_run;
    /* Long contexts read far more K/V than a cache holds: the 1 GiB
     * buffer's bandwidth, not the best of a weights-sized one. */
    kvf_bench_kv_decode_t kv = {.model = e.r.model, .backend = &e.r.be,
                                .weight_bytes = e.weight_bytes, .bandwidth = e.bwm.best[1],
                                .quick = o.quick};
    if (kvf_bench_engine_kv_decode(&kv, e.out) != 0)
        goto fail_run;
    rc = o.json ? kvf_bench_write_json(e.out, o.json, argv[0]) : 0;
    goto done;

fail_run:
    fprintf(stderr, "%s: benchmark setup or run failed\n", argv[0]);
done:
    engine_run_fini(&e);
    return rc;
}
