/* Chat templates of Llama 2, Llama 3 / 3.1 and Gemma / Gemma 2: each
 * reproduces its published template (tests/data/chat_templates/). */
#include <string.h>

#include "chat_internal.h"

/* Llama 3.1's system header, with its template's default date_string. */
#define LLAMA3_1_SYSTEM_HEAD                                                                       \
    "<|start_header_id|>system<|end_header_id|>\n\n"                                               \
    "Cutting Knowledge Date: December 2023\n"                                                      \
    "Today Date: 26 Jul 2024\n\n"

static void append_content_trimmed(kvf_strbuf_t *sb, const kvf_chat_message_t *m)
{
    kvf_chat__append_trimmed(sb, m->content, strlen(m->content));
}

/* <s>[INST] <<SYS>>\n..\n<</SYS>>\n\n.. [/INST] .. </s>: roles alternate
 * user/assistant after an optional first system message, which goes into
 * the first user turn; turns are stripped (the system block and the first
 * user message as one). */
kvf_status_t kvf_chat__render_llama2(kvf_strbuf_t *sb, const kvf_chat__input_t *in)
{
    const kvf_chat_message_t *msgs = in->msgs;
    size_t n = in->n;
    const char *system = NULL;
    if (kvf_chat__role_is(&msgs[0], "system")) {
        system = msgs[0].content;
        msgs++;
        n--;
    }
    if (n == 0)
        return kvf_chat__refuse(in, "the conversation needs a user message");
    for (size_t i = 0; i < n; i++)
        if (!kvf_chat__role_is(&msgs[i], i % 2 == 0 ? "user" : "assistant"))
            return kvf_chat__refuse(in, KVF_CHAT__ALTERNATE);
    for (size_t i = 0; i < n; i++) {
        if (i % 2 == 1) {
            kvf_strbuf_puts(sb, " ");
            append_content_trimmed(sb, &msgs[i]);
            kvf_strbuf_printf(sb, " %s", in->eos);
            continue;
        }
        if (i > 0 || in->leading_bos)
            kvf_strbuf_puts(sb, in->bos);
        kvf_strbuf_puts(sb, "[INST] ");
        if (i == 0 && system) {
            kvf_strbuf_t turn;
            kvf_strbuf_init(&turn);
            kvf_strbuf_printf(&turn, "<<SYS>>\n%s\n<</SYS>>\n\n%s", system, msgs[i].content);
            if (turn.failed)
                sb->failed = true;
            else
                kvf_chat__append_trimmed(sb, turn.data, turn.len);
            kvf_strbuf_fini(&turn);
        } else {
            append_content_trimmed(sb, &msgs[i]);
        }
        kvf_strbuf_puts(sb, " [/INST]");
    }
    return KVF_OK;
}

/* <|begin_of_text|><|start_header_id|>role<|end_header_id|>\n\n..<|eot_id|>,
 * contents trimmed. Llama 3.1 always starts with its dated system header,
 * which takes the (trimmed) first system message. */
kvf_status_t kvf_chat__render_llama3(kvf_strbuf_t *sb, const kvf_chat__input_t *in)
{
    size_t i = 0;
    if (in->leading_bos)
        kvf_strbuf_puts(sb, in->bos);
    if (in->template_ == KVF_CHAT_LLAMA3_1) {
        kvf_strbuf_puts(sb, LLAMA3_1_SYSTEM_HEAD);
        if (kvf_chat__role_is(&in->msgs[0], "system"))
            append_content_trimmed(sb, &in->msgs[i++]);
        kvf_strbuf_puts(sb, "<|eot_id|>");
    }
    for (; i < in->n; i++) {
        kvf_strbuf_printf(sb, "<|start_header_id|>%s<|end_header_id|>\n\n", in->msgs[i].role);
        append_content_trimmed(sb, &in->msgs[i]);
        kvf_strbuf_puts(sb, "<|eot_id|>");
    }
    kvf_strbuf_puts(sb, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return KVF_OK;
}

/* <bos><start_of_turn>user\n..<end_of_turn>\n<start_of_turn>model\n..: no
 * system role first, roles alternate user/assistant from the first
 * message (a later system message on an assistant's place is written
 * under its own role, as the template does), contents trimmed. */
kvf_status_t kvf_chat__render_gemma(kvf_strbuf_t *sb, const kvf_chat__input_t *in)
{
    if (kvf_chat__role_is(&in->msgs[0], "system"))
        return kvf_chat__refuse(in, "System role not supported");
    for (size_t i = 0; i < in->n; i++)
        if (kvf_chat__role_is(&in->msgs[i], "user") != (i % 2 == 0))
            return kvf_chat__refuse(in, KVF_CHAT__ALTERNATE);
    if (in->leading_bos)
        kvf_strbuf_puts(sb, in->bos);
    for (size_t i = 0; i < in->n; i++) {
        const kvf_chat_message_t *m = &in->msgs[i];
        kvf_strbuf_printf(sb, "<start_of_turn>%s\n",
                          kvf_chat__role_is(m, "assistant") ? "model" : m->role);
        append_content_trimmed(sb, m);
        kvf_strbuf_puts(sb, "<end_of_turn>\n");
    }
    kvf_strbuf_puts(sb, "<start_of_turn>model\n");
    return KVF_OK;
}
