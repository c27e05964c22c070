/* One continuous-batching step: gather the rows (every decoding sequence
 * feeds its last token; local prefills fill the rest of the
 * max_batch_tokens budget with prompt chunks, oldest first), one engine
 * forward over them, then each row samples with its own sampler and its
 * token leaves in the step's TokenBatch. */
#include "decode_internal.h"

#include "kvf/clock.h"
#include "kvf/kvcache.h"
#include "kvf/log.h"

/* A device pool computes from its device copy: the transfer landed in the
 * host mirror (a no-op for a host pool). False when r failed (and ended). */
static bool kv_to_device(kvf_decode_t *d, dec_req_t *r)
{
    if (r->local || r->kv_on_device)
        return true;
    uint32_t nb = (r->n_tokens + d->block_size - 1) / d->block_size;
    kvf_status_t st = kvf_kvpool_upload(d->rt.pool, r->blocks, nb);
    if (st != KVF_OK) {
        kvf_log_error("request %llu: kv upload to the device failed: %s",
                      (unsigned long long)r->req_id, kvf_status_str(st));
        dec_req_fail(d, r, st, "decode node: kv upload failed");
        return false;
    }
    r->kv_on_device = true;
    return true;
}

/* One row per decoding sequence: its last token at its position. */
static int gather_decode_rows(kvf_decode_t *d)
{
    int cap = d->cfg.max_running, n = 0;
    for (size_t i = 0; i < d->n_reqs && n < cap; i++) {
        dec_req_t *r = d->reqs[i];
        if (r->h.state != KVF_HANDOFF_DECODING)
            continue;
        if (!kv_to_device(d, r))
            continue; /* (the next request may wait a step: the table shifted) */
        /* Greedy rows take the engine's argmax: on a GPU their logits
         * never leave it. */
        bool greedy = r->has_sampler && kvf_sampler_is_greedy(&r->sampler);
        d->seqs[n] = (kvf_engine_seq_t){.tokens = &r->next_token,
                                        .n_tokens = 1,
                                        .start_pos = r->pos,
                                        .block_ids = r->blocks,
                                        .n_blocks = r->n_blocks,
                                        .logits = greedy ? NULL : d->logits + (size_t)n * d->vocab,
                                        .greedy_token = greedy ? &d->greedy[n] : NULL};
        d->step_reqs[n++] = r;
    }
    return n;
}

/* Prompt chunks of local prefills after the n decode rows; only a prompt's
 * final chunk asks for logits. Returns the rows in all. */
static int gather_prefill_rows(kvf_decode_t *d, int n)
{
    int cap = d->cfg.max_running;
    uint32_t budget = d->cfg.max_batch_tokens > (uint32_t)n ? d->cfg.max_batch_tokens - n : 0;
    /* A full decode batch must not starve local prefills: they always get
     * a quarter of the budget. */
    uint32_t floor = d->cfg.max_batch_tokens / 4 ? d->cfg.max_batch_tokens / 4 : 1;
    if (budget < floor)
        budget = floor;
    for (size_t i = 0; i < d->n_reqs && n < cap && budget > 0; i++) {
        dec_req_t *r = d->reqs[i];
        if (r->h.state != KVF_HANDOFF_PREFILLING || r->tier_pending)
            continue; /* (its blocks are being copied back from a KV tier) */
        uint32_t take = r->n_tokens - r->prefilled;
        if (take > budget)
            take = budget;
        bool final = r->prefilled + take == r->n_tokens;
        d->seqs[n] = (kvf_engine_seq_t){.tokens = r->prompt + r->prefilled,
                                        .n_tokens = take,
                                        .start_pos = r->prefilled,
                                        .block_ids = r->blocks,
                                        .n_blocks = r->n_blocks,
                                        .logits = final ? d->logits + (size_t)n * d->vocab : NULL};
        d->step_reqs[n++] = r;
        budget -= take;
    }
    return n;
}

/* Between layers of a long forward: the heartbeats' snapshot is published,
 * transfer completions are taken (their events wait for the loop) and
 * lease renewals are answered. */
static void on_layer_done(void *arg, int layer)
{
    kvf_decode_t *d = arg;
    (void)layer;
    (void)kvf_node_tick(d->node);
    (void)kvf_xfer_progress(d->xfer);
    dec_inbox_during_step(d);
}

/* The engine forward over n rows; every row's request fails if it does. */
static kvf_status_t forward(kvf_decode_t *d, int n, uint64_t *step_us_p)
{
    kvf_engine_hooks_t hooks = {.on_layer_done = on_layer_done, .arg = d};
    uint64_t t0 = kvf_clock_ns(), cpu0 = kvf_clock_cpu_ns();
    kvf_status_t st = kvf_engine_forward(d->rt.engine, d->seqs, n, &hooks);
    *step_us_p = (kvf_clock_ns() - t0) / 1000;
    d->stats.steps++;
    /* the CPU time says how much of its cores the node got meanwhile */
    /* what the step carried, for the simulator's calibration
     * (docs/simulator.md): decode rows and the context they read, prompt
     * tokens and the tokens before them */
    if (kvf_log_level <= KVF_LOG_DEBUG) {
        int decode = 0;
        unsigned long long ctx = 0, prompt = 0, before = 0;
        for (int i = 0; i < n; i++) {
            const kvf_engine_seq_t *s = &d->seqs[i];
            if (d->step_reqs[i]->h.state == KVF_HANDOFF_PREFILLING) {
                prompt += s->n_tokens;
                before += s->start_pos;
            } else {
                decode++;
                ctx += s->start_pos + 1;
            }
        }
        kvf_log_debug("step: %d rows in %llu us, cpu %llu us: %d decoding (context %llu), %llu "
                      "prompt tokens (after %llu)",
                      n, (unsigned long long)*step_us_p,
                      (unsigned long long)((kvf_clock_cpu_ns() - cpu0) / 1000), decode, ctx,
                      prompt, before);
    }
    if (st == KVF_OK)
        return KVF_OK;
    kvf_log_error("decode step over %d sequences failed: %s", n, kvf_status_str(st));
    for (int i = 0; i < n; i++)
        dec_req_fail(d, d->step_reqs[i], st, "decode node: forward failed");
    return st;
}

/* A local prefill's chunk was computed; after its last one it samples its
 * first token, reports the prefill done and joins the batch, its first
 * token going out with this step's tokens. */
static void prefill_row_done(kvf_decode_t *d, dec_req_t *r, const kvf_engine_seq_t *row,
                             uint64_t step_us)
{
    r->prefilled += row->n_tokens;
    r->prefill_us += step_us;
    if (!row->logits)
        return;
    uint32_t first = kvf_sampler_sample(&r->sampler, row->logits);
    /* Its timings, and the router's word that the prefill is over. */
    dec_send_prefill_done(d, r);
    dec_req_join(d, r, first); /* may free r */
}

void dec_step(kvf_decode_t *d)
{
    int n = gather_prefill_rows(d, gather_decode_rows(d));
    if (n == 0)
        return;
    uint64_t step_us = 0;
    if (forward(d, n, &step_us) != KVF_OK)
        return;
    for (int i = 0; i < n; i++) {
        dec_req_t *r = d->step_reqs[i];
        const kvf_engine_seq_t *row = &d->seqs[i];
        if (r->h.state == KVF_HANDOFF_PREFILLING) {
            prefill_row_done(d, r, row, step_us);
            continue;
        }
        r->kv_len = row->start_pos + 1; /* the step wrote its token's K/V */
        dec_req_take_token(d, r,
                           row->logits ? kvf_sampler_sample(&r->sampler, row->logits)
                                       : d->greedy[i]);
    }
    dec_flush_chunks(d);
}

bool dec_has_work(const kvf_decode_t *d)
{
    for (size_t i = 0; i < d->n_reqs; i++) {
        kvf_handoff_state_t s = d->reqs[i]->h.state;
        if (s == KVF_HANDOFF_DECODING || (s == KVF_HANDOFF_PREFILLING && !d->reqs[i]->tier_pending))
            return true;
    }
    return false;
}
