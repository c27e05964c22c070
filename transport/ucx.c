/* UCX backend of the transfer API: one ucp context and worker per handle,
 * the pool registered once with ucp_mem_map, RMA puts into the peer's pool
 * through its unpacked rkey, an endpoint flush per batch, then the
 * completion message as an active message.
 *
 * Endpoints use peer error handling, so UCX reports a dead peer through
 * ep_error_cb; a peer that is alive but silent is caught by the batch
 * deadline in xfer_batch.c. Either way the endpoint is closed by force,
 * which completes its outstanding requests with errors.
 *
 * UCX must not be re-entered from its own callbacks for teardown, so a
 * failed endpoint is only marked there and closed from ucx_progress.
 *
 * This file: the handle, its capabilities, incoming messages and the event
 * loop; ucx_peer.c the endpoints, ucx_batch.c the batches. */
#include "ucx_internal.h"

#include "kvf/clock.h"
#include "kvf/log.h"

#include <errno.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The one place UCX status codes become kvferry's. */
kvf_status_t kvf_ucx__status(ucs_status_t s)
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

/* ---- capabilities -------------------------------------------------------- */

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

/* Reads UCX's configuration (its environment) and creates the context. */
static kvf_status_t context_open(ucx_xfer_t *u)
{
    ucp_config_t *config;
    ucs_status_t s = ucp_config_read(NULL, NULL, &config);
    if (s != UCS_OK) {
        kvf_log_error("xfer/ucx: reading the configuration failed: %s", ucs_status_string(s));
        return kvf_ucx__status(s);
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
        return kvf_ucx__status(s);
    }
    return KVF_OK;
}

static kvf_status_t worker_create(ucx_xfer_t *u)
{
    ucp_worker_params_t wparams = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SINGLE,
    };
    ucs_status_t s = ucp_worker_create(u->context, &wparams, &u->worker);
    if (s != UCS_OK) {
        kvf_log_error("xfer/ucx: worker creation failed: %s", ucs_status_string(s));
        return kvf_ucx__status(s);
    }
    return KVF_OK;
}

/* Undoes pool_register: the rkey, the backend-allocated pool's address,
 * the registration (which frees a pool UCX allocated). */
static void pool_deregister(kvf_xfer_t *x, ucx_xfer_t *u)
{
    if (u->rkey_buf)
        ucp_rkey_buffer_release(u->rkey_buf);
    u->rkey_buf = NULL;
    if (!x->cfg.pool)
        x->pool = NULL;
    ucp_mem_unmap(u->context, u->memh);
}

/* Registers the pool, allocating it when the configuration has none (then
 * into memory the peer can map directly), and packs its rkey. */
static kvf_status_t pool_register(kvf_xfer_t *x, ucx_xfer_t *u)
{
    ucp_mem_map_params_t mparams = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS | UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE,
        .address = x->pool,
        .length = x->cfg.pool_bytes,
        .flags = x->pool ? 0 : UCP_MEM_MAP_ALLOCATE,
        .memory_type = u->mem_type,
    };
    ucs_status_t s = ucp_mem_map(u->context, &mparams, &u->memh);
    if (s != UCS_OK) {
        kvf_log_error("xfer/ucx: registering the %llu-byte pool failed: %s",
                      (unsigned long long)x->cfg.pool_bytes, ucs_status_string(s));
        return kvf_ucx__status(s);
    }
    if (!x->pool) {
        ucp_mem_attr_t attr = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS};
        s = ucp_mem_query(u->memh, &attr);
        if (s != UCS_OK) {
            kvf_log_error("xfer/ucx: querying the pool failed: %s", ucs_status_string(s));
            pool_deregister(x, u);
            return kvf_ucx__status(s);
        }
        x->pool = attr.address;
    }
    /* A two-sided receiver hands out no rkey: no peer can write into its
     * pool behind its back. */
    s = x->cfg.two_sided ? UCS_OK : ucp_rkey_pack(u->context, u->memh, &u->rkey_buf, &u->rkey_len);
    if (s != UCS_OK) {
        kvf_log_error("xfer/ucx: packing the pool's rkey failed: %s", ucs_status_string(s));
        pool_deregister(x, u);
        return kvf_ucx__status(s);
    }
    return KVF_OK;
}

/* Makes the worker reachable: its address (for the descriptor), its event
 * fd, and the handlers of the messages peers send it. */
static kvf_status_t worker_listen(kvf_xfer_t *x, ucx_xfer_t *u)
{
    ucs_status_t s = ucp_worker_get_address(u->worker, &u->address, &u->address_len);
    if (s != UCS_OK) {
        kvf_log_error("xfer/ucx: getting the worker address failed: %s", ucs_status_string(s));
        return kvf_ucx__status(s);
    }
    s = ucp_worker_get_efd(u->worker, &u->efd);
    if (s != UCS_OK) {
        kvf_log_error("xfer/ucx: getting the worker's event fd failed: %s", ucs_status_string(s));
        goto fail_listen;
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
        goto fail_listen;
    }
    return KVF_OK;

fail_listen:
    ucp_worker_release_address(u->worker, u->address);
    return kvf_ucx__status(s);
}

/* Adds (add) or removes a worker's event fd to the handle's epoll set. */
static kvf_status_t epoll_member(ucx_xfer_t *u, int efd, bool add)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = efd};
    if (epoll_ctl(u->epfd, add ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, efd, &ev) == 0)
        return KVF_OK;
    kvf_log_error("xfer/ucx: %s a worker's event fd %s the epoll set failed: %s",
                  add ? "adding" : "removing", add ? "to" : "from", strerror(errno));
    return KVF_ERR_IO;
}

/* Ends retired worker i (the last one takes its slot). */
static void retired_destroy(kvf_xfer_t *x, ucx_xfer_t *u, int i)
{
    ucx_retired_t *w = &u->retired[i];
    (void)epoll_member(u, w->efd, false);
    ucp_worker_release_address(w->worker, w->address);
    ucp_worker_destroy(w->worker);
    u->retired[i] = u->retired[--u->n_retired];
    x->stats.listeners_retired = (uint64_t)u->n_retired;
}

/* Progresses the retired workers; one that delivered nothing for
 * retire_ns goes (a queue a dead sender blocked never delivers again). */
static unsigned retired_progress(kvf_xfer_t *x, ucx_xfer_t *u)
{
    if (!u->n_retired)
        return 0;
    unsigned total = 0;
    uint64_t now = kvf_clock_ns();
    for (int i = 0; i < u->n_retired;) {
        unsigned n = ucp_worker_progress(u->retired[i].worker);
        total += n;
        if (n)
            u->retired[i].idle_since_ns = now;
        if (now - u->retired[i].idle_since_ns >= u->retire_ns) {
            kvf_log_info("xfer/ucx: a retired listening worker delivered nothing for %llu ms; "
                         "closed",
                         (unsigned long long)(u->retire_ns / 1000000ull));
            retired_destroy(x, u, i);
            continue;
        }
        i++;
    }
    return total;
}

static kvf_status_t ucx_relisten(kvf_xfer_t *x, uint64_t retire_ns)
{
    ucx_xfer_t *u = x->be;
    if (u->n_retired == UCX_RETIRED_MAX) {
        /* room for one more: the one idle longest goes */
        int idlest = 0;
        for (int i = 1; i < u->n_retired; i++)
            if (u->retired[i].idle_since_ns < u->retired[idlest].idle_since_ns)
                idlest = i;
        retired_destroy(x, u, idlest);
    }
    ucx_retired_t old = {
        .worker = u->worker, .address = u->address, .efd = u->efd, .idle_since_ns = kvf_clock_ns()};
    kvf_status_t st = worker_create(u);
    if (st != KVF_OK) {
        u->worker = old.worker;
        return st;
    }
    st = worker_listen(x, u);
    if (st == KVF_OK) {
        st = epoll_member(u, u->efd, true);
        if (st != KVF_OK)
            ucp_worker_release_address(u->worker, u->address);
    }
    if (st != KVF_OK) {
        ucp_worker_destroy(u->worker);
        u->worker = old.worker;
        u->address = old.address;
        u->efd = old.efd;
        return st;
    }
    u->retired[u->n_retired++] = old;
    x->stats.listeners_retired = (uint64_t)u->n_retired;
    if (retire_ns > u->retire_ns)
        u->retire_ns = retire_ns;
    return KVF_OK;
}

static kvf_status_t ucx_open(kvf_xfer_t *x)
{
    ucx_xfer_t *u = calloc(1, sizeof(*u));
    if (!u)
        return KVF_ERR_NOMEM;
    u->efd = -1;
    u->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (u->epfd < 0) {
        kvf_log_error("xfer/ucx: epoll_create1 failed: %s", strerror(errno));
        free(u);
        return KVF_ERR_IO;
    }
    u->mem_type =
        x->cfg.mem_type == KVF_XFER_MEM_CUDA ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
    kvf_status_t st = context_open(u);
    if (st != KVF_OK)
        goto fail_context;
    st = worker_create(u);
    if (st != KVF_OK)
        goto fail_worker;
    st = pool_register(x, u);
    if (st != KVF_OK)
        goto fail_pool;
    st = worker_listen(x, u);
    if (st != KVF_OK)
        goto fail_listen;
    st = epoll_member(u, u->efd, true);
    if (st != KVF_OK)
        goto fail_epoll;
    x->be = u;
    return KVF_OK;

fail_epoll:
    ucp_worker_release_address(u->worker, u->address);
fail_listen:
    pool_deregister(x, u);
fail_pool:
    ucp_worker_destroy(u->worker);
fail_worker:
    ucp_cleanup(u->context);
fail_context:
    close(u->epfd);
    free(u);
    return st;
}

static void ucx_close(kvf_xfer_t *x)
{
    ucx_xfer_t *u = x->be;
    /* Peers left (xfer.c could not finish their shutdown) lose their rkeys
     * now; the worker's destruction then ends their endpoints and
     * requests. */
    kvf_ucx__peers_abandon(x);
    while (u->n_retired)
        retired_destroy(x, u, u->n_retired - 1);
    ucp_worker_release_address(u->worker, u->address);
    pool_deregister(x, u);
    ucp_worker_destroy(u->worker);
    ucp_cleanup(u->context);
    close(u->epfd);
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

/* ---- event loop ---------------------------------------------------------- */

static unsigned ucx_progress(kvf_xfer_t *x)
{
    ucx_xfer_t *u = x->be;
    unsigned n = ucp_worker_progress(u->worker);
    n += retired_progress(x, u);
    return n + kvf_ucx__peers_progress(x);
}

static int ucx_fd(const kvf_xfer_t *x)
{
    const ucx_xfer_t *u = x->be;
    return u->epfd;
}

static kvf_status_t ucx_arm(kvf_xfer_t *x)
{
    ucx_xfer_t *u = x->be;
    /* A shutdown in progress is polled, not signalled: no sleeping. */
    if (kvf_ucx__peers_closing(x))
        return KVF_ERR_AGAIN;
    ucs_status_t s = ucp_worker_arm(u->worker);
    for (int i = 0; s == UCS_OK && i < u->n_retired; i++)
        s = ucp_worker_arm(u->retired[i].worker);
    if (s == UCS_ERR_BUSY)
        return KVF_ERR_AGAIN;
    return kvf_ucx__status(s);
}

const kvf_xfer_ops_t kvf_xfer_ucx_ops = {
    .name = "ucx",
    .caps = ucx_caps,
    .open = ucx_open,
    .close = ucx_close,
    .export_body = ucx_export_body,
    .connect = kvf_ucx__connect,
    .shutdown = kvf_ucx__shutdown,
    .shutdown_done = kvf_ucx__shutdown_done,
    .peer_free = kvf_ucx__peer_free,
    .connected = kvf_ucx__connected,
    .post = kvf_ucx__post,
    .get = kvf_ucx__get,
    .batch_free = kvf_ucx__batch_free,
    .progress = ucx_progress,
    .fd = ucx_fd,
    .arm = ucx_arm,
    .relisten = ucx_relisten,
};
