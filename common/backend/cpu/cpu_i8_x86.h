/* The scores of int8 pools on x86 (cpu_kernels.h, "int8 pools"), for
 * the AVX2 and AVX-512 kernels alike: included by cpu_kernels_avx2.c and
 * cpu_kernels_avx512.c inside their target pragmas, after they define
 * V_CVT_I8 (a vector of int8 elements as floats). Four keys a pass: 8
 * accumulators, the two query rows and a key in the 16 registers that
 * VEX-encoded instructions reach.
 *
 * The integer sums use 256-bit AVX2 instructions in both: a key row's 16
 * int8 elements sign-extended to int16 (vpmovsxbw), multiplied by the
 * query's int16 and added in pairs (vpmaddwd, exact), accumulated in
 * int32. Integer sums are exact, so the order of the reduction is free;
 * the float steps (convert, the scales' product, the product) are those
 * of kvf_kv_i8_score. */
#ifndef KVF_CPU_I8_X86_H
#define KVF_CPU_I8_X86_H

#define I8_KEYS 4

/* The 8 int32 lanes of each of 8 vectors summed: lane i of the result is
 * the sum of v[i]. */
static inline __attribute__((always_inline)) __m256i i8_reduce8(const __m256i *v)
{
    /* within each 128-bit half: pairs, then quads; then the halves */
    const __m256i a0 = _mm256_hadd_epi32(v[0], v[1]), a1 = _mm256_hadd_epi32(v[2], v[3]);
    const __m256i a2 = _mm256_hadd_epi32(v[4], v[5]), a3 = _mm256_hadd_epi32(v[6], v[7]);
    const __m256i b0 = _mm256_hadd_epi32(a0, a1), b1 = _mm256_hadd_epi32(a2, a3);
    /* b0: (v0 v1 v2 v3) of the low halves | of the high halves; b1: v4..v7 */
    return _mm256_add_epi32(_mm256_permute2x128_si256(b0, b1, 0x20),
                            _mm256_permute2x128_si256(b0, b1, 0x31));
}

/* 16 int8 elements at k sign-extended to int16. */
static inline __attribute__((always_inline)) __m256i i8_load16(const int8_t *k)
{
    return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)k));
}

/* The last rem (< 16) elements of a row at k, the rest zero. */
static inline __attribute__((always_inline)) __m256i i8_load_tail(const int8_t *k, int rem)
{
    int8_t tmp[16] = {0};
    memcpy(tmp, k, (size_t)rem);
    return i8_load16(tmp);
}

/* kvf_kv_i8_scores2_ref's o0, o1: the query rows q0, q1 (int16, zeros
 * from hd up to a multiple of 16) against the 16 rows base + j * hd,
 * I8_KEYS keys a pass. The prefetch stream gives a line per 16 elements
 * of a pass (pf_n 0: none): a chunk's 16 key rows of 64 bytes over its
 * scores, as many as its values take over their p·v. */
static inline __attribute__((always_inline)) void
i8scores2_x86(const int16_t *q0, float sq0, const int16_t *q1, float sq1,
              const int8_t *base, const float *ks, int hd, float *o0, float *o1,
              kvf_cpu_pf_stream_t *pf, int pf_n)
{
    for (int j0 = 0; j0 < KVF_CPU_KEY_CHUNK; j0 += I8_KEYS) {
        __m256i a[2 * I8_KEYS];
        _Pragma("GCC unroll 16") for (int i = 0; i < 2 * I8_KEYS; i++) a[i] =
            _mm256_setzero_si256();
        const int8_t *r[I8_KEYS];
        _Pragma("GCC unroll 8") for (int i = 0; i < I8_KEYS; i++) r[i] =
            base + (size_t)(j0 + i) * (size_t)hd;
        if (pf_n > 0)
            kvf_cpu_pf_take(pf, (hd + 15) / 16); /* a line per 16 elements of the pass */
        int d = 0;
        _Pragma("GCC unroll 8") for (; d + 16 <= hd; d += 16) {
            const __m256i x0 = _mm256_loadu_si256((const __m256i *)(const void *)(q0 + d));
            const __m256i x1 = _mm256_loadu_si256((const __m256i *)(const void *)(q1 + d));
            _Pragma("GCC unroll 8") for (int i = 0; i < I8_KEYS; i++) {
                const __m256i k = i8_load16(r[i] + d);
                a[i] = _mm256_add_epi32(a[i], _mm256_madd_epi16(x0, k));
                a[I8_KEYS + i] = _mm256_add_epi32(a[I8_KEYS + i], _mm256_madd_epi16(x1, k));
            }
        }
        if (d < hd) {
            const __m256i x0 = _mm256_loadu_si256((const __m256i *)(const void *)(q0 + d));
            const __m256i x1 = _mm256_loadu_si256((const __m256i *)(const void *)(q1 + d));
            _Pragma("GCC unroll 8") for (int i = 0; i < I8_KEYS; i++) {
                const __m256i k = i8_load_tail(r[i] + d, hd - d);
                a[i] = _mm256_add_epi32(a[i], _mm256_madd_epi16(x0, k));
                a[I8_KEYS + i] = _mm256_add_epi32(a[I8_KEYS + i], _mm256_madd_epi16(x1, k));
            }
        }
        /* lanes 0-3: q0 with the pass's keys, 4-7: q1 with them */
        const __m256 sq = _mm256_setr_ps(sq0, sq0, sq0, sq0, sq1, sq1, sq1, sq1);
        const __m128 k4 = _mm_loadu_ps(ks + j0);
        const __m256 kv = _mm256_insertf128_ps(_mm256_castps128_ps256(k4), k4, 1);
        const __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(i8_reduce8(a)), _mm256_mul_ps(sq, kv));
        _mm_storeu_ps(o0 + j0, _mm256_castps256_ps128(s));
        _mm_storeu_ps(o1 + j0, _mm256_extractf128_ps(s, 1));
    }
}
#define I8SCORES2(q0, sq0, q1, sq1, base, ks, hd, o0, o1, pf, pf_n) \
    i8scores2_x86((q0), (sq0), (q1), (sq1), (base), (ks), (hd), (o0), (o1), (pf), (pf_n))

/* VL int8 elements at row + i as floats (exact). */
#define V_LOAD_I8(row, i) V_CVT_I8((const int8_t *)(const void *)(row) + (i))

#endif
