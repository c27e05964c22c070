/* The router's KV-aware routing in-process (router/route.c,
 * router/prefix_index.c; docs/prefix-cache.md, "Routing"), with fixture
 * inboxes standing for nodes:
 * - the prefix index: a registering node is asked for a full listing
 *   (PrefixResync), a full PrefixUpdate replaces a node's listing, a delta
 *   applies only on top of the update before it (a gap empties the
 *   listing and asks again), hashes under another key and reports in
 *   another node's name are dropped, and a node that dies takes its
 *   listing with it;
 * - the policies: kv sends a request to the decode and the prefill node
 *   that hold its prefix, load ignores the prefix, random spreads; a
 *   prefill node that failed an attempt gets none of the later ones;
 * - conditional disaggregation: a decode node with --prefill-local that
 *   holds the prefix prefills a short suffix itself (a fixed bound, or
 *   the measured break-even), a long one goes to a prefill node. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvf/clock.h"
#include "kvf/prefix_cache.h"
#include "router_fixture.h"
#include "router_internal.h"

#define BS       16
#define N_PROMPT 80 /* 5 blocks; a node reuses at most (80 - 32) / 16 = 3 */

static const char *const names[RFX_NODES] = {"d1", "d2", "p1", "p2"};

/* The prompt every test sends: token ids 1 .. N_PROMPT (with salt: another
 * chain). */
static void prompt(uint32_t *ids)
{
    for (uint32_t i = 0; i < N_PROMPT; i++)
        ids[i] = 1 + i;
}

/* The prompt's block hashes as every node of this router computes them
 * (the fixture's nodes register model fingerprint "fp", f32 blocks). */
static uint32_t prompt_hashes(fixture_t *fx, uint64_t *hashes)
{
    uint32_t ids[N_PROMPT];
    prompt(ids);
    uint64_t root = kvf_block_hash_root(&fx->r->hash_key, strtoull("fp", NULL, 16),
                                        (int)KVF__KV_DTYPE__KV_DTYPE_F32, BS, NULL, 0);
    return kvf_block_hash_chain(&fx->r->hash_key, root, ids, N_PROMPT, BS, hashes);
}

/* Node `node` (a fixture name) reports hashes[0..n): a full listing or a
 * delta with sequence number seq. */
static void report(fixture_t *fx, int node, uint64_t seq, bool full, uint64_t *hashes, uint32_t n,
                   uint64_t *removed, uint32_t n_removed)
{
    Kvf__PrefixUpdate u = KVF__PREFIX_UPDATE__INIT;
    u.node_id = (char *)names[node];
    u.seq = seq;
    u.full = full;
    u.added = hashes;
    u.n_added = n;
    u.removed = removed;
    u.n_removed = n_removed;
    u.key_id = fx->r->hash_key_id;
    kvf_router__on_prefix_update(fx->r, &u, names[node]);
}

static uint32_t indexed(fixture_t *fx, int node)
{
    return rfx_node_named(fx, names[node])->prefix.n;
}

/* Registers fixture node i under its name (0, 1 decode; 2, 3 prefill). */
static void join(fixture_t *fx, int i, bool prefill_local)
{
    Kvf__Role role = i < 2 ? KVF__ROLE__ROLE_DECODE : KVF__ROLE__ROLE_PREFILL;
    rfx_register_node(fx, role, names[i], fx->urls[2 + i], BS, KVF__KV_DTYPE__KV_DTYPE_F32,
                      prefill_local);
    /* every registering node is asked for its whole listing */
    kvf_envelope_t *env = rfx_node_recv(fx, i, KVF__ENVELOPE__BODY_PREFIX_RESYNC, 5000);
    assert_non_null(env);
    kvf_envelope_free(env);
}

static int setup(void **state)
{
    return rfx_setup(state, 60000, 60000, NULL);
}

static bool node_dead(fixture_t *fx, void *arg)
{
    (void)fx;
    return ((kvf_router_node_t *)arg)->state == NODE_DEAD;
}

/* The index follows a node's reports, and forgets a node that died. */
static void test_prefix_index(void **state)
{
    fixture_t *fx = *state;
    join(fx, 0, false);
    uint64_t h[8];
    uint32_t n = prompt_hashes(fx, h);
    assert_int_equal(n, 5);
    report(fx, 0, 1, true, h, 3, NULL, 0);
    assert_int_equal(indexed(fx, 0), 3);
    assert_int_equal(rfx_metric(fx, "kvf_prefix_index_blocks{node=\"d1\",role=\"decode\"} "), 3);
    /* the next delta applies: +2, -1 */
    report(fx, 0, 2, false, h + 3, 2, h, 1);
    assert_int_equal(indexed(fx, 0), 4);
    assert_int_equal(kvf_router__prefix_hits(rfx_node_named(fx, "d1"), h, 5), 0);
    /* a report in another node's name, or under another key: dropped */
    Kvf__PrefixUpdate u = KVF__PREFIX_UPDATE__INIT;
    u.node_id = "d1";
    u.seq = 3;
    u.full = true;
    u.key_id = fx->r->hash_key_id;
    kvf_router__on_prefix_update(fx->r, &u, "someone-else");
    u.key_id = fx->r->hash_key_id ^ 1;
    kvf_router__on_prefix_update(fx->r, &u, "d1");
    assert_int_equal(indexed(fx, 0), 4);
    assert_int_equal(fx->r->count.prefix_stale, 2);
    /* a gap (update 4 after 2): the listing is gone and the node asked */
    report(fx, 0, 4, false, h, 1, NULL, 0);
    assert_int_equal(indexed(fx, 0), 0);
    kvf_envelope_t *env = rfx_node_recv(fx, 0, KVF__ENVELOPE__BODY_PREFIX_RESYNC, 5000);
    assert_non_null(env);
    assert_int_equal(env->prefix_resync->seq_seen, 2);
    kvf_envelope_free(env);
    /* deltas wait for the full listing */
    report(fx, 0, 5, false, h, 1, NULL, 0);
    assert_int_equal(indexed(fx, 0), 0);
    report(fx, 0, 6, true, h, 5, NULL, 0);
    assert_int_equal(indexed(fx, 0), 5);
    assert_int_equal(kvf_router__prefix_hits(rfx_node_named(fx, "d1"), h, 5), 5);

    /* d1 dies holding cached blocks: the index drops them */
    kvf_router_node_t *d1 = rfx_node_named(fx, "d1");
    rfx_run_until(fx, node_dead, d1);
    assert_int_equal(d1->state, NODE_DEAD);
    assert_int_equal(d1->prefix.n, 0);
    assert_null(d1->prefix.set);
    assert_int_equal(rfx_metric(fx, "kvf_prefix_index_blocks{node=\"d1\",role=\"decode\"} "), 0);
    /* and takes no more reports */
    report(fx, 0, 7, true, h, 5, NULL, 0);
    assert_int_equal(d1->prefix.n, 0);
}

/* Keeps every fixture node alive with an idle load. */
static void beat_all(fixture_t *fx)
{
    for (int i = 0; i < RFX_NODES; i++) {
        if (!rfx_node_named(fx, names[i]))
            continue;
        Kvf__Load load = KVF__LOAD__INIT;
        load.blocks_free = load.blocks_total = 64;
        Kvf__Heartbeat hb = KVF__HEARTBEAT__INIT;
        hb.node_id = (char *)names[i];
        hb.inbox_url = fx->urls[2 + i];
        hb.state = "live";
        hb.load = &load;
        kvf_router__on_heartbeat(fx->r, &hb);
    }
}

static void null_chunk(void *arg, const kvf_router_chunk_t *c)
{
    (void)arg;
    (void)c;
}

/* Submits the prompt and says which node got its PrefillRequest (its
 * fixture index) and which decode node it names; the request is then
 * cancelled and the nodes' load forgotten. */
static int route_once(fixture_t *fx, int *decode_p)
{
    uint32_t ids[N_PROMPT];
    prompt(ids);
    kvf_router_gen_t g = {.ids = ids, .n_ids = N_PROMPT};
    kvf_router_sink_t sink = {null_chunk, NULL};
    uint64_t id = kvf_router_submit(fx->r, &g, &sink);
    assert_true(id != 0);
    int got = -1;
    uint64_t give_up = kvf_clock_ns() + 10000000000ull;
    while (got < 0 && kvf_clock_ns() < give_up) {
        for (int i = 0; i < RFX_NODES && got < 0; i++) {
            kvf_envelope_t *env = NULL;
            if (kvf_inbox_recv(fx->node_inbox[i], 1, &env) != KVF_OK)
                continue;
            if (env->body_case == KVF__ENVELOPE__BODY_PREFILL_REQUEST) {
                got = i;
                *decode_p = -1;
                for (int j = 0; j < 2; j++)
                    if (!strcmp(env->prefill_request->decode_node_id, names[j]))
                        *decode_p = j;
            }
            kvf_envelope_free(env);
        }
    }
    assert_true(got >= 0);
    kvf_router_cancel(fx->r, id);
    beat_all(fx); /* the heartbeats reset what was pending */
    return got;
}

static int set_policy(void **state, kvf_route_policy_t policy, unsigned local_max, bool local_auto)
{
    int rc = setup(state);
    fixture_t *fx = *state;
    fx->r->cfg.route = policy;
    fx->r->cfg.local_prefill_max_tokens = local_max;
    fx->r->cfg.local_prefill_auto = local_auto;
    return rc;
}

/* Two decode and two prefill nodes, equally loaded; d2 and p2 hold the
 * prompt's first blocks (d2 all five, p2 three). */
static void cluster(fixture_t *fx, bool d2_local)
{
    join(fx, 0, false);
    join(fx, 1, d2_local);
    join(fx, 2, false);
    join(fx, 3, false);
    beat_all(fx);
    uint64_t h[8];
    prompt_hashes(fx, h);
    report(fx, 1, 1, true, h, 5, NULL, 0);
    report(fx, 3, 1, true, h, 3, NULL, 0);
}

static void test_kv_policy(void **state)
{
    fixture_t *fx = *state;
    cluster(fx, false);
    int d = -1;
    assert_int_equal(route_once(fx, &d), 3); /* p2: 3 blocks fewer to compute */
    assert_int_equal(d, 1);                  /* d2: 4 blocks fewer to ship */
    /* once p2 has a long queue, p1 costs less */
    kvf_router_node_t *p2 = rfx_node_named(fx, "p2");
    p2->queued_tokens = 10 * BS;
    assert_int_equal(route_once(fx, &d), 2);
    p2->queued_tokens = 0;
}

/* A prefill node that fails an attempt gets none of the request's later
 * attempts while another prefill node can take them. */
static void test_failed_prefill_excluded(void **state)
{
    fixture_t *fx = *state;
    cluster(fx, false);
    uint32_t ids[N_PROMPT];
    prompt(ids);
    kvf_router_gen_t g = {.ids = ids, .n_ids = N_PROMPT};
    kvf_router_sink_t sink = {null_chunk, NULL};
    uint64_t id = kvf_router_submit(fx->r, &g, &sink);
    kvf_envelope_t *env = rfx_node_recv(fx, 3, KVF__ENVELOPE__BODY_PREFILL_REQUEST, 5000);
    assert_non_null(env); /* p2: it holds the prefix */
    uint64_t epoch = env->prefill_request->epoch;
    kvf_envelope_free(env);
    Kvf__Error e = KVF__ERROR__INIT;
    e.req_id = id;
    e.epoch = epoch;
    e.status = KVF_ERR_INTERNAL;
    e.message = "test: p2 fails it";
    kvf_router__on_error(fx->r, &e, "p2");
    env = rfx_node_recv(fx, 2, KVF__ENVELOPE__BODY_PREFILL_REQUEST, 5000);
    assert_non_null(env); /* p1 now, though p2 still holds the prefix */
    assert_true(env->prefill_request->epoch > epoch);
    kvf_envelope_free(env);
    kvf_router_cancel(fx->r, id);
}

static void test_load_policy(void **state)
{
    fixture_t *fx = *state;
    cluster(fx, false);
    /* equal load: the first node of each kind, whatever they cache */
    int d = -1;
    assert_int_equal(route_once(fx, &d), 2);
    assert_int_equal(d, 0);
}

static void test_random_policy(void **state)
{
    fixture_t *fx = *state;
    cluster(fx, false);
    bool seen_d[2] = {false, false}, seen_p[2] = {false, false};
    for (int i = 0; i < 64; i++) {
        int d = -1;
        int p = route_once(fx, &d);
        seen_p[p - 2] = true;
        seen_d[d] = true;
    }
    /* each node is missed 64 times in a row with probability 2^-64 */
    assert_true(seen_d[0] && seen_d[1] && seen_p[0] && seen_p[1]);
}

/* Conditional disaggregation with a fixed bound: 80 - 3 * 16 = 32 tokens
 * left on d2 (it reuses at most 3 of its 5 blocks) fit 32, not 31. */
static void test_local_prefill_bound(void **state)
{
    fixture_t *fx = *state;
    cluster(fx, true);
    int d = -1;
    assert_int_equal(route_once(fx, &d), 1); /* d2 prefills it itself */
    assert_int_equal(d, 1);
    fx->r->cfg.local_prefill_max_tokens = 31;
    assert_int_equal(route_once(fx, &d), 3);
    assert_int_equal(d, 1);
}

/* With auto, the break-even comes from the measured rates: none measured,
 * no local prefill; a split path overhead of 5 ms and a local rate of
 * 100 us a token: 50 tokens, so 32 go local; 3 ms: 30, so they do not. */
static void test_local_prefill_auto(void **state)
{
    fixture_t *fx = *state;
    cluster(fx, true);
    int d = -1;
    assert_int_equal(route_once(fx, &d), 3);
    kvf_router_node_t *d2 = rfx_node_named(fx, "d2");
    d2->local_ns_per_token = 100000;
    fx->r->remote_overhead_ns = 5000000;
    assert_int_equal(route_once(fx, &d), 1);
    fx->r->remote_overhead_ns = 3000000;
    assert_int_equal(route_once(fx, &d), 3);
    /* the measurements come from PrefillDone: a split prefill of 80 tokens
     * that reused 48 took 20 us a token to compute */
    kvf_router_node_t *p2 = rfx_node_named(fx, "p2");
    p2->prefill_ns_per_token = 0;
    uint32_t ids[N_PROMPT];
    prompt(ids);
    kvf_router_gen_t g = {.ids = ids, .n_ids = N_PROMPT};
    kvf_router_sink_t sink = {null_chunk, NULL};
    uint64_t id = kvf_router_submit(fx->r, &g, &sink);
    kvf_router_req_t *q = kvf_router__req_find(fx->r, id);
    assert_non_null(q);
    assert_false(q->place.local);
    Kvf__PrefillDone pd = KVF__PREFILL_DONE__INIT;
    pd.req_id = id;
    pd.epoch = q->place.epoch;
    pd.node_id = "p2";
    pd.prefill_compute_us = 640; /* 32 tokens computed */
    pd.cached_tokens = 48;
    pd.kv_bytes = 4096;
    kvf_router__on_prefill_done(fx->r, &pd);
    assert_int_equal(p2->prefill_ns_per_token, 20000);
    assert_int_equal(fx->r->count.prefill_computed, 32);
    assert_int_equal(fx->r->count.prefill_cached, 48);
    assert_int_equal(fx->r->count.kv_bytes, 4096);
    kvf_router_cancel(fx->r, id);
}

static int setup_kv(void **state)
{
    return set_policy(state, KVF_ROUTE_KV, 0, false);
}

static int setup_load(void **state)
{
    return set_policy(state, KVF_ROUTE_LOAD, 0, false);
}

static int setup_random(void **state)
{
    return set_policy(state, KVF_ROUTE_RANDOM, 0, false);
}

static int setup_local(void **state)
{
    return set_policy(state, KVF_ROUTE_KV, 32, false);
}

static int setup_auto(void **state)
{
    return set_policy(state, KVF_ROUTE_KV, 0, true);
}

static void test_policy_names(void **state)
{
    (void)state;
    kvf_route_policy_t p;
    assert_true(kvf_route_policy_parse("random", &p));
    assert_int_equal(p, KVF_ROUTE_RANDOM);
    assert_true(kvf_route_policy_parse("load", &p));
    assert_int_equal(p, KVF_ROUTE_LOAD);
    assert_true(kvf_route_policy_parse("kv", &p));
    assert_int_equal(p, KVF_ROUTE_KV);
    assert_false(kvf_route_policy_parse("KV", &p));
    assert_false(kvf_route_policy_parse("", &p));
    assert_string_equal(kvf_route_policy_name(KVF_ROUTE_LOAD), "load");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_policy_names),
        cmocka_unit_test_setup_teardown(test_prefix_index, setup, rfx_teardown),
        cmocka_unit_test_setup_teardown(test_kv_policy, setup_kv, rfx_teardown),
        cmocka_unit_test_setup_teardown(test_failed_prefill_excluded, setup_kv, rfx_teardown),
        cmocka_unit_test_setup_teardown(test_load_policy, setup_load, rfx_teardown),
        cmocka_unit_test_setup_teardown(test_random_policy, setup_random, rfx_teardown),
        cmocka_unit_test_setup_teardown(test_local_prefill_bound, setup_local, rfx_teardown),
        cmocka_unit_test_setup_teardown(test_local_prefill_auto, setup_auto, rfx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
