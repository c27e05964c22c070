/* Event loop wait (kvf/evloop.h): one ppoll(2) over the wake-up eventfd
 * and the watched fds, with the earliest timer's deadline (to the
 * nanosecond) as its timeout. */
#include "kvf/evloop.h"

#include "kvf/array.h"
#include "kvf/clock.h"
#include "kvf/log.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    int fd;
    kvf_evloop_fd_fn on_ready; /* NULL: the fd only ends a sleep */
    void *arg;
    bool removed; /* removed during a dispatch; dropped after it */
} watch_t;

typedef struct {
    kvf_evloop_hook_fn before_sleep;
    void *arg;
} hook_t;

struct kvf_evloop {
    kvf_timers_t timers;
    int wake_fd; /* eventfd: readable while a wake-up is pending */
    watch_t *watches;
    size_t n_watches, cap_watches;
    struct pollfd *pfds; /* (cap_watches + 1): the wake fd, then the watches */
    hook_t *hooks;
    size_t n_hooks, cap_hooks;
    bool dispatching; /* calling fd callbacks: removals only mark */
};

kvf_status_t kvf_evloop_create(kvf_evloop_t **loop_p)
{
    kvf_evloop_t *loop = calloc(1, sizeof(*loop));
    if (!loop)
        return KVF_ERR_NOMEM;
    loop->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (loop->wake_fd < 0) {
        kvf_status_t st = kvf_status_from_errno(errno);
        kvf_log_error("evloop: eventfd: %s", strerror(errno));
        free(loop);
        return st == KVF_ERR_NOMEM ? st : KVF_ERR_IO;
    }
    loop->pfds = malloc(sizeof(*loop->pfds));
    if (!loop->pfds) {
        close(loop->wake_fd);
        free(loop);
        return KVF_ERR_NOMEM;
    }
    kvf_timers_init(&loop->timers);
    *loop_p = loop;
    return KVF_OK;
}

void kvf_evloop_destroy(kvf_evloop_t *loop)
{
    if (!loop)
        return;
    kvf_timers_fini(&loop->timers);
    close(loop->wake_fd);
    free(loop->watches);
    free(loop->pfds);
    free(loop->hooks);
    free(loop);
}

kvf_timers_t *kvf_evloop_timers(kvf_evloop_t *loop)
{
    return &loop->timers;
}

/* ---- fds ------------------------------------------------------------------ */

static watch_t *watch_find(kvf_evloop_t *loop, int fd)
{
    for (size_t i = 0; i < loop->n_watches; i++)
        if (loop->watches[i].fd == fd && !loop->watches[i].removed)
            return &loop->watches[i];
    return NULL;
}

/* Room for one more watch, and for its pollfd, so a wait never allocates. */
static kvf_status_t watches_reserve(kvf_evloop_t *loop)
{
    if (loop->n_watches < loop->cap_watches)
        return KVF_OK;
    size_t cap = kvf_array_grow_cap(loop->cap_watches, loop->n_watches + 1, 8);
    if (kvf_array_resize(&loop->pfds, cap + 1, sizeof(*loop->pfds)) != KVF_OK ||
        kvf_array_resize(&loop->watches, cap, sizeof(*loop->watches)) != KVF_OK)
        return KVF_ERR_NOMEM;
    loop->cap_watches = cap;
    return KVF_OK;
}

kvf_status_t kvf_evloop_add_fd(kvf_evloop_t *loop, int fd, kvf_evloop_fd_fn on_ready, void *arg)
{
    if (fd < 0 || watch_find(loop, fd)) {
        kvf_log_error("evloop: fd %d cannot be watched (negative or watched already)", fd);
        return KVF_ERR_INVAL;
    }
    kvf_status_t st = watches_reserve(loop);
    if (st != KVF_OK)
        return st;
    loop->watches[loop->n_watches++] = (watch_t){.fd = fd, .on_ready = on_ready, .arg = arg};
    return KVF_OK;
}

/* Drops the watches marked removed, keeping the others' order. */
static void watches_compact(kvf_evloop_t *loop)
{
    size_t m = 0;
    for (size_t i = 0; i < loop->n_watches; i++)
        if (!loop->watches[i].removed)
            loop->watches[m++] = loop->watches[i];
    loop->n_watches = m;
}

kvf_status_t kvf_evloop_remove_fd(kvf_evloop_t *loop, int fd)
{
    watch_t *w = watch_find(loop, fd);
    if (!w)
        return KVF_ERR_NOT_FOUND;
    w->removed = true;
    if (!loop->dispatching)
        watches_compact(loop);
    return KVF_OK;
}

/* ---- hooks ---------------------------------------------------------------- */

kvf_status_t kvf_evloop_add_hook(kvf_evloop_t *loop, kvf_evloop_hook_fn before_sleep, void *arg)
{
    kvf_status_t st = kvf_array_reserve(&loop->hooks, &loop->cap_hooks, loop->n_hooks + 1, 4,
                                        sizeof(*loop->hooks));
    if (st != KVF_OK)
        return st;
    loop->hooks[loop->n_hooks++] = (hook_t){.before_sleep = before_sleep, .arg = arg};
    return KVF_OK;
}

kvf_status_t kvf_evloop_remove_hook(kvf_evloop_t *loop, kvf_evloop_hook_fn before_sleep, void *arg)
{
    for (size_t i = 0; i < loop->n_hooks; i++) {
        if (loop->hooks[i].before_sleep == before_sleep && loop->hooks[i].arg == arg) {
            memmove(&loop->hooks[i], &loop->hooks[i + 1],
                    (loop->n_hooks - i - 1) * sizeof(*loop->hooks));
            loop->n_hooks--;
            return KVF_OK;
        }
    }
    return KVF_ERR_NOT_FOUND;
}

/* Whether a hook reported pending work (then the wait must not sleep).
 * Every hook runs: each arms its own source. */
static bool hooks_report_work(kvf_evloop_t *loop)
{
    bool work = false;
    for (size_t i = 0; i < loop->n_hooks; i++)
        if (loop->hooks[i].before_sleep(loop->hooks[i].arg) == KVF_ERR_AGAIN)
            work = true;
    return work;
}

/* ---- waking and waiting --------------------------------------------------- */

void kvf_evloop_wake(kvf_evloop_t *loop)
{
    /* Async-signal-safe: write(2) only, errno kept for the interrupted
     * code. EAGAIN (the counter is full) still leaves it readable. */
    int saved = errno;
    uint64_t one = 1;
    ssize_t n = write(loop->wake_fd, &one, sizeof(one));
    (void)n;
    errno = saved;
}

/* The sleep's length: none when work is pending, otherwise until the
 * earliest timer, at most max_ms. false: no limit at all. */
static bool sleep_length(const kvf_evloop_t *loop, int max_ms, bool work, struct timespec *ts_p)
{
    uint64_t ns = UINT64_MAX;
    if (work || max_ms == 0) {
        ns = 0;
    } else {
        uint64_t next = kvf_timers_next_ns(&loop->timers);
        if (next != UINT64_MAX) {
            uint64_t now = kvf_clock_ns();
            ns = next > now ? next - now : 0;
        }
        if (max_ms > 0 && (uint64_t)max_ms * 1000000ull < ns)
            ns = (uint64_t)max_ms * 1000000ull;
    }
    if (ns == UINT64_MAX)
        return false;
    ts_p->tv_sec = (time_t)(ns / 1000000000ull);
    ts_p->tv_nsec = (long)(ns % 1000000000ull);
    return true;
}

/* Calls the callbacks of the fds poll found ready; returns how many were. */
static unsigned dispatch_fds(kvf_evloop_t *loop, size_t n_polled)
{
    unsigned ready = 0;
    loop->dispatching = true;
    /* Indices stay valid: removals only mark, additions go at the end
     * (beyond n_polled). */
    for (size_t i = 0; i < n_polled; i++) {
        if (!loop->pfds[i + 1].revents)
            continue;
        ready++;
        watch_t w = loop->watches[i];
        if (!w.removed && w.on_ready)
            w.on_ready(w.fd, w.arg);
    }
    loop->dispatching = false;
    watches_compact(loop);
    return ready;
}

kvf_status_t kvf_evloop_wait(kvf_evloop_t *loop, int max_ms)
{
    bool work = max_ms != 0 && hooks_report_work(loop);
    struct timespec ts;
    bool limited = sleep_length(loop, max_ms, work, &ts);
    size_t n_polled = loop->n_watches;
    loop->pfds[0] = (struct pollfd){.fd = loop->wake_fd, .events = POLLIN};
    for (size_t i = 0; i < n_polled; i++)
        loop->pfds[i + 1] = (struct pollfd){.fd = loop->watches[i].fd, .events = POLLIN};
    int rc = ppoll(loop->pfds, n_polled + 1, limited ? &ts : NULL, NULL);
    bool happened = work;
    if (rc < 0) {
        if (errno != EINTR) {
            kvf_log_error("evloop: poll: %s", strerror(errno));
            return KVF_ERR_IO;
        }
        happened = true; /* a signal: its handler may have left work */
    } else if (rc > 0) {
        if (loop->pfds[0].revents) {
            uint64_t count;
            ssize_t n = read(loop->wake_fd, &count, sizeof(count)); /* resets it */
            (void)n;
            happened = true;
        }
        happened |= dispatch_fds(loop, n_polled) > 0;
    }
    happened |= kvf_timers_run(&loop->timers, kvf_clock_ns()) > 0;
    return happened ? KVF_OK : KVF_ERR_TIMEOUT;
}
