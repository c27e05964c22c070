/* Event loop wait tests: a deadline ends a wait with no I/O at all; a
 * wake-up from another thread (and from a signal handler) ends one, and
 * none is lost when work is handed over many times; a readable fd (a
 * pipe, a nanomsg inbox) calls its callback, which may remove it; a
 * before-sleep hook that reports work keeps the wait from sleeping.
 * Every wait that should end is given a generous bound only as a hang
 * guard: the assertions are about what ended it, never how fast. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kvf/clock.h"
#include "kvf/evloop.h"
#include "kvf/msg.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define HANG_GUARD_MS 20000 /* far beyond any wait here; only stops a hang */

static kvf_evloop_t *new_loop(void)
{
    kvf_evloop_t *loop = NULL;
    assert_int_equal(kvf_evloop_create(&loop), KVF_OK);
    return loop;
}

/* ---- timers --------------------------------------------------------------- */

typedef struct {
    kvf_timer_t timer;
    uint64_t deadline;
    uint64_t fired_at; /* clock when the callback ran; 0 = not yet */
    int order;         /* position among fired timers */
    int *next_order;
} deadline_t;

static void on_deadline(kvf_timer_t *timer, void *arg)
{
    deadline_t *d = arg;
    (void)timer;
    d->fired_at = kvf_clock_ns();
    d->order = (*d->next_order)++;
}

static void test_deadline_without_io(void **state)
{
    (void)state;
    kvf_evloop_t *loop = new_loop();
    int next_order = 0;
    deadline_t d[3];
    const uint64_t delay_ms[3] = {30, 10, 20};
    uint64_t start = kvf_clock_ns();
    for (int i = 0; i < 3; i++) {
        d[i] = (deadline_t){.next_order = &next_order};
        kvf_timer_init(&d[i].timer, on_deadline, &d[i]);
        d[i].deadline = start + delay_ms[i] * 1000000ull;
        assert_int_equal(kvf_timer_arm(kvf_evloop_timers(loop), &d[i].timer, d[i].deadline),
                         KVF_OK);
    }
    /* No fd, no wake-up: only the deadlines end these waits. */
    while (next_order < 3 && kvf_clock_ns() - start < HANG_GUARD_MS * 1000000ull)
        assert_int_equal(kvf_evloop_wait(loop, -1), KVF_OK);
    assert_int_equal(next_order, 3);
    const int want_order[3] = {2, 0, 1};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(d[i].order, want_order[i]);
        assert_true(d[i].fired_at >= d[i].deadline); /* never early */
    }
    /* Nothing armed, nothing ready: a bounded wait times out. */
    assert_int_equal(kvf_evloop_wait(loop, 0), KVF_ERR_TIMEOUT);
    assert_int_equal(kvf_evloop_wait(loop, 1), KVF_ERR_TIMEOUT);
    kvf_evloop_destroy(loop);
}

static void test_destroy_disarms(void **state)
{
    (void)state;
    kvf_evloop_t *loop = new_loop();
    int next_order = 0;
    deadline_t d = {.next_order = &next_order};
    kvf_timer_init(&d.timer, on_deadline, &d);
    assert_int_equal(kvf_timer_arm_in_ms(kvf_evloop_timers(loop), &d.timer, 60000), KVF_OK);
    kvf_evloop_destroy(loop);
    assert_false(kvf_timer_armed(&d.timer));
    assert_int_equal(next_order, 0);
}

/* ---- wake-ups --------------------------------------------------------------- */

static void test_wake_before_wait_is_kept(void **state)
{
    (void)state;
    kvf_evloop_t *loop = new_loop();
    kvf_evloop_wake(loop);
    kvf_evloop_wake(loop); /* coalesce */
    assert_int_equal(kvf_evloop_wait(loop, HANG_GUARD_MS), KVF_OK);
    assert_int_equal(kvf_evloop_wait(loop, 0), KVF_ERR_TIMEOUT); /* consumed */
    kvf_evloop_destroy(loop);
}

/* Work handed over from a producer thread: a queue (here a counter under a
 * mutex) and a wake-up after each item. The loop sleeps with no bound of
 * its own between items, so a lost wake-up would hang it. */
typedef struct {
    kvf_evloop_t *loop;
    pthread_mutex_t lock;
    int queued; /* produced, not yet taken */
    int n_items;
} handover_t;

static void *producer(void *arg)
{
    handover_t *h = arg;
    for (int i = 0; i < h->n_items; i++) {
        pthread_mutex_lock(&h->lock);
        h->queued++;
        pthread_mutex_unlock(&h->lock);
        kvf_evloop_wake(h->loop);
    }
    return NULL;
}

static void test_wake_from_another_thread(void **state)
{
    (void)state;
    handover_t h = {.loop = new_loop(), .n_items = 20000};
    pthread_mutex_init(&h.lock, NULL);
    pthread_t thread;
    assert_int_equal(pthread_create(&thread, NULL, producer, &h), 0);
    int taken = 0;
    uint64_t start = kvf_clock_ns();
    while (taken < h.n_items) {
        pthread_mutex_lock(&h.lock);
        taken += h.queued;
        h.queued = 0;
        pthread_mutex_unlock(&h.lock);
        if (taken == h.n_items)
            break;
        /* The item taken last may have been woken for already: then this
         * wait returns at once and the next look finds nothing new. */
        assert_int_equal(kvf_evloop_wait(h.loop, HANG_GUARD_MS), KVF_OK);
        assert_true(kvf_clock_ns() - start < 2ull * HANG_GUARD_MS * 1000000ull);
    }
    pthread_join(thread, NULL);
    assert_int_equal(taken, h.n_items);
    pthread_mutex_destroy(&h.lock);
    kvf_evloop_destroy(h.loop);
}

static void *wake_once(void *arg)
{
    kvf_evloop_wake(arg);
    return NULL;
}

/* The loop sleeps with no deadline and no bound: only the other thread's
 * wake-up can end the wait (whether it came before or during it). */
static void test_unbounded_wait_ends_on_wake(void **state)
{
    (void)state;
    kvf_evloop_t *loop = new_loop();
    pthread_t thread;
    assert_int_equal(pthread_create(&thread, NULL, wake_once, loop), 0);
    assert_int_equal(kvf_evloop_wait(loop, -1), KVF_OK);
    pthread_join(thread, NULL);
    kvf_evloop_destroy(loop);
}

static kvf_evloop_t *signal_loop;
static volatile sig_atomic_t signal_seen;

static void on_signal(int sig)
{
    (void)sig;
    signal_seen = 1;
    kvf_evloop_wake(signal_loop);
}

static void test_wake_from_signal_handler(void **state)
{
    (void)state;
    signal_loop = new_loop();
    struct sigaction sa = {.sa_handler = on_signal}, old;
    sigemptyset(&sa.sa_mask);
    assert_int_equal(sigaction(SIGUSR1, &sa, &old), 0);
    errno = 1234;
    raise(SIGUSR1);                /* the handler runs before raise returns */
    assert_int_equal(errno, 1234); /* the wake-up kept errno */
    assert_int_equal(signal_seen, 1);
    assert_int_equal(kvf_evloop_wait(signal_loop, HANG_GUARD_MS), KVF_OK);
    assert_int_equal(kvf_evloop_wait(signal_loop, 0), KVF_ERR_TIMEOUT);
    assert_int_equal(sigaction(SIGUSR1, &old, NULL), 0);
    kvf_evloop_destroy(signal_loop);
    signal_loop = NULL;
}

/* ---- fds ------------------------------------------------------------------- */

typedef struct {
    kvf_evloop_t *loop;
    int calls;
    int last_fd;
    bool remove_self;
} fd_probe_t;

static void on_pipe(int fd, void *arg)
{
    fd_probe_t *p = arg;
    char c;
    assert_int_equal(read(fd, &c, 1), 1);
    p->calls++;
    p->last_fd = fd;
    if (p->remove_self)
        assert_int_equal(kvf_evloop_remove_fd(p->loop, fd), KVF_OK);
}

static void test_fd_readiness(void **state)
{
    (void)state;
    kvf_evloop_t *loop = new_loop();
    int a[2], b[2];
    assert_int_equal(pipe(a), 0);
    assert_int_equal(pipe(b), 0);
    fd_probe_t pa = {.loop = loop}, pb = {.loop = loop, .remove_self = true};
    assert_int_equal(kvf_evloop_add_fd(loop, a[0], on_pipe, &pa), KVF_OK);
    assert_int_equal(kvf_evloop_add_fd(loop, b[0], on_pipe, &pb), KVF_OK);
    assert_int_equal(kvf_evloop_add_fd(loop, a[0], on_pipe, &pa), KVF_ERR_INVAL);
    assert_int_equal(kvf_evloop_add_fd(loop, -1, on_pipe, &pa), KVF_ERR_INVAL);

    assert_int_equal(kvf_evloop_wait(loop, 0), KVF_ERR_TIMEOUT); /* nothing written */
    assert_int_equal(write(a[1], "x", 1), 1);
    assert_int_equal(kvf_evloop_wait(loop, HANG_GUARD_MS), KVF_OK);
    assert_int_equal(pa.calls, 1);
    assert_int_equal(pa.last_fd, a[0]);
    assert_int_equal(pb.calls, 0);

    /* b's callback removes its own fd: called once, then never again. */
    assert_int_equal(write(b[1], "yy", 2), 2);
    assert_int_equal(kvf_evloop_wait(loop, HANG_GUARD_MS), KVF_OK);
    assert_int_equal(pb.calls, 1);
    assert_int_equal(kvf_evloop_wait(loop, 0), KVF_ERR_TIMEOUT); /* b still readable, unwatched */
    assert_int_equal(pb.calls, 1);
    assert_int_equal(kvf_evloop_remove_fd(loop, b[0]), KVF_ERR_NOT_FOUND);

    /* Without a callback the fd only ends the sleep; the caller drains it. */
    assert_int_equal(kvf_evloop_add_fd(loop, b[0], NULL, NULL), KVF_OK);
    assert_int_equal(kvf_evloop_wait(loop, HANG_GUARD_MS), KVF_OK);
    char c;
    assert_int_equal(read(b[0], &c, 1), 1);
    assert_int_equal(kvf_evloop_remove_fd(loop, a[0]), KVF_OK);
    assert_int_equal(kvf_evloop_remove_fd(loop, b[0]), KVF_OK);
    assert_int_equal(write(a[1], "z", 1), 1);
    assert_int_equal(kvf_evloop_wait(loop, 0), KVF_ERR_TIMEOUT);
    assert_int_equal(pa.calls, 1);
    kvf_evloop_destroy(loop);
    for (int i = 0; i < 2; i++) {
        close(a[i]);
        close(b[i]);
    }
}

/* A nanomsg inbox's NN_RCVFD (kvf_inbox_fd) is an fd like any other. */
static void test_inbox_fd(void **state)
{
    (void)state;
    int port;
    assert_int_equal(kvf_net_free_port(&port), KVF_OK);
    char url[64];
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", port);
    kvf_inbox_t *inbox;
    kvf_outbox_t *outbox;
    assert_int_equal(kvf_inbox_create(url, 0, &inbox), KVF_OK);
    assert_int_equal(kvf_outbox_create(url, &outbox), KVF_OK);
    kvf_evloop_t *loop = new_loop();
    assert_int_equal(kvf_evloop_add_fd(loop, kvf_inbox_fd(inbox), NULL, NULL), KVF_OK);

    Kvf__Heartbeat hb = KVF__HEARTBEAT__INIT;
    kvf_envelope_t env;
    kvf_envelope_init(&env, "test");
    env.body_case = KVF__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    assert_int_equal(kvf_outbox_send(outbox, &env, HANG_GUARD_MS), KVF_OK);
    kvf_envelope_t *got = NULL;
    uint64_t start = kvf_clock_ns();
    while (!got && kvf_clock_ns() - start < HANG_GUARD_MS * 1000000ull) {
        assert_int_equal(kvf_evloop_wait(loop, HANG_GUARD_MS), KVF_OK);
        kvf_status_t st = kvf_inbox_recv(inbox, 0, &got);
        assert_true(st == KVF_OK || st == KVF_ERR_AGAIN || st == KVF_ERR_TIMEOUT);
    }
    assert_non_null(got);
    assert_int_equal(got->body_case, KVF__ENVELOPE__BODY_HEARTBEAT);
    kvf_envelope_free(got);
    kvf_evloop_destroy(loop);
    kvf_outbox_destroy(outbox);
    kvf_inbox_destroy(inbox);
}

/* ---- hooks ------------------------------------------------------------------ */

typedef struct {
    int calls;
    kvf_status_t answer;
} hook_probe_t;

static kvf_status_t probe_hook(void *arg)
{
    hook_probe_t *h = arg;
    h->calls++;
    return h->answer;
}

static void test_hook_keeps_wait_awake(void **state)
{
    (void)state;
    kvf_evloop_t *loop = new_loop();
    hook_probe_t busy = {.answer = KVF_ERR_AGAIN}, idle = {.answer = KVF_OK};
    assert_int_equal(kvf_evloop_add_hook(loop, probe_hook, &idle), KVF_OK);
    assert_int_equal(kvf_evloop_add_hook(loop, probe_hook, &busy), KVF_OK);
    /* Unbounded, nothing armed: only the hook's answer ends it. */
    assert_int_equal(kvf_evloop_wait(loop, -1), KVF_OK);
    assert_int_equal(busy.calls, 1);
    assert_int_equal(idle.calls, 1); /* every hook arms its source */
    /* A wait that does not sleep asks no hook. */
    assert_int_equal(kvf_evloop_wait(loop, 0), KVF_ERR_TIMEOUT);
    assert_int_equal(busy.calls, 1);
    assert_int_equal(kvf_evloop_remove_hook(loop, probe_hook, &busy), KVF_OK);
    assert_int_equal(kvf_evloop_remove_hook(loop, probe_hook, &busy), KVF_ERR_NOT_FOUND);
    assert_int_equal(kvf_evloop_wait(loop, 1), KVF_ERR_TIMEOUT); /* idle lets it sleep */
    assert_int_equal(idle.calls, 2);
    kvf_evloop_destroy(loop);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deadline_without_io),
        cmocka_unit_test(test_destroy_disarms),
        cmocka_unit_test(test_wake_before_wait_is_kept),
        cmocka_unit_test(test_wake_from_another_thread),
        cmocka_unit_test(test_unbounded_wait_ends_on_wake),
        cmocka_unit_test(test_wake_from_signal_handler),
        cmocka_unit_test(test_fd_readiness),
        cmocka_unit_test(test_inbox_fd),
        cmocka_unit_test(test_hook_keeps_wait_awake),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
