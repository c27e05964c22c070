/* The cluster end to end: a router, prefill and decode nodes as separate
 * processes on 127.0.0.1. Every greedy output must equal the colocated
 * `kvf generate` token for token and byte for byte of its text (some of
 * which holds U+0000), and every node must hold 0 KV blocks once the
 * requests are done, in every KV format. Also: cancel, KvAlloc refusal (queue and retry), a
 * decode node joining while serving, and invalid requests. */
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
#include "kvf/status.h"

#define N_REQ 32
#define VOCAB 512

static char model_dir[256];
static h_gen_t reqs[N_REQ];
static uint32_t *refs[N_REQ];
static size_t n_refs[N_REQ];
static char *ref_texts[N_REQ];
static size_t n_ref_texts[N_REQ];

/* Prompts of 1..600 tokens, varied max tokens; half ignore EOS. */
static void make_requests(void)
{
    for (int i = 0; i < N_REQ; i++) {
        size_t len = i == 0 ? 1 : i == 1 ? 600 : 1 + (size_t)((i * 197) % 600);
        h_gen_random(&reqs[i], len, VOCAB, (uint64_t)i + 1, 1 + (uint32_t)((i * 37) % 48),
                     i % 2 == 0);
    }
}

static int setup(void **state)
{
    (void)state;
    snprintf(model_dir, sizeof(model_dir), "/tmp/kvf-test-cluster-model-%d", (int)getpid());
    h_mkmodel(model_dir, "--layers 2 --hidden 64 --heads 4 --kv-heads 2 --inter 128 "
                         "--vocab 512 --max-pos 4096 --seed 11");
    make_requests();
    int with_nul = 0;
    for (int i = 0; i < N_REQ; i++) {
        refs[i] = h_colocated(model_dir, &reqs[i], &n_refs[i]);
        ref_texts[i] = h_colocated_text(model_dir, &reqs[i], &n_ref_texts[i]);
        with_nul += memchr(ref_texts[i], '\0', n_ref_texts[i]) != NULL;
    }
    /* The text check covers U+0000 only while some output holds it (this
     * model's byte-fallback token 188 is generated for requests 1, 7, 9). */
    assert_true(with_nul > 0);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    for (int i = 0; i < N_REQ; i++) {
        free(reqs[i].prompt);
        free(refs[i]);
        free(ref_texts[i]);
    }
    return h_rmmodel(model_dir);
}

/* Every generation's text equals its colocated reference, byte for byte. */
static void check_texts(h_cluster_t *c, const h_gen_t *gens, size_t n)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        const h_gen_t *g = &gens[i];
        size_t k = 0;
        while (k < g->n_text && k < n_ref_texts[i] && g->out_text[k] == ref_texts[i][k])
            k++;
        if (k != g->n_text || k != n_ref_texts[i]) {
            fprintf(stderr,
                    "request %zu: %zu bytes of text (colocated %zu), first difference at %zu\n", i,
                    g->n_text, n_ref_texts[i], k);
            bad++;
        }
    }
    if (bad) {
        h_cluster_stop(c, true);
        fail_msg("%d of %zu texts differ from the colocated output", bad, n);
    }
}

static void run_cluster(int n_prefill, int n_decode, const char *tls)
{
    h_cluster_t c;
    h_cluster_init(&c, model_dir, tls);
    h_start_router(&c, NULL);
    for (int i = 0; i < n_decode; i++) {
        char name[32];
        snprintf(name, sizeof(name), "decode-%d", i);
        h_start_node(&c, "decode", name, NULL);
    }
    for (int i = 0; i < n_prefill; i++) {
        char name[32];
        snprintf(name, sizeof(name), "prefill-%d", i);
        h_start_node(&c, "prefill", name, NULL);
    }
    h_wait_nodes(&c, n_prefill + n_decode, 120000);
    h_generate_many(&c, reqs, N_REQ, NULL, 240000);
    h_check_outputs(&c, reqs, refs, n_refs, N_REQ, H_FINISH_STOP | H_FINISH_LENGTH);
    check_texts(&c, reqs, N_REQ);
    h_wait_no_blocks_used(&c, 30000);
    h_cluster_stop(&c, false);
    for (int i = 0; i < N_REQ; i++)
        h_gen_free(&reqs[i]);
}

static void test_1_prefill_1_decode_shm(void **state)
{
    (void)state;
    run_cluster(1, 1, "sm,self");
}

static void test_2_prefill_3_decode_tcp(void **state)
{
    (void)state;
    run_cluster(2, 3, "tcp,self");
}

/* Split equals colocated for golden model `model` (the m-th, which picks
 * the prompts' seeds): prompts and generations that cross the windows and
 * the block boundaries, on one prefill and one decode node. */
static void split_golden(const char *model, int m)
{
    static const size_t lens[] = {1, 17, 40, 93, 150, 33};
    static const uint32_t max_tokens[] = {30, 40, 20, 40, 12, 40};
    enum { N = sizeof(lens) / sizeof(lens[0]) };
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s/golden/%s", KVF_TEST_DATA, model);
    h_gen_t g[N];
    uint32_t *ref[N];
    size_t n_ref[N];
    for (size_t i = 0; i < N; i++) {
        h_gen_random(&g[i], lens[i], VOCAB, 50 + i + 10 * (uint64_t)m, max_tokens[i], i % 2 == 0);
        ref[i] = h_colocated(dir, &g[i], &n_ref[i]);
    }
    h_cluster_t c;
    h_cluster_init(&c, dir, "sm,self");
    h_start_router(&c, NULL);
    h_start_node(&c, "decode", "decode-0", NULL);
    h_start_node(&c, "prefill", "prefill-0", NULL);
    h_wait_nodes(&c, 2, 120000);
    h_generate_many(&c, g, N, NULL, 120000);
    h_check_outputs(&c, g, ref, n_ref, N, H_FINISH_STOP | H_FINISH_LENGTH);
    h_wait_no_blocks_used(&c, 30000);
    h_cluster_stop(&c, false);
    for (size_t i = 0; i < N; i++) {
        free(ref[i]);
        h_gen_free(&g[i]);
        free(g[i].prompt);
    }
}

static void test_split_qwen3_sliding_window(void **state)
{
    (void)state;
    static const char *models[] = {"tiny-qwen3-f32", "tiny-mistral-sw-f32"};
    for (int m = 0; m < 2; m++)
        split_golden(models[m], m);
}

/* The same for the Gemma2 golden model: the window of 16 on layers 0 and 2
 * only, soft-capped scores and logits, the post-norms. */
static void test_split_gemma2(void **state)
{
    (void)state;
    split_golden("tiny-gemma2-f32", 2);
}

/* Whether process i's log holds text (its startup line names its KV
 * format). */

/* The prefix caches through the whole cluster: a 120-token prompt, the
 * same prompt again, and one sharing its first 4 blocks. The prefill node
 * computes only what its cache lacks (5 blocks reused the second time: a
 * hit leaves a 32-token tail), the decode node is not sent the blocks it
 * holds; each output equals the colocated cold run, no block stays in
 * use, and the nodes' final stats lines count the hits. */
static void test_prefix_cache_split(void **state)
{
    (void)state;
    h_gen_t g[3];
    h_gen_random(&g[0], 120, VOCAB, 901, 12, true);
    h_gen_random(&g[1], 120, VOCAB, 901, 12, true);
    h_gen_random(&g[2], 120, VOCAB, 902, 12, true);
    memcpy(g[2].prompt, g[0].prompt, 64 * sizeof(uint32_t));
    g[2].prompt[64] = g[0].prompt[64] == 1 ? 2 : 1; /* the fifth block differs */
    uint32_t *ref[3];
    size_t n_ref[3];
    h_references(model_dir, g, 3, ref, n_ref);
    h_cluster_t c;
    h_cluster_init(&c, model_dir, "sm,self");
    h_start_router(&c, NULL);
    int dn = h_start_node(&c, "decode", "decode-0", NULL);
    int pf = h_start_node(&c, "prefill", "prefill-0", NULL);
    h_wait_nodes(&c, 2, 120000);
    for (int i = 0; i < 3; i++) /* one at a time: each finds the last one's blocks */
        h_generate_many(&c, &g[i], 1, NULL, 240000);
    h_check_outputs(&c, g, ref, n_ref, 3, H_FINISH_LENGTH);
    h_wait_no_blocks_used(&c, 30000);
    assert_int_equal(h_terminate(&c, pf, 60000), 0);
    assert_int_equal(h_terminate(&c, dn, 60000), 0);
    /* The prefill node reused 80 + 64 tokens; the decode node was offered
     * 7 blocks each time (all but the prompt's last) and held 0, 7 and 4
     * of them, which were not shipped again. */
    if (!h_log_holds(&c, pf, "prefix cache on: 144 of 360 prompt tokens hit") ||
        !h_log_holds(&c, dn, "prefix cache on: 11 of 21 blocks hit")) {
        h_cluster_stop(&c, true);
        fail_msg("the nodes' stats do not count the prefix hits expected");
    }
    h_cluster_stop(&c, false);
    h_gens_free(g, ref, 3);
}

/* Split equals colocated in every KV format, both sides on the same one
 * (KVF_KV_DTYPE reaches the nodes and the colocated `kvf generate
 * --kv-dtype`): a third of the requests, prompts of 1..600 tokens, on one
 * prefill and one decode node; every block comes back. The formats are
 * KVF_TEST_KV_DTYPES (comma-separated) when set, else all five. */
static void test_split_every_kv_dtype(void **state)
{
    (void)state;
    const char *list = getenv("KVF_TEST_KV_DTYPES");
    char names[64];
    snprintf(names, sizeof(names), "%s", list && *list ? list : "f32,bf16,f16,fp8,int8");
    enum { N = N_REQ / 3 };
    char *save = NULL;
    for (char *dt = strtok_r(names, ",", &save); dt; dt = strtok_r(NULL, ",", &save)) {
        fprintf(stderr, "split = colocated with --kv-dtype %s\n", dt);
        assert_int_equal(setenv("KVF_KV_DTYPE", dt, 1), 0);
        h_gen_t g[N];
        uint32_t *ref[N];
        size_t n_ref[N];
        for (int i = 0; i < N; i++) {
            g[i] = reqs[3 * i];
            g[i].out = NULL;
            g[i].out_text = NULL;
            g[i].n_out = g[i].cap_out = g[i].n_text = 0;
            ref[i] = h_colocated(model_dir, &g[i], &n_ref[i]);
        }
        h_cluster_t c;
        h_cluster_init(&c, model_dir, "sm,self");
        h_start_router(&c, NULL);
        int nodes[2] = {h_start_node(&c, "decode", "decode-0", NULL),
                        h_start_node(&c, "prefill", "prefill-0", NULL)};
        h_wait_nodes(&c, 2, 120000);
        char want[32];
        snprintf(want, sizeof(want), " kv %s (", dt);
        for (int k = 0; k < 2; k++) /* the nodes' pools are in that format */
            if (!h_log_holds(&c, nodes[k], want)) {
                h_cluster_stop(&c, true);
                fail_msg("node %d does not say '%s'", k, want);
            }
        h_generate_many(&c, g, N, NULL, 240000);
        h_check_outputs(&c, g, ref, n_ref, N, H_FINISH_STOP | H_FINISH_LENGTH);
        h_wait_no_blocks_used(&c, 30000);
        h_cluster_stop(&c, false);
        for (int i = 0; i < N; i++) {
            free(ref[i]);
            h_gen_free(&g[i]);
        }
    }
    unsetenv("KVF_KV_DTYPE");
}

/* h_teardown, and the next tests back on the default KV format even when
 * this one failed with KVF_KV_DTYPE set. */
static int kv_dtype_teardown(void **state)
{
    unsetenv("KVF_KV_DTYPE");
    return h_teardown(state);
}

/* Two requests that cannot both fit the decode node's pool: the second is
 * refused (KvAlloc), waits, and completes after the first; one that can
 * never fit fails at once. Afterwards no block is in use. */
static void test_refusal(void **state)
{
    (void)state;
    h_cluster_t c;
    h_cluster_init(&c, model_dir, "sm,self");
    h_start_router(&c, NULL);
    /* 512 bytes per token: 40 blocks of 16 tokens. */
    h_start_node(&c, "decode", "decode-small", "--kv-mem", "320K", NULL);
    h_start_node(&c, "prefill", "prefill-0", NULL);
    h_wait_nodes(&c, 2, 120000);

    h_gen_t g[2];
    memset(g, 0, sizeof(g));
    for (int i = 0; i < 2; i++) {
        g[i].prompt = h_prompt(300, VOCAB, 100 + (uint64_t)i);
        g[i].n_prompt = 300;
        g[i].max_tokens = 200;
        g[i].ignore_eos = true;
    }
    h_generate_many(&c, g, 2, NULL, 120000);
    for (int i = 0; i < 2; i++) {
        size_t n_ref;
        uint32_t *ref = h_colocated(model_dir, &g[i], &n_ref);
        assert_int_equal(g[i].finish, 2);
        assert_int_equal(g[i].n_out, n_ref);
        assert_memory_equal(g[i].out, ref, n_ref * sizeof(uint32_t));
        free(ref);
    }
    h_wait_no_blocks_used(&c, 30000);

    /* A request larger than any decode node's pool fails at once. */
    h_gen_t huge;
    memset(&huge, 0, sizeof(huge));
    huge.prompt = h_prompt(600, VOCAB, 9);
    huge.n_prompt = 600;
    huge.max_tokens = 100;
    h_generate_many(&c, &huge, 1, NULL, 10000);
    assert_int_equal(huge.finish, 4 /* ERROR */);
    assert_int_equal(huge.status, KVF_ERR_TOO_BIG);
    h_gen_free(&huge);
    free(huge.prompt);

    /* The cluster still serves. */
    h_gen_t after = g[0];
    after.out = NULL;
    after.out_text = NULL;
    after.n_out = after.cap_out = after.n_text = 0;
    after.max_tokens = 4;
    h_generate_many(&c, &after, 1, NULL, 60000);
    assert_int_equal(after.finish, 2);
    assert_int_equal(after.n_out, 4);
    assert_memory_equal(after.out, g[0].out, 4 * sizeof(uint32_t));
    h_wait_no_blocks_used(&c, 30000);
    h_cluster_stop(&c, false);
    for (int i = 0; i < 2; i++) {
        h_gen_free(&g[i]);
        free(g[i].prompt);
    }
    h_gen_free(&after);
}

/* A long generation cancelled mid-stream: the client gets CANCELLED, both
 * nodes free the request's blocks, and the cluster keeps serving. */
static void test_cancel(void **state)
{
    (void)state;
    h_cluster_t c;
    h_cluster_init(&c, model_dir, "sm,self");
    h_start_router(&c, NULL);
    h_start_node(&c, "decode", "decode-0", NULL);
    h_start_node(&c, "prefill", "prefill-0", NULL);
    h_wait_nodes(&c, 2, 120000);
    /* Cancel after 5 tokens of a long generation. */
    h_gen_t cg;
    memset(&cg, 0, sizeof(cg));
    cg.prompt = h_prompt(50, VOCAB, 7);
    cg.n_prompt = 50;
    cg.max_tokens = 4000;
    cg.ignore_eos = true;
    int cancel_after = 5;
    h_generate_many(&c, &cg, 1, &cancel_after, 60000);
    assert_int_equal(cg.finish, 3 /* CANCELLED */);
    assert_true(cg.n_out >= 5 && cg.n_out < 4000);
    h_wait_no_blocks_used(&c, 30000);

    h_gen_free(&cg);
    free(cg.prompt);
    h_generate_many(&c, reqs, 2, NULL, 60000);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(reqs[i].n_out, n_refs[i]);
        assert_memory_equal(reqs[i].out, refs[i], n_refs[i] * sizeof(uint32_t));
        h_gen_free(&reqs[i]);
    }
    h_wait_no_blocks_used(&c, 30000);
    h_cluster_stop(&c, false);
}

static void test_decode_node_joins(void **state)
{
    (void)state;
    h_cluster_t c;
    h_cluster_init(&c, model_dir, "sm,self");
    h_start_router(&c, NULL);
    h_start_node(&c, "decode", "decode-a", NULL);
    h_start_node(&c, "prefill", "prefill-0", NULL);
    h_wait_nodes(&c, 2, 120000);
    h_generate_many(&c, reqs, 4, NULL, 60000);
    h_start_node(&c, "decode", "decode-b", NULL);
    h_wait_nodes(&c, 3, 120000);
    for (int i = 0; i < 4; i++)
        h_gen_free(&reqs[i]);
    h_generate_many(&c, reqs, 8, NULL, 120000);
    for (int i = 0; i < 8; i++) {
        assert_int_equal(reqs[i].n_out, n_refs[i]);
        assert_memory_equal(reqs[i].out, refs[i], n_refs[i] * sizeof(uint32_t));
        h_gen_free(&reqs[i]);
    }
    h_node_stats_t st[8];
    int n = h_stats(&c, st, 8);
    bool b_worked = false;
    for (int i = 0; i < n; i++)
        if (!strcmp(st[i].id, "decode-b") && st[i].dispatched > 0)
            b_worked = true;
    if (!b_worked)
        h_cluster_stop(&c, true);
    assert_true(b_worked);
    h_wait_no_blocks_used(&c, 30000);
    h_cluster_stop(&c, false);
}

static void test_invalid_requests(void **state)
{
    (void)state;
    h_cluster_t c;
    h_cluster_init(&c, model_dir, "sm,self");
    h_start_router(&c, NULL);
    h_start_node(&c, "decode", "decode-0", NULL);
    h_start_node(&c, "prefill", "prefill-0", NULL);
    h_wait_nodes(&c, 2, 120000);
    h_gen_t bad[5];
    memset(bad, 0, sizeof(bad));
    bad[0].text = "";                           /* empty prompt */
    uint32_t *longp = h_prompt(4100, VOCAB, 3); /* longer than the context (4096) */
    bad[1].prompt = longp;
    bad[1].n_prompt = 4100;
    uint32_t ok_prompt[] = {510, 5, 6, 7};
    bad[2].prompt = ok_prompt;
    bad[2].n_prompt = 4;
    bad[2].temperature = -1.0f;
    bad[3].prompt = ok_prompt;
    bad[3].n_prompt = 4;
    bad[3].top_p = 2.0f;
    uint32_t bad_ids[] = {510, 9999};
    bad[4].prompt = bad_ids;
    bad[4].n_prompt = 2;
    h_generate_many(&c, bad, 5, NULL, 30000);
    for (int i = 0; i < 5; i++) {
        if (bad[i].finish != 4 /* ERROR */ || bad[i].status >= 0 || !bad[i].error[0])
            fprintf(stderr, "invalid request %d: finish %d status %d '%s'\n", i, bad[i].finish,
                    bad[i].status, bad[i].error);
        assert_int_equal(bad[i].finish, 4);
        assert_true(bad[i].status < 0);
        assert_true(bad[i].error[0] != '\0');
        assert_int_equal(bad[i].n_out, 0);
        h_gen_free(&bad[i]);
    }
    free(longp);
    /* ...and it keeps serving. */
    h_gen_t good;
    memset(&good, 0, sizeof(good));
    good.prompt = ok_prompt;
    good.n_prompt = 4;
    good.max_tokens = 8;
    good.ignore_eos = true;
    h_generate_many(&c, &good, 1, NULL, 30000);
    assert_int_equal(good.finish, 2);
    assert_int_equal(good.n_out, 8);
    h_gen_free(&good);
    h_wait_no_blocks_used(&c, 30000);
    h_cluster_stop(&c, false);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_1_prefill_1_decode_shm, h_teardown),
        cmocka_unit_test_teardown(test_2_prefill_3_decode_tcp, h_teardown),
        cmocka_unit_test_teardown(test_split_qwen3_sliding_window, h_teardown),
        cmocka_unit_test_teardown(test_split_gemma2, h_teardown),
        cmocka_unit_test_teardown(test_prefix_cache_split, h_teardown),
        cmocka_unit_test_teardown(test_split_every_kv_dtype, kv_dtype_teardown),
        cmocka_unit_test_teardown(test_refusal, h_teardown),
        cmocka_unit_test_teardown(test_cancel, h_teardown),
        cmocka_unit_test_teardown(test_decode_node_joins, h_teardown),
        cmocka_unit_test_teardown(test_invalid_requests, h_teardown),
    };
    /* KVF_TEST_FILTER=test_name (glob) runs a subset. */
    if (getenv("KVF_TEST_FILTER"))
        cmocka_set_test_filter(getenv("KVF_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
