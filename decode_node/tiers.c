/* kvf-decode's KV tiers (kvf/node_tiers.h, docs/kv-tiers.md): a local
 * prefill whose next prompt blocks a tier holds waits for their copies (the
 * loop and the decode batch do not) and then computes from the first block
 * that failed its checks. Transferred requests use the pool's cache only. */
#include "decode_internal.h"


uint32_t dec_tiers_promote(kvf_decode_t *d, dec_req_t *r, uint32_t from, uint32_t most)
{
    return kvf_node_tiers_promote(&d->nt, r->req_id, r->epoch, r->prefix_hashes, r->prompt,
                                  d->block_size, r->blocks, from, most, &r->tier_pending);
}

static void on_copy(void *arg, uint64_t req_id, uint64_t epoch, uint32_t index, kvf_status_t st,
                    int tier)
{
    kvf_decode_t *d = arg;
    dec_req_t *r = dec_req_find(d, req_id, epoch);
    if (!r || !r->tier_pending)
        return; /* it ended meanwhile */
    uint32_t from = r->cached_blocks;
    if (!kvf_node_tiers_copied(&d->nt, req_id, index, st, tier, &r->tier_pending, &r->tier_good,
                               r->blocks, from, d->block_size))
        return;
    r->cached_blocks = r->tier_good;
    r->prefilled = r->tier_good * d->block_size; /* computes from there */
    d->prefix_hit_blocks += r->tier_good - from;
}

kvf_status_t dec_tiers_open(kvf_decode_t *d)
{
    /* the RAM tier in the backend's host memory: pinned on a GPU node */
    kvf_node_tiers_config_t tc = {.host_bytes = d->cfg.kv_host_mem,
                                  .disk_dir = d->cfg.kv_disk_dir,
                                  .disk_bytes = d->cfg.kv_disk_size,
                                  .host_alloc = kvf_backend_host_alloc_hook,
                                  .host_free = kvf_backend_host_free_hook,
                                  .host_arg = &d->rt.backend};
    return kvf_node_tiers_init(&d->nt, &tc, &d->pc, d->rt.pool, d->loop, on_copy, d);
}
