/* The node table: registration, heartbeats, liveness, health and the
 * snapshot for /metrics. See router_internal.h. */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvf/clock.h"
#include "kvf/kv_format.h"
#include "kvf/log.h"
#include "kvf/xfer.h"
#include "router_internal.h"

static const char *const node_state_names[] = {"live", "draining", "dead", "quarantined"};

/* A repeated Register within this long from the same inbox is a retry
 * that crossed our reply, not a restart. */
#define REGISTER_RETRY_NS (2 * 1000000000ull)

kvf_router_node_t *kvf_router__node_get(kvf_router_t *r, kvf_node_ref_t ref)
{
    uint32_t slot = (uint32_t)ref, gen = (uint32_t)(ref >> 32);
    if (ref == KVF_NODE_NONE || slot >= ROUTER_MAX_NODES)
        return NULL;
    kvf_router_node_t *n = &r->nodes.slots[slot];
    return n->used && n->gen == gen ? n : NULL;
}

kvf_node_ref_t kvf_router__node_ref(const kvf_router_t *r, const kvf_router_node_t *n)
{
    return ((uint64_t)n->gen << 32) | (uint64_t)(n - r->nodes.slots);
}

const char *kvf_router__role_name(Kvf__Role role)
{
    return role == KVF__ROLE__ROLE_PREFILL  ? "prefill"
           : role == KVF__ROLE__ROLE_DECODE ? "decode"
                                            : "other";
}

const char *kvf_router__node_state_name(kvf_node_state_t state)
{
    return node_state_names[state];
}

static kvf_router_node_t *node_at(kvf_router_t *r, const char *url)
{
    for (int i = 0; i < ROUTER_MAX_NODES; i++)
        if (r->nodes.slots[i].used && !strcmp(r->nodes.slots[i].inbox, url))
            return &r->nodes.slots[i];
    return NULL;
}

void kvf_router__send(kvf_router_t *r, const char *url, kvf_envelope_t *env)
{
    kvf_router_node_t *n = node_at(r, url);
    if (n)
        env->reg_token = (ProtobufCBinaryData){sizeof(n->token), n->token};
    env->sender = "router";
    kvf_status_t st = kvf_outboxes_send(r->outboxes, url, env, ROUTER_SEND_TIMEOUT_MS);
    if (st != KVF_OK)
        kvf_log_warn("send %s to %s: %s", kvf_envelope_body_name(env), url, kvf_status_str(st));
}

static kvf_router_node_t *node_find(kvf_router_t *r, const char *id)
{
    for (int i = 0; i < ROUTER_MAX_NODES; i++)
        if (r->nodes.slots[i].used && !strcmp(r->nodes.slots[i].id, id))
            return &r->nodes.slots[i];
    return NULL;
}

kvf_router_node_t *kvf_router__node_by_id(kvf_router_t *r, const char *id)
{
    return id ? node_find(r, id) : NULL;
}

const char *kvf_router_msg_refusal_name(kvf_router_msg_refusal_t why)
{
    static const char *const names[KVF_ROUTER_N_MSG_REFUSALS] = {
        [KVF_ROUTER_MSG_TOKEN] = "token",
        [KVF_ROUTER_MSG_SENDER] = "sender",
        [KVF_ROUTER_MSG_INBOX] = "inbox",
        [KVF_ROUTER_MSG_ID_TAKEN] = "id_taken",
        [KVF_ROUTER_MSG_NOT_ASSIGNED] = "not_assigned",
        [KVF_ROUTER_MSG_DESCRIPTOR] = "descriptor",
    };
    return (unsigned)why < KVF_ROUTER_N_MSG_REFUSALS ? names[why] : "?";
}

void kvf_router__refuse(kvf_router_t *r, kvf_router_msg_refusal_t why, const char *fmt, ...)
{
    kvf_refusals_t *c = &r->count.messages_refused;
    if (!c->names) {
        static const char *names[KVF_ROUTER_N_MSG_REFUSALS];
        for (int i = 0; i < KVF_ROUTER_N_MSG_REFUSALS; i++)
            names[i] = kvf_router_msg_refusal_name((kvf_router_msg_refusal_t)i);
        kvf_refusals_init(c, names, KVF_ROUTER_N_MSG_REFUSALS);
    }
    char text[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    kvf_refusals_note(c, (unsigned)why, "%s", text);
}

/* Empties n's slot: references to it no longer resolve. */
static void node_free(kvf_router_t *r, kvf_router_node_t *n)
{
    if (n->used) /* a free slot's timer was never set up */
        kvf_timer_cancel(kvf_evloop_timers(r->loop), &n->liveness);
    free(n->xfer_desc);
    kvf_router__prefix_drop(n);
    memset(n, 0, sizeof(*n));
}

/* Heartbeats missed: the node is dead, its requests are sent again. The
 * loop may have been busy past the deadline with the heartbeats waiting in
 * the inbox: those are taken first, and one from n keeps it alive. */
static void on_liveness_timer(kvf_timer_t *t, void *arg)
{
    kvf_router_t *r = arg;
    kvf_router_node_t *n = (kvf_router_node_t *)((char *)t - offsetof(kvf_router_node_t, liveness));
    kvf_node_ref_t ref = kvf_router__node_ref(r, n);
    kvf_router__recv_nodes(r);
    if (kvf_router__node_get(r, ref) != n || n->state == NODE_DEAD || kvf_timer_armed(t))
        return; /* it left, restarted, or was seen meanwhile */
    kvf_router__node_lost(r, n, "missed its heartbeats: dead");
}

/* (Re-)arms n's liveness deadline: dead_after_missed heartbeats from now.
 * Fails (NOMEM) only for a node not armed yet. */
static kvf_status_t node_seen(kvf_router_t *r, kvf_router_node_t *n)
{
    uint64_t dead_ms = (uint64_t)r->cfg.heartbeat_ms * r->cfg.dead_after_missed;
    return kvf_timer_arm_in_ms(kvf_evloop_timers(r->loop), &n->liveness, dead_ms);
}

/* token: the registration's (status KVF_OK), else NULL. */
static void reply_register(kvf_router_t *r, const char *url, const char *node_id,
                           kvf_status_t status, const char *error, const uint8_t *token)
{
    Kvf__RegisterReply rr = KVF__REGISTER_REPLY__INIT;
    rr.node_id = (char *)node_id;
    rr.status = status;
    rr.error = (char *)(error ? error : "");
    rr.heartbeat_ms = r->cfg.heartbeat_ms;
    if (status == KVF_OK)
        rr.prefix_key = (ProtobufCBinaryData){sizeof(r->prefix_key), r->prefix_key};
    if (token)
        rr.reg_token = (ProtobufCBinaryData){KVF_REG_TOKEN_LEN, (uint8_t *)token};
    kvf_envelope_t env;
    kvf_envelope_init(&env, "router");
    env.body_case = KVF__ENVELOPE__BODY_REGISTER_REPLY;
    env.register_reply = &rr;
    env.sender = "router";
    kvf_status_t st = kvf_outboxes_send(r->outboxes, url, &env, ROUTER_CONNECT_TIMEOUT_MS);
    if (st != KVF_OK)
        kvf_log_warn("register reply to %s: %s", url, kvf_status_str(st));
}

const char *kvf_router_refusal_name(kvf_router_refusal_t why)
{
    static const char *const names[KVF_ROUTER_N_REFUSALS] = {
        [KVF_ROUTER_REFUSED_INVALID] = "invalid",
        [KVF_ROUTER_REFUSED_MODEL_SHAPE] = "model_shape",
        [KVF_ROUTER_REFUSED_BLOCK_SIZE] = "block_size",
        [KVF_ROUTER_REFUSED_KV_DTYPE] = "kv_dtype",
        [KVF_ROUTER_REFUSED_LAYOUT] = "layout",
        [KVF_ROUTER_REFUSED_FINGERPRINT] = "fingerprint",
        [KVF_ROUTER_REFUSED_DESCRIPTOR] = "descriptor",
    };
    return (unsigned)why < KVF_ROUTER_N_REFUSALS ? names[why] : "?";
}

/* Why geometry g cannot join a cluster whose nodes use cg (in msg), or
 * NULL; *reason_p says which part differs. */
static const char *geometry_refusal(const Kvf__KvGeometry *g, const Kvf__KvGeometry *cg,
                                    char *msg, size_t msg_len, kvf_router_refusal_t *reason_p)
{
    if (g->block_size != cg->block_size) {
        *reason_p = KVF_ROUTER_REFUSED_BLOCK_SIZE;
        snprintf(msg, msg_len, "KV block size %u differs from the cluster's %u", g->block_size,
                 cg->block_size);
        return msg;
    }
    if (g->dtype != cg->dtype) {
        *reason_p = KVF_ROUTER_REFUSED_KV_DTYPE;
        snprintf(msg, msg_len, "KV dtype %s differs from the cluster's %s (--kv-dtype)",
                 kvf_kv_dtype_name((kvf_kv_dtype_t)g->dtype),
                 kvf_kv_dtype_name((kvf_kv_dtype_t)cg->dtype));
        return msg;
    }
    if (g->layout != cg->layout) {
        *reason_p = KVF_ROUTER_REFUSED_LAYOUT;
        snprintf(msg, msg_len, "KV layout %u differs from the cluster's %u", g->layout,
                 cg->layout);
        return msg;
    }
    return NULL;
}

/* Why a decode node's transfer descriptor would be refused by the prefill
 * nodes (the same checks, kvf_xfer_check_desc_for, against the geometry
 * it registers with), or NULL. */
/* The transport's view of a registered KV geometry. */
static kvf_xfer_geometry_t xfer_geometry(const Kvf__KvGeometry *g)
{
    return (kvf_xfer_geometry_t){
        .block_size = g->block_size,
        .n_layers = g->n_layers,
        .n_kv_heads = g->n_kv_heads,
        .head_dim = g->head_dim,
        .dtype = (uint32_t)g->dtype,
        .layout = g->layout,
    };
}

static const char *descriptor_refusal(const Kvf__Register *reg, char *msg, size_t msg_len,
                                      kvf_router_refusal_t *reason_p)
{
    if (reg->role != KVF__ROLE__ROLE_DECODE)
        return NULL;
    kvf_xfer_geometry_t xg = xfer_geometry(reg->geometry);
    char why[200];
    if (kvf_xfer_check_desc_for(&xg, reg->xfer_desc.data, reg->xfer_desc.len, why, sizeof(why)) ==
        KVF_OK)
        return NULL;
    *reason_p = KVF_ROUTER_REFUSED_DESCRIPTOR;
    snprintf(msg, msg_len, "transfer descriptor refused: %s", why);
    return msg;
}

/* Why reg cannot join this cluster (in msg when formatted), or NULL;
 * *reason_p says what kind of refusal it is. */
static const char *register_refusal(const kvf_router_t *r, const Kvf__Register *reg, char *msg,
                                    size_t msg_len, kvf_router_refusal_t *reason_p)
{
    const Kvf__KvGeometry *g = reg->geometry;
    *reason_p = KVF_ROUTER_REFUSED_INVALID;
    if (!*reg->node_id || strlen(reg->node_id) >= ROUTER_ID_LEN)
        return "node id missing or too long";
    if (reg->role != KVF__ROLE__ROLE_PREFILL && reg->role != KVF__ROLE__ROLE_DECODE)
        return "role must be prefill or decode";
    if (!g || g->block_size == 0 || g->block_size > 256)
        return "KV geometry missing or block size outside 1..256";
    if (kvf_kv_dtype_name((kvf_kv_dtype_t)g->dtype)[0] == '?')
        return "KV dtype unknown";
    if (reg->role == KVF__ROLE__ROLE_DECODE && reg->xfer_desc.len == 0)
        return "decode node without a transfer descriptor";
    if ((int)g->n_layers != r->model.n_layers || (int)g->n_kv_heads != r->model.n_kv_heads ||
        (int)g->head_dim != r->model.head_dim) {
        *reason_p = KVF_ROUTER_REFUSED_MODEL_SHAPE;
        snprintf(msg, msg_len,
                 "KV geometry %u layers x %u kv heads x %u head dim does not match the model "
                 "(%d x %d x %d)",
                 g->n_layers, g->n_kv_heads, g->head_dim, r->model.n_layers, r->model.n_kv_heads,
                 r->model.head_dim);
        return msg;
    }
    if (r->nodes.have_geometry) {
        const char *why = geometry_refusal(g, &r->nodes.geometry, msg, msg_len, reason_p);
        if (why)
            return why;
    }
    if (r->nodes.fingerprint[0] && strcmp(r->nodes.fingerprint, reg->model_fingerprint) != 0) {
        *reason_p = KVF_ROUTER_REFUSED_FINGERPRINT;
        snprintf(msg, msg_len, "model fingerprint %.32s differs from the cluster's %s",
                 reg->model_fingerprint, r->nodes.fingerprint);
        return msg;
    }
    return descriptor_refusal(reg, msg, msg_len, reason_p);
}

/* Fills the free slot n from reg; false when out of memory (n left
 * free). */
static bool node_fill(kvf_router_t *r, kvf_router_node_t *n, const Kvf__Register *reg)
{
    kvf_timer_init(&n->liveness, on_liveness_timer, r);
    n->xfer_desc = reg->xfer_desc.len ? malloc(reg->xfer_desc.len) : NULL;
    if ((reg->xfer_desc.len && !n->xfer_desc) || node_seen(r, n) != KVF_OK) {
        free(n->xfer_desc);
        memset(n, 0, sizeof(*n));
        return false;
    }
    if (reg->xfer_desc.len)
        memcpy(n->xfer_desc, reg->xfer_desc.data, reg->xfer_desc.len);
    if (kvf_identity_draw(n->token) != KVF_OK) {
        kvf_timer_cancel(kvf_evloop_timers(r->loop), &n->liveness);
        free(n->xfer_desc);
        memset(n, 0, sizeof(*n));
        return false;
    }
    n->xfer_desc_len = reg->xfer_desc.len;
    kvf_router__node_take(r, n, reg);
    return true;
}

void kvf_router__node_take(kvf_router_t *r, kvf_router_node_t *n, const Kvf__Register *reg)
{
    n->used = true;
    if (++r->nodes.last_gen == 0) /* 0 is no generation (KVF_NODE_NONE) */
        r->nodes.last_gen = 1;
    n->gen = r->nodes.last_gen;
    snprintf(n->id, sizeof(n->id), "%s", reg->node_id);
    snprintf(n->inbox, sizeof(n->inbox), "%s", reg->inbox_url);
    n->role = reg->role;
    n->block_size = reg->geometry->block_size;
    n->capacity_blocks = reg->capacity_blocks;
    n->max_running = reg->max_running;
    n->max_context = reg->max_context;
    n->prefill_local = reg->prefill_local;
    n->prefix_pull = reg->prefix_pull;
    n->state = NODE_LIVE;
    n->blocks_free = n->blocks_total = reg->capacity_blocks;
    n->registered_ns = kvf_clock_ns();
    if (!r->nodes.have_geometry) {
        r->nodes.geometry = *reg->geometry;
        r->nodes.geometry.base.descriptor = &kvf__kv_geometry__descriptor;
        r->nodes.have_geometry = true;
    }
    if (!r->nodes.fingerprint[0])
        snprintf(r->nodes.fingerprint, sizeof(r->nodes.fingerprint), "%s", reg->model_fingerprint);
}

/* Whether reg may take over n, the live registration of its id: it
 * presents n's token (the same node again: restarting, or registering
 * again as asked), or it is a retry from n's inbox that crossed our reply
 * (*repeat_p: answer again, nothing changes). Otherwise the id is taken
 * until n is silent for the death timeout (it is then NODE_DEAD). */
static bool may_take_over(const kvf_router_node_t *n, const Kvf__Register *reg,
                          ProtobufCBinaryData token, bool *repeat_p)
{
    bool same_inbox = !strcmp(n->inbox, reg->inbox_url);
    *repeat_p = false;
    if (kvf_identity_equal(token.data, token.len, n->token, sizeof(n->token))) {
        *repeat_p = same_inbox;
        return true;
    }
    if (same_inbox && !token.len && n->registered_ns + REGISTER_RETRY_NS > kvf_clock_ns()) {
        *repeat_p = true;
        return true;
    }
    return false;
}

/* The slot for reg: n (the id's registration, freed after its requests
 * went elsewhere) or a free one; NULL when the table is full. */
static kvf_router_node_t *register_slot(kvf_router_t *r, kvf_router_node_t *n)
{
    if (n) {
        /* The same id again: the node restarted; what it held is gone. */
        if (n->state != NODE_DEAD)
            kvf_router__node_lost(r, n, "registered again (restarted)");
        node_free(r, n);
        return n;
    }
    for (int i = 0; i < ROUTER_MAX_NODES; i++)
        if (!r->nodes.slots[i].used)
            return &r->nodes.slots[i];
    return NULL;
}

void kvf_router__on_register(kvf_router_t *r, const Kvf__Register *reg,
                             ProtobufCBinaryData token)
{
    if (!reg->inbox_url || !*reg->inbox_url || strlen(reg->inbox_url) >= ROUTER_URL_LEN) {
        kvf_log_warn("register without a usable inbox dropped");
        r->count.malformed++;
        return;
    }
    char msg[256];
    kvf_router_refusal_t reason;
    const char *why = register_refusal(r, reg, msg, sizeof(msg), &reason);
    if (why) {
        r->count.register_refused[reason]++;
        kvf_log_warn("refused node %s at %s: %s", reg->node_id, reg->inbox_url, why);
        reply_register(r, reg->inbox_url, reg->node_id, KVF_ERR_MISMATCH, why, NULL);
        return;
    }
    kvf_router_node_t *n = node_find(r, reg->node_id);
    bool repeat = false;
    if (n && n->state != NODE_DEAD && !may_take_over(n, reg, token, &repeat)) {
        kvf_router__refuse(r, KVF_ROUTER_MSG_ID_TAKEN,
                           "register of node %s from %s: the id is live at %s", n->id,
                           reg->inbox_url, n->inbox);
        /* Not final: a real restart gets in once the old one is dead. */
        reply_register(r, reg->inbox_url, reg->node_id, KVF_ERR_AGAIN,
                       "node id is live from another registration", NULL);
        return;
    }
    if (repeat) {
        reply_register(r, n->inbox, n->id, KVF_OK, NULL, n->token);
        return;
    }
    n = register_slot(r, n);
    if (!n) {
        reply_register(r, reg->inbox_url, reg->node_id, KVF_ERR_NO_SPACE,
                       "the router's node table is full", NULL);
        return;
    }
    if (!node_fill(r, n, reg)) {
        reply_register(r, reg->inbox_url, reg->node_id, KVF_ERR_NOMEM, "out of memory", NULL);
        return;
    }
    kvf_log_info("node %s registered: %s%s at %s, %u blocks of %u tokens", n->id,
                 kvf_router__role_name(n->role), n->prefill_local ? " (+prefill)" : "", n->inbox,
                 n->capacity_blocks, n->block_size);
    reply_register(r, n->inbox, n->id, KVF_OK, NULL, n->token);
    /* A node registering again (the router lost it, or restarted) may
     * cache blocks already: it lists them anew. */
    kvf_router__prefix_resync(r, n);
    kvf_router__drain_queue(r);
}

/* Tells a node the router does not know to register again. */
static void refuse_heartbeat(kvf_router_t *r, const Kvf__Heartbeat *hb)
{
    if (!*hb->inbox_url || strlen(hb->inbox_url) >= ROUTER_URL_LEN)
        return;
    Kvf__Error e = KVF__ERROR__INIT;
    e.status = KVF_ERR_NOT_FOUND;
    e.message = "unknown node: register again";
    kvf_envelope_t env;
    kvf_envelope_init(&env, "router");
    env.body_case = KVF__ENVELOPE__BODY_ERROR;
    env.error = &e;
    kvf_router__send(r, hb->inbox_url, &env);
}

void kvf_router__node_load(kvf_router_node_t *n, const Kvf__Load *load)
{
    if (load) {
        n->blocks_free = load->blocks_free;
        n->blocks_used = load->blocks_used;
        n->blocks_total = load->blocks_total;
        n->blocks_cached = load->blocks_cached;
        n->tier_ram_blocks = load->tier_ram_blocks;
        n->tier_disk_blocks = load->tier_disk_blocks;
        n->disk_read_ns = load->tier_disk_read_ns;
        n->disk_read_busy_ns = load->tier_disk_read_busy_ns;
        n->disk_read_bytes = load->tier_disk_read_bytes;
        n->disk_io_threads = load->tier_disk_io_threads;
        n->running = load->running;
        n->queued_requests = load->queued_requests;
        n->queued_tokens = load->queued_tokens;
    }
    n->pending_blocks = n->pending_running = 0;
    n->pending_tokens = 0;
    n->finished_blocks = n->finished_running = 0;
    n->load_gen++;
}

void kvf_router__node_unload(kvf_router_t *r, const kvf_router_req_t *q)
{
    kvf_router_node_t *d = kvf_router__node_get(r, q->place.decode);
    if (!d || !q->place.blocks)
        return;
    if (q->place.load_gen != d->load_gen) {
        /* in the heartbeat's numbers, free on the node by now */
        d->finished_blocks += q->place.blocks;
        d->finished_running++;
        return;
    }
    /* sent after d's last heartbeat: still counted as handed out */
    d->pending_blocks -= q->place.blocks < d->pending_blocks ? q->place.blocks : d->pending_blocks;
    d->pending_running -= d->pending_running ? 1 : 0;
}

/* A decode node's heartbeat names a transfer descriptor other than the
 * one held (it listens anew: docs/transfer-recovery.md): checked as at
 * Register, then handed to prefill nodes from the next dispatch on. */
static void heartbeat_descriptor(kvf_router_t *r, kvf_router_node_t *n, ProtobufCBinaryData desc)
{
    if (desc.len == n->xfer_desc_len && !memcmp(desc.data, n->xfer_desc, desc.len))
        return;
    char why[200];
    kvf_xfer_geometry_t xg = xfer_geometry(&r->nodes.geometry);
    if (n->role != KVF__ROLE__ROLE_DECODE || !r->nodes.have_geometry ||
        kvf_xfer_check_desc_for(&xg, desc.data, desc.len, why, sizeof(why)) != KVF_OK) {
        kvf_router__refuse(r, KVF_ROUTER_MSG_DESCRIPTOR,
                           "node %s: new transfer descriptor refused (the old one stays)", n->id);
        return;
    }
    uint8_t *copy = malloc(desc.len);
    if (!copy) {
        kvf_log_error("node %s: out of memory taking its new transfer descriptor", n->id);
        return;
    }
    memcpy(copy, desc.data, desc.len);
    free(n->xfer_desc);
    n->xfer_desc = copy;
    n->xfer_desc_len = desc.len;
    kvf_log_info("node %s listens on a new transfer endpoint: prefill nodes get its new "
                 "descriptor",
                 n->id);
}

void kvf_router__on_heartbeat(kvf_router_t *r, const Kvf__Heartbeat *hb)
{
    kvf_router_node_t *n = node_find(r, hb->node_id);
    if (!n || n->state == NODE_DEAD) {
        refuse_heartbeat(r, hb);
        return;
    }
    if (strcmp(hb->inbox_url, n->inbox) != 0) {
        kvf_router__refuse(r, KVF_ROUTER_MSG_INBOX, "heartbeat of node %s from %s, registered at %s",
                           n->id, hb->inbox_url, n->inbox);
        return;
    }
    node_seen(r, n); /* armed while live: re-arming cannot fail */
    if (hb->xfer_desc.len)
        heartbeat_descriptor(r, n, hb->xfer_desc);
    kvf_router__node_load(n, hb->load);
    if (hb->load && n->disk_read_ns)
        kvf_router__observe_disk_reads(r, n);
    /* A heartbeat sent after the failed transfer shows the node alive. */
    if (n->suspect_since_ns &&
        kvf_clock_ns() - n->suspect_since_ns >= (uint64_t)r->cfg.heartbeat_ms * 1000000ull)
        n->suspect_since_ns = 0;
    kvf_node_state_t st = strcmp(hb->state, "draining") == 0 ? NODE_DRAINING : NODE_LIVE;
    if (n->state == NODE_QUARANTINED)
        kvf_router__quarantine_beat(r, n); /* a heartbeat does not end it */
    else {
        if (st != n->state)
            kvf_log_info("node %s is %s", n->id, node_state_names[st]);
        n->state = st;
    }
    kvf_router__on_work(r, n, hb->working, hb->n_working);
    kvf_router__drain_queue(r);
}

void kvf_router__on_deregister(kvf_router_t *r, const Kvf__Deregister *d)
{
    kvf_router_node_t *n = node_find(r, d->node_id);
    if (!n)
        return;
    /* Not live before its requests are placed again: none goes back to it
     * (node_lost marks it dead before it re-dispatches). */
    n->state = NODE_DEAD;
    kvf_router__node_lost(r, n, "deregistered");
    kvf_log_info("node %s left: %s", n->id, d->reason);
    node_free(r, n);
}

void kvf_router__registry_fini(kvf_router_t *r)
{
    for (int i = 0; i < ROUTER_MAX_NODES; i++)
        node_free(r, &r->nodes.slots[i]);
}

/* ---- health and metrics ------------------------------------------------------ */

kvf_status_t kvf_router_health(kvf_router_t *r, char *why, size_t why_len)
{
    unsigned prefill = 0, decode = 0, decode_local = 0, quarantined = 0;
    for (int i = 0; i < ROUTER_MAX_NODES; i++) {
        const kvf_router_node_t *n = &r->nodes.slots[i];
        quarantined += n->used && n->state == NODE_QUARANTINED;
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
    snprintf(why, why_len, "%u prefill, %u decode (%u with --prefill-local) live, %u quarantined",
             prefill, decode + decode_local, decode_local, quarantined);
    return KVF_OK;
}

kvf_status_t kvf_router_snapshot(kvf_router_t *r, kvf_router_snapshot_t *snap)
{
    size_t n = 0;
    for (int i = 0; i < ROUTER_MAX_NODES; i++)
        n += r->nodes.slots[i].used;
    kvf_router_node_info_t *nodes = calloc(n ? n : 1, sizeof(*nodes));
    if (!nodes)
        return KVF_ERR_NOMEM;
    snap->local_prefills = r->count.local_prefills;
    size_t k = 0;
    for (int i = 0; i < ROUTER_MAX_NODES; i++) {
        const kvf_router_node_t *node = &r->nodes.slots[i];
        if (!node->used)
            continue;
        kvf_router_node_info_t *info = &nodes[k++];
        snprintf(info->id, sizeof(info->id), "%s", node->id);
        info->role = kvf_router__role_name(node->role);
        info->state = node_state_names[node->state];
        info->prefill_local = node->prefill_local;
        info->blocks_used = node->blocks_used;
        info->blocks_total = node->blocks_total;
        info->blocks_cached = node->blocks_cached;
        info->tier_ram_blocks = node->tier_ram_blocks;
        info->tier_disk_blocks = node->tier_disk_blocks;
        info->running = node->running;
        info->queued_requests = node->queued_requests;
        info->queued_tokens = node->queued_tokens;
        info->dispatched = node->dispatched;
        info->prefix_indexed = node->prefix.n;
    }
    snap->requests_queued = r->queue_len;
    snap->requests_running = (uint32_t)(r->count.running - r->queue_len);
    snap->n_nodes = n;
    snap->nodes = nodes;
    memcpy(snap->register_refused, r->count.register_refused, sizeof(snap->register_refused));
    for (int i = 0; i < KVF_ROUTER_N_MSG_REFUSALS; i++)
        snap->messages_refused[i] = r->count.messages_refused.count[i];
    return KVF_OK;
}

void kvf_router_snapshot_fini(kvf_router_snapshot_t *snap)
{
    free(snap->nodes);
    snap->nodes = NULL;
    snap->n_nodes = 0;
}
