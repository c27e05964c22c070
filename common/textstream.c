/* A request's output text with its stop strings. See kvf/textstream.h.
 *
 * held is the tail of the text that is not handed out yet: the shortest
 * suffix that could still grow into a stop string. Every position before
 * it is safe: the text from there neither contains a stop string nor is
 * the beginning of one, and appending text cannot change that. */
#include "kvf/textstream.h"

#include "kvf/array.h"

#include <stdlib.h>
#include <string.h>

struct kvf_textstream {
    kvf_detok_t detok;
    char **stops; /* (n_stop) owned */
    size_t n_stop;
    char *held; /* (n_held) text not handed out yet */
    size_t n_held, cap_held;
    char *out; /* (out_cap) what the last call handed out, NUL-terminated */
    size_t out_cap;
    bool stopped;
};

kvf_status_t kvf_textstream_create(const kvf_tokenizer_t *tok, const char *const *stops,
                                   size_t n_stop, kvf_textstream_t **ts_p)
{
    for (size_t i = 0; i < n_stop; i++)
        if (!stops[i] || !stops[i][0])
            return KVF_ERR_INVAL;
    kvf_textstream_t *ts = calloc(1, sizeof(*ts));
    if (!ts)
        return KVF_ERR_NOMEM;
    ts->stops = n_stop ? calloc(n_stop, sizeof(*ts->stops)) : NULL;
    if (n_stop && !ts->stops)
        goto fail;
    for (; ts->n_stop < n_stop; ts->n_stop++) {
        ts->stops[ts->n_stop] = strdup(stops[ts->n_stop]);
        if (!ts->stops[ts->n_stop])
            goto fail;
    }
    kvf_detok_init(&ts->detok, tok);
    *ts_p = ts;
    return KVF_OK;
fail:
    for (size_t i = 0; i < ts->n_stop; i++)
        free(ts->stops[i]);
    free(ts->stops);
    free(ts);
    return KVF_ERR_NOMEM;
}

void kvf_textstream_destroy(kvf_textstream_t *ts)
{
    if (!ts)
        return;
    kvf_detok_fini(&ts->detok);
    for (size_t i = 0; i < ts->n_stop; i++)
        free(ts->stops[i]);
    free(ts->stops);
    free(ts->held);
    free(ts->out);
    free(ts);
}

bool kvf_textstream_stopped(const kvf_textstream_t *ts)
{
    return ts->stopped;
}

static kvf_status_t held_append(kvf_textstream_t *ts, const char *s, size_t n)
{
    kvf_status_t st = kvf_array_reserve(&ts->held, &ts->cap_held, ts->n_held + n, 64, 1);
    if (st != KVF_OK)
        return st;
    if (n)
        memcpy(ts->held + ts->n_held, s, n);
    ts->n_held += n;
    return KVF_OK;
}

/* Offset in held of the earliest complete stop string, or n_held. */
static size_t first_stop(const kvf_textstream_t *ts)
{
    size_t best = ts->n_held;
    for (size_t i = 0; i < ts->n_stop; i++) {
        size_t len = strlen(ts->stops[i]);
        if (len > ts->n_held)
            continue;
        const char *hit = memmem(ts->held, ts->n_held, ts->stops[i], len);
        if (hit && (size_t)(hit - ts->held) < best)
            best = (size_t)(hit - ts->held);
    }
    return best;
}

/* Whether held[from..] is the beginning of some stop string. */
static bool could_begin_stop(const kvf_textstream_t *ts, size_t from)
{
    size_t tail = ts->n_held - from;
    for (size_t i = 0; i < ts->n_stop; i++)
        if (strlen(ts->stops[i]) > tail && !memcmp(ts->stops[i], ts->held + from, tail))
            return true;
    return false;
}

/* Moves held[0..n) out (to ts->out) and keeps the rest held; or, with
 * drop_rest, forgets the rest. */
static kvf_status_t hand_out(kvf_textstream_t *ts, size_t n, bool drop_rest, const char **text_p,
                             size_t *len_p)
{
    kvf_status_t st = kvf_array_reserve(&ts->out, &ts->out_cap, n + 1, 64, 1);
    if (st != KVF_OK)
        return st;
    if (n)
        memcpy(ts->out, ts->held, n);
    ts->out[n] = '\0';
    size_t rest = drop_rest ? 0 : ts->n_held - n;
    if (rest)
        memmove(ts->held, ts->held + n, rest);
    ts->n_held = rest;
    *text_p = ts->out;
    *len_p = n;
    return KVF_OK;
}

/* Hands out what is safe after text was added to held. */
static kvf_status_t settle(kvf_textstream_t *ts, const char **text_p, size_t *len_p)
{
    size_t stop_at = first_stop(ts);
    if (stop_at < ts->n_held) {
        ts->stopped = true;
        return hand_out(ts, stop_at, true, text_p, len_p);
    }
    size_t safe = 0;
    while (safe < ts->n_held && !could_begin_stop(ts, safe))
        safe++;
    return hand_out(ts, safe, false, text_p, len_p);
}

kvf_status_t kvf_textstream_push(kvf_textstream_t *ts, uint32_t id, const char **text_p,
                                 size_t *len_p, bool *stopped_p)
{
    if (ts->stopped)
        return KVF_ERR_CLOSED;
    const char *piece;
    size_t piece_len;
    kvf_status_t st = kvf_detok_push(&ts->detok, id, &piece, &piece_len);
    if (st == KVF_OK)
        st = held_append(ts, piece, piece_len);
    if (st == KVF_OK)
        st = settle(ts, text_p, len_p);
    if (st != KVF_OK)
        return st;
    *stopped_p = ts->stopped;
    return KVF_OK;
}

kvf_status_t kvf_textstream_replay(kvf_textstream_t *ts, const uint32_t *ids, size_t n)
{
    for (size_t i = 0; i < n && !ts->stopped; i++) {
        const char *text;
        size_t len;
        bool stopped;
        kvf_status_t st = kvf_textstream_push(ts, ids[i], &text, &len, &stopped);
        if (st != KVF_OK)
            return st;
    }
    return KVF_OK;
}

kvf_status_t kvf_textstream_finish(kvf_textstream_t *ts, const char **text_p, size_t *len_p)
{
    if (ts->stopped)
        return hand_out(ts, 0, true, text_p, len_p);
    const char *tail;
    size_t tail_len;
    kvf_status_t st = kvf_detok_flush(&ts->detok, &tail, &tail_len);
    if (st == KVF_OK)
        st = held_append(ts, tail, tail_len);
    if (st != KVF_OK)
        return st;
    size_t stop_at = first_stop(ts);
    ts->stopped = stop_at < ts->n_held;
    return hand_out(ts, stop_at, true, text_p, len_p);
}
