/* kvf_decode_run: the decode node's single event loop. Each turn takes
 * control messages, drives the transport and takes its events, runs a
 * step when a sequence has work, then waits in kvf_evloop_wait: without
 * work it sleeps until a message, a transport wake-up or the earliest
 * deadline. Every deadline is a timer: the node runtime's register and
 * heartbeats, the transport's own deadlines, each handoff's seal
 * deadline (events.c), the stats line, the drain's end.
 *
 * Wake-ups of the transport. Where its fd wakes for everything
 * (kvf_xfer_caps_t.fd_wakes_on_data), sleeping on it loses nothing. UCX
 * 1.13 does not promise that, and the loop does not poll for it; it
 * relies on two facts and looks again after a short bounded timer only
 * where they do not cover a handoff (dec_handoff_needs_recheck):
 *  - the prefill node sends KvReady over the control socket, which wakes
 *    the loop, only after every batch of the request completed on its
 *    side; the turn that takes KvReady progresses the transport and takes
 *    the LANDED events. So a handoff whose sender's connection works
 *    needs no look of its own, with one exception: a KvReady taken before
 *    the last LANDED was (the completion not yet through UCX's progress).
 *    Then, and only until that LANDED comes, the loop looks again every
 *    poll_ms.
 *  - a sender's batch can only complete once its connection is set up,
 *    and UCX 1.13 sets a connection up without waking the receiver's fd
 *    until the receiver has progressed once after the sender connected
 *    (measured over shared memory and TCP: a first batch to a receiver
 *    that slept through the connect waited for its next timeout, whatever
 *    it was). The KvAlloc the prefill node sends right after connecting
 *    usually is that progress (measured: no first handoff waited), but
 *    its message races UCX's accepting of the connection. So while a
 *    handoff waits on a prefill node whose connection has not carried a
 *    batch yet (or whose last handoff failed: it may reconnect), the loop
 *    looks every poll_ms too, until that connection's first LANDED.
 * A transport without an fd is looked at every poll_ms while any handoff
 * is under way.
 *
 * The stop flag is written by a signal handler, which then wakes this
 * loop (kvf_signals_wake_loop): a stop is seen at once, whichever thread
 * took the signal and whenever it came. */
#include "decode_internal.h"

#include "kvf/auth.h"
#include "kvf/clock.h"
#include "kvf/kvcache.h"
#include "kvf/log.h"
#include "kvf/signals.h"

#include <stdlib.h>
#include <string.h>

/* Messages taken from the inbox per loop turn, so a flood cannot starve
 * the decode steps. */
#define DECODE_RECV_BURST 256
/* Time given to the last messages (errors, Deregister) to leave the
 * sockets before they close: nanomsg has no linger. */
#define DECODE_FLUSH_MS 100
/* Longest graceful drain when the configuration names none. */
#define DECODE_DRAIN_TIMEOUT_MS 120000

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
    /* Cached blocks nobody uses count as free: any admission may have them. */
    const uint32_t total = kvf_kvpool_num_blocks(d->rt.pool), avail = kvf_node_prefix_available(&d->pc);
    load->blocks_free = avail;
    load->blocks_used = total - avail;
    load->blocks_total = total;
    kvf_node_tiers_load(&d->nt, load);
    load->blocks_cached = avail - kvf_kvpool_free_blocks(d->rt.pool);
    load->running = running;
    load->queued_requests = queued;
    load->queued_tokens = queued_tokens;
}

/* Logs the counters when they changed since the last line (force: in any
 * case), and what is held, so a request that stays too long can be
 * traced. */
static void log_stats(kvf_decode_t *d, bool force)
{
    kvf_decode_stats_t s;
    kvf_auth_counters_t auth;
    kvf_decode_get_stats(d, &s);
    kvf_auth_counters(&auth);
    uint64_t refused = kvf_node_refused(d->node);
    if (!force && !memcmp(&s, &d->logged, sizeof(s)) &&
        !memcmp(&auth, &d->logged_auth, sizeof(auth)) && refused == d->logged_refused)
        return;
    d->logged = s;
    d->logged_auth = auth;
    d->logged_refused = refused;
    char auth_text[256], tiers[256];
    kvf_node_control_format(d->node, auth_text, sizeof(auth_text));
    kvf_node_tiers_describe(&d->nt, tiers, sizeof(tiers));
    const uint32_t avail = kvf_node_prefix_available(&d->pc);
    kvf_log_info("stats: admitted %llu refused %llu finished %llu cancelled %llu failed %llu "
                 "released %llu | stale dropped %llu malformed dropped %llu | tokens %llu "
                 "steps %llu | kv blocks used %u of %u, requests held %zu | prefix cache %s: "
                 "%llu of %llu blocks hit, %u cached | %s | %s",
                 (unsigned long long)s.requests_admitted, (unsigned long long)s.requests_refused,
                 (unsigned long long)s.requests_finished, (unsigned long long)s.requests_cancelled,
                 (unsigned long long)s.requests_failed, (unsigned long long)s.requests_released,
                 (unsigned long long)s.stale_dropped, (unsigned long long)s.malformed_dropped,
                 (unsigned long long)s.tokens_generated, (unsigned long long)s.steps,
                 kvf_kvpool_num_blocks(d->rt.pool) - avail, kvf_kvpool_num_blocks(d->rt.pool),
                 d->n_reqs, d->pc.cache ? "on" : "off", (unsigned long long)d->prefix_hit_blocks,
                 (unsigned long long)d->prefix_query_blocks,
                 avail - kvf_kvpool_free_blocks(d->rt.pool), tiers, auth_text);
    for (size_t i = 0; i < d->n_reqs && i < 16; i++) {
        const dec_req_t *r = d->reqs[i];
        kvf_log_info("  held: request %llu epoch %llu, %s, %u blocks, %sreserved, %u generated",
                     (unsigned long long)r->req_id, (unsigned long long)r->epoch,
                     kvf_handoff_state_name(r->h.state), r->n_blocks, r->reserved ? "" : "not ",
                     r->gen);
    }
}

/* Handles env and frees it. */
static void take_envelope(void *arg, kvf_envelope_t *env)
{
    dec_on_envelope(arg, env);
    kvf_envelope_free(env);
}

void dec_inbox_during_step(kvf_decode_t *d)
{
    kvf_inbox_keep(kvf_node_inbox(d->node), &d->stash, KVF__ENVELOPE__BODY_KV_LEASE,
                   take_envelope, d);
}

void dec_stash_free(kvf_decode_t *d)
{
    kvf_kept_free(&d->stash);
}

static void drain_inbox(kvf_decode_t *d)
{
    kvf_kept_handle(&d->stash, take_envelope, d); /* what the last step kept comes first */
    for (int i = 0; i < DECODE_RECV_BURST; i++) {
        kvf_envelope_t *env = NULL;
        kvf_status_t st = kvf_inbox_recv(kvf_node_inbox(d->node), 0, &env);
        if (st == KVF_ERR_AGAIN || st == KVF_ERR_TIMEOUT)
            return;
        if (st != KVF_OK) {
            /* Already dropped and counted by the inbox; a refusal is
             * logged (rate-limited) by kvf/auth.h. */
            if (st != KVF_ERR_AUTH)
                kvf_log_warn("undecodable message dropped: %s", kvf_status_str(st));
            continue;
        }
        dec_on_envelope(d, env);
        kvf_envelope_free(env);
    }
}

void dec_fill_work(void *arg, kvf_node_snapshot_t *snap)
{
    const kvf_decode_t *d = arg;
    for (size_t i = 0; i < d->n_reqs; i++) {
        const dec_req_t *r = d->reqs[i];
        if (!kvf_handoff_live(&r->h))
            continue;
        (void)kvf_node_snapshot_work(snap, r->req_id, r->epoch,
                                     r->h.state == KVF_HANDOFF_PREFILLING ? r->prefilled : r->gen);
    }
}

/* ---- timers ----------------------------------------------------------------- */

static kvf_timers_t *timers(kvf_decode_t *d)
{
    return kvf_evloop_timers(d->loop);
}

static void arm_in_ms(kvf_decode_t *d, kvf_timer_t *t, int ms, const char *what)
{
    if (kvf_timer_arm_in_ms(timers(d), t, ms > 0 ? (uint64_t)ms : 0) != KVF_OK)
        kvf_log_error("no memory to arm the %s timer", what);
}

/* The node runtime's next register or heartbeat (messages move it: a
 * RegisterReply starts the heartbeats). */
static void arm_node_timer(kvf_decode_t *d)
{
    arm_in_ms(d, &d->node_timer, kvf_node_timeout_ms(d->node), "heartbeat");
}

static void on_node_timer(kvf_timer_t *t, void *arg)
{
    kvf_decode_t *d = arg;
    (void)t;
    kvf_status_t st = kvf_node_tick(d->node);
    if (st != KVF_OK)
        d->node_status = st; /* the router's final refusal: the loop ends */
    else
        arm_node_timer(d);
}

static void on_stats_timer(kvf_timer_t *t, void *arg)
{
    kvf_decode_t *d = arg;
    log_stats(d, false);
    arm_in_ms(d, t, (int)d->cfg.stats_interval_ms, "stats");
}

static void on_drain_timer(kvf_timer_t *t, void *arg)
{
    kvf_decode_t *d = arg;
    (void)t;
    d->drain_expired = true;
}

/* The transport's internal deadlines, and the bounded re-check (see the
 * top of this file): both progress it. */
static void on_transport_timer(kvf_timer_t *t, void *arg)
{
    kvf_decode_t *d = arg;
    (void)t;
    (void)kvf_xfer_progress(d->xfer);
}

/* Whether the loop must look at the transport soon although nothing may
 * wake it: see the top of this file. */
static bool transport_needs_recheck(const kvf_decode_t *d)
{
    if (d->xfer_caps.fd_wakes_on_data)
        return false;
    return dec_handoff_needs_recheck(d, kvf_xfer_fd(d->xfer) < 0);
}

static void arm_transport_timers(kvf_decode_t *d)
{
    int ms = kvf_xfer_timeout_ms(d->xfer);
    if (ms >= 0)
        arm_in_ms(d, &d->xfer_timer, ms, "transport deadline");
    else
        kvf_timer_cancel(timers(d), &d->xfer_timer);
    if (transport_needs_recheck(d)) {
        if (!kvf_timer_armed(&d->recheck_timer))
            arm_in_ms(d, &d->recheck_timer, (int)d->xfer_caps.poll_ms, "handoff re-check");
    } else {
        kvf_timer_cancel(timers(d), &d->recheck_timer);
    }
}

static kvf_status_t arm_xfer(void *arg)
{
    return kvf_xfer_arm(arg);
}

kvf_status_t dec_loop_open(kvf_decode_t *d)
{
    kvf_status_t st = kvf_evloop_create(&d->loop);
    if (st != KVF_OK)
        return st;
    st = kvf_evloop_add_fd(d->loop, kvf_inbox_fd(kvf_node_inbox(d->node)), NULL, NULL);
    if (st == KVF_OK && kvf_xfer_fd(d->xfer) >= 0)
        st = kvf_evloop_add_fd(d->loop, kvf_xfer_fd(d->xfer), NULL, NULL);
    if (st == KVF_OK)
        st = kvf_evloop_add_hook(d->loop, arm_xfer, d->xfer);
    if (st != KVF_OK)
        return st;
    kvf_timer_init(&d->node_timer, on_node_timer, d);
    kvf_timer_init(&d->xfer_timer, on_transport_timer, d);
    kvf_timer_init(&d->recheck_timer, on_transport_timer, d);
    kvf_timer_init(&d->stats_timer, on_stats_timer, d);
    kvf_timer_init(&d->drain_timer, on_drain_timer, d);
    return KVF_OK;
}

void dec_loop_close(kvf_decode_t *d)
{
    kvf_evloop_destroy(d->loop); /* disarms the timers still armed */
    d->loop = NULL;
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
static void start_drain(kvf_decode_t *d)
{
    d->draining = true;
    kvf_node_set_draining(d->node, true);
    uint32_t ms = d->cfg.drain_timeout_ms ? d->cfg.drain_timeout_ms : DECODE_DRAIN_TIMEOUT_MS;
    arm_in_ms(d, &d->drain_timer, (int)ms, "drain");
    kvf_log_info("draining: %zu requests held; no new work", d->n_reqs);
}

/* A prefill node died holding a reservation here: over shared memory
 * its last completion message may have been cut in half, which blocks
 * the transport's message queue for every sender. The transport gets a
 * new queue (the old one keeps delivering while it can) and the router
 * the new descriptor, which prefill nodes then connect with
 * (docs/transfer-recovery.md). Once per turn, however many requests the
 * death cancelled. */
static void relisten(kvf_decode_t *d)
{
    d->relisten_wanted = false;
    kvf_status_t st = kvf_xfer_relisten(d->xfer);
    if (st == KVF_ERR_UNSUPPORTED)
        return;
    uint8_t *desc = NULL;
    size_t len = 0;
    if (st == KVF_OK)
        st = kvf_xfer_export(d->xfer, &desc, &len);
    if (st == KVF_OK)
        st = kvf_node_set_xfer_desc(d->node, desc, len);
    free(desc);
    if (st != KVF_OK) {
        kvf_log_error("a sender was lost; listening anew failed: %s", kvf_status_str(st));
        return;
    }
    kvf_log_info("a sender was lost mid-handoff: the transport listens on a new endpoint");
}

/* One turn of the loop: messages, the transport, a step, the wait (which
 * fires the due timers). */
static kvf_status_t turn(kvf_decode_t *d)
{
    drain_inbox(d);
    if (d->relisten_wanted)
        relisten(d);
    arm_node_timer(d);
    (void)kvf_xfer_progress(d->xfer);
    dec_drain_events(d);
    dec_flush_chunks(d); /* first tokens of sequences that joined */
    bool busy = dec_has_work(d);
    if (busy)
        dec_step(d);
    arm_transport_timers(d);
    /* Busy, or messages the step kept: only look (due timers, readable
     * fds); the next turn follows at once. */
    kvf_node_prefix_report(&d->pc, 0); /* what the router's KV-aware routing sees */
    (void)kvf_evloop_wait(d->loop, busy || d->stash.n ? 0 : -1);
    return d->node_status;
}

kvf_status_t kvf_decode_run(kvf_decode_t *d, volatile sig_atomic_t *stop)
{
    kvf_status_t result = KVF_OK;
    kvf_log_info("serving on %s, router %s", d->cfg.listen_url, d->cfg.router_url);
    arm_node_timer(d);
    arm_in_ms(d, &d->stats_timer, (int)d->cfg.stats_interval_ms, "stats");
    kvf_signals_wake_loop(d->loop);
    while (*stop != KVF_DECODE_STOP) {
        if (*stop == KVF_DECODE_DRAIN && !d->draining)
            start_drain(d);
        if (d->draining && (d->n_reqs == 0 || d->drain_expired)) {
            if (d->n_reqs)
                kvf_log_warn("drain timed out with %zu requests held", d->n_reqs);
            break;
        }
        result = turn(d);
        if (result != KVF_OK)
            break;
    }
    kvf_signals_wake_loop(NULL);
    kvf_log_info("stopping: %zu requests held", d->n_reqs);
    stop_all(d);
    dec_flush_chunks(d);
    log_stats(d, true);
    if (result == KVF_OK)
        (void)kvf_node_deregister(d->node, "stopped");
    kvf_clock_sleep_ms(DECODE_FLUSH_MS);
    return result;
}
