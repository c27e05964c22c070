/* AVX2 kernels (with FMA and F16C): cpu_kernels_vec.h over 8-float
 * vectors. Compiled for that target whatever the build's -march; chosen
 * only on a CPU that has it (cpu_isa.c). Same bits as
 * cpu_kernels_scalar.c. */
#include "cpu_canon.h"
#include "cpu_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
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

/* 16 ymm registers: decode rows x 1-2 panels (4 accumulators a row and
 * panel), and 6 rows x half a panel (12) for larger batches. */
#define SMALL_M 3
#define SMALL_P(M) ((M) == 1 ? 2 : 1)
#define SMALL_CASES SMALL_CASE(1) SMALL_CASE(2) SMALL_CASE(3)
#define BIG_MR 6
#define BIG_P 1
#define BIG_NV 2
#define BIG_CASES BIG_CASE(1) BIG_CASE(2) BIG_CASE(3) BIG_CASE(4) BIG_CASE(5) BIG_CASE(6)
#define TILE_ACC_MAX 24
#define TILE_W_MAX 8

#include "cpu_kernels_vec.h"

const kvf_cpu_kernels_t kvf_cpu_kernels_avx2 = {
    .isa = KVF_CPU_ISA_AVX2,
    .gemm = gemm_avx2,
    .swiglu_row = swiglu_row_avx2,
    .attention = attention_avx2,
};
#pragma GCC pop_options
#else
/* Not an x86-64 GCC/Clang build: never chosen (kvf_cpu_isa_supported). */
const kvf_cpu_kernels_t kvf_cpu_kernels_avx2 = {
    .isa = KVF_CPU_ISA_SCALAR,
    .gemm = NULL,
    .swiglu_row = NULL,
    .attention = NULL,
};
#endif
