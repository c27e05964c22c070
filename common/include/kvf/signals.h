/* How kvferry processes are asked to stop.
 *
 *   SIGTERM        drain: finish (or hand over) what is held, then exit 0
 *   SIGTERM again  stop now
 *   SIGINT         stop now
 *   SIGPIPE        ignored (a peer closing a socket is an error to handle,
 *                  not a reason to die)
 *
 * The handler writes one flag that main() owns and the event loop reads,
 * then wakes the loop that is running (kvf_signals_wake_loop), so a stop
 * is seen at once whichever thread took the signal and whenever it came:
 * the flag and the wake-up are the only state a signal touches. */
#ifndef KVF_SIGNALS_H
#define KVF_SIGNALS_H

#include <signal.h>

#include "kvf/evloop.h"

#define KVF_STOP_NONE 0
#define KVF_STOP_DRAIN 1 /* SIGTERM: drain gracefully */
#define KVF_STOP_NOW 2   /* SIGINT, or a second SIGTERM */

/* Installs the handlers above, writing to *flag (which must live for the
 * whole process: a static of main's). */
void kvf_signals_install(volatile sig_atomic_t *flag);

/* The loop a stop signal wakes (after writing the flag); NULL: none. An
 * event loop's run function sets its loop when it starts and NULL before
 * it returns, so the loop is never woken after it is destroyed. */
void kvf_signals_wake_loop(kvf_evloop_t *loop);

#endif
