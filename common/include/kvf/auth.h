/* Control-plane authentication: the cluster key, the signing stream of each
 * socket, and what a receiver checks before it believes a frame.
 *
 * kvf/msg.h and kvf/clientsock.h call this module for every frame they
 * make or take, so every socket of every process (router, nodes, native
 * clients) signs and verifies in one place. docs/PROTOCOL.md ("The
 * authenticated envelope") describes the frame.
 *
 * Process-wide state. The cluster key, like the log sink, belongs to the
 * process: main() sets it once (kvf_auth_setup) before it creates any
 * socket or thread, and it is only read afterwards (tests may change it
 * between phases, with no other thread running). The rest is safe from any
 * thread: a stream's sequence counter is atomic, the replay table is under
 * a mutex, the refusal counters are atomic.
 *
 * With a key, a sender stamps each Envelope with its socket's stream (a
 * random 64-bit nonce and a sequence number 1, 2, ... per stream), the
 * time the frame is made (sent_unix_ns) and the destination URL
 * (auth_to), and the frame carries an HMAC-SHA256 tag (libsodium's
 * crypto_auth_hmacsha256) over the packed Envelope. A receiver with the
 * key accepts a frame only when all of these hold, and otherwise refuses
 * and counts it under one reason:
 *   - it is tagged                                    (KVF_AUTH_UNTAGGED)
 *   - the tag verifies, in constant time              (KVF_AUTH_BAD_TAG)
 *   - sent_unix_ns is within KVF_AUTH_SKEW_MS of the
 *     receiver's wall clock                           (KVF_AUTH_STALE)
 *   - (nonce, seq) was not accepted before            (KVF_AUTH_REPLAY)
 *   - auth_to names the receiving socket              (KVF_AUTH_MISDIRECTED)
 * Replays: per stream, a window of the last KVF_AUTH_WINDOW sequence
 * numbers (frames of one stream may arrive out of order by that much);
 * an older one is refused. A stream's entry is dropped once everything it
 * could protect is older than the time window (a replay of it is then
 * refused as stale); that is looked at when the table is full. It holds
 * at most KVF_AUTH_MAX_STREAMS streams: when it is full of live ones, the
 * one whose newest frame is oldest is evicted, and every stream that
 * enters the table afterwards (the evicted one again included) refuses
 * frames sent at or before that frame's time, so an eviction never lets a
 * replay through; at worst it refuses a late frame of a new stream.
 *
 * Without a key nothing is stamped or tagged, every frame is accepted after
 * its CRC (a tagged one too: its tag cannot be checked), and
 * kvf_auth_setup() says once that the control plane is not authenticated. */
#ifndef KVF_AUTH_H
#define KVF_AUTH_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvf/status.h"

#define KVF_AUTH_TAG_BYTES     32u    /* HMAC-SHA256 */
#define KVF_AUTH_KEY_MIN_BYTES 32u    /* the key file holds at least this many bytes */
#define KVF_AUTH_KEY_MAX_BYTES 4096u  /* and at most this many */
#define KVF_AUTH_SKEW_MS       30000u /* accepted |sender's clock - receiver's clock| */
#define KVF_AUTH_WINDOW        1024u  /* sequence numbers remembered per stream */
#define KVF_AUTH_MAX_STREAMS   4096u  /* streams in the replay table */

/* The environment variable read when no --cluster-key-file is given. */
#define KVF_AUTH_KEY_ENV "KVF_CLUSTER_KEY_FILE"

/* The flag of every binary and command that talks on the control plane,
 * for a kvf_flag_t table (kvf/flags.h); value_p is a const char **. */
/* clang-format off */
#define KVF_AUTH_FLAG_ENTRY(value_p)                                                               \
    {"cluster-key-file", KVF_FLAG_STRING, (value_p), "PATH",                                       \
     "cluster secret that signs and checks every control message (mode 0600, 32 to 4096 "         \
     "bytes; default $" KVF_AUTH_KEY_ENV "; none: unauthenticated)",                              \
     NULL}
/* The flag of the long-running processes (router, nodes) that refuses to
 * start without a cluster key; value_p is a bool *. */
#define KVF_AUTH_REQUIRE_FLAG_ENTRY(value_p)                                                       \
    {"require-key", KVF_FLAG_BOOL, (value_p), NULL,                                                \
     "refuse to start without a cluster key (--cluster-key-file or $" KVF_AUTH_KEY_ENV ")",      \
     NULL}
/* clang-format on */

/* Why a frame was refused; counters and metric labels use these. */
typedef enum {
    KVF_AUTH_UNTAGGED = 0, /* no tag, and this process has the key */
    KVF_AUTH_BAD_TAG,      /* the tag does not verify: another key, or altered bytes */
    KVF_AUTH_REPLAY,       /* (stream, seq) already accepted, or too old for the window */
    KVF_AUTH_STALE,        /* sent_unix_ns outside the time window */
    KVF_AUTH_MISDIRECTED,  /* signed for another socket (auth_to) */
    KVF_AUTH_N_REASONS,
} kvf_auth_reason_t;

/* "untagged", "bad_tag", "replay", "stale", "misdirected". */
const char *kvf_auth_reason_name(kvf_auth_reason_t reason);

/* ---- the key --------------------------------------------------------------- */

/* What main() calls once, after parsing its flags: loads key_file, or
 * $KVF_CLUSTER_KEY_FILE when key_file is NULL or empty, with
 * kvf_auth_load_key_file(); with neither, logs once per process that the
 * control plane is not authenticated and returns KVF_OK. A key file that
 * cannot be used is an error (logged): the process should not start. */
kvf_status_t kvf_auth_setup(const char *key_file);

/* After kvf_auth_setup(): KVF_ERR_AUTH, logged with what to do, when
 * required (--require-key) and no key was loaded; KVF_OK otherwise. */
kvf_status_t kvf_auth_require(bool required);

/* Reads the cluster key from path and makes it the process's key. The
 * file must be a regular file (a symbolic link to one is followed) that
 * neither group nor others may read or write (mode 0600 or 0400), of
 * KVF_AUTH_KEY_MIN_BYTES to KVF_AUTH_KEY_MAX_BYTES bytes; all its bytes
 * are the key. KVF_ERR_NOT_FOUND (missing), KVF_ERR_INVAL (not a regular
 * file, loose mode, too short), KVF_ERR_TOO_BIG, KVF_ERR_IO; each logged
 * with the path. The process's key is unchanged on error. */
kvf_status_t kvf_auth_load_key_file(const char *path);

/* Writes a new key file at path: 32 random bytes (libsodium's
 * randombytes), mode 0600, created (never an existing file: KVF_ERR_IO,
 * logged, when path exists). Does not load it. */
kvf_status_t kvf_auth_write_key_file(const char *path);

/* Makes key (len bytes, copied into the HMAC state) the process's key;
 * KVF_ERR_INVAL outside the sizes above. For tests and for
 * kvf_auth_load_key_file. */
kvf_status_t kvf_auth_set_key(const uint8_t *key, size_t len);

/* Forgets the key (wiped): the process is unauthenticated again. Tests. */
void kvf_auth_clear_key(void);

/* True when the process has a key: frames are signed and checked. */
bool kvf_auth_enabled(void);

/* ---- sending --------------------------------------------------------------- */

/* The frames one socket sends: a random nonce and the last sequence
 * number used. Embedded in the socket (caller owns it: init, no fini). */
typedef struct {
    uint64_t nonce;
    _Atomic uint64_t seq;
} kvf_auth_stream_t;

/* Draws a fresh nonce. KVF_ERR_INTERNAL if libsodium cannot start. */
kvf_status_t kvf_auth_stream_init(kvf_auth_stream_t *stream);

/* The stream of frames made without a socket (kvf_envelope_encode), set
 * up on first use; NULL if libsodium cannot start. */
kvf_auth_stream_t *kvf_auth_process_stream(void);

/* The next sequence number of stream (1, 2, ...). Thread-safe. */
uint64_t kvf_auth_stream_next(kvf_auth_stream_t *stream);

/* The wall clock in nanoseconds since the epoch: what sent_unix_ns holds
 * and what receivers compare it with. */
uint64_t kvf_auth_now_unix_ns(void);

/* Writes the tag of the len bytes at msg. Needs a key (programming error
 * otherwise). */
void kvf_auth_sign(const uint8_t *msg, size_t len, uint8_t tag[KVF_AUTH_TAG_BYTES]);

/* ---- receiving ------------------------------------------------------------- */

/* KVF_OK when tag is the tag of msg under the process's key (compared in
 * constant time); else KVF_ERR_AUTH, counted as KVF_AUTH_BAD_TAG. Needs a
 * key. */
kvf_status_t kvf_auth_verify(const uint8_t *msg, size_t len, const uint8_t tag[KVF_AUTH_TAG_BYTES]);

/* What a verified frame says about itself. sender is only for logs. */
typedef struct {
    uint64_t nonce, seq, sent_unix_ns;
    const char *sender;
} kvf_auth_stamp_t;

/* The time and replay rules for a frame whose tag verified, at receiver
 * time now_unix_ns: KVF_OK and the frame is recorded as seen, or
 * KVF_ERR_AUTH counted as KVF_AUTH_STALE or KVF_AUTH_REPLAY (nothing
 * recorded), or KVF_ERR_NOMEM (the table could not grow; not recorded). */
kvf_status_t kvf_auth_check_fresh(const kvf_auth_stamp_t *stamp, uint64_t now_unix_ns);

/* True when a frame signed for the URL to may be taken by the socket at
 * local: the same string; or, for tcp:// URLs, the same port (a sender
 * and a receiver may name one host differently: 127.0.0.1, a DNS name,
 * 0.0.0.0 or * when binding). local "" (a client's own connection) takes
 * only to "". */
bool kvf_auth_dest_matches(const char *to, const char *local);

/* Counts a refusal (and logs it, at most once a second per reason, with
 * the sender when known). Returns KVF_ERR_AUTH, for the caller to return. */
kvf_status_t kvf_auth_refuse(kvf_auth_reason_t reason, const char *sender);

/* ---- counters -------------------------------------------------------------- */

typedef struct {
    uint64_t refused[KVF_AUTH_N_REASONS]; /* indexed by kvf_auth_reason_t */
} kvf_auth_counters_t;

/* The process's refusal counts since it started. */
void kvf_auth_counters(kvf_auth_counters_t *out);

/* "auth refused: untagged 0 bad_tag 2 replay 1 stale 0 misdirected 0"
 * (or "auth off" without a key) into buf (always NUL-terminated), for the
 * nodes' stats lines. */
void kvf_auth_counters_format(char *buf, size_t len);

/* Streams in the replay table. */
size_t kvf_auth_replay_streams(void);

/* Empties the replay table and zeroes the counters. Tests. */
void kvf_auth_reset(void);

#endif
