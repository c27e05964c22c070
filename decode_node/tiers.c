/* kvf-decode's KV tiers (kvf/node_tiers.h, docs/kv-tiers.md): a request
 * whose next prompt blocks a tier holds waits for their copies (the loop
 * and the decode batch do not). A local prefill then computes from the
 * first block that failed its checks; a transferred request is reserved
 * with the transport from there and its KvAlloc answered with that many
 * cached blocks, so the prefill node ships the rest, the failed block
 * included (docs/PROTOCOL.md, step 3). */
#include "decode_internal.h"

#include "kvf/log.h"

#include <stdlib.h>

uint32_t dec_tiers_promote(kvf_decode_t *d, dec_req_t *r, uint32_t from, uint32_t most)
{
    /* a transferred request's offered blocks: their tokens as kept */
    const uint32_t *tokens = r->local ? r->prompt : r->prefix_tokens;
    if (!r->prefix_hashes || !tokens)
        return from;
    most = most < r->n_prefix ? most : r->n_prefix;
    return kvf_node_tiers_promote(&d->nt, r->req_id, r->epoch, r->prefix_hashes, tokens,
                                  d->block_size, r->blocks, from, most, &r->tier_pending);
}

/* Transferred request r's copies are all in: the transport may write its
 * prompt blocks from r->cached_blocks on, and the prefill node hears it.
 * Nothing was reserved before: no write could land in a block a copy was
 * filling. r may be freed on return. */
static void transfer_ready(kvf_decode_t *d, dec_req_t *r)
{
    char *to = r->alloc_reply_to;
    r->alloc_reply_to = NULL;
    kvf_status_t st = dec_reserve_prompt_blocks(d, r);
    if (st == KVF_OK) {
        dec_reply_kv_alloc(d, r->req_id, r->epoch, to, KVF_OK, NULL, r);
    } else {
        kvf_log_error("request %llu: reserving its blocks failed: %s",
                      (unsigned long long)r->req_id, kvf_status_str(st));
        dec_reply_kv_alloc(d, r->req_id, r->epoch, to,
                           st == KVF_ERR_NO_SPACE ? KVF_ERR_NO_SPACE : KVF_ERR_NOMEM,
                           "decode node could not reserve blocks", NULL);
        d->stats.requests_refused++;
        dec_req_end(d, r);
    }
    free(to);
}

static void on_copy(void *arg, uint64_t req_id, uint64_t epoch, uint32_t index, kvf_status_t st,
                    int tier)
{
    kvf_decode_t *d = arg;
    dec_req_t *r = dec_req_find(d, req_id, epoch);
    if (!r || !r->tier_pending)
        return; /* it ended meanwhile */
    uint32_t from = r->cached_blocks;
    /* a transferred prompt goes to a device pool whole once it sealed
     * (step.c), these blocks with it */
    if (!kvf_node_tiers_copied(&d->nt, req_id, index, st, tier, &r->tier_pending, &r->tier_good,
                               r->local ? r->blocks : NULL, from, d->block_size))
        return;
    r->cached_blocks = r->tier_good;
    d->prefix_hit_blocks += r->tier_good - from;
    if (r->local)
        r->prefilled = r->tier_good * d->block_size; /* computes from there */
    else if (kvf_handoff_live(&r->h) && r->alloc_reply_to)
        transfer_ready(d, r);
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
