/* The kvf-decode test rig (decode_rig.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "decode_rig.h"
#include "kvf/identity.h"

#include <cjson/cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvf/clock.h"
#include "kvf/file.h"
#include "kvf/sampling.h"
#include "kvf/tokenizer.h"
#include "support.h"

/* ---- golden data ---------------------------------------------------------- */

/* Prompt p's greedy continuation with a KV cache in format dt (recomputed
 * from scratch each token: cache = no-cache, bit for bit), for a node
 * whose pool is not f32: the golden ids are f32's. */
static void greedy_in_format(drig_prompt_t *p, kvf_kv_dtype_t dt)
{
    kvf_model_t *model = NULL;
    assert_int_equal(kvf_model_load(DRIG_MODEL_DIR, &model), KVF_OK);
    kvf_test_rig_t tr;
    kvf_test_rig_open_kv(&tr, model, DRIG_BLOCK_SIZE, 64, kvf_cpu_isa_best(), 1,
                         KVF_CPU_WEIGHTS_NATIVE, dt);
    uint32_t ids[64 + DRIG_N_GREEDY];
    int n = p->n_ids;
    memcpy(ids, p->ids, (size_t)n * sizeof(*ids));
    float *logits = malloc((size_t)model->cfg.vocab * sizeof(float));
    assert_non_null(logits);
    for (int i = 0; i < DRIG_N_GREEDY; i++) {
        kvf_block_table_t bt;
        kvf_block_table_init(&bt);
        kvf_test_run_chunked(&tr, &bt, ids, n, n, NULL, logits);
        kvf_block_table_release(&bt, tr.pool);
        kvf_block_table_fini(&bt);
        p->greedy[i] = ids[n++] = kvf_sample_argmax(logits, model->cfg.vocab);
    }
    free(logits);
    kvf_test_rig_close(&tr);
    kvf_model_destroy(model);
}

static void load_golden(drig_t *h)
{
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(kvf_file_read(KVF_TEST_DATA "/golden/expected.json", 64u << 20, &text, &len),
                     KVF_OK);
    cJSON *root = cJSON_ParseWithLength(text, len);
    assert_non_null(root);
    cJSON *prompts = cJSON_GetObjectItem(
        cJSON_GetObjectItem(cJSON_GetObjectItem(root, "models"), "tiny-llama-f32"), "prompts");
    assert_int_equal(cJSON_GetArraySize(prompts), DRIG_N_PROMPTS);
    for (int p = 0; p < DRIG_N_PROMPTS; p++) {
        cJSON *pr = cJSON_GetArrayItem(prompts, p);
        cJSON *ids = cJSON_GetObjectItem(pr, "ids"),
              *greedy = cJSON_GetObjectItem(pr, "greedy_ids");
        h->prompts[p].n_ids = cJSON_GetArraySize(ids);
        assert_true(h->prompts[p].n_ids <= 64);
        for (int i = 0; i < h->prompts[p].n_ids; i++)
            h->prompts[p].ids[i] = (uint32_t)cJSON_GetArrayItem(ids, i)->valuedouble;
        assert_int_equal(cJSON_GetArraySize(greedy), DRIG_N_GREEDY);
        for (int i = 0; i < DRIG_N_GREEDY; i++)
            h->prompts[p].greedy[i] = (uint32_t)cJSON_GetArrayItem(greedy, i)->valuedouble;
        if (kvf_test_env_kv_dtype() != KVF_KV_F32)
            greedy_in_format(&h->prompts[p], kvf_test_env_kv_dtype());
    }
    cJSON_Delete(root);
    free(text);
}

/* ---- the fake router ------------------------------------------------------ */

drig_req_t *drig_seen(drig_t *h, uint64_t req_id)
{
    for (int i = 0; i < h->n_reqs; i++)
        if (h->reqs[i].req_id == req_id)
            return &h->reqs[i];
    assert_true(h->n_reqs < DRIG_MAX_REQ);
    drig_req_t *r = &h->reqs[h->n_reqs++];
    memset(r, 0, sizeof(*r));
    r->req_id = req_id;
    r->first_chunk_tokens = -1;
    return r;
}

/* The registration token the rig's router hands the node. */
static const uint8_t drig_reg_token[KVF_REG_TOKEN_LEN] = "drig-reg-token!";

void drig_send(drig_t *h, kvf_envelope_t *env)
{
    env->sender = "fake-router";
    env->reg_token = (ProtobufCBinaryData){sizeof(drig_reg_token), (uint8_t *)drig_reg_token};
    assert_int_equal(kvf_outbox_send(h->to_node, env, 2000), KVF_OK);
}

void drig_send_cancel(drig_t *h, uint64_t req_id, uint64_t epoch, const char *reason)
{
    Kvf__Cancel c = KVF__CANCEL__INIT;
    c.req_id = req_id;
    c.epoch = epoch;
    if (reason)
        c.reason = (char *)reason;
    kvf_envelope_t env;
    kvf_envelope_init(&env, "fake-router");
    env.body_case = KVF__ENVELOPE__BODY_CANCEL;
    env.cancel = &c;
    drig_send(h, &env);
}

/* A chunk's tokens sit at positions n_generated - n_tokens onwards: the
 * node emits every token, the first included, each exactly once. */
static void on_chunk(drig_t *h, const Kvf__TokenChunk *ch)
{
    drig_req_t *r = drig_seen(h, ch->req_id);
    if (r->finish)
        r->n_chunks_after_finish++;
    assert_int_equal(ch->seq, r->next_seq);
    r->next_seq++;
    assert_int_equal(ch->n_generated - ch->n_tokens, r->base + (uint32_t)r->n_tokens);
    if (ch->prefill) {
        assert_true(r->first_chunk_tokens < 0); /* on the first chunk alone */
        r->n_relayed++;
        r->relayed_kv_bytes = ch->prefill->kv_bytes;
    }
    if (r->first_chunk_tokens < 0)
        r->first_chunk_tokens = (int)ch->n_tokens;
    for (size_t i = 0; i < ch->n_tokens; i++) {
        assert_true(r->n_tokens < DRIG_MAX_OUT);
        r->tokens[r->n_tokens++] = ch->tokens[i];
    }
    size_t len = ch->text.len; /* bytes: the text may hold U+0000 */
    assert_true(r->text_len + len < DRIG_MAX_TEXT);
    if (len)
        memcpy(r->text + r->text_len, ch->text.data, len);
    r->text_len += len;
    r->text[r->text_len] = '\0';
    r->text_after[r->n_tokens] = r->text_len;
    r->n_generated = ch->n_generated;
    if (ch->finish_reason)
        r->finish = ch->finish_reason;
}

/* The node's Register: the geometry of the golden model, the transfer
 * descriptor kept for the fake prefill node; answered at once. */
static void on_register(drig_t *h, const Kvf__Register *r)
{
    assert_int_equal(r->role, KVF__ROLE__ROLE_DECODE);
    assert_string_equal(r->node_id, "dec-test");
    assert_int_equal(r->geometry->block_size, DRIG_BLOCK_SIZE);
    assert_int_equal(r->geometry->dtype, kvf_test_env_kv_dtype()); /* the pool's format */
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
    rep.prefix_key = (ProtobufCBinaryData){16, (uint8_t *)drig_prefix_key};
    rep.reg_token = (ProtobufCBinaryData){sizeof(drig_reg_token), (uint8_t *)drig_reg_token};
    kvf_envelope_t out;
    kvf_envelope_init(&out, "fake-router");
    out.body_case = KVF__ENVELOPE__BODY_REGISTER_REPLY;
    out.register_reply = &rep;
    drig_send(h, &out);
}

static void on_alloc_reply(drig_t *h, const Kvf__KvAllocReply *a)
{
    h->have_alloc_reply = true;
    h->alloc_req_id = a->req_id;
    h->alloc_status = a->status;
    assert_true(a->n_block_ids <= 64);
    if (a->n_block_ids)
        memcpy(h->alloc_blocks, a->block_ids, a->n_block_ids * sizeof(uint32_t));
    h->n_alloc_blocks = a->n_block_ids;
    if (a->status == 0)
        assert_int_equal(a->lease_ms, DRIG_LEASE_MS);
}

const uint8_t drig_prefix_key[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

static void on_message(drig_t *h, const kvf_envelope_t *env)
{
    switch (env->body_case) {
    case KVF__ENVELOPE__BODY_REGISTER:
        on_register(h, env->register_);
        break;
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
        drig_req_t *r = drig_seen(h, env->prefill_done->req_id);
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
        drig_seen(h, env->error->req_id)->error = env->error->status;
        break;
    case KVF__ENVELOPE__BODY_KV_ALLOC_REPLY:
        on_alloc_reply(h, env->kv_alloc_reply);
        break;
    case KVF__ENVELOPE__BODY_DEREGISTER:
        h->deregistered = true;
        break;
    case KVF__ENVELOPE__BODY_PREFIX_UPDATE:
        prefix_view_apply(&h->prefix, env->prefix_update, drig_prefix_key);
        break;
    default:
        fail_msg("unexpected %s from the node", kvf_envelope_body_name(env));
    }
}

/* Receives for up to ms milliseconds, or until done(h, arg) holds. */
bool drig_pump(drig_t *h, int ms, bool (*done)(drig_t *, const void *), const void *arg)
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

static bool registered(drig_t *h, const void *arg)
{
    (void)arg;
    return h->have_load;
}

/* The request's record, or NULL when nothing came for it yet. */
static const drig_req_t *find_seen(const drig_t *h, uint64_t req_id)
{
    for (int i = 0; i < h->n_reqs; i++)
        if (h->reqs[i].req_id == req_id)
            return &h->reqs[i];
    return NULL;
}

bool drig_req_finished(drig_t *h, const void *arg)
{
    const drig_req_t *r = find_seen(h, *(const uint64_t *)arg);
    return r && r->finish != 0;
}

bool drig_req_errored(drig_t *h, const void *arg)
{
    const drig_req_t *r = find_seen(h, *(const uint64_t *)arg);
    return r && r->error != 0;
}

bool drig_alloc_replied(drig_t *h, const void *arg)
{
    const uint64_t *id = arg;
    return h->have_alloc_reply && h->alloc_req_id == *id;
}

/* A heartbeat sent after this call reports no block in use. */
static bool blocks_free_again(drig_t *h, const void *arg)
{
    const uint64_t *after = arg;
    return h->heartbeats > *after && h->blocks_used == 0;
}

void drig_expect_no_blocks_used(drig_t *h)
{
    uint64_t after = h->heartbeats;
    assert_true(drig_pump(h, 5000, blocks_free_again, &after));
    assert_int_equal(h->blocks_used, 0);
}

void drig_start(drig_t *h, const char *extra)
{
    int p1, p2;
    assert_int_equal(kvf_net_free_port(&p1), KVF_OK);
    assert_int_equal(kvf_net_free_port(&p2), KVF_OK);
    snprintf(h->router_url, sizeof(h->router_url), "tcp://127.0.0.1:%d", p1);
    snprintf(h->node_url, sizeof(h->node_url), "tcp://127.0.0.1:%d", p2);
    assert_int_equal(kvf_inbox_create(h->router_url, 0, &h->inbox), KVF_OK);
    assert_int_equal(kvf_outbox_create(h->node_url, &h->to_node), KVF_OK);
    char lease[16];
    snprintf(lease, sizeof(lease), "%d", DRIG_LEASE_MS);
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
                                DRIG_MODEL_DIR,
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
    assert_true(drig_pump(h, 30000, registered, NULL));
}

int drig_stop(drig_t *h)
{
    int status = 0;
    if (h->pid > 0) {
        kill(h->pid, SIGTERM);
        uint64_t deadline = kvf_clock_ns() + 10000000000ull;
        while (waitpid(h->pid, &status, WNOHANG) == 0) {
            /* keep the node's last messages flowing */
            drig_pump(h, 50, NULL, NULL);
            if (kvf_clock_ns() > deadline) {
                kill(h->pid, SIGKILL);
                waitpid(h->pid, &status, 0);
                break;
            }
        }
        h->pid = 0;
    }
    drig_pump(h, 200, NULL, NULL);
    return status;
}

int drig_setup(void **state)
{
    drig_t *h = calloc(1, sizeof(*h));
    if (!h)
        return -1;
    load_golden(h);
    *state = h;
    return 0;
}

int drig_teardown(void **state)
{
    drig_t *h = *state;
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
Kvf__Sampling drig_greedy_sampling(uint32_t max_tokens)
{
    Kvf__Sampling s = KVF__SAMPLING__INIT;
    s.max_tokens = max_tokens;
    s.ignore_eos = true;
    s.seed = 12345;
    s.has_seed = true;
    return s;
}

/* n_generated: the last tokens of ids an earlier epoch streamed. */
void drig_send_prefill_request_resumed(drig_t *h, uint64_t req_id, uint64_t epoch,
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
    drig_send(h, &env);
}

void drig_send_prefill_request(drig_t *h, uint64_t req_id, uint64_t epoch, const uint32_t *ids,
                               size_t n, Kvf__Sampling *s)
{
    drig_send_prefill_request_resumed(h, req_id, epoch, ids, n, s, 0);
}

/* The tokenizer's text for ids, NUL-terminated (malloc'd, the caller
 * frees it). */
char *drig_decode_text(const uint32_t *ids, size_t n, size_t *len_p)
{
    kvf_tokenizer_t *tok = NULL;
    assert_int_equal(kvf_tokenizer_load(DRIG_MODEL_DIR, &tok), KVF_OK);
    char *text = NULL;
    assert_int_equal(kvf_tokenizer_decode(tok, ids, n, &text, len_p), KVF_OK);
    kvf_tokenizer_destroy(tok);
    return text;
}

/* Every token from the node, the first in a chunk of its own, and the
 * text of them all. */
void drig_check_golden(drig_t *h, uint64_t req_id, const drig_prompt_t *g)
{
    drig_req_t *r = drig_seen(h, req_id);
    assert_int_equal(r->first_chunk_tokens, 1);
    assert_int_equal(r->n_tokens, DRIG_N_GREEDY);
    for (int i = 0; i < DRIG_N_GREEDY; i++)
        assert_int_equal(r->tokens[i], g->greedy[i]);
    assert_int_equal(r->finish, KVF__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(r->n_generated, DRIG_N_GREEDY);
    assert_int_equal(r->error, 0);
    size_t len = 0;
    char *want = drig_decode_text(g->greedy, DRIG_N_GREEDY, &len);
    assert_int_equal(r->text_len, len);
    assert_memory_equal(r->text, want, len);
    free(want);
}
/* ---- the fake prefill node ------------------------------------------------ */

void drig_prefill_open(drig_t *h, drig_prefill_t *f)
{
    assert_int_equal(kvf_model_load(DRIG_MODEL_DIR, &f->model), KVF_OK);
    kvf_kv_geometry_t geo =
        kvf_engine_kv_geometry(f->model, DRIG_BLOCK_SIZE, kvf_test_env_kv_dtype());
    assert_int_equal(kvf_kvpool_create(&geo, 64, &f->pool), KVF_OK);
    assert_int_equal(kvf_backend_cpu_create(1, &f->be), KVF_OK);
    assert_int_equal(kvf_engine_create(f->model, &f->be, f->pool, &f->engine), KVF_OK);
    kvf_xfer_config_t xc = {
        .backend = KVF_XFER_UCX,
        .mem_type = KVF_XFER_MEM_HOST,
        .pool = kvf_kvpool_base(f->pool),
        .pool_bytes = kvf_kvpool_bytes(f->pool),
        .geometry = kvf_xfer_geometry_of_pool(&geo),
    };
    assert_int_equal(kvf_xfer_create(&xc, &f->xfer), KVF_OK);
    assert_int_equal(kvf_xfer_connect(f->xfer, h->desc, h->desc_len, &f->peer), KVF_OK);
    f->logits = malloc((size_t)f->model->cfg.vocab * sizeof(float));
    assert_non_null(f->logits);
}

void drig_prefill_close(drig_prefill_t *f)
{
    free(f->logits);
    kvf_xfer_destroy(f->xfer);
    kvf_engine_destroy(f->engine);
    kvf_backend_destroy(&f->be);
    kvf_kvpool_destroy(f->pool);
    kvf_model_destroy(f->model);
}

void drig_send_kv_alloc(drig_t *h, uint64_t req_id, uint64_t epoch, uint32_t n_tokens,
                        uint32_t max_new)
{
    Kvf__KvAlloc a = KVF__KV_ALLOC__INIT;
    a.req_id = req_id;
    a.epoch = epoch;
    a.n_tokens = n_tokens;
    a.max_new_tokens = max_new;
    a.prefill_node_id = "fake-prefill";
    a.reply_inbox = h->router_url;
    uint8_t alloc_token[KVF_ALLOC_TOKEN_LEN];
    kvf_identity_alloc_token(drig_reg_token, req_id, epoch, alloc_token);
    a.alloc_token = (ProtobufCBinaryData){sizeof(alloc_token), alloc_token};
    kvf_envelope_t env;
    kvf_envelope_init(&env, "fake-prefill");
    env.body_case = KVF__ENVELOPE__BODY_KV_ALLOC;
    env.kv_alloc = &a;
    h->have_alloc_reply = false;
    drig_send(h, &env);
}

void drig_send_kv_ready(drig_t *h, uint64_t req_id, uint64_t epoch, uint32_t first,
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
    k.kv_bytes = DRIG_RELAY_KV_BYTES;
    kvf_envelope_t env;
    kvf_envelope_init(&env, "fake-prefill");
    env.body_case = KVF__ENVELOPE__BODY_KV_READY;
    env.kv_ready = &k;
    drig_send(h, &env);
}

/* Computes the prompt into local blocks and ships every (block, layer)
 * slice into the node's blocks in one LAST batch; returns the first token
 * (greedy). */
uint32_t drig_prefill_and_ship(drig_t *h, drig_prefill_t *f, uint64_t req_id, uint64_t epoch,
                               const drig_prompt_t *g)
{
    uint32_t nb = (uint32_t)(g->n_ids + DRIG_BLOCK_SIZE - 1) / DRIG_BLOCK_SIZE;
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
