/* The request table: submit (validate, tokenize, enter the table), cancel,
 * finish, output to the request's sink, and the nodes' progress messages
 * for a request. See router_internal.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvf/clock.h"
#include "kvf/log.h"
#include "kvf/sampling_msg.h"
#include "kvf/utf8.h"
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

bool kvf_router__sender_assigned(kvf_router_t *r, const kvf_router_node_t *n, uint64_t id,
                                 uint64_t epoch, bool as_prefill, bool as_decode)
{
    kvf_router_req_t *q = kvf_router__req_find(r, id);
    if (!q || q->place.epoch != epoch || q->place.state == REQ_QUEUED)
        return true; /* stale: its handler drops it */
    kvf_node_ref_t ref = kvf_router__node_ref(r, n);
    return (as_prefill && q->place.prefill == ref) || (as_decode && q->place.decode == ref);
}

/* Hands a chunk of q's output to its sink. */
static void emit(kvf_router_req_t *q, kvf_router_chunk_t *chunk)
{
    chunk->req_id = q->id;
    chunk->prompt_tokens = q->ask.n_prompt;
    chunk->completion_tokens = q->out.n;
    if (!chunk->text)
        chunk->text = "";
    q->sink.on_chunk(q->sink.arg, chunk);
}

static uint64_t ttft_us(const kvf_router_req_t *q)
{
    return q->t.first_ns ? (q->t.first_ns - q->t.arrival_ns) / 1000 : 0;
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
    kvf_router__timers_stop(r, q);
    kvf_router__queue_remove(r, q);
    HASH_DEL(r->requests, q);
    kvf_stream_fini(&q->out);
    kvf_sampling_msg_free(q->ask.sampling);
    free(q->ask.prompt);
    free(q->ask.cache_salt);
    free(q->ask.hashes);
    free(q);
    r->count.running--;
}

void kvf_router__req_finish(kvf_router_t *r, kvf_router_req_t *q, Kvf__FinishReason reason,
                            kvf_status_t status, const char *error)
{
    kvf_router_chunk_t chunk = {
        .text = "",
        .finish = reason,
        .status = status,
        .error = error ? error : "",
        .ttft_us = ttft_us(q),
        .prefill_compute_us = q->t.prefill_compute_us,
        .handoff_us = q->t.handoff_us,
        .kv_bytes = q->t.kv_bytes,
        .cached_tokens = q->t.cached_tokens,
        .local_prefill = q->place.local,
    };
    emit(q, &chunk);
    kvf_router__node_unload(r, q); /* until the node's next heartbeat */
    kvf_metrics_observe_finished(r->metrics, reason, q->ask.n_prompt, q->out.n,
                                 kvf_clock_ns() - q->t.arrival_ns);
    if (reason == KVF__FINISH_REASON__FINISH_ERROR)
        r->count.failed++;
    else if (reason == KVF__FINISH_REASON__FINISH_CANCELLED)
        r->count.cancelled++;
    else
        r->count.completed++;
    kvf_log_debug("request %llu finished (%d) after %u tokens", (unsigned long long)q->id,
                  (int)reason, q->out.n);
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

/* The prompt ids g gives are in the vocabulary. */
static kvf_status_t check_ids(const kvf_router_t *r, const kvf_router_gen_t *g, char *why,
                              size_t why_len)
{
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
    } else if (!g->prompt || (!g->prompt_len && !*g->prompt)) {
        snprintf(why, why_len, "empty prompt");
        return KVF_ERR_INVAL;
    } else if (kvf_tokenizer_encode(r->tok, g->prompt,
                                    g->prompt_len ? g->prompt_len : strlen(g->prompt), true, &ids,
                                    &n) != KVF_OK) {
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

/* A seed for a request that brings none (splitmix64 over the router's
 * state): every node and every epoch of the request then samples alike. */
static uint64_t fresh_seed(kvf_router_t *r)
{
    return kvf_splitmix64(&r->seed_state);
}

/* What g asks for, into q: the prompt ids (taken over) and a completed
 * copy of the sampling message. */
static kvf_status_t fill_asked(kvf_router_t *r, kvf_router_req_t *q, const Kvf__Sampling *s,
                               uint32_t *ids, size_t n)
{
    kvf_req_asked_t *a = &q->ask;
    a->prompt = ids;
    a->n_prompt = (uint32_t)n;
    kvf_status_t st = kvf_sampling_msg_copy(s, &a->sampling);
    if (st != KVF_OK)
        return st;
    uint32_t room = (uint32_t)r->model.max_pos - a->n_prompt;
    kvf_sampling_msg_complete(a->sampling, r->cfg.default_max_tokens, room, fresh_seed(r));
    return KVF_OK;
}

/* A new request in the table for prompt ids (taken over on success) and
 * sampling s, with its timers armed. NOMEM leaves nothing behind. */
static kvf_status_t req_create(kvf_router_t *r, const Kvf__Sampling *s, uint32_t *ids, size_t n,
                               const kvf_router_sink_t *sink, kvf_router_req_t **q_p)
{
    kvf_router_req_t *q = calloc(1, sizeof(*q));
    if (!q)
        return KVF_ERR_NOMEM;
    q->id = r->next_req_id;
    q->sink = *sink;
    kvf_stream_init(&q->out);
    q->t.arrival_ns = kvf_clock_ns();
    kvf_status_t st = fill_asked(r, q, s, ids, n);
    if (st != KVF_OK)
        goto fail_asked;
    KVF_HASH_ADD(r->requests, id, q, st);
    if (st != KVF_OK)
        goto fail_asked;
    st = kvf_router__timers_start(r, q);
    if (st != KVF_OK)
        goto fail_timers;
    r->next_req_id++;
    *q_p = q;
    return KVF_OK;
fail_timers:
    HASH_DEL(r->requests, q);
fail_asked:
    kvf_sampling_msg_free(q->ask.sampling);
    free(q);
    return st;
}

uint64_t kvf_router_submit(kvf_router_t *r, const kvf_router_gen_t *g,
                           const kvf_router_sink_t *sink)
{
    static const Kvf__Sampling defaults = KVF__SAMPLING__INIT;
    const Kvf__Sampling *s = g->sampling ? g->sampling : &defaults;
    char why[256];
    uint32_t *ids = NULL;
    size_t n = 0;
    kvf_status_t st = kvf_sampling_msg_check(s, r->model.vocab, why, sizeof(why));
    if (st == KVF_OK)
        st = check_ids(r, g, why, sizeof(why));
    if (st == KVF_OK)
        st = prompt_ids(r, g, why, sizeof(why), &ids, &n);
    if (st != KVF_OK) {
        reject(r, sink, st, why);
        return 0;
    }
    if (g->cache_salt_len > KVF_CACHE_SALT_MAX) {
        free(ids);
        snprintf(why, sizeof(why), "cache_salt is longer than %d bytes", KVF_CACHE_SALT_MAX);
        reject(r, sink, KVF_ERR_INVAL, why);
        return 0;
    }
    kvf_router_req_t *q;
    if (req_create(r, s, ids, n, sink, &q) != KVF_OK) {
        free(ids);
        reject(r, sink, KVF_ERR_NOMEM, "out of memory");
        return 0;
    }
    if (g->cache_salt_len && (q->ask.cache_salt = malloc(g->cache_salt_len))) {
        memcpy(q->ask.cache_salt, g->cache_salt, g->cache_salt_len);
        q->ask.cache_salt_len = g->cache_salt_len;
    }
    r->count.requests++;
    r->count.running++;
    uint64_t id = q->id;
    kvf_log_debug("request %llu: %u prompt tokens, max %u new", (unsigned long long)id,
                  q->ask.n_prompt, q->ask.sampling->max_tokens);
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

/* q's epoch's prefill timings, counted once: from the prefill node's
 * PrefillDone or from the copy the decode node relays on the first chunk,
 * whichever comes first (they travel on different connections). */
static void take_prefill_done(kvf_router_t *r, kvf_router_req_t *q, const Kvf__PrefillDone *pd)
{
    if (q->place.prefill_seen)
        return;
    q->place.prefill_seen = true;
    q->t.prefill_compute_us += pd->prefill_compute_us;
    q->t.handoff_us += pd->handoff_us;
    q->t.kv_bytes += pd->kv_bytes;
    kvf_metrics_observe_handoff(r->metrics, pd->handoff_us, pd->kv_bytes);
    kvf_metrics_observe_pull(r->metrics, pd->kv_bytes_pulled);
    kvf_metrics_observe_prefix(r->metrics, q->place.n_tokens, pd->cached_tokens);
    q->t.cached_tokens += pd->cached_tokens;
    kvf_router__observe_prefill_done(r, q, pd);
}

/* The prefill node is done with q's epoch: q is the decode node's now
 * (for node-loss decisions). */
void kvf_router__on_prefill_done(kvf_router_t *r, const Kvf__PrefillDone *pd)
{
    kvf_router_req_t *q = kvf_router__req_current(r, pd->req_id, pd->epoch, "prefill done");
    if (!q)
        return;
    take_prefill_done(r, q, pd);
    kvf_router_node_t *p = kvf_router__node_get(r, q->place.prefill);
    if (p)
        kvf_router__node_succeeded(r, p);
    if (q->place.state == REQ_PREFILL) {
        q->place.state = REQ_DECODE;
        kvf_router__progress(r, q);
    }
}

/* Forwards the chunk's new tokens and text (c continues q's stream). */
static void forward(kvf_router_t *r, kvf_router_req_t *q, const Kvf__TokenChunk *c, uint32_t from)
{
    uint64_t now = kvf_clock_ns();
    kvf_router__progress(r, q);
    size_t text_len = c->text.data ? c->text.len : 0;
    if (c->n_tokens == 0 && text_len == 0)
        return;
    if (!q->t.first_ns && c->n_tokens)
        q->t.first_ns = now;
    kvf_router_chunk_t chunk;
    kvf_stream_chunk(&q->out, from, text_len ? (const char *)c->text.data : "", text_len,
                     KVF__FINISH_REASON__FINISH_NONE, &chunk);
    if (from == 0 && c->n_tokens)
        chunk.ttft_us = ttft_us(q);
    kvf_metrics_observe_tokens(r->metrics, q->t.arrival_ns, &q->t.last_token_ns, c->n_tokens, now);
    emit(q, &chunk);
}

void kvf_router__on_token_chunk(kvf_router_t *r, const Kvf__TokenChunk *c)
{
    kvf_router_req_t *q = kvf_router__req_current(r, c->req_id, c->epoch, "tokens");
    if (!q)
        return;
    /* The text goes to clients as it is (JSON escapes it, it is not
     * checked again): whole UTF-8 characters or the chunk is malformed. */
    if (c->text.len && kvf_utf8_valid_prefix(c->text.data, c->text.len) != c->text.len) {
        kvf_log_warn("request %llu: token chunk whose text is not UTF-8, dropped",
                     (unsigned long long)c->req_id);
        r->count.malformed++;
        return;
    }
    uint32_t from = q->out.n;
    kvf_stream_place_t place;
    kvf_status_t st = kvf_stream_place(&q->out, c->n_generated, c->tokens, c->n_tokens, &place);
    if (st == KVF_ERR_INVAL) {
        r->count.malformed++;
        return;
    }
    if (st != KVF_OK) {
        kvf_router__cancel_nodes(r, q, "out of memory");
        kvf_router__req_finish(r, q, KVF__FINISH_REASON__FINISH_ERROR, st, "out of memory");
        return;
    }
    if (place == KVF_STREAM_RESENT)
        return;
    if (place != KVF_STREAM_NEXT) {
        /* A message of this epoch got lost: try again from what the client
         * has. */
        kvf_router__redispatch(
            r, q, place == KVF_STREAM_GAP ? "token stream has a gap" : "token stream overlaps");
        return;
    }
    if (q->place.state == REQ_PREFILL)
        q->place.state = REQ_DECODE;
    /* the prefill node's own PrefillDone may still be on its way */
    if (c->prefill && !q->place.local)
        take_prefill_done(r, q, c->prefill);
    kvf_router_node_t *d = kvf_router__node_get(r, q->place.decode);
    if (d)
        kvf_router__node_succeeded(r, d);
    q->place.rng_state = c->rng_state;
    forward(r, q, c, from);
    /* The decode node decided the request is done: nothing to cancel. */
    if (c->finish_reason != KVF__FINISH_REASON__FINISH_NONE)
        kvf_router__req_finish(r, q, c->finish_reason, KVF_OK, NULL);
}
