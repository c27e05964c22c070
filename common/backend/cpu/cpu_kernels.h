/* CPU backend kernels, private to common/backend/cpu/. Each kernel exists
 * as a portable C version (the reference) and, where it pays, an AVX-512
 * version chosen at run time when the CPU has AVX-512F. Kernels work on a
 * range of rows so the backend can split them across its thread pool. */
#ifndef KVF_CPU_KERNELS_H
#define KVF_CPU_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Most x rows the gemv kernels take at once; more rows go to sgemm. */
#define KVF_CPU_GEMV_MAX_M 8

/* y[i*n + r] = dot(x[i*k..], w[r*k..]) (+ bias[r]) (+ y if accumulate),
 * for rows r in [r0, r1) of w and every i < m (m <= KVF_CPU_GEMV_MAX_M). */
void kvf_cpu_gemv_rows(float *y, const float *x, const float *w, const float *bias, int m, int n,
                       int k, int r0, int r1, int accumulate);
void kvf_cpu_gemv_rows_avx512(float *y, const float *x, const float *w, const float *bias, int m,
                              int n, int k, int r0, int r1, int accumulate);

/* out[i] = silu(gate[i]) * up[i] for i < n. */
void kvf_cpu_swiglu_row(float *out, const float *gate, const float *up, int n);
void kvf_cpu_swiglu_row_avx512(float *out, const float *gate, const float *up, int n);

/* One attention work item: rows = n_tok tokens x group query heads that
 * share one kv head. Token i of the tile has position pos[i] and query
 * rows q + i*ld_q + (g*group + h)*head_dim for h < group; the output row
 * goes to the same place in out (row stride ld_out). keys[b], values[b]
 * are the (block_size, head_dim) K and V of the kv head in the b-th block
 * of the sequence. */
typedef struct {
    int n_tok;
    const int32_t *pos;          /* (n_tok) */
    const float *q;              /* first query row of head group, token 0 */
    int ld_q;
    float *out;
    int ld_out;
    int group;                   /* query heads per kv head */
    int head_dim;
    int block_size;
    const float *const *keys;    /* (n_blocks) */
    const float *const *values;  /* (n_blocks) */
    float scale;                 /* 1 / sqrt(head_dim) */
} kvf_cpu_attn_tile_t;

/* Floats of scratch one call needs for a tile of n_tok tokens. */
size_t kvf_cpu_attn_scratch_floats(int n_tok, int group, int head_dim, int block_size);

void kvf_cpu_attention_tile(const kvf_cpu_attn_tile_t *t, float *scratch);
void kvf_cpu_attention_tile_avx512(const kvf_cpu_attn_tile_t *t, float *scratch);

/* Whether the CPU runs AVX-512F code. */
bool kvf_cpu_has_avx512(void);

#endif
