/* Shared by router/chat*.c: the renderers of the template families and
 * the text helpers they have in common. Not for other modules. */
#ifndef KVF_CHAT_INTERNAL_H
#define KVF_CHAT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "chat.h"
#include "strbuf.h"

/* One render call's inputs. bos / eos are never NULL here ("" when the
 * tokenizer has none). */
typedef struct {
    kvf_chat_template_t template_;
    const kvf_chat_message_t *msgs;
    size_t n;
    const char *bos, *eos;
    bool leading_bos;
    char *why;
    size_t why_len;
} kvf_chat__input_t;

/* The default system messages of Qwen2 and Qwen2.5 (markers of their
 * templates too). */
#define KVF_CHAT__QWEN2_SYSTEM "You are a helpful assistant."
#define KVF_CHAT__QWEN2_5_SYSTEM                                                                   \
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

/* The reason a template gives when roles do not alternate. */
#define KVF_CHAT__ALTERNATE "Conversation roles must alternate user/assistant/user/assistant/..."

bool kvf_chat__role_is(const kvf_chat_message_t *m, const char *role);

/* Appends s[0..len) without leading and trailing whitespace: what Jinja's
 * trim and Python's str.strip() remove, for the whitespace both they and
 * JavaScript's String.prototype.trim agree on (ASCII \t\n\v\f\r and space,
 * U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000). */
void kvf_chat__append_trimmed(kvf_strbuf_t *sb, const char *s, size_t len);

/* Appends s[0..len) without the given ASCII bytes at the start (lead) and
 * the end (tail): Python's str.lstrip(chars) / rstrip(chars). */
void kvf_chat__append_stripped_of(kvf_strbuf_t *sb, const char *s, size_t len, const char *lead,
                                  const char *tail);

/* Writes why = "<reason> (<template name> chat template)"; returns
 * KVF_ERR_INVAL. */
kvf_status_t kvf_chat__refuse(const kvf_chat__input_t *in, const char *reason);

/* router/chat_llama.c */
kvf_status_t kvf_chat__render_llama2(kvf_strbuf_t *sb, const kvf_chat__input_t *in);
kvf_status_t kvf_chat__render_llama3(kvf_strbuf_t *sb, const kvf_chat__input_t *in);
kvf_status_t kvf_chat__render_gemma(kvf_strbuf_t *sb, const kvf_chat__input_t *in);

/* router/chat_mistral.c */
kvf_status_t kvf_chat__render_mistral(kvf_strbuf_t *sb, const kvf_chat__input_t *in);

/* router/chat_chatml.c */
kvf_status_t kvf_chat__render_chatml(kvf_strbuf_t *sb, const kvf_chat__input_t *in);
kvf_status_t kvf_chat__render_qwen3(kvf_strbuf_t *sb, const kvf_chat__input_t *in);

#endif
