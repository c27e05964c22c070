/* The soak's prompt pool: KVF_SOAK_POOL prompts of 16..400 tokens, every
 * third one text (words, some of them not ASCII) and the others token
 * ids, each with its own max_tokens (16..256), and the colocated greedy
 * output of each, computed once with kvf generate before the load
 * starts. See soak.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvf/tokenizer.h"
#include "soak.h"
#include "soak_http.h"

static const char *const pool_words[] = {
    "the",    "router", "sends", "a",      "prefill", "request", "to",     "one",
    "node",   "which",  "ships", "each",   "layer",   "of",      "keys",   "and",
    "values", "over",   "UCX",   "while",  "decode",  "nodes",   "stream", "tokens",
    "back,",  "block",  "by",    "lease.", "Epochs",  "keep",    "late",   "messages",
    "out;",   "café",   "naïve", "→",      "über",    "déjà",    "vu",     "(42)",
    "1024",   "KV",     "cache", "is",     "paged",   "—",       "drain",  "heartbeat",
};
#define N_WORDS (sizeof(pool_words) / sizeof(pool_words[0]))

/* A text of at least n_target tokens (as the router will tokenize it, BOS
 * included) and its ids. */
static bool text_prompt(const kvf_tokenizer_t *tok, size_t n_target, uint64_t *rng,
                        kvf_soak_prompt_t *p)
{
    kvf_soak_buf_t text = {0};
    uint32_t *ids = NULL;
    size_t n = 0;
    while (n < n_target) {
        const char *w = pool_words[kvf_soak_rand(rng) % N_WORDS];
        free(ids);
        ids = NULL;
        if ((text.len && kvf_soak_buf_append(&text, " ", 1) != KVF_OK) ||
            kvf_soak_buf_append(&text, w, strlen(w)) != KVF_OK ||
            kvf_tokenizer_encode(tok, text.data, text.len, true, &ids, &n) != KVF_OK) {
            kvf_soak_buf_free(&text);
            free(ids);
            return false;
        }
    }
    p->text = text.data; /* the buffer's, now the prompt's */
    p->ids = ids;
    p->n_ids = n;
    return true;
}

/* n ids in [1, vocab - 3], BOS first when the tokenizer has one. */
static void id_prompt(const kvf_tokenizer_t *tok, size_t n, uint64_t seed, kvf_soak_prompt_t *p)
{
    p->ids = h_prompt(n, (uint32_t)kvf_tokenizer_vocab_size(tok), seed);
    p->n_ids = n;
    int64_t bos = kvf_tokenizer_bos_id(tok);
    if (bos >= 0)
        p->ids[0] = (uint32_t)bos;
}

/* The colocated greedy output of p (ids and text), with ignore_eos: every
 * request of the soak asks for exactly max_tokens. */
static bool reference(const char *model, kvf_soak_prompt_t *p, int index)
{
    h_gen_t g = {
        .prompt = p->ids, .n_prompt = p->n_ids, .max_tokens = p->max_tokens, .ignore_eos = true};
    p->ref = h_colocated(model, &g, &p->n_ref);
    p->ref_text = h_colocated_text(model, &g, &p->n_ref_text);
    if (p->n_ref != p->max_tokens) {
        fprintf(stderr, "soak: prompt %d: the reference has %zu tokens, not %u\n", index, p->n_ref,
                p->max_tokens);
        return false;
    }
    return true;
}

bool kvf_soak_pool_init(kvf_soak_t *s)
{
    kvf_tokenizer_t *tok;
    if (kvf_tokenizer_load(s->model, &tok) != KVF_OK) {
        fprintf(stderr, "soak: cannot load the tokenizer of %s\n", s->model);
        return false;
    }
    uint64_t rng = s->seed ^ 0x5eedull;
    bool ok = true;
    for (int i = 0; i < KVF_SOAK_POOL && ok; i++) {
        kvf_soak_prompt_t *p = &s->pool[i];
        memset(p, 0, sizeof(*p));
        size_t n = (size_t)kvf_soak_between(&rng, 16, 400);
        p->max_tokens = (uint32_t)kvf_soak_between(&rng, 16, 256);
        if (i % 3 == 2)
            ok = text_prompt(tok, n, &rng, p);
        else
            id_prompt(tok, n, kvf_soak_rand(&rng), p);
        ok = ok && reference(s->model, p, i);
    }
    kvf_tokenizer_destroy(tok);
    return ok;
}

void kvf_soak_pool_fini(kvf_soak_t *s)
{
    for (int i = 0; i < KVF_SOAK_POOL; i++) {
        kvf_soak_prompt_t *p = &s->pool[i];
        free(p->ids);
        free(p->text);
        free(p->ref);
        free(p->ref_text);
        memset(p, 0, sizeof(*p));
    }
}
