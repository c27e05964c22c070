/* The one admission path of the decode node (docs/PROTOCOL.md, step 3): a
 * KvAlloc (K/V to come over the transport) and a local PrefillRequest
 * (--prefill-local: K/V computed here) both go through dec_admit(), which
 * orders epochs, applies the admission rule (handoff.h), takes the blocks
 * and, for a transfer, reserves them with the transport. What differs
 * between the two messages (their fields, how a refusal is answered) stays
 * with their handlers in messages.c. */
#include "decode_internal.h"

#include "kvf/kvcache.h"
#include "kvf/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Orders spec's epoch against what the table holds of the request: a live
 * older epoch is ended (the router moved on), a newer or ended one makes
 * the message stale, the same live one makes it a duplicate. */
static kvf_status_t order_epochs(kvf_decode_t *d, const dec_admit_spec_t *spec, dec_req_t **dup_p)
{
    unsigned long long id = (unsigned long long)spec->req_id,
                       epoch = (unsigned long long)spec->epoch;
    dec_req_t *old = dec_req_find_live(d, spec->req_id);
    if (!old) {
        if (!dec_req_seen_epoch(d, spec->req_id, spec->epoch))
            return KVF_OK;
        d->stats.stale_dropped++;
        kvf_log_info("request %llu: %s of epoch %llu for an ended attempt dropped", id, spec->what,
                     epoch);
        return KVF_ERR_STALE;
    }
    if (old->epoch > spec->epoch) {
        d->stats.stale_dropped++;
        kvf_log_info("request %llu: %s of epoch %llu dropped (working on %llu)", id, spec->what,
                     epoch, (unsigned long long)old->epoch);
        return KVF_ERR_STALE;
    }
    if (old->epoch == spec->epoch) {
        d->stats.malformed_dropped++;
        kvf_log_warn("request %llu epoch %llu: duplicate %s", id, epoch, spec->what);
        *dup_p = old;
        return KVF_ERR_AGAIN;
    }
    kvf_log_info("request %llu: epoch %llu replaces epoch %llu", id, epoch,
                 (unsigned long long)old->epoch);
    d->stats.requests_failed++;
    dec_req_end(d, old);
    /* A fully landed reservation is released at once: take that event
     * now, so the new epoch can reserve under the same id. */
    dec_drain_events(d);
    return KVF_OK;
}

/* Whether the node takes the request now; why says why not. */
static kvf_status_t decide(kvf_decode_t *d, const dec_admit_spec_t *spec, char *why, size_t why_len,
                           uint32_t *n_blocks_p)
{
    if (d->draining) {
        snprintf(why, why_len, "decode node is draining");
        return KVF_ERR_NO_SPACE;
    }
    if (!spec->local && dec_req_releasing_reserved(d, spec->req_id)) {
        snprintf(why, why_len, "an earlier attempt of the request still holds blocks");
        return KVF_ERR_NO_SPACE;
    }
    kvf_decode_admission_t a = {
        .free_blocks = kvf_node_prefix_available(&d->pc),
        .live = dec_req_live_count(d),
        .max_running = (uint32_t)d->cfg.max_running,
        .max_context = d->max_context,
        .block_size = d->block_size,
    };
    kvf_status_t st = kvf_decode_admit(&a, spec->n_tokens, spec->max_new, n_blocks_p);
    if (st == KVF_ERR_INVAL)
        snprintf(why, why_len, "%u tokens do not fit the context of %u", spec->n_tokens,
                 d->max_context);
    else if (st != KVF_OK)
        snprintf(why, why_len, "no room: %u blocks free, %u of %u running", a.free_blocks, a.live,
                 a.max_running);
    return st;
}

/* Lets the prefill node write r's prompt blocks from r->cached_blocks on
 * (whole blocks of the pool, contiguous each) until the lease ends. */
kvf_status_t dec_reserve_prompt_blocks(kvf_decode_t *d, dec_req_t *r)
{
    /* Blocks the prefix cache gave are shared and complete: the prefill
     * node may not write them, so the transport accepts no write there. */
    uint32_t n_prompt_blocks = (r->n_tokens + d->block_size - 1) / d->block_size;
    uint32_t first = r->cached_blocks, n_ranges = n_prompt_blocks - first;
    kvf_xfer_range_t *ranges = malloc(n_ranges * sizeof(*ranges));
    if (!ranges)
        return KVF_ERR_NOMEM;
    for (uint32_t i = 0; i < n_ranges; i++)
        ranges[i] = (kvf_xfer_range_t){.off = (uint64_t)r->blocks[first + i] * d->block_bytes,
                                       .len = d->block_bytes};
    kvf_status_t st =
        kvf_xfer_reserve(d->xfer, r->req_id, r->epoch, ranges, n_ranges, d->cfg.lease_ms);
    free(ranges);
    if (st != KVF_OK)
        return st;
    r->reserved = true;
    if (kvf_timer_armed(&r->seal_timer))
        dec_renew_seal_deadline(d, r); /* armed while its tier copies came */
    else
        dec_arm_seal_deadline(d, r);
    return KVF_OK;
}

/* A new entry for spec with n_blocks blocks, in the table. */
static kvf_status_t create_entry(kvf_decode_t *d, const dec_admit_spec_t *spec, uint32_t n_blocks,
                                 dec_req_t **r_p)
{
    dec_req_t *r = calloc(1, sizeof(*r));
    if (!r)
        return KVF_ERR_NOMEM;
    r->req_id = spec->req_id;
    r->epoch = spec->epoch;
    r->local = spec->local;
    kvf_handoff_init(&r->h, spec->local);
    kvf_timer_init(&r->seal_timer, NULL, NULL); /* armed by dec_reserve_prompt_blocks */
    r->n_tokens = spec->n_tokens;
    r->max_new = spec->max_new;
    kvf_status_t st = KVF_ERR_NOMEM;
    if (spec->sender && !(r->sender = strdup(spec->sender)))
        goto fail_prompt;
    if (spec->cache_salt_len) {
        if (!(r->salt = malloc(spec->cache_salt_len)))
            goto fail_prompt;
        memcpy(r->salt, spec->cache_salt, spec->cache_salt_len);
        r->salt_len = spec->cache_salt_len;
    }
    if (spec->local) {
        r->prompt = malloc((size_t)spec->n_tokens * sizeof(*r->prompt));
        if (!r->prompt)
            goto fail_prompt;
        memcpy(r->prompt, spec->prompt, (size_t)spec->n_tokens * sizeof(*r->prompt));
    } else if (!(r->alloc_reply_to = strdup(spec->reply_inbox))) {
        goto fail_prompt; /* (before any tier copy starts) */
    }
    st = dec_prefix_alloc(d, r, spec, n_blocks);
    if (st != KVF_OK)
        goto fail_prompt;
    if (!spec->local && r->tier_pending) {
        /* Its next offered blocks come back from the tiers: reserved and
         * answered once they are in (tiers.c). The seal deadline covers
         * the wait too: the entry never outlives a lease plus the margin
         * unanswered. */
        dec_arm_seal_deadline(d, r);
    } else if (!spec->local) {
        free(r->alloc_reply_to); /* answered now, by the caller */
        r->alloc_reply_to = NULL;
        st = dec_reserve_prompt_blocks(d, r);
        if (st != KVF_OK)
            goto fail_reserve;
    }
    st = dec_req_add(d, r);
    if (st != KVF_OK)
        goto fail_add;
    *r_p = r;
    return KVF_OK;

fail_add:
    /* The reservation never reached the peer: nothing can land. The
     * transport still reports RELEASED, which finds no entry. Tier copies
     * in flight hold their own references and find no entry either. */
    if (r->reserved)
        (void)kvf_xfer_cancel(d->xfer, r->req_id, r->epoch);
fail_reserve:
    kvf_kvpool_release(d->rt.pool, r->blocks, r->n_blocks);
fail_prompt:
    dec_req_free(d, r);
    return st;
}

kvf_status_t dec_admit(kvf_decode_t *d, const dec_admit_spec_t *spec, char *why, size_t why_len,
                       dec_req_t **r_p)
{
    unsigned long long id = (unsigned long long)spec->req_id,
                       epoch = (unsigned long long)spec->epoch;
    if (dec_req_was_cancelled(d, spec->req_id, spec->epoch)) {
        d->stats.stale_dropped++;
        kvf_log_info("request %llu epoch %llu: %s for an attempt cancelled before it came", id,
                     epoch, spec->what);
        snprintf(why, why_len, "the request was cancelled");
        return KVF_ERR_CANCELLED;
    }
    kvf_status_t st = order_epochs(d, spec, r_p);
    if (st != KVF_OK)
        return st;
    uint32_t n_blocks = 0;
    st = decide(d, spec, why, why_len, &n_blocks);
    if (st != KVF_OK) {
        d->stats.requests_refused++;
        kvf_log_info("request %llu epoch %llu refused: %s", id, epoch, why);
        return st;
    }
    st = create_entry(d, spec, n_blocks, r_p);
    if (st != KVF_OK) {
        kvf_log_error("request %llu: taking %u blocks failed: %s", id, n_blocks,
                      kvf_status_str(st));
        snprintf(why, why_len, "decode node could not reserve blocks");
        d->stats.requests_refused++;
        return st == KVF_ERR_NO_SPACE ? KVF_ERR_NO_SPACE : KVF_ERR_NOMEM;
    }
    d->stats.requests_admitted++;
    kvf_log_debug("request %llu epoch %llu: %s admitted, %u blocks for %u + %u tokens", id, epoch,
                  spec->what, n_blocks, spec->n_tokens, spec->max_new);
    return KVF_OK;
}
