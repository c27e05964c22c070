/* The simulator's output: a table, JSON and an SVG of the latency CDFs.
 * See sim.h. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_util.h"
#include "sim.h"

static const char *const pct_names[3] = {"p50", "p90", "p99"};

/* "2P+4D" or "4C", with the tensor-parallel size when above 1. */
static void cluster_name(const kvf_sim_config_t *cfg, char *buf, size_t len)
{
    int n = 0;
    if (cfg->n_colocated)
        n = snprintf(buf, len, "%d colocated", cfg->n_colocated);
    else
        n = snprintf(buf, len, "%dP+%dD", cfg->n_prefill, cfg->n_decode);
    if (cfg->model.tp > 1 && n > 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n, " (tp %d)", cfg->model.tp);
}

void kvf_sim_report_print(const kvf_sim_config_t *cfg, const kvf_sim_result_t *res)
{
    char name[64];
    cluster_name(cfg, name, sizeof(name));
    printf("cluster      %s on %s, %d GPUs, routing %s\n", name, cfg->hw.name, kvf_sim_gpus(cfg),
           kvf_route_policy_name(cfg->route));
    printf("requests     %zu: %zu done, %zu refused, over %.2f s\n", res->n, res->n_done,
           res->n_refused, res->duration_s);
    printf("throughput   %.2f req/s, %.0f tok/s\n", res->req_per_s, res->tok_per_s);
    printf("%-12s %12s %12s %12s\n", "latency (ms)", "p50", "p90", "p99");
    const char *rows[3] = {"TTFT", "TPOT", "e2e"};
    const double *vals[3] = {res->ttft, res->tpot, res->e2e};
    for (int i = 0; i < 3; i++)
        printf("%-12s %12.2f %12.2f %12.2f\n", rows[i], vals[i][0], vals[i][1], vals[i][2]);
    printf("goodput      %.2f req/s within TTFT <= %g ms and TPOT <= %g ms (%.1f%% of "
           "requests)\n",
           res->goodput, cfg->slo_ttft_ms, cfg->slo_tpot_ms, 100 * res->attainment);
    if (cfg->n_colocated)
        printf("utilisation  colocated %.1f%%\n", 100 * res->util_decode);
    else
        printf("utilisation  prefill %.1f%%, decode %.1f%%\n", 100 * res->util_prefill,
               100 * res->util_decode);
    printf("work         %llu steps, %llu transfers (%.2f GB), %llu prompt tokens from prefix "
           "caches\n",
           (unsigned long long)res->steps, (unsigned long long)res->transfers, res->kv_bytes / 1e9,
           (unsigned long long)res->cached_tokens);
}

static void add_pcts(cJSON *o, const char *key, const double v[3])
{
    cJSON *p = cJSON_AddObjectToObject(o, key);
    for (int i = 0; i < 3; i++)
        cJSON_AddNumberToObject(p, pct_names[i], isnan(v[i]) ? 0 : v[i]);
}

int kvf_sim_report_json(const kvf_sim_config_t *cfg, const kvf_sim_result_t *res, const char *path,
                        const char *prog)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *c = cJSON_AddObjectToObject(root, "cluster");
    cJSON_AddNumberToObject(c, "prefill", cfg->n_prefill);
    cJSON_AddNumberToObject(c, "decode", cfg->n_decode);
    cJSON_AddNumberToObject(c, "colocated", cfg->n_colocated);
    cJSON_AddNumberToObject(c, "tp", cfg->model.tp);
    cJSON_AddNumberToObject(c, "gpus", kvf_sim_gpus(cfg));
    cJSON_AddStringToObject(c, "profile", cfg->hw.name);
    cJSON_AddStringToObject(c, "route", kvf_route_policy_name(cfg->route));
    cJSON_AddNumberToObject(root, "requests", (double)res->n);
    cJSON_AddNumberToObject(root, "done", (double)res->n_done);
    cJSON_AddNumberToObject(root, "refused", (double)res->n_refused);
    cJSON_AddNumberToObject(root, "duration_s", res->duration_s);
    cJSON_AddNumberToObject(root, "req_per_s", res->req_per_s);
    cJSON_AddNumberToObject(root, "tok_per_s", res->tok_per_s);
    add_pcts(root, "ttft_ms", res->ttft);
    add_pcts(root, "tpot_ms", res->tpot);
    add_pcts(root, "e2e_ms", res->e2e);
    cJSON_AddNumberToObject(root, "slo_ttft_ms", cfg->slo_ttft_ms);
    cJSON_AddNumberToObject(root, "slo_tpot_ms", cfg->slo_tpot_ms);
    cJSON_AddNumberToObject(root, "goodput", res->goodput);
    cJSON_AddNumberToObject(root, "slo_attainment", res->attainment);
    cJSON_AddNumberToObject(root, "util_prefill", res->util_prefill);
    cJSON_AddNumberToObject(root, "util_decode", res->util_decode);
    cJSON_AddNumberToObject(root, "steps", (double)res->steps);
    cJSON_AddNumberToObject(root, "transfers", (double)res->transfers);
    cJSON_AddNumberToObject(root, "kv_bytes", res->kv_bytes);
    cJSON_AddNumberToObject(root, "cached_tokens", (double)res->cached_tokens);
    int rc = kvf_bench_write_json(root, path, prog);
    cJSON_Delete(root);
    return rc;
}

/* ---- the plot ------------------------------------------------------------------ */

#define SVG_W     420 /* one panel */
#define SVG_H     300
#define SVG_PAD   50
#define SVG_STEPS 200 /* points of a CDF */

/* One CDF panel at x offset ox: v[0..n) sorted, in ms, with the SLO as a
 * vertical line (0: none). */
static void svg_panel(FILE *f, int ox, const char *title, const double *v, size_t n, double slo)
{
    double top = n ? v[n - 1] : 1;
    if (slo > top)
        top = slo;
    if (top <= 0)
        top = 1;
    int x0 = ox + SVG_PAD, y0 = SVG_H - SVG_PAD, w = SVG_W - 2 * SVG_PAD, h = SVG_H - 2 * SVG_PAD;
    fprintf(f, "<text x=\"%d\" y=\"24\" font-size=\"14\">%s CDF</text>\n", x0, title);
    fprintf(f,
            "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
            "stroke=\"#888\"/>\n",
            x0, SVG_PAD, w, h);
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"11\">0</text>\n", x0, y0 + 16);
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"11\" text-anchor=\"end\">%.1f ms</text>\n",
            x0 + w, y0 + 16, top);
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"11\" text-anchor=\"end\">1</text>\n", x0 - 4,
            SVG_PAD + 4);
    if (slo > 0) {
        int sx = x0 + (int)(w * slo / top);
        fprintf(f,
                "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#c33\" "
                "stroke-dasharray=\"4\"/>\n",
                sx, SVG_PAD, sx, y0);
        fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"11\" fill=\"#c33\">SLO</text>\n", sx + 3,
                SVG_PAD + 14);
    }
    if (!n)
        return;
    fprintf(f, "<polyline fill=\"none\" stroke=\"#2463a8\" stroke-width=\"2\" points=\"");
    for (int k = 0; k <= SVG_STEPS; k++) {
        size_t i = (size_t)((double)(n - 1) * k / SVG_STEPS);
        double frac = (double)(i + 1) / (double)n;
        fprintf(f, "%.1f,%.1f ", x0 + w * v[i] / top, y0 - h * frac);
    }
    fprintf(f, "\"/>\n");
}

int kvf_sim_report_svg(const kvf_sim_config_t *cfg, const kvf_sim_result_t *res, const char *path,
                       const char *prog)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "%s: cannot write %s: %m\n", prog, path);
        return 1;
    }
    char name[64];
    cluster_name(cfg, name, sizeof(name));
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "font-family=\"sans-serif\">\n",
            2 * SVG_W, SVG_H + 20);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    svg_panel(f, 0, "TTFT", res->ttft_ms, res->n_ttft, cfg->slo_ttft_ms);
    svg_panel(f, SVG_W, "TPOT", res->tpot_ms, res->n_tpot, cfg->slo_tpot_ms);
    fprintf(f,
            "<text x=\"%d\" y=\"%d\" font-size=\"12\">%s on %s: %zu requests, goodput %.2f "
            "req/s</text>\n",
            SVG_PAD, SVG_H + 10, name, cfg->hw.name, res->n, res->goodput);
    fprintf(f, "</svg>\n");
    bool bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        fprintf(stderr, "%s: cannot write %s\n", prog, path);
        return 1;
    }
    return 0;
}
