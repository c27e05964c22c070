/* The multiturn trace: drawing it, building a turn's prompt from the
 * answers before it, and what an infinite prefix cache would reuse. See
 * serve_multiturn.h. */
#include "serve_multiturn.h"

#include "kvf/sampling.h"

#include <stdlib.h>
#include <string.h>

uint32_t kvf_multiturn_turns_fitting(const kvf_multiturn_spec_t *spec, int max_pos)
{
    /* The last of T turns holds the system prompt, T user messages and
     * T - 1 answers, and then generates the T-th answer. */
    uint64_t per_turn = (uint64_t)spec->user.hi + spec->output.hi;
    uint32_t fit = 0;
    while (fit < spec->turns &&
           spec->system_tokens + (uint64_t)(fit + 1) * per_turn < (uint64_t)max_pos)
        fit++;
    return fit;
}

/* An id below the vocabulary that is neither EOS nor BOS: a user's token
 * never ends an answer nor looks like the start of a sequence. */
static uint32_t draw_id(const kvf_model_config_t *cfg, uint64_t *rng)
{
    uint64_t vocab = cfg->vocab > 0 ? (uint64_t)cfg->vocab : 1;
    for (int tries = 0; tries < 64; tries++) {
        uint32_t id = (uint32_t)(kvf_splitmix64(rng) % vocab);
        if (!kvf_model_is_eos(cfg, id) && (int64_t)id != cfg->bos_id)
            return id;
    }
    return 0; /* a vocabulary of specials only: nothing better to send */
}

kvf_status_t kvf_multiturn_trace_init(kvf_multiturn_trace_t *t, const kvf_multiturn_spec_t *spec,
                                      const kvf_model_config_t *cfg)
{
    memset(t, 0, sizeof(*t));
    if (spec->system_tokens < 1 || spec->conversations < 1 || spec->turns < 1)
        return KVF_ERR_INVAL;
    uint64_t rng = spec->seed;
    t->n_system = spec->system_tokens;
    t->system = malloc(t->n_system * sizeof(uint32_t));
    t->turns = calloc((size_t)spec->conversations * spec->turns, sizeof(*t->turns));
    if (!t->system || !t->turns)
        return KVF_ERR_NOMEM;
    t->n_conv = spec->conversations;
    t->n_turns = spec->turns;
    for (uint32_t k = 0; k < t->n_system; k++)
        t->system[k] = draw_id(cfg, &rng);
    if (cfg->bos_id >= 0)
        t->system[0] = (uint32_t)cfg->bos_id;
    for (size_t i = 0; i < (size_t)t->n_conv * t->n_turns; i++) {
        kvf_multiturn_turn_t *u = &t->turns[i];
        u->gap = kvf_serve_draw_exp(&rng);
        u->n_user = kvf_len_dist_draw(&spec->user, &rng);
        u->max_tokens = kvf_len_dist_draw(&spec->output, &rng);
        u->user = malloc(u->n_user * sizeof(uint32_t));
        if (!u->user)
            return KVF_ERR_NOMEM;
        for (uint32_t k = 0; k < u->n_user; k++)
            u->user[k] = draw_id(cfg, &rng);
    }
    return KVF_OK;
}

void kvf_multiturn_trace_fini(kvf_multiturn_trace_t *t)
{
    for (size_t i = 0; t->turns && i < (size_t)t->n_conv * t->n_turns; i++)
        free(t->turns[i].user);
    free(t->turns);
    free(t->system);
    memset(t, 0, sizeof(*t));
}

const kvf_multiturn_turn_t *kvf_multiturn_trace_turn(const kvf_multiturn_trace_t *t, uint32_t conv,
                                                     uint32_t turn)
{
    return &t->turns[(size_t)conv * t->n_turns + turn];
}

kvf_status_t kvf_multiturn_trace_prompt(const kvf_multiturn_trace_t *t, uint32_t conv,
                                        uint32_t turn, const uint32_t *const *answers,
                                        const uint32_t *n_answers, uint32_t **prompt_p,
                                        uint32_t *n_prompt_p)
{
    if (conv >= t->n_conv || turn >= t->n_turns)
        return KVF_ERR_INVAL;
    uint64_t n = t->n_system;
    for (uint32_t k = 0; k <= turn; k++)
        n += kvf_multiturn_trace_turn(t, conv, k)->n_user + (k < turn ? n_answers[k] : 0);
    if (n > UINT32_MAX)
        return KVF_ERR_INVAL;
    uint32_t *prompt = malloc(n * sizeof(uint32_t));
    if (!prompt)
        return KVF_ERR_NOMEM;
    uint32_t at = 0;
    memcpy(prompt, t->system, t->n_system * sizeof(uint32_t));
    at += t->n_system;
    for (uint32_t k = 0; k <= turn; k++) {
        const kvf_multiturn_turn_t *u = kvf_multiturn_trace_turn(t, conv, k);
        memcpy(prompt + at, u->user, u->n_user * sizeof(uint32_t));
        at += u->n_user;
        if (k < turn && n_answers[k]) {
            memcpy(prompt + at, answers[k], n_answers[k] * sizeof(uint32_t));
            at += n_answers[k];
        }
    }
    *prompt_p = prompt;
    *n_prompt_p = at;
    return KVF_OK;
}

uint32_t kvf_multiturn_ideal_cached(const uint32_t *prompt, uint32_t n,
                                    const uint32_t *const *earlier, const uint32_t *n_earlier,
                                    size_t count)
{
    if (n < KVF_MULTITURN_MIN_TAIL + KVF_MULTITURN_BLOCK)
        return 0;
    uint32_t cap = (n - KVF_MULTITURN_MIN_TAIL) / KVF_MULTITURN_BLOCK * KVF_MULTITURN_BLOCK;
    uint32_t best = 0;
    for (size_t i = 0; i < count && best < cap; i++) {
        uint32_t lim = n_earlier[i] < cap ? n_earlier[i] : cap;
        uint32_t k = 0;
        while (k < lim && earlier[i][k] == prompt[k])
            k++;
        if (k > best)
            best = k;
    }
    return best / KVF_MULTITURN_BLOCK * KVF_MULTITURN_BLOCK;
}
