/* A node's prefix cache under the cluster's key, and its reports to the
 * router. See kvf/node_prefix.h. */
#include "kvf/node_prefix.h"

#include <stdlib.h>
#include <string.h>

#include "kvf/log.h"

kvf_status_t kvf_node_prefix_init(kvf_node_prefix_t *np, kvf_kvpool_t *pool,
                                  const char *model_fingerprint, bool enabled)
{
    memset(np, 0, sizeof(*np));
    np->pool = pool;
    const kvf_kv_geometry_t *g = kvf_kvpool_geometry(pool);
    np->kv_dtype = (int)g->dtype;
    np->block_size = (uint32_t)g->block_size;
    np->model_fp = strtoull(model_fingerprint, NULL, 16);
    np->want_full = true;
    if (!enabled)
        return KVF_OK;
    np->added = malloc(KVF_NODE_PREFIX_REPORT_MAX * sizeof(uint64_t));
    np->removed = malloc(KVF_NODE_PREFIX_DELTA_MAX * sizeof(uint64_t));
    kvf_status_t st = np->added && np->removed ? kvf_prefix_cache_create(pool, 0, &np->cache)
                                               : KVF_ERR_NOMEM;
    if (st != KVF_OK) {
        kvf_log_error("prefix cache: %s", kvf_status_str(st));
        kvf_node_prefix_fini(np);
    }
    return st;
}

static void tiers_scratch_free(kvf_node_prefix_t *np)
{
    free(np->tier_ram);
    free(np->tier_disk);
    free(np->tier_gone);
    np->tier_ram = np->tier_disk = np->tier_gone = NULL;
}

kvf_status_t kvf_node_prefix_attach_tiers(kvf_node_prefix_t *np, kvf_kv_tiers_t *tiers)
{
    np->tiers = NULL;
    np->want_full = true; /* the router's view of the tiers starts over */
    if (!tiers) {
        tiers_scratch_free(np);
        return KVF_OK;
    }
    if (!np->tier_ram) {
        np->tier_ram = malloc(KVF_NODE_PREFIX_REPORT_MAX * sizeof(uint64_t));
        np->tier_disk = malloc(KVF_NODE_PREFIX_REPORT_MAX * sizeof(uint64_t));
        np->tier_gone = malloc(KVF_NODE_PREFIX_DELTA_MAX * sizeof(uint64_t));
    }
    if (!np->tier_ram || !np->tier_disk || !np->tier_gone) {
        tiers_scratch_free(np);
        return KVF_ERR_NOMEM;
    }
    np->tiers = tiers;
    return KVF_OK;
}

void kvf_node_prefix_fini(kvf_node_prefix_t *np)
{
    kvf_prefix_cache_destroy(np->cache);
    free(np->added);
    free(np->removed);
    tiers_scratch_free(np);
    np->cache = NULL;
    np->tiers = NULL;
    np->added = np->removed = NULL;
}

bool kvf_node_prefix_sync(kvf_node_prefix_t *np)
{
    uint64_t k[2];
    uint32_t gen = np->cache && np->node ? kvf_node_prefix_key(np->node, k) : 0;
    if (gen == 0)
        return false;
    if (gen == np->key_gen)
        return true;
    if (np->key_gen) {
        kvf_prefix_cache_t *fresh = NULL;
        if (kvf_prefix_cache_create(np->pool, 0, &fresh) != KVF_OK)
            return false;
        kvf_prefix_cache_destroy(np->cache);
        np->cache = fresh;
        kvf_prefix_cache_set_evict_hook(fresh, np->on_evict, np->evict_arg);
        kvf_log_info("prefix cache: the cluster's hash key changed; starting afresh");
    }
    np->key = (kvf_block_hash_key_t){k[0], k[1]};
    np->key_id = kvf_block_hash_key_id(&np->key);
    np->root = kvf_block_hash_root(&np->key, np->model_fp, np->kv_dtype, np->block_size, NULL, 0);
    np->key_gen = gen;
    np->want_full = true; /* the router knows nothing under this key */
    return true;
}

uint64_t kvf_node_prefix_root(const kvf_node_prefix_t *np, const void *salt, size_t salt_len)
{
    if (!salt_len)
        return np->root;
    return kvf_block_hash_root(&np->key, np->model_fp, np->kv_dtype, np->block_size, salt,
                               salt_len);
}

uint32_t kvf_node_prefix_available(const kvf_node_prefix_t *np)
{
    return np->cache ? kvf_prefix_cache_available(np->cache) : kvf_kvpool_free_blocks(np->pool);
}

/* The tiers' part of u: their changes (false when they were lost: the
 * report must be a full one), or with u->full their whole listing. */
static bool report_tiers(kvf_node_prefix_t *np, Kvf__PrefixUpdate *u)
{
    if (!np->tiers)
        return true;
    u->tier_ram = np->tier_ram;
    u->tier_disk = np->tier_disk;
    u->tier_gone = np->tier_gone;
    if (u->full) {
        uint32_t n_ram, n_disk;
        uint32_t total = kvf_kv_tiers_list(np->tiers, np->tier_ram, &n_ram, np->tier_disk,
                                           &n_disk, KVF_NODE_PREFIX_REPORT_MAX);
        u->n_tier_ram = n_ram;
        u->n_tier_disk = n_disk;
        u->truncated = u->truncated || total > n_ram + n_disk;
        return true;
    }
    kvf_kv_tier_changes_t ch = {.ram = np->tier_ram, .disk = np->tier_disk, .gone = np->tier_gone};
    if (kvf_kv_tiers_changes(np->tiers, &ch, KVF_NODE_PREFIX_DELTA_MAX))
        return false;
    u->n_tier_ram = ch.n_ram;
    u->n_tier_disk = ch.n_disk;
    u->n_tier_gone = ch.n_gone;
    return true;
}

void kvf_node_prefix_report(kvf_node_prefix_t *np, int timeout_ms)
{
    if (!np->cache || !np->node || !kvf_node_registered(np->node) || !kvf_node_prefix_sync(np))
        return;
    Kvf__PrefixUpdate u = KVF__PREFIX_UPDATE__INIT;
    uint32_t n_added = 0, n_removed = 0;
    if (!np->want_full &&
        kvf_prefix_cache_take_deltas(np->cache, np->added, &n_added, np->removed, &n_removed,
                                     KVF_NODE_PREFIX_DELTA_MAX))
        np->want_full = true;
    if (!np->want_full && !report_tiers(np, &u))
        np->want_full = true;
    if (np->want_full) {
        uint32_t total = kvf_prefix_cache_list(np->cache, np->added, KVF_NODE_PREFIX_REPORT_MAX);
        n_added = total < KVF_NODE_PREFIX_REPORT_MAX ? total : KVF_NODE_PREFIX_REPORT_MAX;
        n_removed = 0;
        u.full = true;
        u.truncated = total > n_added;
        (void)report_tiers(np, &u);
    } else if (n_added == 0 && n_removed == 0 && u.n_tier_ram + u.n_tier_disk + u.n_tier_gone == 0) {
        return;
    }
    u.node_id = (char *)kvf_node_id(np->node);
    u.seq = ++np->seq;
    u.key_id = np->key_id;
    u.added = np->added;
    u.n_added = n_added;
    u.removed = np->removed;
    u.n_removed = n_removed;
    kvf_envelope_t env;
    kvf_envelope_init(&env, u.node_id);
    env.body_case = KVF__ENVELOPE__BODY_PREFIX_UPDATE;
    env.prefix_update = &u;
    /* What did not go out is gone from the deltas: the next report lists
     * everything (the router, seeing the gap in seq, would ask anyway). */
    if (kvf_node_send_router(np->node, &env, timeout_ms) != KVF_OK) {
        np->want_full = true;
        return;
    }
    np->want_full = false;
    np->reports_sent++;
    np->full_reports_sent += u.full;
}

bool kvf_node_prefix_handle(kvf_node_prefix_t *np, const kvf_envelope_t *env)
{
    if (env->body_case != KVF__ENVELOPE__BODY_PREFIX_RESYNC)
        return false;
    kvf_log_debug("prefix cache: the router asks for a full listing (it applied update %llu)",
                  (unsigned long long)env->prefix_resync->seq_seen);
    np->want_full = true;
    return true;
}
