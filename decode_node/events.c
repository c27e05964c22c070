/* The receiving end of KV handoffs: the transport's events for this
 * node's reservations (kvf/xfer.h) and the deadline by which a handoff
 * must seal. */
#include "decode_internal.h"

#include "kvf/clock.h"
#include "kvf/log.h"

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
    if (r->h.state == KVF_HANDOFF_SEALED)
        dec_req_join(d, r);
}

static void on_expired(kvf_decode_t *d, const kvf_xfer_event_t *ev)
{
    dec_req_t *r = live_entry(d, ev);
    if (!r)
        return;
    kvf_log_warn("request %llu epoch %llu: lease of %u ms ended in state %s",
                 (unsigned long long)r->req_id, (unsigned long long)r->epoch, d->cfg.lease_ms,
                 kvf_handoff_state_name(r->h.state));
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

/* Ends transferred requests whose handoff did not seal in time: the data
 * may have landed (the transport lease then no longer runs) while the
 * prefill node's KvReady never came. */
void dec_check_seal_deadlines(kvf_decode_t *d)
{
    uint64_t now = kvf_clock_ns();
    for (size_t i = 0; i < d->n_reqs; i++) {
        dec_req_t *r = d->reqs[i];
        if (r->local || !r->seal_by_ns || now < r->seal_by_ns ||
            (r->h.state != KVF_HANDOFF_ALLOCATED && r->h.state != KVF_HANDOFF_WRITING))
            continue;
        kvf_log_warn("request %llu epoch %llu: handoff not sealed within the lease (state %s)",
                     (unsigned long long)r->req_id, (unsigned long long)r->epoch,
                     kvf_handoff_state_name(r->h.state));
        r->seal_by_ns = 0;
        dec_req_fail(d, r, KVF_ERR_TIMEOUT, "decode node: kv handoff not sealed within %u ms",
                     d->cfg.lease_ms);
        i = (size_t)-1; /* the table may have changed: scan again */
    }
}
