/* The request table: submit (validate, tokenize, enter the table), cancel,
 * finish, output to the request's sink, and the nodes' progress messages
 * for a request. See router_internal.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvf/clock.h"
#include "kvf/log.h"
#include "metrics.h"
#include "router_internal.h"

kvf_router_req_t *kvf_router__req_find(kvf_router_t *r, uint64_t id)
{
    kvf_router_req_t *q = NULL;
    HASH_FIND(hh, r->requests, &id, sizeof(id), q);
    return q;
}

kvf_router_req_t *kvf_router__req_current(kvf_router_t *r, uint64_t id, uint64_t epoch,
                                          const char *what)
{
    kvf_router_req_t *q = kvf_router__req_find(r, id);
    if (!q || q->place.epoch != epoch || q->place.state == REQ_QUEUED) {
        r->count.stale++;
        kvf_log_debug("%s for request %llu epoch %llu: stale, dropped", what,
                      (unsigned long long)id, (unsigned long long)epoch);
        return NULL;
    }
    return q;
}

void kvf_router__emit(kvf_router_req_t *q, kvf_router_chunk_t *chunk)
{
    chunk->req_id = q->id;
    chunk->prompt_tokens = q->ask.n_prompt;
    chunk->completion_tokens = q->out.n_gen;
    if (!chunk->text)
        chunk->text = "";
    q->sink.on_chunk(q->sink.arg, chunk);
}

/* Answers a request that never entered the table. */
static void reject(kvf_router_t *r, const kvf_router_sink_t *sink, kvf_status_t status,
                   const char *message)
{
    kvf_router_chunk_t chunk = {
        .finish = KVF__FINISH_REASON__FINISH_ERROR,
        .status = status,
        .error = message,
        .text = "",
    };
    sink->on_chunk(sink->arg, &chunk);
    r->count.failed++;
    kvf_metrics_observe_rejected(r->metrics);
}

static void req_free(kvf_router_t *r, kvf_router_req_t *q)
{
    kvf_router__queue_remove(r, q);
    HASH_DEL(r->requests, q);
    kvf_router__output_fini(&q->out);
    for (size_t i = 0; i < q->ask.n_stop; i++)
        free(q->ask.stop[i]);
    free(q->ask.prompt);
    free(q);
    r->count.running--;
}

void kvf_router__req_finish(kvf_router_t *r, kvf_router_req_t *q, Kvf__FinishReason reason,
                            kvf_status_t status, const char *error)
{
    const char *tail = NULL;
    size_t tail_len = 0;
    if (reason != KVF__FINISH_REASON__FINISH_ERROR &&
        reason != KVF__FINISH_REASON__FINISH_CANCELLED)
        kvf_detok_flush(&q->out.detok, &tail, &tail_len);
    kvf_router_chunk_t chunk = {
        .text = tail_len ? tail : "",
        .text_len = tail_len,
        .finish = reason,
        .status = status,
        .error = error ? error : "",
        .ttft_us = q->t.first_ns ? (q->t.first_ns - q->t.arrival_ns) / 1000 : 0,
        .prefill_compute_us = q->t.prefill_compute_us,
        .handoff_us = q->t.handoff_us,
        .kv_bytes = q->t.kv_bytes,
    };
    kvf_router__emit(q, &chunk);
    kvf_metrics_observe_finished(r->metrics, reason, q->ask.n_prompt, q->out.n_gen,
                                 kvf_clock_ns() - q->t.arrival_ns);
    if (reason == KVF__FINISH_REASON__FINISH_ERROR)
        r->count.failed++;
    else if (reason == KVF__FINISH_REASON__FINISH_CANCELLED)
        r->count.cancelled++;
    else
        r->count.completed++;
    kvf_log_debug("request %llu finished (%d) after %u tokens", (unsigned long long)q->id,
                  (int)reason, q->out.n_gen);
    req_free(r, q);
}

void kvf_router__requests_fini(kvf_router_t *r)
{
    kvf_router_req_t *q, *next;
    HASH_ITER(hh, r->requests, q, next)
    {
        req_free(r, q);
    }
}

/* ---- submit ------------------------------------------------------------------ */

static kvf_status_t validate_generate(kvf_router_t *r, const kvf_router_gen_t *g, char *why,
                                      size_t why_len)
{
    if (!isfinite(g->temperature) || g->temperature < 0 || g->temperature > 100) {
        snprintf(why, why_len, "temperature %g is outside 0..100", g->temperature);
        return KVF_ERR_INVAL;
    }
    if (!isfinite(g->top_p) || g->top_p < 0 || g->top_p > 1) {
        snprintf(why, why_len, "top_p %g is outside 0..1", g->top_p);
        return KVF_ERR_INVAL;
    }
    if (g->top_k > (uint32_t)r->model.vocab) {
        snprintf(why, why_len, "top_k %u is larger than the vocabulary (%d)", g->top_k,
                 r->model.vocab);
        return KVF_ERR_INVAL;
    }
    if (g->n_stop > ROUTER_MAX_STOP) {
        snprintf(why, why_len, "at most %d stop strings", ROUTER_MAX_STOP);
        return KVF_ERR_INVAL;
    }
    for (size_t i = 0; i < g->n_stop; i++) {
        if (!g->stop[i] || !g->stop[i][0]) {
            snprintf(why, why_len, "empty stop string");
            return KVF_ERR_INVAL;
        }
    }
    for (size_t i = 0; i < g->n_ids; i++) {
        if (g->ids[i] >= (uint32_t)r->model.vocab) {
            snprintf(why, why_len, "prompt id %u is outside the vocabulary (%d)", g->ids[i],
                     r->model.vocab);
            return KVF_ERR_INVAL;
        }
    }
    return KVF_OK;
}

/* The prompt's token ids (*ids_p malloc'd, owned by the caller). On
 * failure the status and why say what to answer. */
static kvf_status_t prompt_ids(kvf_router_t *r, const kvf_router_gen_t *g, char *why,
                               size_t why_len, uint32_t **ids_p, size_t *n_p)
{
    uint32_t *ids = NULL;
    size_t n = 0;
    if (g->n_ids) {
        ids = malloc(g->n_ids * sizeof(*ids));
        if (!ids) {
            snprintf(why, why_len, "out of memory");
            return KVF_ERR_NOMEM;
        }
        memcpy(ids, g->ids, g->n_ids * sizeof(*ids));
        n = g->n_ids;
    } else if (!g->prompt || !*g->prompt) {
        snprintf(why, why_len, "empty prompt");
        return KVF_ERR_INVAL;
    } else if (kvf_tokenizer_encode(r->tok, g->prompt, strlen(g->prompt), true, &ids, &n) !=
               KVF_OK) {
        snprintf(why, why_len, "prompt does not tokenize");
        return KVF_ERR_INVAL;
    }
    if (n == 0) {
        free(ids);
        snprintf(why, why_len, "empty prompt");
        return KVF_ERR_INVAL;
    }
    if (n >= (size_t)r->model.max_pos) {
        snprintf(why, why_len, "prompt of %zu tokens does not fit the context of %d", n,
                 r->model.max_pos);
        free(ids);
        return KVF_ERR_TOO_BIG;
    }
    *ids_p = ids;
    *n_p = n;
    return KVF_OK;
}

/* What g asks for, into q (prompt ids taken over). */
static void fill_asked(kvf_router_t *r, kvf_router_req_t *q, const kvf_router_gen_t *g,
                       uint32_t *ids, size_t n)
{
    kvf_req_asked_t *a = &q->ask;
    a->prompt = ids;
    a->n_prompt = (uint32_t)n;
    uint32_t room = (uint32_t)r->model.max_pos - a->n_prompt;
    a->max_tokens = g->max_tokens ? g->max_tokens : r->cfg.default_max_tokens;
    if (a->max_tokens > room)
        a->max_tokens = room;
    a->temperature = g->temperature;
    a->top_p = g->top_p;
    a->top_k = g->top_k;
    a->seed = g->seed;
    a->has_seed = g->has_seed;
    a->ignore_eos = g->ignore_eos;
    for (size_t i = 0; i < g->n_stop; i++) {
        a->stop[a->n_stop] = strdup(g->stop[i]);
        if (a->stop[a->n_stop])
            a->n_stop++;
    }
}

uint64_t kvf_router_submit(kvf_router_t *r, const kvf_router_gen_t *g,
                           const kvf_router_sink_t *sink)
{
    char why[256];
    uint32_t *ids = NULL;
    size_t n = 0;
    kvf_status_t st = validate_generate(r, g, why, sizeof(why));
    if (st == KVF_OK)
        st = prompt_ids(r, g, why, sizeof(why), &ids, &n);
    if (st != KVF_OK) {
        reject(r, sink, st, why);
        return 0;
    }
    kvf_router_req_t *q = calloc(1, sizeof(*q));
    if (!q) {
        free(ids);
        reject(r, sink, KVF_ERR_NOMEM, "out of memory");
        return 0;
    }
    q->id = r->next_req_id;
    HASH_ADD(hh, r->requests, id, sizeof(q->id), q);
    if (!q->hh.tbl) { /* the table could not grow */
        free(ids);
        free(q);
        reject(r, sink, KVF_ERR_NOMEM, "out of memory");
        return 0;
    }
    r->next_req_id++;
    q->sink = *sink;
    fill_asked(r, q, g, ids, n);
    kvf_detok_init(&q->out.detok, r->tok);
    q->t.arrival_ns = kvf_clock_ns();
    q->t.deadline_ns = q->t.arrival_ns + (uint64_t)r->cfg.request_timeout_ms * 1000000ull;
    r->count.requests++;
    r->count.running++;
    uint64_t id = q->id;
    kvf_log_debug("request %llu: %u prompt tokens, max %u new", (unsigned long long)id,
                  q->ask.n_prompt, q->ask.max_tokens);
    kvf_router__schedule(r, q);
    return id;
}

void kvf_router_cancel(kvf_router_t *r, uint64_t req_id)
{
    kvf_router_req_t *q = kvf_router__req_find(r, req_id);
    if (!q)
        return;
    kvf_router__cancel_nodes(r, q, "cancelled by the client");
    kvf_router__req_finish(r, q, KVF__FINISH_REASON__FINISH_CANCELLED, KVF_ERR_CANCELLED,
                           "cancelled");
}

/* ---- the nodes' progress ------------------------------------------------------ */

void kvf_router__on_prefill_done(kvf_router_t *r, const Kvf__PrefillDone *pd)
{
    kvf_router_req_t *q = kvf_router__req_current(r, pd->req_id, pd->epoch, "prefill done");
    if (!q)
        return;
    q->t.prefill_compute_us += pd->prefill_compute_us;
    q->t.handoff_us += pd->handoff_us;
    q->t.kv_bytes += pd->kv_bytes;
    kvf_metrics_observe_handoff(r->metrics, pd->handoff_us, pd->kv_bytes);
    if (q->place.state == REQ_PREFILL)
        q->place.state = REQ_DECODE;
    if (!q->t.first_ns)
        q->t.first_ns = kvf_clock_ns();
    if (!kvf_router__stream_tokens(r, q, q->out.gen_at_dispatch, &pd->first_token, 1,
                                   KVF__FINISH_REASON__FINISH_NONE))
        kvf_router__release_held(r, q);
}

void kvf_router__on_token_chunk(kvf_router_t *r, const Kvf__TokenChunk *c)
{
    kvf_router_req_t *q = kvf_router__req_current(r, c->req_id, c->epoch, "tokens");
    if (!q)
        return;
    if (c->n_tokens > c->n_generated) {
        r->count.malformed++;
        return;
    }
    if (q->place.state == REQ_PREFILL)
        q->place.state = REQ_DECODE;
    if (!q->t.first_ns && c->n_tokens)
        q->t.first_ns = kvf_clock_ns();
    q->place.rng_state = c->rng_state;
    /* n_generated counts every token of the request, earlier epochs'
     * included, so each token lands at its position exactly once. */
    uint32_t first = c->n_generated - (uint32_t)c->n_tokens;
    kvf_router__stream_tokens(r, q, first, c->tokens, c->n_tokens, c->finish_reason);
}
