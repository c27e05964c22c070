/* Node failures under load: a node killed with SIGKILL mid-stream costs
 * latency, never a lost or duplicated token or a leaked KV block. Every
 * request must finish with exactly the colocated greedy output, and every
 * live node must end with 0 KV blocks in use. Also: graceful drain of each
 * role (SIGTERM: no request fails, exit 0), and 1,000 requests cancelled at
 * random moments. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "kvf/clock.h"
#include "kvf/msg.h"
#include "kvf/status.h"

#define N_REQ 16
#define VOCAB 512
/* The decode nodes' reservation lease in the kill tests; after any fault
 * every live node holds 0 blocks within one lease plus 1 s. */
#define LEASE_MS 3000
#define LEASE_ARG "3000"

static char model_dir[256];
static h_gen_t reqs[N_REQ];
static uint32_t *refs[N_REQ];
static size_t n_refs[N_REQ];

static int setup(void **state)
{
    (void)state;
    snprintf(model_dir, sizeof(model_dir), "/tmp/kvf-test-failures-model-%d", (int)getpid());
    /* Big enough that 16 streams last a while on the CPU. */
    h_mkmodel(model_dir, "--layers 4 --hidden 256 --heads 4 --kv-heads 2 --inter 512 "
                         "--vocab 512 --max-pos 2048 --seed 21");
    for (int i = 0; i < N_REQ; i++)
        h_gen_random(&reqs[i], 16 + (size_t)((i * 131) % 400), VOCAB, 50 + (uint64_t)i,
                     120 + (uint32_t)((i * 53) % 120), true);
    h_references(model_dir, reqs, N_REQ, refs, n_refs);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    h_gens_free(reqs, refs, N_REQ);
    return h_rmmodel(model_dir);
}

/* The kills to make: node names, each once the streams have produced the
 * given number of tokens in total. A replacement node may be started right
 * after a kill (to keep a role that lost its only node). */
typedef struct {
    const char *victims[2];
    size_t at_tokens[2];
    const char *replacement_role[2];
    const char *replacement_name[2];
    int done;
} kill_plan_t;

static void on_progress(h_cluster_t *c, void *arg, size_t tokens)
{
    kill_plan_t *k = arg;
    while (k->done < 2 && k->victims[k->done] && tokens >= k->at_tokens[k->done]) {
        int i = h_find(c, k->victims[k->done]);
        assert_true(i >= 0);
        h_kill(c, i);
        if (k->replacement_role[k->done])
            h_start_node(c, k->replacement_role[k->done], k->replacement_name[k->done], NULL);
        k->done++;
    }
}

/* Every request finished with exactly its colocated output. */
static void check_outputs(h_cluster_t *c)
{
    h_check_outputs(c, reqs, refs, n_refs, N_REQ, H_FINISH_LENGTH);
    for (int i = 0; i < N_REQ; i++)
        h_gen_free(&reqs[i]);
}

static void run_with_kills(int n_prefill, int n_decode, kill_plan_t *plan)
{
    h_cluster_t c;
    h_cluster_init(&c, model_dir, "sm,self");
    /* Fast failure detection keeps the test short. */
    h_start_router(&c, "--heartbeat-ms", "200", NULL);
    for (int i = 0; i < n_decode; i++) {
        char name[32];
        snprintf(name, sizeof(name), "decode-%d", i);
        h_start_node(&c, "decode", name, "--lease-ms", LEASE_ARG, NULL);
    }
    for (int i = 0; i < n_prefill; i++) {
        char name[32];
        snprintf(name, sizeof(name), "prefill-%d", i);
        h_start_node(&c, "prefill", name, NULL);
    }
    h_wait_nodes(&c, n_prefill + n_decode, 120000);
    h_generate_many_ex(&c, reqs, N_REQ, NULL, 300000, on_progress, plan);
    check_outputs(&c);
    for (int k = 0; k < 2; k++)
        if (plan->victims[k] && plan->done <= k) {
            h_cluster_stop(&c, true);
            fail_msg("the streams ended before the kill of %s", plan->victims[k]);
        }
    h_wait_no_blocks_used(&c, LEASE_MS + 1000);
    h_cluster_stop(&c, false);
}

static void test_kill_prefill_2p2d(void **state)
{
    (void)state;
    kill_plan_t plan = {.victims = {"prefill-0"}, .at_tokens = {20}};
    run_with_kills(2, 2, &plan);
}

static void test_kill_only_prefill_1p2d(void **state)
{
    (void)state;
    /* The only prefill node dies; an operator's replacement comes up. */
    kill_plan_t plan = {.victims = {"prefill-0"},
                        .at_tokens = {20},
                        .replacement_role = {"prefill"},
                        .replacement_name = {"prefill-1"}};
    run_with_kills(1, 2, &plan);
}

static void test_kill_decode_1p2d(void **state)
{
    (void)state;
    kill_plan_t plan = {.victims = {"decode-0"}, .at_tokens = {300}};
    run_with_kills(1, 2, &plan);
}

static void test_kill_decode_2p2d(void **state)
{
    (void)state;
    kill_plan_t plan = {.victims = {"decode-1"}, .at_tokens = {300}};
    run_with_kills(2, 2, &plan);
}

static void test_kill_both_2p2d(void **state)
{
    (void)state;
    kill_plan_t plan = {.victims = {"prefill-1", "decode-0"}, .at_tokens = {20, 600}};
    run_with_kills(2, 2, &plan);
}

static void test_kill_both_1p2d(void **state)
{
    (void)state;
    kill_plan_t plan = {.victims = {"prefill-0", "decode-1"},
                        .at_tokens = {20, 600},
                        .replacement_role = {"prefill"},
                        .replacement_name = {"prefill-9"}};
    run_with_kills(1, 2, &plan);
}

/* SIGTERM to a node of the given role mid-stream: the node drains (no
 * request fails), deregisters and exits 0. */
typedef struct {
    const char *victim;
    size_t at_tokens;
    int status;
    bool done;
} drain_plan_t;

static void on_drain_progress(h_cluster_t *c, void *arg, size_t tokens)
{
    drain_plan_t *d = arg;
    if (d->done || tokens < d->at_tokens)
        return;
    d->done = true;
    int i = h_find(c, d->victim);
    assert_true(i >= 0);
    d->status = h_terminate(c, i, 60000);
}

static void run_drain(const char *victim)
{
    h_cluster_t c;
    h_cluster_init(&c, model_dir, "sm,self");
    h_start_router(&c, "--heartbeat-ms", "200", NULL);
    h_start_node(&c, "decode", "decode-0", "--lease-ms", LEASE_ARG, NULL);
    h_start_node(&c, "decode", "decode-1", "--lease-ms", LEASE_ARG, NULL);
    h_start_node(&c, "prefill", "prefill-0", NULL);
    h_start_node(&c, "prefill", "prefill-1", NULL);
    h_wait_nodes(&c, 4, 120000);
    drain_plan_t plan = {.victim = victim, .at_tokens = 10};
    h_generate_many_ex(&c, reqs, N_REQ, NULL, 300000, on_drain_progress, &plan);
    assert_true(plan.done);
    if (!WIFEXITED(plan.status) || WEXITSTATUS(plan.status) != 0) {
        h_cluster_stop(&c, true);
        fail_msg("%s did not drain and exit 0 (status %d)", victim, plan.status);
    }
    check_outputs(&c);
    /* A draining decode node finishes its sequences itself. */
    if (!strncmp(victim, "decode", 6) && h_redispatched(&c) != 0) {
        h_cluster_stop(&c, true);
        fail_msg("requests of the draining %s were dispatched again", victim);
    }
    h_wait_no_blocks_used(&c, LEASE_MS + 1000);
    h_cluster_stop(&c, false);
}

static void test_drain_decode(void **state)
{
    (void)state;
    run_drain("decode-0");
}

static void test_drain_prefill(void **state)
{
    (void)state;
    run_drain("prefill-0");
}

/* 1,000 requests, each cancelled at a random moment (before its first
 * token, mid-prefill, mid-decode, or never reached): every one ends, and
 * no block stays in use. */
static void test_thousand_cancels(void **state)
{
    (void)state;
    h_cluster_t c;
    h_cluster_init(&c, model_dir, "sm,self");
    h_start_router(&c, NULL);
    h_start_node(&c, "decode", "decode-0", "--lease-ms", LEASE_ARG, NULL);
    h_start_node(&c, "decode", "decode-1", "--lease-ms", LEASE_ARG, NULL);
    h_start_node(&c, "prefill", "prefill-0", NULL);
    h_wait_nodes(&c, 3, 120000);
    kvf_client_t *client;
    assert_int_equal(kvf_client_create(c.client_url, &client), KVF_OK);
    enum { TOTAL = 1000, WAVE = 50 };
    uint64_t rng = 12345;
    size_t finished = 0, cancelled = 0;
    uint32_t prompt[64];
    for (int i = 0; i < 64; i++)
        prompt[i] = (uint32_t)(1 + (i * 7) % 500);
    for (int wave = 0; wave < TOTAL / WAVE; wave++) {
        uint64_t cancel_at[WAVE];
        bool done[WAVE] = {false}, sent_cancel[WAVE] = {false};
        uint64_t base = 100000 + (uint64_t)wave * WAVE;
        uint64_t t0 = kvf_clock_ns();
        for (int i = 0; i < WAVE; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            cancel_at[i] = t0 + (rng >> 33) % 60000000ull; /* 0..60 ms */
            Kvf__Sampling s = KVF__SAMPLING__INIT;
            s.max_tokens = 40 + (uint32_t)((rng >> 20) % 80);
            s.ignore_eos = true;
            kvf_client_generate_t g = {.client_req_id = base + (uint64_t)i,
                                       .ids = prompt,
                                       .n_ids = 8 + (size_t)((rng >> 40) % 56),
                                       .sampling = &s};
            assert_int_equal(kvf_client_generate(client, "test", &g, 5000), KVF_OK);
        }
        int left = WAVE;
        uint64_t deadline = t0 + 120000000000ull;
        while (left > 0 && kvf_clock_ns() < deadline) {
            uint64_t now = kvf_clock_ns();
            for (int i = 0; i < WAVE; i++) {
                if (!done[i] && !sent_cancel[i] && now >= cancel_at[i]) {
                    assert_int_equal(
                        kvf_client_cancel(client, "test", base + (uint64_t)i, 5000), KVF_OK);
                    sent_cancel[i] = true;
                }
            }
            kvf_envelope_t *in = NULL;
            if (kvf_client_recv(client, 2, &in) != KVF_OK)
                continue;
            if (in->body_case == KVF__ENVELOPE__BODY_GENERATE_CHUNK) {
                const Kvf__GenerateChunk *ch = in->generate_chunk;
                uint64_t i = ch->client_req_id - base;
                if (i < WAVE && !done[i] &&
                    ch->finish_reason != KVF__FINISH_REASON__FINISH_NONE) {
                    assert_true(ch->finish_reason == KVF__FINISH_REASON__FINISH_CANCELLED ||
                                ch->finish_reason == KVF__FINISH_REASON__FINISH_LENGTH);
                    cancelled += ch->finish_reason == KVF__FINISH_REASON__FINISH_CANCELLED;
                    done[i] = true;
                    finished++;
                    left--;
                }
            }
            kvf_envelope_free(in);
        }
        if (left) {
            kvf_client_destroy(client);
            h_cluster_stop(&c, true);
            fail_msg("wave %d: %d requests never finished", wave, left);
        }
    }
    kvf_client_destroy(client);
    fprintf(stderr, "1000 requests: %zu cancelled, %zu completed first\n", cancelled,
            finished - cancelled);
    assert_int_equal(finished, TOTAL);
    assert_true(cancelled > TOTAL / 4);
    h_wait_no_blocks_used(&c, LEASE_MS + 1000);
    h_cluster_stop(&c, false);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_kill_prefill_2p2d, h_teardown),
        cmocka_unit_test_teardown(test_kill_only_prefill_1p2d, h_teardown),
        cmocka_unit_test_teardown(test_kill_decode_1p2d, h_teardown),
        cmocka_unit_test_teardown(test_kill_decode_2p2d, h_teardown),
        cmocka_unit_test_teardown(test_kill_both_2p2d, h_teardown),
        cmocka_unit_test_teardown(test_kill_both_1p2d, h_teardown),
        cmocka_unit_test_teardown(test_drain_decode, h_teardown),
        cmocka_unit_test_teardown(test_drain_prefill, h_teardown),
        cmocka_unit_test_teardown(test_thousand_cancels, h_teardown),
    };
    /* KVF_TEST_FILTER=test_name (glob) runs a subset. */
    if (getenv("KVF_TEST_FILTER"))
        cmocka_set_test_filter(getenv("KVF_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
