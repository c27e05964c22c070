/* Private to router/: the router's state and what its files share.
 *
 * One concept per file:
 *   registry.c  the node table: registration, heartbeats, liveness, health
 *   requests.c  the request table: submit, cancel, finish, output to sinks,
 *               the nodes' progress messages (PrefillDone, TokenChunk)
 *   sched.c     picking nodes, dispatch, re-dispatch, the wait queue, a
 *               request's deadlines (timers)
 *   stream.c    a request's output: tokens placed by position (stream.h)
 *   native.c    the native client front end (kvf/clientsock.h)
 *   loop.c      the event loop, work posted by other threads, lifecycle
 * Everything here runs on the loop thread (kvf_router_post aside). */
#ifndef KVF_ROUTER_INTERNAL_H
#define KVF_ROUTER_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvf/clientsock.h"
#include "kvf/evloop.h"
#include "kvf/hashmap.h"
#include "kvf/identity.h"
#include "kvf/model.h"
#include "kvf/prefix_cache.h"
#include "kvf/msg.h"
#include "kvf/timer.h"
#include "kvf/tokenizer.h"
#include "router.h"
#include "stream.h"

#define ROUTER_MAX_NODES    256
#define ROUTER_MAX_EXCLUDED 8
#define ROUTER_ID_LEN       64
#define ROUTER_URL_LEN      256
/* Sends to nodes must not stall the loop: a node's outbox is connected when
 * it registers (the reply may wait for that), later sends wait briefly. */
#define ROUTER_SEND_TIMEOUT_MS    20
#define ROUTER_CONNECT_TIMEOUT_MS 500

/* ---- nodes (registry.c) ---------------------------------------------------- */

typedef enum {
    NODE_LIVE = 0,
    NODE_DRAINING = 1,
    NODE_DEAD = 2,
    /* Failed QUARANTINE_FAILURES attempts in a row within
     * QUARANTINE_WINDOW_MS: no new work until a heartbeat a quarantine
     * period later lets one probe attempt through (sched.c). */
    NODE_QUARANTINED = 3,
} kvf_node_state_t;

/* A node as requests refer to it: its slot in the table and the slot's
 * generation when it was taken. It resolves (kvf_router__node_get) to NULL
 * once the slot was freed or taken by another registration, so a request
 * never reaches a node that replaced the one it was sent to. */
typedef uint64_t kvf_node_ref_t;
#define KVF_NODE_NONE ((kvf_node_ref_t)0)

/* Where a node holds a block (kvf_prefix_entry_t.where): its pool's prefix
 * cache, its RAM or disk KV tier (one of the two at most). */
#define KVF_PREFIX_IN_POOL  1u
#define KVF_PREFIX_IN_RAM   2u
#define KVF_PREFIX_IN_DISK  4u
#define KVF_PREFIX_IN_TIERS (KVF_PREFIX_IN_RAM | KVF_PREFIX_IN_DISK)

/* One hash of the router's prefix index: a block a node reported cached
 * (prefix_index.c), and where. */
typedef struct kvf_prefix_entry {
    uint64_t hash;
    uint8_t where; /* KVF_PREFIX_IN_*; never 0 while indexed */
    UT_hash_handle hh;
} kvf_prefix_entry_t;

/* A prompt's leading blocks a node holds, the way it takes them: those in
 * its pool, then those after them in its tiers, up to the first it lacks. */
typedef struct {
    uint32_t pool, ram, disk;
} kvf_prefix_hits_t;

/* What the router knows of a node's prefix cache (prefix_index.c). */
typedef struct {
    kvf_prefix_entry_t *set; /* uthash by hash */
    uint32_t n;
    uint64_t seq;            /* the last PrefixUpdate applied; 0: none */
    bool synced;             /* a full listing was applied (deltas apply on top) */
    bool truncated;          /* that listing was cut: the node holds more */
    uint64_t resync_asked_ns; /* PrefixResync sent then (0: not asked) */
} kvf_node_prefix_index_t;

/* One registered node. */
typedef struct {
    bool used;
    uint32_t gen; /* the slot's generation (see kvf_node_ref_t); never 0 while used */
    char id[ROUTER_ID_LEN];
    Kvf__Role role;
    char inbox[ROUTER_URL_LEN];
    uint32_t block_size;
    uint32_t capacity_blocks;
    uint8_t *xfer_desc; /* (xfer_desc_len) owned */
    size_t xfer_desc_len;
    uint32_t max_running;
    uint32_t max_context;
    bool prefill_local;
    bool prefix_pull; /* a prefill node: reads D's cached prefix blocks */
    kvf_node_state_t state;
    /* From the last heartbeat. */
    uint32_t blocks_free, blocks_used, blocks_total, blocks_cached, running, queued_requests;
    uint32_t tier_ram_blocks, tier_disk_blocks;
    /* its disk tier's reads (Load.tier_disk_*): mean ns queued to checked,
     * in pread alone, bytes each, at once; 0: none measured */
    uint64_t disk_read_ns, disk_read_busy_ns, disk_read_bytes;
    uint32_t disk_io_threads;
    uint32_t disk_break_even_logged; /* the disk break-even last logged (tokens) */
    uint64_t queued_tokens;
    /* Work handed out since that heartbeat (not in its numbers yet). */
    uint32_t pending_blocks, pending_running;
    uint64_t pending_tokens;
    /* Requests that ended on it since that heartbeat, and the blocks they
     * were given (still in its numbers, free on the node by now). */
    uint32_t finished_blocks, finished_running;
    uint64_t load_gen; /* the load reports (heartbeats) taken from it */
    uint64_t registered_ns;
    kvf_timer_t liveness; /* dead when it fires: heartbeats missed (armed while live) */
    uint64_t dispatched;  /* request attempts sent to it */
    /* Prefill compute per token it reported (PrefillDone), a running
     * average in nanoseconds; 0 until its first. */
    uint64_t prefill_ns_per_token;
    /* A transfer to this decode node failed at this time (it may have
     * died, unseen yet): it gets no new work until a heartbeat taken a
     * period after that shows it alive (sched.c); 0: not suspect. */
    uint64_t suspect_since_ns;
    kvf_node_prefix_index_t prefix; /* the blocks it caches, as it reported them */
    /* A decode node's local prefill compute per token computed (its own
     * PrefillDone), a running average in ns; 0 until its first. */
    uint64_t local_ns_per_token;
    /* This registration's secret (RegisterReply.reg_token): every message
     * between the router and the node carries it (docs/PROTOCOL.md,
     * "Identity"). */
    uint8_t token[KVF_REG_TOKEN_LEN];
    /* Attempts it failed in a row (a node-side reason), the first of them
     * at fail_first_ns; quarantined at quarantined_ns; probing: let out of
     * quarantine for one attempt, which decides (sched.c). */
    unsigned fail_streak;
    uint64_t fail_first_ns, quarantined_ns;
    bool probing;
} kvf_router_node_t;

/* The node table and what the cluster agreed on. */
typedef struct {
    kvf_router_node_t slots[ROUTER_MAX_NODES];
    uint32_t last_gen; /* generations handed out so far */
    /* Cluster-wide KV agreement, set by the first node to register. */
    char fingerprint[64];
    Kvf__KvGeometry geometry;
    bool have_geometry;
} kvf_router_registry_t;

/* ---- requests (requests.c) ------------------------------------------------- */

typedef enum {
    REQ_QUEUED = 0,
    REQ_PREFILL = 1,
    REQ_DECODE = 2,
} kvf_req_state_t;

/* What the client asked for; fixed at submit. */
typedef struct {
    uint32_t *prompt; /* (n_prompt) */
    uint32_t n_prompt;
    /* Checked and completed once (max_tokens in total, a seed always),
     * then sent unchanged with every epoch. Owned (kvf_sampling_msg_free). */
    Kvf__Sampling *sampling;
    uint8_t *cache_salt; /* (cache_salt_len) owned, or NULL */
    size_t cache_salt_len;
    /* The prompt's full blocks' hashes under the cluster's key (route.c),
     * computed at the first placement; NULL until then or without memory. */
    uint64_t *hashes;
    uint32_t n_hashes;
} kvf_req_asked_t;

/* Where the current attempt (epoch) runs. */
typedef struct {
    kvf_req_state_t state;
    uint64_t epoch;
    unsigned attempts;
    kvf_node_ref_t prefill, decode;
    kvf_node_ref_t excluded[ROUTER_MAX_EXCLUDED]; /* decode nodes that refused this attempt */
    int n_excluded;
    /* The attempt's expected prefill time (the work queued before it and
     * its own, at its prefill node's measured rate), added to the prefill
     * timeout. */
    uint64_t expected_prefill_ms;
    uint64_t rng_state; /* sampler state after the last streamed token */
    bool local;            /* the decode node prefills this attempt itself */
    uint32_t n_tokens;     /* tokens this attempt prefills (prompt and tokens streamed before) */
    uint32_t blocks;       /* decode-node blocks this attempt was given (its whole length) */
    uint64_t dispatched_ns; /* when this attempt was sent */
    uint64_t load_gen;      /* its decode node's load_gen when it was sent */
    /* its PrefillDone was counted: the prefill node's, or the copy its
     * decode node relays on the first chunk, whichever came first */
    bool prefill_seen;
} kvf_req_placement_t;

/* Timing, and what the nodes reported. */
typedef struct {
    uint64_t arrival_ns;
    uint64_t first_ns;      /* the first token chunk (time to first token) */
    uint64_t last_token_ns; /* when the client got its latest token (metrics) */
    uint64_t prefill_compute_us, handoff_us, kv_bytes;
    uint32_t cached_tokens; /* prompt tokens its prefills reused (PrefillDone) */
    /* Armed from submit until the request is freed (sched.c). */
    kvf_timer_t deadline; /* the request timeout */
    kvf_timer_t phase;    /* the current state's: queue, prefill or stall timeout */
} kvf_req_timing_t;

typedef struct kvf_router_req kvf_router_req_t;
struct kvf_router_req {
    uint64_t id;
    kvf_router_sink_t sink; /* where the output goes */
    kvf_req_asked_t ask;
    kvf_req_placement_t place;
    kvf_stream_t out; /* what the client has been sent */
    kvf_req_timing_t t;
    UT_hash_handle hh;                         /* the request table, by id */
    kvf_router_req_t *queue_prev, *queue_next; /* the wait queue; prev NULL: not in it */
};

/* ---- the router ------------------------------------------------------------ */

typedef struct kvf_native_sink kvf_native_sink_t;
typedef struct kvf_posted kvf_posted_t;

struct kvf_router {
    kvf_router_config_t cfg;
    uint8_t prefix_key[16]; /* the cluster's block-hash key, random per router run */
    kvf_block_hash_key_t hash_key; /* the same key as hashes take it */
    uint64_t hash_key_id;          /* its public name (PrefixUpdate.key_id) */
    kvf_evloop_t *loop; /* the one wait: sockets, posted work, every deadline */
    kvf_model_config_t model;
    kvf_tokenizer_t *tok;
    kvf_inbox_t *inbox;
    kvf_client_server_t *clients;
    kvf_outboxes_t *outboxes;
    kvf_router_registry_t nodes;
    kvf_router_req_t *requests; /* uthash by id: every live request */
    kvf_router_req_t *queue;    /* utlist, oldest first: waiting for a decode node */
    unsigned queue_len;
    kvf_native_sink_t *natives; /* live requests of native clients */
    /* Work handed over by other threads (kvf_router_post). */
    pthread_mutex_t post_lock;
    kvf_posted_t *posted, *posted_tail;
    uint64_t next_req_id;
    uint64_t seed_state; /* draws the seeds of requests that bring none */
    uint64_t route_rng;  /* the random policy's draws */
    struct {
        uint64_t requests, running, failed, cancelled, completed, stale, malformed, redispatched;
        uint64_t register_refused[KVF_ROUTER_N_REFUSALS]; /* by kvf_router_refusal_t */
        kvf_refusals_t messages_refused; /* by kvf_router_msg_refusal_t, bounded log */
        /* prefill passes: prompt tokens computed and reused; K/V bytes
         * shipped; prefills decode nodes ran themselves */
        uint64_t prefill_computed, prefill_cached, kv_bytes, local_prefills, kv_bytes_pulled;
        uint64_t prefix_updates, prefix_stale, prefix_resyncs;
    } count;
    /* Measured for conditional disaggregation (route.c): what the split
     * path costs a request beyond its prefill compute (dispatch to first
     * token, less the prefill node's compute), a running average in ns;
     * 0 until measured. */
    uint64_t remote_overhead_ns;
    uint64_t break_even_logged; /* the break-even last logged (tokens) */
    kvf_metrics_t *metrics; /* owned */
};

/* ---- registry.c ------------------------------------------------------------ */

kvf_router_node_t *kvf_router__node_get(kvf_router_t *r, kvf_node_ref_t ref);
kvf_node_ref_t kvf_router__node_ref(const kvf_router_t *r, const kvf_router_node_t *n);
const char *kvf_router__role_name(Kvf__Role role);
const char *kvf_router__node_state_name(kvf_node_state_t state);
/* Sends env to url without stalling the loop (a failure is logged); env
 * carries the registration token of the node registered at url. */
void kvf_router__send(kvf_router_t *r, const char *url, kvf_envelope_t *env);
/* The node registered under id (any state), or NULL. */
kvf_router_node_t *kvf_router__node_by_id(kvf_router_t *r, const char *id);
/* Counts and (bounded) logs a dropped node message. */
void kvf_router__refuse(kvf_router_t *r, kvf_router_msg_refusal_t why, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* token: the envelope's reg_token (a registration may present the one it
 * holds: a node the router asked to register again, or one restarting). */
void kvf_router__on_register(kvf_router_t *r, const Kvf__Register *reg,
                             ProtobufCBinaryData token);
void kvf_router__on_heartbeat(kvf_router_t *r, const Kvf__Heartbeat *hb);
/* Fills free slot n from reg (checked already): identity, role, pool,
 * a new generation; the first node's geometry and fingerprint become the
 * cluster's. No message, no timer: on_register's bookkeeping, shared with
 * the socketless router (detached.c). */
void kvf_router__node_take(kvf_router_t *r, kvf_router_node_t *n, const Kvf__Register *reg);
/* What a heartbeat tells of n's load (load NULL: nothing but the reset):
 * its numbers replace the last ones, and the work handed out since that
 * beat (pending_*) is counted in them from now on. */
void kvf_router__node_load(kvf_router_node_t *n, const Kvf__Load *load);
/* q ended on its decode node: until the node's next heartbeat its load no
 * longer counts q (taken from what was handed out since that heartbeat
 * when q was sent after it, else from the heartbeat's numbers). */
void kvf_router__node_unload(kvf_router_t *r, const kvf_router_req_t *q);
/* loop.c: takes what waits in the node inbox (a bounded burst). */
void kvf_router__recv_nodes(kvf_router_t *r);
void kvf_router__on_deregister(kvf_router_t *r, const Kvf__Deregister *d);
void kvf_router__registry_fini(kvf_router_t *r);

/* ---- requests.c ------------------------------------------------------------ */

kvf_router_req_t *kvf_router__req_find(kvf_router_t *r, uint64_t id);
/* The request a node's message names, if (id, epoch) is its current
 * attempt; NULL (counted as stale) otherwise. what names the message. */
kvf_router_req_t *kvf_router__req_current(kvf_router_t *r, uint64_t id, uint64_t epoch,
                                          const char *what);
/* Ends q towards the client (one final chunk) and frees it. */
void kvf_router__req_finish(kvf_router_t *r, kvf_router_req_t *q, Kvf__FinishReason reason,
                            kvf_status_t status, const char *error);
void kvf_router__on_prefill_done(kvf_router_t *r, const Kvf__PrefillDone *pd);
void kvf_router__on_token_chunk(kvf_router_t *r, const Kvf__TokenChunk *c);
void kvf_router__on_error(kvf_router_t *r, const Kvf__Error *e, const char *sender);
/* Whether node n may speak about request (id, epoch): it is that attempt's
 * prefill node (as_prefill) or decode node (as_decode). A message about
 * an attempt that is not current passes (it is dropped as stale). */
bool kvf_router__sender_assigned(kvf_router_t *r, const kvf_router_node_t *n, uint64_t id,
                                 uint64_t epoch, bool as_prefill, bool as_decode);
/* Frees every request without a word to its sink (shutdown). */
void kvf_router__requests_fini(kvf_router_t *r);

/* ---- sched.c --------------------------------------------------------------- */

/* Places q: dispatches it when a decode and a prefill node can take it,
 * queues it otherwise, or finishes it with an error. */
void kvf_router__schedule(kvf_router_t *r, kvf_router_req_t *q);
/* Takes p and d (kvf_router__pick's) for q's next attempt: a new epoch,
 * and the blocks, sequence and tokens it adds to their load until their
 * next heartbeat. Sends nothing, arms nothing: dispatch's bookkeeping,
 * shared with the socketless router (detached.c). */
void kvf_router__claim(kvf_router_t *r, kvf_router_req_t *q, kvf_router_node_t *p,
                       kvf_router_node_t *d);
/* Dispatches queued requests, oldest first, while nodes have room. */
void kvf_router__drain_queue(kvf_router_t *r);
/* Sends q again (new epoch) after its nodes failed it. */
void kvf_router__redispatch(kvf_router_t *r, kvf_router_req_t *q, const char *why);
/* Tells the nodes working on q's current epoch to drop it. */
void kvf_router__cancel_nodes(kvf_router_t *r, kvf_router_req_t *q, const char *reason);
void kvf_router__queue_remove(kvf_router_t *r, kvf_router_req_t *q);
/* Node n failed an attempt for a reason of its own (transport, refused
 * descriptor, timeout): counts towards its quarantine. */
void kvf_router__node_failed(kvf_router_t *r, kvf_router_node_t *n, const char *why);
/* n served an attempt (tokens, a finished prefill): its failure streak
 * ends, and a probe out of quarantine succeeded. */
void kvf_router__node_succeeded(kvf_router_t *r, kvf_router_node_t *n);
/* A heartbeat of quarantined node n: one probe goes through once the
 * quarantine period passed. */
void kvf_router__quarantine_beat(kvf_router_t *r, kvf_router_node_t *n);
/* Re-dispatches every request that used node n (it died or left). */
void kvf_router__node_lost(kvf_router_t *r, kvf_router_node_t *n, const char *why);
/* Arms q's timers (request timeout, and its state's) at submit; NOMEM. */
kvf_status_t kvf_router__timers_start(kvf_router_t *r, kvf_router_req_t *q);
/* Disarms them (q is being freed). */
void kvf_router__timers_stop(kvf_router_t *r, kvf_router_req_t *q);
/* q showed progress (prefill done, tokens): its stall timeout starts
 * again. */
void kvf_router__progress(kvf_router_t *r, kvf_router_req_t *q);
/* Node n's heartbeat names the attempts it works on: each one of its
 * current attempts that n serves starts its phase timeout again (it is not
 * re-dispatched while its nodes show it moving). */
void kvf_router__on_work(kvf_router_t *r, kvf_router_node_t *n, Kvf__WorkRef *const *work,
                         size_t n_work);

/* ---- route.c: picking nodes ------------------------------------------------ */

/* Blocks of block_size holding tokens. */
uint32_t kvf_router__blocks_for(uint32_t tokens, uint32_t block_size);
/* Tokens q may occupy on its decode node: prompt and every token it may
 * generate. */
uint32_t kvf_router__tokens_needed(const kvf_router_req_t *q);

/* Full blocks of an n-token prompt a node reuses at most (a hit leaves
 * the last tokens to compute, the prefill nodes' rule). */
uint32_t kvf_router__reuse_cap(uint32_t n_tokens, uint32_t block_size);
/* q's prompt block hashes, as every node computes them, into
 * q->ask.hashes (computed once; none before a node registered the
 * cluster's geometry, or without memory). */
void kvf_router__req_hashes(kvf_router_t *r, kvf_router_req_t *q);
/* The nodes for q's next attempt under the configured policy: *d_p the
 * decode node, *p_p the prefill node (the decode node itself for a local
 * prefill: q->place.local then says why). False when no decode node has
 * room or no node can prefill. */
bool kvf_router__pick(kvf_router_t *r, kvf_router_req_t *q, kvf_router_node_t **p_p,
                      kvf_router_node_t **d_p);
/* A prefill of q finished: pd's measurements feed the rates route.c
 * weighs (prefill and local prefill per token, the split path's
 * overhead). */
void kvf_router__observe_prefill_done(kvf_router_t *r, kvf_router_req_t *q,
                                      const Kvf__PrefillDone *pd);
/* Logs the routing set-up (policy, weights, conditional disaggregation). */
void kvf_router__route_describe(const kvf_router_t *r);
/* The shortest hit in n's disk tier that is cheaper than recomputing it,
 * in tokens, from n's measured disk reads and prefill rate: 0 while either
 * is unmeasured, UINT32_MAX when no length is (docs/kv-tiers.md,
 * "Routing"). */
uint32_t kvf_router__disk_break_even(const kvf_router_t *r, const kvf_router_node_t *n);
/* A heartbeat brought n's disk read measurements: logs n's disk
 * break-even when it is new or moved. */
void kvf_router__observe_disk_reads(kvf_router_t *r, kvf_router_node_t *n);

/* ---- prefix_index.c: which node caches which block ---------------------------- */

void kvf_router__on_prefix_update(kvf_router_t *r, const Kvf__PrefixUpdate *u,
                                  const char *sender);
/* n's listing is lost or n is new (it registered): empties it and asks n
 * for a full one (PrefixResync; at most one a second). */
void kvf_router__prefix_resync(kvf_router_t *r, kvf_router_node_t *n);
/* Forgets every hash n reported (it died, left or restarted). */
void kvf_router__prefix_drop(kvf_router_node_t *n);
/* How many of hashes[0..n) n holds in its pool, counting from the first
 * (a prefix is reusable only up to its first missing block). */
uint32_t kvf_router__prefix_hits(const kvf_router_node_t *n, const uint64_t *hashes, uint32_t count);
/* hashes[0..count)'s leading blocks n holds in its pool, then in its KV
 * tiers, per tier. */
void kvf_router__prefix_hits_tiers(const kvf_router_node_t *n, const uint64_t *hashes,
                                   uint32_t count, kvf_prefix_hits_t *hits_p);

/* ---- loop.c, detached.c: lifecycle ------------------------------------------- */

/* The defaults of the fields cfg leaves 0 (heartbeat, attempts, weights...). */
void kvf_router__config_defaults(kvf_router_config_t *cfg);
/* Derives hash_key and hash_key_id from prefix_key. */
void kvf_router__keys_set(kvf_router_t *r);

/* A router with no socket, no loop and no tokenizer, for the cluster
 * simulator (sim/): its state (registry, prefix index, routing
 * counters) is built and driven by the caller on its own thread through
 * the functions above (kvf_router__node_take, kvf_router__node_load,
 * kvf_router__on_prefix_update, kvf_router__pick, kvf_router__claim);
 * nothing that sends a message or arms a timer may be called on it.
 * model is copied; seed fixes the prefix-hash key and every draw, so the
 * same seed routes the same way. *router_p is owned by the caller:
 * kvf_router__detached_destroy(). */
kvf_status_t kvf_router__detached_create(const kvf_router_config_t *cfg,
                                         const kvf_model_config_t *model, uint64_t seed,
                                         kvf_router_t **router_p);
/* Frees its nodes' prefix listings and the router; NULL is a no-op. */
void kvf_router__detached_destroy(kvf_router_t *r);

/* ---- native.c -------------------------------------------------------------- */

void kvf_router__handle_client_message(kvf_router_t *r, kvf_envelope_t *env,
                                       const kvf_client_hdr_t *hdr);
void kvf_router__natives_fini(kvf_router_t *r);

#endif
