/* The sender's batches (kvf/xfer.h): slices validated against both pools
 * and coalesced, the batch handed to the backend with its completion
 * message (xfer_fin.c), its end, its deadline, and waiting for it. */
#include "xfer_internal.h"

#include "kvf/clock.h"
#include "kvf/log.h"

#include <poll.h>
#include <stdlib.h>

void kvf_xfer__batch_end(kvf_xfer_batch_t *b, kvf_status_t status)
{
    if (b->status != KVF_ERR_AGAIN)
        return;
    b->status = status;
    kvf_xfer_t *x = b->peer->xfer;
    if (status == KVF_OK && b->is_get)
        x->stats.bytes_read += b->bytes;
    if (status == KVF_OK)
        x->stats.batches_ok++;
    else
        x->stats.batches_failed++;
}

/* Validates slices against both pools and merges each slice into the one
 * before it when both its local and remote ranges continue it. */
static kvf_status_t slices_coalesce(const kvf_xfer_peer_t *p, const kvf_xfer_slice_t *s, size_t n,
                                    kvf_xfer_slice_t **out_p, size_t *n_out_p, uint64_t *bytes_p)
{
    const kvf_xfer_t *x = p->xfer;
    kvf_xfer_slice_t *out = NULL;
    if (n) {
        out = malloc(n * sizeof(*out));
        if (!out)
            return KVF_ERR_NOMEM;
    }
    size_t m = 0;
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        const kvf_xfer_slice_t *c = &s[i];
        if (!c->len || c->local_off > x->cfg.pool_bytes ||
            c->len > x->cfg.pool_bytes - c->local_off || c->remote_off > p->remote_bytes ||
            c->len > p->remote_bytes - c->remote_off) {
            kvf_log_error("xfer: slice %zu (local %llu, remote %llu, %llu bytes) is outside the "
                          "pools (local %llu, remote %llu bytes)",
                          i, (unsigned long long)c->local_off, (unsigned long long)c->remote_off,
                          (unsigned long long)c->len, (unsigned long long)x->cfg.pool_bytes,
                          (unsigned long long)p->remote_bytes);
            free(out);
            return KVF_ERR_INVAL;
        }
        bytes += c->len;
        if (m && out[m - 1].local_off + out[m - 1].len == c->local_off &&
            out[m - 1].remote_off + out[m - 1].len == c->remote_off)
            out[m - 1].len += c->len;
        else
            out[m++] = *c;
    }
    if (m > KVF_XFER_MAX_RANGES) {
        kvf_log_error("xfer: batch of %zu ranges is above the limit of %u", m, KVF_XFER_MAX_RANGES);
        free(out);
        return KVF_ERR_TOO_BIG;
    }
    *out_p = out;
    *n_out_p = m;
    *bytes_p = bytes;
    return KVF_OK;
}

/* The checks every batch passes, then the batch (slices coalesced) linked
 * into the peer and handed to the backend: puts with their completion
 * message, or reads. */
static kvf_status_t batch_start(kvf_xfer_peer_t *peer, const kvf_xfer_batch_spec_t *spec,
                                bool is_get, kvf_xfer_batch_t **batch_p)
{
    kvf_xfer_t *x = peer->xfer;
    if (peer->status != KVF_OK)
        return peer->status;
    uint32_t allowed = is_get ? 0 : KVF_XFER_LAST | KVF_XFER_ABORT;
    if (spec->flags & ~allowed || peer->accepted)
        return KVF_ERR_INVAL;
    if (is_get && (!x->ops->get || peer->two_sided))
        return KVF_ERR_UNSUPPORTED;
    if (x->ops->ready && !x->ops->ready(peer))
        return KVF_ERR_AGAIN;
    uint64_t now = kvf_clock_ns();
    if (spec->not_after_ns && now >= spec->not_after_ns) {
        kvf_log_warn("xfer: request %llu epoch %llu: lease ended, batch not posted",
                     (unsigned long long)spec->req_id, (unsigned long long)spec->epoch);
        return KVF_ERR_TIMEOUT;
    }
    kvf_xfer_batch_t *b = calloc(1, sizeof(*b));
    if (!b)
        return KVF_ERR_NOMEM;
    b->peer = peer;
    b->req_id = spec->req_id;
    b->epoch = spec->epoch;
    b->status = KVF_ERR_AGAIN;
    b->is_get = is_get;
    b->timeout_ns = now + (uint64_t)x->cfg.timeout_ms * 1000000ull;
    b->not_after_ns = spec->not_after_ns;
    uint64_t bytes = 0;
    kvf_status_t st =
        slices_coalesce(peer, spec->slices, spec->n_slices, &b->ranges, &b->n_ranges, &bytes);
    if (st != KVF_OK)
        goto fail_slices;
    if (!is_get) {
        st = kvf_xfer__fin_build(b, spec->flags, bytes);
        if (st != KVF_OK)
            goto fail_fin;
    }
    b->bytes = bytes;
    /* Linked before the backend starts: it may end the batch at once. */
    b->next = peer->batches;
    if (peer->batches)
        peer->batches->prev = b;
    peer->batches = b;
    x->stats.batches_posted++;
    if (!is_get) {
        x->stats.bytes_posted += bytes;
        x->stats.puts_issued += b->n_ranges;
    }
    kvf_xfer__timer_at(x, kvf_xfer__batch_deadline(b));
    st = is_get ? x->ops->get(b) : x->ops->post(b);
    if (st != KVF_OK) {
        /* The backend failed the peer or the batch; report it now. */
        kvf_xfer__batch_end(b, st);
        b->released = true;
        kvf_xfer__reap(x);
        return st;
    }
    *batch_p = b;
    return KVF_OK;

fail_fin:
    free(b->ranges);
fail_slices:
    free(b);
    return st;
}

kvf_status_t kvf_xfer_post(kvf_xfer_peer_t *peer, const kvf_xfer_batch_spec_t *spec,
                           kvf_xfer_batch_t **batch_p)
{
    return batch_start(peer, spec, false, batch_p);
}

kvf_status_t kvf_xfer_get(kvf_xfer_peer_t *peer, const kvf_xfer_batch_spec_t *spec,
                          kvf_xfer_batch_t **batch_p)
{
    return batch_start(peer, spec, true, batch_p);
}

kvf_status_t kvf_xfer_test(const kvf_xfer_batch_t *batch)
{
    /* A read that failed may still be writing the local pool. */
    if (batch->is_get && batch->backend_busy)
        return KVF_ERR_AGAIN;
    return batch->status;
}

void kvf_xfer_batch_release(kvf_xfer_batch_t *batch)
{
    if (!batch)
        return;
    batch->released = true;
    kvf_xfer__reap(batch->peer->xfer);
}

kvf_status_t kvf_xfer_wait(kvf_xfer_batch_t *batch, int timeout_ms)
{
    kvf_xfer_t *x = batch->peer->xfer;
    uint64_t until =
        timeout_ms < 0 ? UINT64_MAX : kvf_clock_ns() + (uint64_t)timeout_ms * 1000000ull;
    uint64_t active = kvf_clock_ns(); /* last time progress did something */
    for (;;) {
        unsigned n = kvf_xfer_progress(x);
        kvf_status_t st = kvf_xfer_test(batch);
        if (st != KVF_ERR_AGAIN)
            return st;
        uint64_t now = kvf_clock_ns();
        if (now >= until)
            return KVF_ERR_TIMEOUT;
        if (n)
            active = now;
        /* Spin first (over shared memory a batch takes microseconds, and a
         * wake-up through the fd costs tens), then sleep on the fd, waking
         * for the next deadline, and every 10 ms where the fd may not wake
         * for the batch's traffic. */
        if (now - active < 200000)
            continue;
        int fd = kvf_xfer_fd(x);
        if (fd < 0 || kvf_xfer_arm(x) != KVF_OK)
            continue;
        int ms = kvf_xfer_timeout_ms(x);
        int left = until == UINT64_MAX ? 10 : kvf_clock_ms_until(until);
        if (ms < 0 || ms > left)
            ms = left;
        if (!x->caps.fd_wakes_on_data && ms > 10)
            ms = 10;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        (void)poll(&pfd, 1, ms);
        active = kvf_clock_ns();
    }
}

void kvf_xfer__peer_progressed(kvf_xfer_peer_t *peer)
{
    peer->progress_ns = kvf_clock_ns();
}

uint64_t kvf_xfer__batch_deadline(const kvf_xfer_batch_t *b)
{
    uint64_t t = b->timeout_ns;
    uint64_t moved = b->peer->progress_ns + (uint64_t)b->peer->xfer->cfg.timeout_ms * 1000000ull;
    if (b->peer->progress_ns && moved > t)
        t = moved;
    if (b->not_after_ns && b->not_after_ns < t)
        t = b->not_after_ns;
    return t;
}

uint64_t kvf_xfer__batch_deadlines(kvf_xfer_t *x, uint64_t now)
{
    uint64_t next = UINT64_MAX;
    uint64_t setup_ns = (uint64_t)x->cfg.timeout_ms * 1000000ull;
    for (kvf_xfer_peer_t *p = x->peers; p; p = p->next) {
        bool late = false, past_lease = false;
        if (!p->accepted && p->status == KVF_OK && !kvf_xfer_peer_ready(p)) {
            if (now >= p->progress_ns + setup_ns) {
                kvf_log_error("xfer: a connection was not set up within %u ms; closing it",
                              x->cfg.timeout_ms);
                kvf_xfer__peer_fail(p, KVF_ERR_TIMEOUT);
                continue;
            }
            if (p->progress_ns + setup_ns < next)
                next = p->progress_ns + setup_ns;
        }
        for (kvf_xfer_batch_t *b = p->batches; b; b = b->next) {
            if (b->status != KVF_ERR_AGAIN)
                continue;
            uint64_t deadline = kvf_xfer__batch_deadline(b);
            /* Reads past their lease write nothing remote: only they fail
             * (what they read may be stale), the connection stays. */
            if (b->is_get && b->not_after_ns && now >= b->not_after_ns &&
                now < b->timeout_ns) {
                kvf_xfer__batch_end(b, KVF_ERR_TIMEOUT);
                continue;
            }
            if (now >= deadline)
                late = true;
            if (b->not_after_ns && now >= b->not_after_ns)
                past_lease = true;
            else if (deadline < next)
                next = deadline;
        }
        if (late) {
            kvf_log_error("xfer: a batch saw no progress for %u ms (or passed its lease end); "
                          "closing the connection",
                          x->cfg.timeout_ms);
            /* Its lease may have ended at the receiver: nothing more of it
             * may be written, not even by a flush. */
            p->close_now = past_lease;
            kvf_xfer__peer_fail(p, KVF_ERR_TIMEOUT);
        }
    }
    return next;
}
