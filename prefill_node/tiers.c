/* kvf-prefill's KV tiers (kvf/kv_tier.h, docs/kv-tiers.md): the cached
 * prefix blocks the pool evicts go to host RAM and on to disk instead of
 * being lost, and a prompt whose next blocks a tier holds has them copied
 * back into its own pool blocks before it is computed: the request waits
 * for its blocks, the loop never does. Each copy holds a pool reference on
 * its destination block until it is reported, so a request that ends
 * meanwhile never has a block freed under a copy. A block that fails its
 * checks is computed again, and so is every block after it. */
#include "prefill_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvf/log.h"

/* One copy from a tier in flight: its destination and its request. */
struct pf_fetch {
    uint64_t req_id, epoch;
    uint32_t block; /* pool block (referenced by the copy) */
    uint32_t index; /* its position among the prompt's blocks */
    bool used;
};

static void *block_ptr(kvf_prefill_t *p, uint32_t block)
{
    return (uint8_t *)kvf_kvpool_base(p->rt.pool) + (size_t)block * p->tier_block_bytes;
}

/* The prefix cache evicts block: its bytes go to the tiers (the host copy:
 * a device pool's is its mirror, which the transport ships from). */
static void on_evict(void *arg, uint64_t hash, const uint32_t *tokens, uint32_t block)
{
    kvf_prefill_t *p = arg;
    kvf_status_t st = kvf_kv_tiers_put(p->tiers, hash, tokens, block_ptr(p, block));
    if (st != KVF_OK)
        kvf_log_debug("kv tiers: an evicted block is not kept: %s", kvf_status_str(st));
}

static kvf_status_t fetch_slot(kvf_prefill_t *p, uint32_t *slot_p)
{
    for (uint32_t i = 0; i < p->n_fetches; i++)
        if (!p->fetches[i].used) {
            *slot_p = i;
            return KVF_OK;
        }
    uint32_t cap = p->n_fetches ? 2 * p->n_fetches : 64;
    struct pf_fetch *grown = realloc(p->fetches, (size_t)cap * sizeof(*grown));
    if (!grown)
        return KVF_ERR_NOMEM;
    memset(grown + p->n_fetches, 0, (size_t)(cap - p->n_fetches) * sizeof(*grown));
    *slot_p = p->n_fetches;
    p->fetches = grown;
    p->n_fetches = cap;
    return KVF_OK;
}

uint32_t pf_tiers_promote(kvf_prefill_t *p, pf_req_t *r, uint32_t from, uint32_t most)
{
    if (!p->tiers)
        return from;
    const uint32_t bs = (uint32_t)p->geo.block_size;
    uint32_t i = from;
    for (; i < most; i++) {
        const uint32_t *tokens = r->pr->token_ids + (size_t)i * bs;
        if (kvf_kv_tiers_lookup(p->tiers, r->hashes[i], tokens) == 0)
            break;
        uint32_t slot, block = r->local.blocks[i];
        if (fetch_slot(p, &slot) != KVF_OK || kvf_kvpool_ref(p->rt.pool, block) != KVF_OK)
            break;
        if (kvf_kv_tiers_fetch(p->tiers, r->hashes[i], tokens, block_ptr(p, block), slot) !=
            KVF_OK) {
            (void)kvf_kvpool_release(p->rt.pool, &block, 1);
            break; /* every read buffer busy: the rest is computed */
        }
        p->fetches[slot] = (struct pf_fetch){r->req_id, r->epoch, block, i, true};
        r->tier_pending++;
    }
    return i;
}

/* r's copies all came back: it computes from the first block that failed
 * (a device pool's copy of the good ones is brought up to date). */
static void settle(kvf_prefill_t *p, pf_req_t *r)
{
    uint32_t from = r->cached_blocks, good = r->tier_good;
    if (good > from &&
        kvf_kvpool_upload(p->rt.pool, r->local.blocks + from, good - from) != KVF_OK)
        good = from;
    p->count.tier_hit_tokens += (uint64_t)(good - from) * (uint32_t)p->geo.block_size;
    pf_req_set_cached(p, r, good);
}

/* Copies reported: each drops its reference; a request whose copies all
 * came back is ready to compute. */
static void on_tiers_ready(int fd, void *arg)
{
    (void)fd;
    kvf_prefill_t *p = arg;
    kvf_kv_fetch_done_t done[32];
    size_t n;
    while ((n = kvf_kv_tiers_poll(p->tiers, done, 32)) > 0) {
        for (size_t k = 0; k < n; k++) {
            struct pf_fetch *f = &p->fetches[done[k].tag];
            pf_req_t *r = pf_req_find(p, f->req_id, f->epoch);
            if (r && r->tier_pending) {
                if (done[k].status != KVF_OK && f->index < r->tier_good) {
                    r->tier_good = f->index;
                    kvf_log_info("request %llu: a block from KV tier %d failed its checks (%s): "
                                 "computed again",
                                 (unsigned long long)r->req_id, done[k].tier,
                                 kvf_status_str(done[k].status));
                }
                if (--r->tier_pending == 0)
                    settle(p, r);
            }
            (void)kvf_kvpool_release(p->rt.pool, &f->block, 1);
            f->used = false;
        }
    }
}

kvf_status_t pf_tiers_create(kvf_prefill_t *p, const kvf_prefill_config_t *cfg)
{
    if (!cfg->kv_host_mem && !cfg->kv_disk_dir)
        return KVF_OK;
    if (!p->pc.cache) {
        kvf_log_warn("kv tiers: off (they keep prefix-cache blocks; the cache is off)");
        return KVF_OK;
    }
    p->tier_block_bytes = kvf_kv_block_bytes(&p->geo);
    kvf_kv_tiers_config_t tc = {
        .host_bytes = cfg->kv_host_mem,
        .disk_dir = cfg->kv_disk_dir,
        .disk_bytes = cfg->kv_disk_size,
        .block_bytes = p->tier_block_bytes,
        .block_tokens = (uint32_t)p->geo.block_size,
    };
    char why[256] = "";
    kvf_status_t st = kvf_kv_tiers_create(&tc, &p->tiers, why, sizeof(why));
    if (st != KVF_OK && tc.disk_dir && tc.host_bytes) {
        kvf_log_warn("kv tiers: no disk tier in %s (%s): host RAM only", tc.disk_dir, why);
        tc.disk_dir = NULL;
        tc.disk_bytes = 0;
        st = kvf_kv_tiers_create(&tc, &p->tiers, why, sizeof(why));
    }
    if (st != KVF_OK) {
        kvf_log_error("kv tiers: %s", why);
        return st;
    }
    st = kvf_evloop_add_fd(p->loop, kvf_kv_tiers_fd(p->tiers), on_tiers_ready, p);
    if (st != KVF_OK) {
        pf_tiers_destroy(p);
        return st;
    }
    p->pc.on_evict = on_evict;
    p->pc.evict_arg = p;
    kvf_prefix_cache_set_evict_hook(p->pc.cache, on_evict, p);
    kvf_kv_tiers_stats_t s;
    kvf_kv_tiers_stats(p->tiers, &s);
    kvf_log_info("kv tiers: host RAM %u blocks, disk %u blocks%s", s.cap_ram, s.cap_disk,
                 s.cap_disk && !kvf_kv_tiers_direct_io(p->tiers) ? " (buffered I/O)" : "");
    return KVF_OK;
}

void pf_tiers_destroy(kvf_prefill_t *p)
{
    if (!p->tiers)
        return;
    kvf_kv_tiers_destroy(p->tiers); /* copies not reported never are */
    p->tiers = NULL;
    for (uint32_t i = 0; i < p->n_fetches; i++)
        if (p->fetches[i].used)
            (void)kvf_kvpool_release(p->rt.pool, &p->fetches[i].block, 1);
    free(p->fetches);
    p->fetches = NULL;
    p->n_fetches = 0;
}

void pf_tiers_describe(const kvf_prefill_t *p, char *buf, size_t len)
{
    if (!p->tiers) {
        snprintf(buf, len, "kv tiers off");
        return;
    }
    kvf_kv_tiers_stats_t s;
    kvf_kv_tiers_stats(p->tiers, &s);
    snprintf(buf, len,
             "kv tiers: %u ram + %u disk blocks, %llu ram + %llu disk hits, %llu prompt tokens "
             "from them, %llu corrupt dropped",
             s.blocks_ram, s.blocks_disk, (unsigned long long)s.hits_ram,
             (unsigned long long)s.hits_disk, (unsigned long long)p->count.tier_hit_tokens,
             (unsigned long long)s.corrupt);
}
