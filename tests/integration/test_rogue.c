/* A live cluster without a cluster key against a rogue process on the same
 * host that speaks the real protocol (this test process, through
 * kvf_outbox and the protobuf messages): docs/PROTOCOL.md, "Identity".
 * What must hold, each refusal counted where it happens:
 *   - a Register reusing a live node's id from another inbox is refused
 *     (id_taken), and a heartbeat naming that node without its
 *     registration's token too (token): the node stays where it is;
 *   - a decode node whose transfer descriptor the prefill nodes would
 *     refuse is refused at registration (descriptor);
 *   - while requests stream: a TokenBatch and Errors for other clients'
 *     requests sent to the router as the decode node, Cancels and a
 *     PrefillRequest sent to the prefill node, Cancels and a KvAlloc sent
 *     to the decode node are all refused and counted, and every output
 *     still equals the colocated reference;
 *   - attack 5, a node that leaves: a forged Deregister is refused
 *     (token); a decode node that drains and leaves holding requests, or
 *     leaves while requests are placed on it that it has not heard of yet,
 *     is handed none of them back: each is sent again once, to the other
 *     decode node, and ends equal to the colocated output.
 * The router's counts are read from its /metrics, a node's from its
 * periodic stats line (--stats-interval-ms). */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "kvf/clock.h"
#include "kvf/model.h"
#include "kvf/msg.h"

#define N_REQ   6
#define VOCAB   512
#define WAIT_MS 60000

static char model_dir[256];
static char fingerprint[64]; /* the model's: a Register that the router would take */
static h_gen_t reqs[N_REQ];
static uint32_t *refs[N_REQ];
static size_t n_refs[N_REQ];

static int setup(void **state)
{
    (void)state;
    snprintf(model_dir, sizeof(model_dir), "/tmp/kvf-test-rogue-model-%d", (int)getpid());
    h_mkmodel(model_dir, "--layers 2 --hidden 64 --heads 4 --kv-heads 2 --inter 128 "
                         "--vocab 512 --max-pos 4096 --seed 29");
    kvf_model_t *m = NULL;
    assert_int_equal(kvf_model_load(model_dir, &m), KVF_OK);
    snprintf(fingerprint, sizeof(fingerprint), "%s", kvf_model_fingerprint(m));
    kvf_model_destroy(m);
    for (int i = 0; i < N_REQ; i++)
        h_gen_random(&reqs[i], 24 + (size_t)i * 31, VOCAB, (uint64_t)i + 11, 24 + (uint32_t)i * 4,
                     true);
    h_references(model_dir, reqs, N_REQ, refs, n_refs);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    h_gens_free(reqs, refs, N_REQ);
    return h_rmmodel(model_dir);
}

/* ---- the rogue's messages ------------------------------------------------------ */

static void send_env(kvf_outbox_t *o, kvf_envelope_t *env)
{
    assert_int_equal(kvf_outbox_send(o, env, 5000), KVF_OK);
}

/* A Register the router would take but for its id (role prefill) or its
 * descriptor (role decode); its inbox is a port nothing listens on. */
static void send_register(kvf_outbox_t *o, const char *node_id, Kvf__Role role)
{
    static uint8_t junk_desc[] = "KVFXnot a transfer descriptor";
    Kvf__KvGeometry geo = KVF__KV_GEOMETRY__INIT;
    geo.block_size = 16;
    geo.dtype = KVF__KV_DTYPE__KV_DTYPE_F32;
    geo.layout = 1;
    geo.n_layers = 2;
    geo.n_kv_heads = 2;
    geo.head_dim = 16;
    Kvf__Register reg = KVF__REGISTER__INIT;
    reg.node_id = (char *)node_id;
    reg.role = role;
    reg.inbox_url = "tcp://127.0.0.1:9";
    reg.model_fingerprint = fingerprint;
    reg.geometry = &geo;
    reg.capacity_blocks = 64;
    reg.max_context = 4096;
    if (role == KVF__ROLE__ROLE_DECODE)
        reg.xfer_desc = (ProtobufCBinaryData){sizeof(junk_desc), junk_desc};
    kvf_envelope_t env;
    kvf_envelope_init(&env, node_id);
    env.body_case = KVF__ENVELOPE__BODY_REGISTER;
    env.register_ = &reg;
    send_env(o, &env);
}

static void send_heartbeat(kvf_outbox_t *o, const char *node_id)
{
    Kvf__Load load = KVF__LOAD__INIT;
    Kvf__Heartbeat hb = KVF__HEARTBEAT__INIT;
    hb.node_id = (char *)node_id;
    hb.inbox_url = "tcp://127.0.0.1:9";
    hb.state = "live";
    hb.load = &load;
    kvf_envelope_t env;
    kvf_envelope_init(&env, node_id);
    env.body_case = KVF__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    send_env(o, &env);
}

/* A TokenBatch, as node `as`, that would end requests 1..N_REQ (epoch 1)
 * with injected tokens. */
static void send_token_batch(kvf_outbox_t *o, const char *as)
{
    Kvf__TokenChunk chunks[N_REQ], *ptrs[N_REQ];
    uint32_t tokens[3] = {7, 7, 7};
    for (size_t i = 0; i < N_REQ; i++) {
        kvf__token_chunk__init(&chunks[i]);
        chunks[i].req_id = i + 1;
        chunks[i].epoch = 1;
        chunks[i].tokens = tokens;
        chunks[i].n_tokens = 3;
        chunks[i].n_generated = 3;
        chunks[i].finish_reason = KVF__FINISH_REASON__FINISH_STOP;
        ptrs[i] = &chunks[i];
    }
    Kvf__TokenBatch tb = KVF__TOKEN_BATCH__INIT;
    tb.node_id = (char *)as;
    tb.chunks = ptrs;
    tb.n_chunks = N_REQ;
    kvf_envelope_t env;
    kvf_envelope_init(&env, as);
    env.body_case = KVF__ENVELOPE__BODY_TOKEN_BATCH;
    env.token_batch = &tb;
    send_env(o, &env);
}

static void send_error(kvf_outbox_t *o, const char *as, uint64_t req_id)
{
    Kvf__Error e = KVF__ERROR__INIT;
    e.req_id = req_id;
    e.epoch = 1;
    e.status = KVF_ERR_PEER;
    e.message = "injected by a rogue";
    e.node_id = (char *)as;
    kvf_envelope_t env;
    kvf_envelope_init(&env, as);
    env.body_case = KVF__ENVELOPE__BODY_ERROR;
    env.error = &e;
    send_env(o, &env);
}

static void send_cancel(kvf_outbox_t *o, uint64_t req_id)
{
    Kvf__Cancel cancel = KVF__CANCEL__INIT;
    cancel.req_id = req_id;
    cancel.reason = "rogue";
    kvf_envelope_t env;
    kvf_envelope_init(&env, "router");
    env.body_case = KVF__ENVELOPE__BODY_CANCEL;
    env.cancel = &cancel;
    send_env(o, &env);
}

static void send_prefill_request(kvf_outbox_t *o, const char *decode_inbox)
{
    uint32_t ids[4] = {1, 2, 3, 4};
    Kvf__Sampling s = KVF__SAMPLING__INIT;
    s.max_tokens = 4;
    s.has_seed = true;
    Kvf__PrefillRequest pr = KVF__PREFILL_REQUEST__INIT;
    pr.req_id = 424242;
    pr.epoch = 1;
    pr.token_ids = ids;
    pr.n_token_ids = 4;
    pr.sampling = &s;
    pr.decode_node_id = "decode-0";
    pr.decode_inbox = (char *)decode_inbox;
    kvf_envelope_t env;
    kvf_envelope_init(&env, "router");
    env.body_case = KVF__ENVELOPE__BODY_PREFILL_REQUEST;
    env.prefill_request = &pr;
    send_env(o, &env);
}

static void send_kv_alloc(kvf_outbox_t *o)
{
    Kvf__KvAlloc a = KVF__KV_ALLOC__INIT;
    a.req_id = 1;
    a.epoch = 1;
    a.n_tokens = 16;
    a.max_new_tokens = 4;
    a.prefill_node_id = "rogue";
    a.reply_inbox = "tcp://127.0.0.1:9";
    kvf_envelope_t env;
    kvf_envelope_init(&env, "rogue");
    env.body_case = KVF__ENVELOPE__BODY_KV_ALLOC;
    env.kv_alloc = &a;
    send_env(o, &env);
}

static void send_deregister(kvf_outbox_t *o, const char *node_id)
{
    Kvf__Deregister d = KVF__DEREGISTER__INIT;
    d.node_id = (char *)node_id;
    d.reason = "forged by a rogue";
    kvf_envelope_t env;
    kvf_envelope_init(&env, node_id);
    env.body_case = KVF__ENVELOPE__BODY_DEREGISTER;
    env.deregister = &d;
    send_env(o, &env);
}

/* ---- what the cluster counted ----------------------------------------------------- */

/* The router's counter `line` (the metric with its labels and a space);
 * -1 when /metrics could not be read. */
static long long router_count(int port, const char *line)
{
    static char text[1 << 16];
    if (!h_http_metrics(port, text, sizeof(text)))
        return -1;
    const char *p = strstr(text, line);
    return p ? atoll(p + strlen(line)) : -1;
}

static void wait_router(h_cluster_t *c, int port, const char *line, long long want)
{
    uint64_t deadline = kvf_clock_ns() + (uint64_t)WAIT_MS * 1000000ull;
    long long got = -1;
    while (kvf_clock_ns() < deadline) {
        got = router_count(port, line);
        if (got == want)
            return;
        kvf_clock_sleep_ms(50);
    }
    h_cluster_stop(c, true);
    fail_msg("router: %s%lld, expected %lld", line, got, want);
}

/* The last "messages refused" counts in node i's log. */
static bool node_refused(h_cluster_t *c, int i, long long *token_p, long long *alloc_p)
{
    FILE *f = fopen(c->procs[i].log, "r");
    if (!f)
        return false;
    char line[4096];
    bool found = false;
    while (fgets(line, sizeof(line), f)) {
        const char *p = strstr(line, "messages refused: ");
        if (p && sscanf(p, "messages refused: token=%lld alloc_token=%lld", token_p, alloc_p) == 2)
            found = true;
    }
    fclose(f);
    return found;
}

static void wait_node(h_cluster_t *c, int i, long long token, long long alloc)
{
    uint64_t deadline = kvf_clock_ns() + (uint64_t)WAIT_MS * 1000000ull;
    long long t = -1, a = -1;
    while (kvf_clock_ns() < deadline) {
        if (node_refused(c, i, &t, &a) && t == token && a == alloc)
            return;
        kvf_clock_sleep_ms(50);
    }
    h_cluster_stop(c, true);
    fail_msg("%s refused token=%lld alloc_token=%lld, expected %lld and %lld", c->procs[i].name, t,
             a, token, alloc);
}

static bool node_listed(h_cluster_t *c, const char *id, const char *state)
{
    h_node_stats_t st[H_MAX_PROCS];
    int n = h_stats(c, st, H_MAX_PROCS);
    assert_true(n >= 0);
    for (int i = 0; i < n && i < H_MAX_PROCS; i++)
        if (!strcmp(st[i].id, id))
            return !state || !strcmp(st[i].state, state);
    return false;
}

/* ---- the attacks ---------------------------------------------------------------- */

typedef struct {
    h_cluster_t *c;
    int prefill, decode;
    bool sent;
    kvf_outbox_t *to_router, *to_decode, *to_prefill;
} rogue_t;

/* While the requests stream: injected tokens, errors, cancels and work. */
static void on_progress(h_cluster_t *c, void *arg, size_t tokens)
{
    rogue_t *r = arg;
    if (r->sent || tokens < 2)
        return;
    r->sent = true;
    send_token_batch(r->to_router, "decode-0");
    for (uint64_t id = 1; id <= N_REQ; id++)
        send_error(r->to_router, "decode-0", id);
    for (uint64_t id = 1; id <= N_REQ; id++) {
        send_cancel(r->to_decode, id);
        send_cancel(r->to_prefill, id);
    }
    send_prefill_request(r->to_prefill, c->procs[r->decode].url);
    send_kv_alloc(r->to_decode);
}

static void test_rogue_without_key(void **state)
{
    (void)state;
    h_cluster_t c;
    h_cluster_init(&c, model_dir, NULL);
    int port;
    assert_int_equal(kvf_net_free_port(&port), KVF_OK);
    char http[32];
    snprintf(http, sizeof(http), "127.0.0.1:%d", port);
    h_start_router(&c, "--http", http, NULL);
    rogue_t r = {.c = &c};
    r.decode = h_start_node(&c, "decode", "decode-0", "--stats-interval-ms", "50", NULL);
    r.prefill = h_start_node(&c, "prefill", "prefill-0", "--stats-interval-ms", "50", NULL);
    h_wait_nodes(&c, 2, WAIT_MS);
    wait_router(&c, port, "kvf_messages_refused_total{reason=\"token\"} ", 0);
    assert_int_equal(kvf_outbox_create(c.router_url, &r.to_router), KVF_OK);
    assert_int_equal(kvf_outbox_create(c.procs[r.decode].url, &r.to_decode), KVF_OK);
    assert_int_equal(kvf_outbox_create(c.procs[r.prefill].url, &r.to_prefill), KVF_OK);

    /* Attack 1: the prefill node's id from another inbox, and a heartbeat
     * as the decode node from another inbox. */
    send_register(r.to_router, "prefill-0", KVF__ROLE__ROLE_PREFILL);
    send_heartbeat(r.to_router, "decode-0");
    wait_router(&c, port, "kvf_messages_refused_total{reason=\"id_taken\"} ", 1);
    wait_router(&c, port, "kvf_messages_refused_total{reason=\"token\"} ", 1);
    assert_true(node_listed(&c, "prefill-0", "live"));
    assert_true(node_listed(&c, "decode-0", "live"));

    /* Attack 3: a decode node with a descriptor the prefill node would refuse. */
    send_register(r.to_router, "rogue-decode", KVF__ROLE__ROLE_DECODE);
    wait_router(&c, port, "kvf_register_refused_total{reason=\"descriptor\"} ", 1);
    assert_false(node_listed(&c, "rogue-decode", NULL));

    /* Attack 2, while requests stream: every output is still the colocated one. */
    h_generate_many_ex(&c, reqs, N_REQ, NULL, 300000, on_progress, &r);
    assert_true(r.sent);
    h_check_outputs(&c, reqs, refs, n_refs, N_REQ, H_FINISH_LENGTH);
    for (int i = 0; i < N_REQ; i++)
        h_gen_free(&reqs[i]);
    /* Router: the heartbeat, the TokenBatch and N_REQ Errors. */
    wait_router(&c, port, "kvf_messages_refused_total{reason=\"token\"} ", 2 + N_REQ);
    wait_router(&c, port, "kvf_messages_refused_total{reason=\"not_assigned\"} ", 0);
    wait_node(&c, r.decode, N_REQ, 1);
    wait_node(&c, r.prefill, N_REQ + 1, 0);
    assert_true(node_listed(&c, "prefill-0", "live"));
    assert_true(node_listed(&c, "decode-0", "live"));

    kvf_outbox_destroy(r.to_router);
    kvf_outbox_destroy(r.to_decode);
    kvf_outbox_destroy(r.to_prefill);
    h_wait_no_blocks_used(&c, 30000);
    h_cluster_stop(&c, false);
}

/* ---- attack 5: a node that leaves ---------------------------------------------------- */

#define N_DRAIN 4

/* A test where a node leaves: its cluster, generations and references. */
typedef struct {
    h_cluster_t c;
    h_gen_t gens[N_DRAIN];
    uint32_t *refs[N_DRAIN];
    size_t n_refs[N_DRAIN];
} leave_run_t;

/* N_DRAIN greedy generations of max_tokens each (prompts from seed on),
 * their colocated references, and a cluster (nothing started yet). */
static void leave_begin(leave_run_t *run, uint64_t seed, uint32_t max_tokens)
{
    for (int i = 0; i < N_DRAIN; i++)
        h_gen_random(&run->gens[i], 20 + (size_t)i * 37, VOCAB, seed + (uint64_t)i, max_tokens,
                     true);
    h_references(model_dir, run->gens, N_DRAIN, run->refs, run->n_refs);
    h_cluster_init(&run->c, model_dir, NULL);
}

/* The outputs equal the colocated ones. */
static void leave_check(leave_run_t *run)
{
    h_check_outputs(&run->c, run->gens, run->refs, run->n_refs, N_DRAIN, H_FINISH_LENGTH);
}

/* The end: nothing in use anywhere, every process stopped. */
static void leave_end(leave_run_t *run)
{
    h_gens_free(run->gens, run->refs, N_DRAIN);
    h_wait_no_blocks_used(&run->c, 30000);
    h_cluster_stop(&run->c, false);
}

/* A node's dispatched count as the router lists it; -1 when not listed. */
static long long node_dispatched(h_cluster_t *c, const char *id)
{
    h_node_stats_t st[H_MAX_PROCS];
    int n = h_stats(c, st, H_MAX_PROCS);
    assert_true(n >= 0);
    for (int i = 0; i < n && i < H_MAX_PROCS; i++)
        if (!strcmp(st[i].id, id))
            return (long long)st[i].dispatched;
    return -1;
}

/* How many requests node i's drain left held ("drain timed out with N
 * requests held"); -1 when its log has no such line. */
static long long drain_left(h_cluster_t *c, int i)
{
    FILE *f = fopen(c->procs[i].log, "r");
    if (!f)
        return -1;
    char line[4096];
    long long held = -1;
    while (fgets(line, sizeof(line), f)) {
        const char *p = strstr(line, "drain timed out with ");
        if (p)
            held = atoll(p + strlen("drain timed out with "));
    }
    fclose(f);
    return held;
}

/* The decode node that leaves: of decode-0 and decode-1, the one the
 * router placed more requests on (decode-0 on a tie), so that it holds
 * some however the router spread them. */
typedef struct {
    const char *victim, *stays;
    long long placed;       /* on the victim, when it was picked */
    long long stays_before; /* the other's dispatched count then */
    int status;             /* the victim's exit (as waitpid), -1: killed */
    bool done;
} leaver_t;

/* Picks the victim (every request placed) and stops it with SIGTERM. */
static void leaver_go(h_cluster_t *c, leaver_t *v)
{
    long long d0 = node_dispatched(c, "decode-0"), d1 = node_dispatched(c, "decode-1");
    bool zero = d0 >= d1;
    v->victim = zero ? "decode-0" : "decode-1";
    v->stays = zero ? "decode-1" : "decode-0";
    v->placed = zero ? d0 : d1;
    v->stays_before = zero ? d1 : d0;
    v->done = true;
    v->status = h_terminate(c, h_find(c, v->victim), WAIT_MS);
}

/* It left, and each request placed on it (moved) was sent again once,
 * to the other decode node. */
static void leaver_check(h_cluster_t *c, const leaver_t *v, long long moved)
{
    print_message("%s left with %lld of %d requests placed on it, %lld to move\n", v->victim,
                  v->placed, N_DRAIN, moved);
    if (!v->done || !WIFEXITED(v->status) || WEXITSTATUS(v->status) != 0 || moved < 1) {
        h_cluster_stop(c, true);
        fail_msg("%s did not leave (status %d) with requests to move (%lld)",
                 v->victim ? v->victim : "no node", v->status, moved);
    }
    assert_int_equal(h_redispatched(c), moved);
    assert_int_equal(node_dispatched(c, v->stays), v->stays_before + moved);
    assert_int_equal(node_dispatched(c, v->victim), -1);
    assert_true(node_listed(c, v->stays, "live"));
}

typedef struct {
    h_gen_t *gens;
    leaver_t v;
} drain_t;

/* Once every request streams (each placed and past its handoff), the
 * victim drains with a 1 ms bound: it leaves holding requests. */
static void on_drain_progress(h_cluster_t *c, void *arg, size_t tokens)
{
    (void)tokens;
    drain_t *d = arg;
    if (d->v.done)
        return;
    for (int i = 0; i < N_DRAIN; i++)
        if (d->gens[i].n_out < 1)
            return;
    leaver_go(c, &d->v);
}

/* Attack 5 on a live cluster: a decode node that drains and leaves while
 * it still holds requests is not handed them back. Each of them is sent
 * again exactly once, to the other decode node, and ends equal to its
 * colocated output; a forged Deregister of that other node is refused and
 * counted. Nothing waits on time: the drain starts once every request has
 * streamed a token, its 1 ms bound leaves the node holding requests that
 * each have over a thousand tokens to go (a thousand forward passes could
 * not fit in that bound on any machine), and the router's answers are
 * read until they hold (bounded by WAIT_MS each). */
static void test_drain_not_handed_back(void **state)
{
    (void)state;
    static leave_run_t run;
    leave_begin(&run, 71, 1500);
    h_cluster_t *c = &run.c;
    int port;
    assert_int_equal(kvf_net_free_port(&port), KVF_OK);
    char http[32];
    snprintf(http, sizeof(http), "127.0.0.1:%d", port);
    h_start_router(c, "--http", http, NULL);
    kvf_outbox_t *to_router;
    h_start_node(c, "decode", "decode-0", "--drain-timeout-ms", "1", NULL);
    h_start_node(c, "decode", "decode-1", "--drain-timeout-ms", "1", NULL);
    h_start_node(c, "prefill", "prefill-0", NULL);
    h_wait_nodes(c, 3, WAIT_MS);
    /* A forged Deregister (no registration token) of decode-1. */
    assert_int_equal(kvf_outbox_create(c->router_url, &to_router), KVF_OK);
    send_deregister(to_router, "decode-1");
    wait_router(c, port, "kvf_messages_refused_total{reason=\"token\"} ", 1);
    assert_true(node_listed(c, "decode-1", "live"));
    kvf_outbox_destroy(to_router);

    drain_t d = {.gens = run.gens};
    h_generate_many_ex(c, run.gens, N_DRAIN, NULL, 300000, on_drain_progress, &d);
    leave_check(&run);
    leaver_check(c, &d.v, d.v.done ? drain_left(c, h_find(c, d.v.victim)) : -1);
    leave_end(&run);
}

/* While prefill-0 is stopped (SIGSTOP) every request is placed and none
 * has reached its decode node: once all are placed, the victim drains
 * (holding nothing, it leaves at once) and prefill-0 goes on. */
typedef struct {
    int prefill;
    leaver_t v;
} leave_t;

static void on_leave_progress(h_cluster_t *c, void *arg, size_t tokens)
{
    leave_t *l = arg;
    if (l->v.done)
        return;
    assert_int_equal(tokens, 0); /* nothing gets past the stopped prefill node */
    if (node_dispatched(c, "decode-0") + node_dispatched(c, "decode-1") < N_DRAIN)
        return;
    leaver_go(c, &l->v);
    h_signal(c, l->prefill, SIGCONT);
}

/* Attack 5, the Deregister's own path: a decode node that leaves while
 * the router has requests placed on it that it never heard of (their
 * prefill node has not sent them on yet) is not handed them back: the
 * router sends each of them again once, to the other decode node, and
 * every output is still the colocated one. Ordered by signals and the
 * router's stats, not by time. */
static void test_leaving_node_not_handed_back(void **state)
{
    (void)state;
    static leave_run_t run;
    leave_begin(&run, 91, 48);
    h_cluster_t *c = &run.c;
    /* Heartbeats every 5 s: prefill-0 is not declared dead (3 missed)
     * while it is stopped, which lasts as long as the victim takes to exit
     * (well under a second here). */
    h_start_router(c, "--heartbeat-ms", "5000", NULL);
    h_start_node(c, "decode", "decode-0", NULL);
    h_start_node(c, "decode", "decode-1", NULL);
    leave_t l = {.prefill = h_start_node(c, "prefill", "prefill-0", NULL)};
    h_wait_nodes(c, 3, WAIT_MS);
    h_signal(c, l.prefill, SIGSTOP);
    h_generate_many_ex(c, run.gens, N_DRAIN, NULL, 300000, on_leave_progress, &l);
    leave_check(&run);
    leaver_check(c, &l.v, l.v.placed);
    leave_end(&run);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_rogue_without_key, h_teardown),
        cmocka_unit_test_teardown(test_drain_not_handed_back, h_teardown),
        cmocka_unit_test_teardown(test_leaving_node_not_handed_back, h_teardown),
    };
    if (getenv("KVF_TEST_FILTER"))
        cmocka_set_test_filter(getenv("KVF_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
