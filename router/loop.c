/* The router's event loop: node and client messages, work posted by other
 * threads, timers; and the router's lifecycle. See router_internal.h.
 *
 * The loop sleeps in kvf_evloop_wait until a socket has messages, another
 * thread posted work (kvf_evloop_wake), or the earliest deadline: every
 * deadline is a timer on the loop's heap (a request's timeout and its
 * state's, a node's heartbeats), so there is no scan of everything. */
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "kvf/clock.h"
#include "kvf/log.h"
#include "kvf/signals.h"
#include "metrics.h"
#include "router_internal.h"

/* Messages taken from one socket before the loop looks at the others. */
#define LOOP_BURST 256

/* ---- work from other threads ------------------------------------------------ */

struct kvf_posted {
    void (*fn)(kvf_router_t *, void *);
    void *arg;
    kvf_posted_t *next;
};

kvf_status_t kvf_router_post(kvf_router_t *r, void (*fn)(kvf_router_t *, void *), void *arg)
{
    kvf_posted_t *p = malloc(sizeof(*p));
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
    kvf_evloop_wake(r->loop);
    return KVF_OK;
}

static void run_posted(kvf_router_t *r)
{
    pthread_mutex_lock(&r->post_lock);
    kvf_posted_t *p = r->posted;
    r->posted = r->posted_tail = NULL;
    pthread_mutex_unlock(&r->post_lock);
    while (p) {
        kvf_posted_t *next = p->next;
        p->fn(r, p->arg);
        free(p);
        p = next;
    }
}

/* ---- messages ------------------------------------------------------------------ */

/* The node id a message's body names ("" for bodies that name none). */
static const char *body_node_id(const kvf_envelope_t *env)
{
    const char *id = NULL;
    switch (env->body_case) {
    case KVF__ENVELOPE__BODY_HEARTBEAT: id = env->heartbeat->node_id; break;
    case KVF__ENVELOPE__BODY_DEREGISTER: id = env->deregister->node_id; break;
    case KVF__ENVELOPE__BODY_PREFILL_DONE: id = env->prefill_done->node_id; break;
    case KVF__ENVELOPE__BODY_TOKEN_BATCH: id = env->token_batch->node_id; break;
    case KVF__ENVELOPE__BODY_ERROR: id = env->error->node_id; break;
    case KVF__ENVELOPE__BODY_PREFIX_UPDATE: id = env->prefix_update->node_id; break;
    default: break;
    }
    return id ? id : "";
}

/* The registered node that sent env (docs/PROTOCOL.md, "Identity"): the
 * envelope names it and carries its registration's token, and the body
 * names no other node. NULL (the message is refused, counted) otherwise;
 * *unknown_p when no live registration has that id (a heartbeat of such a
 * node is told to register again). */
static kvf_router_node_t *sender_node(kvf_router_t *r, const kvf_envelope_t *env, bool *unknown_p)
{
    const char *body = kvf_envelope_body_name(env);
    kvf_router_node_t *n = kvf_router__node_by_id(r, env->sender);
    *unknown_p = !n || n->state == NODE_DEAD;
    if (!n || !kvf_identity_equal(env->reg_token.data, env->reg_token.len, n->token,
                                  sizeof(n->token))) {
        if (!*unknown_p || env->body_case != KVF__ENVELOPE__BODY_HEARTBEAT)
            kvf_router__refuse(r, KVF_ROUTER_MSG_TOKEN,
                               "%s from '%s' without its registration's token", body, env->sender);
        return NULL;
    }
    const char *named = body_node_id(env);
    if (*named && strcmp(named, n->id) != 0) {
        kvf_router__refuse(r, KVF_ROUTER_MSG_SENDER, "%s from %s names node '%s'", body, n->id,
                           named);
        return NULL;
    }
    return n;
}

/* Whether n serves the attempt the message is about (the decode node
 * streams tokens; PrefillDone comes from the prefill node, which is the
 * decode node for a local prefill; an Error from either). */
static bool assigned(kvf_router_t *r, const kvf_router_node_t *n, const char *what, uint64_t id,
                     uint64_t epoch, bool as_prefill, bool as_decode)
{
    if (kvf_router__sender_assigned(r, n, id, epoch, as_prefill, as_decode))
        return true;
    kvf_router__refuse(r, KVF_ROUTER_MSG_NOT_ASSIGNED,
                       "%s for request %llu epoch %llu from %s, which does not serve it", what,
                       (unsigned long long)id, (unsigned long long)epoch, n->id);
    return false;
}

static void handle_token_batch(kvf_router_t *r, const kvf_router_node_t *n,
                               const Kvf__TokenBatch *b)
{
    for (size_t i = 0; i < b->n_chunks; i++)
        if (assigned(r, n, "tokens", b->chunks[i]->req_id, b->chunks[i]->epoch, false, true))
            kvf_router__on_token_chunk(r, b->chunks[i]);
}

static void handle_node_message(kvf_router_t *r, kvf_envelope_t *env)
{
    if (env->body_case == KVF__ENVELOPE__BODY_REGISTER) {
        kvf_router__on_register(r, env->register_, env->reg_token);
        return;
    }
    bool unknown = false;
    kvf_router_node_t *n = sender_node(r, env, &unknown);
    if (!n) {
        if (unknown && env->body_case == KVF__ENVELOPE__BODY_HEARTBEAT)
            kvf_router__on_heartbeat(r, env->heartbeat); /* "register again" */
        return;
    }
    switch (env->body_case) {
    case KVF__ENVELOPE__BODY_HEARTBEAT:
        kvf_router__on_heartbeat(r, env->heartbeat);
        break;
    case KVF__ENVELOPE__BODY_DEREGISTER:
        kvf_router__on_deregister(r, env->deregister);
        break;
    case KVF__ENVELOPE__BODY_PREFILL_DONE:
        if (assigned(r, n, "prefill done", env->prefill_done->req_id, env->prefill_done->epoch,
                     true, false))
            kvf_router__on_prefill_done(r, env->prefill_done);
        break;
    case KVF__ENVELOPE__BODY_TOKEN_CHUNK:
        if (assigned(r, n, "tokens", env->token_chunk->req_id, env->token_chunk->epoch, false,
                     true))
            kvf_router__on_token_chunk(r, env->token_chunk);
        break;
    case KVF__ENVELOPE__BODY_TOKEN_BATCH:
        handle_token_batch(r, n, env->token_batch);
        break;
    case KVF__ENVELOPE__BODY_ERROR:
        if (assigned(r, n, "error", env->error->req_id, env->error->epoch, true, true))
            kvf_router__on_error(r, env->error, n->id);
        break;
    case KVF__ENVELOPE__BODY_PREFIX_UPDATE:
        kvf_router__on_prefix_update(r, env->prefix_update, n->id);
        break;
    default:
        r->count.malformed++;
        kvf_log_warn("unexpected %s from %s dropped", kvf_envelope_body_name(env), env->sender);
    }
}

void kvf_router__recv_nodes(kvf_router_t *r)
{
    for (int burst = 0; burst < LOOP_BURST; burst++) {
        kvf_envelope_t *env = NULL;
        kvf_status_t st = kvf_inbox_recv(r->inbox, 0, &env);
        if (st == KVF_ERR_AGAIN)
            break;
        if (st != KVF_OK) {
            r->count.malformed++;
            continue;
        }
        handle_node_message(r, env);
        kvf_envelope_free(env);
    }
}

static void recv_nodes(int fd, void *arg)
{
    (void)fd;
    kvf_router__recv_nodes(arg);
}

static void recv_clients(int fd, void *arg)
{
    (void)fd;
    kvf_router_t *r = arg;
    for (int burst = 0; burst < LOOP_BURST; burst++) {
        kvf_envelope_t *env = NULL;
        kvf_client_hdr_t hdr;
        kvf_status_t st = kvf_client_server_recv(r->clients, &env, &hdr);
        if (st == KVF_ERR_AGAIN)
            break;
        if (st != KVF_OK) {
            r->count.malformed++;
            continue;
        }
        kvf_router__handle_client_message(r, env, &hdr);
        kvf_envelope_free(env);
    }
}

kvf_status_t kvf_router_run(kvf_router_t *r, volatile sig_atomic_t *stop)
{
    kvf_log_info("serving: nodes at %s, clients at %s", r->cfg.listen_url, r->cfg.client_url);
    kvf_router__route_describe(r);
    /* A stop signal, on whichever thread it lands, wakes the loop after
     * setting the flag (kvf/signals.h); a thread that sets the flag itself
     * calls kvf_router_wake. */
    kvf_signals_wake_loop(r->loop);
    kvf_status_t st = KVF_OK;
    while (!*stop) {
        /* Sleeps until a socket is readable (its callback drains it), work
         * is posted, a deadline is due (its timer fires) or a wake-up. */
        if (kvf_evloop_wait(r->loop, -1) == KVF_ERR_IO) {
            st = KVF_ERR_IO;
            break;
        }
        run_posted(r);
    }
    kvf_signals_wake_loop(NULL);
    if (st != KVF_OK)
        return st;
    kvf_log_info("stopping: %llu requests served, %llu failed, %llu cancelled, %llu stale "
                 "messages dropped",
                 (unsigned long long)r->count.completed, (unsigned long long)r->count.failed,
                 (unsigned long long)r->count.cancelled, (unsigned long long)r->count.stale);
    return KVF_OK;
}

void kvf_router_wake(kvf_router_t *r)
{
    kvf_evloop_wake(r->loop);
}

/* ---- accessors --------------------------------------------------------------------- */

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

kvf_metrics_t *kvf_router_metrics(kvf_router_t *r)
{
    return r->metrics;
}

/* ---- lifecycle --------------------------------------------------------------------- */

void kvf_router__config_defaults(kvf_router_config_t *cfg)
{
    if (!cfg->heartbeat_ms)
        cfg->heartbeat_ms = 500;
    if (!cfg->dead_after_missed)
        cfg->dead_after_missed = 3;
    if (!cfg->max_attempts)
        cfg->max_attempts = 5;
    if (!cfg->default_max_tokens)
        cfg->default_max_tokens = 256;
    if (!cfg->prefill_timeout_ms)
        cfg->prefill_timeout_ms = 60000;
    if (!cfg->stall_timeout_ms)
        cfg->stall_timeout_ms = 30000;
    if (!cfg->prefill_weight && !cfg->decode_weight && !cfg->transfer_weight) {
        cfg->prefill_weight = cfg->decode_weight = cfg->transfer_weight = 1.0;
        cfg->tier_ram_weight = KVF_ROUTER_TIER_RAM_WEIGHT;
        cfg->pull_weight = KVF_ROUTER_PULL_WEIGHT;
        cfg->tier_disk_weight = KVF_ROUTER_TIER_DISK_WEIGHT;
    }
}

/* The loop, watching both sockets. */
static kvf_status_t loop_create(kvf_router_t *r)
{
    kvf_status_t st = kvf_evloop_create(&r->loop);
    if (st != KVF_OK)
        return st;
    st = kvf_evloop_add_fd(r->loop, kvf_inbox_fd(r->inbox), recv_nodes, r);
    if (st == KVF_OK)
        st = kvf_evloop_add_fd(r->loop, kvf_client_server_fd(r->clients), recv_clients, r);
    if (st != KVF_OK) {
        kvf_evloop_destroy(r->loop);
        r->loop = NULL;
    }
    return st;
}

void kvf_router__keys_set(kvf_router_t *r)
{
    /* as the nodes take it from RegisterReply (kvf_node_prefix_key) */
    uint64_t k[2];
    memcpy(k, r->prefix_key, sizeof(k));
    r->hash_key = (kvf_block_hash_key_t){k[0], k[1]};
    r->hash_key_id = kvf_block_hash_key_id(&r->hash_key);
}

kvf_status_t kvf_router_create(const kvf_router_config_t *cfg, kvf_router_t **router_p)
{
    kvf_router_t *r = calloc(1, sizeof(*r));
    if (!r)
        return KVF_ERR_NOMEM;
    r->cfg = *cfg;
    kvf_router__config_defaults(&r->cfg);
    r->next_req_id = 1;
    if (getrandom(&r->seed_state, sizeof(r->seed_state), GRND_NONBLOCK) !=
        (ssize_t)sizeof(r->seed_state))
        r->seed_state = kvf_clock_ns() ^ ((uint64_t)getpid() << 32);
    /* Every node hashes prefix blocks under this key (RegisterReply), so
     * hashes compare across nodes; a router restart changes it and the
     * nodes start their caches afresh. */
    if (getrandom(r->prefix_key, sizeof(r->prefix_key), GRND_NONBLOCK) !=
        (ssize_t)sizeof(r->prefix_key)) {
        uint64_t k[2] = {r->seed_state * 0x9e3779b97f4a7c15ull, kvf_clock_ns()};
        memcpy(r->prefix_key, k, sizeof(r->prefix_key));
    }
    kvf_router__keys_set(r);
    r->route_rng = r->seed_state ^ 0x5851f42d4c957f2dull;
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
    st = loop_create(r);
    if (st != KVF_OK)
        goto fail_loop;
    *router_p = r;
    return KVF_OK;
fail_loop:
    kvf_metrics_destroy(r->metrics);
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
    free(r);
    return st;
}

void kvf_router_destroy(kvf_router_t *r)
{
    if (!r)
        return;
    /* Requests and nodes disarm their timers before the loop goes. */
    kvf_router__requests_fini(r);
    kvf_router__natives_fini(r);
    kvf_router__registry_fini(r);
    while (r->posted) {
        kvf_posted_t *p = r->posted;
        r->posted = p->next;
        free(p);
    }
    pthread_mutex_destroy(&r->post_lock);
    kvf_evloop_destroy(r->loop);
    kvf_outboxes_destroy(r->outboxes);
    kvf_client_server_destroy(r->clients);
    kvf_inbox_destroy(r->inbox);
    kvf_tokenizer_destroy(r->tok);
    kvf_metrics_destroy(r->metrics);
    free(r);
}
