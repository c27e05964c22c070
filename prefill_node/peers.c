/* kvf-prefill's decode peers: one transfer connection per decode node's
 * pool, shared by the requests shipping to it; the KvAlloc a request sends
 * to its decode node (docs/PROTOCOL.md, step 2), the reply that reserves
 * blocks there, and the lease that reservation holds. */
#include "prefill_internal.h"

#include "kvf/clock.h"
#include "kvf/log.h"
#include "kvf/sampling_msg.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* ---- connections ---- */

static void peer_free(pf_peer_t *e)
{
    free(e->desc);
    free(e->node_id);
    free(e);
}

pf_peer_t *pf_peer_get(kvf_prefill_t *p, const char *node_id, const uint8_t *desc, size_t len,
                       kvf_status_t *status_p)
{
    for (pf_peer_t *e = p->peers; e; e = e->next) {
        if (e->stale || strcmp(e->node_id, node_id) != 0)
            continue;
        if (kvf_xfer_peer_status(e->xp) == KVF_OK && e->desc_len == len &&
            !memcmp(e->desc, desc, len)) {
            e->users++;
            return e;
        }
        /* Failed, or the node came back with another pool: reconnect. */
        e->stale = true;
    }
    pf_peer_t *e = calloc(1, sizeof(*e));
    kvf_status_t st = KVF_ERR_NOMEM;
    if (!e)
        goto fail_alloc;
    e->node_id = strdup(node_id);
    e->desc = malloc(len ? len : 1);
    if (!e->node_id || !e->desc)
        goto fail_copy;
    memcpy(e->desc, desc, len);
    e->desc_len = len;
    st = kvf_xfer_connect(p->xfer, desc, len, &e->xp);
    if (st != KVF_OK) {
        kvf_log_error("decode node %s: transfer connect failed: %s", node_id, kvf_status_str(st));
        goto fail_copy;
    }
    e->users = 1;
    e->next = p->peers;
    p->peers = e;
    return e;

fail_copy:
    peer_free(e);
fail_alloc:
    *status_p = st;
    return NULL;
}

void pf_peer_put(kvf_prefill_t *p, pf_peer_t *peer)
{
    if (peer)
        peer->users--;
    pf_peer_t **link = &p->peers;
    while (*link) {
        pf_peer_t *e = *link;
        if (e->users == 0 && (e->stale || kvf_xfer_peer_status(e->xp) != KVF_OK)) {
            *link = e->next;
            kvf_xfer_disconnect(e->xp);
            peer_free(e);
            continue;
        }
        link = &e->next;
    }
}

void pf_peers_free(kvf_prefill_t *p)
{
    for (pf_peer_t *e = p->peers, *next; e; e = next) {
        next = e->next; /* its kvf_xfer_peer_t died with the handle */
        peer_free(e);
    }
    p->peers = NULL;
}

/* ---- KvAlloc ---- */

void pf_send_alloc(kvf_prefill_t *p, pf_req_t *r, int timeout_ms)
{
    const Kvf__PrefillRequest *pr = r->pr;
    Kvf__KvAlloc a = KVF__KV_ALLOC__INIT;
    a.req_id = r->req_id;
    a.epoch = r->epoch;
    a.n_tokens = r->n_prompt;
    /* sampling.max_tokens counts the request's tokens in total. */
    a.max_new_tokens = kvf_sampling_msg_remaining(pr->sampling, pr->n_generated);
    a.prefill_node_id = (char *)kvf_node_id(p->node);
    a.reply_inbox = (char *)p->cfg.listen_url;
    a.alloc_token = pr->alloc_token; /* the router's credential for this attempt */
    /* The prompt's full blocks but the last block of the prompt: the
     * decode node may hold some of them already (its prefix cache). */
    const uint32_t bs = (uint32_t)p->geo.block_size;
    if (r->hashes && r->key_gen == p->pc.key_gen && r->n_prompt > bs) {
        uint32_t n = (r->n_prompt - 1) / bs < r->n_full ? (r->n_prompt - 1) / bs : r->n_full;
        a.n_prefix_hashes = n;
        a.prefix_hashes = r->hashes;
        a.n_prefix_token_ids = (size_t)n * bs;
        a.prefix_token_ids = pr->token_ids;
        a.cache_salt = pr->cache_salt;
    }
    kvf_envelope_t env;
    kvf_envelope_init(&env, kvf_node_id(p->node));
    env.body_case = KVF__ENVELOPE__BODY_KV_ALLOC;
    env.kv_alloc = &a;
    uint64_t now = kvf_clock_ns();
    kvf_status_t st = kvf_node_send(p->node, pr->decode_inbox, &env, timeout_ms);
    if (st == KVF_OK) {
        r->alloc_sent = true;
        r->alloc_sent_ns = now; /* the lease counts from here */
        r->alloc_deadline_ns = now + (uint64_t)p->cfg.alloc_timeout_ms * 1000000ull;
    } else if (st == KVF_ERR_TIMEOUT || st == KVF_ERR_AGAIN) {
        r->next_alloc_try_ns = now + PF_ALLOC_RETRY_MS * 1000000ull;
    } else {
        pf_req_fail(p, r, KVF_ERR_PEER, "kv alloc not sent to the decode node");
        return;
    }
    uint64_t at = r->alloc_sent ? r->alloc_deadline_ns : r->next_alloc_try_ns;
    if (kvf_timer_arm(kvf_evloop_timers(p->loop), &r->alloc_timer, at) != KVF_OK)
        pf_req_fail(p, r, KVF_ERR_NOMEM, "out of memory");
}

/* r's alloc timer is due: the retry of an unsent KvAlloc (or, past
 * alloc_timeout_ms of trying, giving up), or the reply's deadline. */
static void alloc_timer_due(kvf_prefill_t *p, pf_req_t *r, uint64_t now_ns)
{
    if (!r->alloc_sent) {
        uint64_t give_up = r->alloc_first_try_ns + (uint64_t)p->cfg.alloc_timeout_ms * 1000000ull;
        if (now_ns >= give_up)
            pf_req_fail(p, r, KVF_ERR_TIMEOUT, "decode node inbox unreachable");
        else
            pf_send_alloc(p, r, 0);
        return;
    }
    if (r->state == REQ_CANCELLED)
        pf_req_destroy(p, r);
    else
        pf_req_fail(p, r, KVF_ERR_TIMEOUT, "no kv alloc reply from the decode node");
}

void pf_on_alloc_timer(kvf_timer_t *timer, void *arg)
{
    pf_req_t *r = (pf_req_t *)((char *)timer - offsetof(pf_req_t, alloc_timer));
    alloc_timer_due(arg, r, kvf_clock_ns());
}

/* A refusal: the router hears of it unless the request was cancelled. */
static void alloc_refused(kvf_prefill_t *p, pf_req_t *r, const Kvf__KvAllocReply *a)
{
    bool known = a->status < 0 && a->status >= KVF_ERR_INTERNAL;
    kvf_status_t st = known ? (kvf_status_t)a->status : KVF_ERR_PEER;
    if (r->state == REQ_WAIT_ALLOC) {
        kvf_log_info("request %llu epoch %llu: decode node refused: %s (%s)",
                     (unsigned long long)r->req_id, (unsigned long long)r->epoch,
                     a->error ? a->error : "", kvf_status_str(st));
        pf_send_error(p, r->req_id, r->epoch, st,
                      a->error && a->error[0] ? a->error : "decode node refused kv alloc");
    }
    pf_req_destroy(p, r);
}

void pf_on_alloc_reply(kvf_prefill_t *p, const Kvf__KvAllocReply *a)
{
    /* Epochs start at 1: 0 would name "the newest" here, never accepted. */
    pf_req_t *r = a->epoch ? pf_req_find(p, a->req_id, a->epoch) : NULL;
    if (!r || (r->state != REQ_WAIT_ALLOC && r->state != REQ_CANCELLED)) {
        kvf_log_debug("kv alloc reply for request %llu epoch %llu: stale, dropped",
                      (unsigned long long)a->req_id, (unsigned long long)a->epoch);
        p->count.stale_dropped++;
        return;
    }
    kvf_timer_cancel(kvf_evloop_timers(p->loop), &r->alloc_timer);
    if (a->status != KVF_OK) {
        alloc_refused(p, r, a);
        return;
    }
    r->reserved = true;
    r->not_after_ns = a->lease_ms ? r->alloc_sent_ns + a->lease_ms * 1000000ull : 0;
    if (r->state == REQ_CANCELLED) {
        pf_req_abort(p, r);
        return;
    }
    uint32_t need = kvf_kv_blocks_for_tokens(&p->geo, r->n_prompt);
    if (a->n_block_ids < need) {
        pf_req_fail(p, r, KVF_ERR_PEER, "decode node reserved too few blocks");
        return;
    }
    r->remote_blocks = malloc(need * sizeof(uint32_t));
    if (!r->remote_blocks) {
        pf_req_fail(p, r, KVF_ERR_NOMEM, "out of memory");
        return;
    }
    memcpy(r->remote_blocks, a->block_ids, need * sizeof(uint32_t));
    /* Leading blocks the decode node holds already are not written (its
     * transport would refuse them); never all of them: the last prompt
     * block always travels. */
    r->ship_from = a->cached_blocks < need ? a->cached_blocks : need - 1;
    r->state = REQ_READY;
}

/* ---- leases ---- */

bool pf_lease_ending(const pf_req_t *r, uint64_t now_ns)
{
    return r->not_after_ns && now_ns + PF_LEASE_MARGIN_NS >= r->not_after_ns;
}

void pf_on_lease_reply(kvf_prefill_t *p, const Kvf__KvLeaseReply *a, const char *sender)
{
    /* sent_ns is this node's clock, echoed: one from the future is not an
     * answer to anything it asked. */
    uint64_t now = kvf_clock_ns();
    if (!a->sent_ns || a->sent_ns > now || !a->lease_ms || a->lease_ms > KVF_NODE_LEASE_MS_MAX) {
        p->count.malformed_dropped++;
        return;
    }
    uint64_t until = a->sent_ns + a->lease_ms * 1000000ull;
    for (size_t i = 0; i < a->n_renewed; i++) {
        const Kvf__WorkRef *w = a->renewed[i];
        pf_req_t *r = w->epoch ? pf_req_find(p, w->req_id, w->epoch) : NULL;
        /* Only the decode node that holds the reservation renews it. */
        if (!r || !r->reserved || !r->not_after_ns || !sender ||
            strcmp(sender, r->pr->decode_node_id) != 0)
            continue;
        if (until > r->not_after_ns) {
            r->not_after_ns = until;
            kvf_xfer_extend(p->xfer, r->req_id, r->epoch, until);
        }
    }
}
