/* The heartbeat thread of a node (kvf/node.h): the loop publishes
 * snapshots (load, the attempts it works on, the leases it holds) and the
 * thread sends the newest one every period, whatever the loop is doing.
 * Three snapshot buffers rotate: the loop builds one, one is published,
 * the thread sends from the third; swapping them is the only work under
 * the lock. */
#include "node_internal.h"

#include "kvf/array.h"
#include "kvf/clock.h"
#include "kvf/log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A snapshot is published every period / NODE_PUBLISH_DIVISOR. */
#define NODE_PUBLISH_DIVISOR 4
/* A loop that is this many times later than its longest gap so far is stuck. */
#define NODE_STUCK_GAPS 8
/* Send timeout of a beat's messages: never wait for a slow peer. */
#define NODE_BEAT_SEND_MS 0

/* ---- snapshots ----------------------------------------------------------- */

static void snap_reset(kvf_node_snapshot_t *s)
{
    for (size_t i = 0; i < s->n_urls; i++)
        free(s->urls[i]);
    s->n_urls = s->n_work = s->n_leases = 0;
    Kvf__Load init = KVF__LOAD__INIT;
    s->load = init;
}

static void snap_free(kvf_node_snapshot_t *s)
{
    snap_reset(s);
    free(s->urls);
    free(s->work);
    free(s->leases);
    memset(s, 0, sizeof(*s));
}

kvf_status_t kvf_node_snapshot_work(kvf_node_snapshot_t *s, uint64_t req_id, uint64_t epoch,
                                    uint32_t done)
{
    if (kvf_array_reserve(&s->work, &s->cap_work, s->n_work + 1, 16, sizeof(*s->work)) != KVF_OK)
        return KVF_ERR_NOMEM;
    Kvf__WorkRef w = KVF__WORK_REF__INIT;
    w.req_id = req_id;
    w.epoch = epoch;
    w.done = done;
    s->work[s->n_work++] = w;
    return KVF_OK;
}

/* Index of url in s->urls, added when new; -1 when out of memory. */
static long snap_url(kvf_node_snapshot_t *s, const char *url)
{
    for (size_t i = 0; i < s->n_urls; i++)
        if (!strcmp(s->urls[i], url))
            return (long)i;
    if (kvf_array_reserve(&s->urls, &s->cap_urls, s->n_urls + 1, 4, sizeof(*s->urls)) != KVF_OK)
        return -1;
    char *copy = strdup(url);
    if (!copy)
        return -1;
    s->urls[s->n_urls] = copy;
    return (long)s->n_urls++;
}

kvf_status_t kvf_node_snapshot_lease(kvf_node_snapshot_t *s, const char *url, uint64_t req_id,
                                     uint64_t epoch)
{
    long u = snap_url(s, url);
    if (u < 0 ||
        kvf_array_reserve(&s->leases, &s->cap_leases, s->n_leases + 1, 16, sizeof(*s->leases)) !=
            KVF_OK)
        return KVF_ERR_NOMEM;
    s->leases[s->n_leases++] = (node_lease_t){.url = (uint32_t)u, .req_id = req_id, .epoch = epoch};
    return KVF_OK;
}

/* ---- the loop's side ------------------------------------------------------ */

void kvf_node__beat_tick(kvf_node_t *node, uint64_t now)
{
    node_beat_t *b = &node->beat;
    if (now < b->next_publish_ns)
        return;
    kvf_node_snapshot_t *s = b->building;
    snap_reset(s);
    if (node->cfg.fill_load)
        node->cfg.fill_load(node->cfg.load_arg, &s->load);
    if (node->cfg.fill_work)
        node->cfg.fill_work(node->cfg.load_arg, s);
    uint64_t gap = b->last_taken_ns ? now - b->last_taken_ns : 0;
    s->taken_ns = b->last_taken_ns = now;
    pthread_mutex_lock(&b->lock);
    if (gap > b->longest_gap_ns)
        b->longest_gap_ns = gap;
    b->building = b->published;
    b->published = s;
    b->fresh = true;
    uint64_t period = (uint64_t)b->period_ms * 1000000ull;
    pthread_mutex_unlock(&b->lock);
    b->next_publish_ns = now + period / NODE_PUBLISH_DIVISOR;
}

int kvf_node__beat_timeout_ms(const kvf_node_t *node)
{
    return kvf_clock_ms_until(node->beat.next_publish_ns);
}

void kvf_node__beat_set_registered(kvf_node_t *node, bool registered, unsigned period_ms)
{
    node_beat_t *b = &node->beat;
    pthread_mutex_lock(&b->lock);
    if (period_ms)
        b->period_ms = period_ms;
    pthread_mutex_unlock(&b->lock);
    /* The first beat carries this moment's load. */
    b->next_publish_ns = 0;
    if (registered)
        kvf_node__beat_tick(node, kvf_clock_ns());
    pthread_mutex_lock(&b->lock);
    b->registered = registered;
    b->beat_now = registered;
    pthread_cond_signal(&b->wake);
    pthread_mutex_unlock(&b->lock);
    /* A beat that checked the flag before it changed ends before this. */
    pthread_mutex_lock(&b->send_lock);
    pthread_mutex_unlock(&b->send_lock);
}

void kvf_node__beat_set_draining(kvf_node_t *node, bool draining)
{
    node_beat_t *b = &node->beat;
    pthread_mutex_lock(&b->lock);
    b->draining = draining;
    b->beat_now = true;
    pthread_cond_signal(&b->wake);
    pthread_mutex_unlock(&b->lock);
    b->next_publish_ns = 0;
}

/* ---- the thread ------------------------------------------------------------ */

/* Whether the loop that published s still runs (kvf/node.h); longest_gap:
 * between its snapshots so far. */
static bool loop_alive(const kvf_node_t *node, uint64_t longest_gap, const kvf_node_snapshot_t *s,
                       uint64_t now)
{
    uint64_t stuck = (uint64_t)node->cfg.loop_stuck_ms * 1000000ull;
    if (longest_gap * NODE_STUCK_GAPS > stuck)
        stuck = longest_gap * NODE_STUCK_GAPS;
    return s->taken_ns && now - s->taken_ns <= stuck;
}

/* Room for n refs in the thread's scratch. */
static bool scratch_reserve(node_beat_t *b, size_t n)
{
    return kvf_array_reserve(&b->ptrs, &b->cap_ptrs, n, 16, sizeof(*b->ptrs)) == KVF_OK &&
           kvf_array_reserve(&b->refs, &b->cap_refs, n, 16, sizeof(*b->refs)) == KVF_OK;
}

static void send_heartbeat(kvf_node_t *node, kvf_node_snapshot_t *s, bool alive, bool draining)
{
    node_beat_t *b = &node->beat;
    Kvf__Heartbeat hb = KVF__HEARTBEAT__INIT;
    Kvf__Load load = s->load;
    /* Out of memory: the load alone (what the node holds then times out
     * where it is held). */
    if (alive && !scratch_reserve(b, s->n_work))
        alive = false;
    for (size_t i = 0; alive && i < s->n_work; i++)
        b->ptrs[i] = &s->work[i];
    hb.node_id = node->node_id;
    hb.seq = b->seq++;
    hb.load = &load;
    hb.inbox_url = node->listen_url;
    hb.state = draining ? "draining" : "live";
    hb.working = alive ? b->ptrs : NULL;
    hb.n_working = alive ? s->n_work : 0;
    if (node->desc_changed) /* (send_lock held: not replaced meanwhile) */
        hb.xfer_desc = (ProtobufCBinaryData){node->cfg.xfer_desc_len, node->xfer_desc};
    kvf_envelope_t env;
    kvf_envelope_init(&env, node->node_id);
    env.body_case = KVF__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    env.reg_token = (ProtobufCBinaryData){node->reg_token_len, node->reg_token};
    /* One that cannot go now is skipped: the next carries fresher load. */
    (void)kvf_outbox_send(b->router, &env, NODE_BEAT_SEND_MS);
}

/* One KvLease per peer URL named in s, for the leases held there. */
static void send_leases(kvf_node_t *node, kvf_node_snapshot_t *s)
{
    node_beat_t *b = &node->beat;
    if (!s->n_leases || !scratch_reserve(b, s->n_leases))
        return;
    Kvf__WorkRef *refs = b->refs, **ptrs = b->ptrs;
    for (size_t u = 0; u < s->n_urls; u++) {
        size_t n = 0;
        for (size_t i = 0; i < s->n_leases; i++) {
            if (s->leases[i].url != u)
                continue;
            Kvf__WorkRef w = KVF__WORK_REF__INIT;
            w.req_id = s->leases[i].req_id;
            w.epoch = s->leases[i].epoch;
            refs[n] = w;
            ptrs[n] = &refs[n];
            n++;
        }
        Kvf__KvLease kl = KVF__KV_LEASE__INIT;
        kl.prefill_node_id = node->node_id;
        kl.reply_inbox = node->listen_url;
        kl.sent_ns = kvf_clock_ns();
        kl.refs = ptrs;
        kl.n_refs = n;
        kvf_envelope_t env;
        kvf_envelope_init(&env, node->node_id);
        env.body_case = KVF__ENVELOPE__BODY_KV_LEASE;
        env.kv_lease = &kl;
        (void)kvf_outboxes_send(b->peers, s->urls[u], &env, NODE_BEAT_SEND_MS);
    }
}

/* Waits until the next beat is due (or a wake-up asks for one now);
 * false when the thread should end. Called and returns with b->lock. */
static bool beat_wait(node_beat_t *b, uint64_t due_ns)
{
    while (!b->stop && !b->beat_now) {
        uint64_t now = kvf_clock_ns();
        if (now >= due_ns)
            break;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t wait = due_ns - now;
        ts.tv_sec += (time_t)(wait / 1000000000ull);
        ts.tv_nsec += (long)(wait % 1000000000ull);
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        int rc = pthread_cond_timedwait(&b->wake, &b->lock, &ts);
        if (rc != 0 && rc != ETIMEDOUT && rc != EINTR)
            break;
    }
    b->beat_now = false;
    return !b->stop;
}

static void *beat_main(void *arg)
{
    kvf_node_t *node = arg;
    node_beat_t *b = &node->beat;
    uint64_t due = 0;
    pthread_mutex_lock(&b->lock);
    while (beat_wait(b, due)) {
        pthread_mutex_unlock(&b->lock);
        pthread_mutex_lock(&b->send_lock);
        pthread_mutex_lock(&b->lock);
        bool registered = b->registered, draining = b->draining;
        uint64_t longest_gap = b->longest_gap_ns;
        if (b->fresh) {
            kvf_node_snapshot_t *t = b->sending;
            b->sending = b->published;
            b->published = t;
            b->fresh = false;
        }
        due = kvf_clock_ns() + (uint64_t)b->period_ms * 1000000ull;
        pthread_mutex_unlock(&b->lock);
        if (registered) {
            kvf_node_snapshot_t *s = b->sending;
            bool alive = loop_alive(node, longest_gap, s, kvf_clock_ns());
            send_heartbeat(node, s, alive, draining);
            if (alive)
                send_leases(node, s);
        }
        pthread_mutex_unlock(&b->send_lock);
        pthread_mutex_lock(&b->lock);
    }
    pthread_mutex_unlock(&b->lock);
    return NULL;
}

/* ---- lifetime -------------------------------------------------------------- */

kvf_status_t kvf_node__beat_init(kvf_node_t *node)
{
    node_beat_t *b = &node->beat;
    memset(b, 0, sizeof(*b));
    b->period_ms = node->cfg.heartbeat_ms;
    b->building = &b->snaps[0];
    b->published = &b->snaps[1];
    b->sending = &b->snaps[2];
    kvf_status_t st = kvf_outbox_create(node->router_url, &b->router);
    if (st != KVF_OK)
        return st;
    st = kvf_outboxes_create(0, &b->peers);
    if (st != KVF_OK) {
        kvf_outbox_destroy(b->router);
        return st;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&b->wake, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&b->lock, NULL);
    pthread_mutex_init(&b->send_lock, NULL);
    return KVF_OK;
}

kvf_status_t kvf_node__beat_start(kvf_node_t *node)
{
    node_beat_t *b = &node->beat;
    if (pthread_create(&b->thread, NULL, beat_main, node) != 0)
        return KVF_ERR_NOMEM;
    b->started = true;
    return KVF_OK;
}

void kvf_node__beat_fini(kvf_node_t *node)
{
    node_beat_t *b = &node->beat;
    if (b->started) {
        pthread_mutex_lock(&b->lock);
        b->stop = true;
        pthread_cond_signal(&b->wake);
        pthread_mutex_unlock(&b->lock);
        pthread_join(b->thread, NULL);
        b->started = false;
    }
    kvf_outboxes_destroy(b->peers);
    kvf_outbox_destroy(b->router);
    for (int i = 0; i < 3; i++)
        snap_free(&b->snaps[i]);
    free(b->ptrs);
    free(b->refs);
    pthread_cond_destroy(&b->wake);
    pthread_mutex_destroy(&b->lock);
    pthread_mutex_destroy(&b->send_lock);
}
