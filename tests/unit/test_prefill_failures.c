/* kvf-prefill when things go wrong, in the rig of prefill_rig.h: refusals
 * (by the decode node; invalid requests: bad tokens, too long, no or bad
 * sampling values), cancels (before the KvAllocReply and while shipping:
 * ABORT reaches the decode side), a decode node whose transport goes away
 * mid-transfer, and the KvAlloc deadlines. */
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

/* The refusal test's requests 1..6 and the status each is refused with
 * (0: request 4, which is not refused but cancelled). */
static const kvf_status_t refusal_status[7] = {
    [1] = KVF_ERR_INVAL,    /* a token id beyond the vocabulary */
    [2] = KVF_ERR_TOO_BIG,  /* a prompt beyond the context */
    [3] = KVF_ERR_NO_SPACE, /* the decode node refuses the KvAlloc */
    [5] = KVF_ERR_INVAL,    /* no sampling values */
    [6] = KVF_ERR_INVAL,    /* top_p above 1 */
};

#define ALLOC_TIMEOUT_MS 300

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
        rig_answer_alloc(r, a, KVF_ERR_NO_SPACE, a->epoch, &none, &nn);
        return;
    }
    if (a->req_id != 4)
        fail_msg("kv alloc for request %llu", (unsigned long long)a->req_id);
    assert_int_equal(a->epoch, 2);
    if (!r->to_reply)
        assert_int_equal(kvf_outbox_create(a->reply_inbox, &r->to_reply), KVF_OK);
    rig_send_cancel_on(r->to_reply, 4, 2);
    rig_answer_alloc(r, a, KVF_OK, a->epoch, d4_p, n4_p);
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
    rig_make_prompt(ids, 300, 3);

    /* Invalid: token id out of vocab; prompt beyond the context; no
     * sampling values; top_p above 1. */
    uint32_t bad[3] = {510, 9999, 4};
    rig_send_prefill(&r, 1, 1, bad, 3);
    rig_send_prefill(&r, 2, 1, ids, 300);
    rig_send_prefill_msg(&r, 5, 1, ids, 20, 0, NULL, r.decode_url);
    Kvf__Sampling bad_top_p = rig_greedy_sampling(6);
    bad_top_p.top_p = 1.5f;
    rig_send_prefill_msg(&r, 6, 1, ids, 20, 0, &bad_top_p, r.decode_url);
    /* Refused by the decode node. */
    rig_send_prefill(&r, 3, 1, ids, 30);
    /* Cancelled before the reply. */
    rig_send_prefill(&r, 4, 2, ids, 20);

    int errors = 0, aborted_wait = 0;
    bool got[7] = {0};
    uint32_t *d4 = NULL, n4 = 0;
    while (errors < 5 || !d4) {
        bool from_router = false;
        kvf_envelope_t *env = rig_next_msg(&r, 20000, &from_router);
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
        kvf_envelope_t *env = rig_next_msg(&r, 20, &fr);
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
    rig_url_for(nowhere, sizeof(nowhere)); /* a free port: nothing listens there */
    uint32_t ids[20];
    rig_make_prompt(ids, 20, 5);
    uint64_t sent_ns = kvf_clock_ns();
    rig_send_prefill(&r, 1, 1, ids, 20);
    rig_send_prefill_to(&r, 2, 1, ids, 20, nowhere);
    rig_send_prefill(&r, 3, 1, ids, 20);
    bool got1 = false, got2 = false;
    while (!got1 || !got2) {
        bool from_router = false;
        kvf_envelope_t *env = rig_next_msg(&r, 20000, &from_router);
        if (!env)
            fail_msg("timed out waiting for the alloc timeouts");
        if (env->body_case == KVF__ENVELOPE__BODY_KV_ALLOC) {
            /* Never answered; request 3 is cancelled instead. */
            if (env->kv_alloc->req_id == 3)
                rig_send_cancel(&r, 3, 1);
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
        kvf_envelope_t *env = rig_next_msg(&r, 20, &fr);
        if (env)
            fail_msg("unexpected %s", kvf_envelope_body_name(env));
    }
    rig_stop(&r);
}

/* Cancel while the prompt's chunks are computing and shipping: the decode
 * side sees an ABORT, nothing else arrives, the local blocks come back. */
static void test_prefill_cancel_in_flight(void **state)
{
    (void)state;
    char dir[256];
    rig_t r;
    uint32_t nb = 0;
    uint32_t *blocks = rig_start_long_request(&r, dir, sizeof(dir), 7, 9, &nb);
    rig_send_cancel(&r, 7, 1);
    uint64_t until = kvf_clock_ns() + 10000000000ull;
    while (r.aborted == 0 && kvf_clock_ns() < until) {
        bool fr;
        kvf_envelope_t *env = rig_next_msg(&r, 20, &fr);
        if (env)
            fail_msg("unexpected %s after cancel", kvf_envelope_body_name(env));
    }
    assert_int_equal(r.aborted, 1);
    assert_int_equal(r.landed_last, 0);
    rig_expect_no_blocks(&r);
    assert_int_equal(kvf_xfer_cancel(r.dxfer, 7, 1), KVF_OK);
    assert_int_equal(kvf_kvpool_release(r.dpool, blocks, nb), KVF_OK);
    free(blocks);
    rig_stop(&r);
    rig_remove_model(dir);
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
    uint32_t *blocks = rig_start_long_request(&r, dir, sizeof(dir), 8, 11, &nb);
    kvf_xfer_destroy(r.dxfer);
    r.dxfer = NULL;
    bool got_error = false;
    uint64_t until = kvf_clock_ns() + 30000000000ull;
    while (!got_error && kvf_clock_ns() < until) {
        bool from_router = false;
        kvf_envelope_t *env = rig_next_msg(&r, 50, &from_router);
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
    rig_expect_no_blocks(&r);
    assert_int_equal(kvf_kvpool_release(r.dpool, blocks, nb), KVF_OK);
    free(blocks);
    /* rig_stop destroys a NULL transfer handle: a no-op. */
    rig_stop(&r);
    rig_remove_model(dir);
}

/* The decode node's transport goes away as the prefill node is to read
 * the prefix blocks it said it holds (a decode node dying under a pull):
 * whether the read fails or the handoff after it does, the router gets
 * Error{TRANSPORT}, and no local block stays in use. */
static void test_prefill_decode_dies_under_pull(void **state)
{
    (void)state;
    rig_t r;
    rig_start(&r, NULL, "64M", "2048");
    static uint32_t ids[100];
    rig_make_prompt(ids, 100, 333);
    rig_ref_t ref;
    rig_reference(&r, ids, 100, NULL, &ref);
    r.answer_cached = 4;
    r.answer_cached_ref = &ref;
    rig_send_prefill(&r, 12, 1, ids, 100);
    uint32_t *dblocks = NULL, dn = 0;
    while (!dblocks) {
        bool from_router = false;
        kvf_envelope_t *env = rig_next_msg(&r, 20000, &from_router);
        assert_non_null(env);
        if (env->body_case != KVF__ENVELOPE__BODY_KV_ALLOC)
            fail_msg("unexpected %s", kvf_envelope_body_name(env));
        rig_answer_alloc(&r, env->kv_alloc, KVF_OK, 1, &dblocks, &dn);
        kvf_envelope_free(env);
    }
    kvf_xfer_destroy(r.dxfer);
    r.dxfer = NULL;
    bool got_error = false;
    uint64_t until = kvf_clock_ns() + 60000000000ull;
    while (!got_error && kvf_clock_ns() < until) {
        bool from_router = false;
        kvf_envelope_t *env = rig_next_msg(&r, 50, &from_router);
        if (!env)
            continue;
        if (env->body_case != KVF__ENVELOPE__BODY_ERROR)
            fail_msg("unexpected %s", kvf_envelope_body_name(env));
        assert_true(from_router);
        assert_int_equal(env->error->req_id, 12);
        assert_int_equal(env->error->status, KVF_ERR_TRANSPORT);
        got_error = true;
        kvf_envelope_free(env);
    }
    assert_true(got_error);
    rig_expect_no_blocks(&r);
    assert_int_equal(kvf_kvpool_release(r.dpool, dblocks, dn), KVF_OK);
    free(dblocks);
    kvf_kvpool_destroy(ref.pool);
    rig_stop(&r);
}

int main(void)
{
    kvf_log_init("test", NULL);
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_prefill_refusal_and_cancel, rig_kill_child),
        cmocka_unit_test_teardown(test_prefill_cancel_in_flight, rig_kill_child),
        cmocka_unit_test_teardown(test_prefill_decode_dies, rig_kill_child),
        cmocka_unit_test_teardown(test_prefill_decode_dies_under_pull, rig_kill_child),
        cmocka_unit_test_teardown(test_prefill_alloc_timeout, rig_kill_child),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
