/* Private to the HTTP front end (http.c, http_generate.c): the server's
 * state, a request's per-connection state and the response helpers. */
#ifndef KVF_HTTP_INTERNAL_H
#define KVF_HTTP_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "exchange.h"
#include "http.h"
#include "openai.h"
#include "strbuf.h"

/* A connection suspended while it waits for its exchange (http_park.c). */
typedef struct kvf_http_waiter {
    struct MHD_Connection *conn;
    kvf_exch_t *ex;
    uint64_t deadline_ns; /* of the wait in progress; 0: none */
    bool armed;           /* (park lock) watched: in the epoll set and armed list */
    bool suspended;       /* (park lock) suspended, not yet run again */
    struct kvf_http_waiter *prev, *next; /* (park lock) the armed list */
    struct kvf_http_waiter *resume_next; /* the park thread's own */
} kvf_http_waiter_t;

/* The thread that resumes parked connections. */
typedef struct {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t idle; /* suspended reached 0 */
    int epfd, stop_fd;
    kvf_http_waiter_t *armed; /* (lock) */
    uint64_t next_check;      /* (lock) the earliest armed deadline, or later */
    unsigned suspended;       /* (lock) */
    bool stopped;             /* (lock) */
} kvf_http_park_t;

typedef enum {
    KVF_HTTP_READY,
    KVF_HTTP_PARKED, /* the connection is suspended until something changes */
    KVF_HTTP_GONE,   /* the client hung up */
    KVF_HTTP_TIMEOUT,
    KVF_HTTP_STOPPING,
} kvf_http_await_t;

kvf_status_t kvf_http__park_init(kvf_http_park_t *p);
/* Suspends w->conn and watches w->ex's eventfd, its client's socket and
 * w->deadline_ns; the connection is resumed when one fires. False (not
 * suspended) once the park stops or when the socket cannot be watched.
 * Call it from the connection's handler or content reader only. */
bool kvf_http__park(kvf_http_park_t *p, kvf_http_waiter_t *w);
/* The handler or reader runs again (or the request ends): w is no longer
 * suspended. Harmless when it was not. */
void kvf_http__unpark(kvf_http_park_t *p, kvf_http_waiter_t *w);
/* Resumes every parked connection, stops the thread, and returns once
 * the server has run each of them again. The daemon still runs. */
void kvf_http__park_stop(kvf_http_park_t *p);
/* After MHD_stop_daemon. */
void kvf_http__park_fini(kvf_http_park_t *p);

/* Whether ready(w->ex) holds; if not, and the client is there, the server
 * not stopping and the wait (wait_ms from its first call) not over, parks
 * the connection. */
kvf_http_await_t kvf_http__await(kvf_http_t *h, kvf_http_waiter_t *w,
                                 bool (*ready)(const kvf_exch_t *), unsigned wait_ms);

/* The router's listening socket ahead of libmicrohttpd (http_gate.c). */
typedef struct kvf_http_gate kvf_http_gate_t;

/* HTTP status codes counted one by one on /metrics (http.c). */
#define HTTP_N_COUNTED 12

/* The router's own limits on a request's head, answered with OpenAI
 * error objects: the request target (414) and the header fields, each
 * counted as name + value + 4 (431). libmicrohttpd's per-connection
 * memory (HTTP_CONN_MEMORY) holds a head well past them, so that it
 * never meets its own limit (and answers with its own page) first unless
 * a head is larger than that memory. */
#define HTTP_MAX_TARGET  8192
#define HTTP_MAX_HEADERS 16384
#define HTTP_CONN_MEMORY (64u << 10)
/* What the gate (http_gate.c) lets through to libmicrohttpd: a request
 * line up to HTTP_GATE_MAX_LINE bytes, up to HTTP_MAX_FIELDS header
 * fields of up to HTTP_GATE_MAX_FIELD_BYTES bytes (line ends included:
 * the handler then counts them exactly); HTTP_GATE_PEEK holds such a
 * head. */
#define HTTP_GATE_MAX_LINE        (HTTP_MAX_TARGET + 32)
#define HTTP_MAX_FIELDS           256
#define HTTP_GATE_MAX_FIELD_BYTES (HTTP_MAX_HEADERS + 1024)
#define HTTP_GATE_PEEK            (HTTP_GATE_MAX_LINE + HTTP_GATE_MAX_FIELD_BYTES + 64)

struct kvf_http {
    kvf_router_t *router;
    struct MHD_Daemon *daemon;
    uint16_t port;
    char model_name[256];
    char *api_key;           /* owned; NULL: none */
    kvf_openai_server_t api; /* strings: model_name, the router's tokenizer */
    size_t max_body;
    unsigned loop_wait_ms, max_wait_ms;
    int64_t started; /* unix seconds */
    atomic_uint_fast64_t next_id;
    atomic_uint_fast64_t responses[HTTP_N_COUNTED + 1]; /* by counted_codes; last: other */
    kvf_exch_set_t exchanges;
    kvf_http_park_t park;
    unsigned header_timeout_s, idle_timeout_s;
    kvf_http_gate_t *gate;
};

/* Per HTTP request state, owned by the connection (freed on completion). */
typedef enum {
    ROUTE_NONE,
    ROUTE_COMPLETIONS,
    ROUTE_CHAT,
    ROUTE_MODELS,
    ROUTE_MODEL, /* /v1/models/{id} */
    ROUTE_HEALTH,
    ROUTE_METRICS,
} route_t;

typedef struct {
    route_t route;
    bool post;
    bool too_big;
    kvf_strbuf_t body;
    kvf_exch_t *ex; /* the connection's reference, or NULL */
    kvf_http_waiter_t wait; /* .ex: ex, once posted */
} conn_req_t;

/* Counts a response with code for /metrics. */
void kvf_http__count_response(kvf_http_t *h, unsigned code);
/* Queues resp with code and counts it for /metrics. */
enum MHD_Result kvf_http__queue_response(kvf_http_t *h, struct MHD_Connection *c, unsigned code,
                                         struct MHD_Response *resp);
/* root: consumed; header: one more header (name, value) or NULL. */
enum MHD_Result kvf_http__respond_json(kvf_http_t *h, struct MHD_Connection *c, unsigned code,
                                       cJSON *root, const char *const *header);
/* An error object; overload and unavailability say when to try again. */
enum MHD_Result kvf_http__respond_error(kvf_http_t *h, struct MHD_Connection *c,
                                        const kvf_openai_error_t *err);
/* A server_error with code and the message what. */
enum MHD_Result kvf_http__respond_unavailable(kvf_http_t *h, struct MHD_Connection *c,
                                              unsigned code, const char *what);

/* The mark *con_cls holds when the request target is too long
 * (http_head.c). */
extern const void *const kvf_http__target_too_long;
/* MHD_OPTION_URI_LOG_CALLBACK: marks a request whose target is longer
 * than HTTP_MAX_TARGET. */
void *kvf_http__on_uri(void *cls, const char *uri, struct MHD_Connection *c);
/* The head's limits, once the headers are in: true when a 414 or 431 was
 * queued (*ret). */
bool kvf_http__check_head(kvf_http_t *h, struct MHD_Connection *c, bool target_too_long,
                          enum MHD_Result *ret);

/* What the first bytes of a connection are (http_head.c). */
typedef enum {
    KVF_HTTP_HEAD_MORE,   /* not a whole head yet, within the limits */
    KVF_HTTP_HEAD_PASS,   /* a whole head that libmicrohttpd will take */
    KVF_HTTP_HEAD_REFUSE, /* *err: what to answer (libmicrohttpd would refuse it too) */
} kvf_http_head_t;
/* Looks at the first len bytes a connection sent (its request line and
 * header fields, maybe more): their shape and the gate's limits. */
kvf_http_head_t kvf_http__classify_head(const char *buf, size_t len, kvf_openai_error_t *err);

/* Binds and listens on addr (KVF_ERR_IO when it cannot); max_connections
 * and per_ip bound the connections it holds and libmicrohttpd's together.
 * h->header_timeout_s must be set. */
kvf_status_t kvf_http__gate_create(kvf_http_t *h, const struct sockaddr *addr, socklen_t len,
                                   unsigned max_connections, unsigned per_ip,
                                   kvf_http_gate_t **gate_p);
uint16_t kvf_http__gate_port(const kvf_http_gate_t *g);
/* Starts the gate's thread, which hands connections to daemon (started
 * with MHD_USE_NO_LISTEN_SOCKET and kvf_http__gate_notify). */
kvf_status_t kvf_http__gate_start(kvf_http_gate_t *g, struct MHD_Daemon *daemon);
/* MHD_OPTION_NOTIFY_CONNECTION (cls: the gate): counts libmicrohttpd's
 * connections by client address. */
void kvf_http__gate_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                           enum MHD_ConnectionNotificationCode toe);
/* Stops the thread, closes what it holds and the listening socket. */
void kvf_http__gate_stop(kvf_http_gate_t *g);
/* After MHD_stop_daemon (which reports its connections closed). NULL: no-op. */
void kvf_http__gate_destroy(kvf_http_gate_t *g);

/* A completion or chat request whose body has arrived (http_generate.c):
 * called again, with cr->ex set, each time its parked connection resumes. */
enum MHD_Result kvf_http__handle_generate(kvf_http_t *h, struct MHD_Connection *c, conn_req_t *cr);

#endif
