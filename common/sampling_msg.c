/* The sampling message: checks, completion and conversion in one place.
 * See kvf/sampling_msg.h. */
#include "kvf/sampling_msg.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kvf_status_t kvf_sampling_msg_check(const Kvf__Sampling *s, int vocab, char *why,
                                    size_t why_len)
{
    if (!s) {
        snprintf(why, why_len, "no sampling parameters");
        return KVF_ERR_INVAL;
    }
    if (!isfinite(s->temperature) || s->temperature < 0 ||
        s->temperature > KVF_SAMPLING_MAX_TEMPERATURE) {
        snprintf(why, why_len, "temperature %g is outside 0..%g", s->temperature,
                 KVF_SAMPLING_MAX_TEMPERATURE);
        return KVF_ERR_INVAL;
    }
    if (!isfinite(s->top_p) || s->top_p < 0 || s->top_p > 1) {
        snprintf(why, why_len, "top_p %g is outside 0..1", s->top_p);
        return KVF_ERR_INVAL;
    }
    if (vocab <= 0 || s->top_k > (uint32_t)vocab) {
        snprintf(why, why_len, "top_k %u is larger than the vocabulary (%d)", s->top_k, vocab);
        return KVF_ERR_INVAL;
    }
    if (s->n_stop > KVF_SAMPLING_MAX_STOP) {
        snprintf(why, why_len, "at most %d stop strings", KVF_SAMPLING_MAX_STOP);
        return KVF_ERR_INVAL;
    }
    for (size_t i = 0; i < s->n_stop; i++) {
        size_t len = s->stop[i] ? strnlen(s->stop[i], KVF_SAMPLING_MAX_STOP_LEN + 1) : 0;
        if (len == 0) {
            snprintf(why, why_len, "empty stop string");
            return KVF_ERR_INVAL;
        }
        if (len > KVF_SAMPLING_MAX_STOP_LEN) {
            snprintf(why, why_len, "stop string longer than %d bytes", KVF_SAMPLING_MAX_STOP_LEN);
            return KVF_ERR_INVAL;
        }
    }
    return KVF_OK;
}

void kvf_sampling_msg_complete(Kvf__Sampling *s, uint32_t default_max, uint32_t room,
                               uint64_t fresh_seed)
{
    if (!s->max_tokens)
        s->max_tokens = default_max;
    if (s->max_tokens > room)
        s->max_tokens = room;
    if (!s->has_seed) {
        s->seed = fresh_seed;
        s->has_seed = true;
    }
}

kvf_status_t kvf_sampling_msg_params(const Kvf__Sampling *s, int vocab,
                                     kvf_sampling_params_t *params_p)
{
    char why[128];
    if (kvf_sampling_msg_check(s, vocab, why, sizeof(why)) != KVF_OK)
        return KVF_ERR_INVAL;
    kvf_sampling_params_t p = kvf_sampling_defaults();
    p.temperature = s->temperature;
    p.top_p = s->top_p == 0.0f ? 1.0f : s->top_p;
    p.top_k = s->top_k >= (uint32_t)vocab ? 0 : (int)s->top_k;
    p.seed = s->seed;
    if (kvf_sampling_validate(&p) != KVF_OK)
        return KVF_ERR_INVAL;
    *params_p = p;
    return KVF_OK;
}

uint32_t kvf_sampling_msg_remaining(const Kvf__Sampling *s, uint32_t n_generated)
{
    return s && s->max_tokens > n_generated ? s->max_tokens - n_generated : 0;
}

kvf_status_t kvf_sampling_msg_copy(const Kvf__Sampling *s, Kvf__Sampling **copy_p)
{
    /* Through the wire format: protobuf-c then owns every string. */
    size_t len = kvf__sampling__get_packed_size(s);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf)
        return KVF_ERR_NOMEM;
    kvf__sampling__pack(s, buf);
    Kvf__Sampling *copy = kvf__sampling__unpack(NULL, len, buf);
    free(buf);
    if (!copy)
        return KVF_ERR_NOMEM;
    *copy_p = copy;
    return KVF_OK;
}

void kvf_sampling_msg_free(Kvf__Sampling *s)
{
    if (s)
        kvf__sampling__free_unpacked(s, NULL);
}
