/* The decode node's request table: one entry per (req_id, epoch) it holds,
 * in admission order (local prefills are served oldest first), from
 * admission until its blocks are back in the pool. See decode_internal.h. */
#include "decode_internal.h"

#include "kvf/array.h"
#include "kvf/clock.h"
#include "kvf/kvcache.h"
#include "kvf/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void dec_req_free(kvf_decode_t *d, dec_req_t *r)
{
    kvf_timer_cancel(kvf_evloop_timers(d->loop), &r->seal_timer);
    if (r->has_sampler)
        kvf_sampler_fini(&r->sampler);
    kvf_textstream_destroy(r->text);
    free(r->sender);
    free(r->alloc_reply_to);
    free(r->blocks);
    free(r->prompt);
    free(r->prefix_hashes);
    free(r->prefix_tokens);
    free(r->seq_ids);
    free(r->salt);
    free(r);
}

kvf_status_t dec_req_add(kvf_decode_t *d, dec_req_t *r)
{
    kvf_status_t st =
        kvf_array_reserve(&d->reqs, &d->cap_reqs, d->n_reqs + 1, 64, sizeof(*d->reqs));
    if (st != KVF_OK)
        return st;
    d->reqs[d->n_reqs++] = r;
    return KVF_OK;
}

/* Removes r from the table (keeping the order) and frees it. */
static void req_remove(kvf_decode_t *d, dec_req_t *r)
{
    for (size_t i = 0; i < d->n_reqs; i++) {
        if (d->reqs[i] == r) {
            memmove(&d->reqs[i], &d->reqs[i + 1], (d->n_reqs - i - 1) * sizeof(*d->reqs));
            d->n_reqs--;
            break;
        }
    }
    dec_req_free(d, r);
}

dec_req_t *dec_req_find_live(const kvf_decode_t *d, uint64_t req_id)
{
    for (size_t i = 0; i < d->n_reqs; i++)
        if (d->reqs[i]->req_id == req_id && kvf_handoff_live(&d->reqs[i]->h))
            return d->reqs[i];
    return NULL;
}

dec_req_t *dec_req_find(const kvf_decode_t *d, uint64_t req_id, uint64_t epoch)
{
    for (size_t i = 0; i < d->n_reqs; i++)
        if (d->reqs[i]->req_id == req_id && d->reqs[i]->epoch == epoch)
            return d->reqs[i];
    return NULL;
}

bool dec_req_seen_epoch(const kvf_decode_t *d, uint64_t req_id, uint64_t epoch)
{
    for (size_t i = 0; i < d->n_reqs; i++)
        if (d->reqs[i]->req_id == req_id && d->reqs[i]->epoch >= epoch)
            return true;
    return false;
}

bool dec_req_releasing_reserved(const kvf_decode_t *d, uint64_t req_id)
{
    for (size_t i = 0; i < d->n_reqs; i++)
        if (d->reqs[i]->req_id == req_id && d->reqs[i]->reserved &&
            d->reqs[i]->h.state == KVF_HANDOFF_RELEASING)
            return true;
    return false;
}

uint32_t dec_req_live_count(const kvf_decode_t *d)
{
    uint32_t n = 0;
    for (size_t i = 0; i < d->n_reqs; i++)
        n += kvf_handoff_live(&d->reqs[i]->h);
    return n;
}

kvf_status_t dec_req_alloc_blocks(kvf_decode_t *d, dec_req_t *r, uint32_t n_blocks)
{
    r->blocks = malloc((size_t)n_blocks * sizeof(*r->blocks));
    if (!r->blocks)
        return KVF_ERR_NOMEM;
    kvf_status_t st = kvf_kvpool_alloc(d->rt.pool, n_blocks, r->blocks);
    if (st != KVF_OK) {
        free(r->blocks);
        r->blocks = NULL;
        return st;
    }
    r->n_blocks = n_blocks;
    return KVF_OK;
}

void dec_req_release_blocks(kvf_decode_t *d, dec_req_t *r)
{
    if (kvf_kvpool_release(d->rt.pool, r->blocks, r->n_blocks) != KVF_OK)
        kvf_log_error("request %llu epoch %llu: block table held blocks that were not allocated",
                      (unsigned long long)r->req_id, (unsigned long long)r->epoch);
    (void)kvf_handoff_on_released(&r->h);
    d->stats.requests_released++;
    kvf_log_debug("request %llu epoch %llu: %u blocks released", (unsigned long long)r->req_id,
                  (unsigned long long)r->epoch, r->n_blocks);
    req_remove(d, r);
}

void dec_req_end(kvf_decode_t *d, dec_req_t *r)
{
    if (kvf_handoff_end(&r->h) != KVF_OK)
        return;
    kvf_timer_cancel(kvf_evloop_timers(d->loop), &r->seal_timer);
    if (r->alloc_reply_to) {
        /* Its KvAlloc waited for copies from the tiers: the prefill node
         * hears it ended here instead of waiting out its alloc timeout.
         * The copies keep their own references to the blocks. */
        char *to = r->alloc_reply_to;
        r->alloc_reply_to = NULL;
        dec_reply_kv_alloc(d, r->req_id, r->epoch, to, KVF_ERR_CANCELLED,
                           "the request ended on the decode node", NULL);
        free(to);
    }
    if (r->reserved) {
        kvf_status_t st = kvf_xfer_cancel(d->xfer, r->req_id, r->epoch);
        if (st == KVF_OK)
            return;
        /* No reservation any more: nothing can land, release now. */
        kvf_log_warn("request %llu epoch %llu: transport had no reservation (%s)",
                     (unsigned long long)r->req_id, (unsigned long long)r->epoch,
                     kvf_status_str(st));
        r->reserved = false;
    }
    dec_req_release_blocks(d, r);
}

void dec_req_fail(kvf_decode_t *d, dec_req_t *r, kvf_status_t status, const char *fmt, ...)
{
    char text[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    dec_send_error(d, r->req_id, r->epoch, status, "%s", text);
    d->stats.requests_failed++;
    dec_req_end(d, r);
}

/* ---- cancels that came first ------------------------------------------------ */

void dec_req_note_cancelled(kvf_decode_t *d, uint64_t req_id, uint64_t epoch)
{
    if (dec_req_was_cancelled(d, req_id, epoch))
        return;
    if (!d->cancelled) {
        d->cancelled = calloc(DECODE_CANCELLED_MAX, sizeof(*d->cancelled));
        if (!d->cancelled)
            return; /* the attempt's lease and seal deadline still end it */
    }
    size_t at = (d->cancelled_head + d->n_cancelled) % DECODE_CANCELLED_MAX;
    if (d->n_cancelled == DECODE_CANCELLED_MAX)
        d->cancelled_head = (d->cancelled_head + 1) % DECODE_CANCELLED_MAX; /* oldest forgotten */
    else
        d->n_cancelled++;
    d->cancelled[at] = (dec_cancelled_t){.req_id = req_id, .epoch = epoch, .at_ns = kvf_clock_ns()};
}

bool dec_req_was_cancelled(const kvf_decode_t *d, uint64_t req_id, uint64_t epoch)
{
    uint64_t keep_ns = ((uint64_t)d->cfg.lease_ms + DECODE_SEAL_MARGIN_MS) * 1000000ull;
    uint64_t now = kvf_clock_ns();
    for (size_t i = 0; i < d->n_cancelled; i++) {
        const dec_cancelled_t *c = &d->cancelled[(d->cancelled_head + i) % DECODE_CANCELLED_MAX];
        if (c->req_id == req_id && (c->epoch == 0 || c->epoch == epoch) &&
            now - c->at_ns <= keep_ns)
            return true;
    }
    return false;
}

void dec_req_cancelled_free(kvf_decode_t *d)
{
    free(d->cancelled);
    d->cancelled = NULL;
    d->n_cancelled = d->cancelled_head = 0;
}
