/* AVX-512F kernels: cpu_kernels_vec.h over 16-float vectors. Compiled for
 * AVX-512F whatever the build's -march; chosen only on a CPU that has it
 * (cpu_isa.c). Same bits as cpu_kernels_scalar.c. */
#include "cpu_canon.h"
#include "cpu_kernels.h"

#if defined(KVF_CPU_X86_KERNELS)
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,f16c")
#include <immintrin.h>

typedef __m512 vf;
#define VL 16
#define V_ZERO() _mm512_setzero_ps()
#define V_SET1(x) _mm512_set1_ps(x)
#define V_LOAD(p) _mm512_loadu_ps(p)
#define V_STORE(p, v) _mm512_storeu_ps((p), (v))
#define V_ADD(a, b) _mm512_add_ps((a), (b))
#define V_SUB(a, b) _mm512_sub_ps((a), (b))
#define V_MUL(a, b) _mm512_mul_ps((a), (b))
#define V_DIV(a, b) _mm512_div_ps((a), (b))
#define V_NEG(a) _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a), \
                                                      _mm512_set1_epi32((int)0x80000000u)))
#define V_FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define V_MAXF(a, b) _mm512_max_ps((a), (b))
#define V_MINF(a, b) _mm512_min_ps((a), (b))
#define V_ROUND(x) _mm512_roundscale_ps((x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define V_EXP2I(n) _mm512_castsi512_ps(_mm512_slli_epi32( \
    _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23))
#define V_LOAD_BF16(p) _mm512_castsi512_ps(_mm512_slli_epi32( \
    _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(p))), 16))
#define V_LOAD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p)))
#define KFN(name) name##_avx512

/* The 16-lane tree of cpu_canon.h on one vector. */
static inline __attribute__((always_inline)) float tree16(__m512 v)
{
    __m256 lo = _mm512_castps512_ps256(v);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    __m256 a = _mm256_add_ps(lo, hi);
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}

static inline __attribute__((always_inline)) float dot16(const float *q, const float *k, int hd)
{
    __m512 acc = _mm512_setzero_ps();
    int d = 0;
    for (; d + 16 <= hd; d += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), _mm512_loadu_ps(k + d), acc);
    if (d < hd) {
        __mmask16 mk = (__mmask16)((1u << (hd - d)) - 1);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, q + d), _mm512_maskz_loadu_ps(mk, k + d),
                              acc);
    }
    return tree16(acc);
}
#define DOT16(q, k, hd) dot16((q), (k), (hd))

/* The largest of s[ja .. nj-1] (16 floats), NaN ignored, -inf if none:
 * the value of the sequential scan of cpu_kernels_scalar.c (a zero's
 * sign aside, which no later step can see). */
static inline __attribute__((always_inline)) float hmax16(const float *s, int ja, int nj)
{
    const __m512 v = _mm512_loadu_ps(s);
    const __mmask16 in = (__mmask16)(((1u << nj) - 1) & ~((1u << ja) - 1)) &
                         _mm512_cmp_ps_mask(v, v, _CMP_ORD_Q);
    return _mm512_reduce_max_ps(_mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), in, v));
}
#define HMAX16(s, ja, nj) hmax16((s), (ja), (nj))
#define TREE16P(p) tree16(_mm512_loadu_ps(p))

/* The 16 vectors v reduced together by shuffles that pair exactly the
 * lanes cpu_canon.h's tree pairs: lane j of the result is the tree of
 * v[k], k = red_slot[j] (red_order[k] = j). */
static const int red_order[16] = {1, 5, 9, 13, 0, 4, 8, 12, 3, 7, 11, 15, 2, 6, 10, 14};
static const int red_slot[16] = {4, 0, 12, 8, 5, 1, 13, 9, 6, 2, 14, 10, 7, 3, 15, 11};
static inline __attribute__((always_inline)) __m512 reduce16x16(const __m512 *v)
{
    /* lanes l + l+8 (128-bit chunks 0+2, 1+3), two keys a vector */
    __m512 s1[8], s2[4], s3[2];
    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++)
        s1[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* l + l+4 (chunk 0+1 of each key), four keys a vector */
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
        s2[i] = _mm512_add_ps(
            _mm512_shuffle_f32x4(s1[2 * i], s1[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
            _mm512_shuffle_f32x4(s1[2 * i], s1[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    /* l + l+2 within each chunk, eight keys a vector */
    _Pragma("GCC unroll 2") for (int i = 0; i < 2; i++)
        s3[i] = _mm512_add_ps(_mm512_shuffle_ps(s2[2 * i], s2[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_ps(s2[2 * i], s2[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* l + l+1: sixteen keys */
    return _mm512_add_ps(_mm512_shuffle_ps(s3[0], s3[1], _MM_SHUFFLE(0, 2, 0, 2)),
                         _mm512_shuffle_ps(s3[0], s3[1], _MM_SHUFFLE(1, 3, 1, 3)));
}

/* dot16 of q with the 16 key rows base + j * ld at once, out[j] =
 * dot16(q, row j, hd): the 16 lane vectors are reduced together by
 * shuffles that pair exactly the lanes the tree pairs. The rows enter in
 * the order that leaves key j in lane j. */
static inline __attribute__((always_inline)) void dot16x16(const float *q, const float *base,
                                                           size_t ld, int hd, float *out)
{
#define KROW(i) (base + (size_t)red_order[i] * ld)
    __m512 v[16];
    _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) v[i] = _mm512_setzero_ps();
    int d = 0;
    for (; d + 16 <= hd; d += 16) {
        const __m512 qv = _mm512_loadu_ps(q + d);
        _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++)
            v[i] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(KROW(i) + d), v[i]);
    }
    if (d < hd) {
        const __mmask16 mk = (__mmask16)((1u << (hd - d)) - 1);
        const __m512 qv = _mm512_maskz_loadu_ps(mk, q + d);
        _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++)
            v[i] = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(mk, KROW(i) + d), v[i]);
#undef KROW
    }
    _mm512_storeu_ps(out, reduce16x16(v));
}
#define DOT16X16S(q, base, ld, hd, out) dot16x16((q), (base), (ld), (hd), (out))

/* The exact KV decodes of kvf/kv_format.h, 16 elements at element i of
 * a row of dt (not f32), sv the row's kvf_cpu_kv_factor: bf16 a shift,
 * f16 by F16C (exact, subnormals included), int8 a convert and the
 * scale's one multiply, fp8 E4M3 as f16, then the scale x 2^8.
 *
 * E4M3 as f16: its 7 magnitude bits at f16 bits 13..7 and its sign at 15
 * make an f16 of the value / 2^8, subnormals included (f16's exponent
 * bias is 8 more, its subnormals 2^-14 x m/1024 against E4M3's 2^-6 x
 * m/8), which F16C converts exactly; the multiply by the scale x 2^8
 * (kvf_cpu_kv_factor) then rounds the same real product the scalar
 * decode's does.
 * 0x7f/0xff (NaN) become the f16 NaN 0x7e00 with the sign, which converts
 * to the scalar decode's 0x7fc00000. No f32 subnormal is made on the way
 * (they are slow on some CPUs). */
static inline __attribute__((always_inline)) __m512 load_kv(kvf_kv_dtype_t dt, const void *src,
                                                            int i, __m512 sv)
{
    switch (dt) {
    case KVF_KV_BF16:
        return V_LOAD_BF16((const uint16_t *)src + i);
    case KVF_KV_F16:
        return V_LOAD_F16((const uint16_t *)src + i);
    case KVF_KV_INT8: {
        __m512i v = _mm512_cvtepi8_epi32(
            _mm_loadu_si128((const __m128i *)(const void *)((const int8_t *)src + i)));
        return _mm512_mul_ps(_mm512_cvtepi32_ps(v), sv);
    }
    case KVF_KV_FP8: {
        __m256i b = _mm256_cvtepu8_epi16(
            _mm_loadu_si128((const __m128i *)(const void *)((const uint8_t *)src + i)));
        __m256i s7 = _mm256_slli_epi16(b, 7);
        __m256i h = _mm256_add_epi16(s7, _mm256_and_si256(s7, _mm256_set1_epi16(0x4000)));
        __m256i nan = _mm256_cmpeq_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7f)),
                                         _mm256_set1_epi16(0x7f));
        h = _mm256_xor_si256(h, _mm256_and_si256(nan, _mm256_set1_epi16(0x4180)));
        return _mm512_mul_ps(_mm512_cvtph_ps(h), sv); /* sv: the scale x 2^8 */
    }
    default:
        return _mm512_loadu_ps((const float *)src + i);
    }
}
#define V_LOAD_KV(dt, src, i, sv) load_kv((dt), (src), (i), (sv))
#define KV_FUSED 1

/* int8 pools' scores over the integers, and value rows read as floats
 * (cpu_i8_x86.h). 256-bit integer steps, so only AVX2 is needed, and 4
 * keys a pass: VEX-encoded instructions reach 16 registers. (512-bit
 * vpdpwssd, AVX512-VNNI, measured no faster at 16k context, batch 16:
 * the step there waits on memory and p·v, not on these sums.) */
#define V_CVT_I8(p) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p))))
#include "cpu_i8_x86.h"

/* dot16 of q0 and of q1 with each of the 16 key rows base + j * stride
 * bytes of format DT (row j's scale scales[j]), into out0[j] and out1[j]:
 * each key vector is decoded once, in registers, for both queries. Eight
 * keys at a time in 16 accumulators (virtual row i < 8: q0 with key i,
 * i >= 8: q1 with key i - 8), reduced by reduce16x16; hd a multiple of
 * 16. The same FMA chains and tree as dot16, so the same bits. */
static inline __attribute__((always_inline)) void
dot2x16_dt(const float *q0, const float *q1, const char *base, size_t stride,
           const float *scales, int hd, float *out0, float *out1, kvf_cpu_pf_stream_t *pf,
           int pf_n, const kvf_kv_dtype_t DT)
{
    _Pragma("GCC unroll 2") for (int half = 0; half < 2; half++) {
        __m512 v[16];
        _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) v[i] = _mm512_setzero_ps();
        for (int d = 0; d < hd; d += 16) {
            kvf_cpu_pf_take(pf, pf_n);
            const __m512 a = _mm512_loadu_ps(q0 + d), b = _mm512_loadu_ps(q1 + d);
            _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
                const int j = half * 8 + i;
                const __m512 k = load_kv(DT, base + (size_t)j * stride, d,
                                         _mm512_set1_ps(kvf_cpu_kv_factor(DT, scales[j])));
                v[red_slot[i]] = _mm512_fmadd_ps(a, k, v[red_slot[i]]);
                v[red_slot[i + 8]] = _mm512_fmadd_ps(b, k, v[red_slot[i + 8]]);
            }
        }
        const __m512 r = reduce16x16(v);
        _mm256_storeu_ps(out0 + half * 8, _mm512_castps512_ps256(r));
        _mm256_storeu_ps(out1 + half * 8,
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(r), 1)));
    }
}

static inline __attribute__((always_inline)) void
dot2x16_avx512(kvf_kv_dtype_t dt, const float *q0, const float *q1, const void *base,
               size_t stride, const float *scales, int hd, float *out0, float *out1,
               kvf_cpu_pf_stream_t *pf, int pf_n)
{
    const char *b = base;
#define D2(DT) dot2x16_dt(q0, q1, b, stride, scales, hd, out0, out1, pf, pf_n, DT)
    switch (dt) {
    case KVF_KV_BF16: D2(KVF_KV_BF16); break;
    case KVF_KV_F16: D2(KVF_KV_F16); break;
    case KVF_KV_FP8: D2(KVF_KV_FP8); break;
    default: D2(KVF_KV_F32); break; /* int8 never comes here: i8_group_scores */
    }
#undef D2
}
#define DOT2X16(dt, q0, q1, base, stride, scales, hd, out0, out1, pf, pf_n) \
    dot2x16_avx512((dt), (q0), (q1), (base), (stride), (scales), (hd), (out0), (out1), (pf), (pf_n))


/* 32 zmm registers: decode rows x 4 panels (8 accumulators a row), and
 * 6 rows x 2 panels (24) for larger batches. */
#define SMALL_M 8
#define SMALL_P(M) ((M) <= 3 ? 4 : (M) <= 6 ? 2 : 1)
#define SMALL_CASES SMALL_CASE(1) SMALL_CASE(2) SMALL_CASE(3) SMALL_CASE(4) SMALL_CASE(5) \
    SMALL_CASE(6) SMALL_CASE(7) SMALL_CASE(8)
#define BIG_MR 6
#define BIG_P 2
#define BIG_NV 2
#define BIG_CASES BIG_CASE(1) BIG_CASE(2) BIG_CASE(3) BIG_CASE(4) BIG_CASE(5) BIG_CASE(6)
#define TILE_ACC_MAX 24
#define TILE_W_MAX 8

#define ISA_ID KVF_CPU_ISA_AVX512
#define SMALL_PANELS_PER_TASK 8

#include "cpu_kernels_vec.h"

#pragma GCC pop_options
#endif
