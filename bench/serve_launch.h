/* The clusters kvf bench serve starts when no --router is given: a router
 * plus P prefill + D decode nodes (split; the default workload runs 1 + 1,
 * the multiturn workload 2 + 2), or a router plus one colocated kvf-decode
 * --prefill-local, each process logging to RUN_DIR/<name>-<role>.log. Also
 * what the workloads share around them: where the binaries are, and the
 * signal that stops a run. */
#ifndef KVF_BENCH_SERVE_LAUNCH_H
#define KVF_BENCH_SERVE_LAUNCH_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define KVF_SERVE_MAX_PROCS 16
#define KVF_SERVE_MAX_NODES 8  /* of each role */
#define KVF_SERVE_MAX_ARGS  16 /* extra router arguments */

typedef struct {
    pid_t pids[KVF_SERVE_MAX_PROCS];
    int n;
    char router_url[64], client_url[64]; /* the router's node inbox; its client socket */
    char run_dir[256];
} kvf_serve_launch_t;

/* What to start. prefill_nodes 0 and decode_prefill_local make decode
 * nodes that prefill themselves (colocated). */
typedef struct {
    const char *name;                /* log file prefix and node id prefix: "split", "kv" */
    int prefill_nodes, decode_nodes; /* 0..KVF_SERVE_MAX_NODES; decode >= 1 */
    int prefill_threads, decode_threads;
    const char *kv_mem;                          /* --kv-mem of the decode nodes */
    bool decode_prefill_local;                   /* decode nodes get --prefill-local */
    const char *router_args[KVF_SERVE_MAX_ARGS]; /* appended to kvf-router's argv */
    int n_router_args;
    /* the prefill nodes' pool and KV tiers (NULL: the nodes' defaults; a
     * disk tier gets a directory per node under prefill_kv_disk) */
    const char *prefill_kv_mem, *prefill_kv_host_mem, *prefill_kv_disk, *prefill_kv_disk_size;
} kvf_serve_cluster_t;

/* Starts c's router and nodes, the binaries from bin_dir, and waits until
 * the router lists every node live (2 minutes at most). Returns false,
 * with everything stopped and a line on stderr, when they did not come
 * up. */
bool kvf_serve_launch_cluster(kvf_serve_launch_t *l, const char *bin_dir, const char *model,
                              const kvf_serve_cluster_t *c, const char *run_dir);

/* The default workload's configurations: 1 prefill + 1 decode node
 * (threads each) named "split", or one colocated kvf-decode
 * --prefill-local (2 * threads) named "colocated". */
bool kvf_serve_launch(kvf_serve_launch_t *l, const char *bin_dir, const char *model, bool colocated,
                      int threads, const char *kv_mem, const char *run_dir);

/* SIGTERM to every process (the last started first), then SIGKILL to
 * those still running 5 s later; reaps them all. */
void kvf_serve_launch_stop(kvf_serve_launch_t *l);

/* The directory of this executable, where kvf-router and the nodes are.
 * False when it cannot be read. */
bool kvf_serve_bin_dir(char *bin_dir, size_t len);

/* What a workload does before it starts anything: the cluster key of
 * key_file (NULL or "": none) loaded here and handed to the processes it
 * starts (the environment), and bin_dir found. False (said) on failure. */
bool kvf_serve_setup(const char *key_file, char *bin_dir, size_t len);

/* Catches the first SIGINT or SIGTERM (a second one ends the process) and
 * returns the flag it sets: a run sends no more requests, lets the ones
 * sent finish and reports on them. */
volatile sig_atomic_t *kvf_serve_catch_stop(void);

#endif
