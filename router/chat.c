#include "chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kvf/file.h"
#include "kvf/log.h"
#include "strbuf.h"

#define CHAT_CONFIG_MAX_BYTES (16u << 20)

static const struct {
    const char *name;
    kvf_chat_template_t template_;
} chat_names[] = {
    {"none", KVF_CHAT_NONE},   {"llama3", KVF_CHAT_LLAMA3}, {"chatml", KVF_CHAT_CHATML},
    {"qwen2", KVF_CHAT_QWEN2}, {"llama2", KVF_CHAT_LLAMA2}, {"mistral", KVF_CHAT_MISTRAL},
};

#define QWEN2_DEFAULT_SYSTEM "You are a helpful assistant."

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

kvf_chat_template_t kvf_chat_template_detect(const char *jinja)
{
    if (!jinja)
        return KVF_CHAT_NONE;
    if (strstr(jinja, "<|start_header_id|>") && strstr(jinja, "<|eot_id|>"))
        return KVF_CHAT_LLAMA3;
    if (strstr(jinja, "<|im_start|>"))
        return strstr(jinja, QWEN2_DEFAULT_SYSTEM) ? KVF_CHAT_QWEN2 : KVF_CHAT_CHATML;
    if (strstr(jinja, "[INST]"))
        return strstr(jinja, "<<SYS>>") ? KVF_CHAT_LLAMA2 : KVF_CHAT_MISTRAL;
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

/* Appends s without leading and trailing whitespace (Jinja's trim and
 * Python's strip, for ASCII whitespace). */
static void append_stripped(kvf_strbuf_t *sb, const char *s)
{
    static const char ws[] = " \t\n\r\f\v";
    while (*s && strchr(ws, *s))
        s++;
    size_t n = strlen(s);
    while (n && strchr(ws, s[n - 1]))
        n--;
    kvf_strbuf_append(sb, s, n);
}

static bool role_is(const kvf_chat_message_t *m, const char *role)
{
    return !strcmp(m->role, role);
}

static void render_llama3(kvf_strbuf_t *sb, const kvf_chat_message_t *msgs, size_t n,
                          const char *bos, bool leading_bos)
{
    if (leading_bos && bos)
        kvf_strbuf_puts(sb, bos);
    for (size_t i = 0; i < n; i++) {
        kvf_strbuf_printf(sb, "<|start_header_id|>%s<|end_header_id|>\n\n", msgs[i].role);
        append_stripped(sb, msgs[i].content);
        kvf_strbuf_puts(sb, "<|eot_id|>");
    }
    kvf_strbuf_puts(sb, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static void render_chatml(kvf_strbuf_t *sb, const kvf_chat_message_t *msgs, size_t n,
                          bool default_system)
{
    if (default_system && !role_is(&msgs[0], "system"))
        kvf_strbuf_puts(sb, "<|im_start|>system\n" QWEN2_DEFAULT_SYSTEM "<|im_end|>\n");
    for (size_t i = 0; i < n; i++)
        kvf_strbuf_printf(sb, "<|im_start|>%s\n%s<|im_end|>\n", msgs[i].role, msgs[i].content);
    kvf_strbuf_puts(sb, "<|im_start|>assistant\n");
}

/* Llama 2 and Mistral: [INST] turns, roles alternating user/assistant
 * after an optional leading system message. */
static kvf_status_t render_inst(kvf_strbuf_t *sb, kvf_chat_template_t t,
                                const kvf_chat_message_t *msgs, size_t n, const char *bos,
                                const char *eos, bool leading_bos, char *why, size_t why_len)
{
    const char *system = NULL;
    if (role_is(&msgs[0], "system")) {
        system = msgs[0].content;
        msgs++;
        n--;
    }
    if (n == 0) {
        snprintf(why, why_len, "the conversation needs a user message");
        return KVF_ERR_INVAL;
    }
    for (size_t i = 0; i < n; i++) {
        if (!role_is(&msgs[i], i % 2 == 0 ? "user" : "assistant")) {
            snprintf(why, why_len,
                     "conversation roles must alternate user/assistant/user/... (after an "
                     "optional first system message) for the %s chat template",
                     kvf_chat_template_name(t));
            return KVF_ERR_INVAL;
        }
    }
    if (!bos)
        bos = "";
    if (!eos)
        eos = "";
    if (t == KVF_CHAT_MISTRAL && leading_bos)
        kvf_strbuf_puts(sb, bos);
    for (size_t i = 0; i < n; i++) {
        const char *content = msgs[i].content;
        if (i % 2 == 1) {
            if (t == KVF_CHAT_LLAMA2) {
                kvf_strbuf_puts(sb, " ");
                append_stripped(sb, content);
                kvf_strbuf_printf(sb, " %s", eos);
            } else {
                kvf_strbuf_printf(sb, "%s%s", content, eos);
            }
            continue;
        }
        if (t == KVF_CHAT_LLAMA2) {
            if (i > 0 || leading_bos)
                kvf_strbuf_puts(sb, bos);
            kvf_strbuf_puts(sb, "[INST] ");
            /* strip() applies to the system block and the message as one. */
            if (i == 0 && system) {
                kvf_strbuf_t turn;
                kvf_strbuf_init(&turn);
                kvf_strbuf_printf(&turn, "<<SYS>>\n%s\n<</SYS>>\n\n%s", system, content);
                append_stripped(sb, turn.failed ? "" : turn.data);
                if (turn.failed)
                    sb->failed = true;
                kvf_strbuf_fini(&turn);
            } else {
                append_stripped(sb, content);
            }
            kvf_strbuf_puts(sb, " [/INST]");
        } else {
            kvf_strbuf_puts(sb, "[INST] ");
            if (i == 0 && system)
                kvf_strbuf_printf(sb, "%s\n\n", system);
            kvf_strbuf_printf(sb, "%s [/INST]", content);
        }
    }
    return KVF_OK;
}

kvf_status_t kvf_chat_render(kvf_chat_template_t t, const kvf_chat_message_t *msgs, size_t n,
                             const char *bos, const char *eos, bool leading_bos, char **text_p,
                             char *why, size_t why_len)
{
    if (t == KVF_CHAT_NONE) {
        snprintf(why, why_len,
                 "the model has no chat template kvferry knows (start the router with "
                 "--chat-template llama3|chatml|qwen2|llama2|mistral)");
        return KVF_ERR_UNSUPPORTED;
    }
    if (n == 0) {
        snprintf(why, why_len, "messages must not be empty");
        return KVF_ERR_INVAL;
    }
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content) {
            snprintf(why, why_len, "message %zu has no role or content", i);
            return KVF_ERR_INVAL;
        }
        if (!role_is(&msgs[i], "system") && !role_is(&msgs[i], "user") &&
            !role_is(&msgs[i], "assistant")) {
            snprintf(why, why_len, "message %zu: role must be system, user or assistant", i);
            return KVF_ERR_INVAL;
        }
        if (i > 0 && role_is(&msgs[i], "system") &&
            (t == KVF_CHAT_LLAMA2 || t == KVF_CHAT_MISTRAL)) {
            snprintf(why, why_len, "the %s chat template takes a system message only first",
                     kvf_chat_template_name(t));
            return KVF_ERR_INVAL;
        }
    }
    kvf_strbuf_t sb;
    kvf_strbuf_init(&sb);
    kvf_status_t st = KVF_OK;
    switch (t) {
    case KVF_CHAT_LLAMA3:
        render_llama3(&sb, msgs, n, bos, leading_bos);
        break;
    case KVF_CHAT_CHATML:
        render_chatml(&sb, msgs, n, false);
        break;
    case KVF_CHAT_QWEN2:
        render_chatml(&sb, msgs, n, true);
        break;
    case KVF_CHAT_LLAMA2:
    case KVF_CHAT_MISTRAL:
        st = render_inst(&sb, t, msgs, n, bos, eos, leading_bos, why, why_len);
        break;
    case KVF_CHAT_NONE:
        break;
    }
    if (st != KVF_OK) {
        kvf_strbuf_fini(&sb);
        return st;
    }
    st = kvf_strbuf_take(&sb, text_p, NULL);
    if (st != KVF_OK)
        snprintf(why, why_len, "out of memory");
    return st;
}
