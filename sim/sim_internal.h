/* Private to sim/: the simulated router (router_view.c) as the cluster
 * (cluster.c) drives it. */
#ifndef KVF_SIM_INTERNAL_H
#define KVF_SIM_INTERNAL_H

#include "router_internal.h"
#include "sim.h"

#define SIM_MAX_NODES 128

struct kvf_sim_router {
    kvf_router_t *r;             /* owned: kvf_router__detached_create */
    int n_nodes;                 /* node i is the router's slot i */
    uint64_t seq[SIM_MAX_NODES]; /* each node's last PrefixUpdate */
    char names[SIM_MAX_NODES][16];
};

/* Sets up q (the caller's, zeroed) as the router's request id asking for
 * n_prompt tokens of prompt (borrowed: read by the first pick only) and
 * max_tokens more; sampling is the caller's and outlives q. */
void kvf_sim__req_init(kvf_router_req_t *q, Kvf__Sampling *sampling, uint64_t id,
                       const uint32_t *prompt, uint32_t n_prompt, uint32_t max_tokens);
/* Frees what the router gave q (its block hashes). */
void kvf_sim__req_fini(kvf_router_req_t *q);

/* The router's pick for q and, when there is one, its claim (the load the
 * attempt adds until the next heartbeat): the node indices into *p_p and
 * *d_p (equal for a local prefill). False: q waits. */
bool kvf_sim__place(kvf_sim_router_t *sr, kvf_router_req_t *q, int *p_p, int *d_p);

/* Node `node` reports hashes added to and removed from its cache. */
void kvf_sim__report(kvf_sim_router_t *sr, int node, uint64_t *added, uint32_t n_added,
                     uint64_t *removed, uint32_t n_removed);

/* Of q's first `count` block hashes, how many node `node` lists, from
 * the first. */
uint32_t kvf_sim__hits(const kvf_sim_router_t *sr, int node, const kvf_router_req_t *q,
                       uint32_t count);

/* ---- the cluster's state (cluster.c, node.c) ------------------------------- */

typedef enum {
    REQ_WAITING,
    REQ_IN_QUEUE,
    REQ_PREFILLING,
    REQ_SHIPPING,
    REQ_DECODING,
    REQ_FINISHED,
    REQ_REFUSED
} sim_req_state_t;

/* Where a split request's KV allocation is (docs/PROTOCOL.md: P sends
 * KvAlloc to D as it queues the request, and computes the prompt only
 * once KvAllocReply is in). A local prefill needs none: granted. */
typedef enum { ALLOC_UNSENT, ALLOC_SENT, ALLOC_GRANTED } sim_alloc_t;

typedef struct sim_req sim_req_t;
struct sim_req {
    kvf_router_req_t q;     /* the router's view of it */
    Kvf__Sampling sampling; /* q's */
    const kvf_sim_req_t *w; /* what the workload asked */
    sim_req_state_t state;
    int p, d;                           /* its nodes (equal: a local prefill) */
    int32_t prefix;                     /* dense index of its prefix id, -1: none */
    uint32_t known;                     /* prompt tokens in KV (cached or computed) */
    uint32_t out;                       /* tokens produced */
    uint32_t blocks;                    /* reserved on d */
    uint64_t t_arrive, t_first, t_done; /* ns */
    sim_alloc_t alloc;
    sim_req_t *next; /* in the wait queue, a node's prefill FIFO or its landed list */
};

/* r appended to the list *head .. *tail (oldest first). */
static inline void sim_req_append(sim_req_t **head, sim_req_t **tail, sim_req_t *r)
{
    r->next = NULL;
    if (*tail)
        (*tail)->next = r;
    else
        *head = r;
    *tail = r;
}

/* A part of a step: n tokens of r's prompt. */
typedef struct {
    sim_req_t *r;
    uint32_t n;
} sim_piece_t;

typedef struct {
    bool prefills, decodes;      /* a prefill node, a decode node, or both */
    bool busy;                   /* a step in flight */
    sim_req_t *fifo, *fifo_tail; /* prompts to compute, oldest first */
    uint32_t fifo_n;
    uint64_t fifo_tokens; /* their tokens left to compute */
    sim_req_t *landed, *landed_tail; /* KV arrived during a step: they join after it */
    sim_req_t *unsent;               /* the first prompt that came during the step */
    uint64_t step_end_ns;            /* when the step in flight ends */
    uint64_t alloc_free_ns;          /* idle, it answers one KvAlloc after another */
    sim_req_t **batch;    /* (n_batch) decoding, in joining order */
    uint32_t n_batch, cap_batch;
    uint64_t batch_ctx; /* tokens they attend to, summed */
    uint32_t blocks_free, blocks_total, reserved;
    sim_piece_t *pieces;            /* (n_pieces) the step's prompt chunks; chunk_tokens max */
    uint32_t n_pieces, step_decode; /* the step's first step_decode batch members decode */
    uint64_t busy_ns, link_free_ns;
    int32_t *lru; /* (n_lru) dense prefix indices cached, newest first */
    uint32_t n_lru;
} sim_node_t;

/* A prefix id's block hashes, as the first request with it had them. */
typedef struct {
    int32_t id;
    uint64_t *hashes; /* (n) owned */
    uint32_t n;
} sim_prefix_t;

typedef struct {
    const kvf_sim_config_t *cfg;
    const kvf_sim_workload_t *w;
    kvf_sim_router_t *sr;
    sim_node_t nodes[SIM_MAX_NODES];
    int n_nodes;
    sim_req_t *reqs;        /* (w->n) */
    sim_prefix_t *prefixes; /* (n_prefixes) sorted by id */
    size_t n_prefixes;
    struct sim_event *heap; /* (n_heap) of cap_heap: a binary min-heap */
    size_t n_heap, cap_heap;
    uint64_t seq;                  /* events pushed: ties go in pushing order */
    uint64_t now;                  /* ns */
    sim_req_t *queue, *queue_tail; /* the router's wait queue */
    unsigned queue_len;
    size_t n_ended;   /* finished or refused */
    uint32_t *prompt; /* scratch for a prompt (longest of w) */
    double block_bytes;
    uint64_t steps, transfers, cached_tokens;
    double kv_bytes;
    bool failed; /* out of memory: the run is void */
} sim_t;

typedef enum {
    EV_ARRIVE,
    EV_STEP,
    EV_SHIPPED,
    EV_BEAT,
    EV_ALLOC, /* a KvAlloc reaches its decode node */
    EV_GRANT, /* its KvAllocReply reaches the prefill node */
    EV_KICK   /* a node looks for work (after the same instant's grants) */
} sim_event_kind_t;

/* cluster.c */
kvf_status_t sim_push(sim_t *s, uint64_t at_ns, sim_event_kind_t kind, uint32_t index);
/* What the messages add to a token's arrival at its client: the dispatch
 * (router to the node that prefills) and the token's way back (decode
 * node to router, router to client), 3 x msg_latency_s. The requests'
 * times shift by it; the nodes' work does not (the dispatch delays a
 * prompt's start by one message, which the simulation does not). */
uint64_t sim_msg_delay_ns(const sim_t *s);
/* r ended; refused: never served. */
void sim_end(sim_t *s, sim_req_t *r, bool refused);

/* node.c */
/* Starts node i's next step unless one is in flight or it has no work. */
void sim_node_kick(sim_t *s, int i);
/* Node i's step ended (EV_STEP). */
void sim_node_step_done(sim_t *s, int i);
/* r's KV reached its decode node (EV_SHIPPED). */
void sim_node_shipped(sim_t *s, sim_req_t *r);
/* r's KvAlloc reached its decode node (EV_ALLOC). */
void sim_node_alloc(sim_t *s, sim_req_t *r);
/* r's KvAllocReply reached its prefill node (EV_GRANT). */
void sim_node_grant(sim_t *s, sim_req_t *r);
/* r was placed on p and d: its blocks on d, its prompt in p's FIFO. */
void sim_node_start(sim_t *s, sim_req_t *r, int p, int d);
void sim_node_fini(sim_node_t *n);

#endif
