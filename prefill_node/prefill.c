/* kvf-prefill's event loop, request table and scheduler. See prefill.h for
 * the request lifecycle and plan.h for the shipping rule. */
#include "prefill.h"
#include "plan.h"

#include "kvf/backend.h"
#include "kvf/clock.h"
#include "kvf/engine.h"
#include "kvf/kvcache.h"
#include "kvf/log.h"
#include "kvf/model.h"
#include "kvf/msg.h"
#include "kvf/node.h"
#include "kvf/sampling.h"
#include "kvf/xfer.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Send timeouts from the loop (PROTOCOL.md: short, a failed send is a lost
 * message). The first message to a new decode node gets a little longer so
 * its outbox can connect. */
#define PF_SEND_MS 50
/* How long a post that the transport answers AGAIN is retried. */
#define PF_POST_AGAIN_MS 200
/* How often an unsent KvAlloc is retried. */
#define PF_ALLOC_RETRY_MS 10
/* Bounded wait for transfers to end when the node stops. */
#define PF_STOP_DRAIN_MS 2000
/* A graceful drain (SIGTERM) gives up what is left after this long. */
#define PF_DRAIN_TIMEOUT_MS 60000
/* Chunk shapes (plan.h): chunks end on multiples of the CPU backend's
 * attention tile (16 query tokens) and leave no tail shorter than two
 * tiles, so a chunked prefill writes the bits a one-forward prefill would. */
#define PF_CHUNK_ALIGN    16
#define PF_CHUNK_MIN_TAIL 32
/* Forwards of at most this many tokens run the CPU backend's few-row
 * projection kernels (KVF_CPU_GEMV_MAX_M, private to the backend), larger
 * ones BLAS; the two round differently, so pick_forward keeps prompts on
 * the kernels their one-forward prefill would use. */
#define PF_FEW_ROWS 8
/* Lease margin: a request whose lease ends sooner than this is not started. */
#define PF_LEASE_MARGIN_NS (50ull * 1000000ull)

typedef enum {
    REQ_WAIT_ALLOC, /* KvAlloc sent (or to be sent); waiting for the reply */
    REQ_CANCELLED,  /* cancelled before the reply came: abort what D reserves */
    REQ_READY,      /* D reserved blocks; chunks being computed */
    REQ_SHIPPING,   /* computed and first token sampled; batches completing */
    REQ_ABORTING,   /* given up; local blocks freed once no batch runs */
} req_state_t;

/* A connection to one decode node's pool, shared by its requests. A peer
 * that failed, or whose node came back with another descriptor, is stale:
 * no new request uses it, and it is disconnected once its last user ends
 * (kvf_xfer_disconnect invalidates the handle). */
typedef struct pf_peer {
    struct pf_peer *next;
    char *node_id; /* owned */
    uint8_t *desc; /* owned copy of the descriptor it was made from */
    size_t desc_len;
    kvf_xfer_peer_t *xp; /* belongs to the xfer handle */
    unsigned users;      /* requests holding it */
    bool stale;
} pf_peer_t;

typedef struct pf_req {
    struct pf_req *next, *prev; /* the request table, in arrival order */
    kvf_envelope_t *env;        /* the PrefillRequest (owned): tokens, sampling, D */
    const Kvf__PrefillRequest *pr;
    uint64_t req_id, epoch;
    uint32_t n_prompt;
    req_state_t state;
    pf_peer_t *peer; /* one reference held */
    bool alloc_sent;
    uint64_t alloc_first_try_ns, alloc_sent_ns, alloc_deadline_ns, next_alloc_try_ns;
    bool reserved;              /* D accepted: a reservation exists there */
    uint32_t *remote_blocks;    /* (n_prompt blocks) D's block ids, owned */
    uint64_t not_after_ns;      /* lease end on our clock; 0 = none */
    kvf_block_table_t local;    /* local blocks of the whole prompt (or empty) */
    uint32_t done;              /* prompt tokens computed */
    kvf_xfer_batch_t **batches; /* (n_batches) posted, not yet completed; owned */
    size_t n_batches, cap_batches;
    bool last_posted, abort_posted;
    kvf_status_t hook_status; /* a post failed during the forward */
    /* the chunk of the forward being run */
    uint32_t chunk_start, chunk_len, ship_first, ship_end;
    float *logits; /* (vocab) final chunk only, owned */
    uint32_t first_token;
    uint64_t rng_after;
    uint64_t kv_bytes;
    uint64_t compute_start_ns, compute_end_ns;
} pf_req_t;

typedef struct {
    uint64_t requests, completed, failed, cancelled, refused;
    uint64_t stale_dropped, malformed_dropped, unexpected_dropped;
} pf_counters_t;

struct kvf_prefill {
    kvf_prefill_config_t cfg; /* strings: NULL, or the copies below */
    char *router_url, *listen_url;
    kvf_engine_stack_t rt; /* model, backend, pool, engine */
    kvf_xfer_t *xfer;
    kvf_node_t *node;
    kvf_kv_geometry_t geo;
    pf_req_t *head, *tail; /* request table */
    bool draining;         /* SIGTERM: completing what it holds, taking nothing new */
    pf_peer_t *peers;
    pf_counters_t count;
    /* forward scratch */
    pf_req_t **fwd;             /* (cap_fwd) requests of the running forward */
    kvf_engine_seq_t *seqs;     /* (cap_fwd) */
    uint32_t *remaining, *take; /* (cap_fwd) */
    size_t cap_fwd, n_fwd;
    kvf_xfer_slice_t *slices; /* (cap_slices) one layer of one chunk */
    size_t cap_slices;
};

/* ---- small helpers ---------------------------------------------------- */

static void send_error(kvf_prefill_t *p, uint64_t req_id, uint64_t epoch, kvf_status_t status,
                       const char *message)
{
    Kvf__Error e = KVF__ERROR__INIT;
    e.req_id = req_id;
    e.epoch = epoch;
    e.status = status;
    e.message = (char *)(message ? message : kvf_status_str(status));
    e.node_id = (char *)kvf_node_id(p->node);
    kvf_envelope_t env;
    kvf_envelope_init(&env, kvf_node_id(p->node));
    env.body_case = KVF__ENVELOPE__BODY_ERROR;
    env.error = &e;
    kvf_status_t st = kvf_node_send_router(p->node, &env, PF_SEND_MS);
    if (st != KVF_OK)
        kvf_log_warn("request %llu: error to the router not sent: %s", (unsigned long long)req_id,
                     kvf_status_str(st));
}

/* The attempt (req_id, epoch), or with epoch 0 the newest attempt of
 * req_id. Older attempts may still be in the table, aborting. */
static pf_req_t *req_find(kvf_prefill_t *p, uint64_t req_id, uint64_t epoch)
{
    pf_req_t *newest = NULL;
    for (pf_req_t *r = p->head; r; r = r->next) {
        if (r->req_id != req_id)
            continue;
        if (epoch != 0 && r->epoch == epoch)
            return r;
        if (!newest || r->epoch > newest->epoch)
            newest = r;
    }
    return epoch == 0 ? newest : NULL;
}

static bool req_computing(const pf_req_t *r)
{
    return r->state == REQ_WAIT_ALLOC || r->state == REQ_READY;
}

/* ---- peers ------------------------------------------------------------ */

/* A connected peer for decode node node_id with descriptor desc, with one
 * reference taken; NULL when connecting failed (*status_p says why). */
static pf_peer_t *peer_get(kvf_prefill_t *p, const char *node_id, const uint8_t *desc, size_t len,
                           kvf_status_t *status_p)
{
    for (pf_peer_t *e = p->peers; e; e = e->next) {
        if (e->stale || strcmp(e->node_id, node_id) != 0)
            continue;
        if (kvf_xfer_peer_status(e->xp) == KVF_OK && e->desc_len == len &&
            !memcmp(e->desc, desc, len)) {
            e->users++;
            return e;
        }
        /* Failed, or the node came back with another pool: reconnect. */
        e->stale = true;
    }
    pf_peer_t *e = calloc(1, sizeof(*e));
    kvf_status_t st = KVF_ERR_NOMEM;
    if (!e)
        goto fail_alloc;
    e->node_id = strdup(node_id);
    e->desc = malloc(len ? len : 1);
    if (!e->node_id || !e->desc)
        goto fail_copy;
    memcpy(e->desc, desc, len);
    e->desc_len = len;
    st = kvf_xfer_connect(p->xfer, desc, len, &e->xp);
    if (st != KVF_OK) {
        kvf_log_error("decode node %s: transfer connect failed: %s", node_id, kvf_status_str(st));
        goto fail_copy;
    }
    e->users = 1;
    e->next = p->peers;
    p->peers = e;
    return e;

fail_copy:
    free(e->desc);
    free(e->node_id);
    free(e);
fail_alloc:
    *status_p = st;
    return NULL;
}

/* Drops one reference; disconnects stale or failed peers nobody uses. */
static void peer_put(kvf_prefill_t *p, pf_peer_t *peer)
{
    if (peer)
        peer->users--;
    pf_peer_t **link = &p->peers;
    while (*link) {
        pf_peer_t *e = *link;
        if (e->users == 0 && (e->stale || kvf_xfer_peer_status(e->xp) != KVF_OK)) {
            *link = e->next;
            kvf_xfer_disconnect(e->xp);
            free(e->desc);
            free(e->node_id);
            free(e);
            continue;
        }
        link = &e->next;
    }
}

/* ---- the request table ------------------------------------------------ */

static void req_release_batches(pf_req_t *r)
{
    for (size_t i = 0; i < r->n_batches; i++)
        kvf_xfer_batch_release(r->batches[i]);
    r->n_batches = 0;
}

/* Unlinks and frees r: its local blocks go back to the pool. The caller
 * made sure no batch still reads them (or the transfer handle is gone). */
static void req_destroy(kvf_prefill_t *p, pf_req_t *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        p->head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        p->tail = r->prev;
    req_release_batches(r);
    free(r->batches);
    kvf_block_table_release(&r->local, p->rt.pool);
    kvf_block_table_fini(&r->local);
    free(r->remote_blocks);
    free(r->logits);
    pf_peer_t *peer = r->peer;
    kvf_envelope_free(r->env);
    free(r);
    peer_put(p, peer);
}

static kvf_status_t req_add_batch(pf_req_t *r, kvf_xfer_batch_t *b)
{
    if (r->n_batches == r->cap_batches) {
        size_t cap = r->cap_batches ? 2 * r->cap_batches : 16;
        kvf_xfer_batch_t **nb = realloc(r->batches, cap * sizeof(*nb));
        if (!nb)
            return KVF_ERR_NOMEM;
        r->batches = nb;
        r->cap_batches = cap;
    }
    r->batches[r->n_batches++] = b;
    return KVF_OK;
}

/* Posts spec for r, retrying briefly while the transport says AGAIN. The
 * batch joins r's list. */
static kvf_status_t req_post(kvf_prefill_t *p, pf_req_t *r, const kvf_xfer_slice_t *slices,
                             size_t n, uint32_t flags)
{
    kvf_xfer_batch_spec_t spec = {
        .req_id = r->req_id,
        .epoch = r->epoch,
        .slices = slices,
        .n_slices = n,
        .flags = flags,
        .not_after_ns = r->not_after_ns,
    };
    kvf_xfer_batch_t *b = NULL;
    uint64_t until = kvf_clock_ns() + PF_POST_AGAIN_MS * 1000000ull;
    kvf_status_t st;
    while ((st = kvf_xfer_post(r->peer->xp, &spec, &b)) == KVF_ERR_AGAIN && kvf_clock_ns() < until)
        kvf_xfer_progress(p->xfer);
    if (st != KVF_OK)
        return st;
    st = req_add_batch(r, b);
    if (st != KVF_OK) {
        kvf_xfer_batch_release(b); /* still driven to its end */
        return st;
    }
    return KVF_OK;
}

/* Gives r up: ABORT to D where D holds a reservation and the peer is up
 * (never after LAST: the sender promised nothing follows it), then waits in
 * ABORTING until no batch runs. No message to the router here. */
static void req_abort(kvf_prefill_t *p, pf_req_t *r)
{
    if (r->reserved && !r->last_posted && !r->abort_posted && r->peer &&
        kvf_xfer_peer_status(r->peer->xp) == KVF_OK) {
        kvf_status_t st = req_post(p, r, NULL, 0, KVF_XFER_ABORT);
        if (st != KVF_OK)
            kvf_log_debug("request %llu: abort batch not posted: %s", (unsigned long long)r->req_id,
                          kvf_status_str(st));
        r->abort_posted = true;
    }
    r->state = REQ_ABORTING;
}

/* Fails r: Error{status} to the router, then abort. */
static void req_fail(kvf_prefill_t *p, pf_req_t *r, kvf_status_t status, const char *why)
{
    kvf_log_warn("request %llu epoch %llu failed: %s (%s)", (unsigned long long)r->req_id,
                 (unsigned long long)r->epoch, why, kvf_status_str(status));
    p->count.failed++;
    send_error(p, r->req_id, r->epoch, status, why);
    req_abort(p, r);
}

/* Cancels r (router's Cancel or a newer epoch): no Error to the router. */
static void req_cancel(kvf_prefill_t *p, pf_req_t *r)
{
    if (r->state != REQ_CANCELLED && r->state != REQ_ABORTING)
        p->count.cancelled++;
    switch (r->state) {
    case REQ_WAIT_ALLOC:
        if (!r->alloc_sent) {
            req_destroy(p, r);
            return;
        }
        /* D may still reserve: wait for its reply to abort that. */
        r->state = REQ_CANCELLED;
        return;
    case REQ_READY:
    case REQ_SHIPPING:
        req_abort(p, r);
        return;
    case REQ_CANCELLED:
    case REQ_ABORTING:
        return;
    }
}

/* ---- messages --------------------------------------------------------- */

static kvf_sampling_params_t sampling_params(const Kvf__Sampling *s, uint64_t req_id)
{
    kvf_sampling_params_t sp = kvf_sampling_defaults();
    if (!s)
        return sp;
    sp.temperature = s->temperature;
    sp.top_k = s->top_k > INT_MAX ? INT_MAX : (int)s->top_k;
    /* The wire's 0 (unset) and 1 both mean "no top-p". */
    sp.top_p = s->top_p == 0.0f ? 1.0f : s->top_p;
    /* Without a seed the router left the choice to us: any fixed value
     * per request will do; it travels on in rng_state. */
    sp.seed = s->has_seed ? s->seed : (req_id * 0x9e3779b97f4a7c15ull) ^ kvf_clock_ns();
    return sp;
}

/* Sends (or retries) r's KvAlloc. */
static void send_alloc(kvf_prefill_t *p, pf_req_t *r, int timeout_ms)
{
    const Kvf__PrefillRequest *pr = r->pr;
    Kvf__KvAlloc a = KVF__KV_ALLOC__INIT;
    a.req_id = r->req_id;
    a.epoch = r->epoch;
    a.n_tokens = r->n_prompt;
    a.max_new_tokens = pr->sampling ? pr->sampling->max_tokens : 0;
    a.prefill_node_id = (char *)kvf_node_id(p->node);
    a.reply_inbox = (char *)p->cfg.listen_url;
    kvf_envelope_t env;
    kvf_envelope_init(&env, kvf_node_id(p->node));
    env.body_case = KVF__ENVELOPE__BODY_KV_ALLOC;
    env.kv_alloc = &a;
    uint64_t now = kvf_clock_ns();
    kvf_status_t st = kvf_node_send(p->node, pr->decode_inbox, &env, timeout_ms);
    if (st == KVF_OK) {
        r->alloc_sent = true;
        r->alloc_sent_ns = now; /* the lease counts from here */
        r->alloc_deadline_ns = now + (uint64_t)p->cfg.alloc_timeout_ms * 1000000ull;
        return;
    }
    if (st != KVF_ERR_TIMEOUT && st != KVF_ERR_AGAIN) {
        req_fail(p, r, KVF_ERR_PEER, "kv alloc not sent to the decode node");
        return;
    }
    r->next_alloc_try_ns = now + PF_ALLOC_RETRY_MS * 1000000ull;
}

/* Checks a PrefillRequest; on failure writes a reason into why. */
static kvf_status_t check_request(kvf_prefill_t *p, const Kvf__PrefillRequest *pr, char *why,
                                  size_t why_len)
{
    const kvf_model_config_t *c = &p->rt.model->cfg;
    if (pr->req_id == 0 || pr->epoch == 0) {
        snprintf(why, why_len, "request id or epoch 0");
        return KVF_ERR_INVAL;
    }
    if (pr->n_token_ids == 0 || pr->n_token_ids > (size_t)c->max_pos) {
        snprintf(why, why_len, "prompt of %zu tokens (context %d)", pr->n_token_ids, c->max_pos);
        return pr->n_token_ids ? KVF_ERR_TOO_BIG : KVF_ERR_INVAL;
    }
    for (size_t i = 0; i < pr->n_token_ids; i++) {
        if (pr->token_ids[i] >= (uint32_t)c->vocab) {
            snprintf(why, why_len, "token id %u at %zu not below vocab size %d", pr->token_ids[i],
                     i, c->vocab);
            return KVF_ERR_INVAL;
        }
    }
    if (pr->n_generated > pr->n_token_ids) {
        snprintf(why, why_len, "n_generated %u above %zu tokens", pr->n_generated, pr->n_token_ids);
        return KVF_ERR_INVAL;
    }
    kvf_sampling_params_t sp = sampling_params(pr->sampling, pr->req_id);
    if (kvf_sampling_validate(&sp) != KVF_OK || sp.top_p > 1.0f) {
        snprintf(why, why_len, "bad sampling values");
        return KVF_ERR_INVAL;
    }
    if (!pr->decode_node_id || !pr->decode_node_id[0] || !pr->decode_inbox ||
        !pr->decode_inbox[0]) {
        snprintf(why, why_len, "no decode node");
        return KVF_ERR_INVAL;
    }
    kvf_status_t st =
        kvf_xfer_check_desc(p->xfer, pr->decode_xfer_desc.data, pr->decode_xfer_desc.len);
    if (st != KVF_OK) {
        snprintf(why, why_len, "decode node %s: transfer descriptor: %s", pr->decode_node_id,
                 kvf_status_str(st));
        return st;
    }
    uint32_t need = kvf_kv_blocks_for_tokens(&p->geo, (uint32_t)pr->n_token_ids);
    if (need > kvf_kvpool_num_blocks(p->rt.pool)) {
        snprintf(why, why_len, "prompt needs %u kv blocks, this node has %u", need,
                 kvf_kvpool_num_blocks(p->rt.pool));
        return KVF_ERR_NO_SPACE;
    }
    return KVF_OK;
}

/* Takes env (a PrefillRequest): kept by the request, or freed. */
static void on_prefill_request(kvf_prefill_t *p, kvf_envelope_t *env)
{
    const Kvf__PrefillRequest *pr = env->prefill_request;
    pf_req_t *old = req_find(p, pr->req_id, 0);
    if (old) {
        if (old->epoch >= pr->epoch) {
            kvf_log_warn("request %llu epoch %llu: duplicate or stale (have epoch %llu), dropped",
                         (unsigned long long)pr->req_id, (unsigned long long)pr->epoch,
                         (unsigned long long)old->epoch);
            p->count.stale_dropped++;
            kvf_envelope_free(env);
            return;
        }
        /* Re-dispatched with a newer epoch: the old attempt is over. */
        req_cancel(p, old);
    }
    char why[256];
    kvf_status_t st = check_request(p, pr, why, sizeof(why));
    if (st == KVF_OK && p->draining) {
        st = KVF_ERR_CLOSED;
        snprintf(why, sizeof(why), "prefill node is draining");
    }
    if (st != KVF_OK) {
        kvf_log_warn("request %llu epoch %llu refused: %s", (unsigned long long)pr->req_id,
                     (unsigned long long)pr->epoch, why);
        p->count.refused++;
        send_error(p, pr->req_id, pr->epoch, st, why);
        kvf_envelope_free(env);
        return;
    }
    pf_req_t *r = calloc(1, sizeof(*r));
    if (!r) {
        send_error(p, pr->req_id, pr->epoch, KVF_ERR_NOMEM, "out of memory");
        kvf_envelope_free(env);
        return;
    }
    r->peer =
        peer_get(p, pr->decode_node_id, pr->decode_xfer_desc.data, pr->decode_xfer_desc.len, &st);
    if (!r->peer) {
        send_error(p, pr->req_id, pr->epoch, KVF_ERR_TRANSPORT,
                   "cannot connect to the decode node");
        free(r);
        kvf_envelope_free(env);
        return;
    }
    r->env = env;
    r->pr = pr;
    r->req_id = pr->req_id;
    r->epoch = pr->epoch;
    r->n_prompt = (uint32_t)pr->n_token_ids;
    r->state = REQ_WAIT_ALLOC;
    r->hook_status = KVF_OK;
    kvf_block_table_init(&r->local);
    r->prev = p->tail;
    if (p->tail)
        p->tail->next = r;
    else
        p->head = r;
    p->tail = r;
    p->count.requests++;
    kvf_log_debug("request %llu epoch %llu: %u tokens for %s", (unsigned long long)r->req_id,
                  (unsigned long long)r->epoch, r->n_prompt, pr->decode_node_id);
    /* Allocation overlaps the queue wait (PROTOCOL.md step 2). */
    r->alloc_first_try_ns = kvf_clock_ns();
    send_alloc(p, r, PF_SEND_MS);
}

static void on_alloc_reply(kvf_prefill_t *p, const Kvf__KvAllocReply *a)
{
    /* Epochs start at 1: 0 would name "the newest" here, never accepted. */
    pf_req_t *r = a->epoch ? req_find(p, a->req_id, a->epoch) : NULL;
    if (!r || (r->state != REQ_WAIT_ALLOC && r->state != REQ_CANCELLED)) {
        kvf_log_debug("kv alloc reply for request %llu epoch %llu: stale, dropped",
                      (unsigned long long)a->req_id, (unsigned long long)a->epoch);
        p->count.stale_dropped++;
        return;
    }
    if (a->status != KVF_OK) {
        bool known = a->status < 0 && a->status >= KVF_ERR_INTERNAL;
        kvf_status_t st = known ? (kvf_status_t)a->status : KVF_ERR_PEER;
        if (r->state == REQ_WAIT_ALLOC) {
            kvf_log_info("request %llu epoch %llu: decode node refused: %s (%s)",
                         (unsigned long long)r->req_id, (unsigned long long)r->epoch,
                         a->error ? a->error : "", kvf_status_str(st));
            send_error(p, r->req_id, r->epoch, st,
                       a->error && a->error[0] ? a->error : "decode node refused kv alloc");
        }
        req_destroy(p, r);
        return;
    }
    r->reserved = true;
    r->not_after_ns = a->lease_ms ? r->alloc_sent_ns + a->lease_ms * 1000000ull : 0;
    if (r->state == REQ_CANCELLED) {
        req_abort(p, r);
        return;
    }
    uint32_t need = kvf_kv_blocks_for_tokens(&p->geo, r->n_prompt);
    if (a->n_block_ids < need) {
        req_fail(p, r, KVF_ERR_PEER, "decode node reserved too few blocks");
        return;
    }
    r->remote_blocks = malloc(need * sizeof(uint32_t));
    if (!r->remote_blocks) {
        req_fail(p, r, KVF_ERR_NOMEM, "out of memory");
        return;
    }
    memcpy(r->remote_blocks, a->block_ids, need * sizeof(uint32_t));
    r->state = REQ_READY;
}

static void on_cancel(kvf_prefill_t *p, const Kvf__Cancel *c)
{
    pf_req_t *r = req_find(p, c->req_id, c->epoch);
    if (!r || r->state == REQ_CANCELLED || r->state == REQ_ABORTING) {
        kvf_log_debug("cancel of request %llu epoch %llu: not here", (unsigned long long)c->req_id,
                      (unsigned long long)c->epoch);
        return;
    }
    kvf_log_info("request %llu epoch %llu cancelled (%s)", (unsigned long long)r->req_id,
                 (unsigned long long)r->epoch, c->reason ? c->reason : "");
    req_cancel(p, r);
}

/* Takes env. */
static void handle_envelope(kvf_prefill_t *p, kvf_envelope_t *env)
{
    if (kvf_node_handle(p->node, env)) {
        kvf_envelope_free(env);
        return;
    }
    switch (env->body_case) {
    case KVF__ENVELOPE__BODY_PREFILL_REQUEST:
        on_prefill_request(p, env);
        return; /* env taken */
    case KVF__ENVELOPE__BODY_KV_ALLOC_REPLY:
        on_alloc_reply(p, env->kv_alloc_reply);
        break;
    case KVF__ENVELOPE__BODY_CANCEL:
        on_cancel(p, env->cancel);
        break;
    default:
        kvf_log_warn("unexpected %s message from '%s' dropped", kvf_envelope_body_name(env),
                     env->sender ? env->sender : "");
        p->count.unexpected_dropped++;
        break;
    }
    kvf_envelope_free(env);
}

/* ---- completion ------------------------------------------------------- */

static uint64_t us_between(uint64_t from_ns, uint64_t to_ns)
{
    return to_ns > from_ns ? (to_ns - from_ns) / 1000u : 0;
}

/* Every batch of r completed: hand the request to the router and D.
 * PrefillDone goes first: D streams tokens to the router as soon as it has
 * KvReady, and a router that got a later token before the first one would
 * see a gap in the stream. */
static void req_complete(kvf_prefill_t *p, pf_req_t *r)
{
    const Kvf__PrefillRequest *pr = r->pr;
    uint64_t now = kvf_clock_ns();
    uint64_t compute_us = us_between(r->compute_start_ns, r->compute_end_ns);
    uint64_t handoff_us = us_between(r->compute_end_ns, now);
    kvf_envelope_t env;

    Kvf__PrefillDone d = KVF__PREFILL_DONE__INIT;
    d.req_id = r->req_id;
    d.epoch = r->epoch;
    d.node_id = (char *)kvf_node_id(p->node);
    d.first_token = r->first_token;
    d.prefill_compute_us = compute_us;
    d.handoff_us = handoff_us;
    d.kv_bytes = r->kv_bytes;
    kvf_envelope_init(&env, kvf_node_id(p->node));
    env.body_case = KVF__ENVELOPE__BODY_PREFILL_DONE;
    env.prefill_done = &d;
    kvf_status_t st = kvf_node_send_router(p->node, &env, PF_SEND_MS);
    if (st != KVF_OK)
        kvf_log_warn("request %llu: prefill done not sent to the router: %s",
                     (unsigned long long)r->req_id, kvf_status_str(st));

    Kvf__KvReady k = KVF__KV_READY__INIT;
    k.req_id = r->req_id;
    k.epoch = r->epoch;
    k.first_token = r->first_token;
    k.n_tokens = r->n_prompt;
    k.sampling = pr->sampling;
    k.n_token_ids = pr->n_token_ids;
    k.token_ids = pr->token_ids;
    k.n_generated = pr->n_generated;
    k.rng_state = r->rng_after;
    k.kv_bytes = r->kv_bytes;
    k.prefill_compute_us = compute_us;
    k.handoff_us = handoff_us;
    kvf_envelope_init(&env, kvf_node_id(p->node));
    env.body_case = KVF__ENVELOPE__BODY_KV_READY;
    env.kv_ready = &k;
    st = kvf_node_send(p->node, pr->decode_inbox, &env, PF_SEND_MS);
    if (st != KVF_OK) {
        /* D cannot seal without it; its lease releases the blocks. */
        req_fail(p, r, KVF_ERR_PEER, "kv ready not delivered to the decode node");
        return;
    }
    kvf_log_debug("request %llu epoch %llu done: first token %u, %llu kv bytes, compute %llu us, "
                  "handoff %llu us",
                  (unsigned long long)r->req_id, (unsigned long long)r->epoch, r->first_token,
                  (unsigned long long)r->kv_bytes, (unsigned long long)compute_us,
                  (unsigned long long)handoff_us);
    p->count.completed++;
    req_destroy(p, r);
}

/* Drops the completed batches of r; returns the first failure seen (or OK)
 * and whether some still run. */
static kvf_status_t req_test_batches(pf_req_t *r, bool *running_p)
{
    kvf_status_t failure = KVF_OK;
    size_t keep = 0;
    for (size_t i = 0; i < r->n_batches; i++) {
        kvf_status_t st = kvf_xfer_test(r->batches[i]);
        if (st == KVF_ERR_AGAIN) {
            r->batches[keep++] = r->batches[i];
            continue;
        }
        if (st != KVF_OK && failure == KVF_OK)
            failure = st;
        kvf_xfer_batch_release(r->batches[i]);
    }
    r->n_batches = keep;
    *running_p = keep > 0;
    return failure;
}

/* Moves every request along that the transport or the clock allows. */
static void service_requests(kvf_prefill_t *p)
{
    uint64_t now = kvf_clock_ns();
    pf_req_t *next;
    for (pf_req_t *r = p->head; r; r = next) {
        next = r->next;
        if (r->state == REQ_WAIT_ALLOC || r->state == REQ_CANCELLED) {
            if (!r->alloc_sent) {
                uint64_t give_up =
                    r->alloc_first_try_ns + (uint64_t)p->cfg.alloc_timeout_ms * 1000000ull;
                if (now >= give_up)
                    req_fail(p, r, KVF_ERR_TIMEOUT, "decode node inbox unreachable");
                else if (now >= r->next_alloc_try_ns)
                    send_alloc(p, r, 0);
                continue;
            }
            if (now >= r->alloc_deadline_ns) {
                if (r->state == REQ_CANCELLED)
                    req_destroy(p, r);
                else
                    req_fail(p, r, KVF_ERR_TIMEOUT, "no kv alloc reply from the decode node");
            }
            continue;
        }
        bool running;
        kvf_status_t st = req_test_batches(r, &running);
        if (r->state == REQ_ABORTING) {
            if (!running)
                req_destroy(p, r);
            continue;
        }
        if (st != KVF_OK) {
            req_fail(p, r, KVF_ERR_TRANSPORT, "kv transfer failed");
            continue;
        }
        if (r->state == REQ_SHIPPING && !running && r->last_posted)
            req_complete(p, r);
    }
}

/* ---- the forward ------------------------------------------------------ */

static kvf_status_t fwd_reserve(kvf_prefill_t *p, size_t n)
{
    if (n <= p->cap_fwd)
        return KVF_OK;
    size_t cap = p->cap_fwd ? p->cap_fwd : 16;
    while (cap < n)
        cap *= 2;
    pf_req_t **f = realloc(p->fwd, cap * sizeof(*f));
    if (f)
        p->fwd = f;
    kvf_engine_seq_t *s = realloc(p->seqs, cap * sizeof(*s));
    if (s)
        p->seqs = s;
    uint32_t *rem = realloc(p->remaining, cap * sizeof(*rem));
    if (rem)
        p->remaining = rem;
    uint32_t *tk = realloc(p->take, cap * sizeof(*tk));
    if (tk)
        p->take = tk;
    if (!f || !s || !rem || !tk)
        return KVF_ERR_NOMEM;
    p->cap_fwd = cap;
    return KVF_OK;
}

/* Ships layer `layer` of every chunk in the forward that completes blocks;
 * keeps heartbeats and transfers moving while the next layers compute.
 * Runs on the loop's thread, inside kvf_engine_forward. */
static void on_layer_done(void *arg, int layer)
{
    kvf_prefill_t *p = arg;
    bool last_layer = layer == p->geo.n_layers - 1;
    for (size_t i = 0; i < p->n_fwd; i++) {
        pf_req_t *r = p->fwd[i];
        if (r->hook_status != KVF_OK || r->state != REQ_READY || r->ship_first == r->ship_end)
            continue;
        bool final = r->chunk_start + r->chunk_len == r->n_prompt;
        size_t n = kvf_prefill_plan_slices(p->rt.pool, layer, r->local.blocks, r->remote_blocks,
                                           r->ship_first, r->ship_end, p->slices);
        uint32_t flags = final && last_layer ? KVF_XFER_LAST : 0;
        kvf_status_t st = req_post(p, r, p->slices, n, flags);
        if (st != KVF_OK) {
            kvf_log_warn("request %llu: layer %d batch not posted: %s",
                         (unsigned long long)r->req_id, layer, kvf_status_str(st));
            r->hook_status = st;
            continue;
        }
        r->kv_bytes += (uint64_t)n * kvf_kvpool_slice_bytes(p->rt.pool);
        if (flags & KVF_XFER_LAST)
            r->last_posted = true;
    }
    kvf_xfer_progress(p->xfer);
    (void)kvf_node_tick(p->node); /* a refusal is seen by the loop's own tick */
}

/* Gives a waiting request its local blocks; false when the pool is short. */
static bool req_take_local(kvf_prefill_t *p, pf_req_t *r)
{
    if (r->local.n_blocks)
        return true;
    return kvf_block_table_reserve(&r->local, p->rt.pool, r->n_prompt) == KVF_OK;
}

/* Picks the requests of the next forward into p->fwd; returns how many. */
static size_t pick_forward(kvf_prefill_t *p)
{
    uint64_t now = kvf_clock_ns();
    uint64_t budget = (uint64_t)p->cfg.max_batch_tokens, wanted = 0;
    size_t n = 0;
    int few_rows = -1; /* the forward's kind, set by its first request */
    /* Chunks already under way first (they hold blocks), then new prompts
     * in arrival order, stopping at the first the local pool cannot hold
     * (first come, first served; it waits for blocks to free up). */
    for (int pass = 0; pass < 2; pass++) {
        pf_req_t *next;
        for (pf_req_t *r = p->head; r && wanted < budget; r = next) {
            next = r->next;
            if (r->state != REQ_READY || (pass == 0) != (r->done > 0))
                continue;
            /* A prompt short enough that one forward over it alone (the
             * colocated prefill) takes the few-row kernels shares forwards
             * only with such prompts, within that size; the others never
             * join them. Its bits then match the colocated ones. */
            int few = r->n_prompt <= PF_FEW_ROWS;
            if (few_rows < 0) {
                few_rows = few;
                if (few && budget > PF_FEW_ROWS)
                    budget = PF_FEW_ROWS;
            }
            if (few != few_rows || (few && wanted + r->n_prompt - r->done > budget))
                continue; /* a later forward of its kind */
            if (pass == 1) {
                if (r->not_after_ns && now + PF_LEASE_MARGIN_NS >= r->not_after_ns) {
                    req_fail(p, r, KVF_ERR_TIMEOUT, "lease ended while queued");
                    continue;
                }
                if (!req_take_local(p, r))
                    goto picked;
            }
            if (fwd_reserve(p, n + 1) != KVF_OK)
                goto picked;
            p->fwd[n] = r;
            p->remaining[n] = r->n_prompt - r->done;
            wanted += p->remaining[n];
            n++;
        }
    }
picked:
    n = kvf_prefill_plan_forward(p->remaining, n, (uint32_t)budget, PF_CHUNK_ALIGN,
                                 PF_CHUNK_MIN_TAIL, p->take);
    return n;
}

static void run_forward(kvf_prefill_t *p, size_t n)
{
    const int vocab = p->rt.model->cfg.vocab;
    uint32_t bs = (uint32_t)p->geo.block_size;
    uint64_t start_ns = kvf_clock_ns();
    size_t max_ship = 0;
    for (size_t i = 0; i < n; i++) {
        pf_req_t *r = p->fwd[i];
        kvf_engine_seq_t *s = &p->seqs[i];
        r->chunk_start = r->done;
        r->chunk_len = p->take[i];
        r->hook_status = KVF_OK;
        kvf_prefill_plan_blocks(bs, r->chunk_start, r->chunk_len, r->n_prompt, &r->ship_first,
                                &r->ship_end);
        if (r->ship_end - r->ship_first > max_ship)
            max_ship = r->ship_end - r->ship_first;
        bool final = r->chunk_start + r->chunk_len == r->n_prompt;
        if (final && !r->logits) {
            r->logits = malloc((size_t)vocab * sizeof(float));
            if (!r->logits)
                r->hook_status = KVF_ERR_NOMEM; /* ships nothing; failed below */
        }
        if (r->chunk_start == 0)
            r->compute_start_ns = start_ns;
        memset(s, 0, sizeof(*s));
        s->tokens = r->pr->token_ids + r->chunk_start;
        s->n_tokens = r->chunk_len;
        s->start_pos = r->chunk_start;
        s->block_ids = r->local.blocks;
        s->n_blocks = r->local.n_blocks;
        s->logits = final ? r->logits : NULL;
    }
    if (max_ship > p->cap_slices) {
        kvf_xfer_slice_t *sl = realloc(p->slices, max_ship * sizeof(*sl));
        if (!sl) {
            for (size_t i = 0; i < n; i++)
                req_fail(p, p->fwd[i], KVF_ERR_NOMEM, "out of memory");
            return;
        }
        p->slices = sl;
        p->cap_slices = max_ship;
    }
    p->n_fwd = n;
    kvf_engine_hooks_t hooks = {.on_layer_done = on_layer_done, .arg = p, .kv_to_host = true};
    kvf_status_t st = kvf_engine_forward(p->rt.engine, p->seqs, (int)n, &hooks);
    p->n_fwd = 0;
    uint64_t end_ns = kvf_clock_ns();
    kvf_log_debug("forward: %zu sequences in %llu us", n,
                  (unsigned long long)us_between(start_ns, end_ns));
    for (size_t i = 0; i < n; i++) {
        pf_req_t *r = p->fwd[i];
        if (st != KVF_OK) {
            req_fail(p, r, st, "forward failed");
            continue;
        }
        if (r->hook_status != KVF_OK) {
            req_fail(p, r, r->hook_status == KVF_ERR_NOMEM ? KVF_ERR_NOMEM : KVF_ERR_TRANSPORT,
                     "kv transfer failed");
            continue;
        }
        r->done += r->chunk_len;
        if (r->done < r->n_prompt)
            continue;
        /* Final chunk: the first token, from the last position's logits. */
        const Kvf__PrefillRequest *pr = r->pr;
        kvf_sampling_params_t sp = sampling_params(pr->sampling, r->req_id);
        kvf_sampler_t sampler;
        if (kvf_sampler_init(&sampler, &sp, vocab) != KVF_OK) {
            req_fail(p, r, KVF_ERR_NOMEM, "out of memory");
            continue;
        }
        if (pr->n_generated > 0)
            kvf_sampler_set_state(&sampler, pr->rng_state);
        r->first_token = kvf_sampler_sample(&sampler, r->logits);
        r->rng_after = kvf_sampler_state(&sampler);
        kvf_sampler_fini(&sampler);
        free(r->logits);
        r->logits = NULL;
        r->compute_end_ns = end_ns;
        r->state = REQ_SHIPPING;
    }
}

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
        if (req_computing(r)) {
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
            at = r->alloc_sent ? r->alloc_deadline_ns : r->next_alloc_try_ns;
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
        handle_envelope(p, env);
    }
}

static bool forward_possible(const kvf_prefill_t *p)
{
    for (const pf_req_t *r = p->head; r; r = r->next)
        if (r->state == REQ_READY &&
            (r->done > 0 || r->local.n_blocks ||
             kvf_kv_blocks_for_tokens(&p->geo, r->n_prompt) <= kvf_kvpool_free_blocks(p->rt.pool)))
            return true;
    return false;
}

static void stop_all(kvf_prefill_t *p)
{
    pf_req_t *next;
    for (pf_req_t *r = p->head; r; r = next) {
        next = r->next;
        if (r->state == REQ_ABORTING)
            continue;
        if (r->state != REQ_CANCELLED)
            send_error(p, r->req_id, r->epoch, KVF_ERR_CLOSED, "prefill node stopping");
        if (r->state == REQ_WAIT_ALLOC || r->state == REQ_CANCELLED)
            req_destroy(p, r); /* D's lease frees whatever it reserved */
        else
            req_abort(p, r);
    }
    uint64_t until = kvf_clock_ns() + PF_STOP_DRAIN_MS * 1000000ull;
    while (p->head && kvf_clock_ns() < until) {
        kvf_xfer_progress(p->xfer);
        service_requests(p);
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
        service_requests(p);
        size_t n = forward_possible(p) ? pick_forward(p) : 0;
        if (n > 0) {
            run_forward(p, n);
            continue;
        }
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

kvf_status_t kvf_prefill_create(const kvf_prefill_config_t *cfg, kvf_prefill_t **prefill_p)
{
    if (!cfg->router_url || !cfg->listen_url || !cfg->model_dir || cfg->max_batch_tokens < 1 ||
        cfg->block_size < 1 || cfg->block_size > KVF_KV_BLOCK_SIZE_MAX || cfg->alloc_timeout_ms < 1)
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
    kvf_engine_stack_config_t sc = {
        .threads = cfg->threads,
        .block_size = cfg->block_size,
        .budget_bytes = cfg->kv_mem,
    };
    sc.kv_host_mirror = true; /* the transport ships from host memory */
    st = kvf_backend_flags_apply(&cfg->backend, &sc);
    if (st != KVF_OK)
        goto fail_model;
    st = kvf_engine_stack_init(&p->rt, cfg->model_dir, &sc);
    if (st != KVF_OK)
        goto fail_model;
    p->geo = *kvf_kvpool_geometry(p->rt.pool);
    kvf_xfer_config_t xc = {
        .backend = KVF_XFER_UCX,
        .mem_type = KVF_XFER_MEM_HOST,
        .pool = kvf_kvpool_base(p->rt.pool),
        .pool_bytes = kvf_kvpool_bytes(p->rt.pool),
        .geometry = kvf_xfer_geometry_of_pool(&p->geo),
        .checksum = cfg->checksum,
    };
    st = kvf_xfer_create(&xc, &p->xfer);
    if (st != KVF_OK) {
        kvf_log_error("transfer handle: %s", kvf_status_str(st));
        goto fail_xfer;
    }
    Kvf__KvGeometry wire_geo = kvf_node_wire_geometry(&p->geo);
    kvf_node_config_t nc = {
        .role = KVF__ROLE__ROLE_PREFILL,
        .node_id = cfg->node_id,
        .router_url = cfg->router_url,
        .listen_url = cfg->listen_url,
        .model_fingerprint = kvf_model_fingerprint(p->rt.model),
        .geometry = wire_geo,
        .capacity_blocks = kvf_kvpool_num_blocks(p->rt.pool),
        .max_context = (uint32_t)p->rt.model->cfg.max_pos,
        .fill_load = fill_load,
        .load_arg = p,
    };
    st = kvf_node_create(&nc, &p->node);
    if (st != KVF_OK) {
        kvf_log_error("node on %s: %s", cfg->listen_url, kvf_status_str(st));
        goto fail_node;
    }
    kvf_log_set_node(kvf_node_id(p->node));
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
        req_release_batches(r);
    kvf_xfer_destroy(p->xfer);
    p->xfer = NULL;
    for (pf_peer_t *e = p->peers, *next; e; e = next) {
        next = e->next; /* its kvf_xfer_peer_t died with the handle */
        free(e->desc);
        free(e->node_id);
        free(e);
    }
    p->peers = NULL;
    while (p->head) {
        pf_req_t *r = p->head;
        r->peer = NULL;
        req_destroy(p, r);
    }
    kvf_node_destroy(p->node);
    kvf_engine_stack_fini(&p->rt);
    free(p->fwd);
    free(p->seqs);
    free(p->remaining);
    free(p->take);
    free(p->slices);
    free(p->listen_url);
    free(p->router_url);
    free(p);
}
