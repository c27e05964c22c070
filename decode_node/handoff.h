/* The decode node's per-request logic that needs no sockets, model or
 * transport: admission control, the handoff state machine and the finish
 * rule. Private to decode_node/ (linked into kvf-decode and its unit tests).
 *
 * Handoff state machine (docs/PROTOCOL.md, step 6), one per (req_id, epoch):
 *
 *   ALLOCATED --LANDED--> WRITING --LANDED(last)+KvReady--> SEALED
 *   ALLOCATED --KvReady--> (still ALLOCATED, ready noted)
 *   SEALED --joins the batch--> DECODING --finish/cancel--> RELEASING
 *   any live state --cancel/expire/fail--> RELEASING --RELEASED--> RELEASED
 *
 * A sequence prefilled by this node itself (--prefill-local) has no
 * transfer: PREFILLING --first token--> DECODING --> RELEASING --> RELEASED
 * (its RELEASING is left at once: no write can land in local blocks). */
#ifndef KVF_DECODE_HANDOFF_H
#define KVF_DECODE_HANDOFF_H

#include <stdbool.h>
#include <stdint.h>

#include "kvf/status.h"
#include "kvferry.pb-c.h"

typedef enum {
    KVF_HANDOFF_ALLOCATED = 0, /* blocks reserved, nothing landed yet */
    KVF_HANDOFF_WRITING,       /* at least one batch landed */
    KVF_HANDOFF_SEALED,        /* LANDED(last) and KvReady both seen: K/V complete */
    KVF_HANDOFF_PREFILLING,    /* --prefill-local: this node computes the K/V */
    KVF_HANDOFF_DECODING,      /* in the running batch */
    KVF_HANDOFF_RELEASING,     /* ended; blocks wait for the transport's RELEASED */
    KVF_HANDOFF_RELEASED,      /* blocks are back in the pool */
} kvf_handoff_state_t;

typedef struct {
    kvf_handoff_state_t state;
    bool ready;       /* KvReady received */
    bool landed_last; /* the transfer's LANDED event with last received */
} kvf_handoff_t;

/* A fresh handoff in ALLOCATED (remote prefill) or PREFILLING (local). */
void kvf_handoff_init(kvf_handoff_t *h, bool local);

const char *kvf_handoff_state_name(kvf_handoff_state_t state);

/* True for ALLOCATED..DECODING: the request still counts against
 * max_running and may receive messages. */
bool kvf_handoff_live(const kvf_handoff_t *h);

/* A LANDED event. KVF_ERR_STALE when the request cannot take one (after
 * the last batch, or not waiting for a transfer); state unchanged then. */
kvf_status_t kvf_handoff_on_landed(kvf_handoff_t *h, bool last);

/* KvReady. KVF_ERR_STALE for a duplicate or an unexpected one. */
kvf_status_t kvf_handoff_on_ready(kvf_handoff_t *h);

/* SEALED or PREFILLING -> DECODING. KVF_ERR_INVAL from another state. */
kvf_status_t kvf_handoff_start(kvf_handoff_t *h);

/* Any live state -> RELEASING (finished, cancelled, expired, failed).
 * KVF_ERR_STALE when already ending. */
kvf_status_t kvf_handoff_end(kvf_handoff_t *h);

/* RELEASING -> RELEASED. KVF_ERR_STALE from another state. */
kvf_status_t kvf_handoff_on_released(kvf_handoff_t *h);

/* What admission control looks at (docs/PROTOCOL.md, step 3). */
typedef struct {
    uint32_t free_blocks;
    uint32_t live; /* requests admitted and not yet ended */
    uint32_t max_running;
    uint32_t max_context; /* positions the model supports */
    uint32_t block_size;
} kvf_decode_admission_t;

/* Decides on a request of n_tokens K/V tokens and max_new tokens to
 * generate: KVF_ERR_INVAL when it does not fit the context (n_tokens 0,
 * or n_tokens >= max_context: not even one token could follow), else
 * KVF_ERR_NO_SPACE when max_running requests are live or fewer than the
 * needed blocks are free, else KVF_OK with *n_blocks_p = blocks to
 * allocate: ceil(min(n_tokens + max_new, max_context) / block_size) (a
 * sequence never grows past the context, so blocks beyond it are not
 * taken). */
kvf_status_t kvf_decode_admit(const kvf_decode_admission_t *a, uint32_t n_tokens, uint32_t max_new,
                              uint32_t *n_blocks_p);

/* Whether a sequence ends after producing a token (a stop string, found in
 * the text, is the caller's). gen: tokens produced in this epoch, that one
 * included; seq_len: tokens of the sequence (prompt, earlier epochs'
 * tokens and gen); capacity: positions its blocks hold; max_tokens: what
 * this epoch may still produce. EOS ends it (FINISH_STOP) unless
 * ignore_eos, whatever the counts (the EOS token itself is never emitted:
 * the caller drops it and does not count it); gen reaching max_tokens,
 * seq_len reaching max_context or the next feed position (seq_len - 1)
 * falling outside the blocks end it with FINISH_LENGTH, that token
 * included. */
Kvf__FinishReason kvf_decode_finish_reason(bool is_eos, bool ignore_eos, uint32_t gen,
                                           uint32_t max_tokens, uint32_t seq_len,
                                           uint32_t max_context, uint32_t capacity);

#endif
