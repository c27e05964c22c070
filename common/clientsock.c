#include "kvf/clientsock.h"
#include "kvf/clock.h"
#include "kvf/log.h"

#include <errno.h>
#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kvf_client_server {
    int sock;
    int fd;
    kvf_auth_stream_t stream; /* its replies, when keyed */
    char url[256];
};

struct kvf_client {
    int sock;
    uint32_t next_id;
    kvf_auth_stream_t stream; /* its requests, when keyed */
    char url[256];
};

/* The destination a reply on a client connection is signed for: the
 * connection itself, which has no URL of its own (kvf/auth.h). */
#define REPLY_DEST ""

/* Builds an SP_HDR control block holding hdr (len bytes) into buf. */
static size_t hdr_cmsg(uint8_t *buf, size_t buf_len, const uint8_t *hdr, size_t len)
{
    size_t data = sizeof(size_t) + len;
    KVF_ASSERT(NN_CMSG_SPACE(data) <= buf_len);
    memset(buf, 0, NN_CMSG_SPACE(data));
    struct nn_cmsghdr *c = (struct nn_cmsghdr *)buf;
    c->cmsg_len = NN_CMSG_LEN(data);
    c->cmsg_level = PROTO_SP;
    c->cmsg_type = SP_HDR;
    memcpy(NN_CMSG_DATA(c), &len, sizeof(size_t));
    memcpy(NN_CMSG_DATA(c) + sizeof(size_t), hdr, len);
    return NN_CMSG_SPACE(data);
}

/* Sends env with the SP header hdr, signed (with a key) on stream for the
 * destination to. */
static kvf_status_t send_with_hdr(int sock, const uint8_t *hdr, size_t hdr_len,
                                  const kvf_envelope_t *env, int flags, kvf_auth_stream_t *stream,
                                  const char *to)
{
    uint8_t *frame;
    size_t len;
    kvf_status_t st = kvf_envelope_encode_to(env, to, stream, &frame, &len);
    if (st != KVF_OK)
        return st;
    uint8_t ctrl[NN_CMSG_SPACE(sizeof(size_t) + KVF_CLIENT_HDR_MAX)];
    struct nn_iovec iov = {frame, len};
    struct nn_msghdr h;
    memset(&h, 0, sizeof(h));
    h.msg_iov = &iov;
    h.msg_iovlen = 1;
    h.msg_control = ctrl;
    h.msg_controllen = hdr_cmsg(ctrl, sizeof(ctrl), hdr, hdr_len);
    int rc;
    do {
        rc = nn_sendmsg(sock, &h, flags);
    } while (rc < 0 && nn_errno() == EINTR);
    free(frame);
    if (rc < 0) {
        int err = nn_errno();
        return err == EAGAIN || err == ETIMEDOUT ? KVF_ERR_AGAIN : kvf_status_from_nn(err);
    }
    return KVF_OK;
}

/* Receives a frame and its SP_HDR, checked as taken by the socket at
 * local (kvf_envelope_decode_at). hdr may be NULL. */
static kvf_status_t recv_with_hdr(int sock, int flags, const char *local, kvf_envelope_t **env_p,
                                  kvf_client_hdr_t *hdr)
{
    void *body = NULL, *ctrl = NULL;
    struct nn_iovec iov = {&body, NN_MSG};
    struct nn_msghdr h;
    memset(&h, 0, sizeof(h));
    h.msg_iov = &iov;
    h.msg_iovlen = 1;
    h.msg_control = &ctrl;
    h.msg_controllen = NN_MSG;
    int n = nn_recvmsg(sock, &h, flags);
    if (n < 0) {
        int err = nn_errno();
        if (err == EAGAIN || err == EINTR)
            return KVF_ERR_AGAIN;
        if (err == ETIMEDOUT)
            return KVF_ERR_TIMEOUT;
        return kvf_status_from_nn(err);
    }
    kvf_status_t st = KVF_OK;
    if (hdr) {
        st = KVF_ERR_FORMAT;
        struct nn_cmsghdr *c = ctrl ? NN_CMSG_FIRSTHDR(&h) : NULL;
        for (; c; c = NN_CMSG_NXTHDR(&h, c)) {
            if (c->cmsg_level != PROTO_SP || c->cmsg_type != SP_HDR)
                continue;
            size_t avail = c->cmsg_len - NN_CMSG_LEN(0), len;
            if (avail < sizeof(size_t))
                break;
            memcpy(&len, NN_CMSG_DATA(c), sizeof(size_t));
            if (len == 0 || len > KVF_CLIENT_HDR_MAX || len > avail - sizeof(size_t))
                break;
            memcpy(hdr->bytes, NN_CMSG_DATA(c) + sizeof(size_t), len);
            hdr->len = len;
            st = KVF_OK;
            break;
        }
    }
    if (st == KVF_OK)
        st = kvf_envelope_decode_at(body, (size_t)n, KVF_MSG_MAX_DEFAULT, local, 0, env_p);
    nn_freemsg(body);
    if (ctrl)
        nn_freemsg(ctrl);
    return st;
}

kvf_status_t kvf_client_server_create(const char *url, kvf_client_server_t **server_p)
{
    if (!url || strlen(url) >= sizeof(((kvf_client_server_t *)0)->url))
        return KVF_ERR_INVAL;
    kvf_client_server_t *s = calloc(1, sizeof(*s));
    if (!s)
        return KVF_ERR_NOMEM;
    kvf_status_t st = kvf_auth_stream_init(&s->stream);
    if (st != KVF_OK)
        goto fail_socket;
    snprintf(s->url, sizeof(s->url), "%s", url);
    s->sock = nn_socket(AF_SP_RAW, NN_REP);
    if (s->sock < 0) {
        st = kvf_status_from_nn(nn_errno());
        goto fail_socket;
    }
    int max = KVF_MSG_MAX_DEFAULT;
    nn_setsockopt(s->sock, NN_SOL_SOCKET, NN_RCVMAXSIZE, &max, sizeof(max));
    kvf_nn_tcp_nodelay(s->sock);
    if (nn_bind(s->sock, url) < 0) {
        st = kvf_status_from_nn(nn_errno());
        kvf_log_error("client socket %s: bind failed: %s", url, nn_strerror(nn_errno()));
        goto fail_bind;
    }
    size_t fl = sizeof(s->fd);
    if (nn_getsockopt(s->sock, NN_SOL_SOCKET, NN_RCVFD, &s->fd, &fl) < 0) {
        st = kvf_status_from_nn(nn_errno());
        goto fail_bind;
    }
    *server_p = s;
    return KVF_OK;
fail_bind:
    nn_close(s->sock);
fail_socket:
    free(s);
    return st;
}

void kvf_client_server_destroy(kvf_client_server_t *server)
{
    if (!server)
        return;
    nn_close(server->sock);
    free(server);
}

int kvf_client_server_fd(const kvf_client_server_t *server)
{
    return server->fd;
}

kvf_status_t kvf_client_server_recv(kvf_client_server_t *server, kvf_envelope_t **env_p,
                                    kvf_client_hdr_t *hdr_p)
{
    kvf_client_hdr_t hdr;
    kvf_status_t st = recv_with_hdr(server->sock, NN_DONTWAIT, server->url, env_p, &hdr);
    if (st == KVF_OK)
        *hdr_p = hdr;
    else if (st != KVF_ERR_AGAIN && st != KVF_ERR_AUTH) /* a refusal is logged by kvf/auth.h */
        kvf_log_warn("client socket %s: dropped a request: %s", server->url, kvf_status_str(st));
    return st;
}

kvf_status_t kvf_client_server_send(kvf_client_server_t *server, const kvf_client_hdr_t *hdr,
                                    const kvf_envelope_t *env)
{
    return send_with_hdr(server->sock, hdr->bytes, hdr->len, env, NN_DONTWAIT, &server->stream,
                         REPLY_DEST);
}

kvf_status_t kvf_client_create(const char *url, kvf_client_t **client_p)
{
    if (!url || strlen(url) >= sizeof(((kvf_client_t *)0)->url))
        return KVF_ERR_INVAL;
    kvf_client_t *c = calloc(1, sizeof(*c));
    if (!c)
        return KVF_ERR_NOMEM;
    kvf_status_t st = kvf_auth_stream_init(&c->stream);
    if (st != KVF_OK)
        goto fail_socket;
    snprintf(c->url, sizeof(c->url), "%s", url);
    c->next_id = (uint32_t)(kvf_clock_ns() & 0x7fffffff);
    c->sock = nn_socket(AF_SP_RAW, NN_REQ);
    if (c->sock < 0) {
        st = kvf_status_from_nn(nn_errno());
        goto fail_socket;
    }
    int max = KVF_MSG_MAX_DEFAULT;
    nn_setsockopt(c->sock, NN_SOL_SOCKET, NN_RCVMAXSIZE, &max, sizeof(max));
    int ivl = 50;
    nn_setsockopt(c->sock, NN_SOL_SOCKET, NN_RECONNECT_IVL, &ivl, sizeof(ivl));
    kvf_nn_tcp_nodelay(c->sock);
    if (nn_connect(c->sock, url) < 0) {
        st = kvf_status_from_nn(nn_errno());
        kvf_log_error("client %s: connect failed: %s", url, nn_strerror(nn_errno()));
        goto fail_connect;
    }
    *client_p = c;
    return KVF_OK;
fail_connect:
    nn_close(c->sock);
fail_socket:
    free(c);
    return st;
}

void kvf_client_destroy(kvf_client_t *client)
{
    if (!client)
        return;
    nn_close(client->sock);
    free(client);
}

kvf_status_t kvf_client_send(kvf_client_t *client, const kvf_envelope_t *env, int timeout_ms)
{
    uint32_t id = 0x80000000u | (client->next_id++ & 0x7fffffffu);
    uint8_t hdr[4] = {(uint8_t)(id >> 24), (uint8_t)(id >> 16), (uint8_t)(id >> 8), (uint8_t)id};
    int t = timeout_ms < 0 ? -1 : timeout_ms;
    nn_setsockopt(client->sock, NN_SOL_SOCKET, NN_SNDTIMEO, &t, sizeof(t));
    kvf_status_t st =
        send_with_hdr(client->sock, hdr, sizeof(hdr), env, 0, &client->stream, client->url);
    return st == KVF_ERR_AGAIN ? KVF_ERR_TIMEOUT : st;
}

kvf_status_t kvf_client_recv(kvf_client_t *client, int timeout_ms, kvf_envelope_t **env_p)
{
    int t = timeout_ms < 0 ? -1 : timeout_ms;
    nn_setsockopt(client->sock, NN_SOL_SOCKET, NN_RCVTIMEO, &t, sizeof(t));
    for (;;) {
        kvf_status_t st = recv_with_hdr(client->sock, 0, REPLY_DEST, env_p, NULL);
        if (st == KVF_ERR_AGAIN && timeout_ms != 0)
            st = KVF_ERR_TIMEOUT;
        return st;
    }
}

kvf_status_t kvf_client_stats(kvf_client_t *client, const char *sender, int timeout_ms,
                              kvf_envelope_t **reply_p)
{
    Kvf__StatsRequest sr = KVF__STATS_REQUEST__INIT;
    sr.req_id = kvf_clock_ns();
    kvf_envelope_t env;
    kvf_envelope_init(&env, sender);
    env.body_case = KVF__ENVELOPE__BODY_STATS_REQUEST;
    env.stats_request = &sr;
    kvf_status_t st = kvf_client_send(client, &env, timeout_ms);
    if (st != KVF_OK)
        return st == KVF_ERR_TIMEOUT ? KVF_ERR_PEER : st;
    uint64_t deadline = kvf_clock_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (kvf_clock_ns() < deadline) {
        kvf_envelope_t *in;
        if (kvf_client_recv(client, kvf_clock_ms_until(deadline), &in) != KVF_OK)
            continue;
        if (in->body_case == KVF__ENVELOPE__BODY_STATS_REPLY &&
            in->stats_reply->req_id == sr.req_id) {
            *reply_p = in;
            return KVF_OK;
        }
        kvf_envelope_free(in);
    }
    return KVF_ERR_TIMEOUT;
}

kvf_status_t kvf_client_generate(kvf_client_t *client, const char *sender,
                                 const kvf_client_generate_t *req, int timeout_ms)
{
    Kvf__GenerateRequest g = KVF__GENERATE_REQUEST__INIT;
    g.client_req_id = req->client_req_id;
    g.prompt.data = (uint8_t *)(req->prompt ? req->prompt : "");
    g.prompt.len = !req->prompt ? 0 : req->prompt_len ? req->prompt_len : strlen(req->prompt);
    g.prompt_ids = (uint32_t *)req->ids;
    g.n_prompt_ids = req->n_ids;
    g.sampling = (Kvf__Sampling *)req->sampling;
    kvf_envelope_t env;
    kvf_envelope_init(&env, sender);
    env.body_case = KVF__ENVELOPE__BODY_GENERATE_REQUEST;
    env.generate_request = &g;
    return kvf_client_send(client, &env, timeout_ms);
}

kvf_status_t kvf_client_cancel(kvf_client_t *client, const char *sender, uint64_t client_req_id,
                               int timeout_ms)
{
    Kvf__Cancel c = KVF__CANCEL__INIT;
    c.req_id = client_req_id;
    kvf_envelope_t env;
    kvf_envelope_init(&env, sender);
    env.body_case = KVF__ENVELOPE__BODY_CANCEL;
    env.cancel = &c;
    return kvf_client_send(client, &env, timeout_ms);
}
