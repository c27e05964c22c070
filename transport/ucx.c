/* UCX backend of the transfer API: one ucp context and worker per handle,
 * the pool registered once with ucp_mem_map, RMA puts into the peer's pool
 * through its unpacked rkey, an endpoint flush per batch, then the
 * completion message as an active message.
 *
 * Endpoints use peer error handling, so UCX reports a dead peer through
 * ep_error_cb; a peer that is alive but silent is caught by the batch
 * deadline in xfer.c. Either way the endpoint is closed by force, which
 * completes its outstanding requests with errors.
 *
 * UCX must not be re-entered from its own callbacks for teardown, so a
 * failed endpoint is only marked there and closed from ucx_progress. */
#include "xfer_internal.h"

#include "kvf/clock.h"
#include "kvf/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>

#define KVF_UCX_AM_FIN   17u /* active message id of the completion message */
#define KVF_UCX_AM_DATA  18u /* two-sided mode: one slice */
#define KVF_UCX_DATA_HDR 32u /* u64 req_id, epoch, remote offset, length */

typedef struct {
    ucp_context_h context;
    ucp_worker_h worker;
    ucp_mem_h memh;
    ucp_address_t *address;
    size_t address_len;
    void *rkey_buf;
    size_t rkey_len;
    int efd;
    ucs_memory_type_t mem_type;
    bool warned_no_peer_mode;
} ucx_xfer_t;

/* Shutting a connection down: first a flush, so that puts already posted
 * complete (over TCP, UCX 1.13 emulates puts with messages, and a receiver
 * still applying them when the sender's endpoint goes away can fail inside
 * UCX), bounded by the handle's grace period; then a forced close; the
 * rkey goes once nothing can use it. */
typedef enum {
    UCX_PEER_OPEN = 0,
    UCX_PEER_FLUSHING, /* flush_req in progress, until force_at_ns */
    UCX_PEER_CLOSING,  /* close_req in progress */
    UCX_PEER_CLOSED,   /* ep and rkey are gone */
} ucx_peer_phase_t;

typedef struct {
    ucp_ep_h ep;
    ucp_rkey_h rkey;
    ucx_peer_phase_t phase;
    bool close_wanted; /* shut down from the next progress on */
    void *flush_req, *close_req;
    uint64_t force_at_ns;
} ucx_peer_t;

/* The one place UCX status codes become kvferry's. */
static kvf_status_t status_from_ucs(ucs_status_t s)
{
    switch (s) {
    case UCS_OK:
        return KVF_OK;
    case UCS_INPROGRESS:
    case UCS_ERR_NO_RESOURCE:
        return KVF_ERR_AGAIN;
    case UCS_ERR_NO_MEMORY:
        return KVF_ERR_NOMEM;
    case UCS_ERR_INVALID_PARAM:
        return KVF_ERR_INVAL;
    case UCS_ERR_UNSUPPORTED:
        return KVF_ERR_UNSUPPORTED;
    case UCS_ERR_TIMED_OUT:
        return KVF_ERR_TIMEOUT;
    case UCS_ERR_CANCELED:
        return KVF_ERR_CANCELLED;
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
        return KVF_ERR_PEER;
    default:
        return KVF_ERR_TRANSPORT;
    }
}

/* ---- capabilities ------------------------------------------------------- */

/* Whether UCX may carry this process's puts over TCP. UCX 1.13 has no API
 * that names the transports a context will use (ucp_ep_query reports an
 * endpoint's transports only in later releases, and only once an endpoint
 * exists: too late for a receiver, which chooses at creation), so this
 * reads UCX's own setting as UCX does: UCX_TLS is a comma-separated list
 * of transports or aliases ("all" names every one), or after a leading
 * '^' the list of those left out; unset or empty means all. */
static bool tls_may_use_tcp(void)
{
    const char *tls = getenv("UCX_TLS");
    if (!tls || !*tls)
        return true;
    bool excluded = tls[0] == '^';
    bool names_tcp = false;
    char list[256];
    snprintf(list, sizeof(list), "%s", excluded ? tls + 1 : tls);
    char *save = NULL;
    for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save))
        if (!strcmp(t, "tcp") || !strcmp(t, "all"))
            names_tcp = true;
    return excluded ? !names_tcp : names_tcp;
}

static void ucx_caps(const kvf_xfer_config_t *cfg, kvf_xfer_caps_t *caps_p)
{
    (void)cfg;
    *caps_p = (kvf_xfer_caps_t){
        .one_sided = true,
        /* Over TCP, UCX 1.13 emulates puts with messages whose receiver
         * aborts the process when the sender dies mid-put. */
        .one_sided_survives_sender_death = !tls_may_use_tcp(),
        /* Its shared-memory transports, which UCX picks for any peer on the
         * same host unless UCX_TLS leaves them out, do not wake the
         * worker's fd for incoming data or connection set-up; without
         * polling a first handoff waited up to a heartbeat period. 2 ms is
         * the period the decode node measured that with. */
        .fd_wakes_on_data = false,
        .poll_ms = 2,
    };
}

/* ---- receiving completion messages ------------------------------------- */

static ucs_status_t am_fin_cb(void *arg, const void *header, size_t header_length, void *data,
                              size_t length, const ucp_am_recv_param_t *param)
{
    kvf_xfer_t *x = arg;
    (void)header;
    (void)header_length;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        /* Our senders always send eagerly; anything else is refused. */
        if (!x->warned_rndv)
            kvf_log_warn("xfer/ucx: rendezvous completion message refused");
        x->warned_rndv = true;
        kvf_xfer__on_fin(x, NULL, 0);
        return UCS_OK;
    }
    kvf_xfer__on_fin(x, data, length);
    return UCS_OK;
}

/* Two-sided mode: a slice arrives whole (sent eagerly) and is copied into
 * the pool only if a live reservation owns that range; anything else is
 * dropped here and its completion message is rejected later. */
static ucs_status_t am_data_cb(void *arg, const void *header, size_t header_length, void *data,
                               size_t length, const ucp_am_recv_param_t *param)
{
    kvf_xfer_t *x = arg;
    if (header_length != KVF_UCX_DATA_HDR || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        x->stats.slices_dropped++;
        return UCS_OK;
    }
    const uint8_t *h = header;
    uint64_t req_id = xfer_get_u64(h), epoch = xfer_get_u64(h + 8);
    uint64_t off = xfer_get_u64(h + 16), len = xfer_get_u64(h + 24);
    if (len != length || !kvf_xfer__resv_accepts(x, req_id, epoch, off, len)) {
        x->stats.slices_dropped++;
        return UCS_OK;
    }
    memcpy(x->pool + off, data, len);
    return UCS_OK;
}

/* ---- handle -------------------------------------------------------------- */

static kvf_status_t ucx_open(kvf_xfer_t *x)
{
    ucx_xfer_t *u = calloc(1, sizeof(*u));
    if (!u)
        return KVF_ERR_NOMEM;
    u->efd = -1;
    u->mem_type =
        x->cfg.mem_type == KVF_XFER_MEM_CUDA ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
    kvf_status_t st;
    ucp_config_t *config;
    ucs_status_t s = ucp_config_read(NULL, NULL, &config);
    if (s != UCS_OK) {
        kvf_log_error("xfer/ucx: reading the configuration failed: %s", ucs_status_string(s));
        st = status_from_ucs(s);
        goto fail_config;
    }
    ucp_params_t params = {
        .field_mask =
            UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME,
        .features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
        .mt_workers_shared = 0,
        .name = "kvferry",
    };
    s = ucp_init(&params, config, &u->context);
    ucp_config_release(config);
    if (s != UCS_OK) {
        kvf_log_error("xfer/ucx: ucp_init failed: %s", ucs_status_string(s));
        st = status_from_ucs(s);
        goto fail_config;
    }
    ucp_worker_params_t wparams = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SINGLE,
    };
    s = ucp_worker_create(u->context, &wparams, &u->worker);
    if (s != UCS_OK) {
        kvf_log_error("xfer/ucx: worker creation failed: %s", ucs_status_string(s));
        st = status_from_ucs(s);
        goto fail_worker;
    }
    ucp_mem_map_params_t mparams = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS | UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE,
        .address = x->pool,
        .length = x->cfg.pool_bytes,
        .flags = x->pool ? 0 : UCP_MEM_MAP_ALLOCATE,
        .memory_type = u->mem_type,
    };
    s = ucp_mem_map(u->context, &mparams, &u->memh);
    if (s != UCS_OK) {
        kvf_log_error("xfer/ucx: registering the %llu-byte pool failed: %s",
                      (unsigned long long)x->cfg.pool_bytes, ucs_status_string(s));
        st = status_from_ucs(s);
        goto fail_map;
    }
    if (!x->pool) {
        ucp_mem_attr_t attr = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS};
        s = ucp_mem_query(u->memh, &attr);
        if (s != UCS_OK) {
            kvf_log_error("xfer/ucx: querying the pool failed: %s", ucs_status_string(s));
            st = status_from_ucs(s);
            goto fail_query;
        }
        x->pool = attr.address;
    }
    /* A two-sided receiver hands out no rkey: no peer can write into its
     * pool behind its back. */
    s = x->cfg.two_sided ? UCS_OK : ucp_rkey_pack(u->context, u->memh, &u->rkey_buf, &u->rkey_len);
    if (s != UCS_OK) {
        kvf_log_error("xfer/ucx: packing the pool's rkey failed: %s", ucs_status_string(s));
        st = status_from_ucs(s);
        goto fail_query;
    }
    s = ucp_worker_get_address(u->worker, &u->address, &u->address_len);
    if (s != UCS_OK) {
        kvf_log_error("xfer/ucx: getting the worker address failed: %s", ucs_status_string(s));
        st = status_from_ucs(s);
        goto fail_address;
    }
    s = ucp_worker_get_efd(u->worker, &u->efd);
    if (s != UCS_OK) {
        kvf_log_error("xfer/ucx: getting the worker's event fd failed: %s", ucs_status_string(s));
        st = status_from_ucs(s);
        goto fail_efd;
    }
    ucp_am_handler_param_t am = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                      UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .id = KVF_UCX_AM_FIN,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
        .cb = am_fin_cb,
        .arg = x,
    };
    s = ucp_worker_set_am_recv_handler(u->worker, &am);
    if (s == UCS_OK) {
        am.id = KVF_UCX_AM_DATA;
        am.cb = am_data_cb;
        s = ucp_worker_set_am_recv_handler(u->worker, &am);
    }
    if (s != UCS_OK) {
        kvf_log_error("xfer/ucx: setting the message handlers failed: %s", ucs_status_string(s));
        st = status_from_ucs(s);
        goto fail_efd;
    }
    x->be = u;
    return KVF_OK;

fail_efd:
    ucp_worker_release_address(u->worker, u->address);
fail_address:
    if (u->rkey_buf)
        ucp_rkey_buffer_release(u->rkey_buf);
fail_query:
    if (!x->cfg.pool)
        x->pool = NULL;
    ucp_mem_unmap(u->context, u->memh);
fail_map:
    ucp_worker_destroy(u->worker);
fail_worker:
    ucp_cleanup(u->context);
fail_config:
    free(u);
    return st;
}

static void ucx_close(kvf_xfer_t *x)
{
    ucx_xfer_t *u = x->be;
    /* Peers left (xfer.c could not finish their shutdown) lose their rkeys
     * now; the worker's destruction then ends their endpoints and
     * requests. */
    for (kvf_xfer_peer_t *p = x->peers; p; p = p->next) {
        ucx_peer_t *up = p->be;
        if (up->phase != UCX_PEER_CLOSED && up->rkey)
            ucp_rkey_destroy(up->rkey);
        up->phase = UCX_PEER_CLOSED;
        up->flush_req = up->close_req = NULL; /* owned by the worker, about to go */
    }
    ucp_worker_release_address(u->worker, u->address);
    if (u->rkey_buf)
        ucp_rkey_buffer_release(u->rkey_buf);
    ucp_mem_unmap(u->context, u->memh);
    ucp_worker_destroy(u->worker);
    ucp_cleanup(u->context);
    free(u);
    x->be = NULL;
}

/* Body: u32 address length, u32 rkey length, the worker address, the
 * packed rkey. */
static kvf_status_t ucx_export_body(kvf_xfer_t *x, uint8_t **body_p, size_t *len_p)
{
    ucx_xfer_t *u = x->be;
    size_t len = 8 + u->address_len + u->rkey_len;
    uint8_t *b = malloc(len);
    if (!b)
        return KVF_ERR_NOMEM;
    xfer_put_u32(b, (uint32_t)u->address_len);
    xfer_put_u32(b + 4, (uint32_t)u->rkey_len);
    memcpy(b + 8, u->address, u->address_len);
    if (u->rkey_len) /* none in two-sided mode */
        memcpy(b + 8 + u->address_len, u->rkey_buf, u->rkey_len);
    *body_p = b;
    *len_p = len;
    return KVF_OK;
}

/* ---- peers --------------------------------------------------------------- */

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

static kvf_status_t ucx_connect(kvf_xfer_peer_t *p, const uint8_t *body, size_t len)
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
    kvf_status_t st;
    ucp_ep_params_t params = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = (const ucp_address_t *)(body + 8),
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = ep_error_cb, .arg = p},
    };
    if (u->warned_no_peer_mode) /* known to fail: skip the attempt (and UCX's log line) */
        params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    ucs_status_t s = ucp_ep_create(u->worker, &params, &up->ep);
    if (s == UCS_ERR_UNREACHABLE && params.err_mode == UCP_ERR_HANDLING_MODE_PEER) {
        /* UCX 1.13's shared-memory transports have no peer failure
         * support, so a peer-mode endpoint cannot reach a shm-only peer.
         * Without it a dead peer is found by the batch deadline alone
         * (xfer.c), which then closes the endpoint by force. */
        if (!u->warned_no_peer_mode)
            kvf_log_warn("xfer/ucx: transports lack peer failure detection; a dead peer is "
                         "detected by the %u ms batch deadline",
                         p->xfer->cfg.timeout_ms);
        u->warned_no_peer_mode = true;
        params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
        s = ucp_ep_create(u->worker, &params, &up->ep);
    }
    if (s != UCS_OK) {
        kvf_log_error("xfer/ucx: creating the endpoint failed: %s", ucs_status_string(s));
        st = status_from_ucs(s);
        goto fail_ep;
    }
    if (!p->two_sided)
        s = ucp_ep_rkey_unpack(up->ep, body + 8 + al, &up->rkey);
    if (s != UCS_OK) {
        kvf_log_error("xfer/ucx: unpacking the peer's rkey failed: %s", ucs_status_string(s));
        st = status_from_ucs(s);
        goto fail_rkey;
    }
    p->be = up;
    return KVF_OK;

fail_rkey : {
    ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = UCP_EP_CLOSE_FLAG_FORCE};
    void *req = ucp_ep_close_nbx(up->ep, &cp);
    if (UCS_PTR_IS_PTR(req)) {
        while (ucp_request_check_status(req) == UCS_INPROGRESS)
            ucp_worker_progress(u->worker);
        ucp_request_free(req);
    }
}
fail_ep:
    free(up);
    return st;
}

static void ucx_shutdown(kvf_xfer_peer_t *p)
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
        ucp_request_param_t fp = {.op_attr_mask = 0};
        void *req = ucp_ep_flush_nbx(up->ep, &fp);
        up->flush_req = UCS_PTR_IS_PTR(req) ? req : NULL;
        up->phase = UCX_PEER_FLUSHING;
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
        if (up->rkey)
            ucp_rkey_destroy(up->rkey);
        up->phase = UCX_PEER_CLOSED;
        return true;
    case UCX_PEER_CLOSED:
        return false;
    }
    return false;
}

static bool ucx_shutdown_done(kvf_xfer_peer_t *p)
{
    ucx_peer_t *up = p->be;
    return up->phase == UCX_PEER_CLOSED && !up->flush_req;
}

static void ucx_peer_free(kvf_xfer_peer_t *p)
{
    free(p->be);
    p->be = NULL;
}

/* ---- batches ------------------------------------------------------------- */

static void fin_sent_cb(void *request, ucs_status_t status, void *user_data)
{
    kvf_xfer_batch_t *b = user_data;
    b->backend_busy--;
    ucp_request_free(request);
    if (status == UCS_OK)
        kvf_xfer__batch_end(b, KVF_OK);
    else
        kvf_xfer__peer_fail(b->peer, KVF_ERR_PEER);
}

static void fin_send(kvf_xfer_batch_t *b)
{
    ucx_peer_t *up = b->peer->be;
    ucp_request_param_t param = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .cb.send = fin_sent_cb,
        .user_data = b,
        .flags = UCP_AM_SEND_FLAG_EAGER,
    };
    void *req = ucp_am_send_nbx(up->ep, KVF_UCX_AM_FIN, NULL, 0, b->fin, b->fin_len, &param);
    if (req == NULL) {
        kvf_xfer__batch_end(b, KVF_OK);
    } else if (UCS_PTR_IS_ERR(req)) {
        kvf_log_error("xfer/ucx: sending the completion message failed: %s",
                      ucs_status_string(UCS_PTR_STATUS(req)));
        kvf_xfer__peer_fail(b->peer, KVF_ERR_PEER);
    } else {
        b->backend_busy++;
    }
}

static void flush_cb(void *request, ucs_status_t status, void *user_data)
{
    kvf_xfer_batch_t *b = user_data;
    b->backend_busy--;
    ucp_request_free(request);
    if (b->status != KVF_ERR_AGAIN)
        return;
    if (status != UCS_OK) {
        kvf_xfer__peer_fail(b->peer, KVF_ERR_PEER);
        return;
    }
    fin_send(b);
}

/* Two-sided batches: the slices' message headers (they must live until
 * each send completes) and how many sends are still out. */
typedef struct {
    uint8_t *headers; /* (n_ranges, KVF_UCX_DATA_HDR) */
    size_t pending;
} ucx_batch_t;

static void data_sent_cb(void *request, ucs_status_t status, void *user_data)
{
    kvf_xfer_batch_t *b = user_data;
    ucx_batch_t *ub = b->be;
    b->backend_busy--;
    ucp_request_free(request);
    if (status != UCS_OK) {
        kvf_xfer__peer_fail(b->peer, KVF_ERR_PEER);
        return;
    }
    /* The completion follows the slices on the same endpoint, so the
     * receiver handles it after them. */
    if (--ub->pending == 0 && b->status == KVF_ERR_AGAIN)
        fin_send(b);
}

static kvf_status_t post_two_sided(kvf_xfer_batch_t *b)
{
    kvf_xfer_peer_t *p = b->peer;
    ucx_peer_t *up = p->be;
    ucx_batch_t *ub = calloc(1, sizeof(*ub));
    if (!ub)
        return KVF_ERR_NOMEM;
    ub->headers = malloc(b->n_ranges ? b->n_ranges * KVF_UCX_DATA_HDR : 1);
    if (!ub->headers) {
        free(ub);
        return KVF_ERR_NOMEM;
    }
    b->be = ub;
    const uint8_t *pool = p->xfer->pool;
    for (size_t i = 0; i < b->n_ranges; i++) {
        const kvf_xfer_slice_t *s = &b->ranges[i];
        uint8_t *h = ub->headers + i * KVF_UCX_DATA_HDR;
        xfer_put_u64(h, b->req_id);
        xfer_put_u64(h + 8, b->epoch);
        xfer_put_u64(h + 16, s->remote_off);
        xfer_put_u64(h + 24, s->len);
        /* Eager only: a rendezvous would have the receiver answer the
         * sender, the exchange two-sided mode exists to avoid. */
        ucp_request_param_t param = {
            .op_attr_mask =
                UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
            .cb.send = data_sent_cb,
            .user_data = b,
            .flags = UCP_AM_SEND_FLAG_EAGER,
        };
        void *req = ucp_am_send_nbx(up->ep, KVF_UCX_AM_DATA, h, KVF_UCX_DATA_HDR,
                                    pool + s->local_off, s->len, &param);
        if (UCS_PTR_IS_ERR(req)) {
            kvf_log_error("xfer/ucx: sending a %llu-byte slice failed: %s",
                          (unsigned long long)s->len, ucs_status_string(UCS_PTR_STATUS(req)));
            kvf_xfer__peer_fail(p, KVF_ERR_PEER);
            return p->status;
        }
        if (req) {
            b->backend_busy++;
            ub->pending++;
        }
    }
    if (!ub->pending)
        fin_send(b);
    return KVF_OK;
}

static void ucx_batch_free(kvf_xfer_batch_t *b)
{
    ucx_batch_t *ub = b->be;
    if (ub) {
        free(ub->headers);
        free(ub);
    }
    b->be = NULL;
}

static kvf_status_t ucx_post(kvf_xfer_batch_t *b)
{
    kvf_xfer_peer_t *p = b->peer;
    if (p->two_sided)
        return post_two_sided(b);
    ucx_peer_t *up = p->be;
    ucx_xfer_t *u = p->xfer->be;
    const uint8_t *pool = p->xfer->pool;
    ucp_request_param_t put = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE,
        .memory_type = u->mem_type,
    };
    for (size_t i = 0; i < b->n_ranges; i++) {
        const kvf_xfer_slice_t *s = &b->ranges[i];
        void *req = ucp_put_nbx(up->ep, pool + s->local_off, s->len, p->remote_base + s->remote_off,
                                up->rkey, &put);
        if (UCS_PTR_IS_ERR(req)) {
            kvf_log_error("xfer/ucx: put of %llu bytes failed: %s", (unsigned long long)s->len,
                          ucs_status_string(UCS_PTR_STATUS(req)));
            kvf_xfer__peer_fail(p, KVF_ERR_PEER);
            return p->status;
        }
        if (req)
            ucp_request_free(req); /* released by UCX when it completes */
    }
    /* The flush completes once every put issued on the endpoint so far is
     * complete in the peer's memory; only then may the completion go. */
    ucp_request_param_t fl = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = flush_cb,
        .user_data = b,
    };
    void *req = ucp_ep_flush_nbx(up->ep, &fl);
    if (req == NULL) {
        fin_send(b);
    } else if (UCS_PTR_IS_ERR(req)) {
        kvf_log_error("xfer/ucx: flush failed: %s", ucs_status_string(UCS_PTR_STATUS(req)));
        kvf_xfer__peer_fail(p, KVF_ERR_PEER);
        return p->status;
    } else {
        b->backend_busy++;
    }
    return KVF_OK;
}

/* ---- event loop ---------------------------------------------------------- */

static unsigned ucx_progress(kvf_xfer_t *x)
{
    ucx_xfer_t *u = x->be;
    unsigned n = ucp_worker_progress(u->worker);
    uint64_t now = 0;
    for (kvf_xfer_peer_t *p = x->peers; p; p = p->next) {
        ucx_peer_t *up = p->be;
        if (!up->close_wanted)
            continue;
        if (!now)
            now = kvf_clock_ns();
        n += peer_close_step(p, now);
    }
    return n;
}

static int ucx_fd(const kvf_xfer_t *x)
{
    const ucx_xfer_t *u = x->be;
    return u->efd;
}

static kvf_status_t ucx_arm(kvf_xfer_t *x)
{
    ucx_xfer_t *u = x->be;
    /* A shutdown in progress is polled, not signalled: no sleeping. */
    for (kvf_xfer_peer_t *p = x->peers; p; p = p->next) {
        ucx_peer_t *up = p->be;
        if (up->close_wanted && up->phase != UCX_PEER_CLOSED)
            return KVF_ERR_AGAIN;
    }
    ucs_status_t s = ucp_worker_arm(u->worker);
    if (s == UCS_ERR_BUSY)
        return KVF_ERR_AGAIN;
    return status_from_ucs(s);
}

const kvf_xfer_ops_t kvf_xfer_ucx_ops = {
    .name = "ucx",
    .caps = ucx_caps,
    .open = ucx_open,
    .close = ucx_close,
    .export_body = ucx_export_body,
    .connect = ucx_connect,
    .shutdown = ucx_shutdown,
    .shutdown_done = ucx_shutdown_done,
    .peer_free = ucx_peer_free,
    .post = ucx_post,
    .batch_free = ucx_batch_free,
    .progress = ucx_progress,
    .fd = ucx_fd,
    .arm = ucx_arm,
};
