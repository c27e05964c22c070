/* What the files of kvf-prefill share; prefill.h is the node's interface.
 *
 *   prefill.c   the event loop, create / destroy, the load report
 *   requests.c  the request table: lookup, lifecycle (abort, fail, cancel),
 *               the transfer batches a request posts
 *   messages.c  the router's messages (PrefillRequest, Cancel) and the
 *               node's (Error, PrefillDone, KvReady)
 *   peers.c     decode peers: connections to their pools, KvAlloc and
 *               KvAllocReply, leases
 *   forward.c   the batched forward: which chunks run, each layer's slices
 *               posted from the engine's hook, the first token sampled
 *   pull.c      prefix pulls: the decode node's cached prefix blocks read
 *               one-sided instead of computed
 *   tiers.c     the KV tiers
 *
 * Heartbeats and lease renewals leave from the node runtime's own thread
 * (kvf/node.h); the loop publishes what they say (fill_work).
 *
 * Everything runs on the loop's thread (the forward too), so nothing here
 * is locked. */
#ifndef KVF_PREFILL_INTERNAL_H
#define KVF_PREFILL_INTERNAL_H

#include "prefill.h"

#include "kvf/engine.h"
#include "kvf/evloop.h"
#include "kvf/kvcache.h"
#include "kvf/msg.h"
#include "kvf/node.h"
#include "kvf/node_tiers.h"
#include "kvf/node_prefix.h"
#include "kvf/prefix_cache.h"
#include "kvf/sampling.h"
#include "kvf/timer.h"
#include "kvf/xfer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Send timeouts from the loop (docs/PROTOCOL.md: short, a failed send is
 * a lost message). */
#define PF_SEND_MS 50
/* How long a post that the transport answers AGAIN is retried. */
#define PF_POST_AGAIN_MS 200
/* How often an unsent KvAlloc is retried. */
#define PF_ALLOC_RETRY_MS 10
/* Bounded wait for transfers to end when the node stops. */
#define PF_STOP_DRAIN_MS 2000
/* A graceful drain (SIGTERM) gives up what is left after this long. */
#define PF_DRAIN_TIMEOUT_MS 60000
/* A loop that could not arm a timer (out of memory) does not know its next
 * deadline: it looks again after this long instead of sleeping. */
#define PF_NOMEM_WAIT_MS 10
/* Longest transport progress between two layers of a forward, or before
 * the next forward starts (kvf_xfer_progress_for). */
#define PF_PROGRESS_BUDGET_MS 20
/* Lease margin: a request whose lease ends sooner than this is not started. */
#define PF_LEASE_MARGIN_NS (50ull * 1000000ull)

typedef enum {
    REQ_WAIT_ALLOC, /* KvAlloc sent (or to be sent); waiting for the reply */
    REQ_CANCELLED,  /* cancelled before the reply came: abort what D reserves */
    REQ_READY,      /* D reserved blocks; chunks being computed */
    REQ_SHIPPING,   /* computed and first token sampled; batches completing */
    REQ_ABORTING,   /* given up; local blocks freed once no batch runs */
} pf_req_state_t;

/* A connection to one decode node's pool, shared by its requests. A peer
 * that failed, or whose node came back with another descriptor, is stale:
 * no new request uses it, and it is disconnected once its last user ends
 * (kvf_xfer_disconnect invalidates the handle). */
typedef struct pf_peer {
    struct pf_peer *next;
    char *node_id; /* owned */
    uint8_t *desc; /* owned copy of the descriptor it was made from */
    size_t desc_len;
    kvf_xfer_peer_t *xp; /* belongs to the xfer handle */
    unsigned users;      /* requests holding it */
    bool stale;
} pf_peer_t;

typedef struct pf_req {
    struct pf_req *next, *prev; /* the request table, in arrival order */
    kvf_envelope_t *env;        /* the PrefillRequest (owned): tokens, sampling, D */
    const Kvf__PrefillRequest *pr;
    uint64_t req_id, epoch;
    uint32_t n_prompt;
    kvf_sampling_params_t sampling; /* pr->sampling, converted (kvf/sampling_msg.h) */
    pf_req_state_t state;
    pf_peer_t *peer; /* one reference held */
    bool alloc_sent;
    uint64_t alloc_first_try_ns, alloc_sent_ns, alloc_deadline_ns, next_alloc_try_ns;
    kvf_timer_t alloc_timer;    /* WAIT_ALLOC, CANCELLED: the KvAlloc retry or reply deadline */
    bool reserved;              /* D accepted: a reservation exists there */
    uint32_t *remote_blocks;    /* (n_prompt blocks) D's block ids, owned */
    uint64_t not_after_ns;      /* lease end on our clock; 0 = none */
    kvf_block_table_t local;    /* local blocks of the whole prompt (or empty) */
    uint32_t done;              /* prompt tokens computed */
    kvf_xfer_batch_t **batches; /* (n_batches) posted, not yet completed; owned */
    size_t n_batches, cap_batches;
    bool last_posted, abort_posted;
    kvf_status_t hook_status; /* a post failed during the forward */
    /* the chunk of the forward being run */
    uint32_t chunk_start, chunk_len, ship_first, ship_end;
    float *logits; /* (vocab) final chunk only, owned */
    uint32_t first_token;
    uint64_t rng_after;
    uint64_t kv_bytes;
    uint64_t compute_start_ns, compute_end_ns;
    /* the prefix cache: the prompt's full blocks' hashes (n_full), how
     * many leading blocks came from the cache, and the first block to
     * ship (the decode node has none yet: 0) */
    uint64_t *hashes;
    uint32_t n_full, cached_blocks, ship_from;
    uint32_t key_gen; /* the key generation the hashes are of */
    /* KV tiers: copies into its blocks in flight, and the blocks before
     * the first copy that failed (its prefix from the cache and tiers) */
    uint32_t tier_pending, tier_good;
    /* the most leading blocks a hit may cover (a tail is left to compute) */
    uint32_t hit_most;
    /* a prefix pull (pull.c): D's blocks [pull_from, pull_to) being read
     * into r's own; what pulls brought */
    kvf_xfer_batch_t *pull;
    uint32_t pull_from, pull_to, pulled_tokens;
    uint64_t pulled_bytes;
} pf_req_t;

typedef struct {
    uint64_t requests, completed, failed, cancelled, refused;
    uint64_t stale_dropped, malformed_dropped, unexpected_dropped;
    uint64_t prefix_hit_tokens, prompt_tokens;
    uint64_t pulled_tokens, pulled_bytes, pulls_failed; /* prefix pulls (pull.c) */
} pf_counters_t;

/* Scratch of one forward, kept between forwards (forward.c). */
typedef struct {
    pf_req_t **reqs;            /* (cap) requests of the running forward */
    kvf_engine_seq_t *seqs;     /* (cap) */
    uint32_t *remaining, *take; /* (cap) */
    size_t cap, n;              /* n: requests of the running forward, 0 between */
    kvf_xfer_slice_t *slices;   /* (cap_slices) one layer of one chunk */
    size_t cap_slices;
} pf_forward_t;

struct kvf_prefill {
    kvf_prefill_config_t cfg; /* strings: NULL, or the copies below */
    char *router_url, *listen_url;
    kvf_engine_stack_t rt; /* model, backend, pool, engine */
    kvf_node_prefix_t pc; /* the prefix cache (pc.cache NULL: --no-prefix-cache) */
    kvf_node_tiers_t nt; /* the KV tiers (tiers.c; nt.tiers NULL: none) */
    kvf_xfer_t *xfer;
    kvf_node_t *node;
    kvf_kv_geometry_t geo;
    pf_req_t *head, *tail; /* request table */
    bool draining;         /* SIGTERM: completing what it holds, taking nothing new */
    pf_peer_t *peers;
    pf_counters_t count;
    pf_counters_t logged;            /* count at the last stats line */
    kvf_auth_counters_t logged_auth; /* the control plane's refusals then */
    uint64_t logged_refused;         /* the runtime's message refusals then (kvf_node_refused) */
    pf_forward_t fwd;
    /* The loop: every deadline is a timer of loop's set. */
    kvf_evloop_t *loop;
    kvf_xfer_caps_t xfer_caps;
    kvf_timer_t node_timer;   /* the node runtime's next registration or heartbeat */
    kvf_timer_t xfer_timer;   /* the transport's next deadline (batch timeout, lease) */
    kvf_timer_t poll_timer;   /* batches out, fd may not wake for them: progress period */
    kvf_timer_t drain_timer;  /* SIGTERM's drain gives up */
    kvf_timer_t stop_timer;   /* stopping: the wait for transfers ends */
    kvf_timer_t stats_timer;  /* the next stats line */
    kvf_status_t node_status; /* the router's final refusal, seen by a tick */
    bool drain_expired, stop_expired;
    /* Messages read during a forward, for the loop (messages.c). */
    kvf_kept_t stash;
};

static inline uint64_t pf_us_between(uint64_t from_ns, uint64_t to_ns)
{
    return to_ns > from_ns ? (to_ns - from_ns) / 1000u : 0;
}

/* ---- tiers.c: the KV tiers ---- */

/* The tiers of cfg (none when it asks for none); a disk tier that cannot
 * be made leaves RAM only, with a warning. NOMEM. */
kvf_status_t pf_tiers_create(kvf_prefill_t *p, const kvf_prefill_config_t *cfg);
/* Starts copying r's prompt blocks [from, most) that a tier holds into
 * r's own blocks, up to the first a tier lacks; r waits for them
 * (r->tier_pending). Returns where the copies end. */
uint32_t pf_tiers_promote(kvf_prefill_t *p, pf_req_t *r, uint32_t from, uint32_t most);
/* forward.c: r computes from its first n blocks on (cache and tier hits). */
void pf_req_set_cached(kvf_prefill_t *p, pf_req_t *r, uint32_t n);

/* ---- pull.c: prefix pulls ---- */

/* r holds its first n prompt blocks (cache and tier hits): where D holds
 * more of them (r->ship_from, at most r->hit_most), r waits while they
 * are read from there (r->pull); else r computes from block n on. */
void pf_req_reuse(kvf_prefill_t *p, pf_req_t *r, uint32_t n);
/* Moves r's pull along: once it ended r computes from the first block it
 * lacks. Returns whether it still runs (r's blocks must stay). */
bool pf_req_service_pull(kvf_prefill_t *p, pf_req_t *r);

/* ---- requests.c ---- */

/* The attempt (req_id, epoch), or with epoch 0 the newest attempt of
 * req_id. Older attempts may still be in the table, aborting. */
pf_req_t *pf_req_find(kvf_prefill_t *p, uint64_t req_id, uint64_t epoch);
/* Waiting for its reservation or being computed (counted as queued). */
bool pf_req_computing(const pf_req_t *r);
/* A new request for env's PrefillRequest (taken on success), holding peer's
 * reference, sampling with the parameters its message converted to,
 * appended to the table. NULL when out of memory (env and the reference
 * are still the caller's). */
pf_req_t *pf_req_add(kvf_prefill_t *p, kvf_envelope_t *env, pf_peer_t *peer,
                     const kvf_sampling_params_t *sampling);
/* Unlinks and frees r: its local blocks go back to the pool, its peer
 * reference is dropped. The caller made sure no batch still reads the
 * blocks (or the transfer handle is gone). */
void pf_req_destroy(kvf_prefill_t *p, pf_req_t *r);
/* Releases r's batches (the transport drives them to their end). */
void pf_req_release_batches(pf_req_t *r);
/* Posts the slices for r to its peer (retrying briefly while the transport
 * says AGAIN); the batch joins r's list. */
kvf_status_t pf_req_post(kvf_prefill_t *p, pf_req_t *r, const kvf_xfer_slice_t *slices, size_t n,
                         uint32_t flags);
/* Gives r up: ABORT to D where it holds a reservation; r waits in ABORTING
 * until no batch runs. No message to the router. */
void pf_req_abort(kvf_prefill_t *p, pf_req_t *r);
/* Fails r: Error{status} to the router, then abort. */
void pf_req_fail(kvf_prefill_t *p, pf_req_t *r, kvf_status_t status, const char *why);
/* Cancels r (router's Cancel or a newer epoch): no Error to the router. */
void pf_req_cancel(kvf_prefill_t *p, pf_req_t *r);
/* Moves every request along that the transport or the clock allows. */
void pf_service_requests(kvf_prefill_t *p);

/* ---- messages.c ---- */

/* Error{status, message} for (req_id, epoch) to the router; message NULL:
 * the status's own text. */
void pf_send_error(kvf_prefill_t *p, uint64_t req_id, uint64_t epoch, kvf_status_t status,
                   const char *message);
/* Takes env: a message from the router, a decode node or the node runtime. */
void pf_handle_envelope(kvf_prefill_t *p, kvf_envelope_t *env);
/* Reads the inbox between layers of a forward: lease answers are taken at
 * once (the forward's posts need their lease ends), the rest is kept for
 * the loop, in order. */
void pf_inbox_during_forward(kvf_prefill_t *p);
/* Hands the loop what pf_inbox_during_forward kept. */
void pf_stash_handle(kvf_prefill_t *p);
/* Frees what is kept (the node stops). */
void pf_stash_free(kvf_prefill_t *p);
/* Every batch of r completed: PrefillDone to the router, KvReady to D, its
 * full blocks listed in the prefix cache, r freed (or failed when D cannot
 * be told). */
void pf_req_complete(kvf_prefill_t *p, pf_req_t *r);

/* ---- peers.c ---- */

/* A connected peer for decode node node_id with descriptor desc, with one
 * reference taken; NULL when connecting failed (*status_p says why). */
pf_peer_t *pf_peer_get(kvf_prefill_t *p, const char *node_id, const uint8_t *desc, size_t len,
                       kvf_status_t *status_p);
/* Drops one reference (peer may be NULL); disconnects stale or failed
 * peers nobody uses. */
void pf_peer_put(kvf_prefill_t *p, pf_peer_t *peer);
/* Frees every peer record once the transfer handle (which owned their
 * connections) is gone. */
void pf_peers_free(kvf_prefill_t *p);
/* Sends (or retries) r's KvAlloc, waiting up to timeout_ms for the socket. */
void pf_send_alloc(kvf_prefill_t *p, pf_req_t *r, int timeout_ms);
/* D's answer to a KvAlloc: r becomes READY, or is refused or aborted. */
void pf_on_alloc_reply(kvf_prefill_t *p, const Kvf__KvAllocReply *a);
/* The alloc timer of a request (pf_req_add arms nothing; pf_send_alloc
 * does): retries an unsent KvAlloc, gives up on one unanswered past its
 * deadline. arg: the kvf_prefill_t. */
void pf_on_alloc_timer(kvf_timer_t *timer, void *arg);
/* Whether r's lease ends too soon (PF_LEASE_MARGIN_NS) to start it. */
bool pf_lease_ending(const pf_req_t *r, uint64_t now_ns);
/* D's answer to the KvLease the heartbeat thread sent (sender: the
 * envelope's): the renewed reservations may be written until the time it
 * was asked plus a lease. */
void pf_on_lease_reply(kvf_prefill_t *p, const Kvf__KvLeaseReply *a, const char *sender);

/* ---- forward.c ---- */

/* Blocks a new prompt can have: free, or cached and used by nobody. */
uint32_t pf_blocks_available(const kvf_prefill_t *p);
/* Whether a READY request could run now (it holds local blocks or the pool
 * has room for its prompt). */
bool pf_forward_possible(const kvf_prefill_t *p);
/* Picks the next forward and runs it. Returns whether one ran. */
bool pf_forward_step(kvf_prefill_t *p);
/* Frees the forward scratch. */
void pf_forward_fini(pf_forward_t *f);

#endif
