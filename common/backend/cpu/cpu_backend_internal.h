/* The CPU backend's context and the ops that live outside cpu_backend.c,
 * private to common/backend/cpu/:
 *
 *   cpu_backend.c  matmul, binding a model, KV write, attention, lifecycle
 *   cpu_rows.c     the row-wise ops: RMSNorm (and its add), per-head
 *                  RMSNorm, RoPE, SwiGLU, GeGLU */
#ifndef KVF_CPU_BACKEND_INTERNAL_H
#define KVF_CPU_BACKEND_INTERNAL_H

#include "kvf/backend.h"
#include "kvf/model.h"
#include "kvf/threadpool.h"

#include "cpu_kernels.h"

typedef struct {
    kvf_threadpool_t *pool;
    int n_threads;
    kvf_cpu_config_t cfg;
    const kvf_cpu_kernels_t *k;
    float **scratch;       /* (n_threads) per-thread attention scratch */
    size_t scratch_floats; /* capacity of each */
    float **gemm_scratch;  /* (n_threads) per-thread matmul scratch */
    size_t gemm_scratch_floats;
    /* attention work list, rebuilt per call */
    int *tiles;            /* (cap_tiles, 2): first token, token count */
    int cap_tiles;
    /* the bound model's matrices */
    const kvf_model_t *model;
    kvf_cpu_packed_t *packed; /* (n_packed) by KVF_WEIGHT_INDEX */
    int n_packed;
    kvf_dtype_t wdtype;
    size_t weight_bytes;
    /* a matrix matmul() was given that is not the bound model's: packed per call */
    kvf_cpu_packed_t adhoc;
} kvf_cpu_ctx_t;

/* The row-wise ops of the ops table (kvf/backend.h), ctx a kvf_cpu_ctx_t. */
kvf_status_t kvf_cpu_op_rmsnorm(void *ctx, float *y, const float *x, const float *w, int m,
                                int dim, float eps);
kvf_status_t kvf_cpu_op_rmsnorm_add(void *ctx, float *y, const float *x, const float *w, int m,
                                    int dim, float eps);
kvf_status_t kvf_cpu_op_head_rmsnorm(void *ctx, float *x, int ld, const float *w, int m,
                                     int n_heads, int head_dim, float eps);
kvf_status_t kvf_cpu_op_rope(void *ctx, float *x, int ld, const float *cos_sin, int m,
                             int n_heads, int head_dim);
kvf_status_t kvf_cpu_op_swiglu(void *ctx, float *out, const float *gu, int m, int n);
kvf_status_t kvf_cpu_op_geglu(void *ctx, float *out, const float *gu, int m, int n);

#endif
