/* Chat templates: turns an OpenAI `messages` list into the prompt text a
 * chat model was trained on.
 *
 * Hugging Face models carry their template as Jinja in
 * tokenizer_config.json (`chat_template`). kvferry does not run Jinja: it
 * has built-in renderers for the formats of the supported model families
 * and recognises which one a model's template is by its marker strings
 * (<|start_header_id|>, <|im_start|>, [INST], <<SYS>>). Each renderer
 * reproduces the reference template's output with add_generation_prompt.
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
    KVF_CHAT_NONE = 0, /* no known template: chat requests are refused */
    KVF_CHAT_LLAMA3,   /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
    KVF_CHAT_CHATML,   /* <|im_start|>role\n...<|im_end|>\n */
    KVF_CHAT_QWEN2,    /* ChatML with Qwen2's default system message */
    KVF_CHAT_LLAMA2,   /* <s>[INST] <<SYS>>\n..\n<</SYS>>\n\n.. [/INST] .. </s> */
    KVF_CHAT_MISTRAL,  /* <s>[INST] .. [/INST]..</s> */
} kvf_chat_template_t;

/* One message; strings borrowed. role: "system", "user" or "assistant". */
typedef struct {
    const char *role;
    const char *content;
} kvf_chat_message_t;

/* The template named name ("llama3", "chatml", "qwen2", "llama2",
 * "mistral"); KVF_ERR_NOT_FOUND for any other name. */
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

/* Renders msgs (n_msgs >= 1) with template_ followed by the assistant's
 * generation prompt. bos_token / eos_token: the tokenizer's BOS and EOS
 * strings (used by Llama 2, Mistral and the leading BOS of Llama 3; NULL
 * when the tokenizer has none). leading_bos: write the conversation's
 * first BOS (false when the tokenizer adds it itself).
 *
 * A conversation the format cannot express (unknown role, Llama 2 /
 * Mistral roles not alternating user/assistant, a system message not
 * first) is KVF_ERR_INVAL with a message for the client in why. On
 * success *text_p is malloc'd, NUL-terminated and owned by the caller. */
kvf_status_t kvf_chat_render(kvf_chat_template_t template_, const kvf_chat_message_t *msgs,
                             size_t n_msgs, const char *bos_token, const char *eos_token,
                             bool leading_bos, char **text_p, char *why, size_t why_len);

#endif
