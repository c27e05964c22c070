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
 *   prefill node that failed an attempt gets none of the later ones; a
 *   prefill node that pulls is credited the decode node's blocks at the
 *   pull weight;
 * - conditional disaggregation: a decode node with --prefill-local that
 *   holds the prefix prefills a short suffix itself (a fixed bound, or
 *   the measured break-even), a long one goes to a prefill node;
 * - KV tiers (docs/kv-tiers.md, "Routing"): the index keeps which tier
 *   each reported hash is in as blocks move, a RAM hit wins over a disk
 *   hit and a pool hit over a RAM hit, on prefill nodes and in a decode
 *   node's transfer credit, and a disk hit shorter than the break-even
 *   measured from the node's disk reads and prefill rate gets no credit. */
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
 * fixture index) and which decode node it names; *id_p the request. */
static int route_submit(fixture_t *fx, int *decode_p, uint64_t *id_p)
{
    uint32_t ids[N_PROMPT];
    prompt(ids);
    kvf_router_gen_t g = {.ids = ids, .n_ids = N_PROMPT};
    kvf_router_sink_t sink = {null_chunk, NULL};
    uint64_t id = kvf_router_submit(fx->r, &g, &sink);
    assert_true(id != 0);
    *id_p = id;
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
    return got;
}

/* route_submit, then the request cancelled and the nodes' load forgotten. */
static int route_once(fixture_t *fx, int *decode_p)
{
    uint64_t id;
    int got = route_submit(fx, decode_p, &id);
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

/* Prefill nodes that pull (Register.prefix_pull): d2 holds all five
 * blocks, p2 one. Its own block and the two it would pull (pull_weight
 * 0.75 each) make p2 cheaper than p1 pulling three; a queued block on p2
 * turns that round, but only while p1 pulls: a p1 that does not pull
 * computes every block. */
static void test_pull_credit(void **state)
{
    fixture_t *fx = *state;
    for (int i = 0; i < 4; i++)
        join(fx, i, false);
    beat_all(fx);
    uint64_t h[8];
    prompt_hashes(fx, h);
    report(fx, 1, 1, true, h, 5, NULL, 0);
    report(fx, 3, 1, true, h, 1, NULL, 0);
    kvf_router_node_t *p1 = rfx_node_named(fx, "p1"), *p2 = rfx_node_named(fx, "p2");
    p1->prefix_pull = p2->prefix_pull = true;
    int d = -1;
    assert_int_equal(route_once(fx, &d), 3); /* p2: 5 - 2.5 against p1's 5 - 2.25 */
    assert_int_equal(d, 1);
    p2->queued_tokens = BS;
    assert_int_equal(route_once(fx, &d), 2); /* p1: 2.75 against p2's 3.5 */
    assert_int_equal(d, 1);
    p1->prefix_pull = false;
    assert_int_equal(route_once(fx, &d), 3); /* p1 computes all 5 */
    p2->queued_tokens = 0;
}

/* A heartbeat sent while a request ran on d2 arrives before the request
 * ends: once it ended, its blocks do not count against d2 (they are free
 * there), so the next turn still goes to d2, which holds its prefix. */
static void test_finished_since_heartbeat(void **state)
{
    fixture_t *fx = *state;
    fx->r->cfg.default_max_tokens = 200; /* a request of 18 blocks */
    cluster(fx, false);
    int d = -1;
    uint64_t id;
    route_submit(fx, &d, &id);
    assert_int_equal(d, 1);
    kvf_router_node_t *d2 = rfx_node_named(fx, "d2");
    uint32_t given = d2->pending_blocks;
    assert_true(given > 8); /* more than d2's credit for the prefix it holds */
    Kvf__Load load = KVF__LOAD__INIT;
    load.blocks_total = 64;
    load.blocks_free = 64 - given;
    load.running = 1;
    Kvf__Heartbeat hb = KVF__HEARTBEAT__INIT;
    hb.node_id = "d2";
    hb.inbox_url = fx->urls[3];
    hb.state = "live";
    hb.load = &load;
    kvf_router__on_heartbeat(fx->r, &hb);
    kvf_router_cancel(fx->r, id); /* it ends before d2's next heartbeat */
    assert_int_equal(d2->finished_blocks, given);
    route_submit(fx, &d, &id);
    assert_int_equal(d, 1);
    kvf_router_cancel(fx->r, id);
    /* the next heartbeat's numbers replace the correction */
    beat_all(fx);
    assert_int_equal(d2->finished_blocks, 0);
}

/* A request sent to d2 after its last heartbeat and ended before the next
 * one is in d2's handed-out load, not its reported one: its end takes it
 * from there, so d2's next turn is not charged for it. */
static void test_finished_before_heartbeat(void **state)
{
    fixture_t *fx = *state;
    fx->r->cfg.default_max_tokens = 200;
    cluster(fx, false);
    int d = -1;
    uint64_t id;
    route_submit(fx, &d, &id);
    assert_int_equal(d, 1);
    kvf_router_node_t *d2 = rfx_node_named(fx, "d2");
    assert_true(d2->pending_blocks > 8);
    assert_int_equal(d2->pending_running, 1);
    kvf_router_cancel(fx->r, id); /* no heartbeat from d2 in between */
    assert_int_equal(d2->pending_blocks, 0);
    assert_int_equal(d2->pending_running, 0);
    assert_int_equal(d2->finished_blocks, 0);
    route_submit(fx, &d, &id);
    assert_int_equal(d, 1);
    kvf_router_cancel(fx->r, id);
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

/* A report with KV tier lists (each NULL-terminated by its count 0). */
typedef struct {
    uint64_t *pool, *removed, *ram, *disk, *gone;
    uint32_t n_pool, n_removed, n_ram, n_disk, n_gone;
} tier_report_t;

static void report_tiers(fixture_t *fx, int node, uint64_t seq, bool full, const tier_report_t *t)
{
    Kvf__PrefixUpdate u = KVF__PREFIX_UPDATE__INIT;
    u.node_id = (char *)names[node];
    u.seq = seq;
    u.full = full;
    u.key_id = fx->r->hash_key_id;
    u.added = t->pool;
    u.n_added = t->n_pool;
    u.removed = t->removed;
    u.n_removed = t->n_removed;
    u.tier_ram = t->ram;
    u.n_tier_ram = t->n_ram;
    u.tier_disk = t->disk;
    u.n_tier_disk = t->n_disk;
    u.tier_gone = t->gone;
    u.n_tier_gone = t->n_gone;
    kvf_router__on_prefix_update(fx->r, &u, names[node]);
}

static void assert_tier_hits(fixture_t *fx, int node, const uint64_t *h, uint32_t pool,
                             uint32_t ram, uint32_t disk)
{
    kvf_prefix_hits_t got;
    kvf_router__prefix_hits_tiers(rfx_node_named(fx, names[node]), h, 5, &got);
    assert_int_equal(got.pool, pool);
    assert_int_equal(got.ram, ram);
    assert_int_equal(got.disk, disk);
}

/* The index keeps where each hash is as blocks move between the pool and
 * the tiers; a report without tier lists touches no tier. */
static void test_prefix_index_tiers(void **state)
{
    fixture_t *fx = *state;
    join(fx, 0, false);
    uint64_t h[8];
    prompt_hashes(fx, h);
    /* pool 0, 1; RAM 2; disk 3 */
    report_tiers(fx, 0, 1, true,
                 &(tier_report_t){.pool = h, .n_pool = 2, .ram = h + 2, .n_ram = 1,
                                  .disk = h + 3, .n_disk = 1});
    assert_int_equal(indexed(fx, 0), 4);
    assert_tier_hits(fx, 0, h, 2, 1, 1);
    assert_int_equal(kvf_router__prefix_hits(rfx_node_named(fx, "d1"), h, 5), 2);
    /* 2 demoted to disk */
    report_tiers(fx, 0, 2, false, &(tier_report_t){.disk = h + 2, .n_disk = 1});
    assert_tier_hits(fx, 0, h, 2, 0, 2);
    /* the pool evicts 1 into RAM */
    report_tiers(fx, 0, 3, false,
                 &(tier_report_t){.removed = h + 1, .n_removed = 1, .ram = h + 1, .n_ram = 1});
    assert_int_equal(indexed(fx, 0), 4);
    assert_tier_hits(fx, 0, h, 1, 1, 2);
    /* 3 leaves the tiers (promoted, or dropped): the run ends before it */
    report_tiers(fx, 0, 4, false, &(tier_report_t){.gone = h + 3, .n_gone = 1});
    assert_int_equal(indexed(fx, 0), 3);
    assert_tier_hits(fx, 0, h, 1, 1, 1);
    /* 2 listed in the pool again while its disk copy stays: both places */
    report_tiers(fx, 0, 5, false, &(tier_report_t){.pool = h + 2, .n_pool = 1});
    assert_int_equal(indexed(fx, 0), 3);
    assert_tier_hits(fx, 0, h, 1, 1, 1);
    report_tiers(fx, 0, 6, false, &(tier_report_t){.removed = h + 2, .n_removed = 1});
    assert_tier_hits(fx, 0, h, 1, 1, 1); /* still on disk */
    report_tiers(fx, 0, 7, false, &(tier_report_t){.gone = h + 2, .n_gone = 1});
    assert_tier_hits(fx, 0, h, 1, 1, 0);
    /* RAM 1 moves to the pool (tier_gone and added in one delta); a gone
     * hash the index never had changes nothing */
    report_tiers(fx, 0, 8, false,
                 &(tier_report_t){.pool = h + 1, .n_pool = 1, .gone = h + 1, .n_gone = 2});
    assert_int_equal(indexed(fx, 0), 2);
    assert_tier_hits(fx, 0, h, 2, 0, 0);
    /* a full listing without tier lists (a node without tiers): pool only */
    report_tiers(fx, 0, 9, true, &(tier_report_t){.pool = h + 4, .n_pool = 1});
    assert_int_equal(indexed(fx, 0), 1);
    assert_tier_hits(fx, 0, h, 0, 0, 0);
    report_tiers(fx, 0, 10, true, &(tier_report_t){.disk = h, .n_disk = 3});
    assert_tier_hits(fx, 0, h, 0, 0, 3);
}

/* Four nodes, idle, no listings. */
static void cluster_bare(fixture_t *fx)
{
    for (int i = 0; i < RFX_NODES; i++)
        join(fx, i, false);
    beat_all(fx);
}

/* Node p (0, 1 decode; 2, 3 prefill) lists the prompt's first n blocks in
 * tier (KVF_PREFIX_IN_*), in a full report numbered seq. */
static void holds(fixture_t *fx, int p, unsigned tier, uint32_t n, uint64_t seq)
{
    uint64_t h[8];
    prompt_hashes(fx, h);
    tier_report_t t = {0};
    if (tier == KVF_PREFIX_IN_POOL)
        t = (tier_report_t){.pool = h, .n_pool = n};
    else if (tier == KVF_PREFIX_IN_RAM)
        t = (tier_report_t){.ram = h, .n_ram = n};
    else
        t = (tier_report_t){.disk = h, .n_disk = n};
    report_tiers(fx, p, seq, true, &t);
}

/* At equal load, the prefill node with the prefix in RAM beats the one
 * with it on disk, and a pool hit beats a RAM hit, whichever comes first
 * in the node table. */
static void test_tier_credit(void **state)
{
    fixture_t *fx = *state;
    cluster_bare(fx);
    int d = -1;
    holds(fx, 2, KVF_PREFIX_IN_DISK, 3, 1);
    holds(fx, 3, KVF_PREFIX_IN_RAM, 3, 1);
    assert_int_equal(route_once(fx, &d), 3);
    holds(fx, 2, KVF_PREFIX_IN_RAM, 3, 2);
    holds(fx, 3, KVF_PREFIX_IN_POOL, 3, 2);
    assert_int_equal(route_once(fx, &d), 3);
    /* the disk hit still beats no hit (no break-even measured: the weight) */
    holds(fx, 2, KVF_PREFIX_IN_POOL, 0, 3);
    holds(fx, 3, KVF_PREFIX_IN_DISK, 3, 3);
    assert_int_equal(route_once(fx, &d), 3);
    /* with the tier weights 0, tier hits count for nothing: p1 first */
    fx->r->cfg.tier_disk_weight = 0;
    assert_int_equal(route_once(fx, &d), 2);
}

/* The same for the decode nodes' transfer credit: a KvAlloc takes its
 * offered blocks back from the decode node's tiers (decode_node/tiers.c),
 * so a decode node holding the prefix in RAM beats one with it on disk
 * and one with it in its pool beats both; a disk hit beats no hit; with
 * the tier weights 0 the tiers count for nothing (the tie: d1, first). */
static void test_decode_tier_credit(void **state)
{
    fixture_t *fx = *state;
    cluster_bare(fx);
    int d = -1;
    holds(fx, 0, KVF_PREFIX_IN_DISK, 4, 1);
    holds(fx, 1, KVF_PREFIX_IN_RAM, 4, 1);
    (void)route_once(fx, &d);
    assert_int_equal(d, 1);
    holds(fx, 0, KVF_PREFIX_IN_RAM, 4, 2);
    holds(fx, 1, KVF_PREFIX_IN_POOL, 4, 2);
    (void)route_once(fx, &d);
    assert_int_equal(d, 1);
    holds(fx, 0, KVF_PREFIX_IN_POOL, 0, 3);
    holds(fx, 1, KVF_PREFIX_IN_DISK, 4, 3);
    (void)route_once(fx, &d);
    assert_int_equal(d, 1);
    fx->r->cfg.tier_disk_weight = 0;
    (void)route_once(fx, &d);
    assert_int_equal(d, 0);
    holds(fx, 1, KVF_PREFIX_IN_RAM, 4, 4);
    (void)route_once(fx, &d);
    assert_int_equal(d, 1);
    fx->r->cfg.tier_ram_weight = 0;
    (void)route_once(fx, &d);
    assert_int_equal(d, 0);
}

/* p2's disk reads as its heartbeat reports them. */
static void disk_beat(fixture_t *fx, uint64_t read_ns, uint64_t busy_ns, uint32_t threads)
{
    Kvf__Load load = KVF__LOAD__INIT;
    load.blocks_free = load.blocks_total = 64;
    load.tier_disk_read_ns = read_ns;
    load.tier_disk_read_busy_ns = busy_ns;
    load.tier_disk_read_bytes = 1u << 20;
    load.tier_disk_io_threads = threads;
    Kvf__Heartbeat hb = KVF__HEARTBEAT__INIT;
    hb.node_id = "p2";
    hb.inbox_url = fx->urls[2 + 3];
    hb.state = "live";
    hb.load = &load;
    kvf_router__on_heartbeat(fx->r, &hb);
}

/* A disk hit shorter than p2's break-even gets no credit. p2 computes a
 * token in 20 us (a block in 320 us); a read waits 2 ms and takes 500 us
 * in pread, 2 at once (a block every 250 us): the first block costs 1750
 * us more than its compute, each next one saves 70 us, so 25 blocks (400
 * tokens) break even, and p2's one block on disk gets nothing. */
static void test_disk_break_even(void **state)
{
    fixture_t *fx = *state;
    cluster_bare(fx);
    kvf_router_node_t *p2 = rfx_node_named(fx, "p2");
    p2->prefill_ns_per_token = 20000;
    holds(fx, 3, KVF_PREFIX_IN_DISK, 1, 1);
    int d = -1;
    assert_int_equal(kvf_router__disk_break_even(fx->r, p2), 0); /* not measured */
    assert_int_equal(route_once(fx, &d), 3);
    disk_beat(fx, 2000000, 500000, 2);
    assert_int_equal(p2->disk_read_ns, 2000000);
    assert_int_equal(kvf_router__disk_break_even(fx->r, p2), 400);
    assert_int_equal(p2->disk_break_even_logged, 400);
    assert_int_equal(route_once(fx, &d), 2);
    /* a faster disk: a read waits 300 us, 100 us in pread (a block every
     * 50): one block breaks even */
    disk_beat(fx, 300000, 100000, 2);
    assert_int_equal(kvf_router__disk_break_even(fx->r, p2), BS);
    assert_int_equal(route_once(fx, &d), 3);
    /* a disk slower than the compute (a block every 500 us): never */
    disk_beat(fx, 2000000, 1000000, 2);
    assert_int_equal(kvf_router__disk_break_even(fx->r, p2), UINT32_MAX);
    assert_int_equal(route_once(fx, &d), 2);
    /* without its own rate, p2's break-even uses the cluster's (p1's) */
    p2->prefill_ns_per_token = 0;
    rfx_node_named(fx, "p1")->prefill_ns_per_token = 20000;
    disk_beat(fx, 300000, 100000, 2);
    assert_int_equal(kvf_router__disk_break_even(fx->r, p2), BS);
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
        cmocka_unit_test_setup_teardown(test_pull_credit, setup_kv, rfx_teardown),
        cmocka_unit_test_setup_teardown(test_failed_prefill_excluded, setup_kv, rfx_teardown),
        cmocka_unit_test_setup_teardown(test_finished_since_heartbeat, setup_kv, rfx_teardown),
        cmocka_unit_test_setup_teardown(test_finished_before_heartbeat, setup_kv, rfx_teardown),
        cmocka_unit_test_setup_teardown(test_load_policy, setup_load, rfx_teardown),
        cmocka_unit_test_setup_teardown(test_random_policy, setup_random, rfx_teardown),
        cmocka_unit_test_setup_teardown(test_local_prefill_bound, setup_local, rfx_teardown),
        cmocka_unit_test_setup_teardown(test_local_prefill_auto, setup_auto, rfx_teardown),
        cmocka_unit_test_setup_teardown(test_prefix_index_tiers, setup, rfx_teardown),
        cmocka_unit_test_setup_teardown(test_tier_credit, setup_kv, rfx_teardown),
        cmocka_unit_test_setup_teardown(test_decode_tier_credit, setup_kv, rfx_teardown),
        cmocka_unit_test_setup_teardown(test_disk_break_even, setup_kv, rfx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
