/* Portable CPU kernels: the reference versions. See cpu_kernels.h. */
#include "cpu_kernels.h"

#include <math.h>
#include <string.h>

bool kvf_cpu_has_avx512(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");
#else
    return false;
#endif
}

void kvf_cpu_gemv_rows(float *y, const float *x, const float *w, const float *bias, int m, int n,
                       int k, int r0, int r1, int accumulate)
{
    for (int r = r0; r < r1; r++) {
        const float *wr = w + (size_t)r * (size_t)k;
        for (int i = 0; i < m; i++) {
            const float *xi = x + (size_t)i * (size_t)k;
            float s = 0;
            for (int d = 0; d < k; d++)
                s += xi[d] * wr[d];
            if (bias)
                s += bias[r];
            float *yo = &y[(size_t)i * (size_t)n + (size_t)r];
            *yo = accumulate ? *yo + s : s;
        }
    }
}

void kvf_cpu_swiglu_row(float *out, const float *gate, const float *up, int n)
{
    for (int i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

size_t kvf_cpu_attn_scratch_floats(int n_tok, int group, int head_dim, int block_size)
{
    size_t rows = (size_t)n_tok * (size_t)group;
    size_t bsp = ((size_t)block_size + 15) & ~(size_t)15;
    return 2 * rows + rows * (size_t)head_dim + rows * bsp + (size_t)head_dim * bsp + 64;
}

void kvf_cpu_attention_tile(const kvf_cpu_attn_tile_t *t, float *scratch)
{
    const int hd = t->head_dim, bs = t->block_size, rows = t->n_tok * t->group;
    float *mx = scratch;                 /* (rows) running max */
    float *sum = mx + rows;              /* (rows) running denominator */
    float *acc = sum + rows;             /* (rows, hd) running numerator */
    float *s = acc + (size_t)rows * hd;  /* (block_size) scores of one row */
    int max_pos = 0;
    for (int i = 0; i < t->n_tok; i++)
        max_pos = t->pos[i] > max_pos ? t->pos[i] : max_pos;
    for (int r = 0; r < rows; r++) {
        mx[r] = -INFINITY;
        sum[r] = 0;
    }
    memset(acc, 0, (size_t)rows * (size_t)hd * sizeof(float));
    int n_blocks = max_pos / bs + 1;
    for (int b = 0; b < n_blocks; b++) {
        const float *K = t->keys[b], *V = t->values[b];
        int j0 = b * bs;
        for (int i = 0; i < t->n_tok; i++) {
            int cr = t->pos[i] - j0 + 1;
            if (cr <= 0)
                continue;
            if (cr > bs)
                cr = bs;
            for (int h = 0; h < t->group; h++) {
                int r = i * t->group + h;
                const float *q = t->q + (size_t)i * (size_t)t->ld_q + (size_t)h * (size_t)hd;
                float mb = -INFINITY;
                for (int j = 0; j < cr; j++) {
                    const float *kj = K + (size_t)j * (size_t)hd;
                    float d = 0;
                    for (int c = 0; c < hd; c++)
                        d += q[c] * kj[c];
                    s[j] = d * t->scale;
                    mb = s[j] > mb ? s[j] : mb;
                }
                float mnew = mb > mx[r] ? mb : mx[r];
                float alpha = expf(mx[r] - mnew);
                float *a = acc + (size_t)r * (size_t)hd;
                sum[r] *= alpha;
                for (int c = 0; c < hd; c++)
                    a[c] *= alpha;
                for (int j = 0; j < cr; j++) {
                    float p = expf(s[j] - mnew);
                    const float *vj = V + (size_t)j * (size_t)hd;
                    sum[r] += p;
                    for (int c = 0; c < hd; c++)
                        a[c] += p * vj[c];
                }
                mx[r] = mnew;
            }
        }
    }
    for (int i = 0; i < t->n_tok; i++) {
        for (int h = 0; h < t->group; h++) {
            int r = i * t->group + h;
            float *o = t->out + (size_t)i * (size_t)t->ld_out + (size_t)h * (size_t)hd;
            const float *a = acc + (size_t)r * (size_t)hd;
            float inv = 1.0f / sum[r];
            for (int c = 0; c < hd; c++)
                o[c] = a[c] * inv;
        }
    }
}
