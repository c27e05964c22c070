/* AVX-512F kernels: cpu_kernels_vec.h over 16-float vectors. Compiled for
 * AVX-512F whatever the build's -march; chosen only on a CPU that has it
 * (cpu_isa.c). Same bits as cpu_kernels_scalar.c. */
#include "cpu_canon.h"
#include "cpu_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
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

/* 32 zmm registers: decode rows x 4 panels (8 accumulators a row), and
 * 6 rows x 2 panels (24) for larger batches. */
#define SMALL_M 3
#define SMALL_P(M) 4
#define SMALL_CASES SMALL_CASE(1) SMALL_CASE(2) SMALL_CASE(3)
#define BIG_MR 6
#define BIG_P 2
#define BIG_NV 2
#define BIG_CASES BIG_CASE(1) BIG_CASE(2) BIG_CASE(3) BIG_CASE(4) BIG_CASE(5) BIG_CASE(6)
#define TILE_ACC_MAX 24
#define TILE_W_MAX 8

#include "cpu_kernels_vec.h"

const kvf_cpu_kernels_t kvf_cpu_kernels_avx512 = {
    .isa = KVF_CPU_ISA_AVX512,
    .gemm = gemm_avx512,
    .swiglu_row = swiglu_row_avx512,
    .attention = attention_avx512,
};
#pragma GCC pop_options
#else
/* Not an x86-64 GCC/Clang build: never chosen (kvf_cpu_isa_supported). */
const kvf_cpu_kernels_t kvf_cpu_kernels_avx512 = {
    .isa = KVF_CPU_ISA_SCALAR,
    .gemm = NULL,
    .swiglu_row = NULL,
    .attention = NULL,
};
#endif
