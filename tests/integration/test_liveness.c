/* Liveness under slow compute: a node's death must cost latency only, and
 * a long prefill on a busy node must never look like a death.
 *
 * The scenario: a router with its default timings (500 ms heartbeats,
 * 10 s reservation leases), 2 prefill and 2 decode nodes of one compute
 * thread each, an 8-layer, 512-hidden model, and 4 concurrent prompts of
 * 1500 tokens; one prefill node gets SIGKILL 0.4 s in. The survivor then
 * holds every prompt for several times the lease on a 2-core machine (its
 * queue alone is longer than a lease), so the reservations on the decode
 * nodes live only because they are renewed while it works, and its
 * heartbeats must keep flowing through forwards of seconds. Every request
 * must equal its colocated output, and every live node must hold 0 KV
 * blocks within one lease plus 1 s of the end. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "kvf/clock.h"

#define N_REQ 4
#define PROMPT_TOKENS 1500
#define VOCAB 512
/* The nodes' default lease (kvf-decode --lease-ms). */
#define LEASE_MS 10000

static char model_dir[256];
static h_gen_t reqs[N_REQ];
static uint32_t *refs[N_REQ];
static size_t n_refs[N_REQ];

static int setup(void **state)
{
    (void)state;
    snprintf(model_dir, sizeof(model_dir), "/tmp/kvf-test-liveness-model-%d", (int)getpid());
    h_mkmodel(model_dir, "--layers 8 --hidden 512 --heads 8 --kv-heads 4 --inter 1376 "
                         "--vocab 512 --max-pos 2048 --seed 33");
    for (int i = 0; i < N_REQ; i++)
        h_gen_random(&reqs[i], PROMPT_TOKENS, VOCAB, 700 + (uint64_t)i, 24, true);
    h_references(model_dir, reqs, N_REQ, refs, n_refs);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    h_gens_free(reqs, refs, N_REQ);
    return h_rmmodel(model_dir);
}

typedef struct {
    uint64_t start_ns, kill_after_ns;
    const char *victim;
    bool done;
} timed_kill_t;

static void kill_on_time(h_cluster_t *c, void *arg, size_t tokens)
{
    (void)tokens;
    timed_kill_t *k = arg;
    if (k->done || kvf_clock_ns() - k->start_ns < k->kill_after_ns)
        return;
    int i = h_find(c, k->victim);
    assert_true(i >= 0);
    h_kill(c, i);
    k->done = true;
}

static void test_kill_prefill_during_long_prompts(void **state)
{
    (void)state;
    h_cluster_t c;
    h_cluster_init(&c, model_dir, "sm,self");
    h_start_router(&c, NULL);
    h_start_node(&c, "decode", "decode-0", "--threads", "1", NULL);
    h_start_node(&c, "decode", "decode-1", "--threads", "1", NULL);
    h_start_node(&c, "prefill", "prefill-0", "--threads", "1", NULL);
    h_start_node(&c, "prefill", "prefill-1", "--threads", "1", NULL);
    h_wait_nodes(&c, 4, 120000);
    timed_kill_t kill = {.start_ns = kvf_clock_ns(),
                         .kill_after_ns = 400000000ull,
                         .victim = "prefill-0"};
    /* Bounded for a machine many times slower than a 2-core one under
     * ASan: the requests' own deadlines decide long before. */
    h_generate_many_ex(&c, reqs, N_REQ, NULL, 1200000, kill_on_time, &kill);
    assert_true(kill.done);
    h_check_outputs(&c, reqs, refs, n_refs, N_REQ, H_FINISH_LENGTH);
    h_wait_no_blocks_used(&c, LEASE_MS + 1000);
    h_cluster_stop(&c, false);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_kill_prefill_during_long_prompts, h_teardown),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
