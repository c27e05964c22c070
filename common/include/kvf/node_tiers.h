/* A node's KV tiers (kvf/kv_tier.h, docs/kv-tiers.md) wired to its pool,
 * prefix cache and event loop (common/node_tiers.c), for both node kinds:
 * the prefix cache's evictions go to the tiers (from the pool's host
 * copy), and a request's next prompt blocks that a tier holds are copied
 * back into its own pool blocks, each copy holding a pool reference on its
 * destination block until it is reported (so a request that ends meanwhile
 * never has a block freed under a copy). The node's loop hears of each
 * copy through on_done. Loop thread only. */
#ifndef KVF_NODE_TIERS_H
#define KVF_NODE_TIERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvf/evloop.h"
#include "kvf/kv_tier.h"
#include "kvf/kvcache.h"
#include "kvf/msg.h"
#include "kvf/node_prefix.h"
#include "kvf/status.h"

/* A copy of block `index` of request (req_id, epoch) was reported: st
 * KVF_OK, or why the block is not good (it is dropped and must be
 * computed); tier 1 RAM, 2 disk. */
typedef void (*kvf_node_tiers_done_fn)(void *arg, uint64_t req_id, uint64_t epoch,
                                       uint32_t index, kvf_status_t st, int tier);

typedef struct {
    uint64_t host_bytes;  /* --kv-host-mem; 0: no RAM tier */
    const char *disk_dir; /* --kv-disk; NULL: no disk tier */
    uint64_t disk_bytes;  /* --kv-disk-size */
    /* tier 1's allocator (kvf_kv_tiers_config_t): the node's backend's
     * host memory, pinned on a GPU (NULL: malloc) */
    void *(*host_alloc)(void *host_arg, size_t bytes);
    void (*host_free)(void *host_arg, void *p);
    void *host_arg;
} kvf_node_tiers_config_t;

/* The three flags of kvf_node_tiers_config_t for a node's kvf_flag_t
 * table (kvf/flags.h): --kv-host-mem, --kv-disk, --kv-disk-size. */
#define KVF_NODE_TIERS_FLAG_ENTRIES(host_p, dir_p, size_p)                                           \
    {"kv-host-mem", KVF_FLAG_SIZE, (host_p), "BYTES",                                             \
     "KV tier 1: host RAM that keeps the cached blocks the pool evicts (default 0: none)",       \
     NULL},                                                                                       \
        {"kv-disk", KVF_FLAG_STRING, (dir_p), "DIR",                                              \
         "KV tier 2: a file in DIR that keeps the blocks tier 1 evicts (needs --kv-disk-size)",  \
         NULL},                                                                                   \
        {"kv-disk-size", KVF_FLAG_SIZE, (size_p), "BYTES", "size of the tier 2 file", NULL}

/* What is wrong with the tier flags (the disk flags go together, and the
 * tiers keep prefix-cache blocks), or NULL. */
const char *kvf_node_tiers_check(const kvf_node_tiers_config_t *cfg, bool no_prefix_cache);

typedef struct kvf_node_fetch kvf_node_fetch_t;

typedef struct {
    kvf_kv_tiers_t *tiers; /* NULL: no tiers (every call below is a no-op) */
    kvf_kvpool_t *pool;    /* borrowed */
    kvf_evloop_t *loop;    /* borrowed */
    kvf_node_prefix_t *pc; /* borrowed: its reports carry the tiers' contents */
    size_t block_bytes;
    kvf_node_fetch_t *fetches; /* (n_fetches) copies in flight */
    uint32_t n_fetches;
    kvf_node_tiers_done_fn on_done;
    void *arg;
    uint64_t hit_tokens; /* prompt tokens requests took from the tiers (kvf_node_tiers_count) */
} kvf_node_tiers_t;

/* The tiers cfg asks for (none when it asks for none, or when pc has no
 * cache: they keep prefix-cache blocks), hooked to pc's evictions and on
 * loop; a disk tier that cannot be made leaves RAM only, with a warning.
 * An error (logged) when no tier asked for can be made. */
kvf_status_t kvf_node_tiers_init(kvf_node_tiers_t *nt, const kvf_node_tiers_config_t *cfg,
                                 kvf_node_prefix_t *pc, kvf_kvpool_t *pool, kvf_evloop_t *loop,
                                 kvf_node_tiers_done_fn on_done, void *arg);
/* Destroys the tiers (copies not reported never are) and drops the copies'
 * references. Call before the pool goes. */
void kvf_node_tiers_fini(kvf_node_tiers_t *nt);

/* Starts copying the blocks [from, most) of a request's prompt that a
 * tier holds (hashes[i], tokens + i * block_size) into blocks[i], up to
 * the first a tier lacks (or a copy that cannot start). Returns where the
 * copies end; *pending_p grows by the copies started. */
uint32_t kvf_node_tiers_promote(kvf_node_tiers_t *nt, uint64_t req_id, uint64_t epoch,
                                const uint64_t *hashes, const uint32_t *tokens,
                                uint32_t block_size, const uint32_t *blocks, uint32_t from,
                                uint32_t most, uint32_t *pending_p);

/* A request's copy of its block `index` was reported (on_done): a failed
 * one lowers *good_p to it (the blocks from there on are computed, or
 * received). When it was the last of *pending_p, the good blocks [from,
 * *good_p) of blocks are brought up to date on a device pool (the copy
 * queued ahead of the request's forward, kvf_kvpool_upload_queued; *good_p
 * falls back to from if queueing fails), counted as prompt tokens taken from
 * the tiers, and true is returned: the request computes from block
 * *good_p. blocks NULL: no upload, the caller brings the host copies up
 * itself (a decode node's transferred request uploads its whole prompt
 * once the handoff sealed). */
bool kvf_node_tiers_copied(kvf_node_tiers_t *nt, uint64_t req_id, uint32_t index,
                           kvf_status_t st, int tier, uint32_t *pending_p, uint32_t *good_p,
                           const uint32_t *blocks, uint32_t from, uint32_t block_size);

/* The blocks each tier holds, for the load report. */
void kvf_node_tiers_load(const kvf_node_tiers_t *nt, Kvf__Load *load);
/* "kv tiers: ..." for a stats line. */
void kvf_node_tiers_describe(const kvf_node_tiers_t *nt, char *buf, size_t len);

#endif
