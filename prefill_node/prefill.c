/* kvf-prefill's event loop and the node's lifetime: create, run, destroy.
 * See prefill.h for the request lifecycle, prefill_internal.h for the
 * files that hold its parts. */
#include "prefill_internal.h"

#include "kvf/auth.h"
#include "kvf/backend.h"
#include "kvf/clock.h"
#include "kvf/log.h"
#include "kvf/signals.h"
#include "kvf/model.h"

#include <stdlib.h>
#include <string.h>

/* ---- the load report ------------------------------------------------- */

static void fill_load(void *arg, Kvf__Load *load)
{
    kvf_prefill_t *p = arg;
    /* Cached blocks nobody uses count as free: any request may have them. */
    const uint32_t total = kvf_kvpool_num_blocks(p->rt.pool), avail = pf_blocks_available(p);
    load->blocks_free = avail;
    load->blocks_used = total - avail;
    load->blocks_total = total;
    load->blocks_cached = avail - kvf_kvpool_free_blocks(p->rt.pool);
    kvf_node_tiers_load(&p->nt, load);
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

/* What the heartbeats name: every attempt still moving, and the lease of
 * every reservation it may still write into. */
static void fill_work(void *arg, kvf_node_snapshot_t *snap)
{
    kvf_prefill_t *p = arg;
    for (const pf_req_t *r = p->head; r; r = r->next) {
        if (!pf_req_computing(r) && r->state != REQ_SHIPPING)
            continue;
        (void)kvf_node_snapshot_work(snap, r->req_id, r->epoch, r->done);
        if (r->reserved && (r->state == REQ_READY || r->state == REQ_SHIPPING))
            (void)kvf_node_snapshot_lease(snap, r->pr->decode_inbox, r->req_id, r->epoch);
    }
}

/* ---- the loop's inputs: the inbox, timers ----------------------------- */

/* The inbox polls readable: receives everything waiting in it. Called
 * from the loop's wait before it fires due timers, so a KvAllocReply that
 * came in during a long forward is taken before its deadline is judged. */
static void on_inbox_ready(int fd, void *arg)
{
    (void)fd;
    kvf_prefill_t *p = arg;
    kvf_inbox_t *inbox = kvf_node_inbox(p->node);
    pf_stash_handle(p); /* older than what waits in the inbox */
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

static void on_node_timer(kvf_timer_t *timer, void *arg)
{
    (void)timer;
    kvf_prefill_t *p = arg;
    kvf_status_t st = kvf_node_tick(p->node);
    if (st != KVF_OK)
        p->node_status = st; /* the router's final refusal: the loop ends */
}

/* The transport's deadline, or the poll period of a transport whose fd may
 * not wake for its traffic: progress it (the loop then looks at what
 * ended). */
static void on_xfer_timer(kvf_timer_t *timer, void *arg)
{
    (void)timer;
    kvf_prefill_t *p = arg;
    kvf_xfer_progress(p->xfer);
}

/* Logs the counters, and the control plane's refusals, when they changed
 * since the last line (force: in any case), with what the line is. */
static void log_stats(kvf_prefill_t *p, const char *what, bool force)
{
    const pf_counters_t *c = &p->count;
    kvf_auth_counters_t auth;
    kvf_auth_counters(&auth);
    uint64_t refused = kvf_node_refused(p->node);
    if (!force && !memcmp(c, &p->logged, sizeof(*c)) &&
        !memcmp(&auth, &p->logged_auth, sizeof(auth)) && refused == p->logged_refused)
        return;
    p->logged = *c;
    p->logged_auth = auth;
    p->logged_refused = refused;
    char auth_text[256], tiers[256];
    kvf_node_control_format(p->node, auth_text, sizeof(auth_text));
    kvf_node_tiers_describe(&p->nt, tiers, sizeof(tiers));
    kvf_prefix_cache_stats_t pc = {0};
    if (p->pc.cache)
        kvf_prefix_cache_stats(p->pc.cache, &pc);
    kvf_log_info("%s: %llu requests, %llu completed, %llu failed, %llu cancelled, %llu "
                 "refused; dropped %llu stale, %llu malformed, %llu unexpected | prefix cache "
                 "%s: %llu of %llu prompt tokens hit, %u blocks cached | pulled %llu tokens "
                 "(%llu bytes), %llu pulls failed | %s | %s",
                 what, (unsigned long long)c->requests, (unsigned long long)c->completed,
                 (unsigned long long)c->failed, (unsigned long long)c->cancelled,
                 (unsigned long long)c->refused, (unsigned long long)c->stale_dropped,
                 (unsigned long long)c->malformed_dropped,
                 (unsigned long long)c->unexpected_dropped, p->pc.cache ? "on" : "off",
                 (unsigned long long)c->prefix_hit_tokens, (unsigned long long)c->prompt_tokens,
                 pc.cached, (unsigned long long)c->pulled_tokens,
                 (unsigned long long)c->pulled_bytes, (unsigned long long)c->pulls_failed, tiers,
                 auth_text);
}

static void on_stats_timer(kvf_timer_t *timer, void *arg)
{
    kvf_prefill_t *p = arg;
    log_stats(p, "stats", false);
    /* Out of memory for the timer: no more stats lines (the last one at
     * the stop still comes). */
    (void)kvf_timer_arm_in_ms(kvf_evloop_timers(p->loop), timer, p->cfg.stats_interval_ms);
}

static void on_deadline_timer(kvf_timer_t *timer, void *arg)
{
    kvf_prefill_t *p = arg;
    if (timer == &p->drain_timer)
        p->drain_expired = true;
    else
        p->stop_expired = true;
}

/* Batches out, or a connection being set up. */
static bool transfers_pending(const kvf_prefill_t *p)
{
    for (const pf_req_t *r = p->head; r; r = r->next)
        if (r->n_batches || r->pull)
            return true;
    return kvf_xfer_connecting(p->xfer);
}

/* Re-arms the timer of the transport's next deadline and, while batches
 * are out on a transport whose fd may not wake for them, the poll period.
 * false when a timer could not be armed (out of memory). */
static bool arm_xfer_timers(kvf_prefill_t *p)
{
    kvf_timers_t *timers = kvf_evloop_timers(p->loop);
    bool ok = true;
    int ms = kvf_xfer_timeout_ms(p->xfer);
    if (ms >= 0)
        ok &= kvf_timer_arm_in_ms(timers, &p->xfer_timer, (uint64_t)ms) == KVF_OK;
    else
        kvf_timer_cancel(timers, &p->xfer_timer);
    if (!p->xfer_caps.fd_wakes_on_data && transfers_pending(p))
        ok &= kvf_timer_arm_in_ms(timers, &p->poll_timer, p->xfer_caps.poll_ms) == KVF_OK;
    else
        kvf_timer_cancel(timers, &p->poll_timer);
    return ok;
}

/* Re-arms every timer the loop's steps may have moved (the node runtime's
 * next registration or heartbeat, the transport's), then sleeps until the
 * earliest, an fd, or a signal; busy: only look, do not sleep. Then the
 * inbox is read (on_inbox_ready) and the due timers fire, request
 * deadlines (KvAlloc retries and replies) included. */
static void loop_wait(kvf_prefill_t *p, bool busy)
{
    kvf_timers_t *timers = kvf_evloop_timers(p->loop);
    uint64_t node_ms = (uint64_t)kvf_node_timeout_ms(p->node);
    bool ok = kvf_timer_arm_in_ms(timers, &p->node_timer, node_ms) == KVF_OK;
    ok &= arm_xfer_timers(p);
    /* A timer that could not be armed leaves the sleep without its
     * deadline: look again soon instead. */
    (void)kvf_evloop_wait(p->loop, busy ? 0 : ok ? -1 : PF_NOMEM_WAIT_MS);
}

/* ---- the loop ---------------------------------------------------------- */

/* Gives up every request held: Error{CLOSED} to the router (it sends them
 * elsewhere), ABORT to the decode nodes that reserved blocks. */
static void give_up_all(kvf_prefill_t *p)
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
}

/* Gives everything up, then waits a bounded time for the transfers that
 * read the local blocks to end. The inbox is no longer read (nor woken
 * for), nor is the router sent heartbeats. */
static void stop_all(kvf_prefill_t *p)
{
    give_up_all(p);
    pf_stash_free(p);
    kvf_node_publish(p->node); /* the heartbeats name nothing any more */
    kvf_timers_t *timers = kvf_evloop_timers(p->loop);
    kvf_timer_cancel(timers, &p->node_timer);
    (void)kvf_evloop_remove_fd(p->loop, kvf_inbox_fd(kvf_node_inbox(p->node)));
    /* Out of memory for the timer: no bound on the wait, so no wait. */
    p->stop_expired = kvf_timer_arm_in_ms(timers, &p->stop_timer, PF_STOP_DRAIN_MS) != KVF_OK;
    for (;;) {
        kvf_xfer_progress(p->xfer);
        pf_service_requests(p);
        if (!p->head || p->stop_expired)
            break;
        bool ok = arm_xfer_timers(p);
        (void)kvf_evloop_wait(p->loop, ok ? -1 : PF_NOMEM_WAIT_MS);
    }
    kvf_timer_cancel(timers, &p->stop_timer);
    if (p->head)
        kvf_log_warn("stopping with transfers still running");
}

/* SIGTERM: the router is told, new work is refused, and after
 * PF_DRAIN_TIMEOUT_MS what is still held is given up. */
static void drain_begin(kvf_prefill_t *p)
{
    p->draining = true;
    kvf_node_set_draining(p->node, true);
    /* Out of memory for the timer: no bound on the drain, so no drain. */
    p->drain_expired = kvf_timer_arm_in_ms(kvf_evloop_timers(p->loop), &p->drain_timer,
                                           PF_DRAIN_TIMEOUT_MS) != KVF_OK;
    kvf_log_info("draining: completing the requests held, taking no new ones");
}

kvf_status_t kvf_prefill_run(kvf_prefill_t *p, volatile sig_atomic_t *stop)
{
    char be_desc[128];
    kvf_backend_describe(&p->rt.backend, be_desc, sizeof(be_desc));
    kvf_log_info("serving on %s (router %s): %u kv blocks of %d tokens, kv %s (%zu bytes per "
                 "token), %d tokens per forward, backend %s",
                 p->cfg.listen_url, p->cfg.router_url, kvf_kvpool_num_blocks(p->rt.pool),
                 p->geo.block_size, kvf_kv_dtype_name(p->geo.dtype),
                 kvf_kv_bytes_per_token(&p->geo), p->cfg.max_batch_tokens, be_desc);
    (void)kvf_timer_arm_in_ms(kvf_evloop_timers(p->loop), &p->stats_timer,
                              p->cfg.stats_interval_ms);
    /* A stop signal wakes the loop after writing the flag (kvf/signals.h). */
    kvf_signals_wake_loop(p->loop);
    while (*stop != KVF_PREFILL_STOP && p->node_status == KVF_OK) {
        if (*stop == KVF_PREFILL_DRAIN && !p->draining)
            drain_begin(p);
        if (p->draining && (!p->head || p->drain_expired)) {
            if (p->head)
                kvf_log_warn("drain timed out with requests still held");
            break;
        }
        kvf_xfer_progress_for(p->xfer, PF_PROGRESS_BUDGET_MS);
        pf_service_requests(p);
        bool ran = pf_forward_step(p);
        /* What came in during the forward, before any deadline is judged. */
        pf_stash_handle(p);
        kvf_node_prefix_report(&p->pc, 0); /* what the router's KV-aware routing sees */
        loop_wait(p, ran);
    }
    kvf_signals_wake_loop(NULL);
    stop_all(p);
    kvf_timer_cancel(kvf_evloop_timers(p->loop), &p->drain_timer);
    if (p->node_status == KVF_OK)
        (void)kvf_node_deregister(p->node, "stopped");
    kvf_timer_cancel(kvf_evloop_timers(p->loop), &p->stats_timer);
    log_stats(p, "stopped", true);
    return p->node_status;
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
    /* its hash key comes from the router (kvf_node_prefix_sync) */
    st = kvf_node_prefix_init(&p->pc, p->rt.pool, kvf_model_fingerprint(p->rt.model),
                              !cfg->no_prefix_cache);
    if (st != KVF_OK)
        kvf_engine_stack_fini(&p->rt);
    return st;
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
    kvf_status_t st = kvf_xfer_caps(&xc, &p->xfer_caps);
    if (st == KVF_OK)
        st = kvf_xfer_create(&xc, &p->xfer);
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
        .prefix_pull = p->pc.cache && !cfg->no_prefix_pull,
        .fill_load = fill_load,
        .fill_work = fill_work,
        .load_arg = p,
    };
    kvf_status_t st = kvf_node_create(&nc, &p->node);
    if (st != KVF_OK) {
        kvf_log_error("node on %s: %s", cfg->listen_url, kvf_status_str(st));
        return st;
    }
    kvf_log_set_node(kvf_node_id(p->node));
    p->pc.node = p->node;
    return KVF_OK;
}

static kvf_status_t arm_xfer(void *xfer)
{
    return kvf_xfer_arm(xfer);
}

/* The loop's wait: the inbox, the transport's fd (armed before each sleep)
 * and the loop's own timers. */
static kvf_status_t create_loop(kvf_prefill_t *p)
{
    kvf_status_t st = kvf_evloop_create(&p->loop);
    if (st != KVF_OK)
        return st;
    kvf_timer_init(&p->node_timer, on_node_timer, p);
    kvf_timer_init(&p->xfer_timer, on_xfer_timer, p);
    kvf_timer_init(&p->poll_timer, on_xfer_timer, p);
    kvf_timer_init(&p->drain_timer, on_deadline_timer, p);
    kvf_timer_init(&p->stop_timer, on_deadline_timer, p);
    kvf_timer_init(&p->stats_timer, on_stats_timer, p);
    st = kvf_evloop_add_fd(p->loop, kvf_inbox_fd(kvf_node_inbox(p->node)), on_inbox_ready, p);
    int xfd = kvf_xfer_fd(p->xfer);
    if (st == KVF_OK && xfd >= 0)
        st = kvf_evloop_add_fd(p->loop, xfd, NULL, NULL);
    if (st == KVF_OK && xfd >= 0)
        st = kvf_evloop_add_hook(p->loop, arm_xfer, p->xfer);
    if (st != KVF_OK) {
        kvf_evloop_destroy(p->loop);
        p->loop = NULL;
    }
    return st;
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
    if (!p->cfg.stats_interval_ms)
        p->cfg.stats_interval_ms = 30000;
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
    st = create_loop(p);
    if (st != KVF_OK)
        goto fail_loop;
    st = pf_tiers_create(p, cfg);
    if (st != KVF_OK)
        goto fail_tiers;
    *prefill_p = p;
    return KVF_OK;

fail_tiers:
    kvf_evloop_destroy(p->loop);
fail_loop:
    kvf_node_destroy(p->node);
fail_node:
    kvf_xfer_destroy(p->xfer);
fail_xfer:
    kvf_node_prefix_fini(&p->pc);
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
    pf_stash_free(p);
    kvf_node_tiers_fini(&p->nt); /* before the pool: copies in flight write into it */
    kvf_evloop_destroy(p->loop); /* no timer of a request is left armed */
    kvf_node_destroy(p->node);
    kvf_node_prefix_fini(&p->pc); /* every request's references are gone */
    kvf_engine_stack_fini(&p->rt);
    pf_forward_fini(&p->fwd);
    free(p->listen_url);
    free(p->router_url);
    free(p);
}
