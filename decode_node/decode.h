/* kvf-decode: the decode node of a kvferry cluster (docs/ARCHITECTURE.md, docs/PROTOCOL.md).
 *
 * One kvf_decode_t owns everything the node has: the model, the CPU
 * backend, the paged KV pool, the engine, the transfer handle registered
 * over the pool (the receiving end of KV handoffs), the node runtime
 * (inbox, router registration, heartbeats, outboxes) and the request
 * table. kvf_decode_run() is the node's single event loop: it receives
 * control messages, drives the transport, and runs continuous-batching
 * decode steps (one engine forward over every decoding sequence, plus
 * prompt chunks of requests this node prefills itself with
 * --prefill-local), streaming one TokenBatch to the router per step. It
 * emits every token of a request, the first included, with the text the
 * tokens add, and decides every finish (EOS, stop strings, length).
 *
 * Thread rules: one thread (the loop's) uses a kvf_decode_t; the backend's
 * thread pool only runs inside kvf_engine_forward(). */
#ifndef KVF_DECODE_H
#define KVF_DECODE_H

#include <signal.h>

#include "kvf/signals.h"
#include <stdbool.h>
#include <stdint.h>

#include "kvf/backend_flags.h"
#include "kvf/engine.h"
#include "kvf/status.h"

#define KVF_DECODE_KV_MEM_DEFAULT           (256ull << 20)
#define KVF_DECODE_MAX_RUNNING_DEFAULT      64
#define KVF_DECODE_LEASE_MS_DEFAULT         10000
#define KVF_DECODE_MAX_BATCH_TOKENS_DEFAULT 2048
#define KVF_DECODE_SEND_TIMEOUT_MS          100

/* How prefill nodes write into this node's pool (kvf_xfer_config_t.two_sided;
 * senders follow the receiver's choice, carried in its descriptor). */
typedef enum {
    KVF_DECODE_XFER_AUTO = 0, /* AM unless UCX_TLS rules TCP out, RMA then */
    KVF_DECODE_XFER_RMA = 1,  /* one-sided puts straight into the pool */
    KVF_DECODE_XFER_AM = 2,   /* two-sided: slices checked and copied here */
} kvf_decode_xfer_mode_t;

typedef struct {
    const char *router_url; /* the router's inbox */
    const char *listen_url; /* this node's inbox */
    const char *model_dir;
    const char *node_id;        /* NULL: generated */
    uint64_t kv_mem;            /* KV pool budget in bytes; 0: default */
    int max_running;            /* most live requests; <= 0: default */
    int threads;                /* compute threads; <= 0: one per CPU */
    kvf_backend_flags_t backend; /* --backend, --device, ...: zeroed is the CPU */
    bool prefill_local;         /* also serve PrefillRequests naming this node */
    int block_size;             /* tokens per KV block; <= 0: 16 */
    uint32_t lease_ms;          /* reservation lease; 0: default */
    uint32_t max_batch_tokens;  /* tokens per forward (local prefill chunks); 0: default */
    uint32_t stats_interval_ms; /* log the counters this often when they changed; 0: 30 s */
    kvf_decode_xfer_mode_t xfer_mode;
    uint32_t drain_timeout_ms;  /* longest graceful drain; 0: 120 s */
    bool no_prefix_cache;       /* keep no shipped prompt blocks for later requests */
    /* KV tiers for the cached blocks the pool evicts (docs/kv-tiers.md);
     * local prefills take their blocks back from them */
    uint64_t kv_host_mem, kv_disk_size;
    const char *kv_disk_dir;
} kvf_decode_config_t;

/* Counters the node logs (and tests read). */
typedef struct {
    uint64_t requests_admitted;  /* KvAlloc or local PrefillRequest accepted */
    uint64_t requests_refused;   /* admission said no */
    uint64_t requests_finished;  /* ended with STOP or LENGTH */
    uint64_t requests_cancelled; /* Cancel from the router */
    uint64_t requests_failed;    /* expired lease, aborted or rejected transfer, errors */
    uint64_t requests_released;  /* blocks back in the pool */
    uint64_t stale_dropped;      /* messages or events of another epoch */
    uint64_t malformed_dropped;  /* undecodable, invalid or unexpected messages */
    uint64_t tokens_generated;   /* tokens taken, every first token and an ending EOS included */
    uint64_t steps;              /* engine forwards */
} kvf_decode_stats_t;

typedef struct kvf_decode kvf_decode_t;

/* Loads the model, sizes the pool (kv_mem, capped to what max_running
 * full-context sequences can use), opens the transport and binds the
 * inbox. cfg's strings are copied. On success *dec_p is owned by the
 * caller: kvf_decode_destroy(). */
kvf_status_t kvf_decode_create(const kvf_decode_config_t *cfg, kvf_decode_t **dec_p);

/* Runs the node's loop. *stop is written by a signal handler:
 *   KVF_DECODE_DRAIN (1): drain gracefully: tell the router (heartbeat
 *       state "draining"), refuse new work, finish every sequence held,
 *       deregister and return KVF_OK (or give up after drain_timeout_ms);
 *   KVF_DECODE_STOP (2): stop now: every live request is reported to the
 *       router as failed here (it dispatches them again), blocks freed.
 * Returns KVF_OK after a clean stop, or the router's final refusal. */
kvf_status_t kvf_decode_run(kvf_decode_t *dec, volatile sig_atomic_t *stop);

#define KVF_DECODE_DRAIN KVF_STOP_DRAIN
#define KVF_DECODE_STOP KVF_STOP_NOW

/* Frees everything; NULL is a no-op. */
void kvf_decode_destroy(kvf_decode_t *dec);

void kvf_decode_get_stats(const kvf_decode_t *dec, kvf_decode_stats_t *stats_p);

#endif
