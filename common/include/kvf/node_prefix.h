/* A node's prefix cache as the node runtime sees it (common/node_prefix.c;
 * design: docs/prefix-cache.md): the cache over the node's pool, kept
 * under the cluster's hash key from the router's RegisterReply (a new key
 * empties it), and the reports that tell the router which blocks it holds
 * (PrefixUpdate), for KV-aware routing.
 *
 * Reports: kvf_node_prefix_report() sends what changed since the last
 * report (the cache's deltas), numbered 1, 2, 3, ... in PrefixUpdate.seq.
 * The first report after the key changed, after the router asked
 * (PrefixResync), after a send failed, or when the deltas outgrow one
 * message, is a full listing instead, cut at KVF_NODE_PREFIX_REPORT_MAX
 * hashes (then marked truncated). The router applies a delta only on top
 * of the update before it, so nothing lost goes unnoticed.
 *
 * With KV tiers attached (kvf_node_prefix_attach_tiers), each report also
 * says where the blocks below the pool are: the hashes whose tier changed
 * (tier_ram, tier_disk, tier_gone), or in a full listing every hash each
 * tier holds (docs/kv-tiers.md, "Reports").
 *
 * Loop thread only, like the node runtime. */
#ifndef KVF_NODE_PREFIX_H
#define KVF_NODE_PREFIX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvf/kv_tier.h"
#include "kvf/kvcache.h"
#include "kvf/msg.h"
#include "kvf/node.h"
#include "kvf/prefix_cache.h"
#include "kvf/status.h"

/* Hashes one delta report carries at most (added and removed each). */
#define KVF_NODE_PREFIX_DELTA_MAX 4096u
/* Hashes a full listing carries at most (512 KiB). */
#define KVF_NODE_PREFIX_REPORT_MAX 65536u

typedef struct {
    kvf_node_t *node;          /* borrowed; set once the node exists, before any call below */
    kvf_kvpool_t *pool;        /* borrowed */
    kvf_prefix_cache_t *cache; /* owned; NULL: no prefix cache */
    kvf_block_hash_key_t key;  /* the cluster's, valid while key_gen > 0 */
    uint64_t key_id;           /* kvf_block_hash_key_id(&key) */
    uint64_t model_fp;         /* the model fingerprint as a number */
    uint64_t root;             /* the unsalted chain root under key */
    uint32_t key_gen;          /* kvf_node_prefix_key's generation; 0: no key yet */
    int kv_dtype;
    uint32_t block_size;
    /* reports */
    uint64_t seq;     /* of the last update sent */
    bool want_full;   /* the next report lists everything */
    uint64_t *added;  /* scratch (KVF_NODE_PREFIX_REPORT_MAX) */
    uint64_t *removed; /* scratch (KVF_NODE_PREFIX_DELTA_MAX) */
    uint64_t reports_sent, full_reports_sent;
    /* set on every cache this makes (a new key makes a new one): NULL, or
     * where evicted blocks go (kvf_prefix_cache_set_evict_hook) */
    kvf_prefix_evict_fn on_evict;
    void *evict_arg;
    /* the KV tiers whose contents the reports carry (borrowed), or NULL;
     * scratch: tier_ram and tier_disk (KVF_NODE_PREFIX_REPORT_MAX each),
     * tier_gone (KVF_NODE_PREFIX_DELTA_MAX) */
    kvf_kv_tiers_t *tiers;
    uint64_t *tier_ram, *tier_disk, *tier_gone;
} kvf_node_prefix_t;

/* A cache over pool (borrowed), or none when !enabled (np->cache NULL:
 * every call below is then a cheap no-op). model_fingerprint: the model's
 * hex fingerprint. The caller sets np->node once its node exists. NOMEM. */
kvf_status_t kvf_node_prefix_init(kvf_node_prefix_t *np, kvf_kvpool_t *pool,
                                  const char *model_fingerprint, bool enabled);
/* From the next report on, the reports carry where tiers (borrowed; NULL:
 * none any more) holds its blocks. NOMEM (the reports then leave the
 * tiers out). */
kvf_status_t kvf_node_prefix_attach_tiers(kvf_node_prefix_t *np, kvf_kv_tiers_t *tiers);

/* Frees the cache (dropping its references) and the scratch. */
void kvf_node_prefix_fini(kvf_node_prefix_t *np);

/* Brings the key up to the router's: a new key (a restarted router)
 * empties the cache, as what it lists is unreachable under the new key
 * (blocks requests hold stay theirs). False when there is no cache or no
 * key yet: prompts then run cold. */
bool kvf_node_prefix_sync(kvf_node_prefix_t *np);

/* The chain root of a request with salt (salt_len bytes; 0: the shared
 * root). Call after kvf_node_prefix_sync returned true. */
uint64_t kvf_node_prefix_root(const kvf_node_prefix_t *np, const void *salt, size_t salt_len);

/* Blocks an allocation could get: free, or cached and used by nobody. */
uint32_t kvf_node_prefix_available(const kvf_node_prefix_t *np);

/* Sends the router a PrefixUpdate when the listing changed since the last
 * one (or a full listing is due); nothing otherwise. Call every loop turn
 * (cheap when nothing changed). The send waits up to timeout_ms for the
 * socket (the node's timeout for the messages that follow it): a report
 * that must reach the router before a message that ends a request is
 * not dropped because the message before it still occupies the pipe. */
void kvf_node_prefix_report(kvf_node_prefix_t *np, int timeout_ms);

/* Offers a received envelope: true when it was a PrefixResync (the next
 * report is a full listing). */
bool kvf_node_prefix_handle(kvf_node_prefix_t *np, const kvf_envelope_t *env);

#endif
