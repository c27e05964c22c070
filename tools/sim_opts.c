/* See sim_opts.h. */
#include "sim_opts.h"

#include <stdio.h>
#include <string.h>

#include "kvf/dtype.h"
#include "kvf/kvcache.h"
#include "sim_measure.h"

/* The tensor-parallel sizes tried when --tp is not given. */
static const int tp_sizes[] = {1, 2, 4, 8};
/* The weights may take at most this share of an instance's usable
 * memory when the size is chosen: the rest holds KV. */
#define TP_WEIGHT_SHARE 0.7

size_t kvf_sim_opts_flags(kvf_sim_opts_t *o, kvf_flag_t *flags)
{
    *o = (kvf_sim_opts_t){.profile = "h200",
                          .kv_dtype = "bf16",
                          .weight_dtype = "config",
                          .route = "kv",
                          .prompt_len = "1024:4096",
                          .output_len = "100:500",
                          .requests = 1000,
                          .rate = 4,
                          .seed = 1,
                          .prefix_tokens = 1024,
                          .block_size = 16,
                          .chunk_tokens = 2048,
                          .max_batch = 256,
                          .prefix_cache = 64,
                          .heartbeat_ms = 500,
                          .max_queue = 256,
                          .measure_threads = 1};
    const kvf_flag_t shared[] = {
        {"model", KVF_FLAG_STRING, &o->model_dir, "DIR", "the model's config.json (any HF one)",
         NULL},
        {"profile", KVF_FLAG_STRING, &o->profile, "NAME|FILE|measure",
         "hardware: h100, h200, a100, a JSON profile, or measure: this machine's (kvf bench "
         "engine and transfer, about 25 s)",
         NULL},
        {"measure-threads", KVF_FLAG_INT, &o->measure_threads, "N",
         "--profile measure: CPU threads per node", NULL},
        {"tp", KVF_FLAG_INT, &o->tp, "N", "GPUs per node, tensor parallel (0: fewest that fit)",
         NULL},
        {"kv-dtype", KVF_FLAG_STRING, &o->kv_dtype, "f32|f16|bf16|fp8|int8", "KV cache format",
         NULL},
        {"weight-dtype", KVF_FLAG_STRING, &o->weight_dtype, "config|bf16|f16|f32",
         "the weights' element type (config: its torch_dtype, f32 without)", NULL},
        {"trace", KVF_FLAG_STRING, &o->trace, "FILE",
         "requests from FILE (CSV, or JSONL by name): arrival_s, prompt_tokens, output_tokens, "
         "prefix_id, prefix_tokens",
         NULL},
        {"requests", KVF_FLAG_INT, &o->requests, "N", "generated requests", NULL},
        {"rate", KVF_FLAG_DOUBLE, &o->rate, "R", "Poisson arrivals, requests/s", NULL},
        {"seed", KVF_FLAG_UINT64, &o->seed, "S", "the workload's and the router's draws", NULL},
        {"prompt-len", KVF_FLAG_STRING, &o->prompt_len, "N|A:B", "prompt tokens", NULL},
        {"output-len", KVF_FLAG_STRING, &o->output_len, "N|A:B", "output tokens", NULL},
        {"prefixes", KVF_FLAG_INT, &o->prefixes, "N", "requests share one of N prefixes (0: none)",
         NULL},
        {"prefix-tokens", KVF_FLAG_INT, &o->prefix_tokens, "N", "tokens of a shared prefix", NULL},
        {"route", KVF_FLAG_STRING, &o->route, "kv|load|random", "the router's policy", NULL},
        {"block-size", KVF_FLAG_INT, &o->block_size, "N", "tokens per KV block", NULL},
        {"chunk-tokens", KVF_FLAG_INT, &o->chunk_tokens, "N",
         "prompt tokens one step computes at most", NULL},
        {"max-batch", KVF_FLAG_INT, &o->max_batch, "N", "sequences per decode node", NULL},
        {"prefix-cache", KVF_FLAG_INT, &o->prefix_cache, "N", "prefixes a node keeps cached", NULL},
        {"heartbeat-ms", KVF_FLAG_INT, &o->heartbeat_ms, "MS", "nodes' load reports", NULL},
        {"max-queue", KVF_FLAG_INT, &o->max_queue, "N", "the router's wait queue", NULL},
        {"local-prefill-max", KVF_FLAG_INT, &o->local_prefill_max, "N",
         "split: decode nodes prefill a cached prompt's last N tokens themselves", NULL},
        {"slo-ttft-ms", KVF_FLAG_DOUBLE, &o->slo_ttft_ms, "MS", "time-to-first-token SLO", NULL},
        {"slo-tpot-ms", KVF_FLAG_DOUBLE, &o->slo_tpot_ms, "MS", "time-per-output-token SLO", NULL},
    };
    memcpy(flags, shared, sizeof(shared));
    return sizeof(shared) / sizeof(shared[0]);
}

/* The profile: a built-in name, else a file. Returns -1 or the exit code. */
static int resolve_profile(const char *prog, const char *name, kvf_sim_profile_t *hw)
{
    if (kvf_sim_profile_builtin(name, hw))
        return -1;
    if (!strchr(name, '/') && !strstr(name, ".json")) {
        fprintf(stderr, "%s: unknown hardware profile '%s' (built in: %s; or a JSON file)\n", prog,
                name, kvf_sim_profile_names());
        return 2;
    }
    char err[512];
    if (kvf_sim_profile_load(name, hw, err, sizeof(err)) != KVF_OK) {
        fprintf(stderr, "%s: %s\n", prog, err);
        return 2;
    }
    return -1;
}

/* The model and its cost-model shape at o's tensor-parallel size (or the
 * fewest GPUs that leave room for KV). Returns -1 or the exit code. */
static int resolve_model(const char *prog, const kvf_sim_opts_t *o, kvf_sim_config_t *cfg)
{
    if (!o->model_dir) {
        fprintf(stderr, "%s: needs --model DIR (a directory with an HF config.json)\n", prog);
        return 2;
    }
    kvf_status_t st = kvf_model_config_load(o->model_dir, &cfg->model_cfg);
    if (st != KVF_OK) {
        fprintf(stderr, "%s: cannot read %s/config.json: %s\n", prog, o->model_dir,
                kvf_status_str(st));
        return 2;
    }
    kvf_dtype_t wd = cfg->model_cfg.dtype;
    if (kvf_kv_dtype_parse(o->kv_dtype, &cfg->kv_dtype) != KVF_OK ||
        (strcmp(o->weight_dtype, "config") && kvf_dtype_parse(o->weight_dtype, &wd) != KVF_OK) ||
        !kvf_dtype_size(wd)) {
        fprintf(stderr, "%s: unknown --kv-dtype '%s' or --weight-dtype '%s'\n", prog, o->kv_dtype,
                o->weight_dtype);
        return 2;
    }
    double wbytes = (double)kvf_dtype_size(wd);
    for (size_t i = 0; i < sizeof(tp_sizes) / sizeof(tp_sizes[0]); i++) {
        int tp = o->tp > 0 ? o->tp : tp_sizes[i];
        kvf_sim_model_init(&cfg->model_cfg, wbytes, cfg->kv_dtype, tp, &cfg->model);
        double usable = cfg->hw.hbm_bytes * tp * cfg->hw.kv_mem_fraction;
        if (o->tp > 0 || cfg->model.weight_bytes <= TP_WEIGHT_SHARE * usable)
            return -1;
    }
    return -1; /* the largest; kvf_sim_run says when even that does not fit */
}

/* The workload: the trace, or the generator. Returns -1 or the exit code. */
static int resolve_workload(const char *prog, const kvf_sim_opts_t *o, kvf_sim_workload_t *w)
{
    char err[512];
    if (o->trace) {
        if (kvf_sim_workload_load(o->trace, (uint32_t)o->prefix_tokens, w, err, sizeof(err)) !=
            KVF_OK) {
            fprintf(stderr, "%s: bad trace: %s\n", prog, err);
            return 2;
        }
        return -1;
    }
    kvf_sim_gen_t g = {.n = (size_t)o->requests,
                       .seed = o->seed,
                       .rate = o->rate,
                       .n_prefixes = (uint32_t)o->prefixes,
                       .prefix_tokens = (uint32_t)o->prefix_tokens};
    if (o->requests <= 0 || o->rate <= 0 || o->prefixes < 0 || o->prefix_tokens < 0 ||
        !kvf_len_dist_parse(o->prompt_len, &g.prompt_len) ||
        !kvf_len_dist_parse(o->output_len, &g.output_len)) {
        fprintf(stderr,
                "%s: needs --requests N > 0, --rate R > 0, --prompt-len and "
                "--output-len as N or A:B\n",
                prog);
        return 2;
    }
    if (kvf_sim_workload_generate(&g, w) != KVF_OK) {
        fprintf(stderr, "%s: out of memory\n", prog);
        return 1;
    }
    return -1;
}

int kvf_sim_opts_resolve(const char *prog, const kvf_sim_opts_t *o, kvf_sim_config_t *cfg,
                         kvf_sim_workload_t *w)
{
    *cfg = (kvf_sim_config_t){0};
    kvf_sim_config_defaults(cfg);
    if (o->block_size <= 0 || o->block_size > KVF_KV_BLOCK_SIZE_MAX || o->chunk_tokens <= 0 ||
        o->max_batch <= 0 || o->prefix_cache < 0 || o->heartbeat_ms <= 0 || o->max_queue < 0 ||
        o->local_prefill_max < 0 || o->tp < 0 || o->slo_ttft_ms < 0 || o->slo_tpot_ms < 0) {
        fprintf(stderr, "%s: sizes, counts and SLOs must be positive\n", prog);
        return 2;
    }
    if (!kvf_route_policy_parse(o->route, &cfg->route)) {
        fprintf(stderr, "%s: --route must be kv, load or random, not '%s'\n", prog, o->route);
        return 2;
    }
    cfg->block_size = (uint32_t)o->block_size;
    cfg->chunk_tokens = (uint32_t)o->chunk_tokens;
    cfg->max_batch = (uint32_t)o->max_batch;
    cfg->prefix_cache = (uint32_t)o->prefix_cache;
    cfg->heartbeat_ms = (unsigned)o->heartbeat_ms;
    cfg->max_queue = (unsigned)o->max_queue;
    cfg->local_prefill_max_tokens = (uint32_t)o->local_prefill_max;
    cfg->seed = o->seed;
    cfg->slo_ttft_ms = o->slo_ttft_ms;
    cfg->slo_tpot_ms = o->slo_tpot_ms;
    /* a measured profile is fitted to the model, on one node's threads */
    bool measured = !strcmp(o->profile, "measure");
    if (measured && (o->tp > 1 || o->measure_threads < 1)) {
        fprintf(stderr, "%s: --profile measure is one CPU node: no --tp, --measure-threads >= 1\n",
                prog);
        return 2;
    }
    int rc = -1;
    if (measured)
        cfg->hw = (kvf_sim_profile_t){.hbm_bytes = 1e18, .kv_mem_fraction = 1}; /* tp 1 */
    else
        rc = resolve_profile(prog, o->profile, &cfg->hw);
    if (rc < 0)
        rc = resolve_model(prog, o, cfg);
    if (rc < 0 && measured) {
        rc = kvf_sim_measure_profile(prog, o->model_dir, o->measure_threads, 3, false, &cfg->model,
                                     &cfg->hw);
        if (rc < 0)
            kvf_sim_describe_profile(stderr, "kvf simulate: measured", &cfg->hw);
    }
    if (rc < 0)
        rc = resolve_workload(prog, o, w);
    return rc;
}
