/* kvf generate: colocated single-process generation (the reference the
 * cluster's output is compared with), or, with --router, a client of a
 * running cluster. */
#include "commands.h"
#include "kvf/backend_flags.h"
#include "kvf/flags.h"
#include "kvf/log.h"
#include "kvf/sampling.h"
#include "kvf/tokenizer.h"
#include "local_engine.h"
#include "remote.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Streams generated text to stdout, holding back any tail that could be
 * the start of the stop string; reports when the stop string appears. */
typedef struct {
    const char *stop; /* NULL or "" : none */
    char *held;       /* text not yet printed */
    size_t n_held, cap;
} text_out_t;

/* Adds text; prints what is safe. Returns 1 when the stop string was
 * reached (the text before it printed, the rest dropped), -1 on OOM. */
static int text_out_push(text_out_t *o, const char *text, size_t len)
{
    if (o->n_held + len + 1 > o->cap) {
        size_t cap = (o->n_held + len + 1) * 2;
        char *grown = realloc(o->held, cap);
        if (!grown)
            return -1;
        o->held = grown;
        o->cap = cap;
    }
    memcpy(o->held + o->n_held, text, len);
    o->n_held += len;
    o->held[o->n_held] = 0;
    size_t safe = o->n_held;
    if (o->stop && *o->stop) {
        size_t sl = strlen(o->stop);
        char *hit = memmem(o->held, o->n_held, o->stop, sl);
        if (hit) {
            fwrite(o->held, 1, (size_t)(hit - o->held), stdout);
            o->n_held = 0;
            return 1;
        }
        /* keep the longest suffix that is a proper prefix of stop */
        for (size_t k = sl - 1 < o->n_held ? sl - 1 : o->n_held; k > 0; k--) {
            if (!memcmp(o->held + o->n_held - k, o->stop, k)) {
                safe = o->n_held - k;
                break;
            }
        }
    }
    fwrite(o->held, 1, safe, stdout);
    fflush(stdout);
    memmove(o->held, o->held + safe, o->n_held - safe);
    o->n_held -= safe;
    return 0;
}

static void text_out_flush(text_out_t *o)
{
    fwrite(o->held, 1, o->n_held, stdout);
    o->n_held = 0;
    free(o->held);
    o->held = NULL;
}

int kvf_cmd_generate(int argc, char **argv)
{
    const char *model_dir = NULL, *prompt = NULL, *prompt_ids = NULL, *stop = NULL;
    const char *router = NULL;
    int max_tokens = 128, top_k = 0, threads = 0, timeout_ms = 60000;
    kvf_backend_flags_t bf = {0};
    double temperature = 0, top_p = 1;
    uint64_t seed = 0;
    bool ignore_eos = false, print_ids = false, seed_seen = false, verbose = false;
    const kvf_flag_t flags[] = {
        {"model", KVF_FLAG_STRING, &model_dir, "DIR", "Hugging Face model directory", NULL},
        {"prompt", KVF_FLAG_STRING, &prompt, "TEXT", "prompt text (BOS per the tokenizer config)",
         NULL},
        {"prompt-ids", KVF_FLAG_STRING, &prompt_ids, "IDS",
         "prompt as comma-separated token ids, used exactly as given", NULL},
        {"max-tokens", KVF_FLAG_INT, &max_tokens, "N", "most tokens to generate (default 128)",
         NULL},
        {"temperature", KVF_FLAG_DOUBLE, &temperature, "T", "0 (default): greedy", NULL},
        {"top-k", KVF_FLAG_INT, &top_k, "K", "sample among the K most likely (0: all)", NULL},
        {"top-p", KVF_FLAG_DOUBLE, &top_p, "P", "nucleus sampling mass (default 1)", NULL},
        {"seed", KVF_FLAG_UINT64, &seed, "S", "random seed (same seed, same output)",
         &seed_seen},
        {"ignore-eos", KVF_FLAG_BOOL, &ignore_eos, NULL, "do not stop at EOS", NULL},
        {"stop", KVF_FLAG_STRING, &stop, "TEXT", "stop when the text contains TEXT", NULL},
        {"ids", KVF_FLAG_BOOL, &print_ids, NULL,
         "print only the generated ids, comma-separated, on one line", NULL},
        {"threads", KVF_FLAG_INT, &threads, "N", "compute threads (default: all cores)", NULL},
        KVF_BACKEND_FLAG_ENTRIES(&bf),
        {"router", KVF_FLAG_STRING, &router, "URL",
         "generate through a running cluster's router (client URL) instead of locally", NULL},
        {"timeout-ms", KVF_FLAG_INT, &timeout_ms, "MS", "with --router: give up after MS of "
         "silence", NULL},
        {"verbose", KVF_FLAG_BOOL, &verbose, NULL, "timings on stderr", NULL},
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
    if ((!prompt) == (!prompt_ids) || (!model_dir && !router)) {
        fprintf(stderr, "%s: needs --model DIR (or --router URL) and one of --prompt or "
                        "--prompt-ids (see --help)\n",
                argv[0]);
        return 2;
    }
    kvf_sampling_params_t sp = {.temperature = (float)temperature, .top_k = top_k,
                                .top_p = (float)top_p, .seed = seed};
    if (max_tokens < 0 || kvf_sampling_validate(&sp) != KVF_OK) {
        fprintf(stderr, "%s: bad sampling options (temperature >= 0, top-k >= 0, 0 < top-p <= 1, "
                        "max-tokens >= 0)\n",
                argv[0]);
        return 2;
    }
    uint32_t *ids = NULL;
    size_t n_ids = 0;
    if (prompt_ids && kvf_parse_id_list(prompt_ids, &ids, &n_ids) != KVF_OK) {
        fprintf(stderr, "%s: --prompt-ids: not a comma-separated list of ids: %s\n", argv[0],
                prompt_ids);
        return 2;
    }
    if (router) {
        const char *stops[1] = {stop};
        kvf_remote_generate_t req = {
            .router_url = router, .prompt = prompt, .ids = ids, .n_ids = n_ids,
            .max_tokens = (uint32_t)max_tokens, .temperature = sp.temperature,
            .top_p = sp.top_p, .top_k = (uint32_t)top_k, .seed = seed, .has_seed = seed_seen,
            .ignore_eos = ignore_eos, .stop = stops, .n_stop = stop ? 1 : 0,
            .print_ids = print_ids, .verbose = verbose, .timeout_ms = timeout_ms};
        rc = kvf_remote_generate(&req);
        free(ids);
        return rc;
    }

    /* The tokenizer is needed for text in or out; ids-only runs go without. */
    kvf_tokenizer_t *tok = NULL;
    if (prompt || !print_ids || stop) {
        kvf_status_t st = kvf_tokenizer_load(model_dir, &tok);
        if (st != KVF_OK) {
            fprintf(stderr, "%s: cannot load the tokenizer of %s: %s\n", argv[0], model_dir,
                    kvf_status_str(st));
            free(ids);
            return 1;
        }
        if (prompt && kvf_tokenizer_encode(tok, prompt, strlen(prompt), true, &ids, &n_ids) !=
                          KVF_OK) {
            fprintf(stderr, "%s: cannot tokenize the prompt\n", argv[0]);
            kvf_tokenizer_destroy(tok);
            return 1;
        }
    }
    rc = 1;
    kvf_local_engine_t le;
    kvf_sampler_t sampler;
    kvf_detok_t detok;
    text_out_t out = {.stop = stop};
    uint32_t *gen = NULL;
    if (n_ids == 0) {
        fprintf(stderr, "%s: the prompt has no tokens\n", argv[0]);
        goto fail_engine;
    }
    kvf_model_config_t mcfg;
    if (kvf_model_config_load(model_dir, &mcfg) != KVF_OK)
        goto fail_engine;
    if (n_ids >= (size_t)mcfg.max_pos) {
        fprintf(stderr, "%s: a prompt of %zu tokens does not fit the context of %d\n", argv[0],
                n_ids, mcfg.max_pos);
        goto fail_engine;
    }
    /* Generation ends when the context is full, as in the cluster. */
    if ((size_t)max_tokens > (size_t)mcfg.max_pos - n_ids)
        max_tokens = mcfg.max_pos - (int)n_ids;
    if (kvf_local_engine_init(&le, argv[0], model_dir, threads, &bf,
                              (uint32_t)n_ids + (uint32_t)max_tokens + 1) != KVF_OK)
        goto fail_engine;
    const kvf_model_config_t *cfg = &le.rt.model->cfg;
    for (size_t i = 0; i < n_ids; i++) {
        if (ids[i] >= (uint32_t)cfg->vocab) {
            fprintf(stderr, "%s: prompt id %u is not below the vocabulary size %d\n", argv[0],
                    ids[i], cfg->vocab);
            goto fail_sampler;
        }
    }
    if (kvf_sampler_init(&sampler, &sp, cfg->vocab) != KVF_OK)
        goto fail_sampler;
    gen = malloc(((size_t)max_tokens + 1) * sizeof(*gen));
    if (!gen)
        goto fail_gen;
    if (tok)
        kvf_detok_init(&detok, tok);
    int64_t tok_eos = tok ? kvf_tokenizer_eos_id(tok) : -1;
    int n_gen = 0;
    bool stopped = false;
    kvf_status_t st = kvf_local_engine_feed(&le, ids, (uint32_t)n_ids);
    while (st == KVF_OK && n_gen < max_tokens) {
        uint32_t next = kvf_sampler_sample(&sampler, le.logits);
        if (!ignore_eos && (kvf_model_is_eos(cfg, next) || (tok_eos >= 0 && next == tok_eos)))
            break;
        gen[n_gen++] = next;
        if (tok && (!print_ids || stop)) {
            const char *text;
            size_t len;
            if (kvf_detok_push(&detok, next, &text, &len) != KVF_OK)
                break;
            if (!print_ids) {
                if (text_out_push(&out, text, len) != 0) {
                    stopped = true;
                    break;
                }
            } else if (stop && len && memmem(text, len, stop, strlen(stop))) {
                /* --ids with --stop: a stop string inside one token's text
                 * (across tokens needs the text path) */
                break;
            }
        }
        if (n_gen == max_tokens)
            break;
        st = kvf_local_engine_feed(&le, &next, 1);
    }
    if (st != KVF_OK) {
        fprintf(stderr, "%s: forward pass failed: %s\n", argv[0], kvf_status_str(st));
    } else {
        rc = 0;
    }
    if (print_ids) {
        for (int i = 0; i < n_gen; i++)
            printf("%s%u", i ? "," : "", gen[i]);
        printf("\n");
    } else {
        const char *text;
        size_t len;
        if (tok && !stopped && kvf_detok_flush(&detok, &text, &len) == KVF_OK && len)
            stopped = text_out_push(&out, text, len) != 0;
        if (!stopped)
            text_out_flush(&out);
        printf("\n");
    }
    free(out.held);
    if (tok)
        kvf_detok_fini(&detok);
    free(gen);
fail_gen:
    kvf_sampler_fini(&sampler);
fail_sampler:
    kvf_local_engine_fini(&le);
fail_engine:
    kvf_tokenizer_destroy(tok);
    free(ids);
    return rc;
}
