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

size_t kvf_cpu_attn_scratch_floats(int head_dim)
{
    return ((size_t)head_dim + 15) & ~(size_t)15;
}

static void attention_scalar(const kvf_cpu_attn_tile_t *t, float *scratch)
{
    const int hd = t->head_dim, bs = t->block_size;
    float *acc = scratch; /* (hd) numerator of the row */
    for (int i = 0; i < t->n_tok; i++) {
        const int pos = t->pos[i];
        for (int h = 0; h < t->group; h++) {
            const float *q = t->q + (size_t)i * (size_t)t->ld_q + (size_t)h * (size_t)hd;
            float m = -INFINITY, l = 0;
            for (int c = 0; c < hd; c++)
                acc[c] = 0;
            const int lo = kvf_cpu_attn_first_key(t->window, pos);
            for (int j0 = lo / KVF_CPU_KEY_CHUNK * KVF_CPU_KEY_CHUNK; j0 <= pos;
                 j0 += KVF_CPU_KEY_CHUNK) {
                const int nj = pos - j0 + 1 < KVF_CPU_KEY_CHUNK ? pos - j0 + 1 : KVF_CPU_KEY_CHUNK;
                const int ja = lo > j0 ? lo - j0 : 0; /* keys before the window's first: p = 0 */
                float s[KVF_CPU_KEY_CHUNK], p[KVF_CPU_KEY_CHUNK] = {0};
                float mc = -INFINITY;
                for (int j = ja; j < nj; j++) {
                    int key = j0 + j;
                    const float *kj = t->keys[key / bs] + (size_t)(key % bs) * (size_t)hd;
                    s[j] = dot16_scalar(q, kj, hd) * t->scale;
                    if (t->softcap > 0)
                        s[j] = kvf_det_softcap(s[j], t->softcap);
                    mc = s[j] > mc ? s[j] : mc;
                }
                float mn = mc > m ? mc : m;
                float alpha = kvf_cpu_rescale(m, mn);
                for (int j = ja; j < nj; j++)
                    p[j] = kvf_cpu_exp(s[j] - mn);
                l = l * alpha + kvf_cpu_tree16(p);
                for (int c = 0; c < hd; c++)
                    acc[c] = acc[c] * alpha;
                for (int j = 0; j < nj; j++) {
                    int key = j0 + j;
                    const float *vj = t->values[key / bs] + (size_t)(key % bs) * (size_t)hd;
                    for (int c = 0; c < hd; c++)
                        acc[c] = fmaf(p[j], vj[c], acc[c]);
                }
                m = mn;
            }
            float inv = 1.0f / l;
            float *o = t->out + (size_t)i * (size_t)t->ld_out + (size_t)h * (size_t)hd;
            for (int c = 0; c < hd; c++)
                o[c] = acc[c] * inv;
        }
    }
}

const kvf_cpu_kernels_t kvf_cpu_kernels_scalar = {
    .isa = KVF_CPU_ISA_SCALAR,
    .small_panels_per_task = 4,
    .small_m = 3,
    .gemm = gemm_scalar,
    .swiglu_row = swiglu_scalar,
    .attention = attention_scalar,
};
