/* The probes of kvf simulate --profile measure and kvf bench sim-check
 * that are not benchmarks of their own: this host's CPU time (what other
 * programs take of it), and what one control message costs between two
 * processes (docs/simulator.md, "Profiles"). See sim_measure.h. */
#include "sim_measure.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvf/clock.h"
#include "kvf/msg.h"

/* Round trips timed, after the first ones (connections set up). */
#define PROBE_MSG_WARMUP 20
#define PROBE_MSG_TRIPS  200
#define PROBE_MSG_WAIT_MS 5000

bool kvf_sim_host_cpu(double *busy_s_p, double *cpus_p)
{
    FILE *f = fopen("/proc/stat", "r");
    if (!f)
        return false;
    unsigned long long v[8] = {0};
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                   &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    long hz = sysconf(_SC_CLK_TCK), cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 5 || hz <= 0 || cpus < 1)
        return false;
    /* user nice system idle iowait irq softirq steal */
    unsigned long long busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
    *busy_s_p = (double)busy / (double)hz;
    *cpus_p = (double)cpus;
    return true;
}

/* A small control message (a Cancel) from sender to the inbox at to. */
static kvf_status_t probe_send(kvf_outbox_t *out, const char *sender, uint64_t n)
{
    Kvf__Cancel c = KVF__CANCEL__INIT;
    c.req_id = n;
    c.reason = "probe";
    kvf_envelope_t env;
    kvf_envelope_init(&env, sender);
    env.body_case = KVF__ENVELOPE__BODY_CANCEL;
    env.cancel = &c;
    return kvf_outbox_send(out, &env, PROBE_MSG_WAIT_MS);
}

static kvf_status_t probe_recv(kvf_inbox_t *in)
{
    kvf_envelope_t *env = NULL;
    kvf_status_t st = kvf_inbox_recv(in, PROBE_MSG_WAIT_MS, &env);
    kvf_envelope_free(env);
    return st;
}

/* The echoing process: every message to mine goes back to theirs. */
static void probe_echo(const char *mine, const char *theirs)
{
    kvf_inbox_t *in = NULL;
    kvf_outbox_t *out = NULL;
    int rc = 1;
    if (kvf_inbox_create(mine, 0, &in) != KVF_OK || kvf_outbox_create(theirs, &out) != KVF_OK)
        goto done;
    for (int i = 0; i < PROBE_MSG_WARMUP + PROBE_MSG_TRIPS; i++)
        if (probe_recv(in) != KVF_OK || probe_send(out, "probe-echo", (uint64_t)i) != KVF_OK)
            goto done;
    rc = 0;
done:
    kvf_clock_sleep_ms(50); /* the last message leaves (nanomsg has no linger) */
    kvf_outbox_destroy(out);
    kvf_inbox_destroy(in);
    _exit(rc);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of the timed round trips to the echoing process. */
static bool probe_trips(const char *mine, const char *theirs, double *rtt_p)
{
    kvf_inbox_t *in = NULL;
    kvf_outbox_t *out = NULL;
    double rtt[PROBE_MSG_TRIPS];
    bool ok = false;
    if (kvf_inbox_create(mine, 0, &in) != KVF_OK || kvf_outbox_create(theirs, &out) != KVF_OK)
        goto done;
    for (int i = 0; i < PROBE_MSG_WARMUP + PROBE_MSG_TRIPS; i++) {
        uint64_t t0 = kvf_clock_ns();
        if (probe_send(out, "probe", (uint64_t)i) != KVF_OK || probe_recv(in) != KVF_OK)
            goto done;
        if (i >= PROBE_MSG_WARMUP)
            rtt[i - PROBE_MSG_WARMUP] = (double)(kvf_clock_ns() - t0) / 1e9;
    }
    qsort(rtt, PROBE_MSG_TRIPS, sizeof(double), cmp_double);
    *rtt_p = rtt[PROBE_MSG_TRIPS / 2];
    ok = true;
done:
    kvf_outbox_destroy(out);
    kvf_inbox_destroy(in);
    return ok;
}

bool kvf_sim_probe_msg(double *latency_s_p)
{
    int pa = 0, pb = 0;
    if (kvf_net_free_port(&pa) != KVF_OK || kvf_net_free_port(&pb) != KVF_OK)
        return false;
    char a[64], b[64];
    snprintf(a, sizeof(a), "tcp://127.0.0.1:%d", pa);
    snprintf(b, sizeof(b), "tcp://127.0.0.1:%d", pb);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return false;
    if (pid == 0)
        probe_echo(b, a);
    double rtt = 0;
    bool ok = probe_trips(a, b, &rtt);
    if (!ok)
        kill(pid, SIGTERM);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        ;
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (ok)
        *latency_s_p = rtt / 2;
    return ok;
}
