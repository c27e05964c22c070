/* Decode node logic without sockets: the handoff state machine, admission
 * control and the finish rule (decode_node/handoff.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "handoff.h"

static void test_sealed_needs_both_halves(void **state)
{
    (void)state;
    /* LANDED(last) first, then KvReady. */
    kvf_handoff_t h;
    kvf_handoff_init(&h, false);
    assert_int_equal(h.state, KVF_HANDOFF_ALLOCATED);
    assert_int_equal(kvf_handoff_start(&h), KVF_ERR_INVAL);
    assert_int_equal(kvf_handoff_on_landed(&h, false), KVF_OK);
    assert_int_equal(h.state, KVF_HANDOFF_WRITING);
    assert_int_equal(kvf_handoff_on_landed(&h, true), KVF_OK);
    assert_int_equal(h.state, KVF_HANDOFF_WRITING);
    /* Nothing may land after the last batch. */
    assert_int_equal(kvf_handoff_on_landed(&h, false), KVF_ERR_STALE);
    assert_int_equal(kvf_handoff_start(&h), KVF_ERR_INVAL);
    assert_int_equal(kvf_handoff_on_ready(&h), KVF_OK);
    assert_int_equal(h.state, KVF_HANDOFF_SEALED);
    assert_int_equal(kvf_handoff_on_ready(&h), KVF_ERR_STALE);
    assert_int_equal(kvf_handoff_start(&h), KVF_OK);
    assert_int_equal(h.state, KVF_HANDOFF_DECODING);
    assert_true(kvf_handoff_live(&h));
    assert_int_equal(kvf_handoff_on_landed(&h, true), KVF_ERR_STALE);
    assert_int_equal(kvf_handoff_on_released(&h), KVF_ERR_STALE);
    assert_int_equal(kvf_handoff_end(&h), KVF_OK);
    assert_int_equal(h.state, KVF_HANDOFF_RELEASING);
    assert_false(kvf_handoff_live(&h));
    assert_int_equal(kvf_handoff_end(&h), KVF_ERR_STALE);
    assert_int_equal(kvf_handoff_on_released(&h), KVF_OK);
    assert_int_equal(h.state, KVF_HANDOFF_RELEASED);
    assert_int_equal(kvf_handoff_on_released(&h), KVF_ERR_STALE);
}

static void test_ready_before_landed(void **state)
{
    (void)state;
    kvf_handoff_t h;
    kvf_handoff_init(&h, false);
    assert_int_equal(kvf_handoff_on_ready(&h), KVF_OK);
    assert_int_equal(h.state, KVF_HANDOFF_ALLOCATED);
    assert_int_equal(kvf_handoff_on_landed(&h, false), KVF_OK);
    assert_int_equal(h.state, KVF_HANDOFF_WRITING);
    /* A single LAST batch seals it. */
    kvf_handoff_t g;
    kvf_handoff_init(&g, false);
    assert_int_equal(kvf_handoff_on_ready(&g), KVF_OK);
    assert_int_equal(kvf_handoff_on_landed(&g, true), KVF_OK);
    assert_int_equal(g.state, KVF_HANDOFF_SEALED);
    /* Ending before sealing (lease, cancel) is allowed from any live state. */
    assert_int_equal(kvf_handoff_end(&h), KVF_OK);
    assert_int_equal(kvf_handoff_on_ready(&h), KVF_ERR_STALE);
    assert_int_equal(kvf_handoff_on_landed(&h, true), KVF_ERR_STALE);
}

static void test_local_prefill(void **state)
{
    (void)state;
    kvf_handoff_t h;
    kvf_handoff_init(&h, true);
    assert_int_equal(h.state, KVF_HANDOFF_PREFILLING);
    assert_true(kvf_handoff_live(&h));
    assert_int_equal(kvf_handoff_on_landed(&h, true), KVF_ERR_STALE);
    assert_int_equal(kvf_handoff_on_ready(&h), KVF_ERR_STALE);
    assert_int_equal(kvf_handoff_start(&h), KVF_OK);
    assert_int_equal(h.state, KVF_HANDOFF_DECODING);
    assert_int_equal(kvf_handoff_end(&h), KVF_OK);
    assert_int_equal(kvf_handoff_on_released(&h), KVF_OK);
}

static void test_admission(void **state)
{
    (void)state;
    kvf_decode_admission_t a = {
        .free_blocks = 10, .live = 0, .max_running = 2, .max_context = 256, .block_size = 16};
    uint32_t n = 0;
    /* ceil((20 + 12) / 16) = 2 */
    assert_int_equal(kvf_decode_admit(&a, 20, 12, &n), KVF_OK);
    assert_int_equal(n, 2);
    assert_int_equal(kvf_decode_admit(&a, 20, 13, &n), KVF_OK);
    assert_int_equal(n, 3);
    /* exactly the free blocks, then one more */
    assert_int_equal(kvf_decode_admit(&a, 100, 60, &n), KVF_OK);
    assert_int_equal(n, 10);
    n = 77;
    assert_int_equal(kvf_decode_admit(&a, 100, 61, &n), KVF_ERR_NO_SPACE);
    assert_int_equal(n, 77); /* untouched on refusal */
    /* the context caps the blocks taken: 255 + huge -> 256 positions */
    a.free_blocks = 16;
    assert_int_equal(kvf_decode_admit(&a, 255, UINT32_MAX, &n), KVF_OK);
    assert_int_equal(n, 16);
    /* no room for even one token, or nothing to hold */
    assert_int_equal(kvf_decode_admit(&a, 256, 1, &n), KVF_ERR_INVAL);
    assert_int_equal(kvf_decode_admit(&a, UINT32_MAX, UINT32_MAX, &n), KVF_ERR_INVAL);
    assert_int_equal(kvf_decode_admit(&a, 0, 5, &n), KVF_ERR_INVAL);
    /* max_running */
    a.live = 2;
    assert_int_equal(kvf_decode_admit(&a, 1, 1, &n), KVF_ERR_NO_SPACE);
    /* a context refusal wins over a capacity one: retrying elsewhere is useless */
    assert_int_equal(kvf_decode_admit(&a, 300, 1, &n), KVF_ERR_INVAL);
}

static void test_finish_rule(void **state)
{
    (void)state;
    const Kvf__FinishReason NONE = KVF__FINISH_REASON__FINISH_NONE,
                            STOP = KVF__FINISH_REASON__FINISH_STOP,
                            LENGTH = KVF__FINISH_REASON__FINISH_LENGTH;
    /* (is_eos, ignore_eos, gen, max_tokens, seq_len, max_context, capacity) */
    assert_int_equal(kvf_decode_finish_reason(false, false, 1, 5, 11, 256, 32), NONE);
    assert_int_equal(kvf_decode_finish_reason(true, false, 1, 5, 11, 256, 32), STOP);
    assert_int_equal(kvf_decode_finish_reason(true, true, 1, 5, 11, 256, 32), NONE);
    /* EOS on the last allowed token is still a stop */
    assert_int_equal(kvf_decode_finish_reason(true, false, 5, 5, 15, 256, 32), STOP);
    assert_int_equal(kvf_decode_finish_reason(false, false, 5, 5, 15, 256, 32), LENGTH);
    assert_int_equal(kvf_decode_finish_reason(false, false, 1, 1, 11, 256, 32), LENGTH);
    /* context full: the sequence holds max_context tokens */
    assert_int_equal(kvf_decode_finish_reason(false, false, 3, 100, 255, 256, 256), NONE);
    assert_int_equal(kvf_decode_finish_reason(false, false, 4, 100, 256, 256, 256), LENGTH);
    /* the blocks would not hold the next position */
    assert_int_equal(kvf_decode_finish_reason(false, false, 4, 100, 32, 256, 32), NONE);
    assert_int_equal(kvf_decode_finish_reason(false, false, 5, 100, 33, 256, 32), LENGTH);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sealed_needs_both_halves),
        cmocka_unit_test(test_ready_before_landed),
        cmocka_unit_test(test_local_prefill),
        cmocka_unit_test(test_admission),
        cmocka_unit_test(test_finish_rule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
