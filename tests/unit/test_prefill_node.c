/* kvf-prefill as a process, against this test playing router and decode
 * node over the real control protocol and transport: registration and
 * heartbeats, KvAlloc / KvAllocReply, the K/V landing in the decode pool
 * (compared with a colocated prefill of each prompt), KvReady and
 * PrefillDone, batching and chunking, refusal, cancel (ABORT reaches the
 * decode side), stale and malformed messages, no local block left in use,
 * and a clean stop on SIGTERM (Deregister, exit 0). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kvf/backend.h"
#include "kvf/clock.h"
#include "kvf/engine.h"
#include "kvf/kvcache.h"
#include "kvf/log.h"
#include "kvf/model.h"
#include "kvf/msg.h"
#include "kvf/sampling.h"
#include "kvf/sampling_msg.h"
#include "kvf/xfer.h"
#include "support.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define N_PROMPTS 5
#define MAX_NEW   8
/* The sampler state a re-dispatched request carries from its epoch before. */
#define EARLIER_RNG_STATE 0x5eed5eedull

typedef struct {
    kvf_model_t *model;
    kvf_kv_geometry_t geo;
    /* decode side */
    kvf_kvpool_t *dpool;
    kvf_xfer_t *dxfer;
    uint8_t *desc;
    size_t desc_len;
    kvf_inbox_t *router_in, *decode_in;
    kvf_outbox_t *to_prefill;
    kvf_outbox_t *to_reply; /* the decode side's outbox to the prefill node */
    char router_url[64], decode_url[64], prefill_url[64];
    pid_t pid;
    char prefill_id[128];
    /* counters from the decode transport */
    int landed_last, aborted, rejected;
    uint64_t landed_bytes;
    uint32_t last_blocks_used; /* from the latest heartbeat */
    bool deregistered;
} rig_t;

static void url_for(char *buf, size_t len)
{
    int port = 0;
    assert_int_equal(kvf_net_free_port(&port), KVF_OK);
    snprintf(buf, len, "tcp://127.0.0.1:%d", port);
}

static void send_to(kvf_outbox_t *ob, kvf_envelope_t *env)
{
    assert_int_equal(kvf_outbox_send(ob, env, 2000), KVF_OK);
}

/* Drives the decode transport and takes the next message for either inbox
 * (router or decode) within ms; heartbeats and deregistration are noted
 * and skipped. NULL on timeout. *from_router_p says which inbox. */
static kvf_envelope_t *next_msg(rig_t *r, int ms, bool *from_router_p)
{
    uint64_t until = kvf_clock_ns() + (uint64_t)ms * 1000000ull;
    for (;;) {
        kvf_xfer_event_t ev;
        if (r->dxfer)
            kvf_xfer_progress(r->dxfer);
        while (r->dxfer && kvf_xfer_poll(r->dxfer, &ev) == KVF_OK) {
            if (ev.kind == KVF_XFER_EV_LANDED) {
                r->landed_bytes += ev.bytes;
                r->landed_last += ev.last;
            } else if (ev.kind == KVF_XFER_EV_ABORTED) {
                r->aborted++;
            } else if (ev.kind == KVF_XFER_EV_REJECTED) {
                r->rejected++;
            }
        }
        kvf_envelope_t *env = NULL;
        if (kvf_inbox_recv(r->router_in, 0, &env) == KVF_OK) {
            if (env->body_case == KVF__ENVELOPE__BODY_HEARTBEAT) {
                if (env->heartbeat->load)
                    r->last_blocks_used = env->heartbeat->load->blocks_used;
                kvf_envelope_free(env);
                continue;
            }
            if (env->body_case == KVF__ENVELOPE__BODY_DEREGISTER) {
                r->deregistered = true;
                kvf_envelope_free(env);
                continue;
            }
            *from_router_p = true;
            return env;
        }
        if (kvf_inbox_recv(r->decode_in, 1, &env) == KVF_OK) {
            *from_router_p = false;
            return env;
        }
        if (kvf_clock_ns() >= until)
            return NULL;
    }
}

/* The running kvf-prefill, killed by the teardown if a test failed before
 * stopping it. */
static pid_t child_pid;

static int kill_child(void **state)
{
    (void)state;
    if (child_pid > 0) {
        kill(child_pid, SIGKILL);
        waitpid(child_pid, NULL, 0);
        child_pid = 0;
    }
    return 0;
}

/* model_dir NULL: the golden tiny Llama. */
static void rig_start(rig_t *r, const char *model_dir, const char *kv_mem,
                      const char *max_batch_tokens)
{
    memset(r, 0, sizeof(*r));
    char dir[1024];
    if (model_dir)
        snprintf(dir, sizeof(dir), "%s", model_dir);
    else
        snprintf(dir, sizeof(dir), "%s/golden/tiny-llama-f32", KVF_TEST_DATA);
    assert_int_equal(kvf_model_load(dir, &r->model), KVF_OK);
    r->geo = kvf_engine_kv_geometry(r->model, 16);
    assert_int_equal(kvf_kvpool_create(&r->geo, 256, &r->dpool), KVF_OK);
    kvf_xfer_config_t xc = {
        .backend = KVF_XFER_UCX,
        .pool = kvf_kvpool_base(r->dpool),
        .pool_bytes = kvf_kvpool_bytes(r->dpool),
        .geometry = {.block_size = 16,
                     .n_layers = (uint32_t)r->geo.n_layers,
                     .n_kv_heads = (uint32_t)r->geo.n_kv_heads,
                     .head_dim = (uint32_t)r->geo.head_dim,
                     .dtype = KVF_XFER_DTYPE_F32,
                     .layout = 1},
    };
    assert_int_equal(kvf_xfer_create(&xc, &r->dxfer), KVF_OK);
    assert_int_equal(kvf_xfer_export(r->dxfer, &r->desc, &r->desc_len), KVF_OK);
    url_for(r->router_url, sizeof(r->router_url));
    url_for(r->decode_url, sizeof(r->decode_url));
    url_for(r->prefill_url, sizeof(r->prefill_url));
    assert_int_equal(kvf_inbox_create(r->router_url, 0, &r->router_in), KVF_OK);
    assert_int_equal(kvf_inbox_create(r->decode_url, 0, &r->decode_in), KVF_OK);
    assert_int_equal(kvf_outbox_create(r->prefill_url, &r->to_prefill), KVF_OK);

    r->pid = fork();
    assert_true(r->pid >= 0);
    if (r->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
        /* clang-format off */
        const char *argv[] = {KVF_BIN_DIR "/kvf-prefill", "--router", r->router_url,
                              "--listen", r->prefill_url, "--model", dir, "--threads", "1",
                              "--kv-mem", kv_mem, "--max-batch-tokens", max_batch_tokens,
                              "--node-id", "p-test", NULL};
        /* clang-format on */
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    child_pid = r->pid;
    /* Registration: answer the first Register. */
    bool from_router = false;
    kvf_envelope_t *env = NULL;
    for (;;) {
        env = next_msg(r, 20000, &from_router);
        assert_non_null(env);
        if (env->body_case == KVF__ENVELOPE__BODY_REGISTER)
            break;
        kvf_envelope_free(env);
    }
    const Kvf__Register *reg = env->register_;
    assert_int_equal(reg->role, KVF__ROLE__ROLE_PREFILL);
    assert_string_equal(reg->model_fingerprint, kvf_model_fingerprint(r->model));
    assert_non_null(reg->geometry);
    assert_int_equal(reg->geometry->block_size, 16);
    assert_int_equal(reg->geometry->n_layers, (uint32_t)r->geo.n_layers);
    assert_true(reg->capacity_blocks > 0);
    snprintf(r->prefill_id, sizeof(r->prefill_id), "%s", reg->node_id);
    kvf_envelope_free(env);

    Kvf__RegisterReply rr = KVF__REGISTER_REPLY__INIT;
    rr.node_id = r->prefill_id;
    rr.heartbeat_ms = 100;
    kvf_envelope_t out;
    kvf_envelope_init(&out, "router");
    out.body_case = KVF__ENVELOPE__BODY_REGISTER_REPLY;
    out.register_reply = &rr;
    send_to(r->to_prefill, &out);
}

static void rig_stop(rig_t *r)
{
    /* SIGTERM: Deregister, exit 0. */
    kill(r->pid, SIGTERM);
    int status = 0;
    uint64_t until = kvf_clock_ns() + 10000000000ull;
    pid_t w = 0;
    while ((w = waitpid(r->pid, &status, WNOHANG)) == 0 && kvf_clock_ns() < until) {
        bool from_router;
        kvf_envelope_t *env = next_msg(r, 10, &from_router);
        kvf_envelope_free(env);
    }
    if (w == 0) {
        kill(r->pid, SIGKILL);
        waitpid(r->pid, &status, 0);
        child_pid = 0;
        fail_msg("kvf-prefill did not stop on SIGTERM");
    }
    child_pid = 0;
    bool from_router;
    kvf_envelope_free(next_msg(r, 50, &from_router));
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_true(r->deregistered);
    kvf_outbox_destroy(r->to_prefill);
    kvf_outbox_destroy(r->to_reply);
    kvf_inbox_destroy(r->router_in);
    kvf_inbox_destroy(r->decode_in);
    free(r->desc);
    kvf_xfer_destroy(r->dxfer);
    kvf_kvpool_destroy(r->dpool);
    kvf_model_destroy(r->model);
}

/* The sampling message a router sends: greedy, MAX_NEW tokens in all,
 * and (as always) a seed. */
static Kvf__Sampling greedy_sampling(uint64_t req_id)
{
    Kvf__Sampling s = KVF__SAMPLING__INIT;
    s.max_tokens = MAX_NEW;
    s.has_seed = true;
    s.seed = req_id * 1000u + 7u;
    return s;
}

/* A PrefillRequest for ids (its last n_generated tokens generated by an
 * earlier epoch) with sampling message s (NULL: none), naming decode_inbox
 * as the decode node's inbox. */
static void send_prefill_msg(rig_t *r, uint64_t req_id, uint64_t epoch, const uint32_t *ids,
                             size_t n, uint32_t n_generated, const Kvf__Sampling *s,
                             const char *decode_inbox)
{
    /* An earlier epoch's sampler state travels with its tokens. */
    uint64_t rng_state = n_generated ? EARLIER_RNG_STATE : 0;
    Kvf__PrefillRequest pr = KVF__PREFILL_REQUEST__INIT;
    pr.req_id = req_id;
    pr.epoch = epoch;
    pr.n_token_ids = n;
    pr.token_ids = (uint32_t *)ids;
    pr.n_generated = n_generated;
    pr.rng_state = rng_state;
    pr.sampling = (Kvf__Sampling *)s;
    pr.decode_node_id = "d-test";
    pr.decode_inbox = (char *)decode_inbox;
    pr.decode_xfer_desc.data = r->desc;
    pr.decode_xfer_desc.len = r->desc_len;
    kvf_envelope_t env;
    kvf_envelope_init(&env, "router");
    env.body_case = KVF__ENVELOPE__BODY_PREFILL_REQUEST;
    env.prefill_request = &pr;
    send_to(r->to_prefill, &env);
}

static void send_prefill_to(rig_t *r, uint64_t req_id, uint64_t epoch, const uint32_t *ids,
                            size_t n, const char *decode_inbox)
{
    Kvf__Sampling s = greedy_sampling(req_id);
    send_prefill_msg(r, req_id, epoch, ids, n, 0, &s, decode_inbox);
}

static void send_prefill(rig_t *r, uint64_t req_id, uint64_t epoch, const uint32_t *ids, size_t n)
{
    send_prefill_to(r, req_id, epoch, ids, n, r->decode_url);
}

/* A Cancel through outbox ob (the router's, or the decode side's reply
 * outbox to order it before a reply that follows). */
static void send_cancel_on(kvf_outbox_t *ob, uint64_t req_id, uint64_t epoch)
{
    Kvf__Cancel c = KVF__CANCEL__INIT;
    c.req_id = req_id;
    c.epoch = epoch;
    c.reason = "test";
    kvf_envelope_t env;
    kvf_envelope_init(&env, "router");
    env.body_case = KVF__ENVELOPE__BODY_CANCEL;
    env.cancel = &c;
    send_to(ob, &env);
}

static void send_cancel(rig_t *r, uint64_t req_id, uint64_t epoch)
{
    send_cancel_on(r->to_prefill, req_id, epoch);
}

/* The decode node's answer to a KvAlloc: blocks for prompt + max_new,
 * a reservation over the prompt blocks. Returns the allocated ids
 * (malloc'd) in *ids_p. */
static void answer_alloc(rig_t *r, const Kvf__KvAlloc *a, int32_t status, uint64_t epoch,
                         uint32_t **ids_p, uint32_t *n_p)
{
    Kvf__KvAllocReply rep = KVF__KV_ALLOC_REPLY__INIT;
    rep.req_id = a->req_id;
    rep.epoch = epoch;
    rep.status = status;
    uint32_t n = 0, *ids = NULL;
    if (status == KVF_OK) {
        n = kvf_kv_blocks_for_tokens(&r->geo, a->n_tokens + a->max_new_tokens);
        ids = malloc(n * sizeof(uint32_t));
        assert_int_equal(kvf_kvpool_alloc(r->dpool, n, ids), KVF_OK);
        /* Scramble the order so positions and block ids differ. */
        for (uint32_t i = 0; i + 1 < n; i += 2) {
            uint32_t t = ids[i];
            ids[i] = ids[i + 1];
            ids[i + 1] = t;
        }
        uint32_t np = kvf_kv_blocks_for_tokens(&r->geo, a->n_tokens);
        kvf_xfer_range_t *ranges = calloc(np, sizeof(*ranges));
        for (uint32_t b = 0; b < np; b++) {
            ranges[b].off = kvf_kvpool_slice_offset(r->dpool, ids[b], 0);
            ranges[b].len = kvf_kv_block_bytes(&r->geo);
        }
        assert_int_equal(kvf_xfer_reserve(r->dxfer, a->req_id, a->epoch, ranges, np, 10000),
                         KVF_OK);
        free(ranges);
        rep.n_block_ids = n;
        rep.block_ids = ids;
        rep.lease_ms = 10000;
    } else {
        rep.error = "no space (test)";
    }
    /* The decode node's own outbox to the reply inbox, kept like a node's. */
    if (!r->to_reply)
        assert_int_equal(kvf_outbox_create(a->reply_inbox, &r->to_reply), KVF_OK);
    kvf_envelope_t env;
    kvf_envelope_init(&env, "d-test");
    env.body_case = KVF__ENVELOPE__BODY_KV_ALLOC_REPLY;
    env.kv_alloc_reply = &rep;
    send_to(r->to_reply, &env);
    *ids_p = ids;
    *n_p = n;
}

/* Colocated reference: each prompt alone, one forward, fresh pool, on the
 * scalar kernels with 3 threads (the node runs the best instruction set
 * here on its own thread count): docs/numerics.md says neither changes a
 * bit. */
typedef struct {
    kvf_kvpool_t *pool;
    uint32_t blocks[64];
    uint32_t first_token;
    uint64_t rng_after; /* the sampler's state after it (sampled references) */
} ref_t;

/* The first token sampled from logits as a node does for sampling message
 * s (kvf/sampling_msg.h; a fresh sampler: no earlier epoch). */
static void reference_sample(const Kvf__Sampling *s, int vocab, const float *logits, ref_t *ref)
{
    kvf_sampling_params_t sp;
    assert_int_equal(kvf_sampling_msg_params(s, vocab, &sp), KVF_OK);
    kvf_sampler_t sampler;
    assert_int_equal(kvf_sampler_init(&sampler, &sp, vocab), KVF_OK);
    ref->first_token = kvf_sampler_sample(&sampler, logits);
    ref->rng_after = kvf_sampler_state(&sampler);
    kvf_sampler_fini(&sampler);
}

/* sampling NULL: the first token is the argmax (greedy). */
static void reference(rig_t *r, const uint32_t *ids, uint32_t n, const Kvf__Sampling *sampling,
                      ref_t *ref)
{
    kvf_backend_t be;
    kvf_test_cpu_backend(&be, 3, KVF_CPU_ISA_SCALAR, KVF_CPU_WEIGHTS_NATIVE);
    assert_int_equal(kvf_kvpool_create(&r->geo, 64, &ref->pool), KVF_OK);
    kvf_engine_t *e = NULL;
    assert_int_equal(kvf_engine_create(r->model, &be, ref->pool, &e), KVF_OK);
    uint32_t nb = kvf_kv_blocks_for_tokens(&r->geo, n);
    assert_int_equal(kvf_kvpool_alloc(ref->pool, nb, ref->blocks), KVF_OK);
    float *logits = malloc((size_t)r->model->cfg.vocab * sizeof(float));
    kvf_engine_seq_t s = {
        .tokens = ids, .n_tokens = n, .block_ids = ref->blocks, .n_blocks = nb, .logits = logits};
    assert_int_equal(kvf_engine_forward(e, &s, 1, NULL), KVF_OK);
    if (sampling)
        reference_sample(sampling, r->model->cfg.vocab, logits, ref);
    else
        ref->first_token = kvf_sample_argmax(logits, r->model->cfg.vocab);
    free(logits);
    kvf_engine_destroy(e);
    kvf_backend_destroy(&be);
}

/* Compares the K/V of every prompt position in the decode pool with the
 * reference; returns the largest absolute difference. */
static double compare_kv(rig_t *r, const uint32_t *dblocks, const ref_t *ref, uint32_t n)
{
    double worst = 0;
    const kvf_kv_geometry_t *g = &r->geo;
    for (uint32_t t = 0; t < n; t++) {
        uint32_t b = t / 16, slot = t % 16;
        for (int l = 0; l < g->n_layers; l++)
            for (int kv = 0; kv < 2; kv++)
                for (int h = 0; h < g->n_kv_heads; h++) {
                    const float *x =
                        kvf_kvpool_head(r->dpool, dblocks[b], l, kv, h) + slot * g->head_dim;
                    const float *y =
                        kvf_kvpool_head(ref->pool, ref->blocks[b], l, kv, h) + slot * g->head_dim;
                    for (int d = 0; d < g->head_dim; d++) {
                        double diff = fabs((double)x[d] - (double)y[d]);
                        if (!(diff <= worst))
                            worst = isnan(diff) ? INFINITY : diff;
                    }
                }
    }
    return worst;
}

static void make_prompt(uint32_t *ids, uint32_t n, uint32_t seed)
{
    ids[0] = 510; /* BOS */
    for (uint32_t i = 1; i < n; i++)
        ids[i] = (i * 37u + seed * 101u) % 500u;
}

static void expect_no_blocks(rig_t *r);

/* The handoff test's prompts: what was sent and what came back. */
typedef struct {
    uint32_t len;
    uint32_t ids[80];
    Kvf__Sampling sampling;
    ref_t ref;
    uint32_t *dblocks, dn; /* the decode side's blocks */
    bool ready, done;
    uint64_t compute_us[2], handoff_us[2]; /* from KvReady [0] and PrefillDone [1] */
} handoff_prompt_t;

#define HANDOFF_REQ0 100u

/* Prompts of lens {5, 40, 70, 17, 1}, the 70-token one sampled (temperature,
 * top-k, top-p, the router's seed), the others greedy; references first:
 * the node's reservations must not wait on them. */
static void handoff_prompts(rig_t *r, handoff_prompt_t *hp)
{
    static const uint32_t lens[N_PROMPTS] = {5, 40, 70, 17, 1};
    for (int i = 0; i < N_PROMPTS; i++) {
        handoff_prompt_t *h = &hp[i];
        memset(h, 0, sizeof(*h));
        h->len = lens[i];
        make_prompt(h->ids, h->len, (uint32_t)i);
        h->sampling = greedy_sampling(HANDOFF_REQ0 + (uint64_t)i);
        if (i == 2) {
            h->sampling.temperature = 0.9f;
            h->sampling.top_k = 40;
            h->sampling.top_p = 0.95f;
            h->sampling.seed = 4242;
        }
        reference(r, h->ids, h->len, &h->sampling, &h->ref);
    }
}

/* The bytes a prompt of len tokens ships: all of its blocks. */
static uint64_t prompt_kv_bytes(const rig_t *r, uint32_t len)
{
    return (uint64_t)kvf_kv_blocks_for_tokens(&r->geo, len) * kvf_kv_block_bytes(&r->geo);
}

static handoff_prompt_t *handoff_prompt_of(handoff_prompt_t *hp, uint64_t req_id)
{
    assert_true(req_id >= HANDOFF_REQ0 && req_id < HANDOFF_REQ0 + N_PROMPTS);
    return &hp[req_id - HANDOFF_REQ0];
}

/* Answers each KvAlloc (request 101 first gets a stale refusal too). */
static void handoff_on_alloc(rig_t *r, handoff_prompt_t *hp, const Kvf__KvAlloc *a)
{
    handoff_prompt_t *h = handoff_prompt_of(hp, a->req_id);
    assert_int_equal(a->n_tokens, h->len);
    assert_int_equal(a->max_new_tokens, MAX_NEW);
    assert_string_equal(a->prefill_node_id, r->prefill_id);
    if (a->req_id == HANDOFF_REQ0 + 1) {
        uint32_t *none;
        uint32_t nn;
        answer_alloc(r, a, KVF_ERR_NO_SPACE, a->epoch + 7, &none, &nn); /* stale */
    }
    answer_alloc(r, a, KVF_OK, a->epoch, &h->dblocks, &h->dn);
}

/* KvReady: the prompt, the first token (and the sampler's state) of the
 * colocated reference, the sampling message unchanged, and the K/V landed
 * bit for bit. */
static void handoff_on_ready(rig_t *r, handoff_prompt_t *hp, const Kvf__KvReady *k)
{
    handoff_prompt_t *h = handoff_prompt_of(hp, k->req_id);
    assert_false(h->ready);
    h->ready = true;
    assert_int_equal(k->epoch, 1);
    assert_int_equal(k->n_tokens, h->len);
    assert_int_equal(k->n_token_ids, h->len);
    assert_memory_equal(k->token_ids, h->ids, h->len * sizeof(uint32_t));
    assert_int_equal(k->first_token, h->ref.first_token);
    if (h->sampling.temperature > 0.0f)
        assert_int_equal(k->rng_state, h->ref.rng_after);
    assert_int_equal(k->n_generated, 0);
    assert_non_null(k->sampling);
    assert_int_equal(k->sampling->max_tokens, MAX_NEW);
    assert_true(k->sampling->has_seed);
    assert_int_equal(k->sampling->seed, h->sampling.seed);
    assert_true(k->sampling->temperature == h->sampling.temperature);
    assert_int_equal(k->sampling->top_k, h->sampling.top_k);
    assert_int_equal(k->kv_bytes, prompt_kv_bytes(r, h->len));
    h->compute_us[0] = k->prefill_compute_us;
    h->handoff_us[0] = k->handoff_us;
    double worst = compare_kv(r, h->dblocks, &h->ref, h->len);
    if (worst != 0.0)
        fail_msg("request %llu: shipped K/V differs from the colocated prefill by %g",
                 (unsigned long long)k->req_id, worst);
}

/* PrefillDone: the node, the bytes shipped and the timings (compared with
 * KvReady's at the end: the two come through different inboxes, in either
 * order). */
static void handoff_on_done(rig_t *r, handoff_prompt_t *hp, const Kvf__PrefillDone *d,
                            bool from_router)
{
    handoff_prompt_t *h = handoff_prompt_of(hp, d->req_id);
    assert_true(from_router && !h->done);
    h->done = true;
    assert_int_equal(d->epoch, 1);
    assert_string_equal(d->node_id, r->prefill_id);
    assert_int_equal(d->kv_bytes, prompt_kv_bytes(r, h->len));
    assert_true(d->prefill_compute_us > 0);
    h->compute_us[1] = d->prefill_compute_us;
    h->handoff_us[1] = d->handoff_us;
}

/* Takes the node's messages until every prompt is ready and done. */
static void handoff_collect(rig_t *r, handoff_prompt_t *hp)
{
    for (;;) {
        int n_ready = 0, n_done = 0;
        for (int i = 0; i < N_PROMPTS; i++) {
            n_ready += hp[i].ready;
            n_done += hp[i].done;
        }
        if (n_ready == N_PROMPTS && n_done == N_PROMPTS)
            break;
        bool from_router = false;
        kvf_envelope_t *env = next_msg(r, 20000, &from_router);
        if (!env)
            fail_msg("timed out: %d ready, %d done", n_ready, n_done);
        if (env->body_case == KVF__ENVELOPE__BODY_KV_ALLOC) {
            handoff_on_alloc(r, hp, env->kv_alloc);
        } else if (env->body_case == KVF__ENVELOPE__BODY_PREFILL_DONE) {
            handoff_on_done(r, hp, env->prefill_done, from_router);
        } else if (env->body_case == KVF__ENVELOPE__BODY_KV_READY) {
            handoff_on_ready(r, hp, env->kv_ready);
        } else {
            fail_msg("unexpected %s", kvf_envelope_body_name(env));
        }
        kvf_envelope_free(env);
    }
}

/* Several prompts at once through a forward budget of 24 tokens: batched
 * and chunked; every request's K/V lands, KvReady carries the colocated
 * first token and PrefillDone the timings. */
static void test_prefill_handoff(void **state)
{
    (void)state;
    rig_t r;
    rig_start(&r, NULL, "4M", "24");
    handoff_prompt_t hp[N_PROMPTS];
    handoff_prompts(&r, hp);
    for (int i = 0; i < N_PROMPTS; i++)
        send_prefill_msg(&r, HANDOFF_REQ0 + (uint64_t)i, 1, hp[i].ids, hp[i].len, 0,
                         &hp[i].sampling, r.decode_url);
    /* Junk in the prefill inbox and a stale reply must not disturb it. */
    static const uint8_t junk[] = "KVF\x01garbage frame";
    assert_int_equal(kvf_outbox_send_frame(r.to_prefill, junk, sizeof(junk), 1000), KVF_OK);
    handoff_collect(&r, hp);
    for (int i = 0; i < N_PROMPTS; i++) {
        assert_int_equal(hp[i].compute_us[1], hp[i].compute_us[0]);
        assert_int_equal(hp[i].handoff_us[1], hp[i].handoff_us[0]);
    }
    assert_int_equal(r.landed_last, N_PROMPTS);
    assert_int_equal(r.rejected, 0);
    /* Local blocks all back: a heartbeat after the last request says so. */
    expect_no_blocks(&r);
    for (int i = 0; i < N_PROMPTS; i++) {
        assert_int_equal(kvf_xfer_cancel(r.dxfer, HANDOFF_REQ0 + (uint64_t)i, 1), KVF_OK);
        assert_int_equal(kvf_kvpool_release(r.dpool, hp[i].dblocks, hp[i].dn), KVF_OK);
        free(hp[i].dblocks);
        kvf_kvpool_destroy(hp[i].ref.pool);
    }
    rig_stop(&r);
}

/* The refusal test's requests 1..6 and the status each is refused with
 * (0: request 4, which is not refused but cancelled). */
static const kvf_status_t refusal_status[7] = {
    [1] = KVF_ERR_INVAL,    /* a token id beyond the vocabulary */
    [2] = KVF_ERR_TOO_BIG,  /* a prompt beyond the context */
    [3] = KVF_ERR_NO_SPACE, /* the decode node refuses the KvAlloc */
    [5] = KVF_ERR_INVAL,    /* no sampling values */
    [6] = KVF_ERR_INVAL,    /* top_p above 1 */
};

/* An Error to the router: one per refused request, with its status. */
static void refusal_on_error(const Kvf__Error *e, bool from_router, bool *got)
{
    assert_true(from_router);
    if (e->req_id >= 7 || refusal_status[e->req_id] == 0)
        fail_msg("error for request %llu: %s", (unsigned long long)e->req_id, e->message);
    assert_false(got[e->req_id]);
    got[e->req_id] = true;
    assert_int_equal(e->status, refusal_status[e->req_id]);
    assert_int_equal(e->epoch, 1);
}

/* KvAlloc for request 3 (refused) or 4 (cancelled before the reply, the
 * Cancel on the reply's own connection so it arrives first); *d4_p, *n4_p:
 * the blocks reserved for 4. */
static void refusal_on_alloc(rig_t *r, const Kvf__KvAlloc *a, uint32_t **d4_p, uint32_t *n4_p)
{
    uint32_t *none;
    uint32_t nn;
    if (a->req_id == 3) {
        answer_alloc(r, a, KVF_ERR_NO_SPACE, a->epoch, &none, &nn);
        return;
    }
    if (a->req_id != 4)
        fail_msg("kv alloc for request %llu", (unsigned long long)a->req_id);
    assert_int_equal(a->epoch, 2);
    if (!r->to_reply)
        assert_int_equal(kvf_outbox_create(a->reply_inbox, &r->to_reply), KVF_OK);
    send_cancel_on(r->to_reply, 4, 2);
    answer_alloc(r, a, KVF_OK, a->epoch, d4_p, n4_p);
}

/* Refusal (Error to the router), invalid requests (Error, nothing sent to
 * the decode node: bad tokens, too long, no or bad sampling values),
 * cancel while waiting for the allocation (ABORT reaches the decode side,
 * no KvReady). */
static void test_prefill_refusal_and_cancel(void **state)
{
    (void)state;
    rig_t r;
    rig_start(&r, NULL, "4M", "2048");
    uint32_t ids[300];
    make_prompt(ids, 300, 3);

    /* Invalid: token id out of vocab; prompt beyond the context; no
     * sampling values; top_p above 1. */
    uint32_t bad[3] = {510, 9999, 4};
    send_prefill(&r, 1, 1, bad, 3);
    send_prefill(&r, 2, 1, ids, 300);
    send_prefill_msg(&r, 5, 1, ids, 20, 0, NULL, r.decode_url);
    Kvf__Sampling bad_top_p = greedy_sampling(6);
    bad_top_p.top_p = 1.5f;
    send_prefill_msg(&r, 6, 1, ids, 20, 0, &bad_top_p, r.decode_url);
    /* Refused by the decode node. */
    send_prefill(&r, 3, 1, ids, 30);
    /* Cancelled before the reply. */
    send_prefill(&r, 4, 2, ids, 20);

    int errors = 0, aborted_wait = 0;
    bool got[7] = {0};
    uint32_t *d4 = NULL, n4 = 0;
    while (errors < 5 || !d4) {
        bool from_router = false;
        kvf_envelope_t *env = next_msg(&r, 20000, &from_router);
        if (!env)
            fail_msg("timed out: %d errors", errors);
        if (env->body_case == KVF__ENVELOPE__BODY_ERROR) {
            refusal_on_error(env->error, from_router, got);
            errors++;
        } else if (env->body_case == KVF__ENVELOPE__BODY_KV_ALLOC) {
            refusal_on_alloc(&r, env->kv_alloc, &d4, &n4);
        } else {
            fail_msg("unexpected %s", kvf_envelope_body_name(env));
        }
        kvf_envelope_free(env);
    }
    /* The cancelled request's reservation is aborted by the sender. */
    uint64_t until = kvf_clock_ns() + 5000000000ull;
    while (r.aborted == 0 && kvf_clock_ns() < until) {
        bool fr;
        kvf_envelope_t *env = next_msg(&r, 20, &fr);
        if (env)
            fail_msg("unexpected %s after cancel", kvf_envelope_body_name(env));
        aborted_wait++;
    }
    assert_int_equal(r.aborted, 1);
    assert_int_equal(r.landed_last, 0);
    assert_int_equal(kvf_xfer_cancel(r.dxfer, 4, 2), KVF_OK);
    assert_int_equal(kvf_kvpool_release(r.dpool, d4, n4), KVF_OK);
    free(d4);
    rig_stop(&r);
}

static void write_model(char *dir, size_t len, int n_layers);
static void remove_model(const char *dir);

#define ALLOC_TIMEOUT_MS 300

/* The KvAlloc deadlines (--alloc-timeout-ms through its KVF_ environment
 * override): a decode node that never answers fails its request with
 * Error{TIMEOUT}, one whose inbox nobody binds too (the KvAlloc is retried
 * until then), neither before the timeout; a request cancelled while its
 * KvAlloc waits for a reply ends silently. */
static void test_prefill_alloc_timeout(void **state)
{
    (void)state;
    rig_t r;
    char timeout[16];
    snprintf(timeout, sizeof(timeout), "%d", ALLOC_TIMEOUT_MS);
    assert_int_equal(setenv("KVF_ALLOC_TIMEOUT_MS", timeout, 1), 0);
    rig_start(&r, NULL, "4M", "2048");
    assert_int_equal(unsetenv("KVF_ALLOC_TIMEOUT_MS"), 0);
    char nowhere[64];
    url_for(nowhere, sizeof(nowhere)); /* a free port: nothing listens there */
    uint32_t ids[20];
    make_prompt(ids, 20, 5);
    uint64_t sent_ns = kvf_clock_ns();
    send_prefill(&r, 1, 1, ids, 20);
    send_prefill_to(&r, 2, 1, ids, 20, nowhere);
    send_prefill(&r, 3, 1, ids, 20);
    bool got1 = false, got2 = false;
    while (!got1 || !got2) {
        bool from_router = false;
        kvf_envelope_t *env = next_msg(&r, 20000, &from_router);
        if (!env)
            fail_msg("timed out waiting for the alloc timeouts");
        if (env->body_case == KVF__ENVELOPE__BODY_KV_ALLOC) {
            /* Never answered; request 3 is cancelled instead. */
            if (env->kv_alloc->req_id == 3)
                send_cancel(&r, 3, 1);
            else
                assert_int_equal(env->kv_alloc->req_id, 1);
        } else if (env->body_case == KVF__ENVELOPE__BODY_ERROR) {
            const Kvf__Error *e = env->error;
            assert_true(from_router);
            assert_true(e->req_id == 1 || e->req_id == 2);
            assert_int_equal(e->status, KVF_ERR_TIMEOUT);
            assert_true(kvf_clock_ns() - sent_ns >= ALLOC_TIMEOUT_MS * 1000000ull);
            if (e->req_id == 1)
                got1 = true;
            else
                got2 = true;
        } else {
            fail_msg("unexpected %s", kvf_envelope_body_name(env));
        }
        kvf_envelope_free(env);
    }
    /* Past the cancelled request's deadline too: it ends without an Error. */
    uint64_t until = sent_ns + 3 * ALLOC_TIMEOUT_MS * 1000000ull;
    while (kvf_clock_ns() < until) {
        bool fr;
        kvf_envelope_t *env = next_msg(&r, 20, &fr);
        if (env)
            fail_msg("unexpected %s", kvf_envelope_body_name(env));
    }
    rig_stop(&r);
}

/* A local pool of 8 blocks (128 tokens): prompts of 7 blocks wait for each
 * other's blocks instead of failing, and one that can never fit is refused
 * with NO_SPACE at once. */
static void test_prefill_pool_full(void **state)
{
    (void)state;
    rig_t r;
    rig_start(&r, NULL, "64K", "2048");
    enum { N = 3 };
    static uint32_t ids[N][200];
    ref_t ref[N];
    uint32_t *dblocks[N] = {0}, dn[N] = {0};
    for (int i = 0; i < N; i++) {
        make_prompt(ids[i], 100, 30 + (uint32_t)i);
        reference(&r, ids[i], 100, NULL, &ref[i]);
    }
    for (int i = 0; i < N; i++)
        send_prefill(&r, 300 + (uint64_t)i, 1, ids[i], 100);
    static uint32_t big[200];
    make_prompt(big, 200, 40);
    send_prefill(&r, 399, 1, big, 200);
    int n_ready = 0, n_done = 0;
    bool refused = false;
    while (n_ready < N || n_done < N || !refused) {
        bool from_router = false;
        kvf_envelope_t *env = next_msg(&r, 20000, &from_router);
        assert_non_null(env);
        if (env->body_case == KVF__ENVELOPE__BODY_KV_ALLOC) {
            int i = (int)(env->kv_alloc->req_id - 300);
            assert_true(i >= 0 && i < N);
            answer_alloc(&r, env->kv_alloc, KVF_OK, 1, &dblocks[i], &dn[i]);
        } else if (env->body_case == KVF__ENVELOPE__BODY_KV_READY) {
            int i = (int)(env->kv_ready->req_id - 300);
            assert_int_equal(env->kv_ready->first_token, ref[i].first_token);
            assert_true(compare_kv(&r, dblocks[i], &ref[i], 100) == 0.0);
            n_ready++;
        } else if (env->body_case == KVF__ENVELOPE__BODY_PREFILL_DONE) {
            n_done++;
        } else if (env->body_case == KVF__ENVELOPE__BODY_ERROR) {
            assert_int_equal(env->error->req_id, 399);
            assert_int_equal(env->error->status, KVF_ERR_NO_SPACE);
            refused = true;
        } else {
            fail_msg("unexpected %s", kvf_envelope_body_name(env));
        }
        kvf_envelope_free(env);
    }
    expect_no_blocks(&r);
    for (int i = 0; i < N; i++) {
        assert_int_equal(kvf_xfer_cancel(r.dxfer, 300 + (uint64_t)i, 1), KVF_OK);
        assert_int_equal(kvf_kvpool_release(r.dpool, dblocks[i], dn[i]), KVF_OK);
        free(dblocks[i]);
        kvf_kvpool_destroy(ref[i].pool);
    }
    rig_stop(&r);
}

/* Long and short prompts, chunked and batched together by a 50-token
 * budget: the K/V that lands is bit for bit what a one-forward colocated
 * prefill writes (whatever the instruction set and thread count of each
 * side), so the decode node continues exactly as `kvf generate` would. */
static void test_prefill_bit_exact(void **state)
{
    (void)state;
    rig_t r;
    char dir[256];
    write_model(dir, sizeof(dir), 2);
    rig_start(&r, dir, "16M", "50");
    enum { N = 7 };
    static const uint32_t lens[N] = {100, 3, 150, 5, 90, 8, 20};
    static uint32_t ids[N][160];
    ref_t ref[N];
    uint32_t *dblocks[N] = {0}, dn[N] = {0};
    /* References first: the node's reservations must not wait on them. */
    for (int i = 0; i < N; i++) {
        make_prompt(ids[i], lens[i], 20 + (uint32_t)i);
        reference(&r, ids[i], lens[i], NULL, &ref[i]);
    }
    for (int i = 0; i < N; i++)
        send_prefill(&r, 200 + (uint64_t)i, 1, ids[i], lens[i]);
    /* All reservations answered at once, so the prompts share forwards. */
    kvf_envelope_t *allocs[N] = {0};
    bool from_router = false;
    for (int k = 0; k < N; k++) {
        kvf_envelope_t *env = next_msg(&r, 20000, &from_router);
        assert_non_null(env);
        assert_int_equal(env->body_case, KVF__ENVELOPE__BODY_KV_ALLOC);
        int i = (int)(env->kv_alloc->req_id - 200);
        assert_true(i >= 0 && i < N && !allocs[i]);
        allocs[i] = env;
    }
    for (int i = 0; i < N; i++) {
        answer_alloc(&r, allocs[i]->kv_alloc, KVF_OK, 1, &dblocks[i], &dn[i]);
        kvf_envelope_free(allocs[i]);
    }
    int n_ready = 0, n_done = 0;
    while (n_ready < N || n_done < N) {
        kvf_envelope_t *env = next_msg(&r, 20000, &from_router);
        assert_non_null(env);
        if (env->body_case == KVF__ENVELOPE__BODY_KV_READY) {
            int i = (int)(env->kv_ready->req_id - 200);
            assert_int_equal(env->kv_ready->first_token, ref[i].first_token);
            double worst = compare_kv(&r, dblocks[i], &ref[i], lens[i]);
            if (worst != 0.0)
                fail_msg("request %d: K/V differs from the colocated prefill by %g", i, worst);
            n_ready++;
        } else if (env->body_case == KVF__ENVELOPE__BODY_PREFILL_DONE) {
            n_done++;
        } else {
            fail_msg("unexpected %s", kvf_envelope_body_name(env));
        }
        kvf_envelope_free(env);
    }
    expect_no_blocks(&r);
    for (int i = 0; i < N; i++) {
        assert_int_equal(kvf_xfer_cancel(r.dxfer, 200 + (uint64_t)i, 1), KVF_OK);
        assert_int_equal(kvf_kvpool_release(r.dpool, dblocks[i], dn[i]), KVF_OK);
        free(dblocks[i]);
        kvf_kvpool_destroy(ref[i].pool);
    }
    rig_stop(&r);
    remove_model(dir);
}

/* The router re-dispatches a request (epoch 2, after 3 tokens were
 * streamed) while epoch 1 still waits for its allocation: epoch 2 completes
 * with epoch-2 messages only (KvAlloc asks room for the tokens left,
 * KvReady carries the total and the earlier sampler state on), the late
 * epoch-1 reservation is aborted, a duplicate epoch 1 is dropped. */
static void test_prefill_redispatch(void **state)
{
    (void)state;
    rig_t r;
    rig_start(&r, NULL, "4M", "2048");
    uint32_t ids[50];
    make_prompt(ids, 50, 5);
    ref_t ref;
    reference(&r, ids, 50, NULL, &ref);
    send_prefill(&r, 9, 1, ids, 50);
    kvf_envelope_t *alloc1 = NULL;
    bool from_router = false;
    while (!alloc1) {
        alloc1 = next_msg(&r, 20000, &from_router);
        assert_non_null(alloc1);
        assert_int_equal(alloc1->body_case, KVF__ENVELOPE__BODY_KV_ALLOC);
    }
    assert_int_equal(alloc1->kv_alloc->epoch, 1);
    /* Epoch 2 after 3 tokens streamed: the prompt's last 3 are generated. */
    Kvf__Sampling s = greedy_sampling(9);
    send_prefill_msg(&r, 9, 2, ids, 50, 3, &s, r.decode_url);
    send_prefill(&r, 9, 1, ids, 50); /* late duplicate of the old attempt */
    uint32_t *b1 = NULL, *b2 = NULL, n1 = 0, n2 = 0;
    bool ready = false, done = false;
    while (!ready || !done) {
        kvf_envelope_t *env = next_msg(&r, 20000, &from_router);
        assert_non_null(env);
        switch (env->body_case) {
        case KVF__ENVELOPE__BODY_KV_ALLOC:
            assert_int_equal(env->kv_alloc->epoch, 2);
            /* What is left of the request's MAX_NEW tokens. */
            assert_int_equal(env->kv_alloc->max_new_tokens, MAX_NEW - 3);
            answer_alloc(&r, env->kv_alloc, KVF_OK, 2, &b2, &n2);
            break;
        case KVF__ENVELOPE__BODY_KV_READY: {
            const Kvf__KvReady *k = env->kv_ready;
            assert_int_equal(k->epoch, 2);
            assert_int_equal(k->first_token, ref.first_token);
            assert_int_equal(k->n_generated, 3);
            assert_int_equal(k->rng_state, EARLIER_RNG_STATE); /* greedy: not advanced */
            assert_non_null(k->sampling);
            assert_int_equal(k->sampling->max_tokens, MAX_NEW); /* the total, unchanged */
            assert_true(compare_kv(&r, b2, &ref, 50) == 0.0);
            ready = true;
            break;
        }
        case KVF__ENVELOPE__BODY_PREFILL_DONE:
            assert_int_equal(env->prefill_done->epoch, 2);
            done = true;
            break;
        default:
            fail_msg("unexpected %s", kvf_envelope_body_name(env));
        }
        kvf_envelope_free(env);
    }
    /* Decoding epoch 2 ends; then the old attempt's reservation comes
     * back late: the prefill node aborts it. */
    assert_int_equal(kvf_xfer_cancel(r.dxfer, 9, 2), KVF_OK);
    answer_alloc(&r, alloc1->kv_alloc, KVF_OK, 1, &b1, &n1);
    kvf_envelope_free(alloc1);
    uint64_t until = kvf_clock_ns() + 5000000000ull;
    while (r.aborted == 0 && kvf_clock_ns() < until) {
        kvf_envelope_t *env = next_msg(&r, 20, &from_router);
        if (env)
            fail_msg("unexpected %s", kvf_envelope_body_name(env));
    }
    assert_int_equal(r.aborted, 1);
    assert_int_equal(r.landed_last, 1);
    expect_no_blocks(&r);
    assert_int_equal(kvf_xfer_cancel(r.dxfer, 9, 1), KVF_OK);
    assert_int_equal(kvf_kvpool_release(r.dpool, b1, n1), KVF_OK);
    assert_int_equal(kvf_kvpool_release(r.dpool, b2, n2), KVF_OK);
    free(b1);
    free(b2);
    kvf_kvpool_destroy(ref.pool);
    rig_stop(&r);
}

/* A random Llama (hidden 256, head_dim 64) written to a temporary
 * directory (removed by the caller); with 6 layers a long prompt takes
 * many forwards. */
static void write_model(char *dir, size_t len, int n_layers)
{
    snprintf(dir, len, "/tmp/kvf-test-prefill-XXXXXX");
    assert_non_null(mkdtemp(dir));
    kvf_model_config_t cfg = {
        .arch = KVF_ARCH_LLAMA,
        .n_layers = n_layers,
        .hidden = 256,
        .n_heads = 4,
        .n_kv_heads = 2,
        .head_dim = 64,
        .inter = 688,
        .vocab = 512,
        .max_pos = 2048,
        .rope_theta = 10000.0,
        .rms_eps = 1e-5,
        .bos_id = 510,
        .eos_ids = {511},
        .n_eos = 1,
    };
    snprintf(cfg.arch_name, sizeof(cfg.arch_name), "LlamaForCausalLM");
    assert_int_equal(kvf_model_write_random(dir, &cfg, KVF_DTYPE_F32, 3), KVF_OK);
}

static void remove_model(const char *dir)
{
    char cmd[1200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* Starts kvf-prefill on a 6-layer model (written into dir) with 16-token
 * forwards and runs one 1500-token prompt until its first batch landed on
 * the decode side; returns the decode block ids. */
static uint32_t *start_long_request(rig_t *r, char *dir, size_t dir_len, uint64_t req_id,
                                    uint32_t seed, uint32_t *n_blocks_p)
{
    static uint32_t ids[1500];
    write_model(dir, dir_len, 6);
    rig_start(r, dir, "64M", "16");
    make_prompt(ids, 1500, seed);
    send_prefill(r, req_id, 1, ids, 1500);
    uint32_t *blocks = NULL;
    uint64_t until = kvf_clock_ns() + 20000000000ull;
    while (r->landed_bytes == 0) {
        bool from_router = false;
        kvf_envelope_t *env = next_msg(r, 50, &from_router);
        if (kvf_clock_ns() > until)
            fail_msg("nothing landed");
        if (!env)
            continue;
        if (env->body_case != KVF__ENVELOPE__BODY_KV_ALLOC)
            fail_msg("unexpected %s", kvf_envelope_body_name(env));
        answer_alloc(r, env->kv_alloc, KVF_OK, env->kv_alloc->epoch, &blocks, n_blocks_p);
        kvf_envelope_free(env);
    }
    assert_non_null(blocks);
    return blocks;
}

/* Waits until heartbeats say the prefill node holds no block. */
static void expect_no_blocks(rig_t *r)
{
    uint64_t until = kvf_clock_ns() + 10000000000ull;
    r->last_blocks_used = 1;
    while (r->last_blocks_used != 0 && kvf_clock_ns() < until) {
        bool fr;
        kvf_envelope_t *env = next_msg(r, 50, &fr);
        if (env)
            fail_msg("unexpected %s", kvf_envelope_body_name(env));
    }
    assert_int_equal(r->last_blocks_used, 0);
}

/* Cancel while the prompt's chunks are computing and shipping: the decode
 * side sees an ABORT, nothing else arrives, the local blocks come back. */
static void test_prefill_cancel_in_flight(void **state)
{
    (void)state;
    char dir[256];
    rig_t r;
    uint32_t nb = 0;
    uint32_t *blocks = start_long_request(&r, dir, sizeof(dir), 7, 9, &nb);
    send_cancel(&r, 7, 1);
    uint64_t until = kvf_clock_ns() + 10000000000ull;
    while (r.aborted == 0 && kvf_clock_ns() < until) {
        bool fr;
        kvf_envelope_t *env = next_msg(&r, 20, &fr);
        if (env)
            fail_msg("unexpected %s after cancel", kvf_envelope_body_name(env));
    }
    assert_int_equal(r.aborted, 1);
    assert_int_equal(r.landed_last, 0);
    expect_no_blocks(&r);
    assert_int_equal(kvf_xfer_cancel(r.dxfer, 7, 1), KVF_OK);
    assert_int_equal(kvf_kvpool_release(r.dpool, blocks, nb), KVF_OK);
    free(blocks);
    rig_stop(&r);
    remove_model(dir);
}

/* The decode node's transport goes away mid-transfer: the router gets
 * Error{TRANSPORT} for the request, the local blocks come back, and the
 * node keeps serving. */
static void test_prefill_decode_dies(void **state)
{
    (void)state;
    char dir[256];
    rig_t r;
    uint32_t nb = 0;
    uint32_t *blocks = start_long_request(&r, dir, sizeof(dir), 8, 11, &nb);
    kvf_xfer_destroy(r.dxfer);
    r.dxfer = NULL;
    bool got_error = false;
    uint64_t until = kvf_clock_ns() + 30000000000ull;
    while (!got_error && kvf_clock_ns() < until) {
        bool from_router = false;
        kvf_envelope_t *env = next_msg(&r, 50, &from_router);
        if (!env)
            continue;
        if (env->body_case != KVF__ENVELOPE__BODY_ERROR)
            fail_msg("unexpected %s", kvf_envelope_body_name(env));
        assert_true(from_router);
        assert_int_equal(env->error->req_id, 8);
        assert_int_equal(env->error->status, KVF_ERR_TRANSPORT);
        got_error = true;
        kvf_envelope_free(env);
    }
    assert_true(got_error);
    expect_no_blocks(&r);
    assert_int_equal(kvf_kvpool_release(r.dpool, blocks, nb), KVF_OK);
    free(blocks);
    /* rig_stop destroys a NULL transfer handle: a no-op. */
    rig_stop(&r);
    remove_model(dir);
}

int main(void)
{
    kvf_log_init("test", NULL);
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_prefill_handoff, kill_child),
        cmocka_unit_test_teardown(test_prefill_refusal_and_cancel, kill_child),
        cmocka_unit_test_teardown(test_prefill_redispatch, kill_child),
        cmocka_unit_test_teardown(test_prefill_bit_exact, kill_child),
        cmocka_unit_test_teardown(test_prefill_pool_full, kill_child),
        cmocka_unit_test_teardown(test_prefill_cancel_in_flight, kill_child),
        cmocka_unit_test_teardown(test_prefill_decode_dies, kill_child),
        cmocka_unit_test_teardown(test_prefill_alloc_timeout, kill_child),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
