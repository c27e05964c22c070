/* Scheduling: picking a decode and a prefill node for a request, dispatch,
 * re-dispatch after a node failed, the wait queue, and request deadlines.
 * See router_internal.h. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utlist.h>

#include "kvf/clock.h"
#include "kvf/log.h"
#include "kvf/sampling_msg.h"
#include "router_internal.h"

/* A node failing this many attempts in a row, within QUARANTINE_WINDOW_MS
 * of the first, is quarantined; it is let out for one probe attempt after
 * QUARANTINE_PERIOD_BEATS heartbeat periods. */
#define QUARANTINE_FAILURES     3u
#define QUARANTINE_WINDOW_MS    30000u
#define QUARANTINE_PERIOD_BEATS 10u

/* ---- failing nodes --------------------------------------------------------------- */

void kvf_router__node_failed(kvf_router_t *r, kvf_router_node_t *n, const char *why)
{
    (void)r;
    uint64_t now = kvf_clock_ns();
    if (!n->fail_streak || now - n->fail_first_ns > QUARANTINE_WINDOW_MS * 1000000ull) {
        n->fail_streak = 0;
        n->fail_first_ns = now;
    }
    n->fail_streak++;
    if (n->state == NODE_DEAD || (n->fail_streak < QUARANTINE_FAILURES && !n->probing))
        return;
    if (n->state != NODE_QUARANTINED)
        kvf_log_warn("node %s quarantined: %u attempts failed in a row (last: %s)", n->id,
                     n->fail_streak, why);
    n->state = NODE_QUARANTINED;
    n->quarantined_ns = now;
    n->probing = false;
}

void kvf_router__node_succeeded(kvf_router_t *r, kvf_router_node_t *n)
{
    (void)r;
    n->fail_streak = 0;
    if (n->state == NODE_QUARANTINED || n->probing) {
        kvf_log_info("node %s: its probe attempt succeeded; out of quarantine", n->id);
        n->state = NODE_LIVE;
    }
    n->probing = false;
}

void kvf_router__quarantine_beat(kvf_router_t *r, kvf_router_node_t *n)
{
    uint64_t period = (uint64_t)r->cfg.heartbeat_ms * QUARANTINE_PERIOD_BEATS * 1000000ull;
    if (n->probing || kvf_clock_ns() - n->quarantined_ns < period)
        return;
    kvf_log_info("node %s: quarantine period over; one probe attempt may go to it", n->id);
    n->state = NODE_LIVE;
    n->probing = true;
}

/* A probing node got its one attempt: nothing more until it is decided. */
static void probe_sent(kvf_router_node_t *n)
{
    if (!n->probing || n->state != NODE_LIVE)
        return;
    n->state = NODE_QUARANTINED;
    n->quarantined_ns = kvf_clock_ns();
}

/* ---- deadlines ------------------------------------------------------------------ */

static kvf_timers_t *timers(kvf_router_t *r)
{
    return kvf_evloop_timers(r->loop);
}

/* Re-arms q's phase timer for its state: the longest wait in the queue, for
 * the first sign of the prefill, or between tokens. The timer is armed
 * from submit on, so this never fails. */
static void arm_phase(kvf_router_t *r, kvf_router_req_t *q)
{
    uint64_t ms = q->place.state == REQ_QUEUED ? r->cfg.queue_timeout_ms
                  : q->place.state == REQ_PREFILL
                      ? (uint64_t)r->cfg.prefill_timeout_ms + q->place.expected_prefill_ms
                      : r->cfg.stall_timeout_ms;
    kvf_timer_arm_in_ms(timers(r), &q->t.phase, ms);
}

void kvf_router__on_work(kvf_router_t *r, kvf_router_node_t *n, Kvf__WorkRef *const *work,
                         size_t n_work)
{
    kvf_node_ref_t ref = kvf_router__node_ref(r, n);
    for (size_t i = 0; i < n_work; i++) {
        kvf_router_req_t *q = kvf_router__req_find(r, work[i]->req_id);
        if (!q || q->place.epoch != work[i]->epoch || q->place.state == REQ_QUEUED ||
            (q->place.prefill != ref && q->place.decode != ref))
            continue;
        arm_phase(r, q);
    }
}

/* An attempt's expected prefill time counts this many times over. */
#define PREFILL_EXPECTED_SLACK 4

/* The work ahead of n_tokens more at prefill node p, at its measured rate
 * (slack included): what the prefill timeout of an attempt sent there
 * adds. 0 before p reported a prefill. */
static uint64_t expected_prefill_ms(const kvf_router_node_t *p, uint32_t n_tokens)
{
    uint64_t tokens = p->queued_tokens + p->pending_tokens + n_tokens;
    return tokens * p->prefill_ns_per_token * PREFILL_EXPECTED_SLACK / 1000000u;
}

void kvf_router__progress(kvf_router_t *r, kvf_router_req_t *q)
{
    arm_phase(r, q);
}

static kvf_router_req_t *req_of_timer(kvf_timer_t *t, size_t offset)
{
    return (kvf_router_req_t *)((char *)t - offset);
}

static void on_deadline(kvf_timer_t *t, void *arg)
{
    kvf_router_t *r = arg;
    kvf_router_req_t *q = req_of_timer(t, offsetof(kvf_router_req_t, t.deadline));
    kvf_router__cancel_nodes(r, q, "timed out");
    kvf_router__req_finish(r, q, KVF__FINISH_REASON__FINISH_ERROR, KVF_ERR_TIMEOUT,
                           "request timed out");
}

/* q's attempt failed because of node n (NULL: gone): it counts towards
 * n's quarantine and, with exclude, n gets none of q's later attempts (a
 * prefill node only while another can take them: route.c); q goes
 * again. */
static void attempt_failed(kvf_router_t *r, kvf_router_req_t *q, kvf_router_node_t *n,
                           bool exclude, const char *why)
{
    if (n) {
        kvf_router__node_failed(r, n, why);
        if (exclude && q->place.n_excluded < ROUTER_MAX_EXCLUDED)
            q->place.excluded[q->place.n_excluded++] = kvf_router__node_ref(r, n);
    }
    kvf_router__redispatch(r, q, why);
}

static void on_phase_timeout(kvf_timer_t *t, void *arg)
{
    kvf_router_t *r = arg;
    kvf_router_req_t *q = req_of_timer(t, offsetof(kvf_router_req_t, t.phase));
    /* Re-armed first (it cannot fail), so that q's phase timer stays armed
     * while q lives, whatever happens to q below. */
    arm_phase(r, q);
    if (q->place.state == REQ_QUEUED)
        kvf_router__req_finish(r, q, KVF__FINISH_REASON__FINISH_ERROR, KVF_ERR_NO_SPACE,
                               "overloaded: no decode node could take the request in time");
    else if (q->place.state == REQ_PREFILL)
        attempt_failed(r, q, kvf_router__node_get(r, q->place.prefill),
                       q->place.prefill != q->place.decode,
                       "no first token within the prefill timeout");
    else
        attempt_failed(r, q, kvf_router__node_get(r, q->place.decode), true,
                       "no token within the stall timeout");
}

kvf_status_t kvf_router__timers_start(kvf_router_t *r, kvf_router_req_t *q)
{
    kvf_timer_init(&q->t.deadline, on_deadline, r);
    kvf_timer_init(&q->t.phase, on_phase_timeout, r);
    kvf_status_t st = kvf_timer_arm_in_ms(timers(r), &q->t.deadline, r->cfg.request_timeout_ms);
    if (st == KVF_OK)
        st = kvf_timer_arm_in_ms(timers(r), &q->t.phase, r->cfg.queue_timeout_ms);
    if (st != KVF_OK)
        kvf_router__timers_stop(r, q);
    return st;
}

void kvf_router__timers_stop(kvf_router_t *r, kvf_router_req_t *q)
{
    kvf_timer_cancel(timers(r), &q->t.deadline);
    kvf_timer_cancel(timers(r), &q->t.phase);
}

/* ---- the wait queue ------------------------------------------------------------ */

static void queue_push(kvf_router_t *r, kvf_router_req_t *q)
{
    q->place.state = REQ_QUEUED;
    arm_phase(r, q);
    DL_APPEND2(r->queue, q, queue_prev, queue_next);
    r->queue_len++;
}

void kvf_router__queue_remove(kvf_router_t *r, kvf_router_req_t *q)
{
    if (!q->queue_prev)
        return; /* not queued */
    DL_DELETE2(r->queue, q, queue_prev, queue_next);
    q->queue_prev = q->queue_next = NULL;
    r->queue_len--;
}

/* ---- picking nodes --------------------------------------------------------------- */

/* ---- dispatch ---------------------------------------------------------------------- */

void kvf_router__claim(kvf_router_t *r, kvf_router_req_t *q, kvf_router_node_t *p,
                       kvf_router_node_t *d)
{
    uint32_t n_tokens = q->ask.n_prompt + q->out.n;
    q->place.epoch++;
    q->place.attempts++;
    q->place.prefill = kvf_router__node_ref(r, p);
    q->place.decode = kvf_router__node_ref(r, d);
    q->place.state = REQ_PREFILL;
    q->place.expected_prefill_ms = expected_prefill_ms(p, n_tokens);
    q->place.dispatched_ns = kvf_clock_ns();
    q->place.n_tokens = n_tokens;
    uint32_t remaining = kvf_sampling_msg_remaining(q->ask.sampling, q->out.n);
    q->place.blocks = kvf_router__blocks_for(n_tokens + remaining, d->block_size);
    q->place.load_gen = d->load_gen;
    q->place.prefill_seen = false;
    d->pending_blocks += q->place.blocks;
    d->pending_running++;
    p->pending_tokens += n_tokens;
    d->dispatched++;
    if (p != d)
        p->dispatched++;
    probe_sent(d);
    probe_sent(p);
}

/* Sends q's current epoch to prefill node p and decode node d. */
static void dispatch(kvf_router_t *r, kvf_router_req_t *q, kvf_router_node_t *p,
                     kvf_router_node_t *d)
{
    kvf_router__claim(r, q, p, d);
    arm_phase(r, q);
    uint32_t n_tokens = q->place.n_tokens;

    uint32_t *ids = malloc((size_t)n_tokens * sizeof(*ids));
    if (!ids) {
        kvf_router__req_finish(r, q, KVF__FINISH_REASON__FINISH_ERROR, KVF_ERR_NOMEM,
                               "out of memory");
        return;
    }
    memcpy(ids, q->ask.prompt, (size_t)q->ask.n_prompt * sizeof(*ids));
    if (q->out.n)
        memcpy(ids + q->ask.n_prompt, q->out.ids, (size_t)q->out.n * sizeof(*ids));
    Kvf__PrefillRequest pr = KVF__PREFILL_REQUEST__INIT;
    pr.req_id = q->id;
    pr.epoch = q->place.epoch;
    pr.token_ids = ids;
    pr.n_token_ids = n_tokens;
    pr.sampling = q->ask.sampling; /* as completed at submit, every epoch */
    pr.decode_node_id = d->id;
    pr.decode_inbox = d->inbox;
    pr.decode_xfer_desc.data = d->xfer_desc;
    pr.decode_xfer_desc.len = d->xfer_desc_len;
    pr.n_generated = q->out.n;
    pr.rng_state = q->place.rng_state;
    pr.cache_salt = (ProtobufCBinaryData){q->ask.cache_salt_len, q->ask.cache_salt};
    /* Only this attempt's KvAlloc gets through at d (kvf/identity.h). */
    uint8_t alloc_token[KVF_ALLOC_TOKEN_LEN];
    kvf_identity_alloc_token(d->token, q->id, q->place.epoch, alloc_token);
    pr.alloc_token = (ProtobufCBinaryData){sizeof(alloc_token), alloc_token};
    kvf_envelope_t env;
    kvf_envelope_init(&env, "router");
    env.body_case = KVF__ENVELOPE__BODY_PREFILL_REQUEST;
    env.prefill_request = &pr;
    kvf_log_debug("request %llu epoch %llu: prefill %s, decode %s, %u tokens",
                  (unsigned long long)q->id, (unsigned long long)q->place.epoch, p->id, d->id,
                  n_tokens);
    kvf_router__send(r, p->inbox, &env);
    free(ids);
}

/* Whether some decode node that is not dead could ever hold q; when none
 * can, why says so. True when there is no decode node at all (q may wait
 * for one). */
static bool could_fit(kvf_router_t *r, const kvf_router_req_t *q, char *why, size_t why_len)
{
    uint32_t tokens = kvf_router__tokens_needed(q);
    uint32_t largest = 0, need = 0;
    bool any_decode = false;
    for (int i = 0; i < ROUTER_MAX_NODES; i++) {
        kvf_router_node_t *n = &r->nodes.slots[i];
        if (!n->used || n->role != KVF__ROLE__ROLE_DECODE || n->state == NODE_DEAD)
            continue;
        any_decode = true;
        need = kvf_router__blocks_for(tokens, n->block_size);
        if (n->capacity_blocks >= need && (!n->max_context || tokens <= n->max_context))
            largest = need;
        else if (largest < need && n->capacity_blocks > largest)
            largest = n->capacity_blocks;
    }
    if (!any_decode || largest >= need)
        return true;
    snprintf(why, why_len,
             "request needs %u KV blocks (%u tokens); the largest decode node holds %u", need,
             tokens, largest);
    return false;
}

void kvf_router__schedule(kvf_router_t *r, kvf_router_req_t *q)
{
    if (q->place.attempts >= r->cfg.max_attempts) {
        kvf_router__req_finish(r, q, KVF__FINISH_REASON__FINISH_ERROR, KVF_ERR_PEER,
                               "request failed on every attempt");
        return;
    }
    kvf_router_node_t *d = NULL, *p = NULL;
    if (kvf_router__pick(r, q, &p, &d)) {
        dispatch(r, q, p, d);
        return;
    }
    /* A request no live decode node could ever hold would wait in vain. */
    char why[160];
    if (!could_fit(r, q, why, sizeof(why))) {
        kvf_router__req_finish(r, q, KVF__FINISH_REASON__FINISH_ERROR, KVF_ERR_TOO_BIG, why);
        return;
    }
    if (r->queue_len >= r->cfg.max_queue) {
        kvf_router__req_finish(r, q, KVF__FINISH_REASON__FINISH_ERROR, KVF_ERR_NO_SPACE,
                               "overloaded: no decode node has room and the wait queue is full");
        return;
    }
    queue_push(r, q);
}

void kvf_router__drain_queue(kvf_router_t *r)
{
    while (r->queue) {
        kvf_router_req_t *q = r->queue;
        q->place.n_excluded = 0;
        kvf_router_node_t *d = NULL, *p = NULL;
        if (!kvf_router__pick(r, q, &p, &d))
            return;
        kvf_router__queue_remove(r, q);
        dispatch(r, q, p, d);
    }
}

/* Cancel of q's attempt to its nodes; writer_lost: its prefill node was
 * lost, maybe mid-write to the decode node. */
static void cancel_send(kvf_router_t *r, kvf_router_req_t *q, const char *reason, bool writer_lost)
{
    Kvf__Cancel c = KVF__CANCEL__INIT;
    c.req_id = q->id;
    c.epoch = q->place.epoch;
    c.reason = (char *)reason;
    c.writer_lost = writer_lost;
    kvf_envelope_t env;
    kvf_envelope_init(&env, "router");
    env.body_case = KVF__ENVELOPE__BODY_CANCEL;
    env.cancel = &c;
    kvf_router_node_t *p = kvf_router__node_get(r, q->place.prefill);
    kvf_router_node_t *d = kvf_router__node_get(r, q->place.decode);
    if (p && p->state != NODE_DEAD)
        kvf_router__send(r, p->inbox, &env);
    if (d && d->state != NODE_DEAD && d != p)
        kvf_router__send(r, d->inbox, &env);
}

void kvf_router__cancel_nodes(kvf_router_t *r, kvf_router_req_t *q, const char *reason)
{
    cancel_send(r, q, reason, false);
}

/* The tokens already streamed stay; the next prefill continues after
 * them. */
static void redispatch(kvf_router_t *r, kvf_router_req_t *q, const char *why, bool writer_lost)
{
    kvf_log_info("request %llu epoch %llu: %s; dispatching again", (unsigned long long)q->id,
                 (unsigned long long)q->place.epoch, why);
    r->count.redispatched++;
    cancel_send(r, q, why, writer_lost);
    q->place.prefill = q->place.decode = KVF_NODE_NONE;
    kvf_router__schedule(r, q);
}

void kvf_router__redispatch(kvf_router_t *r, kvf_router_req_t *q, const char *why)
{
    redispatch(r, q, why, false);
}

void kvf_router__node_lost(kvf_router_t *r, kvf_router_node_t *n, const char *why)
{
    kvf_log_warn("node %s (%s) %s", n->id, kvf_router__role_name(n->role), why);
    kvf_outboxes_forget(r->outboxes, n->inbox);
    /* Its requests must not be sent back to it, nor new ones for the
     * blocks it cached. */
    n->state = NODE_DEAD;
    kvf_router__prefix_drop(n);
    kvf_timer_cancel(timers(r), &n->liveness);
    kvf_node_ref_t ref = kvf_router__node_ref(r, n);
    kvf_router_req_t *q, *next;
    HASH_ITER(hh, r->requests, q, next)
    {
        if (q->place.state == REQ_QUEUED || (q->place.prefill != ref && q->place.decode != ref))
            continue;
        if (q->place.prefill == ref && q->place.decode != ref && q->place.state == REQ_DECODE)
            continue; /* its prefill was done: the decode node carries on */
        /* A prefill node lost while it may have been writing to the
         * decode node: that node listens anew (docs/transfer-recovery.md). */
        redispatch(r, q, why, q->place.prefill == ref && q->place.decode != ref);
    }
}

/* ---- node errors -------------------------------------------------------------------- */

/* Failures of the handoff to the decode node (reported by the prefill
 * node): the transport, or a descriptor it refused. */
static bool transfer_failure(int32_t status)
{
    return status == KVF_ERR_TRANSPORT || status == KVF_ERR_FORMAT ||
           status == KVF_ERR_VERSION || status == KVF_ERR_MISMATCH;
}

static bool sender_is(const kvf_router_node_t *n, const char *sender)
{
    return n && sender && !strcmp(n->id, sender);
}

void kvf_router__on_error(kvf_router_t *r, const Kvf__Error *e, const char *sender)
{
    kvf_router_req_t *q = kvf_router__req_current(r, e->req_id, e->epoch, "error");
    if (!q)
        return;
    kvf_log_info("request %llu epoch %llu: %s reports %s: %s", (unsigned long long)q->id,
                 (unsigned long long)q->place.epoch, sender,
                 kvf_status_str((kvf_status_t)e->status), e->message);
    if (e->status == KVF_ERR_NO_SPACE) {
        /* The decode node refused: try another one, or wait. */
        if (q->place.n_excluded < ROUTER_MAX_EXCLUDED)
            q->place.excluded[q->place.n_excluded++] = q->place.decode;
        /* The attempt's blocks stay charged to the node until its next
         * heartbeat: a node refusing because an earlier attempt still
         * holds blocks (its lease runs out) is not offered the next one
         * at once (measured: taking them off made 30 attempts a second). */
        q->place.prefill = q->place.decode = KVF_NODE_NONE;
        q->place.attempts--; /* a refusal is not a failure */
        kvf_router__schedule(r, q);
        return;
    }
    if (e->status == KVF_ERR_INVAL || e->status == KVF_ERR_TOO_BIG ||
        e->status == KVF_ERR_UNSUPPORTED) {
        kvf_router__cancel_nodes(r, q, "invalid");
        kvf_router__req_finish(r, q, KVF__FINISH_REASON__FINISH_ERROR, (kvf_status_t)e->status,
                               *e->message ? e->message : "request refused by a node");
        return;
    }
    kvf_router_node_t *d = kvf_router__node_get(r, q->place.decode);
    kvf_router_node_t *p = kvf_router__node_get(r, q->place.prefill);
    if (transfer_failure(e->status) && d && d != p) {
        /* The decode node may be dead, unseen yet, or its descriptor is
         * refused: the next attempts go elsewhere or wait, rather than
         * fail on it again at once. */
        if (!d->suspect_since_ns && e->status == KVF_ERR_TRANSPORT) {
            d->suspect_since_ns = kvf_clock_ns();
            kvf_log_info("node %s: a transfer to it failed; no new work until it heartbeats",
                         d->id);
        }
        attempt_failed(r, q, d, true, "a transfer to its decode node failed");
        return;
    }
    /* The node that reports it failed it (a lease that expired: its
     * prefill node went silent). */
    kvf_router_node_t *blamed = e->status == KVF_ERR_TIMEOUT && sender_is(d, sender) ? p
                                : sender_is(p, sender) ? p
                                                       : d;
    attempt_failed(r, q, blamed, d != p, "a node failed it");
}
