/* The HTTP front end's libmicrohttpd glue: the server's lifecycle, routes,
 * methods, the API key, body limits, responses, /v1/models, /health and
 * /metrics. Completion requests are http_generate.c's, their JSON
 * openai.c's, the hand-over to the router's loop exchange.c's. See
 * http.h. */
#include "http.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "chat.h"
#include "http_internal.h"
#include "kvf/clock.h"
#include "kvf/log.h"
#include "kvf/msg.h"
#include "metrics.h"

/* Status codes counted on /metrics (kvf_http_responses_total); others count
 * as "other". */
static const unsigned counted_codes[HTTP_N_COUNTED] = {200, 400, 401, 404, 405, 413,
                                                       414, 429, 431, 500, 503, 504};
#define N_COUNTED HTTP_N_COUNTED

/* ---- responses -------------------------------------------------------------------- */

void kvf_http__count_response(kvf_http_t *h, unsigned code)
{
    size_t i = 0;
    while (i < N_COUNTED && counted_codes[i] != code)
        i++;
    atomic_fetch_add(&h->responses[i], 1);
}

/* Queues resp with code and counts it for /metrics. */
enum MHD_Result kvf_http__queue_response(kvf_http_t *h, struct MHD_Connection *c, unsigned code,
                                         struct MHD_Response *resp)
{
    kvf_http__count_response(h, code);
    return MHD_queue_response(c, code, resp);
}

/* body: malloc'd, owned by the response from here on; header: one more
 * header (name, value) or NULL. */
static enum MHD_Result respond(kvf_http_t *h, struct MHD_Connection *c, unsigned code,
                               const char *type, char *body, size_t len, const char *const *header)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        len, body ? body : "", body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (header)
        MHD_add_response_header(resp, header[0], header[1]);
    enum MHD_Result ret = kvf_http__queue_response(h, c, code, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* root: consumed. */
enum MHD_Result kvf_http__respond_json(kvf_http_t *h, struct MHD_Connection *c, unsigned code,
                                       cJSON *root, const char *const *header)
{
    char *text = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!text)
        return MHD_NO;
    return respond(h, c, code, "application/json", text, strlen(text), header);
}

/* An error object; overload and unavailability say when to try again. */
enum MHD_Result kvf_http__respond_error(kvf_http_t *h, struct MHD_Connection *c,
                                        const kvf_openai_error_t *err)
{
    static const char *const retry_soon[] = {MHD_HTTP_HEADER_RETRY_AFTER, "1"};
    static const char *const retry_later[] = {MHD_HTTP_HEADER_RETRY_AFTER, "5"};
    const char *const *retry = err->code == MHD_HTTP_TOO_MANY_REQUESTS     ? retry_soon
                               : err->code == MHD_HTTP_SERVICE_UNAVAILABLE ? retry_later
                                                                           : NULL;
    return kvf_http__respond_json(h, c, err->code, kvf_openai_error_json(err), retry);
}

enum MHD_Result kvf_http__respond_unavailable(kvf_http_t *h, struct MHD_Connection *c,
                                              unsigned code, const char *what)
{
    kvf_openai_error_t err;
    kvf_openai_set_error(&err, code, "server_error", NULL, NULL, "%s", what);
    return kvf_http__respond_error(h, c, &err);
}

/* ---- /health and /metrics ------------------------------------------------------------ */

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

/* On the loop thread (kvf_exch_answer_fn). */
static void answer_health(kvf_router_t *r, kvf_exch_t *e, unsigned *code_p, char **body_p,
                          size_t *len_p)
{
    (void)e;
    char why[256];
    bool ok = kvf_router_health(r, why, sizeof(why)) == KVF_OK;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "status", ok ? "ok" : "unavailable");
    cJSON_AddStringToObject(root, ok ? "nodes" : "reason", why);
    *body_p = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    *len_p = *body_p ? strlen(*body_p) : 0;
    *code_p = ok ? 200 : 503;
}

/* On the loop thread (kvf_exch_answer_fn). */
static void answer_metrics(kvf_router_t *r, kvf_exch_t *e, unsigned *code_p, char **body_p,
                           size_t *len_p)
{
    kvf_router_snapshot_t snap;
    char *page = NULL;
    size_t page_len = 0;
    *code_p = 200;
    *body_p = NULL;
    if (kvf_router_snapshot(r, &snap) == KVF_OK) {
        if (kvf_metrics_render(kvf_router_metrics(r), &snap, &page, &page_len) != KVF_OK)
            page = NULL;
        kvf_router_snapshot_fini(&snap);
    }
    if (!page)
        return;
    kvf_strbuf_t sb;
    kvf_strbuf_init(&sb);
    kvf_strbuf_append(&sb, page, page_len);
    free(page);
    render_http_metrics(e->owner, &sb);
    if (kvf_strbuf_take(&sb, body_p, len_p) != KVF_OK)
        *body_p = NULL;
}

/* Asks the loop and waits (parked, bounded) for its answer; again each
 * time the parked connection resumes. */
static enum MHD_Result handle_query(kvf_http_t *h, struct MHD_Connection *c, conn_req_t *cr,
                                    bool metrics)
{
    if (!cr->ex) {
        kvf_exch_t *e = kvf_exch_create(&h->exchanges, metrics ? answer_metrics : answer_health);
        if (!e)
            return MHD_NO;
        e->owner = h;
        cr->ex = e;
        cr->wait = (kvf_http_waiter_t){.conn = c, .ex = e};
        if (kvf_exch_post(e) != KVF_OK)
            return kvf_http__respond_unavailable(h, c, MHD_HTTP_SERVICE_UNAVAILABLE,
                                                 "out of memory");
    }
    kvf_exch_t *e = cr->ex;
    kvf_http_await_t w = kvf_http__await(h, &cr->wait, kvf_exch_answered, h->loop_wait_ms);
    if (w == KVF_HTTP_PARKED)
        return MHD_YES;
    if (w == KVF_HTTP_TIMEOUT) {
        char what[128];
        snprintf(what, sizeof(what), "the router's event loop did not answer in %u ms",
                 h->loop_wait_ms);
        return kvf_http__respond_unavailable(h, c, MHD_HTTP_SERVICE_UNAVAILABLE, what);
    }
    if (w != KVF_HTTP_READY)
        return MHD_NO;
    pthread_mutex_lock(&e->lock);
    unsigned code = e->code;
    char *body = e->body;
    size_t len = e->body_len;
    e->body = NULL;
    pthread_mutex_unlock(&e->lock);
    if (!body)
        return kvf_http__respond_unavailable(h, c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory");
    return respond(h, c, code,
                   metrics ? "text/plain; version=0.0.4; charset=utf-8" : "application/json", body,
                   len, NULL);
}

static enum MHD_Result handle_models(kvf_http_t *h, struct MHD_Connection *c, const char *url)
{
    int max_len = kvf_router_model(h->router)->max_pos;
    if (url && strcmp(url + 11, h->model_name)) {
        kvf_openai_error_t err;
        kvf_openai_set_error(&err, MHD_HTTP_NOT_FOUND, "invalid_request_error", "model",
                             "model_not_found", "the model '%.100s' does not exist", url + 11);
        return kvf_http__respond_error(h, c, &err);
    }
    return kvf_http__respond_json(
        h, c, MHD_HTTP_OK, kvf_openai_models_json(h->model_name, h->started, max_len, !url), NULL);
}

/* ---- routing ---------------------------------------------------------------------- */

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

static enum MHD_Result respond_method_not_allowed(kvf_http_t *h, struct MHD_Connection *c,
                                                  const char *method, bool post_route)
{
    kvf_openai_error_t err;
    kvf_openai_set_error(&err, MHD_HTTP_METHOD_NOT_ALLOWED, "invalid_request_error", NULL,
                         "method_not_allowed", "method %.16s is not allowed here; use %s", method,
                         post_route ? "POST" : "GET");
    const char *const allow[] = {MHD_HTTP_HEADER_ALLOW, post_route ? "POST" : "GET, HEAD"};
    return kvf_http__respond_json(h, c, MHD_HTTP_METHOD_NOT_ALLOWED, kvf_openai_error_json(&err),
                                  allow);
}

/* Checks route, method, key and declared size when the headers are in.
 * Returns true when a response was queued (*ret). */
static bool check_headers(kvf_http_t *h, struct MHD_Connection *c, conn_req_t *cr,
                          const char *method, enum MHD_Result *ret)
{
    kvf_openai_error_t err;
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    bool post_route = cr->route == ROUTE_COMPLETIONS || cr->route == ROUTE_CHAT;
    bool protected = cr->route != ROUTE_HEALTH && cr->route != ROUTE_METRICS;
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    char *end = NULL;
    unsigned long long declared = cr->post && cl ? strtoull(cl, &end, 10) : 0;
    if (cr->route == ROUTE_NONE) {
        kvf_openai_set_error(&err, MHD_HTTP_NOT_FOUND, "invalid_request_error", NULL, "not_found",
                             "no such endpoint; this server has POST /v1/completions, POST "
                             "/v1/chat/completions, GET /v1/models, GET /health and GET "
                             "/metrics");
    } else if (post_route ? !cr->post : !get) {
        *ret = respond_method_not_allowed(h, c, method, post_route);
        return true;
    } else if (protected && !authorized(h, c)) {
        kvf_openai_set_error(&err, MHD_HTTP_UNAUTHORIZED, "authentication_error", NULL,
                             "invalid_api_key",
                             "a valid API key is required (Authorization: Bearer KEY)");
    } else if (cr->post && cl && (end == cl || declared > h->max_body)) {
        kvf_openai_set_error(&err, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error", NULL,
                             "request_too_large", "the request body is larger than %zu bytes",
                             h->max_body);
    } else {
        return false;
    }
    *ret = kvf_http__respond_error(h, c, &err);
    return true;
}

/* The request is complete (headers and body): answer it. */
static enum MHD_Result dispatch_request(kvf_http_t *h, struct MHD_Connection *c, conn_req_t *cr,
                                        const char *url)
{
    kvf_openai_error_t err;
    if (cr->too_big) {
        kvf_openai_set_error(&err, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error", NULL,
                             "request_too_large", "the request body is larger than %zu bytes",
                             h->max_body);
        return kvf_http__respond_error(h, c, &err);
    }
    if (cr->body.failed)
        return kvf_http__respond_unavailable(h, c, MHD_HTTP_SERVICE_UNAVAILABLE, "out of memory");
    switch (cr->route) {
    case ROUTE_COMPLETIONS:
    case ROUTE_CHAT:
        return kvf_http__handle_generate(h, c, cr);
    case ROUTE_MODELS:
        return handle_models(h, c, NULL);
    case ROUTE_MODEL:
        return handle_models(h, c, url);
    case ROUTE_HEALTH:
        return handle_query(h, c, cr, false);
    case ROUTE_METRICS:
        return handle_query(h, c, cr, true);
    case ROUTE_NONE:
        break;
    }
    return MHD_NO;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    (void)version;
    kvf_http_t *h = cls;
    conn_req_t *cr = *con_cls;
    if (!cr || cr == kvf_http__target_too_long) {
        bool target_too_long = cr != NULL;
        cr = calloc(1, sizeof(*cr));
        *con_cls = cr;
        if (!cr)
            return MHD_NO;
        cr->route = route_of(url);
        cr->post = !strcmp(method, "POST");
        kvf_strbuf_init(&cr->body);
        /* The headers are in: from here on the connection may be idle as
         * long as a request's body or response may take. */
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, h->idle_timeout_s);
        enum MHD_Result ret;
        if (kvf_http__check_head(h, c, target_too_long, &ret) ||
            check_headers(h, c, cr, method, &ret))
            return ret;
        return MHD_YES;
    }
    kvf_http__unpark(&h->park, &cr->wait); /* run again after a resume */
    if (*upload_data_size) {
        if (cr->body.len + *upload_data_size > h->max_body)
            cr->too_big = true;
        if (!cr->too_big)
            kvf_strbuf_append(&cr->body, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return MHD_YES;
    }
    return dispatch_request(h, c, cr, url);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    kvf_http_t *h = cls;
    conn_req_t *cr = *con_cls;
    if (!cr || cr == kvf_http__target_too_long)
        return;
    kvf_http__unpark(&h->park, &cr->wait);
    /* A kept-alive connection waits for its next request's headers. */
    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK)
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, h->header_timeout_s);
    if (cr->ex) {
        bool generate = cr->route == ROUTE_COMPLETIONS || cr->route == ROUTE_CHAT;
        if (generate && toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
            kvf_exch_cancel(cr->ex);
        kvf_exch_unref(cr->ex);
    }
    kvf_strbuf_fini(&cr->body);
    free(cr);
    *con_cls = NULL;
}

/* libmicrohttpd's messages, at most LOG_BURST in LOG_WINDOW_NS: a client
 * that opens and drops connections by the thousand must not flood the
 * log. What was left out is counted in the next window's first line. */
#define LOG_BURST     20
#define LOG_WINDOW_NS (10ull * 1000000000ull)

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static uint64_t window_start;
    static unsigned lines, dropped;
    uint64_t now = kvf_clock_ns();
    pthread_mutex_lock(&lock);
    unsigned left_out = 0;
    if (now - window_start >= LOG_WINDOW_NS) {
        window_start = now;
        left_out = dropped;
        lines = dropped = 0;
    }
    bool show = lines < LOG_BURST;
    if (show)
        lines++;
    else
        dropped++;
    pthread_mutex_unlock(&lock);
    if (left_out)
        kvf_log_warn("http: %u more messages left out in the last %llu s", left_out,
                     LOG_WINDOW_NS / 1000000000ull);
    if (!show)
        return;
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

/* The served model's name, the API key and what parsing needs. */
static kvf_status_t configure(kvf_http_t *h, const kvf_http_config_t *cfg)
{
    kvf_router_t *router = h->router;
    if (cfg->served_model_name && cfg->served_model_name[0])
        snprintf(h->model_name, sizeof(h->model_name), "%s", cfg->served_model_name);
    else
        base_name(kvf_router_model_dir(router), h->model_name, sizeof(h->model_name));
    if (cfg->api_key && cfg->api_key[0]) {
        h->api_key = strdup(cfg->api_key);
        if (!h->api_key)
            return KVF_ERR_NOMEM;
    }
    h->api.model_name = h->model_name;
    if (cfg->chat_template && cfg->chat_template[0]) {
        if (kvf_chat_template_parse(cfg->chat_template, &h->api.chat) != KVF_OK) {
            kvf_log_error("unknown chat template '%s' (" KVF_CHAT_TEMPLATE_NAMES ")",
                          cfg->chat_template);
            return KVF_ERR_INVAL;
        }
    } else {
        kvf_status_t st = kvf_chat_template_load(kvf_router_model_dir(router), &h->api.chat);
        if (st != KVF_OK)
            return st;
    }
    const kvf_tokenizer_t *tok = kvf_router_tokenizer(router);
    int64_t bos = kvf_tokenizer_bos_id(tok), eos = kvf_tokenizer_eos_id(tok);
    h->api.bos_text = bos >= 0 ? kvf_tokenizer_token_text(tok, (uint32_t)bos) : NULL;
    h->api.eos_text = eos >= 0 ? kvf_tokenizer_token_text(tok, (uint32_t)eos) : NULL;
    /* The router tokenizes prompts with BOS when the tokenizer asks for it;
     * the template's own leading BOS would then be a second one. */
    h->api.leading_bos = !kvf_tokenizer_adds_bos(tok);
    return KVF_OK;
}

/* A connection holds its socket and, while its request is in flight, the
 * exchange's eventfd: raises the soft limit on open files (up to the hard
 * one) so that max_connections of each fit beside the router's own. */
static void ensure_fd_room(unsigned max_connections)
{
    struct rlimit rl;
    rlim_t want = (rlim_t)max_connections * 2 + 256;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= want)
        return;
    rl.rlim_cur = rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want ? rl.rlim_max : want;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur < want)
        kvf_log_warn("http: %u connections need about %llu open files; the limit is %llu",
                     max_connections, (unsigned long long)want, (unsigned long long)rl.rlim_cur);
}

static kvf_status_t start_daemon(kvf_http_t *h, const kvf_http_config_t *cfg)
{
    struct sockaddr_storage addr;
    socklen_t addr_len;
    if (parse_listen(cfg->listen, &addr, &addr_len, &h->port) != KVF_OK) {
        kvf_log_error("--http %s: expected HOST:PORT with a numeric IPv4 address (or "
                      "[IPv6]:PORT)",
                      cfg->listen);
        return KVF_ERR_INVAL;
    }
    unsigned max_connections = cfg->max_connections ? cfg->max_connections : 8192;
    unsigned per_ip = cfg->max_connections_per_ip ? cfg->max_connections_per_ip : 64;
    unsigned threads = cfg->threads ? cfg->threads : 4;
    ensure_fd_room(max_connections);
    /* The router listens and checks each connection's first head (the
     * gate), then hands it over. */
    if (kvf_http__gate_create(h, (struct sockaddr *)&addr, addr_len, max_connections, per_ip,
                              &h->gate) != KVF_OK) {
        kvf_log_error("http: cannot serve on %s (address in use?)", cfg->listen);
        return KVF_ERR_IO;
    }
    /* Internal epoll threads: an idle connection or one parked while it
     * waits for the loop costs a socket and memory, no thread. */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC | MHD_USE_ERROR_LOG;
    h->daemon = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, h, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, h,
        MHD_OPTION_THREAD_POOL_SIZE, threads, MHD_OPTION_CONNECTION_LIMIT, max_connections,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_ip, MHD_OPTION_CONNECTION_TIMEOUT,
        h->header_timeout_s, MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
        MHD_OPTION_NOTIFY_CONNECTION, kvf_http__gate_notify, h->gate,
        MHD_OPTION_URI_LOG_CALLBACK, kvf_http__on_uri, h, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)HTTP_CONN_MEMORY, MHD_OPTION_END);
    if (!h->daemon || kvf_http__gate_start(h->gate, h->daemon) != KVF_OK) {
        kvf_log_error("http: cannot start the server on %s", cfg->listen);
        if (h->daemon)
            MHD_stop_daemon(h->daemon);
        kvf_http__gate_destroy(h->gate);
        h->gate = NULL;
        return KVF_ERR_IO;
    }
    h->port = kvf_http__gate_port(h->gate);
    return KVF_OK;
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
    h->header_timeout_s = cfg->header_timeout_s ? cfg->header_timeout_s : 10;
    h->idle_timeout_s = cfg->idle_timeout_s ? cfg->idle_timeout_s : 120;
    h->started = kvf_clock_unix_s();
    atomic_init(&h->next_id, 1);
    kvf_status_t st = kvf_exch_set_init(&h->exchanges, router);
    if (st != KVF_OK)
        goto fail_set;
    st = configure(h, cfg);
    if (st != KVF_OK)
        goto fail_config;
    st = kvf_http__park_init(&h->park);
    if (st != KVF_OK)
        goto fail_config;
    st = start_daemon(h, cfg);
    if (st != KVF_OK)
        goto fail_daemon;
    kvf_log_info("http: OpenAI API on %.*s:%u (model '%s', chat template %s%s)",
                 (int)(strrchr(cfg->listen, ':') - cfg->listen), cfg->listen, h->port,
                 h->model_name, kvf_chat_template_name(h->api.chat),
                 h->api_key ? ", API key required" : "");
    *http_p = h;
    return KVF_OK;
fail_daemon:
    kvf_http__park_stop(&h->park);
    kvf_http__park_fini(&h->park);
fail_config:
    free(h->api_key);
    kvf_exch_set_fini(&h->exchanges);
fail_set:
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
    kvf_http__gate_stop(h->gate);     /* no new connection */
    kvf_exch_set_stop(&h->exchanges); /* every waiting connection ends */
    kvf_http__park_stop(&h->park);    /* none is left suspended */
    MHD_stop_daemon(h->daemon);       /* joins the server's threads */
    kvf_http__gate_destroy(h->gate);
    kvf_http__park_fini(&h->park);
    /* What is left was held by tasks and sinks of the loop, which no longer
     * runs. */
    kvf_exch_set_fini(&h->exchanges);
    free(h->api_key);
    free(h);
}
