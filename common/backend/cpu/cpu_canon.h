/* The scalar forms of the CPU backend's canonical operations
 * (cpu_kernels.h): what every instruction set must reproduce bit for bit.
 * Static inline, so each kernel file compiles them for its own target; the
 * build turns off FP contraction (-ffp-contract=off), so a * b + c stays
 * two roundings unless written as fmaf. */
#ifndef KVF_CPU_CANON_H
#define KVF_CPU_CANON_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* exp(x) as 2^n * p(r): x clamped to [-87, 88], n = rint(x * log2 e),
 * r = x - n ln2 (ln2 in two parts, with FMA), p the degree-7 Taylor
 * polynomial in Horner form with FMA, 2^n built from its exponent bits.
 * Relative error below 2e-7; exp(-87) ~ 1.6e-38 stands in for 0. */
#define KVF_EXP_LO (-87.0f)
#define KVF_EXP_HI 88.0f
#define KVF_EXP_LOG2E 1.44269504088896341f
#define KVF_EXP_LN2_HI 0.693145751953125f
#define KVF_EXP_LN2_LO 1.428606765330187e-06f
#define KVF_EXP_C7 (1.0f / 5040)
#define KVF_EXP_C6 (1.0f / 720)
#define KVF_EXP_C5 (1.0f / 120)
#define KVF_EXP_C4 (1.0f / 24)
#define KVF_EXP_C3 (1.0f / 6)
#define KVF_EXP_C2 0.5f

static inline float kvf_cpu_exp(float x)
{
    x = x < KVF_EXP_LO ? KVF_EXP_LO : x;
    x = x > KVF_EXP_HI ? KVF_EXP_HI : x;
    float n = rintf(x * KVF_EXP_LOG2E);
    float r = fmaf(-n, KVF_EXP_LN2_HI, x);
    r = fmaf(-n, KVF_EXP_LN2_LO, r);
    float p = KVF_EXP_C7;
    p = fmaf(p, r, KVF_EXP_C6);
    p = fmaf(p, r, KVF_EXP_C5);
    p = fmaf(p, r, KVF_EXP_C4);
    p = fmaf(p, r, KVF_EXP_C3);
    p = fmaf(p, r, KVF_EXP_C2);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof(scale));
    return p * scale;
}

/* silu(g) * u = g / (1 + exp(-g)) * u. */
static inline float kvf_cpu_swiglu1(float g, float u)
{
    float e = kvf_cpu_exp(-g);
    return g / (1.0f + e) * u;
}

/* The fixed 16-lane tree: (l, l+8), (l, l+4), (l, l+2), (l, l+1). */
static inline float kvf_cpu_tree16(const float *l)
{
    float a[8], b[4], c[2];
    for (int i = 0; i < 8; i++)
        a[i] = l[i] + l[i + 8];
    for (int i = 0; i < 4; i++)
        b[i] = a[i] + a[i + 4];
    for (int i = 0; i < 2; i++)
        c[i] = b[i] + b[i + 2];
    return c[0] + c[1];
}

/* The online-softmax factor for a running max going from m_old to m_new. */
static inline float kvf_cpu_rescale(float m_old, float m_new)
{
    return m_old == -INFINITY ? 0.0f : kvf_cpu_exp(m_old - m_new);
}

#endif
