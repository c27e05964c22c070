/* The router trusts nothing a node's message says about itself
 * (docs/PROTOCOL.md, "Identity"): the messages here reach the router's
 * inbox as real envelopes, as a rogue process on the host would send them.
 * An id live elsewhere cannot be taken over (but a silent one can, and a
 * node presenting its token at once), heartbeats from another inbox are
 * refused, tokens, PrefillDone and Error count only from the attempt's
 * nodes, a bad transfer descriptor is refused at registration, a failing
 * decode node is excluded and then quarantined until a probe succeeds,
 * and a node that leaves is not handed back its requests. Each refusal
 * is counted in /metrics. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>

#include <cmocka.h>

#include "../../transport/xfer_internal.h"
#include "kvf/clock.h"
#include "kvf/crc32c.h"
#include "router_fixture.h"
#include "router_internal.h"

static int setup(void **state)
{
    return rfx_setup(state, 60000, 60000, NULL);
}

/* Sends env to the router's inbox as `sender`, with token (NULL: none),
 * and runs the router's loop until it took it (a bounded wait). */
static void send_as(fixture_t *fx, kvf_envelope_t *env, const char *sender, const uint8_t *token)
{
    kvf_outbox_t *ob = NULL;
    assert_int_equal(kvf_outbox_create(fx->urls[0], &ob), KVF_OK);
    env->sender = (char *)sender;
    if (token)
        env->reg_token = (ProtobufCBinaryData){KVF_REG_TOKEN_LEN, (uint8_t *)token};
    assert_int_equal(kvf_outbox_send(ob, env, 2000), KVF_OK);
    /* Only the inbox, not the loop: the nodes here send no heartbeats,
     * and the loop's timers would declare them dead. */
    struct pollfd pfd = {.fd = kvf_inbox_fd(fx->r->inbox), .events = POLLIN};
    assert_int_equal(poll(&pfd, 1, 5000), 1);
    kvf_router__recv_nodes(fx->r);
    kvf_outbox_destroy(ob);
}

static unsigned long long refused(fixture_t *fx, const char *reason)
{
    char line[96];
    snprintf(line, sizeof(line), "kvf_messages_refused_total{reason=\"%s\"} ", reason);
    return rfx_metric(fx, line);
}

/* A heartbeat of node id from inbox, with token (NULL: none); desc
 * (len bytes; NULL: none) as its new transfer descriptor
 * (kvf_xfer_relisten). */
static void send_heartbeat_desc(fixture_t *fx, const char *id, const char *inbox,
                                const uint8_t *token, const uint8_t *desc, size_t len)
{
    Kvf__Load load = KVF__LOAD__INIT;
    load.blocks_free = load.blocks_total = 64;
    Kvf__Heartbeat hb = KVF__HEARTBEAT__INIT;
    hb.node_id = (char *)id;
    hb.inbox_url = (char *)inbox;
    hb.state = "live";
    hb.load = &load;
    hb.xfer_desc = (ProtobufCBinaryData){desc ? len : 0, (uint8_t *)desc};
    kvf_envelope_t env;
    kvf_envelope_init(&env, id);
    env.body_case = KVF__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    send_as(fx, &env, id, token);
}

static void send_heartbeat(fixture_t *fx, const char *id, const char *inbox, const uint8_t *token)
{
    send_heartbeat_desc(fx, id, inbox, token, NULL, 0);
}

/* The cluster's KV geometry (the router's model, 16-token blocks). */
static Kvf__KvGeometry cluster_geometry(fixture_t *fx)
{
    const kvf_model_config_t *m = kvf_router_model(fx->r);
    Kvf__KvGeometry g = KVF__KV_GEOMETRY__INIT;
    g.block_size = 16;
    g.layout = 1;
    g.n_layers = (uint32_t)m->n_layers;
    g.n_kv_heads = (uint32_t)m->n_kv_heads;
    g.head_dim = (uint32_t)m->head_dim;
    return g;
}

static void send_register(fixture_t *fx, const char *id, const char *inbox, const uint8_t *token)
{
    Kvf__KvGeometry g = cluster_geometry(fx);
    uint8_t desc[128];
    size_t desc_len;
    rfx_xfer_desc(&g, desc, &desc_len);
    Kvf__Register reg = KVF__REGISTER__INIT;
    reg.node_id = (char *)id;
    reg.role = KVF__ROLE__ROLE_DECODE;
    reg.inbox_url = (char *)inbox;
    reg.model_fingerprint = "fp";
    reg.geometry = &g;
    reg.capacity_blocks = 64;
    reg.xfer_desc = (ProtobufCBinaryData){desc_len, desc};
    kvf_envelope_t env;
    kvf_envelope_init(&env, id);
    env.body_case = KVF__ENVELOPE__BODY_REGISTER;
    env.register_ = &reg;
    send_as(fx, &env, id, token);
}

/* Attack 1: a Register reusing a live id from another inbox is refused
 * (AGAIN, not final), the real node's heartbeats keep it where it was,
 * heartbeats naming another inbox are refused; a restart gets in once the
 * old registration is dead, or at once with the old token. */
static void test_identity_takeover(void **state)
{
    fixture_t *fx = *state;
    rfx_register_decode(fx, "d1", fx->urls[2]);
    kvf_router_node_t *d1 = rfx_node_named(fx, "d1");
    uint8_t token[KVF_REG_TOKEN_LEN];
    memcpy(token, d1->token, sizeof(token));
    uint32_t gen = d1->gen;

    send_register(fx, "d1", fx->urls[3], NULL);
    assert_string_equal(d1->inbox, fx->urls[2]);
    assert_int_equal(d1->gen, gen);
    assert_int_equal(refused(fx, "id_taken"), 1);
    kvf_envelope_t *rr = rfx_node_recv(fx, 1, KVF__ENVELOPE__BODY_REGISTER_REPLY, 2000);
    assert_non_null(rr);
    assert_int_equal(rr->register_reply->status, KVF_ERR_AGAIN);
    assert_int_equal(rr->register_reply->reg_token.len, 0);
    kvf_envelope_free(rr);

    /* Heartbeats: without the token, or from another inbox, refused. */
    send_heartbeat(fx, "d1", fx->urls[3], NULL);
    assert_int_equal(refused(fx, "token"), 1);
    send_heartbeat(fx, "d1", fx->urls[3], token);
    assert_int_equal(refused(fx, "inbox"), 1);
    send_heartbeat(fx, "d1", fx->urls[2], token);
    assert_int_equal(refused(fx, "inbox"), 1);
    assert_int_equal(d1->state, NODE_LIVE);

    /* The same node again with its token (a restart from elsewhere): at once. */
    send_register(fx, "d1", fx->urls[3], token);
    assert_string_equal(d1->inbox, fx->urls[3]);
    assert_true(d1->gen != gen);
    rr = rfx_node_recv(fx, 1, KVF__ENVELOPE__BODY_REGISTER_REPLY, 2000);
    assert_non_null(rr);
    assert_int_equal(rr->register_reply->status, KVF_OK);
    assert_int_equal(rr->register_reply->reg_token.len, KVF_REG_TOKEN_LEN);
    assert_memory_equal(rr->register_reply->reg_token.data, d1->token, KVF_REG_TOKEN_LEN);
    assert_memory_not_equal(d1->token, token, KVF_REG_TOKEN_LEN);
    kvf_envelope_free(rr);

    /* A new process without the token gets in once the old one is dead. */
    d1->state = NODE_DEAD; /* as the liveness timer leaves it */
    send_register(fx, "d1", fx->urls[2], NULL);
    assert_string_equal(rfx_node_named(fx, "d1")->inbox, fx->urls[2]);
    assert_int_equal(rfx_node_named(fx, "d1")->state, NODE_LIVE);
    assert_int_equal(refused(fx, "id_taken"), 1);
}

typedef struct {
    bool finished;
    int finish;
    uint32_t tokens;
    char text[64];
} outcome_t;

static void on_chunk(void *arg, const kvf_router_chunk_t *c)
{
    outcome_t *o = arg;
    o->tokens = c->completion_tokens;
    size_t at = strlen(o->text);
    if (c->text_len < sizeof(o->text) - at)
        memcpy(o->text + at, c->text, c->text_len);
    if (c->finish != KVF__FINISH_REASON__FINISH_NONE) {
        o->finished = true;
        o->finish = c->finish;
    }
}

static void send_tokens(fixture_t *fx, const char *as, const uint8_t *token, uint64_t id,
                        uint64_t epoch, uint32_t pos, const char *text, Kvf__FinishReason fin)
{
    uint32_t t = 100 + pos;
    Kvf__TokenChunk c = KVF__TOKEN_CHUNK__INIT;
    c.req_id = id;
    c.epoch = epoch;
    c.tokens = &t;
    c.n_tokens = 1;
    c.n_generated = pos + 1;
    c.text = (ProtobufCBinaryData){strlen(text), (uint8_t *)text};
    c.finish_reason = fin;
    Kvf__TokenChunk *cp = &c;
    Kvf__TokenBatch b = KVF__TOKEN_BATCH__INIT;
    b.node_id = (char *)as;
    b.chunks = &cp;
    b.n_chunks = 1;
    kvf_envelope_t env;
    kvf_envelope_init(&env, as);
    env.body_case = KVF__ENVELOPE__BODY_TOKEN_BATCH;
    env.token_batch = &b;
    send_as(fx, &env, as, token);
}

static void send_error(fixture_t *fx, const char *as, const uint8_t *token, uint64_t id,
                       uint64_t epoch, kvf_status_t status)
{
    Kvf__Error e = KVF__ERROR__INIT;
    e.req_id = id;
    e.epoch = epoch;
    e.status = status;
    e.message = "injected";
    e.node_id = (char *)as;
    kvf_envelope_t env;
    kvf_envelope_init(&env, as);
    env.body_case = KVF__ENVELOPE__BODY_ERROR;
    env.error = &e;
    send_as(fx, &env, as, token);
}

/* Submits a request and returns the PrefillRequest p1 (fixture node 0) got. */
static uint64_t submit(fixture_t *fx, outcome_t *o, uint64_t *epoch_p, char *decode, size_t len)
{
    memset(o, 0, sizeof(*o));
    kvf_router_gen_t g = {.prompt = "hello"};
    kvf_router_sink_t sink = {on_chunk, o};
    uint64_t id = kvf_router_submit(fx->r, &g, &sink);
    assert_true(id != 0);
    kvf_envelope_t *pr = rfx_node_recv(fx, 0, KVF__ENVELOPE__BODY_PREFILL_REQUEST, 5000);
    assert_non_null(pr);
    assert_int_equal(pr->prefill_request->req_id, id);
    *epoch_p = pr->prefill_request->epoch;
    snprintf(decode, len, "%s", pr->prefill_request->decode_node_id);
    /* The attempt's KvAlloc credential is the decode node's to check. */
    kvf_router_node_t *d = rfx_node_named(fx, decode);
    uint8_t want[KVF_ALLOC_TOKEN_LEN];
    kvf_identity_alloc_token(d->token, id, *epoch_p, want);
    assert_int_equal(pr->prefill_request->alloc_token.len, KVF_ALLOC_TOKEN_LEN);
    assert_memory_equal(pr->prefill_request->alloc_token.data, want, KVF_ALLOC_TOKEN_LEN);
    /* The router's messages carry the receiver's token. */
    assert_int_equal(pr->reg_token.len, KVF_REG_TOKEN_LEN);
    assert_memory_equal(pr->reg_token.data, rfx_node_named(fx, "p1")->token, KVF_REG_TOKEN_LEN);
    kvf_envelope_free(pr);
    return id;
}

/* Attack 2: tokens and errors injected for another client's request, from
 * a process without a registration, from one naming the decode node but
 * without its token, and from registered nodes that do not serve the
 * attempt, are all refused; the client gets the decode node's tokens
 * only. */
static void test_injected_messages(void **state)
{
    fixture_t *fx = *state;
    rfx_register(fx, KVF__ROLE__ROLE_PREFILL, "p1", fx->urls[2]);
    rfx_register_decode(fx, "d1", fx->urls[3]);
    outcome_t o;
    uint64_t epoch;
    char dec[64];
    uint64_t id = submit(fx, &o, &epoch, dec, sizeof(dec));
    assert_string_equal(dec, "d1");
    rfx_register_decode(fx, "d2", fx->urls[4]);
    const uint8_t *t_d1 = rfx_node_named(fx, "d1")->token;
    const uint8_t *t_d2 = rfx_node_named(fx, "d2")->token;
    const uint8_t *t_p1 = rfx_node_named(fx, "p1")->token;
    uint8_t forged[KVF_REG_TOKEN_LEN] = {0};

    send_tokens(fx, "rogue", NULL, id, epoch, 0, "X", KVF__FINISH_REASON__FINISH_NONE);
    send_tokens(fx, "d1", forged, id, epoch, 0, "X", KVF__FINISH_REASON__FINISH_NONE);
    send_error(fx, "d1", NULL, id, epoch, KVF_ERR_PEER);
    assert_int_equal(refused(fx, "token"), 3);
    send_tokens(fx, "d2", t_d2, id, epoch, 0, "X", KVF__FINISH_REASON__FINISH_NONE);
    send_tokens(fx, "p1", t_p1, id, epoch, 0, "X", KVF__FINISH_REASON__FINISH_NONE);
    send_error(fx, "d2", t_d2, id, epoch, KVF_ERR_PEER);
    assert_int_equal(refused(fx, "not_assigned"), 3);
    /* A body naming another node than the envelope's sender. */
    Kvf__PrefillDone pd = KVF__PREFILL_DONE__INIT;
    pd.req_id = id;
    pd.epoch = epoch;
    pd.node_id = "p1";
    kvf_envelope_t env;
    kvf_envelope_init(&env, "d2");
    env.body_case = KVF__ENVELOPE__BODY_PREFILL_DONE;
    env.prefill_done = &pd;
    send_as(fx, &env, "d2", t_d2);
    assert_int_equal(refused(fx, "sender"), 1);
    assert_false(o.finished);
    assert_int_equal(o.tokens, 0);
    kvf_router_req_t *q = kvf_router__req_find(fx->r, id);
    assert_non_null(q);
    assert_int_equal(q->place.epoch, epoch);

    /* The honest stream. */
    send_tokens(fx, "d1", t_d1, id, epoch, 0, "a", KVF__FINISH_REASON__FINISH_NONE);
    send_tokens(fx, "d1", t_d1, id, epoch, 1, "b", KVF__FINISH_REASON__FINISH_STOP);
    assert_true(o.finished);
    assert_int_equal(o.finish, KVF__FINISH_REASON__FINISH_STOP);
    assert_int_equal(o.tokens, 2);
    assert_string_equal(o.text, "ab");
}

/* Attack 3: a decode node whose transfer descriptor the prefill nodes
 * would refuse is refused at registration, with the reason. */
static void test_bad_descriptor_refused(void **state)
{
    fixture_t *fx = *state;
    const kvf_model_config_t *m = kvf_router_model(fx->r);
    Kvf__KvGeometry g = KVF__KV_GEOMETRY__INIT;
    g.block_size = 16;
    g.layout = 1;
    g.n_layers = (uint32_t)m->n_layers;
    g.n_kv_heads = (uint32_t)m->n_kv_heads;
    g.head_dim = (uint32_t)m->head_dim;
    uint8_t desc[128];
    size_t len;
    rfx_xfer_desc(&g, desc, &len);
    desc[0] ^= 0xff; /* bad magic */
    Kvf__Register reg = KVF__REGISTER__INIT;
    reg.node_id = "bad";
    reg.role = KVF__ROLE__ROLE_DECODE;
    reg.inbox_url = fx->urls[2];
    reg.model_fingerprint = "fp";
    reg.geometry = &g;
    reg.capacity_blocks = 64;
    reg.xfer_desc = (ProtobufCBinaryData){len, desc};
    kvf_router__on_register(fx->r, &reg, (ProtobufCBinaryData){0, NULL});
    kvf_envelope_t *rr = rfx_node_recv(fx, 0, KVF__ENVELOPE__BODY_REGISTER_REPLY, 2000);
    assert_non_null(rr);
    assert_int_equal(rr->register_reply->status, KVF_ERR_MISMATCH);
    assert_non_null(strstr(rr->register_reply->error, "bad magic"));
    kvf_envelope_free(rr);
    assert_null(rfx_node_named(fx, "bad"));
    assert_int_equal(rfx_metric(fx, "kvf_register_refused_total{reason=\"descriptor\"} "), 1);
    /* A descriptor for another geometry than the node registers. */
    desc[0] ^= 0xff;
    reg.inbox_url = fx->urls[3];
    g.block_size = 32; /* the descriptor says 16 */
    kvf_router__on_register(fx->r, &reg, (ProtobufCBinaryData){0, NULL});
    assert_null(rfx_node_named(fx, "bad"));
    assert_int_equal(rfx_metric(fx, "kvf_register_refused_total{reason=\"descriptor\"} "), 2);
    /* The good one joins. */
    g.block_size = 16;
    kvf_router__on_register(fx->r, &reg, (ProtobufCBinaryData){0, NULL});
    assert_non_null(rfx_node_named(fx, "bad"));
}

/* A decode node failing an attempt (a transfer to it failed) gets none of
 * that request's later attempts; failing three in a row it is
 * quarantined: no new work, /health still ok with another node, "quarantined"
 * in the snapshot and /metrics, until a heartbeat a quarantine period
 * later lets one probe attempt through, whose success ends it. */
static void test_failing_node_excluded_then_quarantined(void **state)
{
    fixture_t *fx = *state;
    rfx_register(fx, KVF__ROLE__ROLE_PREFILL, "p1", fx->urls[2]);
    rfx_register_decode(fx, "d1", fx->urls[3]);
    kvf_router_node_t *d1 = rfx_node_named(fx, "d1");
    const uint8_t *t_p1 = rfx_node_named(fx, "p1")->token;
    outcome_t o[3];
    for (int i = 0; i < 3; i++) {
        uint64_t epoch;
        char dec[64];
        uint64_t id = submit(fx, &o[i], &epoch, dec, sizeof(dec));
        assert_string_equal(dec, "d1");
        send_error(fx, "p1", t_p1, id, epoch, KVF_ERR_FORMAT); /* descriptor refused */
        /* Excluded for that request: it waits (no other decode node). */
        kvf_router_req_t *q = kvf_router__req_find(fx->r, id);
        assert_non_null(q);
        assert_int_equal(q->place.state, REQ_QUEUED);
        assert_null(rfx_node_recv(fx, 0, KVF__ENVELOPE__BODY_PREFILL_REQUEST, 100));
        d1->suspect_since_ns = 0;
    }
    assert_int_equal(d1->state, NODE_QUARANTINED);
    assert_int_equal(rfx_metric(fx, "kvf_nodes{role=\"decode\",state=\"quarantined\"} "), 1);
    char why[160];
    assert_int_equal(kvf_router_health(fx->r, why, sizeof(why)), KVF_ERR_AGAIN);
    rfx_register_decode(fx, "d2", fx->urls[4]);
    assert_int_equal(kvf_router_health(fx->r, why, sizeof(why)), KVF_OK);
    assert_non_null(strstr(why, "1 quarantined"));
    /* The queued requests went to d2, none to d1. */
    for (int i = 0; i < 3; i++) {
        kvf_envelope_t *pr = rfx_node_recv(fx, 0, KVF__ENVELOPE__BODY_PREFILL_REQUEST, 2000);
        assert_non_null(pr);
        assert_string_equal(pr->prefill_request->decode_node_id, "d2");
        kvf_envelope_free(pr);
    }
    /* A heartbeat at once keeps it quarantined; one a period later lets
     * one probe go. */
    send_heartbeat(fx, "d1", fx->urls[3], d1->token);
    assert_int_equal(d1->state, NODE_QUARANTINED);
    d1->quarantined_ns -= (uint64_t)fx->r->cfg.heartbeat_ms * 10 * 1000000ull;
    send_heartbeat(fx, "d1", fx->urls[3], d1->token);
    assert_int_equal(d1->state, NODE_LIVE);
    assert_true(d1->probing);
    rfx_node_named(fx, "d2")->state = NODE_DRAINING; /* the probe goes to d1 */
    outcome_t p;
    uint64_t epoch;
    char dec[64];
    uint64_t id = submit(fx, &p, &epoch, dec, sizeof(dec));
    assert_string_equal(dec, "d1");
    assert_int_equal(d1->state, NODE_QUARANTINED); /* one probe at a time */
    send_tokens(fx, "d1", d1->token, id, epoch, 0, "a", KVF__FINISH_REASON__FINISH_STOP);
    assert_true(p.finished);
    assert_int_equal(d1->state, NODE_LIVE);
    assert_false(d1->probing);
    assert_int_equal(d1->fail_streak, 0);
}

/* Attack 5: a decode node that leaves (Deregister, with its token) is not
 * handed back its own requests: the new attempt goes to the other one. A
 * forged Deregister is refused. */
static void test_deregister_not_handed_back(void **state)
{
    fixture_t *fx = *state;
    rfx_register(fx, KVF__ROLE__ROLE_PREFILL, "p1", fx->urls[2]);
    rfx_register_decode(fx, "d1", fx->urls[3]);
    outcome_t o;
    uint64_t epoch;
    char dec[64];
    uint64_t id = submit(fx, &o, &epoch, dec, sizeof(dec));
    assert_string_equal(dec, "d1");
    rfx_register_decode(fx, "d2", fx->urls[4]);
    /* d1 drains, then leaves. */
    send_heartbeat(fx, "d1", fx->urls[3], rfx_node_named(fx, "d1")->token);
    Kvf__Deregister d = KVF__DEREGISTER__INIT;
    d.node_id = "d1";
    d.reason = "drained";
    kvf_envelope_t env;
    kvf_envelope_init(&env, "d1");
    env.body_case = KVF__ENVELOPE__BODY_DEREGISTER;
    env.deregister = &d;
    send_as(fx, &env, "d1", NULL); /* forged */
    assert_int_equal(refused(fx, "token"), 1);
    assert_non_null(rfx_node_named(fx, "d1"));
    kvf_router_node_t *d1 = rfx_node_named(fx, "d1");
    d1->state = NODE_DRAINING;
    send_as(fx, &env, "d1", d1->token);
    assert_null(rfx_node_named(fx, "d1"));
    kvf_envelope_t *pr = rfx_node_recv(fx, 0, KVF__ENVELOPE__BODY_PREFILL_REQUEST, 2000);
    assert_non_null(pr);
    assert_int_equal(pr->prefill_request->req_id, id);
    assert_true(pr->prefill_request->epoch > epoch);
    assert_string_equal(pr->prefill_request->decode_node_id, "d2");
    kvf_envelope_free(pr);
    assert_null(rfx_node_recv(fx, 1, KVF__ENVELOPE__BODY_CANCEL, 100));
}

/* A prefill node lost mid-handoff: the decode node's Cancel says its
 * writer was lost (it listens anew: docs/transfer-recovery.md). Its
 * heartbeat's new descriptor, checked as at Register, is what the next
 * PrefillRequest hands out; one prefill nodes would refuse is dropped and
 * counted, the old one staying. */
static void test_writer_lost_and_new_descriptor(void **state)
{
    fixture_t *fx = *state;
    rfx_register(fx, KVF__ROLE__ROLE_PREFILL, "p1", fx->urls[2]);
    rfx_register_decode(fx, "d1", fx->urls[3]);
    outcome_t o;
    uint64_t epoch;
    char dec[64];
    uint64_t id = submit(fx, &o, &epoch, dec, sizeof(dec));
    assert_string_equal(dec, "d1");
    rfx_register(fx, KVF__ROLE__ROLE_PREFILL, "p2", fx->urls[4]);
    kvf_router__node_lost(fx->r, rfx_node_named(fx, "p1"), "missed its heartbeats: dead");
    kvf_envelope_t *c = rfx_node_recv(fx, 1, KVF__ENVELOPE__BODY_CANCEL, 2000);
    assert_non_null(c);
    assert_int_equal(c->cancel->req_id, id);
    assert_true(c->cancel->writer_lost);
    kvf_envelope_free(c);
    /* a client's cancel is no writer lost */
    kvf_envelope_t *pr = rfx_node_recv(fx, 2, KVF__ENVELOPE__BODY_PREFILL_REQUEST, 2000);
    assert_non_null(pr);
    kvf_envelope_free(pr);
    kvf_router_req_t *q = kvf_router__req_find(fx->r, id);
    assert_non_null(q);
    kvf_router__cancel_nodes(fx->r, q, "cancelled by the client");
    c = rfx_node_recv(fx, 1, KVF__ENVELOPE__BODY_CANCEL, 2000);
    assert_non_null(c);
    assert_false(c->cancel->writer_lost);
    kvf_envelope_free(c);

    kvf_router_node_t *d1 = rfx_node_named(fx, "d1");
    uint8_t old[128], desc[128];
    size_t old_len = d1->xfer_desc_len, len;
    memcpy(old, d1->xfer_desc, old_len);
    Kvf__KvGeometry g = cluster_geometry(fx);
    rfx_xfer_desc(&g, desc, &len);
    desc[KVF_XFER_DESC_HEADER] ^= 1; /* another body (a new endpoint), checksum now wrong */
    send_heartbeat_desc(fx, "d1", fx->urls[3], d1->token, desc, len);
    assert_int_equal(refused(fx, "descriptor"), 1);
    assert_int_equal(d1->xfer_desc_len, old_len);
    assert_memory_equal(d1->xfer_desc, old, old_len);
    uint32_t crc = kvf_crc32c(0, desc, len - 4);
    for (int i = 0; i < 4; i++)
        desc[len - 4 + (size_t)i] = (uint8_t)(crc >> (8 * i));
    send_heartbeat_desc(fx, "d1", fx->urls[3], d1->token, desc, len);
    assert_int_equal(refused(fx, "descriptor"), 1);
    assert_int_equal(d1->xfer_desc_len, len);
    assert_memory_equal(d1->xfer_desc, desc, len);
    /* the next request's PrefillRequest (to p2: p1 is dead) carries it */
    memset(&o, 0, sizeof(o));
    kvf_router_gen_t gen = {.prompt = "hello again"};
    kvf_router_sink_t sink = {on_chunk, &o};
    uint64_t id2 = kvf_router_submit(fx->r, &gen, &sink);
    assert_true(id2 != 0);
    pr = rfx_node_recv(fx, 2, KVF__ENVELOPE__BODY_PREFILL_REQUEST, 5000);
    assert_non_null(pr);
    assert_int_equal(pr->prefill_request->req_id, id2);
    assert_int_equal(pr->prefill_request->decode_xfer_desc.len, len);
    assert_memory_equal(pr->prefill_request->decode_xfer_desc.data, desc, len);
    kvf_envelope_free(pr);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_identity_takeover, setup, rfx_teardown),
        cmocka_unit_test_setup_teardown(test_injected_messages, setup, rfx_teardown),
        cmocka_unit_test_setup_teardown(test_bad_descriptor_refused, setup, rfx_teardown),
        cmocka_unit_test_setup_teardown(test_failing_node_excluded_then_quarantined, setup,
                                        rfx_teardown),
        cmocka_unit_test_setup_teardown(test_deregister_not_handed_back, setup, rfx_teardown),
        cmocka_unit_test_setup_teardown(test_writer_lost_and_new_descriptor, setup, rfx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
