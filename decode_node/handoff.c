/* Admission control, handoff state machine and finish rule of the decode
 * node. See handoff.h. */
#include "handoff.h"

void kvf_handoff_init(kvf_handoff_t *h, bool local)
{
    h->state = local ? KVF_HANDOFF_PREFILLING : KVF_HANDOFF_ALLOCATED;
    h->ready = false;
    h->landed_last = false;
}

const char *kvf_handoff_state_name(kvf_handoff_state_t state)
{
    switch (state) {
    case KVF_HANDOFF_ALLOCATED:
        return "allocated";
    case KVF_HANDOFF_WRITING:
        return "writing";
    case KVF_HANDOFF_SEALED:
        return "sealed";
    case KVF_HANDOFF_PREFILLING:
        return "prefilling";
    case KVF_HANDOFF_DECODING:
        return "decoding";
    case KVF_HANDOFF_RELEASING:
        return "releasing";
    case KVF_HANDOFF_RELEASED:
        return "released";
    }
    return "?";
}

bool kvf_handoff_live(const kvf_handoff_t *h)
{
    return h->state != KVF_HANDOFF_RELEASING && h->state != KVF_HANDOFF_RELEASED;
}

/* Both halves of the handoff seen: the K/V is complete. */
static void seal_if_complete(kvf_handoff_t *h)
{
    if (h->ready && h->landed_last)
        h->state = KVF_HANDOFF_SEALED;
}

kvf_status_t kvf_handoff_on_landed(kvf_handoff_t *h, bool last)
{
    if ((h->state != KVF_HANDOFF_ALLOCATED && h->state != KVF_HANDOFF_WRITING) || h->landed_last)
        return KVF_ERR_STALE;
    h->state = KVF_HANDOFF_WRITING;
    if (last)
        h->landed_last = true;
    seal_if_complete(h);
    return KVF_OK;
}

kvf_status_t kvf_handoff_on_ready(kvf_handoff_t *h)
{
    if ((h->state != KVF_HANDOFF_ALLOCATED && h->state != KVF_HANDOFF_WRITING) || h->ready)
        return KVF_ERR_STALE;
    h->ready = true;
    seal_if_complete(h);
    return KVF_OK;
}

kvf_status_t kvf_handoff_start(kvf_handoff_t *h)
{
    if (h->state != KVF_HANDOFF_SEALED && h->state != KVF_HANDOFF_PREFILLING)
        return KVF_ERR_INVAL;
    h->state = KVF_HANDOFF_DECODING;
    return KVF_OK;
}

kvf_status_t kvf_handoff_end(kvf_handoff_t *h)
{
    if (!kvf_handoff_live(h))
        return KVF_ERR_STALE;
    h->state = KVF_HANDOFF_RELEASING;
    return KVF_OK;
}

kvf_status_t kvf_handoff_on_released(kvf_handoff_t *h)
{
    if (h->state != KVF_HANDOFF_RELEASING)
        return KVF_ERR_STALE;
    h->state = KVF_HANDOFF_RELEASED;
    return KVF_OK;
}

kvf_status_t kvf_decode_admit(const kvf_decode_admission_t *a, uint32_t n_tokens, uint32_t max_new,
                              uint32_t *n_blocks_p)
{
    if (n_tokens == 0 || n_tokens >= a->max_context || a->block_size == 0)
        return KVF_ERR_INVAL;
    if (a->live >= a->max_running)
        return KVF_ERR_NO_SPACE;
    /* 64-bit: n_tokens + max_new comes from the network and may wrap. */
    uint64_t positions = (uint64_t)n_tokens + max_new;
    if (positions > a->max_context)
        positions = a->max_context;
    uint64_t blocks = (positions + a->block_size - 1) / a->block_size;
    if (blocks > a->free_blocks)
        return KVF_ERR_NO_SPACE;
    *n_blocks_p = (uint32_t)blocks;
    return KVF_OK;
}

Kvf__FinishReason kvf_decode_finish_reason(bool is_eos, bool ignore_eos, uint32_t gen,
                                           uint32_t max_tokens, uint32_t seq_len,
                                           uint32_t max_context, uint32_t capacity)
{
    if (is_eos && !ignore_eos)
        return KVF__FINISH_REASON__FINISH_STOP;
    if (gen >= max_tokens || seq_len >= max_context || seq_len > capacity)
        return KVF__FINISH_REASON__FINISH_LENGTH;
    return KVF__FINISH_REASON__FINISH_NONE;
}
