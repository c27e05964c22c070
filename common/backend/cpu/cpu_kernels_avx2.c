/* AVX2 kernels (with FMA and F16C): cpu_kernels_vec.h over 8-float
 * vectors. Compiled for that target whatever the build's -march; chosen
 * only on a CPU that has it (cpu_isa.c). Same bits as
 * cpu_kernels_scalar.c. */
#include "cpu_canon.h"
#include "cpu_kernels.h"

#if defined(KVF_CPU_X86_KERNELS)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

typedef __m256 vf;
#define VL 8
#define V_ZERO() _mm256_setzero_ps()
#define V_SET1(x) _mm256_set1_ps(x)
#define V_LOAD(p) _mm256_loadu_ps(p)
#define V_STORE(p, v) _mm256_storeu_ps((p), (v))
#define V_ADD(a, b) _mm256_add_ps((a), (b))
#define V_SUB(a, b) _mm256_sub_ps((a), (b))
#define V_MUL(a, b) _mm256_mul_ps((a), (b))
#define V_DIV(a, b) _mm256_div_ps((a), (b))
#define V_NEG(a) _mm256_xor_ps((a), _mm256_set1_ps(-0.0f))
#define V_FMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define V_MAXF(a, b) _mm256_max_ps((a), (b))
#define V_MINF(a, b) _mm256_min_ps((a), (b))
#define V_ROUND(x) _mm256_round_ps((x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define V_EXP2I(n) _mm256_castsi256_ps(_mm256_slli_epi32( \
    _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23))
#define V_LOAD_BF16(p) _mm256_castsi256_ps(_mm256_slli_epi32( \
    _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p))), 16))
#define V_LOAD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p)))
#define KFN(name) name##_avx2

/* The 16-lane tree of cpu_canon.h on lanes 0-7 (lo) and 8-15 (hi). */
static inline __attribute__((always_inline)) float tree16(__m256 lo, __m256 hi)
{
    __m256 a = _mm256_add_ps(lo, hi);
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}

static inline __attribute__((always_inline)) float dot16(const float *q, const float *k, int hd)
{
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    int d = 0;
    for (; d + 16 <= hd; d += 16) {
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), _mm256_loadu_ps(k + d + 8), hi);
    }
    if (d < hd) {
        float qa[16] = {0}, ka[16] = {0};
        memcpy(qa, q + d, (size_t)(hd - d) * sizeof(float));
        memcpy(ka, k + d, (size_t)(hd - d) * sizeof(float));
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(qa), _mm256_loadu_ps(ka), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(qa + 8), _mm256_loadu_ps(ka + 8), hi);
    }
    return tree16(lo, hi);
}
#define DOT16(q, k, hd) dot16((q), (k), (hd))

/* The largest of s[ja .. nj-1] (16 floats), NaN ignored, -inf if none
 * (as the AVX-512 kernels). */
static inline __attribute__((always_inline)) float hmax16(const float *s, int ja, int nj)
{
    const __m256 idx0 = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 idx1 = _mm256_setr_ps(8, 9, 10, 11, 12, 13, 14, 15);
    const __m256 lo = _mm256_set1_ps((float)ja), hi = _mm256_set1_ps((float)nj);
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    const __m256 v0 = _mm256_loadu_ps(s), v1 = _mm256_loadu_ps(s + 8);
    const __m256 in0 = _mm256_and_ps(_mm256_and_ps(_mm256_cmp_ps(idx0, lo, _CMP_GE_OQ),
                                                   _mm256_cmp_ps(idx0, hi, _CMP_LT_OQ)),
                                     _mm256_cmp_ps(v0, v0, _CMP_ORD_Q));
    const __m256 in1 = _mm256_and_ps(_mm256_and_ps(_mm256_cmp_ps(idx1, lo, _CMP_GE_OQ),
                                                   _mm256_cmp_ps(idx1, hi, _CMP_LT_OQ)),
                                     _mm256_cmp_ps(v1, v1, _CMP_ORD_Q));
    const __m256 r = _mm256_max_ps(_mm256_blendv_ps(ninf, v0, in0), _mm256_blendv_ps(ninf, v1, in1));
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(r), _mm256_extractf128_ps(r, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}
#define HMAX16(s, ja, nj) hmax16((s), (ja), (nj))
#define TREE16P(p) tree16(_mm256_loadu_ps(p), _mm256_loadu_ps((p) + 8))

/* dot16 of q with the 8 key rows base + j * ld at once, out[j] =
 * dot16(q, row j, hd): lanes
 * l + l+8 by one add a key, then the 8 vectors are reduced together by
 * shuffles that pair exactly the lanes the tree pairs. The rows enter in
 * the order that leaves key j in lane j. */
static inline __attribute__((always_inline)) void dot16x8(const float *q, const float *base,
                                                          size_t ld, int hd, float *out)
{
    static const int order[8] = {1, 5, 0, 4, 3, 7, 2, 6};
#define KROW(i) (base + (size_t)order[i] * ld)
    __m256 lo[8], hi[8];
    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) lo[i] = hi[i] = _mm256_setzero_ps();
    int d = 0;
    for (; d + 16 <= hd; d += 16) {
        const __m256 q0 = _mm256_loadu_ps(q + d), q1 = _mm256_loadu_ps(q + d + 8);
        _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
            lo[i] = _mm256_fmadd_ps(q0, _mm256_loadu_ps(KROW(i) + d), lo[i]);
            hi[i] = _mm256_fmadd_ps(q1, _mm256_loadu_ps(KROW(i) + d + 8), hi[i]);
        }
    }
    if (d < hd) {
        float qa[16] = {0};
        memcpy(qa, q + d, (size_t)(hd - d) * sizeof(float));
        const __m256 q0 = _mm256_loadu_ps(qa), q1 = _mm256_loadu_ps(qa + 8);
        _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
            float ka[16] = {0};
            memcpy(ka, KROW(i) + d, (size_t)(hd - d) * sizeof(float));
            lo[i] = _mm256_fmadd_ps(q0, _mm256_loadu_ps(ka), lo[i]);
            hi[i] = _mm256_fmadd_ps(q1, _mm256_loadu_ps(ka + 8), hi[i]);
        }
    }
#undef KROW
    __m256 a[8], b[4], c[2];
    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) a[i] = _mm256_add_ps(lo[i], hi[i]);
    /* l + l+4: two keys a vector */
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
        b[i] = _mm256_add_ps(_mm256_permute2f128_ps(a[2 * i], a[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(a[2 * i], a[2 * i + 1], 0x31));
    /* l + l+2: four keys */
    _Pragma("GCC unroll 2") for (int i = 0; i < 2; i++)
        c[i] = _mm256_add_ps(_mm256_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* l + l+1: eight keys */
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_shuffle_ps(c[0], c[1], _MM_SHUFFLE(0, 2, 0, 2)),
                                        _mm256_shuffle_ps(c[0], c[1], _MM_SHUFFLE(1, 3, 1, 3))));
}
#define DOT16X16S(q, base, ld, hd, out)                                                            \
    do {                                                                                           \
        dot16x8((q), (base), (ld), (hd), (out));                                             \
        dot16x8((q), (base) + 8 * (size_t)(ld), (ld), (hd), (out) + 8);                      \
    } while (0)

/* The exact KV decodes of kvf/kv_format.h, 8 elements at element i of a
 * row of dt, sv its kvf_cpu_kv_factor (as the AVX-512 kernels: bf16 a shift, f16 by F16C, int8 a
 * convert and one multiply, fp8 E4M3 as f16, explained in
 * cpu_kernels_avx512.c). */
static inline __attribute__((always_inline)) __m256 load_kv(kvf_kv_dtype_t dt, const void *src,
                                                            int i, __m256 sv)
{
    switch (dt) {
    case KVF_KV_BF16:
        return V_LOAD_BF16((const uint16_t *)src + i);
    case KVF_KV_F16:
        return V_LOAD_F16((const uint16_t *)src + i);
    case KVF_KV_INT8: {
        __m256i v = _mm256_cvtepi8_epi32(
            _mm_loadl_epi64((const __m128i *)(const void *)((const int8_t *)src + i)));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(v), sv);
    }
    case KVF_KV_FP8: {
        __m128i b = _mm_cvtepu8_epi16(
            _mm_loadl_epi64((const __m128i *)(const void *)((const uint8_t *)src + i)));
        __m128i s7 = _mm_slli_epi16(b, 7);
        __m128i h = _mm_add_epi16(s7, _mm_and_si128(s7, _mm_set1_epi16(0x4000)));
        __m128i nan = _mm_cmpeq_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7f)), _mm_set1_epi16(0x7f));
        h = _mm_xor_si128(h, _mm_and_si128(nan, _mm_set1_epi16(0x4180)));
        return _mm256_mul_ps(_mm256_cvtph_ps(h), sv); /* sv: the scale x 2^8 */
    }
    default:
        return _mm256_loadu_ps((const float *)src + i);
    }
}
#define V_LOAD_KV(dt, src, i, sv) load_kv((dt), (src), (i), (sv))
#define KV_FUSED 1

/* int8 pools' scores over the integers, and value rows read as floats
 * (cpu_i8_x86.h) */
#define V_CVT_I8(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(p))))
#include "cpu_i8_x86.h"


/* 16 ymm registers: decode rows x 1-2 panels (4 accumulators a row and
 * panel), and 6 rows x half a panel (12) for larger batches. */
#define SMALL_M 3
#define SMALL_P(M) ((M) == 1 ? 3 : 1)
#define SMALL_CASES SMALL_CASE(1) SMALL_CASE(2) SMALL_CASE(3)
#define BIG_MR 6
#define BIG_P 1
#define BIG_NV 2
#define BIG_CASES BIG_CASE(1) BIG_CASE(2) BIG_CASE(3) BIG_CASE(4) BIG_CASE(5) BIG_CASE(6)
#define TILE_ACC_MAX 24
#define TILE_W_MAX 12

#define ISA_ID KVF_CPU_ISA_AVX2
#define SMALL_PANELS_PER_TASK 6

#include "cpu_kernels_vec.h"

#pragma GCC pop_options
#endif
