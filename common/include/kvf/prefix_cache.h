/* Content-addressed KV blocks and a node's prefix cache
 * (common/prefix_cache.c, common/block_hash.c; design: docs/prefix-cache.md).
 *
 * A full block's identity is a 64-bit hash chained over its parent's hash
 * and its block_size token ids. The chain starts from a root hash of
 * everything else that changes a block's K/V or must keep it apart: the
 * cluster's seed, the model's fingerprint, the KV format, and a tenant or
 * cache_salt. Two prompts share a block only when every token up to the
 * block's end is equal under the same root, so one tenant can never hit
 * (nor time) another's prompt. The hash is keyed by the cluster seed
 * (SipHash-2-4, a keyed PRF): without the seed nobody can build colliding
 * prompts on purpose; an accidental collision (2^-64 a pair) is caught on
 * every hit by comparing the block's stored token ids.
 *
 * The cache keeps finished sequences' full blocks in the pool, addressed
 * by hash. It holds one pool reference on each block it lists; a sequence
 * that reuses a block takes another (kvf_kvpool_ref). A block is
 * evictable when the cache's is its only reference (pool refcount 1), and
 * only evictable blocks are ever evicted, least recently used first. A
 * block is listed only once its K/V is complete (the caller inserts after
 * the data is written and, on a decode node, after the handoff sealed), so
 * a lookup never serves a block being written or shipped.
 *
 * Not thread-safe: one owner (a node's event loop) calls everything. */
#ifndef KVF_PREFIX_CACHE_H
#define KVF_PREFIX_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvf/kvcache.h"
#include "kvf/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- hashes ---------------------------------------------------------- */

/* The cluster's 128-bit hash key (e.g. from --prefix-seed or the cluster
 * key file); the same on every node of a cluster. */
typedef struct {
    uint64_t k0, k1;
} kvf_block_hash_key_t;

/* SipHash-2-4 of len bytes under key. */
uint64_t kvf_siphash24(const kvf_block_hash_key_t *key, const void *data, size_t len);

/* A public name of key: SipHash of a tag of its own (no root or block
 * message encodes alike), so that a report can say which key its hashes
 * are under without revealing the key. */
uint64_t kvf_block_hash_key_id(const kvf_block_hash_key_t *key);

/* The root of a sequence's chain: model fingerprint, KV format
 * (kvf_kv_dtype_t), block size, and salt (salt_len bytes, may be 0: no
 * tenant) hashed under key. */
uint64_t kvf_block_hash_root(const kvf_block_hash_key_t *key, uint64_t model_fp, int kv_dtype,
                             uint32_t block_size, const void *salt, size_t salt_len);

/* The hash of the block holding tokens[0 .. block_size) after a block of
 * hash parent (the root for the first block). */
uint64_t kvf_block_hash_next(const kvf_block_hash_key_t *key, uint64_t parent,
                             const uint32_t *tokens, uint32_t block_size);

/* The hashes of the n_tokens / block_size full blocks of tokens under
 * root, into hashes_p (caller's array of that many). Returns the count. */
uint32_t kvf_block_hash_chain(const kvf_block_hash_key_t *key, uint64_t root,
                              const uint32_t *tokens, uint32_t n_tokens, uint32_t block_size,
                              uint64_t *hashes_p);

/* ---- the cache ------------------------------------------------------- */

typedef struct kvf_prefix_cache kvf_prefix_cache_t;

typedef struct {
    uint64_t lookups;       /* kvf_prefix_cache_match calls */
    uint64_t hit_blocks;    /* blocks those calls matched */
    uint64_t query_blocks;  /* blocks those calls asked for */
    uint64_t inserted;      /* blocks listed */
    uint64_t evicted;       /* blocks evicted (their pool reference dropped) */
    uint64_t collisions;    /* hash matched, token ids did not: treated as a miss */
    uint32_t cached;        /* blocks listed now */
    uint32_t evictable;     /* of those, referenced by the cache alone */
} kvf_prefix_cache_stats_t;

/* A cache over pool (borrowed: it must outlive the cache), listing at
 * most max_blocks blocks (0: no limit but the pool). */
kvf_status_t kvf_prefix_cache_create(kvf_kvpool_t *pool, uint32_t max_blocks,
                                     kvf_prefix_cache_t **cache_p);

/* Drops every listed block's cache reference (blocks still used by a
 * sequence stay allocated to it) and frees the cache. NULL is a no-op. */
void kvf_prefix_cache_destroy(kvf_prefix_cache_t *cache);

/* The longest listed prefix of a sequence: for i = 0, 1, ... while
 * hashes[i] is listed and its stored tokens equal tokens[i*bs .. (i+1)*bs),
 * takes a pool reference on that block for the caller and writes its id
 * to ids_p[i]. At most n_hashes blocks. Returns the count matched (the
 * caller releases those references with kvf_kvpool_release). Marks the
 * matched blocks most recently used, the first block the most recent (so
 * eviction trims a cached prefix from its end; insert places a
 * sequence's blocks the same way). */
uint32_t kvf_prefix_cache_match(kvf_prefix_cache_t *cache, const uint64_t *hashes,
                                const uint32_t *tokens, uint32_t n_hashes, uint32_t *ids_p);

/* Lists n complete blocks of a sequence: block ids[i] holds the tokens
 * tokens[i*bs .. (i+1)*bs) and has hash hashes[i]. A hash already listed
 * keeps its block (the new one stays the caller's alone); otherwise the
 * cache takes a pool reference on ids[i]. Stops at the first block it
 * cannot list (no memory, or max_blocks with nothing evictable):
 * KVF_ERR_NO_SPACE / KVF_ERR_NOMEM after listing the ones before it (a
 * cache is an optimisation: callers log and go on). */
kvf_status_t kvf_prefix_cache_insert(kvf_prefix_cache_t *cache, const uint64_t *hashes,
                                     const uint32_t *tokens, const uint32_t *ids, uint32_t n);

/* Evicts up to n evictable blocks, least recently used first, dropping the
 * cache's reference (which frees them). Returns how many it evicted. */
uint32_t kvf_prefix_cache_evict(kvf_prefix_cache_t *cache, uint32_t n);

/* kvf_kvpool_alloc that first evicts as many evictable blocks as the
 * shortfall needs. KVF_ERR_NO_SPACE (nothing allocated) when even then
 * fewer than n would be free. */
kvf_status_t kvf_prefix_cache_alloc(kvf_prefix_cache_t *cache, uint32_t n, uint32_t *ids_p);

/* Blocks an allocation could get: free plus evictable. */
uint32_t kvf_prefix_cache_available(const kvf_prefix_cache_t *cache);

/* Whether hash is listed (no reference taken, no LRU change): for the
 * reports a node sends (which prefix blocks it holds). */
bool kvf_prefix_cache_contains(const kvf_prefix_cache_t *cache, uint64_t hash);

/* Listed hashes added (added_p) and removed (removed_p) since the last
 * call, up to cap each; *n_added_p / *n_removed_p their counts; returns
 * true when some did not fit (the caller then sends a full resync with
 * kvf_prefix_cache_list). A hash added then removed between two calls
 * appears in neither (so does one removed then added again). A false
 * return consumes what it wrote; after a true one what it wrote is partial
 * and nothing is consumed: the deltas stay pending until
 * kvf_prefix_cache_list clears them. */
bool kvf_prefix_cache_take_deltas(kvf_prefix_cache_t *cache, uint64_t *added_p,
                                  uint32_t *n_added_p, uint64_t *removed_p, uint32_t *n_removed_p,
                                  uint32_t cap);

/* Every listed hash, up to cap, into hashes_p; returns the count listed
 * in total (may exceed cap). Clears the pending deltas. */
uint32_t kvf_prefix_cache_list(kvf_prefix_cache_t *cache, uint64_t *hashes_p, uint32_t cap);

void kvf_prefix_cache_stats(const kvf_prefix_cache_t *cache, kvf_prefix_cache_stats_t *stats_p);

/* Called for each block eviction is about to free (hash, its tokens, its
 * pool block, still allocated and whole during the call): e.g. to copy
 * it to a slower tier (kvf/kv_tier.h) instead of losing it. Not called
 * for the blocks kvf_prefix_cache_destroy drops. */
typedef void (*kvf_prefix_evict_fn)(void *arg, uint64_t hash, const uint32_t *tokens,
                                    uint32_t block);
void kvf_prefix_cache_set_evict_hook(kvf_prefix_cache_t *cache, kvf_prefix_evict_fn fn, void *arg);

/* Test hook: every hash the cache sees is masked with mask before use
 * (e.g. 0xff: 256 distinct values, so different blocks collide) to test
 * the token comparison. ~0ull (the default) is no masking. */
void kvf_prefix_cache_test_hash_mask(kvf_prefix_cache_t *cache, uint64_t mask);

#ifdef __cplusplus
}
#endif

#endif
