/* kvf-prefill's scheduling arithmetic (prefill_node/plan.h): which blocks a
 * chunk completes (checked against a brute-force replay of every position:
 * each block shipped exactly once, never before all its tokens exist), how
 * a forward's token budget is split, and slice offsets against the pool's
 * own layout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "plan.h"

#include "kvf/kvcache.h"

#include <stdlib.h>
#include <string.h>

static void expect_blocks(uint32_t bs, uint32_t start, uint32_t n, uint32_t total, uint32_t first,
                          uint32_t end)
{
    uint32_t f = 99, e = 99;
    kvf_prefill_plan_blocks(bs, start, n, total, &f, &e);
    if (f != first || e != end)
        fail_msg("block %u, chunk [%u, %u) of %u: got [%u, %u), want [%u, %u)", bs, start,
                 start + n, total, f, e, first, end);
}

static void test_blocks_cases(void **state)
{
    (void)state;
    expect_blocks(16, 0, 40, 40, 0, 3);  /* whole prompt: every block, the last partial */
    expect_blocks(16, 0, 16, 40, 0, 1);  /* exactly one full block */
    expect_blocks(16, 0, 10, 40, 0, 0);  /* inside block 0: nothing yet */
    expect_blocks(16, 10, 20, 40, 0, 1); /* completes block 0 only */
    expect_blocks(16, 30, 10, 40, 1, 3); /* final: block 1 and the partial block 2 */
    expect_blocks(16, 16, 16, 32, 1, 2); /* final chunk ending on a block edge */
    expect_blocks(16, 0, 1, 1, 0, 1);    /* one-token prompt */
    expect_blocks(1, 3, 2, 9, 3, 5);     /* block size 1 */
    expect_blocks(16, 17, 1, 18, 1, 2);  /* last token alone */
}

/* Replays random chunkings of random prompts position by position. */
static void test_blocks_exactly_once(void **state)
{
    (void)state;
    srand(7);
    for (int iter = 0; iter < 3000; iter++) {
        uint32_t bs = 1 + (uint32_t)(rand() % 20);
        uint32_t total = 1 + (uint32_t)(rand() % 300);
        uint32_t n_blocks = (total + bs - 1) / bs;
        int *shipped = calloc(n_blocks, sizeof(int));
        assert_non_null(shipped);
        uint32_t done = 0;
        while (done < total) {
            uint32_t n = 1 + (uint32_t)(rand() % 40);
            if (n > total - done)
                n = total - done;
            uint32_t f, e;
            kvf_prefill_plan_blocks(bs, done, n, total, &f, &e);
            done += n;
            assert_true(f <= e && e <= n_blocks);
            for (uint32_t b = f; b < e; b++) {
                /* Every position of the block that belongs to the prompt
                 * has been computed. */
                uint32_t last = (b + 1) * bs < total ? (b + 1) * bs : total;
                assert_true(last <= done);
                shipped[b]++;
            }
        }
        for (uint32_t b = 0; b < n_blocks; b++)
            if (shipped[b] != 1)
                fail_msg("bs %u total %u: block %u shipped %d times", bs, total, b, shipped[b]);
        free(shipped);
    }
}

static void test_forward_budget(void **state)
{
    (void)state;
    uint32_t take[4];
    /* Whole prompts while they fit, then one aligned chunk. */
    uint32_t rem1[] = {5, 7, 100, 3};
    assert_int_equal(kvf_prefill_plan_forward(rem1, 4, 40, 16, 32, take), 3);
    assert_int_equal(take[0], 5);
    assert_int_equal(take[1], 7);
    assert_int_equal(take[2], 16); /* 28 left: chunk ends on a multiple of 16 */
    assert_int_equal(take[3], 0);
    uint32_t rem2[] = {5, 7};
    assert_int_equal(kvf_prefill_plan_forward(rem2, 2, 2048, 16, 32, take), 2);
    assert_int_equal(take[0] + take[1], 12);
    /* A long prompt alone: no tail shorter than min_tail is left. */
    uint32_t rem3[] = {5000};
    assert_int_equal(kvf_prefill_plan_forward(rem3, 1, 2048, 16, 32, take), 1);
    assert_int_equal(take[0], 2048);
    uint32_t rem4[] = {2053};
    assert_int_equal(kvf_prefill_plan_forward(rem4, 1, 2048, 16, 32, take), 1);
    assert_int_equal(take[0], 2016); /* 37 left for the next forward, not 5 */
    /* Budget left too small for an aligned chunk: the prompt waits. */
    uint32_t rem5[] = {30, 100};
    assert_int_equal(kvf_prefill_plan_forward(rem5, 2, 40, 16, 32, take), 1);
    assert_int_equal(take[0], 30);
    assert_int_equal(take[1], 0);
    /* ...unless it is alone: then the tail rule yields to progress. */
    uint32_t rem6[] = {40};
    assert_int_equal(kvf_prefill_plan_forward(rem6, 1, 24, 16, 32, take), 1);
    assert_int_equal(take[0], 16);
    uint32_t rem7[] = {40};
    assert_int_equal(kvf_prefill_plan_forward(rem7, 1, 5, 16, 32, take), 1);
    assert_int_equal(take[0], 5);
    uint32_t rem8[] = {4, 4};
    assert_int_equal(kvf_prefill_plan_forward(rem8, 2, 4, 16, 32, take), 1);
    assert_int_equal(take[1], 0);
}

/* Every prompt finishes, whatever the budget, and chunk starts stay on the
 * alignment whenever the budget allows it. */
static void test_forward_progress(void **state)
{
    (void)state;
    srand(11);
    for (int iter = 0; iter < 2000; iter++) {
        uint32_t rem[6], take[6], budget = 1 + (uint32_t)(rand() % 300);
        size_t n = 1 + (size_t)(rand() % 6);
        for (size_t i = 0; i < n; i++)
            rem[i] = 1 + (uint32_t)(rand() % 700);
        int forwards = 0;
        uint32_t done0 = 0;
        while (rem[0] > 0 && forwards < 10000) {
            size_t used = kvf_prefill_plan_forward(rem, n, budget, 16, 32, take);
            assert_true(used >= 1);
            uint32_t sum = 0;
            for (size_t i = 0; i < n; i++) {
                assert_true(take[i] <= rem[i]);
                sum += take[i];
            }
            assert_true(sum >= 1 && sum <= budget);
            if (budget >= 16 && take[0] < rem[0])
                assert_int_equal((done0 + take[0]) % 16, 0);
            done0 += take[0];
            for (size_t i = 0; i < n; i++)
                rem[i] -= take[i];
            /* finished prompts leave the queue */
            size_t k = 0;
            for (size_t i = 0; i < n; i++)
                if (rem[i] > 0 || i == 0)
                    rem[k++] = rem[i];
            n = k;
            forwards++;
        }
        assert_int_equal(rem[0], 0);
    }
}

static void test_slice_offsets(void **state)
{
    (void)state;
    kvf_kv_geometry_t g = {
        .n_layers = 3, .n_kv_heads = 2, .head_dim = 8, .block_size = 4, .dtype = KVF_KV_F32};
    kvf_kvpool_t *pool = NULL;
    assert_int_equal(kvf_kvpool_create(&g, 10, &pool), KVF_OK);
    /* The remote formula is the pool's own layout. */
    for (uint32_t b = 0; b < 10; b++)
        for (int l = 0; l < 3; l++)
            assert_int_equal(kvf_prefill_slice_offset(&g, b, l),
                             kvf_kvpool_slice_offset(pool, b, l));
    uint32_t local[] = {7, 2, 5};
    uint32_t remote[] = {100, 41, 3};
    kvf_xfer_slice_t s[3];
    assert_int_equal(kvf_prefill_plan_slices(pool, 2, local, remote, 1, 3, s), 2);
    size_t sb = kvf_kvpool_slice_bytes(pool);
    assert_int_equal(s[0].local_off, kvf_kvpool_slice_offset(pool, 2, 2));
    assert_int_equal(s[0].remote_off, 41 * kvf_kv_block_bytes(&g) + 2 * sb);
    assert_int_equal(s[1].local_off, kvf_kvpool_slice_offset(pool, 5, 2));
    assert_int_equal(s[1].remote_off, 3 * kvf_kv_block_bytes(&g) + 2 * sb);
    assert_int_equal(s[0].len, sb);
    assert_int_equal(kvf_prefill_plan_slices(pool, 0, local, remote, 1, 1, s), 0);
    kvf_kvpool_destroy(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_blocks_cases),   cmocka_unit_test(test_blocks_exactly_once),
        cmocka_unit_test(test_forward_budget), cmocka_unit_test(test_forward_progress),
        cmocka_unit_test(test_slice_offsets),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
