/* The options kvf simulate and kvf plan share: the model, the hardware,
 * the workload and the cluster's settings (sim/sim.h), their flags and
 * how they become a simulator configuration. */
#ifndef KVF_TOOLS_SIM_OPTS_H
#define KVF_TOOLS_SIM_OPTS_H

#include <stddef.h>

#include "kvf/flags.h"
#include "sim.h"

typedef struct {
    const char *model_dir, *profile, *kv_dtype, *weight_dtype, *trace, *route;
    const char *prompt_len, *output_len;
    int tp, requests, prefixes, prefix_tokens;
    double rate;
    uint64_t seed;
    int block_size, chunk_tokens, max_batch, prefix_cache, heartbeat_ms, max_queue;
    int local_prefill_max, measure_threads;
    double slo_ttft_ms, slo_tpot_ms;
} kvf_sim_opts_t;

/* The most flags kvf_sim_opts_flags writes. */
#define KVF_SIM_OPTS_MAX_FLAGS 32

/* Sets o's defaults and writes the shared flags, pointing into o, at
 * flags[0..); returns how many. */
size_t kvf_sim_opts_flags(kvf_sim_opts_t *o, kvf_flag_t *flags);

/* Builds cfg (cluster sizes left 0) and the workload from o: the model's
 * config.json, the profile (a built-in name or a JSON file), the tensor-
 * parallel size (0: the smallest that leaves room for KV), the trace file
 * or the generator. Returns -1 when both are ready (w is the caller's:
 * kvf_sim_workload_fini), else the exit code after a message on stderr. */
int kvf_sim_opts_resolve(const char *prog, const kvf_sim_opts_t *o, kvf_sim_config_t *cfg,
                         kvf_sim_workload_t *w);

#endif
