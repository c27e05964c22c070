/* A request's output: tokens placed by position, held while the epoch's
 * first token is missing, turned into text, stop conditions, chunks for
 * the client. See router_internal.h. */
#include <stdlib.h>
#include <string.h>

#include "kvf/clock.h"
#include "metrics.h"
#include "router_internal.h"

static kvf_status_t text_append(kvf_req_output_t *o, const char *s, size_t n)
{
    if (o->text_len + n + 1 > o->text_cap) {
        size_t cap = o->text_cap ? o->text_cap * 2 : 256;
        while (cap < o->text_len + n + 1)
            cap *= 2;
        char *t = realloc(o->text, cap);
        if (!t)
            return KVF_ERR_NOMEM;
        o->text = t;
        o->text_cap = cap;
    }
    memcpy(o->text + o->text_len, s, n);
    o->text_len += n;
    o->text[o->text_len] = '\0';
    return KVF_OK;
}

/* Earliest stop-string match in the text at or after from; -1 if none. */
static long stop_match(const kvf_router_req_t *q, size_t from)
{
    const kvf_req_output_t *o = &q->out;
    long best = -1;
    for (size_t i = 0; i < q->ask.n_stop; i++) {
        size_t sl = strlen(q->ask.stop[i]);
        size_t start = from >= sl ? from - sl + 1 : 0;
        const char *hit =
            o->text_len >= sl ? memmem(o->text + start, o->text_len - start, q->ask.stop[i], sl)
                              : NULL;
        if (hit && (best < 0 || hit - o->text < best))
            best = hit - o->text;
    }
    return best;
}

/* Keeps tokens at positions [first, first + n) until the positions before
 * them arrive. False when they do not continue what is held already. */
static bool hold_tokens(kvf_req_output_t *o, uint32_t first, const uint32_t *tokens, size_t n,
                        int finish)
{
    if (o->n_held == 0) {
        o->held_first = first;
    } else if (first > o->held_first + o->n_held || first < o->held_first) {
        return false;
    }
    uint32_t skip = o->held_first + o->n_held - first; /* already held */
    if (skip > n)
        skip = (uint32_t)n;
    size_t add = n - skip;
    if (o->n_held + add > o->cap_held) {
        uint32_t cap = o->cap_held ? o->cap_held : 16;
        while (cap < o->n_held + add)
            cap *= 2;
        uint32_t *h = realloc(o->held, (size_t)cap * sizeof(*h));
        if (!h)
            return false;
        o->held = h;
        o->cap_held = cap;
    }
    /* A chunk of no new tokens (a finish alone, or a resend) may come
     * before anything is held: o->held and tokens may then be NULL. */
    if (add) {
        memcpy(o->held + o->n_held, tokens + skip, add * sizeof(*tokens));
        o->n_held += (uint32_t)add;
    }
    if (finish != KVF__FINISH_REASON__FINISH_NONE)
        o->held_finish = finish;
    return true;
}

bool kvf_router__release_held(kvf_router_t *r, kvf_router_req_t *q)
{
    kvf_req_output_t *o = &q->out;
    if ((!o->n_held && o->held_finish == KVF__FINISH_REASON__FINISH_NONE) ||
        o->held_first > o->n_gen)
        return false;
    uint32_t *held = o->held, first = o->held_first, n = o->n_held;
    int finish = o->held_finish;
    o->held = NULL;
    o->n_held = o->cap_held = 0;
    o->held_finish = KVF__FINISH_REASON__FINISH_NONE;
    bool done = kvf_router__stream_tokens(r, q, first, held, n, (Kvf__FinishReason)finish);
    free(held);
    return done;
}

/* Appends the new tokens among [first, first + n) with their text; the
 * finish their content calls for (EOS, max_tokens) in *finish_p. */
static kvf_status_t append_tokens(kvf_router_t *r, kvf_router_req_t *q, uint32_t first,
                                  const uint32_t *tokens, size_t n, Kvf__FinishReason *finish_p)
{
    kvf_req_output_t *o = &q->out;
    for (size_t i = 0; i < n; i++) {
        uint32_t pos = first + (uint32_t)i;
        if (pos < o->n_gen)
            continue; /* already streamed (a resent chunk) */
        uint32_t t = tokens[i];
        if (!q->ask.ignore_eos && kvf_model_is_eos(&r->model, t)) {
            *finish_p = KVF__FINISH_REASON__FINISH_STOP;
            break;
        }
        if (o->n_gen == o->cap_gen) {
            uint32_t cap = o->cap_gen ? o->cap_gen * 2 : 64;
            uint32_t *g = realloc(o->gen, (size_t)cap * sizeof(*g));
            if (!g)
                return KVF_ERR_NOMEM;
            o->gen = g;
            o->cap_gen = cap;
        }
        o->gen[o->n_gen++] = t;
        const char *piece;
        size_t piece_len;
        if (kvf_detok_push(&o->detok, t, &piece, &piece_len) == KVF_OK && piece_len)
            text_append(o, piece, piece_len);
        if (o->n_gen >= q->ask.max_tokens) {
            *finish_p = KVF__FINISH_REASON__FINISH_LENGTH;
            break;
        }
    }
    return KVF_OK;
}

/* Sends the client the tokens from gen_before on and the text not sent. */
static void send_new(kvf_router_t *r, kvf_router_req_t *q, uint32_t gen_before)
{
    kvf_req_output_t *o = &q->out;
    size_t n_new = o->n_gen - gen_before;
    if (!n_new && o->text_len <= o->text_sent)
        return;
    size_t text_new = o->text_len > o->text_sent ? o->text_len - o->text_sent : 0;
    char *text = strndup(o->text ? o->text + o->text_sent : "", text_new);
    kvf_router_chunk_t chunk = {
        .tokens = n_new ? o->gen + gen_before : NULL,
        .n_tokens = n_new,
        .text = text ? text : "",
        .text_len = text ? text_new : 0,
    };
    if (gen_before == 0 && q->t.first_ns)
        chunk.ttft_us = (q->t.first_ns - q->t.arrival_ns) / 1000;
    o->text_sent += text_new;
    kvf_metrics_observe_tokens(r->metrics, q->t.arrival_ns, &q->t.last_token_ns, n_new,
                               kvf_clock_ns());
    kvf_router__emit(q, &chunk);
    free(text);
}

bool kvf_router__stream_tokens(kvf_router_t *r, kvf_router_req_t *q, uint32_t first,
                               const uint32_t *tokens, size_t n, Kvf__FinishReason node_finish)
{
    kvf_req_output_t *o = &q->out;
    if (first > o->n_gen) {
        if (o->n_gen == o->gen_at_dispatch && hold_tokens(o, first, tokens, n, node_finish))
            return false; /* waits for the epoch's first token */
        /* A gap: a message of this epoch got lost. Try again from what the
         * client has. */
        kvf_router__redispatch(r, q, "token stream has a gap");
        return false;
    }
    q->t.progress_ns = kvf_clock_ns();
    Kvf__FinishReason finish = KVF__FINISH_REASON__FINISH_NONE;
    uint32_t gen_before = o->n_gen;
    size_t text_before = o->text_len;
    if (append_tokens(r, q, first, tokens, n, &finish) != KVF_OK) {
        kvf_router__req_finish(r, q, KVF__FINISH_REASON__FINISH_ERROR, KVF_ERR_NOMEM,
                               "out of memory");
        return true;
    }
    if (q->ask.n_stop) {
        long at = stop_match(q, text_before);
        if (at >= 0) {
            o->text_len = (size_t)at; /* the stop string itself is not output */
            finish = KVF__FINISH_REASON__FINISH_STOP;
        }
    }
    if (finish == KVF__FINISH_REASON__FINISH_NONE &&
        node_finish != KVF__FINISH_REASON__FINISH_NONE)
        finish = node_finish;
    send_new(r, q, gen_before);
    if (finish != KVF__FINISH_REASON__FINISH_NONE) {
        if (node_finish == KVF__FINISH_REASON__FINISH_NONE)
            kvf_router__cancel_nodes(r, q, "finished");
        if (finish == KVF__FINISH_REASON__FINISH_STOP && q->ask.n_stop)
            o->text_sent = o->text_len; /* nothing after the stop string */
        kvf_router__req_finish(r, q, finish, KVF_OK, NULL);
        return true;
    }
    return false;
}

void kvf_router__output_fini(kvf_req_output_t *o)
{
    kvf_detok_fini(&o->detok);
    free(o->gen);
    free(o->held);
    free(o->text);
}
