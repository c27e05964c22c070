#include "node_internal.h"
#include "kvf/auth.h"
#include "kvf/clock.h"
#include "kvf/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Register goes again after this long unanswered; one that could not even
 * leave (the socket still connecting) is tried again sooner, from
 * NODE_REGISTER_FIRST_RETRY_MS doubling up to the full period. */
#define NODE_REGISTER_RETRY_MS 1000
#define NODE_REGISTER_FIRST_RETRY_MS 10

/* Why kvf_node_handle dropped a message (the nodes' stats lines). */
enum { NODE_REFUSED_TOKEN, NODE_REFUSED_ALLOC_TOKEN, NODE_N_REFUSALS };
static const char *const node_refusal_names[NODE_N_REFUSALS] = {
    [NODE_REFUSED_TOKEN] = "token",
    [NODE_REFUSED_ALLOC_TOKEN] = "alloc_token",
};


static const char *role_name(Kvf__Role role)
{
    switch (role) {
    case KVF__ROLE__ROLE_PREFILL: return "prefill";
    case KVF__ROLE__ROLE_DECODE: return "decode";
    case KVF__ROLE__ROLE_ROUTER: return "router";
    default: return "node";
    }
}

kvf_status_t kvf_node_create(const kvf_node_config_t *cfg, kvf_node_t **node_p)
{
    if (!cfg->router_url || !cfg->listen_url)
        return KVF_ERR_INVAL;
    kvf_node_t *node = calloc(1, sizeof(*node));
    if (!node)
        return KVF_ERR_NOMEM;
    kvf_status_t st = KVF_ERR_NOMEM;
    node->cfg = *cfg;
    kvf_refusals_init(&node->refusals, node_refusal_names, NODE_N_REFUSALS);
    if (cfg->node_id) {
        node->node_id = strdup(cfg->node_id);
    } else {
        char id[64];
        snprintf(id, sizeof(id), "%s-%d-%04x", role_name(cfg->role), (int)getpid(),
                 (unsigned)(kvf_clock_ns() & 0xffff));
        node->node_id = strdup(id);
    }
    node->router_url = strdup(cfg->router_url);
    node->listen_url = strdup(cfg->listen_url);
    node->fingerprint = strdup(cfg->model_fingerprint ? cfg->model_fingerprint : "");
    if (!node->node_id || !node->router_url || !node->listen_url || !node->fingerprint)
        goto fail_copy;
    if (cfg->xfer_desc_len) {
        node->xfer_desc = malloc(cfg->xfer_desc_len);
        if (!node->xfer_desc)
            goto fail_copy;
        memcpy(node->xfer_desc, cfg->xfer_desc, cfg->xfer_desc_len);
    }
    node->cfg.node_id = node->node_id;
    node->cfg.router_url = node->router_url;
    node->cfg.listen_url = node->listen_url;
    node->cfg.model_fingerprint = node->fingerprint;
    node->cfg.xfer_desc = node->xfer_desc;
    if (!node->cfg.heartbeat_ms)
        node->cfg.heartbeat_ms = 500;
    if (!node->cfg.loop_stuck_ms)
        node->cfg.loop_stuck_ms = KVF_NODE_LOOP_STUCK_MS;
    st = kvf_inbox_create(node->listen_url, 0, &node->inbox);
    if (st != KVF_OK)
        goto fail_copy;
    st = kvf_outbox_create(node->router_url, &node->router);
    if (st != KVF_OK)
        goto fail_router;
    st = kvf_outboxes_create(0, &node->peers);
    if (st != KVF_OK)
        goto fail_peers;
    st = kvf_node__beat_init(node);
    if (st != KVF_OK)
        goto fail_beat;
    st = kvf_node__beat_start(node);
    if (st != KVF_OK)
        goto fail_start;
    *node_p = node;
    return KVF_OK;
fail_start:
    kvf_node__beat_fini(node);
fail_beat:
    kvf_outboxes_destroy(node->peers);
fail_peers:
    kvf_outbox_destroy(node->router);
fail_router:
    kvf_inbox_destroy(node->inbox);
fail_copy:
    free(node->xfer_desc);
    free(node->fingerprint);
    free(node->listen_url);
    free(node->router_url);
    free(node->node_id);
    free(node);
    return st;
}

void kvf_node_destroy(kvf_node_t *node)
{
    if (!node)
        return;
    kvf_node__beat_fini(node);
    kvf_outboxes_destroy(node->peers);
    kvf_outbox_destroy(node->router);
    kvf_inbox_destroy(node->inbox);
    free(node->xfer_desc);
    free(node->fingerprint);
    free(node->listen_url);
    free(node->router_url);
    free(node->node_id);
    free(node);
}

const char *kvf_node_id(const kvf_node_t *node)
{
    return node->node_id;
}

kvf_inbox_t *kvf_node_inbox(kvf_node_t *node)
{
    return node->inbox;
}

bool kvf_node_registered(const kvf_node_t *node)
{
    return node->registered;
}

void kvf_node_set_draining(kvf_node_t *node, bool draining)
{
    kvf_node__beat_set_draining(node, draining); /* tells the router now */
}

kvf_status_t kvf_node_set_xfer_desc(kvf_node_t *node, const uint8_t *desc, size_t len)
{
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy)
        return KVF_ERR_NOMEM;
    memcpy(copy, desc, len);
    /* the heartbeat thread reads it while it sends */
    pthread_mutex_lock(&node->beat.send_lock);
    free(node->xfer_desc);
    node->xfer_desc = copy;
    node->cfg.xfer_desc = copy;
    node->cfg.xfer_desc_len = len;
    node->desc_changed = true;
    pthread_mutex_unlock(&node->beat.send_lock);
    return KVF_OK;
}

kvf_status_t kvf_node_send_router(kvf_node_t *node, kvf_envelope_t *env, int timeout_ms)
{
    env->sender = node->node_id;
    env->reg_token = (ProtobufCBinaryData){node->reg_token_len, node->reg_token};
    return kvf_outbox_send(node->router, env, timeout_ms);
}

static kvf_status_t send_register(kvf_node_t *node)
{
    Kvf__Register reg = KVF__REGISTER__INIT;
    Kvf__KvGeometry geo = node->cfg.geometry;
    reg.node_id = node->node_id;
    reg.role = node->cfg.role;
    reg.inbox_url = node->listen_url;
    reg.model_fingerprint = node->fingerprint;
    reg.geometry = &geo;
    reg.capacity_blocks = node->cfg.capacity_blocks;
    reg.xfer_desc.data = node->xfer_desc;
    reg.xfer_desc.len = node->cfg.xfer_desc_len;
    reg.max_running = node->cfg.max_running;
    reg.prefill_local = node->cfg.prefill_local;
    reg.prefix_pull = node->cfg.prefix_pull;
    reg.max_context = node->cfg.max_context;
    kvf_envelope_t env;
    kvf_envelope_init(&env, node->node_id);
    env.body_case = KVF__ENVELOPE__BODY_REGISTER;
    env.register_ = &reg;
    /* Never block the loop on a router that is not there yet. */
    return kvf_node_send_router(node, &env, 0);
}

kvf_status_t kvf_node_tick(kvf_node_t *node)
{
    if (node->refused != KVF_OK)
        return node->refused;
    uint64_t now = kvf_clock_ns();
    if (!node->registered) {
        if (now >= node->next_register_ns) {
            kvf_status_t st = send_register(node);
            if (st != KVF_OK && st != KVF_ERR_TIMEOUT && st != KVF_ERR_AGAIN)
                kvf_log_warn("register with %s: %s", node->router_url, kvf_status_str(st));
            if (st == KVF_OK)
                node->register_retry_ms = NODE_REGISTER_RETRY_MS;
            else if (node->register_retry_ms < NODE_REGISTER_RETRY_MS)
                node->register_retry_ms = node->register_retry_ms
                                              ? node->register_retry_ms * 2
                                              : NODE_REGISTER_FIRST_RETRY_MS;
            node->next_register_ns = now + node->register_retry_ms * 1000000ull;
        }
        return KVF_OK;
    }
    kvf_node__beat_tick(node, now);
    return KVF_OK;
}

void kvf_node_publish(kvf_node_t *node)
{
    node->beat.next_publish_ns = 0;
    kvf_node__beat_tick(node, kvf_clock_ns());
}

int kvf_node_timeout_ms(const kvf_node_t *node)
{
    if (node->refused != KVF_OK)
        return 0;
    return node->registered ? kvf_node__beat_timeout_ms(node)
                            : kvf_clock_ms_until(node->next_register_ns);
}

uint32_t kvf_node_prefix_key(const kvf_node_t *node, uint64_t key_p[2])
{
    if (node->prefix_key_gen)
        memcpy(key_p, node->prefix_key, sizeof(node->prefix_key));
    return node->prefix_key_gen;
}

/* Whether env carries this registration's token (it comes from the
 * router we registered with). */
static bool from_router(const kvf_node_t *node, const kvf_envelope_t *env)
{
    return kvf_identity_equal(env->reg_token.data, env->reg_token.len, node->reg_token,
                              node->reg_token_len);
}

/* Whether KvAlloc a carries the credential the router gave the prefill
 * node for this attempt (kvf/identity.h). */
static bool alloc_allowed(const kvf_node_t *node, const Kvf__KvAlloc *a)
{
    if (node->reg_token_len != KVF_REG_TOKEN_LEN)
        return false;
    uint8_t want[KVF_ALLOC_TOKEN_LEN];
    kvf_identity_alloc_token(node->reg_token, a->req_id, a->epoch, want);
    return kvf_identity_equal(a->alloc_token.data, a->alloc_token.len, want, sizeof(want));
}

static void on_register_reply(kvf_node_t *node, const kvf_envelope_t *env)
{
    const Kvf__RegisterReply *r = env->register_reply;
    if (strcmp(r->node_id, node->node_id) != 0) {
        kvf_log_warn("register reply for another node '%s' dropped", r->node_id);
        return;
    }
    if (r->status == KVF_ERR_AGAIN) {
        /* Our id is still held by a live registration: not final. */
        kvf_log_warn("router: %s; registering again later", r->error);
        return;
    }
    if (node->registered &&
        !kvf_identity_equal(r->reg_token.data, r->reg_token.len, node->reg_token,
                            node->reg_token_len)) {
        /* Only the registration we hold may be answered again. */
        kvf_refusals_note(&node->refusals, NODE_REFUSED_TOKEN,
                          "register reply from '%s' with another token", env->sender);
        return;
    }
    if (r->status != KVF_OK) {
        node->refused = r->status < 0 && r->status >= KVF_ERR_INTERNAL ? (kvf_status_t)r->status
                                                                        : KVF_ERR_PEER;
        kvf_log_error("router refused registration: %s (%s)", r->error,
                      kvf_status_str(node->refused));
        return;
    }
    if (!node->registered) {
        kvf_log_info("registered with router %s", node->router_url);
        /* Heartbeats are stopped while not registered: the thread does
         * not read the token now. */
        node->reg_token_len = r->reg_token.len == KVF_REG_TOKEN_LEN ? KVF_REG_TOKEN_LEN : 0;
        if (node->reg_token_len)
            memcpy(node->reg_token, r->reg_token.data, KVF_REG_TOKEN_LEN);
    }
    node->registered = true;
    if (r->prefix_key.len == sizeof(node->prefix_key)) {
        uint64_t k[2];
        memcpy(k, r->prefix_key.data, sizeof(k));
        if (node->prefix_key_gen == 0 || memcmp(k, node->prefix_key, sizeof(k)) != 0) {
            memcpy(node->prefix_key, k, sizeof(k));
            node->prefix_key_gen++;
        }
    }
    if (r->heartbeat_ms >= 50 && r->heartbeat_ms <= 60000)
        node->cfg.heartbeat_ms = r->heartbeat_ms;
    kvf_node__beat_set_registered(node, true, node->cfg.heartbeat_ms);
}

/* Whether env must be dropped (counted): a message only the router may
 * send without the registration's token, or a KvAlloc without its
 * attempt's credential. */
static bool refused(kvf_node_t *node, const kvf_envelope_t *env)
{
    switch (env->body_case) {
    case KVF__ENVELOPE__BODY_PREFILL_REQUEST:
    case KVF__ENVELOPE__BODY_CANCEL:
    case KVF__ENVELOPE__BODY_PREFIX_RESYNC:
    case KVF__ENVELOPE__BODY_ERROR:
        if (from_router(node, env))
            return false;
        kvf_refusals_note(&node->refusals, NODE_REFUSED_TOKEN,
                          "%s from '%s' without the router's token", kvf_envelope_body_name(env),
                          env->sender);
        return true;
    case KVF__ENVELOPE__BODY_KV_ALLOC:
        if (alloc_allowed(node, env->kv_alloc))
            return false;
        kvf_refusals_note(&node->refusals, NODE_REFUSED_ALLOC_TOKEN,
                          "KvAlloc for request %llu epoch %llu from '%s' without the attempt's "
                          "credential",
                          (unsigned long long)env->kv_alloc->req_id,
                          (unsigned long long)env->kv_alloc->epoch, env->sender);
        return true;
    default:
        return false;
    }
}

bool kvf_node_handle(kvf_node_t *node, const kvf_envelope_t *env)
{
    if (env->body_case == KVF__ENVELOPE__BODY_REGISTER_REPLY) {
        on_register_reply(node, env);
        return true;
    }
    if (env->body_case == KVF__ENVELOPE__BODY_ERROR && env->error->req_id == 0 &&
        env->error->status == KVF_ERR_NOT_FOUND) {
        /* The router does not know us (it restarted): register again.
         * Unchecked: a restarted router does not know our token. We
         * present it, so the router we are registered with answers with
         * the same registration. */
        if (node->registered)
            kvf_log_warn("router forgot this node (%s): registering again", env->error->message);
        node->registered = false;
        kvf_node__beat_set_registered(node, false, 0);
        node->next_register_ns = 0;
        node->register_retry_ms = 0;
        return true;
    }
    return refused(node, env);
}

void kvf_node_refusals_format(const kvf_node_t *node, char *buf, size_t len)
{
    kvf_refusals_format(&node->refusals, buf, len);
}

void kvf_node_control_format(const kvf_node_t *node, char *buf, size_t len)
{
    kvf_auth_counters_format(buf, len);
    size_t at = strlen(buf);
    if (at + 1 >= len)
        return;
    int w = snprintf(buf + at, len - at, " | messages refused: ");
    if (w > 0 && (size_t)w < len - at)
        kvf_refusals_format(&node->refusals, buf + at + w, len - at - (size_t)w);
}

uint64_t kvf_node_refused(const kvf_node_t *node)
{
    uint64_t n = 0;
    for (unsigned i = 0; i < node->refusals.n; i++)
        n += node->refusals.count[i];
    return n;
}

kvf_status_t kvf_node_send(kvf_node_t *node, const char *url, kvf_envelope_t *env,
                           int timeout_ms)
{
    if (!strcmp(url, node->router_url))
        return kvf_node_send_router(node, env, timeout_ms);
    env->sender = node->node_id;
    return kvf_outboxes_send(node->peers, url, env, timeout_ms);
}

void kvf_node_forget_peer(kvf_node_t *node, const char *url)
{
    kvf_outboxes_forget(node->peers, url);
}

kvf_status_t kvf_node_deregister(kvf_node_t *node, const char *reason)
{
    Kvf__Deregister d = KVF__DEREGISTER__INIT;
    d.node_id = node->node_id;
    d.reason = (char *)(reason ? reason : "");
    kvf_envelope_t env;
    kvf_envelope_init(&env, node->node_id);
    env.body_case = KVF__ENVELOPE__BODY_DEREGISTER;
    env.deregister = &d;
    node->registered = false;
    kvf_node__beat_set_registered(node, false, 0);
    return kvf_node_send_router(node, &env, 1000);
}

Kvf__KvGeometry kvf_node_wire_geometry(const kvf_kv_geometry_t *geo)
{
    Kvf__KvGeometry w = KVF__KV_GEOMETRY__INIT;
    w.block_size = (uint32_t)geo->block_size;
    /* kvf_kv_dtype_t is numbered as the wire's KvDtype (kvf/kv_format.h). */
    _Static_assert((int)KVF_KV_F32 == (int)KVF__KV_DTYPE__KV_DTYPE_F32 &&
                       (int)KVF_KV_F16 == (int)KVF__KV_DTYPE__KV_DTYPE_F16 &&
                       (int)KVF_KV_BF16 == (int)KVF__KV_DTYPE__KV_DTYPE_BF16 &&
                       (int)KVF_KV_FP8 == (int)KVF__KV_DTYPE__KV_DTYPE_FP8 &&
                       (int)KVF_KV_INT8 == (int)KVF__KV_DTYPE__KV_DTYPE_INT8,
                   "KV dtype numbering");
    w.dtype = (Kvf__KvDtype)geo->dtype;
    w.layout = 1;
    w.n_layers = (uint32_t)geo->n_layers;
    w.n_kv_heads = (uint32_t)geo->n_kv_heads;
    w.head_dim = (uint32_t)geo->head_dim;
    return w;
}
