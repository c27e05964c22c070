/* Test harness for multi-process cluster tests: starts a router and nodes
 * from build/bin on 127.0.0.1 (free ports), talks to the router as a native
 * client, computes colocated references, and stops every process it
 * started (SIGTERM, then SIGKILL), whatever the test's outcome. */
#ifndef KVF_TEST_HARNESS_H
#define KVF_TEST_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvf/clientsock.h"

#define H_MAX_PROCS 16

typedef struct {
    pid_t pid;
    char name[32];
    char url[64];  /* its inbox */
    char log[320]; /* its stderr/stdout */
} h_proc_t;

typedef struct {
    char dir[240];        /* scratch directory (logs) */
    const char *model;    /* model directory */
    char router_url[64];  /* router inbox */
    char client_url[64];  /* router client socket */
    h_proc_t procs[H_MAX_PROCS];
    int n_procs;
    const char *ucx_tls;  /* UCX_TLS for the nodes, NULL: UCX's choice */
    const char *key_file; /* cluster key of every process started, NULL: none (h_cluster_key) */
} h_cluster_t;

/* Kills (SIGKILL) every process of every cluster not yet stopped: for a
 * test's teardown, so a failed assertion leaves nothing running. Returns
 * 0 (a cmocka teardown). */
int h_teardown(void **state);

/* Prepares a cluster over model (nothing started). */
void h_cluster_init(h_cluster_t *c, const char *model, const char *ucx_tls);

/* Makes path (borrowed, kept until the cluster stops) the cluster key of
 * every process started from now on ($KVF_CLUSTER_KEY_FILE) and loads it
 * into this process, whose client calls then sign with it. */
void h_cluster_key(h_cluster_t *c, const char *path);

/* Starts the router; extra router flags may follow (NULL-terminated). */
void h_start_router(h_cluster_t *c, ...);

/* Starts a node ("prefill" or "decode") named name; extra flags follow,
 * NULL-terminated. Returns its index in procs. */
int h_start_node(h_cluster_t *c, const char *role, const char *name, ...);

/* Waits until the router lists n_nodes live nodes (fails the test after
 * timeout_ms). */
void h_wait_nodes(h_cluster_t *c, int n_nodes, int timeout_ms);

/* Stops every process (SIGTERM, then SIGKILL after 5 s) and prints the
 * tail of each log when print_logs. */
void h_cluster_stop(h_cluster_t *c, bool print_logs);

/* Sends SIGKILL to process i and reaps it. */
void h_kill(h_cluster_t *c, int i);

/* Node stats as the router reports them. */
typedef struct {
    char id[64];
    int role; /* Kvf__Role */
    char state[16];
    uint32_t blocks_used, blocks_total, running;
    uint32_t tier_ram_blocks, tier_disk_blocks; /* its KV tiers' (docs/kv-tiers.md) */
    uint64_t dispatched;
} h_node_stats_t;

/* Fills up to max entries; returns how many nodes the router listed. */
int h_stats(h_cluster_t *c, h_node_stats_t *out, int max);

/* How many request attempts the router had to send again. */
uint64_t h_redispatched(h_cluster_t *c);

/* Whether a line of process i's log holds text. */
bool h_log_holds(const h_cluster_t *c, int i, const char *text);

/* The router's prefill and transfer counters (StatsReply), since it
 * started. */
typedef struct {
    uint64_t prefill_computed, prefill_cached; /* prompt tokens */
    uint64_t kv_bytes;                         /* shipped between nodes */
    uint64_t local_prefills;                   /* run by decode nodes */
    uint64_t redispatched;
} h_totals_t;
void h_totals(h_cluster_t *c, h_totals_t *t);

/* Waits until every node the router lists reports 0 KV blocks in use;
 * fails the test after timeout_ms. */
void h_wait_no_blocks_used(h_cluster_t *c, int timeout_ms);

/* One generation through the native client. */
typedef struct {
    uint32_t *prompt; /* ids, used exactly */
    size_t n_prompt;
    const char *text; /* or text */
    uint32_t max_tokens;
    float temperature, top_p;
    uint32_t top_k;
    uint64_t seed;
    bool has_seed;
    bool ignore_eos;
    /* results */
    uint32_t *out; /* generated ids */
    size_t n_out, cap_out;
    char *out_text; /* (n_text) the text, NUL-terminated; it may hold U+0000 too */
    size_t n_text;
    int finish; /* Kvf__FinishReason, -1 while running */
    int status;
    char error[256];
    uint32_t next_seq;
    bool seq_ok;
} h_gen_t;

/* Runs n generations concurrently over one client socket; each finishes or
 * the test fails after timeout_ms. Each starts with no results (an earlier
 * run's are dropped). cancel_after: if >= 0, request i is cancelled once it
 * has produced cancel_after[i] tokens (NULL: none). */
void h_generate_many(h_cluster_t *c, h_gen_t *gens, size_t n, const int *cancel_after,
                     int timeout_ms);

/* Called while generations run, after each received chunk and at least
 * every 50 ms, with the total number of tokens received so far (e.g. to
 * kill a node mid-stream). */
typedef void (*h_progress_fn)(h_cluster_t *c, void *arg, size_t tokens);

/* h_generate_many with a progress hook (NULL: none). */
void h_generate_many_ex(h_cluster_t *c, h_gen_t *gens, size_t n, const int *cancel_after,
                        int timeout_ms, h_progress_fn progress, void *arg);

/* Sends SIGTERM to process i and waits up to timeout_ms for it to exit;
 * returns its exit status (as waitpid), or -1 if it had to be killed. */
int h_terminate(h_cluster_t *c, int i, int timeout_ms);

/* Sends sig to process i (if it runs) without waiting for it. */
void h_signal(h_cluster_t *c, int i, int sig);

/* Reaps process i without waiting: true, with *status_p (as waitpid),
 * once it has exited; false while it runs or when it is already gone. */
bool h_reaped(h_cluster_t *c, int i, int *status_p);

/* Starts the node of slot i again (its process gone: killed or drained)
 * under the same name and log, with a fresh inbox; role as h_start_node,
 * extra flags follow, NULL-terminated. */
void h_restart_node(h_cluster_t *c, int i, const char *role, ...);

/* Index of the process named name, or -1. */
int h_find(const h_cluster_t *c, const char *name);

void h_gen_free(h_gen_t *g);

/* g becomes a fresh generation of a random prompt: n_prompt ids from
 * h_prompt(n_prompt, vocab, seed), the first one vocab - 2 (the BOS of the
 * models h_mkmodel makes), max_tokens, greedy; ignore_eos as given. */
void h_gen_random(h_gen_t *g, size_t n_prompt, uint32_t vocab, uint64_t seed, uint32_t max_tokens,
                  bool ignore_eos);

/* The colocated reference of each of gens[0..n) (h_colocated). */
void h_references(const char *model, const h_gen_t *gens, size_t n, uint32_t **refs,
                  size_t *n_refs);

/* Frees the prompts, outputs and references (refs may be NULL) of
 * gens[0..n). */
void h_gens_free(h_gen_t *gens, uint32_t **refs, size_t n);

/* The colocated reference: kvf generate --model M --prompt-ids ... --ids
 * with g's sampling; returns a malloc'd id array. */
uint32_t *h_colocated(const char *model, const h_gen_t *g, size_t *n_p);

/* The same reference as text (what a client of the HTTP API reads):
 * malloc'd, NUL-terminated, the caller's; *len_p its length in bytes. */
char *h_colocated_text(const char *model, const h_gen_t *g, size_t *len_p);

/* Checks every generation of gens against its colocated reference
 * (refs[i], n_refs[i] ids): the same ids, chunks in order, and a finish
 * reason in finish_mask (bits 1 << Kvf__FinishReason). Prints each
 * difference; if any, stops the cluster (with its logs) and fails. */
void h_check_outputs(h_cluster_t *c, const h_gen_t *gens, uint32_t *const *refs,
                     const size_t *n_refs, size_t n, unsigned finish_mask);

#define H_FINISH_STOP (1u << 1)
#define H_FINISH_LENGTH (1u << 2)

/* Removes a model directory made by h_mkmodel; 0 on success (a cmocka
 * teardown's result). */
int h_rmmodel(const char *dir);

/* A deterministic pseudo-random prompt of n ids in [1, vocab - 3]. */
uint32_t *h_prompt(size_t n, uint32_t vocab, uint64_t seed);

/* Makes a random model directory under the scratch dir with kvf mkmodel;
 * args is the flag string. Returns its path (static storage per call
 * site is the caller's: copy it). */
void h_mkmodel(const char *dir, const char *args);

/* GET /metrics from the router's HTTP port (--http 127.0.0.1:port) into
 * buf (terminated); false if it fails. */
bool h_http_metrics(int port, char *buf, size_t cap);

#endif
