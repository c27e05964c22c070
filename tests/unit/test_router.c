/* router core in-process, without nodes processes: node handles are
 * generation-counted (a handle to a node that left, or whose slot a
 * restarted node took, resolves to nothing), the deadlines are timers
 * on the router's loop (the queue timeout, the request timeout, a node's
 * missed heartbeats) that fire without any other event, and text holding
 * U+0000 reaches a native client whole, and a node whose KV format or
 * block size differs from the cluster's is refused. The router's
 * internals are driven directly on this thread, as its loop would. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvf/clock.h"
#include "kvf/tokenizer.h"
#include "kvf/clientsock.h"
#include "metrics.h"
#include "router_fixture.h"
#include "router_internal.h"

static int setup_slow(void **state)
{
    return rfx_setup(state, 60000, 60000, NULL);
}

static void test_handles(void **state)
{
    fixture_t *fx = *state;
    rfx_register_decode(fx, "d1", fx->urls[2]);
    kvf_router_node_t *n1 = rfx_node_named(fx, "d1");
    assert_non_null(n1);
    kvf_node_ref_t r1 = kvf_router__node_ref(fx->r, n1);
    assert_ptr_equal(kvf_router__node_get(fx->r, r1), n1);
    assert_null(kvf_router__node_get(fx->r, KVF_NODE_NONE));

    /* d1 leaves; d2 takes its slot: d1's handle resolves to nothing. */
    Kvf__Deregister d = KVF__DEREGISTER__INIT;
    d.node_id = "d1";
    d.reason = "test";
    kvf_router__on_deregister(fx->r, &d);
    assert_null(kvf_router__node_get(fx->r, r1));
    rfx_register_decode(fx, "d2", fx->urls[2]);
    kvf_router_node_t *n2 = rfx_node_named(fx, "d2");
    assert_ptr_equal(n2, n1); /* the same slot */
    kvf_node_ref_t r2 = kvf_router__node_ref(fx->r, n2);
    assert_true(r2 != r1);
    assert_null(kvf_router__node_get(fx->r, r1));
    assert_ptr_equal(kvf_router__node_get(fx->r, r2), n2);

    /* d2 restarts (registers again from another inbox, presenting its
     * registration's token): same id, same slot, new generation. */
    fx->present_token = true;
    rfx_register_decode(fx, "d2", fx->urls[3]);
    fx->present_token = false;
    assert_ptr_equal(rfx_node_named(fx, "d2"), n2);
    assert_null(kvf_router__node_get(fx->r, r2));
    assert_non_null(kvf_router__node_get(fx->r, kvf_router__node_ref(fx->r, n2)));
}

typedef struct {
    bool finished;
    int finish;
    kvf_status_t status;
} outcome_t;

static void on_chunk(void *arg, const kvf_router_chunk_t *c);

static void heartbeat_naming(fixture_t *fx, const char *id, const char *url, uint64_t req_id,
                             uint64_t epoch)
{
    Kvf__WorkRef w = KVF__WORK_REF__INIT;
    w.req_id = req_id;
    w.epoch = epoch;
    Kvf__WorkRef *wp = &w;
    Kvf__Load load = KVF__LOAD__INIT;
    load.blocks_free = load.blocks_total = 64;
    Kvf__Heartbeat hb = KVF__HEARTBEAT__INIT;
    hb.node_id = (char *)id;
    hb.inbox_url = (char *)url;
    hb.state = "live";
    hb.load = &load;
    hb.working = &wp;
    hb.n_working = 1;
    kvf_router__on_heartbeat(fx->r, &hb);
}

/* A transfer to a decode node failed (it may be dead, unseen): the request
 * goes to the other decode node, and the failed one gets no new work
 * until a heartbeat a period later. */
static void test_transport_failure_suspects_decode(void **state)
{
    fixture_t *fx = *state;
    rfx_register_decode(fx, "d1", fx->urls[2]);
    rfx_register(fx, KVF__ROLE__ROLE_PREFILL, "p1", fx->urls[3]);
    outcome_t o = {0};
    kvf_router_gen_t g = {.prompt = "hello"};
    kvf_router_sink_t sink = {on_chunk, &o};
    uint64_t id = kvf_router_submit(fx->r, &g, &sink);
    kvf_envelope_t *pr = rfx_node_recv(fx, 1, KVF__ENVELOPE__BODY_PREFILL_REQUEST, 5000);
    assert_non_null(pr);
    assert_string_equal(pr->prefill_request->decode_node_id, "d1");
    uint64_t epoch = pr->prefill_request->epoch;
    kvf_envelope_free(pr);
    rfx_register_decode(fx, "d2", fx->urls[2]);
    Kvf__Error e = KVF__ERROR__INIT;
    e.req_id = id;
    e.epoch = epoch;
    e.status = KVF_ERR_TRANSPORT;
    e.message = "cannot connect to the decode node";
    e.node_id = "p1";
    kvf_router__on_error(fx->r, &e, "p1");
    pr = rfx_node_recv(fx, 1, KVF__ENVELOPE__BODY_PREFILL_REQUEST, 5000);
    assert_non_null(pr);
    assert_string_equal(pr->prefill_request->decode_node_id, "d2");
    kvf_envelope_free(pr);
    kvf_router_node_t *d1 = rfx_node_named(fx, "d1");
    assert_true(d1->suspect_since_ns != 0);
    /* A heartbeat at once (maybe sent before the failure) does not clear
     * the suspicion; one a period later does. */
    heartbeat_naming(fx, "d1", fx->urls[2], 0, 0);
    assert_true(d1->suspect_since_ns != 0);
    d1->suspect_since_ns -= (uint64_t)fx->r->cfg.heartbeat_ms * 1000000ull;
    heartbeat_naming(fx, "d1", fx->urls[2], 0, 0);
    assert_int_equal(d1->suspect_since_ns, 0);
}

/* A request whose prefill node left keeps decoding, its placement still
 * naming that node; a new prefill node registers into the freed slot.
 * The old handle must not resolve to the new node: the new node's
 * heartbeat naming the attempt does not keep it alive, and cancelling the
 * request tells the decode node only. */
static void test_slot_reuse_under_live_request(void **state)
{
    fixture_t *fx = *state;
    rfx_register_decode(fx, "d1", fx->urls[2]);
    rfx_register(fx, KVF__ROLE__ROLE_PREFILL, "p1", fx->urls[3]);
    kvf_router_node_t *p1 = rfx_node_named(fx, "p1");
    assert_non_null(p1);
    kvf_node_ref_t p1_ref = kvf_router__node_ref(fx->r, p1);
    outcome_t o = {0};
    kvf_router_gen_t g = {.prompt = "hello"};
    kvf_router_sink_t sink = {on_chunk, &o};
    uint64_t id = kvf_router_submit(fx->r, &g, &sink);
    assert_true(id != 0);
    kvf_envelope_t *pr = rfx_node_recv(fx, 1, KVF__ENVELOPE__BODY_PREFILL_REQUEST, 5000);
    assert_non_null(pr);
    uint64_t epoch = pr->prefill_request->epoch;
    kvf_envelope_free(pr);
    kvf_router_req_t *q = kvf_router__req_find(fx->r, id);
    assert_non_null(q);
    assert_true(q->place.prefill == p1_ref);

    Kvf__PrefillDone pd = KVF__PREFILL_DONE__INIT;
    pd.req_id = id;
    pd.epoch = epoch;
    pd.node_id = "p1";
    kvf_router__on_prefill_done(fx->r, &pd);
    assert_int_equal(q->place.state, REQ_DECODE);
    Kvf__Deregister dr = KVF__DEREGISTER__INIT;
    dr.node_id = "p1";
    dr.reason = "test";
    kvf_router__on_deregister(fx->r, &dr);
    /* Still decoding on d1, the same attempt, naming the departed p1. */
    assert_ptr_equal(kvf_router__req_find(fx->r, id), q);
    assert_int_equal(q->place.epoch, epoch);
    assert_true(q->place.prefill == p1_ref);

    rfx_register(fx, KVF__ROLE__ROLE_PREFILL, "p2", fx->urls[3]);
    kvf_router_node_t *p2 = rfx_node_named(fx, "p2");
    assert_ptr_equal(p2, p1); /* the same slot */
    assert_null(kvf_router__node_get(fx->r, q->place.prefill));

    /* p2 naming the attempt (a forged or confused heartbeat) does not
     * move its deadline; its decode node naming it does. */
    uint64_t before = q->t.phase.deadline_ns;
    heartbeat_naming(fx, "p2", fx->urls[3], id, epoch);
    assert_int_equal(q->t.phase.deadline_ns, before);
    heartbeat_naming(fx, "d1", fx->urls[2], id, epoch);
    assert_true(q->t.phase.deadline_ns >= before);

    /* A cancel goes to d1, not to the node now in p1's slot. */
    kvf_router_cancel(fx->r, id);
    kvf_envelope_t *c = rfx_node_recv(fx, 0, KVF__ENVELOPE__BODY_CANCEL, 5000);
    assert_non_null(c);
    assert_int_equal(c->cancel->req_id, id);
    kvf_envelope_free(c);
    assert_null(rfx_node_recv(fx, 1, KVF__ENVELOPE__BODY_CANCEL, 300));
}

static void on_chunk(void *arg, const kvf_router_chunk_t *c)
{
    outcome_t *o = arg;
    if (c->finish != KVF__FINISH_REASON__FINISH_NONE) {
        o->finished = true;
        o->finish = c->finish;
        o->status = c->status;
    }
}

static bool request_finished(fixture_t *fx, void *arg)
{
    (void)fx;
    return ((outcome_t *)arg)->finished;
}

/* Submits a request (no nodes: it waits in the queue) and runs the loop
 * until it ends; returns how long that took. */
static uint64_t wait_for_end(fixture_t *fx, outcome_t *o)
{
    memset(o, 0, sizeof(*o));
    kvf_router_gen_t g = {.prompt = "hello"};
    kvf_router_sink_t sink = {on_chunk, o};
    uint64_t t0 = kvf_clock_ns();
    assert_true(kvf_router_submit(fx->r, &g, &sink) != 0);
    assert_false(o->finished);
    assert_int_equal(fx->r->queue_len, 1);
    rfx_run_until(fx, request_finished, o);
    assert_true(o->finished);
    assert_int_equal(fx->r->queue_len, 0);
    assert_null(fx->r->requests);
    return kvf_clock_ns() - t0;
}

static int setup_queue_timeout(void **state)
{
    return rfx_setup(state, 30, 60000, NULL);
}

static void test_queue_timeout(void **state)
{
    outcome_t o;
    uint64_t took = wait_for_end(*state, &o);
    assert_int_equal(o.finish, KVF__FINISH_REASON__FINISH_ERROR);
    assert_int_equal(o.status, KVF_ERR_NO_SPACE);
    assert_true(took >= 30000000ull);
}

static int setup_request_timeout(void **state)
{
    return rfx_setup(state, 60000, 30, NULL);
}

static void test_request_timeout(void **state)
{
    outcome_t o;
    uint64_t took = wait_for_end(*state, &o);
    assert_int_equal(o.finish, KVF__FINISH_REASON__FINISH_ERROR);
    assert_int_equal(o.status, KVF_ERR_TIMEOUT);
    assert_true(took >= 30000000ull);
}

static bool node_dead(fixture_t *fx, void *arg)
{
    kvf_router_node_t *n = arg;
    (void)fx;
    return n->state == NODE_DEAD;
}

/* A node that never sends a heartbeat is dead after 3 periods. */
static void test_missed_heartbeats(void **state)
{
    fixture_t *fx = *state;
    uint64_t t0 = kvf_clock_ns();
    rfx_register_decode(fx, "quiet", fx->urls[2]);
    kvf_router_node_t *n = rfx_node_named(fx, "quiet");
    assert_non_null(n);
    assert_int_equal(n->state, NODE_LIVE);
    rfx_run_until(fx, node_dead, n);
    assert_int_equal(n->state, NODE_DEAD);
    assert_true(kvf_clock_ns() - t0 >= 150000000ull);
    char why[128];
    assert_int_equal(kvf_router_health(fx->r, why, sizeof(why)), KVF_ERR_AGAIN);
}

static bool request_entered(fixture_t *fx, void *arg)
{
    (void)arg;
    return fx->r->requests != NULL;
}

/* A TokenChunk of request id: the token at position pos and its text. */
static void token_chunk(fixture_t *fx, uint64_t id, uint64_t epoch, uint32_t pos, uint32_t token,
                        const char *text, size_t len, Kvf__FinishReason finish)
{
    Kvf__TokenChunk c = KVF__TOKEN_CHUNK__INIT;
    c.req_id = id;
    c.epoch = epoch;
    c.seq = pos;
    c.tokens = &token;
    c.n_tokens = 1;
    c.n_generated = pos + 1;
    c.text.data = (uint8_t *)text;
    c.text.len = len;
    c.finish_reason = finish;
    kvf_router__on_token_chunk(fx->r, &c);
}

/* The text of the next GenerateChunk the client gets, appended to *text
 * (bytes); its finish reason. */
static int client_chunk(kvf_client_t *client, char *text, size_t *len)
{
    kvf_envelope_t *env = NULL;
    assert_int_equal(kvf_client_recv(client, 5000, &env), KVF_OK);
    assert_int_equal(env->body_case, KVF__ENVELOPE__BODY_GENERATE_CHUNK);
    const Kvf__GenerateChunk *ch = env->generate_chunk;
    assert_true(*len + ch->text.len < 64);
    if (ch->text.len)
        memcpy(text + *len, ch->text.data, ch->text.len);
    *len += ch->text.len;
    int finish = ch->finish_reason;
    kvf_envelope_free(env);
    return finish;
}

/* Text holding U+0000, as a decode node sends it (a byte-fallback token),
 * reaches the native client byte for byte; a chunk whose text is not UTF-8
 * is malformed and dropped. */
static void test_nul_text_to_native_client(void **state)
{
    fixture_t *fx = *state;
    rfx_register_decode(fx, "d1", fx->urls[2]);
    rfx_register(fx, KVF__ROLE__ROLE_PREFILL, "p1", fx->urls[3]);
    kvf_client_t *client;
    assert_int_equal(kvf_client_create(fx->urls[1], &client), KVF_OK);
    uint32_t prompt[] = {1, 5, 6};
    kvf_client_generate_t g = {.client_req_id = 7, .ids = prompt, .n_ids = 3};
    assert_int_equal(kvf_client_generate(client, "test", &g, 5000), KVF_OK);
    rfx_run_until(fx, request_entered, NULL);
    kvf_envelope_t *pr = rfx_node_recv(fx, 1, KVF__ENVELOPE__BODY_PREFILL_REQUEST, 5000);
    assert_non_null(pr);
    uint64_t id = pr->prefill_request->req_id, epoch = pr->prefill_request->epoch;
    kvf_envelope_free(pr);

    char got[64];
    size_t len = 0;
    token_chunk(fx, id, epoch, 0, 188, "\0", 1, KVF__FINISH_REASON__FINISH_NONE);
    assert_int_equal(client_chunk(client, got, &len), 0);
    assert_int_equal(len, 1); /* U+0000 alone */
    uint64_t malformed = fx->r->count.malformed;
    token_chunk(fx, id, epoch, 1, 40, "\xc3", 1, KVF__FINISH_REASON__FINISH_NONE);
    assert_int_equal(fx->r->count.malformed, malformed + 1);
    token_chunk(fx, id, epoch, 1, 41, "a\0\xc3\xa9", 4, KVF__FINISH_REASON__FINISH_NONE);
    assert_int_equal(client_chunk(client, got, &len), 0);
    token_chunk(fx, id, epoch, 2, 188, "\0", 1, KVF__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(client_chunk(client, got, &len), 0); /* the tokens, then the finish */
    assert_int_equal(client_chunk(client, got, &len), KVF__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(len, 6);
    assert_memory_equal(got, "\0a\0\xc3\xa9\0", 6);
    assert_null(fx->r->requests);
    kvf_client_destroy(client);
}

/* Reads the client's chunks up to the finishing one: its kv_bytes and
 * cached_tokens. */
static void client_final(kvf_client_t *client, uint64_t *kv_bytes_p, uint32_t *cached_p)
{
    for (;;) {
        kvf_envelope_t *env = NULL;
        assert_int_equal(kvf_client_recv(client, 5000, &env), KVF_OK);
        assert_int_equal(env->body_case, KVF__ENVELOPE__BODY_GENERATE_CHUNK);
        const Kvf__GenerateChunk *ch = env->generate_chunk;
        bool done = ch->finish_reason != KVF__FINISH_REASON__FINISH_NONE;
        *kv_bytes_p = ch->kv_bytes;
        *cached_p = ch->cached_tokens;
        kvf_envelope_free(env);
        if (done)
            return;
    }
}

/* One generation on d1/p1 whose only chunk finishes it, carrying the
 * prefill timings relayed by the decode node; with pd_first the prefill
 * node's own PrefillDone comes before that chunk, else after the request
 * ended. Either way they count once, and the client's finishing chunk
 * carries them. */
static void relayed_once(fixture_t *fx, kvf_client_t *client, uint64_t client_id, bool pd_first)
{
    uint32_t prompt[] = {1, 5, 6, 7};
    kvf_client_generate_t g = {.client_req_id = client_id, .ids = prompt, .n_ids = 4};
    assert_int_equal(kvf_client_generate(client, "test", &g, 5000), KVF_OK);
    rfx_run_until(fx, request_entered, NULL);
    kvf_envelope_t *pr = rfx_node_recv(fx, 1, KVF__ENVELOPE__BODY_PREFILL_REQUEST, 5000);
    assert_non_null(pr);
    uint64_t id = pr->prefill_request->req_id, epoch = pr->prefill_request->epoch;
    kvf_envelope_free(pr);
    uint64_t bytes0 = fx->r->count.kv_bytes, cached0 = fx->r->count.prefill_cached;
    Kvf__PrefillDone pd = KVF__PREFILL_DONE__INIT;
    pd.req_id = id;
    pd.epoch = epoch;
    pd.node_id = "p1";
    pd.prefill_compute_us = 150;
    pd.handoff_us = 20;
    pd.kv_bytes = 4096;
    pd.cached_tokens = 2;
    if (pd_first)
        kvf_router__on_prefill_done(fx->r, &pd);
    uint32_t token = 9;
    Kvf__TokenChunk c = KVF__TOKEN_CHUNK__INIT;
    c.req_id = id;
    c.epoch = epoch;
    c.tokens = &token;
    c.n_tokens = 1;
    c.n_generated = 1;
    c.finish_reason = KVF__FINISH_REASON__FINISH_LENGTH;
    c.prefill = &pd;
    kvf_router__on_token_chunk(fx->r, &c);
    assert_null(fx->r->requests);
    if (!pd_first)
        kvf_router__on_prefill_done(fx->r, &pd); /* late: the request is gone */
    uint64_t kv_bytes;
    uint32_t cached;
    client_final(client, &kv_bytes, &cached);
    assert_int_equal(kv_bytes, 4096);
    assert_int_equal(cached, 2);
    assert_int_equal(fx->r->count.kv_bytes - bytes0, 4096);
    assert_int_equal(fx->r->count.prefill_cached - cached0, 2);
}

/* The decode node may finish a request before the router hears the
 * prefill node's PrefillDone (another connection): the copy relayed on
 * the first chunk keeps the request's timings and the cluster's counters
 * whole, and never counts twice. */
static void test_prefill_done_relayed(void **state)
{
    fixture_t *fx = *state;
    rfx_register_decode(fx, "d1", fx->urls[2]);
    rfx_register(fx, KVF__ROLE__ROLE_PREFILL, "p1", fx->urls[3]);
    kvf_client_t *client;
    assert_int_equal(kvf_client_create(fx->urls[1], &client), KVF_OK);
    relayed_once(fx, client, 11, false);
    relayed_once(fx, client, 12, true);
    kvf_client_destroy(client);
}

/* The RegisterReply fixture node `node` got: its status, and its error
 * (copied into err). */
static kvf_status_t register_reply(fixture_t *fx, int node, char *err, size_t err_len)
{
    kvf_envelope_t *env = rfx_node_recv(fx, node, KVF__ENVELOPE__BODY_REGISTER_REPLY, 5000);
    assert_non_null(env);
    kvf_status_t st = env->register_reply->status;
    snprintf(err, err_len, "%s", env->register_reply->error ? env->register_reply->error : "");
    /* An accepted node gets the cluster's prefix-hash key, the same for
     * every node of this router (docs/prefix-cache.md); a refused one none. */
    const ProtobufCBinaryData *k = &env->register_reply->prefix_key;
    if (st == KVF_OK) {
        assert_int_equal(k->len, 16);
        if (fx->prefix_key_seen)
            assert_memory_equal(k->data, fx->prefix_key, 16);
        memcpy(fx->prefix_key, k->data, 16);
        fx->prefix_key_seen = true;
    } else {
        assert_int_equal(k->len, 0);
    }
    kvf_envelope_free(env);
    return st;
}

/* The first node fixes the cluster's KV block size and format: a node
 * with another format or block size is refused with both named, the
 * refusal is counted by reason in /metrics, and a node matching the
 * cluster still joins. */
static void test_register_refuses_other_kv_format(void **state)
{
    fixture_t *fx = *state;
    char err[256];
    rfx_register_decode(fx, "d1", fx->urls[2]);
    assert_int_equal(register_reply(fx, 0, err, sizeof(err)), KVF_OK);
    assert_int_equal(rfx_metric(fx, "kvf_register_refused_total{reason=\"kv_dtype\"} "), 0);

    rfx_register_pool(fx, KVF__ROLE__ROLE_PREFILL, "p1", fx->urls[3], 16,
                       KVF__KV_DTYPE__KV_DTYPE_BF16);
    assert_int_equal(register_reply(fx, 1, err, sizeof(err)), KVF_ERR_MISMATCH);
    assert_non_null(strstr(err, "KV dtype bf16 differs from the cluster's f32"));
    assert_null(rfx_node_named(fx, "p1"));
    rfx_register_pool(fx, KVF__ROLE__ROLE_PREFILL, "p1", fx->urls[3], 16,
                       KVF__KV_DTYPE__KV_DTYPE_INT8);
    assert_int_equal(register_reply(fx, 1, err, sizeof(err)), KVF_ERR_MISMATCH);
    assert_non_null(strstr(err, "KV dtype int8 differs from the cluster's f32"));
    rfx_register_pool(fx, KVF__ROLE__ROLE_PREFILL, "p1", fx->urls[3], 32,
                       KVF__KV_DTYPE__KV_DTYPE_F32);
    assert_int_equal(register_reply(fx, 1, err, sizeof(err)), KVF_ERR_MISMATCH);
    assert_non_null(strstr(err, "KV block size 32 differs from the cluster's 16"));
    rfx_register_pool(fx, KVF__ROLE__ROLE_PREFILL, "p1", fx->urls[3], 16, (Kvf__KvDtype)9);
    assert_int_equal(register_reply(fx, 1, err, sizeof(err)), KVF_ERR_MISMATCH);
    assert_null(rfx_node_named(fx, "p1"));

    assert_int_equal(rfx_metric(fx, "kvf_register_refused_total{reason=\"kv_dtype\"} "), 2);
    assert_int_equal(rfx_metric(fx, "kvf_register_refused_total{reason=\"block_size\"} "), 1);
    assert_int_equal(rfx_metric(fx, "kvf_register_refused_total{reason=\"invalid\"} "), 1);
    assert_int_equal(rfx_metric(fx, "kvf_register_refused_total{reason=\"fingerprint\"} "), 0);

    rfx_register(fx, KVF__ROLE__ROLE_PREFILL, "p1", fx->urls[3]);
    assert_int_equal(register_reply(fx, 1, err, sizeof(err)), KVF_OK);
    assert_non_null(rfx_node_named(fx, "p1"));
}

/* A native client's prompt is bytes: text holding U+0000 is tokenized
 * whole, not cut at the NUL. */
static void test_nul_prompt_from_native_client(void **state)
{
    fixture_t *fx = *state;
    rfx_register_decode(fx, "d1", fx->urls[2]);
    rfx_register(fx, KVF__ROLE__ROLE_PREFILL, "p1", fx->urls[3]);
    kvf_client_t *client;
    assert_int_equal(kvf_client_create(fx->urls[1], &client), KVF_OK);
    static const char text[] = "ab\0cd \xc3\xa9";
    size_t text_len = sizeof(text) - 1;
    kvf_client_generate_t g = {.client_req_id = 8, .prompt = text, .prompt_len = text_len};
    assert_int_equal(kvf_client_generate(client, "test", &g, 5000), KVF_OK);
    rfx_run_until(fx, request_entered, NULL);
    kvf_envelope_t *pr = rfx_node_recv(fx, 1, KVF__ENVELOPE__BODY_PREFILL_REQUEST, 5000);
    assert_non_null(pr);
    uint32_t *want;
    size_t n_want;
    assert_int_equal(kvf_tokenizer_encode(fx->r->tok, text, text_len, true, &want, &n_want),
                     KVF_OK);
    const Kvf__PrefillRequest *req = pr->prefill_request;
    assert_int_equal(req->n_token_ids, n_want);
    assert_memory_equal(req->token_ids, want, n_want * sizeof(*want));
    /* the prompt cut at the NUL would be fewer tokens */
    uint32_t *cut;
    size_t n_cut;
    assert_int_equal(kvf_tokenizer_encode(fx->r->tok, text, 2, true, &cut, &n_cut), KVF_OK);
    assert_true(n_cut < n_want);
    free(cut);
    free(want);
    kvf_envelope_free(pr);
    kvf_router_cancel(fx->r, fx->r->next_req_id - 1);
    kvf_client_destroy(client);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_handles, setup_slow, rfx_teardown),
        cmocka_unit_test_setup_teardown(test_slot_reuse_under_live_request, setup_slow, rfx_teardown),
        cmocka_unit_test_setup_teardown(test_transport_failure_suspects_decode, setup_slow,
                                        rfx_teardown),
        cmocka_unit_test_setup_teardown(test_queue_timeout, setup_queue_timeout, rfx_teardown),
        cmocka_unit_test_setup_teardown(test_request_timeout, setup_request_timeout, rfx_teardown),
        cmocka_unit_test_setup_teardown(test_missed_heartbeats, setup_slow, rfx_teardown),
        cmocka_unit_test_setup_teardown(test_nul_text_to_native_client, setup_slow, rfx_teardown),
        cmocka_unit_test_setup_teardown(test_nul_prompt_from_native_client, setup_slow, rfx_teardown),
        cmocka_unit_test_setup_teardown(test_prefill_done_relayed, setup_slow, rfx_teardown),
        cmocka_unit_test_setup_teardown(test_register_refuses_other_kv_format, setup_slow,
                                        rfx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
