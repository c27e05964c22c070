/* kvf-prefill's messages: what the router sends (PrefillRequest, Cancel),
 * checked and turned into requests of the table, and what the node sends
 * back (Error, PrefillDone, and KvReady to the decode node). */
#include "prefill_internal.h"

#include "kvf/clock.h"
#include "kvf/log.h"
#include "kvf/model.h"
#include "kvf/sampling_msg.h"

#include <stdio.h>
#include <stdlib.h>

void pf_send_error(kvf_prefill_t *p, uint64_t req_id, uint64_t epoch, kvf_status_t status,
                   const char *message)
{
    Kvf__Error e = KVF__ERROR__INIT;
    e.req_id = req_id;
    e.epoch = epoch;
    e.status = status;
    e.message = (char *)(message ? message : kvf_status_str(status));
    e.node_id = (char *)kvf_node_id(p->node);
    kvf_envelope_t env;
    kvf_envelope_init(&env, kvf_node_id(p->node));
    env.body_case = KVF__ENVELOPE__BODY_ERROR;
    env.error = &e;
    kvf_status_t st = kvf_node_send_router(p->node, &env, PF_SEND_MS);
    if (st != KVF_OK)
        kvf_log_warn("request %llu: error to the router not sent: %s", (unsigned long long)req_id,
                     kvf_status_str(st));
}

/* ---- PrefillRequest ---- */

/* Checks the prompt of a PrefillRequest against the model. */
static kvf_status_t check_prompt(const kvf_model_config_t *c, const Kvf__PrefillRequest *pr,
                                 char *why, size_t why_len)
{
    if (pr->n_token_ids == 0 || pr->n_token_ids > (size_t)c->max_pos) {
        snprintf(why, why_len, "prompt of %zu tokens (context %d)", pr->n_token_ids, c->max_pos);
        return pr->n_token_ids ? KVF_ERR_TOO_BIG : KVF_ERR_INVAL;
    }
    for (size_t i = 0; i < pr->n_token_ids; i++) {
        if (pr->token_ids[i] >= (uint32_t)c->vocab) {
            snprintf(why, why_len, "token id %u at %zu not below vocab size %d", pr->token_ids[i],
                     i, c->vocab);
            return KVF_ERR_INVAL;
        }
    }
    if (pr->n_generated > pr->n_token_ids) {
        snprintf(why, why_len, "n_generated %u above %zu tokens", pr->n_generated, pr->n_token_ids);
        return KVF_ERR_INVAL;
    }
    return KVF_OK;
}

/* Checks a PrefillRequest and converts its sampling message into
 * *sampling_p; on failure writes a reason into why. */
static kvf_status_t check_request(kvf_prefill_t *p, const Kvf__PrefillRequest *pr,
                                  kvf_sampling_params_t *sampling_p, char *why, size_t why_len)
{
    if (pr->req_id == 0 || pr->epoch == 0) {
        snprintf(why, why_len, "request id or epoch 0");
        return KVF_ERR_INVAL;
    }
    kvf_status_t st = check_prompt(&p->rt.model->cfg, pr, why, why_len);
    if (st != KVF_OK)
        return st;
    st = kvf_sampling_msg_params(pr->sampling, p->rt.model->cfg.vocab, sampling_p);
    if (st != KVF_OK) {
        snprintf(why, why_len, pr->sampling ? "bad sampling values" : "no sampling values");
        return st;
    }
    if (!pr->decode_node_id || !pr->decode_node_id[0] || !pr->decode_inbox ||
        !pr->decode_inbox[0]) {
        snprintf(why, why_len, "no decode node");
        return KVF_ERR_INVAL;
    }
    st = kvf_xfer_check_desc(p->xfer, pr->decode_xfer_desc.data, pr->decode_xfer_desc.len);
    if (st != KVF_OK) {
        snprintf(why, why_len, "decode node %s: transfer descriptor: %s", pr->decode_node_id,
                 kvf_status_str(st));
        return st;
    }
    uint32_t need = kvf_kv_blocks_for_tokens(&p->geo, (uint32_t)pr->n_token_ids);
    if (need > kvf_kvpool_num_blocks(p->rt.pool)) {
        snprintf(why, why_len, "prompt needs %u kv blocks, this node has %u", need,
                 kvf_kvpool_num_blocks(p->rt.pool));
        return KVF_ERR_NO_SPACE;
    }
    return KVF_OK;
}

/* A request for (req_id, epoch) arrived: true when it supersedes whatever
 * attempt the table holds (an older one is cancelled), false when it is a
 * duplicate or stale. */
static bool supersedes(kvf_prefill_t *p, const Kvf__PrefillRequest *pr)
{
    pf_req_t *old = pf_req_find(p, pr->req_id, 0);
    if (!old)
        return true;
    if (old->epoch >= pr->epoch) {
        kvf_log_warn("request %llu epoch %llu: duplicate or stale (have epoch %llu), dropped",
                     (unsigned long long)pr->req_id, (unsigned long long)pr->epoch,
                     (unsigned long long)old->epoch);
        p->count.stale_dropped++;
        return false;
    }
    /* Re-dispatched with a newer epoch: the old attempt is over. */
    pf_req_cancel(p, old);
    return true;
}

/* Takes env (a PrefillRequest): kept by the request, or freed. */
static void on_prefill_request(kvf_prefill_t *p, kvf_envelope_t *env)
{
    const Kvf__PrefillRequest *pr = env->prefill_request;
    if (!supersedes(p, pr))
        goto free_env;
    char why[256];
    kvf_sampling_params_t sampling;
    kvf_status_t st = check_request(p, pr, &sampling, why, sizeof(why));
    if (st == KVF_OK && p->draining) {
        st = KVF_ERR_CLOSED;
        snprintf(why, sizeof(why), "prefill node is draining");
    }
    if (st != KVF_OK) {
        kvf_log_warn("request %llu epoch %llu refused: %s", (unsigned long long)pr->req_id,
                     (unsigned long long)pr->epoch, why);
        p->count.refused++;
        pf_send_error(p, pr->req_id, pr->epoch, st, why);
        goto free_env;
    }
    pf_peer_t *peer = pf_peer_get(p, pr->decode_node_id, pr->decode_xfer_desc.data,
                                  pr->decode_xfer_desc.len, &st);
    if (!peer) {
        pf_send_error(p, pr->req_id, pr->epoch, KVF_ERR_TRANSPORT,
                      "cannot connect to the decode node");
        goto free_env;
    }
    pf_req_t *r = pf_req_add(p, env, peer, &sampling);
    if (!r) {
        pf_peer_put(p, peer);
        pf_send_error(p, pr->req_id, pr->epoch, KVF_ERR_NOMEM, "out of memory");
        goto free_env;
    }
    kvf_log_debug("request %llu epoch %llu: %u tokens for %s", (unsigned long long)r->req_id,
                  (unsigned long long)r->epoch, r->n_prompt, pr->decode_node_id);
    /* Allocation overlaps the queue wait (docs/PROTOCOL.md, step 2). */
    r->alloc_first_try_ns = kvf_clock_ns();
    pf_send_alloc(p, r, PF_SEND_MS);
    return;

free_env:
    kvf_envelope_free(env);
}

/* ---- Cancel ---- */

static void on_cancel(kvf_prefill_t *p, const Kvf__Cancel *c)
{
    pf_req_t *r = pf_req_find(p, c->req_id, c->epoch);
    if (!r || r->state == REQ_CANCELLED || r->state == REQ_ABORTING) {
        kvf_log_debug("cancel of request %llu epoch %llu: not here", (unsigned long long)c->req_id,
                      (unsigned long long)c->epoch);
        return;
    }
    kvf_log_info("request %llu epoch %llu cancelled (%s)", (unsigned long long)r->req_id,
                 (unsigned long long)r->epoch, c->reason ? c->reason : "");
    pf_req_cancel(p, r);
}

void pf_handle_envelope(kvf_prefill_t *p, kvf_envelope_t *env)
{
    if (kvf_node_handle(p->node, env) || kvf_node_prefix_handle(&p->pc, env)) {
        kvf_envelope_free(env);
        return;
    }
    switch (env->body_case) {
    case KVF__ENVELOPE__BODY_PREFILL_REQUEST:
        on_prefill_request(p, env);
        return; /* env taken */
    case KVF__ENVELOPE__BODY_KV_ALLOC_REPLY:
        pf_on_alloc_reply(p, env->kv_alloc_reply);
        break;
    case KVF__ENVELOPE__BODY_KV_LEASE_REPLY:
        pf_on_lease_reply(p, env->kv_lease_reply, env->sender);
        break;
    case KVF__ENVELOPE__BODY_CANCEL:
        on_cancel(p, env->cancel);
        break;
    default:
        kvf_log_warn("unexpected %s message from '%s' dropped", kvf_envelope_body_name(env),
                     env->sender ? env->sender : "");
        p->count.unexpected_dropped++;
        break;
    }
    kvf_envelope_free(env);
}

/* ---- the inbox during a forward ---- */

static void take_lease_reply(void *arg, kvf_envelope_t *env)
{
    pf_on_lease_reply(arg, env->kv_lease_reply, env->sender);
    kvf_envelope_free(env);
}

static void handle_kept(void *arg, kvf_envelope_t *env)
{
    pf_handle_envelope(arg, env);
}

void pf_inbox_during_forward(kvf_prefill_t *p)
{
    kvf_inbox_keep(kvf_node_inbox(p->node), &p->stash, KVF__ENVELOPE__BODY_KV_LEASE_REPLY,
                   take_lease_reply, p);
}

void pf_stash_handle(kvf_prefill_t *p)
{
    kvf_kept_handle(&p->stash, handle_kept, p);
}

void pf_stash_free(kvf_prefill_t *p)
{
    kvf_kept_free(&p->stash);
}

/* ---- completion ---- */

/* PrefillDone to the router: the timings, and that this node is done. */
static void send_prefill_done(kvf_prefill_t *p, const pf_req_t *r, uint64_t compute_us,
                              uint64_t handoff_us)
{
    Kvf__PrefillDone d = KVF__PREFILL_DONE__INIT;
    d.req_id = r->req_id;
    d.epoch = r->epoch;
    d.node_id = (char *)kvf_node_id(p->node);
    d.prefill_compute_us = compute_us;
    d.handoff_us = handoff_us;
    d.kv_bytes = r->kv_bytes;
    d.kv_bytes_pulled = r->pulled_bytes;
    d.cached_tokens = r->cached_blocks * (uint32_t)p->geo.block_size;
    kvf_envelope_t env;
    kvf_envelope_init(&env, kvf_node_id(p->node));
    env.body_case = KVF__ENVELOPE__BODY_PREFILL_DONE;
    env.prefill_done = &d;
    kvf_status_t st = kvf_node_send_router(p->node, &env, PF_SEND_MS);
    if (st != KVF_OK)
        kvf_log_warn("request %llu: prefill done not sent to the router: %s",
                     (unsigned long long)r->req_id, kvf_status_str(st));
}

/* KvReady to D: everything it needs to seal the blocks and decode. */
static kvf_status_t send_kv_ready(kvf_prefill_t *p, const pf_req_t *r, uint64_t compute_us,
                                  uint64_t handoff_us)
{
    const Kvf__PrefillRequest *pr = r->pr;
    Kvf__KvReady k = KVF__KV_READY__INIT;
    k.req_id = r->req_id;
    k.epoch = r->epoch;
    k.first_token = r->first_token;
    k.n_tokens = r->n_prompt;
    k.sampling = pr->sampling;
    k.n_token_ids = pr->n_token_ids;
    k.token_ids = pr->token_ids;
    k.n_generated = pr->n_generated;
    k.rng_state = r->rng_after;
    k.kv_bytes = r->kv_bytes;
    k.prefill_compute_us = compute_us;
    k.handoff_us = handoff_us;
    k.cached_tokens = r->cached_blocks * (uint32_t)p->geo.block_size;
    kvf_envelope_t env;
    kvf_envelope_init(&env, kvf_node_id(p->node));
    env.body_case = KVF__ENVELOPE__BODY_KV_READY;
    env.kv_ready = &k;
    return kvf_node_send(p->node, pr->decode_inbox, &env, PF_SEND_MS);
}

/* PrefillDone goes first: the router reports the epoch's prefill timings
 * with the request's finishing chunk, which D may send as soon as it has
 * KvReady (a request that ends at its first token finishes with its first
 * chunk); timings arriving after that would no longer count. */
void pf_req_complete(kvf_prefill_t *p, pf_req_t *r)
{
    uint64_t now = kvf_clock_ns();
    uint64_t compute_us = pf_us_between(r->compute_start_ns, r->compute_end_ns);
    uint64_t handoff_us = pf_us_between(r->compute_end_ns, now);
    /* Every block is computed and shipped: the full ones stay for later
     * prompts with the same prefix (the cache takes its own references;
     * destroying r drops the request's), and the router hears of them
     * before this request's first token (the same socket keeps the order),
     * so a client's next turn is routed here. */
    if (p->pc.cache && r->hashes && r->done == r->n_prompt && r->key_gen == p->pc.key_gen) {
        kvf_status_t cst = kvf_prefix_cache_insert(p->pc.cache, r->hashes, r->pr->token_ids,
                                                   r->local.blocks, r->n_full);
        if (cst != KVF_OK)
            kvf_log_debug("request %llu: prefix cache keeps only part of it: %s",
                          (unsigned long long)r->req_id, kvf_status_str(cst));
    }
    kvf_node_prefix_report(&p->pc, PF_SEND_MS);
    send_prefill_done(p, r, compute_us, handoff_us);
    if (send_kv_ready(p, r, compute_us, handoff_us) != KVF_OK) {
        /* D cannot seal without it; its lease releases the blocks. */
        pf_req_fail(p, r, KVF_ERR_PEER, "kv ready not delivered to the decode node");
        return;
    }
    kvf_log_debug("request %llu epoch %llu done: first token %u, %llu kv bytes, compute %llu us, "
                  "handoff %llu us",
                  (unsigned long long)r->req_id, (unsigned long long)r->epoch, r->first_token,
                  (unsigned long long)r->kv_bytes, (unsigned long long)compute_us,
                  (unsigned long long)handoff_us);
    p->count.completed++;
    pf_req_destroy(p, r);
}
