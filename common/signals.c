#include "kvf/signals.h"

#include <stdatomic.h>
#include <stddef.h>
#include <string.h>

/* Set once by kvf_signals_install() before any signal can arrive. */
static volatile sig_atomic_t *stop_flag;
/* The running loop (kvf_signals_wake_loop); a lock-free atomic pointer,
 * safe to read in a handler. */
static _Atomic(kvf_evloop_t *) wake_loop;

static void on_stop_signal(int sig)
{
    if (!stop_flag)
        return;
    *stop_flag = sig == SIGTERM && *stop_flag == KVF_STOP_NONE ? KVF_STOP_DRAIN : KVF_STOP_NOW;
    kvf_evloop_t *loop = atomic_load(&wake_loop);
    if (loop)
        kvf_evloop_wake(loop); /* async-signal-safe, keeps errno */
}

void kvf_signals_wake_loop(kvf_evloop_t *loop)
{
    atomic_store(&wake_loop, loop);
}

void kvf_signals_install(volatile sig_atomic_t *flag)
{
    stop_flag = flag;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}
