/* kvf bench serve --workload multiturn: conversations whose every turn
 * resends the conversation so far, the workload a prefix cache and
 * KV-aware routing are for (docs/prefix-cache.md).
 *
 * The trace (serve_multiturn_trace.c): N conversations of T turns drawn
 * from a seed. Every conversation starts with one shared system prompt;
 * turn k's prompt is turn k-1's prompt, then turn k-1's answer as
 * generated, then turn k's new user message. Answers are greedy with exact
 * lengths (ignore_eos), so a seed gives the same prompts on every run.
 * Conversations start by Poisson arrivals; a conversation's next turn
 * follows its previous answer after an exponential think time.
 *
 * The run (serve_multiturn_run.c) drives one trace against a router's
 * native client socket; the command (serve_multiturn.c) runs it on a fresh
 * cluster per routing policy, and the report (serve_multiturn_report.c)
 * prints, writes and plots the runs side by side with the issue's
 * targets. */
#ifndef KVF_BENCH_SERVE_MULTITURN_H
#define KVF_BENCH_SERVE_MULTITURN_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "serve_trace.h"

#include "kvf/model.h"
#include "kvf/status.h"

/* The prefix-cache rules the ideal hit rate follows (docs/prefix-cache.md,
 * "On the nodes"): hits count in whole blocks of 16 tokens and leave at
 * least 32 prompt tokens to compute. */
#define KVF_MULTITURN_BLOCK    16u
#define KVF_MULTITURN_MIN_TAIL 32u

/* What a trace is drawn from. */
typedef struct {
    uint64_t seed;
    uint32_t conversations, turns;
    uint32_t system_tokens;      /* >= 1 */
    kvf_len_dist_t user, output; /* a turn's new user message; its answer */
} kvf_multiturn_spec_t;

/* One turn as the trace fixes it before any answer exists. */
typedef struct {
    uint32_t *user; /* (n_user) the new user message: ids below the vocabulary, no EOS */
    uint32_t n_user;
    uint32_t max_tokens; /* the answer's length */
    double gap;          /* exponential, mean 1: turn 0, after the previous conversation's
                            start (scaled by 1 / rate); later turns, think time after the
                            previous answer (scaled by the mean think time) */
} kvf_multiturn_turn_t;

typedef struct {
    uint32_t *system; /* (n_system) BOS first when the model has one */
    uint32_t n_system;
    kvf_multiturn_turn_t *turns; /* (n_conv * n_turns), conversation-major */
    uint32_t n_conv, n_turns;
} kvf_multiturn_trace_t;

/* The most turns (at most spec->turns) whose longest possible last prompt
 * plus its longest answer stays below max_pos; 0 when not even one does. */
uint32_t kvf_multiturn_turns_fitting(const kvf_multiturn_spec_t *spec, int max_pos);

/* Draws the trace of spec for cfg's vocabulary. Caller owns *t
 * (init/fini; fini also after a failed init). */
kvf_status_t kvf_multiturn_trace_init(kvf_multiturn_trace_t *t, const kvf_multiturn_spec_t *spec,
                                      const kvf_model_config_t *cfg);
void kvf_multiturn_trace_fini(kvf_multiturn_trace_t *t);

/* Turn turn of conversation conv. */
const kvf_multiturn_turn_t *kvf_multiturn_trace_turn(const kvf_multiturn_trace_t *t, uint32_t conv,
                                                     uint32_t turn);

/* The prompt of turn turn of conversation conv given the answers of its
 * earlier turns (answers[k], n_answers[k] for k < turn; unread for turn
 * 0): system prompt, then for each earlier turn its user message and its
 * answer, then this turn's user message. *prompt_p (malloc) is the
 * caller's. */
kvf_status_t kvf_multiturn_trace_prompt(const kvf_multiturn_trace_t *t, uint32_t conv,
                                        uint32_t turn, const uint32_t *const *answers,
                                        const uint32_t *n_answers, uint32_t **prompt_p,
                                        uint32_t *n_prompt_p);

/* What an infinite prefix cache would reuse of prompt (n tokens): its
 * longest common prefix with any of the earlier prompts (earlier[i],
 * n_earlier[i], i < count), in whole KVF_MULTITURN_BLOCK blocks, and at
 * most (n - KVF_MULTITURN_MIN_TAIL) / KVF_MULTITURN_BLOCK blocks. In
 * tokens. */
uint32_t kvf_multiturn_ideal_cached(const uint32_t *prompt, uint32_t n,
                                    const uint32_t *const *earlier, const uint32_t *n_earlier,
                                    size_t count);

/* How to drive one run. */
typedef struct {
    double rate;                     /* conversations started per second (Poisson) */
    double think_ms;                 /* mean think time between an answer and the next turn */
    double slo_ttft_ms, slo_tpot_ms; /* goodput: requests within both */
    uint32_t short_tokens; /* a follow-up is short when its uncached part is at most this */
    int timeout_s;         /* the run gives up after this */
} kvf_multiturn_run_opts_t;

/* What one run measured. Token and byte counts are over the run. */
typedef struct {
    char route[16]; /* the run's name: random, load, kv, kv+local, default, ... */
    size_t n_requests, n_sent, n_ok, n_failed;
    double duration_s, req_per_s, goodput;
    double ttft_p50, ttft_p99; /* ms, every turn */
    double short_ttft_p50;     /* ms, follow-up turns whose uncached part is short */
    size_t n_short;
    uint64_t prompt_tokens, cached_tokens, ideal_cached; /* sums over the requests */
    uint64_t prefill_computed, kv_bytes, local_prefills;
    uint64_t kv_pulled; /* prefix blocks prefill nodes read from decode nodes (router only) */
    bool from_stats;   /* the four above from StatsReply deltas, else summed from chunks */
    double hit_rate;   /* cached_tokens / prompt_tokens */
    double ideal_rate; /* ideal_cached / prompt_tokens */
    uint64_t digest;   /* of every prompt and answer, in trace order */
} kvf_multiturn_result_t;

/* Runs trace t against the router's client socket at client_url: each
 * conversation's turns in order, a turn sent once its time has come and
 * the previous answer is complete. A failed turn ends its conversation.
 * Once *stop is set no turn is sent and the ones in flight finish. Fills
 * *res but for route; returns 0 when every turn of the trace finished,
 * else 1 (after a line on stderr). */
int kvf_multiturn_run(const char *client_url, const kvf_multiturn_trace_t *t,
                      const kvf_multiturn_run_opts_t *o, volatile sig_atomic_t *stop,
                      kvf_multiturn_result_t *res);

/* ---- the report (serve_multiturn_report.c) ------------------------------- */

/* What the report prints above and beside the runs. */
typedef struct {
    const kvf_multiturn_spec_t *spec;
    const kvf_multiturn_run_opts_t *run;
    const char *user_len, *output_len; /* as given */
    int prefill_nodes, decode_nodes, threads;
} kvf_multiturn_setup_t;

/* The table, one row per run, then the targets, each PASS, MISS or n/a
 * (a run it needs is missing). */
void kvf_multiturn_report_print(const kvf_multiturn_setup_t *s, const kvf_multiturn_result_t *r,
                                int n);

/* --json FILE: the settings, every run and the targets. Returns 0, or 1
 * after a line on stderr. */
int kvf_multiturn_report_json(const kvf_multiturn_setup_t *s, const kvf_multiturn_result_t *r,
                              int n, const char *path);

/* --plot FILE.png: bar charts of the metrics per run through gnuplot; the
 * data and script stay in run_dir (said on stderr when gnuplot fails). */
void kvf_multiturn_report_plot(const kvf_multiturn_result_t *r, int n, const char *png,
                               const char *run_dir);

/* The `kvf bench serve --workload multiturn` command; argv[0] is its
 * program name. Returns the process exit code. */
int kvf_bench_serve_multiturn(int argc, char **argv);

#endif
