/* Decoders (tokenizer.json "decoder"): each chain on a small hand-written
 * file (tests/data/decoders/<chain>/tokenizer.json) against the text the
 * JavaScript port of Hugging Face's tokenizers gives, and the streaming
 * decoder against the whole-sequence decode on random id sequences. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kvf/log.h"
#include "kvf/tokenizer.h"
#include "kvf/utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEC_DIR KVF_TEST_DATA "/decoders"

/* The files' ids: 0 <unk>, 1 <s>, 2 </s> (added), 3 + b the byte token
 * <0xbb>, 259 ▁Hello, 260 ▁world, 261 ▁, 262 !, 263 ▁▁, 264 x▁y, 265 " a",
 * 266 "b ", 267 "  ", 268 hi, 269 ▁café, 270 é, 271 <0x4g>, 272 <0x41,
 * 273 <turn> (added). */
#define BYTE(b)  (3u + (b))
#define N_FILE_IDS 274u

typedef struct {
    uint32_t ids[8];
    size_t n;
    const char *text;
    size_t len;
} dec_case_t;

/* Expected texts: @huggingface/tokenizers 0.2.0,
 * new Tokenizer(json, {}).decode(ids, {skip_special_tokens: false,
 * clean_up_tokenization_spaces: false}), recorded as bytes. */
static const dec_case_t LLAMA2_CASES[] = {
    {{259, 260, 262}, 3, "Hello world!", 12},
    {{1, 259, 260}, 3, "<s> Hello world", 15},
    {{243, 162, 145, 140}, 4, "\xf0\x9f\x8e\x89", 4},
    {{35, 259}, 2, " Hello", 6},
    {{229, 133, 259, 175}, 4, "\xef\xbf\xbd Hello\xef\xbf\xbd", 12},
    {{229, 133, 175, 131}, 4, "\xe2\x82\xac\xef\xbf\xbd", 6},
    {{261, 263, 264}, 3, "  x y", 5},
    {{267, 265, 266, 268}, 4, "  ab hi", 7},
    {{272, 270, 269}, 3, "<0x41\xc3\xa9 caf\xc3\xa9", 13},
    {{273, 259, 2}, 3, "<turn> Hello</s>", 16},
    {{0, 259}, 2, "<unk> Hello", 11},
    {{3}, 1, "\x00", 1},
    {{263, 259}, 2, "  Hello", 7},
    {{200, 259, 201, 202}, 4, "\xef\xbf\xbd Hello\xef\xbf\xbd\xef\xbf\xbd", 15},
    {{35, 35, 267, 35}, 4, "    ", 4},
};

static const dec_case_t GEMMA_CASES[] = {
    {{259, 260, 262}, 3, " Hello world!", 13},
    {{1, 259, 260}, 3, "<s> Hello world", 15},
    {{243, 162, 145, 140}, 4, "\xf0\x9f\x8e\x89", 4},
    {{35, 259}, 2, "  Hello", 7},
    {{229, 133, 259, 175}, 4, "\xef\xbf\xbd Hello\xef\xbf\xbd", 12},
    {{229, 133, 175, 131}, 4, "\xe2\x82\xac\xef\xbf\xbd", 6},
    {{261, 263, 264}, 3, "   x y", 6},
    {{267, 265, 266, 268}, 4, "   ab hi", 8},
    {{272, 270, 269}, 3, "<0x41\xc3\xa9 caf\xc3\xa9", 13},
    {{273, 259, 2}, 3, "<turn> Hello</s>", 16},
    {{0, 259}, 2, "<unk> Hello", 11},
    {{3}, 1, "\x00", 1},
    {{263, 259}, 2, "   Hello", 8},
    {{200, 259, 201, 202}, 4, "\xef\xbf\xbd Hello\xef\xbf\xbd\xef\xbf\xbd", 15},
    {{35, 35, 267, 35}, 4, "     ", 5},
};

static const dec_case_t METASPACE_CASES[] = {
    {{259, 260, 262}, 3, "Hello world!", 12},
    {{1, 259, 260}, 3, "<s> Hello world", 15},
    {{243, 162, 145, 140}, 4, "<0xF0><0x9F><0x8E><0x89>", 24},
    {{35, 259}, 2, "<0x20> Hello", 12},
    {{229, 133, 259, 175}, 4, "<0xE2><0x82> Hello<0xAC>", 24},
    {{229, 133, 175, 131}, 4, "<0xE2><0x82><0xAC><0x80>", 24},
    {{261, 263, 264}, 3, "  x y", 5},
    {{267, 265, 266, 268}, 4, "  ab hi", 7},
    {{272, 270, 269}, 3, "<0x41\xc3\xa9 caf\xc3\xa9", 13},
    {{273, 259, 2}, 3, "<turn> Hello</s>", 16},
    {{0, 259}, 2, "<unk> Hello", 11},
    {{3}, 1, "<0x00>", 6},
    {{263, 259}, 2, "  Hello", 7},
    {{200, 259, 201, 202}, 4, "<0xC5> Hello<0xC6><0xC7>", 24},
    {{35, 35, 267, 35}, 4, "<0x20><0x20>  <0x20>", 20},
};

static const dec_case_t FALLBACK_METASPACE_CASES[] = {
    {{259, 260, 262}, 3, "Hello world!", 12},
    {{1, 259, 260}, 3, "<s> Hello world", 15},
    {{243, 162, 145, 140}, 4, "\xf0\x9f\x8e\x89", 4},
    {{35, 259}, 2, " Hello", 6},
    {{229, 133, 259, 175}, 4, "\xef\xbf\xbd Hello\xef\xbf\xbd", 12},
    {{229, 133, 175, 131}, 4, "\xe2\x82\xac\xef\xbf\xbd", 6},
    {{261, 263, 264}, 3, "  x y", 5},
    {{267, 265, 266, 268}, 4, "  ab hi", 7},
    {{272, 270, 269}, 3, "<0x41\xc3\xa9 caf\xc3\xa9", 13},
    {{273, 259, 2}, 3, "<turn> Hello</s>", 16},
    {{0, 259}, 2, "<unk> Hello", 11},
    {{3}, 1, "\x00", 1},
    {{263, 259}, 2, "  Hello", 7},
    {{200, 259, 201, 202}, 4, "\xef\xbf\xbd Hello\xef\xbf\xbd\xef\xbf\xbd", 15},
    {{35, 35, 267, 35}, 4, "    ", 4},
};

static const dec_case_t REPLACE_REGEX_STRIP_CASES[] = {
    {{259, 260, 262}, 3, "_Hello_world!", 13},
    {{1, 259, 260}, 3, "<s>_Hello_world", 15},
    {{243, 162, 145, 140}, 4, "<0xF0><0x9F><0x8E><0x89>", 24},
    {{35, 259}, 2, "<0x20>_Hello", 12},
    {{229, 133, 259, 175}, 4, "<0xE2><0x82>_Hello<0xAC>", 24},
    {{229, 133, 175, 131}, 4, "<0xE2><0x82><0xAC><0x80>", 24},
    {{261, 263, 264}, 3, "__x_y", 5},
    {{267, 265, 266, 268}, 4, " ab hi", 6},
    {{272, 270, 269}, 3, "<0x41\xc3\xa9_caf\xc3\xa9", 13},
    {{273, 259, 2}, 3, "<turn>_Hello</s>", 16},
    {{0, 259}, 2, "<unk>_Hello", 11},
    {{3}, 1, "<0x00>", 6},
    {{263, 259}, 2, "__Hello", 7},
    {{200, 259, 201, 202}, 4, "<0xC5>_Hello<0xC6><0xC7>", 24},
    {{35, 35, 267, 35}, 4, "<0x20><0x20>  <0x20>", 20},
};

static const dec_case_t STRIP_EACH_CASES[] = {
    {{259, 260, 262}, 3, "Helloworld!", 11},
    {{1, 259, 260}, 3, "<s>Helloworld", 13},
    {{243, 162, 145, 140}, 4, "<0xF0><0x9F><0x8E><0x89>", 24},
    {{35, 259}, 2, "<0x20>Hello", 11},
    {{229, 133, 259, 175}, 4, "<0xE2><0x82>Hello<0xAC>", 23},
    {{229, 133, 175, 131}, 4, "<0xE2><0x82><0xAC><0x80>", 24},
    {{261, 263, 264}, 3, "x y", 3},
    {{267, 265, 266, 268}, 4, "abhi", 4},
    {{272, 270, 269}, 3, "<0x41\xc3\xa9""caf\xc3\xa9", 12},
    {{273, 259, 2}, 3, "<turn>Hello</s>", 15},
    {{0, 259}, 2, "<unk>Hello", 10},
    {{3}, 1, "<0x00>", 6},
    {{263, 259}, 2, "Hello", 5},
    {{200, 259, 201, 202}, 4, "<0xC5>Hello<0xC6><0xC7>", 23},
    {{35, 35, 267, 35}, 4, "<0x20><0x20><0x20>", 18},
};

static const dec_case_t NONE_CASES[] = {
    {{259, 260, 262}, 3, "\xe2\x96\x81Hello \xe2\x96\x81world !", 19},
    {{1, 259, 260}, 3, "<s> \xe2\x96\x81Hello \xe2\x96\x81world", 21},
    {{243, 162, 145, 140}, 4, "<0xF0> <0x9F> <0x8E> <0x89>", 27},
    {{35, 259}, 2, "<0x20> \xe2\x96\x81Hello", 15},
    {{229, 133, 259, 175}, 4, "<0xE2> <0x82> \xe2\x96\x81Hello <0xAC>", 29},
    {{229, 133, 175, 131}, 4, "<0xE2> <0x82> <0xAC> <0x80>", 27},
    {{261, 263, 264}, 3, "\xe2\x96\x81 \xe2\x96\x81\xe2\x96\x81 x\xe2\x96\x81y", 16},
    {{267, 265, 266, 268}, 4, "    a b  hi", 11},
    {{272, 270, 269}, 3, "<0x41 \xc3\xa9 \xe2\x96\x81""caf\xc3\xa9", 17},
    {{273, 259, 2}, 3, "<turn> \xe2\x96\x81Hello </s>", 20},
    {{0, 259}, 2, "<unk> \xe2\x96\x81Hello", 14},
    {{3}, 1, "<0x00>", 6},
    {{263, 259}, 2, "\xe2\x96\x81\xe2\x96\x81 \xe2\x96\x81Hello", 15},
    {{200, 259, 201, 202}, 4, "<0xC5> \xe2\x96\x81Hello <0xC6> <0xC7>", 29},
    {{35, 35, 267, 35}, 4, "<0x20> <0x20>    <0x20>", 23},
};

static kvf_tokenizer_t *load(const char *name)
{
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/%s", DEC_DIR, name);
    kvf_tokenizer_t *tok = NULL;
    assert_int_equal(kvf_tokenizer_load(dir, &tok), KVF_OK);
    return tok;
}

/* Streams ids one push each: every chunk is whole UTF-8, and the chunks
 * and the flush add up to the whole decode. */
static void check_stream(kvf_detok_t *detok, const kvf_tokenizer_t *tok, const uint32_t *ids,
                         size_t n)
{
    char *whole;
    size_t whole_len;
    assert_int_equal(kvf_tokenizer_decode(tok, ids, n, &whole, &whole_len), KVF_OK);
    char *joined = malloc(whole_len + 1);
    assert_non_null(joined);
    size_t at = 0;
    for (size_t i = 0; i <= n; i++) {
        const char *chunk;
        size_t len;
        if (i < n)
            assert_int_equal(kvf_detok_push(detok, ids[i], &chunk, &len), KVF_OK);
        else
            assert_int_equal(kvf_detok_flush(detok, &chunk, &len), KVF_OK);
        assert_int_equal(kvf_utf8_valid_prefix((const uint8_t *)chunk, len), len);
        /* handed out means final: it must be what the whole decode has there */
        assert_true(at + len <= whole_len);
        assert_memory_equal(chunk, whole + at, len);
        memcpy(joined + at, chunk, len);
        at += len;
    }
    assert_int_equal(at, whole_len);
    free(joined);
    free(whole);
}

static void check_cases(const char *name, const dec_case_t *cases, size_t n_cases)
{
    kvf_tokenizer_t *tok = load(name);
    kvf_detok_t detok;
    kvf_detok_init(&detok, tok);
    for (size_t c = 0; c < n_cases; c++) {
        char *text;
        size_t len;
        assert_int_equal(kvf_tokenizer_decode(tok, cases[c].ids, cases[c].n, &text, &len), KVF_OK);
        if (len != cases[c].len || memcmp(text, cases[c].text, len))
            fail_msg("%s case %zu: got '%s', want '%s'", name, c, text, cases[c].text);
        free(text);
        check_stream(&detok, tok, cases[c].ids, cases[c].n);
    }
    kvf_detok_fini(&detok);
    kvf_tokenizer_destroy(tok);
}

#define CHECK_CASES(name, cases) check_cases(name, cases, sizeof(cases) / sizeof(cases[0]))

static void test_llama2_chain(void **state)
{
    (void)state;
    CHECK_CASES("llama2", LLAMA2_CASES);
}

static void test_gemma_chain(void **state)
{
    (void)state;
    CHECK_CASES("gemma", GEMMA_CASES);
}

static void test_metaspace(void **state)
{
    (void)state;
    CHECK_CASES("metaspace", METASPACE_CASES);
    CHECK_CASES("fallback_metaspace", FALLBACK_METASPACE_CASES);
}

static void test_replace_strip(void **state)
{
    (void)state;
    CHECK_CASES("replace_regex_strip", REPLACE_REGEX_STRIP_CASES);
    CHECK_CASES("strip_each", STRIP_EACH_CASES);
}

static void test_no_decoder(void **state)
{
    (void)state;
    CHECK_CASES("none", NONE_CASES);
}

/* A byte token needs exactly two hex digits, as in Hugging Face's Rust
 * tokenizers (the JavaScript port's parseInt would read "<0x4g>" as 0x04);
 * an id the tokenizer does not know decodes to nothing. */
static void test_byte_token_form(void **state)
{
    (void)state;
    kvf_tokenizer_t *tok = load("llama2");
    const uint32_t ids[] = {271, 100000, BYTE(0x41)};
    char *text;
    size_t len;
    assert_int_equal(kvf_tokenizer_decode(tok, ids, 3, &text, &len), KVF_OK);
    assert_string_equal(text, "<0x4g>A");
    free(text);
    kvf_tokenizer_destroy(tok);
}

/* A 4-byte emoji as four byte tokens, one per push: nothing until the
 * last, then the emoji whole; the leading space of the first token goes. */
static void test_split_emoji(void **state)
{
    (void)state;
    kvf_tokenizer_t *tok = load("llama2");
    kvf_detok_t detok;
    kvf_detok_init(&detok, tok);
    const uint32_t ids[] = {259, BYTE(0xf0), BYTE(0x9f), BYTE(0x8e), BYTE(0x89), 262};
    const char *want[] = {"Hello", "", "", "", "\xf0\x9f\x8e\x89", "!"};
    for (int round = 0; round < 2; round++) { /* a flushed decoder starts afresh */
        for (size_t i = 0; i < 6; i++) {
            const char *chunk;
            size_t len;
            assert_int_equal(kvf_detok_push(&detok, ids[i], &chunk, &len), KVF_OK);
            assert_int_equal(len, strlen(want[i]));
            assert_memory_equal(chunk, want[i], len);
        }
        const char *chunk;
        size_t len;
        assert_int_equal(kvf_detok_flush(&detok, &chunk, &len), KVF_OK);
        assert_int_equal(len, 0);
    }
    kvf_detok_fini(&detok);
    kvf_tokenizer_destroy(tok);
}

static void test_refused(void **state)
{
    (void)state;
    kvf_tokenizer_t *tok = NULL;
    kvf_log_level_t saved = kvf_log_level;
    kvf_log_set_level(KVF_LOG_OFF);
    assert_int_equal(kvf_tokenizer_load(DEC_DIR "/refused", &tok), KVF_ERR_UNSUPPORTED);
    kvf_log_set_level(saved);
    assert_null(tok);
}

/* splitmix64: a fixed seed gives the same sequences on every run. */
static uint64_t next_random(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Random sequences, byte tokens and special tokens favoured: streaming
 * equals the whole decode, chunk by chunk. */
static void property_stream(kvf_tokenizer_t *tok, uint64_t seed, uint32_t n_ids)
{
    kvf_detok_t detok;
    kvf_detok_init(&detok, tok);
    uint32_t ids[32];
    for (int seq = 0; seq < 3000; seq++) {
        size_t n = next_random(&seed) % 25;
        for (size_t i = 0; i < n; i++) {
            uint64_t r = next_random(&seed);
            switch (r % 8) {
            case 0:
            case 1:
            case 2:
                ids[i] = BYTE((uint32_t)(r >> 8) % 256);
                break;
            case 3:
                ids[i] = (uint32_t)(r >> 8) % 3 ? 1 + (uint32_t)(r >> 16) % 2 : 273;
                break;
            case 4:
                ids[i] = 259 + (uint32_t)(r >> 8) % 14; /* the hand-picked tokens */
                break;
            case 5:
                ids[i] = n_ids + (uint32_t)(r >> 8) % 3; /* unknown */
                break;
            default:
                ids[i] = (uint32_t)(r >> 8) % n_ids;
            }
        }
        check_stream(&detok, tok, ids, n);
    }
    kvf_detok_fini(&detok);
}

static void test_stream_property(void **state)
{
    (void)state;
    const char *chains[] = {"llama2", "gemma", "metaspace", "fallback_metaspace",
                            "replace_regex_strip", "strip_each", "none"};
    for (size_t c = 0; c < sizeof(chains) / sizeof(chains[0]); c++) {
        kvf_tokenizer_t *tok = load(chains[c]);
        property_stream(tok, 0x5eed0000u + c, N_FILE_IDS);
        kvf_tokenizer_destroy(tok);
    }
    /* ByteLevel: the golden tokenizer (its ids 3..258 are ordinary tokens) */
    kvf_tokenizer_t *tok = NULL;
    assert_int_equal(kvf_tokenizer_load(KVF_TEST_DATA "/golden/tiny-llama-f32", &tok), KVF_OK);
    property_stream(tok, 0x5eedbbbbu, (uint32_t)kvf_tokenizer_vocab_size(tok));
    kvf_tokenizer_destroy(tok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama2_chain),    cmocka_unit_test(test_gemma_chain),
        cmocka_unit_test(test_metaspace),       cmocka_unit_test(test_replace_strip),
        cmocka_unit_test(test_no_decoder),      cmocka_unit_test(test_byte_token_form),
        cmocka_unit_test(test_split_emoji),     cmocka_unit_test(test_refused),
        cmocka_unit_test(test_stream_property),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
