/* The soak driver's HTTP/1.1 client: one POST per connection
 * ("Connection: close") to 127.0.0.1, the response read without blocking
 * from the driver's poll loop, its body decoded (Content-Length, chunked,
 * or up to the close) and split into server-sent events. */
#ifndef KVF_BENCH_SOAK_HTTP_H
#define KVF_BENCH_SOAK_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "kvf/status.h"

/* A growing byte buffer, always NUL-terminated (data may be NULL while
 * empty); its owner frees it with kvf_soak_buf_free. */
typedef struct {
    char *data;
    size_t len, cap;
} kvf_soak_buf_t;

kvf_status_t kvf_soak_buf_append(kvf_soak_buf_t *b, const char *bytes, size_t n);
/* Drops the first n bytes (n <= len). */
void kvf_soak_buf_consume(kvf_soak_buf_t *b, size_t n);
void kvf_soak_buf_free(kvf_soak_buf_t *b);

typedef struct {
    int fd;       /* -1 once closed */
    int status;   /* the response's status code, 0 until its head arrived */
    bool chunked; /* Transfer-Encoding: chunked */
    bool complete;
    long long content_left; /* Content-Length still to come; -1 when none was given */
    size_t chunk_left;      /* chunked: data bytes left in the current chunk */
    int chunk_state;
    size_t body_total;    /* decoded body bytes so far */
    kvf_soak_buf_t in;    /* received, not decoded yet */
    kvf_soak_buf_t body;  /* decoded, not taken yet */
    kvf_soak_buf_t event; /* the last event kvf_soak_http_event returned */
} kvf_soak_http_t;

/* Connects to 127.0.0.1:port and sends POST path with a JSON body; the
 * socket is then non-blocking (poll h->fd for input). On failure the
 * connection is closed and err says why. */
kvf_status_t kvf_soak_http_post(kvf_soak_http_t *h, int port, const char *path, const char *body,
                                char *err, size_t err_len);

/* Reads what the socket holds and decodes it into h->body. KVF_OK while
 * the response goes on and once it is complete (h->complete);
 * KVF_ERR_PEER when the connection ended before the response did, or
 * KVF_ERR_FORMAT when the response is malformed, with err saying where. */
kvf_status_t kvf_soak_http_pump(kvf_soak_http_t *h, char *err, size_t err_len);

/* The data of the next whole server-sent event in the body (the text
 * after "data: "), NUL-terminated, or NULL while none has arrived. Owned
 * by h, valid until the next call. */
const char *kvf_soak_http_event(kvf_soak_http_t *h);

/* Closes the connection (if open) and frees the buffers. */
void kvf_soak_http_close(kvf_soak_http_t *h);

/* JSON as the driver reads it. cJSON ends a string at U+0000, which the
 * router writes as \u0000 (JSON escapes every control character), so the
 * text would end there. kvf_soak_json_parse keeps it: before cJSON sees
 * the document, the escape \u0000 becomes \u0001\u0002 and \u0001 becomes
 * \u0001\u0001 (every U+0001 of a parsed string then starts such a pair),
 * and kvf_soak_json_text appends a string parsed so, turned back. The
 * root is NULL when json is not JSON (or out of memory), else the
 * caller's (cJSON_Delete). */
cJSON *kvf_soak_json_parse(const char *json);
kvf_status_t kvf_soak_json_text(const cJSON *string, kvf_soak_buf_t *out);

#endif
