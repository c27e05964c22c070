/* The multiturn trace of kvf bench serve (bench/serve_multiturn_trace.c):
 * the same seed draws the same trace and another seed another; a turn's
 * prompt is the system prompt, then each earlier user message and answer,
 * then its own message; the ideal prefix hit follows the prefix-cache
 * rules (whole 16-token blocks, 32 tokens left to compute); the turns are
 * clamped to the context. No cluster: the answers are made up here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "serve_multiturn.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static kvf_model_config_t tiny_cfg(void)
{
    kvf_model_config_t cfg;
    assert_int_equal(kvf_model_config_load(KVF_TEST_DATA "/golden/tiny-llama-f32", &cfg), KVF_OK);
    return cfg;
}

static kvf_multiturn_spec_t spec_of(uint64_t seed)
{
    return (kvf_multiturn_spec_t){.seed = seed,
                                  .conversations = 3,
                                  .turns = 3,
                                  .system_tokens = 40,
                                  .user = {5, 20},
                                  .output = {4, 9}};
}

static bool traces_equal(const kvf_multiturn_trace_t *a, const kvf_multiturn_trace_t *b)
{
    if (a->n_system != b->n_system || memcmp(a->system, b->system, a->n_system * 4) != 0)
        return false;
    for (size_t i = 0; i < (size_t)a->n_conv * a->n_turns; i++) {
        const kvf_multiturn_turn_t *x = &a->turns[i], *y = &b->turns[i];
        if (x->n_user != y->n_user || x->max_tokens != y->max_tokens || x->gap != y->gap ||
            memcmp(x->user, y->user, x->n_user * 4) != 0)
            return false;
    }
    return true;
}

/* Same seed, same trace; another seed, another; ids below the vocabulary,
 * never EOS, BOS only first; lengths within their ranges. */
static void test_trace_deterministic(void **state)
{
    (void)state;
    kvf_model_config_t cfg = tiny_cfg();
    kvf_multiturn_spec_t s1 = spec_of(7), s2 = spec_of(8);
    kvf_multiturn_trace_t a, b, c;
    assert_int_equal(kvf_multiturn_trace_init(&a, &s1, &cfg), KVF_OK);
    assert_int_equal(kvf_multiturn_trace_init(&b, &s1, &cfg), KVF_OK);
    assert_int_equal(kvf_multiturn_trace_init(&c, &s2, &cfg), KVF_OK);
    assert_true(traces_equal(&a, &b));
    assert_false(traces_equal(&a, &c));
    assert_int_equal(a.system[0], (uint32_t)cfg.bos_id);
    for (uint32_t k = 1; k < a.n_system; k++) {
        assert_true(a.system[k] < (uint32_t)cfg.vocab);
        assert_false(kvf_model_is_eos(&cfg, a.system[k]));
        assert_int_not_equal(a.system[k], (uint32_t)cfg.bos_id);
    }
    for (uint32_t ci = 0; ci < a.n_conv; ci++) {
        for (uint32_t t = 0; t < a.n_turns; t++) {
            const kvf_multiturn_turn_t *u = kvf_multiturn_trace_turn(&a, ci, t);
            assert_true(u->n_user >= 5 && u->n_user <= 20);
            assert_true(u->max_tokens >= 4 && u->max_tokens <= 9);
            assert_true(u->gap >= 0);
            for (uint32_t k = 0; k < u->n_user; k++) {
                assert_true(u->user[k] < (uint32_t)cfg.vocab);
                assert_false(kvf_model_is_eos(&cfg, u->user[k]));
                assert_int_not_equal(u->user[k], (uint32_t)cfg.bos_id);
            }
        }
    }
    kvf_multiturn_trace_fini(&a);
    kvf_multiturn_trace_fini(&b);
    kvf_multiturn_trace_fini(&c);
}

/* Turn 2 of conversation 1 given made-up answers: system, u0, a0, u1, a1,
 * u2, exactly; the same answers give the same prompt again; turn 0 is
 * system + u0 whatever the answers; a turn past the trace is refused. */
static void test_trace_prompt(void **state)
{
    (void)state;
    kvf_model_config_t cfg = tiny_cfg();
    kvf_multiturn_spec_t s = spec_of(3);
    kvf_multiturn_trace_t t;
    assert_int_equal(kvf_multiturn_trace_init(&t, &s, &cfg), KVF_OK);
    const uint32_t a0[] = {100, 101, 102}, a1[] = {200, 201, 202, 203, 204};
    const uint32_t *answers[] = {a0, a1};
    const uint32_t n_answers[] = {3, 5};
    uint32_t *p, n, *q, m;
    assert_int_equal(kvf_multiturn_trace_prompt(&t, 1, 2, answers, n_answers, &p, &n), KVF_OK);
    const kvf_multiturn_turn_t *u0 = kvf_multiturn_trace_turn(&t, 1, 0),
                               *u1 = kvf_multiturn_trace_turn(&t, 1, 1),
                               *u2 = kvf_multiturn_trace_turn(&t, 1, 2);
    assert_int_equal(n, t.n_system + u0->n_user + 3 + u1->n_user + 5 + u2->n_user);
    uint32_t at = 0;
    assert_memory_equal(p + at, t.system, t.n_system * 4);
    at += t.n_system;
    assert_memory_equal(p + at, u0->user, u0->n_user * 4);
    at += u0->n_user;
    assert_memory_equal(p + at, a0, sizeof(a0));
    at += 3;
    assert_memory_equal(p + at, u1->user, u1->n_user * 4);
    at += u1->n_user;
    assert_memory_equal(p + at, a1, sizeof(a1));
    at += 5;
    assert_memory_equal(p + at, u2->user, u2->n_user * 4);
    /* The same answers again: the same prompt. */
    assert_int_equal(kvf_multiturn_trace_prompt(&t, 1, 2, answers, n_answers, &q, &m), KVF_OK);
    assert_int_equal(m, n);
    assert_memory_equal(q, p, n * 4);
    free(q);
    /* Turn 1's prompt is a prefix of turn 2's: what a cache can reuse. */
    assert_int_equal(kvf_multiturn_trace_prompt(&t, 1, 1, answers, n_answers, &q, &m), KVF_OK);
    assert_int_equal(m, t.n_system + u0->n_user + 3 + u1->n_user);
    assert_memory_equal(q, p, m * 4);
    free(q);
    assert_int_equal(kvf_multiturn_trace_prompt(&t, 1, 0, NULL, NULL, &q, &m), KVF_OK);
    assert_int_equal(m, t.n_system + u0->n_user);
    assert_memory_equal(q, p, m * 4);
    free(q);
    assert_int_equal(kvf_multiturn_trace_prompt(&t, 1, 3, answers, n_answers, &q, &m),
                     KVF_ERR_INVAL);
    assert_int_equal(kvf_multiturn_trace_prompt(&t, 3, 0, answers, n_answers, &q, &m),
                     KVF_ERR_INVAL);
    free(p);
    kvf_multiturn_trace_fini(&t);
}

/* The ideal hit: the longest prefix shared with an earlier prompt, whole
 * blocks only, at most (n - 32) / 16 blocks. */
static void test_ideal_cached(void **state)
{
    (void)state;
    uint32_t a[200], b[200], c[200];
    for (uint32_t i = 0; i < 200; i++)
        a[i] = b[i] = c[i] = i + 1;
    b[47] = 9999; /* b shares 47 tokens with a */
    c[90] = 9999; /* c shares 90 */
    const uint32_t *earlier[] = {b, c};
    const uint32_t n_earlier[] = {200, 200};
    /* No earlier prompt: nothing. */
    assert_int_equal(kvf_multiturn_ideal_cached(a, 200, earlier, n_earlier, 0), 0);
    /* b alone: 47 shared, 2 whole blocks. */
    assert_int_equal(kvf_multiturn_ideal_cached(a, 200, earlier, n_earlier, 1), 32);
    /* The best of b and c: 90 shared, 5 blocks. */
    assert_int_equal(kvf_multiturn_ideal_cached(a, 200, earlier, n_earlier, 2), 80);
    /* A prompt of 104 tokens keeps 32 to compute: at most 4 blocks. */
    assert_int_equal(kvf_multiturn_ideal_cached(a, 104, earlier, n_earlier, 2), 64);
    /* Under 48 tokens not even one block can be reused. */
    assert_int_equal(kvf_multiturn_ideal_cached(a, 47, earlier, n_earlier, 2), 0);
    assert_int_equal(kvf_multiturn_ideal_cached(a, 48, earlier, n_earlier, 2), 16);
    /* An earlier prompt shorter than the shared part: only its length. */
    const uint32_t n_short[] = {20, 40};
    assert_int_equal(kvf_multiturn_ideal_cached(a, 200, earlier, n_short, 2), 32);
}

/* The last of T turns holds system + T users + T - 1 answers and then
 * generates one more answer: all of it below the context. */
static void test_turns_fitting(void **state)
{
    (void)state;
    kvf_multiturn_spec_t s = {.conversations = 1,
                              .turns = 10,
                              .system_tokens = 64,
                              .user = {8, 16},
                              .output = {8, 8}};
    /* 64 + 7 * 24 = 232 < 256; 64 + 8 * 24 = 256 is not. */
    assert_int_equal(kvf_multiturn_turns_fitting(&s, 256), 7);
    s.turns = 4;
    assert_int_equal(kvf_multiturn_turns_fitting(&s, 256), 4);
    s.system_tokens = 240;
    assert_int_equal(kvf_multiturn_turns_fitting(&s, 256), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trace_deterministic),
        cmocka_unit_test(test_trace_prompt),
        cmocka_unit_test(test_ideal_cached),
        cmocka_unit_test(test_turns_fitting),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
