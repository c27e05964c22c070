/* kvf bench kv-accuracy: each KV cache format against the f32 cache, on
 * one model, with the CPU backend.
 *
 *  - Prompts: --prompts fixed token sequences (ids drawn from a fixed seed
 *    per prompt, lengths spread over the model's context), the same in
 *    every run and for every format.
 *  - Logit error: the last prompt position's logits after prefill, then
 *    the logits of --steps - 1 decode steps fed the f32 cache's greedy
 *    tokens (teacher-forced on the f32 path, so every format sees the same
 *    inputs): max and mean |logit - f32 logit|.
 *  - Greedy agreement: of the --steps greedy choices (the prefill's and
 *    each decode step's), how many equal the f32 cache's.
 *  - Perplexity, teacher-forced: the mean NLL of a fixed English text (the
 *    model's tokenizer) and of a text the model itself wrote (sampled at
 *    temperature 1 from the f32 cache with a fixed seed, in distribution
 *    for the model, so its NLL is not near log(vocab) as random text is on
 *    a random model); the change is exp(NLL - NLL_f32) - 1.
 * A format the engine refuses is reported as unavailable. */
#include "bench_kv_accuracy.h"
#include "bench_util.h"

#include "kvf/backend.h"
#include "kvf/engine.h"
#include "kvf/flags.h"
#include "kvf/kv_format.h"
#include "kvf/kvcache.h"
#include "kvf/log.h"
#include "kvf/model.h"
#include "kvf/sampling.h"
#include "kvf/tokenizer.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_FORMATS      5
#define MAX_PROMPT_LEN 1024u
#define SELF_TEXT_LEN  256u

static const kvf_kv_dtype_t formats[N_FORMATS] = {KVF_KV_F32, KVF_KV_BF16, KVF_KV_F16,
                                                  KVF_KV_FP8, KVF_KV_INT8};

/* The fixed text of the perplexity measurement (written for this bench). */
static const char fixed_text[] =
    "The harbour was quiet before dawn. Fishing boats rocked against the pier while the gulls "
    "waited on the roofs of the sheds, and an old man walked along the water with a lantern, "
    "counting the ropes as he did every morning. When the first light came over the hills, the "
    "market opened: bread, salted fish, apples from the valley and coffee so strong that the "
    "sailors said it could lift an anchor. Children ran between the stalls, and the baker's dog "
    "followed them, hoping that somebody would drop a roll. By noon the boats were far out at "
    "sea, the square was empty again, and only the church bell marked the hours until evening.";

typedef struct {
    double max_abs, sum_abs;
    uint64_t n;
} err_acc_t;

/* One format's engine and what it measured. */
typedef struct {
    kvf_kv_dtype_t dtype;
    bool ok; /* the engine accepted the format */
    kvf_engine_stack_t st;
    kvf_block_table_t bt;
    float *logits; /* (max_len, vocab) */
    err_acc_t prefill, steps;
    int agree, total;
    double nll_text, nll_self;
} fmt_run_t;

typedef struct {
    const char *model_dir, *json;
    int prompts, steps, threads;
} acc_opts_t;

typedef struct {
    const acc_opts_t *o;
    fmt_run_t f[N_FORMATS];
    int vocab;
    uint32_t max_len, prompt_cap;
    float *ref;     /* (steps, vocab): the f32 cache's logits of one prompt */
    uint32_t *path; /* (steps) the f32 cache's greedy tokens */
    uint32_t *seq;  /* (max_len) the prompt and its path */
    uint32_t *text, *self;
    uint32_t n_text, n_self;
} acc_run_t;

/* The largest logit's id (the lowest on ties). */
static uint32_t argmax(const float *v, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return (uint32_t)best;
}

static void err_add(err_acc_t *e, const float *x, const float *ref, int n)
{
    for (int i = 0; i < n; i++) {
        double d = fabs((double)x[i] - (double)ref[i]);
        e->max_abs = d > e->max_abs ? d : e->max_abs;
        e->sum_abs += d;
    }
    e->n += (uint64_t)n;
}

static double err_mean(const err_acc_t *e)
{
    return e->n ? e->sum_abs / (double)e->n : 0;
}

/* -log softmax(row)[id], in double. */
static double nll_of(const float *row, int n, uint32_t id)
{
    double mx = row[0];
    for (int i = 1; i < n; i++)
        mx = row[i] > mx ? row[i] : mx;
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += exp((double)row[i] - mx);
    return log(sum) + mx - (double)row[id];
}

/* n tokens at start through f's engine (the table grown to cover them);
 * logits of the last, or of every token with all. */
static kvf_status_t feed(fmt_run_t *f, const uint32_t *ids, uint32_t start, uint32_t n, bool all)
{
    kvf_status_t st = kvf_block_table_reserve(&f->bt, f->st.pool, start + n);
    if (st != KVF_OK)
        return st;
    kvf_engine_seq_t q = {.tokens = ids, .n_tokens = n, .start_pos = start,
                          .block_ids = f->bt.blocks, .n_blocks = f->bt.n_blocks,
                          .all_logits = all, .logits = f->logits};
    return kvf_engine_forward(f->st.engine, &q, 1, NULL);
}

/* Prompt p of the set: its length and ids (a fixed seed per prompt). */
static uint32_t make_prompt(acc_run_t *a, int p)
{
    uint32_t span = a->prompt_cap > 8 ? a->prompt_cap - 8 : 1;
    uint32_t len = 8 + (uint32_t)(37 * p) % span;
    uint64_t rng = 0x6b76616363ull + (uint64_t)p; /* "kvacc" */
    for (uint32_t i = 0; i < len; i++)
        a->seq[i] = (uint32_t)(kvf_splitmix64(&rng) % (uint64_t)a->vocab);
    return len;
}

/* One prompt and its steps through f. The f32 run (record) stores the
 * logits and greedy path the others are measured against. */
static kvf_status_t run_prompt(acc_run_t *a, fmt_run_t *f, uint32_t len, bool record)
{
    const int V = a->vocab, steps = a->o->steps;
    kvf_block_table_release(&f->bt, f->st.pool);
    kvf_status_t st = feed(f, a->seq, 0, len, false);
    for (int s = 0; s < steps && st == KVF_OK; s++) {
        if (s > 0)
            st = feed(f, &a->path[s - 1], len + (uint32_t)s - 1, 1, false);
        if (st != KVF_OK)
            break;
        uint32_t tok = argmax(f->logits, V);
        float *ref = a->ref + (size_t)s * (size_t)V;
        if (record) {
            memcpy(ref, f->logits, (size_t)V * sizeof(float));
            a->path[s] = tok;
        }
        err_add(s == 0 ? &f->prefill : &f->steps, f->logits, ref, V);
        f->agree += tok == a->path[s];
        f->total++;
    }
    kvf_block_table_release(&f->bt, f->st.pool);
    return st;
}

/* Mean NLL of ids[1..n) given the ones before, teacher-forced in one
 * forward. */
static kvf_status_t text_nll(fmt_run_t *f, int vocab, const uint32_t *ids, uint32_t n,
                             double *nll_p)
{
    kvf_block_table_release(&f->bt, f->st.pool);
    kvf_status_t st = feed(f, ids, 0, n, true);
    kvf_block_table_release(&f->bt, f->st.pool);
    if (st != KVF_OK)
        return st;
    double sum = 0;
    for (uint32_t i = 0; i + 1 < n; i++)
        sum += nll_of(f->logits + (size_t)i * (size_t)vocab, vocab, ids[i + 1]);
    *nll_p = sum / (double)(n - 1);
    return KVF_OK;
}

/* The self text: SELF_TEXT_LEN tokens sampled at temperature 1 from the
 * f32 cache, from BOS (id 0 without one), with a fixed seed. */
static kvf_status_t make_self_text(acc_run_t *a, const kvf_model_config_t *c)
{
    fmt_run_t *f = &a->f[0];
    const int V = a->vocab;
    uint64_t rng = 0x73656c66ull; /* "self" */
    a->self[0] = c->bos_id >= 0 ? (uint32_t)c->bos_id : 0;
    kvf_block_table_release(&f->bt, f->st.pool);
    for (uint32_t i = 1; i < a->n_self; i++) {
        kvf_status_t st = feed(f, &a->self[i - 1], i - 1, 1, false);
        if (st != KVF_OK)
            return st;
        double mx = f->logits[0], sum = 0;
        for (int k = 1; k < V; k++)
            mx = f->logits[k] > mx ? f->logits[k] : mx;
        for (int k = 0; k < V; k++)
            sum += exp((double)f->logits[k] - mx);
        double u = (double)(kvf_splitmix64(&rng) >> 11) / 9007199254740992.0 * sum, acc = 0;
        uint32_t pick = (uint32_t)V - 1;
        for (int k = 0; k < V; k++) {
            acc += exp((double)f->logits[k] - mx);
            if (acc > u) {
                pick = (uint32_t)k;
                break;
            }
        }
        a->self[i] = pick;
    }
    kvf_block_table_release(&f->bt, f->st.pool);
    return KVF_OK;
}

/* The fixed text in the model's tokenizer, cut to the context. */
static kvf_status_t load_text(acc_run_t *a)
{
    kvf_tokenizer_t *tok;
    kvf_status_t st = kvf_tokenizer_load(a->o->model_dir, &tok);
    if (st != KVF_OK)
        return st;
    size_t n = 0;
    st = kvf_tokenizer_encode(tok, fixed_text, strlen(fixed_text), true, &a->text, &n);
    kvf_tokenizer_destroy(tok);
    if (st != KVF_OK)
        return st;
    a->n_text = (uint32_t)(n < a->max_len ? n : a->max_len);
    for (uint32_t i = 0; i < a->n_text; i++)
        if (a->text[i] >= (uint32_t)a->vocab)
            return KVF_ERR_MISMATCH;
    return a->n_text >= 2 ? KVF_OK : KVF_ERR_INVAL;
}

/* Returns -1 to run, else the exit code. */
static int parse_acc_opts(int argc, char **argv, acc_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->prompts = 8;
    o->steps = 32;
    const kvf_flag_t flags[] = {
        {"model", KVF_FLAG_STRING, &o->model_dir, "DIR", "model directory", NULL},
        {"prompts", KVF_FLAG_INT, &o->prompts, "N", "prompts of the fixed set (default 8)", NULL},
        {"steps", KVF_FLAG_INT, &o->steps, "N", "greedy steps per prompt (default 32)", NULL},
        {"threads", KVF_FLAG_INT, &o->threads, "N", "compute threads (default: all cores)", NULL},
        {"json", KVF_FLAG_STRING, &o->json, "FILE", "also write the results as JSON", NULL},
    };
    kvf_flagset_t set = {
        .prog = argv[0],
        .usage = "--model DIR [--prompts N] [--steps N] [--threads N] [--json FILE]",
        .summary = "Each KV cache format (f32, bf16, f16, fp8, int8) against the f32 cache: "
                   "max and mean logit error after prefill and along the f32 greedy path, "
                   "greedy agreement, and the perplexity change on a fixed text and on a "
                   "text the model wrote.",
        .flags = flags,
        .n_flags = KVF_NFLAGS(flags),
    };
    int rc = kvf_flags_parse(&set, argc, argv);
    if (rc == KVF_FLAGS_EXIT)
        return 0;
    if (rc < 0)
        return 2;
    if (!o->model_dir || o->prompts < 1 || o->steps < 1) {
        fprintf(stderr, "%s: --model DIR is required; --prompts and --steps must be >= 1\n",
                argv[0]);
        return 2;
    }
    return -1;
}

/* Every format's stack (a format the engine refuses is marked, not an
 * error; f32 must work) and the run's buffers. */
static kvf_status_t acc_setup(acc_run_t *a)
{
    for (int i = 0; i < N_FORMATS; i++) {
        fmt_run_t *f = &a->f[i];
        f->dtype = formats[i];
        kvf_block_table_init(&f->bt);
    }
    kvf_model_t *probe;
    kvf_status_t st = kvf_model_load(a->o->model_dir, &probe);
    if (st != KVF_OK)
        return st;
    a->vocab = probe->cfg.vocab;
    uint32_t ctx = (uint32_t)probe->cfg.max_pos;
    kvf_model_destroy(probe);
    if (ctx <= (uint32_t)a->o->steps + 8)
        return KVF_ERR_INVAL;
    a->prompt_cap = ctx - (uint32_t)a->o->steps;
    a->prompt_cap = a->prompt_cap < MAX_PROMPT_LEN ? a->prompt_cap : MAX_PROMPT_LEN;
    a->max_len = a->prompt_cap + (uint32_t)a->o->steps;
    a->n_self = SELF_TEXT_LEN < a->max_len ? SELF_TEXT_LEN : a->max_len;
    for (int i = 0; i < N_FORMATS; i++) {
        fmt_run_t *f = &a->f[i];
        kvf_engine_stack_config_t cfg = {
            .threads = a->o->threads, .block_size = KVF_KV_BLOCK_SIZE_DEFAULT,
            .kv_dtype = f->dtype,
            .max_blocks = (a->max_len + KVF_KV_BLOCK_SIZE_DEFAULT - 1) / KVF_KV_BLOCK_SIZE_DEFAULT + 1};
        f->ok = kvf_engine_stack_init(&f->st, a->o->model_dir, &cfg) == KVF_OK;
        if (f->ok)
            f->logits = malloc((size_t)a->max_len * (size_t)a->vocab * sizeof(float));
        if (f->ok && !f->logits)
            return KVF_ERR_NOMEM;
    }
    if (!a->f[0].ok)
        return KVF_ERR_INTERNAL;
    a->ref = malloc((size_t)a->o->steps * (size_t)a->vocab * sizeof(float));
    a->path = calloc((size_t)a->o->steps, sizeof(uint32_t));
    a->seq = calloc(a->max_len, sizeof(uint32_t));
    a->self = calloc(a->max_len, sizeof(uint32_t));
    if (!a->ref || !a->path || !a->seq || !a->self)
        return KVF_ERR_NOMEM;
    return load_text(a);
}

/* Every measurement, the f32 cache first in each. */
static kvf_status_t acc_measure(acc_run_t *a)
{
    const kvf_model_config_t *c = &a->f[0].st.model->cfg;
    kvf_status_t st = make_self_text(a, c);
    for (int p = 0; p < a->o->prompts && st == KVF_OK; p++) {
        uint32_t len = make_prompt(a, p);
        for (int i = 0; i < N_FORMATS && st == KVF_OK; i++)
            if (a->f[i].ok)
                st = run_prompt(a, &a->f[i], len, i == 0);
    }
    for (int i = 0; i < N_FORMATS && st == KVF_OK; i++) {
        fmt_run_t *f = &a->f[i];
        if (!f->ok)
            continue;
        st = text_nll(f, a->vocab, a->text, a->n_text, &f->nll_text);
        if (st == KVF_OK)
            st = text_nll(f, a->vocab, a->self, a->n_self, &f->nll_self);
    }
    return st;
}

static void acc_report(acc_run_t *a, cJSON *out)
{
    const kvf_model_config_t *c = &a->f[0].st.model->cfg;
    const char *isa = kvf_cpu_isa_name(kvf_backend_cpu_isa(&a->f[0].st.backend));
    const fmt_run_t *r = &a->f[0];
    printf("kv-accuracy %s: %s, %d layers, %d/%d heads, head_dim %d, vocab %d; %d prompts of "
           "%d greedy steps; text %u tokens, self text %u; %s kernels\n",
           a->o->model_dir, c->arch_name, c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim,
           c->vocab, a->o->prompts, a->o->steps, a->n_text, a->n_self, isa);
    printf("f32 cache: text NLL %.4f (ppl %.2f), self text NLL %.4f (ppl %.2f)\n\n", r->nll_text,
           exp(r->nll_text), r->nll_self, exp(r->nll_self));
    printf("%-5s %12s %12s %12s %12s %9s %11s %11s\n", "kv", "prefill max", "prefill mean",
           "steps max", "steps mean", "greedy", "text ppl", "self ppl");
    cJSON_AddStringToObject(out, "model", a->o->model_dir);
    cJSON_AddStringToObject(out, "isa", isa);
    cJSON_AddNumberToObject(out, "prompts", a->o->prompts);
    cJSON_AddNumberToObject(out, "steps", a->o->steps);
    cJSON *fm = cJSON_AddObjectToObject(out, "formats");
    for (int i = 0; i < N_FORMATS; i++) {
        const fmt_run_t *f = &a->f[i];
        const char *name = kvf_kv_dtype_name(f->dtype);
        if (!f->ok) {
            printf("%-5s (the engine does not accept this format)\n", name);
            cJSON_AddNullToObject(fm, name);
            continue;
        }
        double dt = exp(f->nll_text - r->nll_text) - 1, ds = exp(f->nll_self - r->nll_self) - 1;
        printf("%-5s %12.3g %12.3g %12.3g %12.3g %5d/%-3d %+10.4f%% %+10.4f%%\n", name,
               f->prefill.max_abs, err_mean(&f->prefill), f->steps.max_abs, err_mean(&f->steps),
               f->agree, f->total, 100 * dt, 100 * ds);
        cJSON *j = cJSON_AddObjectToObject(fm, name);
        cJSON_AddNumberToObject(j, "prefill_max_abs", f->prefill.max_abs);
        cJSON_AddNumberToObject(j, "prefill_mean_abs", err_mean(&f->prefill));
        cJSON_AddNumberToObject(j, "steps_max_abs", f->steps.max_abs);
        cJSON_AddNumberToObject(j, "steps_mean_abs", err_mean(&f->steps));
        cJSON_AddNumberToObject(j, "greedy_agree", f->agree);
        cJSON_AddNumberToObject(j, "greedy_total", f->total);
        cJSON_AddNumberToObject(j, "text_nll", f->nll_text);
        cJSON_AddNumberToObject(j, "text_ppl_change", dt);
        cJSON_AddNumberToObject(j, "self_nll", f->nll_self);
        cJSON_AddNumberToObject(j, "self_ppl_change", ds);
    }
}

static void acc_fini(acc_run_t *a)
{
    for (int i = 0; i < N_FORMATS; i++) {
        fmt_run_t *f = &a->f[i];
        if (f->st.pool)
            kvf_block_table_release(&f->bt, f->st.pool);
        kvf_block_table_fini(&f->bt);
        free(f->logits);
        kvf_engine_stack_fini(&f->st);
    }
    free(a->ref);
    free(a->path);
    free(a->seq);
    free(a->text);
    free(a->self);
}

int kvf_bench_kv_accuracy(int argc, char **argv)
{
    acc_opts_t o;
    int rc = parse_acc_opts(argc, argv, &o);
    if (rc >= 0)
        return rc;
    acc_run_t a;
    memset(&a, 0, sizeof(a));
    a.o = &o;
    rc = 1;
    kvf_status_t st = acc_setup(&a);
    if (st == KVF_OK)
        st = acc_measure(&a);
    if (st != KVF_OK) {
        fprintf(stderr, "%s: %s: %s\n", argv[0], o.model_dir, kvf_status_str(st));
        goto done;
    }
    cJSON *out = cJSON_CreateObject();
    acc_report(&a, out);
    rc = o.json ? kvf_bench_write_json(out, o.json, argv[0]) : 0;
    cJSON_Delete(out);
done:
    acc_fini(&a);
    return rc;
}
