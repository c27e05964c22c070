/* kvf_soak: the driver of bench/soak.sh. Makes a small random model,
 * computes the pool's colocated references, starts a router (HTTP on a
 * free port) with 2 prefill and 2 decode nodes on 127.0.0.1, runs the
 * load and the chaos for --duration seconds, lets the requests in flight
 * end, reports and stops every process it started. Exits 0 when every
 * check passed. See soak.h for the parts. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvf/clock.h"
#include "kvf/flags.h"
#include "kvf/log.h"
#include "kvf/msg.h"
#include "soak.h"

#define SOAK_ABORTS_PER_600S 1000

/* Where a signal asks the load to stop: set once by main. */
static atomic_bool *stop_on_signal;

static void on_signal(int sig)
{
    (void)sig;
    if (stop_on_signal)
        atomic_store(stop_on_signal, true);
}

/* Kills whatever is still running when the process exits (a failed harness
 * assertion exits from anywhere). */
static void kill_leftovers(void)
{
    h_teardown(NULL);
}

static int parse_flags(kvf_soak_t *s, int argc, char **argv, const char **ucx_tls_p)
{
    double duration = 600;
    uint64_t seed = 1;
    int lease_ms = 3000, inflight = 6, abort_inflight = 3, aborts = -1;
    kvf_flag_t flags[] = {
        {"duration", KVF_FLAG_DOUBLE, &duration, "S", "seconds of load (default 600)", NULL},
        {"seed", KVF_FLAG_UINT64, &seed, "N", "prompts, request kinds, abort points and chaos",
         NULL},
        {"lease-ms", KVF_FLAG_INT, &lease_ms, "MS", "the decode nodes' --lease-ms (3000)", NULL},
        {"inflight", KVF_FLAG_INT, &inflight, "N", "requests in flight that run to the end (6)",
         NULL},
        {"abort-inflight", KVF_FLAG_INT, &abort_inflight, "N",
         "abort-bound streams in flight at most (3)", NULL},
        {"aborts", KVF_FLAG_INT, &aborts, "N",
         "client aborts over the run (default 1000 per 600 s of duration)", NULL},
        {"ucx-tls", KVF_FLAG_STRING, ucx_tls_p, "TLS", "UCX_TLS of the nodes (default sm,self)",
         NULL},
        {"cluster-key-file", KVF_FLAG_STRING, &s->key_file, "PATH",
         "run the cluster (and the native clients) with this cluster key", NULL},
    };
    kvf_flagset_t set = {
        .prog = "kvf_soak",
        .usage = "[--duration S] [options]",
        .summary = "Soak test of a 2 prefill + 2 decode cluster on 127.0.0.1: native and HTTP "
                   "generations, client aborts, node kills and restarts, one drain; checks "
                   "outputs against the colocated reference, KV blocks and memory at the end.",
        .flags = flags,
        .n_flags = KVF_NFLAGS(flags),
    };
    int rc = kvf_flags_parse(&set, argc, argv);
    if (rc != KVF_FLAGS_RUN)
        return rc == KVF_FLAGS_EXIT ? 0 : 2;
    if (!(duration >= 10) || lease_ms < 100 || inflight < 1 || abort_inflight < 1 ||
        inflight + abort_inflight > 64) {
        fprintf(stderr, "kvf_soak: --duration >= 10, --lease-ms >= 100, --inflight and "
                        "--abort-inflight >= 1 (64 in all)\n");
        return 2;
    }
    s->duration_s = duration;
    s->seed = seed;
    s->lease_ms = lease_ms;
    s->inflight = inflight;
    s->abort_inflight = abort_inflight;
    s->aborts_target =
        aborts >= 0 ? (unsigned)aborts : (unsigned)((SOAK_ABORTS_PER_600S * duration + 599) / 600);
    s->warm_s = duration / 10;
    s->drain_bound_s = 100; /* past the router's --request-timeout-ms below */
    s->stall_s = 90;
    snprintf(s->lease_flag, sizeof(s->lease_flag), "%d", lease_ms);
    return -1;
}

/* The model (4 layers, hidden 256, vocab 512: small enough for two CPU
 * cores to serve four nodes) and its references. */
static bool make_model(kvf_soak_t *s)
{
    snprintf(s->scratch, sizeof(s->scratch), "/tmp/kvf-soak-XXXXXX");
    if (!mkdtemp(s->scratch)) {
        perror("kvf_soak: mkdtemp");
        return false;
    }
    snprintf(s->model, sizeof(s->model), "%s/model", s->scratch);
    h_mkmodel(s->model, "--layers 4 --hidden 256 --heads 4 --kv-heads 2 --inter 512 --vocab 512 "
                        "--max-pos 2048 --seed 21");
    uint64_t t0 = kvf_clock_ns();
    if (!kvf_soak_pool_init(s))
        return false;
    fprintf(stderr, "soak: %d prompts, colocated references in %.1f s\n", KVF_SOAK_POOL,
            (double)(kvf_clock_ns() - t0) / 1e9);
    return true;
}

static bool start_cluster(kvf_soak_t *s, const char *ucx_tls)
{
    if (kvf_net_free_port(&s->http_port) != KVF_OK) {
        fprintf(stderr, "kvf_soak: no free port for HTTP\n");
        return false;
    }
    char http[32];
    snprintf(http, sizeof(http), "127.0.0.1:%d", s->http_port);
    h_cluster_init(&s->cluster, s->model, ucx_tls);
    if (s->key_file)
        h_cluster_key(&s->cluster, s->key_file);
    /* A request still unfinished after 60 s fails with the router's error
     * (before the driver's stall limit would call it lost). */
    h_start_router(&s->cluster, "--http", http, "--request-timeout-ms", "60000", NULL);
    kvf_soak_chaos_start_nodes(s);
    h_wait_nodes(&s->cluster, 4, 120000);
    fprintf(stderr,
            "soak: router (HTTP %s, native %s) and 4 nodes live, control plane %s; logs in %s\n",
            http, s->cluster.client_url, s->key_file ? "keyed" : "not keyed", s->cluster.dir);
    return true;
}

/* The load on this thread, the chaos on another, for the duration. */
static void run(kvf_soak_t *s)
{
    s->t0_ns = kvf_clock_ns();
    pthread_t chaos;
    KVF_ASSERT(pthread_create(&chaos, NULL, kvf_soak_chaos_main, s) == 0);
    kvf_soak_load_run(s);
    atomic_store(&s->stop_chaos, true);
    pthread_join(chaos, NULL);
    fprintf(stderr, "soak: [%7.1f s] load and chaos over\n", kvf_soak_elapsed_s(s));
}

/* A node restarted just before the end may still be starting (its signal
 * handlers not yet installed): the stop waits until the router lists the
 * 4 nodes live again, for at most 60 s. */
static void wait_nodes_live(kvf_soak_t *s)
{
    uint64_t until = kvf_clock_ns() + 60000000000ull;
    h_node_stats_t st[H_MAX_PROCS];
    while (kvf_clock_ns() < until) {
        int n = h_stats(&s->cluster, st, H_MAX_PROCS), live = 0;
        for (int i = 0; i < n && i < H_MAX_PROCS; i++)
            live += !strcmp(st[i].state, "live");
        if (live >= 4)
            return;
        kvf_clock_sleep_ms(100);
    }
    fprintf(stderr, "soak: not every node live again before the stop\n");
}

/* The processes are stopped: logs are kept when anything failed. */
static void clean_up(kvf_soak_t *s, bool keep)
{
    if (keep || getenv("KVF_SOAK_KEEP_LOGS"))
        printf("logs kept in %s\n", s->cluster.dir);
    else
        h_cluster_stop(&s->cluster, false); /* nothing runs any more: removes the logs */
    h_rmmodel(s->scratch);
    kvf_soak_pool_fini(s);
}

int main(int argc, char **argv)
{
    kvf_soak_t *s = calloc(1, sizeof(*s));
    KVF_ASSERT(s);
    const char *ucx_tls = "sm,self";
    int rc = parse_flags(s, argc, argv, &ucx_tls);
    if (rc >= 0) {
        free(s);
        return rc;
    }
    atexit(kill_leftovers);
    stop_on_signal = &s->stop_load;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!make_model(s) || !start_cluster(s, ucx_tls)) {
        h_rmmodel(s->scratch);
        return 1;
    }
    run(s);
    int failed = kvf_soak_report(s);
    printf("\n== stop ==\n");
    wait_nodes_live(s);
    int unclean = kvf_soak_stop_all(s);
    printf("%d processes stopped; %d did not exit 0\n", s->cluster.n_procs, unclean);
    if (unclean)
        failed++;
    printf("\nsoak: %s (%d failed checks)\n", failed ? "FAILED" : "passed", failed);
    clean_up(s, failed != 0);
    free(s);
    return failed ? 1 : 0;
}
