/* The one place a process thread sleeps: an event loop wait over a timer
 * set (kvf/timer.h), a set of file descriptors, "before sleep" hooks and
 * a wake-up that other threads (and signal handlers) can signal.
 *
 * A node's loop is a sequence of non-blocking steps around one wait:
 *
 *     kvf_evloop_add_fd(loop, kvf_inbox_fd(inbox), NULL, NULL);
 *     kvf_evloop_add_fd(loop, kvf_xfer_fd(xfer), NULL, NULL);
 *     kvf_evloop_add_hook(loop, arm_xfer, xfer);   kvf_xfer_arm: AGAIN = don't sleep
 *     while (!stop) {
 *         drain the inbox, progress the transport, run queued work ...
 *         kvf_evloop_wait(loop, busy ? 0 : -1);    sleeps, then fires due timers
 *     }
 *
 * A wait sleeps until the earliest timer is due, a registered fd polls
 * readable, a wake-up arrives, a signal interrupts it, or max_ms passes;
 * there is no polling interval of its own: a deadline the loop must meet
 * is a timer. After the sleep it calls the callbacks of readable fds (fds
 * registered without one only end the sleep; the caller drains them) and
 * then fires the due timers.
 *
 * Threads: the loop belongs to the thread that waits on it; every function
 * but kvf_evloop_wake must be called from that thread. Work handed over
 * from another thread goes through a queue of the caller's, followed by
 * kvf_evloop_wake. */
#ifndef KVF_EVLOOP_H
#define KVF_EVLOOP_H

#include "kvf/status.h"
#include "kvf/timer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvf_evloop kvf_evloop_t;

/* Called from kvf_evloop_wait when fd polls readable (or has an error or
 * hang-up: the callback finds out by reading). */
typedef void (*kvf_evloop_fd_fn)(int fd, void *arg);

/* Called before the wait sleeps. KVF_ERR_AGAIN: work is pending (e.g.
 * kvf_xfer_arm found events), so the wait does not sleep; any other
 * return lets it sleep. */
typedef kvf_status_t (*kvf_evloop_hook_fn)(void *arg);

/* A loop with no fds, hooks or timers. *loop_p is owned by the caller:
 * kvf_evloop_destroy(). IO if the wake-up eventfd cannot be made. */
kvf_status_t kvf_evloop_create(kvf_evloop_t **loop_p);

/* Frees the loop and finalises its timer set (timers still armed are
 * disarmed; their memory is their owners'). The registered fds are the
 * caller's and stay open. No thread may still wake it. NULL ok. */
void kvf_evloop_destroy(kvf_evloop_t *loop);

/* The loop's timer set, owned by the loop: arm timers here and the wait
 * sleeps no longer than the earliest. */
kvf_timers_t *kvf_evloop_timers(kvf_evloop_t *loop);

/* Watches fd (borrowed: the caller closes it, after removing it) for
 * readability. on_ready may be NULL (the fd then only ends a sleep).
 * INVAL if fd is negative or already watched, NOMEM. May be called from
 * a callback; the new fd is watched from the next wait. */
kvf_status_t kvf_evloop_add_fd(kvf_evloop_t *loop, int fd, kvf_evloop_fd_fn on_ready, void *arg);

/* Stops watching fd; NOT_FOUND if it is not watched. May be called from
 * a callback (the fd's own included): its callback is not called after. */
kvf_status_t kvf_evloop_remove_fd(kvf_evloop_t *loop, int fd);

/* Adds a before-sleep hook, called before each sleep in the order added.
 * NOMEM. */
kvf_status_t kvf_evloop_add_hook(kvf_evloop_t *loop, kvf_evloop_hook_fn before_sleep, void *arg);

/* Removes the hook added with the same function and argument; NOT_FOUND
 * if there is none. */
kvf_status_t kvf_evloop_remove_hook(kvf_evloop_t *loop, kvf_evloop_hook_fn before_sleep, void *arg);

/* Ends the loop's current or next wait. Any thread, and signal handlers:
 * it is one write(2) to an eventfd, and keeps errno. Wake-ups before a
 * wait are not lost; several coalesce into one. */
void kvf_evloop_wake(kvf_evloop_t *loop);

/* Sleeps as described at the top, at most max_ms (-1: no limit of its
 * own; 0: do not sleep, only look), then calls the callbacks of readable
 * fds and fires due timers. OK when anything ended the wait (an fd, a
 * wake-up, a timer, a hook that reported work, a signal), TIMEOUT when
 * max_ms passed with none of them, IO if poll failed (logged). */
kvf_status_t kvf_evloop_wait(kvf_evloop_t *loop, int max_ms);

#ifdef __cplusplus
}
#endif

#endif
