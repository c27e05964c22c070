/* kvf bench serve --workload multiturn: the command, its flags and the
 * runs it starts, one fresh cluster per routing policy. See
 * serve_multiturn.h. */
#include "serve_multiturn.h"
#include "serve_launch.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvf/auth.h"
#include "kvf/flags.h"
#include "kvf/model.h"

#define MT_MAX_RUNS          8
#define MT_MAX_TURNS         256
#define MT_MAX_CONVERSATIONS 4096 /* the ideal hit compares every pair of prompts */

typedef struct {
    const char *workload, *model, *router, *user_len, *output_len, *routes, *local_max,
        *prefill_weight, *decode_weight, *transfer_weight, *kv_mem, *run_dir, *json, *plot,
        *cluster_key_file, *prefill_kv_mem, *kv_host_mem, *kv_disk, *kv_disk_size;
    int conversations, turns, system_tokens, short_tokens, prefill_nodes, decode_nodes, threads,
        timeout_s;
    uint64_t seed;
    double rate, think_ms, slo_ttft, slo_tpot;
    bool local;
    /* from the above */
    kvf_multiturn_spec_t spec;
    kvf_multiturn_run_opts_t run;
    kvf_model_config_t cfg;
    char names[MT_MAX_RUNS][16]; /* the runs: routes, then kv+local */
    int n_runs;
} mt_opts_t;

/* The defaults of every flag. */
static mt_opts_t default_opts(void)
{
    return (mt_opts_t){.workload = "multiturn",
                       .user_len = "16:64",
                       .output_len = "16:64",
                       .routes = "random,load,kv",
                       .local_max = "256",
                       .kv_mem = "1G",
                       .run_dir = "/tmp/kvf-bench-serve",
                       .conversations = 16,
                       .turns = 4,
                       .system_tokens = 256,
                       .short_tokens = -1,
                       .prefill_nodes = 2,
                       .decode_nodes = 2,
                       .threads = 1,
                       .timeout_s = 600,
                       .seed = 1,
                       .rate = 2,
                       .think_ms = 50,
                       .slo_ttft = 2000,
                       .slo_tpot = 200,
                       .local = true};
}

/* Returns -1 to run, else the exit code (help printed, or a bad flag). */
static int parse_flags(int argc, char **argv, mt_opts_t *o)
{
    *o = default_opts();
    kvf_flag_t flags[] = {
        {"workload", KVF_FLAG_STRING, &o->workload, "multiturn", "this workload", NULL},
        {"model", KVF_FLAG_STRING, &o->model, "DIR", "model directory (required)", NULL},
        {"router", KVF_FLAG_STRING, &o->router, "URL",
         "client URL of a running cluster: one run on it, as it is routed (else a cluster is "
         "started per route)",
         NULL},
        {"conversations", KVF_FLAG_INT, &o->conversations, "N", "conversations", NULL},
        {"turns", KVF_FLAG_INT, &o->turns, "T",
         "turns per conversation (clamped to the model's context)", NULL},
        {"system-tokens", KVF_FLAG_INT, &o->system_tokens, "N",
         "the system prompt every conversation starts with", NULL},
        {"user-tokens", KVF_FLAG_STRING, &o->user_len, "N|A:B", "each turn's new user message",
         NULL},
        {"output-tokens", KVF_FLAG_STRING, &o->output_len, "N|A:B",
         "each answer (exact: ignore_eos)", NULL},
        {"rate", KVF_FLAG_DOUBLE, &o->rate, "R", "conversations started per second (Poisson)",
         NULL},
        {"think-ms", KVF_FLAG_DOUBLE, &o->think_ms, "MS",
         "mean think time (exponential) between an answer and the next turn", NULL},
        {"seed", KVF_FLAG_UINT64, &o->seed, "S", "trace seed", NULL},
        {"routes", KVF_FLAG_STRING, &o->routes, "R[,R...]",
         "router policies to run: random, load, kv ('default': pass no --route)", NULL},
        {"local", KVF_FLAG_BOOL, &o->local, NULL,
         "also run kv+local: kv with decode nodes --prefill-local (--no-local: not)", NULL},
        {"local-prefill-max-tokens", KVF_FLAG_STRING, &o->local_max, "N|auto",
         "kv+local's router --local-prefill-max-tokens", NULL},
        {"short-tokens", KVF_FLAG_INT, &o->short_tokens, "N",
         "a follow-up is short when at most N of its tokens are in no earlier prompt "
         "(default: --local-prefill-max-tokens, or 256 with auto)",
         NULL},
        {"prefill-weight", KVF_FLAG_STRING, &o->prefill_weight, "F", "router cost weight", NULL},
        {"decode-weight", KVF_FLAG_STRING, &o->decode_weight, "F", "router cost weight", NULL},
        {"transfer-weight", KVF_FLAG_STRING, &o->transfer_weight, "F", "router cost weight", NULL},
        {"prefill-nodes", KVF_FLAG_INT, &o->prefill_nodes, "P", "prefill nodes started", NULL},
        {"decode-nodes", KVF_FLAG_INT, &o->decode_nodes, "D", "decode nodes started", NULL},
        {"threads", KVF_FLAG_INT, &o->threads, "N", "threads per started node", NULL},
        {"kv-mem", KVF_FLAG_STRING, &o->kv_mem, "BYTES", "KV pool of started decode nodes", NULL},
        {"prefill-kv-mem", KVF_FLAG_STRING, &o->prefill_kv_mem, "BYTES",
         "KV pool of started prefill nodes (default: theirs)", NULL},
        {"kv-host-mem", KVF_FLAG_STRING, &o->kv_host_mem, "BYTES",
         "started prefill nodes' host RAM KV tier (docs/kv-tiers.md)", NULL},
        {"kv-disk", KVF_FLAG_STRING, &o->kv_disk, "DIR",
         "started prefill nodes' disk KV tier, a directory per node under DIR", NULL},
        {"kv-disk-size", KVF_FLAG_STRING, &o->kv_disk_size, "BYTES",
         "the size of each node's disk tier file", NULL},
        {"run-dir", KVF_FLAG_STRING, &o->run_dir, "DIR", "logs of started processes", NULL},
        {"timeout", KVF_FLAG_INT, &o->timeout_s, "S", "longest run per route", NULL},
        {"slo-ttft", KVF_FLAG_DOUBLE, &o->slo_ttft, "MS", "TTFT SLO for goodput", NULL},
        {"slo-tpot", KVF_FLAG_DOUBLE, &o->slo_tpot, "MS", "time-per-output-token SLO", NULL},
        {"json", KVF_FLAG_STRING, &o->json, "FILE", "write the results as JSON", NULL},
        {"plot", KVF_FLAG_STRING, &o->plot, "FILE.png", "bar charts per route (gnuplot)", NULL},
        KVF_AUTH_FLAG_ENTRY(&o->cluster_key_file),
    };
    kvf_flagset_t set = {
        .prog = argv[0],
        .usage = "--workload multiturn --model DIR [options]",
        .summary =
            "Multiturn serving benchmark: conversations sharing a system prompt, each turn "
            "resending the\nconversation so far (greedy answers of exact length), Poisson "
            "conversation arrivals, from a\nfixed seed. Each route runs on a freshly started "
            "cluster (cold caches); the report gives TTFT,\nprefill tokens computed, KV bytes "
            "shipped, prefix hit rate against the ideal and goodput per\nroute, and the "
            "targets of kv against random and of kv+local against kv.",
        .flags = flags,
        .n_flags = KVF_NFLAGS(flags),
    };
    int rc = kvf_flags_parse(&set, argc, argv);
    if (rc != KVF_FLAGS_RUN)
        return rc == KVF_FLAGS_EXIT ? 0 : 2;
    return -1;
}

/* --routes, then kv+local: the runs' names. False on an unknown route or
 * too many. */
static bool parse_routes(mt_opts_t *o)
{
    if (o->router) {
        snprintf(o->names[o->n_runs++], sizeof(o->names[0]), "router");
        return true;
    }
    char list[256];
    snprintf(list, sizeof(list), "%s", o->routes);
    bool have_local = false;
    for (char *save = NULL, *r = strtok_r(list, ",", &save); r; r = strtok_r(NULL, ",", &save)) {
        static const char *known[] = {"random", "load", "kv", "kv+local", "default"};
        bool ok = false;
        for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
            ok |= !strcmp(r, known[i]);
        if (!ok || o->n_runs == MT_MAX_RUNS - 1)
            return false;
        have_local |= !strcmp(r, "kv+local");
        snprintf(o->names[o->n_runs++], sizeof(o->names[0]), "%s", r);
    }
    if (o->local && !have_local)
        snprintf(o->names[o->n_runs++], sizeof(o->names[0]), "kv+local");
    return o->n_runs > 0;
}

/* The model's context bounds the turns: clamp them and say so. Returns
 * false when not even one turn fits. */
static bool clamp_turns(const char *prog, mt_opts_t *o)
{
    uint32_t fit = kvf_multiturn_turns_fitting(&o->spec, o->cfg.max_pos);
    if (fit == o->spec.turns)
        return true;
    if (fit == 0) {
        fprintf(stderr,
                "%s: a system prompt of %u plus one turn of %u user and %u answer tokens "
                "does not fit the model's context (%d)\n",
                prog, o->spec.system_tokens, o->spec.user.hi, o->spec.output.hi, o->cfg.max_pos);
        return false;
    }
    fprintf(stderr,
            "%s: --turns clamped from %u to %u: %u system tokens + turns x (%u user + %u "
            "answer) must stay below the model's context (%d)\n",
            prog, o->spec.turns, fit, o->spec.system_tokens, o->spec.user.hi, o->spec.output.hi,
            o->cfg.max_pos);
    o->spec.turns = fit;
    return true;
}

/* Returns -1 when the options make a run, else the exit code after a line
 * on stderr. */
static int check_opts(const char *prog, mt_opts_t *o)
{
    o->spec = (kvf_multiturn_spec_t){.seed = o->seed,
                                     .conversations = (uint32_t)o->conversations,
                                     .turns = (uint32_t)o->turns,
                                     .system_tokens = (uint32_t)o->system_tokens};
    if (!o->model || strcmp(o->workload, "multiturn") != 0 ||
        !kvf_len_dist_parse(o->user_len, &o->spec.user) ||
        !kvf_len_dist_parse(o->output_len, &o->spec.output) || o->conversations < 1 ||
        o->conversations > MT_MAX_CONVERSATIONS || o->turns < 1 || o->turns > MT_MAX_TURNS ||
        o->system_tokens < 1 || !(o->rate > 0) || !(o->think_ms >= 0) || o->threads < 1 ||
        o->prefill_nodes < 1 || o->decode_nodes < 1 || o->timeout_s < 1) {
        fprintf(stderr,
                "%s: --model is required; lengths are N or A:B; counts, the rate and the "
                "threads are positive; at most %d turns (see --help)\n",
                prog, MT_MAX_TURNS);
        return 2;
    }
    if (!parse_routes(o)) {
        fprintf(stderr, "%s: bad --routes '%s' (random, load, kv, kv+local, default; at most %d)\n",
                prog, o->routes, MT_MAX_RUNS - 1);
        return 2;
    }
    char *end;
    long local_max = strtol(o->local_max, &end, 10);
    bool numeric = end != o->local_max && *end == '\0' && local_max >= 0;
    if (!numeric && strcmp(o->local_max, "auto") != 0) {
        fprintf(stderr, "%s: --local-prefill-max-tokens is N >= 0 or auto\n", prog);
        return 2;
    }
    int short_tokens = o->short_tokens >= 0       ? o->short_tokens
                       : numeric && local_max > 0 ? (int)local_max
                                                  : 256;
    o->run = (kvf_multiturn_run_opts_t){.rate = o->rate,
                                        .think_ms = o->think_ms,
                                        .slo_ttft_ms = o->slo_ttft,
                                        .slo_tpot_ms = o->slo_tpot,
                                        .short_tokens = (uint32_t)short_tokens,
                                        .timeout_s = o->timeout_s};
    if (kvf_model_config_load(o->model, &o->cfg) != KVF_OK)
        return 1;
    return clamp_turns(prog, o) ? -1 : 2;
}

/* The router's argv for run name: its policy, conditional disaggregation
 * for kv+local, and the cost weights given. */
static void router_args(const mt_opts_t *o, const char *name, kvf_serve_cluster_t *c)
{
    bool local = !strcmp(name, "kv+local");
    if (strcmp(name, "default") != 0) {
        c->router_args[c->n_router_args++] = "--route";
        c->router_args[c->n_router_args++] = local ? "kv" : name;
    }
    if (local) {
        c->router_args[c->n_router_args++] = "--local-prefill-max-tokens";
        c->router_args[c->n_router_args++] = o->local_max;
    }
    const char *weights[][2] = {{"--prefill-weight", o->prefill_weight},
                                {"--decode-weight", o->decode_weight},
                                {"--transfer-weight", o->transfer_weight}};
    for (size_t i = 0; i < sizeof(weights) / sizeof(weights[0]); i++) {
        if (weights[i][1]) {
            c->router_args[c->n_router_args++] = weights[i][0];
            c->router_args[c->n_router_args++] = weights[i][1];
        }
    }
}

/* One run: a fresh cluster (unless --router), the trace, the cluster
 * stopped. Returns 1 when the launch or the run failed. */
static int run_one(const mt_opts_t *o, const char *bin_dir, const kvf_multiturn_trace_t *t,
                   const char *name, volatile sig_atomic_t *stop, kvf_multiturn_result_t *res)
{
    memset(res, 0, sizeof(*res));
    res->ttft_p50 = res->ttft_p99 = res->short_ttft_p50 = NAN; /* until a run measures them */
    res->n_requests = (size_t)t->n_conv * t->n_turns; /* none sent when the launch fails */
    snprintf(res->route, sizeof(res->route), "%s", name);
    if (o->router) {
        fprintf(stderr, "bench serve: multiturn on %s as it is routed (its caches may be warm)\n",
                o->router);
        return kvf_multiturn_run(o->router, t, &o->run, stop, res);
    }
    char log_name[16];
    snprintf(log_name, sizeof(log_name), "%s", name);
    for (char *p = log_name; *p; p++)
        *p = *p == '+' ? '-' : *p;
    kvf_serve_cluster_t c = {.name = log_name,
                             .prefill_nodes = o->prefill_nodes,
                             .decode_nodes = o->decode_nodes,
                             .prefill_threads = o->threads,
                             .decode_threads = o->threads,
                             .kv_mem = o->kv_mem,
                             .decode_prefill_local = !strcmp(name, "kv+local"),
                             .prefill_kv_mem = o->prefill_kv_mem,
                             .prefill_kv_host_mem = o->kv_host_mem,
                             .prefill_kv_disk = o->kv_disk,
                             .prefill_kv_disk_size = o->kv_disk_size};
    router_args(o, name, &c);
    kvf_serve_launch_t l;
    if (!kvf_serve_launch_cluster(&l, bin_dir, o->model, &c, o->run_dir))
        return 1;
    fprintf(stderr, "bench serve: multiturn, route %s, %u conversations x %u turns\n", name,
            t->n_conv, t->n_turns);
    int rc = kvf_multiturn_run(l.client_url, t, &o->run, stop, res);
    kvf_serve_launch_stop(&l);
    return rc;
}

int kvf_bench_serve_multiturn(int argc, char **argv)
{
    mt_opts_t o;
    int rc = parse_flags(argc, argv, &o);
    if (rc < 0)
        rc = check_opts(argv[0], &o);
    if (rc >= 0)
        return rc;
    char bin_dir[512];
    if (!kvf_serve_setup(o.cluster_key_file, bin_dir, sizeof(bin_dir)))
        return 1;
    kvf_multiturn_trace_t trace;
    if (kvf_multiturn_trace_init(&trace, &o.spec, &o.cfg) != KVF_OK) {
        fprintf(stderr, "%s: out of memory for the trace\n", argv[0]);
        kvf_multiturn_trace_fini(&trace);
        return 1;
    }
    /* The clusters it starts share this host: shared memory, one-sided,
     * so prefill nodes can pull the decode nodes' cached prefix blocks
     * (docs/prefix-cache.md; a two-sided connection refuses reads). A
     * UCX_TLS of the caller's is kept. */
    if (!o.router)
        setenv("UCX_TLS", "sm,self", 0);
    volatile sig_atomic_t *stop = kvf_serve_catch_stop();
    kvf_multiturn_result_t results[MT_MAX_RUNS];
    int n_done = 0, failed = 0;
    for (int i = 0; i < o.n_runs && !*stop; i++, n_done++)
        failed |= run_one(&o, bin_dir, &trace, o.names[i], stop, &results[i]);
    kvf_multiturn_setup_t setup = {.spec = &o.spec,
                                   .run = &o.run,
                                   .user_len = o.user_len,
                                   .output_len = o.output_len,
                                   .prefill_nodes = o.prefill_nodes,
                                   .decode_nodes = o.decode_nodes,
                                   .threads = o.threads};
    kvf_multiturn_report_print(&setup, results, n_done);
    if (o.json)
        failed |= kvf_multiturn_report_json(&setup, results, n_done, o.json);
    if (o.plot)
        kvf_multiturn_report_plot(results, n_done, o.plot, o.run_dir);
    kvf_multiturn_trace_fini(&trace);
    return failed;
}
