/* Identity without a cluster key (docs/PROTOCOL.md, "Identity"): the
 * secret a registration is bound to, the per-attempt credential derived
 * from it, and refusal counters whose log lines are bounded.
 *
 * The router draws a registration token (KVF_REG_TOKEN_LEN random bytes
 * from the OS) for every accepted Register and hands it to the node in
 * RegisterReply; both then put it in Envelope.reg_token of every message
 * between them, and each drops a message whose token differs. A prefill
 * node gets, per attempt, the decode node's KvAlloc credential
 * (kvf_identity_alloc_token of the decode node's token), which it cannot
 * turn into a credential for another request. */
#ifndef KVF_IDENTITY_H
#define KVF_IDENTITY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvf/status.h"

#define KVF_REG_TOKEN_LEN   16
#define KVF_ALLOC_TOKEN_LEN 16

/* Fills token with random bytes from the OS (getrandom); IO on failure. */
kvf_status_t kvf_identity_draw(uint8_t token[KVF_REG_TOKEN_LEN]);

/* Whether a (a_len bytes) holds the same token as b (b_len), in time that
 * does not depend on where they differ. Empty never equals anything. */
bool kvf_identity_equal(const uint8_t *a, size_t a_len, const uint8_t *b, size_t b_len);

/* The KvAlloc credential of attempt (req_id, epoch) at the decode node
 * whose registration token is reg_token: a keyed BLAKE2b of the two. */
void kvf_identity_alloc_token(const uint8_t reg_token[KVF_REG_TOKEN_LEN], uint64_t req_id,
                              uint64_t epoch, uint8_t out_p[KVF_ALLOC_TOKEN_LEN]);

/* Refusal counters by reason, with a bounded log: the first
 * KVF_REFUSALS_LOG_BURST refusals of each KVF_REFUSALS_WINDOW_MS window
 * are logged one by one, the rest in one summary line when the next
 * window starts. Not thread-safe: one owner (a loop). */
#define KVF_REFUSALS_MAX        8
#define KVF_REFUSALS_LOG_BURST  5
#define KVF_REFUSALS_WINDOW_MS  10000u

typedef struct {
    const char *const *names; /* (n) reason names, static */
    unsigned n;
    uint64_t count[KVF_REFUSALS_MAX];
    uint64_t window_start_ns;
    unsigned logged;     /* in this window */
    uint64_t suppressed; /* in this window, not logged */
} kvf_refusals_t;

/* names: n (at most KVF_REFUSALS_MAX) reason names, kept by pointer. */
void kvf_refusals_init(kvf_refusals_t *c, const char *const *names, unsigned n);

/* Counts one refusal of reason and logs it (a warning) unless this window
 * logged its burst already. */
void kvf_refusals_note(kvf_refusals_t *c, unsigned reason, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* "reason=N reason=N ..." into buf (always terminated). */
void kvf_refusals_format(const kvf_refusals_t *c, char *buf, size_t len);

#endif
