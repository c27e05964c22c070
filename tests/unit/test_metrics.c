/* router/metrics: observations land in the right counters and buckets, and
 * the Prometheus text is well formed (cumulative buckets, +Inf = count,
 * escaped labels). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvf/msg.h"
#include "metrics.h"

/* The value of the sample line that starts with prefix (name and labels). */
static double sample(const char *text, const char *prefix)
{
    size_t n = strlen(prefix);
    for (const char *line = text; line && *line; line = strchr(line, '\n'), line += !!line) {
        if (!strncmp(line, prefix, n) && line[n] == ' ')
            return strtod(line + n + 1, NULL);
    }
    fail_msg("no sample %s", prefix);
    return -1;
}

/* Buckets of a histogram never decrease and end at its count. */
static void check_histogram(const char *text, const char *name, double count)
{
    char prefix[128];
    double prev = 0;
    size_t n_buckets = 0;
    snprintf(prefix, sizeof(prefix), "%s_bucket{le=\"", name);
    for (const char *p = strstr(text, prefix); p; p = strstr(p + 1, prefix)) {
        const char *sp = strchr(p, ' ');
        double v = strtod(sp + 1, NULL);
        assert_true(v >= prev);
        prev = v;
        n_buckets++;
    }
    assert_true(n_buckets > 2);
    snprintf(prefix, sizeof(prefix), "%s_bucket{le=\"+Inf\"}", name);
    assert_true(sample(text, prefix) == count);
    snprintf(prefix, sizeof(prefix), "%s_count", name);
    assert_true(sample(text, prefix) == count);
}

static void test_observe_and_render(void **state)
{
    (void)state;
    kvf_metrics_t *m;
    assert_int_equal(kvf_metrics_create(&m), KVF_OK);
    uint64_t s = 1000000000ull, last = 0;
    /* One request: first token after 50 ms, then 3 tokens at once 30 ms
     * later, then 1 more after 10 ms. */
    kvf_metrics_observe_tokens(m, 10 * s, &last, 1, 10 * s + 50000000ull);
    kvf_metrics_observe_tokens(m, 10 * s, &last, 3, 10 * s + 80000000ull);
    kvf_metrics_observe_tokens(m, 10 * s, &last, 1, 10 * s + 90000000ull);
    kvf_metrics_observe_finished(m, KVF__FINISH_REASON__FINISH_LENGTH, 7, 5, 90000000ull);
    /* A second request that produced its first two tokens together. */
    last = 0;
    kvf_metrics_observe_tokens(m, 0, &last, 2, 2 * s);
    kvf_metrics_observe_finished(m, KVF__FINISH_REASON__FINISH_STOP, 3, 2, 2 * s);
    kvf_metrics_observe_finished(m, KVF__FINISH_REASON__FINISH_CANCELLED, 4, 0, s);
    kvf_metrics_observe_rejected(m);
    kvf_metrics_observe_handoff(m, 1500, 4096);
    kvf_metrics_observe_handoff(m, 500, 1024);
    kvf_metrics_observe_prefix(m, 100, 0);
    kvf_metrics_observe_prefix(m, 100, 64);
    kvf_metrics_observe_prefix(m, 40, 16);

    kvf_router_node_info_t nodes[2] = {
        {.id = "dec\"0", .role = "decode", .state = "live", .blocks_used = 5, .blocks_total = 20},
        {.id = "pre-0", .role = "prefill", .state = "dead", .blocks_cached = 9},
    };
    kvf_router_snapshot_t snap = {
        .requests_queued = 2, .requests_running = 3, .n_nodes = 2, .nodes = nodes};
    char *text;
    size_t len;
    assert_int_equal(kvf_metrics_render(m, &snap, &text, &len), KVF_OK);
    assert_int_equal(strlen(text), len);

    assert_true(sample(text, "kvf_requests_total{finished_reason=\"length\"}") == 1);
    assert_true(sample(text, "kvf_requests_total{finished_reason=\"stop\"}") == 1);
    assert_true(sample(text, "kvf_requests_total{finished_reason=\"cancelled\"}") == 1);
    assert_true(sample(text, "kvf_requests_total{finished_reason=\"error\"}") == 1);
    assert_true(sample(text, "kvf_prompt_tokens_total") == 14);
    assert_true(sample(text, "kvf_generation_tokens_total") == 7);
    assert_true(sample(text, "kvf_kv_transfer_bytes_total") == 5120);
    assert_true(sample(text, "kvf_prefix_cache_queries_total") == 3);
    assert_true(sample(text, "kvf_prefix_cache_hits_total") == 2);
    assert_true(sample(text, "kvf_prefix_cache_query_tokens_total") == 240);
    assert_true(sample(text, "kvf_prefix_cache_hit_tokens_total") == 80);
    assert_true(sample(text, "kvf_prefix_cache_blocks{node=\"pre-0\",role=\"prefill\"}") == 9);
    check_histogram(text, "kvf_time_to_first_token_seconds", 2);
    /* Every token after a request's first: 3 + 1, and 1. */
    check_histogram(text, "kvf_inter_token_latency_seconds", 5);
    check_histogram(text, "kvf_e2e_request_latency_seconds", 3);
    check_histogram(text, "kvf_kv_transfer_seconds", 2);
    assert_true(fabs(sample(text, "kvf_time_to_first_token_seconds_sum") - 2.05) < 1e-6);
    /* 50 ms lands in the 0.06 bucket, not in 0.04. */
    assert_true(sample(text, "kvf_time_to_first_token_seconds_bucket{le=\"0.04\"}") == 0);
    assert_true(sample(text, "kvf_time_to_first_token_seconds_bucket{le=\"0.06\"}") == 1);
    assert_true(sample(text, "kvf_num_requests_waiting") == 2);
    assert_true(sample(text, "kvf_num_requests_running") == 3);
    assert_true(sample(text, "kvf_kv_blocks_used{node=\"dec\\\"0\",role=\"decode\"}") == 5);
    assert_true(sample(text, "kvf_kv_blocks_total{node=\"dec\\\"0\",role=\"decode\"}") == 20);
    assert_true(sample(text, "kvf_kv_cache_usage_perc{node=\"dec\\\"0\",role=\"decode\"}") == 0.25);
    assert_true(sample(text, "kvf_nodes{role=\"decode\",state=\"live\"}") == 1);
    assert_true(sample(text, "kvf_nodes{role=\"prefill\",state=\"dead\"}") == 1);
    assert_true(sample(text, "kvf_nodes{role=\"prefill\",state=\"live\"}") == 0);
    assert_non_null(strstr(text, "# TYPE kvf_time_to_first_token_seconds histogram\n"));
    free(text);
    kvf_metrics_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_observe_and_render),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
