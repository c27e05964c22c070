/* The receiver's side (kvf/xfer.h): reservations (which request may write
 * which blocks, until when), their fencing (when a cancelled request's
 * blocks are reusable), their lease deadlines, and the event queue that
 * reports all of it. Completions are checked in xfer_fin.c. */
#include "xfer_internal.h"

#include "kvf/array.h"
#include "kvf/clock.h"
#include "kvf/log.h"

#include <stdlib.h>
#include <string.h>

/* ---- events -------------------------------------------------------------- */

void kvf_xfer__event_push(kvf_xfer_t *x, kvf_xfer_event_kind_t kind, uint64_t req_id,
                          uint64_t epoch, uint64_t bytes, bool last, kvf_status_t status)
{
    if (x->ev_count == x->ev_cap) {
        /* a ring: copied out in order rather than realloc'd */
        size_t cap = kvf_array_grow_cap(x->ev_cap, x->ev_count + 1, 64);
        kvf_xfer_event_t *e = malloc(cap * sizeof(*e));
        if (!e) {
            /* The event is lost; the counters in the stats still show it. */
            kvf_log_error("xfer: out of memory queueing an event");
            return;
        }
        for (size_t i = 0; i < x->ev_count; i++)
            e[i] = x->events[(x->ev_head + i) % x->ev_cap];
        free(x->events);
        x->events = e;
        x->ev_cap = cap;
        x->ev_head = 0;
    }
    kvf_xfer_event_t *e = &x->events[(x->ev_head + x->ev_count) % x->ev_cap];
    *e = (kvf_xfer_event_t){.kind = kind,
                            .req_id = req_id,
                            .epoch = epoch,
                            .bytes = bytes,
                            .last = last,
                            .status = status};
    x->ev_count++;
}

kvf_status_t kvf_xfer_poll(kvf_xfer_t *xfer, kvf_xfer_event_t *ev_p)
{
    if (!xfer->ev_count)
        return KVF_ERR_AGAIN;
    *ev_p = xfer->events[xfer->ev_head];
    xfer->ev_head = (xfer->ev_head + 1) % xfer->ev_cap;
    xfer->ev_count--;
    return KVF_OK;
}

/* ---- reservations -------------------------------------------------------- */

kvf_resv_t *kvf_xfer__resv_find(kvf_xfer_t *x, uint64_t req_id)
{
    for (size_t i = 0; i < x->n_resv; i++)
        if (x->resv[i].req_id == req_id)
            return &x->resv[i];
    return NULL;
}

void kvf_xfer__resv_remove(kvf_xfer_t *x, kvf_resv_t *r)
{
    kvf_xfer__event_push(x, KVF_XFER_EV_RELEASED, r->req_id, r->epoch, 0, false, KVF_OK);
    free(r->ranges);
    *r = x->resv[--x->n_resv];
    x->stats.reservations_live = x->n_resv;
}

static int range_cmp(const void *a, const void *b)
{
    const kvf_xfer_range_t *ra = a, *rb = b;
    return ra->off < rb->off ? -1 : ra->off > rb->off;
}

/* Sorts ranges and merges the ones that touch or overlap, so a
 * completion's ranges are found by bisection; returns how many are left.
 * *total_p: the bytes of the ranges as given (overlaps counted twice). */
static size_t ranges_sort_merge(kvf_xfer_range_t *ranges, size_t n, uint64_t *total_p)
{
    qsort(ranges, n, sizeof(*ranges), range_cmp);
    size_t m = 0;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        total += ranges[i].len;
        if (m && ranges[m - 1].off + ranges[m - 1].len >= ranges[i].off) {
            uint64_t end = ranges[i].off + ranges[i].len;
            if (end > ranges[m - 1].off + ranges[m - 1].len)
                ranges[m - 1].len = end - ranges[m - 1].off;
        } else {
            ranges[m++] = ranges[i];
        }
    }
    *total_p = total;
    return m;
}

kvf_status_t kvf_xfer_reserve(kvf_xfer_t *xfer, uint64_t req_id, uint64_t epoch,
                              const kvf_xfer_range_t *ranges, size_t n_ranges, uint32_t lease_ms)
{
    if (kvf_xfer__resv_find(xfer, req_id)) {
        kvf_log_error("xfer: request %llu already has a reservation", (unsigned long long)req_id);
        return KVF_ERR_INVAL;
    }
    if (!n_ranges)
        return KVF_ERR_INVAL;
    for (size_t i = 0; i < n_ranges; i++) {
        if (!ranges[i].len || ranges[i].off > xfer->cfg.pool_bytes ||
            ranges[i].len > xfer->cfg.pool_bytes - ranges[i].off) {
            kvf_log_error("xfer: request %llu: range %zu is outside the pool",
                          (unsigned long long)req_id, i);
            return KVF_ERR_INVAL;
        }
    }
    kvf_status_t st =
        kvf_array_reserve(&xfer->resv, &xfer->cap_resv, xfer->n_resv + 1, 16, sizeof(*xfer->resv));
    if (st != KVF_OK)
        return st;
    kvf_xfer_range_t *copy = malloc(n_ranges * sizeof(*copy));
    if (!copy)
        return KVF_ERR_NOMEM;
    memcpy(copy, ranges, n_ranges * sizeof(*copy));
    uint64_t total = 0;
    size_t m = ranges_sort_merge(copy, n_ranges, &total);
    uint64_t lease = lease_ms ? lease_ms : KVF_XFER_DEFAULT_LEASE_MS;
    kvf_resv_t *r = &xfer->resv[xfer->n_resv++];
    *r = (kvf_resv_t){.req_id = req_id,
                      .epoch = epoch,
                      .ranges = copy,
                      .n_ranges = m,
                      .total_bytes = total,
                      .lease_end_ns = kvf_clock_ns() + lease * 1000000ull,
                      .lease_ns = lease * 1000000ull,
                      .state = KVF_RESV_LIVE};
    xfer->stats.reservations_live = xfer->n_resv;
    kvf_xfer__timer_at(xfer, r->lease_end_ns);
    return KVF_OK;
}

void kvf_xfer__resv_extend(kvf_resv_t *r, uint64_t until_ns)
{
    if (r->state == KVF_RESV_LIVE && until_ns > r->lease_end_ns)
        r->lease_end_ns = until_ns;
}

kvf_status_t kvf_xfer_renew(kvf_xfer_t *xfer, uint64_t req_id, uint64_t epoch)
{
    kvf_resv_t *r = kvf_xfer__resv_find(xfer, req_id);
    if (!r || r->epoch != epoch || r->state != KVF_RESV_LIVE)
        return KVF_ERR_NOT_FOUND;
    kvf_xfer__resv_extend(r, kvf_clock_ns() + r->lease_ns);
    /* A later deadline: the next timer is only ever too early, and then
     * recomputed when it fires. */
    return KVF_OK;
}

kvf_status_t kvf_xfer_cancel(kvf_xfer_t *xfer, uint64_t req_id, uint64_t epoch)
{
    kvf_resv_t *r = kvf_xfer__resv_find(xfer, req_id);
    if (!r || r->epoch != epoch)
        return KVF_ERR_NOT_FOUND;
    /* Two-sided: writes are the receiver's own copies, each checked against
     * a live reservation, so none can follow this call. */
    if (xfer->cfg.two_sided) {
        kvf_xfer__resv_remove(xfer, r);
        return KVF_OK;
    }
    switch (r->state) {
    case KVF_RESV_DONE:
        kvf_xfer__resv_remove(xfer, r);
        break;
    case KVF_RESV_LIVE:
    case KVF_RESV_EXPIRED:
        r->state = KVF_RESV_FENCED;
        kvf_xfer__timer_at(xfer, r->lease_end_ns + (uint64_t)xfer->cfg.grace_ms * 1000000ull);
        break;
    case KVF_RESV_FENCED:
        break;
    }
    return KVF_OK;
}

/* Whether [off, off+len) lies inside one of r's (sorted, merged) ranges. */
bool kvf_xfer__resv_covers(const kvf_resv_t *r, uint64_t off, uint64_t len)
{
    size_t lo = 0, hi = r->n_ranges;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (r->ranges[mid].off + r->ranges[mid].len <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == r->n_ranges)
        return false;
    const kvf_xfer_range_t *c = &r->ranges[lo];
    return off >= c->off && len <= c->len && off - c->off <= c->len - len;
}

bool kvf_xfer__resv_accepts(kvf_xfer_t *xfer, uint64_t req_id, uint64_t epoch, uint64_t off,
                            uint64_t len)
{
    const kvf_resv_t *r = kvf_xfer__resv_find(xfer, req_id);
    return r && r->epoch == epoch && r->state == KVF_RESV_LIVE && len &&
           kvf_xfer__resv_covers(r, off, len);
}

/* ---- deadlines ----------------------------------------------------------- */

uint64_t kvf_xfer__resv_deadlines(kvf_xfer_t *x, uint64_t now)
{
    uint64_t next = UINT64_MAX;
    uint64_t grace = (uint64_t)x->cfg.grace_ms * 1000000ull;
    for (size_t i = 0; i < x->n_resv;) {
        kvf_resv_t *r = &x->resv[i];
        if (r->state == KVF_RESV_LIVE && now >= r->lease_end_ns) {
            kvf_log_warn("xfer: request %llu epoch %llu: lease ended before the last batch",
                         (unsigned long long)r->req_id, (unsigned long long)r->epoch);
            r->state = KVF_RESV_EXPIRED;
            kvf_xfer__event_push(x, KVF_XFER_EV_EXPIRED, r->req_id, r->epoch, 0, false,
                                 KVF_ERR_TIMEOUT);
        }
        if (r->state == KVF_RESV_FENCED && now >= r->lease_end_ns + grace) {
            kvf_xfer__resv_remove(x, r); /* moved the last one into slot i */
            continue;
        }
        if (r->state == KVF_RESV_LIVE && r->lease_end_ns < next)
            next = r->lease_end_ns;
        if (r->state == KVF_RESV_FENCED && r->lease_end_ns + grace < next)
            next = r->lease_end_ns + grace;
        i++;
    }
    return next;
}
