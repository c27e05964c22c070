/* KV-aware routing and conditional disaggregation through a whole cluster
 * (docs/prefix-cache.md, "Routing"): 2 prefill and 2 decode nodes (the
 * decode nodes with --prefill-local), a router with --route kv and
 * --local-prefill-max-tokens 64, and two conversations sharing a system
 * prompt, each turn resending the conversation so far (the previous
 * answer included) with a new user message.
 *
 * Turn 1 is prefilled on a prefill node and shipped; from turn 2 on the
 * decode node that holds the conversation prefills the rest itself (32
 * and 44 tokens), nothing shipped, reusing blocks that hold the previous
 * answer (written by its decode steps). Every output equals the colocated
 * cold run token for token. Then a decode node dies holding its conversation's
 * blocks: the router's index drops them, so that conversation's next turn
 * goes to the other decode node, which lacks the prefix and has it
 * prefilled on a prefill node again, still equal to the cold run; the
 * other conversation stays local. */
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

#define VOCAB   512
#define CONVS   2
#define TURNS   3
#define SYSTEM  48 /* tokens of the shared system prompt (3 blocks) */
#define FIRST   52 /* the first user message: turn 1 is 100 tokens */
#define USER    20 /* each later user message */
#define ANSWER  24 /* tokens each turn generates */

static char model_dir[256];
static h_gen_t turns[CONVS][TURNS];
static uint32_t *refs[CONVS][TURNS];
static size_t n_refs[CONVS][TURNS];

/* turns[c][t]: the conversation so far plus a new user message; each
 * turn's answer is the colocated run's (greedy: what the cluster must
 * produce too). */
static void make_conversations(void)
{
    uint32_t *system = h_prompt(SYSTEM, VOCAB, 500);
    system[0] = VOCAB - 2; /* BOS */
    for (int c = 0; c < CONVS; c++) {
        for (int t = 0; t < TURNS; t++) {
            h_gen_t *g = &turns[c][t];
            size_t before = t ? turns[c][t - 1].n_prompt + n_refs[c][t - 1] : SYSTEM;
            size_t add = t ? USER : FIRST;
            memset(g, 0, sizeof(*g));
            g->n_prompt = before + add;
            g->prompt = malloc(g->n_prompt * sizeof(uint32_t));
            assert_non_null(g->prompt);
            if (t) {
                const h_gen_t *prev = &turns[c][t - 1];
                memcpy(g->prompt, prev->prompt, prev->n_prompt * sizeof(uint32_t));
                memcpy(g->prompt + prev->n_prompt, refs[c][t - 1],
                       n_refs[c][t - 1] * sizeof(uint32_t));
            } else {
                memcpy(g->prompt, system, SYSTEM * sizeof(uint32_t));
            }
            uint32_t *msg = h_prompt(add, VOCAB, 600 + 10 * (uint64_t)c + (uint64_t)t);
            memcpy(g->prompt + before, msg, add * sizeof(uint32_t));
            free(msg);
            g->max_tokens = ANSWER;
            g->ignore_eos = true;
            refs[c][t] = h_colocated(model_dir, g, &n_refs[c][t]);
            assert_int_equal(n_refs[c][t], ANSWER);
        }
    }
    free(system);
}

static int setup(void **state)
{
    (void)state;
    snprintf(model_dir, sizeof(model_dir), "/tmp/kvf-test-routing-model-%d", (int)getpid());
    h_mkmodel(model_dir, "--layers 2 --hidden 64 --heads 4 --kv-heads 2 --inter 128 "
                         "--vocab 512 --max-pos 4096 --seed 13");
    make_conversations();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    for (int c = 0; c < CONVS; c++)
        for (int t = 0; t < TURNS; t++) {
            free(turns[c][t].prompt);
            turns[c][t].prompt = NULL;
            h_gen_free(&turns[c][t]);
            free(refs[c][t]);
        }
    return h_rmmodel(model_dir);
}

/* Turn t of every conversation, at once; each output must be the cold
 * run's. */
static void run_turn(h_cluster_t *c, int t)
{
    h_gen_t g[CONVS];
    uint32_t *ref[CONVS];
    size_t n_ref[CONVS];
    for (int i = 0; i < CONVS; i++) {
        g[i] = turns[i][t];
        ref[i] = refs[i][t];
        n_ref[i] = n_refs[i][t];
    }
    h_generate_many(c, g, CONVS, NULL, 240000);
    h_check_outputs(c, g, ref, n_ref, CONVS, H_FINISH_LENGTH);
    for (int i = 0; i < CONVS; i++) {
        g[i].prompt = NULL; /* turns[i][t] keeps it */
        h_gen_free(&g[i]);
    }
}

/* Waits until the router lists node `name` dead. */
static void wait_dead(h_cluster_t *c, const char *name)
{
    uint64_t give_up = kvf_clock_ns() + 60000000000ull;
    while (kvf_clock_ns() < give_up) {
        h_node_stats_t st[H_MAX_PROCS];
        int n = h_stats(c, st, H_MAX_PROCS);
        for (int i = 0; i < n && i < H_MAX_PROCS; i++)
            if (!strcmp(st[i].id, name) && !strcmp(st[i].state, "dead"))
                return;
        kvf_clock_sleep_ms(50);
    }
    h_cluster_stop(c, true);
    fail_msg("the router never saw %s die", name);
}

static void test_multiturn_kv_local(void **state)
{
    (void)state;
    h_cluster_t c;
    h_cluster_init(&c, model_dir, "sm,self");
    h_start_router(&c, "--route", "kv", "--local-prefill-max-tokens", "64", NULL);
    int d0 = h_start_node(&c, "decode", "decode-0", "--prefill-local", NULL);
    h_start_node(&c, "decode", "decode-1", "--prefill-local", NULL);
    h_start_node(&c, "prefill", "prefill-0", NULL);
    h_start_node(&c, "prefill", "prefill-1", NULL);
    h_wait_nodes(&c, 4, 120000);

    h_totals_t t0, t1, t2;
    run_turn(&c, 0);
    h_totals(&c, &t0);
    /* Turn 1 is prefilled on prefill nodes (no decode node holds
     * anything), and both conversations' 100 tokens are shipped. */
    assert_int_equal(t0.local_prefills, 0);
    assert_true(t0.kv_bytes > 0);

    run_turn(&c, 1);
    h_totals(&c, &t1);
    /* Turn 2 (144 tokens): each conversation's decode node holds the 7
     * full blocks of turn 1's 123 positions with K/V (prompt and answer but
     * its last token) and prefills the last 32 tokens itself. */
    if (t1.local_prefills != 2) {
        h_cluster_stop(&c, true);
        fail_msg("%llu local prefills in turn 2, not 2",
                 (unsigned long long)t1.local_prefills);
    }
    assert_int_equal(t1.kv_bytes, t0.kv_bytes); /* nothing shipped */
    assert_int_equal(t1.prefill_cached - t0.prefill_cached, 2 * 112);
    assert_int_equal(t1.prefill_computed - t0.prefill_computed, 2 * 32);

    /* decode-0 dies holding one conversation's blocks: its next turn goes
     * to decode-1, which has it prefilled on a prefill node (it holds only
     * the system prompt's blocks: 140 of 188 tokens left, above 64); the
     * other conversation stays local on decode-1 (9 of its 10 blocks
     * reused: 44 tokens left). */
    h_kill(&c, d0);
    wait_dead(&c, "decode-0");
    run_turn(&c, 2);
    h_totals(&c, &t2);
    if (t2.local_prefills != 3) {
        h_cluster_stop(&c, true);
        fail_msg("%llu local prefills after turn 3, not 3",
                 (unsigned long long)t2.local_prefills);
    }
    assert_true(t2.kv_bytes > t1.kv_bytes);
    assert_int_equal(t2.redispatched, 0);
    h_wait_no_blocks_used(&c, 30000);
    h_cluster_stop(&c, false);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_multiturn_kv_local, h_teardown),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
