/* A completion or chat request over HTTP: parsed (openai.c), handed to
 * the router's loop (exchange.c), then answered whole or streamed as
 * server-sent events. While it waits for the loop its connection is
 * parked (http_park.c), holding no thread. See http.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_internal.h"
#include "kvf/clock.h"
#include "kvf/log.h"
#include "kvf/msg.h"

#define HTTP_SSE_BLOCK 16384

/* The streaming response's reader's context, owned by the response. */
typedef struct {
    kvf_exch_t *e; /* a reference */
    kvf_http_t *h;
    kvf_http_waiter_t wait;
} sse_ctx_t;

/* Formats the output the loop left in the exchange as events. */
static void take_output(kvf_exch_t *e)
{
    pthread_mutex_lock(&e->lock);
    char *text = NULL;
    size_t text_len = 0;
    if (e->text.len)
        kvf_strbuf_take(&e->text, &text, &text_len);
    int finish = e->finish;
    kvf_status_t status = e->status;
    char error[sizeof(e->error)];
    memcpy(error, e->error, sizeof(error));
    uint32_t pt = e->prompt_tokens, ct = e->completion_tokens;
    pthread_mutex_unlock(&e->lock);
    if (text) {
        kvf_openai_sse_chunk(&e->reply, &e->sse, text, text_len, 0, false);
        free(text);
    }
    if (finish) {
        kvf_openai_sse_end(&e->reply, &e->sse, finish, status, error, pt, ct);
        e->sse_done = true;
    }
}

/* The streaming response's reader: when the loop has produced nothing
 * new, parks the connection and returns 0 (it runs again once resumed). */
static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    sse_ctx_t *s = cls;
    kvf_exch_t *e = s->e;
    kvf_http_t *h = s->h;
    kvf_http__unpark(&h->park, &s->wait);
    for (;;) {
        if (e->sse.failed)
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (e->sse_off < e->sse.len) {
            size_t n = e->sse.len - e->sse_off;
            if (n > max)
                n = max;
            memcpy(buf, e->sse.data + e->sse_off, n);
            e->sse_off += n;
            if (e->sse_off == e->sse.len)
                e->sse.len = e->sse_off = 0;
            return (ssize_t)n;
        }
        if (e->sse_done)
            return MHD_CONTENT_READER_END_OF_STREAM;
        /* A client that hung up is noticed here even while output keeps
         * coming (a write into a closed connection can still succeed). */
        if (kvf_exch_peer_gone(e)) {
            kvf_exch_cancel(e);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        kvf_http_await_t w = kvf_http__await(h, &s->wait, kvf_exch_has_output, h->max_wait_ms);
        if (w == KVF_HTTP_PARKED)
            return 0;
        if (w != KVF_HTTP_READY) {
            if (w == KVF_HTTP_TIMEOUT)
                kvf_log_warn("http: %s: no output for %u ms; cancelled", e->id, h->max_wait_ms);
            kvf_exch_cancel(e);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        take_output(e);
    }
}

/* The response object is gone: drop the reader's reference. */
static void sse_free(void *cls)
{
    sse_ctx_t *s = cls;
    kvf_http__unpark(&s->h->park, &s->wait);
    kvf_exch_unref(s->e);
    free(s);
}

static enum MHD_Result start_stream(kvf_http_t *h, struct MHD_Connection *c, kvf_exch_t *e)
{
    if (e->reply.chat)
        kvf_openai_sse_chunk(&e->reply, &e->sse, "", 0, 0, true);
    sse_ctx_t *s = calloc(1, sizeof(*s));
    if (!s) {
        kvf_exch_cancel(e);
        return MHD_NO;
    }
    kvf_exch_ref(e); /* the reader's */
    *s = (sse_ctx_t){.e = e, .h = h, .wait = {.conn = c, .ex = e}};
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, HTTP_SSE_BLOCK, sse_read, s, sse_free);
    if (!resp) {
        kvf_exch_unref(e);
        free(s);
        kvf_exch_cancel(e);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ret = kvf_http__queue_response(h, c, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* The answer once the request finished (or, streaming, started): an
 * error, the whole completion, or the start of the event stream. */
static enum MHD_Result answer_generate(kvf_http_t *h, struct MHD_Connection *c, kvf_exch_t *e)
{
    kvf_openai_error_t err;
    bool stream = e->req.stream;
    /* The loop writes the output fields under the lock; read them there. */
    pthread_mutex_lock(&e->lock);
    bool failed = e->finish == KVF__FINISH_REASON__FINISH_ERROR ||
                  e->finish == KVF__FINISH_REASON__FINISH_CANCELLED;
    bool started = e->completion_tokens > 0;
    if (failed && (!stream || !started))
        kvf_openai_request_error(e->status, e->unhealthy, e->error, &err);
    char *text = NULL;
    size_t text_len = 0;
    if (!failed && !stream && kvf_strbuf_take(&e->text, &text, &text_len) != KVF_OK) {
        failed = true;
        kvf_openai_set_error(&err, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", NULL, NULL,
                             "out of memory");
    }
    cJSON *answer =
        !failed && !stream
            ? kvf_openai_completion_json(&e->reply, text ? text : "", text_len, e->finish,
                                         e->prompt_tokens, e->completion_tokens)
            : NULL;
    pthread_mutex_unlock(&e->lock);
    free(text);
    if (failed && (!stream || !started))
        return kvf_http__respond_error(h, c, &err);
    if (!stream)
        return kvf_http__respond_json(h, c, MHD_HTTP_OK, answer, NULL);
    return start_stream(h, c, e);
}

/* Waits (parked) for the request to finish or, streaming, to start. */
static enum MHD_Result await_generate(kvf_http_t *h, struct MHD_Connection *c, conn_req_t *cr)
{
    kvf_exch_t *e = cr->ex;
    kvf_http_await_t w = kvf_http__await(h, &cr->wait,
                                         e->req.stream ? kvf_exch_started : kvf_exch_finished,
                                         h->max_wait_ms);
    if (w == KVF_HTTP_PARKED)
        return MHD_YES;
    if (w == KVF_HTTP_READY)
        return answer_generate(h, c, e);
    kvf_exch_cancel(e);
    if (w == KVF_HTTP_TIMEOUT) {
        kvf_openai_error_t err;
        kvf_openai_set_error(&err, MHD_HTTP_GATEWAY_TIMEOUT, "server_error", NULL, "timeout",
                             "no output within %u ms", h->max_wait_ms);
        return kvf_http__respond_error(h, c, &err);
    }
    return MHD_NO; /* the client left, or the server stops: close */
}

/* A completion or chat request whose body has arrived; again each time
 * its parked connection resumes. */
enum MHD_Result kvf_http__handle_generate(kvf_http_t *h, struct MHD_Connection *c, conn_req_t *cr)
{
    if (cr->ex)
        return await_generate(h, c, cr);
    kvf_exch_t *e = kvf_exch_create(&h->exchanges, NULL);
    if (!e)
        return MHD_NO;
    cr->ex = e; /* the connection's reference from here on */
    e->owner = h;
    kvf_openai_error_t err;
    if (!kvf_openai_parse(&h->api, cr->route == ROUTE_CHAT, cr->body.data, cr->body.len, &e->req,
                          &err))
        return kvf_http__respond_error(h, c, &err);
    snprintf(e->id, sizeof(e->id), "%s-%llx%06llx", e->req.chat ? "chatcmpl" : "cmpl",
             (unsigned long long)h->started, (unsigned long long)atomic_fetch_add(&h->next_id, 1));
    e->reply = (kvf_openai_reply_t){
        .id = e->id,
        .created = kvf_clock_unix_s(),
        .model = h->model_name,
        .chat = e->req.chat,
        .include_usage = e->req.include_usage,
    };
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    e->fd = ci ? ci->connect_fd : -1;
    cr->wait = (kvf_http_waiter_t){.conn = c, .ex = e};
    if (kvf_exch_post(e) != KVF_OK)
        return kvf_http__respond_unavailable(h, c, MHD_HTTP_SERVICE_UNAVAILABLE, "out of memory");
    return await_generate(h, c, cr);
}
