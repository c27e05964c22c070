/* Parked connections: a request or a stream that waits for the router's
 * loop suspends its connection (MHD_suspend_connection) instead of
 * blocking one of the server's few threads, and one thread here watches
 * every parked connection's exchange eventfd and client socket (epoll):
 * output, a hang-up, the server stopping or the wait's deadline resumes
 * the connection (MHD_resume_connection), and its handler or content
 * reader runs again and looks at what changed. See http_internal.h. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "http_internal.h"
#include "kvf/clock.h"
#include "kvf/log.h"

#define PARK_EVENTS 64

/* With park->lock held: takes w out of the epoll set and the armed list
 * and drains its eventfd (a change after this leaves it readable again). */
static void disarm(kvf_http_park_t *p, kvf_http_waiter_t *w)
{
    epoll_ctl(p->epfd, EPOLL_CTL_DEL, w->ex->wake_fd, NULL);
    if (w->ex->fd >= 0)
        epoll_ctl(p->epfd, EPOLL_CTL_DEL, w->ex->fd, NULL);
    uint64_t count;
    ssize_t rd = read(w->ex->wake_fd, &count, sizeof(count));
    (void)rd;
    if (w->prev)
        w->prev->next = w->next;
    else
        p->armed = w->next;
    if (w->next)
        w->next->prev = w->prev;
    w->prev = w->next = NULL;
    w->armed = false;
}

/* With park->lock held: disarms the waiters whose deadline passed (every
 * one when the server stops) onto *resume_p; recomputes next_check. */
static void expire(kvf_http_park_t *p, uint64_t now, kvf_http_waiter_t **resume_p)
{
    if (!p->stopped && now < p->next_check)
        return;
    p->next_check = UINT64_MAX;
    kvf_http_waiter_t *w = p->armed;
    while (w) {
        kvf_http_waiter_t *next = w->next;
        if (p->stopped || w->deadline_ns <= now) {
            disarm(p, w);
            w->resume_next = *resume_p;
            *resume_p = w;
        } else if (w->deadline_ns < p->next_check) {
            p->next_check = w->deadline_ns;
        }
        w = next;
    }
}

static int wait_ms(const kvf_http_park_t *p)
{
    if (p->next_check == UINT64_MAX)
        return -1;
    uint64_t now = kvf_clock_ns();
    if (p->next_check <= now)
        return 0;
    uint64_t ms = (p->next_check - now + 999999) / 1000000;
    return ms > 60000 ? 60000 : (int)ms;
}

static void *park_thread(void *arg)
{
    kvf_http_park_t *p = arg;
    struct epoll_event ev[PARK_EVENTS];
    pthread_mutex_lock(&p->lock);
    for (;;) {
        int timeout = wait_ms(p);
        pthread_mutex_unlock(&p->lock);
        int n = epoll_wait(p->epfd, ev, PARK_EVENTS, timeout);
        if (n < 0 && errno != EINTR) {
            kvf_log_error("http: epoll_wait: %m");
            n = 0;
        }
        pthread_mutex_lock(&p->lock);
        kvf_http_waiter_t *resume = NULL;
        for (int i = 0; i < n; i++) {
            kvf_http_waiter_t *w = ev[i].data.ptr;
            if (!w) { /* the stop (or new deadline) eventfd */
                uint64_t count;
                ssize_t rd = read(p->stop_fd, &count, sizeof(count));
                (void)rd;
                continue;
            }
            if (w->armed) { /* both of its fds may be in this batch */
                disarm(p, w);
                w->resume_next = resume;
                resume = w;
            }
        }
        expire(p, kvf_clock_ns(), &resume);
        bool stopped = p->stopped;
        pthread_mutex_unlock(&p->lock);
        /* Resumed, a waiter may be freed at once: nothing touches it after. */
        while (resume) {
            kvf_http_waiter_t *w = resume;
            resume = w->resume_next;
            MHD_resume_connection(w->conn);
        }
        pthread_mutex_lock(&p->lock);
        if (stopped)
            break;
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

kvf_status_t kvf_http__park_init(kvf_http_park_t *p)
{
    memset(p, 0, sizeof(*p));
    p->next_check = UINT64_MAX;
    p->epfd = epoll_create1(EPOLL_CLOEXEC);
    p->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (p->epfd < 0 || p->stop_fd < 0)
        goto fail;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, p->stop_fd, &ev) != 0)
        goto fail;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->idle, NULL);
    if (pthread_create(&p->thread, NULL, park_thread, p) != 0) {
        pthread_cond_destroy(&p->idle);
        pthread_mutex_destroy(&p->lock);
        goto fail;
    }
    return KVF_OK;
fail:
    kvf_log_error("http: cannot start the thread that watches waiting connections: %m");
    if (p->epfd >= 0)
        close(p->epfd);
    if (p->stop_fd >= 0)
        close(p->stop_fd);
    return KVF_ERR_IO;
}

bool kvf_http__park(kvf_http_park_t *p, kvf_http_waiter_t *w)
{
    pthread_mutex_lock(&p->lock);
    if (p->stopped) {
        pthread_mutex_unlock(&p->lock);
        return false;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = w};
    bool ok = epoll_ctl(p->epfd, EPOLL_CTL_ADD, w->ex->wake_fd, &ev) == 0;
    struct epoll_event hup = {.events = EPOLLRDHUP, .data.ptr = w};
    if (ok && w->ex->fd >= 0 && epoll_ctl(p->epfd, EPOLL_CTL_ADD, w->ex->fd, &hup) != 0) {
        epoll_ctl(p->epfd, EPOLL_CTL_DEL, w->ex->wake_fd, NULL);
        ok = false;
    }
    if (!ok) { /* out of kernel memory or watches: the caller closes */
        pthread_mutex_unlock(&p->lock);
        kvf_log_warn("http: cannot watch a waiting connection: %m");
        return false;
    }
    MHD_suspend_connection(w->conn);
    w->suspended = true;
    p->suspended++;
    w->armed = true;
    w->prev = NULL;
    w->next = p->armed;
    if (p->armed)
        p->armed->prev = w;
    p->armed = w;
    bool kick = w->deadline_ns < p->next_check;
    if (kick)
        p->next_check = w->deadline_ns;
    pthread_mutex_unlock(&p->lock);
    if (kick) { /* the thread may sleep past the new deadline: wake it */
        uint64_t one = 1;
        ssize_t wr = write(p->stop_fd, &one, sizeof(one));
        (void)wr;
    }
    return true;
}

void kvf_http__unpark(kvf_http_park_t *p, kvf_http_waiter_t *w)
{
    pthread_mutex_lock(&p->lock);
    if (w->suspended) {
        w->suspended = false;
        if (--p->suspended == 0)
            pthread_cond_broadcast(&p->idle);
    }
    pthread_mutex_unlock(&p->lock);
}

void kvf_http__park_stop(kvf_http_park_t *p)
{
    pthread_mutex_lock(&p->lock);
    p->stopped = true;
    pthread_mutex_unlock(&p->lock);
    uint64_t one = 1;
    ssize_t wr = write(p->stop_fd, &one, sizeof(one));
    (void)wr;
    pthread_join(p->thread, NULL);
    /* Every parked connection is resumed; wait until the server has run
     * each one again (it then closes, seeing the exchanges stopping), so
     * that none is suspended when the daemon stops. */
    pthread_mutex_lock(&p->lock);
    while (p->suspended)
        pthread_cond_wait(&p->idle, &p->lock);
    pthread_mutex_unlock(&p->lock);
}

void kvf_http__park_fini(kvf_http_park_t *p)
{
    pthread_cond_destroy(&p->idle);
    pthread_mutex_destroy(&p->lock);
    close(p->epfd);
    close(p->stop_fd);
}

kvf_http_await_t kvf_http__await(kvf_http_t *h, kvf_http_waiter_t *w,
                                 bool (*ready)(const kvf_exch_t *), unsigned wait_ms_max)
{
    kvf_exch_t *e = w->ex;
    pthread_mutex_lock(&e->lock);
    bool is_ready = ready(e);
    pthread_mutex_unlock(&e->lock);
    if (is_ready) {
        w->deadline_ns = 0;
        return KVF_HTTP_READY;
    }
    if (atomic_load(&e->set->stopping))
        return KVF_HTTP_STOPPING;
    if (kvf_exch_peer_gone(e))
        return KVF_HTTP_GONE;
    uint64_t now = kvf_clock_ns();
    if (!w->deadline_ns)
        w->deadline_ns = now + (uint64_t)wait_ms_max * 1000000ull;
    else if (now >= w->deadline_ns)
        return KVF_HTTP_TIMEOUT;
    return kvf_http__park(&h->park, w) ? KVF_HTTP_PARKED : KVF_HTTP_STOPPING;
}
