/* Portable CPU kernels: the canonical numerics of cpu_kernels.h written
 * out one element at a time, with fmaf for every fused step. The AVX2 and
 * AVX-512 kernels must give these bits. */
#include "cpu_canon.h"
#include "cpu_kernels.h"

static inline float weight_at(const kvf_cpu_packed_t *w, size_t i)
{
    switch (w->dtype) {
    case KVF_DTYPE_BF16: return kvf_bf16_to_f32(((const uint16_t *)w->data)[i]);
    case KVF_DTYPE_F16: return kvf_f16_to_f32(((const uint16_t *)w->data)[i]);
    default: return ((const float *)w->data)[i];
    }
}

static void gemm_scalar(const kvf_cpu_gemm_t *g, int p0, int p1, float *scratch)
{
    (void)scratch;
    const kvf_cpu_packed_t *w = g->w;
    const int k = w->k, n = w->n;
    const size_t pstride = (size_t)k * KVF_CPU_PANEL;
    for (int p = p0; p < p1; p++) {
        for (int i = 0; i < g->m; i++) {
            const float *xi = g->x + (size_t)i * (size_t)k;
            float acc[KVF_CPU_PANEL] = {0};
            size_t wi = (size_t)p * pstride;
            for (int d = 0; d < k; d++, wi += KVF_CPU_PANEL)
                for (int c = 0; c < KVF_CPU_PANEL; c++)
                    acc[c] = fmaf(xi[d], weight_at(w, wi + (size_t)c), acc[c]);
            int c0 = p * KVF_CPU_PANEL, nc = n - c0 < KVF_CPU_PANEL ? n - c0 : KVF_CPU_PANEL;
            float *y = g->y + (size_t)i * (size_t)n + c0;
            for (int c = 0; c < nc; c++) {
                float s = acc[c];
                if (g->bias)
                    s = s + g->bias[c0 + c];
                y[c] = g->accumulate ? y[c] + s : s;
            }
        }
    }
}

static void swiglu_scalar(float *out, const float *gate, const float *up, int n)
{
    for (int i = 0; i < n; i++)
        out[i] = kvf_cpu_swiglu1(gate[i], up[i]);
}

static float dot16_scalar(const float *q, const float *k, int hd)
{
    float lanes[16] = {0};
    for (int d0 = 0; d0 < hd; d0 += 16)
        for (int l = 0; l < 16; l++) {
            int d = d0 + l;
            lanes[l] = d < hd ? fmaf(q[d], k[d], lanes[l]) : fmaf(0.0f, 0.0f, lanes[l]);
        }
    return kvf_cpu_tree16(lanes);
}

size_t kvf_cpu_attn_scratch_floats(int head_dim, int rows)
{
    const size_t hdp = (size_t)kvf_cpu_attn_hdp(head_dim);
    const size_t rp = ((size_t)rows + 15) & ~(size_t)15;
    return (2 * KVF_CPU_KEY_CHUNK + (size_t)rows) * hdp + 3 * rp + 3 * rp * KVF_CPU_KEY_CHUNK +
           (size_t)rows * KVF_CPU_DECODE_CHUNKS * (2 * KVF_CPU_KEY_CHUNK + 1) + rp +
           ((size_t)rows * hdp + 1) / 2; /* qs, qi (int16) */
}

static void decode_row_scalar(kvf_kv_dtype_t dt, const void *src, const float *scales, int n_rows,
                              int n, float *out, int ld_out)
{
    const size_t row_bytes = (size_t)n * kvf_kv_elem_bytes(dt);
    for (int r = 0; r < n_rows; r++)
        kvf_kv_decode_row(dt, (const char *)src + (size_t)r * row_bytes, scales ? scales[r] : 1.0f,
                          n, out + (size_t)r * (size_t)ld_out);
}

/* One online-softmax step of a query row over keys j0+ja .. j0+nj-1.
 * int8 pools: the row's quantized query qi, sq and the chunk's int8 key
 * rows k8 with scales ks; the value rows decoded without their scales
 * vs, which multiply the probabilities (cpu_kernels.h). */
static void chunk_step_scalar(const kvf_cpu_attn_tile_t *t, const float *q, float *acc, float *m_p,
                              float *l_p, const float *const *krows, const float *const *vrows,
                              int ja, int nj, const int16_t *qi, float sq,
                              const int8_t *const *k8, const float *ks, const float *vs)
{
    const int hd = t->head_dim;
    float s[KVF_CPU_KEY_CHUNK], p[KVF_CPU_KEY_CHUNK] = {0};
    float mc = -INFINITY;
    for (int j = ja; j < nj; j++) {
        if (qi)
            s[j] = kvf_kv_i8_score(kvf_cpu_i8_dot(qi, k8[j], hd), sq, ks[j]) * t->scale;
        else
            s[j] = dot16_scalar(q, krows[j], hd) * t->scale;
        if (t->softcap > 0)
            s[j] = kvf_det_softcap(s[j], t->softcap);
        mc = s[j] > mc ? s[j] : mc;
    }
    float mn = mc > *m_p ? mc : *m_p;
    float alpha = kvf_cpu_rescale(*m_p, mn);
    for (int j = ja; j < nj; j++)
        p[j] = kvf_cpu_exp(s[j] - mn);
    *l_p = *l_p * alpha + kvf_cpu_tree16(p);
    for (int c = 0; c < hd; c++)
        acc[c] = acc[c] * alpha;
    if (vs)
        for (int j = 0; j < nj; j++)
            p[j] = p[j] * vs[j];
    for (int j = 0; j < nj; j++)
        for (int c = 0; c < hd; c++)
            acc[c] = fmaf(p[j], vrows[j][c], acc[c]);
    *m_p = mn;
}

static void attention_scalar(const kvf_cpu_attn_tile_t *t, float *scratch)
{
    const int hd = t->head_dim, rows = t->n_tok * t->group;
    const kvf_cpu_attn_scratch_t sc = kvf_cpu_attn_scratch(scratch, hd, rows);
    for (int r = 0; r < rows; r++) {
        sc.m[r] = -INFINITY;
        sc.l[r] = 0;
        for (int c = 0; c < hd; c++)
            sc.acc[(size_t)r * sc.hdp + c] = 0;
    }
    const bool i8 = t->dtype == KVF_KV_INT8;
    if (i8)
        for (int i = 0; i < t->n_tok; i++)
            for (int h = 0; h < t->group; h++) {
                const int r = i * t->group + h;
                kvf_cpu_i8_quant(t->q + (size_t)i * (size_t)t->ld_q + (size_t)h * (size_t)hd, hd,
                                 sc.hdp, sc.qi + (size_t)r * sc.hdp, &sc.qs[r]);
            }
    int first, last;
    kvf_cpu_attn_span(t, &first, &last);
    for (int j0 = first; j0 <= last; j0 += KVF_CPU_KEY_CHUNK) {
        const float *krows[KVF_CPU_KEY_CHUNK], *vrows[KVF_CPU_KEY_CHUNK];
        const int8_t *k8[KVF_CPU_KEY_CHUNK], *v8[KVF_CPU_KEY_CHUNK];
        float ks[KVF_CPU_KEY_CHUNK], vs[KVF_CPU_KEY_CHUNK];
        const int n = last - j0 + 1 < KVF_CPU_KEY_CHUNK ? last - j0 + 1 : KVF_CPU_KEY_CHUNK;
        kvf_cpu_attn_chunk_rows(t, j0, n, decode_row_scalar, &sc, krows, vrows);
        if (i8) {
            kvf_cpu_i8_rows(t, 0, j0, n, k8, ks);
            kvf_cpu_i8_rows(t, 1, j0, n, v8, vs);
        }
        for (int i = 0; i < t->n_tok; i++) {
            const int pos = t->pos[i], lo = kvf_cpu_attn_first_key(t->window, pos);
            if (j0 > pos || j0 + KVF_CPU_KEY_CHUNK <= lo)
                continue;
            const int nj = pos - j0 + 1 < KVF_CPU_KEY_CHUNK ? pos - j0 + 1 : KVF_CPU_KEY_CHUNK;
            const int ja = lo > j0 ? lo - j0 : 0; /* keys before the window's first: p = 0 */
            for (int h = 0; h < t->group; h++) {
                const int r = i * t->group + h;
                const float *q = t->q + (size_t)i * (size_t)t->ld_q + (size_t)h * (size_t)hd;
                chunk_step_scalar(t, q, sc.acc + (size_t)r * sc.hdp, &sc.m[r], &sc.l[r], krows,
                                  vrows, ja, nj, i8 ? sc.qi + (size_t)r * sc.hdp : NULL,
                                  i8 ? sc.qs[r] : 0, k8, ks, i8 ? vs : NULL);
            }
        }
    }
    for (int i = 0; i < t->n_tok; i++)
        for (int h = 0; h < t->group; h++) {
            const int r = i * t->group + h;
            float inv = 1.0f / sc.l[r];
            float *o = t->out + (size_t)i * (size_t)t->ld_out + (size_t)h * (size_t)hd;
            for (int c = 0; c < hd; c++)
                o[c] = sc.acc[(size_t)r * sc.hdp + c] * inv;
        }
}

/* The heads one after the other: the reference the vector kernels'
 * interleaved runs must equal. */
static void attention_heads_scalar(const kvf_cpu_attn_tile_t *t, int n, float *scratch)
{
    for (int h = 0; h < n; h++)
        attention_scalar(&t[h], scratch);
}

const kvf_cpu_kernels_t kvf_cpu_kernels_scalar = {
    .isa = KVF_CPU_ISA_SCALAR,
    .small_panels_per_task = 4,
    .small_m = 3,
    .gemm = gemm_scalar,
    .swiglu_row = swiglu_scalar,
    .attention = attention_scalar,
    .attention_heads = attention_heads_scalar,
    .decode_row = decode_row_scalar,
};
