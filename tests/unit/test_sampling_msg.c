/* kvf_sampling_msg: the one check, completion and conversion of the
 * sampling message that the router and both nodes share. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kvf/sampling_msg.h"

#define VOCAB 100

static void test_check_ranges(void **state)
{
    (void)state;
    char why[128];
    Kvf__Sampling s = KVF__SAMPLING__INIT;
    assert_int_equal(kvf_sampling_msg_check(&s, VOCAB, why, sizeof(why)), KVF_OK);
    s.temperature = -0.5f;
    assert_int_equal(kvf_sampling_msg_check(&s, VOCAB, why, sizeof(why)), KVF_ERR_INVAL);
    assert_non_null(strstr(why, "temperature"));
    s.temperature = 0.7f;
    s.top_p = 1.5f;
    assert_int_equal(kvf_sampling_msg_check(&s, VOCAB, why, sizeof(why)), KVF_ERR_INVAL);
    s.top_p = 0.9f;
    s.top_k = VOCAB + 1;
    assert_int_equal(kvf_sampling_msg_check(&s, VOCAB, why, sizeof(why)), KVF_ERR_INVAL);
    s.top_k = VOCAB;
    assert_int_equal(kvf_sampling_msg_check(&s, VOCAB, why, sizeof(why)), KVF_OK);
    char *stops[] = {"ok", ""};
    s.stop = stops;
    s.n_stop = 2;
    assert_int_equal(kvf_sampling_msg_check(&s, VOCAB, why, sizeof(why)), KVF_ERR_INVAL);
    s.n_stop = 1;
    assert_int_equal(kvf_sampling_msg_check(&s, VOCAB, why, sizeof(why)), KVF_OK);
    assert_int_equal(kvf_sampling_msg_check(NULL, VOCAB, why, sizeof(why)), KVF_ERR_INVAL);
}

static void test_complete_and_params(void **state)
{
    (void)state;
    Kvf__Sampling s = KVF__SAMPLING__INIT;
    kvf_sampling_msg_complete(&s, 256, 100, 42);
    assert_int_equal(s.max_tokens, 100); /* default, clamped to the room */
    assert_true(s.has_seed);
    assert_int_equal(s.seed, 42);
    s.seed = 7;
    kvf_sampling_msg_complete(&s, 256, 100, 42);
    assert_int_equal(s.seed, 7); /* a seed stays */
    assert_int_equal(kvf_sampling_msg_remaining(&s, 30), 70);
    assert_int_equal(kvf_sampling_msg_remaining(&s, 130), 0);

    kvf_sampling_params_t p;
    s.top_p = 0;
    s.top_k = VOCAB;
    s.temperature = 0.8f;
    assert_int_equal(kvf_sampling_msg_params(&s, VOCAB, &p), KVF_OK);
    assert_true(p.top_p == 1.0f); /* 0: off */
    assert_int_equal(p.top_k, 0); /* the whole vocabulary: off */
    assert_int_equal(p.seed, 7);
    s.temperature = NAN;
    p.seed = 99;
    assert_int_equal(kvf_sampling_msg_params(&s, VOCAB, &p), KVF_ERR_INVAL);
    assert_int_equal(p.seed, 99); /* untouched on failure */
}

static void test_copy(void **state)
{
    (void)state;
    char *stops[] = {"</s>", "\n\n"};
    Kvf__Sampling s = KVF__SAMPLING__INIT;
    s.temperature = 0.5f;
    s.max_tokens = 12;
    s.stop = stops;
    s.n_stop = 2;
    Kvf__Sampling *c = NULL;
    assert_int_equal(kvf_sampling_msg_copy(&s, &c), KVF_OK);
    assert_true(c->temperature == 0.5f);
    assert_int_equal(c->max_tokens, 12);
    assert_int_equal(c->n_stop, 2);
    assert_string_equal(c->stop[1], "\n\n");
    assert_ptr_not_equal(c->stop[0], stops[0]);
    kvf_sampling_msg_free(c);
    kvf_sampling_msg_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check_ranges),
        cmocka_unit_test(test_complete_and_params),
        cmocka_unit_test(test_copy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
