/* Tokenizer components (normalizers, pre-tokenizers, the BPE model's
 * byte fallback and unknown tokens, added-token options, post-processors)
 * on small tokenizer.json files the test writes: one base file, each case
 * a patch over it (objects merged key by key).
 *
 * The expected ids were computed with Hugging Face's JS tokenizers
 * (@huggingface/tokenizers 0.2.0) on the same files. Where that port lacks
 * a behaviour of Hugging Face's Rust library (Split MergedWithPrevious /
 * MergedWithNext / Contiguous, an inverted Isolated Split, Metaspace's
 * split and its legacy add_prefix_space field), the case is marked
 * rust_pieces: the pieces are the ones the Rust library's rules make
 * (written out in the case's comment), and the ids are the JS port's ids
 * of each piece encoded alone. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kvf/log.h"
#include "kvf/tokenizer.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The base tokenizer.json: a character-level BPE vocabulary (no
 * normalizer, pre-tokenizer or post-processor) with <0xE6> <0x97> <0xA5>
 * (the bytes of U+65E5) as its only byte tokens. */
static const char BASE[] =
    "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[{\"id\":0,"
    "\"content\":\"<unk>\",\"special\":true,\"normalized\":false},{\"id\":1,\"content\":\"<"
    "s>\",\"special\":true,\"normalized\":false},{\"id\":2,\"content\":\"</s>\",\"special\""
    ":true,\"normalized\":false}],\"normalizer\":null,\"pre_tokenizer\":null,\"post_process"
    "or\":null,\"decoder\":null,\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":"
    "\"<unk>\",\"fuse_unk\":false,\"byte_fallback\":false,\"vocab\":{\"1\":18,\"2\":19,\"3"
    "\":20,\"12\":39,\"123\":40,\"<unk>\":0,\"<s>\":1,\"</s>\":2,\"<0xE6>\":3,\"<0x97>\":4,"
    "\"<0xA5>\":5,\"\\u2581\":6,\"h\":7,\"e\":8,\"l\":9,\"o\":10,\"w\":11,\"r\":12,\"d\":13"
    ",\"a\":14,\"b\":15,\"c\":16,\"-\":17,\"i\":21,\"t\":22,\"f\":23,\"\\u00e9\":24,\"\\u03"
    "01\":25,\"ll\":26,\"he\":27,\"\\u2581he\":28,\"llo\":29,\"\\u2581hello\":30,\"\\u2581w"
    "\":31,\"or\":32,\"\\u2581wor\":33,\"a-\":34,\"-b\":35,\"b-\":36,\"--\":37,\"-c\":38,\""
    "i\\u2581\":41,\"\\u2581h\":42,\"\\u2581hi\":43,\"th\":44,\"\\u2581th\":45,\"er\":46,\""
    "\\u2581ther\":47,\"\\u2581there\":48,\"fi\":49,\"ab\":50},\"merges\":[\"l l\",\"h e\","
    "\"\\u2581 he\",\"ll o\",\"\\u2581he llo\",\"\\u2581 w\",\"o r\",\"\\u2581w or\",\"a -"
    "\",\"- b\",\"b -\",\"- -\",\"- c\",\"1 2\",\"12 3\",\"i \\u2581\",\"\\u2581 h\",\"\\u2"
    "581h i\",\"t h\",\"\\u2581 th\",\"e r\",\"\\u2581th er\",\"\\u2581ther e\",\"f i\",\"a"
    " b\"]}}";

typedef struct {
    const char *name;
    const char *patch; /* merged into BASE */
    const char *text;
    bool special;     /* add_special_tokens */
    bool rust_pieces; /* see the top of the file */
    size_t n;
    uint32_t ids[16];
} tok_case_t;

/* Pieces of the rust_pieces cases, for "a-b--c" with the pattern "-":
 * MergedWithPrevious "a-" "b-" "-" "c", MergedWithNext "a" "-b" "-" "-c",
 * Contiguous "a" "-" "b" "--" "c"; the inverted Isolated Split on [abc]
 * keeps every span: "a" "-" "b" "--" "c"; Metaspace with split:
 * "\u2581hi" "\u2581there"; add_prefix_space false: no prepended
 * replacement. */
static const tok_case_t CASES[] = {
    {"llama2: byte fallback, fused unk",
     "{\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepen"
     "d\":\"\\u2581\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\"
     "u2581\"}]},\"model\":{\"byte_fallback\":true,\"fuse_unk\":true}}",
     "\xe6"
     "\x97"
     "\xa5"
     "\xe6"
     "\x9c"
     "\xac"
     "\xe6"
     "\x9c"
     "\xac"
     " x\xe6"
     "\x97"
     "\xa5"
     "",
     false,
     false,
     10,
     {6, 3, 4, 5, 0, 6, 0, 3, 4, 5}},
    {"llama2: no fuse_unk",
     "{\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepen"
     "d\":\"\\u2581\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\"
     "u2581\"}]},\"model\":{\"byte_fallback\":true}}",
     "\xe6"
     "\x97"
     "\xa5"
     "\xe6"
     "\x9c"
     "\xac"
     "\xe6"
     "\x9c"
     "\xac"
     " x\xe6"
     "\x97"
     "\xa5"
     "",
     false,
     false,
     11,
     {6, 3, 4, 5, 0, 0, 6, 0, 3, 4, 5}},
    {"no byte_fallback: unk",
     "{\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepen"
     "d\":\"\\u2581\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\"
     "u2581\"}]}}",
     "\xe6"
     "\x97"
     "\xa5"
     " hello",
     false,
     false,
     3,
     {6, 0, 30}},
    {"template before and after",
     "{\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepen"
     "d\":\"\\u2581\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\"
     "u2581\"}]},\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialT"
     "oken\":{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},{\""
     "SpecialToken\":{\"id\":\"</s>\",\"type_id\":0}}],\"pair\":[],\"special_tokens\":{\"<s>"
     "\":{\"id\":\"<s>\",\"ids\":[1],\"tokens\":[\"<s>\"]},\"</s>\":{\"id\":\"</s>\",\"ids\""
     ":[2],\"tokens\":[\"</s>\"]}}}}",
     "hello world",
     true,
     false,
     6,
     {1, 30, 33, 9, 13, 2}},
    {"template, no special tokens",
     "{\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepen"
     "d\":\"\\u2581\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\"
     "u2581\"}]},\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialT"
     "oken\":{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},{\""
     "SpecialToken\":{\"id\":\"</s>\",\"type_id\":0}}],\"pair\":[],\"special_tokens\":{\"<s>"
     "\":{\"id\":\"<s>\",\"ids\":[1],\"tokens\":[\"<s>\"]},\"</s>\":{\"id\":\"</s>\",\"ids\""
     ":[2],\"tokens\":[\"</s>\"]}}}}",
     "hello world",
     false,
     false,
     4,
     {30, 33, 9, 13}},
    {"post Sequence[ByteLevel, Template]",
     "{\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepen"
     "d\":\"\\u2581\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\"
     "u2581\"}]},\"post_processor\":{\"type\":\"Sequence\",\"processors\":[{\"type\":\"ByteL"
     "evel\",\"add_prefix_space\":true,\"trim_offsets\":false,\"use_regex\":true},{\"type\":"
     "\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},{"
     "\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"pair\":[],\"special_tokens\":{\"<s>\":{"
     "\"id\":\"<s>\",\"ids\":[1],\"tokens\":[\"<s>\"]},\"</s>\":{\"id\":\"</s>\",\"ids\":[2]"
     ",\"tokens\":[\"</s>\"]}}}]}}",
     "hello",
     true,
     false,
     2,
     {1, 30}},
    {"added tokens split sections, Prepend each",
     "{\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepen"
     "d\":\"\\u2581\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\"
     "u2581\"}]}}",
     "hello<s>hello</s> world",
     false,
     false,
     8,
     {30, 1, 30, 2, 6, 33, 9, 13}},
    {"NFKC",
     "{\"normalizer\":{\"type\":\"NFKC\"}}",
     "\xef"
     "\xac"
     "\x81"
     "",
     false,
     false,
     1,
     {49}},
    {"NFC",
     "{\"normalizer\":{\"type\":\"NFC\"}}",
     "e\xcc"
     "\x81"
     "",
     false,
     false,
     1,
     {24}},
    {"NFD",
     "{\"normalizer\":{\"type\":\"NFD\"}}",
     "\xc3"
     "\xa9"
     "",
     false,
     false,
     2,
     {8, 25}},
    {"NFKD",
     "{\"normalizer\":{\"type\":\"NFKD\"}}",
     "\xef"
     "\xac"
     "\x81"
     "\xc3"
     "\xa9"
     "",
     false,
     false,
     3,
     {49, 8, 25}},
    {"Replace Regex",
     "{\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"[0-9]+\"},\"content\":"
     "\"-\"}}",
     "a1b22c",
     false,
     false,
     3,
     {34, 36, 16}},
    {"normalized added token",
     "{\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u"
     "2581\"},\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true,\"normalize"
     "d\":false},{\"id\":1,\"content\":\"<s>\",\"special\":true,\"normalized\":false},{\"id"
     "\":2,\"content\":\"</s>\",\"special\":true,\"normalized\":false},{\"id\":51,\"content"
     "\":\"o\\u2581w\",\"special\":false,\"normalized\":true}]}",
     "hello world",
     false,
     false,
     6,
     {27, 26, 51, 32, 9, 13}},
    {"unnormalized added token",
     "{\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u"
     "2581\"},\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true,\"normalize"
     "d\":false},{\"id\":1,\"content\":\"<s>\",\"special\":true,\"normalized\":false},{\"id"
     "\":2,\"content\":\"</s>\",\"special\":true,\"normalized\":false},{\"id\":51,\"content"
     "\":\"o\\u2581w\",\"special\":false,\"normalized\":false}]}",
     "hello world",
     false,
     false,
     5,
     {27, 29, 33, 9, 13}},
    {"lstrip/rstrip take Unicode white space",
     "{\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true,\"normalized\":fal"
     "se},{\"id\":1,\"content\":\"<s>\",\"special\":true,\"normalized\":false},{\"id\":2,\"c"
     "ontent\":\"</s>\",\"special\":true,\"normalized\":false},{\"id\":51,\"content\":\"<m>"
     "\",\"special\":true,\"normalized\":false,\"lstrip\":true,\"rstrip\":true}]}",
     "ab\xe3"
     "\x80"
     "\x80"
     " <m>\xe3"
     "\x80"
     "\x80"
     " c",
     false,
     false,
     3,
     {50, 51, 16}},
    {"Split Isolated",
     "{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"I"
     "solated\",\"invert\":false}}",
     "a-b--c",
     false,
     false,
     6,
     {14, 17, 15, 17, 17, 16}},
    {"Split Removed",
     "{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"-\"},\"behavior\":\"Re"
     "moved\",\"invert\":false}}",
     "a-b--c",
     false,
     false,
     3,
     {14, 15, 16}},
    {"Split Removed inverted",
     "{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"-\"},\"behavior\":\"Re"
     "moved\",\"invert\":true}}",
     "a-b--c",
     false,
     false,
     3,
     {17, 17, 17}},
    {"Split MergedWithPrevious",
     "{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"M"
     "ergedWithPrevious\",\"invert\":false}}",
     "a-b--c",
     false,
     true,
     4,
     {34, 36, 17, 16}},
    {"Split MergedWithNext",
     "{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"M"
     "ergedWithNext\",\"invert\":false}}",
     "a-b--c",
     false,
     true,
     4,
     {14, 35, 17, 38}},
    {"Split Contiguous",
     "{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"C"
     "ontiguous\",\"invert\":false}}",
     "a-b--c",
     false,
     true,
     5,
     {14, 17, 15, 37, 16}},
    {"Split Isolated inverted",
     "{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"[abc]\"},\"behavior\":"
     "\"Isolated\",\"invert\":true}}",
     "a-b--c",
     false,
     true,
     5,
     {14, 17, 15, 37, 16}},
    {"Digits individual",
     "{\"pre_tokenizer\":{\"type\":\"Digits\",\"individual_digits\":true}}",
     "ab123",
     false,
     false,
     4,
     {50, 18, 19, 20}},
    {"Digits runs",
     "{\"pre_tokenizer\":{\"type\":\"Digits\",\"individual_digits\":false}}",
     "ab123",
     false,
     false,
     2,
     {50, 40}},
    {"Metaspace always, no split",
     "{\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_schem"
     "e\":\"always\",\"split\":false}}",
     "hi there",
     false,
     false,
     6,
     {42, 41, 22, 27, 12, 8}},
    {"Metaspace never, no split",
     "{\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_schem"
     "e\":\"never\",\"split\":false}}",
     "hi there",
     false,
     false,
     6,
     {7, 41, 22, 27, 12, 8}},
    {"Metaspace first",
     "{\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_schem"
     "e\":\"first\",\"split\":false}}",
     "hi<s>hi",
     false,
     false,
     4,
     {43, 1, 7, 21}},
    {"Metaspace always, split",
     "{\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_schem"
     "e\":\"always\",\"split\":true}}",
     "hi there",
     false,
     true,
     6,
     {43, 6, 22, 27, 12, 8}},
    {"Metaspace legacy add_prefix_space false",
     "{\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"add_prefix_sp"
     "ace\":false,\"split\":false}}",
     "hi there",
     false,
     true,
     6,
     {7, 41, 22, 27, 12, 8}},
    {"pre Sequence[Digits, Metaspace]",
     "{\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\",\"in"
     "dividual_digits\":true},{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_"
     "scheme\":\"never\",\"split\":false}]}}",
     "ab12 there",
     false,
     false,
     8,
     {50, 18, 19, 6, 22, 27, 12, 8}},
};

/* Merges patch into dst: objects key by key, anything else replaced. */
static void merge_json(cJSON *dst, const cJSON *patch)
{
    for (const cJSON *p = patch->child; p; p = p->next) {
        cJSON *d = cJSON_GetObjectItemCaseSensitive(dst, p->string);
        if (d && cJSON_IsObject(d) && cJSON_IsObject(p)) {
            merge_json(d, p);
            continue;
        }
        cJSON *copy = cJSON_Duplicate(p, true);
        assert_non_null(copy);
        if (d)
            cJSON_ReplaceItemInObjectCaseSensitive(dst, p->string, copy);
        else
            cJSON_AddItemToObject(dst, p->string, copy);
    }
}

/* Loads BASE with patch (NULL: none) applied; the status of the load. */
static kvf_status_t load_patched(const char *patch, kvf_tokenizer_t **tok_p)
{
    cJSON *root = cJSON_Parse(BASE);
    assert_non_null(root);
    if (patch) {
        cJSON *p = cJSON_Parse(patch);
        assert_non_null(p);
        merge_json(root, p);
        cJSON_Delete(p);
    }
    char dir[] = "/tmp/kvf-tokc-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[64];
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(json, 1, strlen(json), f), strlen(json));
    fclose(f);
    free(json);
    kvf_status_t st = kvf_tokenizer_load(dir, tok_p);
    unlink(path);
    rmdir(dir);
    return st;
}

static bool same_ids(const char *what, const uint32_t *ids, size_t n, const uint32_t *want,
                     size_t n_want)
{
    bool same = n == n_want && (n == 0 || !memcmp(ids, want, n * sizeof(*ids)));
    if (!same) {
        fprintf(stderr, "mismatch for %s\n  got: ", what);
        for (size_t j = 0; j < n; j++)
            fprintf(stderr, "%u ", ids[j]);
        fprintf(stderr, "\n want: ");
        for (size_t j = 0; j < n_want; j++)
            fprintf(stderr, "%u ", want[j]);
        fprintf(stderr, "\n");
    }
    return same;
}

static void test_cases(void **state)
{
    (void)state;
    size_t failed = 0;
    for (size_t i = 0; i < sizeof(CASES) / sizeof(CASES[0]); i++) {
        const tok_case_t *c = &CASES[i];
        kvf_tokenizer_t *tok = NULL;
        assert_int_equal(load_patched(c->patch, &tok), KVF_OK);
        uint32_t *ids;
        size_t n;
        assert_int_equal(kvf_tokenizer_encode(tok, c->text, strlen(c->text), c->special, &ids, &n),
                         KVF_OK);
        failed += !same_ids(c->name, ids, n, c->ids, c->n);
        free(ids);
        kvf_tokenizer_destroy(tok);
    }
    assert_int_equal(failed, 0);
}

/* BOS is the template's first special token, added with add_special_tokens
 * only; EOS after $A comes too. */
static void test_template_bos(void **state)
{
    (void)state;
    kvf_tokenizer_t *tok;
    assert_int_equal(
        load_patched("{\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":"
                     "[{\"SpecialToken\":{\"id\":\"<s>\"}},{\"Sequence\":{\"id\":\"A\"}},"
                     "{\"SpecialToken\":{\"id\":\"</s>\"}}],\"special_tokens\":{}}}",
                     &tok),
        KVF_OK);
    assert_true(kvf_tokenizer_adds_bos(tok));
    assert_int_equal(kvf_tokenizer_bos_id(tok), 1);
    uint32_t *ids;
    size_t n;
    /* the template's names resolve through the vocabulary when
     * special_tokens does not list them */
    assert_int_equal(kvf_tokenizer_encode(tok, "ab", 2, true, &ids, &n), KVF_OK);
    static const uint32_t want[] = {1, 50, 2};
    assert_true(same_ids("template by name", ids, n, want, 3));
    free(ids);
    assert_int_equal(kvf_tokenizer_encode(tok, "", 0, true, &ids, &n), KVF_OK);
    static const uint32_t bos_eos[] = {1, 2};
    assert_true(same_ids("template on empty text", ids, n, bos_eos, 2));
    free(ids);
    kvf_tokenizer_destroy(tok);
    assert_int_equal(load_patched(NULL, &tok), KVF_OK);
    assert_false(kvf_tokenizer_adds_bos(tok));
    assert_int_equal(kvf_tokenizer_bos_id(tok), -1);
    kvf_tokenizer_destroy(tok);
}

/* Bytes that are not UTF-8 are pieces of their own: with byte_fallback
 * their <0xNN> token, else the unknown token. */
static void test_invalid_utf8(void **state)
{
    (void)state;
    kvf_tokenizer_t *tok;
    assert_int_equal(load_patched("{\"normalizer\":{\"type\":\"NFC\"},"
                                  "\"model\":{\"byte_fallback\":true,\"fuse_unk\":true}}",
                                  &tok),
                     KVF_OK);
    uint32_t *ids;
    size_t n;
    const char text[] = "a\xe6\x97z\xa5";
    assert_int_equal(kvf_tokenizer_encode(tok, text, sizeof(text) - 1, false, &ids, &n), KVF_OK);
    /* a, <0xE6>, <0x97>, z (no token, no <0x7A>: unk), <0xA5> */
    static const uint32_t want[] = {14, 3, 4, 0, 5};
    assert_true(same_ids("invalid UTF-8", ids, n, want, 5));
    free(ids);
    kvf_tokenizer_destroy(tok);
}

/* ByteLevel's add_prefix_space puts a space before each piece that has
 * none: "hello" encodes as " hello" does without it. */
static void test_byte_level_prefix_space(void **state)
{
    (void)state;
    kvf_tokenizer_t *with, *without;
    const char *pre = "{\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":%s,"
                      "\"use_regex\":true},\"model\":{\"unk_token\":null}}";
    char patch[256];
    snprintf(patch, sizeof(patch), pre, "true");
    assert_int_equal(load_patched(patch, &with), KVF_OK);
    snprintf(patch, sizeof(patch), pre, "false");
    assert_int_equal(load_patched(patch, &without), KVF_OK);
    uint32_t *a, *b;
    size_t na, nb;
    assert_int_equal(kvf_tokenizer_encode(with, "ab", 2, false, &a, &na), KVF_OK);
    assert_int_equal(kvf_tokenizer_encode(without, " ab", 3, false, &b, &nb), KVF_OK);
    assert_true(same_ids("prefix space", a, na, b, nb));
    free(a);
    free(b);
    /* a text that starts with a space gets no second one */
    assert_int_equal(kvf_tokenizer_encode(with, " ab", 3, false, &a, &na), KVF_OK);
    assert_int_equal(kvf_tokenizer_encode(without, " ab", 3, false, &b, &nb), KVF_OK);
    assert_true(same_ids("no second prefix space", a, na, b, nb));
    free(a);
    free(b);
    kvf_tokenizer_destroy(with);
    kvf_tokenizer_destroy(without);
}

/* Components outside the supported lists are refused, naming them;
 * empty BPE affixes are no affixes. */
static void test_refusals(void **state)
{
    (void)state;
    static const struct {
        const char *patch;
        kvf_status_t want;
    } cases[] = {
        {"{\"normalizer\":{\"type\":\"Lowercase\"}}", KVF_ERR_UNSUPPORTED},
        {"{\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},"
         "{\"type\":\"StripAccents\"}]}}",
         KVF_ERR_UNSUPPORTED},
        {"{\"pre_tokenizer\":{\"type\":\"Whitespace\"}}", KVF_ERR_UNSUPPORTED},
        {"{\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"ByteLevel\"},"
         "{\"type\":\"Digits\"}]}}",
         KVF_ERR_UNSUPPORTED},
        {"{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},"
         "\"behavior\":\"Sideways\"}}",
         KVF_ERR_UNSUPPORTED},
        {"{\"post_processor\":{\"type\":\"RobertaProcessing\"}}", KVF_ERR_UNSUPPORTED},
        {"{\"model\":{\"continuing_subword_prefix\":\"##\"}}", KVF_ERR_UNSUPPORTED},
        {"{\"model\":{\"end_of_word_suffix\":\"</w>\"}}", KVF_ERR_UNSUPPORTED},
        {"{\"model\":{\"continuing_subword_prefix\":\"\",\"end_of_word_suffix\":\"\"}}", KVF_OK},
        {"{\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"(\"},\"content\":\"\"}}",
         KVF_ERR_FORMAT},
        {"{\"normalizer\":{\"type\":\"Replace\",\"pattern\":{}}}", KVF_ERR_FORMAT},
        {"{\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"ab\"}}", KVF_ERR_FORMAT},
        {"{\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":"
         "[{\"SpecialToken\":{\"id\":\"<nope>\"}}],\"special_tokens\":{}}}",
         KVF_ERR_FORMAT},
    };
    kvf_log_level_t saved = kvf_log_level;
    kvf_log_set_level(KVF_LOG_OFF);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kvf_tokenizer_t *tok = NULL;
        kvf_status_t st = load_patched(cases[i].patch, &tok);
        if (st != cases[i].want)
            fprintf(stderr, "%s: %d, want %d\n", cases[i].patch, st, cases[i].want);
        assert_int_equal(st, cases[i].want);
        kvf_tokenizer_destroy(tok);
    }
    kvf_log_set_level(saved);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),        cmocka_unit_test(test_template_bos),
        cmocka_unit_test(test_invalid_utf8), cmocka_unit_test(test_byte_level_prefix_space),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
