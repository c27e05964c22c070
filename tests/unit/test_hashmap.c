/* kvf/hashmap.h: the uthash setup (checked adds keyed in the element and
 * by pointer, lookups, deletes) and kvf_strset, against a plain array
 * searched by scanning. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kvf/hashmap.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t id;
    int value;
    UT_hash_handle hh;
} item_t;

/* Integer keys in the element: every key found, absent ones not, a
 * deleted one gone while the others stay. */
static void test_u64_keys(void **state)
{
    (void)state;
    enum { N = 5000 };
    item_t *items = calloc(N, sizeof(*items));
    assert_non_null(items);
    item_t *table = NULL;
    for (int i = 0; i < N; i++) {
        items[i].id = (uint64_t)i * 0x9e3779b97f4a7c15ull; /* spread over all 64 bits */
        items[i].value = i;
        kvf_status_t st;
        KVF_HASH_ADD(table, id, &items[i], st);
        assert_int_equal(st, KVF_OK);
    }
    assert_int_equal(HASH_COUNT(table), N);
    for (int i = 0; i < N; i++) {
        uint64_t key = (uint64_t)i * 0x9e3779b97f4a7c15ull;
        const item_t *found;
        HASH_FIND(hh, table, &key, sizeof(key), found);
        assert_ptr_equal(found, &items[i]);
        key += 1; /* never a key: the multiples are far apart */
        HASH_FIND(hh, table, &key, sizeof(key), found);
        assert_null(found);
    }
    HASH_DELETE(hh, table, &items[7]);
    const item_t *found;
    HASH_FIND(hh, table, &items[7].id, sizeof(items[7].id), found);
    assert_null(found);
    HASH_FIND(hh, table, &items[8].id, sizeof(items[8].id), found);
    assert_ptr_equal(found, &items[8]);
    assert_int_equal(HASH_COUNT(table), N - 1);
    HASH_CLEAR(hh, table);
    assert_null(table);
    free(items);
}

/* Keys elsewhere (KEYPTR), with lengths: a prefix of a key is not the key. */
static void test_keyptr(void **state)
{
    (void)state;
    const char *words[] = {"a", "ab", "abc", "b", "", "Ġthe", "\xff\xfe"};
    enum { N = sizeof(words) / sizeof(words[0]) };
    item_t items[N] = {0};
    item_t *table = NULL;
    for (int i = 0; i < N; i++) {
        items[i].value = i;
        kvf_status_t st;
        KVF_HASH_ADD_KEYPTR(table, words[i], strlen(words[i]), &items[i], st);
        assert_int_equal(st, KVF_OK);
    }
    for (int i = 0; i < N; i++) {
        const item_t *found;
        HASH_FIND(hh, table, words[i], strlen(words[i]), found);
        assert_non_null(found);
        assert_int_equal(found->value, i);
    }
    const item_t *found;
    HASH_FIND(hh, table, "abcd", 4, found);
    assert_null(found);
    HASH_FIND(hh, table, "abcd", 3, found); /* "abc" */
    assert_non_null(found);
    assert_int_equal(found->value, 2);
    HASH_CLEAR(hh, table);
}

/* The string set against a scan of what was added. */
static void test_strset(void **state)
{
    (void)state;
    enum { N = 3000 };
    char(*names)[16] = calloc(N, sizeof(*names));
    assert_non_null(names);
    kvf_strset_t set;
    assert_int_equal(kvf_strset_init(&set, N), KVF_OK);
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "w%d", i % (N / 2)); /* each name twice */
        bool added;
        assert_int_equal(kvf_strset_add(&set, names[i], &added), KVF_OK);
        assert_int_equal(added, i < N / 2);
    }
    assert_int_equal(set.n, N / 2);
    char probe[16];
    for (int i = 0; i < N; i++) {
        snprintf(probe, sizeof(probe), "w%d", i);
        assert_int_equal(kvf_strset_has(&set, probe), i < N / 2);
    }
    assert_false(kvf_strset_has(&set, ""));
    kvf_strset_fini(&set);
    assert_null(set.head);
    free(names);
}

/* A full set refuses a new string but still answers for the old ones and
 * takes a repeat. */
static void test_strset_full(void **state)
{
    (void)state;
    kvf_strset_t set;
    assert_int_equal(kvf_strset_init(&set, 2), KVF_OK);
    assert_int_equal(kvf_strset_add(&set, "x", NULL), KVF_OK);
    assert_int_equal(kvf_strset_add(&set, "y", NULL), KVF_OK);
    assert_int_equal(kvf_strset_add(&set, "z", NULL), KVF_ERR_TOO_BIG);
    bool added = true;
    assert_int_equal(kvf_strset_add(&set, "x", &added), KVF_OK);
    assert_false(added);
    assert_true(kvf_strset_has(&set, "y"));
    assert_false(kvf_strset_has(&set, "z"));
    kvf_strset_fini(&set);

    /* an empty set (capacity 0) answers and refuses */
    assert_int_equal(kvf_strset_init(&set, 0), KVF_OK);
    assert_false(kvf_strset_has(&set, "x"));
    assert_int_equal(kvf_strset_add(&set, "x", NULL), KVF_ERR_TOO_BIG);
    kvf_strset_fini(&set);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_u64_keys),
        cmocka_unit_test(test_keyptr),
        cmocka_unit_test(test_strset),
        cmocka_unit_test(test_strset_full),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
