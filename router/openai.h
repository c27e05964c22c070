/* The OpenAI-compatible API's JSON: completions and chat completions
 * requests parsed into the router's generation request (prompt or ids,
 * one Kvf__Sampling message), and the responses, stream events and error
 * objects rendered.
 *
 * Pure: cJSON and the chat templates (chat.h); no sockets, no threads, no
 * router state. The HTTP glue (http.c) moves the bytes. */
#ifndef KVF_OPENAI_H
#define KVF_OPENAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "chat.h"
#include "kvf/msg.h"
#include "kvf/sampling_msg.h"
#include "kvf/status.h"
#include "router.h"
#include "strbuf.h"

/* An OpenAI error object and the HTTP status it is answered with. */
typedef struct {
    unsigned code;       /* HTTP status */
    const char *type;    /* "invalid_request_error", ... (static) */
    const char *param;   /* the offending field (static), or NULL */
    const char *errcode; /* machine-readable code (static), or NULL */
    char message[400];
} kvf_openai_error_t;

void kvf_openai_set_error(kvf_openai_error_t *err, unsigned code, const char *type,
                          const char *param, const char *errcode, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* The error a request that failed with status answers with (400 for bad
 * input, 429 overloaded, 503 when the cluster cannot serve (unhealthy) or
 * out of memory, 504 timeout, 500 otherwise); error: the router's message
 * (NULL or "": the status's). */
void kvf_openai_request_error(kvf_status_t status, bool unhealthy, const char *error,
                              kvf_openai_error_t *err);

/* {"error": {message, type, param, code}}; NULL when out of memory. Owned
 * by the caller (cJSON_Delete). */
cJSON *kvf_openai_error_json(const kvf_openai_error_t *err);

/* ---- requests ------------------------------------------------------------- */

/* What parsing a request needs to know about the server. Strings borrowed. */
typedef struct {
    const char *model_name;
    kvf_chat_template_t chat;
    const char *bos_text, *eos_text; /* the tokenizer's BOS / EOS text, or NULL */
    bool leading_bos;                /* the template writes the leading BOS */
} kvf_openai_server_t;

/* A parsed request. Caller owns the struct: kvf_openai_request_fini. */
typedef struct {
    bool chat, stream, include_usage;
    char *prompt;      /* owned: the text (chat: rendered), or NULL with ids */
    size_t prompt_len; /* its bytes: it may hold U+0000 (router/json_nul.h) */
    uint32_t *ids;     /* (n_ids) owned: prompt token ids */
    size_t n_ids;
    /* The sampling parameters; sampling.stop points at stop (owned). */
    Kvf__Sampling sampling;
    char *stop[KVF_SAMPLING_MAX_STOP];
    char *cache_salt;      /* owned, or NULL: the request's prefix-cache salt */
    size_t cache_salt_len; /* its bytes: it may hold U+0000 too */
} kvf_openai_request_t;

/* Parses the JSON body (len bytes) of POST /v1/completions (chat false) or
 * /v1/chat/completions into *req. Defaults: temperature 1, top_p 1, no
 * seed, max_tokens 0 (the router's default). Options the router cannot
 * honour are refused, not ignored. False with *err (a 400, or 503 out of
 * memory) when the request is refused. req is initialised either way:
 * kvf_openai_request_fini it. */
bool kvf_openai_parse(const kvf_openai_server_t *srv, bool chat, const char *body, size_t len,
                      kvf_openai_request_t *req, kvf_openai_error_t *err);

void kvf_openai_request_fini(kvf_openai_request_t *req);

/* The router's request for req (pointing into req: valid while req is). */
void kvf_openai_request_gen(const kvf_openai_request_t *req, kvf_router_gen_t *gen_p);

/* ---- responses -------------------------------------------------------------- */

/* Who a response is: strings borrowed. */
typedef struct {
    const char *id;  /* "cmpl-..." / "chatcmpl-..." */
    int64_t created; /* unix seconds */
    const char *model;
    bool chat;
    bool include_usage; /* streaming: the usage chunk at the end */
} kvf_openai_reply_t;

/* The whole answer of a non-streaming request that finished with finish
 * (STOP or LENGTH), its text text_len bytes of UTF-8 (U+0000 included: it
 * is written \u0000). NULL when out of memory; owned by the caller. */
cJSON *kvf_openai_completion_json(const kvf_openai_reply_t *rp, const char *text, size_t text_len,
                                  int finish, uint32_t prompt_tokens, uint32_t completion_tokens);

/* Appends one server-sent event: a stream chunk with text (text_len bytes
 * as for the whole answer; NULL: an empty chat delta), finish (0: null)
 * and, for chat's first chunk, the role. */
void kvf_openai_sse_chunk(const kvf_openai_reply_t *rp, kvf_strbuf_t *sb, const char *text,
                          size_t text_len, int finish, bool role);

/* Appends the end of a stream: the final chunk (STOP, LENGTH) or an error
 * event (status, error), the usage chunk when asked for, and [DONE]. */
void kvf_openai_sse_end(const kvf_openai_reply_t *rp, kvf_strbuf_t *sb, int finish,
                        kvf_status_t status, const char *error, uint32_t prompt_tokens,
                        uint32_t completion_tokens);

/* /v1/models/{model} (list false) or the /v1/models list with the one
 * model. NULL when out of memory; owned by the caller. */
cJSON *kvf_openai_models_json(const char *model, int64_t created, int max_model_len, bool list);

#endif
