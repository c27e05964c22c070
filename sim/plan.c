/* kvf plan's search (docs/simulator.md, "The planner"): the cheapest
 * split (P:D) and colocated clusters up to a node budget that meet the
 * p99 SLOs at the workload's rate, and each one's goodput (the highest
 * rate at which both p99s stay within their SLOs, DistServe's measure
 * at 99% attainment) per GPU. See sim.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

/* The goodput search: rates up to this many times the workload's, then
 * this many bisection steps. */
#define PLAN_RATE_CEILING 64.0
#define PLAN_BISECT_STEPS 10

/* How far r misses the SLOs: the larger of p99 over SLO for both
 * (<= 1: met); refused or unfinished requests miss them outright. */
static double shortfall(const kvf_sim_config_t *cfg, const kvf_sim_result_t *r)
{
    if (r->n_done < r->n)
        return INFINITY;
    double t = cfg->slo_ttft_ms > 0 ? r->ttft[2] / cfg->slo_ttft_ms : 0;
    double p = cfg->slo_tpot_ms > 0 && r->n_tpot ? r->tpot[2] / cfg->slo_tpot_ms : 0;
    return t > p ? t : p;
}

/* Runs cfg with arrivals rate_factor times as fast as w's: c's p99s and
 * shortfall. */
static kvf_status_t try_rate(kvf_sim_config_t cfg, const kvf_sim_workload_t *w, double rate_factor,
                             kvf_sim_candidate_t *c, char *err, size_t err_len)
{
    cfg.arrival_scale = 1.0 / rate_factor;
    kvf_sim_result_t r;
    kvf_status_t st = kvf_sim_run(&cfg, w, &r, err, err_len);
    if (st != KVF_OK)
        return st;
    c->ttft_p99 = r.ttft[2];
    c->tpot_p99 = r.tpot[2];
    c->refused = r.n - r.n_done;
    c->shortfall = shortfall(&cfg, &r);
    kvf_sim_result_fini(&r);
    return KVF_OK;
}

/* c's goodput: the highest multiple of w's rate (times base_rate) it
 * meets the SLOs at, by doubling then bisection. */
static kvf_status_t goodput(const kvf_sim_config_t *cfg, const kvf_sim_workload_t *w,
                            double base_rate, kvf_sim_candidate_t *c, char *err, size_t err_len)
{
    kvf_sim_candidate_t probe;
    double lo = 0, hi = 1.0 / 64;
    kvf_status_t st;
    for (;;) { /* the first factor that fails */
        if ((st = try_rate(*cfg, w, hi, &probe, err, err_len)) != KVF_OK)
            return st;
        if (probe.shortfall > 1 || hi >= PLAN_RATE_CEILING)
            break;
        lo = hi;
        hi *= 2;
    }
    if (probe.shortfall <= 1)
        lo = hi; /* met at the ceiling: no bisection */
    for (int i = 0; i < PLAN_BISECT_STEPS && lo < hi; i++) {
        double mid = (lo + hi) / 2;
        if ((st = try_rate(*cfg, w, mid, &probe, err, err_len)) != KVF_OK)
            return st;
        if (probe.shortfall <= 1)
            lo = mid;
        else
            hi = mid;
    }
    c->goodput = lo * base_rate;
    c->goodput_per_gpu = c->goodput / c->gpus;
    return KVF_OK;
}

static void set_shape(kvf_sim_config_t *cfg, const kvf_sim_candidate_t *c)
{
    cfg->n_prefill = c->n_prefill;
    cfg->n_decode = c->n_decode;
    cfg->n_colocated = c->n_colocated;
}

/* The cheapest cluster of one kind meeting the SLOs at w's own rate:
 * sizes by node count, for the split kind every P:D at that count (the
 * smallest shortfall wins among those that meet). *best_p: it, or when
 * none meets, the one closest to. */
static kvf_status_t cheapest(const kvf_sim_config_t *base, const kvf_sim_workload_t *w,
                             int max_nodes, bool split, kvf_sim_candidate_t *best_p,
                             size_t *tried_p, char *err, size_t err_len)
{
    kvf_sim_candidate_t closest = {.shortfall = INFINITY};
    for (int n = split ? 2 : 1; n <= max_nodes; n++) {
        kvf_sim_candidate_t met = {.shortfall = INFINITY};
        for (int p = split ? 1 : 0; p <= (split ? n - 1 : 0); p++) {
            kvf_sim_candidate_t c = {.n_prefill = split ? p : 0,
                                     .n_decode = split ? n - p : 0,
                                     .n_colocated = split ? 0 : n};
            kvf_sim_config_t cfg = *base;
            set_shape(&cfg, &c);
            c.gpus = kvf_sim_gpus(&cfg);
            kvf_status_t st = try_rate(cfg, w, 1, &c, err, err_len);
            if (st != KVF_OK)
                return st;
            ++*tried_p;
            if (c.shortfall < closest.shortfall || isinf(closest.shortfall))
                closest = c;
            if (c.shortfall <= 1 && c.shortfall < met.shortfall)
                met = c;
        }
        if (met.shortfall <= 1) {
            met.meets = true;
            *best_p = met;
            return KVF_OK;
        }
    }
    *best_p = closest;
    return KVF_OK;
}

/* The mean arrival rate of w: requests over the span of their arrivals. */
static double workload_rate(const kvf_sim_workload_t *w)
{
    double span = w->n > 1 ? w->reqs[w->n - 1].at_s - w->reqs[0].at_s : 0;
    return span > 0 ? (double)(w->n - 1) / span : 0;
}

kvf_status_t kvf_sim_plan(const kvf_sim_config_t *base, const kvf_sim_workload_t *w, int max_nodes,
                          kvf_sim_plan_t *plan, char *err, size_t err_len)
{
    *plan = (kvf_sim_plan_t){.rate = workload_rate(w)};
    if (max_nodes < 1 || max_nodes > SIM_PLAN_MAX_NODES || plan->rate <= 0) {
        snprintf(err, err_len,
                 "needs 1 <= --max-nodes <= %d and a workload of at least two "
                 "arrivals apart",
                 SIM_PLAN_MAX_NODES);
        return KVF_ERR_INVAL;
    }
    kvf_sim_candidate_t *kinds[2] = {&plan->split, &plan->colocated};
    for (int k = 0; k < 2; k++) {
        if (k == 0 && max_nodes < 2) {
            plan->split.shortfall = INFINITY;
            continue;
        }
        kvf_status_t st =
            cheapest(base, w, max_nodes, k == 0, kinds[k], &plan->tried, err, err_len);
        if (st == KVF_OK && !isinf(kinds[k]->shortfall)) {
            kvf_sim_config_t cfg = *base;
            set_shape(&cfg, kinds[k]);
            st = goodput(&cfg, w, plan->rate, kinds[k], err, err_len);
        }
        if (st != KVF_OK)
            return st;
    }
    const kvf_sim_candidate_t *s = &plan->split, *c = &plan->colocated;
    if (s->meets && c->meets)
        plan->best =
            s->gpus < c->gpus || (s->gpus == c->gpus && s->goodput_per_gpu > c->goodput_per_gpu)
                ? s
                : c;
    else
        plan->best = s->meets ? s : c->meets ? c : NULL;
    plan->closest = s->shortfall < c->shortfall ? s : c;
    return KVF_OK;
}
