/* Control-plane messaging: protobuf-c envelopes over nanomsg sockets.
 *
 * Every process binds one NN_PULL inbox; to talk to a process, connect an
 * NN_PUSH outbox to its inbox URL ("tcp://127.0.0.1:5555", "ipc:///path").
 *
 * Wire frame: "KVF\x01" magic, CRC32C of the payload (u32 little endian),
 * then the packed kvf.Envelope. The checksum catches truncation and bit
 * flips before protobuf sees the bytes; the Envelope's version must equal
 * KVF_PROTO_VERSION. Everything received is untrusted: size-limited,
 * checked, decoded with error checks; the body's fields are then validated
 * by whoever handles the message.
 *
 * When the process has a cluster key (kvf/auth.h) every frame is tagged:
 * "KVF\x02", the CRC32C of the payload, the 32-byte HMAC-SHA256 of the
 * payload, then the payload, an Envelope stamped with the sending
 * socket's stream (auth_nonce, auth_seq), the time (sent_unix_ns) and the
 * destination URL (auth_to). Every socket here signs what it sends and
 * checks what it takes (tag, time, replay, destination) by the rules of
 * kvf/auth.h; a frame that fails is refused and counted there, and its
 * receive call returns KVF_ERR_AUTH. */
#ifndef KVF_MSG_H
#define KVF_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "kvf/auth.h"
#include "kvf/status.h"
#include "kvferry.pb-c.h"

#define KVF_PROTO_VERSION 3u
#define KVF_MSG_FRAME_HEADER 8u
#define KVF_MSG_FRAME_HEADER_TAGGED (KVF_MSG_FRAME_HEADER + 32u) /* + the HMAC tag */
/* Default largest accepted frame; a prefill request of 1M tokens fits. */
#define KVF_MSG_MAX_DEFAULT (16u << 20)
/* An inbox takes frames up to this many times its limit off the wire, to
 * drop them with a log line; nanomsg cuts the connection of a larger one
 * before buffering it, without a word. */
#define KVF_MSG_OVERSIZE_FACTOR 8u

typedef Kvf__Envelope kvf_envelope_t;

/* Sets version, sender (not copied: must outlive the envelope's use) and
 * the send time. The body is set by the caller. */
void kvf_envelope_init(kvf_envelope_t *env, const char *sender);

/* Frames env into a malloc'd buffer owned by the caller (*frame_p, set
 * only on success). With a cluster key the frame is tagged and stamped
 * with stream (NULL: the process's own, kvf_auth_process_stream), the
 * current time and the destination to (NULL: ""); env itself is not
 * changed. Without a key to and stream are ignored. */
kvf_status_t kvf_envelope_encode_to(const kvf_envelope_t *env, const char *to,
                                    kvf_auth_stream_t *stream, uint8_t **frame_p, size_t *len_p);

/* kvf_envelope_encode_to(env, NULL, NULL, ...). */
kvf_status_t kvf_envelope_encode(const kvf_envelope_t *env, uint8_t **frame_p, size_t *len_p);

/* Checks and decodes one frame of len bytes taken by the socket at local.
 * Frames longer than max_len are refused (KVF_ERR_TOO_BIG) before any
 * decoding; bad magic, checksum or protobuf (KVF_ERR_FORMAT), another
 * version (KVF_ERR_VERSION), or no known body (KVF_ERR_FORMAT) are
 * errors. With a cluster key, a frame that is untagged, whose tag does not
 * verify, that is outside the time window at now_unix_ns (0: the wall
 * clock), a replay, or signed for another destination than local (NULL:
 * any) is refused with KVF_ERR_AUTH (kvf/auth.h counts it); an accepted
 * frame is recorded in the replay table. On success *env_p is owned by the
 * caller: release it with kvf_envelope_free(). */
kvf_status_t kvf_envelope_decode_at(const uint8_t *frame, size_t len, size_t max_len,
                                    const char *local, uint64_t now_unix_ns,
                                    kvf_envelope_t **env_p);

/* kvf_envelope_decode_at(frame, len, max_len, NULL, 0, env_p). */
kvf_status_t kvf_envelope_decode(const uint8_t *frame, size_t len, size_t max_len,
                                 kvf_envelope_t **env_p);

/* Releases an envelope returned by kvf_envelope_decode / kvf_inbox_recv.
 * NULL is allowed. */
void kvf_envelope_free(kvf_envelope_t *env);

/* The body's name ("register", "kv_alloc", ...), for logs. */
const char *kvf_envelope_body_name(const kvf_envelope_t *env);

/* ---- inbox (NN_PULL, bound) ---------------------------------------------- */

typedef struct kvf_inbox kvf_inbox_t;

/* Binds an inbox at url. max_len limits accepted frames (0: default). */
kvf_status_t kvf_inbox_create(const char *url, size_t max_len, kvf_inbox_t **inbox_p);
void kvf_inbox_destroy(kvf_inbox_t *inbox);

/* A file descriptor that polls readable while a message is waiting; owned
 * by the inbox. */
int kvf_inbox_fd(const kvf_inbox_t *inbox);
const char *kvf_inbox_url(const kvf_inbox_t *inbox);

/* Receives one envelope, waiting up to timeout_ms (0: do not wait, -1:
 * forever). KVF_ERR_AGAIN/KVF_ERR_TIMEOUT when nothing came. A frame that
 * fails decoding or authentication (KVF_ERR_AUTH; the destination it was
 * signed for must be this inbox's URL) is dropped, counted and returned as
 * its error, so the caller keeps serving. Drops other than refusals
 * (kvf/auth.h logs those) are logged with a bound: the first
 * KVF_REFUSALS_LOG_BURST of each KVF_REFUSALS_WINDOW_MS window one by one
 * (an oversized one with its size and the limit), the rest in a summary
 * (kvf/identity.h). Not thread-safe: one receiving thread per inbox. */
kvf_status_t kvf_inbox_recv(kvf_inbox_t *inbox, int timeout_ms, kvf_envelope_t **env_p);

/* Frames dropped because they did not decode or authenticate. */
uint64_t kvf_inbox_dropped(const kvf_inbox_t *inbox);

/* ---- messages kept while a loop computes (msg_keep.c) ---------------------- */

/* Takes env (frees it or keeps it). */
typedef void (*kvf_envelope_fn)(void *arg, kvf_envelope_t *env);

/* How many envelopes a loop keeps during one compute, at most (the rest
 * waits in its inbox). */
#define KVF_KEPT_MAX 4096

/* Envelopes kept for the loop, in arrival order. Zero-initialised is empty. */
typedef struct {
    kvf_envelope_t **envs;
    size_t n, cap;
} kvf_kept_t;

/* Reads what waits in inbox between the steps of a long compute (a
 * forward's layers): envelopes of body case urgent_body go to urgent at
 * once (it must not start a compute); the rest is kept, up to KVF_KEPT_MAX
 * (more stays in the inbox), for the loop to handle in order once the
 * compute is over (kvf_kept_handle). */
void kvf_inbox_keep(kvf_inbox_t *inbox, kvf_kept_t *kept, int urgent_body, kvf_envelope_fn urgent,
                    void *arg);

/* Hands every kept envelope to fn, oldest first, and empties kept. */
void kvf_kept_handle(kvf_kept_t *kept, kvf_envelope_fn fn, void *arg);

/* Frees what is kept. */
void kvf_kept_free(kvf_kept_t *kept);

/* ---- outbox (NN_PUSH, connected) ----------------------------------------- */

typedef struct kvf_outbox kvf_outbox_t;

/* Connects to url; connection happens in the background and survives the
 * peer restarting. */
kvf_status_t kvf_outbox_create(const char *url, kvf_outbox_t **outbox_p);

/* Closes the socket. Messages still queued may be dropped (nanomsg has no
 * linger): a caller that must deliver a last message waits for the peer's
 * answer before closing. NULL is allowed. */
void kvf_outbox_destroy(kvf_outbox_t *outbox);
const char *kvf_outbox_url(const kvf_outbox_t *outbox);

/* Encodes and sends env, waiting up to timeout_ms for the peer to take it
 * (KVF_ERR_TIMEOUT if it does not). With a key the frame is stamped with
 * this outbox's own stream and its URL as the destination. */
kvf_status_t kvf_outbox_send(kvf_outbox_t *outbox, const kvf_envelope_t *env, int timeout_ms);

/* Sends an already encoded frame (same rules), as it is. */
kvf_status_t kvf_outbox_send_frame(kvf_outbox_t *outbox, const uint8_t *frame, size_t len,
                                   int timeout_ms);

/* ---- outbox cache ---------------------------------------------------------- */

/* Outboxes kept open per destination URL, so a process talks to many peers
 * without reconnecting for every message. When full, the least recently
 * used one is closed. Single-threaded: the owner's event loop uses it. */
typedef struct kvf_outboxes kvf_outboxes_t;

/* max: how many connections to keep (0: 64). *cache_p owned by the caller. */
kvf_status_t kvf_outboxes_create(size_t max, kvf_outboxes_t **cache_p);
/* Closes every outbox. NULL is a no-op. */
void kvf_outboxes_destroy(kvf_outboxes_t *cache);
/* Sends env to the inbox at url, connecting first if needed. */
kvf_status_t kvf_outboxes_send(kvf_outboxes_t *cache, const char *url, const kvf_envelope_t *env,
                               int timeout_ms);
/* Closes the outbox to url, if any (a peer that died or left). */
void kvf_outboxes_forget(kvf_outboxes_t *cache, const char *url);

/* ---- helpers ------------------------------------------------------------- */

/* Turns Nagle's algorithm off for the TCP connections of nanomsg socket
 * sock (set before nn_bind / nn_connect). Control messages are small and
 * each one is waited for: with Nagle on, a message sent while the
 * previous one on the connection is not acknowledged yet waits for the
 * peer's delayed ACK (measured: KvReady 36-40 ms behind the KvAlloc
 * before it, on every first request of a prefill-decode pair). */
void kvf_nn_tcp_nodelay(int sock);

/* Converts a nanomsg errno value to a status. */
kvf_status_t kvf_status_from_nn(int err);

/* Finds a TCP port on 127.0.0.1 that is free right now and that this
 * process was not handed in its last 64 calls (callers start a process
 * per port, which binds it later). Thread-safe. */
kvf_status_t kvf_net_free_port(int *port_p);

/* Whether a socket bound at url takes peers from this host only: an
 * ipc:// or inproc:// URL, or tcp:// on a loopback address (127.x.y.z,
 * localhost, [::1]). Any other tcp:// address (0.0.0.0, *, a host's
 * address or name) is open to other hosts: false. */
bool kvf_net_url_is_local(const char *url);

#endif
