/* kvf-decode as a process: this test plays the router (and, for the KV
 * handoff, the prefill node) over real sockets and the real transport,
 * and checks the tokens against the golden greedy continuations of
 * tests/data/golden (an independent float64 reference), their text
 * against the tokenizer's decoding, the finishes the node decides (EOS,
 * stop strings, length), a re-dispatched request's text, the block
 * accounting reported in heartbeats, and the failure paths (lease expiry,
 * refusal, cancel, stale and malformed messages, SIGTERM). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <cjson/cJSON.h>
#include <ctype.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvf/backend.h"
#include "kvf/clock.h"
#include "kvf/engine.h"
#include "kvf/file.h"
#include "kvf/kvcache.h"
#include "kvf/log.h"
#include "kvf/model.h"
#include "kvf/msg.h"
#include "kvf/sampling.h"
#include "kvf/tokenizer.h"
#include "kvf/xfer.h"

#define MODEL_DIR  KVF_TEST_DATA "/golden/tiny-llama-f32"
#define N_PROMPTS  4
#define N_GREEDY   24
#define BLOCK_SIZE 8
#define LEASE_MS   600
#define MAX_REQ    24
#define MAX_OUT    512
#define MAX_TEXT   8192

typedef struct {
    uint32_t ids[64];
    int n_ids;
    uint32_t greedy[N_GREEDY];
} golden_prompt_t;

/* What the fake router saw of one request (of one epoch). */
typedef struct {
    uint64_t req_id;
    bool prefill_done; /* a local prefill's PrefillDone came */
    uint32_t base;     /* tokens earlier epochs streamed (a re-dispatch) */
    uint32_t tokens[MAX_OUT];
    int n_tokens;        /* tokens of this epoch */
    char text[MAX_TEXT]; /* every chunk's text, concatenated */
    size_t text_len;
    size_t text_after[MAX_OUT + 1]; /* text_len once i tokens had come */
    uint32_t next_seq;
    uint32_t n_generated;   /* from the last chunk */
    int first_chunk_tokens; /* tokens of the first chunk, -1 before it */
    int finish;             /* Kvf__FinishReason, 0 until finished */
    int error;              /* last Error status, 0 if none */
    int n_chunks_after_finish;
} req_seen_t;

typedef struct {
    pid_t pid;
    char router_url[64], node_url[64];
    kvf_inbox_t *inbox; /* the fake router's (and fake prefill node's) inbox */
    kvf_outbox_t *to_node;
    uint8_t desc[4096];
    size_t desc_len;
    uint32_t capacity;
    uint32_t max_context;
    bool have_load;
    uint32_t blocks_used, blocks_total, running;
    uint64_t heartbeats;
    bool deregistered;
    req_seen_t reqs[MAX_REQ];
    int n_reqs;
    /* the last KvAllocReply */
    bool have_alloc_reply;
    uint64_t alloc_req_id;
    int alloc_status;
    uint32_t alloc_blocks[64];
    size_t n_alloc_blocks;
    golden_prompt_t prompts[N_PROMPTS];
} harness_t;

/* ---- golden data ---------------------------------------------------------- */

static void load_golden(harness_t *h)
{
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(kvf_file_read(KVF_TEST_DATA "/golden/expected.json", 64u << 20, &text, &len),
                     KVF_OK);
    cJSON *root = cJSON_ParseWithLength(text, len);
    assert_non_null(root);
    cJSON *prompts = cJSON_GetObjectItem(
        cJSON_GetObjectItem(cJSON_GetObjectItem(root, "models"), "tiny-llama-f32"), "prompts");
    assert_int_equal(cJSON_GetArraySize(prompts), N_PROMPTS);
    for (int p = 0; p < N_PROMPTS; p++) {
        cJSON *pr = cJSON_GetArrayItem(prompts, p);
        cJSON *ids = cJSON_GetObjectItem(pr, "ids"),
              *greedy = cJSON_GetObjectItem(pr, "greedy_ids");
        h->prompts[p].n_ids = cJSON_GetArraySize(ids);
        assert_true(h->prompts[p].n_ids <= 64);
        for (int i = 0; i < h->prompts[p].n_ids; i++)
            h->prompts[p].ids[i] = (uint32_t)cJSON_GetArrayItem(ids, i)->valuedouble;
        assert_int_equal(cJSON_GetArraySize(greedy), N_GREEDY);
        for (int i = 0; i < N_GREEDY; i++)
            h->prompts[p].greedy[i] = (uint32_t)cJSON_GetArrayItem(greedy, i)->valuedouble;
    }
    cJSON_Delete(root);
    free(text);
}

/* ---- the fake router ------------------------------------------------------ */

static req_seen_t *seen(harness_t *h, uint64_t req_id)
{
    for (int i = 0; i < h->n_reqs; i++)
        if (h->reqs[i].req_id == req_id)
            return &h->reqs[i];
    assert_true(h->n_reqs < MAX_REQ);
    req_seen_t *r = &h->reqs[h->n_reqs++];
    memset(r, 0, sizeof(*r));
    r->req_id = req_id;
    r->first_chunk_tokens = -1;
    return r;
}

static void send_node(harness_t *h, kvf_envelope_t *env)
{
    env->sender = "fake-router";
    assert_int_equal(kvf_outbox_send(h->to_node, env, 2000), KVF_OK);
}

/* A chunk's tokens sit at positions n_generated - n_tokens onwards: the
 * node emits every token, the first included, each exactly once. */
static void on_chunk(harness_t *h, const Kvf__TokenChunk *ch)
{
    req_seen_t *r = seen(h, ch->req_id);
    if (r->finish)
        r->n_chunks_after_finish++;
    assert_int_equal(ch->seq, r->next_seq);
    r->next_seq++;
    assert_int_equal(ch->n_generated - ch->n_tokens, r->base + (uint32_t)r->n_tokens);
    if (r->first_chunk_tokens < 0)
        r->first_chunk_tokens = (int)ch->n_tokens;
    for (size_t i = 0; i < ch->n_tokens; i++) {
        assert_true(r->n_tokens < MAX_OUT);
        r->tokens[r->n_tokens++] = ch->tokens[i];
    }
    size_t len = ch->text ? strlen(ch->text) : 0;
    assert_true(r->text_len + len < MAX_TEXT);
    memcpy(r->text + r->text_len, ch->text, len);
    r->text_len += len;
    r->text[r->text_len] = '\0';
    r->text_after[r->n_tokens] = r->text_len;
    r->n_generated = ch->n_generated;
    if (ch->finish_reason)
        r->finish = ch->finish_reason;
}

static void on_message(harness_t *h, const kvf_envelope_t *env)
{
    switch (env->body_case) {
    case KVF__ENVELOPE__BODY_REGISTER: {
        const Kvf__Register *r = env->register_;
        assert_int_equal(r->role, KVF__ROLE__ROLE_DECODE);
        assert_string_equal(r->node_id, "dec-test");
        assert_int_equal(r->geometry->block_size, BLOCK_SIZE);
        assert_int_equal(r->geometry->n_layers, 2);
        assert_int_equal(r->geometry->n_kv_heads, 2);
        assert_int_equal(r->geometry->head_dim, 16);
        assert_true(r->xfer_desc.len > 0 && r->xfer_desc.len <= sizeof(h->desc));
        memcpy(h->desc, r->xfer_desc.data, r->xfer_desc.len);
        h->desc_len = r->xfer_desc.len;
        h->capacity = r->capacity_blocks;
        h->max_context = r->max_context;
        assert_true(r->prefill_local);
        Kvf__RegisterReply rep = KVF__REGISTER_REPLY__INIT;
        rep.node_id = r->node_id;
        rep.heartbeat_ms = 100;
        kvf_envelope_t out;
        kvf_envelope_init(&out, "fake-router");
        out.body_case = KVF__ENVELOPE__BODY_REGISTER_REPLY;
        out.register_reply = &rep;
        send_node(h, &out);
        break;
    }
    case KVF__ENVELOPE__BODY_HEARTBEAT: {
        const Kvf__Load *l = env->heartbeat->load;
        h->have_load = true;
        h->heartbeats++;
        h->blocks_used = l->blocks_used;
        h->blocks_total = l->blocks_total;
        h->running = l->running;
        assert_int_equal(l->blocks_used + l->blocks_free, l->blocks_total);
        break;
    }
    case KVF__ENVELOPE__BODY_PREFILL_DONE: {
        req_seen_t *r = seen(h, env->prefill_done->req_id);
        assert_false(r->prefill_done);
        /* the timings come before the first token */
        assert_int_equal(r->n_tokens, 0);
        r->prefill_done = true;
        break;
    }
    case KVF__ENVELOPE__BODY_TOKEN_BATCH:
        for (size_t c = 0; c < env->token_batch->n_chunks; c++)
            on_chunk(h, env->token_batch->chunks[c]);
        break;
    case KVF__ENVELOPE__BODY_ERROR:
        seen(h, env->error->req_id)->error = env->error->status;
        break;
    case KVF__ENVELOPE__BODY_KV_ALLOC_REPLY: {
        const Kvf__KvAllocReply *a = env->kv_alloc_reply;
        h->have_alloc_reply = true;
        h->alloc_req_id = a->req_id;
        h->alloc_status = a->status;
        assert_true(a->n_block_ids <= 64);
        if (a->n_block_ids)
            memcpy(h->alloc_blocks, a->block_ids, a->n_block_ids * sizeof(uint32_t));
        h->n_alloc_blocks = a->n_block_ids;
        if (a->status == 0)
            assert_int_equal(a->lease_ms, LEASE_MS);
        break;
    }
    case KVF__ENVELOPE__BODY_DEREGISTER:
        h->deregistered = true;
        break;
    default:
        fail_msg("unexpected %s from the node", kvf_envelope_body_name(env));
    }
}

/* Receives for up to ms milliseconds, or until done(h, arg) holds. */
static bool pump(harness_t *h, int ms, bool (*done)(harness_t *, const void *), const void *arg)
{
    uint64_t deadline = kvf_clock_ns() + (uint64_t)ms * 1000000ull;
    for (;;) {
        if (done && done(h, arg))
            return true;
        int left = kvf_clock_ms_until(deadline);
        if (left <= 0)
            return false;
        kvf_envelope_t *env = NULL;
        kvf_status_t st = kvf_inbox_recv(h->inbox, left < 100 ? left : 100, &env);
        if (st == KVF_ERR_TIMEOUT || st == KVF_ERR_AGAIN)
            continue;
        assert_int_equal(st, KVF_OK);
        on_message(h, env);
        kvf_envelope_free(env);
    }
}

static bool registered(harness_t *h, const void *arg)
{
    (void)arg;
    return h->have_load;
}

/* The request's record, or NULL when nothing came for it yet. */
static const req_seen_t *find_seen(const harness_t *h, uint64_t req_id)
{
    for (int i = 0; i < h->n_reqs; i++)
        if (h->reqs[i].req_id == req_id)
            return &h->reqs[i];
    return NULL;
}

static bool req_finished(harness_t *h, const void *arg)
{
    const req_seen_t *r = find_seen(h, *(const uint64_t *)arg);
    return r && r->finish != 0;
}

static bool req_errored(harness_t *h, const void *arg)
{
    const req_seen_t *r = find_seen(h, *(const uint64_t *)arg);
    return r && r->error != 0;
}

static bool alloc_replied(harness_t *h, const void *arg)
{
    const uint64_t *id = arg;
    return h->have_alloc_reply && h->alloc_req_id == *id;
}

/* A heartbeat sent after this call reports no block in use. */
static bool blocks_free_again(harness_t *h, const void *arg)
{
    const uint64_t *after = arg;
    return h->heartbeats > *after && h->blocks_used == 0;
}

static void expect_no_blocks_used(harness_t *h)
{
    uint64_t after = h->heartbeats;
    assert_true(pump(h, 5000, blocks_free_again, &after));
    assert_int_equal(h->blocks_used, 0);
}

static void start_node(harness_t *h, const char *extra)
{
    int p1, p2;
    assert_int_equal(kvf_net_free_port(&p1), KVF_OK);
    assert_int_equal(kvf_net_free_port(&p2), KVF_OK);
    snprintf(h->router_url, sizeof(h->router_url), "tcp://127.0.0.1:%d", p1);
    snprintf(h->node_url, sizeof(h->node_url), "tcp://127.0.0.1:%d", p2);
    assert_int_equal(kvf_inbox_create(h->router_url, 0, &h->inbox), KVF_OK);
    assert_int_equal(kvf_outbox_create(h->node_url, &h->to_node), KVF_OK);
    char lease[16];
    snprintf(lease, sizeof(lease), "%d", LEASE_MS);
    h->pid = fork();
    assert_true(h->pid >= 0);
    if (h->pid == 0) {
        const char *bin = KVF_BIN_DIR "/kvf-decode";
        /* extra: one optional flag and value, e.g. "--max-running 2" */
        char extra_flag[32] = "", extra_val[32] = "";
        if (extra)
            sscanf(extra, "%31s %31s", extra_flag, extra_val);
        const char *argv[32] = {bin,
                                "--router",
                                h->router_url,
                                "--listen",
                                h->node_url,
                                "--model",
                                MODEL_DIR,
                                "--threads",
                                "1",
                                "--block-size",
                                "8",
                                "--lease-ms",
                                lease,
                                "--prefill-local",
                                "--node-id",
                                "dec-test",
                                "--max-batch-tokens",
                                "10"};
        int n = 18;
        if (extra) {
            argv[n++] = extra_flag;
            argv[n++] = extra_val;
        }
        argv[n] = NULL;
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    assert_true(pump(h, 30000, registered, NULL));
}

static int stop_node(harness_t *h)
{
    int status = 0;
    if (h->pid > 0) {
        kill(h->pid, SIGTERM);
        uint64_t deadline = kvf_clock_ns() + 10000000000ull;
        while (waitpid(h->pid, &status, WNOHANG) == 0) {
            /* keep the node's last messages flowing */
            pump(h, 50, NULL, NULL);
            if (kvf_clock_ns() > deadline) {
                kill(h->pid, SIGKILL);
                waitpid(h->pid, &status, 0);
                break;
            }
        }
        h->pid = 0;
    }
    pump(h, 200, NULL, NULL);
    return status;
}

static int setup(void **state)
{
    harness_t *h = calloc(1, sizeof(*h));
    if (!h)
        return -1;
    load_golden(h);
    *state = h;
    return 0;
}

static int teardown(void **state)
{
    harness_t *h = *state;
    if (h->pid > 0) {
        kill(h->pid, SIGKILL);
        waitpid(h->pid, NULL, 0);
    }
    kvf_outbox_destroy(h->to_node);
    kvf_inbox_destroy(h->inbox);
    free(h);
    return 0;
}

/* As the router sends it: max_tokens in total, a seed always. */
static Kvf__Sampling greedy_sampling(uint32_t max_tokens)
{
    Kvf__Sampling s = KVF__SAMPLING__INIT;
    s.max_tokens = max_tokens;
    s.ignore_eos = true;
    s.seed = 12345;
    s.has_seed = true;
    return s;
}

/* n_generated: the last tokens of ids an earlier epoch streamed. */
static void send_prefill_request_resumed(harness_t *h, uint64_t req_id, uint64_t epoch,
                                         const uint32_t *ids, size_t n, Kvf__Sampling *s,
                                         uint32_t n_generated)
{
    Kvf__PrefillRequest pr = KVF__PREFILL_REQUEST__INIT;
    pr.req_id = req_id;
    pr.epoch = epoch;
    pr.token_ids = (uint32_t *)ids;
    pr.n_token_ids = n;
    pr.n_generated = n_generated;
    pr.sampling = s;
    pr.decode_node_id = "dec-test";
    pr.decode_inbox = h->node_url;
    kvf_envelope_t env;
    kvf_envelope_init(&env, "fake-router");
    env.body_case = KVF__ENVELOPE__BODY_PREFILL_REQUEST;
    env.prefill_request = &pr;
    send_node(h, &env);
}

static void send_prefill_request(harness_t *h, uint64_t req_id, uint64_t epoch, const uint32_t *ids,
                                 size_t n, Kvf__Sampling *s)
{
    send_prefill_request_resumed(h, req_id, epoch, ids, n, s, 0);
}

/* The tokenizer's text for ids, NUL-terminated (malloc'd, the caller
 * frees it). */
static char *decode_text(const uint32_t *ids, size_t n, size_t *len_p)
{
    kvf_tokenizer_t *tok = NULL;
    assert_int_equal(kvf_tokenizer_load(MODEL_DIR, &tok), KVF_OK);
    char *text = NULL;
    assert_int_equal(kvf_tokenizer_decode(tok, ids, n, &text, len_p), KVF_OK);
    kvf_tokenizer_destroy(tok);
    return text;
}

/* Every token from the node, the first in a chunk of its own, and the
 * text of them all. */
static void check_golden(harness_t *h, uint64_t req_id, const golden_prompt_t *g)
{
    req_seen_t *r = seen(h, req_id);
    assert_int_equal(r->first_chunk_tokens, 1);
    assert_int_equal(r->n_tokens, N_GREEDY);
    for (int i = 0; i < N_GREEDY; i++)
        assert_int_equal(r->tokens[i], g->greedy[i]);
    assert_int_equal(r->finish, KVF__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(r->n_generated, N_GREEDY);
    assert_int_equal(r->error, 0);
    size_t len = 0;
    char *want = decode_text(g->greedy, N_GREEDY, &len);
    assert_int_equal(r->text_len, len);
    assert_memory_equal(r->text, want, len);
    free(want);
}

/* ---- tests ------------------------------------------------------------------ */

/* Whole requests served by the node alone (--prefill-local), four at once:
 * chunked prefill (10 tokens per forward) beside decoding sequences. */
static void test_local_prefill_matches_golden(void **state)
{
    harness_t *h = *state;
    start_node(h, NULL);
    assert_int_equal(h->max_context, 256);
    Kvf__Sampling s = greedy_sampling(N_GREEDY);
    for (int p = 0; p < N_PROMPTS; p++)
        send_prefill_request(h, 100 + p, 1, h->prompts[p].ids, h->prompts[p].n_ids, &s);
    for (int p = 0; p < N_PROMPTS; p++) {
        uint64_t id = 100 + p;
        assert_true(pump(h, 30000, req_finished, &id));
    }
    for (int p = 0; p < N_PROMPTS; p++) {
        check_golden(h, 100 + p, &h->prompts[p]);
        assert_true(seen(h, 100 + p)->prefill_done);
    }
    expect_no_blocks_used(h);
    assert_int_equal(stop_node(h), 0);
    assert_true(h->deregistered);
    for (int i = 0; i < h->n_reqs; i++)
        assert_int_equal(h->reqs[i].n_chunks_after_finish, 0);
}

/* The fake prefill node: its own pool and engine, the real transport. */
typedef struct {
    kvf_model_t *model;
    kvf_backend_t be;
    kvf_kvpool_t *pool;
    kvf_engine_t *engine;
    kvf_xfer_t *xfer;
    kvf_xfer_peer_t *peer;
    float *logits;
} fake_prefill_t;

static void prefill_open(harness_t *h, fake_prefill_t *f)
{
    assert_int_equal(kvf_model_load(MODEL_DIR, &f->model), KVF_OK);
    kvf_kv_geometry_t geo = kvf_engine_kv_geometry(f->model, BLOCK_SIZE);
    assert_int_equal(kvf_kvpool_create(&geo, 64, &f->pool), KVF_OK);
    assert_int_equal(kvf_backend_cpu_create(1, &f->be), KVF_OK);
    assert_int_equal(kvf_engine_create(f->model, &f->be, f->pool, &f->engine), KVF_OK);
    kvf_xfer_config_t xc = {
        .backend = KVF_XFER_UCX,
        .mem_type = KVF_XFER_MEM_HOST,
        .pool = kvf_kvpool_base(f->pool),
        .pool_bytes = kvf_kvpool_bytes(f->pool),
        .geometry = {.block_size = BLOCK_SIZE,
                     .n_layers = 2,
                     .n_kv_heads = 2,
                     .head_dim = 16,
                     .dtype = KVF_XFER_DTYPE_F32,
                     .layout = 1},
    };
    assert_int_equal(kvf_xfer_create(&xc, &f->xfer), KVF_OK);
    assert_int_equal(kvf_xfer_connect(f->xfer, h->desc, h->desc_len, &f->peer), KVF_OK);
    f->logits = malloc((size_t)f->model->cfg.vocab * sizeof(float));
    assert_non_null(f->logits);
}

static void prefill_close(fake_prefill_t *f)
{
    free(f->logits);
    kvf_xfer_destroy(f->xfer);
    kvf_engine_destroy(f->engine);
    kvf_backend_destroy(&f->be);
    kvf_kvpool_destroy(f->pool);
    kvf_model_destroy(f->model);
}

static void send_kv_alloc(harness_t *h, uint64_t req_id, uint64_t epoch, uint32_t n_tokens,
                          uint32_t max_new)
{
    Kvf__KvAlloc a = KVF__KV_ALLOC__INIT;
    a.req_id = req_id;
    a.epoch = epoch;
    a.n_tokens = n_tokens;
    a.max_new_tokens = max_new;
    a.prefill_node_id = "fake-prefill";
    a.reply_inbox = h->router_url;
    kvf_envelope_t env;
    kvf_envelope_init(&env, "fake-prefill");
    env.body_case = KVF__ENVELOPE__BODY_KV_ALLOC;
    env.kv_alloc = &a;
    h->have_alloc_reply = false;
    send_node(h, &env);
}

static void send_kv_ready(harness_t *h, uint64_t req_id, uint64_t epoch, uint32_t first,
                          const uint32_t *ids, uint32_t n, Kvf__Sampling *s)
{
    Kvf__KvReady k = KVF__KV_READY__INIT;
    k.req_id = req_id;
    k.epoch = epoch;
    k.first_token = first;
    k.n_tokens = n;
    k.sampling = s;
    k.token_ids = (uint32_t *)ids;
    k.n_token_ids = n;
    k.rng_state = s->seed;
    kvf_envelope_t env;
    kvf_envelope_init(&env, "fake-prefill");
    env.body_case = KVF__ENVELOPE__BODY_KV_READY;
    env.kv_ready = &k;
    send_node(h, &env);
}

/* Computes the prompt into local blocks and ships every (block, layer)
 * slice into the node's blocks in one LAST batch; returns the first token
 * (greedy). */
static uint32_t prefill_and_ship(harness_t *h, fake_prefill_t *f, uint64_t req_id, uint64_t epoch,
                                 const golden_prompt_t *g)
{
    uint32_t nb = (uint32_t)(g->n_ids + BLOCK_SIZE - 1) / BLOCK_SIZE;
    uint32_t local[16];
    assert_true(nb <= 16 && nb <= h->n_alloc_blocks);
    assert_int_equal(kvf_kvpool_alloc(f->pool, nb, local), KVF_OK);
    kvf_engine_seq_t seq = {.tokens = g->ids,
                            .n_tokens = (uint32_t)g->n_ids,
                            .start_pos = 0,
                            .block_ids = local,
                            .n_blocks = nb,
                            .logits = f->logits};
    assert_int_equal(kvf_engine_forward(f->engine, &seq, 1, NULL), KVF_OK);
    uint32_t first = kvf_sample_argmax(f->logits, f->model->cfg.vocab);
    const kvf_kv_geometry_t *geo = kvf_kvpool_geometry(f->pool);
    size_t slice = kvf_kv_slice_bytes(geo), block = kvf_kv_block_bytes(geo);
    kvf_xfer_slice_t slices[64];
    size_t n = 0;
    for (int l = 0; l < geo->n_layers; l++)
        for (uint32_t b = 0; b < nb; b++)
            slices[n++] = (kvf_xfer_slice_t){
                .local_off = kvf_kvpool_slice_offset(f->pool, local[b], l),
                .remote_off = (uint64_t)h->alloc_blocks[b] * block + (uint64_t)l * slice,
                .len = slice};
    kvf_xfer_batch_spec_t spec = {
        .req_id = req_id, .epoch = epoch, .slices = slices, .n_slices = n, .flags = KVF_XFER_LAST};
    kvf_xfer_batch_t *batch = NULL;
    assert_int_equal(kvf_xfer_post(f->peer, &spec, &batch), KVF_OK);
    assert_int_equal(kvf_xfer_wait(batch, 5000), KVF_OK);
    kvf_xfer_batch_release(batch);
    assert_int_equal(kvf_kvpool_release(f->pool, local, nb), KVF_OK);
    return first;
}

/* The disaggregated path: KvAlloc -> reply -> transfer (LAST) and KvReady,
 * in both orders -> decode. */
static void handoff_matches_golden(harness_t *h, const char *mode)
{
    start_node(h, mode);
    fake_prefill_t f = {0};
    prefill_open(h, &f);
    Kvf__Sampling s = greedy_sampling(N_GREEDY);
    for (int p = 0; p < N_PROMPTS; p++) {
        uint64_t id = 200 + p;
        const golden_prompt_t *g = &h->prompts[p];
        send_kv_alloc(h, id, 1, (uint32_t)g->n_ids, N_GREEDY);
        assert_true(pump(h, 5000, alloc_replied, &id));
        assert_int_equal(h->alloc_status, 0);
        /* prompt + generation room, block size 8 */
        assert_int_equal(h->n_alloc_blocks, (g->n_ids + N_GREEDY + BLOCK_SIZE - 1) / BLOCK_SIZE);
        if (p % 2) {
            /* KvReady first: the node must wait for the K/V. */
            send_kv_ready(h, id, 1, g->greedy[0], g->ids, (uint32_t)g->n_ids, &s);
            pump(h, 100, NULL, NULL);
            assert_int_equal(seen(h, id)->n_tokens, 0);
            assert_int_equal(prefill_and_ship(h, &f, id, 1, g), g->greedy[0]);
        } else {
            uint32_t first = prefill_and_ship(h, &f, id, 1, g);
            assert_int_equal(first, g->greedy[0]);
            send_kv_ready(h, id, 1, first, g->ids, (uint32_t)g->n_ids, &s);
        }
    }
    for (int p = 0; p < N_PROMPTS; p++) {
        uint64_t id = 200 + p;
        assert_true(pump(h, 30000, req_finished, &id));
        /* the first token (sampled by the prefill node) comes from the
         * decode node, as every other */
        check_golden(h, id, &h->prompts[p]);
        assert_false(seen(h, id)->prefill_done);
    }
    expect_no_blocks_used(h);
    prefill_close(&f);
    assert_int_equal(stop_node(h), 0);
}

static void test_handoff_rma_matches_golden(void **state)
{
    handoff_matches_golden(*state, "--xfer-mode rma");
}

static void test_handoff_am_matches_golden(void **state)
{
    handoff_matches_golden(*state, "--xfer-mode am");
}

/* A first token that is EOS ends the request at once: a finishing chunk
 * with no token, nothing counted, no text. */
static void test_eos_first_token(void **state)
{
    harness_t *h = *state;
    start_node(h, NULL);
    fake_prefill_t f = {0};
    prefill_open(h, &f);
    assert_true(f.model->cfg.n_eos > 0);
    uint32_t eos = (uint32_t)f.model->cfg.eos_ids[0];
    const golden_prompt_t *g = &h->prompts[0];
    uint64_t id = 250;
    Kvf__Sampling s = greedy_sampling(N_GREEDY);
    s.ignore_eos = false;
    send_kv_alloc(h, id, 1, (uint32_t)g->n_ids, N_GREEDY);
    assert_true(pump(h, 5000, alloc_replied, &id));
    assert_int_equal(h->alloc_status, 0);
    prefill_and_ship(h, &f, id, 1, g);
    send_kv_ready(h, id, 1, eos, g->ids, (uint32_t)g->n_ids, &s);
    assert_true(pump(h, 30000, req_finished, &id));
    const req_seen_t *r = seen(h, id);
    assert_int_equal(r->finish, KVF__FINISH_REASON__FINISH_STOP);
    assert_int_equal(r->n_tokens, 0);
    assert_int_equal(r->first_chunk_tokens, 0);
    assert_int_equal(r->n_generated, 0);
    assert_int_equal(r->text_len, 0);
    assert_int_equal(r->error, 0);
    expect_no_blocks_used(h);
    prefill_close(&f);
    assert_int_equal(stop_node(h), 0);
}

/* Sends a local prefill request and waits for its end. */
static const req_seen_t *run_local(harness_t *h, uint64_t id, uint64_t epoch, const uint32_t *ids,
                                   size_t n, Kvf__Sampling *s, uint32_t n_generated)
{
    seen(h, id)->base = n_generated;
    send_prefill_request_resumed(h, id, epoch, ids, n, s, n_generated);
    assert_true(pump(h, 30000, req_finished, &id));
    assert_int_equal(seen(h, id)->error, 0);
    return seen(h, id);
}

/* A stop string made of the end of one token's text and the start of the
 * next: found in the golden continuations (the first place where both
 * sides are plain ASCII and the string occurs nowhere before). *k_p: the
 * first token's index; *cut_p: where the stop string starts in the text. */
static bool find_split_stop(const golden_prompt_t *g, char stop[4], int *k_p, size_t *cut_p)
{
    for (int k = 1; k + 1 < N_GREEDY; k++) {
        size_t la = 0, lb = 0;
        char *a = decode_text(g->greedy, (size_t)k + 1, &la);
        char *b = decode_text(g->greedy, (size_t)k + 2, &lb);
        bool ok = la >= 1 && lb >= la + 2 && !memcmp(a, b, la) &&
                  isalpha((unsigned char)a[la - 1]) && isalpha((unsigned char)b[la]) &&
                  isalpha((unsigned char)b[la + 1]);
        if (ok) {
            memcpy(stop, b + la - 1, 3);
            stop[3] = '\0';
            ok = strstr(b, stop) == b + la - 1;
        }
        free(a);
        free(b);
        if (ok) {
            *k_p = k;
            *cut_p = la - 1;
            return true;
        }
    }
    return false;
}

/* The node matches stop strings in its own text: one that spans two
 * tokens ends the request with both tokens, and its text ends before the
 * stop string; the part of it in the first token's text was held back
 * and never sent. */
static void test_stop_string_across_tokens(void **state)
{
    harness_t *h = *state;
    start_node(h, NULL);
    char stop[4];
    int k = -1, p = 0;
    size_t cut = 0;
    while (p < N_PROMPTS && !find_split_stop(&h->prompts[p], stop, &k, &cut))
        p++;
    assert_true(p < N_PROMPTS);
    const golden_prompt_t *g = &h->prompts[p];
    Kvf__Sampling s = greedy_sampling(N_GREEDY);
    char *stops[1] = {stop};
    s.stop = stops;
    s.n_stop = 1;
    const req_seen_t *r = run_local(h, 260, 1, g->ids, g->n_ids, &s, 0);
    assert_int_equal(r->finish, KVF__FINISH_REASON__FINISH_STOP);
    assert_int_equal(r->n_tokens, k + 2);
    for (int i = 0; i < k + 2; i++)
        assert_int_equal(r->tokens[i], g->greedy[i]);
    assert_int_equal(r->n_generated, (uint32_t)k + 2);
    size_t len = 0;
    char *want = decode_text(g->greedy, (size_t)k + 2, &len);
    assert_int_equal(r->text_len, cut);
    assert_memory_equal(r->text, want, cut);
    /* the chunk of the stop string's first token held its part back */
    assert_true(r->text_after[k + 1] <= cut);
    free(want);
    expect_no_blocks_used(h);
    assert_int_equal(stop_node(h), 0);
}

/* A request dispatched again after m streamed tokens (a new epoch with the
 * prompt and those tokens) continues the text exactly where the client's
 * ends: what the first epoch sent of its first m tokens, followed by what
 * the new epoch sends, is the whole text. Cut where the first epoch still
 * held text back: half a UTF-8 character, and the start of a stop string. */
static void test_redispatch_text_continues(void **state)
{
    harness_t *h = *state;
    start_node(h, NULL);
    const golden_prompt_t *g = &h->prompts[1];
    Kvf__Sampling s = greedy_sampling(N_GREEDY);
    char stop_text[] = "enX"; /* "en" occurs in the output, "enX" does not */
    char *stops[1] = {stop_text};
    s.stop = stops;
    s.n_stop = 1;
    const req_seen_t *whole = run_local(h, 270, 1, g->ids, g->n_ids, &s, 0);
    assert_int_equal(whole->finish, KVF__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(whole->n_tokens, N_GREEDY);
    const uint32_t cuts[2] = {1, 5};
    for (int c = 0; c < 2; c++) {
        uint32_t m = cuts[c];
        size_t len = 0;
        char *streamed = decode_text(g->greedy, m, &len);
        free(streamed);
        assert_true(whole->text_after[m] < len); /* something was held back */
        uint32_t ids[64 + N_GREEDY];
        memcpy(ids, g->ids, (size_t)g->n_ids * sizeof(*ids));
        memcpy(ids + g->n_ids, g->greedy, m * sizeof(*ids));
        const req_seen_t *again = run_local(h, 271 + c, 2, ids, (size_t)g->n_ids + m, &s, m);
        assert_int_equal(again->finish, KVF__FINISH_REASON__FINISH_LENGTH);
        assert_int_equal(again->n_tokens, N_GREEDY - (int)m);
        for (int i = 0; i < again->n_tokens; i++)
            assert_int_equal(again->tokens[i], g->greedy[m + i]);
        assert_int_equal(again->n_generated, N_GREEDY);
        size_t before = whole->text_after[m];
        assert_int_equal(before + again->text_len, whole->text_len);
        assert_memory_equal(again->text, whole->text + before, again->text_len);
    }
    expect_no_blocks_used(h);
    assert_int_equal(stop_node(h), 0);
}

/* A reservation nobody writes: the lease ends, the router hears TIMEOUT,
 * the blocks come back. A stale KvReady does not seal it. */
static void test_lease_expiry_and_stale_epoch(void **state)
{
    harness_t *h = *state;
    start_node(h, NULL);
    const golden_prompt_t *g = &h->prompts[0];
    uint64_t id = 300;
    send_kv_alloc(h, id, 2, (uint32_t)g->n_ids, 8);
    assert_true(pump(h, 5000, alloc_replied, &id));
    assert_int_equal(h->alloc_status, 0);
    Kvf__Sampling s = greedy_sampling(8);
    send_kv_ready(h, id, 1, g->greedy[0], g->ids, (uint32_t)g->n_ids, &s); /* stale epoch */
    /* an older epoch's KvAlloc is stale too: no reply */
    send_kv_alloc(h, id, 1, (uint32_t)g->n_ids, 8);
    uint64_t t0 = kvf_clock_ns();
    assert_true(pump(h, 5000, req_errored, &id));
    assert_int_equal(seen(h, id)->error, KVF_ERR_TIMEOUT);
    assert_false(h->have_alloc_reply);
    uint64_t waited_ms = (kvf_clock_ns() - t0) / 1000000;
    assert_true(waited_ms >= LEASE_MS / 2);
    assert_int_equal(seen(h, id)->n_tokens, 0);
    /* released after the lease plus the transport's grace */
    expect_no_blocks_used(h);
    assert_int_equal(stop_node(h), 0);
}

static void test_refusals(void **state)
{
    harness_t *h = *state;
    start_node(h, "--max-running 2");
    uint64_t id = 400;
    /* beyond the context (256) */
    send_kv_alloc(h, id, 1, 256, 1);
    assert_true(pump(h, 5000, alloc_replied, &id));
    assert_int_equal(h->alloc_status, KVF_ERR_INVAL);
    /* max_running */
    for (id = 401; id <= 403; id++) {
        send_kv_alloc(h, id, 1, 10, 10);
        assert_true(pump(h, 5000, alloc_replied, &id));
    }
    assert_int_equal(h->alloc_status, KVF_ERR_NO_SPACE);
    assert_int_equal(h->n_alloc_blocks, 0);
    Kvf__Cancel c = KVF__CANCEL__INIT;
    kvf_envelope_t env;
    for (id = 401; id <= 402; id++) {
        c.req_id = id;
        c.epoch = 0;
        kvf_envelope_init(&env, "fake-router");
        env.body_case = KVF__ENVELOPE__BODY_CANCEL;
        env.cancel = &c;
        send_node(h, &env);
    }
    expect_no_blocks_used(h);
    id = 404;
    send_kv_alloc(h, id, 1, 200, h->capacity * BLOCK_SIZE);
    assert_true(pump(h, 5000, alloc_replied, &id));
    assert_int_equal(h->alloc_status, 0); /* capped by the context: fits */
    /* bad prefill requests: token outside the vocabulary, empty prompt */
    uint32_t bad_ids[2] = {1, 9999};
    Kvf__Sampling s = greedy_sampling(4);
    send_prefill_request(h, 405, 1, bad_ids, 2, &s);
    send_prefill_request(h, 406, 1, bad_ids, 0, &s);
    s.top_p = 2.0f;
    send_prefill_request(h, 407, 1, bad_ids, 1, &s);
    for (id = 405; id <= 407; id++) {
        assert_true(pump(h, 5000, req_errored, &id));
        assert_int_equal(seen(h, id)->error, KVF_ERR_INVAL);
    }
    c.req_id = 404;
    kvf_envelope_init(&env, "fake-router");
    env.body_case = KVF__ENVELOPE__BODY_CANCEL;
    env.cancel = &c;
    send_node(h, &env);
    expect_no_blocks_used(h);
    assert_int_equal(stop_node(h), 0);
}

/* Starts a long request (200 tokens) and pauses the node (SIGSTOP) once
 * it streams, so that what the test sends next waits in the node's inbox
 * and is taken at most one step later. The tiny model decodes a token in
 * well under a millisecond: a request that finished before the pause is
 * retried under the next id. Returns the paused request's id. */
static uint64_t start_and_pause(harness_t *h, const golden_prompt_t *g, uint64_t base_id)
{
    Kvf__Sampling s = greedy_sampling(200);
    for (uint64_t attempt = 0; attempt < 5; attempt++) {
        uint64_t id = base_id + attempt;
        send_prefill_request(h, id, 1, g->ids, g->n_ids, &s);
        uint64_t deadline = kvf_clock_ns() + 20000000000ull;
        while (seen(h, id)->n_tokens < 1 && kvf_clock_ns() < deadline)
            pump(h, 1, NULL, NULL);
        assert_int_equal(kill(h->pid, SIGSTOP), 0);
        pump(h, 100, NULL, NULL); /* what was already sent */
        if (!seen(h, id)->finish)
            return id;
        assert_int_equal(kill(h->pid, SIGCONT), 0);
    }
    fail_msg("every request finished before the node could be paused");
    return 0;
}

/* Garbage frames and unexpected messages are dropped; a cancel stops a
 * running sequence and frees its blocks; the node keeps serving. */
static void test_malformed_and_cancel(void **state)
{
    harness_t *h = *state;
    start_node(h, NULL);
    uint8_t junk[64];
    for (size_t i = 0; i < sizeof(junk); i++)
        junk[i] = (uint8_t)(i * 37);
    assert_int_equal(kvf_outbox_send_frame(h->to_node, junk, sizeof(junk), 1000), KVF_OK);
    Kvf__TokenBatch tb = KVF__TOKEN_BATCH__INIT;
    tb.node_id = "nobody";
    kvf_envelope_t env;
    kvf_envelope_init(&env, "fake-router");
    env.body_case = KVF__ENVELOPE__BODY_TOKEN_BATCH;
    env.token_batch = &tb;
    send_node(h, &env);
    Kvf__KvAlloc a = KVF__KV_ALLOC__INIT; /* no reply inbox */
    a.req_id = 1;
    a.epoch = 1;
    a.n_tokens = 3;
    kvf_envelope_init(&env, "fake-prefill");
    env.body_case = KVF__ENVELOPE__BODY_KV_ALLOC;
    env.kv_alloc = &a;
    send_node(h, &env);

    const golden_prompt_t *g = &h->prompts[1];
    uint64_t id = start_and_pause(h, g, 500);
    Kvf__Sampling s;
    Kvf__Cancel c = KVF__CANCEL__INIT;
    c.req_id = id;
    c.epoch = 1;
    c.reason = "client went away";
    kvf_envelope_init(&env, "fake-router");
    env.body_case = KVF__ENVELOPE__BODY_CANCEL;
    env.cancel = &c;
    send_node(h, &env);
    assert_int_equal(kill(h->pid, SIGCONT), 0);
    expect_no_blocks_used(h);
    /* Tokens the node had queued for sending when it was stopped still
     * arrive after the cancel (how many depends on the machine's speed),
     * so the count is no measure of the cancel; that the sequence never
     * finishes, stops far short of its 200 tokens (a step takes well under
     * a millisecond here) and frees its blocks is. */
    assert_int_equal(seen(h, id)->finish, 0);
    assert_true(seen(h, id)->n_tokens < 200);
    /* the tokens it did stream are the golden ones */
    for (int i = 0; i < seen(h, id)->n_tokens && i < N_GREEDY; i++)
        assert_int_equal(seen(h, id)->tokens[i], g->greedy[i]);

    /* still serving */
    s = greedy_sampling(N_GREEDY);
    send_prefill_request(h, 510, 1, h->prompts[2].ids, h->prompts[2].n_ids, &s);
    id = 510;
    assert_true(pump(h, 30000, req_finished, &id));
    check_golden(h, 510, &h->prompts[2]);
    expect_no_blocks_used(h);
    assert_int_equal(stop_node(h), 0);
}

/* Waits (pumping its messages) for the node to exit on its own. */
static int wait_node_exit(harness_t *h, int timeout_ms)
{
    int status = -1;
    uint64_t deadline = kvf_clock_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (waitpid(h->pid, &status, WNOHANG) == 0) {
        pump(h, 20, NULL, NULL);
        if (kvf_clock_ns() > deadline) {
            kill(h->pid, SIGKILL);
            waitpid(h->pid, &status, 0);
            status = -1;
            break;
        }
    }
    h->pid = 0;
    pump(h, 200, NULL, NULL);
    return status;
}

/* SIGTERM while a request decodes: the node drains: the sequence runs to
 * its end (the golden tokens, no error), then the node deregisters and
 * exits 0 by itself. */
static void test_sigterm_drains(void **state)
{
    harness_t *h = *state;
    start_node(h, NULL);
    uint64_t id = start_and_pause(h, &h->prompts[3], 600);
    assert_int_equal(kill(h->pid, SIGTERM), 0); /* taken when it resumes */
    assert_int_equal(kill(h->pid, SIGCONT), 0);
    int status = wait_node_exit(h, 30000);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_true(h->deregistered);
    assert_int_equal(seen(h, id)->error, 0);
    assert_int_equal(seen(h, id)->finish, KVF__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(seen(h, id)->n_tokens, 200);
    for (int i = 0; i < N_GREEDY; i++)
        assert_int_equal(seen(h, id)->tokens[i], h->prompts[3].greedy[i]);
}

/* SIGINT while a request decodes: the node stops at once; the router hears
 * that the request failed here (to send it elsewhere), the node
 * deregisters and exits 0. */
static void test_sigint_stops(void **state)
{
    harness_t *h = *state;
    start_node(h, NULL);
    uint64_t id = start_and_pause(h, &h->prompts[3], 600);
    assert_int_equal(kill(h->pid, SIGINT), 0); /* taken when it resumes */
    assert_int_equal(kill(h->pid, SIGCONT), 0);
    int status = wait_node_exit(h, 30000);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_true(h->deregistered);
    assert_int_equal(seen(h, id)->error, KVF_ERR_CLOSED);
    assert_int_equal(seen(h, id)->finish, 0);
}

int main(void)
{
    kvf_log_init("test", NULL);
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_local_prefill_matches_golden, setup, teardown),
        cmocka_unit_test_setup_teardown(test_handoff_rma_matches_golden, setup, teardown),
        cmocka_unit_test_setup_teardown(test_handoff_am_matches_golden, setup, teardown),
        cmocka_unit_test_setup_teardown(test_eos_first_token, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_string_across_tokens, setup, teardown),
        cmocka_unit_test_setup_teardown(test_redispatch_text_continues, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lease_expiry_and_stale_epoch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_and_cancel, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sigterm_drains, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sigint_stops, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
