/* router/stream: a request's output placed by position. Chunks that
 * continue the stream are appended, chunks sent before are dropped, a
 * chunk past the end (a lost message) or straddling it is reported and
 * changes nothing, a re-dispatched epoch continues where the client's
 * stream ends, and the client chunk carries exactly the new tokens. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kvf/msg.h"
#include "stream.h"

/* Places a chunk and returns where it fell. */
static kvf_stream_place_t place(kvf_stream_t *s, uint32_t n_generated, const uint32_t *tokens,
                                size_t n)
{
    kvf_stream_place_t where;
    assert_int_equal(kvf_stream_place(s, n_generated, tokens, n, &where), KVF_OK);
    return where;
}

static void expect_ids(const kvf_stream_t *s, const uint32_t *want, uint32_t n)
{
    assert_int_equal(s->n, n);
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(s->ids[i], want[i]);
}

static void test_in_order(void **state)
{
    (void)state;
    kvf_stream_t s;
    kvf_stream_init(&s);
    const uint32_t a[] = {7}, b[] = {8, 9, 10}, want[] = {7, 8, 9, 10};
    assert_int_equal(place(&s, 1, a, 1), KVF_STREAM_NEXT);
    assert_int_equal(place(&s, 4, b, 3), KVF_STREAM_NEXT);
    expect_ids(&s, want, 4);
    /* A finish alone (an EOS is not a token of the output) at the end. */
    assert_int_equal(place(&s, 4, NULL, 0), KVF_STREAM_NEXT);
    expect_ids(&s, want, 4);
    kvf_stream_fini(&s);
}

static void test_resent_dropped(void **state)
{
    (void)state;
    kvf_stream_t s;
    kvf_stream_init(&s);
    const uint32_t a[] = {1, 2, 3}, again[] = {2, 3}, want[] = {1, 2, 3};
    assert_int_equal(place(&s, 3, a, 3), KVF_STREAM_NEXT);
    assert_int_equal(place(&s, 3, again, 2), KVF_STREAM_RESENT);
    assert_int_equal(place(&s, 3, a, 3), KVF_STREAM_RESENT);
    assert_int_equal(place(&s, 2, NULL, 0), KVF_STREAM_RESENT);
    expect_ids(&s, want, 3);
    kvf_stream_fini(&s);
}

static void test_gap_and_overlap_change_nothing(void **state)
{
    (void)state;
    kvf_stream_t s;
    kvf_stream_init(&s);
    const uint32_t a[] = {1, 2}, late[] = {5}, straddle[] = {2, 3, 4}, want[] = {1, 2};
    assert_int_equal(place(&s, 2, a, 2), KVF_STREAM_NEXT);
    /* Position 2 and 3 never came: a message got lost. */
    assert_int_equal(place(&s, 5, late, 1), KVF_STREAM_GAP);
    assert_int_equal(place(&s, 4, NULL, 0), KVF_STREAM_GAP);
    /* Positions 1..3: sent before in part, new in part. */
    assert_int_equal(place(&s, 4, straddle, 3), KVF_STREAM_OVERLAP);
    expect_ids(&s, want, 2);
    kvf_stream_fini(&s);
}

static void test_malformed(void **state)
{
    (void)state;
    kvf_stream_t s;
    kvf_stream_init(&s);
    const uint32_t a[] = {1, 2, 3};
    kvf_stream_place_t where = KVF_STREAM_NEXT;
    assert_int_equal(kvf_stream_place(&s, 2, a, 3, &where), KVF_ERR_INVAL);
    assert_int_equal(s.n, 0);
    kvf_stream_fini(&s);
}

/* After a re-dispatch the new epoch counts from the tokens the client
 * has: its first chunk continues the stream. */
static void test_redispatch_continues(void **state)
{
    (void)state;
    kvf_stream_t s;
    kvf_stream_init(&s);
    const uint32_t e1[] = {10, 11, 12}, e2[] = {13, 14}, want[] = {10, 11, 12, 13, 14};
    assert_int_equal(place(&s, 3, e1, 3), KVF_STREAM_NEXT);
    assert_int_equal(place(&s, 5, e2, 2), KVF_STREAM_NEXT);
    expect_ids(&s, want, 5);
    kvf_stream_fini(&s);
}

/* Growing past the first allocation keeps every token in place. */
static void test_long_stream(void **state)
{
    (void)state;
    kvf_stream_t s;
    kvf_stream_init(&s);
    uint32_t t[3];
    for (uint32_t i = 0; i < 1000; i++) {
        for (uint32_t k = 0; k < 3; k++)
            t[k] = 3 * i + k;
        assert_int_equal(place(&s, 3 * i + 3, t, 3), KVF_STREAM_NEXT);
    }
    assert_int_equal(s.n, 3000);
    for (uint32_t i = 0; i < 3000; i++)
        assert_int_equal(s.ids[i], i);
    kvf_stream_fini(&s);
}

static void test_chunk(void **state)
{
    (void)state;
    kvf_stream_t s;
    kvf_stream_init(&s);
    const uint32_t a[] = {4, 5}, b[] = {6, 7, 8};
    assert_int_equal(place(&s, 2, a, 2), KVF_STREAM_NEXT);
    uint32_t from = s.n;
    assert_int_equal(place(&s, 5, b, 3), KVF_STREAM_NEXT);
    kvf_router_chunk_t c;
    kvf_stream_chunk(&s, from, "abc", 3, KVF__FINISH_REASON__FINISH_NONE, &c);
    assert_int_equal(c.n_tokens, 3);
    assert_int_equal(c.tokens[0], 6);
    assert_int_equal(c.tokens[2], 8);
    assert_string_equal(c.text, "abc");
    assert_int_equal(c.text_len, 3);
    assert_int_equal(c.completion_tokens, 5);
    assert_int_equal(c.finish, KVF__FINISH_REASON__FINISH_NONE);
    assert_int_equal(c.req_id, 0);
    /* A finish with no new tokens: text (a flushed tail) and no tokens. */
    kvf_stream_chunk(&s, s.n, "z", 1, KVF__FINISH_REASON__FINISH_STOP, &c);
    assert_int_equal(c.n_tokens, 0);
    assert_null(c.tokens);
    assert_string_equal(c.text, "z");
    assert_int_equal(c.finish, KVF__FINISH_REASON__FINISH_STOP);
    kvf_stream_fini(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_in_order),
        cmocka_unit_test(test_resent_dropped),
        cmocka_unit_test(test_gap_and_overlap_change_nothing),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_redispatch_continues),
        cmocka_unit_test(test_long_stream),
        cmocka_unit_test(test_chunk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
