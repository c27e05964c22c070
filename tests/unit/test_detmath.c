/* kvf/detmath.h against the C library: a few units in the last place of
 * a double over the ranges the engine uses, and the float roundings of
 * real models' rotary tables all but equal to those of the C library's
 * values. The bits themselves are pinned by test_engine's recorded
 * logits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kvf/detmath.h"

#include <math.h>
#include <stdio.h>

static void assert_rel(double got, double want, double tol, const char *what, double x)
{
    double err = fabs(got - want) / (fabs(want) > 1e-300 ? fabs(want) : 1e-300);
    if (err > tol)
        fail_msg("%s(%.17g) = %.17g, libm %.17g (rel err %.3g)", what, x, got, want, err);
}

static void test_exp_log_pow(void **state)
{
    (void)state;
    for (double x = -700; x < 700; x += 0.731)
        assert_rel(kvf_det_exp(x), exp(x), 4e-16, "exp", x);
    for (double x = -1; x < 1; x += 1e-3)
        assert_rel(kvf_det_exp(x), exp(x), 4e-16, "exp", x);
    assert_true(kvf_det_exp(-800) == 0.0);
    assert_true(isinf(kvf_det_exp(800)));
    for (double x = 1e-300; x < 1e300; x *= 1.37)
        assert_rel(kvf_det_log(x), log(x), 4e-16, "log", x);
    for (double x = 0.5; x < 2; x += 1e-3)
        if (fabs(x - 1) > 1e-9)
            assert_rel(kvf_det_log(x), log(x), 1e-15, "log", x);
    assert_true(kvf_det_log(1.0) == 0.0);
    assert_true(isnan(kvf_det_log(-1.0)));
    const double thetas[] = {10000.0, 500000.0, 1000000.0, 1e7};
    for (int t = 0; t < 4; t++)
        for (int i = 0; i < 128; i++) {
            double y = -2.0 * i / 256;
            assert_rel(kvf_det_pow(thetas[t], y), pow(thetas[t], y), 4e-15, "pow", y);
        }
}

static void test_sincos(void **state)
{
    (void)state;
    double s, c;
    for (double x = -10; x < 10; x += 1e-3) {
        kvf_det_sincos(x, &s, &c);
        if (fabs(s - sin(x)) > 2e-16 || fabs(c - cos(x)) > 2e-16)
            fail_msg("sincos(%.17g) = %.17g, %.17g; libm %.17g, %.17g", x, s, c, sin(x), cos(x));
    }
    for (double x = 10; x < 1e6; x *= 1.0001) {
        kvf_det_sincos(x, &s, &c);
        /* libm reduces exactly; ours to ~2^-100 of pi/2: absolute error
         * a few 1e-16 either way */
        if (fabs(s - sin(x)) > 4e-16 || fabs(c - cos(x)) > 4e-16)
            fail_msg("sincos(%.17g) = %.17g, %.17g; libm %.17g, %.17g", x, s, c, sin(x), cos(x));
    }
}

/* Rotary tables of Llama-2 (theta 1e4, head_dim 128) and Llama-3 / Qwen2
 * (5e5, 1e6) geometries over 32k positions: every float equal to the
 * rounding of the C library's double. */
static void test_rotary_tables(void **state)
{
    (void)state;
    const double thetas[] = {10000.0, 500000.0, 1000000.0};
    long differ = 0, total = 0;
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < 64; i++) {
            double f = kvf_det_pow(thetas[t], -2.0 * i / 128);
            double fl = pow(thetas[t], -2.0 * i / 128);
            for (int p = 0; p < 32768; p += 7) {
                double s, c;
                kvf_det_sincos(p * f, &s, &c);
                differ += (float)s != (float)sin(p * fl);
                differ += (float)c != (float)cos(p * fl);
                total += 2;
            }
        }
    printf("rotary tables: %ld of %ld floats differ from the C library's roundings\n", differ,
           total);
    /* a double a few ulp off changes a float rounding about once in 2^28 */
    assert_true(differ * 100000 <= total);
}

/* Units in the last place of a double between got and the long double
 * value want. */
static double ulps(double got, long double want)
{
    double w = (double)want;
    double ulp = nextafter(fabs(w), INFINITY) - fabs(w);
    return (double)fabsl((long double)got - want) / ulp;
}

/* tanh against long double tanhl: within 3 ulp of a double everywhere
 * (both sides of the 0.5 switch, the saturation at 22), odd, and its float
 * rounding off the correctly rounded float by at most one float ulp. */
static void test_tanh(void **state)
{
    (void)state;
    double worst = 0;
    long float_off = 0, total = 0;
    for (double x = -30; x < 30; x += 0.000731) {
        double got = kvf_det_tanh(x);
        long double want = tanhl((long double)x);
        double u = ulps(got, want);
        if (u > worst)
            worst = u;
        if (u > 3)
            fail_msg("tanh(%.17g) = %.17g, tanhl %.20Lg (%.2f ulp)", x, got, want, u);
        assert_true(kvf_det_tanh(-x) == -got);
        float f = kvf_det_tanhf((float)x), fw = (float)tanhl((long double)(float)x);
        if (f != fw) {
            float_off++;
            assert_true(nextafterf(f, fw) == fw);
        }
        total++;
    }
    for (double x = 1e-300; x < 0.5; x *= 1.21)
        if (ulps(kvf_det_tanh(x), tanhl((long double)x)) > 1)
            fail_msg("tanh(%.17g) = %.17g, tanhl %.20Lg", x, kvf_det_tanh(x),
                     tanhl((long double)x));
    assert_true(kvf_det_tanh(0.0) == 0.0);
    assert_true(kvf_det_tanh(40.0) == 1.0 && kvf_det_tanh(-40.0) == -1.0);
    printf("tanh: worst %.2f ulp of a double; %ld of %ld float roundings off by one ulp\n", worst,
           float_off, total);
    assert_true(float_off * 10000 <= total);
}

/* Soft-capping and gelu_tanh against long double formulas. */
static void test_softcap_gelu(void **state)
{
    (void)state;
    for (float x = -60; x < 60; x += 0.0137f) {
        float cap = 5.0f, got = kvf_det_softcap(x, cap);
        long double want = (long double)cap * tanhl((long double)(x / cap));
        assert_true(fabsl((long double)got - want) <= 1e-6L * fabsl(want) + 1e-30L);
        assert_true(fabs(got) <= cap);
        const long double k = 0.797884560802865355879892119868763737L;
        long double xl = x;
        long double u = k * (xl + 0.044715L * xl * xl * xl);
        /* 0.5 x (1 + tanh u), and for x < 0 the same without its cancellation */
        long double g = x >= 0 ? 0.5L * xl * (1.0L + tanhl(u)) : xl / (1.0L + expl(-2.0L * u));
        float gg = kvf_det_gelu_tanh(x);
        if (fabsl((long double)gg - g) > 1.2e-7L * fabsl(g) + 1e-38L)
            fail_msg("gelu_tanh(%.9g) = %.9g, long double %.12Lg", x, gg, g);
    }
    assert_true(kvf_det_gelu_tanh(0.0f) == 0.0f);
    assert_true(kvf_det_gelu_tanh(-20.0f) == -0.0f && kvf_det_gelu_tanh(20.0f) == 20.0f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exp_log_pow),
        cmocka_unit_test(test_sincos),
        cmocka_unit_test(test_rotary_tables),
        cmocka_unit_test(test_tanh),
        cmocka_unit_test(test_softcap_gelu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
