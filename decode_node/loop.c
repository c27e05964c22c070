/* kvf_decode_run: the decode node's single event loop. Each turn takes
 * control messages, drives the transport and its events, checks the
 * deadlines, then runs a step when a sequence has work or sleeps until a
 * message, a transport event or a deadline. Also the drain and the stop. */
#include "decode_internal.h"

#include "kvf/clock.h"
#include "kvf/kvcache.h"
#include "kvf/log.h"

#include <errno.h>
#include <poll.h>
#include <string.h>

/* Messages taken from the inbox per loop turn, so a flood cannot starve
 * the decode steps. */
#define DECODE_RECV_BURST 256
/* Time given to the last messages (errors, Deregister) to leave the
 * sockets before they close: nanomsg has no linger. */
#define DECODE_FLUSH_MS 100
/* Longest sleep while K/V is expected (the transport's fd cannot be relied
 * on to wake the loop for it). */
#define DECODE_HANDOFF_POLL_MS 2

void dec_fill_load(void *arg, Kvf__Load *load)
{
    const kvf_decode_t *d = arg;
    uint32_t running = 0, queued = 0;
    uint64_t queued_tokens = 0;
    for (size_t i = 0; i < d->n_reqs; i++) {
        const dec_req_t *r = d->reqs[i];
        if (r->h.state == KVF_HANDOFF_DECODING) {
            running++;
        } else if (r->h.state == KVF_HANDOFF_PREFILLING) {
            queued++;
            queued_tokens += r->n_tokens - r->prefilled;
        } else if (kvf_handoff_live(&r->h)) {
            queued++;
        }
    }
    load->blocks_free = kvf_kvpool_free_blocks(d->rt.pool);
    load->blocks_used = kvf_kvpool_used_blocks(d->rt.pool);
    load->blocks_total = kvf_kvpool_num_blocks(d->rt.pool);
    load->running = running;
    load->queued_requests = queued;
    load->queued_tokens = queued_tokens;
}

/* Logs the counters every stats interval when they changed (force: now),
 * and what is held, so a request that stays too long can be traced. */
static void log_stats(kvf_decode_t *d, bool force)
{
    uint64_t now = kvf_clock_ns();
    if (!force && now < d->next_stats_ns)
        return;
    d->next_stats_ns = now + (uint64_t)d->cfg.stats_interval_ms * 1000000ull;
    kvf_decode_stats_t s;
    kvf_decode_get_stats(d, &s);
    if (!force && !memcmp(&s, &d->logged, sizeof(s)))
        return;
    d->logged = s;
    kvf_log_info("stats: admitted %llu refused %llu finished %llu cancelled %llu failed %llu "
                 "released %llu | stale dropped %llu malformed dropped %llu | tokens %llu "
                 "steps %llu | kv blocks used %u of %u, requests held %zu",
                 (unsigned long long)s.requests_admitted, (unsigned long long)s.requests_refused,
                 (unsigned long long)s.requests_finished, (unsigned long long)s.requests_cancelled,
                 (unsigned long long)s.requests_failed, (unsigned long long)s.requests_released,
                 (unsigned long long)s.stale_dropped, (unsigned long long)s.malformed_dropped,
                 (unsigned long long)s.tokens_generated, (unsigned long long)s.steps,
                 kvf_kvpool_used_blocks(d->rt.pool), kvf_kvpool_num_blocks(d->rt.pool), d->n_reqs);
    for (size_t i = 0; i < d->n_reqs && i < 16; i++) {
        const dec_req_t *r = d->reqs[i];
        kvf_log_info("  held: request %llu epoch %llu, %s, %u blocks, %sreserved, %u generated",
                     (unsigned long long)r->req_id, (unsigned long long)r->epoch,
                     kvf_handoff_state_name(r->h.state), r->n_blocks, r->reserved ? "" : "not ",
                     r->gen);
    }
}

static void drain_inbox(kvf_decode_t *d)
{
    for (int i = 0; i < DECODE_RECV_BURST; i++) {
        kvf_envelope_t *env = NULL;
        kvf_status_t st = kvf_inbox_recv(kvf_node_inbox(d->node), 0, &env);
        if (st == KVF_ERR_AGAIN || st == KVF_ERR_TIMEOUT)
            return;
        if (st != KVF_OK) {
            /* Already dropped and counted by the inbox. */
            kvf_log_warn("undecodable message dropped: %s", kvf_status_str(st));
            continue;
        }
        dec_on_envelope(d, env);
        kvf_envelope_free(env);
    }
}

static int min_timeout(int a, int b)
{
    if (a < 0)
        return b;
    if (b < 0)
        return a;
    return a < b ? a : b;
}

/* Sleeps until a message, a transport event or a timer is due. */
static void wait_for_work(kvf_decode_t *d)
{
    if (kvf_xfer_arm(d->xfer) == KVF_ERR_AGAIN)
        return;
    int timeout = kvf_node_timeout_ms(d->node);
    timeout = min_timeout(timeout, kvf_xfer_timeout_ms(d->xfer));
    timeout = min_timeout(timeout, kvf_clock_ms_until(d->next_stats_ns));
    /* Without a transport fd the handle needs progress on a timer. With
     * one, UCX 1.13's shared-memory transports still do not wake it for
     * incoming data or connection set-up, so while a handoff is under way
     * the loop also looks every few milliseconds (measured: a first
     * request's handoff took up to a heartbeat period otherwise). */
    int xfd = kvf_xfer_fd(d->xfer);
    bool expecting = false;
    for (size_t i = 0; i < d->n_reqs && !expecting; i++)
        expecting = d->reqs[i]->h.state == KVF_HANDOFF_ALLOCATED ||
                    d->reqs[i]->h.state == KVF_HANDOFF_WRITING;
    timeout = min_timeout(timeout, xfd < 0 || expecting ? DECODE_HANDOFF_POLL_MS : 1000);
    struct pollfd pfd[2] = {{.fd = kvf_inbox_fd(kvf_node_inbox(d->node)), .events = POLLIN},
                            {.fd = xfd, .events = POLLIN}};
    if (poll(pfd, xfd < 0 ? 1 : 2, timeout) < 0 && errno != EINTR)
        kvf_log_warn("poll: %s", strerror(errno));
}

/* Ends every request as the node stops: the router hears that each live
 * one failed here (so it can dispatch it again), and the blocks go back
 * to the pool at once. The transport handle is destroyed before the pool
 * memory is freed, so no late write can reach freed memory. */
static void stop_all(kvf_decode_t *d)
{
    kvf_node_set_draining(d->node, true);
    for (size_t i = 0; i < d->n_reqs; i++) {
        dec_req_t *r = d->reqs[i];
        if (!kvf_handoff_live(&r->h))
            continue;
        dec_send_error(d, r->req_id, r->epoch, KVF_ERR_CLOSED, "decode node is shutting down");
        d->stats.requests_failed++;
        (void)kvf_handoff_end(&r->h);
        if (r->reserved)
            (void)kvf_xfer_cancel(d->xfer, r->req_id, r->epoch);
    }
    while (d->n_reqs)
        dec_req_release_blocks(d, d->reqs[d->n_reqs - 1]);
}

/* SIGTERM: tell the router, take nothing new, finish what is held. */
static void start_drain(kvf_decode_t *d, uint64_t *deadline_p)
{
    d->draining = true;
    kvf_node_set_draining(d->node, true);
    uint32_t ms = d->cfg.drain_timeout_ms ? d->cfg.drain_timeout_ms : 120000;
    *deadline_p = kvf_clock_ns() + (uint64_t)ms * 1000000ull;
    kvf_log_info("draining: %zu requests held; no new work", d->n_reqs);
}

/* One turn of the loop. */
static kvf_status_t turn(kvf_decode_t *d)
{
    kvf_status_t st = kvf_node_tick(d->node);
    if (st != KVF_OK)
        return st;
    drain_inbox(d);
    (void)kvf_xfer_progress(d->xfer);
    dec_drain_events(d);
    dec_check_seal_deadlines(d);
    dec_flush_chunks(d); /* chunks of sequences that ended on joining */
    if (dec_has_work(d))
        dec_step(d);
    else
        wait_for_work(d);
    log_stats(d, false);
    return KVF_OK;
}

kvf_status_t kvf_decode_run(kvf_decode_t *d, volatile sig_atomic_t *stop)
{
    kvf_status_t result = KVF_OK;
    kvf_log_info("serving on %s, router %s", d->cfg.listen_url, d->cfg.router_url);
    d->next_stats_ns = kvf_clock_ns() + (uint64_t)d->cfg.stats_interval_ms * 1000000ull;
    uint64_t drain_deadline = 0;
    while (*stop != KVF_DECODE_STOP) {
        if (*stop == KVF_DECODE_DRAIN && !d->draining)
            start_drain(d, &drain_deadline);
        if (d->draining && (d->n_reqs == 0 || kvf_clock_ns() > drain_deadline)) {
            if (d->n_reqs)
                kvf_log_warn("drain timed out with %zu requests held", d->n_reqs);
            break;
        }
        result = turn(d);
        if (result != KVF_OK)
            break;
    }
    kvf_log_info("stopping: %zu requests held", d->n_reqs);
    stop_all(d);
    dec_flush_chunks(d);
    log_stats(d, true);
    if (result == KVF_OK)
        (void)kvf_node_deregister(d->node, "stopped");
    kvf_clock_sleep_ms(DECODE_FLUSH_MS);
    return result;
}
