/* The soak driver of bench/soak.sh: a router, 2 prefill and 2 decode
 * nodes (tests/integration/harness.h starts them) under a steady mixed
 * load for a fixed duration, with clients aborting mid-stream, nodes
 * killed and restarted every few seconds and one node drained; its report
 * says whether any request was lost, differed from its colocated
 * reference or failed, whether KV blocks stayed in use, and how the
 * long-lived processes' memory moved.
 *
 * The steps, one file each: soak.c (main: flags, cluster, the run's
 * sequence), soak_pool.c (the prompts and their references), soak_load.c
 * (the requests, native and HTTP), soak_http.c (the HTTP/1.1 client),
 * soak_chaos.c (kills, restarts, the drain, the warm memory sample),
 * soak_report.c (the checks at the end and their tables).
 *
 * Threads: main runs the load; the chaos thread alone touches the
 * cluster's process table while the load runs. What they share is the
 * stop flags (atomics) and the run's fixed settings. */
#ifndef KVF_BENCH_SOAK_H
#define KVF_BENCH_SOAK_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "harness.h"

#define KVF_SOAK_POOL  48
#define KVF_SOAK_NODES 5 /* 2 prefill + 2 decode + the drain's replacement */
#define KVF_SOAK_NOTES 64

/* One prompt of the pool and its colocated greedy output. */
typedef struct {
    uint32_t *ids; /* (n_ids) the prompt; for a text prompt, as the router tokenizes it */
    size_t n_ids;
    char *text; /* a text prompt (sent as text), or NULL (sent as ids) */
    uint32_t max_tokens;
    uint32_t *ref; /* (n_ref) the colocated output's ids */
    size_t n_ref;
    char *ref_text; /* (n_ref_text) its text, NUL-terminated (it may hold U+0000 too) */
    size_t n_ref_text;
} kvf_soak_prompt_t;

typedef enum {
    KVF_SOAK_NATIVE,      /* the router's client socket */
    KVF_SOAK_HTTP_STREAM, /* /v1/completions, stream: true */
    KVF_SOAK_HTTP_WHOLE,  /* /v1/completions, stream: false */
    KVF_SOAK_KINDS
} kvf_soak_kind_t;

typedef enum {
    KVF_SOAK_SAME,    /* completed, equal to the colocated output */
    KVF_SOAK_DIFF,    /* completed, different: tokens duplicated, missing or wrong */
    KVF_SOAK_FAILED,  /* ended with an error the client was given */
    KVF_SOAK_ABORTED, /* aborted by the driver mid-stream */
    KVF_SOAK_LOST,    /* never ended properly: cut without an error, or no output in time */
    KVF_SOAK_OUTCOMES
} kvf_soak_outcome_t;

/* A kind of message (failure, difference, loss): the messages whose text
 * is the same once each run of digits is read as '#', how often they came
 * and the first of them. */
typedef struct {
    char key[232], example[232];
    kvf_soak_kind_t kind;
    kvf_soak_outcome_t outcome;
    unsigned count;
    bool clear; /* a failure the client was told about with a message */
} kvf_soak_note_t;

/* What the load saw; written by the load (main) thread only. */
typedef struct {
    uint64_t sent[KVF_SOAK_KINDS];
    uint64_t n[KVF_SOAK_KINDS][KVF_SOAK_OUTCOMES];
    uint64_t bad_prefix;    /* aborted requests whose output so far was not the reference's start */
    uint64_t unclear;       /* failures without an error message or error body */
    uint64_t abort_misses;  /* abort-bound requests that finished before their abort point */
    uint64_t native_tokens; /* tokens received on the native socket */
    kvf_soak_note_t notes[KVF_SOAK_NOTES];
    int n_notes;
    uint64_t notes_dropped; /* messages past the table's room */
    unsigned notes_logged;  /* lines written to stderr as they came */
} kvf_soak_tally_t;

typedef enum {
    KVF_SOAK_UP,
    KVF_SOAK_DOWN,
    KVF_SOAK_DRAINING,
    KVF_SOAK_RETIRED
} kvf_soak_node_state_t;

/* A node the chaos thread manages (its process is the cluster's procs[proc]). */
typedef struct {
    int proc;
    bool decode; /* role: decode, else prefill */
    kvf_soak_node_state_t state;
    uint64_t restart_ns; /* DOWN: when it starts again */
} kvf_soak_node_t;

/* What the chaos thread did; read by main after joining it. */
typedef struct {
    unsigned kills[2]; /* [0] prefill, [1] decode */
    unsigned restarts, skipped;
    char drained[32], replacement[32];
    bool drain_started, drain_done, drain_clean; /* clean: exited 0 in time */
    int drain_status;                            /* as waitpid; -1 when it had to be killed */
    double drain_at_s, drain_s;                  /* when (from the start), how long it took */
    bool warm_taken;
} kvf_soak_chaos_t;

/* A process's resident memory at the warm point and at the end. */
typedef struct {
    char name[32];
    pid_t pid;
    long warm_kib, end_kib; /* -1: not read */
} kvf_soak_rss_t;

typedef struct {
    /* settings, fixed before the load starts */
    double duration_s, warm_s, drain_bound_s, stall_s;
    uint64_t seed;
    int lease_ms;
    int inflight;       /* requests kept in flight that run to their end */
    int abort_inflight; /* abort-bound requests in flight at most */
    unsigned aborts_target;
    char scratch[240]; /* model and logs */
    char model[256];
    char lease_flag[16];
    const char *key_file; /* --cluster-key-file: the cluster runs keyed; NULL: not */
    int http_port;
    kvf_soak_prompt_t pool[KVF_SOAK_POOL];
    h_cluster_t cluster;
    uint64_t t0_ns; /* start of the measured run */

    atomic_bool stop_load;  /* a signal: end the load early */
    atomic_bool stop_chaos; /* the load is over */

    kvf_soak_tally_t tally;
    kvf_soak_node_t nodes[KVF_SOAK_NODES];
    int n_nodes;
    kvf_soak_chaos_t chaos;
    kvf_soak_rss_t rss[1 + KVF_SOAK_NODES];
    int n_rss;
} kvf_soak_t;

/* The driver's pseudo-random numbers (splitmix64): every run with the
 * same seed draws the same prompts, kinds and chaos times. */
static inline uint64_t kvf_soak_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A uniform draw from [lo, hi] (hi >= lo). */
static inline uint64_t kvf_soak_between(uint64_t *state, uint64_t lo, uint64_t hi)
{
    return lo + kvf_soak_rand(state) % (hi - lo + 1);
}

/* ---- soak_pool.c ---- */

/* Builds the pool over s->model (ids and text prompts of 16..400 tokens)
 * and computes every prompt's colocated reference with kvf generate.
 * Returns false after a message on stderr. */
bool kvf_soak_pool_init(kvf_soak_t *s);
void kvf_soak_pool_fini(kvf_soak_t *s);

/* ---- soak_load.c ---- */

/* Runs the load from now until s->t0_ns + duration (or stop_load), then
 * lets the requests in flight end, at most drain_bound_s more. Fills
 * s->tally. */
void kvf_soak_load_run(kvf_soak_t *s);

/* Records a message in s->tally's notes and (the first few hundred) on
 * stderr with the time into the run. Main thread only. */
void kvf_soak_note(kvf_soak_t *s, kvf_soak_kind_t kind, kvf_soak_outcome_t outcome, bool clear,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* "native", "http stream", "http whole". */
const char *kvf_soak_kind_name(kvf_soak_kind_t kind);

/* Seconds since the start of the measured run. */
double kvf_soak_elapsed_s(const kvf_soak_t *s);

/* ---- soak_chaos.c ---- */

/* Starts the four nodes (decode-0, decode-1, prefill-0, prefill-1). */
void kvf_soak_chaos_start_nodes(kvf_soak_t *s);

/* The chaos thread (pthread start routine, arg a kvf_soak_t *): kills and
 * restarts, the drain, the warm memory sample, until stop_chaos; then
 * restarts the nodes that are down and waits for the drain to end. */
void *kvf_soak_chaos_main(void *arg);

/* VmRSS of pid in KiB from /proc, or -1. */
long kvf_soak_rss_kib(pid_t pid);

/* Stops every process (nodes first, then the router): SIGTERM, then
 * SIGKILL after 30 s. Names on stdout each that did not exit 0 and
 * returns how many. */
int kvf_soak_stop_all(kvf_soak_t *s);

/* ---- soak_report.c ---- */

/* The end: waits (at most a lease + 1 s) for every live node to hold no
 * KV block, reads the memory at the end and the router's counters,
 * prints the tables and returns how many checks failed. */
int kvf_soak_report(kvf_soak_t *s);

#endif
