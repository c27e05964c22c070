/* kvf/array.h: capacities double from the minimum, an array keeps its
 * items as it grows, and a size that overflows is refused with the array
 * and its capacity untouched. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kvf/array.h"

#include <stdint.h>
#include <stdlib.h>

static void test_grow_cap(void **state)
{
    (void)state;
    assert_int_equal(kvf_array_grow_cap(0, 1, 16), 16);
    assert_int_equal(kvf_array_grow_cap(0, 17, 16), 32);
    assert_int_equal(kvf_array_grow_cap(0, 100, 64), 128);
    assert_int_equal(kvf_array_grow_cap(16, 17, 4), 32);
    assert_int_equal(kvf_array_grow_cap(16, 16, 4), 16); /* holds it already */
    assert_int_equal(kvf_array_grow_cap(16, 3, 4), 16);
    assert_int_equal(kvf_array_grow_cap(3, 7, 64), 12); /* doubles from cap, not min */
    assert_int_equal(kvf_array_grow_cap(0, 5, 0), 8);   /* no minimum: from 1 */
    /* doubling would pass SIZE_MAX: exactly need */
    size_t big = SIZE_MAX / 2 + 2;
    assert_int_equal(kvf_array_grow_cap(SIZE_MAX / 2 + 1, big, 8), big);
    assert_int_equal(kvf_array_grow_cap(1, SIZE_MAX, 8), SIZE_MAX);
}

static void test_reserve_grows_and_keeps_items(void **state)
{
    (void)state;
    uint32_t *ids = NULL;
    size_t cap = 0;
    assert_int_equal(kvf_array_reserve(&ids, &cap, 0, 8, sizeof(*ids)), KVF_OK);
    assert_null(ids); /* nothing needed: nothing allocated */
    assert_int_equal(cap, 0);
    size_t n = 0;
    size_t caps_seen[8], n_caps = 0;
    for (uint32_t i = 0; i < 100; i++) {
        size_t before = cap;
        assert_int_equal(kvf_array_reserve(&ids, &cap, n + 1, 8, sizeof(*ids)), KVF_OK);
        if (cap != before) {
            assert_true(n_caps < 8);
            caps_seen[n_caps++] = cap;
        }
        ids[n++] = i * 7;
    }
    assert_int_equal(n_caps, 5);
    assert_int_equal(caps_seen[0], 8);
    assert_int_equal(caps_seen[1], 16);
    assert_int_equal(caps_seen[4], 128);
    for (uint32_t i = 0; i < 100; i++)
        assert_int_equal(ids[i], i * 7);
    /* room already: neither the pointer nor the capacity moves */
    uint32_t *same = ids;
    assert_int_equal(kvf_array_reserve(&ids, &cap, 128, 8, sizeof(*ids)), KVF_OK);
    assert_ptr_equal(ids, same);
    assert_int_equal(cap, 128);
    free(ids);
}

static void test_overflow_refused_untouched(void **state)
{
    (void)state;
    uint64_t *v = NULL;
    size_t cap = 0;
    assert_int_equal(kvf_array_reserve(&v, &cap, 3, 4, sizeof(*v)), KVF_OK);
    v[0] = 11, v[1] = 22, v[2] = 33;
    uint64_t *kept = v;
    /* need * 8 bytes does not fit in size_t */
    assert_int_equal(kvf_array_reserve(&v, &cap, SIZE_MAX / 4, 4, sizeof(*v)), KVF_ERR_NOMEM);
    assert_ptr_equal(v, kept);
    assert_int_equal(cap, 4);
    assert_int_equal(kvf_array_reserve(&v, &cap, SIZE_MAX, 4, sizeof(*v)), KVF_ERR_NOMEM);
    assert_ptr_equal(v, kept);
    assert_int_equal(cap, 4);
    assert_int_equal(kvf_array_resize(&v, SIZE_MAX / 8 + 1, sizeof(*v)), KVF_ERR_NOMEM);
    assert_ptr_equal(v, kept);
    assert_int_equal(kvf_array_resize(&v, 0, sizeof(*v)), KVF_ERR_INVAL);
    assert_int_equal(kvf_array_resize(&v, 4, 0), KVF_ERR_INVAL);
    assert_ptr_equal(v, kept);
    assert_true(v[0] == 11 && v[1] == 22 && v[2] == 33);
    free(v);
}

static void test_resize_shared_capacity(void **state)
{
    (void)state;
    /* two arrays that share one capacity, as the prefill forward's do */
    int *a = NULL;
    double *b = NULL;
    size_t cap = kvf_array_grow_cap(0, 10, 4);
    assert_int_equal(cap, 16);
    assert_int_equal(kvf_array_resize(&a, cap, sizeof(*a)), KVF_OK);
    assert_int_equal(kvf_array_resize(&b, cap, sizeof(*b)), KVF_OK);
    for (size_t i = 0; i < cap; i++) {
        a[i] = (int)i;
        b[i] = (double)i / 2;
    }
    assert_int_equal(kvf_array_resize(&a, 2 * cap, sizeof(*a)), KVF_OK);
    assert_int_equal(a[15], 15);
    assert_true(b[15] == 7.5);
    free(a);
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grow_cap),
        cmocka_unit_test(test_reserve_grows_and_keeps_items),
        cmocka_unit_test(test_overflow_refused_untouched),
        cmocka_unit_test(test_resize_shared_capacity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
