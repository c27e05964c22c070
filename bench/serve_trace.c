/* The trace of kvf bench serve and its client driver. See serve_trace.h. */
#include "serve_trace.h"
#include "bench_util.h"

#include "kvf/clientsock.h"
#include "kvf/clock.h"
#include "kvf/msg.h"
#include "kvf/sampling.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

bool kvf_len_dist_parse(const char *text, kvf_len_dist_t *d)
{
    unsigned a, b;
    char tail;
    if (sscanf(text, "%u:%u%c", &a, &b, &tail) == 2 && a >= 1 && b >= a) {
        d->lo = a;
        d->hi = b;
        return true;
    }
    if (sscanf(text, "%u%c", &a, &tail) == 1 && a >= 1) {
        d->lo = d->hi = a;
        return true;
    }
    return false;
}

/* ---- the trace ------------------------------------------------------------ */

static double unit(uint64_t *s)
{
    return (double)(kvf_splitmix64(s) >> 11) / 9007199254740992.0;
}

uint32_t kvf_len_dist_draw(const kvf_len_dist_t *d, uint64_t *rng)
{
    return d->lo + (uint32_t)(kvf_splitmix64(rng) % (d->hi - d->lo + 1));
}

double kvf_serve_draw_exp(uint64_t *rng)
{
    return -log(1.0 - unit(rng));
}

kvf_status_t kvf_serve_trace_init(kvf_serve_trace_t *t, size_t n, uint64_t seed,
                                  const kvf_len_dist_t *pl, const kvf_len_dist_t *ol,
                                  const kvf_model_config_t *cfg)
{
    t->n = n;
    t->reqs = calloc(n, sizeof(*t->reqs));
    t->gaps = calloc(n, sizeof(*t->gaps));
    if (!t->reqs || !t->gaps)
        return KVF_ERR_NOMEM;
    uint64_t rng = seed;
    uint64_t id_range = (uint64_t)(cfg->vocab > 3 ? cfg->vocab - 3 : 1);
    for (size_t i = 0; i < n; i++) {
        kvf_trace_req_t *q = &t->reqs[i];
        t->gaps[i] = kvf_serve_draw_exp(&rng);
        q->n_prompt = kvf_len_dist_draw(pl, &rng);
        q->max_tokens = kvf_len_dist_draw(ol, &rng);
        q->prompt = malloc(q->n_prompt * sizeof(uint32_t));
        if (!q->prompt)
            return KVF_ERR_NOMEM;
        for (uint32_t k = 0; k < q->n_prompt; k++)
            q->prompt[k] = (uint32_t)(kvf_splitmix64(&rng) % id_range);
        if (cfg->bos_id >= 0)
            q->prompt[0] = (uint32_t)cfg->bos_id;
    }
    return KVF_OK;
}

void kvf_serve_trace_fini(kvf_serve_trace_t *t)
{
    for (size_t i = 0; t->reqs && i < t->n; i++)
        free(t->reqs[i].prompt);
    free(t->reqs);
    free(t->gaps);
    t->reqs = NULL;
    t->gaps = NULL;
}

void kvf_serve_trace_schedule(kvf_serve_trace_t *t, double rate)
{
    double at = 0;
    for (size_t i = 0; i < t->n; i++) {
        at += rate > 0 ? t->gaps[i] / rate : 0;
        t->reqs[i].at_s = at;
    }
}

/* ---- the client driver ------------------------------------------------------ */

typedef struct {
    kvf_client_t *client;
    kvf_trace_req_t *reqs;
    size_t n;    /* requests to send: the trace's, fewer once stopped */
    size_t next; /* the next one to send */
    size_t done; /* finished or failed to send */
    int concurrency;
    uint64_t base_id; /* request i is client_req_id base_id + i */
    uint64_t t0;      /* the run's start, ns */
} driver_t;

static uint64_t arrival_ns(const driver_t *d, size_t i)
{
    return d->t0 + (uint64_t)(d->reqs[i].at_s * 1e9);
}

static bool is_due(const driver_t *d, uint64_t now)
{
    if (d->next >= d->n)
        return false;
    return d->concurrency > 0 ? d->next - d->done < (size_t)d->concurrency
                              : now >= arrival_ns(d, d->next);
}

static void send_request(driver_t *d)
{
    kvf_trace_req_t *q = &d->reqs[d->next];
    Kvf__Sampling s = KVF__SAMPLING__INIT;
    s.max_tokens = q->max_tokens;
    s.ignore_eos = true;
    kvf_client_generate_t g = {.client_req_id = d->base_id + d->next,
                               .ids = q->prompt,
                               .n_ids = q->n_prompt,
                               .sampling = &s};
    q->t_sent = kvf_clock_ns();
    if (kvf_client_generate(d->client, "bench-serve", &g, 5000) != KVF_OK) {
        q->finish = 4;
        d->done++;
    }
    q->sent = true;
    d->next++;
}

/* A streamed chunk: its tokens' times, and the end of its request. */
static void on_chunk(driver_t *d, const Kvf__GenerateChunk *c)
{
    uint64_t idx = c->client_req_id - d->base_id;
    if (idx >= d->n || d->reqs[idx].finish >= 0)
        return;
    kvf_trace_req_t *q = &d->reqs[idx];
    uint64_t t = kvf_clock_ns();
    if (c->n_tokens) {
        if (!q->t_first)
            q->t_first = t;
        q->t_last = t;
        q->n_tokens += (uint32_t)c->n_tokens;
    }
    if (c->finish_reason != KVF__FINISH_REASON__FINISH_NONE) {
        q->finish = c->finish_reason;
        q->t_done = t;
        d->done++;
    }
}

/* Sends what is due, then waits for one reply: until the next arrival,
 * 20 ms at most. */
static void drive_once(driver_t *d)
{
    uint64_t now = kvf_clock_ns();
    while (is_due(d, now))
        send_request(d);
    int wait_ms = 20;
    if (d->next < d->n && d->concurrency <= 0) {
        int until = kvf_clock_ms_until(arrival_ns(d, d->next));
        wait_ms = until < wait_ms ? until : wait_ms;
    }
    kvf_envelope_t *in = NULL;
    if (kvf_client_recv(d->client, wait_ms, &in) != KVF_OK)
        return;
    if (in->body_case == KVF__ENVELOPE__BODY_GENERATE_CHUNK)
        on_chunk(d, in->generate_chunk);
    kvf_envelope_free(in);
}

/* Counts, rates and latency percentiles of the requests the run sent.
 * Returns -1 when out of memory. */
static int summarize(const driver_t *d, double slo_ttft_ms, double slo_tpot_ms,
                     kvf_serve_result_t *res)
{
    size_t n = d->n;
    double *ttft = calloc(n, sizeof(double)), *tpot = calloc(n, sizeof(double)),
           *e2e = calloc(n, sizeof(double));
    int rc = -1;
    if (!ttft || !tpot || !e2e)
        goto out;
    size_t n_ok = 0, n_tpot = 0, n_good = 0;
    uint64_t tokens = 0, t_end = d->t0;
    for (size_t i = 0; i < n; i++) {
        const kvf_trace_req_t *q = &d->reqs[i];
        if (q->finish != 1 && q->finish != 2) {
            res->n_failed++;
            continue;
        }
        n_ok++;
        tokens += q->n_tokens;
        double f = (double)(q->t_first - q->t_sent) / 1e6;
        ttft[n_ok - 1] = f;
        e2e[n_ok - 1] = (double)(q->t_done - q->t_sent) / 1e6;
        double p = 0;
        if (q->n_tokens > 1) {
            p = (double)(q->t_last - q->t_first) / 1e6 / (q->n_tokens - 1);
            tpot[n_tpot++] = p;
        }
        if (f <= slo_ttft_ms && p <= slo_tpot_ms)
            n_good++;
        if (q->t_done > t_end)
            t_end = q->t_done;
    }
    res->n_sent = n;
    res->n_ok = n_ok;
    res->duration_s = (double)(t_end - d->t0) / 1e9;
    res->req_per_s = res->duration_s > 0 ? (double)n_ok / res->duration_s : 0;
    res->tok_per_s = res->duration_s > 0 ? (double)tokens / res->duration_s : 0;
    res->goodput = res->duration_s > 0 ? (double)n_good / res->duration_s : 0;
    kvf_bench_percentiles(ttft, n_ok, res->ttft);
    kvf_bench_percentiles(tpot, n_tpot, res->tpot);
    kvf_bench_percentiles(e2e, n_ok, res->e2e);
    rc = 0;
out:
    free(ttft);
    free(tpot);
    free(e2e);
    return rc;
}

int kvf_serve_trace_run(const char *client_url, kvf_serve_trace_t *t, int concurrency,
                        double slo_ttft_ms, double slo_tpot_ms, int timeout_s,
                        volatile sig_atomic_t *stop, kvf_serve_result_t *res)
{
    driver_t d = {.reqs = t->reqs, .n = t->n, .concurrency = concurrency};
    if (kvf_client_create(client_url, &d.client) != KVF_OK) {
        fprintf(stderr, "bench serve: cannot connect to %s\n", client_url);
        return 1;
    }
    for (size_t i = 0; i < d.n; i++) {
        kvf_trace_req_t *q = &d.reqs[i];
        q->finish = -1;
        q->sent = false;
        q->n_tokens = 0;
        q->t_first = q->t_last = q->t_done = 0;
    }
    d.base_id = kvf_clock_ns();
    d.t0 = kvf_clock_ns();
    uint64_t hard_deadline = d.t0 + (uint64_t)timeout_s * 1000000000ull;
    while (d.done < d.n && kvf_clock_ns() < hard_deadline) {
        if (*stop && d.n > d.next) {
            fprintf(stderr,
                    "bench serve: stopped by a signal after %zu of %zu requests; "
                    "waiting for the %zu in flight\n",
                    d.next, d.n, d.next - d.done);
            d.n = d.next;
            continue;
        }
        drive_once(&d);
    }
    kvf_client_destroy(d.client);
    if (summarize(&d, slo_ttft_ms, slo_tpot_ms, res) != 0)
        return 1;
    return d.done == d.n ? 0 : 1;
}
