/* kvf generate: colocated single-process generation (the reference the
 * cluster's output is compared with), or, with --router, a client of a
 * running cluster. */
#include "commands.h"
#include "kvf/auth.h"
#include "kvf/backend_flags.h"
#include "kvf/flags.h"
#include "kvf/log.h"
#include "kvf/sampling.h"
#include "kvf/textstream.h"
#include "kvf/tokenizer.h"
#include "local_engine.h"
#include "remote.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *model_dir, *prompt, *prompt_ids, *stop, *router, *cluster_key_file;
    int max_tokens, top_k, threads, timeout_ms;
    kvf_backend_flags_t bf;
    double temperature, top_p;
    uint64_t seed;
    bool ignore_eos, print_ids, seed_seen, verbose;
    kvf_sampling_params_t sp; /* from the above */
} gen_opts_t;

/* Returns -1 to run, else the exit code (help printed, or bad options). */
static int parse_gen_opts(int argc, char **argv, gen_opts_t *o)
{
    *o = (gen_opts_t){.max_tokens = 128, .timeout_ms = 60000, .top_p = 1};
    const kvf_flag_t flags[] = {
        {"model", KVF_FLAG_STRING, &o->model_dir, "DIR", "Hugging Face model directory", NULL},
        {"prompt", KVF_FLAG_STRING, &o->prompt, "TEXT",
         "prompt text (BOS per the tokenizer config)", NULL},
        {"prompt-ids", KVF_FLAG_STRING, &o->prompt_ids, "IDS",
         "prompt as comma-separated token ids, used exactly as given", NULL},
        {"max-tokens", KVF_FLAG_INT, &o->max_tokens, "N", "most tokens to generate (default 128)",
         NULL},
        {"temperature", KVF_FLAG_DOUBLE, &o->temperature, "T", "0 (default): greedy", NULL},
        {"top-k", KVF_FLAG_INT, &o->top_k, "K", "sample among the K most likely (0: all)", NULL},
        {"top-p", KVF_FLAG_DOUBLE, &o->top_p, "P", "nucleus sampling mass (default 1)", NULL},
        {"seed", KVF_FLAG_UINT64, &o->seed, "S", "random seed (same seed, same output)",
         &o->seed_seen},
        {"ignore-eos", KVF_FLAG_BOOL, &o->ignore_eos, NULL, "do not stop at EOS", NULL},
        {"stop", KVF_FLAG_STRING, &o->stop, "TEXT", "stop when the text contains TEXT", NULL},
        {"ids", KVF_FLAG_BOOL, &o->print_ids, NULL,
         "print only the generated ids, comma-separated, on one line", NULL},
        {"threads", KVF_FLAG_INT, &o->threads, "N", "compute threads (default: all cores)", NULL},
        KVF_BACKEND_FLAG_ENTRIES(&o->bf),
        KVF_KV_DTYPE_FLAG_ENTRY(&o->bf),
        {"router", KVF_FLAG_STRING, &o->router, "URL",
         "generate through a running cluster's router (client URL) instead of locally", NULL},
        {"timeout-ms", KVF_FLAG_INT, &o->timeout_ms, "MS", "with --router: give up after MS of "
         "silence", NULL},
        KVF_AUTH_FLAG_ENTRY(&o->cluster_key_file),
        {"verbose", KVF_FLAG_BOOL, &o->verbose, NULL,
         "timings on stderr (here: the KV cache's format and bytes per token)", NULL},
    };
    kvf_flagset_t set = {
        .prog = argv[0],
        .usage = "--model DIR (--prompt TEXT | --prompt-ids 1,2,3) [options]",
        .summary = "Generates a continuation of the prompt in this process (model, KV cache and "
                   "sampling on the CPU), streaming text to stdout, or only the ids with --ids. "
                   "Stops at EOS (unless --ignore-eos), --stop or --max-tokens. With --router "
                   "the same request goes through a running cluster.",
        .flags = flags,
        .n_flags = KVF_NFLAGS(flags),
    };
    int rc = kvf_flags_parse(&set, argc, argv);
    if (rc == KVF_FLAGS_EXIT)
        return 0;
    if (rc < 0)
        return 2;
    if ((!o->prompt) == (!o->prompt_ids) || (!o->model_dir && !o->router)) {
        fprintf(stderr, "%s: needs --model DIR (or --router URL) and one of --prompt or "
                        "--prompt-ids (see --help)\n",
                argv[0]);
        return 2;
    }
    o->sp = (kvf_sampling_params_t){.temperature = (float)o->temperature, .top_k = o->top_k,
                                    .top_p = (float)o->top_p, .seed = o->seed};
    if (o->max_tokens < 0 || kvf_sampling_validate(&o->sp) != KVF_OK) {
        fprintf(stderr, "%s: bad sampling options (temperature >= 0, top-k >= 0, 0 < top-p <= 1, "
                        "max-tokens >= 0)\n",
                argv[0]);
        return 2;
    }
    return -1;
}

/* The same request through the router at o->router. */
static int generate_remote(const gen_opts_t *o, const uint32_t *ids, size_t n_ids)
{
    const char *stops[1] = {o->stop};
    kvf_remote_generate_t req = {
        .router_url = o->router, .prompt = o->prompt, .ids = ids, .n_ids = n_ids,
        .max_tokens = (uint32_t)o->max_tokens, .temperature = o->sp.temperature,
        .top_p = o->sp.top_p, .top_k = (uint32_t)o->top_k, .seed = o->seed,
        .has_seed = o->seed_seen, .ignore_eos = o->ignore_eos, .stop = stops,
        .n_stop = o->stop ? 1 : 0, .print_ids = o->print_ids, .verbose = o->verbose,
        .timeout_ms = o->timeout_ms};
    return kvf_remote_generate(&req);
}

/* The tokenizer, needed for text in or out (*tok_p stays NULL for an
 * ids-only run), and the prompt text's ids into *ids_p / *n_p. Returns 0,
 * or 1 after a line on stderr. */
static int load_tokenizer(const char *prog, const gen_opts_t *o, kvf_tokenizer_t **tok_p,
                          uint32_t **ids_p, size_t *n_p)
{
    if (!o->prompt && o->print_ids && !o->stop)
        return 0;
    kvf_status_t st = kvf_tokenizer_load(o->model_dir, tok_p);
    if (st != KVF_OK) {
        fprintf(stderr, "%s: cannot load the tokenizer of %s: %s\n", prog, o->model_dir,
                kvf_status_str(st));
        return 1;
    }
    if (o->prompt &&
        kvf_tokenizer_encode(*tok_p, o->prompt, strlen(o->prompt), true, ids_p, n_p) != KVF_OK) {
        fprintf(stderr, "%s: cannot tokenize the prompt\n", prog);
        return 1;
    }
    return 0;
}

/* The budget of tokens to generate: --max-tokens, less where the context
 * ends first (as in the cluster). Returns -1 when the prompt does not fit,
 * after a line on stderr. */
static int token_budget(const char *prog, const gen_opts_t *o, size_t n_ids)
{
    if (n_ids == 0) {
        fprintf(stderr, "%s: the prompt has no tokens\n", prog);
        return -1;
    }
    kvf_model_config_t mcfg;
    if (kvf_model_config_load(o->model_dir, &mcfg) != KVF_OK)
        return -1;
    if (n_ids >= (size_t)mcfg.max_pos) {
        fprintf(stderr, "%s: a prompt of %zu tokens does not fit the context of %d\n", prog,
                n_ids, mcfg.max_pos);
        return -1;
    }
    if ((size_t)o->max_tokens > (size_t)mcfg.max_pos - n_ids)
        return mcfg.max_pos - (int)n_ids;
    return o->max_tokens;
}

/* Where the generated tokens go: text streamed to stdout with the stop
 * string held back (kvf/textstream.h, as on a decode node), or with --ids
 * kept for one line at the end (the text stream then only finds the stop
 * string, across tokens as on a decode node). */
typedef struct {
    bool print_ids;
    kvf_textstream_t *text; /* text or --stop; NULL with --ids alone */
    uint32_t *gen;          /* (max_tokens + 1) */
    int n_gen;
} gen_out_t;

static kvf_status_t gen_out_init(gen_out_t *g, const gen_opts_t *o, const kvf_tokenizer_t *tok,
                                 int max_tokens)
{
    *g = (gen_out_t){.print_ids = o->print_ids};
    g->gen = malloc(((size_t)max_tokens + 1) * sizeof(*g->gen));
    if (!g->gen)
        return KVF_ERR_NOMEM;
    const char *stops[1] = {o->stop};
    size_t n_stop = o->stop && *o->stop ? 1 : 0;
    if (o->print_ids && !n_stop)
        return KVF_OK;
    return kvf_textstream_create(tok, stops, n_stop, &g->text);
}

static void gen_out_fini(gen_out_t *g)
{
    kvf_textstream_destroy(g->text);
    free(g->gen);
}

/* Takes one generated token; false when generation ends here (the stop
 * string, or its text could not be made). */
static bool gen_out_push(gen_out_t *g, uint32_t id)
{
    g->gen[g->n_gen++] = id;
    if (!g->text)
        return true;
    const char *text;
    size_t len;
    bool stopped;
    if (kvf_textstream_push(g->text, id, &text, &len, &stopped) != KVF_OK)
        return false;
    if (!g->print_ids) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
    return !stopped;
}

/* The ids on one line, or the text still held back and a newline. */
static void gen_out_finish(gen_out_t *g)
{
    if (g->print_ids) {
        for (int i = 0; i < g->n_gen; i++)
            printf("%s%u", i ? "," : "", g->gen[i]);
        printf("\n");
        return;
    }
    const char *text;
    size_t len;
    if (!kvf_textstream_stopped(g->text) &&
        kvf_textstream_finish(g->text, &text, &len) == KVF_OK)
        fwrite(text, 1, len, stdout);
    printf("\n");
}

/* Feeds the prompt, then samples up to max_tokens tokens, each fed back,
 * until EOS (unless --ignore-eos) or the stop string. */
static kvf_status_t generate_tokens(kvf_local_engine_t *le, kvf_sampler_t *sampler,
                                    const kvf_tokenizer_t *tok, const gen_opts_t *o,
                                    const uint32_t *ids, size_t n_ids, int max_tokens,
                                    gen_out_t *out)
{
    const kvf_model_config_t *cfg = &le->rt.model->cfg;
    int64_t tok_eos = tok ? kvf_tokenizer_eos_id(tok) : -1;
    kvf_status_t st = kvf_local_engine_feed(le, ids, (uint32_t)n_ids);
    while (st == KVF_OK && out->n_gen < max_tokens) {
        uint32_t next = kvf_sampler_sample(sampler, le->logits);
        if (!o->ignore_eos && (kvf_model_is_eos(cfg, next) || (tok_eos >= 0 && next == tok_eos)))
            break;
        if (!gen_out_push(out, next) || out->n_gen == max_tokens)
            break;
        st = kvf_local_engine_feed(le, &next, 1);
    }
    return st;
}

/* Generation in this process. Returns the exit code. */
static int generate_local(const char *prog, const gen_opts_t *o, const kvf_tokenizer_t *tok,
                          const uint32_t *ids, size_t n_ids)
{
    int max_tokens = token_budget(prog, o, n_ids);
    if (max_tokens < 0)
        return 1;
    kvf_local_engine_t le;
    if (kvf_local_engine_init(&le, prog, o->model_dir, o->threads, &o->bf,
                              (uint32_t)n_ids + (uint32_t)max_tokens + 1) != KVF_OK)
        return 1;
    int rc = 1;
    const kvf_model_config_t *cfg = &le.rt.model->cfg;
    if (o->verbose) {
        const kvf_kv_geometry_t *geo = kvf_kvpool_geometry(le.rt.pool);
        fprintf(stderr, "%s: kv cache %s, %zu bytes per token\n", prog,
                kvf_kv_dtype_name(geo->dtype), kvf_kv_bytes_per_token(geo));
    }
    for (size_t i = 0; i < n_ids; i++) {
        if (ids[i] >= (uint32_t)cfg->vocab) {
            fprintf(stderr, "%s: prompt id %u is not below the vocabulary size %d\n", prog,
                    ids[i], cfg->vocab);
            goto fail_sampler;
        }
    }
    kvf_sampler_t sampler;
    if (kvf_sampler_init(&sampler, &o->sp, cfg->vocab) != KVF_OK)
        goto fail_sampler;
    gen_out_t out;
    if (gen_out_init(&out, o, tok, max_tokens) != KVF_OK)
        goto fail_out;
    kvf_status_t st = generate_tokens(&le, &sampler, tok, o, ids, n_ids, max_tokens, &out);
    if (st != KVF_OK)
        fprintf(stderr, "%s: forward pass failed: %s\n", prog, kvf_status_str(st));
    else
        rc = 0;
    gen_out_finish(&out);
fail_out:
    gen_out_fini(&out);
    kvf_sampler_fini(&sampler);
fail_sampler:
    kvf_local_engine_fini(&le);
    return rc;
}

int kvf_cmd_generate(int argc, char **argv)
{
    gen_opts_t o;
    int rc = parse_gen_opts(argc, argv, &o);
    if (rc >= 0)
        return rc;
    uint32_t *ids = NULL;
    size_t n_ids = 0;
    if (o.prompt_ids && kvf_parse_id_list(o.prompt_ids, &ids, &n_ids) != KVF_OK) {
        fprintf(stderr, "%s: --prompt-ids: not a comma-separated list of ids: %s\n", argv[0],
                o.prompt_ids);
        return 2;
    }
    if (o.router) {
        rc = kvf_auth_setup(o.cluster_key_file) == KVF_OK ? generate_remote(&o, ids, n_ids) : 1;
        free(ids);
        return rc;
    }
    kvf_tokenizer_t *tok = NULL;
    rc = load_tokenizer(argv[0], &o, &tok, &ids, &n_ids);
    if (rc == 0)
        rc = generate_local(argv[0], &o, tok, ids, n_ids);
    kvf_tokenizer_destroy(tok);
    free(ids);
    return rc;
}
