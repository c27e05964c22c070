/* The command-line flags that choose an engine's backend (--backend,
 * --device, --gpu-dtype, --no-cuda-graphs, --cpu-dtype), the same in every
 * command that runs an engine: kvf generate, kvf logits, kvf bench engine,
 * kvf-prefill, kvf-decode. A command puts KVF_BACKEND_FLAG_ENTRIES in its
 * flag table (kvf/flags.h) and turns the parsed strings into an engine
 * stack's configuration (kvf/engine.h) with kvf_backend_flags_apply().
 * The commands that let the KV cache's format be chosen (the nodes, kvf
 * generate, kvf logits) add KVF_KV_DTYPE_FLAG_ENTRY (--kv-dtype). */
#ifndef KVF_BACKEND_FLAGS_H
#define KVF_BACKEND_FLAGS_H

#include <stdbool.h>

#include "kvf/engine.h"
#include "kvf/flags.h"
#include "kvf/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The flags as parsed; zeroed is the CPU backend with native weights. */
typedef struct {
    const char *backend;   /* "cpu" (default) or "cuda" */
    int device;            /* CUDA device index */
    const char *gpu_dtype; /* weights on the GPU: "bf16" (default), "f16", "f32" */
    bool no_graphs;        /* do not replay CUDA graphs */
    const char *cpu_dtype; /* CPU weight matrices: "native" (default) or "f32" */
    const char *kv_dtype;  /* KV cache format (kvf/kv_format.h); NULL: the backend's default */
} kvf_backend_flags_t;

/* The KV cache format when --kv-dtype is not given: f32 on the CPU (its
 * kernels are exact in f32 and memory is plentiful), bf16 on the GPU
 * (half the HBM and half the bytes shipped per token; the reasoning is in
 * docs/numerics.md). */
#define KVF_KV_DTYPE_DEFAULT_CPU KVF_KV_F32
#define KVF_KV_DTYPE_DEFAULT_CUDA KVF_KV_BF16

/* kvf_flag_t entries for a kvf_backend_flags_t *f (one a line: clang-format
 * would join them into one). */
/* clang-format off */
#define KVF_BACKEND_FLAG_ENTRIES(f)                                                                \
    {"backend", KVF_FLAG_STRING, &(f)->backend, "cpu|cuda",                                        \
     "compute backend (cuda: weights and KV cache on the GPU)", NULL},                             \
    {"device", KVF_FLAG_INT, &(f)->device, "N", "CUDA device index (--backend cuda)", NULL},       \
    {"gpu-dtype", KVF_FLAG_STRING, &(f)->gpu_dtype, "bf16|f16|f32",                                \
     "weight type on the GPU (f32: exact comparisons with the CPU)", NULL},                        \
    {"no-cuda-graphs", KVF_FLAG_BOOL, &(f)->no_graphs, NULL,                                       \
     "launch every kernel instead of replaying captured decode steps", NULL},                      \
    {"cpu-dtype", KVF_FLAG_STRING, &(f)->cpu_dtype, "native|f32",                                  \
     "CPU weights: as the checkpoint stores them (bf16/f16 stay 2 bytes) or widened to f32; "      \
     "same results", NULL}

#define KVF_KV_DTYPE_FLAG_ENTRY(f)                                                                 \
    {"kv-dtype", KVF_FLAG_STRING, &(f)->kv_dtype, "f32|bf16|f16|fp8|int8",                         \
     "KV cache format (default f32 on the CPU, bf16 with --backend cuda); must match the "        \
     "cluster's nodes", NULL}
/* clang-format on */

/* Parses f into cfg->backend, cfg->cuda, cfg->cpu_weights and
 * cfg->kv_dtype (the backend's default when f->kv_dtype is NULL).
 * KVF_ERR_INVAL (logged) for an unknown backend or dtype, or a negative
 * device; cfg is left as it was then. */
kvf_status_t kvf_backend_flags_apply(const kvf_backend_flags_t *f, kvf_engine_stack_config_t *cfg);

#ifdef __cplusplus
}
#endif

#endif
