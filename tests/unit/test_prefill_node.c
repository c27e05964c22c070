/* kvf-prefill doing its work, in the rig of prefill_rig.h: registration
 * and heartbeats, KvAlloc / KvAllocReply, the K/V landing in the decode
 * pool bit for bit what a colocated prefill writes, KvReady (the first
 * token, the sampling message unchanged) and PrefillDone (timings),
 * batching and chunking, a full local pool, a re-dispatch, stale and
 * malformed messages, no local block left in use, and a clean stop on
 * SIGTERM (Deregister, exit 0). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "prefill_rig.h"

#include "kvf/clock.h"
#include "kvf/log.h"
#include "kvf/sampling.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_PROMPTS 5

/* The handoff test's prompts: what was sent and what came back. */
typedef struct {
    uint32_t len;
    uint32_t ids[80];
    Kvf__Sampling sampling;
    rig_ref_t ref;
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
        rig_make_prompt(h->ids, h->len, (uint32_t)i);
        h->sampling = rig_greedy_sampling(HANDOFF_REQ0 + (uint64_t)i);
        if (i == 2) {
            h->sampling.temperature = 0.9f;
            h->sampling.top_k = 40;
            h->sampling.top_p = 0.95f;
            h->sampling.seed = 4242;
        }
        rig_reference(r, h->ids, h->len, &h->sampling, &h->ref);
    }
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
    assert_int_equal(a->max_new_tokens, RIG_MAX_NEW);
    assert_string_equal(a->prefill_node_id, r->prefill_id);
    if (a->req_id == HANDOFF_REQ0 + 1) {
        uint32_t *none;
        uint32_t nn;
        rig_answer_alloc(r, a, KVF_ERR_NO_SPACE, a->epoch + 7, &none, &nn); /* stale */
    }
    rig_answer_alloc(r, a, KVF_OK, a->epoch, &h->dblocks, &h->dn);
}

/* KvReady: the prompt, the first token (and the sampler's state) of the
 * colocated rig_reference, the sampling message unchanged, and the K/V landed
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
    assert_int_equal(k->sampling->max_tokens, RIG_MAX_NEW);
    assert_true(k->sampling->has_seed);
    assert_int_equal(k->sampling->seed, h->sampling.seed);
    assert_true(k->sampling->temperature == h->sampling.temperature);
    assert_int_equal(k->sampling->top_k, h->sampling.top_k);
    assert_int_equal(k->kv_bytes, rig_prompt_kv_bytes(r, h->len));
    h->compute_us[0] = k->prefill_compute_us;
    h->handoff_us[0] = k->handoff_us;
    double worst = rig_compare_kv(r, h->dblocks, &h->ref, h->len);
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
    assert_int_equal(d->kv_bytes, rig_prompt_kv_bytes(r, h->len));
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
        kvf_envelope_t *env = rig_next_msg(r, 20000, &from_router);
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
        rig_send_prefill_msg(&r, HANDOFF_REQ0 + (uint64_t)i, 1, hp[i].ids, hp[i].len, 0,
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
    rig_expect_no_blocks(&r);
    for (int i = 0; i < N_PROMPTS; i++) {
        assert_int_equal(kvf_xfer_cancel(r.dxfer, HANDOFF_REQ0 + (uint64_t)i, 1), KVF_OK);
        assert_int_equal(kvf_kvpool_release(r.dpool, hp[i].dblocks, hp[i].dn), KVF_OK);
        free(hp[i].dblocks);
        kvf_kvpool_destroy(hp[i].ref.pool);
    }
    rig_stop(&r);
}

/* The prefix cache: a 100-token prompt, then prompts sharing its first k
 * blocks (16 k tokens) for every k, then the same prompt again. Each reuses
 * the cached blocks it can (at most (100 - 32) / 16 = 4: a hit leaves a
 * tail chunked prefill accepts) and still lands the cold run's K/V and
 * first token bit for bit; afterwards no block is in use (cached ones are
 * free for any prompt). */
/* Waits until the node's prefix-cache reports list want blocks. */
static void wait_listing(rig_t *r, uint32_t want)
{
    uint64_t give_up = kvf_clock_ns() + 20000000000ull;
    while (r->prefix.n != want && kvf_clock_ns() < give_up) {
        bool from_router = false;
        kvf_envelope_t *env = rig_next_msg(r, 50, &from_router);
        if (env)
            fail_msg("unexpected %s", kvf_envelope_body_name(env));
    }
    assert_int_equal(r->prefix.n, want);
}

/* Whether the reports list every full block of ids[0..n) as the router
 * would hash them (the rig's key, no salt). */
static bool listed(const rig_t *r, const uint32_t *ids, uint32_t n)
{
    uint64_t h[16];
    uint32_t nb = rig_prompt_hashes(r, ids, n, h);
    for (uint32_t b = 0; b < nb; b++) {
        bool found = false;
        for (uint32_t i = 0; i < r->prefix.n && !found; i++)
            found = r->prefix.hashes[i] == h[b];
        if (!found)
            return false;
    }
    return true;
}

static void test_prefill_prefix_cache(void **state)
{
    (void)state;
    rig_t r;
    rig_start(&r, NULL, "64M", "2048");
    static uint32_t base[100], other[100], ids[100];
    rig_make_prompt(base, 100, 77);
    rig_make_prompt(other, 100, 78);
    rig_prefill_round(&r, 500, base, 100, 0);
    for (uint32_t k = 0; k <= 6; k++) {
        memcpy(ids, base, 16 * k * sizeof(uint32_t));
        memcpy(ids + 16 * k, other + 16 * k, (100 - 16 * k) * sizeof(uint32_t));
        if (k < 6)
            ids[16 * k] = base[16 * k] == 1 ? 2 : 1; /* the (k+1)th block differs */
        rig_prefill_round(&r, 501 + k, ids, 100, 16 * (k < 4 ? k : 4));
    }
    rig_prefill_round(&r, 520, base, 100, 64);
    /* a prompt too short to leave a tail after any hit computes it all */
    rig_prefill_round(&r, 521, base, 40, 0);
    /* The node told the router each block it caches (KV-aware routing):
     * base's 6 full blocks and, for each k < 6, the 6 - k blocks from the
     * one that differs on: 27, each hashed as the router hashes them. */
    wait_listing(&r, 27);
    assert_true(listed(&r, base, 100));
    assert_true(r.prefix.full >= 1); /* it began with a full listing */
    rig_expect_no_blocks(&r);
    rig_stop(&r);
}

/* Tenants: a request's cache_salt roots its hash chain, so a prompt cached
 * for one salt is a miss for another salt and for no salt, and a hit again
 * for the same salt; KvAlloc carries the salt to the decode node. */
static void test_prefill_cache_salt(void **state)
{
    (void)state;
    rig_t r;
    rig_start(&r, NULL, "64M", "2048");
    static uint32_t ids[100];
    rig_make_prompt(ids, 100, 93);
    r.send_salt = "tenant-a";
    rig_prefill_round(&r, 700, ids, 100, 0);
    r.send_salt = "tenant-b";
    rig_prefill_round(&r, 701, ids, 100, 0);
    r.send_salt = NULL;
    rig_prefill_round(&r, 702, ids, 100, 0);
    r.send_salt = "tenant-a";
    rig_prefill_round(&r, 703, ids, 100, 64);
    r.send_salt = NULL;
    rig_prefill_round(&r, 704, ids, 100, 64);
    rig_expect_no_blocks(&r);
    rig_stop(&r);
}

/* One request of a 100-token prompt (7 blocks, seed) whose KvAllocReply
 * says the decode node holds its first `held` blocks; returns its
 * PrefillDone's (kv_bytes, kv_bytes_pulled, cached_tokens) after checking
 * KvAlloc's offer (the prompt's full blocks but the last), that the held
 * blocks were not written, and that the first token and the K/V of every
 * position in the decode pool are the cold run's (exactly, where the held
 * blocks hold the reference's K/V). */
static void decode_holds_round(rig_t *r, uint64_t req_id, uint32_t seed, uint32_t held, bool real,
                               uint64_t out[3])
{
    static uint32_t ids[100];
    rig_make_prompt(ids, 100, seed);
    rig_ref_t ref;
    rig_reference(r, ids, 100, NULL, &ref);
    r->answer_cached = held;
    r->answer_cached_ref = real ? &ref : NULL;
    rig_send_prefill(r, req_id, 1, ids, 100);
    uint32_t *dblocks = NULL, dn = 0;
    bool ready = false, done = false;
    const size_t block_bytes = kvf_kv_block_bytes(&r->geo);
    while (!ready || !done) {
        bool from_router = false;
        kvf_envelope_t *env = rig_next_msg(r, 20000, &from_router);
        assert_non_null(env);
        if (env->body_case == KVF__ENVELOPE__BODY_KV_ALLOC) {
            const Kvf__KvAlloc *a = env->kv_alloc;
            assert_int_equal(a->n_prefix_hashes, 6);
            assert_int_equal(a->n_prefix_token_ids, 96);
            assert_memory_equal(a->prefix_token_ids, ids, 96 * sizeof(uint32_t));
            for (size_t i = 1; i < a->n_prefix_hashes; i++)
                assert_true(a->prefix_hashes[i] != a->prefix_hashes[i - 1]);
            rig_answer_alloc(r, a, KVF_OK, 1, &dblocks, &dn);
        } else if (env->body_case == KVF__ENVELOPE__BODY_KV_READY) {
            assert_int_equal(env->kv_ready->first_token, ref.first_token);
            for (uint32_t b = 0; b < held; b++) {
                const uint8_t *blk = (const uint8_t *)kvf_kvpool_base(r->dpool) +
                                     kvf_kvpool_slice_offset(r->dpool, dblocks[b], 0);
                const uint8_t *want = (const uint8_t *)kvf_kvpool_base(ref.pool) +
                                      kvf_kvpool_slice_offset(ref.pool, ref.blocks[b], 0);
                for (size_t i = 0; i < block_bytes; i++)
                    if (blk[i] != (real ? want[i] : 0x5a))
                        fail_msg("held block %u was written at byte %zu", b, i);
            }
            if (real)
                assert_true(rig_compare_kv(r, dblocks, &ref, 100) == 0.0);
            ready = true;
        } else if (env->body_case == KVF__ENVELOPE__BODY_PREFILL_DONE) {
            out[0] = env->prefill_done->kv_bytes;
            out[1] = env->prefill_done->kv_bytes_pulled;
            out[2] = env->prefill_done->cached_tokens;
            done = true;
        } else {
            fail_msg("unexpected %s", kvf_envelope_body_name(env));
        }
        kvf_envelope_free(env);
    }
    assert_int_equal(r->rejected, 0);
    assert_int_equal(kvf_kvpool_release(r->dpool, dblocks, dn), KVF_OK);
    free(dblocks);
    kvf_kvpool_destroy(ref.pool);
    r->answer_cached = 0;
    r->answer_cached_ref = NULL;
}

/* The decode node's prefix cache, from the prefill node's side, without
 * pulls: when the reply says the first 3 blocks are held, the node writes
 * none of them (the transport reserved only the others, and their 0x5a
 * filling survives), ships the other 4 blocks, computes all 100 tokens,
 * and the first token is still the cold run's. */
static void test_prefill_decode_holds_prefix(void **state)
{
    (void)state;
    rig_t r;
    const char *no_pull[] = {"--no-prefix-pull", NULL};
    rig_start_args(&r, NULL, "64M", "2048", no_pull);
    uint64_t got[3];
    decode_holds_round(&r, 600, 91, 3, false, got);
    const uint64_t block_bytes = kvf_kv_block_bytes(&r.geo);
    assert_int_equal(got[0], 4 * block_bytes);
    assert_int_equal(got[1], 0);
    assert_int_equal(got[2], 0);
    rig_expect_no_blocks(&r);
    rig_stop(&r);
}

/* Prefix pulls: the decode node holds the first `held` blocks of a prompt
 * the prefill node has never seen, for held 1..6 (hits at every block
 * boundary). The node reads them from the decode pool (one-sided) instead
 * of computing them, at most the 4 that leave a 32-token tail to compute,
 * attends to them for the rest, and ships only the blocks the decode node
 * lacks: the first token and every position's K/V equal the cold run's,
 * bit for bit, and no block is left in use. */
static void test_prefill_pulls_decode_prefix(void **state)
{
    (void)state;
    rig_t r;
    rig_start(&r, NULL, "64M", "2048");
    const uint64_t block_bytes = kvf_kv_block_bytes(&r.geo);
    for (uint32_t held = 1; held <= 6; held++) {
        uint64_t got[3];
        decode_holds_round(&r, 610 + held, 200 + held, held, true, got);
        uint32_t pulled = held < 4 ? held : 4;
        assert_int_equal(got[0], (7 - held) * block_bytes);
        assert_int_equal(got[1], pulled * block_bytes);
        assert_int_equal(got[2], pulled * 16);
    }
    rig_expect_no_blocks(&r);
    rig_stop(&r);
}

/* A local pool of 8 blocks (128 tokens): prompts of 7 blocks wait for each
 * other's blocks instead of failing, and one that can never fit is refused
 * with NO_SPACE at once. */
static void test_prefill_pool_full(void **state)
{
    (void)state;
    rig_t r;
    rig_start(&r, NULL, "8 blocks", "2048");
    enum { N = 3 };
    static uint32_t ids[N][200];
    rig_ref_t ref[N];
    uint32_t *dblocks[N] = {0}, dn[N] = {0};
    for (int i = 0; i < N; i++) {
        rig_make_prompt(ids[i], 100, 30 + (uint32_t)i);
        rig_reference(&r, ids[i], 100, NULL, &ref[i]);
    }
    for (int i = 0; i < N; i++)
        rig_send_prefill(&r, 300 + (uint64_t)i, 1, ids[i], 100);
    static uint32_t big[200];
    rig_make_prompt(big, 200, 40);
    rig_send_prefill(&r, 399, 1, big, 200);
    int n_ready = 0, n_done = 0;
    bool refused = false;
    while (n_ready < N || n_done < N || !refused) {
        bool from_router = false;
        kvf_envelope_t *env = rig_next_msg(&r, 20000, &from_router);
        assert_non_null(env);
        if (env->body_case == KVF__ENVELOPE__BODY_KV_ALLOC) {
            int i = (int)(env->kv_alloc->req_id - 300);
            assert_true(i >= 0 && i < N);
            rig_answer_alloc(&r, env->kv_alloc, KVF_OK, 1, &dblocks[i], &dn[i]);
        } else if (env->body_case == KVF__ENVELOPE__BODY_KV_READY) {
            int i = (int)(env->kv_ready->req_id - 300);
            assert_int_equal(env->kv_ready->first_token, ref[i].first_token);
            assert_true(rig_compare_kv(&r, dblocks[i], &ref[i], 100) == 0.0);
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
    rig_expect_no_blocks(&r);
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
    rig_write_model(dir, sizeof(dir), 2);
    rig_start(&r, dir, "16M", "50");
    enum { N = 7 };
    static const uint32_t lens[N] = {100, 3, 150, 5, 90, 8, 20};
    static uint32_t ids[N][160];
    rig_ref_t ref[N];
    uint32_t *dblocks[N] = {0}, dn[N] = {0};
    /* References first: the node's reservations must not wait on them. */
    for (int i = 0; i < N; i++) {
        rig_make_prompt(ids[i], lens[i], 20 + (uint32_t)i);
        rig_reference(&r, ids[i], lens[i], NULL, &ref[i]);
    }
    for (int i = 0; i < N; i++)
        rig_send_prefill(&r, 200 + (uint64_t)i, 1, ids[i], lens[i]);
    /* All reservations answered at once, so the prompts share forwards. */
    kvf_envelope_t *allocs[N] = {0};
    bool from_router = false;
    for (int k = 0; k < N; k++) {
        kvf_envelope_t *env = rig_next_msg(&r, 20000, &from_router);
        assert_non_null(env);
        assert_int_equal(env->body_case, KVF__ENVELOPE__BODY_KV_ALLOC);
        int i = (int)(env->kv_alloc->req_id - 200);
        assert_true(i >= 0 && i < N && !allocs[i]);
        allocs[i] = env;
    }
    for (int i = 0; i < N; i++) {
        rig_answer_alloc(&r, allocs[i]->kv_alloc, KVF_OK, 1, &dblocks[i], &dn[i]);
        kvf_envelope_free(allocs[i]);
    }
    int n_ready = 0, n_done = 0;
    while (n_ready < N || n_done < N) {
        kvf_envelope_t *env = rig_next_msg(&r, 20000, &from_router);
        assert_non_null(env);
        if (env->body_case == KVF__ENVELOPE__BODY_KV_READY) {
            int i = (int)(env->kv_ready->req_id - 200);
            assert_int_equal(env->kv_ready->first_token, ref[i].first_token);
            double worst = rig_compare_kv(&r, dblocks[i], &ref[i], lens[i]);
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
    rig_expect_no_blocks(&r);
    for (int i = 0; i < N; i++) {
        assert_int_equal(kvf_xfer_cancel(r.dxfer, 200 + (uint64_t)i, 1), KVF_OK);
        assert_int_equal(kvf_kvpool_release(r.dpool, dblocks[i], dn[i]), KVF_OK);
        free(dblocks[i]);
        kvf_kvpool_destroy(ref[i].pool);
    }
    rig_stop(&r);
    rig_remove_model(dir);
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
    rig_make_prompt(ids, 50, 5);
    rig_ref_t ref;
    rig_reference(&r, ids, 50, NULL, &ref);
    rig_send_prefill(&r, 9, 1, ids, 50);
    kvf_envelope_t *alloc1 = NULL;
    bool from_router = false;
    while (!alloc1) {
        alloc1 = rig_next_msg(&r, 20000, &from_router);
        assert_non_null(alloc1);
        assert_int_equal(alloc1->body_case, KVF__ENVELOPE__BODY_KV_ALLOC);
    }
    assert_int_equal(alloc1->kv_alloc->epoch, 1);
    /* Epoch 2 after 3 tokens streamed: the prompt's last 3 are generated. */
    Kvf__Sampling s = rig_greedy_sampling(9);
    rig_send_prefill_msg(&r, 9, 2, ids, 50, 3, &s, r.decode_url);
    rig_send_prefill(&r, 9, 1, ids, 50); /* late duplicate of the old attempt */
    uint32_t *b1 = NULL, *b2 = NULL, n1 = 0, n2 = 0;
    bool ready = false, done = false;
    while (!ready || !done) {
        kvf_envelope_t *env = rig_next_msg(&r, 20000, &from_router);
        assert_non_null(env);
        switch (env->body_case) {
        case KVF__ENVELOPE__BODY_KV_ALLOC:
            assert_int_equal(env->kv_alloc->epoch, 2);
            /* What is left of the request's RIG_MAX_NEW tokens. */
            assert_int_equal(env->kv_alloc->max_new_tokens, RIG_MAX_NEW - 3);
            rig_answer_alloc(&r, env->kv_alloc, KVF_OK, 2, &b2, &n2);
            break;
        case KVF__ENVELOPE__BODY_KV_READY: {
            const Kvf__KvReady *k = env->kv_ready;
            assert_int_equal(k->epoch, 2);
            assert_int_equal(k->first_token, ref.first_token);
            assert_int_equal(k->n_generated, 3);
            assert_int_equal(k->rng_state, RIG_EARLIER_RNG_STATE); /* greedy: not advanced */
            assert_non_null(k->sampling);
            assert_int_equal(k->sampling->max_tokens, RIG_MAX_NEW); /* the total, unchanged */
            assert_true(rig_compare_kv(&r, b2, &ref, 50) == 0.0);
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
    rig_answer_alloc(&r, alloc1->kv_alloc, KVF_OK, 1, &b1, &n1);
    kvf_envelope_free(alloc1);
    uint64_t until = kvf_clock_ns() + 5000000000ull;
    while (r.aborted == 0 && kvf_clock_ns() < until) {
        kvf_envelope_t *env = rig_next_msg(&r, 20, &from_router);
        if (env)
            fail_msg("unexpected %s", kvf_envelope_body_name(env));
    }
    assert_int_equal(r.aborted, 1);
    assert_int_equal(r.landed_last, 1);
    rig_expect_no_blocks(&r);
    assert_int_equal(kvf_xfer_cancel(r.dxfer, 9, 1), KVF_OK);
    assert_int_equal(kvf_kvpool_release(r.dpool, b1, n1), KVF_OK);
    assert_int_equal(kvf_kvpool_release(r.dpool, b2, n2), KVF_OK);
    free(b1);
    free(b2);
    kvf_kvpool_destroy(ref.pool);
    rig_stop(&r);
}

int main(void)
{
    kvf_log_init("test", NULL);
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_prefill_handoff, rig_kill_child),
        cmocka_unit_test_teardown(test_prefill_redispatch, rig_kill_child),
        cmocka_unit_test_teardown(test_prefill_bit_exact, rig_kill_child),
        cmocka_unit_test_teardown(test_prefill_pool_full, rig_kill_child),
        cmocka_unit_test_teardown(test_prefill_prefix_cache, rig_kill_child),
        cmocka_unit_test_teardown(test_prefill_decode_holds_prefix, rig_kill_child),
        cmocka_unit_test_teardown(test_prefill_pulls_decode_prefix, rig_kill_child),
        cmocka_unit_test_teardown(test_prefill_cache_salt, rig_kill_child),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
