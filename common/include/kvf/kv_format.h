/* The element formats of the KV cache and how one (block, layer) slice of
 * the pool lays them out; the encoders and decoders every backend uses
 * (plain C, and the same code in CUDA kernels: KVF_KV_HD).
 *
 * Formats (numbered as the wire's KvDtype):
 *   f32   4 bytes
 *   f16   2 bytes, IEEE binary16, round to nearest even, saturating at
 *         +-65504 (a finite input never becomes inf)
 *   bf16  2 bytes, the top half of an f32, round to nearest even,
 *         saturating at +-max finite
 *   fp8   1 byte, OCP E4M3 (FN: no infinities, 0x7f/0xff are NaN), round
 *         to nearest even, saturating at +-448: NaN only from NaN
 *   int8  1 byte, symmetric, -127..127
 * fp8 and int8 carry an f32 scale per (token, kv head) for K and for V:
 * scale = amax / 448 (fp8) or amax / 127 (int8) over the row's head_dim
 * values, 1 when amax is 0 or not finite; stored = encode(x / scale),
 * read back = decode(stored) * scale. A row is encoded once, when its
 * token's K/V is written, and never again: rows appended later to a
 * block have scales of their own, so nothing is requantized and no
 * scale can overflow (docs/numerics.md).
 *
 * Every decode is exact in f32 (and the int8/fp8 product one rounding),
 * so K/V read back are the same f32 values on every ISA and on the GPU.
 *
 * Slice layout, for one (block, layer), block_size slots:
 *   K data   [kv_head][slot][head_dim] elements
 *   V data   [kv_head][slot][head_dim] elements
 *   K scales [kv_head][slot] f32          (fp8, int8 only)
 *   V scales [kv_head][slot] f32          (fp8, int8 only)
 * One contiguous put ships data and scales together. */
#ifndef KVF_KV_FORMAT_H
#define KVF_KV_FORMAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kvf/status.h"

#if defined(__CUDACC__)
#define KVF_KV_HD __host__ __device__
#else
#define KVF_KV_HD
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KVF_KV_F32 = 0,
    KVF_KV_F16 = 1,
    KVF_KV_BF16 = 2,
    KVF_KV_FP8 = 3,
    KVF_KV_INT8 = 4,
} kvf_kv_dtype_t;

#define KVF_KV_N_DTYPES 5

/* "f32", "f16", "bf16", "fp8", "int8"; "?" outside the enum. */
const char *kvf_kv_dtype_name(kvf_kv_dtype_t dtype);

/* Parses those names (and "float32", "float16", "bfloat16", "e4m3",
 * "fp8_e4m3"); KVF_ERR_INVAL for anything else. */
kvf_status_t kvf_kv_dtype_parse(const char *name, kvf_kv_dtype_t *dtype_p);

static inline KVF_KV_HD size_t kvf_kv_elem_bytes(kvf_kv_dtype_t dt)
{
    return dt == KVF_KV_F32 ? 4 : dt == KVF_KV_F16 || dt == KVF_KV_BF16 ? 2 : 1;
}

/* fp8 and int8 rows carry a scale. */
static inline KVF_KV_HD bool kvf_kv_scaled(kvf_kv_dtype_t dt)
{
    return dt == KVF_KV_FP8 || dt == KVF_KV_INT8;
}

/* Bytes one (token, kv head) row of K (or of V) takes: data and scale. */
static inline KVF_KV_HD size_t kvf_kv_row_bytes(kvf_kv_dtype_t dt, int head_dim)
{
    return (size_t)head_dim * kvf_kv_elem_bytes(dt) + (kvf_kv_scaled(dt) ? sizeof(float) : 0);
}

/* Byte offset, in a slice, of the data of (kv, head) (kv 0: K, 1: V):
 * block_size rows of head_dim elements. */
static inline KVF_KV_HD size_t kvf_kv_data_offset(kvf_kv_dtype_t dt, int n_kv_heads, int block_size,
                                                  int head_dim, int kv, int head)
{
    return ((size_t)kv * n_kv_heads + head) * block_size * head_dim * kvf_kv_elem_bytes(dt);
}

/* Byte offset, in a slice, of the scales of (kv, head): block_size f32;
 * only for a scaled format. */
static inline KVF_KV_HD size_t kvf_kv_scale_offset(kvf_kv_dtype_t dt, int n_kv_heads,
                                                   int block_size, int head_dim, int kv, int head)
{
    return kvf_kv_data_offset(dt, n_kv_heads, block_size, head_dim, 2, 0) +
           ((size_t)kv * n_kv_heads + head) * block_size * sizeof(float);
}

static inline KVF_KV_HD uint32_t kvf_kv__bits(float x)
{
    uint32_t b;
    memcpy(&b, &x, sizeof(b));
    return b;
}

static inline KVF_KV_HD float kvf_kv__float(uint32_t b)
{
    float x;
    memcpy(&x, &b, sizeof(x));
    return x;
}

/* q = m >> shift rounded to nearest even (shift 1..31). */
static inline KVF_KV_HD uint32_t kvf_kv__rne_shift(uint32_t m, int shift)
{
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    return q + (rem > half || (rem == half && (q & 1u)));
}

/* ---- f16 -------------------------------------------------------------------- */

static inline KVF_KV_HD uint16_t kvf_kv_f16_encode(float x)
{
    uint32_t b = kvf_kv__bits(x), sign = (b >> 16) & 0x8000u, a = b & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (a >= 0x477fe000u)
        return (uint16_t)(sign | 0x7bffu); /* 65504 and beyond, inf included */
    if (a < 0x38800000u) {                 /* below 2^-14: a subnormal or zero */
        if (a <= 0x33000000u)
            return (uint16_t)sign; /* at most half the smallest subnormal */
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        return (uint16_t)(sign | kvf_kv__rne_shift(m, 126 - (int)(a >> 23)));
    }
    return (uint16_t)(sign | kvf_kv__rne_shift(a - 0x38000000u, 13));
}

static inline KVF_KV_HD float kvf_kv_f16_decode(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        float f = (float)m * 5.9604644775390625e-8f; /* m * 2^-24, exact */
        return sign ? -f : f;
    }
    if (e == 31) /* infinity; a NaN quieted, its payload kept (as F16C and NEON convert) */
        return kvf_kv__float(sign | 0x7f800000u | (m ? 0x400000u : 0) | (m << 13));
    return kvf_kv__float(sign | ((e + 112) << 23) | (m << 13));
}

/* ---- bf16 ------------------------------------------------------------------- */

static inline KVF_KV_HD uint16_t kvf_kv_bf16_encode(float x)
{
    uint32_t b = kvf_kv__bits(x);
    if ((b & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((b >> 16) | 0x40u); /* NaN stays NaN */
    uint32_t r = b + 0x7fffu + ((b >> 16) & 1u);
    if ((r & 0x7f800000u) == 0x7f800000u && (b & 0x7f800000u) != 0x7f800000u)
        return (uint16_t)(((b >> 16) & 0x8000u) | 0x7f7fu); /* finite: saturate */
    return (uint16_t)(r >> 16);
}

static inline KVF_KV_HD float kvf_kv_bf16_decode(uint16_t h)
{
    return kvf_kv__float((uint32_t)h << 16);
}

/* ---- fp8 (E4M3 FN) ------------------------------------------------------------ */

#define KVF_KV_FP8_MAX  448.0f
#define KVF_KV_INT8_MAX 127.0f

static inline KVF_KV_HD uint8_t kvf_kv_fp8_encode(float x)
{
    uint32_t b = kvf_kv__bits(x), sign = (b >> 24) & 0x80u, a = b & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint8_t)(sign | 0x7fu); /* NaN */
    if (a >= 0x43e00000u)
        return (uint8_t)(sign | 0x7eu); /* 448 and beyond, inf included */
    if (a < 0x3c800000u) {              /* below 2^-6: a subnormal (m * 2^-9) or zero */
        if (a <= 0x3a800000u)
            return (uint8_t)sign; /* at most 2^-10, half the smallest subnormal */
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        return (uint8_t)(sign | kvf_kv__rne_shift(m, 141 - (int)(a >> 23)));
    }
    uint32_t q = kvf_kv__rne_shift(a - 0x3c000000u, 20);
    return (uint8_t)(sign | (q > 0x7eu ? 0x7eu : q));
}

static inline KVF_KV_HD float kvf_kv_fp8_decode(uint8_t v)
{
    uint32_t sign = (uint32_t)(v & 0x80u) << 24, e = (v >> 3) & 0xfu, m = v & 7u;
    if (e == 15 && m == 7)
        return kvf_kv__float(sign | 0x7fc00000u);
    if (e == 0) {
        float f = (float)m * 0.001953125f; /* m * 2^-9, exact */
        return sign ? -f : f;
    }
    return kvf_kv__float(sign | ((e + 120) << 23) | (m << 20));
}

/* ---- int8 ------------------------------------------------------------------- */

/* round(x / scale) to nearest even, clamped to -127..127; NaN is 0. */
static inline KVF_KV_HD int8_t kvf_kv_int8_encode(float x, float scale)
{
    float r = x / scale;
    if (!(r == r))
        return 0;
    r = r > KVF_KV_INT8_MAX ? KVF_KV_INT8_MAX : r < -KVF_KV_INT8_MAX ? -KVF_KV_INT8_MAX : r;
    /* |r| <= 127: adding and taking away 1.5 * 2^23 rounds to an integer,
     * to nearest even, in the default rounding mode */
    float t = r + 12582912.0f;
    t -= 12582912.0f;
    return (int8_t)(int)t;
}

/* ---- int8 attention: the query as integers --------------------------------
 *
 * Attention over an int8 pool scores from the integers (docs/numerics.md,
 * "KV formats"): a query row is rounded to int16 with a scale of its own,
 * and score = (float)(sum qi * k) * (sq * sk), the sum exact in int32.
 * These are the rules every backend rounds a query row by. */

/* The largest |qi| for rows of hd elements: qmax * 127 * hd < 2^31. */
static inline KVF_KV_HD int kvf_kv_i8_qmax(int hd)
{
    const int lim = (int)(2147483647 / (127 * (hd > 0 ? hd : 1)));
    return lim < 32767 ? lim : 32767;
}

/* The scale of a query row whose largest |q| (NaN skipped) is amax: 0
 * for an all-zero row (every score 0), NaN when amax is not finite. */
static inline KVF_KV_HD float kvf_kv_i8_qscale(float amax, int hd)
{
    if (!(amax <= 3.402823466e38f))
        return kvf_kv__float(0x7fc00000u);
    return amax == 0.0f ? 0.0f : amax / (float)kvf_kv_i8_qmax(hd);
}

/* q's integer: round(q / sq) to nearest even, clamped to +-qmax; 0 for a
 * NaN q or a scale that is 0 or NaN. */
static inline KVF_KV_HD int kvf_kv_i8_qround(float q, float sq, int hd)
{
    if (!(sq > 0.0f))
        return 0;
    float r = q / sq;
    if (!(r == r))
        return 0;
    const float qmax = (float)kvf_kv_i8_qmax(hd);
    r = r > qmax ? qmax : r < -qmax ? -qmax : r;
    /* |r| <= 2^15: adding and taking away 1.5 * 2^23 rounds it to an
     * integer, to nearest even */
    float t = r + 12582912.0f;
    t -= 12582912.0f;
    return (int)t;
}

/* A score from the integer sum and the two scales. */
static inline KVF_KV_HD float kvf_kv_i8_score(int isum, float sq, float sk)
{
    return (float)isum * (sq * sk);
}

/* ---- rows ------------------------------------------------------------------- */

/* The scale of a scaled format for a row whose largest |x| is amax (NaN
 * skipped): 1 when amax is 0 or not finite. */
static inline KVF_KV_HD float kvf_kv_scale_of_amax(kvf_kv_dtype_t dt, float amax)
{
    if (!(amax > 0.0f) || amax > 3.402823466e38f)
        return 1.0f;
    return amax / (dt == KVF_KV_FP8 ? KVF_KV_FP8_MAX : KVF_KV_INT8_MAX);
}

/* The scale of a row of n values for a scaled format. */
static inline KVF_KV_HD float kvf_kv_row_scale(kvf_kv_dtype_t dt, const float *x, int n)
{
    float amax = 0.0f;
    for (int i = 0; i < n; i++) {
        float a = x[i] < 0 ? -x[i] : x[i];
        amax = a > amax ? a : amax;
    }
    return kvf_kv_scale_of_amax(dt, amax);
}

/* Encodes a row of n values into dst (n elements of dt); for a scaled
 * format its scale goes to *scale_p (else scale_p may be NULL). */
static inline KVF_KV_HD void kvf_kv_encode_row(kvf_kv_dtype_t dt, const float *x, int n, void *dst,
                                               float *scale_p)
{
    switch (dt) {
    case KVF_KV_F32:
        memcpy(dst, x, (size_t)n * sizeof(float));
        break;
    case KVF_KV_F16:
        for (int i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = kvf_kv_f16_encode(x[i]);
        break;
    case KVF_KV_BF16:
        for (int i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = kvf_kv_bf16_encode(x[i]);
        break;
    case KVF_KV_FP8: {
        float s = kvf_kv_row_scale(dt, x, n);
        for (int i = 0; i < n; i++)
            ((uint8_t *)dst)[i] = kvf_kv_fp8_encode(x[i] / s);
        *scale_p = s;
        break;
    }
    case KVF_KV_INT8: {
        float s = kvf_kv_row_scale(dt, x, n);
        for (int i = 0; i < n; i++)
            ((int8_t *)dst)[i] = kvf_kv_int8_encode(x[i], s);
        *scale_p = s;
        break;
    }
    }
}

/* Element i of a row of dt, with its row's scale (ignored unscaled). */
static inline KVF_KV_HD float kvf_kv_decode_one(kvf_kv_dtype_t dt, const void *src, int i,
                                                float scale)
{
    switch (dt) {
    case KVF_KV_F32:
        return ((const float *)src)[i];
    case KVF_KV_F16:
        return kvf_kv_f16_decode(((const uint16_t *)src)[i]);
    case KVF_KV_BF16:
        return kvf_kv_bf16_decode(((const uint16_t *)src)[i]);
    case KVF_KV_FP8:
        return kvf_kv_fp8_decode(((const uint8_t *)src)[i]) * scale;
    case KVF_KV_INT8:
        return (float)((const int8_t *)src)[i] * scale;
    }
    return 0.0f;
}

/* Decodes a row of n elements of dt into out. */
static inline KVF_KV_HD void kvf_kv_decode_row(kvf_kv_dtype_t dt, const void *src, float scale,
                                               int n, float *out)
{
    for (int i = 0; i < n; i++)
        out[i] = kvf_kv_decode_one(dt, src, i, scale);
}

#ifdef __cplusplus
}
#endif

#endif
