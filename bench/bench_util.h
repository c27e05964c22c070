/* What the benchmarks of kvf bench share: order statistics of timings,
 * lists of rates, the --json file, the random prompt tokens, the bytes a decode step streams,
 * and waiting for a child process. */
#ifndef KVF_BENCH_UTIL_H
#define KVF_BENCH_UTIL_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvf/model.h"

/* The median of v[0..n), n >= 1 (the mean of the middle two for even n).
 * Sorts v in place. */
double kvf_bench_median(double *v, size_t n);

/* p50, p90 and p99 of v[0..n) by nearest rank into out; NAN each when n is
 * 0. Sorts v in place. */
void kvf_bench_percentiles(double *v, size_t n, double out[3]);

/* A comma-separated list of at most max levels into out: positive finite
 * numbers (rates, loads), or with integers whole numbers >= 1
 * (concurrencies). Returns their number, or -1 on a malformed list. */
int kvf_bench_parse_levels(const char *text, bool integers, double *out, int max);

/* Writes root, printed, and a newline to path. Returns 0, or 1 after
 * "<prog>: cannot write <path>" on stderr. */
int kvf_bench_write_json(const cJSON *root, const char *path, const char *prog);

/* Fills tokens[0..n) with ids below vocab from a fixed seed: every run and
 * every backend times the same prompt. */
void kvf_bench_random_tokens(uint32_t *tokens, size_t n, int vocab);

/* Bytes one decode step streams of weights whose total is total_bytes at
 * elem_bytes an element: all of them but the embedding table (one row is
 * read per token), unless the table is also the lm_head. */
double kvf_bench_step_weight_bytes(const kvf_model_config_t *c, double total_bytes,
                                   size_t elem_bytes);

/* Waits for child pid to exit, checking every poll_ms; at deadline_ns
 * (kvf_clock_ns) it is killed with SIGKILL and reaped. Returns its wait
 * status. */
int kvf_bench_reap(pid_t pid, uint64_t deadline_ns, unsigned poll_ms);

#endif
