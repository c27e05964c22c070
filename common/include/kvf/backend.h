/* Compute backends behind one ops table (a table of function pointers plus
 * a context, as in docs/STYLE.md). The engine (kvf/engine.h) drives a backend
 * through these ops only; the CPU backend is the reference every other
 * backend is checked against.
 *
 * Matrices are row-major f32. "ld" arguments are row strides in elements,
 * so an op can work on the q, k or v columns of a fused qkv buffer.
 * Pointers passed to ops are in the backend's memory (host memory for the
 * CPU backend). Ops run to completion (CPU) or are ordered on the backend's
 * stream; synchronize() waits for them. */
#ifndef KVF_BACKEND_H
#define KVF_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvf/dtype.h"
#include "kvf/kvcache.h"
#include "kvf/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct kvf_model;
struct kvf_engine_seq;
struct kvf_engine_hooks;

/* Where each token of a batch sits: its sequence and position, and every
 * sequence's block table. Token t attends to positions 0..pos[t] of
 * sequence seq[t] (with a sliding window W, to pos[t] - W + 1..pos[t]),
 * whose K/V (including this batch's, written by kv_write first) live in
 * the pool blocks block_tables[seq[t]]. */
typedef struct {
    int n_tokens;
    const int32_t *pos;   /* (n_tokens) absolute positions */
    const int32_t *seq;   /* (n_tokens) sequence index of each token */
    int n_seqs;
    const uint32_t *const *block_tables; /* (n_seqs) arrays of block ids */
    int window; /* the layer's sliding window (kvf_model_layer_window); 0: none */
    float scale;   /* scores are q·k times this (kvf_model_attn_scale); 0: 1 / sqrt(head_dim) */
    float softcap; /* > 0: scores become softcap * tanh(s / softcap) (kvf_det_softcap) before
                      the softmax (Gemma2's attn_logit_softcapping); 0: none */
} kvf_batch_layout_t;

/* The projections of a bound model by index: layer l's are
 * KVF_WEIGHT_INDEX(l, KVF_WEIGHT_QKV..KVF_WEIGHT_DOWN); the lm_head is
 * KVF_WEIGHT_INDEX(n_layers, 0). */
enum {
    KVF_WEIGHT_QKV = 0,
    KVF_WEIGHT_O = 1,
    KVF_WEIGHT_GU = 2,
    KVF_WEIGHT_DOWN = 3,
    KVF_WEIGHTS_PER_LAYER = 4,
};
#define KVF_WEIGHT_INDEX(layer, kind) (KVF_WEIGHTS_PER_LAYER * (layer) + (kind))

typedef struct kvf_backend_ops {
    const char *name;

    /* y(m, n) = x(m, k) · w(n, k)ᵀ [+ bias(n)] [+ y if accumulate]. x has
     * row stride k, y row stride n. w is a weight (HF Linear layout). */
    kvf_status_t (*matmul)(void *ctx, float *y, const float *x, const float *w,
                           const float *bias, int m, int n, int k, int accumulate);

    /* y(m, dim) = w(dim) * x / sqrt(mean(x²) + eps), row by row. y may be x. */
    kvf_status_t (*rmsnorm)(void *ctx, float *y, const float *x, const float *w, int m, int dim,
                            float eps);

    /* (optional: only models with qk_norm need it) RMSNorm, in place, of
     * n_heads heads of head_dim in each of m rows of x (row stride ld),
     * each head as a row of rmsnorm() with weight w(head_dim). */
    kvf_status_t (*head_rmsnorm)(void *ctx, float *x, int ld, const float *w, int m, int n_heads,
                                 int head_dim, float eps);

    /* Rotates, in place, n_heads heads of head_dim in each of m rows of x
     * (row stride ld), HF half-split layout: pairs (i, i + head_dim/2).
     * cos_sin(m, head_dim) holds per row cos(a_i) for i < head_dim/2, then
     * sin(a_i). */
    kvf_status_t (*rope)(void *ctx, float *x, int ld, const float *cos_sin, int m, int n_heads,
                         int head_dim);

    /* Writes k and v rows (n_tokens, n_kv_heads * head_dim; row stride ld)
     * of layer into the pool at each token's (block, slot). */
    kvf_status_t (*kv_write)(void *ctx, kvf_kvpool_t *pool, int layer, const float *k,
                             const float *v, int ld, const kvf_batch_layout_t *batch);

    /* out(n_tokens, n_heads * head_dim) = causal softmax(q·kᵀ / sqrt(head_dim))·v
     * over each token's sequence in the pool (q row stride ld_q), within
     * batch->window when it is set, with batch->scale for 1 / sqrt(head_dim)
     * when set and the scores soft-capped when batch->softcap is. Query head h uses kv head
     * h / (n_heads / n_kv_heads). */
    kvf_status_t (*attention)(void *ctx, float *out, const float *q, int ld_q,
                              const kvf_kvpool_t *pool, int layer, int n_heads,
                              const kvf_batch_layout_t *batch);

    /* out(m, n) = silu(gu[:, :n]) * gu[:, n:], gu (m, 2n). */
    kvf_status_t (*swiglu)(void *ctx, float *out, const float *gu, int m, int n);

    /* (optional: only models with the gelu_tanh activation need it) out(m, n)
     * = gelu_tanh(gu[:, :n]) * gu[:, n:] (kvf_det_gelu_tanh), gu (m, 2n). */
    kvf_status_t (*geglu)(void *ctx, float *out, const float *gu, int m, int n);

    /* (optional: only models with sandwich_norms need it) y(m, dim) +=
     * rmsnorm(x) as rmsnorm() computes it with weight w: the norm of a
     * block's output before its residual add (Gemma2). */
    kvf_status_t (*rmsnorm_add)(void *ctx, float *y, const float *x, const float *w, int m,
                                int dim, float eps);

    /* (optional) The whole forward pass of kvf_engine_forward(), for a
     * backend that keeps the model and activations in its own memory (the
     * CUDA backend): when set, the engine validates the batch and hands it
     * over, and the per-op slots above are not used. pool must be one the
     * backend made (its blocks in the backend's memory). */
    kvf_status_t (*forward)(void *ctx, kvf_kvpool_t *pool, const struct kvf_engine_seq *seqs,
                            int n_seqs, const struct kvf_engine_hooks *hooks);

    /* (optional) Called by kvf_engine_create() with the model the engine
     * computes: a backend that keeps weights in its own layout (the CPU
     * backend's panels) prepares them here. A backend serves one model:
     * binding another is KVF_ERR_MISMATCH. The model must outlive the
     * backend. */
    kvf_status_t (*bind_model)(void *ctx, const struct kvf_model *model);

    /* (optional) matmul() against weight `weight` of the bound model
     * (KVF_WEIGHT_INDEX), in the backend's own copy: y(m, n) = x · wᵀ
     * [+ bias] [+ y]; KVF_ERR_INVAL unless n and k are the weight's. The
     * engine uses it when set, so the model's f32 projections may be
     * dropped. */
    kvf_status_t (*matmul_bound)(void *ctx, float *y, const float *x, int weight,
                                 const float *bias, int m, int n, int k, int accumulate);

    /* (optional, NULL when ops complete on return) waits for queued ops. */
    kvf_status_t (*synchronize)(void *ctx);

    /* Frees the context. */
    void (*destroy)(void *ctx);

    /* (optional) Host memory the backend copies results into fastest
     * (pinned memory for a GPU), and its release. */
    void *(*host_alloc)(void *ctx, size_t bytes);
    void (*host_free)(void *ctx, void *p);
} kvf_backend_ops_t;

typedef struct {
    const kvf_backend_ops_t *ops;
    void *ctx;
    /* The KV pool formats the backend computes with: bit 1u << d for each
     * kvf_kv_dtype_t d (kvf/kv_format.h); kvf_engine_create refuses a
     * pool in another. */
    uint32_t kv_dtypes;
} kvf_backend_t;

/* The kv_dtypes bit of one format, and the mask of all of them. */
#define KVF_KV_DTYPE_BIT(d) (1u << (unsigned)(d))
#define KVF_KV_DTYPES_ALL ((1u << KVF_KV_N_DTYPES) - 1u)

/* Instruction sets the CPU backend's kernels are built for. Every one
 * gives the same bits (docs/numerics.md); they differ in speed only. */
typedef enum {
    KVF_CPU_ISA_AUTO = -1, /* KVF_CPU_ISA when set, else the best the CPU runs */
    KVF_CPU_ISA_SCALAR = 0,
    KVF_CPU_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C */
    KVF_CPU_ISA_AVX512 = 2, /* AVX-512F */
    KVF_CPU_ISA_NEON = 3,   /* AArch64 Advanced SIMD */
    KVF_CPU_ISA_COUNT = 4,
} kvf_cpu_isa_t;

/* "scalar", "avx2", "avx512", "neon" ("auto" for KVF_CPU_ISA_AUTO); never NULL. */
const char *kvf_cpu_isa_name(kvf_cpu_isa_t isa);
/* Parses those names; KVF_ERR_INVAL (logged) for anything else. */
kvf_status_t kvf_cpu_isa_parse(const char *name, kvf_cpu_isa_t *isa_p);
/* Whether this CPU runs isa's kernels. */
bool kvf_cpu_isa_supported(kvf_cpu_isa_t isa);
/* The fastest instruction set this CPU runs. */
kvf_cpu_isa_t kvf_cpu_isa_best(void);
/* The instruction set a backend asked for want uses: want itself, or for
 * KVF_CPU_ISA_AUTO the one the KVF_CPU_ISA environment variable names
 * (scalar, avx2, avx512, neon, auto), else the best. An unknown name is
 * KVF_ERR_INVAL and one the CPU lacks KVF_ERR_UNSUPPORTED, both logged. */
kvf_status_t kvf_cpu_isa_resolve(kvf_cpu_isa_t want, kvf_cpu_isa_t *isa_p);

/* How the CPU backend holds a model's weight matrices (--cpu-dtype). */
typedef enum {
    KVF_CPU_WEIGHTS_NATIVE = 0, /* the checkpoint's type: bf16 and f16 stay 2 bytes */
    KVF_CPU_WEIGHTS_F32 = 1,    /* widened to f32 (same results, twice the bytes) */
} kvf_cpu_weights_t;

/* "native" or "f32"; KVF_ERR_INVAL (logged) for anything else. */
kvf_status_t kvf_cpu_weights_parse(const char *name, kvf_cpu_weights_t *w_p);

typedef struct {
    int n_threads;             /* pool size; <= 0: one per CPU */
    kvf_cpu_isa_t isa;         /* KVF_CPU_ISA_AUTO by default */
    kvf_cpu_weights_t weights; /* KVF_CPU_WEIGHTS_NATIVE by default */
} kvf_cpu_config_t;

/* n_threads 0, auto ISA, native weights. */
kvf_cpu_config_t kvf_cpu_config_default(void);

/* The CPU backend: own kernels (cpu_kernels.h) for every op, on a thread
 * pool of cfg->n_threads. Results do not depend on the instruction set,
 * the thread count or how tokens are batched. A model's matrices are
 * repacked into the kernels' layout when an engine binds it (bind_model).
 * One thread at a time may call its ops. Errors (an ISA the CPU lacks, a
 * rounding mode other than to-nearest, flush-to-zero on, no memory) are
 * logged. On success
 * be_p->ctx is owned by the backend: kvf_backend_destroy(). */
kvf_status_t kvf_backend_cpu_create_cfg(const kvf_cpu_config_t *cfg, kvf_backend_t *be_p);

/* Same with n_threads and the defaults. */
kvf_status_t kvf_backend_cpu_create(int n_threads, kvf_backend_t *be_p);

/* The instruction set a CPU backend runs (KVF_CPU_ISA_AUTO for another backend). */
kvf_cpu_isa_t kvf_backend_cpu_isa(const kvf_backend_t *be);

/* The type the bound model's matrices are held in (f32 before a bind or
 * for another backend), and their bytes. */
kvf_dtype_t kvf_backend_cpu_weights_dtype(const kvf_backend_t *be);
size_t kvf_backend_cpu_weight_bytes(const kvf_backend_t *be);

/* Threads the CPU backend runs (the pool size); 0 for another backend. */
int kvf_backend_cpu_threads(const kvf_backend_t *be);

/* Which backend a process computes with (--backend). */
typedef enum {
    KVF_BACKEND_CPU = 0,
    KVF_BACKEND_CUDA = 1,
} kvf_backend_kind_t;

/* "cpu" or "cuda": KVF_ERR_INVAL (logged) for anything else. */
kvf_status_t kvf_backend_kind_parse(const char *name, kvf_backend_kind_t *kind_p);
const char *kvf_backend_kind_name(kvf_backend_kind_t kind);

/* The CUDA backend (common/backend/cuda/). */
typedef struct {
    int device;          /* CUDA device index (--device) */
    kvf_dtype_t wdtype;  /* weights and GEMM inputs on the device: bf16 (default), f16
                            or f32 (exact comparisons against the CPU backend) */
    bool cuda_graphs;    /* replay captured graphs for repeating decode shapes */
} kvf_cuda_config_t;

/* Default: device 0, bf16, graphs on. */
kvf_cuda_config_t kvf_cuda_config_default(void);

/* Creates the CUDA backend on cfg->device and uploads model's weights in
 * cfg->wdtype (model stays the caller's and must outlive the backend).
 * KVF_ERR_UNSUPPORTED in a build without CUDA, KVF_ERR_DEVICE when there is
 * no such GPU, KVF_ERR_NOMEM when the weights do not fit; each logged with
 * the reason. On success be_p->ctx is owned by the backend:
 * kvf_backend_destroy(). */
kvf_status_t kvf_backend_cuda_create(const kvf_cuda_config_t *cfg, const struct kvf_model *model,
                                     kvf_backend_t *be_p);

/* True when be is the CUDA backend. */
bool kvf_backend_is_cuda(const kvf_backend_t *be);

/* Creates a pool of num_blocks blocks in be's device memory (zeroed), laid
 * out as every pool. With host_mirror, a pinned host mirror of the same
 * size is kvf_kvpool_base() (what the transport registers and ships) and
 * the device copy is what the kernels read: the CUDA forward copies the
 * blocks a batch wrote to the mirror, layer by layer, when its hooks ask
 * for it (kv_to_host), and kvf_kvpool_upload() copies landed blocks the
 * other way. Without it (a process that ships nothing) kvf_kvpool_base()
 * is NULL. On success *pool_p is owned by the caller: kvf_kvpool_destroy(),
 * before the backend. */
kvf_status_t kvf_backend_cuda_kvpool_create(kvf_backend_t *be, const kvf_kv_geometry_t *geo,
                                            uint32_t num_blocks, bool host_mirror,
                                            kvf_kvpool_t **pool_p);

/* Free and total device memory of be's GPU. */
kvf_status_t kvf_backend_cuda_mem_info(const kvf_backend_t *be, size_t *free_p, size_t *total_p);

/* Bytes of weights be holds on the device. */
size_t kvf_backend_cuda_weight_bytes(const kvf_backend_t *be);

/* bytes of host memory for arrays the engine fills every step (logits
 * rows): pinned on a GPU backend, so the copies run at full speed; plain
 * malloc otherwise. NULL when out of memory. Free with
 * kvf_backend_host_free() on the same backend, before it is destroyed. */
void *kvf_backend_host_alloc(const kvf_backend_t *be, size_t bytes);
void kvf_backend_host_free(const kvf_backend_t *be, void *p);
/* The same with the backend as a void *, for allocator hooks (e.g. the KV
 * tiers' host_alloc / host_free, kvf/kv_tier.h). */
void *kvf_backend_host_alloc_hook(void *be, size_t bytes);
void kvf_backend_host_free_hook(void *be, void *p);

/* One line for start-up logs: "cpu (avx512 kernels, 2 threads, bf16
 * weights)" or "cuda". */
void kvf_backend_describe(const kvf_backend_t *be, char *buf, size_t size);

/* Destroys the backend context; a zeroed backend is a no-op. */
void kvf_backend_destroy(kvf_backend_t *be);

#ifdef __cplusplus
}
#endif

#endif
