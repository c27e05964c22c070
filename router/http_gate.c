/* The HTTP front end's gate: the router's own listening socket, ahead of
 * libmicrohttpd. A connection stays here until its first request's head
 * has arrived, which the gate reads without taking it from the socket
 * (MSG_PEEK) and checks (kvf_http__classify_head, http_head.c): a head
 * that libmicrohttpd would refuse with its own HTML page (a malformed
 * request line or header field, an HTTP version other than 1.x, a bad
 * Content-Length, a head past the limits) is answered here with an OpenAI
 * error object and the connection closed; any other is handed to
 * libmicrohttpd (MHD_add_connection), which reads the same bytes.
 *
 * The gate keeps libmicrohttpd's limits for the connections it holds: the
 * header timeout (idle, as libmicrohttpd counts it) and the connection
 * limits, counted per client address over both (libmicrohttpd's own
 * connections through MHD_OPTION_NOTIFY_CONNECTION), so a client idle
 * here takes its share as it did there. One thread, one epoll set; an idle
 * connection costs a socket and a small record. Later requests on a
 * kept-alive connection go to libmicrohttpd directly (http.h says what it
 * answers itself). */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <uthash.h>

#include "http_internal.h"
#include "kvf/clock.h"
#include "kvf/log.h"

/* Each look reads the head from its start again (a peek cannot skip what
 * it saw): a head that needs more looks than this, a client trickling it
 * in small pieces, goes to libmicrohttpd unchecked, which reads each byte
 * once. That bounds the gate's work per connection. */
#define GATE_MAX_LOOKS 32

typedef struct gate_conn {
    int fd;
    unsigned looks;
    bool closing; /* answered: what the client still sends is read and dropped */
    uint64_t deadline_ns;
    struct sockaddr_storage addr;
    socklen_t addr_len;
    struct gate_conn *prev, *next; /* by deadline: each is its last activity + the timeout */
} gate_conn_t;

/* Connections from one client address, here and in libmicrohttpd. */
typedef struct {
    uint8_t key[17]; /* the family, then the address */
    unsigned n;
    UT_hash_handle hh;
} ip_count_t;

struct kvf_http_gate {
    kvf_http_t *h;
    struct MHD_Daemon *daemon;
    int listen_fd, epfd, stop_fd;
    pthread_t thread;
    bool running;
    pthread_mutex_t lock; /* ips, total: the gate's thread and libmicrohttpd's */
    ip_count_t *ips;
    unsigned total, max_total, per_ip;
    uint64_t timeout_ns;
    gate_conn_t *head, *tail;                   /* the thread's own */
    uint64_t accept_logged_ns, accept_failures; /* the thread's own */
    char peek[HTTP_GATE_PEEK];
};

static char listen_mark, stop_mark; /* epoll data of the two fds */

/* ---- counts per client address --------------------------------------------------- */

static void ip_key(const struct sockaddr *sa, uint8_t key[17])
{
    memset(key, 0, 17);
    key[0] = (uint8_t)sa->sa_family;
    if (sa->sa_family == AF_INET)
        memcpy(key + 1, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    else if (sa->sa_family == AF_INET6)
        memcpy(key + 1, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
}

/* Counts one more connection from sa; within the limits unless forced. */
static bool ip_take(kvf_http_gate_t *g, const struct sockaddr *sa, bool force)
{
    uint8_t key[17];
    ip_key(sa, key);
    pthread_mutex_lock(&g->lock);
    ip_count_t *e;
    HASH_FIND(hh, g->ips, key, sizeof(key), e);
    bool ok = force || (g->total < g->max_total && (!e || e->n < g->per_ip));
    if (ok && !e) {
        e = calloc(1, sizeof(*e));
        if (e) {
            memcpy(e->key, key, sizeof(key));
            HASH_ADD(hh, g->ips, key, sizeof(e->key), e);
        }
        ok = e != NULL;
    }
    if (ok) {
        e->n++;
        g->total++;
    }
    pthread_mutex_unlock(&g->lock);
    return ok;
}

static void ip_release(kvf_http_gate_t *g, const struct sockaddr *sa)
{
    uint8_t key[17];
    ip_key(sa, key);
    pthread_mutex_lock(&g->lock);
    ip_count_t *e;
    HASH_FIND(hh, g->ips, key, sizeof(key), e);
    if (e) {
        g->total--;
        if (--e->n == 0) {
            HASH_DEL(g->ips, e);
            free(e);
        }
    }
    pthread_mutex_unlock(&g->lock);
}

void kvf_http__gate_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                           enum MHD_ConnectionNotificationCode toe)
{
    (void)socket_context;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (!ci || !ci->client_addr)
        return;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED)
        (void)ip_take(cls, ci->client_addr, true); /* admitted by the gate already */
    else
        ip_release(cls, ci->client_addr);
}

/* ---- held connections ------------------------------------------------------------ */

static void unlink_conn(kvf_http_gate_t *g, gate_conn_t *c)
{
    *(c->prev ? &c->prev->next : &g->head) = c->next;
    *(c->next ? &c->next->prev : &g->tail) = c->prev;
    c->prev = c->next = NULL;
}

/* c was active: its deadline moves on (to the end of the list). */
static void touch(kvf_http_gate_t *g, gate_conn_t *c, bool linked)
{
    if (linked)
        unlink_conn(g, c);
    c->deadline_ns = kvf_clock_ns() + g->timeout_ns;
    c->prev = g->tail;
    *(g->tail ? &g->tail->next : &g->head) = c;
    g->tail = c;
}

static void close_conn(kvf_http_gate_t *g, gate_conn_t *c)
{
    unlink_conn(g, c);
    close(c->fd); /* leaves the epoll set */
    ip_release(g, (struct sockaddr *)&c->addr);
    free(c);
}

/* Reads and drops what the client sent (at most 64 buffers a call: one
 * that keeps sending cannot hold the thread); true once it has closed its
 * side. */
static bool drain(int fd, char *buf, size_t cap)
{
    for (int i = 0; i < 64; i++) {
        ssize_t n = recv(fd, buf, cap, MSG_DONTWAIT);
        if (n > 0)
            continue;
        return n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    }
    return false;
}

/* Answers err and closes the sending side; the connection lingers until
 * the client closes or its deadline, so that what it sent last does not
 * make the kernel reset the connection before the answer is read. */
static void answer(kvf_http_gate_t *g, gate_conn_t *c, const kvf_openai_error_t *err)
{
    bool gone = drain(c->fd, g->peek, sizeof(g->peek));
    cJSON *root = kvf_openai_error_json(err);
    char *body = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (body) {
        char head[256];
        const char *reason = MHD_get_reason_phrase_for(err->code);
        int n = snprintf(head, sizeof(head),
                         "HTTP/1.1 %u %s\r\nConnection: close\r\nContent-Type: "
                         "application/json\r\nContent-Length: %zu\r\n\r\n",
                         err->code, reason ? reason : "Error", strlen(body));
        struct iovec iov[2] = {{head, (size_t)n}, {body, strlen(body)}};
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2};
        (void)sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT); /* small: one send */
        free(body);
        kvf_http__count_response(g->h, err->code);
    }
    shutdown(c->fd, SHUT_WR);
    c->closing = true;
    if (gone)
        close_conn(g, c);
    else
        touch(g, c, true);
}

/* The head passed: libmicrohttpd takes the connection (and its count). */
static void hand_over(kvf_http_gate_t *g, gate_conn_t *c)
{
    unlink_conn(g, c);
    epoll_ctl(g->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    ip_release(g, (struct sockaddr *)&c->addr);
    /* It closes the socket when it cannot take it. */
    (void)MHD_add_connection(g->daemon, c->fd, (struct sockaddr *)&c->addr, c->addr_len);
    free(c);
}

static void on_conn(kvf_http_gate_t *g, gate_conn_t *c, uint32_t events)
{
    if (c->closing) {
        if (drain(c->fd, g->peek, sizeof(g->peek)) || (events & (EPOLLHUP | EPOLLERR)))
            close_conn(g, c);
        return;
    }
    ssize_t n = recv(c->fd, g->peek, sizeof(g->peek), MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (n <= 0) {
        close_conn(g, c); /* gone before a whole head */
        return;
    }
    kvf_openai_error_t err;
    kvf_http_head_t head = kvf_http__classify_head(g->peek, (size_t)n, &err);
    if (head == KVF_HTTP_HEAD_MORE && (size_t)n == sizeof(g->peek)) {
        /* A full look and no head yet (empty lines before it): it cannot
         * fit the limits. */
        kvf_openai_set_error(&err, MHD_HTTP_REQUEST_HEADER_FIELDS_TOO_LARGE,
                             "invalid_request_error", NULL, "header_fields_too_large",
                             "the request's head is larger than %zu bytes", sizeof(g->peek));
        head = KVF_HTTP_HEAD_REFUSE;
    }
    switch (head) {
    case KVF_HTTP_HEAD_MORE:
        if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))
            close_conn(g, c); /* it will send no more */
        else if (++c->looks >= GATE_MAX_LOOKS)
            hand_over(g, c);
        else
            touch(g, c, true);
        break;
    case KVF_HTTP_HEAD_PASS:
        hand_over(g, c);
        break;
    case KVF_HTTP_HEAD_REFUSE:
        answer(g, c, &err);
        break;
    }
}

/* At most one line per ACCEPT_LOG_NS: out of file descriptors, every
 * new connection would say it again. */
#define ACCEPT_LOG_NS (10ull * 1000000000ull)

static void warn_accept(kvf_http_gate_t *g, int err)
{
    uint64_t now = kvf_clock_ns();
    g->accept_failures++;
    if (g->accept_logged_ns && now - g->accept_logged_ns < ACCEPT_LOG_NS)
        return;
    kvf_log_warn("http: accept: %s (%llu times since the last line)", strerror(err),
                 (unsigned long long)g->accept_failures);
    g->accept_logged_ns = now;
    g->accept_failures = 0;
}

static void accept_all(kvf_http_gate_t *g)
{
    for (;;) {
        struct sockaddr_storage addr;
        socklen_t len = sizeof(addr);
        int fd =
            accept4(g->listen_fd, (struct sockaddr *)&addr, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                warn_accept(g, errno); /* the next connection's edge retries */
            return;
        }
        if (!ip_take(g, (struct sockaddr *)&addr, false)) {
            close(fd); /* over a limit: refused at once, as libmicrohttpd does */
            continue;
        }
        gate_conn_t *c = calloc(1, sizeof(*c));
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.ptr = c};
        if (!c || epoll_ctl(g->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
            free(c);
            close(fd);
            ip_release(g, (struct sockaddr *)&addr);
            continue;
        }
        c->fd = fd;
        c->addr = addr;
        c->addr_len = len;
        touch(g, c, false); /* data already there is reported by the epoll set */
    }
}

static void *gate_main(void *arg)
{
    kvf_http_gate_t *g = arg;
    struct epoll_event evs[64];
    for (;;) {
        int wait_ms = -1;
        if (g->head) {
            uint64_t now = kvf_clock_ns();
            uint64_t left = g->head->deadline_ns > now ? g->head->deadline_ns - now : 0;
            wait_ms = (int)((left + 999999) / 1000000);
        }
        int n = epoll_wait(g->epfd, evs, 64, wait_ms);
        for (int i = 0; i < n; i++) {
            if (evs[i].data.ptr == &stop_mark)
                return NULL;
            if (evs[i].data.ptr == &listen_mark)
                accept_all(g);
            else
                on_conn(g, evs[i].data.ptr, evs[i].events);
        }
        uint64_t now = kvf_clock_ns();
        while (g->head && g->head->deadline_ns <= now)
            close_conn(g, g->head); /* idle past the header timeout */
    }
}

/* ---- lifecycle ------------------------------------------------------------------- */

static kvf_status_t gate_listen(kvf_http_gate_t *g, const struct sockaddr *addr, socklen_t len)
{
    g->listen_fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (g->listen_fd < 0)
        return KVF_ERR_IO;
    int one = 1;
    setsockopt(g->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (addr->sa_family == AF_INET6)
        setsockopt(g->listen_fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    if (bind(g->listen_fd, addr, len) != 0 || listen(g->listen_fd, SOMAXCONN) != 0)
        return KVF_ERR_IO;
    g->epfd = epoll_create1(EPOLL_CLOEXEC);
    g->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (g->epfd < 0 || g->stop_fd < 0)
        return KVF_ERR_IO;
    struct epoll_event lev = {.events = EPOLLIN | EPOLLET, .data.ptr = &listen_mark};
    struct epoll_event sev = {.events = EPOLLIN, .data.ptr = &stop_mark};
    if (epoll_ctl(g->epfd, EPOLL_CTL_ADD, g->listen_fd, &lev) != 0 ||
        epoll_ctl(g->epfd, EPOLL_CTL_ADD, g->stop_fd, &sev) != 0)
        return KVF_ERR_IO;
    return KVF_OK;
}

kvf_status_t kvf_http__gate_create(kvf_http_t *h, const struct sockaddr *addr, socklen_t len,
                                   unsigned max_connections, unsigned per_ip,
                                   kvf_http_gate_t **gate_p)
{
    kvf_http_gate_t *g = calloc(1, sizeof(*g));
    if (!g)
        return KVF_ERR_NOMEM;
    g->h = h;
    g->listen_fd = g->epfd = g->stop_fd = -1;
    g->max_total = max_connections;
    g->per_ip = per_ip;
    g->timeout_ns = (uint64_t)h->header_timeout_s * 1000000000ull;
    pthread_mutex_init(&g->lock, NULL);
    kvf_status_t st = gate_listen(g, addr, len);
    if (st != KVF_OK) {
        kvf_http__gate_destroy(g);
        return st;
    }
    *gate_p = g;
    return KVF_OK;
}

uint16_t kvf_http__gate_port(const kvf_http_gate_t *g)
{
    struct sockaddr_storage a;
    socklen_t len = sizeof(a);
    if (getsockname(g->listen_fd, (struct sockaddr *)&a, &len) != 0)
        return 0;
    return ntohs(a.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&a)->sin6_port
                                         : ((struct sockaddr_in *)&a)->sin_port);
}

kvf_status_t kvf_http__gate_start(kvf_http_gate_t *g, struct MHD_Daemon *daemon)
{
    g->daemon = daemon;
    if (pthread_create(&g->thread, NULL, gate_main, g) != 0)
        return KVF_ERR_NOMEM;
    g->running = true;
    return KVF_OK;
}

void kvf_http__gate_stop(kvf_http_gate_t *g)
{
    if (!g)
        return;
    if (g->running) {
        uint64_t one = 1;
        (void)!write(g->stop_fd, &one, sizeof(one));
        pthread_join(g->thread, NULL);
        g->running = false;
    }
    while (g->head)
        close_conn(g, g->head);
    if (g->listen_fd >= 0)
        close(g->listen_fd);
    g->listen_fd = -1;
}

void kvf_http__gate_destroy(kvf_http_gate_t *g)
{
    if (!g)
        return;
    kvf_http__gate_stop(g);
    if (g->epfd >= 0)
        close(g->epfd);
    if (g->stop_fd >= 0)
        close(g->stop_fd);
    ip_count_t *e, *tmp;
    HASH_ITER(hh, g->ips, e, tmp)
    {
        HASH_DEL(g->ips, e);
        free(e);
    }
    pthread_mutex_destroy(&g->lock);
    free(g);
}
