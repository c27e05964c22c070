/* kvf plan: the cheapest kvferry cluster for a model, a hardware profile,
 * a workload and p99 SLOs, split (P:D) or colocated, found by simulating
 * each size (sim/plan.c, docs/simulator.md); whether disaggregation beats
 * colocation for that workload, by goodput per GPU; the replica counts
 * for deploy/kvf-cluster and Kubernetes. */
#include <math.h>
#include <stdio.h>

#include "commands.h"
#include "kvf/flags.h"
#include "sim_opts.h"

typedef struct {
    kvf_sim_opts_t sim;
    int max_nodes;
    const char *cluster_file, *k8s_file;
} plan_opts_t;

/* Returns -1 to run, else the exit code. */
static int parse(int argc, char **argv, plan_opts_t *o)
{
    kvf_flag_t flags[KVF_SIM_OPTS_MAX_FLAGS + 8];
    size_t n = kvf_sim_opts_flags(&o->sim, flags);
    o->max_nodes = 16;
    o->cluster_file = o->k8s_file = NULL;
    const kvf_flag_t own[] = {
        {"max-nodes", KVF_FLAG_INT, &o->max_nodes, "N", "the node budget searched", NULL},
        {"write-cluster", KVF_FLAG_STRING, &o->cluster_file, "FILE",
         "write the recommendation as a deploy/kvf-cluster --config file", NULL},
        {"write-k8s", KVF_FLAG_STRING, &o->k8s_file, "FILE",
         "write the recommendation as a kustomization replicas patch (deploy/k8s)", NULL},
    };
    for (size_t i = 0; i < sizeof(own) / sizeof(own[0]); i++)
        flags[n++] = own[i];
    kvf_flagset_t set = {
        .prog = argv[0],
        .usage = "--model DIR --slo-ttft-ms MS --slo-tpot-ms MS [--rate R] [options]",
        .summary = "Searches split clusters (every P:D) and colocated ones up to --max-nodes "
                   "by simulating each under the workload (kvf simulate's model), prints the "
                   "cheapest that keeps TTFT p99 and TPOT p99 within the SLOs, and whether "
                   "disaggregation beats colocation for this workload: the ratio of their "
                   "goodput per GPU. Exit 1 when no cluster in the budget meets the SLOs (the "
                   "closest is printed with its shortfall).",
        .flags = flags,
        .n_flags = n,
    };
    int rc = kvf_flags_parse(&set, argc, argv);
    if (rc == KVF_FLAGS_EXIT)
        return 0;
    if (rc < 0)
        return 2;
    if (o->sim.slo_ttft_ms <= 0 || o->sim.slo_tpot_ms <= 0) {
        fprintf(stderr, "%s: needs --slo-ttft-ms and --slo-tpot-ms (the p99 bounds)\n", argv[0]);
        return 2;
    }
    return -1;
}

static void shape(const kvf_sim_candidate_t *c, char *buf, size_t len)
{
    if (c->n_colocated)
        snprintf(buf, len, "%d colocated", c->n_colocated);
    else
        snprintf(buf, len, "%dP+%dD", c->n_prefill, c->n_decode);
}

static void print_row(const char *what, const kvf_sim_candidate_t *c)
{
    char s[32];
    shape(c, s, sizeof(s));
    if (isinf(c->shortfall)) {
        printf("%-11s %-14s %4d  none meets: requests refused even at the largest size\n", what, s,
               c->gpus);
        return;
    }
    printf("%-11s %-14s %4d  %-5s %10.1f %10.2f %10.2f %12.3f\n", what, s, c->gpus,
           c->meets ? "yes" : "no", c->ttft_p99, c->tpot_p99, c->goodput, c->goodput_per_gpu);
}

/* Prints the verdict: the recommendation, or the closest with its
 * shortfall (exit 1); and split against colocated. */
static int verdict(const char *prog, const kvf_sim_config_t *cfg, const kvf_sim_plan_t *pl,
                   int max_nodes)
{
    const kvf_sim_candidate_t *s = &pl->split, *c = &pl->colocated;
    if (s->goodput_per_gpu > 0 && c->goodput_per_gpu > 0) {
        double ratio = s->goodput_per_gpu / c->goodput_per_gpu;
        printf("disaggregation %s colocation for this workload: goodput per GPU %.3f vs %.3f "
               "req/s (%.2fx)\n",
               ratio > 1 ? "beats" : "loses to", s->goodput_per_gpu, c->goodput_per_gpu, ratio);
    }
    if (pl->best) {
        char b[32];
        shape(pl->best, b, sizeof(b));
        printf("recommended: %s, %d GPUs (tp %d)\n", b, pl->best->gpus, cfg->model.tp);
        return 0;
    }
    const kvf_sim_candidate_t *x = pl->closest;
    char b[32];
    shape(x, b, sizeof(b));
    if (isinf(x->shortfall)) {
        fprintf(stderr,
                "%s: no cluster of at most %d nodes meets the SLOs at %.2f req/s: even "
                "the largest refuses requests\n",
                prog, max_nodes, pl->rate);
        return 1;
    }
    fprintf(stderr,
            "%s: no cluster of at most %d nodes meets TTFT p99 <= %g ms and TPOT p99 <= "
            "%g ms at %.2f req/s; the closest, %s (%d GPUs), has TTFT p99 %.1f ms (%+.0f%%) and "
            "TPOT p99 %.2f ms (%+.0f%%): %.0f%% over\n",
            prog, max_nodes, cfg->slo_ttft_ms, cfg->slo_tpot_ms, pl->rate, b, x->gpus, x->ttft_p99,
            100 * (x->ttft_p99 / cfg->slo_ttft_ms - 1), x->tpot_p99,
            100 * (x->tpot_p99 / cfg->slo_tpot_ms - 1), 100 * (x->shortfall - 1));
    return 1;
}

/* The recommendation as deploy/kvf-cluster and kustomize files. */
static int write_files(const char *prog, const plan_opts_t *o, const kvf_sim_candidate_t *b)
{
    int n_prefill = b->n_colocated ? 0 : b->n_prefill;
    int n_decode = b->n_colocated ? b->n_colocated : b->n_decode;
    char s[32];
    shape(b, s, sizeof(s));
    const char *paths[2] = {o->cluster_file, o->k8s_file};
    for (int k = 0; k < 2; k++) {
        if (!paths[k])
            continue;
        FILE *f = fopen(paths[k], "w");
        if (!f) {
            fprintf(stderr, "%s: cannot write %s: %m\n", prog, paths[k]);
            return 1;
        }
        fprintf(f, "# kvf plan: %s (docs/simulator.md)\n", s);
        if (k == 0)
            fprintf(f, "PREFILL=%d\nDECODE=%d\n%s", n_prefill, n_decode,
                    b->n_colocated ? "DECODE_ARGS=--prefill-local\n" : "");
        else
            fprintf(f,
                    "# add to deploy/k8s/kustomization.yaml%s\nreplicas:\n"
                    "  - name: kvf-prefill\n    count: %d\n  - name: kvf-decode\n"
                    "    count: %d\n",
                    b->n_colocated ? " (and --prefill-local in decode.yaml's args)" : "", n_prefill,
                    n_decode);
        if (fclose(f) != 0) {
            fprintf(stderr, "%s: cannot write %s\n", prog, paths[k]);
            return 1;
        }
    }
    return 0;
}

int kvf_cmd_plan(int argc, char **argv)
{
    plan_opts_t o;
    int rc = parse(argc, argv, &o);
    if (rc >= 0)
        return rc;
    kvf_sim_config_t cfg;
    kvf_sim_workload_t w = {0};
    rc = kvf_sim_opts_resolve(argv[0], &o.sim, &cfg, &w);
    if (rc >= 0)
        return rc;
    kvf_sim_plan_t pl;
    char err[512];
    if (kvf_sim_plan(&cfg, &w, o.max_nodes, &pl, err, sizeof(err)) != KVF_OK) {
        fprintf(stderr, "%s: %s\n", argv[0], err);
        kvf_sim_workload_fini(&w);
        return 2;
    }
    printf("%s on %s (tp %d), %zu requests at %.2f req/s, SLOs TTFT p99 <= %g ms, TPOT p99 <= "
           "%g ms; %zu sizes simulated\n",
           o.sim.model_dir, cfg.hw.name, cfg.model.tp, w.n, pl.rate, cfg.slo_ttft_ms,
           cfg.slo_tpot_ms, pl.tried);
    printf("%-11s %-14s %4s  %-5s %10s %10s %10s %12s\n", "kind", "cluster", "GPUs", "meets",
           "TTFT p99", "TPOT p99", "goodput", "goodput/GPU");
    if (o.max_nodes >= 2)
        print_row("split", &pl.split);
    print_row("colocated", &pl.colocated);
    rc = verdict(argv[0], &cfg, &pl, o.max_nodes);
    if (rc == 0)
        rc = write_files(argv[0], &o, pl.best);
    kvf_sim_workload_fini(&w);
    return rc;
}
