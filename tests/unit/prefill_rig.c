/* The kvf-prefill test rig (prefill_rig.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "prefill_rig.h"
#include "kvf/identity.h"

#include "kvf/backend.h"
#include "kvf/clock.h"
#include "kvf/engine.h"
#include "kvf/kv_format.h"
#include "kvf/sampling.h"
#include "kvf/sampling_msg.h"
#include "support.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

/* The running kvf-prefill, killed by the teardown if a test failed before
 * stopping it. */
static pid_t rig_child_pid;

void rig_url_for(char *buf, size_t len)
{
    int port = 0;
    assert_int_equal(kvf_net_free_port(&port), KVF_OK);
    snprintf(buf, len, "tcp://127.0.0.1:%d", port);
}

/* The registration token the rig's router hands the prefill node. */
static const uint8_t rig_reg_token[KVF_REG_TOKEN_LEN] = "prig-reg-token!";

void rig_send(kvf_outbox_t *ob, kvf_envelope_t *env)
{
    env->reg_token = (ProtobufCBinaryData){sizeof(rig_reg_token), (uint8_t *)rig_reg_token};
    assert_int_equal(kvf_outbox_send(ob, env, 2000), KVF_OK);
}

/* The decode side's answer to a KvLease, as a decode node's: the named
 * reservations that are live here are renewed. */
static void rig_answer_lease(rig_t *r, const Kvf__KvLease *m)
{
    r->leases_seen++;
    if (!r->dxfer || !r->to_reply)
        return;
    Kvf__WorkRef *renewed[m->n_refs ? m->n_refs : 1];
    size_t n = 0;
    for (size_t i = 0; i < m->n_refs; i++)
        if (kvf_xfer_renew(r->dxfer, m->refs[i]->req_id, m->refs[i]->epoch) == KVF_OK)
            renewed[n++] = m->refs[i];
    Kvf__KvLeaseReply rep = KVF__KV_LEASE_REPLY__INIT;
    rep.sent_ns = m->sent_ns;
    rep.lease_ms = 10000;
    rep.renewed = renewed;
    rep.n_renewed = n;
    kvf_envelope_t env;
    kvf_envelope_init(&env, "d-test"); /* the rig's decode node id */
    env.body_case = KVF__ENVELOPE__BODY_KV_LEASE_REPLY;
    env.kv_lease_reply = &rep;
    rig_send(r->to_reply, &env);
}

const uint8_t rig_prefix_key[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

kvf_envelope_t *rig_next_msg(rig_t *r, int ms, bool *from_router_p)
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
                if (env->heartbeat->load) {
                    r->last_blocks_used = env->heartbeat->load->blocks_used;
                    r->last_disk_read_ns = env->heartbeat->load->tier_disk_read_ns;
                }
                kvf_envelope_free(env);
                continue;
            }
            if (env->body_case == KVF__ENVELOPE__BODY_DEREGISTER) {
                r->deregistered = true;
                kvf_envelope_free(env);
                continue;
            }
            if (env->body_case == KVF__ENVELOPE__BODY_PREFIX_UPDATE) {
                prefix_view_apply(&r->prefix, env->prefix_update, rig_prefix_key);
                kvf_envelope_free(env);
                continue;
            }
            *from_router_p = true;
            return env;
        }
        if (kvf_inbox_recv(r->decode_in, 1, &env) == KVF_OK) {
            if (env->body_case == KVF__ENVELOPE__BODY_KV_LEASE) {
                rig_answer_lease(r, env->kv_lease);
                kvf_envelope_free(env);
                continue;
            }
            *from_router_p = false;
            return env;
        }
        if (kvf_clock_ns() >= until)
            return NULL;
    }
}

int rig_kill_child(void **state)
{
    (void)state;
    if (rig_child_pid > 0) {
        kill(rig_child_pid, SIGKILL);
        waitpid(rig_child_pid, NULL, 0);
        rig_child_pid = 0;
    }
    return 0;
}

void rig_start(rig_t *r, const char *model_dir, const char *kv_mem, const char *max_batch_tokens)
{
    rig_start_args(r, model_dir, kv_mem, max_batch_tokens, NULL);
}

void rig_start_args(rig_t *r, const char *model_dir, const char *kv_mem,
                    const char *max_batch_tokens, const char *const *extra)
{
    memset(r, 0, sizeof(*r));
    char dir[1024];
    if (model_dir)
        snprintf(dir, sizeof(dir), "%s", model_dir);
    else
        snprintf(dir, sizeof(dir), "%s/golden/tiny-llama-f32", KVF_TEST_DATA);
    assert_int_equal(kvf_model_load(dir, &r->model), KVF_OK);
    r->geo = kvf_engine_kv_geometry(r->model, 16, kvf_test_env_kv_dtype());
    assert_int_equal(kvf_kvpool_create(&r->geo, 256, &r->dpool), KVF_OK);
    kvf_xfer_config_t xc = {
        .backend = KVF_XFER_UCX,
        .pool = kvf_kvpool_base(r->dpool),
        .pool_bytes = kvf_kvpool_bytes(r->dpool),
        .geometry = kvf_xfer_geometry_of_pool(&r->geo),
    };
    assert_int_equal(kvf_xfer_create(&xc, &r->dxfer), KVF_OK);
    assert_int_equal(kvf_xfer_export(r->dxfer, &r->desc, &r->desc_len), KVF_OK);
    rig_url_for(r->router_url, sizeof(r->router_url));
    rig_url_for(r->decode_url, sizeof(r->decode_url));
    rig_url_for(r->prefill_url, sizeof(r->prefill_url));
    assert_int_equal(kvf_inbox_create(r->router_url, 0, &r->router_in), KVF_OK);
    assert_int_equal(kvf_inbox_create(r->decode_url, 0, &r->decode_in), KVF_OK);
    assert_int_equal(kvf_outbox_create(r->prefill_url, &r->to_prefill), KVF_OK);

    /* "N blocks": a pool of N blocks of this run's KV format, whatever
     * bytes a block of it takes. */
    char kv_mem_buf[32];
    unsigned n_pool_blocks = 0;
    char unit[8] = "";
    if (sscanf(kv_mem, "%u %7s", &n_pool_blocks, unit) == 2 && strcmp(unit, "blocks") == 0) {
        snprintf(kv_mem_buf, sizeof(kv_mem_buf), "%zu",
                 (size_t)n_pool_blocks * kvf_kv_block_bytes(&r->geo));
        kv_mem = kv_mem_buf;
    }

    r->pid = fork();
    assert_true(r->pid >= 0);
    if (r->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
        /* clang-format off */
        const char *argv[32] = {KVF_BIN_DIR "/kvf-prefill", "--router", r->router_url,
                                "--listen", r->prefill_url, "--model", dir, "--threads", "1",
                                "--kv-mem", kv_mem, "--max-batch-tokens", max_batch_tokens,
                                "--node-id", "p-test", NULL};
        /* clang-format on */
        for (size_t i = 15; extra && *extra && i < 31; i++)
            argv[i] = *extra++;
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    rig_child_pid = r->pid;
    /* Registration: answer the first Register. */
    bool from_router = false;
    kvf_envelope_t *env = NULL;
    for (;;) {
        env = rig_next_msg(r, 20000, &from_router);
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
    assert_int_equal(reg->geometry->dtype, r->geo.dtype); /* the node's pool format */
    assert_int_equal(reg->geometry->n_layers, (uint32_t)r->geo.n_layers);
    assert_true(reg->capacity_blocks > 0);
    snprintf(r->prefill_id, sizeof(r->prefill_id), "%s", reg->node_id);
    kvf_envelope_free(env);

    Kvf__RegisterReply rr = KVF__REGISTER_REPLY__INIT;
    rr.node_id = r->prefill_id;
    rr.heartbeat_ms = 100;
    rr.prefix_key = (ProtobufCBinaryData){16, (uint8_t *)rig_prefix_key};
    rr.reg_token = (ProtobufCBinaryData){sizeof(rig_reg_token), (uint8_t *)rig_reg_token};
    kvf_envelope_t out;
    kvf_envelope_init(&out, "router");
    out.body_case = KVF__ENVELOPE__BODY_REGISTER_REPLY;
    out.register_reply = &rr;
    rig_send(r->to_prefill, &out);
}

void rig_stop(rig_t *r)
{
    /* SIGTERM: Deregister, exit 0. */
    kill(r->pid, SIGTERM);
    int status = 0;
    uint64_t until = kvf_clock_ns() + 10000000000ull;
    pid_t w = 0;
    while ((w = waitpid(r->pid, &status, WNOHANG)) == 0 && kvf_clock_ns() < until) {
        bool from_router;
        kvf_envelope_t *env = rig_next_msg(r, 10, &from_router);
        kvf_envelope_free(env);
    }
    if (w == 0) {
        kill(r->pid, SIGKILL);
        waitpid(r->pid, &status, 0);
        rig_child_pid = 0;
        fail_msg("kvf-prefill did not stop on SIGTERM");
    }
    rig_child_pid = 0;
    bool from_router;
    kvf_envelope_free(rig_next_msg(r, 50, &from_router));
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

Kvf__Sampling rig_greedy_sampling(uint64_t req_id)
{
    Kvf__Sampling s = KVF__SAMPLING__INIT;
    s.max_tokens = RIG_MAX_NEW;
    s.has_seed = true;
    s.seed = req_id * 1000u + 7u;
    return s;
}

void rig_send_prefill_msg(rig_t *r, uint64_t req_id, uint64_t epoch, const uint32_t *ids, size_t n,
                          uint32_t n_generated, const Kvf__Sampling *s, const char *decode_inbox)
{
    /* An earlier epoch's sampler state travels with its tokens. */
    uint64_t rng_state = n_generated ? RIG_EARLIER_RNG_STATE : 0;
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
    if (r->send_salt)
        pr.cache_salt = (ProtobufCBinaryData){strlen(r->send_salt), (uint8_t *)r->send_salt};
    kvf_envelope_t env;
    kvf_envelope_init(&env, "router");
    env.body_case = KVF__ENVELOPE__BODY_PREFILL_REQUEST;
    env.prefill_request = &pr;
    rig_send(r->to_prefill, &env);
}

void rig_send_prefill_to(rig_t *r, uint64_t req_id, uint64_t epoch, const uint32_t *ids, size_t n,
                         const char *decode_inbox)
{
    Kvf__Sampling s = rig_greedy_sampling(req_id);
    rig_send_prefill_msg(r, req_id, epoch, ids, n, 0, &s, decode_inbox);
}

void rig_send_prefill(rig_t *r, uint64_t req_id, uint64_t epoch, const uint32_t *ids, size_t n)
{
    rig_send_prefill_to(r, req_id, epoch, ids, n, r->decode_url);
}

void rig_send_cancel_on(kvf_outbox_t *ob, uint64_t req_id, uint64_t epoch)
{
    Kvf__Cancel c = KVF__CANCEL__INIT;
    c.req_id = req_id;
    c.epoch = epoch;
    c.reason = "test";
    kvf_envelope_t env;
    kvf_envelope_init(&env, "router");
    env.body_case = KVF__ENVELOPE__BODY_CANCEL;
    env.cancel = &c;
    rig_send(ob, &env);
}

void rig_send_cancel(rig_t *r, uint64_t req_id, uint64_t epoch)
{
    rig_send_cancel_on(r->to_prefill, req_id, epoch);
}

void rig_answer_alloc(rig_t *r, const Kvf__KvAlloc *a, int32_t status, uint64_t epoch,
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
        uint32_t held = r->answer_cached < np ? r->answer_cached : np - 1;
        kvf_xfer_range_t *ranges = calloc(np, sizeof(*ranges));
        for (uint32_t b = 0; b < held; b++) {
            uint8_t *blk = (uint8_t *)kvf_kvpool_base(r->dpool) +
                           kvf_kvpool_slice_offset(r->dpool, ids[b], 0);
            const rig_ref_t *ref = r->answer_cached_ref;
            if (ref)
                memcpy(blk,
                       (const uint8_t *)kvf_kvpool_base(ref->pool) +
                           kvf_kvpool_slice_offset(ref->pool, ref->blocks[b], 0),
                       kvf_kv_block_bytes(&r->geo));
            else
                memset(blk, 0x5a, kvf_kv_block_bytes(&r->geo));
        }
        for (uint32_t b = held; b < np; b++) {
            ranges[b - held].off = kvf_kvpool_slice_offset(r->dpool, ids[b], 0);
            ranges[b - held].len = kvf_kv_block_bytes(&r->geo);
        }
        assert_int_equal(
            kvf_xfer_reserve(r->dxfer, a->req_id, a->epoch, ranges, np - held, 10000), KVF_OK);
        rep.cached_blocks = held;
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
    rig_send(r->to_reply, &env);
    *ids_p = ids;
    *n_p = n;
}

/* The first token sampled from logits as a node does for sampling message
 * s (kvf/sampling_msg.h; a fresh sampler: no earlier epoch). */
static void reference_sample(const Kvf__Sampling *s, int vocab, const float *logits, rig_ref_t *ref)
{
    kvf_sampling_params_t sp;
    assert_int_equal(kvf_sampling_msg_params(s, vocab, &sp), KVF_OK);
    kvf_sampler_t sampler;
    assert_int_equal(kvf_sampler_init(&sampler, &sp, vocab), KVF_OK);
    ref->first_token = kvf_sampler_sample(&sampler, logits);
    ref->rng_after = kvf_sampler_state(&sampler);
    kvf_sampler_fini(&sampler);
}

void rig_reference(rig_t *r, const uint32_t *ids, uint32_t n, const Kvf__Sampling *sampling,
                   rig_ref_t *ref)
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

#define RIG_HEAD_DIM_MAX 512

/* Row slot of (block, layer, kv, head) of pool, read back in f32 in any
 * format. */
static void read_row(const kvf_kvpool_t *pool, uint32_t block, int layer, int kv, int head,
                     uint32_t slot, float *out)
{
    const kvf_kv_geometry_t *g = kvf_kvpool_geometry(pool);
    const uint8_t *data = kvf_kvpool_head_data(pool, block, layer, kv, head);
    const float *scales = kvf_kvpool_head_scales(pool, block, layer, kv, head);
    kvf_kv_decode_row(g->dtype, data + (size_t)slot * g->head_dim * kvf_kv_elem_bytes(g->dtype),
                      scales ? scales[slot] : 1.0f, g->head_dim, out);
}

double rig_compare_kv(rig_t *r, const uint32_t *dblocks, const rig_ref_t *ref, uint32_t n)
{
    double worst = 0;
    const kvf_kv_geometry_t *g = &r->geo;
    assert_true(g->head_dim <= RIG_HEAD_DIM_MAX);
    for (uint32_t t = 0; t < n; t++) {
        uint32_t b = t / 16, slot = t % 16;
        for (int l = 0; l < g->n_layers; l++)
            for (int kv = 0; kv < 2; kv++)
                for (int h = 0; h < g->n_kv_heads; h++) {
                    float x[RIG_HEAD_DIM_MAX], y[RIG_HEAD_DIM_MAX];
                    read_row(r->dpool, dblocks[b], l, kv, h, slot, x);
                    read_row(ref->pool, ref->blocks[b], l, kv, h, slot, y);
                    for (int d = 0; d < g->head_dim; d++) {
                        double diff = fabs((double)x[d] - (double)y[d]);
                        if (!(diff <= worst))
                            worst = isnan(diff) ? INFINITY : diff;
                    }
                }
    }
    return worst;
}

void rig_make_prompt(uint32_t *ids, uint32_t n, uint32_t seed)
{
    ids[0] = 510; /* BOS */
    for (uint32_t i = 1; i < n; i++)
        ids[i] = (i * 37u + seed * 101u) % 500u;
}

uint64_t rig_prompt_kv_bytes(const rig_t *r, uint32_t len)
{
    return (uint64_t)kvf_kv_blocks_for_tokens(&r->geo, len) * kvf_kv_block_bytes(&r->geo);
}

void rig_write_model(char *dir, size_t len, int n_layers)
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

void rig_remove_model(const char *dir)
{
    char cmd[1200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

uint32_t *rig_start_long_request(rig_t *r, char *dir, size_t dir_len, uint64_t req_id,
                                 uint32_t seed, uint32_t *n_blocks_p)
{
    static uint32_t ids[1500];
    rig_write_model(dir, dir_len, 6);
    rig_start(r, dir, "64M", "16");
    rig_make_prompt(ids, 1500, seed);
    rig_send_prefill(r, req_id, 1, ids, 1500);
    uint32_t *blocks = NULL;
    uint64_t until = kvf_clock_ns() + 20000000000ull;
    while (r->landed_bytes == 0) {
        bool from_router = false;
        kvf_envelope_t *env = rig_next_msg(r, 50, &from_router);
        if (kvf_clock_ns() > until)
            fail_msg("nothing landed");
        if (!env)
            continue;
        if (env->body_case != KVF__ENVELOPE__BODY_KV_ALLOC)
            fail_msg("unexpected %s", kvf_envelope_body_name(env));
        rig_answer_alloc(r, env->kv_alloc, KVF_OK, env->kv_alloc->epoch, &blocks, n_blocks_p);
        kvf_envelope_free(env);
    }
    assert_non_null(blocks);
    return blocks;
}

void rig_expect_no_blocks(rig_t *r)
{
    uint64_t until = kvf_clock_ns() + 10000000000ull;
    r->last_blocks_used = 1;
    while (r->last_blocks_used != 0 && kvf_clock_ns() < until) {
        bool fr;
        kvf_envelope_t *env = rig_next_msg(r, 50, &fr);
        if (env)
            fail_msg("unexpected %s", kvf_envelope_body_name(env));
    }
    assert_int_equal(r->last_blocks_used, 0);
}

void rig_prefill_round(rig_t *r, uint64_t req_id, const uint32_t *ids, uint32_t n,
                       uint32_t want_cached)
{
    rig_ref_t ref;
    rig_reference(r, ids, n, NULL, &ref);
    rig_send_prefill(r, req_id, 1, ids, n);
    uint32_t *dblocks = NULL, dn = 0;
    bool ready = false, done = false;
    while (!ready || !done) {
        bool from_router = false;
        kvf_envelope_t *env = rig_next_msg(r, 20000, &from_router);
        assert_non_null(env);
        if (env->body_case == KVF__ENVELOPE__BODY_KV_ALLOC) {
            const Kvf__KvAlloc *a = env->kv_alloc;
            assert_int_equal(a->req_id, req_id);
            assert_int_equal(a->cache_salt.len, r->send_salt ? strlen(r->send_salt) : 0);
            if (r->send_salt)
                assert_memory_equal(a->cache_salt.data, r->send_salt, a->cache_salt.len);
            rig_answer_alloc(r, a, KVF_OK, 1, &dblocks, &dn);
        } else if (env->body_case == KVF__ENVELOPE__BODY_KV_READY) {
            assert_int_equal(env->kv_ready->req_id, req_id);
            assert_int_equal(env->kv_ready->first_token, ref.first_token);
            assert_true(rig_compare_kv(r, dblocks, &ref, n) == 0.0);
            ready = true;
        } else if (env->body_case == KVF__ENVELOPE__BODY_PREFILL_DONE) {
            assert_int_equal(env->prefill_done->req_id, req_id);
            assert_int_equal(env->prefill_done->cached_tokens, want_cached);
            done = true;
        } else {
            fail_msg("unexpected %s", kvf_envelope_body_name(env));
        }
        kvf_envelope_free(env);
    }
    free(dblocks);
    kvf_kvpool_destroy(ref.pool);
}

uint32_t rig_prompt_hashes(const rig_t *r, const uint32_t *ids, uint32_t n, uint64_t *hashes)
{
    uint64_t k[2];
    memcpy(k, rig_prefix_key, sizeof(k));
    kvf_block_hash_key_t key = {k[0], k[1]};
    uint64_t root = kvf_block_hash_root(&key, strtoull(kvf_model_fingerprint(r->model), NULL, 16),
                                        (int)r->geo.dtype, 16, NULL, 0);
    return kvf_block_hash_chain(&key, root, ids, n, 16, hashes);
}
