/* ChatML chat templates: plain ChatML, Qwen2 and Qwen2.5 (a default system
 * message when the conversation has none) and Qwen3 (the <think> part of
 * assistant turns before the last user query dropped). Each reproduces
 * its published template (tests/data/chat_templates/). */
#include <string.h>

#include "chat_internal.h"

static void append_turn(kvf_strbuf_t *sb, const char *role, const char *content, size_t len)
{
    kvf_strbuf_printf(sb, "<|im_start|>%s\n", role);
    kvf_strbuf_append(sb, content, len);
    kvf_strbuf_puts(sb, "<|im_end|>\n");
}

kvf_status_t kvf_chat__render_chatml(kvf_strbuf_t *sb, const kvf_chat__input_t *in)
{
    const char *default_system = in->template_ == KVF_CHAT_QWEN2     ? KVF_CHAT__QWEN2_SYSTEM
                                 : in->template_ == KVF_CHAT_QWEN2_5 ? KVF_CHAT__QWEN2_5_SYSTEM
                                                                     : NULL;
    if (default_system && !kvf_chat__role_is(&in->msgs[0], "system"))
        append_turn(sb, "system", default_system, strlen(default_system));
    for (size_t i = 0; i < in->n; i++)
        append_turn(sb, in->msgs[i].role, in->msgs[i].content, strlen(in->msgs[i].content));
    kvf_strbuf_puts(sb, "<|im_start|>assistant\n");
    return KVF_OK;
}

static bool starts_with(const char *s, const char *prefix)
{
    return !strncmp(s, prefix, strlen(prefix));
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !memcmp(s + n - k, suffix, k);
}

/* The index of the last user message that is not a wrapped tool response
 * (n - 1 when there is none), as Qwen3's template finds it. */
static size_t last_query_index(const kvf_chat__input_t *in)
{
    for (size_t i = in->n; i-- > 0;) {
        const char *c = in->msgs[i].content;
        if (kvf_chat__role_is(&in->msgs[i], "user") &&
            !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>")))
            return i;
    }
    return in->n - 1;
}

/* The last occurrence of needle in s, or NULL. */
static const char *find_last(const char *s, const char *needle)
{
    const char *last = NULL;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle))
        last = p;
    return last;
}

/* One Qwen3 assistant turn. With a </think> in it, the reasoning is what
 * lies between the last <think> and the first </think>, the answer what
 * follows the last </think> (leading newlines dropped); turns after the
 * last user query keep a non-empty reasoning (the last one: always) in a
 * <think> block, the others lose it. */
static void append_qwen3_assistant(kvf_strbuf_t *sb, const char *content, bool after_query,
                                   bool last)
{
    const char *answer = content, *reason = "";
    size_t reason_len = 0;
    const char *close = strstr(content, "</think>");
    if (close) {
        answer = find_last(content, "</think>") + strlen("</think>");
        while (*answer == '\n')
            answer++;
        reason = content;
        for (const char *p = strstr(content, "<think>"); p && p < close;
             p = strstr(p + 1, "<think>"))
            reason = p + strlen("<think>");
        reason_len = (size_t)(close - reason);
        /* .rstrip('\n') then .lstrip('\n') */
        while (reason_len && reason[reason_len - 1] == '\n')
            reason_len--;
        while (reason_len && *reason == '\n') {
            reason++;
            reason_len--;
        }
    }
    kvf_strbuf_puts(sb, "<|im_start|>assistant\n");
    if (after_query && (last || reason_len)) {
        kvf_strbuf_puts(sb, "<think>\n");
        kvf_chat__append_stripped_of(sb, reason, reason_len, "\n", "\n");
        kvf_strbuf_puts(sb, "\n</think>\n\n");
        kvf_chat__append_stripped_of(sb, answer, strlen(answer), "\n", "");
    } else {
        kvf_strbuf_puts(sb, answer);
    }
    kvf_strbuf_puts(sb, "<|im_end|>\n");
}

kvf_status_t kvf_chat__render_qwen3(kvf_strbuf_t *sb, const kvf_chat__input_t *in)
{
    size_t query = last_query_index(in);
    for (size_t i = 0; i < in->n; i++) {
        const kvf_chat_message_t *m = &in->msgs[i];
        if (kvf_chat__role_is(m, "assistant"))
            append_qwen3_assistant(sb, m->content, i > query, i == in->n - 1);
        else
            append_turn(sb, m->role, m->content, strlen(m->content));
    }
    kvf_strbuf_puts(sb, "<|im_start|>assistant\n");
    return KVF_OK;
}
