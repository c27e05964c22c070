/* kvf_textstream: text handed out token by token equals the whole
 * decode cut before the first stop string; no part of a stop string is
 * ever handed out; a stream rebuilt by replay continues exactly; text
 * holding U+0000 (byte-fallback tokens) is handed out whole, and stop
 * strings are found past it. Texts are compared as bytes. */
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

static uint32_t *encode(const char *text, size_t len, size_t *n_p)
{
    uint32_t *ids = NULL;
    assert_int_equal(kvf_tokenizer_encode(tok, text, len, false, &ids, n_p), KVF_OK);
    return ids;
}

/* Where stop occurs first in s[0..len), or NULL. */
static const char *find(const char *s, size_t len, const char *stop)
{
    return memmem(s, len, stop, strlen(stop));
}

/* What the client must see: the whole decode, cut before the first stop
 * (*len_p bytes). */
static char *expected_text(const uint32_t *ids, size_t n, const char *const *stops, size_t n_stop,
                           size_t *len_p, bool *stopped_p)
{
    char *all = NULL;
    size_t len = 0;
    assert_int_equal(kvf_tokenizer_decode(tok, ids, n, &all, &len), KVF_OK);
    size_t cut = len;
    for (size_t i = 0; i < n_stop; i++) {
        const char *hit = find(all, len, stops[i]);
        if (hit && (size_t)(hit - all) < cut)
            cut = (size_t)(hit - all);
    }
    all[cut] = '\0';
    *len_p = cut;
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
        assert_int_equal(text[len], '\0');
        append(out, text, len);
        for (size_t s = 0; s < n_stop; s++)
            assert_null(find(out->buf, out->len, stops[s]));
        if (stopped)
            return true;
    }
    const char *tail;
    size_t tail_len;
    assert_int_equal(kvf_textstream_finish(ts, &tail, &tail_len), KVF_OK);
    append(out, tail, tail_len);
    return false;
}

/* The text (len bytes) encoded, then streamed in one go and re-dispatched
 * after every token: both give expected_text(). */
static void check_bytes(const char *text, size_t len, const char *const *stops, size_t n_stop)
{
    size_t n, want_len;
    uint32_t *ids = encode(text, len, &n);
    bool want_stop;
    char *want = expected_text(ids, n, stops, n_stop, &want_len, &want_stop);

    /* In one go. */
    kvf_textstream_t *ts;
    assert_int_equal(kvf_textstream_create(tok, stops, n_stop, &ts), KVF_OK);
    text_t got = {.len = 0};
    assert_int_equal(stream(ts, ids, 0, n, &got, stops, n_stop), want_stop);
    assert_int_equal(got.len, want_len);
    assert_memory_equal(got.buf, want, want_len);
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
        assert_int_equal(part.len, want_len);
        assert_memory_equal(part.buf, want, want_len);
        kvf_textstream_destroy(b);
    }
    free(want);
    free(ids);
}

static void check_case(const char *text, const char *const *stops, size_t n_stop)
{
    check_bytes(text, strlen(text), stops, n_stop);
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

/* U+0000 is text like any other: handed out whole (the text after it
 * too), never taken for the end of the text, and stop strings are found
 * after it, or right after it. */
static void test_nul_in_text(void **state)
{
    (void)state;
    static const char text[] = "x\0y\0\0 stop here\0zz caf\xc3\xa9\0";
    size_t len = sizeof(text) - 1, n;
    uint32_t *ids = encode(text, len, &n);
    char *back = NULL;
    size_t back_len = 0;
    assert_int_equal(kvf_tokenizer_decode(tok, ids, n, &back, &back_len), KVF_OK);
    assert_int_equal(back_len, len); /* the tokens stand for the NULs */
    assert_memory_equal(back, text, len);
    free(back);
    free(ids);
    check_bytes(text, len, NULL, 0);
    const char *stops[] = {"here", "never"};
    check_bytes(text, len, stops, 2);
    const char *after_nul[] = {"zz"};
    check_bytes(text, len, after_nul, 1);
    const char *begins_before_nul[] = {"y "}; /* "y" then U+0000: held, then let go */
    check_bytes(text, len, begins_before_nul, 1);
}

static void test_push_after_stop_and_bad_stops(void **state)
{
    (void)state;
    size_t n;
    uint32_t *ids = encode("one two three four", 18, &n);
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
        cmocka_unit_test(test_nul_in_text),
        cmocka_unit_test(test_push_after_stop_and_bad_stops),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
