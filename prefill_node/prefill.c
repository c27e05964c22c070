/* kvf-prefill's event loop and the node's lifetime: create, run, destroy.
 * See prefill.h for the request lifecycle, prefill_internal.h for the
 * files that hold its parts. */
#include "prefill_internal.h"

#include "kvf/backend.h"
#include "kvf/clock.h"
#include "kvf/log.h"
#include "kvf/model.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>

/* ---- load, loop ------------------------------------------------------- */

static void fill_load(void *arg, Kvf__Load *load)
{
    kvf_prefill_t *p = arg;
    load->blocks_free = kvf_kvpool_free_blocks(p->rt.pool);
    load->blocks_used = kvf_kvpool_used_blocks(p->rt.pool);
    load->blocks_total = kvf_kvpool_num_blocks(p->rt.pool);
    uint32_t queued = 0, running = 0;
    uint64_t tokens = 0;
    for (const pf_req_t *r = p->head; r; r = r->next) {
        if (pf_req_computing(r)) {
            queued++;
            tokens += r->n_prompt - r->done;
        } else if (r->state == REQ_SHIPPING) {
            running++;
        }
    }
    load->queued_requests = queued;
    load->queued_tokens = tokens;
    load->running = running;
}

/* How long the loop may sleep: the next heartbeat, transfer deadline,
 * KvAlloc retry or deadline. */
static int loop_timeout_ms(kvf_prefill_t *p)
{
    int ms = kvf_node_timeout_ms(p->node);
    int x = kvf_xfer_timeout_ms(p->xfer);
    if (x >= 0 && x < ms)
        ms = x;
    bool batches = false;
    for (const pf_req_t *r = p->head; r; r = r->next) {
        uint64_t at = 0;
        if (r->state == REQ_WAIT_ALLOC || r->state == REQ_CANCELLED)
            at = pf_alloc_deadline_ns(r);
        if (at) {
            int left = kvf_clock_ms_until(at);
            if (left < ms)
                ms = left;
        }
        if (r->n_batches)
            batches = true;
    }
    /* Without a transport fd, batches are driven on a short timer; with
     * one, a short cap still bounds the handoff's latency should a
     * completion not wake the fd (kvf_xfer_wait caps its sleeps the same
     * way). */
    if (batches && ms > (kvf_xfer_fd(p->xfer) < 0 ? 1 : 10))
        ms = kvf_xfer_fd(p->xfer) < 0 ? 1 : 10;
    return ms < 0 ? 0 : ms;
}

static void wait_for_work(kvf_prefill_t *p)
{
    struct pollfd fds[2];
    int nfds = 0;
    fds[nfds++] = (struct pollfd){.fd = kvf_inbox_fd(kvf_node_inbox(p->node)), .events = POLLIN};
    int xfd = kvf_xfer_fd(p->xfer);
    if (xfd >= 0) {
        if (kvf_xfer_arm(p->xfer) == KVF_ERR_AGAIN)
            return;
        fds[nfds++] = (struct pollfd){.fd = xfd, .events = POLLIN};
    }
    int ms = loop_timeout_ms(p);
    if (poll(fds, (nfds_t)nfds, ms) < 0 && errno != EINTR)
        kvf_log_warn("poll: %s", strerror(errno));
}

/* Receives everything waiting in the inbox. */
static void drain_inbox(kvf_prefill_t *p)
{
    kvf_inbox_t *inbox = kvf_node_inbox(p->node);
    for (int i = 0; i < 256; i++) {
        kvf_envelope_t *env = NULL;
        kvf_status_t st = kvf_inbox_recv(inbox, 0, &env);
        if (st == KVF_ERR_AGAIN || st == KVF_ERR_TIMEOUT)
            return;
        if (st != KVF_OK) {
            /* Already logged and dropped by the inbox; keep serving. */
            p->count.malformed_dropped++;
            continue;
        }
        pf_handle_envelope(p, env);
    }
}

static void stop_all(kvf_prefill_t *p)
{
    pf_req_t *next;
    for (pf_req_t *r = p->head; r; r = next) {
        next = r->next;
        if (r->state == REQ_ABORTING)
            continue;
        if (r->state != REQ_CANCELLED)
            pf_send_error(p, r->req_id, r->epoch, KVF_ERR_CLOSED, "prefill node stopping");
        if (r->state == REQ_WAIT_ALLOC || r->state == REQ_CANCELLED)
            pf_req_destroy(p, r); /* D's lease frees whatever it reserved */
        else
            pf_req_abort(p, r);
    }
    uint64_t until = kvf_clock_ns() + PF_STOP_DRAIN_MS * 1000000ull;
    while (p->head && kvf_clock_ns() < until) {
        kvf_xfer_progress(p->xfer);
        pf_service_requests(p);
        if (p->head)
            kvf_clock_sleep_ms(1);
    }
    if (p->head)
        kvf_log_warn("stopping with transfers still running");
}

kvf_status_t kvf_prefill_run(kvf_prefill_t *p, volatile sig_atomic_t *stop)
{
    kvf_status_t result = KVF_OK;
    char be_desc[128];
    kvf_backend_describe(&p->rt.backend, be_desc, sizeof(be_desc));
    kvf_log_info("serving on %s (router %s): %u kv blocks of %d tokens, %d tokens per forward, "
                 "backend %s",
                 p->cfg.listen_url, p->cfg.router_url, kvf_kvpool_num_blocks(p->rt.pool),
                 p->geo.block_size, p->cfg.max_batch_tokens, be_desc);
    uint64_t drain_deadline = 0;
    while (*stop != KVF_PREFILL_STOP) {
        if (*stop == KVF_PREFILL_DRAIN && !p->draining) {
            p->draining = true;
            kvf_node_set_draining(p->node, true);
            drain_deadline = kvf_clock_ns() + (uint64_t)PF_DRAIN_TIMEOUT_MS * 1000000ull;
            kvf_log_info("draining: completing the requests held, taking no new ones");
        }
        if (p->draining && (!p->head || kvf_clock_ns() > drain_deadline)) {
            if (p->head)
                kvf_log_warn("drain timed out with requests still held");
            break;
        }
        kvf_status_t st = kvf_node_tick(p->node);
        if (st != KVF_OK) {
            result = st;
            break;
        }
        drain_inbox(p);
        kvf_xfer_progress(p->xfer);
        pf_service_requests(p);
        if (pf_forward_step(p))
            continue;
        wait_for_work(p);
    }
    stop_all(p);
    if (result == KVF_OK)
        (void)kvf_node_deregister(p->node, "stopped");
    const pf_counters_t *c = &p->count;
    kvf_log_info("stopped: %llu requests, %llu completed, %llu failed, %llu cancelled, %llu "
                 "refused; dropped %llu stale, %llu malformed, %llu unexpected",
                 (unsigned long long)c->requests, (unsigned long long)c->completed,
                 (unsigned long long)c->failed, (unsigned long long)c->cancelled,
                 (unsigned long long)c->refused, (unsigned long long)c->stale_dropped,
                 (unsigned long long)c->malformed_dropped,
                 (unsigned long long)c->unexpected_dropped);
    return result;
}

/* ---- create / destroy ------------------------------------------------- */

static bool config_valid(const kvf_prefill_config_t *cfg)
{
    return cfg->router_url && cfg->listen_url && cfg->model_dir && cfg->max_batch_tokens >= 1 &&
           cfg->block_size >= 1 && cfg->block_size <= KVF_KV_BLOCK_SIZE_MAX &&
           cfg->alloc_timeout_ms >= 1;
}

/* Loads the model into backend, pool and engine (K/V mirrored in host
 * memory: the transport ships from there). */
static kvf_status_t create_engine(kvf_prefill_t *p, const kvf_prefill_config_t *cfg)
{
    kvf_engine_stack_config_t sc = {
        .threads = cfg->threads,
        .block_size = cfg->block_size,
        .budget_bytes = cfg->kv_mem,
    };
    sc.kv_host_mirror = true;
    kvf_status_t st = kvf_backend_flags_apply(&cfg->backend, &sc);
    if (st != KVF_OK)
        return st;
    st = kvf_engine_stack_init(&p->rt, cfg->model_dir, &sc);
    if (st != KVF_OK)
        return st;
    p->geo = *kvf_kvpool_geometry(p->rt.pool);
    return KVF_OK;
}

/* The transfer handle over the local pool. */
static kvf_status_t create_xfer(kvf_prefill_t *p, const kvf_prefill_config_t *cfg)
{
    kvf_xfer_config_t xc = {
        .backend = KVF_XFER_UCX,
        .mem_type = KVF_XFER_MEM_HOST,
        .pool = kvf_kvpool_base(p->rt.pool),
        .pool_bytes = kvf_kvpool_bytes(p->rt.pool),
        .geometry = kvf_xfer_geometry_of_pool(&p->geo),
        .checksum = cfg->checksum,
    };
    kvf_status_t st = kvf_xfer_create(&xc, &p->xfer);
    if (st != KVF_OK)
        kvf_log_error("transfer handle: %s", kvf_status_str(st));
    return st;
}

/* The node runtime: binds the inbox, registers with the router. */
static kvf_status_t create_node(kvf_prefill_t *p, const kvf_prefill_config_t *cfg)
{
    kvf_node_config_t nc = {
        .role = KVF__ROLE__ROLE_PREFILL,
        .node_id = cfg->node_id,
        .router_url = cfg->router_url,
        .listen_url = cfg->listen_url,
        .model_fingerprint = kvf_model_fingerprint(p->rt.model),
        .geometry = kvf_node_wire_geometry(&p->geo),
        .capacity_blocks = kvf_kvpool_num_blocks(p->rt.pool),
        .max_context = (uint32_t)p->rt.model->cfg.max_pos,
        .fill_load = fill_load,
        .load_arg = p,
    };
    kvf_status_t st = kvf_node_create(&nc, &p->node);
    if (st != KVF_OK) {
        kvf_log_error("node on %s: %s", cfg->listen_url, kvf_status_str(st));
        return st;
    }
    kvf_log_set_node(kvf_node_id(p->node));
    return KVF_OK;
}

kvf_status_t kvf_prefill_create(const kvf_prefill_config_t *cfg, kvf_prefill_t **prefill_p)
{
    if (!config_valid(cfg))
        return KVF_ERR_INVAL;
    kvf_prefill_t *p = calloc(1, sizeof(*p));
    if (!p)
        return KVF_ERR_NOMEM;
    p->cfg = *cfg;
    p->cfg.node_id = p->cfg.model_dir = NULL; /* used during create only */
    kvf_status_t st = KVF_ERR_NOMEM;
    p->router_url = strdup(cfg->router_url);
    p->listen_url = strdup(cfg->listen_url);
    if (!p->router_url || !p->listen_url)
        goto fail_model;
    p->cfg.router_url = p->router_url;
    p->cfg.listen_url = p->listen_url;
    st = create_engine(p, cfg);
    if (st != KVF_OK)
        goto fail_model;
    st = create_xfer(p, cfg);
    if (st != KVF_OK)
        goto fail_xfer;
    st = create_node(p, cfg);
    if (st != KVF_OK)
        goto fail_node;
    *prefill_p = p;
    return KVF_OK;

fail_node:
    kvf_xfer_destroy(p->xfer);
fail_xfer:
    kvf_engine_stack_fini(&p->rt);
fail_model:
    free(p->listen_url);
    free(p->router_url);
    free(p);
    return st;
}

void kvf_prefill_destroy(kvf_prefill_t *p)
{
    if (!p)
        return;
    /* Batches first (released: the transport drives them to their end),
     * then the transport (it reads the pool), then the pool. */
    for (pf_req_t *r = p->head; r; r = r->next)
        pf_req_release_batches(r);
    kvf_xfer_destroy(p->xfer);
    p->xfer = NULL;
    pf_peers_free(p);
    while (p->head) {
        pf_req_t *r = p->head;
        r->peer = NULL;
        pf_req_destroy(p, r);
    }
    kvf_node_destroy(p->node);
    kvf_engine_stack_fini(&p->rt);
    pf_forward_fini(&p->fwd);
    free(p->listen_url);
    free(p->router_url);
    free(p);
}
