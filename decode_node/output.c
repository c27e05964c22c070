/* What the decode node sends the router: token chunks, gathered into one
 * TokenBatch per step; errors; PrefillDone of local prefills. */
#include "decode_internal.h"

#include "kvf/array.h"
#include "kvf/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void dec_send_router(kvf_decode_t *d, kvf_envelope_t *env)
{
    kvf_status_t st = kvf_node_send_router(d->node, env, KVF_DECODE_SEND_TIMEOUT_MS);
    if (st != KVF_OK)
        kvf_log_warn("%s to router dropped: %s", kvf_envelope_body_name(env), kvf_status_str(st));
}

void dec_send_error(kvf_decode_t *d, uint64_t req_id, uint64_t epoch, kvf_status_t status,
                    const char *fmt, ...)
{
    char text[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    Kvf__Error e = KVF__ERROR__INIT;
    e.req_id = req_id;
    e.epoch = epoch;
    e.status = status;
    e.message = text;
    e.node_id = (char *)kvf_node_id(d->node);
    kvf_envelope_t env;
    kvf_envelope_init(&env, kvf_node_id(d->node));
    env.body_case = KVF__ENVELOPE__BODY_ERROR;
    env.error = &e;
    dec_send_router(d, &env);
}

/* Makes room for n more bytes of chunk text. */
static bool text_reserve(kvf_decode_t *d, size_t n)
{
    return n <= SIZE_MAX - d->text_len &&
           kvf_array_reserve(&d->chunk_text, &d->text_cap, d->text_len + n, 4096, 1) == KVF_OK;
}

void dec_chunk_add_text(kvf_decode_t *d, const char *text, size_t len)
{
    if (!len)
        return;
    if (!text_reserve(d, len)) {
        d->text_lost = true;
        return;
    }
    memcpy(d->chunk_text + d->text_len, text, len);
    d->text_len += len;
}

/* Ends the text of the chunk being built: its offset and length (no
 * terminator: the text may hold U+0000, and its length goes with it), or
 * false when some of it was lost (the text buffer is rewound). */
static bool text_close(kvf_decode_t *d, size_t *off_p, size_t *len_p)
{
    size_t start = d->text_start;
    bool ok = !d->text_lost;
    d->text_lost = false;
    if (!ok) {
        d->text_len = d->text_start;
        return false;
    }
    d->text_start = d->text_len;
    *off_p = start;
    *len_p = d->text_len - start;
    return true;
}

static bool chunks_reserve(kvf_decode_t *d)
{
    return kvf_array_reserve(&d->chunks, &d->cap_chunks, d->n_chunks + 1, 64, sizeof(*d->chunks)) ==
           KVF_OK;
}

void dec_emit_chunk(kvf_decode_t *d, dec_req_t *r, bool has_token, uint32_t token,
                    Kvf__FinishReason finish)
{
    size_t text_off = 0, text_len = 0;
    if (!text_close(d, &text_off, &text_len) || !chunks_reserve(d)) {
        /* The router sees the gap in the positions and dispatches the
         * request again; its request timeout covers a lost finish. */
        kvf_log_error("request %llu: out of memory queueing a token chunk",
                      (unsigned long long)r->req_id);
        r->chunk_seq++;
        return;
    }
    d->chunks[d->n_chunks++] = (dec_chunk_t){
        .req_id = r->req_id,
        .epoch = r->epoch,
        .seq = r->chunk_seq++,
        .token = token,
        .has_token = has_token,
        .finish = finish,
        .n_generated = r->n_generated_before + r->gen,
        .rng_state = r->has_sampler ? kvf_sampler_state(&r->sampler) : 0,
        .text_off = text_off,
        .text_len = text_len,
        .prefill = r->relay_prefill,
        .pf_compute_us = r->pf_compute_us,
        .pf_handoff_us = r->pf_handoff_us,
        .pf_kv_bytes = r->pf_kv_bytes,
        .pf_cached_tokens = r->pf_cached_tokens,
    };
    r->relay_prefill = false;
}

/* c's relayed PrefillDone into pd (c->prefill). */
static void relay_prefill(const dec_chunk_t *c, Kvf__PrefillDone *pd)
{
    kvf__prefill_done__init(pd);
    pd->req_id = c->req_id;
    pd->epoch = c->epoch;
    pd->prefill_compute_us = c->pf_compute_us;
    pd->handoff_us = c->pf_handoff_us;
    pd->kv_bytes = c->pf_kv_bytes;
    pd->cached_tokens = c->pf_cached_tokens;
}

void dec_flush_chunks(kvf_decode_t *d)
{
    if (!d->n_chunks)
        return;
    /* The blocks of the sequences these chunks end were just listed: the
     * router hears of them before it hears the sequences end (the same
     * socket keeps the order), so a client's next turn is routed to them. */
    kvf_node_prefix_report(&d->pc, KVF_DECODE_SEND_TIMEOUT_MS);
    size_t n = d->n_chunks, n_relayed = 0;
    for (size_t i = 0; i < n; i++)
        n_relayed += d->chunks[i].prefill;
    Kvf__TokenChunk *body = calloc(n, sizeof(*body));
    Kvf__TokenChunk **ptrs = calloc(n, sizeof(*ptrs));
    /* a relayed PrefillDone rides on a request's first chunk only */
    Kvf__PrefillDone *relayed = n_relayed ? calloc(n_relayed, sizeof(*relayed)) : NULL;
    if (!body || !ptrs || (n_relayed && !relayed)) {
        kvf_log_error("out of memory sending %zu token chunks", n);
        goto out;
    }
    for (size_t i = 0, ri = 0; i < n; i++) {
        dec_chunk_t *c = &d->chunks[i];
        kvf__token_chunk__init(&body[i]);
        body[i].req_id = c->req_id;
        body[i].epoch = c->epoch;
        body[i].seq = c->seq;
        body[i].n_tokens = c->has_token ? 1 : 0;
        body[i].tokens = c->has_token ? &c->token : NULL;
        body[i].finish_reason = c->finish;
        body[i].n_generated = c->n_generated;
        body[i].rng_state = c->rng_state;
        body[i].text.data = c->text_len ? (uint8_t *)d->chunk_text + c->text_off : NULL;
        body[i].text.len = c->text_len;
        if (c->prefill) {
            relay_prefill(c, &relayed[ri]);
            body[i].prefill = &relayed[ri++];
        }
        ptrs[i] = &body[i];
    }
    Kvf__TokenBatch batch = KVF__TOKEN_BATCH__INIT;
    batch.node_id = (char *)kvf_node_id(d->node);
    batch.n_chunks = n;
    batch.chunks = ptrs;
    kvf_envelope_t env;
    kvf_envelope_init(&env, kvf_node_id(d->node));
    env.body_case = KVF__ENVELOPE__BODY_TOKEN_BATCH;
    env.token_batch = &batch;
    dec_send_router(d, &env);
out:
    free(relayed);
    free(ptrs);
    free(body);
    d->n_chunks = 0;
    d->text_len = d->text_start = 0;
}

void dec_send_prefill_done(kvf_decode_t *d, const dec_req_t *r)
{
    Kvf__PrefillDone done = KVF__PREFILL_DONE__INIT;
    done.req_id = r->req_id;
    done.epoch = r->epoch;
    done.node_id = (char *)kvf_node_id(d->node);
    done.prefill_compute_us = r->prefill_us;
    done.cached_tokens = r->cached_blocks * d->block_size; /* the prefix it did not compute */
    kvf_envelope_t env;
    kvf_envelope_init(&env, kvf_node_id(d->node));
    env.body_case = KVF__ENVELOPE__BODY_PREFILL_DONE;
    env.prefill_done = &done;
    dec_send_router(d, &env);
}
