/* kvf bench sim-check: the simulator against this machine. The rates
 * are fractions (--load) of the split cluster's capacity, measured first
 * (kvf bench serve with every request of the trace in flight at once),
 * so that they load a fast CPU and a slow one alike (or --rate, in
 * requests/s). For each rate, --repeats times: it measures the profile
 * of a node (kvf simulate --profile measure: one node's threads for the
 * split cluster's nodes, twice that for the colocated node), runs kvf
 * bench serve --compare-colocated on the model at that rate right after,
 * and simulates the same trace (kvf bench serve's generator,
 * bench/serve_trace.c) on 1 prefill + 1 decode and on 1 colocated node
 * with those profiles. It prints predicted against measured (each the
 * median over the repeats, beside the measured runs' spread) for every
 * percentile of TTFT, TPOT and e2e at every rate, and each rate's winner
 * by goodput (docs/simulator.md, "Calibration"). Exit 0 when every p50 is
 * within 20%, every p99 within 30% and the winner agrees at every rate;
 * else 1. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "kvf/backend_flags.h"
#include "kvf/file.h"
#include "kvf/flags.h"
#include "bench_util.h"
#include "sim_measure.h"

#define CHECK_MAX_RATES 8
#define CHECK_MAX_REPEATS 9
#define CHECK_P50_TOL   0.20
#define CHECK_P99_TOL   0.30

typedef struct {
    const char *model, *rates, *loads, *prompt_len, *output_len;
    int requests, threads, repeats, rounds;
    uint64_t seed;
    double slo_ttft, slo_tpot;
    double rate[CHECK_MAX_RATES], load[CHECK_MAX_RATES]; /* req/s; --load's fractions */
    int n_rates;
    kvf_len_dist_t pl, ol;
} check_opts_t;

/* One run's percentiles (ms) and goodput. */
typedef struct {
    double v[3][3]; /* TTFT, TPOT, e2e x p50, p90, p99 */
    double goodput;
} check_row_t;

static int parse(int argc, char **argv, check_opts_t *o)
{
    *o = (check_opts_t){.loads = NULL,
                        .prompt_len = "128:512",
                        .output_len = "32:128",
                        .requests = 16,
                        .threads = 1,
                        .repeats = 5,
                        .rounds = 1,
                        .seed = 1,
                        .slo_ttft = 2000,
                        .slo_tpot = 200};
    const kvf_flag_t flags[] = {
        {"model", KVF_FLAG_STRING, &o->model, "DIR", "the model both run (kvf mkmodel's)", NULL},
        {"load", KVF_FLAG_STRING, &o->loads, "F[,F...]",
         "Poisson rates as fractions of the split cluster's capacity (measured first: "
         "every request in flight at once; default 0.3,0.6)",
         NULL},
        {"rate", KVF_FLAG_STRING, &o->rates, "R[,R...]", "or Poisson rates in req/s", NULL},
        {"requests", KVF_FLAG_INT, &o->requests, "N", "requests per rate", NULL},
        {"threads", KVF_FLAG_INT, &o->threads, "N", "threads per split node (colocated: 2N)", NULL},
        {"repeats", KVF_FLAG_INT, &o->repeats, "N",
         "kvf bench serve runs per rate; measured = their median", NULL},
        {"profile-rounds", KVF_FLAG_INT, &o->rounds, "N",
         "rounds of the engine and transfer benchmarks in each profile, measured before "
         "each kvf bench serve run (its median)",
         NULL},
        {"prompt-len", KVF_FLAG_STRING, &o->prompt_len, "N|A:B", "prompt tokens", NULL},
        {"output-len", KVF_FLAG_STRING, &o->output_len, "N|A:B", "output tokens", NULL},
        {"seed", KVF_FLAG_UINT64, &o->seed, "S", "the trace's seed", NULL},
        {"slo-ttft", KVF_FLAG_DOUBLE, &o->slo_ttft, "MS", "goodput's TTFT bound", NULL},
        {"slo-tpot", KVF_FLAG_DOUBLE, &o->slo_tpot, "MS", "goodput's TPOT bound", NULL},
    };
    kvf_flagset_t set = {.prog = argv[0],
                         .usage = "--model DIR [--load 0.3,0.6 | --rate R[,R...]] "
                                  "[--requests 16] [--repeats 5] [--profile-rounds 1]",
                         .summary = "Predicted (kvf simulate on this machine's measured "
                                    "profile) against measured (kvf bench serve "
                                    "--compare-colocated): every percentile, every rate, the "
                                    "winner. Exit 1 when p50 is off by more than 20%, p99 by "
                                    "more than 30%, or a winner differs.",
                         .flags = flags,
                         .n_flags = KVF_NFLAGS(flags)};
    int rc = kvf_flags_parse(&set, argc, argv);
    if (rc == KVF_FLAGS_EXIT)
        return 0;
    if (rc < 0)
        return 2;
    if (o->rates && o->loads) {
        fprintf(stderr, "%s: --load and --rate are two ways to set the rates: give one\n", argv[0]);
        return 2;
    }
    bool by_load = !o->rates;
    o->n_rates = kvf_bench_parse_levels(by_load ? (o->loads ? o->loads : "0.3,0.6") : o->rates,
                                        false, by_load ? o->load : o->rate, CHECK_MAX_RATES);
    bool list_ok = o->n_rates > 0;
    if (!o->model || !list_ok || o->requests < 1 || o->threads < 1 || o->repeats < 1 ||
        o->repeats > CHECK_MAX_REPEATS || o->rounds < 1 || o->rounds > KVF_SIM_MEASURE_ROUNDS_MAX ||
        !kvf_len_dist_parse(o->prompt_len, &o->pl) || !kvf_len_dist_parse(o->output_len, &o->ol)) {
        fprintf(stderr,
                "%s: needs --model DIR, --load F[,F...] or --rate R[,R...] (at most %d, > 0), "
                "--requests N >= 1, --repeats 1..%d, --profile-rounds 1..%d, lengths as N "
                "or A:B\n",
                argv[0], CHECK_MAX_RATES, CHECK_MAX_REPEATS, KVF_SIM_MEASURE_ROUNDS_MAX);
        return 2;
    }
    return -1;
}

/* ---- measured ------------------------------------------------------------------- */

/* kvf bench serve's JSON result of config (its one rate) into row. */
static bool serve_row(const cJSON *root, const char *config, check_row_t *row)
{
    static const char *const keys[3] = {"ttft_ms", "tpot_ms", "e2e_ms"};
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, config);
    if (cJSON_GetArraySize(arr) != 1)
        return false;
    const cJSON *r = cJSON_GetArrayItem(arr, 0);
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(r, "goodput");
    if (!cJSON_IsNumber(g))
        return false;
    row->goodput = g->valuedouble;
    for (int m = 0; m < 3; m++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(r, keys[m]);
        if (cJSON_GetArraySize(v) != 3)
            return false;
        for (int k = 0; k < 3; k++)
            row->v[m][k] = cJSON_GetArrayItem(v, k)->valuedouble;
    }
    return true;
}

/* Runs kvf bench serve on the trace (its table on our stdout): level_flag
 * "--rate" or "--concurrency" at level, --compare-colocated when both.
 * *root_p: its JSON result (cJSON_Delete it); *load_p (may be NULL): the
 * host's other load during the run. Returns -1 or the exit code. */
static int run_serve(const char *prog, const check_opts_t *o, const char *level_flag,
                     const char *level, bool both, cJSON **root_p, double *load_p)
{
    *root_p = NULL;
    char dir[] = "/tmp/kvf-sim-check-XXXXXX";
    if (!mkdtemp(dir)) {
        fprintf(stderr, "%s: cannot make a temporary directory: %m\n", prog);
        return 1;
    }
    char json[512], n[16], th[16], seed[32], st[32], sp[32];
    snprintf(json, sizeof(json), "%s/serve.json", dir);
    snprintf(n, sizeof(n), "%d", o->requests);
    snprintf(th, sizeof(th), "%d", o->threads);
    snprintf(seed, sizeof(seed), "%llu", (unsigned long long)o->seed);
    snprintf(st, sizeof(st), "%g", o->slo_ttft);
    snprintf(sp, sizeof(sp), "%g", o->slo_tpot);
    char *argv[] = {"kvf",
                    "bench",
                    "serve",
                    "--model",
                    (char *)o->model,
                    (char *)level_flag,
                    (char *)level,
                    "--requests",
                    n,
                    "--threads",
                    th,
                    "--prompt-len",
                    (char *)o->prompt_len,
                    "--output-len",
                    (char *)o->output_len,
                    "--seed",
                    seed,
                    "--slo-ttft",
                    st,
                    "--slo-tpot",
                    sp,
                    "--json",
                    json,
                    both ? "--compare-colocated" : NULL,
                    NULL};
    /* the host's other load during the run: the CPU time its processes
     * used less the run's own (kvf bench serve and the clusters it
     * started), over the run's wall time */
    double cpus, before = 0, after = 0, own = 0, wall = 0;
    bool probed = kvf_sim_host_cpu(&before, &cpus);
    int rc = kvf_sim_run_kvf(prog, argv, NULL, &own, &wall) ? -1 : 1;
    probed = probed && kvf_sim_host_cpu(&after, &cpus) && wall > 0;
    double others = probed ? (after - before - own) / wall : 0;
    if (load_p)
        *load_p = others > 0 ? others : 0;
    if (!probed && load_p)
        fprintf(stderr, "%s: cannot read this host's CPU time: its other load taken as none\n",
                prog);
    char *text = NULL;
    size_t len;
    if (rc < 0 && kvf_file_read(json, 1u << 20, &text, &len) != KVF_OK)
        rc = 1;
    *root_p = text ? cJSON_ParseWithLength(text, len) : NULL;
    if (rc < 0 && !*root_p) {
        fprintf(stderr, "%s: kvf bench serve's JSON (%s) cannot be read\n", prog, json);
        rc = 1;
    }
    free(text);
    unlink(json);
    rmdir(dir);
    return rc;
}

/* Runs kvf bench serve --compare-colocated at one rate and reads both
 * configurations' rows. One run a rate: within a run the rates share a
 * cluster, and the later ones find the same prompts in its prefix
 * caches, which a fresh simulation does not. Returns -1 or the exit
 * code. */
static int measure_serve(const char *prog, const check_opts_t *o, double rate, check_row_t *split,
                         check_row_t *colo, double *load_p)
{
    char r[32];
    snprintf(r, sizeof(r), "%g", rate);
    cJSON *root;
    int rc = run_serve(prog, o, "--rate", r, true, &root, load_p);
    if (rc < 0 && (!serve_row(root, "split", split) || !serve_row(root, "colocated", colo))) {
        fprintf(stderr, "%s: kvf bench serve's JSON lacks a configuration's row\n", prog);
        rc = 1;
    }
    cJSON_Delete(root);
    return rc;
}

/* The split cluster's capacity on the trace, measured: kvf bench serve
 * with every request in flight at once (--concurrency = --requests), the
 * requests it completed over its wall time, in req/s. Returns -1 or the
 * exit code. */
static int measure_capacity(const char *prog, const check_opts_t *o, double *cap_p)
{
    char c[16];
    snprintf(c, sizeof(c), "%d", o->requests);
    cJSON *root;
    int rc = run_serve(prog, o, "--concurrency", c, false, &root, NULL);
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, "split");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(arr, 0), "req_per_s");
    if (rc < 0 && (cJSON_GetArraySize(arr) != 1 || !cJSON_IsNumber(v) || !(v->valuedouble > 0))) {
        fprintf(stderr, "%s: kvf bench serve's JSON lacks the split cluster's req/s\n", prog);
        rc = 1;
    }
    if (rc < 0)
        *cap_p = v->valuedouble;
    cJSON_Delete(root);
    return rc;
}

/* rows[0..n)'s median, number by number, into out. */
static void median_row(const check_row_t *rows, int n, check_row_t *out)
{
    double v[CHECK_MAX_REPEATS];
    for (int m = 0; m < 3; m++)
        for (int k = 0; k < 3; k++) {
            for (int i = 0; i < n; i++)
                v[i] = rows[i].v[m][k];
            out->v[m][k] = kvf_bench_median(v, (size_t)n);
        }
    for (int i = 0; i < n; i++)
        v[i] = rows[i].goodput;
    out->goodput = kvf_bench_median(v, (size_t)n);
}

/* rows[0..n)'s least and greatest, number by number. */
static void range_rows(const check_row_t *rows, int n, check_row_t *lo, check_row_t *hi)
{
    *lo = *hi = rows[0];
    for (int i = 1; i < n; i++) {
        for (int m = 0; m < 3; m++)
            for (int k = 0; k < 3; k++) {
                lo->v[m][k] = fmin(lo->v[m][k], rows[i].v[m][k]);
                hi->v[m][k] = fmax(hi->v[m][k], rows[i].v[m][k]);
            }
        lo->goodput = fmin(lo->goodput, rows[i].goodput);
        hi->goodput = fmax(hi->goodput, rows[i].goodput);
    }
}

/* ---- predicted ------------------------------------------------------------------ */

/* The serve trace (the same requests kvf bench serve sends) as a
 * workload at rate. */
static kvf_status_t trace_workload(const check_opts_t *o, const kvf_model_config_t *cfg,
                                   double rate, kvf_sim_workload_t *w)
{
    kvf_serve_trace_t t;
    kvf_status_t st = kvf_serve_trace_init(&t, (size_t)o->requests, o->seed, &o->pl, &o->ol, cfg);
    if (st == KVF_OK) {
        kvf_serve_trace_schedule(&t, rate);
        w->n = t.n;
        w->reqs = calloc(t.n, sizeof(*w->reqs));
        st = w->reqs ? KVF_OK : KVF_ERR_NOMEM;
        for (size_t i = 0; st == KVF_OK && i < t.n; i++)
            w->reqs[i] = (kvf_sim_req_t){.at_s = t.reqs[i].at_s,
                                         .n_prompt = t.reqs[i].n_prompt,
                                         .n_output = t.reqs[i].max_tokens,
                                         .prefix_id = -1};
    }
    kvf_serve_trace_fini(&t);
    return st;
}

static kvf_status_t predict(const kvf_sim_config_t *cfg, const kvf_sim_workload_t *w,
                            check_row_t *row)
{
    kvf_sim_result_t r;
    char err[512];
    kvf_status_t st = kvf_sim_run(cfg, w, &r, err, sizeof(err));
    if (st != KVF_OK) {
        fprintf(stderr, "kvf bench sim-check: %s\n", err);
        return st;
    }
    for (int k = 0; k < 3; k++) {
        row->v[0][k] = r.ttft[k];
        row->v[1][k] = r.tpot[k];
        row->v[2][k] = r.e2e[k];
    }
    row->goodput = r.goodput;
    kvf_sim_result_fini(&r);
    return KVF_OK;
}

/* One rate: --repeats times, both nodes' profiles measured (kvf simulate
 * --profile measure, --profile-rounds rounds) and kvf bench serve run
 * right after them, the run simulated on those profiles with the run's
 * other load. The host's speed moves for seconds at a time (measured: the
 * same 512-token forward at 27.6 ms, then 43.9 ms minutes later), so a
 * run is predicted from the profile measured beside it, not one measured
 * minutes before.
 * Predicted and measured: the medians over the repeats, number by number;
 * range: the measured runs' least and greatest ([split, colocated][min,
 * max]), how far the runs themselves spread. Returns -1 or the exit
 * code. */
static int measure_rate(const char *prog, const check_opts_t *o, double rate,
                        const kvf_sim_config_t *split_base, const kvf_sim_config_t *colo_base,
                        check_row_t out[2][2], check_row_t range[2][2], double *load_p)
{
    check_row_t rows[2][2][CHECK_MAX_REPEATS]; /* [predicted, measured][split, colocated] */
    double load = 0;
    kvf_sim_workload_t w = {0};
    kvf_model_config_t mcfg = split_base->model_cfg;
    if (trace_workload(o, &mcfg, rate, &w) != KVF_OK) {
        fprintf(stderr, "%s: cannot build the trace\n", prog);
        return 1;
    }
    int rc = -1;
    for (int i = 0; rc < 0 && i < o->repeats; i++) {
        kvf_sim_config_t sc = *split_base, cc = *colo_base;
        rc =
            kvf_sim_measure_profile(prog, o->model, o->threads, o->rounds, true, &sc.model, &sc.hw);
        if (rc < 0)
            rc = kvf_sim_measure_profile(prog, o->model, 2 * o->threads, o->rounds, true, &cc.model,
                                         &cc.hw);
        if (rc >= 0)
            break;
        printf("rate %g, run %d of %d:\n", rate, i + 1, o->repeats);
        kvf_sim_describe_profile(stdout, "  split node", &sc.hw);
        kvf_sim_describe_profile(stdout, "  colocated node", &cc.hw);
        fflush(stdout); /* before the run's table, which its child writes */
        double l;
        rc = measure_serve(prog, o, rate, &rows[1][0][i], &rows[1][1][i], &l);
        if (rc >= 0)
            break;
        load += l / o->repeats;
        sc.hw.host_load = cc.hw.host_load = l; /* the run's */
        if (predict(&sc, &w, &rows[0][0][i]) != KVF_OK ||
            predict(&cc, &w, &rows[0][1][i]) != KVF_OK)
            rc = 1;
    }
    kvf_sim_workload_fini(&w);
    if (rc >= 0)
        return rc;
    for (int k = 0; k < 2; k++)
        for (int c = 0; c < 2; c++)
            median_row(rows[k][c], o->repeats, &out[k][c]);
    for (int c = 0; c < 2; c++)
        range_rows(rows[1][c], o->repeats, &range[c][0], &range[c][1]);
    *load_p = load;
    return -1;
}

/* Sets every rate from its load (--load) or the load from the rate
 * (--rate), against the split cluster's capacity measured now. Returns
 * -1 or the exit code. */
static int set_rates(const char *prog, check_opts_t *o)
{
    double cap = 0;
    int rc = measure_capacity(prog, o, &cap);
    if (rc >= 0)
        return rc;
    printf("split capacity %.2f req/s (every request in flight at once); rates:", cap);
    for (int i = 0; i < o->n_rates; i++) {
        if (o->rates)
            o->load[i] = o->rate[i] / cap;
        else /* to the hundredth, which kvf bench serve's --rate then gets exactly */
            o->rate[i] = fmax(0.01, round(o->load[i] * cap * 100) / 100);
        printf(" %g req/s (load %.2f)", o->rate[i], o->load[i]);
    }
    printf("\n");
    fflush(stdout);
    return -1;
}

/* ---- the comparison --------------------------------------------------------------- */

/* 0: split wins, 1: colocated: more goodput, among equals (within 1%)
 * the lower e2e p99. */
static int winner(const check_row_t *split, const check_row_t *colo)
{
    double g = fmax(split->goodput, colo->goodput);
    if (fabs(split->goodput - colo->goodput) > 0.01 * g)
        return split->goodput > colo->goodput ? 0 : 1;
    return split->v[2][2] <= colo->v[2][2] ? 0 : 1;
}

/* Prints one configuration's rows at one rate; false when an error is
 * out of its bound. */
static bool compare_rows(const char *config, double rate, const check_row_t *pred,
                         const check_row_t *meas, const check_row_t *lo, const check_row_t *hi)
{
    static const char *const metric[3] = {"TTFT", "TPOT", "e2e"};
    static const char *const pct[3] = {"p50", "p90", "p99"};
    bool ok = true;
    for (int m = 0; m < 3; m++)
        for (int k = 0; k < 3; k++) {
            double p = pred->v[m][k], x = meas->v[m][k];
            double err = x > 0 ? p / x - 1 : NAN;
            double tol = k == 0 ? CHECK_P50_TOL : k == 2 ? CHECK_P99_TOL : INFINITY;
            bool in = isfinite(err) ? fabs(err) <= tol : false;
            if (k != 1)
                ok = ok && in;
            double dlo = x > 0 ? lo->v[m][k] / x - 1 : NAN;
            double dhi = x > 0 ? hi->v[m][k] / x - 1 : NAN;
            printf("%-10s %6.2f %-4s %-3s %12.2f %12.2f %+9.1f%% %-3s %+6.0f%%..%+.0f%%\n", config,
                   rate, metric[m], pct[k], p, x, 100 * err,
                   k == 1 ? ""
                   : in   ? "ok"
                          : "OUT",
                   100 * dlo, 100 * dhi);
        }
    return ok;
}

/* Every rate's predicted and measured rows ([rate][predicted, measured]
 * [split, colocated]) compared; 0 when the check passes, else 1. */
static int check(const check_opts_t *o, check_row_t (*rows)[2][2], check_row_t (*range)[2][2],
                 const double *load)
{
    printf("\n%-10s %6s %-4s %-3s %12s %12s %10s %-3s %s\n", "config", "rate", "", "", "predicted",
           "measured", "error", "", "runs' spread");
    bool ok = true;
    int agree = 0;
    for (int i = 0; i < o->n_rates; i++) {
        const check_row_t *ps = &rows[i][0][0], *pc = &rows[i][0][1];
        const check_row_t *ms = &rows[i][1][0], *mc = &rows[i][1][1];
        ok &= compare_rows("split", o->rate[i], ps, ms, &range[i][0][0], &range[i][0][1]);
        ok &= compare_rows("colocated", o->rate[i], pc, mc, &range[i][1][0], &range[i][1][1]);
        int wp = winner(ps, pc), wm = winner(ms, mc);
        agree += wp == wm;
        printf("rate %.2f (load %.2f of the split capacity): winner predicted %s, measured %s "
               "(goodput %.2f / %.2f predicted, %.2f / %.2f measured); the host's other load "
               "%.2f threads\n",
               o->rate[i], o->load[i], wp ? "colocated" : "split", wm ? "colocated" : "split",
               ps->goodput, pc->goodput, ms->goodput, mc->goodput, load[i]);
    }
    ok = ok && agree == o->n_rates;
    printf("sim-check: %s (p50 within %.0f%%, p99 within %.0f%%, the same winner at %d of %d "
           "rates)\n",
           ok ? "pass" : "FAIL", 100 * CHECK_P50_TOL, 100 * CHECK_P99_TOL, agree, o->n_rates);
    return ok ? 0 : 1;
}

/* The simulated clusters, their profiles still to be measured: 1P+1D on
 * the T-thread profile, one colocated node on the 2T-thread one, as kvf
 * bench serve starts them. Returns -1 or the exit code. */
static int clusters(const char *prog, const check_opts_t *o, kvf_sim_config_t *split,
                    kvf_sim_config_t *colo)
{
    *split = (kvf_sim_config_t){0};
    kvf_sim_config_defaults(split);
    if (kvf_model_config_load(o->model, &split->model_cfg) != KVF_OK) {
        fprintf(stderr, "%s: cannot read %s/config.json\n", prog, o->model);
        return 2;
    }
    split->kv_dtype = KVF_KV_DTYPE_DEFAULT_CPU;
    split->seed = o->seed;
    split->slo_ttft_ms = o->slo_ttft;
    split->slo_tpot_ms = o->slo_tpot;
    split->n_prefill = split->n_decode = 1;
    double wbytes = (double)kvf_dtype_size(split->model_cfg.dtype);
    kvf_sim_model_init(&split->model_cfg, wbytes, split->kv_dtype, 1, &split->model);
    *colo = *split;
    colo->n_prefill = colo->n_decode = 0;
    colo->n_colocated = 1;
    return -1;
}

int kvf_cmd_bench_sim_check(int argc, char **argv)
{
    check_opts_t o;
    int rc = parse(argc, argv, &o);
    if (rc >= 0)
        return rc;
    kvf_sim_config_t split, colo;
    rc = clusters(argv[0], &o, &split, &colo);
    if (rc >= 0)
        return rc;
    if ((rc = set_rates(argv[0], &o)) >= 0)
        return rc;
    check_row_t rows[CHECK_MAX_RATES][2][2], range[CHECK_MAX_RATES][2][2];
    double load[CHECK_MAX_RATES];
    for (int i = 0; i < o.n_rates; i++)
        if ((rc = measure_rate(argv[0], &o, o.rate[i], &split, &colo, rows[i], range[i],
                               &load[i])) >= 0)
            return rc;
    return check(&o, rows, range, load);
}
