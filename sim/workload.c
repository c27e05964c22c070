/* The simulator's workloads: kvf bench serve's generator (its length
 * distributions and Poisson gaps, bench/serve_trace.c) or a trace file.
 * See sim.h. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kvf/sampling.h"
#include "sim.h"

/* The longest trace line (a JSONL object with every key fits easily). */
#define TRACE_LINE_MAX 1024
/* The most tokens one request may ask for (prompt or output). */
#define TRACE_TOKENS_MAX (1u << 24)

kvf_status_t kvf_sim_workload_generate(const kvf_sim_gen_t *g, kvf_sim_workload_t *w)
{
    w->n = g->n;
    w->reqs = calloc(g->n ? g->n : 1, sizeof(*w->reqs));
    if (!w->reqs)
        return KVF_ERR_NOMEM;
    uint64_t rng = g->seed;
    double at = 0;
    for (size_t i = 0; i < g->n; i++) {
        kvf_sim_req_t *r = &w->reqs[i];
        at += g->rate > 0 ? kvf_serve_draw_exp(&rng) / g->rate : 0;
        r->at_s = at;
        r->n_prompt = kvf_len_dist_draw(&g->prompt_len, &rng);
        r->n_output = kvf_len_dist_draw(&g->output_len, &rng);
        r->prefix_id = -1;
        if (g->n_prefixes) {
            r->prefix_id = (int32_t)(kvf_splitmix64(&rng) % g->n_prefixes);
            r->prefix_tokens = g->prefix_tokens < r->n_prompt ? g->prefix_tokens : r->n_prompt;
        }
    }
    return KVF_OK;
}

void kvf_sim_workload_fini(kvf_sim_workload_t *w)
{
    free(w->reqs);
    w->reqs = NULL;
    w->n = 0;
}

void kvf_sim_prompt_fill(const kvf_sim_req_t *r, size_t i, uint32_t *ids, uint32_t n)
{
    uint32_t shared = r->prefix_id >= 0 ? r->prefix_tokens : 0;
    if (shared > n)
        shared = n;
    /* a prefix's tokens depend on its id alone; the rest start with the
     * request's index, so no two requests share a block past the prefix */
    for (uint32_t k = 0; k < shared; k++)
        ids[k] = (uint32_t)(((uint64_t)r->prefix_id * 2654435761u + k) & 0x3fffffff);
    for (uint32_t k = shared; k < n && k < r->n_prompt; k++)
        ids[k] = (uint32_t)((0x40000000u | (i * 7919u + (k - shared))) & 0x7fffffff);
}

/* A number field: a non-negative integer in [lo, hi] (or any non-negative
 * number for the arrival). */
static bool parse_number(const char *text, double lo, double hi, bool integer, double *v_p)
{
    char *end;
    while (isspace((unsigned char)*text))
        text++;
    if (!*text)
        return false;
    double v = strtod(text, &end);
    while (isspace((unsigned char)*end))
        end++;
    if (*end || v != v || v < lo || v > hi || (integer && v != floor(v)))
        return false;
    *v_p = v;
    return true;
}

static const char *const trace_keys[] = {"arrival_s", "prompt_tokens", "output_tokens", "prefix_id",
                                         "prefix_tokens"};

/* Field k of a request from its text; err says what is wrong. */
static bool set_field(kvf_sim_req_t *r, int k, const char *text, char *err, size_t err_len)
{
    double v;
    bool ok = k == 0   ? parse_number(text, 0, 1e9, false, &v)
              : k == 3 ? parse_number(text, -1, 2147483647.0, true, &v)
                       : parse_number(text, k == 4 ? 0 : 1, TRACE_TOKENS_MAX, true, &v);
    if (!ok) {
        snprintf(err, err_len, "%s must be %s, not '%s'", trace_keys[k],
                 k == 0   ? "a number of seconds >= 0"
                 : k == 3 ? "an integer >= -1 (-1: none)"
                 : k == 4 ? "an integer >= 0"
                          : "an integer >= 1",
                 text);
        return false;
    }
    if (k == 0)
        r->at_s = v;
    else if (k == 1)
        r->n_prompt = (uint32_t)v;
    else if (k == 2)
        r->n_output = (uint32_t)v;
    else if (k == 3)
        r->prefix_id = (int32_t)v;
    else
        r->prefix_tokens = (uint32_t)v;
    return true;
}

/* One CSV line: 3 to 5 comma-separated fields. */
static bool parse_csv(char *line, kvf_sim_req_t *r, bool *prefix_len_p, char *err, size_t err_len)
{
    int k = 0;
    for (char *field = line, *next; field; field = next, k++) {
        next = strchr(field, ',');
        if (next)
            *next++ = '\0';
        if (k >= 5) {
            snprintf(err, err_len,
                     "more than 5 fields (arrival_s,prompt_tokens,output_tokens"
                     "[,prefix_id[,prefix_tokens]])");
            return false;
        }
        if (!set_field(r, k, field, err, err_len))
            return false;
    }
    if (k < 3) {
        snprintf(err, err_len,
                 "%d field%s, expected arrival_s,prompt_tokens,output_tokens"
                 "[,prefix_id[,prefix_tokens]]",
                 k, k == 1 ? "" : "s");
        return false;
    }
    *prefix_len_p = k == 5;
    return true;
}

/* One JSONL line: an object with the three required keys. */
static bool parse_jsonl(const char *line, kvf_sim_req_t *r, bool *prefix_len_p, char *err,
                        size_t err_len)
{
    cJSON *o = cJSON_Parse(line);
    bool ok = cJSON_IsObject(o);
    if (!ok)
        snprintf(err, err_len, "not a JSON object");
    for (int k = 0; ok && k < 5; k++) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, trace_keys[k]);
        if (!f) {
            if (k < 3)
                snprintf(err, err_len, "no \"%s\"", trace_keys[k]);
            ok = k >= 3;
            continue;
        }
        char text[64];
        if (cJSON_IsNumber(f))
            snprintf(text, sizeof(text), "%.17g", f->valuedouble);
        else
            snprintf(text, sizeof(text), "%s", cJSON_IsString(f) ? "(a string)" : "(not a number)");
        ok = set_field(r, k, text, err, err_len);
        if (k == 4)
            *prefix_len_p = true;
    }
    cJSON_Delete(o);
    return ok;
}

/* Adds r to w (growing it); false without memory. */
static bool append(kvf_sim_workload_t *w, size_t *cap, const kvf_sim_req_t *r)
{
    if (w->n == *cap) {
        size_t ncap = *cap ? *cap * 2 : 1024;
        kvf_sim_req_t *grown = realloc(w->reqs, ncap * sizeof(*grown));
        if (!grown)
            return false;
        w->reqs = grown;
        *cap = ncap;
    }
    w->reqs[w->n++] = *r;
    return true;
}

/* Whether line holds nothing to read: blank, a comment, or (the first
 * one) a CSV header. */
static bool skip_line(const char *line, unsigned lineno, bool jsonl)
{
    while (isspace((unsigned char)*line))
        line++;
    return !*line || *line == '#' || (!jsonl && lineno == 1 && isalpha((unsigned char)*line));
}

/* Checks r against the request before it; err says what is wrong. */
static bool check_req(kvf_sim_req_t *r, const kvf_sim_workload_t *w, bool prefix_len,
                      uint32_t default_prefix_tokens, char *err, size_t err_len)
{
    if (w->n && r->at_s < w->reqs[w->n - 1].at_s) {
        snprintf(err, err_len, "arrival %.6f s is before the previous line's %.6f s", r->at_s,
                 w->reqs[w->n - 1].at_s);
        return false;
    }
    if (r->prefix_id >= 0 && !prefix_len)
        r->prefix_tokens = default_prefix_tokens;
    if (r->prefix_tokens > r->n_prompt) {
        if (prefix_len) {
            snprintf(err, err_len, "prefix_tokens %u is longer than the prompt (%u)",
                     r->prefix_tokens, r->n_prompt);
            return false;
        }
        r->prefix_tokens = r->n_prompt;
    }
    if (r->prefix_id < 0)
        r->prefix_tokens = 0;
    return true;
}

kvf_status_t kvf_sim_workload_load(const char *path, uint32_t default_prefix_tokens,
                                   kvf_sim_workload_t *w, char *err, size_t err_len)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, err_len, "cannot open %s: %m", path);
        return KVF_ERR_IO;
    }
    size_t len = strlen(path), cap = 0;
    bool jsonl = len > 6 && !strcmp(path + len - 6, ".jsonl");
    *w = (kvf_sim_workload_t){0};
    char line[TRACE_LINE_MAX], why[256];
    unsigned lineno = 0;
    kvf_status_t st = KVF_OK;
    while (st == KVF_OK && fgets(line, sizeof(line), f)) {
        lineno++;
        size_t n = strlen(line);
        if (n == sizeof(line) - 1 && line[n - 1] != '\n') {
            snprintf(err, err_len, "%s:%u: line longer than %d bytes", path, lineno,
                     TRACE_LINE_MAX - 2);
            st = KVF_ERR_FORMAT;
            break;
        }
        line[strcspn(line, "\r\n")] = '\0';
        if (skip_line(line, lineno, jsonl))
            continue;
        kvf_sim_req_t r = {.prefix_id = -1};
        bool prefix_len = false;
        bool ok = jsonl ? parse_jsonl(line, &r, &prefix_len, why, sizeof(why))
                        : parse_csv(line, &r, &prefix_len, why, sizeof(why));
        if (ok)
            ok = check_req(&r, w, prefix_len, default_prefix_tokens, why, sizeof(why));
        if (!ok) {
            snprintf(err, err_len, "%s:%u: %s", path, lineno, why);
            st = KVF_ERR_FORMAT;
        } else if (!append(w, &cap, &r)) {
            snprintf(err, err_len, "out of memory");
            st = KVF_ERR_NOMEM;
        }
    }
    fclose(f);
    if (st == KVF_OK && !w->n) {
        snprintf(err, err_len, "%s: no requests", path);
        st = KVF_ERR_FORMAT;
    }
    if (st != KVF_OK)
        kvf_sim_workload_fini(w);
    return st;
}
