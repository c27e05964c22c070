/* A request's output as its client has it: the tokens sent so far, in
 * order, and the chunks that carry new ones to the client's sink.
 *
 * The decode node decides everything about the output (the tokens, their
 * text, when the request ends; docs/PROTOCOL.md); the router only places
 * each TokenChunk by position. A chunk carries the tokens at positions
 * [n_generated - n_tokens, n_generated) of the request, counted over
 * every epoch, so after a re-dispatch the new epoch continues exactly
 * where the client's stream ends:
 *   - a chunk that starts at the end continues the stream;
 *   - a chunk that ends at or before the end was sent before (dropped);
 *   - a chunk that starts past the end, or straddles it, means a message
 *     of the epoch was lost: the router sends the request again from what
 *     the client has.
 *
 * Pure: no sockets, no router state; one thread. */
#ifndef KVF_STREAM_H
#define KVF_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "kvf/status.h"
#include "router.h"

/* Caller owns the struct: kvf_stream_init / kvf_stream_fini. */
typedef struct {
    uint32_t *ids; /* (n) tokens sent to the client, cap allocated */
    uint32_t n, cap;
} kvf_stream_t;

/* Where a chunk falls. */
typedef enum {
    KVF_STREAM_NEXT,    /* starts at the end: its tokens were appended */
    KVF_STREAM_RESENT,  /* ends at or before the end: nothing new */
    KVF_STREAM_GAP,     /* starts past the end: tokens are missing */
    KVF_STREAM_OVERLAP, /* starts before the end and goes past it */
} kvf_stream_place_t;

void kvf_stream_init(kvf_stream_t *s);
void kvf_stream_fini(kvf_stream_t *s);

/* Places the n tokens of a chunk that ends at position n_generated. With
 * KVF_STREAM_NEXT they are appended (s->n becomes n_generated); otherwise
 * s is unchanged. KVF_ERR_INVAL (malformed: n > n_generated) and
 * KVF_ERR_NOMEM leave s unchanged and *place_p unset. */
kvf_status_t kvf_stream_place(kvf_stream_t *s, uint32_t n_generated, const uint32_t *tokens,
                              size_t n, kvf_stream_place_t *place_p);

/* The client chunk of the tokens at positions [from, s->n) with text
 * (text_len bytes of UTF-8, U+0000 included, not NUL-terminated; borrowed,
 * may be "" but not NULL) and
 * finish (Kvf__FinishReason; NONE while more follows). Fills the tokens,
 * text, finish and completion_tokens of *chunk_p and zeroes the rest
 * (the caller adds the request's id, counts and timings). The chunk
 * points into s and text: valid until s changes. */
void kvf_stream_chunk(const kvf_stream_t *s, uint32_t from, const char *text, size_t text_len,
                      int finish, kvf_router_chunk_t *chunk_p);

#endif
