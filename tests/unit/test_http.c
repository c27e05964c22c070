/* router/http in-process: a router (no nodes) and its HTTP server on an
 * ephemeral port, driven over raw sockets. Every endpoint and error that
 * does not need nodes: status codes, OpenAI error objects, the API key,
 * body limits, malformed and ill-typed requests, overload with
 * Retry-After, a client that hangs up while its request waits (the router
 * cancels it), and shutdown with a request still in flight (nothing may
 * leak: the sanitizer pass runs this test). The parts that need nodes are
 * in tests/integration/http.sh. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmocka.h>

#include "http.h"
#include "kvf/clock.h"
#include "router.h"

#define MODEL    KVF_TEST_DATA "/golden/tiny-llama-f32"
#define KEY      "sekret-key"
#define MAX_BODY 4096

typedef struct {
    kvf_router_t *router;
    kvf_http_t *http;
    pthread_t loop;
    volatile sig_atomic_t stop;
    uint16_t port;
    char inbox[128], clients[128];
    int held_fd; /* a client left waiting at shutdown */
} fixture_t;

static fixture_t fx;

static void *run_loop(void *arg)
{
    (void)arg;
    kvf_router_run(fx.router, &fx.stop);
    return NULL;
}

static int setup(void **state)
{
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    snprintf(fx.inbox, sizeof(fx.inbox), "ipc:///tmp/kvf-test-http-%d-inbox", (int)getpid());
    snprintf(fx.clients, sizeof(fx.clients), "ipc:///tmp/kvf-test-http-%d-clients", (int)getpid());
    kvf_router_config_t rc = {
        .listen_url = fx.inbox,
        .client_url = fx.clients,
        .model_dir = MODEL,
        .heartbeat_ms = 500,
        .dead_after_missed = 3,
        .max_queue = 1, /* one request may wait; the next is refused */
        .queue_timeout_ms = 60000,
        .request_timeout_ms = 120000,
        .max_attempts = 5,
        .default_max_tokens = 16,
        .prefill_timeout_ms = 60000,
        .stall_timeout_ms = 30000,
    };
    if (kvf_router_create(&rc, &fx.router) != KVF_OK)
        return -1;
    kvf_http_config_t hc = {
        .listen = "127.0.0.1:0",
        .served_model_name = "test-model",
        .api_key = KEY,
        .chat_template = "chatml",
        .max_body = MAX_BODY,
        .loop_wait_ms = 5000,
        .max_wait_ms = 60000,
    };
    if (kvf_http_create(fx.router, &hc, &fx.http) != KVF_OK)
        return -1;
    fx.port = kvf_http_port(fx.http);
    fx.held_fd = -1;
    return pthread_create(&fx.loop, NULL, run_loop, NULL) ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    fx.stop = 1;
    kvf_router_wake(fx.router);
    pthread_join(fx.loop, NULL);
    kvf_http_destroy(fx.http); /* wakes the connection still waiting */
    kvf_router_destroy(fx.router);
    if (fx.held_fd >= 0)
        close(fx.held_fd);
    return 0;
}

/* ---- a small HTTP/1.1 client ---------------------------------------------------- */

static int connect_server(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct timeval tv = {.tv_sec = 20};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(fx.port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

static void send_all(int fd, const char *data, size_t len)
{
    while (len) {
        ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
        if (n <= 0)
            return; /* the server may close early (413) */
        data += n;
        len -= (size_t)n;
    }
}

/* Sends a request (with the API key unless auth is given, "" for none). */
static int send_request(const char *method, const char *path, const char *auth, const char *body)
{
    int fd = connect_server();
    char head[1024];
    int n =
        snprintf(head, sizeof(head),
                 "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s%s%s"
                 "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                 method, path, auth ? "" : "Authorization: Bearer " KEY "\r\n",
                 auth && *auth ? auth : "", auth && *auth ? "\r\n" : "", body ? strlen(body) : 0);
    send_all(fd, head, (size_t)n);
    if (body)
        send_all(fd, body, strlen(body));
    return fd;
}

/* Reads the whole response (until the server closes); returns the status. */
static int read_response(int fd, char *resp, size_t cap)
{
    size_t len = 0;
    for (;;) {
        ssize_t n = recv(fd, resp + len, cap - 1 - len, 0);
        if (n <= 0)
            break;
        len += (size_t)n;
        if (len == cap - 1)
            break;
    }
    resp[len] = '\0';
    close(fd);
    int code = 0;
    if (sscanf(resp, "HTTP/1.%*d %d", &code) != 1)
        return -1;
    return code;
}

static char resp[1 << 16];

static int call(const char *method, const char *path, const char *auth, const char *body)
{
    return read_response(send_request(method, path, auth, body), resp, sizeof(resp));
}

static const char *body_of(const char *r)
{
    const char *b = strstr(r, "\r\n\r\n");
    return b ? b + 4 : "";
}

/* The response is an OpenAI error object with this type (and code). */
static void expect_error(const char *type, const char *code)
{
    const char *b = body_of(resp);
    char want[128];
    assert_non_null(strstr(b, "{\"error\":{\"message\":\""));
    snprintf(want, sizeof(want), "\"type\":\"%s\"", type);
    assert_non_null(strstr(b, want));
    if (code) {
        snprintf(want, sizeof(want), "\"code\":\"%s\"", code);
        assert_non_null(strstr(b, want));
    }
}

/* ---- tests ------------------------------------------------------------------------ */

static void test_health_and_models(void **state)
{
    (void)state;
    assert_int_equal(call("GET", "/health", "", NULL), 503);
    assert_non_null(strstr(body_of(resp), "\"reason\":\"no live decode node"));
    assert_int_equal(call("GET", "/v1/models", NULL, NULL), 200);
    assert_non_null(strstr(body_of(resp), "\"object\":\"list\""));
    assert_non_null(strstr(body_of(resp), "\"id\":\"test-model\""));
    assert_non_null(strstr(body_of(resp), "\"max_model_len\":256"));
    assert_int_equal(call("GET", "/v1/models/test-model", NULL, NULL), 200);
    assert_int_equal(call("GET", "/v1/models/other", NULL, NULL), 404);
    expect_error("invalid_request_error", "model_not_found");
    assert_int_equal(call("GET", "/metrics", "", NULL), 200);
    assert_non_null(strstr(resp, "Content-Type: text/plain; version=0.0.4"));
    assert_non_null(strstr(body_of(resp), "kvf_nodes{role=\"decode\",state=\"live\"} 0"));
}

static void test_routes_methods_keys(void **state)
{
    (void)state;
    assert_int_equal(call("GET", "/v2/nothing", NULL, NULL), 404);
    expect_error("invalid_request_error", "not_found");
    assert_int_equal(call("GET", "/v1/completions", NULL, NULL), 405);
    assert_non_null(strstr(resp, "Allow: POST"));
    expect_error("invalid_request_error", "method_not_allowed");
    assert_int_equal(call("POST", "/health", "", "{}"), 405);
    assert_int_equal(call("DELETE", "/v1/models", NULL, NULL), 405);
    /* The key guards /v1/, not /health or /metrics. */
    assert_int_equal(call("GET", "/v1/models", "", NULL), 401);
    expect_error("authentication_error", "invalid_api_key");
    assert_int_equal(call("GET", "/v1/models", "Authorization: Bearer wrong", NULL), 401);
    assert_int_equal(call("GET", "/v1/models", "Authorization: Bearer " KEY "x", NULL), 401);
    assert_int_equal(call("GET", "/v1/models", "Authorization: Basic " KEY, NULL), 401);
    assert_int_equal(call("POST", "/v1/completions", "", "{\"prompt\": \"hi\"}"), 401);
    assert_int_equal(call("GET", "/v1/models", "Authorization: bearer " KEY, NULL), 200);
}

static void test_body_limit(void **state)
{
    (void)state;
    size_t n = MAX_BODY + 100;
    char *big = malloc(n + 1);
    memset(big, ' ', n);
    memcpy(big, "{\"prompt\": \"", 12);
    big[n - 2] = '"';
    big[n - 1] = '}';
    big[n] = '\0';
    assert_int_equal(call("POST", "/v1/completions", NULL, big), 413);
    expect_error("invalid_request_error", "request_too_large");
    /* Chunked: no Content-Length to check first; the limit still holds. */
    int fd = connect_server();
    const char *head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                       "Authorization: Bearer " KEY "\r\nTransfer-Encoding: chunked\r\n\r\n";
    send_all(fd, head, strlen(head));
    char line[32];
    for (int i = 0; i < 3; i++) {
        int k = snprintf(line, sizeof(line), "%zx\r\n", n);
        send_all(fd, line, (size_t)k);
        send_all(fd, big, n);
        send_all(fd, "\r\n", 2);
    }
    send_all(fd, "0\r\n\r\n", 5);
    assert_int_equal(read_response(fd, resp, sizeof(resp)), 413);
    free(big);
}

static void test_bad_requests(void **state)
{
    (void)state;
    static const struct {
        const char *path, *body, *param;
    } cases[] = {
        {"/v1/completions", "{\"prompt\": \"hi\",", NULL},
        {"/v1/completions", "", NULL},
        {"/v1/completions", "[1, 2]", NULL},
        {"/v1/completions", "{}", "prompt"},
        {"/v1/completions", "{\"prompt\": 5}", "prompt"},
        {"/v1/completions", "{\"prompt\": \"\"}", "prompt"},
        {"/v1/completions", "{\"prompt\": []}", "prompt"},
        {"/v1/completions", "{\"prompt\": [1, -2]}", "prompt"},
        {"/v1/completions", "{\"prompt\": [1, 2.5]}", "prompt"},
        {"/v1/completions", "{\"prompt\": [\"a\", \"b\"]}", "prompt"},
        {"/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": \"5\"}", "max_tokens"},
        {"/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 0}", "max_tokens"},
        {"/v1/completions", "{\"prompt\": \"hi\", \"temperature\": 2.5}", "temperature"},
        {"/v1/completions", "{\"prompt\": \"hi\", \"temperature\": \"hot\"}", "temperature"},
        {"/v1/completions", "{\"prompt\": \"hi\", \"top_p\": 1.5}", "top_p"},
        {"/v1/completions", "{\"prompt\": \"hi\", \"top_k\": 1.5}", "top_k"},
        {"/v1/completions", "{\"prompt\": \"hi\", \"seed\": \"x\"}", "seed"},
        {"/v1/completions", "{\"prompt\": \"hi\", \"n\": 2}", "n"},
        {"/v1/completions", "{\"prompt\": \"hi\", \"stream\": \"yes\"}", "stream"},
        {"/v1/completions", "{\"prompt\": \"hi\", \"stream_options\": 1}", "stream_options"},
        {"/v1/completions", "{\"prompt\": \"hi\", \"stop\": 3}", "stop"},
        {"/v1/completions", "{\"prompt\": \"hi\", \"stop\": [\"\"]}", "stop"},
        {"/v1/completions",
         "{\"prompt\": \"hi\", \"stop\": [\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\"]}",
         "stop"},
        {"/v1/completions", "{\"prompt\": \"hi\", \"logprobs\": 3}", "logprobs"},
        {"/v1/completions", "{\"prompt\": \"hi\", \"echo\": true}", "echo"},
        {"/v1/completions", "{\"prompt\": \"hi\", \"model\": 7}", "model"},
        {"/v1/completions", "{\"prompt\": \"hi\", \"model\": \"gpt-4\"}", "model"},
        {"/v1/chat/completions", "{}", "messages"},
        {"/v1/chat/completions", "{\"messages\": []}", "messages"},
        {"/v1/chat/completions", "{\"messages\": [\"hi\"]}", "messages"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}",
         "messages"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}",
         "messages"},
        {"/v1/chat/completions",
         "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}",
         "messages"},
        {"/v1/chat/completions",
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_completion_tokens\": "
         "-1}",
         "max_completion_tokens"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int code = call("POST", cases[i].path, NULL, cases[i].body);
        if (code != 400)
            fail_msg("case %zu (%s): %d\n%s", i, cases[i].body, code, resp);
        expect_error("invalid_request_error", NULL);
        char want[64];
        if (cases[i].param) {
            snprintf(want, sizeof(want), "\"param\":\"%s\"", cases[i].param);
            if (!strstr(body_of(resp), want))
                fail_msg("case %zu (%s): %s", i, cases[i].body, body_of(resp));
        }
    }
    assert_int_equal(
        call("POST", "/v1/completions", NULL, "{\"prompt\": \"hi\", \"model\": \"x\"}"), 400);
    expect_error("invalid_request_error", "model_not_found");
    /* Refused by the router itself: ids outside the vocabulary, a prompt
     * longer than the context (256). */
    assert_int_equal(call("POST", "/v1/completions", NULL, "{\"prompt\": [1, 2, 512]}"), 400);
    assert_non_null(strstr(body_of(resp), "vocabulary"));
    char body[2048];
    size_t n = (size_t)snprintf(body, sizeof(body), "{\"prompt\": [1");
    for (int i = 0; i < 300; i++)
        n += (size_t)snprintf(body + n, sizeof(body) - n, ",7");
    snprintf(body + n, sizeof(body) - n, "]}");
    assert_int_equal(call("POST", "/v1/completions", NULL, body), 400);
    expect_error("invalid_request_error", "context_length_exceeded");
}

/* GET /health with a target of target_len bytes (a query pads it) and one
 * more header field of field_len bytes (none when 0); the response lands
 * in resp. */
static int call_head(size_t target_len, size_t field_len)
{
    size_t cap = target_len + field_len + 256;
    char *req = malloc(cap);
    assert_non_null(req);
    size_t n = (size_t)snprintf(req, cap, "GET /health?pad=");
    memset(req + n, 'a', target_len - (n - 4));
    n += target_len - (n - 4);
    n += (size_t)snprintf(req + n, cap - n, " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n");
    if (field_len) {
        n += (size_t)snprintf(req + n, cap - n, "X-Pad: ");
        memset(req + n, 'b', field_len - 9); /* counted with "X-Pad", ": " and CRLF */
        n += field_len - 9;
        n += (size_t)snprintf(req + n, cap - n, "\r\n");
    }
    n += (size_t)snprintf(req + n, cap - n, "\r\n");
    int fd = connect_server();
    send_all(fd, req, n);
    free(req);
    return read_response(fd, resp, sizeof(resp));
}

/* The request head's limits are the router's, answered with OpenAI error
 * objects, not libmicrohttpd's HTML: a target over 8192 bytes is 414,
 * header fields over 16384 bytes 431; just under both is served. */
static void test_head_limits(void **state)
{
    (void)state;
    assert_int_equal(call_head(8192, 0), 503); /* /health, no nodes */
    assert_non_null(strstr(body_of(resp), "\"status\":\"unavailable\""));
    assert_int_equal(call_head(8193, 0), 414);
    expect_error("invalid_request_error", "uri_too_long");
    assert_non_null(strstr(body_of(resp), "longer than 8192 bytes"));
    assert_non_null(strstr(resp, "Content-Type: application/json"));
    assert_int_equal(call_head(40000, 0), 414);
    expect_error("invalid_request_error", "uri_too_long");
    /* Host (4 + 1 + 4) and Connection (10 + 5 + 4) take 28 of the 16384. */
    assert_int_equal(call_head(100, 16384 - 28), 503);
    assert_int_equal(call_head(100, 16384 - 27), 431);
    expect_error("invalid_request_error", "header_fields_too_large");
    assert_non_null(strstr(body_of(resp), "take 16385 bytes; at most 16384"));
    assert_int_equal(call_head(100, 40000), 431);
    expect_error("invalid_request_error", "header_fields_too_large");
    /* Both limits are checked before the route, the method and the key. */
    int fd = connect_server();
    char req[9300];
    int n = snprintf(req, sizeof(req), "DELETE /nowhere/%09000d HTTP/1.1\r\nHost: x\r\n\r\n", 0);
    send_all(fd, req, (size_t)n);
    assert_int_equal(read_response(fd, resp, sizeof(resp)), 414);
    expect_error("invalid_request_error", "uri_too_long");
}

/* Sends raw bytes on a new connection; the response lands in resp. */
static int call_raw(const char *raw, size_t len)
{
    int fd = connect_server();
    send_all(fd, raw, len);
    return read_response(fd, resp, sizeof(resp));
}

/* What libmicrohttpd would refuse with its own HTML page is refused by
 * the router's gate (router/http_gate.c) first, each with an OpenAI error
 * object; what it takes still reaches the router. */
static void test_malformed_heads(void **state)
{
    (void)state;
    static const struct {
        const char *raw;
        int code;
        const char *errcode;
    } cases[] = {
        {"GET /health HTTP/1.1 extra\r\nHost: x\r\n\r\n", 400, "bad_request"},
        {"GARBAGE\r\n\r\n", 400, "bad_request"},
        {"GET /health\r\nHost: x\r\n\r\n", 400, "bad_request"},
        {"GET /health FOO/1.1\r\nHost: x\r\n\r\n", 400, "bad_request"},
        {"GET /health HTTP/2.0\r\nHost: x\r\n\r\n", 505, "http_version_not_supported"},
        {"GET /health HTTP/0.9\r\nHost: x\r\n\r\n", 505, "http_version_not_supported"},
        {"GET /health HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n", 400, "bad_request"},
        {"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 12x\r\n\r\n", 400,
         "bad_request"},
        {"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n",
         413, "request_too_large"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int code = call_raw(cases[i].raw, strlen(cases[i].raw));
        if (code != cases[i].code)
            fail_msg("case %zu: %d, expected %d\n%s", i, code, cases[i].code, resp);
        assert_non_null(strstr(resp, "Content-Type: application/json"));
        expect_error("invalid_request_error", cases[i].errcode);
    }
    /* Over the gate's limits (a request line, header fields by size and
     * by count), sent whole or not. */
    size_t big = 70000;
    char *raw = malloc(big + 64);
    assert_non_null(raw);
    int n = snprintf(raw, big + 64, "GET /");
    memset(raw + n, 'a', big);
    assert_int_equal(call_raw(raw, (size_t)n + big), 414);
    expect_error("invalid_request_error", "uri_too_long");
    n = snprintf(raw, big + 64, "GET /health HTTP/1.1\r\nX-Pad: ");
    memset(raw + n, 'b', big);
    assert_int_equal(call_raw(raw, (size_t)n + big), 431);
    expect_error("invalid_request_error", "header_fields_too_large");
    n = snprintf(raw, big + 64, "GET /health HTTP/1.1\r\n");
    for (int i = 0; i < 300; i++)
        n += snprintf(raw + n, big + 64 - (size_t)n, "X-%d: 1\r\n", i);
    n += snprintf(raw + n, big + 64 - (size_t)n, "\r\n");
    assert_int_equal(call_raw(raw, (size_t)n), 431);
    expect_error("invalid_request_error", "header_fields_too_large");
    for (size_t i = 0; i + 1 < big; i += 2)
        memcpy(raw + i, "\r\n", 2); /* only empty lines */
    assert_int_equal(call_raw(raw, big), 431);
    expect_error("invalid_request_error", "header_fields_too_large");
    free(raw);
    /* Taken: a head in two writes, empty lines before it, a folded field,
     * HTTP/1.0, a space in a field name. */
    int fd = connect_server();
    send_all(fd, "GET /heal", 9);
    send_all(fd, "th HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 43);
    assert_int_equal(read_response(fd, resp, sizeof(resp)), 503);
    static const char *const taken[] = {
        "\r\nGET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        "GET /health HTTP/1.1\r\nHost: x\r\nX-Long: a\r\n b\r\nConnection: close\r\n\r\n",
        "GET /health HTTP/1.0\r\n\r\n",
        "GET /health HTTP/1.1\r\nHost: x\r\nA b: c\r\nConnection: close\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof(taken) / sizeof(taken[0]); i++)
        if (call_raw(taken[i], strlen(taken[i])) != 503)
            fail_msg("taken %zu: %s", i, resp);
    /* A head trickled in a byte at a time, and one over the limits sent
     * the same way: each is still answered. */
    static const char *const trickled[] = {taken[0], cases[1].raw};
    static const int trickled_code[] = {503, 400};
    for (size_t i = 0; i < 2; i++) {
        fd = connect_server();
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        for (const char *p = trickled[i]; *p; p++)
            send_all(fd, p, 1);
        assert_int_equal(read_response(fd, resp, sizeof(resp)), trickled_code[i]);
    }
}

/* The value of a metric sample line "name value". */
static double metric(const char *name)
{
    assert_int_equal(call("GET", "/metrics", "", NULL), 200);
    char want[160];
    snprintf(want, sizeof(want), "\n%s ", name);
    const char *at = strstr(resp, want);
    assert_non_null(at);
    return strtod(at + strlen(want), NULL);
}

static void wait_metric(const char *name, double value)
{
    uint64_t deadline = kvf_clock_ns() + 10000000000ull;
    while (metric(name) != value) {
        if (kvf_clock_ns() > deadline)
            fail_msg("%s never became %g", name, value);
        kvf_clock_sleep_ms(50);
    }
}

static void test_overload_and_hangup(void **state)
{
    (void)state;
    double cancelled = metric("kvf_requests_total{finished_reason=\"cancelled\"}");
    /* No nodes: the first request waits in the queue (its one slot)... */
    int waiting = send_request("POST", "/v1/completions", NULL,
                               "{\"prompt\": \"hello\", \"stream\": true, \"max_tokens\": 4}");
    wait_metric("kvf_num_requests_waiting", 1);
    /* ...the next is refused: overloaded, and the cluster cannot serve. */
    assert_int_equal(call("POST", "/v1/completions", NULL,
                          "{\"prompt\": \"hello\", \"stream\": true, \"max_tokens\": 4}"),
                     503);
    assert_non_null(strstr(resp, "Retry-After: 5"));
    expect_error("server_error", "service_unavailable");
    assert_non_null(strstr(body_of(resp), "no live decode node"));
    /* The waiting client hangs up: its request is cancelled. */
    close(waiting);
    wait_metric("kvf_num_requests_waiting", 0);
    wait_metric("kvf_requests_total{finished_reason=\"cancelled\"}", cancelled + 1);
    /* A chat request (rendered with ChatML) takes the slot and is left
     * waiting at shutdown. */
    fx.held_fd = send_request("POST", "/v1/chat/completions", NULL,
                              "{\"messages\": [{\"role\": \"system\", \"content\": \"Be "
                              "brief.\"}, {\"role\": \"user\", \"content\": [{\"type\": "
                              "\"text\", \"text\": \"Hi\"}]}], \"max_tokens\": 3}");
    wait_metric("kvf_num_requests_waiting", 1);
    /* Responses by status code, from the tests before. */
    assert_true(metric("kvf_http_responses_total{code=\"413\"}") == 3);
    assert_true(metric("kvf_http_responses_total{code=\"414\"}") == 4);
    assert_true(metric("kvf_http_responses_total{code=\"431\"}") == 5);
    assert_true(metric("kvf_http_responses_total{code=\"401\"}") == 5);
    assert_true(metric("kvf_http_responses_total{code=\"503\"}") >= 2);
    assert_true(metric("kvf_http_responses_total{code=\"200\"}") >= 5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_health_and_models), cmocka_unit_test(test_routes_methods_keys),
        cmocka_unit_test(test_body_limit),        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_head_limits),       cmocka_unit_test(test_malformed_heads),
        cmocka_unit_test(test_overload_and_hangup),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
