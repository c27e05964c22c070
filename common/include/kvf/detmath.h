/* Double-precision exp, log, pow, sincos and tanh written with IEEE +, -, *, /
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

/* tanh x, within a few units in the last place of a double; +-1 past
 * |x| = 22. For the soft-capping and the tanh-approximated gelu of Gemma2
 * (kvf_det_tanhf, kvf_det_gelu_tanh). */
double kvf_det_tanh(double x);

/* tanh of a float, as the float rounding of kvf_det_tanh: the same bits
 * wherever it runs (every CPU backend instruction set calls this one). */
float kvf_det_tanhf(float x);

/* Soft-capping: cap * tanh(x / cap) in float operations (x / cap and the
 * product rounded to float, as a float32 model computes it); cap > 0. */
float kvf_det_softcap(float x, float cap);

/* gelu with the tanh approximation (gelu_pytorch_tanh), computed in double
 * and rounded once: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))),
 * evaluated as x / (1 + e^(-2 sqrt(2/pi) (x + 0.044715 x^3))). */
float kvf_det_gelu_tanh(float x);

#endif
