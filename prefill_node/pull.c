/* kvf-prefill's prefix pulls (docs/prefix-cache.md, "Pulls"): a prompt
 * whose decode node holds more of its leading blocks than this node's
 * cache and tiers gave it reads them from there, one-sided
 * (kvf_xfer_get), into its own blocks, and computes only the rest. The
 * decode node keeps those blocks for the reservation (they are its
 * KvAllocReply.cached_blocks), so they hold still while the lease lasts;
 * a read that ends later, or fails, is forgotten and the blocks are
 * computed instead. Every cached block holds the bits a cold prefill of
 * its tokens writes (the CPU-engine invariance; a device pool lists only
 * blocks whose host copies are whole), so what follows is what a cold
 * run computes. */
#include "plan.h"
#include "prefill_internal.h"

#include "kvf/log.h"

#include <stdlib.h>

/* Reads D's blocks [from, to) of r's prompt into r's local ones. */
static kvf_status_t pull_start(kvf_prefill_t *p, pf_req_t *r, uint32_t from, uint32_t to)
{
    const uint64_t len = (uint64_t)p->geo.n_layers * kvf_kvpool_slice_bytes(p->rt.pool);
    kvf_xfer_slice_t *s = malloc((size_t)(to - from) * sizeof(*s));
    if (!s)
        return KVF_ERR_NOMEM;
    for (uint32_t b = from; b < to; b++)
        s[b - from] = (kvf_xfer_slice_t){
            .local_off = kvf_kvpool_slice_offset(p->rt.pool, r->local.blocks[b], 0),
            .remote_off = kvf_prefill_slice_offset(&p->geo, r->remote_blocks[b], 0),
            .len = len,
        };
    kvf_xfer_batch_spec_t spec = {
        .req_id = r->req_id,
        .epoch = r->epoch,
        .slices = s,
        .n_slices = to - from,
        .not_after_ns = r->not_after_ns,
    };
    kvf_status_t st = kvf_xfer_get(r->peer->xp, &spec, &r->pull);
    free(s);
    if (st != KVF_OK) {
        r->pull = NULL;
        return st;
    }
    r->pull_from = from;
    r->pull_to = to;
    return KVF_OK;
}

void pf_req_reuse(kvf_prefill_t *p, pf_req_t *r, uint32_t n)
{
    uint32_t to = r->ship_from < r->hit_most ? r->ship_from : r->hit_most;
    if (to > n && r->state == REQ_READY && !p->cfg.no_prefix_pull && r->remote_blocks &&
        r->peer && r->peer->xp) {
        kvf_status_t st = pull_start(p, r, n, to);
        if (st == KVF_OK)
            return;
        /* (UNSUPPORTED: a two-sided or NCCL connection) */
        if (st != KVF_ERR_UNSUPPORTED)
            kvf_log_debug("request %llu: prefix pull not started: %s",
                          (unsigned long long)r->req_id, kvf_status_str(st));
        p->count.pulls_failed += st != KVF_ERR_UNSUPPORTED;
    }
    pf_req_set_cached(p, r, n);
}

/* r's pull ended with st: r computes from the first block it lacks. */
static void pull_done(kvf_prefill_t *p, pf_req_t *r, kvf_status_t st)
{
    uint32_t from = r->pull_from, n = r->pull_to - from;
    /* a GPU's pool computes from its device copy */
    if (st == KVF_OK)
        st = kvf_kvpool_upload(p->rt.pool, r->local.blocks + from, n);
    if (st != KVF_OK) {
        kvf_log_warn("request %llu epoch %llu: prefix pull of %u blocks failed (%s): computing "
                     "them",
                     (unsigned long long)r->req_id, (unsigned long long)r->epoch, n,
                     kvf_status_str(st));
        p->count.pulls_failed++;
        pf_req_set_cached(p, r, from);
        return;
    }
    uint64_t bytes = (uint64_t)n * p->geo.n_layers * kvf_kvpool_slice_bytes(p->rt.pool);
    p->count.pulled_tokens += (uint64_t)n * (uint32_t)p->geo.block_size;
    p->count.pulled_bytes += bytes;
    r->pulled_bytes += bytes;
    r->pulled_tokens = n * (uint32_t)p->geo.block_size;
    pf_req_set_cached(p, r, r->pull_to);
}

bool pf_req_service_pull(kvf_prefill_t *p, pf_req_t *r)
{
    if (!r->pull)
        return false;
    kvf_status_t st = kvf_xfer_test(r->pull);
    if (st == KVF_ERR_AGAIN)
        return true;
    kvf_xfer_batch_release(r->pull);
    r->pull = NULL;
    if (r->state == REQ_READY)
        pull_done(p, r, st);
    return false;
}
