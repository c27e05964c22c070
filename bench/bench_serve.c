/* kvf bench serve: the command, its load levels and its report. The trace
 * and its client driver are serve_trace.c; the configurations it starts,
 * serve_launch.c. */
#include "bench_serve.h"
#include "bench_util.h"
#include "serve_launch.h"
#include "serve_multiturn.h"
#include "serve_trace.h"

#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvf/auth.h"
#include "kvf/flags.h"
#include "kvf/model.h"

#define SERVE_MAX_RATES 16

/* Set by the first SIGINT or SIGTERM (kvf_serve_catch_stop): send no more
 * requests, let the ones sent finish and report on them. */
static volatile sig_atomic_t *stop_requested;

/* ---- output ------------------------------------------------------------------- */

static void print_row(const char *config, const kvf_serve_result_t *r)
{
    char level[16];
    if (r->concurrency > 0)
        snprintf(level, sizeof(level), "c%d", r->concurrency);
    else
        snprintf(level, sizeof(level), "%.2f", r->rate);
    printf("%-10s %6s %7.2f %8.1f %8.3f | %8.1f %8.1f %8.1f | %7.2f %7.2f %7.2f | %8.0f %8.0f "
           "%8.0f | %3zu\n",
           config, level, r->req_per_s, r->tok_per_s, r->goodput, r->ttft[0], r->ttft[1],
           r->ttft[2], r->tpot[0], r->tpot[1], r->tpot[2], r->e2e[0], r->e2e[1], r->e2e[2],
           r->n_failed);
}

static void print_header(bool closed)
{
    printf("%-10s %6s %7s %8s %8s | %8s %8s %8s | %7s %7s %7s | %8s %8s %8s | %3s\n", "config",
           closed ? "flight" : "rate", "req/s", "tok/s", "goodput", "ttft50", "ttft90", "ttft99",
           "tpot50", "tpot90", "tpot99", "e2e50", "e2e90", "e2e99", "err");
}

static void json_result(FILE *f, const kvf_serve_result_t *r)
{
    fprintf(f,
            "{\"rate\": %g, \"concurrency\": %d, \"requests_sent\": %zu, \"requests_ok\": %zu, "
            "\"requests_failed\": %zu, \"duration_s\": %.3f, "
            "\"req_per_s\": %.4f, \"tok_per_s\": %.2f, \"goodput\": %.4f, "
            "\"ttft_ms\": [%.3f, %.3f, %.3f], \"tpot_ms\": [%.3f, %.3f, %.3f], "
            "\"e2e_ms\": [%.3f, %.3f, %.3f]}",
            r->rate, r->concurrency, r->n_sent, r->n_ok, r->n_failed, r->duration_s, r->req_per_s,
            r->tok_per_s, r->goodput, r->ttft[0], r->ttft[1], r->ttft[2], r->tpot[0], r->tpot[1],
            r->tpot[2], r->e2e[0], r->e2e[1], r->e2e[2]);
}

static void write_plot(const char *png, const kvf_serve_result_t *split,
                       const kvf_serve_result_t *colo, int n_rates, const char *run_dir)
{
    char data[512], script[512];
    snprintf(data, sizeof(data), "%s/serve-plot.dat", run_dir);
    snprintf(script, sizeof(script), "%s/serve-plot.gp", run_dir);
    FILE *f = fopen(data, "w");
    if (!f)
        return;
    for (int i = 0; i < n_rates; i++)
        fprintf(f, "%g %g %g %g %g %g %g\n",
                split[i].concurrency > 0 ? (double)split[i].concurrency : split[i].rate,
                split[i].ttft[2], split[i].tpot[2], colo ? colo[i].ttft[2] : NAN,
                colo ? colo[i].tpot[2] : NAN, split[i].goodput, colo ? colo[i].goodput : NAN);
    fclose(f);
    f = fopen(script, "w");
    if (!f)
        return;
    fprintf(f,
            "set terminal png size 1200,420\nset output '%s'\nset multiplot layout 1,3\n"
            "set xlabel '%s'\nset grid\nset key top left\n"
            "set ylabel 'TTFT p99 (ms)'\nplot '%s' u 1:2 w lp t 'split', '%s' u 1:4 w lp t "
            "'colocated'\n"
            "set ylabel 'time per output token p99 (ms)'\nplot '%s' u 1:3 w lp t 'split', '%s' "
            "u 1:5 w lp t 'colocated'\n"
            "set ylabel 'goodput (req/s within SLO)'\nplot '%s' u 1:6 w lp t 'split', '%s' u "
            "1:7 w lp t 'colocated'\nunset multiplot\n",
            png,
            split[0].concurrency > 0 ? "requests in flight (closed loop)" : "request rate (req/s)",
            data, data, data, data, data, data);
    fclose(f);
    char cmd[1200];
    snprintf(cmd, sizeof(cmd), "gnuplot '%s'", script);
    if (system(cmd) != 0)
        fprintf(stderr, "bench serve: gnuplot failed (is it installed?); data in %s\n", data);
    else
        printf("plot written to %s\n", png);
}

/* ---- the command ------------------------------------------------------------ */

typedef struct {
    const char *router, *model, *rates_text, *conc_text, *prompt_len, *output_len, *json, *plot,
        *kv_mem, *run_dir, *cluster_key_file, *workload;
    int n_requests, threads, timeout_s;
    uint64_t seed;
    double slo_ttft, slo_tpot;
    bool compare;
    /* from the above */
    kvf_len_dist_t pl, ol;
    kvf_model_config_t cfg;
    bool closed; /* --concurrency: levels are requests in flight, not rates */
    double levels[SERVE_MAX_RATES];
    int n_levels;
} serve_opts_t;

/* Returns -1 to run, else the exit code (help printed, or a bad flag). */
static int parse_serve_flags(int argc, char **argv, serve_opts_t *o)
{
    *o = (serve_opts_t){.workload = "single",
                        .prompt_len = "128:512",
                        .output_len = "32:128",
                        .kv_mem = "1G",
                        .run_dir = "/tmp/kvf-bench-serve",
                        .n_requests = 32,
                        .threads = 1,
                        .timeout_s = 600,
                        .seed = 1,
                        .slo_ttft = 2000,
                        .slo_tpot = 200};
    kvf_flag_t flags[] = {
        {"workload", KVF_FLAG_STRING, &o->workload, "single|multiturn",
         "single: independent requests (this command); multiturn: conversations whose turns "
         "resend the conversation so far (--workload multiturn --help)",
         NULL},
        {"router", KVF_FLAG_STRING, &o->router, "URL",
         "router client URL of a running cluster (else one is started)", NULL},
        {"model", KVF_FLAG_STRING, &o->model, "DIR", "model directory (required)", NULL},
        {"rate", KVF_FLAG_STRING, &o->rates_text, "R[,R...]",
         "request rates (req/s) to run, Poisson arrivals (default: 1)", NULL},
        {"concurrency", KVF_FLAG_STRING, &o->conc_text, "C[,C...]",
         "closed loop instead of --rate: C requests in flight, the next sent as one finishes "
         "(the capacity at C)",
         NULL},
        {"requests", KVF_FLAG_INT, &o->n_requests, "N", "requests per rate", NULL},
        {"prompt-len", KVF_FLAG_STRING, &o->prompt_len, "N|A:B", "prompt lengths (tokens)", NULL},
        {"output-len", KVF_FLAG_STRING, &o->output_len, "N|A:B", "output lengths (tokens)", NULL},
        {"seed", KVF_FLAG_UINT64, &o->seed, "S", "trace seed", NULL},
        {"slo-ttft", KVF_FLAG_DOUBLE, &o->slo_ttft, "MS", "TTFT SLO for goodput", NULL},
        {"slo-tpot", KVF_FLAG_DOUBLE, &o->slo_tpot, "MS", "time-per-output-token SLO", NULL},
        {"compare-colocated", KVF_FLAG_BOOL, &o->compare, NULL,
         "also run the trace on one kvf-decode --prefill-local with the same threads", NULL},
        {"threads", KVF_FLAG_INT, &o->threads, "N",
         "threads per node of a started split cluster (colocated: 2N)", NULL},
        {"kv-mem", KVF_FLAG_STRING, &o->kv_mem, "BYTES", "KV pool of started decode nodes", NULL},
        {"run-dir", KVF_FLAG_STRING, &o->run_dir, "DIR", "logs of started processes", NULL},
        {"timeout", KVF_FLAG_INT, &o->timeout_s, "S", "longest run per rate", NULL},
        {"json", KVF_FLAG_STRING, &o->json, "FILE", "write the results as JSON", NULL},
        {"plot", KVF_FLAG_STRING, &o->plot, "FILE.png", "latency and goodput vs rate (gnuplot)",
         NULL},
        KVF_AUTH_FLAG_ENTRY(&o->cluster_key_file),
    };
    kvf_flagset_t set = {
        .prog = argv[0],
        .usage = "--model DIR [--router URL] --rate R[,R...] --requests N [options]",
        .summary = "Serving benchmark: Poisson arrivals from a fixed seed; TTFT, time per output "
                   "token and\nend-to-end latency p50/p90/p99, throughput and goodput (requests/s "
                   "meeting both SLOs).\nWithout --router it starts a 1 prefill + 1 decode "
                   "cluster itself; --compare-colocated\nalso runs one kvf-decode "
                   "--prefill-local on the same total threads and prints both.\n"
                   "SIGINT or SIGTERM stops sending; the requests in flight finish and the "
                   "ones sent\nare reported (a second signal ends it at once).",
        .flags = flags,
        .n_flags = KVF_NFLAGS(flags),
    };
    int rc = kvf_flags_parse(&set, argc, argv);
    if (rc != KVF_FLAGS_RUN)
        return rc == KVF_FLAGS_EXIT ? 0 : 2;
    return -1;
}

/* The lengths, the model's context and the load levels. Returns -1 when
 * they make a run, else the exit code after a line on stderr. */
static int check_serve_opts(const char *prog, serve_opts_t *o)
{
    if (!o->model || !kvf_len_dist_parse(o->prompt_len, &o->pl) ||
        !kvf_len_dist_parse(o->output_len, &o->ol) || o->n_requests < 1 || o->threads < 1) {
        fprintf(stderr, "%s: --model is required; lengths are N or A:B (see --help)\n", prog);
        return 2;
    }
    if (strcmp(o->workload, "single") != 0) {
        fprintf(stderr, "%s: unknown --workload '%s' (single or multiturn)\n", prog, o->workload);
        return 2;
    }
    if (kvf_model_config_load(o->model, &o->cfg) != KVF_OK)
        return 1;
    if (o->pl.hi + o->ol.hi >= (uint32_t)o->cfg.max_pos) {
        fprintf(stderr, "%s: prompt + output lengths exceed the context (%d)\n", prog,
                o->cfg.max_pos);
        return 2;
    }
    if (o->rates_text && o->conc_text) {
        fprintf(stderr, "%s: --rate and --concurrency exclude each other\n", prog);
        return 2;
    }
    /* The load levels: Poisson rates, or closed-loop concurrencies. */
    o->closed = o->conc_text != NULL;
    const char *levels_text = o->closed ? o->conc_text : o->rates_text ? o->rates_text : "1";
    o->n_levels = kvf_bench_parse_levels(levels_text, o->closed, o->levels, SERVE_MAX_RATES);
    if (o->n_levels < 1) {
        fprintf(stderr, "%s: bad --%s '%s' (at most %d values)\n", prog,
                o->closed ? "concurrency" : "rate", levels_text, SERVE_MAX_RATES);
        return 2;
    }
    return -1;
}

/* Every load level on one configuration at url, until a signal stops it;
 * *levels_run_p: how many started. Returns 1 when a run failed. */
static int run_levels(const serve_opts_t *o, kvf_serve_trace_t *t, const char *url, bool colocated,
                      kvf_serve_result_t *results, int *levels_run_p)
{
    int failed = 0;
    for (int ri = 0; ri < o->n_levels && !*stop_requested; ri++) {
        kvf_serve_result_t *res = &results[ri];
        *levels_run_p = ri + 1;
        int concurrency = o->closed ? (int)o->levels[ri] : 0;
        res->rate = o->closed ? 0 : o->levels[ri];
        res->concurrency = concurrency;
        kvf_serve_trace_schedule(t, res->rate);
        if (o->closed)
            fprintf(stderr, "bench serve: %s, closed loop, %d in flight, %d requests\n",
                    colocated ? "colocated" : "split", concurrency, o->n_requests);
        else
            fprintf(stderr, "bench serve: %s, rate %g req/s, %d requests\n",
                    colocated ? "colocated" : "split", o->levels[ri], o->n_requests);
        if (kvf_serve_trace_run(url, t, concurrency, o->slo_ttft, o->slo_tpot, o->timeout_s,
                                stop_requested, res))
            failed = 1;
    }
    return failed;
}

/* The split configuration (--router's, or one started) and with
 * --compare-colocated the colocated one. After a signal, *n_rates_p and
 * *compare_p say which results to report. Returns 1 when a run or a
 * launch failed. */
static int run_configs(const serve_opts_t *o, const char *bin_dir, kvf_serve_trace_t *t,
                       kvf_serve_result_t *split, kvf_serve_result_t *colo, int *n_rates_p,
                       bool *compare_p)
{
    int configs = *compare_p ? 2 : 1;
    int failed = 0;
    for (int c = 0; c < configs && !*stop_requested; c++) {
        bool colocated = c == 1;
        bool started = !o->router || colocated;
        int levels_run = 0;
        kvf_serve_launch_t l;
        const char *url = o->router;
        if (started) {
            if (!kvf_serve_launch(&l, bin_dir, o->model, colocated, o->threads, o->kv_mem,
                                  o->run_dir))
                return 1;
            url = l.client_url;
        }
        failed |= run_levels(o, t, url, colocated, colocated ? colo : split, &levels_run);
        if (started)
            kvf_serve_launch_stop(&l);
        if (*stop_requested) {
            /* Report the levels that ran: in split, those it reached (and
             * no colocated run); in colocated, those both reached. */
            if (!colocated || levels_run == 0)
                *compare_p = false;
            if (!colocated || levels_run > 0)
                *n_rates_p = levels_run;
        }
    }
    return failed;
}

static void print_ratio_row(const kvf_serve_result_t *colo, const kvf_serve_result_t *split)
{
    printf("%-10s %6s %7.2f %8.2f %8.2f | %8.2f %8.2f %8.2f | %7.2f %7.2f %7.2f | %8.2f "
           "%8.2f %8.2f |\n",
           "colo/split", "", colo->req_per_s / split->req_per_s, colo->tok_per_s / split->tok_per_s,
           colo->goodput / split->goodput, colo->ttft[0] / split->ttft[0],
           colo->ttft[1] / split->ttft[1], colo->ttft[2] / split->ttft[2],
           colo->tpot[0] / split->tpot[0], colo->tpot[1] / split->tpot[1],
           colo->tpot[2] / split->tpot[2], colo->e2e[0] / split->e2e[0],
           colo->e2e[1] / split->e2e[1], colo->e2e[2] / split->e2e[2]);
}

/* The table, then where goodput peaks. */
static void print_report(const serve_opts_t *o, const kvf_serve_result_t *split,
                         const kvf_serve_result_t *colo, int n_rates, bool compare)
{
    const bool closed = o->closed;
    printf("\nserving benchmark: %d requests per %s, prompt %s, output %s tokens, seed %llu, "
           "SLO ttft %.0f ms / tpot %.0f ms\n(latencies in ms; goodput in requests/s meeting "
           "both SLOs%s)\n\n",
           o->n_requests, closed ? "concurrency" : "rate", o->prompt_len, o->output_len,
           (unsigned long long)o->seed, o->slo_ttft, o->slo_tpot,
           closed ? "; closed loop: flight = requests kept in flight" : "");
    print_header(closed);
    for (int ri = 0; ri < n_rates; ri++) {
        print_row("split", &split[ri]);
        if (compare) {
            print_row("colocated", &colo[ri]);
            print_ratio_row(&colo[ri], &split[ri]);
        }
    }
    int best_s = 0, best_c = 0;
    for (int ri = 1; ri < n_rates; ri++) {
        if (split[ri].goodput > split[best_s].goodput)
            best_s = ri;
        if (colo[ri].goodput > colo[best_c].goodput)
            best_c = ri;
    }
    if (n_rates > 0) {
        printf("\ngoodput peaks at %g %s for split (%.3f req/s)", o->levels[best_s],
               closed ? "in flight" : "req/s", split[best_s].goodput);
        if (compare)
            printf(" and at %g %s for colocated (%.3f req/s)", o->levels[best_c],
                   closed ? "in flight" : "req/s", colo[best_c].goodput);
        printf("\n");
    }
}

static void json_results(FILE *f, const char *name, const kvf_serve_result_t *r, int n)
{
    fprintf(f, ", \"%s\": [", name);
    for (int ri = 0; ri < n; ri++) {
        fprintf(f, ri ? ", " : "");
        json_result(f, &r[ri]);
    }
    fprintf(f, "]");
}

/* --json FILE: the settings and every result (nothing when it cannot be
 * opened). */
static void write_report_json(const serve_opts_t *o, const kvf_serve_result_t *split,
                              const kvf_serve_result_t *colo, int n_rates, bool compare)
{
    FILE *f = fopen(o->json, "w");
    if (!f)
        return;
    fprintf(f,
            "{\"requests\": %d, \"prompt_len\": \"%s\", \"output_len\": \"%s\", "
            "\"seed\": %llu, \"slo_ttft_ms\": %g, \"slo_tpot_ms\": %g",
            o->n_requests, o->prompt_len, o->output_len, (unsigned long long)o->seed, o->slo_ttft,
            o->slo_tpot);
    json_results(f, "split", split, n_rates);
    if (compare)
        json_results(f, "colocated", colo, n_rates);
    fprintf(f, "}\n");
    fclose(f);
}

/* The --workload argv names, "single" when none. */
static const char *workload_of(int argc, char **argv)
{
    const char *w = "single";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--workload") && i + 1 < argc)
            w = argv[++i];
        else if (!strncmp(argv[i], "--workload=", 11))
            w = argv[i] + 11;
    }
    return w;
}

int kvf_bench_serve(int argc, char **argv)
{
    if (!strcmp(workload_of(argc, argv), "multiturn"))
        return kvf_bench_serve_multiturn(argc, argv);
    serve_opts_t o;
    int rc = parse_serve_flags(argc, argv, &o);
    if (rc < 0)
        rc = check_serve_opts(argv[0], &o);
    if (rc >= 0)
        return rc;
    char bin_dir[512];
    if (!kvf_serve_setup(o.cluster_key_file, bin_dir, sizeof(bin_dir)))
        return 1;
    /* The trace: the same for every rate and configuration, but arrival
     * times scaled by the rate. */
    kvf_serve_trace_t trace;
    if (kvf_serve_trace_init(&trace, (size_t)o.n_requests, o.seed, &o.pl, &o.ol, &o.cfg) !=
        KVF_OK) {
        kvf_serve_trace_fini(&trace);
        return 1;
    }
    kvf_serve_result_t split[SERVE_MAX_RATES], colo[SERVE_MAX_RATES];
    memset(split, 0, sizeof(split));
    memset(colo, 0, sizeof(colo));
    stop_requested = kvf_serve_catch_stop();
    int n_rates = o.n_levels;
    bool compare = o.compare;
    int failed = run_configs(&o, bin_dir, &trace, split, colo, &n_rates, &compare);
    print_report(&o, split, colo, n_rates, compare);
    if (o.json)
        write_report_json(&o, split, colo, n_rates, compare);
    if (o.plot)
        write_plot(o.plot, split, compare ? colo : NULL, n_rates, o.run_dir);
    kvf_serve_trace_fini(&trace);
    return failed;
}
