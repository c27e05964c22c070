/* Tokenizer against the golden cases (ids from Hugging Face's tokenizers),
 * the golden prompts, round trips, streaming, Llama 3 style files and
 * hostile input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kvf/clock.h"
#include "kvf/log.h"
#include "kvf/tokenizer.h"
#include "kvf/utf8.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define GOLDEN  KVF_TEST_DATA "/golden"
#define TOK_DIR GOLDEN "/tiny-llama-f32"

#if defined(__SANITIZE_ADDRESS__)
#define SLOWDOWN 8.0
#else
#define SLOWDOWN 1.0
#endif

static char *slurp(const char *path, size_t *len_p)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)len, f), (size_t)len);
    buf[len] = '\0';
    fclose(f);
    if (len_p)
        *len_p = (size_t)len;
    return buf;
}

static cJSON *load_json(const char *path)
{
    char *text = slurp(path, NULL);
    cJSON *root = cJSON_Parse(text);
    free(text);
    assert_non_null(root);
    return root;
}

static void spit(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    fclose(f);
}

typedef struct {
    kvf_tokenizer_t *tok;
    cJSON *expected;
} fixture_t;

static int setup(void **state)
{
    fixture_t *fx = calloc(1, sizeof(*fx));
    assert_int_equal(kvf_tokenizer_load(TOK_DIR, &fx->tok), KVF_OK);
    fx->expected = load_json(GOLDEN "/expected.json");
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *fx = *state;
    kvf_tokenizer_destroy(fx->tok);
    cJSON_Delete(fx->expected);
    free(fx);
    return 0;
}

static const cJSON *cases(const fixture_t *fx)
{
    const cJSON *tok = cJSON_GetObjectItem(fx->expected, "tokenizer");
    const cJSON *c = cJSON_GetObjectItem(tok, "cases");
    assert_true(cJSON_IsArray(c));
    return c;
}

/* Compares ids with a JSON array of numbers, printing both on mismatch. */
static void assert_ids(const char *what, const uint32_t *ids, size_t n, const cJSON *want,
                       size_t offset)
{
    size_t n_want = (size_t)cJSON_GetArraySize(want);
    bool same = n_want == n + offset;
    size_t i = 0;
    for (const cJSON *w = want ? want->child : NULL; w && same; w = w->next, i++)
        if (i >= offset && ids[i - offset] != (uint32_t)w->valuedouble)
            same = false;
    if (!same) {
        fprintf(stderr, "mismatch for %s\n  got: ", what);
        for (size_t j = 0; j < n; j++)
            fprintf(stderr, "%u ", ids[j]);
        fprintf(stderr, "\n want: ");
        for (const cJSON *w = want->child; w; w = w->next)
            fprintf(stderr, "%d ", w->valueint);
        fprintf(stderr, "\n");
    }
    assert_true(same);
}

static void test_special_ids(void **state)
{
    fixture_t *fx = *state;
    assert_int_equal(kvf_tokenizer_vocab_size(fx->tok), 512);
    assert_int_equal(kvf_tokenizer_bos_id(fx->tok), 510);
    assert_int_equal(kvf_tokenizer_eos_id(fx->tok), 511);
    assert_true(kvf_tokenizer_adds_bos(fx->tok));
    assert_string_equal(kvf_tokenizer_token_text(fx->tok, 511), "<|end_of_text|>");
    assert_string_equal(kvf_tokenizer_token_text(fx->tok, 220), "\xc4\xa0"); /* Ġ */
    size_t len;
    const uint8_t *b = kvf_tokenizer_token_bytes(fx->tok, 220, &len);
    assert_int_equal(len, 1);
    assert_int_equal(b[0], ' ');
    b = kvf_tokenizer_token_bytes(fx->tok, 198, &len);
    assert_int_equal(len, 1);
    assert_int_equal(b[0], '\n');
    uint32_t id;
    assert_int_equal(kvf_tokenizer_token_id(fx->tok, "<|begin_of_text|>", &id), KVF_OK);
    assert_int_equal(id, 510);
    assert_int_equal(kvf_tokenizer_token_id(fx->tok, "no such token", &id), KVF_ERR_NOT_FOUND);
    assert_null(kvf_tokenizer_token_text(fx->tok, 512));
    assert_false(kvf_tokenizer_has_id(fx->tok, 100000));
}

static void test_golden_cases(void **state)
{
    fixture_t *fx = *state;
    int n_cases = 0;
    for (const cJSON *c = cases(fx)->child; c; c = c->next, n_cases++) {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        uint32_t *ids;
        size_t n;
        assert_int_equal(kvf_tokenizer_encode(fx->tok, text, strlen(text), false, &ids, &n),
                         KVF_OK);
        assert_ids(text, ids, n, cJSON_GetObjectItem(c, "ids"), 0);
        char *back;
        size_t back_len;
        assert_int_equal(kvf_tokenizer_decode(fx->tok, ids, n, &back, &back_len), KVF_OK);
        assert_int_equal(back_len, strlen(text));
        assert_string_equal(back, text);
        free(back);
        free(ids);
    }
    assert_int_equal(n_cases, 35);
}

static void test_golden_prompts(void **state)
{
    fixture_t *fx = *state;
    int n_prompts = 0, n_models = 0;
    const cJSON *models = cJSON_GetObjectItem(fx->expected, "models");
    for (const cJSON *m = models->child; m; m = m->next, n_models++) {
        /* each model with the tokenizer files of its own directory */
        char dir[512];
        snprintf(dir, sizeof(dir), GOLDEN "/%s", m->string);
        kvf_tokenizer_t *tok;
        assert_int_equal(kvf_tokenizer_load(dir, &tok), KVF_OK);
        for (const cJSON *p = cJSON_GetObjectItem(m, "prompts")->child; p; p = p->next) {
            const char *text = cJSON_GetObjectItem(p, "text")->valuestring;
            uint32_t *ids;
            size_t n;
            assert_int_equal(kvf_tokenizer_encode(tok, text, strlen(text), true, &ids, &n), KVF_OK);
            assert_ids(text, ids, n, cJSON_GetObjectItem(p, "ids"), 0);
            free(ids);
            /* the golden continuation text is Hugging Face's lossy decode */
            const cJSON *greedy = cJSON_GetObjectItem(p, "greedy_ids");
            const cJSON *greedy_text = cJSON_GetObjectItem(p, "greedy_text");
            if (cJSON_IsArray(greedy) && cJSON_IsString(greedy_text)) {
                size_t ng = (size_t)cJSON_GetArraySize(greedy), i = 0;
                uint32_t *gids = malloc(ng * sizeof(*gids));
                for (const cJSON *g = greedy->child; g; g = g->next)
                    gids[i++] = (uint32_t)g->valuedouble;
                char *out;
                assert_int_equal(kvf_tokenizer_decode(tok, gids, ng, &out, NULL), KVF_OK);
                assert_string_equal(out, greedy_text->valuestring);
                free(out);
                free(gids);
            }
            n_prompts++;
        }
        kvf_tokenizer_destroy(tok);
    }
    /* four prompts for each golden model, at least the two first ones */
    assert_true(n_models >= 2);
    assert_int_equal(n_prompts, 4 * n_models);
}

/* Streams ids through a kvf_detok_t: every chunk must be whole UTF-8 and
 * the concatenation must equal the one-shot decode. */
static void check_stream(const kvf_tokenizer_t *tok, const uint32_t *ids, size_t n)
{
    char *whole;
    size_t whole_len;
    assert_int_equal(kvf_tokenizer_decode(tok, ids, n, &whole, &whole_len), KVF_OK);
    char *joined = malloc(whole_len + 16);
    size_t joined_len = 0;
    kvf_detok_t detok;
    kvf_detok_init(&detok, tok);
    for (size_t i = 0; i <= n; i++) {
        const char *chunk;
        size_t len;
        if (i < n)
            assert_int_equal(kvf_detok_push(&detok, ids[i], &chunk, &len), KVF_OK);
        else
            assert_int_equal(kvf_detok_flush(&detok, &chunk, &len), KVF_OK);
        assert_int_equal(kvf_utf8_valid_prefix((const uint8_t *)chunk, len), len);
        assert_int_equal(strlen(chunk), len);
        assert_true(joined_len + len <= whole_len);
        memcpy(joined + joined_len, chunk, len);
        joined_len += len;
    }
    kvf_detok_fini(&detok);
    assert_int_equal(joined_len, whole_len);
    assert_memory_equal(joined, whole, whole_len);
    free(joined);
    free(whole);
}

/* The ids of each byte's symbol: the worst split of multi-byte characters. */
static uint32_t *byte_ids(const kvf_tokenizer_t *tok, const char *text, size_t *n_p)
{
    size_t n = strlen(text);
    uint32_t *ids = malloc(n * sizeof(*ids) + 1);
    for (size_t i = 0; i < n; i++) {
        bool found = false;
        for (uint32_t id = 0; id < 256 && !found; id++) {
            size_t len;
            const uint8_t *b = kvf_tokenizer_token_bytes(tok, id, &len);
            if (len == 1 && b[0] == (uint8_t)text[i]) {
                ids[i] = id;
                found = true;
            }
        }
        assert_true(found);
    }
    *n_p = n;
    return ids;
}

static void test_streaming(void **state)
{
    fixture_t *fx = *state;
    for (const cJSON *c = cases(fx)->child; c; c = c->next) {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        uint32_t *ids;
        size_t n;
        assert_int_equal(kvf_tokenizer_encode(fx->tok, text, strlen(text), true, &ids, &n), KVF_OK);
        check_stream(fx->tok, ids, n);
        free(ids);
        ids = byte_ids(fx->tok, text, &n);
        check_stream(fx->tok, ids, n);
        free(ids);
    }
    /* emoji and CJK split byte by byte: nothing comes out mid-character */
    const char *text = "\xf0\x9f\x99\x82\xe4\xb8\xad"; /* 🙂中 */
    size_t n;
    uint32_t *ids = byte_ids(fx->tok, text, &n);
    kvf_detok_t detok;
    kvf_detok_init(&detok, fx->tok);
    const char *chunk;
    size_t len;
    size_t expect[7] = {0, 0, 0, 4, 0, 0, 3};
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(kvf_detok_push(&detok, ids[i], &chunk, &len), KVF_OK);
        assert_int_equal(len, expect[i]);
    }
    assert_int_equal(kvf_detok_flush(&detok, &chunk, &len), KVF_OK);
    assert_int_equal(len, 0);
    /* a truncated character at the end becomes U+FFFD on flush */
    assert_int_equal(kvf_detok_push(&detok, ids[0], &chunk, &len), KVF_OK);
    assert_int_equal(kvf_detok_push(&detok, ids[1], &chunk, &len), KVF_OK);
    assert_int_equal(len, 0);
    assert_int_equal(kvf_detok_flush(&detok, &chunk, &len), KVF_OK);
    assert_string_equal(chunk, "\xef\xbf\xbd");
    /* a broken sequence is replaced at once, the next character kept */
    assert_int_equal(kvf_detok_push(&detok, ids[0], &chunk, &len), KVF_OK);
    assert_int_equal(kvf_detok_push(&detok, ids[6 - 2], &chunk, &len), KVF_OK); /* 0xe4 */
    assert_string_equal(chunk, "\xef\xbf\xbd");
    assert_int_equal(kvf_detok_push(&detok, 220, &chunk, &len), KVF_OK); /* ' ' */
    assert_string_equal(chunk, "\xef\xbf\xbd ");
    /* an id the tokenizer does not know emits nothing */
    assert_int_equal(kvf_detok_push(&detok, 999999, &chunk, &len), KVF_OK);
    assert_int_equal(len, 0);
    kvf_detok_fini(&detok);
    free(ids);
}

static void test_special_inside_text(void **state)
{
    fixture_t *fx = *state;
    const char *text = "<|begin_of_text|>hi<|end_of_text|><|end_of_text|>";
    uint32_t *ids;
    size_t n;
    assert_int_equal(kvf_tokenizer_encode(fx->tok, text, strlen(text), false, &ids, &n), KVF_OK);
    assert_true(n >= 4);
    assert_int_equal(ids[0], 510);
    assert_int_equal(ids[n - 1], 511);
    assert_int_equal(ids[n - 2], 511);
    char *back;
    assert_int_equal(kvf_tokenizer_decode(fx->tok, ids, n, &back, NULL), KVF_OK);
    assert_string_equal(back, text);
    free(back);
    free(ids);
    /* a partial special token is plain text */
    text = "<|end_of_tex";
    assert_int_equal(kvf_tokenizer_encode(fx->tok, text, strlen(text), false, &ids, &n), KVF_OK);
    for (size_t i = 0; i < n; i++)
        assert_true(ids[i] < 510);
    free(ids);
}

static void test_empty(void **state)
{
    fixture_t *fx = *state;
    uint32_t *ids = NULL;
    size_t n = 99;
    assert_int_equal(kvf_tokenizer_encode(fx->tok, "", 0, false, &ids, &n), KVF_OK);
    assert_non_null(ids);
    assert_int_equal(n, 0);
    free(ids);
    assert_int_equal(kvf_tokenizer_encode(fx->tok, NULL, 0, true, &ids, &n), KVF_OK);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 510);
    free(ids);
    char *text;
    size_t len = 99;
    assert_int_equal(kvf_tokenizer_decode(fx->tok, NULL, 0, &text, &len), KVF_OK);
    assert_int_equal(len, 0);
    assert_string_equal(text, "");
    free(text);
}

static void test_hostile_input(void **state)
{
    fixture_t *fx = *state;
    /* invalid UTF-8 still encodes, byte for byte */
    const char text[] = "ok \xff\xfe caf\xc3 \xe4\xb8 end\xf0\x9f";
    size_t text_len = sizeof(text) - 1;
    uint32_t *ids;
    size_t n;
    assert_int_equal(kvf_tokenizer_encode(fx->tok, text, text_len, false, &ids, &n), KVF_OK);
    char raw[64];
    size_t raw_len = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const uint8_t *b = kvf_tokenizer_token_bytes(fx->tok, ids[i], &len);
        assert_non_null(b);
        assert_true(raw_len + len <= sizeof(raw));
        memcpy(raw + raw_len, b, len);
        raw_len += len;
    }
    assert_int_equal(raw_len, text_len);
    assert_memory_equal(raw, text, text_len);
    char *out;
    size_t len;
    assert_int_equal(kvf_tokenizer_decode(fx->tok, ids, n, &out, &len), KVF_OK);
    assert_int_equal(kvf_utf8_valid_prefix((const uint8_t *)out, len), len);
    assert_string_equal(out, "ok \xef\xbf\xbd\xef\xbf\xbd caf\xef\xbf\xbd \xef\xbf\xbd end"
                             "\xef\xbf\xbd");
    free(out);
    free(ids);
    /* NUL bytes are text too */
    assert_int_equal(kvf_tokenizer_encode(fx->tok, "a\0b", 3, false, &ids, &n), KVF_OK);
    assert_int_equal(n, 3);
    free(ids);
    /* ids beyond the vocabulary (a model with a larger embedding) decode to nothing */
    uint32_t odd[] = {39, 512, 70000, UINT32_MAX, 68};
    assert_int_equal(kvf_tokenizer_decode(fx->tok, odd, 5, &out, &len), KVF_OK);
    assert_string_equal(out, "He");
    free(out);
}

static void test_long_text_speed(void **state)
{
    fixture_t *fx = *state;
    /* 200 KB of mixed text with one 40 KB word without spaces (one regex
     * piece: BPE must not go quadratic on it) */
    const char *parts[] = {"The cache line is 64 bytes. ", "don't stop\n\n", "中文字符测试 ",
                           "emoji 🙂🚀 ", "  spaces   here\t"};
    size_t cap = 220 * 1024, len = 0;
    char *text = malloc(cap + 1);
    for (size_t i = 0; len < 160 * 1024; i++) {
        size_t l = strlen(parts[i % 5]);
        memcpy(text + len, parts[i % 5], l);
        len += l;
    }
    for (size_t i = 0; i < 40 * 1024; i++)
        text[len++] = "abcdefgh"[i % 8];
    text[len] = '\0';
    uint64_t t0 = kvf_clock_ns();
    uint32_t *ids;
    size_t n;
    assert_int_equal(kvf_tokenizer_encode(fx->tok, text, len, false, &ids, &n), KVF_OK);
    double secs = (double)(kvf_clock_ns() - t0) / 1e9;
    fprintf(stderr, "encoded %zu bytes into %zu ids in %.3f s\n", len, n, secs);
    assert_true(secs < 2.0 * SLOWDOWN);
    char *back;
    assert_int_equal(kvf_tokenizer_decode(fx->tok, ids, n, &back, NULL), KVF_OK);
    assert_string_equal(back, text);
    free(back);
    free(ids);
    free(text);
}

/* A Llama 3 style file: Sequence[Split(regex), ByteLevel(use_regex false)],
 * merges as [left, right] pairs, BOS from the TemplateProcessing
 * post_processor with no tokenizer_config.json. */
static void test_llama3_style(void **state)
{
    fixture_t *fx = *state;
    cJSON *root = load_json(TOK_DIR "/tokenizer.json");
    cJSON *pre = cJSON_Parse(
        "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
        "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| "
        "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},"
        "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":"
        "false,\"trim_offsets\":true,\"use_regex\":false}]}");
    assert_non_null(pre);
    cJSON_ReplaceItemInObject(root, "pre_tokenizer", pre);
    cJSON *model = cJSON_GetObjectItem(root, "model");
    cJSON *pairs = cJSON_CreateArray();
    for (const cJSON *m = cJSON_GetObjectItem(model, "merges")->child; m; m = m->next) {
        char *sp = strchr(m->valuestring, ' ');
        *sp = '\0';
        const char *pair[2] = {m->valuestring, sp + 1};
        cJSON_AddItemToArray(pairs, cJSON_CreateStringArray(pair, 2));
    }
    cJSON_ReplaceItemInObject(model, "merges", pairs);
    char dir[] = "/tmp/kvf-tok-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    char *json = cJSON_PrintUnformatted(root);
    spit(path, json);
    free(json);
    cJSON_Delete(root);

    kvf_tokenizer_t *l3;
    assert_int_equal(kvf_tokenizer_load(dir, &l3), KVF_OK);
    assert_true(kvf_tokenizer_adds_bos(l3));
    assert_int_equal(kvf_tokenizer_bos_id(l3), 510);
    assert_int_equal(kvf_tokenizer_eos_id(l3), -1);
    /* digits go in threes, a letter run keeps its leading punctuation */
    const char *text = "1234567 x,hello";
    uint32_t *ids;
    size_t n;
    assert_int_equal(kvf_tokenizer_encode(l3, text, strlen(text), true, &ids, &n), KVF_OK);
    /* the first four pieces are single GPT-2 pieces too, so the golden
     * tokenizer gives their ids; ",hello" is one piece here (two for GPT-2) */
    const char *pieces[] = {"123", "456", "7", " x"};
    size_t at = 1;
    assert_int_equal(ids[0], 510);
    for (size_t i = 0; i < 4; i++) {
        uint32_t *pids;
        size_t pn;
        assert_int_equal(
            kvf_tokenizer_encode(fx->tok, pieces[i], strlen(pieces[i]), false, &pids, &pn), KVF_OK);
        assert_true(at + pn <= n);
        assert_memory_equal(ids + at, pids, pn * sizeof(*pids));
        at += pn;
        free(pids);
    }
    char *dec;
    assert_int_equal(kvf_tokenizer_decode(l3, ids + at, n - at, &dec, NULL), KVF_OK);
    assert_string_equal(dec, ",hello");
    free(dec);
    free(ids);
    /* every golden case that has no digits or leading punctuation before
     * letters tokenizes the same as with the GPT-2 pattern: check plain words */
    text = "Hello world and more words here";
    uint32_t *a, *b;
    size_t na, nb;
    assert_int_equal(kvf_tokenizer_encode(l3, text, strlen(text), false, &a, &na), KVF_OK);
    assert_int_equal(kvf_tokenizer_encode(fx->tok, text, strlen(text), false, &b, &nb), KVF_OK);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na * sizeof(*a));
    free(a);
    free(b);
    kvf_tokenizer_destroy(l3);
    unlink(path);
    rmdir(dir);
}

typedef struct {
    const kvf_tokenizer_t *tok;
    const char *text;
    const uint32_t *want;
    size_t n_want;
    int mismatches;
} encode_job_t;

static void *encode_repeatedly(void *arg)
{
    encode_job_t *job = arg;
    for (int i = 0; i < 200; i++) {
        uint32_t *ids;
        size_t n;
        if (kvf_tokenizer_encode(job->tok, job->text, strlen(job->text), true, &ids, &n) !=
                KVF_OK ||
            n != job->n_want || memcmp(ids, job->want, n * sizeof(*ids)) != 0)
            job->mismatches++;
        free(ids);
    }
    return NULL;
}

/* The header promises concurrent encodes on one tokenizer. */
static void test_concurrent_encode(void **state)
{
    fixture_t *fx = *state;
    const char *text = "Hello, world! It's 9:30 am \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x99\x82   x\n";
    uint32_t *want;
    size_t n_want;
    assert_int_equal(kvf_tokenizer_encode(fx->tok, text, strlen(text), true, &want, &n_want),
                     KVF_OK);
    pthread_t threads[4];
    encode_job_t jobs[4];
    for (int t = 0; t < 4; t++) {
        jobs[t] = (encode_job_t){fx->tok, text, want, n_want, 0};
        assert_int_equal(pthread_create(&threads[t], NULL, encode_repeatedly, &jobs[t]), 0);
    }
    for (int t = 0; t < 4; t++) {
        pthread_join(threads[t], NULL);
        assert_int_equal(jobs[t].mismatches, 0);
    }
    free(want);
}

/* ignore_merges (a piece that is a whole vocabulary entry is taken as is)
 * and an added token with lstrip/rstrip (it absorbs the spaces around). */
static void test_added_token_options(void **state)
{
    (void)state;
    cJSON *root = load_json(TOK_DIR "/tokenizer.json");
    cJSON *model = cJSON_GetObjectItem(root, "model");
    cJSON_AddNumberToObject(cJSON_GetObjectItem(model, "vocab"), "xyz", 512);
    cJSON_ReplaceItemInObject(model, "ignore_merges", cJSON_CreateTrue());
    cJSON *mask = cJSON_Parse("{\"id\":513,\"content\":\"<mask>\",\"lstrip\":true,"
                              "\"rstrip\":true,\"special\":true}");
    cJSON_AddItemToArray(cJSON_GetObjectItem(root, "added_tokens"), mask);
    char dir[] = "/tmp/kvf-tok-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    char *json = cJSON_PrintUnformatted(root);
    spit(path, json);
    free(json);
    cJSON_Delete(root);
    kvf_tokenizer_t *tok;
    assert_int_equal(kvf_tokenizer_load(dir, &tok), KVF_OK);
    assert_true(kvf_tokenizer_adds_bos(tok)); /* no config: the template decides */
    assert_int_equal(kvf_tokenizer_vocab_size(tok), 514);
    uint32_t *ids;
    size_t n;
    const char *text = "xyz  <mask> xyz";
    assert_int_equal(kvf_tokenizer_encode(tok, text, strlen(text), false, &ids, &n), KVF_OK);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 512); /* "xyz" whole, not x y z */
    assert_int_equal(ids[1], 513);
    assert_int_equal(ids[2], 512);
    free(ids);
    kvf_tokenizer_destroy(tok);
    unlink(path);
    rmdir(dir);
}

static void test_bad_files(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvf-tok-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    kvf_tokenizer_t *tok = NULL;
    kvf_log_level_t saved = kvf_log_level;
    kvf_log_set_level(KVF_LOG_OFF);
    assert_int_equal(kvf_tokenizer_load(dir, &tok), KVF_ERR_NOT_FOUND);
    spit(path, "{not json");
    assert_int_equal(kvf_tokenizer_load(dir, &tok), KVF_ERR_FORMAT);
    spit(path, "{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}");
    assert_int_equal(kvf_tokenizer_load(dir, &tok), KVF_ERR_UNSUPPORTED);
    spit(path, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a c\"]},"
               "\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}");
    assert_int_equal(kvf_tokenizer_load(dir, &tok), KVF_ERR_FORMAT);
    spit(path, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-3},\"merges\":[]},"
               "\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}");
    assert_int_equal(kvf_tokenizer_load(dir, &tok), KVF_ERR_FORMAT);
    spit(path, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
               "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},"
               "\"behavior\":\"Isolated\"}}");
    assert_int_equal(kvf_tokenizer_load(dir, &tok), KVF_ERR_FORMAT);
    spit(path, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
               "\"pre_tokenizer\":{\"type\":\"WhitespaceSplit\"}}");
    assert_int_equal(kvf_tokenizer_load(dir, &tok), KVF_ERR_UNSUPPORTED);
    kvf_log_set_level(saved);
    assert_null(tok);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_special_ids),         cmocka_unit_test(test_golden_cases),
        cmocka_unit_test(test_golden_prompts),      cmocka_unit_test(test_streaming),
        cmocka_unit_test(test_special_inside_text), cmocka_unit_test(test_empty),
        cmocka_unit_test(test_hostile_input),       cmocka_unit_test(test_long_text_speed),
        cmocka_unit_test(test_llama3_style),        cmocka_unit_test(test_added_token_options),
        cmocka_unit_test(test_concurrent_encode),   cmocka_unit_test(test_bad_files),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
