/* The OpenAI API's JSON: responses, stream events and the model list.
 * See openai.h. */
#include "openai.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- responses ------------------------------------------------------------------ */

static const char *finish_str(int finish)
{
    return finish == KVF__FINISH_REASON__FINISH_LENGTH ? "length" : "stop";
}

static cJSON *usage_json(uint32_t prompt, uint32_t completion)
{
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", completion);
    cJSON_AddNumberToObject(u, "total_tokens", (double)prompt + completion);
    return u;
}

/* The common head of a response object or stream chunk. */
static cJSON *response_head(const kvf_openai_reply_t *rp, const char *object)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", rp->id);
    cJSON_AddStringToObject(root, "object", object);
    cJSON_AddNumberToObject(root, "created", (double)rp->created);
    cJSON_AddStringToObject(root, "model", rp->model);
    return root;
}

/* The one choice of a response, added to root. */
static cJSON *add_choice(cJSON *root)
{
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    cJSON *choice = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, choice);
    cJSON_AddNumberToObject(choice, "index", 0);
    return choice;
}

/* Adds the generated text (len bytes of UTF-8) to obj as the string name.
 * A cJSON string ends at its first NUL, and the text may hold U+0000: the
 * literal is written here (kvf_strbuf_json_string) and added as raw JSON.
 * False when out of memory. */
static bool add_text(cJSON *obj, const char *name, const char *text, size_t len)
{
    kvf_strbuf_t lit;
    kvf_strbuf_init(&lit);
    kvf_strbuf_json_string(&lit, text, len);
    char *raw;
    if (kvf_strbuf_take(&lit, &raw, NULL) != KVF_OK)
        return false;
    bool ok = cJSON_AddRawToObject(obj, name, raw) != NULL;
    free(raw);
    return ok;
}

cJSON *kvf_openai_completion_json(const kvf_openai_reply_t *rp, const char *text, size_t text_len,
                                  int finish, uint32_t prompt_tokens, uint32_t completion_tokens)
{
    cJSON *root = response_head(rp, rp->chat ? "chat.completion" : "text_completion");
    cJSON *choice = add_choice(root);
    cJSON *msg = rp->chat ? cJSON_AddObjectToObject(choice, "message") : NULL;
    if (msg)
        cJSON_AddStringToObject(msg, "role", "assistant");
    if (!add_text(rp->chat ? msg : choice, rp->chat ? "content" : "text", text, text_len)) {
        cJSON_Delete(root);
        return NULL;
    }
    cJSON_AddNullToObject(choice, "logprobs");
    cJSON_AddStringToObject(choice, "finish_reason", finish_str(finish));
    cJSON_AddItemToObject(root, "usage", usage_json(prompt_tokens, completion_tokens));
    return root;
}

/* Appends one server-sent event carrying root (consumed). */
static void sse_event(kvf_strbuf_t *sb, cJSON *root)
{
    char *text = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!text) {
        sb->failed = true;
        return;
    }
    kvf_strbuf_printf(sb, "data: %s\n\n", text);
    free(text);
}

void kvf_openai_sse_chunk(const kvf_openai_reply_t *rp, kvf_strbuf_t *sb, const char *text,
                          size_t text_len, int finish, bool role)
{
    cJSON *root = response_head(rp, rp->chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choice = add_choice(root);
    cJSON *delta = rp->chat ? cJSON_AddObjectToObject(choice, "delta") : NULL;
    if (delta && role)
        cJSON_AddStringToObject(delta, "role", "assistant");
    bool ok = true;
    if (rp->chat && text)
        ok = add_text(delta, "content", text, text_len);
    else if (!rp->chat)
        ok = add_text(choice, "text", text ? text : "", text ? text_len : 0);
    if (!ok) {
        cJSON_Delete(root);
        sb->failed = true;
        return;
    }
    cJSON_AddNullToObject(choice, "logprobs");
    if (finish)
        cJSON_AddStringToObject(choice, "finish_reason", finish_str(finish));
    else
        cJSON_AddNullToObject(choice, "finish_reason");
    if (rp->include_usage)
        cJSON_AddNullToObject(root, "usage");
    sse_event(sb, root);
}

void kvf_openai_sse_end(const kvf_openai_reply_t *rp, kvf_strbuf_t *sb, int finish,
                        kvf_status_t status, const char *error, uint32_t prompt_tokens,
                        uint32_t completion_tokens)
{
    if (finish == KVF__FINISH_REASON__FINISH_STOP || finish == KVF__FINISH_REASON__FINISH_LENGTH) {
        kvf_openai_sse_chunk(rp, sb, rp->chat ? NULL : "", 0, finish, false);
    } else {
        kvf_openai_error_t err;
        kvf_openai_request_error(
            status, false, finish == KVF__FINISH_REASON__FINISH_CANCELLED ? "cancelled" : error,
            &err);
        sse_event(sb, kvf_openai_error_json(&err));
    }
    if (rp->include_usage) {
        cJSON *root = response_head(rp, rp->chat ? "chat.completion.chunk" : "text_completion");
        cJSON_AddArrayToObject(root, "choices");
        cJSON_AddItemToObject(root, "usage", usage_json(prompt_tokens, completion_tokens));
        sse_event(sb, root);
    }
    kvf_strbuf_puts(sb, "data: [DONE]\n\n");
}

static cJSON *model_json(const char *model, int64_t created, int max_model_len)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", model);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)created);
    cJSON_AddStringToObject(m, "owned_by", "kvferry");
    cJSON_AddNumberToObject(m, "max_model_len", max_model_len);
    return m;
}

cJSON *kvf_openai_models_json(const char *model, int64_t created, int max_model_len, bool list)
{
    if (!list)
        return model_json(model, created, max_model_len);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    cJSON_AddItemToArray(data, model_json(model, created, max_model_len));
    return root;
}
