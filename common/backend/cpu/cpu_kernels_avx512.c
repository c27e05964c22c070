/* AVX-512 CPU kernels, compiled for AVX-512F regardless of the build's
 * -march and only called when the CPU has it (kvf_cpu_has_avx512). Same
 * contracts as the portable versions in cpu_kernels.c, which the tests
 * compare them against. */
#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512vl,avx2,fma")
#include "cpu_kernels.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

/* exp(x) for x in float range: 2^n * p(r), r = x - n ln2, |r| <= ln2/2,
 * p a degree-7 Taylor polynomial (relative error < 1e-7). Inputs below -87
 * give ~0, above 88 give ~2^127. */
INLINE __m512 exp512(__m512 x)
{
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    x = _mm512_min_ps(x, _mm512_set1_ps(88.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

INLINE __mmask16 tail_mask(int n)
{
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
}

/* R rows of w starting at r against M rows of x. */
INLINE void gemv_block(float *y, const float *x, const float *w, const float *bias, int n, int k,
                       int r, const int M, const int R, int accumulate)
{
    /* Fixed-size arrays (M and R are constants once inlined; arrays sized
     * by them would be VLAs, which live in memory, not registers). */
    __m512 acc[4][KVF_CPU_GEMV_MAX_M];
    _Pragma("GCC unroll 16") for (int rr = 0; rr < R; rr++)
        _Pragma("GCC unroll 16") for (int i = 0; i < M; i++)
            acc[rr][i] = _mm512_setzero_ps();
    const float *wr = w + (size_t)r * (size_t)k;
    int d = 0;
    for (; d + 16 <= k; d += 16) {
        __m512 xv[KVF_CPU_GEMV_MAX_M];
        _Pragma("GCC unroll 16") for (int i = 0; i < M; i++)
            xv[i] = _mm512_loadu_ps(x + (size_t)i * (size_t)k + d);
        _Pragma("GCC unroll 16") for (int rr = 0; rr < R; rr++) {
            __m512 wv = _mm512_loadu_ps(wr + (size_t)rr * (size_t)k + d);
            _Pragma("GCC unroll 16") for (int i = 0; i < M; i++)
                acc[rr][i] = _mm512_fmadd_ps(wv, xv[i], acc[rr][i]);
        }
    }
    if (d < k) {
        __mmask16 mk = tail_mask(k - d);
        __m512 xv[KVF_CPU_GEMV_MAX_M];
        _Pragma("GCC unroll 16") for (int i = 0; i < M; i++)
            xv[i] = _mm512_maskz_loadu_ps(mk, x + (size_t)i * (size_t)k + d);
        _Pragma("GCC unroll 16") for (int rr = 0; rr < R; rr++) {
            __m512 wv = _mm512_maskz_loadu_ps(mk, wr + (size_t)rr * (size_t)k + d);
            _Pragma("GCC unroll 16") for (int i = 0; i < M; i++)
                acc[rr][i] = _mm512_fmadd_ps(wv, xv[i], acc[rr][i]);
        }
    }
    _Pragma("GCC unroll 16") for (int rr = 0; rr < R; rr++) {
        _Pragma("GCC unroll 16") for (int i = 0; i < M; i++) {
            float s = _mm512_reduce_add_ps(acc[rr][i]);
            if (bias)
                s += bias[r + rr];
            float *yo = &y[(size_t)i * (size_t)n + (size_t)(r + rr)];
            *yo = accumulate ? *yo + s : s;
        }
    }
}

INLINE void gemv_range(float *y, const float *x, const float *w, const float *bias, int n, int k,
                       int r0, int r1, const int M, const int R, int accumulate)
{
    int r = r0;
    for (; r + R <= r1; r += R)
        gemv_block(y, x, w, bias, n, k, r, M, R, accumulate);
    for (; r < r1; r++)
        gemv_block(y, x, w, bias, n, k, r, M, 1, accumulate);
}

void kvf_cpu_gemv_rows_avx512(float *y, const float *x, const float *w, const float *bias, int m,
                              int n, int k, int r0, int r1, int accumulate)
{
    switch (m) {
    case 1: gemv_range(y, x, w, bias, n, k, r0, r1, 1, 4, accumulate); break;
    case 2: gemv_range(y, x, w, bias, n, k, r0, r1, 2, 4, accumulate); break;
    case 3: gemv_range(y, x, w, bias, n, k, r0, r1, 3, 2, accumulate); break;
    case 4: gemv_range(y, x, w, bias, n, k, r0, r1, 4, 2, accumulate); break;
    case 5: gemv_range(y, x, w, bias, n, k, r0, r1, 5, 2, accumulate); break;
    case 6: gemv_range(y, x, w, bias, n, k, r0, r1, 6, 2, accumulate); break;
    case 7: gemv_range(y, x, w, bias, n, k, r0, r1, 7, 2, accumulate); break;
    case 8: gemv_range(y, x, w, bias, n, k, r0, r1, 8, 2, accumulate); break;
    default: kvf_cpu_gemv_rows(y, x, w, bias, m, n, k, r0, r1, accumulate); break;
    }
}

void kvf_cpu_swiglu_row_avx512(float *out, const float *gate, const float *up, int n)
{
    for (int i = 0; i < n; i += 16) {
        __mmask16 mk = tail_mask(n - i);
        __m512 g = _mm512_maskz_loadu_ps(mk, gate + i);
        __m512 u = _mm512_maskz_loadu_ps(mk, up + i);
        __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
        __m512 silu = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_mask_storeu_ps(out + i, mk, _mm512_mul_ps(silu, u));
    }
}

/* a(hd) = alpha * a + sum_j p[j] * V[j], NC = hd / 16 chunks in registers.
 * Even and odd keys go to separate accumulators: two FMA chains per chunk
 * instead of one, so the loop is not bound by FMA latency. */
INLINE void pv_regs(float *a, const float *V, const float *p, int cr, int hd, float alpha,
                    const int NC)
{
    __m512 acc[8], acc2[8]; /* NC <= 8; fixed size so they stay in registers */
    __m512 al = _mm512_set1_ps(alpha);
    _Pragma("GCC unroll 16") for (int c = 0; c < NC; c++)
    {
        acc[c] = _mm512_mul_ps(al, _mm512_loadu_ps(a + 16 * c));
        acc2[c] = _mm512_setzero_ps();
    }
    int j = 0;
    for (; j + 2 <= cr; j += 2) {
        __m512 p0 = _mm512_set1_ps(p[j]), p1 = _mm512_set1_ps(p[j + 1]);
        const float *v0 = V + (size_t)j * (size_t)hd, *v1 = v0 + hd;
        _Pragma("GCC unroll 16") for (int c = 0; c < NC; c++)
        {
            acc[c] = _mm512_fmadd_ps(p0, _mm512_loadu_ps(v0 + 16 * c), acc[c]);
            acc2[c] = _mm512_fmadd_ps(p1, _mm512_loadu_ps(v1 + 16 * c), acc2[c]);
        }
    }
    if (j < cr) {
        __m512 p0 = _mm512_set1_ps(p[j]);
        const float *v0 = V + (size_t)j * (size_t)hd;
        _Pragma("GCC unroll 16") for (int c = 0; c < NC; c++)
            acc[c] = _mm512_fmadd_ps(p0, _mm512_loadu_ps(v0 + 16 * c), acc[c]);
    }
    _Pragma("GCC unroll 16") for (int c = 0; c < NC; c++)
        _mm512_storeu_ps(a + 16 * c, _mm512_add_ps(acc[c], acc2[c]));
}

static void pv_any(float *a, const float *V, const float *p, int cr, int hd, float alpha)
{
    switch (hd) {
    case 16: pv_regs(a, V, p, cr, hd, alpha, 1); return;
    case 32: pv_regs(a, V, p, cr, hd, alpha, 2); return;
    case 64: pv_regs(a, V, p, cr, hd, alpha, 4); return;
    case 128: pv_regs(a, V, p, cr, hd, alpha, 8); return;
    default: break;
    }
    __m512 al = _mm512_set1_ps(alpha);
    for (int c = 0; c < hd; c += 16) {
        __mmask16 mk = tail_mask(hd - c);
        __m512 acc = _mm512_mul_ps(al, _mm512_maskz_loadu_ps(mk, a + c));
        for (int j = 0; j < cr; j++)
            acc = _mm512_fmadd_ps(_mm512_set1_ps(p[j]),
                                  _mm512_maskz_loadu_ps(mk, V + (size_t)j * (size_t)hd + c), acc);
        _mm512_mask_storeu_ps(a + c, mk, acc);
    }
}

/* q · k over hd elements. */
INLINE float dot_hd(const float *q, const float *k, int hd)
{
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int c = 0;
    for (; c + 32 <= hd; c += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + c), _mm512_loadu_ps(k + c), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(q + c + 16), _mm512_loadu_ps(k + c + 16), s1);
    }
    for (; c < hd; c += 16) {
        __mmask16 mk = tail_mask(hd - c);
        s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, q + c), _mm512_maskz_loadu_ps(mk, k + c),
                             s0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

void kvf_cpu_attention_tile_avx512(const kvf_cpu_attn_tile_t *t, float *scratch)
{
    const int hd = t->head_dim, bs = t->block_size, rows = t->n_tok * t->group;
    const int bsp = (bs + 15) & ~15;
    float *mx = scratch;                        /* (rows) running max */
    float *sum = mx + rows;                     /* (rows) running denominator */
    float *acc = sum + rows;                    /* (rows, hd) running numerator */
    float *S = acc + (size_t)rows * (size_t)hd; /* (rows, bsp) scores, then weights */
    float *Kt = S + (size_t)rows * (size_t)bsp; /* (hd, bsp) keys of a block, transposed */
    /* With many rows per block, transposing K once lets every row compute
     * 16 scores per FMA chain; with few, per-key dot products are cheaper. */
    const int transpose = rows >= 8;
    int max_pos = 0;
    for (int i = 0; i < t->n_tok; i++)
        max_pos = t->pos[i] > max_pos ? t->pos[i] : max_pos;
    for (int r = 0; r < rows; r++) {
        mx[r] = -INFINITY;
        sum[r] = 0;
    }
    memset(acc, 0, (size_t)rows * (size_t)hd * sizeof(float));
    const int n_blocks = max_pos / bs + 1;
    const __m512 scale = _mm512_set1_ps(t->scale);
    for (int b = 0; b < n_blocks; b++) {
        const float *K = t->keys[b], *V = t->values[b];
        const int j0 = b * bs;
        int cb = max_pos - j0 + 1;
        cb = cb > bs ? bs : cb;
        if (transpose) {
            int cbp = (cb + 15) & ~15;
            for (int d = 0; d < hd; d++) {
                float *kt = Kt + (size_t)d * (size_t)bsp;
                for (int j = 0; j < cb; j++)
                    kt[j] = K[(size_t)j * (size_t)hd + d];
                for (int j = cb; j < cbp; j++)
                    kt[j] = 0;
            }
        }
        for (int i = 0; i < t->n_tok; i++) {
            int cr = t->pos[i] - j0 + 1;
            if (cr <= 0)
                continue;
            cr = cr > bs ? bs : cr;
            for (int h = 0; h < t->group; h++) {
                const int r = i * t->group + h;
                const float *q = t->q + (size_t)i * (size_t)t->ld_q + (size_t)h * (size_t)hd;
                float *s = S + (size_t)r * (size_t)bsp;
                if (transpose) {
                    for (int j = 0; j < cr; j += 16) {
                        const float *kt = Kt + j;
                        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
                        __m512 a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
                        __m512 a4 = _mm512_setzero_ps(), a5 = _mm512_setzero_ps();
                        __m512 a6 = _mm512_setzero_ps(), a7 = _mm512_setzero_ps();
                        int d = 0;
                        for (; d + 8 <= hd; d += 8) {
                            a0 = _mm512_fmadd_ps(_mm512_set1_ps(q[d]),
                                                 _mm512_loadu_ps(kt + (size_t)d * bsp), a0);
                            a1 = _mm512_fmadd_ps(_mm512_set1_ps(q[d + 1]),
                                                 _mm512_loadu_ps(kt + (size_t)(d + 1) * bsp), a1);
                            a2 = _mm512_fmadd_ps(_mm512_set1_ps(q[d + 2]),
                                                 _mm512_loadu_ps(kt + (size_t)(d + 2) * bsp), a2);
                            a3 = _mm512_fmadd_ps(_mm512_set1_ps(q[d + 3]),
                                                 _mm512_loadu_ps(kt + (size_t)(d + 3) * bsp), a3);
                            a4 = _mm512_fmadd_ps(_mm512_set1_ps(q[d + 4]),
                                                 _mm512_loadu_ps(kt + (size_t)(d + 4) * bsp), a4);
                            a5 = _mm512_fmadd_ps(_mm512_set1_ps(q[d + 5]),
                                                 _mm512_loadu_ps(kt + (size_t)(d + 5) * bsp), a5);
                            a6 = _mm512_fmadd_ps(_mm512_set1_ps(q[d + 6]),
                                                 _mm512_loadu_ps(kt + (size_t)(d + 6) * bsp), a6);
                            a7 = _mm512_fmadd_ps(_mm512_set1_ps(q[d + 7]),
                                                 _mm512_loadu_ps(kt + (size_t)(d + 7) * bsp), a7);
                        }
                        a0 = _mm512_add_ps(a0, a4);
                        a1 = _mm512_add_ps(a1, a5);
                        a2 = _mm512_add_ps(a2, a6);
                        a3 = _mm512_add_ps(a3, a7);
                        for (; d + 4 <= hd; d += 4) {
                            a0 = _mm512_fmadd_ps(_mm512_set1_ps(q[d]),
                                                 _mm512_loadu_ps(kt + (size_t)d * bsp), a0);
                            a1 = _mm512_fmadd_ps(_mm512_set1_ps(q[d + 1]),
                                                 _mm512_loadu_ps(kt + (size_t)(d + 1) * bsp), a1);
                            a2 = _mm512_fmadd_ps(_mm512_set1_ps(q[d + 2]),
                                                 _mm512_loadu_ps(kt + (size_t)(d + 2) * bsp), a2);
                            a3 = _mm512_fmadd_ps(_mm512_set1_ps(q[d + 3]),
                                                 _mm512_loadu_ps(kt + (size_t)(d + 3) * bsp), a3);
                        }
                        for (; d < hd; d++)
                            a0 = _mm512_fmadd_ps(_mm512_set1_ps(q[d]),
                                                 _mm512_loadu_ps(kt + (size_t)d * bsp), a0);
                        __m512 v = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
                        _mm512_storeu_ps(s + j, _mm512_mul_ps(v, scale));
                    }
                } else {
                    for (int j = 0; j < cr; j++)
                        s[j] = dot_hd(q, K + (size_t)j * (size_t)hd, hd) * t->scale;
                }
                __m512 vmax = _mm512_set1_ps(-INFINITY);
                for (int j = 0; j < cr; j += 16)
                    vmax = _mm512_mask_max_ps(vmax, tail_mask(cr - j), vmax,
                                              _mm512_loadu_ps(s + j));
                float mb = _mm512_reduce_max_ps(vmax);
                float mnew = mb > mx[r] ? mb : mx[r];
                float alpha = expf(mx[r] - mnew);
                __m512 vm = _mm512_set1_ps(mnew), vsum = _mm512_setzero_ps();
                for (int j = 0; j < cr; j += 16) {
                    __mmask16 mk = tail_mask(cr - j);
                    __m512 p = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + j), vm));
                    p = _mm512_maskz_mov_ps(mk, p);
                    vsum = _mm512_add_ps(vsum, p);
                    _mm512_storeu_ps(s + j, p);
                }
                sum[r] = sum[r] * alpha + _mm512_reduce_add_ps(vsum);
                mx[r] = mnew;
                pv_any(acc + (size_t)r * (size_t)hd, V, s, cr, hd, alpha);
            }
        }
    }
    for (int i = 0; i < t->n_tok; i++) {
        for (int h = 0; h < t->group; h++) {
            const int r = i * t->group + h;
            float *o = t->out + (size_t)i * (size_t)t->ld_out + (size_t)h * (size_t)hd;
            const float *a = acc + (size_t)r * (size_t)hd;
            __m512 inv = _mm512_set1_ps(1.0f / sum[r]);
            for (int c = 0; c < hd; c += 16) {
                __mmask16 mk = tail_mask(hd - c);
                _mm512_mask_storeu_ps(o + c, mk, _mm512_mul_ps(inv, _mm512_maskz_loadu_ps(mk, a + c)));
            }
        }
    }
}
#pragma GCC pop_options
#else
#include "cpu_kernels.h"
/* Not an x86-64 GCC/Clang build: the portable kernels stand in. */
void kvf_cpu_gemv_rows_avx512(float *y, const float *x, const float *w, const float *bias, int m,
                              int n, int k, int r0, int r1, int accumulate)
{
    kvf_cpu_gemv_rows(y, x, w, bias, m, n, k, r0, r1, accumulate);
}
void kvf_cpu_swiglu_row_avx512(float *out, const float *gate, const float *up, int n)
{
    kvf_cpu_swiglu_row(out, gate, up, n);
}
void kvf_cpu_attention_tile_avx512(const kvf_cpu_attn_tile_t *t, float *scratch)
{
    kvf_cpu_attention_tile(t, scratch);
}
#endif
