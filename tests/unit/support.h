/* Helpers the engine and backend tests share: golden data, random models,
 * token ids, logit comparisons. cmocka assertions: a failure fails the
 * calling test. */
#ifndef KVF_TEST_SUPPORT_H
#define KVF_TEST_SUPPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "kvf/backend.h"
#include "kvf/engine.h"
#include "kvf/kvcache.h"
#include "kvf/model.h"

/* Loads <data_dir>/golden/<name> (data_dir: tests/data). Owned by the
 * caller: kvf_model_destroy(). */
kvf_model_t *kvf_test_load_golden(const char *data_dir, const char *name);

/* Parses <data_dir>/golden/expected.json. Owned by the caller:
 * cJSON_Delete(). */
cJSON *kvf_test_load_expected(const char *data_dir);

/* The ints of a JSON array as token ids, in a malloc'd array (caller
 * frees); *n_p receives the count. */
uint32_t *kvf_test_json_ids(const cJSON *arr, int *n_p);

/* A geometry for random models: 2 layers, head_dim 16, hidden 64, inter 96,
 * vocab 200, 512 positions, Llama (qwen2: q/k/v biases and tied
 * embeddings). Callers change what they need. */
kvf_model_config_t kvf_test_model_config(int n_heads, int n_kv_heads, bool qwen2);

/* Writes a model with random f32 weights for cfg into a new directory made
 * from template (mkdtemp: ends in XXXXXX, modified in place). */
void kvf_test_write_model(char *dir_template, const kvf_model_config_t *cfg, uint64_t seed);

/* Removes what kvf_test_write_model wrote, and the directory. */
void kvf_test_remove_model(const char *dir);

/* Writes, loads and removes a random model. Owned by the caller:
 * kvf_model_destroy(). */
kvf_model_t *kvf_test_random_model(const kvf_model_config_t *cfg, uint64_t seed);

/* n pseudo-random ids below vocab, a function of seed. */
void kvf_test_random_ids(uint32_t *ids, int n, int vocab, uint32_t seed);

/* The CPU instruction sets this machine runs, scalar first, into isas
 * (room for KVF_CPU_ISA_COUNT); returns how many. Prints them once. */
int kvf_test_cpu_isas(kvf_cpu_isa_t *isas);

/* A CPU backend on n_threads threads with isa's kernels and weights
 * held as weights (assertion on failure). */
void kvf_test_cpu_backend(kvf_backend_t *be, int n_threads, kvf_cpu_isa_t isa,
                          kvf_cpu_weights_t weights);

/* memcmp-equal, or fails naming what and the first differing element. */
void kvf_test_assert_bits(const float *got, const float *want, size_t n, const char *what);

/* max |a - b|; NaN anywhere gives NaN. */
float kvf_test_max_abs_diff(const float *a, const float *b, size_t n);

/* max |a - b| / max(1, max |b|): relative to the logits' scale. */
float kvf_test_rel_diff(const float *a, const float *b, size_t n);

/* A CPU backend, a pool and an engine over model (test_engine*.c). */
typedef struct {
    kvf_model_t *model;
    kvf_backend_t be;
    kvf_kvpool_t *pool;
    kvf_engine_t *engine;
} kvf_test_rig_t;

/* A CPU backend on threads threads with isa's kernels, a pool of
 * num_blocks blocks of block_size, an engine. */
void kvf_test_rig_open_isa(kvf_test_rig_t *r, kvf_model_t *model, int block_size,
                           uint32_t num_blocks, kvf_cpu_isa_t isa, int threads,
                           kvf_cpu_weights_t weights);
/* The same with a pool of KV format dtype. */
void kvf_test_rig_open_kv(kvf_test_rig_t *r, kvf_model_t *model, int block_size,
                          uint32_t num_blocks, kvf_cpu_isa_t isa, int threads,
                          kvf_cpu_weights_t weights, kvf_kv_dtype_t dtype);
/* The KV format the node tests run in: $KVF_KV_DTYPE (which the nodes
 * they start read too), f32 when unset. */
kvf_kv_dtype_t kvf_test_env_kv_dtype(void);

/* Two threads on the best instruction set here. */
void kvf_test_rig_open(kvf_test_rig_t *r, kvf_model_t *model, int block_size, uint32_t num_blocks);
void kvf_test_rig_close(kvf_test_rig_t *r);

/* Forward calls of chunk ids each over ids[0, n) into a fresh block table:
 * every position's logits in all (n, vocab) when all != NULL, the last
 * position's in last (vocab). Leaves the table allocated in *bt. */
void kvf_test_run_chunked(kvf_test_rig_t *r, kvf_block_table_t *bt, const uint32_t *ids, int n,
                          int chunk, float *all, float *last);

/* Sends this process's stderr (the log) to a temporary file until
 * kvf_test_stderr_end(), which restores it and returns what was written
 * (malloc'd, NUL-terminated; the caller frees it). Not nested. */
void kvf_test_stderr_begin(void);
char *kvf_test_stderr_end(void);

#endif
