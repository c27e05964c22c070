/* kvf_textstream: text handed out token by token equals the whole
 * decode cut before the first stop string; no part of a stop string is
 * ever handed out; a stream rebuilt by replay continues exactly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvf/textstream.h"
#include "kvf/tokenizer.h"

#define TOK_DIR KVF_TEST_DATA "/golden/tiny-llama-f32"

static kvf_tokenizer_t *tok;

static int setup(void **state)
{
    (void)state;
    return kvf_tokenizer_load(TOK_DIR, &tok) == KVF_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    kvf_tokenizer_destroy(tok);
    return 0;
}

static uint32_t *encode(const char *text, size_t *n_p)
{
    uint32_t *ids = NULL;
    assert_int_equal(kvf_tokenizer_encode(tok, text, strlen(text), false, &ids, n_p), KVF_OK);
    return ids;
}

/* What the client must see: the whole decode, cut before the first stop. */
static char *expected_text(const uint32_t *ids, size_t n, const char *const *stops,
                           size_t n_stop, bool *stopped_p)
{
    char *all = NULL;
    size_t len = 0;
    assert_int_equal(kvf_tokenizer_decode(tok, ids, n, &all, &len), KVF_OK);
    size_t cut = len;
    for (size_t i = 0; i < n_stop; i++) {
        const char *hit = strstr(all, stops[i]);
        if (hit && (size_t)(hit - all) < cut)
            cut = (size_t)(hit - all);
    }
    all[cut] = '\0';
    *stopped_p = cut < len;
    return all;
}

typedef struct {
    char buf[4096];
    size_t len;
} text_t;

static void append(text_t *t, const char *s, size_t n)
{
    assert_true(t->len + n < sizeof(t->buf));
    memcpy(t->buf + t->len, s, n);
    t->len += n;
    t->buf[t->len] = '\0';
}

/* Streams ids[from..n) through ts into out; returns whether it stopped. */
static bool stream(kvf_textstream_t *ts, const uint32_t *ids, size_t from, size_t n, text_t *out,
                   const char *const *stops, size_t n_stop)
{
    for (size_t i = from; i < n; i++) {
        const char *text;
        size_t len;
        bool stopped;
        assert_int_equal(kvf_textstream_push(ts, ids[i], &text, &len, &stopped), KVF_OK);
        assert_int_equal(strlen(text), len);
        append(out, text, len);
        for (size_t s = 0; s < n_stop; s++)
            assert_null(strstr(out->buf, stops[s]));
        if (stopped)
            return true;
    }
    const char *tail;
    size_t tail_len;
    assert_int_equal(kvf_textstream_finish(ts, &tail, &tail_len), KVF_OK);
    append(out, tail, tail_len);
    return false;
}

static void check_case(const char *text, const char *const *stops, size_t n_stop)
{
    size_t n;
    uint32_t *ids = encode(text, &n);
    bool want_stop;
    char *want = expected_text(ids, n, stops, n_stop, &want_stop);

    /* In one go. */
    kvf_textstream_t *ts;
    assert_int_equal(kvf_textstream_create(tok, stops, n_stop, &ts), KVF_OK);
    text_t got = {.len = 0};
    assert_int_equal(stream(ts, ids, 0, n, &got, stops, n_stop), want_stop);
    assert_string_equal(got.buf, want);
    assert_int_equal(kvf_textstream_stopped(ts), want_stop);
    kvf_textstream_destroy(ts);

    /* Re-dispatched after k tokens: the first stream's text up to k, then
     * a replayed stream's, make the same text. */
    for (size_t k = 1; k < n; k++) {
        kvf_textstream_t *a, *b;
        assert_int_equal(kvf_textstream_create(tok, stops, n_stop, &a), KVF_OK);
        text_t part = {.len = 0};
        bool stopped = false;
        for (size_t i = 0; i < k && !stopped; i++) {
            const char *t;
            size_t l;
            assert_int_equal(kvf_textstream_push(a, ids[i], &t, &l, &stopped), KVF_OK);
            append(&part, t, l);
        }
        kvf_textstream_destroy(a);
        if (stopped)
            break; /* the request would have ended here */
        assert_int_equal(kvf_textstream_create(tok, stops, n_stop, &b), KVF_OK);
        assert_int_equal(kvf_textstream_replay(b, ids, k), KVF_OK);
        stream(b, ids, k, n, &part, stops, n_stop);
        assert_string_equal(part.buf, want);
        kvf_textstream_destroy(b);
    }
    free(want);
    free(ids);
}

static void test_no_stops_is_the_decode(void **state)
{
    (void)state;
    check_case("Hello world, this is a test of streaming text.", NULL, 0);
}

static void test_stop_spanning_tokens(void **state)
{
    (void)state;
    const char *stops[] = {"is a te"};
    check_case("Hello world, this is a test of streaming text.", stops, 1);
}

static void test_earliest_of_several(void **state)
{
    (void)state;
    const char *stops[] = {"streaming", "world,", "zzz"};
    check_case("Hello world, this is a test of streaming text.", stops, 3);
}

static void test_prefix_that_does_not_complete(void **state)
{
    (void)state;
    /* "test of" begins like the stop but never completes it: the held
     * text must come out. */
    const char *stops[] = {"test of nothing"};
    check_case("Hello world, this is a test of streaming text.", stops, 1);
}

static void test_multibyte(void **state)
{
    (void)state;
    const char *stops[] = {"\xc3\xa9t\xc3\xa9"};
    check_case("caf\xc3\xa9 en \xc3\xa9t\xc3\xa9 \xe2\x82\xac 5", stops, 1);
    check_case("caf\xc3\xa9 en hiver \xe2\x82\xac 5", stops, 1);
}

static void test_push_after_stop_and_bad_stops(void **state)
{
    (void)state;
    size_t n;
    uint32_t *ids = encode("one two three four", &n);
    const char *stops[] = {"two"};
    kvf_textstream_t *ts;
    assert_int_equal(kvf_textstream_create(tok, stops, 1, &ts), KVF_OK);
    bool stopped = false;
    size_t i = 0;
    while (!stopped) {
        assert_true(i < n);
        const char *t;
        size_t l;
        assert_int_equal(kvf_textstream_push(ts, ids[i++], &t, &l, &stopped), KVF_OK);
    }
    const char *t;
    size_t l;
    assert_int_equal(kvf_textstream_push(ts, ids[0], &t, &l, &stopped), KVF_ERR_CLOSED);
    assert_int_equal(kvf_textstream_finish(ts, &t, &l), KVF_OK);
    assert_int_equal(l, 0);
    kvf_textstream_destroy(ts);

    const char *empty[] = {""};
    assert_int_equal(kvf_textstream_create(tok, empty, 1, &ts), KVF_ERR_INVAL);
    free(ids);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_stops_is_the_decode),
        cmocka_unit_test(test_stop_spanning_tokens),
        cmocka_unit_test(test_earliest_of_several),
        cmocka_unit_test(test_prefix_that_does_not_complete),
        cmocka_unit_test(test_multibyte),
        cmocka_unit_test(test_push_after_stop_and_bad_stops),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
