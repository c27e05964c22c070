/* A single-process engine for kvf generate and kvf logits: model, backend
 * (CPU, or CUDA with --backend cuda), a KV pool sized for one sequence, and that sequence's block
 * table. */
#ifndef KVF_TOOLS_LOCAL_ENGINE_H
#define KVF_TOOLS_LOCAL_ENGINE_H

#include <stdint.h>

#include "kvf/backend.h"
#include "kvf/backend_flags.h"
#include "kvf/engine.h"
#include "kvf/kvcache.h"
#include "kvf/model.h"

typedef struct {
    kvf_engine_stack_t rt; /* model, backend, pool, engine */
    kvf_block_table_t table;
    uint32_t n_past; /* positions already in the cache */
    float *logits;   /* (vocab) of the last position run */
} kvf_local_engine_t;

/* Loads model_dir on the backend the flags name (NULL: CPU) and sizes the pool for max_positions tokens. Errors are
 * printed to stderr with prog. Caller owns *le (init/fini). */
kvf_status_t kvf_local_engine_init(kvf_local_engine_t *le, const char *prog,
                                   const char *model_dir, int threads,
                                   const kvf_backend_flags_t *backend, uint32_t max_positions);

/* Appends n tokens at the current position and computes the logits of the
 * last into le->logits. */
kvf_status_t kvf_local_engine_feed(kvf_local_engine_t *le, const uint32_t *ids, uint32_t n);

void kvf_local_engine_fini(kvf_local_engine_t *le);

#endif
