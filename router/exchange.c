/* The exchange between HTTP connection threads and the router's loop. See
 * exchange.h. */
#include "exchange.h"

#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "kvf/clock.h"
#include "kvf/log.h"

/* ---- the set ------------------------------------------------------------------ */

kvf_status_t kvf_exch_set_init(kvf_exch_set_t *set, kvf_router_t *router)
{
    memset(set, 0, sizeof(*set));
    set->router = router;
    atomic_init(&set->stopping, false);
    return pthread_mutex_init(&set->lock, NULL) ? KVF_ERR_NOMEM : KVF_OK;
}

static void signal_exch(kvf_exch_t *e)
{
    uint64_t one = 1;
    ssize_t w = write(e->wake_fd, &one, sizeof(one));
    (void)w; /* a saturated counter still leaves the fd readable */
}

void kvf_exch_set_stop(kvf_exch_set_t *set)
{
    atomic_store(&set->stopping, true);
    pthread_mutex_lock(&set->lock);
    for (kvf_exch_t *e = set->all; e; e = e->next)
        signal_exch(e);
    pthread_mutex_unlock(&set->lock);
}

/* Frees e (already unlinked). */
static void exch_free(kvf_exch_t *e)
{
    kvf_openai_request_fini(&e->req);
    kvf_strbuf_fini(&e->text);
    kvf_strbuf_fini(&e->sse);
    free(e->body);
    close(e->wake_fd);
    pthread_mutex_destroy(&e->lock);
    free(e);
}

void kvf_exch_set_fini(kvf_exch_set_t *set)
{
    while (set->all) {
        kvf_exch_t *e = set->all;
        set->all = e->next;
        exch_free(e);
    }
    pthread_mutex_destroy(&set->lock);
}

/* ---- one exchange --------------------------------------------------------------- */

kvf_exch_t *kvf_exch_create(kvf_exch_set_t *set, kvf_exch_answer_fn answer)
{
    kvf_exch_t *e = calloc(1, sizeof(*e));
    if (!e)
        return NULL;
    e->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (e->wake_fd < 0) {
        kvf_log_warn("http: eventfd: %m");
        free(e);
        return NULL;
    }
    e->set = set;
    e->answer = answer;
    e->refs = 1;
    e->fd = -1;
    pthread_mutex_init(&e->lock, NULL);
    kvf_strbuf_init(&e->text);
    kvf_strbuf_init(&e->sse);
    pthread_mutex_lock(&set->lock);
    e->next = set->all;
    if (set->all)
        set->all->prev = e;
    set->all = e;
    pthread_mutex_unlock(&set->lock);
    return e;
}

void kvf_exch_ref(kvf_exch_t *e)
{
    pthread_mutex_lock(&e->lock);
    e->refs++;
    pthread_mutex_unlock(&e->lock);
}

void kvf_exch_unref(kvf_exch_t *e)
{
    pthread_mutex_lock(&e->lock);
    unsigned left = --e->refs;
    pthread_mutex_unlock(&e->lock);
    if (left)
        return;
    kvf_exch_set_t *set = e->set;
    pthread_mutex_lock(&set->lock);
    if (e->prev)
        e->prev->next = e->next;
    else
        set->all = e->next;
    if (e->next)
        e->next->prev = e->prev;
    pthread_mutex_unlock(&set->lock);
    exch_free(e);
}

/* ---- the loop's side (these run on the router's loop thread) --------------------- */

static void loop_cancel(kvf_router_t *r, void *arg);

/* Keeps the final chunk's outcome; with lock held. */
static void take_finish(kvf_exch_t *e, const kvf_router_chunk_t *c)
{
    e->finish = c->finish;
    e->status = c->status;
    snprintf(e->error, sizeof(e->error), "%s", c->error ? c->error : "");
    if (c->status == KVF_ERR_NO_SPACE) {
        char why[200];
        if (kvf_router_health(e->set->router, why, sizeof(why)) != KVF_OK) {
            e->unhealthy = true;
            snprintf(e->error, sizeof(e->error), "the cluster cannot serve: %s", why);
        }
    }
}

static void loop_on_chunk(void *arg, const kvf_router_chunk_t *c)
{
    kvf_exch_t *e = arg;
    bool final = c->finish != KVF__FINISH_REASON__FINISH_NONE;
    pthread_mutex_lock(&e->lock);
    if (c->text_len)
        kvf_strbuf_append(&e->text, c->text, c->text_len);
    e->prompt_tokens = c->prompt_tokens;
    e->completion_tokens = c->completion_tokens;
    if (final)
        take_finish(e, c);
    /* Output that cannot be kept: end the request (a cancel posted to the
     * loop, never from inside its sink) and report the error at its end. */
    bool oom_cancel = e->text.failed && !final && !e->gone;
    if (oom_cancel) {
        e->gone = true;
        e->refs++; /* the cancel task's */
    }
    if (e->text.failed && final) {
        e->finish = KVF__FINISH_REASON__FINISH_ERROR;
        e->status = KVF_ERR_NOMEM;
        snprintf(e->error, sizeof(e->error), "out of memory");
    }
    signal_exch(e);
    pthread_mutex_unlock(&e->lock);
    if (oom_cancel && kvf_router_post(e->set->router, loop_cancel, e) != KVF_OK)
        kvf_exch_unref(e);
    if (final)
        kvf_exch_unref(e); /* the sink's reference */
}

/* Submits e; the posted reference becomes the sink's. */
static void loop_submit(kvf_router_t *r, void *arg)
{
    kvf_exch_t *e = arg;
    pthread_mutex_lock(&e->lock);
    bool gone = e->gone;
    pthread_mutex_unlock(&e->lock);
    if (gone) {
        kvf_exch_unref(e);
        return;
    }
    kvf_router_sink_t sink = {loop_on_chunk, e};
    kvf_router_gen_t gen;
    kvf_openai_request_gen(&e->req, &gen);
    kvf_exch_ref(e); /* the sink may finish (and drop its reference) inside submit */
    uint64_t id = kvf_router_submit(r, &gen, &sink);
    pthread_mutex_lock(&e->lock);
    if (!e->finish)
        e->req_id = id;
    pthread_mutex_unlock(&e->lock);
    kvf_exch_unref(e);
}

static void loop_cancel(kvf_router_t *r, void *arg)
{
    kvf_exch_t *e = arg;
    pthread_mutex_lock(&e->lock);
    uint64_t id = e->finish ? 0 : e->req_id;
    pthread_mutex_unlock(&e->lock);
    if (id)
        kvf_router_cancel(r, id);
    kvf_exch_unref(e);
}

static void loop_query(kvf_router_t *r, void *arg)
{
    kvf_exch_t *e = arg;
    unsigned code = 200;
    char *body = NULL;
    size_t len = 0;
    e->answer(r, e, &code, &body, &len);
    pthread_mutex_lock(&e->lock);
    e->answered = true;
    e->code = body ? code : 500;
    e->body = body;
    e->body_len = len;
    signal_exch(e);
    pthread_mutex_unlock(&e->lock);
    kvf_exch_unref(e);
}

/* ---- the connection thread's side ---------------------------------------------- */

kvf_status_t kvf_exch_post(kvf_exch_t *e)
{
    kvf_exch_ref(e); /* the task's (a generation's then becomes the sink's) */
    kvf_status_t st = kvf_router_post(e->set->router, e->answer ? loop_query : loop_submit, e);
    if (st != KVF_OK)
        kvf_exch_unref(e);
    return st;
}

void kvf_exch_cancel(kvf_exch_t *e)
{
    pthread_mutex_lock(&e->lock);
    bool post = !e->gone && !e->finish;
    e->gone = true;
    if (post)
        e->refs++; /* the cancel task's */
    pthread_mutex_unlock(&e->lock);
    if (post && kvf_router_post(e->set->router, loop_cancel, e) != KVF_OK) {
        kvf_log_warn("http: cannot post a cancel: out of memory");
        kvf_exch_unref(e);
    }
}

bool kvf_exch_answered(const kvf_exch_t *e)
{
    return e->answered;
}

bool kvf_exch_finished(const kvf_exch_t *e)
{
    return e->finish != 0;
}

bool kvf_exch_started(const kvf_exch_t *e)
{
    return e->finish != 0 || e->completion_tokens > 0;
}

bool kvf_exch_has_output(const kvf_exch_t *e)
{
    return e->finish != 0 || e->text.len > 0;
}

static bool hung_up(short revents)
{
    return revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL);
}

bool kvf_exch_peer_gone(const kvf_exch_t *e)
{
    if (e->fd < 0)
        return false;
    struct pollfd p = {.fd = e->fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && hung_up(p.revents);
}

/* Milliseconds from now until deadline, rounded up, at most INT_MAX. */
static int timeout_ms(uint64_t now, uint64_t deadline)
{
    uint64_t ms = (deadline - now + 999999) / 1000000;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

kvf_exch_wait_t kvf_exch_wait(kvf_exch_t *e, bool (*ready)(const kvf_exch_t *),
                              uint64_t deadline_ns)
{
    for (;;) {
        if (ready(e))
            return KVF_EXCH_READY;
        if (atomic_load(&e->set->stopping))
            return KVF_EXCH_STOPPING;
        uint64_t now = kvf_clock_ns();
        if (now >= deadline_ns)
            return KVF_EXCH_TIMEOUT;
        /* The loop signals wake_fd after every change (under the lock, so
         * a change made since ready() was asked leaves it readable). */
        struct pollfd fds[2] = {
            {.fd = e->wake_fd, .events = POLLIN},
            {.fd = e->fd, .events = POLLRDHUP},
        };
        pthread_mutex_unlock(&e->lock);
        int n = poll(fds, e->fd >= 0 ? 2 : 1, timeout_ms(now, deadline_ns));
        if (n > 0 && (fds[0].revents & POLLIN)) {
            uint64_t count;
            ssize_t rd = read(e->wake_fd, &count, sizeof(count));
            (void)rd;
        }
        pthread_mutex_lock(&e->lock);
        if (n > 0 && e->fd >= 0 && hung_up(fds[1].revents) && !ready(e))
            return KVF_EXCH_GONE;
    }
}
