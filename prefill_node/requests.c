/* kvf-prefill's request table: one record per attempt (req_id, epoch) in
 * arrival order, its lifecycle (prefill.h) and the transfer batches it
 * posts. */
#include "prefill_internal.h"

#include "kvf/array.h"
#include "kvf/clock.h"
#include "kvf/log.h"

#include <stdlib.h>

pf_req_t *pf_req_find(kvf_prefill_t *p, uint64_t req_id, uint64_t epoch)
{
    pf_req_t *newest = NULL;
    for (pf_req_t *r = p->head; r; r = r->next) {
        if (r->req_id != req_id)
            continue;
        if (epoch != 0 && r->epoch == epoch)
            return r;
        if (!newest || r->epoch > newest->epoch)
            newest = r;
    }
    return epoch == 0 ? newest : NULL;
}

bool pf_req_computing(const pf_req_t *r)
{
    return r->state == REQ_WAIT_ALLOC || r->state == REQ_READY;
}

pf_req_t *pf_req_add(kvf_prefill_t *p, kvf_envelope_t *env, pf_peer_t *peer,
                     const kvf_sampling_params_t *sampling)
{
    pf_req_t *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    const Kvf__PrefillRequest *pr = env->prefill_request;
    r->peer = peer;
    r->env = env;
    r->pr = pr;
    r->req_id = pr->req_id;
    r->epoch = pr->epoch;
    r->n_prompt = (uint32_t)pr->n_token_ids;
    r->sampling = *sampling;
    r->state = REQ_WAIT_ALLOC;
    r->hook_status = KVF_OK;
    kvf_timer_init(&r->alloc_timer, pf_on_alloc_timer, p);
    kvf_block_table_init(&r->local);
    /* The prompt's full blocks' hashes, for the prefix cache (without
     * memory for them the request just runs cold). */
    const uint32_t bs = (uint32_t)p->geo.block_size;
    if (r->n_prompt >= bs && kvf_node_prefix_sync(&p->pc)) {
        r->hashes = malloc((size_t)(r->n_prompt / bs) * sizeof(uint64_t));
        /* a salted request (a tenant) has its own root: its blocks are
         * never anyone else's */
        uint64_t root = kvf_node_prefix_root(&p->pc, pr->cache_salt.data, pr->cache_salt.len);
        if (r->hashes)
            r->n_full = kvf_block_hash_chain(&p->pc.key, root, pr->token_ids, r->n_prompt, bs,
                                             r->hashes);
        r->key_gen = p->pc.key_gen;
    }
    r->prev = p->tail;
    if (p->tail)
        p->tail->next = r;
    else
        p->head = r;
    p->tail = r;
    p->count.requests++;
    return r;
}

void pf_req_release_batches(pf_req_t *r)
{
    for (size_t i = 0; i < r->n_batches; i++)
        kvf_xfer_batch_release(r->batches[i]);
    r->n_batches = 0;
}

void pf_req_destroy(kvf_prefill_t *p, pf_req_t *r)
{
    kvf_timer_cancel(kvf_evloop_timers(p->loop), &r->alloc_timer);
    if (r->prev)
        r->prev->next = r->next;
    else
        p->head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        p->tail = r->prev;
    pf_req_release_batches(r);
    if (r->pull)
        kvf_xfer_batch_release(r->pull);
    free(r->batches);
    kvf_block_table_release(&r->local, p->rt.pool);
    kvf_block_table_fini(&r->local);
    free(r->remote_blocks);
    free(r->logits);
    free(r->hashes);
    pf_peer_t *peer = r->peer;
    kvf_envelope_free(r->env);
    free(r);
    pf_peer_put(p, peer);
}

static kvf_status_t req_add_batch(pf_req_t *r, kvf_xfer_batch_t *b)
{
    kvf_status_t st =
        kvf_array_reserve(&r->batches, &r->cap_batches, r->n_batches + 1, 16, sizeof(*r->batches));
    if (st != KVF_OK)
        return st;
    r->batches[r->n_batches++] = b;
    return KVF_OK;
}

kvf_status_t pf_req_post(kvf_prefill_t *p, pf_req_t *r, const kvf_xfer_slice_t *slices, size_t n,
                         uint32_t flags)
{
    kvf_xfer_batch_spec_t spec = {
        .req_id = r->req_id,
        .epoch = r->epoch,
        .slices = slices,
        .n_slices = n,
        .flags = flags,
        .not_after_ns = r->not_after_ns,
    };
    kvf_xfer_batch_t *b = NULL;
    uint64_t until = kvf_clock_ns() + PF_POST_AGAIN_MS * 1000000ull;
    kvf_status_t st;
    while ((st = kvf_xfer_post(r->peer->xp, &spec, &b)) == KVF_ERR_AGAIN && kvf_clock_ns() < until)
        kvf_xfer_progress(p->xfer);
    if (st != KVF_OK)
        return st;
    st = req_add_batch(r, b);
    if (st != KVF_OK) {
        kvf_xfer_batch_release(b); /* still driven to its end */
        return st;
    }
    return KVF_OK;
}

/* Never an ABORT after LAST: the sender promised nothing follows it. */
void pf_req_abort(kvf_prefill_t *p, pf_req_t *r)
{
    if (r->reserved && !r->last_posted && !r->abort_posted && r->peer &&
        kvf_xfer_peer_status(r->peer->xp) == KVF_OK) {
        kvf_status_t st = pf_req_post(p, r, NULL, 0, KVF_XFER_ABORT);
        if (st != KVF_OK)
            kvf_log_debug("request %llu: abort batch not posted: %s", (unsigned long long)r->req_id,
                          kvf_status_str(st));
        r->abort_posted = true;
    }
    kvf_timer_cancel(kvf_evloop_timers(p->loop), &r->alloc_timer);
    r->state = REQ_ABORTING;
}

void pf_req_fail(kvf_prefill_t *p, pf_req_t *r, kvf_status_t status, const char *why)
{
    kvf_log_warn("request %llu epoch %llu failed: %s (%s)", (unsigned long long)r->req_id,
                 (unsigned long long)r->epoch, why, kvf_status_str(status));
    p->count.failed++;
    pf_send_error(p, r->req_id, r->epoch, status, why);
    pf_req_abort(p, r);
}

void pf_req_cancel(kvf_prefill_t *p, pf_req_t *r)
{
    if (r->state != REQ_CANCELLED && r->state != REQ_ABORTING)
        p->count.cancelled++;
    switch (r->state) {
    case REQ_WAIT_ALLOC:
        if (!r->alloc_sent) {
            pf_req_destroy(p, r);
            return;
        }
        /* D may still reserve: wait for its reply to abort that. */
        r->state = REQ_CANCELLED;
        return;
    case REQ_READY:
    case REQ_SHIPPING:
        pf_req_abort(p, r);
        return;
    case REQ_CANCELLED:
    case REQ_ABORTING:
        return;
    }
}

/* Drops the completed batches of r; returns the first failure seen (or OK)
 * and whether some still run. */
static kvf_status_t req_test_batches(pf_req_t *r, bool *running_p)
{
    kvf_status_t failure = KVF_OK;
    size_t keep = 0;
    for (size_t i = 0; i < r->n_batches; i++) {
        kvf_status_t st = kvf_xfer_test(r->batches[i]);
        if (st == KVF_ERR_AGAIN) {
            r->batches[keep++] = r->batches[i];
            continue;
        }
        if (st != KVF_OK && failure == KVF_OK)
            failure = st;
        kvf_xfer_batch_release(r->batches[i]);
    }
    r->n_batches = keep;
    *running_p = keep > 0;
    return failure;
}

/* r holds a reservation (READY, SHIPPING or ABORTING): its batches ended,
 * failed, or all completed after LAST. */
static void req_service_batches(kvf_prefill_t *p, pf_req_t *r)
{
    bool running, pulling = pf_req_service_pull(p, r);
    kvf_status_t st = req_test_batches(r, &running);
    if (r->state == REQ_ABORTING) {
        if (!running && !pulling)
            pf_req_destroy(p, r);
        return;
    }
    /* A connection that failed before the request posted anything (its
     * set-up timed out, another request's batch failed it). */
    if (st == KVF_OK && !running && !pulling && r->peer && r->peer->xp)
        st = kvf_xfer_peer_status(r->peer->xp);
    if (st != KVF_OK) {
        pf_req_fail(p, r, KVF_ERR_TRANSPORT, "kv transfer failed");
        return;
    }
    if (r->state == REQ_SHIPPING && !running && r->last_posted)
        pf_req_complete(p, r);
}

void pf_service_requests(kvf_prefill_t *p)
{
    pf_req_t *next;
    for (pf_req_t *r = p->head; r; r = next) {
        next = r->next;
        /* Requests waiting on a KvAlloc move on their reply or timer. */
        if (r->state != REQ_WAIT_ALLOC && r->state != REQ_CANCELLED)
            req_service_batches(p, r);
    }
}
