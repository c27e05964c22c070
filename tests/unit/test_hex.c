/* kvf/hex.h: every byte value round trips; odd lengths and non-digits are
 * rejected; upper-case digits decode. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kvf/hex.h"

#include <stdlib.h>
#include <string.h>

static void test_round_trip(void **state)
{
    (void)state;
    uint8_t bytes[256];
    for (int i = 0; i < 256; i++)
        bytes[i] = (uint8_t)(255 - i);
    char text[2 * 256 + 1];
    kvf_hex_encode(bytes, sizeof(bytes), text);
    assert_int_equal(strlen(text), 512);
    assert_memory_equal(text, "fffefdfc", 8);
    assert_string_equal(text + 504, "03020100");
    uint8_t *back = NULL;
    size_t len = 0;
    assert_int_equal(kvf_hex_decode(text, strlen(text), &back, &len), KVF_OK);
    assert_int_equal(len, sizeof(bytes));
    assert_memory_equal(back, bytes, sizeof(bytes));
    free(back);
}

static void test_decode_rejects(void **state)
{
    (void)state;
    uint8_t *bytes = NULL;
    size_t len = 7;
    assert_int_equal(kvf_hex_decode("abc", 3, &bytes, &len), KVF_ERR_INVAL);
    assert_int_equal(kvf_hex_decode("0g", 2, &bytes, &len), KVF_ERR_INVAL);
    assert_int_equal(kvf_hex_decode("a 12", 4, &bytes, &len), KVF_ERR_INVAL);
    assert_null(bytes);
    assert_int_equal(len, 7);
    /* upper case, and only the digits counted (a newline after them) */
    assert_int_equal(kvf_hex_decode("0A1b\n", 4, &bytes, &len), KVF_OK);
    assert_int_equal(len, 2);
    assert_int_equal(bytes[0], 0x0a);
    assert_int_equal(bytes[1], 0x1b);
    free(bytes);
    assert_int_equal(kvf_hex_decode("", 0, &bytes, &len), KVF_OK);
    assert_int_equal(len, 0);
    free(bytes);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_decode_rejects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
