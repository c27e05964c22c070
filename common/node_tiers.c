/* A node's KV tiers wired to its pool, prefix cache and loop. See
 * kvf/node_tiers.h. */
#include "kvf/node_tiers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvf/log.h"

/* One copy from a tier in flight: its destination and its request. */
struct kvf_node_fetch {
    uint64_t req_id, epoch;
    uint32_t block; /* pool block (referenced by the copy) */
    uint32_t index; /* its position among the prompt's blocks */
    bool used;
};

static void *block_ptr(const kvf_node_tiers_t *nt, uint32_t block)
{
    return (uint8_t *)kvf_kvpool_base(nt->pool) + (size_t)block * nt->block_bytes;
}

/* The prefix cache evicts block: its bytes go to the tiers (the host copy:
 * what a node lists is whole there, docs/kv-tiers.md). */
static void on_evict(void *arg, uint64_t hash, const uint32_t *tokens, uint32_t block)
{
    kvf_node_tiers_t *nt = arg;
    kvf_status_t st = kvf_kv_tiers_put(nt->tiers, hash, tokens, block_ptr(nt, block));
    if (st != KVF_OK)
        kvf_log_debug("kv tiers: an evicted block is not kept: %s", kvf_status_str(st));
}

/* Copies reported: each drops its reference and tells the node. */
static void on_ready(int fd, void *arg)
{
    (void)fd;
    kvf_node_tiers_t *nt = arg;
    kvf_kv_fetch_done_t done[32];
    size_t n;
    while ((n = kvf_kv_tiers_poll(nt->tiers, done, 32)) > 0) {
        for (size_t k = 0; k < n; k++) {
            kvf_node_fetch_t *f = &nt->fetches[done[k].tag];
            f->used = false;
            (void)kvf_kvpool_release(nt->pool, &f->block, 1);
            nt->on_done(nt->arg, f->req_id, f->epoch, f->index, done[k].status, done[k].tier);
        }
    }
}

static kvf_status_t fetch_slot(kvf_node_tiers_t *nt, uint32_t *slot_p)
{
    for (uint32_t i = 0; i < nt->n_fetches; i++)
        if (!nt->fetches[i].used) {
            *slot_p = i;
            return KVF_OK;
        }
    uint32_t cap = nt->n_fetches ? 2 * nt->n_fetches : 64;
    kvf_node_fetch_t *grown = realloc(nt->fetches, (size_t)cap * sizeof(*grown));
    if (!grown)
        return KVF_ERR_NOMEM;
    memset(grown + nt->n_fetches, 0, (size_t)(cap - nt->n_fetches) * sizeof(*grown));
    *slot_p = nt->n_fetches;
    nt->fetches = grown;
    nt->n_fetches = cap;
    return KVF_OK;
}

uint32_t kvf_node_tiers_promote(kvf_node_tiers_t *nt, uint64_t req_id, uint64_t epoch,
                                const uint64_t *hashes, const uint32_t *tokens,
                                uint32_t block_size, const uint32_t *blocks, uint32_t from,
                                uint32_t most, uint32_t *pending_p)
{
    if (!nt->tiers)
        return from;
    uint32_t i = from;
    for (; i < most; i++) {
        const uint32_t *t = tokens + (size_t)i * block_size;
        if (kvf_kv_tiers_lookup(nt->tiers, hashes[i], t) == 0)
            break;
        uint32_t slot, block = blocks[i];
        if (fetch_slot(nt, &slot) != KVF_OK || kvf_kvpool_ref(nt->pool, block) != KVF_OK)
            break;
        if (kvf_kv_tiers_fetch(nt->tiers, hashes[i], t, block_ptr(nt, block), slot) != KVF_OK) {
            (void)kvf_kvpool_release(nt->pool, &block, 1);
            break; /* every read buffer busy: the rest is computed */
        }
        nt->fetches[slot] = (kvf_node_fetch_t){req_id, epoch, block, i, true};
        (*pending_p)++;
    }
    return i;
}

bool kvf_node_tiers_copied(kvf_node_tiers_t *nt, uint64_t req_id, uint32_t index,
                           kvf_status_t st, int tier, uint32_t *pending_p, uint32_t *good_p,
                           const uint32_t *blocks, uint32_t from, uint32_t block_size)
{
    if (st != KVF_OK && index < *good_p) {
        *good_p = index;
        kvf_log_info("request %llu: a block from KV tier %d failed its checks (%s): computed "
                     "again",
                     (unsigned long long)req_id, tier, kvf_status_str(st));
    }
    if (--*pending_p)
        return false;
    uint32_t n = *good_p - from;
    /* queued ahead of the request's forward, which reads them: the loop
     * does not wait for the copy (the request holds the blocks: their
     * host copies stay as they are) */
    if (n && blocks && kvf_kvpool_upload_queued(nt->pool, blocks + from, n) != KVF_OK)
        *good_p = from;
    else
        nt->hit_tokens += (uint64_t)n * block_size;
    return true;
}

const char *kvf_node_tiers_check(const kvf_node_tiers_config_t *cfg, bool no_prefix_cache)
{
    if (!cfg->disk_dir != !cfg->disk_bytes)
        return "--kv-disk DIR and --kv-disk-size BYTES go together";
    if ((cfg->disk_dir || cfg->host_bytes) && no_prefix_cache)
        return "the KV tiers keep prefix-cache blocks: --kv-host-mem and --kv-disk need the "
               "prefix cache";
    return NULL;
}

kvf_status_t kvf_node_tiers_init(kvf_node_tiers_t *nt, const kvf_node_tiers_config_t *cfg,
                                 kvf_node_prefix_t *pc, kvf_kvpool_t *pool, kvf_evloop_t *loop,
                                 kvf_node_tiers_done_fn on_done, void *arg)
{
    memset(nt, 0, sizeof(*nt));
    nt->pool = pool;
    nt->loop = loop;
    nt->on_done = on_done;
    nt->arg = arg;
    if (!cfg->host_bytes && !cfg->disk_dir)
        return KVF_OK;
    if (!pc->cache) {
        kvf_log_warn("kv tiers: off (they keep prefix-cache blocks; the cache is off)");
        return KVF_OK;
    }
    const kvf_kv_geometry_t *g = kvf_kvpool_geometry(pool);
    nt->block_bytes = kvf_kv_block_bytes(g);
    kvf_kv_tiers_config_t tc = {
        .host_bytes = cfg->host_bytes,
        .disk_dir = cfg->disk_dir,
        .disk_bytes = cfg->disk_bytes,
        .block_bytes = nt->block_bytes,
        .block_tokens = (uint32_t)g->block_size,
        .report_cap = KVF_NODE_PREFIX_DELTA_MAX,
        .host_alloc = cfg->host_alloc,
        .host_free = cfg->host_free,
        .host_arg = cfg->host_arg,
    };
    char why[256] = "";
    kvf_status_t st = kvf_kv_tiers_create(&tc, &nt->tiers, why, sizeof(why));
    if (st != KVF_OK && tc.disk_dir && tc.host_bytes) {
        kvf_log_warn("kv tiers: no disk tier in %s (%s): host RAM only", tc.disk_dir, why);
        tc.disk_dir = NULL;
        tc.disk_bytes = 0;
        st = kvf_kv_tiers_create(&tc, &nt->tiers, why, sizeof(why));
    }
    if (st != KVF_OK) {
        kvf_log_error("kv tiers: %s", why);
        return st;
    }
    st = kvf_evloop_add_fd(loop, kvf_kv_tiers_fd(nt->tiers), on_ready, nt);
    if (st != KVF_OK) {
        kvf_node_tiers_fini(nt);
        return st;
    }
    if (kvf_node_prefix_attach_tiers(pc, nt->tiers) != KVF_OK)
        kvf_log_warn("kv tiers: out of memory for their reports: the router will not see them");
    nt->pc = pc;
    pc->on_evict = on_evict;
    pc->evict_arg = nt;
    kvf_prefix_cache_set_evict_hook(pc->cache, on_evict, nt);
    kvf_kv_tiers_stats_t s;
    kvf_kv_tiers_stats(nt->tiers, &s);
    kvf_log_info("kv tiers: host RAM %u blocks, disk %u blocks%s", s.cap_ram, s.cap_disk,
                 s.cap_disk && !kvf_kv_tiers_direct_io(nt->tiers) ? " (buffered I/O)" : "");
    return KVF_OK;
}

void kvf_node_tiers_fini(kvf_node_tiers_t *nt)
{
    if (!nt->tiers)
        return;
    (void)kvf_evloop_remove_fd(nt->loop, kvf_kv_tiers_fd(nt->tiers));
    if (nt->pc)
        (void)kvf_node_prefix_attach_tiers(nt->pc, NULL);
    kvf_kv_tiers_destroy(nt->tiers); /* copies not reported never are */
    nt->tiers = NULL;
    for (uint32_t i = 0; i < nt->n_fetches; i++)
        if (nt->fetches[i].used)
            (void)kvf_kvpool_release(nt->pool, &nt->fetches[i].block, 1);
    free(nt->fetches);
    nt->fetches = NULL;
    nt->n_fetches = 0;
}

void kvf_node_tiers_load(const kvf_node_tiers_t *nt, Kvf__Load *load)
{
    if (!nt->tiers)
        return;
    kvf_kv_tiers_stats_t s;
    kvf_kv_tiers_stats(nt->tiers, &s);
    load->tier_ram_blocks = s.blocks_ram;
    load->tier_disk_blocks = s.blocks_disk;
    if (s.reads) {
        load->tier_disk_read_ns = s.read_wait_ns / s.reads;
        load->tier_disk_read_busy_ns = s.read_ns / s.reads;
        load->tier_disk_read_bytes = s.slot_bytes;
        load->tier_disk_io_threads = s.io_threads;
    }
}

void kvf_node_tiers_describe(const kvf_node_tiers_t *nt, char *buf, size_t len)
{
    if (!nt->tiers) {
        snprintf(buf, len, "kv tiers off");
        return;
    }
    kvf_kv_tiers_stats_t s;
    kvf_kv_tiers_stats(nt->tiers, &s);
    snprintf(buf, len,
             "kv tiers: %u ram + %u disk blocks, %llu ram + %llu disk hits, %llu prompt tokens "
             "from them, %llu corrupt dropped",
             s.blocks_ram, s.blocks_disk, (unsigned long long)s.hits_ram,
             (unsigned long long)s.hits_disk, (unsigned long long)nt->hit_tokens,
             (unsigned long long)s.corrupt);
}
