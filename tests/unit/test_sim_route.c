/* The simulator's router makes the real router's choices: the same nodes
 * registered in a real router (the in-process fixture, registration and
 * heartbeats through its message handlers) and in the simulator's
 * socketless one (sim/router_view.c), the same loads and cached
 * prefixes reported to both, and each pick compared, over a few hundred
 * drawn states, under the kv and the load policies. (The random policy
 * draws from each router's own seed: not compared.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvf/sampling.h"
#include "router_fixture.h"
#include "router_internal.h"
#include "sim.h"

#define BS         16
#define N_NODES    4 /* p0, p1, d0, d1: the simulator's names and order */
#define CAPACITY   64
#define N_CASES    300
#define MAX_PROMPT 200

static const char *const names[N_NODES] = {"p0", "p1", "d0", "d1"};

static kvf_route_policy_t policy;

static void tweak(kvf_router_config_t *cfg)
{
    cfg->route = policy;
}

static int setup_kv(void **state)
{
    policy = KVF_ROUTE_KV;
    return rfx_setup(state, 60000, 60000, tweak);
}

static int setup_load(void **state)
{
    policy = KVF_ROUTE_LOAD;
    return rfx_setup(state, 60000, 60000, tweak);
}

/* The fixture's nodes, registered in the simulator's order, each with an
 * empty full prefix listing (as the simulated nodes start). */
static void register_all(fixture_t *fx)
{
    for (int i = 0; i < N_NODES; i++) {
        Kvf__Role role = i < 2 ? KVF__ROLE__ROLE_PREFILL : KVF__ROLE__ROLE_DECODE;
        rfx_register_node(fx, role, names[i], fx->urls[2 + i], BS, KVF__KV_DTYPE__KV_DTYPE_F32,
                          false);
        kvf_envelope_t *env = rfx_node_recv(fx, i, KVF__ENVELOPE__BODY_PREFIX_RESYNC, 5000);
        assert_non_null(env);
        kvf_envelope_free(env);
        Kvf__PrefixUpdate u = KVF__PREFIX_UPDATE__INIT;
        u.node_id = (char *)names[i];
        u.seq = 1;
        u.full = true;
        u.key_id = fx->r->hash_key_id;
        kvf_router__on_prefix_update(fx->r, &u, names[i]);
    }
}

/* The simulator's router for the same cluster and model. */
static kvf_sim_router_t *sim_router(fixture_t *fx)
{
    kvf_sim_config_t cfg = {0};
    kvf_sim_config_defaults(&cfg);
    cfg.model_cfg = *kvf_router_model(fx->r);
    cfg.kv_dtype = KVF_KV_F32;
    cfg.block_size = BS;
    cfg.n_prefill = 2;
    cfg.n_decode = 2;
    cfg.route = policy;
    cfg.max_batch = 0; /* the fixture's nodes register no limit */
    kvf_sim_router_t *sr;
    assert_int_equal(kvf_sim_router_create(&cfg, CAPACITY, &sr), KVF_OK);
    return sr;
}

/* Node i's heartbeat with load l, to the real router. */
static void real_beat(fixture_t *fx, int i, const kvf_sim_load_t *l)
{
    Kvf__Load load = KVF__LOAD__INIT;
    load.blocks_free = l->blocks_free;
    load.blocks_total = l->blocks_total;
    load.blocks_used = l->blocks_total - l->blocks_free;
    load.running = l->running;
    load.queued_requests = l->queued_requests;
    load.queued_tokens = l->queued_tokens;
    Kvf__Heartbeat hb = KVF__HEARTBEAT__INIT;
    hb.node_id = (char *)names[i];
    hb.inbox_url = fx->urls[2 + i];
    hb.state = "live";
    hb.load = &load;
    kvf_router__on_heartbeat(fx->r, &hb);
}

/* Node i reports the first n_blocks of prompt ids[0..n) cached, to the
 * real router (hashes under its key; seq continues from *seq). */
static void real_cached(fixture_t *fx, int i, const uint32_t *ids, uint32_t n, uint32_t n_blocks,
                        uint64_t *seq)
{
    kvf_router_req_t q = {0};
    q.ask.prompt = (uint32_t *)ids;
    q.ask.n_prompt = n;
    kvf_router__req_hashes(fx->r, &q);
    assert_non_null(q.ask.hashes);
    Kvf__PrefixUpdate u = KVF__PREFIX_UPDATE__INIT;
    u.node_id = (char *)names[i];
    u.seq = ++*seq;
    u.added = q.ask.hashes;
    u.n_added = n_blocks;
    u.key_id = fx->r->hash_key_id;
    kvf_router__on_prefix_update(fx->r, &u, names[i]);
    free(q.ask.hashes);
}

static bool real_pick(fixture_t *fx, const uint32_t *ids, uint32_t n, uint32_t max_tokens,
                      const char **p_p, const char **d_p)
{
    Kvf__Sampling s = KVF__SAMPLING__INIT;
    s.max_tokens = max_tokens;
    kvf_router_req_t q = {0};
    q.id = 1;
    q.ask.prompt = (uint32_t *)ids;
    q.ask.n_prompt = n;
    q.ask.sampling = &s;
    kvf_router_node_t *p, *d;
    bool ok = kvf_router__pick(fx->r, &q, &p, &d);
    free(q.ask.hashes);
    if (ok) {
        *p_p = p->id;
        *d_p = d->id;
    }
    return ok;
}

static uint32_t below(uint64_t *rng, uint32_t n)
{
    return (uint32_t)(kvf_splitmix64(rng) % n);
}

/* One drawn state: every node's load, and for the prompt, the blocks of
 * it some nodes hold; then both routers' picks. */
static void one_case(fixture_t *fx, kvf_sim_router_t *sr, uint64_t *rng, uint64_t *seq,
                     int *n_picked)
{
    for (int i = 0; i < N_NODES; i++) {
        uint32_t free_blocks = below(rng, CAPACITY + 1);
        kvf_sim_load_t l = {free_blocks, CAPACITY, below(rng, 4), below(rng, 3),
                            below(rng, 3) * (uint64_t)below(rng, 400)};
        real_beat(fx, i, &l);
        kvf_sim_router_beat(sr, i, &l);
    }
    uint32_t ids[MAX_PROMPT];
    uint32_t n = 33 + below(rng, MAX_PROMPT - 33);
    uint32_t family = below(rng, 3); /* three prompt families share their leading blocks */
    for (uint32_t k = 0; k < n; k++)
        ids[k] = k < 96 ? family * 1000 + k : (uint32_t)kvf_splitmix64(rng) % 500;
    int holder = (int)below(rng, N_NODES + 1); /* N_NODES: nobody reports */
    if (holder < N_NODES && n >= BS) {
        uint32_t nb = 1 + below(rng, n / BS);
        real_cached(fx, holder, ids, n, nb, &seq[holder]);
        assert_int_equal(kvf_sim_router_cached(sr, holder, ids, n, nb), KVF_OK);
    }
    uint32_t max_tokens = 1 + below(rng, 300);
    const char *rp = NULL, *rd = NULL, *sp = NULL, *sd = NULL;
    bool real_ok = real_pick(fx, ids, n, max_tokens, &rp, &rd);
    bool sim_ok = kvf_sim_router_pick(sr, ids, n, max_tokens, &sp, &sd);
    assert_int_equal(real_ok, sim_ok);
    if (!real_ok)
        return;
    if (strcmp(rp, sp) || strcmp(rd, sd))
        fail_msg("real router picked %s -> %s, the simulator's %s -> %s", rp, rd, sp, sd);
    (*n_picked)++;
}

static void test_same_picks(void **state)
{
    fixture_t *fx = *state;
    register_all(fx);
    kvf_sim_router_t *sr = sim_router(fx);
    uint64_t rng = 42, seq[N_NODES] = {1, 1, 1, 1};
    int picked = 0;
    for (int c = 0; c < N_CASES; c++)
        one_case(fx, sr, &rng, seq, &picked);
    /* most states have room somewhere: the comparison is not vacuous */
    assert_true(picked > N_CASES / 2);
    kvf_sim_router_destroy(sr);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_same_picks, setup_kv, rfx_teardown),
        cmocka_unit_test_setup_teardown(test_same_picks, setup_load, rfx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
