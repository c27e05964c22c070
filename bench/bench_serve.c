#include "bench_serve.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvf/clientsock.h"
#include "kvf/clock.h"
#include "kvf/flags.h"
#include "kvf/log.h"
#include "kvf/model.h"
#include "kvf/msg.h"

#define SERVE_MAX_PROCS 8
#define SERVE_MAX_RATES 16

/* A length distribution: "N" (fixed) or "A:B" (uniform, inclusive). */
typedef struct {
    uint32_t lo, hi;
} len_dist_t;

static bool parse_dist(const char *text, len_dist_t *d)
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

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double unit(uint64_t *s)
{
    return (double)(splitmix(s) >> 11) / 9007199254740992.0;
}

/* One request of the trace and what happened to it. */
typedef struct {
    double at_s;        /* arrival, from the start of the run */
    uint32_t *prompt;   /* (n_prompt) */
    uint32_t n_prompt;
    uint32_t max_tokens;
    uint64_t t_sent, t_first, t_last, t_done; /* ns */
    uint32_t n_tokens;
    int finish;         /* -1 while running */
    bool sent;
} trace_req_t;

typedef struct {
    double rate;     /* Poisson arrivals (req/s); 0 in a closed loop */
    int concurrency; /* closed loop: requests kept in flight; 0 for Poisson */
    double duration_s;
    size_t n_sent; /* fewer than the trace's when a signal stopped the run */
    size_t n_ok, n_failed;
    double req_per_s, tok_per_s, goodput;
    double ttft[3], tpot[3], e2e[3]; /* p50, p90, p99 in ms */
} serve_result_t;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void percentiles(double *v, size_t n, double out[3])
{
    if (!n) {
        out[0] = out[1] = out[2] = NAN;
        return;
    }
    qsort(v, n, sizeof(*v), cmp_double);
    static const double q[3] = {0.50, 0.90, 0.99};
    for (int i = 0; i < 3; i++) {
        size_t k = (size_t)ceil(q[i] * (double)n) - 1;
        out[i] = v[k < n ? k : n - 1];
    }
}

/* Set by the first SIGINT or SIGTERM: send no more requests, let the ones
 * sent finish and report on them. A second signal ends the process. */
static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

/* Runs the trace against the router's client socket: each request at its
 * arrival time, or with concurrency > 0 in a closed loop (arrival times
 * ignored): concurrency requests in flight, the next sent as one ends.
 * Once stop_requested, only the requests already sent count. */
static int run_trace(const char *client_url, trace_req_t *reqs, size_t n, int concurrency,
                     double slo_ttft_ms, double slo_tpot_ms, int timeout_s, serve_result_t *res)
{
    kvf_client_t *client;
    if (kvf_client_create(client_url, &client) != KVF_OK) {
        fprintf(stderr, "bench serve: cannot connect to %s\n", client_url);
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        reqs[i].finish = -1;
        reqs[i].sent = false;
        reqs[i].n_tokens = 0;
        reqs[i].t_first = reqs[i].t_last = reqs[i].t_done = 0;
    }
    uint64_t base_id = kvf_clock_ns();
    uint64_t t0 = kvf_clock_ns();
    uint64_t hard_deadline = t0 + (uint64_t)timeout_s * 1000000000ull;
    size_t next = 0, done = 0;
    while (done < n && kvf_clock_ns() < hard_deadline) {
        if (stop_requested && n > next) {
            fprintf(stderr,
                    "bench serve: stopped by a signal after %zu of %zu requests; "
                    "waiting for the %zu in flight\n",
                    next, n, next - done);
            n = next;
            continue;
        }
        uint64_t now = kvf_clock_ns();
        while (next < n && (concurrency > 0 ? next - done < (size_t)concurrency
                                            : now >= t0 + (uint64_t)(reqs[next].at_s * 1e9))) {
            trace_req_t *q = &reqs[next];
            Kvf__Sampling s = KVF__SAMPLING__INIT;
            s.max_tokens = q->max_tokens;
            s.ignore_eos = true;
            Kvf__GenerateRequest g = KVF__GENERATE_REQUEST__INIT;
            g.client_req_id = base_id + next;
            g.prompt = "";
            g.prompt_ids = q->prompt;
            g.n_prompt_ids = q->n_prompt;
            g.sampling = &s;
            kvf_envelope_t env;
            kvf_envelope_init(&env, "bench-serve");
            env.body_case = KVF__ENVELOPE__BODY_GENERATE_REQUEST;
            env.generate_request = &g;
            q->t_sent = kvf_clock_ns();
            if (kvf_client_send(client, &env, 5000) != KVF_OK) {
                q->finish = 4;
                done++;
            }
            q->sent = true;
            next++;
        }
        int wait_ms = 20;
        if (next < n && concurrency <= 0) {
            int until = kvf_clock_ms_until(t0 + (uint64_t)(reqs[next].at_s * 1e9));
            wait_ms = until < wait_ms ? until : wait_ms;
        }
        kvf_envelope_t *in = NULL;
        if (kvf_client_recv(client, wait_ms, &in) != KVF_OK)
            continue;
        if (in->body_case == KVF__ENVELOPE__BODY_GENERATE_CHUNK) {
            const Kvf__GenerateChunk *c = in->generate_chunk;
            uint64_t idx = c->client_req_id - base_id;
            if (idx < n && reqs[idx].finish < 0) {
                trace_req_t *q = &reqs[idx];
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
                    done++;
                }
            }
        }
        kvf_envelope_free(in);
    }
    kvf_client_destroy(client);
    double *ttft = calloc(n, sizeof(double)), *tpot = calloc(n, sizeof(double)),
           *e2e = calloc(n, sizeof(double));
    if (!ttft || !tpot || !e2e) {
        free(ttft);
        free(tpot);
        free(e2e);
        return 1;
    }
    size_t n_ok = 0, n_tpot = 0, n_good = 0;
    uint64_t tokens = 0, t_end = t0;
    for (size_t i = 0; i < n; i++) {
        trace_req_t *q = &reqs[i];
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
    res->duration_s = (double)(t_end - t0) / 1e9;
    res->req_per_s = res->duration_s > 0 ? (double)n_ok / res->duration_s : 0;
    res->tok_per_s = res->duration_s > 0 ? (double)tokens / res->duration_s : 0;
    res->goodput = res->duration_s > 0 ? (double)n_good / res->duration_s : 0;
    percentiles(ttft, n_ok, res->ttft);
    percentiles(tpot, n_tpot, res->tpot);
    percentiles(e2e, n_ok, res->e2e);
    free(ttft);
    free(tpot);
    free(e2e);
    return done == n ? 0 : 1;
}

/* ---- launching configurations ------------------------------------------------ */

typedef struct {
    pid_t pids[SERVE_MAX_PROCS];
    int n;
    char router_url[64], client_url[64];
    char run_dir[256];
} launch_t;

static void url_free_port(char *buf, size_t len)
{
    int port = 0;
    kvf_net_free_port(&port);
    snprintf(buf, len, "tcp://127.0.0.1:%d", port);
}

static pid_t spawn(launch_t *l, const char *bin_dir, const char *log_name, char **argv)
{
    char path[512], log[512];
    snprintf(path, sizeof(path), "%s/%s", bin_dir, argv[0]);
    snprintf(log, sizeof(log), "%s/%s.log", l->run_dir, log_name);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
            close(fd);
        }
        setenv("UCX_NET_DEVICES", "lo", 0);
        execv(path, argv);
        _exit(127);
    }
    if (pid > 0 && l->n < SERVE_MAX_PROCS)
        l->pids[l->n++] = pid;
    return pid;
}

static void launch_stop(launch_t *l)
{
    for (int i = l->n - 1; i >= 0; i--)
        kill(l->pids[i], SIGTERM);
    uint64_t deadline = kvf_clock_ns() + 5000000000ull;
    for (int i = 0; i < l->n; i++) {
        while (waitpid(l->pids[i], NULL, WNOHANG) == 0) {
            if (kvf_clock_ns() > deadline) {
                kill(l->pids[i], SIGKILL);
                waitpid(l->pids[i], NULL, 0);
                break;
            }
            kvf_clock_sleep_ms(20);
        }
    }
    l->n = 0;
}

/* Waits until the router lists want live nodes. */
static bool launch_wait(const launch_t *l, int want, int timeout_ms)
{
    uint64_t deadline = kvf_clock_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (kvf_clock_ns() < deadline) {
        kvf_client_t *c;
        if (kvf_client_create(l->client_url, &c) == KVF_OK) {
            Kvf__StatsRequest sr = KVF__STATS_REQUEST__INIT;
            kvf_envelope_t env;
            kvf_envelope_init(&env, "bench-serve");
            env.body_case = KVF__ENVELOPE__BODY_STATS_REQUEST;
            env.stats_request = &sr;
            kvf_envelope_t *in = NULL;
            int live = 0;
            if (kvf_client_send(c, &env, 1000) == KVF_OK &&
                kvf_client_recv(c, 1000, &in) == KVF_OK) {
                if (in->body_case == KVF__ENVELOPE__BODY_STATS_REPLY)
                    for (size_t i = 0; i < in->stats_reply->n_nodes; i++)
                        live += !strcmp(in->stats_reply->nodes[i]->state, "live");
                kvf_envelope_free(in);
            }
            kvf_client_destroy(c);
            if (live >= want)
                return true;
        }
        kvf_clock_sleep_ms(200);
    }
    return false;
}

/* Starts a router plus either 1 prefill + 1 decode node (threads each) or
 * one colocated kvf-decode --prefill-local (2 * threads). */
static bool launch(launch_t *l, const char *bin_dir, const char *model, bool colocated,
                   int threads, const char *kv_mem, const char *run_dir)
{
    memset(l, 0, sizeof(*l));
    snprintf(l->run_dir, sizeof(l->run_dir), "%s", run_dir);
    mkdir(run_dir, 0755);
    url_free_port(l->router_url, sizeof(l->router_url));
    url_free_port(l->client_url, sizeof(l->client_url));
    char *router_argv[] = {"kvf-router", "--listen", l->router_url, "--client", l->client_url,
                           "--model", (char *)model, NULL};
    spawn(l, bin_dir, colocated ? "colocated-router" : "split-router", router_argv);
    char t1[16], t2[16], u1[64], u2[64];
    snprintf(t1, sizeof(t1), "%d", threads);
    snprintf(t2, sizeof(t2), "%d", 2 * threads);
    url_free_port(u1, sizeof(u1));
    url_free_port(u2, sizeof(u2));
    if (colocated) {
        char *argv[] = {"kvf-decode", "--router", l->router_url, "--listen", u1, "--model",
                        (char *)model, "--threads", t2, "--prefill-local", "--kv-mem",
                        (char *)kv_mem, "--node-id", "colocated-0", NULL};
        spawn(l, bin_dir, "colocated-decode", argv);
    } else {
        char *dargv[] = {"kvf-decode", "--router", l->router_url, "--listen", u1, "--model",
                         (char *)model, "--threads", t1, "--kv-mem", (char *)kv_mem,
                         "--node-id", "decode-0", NULL};
        char *pargv[] = {"kvf-prefill", "--router", l->router_url, "--listen", u2, "--model",
                         (char *)model, "--threads", t1, "--node-id", "prefill-0", NULL};
        spawn(l, bin_dir, "split-decode", dargv);
        spawn(l, bin_dir, "split-prefill", pargv);
    }
    if (!launch_wait(l, colocated ? 1 : 2, 120000)) {
        fprintf(stderr, "bench serve: the %s configuration did not come up (logs in %s)\n",
                colocated ? "colocated" : "split", run_dir);
        launch_stop(l);
        return false;
    }
    return true;
}

/* ---- output ------------------------------------------------------------------- */

static void print_row(const char *config, const serve_result_t *r)
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

/* A comma-separated list of at most max levels: positive rates, or with
 * integers, whole numbers >= 1 (concurrencies). Returns their number, or
 * -1 on a malformed list. */
static int parse_levels(const char *text, bool integers, double *out, int max)
{
    int n = 0;
    const char *p = text;
    for (;;) {
        char *end;
        errno = 0;
        double v = strtod(p, &end);
        if (end == p || errno || !(v > 0) || n == max || (integers && (v != floor(v) || v > 1e6)))
            return -1;
        out[n++] = v;
        if (*end == '\0')
            return n;
        if (*end != ',')
            return -1;
        p = end + 1;
    }
}

static void print_header(bool closed)
{
    printf("%-10s %6s %7s %8s %8s | %8s %8s %8s | %7s %7s %7s | %8s %8s %8s | %3s\n", "config",
           closed ? "flight" : "rate", "req/s", "tok/s", "goodput", "ttft50", "ttft90", "ttft99",
           "tpot50", "tpot90", "tpot99", "e2e50", "e2e90", "e2e99", "err");
}

static void json_result(FILE *f, const serve_result_t *r)
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

static void write_plot(const char *png, const serve_result_t *split, const serve_result_t *colo,
                       int n_rates, const char *run_dir)
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

int kvf_bench_serve(int argc, char **argv)
{
    const char *router = NULL, *model = NULL, *rates_text = NULL, *conc_text = NULL,
               *prompt_len = "128:512", *output_len = "32:128", *json = NULL, *plot = NULL,
               *kv_mem = "1G", *run_dir = "/tmp/kvf-bench-serve";
    int n_requests = 32, threads = 1, timeout_s = 600;
    uint64_t seed = 1;
    double slo_ttft = 2000, slo_tpot = 200;
    bool compare = false;
    kvf_flag_t flags[] = {
        {"router", KVF_FLAG_STRING, &router, "URL",
         "router client URL of a running cluster (else one is started)", NULL},
        {"model", KVF_FLAG_STRING, &model, "DIR", "model directory (required)", NULL},
        {"rate", KVF_FLAG_STRING, &rates_text, "R[,R...]",
         "request rates (req/s) to run, Poisson arrivals (default: 1)", NULL},
        {"concurrency", KVF_FLAG_STRING, &conc_text, "C[,C...]",
         "closed loop instead of --rate: C requests in flight, the next sent as one finishes "
         "(the capacity at C)",
         NULL},
        {"requests", KVF_FLAG_INT, &n_requests, "N", "requests per rate", NULL},
        {"prompt-len", KVF_FLAG_STRING, &prompt_len, "N|A:B", "prompt lengths (tokens)", NULL},
        {"output-len", KVF_FLAG_STRING, &output_len, "N|A:B", "output lengths (tokens)", NULL},
        {"seed", KVF_FLAG_UINT64, &seed, "S", "trace seed", NULL},
        {"slo-ttft", KVF_FLAG_DOUBLE, &slo_ttft, "MS", "TTFT SLO for goodput", NULL},
        {"slo-tpot", KVF_FLAG_DOUBLE, &slo_tpot, "MS", "time-per-output-token SLO", NULL},
        {"compare-colocated", KVF_FLAG_BOOL, &compare, NULL,
         "also run the trace on one kvf-decode --prefill-local with the same threads", NULL},
        {"threads", KVF_FLAG_INT, &threads, "N",
         "threads per node of a started split cluster (colocated: 2N)", NULL},
        {"kv-mem", KVF_FLAG_STRING, &kv_mem, "BYTES", "KV pool of started decode nodes", NULL},
        {"run-dir", KVF_FLAG_STRING, &run_dir, "DIR", "logs of started processes", NULL},
        {"timeout", KVF_FLAG_INT, &timeout_s, "S", "longest run per rate", NULL},
        {"json", KVF_FLAG_STRING, &json, "FILE", "write the results as JSON", NULL},
        {"plot", KVF_FLAG_STRING, &plot, "FILE.png", "latency and goodput vs rate (gnuplot)",
         NULL},
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
    len_dist_t pl, ol;
    if (!model || !parse_dist(prompt_len, &pl) || !parse_dist(output_len, &ol) ||
        n_requests < 1 || threads < 1) {
        fprintf(stderr, "%s: --model is required; lengths are N or A:B (see --help)\n", argv[0]);
        return 2;
    }
    kvf_model_config_t cfg;
    if (kvf_model_config_load(model, &cfg) != KVF_OK)
        return 1;
    if (pl.hi + ol.hi >= (uint32_t)cfg.max_pos) {
        fprintf(stderr, "%s: prompt + output lengths exceed the context (%d)\n", argv[0],
                cfg.max_pos);
        return 2;
    }
    if (rates_text && conc_text) {
        fprintf(stderr, "%s: --rate and --concurrency exclude each other\n", argv[0]);
        return 2;
    }
    /* The load levels: Poisson rates, or closed-loop concurrencies. */
    bool closed = conc_text != NULL;
    const char *levels_text = closed ? conc_text : rates_text ? rates_text : "1";
    double rates[SERVE_MAX_RATES];
    int n_rates = parse_levels(levels_text, closed, rates, SERVE_MAX_RATES);
    if (n_rates < 1) {
        fprintf(stderr, "%s: bad --%s '%s' (at most %d values)\n", argv[0],
                closed ? "concurrency" : "rate", levels_text, SERVE_MAX_RATES);
        return 2;
    }
    char bin_dir[512];
    ssize_t bl = readlink("/proc/self/exe", bin_dir, sizeof(bin_dir) - 1);
    if (bl <= 0)
        return 1;
    bin_dir[bl] = '\0';
    char *slash = strrchr(bin_dir, '/');
    if (slash)
        *slash = '\0';

    /* The trace: the same for every rate and configuration, but arrival
     * times scaled by the rate. */
    trace_req_t *reqs = calloc((size_t)n_requests, sizeof(*reqs));
    if (!reqs)
        return 1;
    uint64_t rng = seed;
    double t = 0;
    double *gaps = calloc((size_t)n_requests, sizeof(double));
    for (int i = 0; i < n_requests; i++) {
        trace_req_t *q = &reqs[i];
        gaps[i] = -log(1.0 - unit(&rng)); /* exponential, mean 1 */
        q->n_prompt = pl.lo + (uint32_t)(splitmix(&rng) % (pl.hi - pl.lo + 1));
        q->max_tokens = ol.lo + (uint32_t)(splitmix(&rng) % (ol.hi - ol.lo + 1));
        q->prompt = malloc(q->n_prompt * sizeof(uint32_t));
        if (!q->prompt)
            return 1;
        for (uint32_t k = 0; k < q->n_prompt; k++)
            q->prompt[k] = (uint32_t)(splitmix(&rng) % (uint64_t)(cfg.vocab > 3 ? cfg.vocab - 3 : 1));
        if (cfg.bos_id >= 0)
            q->prompt[0] = (uint32_t)cfg.bos_id;
    }
    serve_result_t split[SERVE_MAX_RATES], colo[SERVE_MAX_RATES];
    memset(split, 0, sizeof(split));
    memset(colo, 0, sizeof(colo));
    int configs = compare ? 2 : 1;
    int failed = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = (int)SA_RESETHAND; /* a second signal ends the process */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    for (int c = 0; c < configs && !stop_requested; c++) {
        bool colocated = c == 1;
        int levels_run = 0;
        launch_t l;
        const char *url = router;
        if (!router || colocated) {
            if (!launch(&l, bin_dir, model, colocated, threads, kv_mem, run_dir)) {
                failed = 1;
                break;
            }
            url = l.client_url;
        }
        for (int ri = 0; ri < n_rates && !stop_requested; ri++) {
            serve_result_t *res = colocated ? &colo[ri] : &split[ri];
            levels_run = ri + 1;
            int concurrency = closed ? (int)rates[ri] : 0;
            res->rate = closed ? 0 : rates[ri];
            res->concurrency = concurrency;
            t = 0;
            for (int i = 0; i < n_requests; i++) {
                t += closed ? 0 : gaps[i] / rates[ri];
                reqs[i].at_s = t;
            }
            if (closed)
                fprintf(stderr, "bench serve: %s, closed loop, %d in flight, %d requests\n",
                        colocated ? "colocated" : "split", concurrency, n_requests);
            else
                fprintf(stderr, "bench serve: %s, rate %g req/s, %d requests\n",
                        colocated ? "colocated" : "split", rates[ri], n_requests);
            if (run_trace(url, reqs, (size_t)n_requests, concurrency, slo_ttft, slo_tpot,
                          timeout_s, res))
                failed = 1;
        }
        if (!router || colocated)
            launch_stop(&l);
        if (stop_requested) {
            /* Report the levels that ran: in split, those it reached (and
             * no colocated run); in colocated, those both reached. */
            if (!colocated || levels_run == 0)
                compare = false;
            if (!colocated || levels_run > 0)
                n_rates = levels_run;
        }
    }
    printf("\nserving benchmark: %d requests per %s, prompt %s, output %s tokens, seed %llu, "
           "SLO ttft %.0f ms / tpot %.0f ms\n(latencies in ms; goodput in requests/s meeting "
           "both SLOs%s)\n\n",
           n_requests, closed ? "concurrency" : "rate", prompt_len, output_len,
           (unsigned long long)seed, slo_ttft, slo_tpot,
           closed ? "; closed loop: flight = requests kept in flight" : "");
    print_header(closed);
    for (int ri = 0; ri < n_rates; ri++) {
        print_row("split", &split[ri]);
        if (compare) {
            print_row("colocated", &colo[ri]);
            printf("%-10s %6s %7.2f %8.2f %8.2f | %8.2f %8.2f %8.2f | %7.2f %7.2f %7.2f | %8.2f "
                   "%8.2f %8.2f |\n",
                   "colo/split", "", colo[ri].req_per_s / split[ri].req_per_s,
                   colo[ri].tok_per_s / split[ri].tok_per_s, colo[ri].goodput / split[ri].goodput,
                   colo[ri].ttft[0] / split[ri].ttft[0], colo[ri].ttft[1] / split[ri].ttft[1],
                   colo[ri].ttft[2] / split[ri].ttft[2], colo[ri].tpot[0] / split[ri].tpot[0],
                   colo[ri].tpot[1] / split[ri].tpot[1], colo[ri].tpot[2] / split[ri].tpot[2],
                   colo[ri].e2e[0] / split[ri].e2e[0], colo[ri].e2e[1] / split[ri].e2e[1],
                   colo[ri].e2e[2] / split[ri].e2e[2]);
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
        printf("\ngoodput peaks at %g %s for split (%.3f req/s)", rates[best_s],
               closed ? "in flight" : "req/s", split[best_s].goodput);
        if (compare)
            printf(" and at %g %s for colocated (%.3f req/s)", rates[best_c],
                   closed ? "in flight" : "req/s", colo[best_c].goodput);
        printf("\n");
    }
    if (json) {
        FILE *f = fopen(json, "w");
        if (f) {
            fprintf(f, "{\"requests\": %d, \"prompt_len\": \"%s\", \"output_len\": \"%s\", "
                       "\"seed\": %llu, \"slo_ttft_ms\": %g, \"slo_tpot_ms\": %g, \"split\": [",
                    n_requests, prompt_len, output_len, (unsigned long long)seed, slo_ttft,
                    slo_tpot);
            for (int ri = 0; ri < n_rates; ri++) {
                fprintf(f, ri ? ", " : "");
                json_result(f, &split[ri]);
            }
            fprintf(f, "]");
            if (compare) {
                fprintf(f, ", \"colocated\": [");
                for (int ri = 0; ri < n_rates; ri++) {
                    fprintf(f, ri ? ", " : "");
                    json_result(f, &colo[ri]);
                }
                fprintf(f, "]");
            }
            fprintf(f, "}\n");
            fclose(f);
        }
    }
    if (plot)
        write_plot(plot, split, compare ? colo : NULL, n_rates, run_dir);
    for (int i = 0; i < n_requests; i++)
        free(reqs[i].prompt);
    free(reqs);
    free(gaps);
    return failed;
}
