/* Deterministic double math (kvf/detmath.h). The build turns FP
 * contraction off, so every expression below rounds as written. */
#include "kvf/detmath.h"

#include <math.h>

/* ln 2 in two parts: the high part has 32 significant bits, so k * LN2_HI
 * is exact for |k| < 2^21. */
static const double LN2_HI = 6.93147180369123816490e-01;
static const double LN2_LO = 1.90821492927058770002e-10;
static const double INV_LN2 = 1.44269504088896338700e+00;

double kvf_det_exp(double x)
{
    if (x < -745.2)
        return 0.0;
    if (x > 709.78)
        return HUGE_VAL;
    double k = rint(x * INV_LN2);
    double r = (x - k * LN2_HI) - k * LN2_LO; /* |r| <= 0.35 */
    /* Taylor to r^14 / 14!: the next term is below 2^-60 of the result. */
    static const double inv_fact[15] = {1.0, 1.0, 0.5, 0.16666666666666666, 0.041666666666666664, 0.008333333333333333, 0.001388888888888889, 0.0001984126984126984, 2.48015873015873e-05, 2.7557319223985893e-06, 2.755731922398589e-07, 2.505210838544172e-08, 2.08767569878681e-09, 1.6059043836821613e-10, 1.1470745597729725e-11};
    double p = inv_fact[14];
    for (int i = 13; i >= 0; i--)
        p = p * r + inv_fact[i];
    return ldexp(p, (int)k);
}

double kvf_det_log(double x)
{
    if (!(x > 0))
        return NAN;
    int e;
    double m = frexp(x, &e); /* x = m 2^e, m in [0.5, 1) */
    if (m < 0.70710678118654752440) {
        m *= 2;
        e -= 1;
    }
    /* ln m = 2 atanh(f), f = (m - 1) / (m + 1), |f| <= 0.172 */
    double f = (m - 1.0) / (m + 1.0), f2 = f * f;
    double s = 1.0 / 25;
    for (int k = 23; k >= 1; k -= 2)
        s = s * f2 + 1.0 / k;
    double lnm = 2.0 * f * s;
    return (double)e * LN2_HI + ((double)e * LN2_LO + lnm);
}

double kvf_det_pow(double x, double y)
{
    return kvf_det_exp(y * kvf_det_log(x));
}

/* pi/2 in three parts of 33 bits each: k * part is exact for k < 2^20,
 * and the reduced argument is good to about 2^-100 of pi/2. */
static const double PIO2_1 = 1.57079632673412561417e+00;
static const double PIO2_2 = 6.07710050630396597660e-11;
static const double PIO2_3 = 2.02226624871116645580e-21;
static const double TWO_OVER_PI = 6.36619772367581382433e-01;

/* sin r and cos r for |r| <= pi/4 + a little, by Taylor series to r^21 /
 * 21! and r^22 / 22!. */
static void sincos_reduced(double r, double *s_p, double *c_p)
{
    static const double cs[12] = {1.0, -0.16666666666666666, 0.008333333333333333, -0.0001984126984126984, 2.7557319223985893e-06, -2.505210838544172e-08, 1.6059043836821613e-10, -7.647163731819816e-13, 2.8114572543455206e-15, -8.22063524662433e-18, 1.9572941063391263e-20, -3.868170170630684e-23};
    static const double cc[12] = {1.0, -0.5, 0.041666666666666664, -0.001388888888888889, 2.48015873015873e-05, -2.755731922398589e-07, 2.08767569878681e-09, -1.1470745597729725e-11, 4.779477332387385e-14, -1.5619206968586225e-16, 4.110317623312165e-19, -8.896791392450574e-22};
    double r2 = r * r, s = 0, c = 0;
    for (int k = 11; k >= 0; k--) {
        s = s * r2 + cs[k];
        c = c * r2 + cc[k];
    }
    *s_p = s * r;
    *c_p = c;
}

void kvf_det_sincos(double x, double *sin_p, double *cos_p)
{
    double k = rint(x * TWO_OVER_PI);
    double r = ((x - k * PIO2_1) - k * PIO2_2) - k * PIO2_3;
    double s, c;
    sincos_reduced(r, &s, &c);
    long q = (long)k & 3;
    switch (q) {
    case 0: *sin_p = s; *cos_p = c; break;
    case 1: *sin_p = c; *cos_p = -s; break;
    case 2: *sin_p = -s; *cos_p = -c; break;
    default: *sin_p = -c; *cos_p = s; break;
    }
}

/* tanh x = x * sum c_n x^(2n) for |x| < 0.5: the odd Taylor series,
 * c_n = 2^(2n+2) (2^(2n+2) - 1) B_(2n+2) / (2n+2)!, to x^41; the first
 * term left out is below 2^-60 of the result there. */
static double tanh_small(double x)
{
    static const double c[21] = {1.0, -0.3333333333333333, 0.13333333333333333, -0.05396825396825397, 0.021869488536155203, -0.008863235529902197, 0.003592128036572481, -0.0014558343870513183, 0.000590027440945586, -0.00023912911424355248, 9.691537956929451e-05, -3.927832388331683e-05, 1.5918905069328964e-05, -6.451689215655431e-06, 2.6147711512907546e-06, -1.0597268320104654e-06, 4.294911078273806e-07, -1.7406618963571648e-07, 7.054636946400968e-08, -2.859136662305254e-08, 1.1587644432798853e-08};
    double x2 = x * x, p = c[20];
    for (int i = 19; i >= 0; i--)
        p = p * x2 + c[i];
    return x * p;
}

double kvf_det_tanh(double x)
{
    double ax = fabs(x);
    if (ax < 0.5)
        return tanh_small(x);
    if (ax > 22.0)
        return x > 0 ? 1.0 : -1.0; /* 1 - tanh(22) < 2^-62 */
    /* 1 - 2 / (e^2|x| + 1): the subtraction loses at most a bit or two,
     * tanh being above 0.46 here. */
    double t = 1.0 - 2.0 / (kvf_det_exp(2.0 * ax) + 1.0);
    return x < 0 ? -t : t;
}

float kvf_det_tanhf(float x)
{
    return (float)kvf_det_tanh((double)x);
}

float kvf_det_softcap(float x, float cap)
{
    return kvf_det_tanhf(x / cap) * cap;
}

float kvf_det_gelu_tanh(float x)
{
    const double k = 0.79788456080286535588; /* sqrt(2 / pi) */
    double d = (double)x;
    double u = k * (d + 0.044715 * d * d * d);
    /* 0.5 (1 + tanh u) = 1 / (1 + e^-2u), without the cancellation of
     * 1 + tanh u for negative x */
    return (float)(d / (1.0 + kvf_det_exp(-2.0 * u)));
}
