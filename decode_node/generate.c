/* A sequence's tokens: its sampler, budget and text stream from the
 * message that starts it, joining the running batch with its first token,
 * and the finish rule applied to every token it produces. Every finish of
 * a request is decided here (docs/PROTOCOL.md, step 8): EOS, a stop string,
 * max_tokens, the context and the blocks. */
#include "decode_internal.h"

#include "kvf/log.h"
#include "kvf/model.h"
#include "kvf/sampling_msg.h"

kvf_status_t dec_req_start_generation(kvf_decode_t *d, dec_req_t *r, const dec_gen_spec_t *g)
{
    const Kvf__Sampling *s = g->sampling;
    /* The router gave the request its seed: every epoch and both nodes
     * sample from the same stream. */
    kvf_status_t st = kvf_sampler_init(&r->sampler, g->params, d->vocab);
    if (st != KVF_OK)
        return st;
    r->has_sampler = true;
    if (g->resume_rng)
        kvf_sampler_set_state(&r->sampler, g->rng_state);
    /* max_tokens counts the whole request; the blocks taken at admission
     * bound it too. */
    uint32_t left = kvf_sampling_msg_remaining(s, g->n_generated);
    r->max_tokens = r->max_new && r->max_new < left ? r->max_new : left;
    r->ignore_eos = s->ignore_eos;
    r->n_generated_before = g->n_generated;
    st = kvf_textstream_create(d->tok, (const char *const *)s->stop, s->n_stop, &r->text);
    if (st != KVF_OK)
        return st;
    if (d->pc.cache)
        dec_prefix_keep_ids(r, g->token_ids, g->n_token_ids);
    /* The client already has the text of the tokens earlier epochs
     * streamed: the stream continues after them. */
    if (!g->n_generated)
        return KVF_OK;
    return kvf_textstream_replay(r->text, g->token_ids + (g->n_token_ids - g->n_generated),
                                 g->n_generated);
}

/* Adds the text the stream still holds back (the request ends). */
static void add_held_text(kvf_decode_t *d, dec_req_t *r)
{
    const char *text = NULL;
    size_t len = 0;
    if (kvf_textstream_finish(r->text, &text, &len) == KVF_OK)
        dec_chunk_add_text(d, text, len);
}

/* Ends r with the chunk that says why (its text already added). */
static void finish(kvf_decode_t *d, dec_req_t *r, bool has_token, uint32_t tok,
                   Kvf__FinishReason why)
{
    dec_prefix_list_all(d, r); /* before its blocks go back */
    dec_emit_chunk(d, r, has_token, tok, why);
    d->stats.requests_finished++;
    kvf_log_debug("request %llu epoch %llu finished (%d) after %u tokens",
                  (unsigned long long)r->req_id, (unsigned long long)r->epoch, (int)why,
                  r->n_generated_before + r->gen);
    dec_req_end(d, r); /* may free r */
}

void dec_req_take_token(kvf_decode_t *d, dec_req_t *r, uint32_t tok)
{
    d->stats.tokens_generated++;
    uint32_t gen = r->gen + 1; /* if tok is kept */
    uint32_t seq_len = r->n_tokens + gen;
    Kvf__FinishReason why = kvf_decode_finish_reason(kvf_model_is_eos(&d->rt.model->cfg, tok),
                                                     r->ignore_eos, gen, r->max_tokens, seq_len,
                                                     d->max_context, r->n_blocks * d->block_size);
    if (why == KVF__FINISH_REASON__FINISH_STOP) {
        /* EOS: the client never sees it, so it is neither in the chunk nor
         * counted. */
        add_held_text(d, r);
        finish(d, r, false, 0, why);
        return;
    }
    r->gen = gen;
    dec_prefix_note_token(r, tok);
    const char *text = NULL;
    size_t len = 0;
    bool stopped = false;
    if (kvf_textstream_push(r->text, tok, &text, &len, &stopped) == KVF_OK)
        dec_chunk_add_text(d, text, len);
    if (stopped) {
        /* The token stays (the client's tokens are the model's); the text
         * ends before the stop string. */
        finish(d, r, true, tok, KVF__FINISH_REASON__FINISH_STOP);
        return;
    }
    if (why != KVF__FINISH_REASON__FINISH_NONE) {
        add_held_text(d, r);
        finish(d, r, true, tok, why);
        return;
    }
    dec_emit_chunk(d, r, true, tok, KVF__FINISH_REASON__FINISH_NONE);
    r->next_token = tok;
    r->pos = seq_len - 1;
}

void dec_req_join(kvf_decode_t *d, dec_req_t *r, uint32_t first)
{
    if (r->max_tokens == 0) {
        /* Earlier epochs generated everything already. */
        add_held_text(d, r);
        finish(d, r, false, 0, KVF__FINISH_REASON__FINISH_LENGTH);
        return;
    }
    KVF_ASSERT(kvf_handoff_start(&r->h) == KVF_OK);
    r->kv_len = r->n_tokens;
    dec_prefix_list(d, r); /* sealed: its shipped prompt blocks are complete */
    kvf_log_debug("request %llu epoch %llu joins the batch at position %u",
                  (unsigned long long)r->req_id, (unsigned long long)r->epoch, r->n_tokens);
    dec_req_take_token(d, r, first); /* may end and free r */
}
