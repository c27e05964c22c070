/* router/openai without sockets: request bodies parsed into the router's
 * generation request (prompt or ids and the one Sampling message, with
 * the API's defaults), chat messages rendered with a template, refused
 * options and ill-typed fields with their OpenAI error, statuses mapped to
 * HTTP errors, and the responses and stream events rendered (checked by
 * parsing them back). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "openai.h"

static const kvf_openai_server_t srv = {
    .model_name = "m",
    .chat = KVF_CHAT_CHATML,
    .bos_text = "<s>",
    .eos_text = "</s>",
    .leading_bos = false,
};

/* Parses body as a completions (or chat) request; it must succeed. */
static void parse_ok(const char *body, bool chat, kvf_openai_request_t *req)
{
    kvf_openai_error_t err;
    if (!kvf_openai_parse(&srv, chat, body, strlen(body), req, &err))
        fail_msg("%s: %s", body, err.message);
}

/* Parses body; it must be refused with code and, when given, param. */
static void parse_refused(const char *body, bool chat, unsigned code, const char *param)
{
    kvf_openai_request_t req;
    kvf_openai_error_t err;
    if (kvf_openai_parse(&srv, chat, body, strlen(body), &req, &err))
        fail_msg("accepted: %s", body);
    kvf_openai_request_fini(&req);
    assert_int_equal(err.code, code);
    assert_true(err.message[0] != '\0');
    if (param) {
        if (!err.param || strcmp(err.param, param))
            fail_msg("%s: param %s, want %s", body, err.param ? err.param : "null", param);
    }
}

static void test_defaults(void **state)
{
    (void)state;
    kvf_openai_request_t req;
    parse_ok("{\"prompt\": \"hello\"}", false, &req);
    assert_string_equal(req.prompt, "hello");
    assert_int_equal(req.n_ids, 0);
    assert_false(req.stream);
    assert_false(req.chat);
    const Kvf__Sampling *s = &req.sampling;
    assert_true(s->temperature == 1.0f);
    assert_true(s->top_p == 1.0f);
    assert_int_equal(s->top_k, 0);
    assert_int_equal(s->max_tokens, 0); /* the router's default */
    assert_false(s->has_seed);
    assert_false(s->ignore_eos);
    assert_int_equal(s->n_stop, 0);
    kvf_router_gen_t gen;
    kvf_openai_request_gen(&req, &gen);
    assert_ptr_equal(gen.prompt, req.prompt);
    assert_ptr_equal(gen.sampling, &req.sampling);
    assert_int_equal(gen.n_ids, 0);
    kvf_openai_request_fini(&req);
}

static void test_sampling_fields(void **state)
{
    (void)state;
    kvf_openai_request_t req;
    parse_ok("{\"prompt\": [1, 2, 3], \"max_tokens\": 9, \"temperature\": 0, \"top_p\": 0.5, "
             "\"top_k\": 40, \"seed\": -3, \"ignore_eos\": true, \"stop\": [\"a\", \"bc\"], "
             "\"stream\": true, \"stream_options\": {\"include_usage\": true}, "
             "\"model\": \"m\", \"presence_penalty\": 0, \"logprobs\": false, \"n\": 1}",
             false, &req);
    assert_null(req.prompt);
    assert_int_equal(req.n_ids, 3);
    assert_int_equal(req.ids[2], 3);
    assert_true(req.stream);
    assert_true(req.include_usage);
    const Kvf__Sampling *s = &req.sampling;
    assert_int_equal(s->max_tokens, 9);
    assert_true(s->temperature == 0.0f);
    assert_true(s->top_p == 0.5f);
    assert_int_equal(s->top_k, 40);
    assert_true(s->has_seed);
    assert_true(s->seed == (uint64_t)-3);
    assert_true(s->ignore_eos);
    assert_int_equal(s->n_stop, 2);
    assert_string_equal(s->stop[0], "a");
    assert_string_equal(s->stop[1], "bc");
    /* The message is a real one: it passes the router's check. */
    char why[128];
    assert_int_equal(kvf_sampling_msg_check(s, 1000, why, sizeof(why)), KVF_OK);
    kvf_openai_request_fini(&req);

    parse_ok("{\"prompt\": \"x\", \"stop\": \"END\", \"top_k\": -1, \"include_usage\": 1}", false,
             &req);
    assert_int_equal(req.sampling.n_stop, 1);
    assert_string_equal(req.sampling.stop[0], "END");
    assert_int_equal(req.sampling.top_k, 0);
    assert_false(req.include_usage); /* only with stream */
    kvf_openai_request_fini(&req);
}

static void test_chat(void **state)
{
    (void)state;
    kvf_openai_request_t req;
    parse_ok("{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": "
             "\"user\", \"content\": [{\"type\": \"text\", \"text\": \"Hi\"}]}], "
             "\"max_completion_tokens\": 5}",
             true, &req);
    assert_true(req.chat);
    assert_int_equal(req.sampling.max_tokens, 5);
    assert_string_equal(req.prompt, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
                                    "Hi<|im_end|>\n<|im_start|>assistant\n");
    kvf_openai_request_fini(&req);

    kvf_openai_server_t none = srv;
    none.chat = KVF_CHAT_NONE;
    const char *body = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}";
    kvf_openai_error_t err;
    assert_false(kvf_openai_parse(&none, true, body, strlen(body), &req, &err));
    kvf_openai_request_fini(&req);
    assert_string_equal(err.param, "messages");
    assert_non_null(strstr(err.message, "chat template"));
}

/* U+0000 in a prompt or a message (\u0000 in the JSON) is kept with what
 * follows it (router/json_nul.h; it was cut off there before); "\\u0000"
 * is a backslash and text; a stop string cannot hold it; a body holding
 * both \u0000 and a C0 byte of its own is refused. */
static void test_prompt_with_nul(void **state)
{
    (void)state;
    kvf_openai_request_t req;
    parse_ok("{\"prompt\": \"a\\u0000b\\u0000\", \"stop\": \"x\"}", false, &req);
    assert_int_equal(req.prompt_len, 4);
    assert_memory_equal(req.prompt, "a\0b\0", 5);
    kvf_router_gen_t gen;
    kvf_openai_request_gen(&req, &gen);
    assert_int_equal(gen.prompt_len, 4);
    kvf_openai_request_fini(&req);
    parse_ok("{\"prompt\": \"\\u0000\"}", false, &req);
    assert_int_equal(req.prompt_len, 1);
    assert_int_equal(req.prompt[0], '\0');
    kvf_openai_request_fini(&req);
    parse_ok("{\"prompt\": \"c:\\\\u0000 \\u00e9\"}", false, &req);
    assert_string_equal(req.prompt, "c:\\u0000 \xc3\xa9");
    assert_int_equal(req.prompt_len, strlen(req.prompt));
    kvf_openai_request_fini(&req);
    parse_ok("{\"messages\": [{\"role\": \"user\", \"content\": \"zero\\u0000byte\"}]}", true,
             &req);
    const char want[] = "<|im_start|>user\nzero\0byte<|im_end|>\n<|im_start|>assistant\n";
    assert_int_equal(req.prompt_len, sizeof(want) - 1);
    assert_memory_equal(req.prompt, want, sizeof(want));
    kvf_openai_request_fini(&req);
    parse_refused("{\"prompt\": \"x\", \"stop\": [\"a\\u0000\"]}", false, 400, "stop");
    parse_refused("{\"prompt\": \"\\u0000\xc0\x80\"}", false, 400, NULL);
}

static void test_refused(void **state)
{
    (void)state;
    parse_refused("{\"prompt\": \"hi\",", false, 400, NULL);
    parse_refused("[1]", false, 400, NULL);
    parse_refused("{}", false, 400, "prompt");
    parse_refused("{\"prompt\": [\"a\", \"b\"]}", false, 400, "prompt");
    parse_refused("{\"prompt\": [1, -1]}", false, 400, "prompt");
    parse_refused("{\"prompt\": \"x\", \"max_tokens\": 0}", false, 400, "max_tokens");
    parse_refused("{\"prompt\": \"x\", \"temperature\": 3}", false, 400, "temperature");
    parse_refused("{\"prompt\": \"x\", \"top_p\": \"a\"}", false, 400, "top_p");
    parse_refused("{\"prompt\": \"x\", \"seed\": 1.5}", false, 400, "seed");
    parse_refused("{\"prompt\": \"x\", \"ignore_eos\": 1}", false, 400, "ignore_eos");
    parse_refused("{\"prompt\": \"x\", \"stop\": [\"\"]}", false, 400, "stop");
    parse_refused("{\"prompt\": \"x\", \"stop\": [\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\","
                  "\"8\",\"9\"]}",
                  false, 400, "stop");
    parse_refused("{\"prompt\": \"x\", \"n\": 2}", false, 400, "n");
    parse_refused("{\"prompt\": \"x\", \"model\": \"other\"}", false, 400, "model");
    parse_refused("{\"prompt\": \"x\", \"frequency_penalty\": 0.5}", false, 400,
                  "frequency_penalty");
    parse_refused("{\"prompt\": \"x\", \"best_of\": 2}", false, 400, "best_of");
    parse_refused("{\"prompt\": \"x\", \"suffix\": \"s\"}", false, 400, "suffix");
    parse_refused("{\"prompt\": \"x\", \"tools\": [{}]}", false, 400, "tools");
    parse_refused("{\"prompt\": \"x\", \"logit_bias\": {\"1\": 2}}", false, 400, "logit_bias");
    parse_refused("{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_object\"}}", false,
                  400, "response_format");
    parse_refused("{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", true, 400, "messages");
    parse_refused("{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}", true, 400,
                  "messages");
}

/* cache_salt: a non-empty string of at most KVF_CACHE_SALT_MAX bytes,
 * handed to the router's request; anything else is a 400 naming it. */
static void test_cache_salt(void **state)
{
    (void)state;
    kvf_openai_request_t req;
    parse_ok("{\"prompt\": \"hi\", \"cache_salt\": \"tenant-7\"}", false, &req);
    kvf_router_gen_t gen;
    kvf_openai_request_gen(&req, &gen);
    assert_int_equal(gen.cache_salt_len, 8);
    assert_memory_equal(gen.cache_salt, "tenant-7", 8);
    kvf_openai_request_fini(&req);
    parse_ok("{\"prompt\": \"hi\"}", false, &req);
    kvf_openai_request_gen(&req, &gen);
    assert_null(gen.cache_salt);
    assert_int_equal(gen.cache_salt_len, 0);
    kvf_openai_request_fini(&req);
    parse_refused("{\"prompt\": \"hi\", \"cache_salt\": 7}", false, 400, "cache_salt");
    parse_refused("{\"prompt\": \"hi\", \"cache_salt\": \"\"}", false, 400, "cache_salt");
    char body[600];
    snprintf(body, sizeof(body), "{\"prompt\": \"hi\", \"cache_salt\": \"%0*d\"}",
             KVF_CACHE_SALT_MAX + 1, 0);
    parse_refused(body, false, 400, "cache_salt");
    /* U+0000 is one byte of the salt, which keeps its length */
    parse_ok("{\"prompt\": \"hi\", \"cache_salt\": \"a\\u0000b\"}", false, &req);
    kvf_openai_request_gen(&req, &gen);
    assert_int_equal(gen.cache_salt_len, 3);
    assert_memory_equal(gen.cache_salt, "a\0b", 3);
    kvf_openai_request_fini(&req);
}

/* JSON is UTF-8: a body that is not (in a string or outside one) is a 400
 * that says where; the strings a request names (the model) never hold
 * U+0000 unnoticed. */
static void test_invalid_utf8(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "{\"prompt\": \"caf\xe9\"}",               /* Latin-1 */
        "{\"prompt\": \"ab\xc3\"}",                /* a cut character */
        "{\"prompt\": \"\xc0\xaf\"}",              /* overlong */
        "{\"prompt\": \"\xed\xa0\x80\"}",          /* a surrogate */
        "{\"prompt\": \"\xf4\x90\x80\x80\"}",      /* above U+10FFFF */
        "{\"prompt\": \"x\", \"stop\": \"\xff\"}", /* a stop string */
        "{\"messages\": [{\"role\": \"user\", \"content\": \"\x80\"}]}",
        "{\"prompt\": \"x\", \"model\": \"m\xfe\"}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kvf_openai_request_t req;
        kvf_openai_error_t err;
        bool chat = strstr(bad[i], "messages") != NULL;
        if (kvf_openai_parse(&srv, chat, bad[i], strlen(bad[i]), &req, &err))
            fail_msg("accepted: %s", bad[i]);
        kvf_openai_request_fini(&req);
        assert_int_equal(err.code, 400);
        if (!strstr(err.message, "not valid UTF-8"))
            fail_msg("%zu: %s", i, err.message);
    }
    /* where it is: the byte offset of the first bad byte */
    kvf_openai_request_t req;
    kvf_openai_error_t err;
    const char *body = "{\"prompt\": \"caf\xe9\"}";
    assert_false(kvf_openai_parse(&srv, false, body, strlen(body), &req, &err));
    kvf_openai_request_fini(&req);
    assert_non_null(strstr(err.message, "at byte 15 of 18"));
    /* valid multi-byte text and escapes pass */
    parse_ok("{\"prompt\": \"caf\xc3\xa9 \xf0\x9f\x98\x80 \\ud83d\\ude00\"}", false, &req);
    assert_string_equal(req.prompt, "caf\xc3\xa9 \xf0\x9f\x98\x80 \xf0\x9f\x98\x80");
    kvf_openai_request_fini(&req);
    /* lone surrogate escapes are not JSON text cJSON takes */
    parse_refused("{\"prompt\": \"\\ud800x\"}", false, 400, NULL);
    parse_refused("{\"prompt\": \"\\udc00\"}", false, 400, NULL);
    /* a model name holding U+0000 is refused as such, not cut at it */
    kvf_openai_request_t r2;
    body = "{\"prompt\": \"x\", \"model\": \"m\\u0000junk\"}";
    assert_false(kvf_openai_parse(&srv, false, body, strlen(body), &r2, &err));
    kvf_openai_request_fini(&r2);
    assert_string_equal(err.param, "model");
    assert_non_null(strstr(err.message, "U+0000"));
}

static void test_request_errors(void **state)
{
    (void)state;
    static const struct {
        kvf_status_t status;
        bool unhealthy;
        unsigned code;
        const char *errcode;
    } cases[] = {
        {KVF_ERR_INVAL, false, 400, NULL},
        {KVF_ERR_TOO_BIG, false, 400, "context_length_exceeded"},
        {KVF_ERR_NO_SPACE, false, 429, "overloaded"},
        {KVF_ERR_NO_SPACE, true, 503, "service_unavailable"},
        {KVF_ERR_NOMEM, false, 503, "service_unavailable"},
        {KVF_ERR_TIMEOUT, false, 504, "timeout"},
        {KVF_ERR_PEER, false, 500, NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kvf_openai_error_t err;
        kvf_openai_request_error(cases[i].status, cases[i].unhealthy, "why", &err);
        assert_int_equal(err.code, cases[i].code);
        if (cases[i].errcode)
            assert_string_equal(err.errcode, cases[i].errcode);
        else
            assert_null(err.errcode);
        assert_string_equal(err.message, "why");
    }
    kvf_openai_error_t err;
    kvf_openai_request_error(KVF_ERR_TIMEOUT, false, NULL, &err);
    assert_string_equal(err.message, kvf_status_str(KVF_ERR_TIMEOUT));
    cJSON *j = kvf_openai_error_json(&err);
    const cJSON *e = cJSON_GetObjectItem(j, "error");
    assert_string_equal(cJSON_GetObjectItem(e, "type")->valuestring, "server_error");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(e, "param")));
    assert_string_equal(cJSON_GetObjectItem(e, "code")->valuestring, "timeout");
    cJSON_Delete(j);
}

static const kvf_openai_reply_t reply = {.id = "cmpl-1", .created = 42, .model = "m"};

/* j (consumed) as the client reads it: printed, then parsed back. */
static cJSON *as_sent(cJSON *j)
{
    assert_non_null(j);
    char *out = cJSON_PrintUnformatted(j);
    assert_non_null(out);
    cJSON_Delete(j);
    cJSON *back = cJSON_Parse(out);
    assert_non_null(back);
    free(out);
    return back;
}

static void test_completion(void **state)
{
    (void)state;
    cJSON *j = as_sent(
        kvf_openai_completion_json(&reply, "out", 3, KVF__FINISH_REASON__FINISH_LENGTH, 3, 4));
    assert_string_equal(cJSON_GetObjectItem(j, "object")->valuestring, "text_completion");
    assert_string_equal(cJSON_GetObjectItem(j, "id")->valuestring, "cmpl-1");
    const cJSON *choice = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    assert_string_equal(cJSON_GetObjectItem(choice, "text")->valuestring, "out");
    assert_string_equal(cJSON_GetObjectItem(choice, "finish_reason")->valuestring, "length");
    const cJSON *usage = cJSON_GetObjectItem(j, "usage");
    assert_int_equal(cJSON_GetObjectItem(usage, "total_tokens")->valueint, 7);
    cJSON_Delete(j);

    kvf_openai_reply_t chat = reply;
    chat.chat = true;
    j = as_sent(kvf_openai_completion_json(&chat, "hi", 2, KVF__FINISH_REASON__FINISH_STOP, 1, 1));
    choice = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    const cJSON *msg = cJSON_GetObjectItem(choice, "message");
    assert_string_equal(cJSON_GetObjectItem(msg, "content")->valuestring, "hi");
    assert_string_equal(cJSON_GetObjectItem(choice, "finish_reason")->valuestring, "stop");
    cJSON_Delete(j);
}

/* The JSON of the i-th "data: " event of an SSE text (NULL for [DONE]). */
static cJSON *event(const char *sse, int i)
{
    const char *p = sse;
    for (int k = 0; k < i; k++) {
        p = strstr(p, "\n\n");
        assert_non_null(p);
        p += 2;
    }
    assert_memory_equal(p, "data: ", 6);
    p += 6;
    if (!strncmp(p, "[DONE]", 6))
        return NULL;
    const char *end = strstr(p, "\n\n");
    assert_non_null(end);
    cJSON *j = cJSON_ParseWithLength(p, (size_t)(end - p));
    assert_non_null(j);
    return j;
}

static void test_stream_events(void **state)
{
    (void)state;
    kvf_openai_reply_t chat = reply;
    chat.chat = true;
    chat.include_usage = true;
    kvf_strbuf_t sb;
    kvf_strbuf_init(&sb);
    kvf_openai_sse_chunk(&chat, &sb, "", 0, 0, true);
    kvf_openai_sse_chunk(&chat, &sb, "Hel", 3, 0, false);
    kvf_openai_sse_end(&chat, &sb, KVF__FINISH_REASON__FINISH_STOP, KVF_OK, "", 2, 5);
    assert_false(sb.failed);
    cJSON *j = event(sb.data, 0);
    const cJSON *delta =
        cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "delta");
    assert_string_equal(cJSON_GetObjectItem(delta, "role")->valuestring, "assistant");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(j, "usage")));
    cJSON_Delete(j);
    j = event(sb.data, 1);
    const cJSON *choice = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    assert_string_equal(
        cJSON_GetObjectItem(cJSON_GetObjectItem(choice, "delta"), "content")->valuestring, "Hel");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(choice, "finish_reason")));
    cJSON_Delete(j);
    j = event(sb.data, 2);
    choice = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    assert_string_equal(cJSON_GetObjectItem(choice, "finish_reason")->valuestring, "stop");
    cJSON_Delete(j);
    j = event(sb.data, 3);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "choices")), 0);
    assert_int_equal(
        cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "completion_tokens")->valueint, 5);
    cJSON_Delete(j);
    assert_null(event(sb.data, 4));
    kvf_strbuf_fini(&sb);

    /* A stream that fails ends with an error event, then [DONE]. */
    kvf_strbuf_init(&sb);
    kvf_openai_sse_end(&reply, &sb, KVF__FINISH_REASON__FINISH_ERROR, KVF_ERR_TIMEOUT,
                       "request timed out", 2, 1);
    j = event(sb.data, 0);
    const cJSON *e = cJSON_GetObjectItem(j, "error");
    assert_string_equal(cJSON_GetObjectItem(e, "message")->valuestring, "request timed out");
    assert_string_equal(cJSON_GetObjectItem(e, "code")->valuestring, "timeout");
    cJSON_Delete(j);
    assert_null(event(sb.data, 1));
    kvf_strbuf_fini(&sb);
}

/* Generated text with U+0000 (a byte-fallback token), a quote, a
 * backslash, control characters and a multi-byte character. */
static const char nul_text[] = "a\0b\"\\\n\x01\xc3\xa9\0";
#define NUL_TEXT_LEN  (sizeof(nul_text) - 1)
#define NUL_TEXT_JSON "\"a\\u0000b\\\"\\\\\\n\\u0001\xc3\xa9\\u0000\""

/* The string s of a parsed response holds exactly nul_text: cJSON decodes
 * \u0000 to a NUL inside the string, so its bytes are compared, not the C
 * string. */
static void expect_nul_text(const cJSON *s)
{
    assert_true(cJSON_IsString(s));
    assert_memory_equal(s->valuestring, nul_text, NUL_TEXT_LEN + 1);
}

/* U+0000 in the text reaches the client as \u0000, in the whole answer and
 * in stream events, completions and chat; nothing after it is lost. */
static void test_text_with_nul(void **state)
{
    (void)state;
    kvf_openai_reply_t chat = reply;
    chat.chat = true;
    for (int k = 0; k < 2; k++) {
        const kvf_openai_reply_t *rp = k ? &chat : &reply;
        cJSON *j = kvf_openai_completion_json(rp, nul_text, NUL_TEXT_LEN,
                                              KVF__FINISH_REASON__FINISH_LENGTH, 1, 2);
        char *out = cJSON_PrintUnformatted(j);
        assert_non_null(strstr(out, k ? "\"content\":" NUL_TEXT_JSON : "\"text\":" NUL_TEXT_JSON));
        cJSON *back = cJSON_Parse(out);
        const cJSON *choice = cJSON_GetArrayItem(cJSON_GetObjectItem(back, "choices"), 0);
        expect_nul_text(k ? cJSON_GetObjectItem(cJSON_GetObjectItem(choice, "message"), "content")
                          : cJSON_GetObjectItem(choice, "text"));
        cJSON_Delete(back);
        free(out);
        cJSON_Delete(j);

        kvf_strbuf_t sb;
        kvf_strbuf_init(&sb);
        kvf_openai_sse_chunk(rp, &sb, nul_text, NUL_TEXT_LEN, 0, false);
        assert_false(sb.failed);
        assert_int_equal(strlen(sb.data), sb.len); /* no NUL byte in the event */
        assert_non_null(strstr(sb.data, NUL_TEXT_JSON));
        j = event(sb.data, 0);
        choice = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
        expect_nul_text(k ? cJSON_GetObjectItem(cJSON_GetObjectItem(choice, "delta"), "content")
                          : cJSON_GetObjectItem(choice, "text"));
        cJSON_Delete(j);
        kvf_strbuf_fini(&sb);
    }
}

/* Text without U+0000 is written exactly as cJSON writes a string: every
 * control character, quote, backslash, DEL and multi-byte UTF-8. */
static void test_json_string_as_cjson(void **state)
{
    (void)state;
    static const char tail[] = "\"\\/\x7f\xe2\x82\xac\xf0\x9f\x98\x80 z";
    char s[64];
    size_t n = 0;
    for (int c = 1; c < 0x20; c++)
        s[n++] = (char)c;
    memcpy(s + n, tail, sizeof(tail)); /* with its NUL */
    n += sizeof(tail) - 1;
    cJSON *str = cJSON_CreateString(s);
    char *want = cJSON_PrintUnformatted(str);
    kvf_strbuf_t sb;
    kvf_strbuf_init(&sb);
    kvf_strbuf_json_string(&sb, s, n);
    assert_false(sb.failed);
    assert_string_equal(sb.data, want);
    kvf_strbuf_fini(&sb);
    free(want);
    cJSON_Delete(str);
}

static void test_models(void **state)
{
    (void)state;
    cJSON *j = kvf_openai_models_json("m", 7, 256, true);
    assert_string_equal(cJSON_GetObjectItem(j, "object")->valuestring, "list");
    const cJSON *m = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "data"), 0);
    assert_string_equal(cJSON_GetObjectItem(m, "id")->valuestring, "m");
    assert_int_equal(cJSON_GetObjectItem(m, "max_model_len")->valueint, 256);
    cJSON_Delete(j);
    j = kvf_openai_models_json("m", 7, 256, false);
    assert_string_equal(cJSON_GetObjectItem(j, "object")->valuestring, "model");
    cJSON_Delete(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),      cmocka_unit_test(test_sampling_fields),
        cmocka_unit_test(test_chat),          cmocka_unit_test(test_prompt_with_nul),
        cmocka_unit_test(test_refused),       cmocka_unit_test(test_request_errors),
        cmocka_unit_test(test_completion),    cmocka_unit_test(test_stream_events),
        cmocka_unit_test(test_text_with_nul), cmocka_unit_test(test_json_string_as_cjson),
        cmocka_unit_test(test_models),        cmocka_unit_test(test_cache_salt),
        cmocka_unit_test(test_invalid_utf8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
