#include "http.h"

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "chat.h"
#include "kvf/clock.h"
#include "kvf/log.h"
#include "kvf/msg.h"
#include "metrics.h"
#include "strbuf.h"

#define HTTP_MAX_STOP      8
#define HTTP_WAIT_SLICE_MS 200
#define HTTP_SSE_BLOCK     16384
#define HTTP_MAX_MESSAGES  4096

/* Status codes counted on /metrics (kvf_http_responses_total); others count
 * as "other". */
static const unsigned counted_codes[] = {200, 400, 401, 404, 405, 413, 429, 500, 503, 504};
#define N_COUNTED (sizeof(counted_codes) / sizeof(counted_codes[0]))

/* ---- exchanges: one request shared by a connection thread and the loop ------ */

typedef enum {
    EX_GENERATE,
    EX_HEALTH,
    EX_METRICS,
} ex_kind_t;

typedef struct exch exch_t;

/* One request in flight. Shared: the connection thread, its streaming
 * response, the loop's sink and each posted task hold a reference; the
 * last one to drop it frees it. Fields marked (lock) are guarded by lock;
 * (http) are written by the connection thread only, before the exchange
 * is posted or while no other thread reads them. */
struct exch {
    kvf_http_t *http;
    ex_kind_t kind;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    unsigned refs;       /* (lock) */
    exch_t *prev, *next; /* (http->lock) the server's list of exchanges */
    /* The request (http), read by the loop's submit task. */
    kvf_router_gen_t gen;
    char *prompt;              /* owned */
    uint32_t *ids;             /* (gen.n_ids) owned */
    char *stop[HTTP_MAX_STOP]; /* (gen.n_stop) owned */
    /* Output (lock), written by the loop. */
    kvf_strbuf_t text; /* text not yet written to the client */
    uint32_t prompt_tokens, completion_tokens;
    int finish; /* Kvf__FinishReason; != 0 when final */
    kvf_status_t status;
    char error[320];
    bool unhealthy;  /* refused for overload while the cluster cannot serve */
    uint64_t req_id; /* 0 until submitted */
    bool gone;       /* the client left: cancel posted */
    /* Answer of a query (lock). */
    bool answered;
    unsigned code;
    char *body; /* owned */
    size_t body_len;
    /* Response state (http). */
    int fd; /* the connection's socket, polled for a hang-up */
    bool chat, stream, include_usage;
    char id[48];
    int64_t created;
    kvf_strbuf_t sse; /* formatted events not yet handed to the server */
    size_t sse_off;
    bool sse_done;
};

struct kvf_http {
    kvf_router_t *router;
    struct MHD_Daemon *daemon;
    uint16_t port;
    char model_name[256];
    char *api_key; /* owned; NULL: none */
    kvf_chat_template_t chat;
    const char *bos_text, *eos_text; /* owned by the router's tokenizer */
    bool leading_bos;
    size_t max_body;
    unsigned loop_wait_ms, max_wait_ms;
    int64_t started; /* unix seconds */
    atomic_bool stopping;
    atomic_uint_fast64_t next_id;
    atomic_uint_fast64_t responses[N_COUNTED + 1]; /* by counted_codes; last: other */
    pthread_mutex_t lock;
    exch_t *exchanges; /* (lock) every live exchange */
};

static exch_t *exch_create(kvf_http_t *h, ex_kind_t kind)
{
    exch_t *e = calloc(1, sizeof(*e));
    if (!e)
        return NULL;
    e->http = h;
    e->kind = kind;
    e->refs = 1;
    e->fd = -1;
    pthread_mutex_init(&e->lock, NULL);
    pthread_cond_init(&e->cond, NULL);
    kvf_strbuf_init(&e->text);
    kvf_strbuf_init(&e->sse);
    pthread_mutex_lock(&h->lock);
    e->next = h->exchanges;
    if (h->exchanges)
        h->exchanges->prev = e;
    h->exchanges = e;
    pthread_mutex_unlock(&h->lock);
    return e;
}

/* Frees e (already unlinked). */
static void exch_free(exch_t *e)
{
    free(e->prompt);
    free(e->ids);
    for (size_t i = 0; i < e->gen.n_stop; i++)
        free(e->stop[i]);
    kvf_strbuf_fini(&e->text);
    kvf_strbuf_fini(&e->sse);
    free(e->body);
    pthread_cond_destroy(&e->cond);
    pthread_mutex_destroy(&e->lock);
    free(e);
}

static void exch_ref(exch_t *e)
{
    pthread_mutex_lock(&e->lock);
    e->refs++;
    pthread_mutex_unlock(&e->lock);
}

static void exch_unref(exch_t *e)
{
    pthread_mutex_lock(&e->lock);
    unsigned left = --e->refs;
    pthread_mutex_unlock(&e->lock);
    if (left)
        return;
    kvf_http_t *h = e->http;
    pthread_mutex_lock(&h->lock);
    if (e->prev)
        e->prev->next = e->next;
    else
        h->exchanges = e->next;
    if (e->next)
        e->next->prev = e->prev;
    pthread_mutex_unlock(&h->lock);
    exch_free(e);
}

/* Queues resp with code and counts it for /metrics. */
static enum MHD_Result queue_response(kvf_http_t *h, struct MHD_Connection *c, unsigned code,
                                      struct MHD_Response *resp)
{
    size_t i = 0;
    while (i < N_COUNTED && counted_codes[i] != code)
        i++;
    atomic_fetch_add(&h->responses[i], 1);
    return MHD_queue_response(c, code, resp);
}

/* Appends the HTTP response counters to a /metrics page. */
static void render_http_metrics(kvf_http_t *h, kvf_strbuf_t *sb)
{
    kvf_strbuf_puts(sb, "# HELP kvf_http_responses_total HTTP responses by status code.\n"
                        "# TYPE kvf_http_responses_total counter\n");
    for (size_t i = 0; i <= N_COUNTED; i++) {
        unsigned long long n = (unsigned long long)atomic_load(&h->responses[i]);
        if (i < N_COUNTED)
            kvf_strbuf_printf(sb, "kvf_http_responses_total{code=\"%u\"} %llu\n", counted_codes[i],
                              n);
        else
            kvf_strbuf_printf(sb, "kvf_http_responses_total{code=\"other\"} %llu\n", n);
    }
}

/* ---- the loop's side (these run on the router's loop thread) ------------------ */

static void loop_cancel(kvf_router_t *r, void *arg);

static void loop_on_chunk(void *arg, const kvf_router_chunk_t *c)
{
    exch_t *e = arg;
    pthread_mutex_lock(&e->lock);
    if (c->text_len)
        kvf_strbuf_append(&e->text, c->text, c->text_len);
    e->prompt_tokens = c->prompt_tokens;
    e->completion_tokens = c->completion_tokens;
    if (c->finish != KVF__FINISH_REASON__FINISH_NONE) {
        e->finish = c->finish;
        e->status = c->status;
        snprintf(e->error, sizeof(e->error), "%s", c->error ? c->error : "");
        if (c->status == KVF_ERR_NO_SPACE) {
            char why[200];
            if (kvf_router_health(e->http->router, why, sizeof(why)) != KVF_OK) {
                e->unhealthy = true;
                snprintf(e->error, sizeof(e->error), "the cluster cannot serve: %s", why);
            }
        }
    }
    bool final = c->finish != KVF__FINISH_REASON__FINISH_NONE;
    /* Output that cannot be kept: end the request (a cancel posted to the
     * loop, never from inside its sink) and report the error at its end. */
    bool oom_cancel = e->text.failed && !final && !e->gone;
    if (oom_cancel) {
        e->gone = true;
        e->refs++; /* the cancel task's */
    }
    if (e->text.failed && final) {
        e->finish = KVF__FINISH_REASON__FINISH_ERROR;
        e->status = KVF_ERR_NOMEM;
        snprintf(e->error, sizeof(e->error), "out of memory");
    }
    pthread_cond_broadcast(&e->cond);
    pthread_mutex_unlock(&e->lock);
    if (oom_cancel && kvf_router_post(e->http->router, loop_cancel, e) != KVF_OK)
        exch_unref(e);
    if (final)
        exch_unref(e); /* the sink's reference */
}

/* Submits e; the posted reference becomes the sink's. */
static void loop_submit(kvf_router_t *r, void *arg)
{
    exch_t *e = arg;
    pthread_mutex_lock(&e->lock);
    bool gone = e->gone;
    pthread_mutex_unlock(&e->lock);
    if (gone) {
        exch_unref(e);
        return;
    }
    kvf_router_sink_t sink = {loop_on_chunk, e};
    exch_ref(e); /* the sink may finish (and drop its reference) inside submit */
    uint64_t id = kvf_router_submit(r, &e->gen, &sink);
    pthread_mutex_lock(&e->lock);
    if (!e->finish)
        e->req_id = id;
    pthread_mutex_unlock(&e->lock);
    exch_unref(e);
}

static void loop_cancel(kvf_router_t *r, void *arg)
{
    exch_t *e = arg;
    pthread_mutex_lock(&e->lock);
    uint64_t id = e->finish ? 0 : e->req_id;
    pthread_mutex_unlock(&e->lock);
    if (id)
        kvf_router_cancel(r, id);
    exch_unref(e);
}

static void loop_query(kvf_router_t *r, void *arg)
{
    exch_t *e = arg;
    unsigned code = 200;
    char *body = NULL;
    size_t len = 0;
    if (e->kind == EX_HEALTH) {
        char why[256];
        bool ok = kvf_router_health(r, why, sizeof(why)) == KVF_OK;
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "status", ok ? "ok" : "unavailable");
        cJSON_AddStringToObject(root, ok ? "nodes" : "reason", why);
        body = cJSON_PrintUnformatted(root);
        cJSON_Delete(root);
        len = body ? strlen(body) : 0;
        code = ok ? 200 : 503;
    } else {
        kvf_router_snapshot_t snap;
        char *page = NULL;
        size_t page_len = 0;
        if (kvf_router_snapshot(r, &snap) == KVF_OK) {
            if (kvf_metrics_render(kvf_router_metrics(r), &snap, &page, &page_len) != KVF_OK)
                page = NULL;
            kvf_router_snapshot_fini(&snap);
        }
        if (page) {
            kvf_strbuf_t sb;
            kvf_strbuf_init(&sb);
            kvf_strbuf_append(&sb, page, page_len);
            free(page);
            render_http_metrics(e->http, &sb);
            if (kvf_strbuf_take(&sb, &body, &len) != KVF_OK)
                body = NULL;
        }
    }
    pthread_mutex_lock(&e->lock);
    e->answered = true;
    e->code = body ? code : 500;
    e->body = body;
    e->body_len = len;
    pthread_cond_broadcast(&e->cond);
    pthread_mutex_unlock(&e->lock);
    exch_unref(e);
}

/* ---- waiting (connection threads) -------------------------------------------- */

typedef enum {
    WAIT_OK,
    WAIT_GONE, /* the client hung up */
    WAIT_TIMEOUT,
    WAIT_STOPPING, /* the server is shutting down */
} wait_result_t;

/* True when the peer of fd closed its side (or the socket failed). */
static bool peer_gone(int fd)
{
    if (fd < 0)
        return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* With e->lock held: waits until ready(e), in slices, checking for a
 * client that left, the server stopping and the deadline. */
static wait_result_t exch_wait(exch_t *e, bool (*ready)(const exch_t *), unsigned max_ms)
{
    uint64_t deadline = kvf_clock_ns() + (uint64_t)max_ms * 1000000ull;
    while (!ready(e)) {
        if (atomic_load(&e->http->stopping))
            return WAIT_STOPPING;
        if (peer_gone(e->fd))
            return WAIT_GONE;
        uint64_t now = kvf_clock_ns();
        if (now >= deadline)
            return WAIT_TIMEOUT;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t slice = HTTP_WAIT_SLICE_MS * 1000000ull;
        if (deadline - now < slice)
            slice = deadline - now;
        ts.tv_sec += (time_t)(slice / 1000000000ull);
        ts.tv_nsec += (long)(slice % 1000000000ull);
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&e->cond, &e->lock, &ts);
    }
    return WAIT_OK;
}

static bool ready_answered(const exch_t *e)
{
    return e->answered;
}

static bool ready_finished(const exch_t *e)
{
    return e->finish != 0;
}

static bool ready_started(const exch_t *e)
{
    return e->finish != 0 || e->completion_tokens > 0;
}

static bool ready_output(const exch_t *e)
{
    return e->finish != 0 || e->text.len > 0;
}

/* Tells the loop to cancel e's request (once; nothing when it finished). */
static void exch_cancel(exch_t *e)
{
    pthread_mutex_lock(&e->lock);
    bool post = !e->gone && !e->finish;
    e->gone = true;
    if (post)
        e->refs++; /* the cancel task's */
    pthread_mutex_unlock(&e->lock);
    if (post && kvf_router_post(e->http->router, loop_cancel, e) != KVF_OK) {
        kvf_log_warn("http: cannot post a cancel: out of memory");
        exch_unref(e);
    }
}

/* ---- responses ---------------------------------------------------------------- */

static enum MHD_Result respond(kvf_http_t *h, struct MHD_Connection *c, unsigned code,
                               const char *type, char *body, size_t len, const char *retry_after)
{
    /* body: malloc'd, owned by the response from here on. */
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        len, body ? body : "", body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (retry_after)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, retry_after);
    enum MHD_Result ret = queue_response(h, c, code, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result respond_json(kvf_http_t *h, struct MHD_Connection *c, unsigned code,
                                    cJSON *root, const char *retry_after)
{
    char *text = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!text)
        return MHD_NO;
    return respond(h, c, code, "application/json", text, strlen(text), retry_after);
}

/* An OpenAI error object. */
typedef struct {
    unsigned code;
    const char *type;    /* "invalid_request_error", ... */
    const char *param;   /* the offending field, or NULL */
    const char *errcode; /* machine-readable code, or NULL */
    char message[400];
} http_error_t;

static void set_error(http_error_t *err, unsigned code, const char *type, const char *param,
                      const char *errcode, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

static void set_error(http_error_t *err, unsigned code, const char *type, const char *param,
                      const char *errcode, const char *fmt, ...)
{
    err->code = code;
    err->type = type;
    err->param = param;
    err->errcode = errcode;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
}

#define BAD_REQUEST(err, param, ...)                                                               \
    set_error((err), MHD_HTTP_BAD_REQUEST, "invalid_request_error", (param), NULL, __VA_ARGS__)

static cJSON *error_json(const http_error_t *err)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *obj = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(obj, "message", err->message);
    cJSON_AddStringToObject(obj, "type", err->type);
    if (err->param)
        cJSON_AddStringToObject(obj, "param", err->param);
    else
        cJSON_AddNullToObject(obj, "param");
    if (err->errcode)
        cJSON_AddStringToObject(obj, "code", err->errcode);
    else
        cJSON_AddNullToObject(obj, "code");
    return root;
}

static enum MHD_Result respond_error(kvf_http_t *h, struct MHD_Connection *c,
                                     const http_error_t *err)
{
    const char *retry = err->code == MHD_HTTP_TOO_MANY_REQUESTS     ? "1"
                        : err->code == MHD_HTTP_SERVICE_UNAVAILABLE ? "5"
                                                                    : NULL;
    return respond_json(h, c, err->code, error_json(err), retry);
}

/* The error a request that failed with status answers with; unhealthy:
 * refused for overload while the cluster cannot serve. */
static void request_error(kvf_status_t status, bool unhealthy, const char *error, http_error_t *err)
{
    const char *msg = error && error[0] ? error : kvf_status_str(status);
    switch (status) {
    case KVF_ERR_INVAL:
    case KVF_ERR_UNSUPPORTED:
        BAD_REQUEST(err, NULL, "%s", msg);
        break;
    case KVF_ERR_TOO_BIG:
        set_error(err, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "prompt",
                  "context_length_exceeded", "%s", msg);
        break;
    case KVF_ERR_NO_SPACE:
        if (unhealthy)
            set_error(err, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", NULL,
                      "service_unavailable", "%s", msg);
        else
            set_error(err, MHD_HTTP_TOO_MANY_REQUESTS, "rate_limit_error", NULL, "overloaded", "%s",
                      msg);
        break;
    case KVF_ERR_NOMEM:
        set_error(err, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", NULL, "service_unavailable",
                  "%s", msg);
        break;
    case KVF_ERR_TIMEOUT:
        set_error(err, MHD_HTTP_GATEWAY_TIMEOUT, "server_error", NULL, "timeout", "%s", msg);
        break;
    default:
        set_error(err, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", NULL, NULL, "%s", msg);
    }
}

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
static cJSON *response_head(const exch_t *e, const char *object)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", e->id);
    cJSON_AddStringToObject(root, "object", object);
    cJSON_AddNumberToObject(root, "created", (double)e->created);
    cJSON_AddStringToObject(root, "model", e->http->model_name);
    return root;
}

/* The whole answer of a non-streaming request (e finished without error). */
static cJSON *completion_json(const exch_t *e, const char *text)
{
    cJSON *root = response_head(e, e->chat ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    cJSON *choice = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, choice);
    cJSON_AddNumberToObject(choice, "index", 0);
    if (e->chat) {
        cJSON *msg = cJSON_AddObjectToObject(choice, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        cJSON_AddStringToObject(msg, "content", text);
    } else {
        cJSON_AddStringToObject(choice, "text", text);
    }
    cJSON_AddNullToObject(choice, "logprobs");
    cJSON_AddStringToObject(choice, "finish_reason", finish_str(e->finish));
    cJSON_AddItemToObject(root, "usage", usage_json(e->prompt_tokens, e->completion_tokens));
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

/* A stream chunk: text (may be NULL: an empty delta), finish (0: null),
 * role (chat's first chunk). */
static void sse_chunk(exch_t *e, const char *text, int finish, bool role)
{
    cJSON *root = response_head(e, e->chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    cJSON *choice = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, choice);
    cJSON_AddNumberToObject(choice, "index", 0);
    if (e->chat) {
        cJSON *delta = cJSON_AddObjectToObject(choice, "delta");
        if (role)
            cJSON_AddStringToObject(delta, "role", "assistant");
        if (text)
            cJSON_AddStringToObject(delta, "content", text);
    } else {
        cJSON_AddStringToObject(choice, "text", text ? text : "");
    }
    cJSON_AddNullToObject(choice, "logprobs");
    if (finish)
        cJSON_AddStringToObject(choice, "finish_reason", finish_str(finish));
    else
        cJSON_AddNullToObject(choice, "finish_reason");
    if (e->include_usage)
        cJSON_AddNullToObject(root, "usage");
    sse_event(&e->sse, root);
}

/* The end of a stream: the final chunk (or an error event), the usage
 * chunk when asked for, and [DONE]. */
static void sse_finish(exch_t *e, int finish, kvf_status_t status, const char *error,
                       uint32_t prompt_tokens, uint32_t completion_tokens)
{
    if (finish == KVF__FINISH_REASON__FINISH_STOP || finish == KVF__FINISH_REASON__FINISH_LENGTH) {
        sse_chunk(e, e->chat ? NULL : "", finish, false);
    } else {
        http_error_t err;
        request_error(status, false,
                      finish == KVF__FINISH_REASON__FINISH_CANCELLED ? "cancelled" : error, &err);
        sse_event(&e->sse, error_json(&err));
    }
    if (e->include_usage) {
        cJSON *root = response_head(e, e->chat ? "chat.completion.chunk" : "text_completion");
        cJSON_AddArrayToObject(root, "choices");
        cJSON_AddItemToObject(root, "usage", usage_json(prompt_tokens, completion_tokens));
        sse_event(&e->sse, root);
    }
    kvf_strbuf_puts(&e->sse, "data: [DONE]\n\n");
    e->sse_done = true;
}

/* The streaming response's reader: blocks (this is a connection's own
 * thread) until the loop has produced more output. */
static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    exch_t *e = cls;
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
        if (peer_gone(e->fd)) {
            exch_cancel(e);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        pthread_mutex_lock(&e->lock);
        wait_result_t w = exch_wait(e, ready_output, e->http->max_wait_ms);
        char *text = NULL;
        if (w == WAIT_OK && e->text.len)
            kvf_strbuf_take(&e->text, &text, NULL);
        int finish = e->finish;
        kvf_status_t status = e->status;
        char error[sizeof(e->error)];
        memcpy(error, e->error, sizeof(error));
        uint32_t pt = e->prompt_tokens, ct = e->completion_tokens;
        pthread_mutex_unlock(&e->lock);
        if (w != WAIT_OK) {
            if (w == WAIT_TIMEOUT)
                kvf_log_warn("http: %s: no output for %u ms; cancelled", e->id,
                             e->http->max_wait_ms);
            exch_cancel(e);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (text) {
            sse_chunk(e, text, 0, false);
            free(text);
        }
        if (finish)
            sse_finish(e, finish, status, error, pt, ct);
    }
}

/* The response object is gone: drop the reader's reference. */
static void sse_free(void *cls)
{
    exch_unref(cls);
}

/* ---- request parsing ---------------------------------------------------------- */

typedef enum {
    ROUTE_NONE,
    ROUTE_COMPLETIONS,
    ROUTE_CHAT,
    ROUTE_MODELS,
    ROUTE_MODEL, /* /v1/models/{id} */
    ROUTE_HEALTH,
    ROUTE_METRICS,
} route_t;

/* Per HTTP request state, owned by the connection (freed on completion). */
typedef struct {
    route_t route;
    bool post;
    bool too_big;
    kvf_strbuf_t body;
    exch_t *ex; /* the connection's reference, or NULL */
} conn_req_t;

static route_t route_of(const char *url)
{
    if (!strcmp(url, "/v1/completions"))
        return ROUTE_COMPLETIONS;
    if (!strcmp(url, "/v1/chat/completions"))
        return ROUTE_CHAT;
    if (!strcmp(url, "/v1/models"))
        return ROUTE_MODELS;
    if (!strncmp(url, "/v1/models/", 11) && url[11])
        return ROUTE_MODEL;
    if (!strcmp(url, "/health"))
        return ROUTE_HEALTH;
    if (!strcmp(url, "/metrics"))
        return ROUTE_METRICS;
    return ROUTE_NONE;
}

/* A JSON field that is absent or null counts as not given. */
static const cJSON *field(const cJSON *obj, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static bool get_bool(const cJSON *obj, const char *name, bool *out, http_error_t *err)
{
    const cJSON *v = field(obj, name);
    if (!v)
        return true;
    if (!cJSON_IsBool(v)) {
        BAD_REQUEST(err, name, "'%s' must be a boolean", name);
        return false;
    }
    *out = cJSON_IsTrue(v);
    return true;
}

static bool get_number(const cJSON *obj, const char *name, double lo, double hi, double *out,
                       http_error_t *err)
{
    const cJSON *v = field(obj, name);
    if (!v)
        return true;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
        BAD_REQUEST(err, name, "'%s' must be a number", name);
        return false;
    }
    if (v->valuedouble < lo || v->valuedouble > hi) {
        BAD_REQUEST(err, name, "'%s' must be between %g and %g", name, lo, hi);
        return false;
    }
    *out = v->valuedouble;
    return true;
}

static bool is_integer(const cJSON *v)
{
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) && v->valuedouble == floor(v->valuedouble);
}

static bool get_int(const cJSON *obj, const char *name, double lo, double hi, int64_t *out,
                    bool *given, http_error_t *err)
{
    const cJSON *v = field(obj, name);
    if (!v)
        return true;
    if (!is_integer(v)) {
        BAD_REQUEST(err, name, "'%s' must be an integer", name);
        return false;
    }
    if (v->valuedouble < lo || v->valuedouble > hi) {
        BAD_REQUEST(err, name, "'%s' must be between %.0f and %.0f", name, lo, hi);
        return false;
    }
    *out = (int64_t)v->valuedouble;
    if (given)
        *given = true;
    return true;
}

/* Copies a JSON array of token ids into e->ids. */
static bool take_ids(exch_t *e, const cJSON *arr, http_error_t *err)
{
    int n = cJSON_GetArraySize(arr);
    if (n == 0) {
        BAD_REQUEST(err, "prompt", "'prompt' must not be empty");
        return false;
    }
    e->ids = malloc((size_t)n * sizeof(*e->ids));
    if (!e->ids) {
        set_error(err, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    size_t k = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr)
    {
        if (!is_integer(v) || v->valuedouble < 0 || v->valuedouble > UINT32_MAX) {
            BAD_REQUEST(err, "prompt", "'prompt' token ids must be non-negative integers");
            return false;
        }
        e->ids[k++] = (uint32_t)v->valuedouble;
    }
    e->gen.ids = e->ids;
    e->gen.n_ids = k;
    return true;
}

static bool parse_prompt(exch_t *e, const cJSON *root, http_error_t *err)
{
    const cJSON *p = field(root, "prompt");
    if (!p) {
        BAD_REQUEST(err, "prompt", "'prompt' is required");
        return false;
    }
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) >= 1 && !cJSON_IsNumber(p->child)) {
        /* A list of prompts: one is served (n = 1, no batching). */
        if (cJSON_GetArraySize(p) > 1) {
            BAD_REQUEST(err, "prompt", "one prompt per request is supported");
            return false;
        }
        p = p->child;
    }
    if (cJSON_IsString(p)) {
        if (!p->valuestring[0]) {
            BAD_REQUEST(err, "prompt", "'prompt' must not be empty");
            return false;
        }
        e->prompt = strdup(p->valuestring);
        if (!e->prompt) {
            set_error(err, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", NULL, NULL,
                      "out of memory");
            return false;
        }
        e->gen.prompt = e->prompt;
        return true;
    }
    if (cJSON_IsArray(p))
        return take_ids(e, p, err);
    BAD_REQUEST(err, "prompt", "'prompt' must be a string or an array of token ids");
    return false;
}

/* The text of a message's content: a string, or a list of text parts. */
static bool content_text(const cJSON *content, size_t i, kvf_strbuf_t *sb, http_error_t *err)
{
    if (!content)
        return true; /* null content (an assistant turn without text) */
    if (cJSON_IsString(content)) {
        kvf_strbuf_puts(sb, content->valuestring);
        return true;
    }
    if (cJSON_IsArray(content)) {
        const cJSON *part;
        cJSON_ArrayForEach(part, content)
        {
            const cJSON *type = field(part, "type");
            const cJSON *text = field(part, "text");
            if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") ||
                !cJSON_IsString(text)) {
                BAD_REQUEST(err, "messages",
                            "message %zu: only text content parts ({\"type\": \"text\", "
                            "\"text\": ...}) are supported",
                            i);
                return false;
            }
            kvf_strbuf_puts(sb, text->valuestring);
        }
        return true;
    }
    BAD_REQUEST(err, "messages", "message %zu: 'content' must be a string or a list of parts", i);
    return false;
}

static bool parse_messages(exch_t *e, const cJSON *root, http_error_t *err)
{
    kvf_http_t *h = e->http;
    const cJSON *msgs = field(root, "messages");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0) {
        BAD_REQUEST(err, "messages", "'messages' must be a non-empty array");
        return false;
    }
    int n = cJSON_GetArraySize(msgs);
    if (n > HTTP_MAX_MESSAGES) {
        BAD_REQUEST(err, "messages", "at most %d messages", HTTP_MAX_MESSAGES);
        return false;
    }
    if (h->chat == KVF_CHAT_NONE) {
        BAD_REQUEST(err, "messages",
                    "the model '%s' has no chat template kvferry recognises; use "
                    "/v1/completions, or start kvf-router with --chat-template "
                    "llama3|chatml|qwen2|llama2|mistral",
                    h->model_name);
        return false;
    }
    kvf_chat_message_t *cm = calloc((size_t)n, sizeof(*cm));
    kvf_strbuf_t *texts = calloc((size_t)n, sizeof(*texts));
    bool ok = cm && texts;
    if (!ok)
        set_error(err, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", NULL, NULL, "out of memory");
    size_t i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs)
    {
        if (!ok)
            break;
        const cJSON *role = field(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
            BAD_REQUEST(err, "messages", "message %zu must be an object with a string 'role'", i);
            ok = false;
            break;
        }
        kvf_strbuf_init(&texts[i]);
        kvf_strbuf_puts(&texts[i], "");
        if (!content_text(field(m, "content"), i, &texts[i], err)) {
            ok = false;
            i++;
            break;
        }
        cm[i].role = role->valuestring;
        cm[i].content = texts[i].data;
        if (texts[i].failed) {
            set_error(err, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", NULL, NULL,
                      "out of memory");
            ok = false;
            i++;
            break;
        }
        i++;
    }
    if (ok) {
        char why[300];
        kvf_status_t st = kvf_chat_render(h->chat, cm, i, h->bos_text, h->eos_text, h->leading_bos,
                                          &e->prompt, why, sizeof(why));
        if (st != KVF_OK) {
            BAD_REQUEST(err, "messages", "%s", why);
            ok = false;
        } else {
            e->gen.prompt = e->prompt;
        }
    }
    for (size_t k = 0; texts && k < i; k++)
        kvf_strbuf_fini(&texts[k]);
    free(texts);
    free(cm);
    return ok;
}

static bool parse_stop(exch_t *e, const cJSON *root, http_error_t *err)
{
    const cJSON *stop = field(root, "stop");
    if (!stop)
        return true;
    const cJSON *one = cJSON_IsString(stop) ? stop : NULL;
    if (!one && !cJSON_IsArray(stop)) {
        BAD_REQUEST(err, "stop", "'stop' must be a string or an array of strings");
        return false;
    }
    if (!one && cJSON_GetArraySize(stop) > HTTP_MAX_STOP) {
        BAD_REQUEST(err, "stop", "at most %d stop strings", HTTP_MAX_STOP);
        return false;
    }
    const cJSON *v = one ? one : stop->child;
    for (; v; v = one ? NULL : v->next) {
        if (!cJSON_IsString(v) || !v->valuestring[0]) {
            BAD_REQUEST(err, "stop", "stop strings must be non-empty strings");
            return false;
        }
        e->stop[e->gen.n_stop] = strdup(v->valuestring);
        if (!e->stop[e->gen.n_stop]) {
            set_error(err, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", NULL, NULL,
                      "out of memory");
            return false;
        }
        e->gen.n_stop++;
    }
    e->gen.stop = (const char *const *)e->stop;
    return true;
}

/* Options the router cannot honour are refused rather than ignored. */
static bool refuse_unsupported(const cJSON *root, http_error_t *err)
{
    static const char *const zero_numbers[] = {"presence_penalty", "frequency_penalty"};
    for (size_t i = 0; i < sizeof(zero_numbers) / sizeof(zero_numbers[0]); i++) {
        const cJSON *v = field(root, zero_numbers[i]);
        if (v && (!cJSON_IsNumber(v) || v->valuedouble != 0)) {
            BAD_REQUEST(err, zero_numbers[i], "'%s' is not supported", zero_numbers[i]);
            return false;
        }
    }
    const cJSON *v = field(root, "logprobs");
    if (v && !cJSON_IsFalse(v) && !(cJSON_IsNumber(v) && v->valuedouble == 0)) {
        BAD_REQUEST(err, "logprobs", "'logprobs' is not supported");
        return false;
    }
    v = field(root, "echo");
    if (v && !cJSON_IsFalse(v)) {
        BAD_REQUEST(err, "echo", "'echo' is not supported");
        return false;
    }
    v = field(root, "best_of");
    if (v && !(cJSON_IsNumber(v) && v->valuedouble == 1)) {
        BAD_REQUEST(err, "best_of", "'best_of' must be 1");
        return false;
    }
    v = field(root, "suffix");
    if (v && !(cJSON_IsString(v) && !v->valuestring[0])) {
        BAD_REQUEST(err, "suffix", "'suffix' is not supported");
        return false;
    }
    static const char *const empty_lists[] = {"tools", "functions", "logit_bias"};
    for (size_t i = 0; i < sizeof(empty_lists) / sizeof(empty_lists[0]); i++) {
        v = field(root, empty_lists[i]);
        if (v && cJSON_GetArraySize(v) != 0) {
            BAD_REQUEST(err, empty_lists[i], "'%s' is not supported", empty_lists[i]);
            return false;
        }
    }
    v = field(root, "response_format");
    if (v) {
        const cJSON *type = field(v, "type");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text")) {
            BAD_REQUEST(err, "response_format", "only the 'text' response format is supported");
            return false;
        }
    }
    return true;
}

/* Fills e from a completions or chat request body. */
static bool parse_request(exch_t *e, const cJSON *root, http_error_t *err)
{
    kvf_http_t *h = e->http;
    if (!cJSON_IsObject(root)) {
        BAD_REQUEST(err, NULL, "the request body must be a JSON object");
        return false;
    }
    const cJSON *model = field(root, "model");
    if (model && !cJSON_IsString(model)) {
        BAD_REQUEST(err, "model", "'model' must be a string");
        return false;
    }
    if (model && strcmp(model->valuestring, h->model_name)) {
        set_error(err, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "model", "model_not_found",
                  "the model '%.100s' does not exist; this server serves '%s'", model->valuestring,
                  h->model_name);
        return false;
    }
    int64_t n = 1, max_tokens = 0, top_k = 0, seed = 0;
    bool has_seed = false;
    if (!get_int(root, "n", 1, 1e9, &n, NULL, err))
        return false;
    if (n != 1) {
        BAD_REQUEST(err, "n", "only n = 1 is supported");
        return false;
    }
    if (!get_bool(root, "stream", &e->stream, err))
        return false;
    const cJSON *so = field(root, "stream_options");
    if (so && !cJSON_IsObject(so)) {
        BAD_REQUEST(err, "stream_options", "'stream_options' must be an object");
        return false;
    }
    if (so && !get_bool(so, "include_usage", &e->include_usage, err))
        return false;
    if (!e->stream)
        e->include_usage = false;
    const char *max_name =
        e->chat && field(root, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if (!get_int(root, max_name, 1, UINT32_MAX, &max_tokens, NULL, err))
        return false;
    double temperature = 1.0, top_p = 1.0;
    if (!get_number(root, "temperature", 0, 2, &temperature, err) ||
        !get_number(root, "top_p", 0, 1, &top_p, err) ||
        !get_int(root, "top_k", -1, UINT32_MAX, &top_k, NULL, err) ||
        !get_int(root, "seed", -9.2e18, 9.2e18, &seed, &has_seed, err) ||
        !get_bool(root, "ignore_eos", &e->gen.ignore_eos, err) || !parse_stop(e, root, err) ||
        !refuse_unsupported(root, err))
        return false;
    e->gen.max_tokens = (uint32_t)max_tokens;
    e->gen.temperature = (float)temperature;
    e->gen.top_p = (float)top_p;
    e->gen.top_k = top_k > 0 ? (uint32_t)top_k : 0;
    e->gen.seed = (uint64_t)seed;
    e->gen.has_seed = has_seed;
    return e->chat ? parse_messages(e, root, err) : parse_prompt(e, root, err);
}

/* ---- handlers ----------------------------------------------------------------- */

static cJSON *model_json(const kvf_http_t *h)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", h->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)h->started);
    cJSON_AddStringToObject(m, "owned_by", "kvferry");
    cJSON_AddNumberToObject(m, "max_model_len", kvf_router_model(h->router)->max_pos);
    return m;
}

static enum MHD_Result handle_models(kvf_http_t *h, struct MHD_Connection *c, const char *url)
{
    if (url) {
        if (strcmp(url + 11, h->model_name)) {
            http_error_t err;
            set_error(&err, MHD_HTTP_NOT_FOUND, "invalid_request_error", "model", "model_not_found",
                      "the model '%.100s' does not exist", url + 11);
            return respond_error(h, c, &err);
        }
        return respond_json(h, c, MHD_HTTP_OK, model_json(h), NULL);
    }
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    cJSON_AddItemToArray(data, model_json(h));
    return respond_json(h, c, MHD_HTTP_OK, root, NULL);
}

/* /health and /metrics: asks the loop and waits (bounded) for its answer. */
static enum MHD_Result handle_query(kvf_http_t *h, struct MHD_Connection *c, ex_kind_t kind)
{
    http_error_t err;
    exch_t *e = exch_create(h, kind);
    if (!e)
        return MHD_NO;
    exch_ref(e); /* the task's */
    if (kvf_router_post(h->router, loop_query, e) != KVF_OK) {
        exch_unref(e);
        exch_unref(e);
        set_error(&err, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", NULL, NULL, "out of memory");
        return respond_error(h, c, &err);
    }
    pthread_mutex_lock(&e->lock);
    wait_result_t w = exch_wait(e, ready_answered, h->loop_wait_ms);
    unsigned code = e->code;
    char *body = e->body;
    size_t len = e->body_len;
    if (w == WAIT_OK)
        e->body = NULL;
    pthread_mutex_unlock(&e->lock);
    exch_unref(e);
    if (w != WAIT_OK) {
        set_error(&err, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", NULL, NULL,
                  "the router's event loop did not answer in %u ms", h->loop_wait_ms);
        return respond_error(h, c, &err);
    }
    if (!body) {
        set_error(&err, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", NULL, NULL,
                  "out of memory");
        return respond_error(h, c, &err);
    }
    return respond(h, c, code,
                   kind == EX_METRICS ? "text/plain; version=0.0.4; charset=utf-8"
                                      : "application/json",
                   body, len, NULL);
}

/* A completion or chat request whose body has arrived. */
static enum MHD_Result handle_generate(kvf_http_t *h, struct MHD_Connection *c, conn_req_t *cr)
{
    http_error_t err;
    cJSON *root = cJSON_ParseWithLength(cr->body.data ? cr->body.data : "", cr->body.len);
    if (!root) {
        BAD_REQUEST(&err, NULL, "the request body is not valid JSON");
        return respond_error(h, c, &err);
    }
    exch_t *e = exch_create(h, EX_GENERATE);
    if (!e) {
        cJSON_Delete(root);
        return MHD_NO;
    }
    cr->ex = e; /* the connection's reference from here on */
    e->chat = cr->route == ROUTE_CHAT;
    e->created = kvf_clock_unix_s();
    snprintf(e->id, sizeof(e->id), "%s-%llx%06llx", e->chat ? "chatcmpl" : "cmpl",
             (unsigned long long)h->started, (unsigned long long)atomic_fetch_add(&h->next_id, 1));
    bool ok = parse_request(e, root, &err);
    cJSON_Delete(root);
    if (!ok)
        return respond_error(h, c, &err);
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    e->fd = ci ? ci->connect_fd : -1;
    exch_ref(e); /* the submit task's, then the sink's */
    if (kvf_router_post(h->router, loop_submit, e) != KVF_OK) {
        exch_unref(e);
        set_error(&err, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", NULL, NULL, "out of memory");
        return respond_error(h, c, &err);
    }

    pthread_mutex_lock(&e->lock);
    wait_result_t w = exch_wait(e, e->stream ? ready_started : ready_finished, h->max_wait_ms);
    pthread_mutex_unlock(&e->lock);
    if (w != WAIT_OK) {
        exch_cancel(e);
        if (w == WAIT_TIMEOUT) {
            set_error(&err, MHD_HTTP_GATEWAY_TIMEOUT, "server_error", NULL, "timeout",
                      "no output within %u ms", h->max_wait_ms);
            return respond_error(h, c, &err);
        }
        return MHD_NO; /* the client left, or the server stops: close */
    }
    /* The loop writes the output fields under the lock; read them there. */
    pthread_mutex_lock(&e->lock);
    bool failed = e->finish == KVF__FINISH_REASON__FINISH_ERROR ||
                  e->finish == KVF__FINISH_REASON__FINISH_CANCELLED;
    bool started = e->completion_tokens > 0;
    if (failed && (!e->stream || !started))
        request_error(e->status, e->unhealthy, e->error, &err);
    char *text = NULL;
    if (!failed && !e->stream && kvf_strbuf_take(&e->text, &text, NULL) != KVF_OK) {
        failed = true;
        set_error(&err, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", NULL, NULL, "out of memory");
    }
    cJSON *answer = !failed && !e->stream ? completion_json(e, text ? text : "") : NULL;
    pthread_mutex_unlock(&e->lock);
    free(text);
    if (failed && (!e->stream || !started))
        return respond_error(h, c, &err);
    if (!e->stream)
        return respond_json(h, c, MHD_HTTP_OK, answer, NULL);

    if (e->chat)
        sse_chunk(e, "", 0, true);
    exch_ref(e); /* the reader's */
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, HTTP_SSE_BLOCK, sse_read, e, sse_free);
    if (!resp) {
        exch_unref(e);
        exch_cancel(e);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ret = queue_response(h, c, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* Compares without an early exit (no timing hint about the key). */
static bool key_equal(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    unsigned char diff = la != lb;
    for (size_t i = 0; i < la; i++)
        diff |= (unsigned char)a[i] ^ (unsigned char)b[i % (lb ? lb : 1)];
    return diff == 0 && lb > 0;
}

static bool authorized(const kvf_http_t *h, struct MHD_Connection *c)
{
    if (!h->api_key)
        return true;
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!auth || strncasecmp(auth, "Bearer ", 7))
        return false;
    auth += 7;
    while (*auth == ' ')
        auth++;
    return key_equal(auth, h->api_key);
}

/* Checks route, method, key and declared size when the headers are in.
 * Returns true when a response was queued (*ret). */
static bool check_headers(kvf_http_t *h, struct MHD_Connection *c, conn_req_t *cr,
                          const char *method, enum MHD_Result *ret)
{
    http_error_t err;
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    bool post_route = cr->route == ROUTE_COMPLETIONS || cr->route == ROUTE_CHAT;
    if (cr->route == ROUTE_NONE) {
        set_error(&err, MHD_HTTP_NOT_FOUND, "invalid_request_error", NULL, "not_found",
                  "no such endpoint; this server has POST /v1/completions, POST "
                  "/v1/chat/completions, GET /v1/models, GET /health and GET /metrics");
        *ret = respond_error(h, c, &err);
        return true;
    }
    if (post_route ? !cr->post : !get) {
        set_error(&err, MHD_HTTP_METHOD_NOT_ALLOWED, "invalid_request_error", NULL,
                  "method_not_allowed", "method %.16s is not allowed here; use %s", method,
                  post_route ? "POST" : "GET");
        cJSON *body = error_json(&err);
        char *text = cJSON_PrintUnformatted(body);
        cJSON_Delete(body);
        if (!text) {
            *ret = MHD_NO;
            return true;
        }
        struct MHD_Response *resp =
            MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
        if (!resp) {
            free(text);
            *ret = MHD_NO;
            return true;
        }
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, post_route ? "POST" : "GET, HEAD");
        *ret = queue_response(h, c, MHD_HTTP_METHOD_NOT_ALLOWED, resp);
        MHD_destroy_response(resp);
        return true;
    }
    bool protected = cr->route != ROUTE_HEALTH && cr->route != ROUTE_METRICS;
    if (protected && !authorized(h, c)) {
        set_error(&err, MHD_HTTP_UNAUTHORIZED, "authentication_error", NULL, "invalid_api_key",
                  "a valid API key is required (Authorization: Bearer KEY)");
        *ret = respond_error(h, c, &err);
        return true;
    }
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (cr->post && cl) {
        char *end;
        unsigned long long declared = strtoull(cl, &end, 10);
        if (end == cl || declared > h->max_body) {
            set_error(&err, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error", NULL,
                      "request_too_large", "the request body is larger than %zu bytes",
                      h->max_body);
            *ret = respond_error(h, c, &err);
            return true;
        }
    }
    return false;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    (void)version;
    kvf_http_t *h = cls;
    conn_req_t *cr = *con_cls;
    if (!cr) {
        cr = calloc(1, sizeof(*cr));
        if (!cr)
            return MHD_NO;
        *con_cls = cr;
        cr->route = route_of(url);
        cr->post = !strcmp(method, "POST");
        kvf_strbuf_init(&cr->body);
        enum MHD_Result ret;
        if (check_headers(h, c, cr, method, &ret))
            return ret;
        return MHD_YES;
    }
    if (*upload_data_size) {
        if (cr->body.len + *upload_data_size > h->max_body)
            cr->too_big = true;
        if (!cr->too_big)
            kvf_strbuf_append(&cr->body, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return MHD_YES;
    }
    http_error_t err;
    if (cr->too_big) {
        set_error(&err, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error", NULL,
                  "request_too_large", "the request body is larger than %zu bytes", h->max_body);
        return respond_error(h, c, &err);
    }
    if (cr->body.failed) {
        set_error(&err, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", NULL, NULL, "out of memory");
        return respond_error(h, c, &err);
    }
    switch (cr->route) {
    case ROUTE_COMPLETIONS:
    case ROUTE_CHAT:
        return handle_generate(h, c, cr);
    case ROUTE_MODELS:
        return handle_models(h, c, NULL);
    case ROUTE_MODEL:
        return handle_models(h, c, url);
    case ROUTE_HEALTH:
        return handle_query(h, c, EX_HEALTH);
    case ROUTE_METRICS:
        return handle_query(h, c, EX_METRICS);
    case ROUTE_NONE:
        break;
    }
    return MHD_NO;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)c;
    conn_req_t *cr = *con_cls;
    if (!cr)
        return;
    if (cr->ex) {
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
            exch_cancel(cr->ex);
        exch_unref(cr->ex);
    }
    kvf_strbuf_fini(&cr->body);
    free(cr);
    *con_cls = NULL;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof(line), fmt, ap);
    size_t n = strlen(line);
    while (n && line[n - 1] == '\n')
        line[--n] = '\0';
    kvf_log_warn("http: %s", line);
}

/* ---- lifecycle ---------------------------------------------------------------- */

/* Parses "HOST:PORT" or "[V6]:PORT" into addr. */
static kvf_status_t parse_listen(const char *listen, struct sockaddr_storage *addr,
                                 socklen_t *len_p, uint16_t *port_p)
{
    char host[128];
    const char *colon = strrchr(listen, ':');
    if (!colon || colon == listen || (size_t)(colon - listen) >= sizeof(host))
        return KVF_ERR_INVAL;
    memcpy(host, listen, (size_t)(colon - listen));
    host[colon - listen] = '\0';
    char *end;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (!colon[1] || *end || port > 65535)
        return KVF_ERR_INVAL;
    memset(addr, 0, sizeof(*addr));
    size_t hl = strlen(host);
    if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
        host[hl - 1] = '\0';
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)addr;
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        if (inet_pton(AF_INET6, host + 1, &a6->sin6_addr) != 1)
            return KVF_ERR_INVAL;
        *len_p = sizeof(*a6);
    } else {
        struct sockaddr_in *a4 = (struct sockaddr_in *)addr;
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        if (!strcmp(host, "localhost"))
            snprintf(host, sizeof(host), "127.0.0.1");
        if (inet_pton(AF_INET, host, &a4->sin_addr) != 1)
            return KVF_ERR_INVAL;
        *len_p = sizeof(*a4);
    }
    *port_p = (uint16_t)port;
    return KVF_OK;
}

/* The last component of a directory path ("/m/Llama-3/" -> "Llama-3"). */
static void base_name(const char *dir, char *out, size_t len)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    size_t start = n;
    while (start > 0 && dir[start - 1] != '/')
        start--;
    snprintf(out, len, "%.*s", (int)(n - start), dir + start);
}

kvf_status_t kvf_http_create(kvf_router_t *router, const kvf_http_config_t *cfg,
                             kvf_http_t **http_p)
{
    kvf_http_t *h = calloc(1, sizeof(*h));
    if (!h)
        return KVF_ERR_NOMEM;
    h->router = router;
    h->max_body = cfg->max_body ? cfg->max_body : (4u << 20);
    h->loop_wait_ms = cfg->loop_wait_ms ? cfg->loop_wait_ms : 5000;
    h->max_wait_ms = cfg->max_wait_ms ? cfg->max_wait_ms : 660000;
    h->started = kvf_clock_unix_s();
    atomic_init(&h->stopping, false);
    atomic_init(&h->next_id, 1);
    pthread_mutex_init(&h->lock, NULL);
    kvf_status_t st = KVF_OK;
    if (cfg->served_model_name && cfg->served_model_name[0])
        snprintf(h->model_name, sizeof(h->model_name), "%s", cfg->served_model_name);
    else
        base_name(kvf_router_model_dir(router), h->model_name, sizeof(h->model_name));
    if (cfg->api_key && cfg->api_key[0]) {
        h->api_key = strdup(cfg->api_key);
        if (!h->api_key) {
            st = KVF_ERR_NOMEM;
            goto fail_config;
        }
    }
    if (cfg->chat_template && cfg->chat_template[0]) {
        st = kvf_chat_template_parse(cfg->chat_template, &h->chat);
        if (st != KVF_OK) {
            kvf_log_error("unknown chat template '%s' (llama3, chatml, qwen2, llama2, mistral)",
                          cfg->chat_template);
            st = KVF_ERR_INVAL;
            goto fail_config;
        }
    } else {
        st = kvf_chat_template_load(kvf_router_model_dir(router), &h->chat);
        if (st != KVF_OK)
            goto fail_config;
    }
    const kvf_tokenizer_t *tok = kvf_router_tokenizer(router);
    int64_t bos = kvf_tokenizer_bos_id(tok), eos = kvf_tokenizer_eos_id(tok);
    h->bos_text = bos >= 0 ? kvf_tokenizer_token_text(tok, (uint32_t)bos) : NULL;
    h->eos_text = eos >= 0 ? kvf_tokenizer_token_text(tok, (uint32_t)eos) : NULL;
    /* The router tokenizes prompts with BOS when the tokenizer asks for it;
     * the template's own leading BOS would then be a second one. */
    h->leading_bos = !kvf_tokenizer_adds_bos(tok);

    struct sockaddr_storage addr;
    socklen_t addr_len;
    if (parse_listen(cfg->listen, &addr, &addr_len, &h->port) != KVF_OK) {
        kvf_log_error("--http %s: expected HOST:PORT with a numeric IPv4 address (or "
                      "[IPv6]:PORT)",
                      cfg->listen);
        st = KVF_ERR_INVAL;
        goto fail_config;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_POLL | MHD_USE_ERROR_LOG;
    if (addr.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    h->daemon = MHD_start_daemon(flags, h->port, NULL, NULL, on_request, h,
                                 MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, h, MHD_OPTION_SOCK_ADDR,
                                 (struct sockaddr *)&addr, MHD_OPTION_CONNECTION_LIMIT,
                                 (unsigned)(cfg->max_connections ? cfg->max_connections : 512),
                                 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120,
                                 MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_END);
    if (!h->daemon) {
        kvf_log_error("http: cannot serve on %s (address in use?)", cfg->listen);
        st = KVF_ERR_IO;
        goto fail_config;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    if (di && di->port)
        h->port = di->port;
    kvf_log_info("http: OpenAI API on %.*s:%u (model '%s', chat template %s%s)",
                 (int)(strrchr(cfg->listen, ':') - cfg->listen), cfg->listen, h->port,
                 h->model_name, kvf_chat_template_name(h->chat),
                 h->api_key ? ", API key required" : "");
    *http_p = h;
    return KVF_OK;
fail_config:
    free(h->api_key);
    pthread_mutex_destroy(&h->lock);
    free(h);
    return st;
}

uint16_t kvf_http_port(const kvf_http_t *h)
{
    return h->port;
}

void kvf_http_destroy(kvf_http_t *h)
{
    if (!h)
        return;
    atomic_store(&h->stopping, true);
    MHD_stop_daemon(h->daemon); /* joins every connection thread */
    /* What is left was held by tasks and sinks of the loop, which no longer
     * runs. */
    while (h->exchanges) {
        exch_t *e = h->exchanges;
        h->exchanges = e->next;
        exch_free(e);
    }
    pthread_mutex_destroy(&h->lock);
    free(h->api_key);
    free(h);
}
