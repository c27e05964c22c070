/* kvf-decode as a process, in the rig of decode_rig.h: whole requests it
 * serves alone (--prefill-local) and the disaggregated KV handoff (RMA and
 * active messages, KvReady before and after the K/V), whose tokens must be
 * the golden greedy continuations, their text the tokenizer's decoding,
 * and whose blocks all come back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "decode_rig.h"

#include <signal.h>

#include "kvf/log.h"

/* Whole requests served by the node alone (--prefill-local), four at once:
 * chunked prefill (10 tokens per forward) beside decoding sequences. */
static void test_local_prefill_matches_golden(void **state)
{
    drig_t *h = *state;
    drig_start(h, NULL);
    assert_int_equal(h->max_context, 256);
    Kvf__Sampling s = drig_greedy_sampling(DRIG_N_GREEDY);
    for (int p = 0; p < DRIG_N_PROMPTS; p++)
        drig_send_prefill_request(h, 100 + p, 1, h->prompts[p].ids, h->prompts[p].n_ids, &s);
    for (int p = 0; p < DRIG_N_PROMPTS; p++) {
        uint64_t id = 100 + p;
        assert_true(drig_pump(h, 30000, drig_req_finished, &id));
    }
    for (int p = 0; p < DRIG_N_PROMPTS; p++) {
        drig_check_golden(h, 100 + p, &h->prompts[p]);
        assert_true(drig_seen(h, 100 + p)->prefill_done);
    }
    drig_expect_no_blocks_used(h);
    assert_int_equal(drig_stop(h), 0);
    assert_true(h->deregistered);
    for (int i = 0; i < h->n_reqs; i++)
        assert_int_equal(h->reqs[i].n_chunks_after_finish, 0);
}

/* The disaggregated path: KvAlloc -> reply -> transfer (LAST) and KvReady,
 * in both orders -> decode. */
static void handoff_matches_golden(drig_t *h, const char *mode)
{
    drig_start(h, mode);
    drig_prefill_t f = {0};
    drig_prefill_open(h, &f);
    Kvf__Sampling s = drig_greedy_sampling(DRIG_N_GREEDY);
    for (int p = 0; p < DRIG_N_PROMPTS; p++) {
        uint64_t id = 200 + p;
        const drig_prompt_t *g = &h->prompts[p];
        drig_send_kv_alloc(h, id, 1, (uint32_t)g->n_ids, DRIG_N_GREEDY);
        assert_true(drig_pump(h, 5000, drig_alloc_replied, &id));
        assert_int_equal(h->alloc_status, 0);
        /* prompt + generation room, block size 8 */
        assert_int_equal(h->n_alloc_blocks,
                         (g->n_ids + DRIG_N_GREEDY + DRIG_BLOCK_SIZE - 1) / DRIG_BLOCK_SIZE);
        if (p % 2) {
            /* KvReady first: the node must wait for the K/V. */
            drig_send_kv_ready(h, id, 1, g->greedy[0], g->ids, (uint32_t)g->n_ids, &s);
            drig_pump(h, 100, NULL, NULL);
            assert_int_equal(drig_seen(h, id)->n_tokens, 0);
            assert_int_equal(drig_prefill_and_ship(h, &f, id, 1, g), g->greedy[0]);
        } else {
            uint32_t first = drig_prefill_and_ship(h, &f, id, 1, g);
            assert_int_equal(first, g->greedy[0]);
            drig_send_kv_ready(h, id, 1, first, g->ids, (uint32_t)g->n_ids, &s);
        }
    }
    for (int p = 0; p < DRIG_N_PROMPTS; p++) {
        uint64_t id = 200 + p;
        assert_true(drig_pump(h, 30000, drig_req_finished, &id));
        /* the first token (sampled by the prefill node) comes from the
         * decode node, as every other */
        drig_check_golden(h, id, &h->prompts[p]);
        assert_false(drig_seen(h, id)->prefill_done);
        /* KvReady's PrefillDone, relayed once, on the first chunk */
        assert_int_equal(drig_seen(h, id)->n_relayed, 1);
        assert_int_equal(drig_seen(h, id)->relayed_kv_bytes, DRIG_RELAY_KV_BYTES);
    }
    drig_expect_no_blocks_used(h);
    drig_prefill_close(&f);
    assert_int_equal(drig_stop(h), 0);
}

static void test_handoff_rma_matches_golden(void **state)
{
    handoff_matches_golden(*state, "--xfer-mode rma");
}

static void test_handoff_am_matches_golden(void **state)
{
    handoff_matches_golden(*state, "--xfer-mode am");
}

int main(void)
{
    kvf_log_init("test", NULL);
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_local_prefill_matches_golden, drig_setup,
                                        drig_teardown),
        cmocka_unit_test_setup_teardown(test_handoff_rma_matches_golden, drig_setup, drig_teardown),
        cmocka_unit_test_setup_teardown(test_handoff_am_matches_golden, drig_setup, drig_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
