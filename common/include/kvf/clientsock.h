/* The router's native client socket and its client side.
 *
 * Plain REQ/REP allows one reply per request; a generation streams many.
 * So the router holds a raw REP socket and a client a raw REQ socket: the
 * router keeps the backtrace header each request came with and sends any
 * number of GenerateChunk replies with it; the client's raw REQ delivers
 * them all, so one client socket carries many concurrent streams. With
 * nanomsg 1.1 the SP_HDR control message holds a size_t length, then the
 * header bytes (router side: pipe id + request id, 8 bytes; client side: a
 * 4-byte request id with the top bit set). Frames are kvf envelopes
 * (kvf/msg.h), checked like every other message: with a cluster key
 * (kvf/auth.h) a client signs its requests for the router's client URL and
 * the router its replies for the connection they go back on (auth_to ""),
 * each side on its socket's own stream, and each refuses what does not
 * authenticate (a receive then returns KVF_ERR_AUTH). */
#ifndef KVF_CLIENTSOCK_H
#define KVF_CLIENTSOCK_H

#include <stddef.h>
#include <stdint.h>

#include "kvf/msg.h"
#include "kvf/status.h"

#define KVF_CLIENT_HDR_MAX 32

/* Where a client request came from: what the router answers to. */
typedef struct {
    uint8_t bytes[KVF_CLIENT_HDR_MAX];
    size_t len;
} kvf_client_hdr_t;

/* ---- router side --------------------------------------------------------- */

typedef struct kvf_client_server kvf_client_server_t;

/* Binds the raw REP socket at url. *server_p owned by the caller. */
kvf_status_t kvf_client_server_create(const char *url, kvf_client_server_t **server_p);
void kvf_client_server_destroy(kvf_client_server_t *server);
/* Polls readable while a request waits; owned by the server. */
int kvf_client_server_fd(const kvf_client_server_t *server);

/* Receives one request without waiting (KVF_ERR_AGAIN when none). On
 * success *env_p is the caller's (kvf_envelope_free) and *hdr_p says whom
 * to answer. A malformed frame is dropped and its error returned. */
kvf_status_t kvf_client_server_recv(kvf_client_server_t *server, kvf_envelope_t **env_p,
                                    kvf_client_hdr_t *hdr_p);

/* Sends env to the client that sent hdr; never blocks (KVF_ERR_AGAIN if
 * the client's queue is full). */
kvf_status_t kvf_client_server_send(kvf_client_server_t *server, const kvf_client_hdr_t *hdr,
                                    const kvf_envelope_t *env);

/* ---- client side --------------------------------------------------------- */

typedef struct kvf_client kvf_client_t;

/* Connects a raw REQ socket to the router's client URL. */
kvf_status_t kvf_client_create(const char *url, kvf_client_t **client_p);
void kvf_client_destroy(kvf_client_t *client);

/* Sends env as a new request (waiting up to timeout_ms for the router to
 * be reachable). */
kvf_status_t kvf_client_send(kvf_client_t *client, const kvf_envelope_t *env, int timeout_ms);

/* Receives the next reply, waiting up to timeout_ms (KVF_ERR_TIMEOUT).
 * *env_p is the caller's. */
kvf_status_t kvf_client_recv(kvf_client_t *client, int timeout_ms, kvf_envelope_t **env_p);

/* Asks the router for its stats: sends a StatsRequest from sender (the
 * envelope's sender field) and waits for the StatsReply with its req_id,
 * dropping any other reply that arrives first. timeout_ms bounds the send,
 * then the wait for the reply. KVF_ERR_PEER when the request cannot be
 * sent in time (no router there), another error of kvf_client_send when
 * it fails otherwise, KVF_ERR_TIMEOUT when no StatsReply came. On success
 * *reply_p (body_case KVF__ENVELOPE__BODY_STATS_REPLY) is the caller's
 * (kvf_envelope_free). */
kvf_status_t kvf_client_stats(kvf_client_t *client, const char *sender, int timeout_ms,
                              kvf_envelope_t **reply_p);

/* What a native client asks the router to generate. Everything is
 * borrowed for the call. */
typedef struct {
    uint64_t client_req_id;         /* the client's own id, unique per connection */
    const char *prompt;             /* text (tokenized by the router), or NULL */
    size_t prompt_len;              /* its bytes (it may hold U+0000); 0: strlen(prompt) */
    const uint32_t *ids;            /* (n_ids) prompt ids, used as given when n_ids > 0 */
    size_t n_ids;
    const Kvf__Sampling *sampling;  /* NULL: the router's defaults */
} kvf_client_generate_t;

/* Sends one GenerateRequest, sender naming the client; the router answers
 * with GenerateChunks carrying client_req_id (kvf_client_recv). Returns
 * kvf_client_send's status. */
kvf_status_t kvf_client_generate(kvf_client_t *client, const char *sender,
                                 const kvf_client_generate_t *req, int timeout_ms);

/* Asks the router to cancel the client's request client_req_id. */
kvf_status_t kvf_client_cancel(kvf_client_t *client, const char *sender, uint64_t client_req_id,
                               int timeout_ms);

#endif
