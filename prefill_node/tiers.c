/* kvf-prefill's KV tiers (kvf/node_tiers.h, docs/kv-tiers.md): a prompt
 * whose next blocks a tier holds waits for their copies (the loop does
 * not) and then computes from the first block that failed its checks:
 * every block after it is computed too. */
#include "prefill_internal.h"


uint32_t pf_tiers_promote(kvf_prefill_t *p, pf_req_t *r, uint32_t from, uint32_t most)
{
    return kvf_node_tiers_promote(&p->nt, r->req_id, r->epoch, r->hashes, r->pr->token_ids,
                                  (uint32_t)p->geo.block_size, r->local.blocks, from, most,
                                  &r->tier_pending);
}

/* A copy into block `index` of request (req_id, epoch) came back. */
static void on_copy(void *arg, uint64_t req_id, uint64_t epoch, uint32_t index, kvf_status_t st,
                    int tier)
{
    kvf_prefill_t *p = arg;
    pf_req_t *r = pf_req_find(p, req_id, epoch);
    if (r && r->tier_pending && /* (else it ended meanwhile) */
        kvf_node_tiers_copied(&p->nt, req_id, index, st, tier, &r->tier_pending, &r->tier_good,
                              r->local.blocks, r->cached_blocks, (uint32_t)p->geo.block_size))
        pf_req_reuse(p, r, r->tier_good);
}

kvf_status_t pf_tiers_create(kvf_prefill_t *p, const kvf_prefill_config_t *cfg)
{
    /* the RAM tier in the backend's host memory: pinned on a GPU node */
    kvf_node_tiers_config_t tc = {.host_bytes = cfg->kv_host_mem,
                                  .disk_dir = cfg->kv_disk_dir,
                                  .disk_bytes = cfg->kv_disk_size,
                                  .host_alloc = kvf_backend_host_alloc_hook,
                                  .host_free = kvf_backend_host_free_hook,
                                  .host_arg = &p->rt.backend};
    return kvf_node_tiers_init(&p->nt, &tc, &p->pc, p->rt.pool, p->loop, on_copy, p);
}
