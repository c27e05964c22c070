/* The configurations kvf bench serve starts when no --router is given:
 * a router plus 1 prefill + 1 decode node (split), or a router plus one
 * colocated kvf-decode --prefill-local, each process logging to
 * RUN_DIR/<config>-<role>.log. */
#ifndef KVF_BENCH_SERVE_LAUNCH_H
#define KVF_BENCH_SERVE_LAUNCH_H

#include <stdbool.h>
#include <sys/types.h>

#define KVF_SERVE_MAX_PROCS 8

typedef struct {
    pid_t pids[KVF_SERVE_MAX_PROCS];
    int n;
    char router_url[64], client_url[64]; /* the router's node inbox; its client socket */
    char run_dir[256];
} kvf_serve_launch_t;

/* Starts a router plus either 1 prefill + 1 decode node (threads each) or
 * one colocated kvf-decode --prefill-local (2 * threads), the binaries
 * from bin_dir, and waits until the router lists them live (2 minutes at
 * most). Returns false, with everything stopped and a line on stderr,
 * when they did not come up. */
bool kvf_serve_launch(kvf_serve_launch_t *l, const char *bin_dir, const char *model,
                      bool colocated, int threads, const char *kv_mem, const char *run_dir);

/* SIGTERM to every process (the last started first), then SIGKILL to
 * those still running 5 s later; reaps them all. */
void kvf_serve_launch_stop(kvf_serve_launch_t *l);

#endif
