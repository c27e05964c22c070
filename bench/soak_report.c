/* The soak's end: KV blocks in use on every live node (after at most a
 * lease + 1 s), the memory at the end against the warm point, the
 * router's counters, then the tables and the checks. See soak.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "kvf/clientsock.h"
#include "kvf/clock.h"
#include "kvf/msg.h"
#include "soak.h"

#define REPORT_RSS_DRIFT_MAX 0.10

static const char *const outcome_names[KVF_SOAK_OUTCOMES] = {"same", "differs", "failed", "aborted",
                                                             "lost"};

const char *kvf_soak_kind_name(kvf_soak_kind_t kind)
{
    static const char *const names[KVF_SOAK_KINDS] = {"native", "http stream", "http whole"};
    return names[kind];
}

double kvf_soak_elapsed_s(const kvf_soak_t *s)
{
    return s->t0_ns ? (double)(kvf_clock_ns() - s->t0_ns) / 1e9 : 0.0;
}

/* What the router said at the end. */
typedef struct {
    bool ok;
    uint64_t total, running, queued, failed, cancelled, stale, redispatched;
} router_counts_t;

typedef struct {
    h_node_stats_t nodes[H_MAX_PROCS];
    h_node_stats_t first[H_MAX_PROCS]; /* the first look, as the load ended */
    int n, n_first;
    unsigned busy; /* live nodes with blocks in use */
    double waited_s, limit_s;
} blocks_t;

/* ---- measuring ------------------------------------------------------------------- */

static void wait_blocks(kvf_soak_t *s, blocks_t *b)
{
    b->limit_s = s->lease_ms / 1000.0 + 1.0;
    uint64_t t0 = kvf_clock_ns();
    uint64_t deadline = t0 + (uint64_t)(b->limit_s * 1e9);
    for (;;) {
        int n = h_stats(&s->cluster, b->nodes, H_MAX_PROCS);
        b->n = n < 0 ? 0 : n < H_MAX_PROCS ? n : H_MAX_PROCS;
        b->busy = n < 0;
        for (int i = 0; i < b->n; i++)
            b->busy += b->nodes[i].blocks_used != 0 && strcmp(b->nodes[i].state, "dead") != 0;
        b->waited_s = (double)(kvf_clock_ns() - t0) / 1e9;
        if (b->n_first == 0) {
            memcpy(b->first, b->nodes, sizeof(b->first));
            b->n_first = b->n;
        }
        if (!b->busy || kvf_clock_ns() >= deadline)
            return;
        kvf_clock_sleep_ms(100);
    }
}

static void read_router(kvf_soak_t *s, router_counts_t *rc)
{
    *rc = (router_counts_t){0};
    kvf_client_t *client;
    if (kvf_client_create(s->cluster.client_url, &client) != KVF_OK)
        return;
    kvf_envelope_t *in = NULL;
    if (kvf_client_stats(client, "soak", 2000, &in) == KVF_OK) {
        const Kvf__StatsReply *r = in->stats_reply;
        *rc = (router_counts_t){.ok = true,
                                .total = r->requests_total,
                                .running = r->requests_running,
                                .queued = r->requests_queued,
                                .failed = r->requests_failed,
                                .cancelled = r->requests_cancelled,
                                .stale = r->stale_dropped,
                                .redispatched = r->redispatched};
        kvf_envelope_free(in);
    }
    kvf_client_destroy(client);
}

/* The end sample: each process of the warm sample that is still the same
 * process (same pid in its slot) lived through the whole window. */
static void end_rss(kvf_soak_t *s)
{
    for (int i = 0; i < s->n_rss; i++) {
        kvf_soak_rss_t *r = &s->rss[i];
        int k = h_find(&s->cluster, r->name);
        if (k >= 0 && s->cluster.procs[k].pid == r->pid)
            r->end_kib = kvf_soak_rss_kib(r->pid);
    }
}

/* ---- tables ---------------------------------------------------------------------- */

static void print_requests(const kvf_soak_t *s)
{
    const kvf_soak_tally_t *t = &s->tally;
    printf("\n== requests: %.0f s, seed %llu, %d steady + up to %d abort-bound in flight; lease "
           "%d ms, UCX_TLS %s ==\n",
           s->duration_s, (unsigned long long)s->seed, s->inflight, s->abort_inflight, s->lease_ms,
           s->cluster.ucx_tls ? s->cluster.ucx_tls : "(UCX's choice)");
    printf("%-12s %8s %9s %8s %7s %7s %8s %6s\n", "kind", "sent", "completed", "=coloc", "differ",
           "failed", "aborted", "lost");
    uint64_t sum[KVF_SOAK_OUTCOMES] = {0}, sent = 0;
    for (int k = 0; k <= KVF_SOAK_KINDS; k++) {
        const uint64_t *n = k < KVF_SOAK_KINDS ? t->n[k] : sum;
        uint64_t sk = k < KVF_SOAK_KINDS ? t->sent[k] : sent;
        printf("%-12s %8llu %9llu %8llu %7llu %7llu %8llu %6llu\n",
               k < KVF_SOAK_KINDS ? kvf_soak_kind_name((kvf_soak_kind_t)k) : "total",
               (unsigned long long)sk, (unsigned long long)(n[KVF_SOAK_SAME] + n[KVF_SOAK_DIFF]),
               (unsigned long long)n[KVF_SOAK_SAME], (unsigned long long)n[KVF_SOAK_DIFF],
               (unsigned long long)n[KVF_SOAK_FAILED], (unsigned long long)n[KVF_SOAK_ABORTED],
               (unsigned long long)n[KVF_SOAK_LOST]);
        if (k < KVF_SOAK_KINDS) {
            for (int o = 0; o < KVF_SOAK_OUTCOMES; o++)
                sum[o] += n[o];
            sent += sk;
        }
    }
    printf("abort-bound requests that finished before their abort point: %llu; native tokens "
           "received: %llu\n",
           (unsigned long long)t->abort_misses, (unsigned long long)t->native_tokens);
}

static void print_notes(const kvf_soak_tally_t *t)
{
    if (!t->n_notes)
        return;
    printf("\n== messages (grouped: # stands for any number; one example each) ==\n");
    printf("%6s %-11s %-8s %-5s %s\n", "count", "kind", "outcome", "clear", "example");
    for (int i = 0; i < t->n_notes; i++) {
        const kvf_soak_note_t *n = &t->notes[i];
        printf("%6u %-11s %-8s %-5s %s\n", n->count, kvf_soak_kind_name(n->kind),
               outcome_names[n->outcome],
               n->outcome == KVF_SOAK_FAILED ? (n->clear ? "yes" : "NO") : "-", n->example);
    }
    if (t->notes_dropped)
        printf("(%llu more messages of other kinds not kept)\n",
               (unsigned long long)t->notes_dropped);
}

static void print_cluster(const kvf_soak_t *s, const router_counts_t *rc, const blocks_t *b)
{
    const kvf_soak_chaos_t *ch = &s->chaos;
    printf("\n== chaos ==\nSIGKILL: %u prefill, %u decode; restarts %u; a kill put off (no "
           "eligible node) %u times\n",
           ch->kills[0], ch->kills[1], ch->restarts, ch->skipped);
    if (ch->drain_started)
        printf("drain: %s at %.1f s, %s after %.1f s (status 0x%x); replacement %s\n", ch->drained,
               ch->drain_at_s, ch->drain_clean ? "exit 0" : "NOT a clean exit", ch->drain_s,
               (unsigned)ch->drain_status, ch->replacement);
    else
        printf("drain: not started (no eligible node in time)\n");
    if (rc->ok)
        printf("router: %llu requests, %llu failed, %llu cancelled, %llu attempts re-dispatched, "
               "%llu stale messages dropped; %llu running, %llu queued at the end\n",
               (unsigned long long)rc->total, (unsigned long long)rc->failed,
               (unsigned long long)rc->cancelled, (unsigned long long)rc->redispatched,
               (unsigned long long)rc->stale, (unsigned long long)rc->running,
               (unsigned long long)rc->queued);
    else
        printf("router: no stats reply\n");
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("driver: %.1f s user, %.1f s system CPU\n",
           (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6,
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6);
    printf("\n== KV blocks at the end (after %.1f s of at most %.1f s; dead: a killed instance, "
           "not checked) ==\n",
           b->waited_s, b->limit_s);
    printf("%-12s %-8s %-9s %13s %12s\n", "node", "role", "state", "used at first", "used/total");
    for (int i = 0; i < b->n; i++) {
        unsigned first = 0;
        for (int k = 0; k < b->n_first; k++)
            if (!strcmp(b->first[k].id, b->nodes[i].id))
                first = b->first[k].blocks_used;
        printf("%-12s %-8s %-9s %13u %5u/%-6u\n", b->nodes[i].id,
               b->nodes[i].role == KVF__ROLE__ROLE_DECODE ? "decode" : "prefill", b->nodes[i].state,
               first, b->nodes[i].blocks_used, b->nodes[i].blocks_total);
    }
}

static void print_rss(const kvf_soak_t *s)
{
    printf("\n== memory: VmRSS at the warm point (%.0f s) and at the end ==\n", s->warm_s);
    printf("%-12s %8s %10s %10s %8s\n", "process", "pid", "warm KiB", "end KiB", "drift");
    for (int i = 0; i < s->n_rss; i++) {
        const kvf_soak_rss_t *r = &s->rss[i];
        if (r->end_kib < 0 || r->warm_kib <= 0) {
            printf("%-12s %8d %10ld %10s %8s\n", r->name, (int)r->pid, r->warm_kib, "-", "(gone)");
            continue;
        }
        printf("%-12s %8d %10ld %10ld %+7.1f%%\n", r->name, (int)r->pid, r->warm_kib, r->end_kib,
               100.0 * (double)(r->end_kib - r->warm_kib) / (double)r->warm_kib);
    }
    if (!s->n_rss)
        printf("(no warm sample: the run ended first)\n");
}

/* ---- checks ---------------------------------------------------------------------- */

static int check(const char *what, const char *value, const char *limit, bool ok)
{
    printf("%-40s %14s %10s   %s\n", what, value, limit, ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
}

static int check_u(const char *what, uint64_t value, uint64_t limit)
{
    char v[32], l[32];
    snprintf(v, sizeof(v), "%llu", (unsigned long long)value);
    snprintf(l, sizeof(l), "%llu", (unsigned long long)limit);
    return check(what, v, l, value <= limit);
}

static int check_requests(const kvf_soak_t *s)
{
    const kvf_soak_tally_t *t = &s->tally;
    uint64_t n[KVF_SOAK_OUTCOMES] = {0};
    for (int k = 0; k < KVF_SOAK_KINDS; k++)
        for (int o = 0; o < KVF_SOAK_OUTCOMES; o++)
            n[o] += t->n[k][o];
    char v[48], l[32];
    int bad = 0;
    snprintf(v, sizeof(v), "%llu/%llu", (unsigned long long)n[KVF_SOAK_SAME],
             (unsigned long long)(n[KVF_SOAK_SAME] + n[KVF_SOAK_DIFF]));
    bad += check("completed = colocated output", v, "all", n[KVF_SOAK_DIFF] == 0);
    bad += check_u("duplicated or missing tokens (requests)", n[KVF_SOAK_DIFF] + t->bad_prefix, 0);
    bad += check_u("failed requests", n[KVF_SOAK_FAILED], 0);
    snprintf(v, sizeof(v), "%llu/%llu", (unsigned long long)(n[KVF_SOAK_FAILED] - t->unclear),
             (unsigned long long)n[KVF_SOAK_FAILED]);
    bad += check("failures with a clear error", v, "all", t->unclear == 0);
    bad += check_u("lost requests (no proper end)", n[KVF_SOAK_LOST], 0);
    snprintf(v, sizeof(v), "%llu", (unsigned long long)n[KVF_SOAK_ABORTED]);
    snprintf(l, sizeof(l), ">=%u", s->aborts_target);
    bad += check("client aborts mid-stream", v, l, n[KVF_SOAK_ABORTED] >= s->aborts_target);
    return bad;
}

static int check_cluster(const kvf_soak_t *s, const router_counts_t *rc, const blocks_t *b)
{
    char v[48];
    int bad = 0;
    snprintf(v, sizeof(v), "%s", !s->chaos.drain_done ? "none" : s->chaos.drain_clean ? "0" : "no");
    bad += check("drained node exited 0", v, "0", s->chaos.drain_clean);
    uint64_t used = 0;
    for (int i = 0; i < b->n; i++)
        if (strcmp(b->nodes[i].state, "dead") != 0)
            used += b->nodes[i].blocks_used;
    snprintf(v, sizeof(v), b->n ? "%llu" : "no stats", (unsigned long long)used);
    bad += check("KV blocks in use on live nodes", v, "0", b->n > 0 && b->busy == 0);
    snprintf(v, sizeof(v), rc->ok ? "%llu" : "no stats",
             (unsigned long long)(rc->running + rc->queued));
    bad += check("requests the router still holds", v, "0",
                 rc->ok && rc->running == 0 && rc->queued == 0);
    for (int i = 0; i < s->n_rss; i++) {
        const kvf_soak_rss_t *r = &s->rss[i];
        if (r->end_kib < 0 || r->warm_kib <= 0)
            continue; /* restarted or gone during the window: not measured */
        double drift = (double)(r->end_kib - r->warm_kib) / (double)r->warm_kib;
        char what[64], l[16];
        snprintf(what, sizeof(what), "RSS growth of %s (whole window)", r->name);
        snprintf(v, sizeof(v), "%+.1f%%", 100.0 * drift);
        snprintf(l, sizeof(l), "<=%.0f%%", 100.0 * REPORT_RSS_DRIFT_MAX);
        bad += check(what, v, l, drift <= REPORT_RSS_DRIFT_MAX);
    }
    bool router_measured = s->n_rss > 0 && s->rss[0].end_kib >= 0;
    bad += check("router memory measured over the window", router_measured ? "yes" : "no", "yes",
                 router_measured);
    return bad;
}

int kvf_soak_report(kvf_soak_t *s)
{
    blocks_t *b = calloc(1, sizeof(*b));
    if (!b)
        return 1;
    wait_blocks(s, b);
    end_rss(s);
    router_counts_t rc;
    read_router(s, &rc);
    print_requests(s);
    print_notes(&s->tally);
    print_cluster(s, &rc, b);
    print_rss(s);
    printf("\n== checks ==\n");
    int bad = check_requests(s) + check_cluster(s, &rc, b);
    free(b);
    fflush(stdout);
    return bad;
}
