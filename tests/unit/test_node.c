/* The node runtime's heartbeats (kvf/node.h), in-process against a fake
 * router and a fake decode node (two inboxes): they leave from their own
 * thread, so a loop that computes for many periods without a tick does not
 * starve them; they name the attempts the loop published and send a
 * KvLease per peer; once the loop has been silent longer than its stuck
 * bound they go on with the load alone; and none follows a Deregister. The
 * test thread plays the node's loop; its pauses stand for long computes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvf/clock.h"
#include "kvf/identity.h"
#include "kvf/node.h"

#define PERIOD_MS 50
#define STUCK_MS 400

typedef struct {
    char router_url[96], node_url[96], peer_url[96];
    kvf_inbox_t *router_in, *peer_in;
    kvf_outbox_t *to_node;
    kvf_node_t *node;
    bool name_work;
} fixture_t;

static fixture_t fx;

static void fill_load(void *arg, Kvf__Load *load)
{
    (void)arg;
    load->blocks_total = 64;
    load->blocks_free = 60;
    load->blocks_used = 4;
}

static void fill_work(void *arg, kvf_node_snapshot_t *snap)
{
    fixture_t *f = arg;
    if (!f->name_work)
        return;
    assert_int_equal(kvf_node_snapshot_work(snap, 7, 2, 100), KVF_OK);
    assert_int_equal(kvf_node_snapshot_lease(snap, f->peer_url, 7, 2), KVF_OK);
}

static int setup(void **state)
{
    memset(&fx, 0, sizeof(fx));
    snprintf(fx.router_url, sizeof(fx.router_url), "ipc:///tmp/kvf-test-node-%d-router",
             (int)getpid());
    snprintf(fx.node_url, sizeof(fx.node_url), "ipc:///tmp/kvf-test-node-%d-node", (int)getpid());
    snprintf(fx.peer_url, sizeof(fx.peer_url), "ipc:///tmp/kvf-test-node-%d-peer", (int)getpid());
    if (kvf_inbox_create(fx.router_url, 0, &fx.router_in) != KVF_OK ||
        kvf_inbox_create(fx.peer_url, 0, &fx.peer_in) != KVF_OK)
        return -1;
    kvf_node_config_t nc = {
        .role = KVF__ROLE__ROLE_PREFILL,
        .node_id = "p-test",
        .router_url = fx.router_url,
        .listen_url = fx.node_url,
        .model_fingerprint = "fp",
        .geometry = (Kvf__KvGeometry)KVF__KV_GEOMETRY__INIT,
        .heartbeat_ms = PERIOD_MS,
        .loop_stuck_ms = STUCK_MS,
        .fill_load = fill_load,
        .fill_work = fill_work,
        .load_arg = &fx,
    };
    if (kvf_node_create(&nc, &fx.node) != KVF_OK)
        return -1;
    if (kvf_outbox_create(fx.node_url, &fx.to_node) != KVF_OK)
        return -1;
    *state = &fx;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    kvf_node_destroy(fx.node);
    kvf_outbox_destroy(fx.to_node);
    kvf_inbox_destroy(fx.router_in);
    kvf_inbox_destroy(fx.peer_in);
    return 0;
}

/* The node's loop for ms: ticks, and hands it what its inbox gets. */
static void loop_for(int ms)
{
    uint64_t until = kvf_clock_ns() + (uint64_t)ms * 1000000ull;
    while (kvf_clock_ns() < until) {
        assert_int_equal(kvf_node_tick(fx.node), KVF_OK);
        kvf_envelope_t *env = NULL;
        if (kvf_inbox_recv(kvf_node_inbox(fx.node), 5, &env) == KVF_OK) {
            (void)kvf_node_handle(fx.node, env);
            kvf_envelope_free(env);
        }
    }
}

/* The registration token the fake router hands out. */
static const uint8_t reg_token[KVF_REG_TOKEN_LEN] = "test-reg-token!";

/* The fake router answers Registers until the node is registered. */
static void register_node(void)
{
    uint64_t until = kvf_clock_ns() + 20000000000ull;
    while (!kvf_node_registered(fx.node) && kvf_clock_ns() < until) {
        loop_for(20);
        kvf_envelope_t *env = NULL;
        if (kvf_inbox_recv(fx.router_in, 20, &env) != KVF_OK)
            continue;
        if (env->body_case == KVF__ENVELOPE__BODY_REGISTER) {
            Kvf__RegisterReply rr = KVF__REGISTER_REPLY__INIT;
            rr.node_id = "p-test";
            rr.heartbeat_ms = PERIOD_MS;
            rr.reg_token = (ProtobufCBinaryData){sizeof(reg_token), (uint8_t *)reg_token};
            kvf_envelope_t out;
            kvf_envelope_init(&out, "router");
            out.body_case = KVF__ENVELOPE__BODY_REGISTER_REPLY;
            out.register_reply = &rr;
            assert_int_equal(kvf_outbox_send(fx.to_node, &out, 1000), KVF_OK);
        }
        kvf_envelope_free(env);
    }
    assert_true(kvf_node_registered(fx.node));
}

typedef struct {
    int heartbeats, naming, leases;
} seen_t;

/* Counts what reaches the fake router and the fake peer for ms. */
static seen_t watch_for(int ms)
{
    seen_t s = {0};
    uint64_t until = kvf_clock_ns() + (uint64_t)ms * 1000000ull;
    while (kvf_clock_ns() < until) {
        kvf_envelope_t *env = NULL;
        if (kvf_inbox_recv(fx.router_in, 10, &env) == KVF_OK) {
            if (env->body_case == KVF__ENVELOPE__BODY_HEARTBEAT) {
                s.heartbeats++;
                assert_non_null(env->heartbeat->load);
                assert_int_equal(env->heartbeat->load->blocks_used, 4);
                if (env->heartbeat->n_working == 1 && env->heartbeat->working[0]->req_id == 7 &&
                    env->heartbeat->working[0]->epoch == 2)
                    s.naming++;
            }
            kvf_envelope_free(env);
        }
        if (kvf_inbox_recv(fx.peer_in, 0, &env) == KVF_OK) {
            if (env->body_case == KVF__ENVELOPE__BODY_KV_LEASE && env->kv_lease->n_refs == 1 &&
                env->kv_lease->refs[0]->req_id == 7 && !strcmp(env->kv_lease->reply_inbox, fx.node_url))
                s.leases++;
            kvf_envelope_free(env);
        }
    }
    return s;
}

static void test_heartbeats_outlive_compute(void **state)
{
    (void)state;
    fx.name_work = true;
    register_node();
    loop_for(200);
    /* A "forward" of 20 periods with no tick: heartbeats keep coming, and
     * name the work until the loop counts as stuck (STUCK_MS or more). */
    seen_t during = watch_for(20 * PERIOD_MS);
    assert_true(during.heartbeats >= 5);
    assert_true(during.naming >= 3);
    assert_true(during.leases >= 1);
    /* Past the stuck bound: the load alone. */
    seen_t late = {0};
    uint64_t until = kvf_clock_ns() + 20000000000ull;
    while (late.heartbeats == late.naming && kvf_clock_ns() < until)
        late = watch_for(PERIOD_MS * 4);
    assert_true(late.heartbeats > late.naming);
    seen_t stuck = watch_for(10 * PERIOD_MS);
    assert_true(stuck.heartbeats >= 2);
    assert_int_equal(stuck.naming, 0);
    assert_int_equal(stuck.leases, 0);
    /* The loop runs again: the work is named again. */
    loop_for(100);
    seen_t again = watch_for(10 * PERIOD_MS);
    assert_true(again.naming >= 2);
}

static void test_nothing_after_deregister(void **state)
{
    (void)state;
    fx.name_work = false;
    register_node();
    loop_for(200);
    assert_int_equal(kvf_node_deregister(fx.node, "test"), KVF_OK);
    /* The Deregister, then no heartbeat sent after it: one sent just
     * before may still come in through the thread's own socket, so only
     * those arriving a period or more later count. */
    uint64_t saw_deregister = 0;
    int after = 0;
    uint64_t until = kvf_clock_ns() + 20ull * PERIOD_MS * 1000000ull;
    while (kvf_clock_ns() < until) {
        kvf_envelope_t *env = NULL;
        if (kvf_inbox_recv(fx.router_in, 10, &env) != KVF_OK)
            continue;
        if (env->body_case == KVF__ENVELOPE__BODY_DEREGISTER)
            saw_deregister = kvf_clock_ns();
        else if (saw_deregister && env->body_case == KVF__ENVELOPE__BODY_HEARTBEAT &&
                 kvf_clock_ns() - saw_deregister > (uint64_t)PERIOD_MS * 1000000ull)
            after++;
        kvf_envelope_free(env);
    }
    assert_true(saw_deregister);
    assert_int_equal(after, 0);
}

/* The node's heartbeats carry the token of the RegisterReply that
 * registered it; the router's messages (Cancel here) count only with it;
 * a KvAlloc only with the credential of its attempt; a RegisterReply with
 * another token does not replace it. Every refusal is counted. */
static void test_router_token(void **state)
{
    (void)state;
    register_node();
    kvf_envelope_t c;
    Kvf__Cancel cancel = KVF__CANCEL__INIT;
    cancel.req_id = 7;
    cancel.epoch = 1;
    kvf_envelope_init(&c, "router");
    c.body_case = KVF__ENVELOPE__BODY_CANCEL;
    c.cancel = &cancel;
    assert_true(kvf_node_handle(fx.node, &c)); /* no token: refused */
    assert_int_equal(kvf_node_refused(fx.node), 1);
    c.reg_token = (ProtobufCBinaryData){sizeof(reg_token), (uint8_t *)reg_token};
    assert_false(kvf_node_handle(fx.node, &c)); /* the node's to act on */

    Kvf__KvAlloc a = KVF__KV_ALLOC__INIT;
    a.req_id = 7;
    a.epoch = 1;
    kvf_envelope_t k;
    kvf_envelope_init(&k, "p-other");
    k.body_case = KVF__ENVELOPE__BODY_KV_ALLOC;
    k.kv_alloc = &a;
    assert_true(kvf_node_handle(fx.node, &k));
    uint8_t cred[KVF_ALLOC_TOKEN_LEN];
    kvf_identity_alloc_token(reg_token, 7, 2, cred); /* another attempt's */
    a.alloc_token = (ProtobufCBinaryData){sizeof(cred), cred};
    assert_true(kvf_node_handle(fx.node, &k));
    kvf_identity_alloc_token(reg_token, 7, 1, cred);
    assert_false(kvf_node_handle(fx.node, &k));
    assert_int_equal(kvf_node_refused(fx.node), 3);

    uint8_t other[KVF_REG_TOKEN_LEN] = {1};
    Kvf__RegisterReply rr = KVF__REGISTER_REPLY__INIT;
    rr.node_id = "p-test";
    rr.reg_token = (ProtobufCBinaryData){sizeof(other), other};
    kvf_envelope_t out;
    kvf_envelope_init(&out, "rogue");
    out.body_case = KVF__ENVELOPE__BODY_REGISTER_REPLY;
    out.register_reply = &rr;
    assert_true(kvf_node_handle(fx.node, &out));
    assert_int_equal(kvf_node_refused(fx.node), 4);
    char text[128];
    kvf_node_refusals_format(fx.node, text, sizeof(text));
    assert_string_equal(text, "token=2 alloc_token=2");

    /* The heartbeats still carry the first token. */
    uint64_t until = kvf_clock_ns() + 10000000000ull;
    bool seen = false;
    while (!seen && kvf_clock_ns() < until) {
        loop_for(10);
        kvf_envelope_t *env = NULL;
        if (kvf_inbox_recv(fx.router_in, 10, &env) != KVF_OK)
            continue;
        if (env->body_case == KVF__ENVELOPE__BODY_HEARTBEAT) {
            assert_int_equal(env->reg_token.len, sizeof(reg_token));
            assert_memory_equal(env->reg_token.data, reg_token, sizeof(reg_token));
            seen = true;
        }
        kvf_envelope_free(env);
    }
    assert_true(seen);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_heartbeats_outlive_compute, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nothing_after_deregister, setup, teardown),
        cmocka_unit_test_setup_teardown(test_router_token, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
