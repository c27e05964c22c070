/* kvf-prefill: a prefill node of a kvferry cluster (docs/ARCHITECTURE.md, docs/PROTOCOL.md).
 *
 * One event loop owns everything: the node runtime (inbox, registration,
 * heartbeats), the request table, the local KV pool and its allocator, the
 * engine (its forwards run on the loop's thread) and the transfer handle;
 * it sleeps until I/O or its next deadline, each deadline a timer
 * (kvf/evloop.h). A request goes
 *   PrefillRequest -> KvAlloc sent (WAIT_ALLOC) -> KvAllocReply accepted
 *   (READY) -> chunks computed in batched forwards, each layer's completed
 *   slices posted from the engine's per-layer hook -> first token sampled
 *   (SHIPPING) -> every batch completed -> PrefillDone (timings) to the
 *   router, KvReady (the first token, which the decode node emits) to the
 *   decode node, local blocks freed.
 * Failures (refusal, transfer error, lease end, cancel) send the router an
 * Error (except for a cancel), post an ABORT batch where the peer is up,
 * and free the local blocks once no transfer reads them any more. */
#ifndef KVF_PREFILL_H
#define KVF_PREFILL_H

#include <signal.h>

#include "kvf/signals.h"
#include <stdbool.h>
#include <stdint.h>

#include "kvf/backend_flags.h"
#include "kvf/engine.h"
#include "kvf/status.h"

#define KVF_PREFILL_KV_MEM_DEFAULT           (256ull << 20)
#define KVF_PREFILL_MAX_BATCH_TOKENS_DEFAULT 2048
#define KVF_PREFILL_ALLOC_TIMEOUT_MS_DEFAULT 5000

typedef struct {
    const char *router_url;      /* the router's inbox */
    const char *listen_url;      /* this node's inbox */
    const char *model_dir;       /* Hugging Face model directory */
    const char *node_id;         /* NULL: generated */
    int threads;                 /* compute threads; <= 0: one per CPU */
    kvf_backend_flags_t backend; /* --backend, --device, ...: zeroed is the CPU */
    uint64_t kv_mem;             /* bytes of the local KV pool */
    int max_batch_tokens;        /* tokens per forward (chunked prefill) */
    int block_size;              /* tokens per KV block; must match the decode nodes */
    bool checksum;               /* CRC32C per shipped range */
    int alloc_timeout_ms;        /* how long to wait for a KvAllocReply */
    uint32_t stats_interval_ms;  /* log the counters this often when they changed; 0: 30 s */
    bool no_prefix_cache;        /* recompute every prompt from token 0 */
    bool no_prefix_pull;         /* never read the decode node's cached prefix blocks */
    /* KV tiers (docs/kv-tiers.md): cached blocks the pool evicts go to
     * host RAM (kv_host_mem bytes), then to a file in kv_disk_dir
     * (kv_disk_size bytes); 0 / NULL: no such tier. */
    uint64_t kv_host_mem;
    const char *kv_disk_dir;
    uint64_t kv_disk_size;
} kvf_prefill_config_t;

typedef struct kvf_prefill kvf_prefill_t;

/* Loads the model, creates the pool, engine, transfer handle and node
 * runtime (binding the inbox). cfg's strings are copied or used only during
 * the call. On success *prefill_p is owned by the caller:
 * kvf_prefill_destroy(). */
kvf_status_t kvf_prefill_create(const kvf_prefill_config_t *cfg, kvf_prefill_t **prefill_p);

/* Serves until *stop says otherwise (set from a signal handler):
 *   KVF_PREFILL_DRAIN (1): drain gracefully: the router is told (state
 *       "draining"), new prefill requests are handed back to it
 *       (Error{CLOSED}: it sends them elsewhere), every request held is
 *       completed (computed, shipped, KvReady sent), then the node
 *       deregisters; after drain_timeout_ms it gives up what is left;
 *   KVF_PREFILL_STOP (2): stop now: gives up the requests in flight
 *       (Error{CLOSED} to the router, ABORT to the decode nodes), waits a
 *       bounded time for their transfers to end and deregisters.
 * Returns KVF_OK after a requested stop, or the router's refusal of the
 * registration. */
kvf_status_t kvf_prefill_run(kvf_prefill_t *prefill, volatile sig_atomic_t *stop);

#define KVF_PREFILL_DRAIN KVF_STOP_DRAIN
#define KVF_PREFILL_STOP  KVF_STOP_NOW

/* Frees every request, block and handle; NULL is a no-op. */
void kvf_prefill_destroy(kvf_prefill_t *prefill);

#endif
