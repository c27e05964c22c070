/* kvf-router: the client-facing process of a kvferry cluster.
 *
 * One event loop (kvf_router_run) owns every piece of state: the node
 * registry, the table of live requests and the wait queue. Nodes reach it
 * at its inbox; native clients at its client socket (kvf/clientsock.h).
 * The router reads the model's tokenizer and configs, never its weights.
 *
 * A request's life in the router (see proto/PROTOCOL.md):
 *   QUEUED   waiting for a decode node with room (bounded queue)
 *   PREFILL  PrefillRequest sent to a prefill node (epoch e)
 *   DECODE   first token known; decode node streaming
 * then it is finished (stop, length, cancel, error) and removed. A node
 * that dies or leaves takes no request with it: its requests are sent
 * again, as prompt + tokens already streamed, with a new epoch. */
#ifndef KVF_ROUTER_H
#define KVF_ROUTER_H

#include <signal.h>
#include <stdint.h>

#include "kvf/status.h"

typedef struct kvf_router kvf_router_t;

typedef struct {
    const char *listen_url;      /* inbox for nodes */
    const char *client_url;      /* native client socket */
    const char *model_dir;       /* tokenizer and configs */
    unsigned heartbeat_ms;       /* expected node heartbeat period (500) */
    unsigned dead_after_missed;  /* heartbeats missed before a node is dead (3) */
    unsigned max_queue;          /* requests waiting for a decode node (256) */
    unsigned queue_timeout_ms;   /* longest wait in the queue (30000) */
    unsigned request_timeout_ms; /* longest life of a request (600000) */
    unsigned max_attempts;       /* dispatches per request before failing it (5) */
    unsigned default_max_tokens; /* when a request names none (256) */
} kvf_router_config_t;

/* Builds the router: loads tokenizer and configs, binds both sockets.
 * *router_p is owned by the caller: kvf_router_destroy(). */
kvf_status_t kvf_router_create(const kvf_router_config_t *cfg, kvf_router_t **router_p);

/* Runs the event loop until *stop becomes non-zero (a signal handler sets
 * it). Returns KVF_OK after a clean stop. */
kvf_status_t kvf_router_run(kvf_router_t *router, volatile sig_atomic_t *stop);

/* Frees everything; NULL is a no-op. */
void kvf_router_destroy(kvf_router_t *router);

#endif
