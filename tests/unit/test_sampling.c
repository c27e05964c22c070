/* Sampling tests: greedy ties, determinism by seed, state save/restore,
 * top-k / top-p support, and that temperature sampling follows the
 * distribution. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kvf/sampling.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define V 50

static void make_logits(float *l)
{
    for (int i = 0; i < V; i++)
        l[i] = (float)sin(i * 1.7) * 3.0f;
}

static void test_argmax(void **state)
{
    (void)state;
    float l[5] = {1, 3, 3, -1, 2};
    assert_int_equal(kvf_sample_argmax(l, 5), 1);
    float n[3] = {NAN, 0.5f, 0.5f};
    assert_int_equal(kvf_sample_argmax(n, 3), 1);
    kvf_sampling_params_t p = kvf_sampling_defaults();
    kvf_sampler_t s;
    assert_int_equal(kvf_sampler_init(&s, &p, 5), KVF_OK);
    uint64_t before = kvf_sampler_state(&s);
    assert_int_equal(kvf_sampler_sample(&s, l), 1);
    assert_int_equal(kvf_sampler_state(&s), before); /* greedy draws nothing */
    kvf_sampler_fini(&s);
}

static void test_seed_and_state(void **state)
{
    (void)state;
    float l[V];
    make_logits(l);
    kvf_sampling_params_t p = {.temperature = 1.0f, .top_k = 0, .top_p = 0.95f, .seed = 42};
    kvf_sampler_t a, b, c;
    assert_int_equal(kvf_sampler_init(&a, &p, V), KVF_OK);
    assert_int_equal(kvf_sampler_init(&b, &p, V), KVF_OK);
    uint32_t seq_a[64], seq_b[64];
    for (int i = 0; i < 64; i++) {
        seq_a[i] = kvf_sampler_sample(&a, l);
        seq_b[i] = kvf_sampler_sample(&b, l);
    }
    assert_memory_equal(seq_a, seq_b, sizeof(seq_a));
    int distinct = 0;
    for (int i = 1; i < 64; i++)
        distinct += seq_a[i] != seq_a[0];
    assert_true(distinct > 0);
    /* restore the state after 20 draws into another sampler: same tail */
    kvf_sampler_t r;
    assert_int_equal(kvf_sampler_init(&r, &p, V), KVF_OK);
    for (int i = 0; i < 20; i++)
        (void)kvf_sampler_sample(&r, l);
    uint64_t st = kvf_sampler_state(&r);
    p.seed = 7;
    assert_int_equal(kvf_sampler_init(&c, &p, V), KVF_OK);
    kvf_sampler_set_state(&c, st);
    for (int i = 20; i < 64; i++)
        assert_int_equal(kvf_sampler_sample(&c, l), seq_a[i]);
    kvf_sampler_fini(&a);
    kvf_sampler_fini(&b);
    kvf_sampler_fini(&c);
    kvf_sampler_fini(&r);
}

static void test_top_k_top_p(void **state)
{
    (void)state;
    float l[V];
    make_logits(l);
    /* the 3 largest */
    int order[V];
    for (int i = 0; i < V; i++)
        order[i] = i;
    for (int i = 0; i < V; i++)
        for (int j = i + 1; j < V; j++)
            if (l[order[j]] > l[order[i]]) {
                int t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
    kvf_sampling_params_t p = {.temperature = 5.0f, .top_k = 3, .top_p = 1.0f, .seed = 1};
    kvf_sampler_t s;
    assert_int_equal(kvf_sampler_init(&s, &p, V), KVF_OK);
    int seen[V] = {0};
    for (int i = 0; i < 2000; i++)
        seen[kvf_sampler_sample(&s, l)]++;
    for (int i = 0; i < V; i++) {
        bool top3 = i == order[0] || i == order[1] || i == order[2];
        if (top3)
            assert_true(seen[i] > 0);
        else
            assert_int_equal(seen[i], 0);
    }
    kvf_sampler_fini(&s);
    /* top_p tiny: only the most likely survives */
    p.top_k = 0;
    p.top_p = 1e-6f;
    assert_int_equal(kvf_sampler_init(&s, &p, V), KVF_OK);
    for (int i = 0; i < 100; i++)
        assert_int_equal(kvf_sampler_sample(&s, l), order[0]);
    kvf_sampler_fini(&s);
    p.top_p = 0;
    assert_int_equal(kvf_sampling_validate(&p), KVF_ERR_INVAL);
    p.top_p = 1;
    p.temperature = -1;
    assert_int_equal(kvf_sampler_init(&s, &p, V), KVF_ERR_INVAL);
}

/* At temperature 1 the frequencies follow softmax(logits). */
static void test_distribution(void **state)
{
    (void)state;
    float l[4] = {0.0f, 1.0f, 2.0f, -1.0f};
    double z = 0, prob[4];
    for (int i = 0; i < 4; i++)
        z += exp(l[i]);
    for (int i = 0; i < 4; i++)
        prob[i] = exp(l[i]) / z;
    kvf_sampling_params_t p = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 3};
    kvf_sampler_t s;
    assert_int_equal(kvf_sampler_init(&s, &p, 4), KVF_OK);
    int count[4] = {0};
    const int n = 40000;
    for (int i = 0; i < n; i++)
        count[kvf_sampler_sample(&s, l)]++;
    for (int i = 0; i < 4; i++)
        assert_true(fabs((double)count[i] / n - prob[i]) < 0.01);
    kvf_sampler_fini(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_seed_and_state),
        cmocka_unit_test(test_top_k_top_p),
        cmocka_unit_test(test_distribution),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
