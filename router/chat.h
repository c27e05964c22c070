/* Chat templates: turns an OpenAI `messages` list into the prompt text a
 * chat model was trained on.
 *
 * Hugging Face models carry their template as Jinja in
 * tokenizer_config.json (`chat_template`). kvferry does not run Jinja: it
 * has built-in renderers for the formats of the supported model families
 * and recognises which one a model's template is by its marker strings
 * (<|start_header_id|>, <|im_start|>, <think>, [INST], <<SYS>>,
 * <start_of_turn>, ...), so that other revisions of a family's template
 * are still recognised. Each renderer reproduces the published template's
 * output with add_generation_prompt byte for byte, and refuses (with the
 * template's reason) the conversations the template refuses: the
 * templates, the reference renderings and how they were made are in
 * tests/data/chat_templates/ (README.md there).
 *
 * Llama 3.1 writes "Cutting Knowledge Date: December 2023" and "Today
 * Date: <date_string>" in a system header it always emits; kvferry renders
 * the template's own default date_string, "26 Jul 2024", as Hugging Face
 * transformers does when no date_string is passed. Qwen3 renders with
 * enable_thinking left at its default (thinking on: no empty think block
 * after the generation prompt) and drops the <think> part of assistant
 * turns before the last user query, as its template does.
 *
 * BOS: a template that starts with bos_token and a tokenizer that also
 * prepends BOS would give two. The caller says whether the rendered text
 * carries the leading BOS (leading_bos); BOS tokens inside the
 * conversation (Llama 2 and Mistral turns) are always written.
 *
 * Thread rules: pure functions; any thread. */
#ifndef KVF_CHAT_H
#define KVF_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "kvf/status.h"

typedef enum {
    KVF_CHAT_NONE = 0,     /* no known template: chat requests are refused */
    KVF_CHAT_LLAMA3,       /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
    KVF_CHAT_CHATML,       /* <|im_start|>role\n...<|im_end|>\n */
    KVF_CHAT_QWEN2,        /* ChatML with Qwen2's default system message */
    KVF_CHAT_LLAMA2,       /* <s>[INST] <<SYS>>\n..\n<</SYS>>\n\n.. [/INST] .. </s> */
    KVF_CHAT_MISTRAL,      /* <s>[INST] .. [/INST]..</s> (Mixtral-8x7B v0.1's first template) */
    KVF_CHAT_LLAMA3_1,     /* Llama 3 with the dated system header of Llama 3.1 */
    KVF_CHAT_QWEN2_5,      /* ChatML with Qwen2.5's default system message */
    KVF_CHAT_QWEN3,        /* ChatML; <think> of earlier assistant turns dropped */
    KVF_CHAT_GEMMA,        /* <bos><start_of_turn>user\n..<end_of_turn>\n, role "model" */
    KVF_CHAT_MISTRAL_V0_1, /* <s> [INST] .. [/INST] ..</s>, no system role */
    KVF_CHAT_MISTRAL_V0_2, /* as v0.1, system prepended to the first user turn */
    KVF_CHAT_MISTRAL_V0_3, /* <s>[INST] ..[/INST] ..</s>, system with the last user turn */
} kvf_chat_template_t;

/* One message; strings borrowed. role: "system", "user" or "assistant". */
typedef struct {
    const char *role;
    const char *content;
} kvf_chat_message_t;

/* The template named name ("llama3", "llama3.1", "chatml", "qwen2",
 * "qwen2.5", "qwen3", "llama2", "mistral", "mistral-v0.1", "mistral-v0.2",
 * "mistral-v0.3", "gemma"); KVF_ERR_NOT_FOUND for any other name. */
kvf_status_t kvf_chat_template_parse(const char *name, kvf_chat_template_t *template_p);

/* The template's name as kvf_chat_template_parse() accepts it ("none"
 * for KVF_CHAT_NONE). */
const char *kvf_chat_template_name(kvf_chat_template_t template_);

/* Recognises a Jinja chat template by its markers; KVF_CHAT_NONE when it is
 * none of the known formats (or jinja is NULL). */
kvf_chat_template_t kvf_chat_template_detect(const char *jinja);

/* Reads <model_dir>/tokenizer_config.json and recognises its
 * `chat_template` (a string, or a list of {name, template} where "default"
 * is used). A missing file or field is KVF_CHAT_NONE with KVF_OK; an
 * unreadable or malformed file is an error. */
kvf_status_t kvf_chat_template_load(const char *model_dir, kvf_chat_template_t *template_p);

/* The names kvf_chat_template_parse() accepts, "|"-separated (for help
 * and error messages). */
#define KVF_CHAT_TEMPLATE_NAMES                                                                    \
    "llama3|llama3.1|chatml|qwen2|qwen2.5|qwen3|llama2|mistral|mistral-v0.1|mistral-v0.2|"         \
    "mistral-v0.3|gemma"

/* Renders msgs (n_msgs >= 1) with template_ followed by the assistant's
 * generation prompt. bos_token / eos_token: the tokenizer's BOS and EOS
 * strings (used by Llama 2, Mistral, and the leading BOS of Llama 3 and
 * Gemma; NULL when the tokenizer has none). leading_bos: write the
 * conversation's first BOS (false when the tokenizer adds it itself).
 *
 * A conversation the template refuses (Gemma: a system message; Llama 2,
 * Mistral, Gemma: roles not alternating user/assistant) or kvferry cannot
 * express (an unknown role, a Llama 2 / Mistral system message not first)
 * is KVF_ERR_INVAL with a message for the client in why (the template's
 * own reason where it gives one). On success *text_p is malloc'd,
 * NUL-terminated and owned by the caller. */
kvf_status_t kvf_chat_render(kvf_chat_template_t template_, const kvf_chat_message_t *msgs,
                             size_t n_msgs, const char *bos_token, const char *eos_token,
                             bool leading_bos, char **text_p, char *why, size_t why_len);

#endif
