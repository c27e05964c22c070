/* The tensors of a checkpoint that the config does not account for: see
 * model_internal.h. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvf/log.h"
#include "model_internal.h"

/* Names listed in a message; the rest are counted. */
#define CHECK_NAMES_SHOWN 3

/* The unused tensors of one kind: the first few names and how many. */
typedef struct {
    char names[200];
    size_t len;
    int count;
} unused_list_t;

static void list_add(unused_list_t *l, const char *name)
{
    if (l->count++ < CHECK_NAMES_SHOWN && l->len < sizeof(l->names)) {
        int n = snprintf(l->names + l->len, sizeof(l->names) - l->len, "%s%s", l->len ? ", " : "",
                         name);
        if (n > 0)
            l->len += (size_t)n;
        if (l->len >= sizeof(l->names))
            l->len = sizeof(l->names) - 1;
    }
}

/* "a, b, c (7 in all)" or "a, b" into buf. */
static void list_format(const unused_list_t *l, char *buf, size_t cap)
{
    if (l->count > CHECK_NAMES_SHOWN)
        snprintf(buf, cap, "%s, ... (%d in all)", l->names, l->count);
    else
        snprintf(buf, cap, "%s", l->names);
}

static int cmp_ptr(const void *a, const void *b)
{
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return x < y ? -1 : x > y;
}

/* The layer a "model.layers.<L>." name belongs to, or -1. */
static long layer_of(const char *name)
{
    static const char prefix[] = "model.layers.";
    if (strncmp(name, prefix, sizeof(prefix) - 1))
        return -1;
    char *end;
    long l = strtol(name + sizeof(prefix) - 1, &end, 10);
    return end != name + sizeof(prefix) - 1 && *end == '.' && l >= 0 ? l : -1;
}

/* Tensors a checkpoint may hold beside its weights, with no effect on
 * what the model computes: RoPE tables (computed from the config), and
 * an LM head that tie_word_embeddings replaces with the embedding. */
static bool is_benign(const char *name, const kvf_model_config_t *cfg)
{
    static const char inv_freq[] = ".rotary_emb.inv_freq";
    size_t n = strlen(name), k = sizeof(inv_freq) - 1;
    if (n >= k && !strcmp(name + n - k, inv_freq))
        return true;
    return cfg->tie_embeddings && !strcmp(name, "lm_head.weight");
}

kvf_status_t kvf_model__check_unused(kvf_safetensors_t *const *shards, int n_shards,
                                     const kvf_st_tensor_t *const *used, int n_used,
                                     const kvf_model_config_t *cfg, const char *dir)
{
    uintptr_t *sorted = malloc((size_t)(n_used ? n_used : 1) * sizeof(*sorted));
    if (!sorted)
        return KVF_ERR_NOMEM;
    for (int i = 0; i < n_used; i++)
        sorted[i] = (uintptr_t)used[i];
    qsort(sorted, (size_t)n_used, sizeof(*sorted), cmp_ptr);
    unused_list_t beyond = {0}, other = {0};
    long top = -1; /* the highest layer named beyond the config's */
    for (int s = 0; s < n_shards; s++) {
        for (size_t i = 0; i < kvf_safetensors_count(shards[s]); i++) {
            const kvf_st_tensor_t *t = kvf_safetensors_tensor(shards[s], i);
            uintptr_t key = (uintptr_t)t;
            if (bsearch(&key, sorted, (size_t)n_used, sizeof(*sorted), cmp_ptr) ||
                is_benign(t->name, cfg))
                continue;
            long l = layer_of(t->name);
            if (l >= cfg->n_layers) {
                list_add(&beyond, t->name);
                top = l > top ? l : top;
            } else {
                list_add(&other, t->name);
            }
        }
    }
    free(sorted);
    char names[320];
    if (beyond.count) {
        list_format(&beyond, names, sizeof(names));
        kvf_log_error("%s: the checkpoint holds tensors of %ld layers, config.json's "
                      "num_hidden_layers says %d: %s",
                      dir, top + 1, cfg->n_layers, names);
    }
    if (other.count) {
        list_format(&other, names, sizeof(names));
        kvf_log_error("%s: %d tensor%s that config.json does not account for (another "
                      "architecture or options?): %s",
                      dir, other.count, other.count == 1 ? "" : "s", names);
    }
    return beyond.count || other.count ? KVF_ERR_FORMAT : KVF_OK;
}
