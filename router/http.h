/* The router's HTTP front end: an OpenAI-compatible API (completions and
 * chat completions, streaming as server-sent events), /v1/models, /health
 * and Prometheus /metrics, served by libmicrohttpd.
 *
 * Threads: libmicrohttpd runs a few epoll threads (cfg->threads) for
 * every connection; an idle connection costs no thread. Those threads
 * never touch router state: each request becomes an exchange (exchange.h:
 * shared, reference-counted) that is handed to the loop with
 * kvf_router_post(); on the loop, kvf_router_submit() gets a sink that
 * appends the output to the exchange under its mutex and signals its
 * eventfd. While a request waits for the loop its connection is suspended
 * (parked, http_park.c): one thread watches every parked connection's
 * eventfd and client socket together and resumes the connection on
 * output, a hang-up, the server stopping or its deadline; its handler or
 * streaming reader then writes what arrived. A client that disconnects or a
 * write that fails posts a cancel, which frees the request's KV blocks.
 * /health and /metrics are read the same way: a task posted to the loop
 * fills in the answer.
 *
 * Limits: max_connections in all, max_connections_per_ip from one
 * address (kept below the total so that one client cannot take /health
 * and /metrics away from the others); a connection may be idle for
 * header_timeout_s before its request's headers arrive, idle_timeout_s
 * once they have (a parked connection is never timed out: its own wait
 * is bounded by max_wait_ms). A request target over 8 KiB gets 414 and
 * header fields over 16 KiB (or more than 256 of them) 431, all OpenAI
 * error objects (http_head.c).
 *
 * The router listens itself (http_gate.c): a connection's first head is
 * read without being taken from the socket and checked; what
 * libmicrohttpd 0.9.75 would answer with its own HTML page (it offers no
 * hook for it) the gate answers with an OpenAI error object instead: a
 * malformed request line or header field (400), an HTTP version other
 * than 1.x (505), a malformed or 64-bit-overflowing Content-Length (400,
 * 413), a head past the limits (414, 431). The rest is handed to
 * libmicrohttpd. Still libmicrohttpd's own page: a malformed chunked body,
 * a malformed later request on a kept-alive connection (the gate sees
 * only the first), and a head trickled in over 32 pieces (handed over
 * unchecked, to bound the gate's work).
 *
 * Files: http.c (the server, routes, /v1/models, /health, /metrics),
 * http_gate.c (the listening socket, the first head's check), http_head.c
 * (the head's limits and shape), http_generate.c (completions: whole or streamed), http_park.c (parked
 * connections), openai.c (the JSON),
 * exchange.c (the hand-over to the loop). */
#ifndef KVF_HTTP_H
#define KVF_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "kvf/status.h"
#include "router.h"

typedef struct kvf_http kvf_http_t;

typedef struct {
    const char *listen;            /* "HOST:PORT" (IPv4 or [IPv6]) */
    const char *served_model_name; /* NULL or "": the model directory's base name */
    const char *api_key;           /* NULL or "": no authentication */
    const char *chat_template;     /* NULL or "": recognise the model's; or a name (chat.h) */
    size_t max_body;               /* request body limit in bytes (0: 4 MiB) */
    unsigned max_connections;      /* concurrent connections (0: 8192) */
    unsigned max_connections_per_ip; /* from one client address (0: 64) */
    unsigned header_timeout_s;     /* a connection idle before its request's headers (0: 10) */
    unsigned idle_timeout_s;       /* idle with a request in flight (0: 120); not while parked */
    unsigned threads;              /* the server's epoll threads (0: 4) */
    unsigned loop_wait_ms;         /* longest wait for the loop's answer to a query (0: 5000) */
    unsigned max_wait_ms;          /* longest wait for a request's next output (0: 660000) */
} kvf_http_config_t;

/* Starts serving on cfg->listen. Requests reach router through
 * kvf_router_post(), so they are answered once kvf_router_run() runs.
 * *http_p is owned by the caller: kvf_http_destroy(). Fails (logged) when
 * the address does not parse or cannot be bound, or the chat template
 * name is unknown. Raises the process's soft limit on open files (up to
 * the hard one) when max_connections needs more: two a connection. */
kvf_status_t kvf_http_create(kvf_router_t *router, const kvf_http_config_t *cfg,
                             kvf_http_t **http_p);

/* The port the server listens on. */
uint16_t kvf_http_port(const kvf_http_t *http);

/* Stops the server: wakes and joins every connection thread and frees
 * every exchange. Call it after kvf_router_run() has returned (the loop no
 * longer runs the tasks and sinks that hold exchanges) and before
 * kvf_router_destroy(). NULL is a no-op. */
void kvf_http_destroy(kvf_http_t *http);

#endif
