/* The KV cache's element formats (kvf/kv_format.h): every code of f16 and
 * fp8 round-trips, rounding is to nearest even at every midpoint,
 * saturation keeps finite input finite, NaN only from NaN; bf16 and f16
 * agree with the weight converters of kvf/dtype.h inside their range;
 * int8 rows hit +-127 at their largest value. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kvf/dtype.h"
#include "kvf/kv_format.h"

#include <math.h>
#include <string.h>

static uint32_t bits(float x)
{
    uint32_t b;
    memcpy(&b, &x, 4);
    return b;
}

static float from_bits(uint32_t b)
{
    float x;
    memcpy(&x, &b, 4);
    return x;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t next_u32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static void test_names(void **state)
{
    (void)state;
    for (int i = 0; i < KVF_KV_N_DTYPES; i++) {
        kvf_kv_dtype_t dt;
        assert_int_equal(kvf_kv_dtype_parse(kvf_kv_dtype_name((kvf_kv_dtype_t)i), &dt), KVF_OK);
        assert_int_equal(dt, i);
    }
    kvf_kv_dtype_t dt;
    assert_int_equal(kvf_kv_dtype_parse("BF16", &dt), KVF_OK);
    assert_int_equal(dt, KVF_KV_BF16);
    assert_int_equal(kvf_kv_dtype_parse("e4m3", &dt), KVF_OK);
    assert_int_equal(dt, KVF_KV_FP8);
    assert_int_equal(kvf_kv_dtype_parse("fp4", &dt), KVF_ERR_INVAL);
    assert_string_equal(kvf_kv_dtype_name((kvf_kv_dtype_t)9), "?");
}

/* Every f16 code decodes to the value kvf_f16_to_f32 gives and encodes
 * back to itself; inside the range, encoding equals kvf_f32_to_f16; past
 * it, +-65504. */
static void test_f16(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kvf_kv_f16_decode((uint16_t)h);
        float ref = kvf_f16_to_f32((uint16_t)h);
        if (isnan(ref)) {
            assert_true(isnan(f));
            continue;
        }
        assert_int_equal(bits(f), bits(ref));
        if (isinf(f))
            continue;
        assert_int_equal(kvf_kv_f16_encode(f), h);
    }
    for (int i = 0; i < 1000000; i++) {
        float x = from_bits(next_u32() & 0xc7ffffffu); /* |x| < 2^16 or so, any sign */
        if (isnan(x))
            continue;
        uint16_t want =
            fabsf(x) >= 65504.0f ? (uint16_t)(x < 0 ? 0xfbffu : 0x7bffu) : kvf_f32_to_f16(x);
        if (kvf_kv_f16_encode(x) != want)
            fail_msg("f16 of %a: 0x%04x, want 0x%04x", (double)x, kvf_kv_f16_encode(x), want);
    }
    assert_int_equal(kvf_kv_f16_encode(INFINITY), 0x7bff);
    assert_int_equal(kvf_kv_f16_encode(-1e30f), 0xfbff);
    assert_true(isnan(kvf_kv_f16_decode(kvf_kv_f16_encode(NAN))));
}

static void test_bf16(void **state)
{
    (void)state;
    for (int i = 0; i < 1000000; i++) {
        float x = from_bits(next_u32());
        uint16_t got = kvf_kv_bf16_encode(x);
        if (isnan(x)) {
            assert_true(isnan(kvf_kv_bf16_decode(got)));
            continue;
        }
        uint16_t ref = kvf_f32_to_bf16(x);
        if (isinf(kvf_bf16_to_f32(ref)) && !isinf(x))
            assert_int_equal(got, (uint16_t)((bits(x) >> 16 & 0x8000u) | 0x7f7fu));
        else
            assert_int_equal(got, ref);
    }
    assert_int_equal(bits(kvf_kv_bf16_decode(kvf_kv_bf16_encode(3.4028235e38f))), 0x7f7f0000u);
}

/* Every fp8 code round-trips; each midpoint between neighbours rounds to
 * the even one; values past 448 saturate; NaN only from NaN. */
static void test_fp8(void **state)
{
    (void)state;
    for (uint32_t v = 0; v < 256; v++) {
        float f = kvf_kv_fp8_decode((uint8_t)v);
        if ((v & 0x7f) == 0x7f) {
            assert_true(isnan(f));
            continue;
        }
        assert_false(isnan(f));
        assert_int_equal(kvf_kv_fp8_encode(f), v == 0x80 ? 0x80 : v);
        if ((v & 0x7f) < 0x7e) {
            float up = kvf_kv_fp8_decode((uint8_t)(v + 1));
            float mid = (f + up) / 2; /* exact: both have few mantissa bits */
            uint8_t want = (v & 1) ? (uint8_t)(v + 1) : (uint8_t)v;
            assert_int_equal(kvf_kv_fp8_encode(mid), want);
            assert_int_equal(kvf_kv_fp8_encode(nextafterf(mid, 0.0f)), v == 0x80 ? 0x80 : v);
            assert_int_equal(kvf_kv_fp8_encode(nextafterf(mid, (v & 0x80) ? -INFINITY : INFINITY)),
                             (uint8_t)(v + 1));
        }
    }
    assert_int_equal(kvf_kv_fp8_decode(0x7e), 448.0f);
    assert_int_equal(kvf_kv_fp8_encode(1e9f), 0x7e);
    assert_int_equal(kvf_kv_fp8_encode(-INFINITY), 0xfe);
    assert_int_equal(kvf_kv_fp8_encode(463.9f), 0x7e);
    for (int i = 0; i < 100000; i++) {
        float x = from_bits(next_u32());
        if (!isnan(x))
            assert_false(isnan(kvf_kv_fp8_decode(kvf_kv_fp8_encode(x))));
    }
}

/* A row's largest value encodes to +-127 (int8) or 448 (fp8) and decodes
 * back to within its rounding; zeros stay zero; every element is within
 * half a step. */
static void test_rows(void **state)
{
    (void)state;
    const int n = 64;
    float x[64], y[64];
    int8_t q[64];
    uint8_t f8[64];
    for (int t = 0; t < 200; t++) {
        float amp = ldexpf(1.0f, (int)(next_u32() % 40) - 20);
        for (int i = 0; i < n; i++)
            x[i] = amp * ((float)(next_u32() % 20001) / 10000.0f - 1.0f);
        float s;
        kvf_kv_encode_row(KVF_KV_INT8, x, n, q, &s);
        kvf_kv_decode_row(KVF_KV_INT8, q, s, n, y);
        float amax = 0;
        for (int i = 0; i < n; i++)
            amax = fmaxf(amax, fabsf(x[i]));
        int hit = 0;
        for (int i = 0; i < n; i++) {
            assert_true(fabsf(x[i] - y[i]) <= 0.5f * s * 1.0001f);
            hit |= q[i] == 127 || q[i] == -127;
        }
        assert_true(hit || amax == 0);
        kvf_kv_encode_row(KVF_KV_FP8, x, n, f8, &s);
        kvf_kv_decode_row(KVF_KV_FP8, f8, s, n, y);
        for (int i = 0; i < n; i++)
            assert_true(fabsf(x[i] - y[i]) <= fabsf(x[i]) / 16 + s * 0.001953125f);
    }
    memset(x, 0, sizeof(x));
    float s;
    kvf_kv_encode_row(KVF_KV_INT8, x, n, q, &s);
    assert_true(s == 1.0f);
    for (int i = 0; i < n; i++)
        assert_int_equal(q[i], 0);
    assert_int_equal(kvf_kv_int8_encode(2.5f, 1.0f), 2); /* ties to even */
    assert_int_equal(kvf_kv_int8_encode(-3.5f, 1.0f), -4);
    assert_int_equal(kvf_kv_int8_encode(1000.0f, 1.0f), 127);
    assert_int_equal(kvf_kv_int8_encode(NAN, 1.0f), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names), cmocka_unit_test(test_f16),  cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_fp8),   cmocka_unit_test(test_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
