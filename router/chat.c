#include "chat.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kvf/file.h"
#include "kvf/log.h"
#include "chat_internal.h"
#include "strbuf.h"

#define CHAT_CONFIG_MAX_BYTES (16u << 20)

static const struct {
    const char *name;
    kvf_chat_template_t template_;
} chat_names[] = {
    {"none", KVF_CHAT_NONE},
    {"llama3", KVF_CHAT_LLAMA3},
    {"llama3.1", KVF_CHAT_LLAMA3_1},
    {"chatml", KVF_CHAT_CHATML},
    {"qwen2", KVF_CHAT_QWEN2},
    {"qwen2.5", KVF_CHAT_QWEN2_5},
    {"qwen3", KVF_CHAT_QWEN3},
    {"llama2", KVF_CHAT_LLAMA2},
    {"mistral", KVF_CHAT_MISTRAL},
    {"mistral-v0.1", KVF_CHAT_MISTRAL_V0_1},
    {"mistral-v0.2", KVF_CHAT_MISTRAL_V0_2},
    {"mistral-v0.3", KVF_CHAT_MISTRAL_V0_3},
    {"gemma", KVF_CHAT_GEMMA},
};

kvf_status_t kvf_chat_template_parse(const char *name, kvf_chat_template_t *template_p)
{
    for (size_t i = 1; i < sizeof(chat_names) / sizeof(chat_names[0]); i++) {
        if (name && !strcmp(name, chat_names[i].name)) {
            *template_p = chat_names[i].template_;
            return KVF_OK;
        }
    }
    return KVF_ERR_NOT_FOUND;
}

const char *kvf_chat_template_name(kvf_chat_template_t template_)
{
    for (size_t i = 0; i < sizeof(chat_names) / sizeof(chat_names[0]); i++)
        if (chat_names[i].template_ == template_)
            return chat_names[i].name;
    return "none";
}

/* Which Mistral [INST] template: v0.1 / v0.2 write ' [INST] ' (a space
 * before), v0.2 with a system message; v0.3 closes with "[/INST]" right
 * after the content; the first Mixtral / Mistral template writes
 * '[INST] ' .. ' [/INST]'. */
static kvf_chat_template_t detect_mistral(const char *jinja)
{
    if (strstr(jinja, "' [INST] '") || strstr(jinja, "\" [INST] \""))
        return strstr(jinja, "system_message") ? KVF_CHAT_MISTRAL_V0_2 : KVF_CHAT_MISTRAL_V0_1;
    if (strstr(jinja, "+ \"[/INST]\"") || strstr(jinja, "+ '[/INST]'"))
        return KVF_CHAT_MISTRAL_V0_3;
    return KVF_CHAT_MISTRAL;
}

kvf_chat_template_t kvf_chat_template_detect(const char *jinja)
{
    if (!jinja)
        return KVF_CHAT_NONE;
    if (strstr(jinja, "<start_of_turn>") && strstr(jinja, "<end_of_turn>"))
        return KVF_CHAT_GEMMA;
    if (strstr(jinja, "<|start_header_id|>") && strstr(jinja, "<|eot_id|>"))
        return strstr(jinja, "Cutting Knowledge Date") ? KVF_CHAT_LLAMA3_1 : KVF_CHAT_LLAMA3;
    if (strstr(jinja, "<|im_start|>")) {
        if (strstr(jinja, "</think>"))
            return KVF_CHAT_QWEN3;
        if (strstr(jinja, "created by Alibaba Cloud"))
            return KVF_CHAT_QWEN2_5;
        return strstr(jinja, KVF_CHAT__QWEN2_SYSTEM) ? KVF_CHAT_QWEN2 : KVF_CHAT_CHATML;
    }
    if (strstr(jinja, "[INST]"))
        return strstr(jinja, "<<SYS>>") ? KVF_CHAT_LLAMA2 : detect_mistral(jinja);
    return KVF_CHAT_NONE;
}

kvf_status_t kvf_chat_template_load(const char *model_dir, kvf_chat_template_t *template_p)
{
    char path[4096];
    if (snprintf(path, sizeof(path), "%s/tokenizer_config.json", model_dir) >= (int)sizeof(path))
        return KVF_ERR_INVAL;
    char *data;
    size_t len;
    kvf_status_t st = kvf_file_read(path, CHAT_CONFIG_MAX_BYTES, &data, &len);
    if (st == KVF_ERR_NOT_FOUND) {
        *template_p = KVF_CHAT_NONE;
        return KVF_OK;
    }
    if (st != KVF_OK)
        return st;
    cJSON *root = cJSON_ParseWithLength(data, len);
    free(data);
    if (!root) {
        kvf_log_error("%s: not valid JSON", path);
        return KVF_ERR_FORMAT;
    }
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
    const char *jinja = NULL;
    if (cJSON_IsString(ct)) {
        jinja = ct->valuestring;
    } else if (cJSON_IsArray(ct)) {
        /* Several named templates: the "default" one serves chat. */
        const cJSON *item;
        cJSON_ArrayForEach(item, ct)
        {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(item, "name");
            const cJSON *tmpl = cJSON_GetObjectItemCaseSensitive(item, "template");
            if (cJSON_IsString(name) && !strcmp(name->valuestring, "default") &&
                cJSON_IsString(tmpl))
                jinja = tmpl->valuestring;
        }
    }
    *template_p = kvf_chat_template_detect(jinja);
    cJSON_Delete(root);
    return KVF_OK;
}

bool kvf_chat__role_is(const kvf_chat_message_t *m, const char *role)
{
    return !strcmp(m->role, role);
}

kvf_status_t kvf_chat__refuse(const kvf_chat__input_t *in, const char *reason)
{
    snprintf(in->why, in->why_len, "%s (%s chat template)", reason,
             kvf_chat_template_name(in->template_));
    return KVF_ERR_INVAL;
}

/* The code point of the UTF-8 sequence at s (n bytes) and its length in
 * *len_p; a malformed sequence is U+FFFD of one byte. */
static uint32_t utf8_decode(const unsigned char *s, size_t n, size_t *len_p)
{
    size_t len = s[0] < 0x80 ? 1 : s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc0 ? 2 : 0;
    if (len == 0 || len > n) {
        *len_p = 1;
        return 0xfffd;
    }
    uint32_t cp = len == 1 ? s[0] : s[0] & (0x7f >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) {
            *len_p = 1;
            return 0xfffd;
        }
        cp = cp << 6 | (s[i] & 0x3f);
    }
    *len_p = len;
    return cp;
}

static bool is_trim_space(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
           cp == 0x205f || cp == 0x3000;
}

void kvf_chat__append_trimmed(kvf_strbuf_t *sb, const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s, *end = p + len;
    size_t cl;
    while (p < end && is_trim_space(utf8_decode(p, (size_t)(end - p), &cl)))
        p += cl;
    while (end > p) {
        const unsigned char *last = end - 1;
        while (last > p && (*last & 0xc0) == 0x80 && end - last < 4)
            last--;
        if (!is_trim_space(utf8_decode(last, (size_t)(end - last), &cl)) || last + cl != end)
            break;
        end = last;
    }
    kvf_strbuf_append(sb, (const char *)p, (size_t)(end - p));
}

void kvf_chat__append_stripped_of(kvf_strbuf_t *sb, const char *s, size_t len, const char *lead,
                                  const char *tail)
{
    while (len && *s && strchr(lead, *s)) {
        s++;
        len--;
    }
    while (len && s[len - 1] && strchr(tail, s[len - 1]))
        len--;
    kvf_strbuf_append(sb, s, len);
}

/* Checks the roles; KVF_OK when the conversation can be rendered. */
static kvf_status_t check_messages(const kvf_chat__input_t *in)
{
    bool inst = in->template_ == KVF_CHAT_LLAMA2 || in->template_ == KVF_CHAT_MISTRAL ||
                in->template_ == KVF_CHAT_MISTRAL_V0_1 || in->template_ == KVF_CHAT_MISTRAL_V0_2 ||
                in->template_ == KVF_CHAT_MISTRAL_V0_3;
    for (size_t i = 0; i < in->n; i++) {
        const kvf_chat_message_t *m = &in->msgs[i];
        if (!m->role || !m->content) {
            snprintf(in->why, in->why_len, "message %zu has no role or content", i);
            return KVF_ERR_INVAL;
        }
        if (!kvf_chat__role_is(m, "system") && !kvf_chat__role_is(m, "user") &&
            !kvf_chat__role_is(m, "assistant")) {
            snprintf(in->why, in->why_len, "message %zu: role must be system, user or assistant",
                     i);
            return KVF_ERR_INVAL;
        }
        if (i > 0 && inst && kvf_chat__role_is(m, "system")) {
            snprintf(in->why, in->why_len, "the %s chat template takes a system message only first",
                     kvf_chat_template_name(in->template_));
            return KVF_ERR_INVAL;
        }
    }
    return KVF_OK;
}

static kvf_status_t render(kvf_strbuf_t *sb, const kvf_chat__input_t *in)
{
    switch (in->template_) {
    case KVF_CHAT_LLAMA3:
    case KVF_CHAT_LLAMA3_1:
        return kvf_chat__render_llama3(sb, in);
    case KVF_CHAT_CHATML:
    case KVF_CHAT_QWEN2:
    case KVF_CHAT_QWEN2_5:
        return kvf_chat__render_chatml(sb, in);
    case KVF_CHAT_QWEN3:
        return kvf_chat__render_qwen3(sb, in);
    case KVF_CHAT_LLAMA2:
        return kvf_chat__render_llama2(sb, in);
    case KVF_CHAT_MISTRAL:
    case KVF_CHAT_MISTRAL_V0_1:
    case KVF_CHAT_MISTRAL_V0_2:
    case KVF_CHAT_MISTRAL_V0_3:
        return kvf_chat__render_mistral(sb, in);
    case KVF_CHAT_GEMMA:
        return kvf_chat__render_gemma(sb, in);
    case KVF_CHAT_NONE:
        break;
    }
    return KVF_ERR_UNSUPPORTED;
}

kvf_status_t kvf_chat_render(kvf_chat_template_t t, const kvf_chat_message_t *msgs, size_t n,
                             const char *bos, const char *eos, bool leading_bos, char **text_p,
                             char *why, size_t why_len)
{
    if (t == KVF_CHAT_NONE) {
        snprintf(why, why_len,
                 "the model has no chat template kvferry knows (start the router with "
                 "--chat-template " KVF_CHAT_TEMPLATE_NAMES ")");
        return KVF_ERR_UNSUPPORTED;
    }
    if (n == 0) {
        snprintf(why, why_len, "messages must not be empty");
        return KVF_ERR_INVAL;
    }
    const kvf_chat__input_t in = {
        .template_ = t,
        .msgs = msgs,
        .n = n,
        .bos = bos ? bos : "",
        .eos = eos ? eos : "",
        .leading_bos = leading_bos,
        .why = why,
        .why_len = why_len,
    };
    kvf_status_t st = check_messages(&in);
    if (st != KVF_OK)
        return st;
    kvf_strbuf_t sb;
    kvf_strbuf_init(&sb);
    st = render(&sb, &in);
    if (st != KVF_OK) {
        kvf_strbuf_fini(&sb);
        return st;
    }
    st = kvf_strbuf_take(&sb, text_p, NULL);
    if (st != KVF_OK)
        snprintf(why, why_len, "out of memory");
    return st;
}
