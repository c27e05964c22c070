/* The exchange between an HTTP connection thread and the router's loop:
 * one request (a generation, or a /health or /metrics query) shared by
 * both, reference-counted.
 *
 * The connection thread fills the request, then posts it to the loop
 * (kvf_router_post): a generation is submitted with a sink that appends
 * its output here; a query runs its answer function there. Whatever the
 * loop changes it changes under the exchange's lock and then signals the
 * exchange's eventfd; the connection thread sleeps in kvf_exch_wait on
 * that eventfd and its client's socket together, until the output it
 * waits for is there, the client hangs up, the server stops or the
 * deadline passes, whichever comes first: no polling interval.
 *
 * References: the creator holds one; each posted task and the loop's sink
 * take one; the last kvf_exch_unref frees the exchange. */
#ifndef KVF_EXCHANGE_H
#define KVF_EXCHANGE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "openai.h"
#include "router.h"
#include "strbuf.h"

typedef struct kvf_exch kvf_exch_t;

/* Every live exchange of a server, so that stopping can wake them all. */
typedef struct {
    kvf_router_t *router;
    pthread_mutex_t lock;
    kvf_exch_t *all; /* (lock) */
    atomic_bool stopping;
} kvf_exch_set_t;

/* Answers a query on the loop thread: *code_p and *body_p (malloc'd, NULL
 * when out of memory; owned by the exchange from then on). */
typedef void (*kvf_exch_answer_fn)(kvf_router_t *r, kvf_exch_t *e, unsigned *code_p, char **body_p,
                                   size_t *len_p);

/* Fields marked (lock) are guarded by lock and written by the loop;
 * (conn) belong to the connection thread: written before the exchange is
 * posted, or read by no other thread. */
struct kvf_exch {
    kvf_exch_set_t *set;
    pthread_mutex_t lock;
    int wake_fd;             /* eventfd, written after the loop changed something */
    unsigned refs;           /* (lock) */
    kvf_exch_t *prev, *next; /* (set->lock) */
    void *owner;             /* (conn) the connection's context, for answer functions */
    /* The request (conn). */
    kvf_openai_request_t req;
    kvf_exch_answer_fn answer; /* a query's; NULL for a generation */
    int fd;                    /* the client's socket, watched for a hang-up; -1: none */
    /* Output of a generation (lock). */
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
    char *body; /* (body_len) owned */
    size_t body_len;
    /* The response (conn). */
    kvf_openai_reply_t reply;
    char id[48];
    kvf_strbuf_t sse; /* formatted events not yet handed to the server */
    size_t sse_off;
    bool sse_done;
};

kvf_status_t kvf_exch_set_init(kvf_exch_set_t *set, kvf_router_t *router);
/* Marks the set stopping and wakes every exchange's waiter (they return
 * KVF_EXCH_STOPPING). Any thread. */
void kvf_exch_set_stop(kvf_exch_set_t *set);
/* Frees the exchanges left (held by tasks and sinks of a loop that no
 * longer runs) and the set. */
void kvf_exch_set_fini(kvf_exch_set_t *set);

/* A new exchange in set with one reference (the caller's); answer NULL for
 * a generation. NULL when out of memory or out of file descriptors. */
kvf_exch_t *kvf_exch_create(kvf_exch_set_t *set, kvf_exch_answer_fn answer);
void kvf_exch_ref(kvf_exch_t *e);
void kvf_exch_unref(kvf_exch_t *e);

/* Hands e to the loop: a generation is submitted (its sink takes a
 * reference until the final chunk), a query answered. KVF_ERR_NOMEM when
 * it cannot be posted. Connection thread. */
kvf_status_t kvf_exch_post(kvf_exch_t *e);

/* Tells the loop to cancel e's request: once, and not after it finished.
 * Connection thread. */
void kvf_exch_cancel(kvf_exch_t *e);

typedef enum {
    KVF_EXCH_READY,
    KVF_EXCH_GONE, /* the client hung up */
    KVF_EXCH_TIMEOUT,
    KVF_EXCH_STOPPING, /* the server is shutting down */
} kvf_exch_wait_t;

/* What a waiter waits for (called with e->lock held). */
bool kvf_exch_answered(const kvf_exch_t *e);
bool kvf_exch_finished(const kvf_exch_t *e);
bool kvf_exch_started(const kvf_exch_t *e); /* finished, or a token arrived */
bool kvf_exch_has_output(const kvf_exch_t *e);

/* With e->lock held: sleeps until ready(e), the client hangs up, the set
 * stops or deadline_ns (kvf_clock_ns time) passes, and returns with the
 * lock held. Connection thread. */
kvf_exch_wait_t kvf_exch_wait(kvf_exch_t *e, bool (*ready)(const kvf_exch_t *),
                              uint64_t deadline_ns);

/* True when the client's socket is closed (or failed). */
bool kvf_exch_peer_gone(const kvf_exch_t *e);

#endif
