/* The OpenAI API's JSON: errors and requests (the responses:
 * openai_reply.c). See openai.h. */
#include "openai.h"
#include "json_nul.h"
#include "kvf/utf8.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OPENAI_MAX_MESSAGES 4096

/* HTTP statuses the API answers with. */
enum {
    HTTP_BAD_REQUEST = 400,
    HTTP_TOO_MANY_REQUESTS = 429,
    HTTP_INTERNAL_ERROR = 500,
    HTTP_UNAVAILABLE = 503,
    HTTP_GATEWAY_TIMEOUT = 504,
};

/* ---- errors ----------------------------------------------------------------- */

void kvf_openai_set_error(kvf_openai_error_t *err, unsigned code, const char *type,
                          const char *param, const char *errcode, const char *fmt, ...)
{
    err->code = code;
    err->type = type;
    err->param = param;
    err->errcode = errcode;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
}

#define BAD_REQUEST(err, param, ...)                                                               \
    kvf_openai_set_error((err), HTTP_BAD_REQUEST, "invalid_request_error", (param), NULL,          \
                         __VA_ARGS__)
#define OUT_OF_MEMORY(err)                                                                         \
    kvf_openai_set_error((err), HTTP_UNAVAILABLE, "server_error", NULL, NULL, "out of memory")

cJSON *kvf_openai_error_json(const kvf_openai_error_t *err)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *obj = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(obj, "message", err->message);
    cJSON_AddStringToObject(obj, "type", err->type);
    if (err->param)
        cJSON_AddStringToObject(obj, "param", err->param);
    else
        cJSON_AddNullToObject(obj, "param");
    if (err->errcode)
        cJSON_AddStringToObject(obj, "code", err->errcode);
    else
        cJSON_AddNullToObject(obj, "code");
    return root;
}

void kvf_openai_request_error(kvf_status_t status, bool unhealthy, const char *error,
                              kvf_openai_error_t *err)
{
    const char *msg = error && error[0] ? error : kvf_status_str(status);
    switch (status) {
    case KVF_ERR_INVAL:
    case KVF_ERR_UNSUPPORTED:
        BAD_REQUEST(err, NULL, "%s", msg);
        break;
    case KVF_ERR_TOO_BIG:
        kvf_openai_set_error(err, HTTP_BAD_REQUEST, "invalid_request_error", "prompt",
                             "context_length_exceeded", "%s", msg);
        break;
    case KVF_ERR_NO_SPACE:
        if (unhealthy)
            kvf_openai_set_error(err, HTTP_UNAVAILABLE, "server_error", NULL, "service_unavailable",
                                 "%s", msg);
        else
            kvf_openai_set_error(err, HTTP_TOO_MANY_REQUESTS, "rate_limit_error", NULL,
                                 "overloaded", "%s", msg);
        break;
    case KVF_ERR_NOMEM:
        kvf_openai_set_error(err, HTTP_UNAVAILABLE, "server_error", NULL, "service_unavailable",
                             "%s", msg);
        break;
    case KVF_ERR_TIMEOUT:
        kvf_openai_set_error(err, HTTP_GATEWAY_TIMEOUT, "server_error", NULL, "timeout", "%s", msg);
        break;
    default:
        kvf_openai_set_error(err, HTTP_INTERNAL_ERROR, "server_error", NULL, NULL, "%s", msg);
    }
}

/* ---- typed fields ----------------------------------------------------------- */

/* A JSON field that is absent or null counts as not given. */
static const cJSON *field(const cJSON *obj, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static bool get_bool(const cJSON *obj, const char *name, bool *out, kvf_openai_error_t *err)
{
    const cJSON *v = field(obj, name);
    if (!v)
        return true;
    if (!cJSON_IsBool(v)) {
        BAD_REQUEST(err, name, "'%s' must be a boolean", name);
        return false;
    }
    *out = cJSON_IsTrue(v);
    return true;
}

static bool get_number(const cJSON *obj, const char *name, double lo, double hi, double *out,
                       kvf_openai_error_t *err)
{
    const cJSON *v = field(obj, name);
    if (!v)
        return true;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
        BAD_REQUEST(err, name, "'%s' must be a number", name);
        return false;
    }
    if (v->valuedouble < lo || v->valuedouble > hi) {
        BAD_REQUEST(err, name, "'%s' must be between %g and %g", name, lo, hi);
        return false;
    }
    *out = v->valuedouble;
    return true;
}

static bool is_integer(const cJSON *v)
{
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) && v->valuedouble == floor(v->valuedouble);
}

static bool get_int(const cJSON *obj, const char *name, double lo, double hi, int64_t *out,
                    bool *given, kvf_openai_error_t *err)
{
    const cJSON *v = field(obj, name);
    if (!v)
        return true;
    if (!is_integer(v)) {
        BAD_REQUEST(err, name, "'%s' must be an integer", name);
        return false;
    }
    if (v->valuedouble < lo || v->valuedouble > hi) {
        BAD_REQUEST(err, name, "'%s' must be between %.0f and %.0f", name, lo, hi);
        return false;
    }
    *out = (int64_t)v->valuedouble;
    if (given)
        *given = true;
    return true;
}

/* ---- the prompt ------------------------------------------------------------- */

/* Copies a JSON array of token ids into req->ids. */
static bool take_ids(kvf_openai_request_t *req, const cJSON *arr, kvf_openai_error_t *err)
{
    int n = cJSON_GetArraySize(arr);
    if (n == 0) {
        BAD_REQUEST(err, "prompt", "'prompt' must not be empty");
        return false;
    }
    req->ids = malloc((size_t)n * sizeof(*req->ids));
    if (!req->ids) {
        OUT_OF_MEMORY(err);
        return false;
    }
    size_t k = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr)
    {
        if (!is_integer(v) || v->valuedouble < 0 || v->valuedouble > UINT32_MAX) {
            BAD_REQUEST(err, "prompt", "'prompt' token ids must be non-negative integers");
            return false;
        }
        req->ids[k++] = (uint32_t)v->valuedouble;
    }
    req->n_ids = k;
    return true;
}

static bool parse_prompt(kvf_openai_request_t *req, const cJSON *root, kvf_openai_error_t *err)
{
    const cJSON *p = field(root, "prompt");
    if (!p) {
        BAD_REQUEST(err, "prompt", "'prompt' is required");
        return false;
    }
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) >= 1 && !cJSON_IsNumber(p->child)) {
        /* A list of prompts: one is served (n = 1, no batching). */
        if (cJSON_GetArraySize(p) > 1) {
            BAD_REQUEST(err, "prompt", "one prompt per request is supported");
            return false;
        }
        p = p->child;
    }
    if (cJSON_IsString(p)) {
        if (!p->valuestring[0]) {
            BAD_REQUEST(err, "prompt", "'prompt' must not be empty");
            return false;
        }
        req->prompt = strdup(p->valuestring);
        if (!req->prompt) {
            OUT_OF_MEMORY(err);
            return false;
        }
        return true;
    }
    if (cJSON_IsArray(p))
        return take_ids(req, p, err);
    BAD_REQUEST(err, "prompt", "'prompt' must be a string or an array of token ids");
    return false;
}

/* The text of a message's content: a string, or a list of text parts. */
static bool content_text(const cJSON *content, size_t i, kvf_strbuf_t *sb, kvf_openai_error_t *err)
{
    if (!content)
        return true; /* null content (an assistant turn without text) */
    if (cJSON_IsString(content)) {
        kvf_strbuf_puts(sb, content->valuestring);
        return true;
    }
    if (cJSON_IsArray(content)) {
        const cJSON *part;
        cJSON_ArrayForEach(part, content)
        {
            const cJSON *type = field(part, "type");
            const cJSON *text = field(part, "text");
            if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") ||
                !cJSON_IsString(text)) {
                BAD_REQUEST(err, "messages",
                            "message %zu: only text content parts ({\"type\": \"text\", "
                            "\"text\": ...}) are supported",
                            i);
                return false;
            }
            kvf_strbuf_puts(sb, text->valuestring);
        }
        return true;
    }
    BAD_REQUEST(err, "messages", "message %zu: 'content' must be a string or a list of parts", i);
    return false;
}

/* One message of the list into cm (content in text, owned by the caller). */
static bool take_message(const cJSON *m, size_t i, kvf_chat_message_t *cm, kvf_strbuf_t *text,
                         kvf_openai_error_t *err)
{
    const cJSON *role = field(m, "role");
    if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
        BAD_REQUEST(err, "messages", "message %zu must be an object with a string 'role'", i);
        return false;
    }
    kvf_strbuf_puts(text, "");
    if (!content_text(field(m, "content"), i, text, err))
        return false;
    if (text->failed) {
        OUT_OF_MEMORY(err);
        return false;
    }
    cm->role = role->valuestring;
    cm->content = text->data;
    return true;
}

/* Renders the n messages of msgs with the server's chat template. */
static bool render_messages(const kvf_openai_server_t *srv, kvf_openai_request_t *req,
                            const cJSON *msgs, size_t n, kvf_openai_error_t *err)
{
    kvf_chat_message_t *cm = calloc(n, sizeof(*cm));
    kvf_strbuf_t *texts = calloc(n, sizeof(*texts));
    bool ok = cm && texts;
    if (!ok)
        OUT_OF_MEMORY(err);
    size_t i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs)
    {
        if (!ok)
            break;
        kvf_strbuf_init(&texts[i]);
        ok = take_message(m, i, &cm[i], &texts[i], err);
        i++;
    }
    char why[300];
    if (ok && kvf_chat_render(srv->chat, cm, i, srv->bos_text, srv->eos_text, srv->leading_bos,
                              &req->prompt, why, sizeof(why)) != KVF_OK) {
        BAD_REQUEST(err, "messages", "%s", why);
        ok = false;
    }
    for (size_t k = 0; texts && k < i; k++)
        kvf_strbuf_fini(&texts[k]);
    free(texts);
    free(cm);
    return ok;
}

static bool parse_messages(const kvf_openai_server_t *srv, kvf_openai_request_t *req,
                           const cJSON *root, kvf_openai_error_t *err)
{
    const cJSON *msgs = field(root, "messages");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0) {
        BAD_REQUEST(err, "messages", "'messages' must be a non-empty array");
        return false;
    }
    int n = cJSON_GetArraySize(msgs);
    if (n > OPENAI_MAX_MESSAGES) {
        BAD_REQUEST(err, "messages", "at most %d messages", OPENAI_MAX_MESSAGES);
        return false;
    }
    if (srv->chat == KVF_CHAT_NONE) {
        BAD_REQUEST(
            err, "messages",
            "the model '%s' has no chat template kvferry recognises; use "
            "/v1/completions, or start kvf-router with --chat-template " KVF_CHAT_TEMPLATE_NAMES,
            srv->model_name);
        return false;
    }
    return render_messages(srv, req, msgs, (size_t)n, err);
}

/* ---- sampling and options ---------------------------------------------------- */

static bool parse_stop(kvf_openai_request_t *req, const cJSON *root, kvf_openai_error_t *err)
{
    const cJSON *stop = field(root, "stop");
    if (!stop)
        return true;
    const cJSON *one = cJSON_IsString(stop) ? stop : NULL;
    if (!one && !cJSON_IsArray(stop)) {
        BAD_REQUEST(err, "stop", "'stop' must be a string or an array of strings");
        return false;
    }
    if (!one && cJSON_GetArraySize(stop) > KVF_SAMPLING_MAX_STOP) {
        BAD_REQUEST(err, "stop", "at most %d stop strings", KVF_SAMPLING_MAX_STOP);
        return false;
    }
    Kvf__Sampling *s = &req->sampling;
    const cJSON *v = one ? one : stop->child;
    for (; v; v = one ? NULL : v->next) {
        if (!cJSON_IsString(v) || !v->valuestring[0] || strstr(v->valuestring, "\xC0\x80")) {
            BAD_REQUEST(err, "stop", "stop strings must be non-empty strings without U+0000");
            return false;
        }
        req->stop[s->n_stop] = strdup(v->valuestring);
        if (!req->stop[s->n_stop]) {
            OUT_OF_MEMORY(err);
            return false;
        }
        s->n_stop++;
    }
    return true;
}

/* A field that must be absent, or have the one value that means "off";
 * why: the message, with the field's name for a %s if it has one. */
static bool refuse_set(const cJSON *root, const char *name, bool (*off)(const cJSON *),
                       const char *why, kvf_openai_error_t *err)
{
    const cJSON *v = field(root, name);
    if (v && !off(v)) {
        BAD_REQUEST(err, name, why, name);
        return false;
    }
    return true;
}

static bool is_zero(const cJSON *v)
{
    return cJSON_IsNumber(v) && v->valuedouble == 0;
}

static bool is_off(const cJSON *v)
{
    return cJSON_IsFalse(v) || is_zero(v);
}

static bool is_false(const cJSON *v)
{
    return cJSON_IsFalse(v);
}

static bool is_one(const cJSON *v)
{
    return cJSON_IsNumber(v) && v->valuedouble == 1;
}

static bool is_empty_string(const cJSON *v)
{
    return cJSON_IsString(v) && !v->valuestring[0];
}

static bool is_empty_list(const cJSON *v)
{
    return cJSON_GetArraySize(v) == 0;
}

static bool is_text_format(const cJSON *v)
{
    const cJSON *type = field(v, "type");
    return cJSON_IsString(type) && !strcmp(type->valuestring, "text");
}

/* Options the router cannot honour are refused rather than ignored. */
static bool refuse_unsupported(const cJSON *root, kvf_openai_error_t *err)
{
    return refuse_set(root, "presence_penalty", is_zero, "'%s' is not supported", err) &&
           refuse_set(root, "frequency_penalty", is_zero, "'%s' is not supported", err) &&
           refuse_set(root, "logprobs", is_off, "'%s' is not supported", err) &&
           refuse_set(root, "echo", is_false, "'%s' is not supported", err) &&
           refuse_set(root, "best_of", is_one, "'%s' must be 1", err) &&
           refuse_set(root, "suffix", is_empty_string, "'%s' is not supported", err) &&
           refuse_set(root, "tools", is_empty_list, "'%s' is not supported", err) &&
           refuse_set(root, "functions", is_empty_list, "'%s' is not supported", err) &&
           refuse_set(root, "logit_bias", is_empty_list, "'%s' is not supported", err) &&
           refuse_set(root, "response_format", is_text_format,
                      "only the 'text' response format is supported", err);
}

/* n, stream and stream_options. */
static bool parse_streaming(kvf_openai_request_t *req, const cJSON *root, kvf_openai_error_t *err)
{
    int64_t n = 1;
    if (!get_int(root, "n", 1, 1e9, &n, NULL, err))
        return false;
    if (n != 1) {
        BAD_REQUEST(err, "n", "only n = 1 is supported");
        return false;
    }
    if (!get_bool(root, "stream", &req->stream, err))
        return false;
    const cJSON *so = field(root, "stream_options");
    if (so && !cJSON_IsObject(so)) {
        BAD_REQUEST(err, "stream_options", "'stream_options' must be an object");
        return false;
    }
    if (so && !get_bool(so, "include_usage", &req->include_usage, err))
        return false;
    if (!req->stream)
        req->include_usage = false;
    /* cache_salt: requests share cached prompt blocks only with equal salts */
    const cJSON *salt = field(root, "cache_salt");
    if (salt && (!cJSON_IsString(salt) || !*salt->valuestring)) {
        BAD_REQUEST(err, "cache_salt", "'cache_salt' must be a non-empty string");
        return false;
    }
    if (!salt)
        return true;
    /* Carried with its length: U+0000 in it (C0 80 here, json_nul.h) is
     * one byte of the salt, not its end. */
    if (!(req->cache_salt = strdup(salt->valuestring))) {
        OUT_OF_MEMORY(err);
        return false;
    }
    req->cache_salt_len = kvf_json_nul_restore(req->cache_salt);
    if (req->cache_salt_len > KVF_CACHE_SALT_MAX) {
        BAD_REQUEST(err, "cache_salt",
                    "'cache_salt' is %zu bytes, more than the maximum of %d bytes",
                    req->cache_salt_len, KVF_CACHE_SALT_MAX);
        return false;
    }
    return true;
}

/* The sampling message's fields (stop strings aside). */
static bool parse_sampling(kvf_openai_request_t *req, const cJSON *root, kvf_openai_error_t *err)
{
    Kvf__Sampling *s = &req->sampling;
    int64_t max_tokens = 0, top_k = 0, seed = 0;
    bool has_seed = false, ignore_eos = false;
    double temperature = 1.0, top_p = 1.0;
    const char *max_name =
        req->chat && field(root, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if (!get_int(root, max_name, 1, UINT32_MAX, &max_tokens, NULL, err) ||
        !get_number(root, "temperature", 0, 2, &temperature, err) ||
        !get_number(root, "top_p", 0, 1, &top_p, err) ||
        !get_int(root, "top_k", -1, UINT32_MAX, &top_k, NULL, err) ||
        !get_int(root, "seed", -9.2e18, 9.2e18, &seed, &has_seed, err) ||
        !get_bool(root, "ignore_eos", &ignore_eos, err))
        return false;
    s->max_tokens = (uint32_t)max_tokens;
    s->temperature = (float)temperature;
    s->top_p = (float)top_p;
    s->top_k = top_k > 0 ? (uint32_t)top_k : 0;
    s->seed = (uint64_t)seed;
    s->has_seed = has_seed;
    s->ignore_eos = ignore_eos;
    return true;
}

/* The model named, if any, must be the one served. */
static bool check_model(const kvf_openai_server_t *srv, const cJSON *root, kvf_openai_error_t *err)
{
    const cJSON *model = field(root, "model");
    if (model && !cJSON_IsString(model)) {
        BAD_REQUEST(err, "model", "'model' must be a string");
        return false;
    }
    if (model && strstr(model->valuestring, "\xC0\x80")) {
        BAD_REQUEST(err, "model", "'model' must not hold U+0000");
        return false;
    }
    if (model && strcmp(model->valuestring, srv->model_name)) {
        /* at most 100 bytes of the name, cut between characters */
        size_t n = strlen(model->valuestring);
        int shown =
            (int)kvf_utf8_valid_prefix((const uint8_t *)model->valuestring, n < 100 ? n : 100);
        kvf_openai_set_error(err, HTTP_BAD_REQUEST, "invalid_request_error", "model",
                             "model_not_found",
                             "the model '%.*s' does not exist; this server serves '%s'", shown,
                             model->valuestring, srv->model_name);
        return false;
    }
    return true;
}

bool kvf_openai_parse(const kvf_openai_server_t *srv, bool chat, const char *body, size_t len,
                      kvf_openai_request_t *req, kvf_openai_error_t *err)
{
    memset(req, 0, sizeof(*req));
    kvf__sampling__init(&req->sampling);
    req->sampling.stop = req->stop;
    req->chat = chat;
    /* JSON text is UTF-8 (RFC 8259): a body that is not, in a string or
     * anywhere else, is refused rather than passed on to the tokenizer. */
    size_t valid = body ? kvf_utf8_valid_prefix((const uint8_t *)body, len) : 0;
    if (body && valid < len) {
        BAD_REQUEST(err, NULL, "the request body is not valid UTF-8 (at byte %zu of %zu)", valid,
                    len);
        return false;
    }
    cJSON *root;
    bool hidden; /* the body held \u0000: kvf_json_nul_parse */
    kvf_status_t st = kvf_json_nul_parse(body, len, &root, &hidden);
    if (st != KVF_OK) {
        if (st == KVF_ERR_NOMEM)
            OUT_OF_MEMORY(err);
        else
            BAD_REQUEST(err, NULL,
                        st == KVF_ERR_INVAL ? "a body holding \\u0000 must be UTF-8"
                                            : "the request body is not valid JSON");
        return false;
    }
    bool ok;
    if (!cJSON_IsObject(root)) {
        BAD_REQUEST(err, NULL, "the request body must be a JSON object");
        ok = false;
    } else {
        ok = check_model(srv, root, err) && parse_streaming(req, root, err) &&
             parse_sampling(req, root, err) && parse_stop(req, root, err) &&
             refuse_unsupported(root, err) &&
             (chat ? parse_messages(srv, req, root, err) : parse_prompt(req, root, err));
    }
    cJSON_Delete(root);
    if (ok && req->prompt)
        req->prompt_len = hidden ? kvf_json_nul_restore(req->prompt) : strlen(req->prompt);
    return ok;
}

void kvf_openai_request_fini(kvf_openai_request_t *req)
{
    free(req->prompt);
    free(req->ids);
    for (size_t i = 0; i < req->sampling.n_stop; i++)
        free(req->stop[i]);
    free(req->cache_salt);
    memset(req, 0, sizeof(*req));
}

void kvf_openai_request_gen(const kvf_openai_request_t *req, kvf_router_gen_t *gen_p)
{
    memset(gen_p, 0, sizeof(*gen_p));
    gen_p->prompt = req->prompt;
    gen_p->prompt_len = req->prompt_len;
    gen_p->ids = req->ids;
    gen_p->n_ids = req->n_ids;
    gen_p->sampling = &req->sampling;
    gen_p->cache_salt = (const uint8_t *)req->cache_salt;
    gen_p->cache_salt_len = req->cache_salt_len;
}
