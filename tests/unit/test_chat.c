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

#include <cmocka.h>

#include "chat.h"

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama3),   cmocka_unit_test(test_chatml_qwen2),
        cmocka_unit_test(test_llama2),   cmocka_unit_test(test_mistral),
        cmocka_unit_test(test_refusals), cmocka_unit_test(test_names),
        cmocka_unit_test(test_detect),   cmocka_unit_test(test_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
