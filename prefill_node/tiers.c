/* kvf-prefill's KV tiers (kvf/node_tiers.h, docs/kv-tiers.md): a prompt
 * whose next blocks a tier holds waits for their copies (the loop does
 * not) and then computes from the first block that failed its checks:
 * every block after it is computed too. */
#include "prefill_internal.h"

#include "kvf/log.h"

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
    if (!r || !r->tier_pending)
        return; /* it ended meanwhile */
    if (st != KVF_OK && index < r->tier_good) {
        r->tier_good = index;
        kvf_log_info("request %llu: a block from KV tier %d failed its checks (%s): computed "
                     "again",
                     (unsigned long long)req_id, tier, kvf_status_str(st));
    }
    if (--r->tier_pending)
        return;
    uint32_t from = r->cached_blocks, good = r->tier_good;
    if (!kvf_node_tiers_settle(&p->nt, r->local.blocks + from, good - from,
                               (uint32_t)p->geo.block_size))
        good = from;
    pf_req_set_cached(p, r, good);
}

kvf_status_t pf_tiers_create(kvf_prefill_t *p, const kvf_prefill_config_t *cfg)
{
    kvf_node_tiers_config_t tc = {.host_bytes = cfg->kv_host_mem,
                                  .disk_dir = cfg->kv_disk_dir,
                                  .disk_bytes = cfg->kv_disk_size};
    return kvf_node_tiers_init(&p->nt, &tc, &p->pc, p->rt.pool, p->loop, on_copy, p);
}
