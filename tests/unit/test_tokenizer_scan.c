/* The fast reader of tokenizer.json (common/tokenizer_scan.c): model.vocab
 * and model.merges read without a JSON tree must give the tokenizer cJSON
 * would have given, for every way JSON may spell them, and malformed
 * documents must be refused, never crash. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kvf/log.h"
#include "kvf/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/kvf_tokscan_XXXXXX");
    assert_non_null(mkdtemp(dir));
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    unlink(path);
    rmdir(dir);
    return 0;
}

static void write_doc(const char *text, size_t len)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, len, f), len);
    fclose(f);
}

static kvf_status_t load(const char *text, kvf_tokenizer_t **tok_p)
{
    write_doc(text, strlen(text));
    *tok_p = NULL;
    return kvf_tokenizer_load(dir, tok_p);
}

static void expect_ids(const kvf_tokenizer_t *tok, const char *text, const uint32_t *want,
                       size_t n_want)
{
    uint32_t *ids;
    size_t n;
    assert_int_equal(kvf_tokenizer_encode(tok, text, strlen(text), false, &ids, &n), KVF_OK);
    assert_int_equal(n, n_want);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(ids[i], want[i]);
    free(ids);
}

#define PRE "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false}"

/* Escapes in spellings and member names, merges as strings and as pairs,
 * ids written as 5.0, members in any order: the same tokenizer. */
static void test_spellings(void **state)
{
    (void)state;
    /* "ab" is spelled with escapes; "\u0062" is b; the merge list mixes
     * both forms; "model" comes before the pre-tokenizer, its members in
     * an unusual order, and one member name is escaped. */
    static const char doc[] =
        "{\"version\":\"1.0\", \"mo\\u0064el\": {\"merges\": [\"a \\u0062\", [\"ab\", \"c\"]],"
        " \"type\": \"BPE\", \"vocab\": {\"a\": 0, \"\\u0062\": 1, \"c\": 2.0, \"a\\u0062\": 3,"
        " \"abc\": 4, \"\\\"\": 5, \"\\ud83c\\udf89\": 6}}, " PRE "}";
    kvf_tokenizer_t *tok;
    assert_int_equal(load(doc, &tok), KVF_OK);
    assert_int_equal(kvf_tokenizer_vocab_size(tok), 7);
    expect_ids(tok, "abc", (const uint32_t[]){4}, 1);
    expect_ids(tok, "ab", (const uint32_t[]){3}, 1);
    expect_ids(tok, "\"", (const uint32_t[]){5}, 1);
    assert_string_equal(kvf_tokenizer_token_text(tok, 6), "\xf0\x9f\x8e\x89");
    kvf_tokenizer_destroy(tok);
}

/* The first "model" and, inside it, the first "vocab" and "merges" count,
 * as cJSON's lookups take the first. */
static void test_first_member_wins(void **state)
{
    (void)state;
    static const char doc[] =
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2},"
        " \"merges\": [\"a b\"]}, " PRE ", \"extra\": {\"model\": {\"vocab\": [1, 2]}}}";
    kvf_tokenizer_t *tok;
    assert_int_equal(load(doc, &tok), KVF_OK);
    expect_ids(tok, "ab", (const uint32_t[]){2}, 1);
    kvf_tokenizer_destroy(tok);
}

/* Each document is malformed in one way; every one is a format error. */
static void test_malformed(void **state)
{
    (void)state;
    static const char *const docs[] = {
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}}, " PRE "}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 99999999999}}, " PRE "}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\" 0}}, " PRE "}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"\\x\": 0}}, " PRE "}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"\\ud800\": 0}}, " PRE "}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"\\udc00\\ud800\": 0}}, " PRE "}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"\\u12\": 0}}, " PRE "}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0,}}, " PRE "}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a\"]}, " PRE "}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b c\"]}, " PRE "}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [[\"a\"]]}, " PRE "}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [7]}, " PRE "}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a a\" ",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\tb\": 0}}, " PRE "}",
        "[\"not an object\"]",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {}}, \"x\": tru}",
        "",
    };
    kvf_log_set_level(KVF_LOG_OFF);
    for (size_t i = 0; i < sizeof(docs) / sizeof(docs[0]); i++) {
        kvf_tokenizer_t *tok;
        kvf_status_t st = load(docs[i], &tok);
        if (st == KVF_OK)
            fail_msg("document %zu loaded: %s", i, docs[i]);
        assert_int_equal(st, KVF_ERR_FORMAT);
        assert_null(tok);
    }
    kvf_log_set_level(KVF_LOG_WARN);
}

/* Nesting deeper than the reader allows is refused, not a stack overflow;
 * the same depth in a value the reader only skips, too. */
static void test_deep_nesting(void **state)
{
    (void)state;
    size_t depth = 100000;
    size_t cap = 2 * depth + 256;
    char *doc = malloc(cap);
    assert_non_null(doc);
    int n = snprintf(doc, cap, "{\"model\": {\"type\": \"BPE\", \"extra\": ");
    memset(doc + n, '[', depth);
    memset(doc + n + depth, ']', depth);
    snprintf(doc + n + 2 * depth, cap - (size_t)n - 2 * depth, "}}");
    kvf_log_set_level(KVF_LOG_OFF);
    kvf_tokenizer_t *tok;
    assert_int_equal(load(doc, &tok), KVF_ERR_FORMAT);
    kvf_log_set_level(KVF_LOG_WARN);
    free(doc);
}

/* A NUL written as \u0000 is part of the spelling, not its end. */
static void test_nul_in_spelling(void **state)
{
    (void)state;
    static const char doc[] =
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"a\\u0000\": 1}}, " PRE "}";
    kvf_tokenizer_t *tok;
    assert_int_equal(load(doc, &tok), KVF_OK);
    size_t len;
    const uint8_t *bytes = kvf_tokenizer_token_bytes(tok, 1, &len);
    assert_int_equal(len, 2);
    assert_memory_equal(bytes, "a\0", 2);
    kvf_tokenizer_destroy(tok);
}

int main(void)
{
    kvf_log_set_level(KVF_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_spellings, setup, teardown),
        cmocka_unit_test_setup_teardown(test_first_member_wins, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deep_nesting, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nul_in_spelling, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
