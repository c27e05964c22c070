/* A test's view of a node's prefix-cache reports (PrefixUpdate, as the
 * router's index takes them: common/node_prefix.c, router/prefix_index.c),
 * for the rigs that stand in for the router. Header-only: the rigs of
 * both node kinds include it. */
#ifndef KVF_TEST_PREFIX_VIEW_H
#define KVF_TEST_PREFIX_VIEW_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvf/msg.h"
#include "kvf/prefix_cache.h"

#define PREFIX_VIEW_MAX 4096

typedef struct {
    uint64_t hashes[PREFIX_VIEW_MAX];
    uint32_t n;
    /* the KV tiers' part (tier_ram, tier_disk, tier_gone): hash and tier */
    uint64_t tier_hashes[PREFIX_VIEW_MAX];
    uint8_t tier_of[PREFIX_VIEW_MAX];
    uint32_t n_tier;
    uint64_t seq;       /* the last update applied */
    uint32_t updates, full;
} prefix_view_t;

static inline void prefix_view_remove(prefix_view_t *v, uint64_t h)
{
    for (uint32_t i = 0; i < v->n; i++)
        if (v->hashes[i] == h) {
            v->hashes[i] = v->hashes[--v->n];
            return;
        }
    fail_msg("prefix update removes %016llx, which was never listed", (unsigned long long)h);
}

static inline void prefix_view_add(prefix_view_t *v, uint64_t h)
{
    for (uint32_t i = 0; i < v->n; i++)
        if (v->hashes[i] == h)
            fail_msg("prefix update adds %016llx twice", (unsigned long long)h);
    assert_true(v->n < PREFIX_VIEW_MAX);
    v->hashes[v->n++] = h;
}

/* Where the reports say h is below the pool: 1 RAM, 2 disk, 0 neither. */
static inline int prefix_view_tier(const prefix_view_t *v, uint64_t h)
{
    for (uint32_t i = 0; i < v->n_tier; i++)
        if (v->tier_hashes[i] == h)
            return v->tier_of[i];
    return 0;
}

/* h is in tier now (0: in neither; a hash gone that was never listed is
 * fine: it came and went between two reports). */
static inline void prefix_view_tier_set(prefix_view_t *v, uint64_t h, int tier)
{
    for (uint32_t i = 0; i < v->n_tier; i++)
        if (v->tier_hashes[i] == h) {
            if (tier) {
                v->tier_of[i] = (uint8_t)tier;
                return;
            }
            v->n_tier--;
            v->tier_hashes[i] = v->tier_hashes[v->n_tier];
            v->tier_of[i] = v->tier_of[v->n_tier];
            return;
        }
    if (!tier)
        return;
    assert_true(v->n_tier < PREFIX_VIEW_MAX);
    v->tier_hashes[v->n_tier] = h;
    v->tier_of[v->n_tier++] = (uint8_t)tier;
}

/* Applies u, checking it as the router would: under the key the rig
 * handed out (key, 16 bytes), numbered one after the last, a delta that
 * adds only what is not listed and removes only what is. */
static inline void prefix_view_apply(prefix_view_t *v, const Kvf__PrefixUpdate *u,
                                     const uint8_t *key)
{
    uint64_t k[2];
    memcpy(k, key, sizeof(k));
    kvf_block_hash_key_t hk = {k[0], k[1]};
    assert_true(u->key_id == kvf_block_hash_key_id(&hk));
    assert_true(u->seq == v->seq + 1);
    v->seq = u->seq;
    v->updates++;
    if (u->full) {
        v->full++;
        v->n = 0;
        v->n_tier = 0;
        assert_int_equal(u->n_tier_gone, 0);
    }
    for (size_t i = 0; i < u->n_removed; i++)
        prefix_view_remove(v, u->removed[i]);
    for (size_t i = 0; i < u->n_added; i++)
        prefix_view_add(v, u->added[i]);
    for (size_t i = 0; i < u->n_tier_ram; i++)
        prefix_view_tier_set(v, u->tier_ram[i], 1);
    for (size_t i = 0; i < u->n_tier_disk; i++)
        prefix_view_tier_set(v, u->tier_disk[i], 2);
    for (size_t i = 0; i < u->n_tier_gone; i++)
        prefix_view_tier_set(v, u->tier_gone[i], 0);
}

#endif
