/* A sequence's tokens: its sampler and budget from the message that
 * starts it, joining the running batch, and the finish rule applied to
 * every token it produces. */
#include "decode_internal.h"

#include "kvf/clock.h"
#include "kvf/log.h"
#include "kvf/model.h"

/* A seed for a local request that brings none. */
static uint64_t fresh_seed(kvf_decode_t *d)
{
    uint64_t z = kvf_clock_ns() + (d->seed_mix += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

kvf_status_t dec_sampling_params(const Kvf__Sampling *s, int vocab, kvf_sampling_params_t *p_p)
{
    kvf_sampling_params_t p = kvf_sampling_defaults();
    p.temperature = s->temperature;
    p.top_p = s->top_p == 0 ? 1.0f : s->top_p; /* 0 or 1: off */
    p.top_k = s->top_k >= (uint32_t)vocab ? 0 : (int)s->top_k;
    p.seed = s->seed;
    if (kvf_sampling_validate(&p) != KVF_OK)
        return KVF_ERR_INVAL;
    *p_p = p;
    return KVF_OK;
}

kvf_status_t dec_req_start_generation(kvf_decode_t *d, dec_req_t *r, const dec_gen_spec_t *g)
{
    kvf_sampling_params_t sp = *g->params;
    if (!g->sampling->has_seed && !g->resume_rng)
        sp.seed = fresh_seed(d);
    kvf_status_t st = kvf_sampler_init(&r->sampler, &sp, d->vocab);
    if (st != KVF_OK)
        return st;
    r->has_sampler = true;
    if (g->resume_rng)
        kvf_sampler_set_state(&r->sampler, g->rng_state);
    uint32_t want = g->sampling->max_tokens ? g->sampling->max_tokens : 1;
    uint32_t room = r->max_new ? r->max_new : 1;
    r->max_tokens = want < room ? want : room;
    r->ignore_eos = g->sampling->ignore_eos;
    r->n_generated_before = g->n_generated;
    return KVF_OK;
}

/* The finish rule for r's latest token (gen counted, next_token set). */
static Kvf__FinishReason finish_reason(const kvf_decode_t *d, const dec_req_t *r)
{
    return kvf_decode_finish_reason(kvf_model_is_eos(&d->rt.model->cfg, r->next_token),
                                    r->ignore_eos, r->gen, r->max_tokens, r->n_tokens + r->gen,
                                    d->max_context, r->n_blocks * d->block_size);
}

void dec_req_join(kvf_decode_t *d, dec_req_t *r)
{
    Kvf__FinishReason fin = finish_reason(d, r);
    if (fin != KVF__FINISH_REASON__FINISH_NONE) {
        dec_emit_chunk(d, r, false, 0, fin);
        d->stats.requests_finished++;
        dec_req_end(d, r);
        return;
    }
    KVF_ASSERT(kvf_handoff_start(&r->h) == KVF_OK);
    kvf_log_debug("request %llu epoch %llu joins the batch at position %u",
                  (unsigned long long)r->req_id, (unsigned long long)r->epoch, r->pos);
}

void dec_req_take_token(kvf_decode_t *d, dec_req_t *r, uint32_t tok)
{
    r->gen++;
    r->pos++;
    r->next_token = tok;
    d->stats.tokens_generated++;
    Kvf__FinishReason fin = finish_reason(d, r);
    dec_emit_chunk(d, r, true, tok, fin);
    if (fin != KVF__FINISH_REASON__FINISH_NONE) {
        d->stats.requests_finished++;
        dec_req_end(d, r); /* may free r */
    }
}
