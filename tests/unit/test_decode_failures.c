/* kvf-decode when things go wrong, in the rig of decode_rig.h: a lease
 * that ends with nobody writing, stale epochs, refusals (beyond the
 * context, max_running, bad prefill requests), garbage frames and
 * unexpected messages, a cancel mid-decode, a cancel that comes before
 * the KvAlloc of its attempt, and SIGTERM (drain) and
 * SIGINT (stop) while a request decodes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "decode_internal.h" /* DECODE_SEAL_MARGIN_MS */
#include "decode_rig.h"

#include <signal.h>
#include <sys/wait.h>

#include "kvf/clock.h"
#include "kvf/log.h"

/* A reservation nobody writes: the lease ends, the router hears TIMEOUT,
 * the blocks come back. A stale KvReady does not seal it. */
static void test_lease_expiry_and_stale_epoch(void **state)
{
    drig_t *h = *state;
    drig_start(h, NULL);
    const drig_prompt_t *g = &h->prompts[0];
    uint64_t id = 300;
    drig_send_kv_alloc(h, id, 2, (uint32_t)g->n_ids, 8);
    assert_true(drig_pump(h, 5000, drig_alloc_replied, &id));
    assert_int_equal(h->alloc_status, 0);
    Kvf__Sampling s = drig_greedy_sampling(8);
    drig_send_kv_ready(h, id, 1, g->greedy[0], g->ids, (uint32_t)g->n_ids, &s); /* stale epoch */
    /* an older epoch's KvAlloc is stale too: no reply */
    drig_send_kv_alloc(h, id, 1, (uint32_t)g->n_ids, 8);
    uint64_t t0 = kvf_clock_ns();
    assert_true(drig_pump(h, 5000, drig_req_errored, &id));
    assert_int_equal(drig_seen(h, id)->error, KVF_ERR_TIMEOUT);
    assert_false(h->have_alloc_reply);
    uint64_t waited_ms = (kvf_clock_ns() - t0) / 1000000;
    assert_true(waited_ms >= DRIG_LEASE_MS / 2);
    assert_int_equal(drig_seen(h, id)->n_tokens, 0);
    /* released after the lease plus the transport's grace */
    drig_expect_no_blocks_used(h);
    assert_int_equal(drig_stop(h), 0);
}

static void test_refusals(void **state)
{
    drig_t *h = *state;
    drig_start(h, "--max-running 2");
    uint64_t id = 400;
    /* beyond the context (256) */
    drig_send_kv_alloc(h, id, 1, 256, 1);
    assert_true(drig_pump(h, 5000, drig_alloc_replied, &id));
    assert_int_equal(h->alloc_status, KVF_ERR_INVAL);
    /* max_running */
    for (id = 401; id <= 403; id++) {
        drig_send_kv_alloc(h, id, 1, 10, 10);
        assert_true(drig_pump(h, 5000, drig_alloc_replied, &id));
    }
    assert_int_equal(h->alloc_status, KVF_ERR_NO_SPACE);
    assert_int_equal(h->n_alloc_blocks, 0);
    for (id = 401; id <= 402; id++)
        drig_send_cancel(h, id, 0, NULL);
    drig_expect_no_blocks_used(h);
    id = 404;
    drig_send_kv_alloc(h, id, 1, 200, h->capacity * DRIG_BLOCK_SIZE);
    assert_true(drig_pump(h, 5000, drig_alloc_replied, &id));
    assert_int_equal(h->alloc_status, 0); /* capped by the context: fits */
    /* bad prefill requests: token outside the vocabulary, empty prompt */
    uint32_t bad_ids[2] = {1, 9999};
    Kvf__Sampling s = drig_greedy_sampling(4);
    drig_send_prefill_request(h, 405, 1, bad_ids, 2, &s);
    drig_send_prefill_request(h, 406, 1, bad_ids, 0, &s);
    s.top_p = 2.0f;
    drig_send_prefill_request(h, 407, 1, bad_ids, 1, &s);
    for (id = 405; id <= 407; id++) {
        assert_true(drig_pump(h, 5000, drig_req_errored, &id));
        assert_int_equal(drig_seen(h, id)->error, KVF_ERR_INVAL);
    }
    drig_send_cancel(h, 404, 0, NULL);
    drig_expect_no_blocks_used(h);
    assert_int_equal(drig_stop(h), 0);
}

/* Sends a KvAlloc of (id, epoch) and returns the status of its reply. */
static int alloc_status(drig_t *h, uint64_t id, uint64_t epoch, uint32_t n_tokens)
{
    drig_send_kv_alloc(h, id, epoch, n_tokens, 8);
    assert_true(drig_pump(h, 5000, drig_alloc_replied, &id));
    return h->alloc_status;
}

/* The router's Cancel and the prefill node's KvAlloc travel on different
 * connections: the Cancel may come first. The KvAlloc is then refused
 * (CANCELLED) instead of reserving blocks that nobody would seal or cancel
 * (they would stay held until the seal deadline, past a lease). Here both
 * come from the rig's one connection, so the Cancel is taken first. The
 * node remembers such a Cancel for a lease plus the seal margin. */
static void test_cancel_before_kv_alloc(void **state)
{
    drig_t *h = *state;
    drig_start(h, NULL);
    uint32_t n = (uint32_t)h->prompts[0].n_ids;
    /* the attempt cancelled, then its KvAlloc */
    drig_send_cancel(h, 800, 1, "cancelled by the client");
    assert_int_equal(alloc_status(h, 800, 1, n), KVF_ERR_CANCELLED);
    assert_int_equal(h->n_alloc_blocks, 0);
    /* a Cancel of every epoch covers any later epoch */
    drig_send_cancel(h, 801, 0, NULL);
    assert_int_equal(alloc_status(h, 801, 3, n), KVF_ERR_CANCELLED);
    /* a Cancel of a newer epoch than the live one: that epoch's KvAlloc
     * is refused, the live epoch goes on until cancelled itself */
    assert_int_equal(alloc_status(h, 802, 1, n), 0);
    drig_send_cancel(h, 802, 2, NULL);
    assert_int_equal(alloc_status(h, 802, 2, n), KVF_ERR_CANCELLED);
    /* another request, and a later epoch of an epoch-1 cancel, still
     * reserve */
    assert_int_equal(alloc_status(h, 803, 1, n), 0);
    assert_int_equal(alloc_status(h, 800, 2, n), 0);
    drig_send_cancel(h, 802, 1, NULL);
    drig_send_cancel(h, 803, 1, NULL);
    drig_send_cancel(h, 800, 2, NULL);
    drig_expect_no_blocks_used(h);
    /* Remembered for a lease plus the seal margin only: a KvAlloc taken
     * later reserves (a restarted router numbers requests from 1 again).
     * The reply to a KvAlloc sent after the Cancel shows the Cancel was
     * taken by then. */
    drig_send_cancel(h, 804, 1, NULL);
    assert_int_equal(alloc_status(h, 805, 1, n), 0);
    uint64_t until =
        kvf_clock_ns() + (uint64_t)(DRIG_LEASE_MS + DECODE_SEAL_MARGIN_MS + 100) * 1000000ull;
    while (kvf_clock_ns() < until)
        drig_pump(h, 50, NULL, NULL);
    assert_int_equal(alloc_status(h, 804, 1, n), 0);
    drig_send_cancel(h, 804, 1, NULL);
    drig_send_cancel(h, 805, 1, NULL);
    drig_expect_no_blocks_used(h);
    assert_int_equal(drig_stop(h), 0);
}

/* Starts a long request (200 tokens) and pauses the node (SIGSTOP) once
 * it streams, so that what the test sends next waits in the node's inbox
 * and is taken at most one step later. The tiny model decodes a token in
 * well under a millisecond: a request that finished before the pause is
 * retried under the next id. Returns the paused request's id. */
static uint64_t start_and_pause(drig_t *h, const drig_prompt_t *g, uint64_t base_id)
{
    Kvf__Sampling s = drig_greedy_sampling(200);
    for (uint64_t attempt = 0; attempt < 5; attempt++) {
        uint64_t id = base_id + attempt;
        drig_send_prefill_request(h, id, 1, g->ids, g->n_ids, &s);
        uint64_t deadline = kvf_clock_ns() + 20000000000ull;
        while (drig_seen(h, id)->n_tokens < 1 && kvf_clock_ns() < deadline)
            drig_pump(h, 1, NULL, NULL);
        assert_int_equal(kill(h->pid, SIGSTOP), 0);
        drig_pump(h, 100, NULL, NULL); /* what was already sent */
        if (!drig_seen(h, id)->finish)
            return id;
        assert_int_equal(kill(h->pid, SIGCONT), 0);
    }
    fail_msg("every request finished before the node could be paused");
    return 0;
}

/* What the node must drop: a garbage frame, a TokenBatch (a message the
 * node sends, never takes) and a KvAlloc without a reply inbox. */
static void send_malformed(drig_t *h)
{
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
    drig_send(h, &env);
    Kvf__KvAlloc a = KVF__KV_ALLOC__INIT; /* no reply inbox */
    a.req_id = 1;
    a.epoch = 1;
    a.n_tokens = 3;
    kvf_envelope_init(&env, "fake-prefill");
    env.body_case = KVF__ENVELOPE__BODY_KV_ALLOC;
    env.kv_alloc = &a;
    drig_send(h, &env);
}

/* Garbage frames and unexpected messages are dropped; a cancel stops a
 * running sequence and frees its blocks; the node keeps serving. */
static void test_malformed_and_cancel(void **state)
{
    drig_t *h = *state;
    drig_start(h, NULL);
    send_malformed(h);
    const drig_prompt_t *g = &h->prompts[1];
    uint64_t id = start_and_pause(h, g, 500);
    drig_send_cancel(h, id, 1, "client went away");
    assert_int_equal(kill(h->pid, SIGCONT), 0);
    drig_expect_no_blocks_used(h);
    /* Tokens the node had queued for sending when it was stopped still
     * arrive after the cancel (how many depends on the machine's speed),
     * so the count is no measure of the cancel; that the sequence never
     * finishes, stops far short of its 200 tokens (a step takes well under
     * a millisecond here) and frees its blocks is. */
    assert_int_equal(drig_seen(h, id)->finish, 0);
    assert_true(drig_seen(h, id)->n_tokens < 200);
    /* the tokens it did stream are the golden ones */
    for (int i = 0; i < drig_seen(h, id)->n_tokens && i < DRIG_N_GREEDY; i++)
        assert_int_equal(drig_seen(h, id)->tokens[i], g->greedy[i]);

    /* still serving */
    Kvf__Sampling s = drig_greedy_sampling(DRIG_N_GREEDY);
    drig_send_prefill_request(h, 510, 1, h->prompts[2].ids, h->prompts[2].n_ids, &s);
    id = 510;
    assert_true(drig_pump(h, 30000, drig_req_finished, &id));
    drig_check_golden(h, 510, &h->prompts[2]);
    drig_expect_no_blocks_used(h);
    assert_int_equal(drig_stop(h), 0);
}

/* Waits (pumping its messages) for the node to exit on its own. */
static int wait_node_exit(drig_t *h, int timeout_ms)
{
    int status = -1;
    uint64_t deadline = kvf_clock_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (waitpid(h->pid, &status, WNOHANG) == 0) {
        drig_pump(h, 20, NULL, NULL);
        if (kvf_clock_ns() > deadline) {
            kill(h->pid, SIGKILL);
            waitpid(h->pid, &status, 0);
            status = -1;
            break;
        }
    }
    h->pid = 0;
    drig_pump(h, 200, NULL, NULL);
    return status;
}

/* Sends sig to the node while it decodes a long request (taken when it
 * resumes from the pause), then waits for it to deregister and exit 0 by
 * itself. Returns the request's id. */
static uint64_t signal_while_decoding(drig_t *h, int sig)
{
    drig_start(h, NULL);
    uint64_t id = start_and_pause(h, &h->prompts[3], 600);
    assert_int_equal(kill(h->pid, sig), 0);
    assert_int_equal(kill(h->pid, SIGCONT), 0);
    int status = wait_node_exit(h, 30000);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_true(h->deregistered);
    return id;
}

/* SIGTERM while a request decodes: the node drains: the sequence runs to
 * its end (the golden tokens, no error), then the node deregisters and
 * exits 0 by itself. */
static void test_sigterm_drains(void **state)
{
    drig_t *h = *state;
    uint64_t id = signal_while_decoding(h, SIGTERM);
    assert_int_equal(drig_seen(h, id)->error, 0);
    assert_int_equal(drig_seen(h, id)->finish, KVF__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(drig_seen(h, id)->n_tokens, 200);
    for (int i = 0; i < DRIG_N_GREEDY; i++)
        assert_int_equal(drig_seen(h, id)->tokens[i], h->prompts[3].greedy[i]);
}

/* SIGINT while a request decodes: the node stops at once; the router hears
 * that the request failed here (to send it elsewhere), the node
 * deregisters and exits 0. */
static void test_sigint_stops(void **state)
{
    drig_t *h = *state;
    uint64_t id = signal_while_decoding(h, SIGINT);
    assert_int_equal(drig_seen(h, id)->error, KVF_ERR_CLOSED);
    assert_int_equal(drig_seen(h, id)->finish, 0);
}

int main(void)
{
    kvf_log_init("test", NULL);
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_lease_expiry_and_stale_epoch, drig_setup,
                                        drig_teardown),
        cmocka_unit_test_setup_teardown(test_refusals, drig_setup, drig_teardown),
        cmocka_unit_test_setup_teardown(test_malformed_and_cancel, drig_setup, drig_teardown),
        cmocka_unit_test_setup_teardown(test_cancel_before_kv_alloc, drig_setup, drig_teardown),
        cmocka_unit_test_setup_teardown(test_sigterm_drains, drig_setup, drig_teardown),
        cmocka_unit_test_setup_teardown(test_sigint_stops, drig_setup, drig_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
