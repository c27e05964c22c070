/* Timers (kvf/timer.h): a binary min-heap of timer pointers ordered by
 * (deadline, arming order); each timer records its heap index, so a
 * cancel or re-arm finds it without a search. */
#include "kvf/timer.h"

#include "kvf/array.h"
#include "kvf/clock.h"
#include "kvf/log.h"

#include <stdlib.h>

/* Whether a fires before b. */
static bool timer_before(const kvf_timer_t *a, const kvf_timer_t *b)
{
    if (a->deadline_ns != b->deadline_ns)
        return a->deadline_ns < b->deadline_ns;
    return a->seq < b->seq;
}

static void heap_place(kvf_timers_t *t, size_t i, kvf_timer_t *timer)
{
    t->heap[i] = timer;
    timer->heap_index = i;
}

/* Moves the timer at i towards the root while it fires before its parent. */
static void sift_up(kvf_timers_t *t, size_t i)
{
    kvf_timer_t *timer = t->heap[i];
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!timer_before(timer, t->heap[parent]))
            break;
        heap_place(t, i, t->heap[parent]);
        i = parent;
    }
    heap_place(t, i, timer);
}

/* Moves the timer at i towards the leaves while a child fires before it. */
static void sift_down(kvf_timers_t *t, size_t i)
{
    kvf_timer_t *timer = t->heap[i];
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= t->n)
            break;
        if (child + 1 < t->n && timer_before(t->heap[child + 1], t->heap[child]))
            child++;
        if (!timer_before(t->heap[child], timer))
            break;
        heap_place(t, i, t->heap[child]);
        i = child;
    }
    heap_place(t, i, timer);
}

/* Restores the heap order around index i after its timer changed. */
static void heap_fix(kvf_timers_t *t, size_t i)
{
    if (i > 0 && timer_before(t->heap[i], t->heap[(i - 1) / 2]))
        sift_up(t, i);
    else
        sift_down(t, i);
}

void kvf_timers_init(kvf_timers_t *timers)
{
    *timers = (kvf_timers_t){0};
}

void kvf_timers_fini(kvf_timers_t *timers)
{
    KVF_ASSERT(!timers->running);
    for (size_t i = 0; i < timers->n; i++)
        timers->heap[i]->heap_index = KVF_TIMER_IDLE;
    free(timers->heap);
    *timers = (kvf_timers_t){0};
}

void kvf_timer_init(kvf_timer_t *timer, kvf_timer_fn fire, void *arg)
{
    *timer = (kvf_timer_t){.heap_index = KVF_TIMER_IDLE, .fire = fire, .arg = arg};
}

static kvf_status_t heap_grow(kvf_timers_t *t)
{
    kvf_status_t st = kvf_array_reserve(&t->heap, &t->cap, t->cap + 1, 16, sizeof(*t->heap));
    if (st != KVF_OK)
        kvf_log_error("timers: out of memory growing the heap past %zu", t->cap);
    return st;
}

kvf_status_t kvf_timer_arm(kvf_timers_t *timers, kvf_timer_t *timer, uint64_t deadline_ns)
{
    /* Due already within a run: after that run's now, so the run ends. */
    if (timers->running && deadline_ns <= timers->run_now_ns)
        deadline_ns = timers->run_now_ns + 1;
    if (!kvf_timer_armed(timer) && timers->n == timers->cap) {
        kvf_status_t st = heap_grow(timers);
        if (st != KVF_OK)
            return st;
    }
    timer->deadline_ns = deadline_ns;
    timer->seq = timers->next_seq++;
    if (kvf_timer_armed(timer)) {
        KVF_ASSERT(timer->heap_index < timers->n && timers->heap[timer->heap_index] == timer);
        heap_fix(timers, timer->heap_index);
    } else {
        heap_place(timers, timers->n++, timer);
        sift_up(timers, timers->n - 1);
    }
    return KVF_OK;
}

kvf_status_t kvf_timer_arm_in_ms(kvf_timers_t *timers, kvf_timer_t *timer, uint64_t delay_ms)
{
    return kvf_timer_arm(timers, timer, kvf_clock_ns() + delay_ms * 1000000ull);
}

void kvf_timer_cancel(kvf_timers_t *timers, kvf_timer_t *timer)
{
    if (!kvf_timer_armed(timer))
        return;
    size_t i = timer->heap_index;
    KVF_ASSERT(i < timers->n && timers->heap[i] == timer);
    timer->heap_index = KVF_TIMER_IDLE;
    kvf_timer_t *last = timers->heap[--timers->n];
    if (i == timers->n)
        return; /* it was the last one */
    heap_place(timers, i, last);
    heap_fix(timers, i);
}

size_t kvf_timers_count(const kvf_timers_t *timers)
{
    return timers->n;
}

uint64_t kvf_timers_next_ns(const kvf_timers_t *timers)
{
    return timers->n ? timers->heap[0]->deadline_ns : UINT64_MAX;
}

int kvf_timers_timeout_ms(const kvf_timers_t *timers, uint64_t now_ns)
{
    if (!timers->n)
        return -1;
    uint64_t next = timers->heap[0]->deadline_ns;
    if (next <= now_ns)
        return 0;
    uint64_t left = next - now_ns;
    uint64_t ms = left / 1000000u + (left % 1000000u != 0); /* no overflow near UINT64_MAX */
    return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

unsigned kvf_timers_run(kvf_timers_t *timers, uint64_t now_ns)
{
    KVF_ASSERT(!timers->running);
    KVF_ASSERT(now_ns < UINT64_MAX); /* "after now" must exist */
    timers->running = true;
    timers->run_now_ns = now_ns;
    unsigned fired = 0;
    /* Every timer armed while this runs is due after now_ns, so each timer
     * fires at most once here and the loop ends. */
    while (timers->n && timers->heap[0]->deadline_ns <= now_ns) {
        kvf_timer_t *timer = timers->heap[0];
        kvf_timer_cancel(timers, timer);
        timer->fire(timer, timer->arg);
        fired++;
    }
    timers->running = false;
    return fired;
}
