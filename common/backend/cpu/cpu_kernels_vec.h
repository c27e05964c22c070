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
 *   DOT16X16S(q, base, ld, hd, out)  the same for the 16 key rows base + j * ld
 *   HMAX16(s, ja, nj)    the largest of s[ja..nj-1] (NaN ignored; -inf if none)
 *   TREE16P(p)           cpu_canon.h's 16-lane tree of p[0..15]
 *   V_LOAD_KV(dt, row, i, sv), KV_FUSED   where defined: VL exactly decoded
 *                        elements of a KV row, sv its kvf_cpu_kv_factor
 *                        (value rows then stay in the pool); with them
 *                        V_LOAD_I8(row, i): VL int8 elements as floats
 *   I8SCORES2(...)       where defined: kvf_cpu_i8_scores2_ref's values
 *                        (int8 pools' scores) over the 16 rows base + j *
 *                        head_dim, prefetching as DOT2X16
 *   SMALL_M SMALL_P(m)   batches of m <= SMALL_M rows: tiles of
 *                        SMALL_P(m) panels x all rows
 *   BIG_MR BIG_P BIG_NV  larger batches: tiles of BIG_MR rows x BIG_P
 *                        panels x BIG_NV vectors of each panel
 *   KFN(name)            the instruction set's name for a kernel
 *   DECODE_ROWS, KFN(decode_row)   without KV_FUSED: the rows decode and
 *                        its kvf_cpu_decode_fn (with it, defined here)
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

/* ---- KV rows decoded to f32 (with V_LOAD_KV) ------------------------- */

#if defined(KV_FUSED)
/* A row of n elements of DT with its scale: kvf/kv_format.h's values. */
INLINE void decode1(const void *src, float scale, int n, float *out, const kvf_kv_dtype_t DT)
{
    if (DT == KVF_KV_F32) {
        memcpy(out, src, (size_t)n * sizeof(float));
        return;
    }
    const vf sv = V_SET1(kvf_cpu_kv_factor(DT, scale));
    int i = 0;
    _Pragma("GCC unroll 16") for (; i + VL <= n; i += VL)
        V_STORE(out + i, V_LOAD_KV(DT, src, i, sv));
    for (; i < n; i++)
        out[i] = kvf_kv_decode_one(DT, src, i, scale);
}

/* Rows of a run, each with its scale (scales NULL: 1); DT a constant in
 * each copy. */
INLINE void decode_rows_dt(const void *src, const float *scales, int n_rows, int n, float *out,
                           int ld_out, const kvf_kv_dtype_t DT)
{
    const size_t row_bytes = (size_t)n * kvf_kv_elem_bytes(DT);
    for (int r = 0; r < n_rows; r++)
        decode1((const char *)src + (size_t)r * row_bytes, scales ? scales[r] : 1.0f, n,
                out + (size_t)r * (size_t)ld_out, DT);
}

INLINE void decode_rows(kvf_kv_dtype_t dt, const void *src, const float *scales, int n_rows,
                        int n, float *out, int ld_out)
{
    switch (dt) {
    case KVF_KV_BF16: decode_rows_dt(src, scales, n_rows, n, out, ld_out, KVF_KV_BF16); break;
    case KVF_KV_F16: decode_rows_dt(src, scales, n_rows, n, out, ld_out, KVF_KV_F16); break;
    case KVF_KV_FP8: decode_rows_dt(src, scales, n_rows, n, out, ld_out, KVF_KV_FP8); break;
    case KVF_KV_INT8: decode_rows_dt(src, scales, n_rows, n, out, ld_out, KVF_KV_INT8); break;
    default: decode_rows_dt(src, scales, n_rows, n, out, ld_out, KVF_KV_F32); break;
    }
}
#define DECODE_ROWS(dt, src, scales, n_rows, n, out, ld) \
    decode_rows((dt), (src), (scales), (n_rows), (n), (out), (ld))

static void KFN(decode_row)(kvf_kv_dtype_t dt, const void *src, const float *scales, int n_rows,
                            int n, float *out, int ld_out)
{
    decode_rows(dt, src, scales, n_rows, n, out, ld_out);
}
#endif

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

/* The value rows of an instruction set that decodes them in registers
 * (KV_FUSED) are the pool's; the others decode them into the scratch
 * first and read f32. */
#if defined(KV_FUSED)
#define PV_LOAD(DT, row, i, sv) \
    ((DT) == KVF_KV_INT8 ? V_LOAD_I8((row), (i)) : V_LOAD_KV((DT), (row), (i), (sv)))
#define PV_DECODE false
#else
#define PV_LOAD(DT, row, i, sv) ((void)(sv), V_LOAD((const float *)(row) + (i)))
#define PV_DECODE true
#endif

/* One side of a chunk's 16 keys: key j's row is base + j * stride bytes,
 * of format dt, with scale scales[j] (1 for an unscaled format). */
typedef struct {
    const char *base;
    size_t stride;
    const float *scales;
    kvf_kv_dtype_t dt;
} kv_side_t;

#define SIDE_ROW(sd, j) ((const void *)((sd)->base + (size_t)(j) * (sd)->stride))

/* acc(hd) = acc * alpha, then acc = fma(p[j], v_j, acc) for j < nj, for
 * NR (1 or 2) rows at once: each value vector is loaded (and decoded from
 * DT, exactly: kvf/kv_format.h's values) once for both rows, and the
 * rows' FMA chains (each in its canonical key order) interleave, so their
 * latencies overlap. int8 rows are read without their scales, which the
 * caller has multiplied into p (cpu_kernels.h). pf (NULL: none) gets pf_lines
 * lines a key: a value row's in the pool. */
INLINE void pv_rows(float *const *acc, const kv_side_t *v, const float *const *p, int nj, int hd,
                    const float *alpha, kvf_cpu_pf_stream_t *pf, int pf_lines, const int NR,
                    const kvf_kv_dtype_t DT)
{
    const float *vsc = v->scales;
    int c = 0;
    for (; c + 4 * VL <= hd; c += 4 * VL) {
        vf a[2][4];
        _Pragma("GCC unroll 2") for (int r = 0; r < NR; r++) {
            const vf al = V_SET1(alpha[r]);
            _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++)
                a[r][u] = V_MUL(V_LOAD(acc[r] + c + u * VL), al);
        }
        /* a pool value row's lines (pf_lines) a key, two keys' at a
         * time: the chunk's once */
        const bool take = pf && c == 0;
#define PV_KEY(j)                                                                                  \
    do {                                                                                           \
        const void *row = SIDE_ROW(v, (j));                                                        \
        const vf sv = V_SET1(kvf_cpu_kv_factor(DT, vsc[(j)]));                                     \
        const vf v0 = PV_LOAD(DT, row, c, sv), v1 = PV_LOAD(DT, row, c + VL, sv),                  \
                 v2 = PV_LOAD(DT, row, c + 2 * VL, sv), v3 = PV_LOAD(DT, row, c + 3 * VL, sv);     \
        _Pragma("GCC unroll 2") for (int r = 0; r < NR; r++) {                                     \
            const vf pj = V_SET1(p[r][(j)]);                                                       \
            a[r][0] = V_FMA(pj, v0, a[r][0]);                                                      \
            a[r][1] = V_FMA(pj, v1, a[r][1]);                                                      \
            a[r][2] = V_FMA(pj, v2, a[r][2]);                                                      \
            a[r][3] = V_FMA(pj, v3, a[r][3]);                                                      \
        }                                                                                          \
    } while (0)
        int j = 0;
        for (; j + 2 <= nj; j += 2) {
            if (take)
                kvf_cpu_pf_take(pf, 2 * pf_lines);
            PV_KEY(j);
            PV_KEY(j + 1);
        }
        if (j < nj) {
            if (take)
                kvf_cpu_pf_take(pf, pf_lines);
            PV_KEY(j);
        }
#undef PV_KEY
        _Pragma("GCC unroll 2") for (int r = 0; r < NR; r++)
            _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++)
                V_STORE(acc[r] + c + u * VL, a[r][u]);
    }
    for (; c + VL <= hd; c += VL)
        _Pragma("GCC unroll 2") for (int r = 0; r < NR; r++) {
            vf a0 = V_MUL(V_LOAD(acc[r] + c), V_SET1(alpha[r]));
            for (int j = 0; j < nj; j++)
                a0 = V_FMA(V_SET1(p[r][j]), PV_LOAD(DT, SIDE_ROW(v, j), c,
                                                    V_SET1(kvf_cpu_kv_factor(DT, vsc[j]))),
                           a0);
            V_STORE(acc[r] + c, a0);
        }
    for (; c < hd; c++)
        for (int r = 0; r < NR; r++) {
            float a = acc[r][c] * alpha[r];
            for (int j = 0; j < nj; j++)
                a = fmaf(p[r][j],
                         kvf_kv_decode_one(DT, SIDE_ROW(v, j), c,
                                           DT == KVF_KV_INT8 ? 1.0f : vsc[j]), a);
            acc[r][c] = a;
        }
}

/* pv_rows for the format dt of the value rows (a constant in each copy). */
INLINE void pv_rows_dt(float *const *acc, const kv_side_t *v, const float *const *p, int nj,
                       int hd, const float *alpha, kvf_cpu_pf_stream_t *pf, int pf_lines,
                       const int NR, kvf_kv_dtype_t dt)
{
#define PVR(DT) pv_rows(acc, v, p, nj, hd, alpha, pf, pf_lines, NR, DT)
    switch (dt) {
    case KVF_KV_BF16: PVR(KVF_KV_BF16); break;
    case KVF_KV_F16: PVR(KVF_KV_F16); break;
    case KVF_KV_FP8: PVR(KVF_KV_FP8); break;
    case KVF_KV_INT8: PVR(KVF_KV_INT8); break;
    default: PVR(KVF_KV_F32); break;
    }
#undef PVR
}

/* A query row's keys in the chunk at j0: ja .. nj-1 (ja > 0: keys before
 * the window's first); false when the row sees none. */
INLINE bool row_keys(const kvf_cpu_attn_tile_t *t, int i, int j0, int *ja_p, int *nj_p)
{
    const int pos = t->pos[i], lo = kvf_cpu_attn_first_key(t->window, pos);
    if (j0 > pos || j0 + KVF_CPU_KEY_CHUNK <= lo)
        return false;
    *nj_p = pos - j0 + 1 < KVF_CPU_KEY_CHUNK ? pos - j0 + 1 : KVF_CPU_KEY_CHUNK;
    *ja_p = lo > j0 ? lo - j0 : 0;
    return true;
}

/* p (16) from a chunk's scores s at running max mn: exp(s - mn) on keys
 * ja .. nj-1, zero elsewhere (s there set to mn first, so no lane sees an
 * unused score). */
INLINE void chunk_probs(float *s, int ja, int nj, float mn, float *p)
{
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
}

/* The online-softmax step of a row on its chunk scores s (16, keys ja ..
 * nj-1): its running max and sum updated, p (16, zero outside ja..nj)
 * and the factor alpha its numerator must be scaled by. */
INLINE void softmax_step(float *s, float *m_p, float *l_p, int ja, int nj, float *p,
                         float *alpha_p)
{
    const float mc = HMAX16(s, ja, nj);
    const float mn = mc > *m_p ? mc : *m_p;
    const float alpha = kvf_cpu_rescale(*m_p, mn);
    chunk_probs(s, ja, nj, mn, p);
    *l_p = *l_p * alpha + TREE16P(p);
    *m_p = mn;
    *alpha_p = alpha;
}

/* Scale 1 for each key of a chunk of an unscaled format. */
static const float kv_ones[KVF_CPU_KEY_CHUNK] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};

/* One side (kv 0: keys, 1: values) of the chunk at j0, keys j0 .. last.
 * A chunk inside one block (the usual case) stays in the pool, unless
 * decode asks for it in f32: then it is decoded into buf (16 rows of hdp
 * floats); its rows past last, in the block, are read but never used. A
 * chunk across blocks is decoded (f32: copied) into buf, run by run, its
 * rows past last copies of its first. */
INLINE kv_side_t chunk_side(const kvf_cpu_attn_tile_t *t, int j0, int last, int kv, bool decode,
                            float *buf, int hd, int hdp)
{
    const int bs = t->block_size;
    const int n = last - j0 + 1 < KVF_CPU_KEY_CHUNK ? last - j0 + 1 : KVF_CPU_KEY_CHUNK;
    const kvf_kv_dtype_t dt = t->dtype;
    const size_t row_bytes = (size_t)hd * kvf_kv_elem_bytes(dt);
    const bool scaled = kvf_kv_scaled(dt);
    const void *const *data = kv ? t->values : t->keys;
    /* int8 values are decoded without their scales (pv_rows) */
    const float *const *scales = kv ? (dt == KVF_KV_INT8 ? NULL : t->vscales) : t->kscales;
    const kv_side_t f32 = {(const char *)buf, (size_t)hdp * sizeof(float), kv_ones, KVF_KV_F32};
    int b = j0 / bs, r = j0 % bs;
    if (bs - r >= KVF_CPU_KEY_CHUNK) {
        const char *d = (const char *)data[b] + (size_t)r * row_bytes;
        const float *sc = scaled && scales ? scales[b] + r : NULL;
        if (dt == KVF_KV_F32 || !decode)
            return (kv_side_t){d, row_bytes, sc ? sc : kv_ones, dt};
        DECODE_ROWS(dt, d, sc, KVF_CPU_KEY_CHUNK, hd, buf, hdp);
        return f32;
    }
    for (int j = 0; j < n;) {
        const int run = bs - r < n - j ? bs - r : n - j; /* keys j.. in block b */
        DECODE_ROWS(dt, (const char *)data[b] + (size_t)r * row_bytes,
                    scaled && scales ? scales[b] + r : NULL, run, hd, buf + (size_t)j * hdp, hdp);
        j += run;
        b++;
        r = 0;
    }
    for (int j = n; j < KVF_CPU_KEY_CHUNK; j++)
        memcpy(buf + (size_t)j * hdp, buf, (size_t)hd * sizeof(float));
    return f32;
}

#if !defined(I8SCORES2)
/* kvf_cpu_i8_scores2_ref on the 16 rows base + j * hd, a chunk's rows
 * requested as DOT16X16S's are. */
INLINE void i8scores2_c(const int16_t *q0, float sq0, const int16_t *q1, float sq1,
                        const int8_t *base, const float *ks, int hd, float *o0, float *o1,
                        kvf_cpu_pf_stream_t *pf, int pf_n)
{
    const int8_t *rows[KVF_CPU_KEY_CHUNK];
    for (int j = 0; j < KVF_CPU_KEY_CHUNK; j++)
        rows[j] = base + (size_t)j * (size_t)hd;
    if (pf_n > 0)
        kvf_cpu_pf_take(pf, (hd + 7) / 8 * pf_n);
    kvf_cpu_i8_scores2_ref(q0, sq0, q1, sq1, rows, ks, hd, o0, o1);
}
#define I8SCORES2(q0, sq0, q1, sq1, rows, ks, hd, o0, o1, pf, pf_n) \
    i8scores2_c((q0), (sq0), (q1), (sq1), (rows), (ks), (hd), (o0), (o1), (pf), (pf_n))
#endif

/* Rows r0 .. of the scratch: tile t's query rows (token i, head h at r0 +
 * i * group + h) quantized for an int8 pool. */
INLINE void i8_quant_rows(const kvf_cpu_attn_tile_t *t, const kvf_cpu_attn_scratch_t *sc, int r0)
{
    for (int i = 0; i < t->n_tok; i++)
        for (int h = 0; h < t->group; h++) {
            const int r = r0 + i * t->group + h;
            kvf_cpu_i8_quant(t->q + (size_t)i * (size_t)t->ld_q + (size_t)h * (size_t)t->head_dim,
                             t->head_dim, sc->hdp, sc->qi + (size_t)r * sc->hdp, &sc->qs[r]);
        }
}

/* The scales of one side (0: keys, 1: values) of the int8 chunk at j0,
 * keys j0 .. last: the pool's own for a chunk inside one block (the usual
 * case), else gathered into sbuf (keys past last: the first's). rows, if
 * not NULL, gets the 16 rows alike. */
INLINE const float *i8_chunk_scales(const kvf_cpu_attn_tile_t *t, int side, int j0, int last,
                                    float *sbuf, const int8_t **rows)
{
    const int bs = t->block_size, b = j0 / bs, r = j0 % bs;
    const int8_t *rbuf[KVF_CPU_KEY_CHUNK];
    if (bs - r >= KVF_CPU_KEY_CHUNK && !rows)
        return (side ? t->vscales : t->kscales)[b] + r;
    const int n = last - j0 + 1 < KVF_CPU_KEY_CHUNK ? last - j0 + 1 : KVF_CPU_KEY_CHUNK;
    kvf_cpu_i8_rows(t, side, j0, n, rows ? rows : rbuf, sbuf);
    return sbuf;
}

/* The int8 keys of the chunk at j0, keys j0 .. last: key j's row at *base
 * + j * hd, its scale (*scales)[j]. A chunk inside one block (the usual
 * case) stays in the pool; one across blocks is copied into buf (16 rows)
 * and sbuf, rows past last copies of the first. */
INLINE void i8_chunk(const kvf_cpu_attn_tile_t *t, int j0, int last, int8_t *buf, float *sbuf,
                     const int8_t **base, const float **scales)
{
    const int bs = t->block_size, hd = t->head_dim, b = j0 / bs, r = j0 % bs;
    if (bs - r >= KVF_CPU_KEY_CHUNK) {
        *base = (const int8_t *)t->keys[b] + (size_t)r * (size_t)hd;
        *scales = t->kscales[b] + r;
        return;
    }
    const int8_t *rows[KVF_CPU_KEY_CHUNK];
    *scales = i8_chunk_scales(t, 0, j0, last, sbuf, rows);
    for (int j = 0; j < KVF_CPU_KEY_CHUNK; j++)
        memcpy(buf + (size_t)j * (size_t)hd, rows[j], (size_t)hd);
    *base = buf;
}

/* The unscaled scores of the group's rows rr .. rr+G-1 of the scratch over
 * the 16 int8 key rows base + j * head_dim (scales ks; i8_chunk), into S
 * (row h's 16 at S + h * lds), two query heads a pass. */
INLINE void i8_group_scores(const kvf_cpu_attn_tile_t *t, const int8_t *base, const float *ks,
                            const kvf_cpu_attn_scratch_t *sc, int rr, float *S, size_t lds,
                            kvf_cpu_pf_stream_t *pf, int pf_n, const int HD)
{
    const int G = t->group;
    float spare[KVF_CPU_KEY_CHUNK];
    for (int h = 0; h < G; h += 2) {
        const int16_t *q0 = sc->qi + (size_t)(rr + h) * sc->hdp;
        const bool two = h + 1 < G;
        I8SCORES2(q0, sc->qs[rr + h], two ? q0 + sc->hdp : q0, sc->qs[rr + (two ? h + 1 : h)],
                  base, ks, HD, S + (size_t)h * lds, two ? S + (size_t)(h + 1) * lds : spare, pf,
                  h == 0 ? pf_n : 0);
    }
}

/* p (rows of 16 at P + h * lds, h < n_rows) times the int8 value scales
 * of the chunk at j0 into W (the same layout): int8 values are read
 * without their scales. */
INLINE void i8_scale_p(const kvf_cpu_attn_tile_t *t, int j0, int last, const float *P, size_t lds,
                       int n_rows, float *W)
{
    float sbuf[KVF_CPU_KEY_CHUNK];
    const float *vs = i8_chunk_scales(t, 1, j0, last, sbuf, NULL);
    for (int h = 0; h < n_rows; h++)
        for (int j = 0; j < KVF_CPU_KEY_CHUNK; j += VL)
            V_STORE(W + (size_t)h * lds + j,
                    V_MUL(V_LOAD(P + (size_t)h * lds + j), V_LOAD(vs + j)));
}

/* The keys of the chunk at j0 (decoded into the scratch unless f32) and
 * every row's scaled (and soft-capped) scores over them, into s (rows x
 * 16, keys ja .. nj-1 of each row meaningful). */
INLINE void tile_scores(const kvf_cpu_attn_tile_t *t, int j0, int last,
                        const kvf_cpu_attn_scratch_t *sc, float *s, const int HD)
{
    if (t->dtype == KVF_KV_INT8) {
        const int8_t *base;
        const float *ks;
        float sbuf[KVF_CPU_KEY_CHUNK];
        i8_chunk(t, j0, last, (int8_t *)(void *)sc->kbuf, sbuf, &base, &ks);
        for (int i = 0; i < t->n_tok; i++) {
            int ja, nj;
            if (!row_keys(t, i, j0, &ja, &nj))
                continue;
            float *si = s + (size_t)i * t->group * KVF_CPU_KEY_CHUNK;
            i8_group_scores(t, base, ks, sc, i * t->group, si, KVF_CPU_KEY_CHUNK, NULL, 0, HD);
            for (int h = 0; h < t->group; h++) {
                float *sr = si + (size_t)h * KVF_CPU_KEY_CHUNK;
                for (int j = 0; j < KVF_CPU_KEY_CHUNK; j += VL)
                    V_STORE(sr + j, V_MUL(V_LOAD(sr + j), V_SET1(t->scale)));
                if (t->softcap > 0)
                    for (int j = ja; j < nj; j++)
                        sr[j] = kvf_det_softcap(sr[j], t->softcap);
            }
        }
        return;
    }
    const kv_side_t k = chunk_side(t, j0, last, 0, true, sc->kbuf, HD, sc->hdp);
    const float *kb = (const float *)(const void *)k.base;
    const size_t ld = k.stride / sizeof(float);
    for (int i = 0; i < t->n_tok; i++) {
        int ja, nj;
        if (!row_keys(t, i, j0, &ja, &nj))
            continue;
        for (int h = 0; h < t->group; h++) {
            const int r = i * t->group + h;
            const float *q = t->q + (size_t)i * (size_t)t->ld_q + (size_t)h * (size_t)HD;
            float *sr = s + (size_t)r * KVF_CPU_KEY_CHUNK;
            if (nj == KVF_CPU_KEY_CHUNK || nj > 4) {
                DOT16X16S(q, kb, ld, HD, sr);
                for (int j = 0; j < KVF_CPU_KEY_CHUNK; j += VL)
                    V_STORE(sr + j, V_MUL(V_LOAD(sr + j), V_SET1(t->scale)));
            } else {
                for (int j = 0; j < nj; j++)
                    sr[j] = DOT16(q, kb + (size_t)j * ld, HD) * t->scale;
            }
            if (t->softcap > 0)
                for (int j = ja; j < nj; j++)
                    sr[j] = kvf_det_softcap(sr[j], t->softcap);
        }
    }
}

/* Every row's softmax step on its scores s for the chunk at j0. */
INLINE void tile_softmax(const kvf_cpu_attn_tile_t *t, int j0, const kvf_cpu_attn_scratch_t *sc,
                         float *s)
{
    for (int i = 0; i < t->n_tok; i++) {
        int ja, nj;
        if (!row_keys(t, i, j0, &ja, &nj))
            continue;
        for (int h = 0; h < t->group; h++) {
            const int r = i * t->group + h;
            softmax_step(s + (size_t)r * KVF_CPU_KEY_CHUNK, &sc->m[r], &sc->l[r], ja, nj,
                         sc->p + (size_t)r * KVF_CPU_KEY_CHUNK, &sc->alpha[r]);
        }
    }
}

/* Every row's numerator over the values of the chunk at j0. */
INLINE void tile_pv(const kvf_cpu_attn_tile_t *t, int j0, int last,
                    const kvf_cpu_attn_scratch_t *sc, const int HD)
{
    const kv_side_t v = chunk_side(t, j0, last, 1, PV_DECODE, sc->vbuf, HD, sc->hdp);
    if (t->dtype == KVF_KV_INT8) /* p times the value scales, in place */
        i8_scale_p(t, j0, last, sc->p, KVF_CPU_KEY_CHUNK, t->n_tok * t->group, sc->p);
    for (int i = 0; i < t->n_tok; i++) {
        int ja, nj;
        if (!row_keys(t, i, j0, &ja, &nj))
            continue;
        /* the token's query heads two at a time */
        for (int h = 0; h < t->group; h += 2) {
            const int r = i * t->group + h, nr = t->group - h < 2 ? 1 : 2;
            float *acc[2] = {sc->acc + (size_t)r * sc->hdp, sc->acc + (size_t)(r + 1) * sc->hdp};
            const float *pr[2] = {sc->p + (size_t)r * KVF_CPU_KEY_CHUNK,
                                  sc->p + (size_t)(r + 1) * KVF_CPU_KEY_CHUNK};
            if (nr == 2)
                pv_rows_dt(acc, &v, pr, nj, HD, sc->alpha + r, NULL, 0, 2, v.dt);
            else
                pv_rows_dt(acc, &v, pr, nj, HD, sc->alpha + r, NULL, 0, 1, v.dt);
        }
    }
}

/* ---- decode: one query token ------------------------------------------
 *
 * A tile of one token (a decode step) takes KVF_CPU_DECODE_CHUNKS chunks
 * at a time through three phases: the scores of all of them (the keys of
 * each read once for the whole head group: with DOT2X16, decoded in
 * registers for two heads at once), then every row's softmax steps over
 * them, then their p·v. Each row's arithmetic is still cpu_kernels.h's,
 * chunk by chunk in order; only independent work is regrouped: the
 * chunk maxima, exps and sums no longer wait on the previous chunk's
 * step, so the one chain left per row (running max, sum) is short. */

/* The scores of the token's rows over the chunk at j0 into S (row r's
 * 16 at S + r * lds), scaled and soft-capped on keys ja .. nj-1. */
INLINE void dec_scores(const kvf_cpu_attn_tile_t *t, int j0, int last, int ja, int nj,
                       const kvf_cpu_attn_scratch_t *sc, float *S, int lds,
                       kvf_cpu_pf_stream_t *pf, int pf_n, const int HD)
{
    const int G = t->group;
    if (t->dtype == KVF_KV_INT8) {
        const int8_t *base;
        const float *ks;
        float sbuf[KVF_CPU_KEY_CHUNK];
        i8_chunk(t, j0, last, (int8_t *)(void *)sc->kbuf, sbuf, &base, &ks);
        i8_group_scores(t, base, ks, sc, 0, S, (size_t)lds, pf, pf_n, HD);
    } else
#if defined(DOT2X16)
    if (HD % 16 == 0) {
        const kv_side_t k = chunk_side(t, j0, last, 0, false, sc->kbuf, HD, sc->hdp);
        float spare[KVF_CPU_KEY_CHUNK];
        for (int h = 0; h < G; h += 2) {
            const float *q0 = t->q + (size_t)h * (size_t)HD;
            const float *q1 = h + 1 < G ? q0 + HD : q0;
            float *o1 = h + 1 < G ? S + (size_t)(h + 1) * (size_t)lds : spare;
            DOT2X16(k.dt, q0, q1, k.base, k.stride, k.scales, HD, S + (size_t)h * (size_t)lds, o1,
                    pf, h == 0 ? pf_n : 0);
        }
    } else
#endif
    {
        const kv_side_t k = chunk_side(t, j0, last, 0, true, sc->kbuf, HD, sc->hdp);
        const float *kb = (const float *)(const void *)k.base;
        const int lines = (HD + 7) / 8 * pf_n; /* a chunk's rows, spread over the heads */
        for (int h = 0; h < G; h++) {
            if (pf_n > 0)
                kvf_cpu_pf_take(pf, lines * (h + 1) / G - lines * h / G);
            DOT16X16S(t->q + (size_t)h * (size_t)HD, kb, k.stride / sizeof(float), HD,
                      S + (size_t)h * (size_t)lds);
        }
    }
    for (int h = 0; h < G; h++) {
        float *sr = S + (size_t)h * (size_t)lds;
        for (int j = 0; j < KVF_CPU_KEY_CHUNK; j += VL)
            V_STORE(sr + j, V_MUL(V_LOAD(sr + j), V_SET1(t->scale)));
        if (t->softcap > 0)
            for (int j = ja; j < nj; j++)
                sr[j] = kvf_det_softcap(sr[j], t->softcap);
    }
}

/* Row r's softmax steps over nc chunks (keys ja[c] .. nj[c]-1 of chunk c)
 * of scores s: its probabilities into p, each step's factor into
 * a[c * G], its running max and sum updated. The values of nc
 * softmax_step calls in order. */
INLINE void dec_softmax_row(float *s, float *p, float *a, int G, int nc, const int *ja,
                            const int *nj, float *m_p, float *l_p)
{
    float cmax[KVF_CPU_DECODE_CHUNKS], mn[KVF_CPU_DECODE_CHUNKS], sum[KVF_CPU_DECODE_CHUNKS];
    for (int c = 0; c < nc; c++)
        cmax[c] = HMAX16(s + c * KVF_CPU_KEY_CHUNK, ja[c], nj[c]);
    float m = *m_p;
    for (int c = 0; c < nc; c++) {
        const float n = cmax[c] > m ? cmax[c] : m;
        a[c * G] = kvf_cpu_rescale(m, n);
        mn[c] = n;
        m = n;
    }
    for (int c = 0; c < nc; c++) {
        float *pc = p + c * KVF_CPU_KEY_CHUNK;
        chunk_probs(s + c * KVF_CPU_KEY_CHUNK, ja[c], nj[c], mn[c], pc);
        sum[c] = TREE16P(pc);
    }
    float l = *l_p;
    for (int c = 0; c < nc; c++)
        l = l * a[c * G] + sum[c];
    *l_p = l;
    *m_p = m;
}

/* p·v of the token's rows over the chunk at j0 (keys < nj), probabilities
 * P (row r's 16 at P + r * lds) and factors a (row r's at a[r]). */
INLINE void dec_pv(const kvf_cpu_attn_tile_t *t, int j0, int last, int nj,
                   const kvf_cpu_attn_scratch_t *sc, float *P, int lds, const float *a,
                   kvf_cpu_pf_stream_t *pf, const int HD)
{
    const kv_side_t v = chunk_side(t, j0, last, 1, PV_DECODE, sc->vbuf, HD, sc->hdp);
    const int lines = (HD * (int)kvf_kv_elem_bytes(t->dtype) + 63) / 64; /* a pool row's */
    if (t->dtype == KVF_KV_INT8) /* p times the value scales, in place */
        i8_scale_p(t, j0, last, P, (size_t)lds, t->group, P);
    for (int h = 0; h < t->group; h += 2) {
        float *acc[2] = {sc->acc + (size_t)h * sc->hdp, sc->acc + (size_t)(h + 1) * sc->hdp};
        const float *pr[2] = {P + (size_t)h * (size_t)lds, P + (size_t)(h + 1) * (size_t)lds};
        kvf_cpu_pf_stream_t *f = h == 0 ? pf : NULL;
        if (t->group - h >= 2)
            pv_rows_dt(acc, &v, pr, nj, HD, a + h, f, lines, 2, v.dt);
        else
            pv_rows_dt(acc, &v, pr, nj, HD, a + h, f, lines, 1, v.dt);
    }
}

/* How far ahead a decode tile requests its keys (chunks): 8 measured
 * 2-8% faster than 4 for the 16-bit and 8-bit formats at 16k context,
 * batch 16 (kvf bench engine, AVX-512, a busy machine). */
#define DEC_PREFETCH_CHUNKS 8

/* Rows 0 .. rows-1 of the scratch before their first chunk: no key seen. */
INLINE void rows_start(const kvf_cpu_attn_scratch_t *sc, int rows)
{
    for (int r = 0; r < rows; r++) {
        sc->m[r] = -INFINITY;
        sc->l[r] = 0;
    }
    memset(sc->acc, 0, (size_t)rows * (size_t)sc->hdp * sizeof(float));
}

/* Row r of the scratch, done: its numerator over its sum into o. */
INLINE void row_out(const kvf_cpu_attn_scratch_t *sc, int r, float *o, const int HD)
{
    const float inv = 1.0f / sc->l[r], *acc = sc->acc + (size_t)r * sc->hdp;
    int c = 0;
    for (; c + VL <= HD; c += VL)
        V_STORE(o + c, V_MUL(V_LOAD(acc + c), V_SET1(inv)));
    for (; c < HD; c++)
        o[c] = acc[c] * inv;
}

/* One run of up to nc_max chunks from key r0 of the decode tile t: the
 * scores of each, every row's softmax steps, then each chunk's p·v.
 * Prefetch streams are taken alongside: ks during the scores (ks_n lines
 * a load step of DOT2X16), vs during p·v (a value row's lines a key). With sync
 * (the single-tile streams), ks is kept DEC_PREFETCH_CHUNKS chunks ahead
 * of the scores and vs a run ahead of p·v. */
INLINE void decode_run(const kvf_cpu_attn_tile_t *t, const kvf_cpu_attn_scratch_t *sc, int r0,
                       int nc_max, int last, kvf_cpu_pf_stream_t *ks, int ks_n,
                       kvf_cpu_pf_stream_t *vs, bool sync, const int HD)
{
    const int G = t->group, lds = KVF_CPU_DECODE_CHUNKS * KVF_CPU_KEY_CHUNK;
    const int ahead = DEC_PREFETCH_CHUNKS * KVF_CPU_KEY_CHUNK;
    int ja[KVF_CPU_DECODE_CHUNKS], nj[KVF_CPU_DECODE_CHUNKS];
    int nc = 0;
    for (int j0 = r0; j0 <= last && nc < nc_max; j0 += KVF_CPU_KEY_CHUNK, nc++) {
        if (!row_keys(t, 0, j0, &ja[nc], &nj[nc]))
            ja[nc] = nj[nc] = 0; /* not reached: the span holds the row's keys */
        dec_scores(t, j0, last, ja[nc], nj[nc], sc, sc->ds + nc * KVF_CPU_KEY_CHUNK, lds, ks, ks_n,
                   HD);
        if (sync)
            kvf_cpu_pf_upto(ks, j0 + KVF_CPU_KEY_CHUNK + ahead);
    }
    for (int h = 0; h < G; h++)
        dec_softmax_row(sc->ds + (size_t)h * lds, sc->dp + (size_t)h * lds, sc->da + h, G, nc, ja,
                        nj, &sc->m[h], &sc->l[h]);
    for (int c = 0; c < nc; c++) {
        dec_pv(t, r0 + c * KVF_CPU_KEY_CHUNK, last, nj[c], sc, sc->dp + c * KVF_CPU_KEY_CHUNK, lds,
               sc->da + (size_t)c * G, vs, HD);
        if (sync)
            kvf_cpu_pf_upto(vs, r0 + nc_max * KVF_CPU_KEY_CHUNK + (c + 1) * KVF_CPU_KEY_CHUNK);
    }
}

/* The decode tile (t->n_tok == 1): phases over runs of chunks. Two
 * prefetch streams run alongside, a few lines between loads: the keys
 * DEC_PREFETCH_CHUNKS chunks ahead of the scores, the values of the next
 * run during this run's p·v. */
INLINE void attention_decode(const kvf_cpu_attn_tile_t *t, const kvf_cpu_attn_scratch_t *sc,
                             int first, int last, const int HD)
{
    const int lds = KVF_CPU_DECODE_CHUNKS * KVF_CPU_KEY_CHUNK;
    const int eb = (int)kvf_kv_elem_bytes(t->dtype);
    kvf_cpu_pf_stream_t kpf, vpf;
    kvf_cpu_pf_init(&kpf, t, 1, 0, 1, first, last + 1);
    kvf_cpu_pf_init(&vpf, t, 1, 1, 1, first, last + 1);
    kvf_cpu_pf_upto(&kpf, first + DEC_PREFETCH_CHUNKS * KVF_CPU_KEY_CHUNK);
    kvf_cpu_pf_upto(&vpf, first + lds);
    for (int r0 = first; r0 <= last; r0 += lds)
        decode_run(t, sc, r0, KVF_CPU_DECODE_CHUNKS, last, &kpf, 2 * eb, &vpf, true, HD);
}

/* The bytes of K/V the kv heads of a token take in one run of
 * attention_decode_heads, at most: two runs (this one's and the next
 * one's, requested meanwhile) stay well inside a core's L2. */
#define DEC_HEADS_RUN_BYTES (64 * 1024)

/* The decode tiles of one token's n kv heads (t[h], the same position and
 * blocks), run by run: each run of chunks is taken head by head, and one
 * prefetch stream requests the next run's blocks whole (every head's keys,
 * then every head's values: the pool's slices in address order, far
 * longer runs than one head's) a few lines between loads. Each head's
 * rows have their own state in the scratch and the arithmetic of
 * attention_decode, so the same bits. */
INLINE void attention_heads_hd(const kvf_cpu_attn_tile_t *t, int n, float *scratch, const int HD)
{
    const int G = t->group, rows = n * G;
    const kvf_cpu_attn_scratch_t sc = kvf_cpu_attn_scratch(scratch, HD, rows);
    rows_start(&sc, rows);
    if (t->dtype == KVF_KV_INT8)
        for (int h = 0; h < n; h++)
            i8_quant_rows(&t[h], &sc, h * G);
    int first, last;
    kvf_cpu_attn_span(t, &first, &last);
    const size_t chunk_bytes = (size_t)KVF_CPU_KEY_CHUNK * 2 * (size_t)n *
                               ((size_t)HD * kvf_kv_elem_bytes(t->dtype) + 4);
    int nc = (int)(DEC_HEADS_RUN_BYTES / chunk_bytes);
    nc = nc < 1 ? 1 : nc > KVF_CPU_DECODE_CHUNKS ? KVF_CPU_DECODE_CHUNKS : nc;
    const int run = nc * KVF_CPU_KEY_CHUNK, eb = (int)kvf_kv_elem_bytes(t->dtype);
    kvf_cpu_pf_stream_t pf;
    kvf_cpu_pf_init(&pf, t, n, 0, 2, first, last + 1);
    kvf_cpu_pf_upto(&pf, first + run);
    for (int r0 = first; r0 <= last; r0 += run) {
        for (int h = 0; h < n; h++) {
            kvf_cpu_attn_scratch_t hs = sc;
            hs.m = sc.m + h * G;
            hs.l = sc.l + h * G;
            hs.acc = sc.acc + (size_t)h * G * sc.hdp;
            hs.qi = sc.qi + (size_t)h * G * sc.hdp;
            hs.qs = sc.qs + h * G;
            decode_run(&t[h], &hs, r0, nc, last, &pf, 2 * eb, &pf, false, HD);
        }
        kvf_cpu_pf_upto(&pf, r0 + 2 * run); /* the next run whole */
    }
    for (int h = 0; h < n; h++)
        for (int g = 0; g < G; g++)
            row_out(&sc, h * G + g, t[h].out + (size_t)g * (size_t)HD, HD);
}

/* Chunk by chunk, software-pipelined: the next chunk's scores are
 * computed between this chunk's softmax (a chain of dependent scalar
 * steps) and its p·v, so independent work hides that chain's latency.
 * The arithmetic of every row is that of cpu_kernels.h's order. HD is
 * t->head_dim, a constant in the copies for the usual head sizes. */
INLINE void attention_hd(const kvf_cpu_attn_tile_t *t, float *scratch, const int HD)
{
    const int rows = t->n_tok * t->group;
    const kvf_cpu_attn_scratch_t sc = kvf_cpu_attn_scratch(scratch, HD, rows);
    const size_t s_stride = (size_t)((rows + 15) & ~15) * KVF_CPU_KEY_CHUNK;
    rows_start(&sc, rows);
    if (t->dtype == KVF_KV_INT8)
        i8_quant_rows(t, &sc, 0);
    int first, last;
    kvf_cpu_attn_span(t, &first, &last);
    if (t->n_tok == 1) {
        attention_decode(t, &sc, first, last, HD);
        goto out;
    }
    kvf_cpu_attn_prefetch(t, first, last);
    kvf_cpu_attn_prefetch(t, first + KVF_CPU_KEY_CHUNK, last);
    if (first <= last)
        tile_scores(t, first, last, &sc, sc.s, HD);
    for (int j0 = first, c = 0; j0 <= last; j0 += KVF_CPU_KEY_CHUNK, c ^= 1) {
        /* the rows of the chunk after next arrive while this one and the
         * next one's scores compute */
        kvf_cpu_attn_prefetch(t, j0 + 2 * KVF_CPU_KEY_CHUNK, last);
        tile_softmax(t, j0, &sc, sc.s + (size_t)c * s_stride);
        if (j0 + KVF_CPU_KEY_CHUNK <= last)
            tile_scores(t, j0 + KVF_CPU_KEY_CHUNK, last, &sc, sc.s + (size_t)(c ^ 1) * s_stride,
                        HD);
        tile_pv(t, j0, last, &sc, HD);
    }
out:
    for (int i = 0; i < t->n_tok; i++)
        for (int h = 0; h < t->group; h++)
            row_out(&sc, i * t->group + h,
                    t->out + (size_t)i * (size_t)t->ld_out + (size_t)h * (size_t)HD, HD);
}

static void KFN(attention)(const kvf_cpu_attn_tile_t *t, float *scratch)
{
    switch (t->head_dim) {
    case 64: attention_hd(t, scratch, 64); break;
    case 128: attention_hd(t, scratch, 128); break;
    default: attention_hd(t, scratch, t->head_dim); break;
    }
}

static void KFN(attention_heads)(const kvf_cpu_attn_tile_t *t, int n, float *scratch)
{
    switch (t->head_dim) {
    case 64: attention_heads_hd(t, n, scratch, 64); break;
    case 128: attention_heads_hd(t, n, scratch, 128); break;
    default: attention_heads_hd(t, n, scratch, t->head_dim); break;
    }
}

const kvf_cpu_kernels_t KFN(kvf_cpu_kernels) = {
    .isa = ISA_ID,
    .small_panels_per_task = SMALL_PANELS_PER_TASK,
    .small_m = SMALL_M,
    .gemm = KFN(gemm),
    .swiglu_row = KFN(swiglu_row),
    .attention = KFN(attention),
    .attention_heads = KFN(attention_heads),
    .decode_row = KFN(decode_row),
};
