/* The forward pass: one call runs a batch of sequences through the model.
 *
 * Each sequence brings n >= 1 new tokens, the position of the first, and
 * its block table, which must already cover start_pos + n positions.
 * Prefill (n = prompt length), decode (n = 1) and mixed batches (chunked
 * prefill beside decodes) are the same call. The new tokens' K/V are written
 * into the pool; attention reads positions 0..p of the sequence from it.
 *
 * Thread rules: an engine belongs to one compute thread; it reads the model
 * and writes the blocks named in the batch (nothing else of the pool). */
#ifndef KVF_ENGINE_H
#define KVF_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "kvf/backend.h"
#include "kvf/kvcache.h"
#include "kvf/model.h"
#include "kvf/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvf_engine kvf_engine_t;

/* One sequence of a batch. */
typedef struct kvf_engine_seq {
    const uint32_t *tokens;    /* (n_tokens) new token ids */
    uint32_t n_tokens;         /* >= 1 */
    uint32_t start_pos;        /* position of tokens[0] */
    const uint32_t *block_ids; /* (n_blocks) the sequence's block table */
    uint32_t n_blocks;         /* >= ceil((start_pos + n_tokens) / block_size) */
    bool all_logits;           /* logits for every new token, not just the last */
    float *logits;             /* out, caller's memory: (vocab) or (n_tokens, vocab) with
                                  all_logits; NULL: no logits wanted */
    uint32_t *greedy_token;    /* out, or NULL: the id of the last token's largest logit
                                  (the lowest id on ties), found where the logits are
                                  computed; with logits NULL the vocab row never leaves
                                  the backend (greedy decoding on a GPU) */
} kvf_engine_seq_t;

/* Called after layer l's K/V for the whole batch is in the pool, while
 * layers l+1... still have to run (the prefill node ships layer l from
 * here). Runs on the compute thread; must not touch the engine. Layers are
 * reported in order, each once. */
typedef struct kvf_engine_hooks {
    void (*on_layer_done)(void *arg, int layer);
    void *arg;
    /* With a device pool: the batch's blocks of layer l must be in the
     * pool's host memory (kvf_kvpool_base) when on_layer_done(l) runs. The
     * CUDA backend then copies them out while later layers compute. */
    bool kv_to_host;
} kvf_engine_hooks_t;

/* Binds model, backend and pool (borrowed: they must outlive the engine).
 * The pool's geometry must match the model (layers, kv heads, head_dim):
 * KVF_ERR_MISMATCH otherwise. On success *engine_p is owned by the caller:
 * kvf_engine_destroy(). */
kvf_status_t kvf_engine_create(const kvf_model_t *model, kvf_backend_t *backend, kvf_kvpool_t *pool,
                               kvf_engine_t **engine_p);

/* Frees the engine's scratch; NULL is a no-op. */
void kvf_engine_destroy(kvf_engine_t *engine);

/* Runs the batch. Validates it first (token ids below vocab, block ids in
 * the pool, tables long enough, positions below 2^31): KVF_ERR_INVAL,
 * nothing written. hooks may be NULL. */
kvf_status_t kvf_engine_forward(kvf_engine_t *engine, const kvf_engine_seq_t *seqs, int n_seqs,
                                const kvf_engine_hooks_t *hooks);

/* The compute stack a process serves from: model, CPU backend, KV pool and
 * engine, made and torn down together (the node roles and the kvf tool). */
typedef struct {
    kvf_model_t *model;
    kvf_backend_t backend;
    kvf_kvpool_t *pool;
    kvf_engine_t *engine;
} kvf_engine_stack_t;

/* How big a stack to make, on which backend. */
typedef struct {
    kvf_backend_kind_t backend;    /* cpu (default) or cuda */
    kvf_cuda_config_t cuda;        /* with cuda: device, weight dtype, graphs */
    int threads;                   /* CPU backend threads; <= 0: every core */
    kvf_cpu_weights_t cpu_weights; /* CPU backend: native (default) or f32 matrices */
    int block_size;                /* tokens per KV block */
    kvf_kv_dtype_t kv_dtype;       /* KV cache format (0: f32) */
    uint64_t budget_bytes;         /* pool: as many blocks as this holds; 0: no budget */
    uint64_t max_blocks;           /* ... but at most this many; 0: no cap */
    uint32_t max_full_sequences;   /* ... nor more than this many full-context
                                      sequences need; 0: no cap */
    bool kv_host_mirror;           /* cuda: keep a host mirror of the pool (nodes that
                                      ship K/V over the transport) */
} kvf_engine_stack_config_t;

/* Loads model_dir, creates the backend cfg names, a pool sized by cfg (at
 * least one block, else KVF_ERR_NO_SPACE; with cuda, in device memory and
 * never more than 90% of what is free after the weights) and the engine
 * over them. Logs what
 * failed. The caller owns *stack (init/fini); on failure it is left
 * empty. */
kvf_status_t kvf_engine_stack_init(kvf_engine_stack_t *stack, const char *model_dir,
                                   const kvf_engine_stack_config_t *cfg);

/* Tears the stack down (engine, backend, pool, model). Anything that
 * registered the pool's memory (a transfer handle) must be gone first. */
void kvf_engine_stack_fini(kvf_engine_stack_t *stack);

/* The KV geometry a model needs, with the given block size and format. */
kvf_kv_geometry_t kvf_engine_kv_geometry(const kvf_model_t *model, int block_size,
                                         kvf_kv_dtype_t dtype);

/* FLOPs of a forward over n_new tokens starting at start_pos for one
 * sequence (projections, attention over the causal context, and the
 * lm_head for n_logits rows): for benchmarks. */
double kvf_engine_flops(const kvf_model_config_t *cfg, uint32_t start_pos, uint32_t n_new,
                        uint32_t n_logits);

#ifdef __cplusplus
}
#endif

#endif
