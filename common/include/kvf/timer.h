/* Timers: deadlines on the monotonic clock (kvf_clock_ns), kept in a binary
 * min-heap so the next one is found in O(1) and arming, re-arming and
 * cancelling cost O(log n).
 *
 * A kvf_timer_t is embedded in the object it times (a request, a peer, a
 * node) and owned by it; the heap only points at it, so a timer must be
 * cancelled (or its kvf_timers_t finalised) before its memory goes.
 *
 *     kvf_timer_init(&req->lease, on_lease_end, req);
 *     kvf_timer_arm(timers, &req->lease, kvf_clock_ns() + lease_ns);
 *     ...
 *     kvf_timers_run(timers, kvf_clock_ns());   fires on_lease_end once due
 *
 * Order: earliest deadline first; timers with equal deadlines fire in the
 * order they were armed.
 *
 * Callbacks run inside kvf_timers_run and may arm, re-arm or cancel any
 * timer of the same set, themselves included. A timer armed during a run
 * for a deadline the run has already reached is due 1 ns after the run's
 * now_ns: it fires in a later run, not this one, so a callback that
 * re-arms itself "now" cannot keep a run going for ever.
 *
 * Single-threaded: one kvf_timers_t belongs to one thread (its event loop;
 * see kvf/evloop.h). */
#ifndef KVF_TIMER_H
#define KVF_TIMER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvf/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvf_timer kvf_timer_t;

/* Called once when the timer is due; the timer is already disarmed. */
typedef void (*kvf_timer_fn)(kvf_timer_t *timer, void *arg);

/* heap_index of a timer that is not armed. */
#define KVF_TIMER_IDLE SIZE_MAX

/* Fields are the timer set's: read them through the functions below. */
struct kvf_timer {
    uint64_t deadline_ns; /* when armed: the deadline it fires at */
    uint64_t seq;         /* arming order, breaks ties between equal deadlines */
    size_t heap_index;    /* position in the heap, KVF_TIMER_IDLE when not armed */
    kvf_timer_fn fire;
    void *arg;
};

/* A set of timers. Fields private to timer.c. */
typedef struct {
    kvf_timer_t **heap; /* (cap); heap[0] is the earliest */
    size_t n, cap;
    uint64_t next_seq;
    bool running;        /* inside kvf_timers_run */
    uint64_t run_now_ns; /* the running kvf_timers_run's now */
} kvf_timers_t;

/* Empty set; allocates nothing until the first timer is armed. */
void kvf_timers_init(kvf_timers_t *timers);

/* Disarms every timer still armed (their memory stays their owners') and
 * frees the heap. Not from inside a callback. */
void kvf_timers_fini(kvf_timers_t *timers);

/* A disarmed timer that calls fire(timer, arg) when due. */
void kvf_timer_init(kvf_timer_t *timer, kvf_timer_fn fire, void *arg);

/* Arms timer for deadline_ns (kvf_clock_ns() time; the past is allowed:
 * then it is due at once), moving it if it was armed already. NOMEM only
 * when arming a timer that was not armed and the heap could not grow; the
 * timer is then left disarmed. Re-arming an armed timer never fails. */
kvf_status_t kvf_timer_arm(kvf_timers_t *timers, kvf_timer_t *timer, uint64_t deadline_ns);

/* kvf_timer_arm for delay_ms from now. */
kvf_status_t kvf_timer_arm_in_ms(kvf_timers_t *timers, kvf_timer_t *timer, uint64_t delay_ms);

/* Disarms timer; a no-op if it is not armed. */
void kvf_timer_cancel(kvf_timers_t *timers, kvf_timer_t *timer);

/* Whether timer is armed (waiting to fire). */
static inline bool kvf_timer_armed(const kvf_timer_t *timer)
{
    return timer->heap_index != KVF_TIMER_IDLE;
}

/* Number of armed timers. */
size_t kvf_timers_count(const kvf_timers_t *timers);

/* The earliest armed deadline, UINT64_MAX when none is armed. */
uint64_t kvf_timers_next_ns(const kvf_timers_t *timers);

/* Milliseconds from now_ns until the earliest deadline, rounded up (so a
 * sleep of that long reaches it), 0 when one is due, -1 when none is
 * armed; at most INT32_MAX, so it fits poll(2). */
int kvf_timers_timeout_ms(const kvf_timers_t *timers, uint64_t now_ns);

/* Fires, earliest first, every timer whose deadline is at or before
 * now_ns. Returns how many fired. Not re-entrant: a callback must not call
 * it. */
unsigned kvf_timers_run(kvf_timers_t *timers, uint64_t now_ns);

#ifdef __cplusplus
}
#endif

#endif
