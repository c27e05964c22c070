/* Double-precision exp, log, pow and sincos written with IEEE +, -, *, /
 * and exact scalings only, so they give the same bits on every CPU and C
 * library (the C library picks FMA or SSE2 versions of its own by CPU).
 * For the numbers the engine derives from a config (rotary frequencies
 * and angles): accurate to a few units in the last place of a double,
 * which leaves their float roundings those of the exact values except at
 * a rounding tie. Not for NaN or infinite inputs. See docs/numerics.md. */
#ifndef KVF_DETMATH_H
#define KVF_DETMATH_H

/* e^x; 0 below -745, +inf above 709.78. */
double kvf_det_exp(double x);

/* ln x for x > 0 (NaN otherwise). */
double kvf_det_log(double x);

/* x^y for x > 0: exp(y ln x). */
double kvf_det_pow(double x, double y);

/* sin x and cos x; fully accurate for |x| < 2^20 * pi/2 (rotary angles:
 * position x frequency), deterministic for any finite x. */
void kvf_det_sincos(double x, double *sin_p, double *cos_p);

#endif
