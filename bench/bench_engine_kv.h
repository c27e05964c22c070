/* kvf bench engine, long contexts: decode at 4k and 16k tokens of context
 * for every KV cache format, against a roofline of the weight bytes plus
 * the KV bytes a step reads (bench_engine_kv.c). */
#ifndef KVF_BENCH_ENGINE_KV_H
#define KVF_BENCH_ENGINE_KV_H

#include <cjson/cJSON.h>
#include <stdbool.h>

#include "kvf/backend.h"
#include "kvf/model.h"

/* What the long-context decode runs on: the model and backend of the run,
 * the weight bytes a step streams and the run's read bandwidth (bytes/s). */
typedef struct {
    const kvf_model_t *model;
    kvf_backend_t *backend;
    double weight_bytes, bandwidth;
    bool quick; /* 4k only, fewer steps */
} kvf_bench_kv_decode_t;

/* Measures and prints the table; adds "kv_decode" to out. Formats the
 * backend lacks are skipped (printed as such). Returns 0, or 1 after a
 * line on stderr. */
int kvf_bench_engine_kv_decode(const kvf_bench_kv_decode_t *in, cJSON *out);

#endif
