/* The report of kvf bench serve --workload multiturn: the table, the
 * targets of docs/prefix-cache.md's routing (issue 18), the JSON file and
 * the plot. See serve_multiturn.h. */
#include "serve_multiturn.h"
#include "bench_util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the targets ----------------------------------------------------------- */

typedef struct {
    const char *name; /* what is compared */
    const char *runs; /* which runs: "kv/random" */
    double value;     /* the ratio measured; NAN when a run is missing */
    double bound;
    bool at_most; /* value <= bound passes, else value >= bound */
} mt_target_t;

enum { MT_N_TARGETS = 5 };

static const kvf_multiturn_result_t *find_run(const kvf_multiturn_result_t *r, int n,
                                              const char *route)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(r[i].route, route) && r[i].n_ok > 0)
            return &r[i];
    return NULL;
}

static double ratio(double a, double b)
{
    return b > 0 && isfinite(a) && isfinite(b) ? a / b : NAN;
}

/* The targets: kv against random (prefill tokens computed, KV
 * bytes shipped, TTFT p50), kv's hit rate against the ideal, and kv+local
 * against kv on the short follow-ups. */
static void compute_targets(const kvf_multiturn_result_t *r, int n, mt_target_t t[MT_N_TARGETS])
{
    const kvf_multiturn_result_t *kv = find_run(r, n, "kv"), *rnd = find_run(r, n, "random"),
                                 *local = find_run(r, n, "kv+local");
    double na = NAN;
    t[0] = (mt_target_t){
        "prefill tokens computed", "kv/random",
        kv && rnd ? ratio((double)kv->prefill_computed, (double)rnd->prefill_computed) : na, 0.3,
        true};
    /* bytes between nodes: shipped, and pulled (prefix blocks read back) */
    t[1] = (mt_target_t){"KV bytes shipped + pulled", "kv/random",
                         kv && rnd ? ratio((double)(kv->kv_bytes + kv->kv_pulled),
                                           (double)(rnd->kv_bytes + rnd->kv_pulled))
                                   : na,
                         0.3, true};
    t[2] = (mt_target_t){"TTFT p50", "kv/random",
                         kv && rnd ? ratio(kv->ttft_p50, rnd->ttft_p50) : na, 0.5, true};
    t[3] = (mt_target_t){"hit rate / ideal", "kv", kv ? ratio(kv->hit_rate, kv->ideal_rate) : na,
                         0.9, false};
    t[4] = (mt_target_t){"short follow-up TTFT p50 speed-up", "kv/kv+local",
                         kv && local ? ratio(kv->short_ttft_p50, local->short_ttft_p50) : na, 1.3,
                         false};
}

static const char *verdict(const mt_target_t *t)
{
    if (isnan(t->value))
        return "n/a";
    return (t->at_most ? t->value <= t->bound : t->value >= t->bound) ? "PASS" : "MISS";
}

/* ---- the table --------------------------------------------------------------- */

void kvf_multiturn_report_print(const kvf_multiturn_setup_t *s, const kvf_multiturn_result_t *r,
                                int n)
{
    const kvf_multiturn_spec_t *sp = s->spec;
    printf("\nmultiturn benchmark: %u conversations x %u turns, system prompt %u, user %s, "
           "answers %s tokens, seed %llu;\n%g conversations/s, think %g ms; %d prefill + %d "
           "decode nodes, %d thread(s) each, UCX_TLS %s; SLO ttft %.0f ms / tpot %.0f ms\n",
           sp->conversations, sp->turns, sp->system_tokens, s->user_len, s->output_len,
           (unsigned long long)sp->seed, s->run->rate, s->run->think_ms, s->prefill_nodes,
           s->decode_nodes, s->threads, getenv("UCX_TLS") ? getenv("UCX_TLS") : "(UCX's default)",
           s->run->slo_ttft_ms, s->run->slo_tpot_ms);
    printf("(latencies in ms; short = follow-up turns with at most %u tokens not in an earlier "
           "prompt; hit = cached / prompt tokens;\n ideal = what an infinite cache would hit "
           "(whole 16-token blocks, leaving 32 to compute); goodput in requests/s within both "
           "SLOs)\n\n",
           s->run->short_tokens);
    printf("%-9s %4s %3s | %8s %8s %8s %4s | %10s %10s %8s %6s | %6s %6s %6s | %7s | %s\n",
           "route", "ok", "err", "ttft50", "ttft99", "short50", "n", "prefill", "kv MB", "pull MB",
           "local", "hit", "ideal", "h/i", "goodput", "counters");
    for (int i = 0; i < n; i++) {
        const kvf_multiturn_result_t *x = &r[i];
        printf("%-9s %4zu %3zu | %8.1f %8.1f %8.1f %4zu | %10llu %10.2f %8.2f %6llu | %5.1f%% "
               "%5.1f%% %6.2f | %7.3f | %s\n",
               x->route, x->n_ok, x->n_failed + (x->n_requests - x->n_sent), x->ttft_p50,
               x->ttft_p99, x->short_ttft_p50, x->n_short, (unsigned long long)x->prefill_computed,
               (double)x->kv_bytes / 1e6, (double)x->kv_pulled / 1e6,
               (unsigned long long)x->local_prefills, 100 * x->hit_rate,
               100 * x->ideal_rate, ratio(x->hit_rate, x->ideal_rate), x->goodput,
               x->from_stats ? "router" : "chunks");
    }
    mt_target_t t[MT_N_TARGETS];
    compute_targets(r, n, t);
    printf("\ntargets:\n");
    for (int i = 0; i < MT_N_TARGETS; i++)
        printf("  %-36s %-12s %8.3f  (%s %.2f)  %s\n", t[i].name, t[i].runs, t[i].value,
               t[i].at_most ? "<=" : ">=", t[i].bound, verdict(&t[i]));
}

/* ---- --json ------------------------------------------------------------------ */

static cJSON *json_run(const kvf_multiturn_result_t *x)
{
    cJSON *o = cJSON_CreateObject();
    char digest[24];
    snprintf(digest, sizeof(digest), "%016llx", (unsigned long long)x->digest);
    cJSON_AddStringToObject(o, "route", x->route);
    cJSON_AddNumberToObject(o, "requests", (double)x->n_requests);
    cJSON_AddNumberToObject(o, "requests_sent", (double)x->n_sent);
    cJSON_AddNumberToObject(o, "requests_ok", (double)x->n_ok);
    cJSON_AddNumberToObject(o, "requests_failed", (double)x->n_failed);
    cJSON_AddNumberToObject(o, "duration_s", x->duration_s);
    cJSON_AddNumberToObject(o, "req_per_s", x->req_per_s);
    cJSON_AddNumberToObject(o, "goodput", x->goodput);
    cJSON_AddNumberToObject(o, "ttft_p50_ms", x->ttft_p50);
    cJSON_AddNumberToObject(o, "ttft_p99_ms", x->ttft_p99);
    cJSON_AddNumberToObject(o, "short_ttft_p50_ms", x->short_ttft_p50);
    cJSON_AddNumberToObject(o, "short_requests", (double)x->n_short);
    cJSON_AddNumberToObject(o, "prompt_tokens", (double)x->prompt_tokens);
    cJSON_AddNumberToObject(o, "cached_tokens", (double)x->cached_tokens);
    cJSON_AddNumberToObject(o, "ideal_cached_tokens", (double)x->ideal_cached);
    cJSON_AddNumberToObject(o, "prefill_tokens_computed", (double)x->prefill_computed);
    cJSON_AddNumberToObject(o, "kv_bytes_shipped", (double)x->kv_bytes);
    cJSON_AddNumberToObject(o, "kv_bytes_pulled", (double)x->kv_pulled);
    cJSON_AddNumberToObject(o, "local_prefills", (double)x->local_prefills);
    cJSON_AddStringToObject(o, "counters", x->from_stats ? "router" : "chunks");
    cJSON_AddNumberToObject(o, "hit_rate", x->hit_rate);
    cJSON_AddNumberToObject(o, "ideal_hit_rate", x->ideal_rate);
    cJSON_AddStringToObject(o, "digest", digest);
    return o; /* cJSON writes a NAN as null */
}

int kvf_multiturn_report_json(const kvf_multiturn_setup_t *s, const kvf_multiturn_result_t *r,
                              int n, const char *path)
{
    cJSON *root = cJSON_CreateObject();
    const kvf_multiturn_spec_t *sp = s->spec;
    cJSON_AddStringToObject(root, "workload", "multiturn");
    cJSON_AddNumberToObject(root, "conversations", sp->conversations);
    cJSON_AddNumberToObject(root, "turns", sp->turns);
    cJSON_AddNumberToObject(root, "system_tokens", sp->system_tokens);
    cJSON_AddStringToObject(root, "user_tokens", s->user_len);
    cJSON_AddStringToObject(root, "output_tokens", s->output_len);
    cJSON_AddNumberToObject(root, "seed", (double)sp->seed);
    cJSON_AddNumberToObject(root, "rate", s->run->rate);
    cJSON_AddNumberToObject(root, "think_ms", s->run->think_ms);
    cJSON_AddNumberToObject(root, "short_tokens", s->run->short_tokens);
    cJSON_AddNumberToObject(root, "prefill_nodes", s->prefill_nodes);
    cJSON_AddNumberToObject(root, "decode_nodes", s->decode_nodes);
    cJSON_AddNumberToObject(root, "threads", s->threads);
    cJSON_AddNumberToObject(root, "slo_ttft_ms", s->run->slo_ttft_ms);
    cJSON_AddNumberToObject(root, "slo_tpot_ms", s->run->slo_tpot_ms);
    cJSON *runs = cJSON_AddArrayToObject(root, "runs");
    for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(runs, json_run(&r[i]));
    mt_target_t t[MT_N_TARGETS];
    compute_targets(r, n, t);
    cJSON *targets = cJSON_AddArrayToObject(root, "targets");
    for (int i = 0; i < MT_N_TARGETS; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", t[i].name);
        cJSON_AddStringToObject(o, "runs", t[i].runs);
        cJSON_AddNumberToObject(o, "value", t[i].value);
        cJSON_AddStringToObject(o, "bound", t[i].at_most ? "<=" : ">=");
        cJSON_AddNumberToObject(o, "limit", t[i].bound);
        cJSON_AddStringToObject(o, "verdict", verdict(&t[i]));
        cJSON_AddItemToArray(targets, o);
    }
    int rc = kvf_bench_write_json(root, path, "bench serve");
    cJSON_Delete(root);
    return rc;
}

/* ---- --plot ------------------------------------------------------------------ */

void kvf_multiturn_report_plot(const kvf_multiturn_result_t *r, int n, const char *png,
                               const char *run_dir)
{
    char data[512], script[512];
    snprintf(data, sizeof(data), "%s/multiturn-plot.dat", run_dir);
    snprintf(script, sizeof(script), "%s/multiturn-plot.gp", run_dir);
    FILE *f = fopen(data, "w");
    if (!f) {
        fprintf(stderr, "bench serve: cannot write %s\n", data);
        return;
    }
    fprintf(f, "# route ttft_p50 ttft_p99 short_ttft_p50 prefill_computed kv_MB hit%% ideal%% "
               "goodput\n");
    for (int i = 0; i < n; i++)
        fprintf(f, "\"%s\" %g %g %g %llu %g %g %g %g\n", r[i].route, r[i].ttft_p50, r[i].ttft_p99,
                r[i].short_ttft_p50, (unsigned long long)r[i].prefill_computed,
                (double)r[i].kv_bytes / 1e6, 100 * r[i].hit_rate, 100 * r[i].ideal_rate,
                r[i].goodput);
    fclose(f);
    f = fopen(script, "w");
    if (!f) {
        fprintf(stderr, "bench serve: cannot write %s\n", script);
        return;
    }
    static const struct {
        const char *title, *cols;
    } panels[] = {
        {"TTFT (ms)", "u 2:xtic(1) t 'p50', '' u 3 t 'p99'"},
        {"short follow-up TTFT p50 (ms)", "u 4:xtic(1) notitle"},
        {"prefill tokens computed", "u 5:xtic(1) notitle"},
        {"KV shipped (MB)", "u 6:xtic(1) notitle"},
        {"prefix hit rate (%)", "u 7:xtic(1) t 'measured', '' u 8 t 'ideal'"},
        {"goodput (req/s within SLO)", "u 9:xtic(1) notitle"},
    };
    fprintf(f,
            "set terminal png size 1500,800\nset output '%s'\nset multiplot layout 2,3\n"
            "set style data histograms\nset style histogram clustered gap 1\n"
            "set style fill solid 0.8 border -1\nset boxwidth 0.9\nset grid ytics\n"
            "set yrange [0:*]\nset key top left\n",
            png);
    for (size_t i = 0; i < sizeof(panels) / sizeof(panels[0]); i++)
        fprintf(f, "set title '%s'\nplot '%s' %s\n", panels[i].title, data, panels[i].cols);
    fprintf(f, "unset multiplot\n");
    fclose(f);
    char cmd[1200];
    snprintf(cmd, sizeof(cmd), "gnuplot '%s' 2>/dev/null", script);
    if (system(cmd) != 0)
        fprintf(stderr,
                "bench serve: gnuplot failed (is it installed?); data in %s, script in %s\n", data,
                script);
    else
        printf("plot written to %s\n", png);
}
