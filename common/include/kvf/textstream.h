/* A request's output text, token by token, with its stop strings.
 *
 * The decode node keeps one per request: it turns each generated token
 * into text for the client (whole UTF-8 characters, kvf_detok_t) and
 * decides when a stop string ends the request. Text that could be the
 * start of a stop string is held back until the next tokens show it is
 * not; the stop string itself and anything after it are never handed out.
 *
 * The text handed out is a pure function of the tokens pushed, so a
 * stream rebuilt from the tokens already streamed (kvf_textstream_replay,
 * after a re-dispatch) continues exactly where the first one stopped. */
#ifndef KVF_TEXTSTREAM_H
#define KVF_TEXTSTREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvf/status.h"
#include "kvf/tokenizer.h"

typedef struct kvf_textstream kvf_textstream_t;

/* A stream over tok (which must outlive it) with n_stop stop strings
 * (copied; each non-empty; C strings, so none holds U+0000, while the text
 * they are matched against may). *ts_p is owned by the caller:
 * kvf_textstream_destroy(). KVF_ERR_INVAL (an empty stop string),
 * KVF_ERR_NOMEM. */
kvf_status_t kvf_textstream_create(const kvf_tokenizer_t *tok, const char *const *stops,
                                   size_t n_stop, kvf_textstream_t **ts_p);

/* NULL is a no-op. */
void kvf_textstream_destroy(kvf_textstream_t *ts);

/* Pushes tokens an earlier attempt already streamed: the state moves on as
 * if they had been pushed one by one and their text handed out. */
kvf_status_t kvf_textstream_replay(kvf_textstream_t *ts, const uint32_t *ids, size_t n);

/* Pushes one generated token. *text_p / *len_p: the text now safe to hand
 * out (maybe none): *len_p bytes of UTF-8, which may hold U+0000 (a NUL
 * follows them too, but the length is *len_p), owned by the stream and
 * valid until its next call. *stopped_p: a stop string matched; the text handed out
 * ends before it, and the stream takes no more tokens (KVF_ERR_CLOSED). */
kvf_status_t kvf_textstream_push(kvf_textstream_t *ts, uint32_t id, const char **text_p,
                                 size_t *len_p, bool *stopped_p);

/* The request ends for another reason (EOS, length, context): the text
 * still held back, with an incomplete last character as U+FFFD (cut
 * before a stop string it completes). Same ownership as push. */
kvf_status_t kvf_textstream_finish(kvf_textstream_t *ts, const char **text_p, size_t *len_p);

/* Whether a stop string matched. */
bool kvf_textstream_stopped(const kvf_textstream_t *ts);

#endif
