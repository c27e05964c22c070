/* The soak driver's HTTP/1.1 client. See soak_http.h. */
#include "soak_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvf/array.h"

enum { CHUNK_SIZE, CHUNK_DATA, CHUNK_CRLF, CHUNK_TRAILER };

kvf_status_t kvf_soak_buf_append(kvf_soak_buf_t *b, const char *bytes, size_t n)
{
    kvf_status_t st = kvf_array_reserve(&b->data, &b->cap, b->len + n + 1, 256, 1);
    if (st != KVF_OK)
        return st;
    if (n)
        memcpy(b->data + b->len, bytes, n);
    b->len += n;
    b->data[b->len] = '\0';
    return KVF_OK;
}

void kvf_soak_buf_consume(kvf_soak_buf_t *b, size_t n)
{
    if (!n)
        return;
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = '\0';
}

void kvf_soak_buf_free(kvf_soak_buf_t *b)
{
    free(b->data);
    *b = (kvf_soak_buf_t){0};
}

static kvf_status_t send_all(int fd, const char *data, size_t len)
{
    while (len > 0) {
        ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return KVF_ERR_IO;
        data += n;
        len -= (size_t)n;
    }
    return KVF_OK;
}

kvf_status_t kvf_soak_http_post(kvf_soak_http_t *h, int port, const char *path, const char *body,
                                char *err, size_t err_len)
{
    *h = (kvf_soak_http_t){.fd = -1, .content_left = -1};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, err_len, "socket: %s", strerror(errno));
        return KVF_ERR_IO;
    }
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        snprintf(err, err_len, "connect to 127.0.0.1:%d: %s", port, strerror(errno));
        close(fd);
        return KVF_ERR_PEER;
    }
    char head[256];
    size_t body_len = strlen(body);
    int n = snprintf(head, sizeof(head),
                     "POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                     path, port, body_len);
    /* Blocking sends: a request is a few KiB, which the socket buffer takes. */
    if (send_all(fd, head, (size_t)n) != KVF_OK || send_all(fd, body, body_len) != KVF_OK) {
        snprintf(err, err_len, "send: %s", strerror(errno));
        close(fd);
        return KVF_ERR_PEER;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    h->fd = fd;
    return KVF_OK;
}

/* The status line and headers, once the blank line after them arrived. */
static kvf_status_t parse_head(kvf_soak_http_t *h, char *err, size_t err_len)
{
    char *end = strstr(h->in.data, "\r\n\r\n");
    if (!end)
        return KVF_OK;
    *end = '\0';
    if (sscanf(h->in.data, "HTTP/1.%*d %d", &h->status) != 1 || h->status < 100) {
        snprintf(err, err_len, "malformed status line '%.60s'", h->in.data);
        return KVF_ERR_FORMAT;
    }
    for (char *line = strstr(h->in.data, "\r\n"); line; line = strstr(line, "\r\n")) {
        line += 2;
        if (!strncasecmp(line, "transfer-encoding:", 18) && strstr(line, "chunked"))
            h->chunked = true;
        else if (!strncasecmp(line, "content-length:", 15))
            h->content_left = strtoll(line + 15, NULL, 10);
    }
    kvf_soak_buf_consume(&h->in, (size_t)(end - h->in.data) + 4);
    return KVF_OK;
}

/* Moves up to max bytes of h->in into the body. */
static kvf_status_t take_body(kvf_soak_http_t *h, size_t max, size_t *taken_p)
{
    size_t n = h->in.len < max ? h->in.len : max;
    if (n && kvf_soak_buf_append(&h->body, h->in.data, n) != KVF_OK)
        return KVF_ERR_NOMEM;
    kvf_soak_buf_consume(&h->in, n);
    h->body_total += n;
    *taken_p = n;
    return KVF_OK;
}

/* One step of the chunked decoding; *more_p false when it needs more input. */
static kvf_status_t chunk_step(kvf_soak_http_t *h, bool *more_p, char *err, size_t err_len)
{
    char *eol = h->in.data ? strstr(h->in.data, "\r\n") : NULL;
    size_t taken;
    *more_p = false;
    switch (h->chunk_state) {
    case CHUNK_SIZE:
        if (!eol)
            return KVF_OK;
        h->chunk_left = strtoul(h->in.data, NULL, 16);
        kvf_soak_buf_consume(&h->in, (size_t)(eol - h->in.data) + 2);
        h->chunk_state = h->chunk_left ? CHUNK_DATA : CHUNK_TRAILER;
        break;
    case CHUNK_DATA:
        if (take_body(h, h->chunk_left, &taken) != KVF_OK)
            return KVF_ERR_NOMEM;
        h->chunk_left -= taken;
        if (h->chunk_left)
            return KVF_OK;
        h->chunk_state = CHUNK_CRLF;
        break;
    case CHUNK_CRLF:
        if (h->in.len < 2)
            return KVF_OK;
        if (memcmp(h->in.data, "\r\n", 2) != 0) {
            snprintf(err, err_len, "chunk not followed by CRLF");
            return KVF_ERR_FORMAT;
        }
        kvf_soak_buf_consume(&h->in, 2);
        h->chunk_state = CHUNK_SIZE;
        break;
    default: /* trailer lines, up to an empty one */
        if (!eol)
            return KVF_OK;
        if (eol == h->in.data)
            h->complete = true;
        kvf_soak_buf_consume(&h->in, (size_t)(eol - h->in.data) + 2);
        if (h->complete)
            return KVF_OK;
    }
    *more_p = true;
    return KVF_OK;
}

static kvf_status_t decode(kvf_soak_http_t *h, char *err, size_t err_len)
{
    if (!h->status) {
        kvf_status_t st = h->in.len ? parse_head(h, err, err_len) : KVF_OK;
        if (st != KVF_OK || !h->status)
            return st;
    }
    if (h->chunked) {
        bool more = true;
        while (more && !h->complete) {
            kvf_status_t st = chunk_step(h, &more, err, err_len);
            if (st != KVF_OK)
                return st;
        }
        return KVF_OK;
    }
    size_t taken;
    if (take_body(h, h->content_left >= 0 ? (size_t)h->content_left : SIZE_MAX, &taken) != KVF_OK)
        return KVF_ERR_NOMEM;
    if (h->content_left >= 0) {
        h->content_left -= (long long)taken;
        h->complete = h->content_left == 0;
    }
    return KVF_OK;
}

kvf_status_t kvf_soak_http_pump(kvf_soak_http_t *h, char *err, size_t err_len)
{
    bool eof = false;
    char buf[16384];
    while (h->fd >= 0 && !h->complete) {
        ssize_t n = recv(h->fd, buf, sizeof(buf), 0);
        if (n > 0) {
            if (kvf_soak_buf_append(&h->in, buf, (size_t)n) != KVF_OK)
                return KVF_ERR_NOMEM;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        eof = true; /* closed (0) or reset */
        break;
    }
    kvf_status_t st = decode(h, err, err_len);
    if (st != KVF_OK || h->complete || !eof)
        return st;
    if (h->status && !h->chunked && h->content_left < 0) {
        h->complete = true; /* a body delimited by the close */
        return KVF_OK;
    }
    snprintf(err, err_len,
             "connection closed before the end of the response (status %d, %zu body "
             "bytes)",
             h->status, h->body_total);
    return KVF_ERR_PEER;
}

const char *kvf_soak_http_event(kvf_soak_http_t *h)
{
    char *end = h->body.data ? strstr(h->body.data, "\n\n") : NULL;
    if (!end)
        return NULL;
    size_t len = (size_t)(end - h->body.data);
    h->event.len = 0;
    const char *data = h->body.data;
    /* One data line per event here (the router writes no other field). */
    size_t skip = !strncmp(data, "data: ", 6) ? 6 : 0;
    kvf_status_t st = kvf_soak_buf_append(&h->event, data + skip, len - skip);
    kvf_soak_buf_consume(&h->body, len + 2);
    return st == KVF_OK ? h->event.data : NULL;
}

void kvf_soak_http_close(kvf_soak_http_t *h)
{
    if (h->fd >= 0)
        close(h->fd);
    h->fd = -1;
    kvf_soak_buf_free(&h->in);
    kvf_soak_buf_free(&h->body);
    kvf_soak_buf_free(&h->event);
}

cJSON *kvf_soak_json_parse(const char *json)
{
    kvf_soak_buf_t s = {0};
    bool ok = true;
    for (size_t i = 0; json[i] && ok;) {
        const char *pair = NULL;
        if (!strncmp(json + i, "\\u0000", 6))
            pair = "\\u0001\\u0002";
        else if (!strncmp(json + i, "\\u0001", 6))
            pair = "\\u0001\\u0001";
        /* Any other escape is taken whole: in \\u0000 the backslash is escaped. */
        size_t n = pair ? 6 : json[i] == '\\' && json[i + 1] ? 2 : 1;
        ok = kvf_soak_buf_append(&s, pair ? pair : json + i, pair ? 12 : n) == KVF_OK;
        i += n;
    }
    cJSON *root = ok && s.len ? cJSON_ParseWithLength(s.data, s.len) : NULL;
    kvf_soak_buf_free(&s);
    return root;
}

kvf_status_t kvf_soak_json_text(const cJSON *string, kvf_soak_buf_t *out)
{
    const char *v = string->valuestring;
    for (size_t i = 0; v[i]; i++) {
        char c = v[i];
        if (c == '\x01' && (v[i + 1] == '\x01' || v[i + 1] == '\x02'))
            c = v[++i] == '\x02' ? '\0' : '\x01';
        if (kvf_soak_buf_append(out, &c, 1) != KVF_OK)
            return KVF_ERR_NOMEM;
    }
    return KVF_OK;
}
