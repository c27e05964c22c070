/* The authenticated control plane against rogues: a live cluster whose
 * router and nodes share a cluster key (--cluster-key-file, given by the
 * harness), and this test process playing the rogue next to its own keyed
 * client. What must hold:
 *   - nodes without the key, or with another key, never join (the router
 *     counts their Registers as untagged and bad_tag);
 *   - a Register sent without the key or with a wrong one adds no node;
 *   - forged KvReady, Cancel and TokenBatch messages sent to the nodes and
 *     the router while requests stream are refused and counted, and every
 *     output still equals the colocated reference;
 *   - a native client without the key gets no answer from the router;
 *   - a correctly signed frame sent twice, byte for byte, is taken once:
 *     the copy is refused as a replay (by a decode node and the router;
 *     the router's is a Register that lists its node, the same Register
 *     the rogue's unsigned and mis-signed copies failed to).
 * The router's counts are read from its /metrics, a node's from its
 * periodic stats line (--stats-interval-ms). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "kvf/auth.h"
#include "kvf/clock.h"
#include "kvf/model.h"
#include "kvf/msg.h"

#define N_REQ   6
#define VOCAB   512
#define WAIT_MS 60000

static char model_dir[256], key_dir[64], key_path[128], other_key_path[128];
static char fingerprint[64]; /* the model's: a Register that the router would take */
static h_gen_t reqs[N_REQ];
static uint32_t *refs[N_REQ];
static size_t n_refs[N_REQ];

static const uint8_t wrong_key[32] = "a key that is not the cluster's";

static int setup(void **state)
{
    (void)state;
    snprintf(model_dir, sizeof(model_dir), "/tmp/kvf-test-auth-model-%d", (int)getpid());
    h_mkmodel(model_dir, "--layers 2 --hidden 64 --heads 4 --kv-heads 2 --inter 128 "
                         "--vocab 512 --max-pos 4096 --seed 23");
    snprintf(key_dir, sizeof(key_dir), "/tmp/kvf-test-auth-key-XXXXXX");
    assert_non_null(mkdtemp(key_dir));
    snprintf(key_path, sizeof(key_path), "%s/cluster.key", key_dir);
    snprintf(other_key_path, sizeof(other_key_path), "%s/other.key", key_dir);
    assert_int_equal(kvf_auth_write_key_file(key_path), KVF_OK);
    assert_int_equal(kvf_auth_write_key_file(other_key_path), KVF_OK);
    kvf_model_t *m = NULL;
    assert_int_equal(kvf_model_load(model_dir, &m), KVF_OK);
    snprintf(fingerprint, sizeof(fingerprint), "%s", kvf_model_fingerprint(m));
    kvf_model_destroy(m);
    for (int i = 0; i < N_REQ; i++)
        h_gen_random(&reqs[i], 20 + (size_t)i * 37, VOCAB, (uint64_t)i + 5, 24 + (uint32_t)i * 4,
                     true);
    h_references(model_dir, reqs, N_REQ, refs, n_refs);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    h_gens_free(reqs, refs, N_REQ);
    unlink(key_path);
    unlink(other_key_path);
    rmdir(key_dir);
    return h_rmmodel(model_dir);
}

/* ---- the rogue's keys --------------------------------------------------------- */

typedef enum { AS_CLUSTER, AS_NO_KEY, AS_WRONG_KEY } identity_t;

/* What this process signs with from now on (kvf/auth.h: the process's key,
 * changed here between sends, with no other thread running). */
static void act_as(identity_t who)
{
    if (who == AS_CLUSTER)
        assert_int_equal(kvf_auth_load_key_file(key_path), KVF_OK);
    else if (who == AS_WRONG_KEY)
        assert_int_equal(kvf_auth_set_key(wrong_key, sizeof(wrong_key)), KVF_OK);
    else
        kvf_auth_clear_key();
}

/* An outbox to url, kept open by the caller until the receiver has taken
 * what it sent (nanomsg drops what is queued at close). */
static kvf_outbox_t *outbox(const char *url)
{
    kvf_outbox_t *o = NULL;
    assert_int_equal(kvf_outbox_create(url, &o), KVF_OK);
    return o;
}

static void send_env(kvf_outbox_t *o, kvf_envelope_t *env)
{
    assert_int_equal(kvf_outbox_send(o, env, 5000), KVF_OK);
}

/* The same signed frame twice to url: the second is a replay. */
static void send_twice(kvf_outbox_t *o, const char *url, kvf_envelope_t *env)
{
    uint8_t *frame;
    size_t len;
    assert_int_equal(kvf_envelope_encode_to(env, url, NULL, &frame, &len), KVF_OK);
    assert_int_equal(kvf_outbox_send_frame(o, frame, len, 5000), KVF_OK);
    assert_int_equal(kvf_outbox_send_frame(o, frame, len, 5000), KVF_OK);
    free(frame);
}

/* A Register of a prefill node the router would take (the cluster's model
 * and KV geometry: --layers 2, 2 kv heads of 64 / 4 = 16, blocks of 16);
 * its inbox is a port nothing listens on. Sent once, or, with to_url,
 * twice as the same signed bytes. */
static void send_register(kvf_outbox_t *o, const char *node_id, const char *to_url)
{
    Kvf__Register reg = KVF__REGISTER__INIT;
    Kvf__KvGeometry geo = KVF__KV_GEOMETRY__INIT;
    geo.block_size = 16;
    geo.dtype = KVF__KV_DTYPE__KV_DTYPE_F32;
    geo.layout = 1;
    geo.n_layers = 2;
    geo.n_kv_heads = 2;
    geo.head_dim = 16;
    reg.node_id = (char *)node_id;
    reg.role = KVF__ROLE__ROLE_PREFILL;
    reg.inbox_url = "tcp://127.0.0.1:9";
    reg.model_fingerprint = fingerprint;
    reg.geometry = &geo;
    reg.capacity_blocks = 64;
    reg.max_context = 4096;
    kvf_envelope_t env;
    kvf_envelope_init(&env, node_id);
    env.body_case = KVF__ENVELOPE__BODY_REGISTER;
    env.register_ = &reg;
    if (to_url)
        send_twice(o, to_url, &env);
    else
        send_env(o, &env);
}

static void send_cancel(kvf_outbox_t *o, uint64_t req_id)
{
    Kvf__Cancel cancel = KVF__CANCEL__INIT;
    cancel.req_id = req_id;
    cancel.reason = "rogue";
    kvf_envelope_t env;
    kvf_envelope_init(&env, "rogue");
    env.body_case = KVF__ENVELOPE__BODY_CANCEL;
    env.cancel = &cancel;
    send_env(o, &env);
}

/* A KvReady that would start request req_id epoch 1 with a bogus token. */
static void send_kv_ready(kvf_outbox_t *o, uint64_t req_id)
{
    Kvf__KvReady kr = KVF__KV_READY__INIT;
    Kvf__Sampling s = KVF__SAMPLING__INIT;
    kr.req_id = req_id;
    kr.epoch = 1;
    kr.first_token = 7;
    kr.n_tokens = 1;
    s.max_tokens = 4;
    kr.sampling = &s;
    kvf_envelope_t env;
    kvf_envelope_init(&env, "rogue");
    env.body_case = KVF__ENVELOPE__BODY_KV_READY;
    env.kv_ready = &kr;
    send_env(o, &env);
}

/* A TokenBatch that would end requests 1..n (epoch 1) with bogus tokens. */
static void send_token_batch(kvf_outbox_t *o, size_t n)
{
    Kvf__TokenChunk chunks[N_REQ], *ptrs[N_REQ];
    uint32_t tokens[3] = {7, 7, 7};
    for (size_t i = 0; i < n && i < N_REQ; i++) {
        kvf__token_chunk__init(&chunks[i]);
        chunks[i].req_id = i + 1;
        chunks[i].epoch = 1;
        chunks[i].tokens = tokens;
        chunks[i].n_tokens = 3;
        chunks[i].finish_reason = KVF__FINISH_REASON__FINISH_STOP;
        chunks[i].text = (ProtobufCBinaryData){0, NULL};
        ptrs[i] = &chunks[i];
    }
    Kvf__TokenBatch tb = KVF__TOKEN_BATCH__INIT;
    tb.node_id = "rogue";
    tb.chunks = ptrs;
    tb.n_chunks = n < N_REQ ? n : N_REQ;
    kvf_envelope_t env;
    kvf_envelope_init(&env, "rogue");
    env.body_case = KVF__ENVELOPE__BODY_TOKEN_BATCH;
    env.token_batch = &tb;
    send_env(o, &env);
}

/* ---- what the cluster counted ------------------------------------------------- */

typedef struct {
    long long refused[KVF_AUTH_N_REASONS];
} counts_t;

static bool router_counts(int port, counts_t *out)
{
    static char text[1 << 16];
    if (!h_http_metrics(port, text, sizeof(text)))
        return false;
    for (int r = 0; r < KVF_AUTH_N_REASONS; r++) {
        char key[96];
        snprintf(key, sizeof(key), "kvf_control_refused_total{reason=\"%s\"} ",
                 kvf_auth_reason_name((kvf_auth_reason_t)r));
        const char *p = strstr(text, key);
        if (!p)
            return false;
        out->refused[r] = atoll(p + strlen(key));
    }
    return true;
}

/* The counts of the last stats line in a node's log with them. */
static bool node_counts(const char *log, counts_t *out)
{
    FILE *f = fopen(log, "r");
    if (!f)
        return false;
    char line[2048];
    bool found = false;
    while (fgets(line, sizeof(line), f)) {
        const char *p = strstr(line, "auth refused: ");
        if (p && sscanf(p,
                        "auth refused: untagged %lld bad_tag %lld replay %lld stale %lld "
                        "misdirected %lld",
                        &out->refused[KVF_AUTH_UNTAGGED], &out->refused[KVF_AUTH_BAD_TAG],
                        &out->refused[KVF_AUTH_REPLAY], &out->refused[KVF_AUTH_STALE],
                        &out->refused[KVF_AUTH_MISDIRECTED]) == 5)
            found = true;
    }
    fclose(f);
    return found;
}

static bool counts_equal(const counts_t *a, const counts_t *b)
{
    return !memcmp(a, b, sizeof(*a));
}

static void print_counts(const char *who, const counts_t *c)
{
    fprintf(stderr, "%s: untagged %lld bad_tag %lld replay %lld stale %lld misdirected %lld\n", who,
            c->refused[0], c->refused[1], c->refused[2], c->refused[3], c->refused[4]);
}

/* Waits until the router's (node < 0) or node's counts are exactly want
 * (at_least: at least want, reason by reason); fails the test at the
 * deadline. */
static void wait_counts(h_cluster_t *c, int http_port, int node, const counts_t *want,
                        bool at_least)
{
    uint64_t deadline = kvf_clock_ns() + (uint64_t)WAIT_MS * 1000000ull;
    counts_t got;
    memset(&got, 0, sizeof(got));
    while (kvf_clock_ns() < deadline) {
        bool ok = node < 0 ? router_counts(http_port, &got) : node_counts(c->procs[node].log, &got);
        bool enough = true;
        for (int r = 0; r < KVF_AUTH_N_REASONS; r++)
            enough &= got.refused[r] >= want->refused[r];
        if (ok && (at_least ? enough : counts_equal(&got, want)))
            return;
        kvf_clock_sleep_ms(50);
    }
    print_counts(node < 0 ? "router" : c->procs[node].name, &got);
    print_counts("expected", want);
    h_cluster_stop(c, true);
    fail_msg("refusal counts not reached in %d ms", WAIT_MS);
}

static bool node_listed(h_cluster_t *c, const char *id)
{
    h_node_stats_t st[H_MAX_PROCS];
    int n = h_stats(c, st, H_MAX_PROCS);
    assert_true(n >= 0);
    for (int i = 0; i < n && i < H_MAX_PROCS; i++)
        if (!strcmp(st[i].id, id))
            return true;
    return false;
}

/* A keyed router with its HTTP API on a free port (returned). */
static int start_keyed_router(h_cluster_t *c)
{
    int port;
    assert_int_equal(kvf_net_free_port(&port), KVF_OK);
    char http[32];
    snprintf(http, sizeof(http), "127.0.0.1:%d", port);
    h_cluster_key(c, key_path);
    h_start_router(c, "--http", http, NULL);
    counts_t zero = {{0}};
    wait_counts(c, port, -1, &zero, false); /* up, and nothing refused yet */
    return port;
}

/* ---- nodes without the key ---------------------------------------------------- */

static void test_nodes_without_the_key(void **state)
{
    (void)state;
    h_cluster_t c;
    h_cluster_init(&c, model_dir, NULL);
    int port = start_keyed_router(&c);
    /* One node with no key at all, one with a key file of its own. */
    c.key_file = NULL;
    h_start_node(&c, "decode", "decode-nokey", NULL);
    c.key_file = other_key_path;
    h_start_node(&c, "prefill", "prefill-otherkey", NULL);
    c.key_file = key_path;
    /* They register every second: two refusals of each. */
    counts_t want = {{0}};
    want.refused[KVF_AUTH_UNTAGGED] = 2;
    want.refused[KVF_AUTH_BAD_TAG] = 2;
    wait_counts(&c, port, -1, &want, true);
    assert_false(node_listed(&c, "decode-nokey"));
    assert_false(node_listed(&c, "prefill-otherkey"));
    /* A keyed node joins the same router. */
    h_start_node(&c, "decode", "decode-keyed", NULL);
    h_wait_nodes(&c, 1, WAIT_MS);
    assert_true(node_listed(&c, "decode-keyed"));
    assert_false(node_listed(&c, "decode-nokey"));
    h_cluster_stop(&c, false);
}

/* ---- a rogue against a working cluster --------------------------------------- */

typedef struct {
    h_cluster_t *c;
    int prefill, decode;
    bool sent;
    kvf_outbox_t *to_router, *to_decode, *to_prefill;
} rogue_t;

/* While the requests stream: forged messages to every process, and a
 * native client without the key. Each node's and the router's counts are
 * exact (what this sends, nothing else is refused). */
static void on_progress(h_cluster_t *c, void *arg, size_t tokens)
{
    rogue_t *r = arg;
    if (r->sent || tokens < 2)
        return;
    r->sent = true;
    act_as(AS_WRONG_KEY);
    send_token_batch(r->to_router, N_REQ);
    send_kv_ready(r->to_decode, 1);
    for (uint64_t id = 1; id <= N_REQ; id++)
        send_cancel(r->to_prefill, id);
    act_as(AS_NO_KEY);
    send_token_batch(r->to_router, N_REQ);
    for (uint64_t id = 1; id <= N_REQ; id++)
        send_cancel(r->to_decode, id);
    kvf_client_t *client;
    assert_int_equal(kvf_client_create(c->client_url, &client), KVF_OK);
    Kvf__Sampling s = KVF__SAMPLING__INIT;
    s.max_tokens = 4;
    kvf_client_generate_t g = {.client_req_id = 1, .prompt = "rogue", .sampling = &s};
    assert_int_equal(kvf_client_generate(client, "rogue-client", &g, 5000), KVF_OK);
    /* Its stats request goes unanswered too. */
    kvf_envelope_t *reply = NULL;
    assert_int_not_equal(kvf_client_stats(client, "rogue-client", 1000, &reply), KVF_OK);
    kvf_client_destroy(client);
    act_as(AS_CLUSTER);
}

static void replay_signed(rogue_t *r)
{
    h_cluster_t *c = r->c;
    Kvf__Cancel cancel = KVF__CANCEL__INIT;
    cancel.req_id = 999999;
    cancel.epoch = 1;
    kvf_envelope_t env;
    kvf_envelope_init(&env, "test");
    env.body_case = KVF__ENVELOPE__BODY_CANCEL;
    env.cancel = &cancel;
    send_twice(r->to_decode, c->procs[r->decode].url, &env);
    send_register(r->to_router, "replayed-node", c->router_url);
}

static void test_rogue(void **state)
{
    (void)state;
    h_cluster_t c;
    h_cluster_init(&c, model_dir, NULL);
    int port = start_keyed_router(&c);
    rogue_t r = {.c = &c};
    r.decode = h_start_node(&c, "decode", "decode-0", "--stats-interval-ms", "50", NULL);
    r.prefill = h_start_node(&c, "prefill", "prefill-0", "--stats-interval-ms", "50", NULL);
    h_wait_nodes(&c, 2, WAIT_MS);
    r.to_router = outbox(c.router_url);
    r.to_decode = outbox(c.procs[r.decode].url);
    r.to_prefill = outbox(c.procs[r.prefill].url);

    /* (a) Registers without the key and with a wrong one add no node. */
    act_as(AS_NO_KEY);
    send_register(r.to_router, "rogue-nokey", NULL);
    act_as(AS_WRONG_KEY);
    send_register(r.to_router, "rogue-wrongkey", NULL);
    act_as(AS_CLUSTER);
    counts_t router_want = {{0}};
    router_want.refused[KVF_AUTH_UNTAGGED] = 1;
    router_want.refused[KVF_AUTH_BAD_TAG] = 1;
    wait_counts(&c, port, -1, &router_want, false);
    assert_false(node_listed(&c, "rogue-nokey"));
    assert_false(node_listed(&c, "rogue-wrongkey"));

    /* (b) Forged KvReady, Cancel and TokenBatch while requests stream:
     * every output is still the colocated one. */
    h_generate_many_ex(&c, reqs, N_REQ, NULL, 300000, on_progress, &r);
    assert_true(r.sent);
    h_check_outputs(&c, reqs, refs, n_refs, N_REQ, H_FINISH_LENGTH);
    for (int i = 0; i < N_REQ; i++)
        h_gen_free(&reqs[i]);
    /* Router: 2 TokenBatches, the client's GenerateRequest and StatsRequest. */
    router_want.refused[KVF_AUTH_UNTAGGED] += 3;
    router_want.refused[KVF_AUTH_BAD_TAG] += 1;
    wait_counts(&c, port, -1, &router_want, false);
    counts_t decode_want = {{0}}, prefill_want = {{0}};
    decode_want.refused[KVF_AUTH_BAD_TAG] = 1;
    decode_want.refused[KVF_AUTH_UNTAGGED] = N_REQ;
    prefill_want.refused[KVF_AUTH_BAD_TAG] = N_REQ;
    wait_counts(&c, port, r.decode, &decode_want, false);
    wait_counts(&c, port, r.prefill, &prefill_want, false);

    /* (c) A signed Cancel to the decode node and a signed Register to the
     * router, each sent twice as the same bytes: the first is taken (the
     * node is listed: what (a) sent would have been too, with the key),
     * the copy is a replay. */
    replay_signed(&r);
    decode_want.refused[KVF_AUTH_REPLAY] = 1;
    router_want.refused[KVF_AUTH_REPLAY] = 1;
    wait_counts(&c, port, r.decode, &decode_want, false);
    wait_counts(&c, port, -1, &router_want, false);
    assert_true(node_listed(&c, "replayed-node"));
    assert_false(node_listed(&c, "rogue-nokey"));

    kvf_outbox_destroy(r.to_router);
    kvf_outbox_destroy(r.to_decode);
    kvf_outbox_destroy(r.to_prefill);
    h_wait_no_blocks_used(&c, 30000);
    h_cluster_stop(&c, false);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_nodes_without_the_key, h_teardown),
        cmocka_unit_test_teardown(test_rogue, h_teardown),
    };
    if (getenv("KVF_TEST_FILTER"))
        cmocka_set_test_filter(getenv("KVF_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
