/* The CPU kernels written once over a vector of VL floats, included by
 * cpu_kernels_avx2.c and cpu_kernels_avx512.c after they define:
 *
 *   vf, VL               the vector type and its lanes (8 or 16)
 *   V_ZERO() V_SET1(x) V_LOAD(p) V_STORE(p, v) V_ADD V_SUB V_MUL V_NEG
 *   V_FMA(a, b, c)       a * b + c, one rounding
 *   V_MAXF V_MINF        max/min (non-NaN inputs)
 *   V_EXP2I(n)           2^n for integral n in [-126, 127]
 *   V_ROUND(x)           round to nearest even
 *   V_LOAD_BF16(p) V_LOAD_F16(p)   VL 16-bit weights widened exactly
 *   DOT16(q, k, hd)      the canonical head_dim dot product
 *   DOT16X16(q, k, hd, out)  the same for 16 key rows k[0..15] at once
 *   SMALL_M SMALL_P(m)   batches of m <= SMALL_M rows: tiles of
 *                        SMALL_P(m) panels x all rows
 *   BIG_MR BIG_P BIG_NV  larger batches: tiles of BIG_MR rows x BIG_P
 *                        panels x BIG_NV vectors of each panel
 *   KFN(name)            the instruction set's name for a kernel
 *   KFN(decode_row)      its kvf_cpu_decode_fn (defined before this header)
 *   ISA_ID SMALL_PANELS_PER_TASK   for its kvf_cpu_kernels_t, which this
 *                        defines as KFN(kvf_cpu_kernels)
 *
 * Everything here follows the canonical order of cpu_kernels.h; the
 * arithmetic is what cpu_kernels_scalar.c does, one vector lane per
 * output element. */

#define INLINE static inline __attribute__((always_inline))
#define PV (KVF_CPU_PANEL / VL)

/* The gemm scratch holds two widened panels; the register arrays hold the
 * largest tiles the instruction set asks for. */
_Static_assert(BIG_P <= 2, "KVF_CPU_GEMM_SCRATCH_FLOATS holds two panels");
_Static_assert(BIG_MR * BIG_P * BIG_NV <= TILE_ACC_MAX, "big tile accumulators");
_Static_assert(BIG_P * BIG_NV <= TILE_W_MAX, "big tile weight vectors");
_Static_assert(SMALL_M * SMALL_P(SMALL_M) * PV <= TILE_ACC_MAX, "small tile accumulators");
_Static_assert(SMALL_P(1) * PV <= TILE_W_MAX, "small tile weight vectors");
_Static_assert(PV % BIG_NV == 0, "half panels");

/* ---- exp and swiglu (cpu_canon.h, lane by lane) ---------------------- */

INLINE vf v_exp(vf x)
{
    x = V_MAXF(x, V_SET1(KVF_EXP_LO));
    x = V_MINF(x, V_SET1(KVF_EXP_HI));
    vf n = V_ROUND(V_MUL(x, V_SET1(KVF_EXP_LOG2E)));
    vf nn = V_NEG(n);
    vf r = V_FMA(nn, V_SET1(KVF_EXP_LN2_HI), x);
    r = V_FMA(nn, V_SET1(KVF_EXP_LN2_LO), r);
    vf p = V_SET1(KVF_EXP_C7);
    p = V_FMA(p, r, V_SET1(KVF_EXP_C6));
    p = V_FMA(p, r, V_SET1(KVF_EXP_C5));
    p = V_FMA(p, r, V_SET1(KVF_EXP_C4));
    p = V_FMA(p, r, V_SET1(KVF_EXP_C3));
    p = V_FMA(p, r, V_SET1(KVF_EXP_C2));
    p = V_FMA(p, r, V_SET1(1.0f));
    p = V_FMA(p, r, V_SET1(1.0f));
    return V_MUL(p, V_EXP2I(n));
}

static void KFN(swiglu_row)(float *out, const float *gate, const float *up, int n)
{
    int i = 0;
    for (; i + VL <= n; i += VL) {
        vf g = V_LOAD(gate + i);
        vf e = v_exp(V_NEG(g));
        vf silu = V_DIV(g, V_ADD(V_SET1(1.0f), e));
        V_STORE(out + i, V_MUL(silu, V_LOAD(up + i)));
    }
    for (; i < n; i++)
        out[i] = kvf_cpu_swiglu1(gate[i], up[i]);
}

/* ---- matmul ---------------------------------------------------------- */

INLINE vf load_w(const void *base, size_t i, const int DT)
{
    if (DT == KVF_DTYPE_BF16)
        return V_LOAD_BF16((const uint16_t *)base + i);
    if (DT == KVF_DTYPE_F16)
        return V_LOAD_F16((const uint16_t *)base + i);
    return V_LOAD((const float *)base + i);
}

/* y for rows i0..i0+MR and vectors V0..V0+NV of panels p..p+P. Each lane
 * is one output element's FMA chain over d = 0..k-1. */
INLINE void tile(const kvf_cpu_gemm_t *g, const void *wdata, int pdata, int i0, int p, int V0,
                 const int MR, const int P, const int NV, const int DT)
{
    const kvf_cpu_packed_t *w = g->w;
    const int k = w->k, n = w->n;
    const size_t pstride = (size_t)k * KVF_CPU_PANEL;
    vf acc[TILE_ACC_MAX];
    _Pragma("GCC unroll 32") for (int a = 0; a < MR * P * NV; a++) acc[a] = V_ZERO();
    const float *x = g->x + (size_t)i0 * (size_t)k;
    size_t wi = (size_t)pdata * pstride + (size_t)V0 * VL; /* panel p is pdata in wdata */
    for (int d = 0; d < k; d++, wi += KVF_CPU_PANEL) {
        vf wv[TILE_W_MAX];
        _Pragma("GCC unroll 16") for (int pp = 0; pp < P; pp++)
            _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++)
                wv[pp * NV + v] = load_w(wdata, wi + (size_t)pp * pstride + (size_t)v * VL, DT);
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {
            vf xb = V_SET1(x[(size_t)i * (size_t)k + d]);
            _Pragma("GCC unroll 16") for (int a = 0; a < P * NV; a++)
                acc[i * P * NV + a] = V_FMA(xb, wv[a], acc[i * P * NV + a]);
        }
    }
    /* + bias, + y: per element, as the scalar kernel does. */
    _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++)
        _Pragma("GCC unroll 16") for (int pp = 0; pp < P; pp++) {
            float tmp[KVF_CPU_PANEL];
            _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++)
                V_STORE(tmp + v * VL, acc[(i * P + pp) * NV + v]);
            int c0 = (p + pp) * KVF_CPU_PANEL + V0 * VL;
            int nc = n - c0 < NV * VL ? n - c0 : NV * VL;
            float *y = g->y + (size_t)(i0 + i) * (size_t)n + c0;
            for (int c = 0; c < nc; c++) {
                float s = tmp[c];
                if (g->bias)
                    s = s + g->bias[c0 + c];
                y[c] = g->accumulate ? y[c] + s : s;
            }
        }
}

#define SMALL_CASE(M)                                                                              \
    case M:                                                                                        \
        if (P == SMALL_P(M))                                                                       \
            tile(g, g->w->data, p, 0, p, 0, M, SMALL_P(M), PV, DT);                                \
        else                                                                                       \
            tile(g, g->w->data, p, 0, p, 0, M, 1, PV, DT);                                         \
        break;
#define BIG_CASE(M)                                                                                \
    case M:                                                                                        \
        if (P == BIG_P)                                                                            \
            tile(g, wf, 0, i0, p, v0, M, BIG_P, BIG_NV, KVF_DTYPE_F32);                            \
        else                                                                                       \
            tile(g, wf, 0, i0, p, v0, M, 1, BIG_NV, KVF_DTYPE_F32);                                \
        break;

INLINE void gemm_dt(const kvf_cpu_gemm_t *g, int p0, int p1, float *scratch, const int DT)
{
    const int m = g->m;
    if (m <= SMALL_M) {
        for (int p = p0; p < p1;) {
            const int P = p1 - p >= SMALL_P(m) ? SMALL_P(m) : 1;
            switch (m) { SMALL_CASES }
            p += P;
        }
        return;
    }
    /* Panels outer, rows inner: a tile's panels stay in cache while every
     * row block passes over them. 16-bit panels are widened (exactly) into
     * scratch once for all the row blocks. */
    const size_t pstride = (size_t)g->w->k * KVF_CPU_PANEL;
    for (int p = p0; p < p1;) {
        const int P = p1 - p >= BIG_P ? BIG_P : 1;
        const float *wf = (const float *)g->w->data + (size_t)p * pstride;
        if (DT != KVF_DTYPE_F32) {
            const size_t e0 = (size_t)p * pstride, ne = (size_t)P * pstride;
            for (size_t e = 0; e < ne; e += VL)
                V_STORE(scratch + e, load_w(g->w->data, e0 + e, DT));
            wf = scratch;
        }
        /* Row blocks of equal height (8 rows: 4 + 4, not 6 + 2). */
        const int nb = (m + BIG_MR - 1) / BIG_MR, h = (m + nb - 1) / nb;
        for (int v0 = 0; v0 < PV; v0 += BIG_NV)
            for (int i0 = 0; i0 < m; i0 += h) {
                const int mr = m - i0 < h ? m - i0 : h;
                switch (mr) { BIG_CASES }
            }
        p += P;
    }
}

static void KFN(gemm)(const kvf_cpu_gemm_t *g, int p0, int p1, float *scratch)
{
    switch (g->w->dtype) {
    case KVF_DTYPE_BF16: gemm_dt(g, p0, p1, scratch, KVF_DTYPE_BF16); break;
    case KVF_DTYPE_F16: gemm_dt(g, p0, p1, scratch, KVF_DTYPE_F16); break;
    default: gemm_dt(g, p0, p1, scratch, KVF_DTYPE_F32); break;
    }
}

/* ---- attention ------------------------------------------------------- */

/* acc(hd) = acc * alpha, then acc = fma(p[j], v_j, acc) for j < nj, for
 * NR (1 or 2) rows at once: each value vector is loaded once for both
 * rows, and the rows' FMA chains (each in its canonical key order)
 * interleave, so their latencies overlap. */
INLINE void pv_rows(float *const *acc, const float *const *vrows, const float *const *p, int nj,
                    int hd, const float *alpha, const int NR)
{
    int c = 0;
    for (; c + 4 * VL <= hd; c += 4 * VL) {
        vf a[2][4];
        _Pragma("GCC unroll 2") for (int r = 0; r < NR; r++) {
            const vf al = V_SET1(alpha[r]);
            _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++)
                a[r][u] = V_MUL(V_LOAD(acc[r] + c + u * VL), al);
        }
        for (int j = 0; j < nj; j++) {
            const float *v = vrows[j] + c;
            const vf v0 = V_LOAD(v), v1 = V_LOAD(v + VL), v2 = V_LOAD(v + 2 * VL),
                     v3 = V_LOAD(v + 3 * VL);
            _Pragma("GCC unroll 2") for (int r = 0; r < NR; r++) {
                const vf pj = V_SET1(p[r][j]);
                a[r][0] = V_FMA(pj, v0, a[r][0]);
                a[r][1] = V_FMA(pj, v1, a[r][1]);
                a[r][2] = V_FMA(pj, v2, a[r][2]);
                a[r][3] = V_FMA(pj, v3, a[r][3]);
            }
        }
        _Pragma("GCC unroll 2") for (int r = 0; r < NR; r++)
            _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++)
                V_STORE(acc[r] + c + u * VL, a[r][u]);
    }
    for (; c + VL <= hd; c += VL)
        _Pragma("GCC unroll 2") for (int r = 0; r < NR; r++) {
            vf a0 = V_MUL(V_LOAD(acc[r] + c), V_SET1(alpha[r]));
            for (int j = 0; j < nj; j++)
                a0 = V_FMA(V_SET1(p[r][j]), V_LOAD(vrows[j] + c), a0);
            V_STORE(acc[r] + c, a0);
        }
    for (; c < hd; c++)
        for (int r = 0; r < NR; r++) {
            float a = acc[r][c] * alpha[r];
            for (int j = 0; j < nj; j++)
                a = fmaf(p[r][j], vrows[j][c], a);
            acc[r][c] = a;
        }
}

/* The scores of a query row over keys j0+ja .. j0+nj-1 and the online-
 * softmax step on its running max and sum: p (16, zero outside ja..nj)
 * and the factor alpha its numerator must be scaled by. */
INLINE void softmax_step(const kvf_cpu_attn_tile_t *t, const float *q, float *m_p, float *l_p,
                         const float *const *krows, int hd, int ja, int nj, float *p,
                         float *alpha_p)
{
    float s[KVF_CPU_KEY_CHUNK];
    float mc = -INFINITY;
    if (nj == KVF_CPU_KEY_CHUNK || nj > 4) {
        DOT16X16(q, krows, hd, s);
        for (int j = 0; j < KVF_CPU_KEY_CHUNK; j += VL)
            V_STORE(s + j, V_MUL(V_LOAD(s + j), V_SET1(t->scale)));
    } else {
        for (int j = 0; j < nj; j++)
            s[j] = DOT16(q, krows[j], hd) * t->scale;
    }
    if (t->softcap > 0)
        for (int j = ja; j < nj; j++)
            s[j] = kvf_det_softcap(s[j], t->softcap);
    for (int j = ja; j < nj; j++)
        mc = s[j] > mc ? s[j] : mc;
    const float mn = mc > *m_p ? mc : *m_p;
    const float alpha = kvf_cpu_rescale(*m_p, mn);
    for (int j = 0; j < ja; j++)
        s[j] = mn;
    for (int j = nj; j < KVF_CPU_KEY_CHUNK; j++)
        s[j] = mn;
    const vf vm = V_SET1(mn);
    for (int j = 0; j < KVF_CPU_KEY_CHUNK; j += VL)
        V_STORE(p + j, v_exp(V_SUB(V_LOAD(s + j), vm)));
    for (int j = 0; j < ja; j++)
        p[j] = 0;
    for (int j = nj; j < KVF_CPU_KEY_CHUNK; j++)
        p[j] = 0;
    *l_p = *l_p * alpha + kvf_cpu_tree16(p);
    *m_p = mn;
    *alpha_p = alpha;
}

static void KFN(attention)(const kvf_cpu_attn_tile_t *t, float *scratch)
{
    const int hd = t->head_dim, rows = t->n_tok * t->group;
    const kvf_cpu_attn_scratch_t sc = kvf_cpu_attn_scratch(scratch, hd, rows);
    for (int r = 0; r < rows; r++) {
        sc.m[r] = -INFINITY;
        sc.l[r] = 0;
    }
    memset(sc.acc, 0, (size_t)rows * (size_t)sc.hdp * sizeof(float));
    int first, last;
    kvf_cpu_attn_span(t, &first, &last);
    kvf_cpu_attn_prefetch(t, first, last);
    for (int j0 = first; j0 <= last; j0 += KVF_CPU_KEY_CHUNK) {
        const float *krows[KVF_CPU_KEY_CHUNK], *vrows[KVF_CPU_KEY_CHUNK];
        const int n = last - j0 + 1 < KVF_CPU_KEY_CHUNK ? last - j0 + 1 : KVF_CPU_KEY_CHUNK;
        /* the next chunk's rows arrive while this one computes */
        kvf_cpu_attn_prefetch(t, j0 + KVF_CPU_KEY_CHUNK, last);
        kvf_cpu_attn_chunk_rows(t, j0, n, KFN(decode_row), &sc, krows, vrows);
        for (int i = 0; i < t->n_tok; i++) {
            const int pos = t->pos[i], lo = kvf_cpu_attn_first_key(t->window, pos);
            if (j0 > pos || j0 + KVF_CPU_KEY_CHUNK <= lo)
                continue;
            const int nj = pos - j0 + 1 < KVF_CPU_KEY_CHUNK ? pos - j0 + 1 : KVF_CPU_KEY_CHUNK;
            const int ja = lo > j0 ? lo - j0 : 0; /* keys before the window's first */
            /* the token's query heads two at a time */
            for (int h = 0; h < t->group; h += 2) {
                const int nr = t->group - h < 2 ? 1 : 2;
                float pbuf[2][KVF_CPU_KEY_CHUNK], alpha[2];
                float *acc[2];
                const float *pr[2] = {pbuf[0], pbuf[1]};
                for (int u = 0; u < nr; u++) {
                    const int r = i * t->group + h + u;
                    const float *q =
                        t->q + (size_t)i * (size_t)t->ld_q + (size_t)(h + u) * (size_t)hd;
                    softmax_step(t, q, &sc.m[r], &sc.l[r], krows, hd, ja, nj, pbuf[u], &alpha[u]);
                    acc[u] = sc.acc + (size_t)r * sc.hdp;
                }
                if (nr == 2)
                    pv_rows(acc, vrows, pr, nj, hd, alpha, 2);
                else
                    pv_rows(acc, vrows, pr, nj, hd, alpha, 1);
            }
        }
    }
    for (int i = 0; i < t->n_tok; i++)
        for (int h = 0; h < t->group; h++) {
            const int r = i * t->group + h;
            const float inv = 1.0f / sc.l[r], *acc = sc.acc + (size_t)r * sc.hdp;
            float *o = t->out + (size_t)i * (size_t)t->ld_out + (size_t)h * (size_t)hd;
            int c = 0;
            for (; c + VL <= hd; c += VL)
                V_STORE(o + c, V_MUL(V_LOAD(acc + c), V_SET1(inv)));
            for (; c < hd; c++)
                o[c] = acc[c] * inv;
        }
}

const kvf_cpu_kernels_t KFN(kvf_cpu_kernels) = {
    .isa = ISA_ID,
    .small_panels_per_task = SMALL_PANELS_PER_TASK,
    .small_m = SMALL_M,
    .gemm = KFN(gemm),
    .swiglu_row = KFN(swiglu_row),
    .attention = KFN(attention),
    .decode_row = KFN(decode_row),
};
