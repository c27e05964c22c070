/* A node's prefix cache: listed full KV blocks by content hash, with pool
 * references, LRU eviction of the blocks nobody else uses, and the deltas
 * a node reports. See kvf/prefix_cache.h; design: docs/prefix-cache.md.
 *
 * Memory: one slab of entries and one of their token ids, both sized at
 * create for the most blocks the cache can list (max_blocks, or the
 * pool's block count), so listing a block allocates nothing but hash
 * buckets. Each delta set draws its nodes from a slab of the same size
 * (delta_record says why that is enough).
 *
 * Eviction keeps one LRU list of every listed block, in use or not. The
 * cache cannot keep evictable and in-use blocks on separate lists: a
 * sequence drops its reference with kvf_kvpool_release, which the cache
 * does not see, so a block turns evictable without the cache knowing.
 * Instead the eviction walk starts at the LRU end, visits each entry at
 * most once per call, and moves a block it finds in use to the MRU end:
 * the block is in use now, which is a use. So one sequence's long-held
 * blocks are stepped over once, not on every eviction, and the walk's
 * amortised length stays near the number of blocks evicted.
 *
 * Within one match or insert, a sequence's blocks are placed so that its
 * first block is the most recent and its last the least: eviction then
 * trims a cached prefix from its end, and what stays is still reachable
 * from the root (a block is matched only after all blocks before it). */
#include "kvf/prefix_cache.h"
#include "kvf/hashmap.h"
#include "kvf/log.h"

#include <stdlib.h>
#include <string.h>

typedef struct pc_entry {
    uint64_t hash;                /* masked; the table's key */
    uint32_t block;               /* pool block id; UINT32_MAX while the slot is free */
    uint32_t slot;                /* index in the slabs: tokens at tokens + slot * block_size */
    struct pc_entry *prev, *next; /* LRU list (prev: more recent); next also links free slots */
    UT_hash_handle hh;
} pc_entry_t;

/* A hash in a pending delta set. */
typedef struct pc_delta {
    uint64_t hash;
    struct pc_delta *next_free;
    UT_hash_handle hh;
} pc_delta_t;

/* One pending set (added or removed hashes) and its node slab. */
typedef struct {
    pc_delta_t *nodes; /* (cap) */
    pc_delta_t *free;  /* free nodes */
    pc_delta_t *set;   /* the uthash table */
    uint32_t n;
} pc_delta_set_t;

struct kvf_prefix_cache {
    kvf_kvpool_t *pool; /* borrowed */
    uint32_t block_size;
    uint32_t cap;        /* most entries listed at once */
    pc_entry_t *entries; /* (cap) */
    uint32_t *tokens;    /* (cap, block_size) */
    pc_entry_t *free_entries;
    pc_entry_t *table; /* hash -> entry */
    pc_entry_t *mru, *lru;
    uint32_t n_cached;
    uint64_t mask;
    pc_delta_set_t added, removed;
    bool deltas_overflowed; /* pending sets dropped: only a full list resyncs */
    kvf_prefix_cache_stats_t stats;
    kvf_prefix_evict_fn on_evict; /* NULL: evicted blocks are just dropped */
    void *evict_arg;
};

/* ---- LRU list ------------------------------------------------------- */

static void lru_unlink(kvf_prefix_cache_t *c, pc_entry_t *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        c->mru = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        c->lru = e->prev;
    e->prev = e->next = NULL;
}

/* Links e (unlinked) just less recent than anchor, or at the MRU end for
 * a NULL anchor. */
static void lru_link_after(kvf_prefix_cache_t *c, pc_entry_t *anchor, pc_entry_t *e)
{
    e->prev = anchor;
    e->next = anchor ? anchor->next : c->mru;
    if (e->next)
        e->next->prev = e;
    else
        c->lru = e;
    if (anchor)
        anchor->next = e;
    else
        c->mru = e;
}

/* Moves a listed e just behind anchor (NULL: to the MRU end). */
static void lru_place(kvf_prefix_cache_t *c, pc_entry_t *anchor, pc_entry_t *e)
{
    if (anchor == e)
        return;
    lru_unlink(c, e);
    lru_link_after(c, anchor, e);
}

/* ---- pending deltas ------------------------------------------------- */

static kvf_status_t delta_set_init(pc_delta_set_t *s, uint32_t cap)
{
    memset(s, 0, sizeof(*s));
    s->nodes = calloc(cap, sizeof(*s->nodes));
    if (!s->nodes)
        return KVF_ERR_NOMEM;
    for (uint32_t i = cap; i-- > 0;) {
        s->nodes[i].next_free = s->free;
        s->free = &s->nodes[i];
    }
    return KVF_OK;
}

static void delta_set_clear(pc_delta_set_t *s)
{
    pc_delta_t *d, *tmp;
    HASH_ITER(hh, s->set, d, tmp)
    {
        HASH_DELETE(hh, s->set, d);
        d->next_free = s->free;
        s->free = d;
    }
    s->n = 0;
}

static void delta_set_fini(pc_delta_set_t *s)
{
    HASH_CLEAR(hh, s->set);
    free(s->nodes);
    memset(s, 0, sizeof(*s));
}

/* Removes hash from s; true when it was there. */
static bool delta_set_take(pc_delta_set_t *s, uint64_t hash)
{
    pc_delta_t *d;
    HASH_FIND(hh, s->set, &hash, sizeof(hash), d);
    if (!d)
        return false;
    HASH_DELETE(hh, s->set, d);
    d->next_free = s->free;
    s->free = d;
    s->n--;
    return true;
}

static kvf_status_t delta_set_put(pc_delta_set_t *s, uint64_t hash)
{
    pc_delta_t *d = s->free;
    if (!d)
        return KVF_ERR_NO_SPACE;
    d->hash = hash;
    kvf_status_t st;
    KVF_HASH_ADD(s->set, hash, d, st);
    if (st != KVF_OK)
        return st;
    s->free = d->next_free;
    s->n++;
    return KVF_OK;
}

/* Records that hash became listed (added) or unlisted (!added). A change
 * that undoes a pending one cancels it: between two reports the receiver
 * needs only the net change. So added is a subset of what is listed now
 * and removed of what was listed at the last report, neither more than
 * cap: the node slabs cannot run out. Should a set's table fail to grow
 * (no memory), both sets are dropped and only a full list resyncs. */
static void delta_record(kvf_prefix_cache_t *c, uint64_t hash, bool added)
{
    if (c->deltas_overflowed)
        return;
    pc_delta_set_t *undo = added ? &c->removed : &c->added;
    if (delta_set_take(undo, hash))
        return;
    if (delta_set_put(added ? &c->added : &c->removed, hash) != KVF_OK) {
        delta_set_clear(&c->added);
        delta_set_clear(&c->removed);
        c->deltas_overflowed = true;
    }
}

/* ---- entries -------------------------------------------------------- */

static pc_entry_t *entry_find(const kvf_prefix_cache_t *c, uint64_t hash)
{
    pc_entry_t *e;
    HASH_FIND(hh, c->table, &hash, sizeof(hash), e);
    return e;
}

static const uint32_t *entry_tokens(const kvf_prefix_cache_t *c, const pc_entry_t *e)
{
    return c->tokens + (size_t)e->slot * c->block_size;
}

/* Unlists e and drops the cache's pool reference (freeing the block when
 * it was the last). */
static void entry_drop(kvf_prefix_cache_t *c, pc_entry_t *e)
{
    HASH_DELETE(hh, c->table, e);
    lru_unlink(c, e);
    delta_record(c, e->hash, false);
    if (kvf_kvpool_release(c->pool, &e->block, 1) != KVF_OK)
        kvf_log_error("prefix cache: block %u was listed but not allocated", e->block);
    e->block = UINT32_MAX;
    e->next = c->free_entries;
    c->free_entries = e;
    c->n_cached--;
}

static bool entry_evictable(const kvf_prefix_cache_t *c, const pc_entry_t *e)
{
    return kvf_kvpool_refcount(c->pool, e->block) == 1;
}

/* Evicts up to n evictable entries from the LRU end, never keep (may be
 * NULL). Each entry is visited at most once; one in use moves to the MRU
 * end (file comment). */
static uint32_t evict_walk(kvf_prefix_cache_t *c, uint32_t n, const pc_entry_t *keep)
{
    uint32_t evicted = 0;
    uint32_t to_visit = c->n_cached;
    pc_entry_t *e = c->lru;
    while (e && evicted < n && to_visit-- > 0) {
        pc_entry_t *older_next = e->prev;
        if (e != keep) {
            if (entry_evictable(c, e)) {
                if (c->on_evict)
                    c->on_evict(c->evict_arg, e->hash, entry_tokens(c, e), e->block);
                entry_drop(c, e);
                evicted++;
            } else {
                lru_place(c, NULL, e);
            }
        }
        e = older_next;
    }
    c->stats.evicted += evicted;
    return evicted;
}

static uint32_t count_evictable(const kvf_prefix_cache_t *c)
{
    uint32_t n = 0;
    for (const pc_entry_t *e = c->mru; e; e = e->next)
        n += entry_evictable(c, e);
    return n;
}

/* Lists block under hash (not listed yet) just behind anchor, taking a
 * pool reference; *e_p the new entry. Makes room by evicting (never the
 * anchor, which the caller still points at) when the cache is full. */
static kvf_status_t entry_add(kvf_prefix_cache_t *c, uint64_t hash, const uint32_t *tokens,
                              uint32_t block, pc_entry_t *anchor, pc_entry_t **e_p)
{
    if (!c->free_entries && evict_walk(c, 1, anchor) == 0)
        return KVF_ERR_NO_SPACE;
    pc_entry_t *e = c->free_entries;
    kvf_status_t st = kvf_kvpool_ref(c->pool, block);
    if (st != KVF_OK) {
        kvf_log_error("prefix cache: insert of block %u, which is not allocated", block);
        return st;
    }
    e->hash = hash;
    KVF_HASH_ADD(c->table, hash, e, st);
    if (st != KVF_OK) {
        (void)kvf_kvpool_release(c->pool, &block, 1);
        return st;
    }
    c->free_entries = e->next;
    e->block = block;
    memcpy(c->tokens + (size_t)e->slot * c->block_size, tokens, c->block_size * sizeof(*tokens));
    lru_link_after(c, anchor, e);
    c->n_cached++;
    c->stats.inserted++;
    delta_record(c, hash, true);
    *e_p = e;
    return KVF_OK;
}

/* ---- the API -------------------------------------------------------- */

kvf_status_t kvf_prefix_cache_create(kvf_kvpool_t *pool, uint32_t max_blocks,
                                     kvf_prefix_cache_t **cache_p)
{
    kvf_prefix_cache_t *c = calloc(1, sizeof(*c));
    if (!c)
        return KVF_ERR_NOMEM;
    c->pool = pool;
    c->block_size = (uint32_t)kvf_kvpool_geometry(pool)->block_size;
    c->cap = kvf_kvpool_num_blocks(pool);
    if (max_blocks && max_blocks < c->cap)
        c->cap = max_blocks;
    c->mask = ~0ull;
    c->entries = calloc(c->cap, sizeof(*c->entries));
    c->tokens = calloc((size_t)c->cap * c->block_size, sizeof(*c->tokens));
    if (!c->entries || !c->tokens)
        goto fail_slabs;
    if (delta_set_init(&c->added, c->cap) != KVF_OK)
        goto fail_slabs;
    if (delta_set_init(&c->removed, c->cap) != KVF_OK)
        goto fail_added;
    for (uint32_t i = c->cap; i-- > 0;) {
        c->entries[i].slot = i;
        c->entries[i].block = UINT32_MAX;
        c->entries[i].next = c->free_entries;
        c->free_entries = &c->entries[i];
    }
    *cache_p = c;
    return KVF_OK;

fail_added:
    delta_set_fini(&c->added);
fail_slabs:
    free(c->tokens);
    free(c->entries);
    free(c);
    kvf_log_error("prefix cache: no memory for %u entries", max_blocks);
    return KVF_ERR_NOMEM;
}

void kvf_prefix_cache_destroy(kvf_prefix_cache_t *cache)
{
    if (!cache)
        return;
    for (pc_entry_t *e = cache->mru; e; e = e->next)
        if (kvf_kvpool_release(cache->pool, &e->block, 1) != KVF_OK)
            kvf_log_error("prefix cache: block %u was listed but not allocated", e->block);
    HASH_CLEAR(hh, cache->table);
    delta_set_fini(&cache->added);
    delta_set_fini(&cache->removed);
    free(cache->tokens);
    free(cache->entries);
    free(cache);
}

uint32_t kvf_prefix_cache_match(kvf_prefix_cache_t *cache, const uint64_t *hashes,
                                const uint32_t *tokens, uint32_t n_hashes, uint32_t *ids_p)
{
    size_t block_bytes = cache->block_size * sizeof(*tokens);
    pc_entry_t *anchor = NULL;
    uint32_t n = 0;
    for (; n < n_hashes; n++) {
        pc_entry_t *e = entry_find(cache, hashes[n] & cache->mask);
        if (!e)
            break;
        if (memcmp(entry_tokens(cache, e), tokens + (size_t)n * cache->block_size, block_bytes) !=
            0) {
            cache->stats.collisions++;
            break;
        }
        if (kvf_kvpool_ref(cache->pool, e->block) != KVF_OK) {
            kvf_log_error("prefix cache: listed block %u is not allocated", e->block);
            break;
        }
        ids_p[n] = e->block;
        lru_place(cache, anchor, e);
        anchor = e;
    }
    cache->stats.lookups++;
    cache->stats.query_blocks += n_hashes;
    cache->stats.hit_blocks += n;
    return n;
}

kvf_status_t kvf_prefix_cache_insert(kvf_prefix_cache_t *cache, const uint64_t *hashes,
                                     const uint32_t *tokens, const uint32_t *ids, uint32_t n)
{
    pc_entry_t *anchor = NULL;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t hash = hashes[i] & cache->mask;
        pc_entry_t *e = entry_find(cache, hash);
        if (e) {
            lru_place(cache, anchor, e);
        } else {
            kvf_status_t st =
                entry_add(cache, hash, tokens + (size_t)i * cache->block_size, ids[i], anchor, &e);
            if (st != KVF_OK)
                return st;
        }
        anchor = e;
    }
    return KVF_OK;
}

uint32_t kvf_prefix_cache_evict(kvf_prefix_cache_t *cache, uint32_t n)
{
    return evict_walk(cache, n, NULL);
}

kvf_status_t kvf_prefix_cache_alloc(kvf_prefix_cache_t *cache, uint32_t n, uint32_t *ids_p)
{
    uint32_t free_blocks = kvf_kvpool_free_blocks(cache->pool);
    if (free_blocks < n) {
        /* Count first: evicting for an allocation that fails anyway would
         * throw cached blocks away for nothing. */
        uint32_t shortfall = n - free_blocks;
        if (count_evictable(cache) < shortfall)
            return KVF_ERR_NO_SPACE;
        if (evict_walk(cache, shortfall, NULL) < shortfall)
            return KVF_ERR_NO_SPACE;
    }
    return kvf_kvpool_alloc(cache->pool, n, ids_p);
}

uint32_t kvf_prefix_cache_available(const kvf_prefix_cache_t *cache)
{
    return kvf_kvpool_free_blocks(cache->pool) + count_evictable(cache);
}

bool kvf_prefix_cache_contains(const kvf_prefix_cache_t *cache, uint64_t hash)
{
    return entry_find(cache, hash & cache->mask) != NULL;
}

/* Writes up to cap of s's hashes into out_p; their count into *n_p. */
static void delta_set_copy(const pc_delta_set_t *s, uint64_t *out_p, uint32_t *n_p, uint32_t cap)
{
    uint32_t n = 0;
    for (const pc_delta_t *d = s->set; d && n < cap; d = d->hh.next)
        out_p[n++] = d->hash;
    *n_p = n;
}

bool kvf_prefix_cache_take_deltas(kvf_prefix_cache_t *cache, uint64_t *added_p, uint32_t *n_added_p,
                                  uint64_t *removed_p, uint32_t *n_removed_p, uint32_t cap)
{
    delta_set_copy(&cache->added, added_p, n_added_p, cap);
    delta_set_copy(&cache->removed, removed_p, n_removed_p, cap);
    if (cache->deltas_overflowed || cache->added.n > cap || cache->removed.n > cap)
        return true; /* kept until kvf_prefix_cache_list */
    delta_set_clear(&cache->added);
    delta_set_clear(&cache->removed);
    return false;
}

uint32_t kvf_prefix_cache_list(kvf_prefix_cache_t *cache, uint64_t *hashes_p, uint32_t cap)
{
    uint32_t n = 0;
    for (const pc_entry_t *e = cache->mru; e; e = e->next, n++)
        if (n < cap)
            hashes_p[n] = e->hash;
    delta_set_clear(&cache->added);
    delta_set_clear(&cache->removed);
    cache->deltas_overflowed = false;
    return n;
}

void kvf_prefix_cache_stats(const kvf_prefix_cache_t *cache, kvf_prefix_cache_stats_t *stats_p)
{
    *stats_p = cache->stats;
    stats_p->cached = cache->n_cached;
    stats_p->evictable = count_evictable(cache);
}

void kvf_prefix_cache_set_evict_hook(kvf_prefix_cache_t *cache, kvf_prefix_evict_fn fn, void *arg)
{
    cache->on_evict = fn;
    cache->evict_arg = arg;
}

void kvf_prefix_cache_test_hash_mask(kvf_prefix_cache_t *cache, uint64_t mask)
{
    cache->mask = mask;
}
