/* Prefix cache tests over a real KV pool: match/insert reference counts,
 * eviction that never frees a block in use, LRU order, forced hash
 * collisions, report deltas, max_blocks, destroy, and a randomized run
 * checked against a recount after every operation. The hashes themselves:
 * test_block_hash.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kvf/kvcache.h"
#include "kvf/log.h"
#include "kvf/prefix_cache.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BS 4 /* tokens per block in these tests */

static const kvf_block_hash_key_t test_key = {0x1234567890abcdefull, 0xfedcba0987654321ull};

static kvf_kvpool_t *make_pool(uint32_t n_blocks)
{
    kvf_kv_geometry_t g = {
        .n_layers = 1, .n_kv_heads = 1, .head_dim = 4, .block_size = BS, .dtype = KVF_KV_F32};
    kvf_kvpool_t *p;
    assert_int_equal(kvf_kvpool_create(&g, n_blocks, &p), KVF_OK);
    return p;
}

static kvf_prefix_cache_t *make_cache(kvf_kvpool_t *p, uint32_t max_blocks)
{
    kvf_prefix_cache_t *c;
    assert_int_equal(kvf_prefix_cache_create(p, max_blocks, &c), KVF_OK);
    return c;
}

static kvf_prefix_cache_stats_t stats_of(const kvf_prefix_cache_t *c)
{
    kvf_prefix_cache_stats_t s;
    kvf_prefix_cache_stats(c, &s);
    return s;
}

/* Tokens for n blocks, a function of seed. */
static void fill_tokens(uint32_t *tokens, uint32_t n_blocks, uint32_t seed)
{
    for (uint32_t i = 0; i < n_blocks * BS; i++)
        tokens[i] = seed * 1000u + i;
}

static uint64_t root_of(uint32_t salt)
{
    return kvf_block_hash_root(&test_key, 0xabcdefull, KVF_KV_F32, BS, &salt, sizeof(salt));
}

/* Allocates n blocks for a sequence of tokens, hashes them and lists them;
 * the caller keeps its references (ids_p). */
static void insert_seq(kvf_prefix_cache_t *c, kvf_kvpool_t *p, const uint32_t *tokens, uint32_t n,
                       uint64_t *hashes_p, uint32_t *ids_p)
{
    assert_int_equal(kvf_block_hash_chain(&test_key, root_of(0), tokens, n * BS, BS, hashes_p), n);
    assert_int_equal(kvf_kvpool_alloc(p, n, ids_p), KVF_OK);
    assert_int_equal(kvf_prefix_cache_insert(c, hashes_p, tokens, ids_p, n), KVF_OK);
}

/* ---- the cache ------------------------------------------------------ */

static void test_match_insert_refcounts(void **state)
{
    (void)state;
    kvf_kvpool_t *p = make_pool(16);
    kvf_prefix_cache_t *c = make_cache(p, 0);
    uint32_t tokens[3 * BS], ids[3], got[3];
    uint64_t h[3];
    fill_tokens(tokens, 3, 1);
    insert_seq(c, p, tokens, 3, h, ids);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(kvf_kvpool_refcount(p, ids[i]), 2); /* the sequence's + the cache's */
        assert_true(kvf_prefix_cache_contains(c, h[i]));
    }
    assert_int_equal(stats_of(c).cached, 3);
    assert_int_equal(stats_of(c).evictable, 0);
    assert_int_equal(kvf_kvpool_release(p, ids, 3), KVF_OK);
    assert_int_equal(stats_of(c).evictable, 3);
    assert_int_equal(kvf_prefix_cache_available(c), 16);

    /* A second sequence sharing two blocks, then diverging. */
    uint32_t tokens2[3 * BS];
    memcpy(tokens2, tokens, sizeof(tokens2));
    tokens2[2 * BS + 1] = 99;
    uint64_t h2[3];
    kvf_block_hash_chain(&test_key, root_of(0), tokens2, 3 * BS, BS, h2);
    assert_int_equal(kvf_prefix_cache_match(c, h2, tokens2, 3, got), 2);
    assert_int_equal(got[0], ids[0]);
    assert_int_equal(got[1], ids[1]);
    assert_int_equal(kvf_kvpool_refcount(p, ids[0]), 2);
    assert_int_equal(kvf_kvpool_refcount(p, ids[2]), 1);
    assert_int_equal(stats_of(c).evictable, 1);
    assert_int_equal(kvf_prefix_cache_available(c), 14);

    /* Listing the whole sequence: blocks 0 and 1 are listed already (the
     * cache keeps its own, takes no reference on the new ones), block 2
     * is new. */
    uint32_t ids2[3] = {got[0], got[1], 0};
    uint32_t fresh[2];
    assert_int_equal(kvf_kvpool_alloc(p, 2, fresh), KVF_OK);
    ids2[2] = fresh[0];
    assert_int_equal(kvf_prefix_cache_insert(c, h, tokens, fresh, 1), KVF_OK);
    assert_int_equal(kvf_kvpool_refcount(p, fresh[0]), 1); /* h[0] was listed: not taken */
    assert_int_equal(kvf_prefix_cache_insert(c, h2, tokens2, ids2, 3), KVF_OK);
    assert_int_equal(kvf_kvpool_refcount(p, fresh[0]), 2);
    assert_int_equal(kvf_kvpool_refcount(p, ids[0]), 2);
    assert_int_equal(stats_of(c).cached, 4);
    assert_int_equal(stats_of(c).inserted, 4);

    kvf_prefix_cache_stats_t s = stats_of(c);
    assert_int_equal(s.lookups, 1);
    assert_int_equal(s.query_blocks, 3);
    assert_int_equal(s.hit_blocks, 2);
    assert_int_equal(kvf_kvpool_release(p, got, 2), KVF_OK);
    assert_int_equal(kvf_kvpool_release(p, fresh, 2), KVF_OK);
    assert_int_equal(stats_of(c).evictable, 4);
    assert_int_equal(kvf_kvpool_used_blocks(p), 4);
    kvf_prefix_cache_destroy(c);
    assert_int_equal(kvf_kvpool_used_blocks(p), 0);
    kvf_kvpool_destroy(p);
}

/* A full pool, some cached blocks still held: allocation evicts only the
 * ones nobody holds, and held blocks keep their ids, counts and data. */
static void test_eviction_spares_in_use(void **state)
{
    (void)state;
    kvf_kvpool_t *p = make_pool(8);
    kvf_prefix_cache_t *c = make_cache(p, 0);
    uint32_t tokens[8 * BS], ids[8];
    uint64_t h[8];
    fill_tokens(tokens, 8, 2);
    insert_seq(c, p, tokens, 8, h, ids);
    assert_int_equal(kvf_kvpool_free_blocks(p), 0);
    /* Hold 1, 4 and 6; release the rest. */
    uint32_t held[3] = {ids[1], ids[4], ids[6]};
    for (int i = 0; i < 3; i++)
        *(float *)kvf_kvpool_head_data(p, held[i], 0, 0, 0) = 100.0f + (float)i;
    for (int i = 0; i < 8; i++)
        if (i != 1 && i != 4 && i != 6)
            assert_int_equal(kvf_kvpool_release(p, &ids[i], 1), KVF_OK);
    assert_int_equal(kvf_prefix_cache_available(c), 5);

    uint32_t fresh[6];
    assert_int_equal(kvf_prefix_cache_alloc(c, 6, fresh), KVF_ERR_NO_SPACE);
    assert_int_equal(stats_of(c).cached, 8); /* nothing evicted for a failing allocation */
    assert_int_equal(kvf_prefix_cache_alloc(c, 4, fresh), KVF_OK);
    assert_int_equal(stats_of(c).evicted, 4);
    assert_int_equal(stats_of(c).cached, 4);
    for (int i = 0; i < 4; i++) {
        for (int j = 0; j < 3; j++)
            assert_int_not_equal(fresh[i], held[j]);
        assert_int_equal(kvf_kvpool_refcount(p, fresh[i]), 1);
    }
    for (int j = 0; j < 3; j++) {
        assert_int_equal(kvf_kvpool_refcount(p, held[j]), 2);
        assert_true(*(float *)kvf_kvpool_head_data(p, held[j], 0, 0, 0) == 100.0f + (float)j);
    }
    assert_true(kvf_prefix_cache_contains(c, h[1]) && kvf_prefix_cache_contains(c, h[4]) &&
                kvf_prefix_cache_contains(c, h[6]));
    assert_int_equal(stats_of(c).evictable, 1);
    assert_int_equal(kvf_prefix_cache_evict(c, 8), 1);
    assert_int_equal(kvf_prefix_cache_evict(c, 8), 0);
    assert_int_equal(stats_of(c).cached, 3);
    assert_int_equal(kvf_kvpool_free_blocks(p), 1); /* the one just evicted */
    assert_int_equal(kvf_prefix_cache_alloc(c, 2, fresh + 4), KVF_ERR_NO_SPACE);
    assert_int_equal(stats_of(c).cached, 3);
    assert_int_equal(kvf_kvpool_release(p, held, 3), KVF_OK);
    assert_int_equal(kvf_prefix_cache_alloc(c, 2, fresh + 4), KVF_OK);
    assert_int_equal(kvf_kvpool_release(p, fresh, 6), KVF_OK);
    kvf_prefix_cache_destroy(c);
    assert_int_equal(kvf_kvpool_used_blocks(p), 0);
    kvf_kvpool_destroy(p);
}

/* What the eviction hook saw. */
typedef struct {
    uint64_t hashes[8];
    uint32_t tokens0[8], blocks[8];
    float data[8];
    kvf_kvpool_t *pool;
    int n;
} evicted_t;

static void on_evict(void *arg, uint64_t hash, const uint32_t *tokens, uint32_t block)
{
    evicted_t *ev = arg;
    assert_true(ev->n < 8);
    assert_int_equal(kvf_kvpool_refcount(ev->pool, block), 1); /* still whole during the call */
    ev->hashes[ev->n] = hash;
    ev->tokens0[ev->n] = tokens[0];
    ev->blocks[ev->n] = block;
    ev->data[ev->n] = *(float *)kvf_kvpool_head_data(ev->pool, block, 0, 0, 0);
    ev->n++;
}

/* The eviction hook sees each block eviction frees, with its hash, tokens
 * and data, before the block goes; never a block in use, nor the blocks
 * destroy drops. */
static void test_evict_hook(void **state)
{
    (void)state;
    kvf_kvpool_t *p = make_pool(4);
    kvf_prefix_cache_t *c = make_cache(p, 0);
    evicted_t ev = {.pool = p};
    kvf_prefix_cache_set_evict_hook(c, on_evict, &ev);
    uint32_t tokens[4 * BS], ids[4];
    uint64_t h[4];
    fill_tokens(tokens, 4, 3);
    insert_seq(c, p, tokens, 4, h, ids);
    for (int i = 0; i < 4; i++)
        *(float *)kvf_kvpool_head_data(p, ids[i], 0, 0, 0) = 7.0f + (float)i;
    assert_int_equal(kvf_kvpool_release(p, ids, 3), KVF_OK); /* block 3 stays in use */
    assert_int_equal(kvf_prefix_cache_evict(c, 4), 3);
    assert_int_equal(ev.n, 3);
    for (int i = 0; i < 3; i++) { /* a sequence's last blocks go first */
        int b = 2 - i;
        assert_true(ev.hashes[i] == h[b]);
        assert_int_equal(ev.tokens0[i], tokens[b * BS]);
        assert_int_equal(ev.blocks[i], ids[b]);
        assert_true(ev.data[i] == 7.0f + (float)b);
    }
    assert_int_equal(kvf_kvpool_release(p, &ids[3], 1), KVF_OK);
    kvf_prefix_cache_destroy(c); /* block 3 dropped: no call */
    assert_int_equal(ev.n, 3);
    assert_int_equal(kvf_kvpool_used_blocks(p), 0);
    kvf_kvpool_destroy(p);
}

/* Single-block sequences a, b, c, d listed in that order, then a and c
 * matched: eviction takes b, d, a, c. Within one sequence the last block
 * goes before the first. */
static void test_lru_order(void **state)
{
    (void)state;
    kvf_kvpool_t *p = make_pool(8);
    kvf_prefix_cache_t *c = make_cache(p, 0);
    uint32_t tokens[4][BS], ids[4], got;
    uint64_t h[4];
    for (uint32_t s = 0; s < 4; s++) {
        fill_tokens(tokens[s], 1, 10 + s);
        insert_seq(c, p, tokens[s], 1, &h[s], &ids[s]);
    }
    assert_int_equal(kvf_kvpool_release(p, ids, 4), KVF_OK);
    assert_int_equal(kvf_prefix_cache_match(c, &h[0], tokens[0], 1, &got), 1);
    assert_int_equal(kvf_prefix_cache_match(c, &h[2], tokens[2], 1, &got + 0), 1);
    uint32_t back[2] = {ids[0], ids[2]};
    assert_int_equal(kvf_kvpool_release(p, back, 2), KVF_OK);
    const int order[4] = {1, 3, 0, 2};
    for (int k = 0; k < 4; k++) {
        assert_int_equal(kvf_prefix_cache_evict(c, 1), 1);
        for (int j = 0; j < 4; j++)
            assert_int_equal(kvf_prefix_cache_contains(c, h[order[j]]), j > k);
    }

    /* A 3-block sequence: evicted from its end, the prefix stays matchable. */
    uint32_t seq[3 * BS], sids[3], m[3];
    uint64_t sh[3];
    fill_tokens(seq, 3, 20);
    insert_seq(c, p, seq, 3, sh, sids);
    assert_int_equal(kvf_kvpool_release(p, sids, 3), KVF_OK);
    assert_int_equal(kvf_prefix_cache_evict(c, 1), 1);
    assert_false(kvf_prefix_cache_contains(c, sh[2]));
    assert_int_equal(kvf_prefix_cache_match(c, sh, seq, 3, m), 2);
    assert_int_equal(kvf_kvpool_release(p, m, 2), KVF_OK);
    assert_int_equal(kvf_prefix_cache_evict(c, 1), 1);
    assert_false(kvf_prefix_cache_contains(c, sh[1]));
    assert_true(kvf_prefix_cache_contains(c, sh[0]));
    kvf_prefix_cache_destroy(c);
    kvf_kvpool_destroy(p);
}

/* With hashes masked to 4 bits, distinct blocks collide: a hit on the hash
 * with other tokens is a miss, never the other block. */
static void test_collisions(void **state)
{
    (void)state;
    kvf_kvpool_t *p = make_pool(64);
    kvf_prefix_cache_t *c = make_cache(p, 0);
    kvf_prefix_cache_test_hash_mask(c, 0xf);
    enum { N = 40 };
    uint32_t tokens[N][BS], ids[N];
    uint64_t h[N];
    uint32_t listed = 0;
    for (uint32_t s = 0; s < N; s++) {
        fill_tokens(tokens[s], 1, 100 + s);
        h[s] = kvf_block_hash_next(&test_key, root_of(0), tokens[s], BS);
        assert_int_equal(kvf_kvpool_alloc(p, 1, &ids[s]), KVF_OK);
        bool was = kvf_prefix_cache_contains(c, h[s]);
        assert_int_equal(kvf_prefix_cache_insert(c, &h[s], tokens[s], &ids[s], 1), KVF_OK);
        assert_int_equal(kvf_kvpool_refcount(p, ids[s]), was ? 1 : 2);
        listed += !was;
    }
    assert_true(listed <= 16);
    assert_int_equal(stats_of(c).cached, listed);
    uint64_t collisions = 0;
    for (uint32_t s = 0; s < N; s++) {
        uint32_t got = UINT32_MAX;
        uint32_t n = kvf_prefix_cache_match(c, &h[s], tokens[s], 1, &got);
        if (n == 1) {
            assert_int_equal(got, ids[s]); /* only ever its own block */
            assert_int_equal(kvf_kvpool_release(p, &got, 1), KVF_OK);
        } else {
            assert_int_equal(n, 0);
            collisions++; /* every hash is listed under the mask: a miss is a collision */
        }
    }
    assert_int_equal(collisions, N - listed);
    assert_int_equal(stats_of(c).collisions, collisions);
    assert_int_equal(stats_of(c).hit_blocks, listed);
    assert_int_equal(kvf_kvpool_release(p, ids, N), KVF_OK);
    kvf_prefix_cache_destroy(c);
    assert_int_equal(kvf_kvpool_used_blocks(p), 0);
    kvf_kvpool_destroy(p);
}

static bool has(const uint64_t *a, uint32_t n, uint64_t v)
{
    for (uint32_t i = 0; i < n; i++)
        if (a[i] == v)
            return true;
    return false;
}

static void test_deltas(void **state)
{
    (void)state;
    kvf_kvpool_t *p = make_pool(16);
    kvf_prefix_cache_t *c = make_cache(p, 0);
    uint64_t add[16], rem[16], h[4], hb[2];
    uint32_t n_add, n_rem, tokens[4 * BS], tb[2 * BS], ids[4], idb[2], m[2], again[2];
    fill_tokens(tokens, 4, 30);
    insert_seq(c, p, tokens, 4, h, ids); /* LRU list: h0 h1 h2 h3 */
    assert_false(kvf_prefix_cache_take_deltas(c, add, &n_add, rem, &n_rem, 16));
    assert_int_equal(n_add, 4);
    assert_int_equal(n_rem, 0);
    for (int i = 0; i < 4; i++)
        assert_true(has(add, n_add, h[i]));
    assert_false(kvf_prefix_cache_take_deltas(c, add, &n_add, rem, &n_rem, 16));
    assert_int_equal(n_add + n_rem, 0);

    /* h2, h3 evicted; b listed and evicted before the next report, so it
     * is in neither set. */
    assert_int_equal(kvf_kvpool_release(p, &ids[2], 2), KVF_OK);
    assert_int_equal(kvf_prefix_cache_evict(c, 2), 2);
    fill_tokens(tb, 2, 31);
    insert_seq(c, p, tb, 2, hb, idb);
    assert_int_equal(kvf_kvpool_release(p, idb, 2), KVF_OK);
    assert_int_equal(kvf_prefix_cache_evict(c, 2), 2); /* h0, h1 are still held */
    assert_false(kvf_prefix_cache_contains(c, hb[0]) || kvf_prefix_cache_contains(c, hb[1]));
    assert_false(kvf_prefix_cache_take_deltas(c, add, &n_add, rem, &n_rem, 16));
    assert_int_equal(n_add, 0);
    assert_int_equal(n_rem, 2);
    assert_true(has(rem, n_rem, h[2]) && has(rem, n_rem, h[3]));

    /* h2, h3 listed again (reported), then evicted and listed once more
     * before the next report: in neither set. */
    assert_int_equal(kvf_kvpool_alloc(p, 2, again), KVF_OK);
    assert_int_equal(kvf_prefix_cache_insert(c, &h[2], tokens + 2 * BS, again, 2), KVF_OK);
    assert_false(kvf_prefix_cache_take_deltas(c, add, &n_add, rem, &n_rem, 16));
    assert_int_equal(n_add, 2);
    assert_int_equal(n_rem, 0);
    assert_true(has(add, n_add, h[2]) && has(add, n_add, h[3]));
    assert_int_equal(kvf_kvpool_release(p, again, 2), KVF_OK);
    assert_int_equal(kvf_prefix_cache_evict(c, 2), 2);
    assert_false(kvf_prefix_cache_contains(c, h[2]) || kvf_prefix_cache_contains(c, h[3]));
    assert_int_equal(kvf_kvpool_alloc(p, 2, again), KVF_OK);
    assert_int_equal(kvf_prefix_cache_insert(c, &h[2], tokens + 2 * BS, again, 2), KVF_OK);
    assert_false(kvf_prefix_cache_take_deltas(c, add, &n_add, rem, &n_rem, 16));
    assert_int_equal(n_add + n_rem, 0);

    /* More changes than cap: true, and again, until a full list, which
     * clears them. Listed now: h0 h1 (the list's MRU end) and h2 h3. */
    memcpy(m, ids, sizeof(m));
    assert_int_equal(kvf_kvpool_release(p, m, 2), KVF_OK);
    assert_int_equal(kvf_kvpool_release(p, again, 2), KVF_OK);
    assert_int_equal(kvf_prefix_cache_evict(c, 3), 3);
    assert_int_equal(stats_of(c).cached, 1);
    assert_true(kvf_prefix_cache_take_deltas(c, add, &n_add, rem, &n_rem, 2));
    assert_int_equal(n_rem, 2);
    assert_true(kvf_prefix_cache_take_deltas(c, add, &n_add, rem, &n_rem, 2));
    uint64_t all[4];
    assert_int_equal(kvf_prefix_cache_list(c, all, 4), 1);
    assert_true(kvf_prefix_cache_contains(c, all[0]));
    assert_false(kvf_prefix_cache_take_deltas(c, add, &n_add, rem, &n_rem, 2));
    assert_int_equal(n_add + n_rem, 0);
    assert_int_equal(kvf_prefix_cache_list(c, all, 0), 1);
    kvf_prefix_cache_destroy(c);
    assert_int_equal(kvf_kvpool_used_blocks(p), 0);
    kvf_kvpool_destroy(p);
}

static void test_max_blocks(void **state)
{
    (void)state;
    kvf_log_set_level(KVF_LOG_OFF);
    kvf_kvpool_t *p = make_pool(16);
    kvf_prefix_cache_t *c = make_cache(p, 3);
    uint32_t tokens[5 * BS], ids[5];
    uint64_t h[5];
    fill_tokens(tokens, 5, 60);
    assert_int_equal(kvf_block_hash_chain(&test_key, root_of(0), tokens, 5 * BS, BS, h), 5);
    assert_int_equal(kvf_kvpool_alloc(p, 5, ids), KVF_OK);
    /* All held by the caller: the fourth cannot be listed. */
    assert_int_equal(kvf_prefix_cache_insert(c, h, tokens, ids, 5), KVF_ERR_NO_SPACE);
    assert_int_equal(stats_of(c).cached, 3);
    assert_false(kvf_prefix_cache_contains(c, h[3]));
    assert_int_equal(kvf_kvpool_refcount(p, ids[3]), 1);
    /* Released, the oldest makes room: 4 and 5 replace the sequence's end. */
    assert_int_equal(kvf_kvpool_release(p, ids, 3), KVF_OK);
    assert_int_equal(kvf_prefix_cache_insert(c, &h[3], tokens + 3 * BS, &ids[3], 2), KVF_OK);
    assert_int_equal(stats_of(c).cached, 3);
    assert_true(kvf_prefix_cache_contains(c, h[0]));
    assert_false(kvf_prefix_cache_contains(c, h[1]) || kvf_prefix_cache_contains(c, h[2]));
    assert_true(kvf_prefix_cache_contains(c, h[3]) && kvf_prefix_cache_contains(c, h[4]));
    assert_int_equal(kvf_kvpool_used_blocks(p), 3);
    assert_int_equal(kvf_kvpool_release(p, &ids[3], 2), KVF_OK);
    kvf_prefix_cache_destroy(c);
    assert_int_equal(kvf_kvpool_used_blocks(p), 0);
    kvf_kvpool_destroy(p);
    kvf_log_set_level(KVF_LOG_INFO);
}

static void test_destroy_in_use(void **state)
{
    (void)state;
    kvf_kvpool_t *p = make_pool(8);
    kvf_prefix_cache_t *c = make_cache(p, 0);
    uint32_t tokens[4 * BS], ids[4];
    uint64_t h[4];
    fill_tokens(tokens, 4, 70);
    insert_seq(c, p, tokens, 4, h, ids);
    assert_int_equal(kvf_kvpool_release(p, &ids[2], 2), KVF_OK);
    kvf_prefix_cache_destroy(c);
    assert_int_equal(kvf_kvpool_used_blocks(p), 2);
    assert_int_equal(kvf_kvpool_refcount(p, ids[0]), 1);
    assert_int_equal(kvf_kvpool_refcount(p, ids[1]), 1);
    assert_false(kvf_kvpool_is_allocated(p, ids[2]) || kvf_kvpool_is_allocated(p, ids[3]));
    assert_int_equal(kvf_kvpool_release(p, ids, 2), KVF_OK);
    assert_int_equal(kvf_kvpool_used_blocks(p), 0);
    kvf_prefix_cache_destroy(NULL);
    kvf_kvpool_destroy(p);
}

/* ---- randomized ----------------------------------------------------- */

/* The randomized run: sequences from a few prompt families (so prefixes
 * are shared), matched, allocated through the cache, held for a while,
 * listed and released, with evictions and reports in between. The test
 * keeps its own references and a receiver's view of the reports; after
 * every operation it checks each block's pool count against them. Each
 * block's tokens are also written into its K/V memory, so a match that
 * served another block's data would be seen. */
enum { R_POOL = 48, R_MAX_SEQ_BLOCKS = 5, R_ACTIVE = 6, R_VIEW = 256 };

typedef struct {
    uint32_t tokens[R_MAX_SEQ_BLOCKS * BS];
    uint64_t hashes[R_MAX_SEQ_BLOCKS];
    uint32_t ids[R_MAX_SEQ_BLOCKS];
    uint32_t n;
} r_seq_t;

typedef struct {
    kvf_kvpool_t *pool;
    kvf_prefix_cache_t *cache;
    uint32_t held[R_POOL]; /* the test's references per block */
    r_seq_t active[R_ACTIVE];
    uint32_t n_active;
    uint64_t view[R_VIEW]; /* what a receiver of the reports believes is listed */
    uint32_t n_view;
    uint64_t rng;
} r_state_t;

static uint32_t r_next(r_state_t *r, uint32_t below)
{
    r->rng = r->rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(r->rng >> 33) % below;
}

static void r_seq_make(r_state_t *r, r_seq_t *s)
{
    s->n = 1 + r_next(r, R_MAX_SEQ_BLOCKS);
    uint32_t family = r_next(r, 3), split = r_next(r, s->n + 1), variant = r_next(r, 3);
    for (uint32_t b = 0; b < s->n; b++)
        for (uint32_t j = 0; j < BS; j++)
            s->tokens[b * BS + j] = b < split ? family * 131 + b * 7 + j
                                              : 10000 + variant * 977 + family * 31 + b * 7 + j;
    uint64_t root = root_of(0);
    assert_int_equal(kvf_block_hash_chain(&test_key, root, s->tokens, s->n * BS, BS, s->hashes),
                     s->n);
}

/* A block's first BS K/V slots hold the tokens it was written for. */
static void r_write_block(r_state_t *r, uint32_t id, const uint32_t *tokens)
{
    memcpy(kvf_kvpool_head_data(r->pool, id, 0, 0, 0), tokens, BS * sizeof(*tokens));
}

static void r_check_block(r_state_t *r, uint32_t id, const uint32_t *tokens)
{
    assert_memory_equal(kvf_kvpool_head_data(r->pool, id, 0, 0, 0), tokens, BS * sizeof(*tokens));
}

static void r_release(r_state_t *r, const uint32_t *ids, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        assert_true(r->held[ids[i]] > 0);
        r->held[ids[i]]--;
    }
    assert_int_equal(kvf_kvpool_release(r->pool, ids, n), KVF_OK);
}

/* Match, then allocate the rest through the cache; the new sequence is
 * active (its blocks held) or dropped when the pool cannot hold it. */
static void r_op_start(r_state_t *r)
{
    if (r->n_active == R_ACTIVE)
        return;
    r_seq_t *s = &r->active[r->n_active];
    r_seq_make(r, s);
    uint32_t hit = kvf_prefix_cache_match(r->cache, s->hashes, s->tokens, s->n, s->ids);
    for (uint32_t b = 0; b < hit; b++) {
        r_check_block(r, s->ids[b], s->tokens + b * BS);
        r->held[s->ids[b]]++;
    }
    uint32_t want = s->n - hit;
    uint32_t avail = kvf_prefix_cache_available(r->cache);
    kvf_status_t st = kvf_prefix_cache_alloc(r->cache, want, s->ids + hit);
    assert_int_equal(st, want <= avail ? KVF_OK : KVF_ERR_NO_SPACE);
    if (st != KVF_OK) {
        r_release(r, s->ids, hit);
        return;
    }
    for (uint32_t b = hit; b < s->n; b++) {
        assert_int_equal(kvf_kvpool_refcount(r->pool, s->ids[b]), 1);
        assert_int_equal(r->held[s->ids[b]], 0);
        r->held[s->ids[b]]++;
        r_write_block(r, s->ids[b], s->tokens + b * BS);
    }
    r->n_active++;
}

/* A sequence ends: its complete blocks are listed, then released. */
static void r_op_finish(r_state_t *r)
{
    if (r->n_active == 0)
        return;
    uint32_t k = r_next(r, r->n_active);
    r_seq_t *s = &r->active[k];
    kvf_status_t st = kvf_prefix_cache_insert(r->cache, s->hashes, s->tokens, s->ids, s->n);
    assert_true(st == KVF_OK || st == KVF_ERR_NO_SPACE);
    r_release(r, s->ids, s->n);
    r->active[k] = r->active[--r->n_active];
}

static void r_op_report(r_state_t *r)
{
    uint64_t add[R_VIEW], rem[R_VIEW];
    uint32_t n_add, n_rem, cap = 1 + r_next(r, 12);
    if (kvf_prefix_cache_take_deltas(r->cache, add, &n_add, rem, &n_rem, cap)) {
        r->n_view = kvf_prefix_cache_list(r->cache, r->view, R_VIEW);
        assert_true(r->n_view <= R_VIEW);
        return;
    }
    for (uint32_t i = 0; i < n_rem; i++) {
        uint32_t j = 0;
        while (j < r->n_view && r->view[j] != rem[i])
            j++;
        assert_true(j < r->n_view); /* only what was reported listed is removed */
        r->view[j] = r->view[--r->n_view];
    }
    for (uint32_t i = 0; i < n_add; i++) {
        assert_false(has(r->view, r->n_view, add[i]));
        assert_true(r->n_view < R_VIEW);
        r->view[r->n_view++] = add[i];
    }
    /* Right after a report the receiver's view is the listing. */
    assert_int_equal(r->n_view, stats_of(r->cache).cached);
    for (uint32_t i = 0; i < r->n_view; i++)
        assert_true(kvf_prefix_cache_contains(r->cache, r->view[i]));
}

/* Every block's pool count is the test's references plus at most one
 * cache reference; those extras are the listed blocks, and the blocks
 * with only the cache's are the evictable ones. */
static void r_check(r_state_t *r)
{
    uint32_t cache_refs = 0, cache_only = 0, used = 0;
    for (uint32_t id = 0; id < R_POOL; id++) {
        uint32_t rc = kvf_kvpool_refcount(r->pool, id);
        assert_true(rc == r->held[id] || rc == r->held[id] + 1);
        cache_refs += rc - r->held[id];
        cache_only += rc == 1 && r->held[id] == 0;
        used += rc > 0;
    }
    kvf_prefix_cache_stats_t st = stats_of(r->cache);
    assert_int_equal(st.cached, cache_refs);
    assert_int_equal(st.evictable, cache_only);
    assert_int_equal(kvf_kvpool_used_blocks(r->pool), used);
    assert_int_equal(kvf_prefix_cache_available(r->cache),
                     kvf_kvpool_free_blocks(r->pool) + cache_only);
}

static void random_run(uint64_t seed, uint32_t max_blocks, uint64_t mask)
{
    r_state_t r;
    memset(&r, 0, sizeof(r));
    r.rng = seed;
    r.pool = make_pool(R_POOL);
    r.cache = make_cache(r.pool, max_blocks);
    kvf_prefix_cache_test_hash_mask(r.cache, mask);
    for (int op = 0; op < 4000; op++) {
        uint32_t what = r_next(&r, 10);
        if (what < 4)
            r_op_start(&r);
        else if (what < 8)
            r_op_finish(&r);
        else if (what < 9)
            kvf_prefix_cache_evict(r.cache, 1 + r_next(&r, 4));
        else
            r_op_report(&r);
        r_check(&r);
    }
    kvf_prefix_cache_stats_t st = stats_of(r.cache);
    assert_true(st.hit_blocks > 100 && st.evicted > 100); /* the run did share and evict */
    if (mask != ~0ull)
        assert_true(st.collisions > 0);
    while (r.n_active)
        r_op_finish(&r);
    kvf_prefix_cache_destroy(r.cache);
    assert_int_equal(kvf_kvpool_used_blocks(r.pool), 0);
    kvf_kvpool_destroy(r.pool);
}

static void test_random_ops(void **state)
{
    (void)state;
    kvf_log_set_level(KVF_LOG_OFF); /* NO_SPACE inserts are expected */
    random_run(1, 0, ~0ull);
    random_run(2, 20, ~0ull);
    random_run(3, 0, 0x1f); /* collisions: r_check_block sees a wrong block */
    kvf_log_set_level(KVF_LOG_INFO);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_match_insert_refcounts),
        cmocka_unit_test(test_eviction_spares_in_use),
        cmocka_unit_test(test_evict_hook),
        cmocka_unit_test(test_lru_order),
        cmocka_unit_test(test_collisions),
        cmocka_unit_test(test_deltas),
        cmocka_unit_test(test_max_blocks),
        cmocka_unit_test(test_destroy_in_use),
        cmocka_unit_test(test_random_ops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
