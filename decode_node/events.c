/* The receiving end of KV handoffs: the transport's events for this
 * node's reservations (kvf/xfer.h), the deadline by which a handoff must
 * seal, and which prefill nodes' connections are known to work (for the
 * loop's wake-up rule, loop.c). */
#include "decode_internal.h"

#include "kvf/log.h"

#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

/* Most prefill nodes remembered as proven; past it the oldest is
 * forgotten (it is only looked at more often again). */
#define DECODE_SENDERS_MAX 256

/* ---- proven senders ---------------------------------------------------------- */

static ssize_t sender_index(const kvf_decode_t *d, const char *id)
{
    for (size_t i = 0; i < d->n_senders; i++)
        if (!strcmp(d->senders[i], id))
            return (ssize_t)i;
    return -1;
}

/* A batch of id's landed: its connection to this pool is set up. */
static void sender_proven(kvf_decode_t *d, const char *id)
{
    if (!id || sender_index(d, id) >= 0)
        return;
    if (d->n_senders == DECODE_SENDERS_MAX) {
        free(d->senders[0]);
        memmove(d->senders, d->senders + 1, (d->n_senders - 1) * sizeof(*d->senders));
        d->n_senders--;
    }
    if (!d->senders) {
        d->senders = calloc(DECODE_SENDERS_MAX, sizeof(*d->senders));
        if (!d->senders)
            return; /* unproven: looked at more often, nothing worse */
    }
    char *copy = strdup(id);
    if (copy)
        d->senders[d->n_senders++] = copy;
}

/* A handoff of id's failed: it may connect anew, and a connection being
 * set up does not wake the transport's fd. */
static void sender_doubtful(kvf_decode_t *d, const char *id)
{
    ssize_t i = id ? sender_index(d, id) : -1;
    if (i < 0)
        return;
    free(d->senders[i]);
    memmove(d->senders + i, d->senders + i + 1, (d->n_senders - (size_t)i - 1) * sizeof(char *));
    d->n_senders--;
}

void dec_senders_free(kvf_decode_t *d)
{
    for (size_t i = 0; i < d->n_senders; i++)
        free(d->senders[i]);
    free(d->senders);
    d->senders = NULL;
    d->n_senders = 0;
}

bool dec_handoff_needs_recheck(const kvf_decode_t *d, bool no_fd)
{
    for (size_t i = 0; i < d->n_reqs; i++) {
        const dec_req_t *r = d->reqs[i];
        bool expecting = r->h.state == KVF_HANDOFF_ALLOCATED || r->h.state == KVF_HANDOFF_WRITING;
        if (!expecting || r->alloc_reply_to)
            continue; /* (not reserved yet: its tier copies come first) */
        if (no_fd)
            return true;
        /* KvReady came before the last LANDED was taken. */
        if (r->h.ready && !r->h.landed_last)
            return true;
        /* The sender's connection may still be being set up. */
        if (!r->sender || sender_index(d, r->sender) < 0)
            return true;
    }
    return false;
}

/* ---- events ------------------------------------------------------------------ */

/* The live entry an event is about, or NULL. */
static dec_req_t *live_entry(const kvf_decode_t *d, const kvf_xfer_event_t *ev)
{
    dec_req_t *r = dec_req_find(d, ev->req_id, ev->epoch);
    return r && kvf_handoff_live(&r->h) ? r : NULL;
}

/* A batch landed: the sequence joins once KvReady came too. */
static void on_landed(kvf_decode_t *d, const kvf_xfer_event_t *ev)
{
    dec_req_t *r = live_entry(d, ev);
    if (!r || kvf_handoff_on_landed(&r->h, ev->last) != KVF_OK) {
        d->stats.stale_dropped++;
        kvf_log_info("request %llu epoch %llu: landed batch dropped",
                     (unsigned long long)ev->req_id, (unsigned long long)ev->epoch);
        return;
    }
    r->kv_bytes += ev->bytes;
    sender_proven(d, r->sender);
    /* The transport renewed the reservation's lease as the batch landed. */
    if (r->h.state == KVF_HANDOFF_WRITING)
        dec_renew_seal_deadline(d, r);
    if (r->h.state == KVF_HANDOFF_SEALED)
        dec_req_join(d, r, r->first_token);
}

static void on_expired(kvf_decode_t *d, const kvf_xfer_event_t *ev)
{
    dec_req_t *r = live_entry(d, ev);
    if (!r)
        return;
    kvf_log_warn("request %llu epoch %llu: lease of %u ms ended in state %s",
                 (unsigned long long)r->req_id, (unsigned long long)r->epoch, d->cfg.lease_ms,
                 kvf_handoff_state_name(r->h.state));
    sender_doubtful(d, r->sender);
    dec_req_fail(d, r, KVF_ERR_TIMEOUT, "decode node: kv reservation not sealed within %u ms",
                 d->cfg.lease_ms);
}

static void on_aborted(kvf_decode_t *d, const kvf_xfer_event_t *ev)
{
    dec_req_t *r = live_entry(d, ev);
    if (!r)
        return;
    /* The prefill node reports the failure to the router itself. */
    kvf_log_info("request %llu epoch %llu: transfer aborted by the prefill node",
                 (unsigned long long)r->req_id, (unsigned long long)r->epoch);
    sender_doubtful(d, r->sender);
    d->stats.requests_failed++;
    dec_req_end(d, r);
}

static void on_rejected(kvf_decode_t *d, const kvf_xfer_event_t *ev)
{
    dec_req_t *r = live_entry(d, ev);
    if (ev->status == KVF_ERR_STALE || !r) {
        d->stats.stale_dropped++;
        return;
    }
    d->stats.malformed_dropped++;
    sender_doubtful(d, r->sender);
    dec_req_fail(d, r, KVF_ERR_TRANSPORT, "decode node: kv transfer rejected: %s",
                 kvf_status_str(ev->status));
}

/* No write of an ended request can land any more: its blocks go back. */
static void on_released(kvf_decode_t *d, const kvf_xfer_event_t *ev)
{
    dec_req_t *r = dec_req_find(d, ev->req_id, ev->epoch);
    if (!r || r->h.state != KVF_HANDOFF_RELEASING || !r->reserved) {
        kvf_log_debug("request %llu epoch %llu: released without a releasing entry",
                      (unsigned long long)ev->req_id, (unsigned long long)ev->epoch);
        return;
    }
    dec_req_release_blocks(d, r);
}

static void on_xfer_event(kvf_decode_t *d, const kvf_xfer_event_t *ev)
{
    switch (ev->kind) {
    case KVF_XFER_EV_LANDED:
        on_landed(d, ev);
        return;
    case KVF_XFER_EV_EXPIRED:
        on_expired(d, ev);
        return;
    case KVF_XFER_EV_ABORTED:
        on_aborted(d, ev);
        return;
    case KVF_XFER_EV_REJECTED:
        on_rejected(d, ev);
        return;
    case KVF_XFER_EV_RELEASED:
        on_released(d, ev);
        return;
    }
}

void dec_drain_events(kvf_decode_t *d)
{
    kvf_xfer_event_t ev;
    while (kvf_xfer_poll(d->xfer, &ev) == KVF_OK)
        on_xfer_event(d, &ev);
}

/* The handoff did not seal in time: the data may have landed (the
 * transport lease then no longer runs) while the prefill node's KvReady
 * never came. */
static void on_seal_deadline(kvf_timer_t *t, void *arg)
{
    kvf_decode_t *d = arg;
    dec_req_t *r = (dec_req_t *)((char *)t - offsetof(dec_req_t, seal_timer));
    if (r->h.state != KVF_HANDOFF_ALLOCATED && r->h.state != KVF_HANDOFF_WRITING)
        return;
    kvf_log_warn("request %llu epoch %llu: handoff not sealed within the lease (state %s)",
                 (unsigned long long)r->req_id, (unsigned long long)r->epoch,
                 kvf_handoff_state_name(r->h.state));
    sender_doubtful(d, r->sender);
    dec_req_fail(d, r, KVF_ERR_TIMEOUT, "decode node: kv handoff not sealed within %u ms",
                 d->cfg.lease_ms);
}

void dec_renew_seal_deadline(kvf_decode_t *d, dec_req_t *r)
{
    /* Re-arming an armed timer never fails (kvf/timer.h). */
    (void)kvf_timer_arm_in_ms(kvf_evloop_timers(d->loop), &r->seal_timer,
                              (uint64_t)d->cfg.lease_ms + DECODE_SEAL_MARGIN_MS);
}

void dec_arm_seal_deadline(kvf_decode_t *d, dec_req_t *r)
{
    /* The transport's lease covers the data; this covers the KvReady
     * message too (a lost one must not hold the blocks for ever). The
     * margin lets the transport's own expiry speak first. */
    kvf_timer_init(&r->seal_timer, on_seal_deadline, d);
    if (kvf_timer_arm_in_ms(kvf_evloop_timers(d->loop), &r->seal_timer,
                            (uint64_t)d->cfg.lease_ms + DECODE_SEAL_MARGIN_MS) != KVF_OK)
        kvf_log_warn("request %llu epoch %llu: no memory for the seal deadline; the "
                     "transport's lease still ends the reservation",
                     (unsigned long long)r->req_id, (unsigned long long)r->epoch);
}
