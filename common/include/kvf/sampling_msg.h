/* The sampling message (Kvf__Sampling, proto/kvferry.proto) and the
 * sampler's parameters: the one place where the wire values are checked,
 * clamped and converted.
 *
 * The router checks a request's message once (kvf_sampling_msg_check) and
 * completes it (kvf_sampling_msg_complete); from then on the same message
 * travels unchanged to the prefill and the decode node, which both convert
 * it with kvf_sampling_msg_params. So the two nodes can never read the
 * same request differently. */
#ifndef KVF_SAMPLING_MSG_H
#define KVF_SAMPLING_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "kvf/msg.h"
#include "kvf/sampling.h"
#include "kvf/status.h"

/* Most stop strings a request may carry, and the longest one (bytes). */
#define KVF_SAMPLING_MAX_STOP 8
#define KVF_SAMPLING_MAX_STOP_LEN 256
/* Highest temperature accepted. */
#define KVF_SAMPLING_MAX_TEMPERATURE 100.0f

/* Checks the values of s for a model of vocab tokens: temperature finite
 * in 0..KVF_SAMPLING_MAX_TEMPERATURE, top_p in 0..1, top_k at most vocab,
 * at most KVF_SAMPLING_MAX_STOP non-empty stop strings of at most
 * KVF_SAMPLING_MAX_STOP_LEN bytes. KVF_ERR_INVAL with the reason in why
 * (a sentence for people) when one is off. */
kvf_status_t kvf_sampling_msg_check(const Kvf__Sampling *s, int vocab, char *why,
                                    size_t why_len);

/* Completes a checked message for sending: max_tokens 0 becomes
 * default_max, then at most room (the context left after the prompt);
 * without a seed, seed becomes fresh_seed and has_seed is set. */
void kvf_sampling_msg_complete(Kvf__Sampling *s, uint32_t default_max, uint32_t room,
                               uint64_t fresh_seed);

/* The sampler's parameters for s (a message from the wire: checked here
 * again, as everything from the network). top_p 0 or 1 and top_k 0 or at
 * least vocab mean "off". KVF_ERR_INVAL when s is NULL or a value is out
 * of range; *params_p is written only on success. */
kvf_status_t kvf_sampling_msg_params(const Kvf__Sampling *s, int vocab,
                                     kvf_sampling_params_t *params_p);

/* Tokens still to generate after n_generated (0 when none). */
uint32_t kvf_sampling_msg_remaining(const Kvf__Sampling *s, uint32_t n_generated);

/* A deep copy of s (strings included), owned by the caller:
 * kvf_sampling_msg_free(). KVF_ERR_NOMEM. */
kvf_status_t kvf_sampling_msg_copy(const Kvf__Sampling *s, Kvf__Sampling **copy_p);
void kvf_sampling_msg_free(Kvf__Sampling *s);

#endif
