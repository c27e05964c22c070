/* The trace of kvf bench serve and its client driver: requests with
 * prompt and output lengths drawn from a fixed seed, Poisson arrival gaps,
 * run against a router's native client socket (kvf/clientsock.h) at a
 * request rate or in a closed loop, and the latency statistics of a run. */
#ifndef KVF_BENCH_SERVE_TRACE_H
#define KVF_BENCH_SERVE_TRACE_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvf/model.h"
#include "kvf/status.h"

/* A length distribution: "N" (fixed) or "A:B" (uniform, inclusive). */
typedef struct {
    uint32_t lo, hi;
} kvf_len_dist_t;

/* Parses "N" or "A:B" (1 <= A <= B) into *d; false when malformed. */
bool kvf_len_dist_parse(const char *text, kvf_len_dist_t *d);

/* Draws a length of d from the seed state *rng (advanced). */
uint32_t kvf_len_dist_draw(const kvf_len_dist_t *d, uint64_t *rng);

/* Draws an exponential gap of mean 1 from the seed state *rng (advanced). */
double kvf_serve_draw_exp(uint64_t *rng);

/* One request of the trace and what happened to it. */
typedef struct {
    double at_s;      /* arrival, from the start of the run */
    uint32_t *prompt; /* (n_prompt) */
    uint32_t n_prompt;
    uint32_t max_tokens;
    uint64_t t_sent, t_first, t_last, t_done; /* ns */
    uint32_t n_tokens;
    int finish; /* -1 while running */
    bool sent;
} kvf_trace_req_t;

/* The requests, the same for every load level and configuration; only
 * their arrival times change with the rate. */
typedef struct {
    kvf_trace_req_t *reqs; /* (n) */
    double *gaps;          /* (n) arrival gaps, exponential with mean 1 */
    size_t n;
} kvf_serve_trace_t;

/* What one run of the trace measured. */
typedef struct {
    double rate;     /* Poisson arrivals (req/s); 0 in a closed loop */
    int concurrency; /* closed loop: requests kept in flight; 0 for Poisson */
    double duration_s;
    size_t n_sent; /* fewer than the trace's when a signal stopped the run */
    size_t n_ok, n_failed;
    double req_per_s, tok_per_s, goodput;
    double ttft[3], tpot[3], e2e[3]; /* p50, p90, p99 in ms */
} kvf_serve_result_t;

/* Draws n requests from seed: prompt lengths from prompt_len, output
 * lengths from output_len, prompt ids below cfg's vocabulary (BOS first
 * when the model has one). Caller owns *t (init/fini). */
kvf_status_t kvf_serve_trace_init(kvf_serve_trace_t *t, size_t n, uint64_t seed,
                                  const kvf_len_dist_t *prompt_len,
                                  const kvf_len_dist_t *output_len, const kvf_model_config_t *cfg);
void kvf_serve_trace_fini(kvf_serve_trace_t *t);

/* Sets the arrival times for Poisson arrivals at rate req/s, or all at 0
 * for a closed loop (rate 0). */
void kvf_serve_trace_schedule(kvf_serve_trace_t *t, double rate);

/* Runs the trace against the router's client socket: each request at its
 * arrival time, or with concurrency > 0 in a closed loop (arrival times
 * ignored): concurrency requests in flight, the next sent as one ends.
 * Once *stop is set, only the requests already sent count. Goodput counts
 * the requests within both SLOs; the run gives up after timeout_s. Fills
 * res's counts and statistics (not rate and concurrency); returns 0 when
 * every request sent finished, else 1. */
int kvf_serve_trace_run(const char *client_url, kvf_serve_trace_t *t, int concurrency,
                        double slo_ttft_ms, double slo_tpot_ms, int timeout_s,
                        volatile sig_atomic_t *stop, kvf_serve_result_t *res);

#endif
