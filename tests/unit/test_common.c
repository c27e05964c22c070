/* common/: status strings, flag parsing, sizes, id lists, CRC32C. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvf/clock.h"
#include "kvf/crc32c.h"
#include "kvf/flags.h"
#include "kvf/log.h"
#include "kvf/status.h"

static void test_status_strings(void **state)
{
    (void)state;
    for (int s = 0; s >= KVF_ERR_CORRUPT; s--) {
        const char *text = kvf_status_str((kvf_status_t)s);
        assert_non_null(text);
        assert_string_not_equal(text, "unknown status");
    }
    assert_string_equal(kvf_status_str((kvf_status_t)-999), "unknown status");
}

static void test_sizes(void **state)
{
    (void)state;
    uint64_t b;
    assert_int_equal(kvf_parse_size("4096", &b), KVF_OK);
    assert_int_equal(b, 4096);
    assert_int_equal(kvf_parse_size("512M", &b), KVF_OK);
    assert_int_equal(b, 512ull << 20);
    assert_int_equal(kvf_parse_size("2GiB", &b), KVF_OK);
    assert_int_equal(b, 2ull << 30);
    assert_int_equal(kvf_parse_size("1.5k", &b), KVF_OK);
    assert_int_equal(b, 1536);
    assert_int_equal(kvf_parse_size("", &b), KVF_ERR_INVAL);
    assert_int_equal(kvf_parse_size("-1G", &b), KVF_ERR_INVAL);
    assert_int_equal(kvf_parse_size("12X", &b), KVF_ERR_INVAL);
}

static void test_id_lists(void **state)
{
    (void)state;
    uint32_t *ids;
    size_t n;
    assert_int_equal(kvf_parse_id_list("510, 1,2 ,4294967295", &ids, &n), KVF_OK);
    assert_int_equal(n, 4);
    assert_int_equal(ids[0], 510);
    assert_int_equal(ids[3], 4294967295u);
    free(ids);
    const char *bad[] = {"", "1,", ",1", "1,,2", "a", "4294967296", "-1", "1 2"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(kvf_parse_id_list(bad[i], &ids, &n), KVF_ERR_INVAL);
}

static void test_flags(void **state)
{
    (void)state;
    const char *url = "tcp://127.0.0.1:1", *model = NULL;
    int threads = 2;
    uint64_t mem = 0;
    double temp = 0;
    bool verbose = false, seen_mem = false;
    kvf_flag_t flags[] = {
        {"listen", KVF_FLAG_STRING, &url, "URL", "inbox", NULL},
        {"model", KVF_FLAG_STRING, &model, "DIR", "model", NULL},
        {"threads", KVF_FLAG_INT, &threads, "N", "threads", NULL},
        {"kv-mem", KVF_FLAG_SIZE, &mem, "BYTES", "pool", &seen_mem},
        {"temperature", KVF_FLAG_DOUBLE, &temp, "T", "t", NULL},
        {"verbose", KVF_FLAG_BOOL, &verbose, NULL, "v", NULL},
    };
    const char *pos[2];
    kvf_flagset_t set = {.prog = "t",
                         .flags = flags,
                         .n_flags = KVF_NFLAGS(flags),
                         .env = true,
                         .positional = pos,
                         .max_positional = 2};
    setenv("KVF_THREADS", "7", 1);
    setenv("KVF_MODEL", "/env/model", 1);
    char *argv[] = {"t",   "--listen=ipc:///x", "out",     "--kv-mem",   "1G", "--temperature",
                    "0.5", "--verbose",         "--model", "/cli/model", NULL};
    assert_int_equal(kvf_flags_parse(&set, 10, argv), KVF_FLAGS_RUN);
    assert_string_equal(url, "ipc:///x");
    assert_string_equal(model, "/cli/model"); /* the command line wins */
    assert_int_equal(threads, 7);             /* from the environment */
    assert_int_equal(mem, 1ull << 30);
    assert_true(seen_mem);
    assert_true(temp == 0.5);
    assert_true(verbose);
    assert_int_equal(set.n_positional, 1);
    assert_string_equal(pos[0], "out");
    unsetenv("KVF_THREADS");
    unsetenv("KVF_MODEL");

    char *neg[] = {"t", "--no-verbose", NULL};
    assert_int_equal(kvf_flags_parse(&set, 2, neg), KVF_FLAGS_RUN);
    assert_false(verbose);

    char *unknown[] = {"t", "--bogus", NULL};
    char *missing[] = {"t", "--threads", NULL};
    char *badint[] = {"t", "--threads", "12abc", NULL};
    char *shortopt[] = {"t", "-t", NULL};
    char *toomany[] = {"t", "a", "b", "c", NULL};
    assert_true(kvf_flags_parse(&set, 2, unknown) < 0);
    assert_true(kvf_flags_parse(&set, 2, missing) < 0);
    assert_true(kvf_flags_parse(&set, 3, badint) < 0);
    assert_true(kvf_flags_parse(&set, 2, shortopt) < 0);
    assert_true(kvf_flags_parse(&set, 4, toomany) < 0);
    setenv("KVF_THREADS", "many", 1);
    char *none[] = {"t", NULL};
    assert_true(kvf_flags_parse(&set, 1, none) < 0);
    unsetenv("KVF_THREADS");
}

static void test_crc32c(void **state)
{
    (void)state;
    /* The standard check value of CRC-32C. */
    assert_int_equal(kvf_crc32c(0, "123456789", 9), 0xe3069283u);
    assert_int_equal(kvf_crc32c(0, "", 0), 0);
    /* Incremental equals one pass, at every split and alignment. */
    uint8_t buf[257];
    for (int i = 0; i < 257; i++)
        buf[i] = (uint8_t)(i * 37 + 11);
    uint32_t whole = kvf_crc32c(0, buf + 1, 256);
    for (int split = 0; split <= 256; split += 13)
        assert_int_equal(kvf_crc32c(kvf_crc32c(0, buf + 1, (size_t)split), buf + 1 + split,
                                    (size_t)(256 - split)),
                         whole);
}

/* Every path gives the same values: the standard vectors (iSCSI, RFC 3720
 * B.4) on the path this CPU takes and on the table, then both paths over
 * every length and alignment up to a few words. */
static void test_crc32c_paths(void **state)
{
    (void)state;
    uint8_t zeros[32], ones[32], up[32], down[32];
    for (int i = 0; i < 32; i++) {
        zeros[i] = 0;
        ones[i] = 0xff;
        up[i] = (uint8_t)i;
        down[i] = (uint8_t)(31 - i);
    }
    const struct {
        const void *data;
        uint32_t want;
    } vec[] = {{zeros, 0x8a9136aau}, {ones, 0x62a8ab43u}, {up, 0x46dd794eu}, {down, 0x113fdb5cu}};
    for (size_t v = 0; v < sizeof(vec) / sizeof(vec[0]); v++) {
        assert_int_equal(kvf_crc32c(0, vec[v].data, 32), vec[v].want);
        assert_int_equal(kvf_crc32c_table(0, vec[v].data, 32), vec[v].want);
    }
    assert_int_equal(kvf_crc32c_table(0, "123456789", 9), 0xe3069283u);
    uint8_t buf[300];
    for (int i = 0; i < 300; i++)
        buf[i] = (uint8_t)(i * 101 + 7);
    for (size_t off = 0; off < 8; off++)
        for (size_t len = 0; len + off <= sizeof(buf); len += 3)
            assert_int_equal(kvf_crc32c(0x1234u, buf + off, len),
                             kvf_crc32c_table(0x1234u, buf + off, len));
    const char *impl = kvf_crc32c_impl();
    assert_true(!strcmp(impl, "sse4.2") || !strcmp(impl, "armv8-crc") || !strcmp(impl, "table"));
}

static void test_log_levels(void **state)
{
    (void)state;
    kvf_log_level_t l;
    assert_true(kvf_log_parse_level("debug", &l) && l == KVF_LOG_DEBUG);
    assert_true(kvf_log_parse_level("WARN", &l) && l == KVF_LOG_WARN);
    assert_false(kvf_log_parse_level("loud", &l));
    /* A discarded line never evaluates its arguments' formatting. */
    kvf_log_set_level(KVF_LOG_ERROR);
    int calls = 0;
    kvf_log_debug("%d", ++calls);
    assert_int_equal(calls, 0);
    kvf_log_set_level(KVF_LOG_INFO);
}

static void test_clock(void **state)
{
    (void)state;
    uint64_t a = kvf_clock_ns();
    kvf_clock_sleep_ms(5);
    uint64_t b = kvf_clock_ns();
    assert_true(b - a >= 5000000u);
    assert_int_equal(kvf_clock_ms_until(a), 0);
    assert_true(kvf_clock_ms_until(b + 2000000000u) > 1000);
    assert_true(kvf_clock_unix_s() > 1700000000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_strings), cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_id_lists),       cmocka_unit_test(test_flags),
        cmocka_unit_test(test_crc32c),         cmocka_unit_test(test_crc32c_paths),
        cmocka_unit_test(test_log_levels),     cmocka_unit_test(test_clock),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
