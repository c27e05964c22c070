/* Chat templates of Mistral Instruct: the first Mixtral / Mistral template
 * and the published ones of Mistral-7B-Instruct v0.1, v0.2 and v0.3
 * (tests/data/chat_templates/). They differ in the spaces around [INST]
 * and [/INST], in where the system message goes and in whether assistant
 * turns are trimmed. */
#include <string.h>

#include "chat_internal.h"

typedef enum {
    SYSTEM_REFUSED,    /* no system role (v0.1) */
    SYSTEM_FIRST_USER, /* prepended to the first user turn, "\n\n" between */
    SYSTEM_LAST_USER,  /* prepended to the last message if a user turn (v0.3) */
} system_place_t;

typedef struct {
    const char *open, *close; /* around a user turn */
    const char *assistant;    /* before an assistant turn */
    bool trim_assistant;
    system_place_t system;
    const char *alternate; /* the template's reason for roles out of order */
} mistral_style_t;

#define AFTER_SYSTEM_ALTERNATE                                                                     \
    "After the optional system message, conversation roles must alternate "                        \
    "user/assistant/user/assistant/..."

static mistral_style_t style_of(kvf_chat_template_t t)
{
    switch (t) {
    case KVF_CHAT_MISTRAL_V0_1:
        return (mistral_style_t){" [INST] ", " [/INST]",     " ",
                                 false,      SYSTEM_REFUSED, KVF_CHAT__ALTERNATE};
    case KVF_CHAT_MISTRAL_V0_2:
        return (mistral_style_t){" [INST] ", " [/INST]",        " ",
                                 false,      SYSTEM_FIRST_USER, AFTER_SYSTEM_ALTERNATE};
    case KVF_CHAT_MISTRAL_V0_3:
        return (mistral_style_t){"[INST] ", "[/INST]",        " ",
                                 true,      SYSTEM_LAST_USER, AFTER_SYSTEM_ALTERNATE};
    default: /* KVF_CHAT_MISTRAL; its system message is kvferry's choice */
        return (mistral_style_t){"[INST] ", " [/INST]",        "",
                                 false,     SYSTEM_FIRST_USER, KVF_CHAT__ALTERNATE};
    }
}

kvf_status_t kvf_chat__render_mistral(kvf_strbuf_t *sb, const kvf_chat__input_t *in)
{
    const mistral_style_t st = style_of(in->template_);
    const kvf_chat_message_t *msgs = in->msgs;
    size_t n = in->n;
    const char *system = NULL;
    if (kvf_chat__role_is(&msgs[0], "system")) {
        /* v0.1 checks the alternation from the system message on. */
        if (st.system == SYSTEM_REFUSED)
            return kvf_chat__refuse(in, st.alternate);
        system = msgs[0].content;
        msgs++;
        n--;
    }
    if (n == 0)
        return kvf_chat__refuse(in, "the conversation needs a user message");
    for (size_t i = 0; i < n; i++)
        if (!kvf_chat__role_is(&msgs[i], i % 2 == 0 ? "user" : "assistant"))
            return kvf_chat__refuse(in, st.alternate);
    if (in->leading_bos)
        kvf_strbuf_puts(sb, in->bos);
    for (size_t i = 0; i < n; i++) {
        const char *content = msgs[i].content;
        if (i % 2 == 1) {
            kvf_strbuf_puts(sb, st.assistant);
            if (st.trim_assistant)
                kvf_chat__append_trimmed(sb, content, strlen(content));
            else
                kvf_strbuf_puts(sb, content);
            kvf_strbuf_puts(sb, in->eos);
            continue;
        }
        kvf_strbuf_puts(sb, st.open);
        if (system && ((st.system == SYSTEM_FIRST_USER && i == 0) ||
                       (st.system == SYSTEM_LAST_USER && i == n - 1)))
            kvf_strbuf_printf(sb, "%s\n\n", system);
        kvf_strbuf_printf(sb, "%s%s", content, st.close);
    }
    return KVF_OK;
}
