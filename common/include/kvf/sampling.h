/* Token sampling: greedy, temperature, top-k, top-p, seeded.
 *
 * The sampler's whole random state is one uint64_t (splitmix64): it can be
 * read after any step and restored elsewhere (shipped in control messages),
 * and the restored sampler makes the same choices as the original would
 * have. Each sampled token consumes exactly one 64-bit draw; greedy draws
 * nothing. */
#ifndef KVF_SAMPLING_H
#define KVF_SAMPLING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvf/status.h"

typedef struct {
    float temperature; /* 0 (or below 1e-6): greedy */
    int top_k;         /* 0: no limit */
    float top_p;       /* 1: no limit; in (0, 1] */
    uint64_t seed;
} kvf_sampling_params_t;

/* temperature 0, top_k 0, top_p 1, seed 0. */
kvf_sampling_params_t kvf_sampling_defaults(void);

/* Checks ranges (temperature >= 0 and finite, top_k >= 0, top_p in (0, 1]). */
kvf_status_t kvf_sampling_validate(const kvf_sampling_params_t *params);

typedef struct {
    kvf_sampling_params_t params;
    uint64_t rng;   /* the whole random state */
    int vocab;
    float *probs;   /* (vocab) scratch */
    int32_t *order; /* (vocab) scratch */
} kvf_sampler_t;

/* Caller owns the struct; init allocates the scratch (fini frees it). The
 * random state starts from params->seed. */
kvf_status_t kvf_sampler_init(kvf_sampler_t *s, const kvf_sampling_params_t *params, int vocab);
void kvf_sampler_fini(kvf_sampler_t *s);

/* True when the sampler always takes the largest logit (temperature 0 or
 * top_k 1): the engine can then find the token where the logits are
 * (kvf_engine_seq_t.greedy_token) and nothing is drawn. */
bool kvf_sampler_is_greedy(const kvf_sampler_t *s);

/* Picks a token from logits (vocab floats, unchanged). */
uint32_t kvf_sampler_sample(kvf_sampler_t *s, const float *logits);

/* The random state, to ship or to restore. */
uint64_t kvf_sampler_state(const kvf_sampler_t *s);
void kvf_sampler_set_state(kvf_sampler_t *s, uint64_t state);

/* splitmix64: advances *state and returns the next 64-bit draw. The one
 * generator of the project's seeded randomness (sampling, random models). */
static inline uint64_t kvf_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Index of the largest of n logits, the lowest index on ties (NaN never wins). */
uint32_t kvf_sample_argmax(const float *logits, int n);

#endif
