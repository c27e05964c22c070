/* router/chat: each built-in template against the text its Hugging Face
 * Jinja reference renders (add_generation_prompt=True), BOS handling,
 * template recognition from tokenizer_config.json, refusals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "chat.h"
#include "kvf/file.h"

#define CHAT_DATA     KVF_TEST_DATA "/chat_templates"
#define CHAT_MAX_MSGS 16

static char *render(kvf_chat_template_t t, const kvf_chat_message_t *m, size_t n, bool bos)
{
    char *text = NULL, why[300];
    kvf_status_t st = kvf_chat_render(t, m, n, "<s>", "</s>", bos, &text, why, sizeof(why));
    if (st != KVF_OK)
        fail_msg("render: %s", why);
    return text;
}

static void expect(kvf_chat_template_t t, const kvf_chat_message_t *m, size_t n, bool bos,
                   const char *want)
{
    char *got = render(t, m, n, bos);
    assert_string_equal(got, want);
    free(got);
}

static void test_llama3(void **state)
{
    (void)state;
    const kvf_chat_message_t m[] = {{"system", "Be brief."}, {"user", " Hi \n"}};
    char *text = NULL, why[300];
    /* Llama 3 writes bos_token first; contents are trimmed. */
    assert_int_equal(kvf_chat_render(KVF_CHAT_LLAMA3, m, 2, "<|begin_of_text|>", "<|eot_id|>", true,
                                     &text, why, sizeof(why)),
                     KVF_OK);
    assert_string_equal(text, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                              "Be brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
                              "Hi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    free(text);
    /* A tokenizer that adds BOS itself: no BOS in the text (no double BOS). */
    expect(KVF_CHAT_LLAMA3, m + 1, 1, false,
           "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
           "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static void test_chatml_qwen2(void **state)
{
    (void)state;
    const kvf_chat_message_t m[] = {{"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"}};
    expect(KVF_CHAT_CHATML, m, 3, true,
           "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n"
           "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
    /* Qwen2 adds its default system message when there is none... */
    expect(KVF_CHAT_QWEN2, m, 1, true,
           "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
           "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    /* ...and keeps the one given. */
    const kvf_chat_message_t s[] = {{"system", "Terse."}, {"user", "Hi"}};
    expect(KVF_CHAT_QWEN2, s, 2, true,
           "<|im_start|>system\nTerse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
           "<|im_start|>assistant\n");
}

static void test_llama2(void **state)
{
    (void)state;
    const kvf_chat_message_t m[] = {
        {"system", "SYS"}, {"user", "Hi "}, {"assistant", " Hello"}, {"user", "Bye"}};
    expect(KVF_CHAT_LLAMA2, m, 4, true,
           "<s>[INST] <<SYS>>\nSYS\n<</SYS>>\n\nHi [/INST] Hello </s><s>[INST] Bye [/INST]");
    /* The tokenizer adds the first BOS; later turns keep theirs. */
    expect(KVF_CHAT_LLAMA2, m, 4, false,
           "[INST] <<SYS>>\nSYS\n<</SYS>>\n\nHi [/INST] Hello </s><s>[INST] Bye [/INST]");
    expect(KVF_CHAT_LLAMA2, m + 1, 1, true, "<s>[INST] Hi [/INST]");
}

static void test_mistral(void **state)
{
    (void)state;
    const kvf_chat_message_t m[] = {{"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"}};
    expect(KVF_CHAT_MISTRAL, m, 3, true, "<s>[INST] Hi [/INST]Hello</s>[INST] Bye [/INST]");
    expect(KVF_CHAT_MISTRAL, m, 1, false, "[INST] Hi [/INST]");
    const kvf_chat_message_t s[] = {{"system", "SYS"}, {"user", "Hi"}};
    expect(KVF_CHAT_MISTRAL, s, 2, true, "<s>[INST] SYS\n\nHi [/INST]");
}

static void test_refusals(void **state)
{
    (void)state;
    char *text = NULL, why[300];
    const kvf_chat_message_t twice[] = {{"user", "a"}, {"user", "b"}};
    assert_int_equal(
        kvf_chat_render(KVF_CHAT_LLAMA2, twice, 2, "<s>", "</s>", true, &text, why, sizeof(why)),
        KVF_ERR_INVAL);
    assert_non_null(strstr(why, "alternate"));
    assert_int_equal(
        kvf_chat_render(KVF_CHAT_MISTRAL, twice, 2, "<s>", "</s>", true, &text, why, sizeof(why)),
        KVF_ERR_INVAL);
    const kvf_chat_message_t tool[] = {{"tool", "x"}};
    assert_int_equal(
        kvf_chat_render(KVF_CHAT_LLAMA3, tool, 1, NULL, NULL, true, &text, why, sizeof(why)),
        KVF_ERR_INVAL);
    const kvf_chat_message_t late[] = {{"user", "a"}, {"assistant", "b"}, {"system", "c"}};
    assert_int_equal(
        kvf_chat_render(KVF_CHAT_LLAMA2, late, 3, "<s>", "</s>", true, &text, why, sizeof(why)),
        KVF_ERR_INVAL);
    const kvf_chat_message_t only_sys[] = {{"system", "a"}};
    assert_int_equal(kvf_chat_render(KVF_CHAT_MISTRAL, only_sys, 1, "<s>", "</s>", true, &text, why,
                                     sizeof(why)),
                     KVF_ERR_INVAL);
    assert_int_equal(
        kvf_chat_render(KVF_CHAT_CHATML, tool, 0, NULL, NULL, true, &text, why, sizeof(why)),
        KVF_ERR_INVAL);
    assert_int_equal(
        kvf_chat_render(KVF_CHAT_NONE, twice, 1, NULL, NULL, true, &text, why, sizeof(why)),
        KVF_ERR_UNSUPPORTED);
    assert_non_null(strstr(why, "--chat-template"));
    assert_null(text);
}

static void test_names(void **state)
{
    (void)state;
    static const char *const names[] = {"llama3", "chatml", "qwen2", "llama2", "mistral"};
    for (size_t i = 0; i < 5; i++) {
        kvf_chat_template_t t = KVF_CHAT_NONE;
        assert_int_equal(kvf_chat_template_parse(names[i], &t), KVF_OK);
        assert_int_not_equal(t, KVF_CHAT_NONE);
        assert_string_equal(kvf_chat_template_name(t), names[i]);
    }
    kvf_chat_template_t t;
    assert_int_equal(kvf_chat_template_parse("jinja", &t), KVF_ERR_NOT_FOUND);
    assert_int_equal(kvf_chat_template_parse("none", &t), KVF_ERR_NOT_FOUND);
}

/* Excerpts of the templates the model families ship. */
static void test_detect(void **state)
{
    (void)state;
    assert_int_equal(
        kvf_chat_template_detect(
            "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content "
            "= '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ "
            "message['content'] | trim + '<|eot_id|>' %}"),
        KVF_CHAT_LLAMA3);
    assert_int_equal(kvf_chat_template_detect(
                         "{% for message in messages %}{% if loop.first and messages[0]['role'] "
                         "!= 'system' %}{{ '<|im_start|>system\\nYou are a helpful "
                         "assistant.<|im_end|>\\n' }}{% endif %}"),
                     KVF_CHAT_QWEN2);
    assert_int_equal(kvf_chat_template_detect("{% for message in messages %}{{'<|im_start|>' + "
                                              "message['role'] + '\\n' + message['content']"),
                     KVF_CHAT_CHATML);
    assert_int_equal(kvf_chat_template_detect("{% if loop.index0 == 0 and system_message != "
                                              "false %}{% set content = '<<SYS>>\\n' + "
                                              "system_message %}{{ bos_token + '[INST] ' }}"),
                     KVF_CHAT_LLAMA2);
    assert_int_equal(kvf_chat_template_detect("{{ bos_token }}{% for message in messages %}{{ "
                                              "'[INST] ' + message['content'] + ' [/INST]' }}"),
                     KVF_CHAT_MISTRAL);
    assert_int_equal(kvf_chat_template_detect("{{ messages }}"), KVF_CHAT_NONE);
    assert_int_equal(kvf_chat_template_detect(NULL), KVF_CHAT_NONE);
}

static void write_config(const char *dir, const char *json)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(json, f);
    fclose(f);
}

static void test_load(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvf-test-chat-XXXXXX";
    assert_non_null(mkdtemp(dir));
    kvf_chat_template_t t = KVF_CHAT_LLAMA3;
    /* No tokenizer_config.json: no template, not an error. */
    assert_int_equal(kvf_chat_template_load(dir, &t), KVF_OK);
    assert_int_equal(t, KVF_CHAT_NONE);
    write_config(dir, "{\"bos_token\": \"<s>\"}");
    assert_int_equal(kvf_chat_template_load(dir, &t), KVF_OK);
    assert_int_equal(t, KVF_CHAT_NONE);
    write_config(dir, "{\"chat_template\": \"{{ '<|im_start|>' + message['role'] }}\"}");
    assert_int_equal(kvf_chat_template_load(dir, &t), KVF_OK);
    assert_int_equal(t, KVF_CHAT_CHATML);
    /* A list of named templates: "default" serves chat. */
    write_config(dir, "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": "
                      "\"<|im_start|>\"}, {\"name\": \"default\", \"template\": "
                      "\"<|start_header_id|> <|eot_id|>\"}]}");
    assert_int_equal(kvf_chat_template_load(dir, &t), KVF_OK);
    assert_int_equal(t, KVF_CHAT_LLAMA3);
    write_config(dir, "{\"chat_template\": ");
    assert_int_equal(kvf_chat_template_load(dir, &t), KVF_ERR_FORMAT);
    char path[512];
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    unlink(path);
    rmdir(dir);
}

/* The published templates of tests/data/chat_templates/ and what
 * kvf_chat_template_detect() must make of each. */
static const struct {
    const char *file;
    kvf_chat_template_t want;
} chat_files[] = {
    {"llama2", KVF_CHAT_LLAMA2},
    {"llama3", KVF_CHAT_LLAMA3},
    {"llama3_1", KVF_CHAT_LLAMA3_1},
    {"mistral_v0_1", KVF_CHAT_MISTRAL_V0_1},
    {"mistral_v0_2", KVF_CHAT_MISTRAL_V0_2},
    {"mistral_v0_3", KVF_CHAT_MISTRAL_V0_3},
    {"qwen2_5", KVF_CHAT_QWEN2_5},
    {"qwen3", KVF_CHAT_QWEN3},
    {"gemma", KVF_CHAT_GEMMA},
    {"gemma2", KVF_CHAT_GEMMA},
};
#define N_CHAT_FILES (sizeof(chat_files) / sizeof(chat_files[0]))

static char *read_data(const char *name)
{
    char path[512], *data = NULL;
    size_t len;
    snprintf(path, sizeof(path), "%s/%s", CHAT_DATA, name);
    if (kvf_file_read(path, 1u << 22, &data, &len) != KVF_OK)
        fail_msg("cannot read %s", path);
    return data;
}

static kvf_chat_template_t template_of_file(const char *file)
{
    for (size_t i = 0; i < N_CHAT_FILES; i++)
        if (!strcmp(chat_files[i].file, file))
            return chat_files[i].want;
    fail_msg("expected.json names an unknown template file %s", file);
    return KVF_CHAT_NONE;
}

/* Every committed template, as a string and through tokenizer_config.json. */
static void test_detect_published(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvf-test-chat-XXXXXX", path[512];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    for (size_t i = 0; i < N_CHAT_FILES; i++) {
        char name[64];
        snprintf(name, sizeof(name), "%s.jinja", chat_files[i].file);
        char *jinja = read_data(name);
        kvf_chat_template_t got = kvf_chat_template_detect(jinja);
        if (got != chat_files[i].want)
            fail_msg("%s: detected %s, want %s", name, kvf_chat_template_name(got),
                     kvf_chat_template_name(chat_files[i].want));
        cJSON *cfg = cJSON_CreateObject();
        cJSON_AddStringToObject(cfg, "chat_template", jinja);
        char *json = cJSON_PrintUnformatted(cfg);
        write_config(dir, json);
        kvf_chat_template_t loaded = KVF_CHAT_NONE;
        assert_int_equal(kvf_chat_template_load(dir, &loaded), KVF_OK);
        assert_int_equal(loaded, chat_files[i].want);
        cJSON_free(json);
        cJSON_Delete(cfg);
        free(jinja);
    }
    unlink(path);
    rmdir(dir);
}

/* s with every occurrence of from replaced by to (malloc'd). */
static char *replace_all(const char *s, const char *from, const char *to)
{
    size_t nf = strlen(from), nt = strlen(to), ns = strlen(s), count = 0;
    assert_true(nf > 0);
    for (size_t i = 0; i + nf <= ns; i += memcmp(s + i, from, nf) ? 1 : nf)
        count += !memcmp(s + i, from, nf);
    char *out = malloc(ns + count * nt + 1);
    assert_non_null(out);
    size_t o = 0;
    for (size_t i = 0; i < ns;) {
        if (i + nf <= ns && !memcmp(s + i, from, nf)) {
            memcpy(out + o, to, nt);
            o += nt;
            i += nf;
        } else {
            out[o++] = s[i++];
        }
    }
    out[o] = '\0';
    return out;
}

/* Other revisions of the published templates are recognised too: markers,
 * not the exact text. */
static void test_detect_revisions(void **state)
{
    (void)state;
    static const struct {
        const char *file, *from, *to;
        kvf_chat_template_t want;
    } revisions[] = {
        /* gemma-7b-it's first revision had no leading bos_token */
        {"gemma", "{{ bos_token }}", "", KVF_CHAT_GEMMA},
        /* Llama 3.2 takes today's date from strftime_now */
        {"llama3_1", "{%- set date_string = \"26 Jul 2024\" %}",
         "{%- set date_string = strftime_now(\"%d %b %Y\") %}", KVF_CHAT_LLAMA3_1},
        /* the same templates without their line breaks and indentation */
        {"mistral_v0_3", "\n    ", "", KVF_CHAT_MISTRAL_V0_3},
        {"mistral_v0_2", "\n    ", "", KVF_CHAT_MISTRAL_V0_2},
        {"qwen3", "\n    ", "", KVF_CHAT_QWEN3},
        /* double instead of single quotes */
        {"mistral_v0_1", "'", "\"", KVF_CHAT_MISTRAL_V0_1},
        {"llama2", "'", "\"", KVF_CHAT_LLAMA2},
    };
    for (size_t i = 0; i < sizeof(revisions) / sizeof(revisions[0]); i++) {
        char name[64];
        snprintf(name, sizeof(name), "%s.jinja", revisions[i].file);
        char *jinja = read_data(name);
        assert_non_null(strstr(jinja, revisions[i].from));
        char *edited = replace_all(jinja, revisions[i].from, revisions[i].to);
        kvf_chat_template_t got = kvf_chat_template_detect(edited);
        if (got != revisions[i].want)
            fail_msg("%s edited (%zu): detected %s, want %s", name, i, kvf_chat_template_name(got),
                     kvf_chat_template_name(revisions[i].want));
        free(edited);
        free(jinja);
    }
}

static const cJSON *find_named(const cJSON *list, const char *key, const char *name)
{
    const cJSON *item;
    cJSON_ArrayForEach(item, list)
    {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(item, key);
        if (cJSON_IsString(n) && !strcmp(n->valuestring, name))
            return item;
    }
    fail_msg("expected.json: no %s %s", key, name);
    return NULL;
}

static const char *token_of(const cJSON *tmpl, const char *key)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(tmpl, key);
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

static size_t messages_of(const cJSON *conv, kvf_chat_message_t *msgs)
{
    size_t n = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, cJSON_GetObjectItemCaseSensitive(conv, "messages"))
    {
        assert_true(n < CHAT_MAX_MSGS);
        msgs[n].role = cJSON_GetObjectItemCaseSensitive(m, "role")->valuestring;
        msgs[n].content = cJSON_GetObjectItemCaseSensitive(m, "content")->valuestring;
        n++;
    }
    return n;
}

/* One reference rendering: the same text byte for byte (and without the
 * leading BOS when the tokenizer adds it), or the same refusal. */
static void check_rendering(const cJSON *root, const cJSON *r)
{
    const char *file = cJSON_GetObjectItemCaseSensitive(r, "template")->valuestring;
    const char *conv = cJSON_GetObjectItemCaseSensitive(r, "conversation")->valuestring;
    const cJSON *tmpl =
        find_named(cJSON_GetObjectItemCaseSensitive(root, "templates"), "name", file);
    const char *bos = token_of(tmpl, "bos_token"), *eos = token_of(tmpl, "eos_token");
    kvf_chat_message_t msgs[CHAT_MAX_MSGS];
    size_t n = messages_of(
        find_named(cJSON_GetObjectItemCaseSensitive(root, "conversations"), "name", conv), msgs);
    const cJSON *want = cJSON_GetObjectItemCaseSensitive(r, "text");
    const cJSON *error = cJSON_GetObjectItemCaseSensitive(r, "error");
    /* Where Python's Jinja2 (what transformers runs) renders otherwise than
     * the JavaScript engine, kvferry follows Jinja2. */
    if (cJSON_GetObjectItemCaseSensitive(r, "jinja2_text") ||
        cJSON_GetObjectItemCaseSensitive(r, "jinja2_error")) {
        want = cJSON_GetObjectItemCaseSensitive(r, "jinja2_text");
        error = cJSON_GetObjectItemCaseSensitive(r, "jinja2_error");
    }
    kvf_chat_template_t t = template_of_file(file);
    for (int leading_bos = 1; leading_bos >= 0; leading_bos--) {
        char *text = NULL, why[300] = "";
        kvf_status_t st =
            kvf_chat_render(t, msgs, n, bos, eos, leading_bos, &text, why, sizeof(why));
        if (cJSON_IsString(error)) {
            if (st != KVF_ERR_INVAL || !strstr(why, error->valuestring))
                fail_msg("%s / %s: want the refusal '%s', got %d '%s'", file, conv,
                         error->valuestring, st, why);
            continue;
        }
        assert_true(cJSON_IsString(want));
        if (st != KVF_OK)
            fail_msg("%s / %s: refused: %s", file, conv, why);
        const char *expect = want->valuestring;
        if (!leading_bos && bos && !strncmp(expect, bos, strlen(bos)))
            expect += strlen(bos);
        if (strcmp(text, expect))
            fail_msg("%s / %s (leading_bos %d):\n got: %s\nwant: %s", file, conv, leading_bos, text,
                     expect);
        free(text);
    }
}

/* Every (template, conversation) of expected.json, rendered by the
 * Hugging Face Jinja engine from the published templates. */
static void test_published_renderings(void **state)
{
    (void)state;
    char *data = read_data("expected.json");
    cJSON *root = cJSON_Parse(data);
    free(data);
    assert_non_null(root);
    size_t count = 0, refused = 0;
    const cJSON *r;
    cJSON_ArrayForEach(r, cJSON_GetObjectItemCaseSensitive(root, "renderings"))
    {
        check_rendering(root, r);
        count++;
        refused += cJSON_GetObjectItemCaseSensitive(r, "error") != NULL;
    }
    /* Every template file over every conversation, some refused. */
    assert_int_equal(count,
                     N_CHAT_FILES * (size_t)cJSON_GetArraySize(
                                        cJSON_GetObjectItemCaseSensitive(root, "conversations")));
    assert_true(refused > 0 && refused < count);
    cJSON_Delete(root);
}

static void test_all_names(void **state)
{
    (void)state;
    static const char *const names[] = {"llama3",       "llama3.1",     "chatml",       "qwen2",
                                        "qwen2.5",      "qwen3",        "llama2",       "mistral",
                                        "mistral-v0.1", "mistral-v0.2", "mistral-v0.3", "gemma"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        kvf_chat_template_t t = KVF_CHAT_NONE;
        assert_int_equal(kvf_chat_template_parse(names[i], &t), KVF_OK);
        assert_int_not_equal(t, KVF_CHAT_NONE);
        assert_string_equal(kvf_chat_template_name(t), names[i]);
        assert_non_null(strstr(KVF_CHAT_TEMPLATE_NAMES, names[i]));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama3),
        cmocka_unit_test(test_chatml_qwen2),
        cmocka_unit_test(test_llama2),
        cmocka_unit_test(test_mistral),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_detect),
        cmocka_unit_test(test_load),
        cmocka_unit_test(test_detect_published),
        cmocka_unit_test(test_detect_revisions),
        cmocka_unit_test(test_published_renderings),
        cmocka_unit_test(test_all_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
