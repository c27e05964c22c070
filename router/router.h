/* kvf-router: the client-facing process of a kvferry cluster.
 *
 * One event loop (kvf_router_run) owns every piece of state: the node
 * registry, the table of live requests and the wait queue. Nodes reach it
 * at its inbox; native clients at its client socket (kvf/clientsock.h).
 * The router reads the model's tokenizer and configs, never its weights.
 *
 * A request's life in the router (see docs/PROTOCOL.md):
 *   QUEUED   waiting for a decode node with room (bounded queue)
 *   PREFILL  PrefillRequest sent to a prefill node (epoch e)
 *   DECODE   the prefill node is done; the decode node streams
 * then it is finished (the decode node's stop or length; cancel, error)
 * and removed. The router forwards what the decode node produced: tokens,
 * their text and its finish; it never decides when a request ends. A node
 * that dies or leaves takes no request with it: its requests are sent
 * again, as prompt + tokens already streamed, with a new epoch. */
#ifndef KVF_ROUTER_H
#define KVF_ROUTER_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvf/model.h"
#include "kvf/msg.h"
#include "kvf/status.h"
#include "kvf/tokenizer.h"

typedef struct kvf_router kvf_router_t;

/* How the router picks a request's nodes (docs/prefix-cache.md,
 * "Routing"). */
typedef enum {
    KVF_ROUTE_KV = 0,     /* the cost model over the nodes' cached prefixes and load */
    KVF_ROUTE_LOAD = 1,   /* decode node with the most room, prefill node least queued */
    KVF_ROUTE_RANDOM = 2, /* any node that can take it (for comparison) */
} kvf_route_policy_t;

/* "kv", "load", "random"; false for another name. */
bool kvf_route_policy_parse(const char *name, kvf_route_policy_t *policy_p);
const char *kvf_route_policy_name(kvf_route_policy_t policy);

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
    unsigned prefill_timeout_ms; /* dispatch to first token, then re-dispatch (60000) */
    unsigned stall_timeout_ms;   /* longest gap between tokens, then re-dispatch (30000) */
    kvf_route_policy_t route;    /* KVF_ROUTE_KV (0) by default */
    /* The kv policy's cost weights; all three 0: 1, 1, 1. */
    double prefill_weight, decode_weight, transfer_weight;
    /* The credit of a prompt block a prefill node holds in its RAM or disk
     * KV tier, as a fraction of a pool hit's (docs/kv-tiers.md, "Routing");
     * with all three weights above 0: 0.9 and 0.5. */
    double tier_ram_weight, tier_disk_weight;
    /* The credit of a prompt block a prefill node would pull from the
     * chosen decode node (docs/prefix-cache.md, "Pulls"), as a fraction of
     * a pool hit's; with all three weights above 0: KVF_ROUTER_PULL_WEIGHT. */
    double pull_weight;
    /* Conditional disaggregation: a decode node with --prefill-local that
     * holds a request's prefix prefills it itself when at most this many
     * tokens are left to compute (0: never), or (local_prefill_auto) when
     * the measured break-even says so. */
    unsigned local_prefill_max_tokens;
    bool local_prefill_auto;
} kvf_router_config_t;

/* The tier weights' defaults (docs/kv-tiers.md, "Routing"): a RAM hit
 * costs a memory copy, a little less than a pool hit; a disk hit a read,
 * worth a pool hit's half once past the break-even. */
#define KVF_ROUTER_TIER_RAM_WEIGHT  0.9
#define KVF_ROUTER_TIER_DISK_WEIGHT 0.5
/* A pull's default: a block read from another node's pool saves its
 * compute but moves its bytes, so a prefill node that holds the prefix
 * itself wins over one that would pull it. */
#define KVF_ROUTER_PULL_WEIGHT 0.75

/* Builds the router: loads tokenizer and configs, binds both sockets.
 * *router_p is owned by the caller: kvf_router_destroy(). */
kvf_status_t kvf_router_create(const kvf_router_config_t *cfg, kvf_router_t **router_p);

/* Runs the event loop until *stop becomes non-zero (a signal handler sets
 * it). Returns KVF_OK after a clean stop. */
kvf_status_t kvf_router_run(kvf_router_t *router, volatile sig_atomic_t *stop);

/* Wakes the loop so it looks at *stop now: for a thread that sets the flag
 * itself (a signal handler installed by kvf_signals_install wakes it
 * already). Thread-safe. */
void kvf_router_wake(kvf_router_t *router);

/* Frees everything; NULL is a no-op. */
void kvf_router_destroy(kvf_router_t *router);

/* ---- front ends (native socket, HTTP) --------------------------------------
 *
 * A front end submits generation requests and receives their output
 * through a sink. Everything below runs on the router's loop thread; a
 * front end living on other threads (HTTP) hands work over with
 * kvf_router_post(). */

/* One piece of a request's output. */
typedef struct {
    uint64_t req_id;
    const uint32_t *tokens; /* (n_tokens) new tokens, in order */
    size_t n_tokens;
    const char *text;       /* (text_len) new text, whole UTF-8 characters; it may */
    size_t text_len;        /* hold U+0000, so it is not read up to a NUL ("" if none) */
    int finish;             /* Kvf__FinishReason: NONE (0) while more follows */
    kvf_status_t status;    /* with FINISH_ERROR: why */
    const char *error;      /* with FINISH_ERROR: a message for people */
    uint32_t prompt_tokens;
    uint32_t completion_tokens; /* so far */
    uint64_t ttft_us, prefill_compute_us, handoff_us, kv_bytes; /* on the last chunk */
    uint32_t cached_tokens; /* on the last chunk: prompt tokens reused from a prefix cache */
    bool local_prefill;     /* on the last chunk: prefilled on its decode node */
} kvf_router_chunk_t;

/* Where a request's output goes. on_chunk runs on the loop thread; the
 * chunk's memory is valid for the call only. After the chunk with
 * finish != 0 the sink is never called again (its owner may free it). */
typedef struct {
    void (*on_chunk)(void *arg, const kvf_router_chunk_t *chunk);
    void *arg;
} kvf_router_sink_t;

/* The longest cache_salt a request may carry. */
#define KVF_CACHE_SALT_MAX 256

/* A generation request. Strings, arrays and the message are borrowed for
 * the call. */
typedef struct {
    const char *prompt;  /* text: tokenized with BOS as the model's config says */
    size_t prompt_len;   /* its bytes (it may hold U+0000); 0: strlen(prompt) */
    const uint32_t *ids; /* or prompt ids, used exactly (wins when n_ids > 0) */
    size_t n_ids;
    /* The sampling parameters (proto/kvferry.proto), NULL: all defaults
     * (greedy). max_tokens 0: the router's default; it is clamped to the
     * context; without a seed the router draws one. */
    const Kvf__Sampling *sampling;
    /* Prefix-cache salt (a tenant): cached blocks are shared only between
     * requests with equal salts (docs/prefix-cache.md). NULL/0: none. */
    const uint8_t *cache_salt;
    size_t cache_salt_len;
} kvf_router_gen_t;

/* Validates (kvf_sampling_msg_check), tokenizes and schedules g; its
 * output goes to sink (copied). Returns the request id, or 0 when g was
 * refused: then the sink has already received one final chunk with the
 * error (status INVAL or TOO_BIG for bad input, NO_SPACE when
 * overloaded). */
uint64_t kvf_router_submit(kvf_router_t *router, const kvf_router_gen_t *g,
                           const kvf_router_sink_t *sink);

/* Cancels a live request (its nodes free its blocks); the sink receives a
 * final FINISH_CANCELLED chunk. Unknown ids are ignored. */
void kvf_router_cancel(kvf_router_t *router, uint64_t req_id);

/* Runs fn(router, arg) on the loop thread, soon. Thread-safe; never blocks
 * on the loop. KVF_ERR_NOMEM if the work cannot be queued. */
kvf_status_t kvf_router_post(kvf_router_t *router, void (*fn)(kvf_router_t *, void *),
                             void *arg);

/* The model's configuration and tokenizer (read-only, any thread). */
const kvf_model_config_t *kvf_router_model(const kvf_router_t *router);
const kvf_tokenizer_t *kvf_router_tokenizer(const kvf_router_t *router);
const char *kvf_router_model_dir(const kvf_router_t *router);

/* ---- state for health checks and metrics (loop thread) ---------------------- */

typedef struct kvf_metrics kvf_metrics_t;

/* One node as the router sees it. */
typedef struct {
    char id[64];
    const char *role;  /* "prefill" or "decode" (static) */
    const char *state; /* "live", "draining", "dead" or "quarantined" (static) */
    bool prefill_local;
    uint32_t blocks_used, blocks_total, blocks_cached, running, queued_requests;
    uint32_t tier_ram_blocks, tier_disk_blocks; /* blocks its KV tiers hold */
    uint32_t prefix_indexed; /* cached block hashes the router's index lists for it */
    uint64_t queued_tokens, dispatched;
} kvf_router_node_info_t;

/* Why the router refused a node's Register. */
typedef enum {
    KVF_ROUTER_REFUSED_INVALID,     /* no id, no role, no geometry, no transfer descriptor */
    KVF_ROUTER_REFUSED_MODEL_SHAPE, /* layers / kv heads / head dim not the model's */
    KVF_ROUTER_REFUSED_BLOCK_SIZE,  /* differs from the cluster's nodes */
    KVF_ROUTER_REFUSED_KV_DTYPE,    /* differs from the cluster's nodes */
    KVF_ROUTER_REFUSED_LAYOUT,      /* differs from the cluster's nodes */
    KVF_ROUTER_REFUSED_FINGERPRINT, /* another model's weights */
    KVF_ROUTER_REFUSED_DESCRIPTOR,  /* a transfer descriptor prefill nodes would refuse */
    KVF_ROUTER_N_REFUSALS
} kvf_router_refusal_t;

/* "invalid", "model_shape", "block_size", "kv_dtype", "layout",
 * "fingerprint", "descriptor" (the reason label of
 * kvf_register_refused_total). */
const char *kvf_router_refusal_name(kvf_router_refusal_t why);

/* Why the router dropped a node's message (docs/PROTOCOL.md, "Identity"). */
typedef enum {
    KVF_ROUTER_MSG_TOKEN,        /* no registration, or not its token */
    KVF_ROUTER_MSG_SENDER,       /* the body names another node than the envelope */
    KVF_ROUTER_MSG_INBOX,        /* a heartbeat from another inbox than the registration's */
    KVF_ROUTER_MSG_ID_TAKEN,     /* a Register for an id live elsewhere */
    KVF_ROUTER_MSG_NOT_ASSIGNED, /* about a request the sender does not serve */
    KVF_ROUTER_MSG_DESCRIPTOR,   /* a heartbeat's new transfer descriptor, refused */
    KVF_ROUTER_N_MSG_REFUSALS
} kvf_router_msg_refusal_t;

/* "token", "sender", "inbox", "id_taken", "not_assigned" (the reason label
 * of kvf_messages_refused_total). */
const char *kvf_router_msg_refusal_name(kvf_router_msg_refusal_t why);

typedef struct {
    uint32_t requests_queued;  /* waiting for a decode node */
    uint32_t requests_running; /* dispatched, not finished */
    size_t n_nodes;
    kvf_router_node_info_t *nodes; /* (n_nodes) */
    uint64_t register_refused[KVF_ROUTER_N_REFUSALS]; /* Registers refused, by reason */
    uint64_t messages_refused[KVF_ROUTER_N_MSG_REFUSALS]; /* node messages dropped, by reason */
    uint64_t local_prefills; /* prefills decode nodes ran themselves */
} kvf_router_snapshot_t;

/* KVF_OK when the cluster can serve: at least one live prefill and one
 * live decode node, or a live decode node with --prefill-local. Otherwise
 * KVF_ERR_AGAIN with the reason in why. Loop thread. */
kvf_status_t kvf_router_health(kvf_router_t *router, char *why, size_t why_len);

/* Copies the queue and node state. On success snap->nodes is malloc'd and
 * owned by the caller: kvf_router_snapshot_fini(). Loop thread. */
kvf_status_t kvf_router_snapshot(kvf_router_t *router, kvf_router_snapshot_t *snap);
void kvf_router_snapshot_fini(kvf_router_snapshot_t *snap);

/* The router's metrics (metrics.h), owned by the router. Loop thread. */
kvf_metrics_t *kvf_router_metrics(kvf_router_t *router);

#endif
