/* The soak's chaos thread: every 4-8 s a SIGKILL to a prefill or decode
 * node, which starts again under the same name 0.3-2 s later; once, at
 * 40-60% of the run, a SIGTERM drain of one node (it must exit 0) and a
 * replacement under a new name; the memory of every process at the warm
 * point. A kill takes only a node that the router lists live while
 * another node of its role is live too and has been up a few seconds, so
 * no role is left without a live node for longer than a restart. See
 * soak.h. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "kvf/clock.h"
#include "kvf/log.h"
#include "soak.h"

#define CHAOS_TICK_MS       50
#define CHAOS_PEER_UP_MS    3000 /* a restarted node counts as a live peer after this */
#define CHAOS_DRAIN_LIMIT_S 60   /* the drained node must have exited by then */
#define CHAOS_STOP_LIMIT_S  30   /* each process at the end, after SIGTERM */

typedef struct {
    kvf_soak_t *s;
    uint64_t rng;
    uint64_t next_kill_ns, drain_at_ns, drain_start_ns;
    uint64_t up_since_ns[KVF_SOAK_NODES];
    int draining; /* index in s->nodes, -1 when none */
} chaos_t;

static const char *node_name(const kvf_soak_t *s, const kvf_soak_node_t *n)
{
    return s->cluster.procs[n->proc].name;
}

static uint64_t ms_ns(uint64_t ms)
{
    return ms * 1000000ull;
}

/* ---- starting nodes ------------------------------------------------------------ */

static void start_node(kvf_soak_t *s, bool decode, const char *name)
{
    KVF_ASSERT(s->n_nodes < KVF_SOAK_NODES);
    int i = decode ? h_start_node(&s->cluster, "decode", name, "--lease-ms", s->lease_flag, NULL)
                   : h_start_node(&s->cluster, "prefill", name, NULL);
    s->nodes[s->n_nodes++] = (kvf_soak_node_t){.proc = i, .decode = decode, .state = KVF_SOAK_UP};
}

void kvf_soak_chaos_start_nodes(kvf_soak_t *s)
{
    start_node(s, true, "decode-0");
    start_node(s, true, "decode-1");
    start_node(s, false, "prefill-0");
    start_node(s, false, "prefill-1");
}

static void restart_node(chaos_t *c, int i, uint64_t now)
{
    kvf_soak_t *s = c->s;
    kvf_soak_node_t *n = &s->nodes[i];
    if (n->decode)
        h_restart_node(&s->cluster, n->proc, "decode", "--lease-ms", s->lease_flag, NULL);
    else
        h_restart_node(&s->cluster, n->proc, "prefill", NULL);
    n->state = KVF_SOAK_UP;
    c->up_since_ns[i] = now;
    s->chaos.restarts++;
    fprintf(stderr, "soak: [%7.1f s] restart %s (pid %d)\n", kvf_soak_elapsed_s(s), node_name(s, n),
            (int)s->cluster.procs[n->proc].pid);
}

/* ---- kills ----------------------------------------------------------------------- */

static bool router_lists_live(const h_node_stats_t *st, int n, const char *name)
{
    for (int i = 0; i < n && i < H_MAX_PROCS; i++)
        if (!strcmp(st[i].id, name))
            return !strcmp(st[i].state, "live");
    return false;
}

/* The nodes a kill (or the drain) may take: up and live, with another node
 * of the same role up, live and not just restarted. Returns how many. */
static int victims(chaos_t *c, uint64_t now, int *out)
{
    kvf_soak_t *s = c->s;
    h_node_stats_t st[H_MAX_PROCS];
    int n = h_stats(&s->cluster, st, H_MAX_PROCS);
    bool live[KVF_SOAK_NODES], settled[KVF_SOAK_NODES];
    for (int i = 0; i < s->n_nodes; i++) {
        live[i] = n > 0 && s->nodes[i].state == KVF_SOAK_UP &&
                  router_lists_live(st, n, node_name(s, &s->nodes[i]));
        settled[i] = live[i] && now - c->up_since_ns[i] >= ms_ns(CHAOS_PEER_UP_MS);
    }
    int k = 0;
    for (int i = 0; i < s->n_nodes; i++) {
        bool peer = false;
        for (int j = 0; j < s->n_nodes; j++)
            peer |= j != i && settled[j] && s->nodes[j].decode == s->nodes[i].decode;
        if (live[i] && peer)
            out[k++] = i;
    }
    return k;
}

static void kill_one(chaos_t *c, uint64_t now)
{
    kvf_soak_t *s = c->s;
    int cand[KVF_SOAK_NODES];
    int n = victims(c, now, cand);
    if (n == 0) {
        s->chaos.skipped++;
        c->next_kill_ns = now + ms_ns(1000);
        return;
    }
    kvf_soak_node_t *v = &s->nodes[cand[kvf_soak_rand(&c->rng) % (uint64_t)n]];
    pid_t pid = s->cluster.procs[v->proc].pid;
    h_kill(&s->cluster, v->proc);
    v->state = KVF_SOAK_DOWN;
    v->restart_ns = now + ms_ns(kvf_soak_between(&c->rng, 300, 2000));
    s->chaos.kills[v->decode]++;
    fprintf(stderr, "soak: [%7.1f s] SIGKILL %s (pid %d)\n", kvf_soak_elapsed_s(s), node_name(s, v),
            (int)pid);
    c->next_kill_ns = now + ms_ns(kvf_soak_between(&c->rng, 4000, 8000));
}

/* ---- the drain ------------------------------------------------------------------- */

static void drain_start(chaos_t *c, uint64_t now)
{
    kvf_soak_t *s = c->s;
    int cand[KVF_SOAK_NODES];
    int n = victims(c, now, cand);
    if (n == 0) {
        c->drain_at_ns = now + ms_ns(1000);
        return;
    }
    /* The seed picks the role (when it has a candidate), then the node. */
    bool decode = kvf_soak_rand(&c->rng) & 1;
    int pick = cand[kvf_soak_rand(&c->rng) % (uint64_t)n];
    for (int k = 0; k < n; k++)
        if (s->nodes[cand[k]].decode == decode)
            pick = cand[k];
    kvf_soak_node_t *v = &s->nodes[pick];
    h_signal(&s->cluster, v->proc, SIGTERM);
    v->state = KVF_SOAK_DRAINING;
    c->draining = pick;
    c->drain_start_ns = now;
    kvf_soak_chaos_t *ch = &s->chaos;
    ch->drain_started = true;
    ch->drain_at_s = kvf_soak_elapsed_s(s);
    snprintf(ch->drained, sizeof(ch->drained), "%s", node_name(s, v));
    snprintf(ch->replacement, sizeof(ch->replacement), "%s-2", v->decode ? "decode" : "prefill");
    start_node(s, v->decode, ch->replacement);
    c->up_since_ns[s->n_nodes - 1] = now;
    fprintf(stderr, "soak: [%7.1f s] SIGTERM (drain) %s; replacement %s started\n", ch->drain_at_s,
            ch->drained, ch->replacement);
}

static void drain_poll(chaos_t *c, uint64_t now)
{
    kvf_soak_t *s = c->s;
    kvf_soak_node_t *v = &s->nodes[c->draining];
    kvf_soak_chaos_t *ch = &s->chaos;
    int status;
    if (h_reaped(&s->cluster, v->proc, &status)) {
        ch->drain_status = status;
        ch->drain_clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    } else if (now - c->drain_start_ns > ms_ns(CHAOS_DRAIN_LIMIT_S * 1000ull)) {
        h_kill(&s->cluster, v->proc);
        ch->drain_status = -1;
        ch->drain_clean = false;
    } else {
        return;
    }
    ch->drain_done = true;
    ch->drain_s = (double)(now - c->drain_start_ns) / 1e9;
    v->state = KVF_SOAK_RETIRED;
    c->draining = -1;
    fprintf(stderr, "soak: [%7.1f s] %s ended after %.1f s of drain: status 0x%x%s\n",
            kvf_soak_elapsed_s(s), ch->drained, ch->drain_s, (unsigned)ch->drain_status,
            ch->drain_clean ? " (exit 0)" : " (NOT a clean exit)");
}

/* ---- memory ---------------------------------------------------------------------- */

long kvf_soak_rss_kib(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    long kib = -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
            break;
    fclose(f);
    return kib;
}

/* The warm point's sample: the router and every node up now. */
static void warm_sample(kvf_soak_t *s)
{
    for (int i = 0; i < s->cluster.n_procs && s->n_rss < 1 + KVF_SOAK_NODES; i++) {
        const h_proc_t *p = &s->cluster.procs[i];
        if (p->pid <= 0)
            continue;
        kvf_soak_rss_t *r = &s->rss[s->n_rss++];
        snprintf(r->name, sizeof(r->name), "%s", p->name);
        r->pid = p->pid;
        r->warm_kib = kvf_soak_rss_kib(p->pid);
        r->end_kib = -1;
    }
    s->chaos.warm_taken = true;
    fprintf(stderr, "soak: [%7.1f s] warm memory sample of %d processes\n", kvf_soak_elapsed_s(s),
            s->n_rss);
}

/* ---- the thread ------------------------------------------------------------------ */

static void tick(chaos_t *c, uint64_t now)
{
    kvf_soak_t *s = c->s;
    if (!s->chaos.warm_taken && now >= s->t0_ns + (uint64_t)(s->warm_s * 1e9))
        warm_sample(s);
    for (int i = 0; i < s->n_nodes; i++)
        if (s->nodes[i].state == KVF_SOAK_DOWN && now >= s->nodes[i].restart_ns)
            restart_node(c, i, now);
    if (!s->chaos.drain_started && now >= c->drain_at_ns)
        drain_start(c, now);
    if (c->draining >= 0)
        drain_poll(c, now);
    if (now >= c->next_kill_ns)
        kill_one(c, now);
}

void *kvf_soak_chaos_main(void *arg)
{
    kvf_soak_t *s = arg;
    chaos_t c = {.s = s, .rng = s->seed ^ 0xc4a05ull, .draining = -1};
    uint64_t t0 = s->t0_ns;
    c.next_kill_ns = t0 + ms_ns(kvf_soak_between(&c.rng, 4000, 8000));
    c.drain_at_ns =
        t0 + (uint64_t)(s->duration_s * 1e9 * (double)kvf_soak_between(&c.rng, 40, 60) / 100.0);
    while (!atomic_load(&s->stop_chaos)) {
        tick(&c, kvf_clock_ns());
        kvf_clock_sleep_ms(CHAOS_TICK_MS);
    }
    /* The end: the nodes that are down come back, the drain finishes. */
    uint64_t now = kvf_clock_ns();
    for (int i = 0; i < s->n_nodes; i++)
        if (s->nodes[i].state == KVF_SOAK_DOWN)
            restart_node(&c, i, now);
    while (c.draining >= 0) {
        drain_poll(&c, kvf_clock_ns());
        kvf_clock_sleep_ms(CHAOS_TICK_MS);
    }
    return NULL;
}

/* ---- the end --------------------------------------------------------------------- */

/* SIGTERM to the processes of procs [from, to), then waits up to
 * CHAOS_STOP_LIMIT_S for each (SIGKILL after); returns how many did not
 * exit 0, each named on stdout. */
static int stop_range(kvf_soak_t *s, int from, int to)
{
    h_cluster_t *c = &s->cluster;
    for (int i = from; i < to; i++)
        h_signal(c, i, SIGTERM);
    uint64_t deadline = kvf_clock_ns() + ms_ns(CHAOS_STOP_LIMIT_S * 1000ull);
    int unclean = 0;
    for (int i = from; i < to; i++) {
        int status = 0;
        bool done = c->procs[i].pid <= 0;
        while (!done && kvf_clock_ns() < deadline && !(done = h_reaped(c, i, &status)))
            kvf_clock_sleep_ms(20);
        if (done && WIFEXITED(status) && WEXITSTATUS(status) == 0)
            continue;
        if (!done) {
            h_kill(c, i);
            printf("  %-10s did not exit within %d s of SIGTERM: killed\n", c->procs[i].name,
                   CHAOS_STOP_LIMIT_S);
        } else {
            printf("  %-10s ended with status 0x%x\n", c->procs[i].name, (unsigned)status);
        }
        unclean++;
    }
    return unclean;
}

int kvf_soak_stop_all(kvf_soak_t *s)
{
    /* The nodes first (they deregister), then the router (procs[0]). */
    int unclean = stop_range(s, 1, s->cluster.n_procs);
    return unclean + stop_range(s, 0, 1);
}
