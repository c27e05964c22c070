/* kvf simulate: a discrete-event simulator of a kvferry cluster
 * (docs/simulator.md). Requests arrive from a workload; the router's own
 * routing code (router/route.c, on a socketless router: detached.c)
 * places them on simulated prefill, decode or colocated nodes, whose
 * steps and transfers take the cost model's times (sim_cost.h); the
 * nodes report their load and cached prefixes to that router the way
 * real nodes do (heartbeats, PrefixUpdate). Everything is a function of
 * the inputs and the seed: the same inputs give the same output. */
#ifndef KVF_SIM_H
#define KVF_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvf/model.h"
#include "kvf/status.h"
#include "router.h"
#include "serve_trace.h"
#include "sim_cost.h"

/* ---- workloads (workload.c) ----------------------------------------------- */

/* One request of a workload. */
typedef struct {
    double at_s;            /* arrival, from the start */
    uint32_t n_prompt;      /* prompt tokens, >= 1 */
    uint32_t n_output;      /* tokens to generate, >= 1 */
    int32_t prefix_id;      /* requests of one id share their first prefix_tokens; -1: none */
    uint32_t prefix_tokens; /* <= n_prompt */
} kvf_sim_req_t;

typedef struct {
    kvf_sim_req_t *reqs; /* (n), arrivals in order */
    size_t n;
} kvf_sim_workload_t;

/* What kvf bench serve's generator takes (bench/serve_trace.h): n
 * requests, lengths drawn from the two distributions, Poisson arrivals
 * at rate req/s, from seed; with n_prefixes > 0 each request shares a
 * prefix of prefix_tokens (at most its prompt) with the others of one of
 * n_prefixes ids, drawn uniformly. */
typedef struct {
    size_t n;
    uint64_t seed;
    double rate;
    kvf_len_dist_t prompt_len, output_len;
    uint32_t n_prefixes, prefix_tokens;
} kvf_sim_gen_t;

/* Draws the workload g describes into *w (init/fini; caller owns). */
kvf_status_t kvf_sim_workload_generate(const kvf_sim_gen_t *g, kvf_sim_workload_t *w);
/* Reads a trace file: CSV (arrival_s,prompt_tokens,output_tokens
 * [,prefix_id[,prefix_tokens]], an optional header line, # comments) or,
 * for a name ending in .jsonl, one JSON object a line with those keys.
 * Arrivals must not go back in time. default_prefix_tokens is the shared
 * length of a prefix id given without one. A problem is described in err
 * ("FILE:LINE: ..."). */
kvf_status_t kvf_sim_workload_load(const char *path, uint32_t default_prefix_tokens,
                                   kvf_sim_workload_t *w, char *err, size_t err_len);
void kvf_sim_workload_fini(kvf_sim_workload_t *w);

/* The first n (<= r->n_prompt) tokens of the prompt of request i of a
 * workload as the simulated nodes and router see it: the prefix id's
 * tokens, then ones no other request has. ids holds n. */
void kvf_sim_prompt_fill(const kvf_sim_req_t *r, size_t i, uint32_t *ids, uint32_t n);

/* ---- the cluster (cluster.c) ---------------------------------------------- */

typedef struct {
    kvf_sim_profile_t hw;
    kvf_sim_model_t model;
    kvf_model_config_t model_cfg;
    kvf_kv_dtype_t kv_dtype;
    /* n_prefill + n_decode (split) or n_colocated (decode nodes that
     * prefill: --prefill-local), not both */
    int n_prefill, n_decode, n_colocated;
    uint32_t block_size;       /* tokens per KV block (16) */
    uint32_t chunk_tokens;     /* prompt tokens one step computes at most (2048) */
    uint32_t max_batch;        /* sequences per decode node (256) */
    uint32_t prefix_cache;     /* prefixes a node keeps cached (LRU), 0: none */
    unsigned heartbeat_ms;     /* node load reports (500, the router's default) */
    unsigned max_queue;        /* the router's wait queue (256) */
    unsigned queue_timeout_ms; /* the longest wait in it (30000) */
    kvf_route_policy_t route;
    uint32_t local_prefill_max_tokens; /* split: decode nodes prefill short suffixes */
    uint64_t seed;                     /* the router's draws and hash key */
    double arrival_scale;              /* arrival times multiplied by this (1) */
    double slo_ttft_ms, slo_tpot_ms;   /* goodput counts requests within both */
} kvf_sim_config_t;

/* Sets the defaults named above; hardware, model, KV format and the
 * cluster's sizes are the caller's to set. */
void kvf_sim_config_defaults(kvf_sim_config_t *cfg);

/* What a run measured. Times in ms, percentiles p50, p90, p99. */
typedef struct {
    size_t n, n_done, n_refused;
    double duration_s; /* first arrival to last completion */
    double ttft[3], tpot[3], e2e[3];
    double goodput;    /* requests within both SLOs per second */
    double attainment; /* their share of all requests */
    double req_per_s, tok_per_s;
    double util_prefill, util_decode; /* busy share of each pool's nodes (colocated: decode) */
    double *ttft_ms, *tpot_ms;        /* (n_ttft, n_tpot) sorted, for the plot */
    size_t n_ttft, n_tpot;
    uint64_t steps, transfers;
    double kv_bytes;        /* shipped from prefill to decode nodes */
    uint64_t cached_tokens; /* prompt tokens prefix caches spared */
} kvf_sim_result_t;

/* Runs w through the cluster cfg describes. res is the caller's:
 * kvf_sim_result_fini(). A cluster that cannot hold the model is
 * refused (INVAL) with the reason in err. */
kvf_status_t kvf_sim_run(const kvf_sim_config_t *cfg, const kvf_sim_workload_t *w,
                         kvf_sim_result_t *res, char *err, size_t err_len);
void kvf_sim_result_fini(kvf_sim_result_t *res);

/* GPUs the cluster uses: nodes times tensor-parallel size. */
int kvf_sim_gpus(const kvf_sim_config_t *cfg);

/* ---- the simulated router on its own (router_view.c) ---------------------- */

/* The socketless router with simulated nodes registered, for tests that
 * compare its choices with a real router's on the same state. */
typedef struct kvf_sim_router kvf_sim_router_t;

/* A router with cfg's nodes ("p0".., "d0".., or "c0".. colocated) of
 * capacity_blocks each. Caller owns: kvf_sim_router_destroy(). */
kvf_status_t kvf_sim_router_create(const kvf_sim_config_t *cfg, uint32_t capacity_blocks,
                                   kvf_sim_router_t **sr_p);
void kvf_sim_router_destroy(kvf_sim_router_t *sr);

/* A node's load, as its heartbeat carries it. */
typedef struct {
    uint32_t blocks_free, blocks_total, running, queued_requests;
    uint64_t queued_tokens;
} kvf_sim_load_t;

/* Applies node `node`'s (index into the router's nodes) heartbeat. */
void kvf_sim_router_beat(kvf_sim_router_t *sr, int node, const kvf_sim_load_t *load);
/* Node `node` reports the first n_blocks blocks of prompt ids[0..n) cached. */
kvf_status_t kvf_sim_router_cached(kvf_sim_router_t *sr, int node, const uint32_t *ids, uint32_t n,
                                   uint32_t n_blocks);
/* The router's pick for a request of prompt ids[0..n) and max_tokens:
 * the names of its prefill and decode nodes (the same for a local
 * prefill); false when it would wait. Names are valid until destroy. */
bool kvf_sim_router_pick(kvf_sim_router_t *sr, const uint32_t *ids, uint32_t n, uint32_t max_tokens,
                         const char **prefill_p, const char **decode_p);

/* ---- the planner (plan.c) ------------------------------------------------------ */

#define SIM_PLAN_MAX_NODES 64

/* One cluster the planner tried, at the workload's rate. */
typedef struct {
    int n_prefill, n_decode, n_colocated, gpus;
    bool meets;                /* both p99s within their SLOs, nothing refused */
    double ttft_p99, tpot_p99; /* ms */
    size_t refused;
    double shortfall; /* the larger p99 / SLO; > 1: missed; INFINITY: requests lost */
    double goodput;   /* the highest rate it meets the SLOs at, req/s */
    double goodput_per_gpu;
} kvf_sim_candidate_t;

typedef struct {
    double rate;                          /* the workload's arrival rate */
    kvf_sim_candidate_t split, colocated; /* the cheapest meeting, or the closest, of each */
    const kvf_sim_candidate_t *best;      /* the cheaper of those that meet; NULL: none */
    const kvf_sim_candidate_t *closest;   /* the smaller shortfall of the two */
    size_t tried;                         /* simulations of the size search */
} kvf_sim_plan_t;

/* Searches clusters of base's model, hardware and settings up to
 * max_nodes nodes under w (its arrivals set the rate): for split P:D and
 * for colocated, the fewest nodes meeting base's SLOs (slo_ttft_ms and
 * slo_tpot_ms bound the p99s), then each one's goodput. plan's pointers
 * point into plan. */
kvf_status_t kvf_sim_plan(const kvf_sim_config_t *base, const kvf_sim_workload_t *w, int max_nodes,
                          kvf_sim_plan_t *plan, char *err, size_t err_len);

/* ---- output (report.c) ------------------------------------------------------ */

/* The table for people, on stdout. */
void kvf_sim_report_print(const kvf_sim_config_t *cfg, const kvf_sim_result_t *res);
/* res as JSON into path; 0, or 1 after a message on stderr. */
int kvf_sim_report_json(const kvf_sim_config_t *cfg, const kvf_sim_result_t *res, const char *path,
                        const char *prog);
/* TTFT and TPOT CDFs as an SVG into path; 0, or 1 after a message. */
int kvf_sim_report_svg(const kvf_sim_config_t *cfg, const kvf_sim_result_t *res, const char *path,
                       const char *prog);

#endif
