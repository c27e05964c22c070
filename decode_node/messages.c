/* Control messages the decode node receives (docs/PROTOCOL.md): KvAlloc
 * and KvReady from prefill nodes, PrefillRequest (--prefill-local) and
 * Cancel from the router. Each handler checks its message's own fields;
 * admission is admit.c's, the sequence's start generate.c's. */
#include "decode_internal.h"

#include "kvf/log.h"
#include "kvf/sampling_msg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Longest URL accepted in a message (reply inboxes). */
#define DECODE_URL_MAX 512

static bool url_ok(const char *url)
{
    size_t n = url ? strnlen(url, DECODE_URL_MAX + 1) : 0;
    return n > 0 && n <= DECODE_URL_MAX &&
           (!strncmp(url, "tcp://", 6) || !strncmp(url, "ipc://", 6) ||
            !strncmp(url, "inproc://", 9));
}

/* ---- KvAlloc ---------------------------------------------------------------- */

void dec_reply_kv_alloc(kvf_decode_t *d, uint64_t req_id, uint64_t epoch, const char *inbox,
                        kvf_status_t status, const char *error, const dec_req_t *r)
{
    Kvf__KvAllocReply rep = KVF__KV_ALLOC_REPLY__INIT;
    rep.req_id = req_id;
    rep.epoch = epoch;
    rep.status = status;
    rep.error = (char *)(error ? error : "");
    if (r) {
        rep.n_block_ids = r->n_blocks;
        rep.block_ids = r->blocks;
        rep.lease_ms = d->cfg.lease_ms;
        rep.cached_blocks = r->cached_blocks;
    }
    kvf_envelope_t env;
    kvf_envelope_init(&env, kvf_node_id(d->node));
    env.body_case = KVF__ENVELOPE__BODY_KV_ALLOC_REPLY;
    env.kv_alloc_reply = &rep;
    kvf_status_t st = kvf_node_send(d->node, inbox, &env, KVF_DECODE_SEND_TIMEOUT_MS);
    if (st == KVF_OK)
        return;
    kvf_log_warn("request %llu: kv alloc reply to %s dropped: %s", (unsigned long long)req_id,
                 inbox, kvf_status_str(st));
    if (!r)
        return;
    /* The prefill node will never write: give the blocks back now rather
     * than at the end of the lease. */
    dec_req_t *live = dec_req_find(d, req_id, epoch);
    if (live && kvf_handoff_live(&live->h))
        dec_req_fail(d, live, KVF_ERR_PEER,
                     "decode node could not answer the prefill node's kv alloc");
}

static void on_kv_alloc(kvf_decode_t *d, const Kvf__KvAlloc *m)
{
    if (!m->req_id || !m->epoch || !url_ok(m->reply_inbox)) {
        d->stats.malformed_dropped++;
        kvf_log_warn("kv alloc with bad req_id, epoch or reply inbox dropped");
        return;
    }
    dec_admit_spec_t spec = {
        .req_id = m->req_id,
        .epoch = m->epoch,
        .local = false,
        .n_tokens = m->n_tokens,
        .max_new = m->max_new_tokens,
        .sender = m->prefill_node_id && *m->prefill_node_id ? m->prefill_node_id : NULL,
        .reply_inbox = m->reply_inbox,
        .what = "kv alloc",
    };
    /* The prefix the prefill node hopes this node holds: as many hashes as
     * whole blocks of tokens came with them. */
    if (m->n_prefix_hashes && m->n_prefix_token_ids == m->n_prefix_hashes * d->block_size) {
        spec.prefix_hashes = m->prefix_hashes;
        spec.prefix_tokens = m->prefix_token_ids;
        spec.n_prefix = (uint32_t)m->n_prefix_hashes;
        spec.cache_salt = m->cache_salt.data;
        spec.cache_salt_len = m->cache_salt.len;
    }
    char why[160] = "";
    dec_req_t *r = NULL;
    kvf_status_t st = dec_admit(d, &spec, why, sizeof(why), &r);
    /* (an answer waiting for copies from the tiers goes when they are in:
     * decode_node/tiers.c) */
    if ((st == KVF_OK || (st == KVF_ERR_AGAIN && r->h.state == KVF_HANDOFF_ALLOCATED &&
                          !r->local)) && /* a duplicate: the reply may have been lost */
        !r->alloc_reply_to)
        dec_reply_kv_alloc(d, m->req_id, m->epoch, m->reply_inbox, KVF_OK, NULL, r);
    else if (st != KVF_OK && st != KVF_ERR_AGAIN && st != KVF_ERR_STALE)
        dec_reply_kv_alloc(d, m->req_id, m->epoch, m->reply_inbox, st, why, NULL);
}

/* ---- starting generation ---------------------------------------------------- */

/* The generation spec of m, a KvReady or a local PrefillRequest, which
 * carry what it needs under the same names: the sampling message (params_:
 * its checked params), the request's tokens with the last n_generated
 * already streamed, and the sampler state to go on from when resume_. */
#define DECODE_GEN_SPEC(m, params_, resume_)                                                       \
    ((dec_gen_spec_t){                                                                             \
        .sampling = (m)->sampling,                                                                 \
        .params = (params_),                                                                       \
        .token_ids = (m)->token_ids,                                                               \
        .n_token_ids = (m)->n_token_ids,                                                           \
        .n_generated = (m)->n_generated,                                                           \
        .resume_rng = (resume_),                                                                   \
        .rng_state = (m)->rng_state,                                                               \
    })

/* Starts r's generation (dec_req_start_generation); on an error r fails. */
static kvf_status_t start_generation(kvf_decode_t *d, dec_req_t *r, const dec_gen_spec_t *g)
{
    kvf_status_t st = dec_req_start_generation(d, r, g);
    if (st != KVF_OK) {
        kvf_log_error("request %llu: sampler or text stream: %s", (unsigned long long)r->req_id,
                      kvf_status_str(st));
        dec_req_fail(d, r, st, "decode node: generation setup failed");
    }
    return st;
}

/* ---- KvReady ---------------------------------------------------------------- */

/* Finds the live request a message of (req_id, epoch) is about; counts
 * and logs it as stale when it is another epoch's or the request is gone. */
static dec_req_t *req_for_message(kvf_decode_t *d, uint64_t req_id, uint64_t epoch,
                                  const char *what)
{
    dec_req_t *r = dec_req_find_live(d, req_id);
    if (!r || r->epoch != epoch) {
        d->stats.stale_dropped++;
        kvf_log_info("request %llu epoch %llu: %s dropped (%s)", (unsigned long long)req_id,
                     (unsigned long long)epoch, what, r ? "another epoch is live" : "not here");
        return NULL;
    }
    return r;
}

/* What is wrong with KvReady m for r, or NULL; *sp_p: its sampling. */
static const char *kv_ready_problem(const kvf_decode_t *d, const dec_req_t *r,
                                    const Kvf__KvReady *m, kvf_sampling_params_t *sp_p)
{
    if (r->local)
        return "kv ready for a request prefilled here";
    if (m->n_tokens != r->n_tokens)
        return "kv ready token count differs from the kv alloc";
    if (m->first_token >= (uint32_t)d->vocab)
        return "first token outside the vocabulary";
    if (kvf_sampling_msg_params(m->sampling, d->vocab, sp_p) != KVF_OK)
        return "bad sampling settings";
    if (m->n_generated > m->n_token_ids)
        return "n_generated above the token count";
    /* The tokens already streamed rebuild the request's text. */
    for (size_t i = m->n_token_ids - m->n_generated; i < m->n_token_ids; i++)
        if (m->token_ids[i] >= (uint32_t)d->vocab)
            return "token id outside the vocabulary";
    return NULL;
}

static void on_kv_ready(kvf_decode_t *d, const Kvf__KvReady *m)
{
    dec_req_t *r = req_for_message(d, m->req_id, m->epoch, "kv ready");
    if (!r)
        return;
    kvf_sampling_params_t sp;
    const char *bad = kv_ready_problem(d, r, m, &sp);
    if (bad) {
        d->stats.malformed_dropped++;
        kvf_log_warn("request %llu epoch %llu: %s", (unsigned long long)m->req_id,
                     (unsigned long long)m->epoch, bad);
        dec_req_fail(d, r, KVF_ERR_INVAL, "decode node: %s", bad);
        return;
    }
    if (kvf_handoff_on_ready(&r->h) != KVF_OK) {
        d->stats.malformed_dropped++;
        kvf_log_warn("request %llu epoch %llu: unexpected kv ready in state %s",
                     (unsigned long long)m->req_id, (unsigned long long)m->epoch,
                     kvf_handoff_state_name(r->h.state));
        return;
    }
    /* The prefill node sampled the first token; continue its stream. */
    dec_gen_spec_t g = DECODE_GEN_SPEC(m, &sp, true);
    if (start_generation(d, r, &g) != KVF_OK)
        return;
    r->first_token = m->first_token;
    r->relay_prefill = true;
    r->pf_compute_us = m->prefill_compute_us;
    r->pf_handoff_us = m->handoff_us;
    r->pf_kv_bytes = m->kv_bytes;
    r->pf_cached_tokens = m->cached_tokens;
    if (r->h.state == KVF_HANDOFF_SEALED)
        dec_req_join(d, r, r->first_token);
}

/* ---- Cancel ----------------------------------------------------------------- */

static void on_cancel(kvf_decode_t *d, const Kvf__Cancel *m)
{
    dec_req_t *r = dec_req_find_live(d, m->req_id);
    /* The attempt's KvAlloc comes from its prefill node, on another
     * connection: it may still be on its way. Remembered, it is refused
     * when it comes instead of holding blocks nobody will seal. */
    if (!r || (m->epoch && m->epoch > r->epoch)) {
        if (m->req_id && !dec_req_seen_epoch(d, m->req_id, m->epoch ? m->epoch : UINT64_MAX))
            dec_req_note_cancelled(d, m->req_id, m->epoch);
        kvf_log_debug("cancel of request %llu epoch %llu: not here yet",
                      (unsigned long long)m->req_id, (unsigned long long)m->epoch);
        return;
    }
    if (m->epoch && m->epoch != r->epoch) {
        d->stats.stale_dropped++;
        kvf_log_info("request %llu: cancel of epoch %llu dropped (working on %llu)",
                     (unsigned long long)m->req_id, (unsigned long long)m->epoch,
                     (unsigned long long)r->epoch);
        return;
    }
    kvf_log_info("request %llu epoch %llu cancelled in state %s (%s)",
                 (unsigned long long)r->req_id, (unsigned long long)r->epoch,
                 kvf_handoff_state_name(r->h.state), m->reason);
    d->stats.requests_cancelled++;
    /* Its writer died while it may have been sending here: its last
     * message may block the transport's queue for every sender
     * (docs/transfer-recovery.md). */
    if (m->writer_lost && r->reserved)
        d->relisten_wanted = true;
    dec_req_end(d, r);
}

/* ---- PrefillRequest (--prefill-local) --------------------------------------- */

/* What is wrong with PrefillRequest m, or NULL; *status_p: the status to
 * answer with, *sp_p: its sampling. */
static const char *prefill_request_problem(const kvf_decode_t *d, const Kvf__PrefillRequest *m,
                                           kvf_status_t *status_p, kvf_sampling_params_t *sp_p)
{
    *status_p = KVF_ERR_INVAL;
    if (!d->cfg.prefill_local) {
        *status_p = KVF_ERR_UNSUPPORTED;
        return "this decode node does not prefill (no --prefill-local)";
    }
    if (!m->req_id || !m->epoch)
        return "bad req_id or epoch";
    if (strcmp(m->decode_node_id, kvf_node_id(d->node)) != 0)
        return "prefill request names another decode node";
    if (m->n_token_ids == 0)
        return "empty prompt";
    if (m->n_token_ids >= UINT32_MAX)
        return "prompt too long";
    if (kvf_sampling_msg_params(m->sampling, d->vocab, sp_p) != KVF_OK)
        return "bad sampling settings";
    if (m->n_generated > m->n_token_ids)
        return "n_generated above the token count";
    for (size_t i = 0; i < m->n_token_ids; i++)
        if (m->token_ids[i] >= (uint32_t)d->vocab)
            return "token id outside the vocabulary";
    return NULL;
}

static void on_prefill_request(kvf_decode_t *d, const Kvf__PrefillRequest *m)
{
    kvf_status_t st;
    kvf_sampling_params_t sp;
    const char *bad = prefill_request_problem(d, m, &st, &sp);
    if (bad) {
        d->stats.malformed_dropped++;
        kvf_log_warn("prefill request %llu epoch %llu dropped: %s", (unsigned long long)m->req_id,
                     (unsigned long long)m->epoch, bad);
        if (m->req_id)
            dec_send_error(d, m->req_id, m->epoch, st, "decode node: %s", bad);
        return;
    }
    dec_admit_spec_t spec = {
        .req_id = m->req_id,
        .epoch = m->epoch,
        .local = true,
        .n_tokens = (uint32_t)m->n_token_ids,
        .max_new = kvf_sampling_msg_remaining(m->sampling, m->n_generated),
        .prompt = m->token_ids,
        .cache_salt = m->cache_salt.data,
        .cache_salt_len = m->cache_salt.len,
        .what = "prefill request",
    };
    char why[160] = "";
    dec_req_t *r = NULL;
    st = dec_admit(d, &spec, why, sizeof(why), &r);
    if (st == KVF_ERR_AGAIN || st == KVF_ERR_STALE)
        return;
    if (st != KVF_OK) {
        dec_send_error(d, m->req_id, m->epoch, st, "decode node: %s", why);
        return;
    }
    dec_gen_spec_t g = DECODE_GEN_SPEC(m, &sp, m->n_generated > 0);
    start_generation(d, r, &g);
}

/* ---- KvLease ------------------------------------------------------------------ */

/* Renews each named reservation that m's sender holds here and is still
 * writing (docs/PROTOCOL.md, Liveness), and says which. */
static void on_kv_lease(kvf_decode_t *d, const Kvf__KvLease *m)
{
    if (!m->sent_ns || !url_ok(m->reply_inbox) || !m->prefill_node_id) {
        d->stats.malformed_dropped++;
        return;
    }
    Kvf__WorkRef **renewed = m->n_refs ? calloc(m->n_refs, sizeof(*renewed)) : NULL;
    if (m->n_refs && !renewed)
        return; /* unanswered: the sender's lease end stays where it was */
    size_t n = 0;
    for (size_t i = 0; i < m->n_refs; i++) {
        const Kvf__WorkRef *w = m->refs[i];
        dec_req_t *r = w->epoch ? dec_req_find(d, w->req_id, w->epoch) : NULL;
        if (!r || !r->reserved || !r->sender || strcmp(r->sender, m->prefill_node_id) != 0 ||
            (r->h.state != KVF_HANDOFF_ALLOCATED && r->h.state != KVF_HANDOFF_WRITING))
            continue;
        if (kvf_xfer_renew(d->xfer, r->req_id, r->epoch) != KVF_OK)
            continue;
        dec_renew_seal_deadline(d, r);
        renewed[n++] = m->refs[i];
    }
    Kvf__KvLeaseReply rep = KVF__KV_LEASE_REPLY__INIT;
    rep.sent_ns = m->sent_ns;
    rep.lease_ms = d->cfg.lease_ms;
    rep.renewed = renewed;
    rep.n_renewed = n;
    kvf_envelope_t env;
    kvf_envelope_init(&env, kvf_node_id(d->node));
    env.body_case = KVF__ENVELOPE__BODY_KV_LEASE_REPLY;
    env.kv_lease_reply = &rep;
    /* A lost answer costs nothing but this renewal on the sender's side. */
    (void)kvf_node_send(d->node, m->reply_inbox, &env, 0);
    free(renewed);
}

/* ---- dispatch --------------------------------------------------------------- */

void dec_on_envelope(kvf_decode_t *d, const kvf_envelope_t *env)
{
    if (kvf_node_handle(d->node, env) || kvf_node_prefix_handle(&d->pc, env))
        return;
    switch (env->body_case) {
    case KVF__ENVELOPE__BODY_KV_ALLOC:
        on_kv_alloc(d, env->kv_alloc);
        break;
    case KVF__ENVELOPE__BODY_KV_READY:
        on_kv_ready(d, env->kv_ready);
        break;
    case KVF__ENVELOPE__BODY_CANCEL:
        on_cancel(d, env->cancel);
        break;
    case KVF__ENVELOPE__BODY_KV_LEASE:
        on_kv_lease(d, env->kv_lease);
        break;
    case KVF__ENVELOPE__BODY_PREFILL_REQUEST:
        on_prefill_request(d, env->prefill_request);
        break;
    case KVF__ENVELOPE__BODY_ERROR:
        /* The router's word on a request; it already acts on it (Cancel
         * follows when blocks must go). */
        kvf_log_info("error from %s about request %llu: %s (%s)", env->sender,
                     (unsigned long long)env->error->req_id, env->error->message,
                     kvf_status_str((kvf_status_t)env->error->status));
        break;
    default:
        d->stats.malformed_dropped++;
        kvf_log_warn("unexpected %s message from '%s' dropped", kvf_envelope_body_name(env),
                     env->sender);
        break;
    }
}
