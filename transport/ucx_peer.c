/* UCX backend: peers. An endpoint per peer (with peer failure detection
 * where the transports have it), the remote pool's rkey, and the shutdown
 * that flushes, then closes by force (ucx_peer_phase_t), driven from
 * progress because UCX must not be re-entered from its callbacks. */
#include "ucx_internal.h"

#include "kvf/clock.h"
#include "kvf/log.h"

#include <stdlib.h>

static void ep_error_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    kvf_xfer_peer_t *p = arg;
    (void)ep;
    /* A peer that leaves (a decode node draining away) fails its idle
     * connection too: that is only news when batches were in flight. */
    size_t in_flight = 0;
    for (const kvf_xfer_batch_t *b = p->batches; b; b = b->next)
        in_flight += b->status == KVF_ERR_AGAIN;
    if (in_flight)
        kvf_log_error("xfer/ucx: connection to peer failed with %zu batches in flight: %s",
                      in_flight, ucs_status_string(status));
    else
        kvf_log_info("xfer/ucx: idle connection to a peer closed: %s", ucs_status_string(status));
    kvf_xfer__peer_fail(p, KVF_ERR_PEER);
}

/* Creates the endpoint to address, with peer failure detection unless the
 * transports are known to lack it. */
static ucs_status_t ep_create(kvf_xfer_peer_t *p, const ucp_address_t *address, ucp_ep_h *ep_p)
{
    ucx_xfer_t *u = p->xfer->be;
    ucp_ep_params_t params = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = address,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = ep_error_cb, .arg = p},
    };
    if (u->warned_no_peer_mode) /* known to fail: skip the attempt (and UCX's log line) */
        params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    ucs_status_t s = ucp_ep_create(u->worker, &params, ep_p);
    if (s == UCS_ERR_UNREACHABLE && params.err_mode == UCP_ERR_HANDLING_MODE_PEER) {
        /* UCX 1.13's shared-memory transports have no peer failure
         * support, so a peer-mode endpoint cannot reach a shm-only peer.
         * Without it a dead peer is found by the batch deadline alone
         * (xfer_batch.c), which then closes the endpoint by force. */
        if (!u->warned_no_peer_mode)
            kvf_log_warn("xfer/ucx: transports lack peer failure detection; a dead peer is "
                         "detected by the %u ms batch deadline",
                         p->xfer->cfg.timeout_ms);
        u->warned_no_peer_mode = true;
        params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
        s = ucp_ep_create(u->worker, &params, ep_p);
    }
    if (s != UCS_OK)
        kvf_log_error("xfer/ucx: creating the endpoint failed: %s", ucs_status_string(s));
    return s;
}

/* Closes an endpoint nothing was posted on yet, by force, at once. */
static void ep_close_now(ucx_xfer_t *u, ucp_ep_h ep)
{
    ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = UCP_EP_CLOSE_FLAG_FORCE};
    void *req = ucp_ep_close_nbx(ep, &cp);
    if (UCS_PTR_IS_PTR(req)) {
        while (ucp_request_check_status(req) == UCS_INPROGRESS)
            ucp_worker_progress(u->worker);
        ucp_request_free(req);
    }
}

kvf_status_t kvf_ucx__connect(kvf_xfer_peer_t *p, const uint8_t *body, size_t len)
{
    ucx_xfer_t *u = p->xfer->be;
    if (len < 8) {
        kvf_log_error("xfer/ucx: descriptor body of %zu bytes is truncated", len);
        return KVF_ERR_FORMAT;
    }
    uint32_t al = xfer_get_u32(body), rl = xfer_get_u32(body + 4);
    if (!al || (!rl && !p->two_sided) || (uint64_t)al + rl + 8 != len) {
        kvf_log_error("xfer/ucx: descriptor body lengths (address %u, rkey %u) do not add up to "
                      "%zu bytes",
                      al, rl, len);
        return KVF_ERR_FORMAT;
    }
    ucx_peer_t *up = calloc(1, sizeof(*up));
    if (!up)
        return KVF_ERR_NOMEM;
    ucs_status_t s = ep_create(p, (const ucp_address_t *)(body + 8), &up->ep);
    if (s != UCS_OK)
        goto fail_ep;
    if (!p->two_sided)
        s = ucp_ep_rkey_unpack(up->ep, body + 8 + al, &up->rkey);
    if (s != UCS_OK) {
        kvf_log_error("xfer/ucx: unpacking the peer's rkey failed: %s", ucs_status_string(s));
        goto fail_rkey;
    }
    /* The probe (see ucx_peer_t). */
    ucp_request_param_t fp = {.op_attr_mask = 0};
    void *req = ucp_ep_flush_nbx(up->ep, &fp);
    if (UCS_PTR_IS_ERR(req)) {
        s = UCS_PTR_STATUS(req);
        kvf_log_error("xfer/ucx: setting the endpoint up failed: %s", ucs_status_string(s));
        if (up->rkey)
            ucp_rkey_destroy(up->rkey);
        goto fail_rkey;
    }
    up->probe_req = req;
    up->wired = req == NULL;
    p->be = up;
    return KVF_OK;

fail_rkey:
    ep_close_now(u, up->ep);
fail_ep:
    free(up);
    return kvf_ucx__status(s);
}

void kvf_ucx__shutdown(kvf_xfer_peer_t *p)
{
    ucx_peer_t *up = p->be;
    up->close_wanted = true;
}

static bool request_done(void **req_p)
{
    if (*req_p) {
        if (ucp_request_check_status(*req_p) == UCS_INPROGRESS)
            return false;
        ucp_request_free(*req_p);
        *req_p = NULL;
    }
    return true;
}

/* Moves a peer's shutdown on (see ucx_peer_phase_t); outside callbacks.
 * Returns whether anything happened. */
static bool peer_close_step(kvf_xfer_peer_t *p, uint64_t now)
{
    ucx_peer_t *up = p->be;
    switch (up->phase) {
    case UCX_PEER_OPEN: {
        up->force_at_ns = now + (uint64_t)p->xfer->cfg.grace_ms * 1000000ull;
        up->phase = UCX_PEER_FLUSHING;
        if (p->close_now)
            return true; /* no flush: it could push puts past the lease end */
        ucp_request_param_t fp = {.op_attr_mask = 0};
        void *req = ucp_ep_flush_nbx(up->ep, &fp);
        up->flush_req = UCS_PTR_IS_PTR(req) ? req : NULL;
        return true;
    }
    case UCX_PEER_FLUSHING: {
        bool flushed = request_done(&up->flush_req);
        if (!flushed && now < up->force_at_ns)
            return false;
        if (!flushed)
            kvf_log_warn("xfer/ucx: endpoint did not flush within %u ms; closing it by force",
                         p->xfer->cfg.grace_ms);
        /* Forced: the peer may be dead, and a graceful close would wait on
         * it. Outstanding requests end with errors. */
        ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                  .flags = UCP_EP_CLOSE_FLAG_FORCE};
        void *req = ucp_ep_close_nbx(up->ep, &cp);
        if (UCS_PTR_IS_PTR(req))
            up->close_req = req;
        else if (UCS_PTR_STATUS(req) != UCS_OK)
            kvf_log_debug("xfer/ucx: endpoint close: %s", ucs_status_string(UCS_PTR_STATUS(req)));
        up->phase = UCX_PEER_CLOSING;
        return true;
    }
    case UCX_PEER_CLOSING:
        if (!request_done(&up->close_req))
            return false;
        (void)request_done(&up->flush_req); /* ended by the close */
        (void)request_done(&up->probe_req);
        if (up->rkey)
            ucp_rkey_destroy(up->rkey);
        up->phase = UCX_PEER_CLOSED;
        return true;
    case UCX_PEER_CLOSED:
        return false;
    }
    return false;
}

bool kvf_ucx__connected(const kvf_xfer_peer_t *p)
{
    const ucx_peer_t *up = p->be;
    return up->wired;
}

/* The connect probe completed: the endpoint is set up. */
static bool probe_step(kvf_xfer_peer_t *p)
{
    ucx_peer_t *up = p->be;
    if (up->wired || !up->probe_req || ucp_request_check_status(up->probe_req) == UCS_INPROGRESS)
        return false;
    ucs_status_t s = ucp_request_check_status(up->probe_req);
    ucp_request_free(up->probe_req);
    up->probe_req = NULL;
    if (s != UCS_OK) {
        kvf_log_error("xfer/ucx: setting the endpoint up failed: %s", ucs_status_string(s));
        kvf_xfer__peer_fail(p, KVF_ERR_PEER);
        return true;
    }
    up->wired = true;
    kvf_xfer__peer_progressed(p);
    return true;
}

unsigned kvf_ucx__peers_progress(kvf_xfer_t *x)
{
    unsigned n = 0;
    uint64_t now = 0;
    for (kvf_xfer_peer_t *p = x->peers; p; p = p->next) {
        ucx_peer_t *up = p->be;
        if (!up->close_wanted) {
            n += probe_step(p);
            continue;
        }
        if (!now)
            now = kvf_clock_ns();
        n += peer_close_step(p, now);
    }
    return n;
}

bool kvf_ucx__peers_closing(const kvf_xfer_t *x)
{
    for (const kvf_xfer_peer_t *p = x->peers; p; p = p->next) {
        const ucx_peer_t *up = p->be;
        if (up->close_wanted && up->phase != UCX_PEER_CLOSED)
            return true;
    }
    return false;
}

void kvf_ucx__peers_abandon(kvf_xfer_t *x)
{
    for (kvf_xfer_peer_t *p = x->peers; p; p = p->next) {
        ucx_peer_t *up = p->be;
        if (up->phase != UCX_PEER_CLOSED && up->rkey)
            ucp_rkey_destroy(up->rkey);
        up->phase = UCX_PEER_CLOSED;
        up->flush_req = up->close_req = NULL; /* owned by the worker, about to go */
    }
}

bool kvf_ucx__shutdown_done(kvf_xfer_peer_t *p)
{
    ucx_peer_t *up = p->be;
    return up->phase == UCX_PEER_CLOSED && !up->flush_req;
}

void kvf_ucx__peer_free(kvf_xfer_peer_t *p)
{
    free(p->be);
    p->be = NULL;
}
