#include "router.h"

#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvf/clientsock.h"
#include "kvf/clock.h"
#include "kvf/log.h"
#include "kvf/model.h"
#include "kvf/msg.h"
#include "kvf/tokenizer.h"
#include "metrics.h"

#define ROUTER_MAX_NODES 256
#define ROUTER_REQ_BUCKETS 1024
#define ROUTER_MAX_EXCLUDED 8
#define ROUTER_MAX_STOP 8
#define ROUTER_ID_LEN 64
#define ROUTER_URL_LEN 256
/* Sends to nodes must not stall the loop: a node's outbox is connected when
 * it registers (the reply may wait for that), later sends wait briefly. */
#define ROUTER_SEND_TIMEOUT_MS 20
#define ROUTER_CONNECT_TIMEOUT_MS 500

typedef enum {
    NODE_LIVE = 0,
    NODE_DRAINING = 1,
    NODE_DEAD = 2,
} node_state_t;

static const char *const node_state_names[] = {"live", "draining", "dead"};

/* One registered node. */
typedef struct {
    bool used;
    char id[ROUTER_ID_LEN];
    Kvf__Role role;
    char inbox[ROUTER_URL_LEN];
    uint32_t block_size;
    uint32_t capacity_blocks;
    uint8_t *xfer_desc; /* (xfer_desc_len) owned */
    size_t xfer_desc_len;
    uint32_t max_running;
    uint32_t max_context;
    bool prefill_local;
    node_state_t state;
    /* From the last heartbeat. */
    uint32_t blocks_free, blocks_used, blocks_total, running, queued_requests;
    uint64_t queued_tokens;
    /* Work handed out since that heartbeat (not in its numbers yet). */
    uint32_t pending_blocks, pending_running;
    uint64_t pending_tokens;
    uint64_t last_seen_ns;
    uint64_t registered_ns;
    uint64_t dispatched; /* request attempts sent to it */
} rnode_t;

typedef enum {
    REQ_QUEUED = 0,
    REQ_PREFILL = 1,
    REQ_DECODE = 2,
} req_state_t;

typedef struct req req_t;
struct req {
    uint64_t id;
    uint64_t epoch;
    req_state_t state;
    /* Who asked: where the output goes. */
    kvf_router_sink_t sink;
    /* What. */
    uint32_t *prompt; /* (n_prompt) */
    uint32_t n_prompt;
    uint32_t *gen; /* (n_gen) tokens streamed so far, cap_gen allocated */
    uint32_t n_gen, cap_gen;
    float temperature, top_p;
    uint32_t top_k;
    uint64_t seed;
    bool has_seed;
    uint32_t max_tokens;
    bool ignore_eos;
    char *stop[ROUTER_MAX_STOP];
    size_t n_stop;
    uint64_t rng_state;  /* sampler state after the last streamed token */
    /* Tokens of the current epoch that arrived before its first token
     * (the decode node's chunks can overtake the prefill node's
     * PrefillDone): positions [held_first, held_first + n_held). */
    uint32_t *held;
    uint32_t held_first, n_held, cap_held;
    int held_finish;
    uint32_t gen_at_dispatch; /* n_gen when the current epoch was sent */
    /* Where. */
    int prefill_node; /* index in nodes, -1 */
    int decode_node;
    int excluded[ROUTER_MAX_EXCLUDED]; /* decode nodes that refused this attempt */
    int n_excluded;
    unsigned attempts;
    /* Text for the client and stop strings. */
    kvf_detok_t detok;
    char *text; /* (text_len) everything streamed as text so far */
    size_t text_len, text_cap;
    size_t text_sent;
    /* Timing. */
    uint64_t t_arrival_ns, t_queued_ns, t_first_ns, deadline_ns;
    uint64_t t_last_token_ns; /* when the client got its latest token (metrics) */
    uint64_t t_progress_ns; /* the current attempt's last sign of progress */
    uint64_t prefill_compute_us, handoff_us, kv_bytes;
    req_t *hash_next;
    req_t *queue_next;
    req_t *all_prev, *all_next;
};

struct kvf_router {
    kvf_router_config_t cfg;
    kvf_model_config_t model;
    kvf_tokenizer_t *tok;
    kvf_inbox_t *inbox;
    kvf_client_server_t *clients;
    kvf_outboxes_t *outboxes;
    rnode_t nodes[ROUTER_MAX_NODES];
    /* Cluster-wide KV agreement, set by the first node to register. */
    char fingerprint[64];
    Kvf__KvGeometry geometry;
    bool have_geometry;
    req_t *buckets[ROUTER_REQ_BUCKETS];
    req_t *all; /* every live request */
    req_t *queue_head, *queue_tail;
    unsigned queue_len;
    struct native_sink *natives; /* live requests of native clients */
    /* Work handed over by other threads (kvf_router_post). */
    pthread_mutex_t post_lock;
    struct posted *posted, *posted_tail;
    int post_fd; /* eventfd: readable while work is posted */
    uint64_t next_req_id;
    /* Counters. */
    uint64_t n_requests, n_running, n_failed, n_cancelled, n_completed, n_stale, n_malformed;
    uint64_t n_redispatched;
    kvf_metrics_t *metrics; /* owned */
};

/* ---- small helpers --------------------------------------------------------- */

static rnode_t *node_at(kvf_router_t *r, int idx)
{
    return idx >= 0 && idx < ROUTER_MAX_NODES && r->nodes[idx].used ? &r->nodes[idx] : NULL;
}

static int node_find(kvf_router_t *r, const char *id)
{
    for (int i = 0; i < ROUTER_MAX_NODES; i++)
        if (r->nodes[i].used && !strcmp(r->nodes[i].id, id))
            return i;
    return -1;
}

static const char *role_str(Kvf__Role role)
{
    return role == KVF__ROLE__ROLE_PREFILL ? "prefill"
           : role == KVF__ROLE__ROLE_DECODE ? "decode"
                                            : "other";
}

static void send_to(kvf_router_t *r, const char *url, kvf_envelope_t *env)
{
    env->sender = "router";
    kvf_status_t st = kvf_outboxes_send(r->outboxes, url, env, ROUTER_SEND_TIMEOUT_MS);
    if (st != KVF_OK)
        kvf_log_warn("send %s to %s: %s", kvf_envelope_body_name(env), url, kvf_status_str(st));
}

static req_t *req_find(kvf_router_t *r, uint64_t id)
{
    for (req_t *q = r->buckets[id % ROUTER_REQ_BUCKETS]; q; q = q->hash_next)
        if (q->id == id)
            return q;
    return NULL;
}

static uint32_t blocks_for(uint32_t tokens, uint32_t block_size)
{
    return block_size ? (tokens + block_size - 1) / block_size : tokens;
}

/* ---- output ---------------------------------------------------------------- */

/* Hands a chunk of q's output to its sink. */
static void emit(req_t *q, kvf_router_chunk_t *chunk)
{
    chunk->req_id = q->id;
    chunk->prompt_tokens = q->n_prompt;
    chunk->completion_tokens = q->n_gen;
    if (!chunk->text)
        chunk->text = "";
    q->sink.on_chunk(q->sink.arg, chunk);
}

/* Answers a request that never entered the table. */
static void reject(kvf_router_t *r, const kvf_router_sink_t *sink, kvf_status_t status,
                   const char *message)
{
    kvf_router_chunk_t chunk = {
        .finish = KVF__FINISH_REASON__FINISH_ERROR,
        .status = status,
        .error = message,
        .text = "",
    };
    sink->on_chunk(sink->arg, &chunk);
    r->n_failed++;
    kvf_metrics_observe_rejected(r->metrics);
}

/* ---- request table ---------------------------------------------------------- */

static void queue_remove(kvf_router_t *r, req_t *q)
{
    req_t **pp = &r->queue_head, *prev = NULL;
    while (*pp && *pp != q) {
        prev = *pp;
        pp = &(*pp)->queue_next;
    }
    if (!*pp)
        return;
    *pp = q->queue_next;
    if (r->queue_tail == q)
        r->queue_tail = prev;
    q->queue_next = NULL;
    r->queue_len--;
}

static void queue_push(kvf_router_t *r, req_t *q)
{
    q->state = REQ_QUEUED;
    q->queue_next = NULL;
    if (r->queue_tail)
        r->queue_tail->queue_next = q;
    else
        r->queue_head = q;
    r->queue_tail = q;
    r->queue_len++;
}

static void req_free(kvf_router_t *r, req_t *q)
{
    if (q->state == REQ_QUEUED)
        queue_remove(r, q);
    req_t **pp = &r->buckets[q->id % ROUTER_REQ_BUCKETS];
    while (*pp && *pp != q)
        pp = &(*pp)->hash_next;
    if (*pp)
        *pp = q->hash_next;
    if (q->all_prev)
        q->all_prev->all_next = q->all_next;
    else
        r->all = q->all_next;
    if (q->all_next)
        q->all_next->all_prev = q->all_prev;
    kvf_detok_fini(&q->detok);
    for (size_t i = 0; i < q->n_stop; i++)
        free(q->stop[i]);
    free(q->prompt);
    free(q->gen);
    free(q->held);
    free(q->text);
    free(q);
    r->n_running--;
}

/* Tells the nodes working on q's current epoch to drop it. */
static void req_cancel_nodes(kvf_router_t *r, req_t *q, const char *reason)
{
    Kvf__Cancel c = KVF__CANCEL__INIT;
    c.req_id = q->id;
    c.epoch = q->epoch;
    c.reason = (char *)reason;
    kvf_envelope_t env;
    kvf_envelope_init(&env, "router");
    env.body_case = KVF__ENVELOPE__BODY_CANCEL;
    env.cancel = &c;
    rnode_t *p = node_at(r, q->prefill_node), *d = node_at(r, q->decode_node);
    if (p && p->state != NODE_DEAD)
        send_to(r, p->inbox, &env);
    if (d && d->state != NODE_DEAD && d != p)
        send_to(r, d->inbox, &env);
}

/* Ends q towards the client and removes it. */
static void req_finish(kvf_router_t *r, req_t *q, Kvf__FinishReason reason, kvf_status_t status,
                       const char *error)
{
    const char *tail = NULL;
    size_t tail_len = 0;
    if (reason != KVF__FINISH_REASON__FINISH_ERROR &&
        reason != KVF__FINISH_REASON__FINISH_CANCELLED)
        kvf_detok_flush(&q->detok, &tail, &tail_len);
    kvf_router_chunk_t chunk = {
        .text = tail_len ? tail : "",
        .text_len = tail_len,
        .finish = reason,
        .status = status,
        .error = error ? error : "",
        .ttft_us = q->t_first_ns ? (q->t_first_ns - q->t_arrival_ns) / 1000 : 0,
        .prefill_compute_us = q->prefill_compute_us,
        .handoff_us = q->handoff_us,
        .kv_bytes = q->kv_bytes,
    };
    emit(q, &chunk);
    kvf_metrics_observe_finished(r->metrics, reason, q->n_prompt, q->n_gen,
                                 kvf_clock_ns() - q->t_arrival_ns);
    if (reason == KVF__FINISH_REASON__FINISH_ERROR)
        r->n_failed++;
    else if (reason == KVF__FINISH_REASON__FINISH_CANCELLED)
        r->n_cancelled++;
    else
        r->n_completed++;
    kvf_log_debug("request %llu finished (%d) after %u tokens", (unsigned long long)q->id,
                  (int)reason, q->n_gen);
    req_free(r, q);
}

/* ---- scheduling ------------------------------------------------------------- */

static bool excluded(const req_t *q, int idx)
{
    for (int i = 0; i < q->n_excluded; i++)
        if (q->excluded[i] == idx)
            return true;
    return false;
}

/* The decode node with the most room left after q, or -1. */
static int pick_decode(kvf_router_t *r, const req_t *q, uint32_t tokens)
{
    int best = -1;
    int64_t best_room = 0;
    for (int i = 0; i < ROUTER_MAX_NODES; i++) {
        rnode_t *n = &r->nodes[i];
        if (!n->used || n->role != KVF__ROLE__ROLE_DECODE || n->state != NODE_LIVE ||
            excluded(q, i))
            continue;
        if (n->max_context && tokens > n->max_context)
            continue;
        int64_t need = blocks_for(tokens, n->block_size);
        int64_t room = (int64_t)n->blocks_free - n->pending_blocks - need;
        if (room < 0)
            continue;
        if (n->max_running && n->running + n->pending_running >= n->max_running)
            continue;
        /* Free room first; among equals the one running fewer sequences. */
        room = room * 1024 - (n->running + n->pending_running);
        if (best < 0 || room > best_room) {
            best = i;
            best_room = room;
        }
    }
    return best;
}

/* The prefill node with the fewest queued prompt tokens; a prefill-local
 * decode node d itself when there is no prefill node. */
static int pick_prefill(kvf_router_t *r, int d)
{
    int best = -1;
    uint64_t best_load = 0;
    for (int i = 0; i < ROUTER_MAX_NODES; i++) {
        rnode_t *n = &r->nodes[i];
        if (!n->used || n->role != KVF__ROLE__ROLE_PREFILL || n->state != NODE_LIVE)
            continue;
        uint64_t load = n->queued_tokens + n->pending_tokens;
        if (best < 0 || load < best_load) {
            best = i;
            best_load = load;
        }
    }
    if (best < 0 && d >= 0 && r->nodes[d].prefill_local)
        best = d;
    return best;
}

/* Sends q's current epoch to prefill node p and decode node d. */
static void dispatch(kvf_router_t *r, req_t *q, int p, int d)
{
    rnode_t *pn = &r->nodes[p], *dn = &r->nodes[d];
    q->epoch++;
    q->attempts++;
    q->prefill_node = p;
    q->decode_node = d;
    q->state = REQ_PREFILL;
    q->gen_at_dispatch = q->n_gen;
    q->n_held = 0;
    q->held_finish = KVF__FINISH_REASON__FINISH_NONE;
    q->t_progress_ns = kvf_clock_ns();
    uint32_t n_tokens = q->n_prompt + q->n_gen;
    uint32_t remaining = q->max_tokens - q->n_gen;
    dn->pending_blocks += blocks_for(n_tokens + remaining, dn->block_size);
    dn->pending_running++;
    pn->pending_tokens += n_tokens;
    dn->dispatched++;
    if (pn != dn)
        pn->dispatched++;

    uint32_t *ids = malloc((size_t)n_tokens * sizeof(*ids));
    if (!ids) {
        req_finish(r, q, KVF__FINISH_REASON__FINISH_ERROR, KVF_ERR_NOMEM, "out of memory");
        return;
    }
    memcpy(ids, q->prompt, (size_t)q->n_prompt * sizeof(*ids));
    if (q->n_gen)
        memcpy(ids + q->n_prompt, q->gen, (size_t)q->n_gen * sizeof(*ids));
    Kvf__Sampling s = KVF__SAMPLING__INIT;
    s.temperature = q->temperature;
    s.top_p = q->top_p;
    s.top_k = q->top_k;
    s.seed = q->seed;
    s.has_seed = q->has_seed;
    s.max_tokens = remaining;
    s.ignore_eos = q->ignore_eos;
    Kvf__PrefillRequest pr = KVF__PREFILL_REQUEST__INIT;
    pr.req_id = q->id;
    pr.epoch = q->epoch;
    pr.token_ids = ids;
    pr.n_token_ids = n_tokens;
    pr.sampling = &s;
    pr.decode_node_id = dn->id;
    pr.decode_inbox = dn->inbox;
    pr.decode_xfer_desc.data = dn->xfer_desc;
    pr.decode_xfer_desc.len = dn->xfer_desc_len;
    pr.n_generated = q->n_gen;
    pr.rng_state = q->rng_state;
    kvf_envelope_t env;
    kvf_envelope_init(&env, "router");
    env.body_case = KVF__ENVELOPE__BODY_PREFILL_REQUEST;
    env.prefill_request = &pr;
    kvf_log_debug("request %llu epoch %llu: prefill %s, decode %s, %u tokens",
                  (unsigned long long)q->id, (unsigned long long)q->epoch, pn->id, dn->id,
                  n_tokens);
    send_to(r, pn->inbox, &env);
    free(ids);
}

/* Places q: dispatches it when a decode and a prefill node can take it,
 * queues it otherwise (or fails it when the queue is full). */
static void schedule(kvf_router_t *r, req_t *q)
{
    if (q->attempts >= r->cfg.max_attempts) {
        req_finish(r, q, KVF__FINISH_REASON__FINISH_ERROR, KVF_ERR_PEER,
                   "request failed on every attempt");
        return;
    }
    uint32_t tokens = q->n_prompt + q->max_tokens;
    int d = pick_decode(r, q, tokens);
    int p = d >= 0 ? pick_prefill(r, d) : -1;
    if (d >= 0 && p >= 0) {
        dispatch(r, q, p, d);
        return;
    }
    /* A request no live decode node could ever hold would wait in vain. */
    uint32_t largest = 0, need = 0;
    bool any_decode = false;
    for (int i = 0; i < ROUTER_MAX_NODES; i++) {
        rnode_t *n = &r->nodes[i];
        if (!n->used || n->role != KVF__ROLE__ROLE_DECODE || n->state == NODE_DEAD)
            continue;
        any_decode = true;
        need = blocks_for(tokens, n->block_size);
        if (n->capacity_blocks >= need && (!n->max_context || tokens <= n->max_context))
            largest = need;
        else if (largest < need && n->capacity_blocks > largest)
            largest = n->capacity_blocks;
    }
    if (any_decode && largest < need) {
        char why[160];
        snprintf(why, sizeof(why),
                 "request needs %u KV blocks (%u tokens); the largest decode node holds %u",
                 need, tokens, largest);
        req_finish(r, q, KVF__FINISH_REASON__FINISH_ERROR, KVF_ERR_TOO_BIG, why);
        return;
    }
    if (r->queue_len >= r->cfg.max_queue) {
        req_finish(r, q, KVF__FINISH_REASON__FINISH_ERROR, KVF_ERR_NO_SPACE,
                   "overloaded: no decode node has room and the wait queue is full");
        return;
    }
    q->t_queued_ns = kvf_clock_ns();
    queue_push(r, q);
}

/* Dispatches queued requests, oldest first, while nodes have room. */
static void drain_queue(kvf_router_t *r)
{
    while (r->queue_head) {
        req_t *q = r->queue_head;
        uint32_t tokens = q->n_prompt + q->max_tokens;
        q->n_excluded = 0;
        int d = pick_decode(r, q, tokens);
        int p = d >= 0 ? pick_prefill(r, d) : -1;
        if (d < 0 || p < 0)
            return;
        queue_remove(r, q);
        dispatch(r, q, p, d);
    }
}

/* Sends q again (new epoch) after its nodes failed it; the tokens already
 * streamed stay and the next prefill continues after them. */
static void redispatch(kvf_router_t *r, req_t *q, const char *why)
{
    kvf_log_info("request %llu epoch %llu: %s; dispatching again", (unsigned long long)q->id,
                 (unsigned long long)q->epoch, why);
    r->n_redispatched++;
    req_cancel_nodes(r, q, why);
    q->prefill_node = -1;
    q->decode_node = -1;
    schedule(r, q);
}

/* ---- streaming tokens --------------------------------------------------------- */

static kvf_status_t text_append(req_t *q, const char *s, size_t n)
{
    if (q->text_len + n + 1 > q->text_cap) {
        size_t cap = q->text_cap ? q->text_cap * 2 : 256;
        while (cap < q->text_len + n + 1)
            cap *= 2;
        char *t = realloc(q->text, cap);
        if (!t)
            return KVF_ERR_NOMEM;
        q->text = t;
        q->text_cap = cap;
    }
    memcpy(q->text + q->text_len, s, n);
    q->text_len += n;
    q->text[q->text_len] = '\0';
    return KVF_OK;
}

/* Earliest stop-string match in q->text at or after from; -1 if none. */
static long stop_match(const req_t *q, size_t from)
{
    long best = -1;
    for (size_t i = 0; i < q->n_stop; i++) {
        size_t sl = strlen(q->stop[i]);
        size_t start = from >= sl ? from - sl + 1 : 0;
        const char *hit = q->text_len >= sl ? memmem(q->text + start, q->text_len - start,
                                                     q->stop[i], sl)
                                            : NULL;
        if (hit && (best < 0 || hit - q->text < best))
            best = hit - q->text;
    }
    return best;
}

/* Keeps tokens at positions [first, first + n) until the positions before
 * them arrive. False when they do not continue what is held already. */
static bool hold_tokens(req_t *q, uint32_t first, const uint32_t *tokens, size_t n, int finish)
{
    if (q->n_held == 0) {
        q->held_first = first;
    } else if (first > q->held_first + q->n_held || first < q->held_first) {
        return false;
    }
    uint32_t skip = q->held_first + q->n_held - first; /* already held */
    if (skip > n)
        skip = (uint32_t)n;
    size_t add = n - skip;
    if (q->n_held + add > q->cap_held) {
        uint32_t cap = q->cap_held ? q->cap_held : 16;
        while (cap < q->n_held + add)
            cap *= 2;
        uint32_t *h = realloc(q->held, (size_t)cap * sizeof(*h));
        if (!h)
            return false;
        q->held = h;
        q->cap_held = cap;
    }
    /* A chunk of no new tokens (a finish alone, or a resend) may come
     * before anything is held: q->held and tokens may then be NULL. */
    if (add) {
        memcpy(q->held + q->n_held, tokens + skip, add * sizeof(*tokens));
        q->n_held += (uint32_t)add;
    }
    if (finish != KVF__FINISH_REASON__FINISH_NONE)
        q->held_finish = finish;
    return true;
}

static bool stream_tokens(kvf_router_t *r, req_t *q, uint32_t first, const uint32_t *tokens,
                          size_t n, Kvf__FinishReason node_finish);

/* Streams what was held once the gap before it is closed. Returns true
 * when q was finished (and freed). */
static bool release_held(kvf_router_t *r, req_t *q)
{
    if ((!q->n_held && q->held_finish == KVF__FINISH_REASON__FINISH_NONE) ||
        q->held_first > q->n_gen)
        return false;
    uint32_t *held = q->held, first = q->held_first, n = q->n_held;
    int finish = q->held_finish;
    q->held = NULL;
    q->n_held = q->cap_held = 0;
    q->held_finish = KVF__FINISH_REASON__FINISH_NONE;
    bool done = stream_tokens(r, q, first, held, n, (Kvf__FinishReason)finish);
    free(held);
    return done;
}

/* Appends tokens at positions [first, first + n) of q's generation (tokens
 * it already has are skipped), streams them to the client and checks the
 * stop conditions. Returns true when q was finished (and freed). */
static bool stream_tokens(kvf_router_t *r, req_t *q, uint32_t first, const uint32_t *tokens,
                          size_t n, Kvf__FinishReason node_finish)
{
    if (first > q->n_gen) {
        if (q->n_gen == q->gen_at_dispatch && hold_tokens(q, first, tokens, n, node_finish))
            return false; /* waits for the epoch's first token */
        /* A gap: a message of this epoch got lost. Try again from what the
         * client has. */
        redispatch(r, q, "token stream has a gap");
        return false;
    }
    q->t_progress_ns = kvf_clock_ns();
    Kvf__FinishReason finish = KVF__FINISH_REASON__FINISH_NONE;
    uint32_t gen_before = q->n_gen;
    size_t text_before = q->text_len;
    for (size_t i = 0; i < n; i++) {
        uint32_t pos = first + (uint32_t)i;
        if (pos < q->n_gen)
            continue; /* already streamed (a resent chunk) */
        uint32_t t = tokens[i];
        if (!q->ignore_eos && kvf_model_is_eos(&r->model, t)) {
            finish = KVF__FINISH_REASON__FINISH_STOP;
            break;
        }
        if (q->n_gen == q->cap_gen) {
            uint32_t cap = q->cap_gen ? q->cap_gen * 2 : 64;
            uint32_t *g = realloc(q->gen, (size_t)cap * sizeof(*g));
            if (!g) {
                req_finish(r, q, KVF__FINISH_REASON__FINISH_ERROR, KVF_ERR_NOMEM,
                           "out of memory");
                return true;
            }
            q->gen = g;
            q->cap_gen = cap;
        }
        q->gen[q->n_gen++] = t;
        const char *piece;
        size_t piece_len;
        if (kvf_detok_push(&q->detok, t, &piece, &piece_len) == KVF_OK && piece_len)
            text_append(q, piece, piece_len);
        if (q->n_gen >= q->max_tokens) {
            finish = KVF__FINISH_REASON__FINISH_LENGTH;
            break;
        }
    }
    if (q->n_stop) {
        long at = stop_match(q, text_before);
        if (at >= 0) {
            q->text_len = (size_t)at; /* the stop string itself is not output */
            finish = KVF__FINISH_REASON__FINISH_STOP;
        }
    }
    if (finish == KVF__FINISH_REASON__FINISH_NONE &&
        node_finish != KVF__FINISH_REASON__FINISH_NONE)
        finish = node_finish;
    /* The new tokens are q->gen[gen_before, n_gen). */
    size_t n_new = q->n_gen - gen_before;
    if (n_new || q->text_len > q->text_sent) {
        size_t text_new = q->text_len > q->text_sent ? q->text_len - q->text_sent : 0;
        char *text = strndup(q->text ? q->text + q->text_sent : "", text_new);
        kvf_router_chunk_t chunk = {
            .tokens = n_new ? q->gen + gen_before : NULL,
            .n_tokens = n_new,
            .text = text ? text : "",
            .text_len = text ? text_new : 0,
        };
        if (gen_before == 0 && q->t_first_ns)
            chunk.ttft_us = (q->t_first_ns - q->t_arrival_ns) / 1000;
        q->text_sent += text_new;
        kvf_metrics_observe_tokens(r->metrics, q->t_arrival_ns, &q->t_last_token_ns,
                                   q->n_gen - gen_before, kvf_clock_ns());
        emit(q, &chunk);
        free(text);
    }
    if (finish != KVF__FINISH_REASON__FINISH_NONE) {
        if (node_finish == KVF__FINISH_REASON__FINISH_NONE)
            req_cancel_nodes(r, q, "finished");
        if (finish == KVF__FINISH_REASON__FINISH_STOP && q->n_stop)
            q->text_sent = q->text_len; /* nothing after the stop string */
        req_finish(r, q, finish, KVF_OK, NULL);
        return true;
    }
    return false;
}

/* ---- node messages ---------------------------------------------------------- */

static void reply_register(kvf_router_t *r, const char *url, const char *node_id,
                           kvf_status_t status, const char *error)
{
    Kvf__RegisterReply rr = KVF__REGISTER_REPLY__INIT;
    rr.node_id = (char *)node_id;
    rr.status = status;
    rr.error = (char *)(error ? error : "");
    rr.heartbeat_ms = r->cfg.heartbeat_ms;
    kvf_envelope_t env;
    kvf_envelope_init(&env, "router");
    env.body_case = KVF__ENVELOPE__BODY_REGISTER_REPLY;
    env.register_reply = &rr;
    env.sender = "router";
    kvf_status_t st = kvf_outboxes_send(r->outboxes, url, &env, ROUTER_CONNECT_TIMEOUT_MS);
    if (st != KVF_OK)
        kvf_log_warn("register reply to %s: %s", url, kvf_status_str(st));
}

/* Re-dispatches every request that used node idx (it died or left). */
static void node_lost(kvf_router_t *r, int idx, const char *why)
{
    rnode_t *n = &r->nodes[idx];
    kvf_log_warn("node %s (%s) %s", n->id, role_str(n->role), why);
    kvf_outboxes_forget(r->outboxes, n->inbox);
    req_t *next;
    for (req_t *q = r->all; q; q = next) {
        next = q->all_next;
        if (q->state == REQ_QUEUED || (q->prefill_node != idx && q->decode_node != idx))
            continue;
        if (q->prefill_node == idx && q->decode_node != idx && q->state == REQ_DECODE)
            continue; /* its prefill was done: the decode node carries on */
        redispatch(r, q, why);
    }
}

static void on_register(kvf_router_t *r, const Kvf__Register *reg)
{
    if (!reg->inbox_url || !*reg->inbox_url || strlen(reg->inbox_url) >= ROUTER_URL_LEN) {
        kvf_log_warn("register without a usable inbox dropped");
        r->n_malformed++;
        return;
    }
    const char *why = NULL;
    char msg[256];
    const Kvf__KvGeometry *g = reg->geometry;
    if (!*reg->node_id || strlen(reg->node_id) >= ROUTER_ID_LEN)
        why = "node id missing or too long";
    else if (reg->role != KVF__ROLE__ROLE_PREFILL && reg->role != KVF__ROLE__ROLE_DECODE)
        why = "role must be prefill or decode";
    else if (!g || g->block_size == 0 || g->block_size > 256)
        why = "KV geometry missing or block size outside 1..256";
    else if ((int)g->n_layers != r->model.n_layers || (int)g->n_kv_heads != r->model.n_kv_heads ||
             (int)g->head_dim != r->model.head_dim) {
        snprintf(msg, sizeof(msg),
                 "KV geometry %u layers x %u kv heads x %u head dim does not match the model "
                 "(%d x %d x %d)",
                 g->n_layers, g->n_kv_heads, g->head_dim, r->model.n_layers,
                 r->model.n_kv_heads, r->model.head_dim);
        why = msg;
    } else if (r->have_geometry && (g->block_size != r->geometry.block_size ||
                                    g->dtype != r->geometry.dtype ||
                                    g->layout != r->geometry.layout)) {
        snprintf(msg, sizeof(msg),
                 "KV block size %u / dtype %d / layout %u differ from the cluster's (%u / %d / "
                 "%u)",
                 g->block_size, (int)g->dtype, g->layout, r->geometry.block_size,
                 (int)r->geometry.dtype, r->geometry.layout);
        why = msg;
    } else if (r->fingerprint[0] && strcmp(r->fingerprint, reg->model_fingerprint) != 0) {
        snprintf(msg, sizeof(msg), "model fingerprint %.32s differs from the cluster's %s",
                 reg->model_fingerprint, r->fingerprint);
        why = msg;
    } else if (reg->role == KVF__ROLE__ROLE_DECODE && reg->xfer_desc.len == 0) {
        why = "decode node without a transfer descriptor";
    }
    if (why) {
        kvf_log_warn("refused node %s at %s: %s", reg->node_id, reg->inbox_url, why);
        reply_register(r, reg->inbox_url, reg->node_id, KVF_ERR_MISMATCH, why);
        return;
    }
    int idx = node_find(r, reg->node_id);
    if (idx >= 0 && r->nodes[idx].state != NODE_DEAD &&
        r->nodes[idx].registered_ns + 1000000000ull * 2 > kvf_clock_ns() &&
        !strcmp(r->nodes[idx].inbox, reg->inbox_url)) {
        /* A repeated Register (our reply crossed its retry): answer again. */
        reply_register(r, reg->inbox_url, reg->node_id, KVF_OK, NULL);
        return;
    }
    if (idx >= 0) {
        /* The same id again: the node restarted; what it held is gone. */
        node_lost(r, idx, "registered again (restarted)");
        free(r->nodes[idx].xfer_desc);
        memset(&r->nodes[idx], 0, sizeof(r->nodes[idx]));
    } else {
        for (int i = 0; i < ROUTER_MAX_NODES && idx < 0; i++)
            if (!r->nodes[i].used)
                idx = i;
        if (idx < 0) {
            reply_register(r, reg->inbox_url, reg->node_id, KVF_ERR_NO_SPACE,
                           "the router's node table is full");
            return;
        }
    }
    rnode_t *n = &r->nodes[idx];
    n->xfer_desc = reg->xfer_desc.len ? malloc(reg->xfer_desc.len) : NULL;
    if (reg->xfer_desc.len && !n->xfer_desc)
        return;
    if (reg->xfer_desc.len)
        memcpy(n->xfer_desc, reg->xfer_desc.data, reg->xfer_desc.len);
    n->xfer_desc_len = reg->xfer_desc.len;
    n->used = true;
    snprintf(n->id, sizeof(n->id), "%s", reg->node_id);
    snprintf(n->inbox, sizeof(n->inbox), "%s", reg->inbox_url);
    n->role = reg->role;
    n->block_size = g->block_size;
    n->capacity_blocks = reg->capacity_blocks;
    n->max_running = reg->max_running;
    n->max_context = reg->max_context;
    n->prefill_local = reg->prefill_local;
    n->state = NODE_LIVE;
    n->blocks_free = n->blocks_total = reg->capacity_blocks;
    n->last_seen_ns = n->registered_ns = kvf_clock_ns();
    if (!r->have_geometry) {
        r->geometry = *g;
        r->geometry.base.descriptor = &kvf__kv_geometry__descriptor;
        r->have_geometry = true;
    }
    if (!r->fingerprint[0])
        snprintf(r->fingerprint, sizeof(r->fingerprint), "%s", reg->model_fingerprint);
    kvf_log_info("node %s registered: %s%s at %s, %u blocks of %u tokens", n->id,
                 role_str(n->role), n->prefill_local ? " (+prefill)" : "", n->inbox,
                 n->capacity_blocks, n->block_size);
    reply_register(r, n->inbox, n->id, KVF_OK, NULL);
    drain_queue(r);
}

static void on_heartbeat(kvf_router_t *r, const Kvf__Heartbeat *hb)
{
    int idx = node_find(r, hb->node_id);
    if (idx < 0 || r->nodes[idx].state == NODE_DEAD) {
        if (*hb->inbox_url && strlen(hb->inbox_url) < ROUTER_URL_LEN) {
            Kvf__Error e = KVF__ERROR__INIT;
            e.status = KVF_ERR_NOT_FOUND;
            e.message = "unknown node: register again";
            kvf_envelope_t env;
            kvf_envelope_init(&env, "router");
            env.body_case = KVF__ENVELOPE__BODY_ERROR;
            env.error = &e;
            send_to(r, hb->inbox_url, &env);
        }
        return;
    }
    rnode_t *n = &r->nodes[idx];
    n->last_seen_ns = kvf_clock_ns();
    if (hb->load) {
        n->blocks_free = hb->load->blocks_free;
        n->blocks_used = hb->load->blocks_used;
        n->blocks_total = hb->load->blocks_total;
        n->running = hb->load->running;
        n->queued_requests = hb->load->queued_requests;
        n->queued_tokens = hb->load->queued_tokens;
    }
    n->pending_blocks = n->pending_running = 0;
    n->pending_tokens = 0;
    node_state_t st = strcmp(hb->state, "draining") == 0 ? NODE_DRAINING : NODE_LIVE;
    if (st != n->state)
        kvf_log_info("node %s is %s", n->id, node_state_names[st]);
    n->state = st;
    drain_queue(r);
}

static void on_deregister(kvf_router_t *r, const Kvf__Deregister *d)
{
    int idx = node_find(r, d->node_id);
    if (idx < 0)
        return;
    node_lost(r, idx, "deregistered");
    kvf_log_info("node %s left: %s", r->nodes[idx].id, d->reason);
    free(r->nodes[idx].xfer_desc);
    memset(&r->nodes[idx], 0, sizeof(r->nodes[idx]));
}

/* The request q names, if (req_id, epoch) is its current attempt. */
static req_t *req_current(kvf_router_t *r, uint64_t id, uint64_t epoch, const char *what)
{
    req_t *q = req_find(r, id);
    if (!q || q->epoch != epoch || q->state == REQ_QUEUED) {
        r->n_stale++;
        kvf_log_debug("%s for request %llu epoch %llu: stale, dropped", what,
                      (unsigned long long)id, (unsigned long long)epoch);
        return NULL;
    }
    return q;
}

static void on_prefill_done(kvf_router_t *r, const Kvf__PrefillDone *pd)
{
    req_t *q = req_current(r, pd->req_id, pd->epoch, "prefill done");
    if (!q)
        return;
    q->prefill_compute_us += pd->prefill_compute_us;
    q->handoff_us += pd->handoff_us;
    q->kv_bytes += pd->kv_bytes;
    kvf_metrics_observe_handoff(r->metrics, pd->handoff_us, pd->kv_bytes);
    if (q->state == REQ_PREFILL)
        q->state = REQ_DECODE;
    if (!q->t_first_ns)
        q->t_first_ns = kvf_clock_ns();
    if (!stream_tokens(r, q, q->gen_at_dispatch, &pd->first_token, 1,
                       KVF__FINISH_REASON__FINISH_NONE))
        release_held(r, q);
}

static void on_token_chunk(kvf_router_t *r, const Kvf__TokenChunk *c)
{
    req_t *q = req_current(r, c->req_id, c->epoch, "tokens");
    if (!q)
        return;
    if (c->n_tokens > c->n_generated) {
        r->n_malformed++;
        return;
    }
    if (q->state == REQ_PREFILL)
        q->state = REQ_DECODE;
    if (!q->t_first_ns && c->n_tokens)
        q->t_first_ns = kvf_clock_ns();
    q->rng_state = c->rng_state;
    /* n_generated counts every token of the request, earlier epochs'
     * included, so each token lands at its position exactly once. */
    uint32_t first = c->n_generated - (uint32_t)c->n_tokens;
    stream_tokens(r, q, first, c->tokens, c->n_tokens, c->finish_reason);
}

static void on_error(kvf_router_t *r, const Kvf__Error *e, const char *sender)
{
    req_t *q = req_current(r, e->req_id, e->epoch, "error");
    if (!q)
        return;
    kvf_log_info("request %llu epoch %llu: %s reports %s: %s", (unsigned long long)q->id,
                 (unsigned long long)q->epoch, sender, kvf_status_str((kvf_status_t)e->status),
                 e->message);
    if (e->status == KVF_ERR_NO_SPACE) {
        /* The decode node refused: try another one, or wait. */
        if (q->n_excluded < ROUTER_MAX_EXCLUDED)
            q->excluded[q->n_excluded++] = q->decode_node;
        q->prefill_node = q->decode_node = -1;
        q->attempts--; /* a refusal is not a failure */
        schedule(r, q);
        return;
    }
    if (e->status == KVF_ERR_INVAL || e->status == KVF_ERR_TOO_BIG ||
        e->status == KVF_ERR_UNSUPPORTED) {
        req_cancel_nodes(r, q, "invalid");
        req_finish(r, q, KVF__FINISH_REASON__FINISH_ERROR, (kvf_status_t)e->status,
                   *e->message ? e->message : "request refused by a node");
        return;
    }
    redispatch(r, q, "a node failed it");
}

static void handle_node_message(kvf_router_t *r, kvf_envelope_t *env)
{
    switch (env->body_case) {
    case KVF__ENVELOPE__BODY_REGISTER: on_register(r, env->register_); break;
    case KVF__ENVELOPE__BODY_HEARTBEAT: on_heartbeat(r, env->heartbeat); break;
    case KVF__ENVELOPE__BODY_DEREGISTER: on_deregister(r, env->deregister); break;
    case KVF__ENVELOPE__BODY_PREFILL_DONE: on_prefill_done(r, env->prefill_done); break;
    case KVF__ENVELOPE__BODY_TOKEN_CHUNK: on_token_chunk(r, env->token_chunk); break;
    case KVF__ENVELOPE__BODY_TOKEN_BATCH:
        for (size_t i = 0; i < env->token_batch->n_chunks; i++)
            on_token_chunk(r, env->token_batch->chunks[i]);
        break;
    case KVF__ENVELOPE__BODY_ERROR: on_error(r, env->error, env->sender); break;
    default:
        r->n_malformed++;
        kvf_log_warn("unexpected %s from %s dropped", kvf_envelope_body_name(env), env->sender);
    }
}

/* ---- client messages ------------------------------------------------------------ */

static kvf_status_t validate_generate(kvf_router_t *r, const kvf_router_gen_t *g, char *why,
                                      size_t why_len)
{
    if (!isfinite(g->temperature) || g->temperature < 0 || g->temperature > 100) {
        snprintf(why, why_len, "temperature %g is outside 0..100", g->temperature);
        return KVF_ERR_INVAL;
    }
    if (!isfinite(g->top_p) || g->top_p < 0 || g->top_p > 1) {
        snprintf(why, why_len, "top_p %g is outside 0..1", g->top_p);
        return KVF_ERR_INVAL;
    }
    if (g->top_k > (uint32_t)r->model.vocab) {
        snprintf(why, why_len, "top_k %u is larger than the vocabulary (%d)", g->top_k,
                 r->model.vocab);
        return KVF_ERR_INVAL;
    }
    if (g->n_stop > ROUTER_MAX_STOP) {
        snprintf(why, why_len, "at most %d stop strings", ROUTER_MAX_STOP);
        return KVF_ERR_INVAL;
    }
    for (size_t i = 0; i < g->n_stop; i++) {
        if (!g->stop[i] || !g->stop[i][0]) {
            snprintf(why, why_len, "empty stop string");
            return KVF_ERR_INVAL;
        }
    }
    for (size_t i = 0; i < g->n_ids; i++) {
        if (g->ids[i] >= (uint32_t)r->model.vocab) {
            snprintf(why, why_len, "prompt id %u is outside the vocabulary (%d)", g->ids[i],
                     r->model.vocab);
            return KVF_ERR_INVAL;
        }
    }
    return KVF_OK;
}

uint64_t kvf_router_submit(kvf_router_t *r, const kvf_router_gen_t *g,
                           const kvf_router_sink_t *sink)
{
    char why[256];
    kvf_status_t st = validate_generate(r, g, why, sizeof(why));
    if (st != KVF_OK) {
        reject(r, sink, st, why);
        return 0;
    }
    uint32_t *ids = NULL;
    size_t n = 0;
    if (g->n_ids) {
        ids = malloc(g->n_ids * sizeof(*ids));
        if (!ids) {
            reject(r, sink, KVF_ERR_NOMEM, "out of memory");
            return 0;
        }
        memcpy(ids, g->ids, g->n_ids * sizeof(*ids));
        n = g->n_ids;
    } else if (!g->prompt || !*g->prompt) {
        reject(r, sink, KVF_ERR_INVAL, "empty prompt");
        return 0;
    } else if (kvf_tokenizer_encode(r->tok, g->prompt ? g->prompt : "",
                                    g->prompt ? strlen(g->prompt) : 0, true, &ids,
                                    &n) != KVF_OK) {
        reject(r, sink, KVF_ERR_INVAL, "prompt does not tokenize");
        return 0;
    }
    if (n == 0) {
        free(ids);
        reject(r, sink, KVF_ERR_INVAL, "empty prompt");
        return 0;
    }
    if (n >= (size_t)r->model.max_pos) {
        snprintf(why, sizeof(why), "prompt of %zu tokens does not fit the context of %d", n,
                 r->model.max_pos);
        free(ids);
        reject(r, sink, KVF_ERR_TOO_BIG, why);
        return 0;
    }
    req_t *q = calloc(1, sizeof(*q));
    if (!q) {
        free(ids);
        reject(r, sink, KVF_ERR_NOMEM, "out of memory");
        return 0;
    }
    q->id = r->next_req_id++;
    q->sink = *sink;
    q->prompt = ids;
    q->n_prompt = (uint32_t)n;
    q->prefill_node = q->decode_node = -1;
    uint32_t room = (uint32_t)r->model.max_pos - q->n_prompt;
    q->max_tokens = g->max_tokens ? g->max_tokens : r->cfg.default_max_tokens;
    if (q->max_tokens > room)
        q->max_tokens = room;
    q->temperature = g->temperature;
    q->top_p = g->top_p;
    q->top_k = g->top_k;
    q->seed = g->seed;
    q->has_seed = g->has_seed;
    q->ignore_eos = g->ignore_eos;
    for (size_t i = 0; i < g->n_stop; i++) {
        q->stop[q->n_stop] = strdup(g->stop[i]);
        if (q->stop[q->n_stop])
            q->n_stop++;
    }
    kvf_detok_init(&q->detok, r->tok);
    q->t_arrival_ns = kvf_clock_ns();
    q->deadline_ns = q->t_arrival_ns + (uint64_t)r->cfg.request_timeout_ms * 1000000ull;
    q->hash_next = r->buckets[q->id % ROUTER_REQ_BUCKETS];
    r->buckets[q->id % ROUTER_REQ_BUCKETS] = q;
    q->all_next = r->all;
    if (r->all)
        r->all->all_prev = q;
    r->all = q;
    r->n_requests++;
    r->n_running++;
    uint64_t id = q->id;
    kvf_log_debug("request %llu: %u prompt tokens, max %u new", (unsigned long long)id,
                  q->n_prompt, q->max_tokens);
    schedule(r, q);
    return id;
}

void kvf_router_cancel(kvf_router_t *r, uint64_t req_id)
{
    req_t *q = req_find(r, req_id);
    if (!q)
        return;
    req_cancel_nodes(r, q, "cancelled by the client");
    req_finish(r, q, KVF__FINISH_REASON__FINISH_CANCELLED, KVF_ERR_CANCELLED, "cancelled");
}

/* ---- native clients ------------------------------------------------------------ */

/* The sink of a request from the native client socket: one per request,
 * freed with its last chunk. */
typedef struct native_sink native_sink_t;
struct native_sink {
    kvf_router_t *router;
    kvf_client_hdr_t hdr;
    uint64_t client_req_id;
    uint64_t req_id;
    uint32_t seq;
    native_sink_t *next; /* the router's list of live native requests */
};

static void native_unlink(kvf_router_t *r, native_sink_t *ns)
{
    for (native_sink_t **pp = &r->natives; *pp; pp = &(*pp)->next) {
        if (*pp == ns) {
            *pp = ns->next;
            return;
        }
    }
}

static void native_on_chunk(void *arg, const kvf_router_chunk_t *c)
{
    native_sink_t *ns = arg;
    Kvf__GenerateChunk chunk = KVF__GENERATE_CHUNK__INIT;
    chunk.client_req_id = ns->client_req_id;
    chunk.seq = ns->seq++;
    chunk.tokens = (uint32_t *)c->tokens;
    chunk.n_tokens = c->n_tokens;
    chunk.text = (char *)c->text;
    chunk.finish_reason = (Kvf__FinishReason)c->finish;
    chunk.status = c->status;
    chunk.error = (char *)(c->error ? c->error : "");
    chunk.prompt_tokens = c->prompt_tokens;
    chunk.ttft_us = c->ttft_us;
    chunk.prefill_compute_us = c->prefill_compute_us;
    chunk.handoff_us = c->handoff_us;
    chunk.kv_bytes = c->kv_bytes;
    kvf_envelope_t env;
    kvf_envelope_init(&env, "router");
    env.body_case = KVF__ENVELOPE__BODY_GENERATE_CHUNK;
    env.generate_chunk = &chunk;
    kvf_status_t st = kvf_client_server_send(ns->router->clients, &ns->hdr, &env);
    if (st != KVF_OK)
        kvf_log_warn("request %llu: reply to client: %s", (unsigned long long)c->req_id,
                     kvf_status_str(st));
    if (c->finish != KVF__FINISH_REASON__FINISH_NONE) {
        native_unlink(ns->router, ns);
        free(ns);
    }
}

static void on_generate(kvf_router_t *r, const Kvf__GenerateRequest *g,
                        const kvf_client_hdr_t *hdr)
{
    native_sink_t *ns = calloc(1, sizeof(*ns));
    if (!ns)
        return;
    ns->router = r;
    ns->hdr = *hdr;
    ns->client_req_id = g->client_req_id;
    ns->next = r->natives;
    r->natives = ns;
    const Kvf__Sampling *s = g->sampling;
    kvf_router_gen_t gen = {
        .prompt = g->prompt,
        .ids = g->prompt_ids,
        .n_ids = g->n_prompt_ids,
    };
    if (s) {
        gen.max_tokens = s->max_tokens;
        gen.temperature = s->temperature;
        gen.top_p = s->top_p;
        gen.top_k = s->top_k;
        gen.seed = s->seed;
        gen.has_seed = s->has_seed;
        gen.ignore_eos = s->ignore_eos;
        gen.stop = (const char *const *)s->stop;
        gen.n_stop = s->n_stop;
    }
    kvf_router_sink_t sink = {native_on_chunk, ns};
    /* The id the request will get. A refused (or at once finished) request
     * has had its final chunk, and ns is gone: do not touch it after. */
    ns->req_id = r->next_req_id;
    kvf_router_submit(r, &gen, &sink);
}

static void on_client_cancel(kvf_router_t *r, const Kvf__Cancel *c, const kvf_client_hdr_t *hdr)
{
    /* A client names its own request id; it is unique per connection (the
     * pipe id, the header's first 4 bytes). */
    for (native_sink_t *ns = r->natives; ns; ns = ns->next) {
        if (ns->client_req_id == c->req_id && ns->hdr.len >= 4 && hdr->len >= 4 &&
            !memcmp(ns->hdr.bytes, hdr->bytes, 4)) {
            kvf_router_cancel(r, ns->req_id);
            return;
        }
    }
}

static void on_stats(kvf_router_t *r, const Kvf__StatsRequest *sr, const kvf_client_hdr_t *hdr)
{
    Kvf__NodeStats ns[ROUTER_MAX_NODES], *nsp[ROUTER_MAX_NODES];
    Kvf__Load loads[ROUTER_MAX_NODES];
    size_t n = 0;
    uint64_t now = kvf_clock_ns();
    for (int i = 0; i < ROUTER_MAX_NODES; i++) {
        rnode_t *node = &r->nodes[i];
        if (!node->used)
            continue;
        kvf__node_stats__init(&ns[n]);
        kvf__load__init(&loads[n]);
        loads[n].blocks_free = node->blocks_free;
        loads[n].blocks_used = node->blocks_used;
        loads[n].blocks_total = node->blocks_total;
        loads[n].running = node->running;
        loads[n].queued_requests = node->queued_requests;
        loads[n].queued_tokens = node->queued_tokens;
        ns[n].node_id = node->id;
        ns[n].role = node->role;
        ns[n].state = (char *)node_state_names[node->state];
        ns[n].load = &loads[n];
        ns[n].inbox_url = node->inbox;
        ns[n].age_ms = (now - node->registered_ns) / 1000000u;
        ns[n].dispatched = node->dispatched;
        nsp[n] = &ns[n];
        n++;
    }
    Kvf__StatsReply rep = KVF__STATS_REPLY__INIT;
    rep.req_id = sr->req_id;
    rep.nodes = nsp;
    rep.n_nodes = n;
    rep.requests_total = r->n_requests;
    rep.requests_running = r->n_running - r->queue_len;
    rep.requests_queued = r->queue_len;
    rep.requests_failed = r->n_failed;
    rep.requests_cancelled = r->n_cancelled;
    rep.stale_dropped = r->n_stale;
    rep.redispatched = r->n_redispatched;
    kvf_envelope_t env;
    kvf_envelope_init(&env, "router");
    env.body_case = KVF__ENVELOPE__BODY_STATS_REPLY;
    env.stats_reply = &rep;
    kvf_client_server_send(r->clients, hdr, &env);
}

static void handle_client_message(kvf_router_t *r, kvf_envelope_t *env,
                                  const kvf_client_hdr_t *hdr)
{
    switch (env->body_case) {
    case KVF__ENVELOPE__BODY_GENERATE_REQUEST: on_generate(r, env->generate_request, hdr); break;
    case KVF__ENVELOPE__BODY_CANCEL: on_client_cancel(r, env->cancel, hdr); break;
    case KVF__ENVELOPE__BODY_STATS_REQUEST: on_stats(r, env->stats_request, hdr); break;
    default:
        r->n_malformed++;
        kvf_log_warn("unexpected %s on the client socket dropped", kvf_envelope_body_name(env));
    }
}

/* ---- timers ------------------------------------------------------------------- */

static void check_timers(kvf_router_t *r)
{
    uint64_t now = kvf_clock_ns();
    uint64_t dead_ns =
        (uint64_t)r->cfg.heartbeat_ms * r->cfg.dead_after_missed * 1000000ull;
    for (int i = 0; i < ROUTER_MAX_NODES; i++) {
        rnode_t *n = &r->nodes[i];
        if (n->used && n->state != NODE_DEAD && now - n->last_seen_ns > dead_ns) {
            n->state = NODE_DEAD;
            node_lost(r, i, "missed its heartbeats: dead");
        }
    }
    /* Re-dispatching above stamps requests with a newer time than now. */
    now = kvf_clock_ns();
    req_t *next;
    for (req_t *q = r->all; q; q = next) {
        next = q->all_next;
        if (q->t_progress_ns > now)
            continue;
        if (now > q->deadline_ns) {
            req_cancel_nodes(r, q, "timed out");
            req_finish(r, q, KVF__FINISH_REASON__FINISH_ERROR, KVF_ERR_TIMEOUT,
                       "request timed out");
        } else if (q->state == REQ_QUEUED &&
                   now - q->t_queued_ns > (uint64_t)r->cfg.queue_timeout_ms * 1000000ull) {
            req_finish(r, q, KVF__FINISH_REASON__FINISH_ERROR, KVF_ERR_NO_SPACE,
                       "overloaded: no decode node could take the request in time");
        } else if (q->state == REQ_PREFILL &&
                   now - q->t_progress_ns > (uint64_t)r->cfg.prefill_timeout_ms * 1000000ull) {
            redispatch(r, q, "no first token within the prefill timeout");
        } else if (q->state == REQ_DECODE &&
                   now - q->t_progress_ns > (uint64_t)r->cfg.stall_timeout_ms * 1000000ull) {
            redispatch(r, q, "no token within the stall timeout");
        }
    }
}

/* ---- work from other threads ---------------------------------------------------- */

typedef struct posted posted_t;
struct posted {
    void (*fn)(kvf_router_t *, void *);
    void *arg;
    posted_t *next;
};

kvf_status_t kvf_router_post(kvf_router_t *r, void (*fn)(kvf_router_t *, void *), void *arg)
{
    posted_t *p = malloc(sizeof(*p));
    if (!p)
        return KVF_ERR_NOMEM;
    p->fn = fn;
    p->arg = arg;
    p->next = NULL;
    pthread_mutex_lock(&r->post_lock);
    if (r->posted_tail)
        r->posted_tail->next = p;
    else
        r->posted = p;
    r->posted_tail = p;
    pthread_mutex_unlock(&r->post_lock);
    uint64_t one = 1;
    ssize_t w = write(r->post_fd, &one, sizeof(one));
    (void)w; /* the counter saturating still leaves the fd readable */
    return KVF_OK;
}

static void run_posted(kvf_router_t *r)
{
    uint64_t count;
    ssize_t rd = read(r->post_fd, &count, sizeof(count));
    (void)rd;
    pthread_mutex_lock(&r->post_lock);
    posted_t *p = r->posted;
    r->posted = r->posted_tail = NULL;
    pthread_mutex_unlock(&r->post_lock);
    while (p) {
        posted_t *next = p->next;
        p->fn(r, p->arg);
        free(p);
        p = next;
    }
}

const kvf_model_config_t *kvf_router_model(const kvf_router_t *r)
{
    return &r->model;
}

const kvf_tokenizer_t *kvf_router_tokenizer(const kvf_router_t *r)
{
    return r->tok;
}

const char *kvf_router_model_dir(const kvf_router_t *r)
{
    return r->cfg.model_dir;
}

/* ---- health and metrics ---------------------------------------------------------- */

kvf_status_t kvf_router_health(kvf_router_t *r, char *why, size_t why_len)
{
    unsigned prefill = 0, decode = 0, decode_local = 0;
    for (int i = 0; i < ROUTER_MAX_NODES; i++) {
        const rnode_t *n = &r->nodes[i];
        if (!n->used || n->state != NODE_LIVE)
            continue;
        if (n->role == KVF__ROLE__ROLE_PREFILL)
            prefill++;
        else if (n->role == KVF__ROLE__ROLE_DECODE)
            n->prefill_local ? decode_local++ : decode++;
    }
    if (decode + decode_local == 0) {
        snprintf(why, why_len, "no live decode node (%u live prefill)", prefill);
        return KVF_ERR_AGAIN;
    }
    if (prefill == 0 && decode_local == 0) {
        snprintf(why, why_len,
                 "no live prefill node and no decode node with --prefill-local (%u live decode)",
                 decode);
        return KVF_ERR_AGAIN;
    }
    snprintf(why, why_len, "%u prefill, %u decode (%u with --prefill-local) live", prefill,
             decode + decode_local, decode_local);
    return KVF_OK;
}

kvf_status_t kvf_router_snapshot(kvf_router_t *r, kvf_router_snapshot_t *snap)
{
    size_t n = 0;
    for (int i = 0; i < ROUTER_MAX_NODES; i++)
        n += r->nodes[i].used;
    kvf_router_node_info_t *nodes = calloc(n ? n : 1, sizeof(*nodes));
    if (!nodes)
        return KVF_ERR_NOMEM;
    size_t k = 0;
    for (int i = 0; i < ROUTER_MAX_NODES; i++) {
        const rnode_t *node = &r->nodes[i];
        if (!node->used)
            continue;
        kvf_router_node_info_t *info = &nodes[k++];
        snprintf(info->id, sizeof(info->id), "%s", node->id);
        info->role = role_str(node->role);
        info->state = node_state_names[node->state];
        info->prefill_local = node->prefill_local;
        info->blocks_used = node->blocks_used;
        info->blocks_total = node->blocks_total;
        info->running = node->running;
        info->queued_requests = node->queued_requests;
        info->queued_tokens = node->queued_tokens;
        info->dispatched = node->dispatched;
    }
    snap->requests_queued = r->queue_len;
    snap->requests_running = (uint32_t)(r->n_running - r->queue_len);
    snap->n_nodes = n;
    snap->nodes = nodes;
    return KVF_OK;
}

void kvf_router_snapshot_fini(kvf_router_snapshot_t *snap)
{
    free(snap->nodes);
    snap->nodes = NULL;
    snap->n_nodes = 0;
}

kvf_metrics_t *kvf_router_metrics(kvf_router_t *r)
{
    return r->metrics;
}

/* ---- lifecycle ----------------------------------------------------------------- */

kvf_status_t kvf_router_create(const kvf_router_config_t *cfg, kvf_router_t **router_p)
{
    kvf_router_t *r = calloc(1, sizeof(*r));
    if (!r)
        return KVF_ERR_NOMEM;
    r->cfg = *cfg;
    if (!r->cfg.heartbeat_ms)
        r->cfg.heartbeat_ms = 500;
    if (!r->cfg.dead_after_missed)
        r->cfg.dead_after_missed = 3;
    if (!r->cfg.max_attempts)
        r->cfg.max_attempts = 5;
    if (!r->cfg.default_max_tokens)
        r->cfg.default_max_tokens = 256;
    if (!r->cfg.prefill_timeout_ms)
        r->cfg.prefill_timeout_ms = 60000;
    if (!r->cfg.stall_timeout_ms)
        r->cfg.stall_timeout_ms = 30000;
    r->next_req_id = 1;
    r->post_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (r->post_fd < 0) {
        free(r);
        return KVF_ERR_IO;
    }
    pthread_mutex_init(&r->post_lock, NULL);
    kvf_status_t st = kvf_model_config_load(cfg->model_dir, &r->model);
    if (st != KVF_OK)
        goto fail_model;
    st = kvf_tokenizer_load(cfg->model_dir, &r->tok);
    if (st != KVF_OK)
        goto fail_model;
    st = kvf_inbox_create(cfg->listen_url, 0, &r->inbox);
    if (st != KVF_OK)
        goto fail_inbox;
    st = kvf_client_server_create(cfg->client_url, &r->clients);
    if (st != KVF_OK)
        goto fail_clients;
    st = kvf_outboxes_create(ROUTER_MAX_NODES, &r->outboxes);
    if (st != KVF_OK)
        goto fail_outboxes;
    st = kvf_metrics_create(&r->metrics);
    if (st != KVF_OK)
        goto fail_metrics;
    *router_p = r;
    return KVF_OK;
fail_metrics:
    kvf_outboxes_destroy(r->outboxes);
fail_outboxes:
    kvf_client_server_destroy(r->clients);
fail_clients:
    kvf_inbox_destroy(r->inbox);
fail_inbox:
    kvf_tokenizer_destroy(r->tok);
fail_model:
    pthread_mutex_destroy(&r->post_lock);
    close(r->post_fd);
    free(r);
    return st;
}

void kvf_router_destroy(kvf_router_t *r)
{
    if (!r)
        return;
    while (r->all)
        req_free(r, r->all);
    while (r->natives) {
        native_sink_t *ns = r->natives;
        r->natives = ns->next;
        free(ns);
    }
    while (r->posted) {
        posted_t *p = r->posted;
        r->posted = p->next;
        free(p);
    }
    pthread_mutex_destroy(&r->post_lock);
    if (r->post_fd >= 0)
        close(r->post_fd);
    for (int i = 0; i < ROUTER_MAX_NODES; i++)
        free(r->nodes[i].xfer_desc);
    kvf_outboxes_destroy(r->outboxes);
    kvf_client_server_destroy(r->clients);
    kvf_inbox_destroy(r->inbox);
    kvf_tokenizer_destroy(r->tok);
    kvf_metrics_destroy(r->metrics);
    free(r);
}

kvf_status_t kvf_router_run(kvf_router_t *r, volatile sig_atomic_t *stop)
{
    kvf_log_info("serving: nodes at %s, clients at %s", r->cfg.listen_url, r->cfg.client_url);
    uint64_t next_timer = 0;
    while (!*stop) {
        struct pollfd fds[3] = {
            {.fd = kvf_inbox_fd(r->inbox), .events = POLLIN},
            {.fd = kvf_client_server_fd(r->clients), .events = POLLIN},
            {.fd = r->post_fd, .events = POLLIN},
        };
        int rc = poll(fds, 3, 50);
        if (rc > 0 && (fds[2].revents & POLLIN))
            run_posted(r);
        for (int burst = 0; burst < 256; burst++) {
            kvf_envelope_t *env = NULL;
            kvf_status_t st = kvf_inbox_recv(r->inbox, 0, &env);
            if (st == KVF_ERR_AGAIN)
                break;
            if (st != KVF_OK) {
                r->n_malformed++;
                continue;
            }
            handle_node_message(r, env);
            kvf_envelope_free(env);
        }
        for (int burst = 0; burst < 256; burst++) {
            kvf_envelope_t *env = NULL;
            kvf_client_hdr_t hdr;
            kvf_status_t st = kvf_client_server_recv(r->clients, &env, &hdr);
            if (st == KVF_ERR_AGAIN)
                break;
            if (st != KVF_OK) {
                r->n_malformed++;
                continue;
            }
            handle_client_message(r, env, &hdr);
            kvf_envelope_free(env);
        }
        uint64_t now = kvf_clock_ns();
        if (now >= next_timer) {
            check_timers(r);
            next_timer = now + 100000000ull;
        }
    }
    kvf_log_info("stopping: %llu requests served, %llu failed, %llu cancelled, %llu stale "
                 "messages dropped",
                 (unsigned long long)r->n_completed, (unsigned long long)r->n_failed,
                 (unsigned long long)r->n_cancelled, (unsigned long long)r->n_stale);
    return KVF_OK;
}
