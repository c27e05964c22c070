/* KV pool tests: layout arithmetic, budget sizing, allocation all-or-none,
 * reference counts, block tables, and that freeing returns every block. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kvf/kvcache.h"
#include "kvf/log.h"

#include <stdint.h>
#include <stdlib.h>

static kvf_kv_geometry_t geo(int block_size)
{
    kvf_kv_geometry_t g = {.n_layers = 3,
                           .n_kv_heads = 2,
                           .head_dim = 8,
                           .block_size = block_size,
                           .dtype = KVF_KV_F32};
    return g;
}

static void test_layout(void **state)
{
    (void)state;
    kvf_kv_geometry_t g = geo(16);
    assert_int_equal(kvf_kv_bytes_per_token(&g), 2 * 3 * 2 * 8 * 4);
    assert_int_equal(kvf_kv_slice_bytes(&g), 2 * 2 * 16 * 8 * 4);
    assert_int_equal(kvf_kv_block_bytes(&g), 3 * kvf_kv_slice_bytes(&g));
    kvf_kvpool_t *p;
    assert_int_equal(kvf_kvpool_create(&g, 5, &p), KVF_OK);
    assert_int_equal(kvf_kvpool_bytes(p), 5 * kvf_kv_block_bytes(&g));
    assert_int_equal(kvf_kvpool_slice_offset(p, 2, 1),
                     2 * kvf_kv_block_bytes(&g) + kvf_kv_slice_bytes(&g));
    assert_int_equal(kvf_kvpool_slice_bytes(p), kvf_kv_slice_bytes(&g));
    /* [K,V][kv_head][slot][head_dim] inside a slice */
    char *base = kvf_kvpool_base(p);
    char *slice = base + kvf_kvpool_slice_offset(p, 4, 2);
    assert_ptr_equal((char *)(float *)kvf_kvpool_head_data(p, 4, 2, 0, 0), slice);
    assert_ptr_equal((char *)(float *)kvf_kvpool_head_data(p, 4, 2, 0, 1), slice + 16 * 8 * 4);
    assert_ptr_equal((char *)(float *)kvf_kvpool_head_data(p, 4, 2, 1, 0), slice + 2 * 16 * 8 * 4);
    assert_ptr_equal((char *)(float *)kvf_kvpool_head_data(p, 4, 2, 1, 1) + 16 * 8 * 4,
                     slice + kvf_kv_slice_bytes(&g));
    assert_int_equal((uintptr_t)base % 64, 0);
    kvf_kvpool_destroy(p);
}

static void test_budget_and_validation(void **state)
{
    (void)state;
    kvf_log_set_level(KVF_LOG_OFF);
    kvf_kv_geometry_t g = geo(16);
    kvf_kvpool_t *p;
    assert_int_equal(kvf_kvpool_create_budget(&g, 10 * kvf_kv_block_bytes(&g) + 7, &p), KVF_OK);
    assert_int_equal(kvf_kvpool_num_blocks(p), 10);
    kvf_kvpool_destroy(p);
    assert_int_equal(kvf_kvpool_create_budget(&g, kvf_kv_block_bytes(&g) - 1, &p),
                     KVF_ERR_NO_SPACE);
    int sizes[] = {1, 256};
    for (int i = 0; i < 2; i++) {
        g = geo(sizes[i]);
        assert_int_equal(kvf_kvpool_create(&g, 2, &p), KVF_OK);
        kvf_kvpool_destroy(p);
    }
    g = geo(0);
    assert_int_equal(kvf_kvpool_create(&g, 2, &p), KVF_ERR_INVAL);
    g = geo(257);
    assert_int_equal(kvf_kvpool_create(&g, 2, &p), KVF_ERR_INVAL);
    g = geo(16);
    g.dtype = (kvf_kv_dtype_t)KVF_KV_N_DTYPES;
    assert_int_equal(kvf_kvpool_create(&g, 2, &p), KVF_ERR_UNSUPPORTED);
    g = geo(16);
    g.dtype = KVF_KV_INT8;
    g.head_dim = 6; /* the scales after the data would not be 4-byte aligned */
    assert_int_equal(kvf_kvpool_create(&g, 2, &p), KVF_ERR_UNSUPPORTED);
}

/* Every format: a block is block_size tokens of kvf_kv_bytes_per_token;
 * the data and scales of each (kv, head) lie inside its slice, one after
 * another, without overlap. */
static void test_formats_layout(void **state)
{
    (void)state;
    for (int dt = 0; dt < KVF_KV_N_DTYPES; dt++) {
        kvf_kv_geometry_t g = geo(16);
        g.dtype = (kvf_kv_dtype_t)dt;
        size_t row =
            (size_t)g.head_dim * kvf_kv_elem_bytes(g.dtype) + (kvf_kv_scaled(g.dtype) ? 4 : 0);
        assert_int_equal(kvf_kv_bytes_per_token(&g), 2 * (size_t)g.n_layers * g.n_kv_heads * row);
        assert_int_equal(kvf_kv_block_bytes(&g), (size_t)g.block_size * kvf_kv_bytes_per_token(&g));
        kvf_kvpool_t *p;
        assert_int_equal(kvf_kvpool_create(&g, 3, &p), KVF_OK);
        assert_int_equal(kvf_kvpool_bytes(p), 3 * kvf_kv_block_bytes(&g));
        uint8_t *slice = (uint8_t *)kvf_kvpool_base(p) + kvf_kvpool_slice_offset(p, 2, 1);
        size_t data_bytes = (size_t)g.block_size * g.head_dim * kvf_kv_elem_bytes(g.dtype);
        size_t expect = 0;
        for (int kv = 0; kv < 2; kv++) {
            for (int h = 0; h < g.n_kv_heads; h++, expect += data_bytes)
                assert_ptr_equal(kvf_kvpool_head_data(p, 2, 1, kv, h), slice + expect);
        }
        for (int kv = 0; kv < 2; kv++) {
            for (int h = 0; h < g.n_kv_heads; h++) {
                float *sc = kvf_kvpool_head_scales(p, 2, 1, kv, h);
                if (!kvf_kv_scaled(g.dtype)) {
                    assert_null(sc);
                    continue;
                }
                assert_ptr_equal(sc, slice + expect);
                expect += (size_t)g.block_size * sizeof(float);
            }
        }
        assert_int_equal(expect, kvf_kvpool_slice_bytes(p));
        kvf_kvpool_destroy(p);
    }
}

static void test_alloc_refcount(void **state)
{
    (void)state;
    kvf_kv_geometry_t g = geo(4);
    kvf_kvpool_t *p;
    assert_int_equal(kvf_kvpool_create(&g, 8, &p), KVF_OK);
    uint32_t ids[8];
    assert_int_equal(kvf_kvpool_alloc(p, 5, ids), KVF_OK);
    assert_int_equal(kvf_kvpool_used_blocks(p), 5);
    assert_int_equal(kvf_kvpool_free_blocks(p), 3);
    for (int i = 0; i < 5; i++)
        for (int j = i + 1; j < 5; j++)
            assert_int_not_equal(ids[i], ids[j]);
    /* all or none */
    uint32_t more[4];
    assert_int_equal(kvf_kvpool_alloc(p, 4, more), KVF_ERR_NO_SPACE);
    assert_int_equal(kvf_kvpool_free_blocks(p), 3);
    /* shared block survives one release */
    assert_int_equal(kvf_kvpool_ref(p, ids[0]), KVF_OK);
    assert_int_equal(kvf_kvpool_refcount(p, ids[0]), 2);
    assert_int_equal(kvf_kvpool_release(p, ids, 5), KVF_OK);
    assert_int_equal(kvf_kvpool_used_blocks(p), 1);
    assert_true(kvf_kvpool_is_allocated(p, ids[0]));
    assert_int_equal(kvf_kvpool_release(p, ids, 1), KVF_OK);
    assert_int_equal(kvf_kvpool_used_blocks(p), 0);
    /* double free and out of range are reported, not fatal */
    kvf_log_set_level(KVF_LOG_OFF);
    assert_int_equal(kvf_kvpool_release(p, ids, 1), KVF_ERR_INVAL);
    uint32_t bad = 99;
    assert_int_equal(kvf_kvpool_release(p, &bad, 1), KVF_ERR_INVAL);
    assert_int_equal(kvf_kvpool_ref(p, bad), KVF_ERR_INVAL);
    assert_int_equal(kvf_kvpool_free_blocks(p), 8);
    kvf_kvpool_destroy(p);
}

static void test_block_tables(void **state)
{
    (void)state;
    kvf_kv_geometry_t g = geo(16);
    kvf_kvpool_t *p;
    assert_int_equal(kvf_kvpool_create(&g, 40, &p), KVF_OK);
    kvf_block_table_t a, b;
    kvf_block_table_init(&a);
    kvf_block_table_init(&b);
    assert_int_equal(kvf_block_table_reserve(&a, p, 1), KVF_OK);
    assert_int_equal(a.n_blocks, 1);
    assert_int_equal(kvf_block_table_reserve(&a, p, 16), KVF_OK);
    assert_int_equal(a.n_blocks, 1);
    assert_int_equal(kvf_block_table_reserve(&a, p, 17), KVF_OK);
    assert_int_equal(a.n_blocks, 2);
    /* grow one token at a time past the initial capacity */
    for (uint32_t t = 18; t <= 30 * 16; t++)
        assert_int_equal(kvf_block_table_reserve(&a, p, t), KVF_OK);
    assert_int_equal(a.n_blocks, 30);
    assert_int_equal(kvf_block_table_reserve(&b, p, 11 * 16), KVF_ERR_NO_SPACE);
    assert_int_equal(b.n_blocks, 0);
    assert_int_equal(kvf_kvpool_used_blocks(p), 30);
    assert_int_equal(kvf_block_table_reserve(&b, p, 10 * 16), KVF_OK);
    assert_int_equal(kvf_kvpool_free_blocks(p), 0);
    kvf_block_table_release(&a, p);
    assert_int_equal(kvf_kvpool_used_blocks(p), 10);
    kvf_block_table_release(&b, p);
    assert_int_equal(kvf_kvpool_used_blocks(p), 0);
    assert_int_equal(kvf_kvpool_free_blocks(p), 40);
    uint32_t ids[3] = {4, 5, 6};
    assert_int_equal(kvf_block_table_append(&a, ids, 3), KVF_OK);
    assert_int_equal(a.n_blocks, 3);
    assert_int_equal(a.blocks[2], 6);
    assert_int_equal(kvf_kv_blocks_for_tokens(&g, 0), 0);
    assert_int_equal(kvf_kv_blocks_for_tokens(&g, 33), 3);
    kvf_block_table_fini(&a);
    kvf_block_table_fini(&b);
    kvf_kvpool_destroy(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout),         cmocka_unit_test(test_budget_and_validation),
        cmocka_unit_test(test_formats_layout), cmocka_unit_test(test_alloc_refcount),
        cmocka_unit_test(test_block_tables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
