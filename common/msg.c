#include "kvf/msg.h"
#include "kvf/auth.h"
#include "kvf/clock.h"
#include "kvf/crc32c.h"
#include "kvf/identity.h"
#include "kvf/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <nanomsg/nn.h>
#include <nanomsg/pipeline.h>
#include <nanomsg/tcp.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* "KVF" and the frame's kind: 1 plain, 2 tagged (kvf/msg.h). */
static const uint8_t frame_magic[3] = {'K', 'V', 'F'};
#define FRAME_PLAIN  1u
#define FRAME_TAGGED 2u

kvf_status_t kvf_status_from_nn(int err)
{
    switch (err) {
    case ETIMEDOUT: return KVF_ERR_TIMEOUT;
    case EAGAIN: return KVF_ERR_AGAIN;
    case ETERM: case EBADF: return KVF_ERR_CLOSED;
    case EINVAL: case EPROTONOSUPPORT: case ENAMETOOLONG: case ENODEV: return KVF_ERR_INVAL;
    case EADDRINUSE: case EADDRNOTAVAIL: return KVF_ERR_IO;
    default: return kvf_status_from_errno(err);
    }
}

void kvf_envelope_init(kvf_envelope_t *env, const char *sender)
{
    kvf__envelope__init(env);
    env->version = KVF_PROTO_VERSION;
    env->sender = (char *)(sender ? sender : "");
    env->sent_unix_ns = kvf_auth_now_unix_ns();
}

/* Packs env behind a plain or a tagged header into a malloc'd frame. */
static kvf_status_t frame_pack(const kvf_envelope_t *env, bool tagged, uint8_t **frame_p,
                               size_t *len_p)
{
    size_t header = tagged ? KVF_MSG_FRAME_HEADER_TAGGED : KVF_MSG_FRAME_HEADER;
    size_t payload = kvf__envelope__get_packed_size(env);
    uint8_t *frame = malloc(header + payload);
    if (!frame)
        return KVF_ERR_NOMEM;
    size_t packed = kvf__envelope__pack(env, frame + header);
    KVF_ASSERT(packed == payload);
    uint32_t crc = kvf_crc32c(0, frame + header, payload);
    memcpy(frame, frame_magic, 3);
    frame[3] = tagged ? FRAME_TAGGED : FRAME_PLAIN;
    for (int i = 0; i < 4; i++)
        frame[4 + i] = (uint8_t)(crc >> (8 * i));
    if (tagged)
        kvf_auth_sign(frame + header, payload, frame + KVF_MSG_FRAME_HEADER);
    *frame_p = frame;
    *len_p = header + payload;
    return KVF_OK;
}

kvf_status_t kvf_envelope_encode_to(const kvf_envelope_t *env, const char *to,
                                    kvf_auth_stream_t *stream, uint8_t **frame_p, size_t *len_p)
{
    if (!kvf_auth_enabled())
        return frame_pack(env, false, frame_p, len_p);
    if (!stream && !(stream = kvf_auth_process_stream()))
        return KVF_ERR_INTERNAL;
    /* A shallow copy carries the stamp: the caller's envelope (and what it
     * points to) is not changed. */
    kvf_envelope_t stamped = *env;
    stamped.auth_nonce = stream->nonce;
    stamped.auth_seq = kvf_auth_stream_next(stream);
    stamped.auth_to = (char *)(to ? to : "");
    stamped.sent_unix_ns = kvf_auth_now_unix_ns();
    return frame_pack(&stamped, true, frame_p, len_p);
}

kvf_status_t kvf_envelope_encode(const kvf_envelope_t *env, uint8_t **frame_p, size_t *len_p)
{
    return kvf_envelope_encode_to(env, NULL, NULL, frame_p, len_p);
}

/* The frame's header checked (size, magic, CRC) and, with a key, its tag:
 * the payload's place in frame. */
static kvf_status_t frame_open(const uint8_t *frame, size_t len, size_t max_len,
                               const uint8_t **payload_p, size_t *payload_len_p)
{
    if (max_len == 0)
        max_len = KVF_MSG_MAX_DEFAULT;
    if (len > max_len)
        return KVF_ERR_TOO_BIG;
    if (len < KVF_MSG_FRAME_HEADER || memcmp(frame, frame_magic, 3) != 0 ||
        (frame[3] != FRAME_PLAIN && frame[3] != FRAME_TAGGED))
        return KVF_ERR_FORMAT;
    bool tagged = frame[3] == FRAME_TAGGED;
    size_t header = tagged ? KVF_MSG_FRAME_HEADER_TAGGED : KVF_MSG_FRAME_HEADER;
    if (len < header)
        return KVF_ERR_FORMAT;
    uint32_t want = (uint32_t)frame[4] | (uint32_t)frame[5] << 8 | (uint32_t)frame[6] << 16 |
                    (uint32_t)frame[7] << 24;
    const uint8_t *payload = frame + header;
    size_t payload_len = len - header;
    if (kvf_crc32c(0, payload, payload_len) != want)
        return KVF_ERR_FORMAT;
    /* Without a key a tagged frame is taken on its CRC (kvf/auth.h). */
    if (kvf_auth_enabled()) {
        if (!tagged)
            return kvf_auth_refuse(KVF_AUTH_UNTAGGED, NULL);
        kvf_status_t st = kvf_auth_verify(payload, payload_len, frame + KVF_MSG_FRAME_HEADER);
        if (st != KVF_OK)
            return st;
    }
    *payload_p = payload;
    *payload_len_p = payload_len;
    return KVF_OK;
}

/* The destination, time and replay rules for a verified envelope. */
static kvf_status_t stamp_check(const kvf_envelope_t *env, const char *local, uint64_t now)
{
    if (local && !kvf_auth_dest_matches(env->auth_to, local))
        return kvf_auth_refuse(KVF_AUTH_MISDIRECTED, env->sender);
    kvf_auth_stamp_t stamp = {.nonce = env->auth_nonce,
                              .seq = env->auth_seq,
                              .sent_unix_ns = env->sent_unix_ns,
                              .sender = env->sender};
    return kvf_auth_check_fresh(&stamp, now ? now : kvf_auth_now_unix_ns());
}

kvf_status_t kvf_envelope_decode_at(const uint8_t *frame, size_t len, size_t max_len,
                                    const char *local, uint64_t now_unix_ns, kvf_envelope_t **env_p)
{
    const uint8_t *payload = NULL;
    size_t payload_len = 0;
    kvf_status_t st = frame_open(frame, len, max_len, &payload, &payload_len);
    if (st != KVF_OK)
        return st;
    kvf_envelope_t *env = kvf__envelope__unpack(NULL, payload_len, payload);
    if (!env)
        return KVF_ERR_FORMAT;
    if (env->version != KVF_PROTO_VERSION)
        st = KVF_ERR_VERSION;
    else if (env->body_case == KVF__ENVELOPE__BODY__NOT_SET || env->register_ == NULL)
        st = KVF_ERR_FORMAT; /* register_ aliases every member of the body union. */
    else if (kvf_auth_enabled())
        st = stamp_check(env, local, now_unix_ns);
    if (st != KVF_OK) {
        kvf__envelope__free_unpacked(env, NULL);
        return st;
    }
    *env_p = env;
    return KVF_OK;
}

kvf_status_t kvf_envelope_decode(const uint8_t *frame, size_t len, size_t max_len,
                                 kvf_envelope_t **env_p)
{
    return kvf_envelope_decode_at(frame, len, max_len, NULL, 0, env_p);
}

void kvf_envelope_free(kvf_envelope_t *env)
{
    if (env)
        kvf__envelope__free_unpacked(env, NULL);
}

const char *kvf_envelope_body_name(const kvf_envelope_t *env)
{
    switch (env->body_case) {
    case KVF__ENVELOPE__BODY_REGISTER: return "register";
    case KVF__ENVELOPE__BODY_HEARTBEAT: return "heartbeat";
    case KVF__ENVELOPE__BODY_DEREGISTER: return "deregister";
    case KVF__ENVELOPE__BODY_PREFILL_REQUEST: return "prefill_request";
    case KVF__ENVELOPE__BODY_KV_ALLOC: return "kv_alloc";
    case KVF__ENVELOPE__BODY_KV_ALLOC_REPLY: return "kv_alloc_reply";
    case KVF__ENVELOPE__BODY_KV_READY: return "kv_ready";
    case KVF__ENVELOPE__BODY_PREFILL_DONE: return "prefill_done";
    case KVF__ENVELOPE__BODY_TOKEN_CHUNK: return "token_chunk";
    case KVF__ENVELOPE__BODY_TOKEN_BATCH: return "token_batch";
    case KVF__ENVELOPE__BODY_CANCEL: return "cancel";
    case KVF__ENVELOPE__BODY_ERROR: return "error";
    case KVF__ENVELOPE__BODY_STATS_REQUEST: return "stats_request";
    case KVF__ENVELOPE__BODY_STATS_REPLY: return "stats_reply";
    case KVF__ENVELOPE__BODY_GENERATE_REQUEST: return "generate_request";
    case KVF__ENVELOPE__BODY_GENERATE_CHUNK: return "generate_chunk";
    case KVF__ENVELOPE__BODY_REGISTER_REPLY: return "register_reply";
    case KVF__ENVELOPE__BODY_KV_LEASE: return "kv_lease";
    case KVF__ENVELOPE__BODY_KV_LEASE_REPLY: return "kv_lease_reply";
    case KVF__ENVELOPE__BODY_PREFIX_UPDATE: return "prefix_update";
    case KVF__ENVELOPE__BODY_PREFIX_RESYNC: return "prefix_resync";
    case KVF__ENVELOPE__BODY__NOT_SET: break;
    default: break;
    }
    return "none";
}

/* ---- sockets --------------------------------------------------------------- */

/* Why an inbox dropped a frame (its bounded log, kvf/identity.h). */
enum { DROP_TOO_BIG, DROP_FORMAT, DROP_VERSION, DROP_OTHER, DROP_N };
static const char *const drop_names[DROP_N] = {"too_big", "format", "version", "other"};

struct kvf_inbox {
    int sock;
    int fd;
    size_t max_len;
    uint64_t dropped;
    kvf_refusals_t drops; /* the log of dropped frames: the first few, then a summary */
    char url[256];
};

struct kvf_outbox {
    int sock;
    kvf_auth_stream_t stream; /* the frames this socket sends, when keyed */
    char url[256];
};

static kvf_status_t set_timeout(int sock, int option, int timeout_ms)
{
    int t = timeout_ms < 0 ? -1 : timeout_ms;
    if (nn_setsockopt(sock, NN_SOL_SOCKET, option, &t, sizeof(t)) < 0)
        return kvf_status_from_nn(nn_errno());
    return KVF_OK;
}

kvf_status_t kvf_inbox_create(const char *url, size_t max_len, kvf_inbox_t **inbox_p)
{
    if (!url || strlen(url) >= sizeof(((kvf_inbox_t *)0)->url))
        return KVF_ERR_INVAL;
    kvf_inbox_t *inbox = calloc(1, sizeof(*inbox));
    if (!inbox)
        return KVF_ERR_NOMEM;
    kvf_status_t st;
    inbox->max_len = max_len ? max_len : KVF_MSG_MAX_DEFAULT;
    snprintf(inbox->url, sizeof(inbox->url), "%s", url);
    inbox->sock = nn_socket(AF_SP, NN_PULL);
    if (inbox->sock < 0) {
        st = kvf_status_from_nn(nn_errno());
        kvf_log_error("inbox %s: nn_socket: %s", url, nn_strerror(nn_errno()));
        goto fail_socket;
    }
    kvf_refusals_init(&inbox->drops, drop_names, DROP_N);
    /* Frames up to KVF_MSG_OVERSIZE_FACTOR times the limit reach
     * kvf_inbox_recv, which drops them with a log line; nanomsg cuts the
     * connection of larger ones itself, before they are buffered. */
    size_t hard = inbox->max_len > 0x7fffffff / KVF_MSG_OVERSIZE_FACTOR
                      ? 0x7fffffff
                      : inbox->max_len * KVF_MSG_OVERSIZE_FACTOR;
    int max_size = (int)hard;
    nn_setsockopt(inbox->sock, NN_SOL_SOCKET, NN_RCVMAXSIZE, &max_size, sizeof(max_size));
    kvf_nn_tcp_nodelay(inbox->sock);
    if (nn_bind(inbox->sock, url) < 0) {
        st = kvf_status_from_nn(nn_errno());
        kvf_log_error("inbox %s: bind failed: %s", url, nn_strerror(nn_errno()));
        goto fail_bind;
    }
    size_t fd_len = sizeof(inbox->fd);
    if (nn_getsockopt(inbox->sock, NN_SOL_SOCKET, NN_RCVFD, &inbox->fd, &fd_len) < 0) {
        st = kvf_status_from_nn(nn_errno());
        kvf_log_error("inbox %s: NN_RCVFD: %s", url, nn_strerror(nn_errno()));
        goto fail_bind;
    }
    *inbox_p = inbox;
    return KVF_OK;
fail_bind:
    nn_close(inbox->sock);
fail_socket:
    free(inbox);
    return st;
}

void kvf_inbox_destroy(kvf_inbox_t *inbox)
{
    if (!inbox)
        return;
    nn_close(inbox->sock);
    free(inbox);
}

int kvf_inbox_fd(const kvf_inbox_t *inbox)
{
    return inbox->fd;
}

const char *kvf_inbox_url(const kvf_inbox_t *inbox)
{
    return inbox->url;
}

uint64_t kvf_inbox_dropped(const kvf_inbox_t *inbox)
{
    return inbox->dropped;
}

kvf_status_t kvf_inbox_recv(kvf_inbox_t *inbox, int timeout_ms, kvf_envelope_t **env_p)
{
    int flags = 0;
    if (timeout_ms == 0) {
        flags = NN_DONTWAIT;
    } else {
        kvf_status_t st = set_timeout(inbox->sock, NN_RCVTIMEO, timeout_ms);
        if (st != KVF_OK)
            return st;
    }
    void *msg = NULL;
    int n = nn_recv(inbox->sock, &msg, NN_MSG, flags);
    if (n < 0) {
        int err = nn_errno();
        if (err == EAGAIN)
            return timeout_ms == 0 ? KVF_ERR_AGAIN : KVF_ERR_TIMEOUT;
        if (err == ETIMEDOUT)
            return KVF_ERR_TIMEOUT;
        if (err != EINTR)
            kvf_log_error("inbox %s: recv failed: %s", inbox->url, nn_strerror(err));
        return err == EINTR ? KVF_ERR_AGAIN : kvf_status_from_nn(err);
    }
    kvf_status_t st = kvf_envelope_decode_at(msg, (size_t)n, inbox->max_len, inbox->url, 0, env_p);
    nn_freemsg(msg);
    if (st != KVF_OK) {
        inbox->dropped++;
        /* A refusal is logged (rate-limited) and counted by kvf/auth.h. */
        if (st == KVF_ERR_TOO_BIG)
            kvf_refusals_note(&inbox->drops, DROP_TOO_BIG,
                              "inbox %s: dropped a %d-byte message: %s (the limit is %zu bytes)",
                              inbox->url, n, kvf_status_str(st), inbox->max_len);
        else if (st != KVF_ERR_AUTH)
            kvf_refusals_note(&inbox->drops,
                              st == KVF_ERR_FORMAT    ? DROP_FORMAT
                              : st == KVF_ERR_VERSION ? DROP_VERSION
                                                      : DROP_OTHER,
                              "inbox %s: dropped a %d-byte message: %s", inbox->url, n,
                              kvf_status_str(st));
    }
    return st;
}

kvf_status_t kvf_outbox_create(const char *url, kvf_outbox_t **outbox_p)
{
    if (!url || strlen(url) >= sizeof(((kvf_outbox_t *)0)->url))
        return KVF_ERR_INVAL;
    kvf_outbox_t *outbox = calloc(1, sizeof(*outbox));
    if (!outbox)
        return KVF_ERR_NOMEM;
    kvf_status_t st = kvf_auth_stream_init(&outbox->stream);
    if (st != KVF_OK)
        goto fail_socket;
    snprintf(outbox->url, sizeof(outbox->url), "%s", url);
    outbox->sock = nn_socket(AF_SP, NN_PUSH);
    if (outbox->sock < 0) {
        st = kvf_status_from_nn(nn_errno());
        kvf_log_error("outbox %s: nn_socket: %s", url, nn_strerror(nn_errno()));
        goto fail_socket;
    }
    /* Reconnect quickly after a peer restarts; cap the back-off at 1 s. */
    int ivl = 50, ivl_max = 1000;
    nn_setsockopt(outbox->sock, NN_SOL_SOCKET, NN_RECONNECT_IVL, &ivl, sizeof(ivl));
    nn_setsockopt(outbox->sock, NN_SOL_SOCKET, NN_RECONNECT_IVL_MAX, &ivl_max, sizeof(ivl_max));
    kvf_nn_tcp_nodelay(outbox->sock);
    if (nn_connect(outbox->sock, url) < 0) {
        st = kvf_status_from_nn(nn_errno());
        kvf_log_error("outbox %s: connect failed: %s", url, nn_strerror(nn_errno()));
        goto fail_connect;
    }
    *outbox_p = outbox;
    return KVF_OK;
fail_connect:
    nn_close(outbox->sock);
fail_socket:
    free(outbox);
    return st;
}

void kvf_outbox_destroy(kvf_outbox_t *outbox)
{
    if (!outbox)
        return;
    nn_close(outbox->sock);
    free(outbox);
}

const char *kvf_outbox_url(const kvf_outbox_t *outbox)
{
    return outbox->url;
}

kvf_status_t kvf_outbox_send_frame(kvf_outbox_t *outbox, const uint8_t *frame, size_t len,
                                   int timeout_ms)
{
    int flags = 0;
    if (timeout_ms == 0) {
        flags = NN_DONTWAIT;
    } else {
        kvf_status_t st = set_timeout(outbox->sock, NN_SNDTIMEO, timeout_ms);
        if (st != KVF_OK)
            return st;
    }
    for (;;) {
        int n = nn_send(outbox->sock, frame, len, flags);
        if (n >= 0)
            return KVF_OK;
        int err = nn_errno();
        if (err == EINTR)
            continue;
        if (err == EAGAIN || err == ETIMEDOUT)
            return KVF_ERR_TIMEOUT;
        kvf_log_error("outbox %s: send failed: %s", outbox->url, nn_strerror(err));
        return kvf_status_from_nn(err);
    }
}

kvf_status_t kvf_outbox_send(kvf_outbox_t *outbox, const kvf_envelope_t *env, int timeout_ms)
{
    uint8_t *frame;
    size_t len;
    kvf_status_t st = kvf_envelope_encode_to(env, outbox->url, &outbox->stream, &frame, &len);
    if (st != KVF_OK)
        return st;
    st = kvf_outbox_send_frame(outbox, frame, len, timeout_ms);
    free(frame);
    return st;
}

typedef struct {
    char *url;
    kvf_outbox_t *outbox;
    uint64_t last_used_ns;
} outbox_slot_t;

struct kvf_outboxes {
    size_t max;
    outbox_slot_t *slots; /* (max) */
};

kvf_status_t kvf_outboxes_create(size_t max, kvf_outboxes_t **cache_p)
{
    kvf_outboxes_t *c = calloc(1, sizeof(*c));
    if (!c)
        return KVF_ERR_NOMEM;
    c->max = max ? max : 64;
    c->slots = calloc(c->max, sizeof(*c->slots));
    if (!c->slots) {
        free(c);
        return KVF_ERR_NOMEM;
    }
    *cache_p = c;
    return KVF_OK;
}

static void slot_close(outbox_slot_t *s)
{
    kvf_outbox_destroy(s->outbox);
    free(s->url);
    memset(s, 0, sizeof(*s));
}

void kvf_outboxes_destroy(kvf_outboxes_t *cache)
{
    if (!cache)
        return;
    for (size_t i = 0; i < cache->max; i++)
        slot_close(&cache->slots[i]);
    free(cache->slots);
    free(cache);
}

static outbox_slot_t *slot_for(kvf_outboxes_t *cache, const char *url)
{
    outbox_slot_t *free_slot = NULL, *oldest = &cache->slots[0];
    for (size_t i = 0; i < cache->max; i++) {
        outbox_slot_t *s = &cache->slots[i];
        if (s->url && !strcmp(s->url, url))
            return s;
        if (!s->url && !free_slot)
            free_slot = s;
        if (s->last_used_ns < oldest->last_used_ns)
            oldest = s;
    }
    if (!free_slot) {
        free_slot = oldest;
        slot_close(free_slot);
    }
    char *copy = strdup(url);
    if (!copy)
        return NULL;
    if (kvf_outbox_create(url, &free_slot->outbox) != KVF_OK) {
        free(copy);
        return NULL;
    }
    free_slot->url = copy;
    return free_slot;
}

kvf_status_t kvf_outboxes_send(kvf_outboxes_t *cache, const char *url, const kvf_envelope_t *env,
                               int timeout_ms)
{
    outbox_slot_t *s = slot_for(cache, url);
    if (!s)
        return KVF_ERR_INVAL;
    s->last_used_ns = kvf_clock_ns();
    return kvf_outbox_send(s->outbox, env, timeout_ms);
}

void kvf_outboxes_forget(kvf_outboxes_t *cache, const char *url)
{
    for (size_t i = 0; i < cache->max; i++)
        if (cache->slots[i].url && !strcmp(cache->slots[i].url, url))
            slot_close(&cache->slots[i]);
}

void kvf_nn_tcp_nodelay(int sock)
{
    int one = 1;
    if (nn_setsockopt(sock, NN_TCP, NN_TCP_NODELAY, &one, sizeof(one)) < 0)
        kvf_log_warn("TCP_NODELAY on a nanomsg socket: %s", nn_strerror(nn_errno()));
}

bool kvf_net_url_is_local(const char *url)
{
    if (!url)
        return false;
    if (!strncmp(url, "ipc://", 6) || !strncmp(url, "inproc://", 9))
        return true;
    if (strncmp(url, "tcp://", 6))
        return false;
    const char *host = url + 6;
    if (!strncmp(host, "[::1]:", 6))
        return true;
    const char *colon = strrchr(host, ':');
    size_t len = colon ? (size_t)(colon - host) : strlen(host);
    if (len == 9 && !strncmp(host, "localhost", 9))
        return true;
    /* 127.0.0.0/8: four decimal parts, the first 127. */
    char buf[64], rest;
    unsigned a, b, c, d;
    if (len == 0 || len >= sizeof(buf))
        return false;
    memcpy(buf, host, len);
    buf[len] = '\0';
    return sscanf(buf, "%u.%u.%u.%u%c", &a, &b, &c, &d, &rest) == 4 && a == 127 && b < 256 &&
           c < 256 && d < 256;
}
