/* Shared test helpers. See support.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

#include <cmocka.h>

#include "support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

kvf_model_t *kvf_test_load_golden(const char *data_dir, const char *name)
{
    char dir[1200];
    snprintf(dir, sizeof(dir), "%s/golden/%s", data_dir, name);
    kvf_model_t *m = NULL;
    assert_int_equal(kvf_model_load(dir, &m), KVF_OK);
    return m;
}

cJSON *kvf_test_load_expected(const char *data_dir)
{
    char path[1200];
    snprintf(path, sizeof(path), "%s/golden/expected.json", data_dir);
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    rewind(fp);
    char *text = malloc((size_t)n + 1);
    assert_non_null(text);
    assert_int_equal(fread(text, 1, (size_t)n, fp), (size_t)n);
    text[n] = 0;
    fclose(fp);
    cJSON *root = cJSON_Parse(text);
    free(text);
    assert_non_null(root);
    return root;
}

uint32_t *kvf_test_json_ids(const cJSON *arr, int *n_p)
{
    int n = cJSON_GetArraySize(arr);
    uint32_t *ids = malloc((size_t)(n > 0 ? n : 1) * sizeof(*ids));
    assert_non_null(ids);
    for (int i = 0; i < n; i++)
        ids[i] = (uint32_t)cJSON_GetArrayItem(arr, i)->valueint;
    *n_p = n;
    return ids;
}

kvf_model_config_t kvf_test_model_config(int n_heads, int n_kv_heads, bool qwen2)
{
    kvf_model_config_t c;
    memset(&c, 0, sizeof(c));
    c.arch = qwen2 ? KVF_ARCH_QWEN2 : KVF_ARCH_LLAMA;
    c.qkv_bias = qwen2;
    c.tie_embeddings = qwen2;
    c.n_layers = 2;
    c.n_heads = n_heads;
    c.n_kv_heads = n_kv_heads;
    c.head_dim = 16;
    c.hidden = 64;
    c.inter = 96;
    c.vocab = 200;
    c.max_pos = 512;
    c.rope_theta = 10000;
    c.rms_eps = 1e-5;
    c.bos_id = 1;
    c.eos_ids[0] = 2;
    c.n_eos = 1;
    return c;
}

void kvf_test_write_model(char *dir_template, const kvf_model_config_t *cfg, uint64_t seed)
{
    assert_non_null(mkdtemp(dir_template));
    assert_int_equal(kvf_model_write_random(dir_template, cfg, KVF_DTYPE_F32, seed), KVF_OK);
}

void kvf_test_remove_model(const char *dir)
{
    char path[1200];
    const char *files[] = {"config.json", "generation_config.json", "model.safetensors"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

kvf_model_t *kvf_test_random_model(const kvf_model_config_t *cfg, uint64_t seed)
{
    char dir[] = "/tmp/kvf_test_model_XXXXXX";
    kvf_test_write_model(dir, cfg, seed);
    kvf_model_t *m = NULL;
    kvf_status_t st = kvf_model_load(dir, &m);
    kvf_test_remove_model(dir);
    assert_int_equal(st, KVF_OK);
    return m;
}

void kvf_test_random_ids(uint32_t *ids, int n, int vocab, uint32_t seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        ids[i] = (seed >> 8) % (uint32_t)vocab;
    }
}

float kvf_test_max_abs_diff(const float *a, const float *b, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (isnan(d))
            return NAN;
        m = d > m ? d : m;
    }
    return m;
}

float kvf_test_rel_diff(const float *a, const float *b, size_t n)
{
    float scale = 1;
    for (size_t i = 0; i < n; i++)
        scale = fabsf(b[i]) > scale ? fabsf(b[i]) : scale;
    return kvf_test_max_abs_diff(a, b, n) / scale;
}

int kvf_test_cpu_isas(kvf_cpu_isa_t *isas)
{
    static bool printed;
    int n = 0;
    for (int i = KVF_CPU_ISA_SCALAR; i < KVF_CPU_ISA_COUNT; i++)
        if (kvf_cpu_isa_supported((kvf_cpu_isa_t)i))
            isas[n++] = (kvf_cpu_isa_t)i;
    if (!printed) {
        printf("cpu instruction sets under test:");
        for (int i = 0; i < n; i++)
            printf(" %s", kvf_cpu_isa_name(isas[i]));
        printf("\n");
        printed = true;
    }
    return n;
}

void kvf_test_cpu_backend(kvf_backend_t *be, int n_threads, kvf_cpu_isa_t isa,
                          kvf_cpu_weights_t weights)
{
    kvf_cpu_config_t c = kvf_cpu_config_default();
    c.n_threads = n_threads;
    c.isa = isa;
    c.weights = weights;
    assert_int_equal(kvf_backend_cpu_create_cfg(&c, be), KVF_OK);
    assert_int_equal(kvf_backend_cpu_isa(be), isa);
}

void kvf_test_assert_bits(const float *got, const float *want, size_t n, const char *what)
{
    if (memcmp(got, want, n * sizeof(float)) == 0)
        return;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
            fail_msg("%s: element %zu is %.9g, want %.9g (bit for bit)", what, i, got[i], want[i]);
}

/* ---- engine rigs (support.h) ---------------------------------------- */

/* A CPU backend on threads threads with isa's kernels. */
void kvf_test_rig_open_isa(kvf_test_rig_t *r, kvf_model_t *model, int block_size,
                           uint32_t num_blocks, kvf_cpu_isa_t isa, int threads,
                           kvf_cpu_weights_t weights)
{
    kvf_test_rig_open_kv(r, model, block_size, num_blocks, isa, threads, weights, KVF_KV_F32);
}

void kvf_test_rig_open_kv(kvf_test_rig_t *r, kvf_model_t *model, int block_size,
                          uint32_t num_blocks, kvf_cpu_isa_t isa, int threads,
                          kvf_cpu_weights_t weights, kvf_kv_dtype_t dtype)
{
    memset(r, 0, sizeof(*r));
    r->model = model;
    kvf_test_cpu_backend(&r->be, threads, isa, weights);
    kvf_kv_geometry_t g = kvf_engine_kv_geometry(model, block_size, dtype);
    assert_int_equal(kvf_kvpool_create(&g, num_blocks, &r->pool), KVF_OK);
    assert_int_equal(kvf_engine_create(model, &r->be, r->pool, &r->engine), KVF_OK);
}

kvf_kv_dtype_t kvf_test_env_kv_dtype(void)
{
    const char *name = getenv("KVF_KV_DTYPE");
    kvf_kv_dtype_t dt = KVF_KV_F32;
    if (name && *name)
        assert_int_equal(kvf_kv_dtype_parse(name, &dt), KVF_OK);
    return dt;
}

/* Two threads on the best instruction set here. */
void kvf_test_rig_open(kvf_test_rig_t *r, kvf_model_t *model, int block_size, uint32_t num_blocks)
{
    kvf_test_rig_open_isa(r, model, block_size, num_blocks, kvf_cpu_isa_best(), 2,
                          KVF_CPU_WEIGHTS_NATIVE);
}

void kvf_test_rig_close(kvf_test_rig_t *r)
{
    kvf_engine_destroy(r->engine);
    kvf_kvpool_destroy(r->pool);
    kvf_backend_destroy(&r->be);
}

/* Runs a sequence of `chunks` forward calls over prompt (sizes chunk each,
 * last one smaller) into a fresh block table; returns logits of every
 * position in all (n, vocab) when all != NULL, and the last position's in
 * last (vocab). Leaves the table allocated in *bt. */
void kvf_test_run_chunked(kvf_test_rig_t *r, kvf_block_table_t *bt, const uint32_t *ids, int n,
                          int chunk, float *all, float *last)
{
    int V = r->model->cfg.vocab;
    assert_int_equal(kvf_block_table_reserve(bt, r->pool, (uint32_t)n), KVF_OK);
    for (int s = 0; s < n; s += chunk) {
        int c = n - s < chunk ? n - s : chunk;
        kvf_engine_seq_t q = {.tokens = ids + s,
                              .n_tokens = (uint32_t)c,
                              .start_pos = (uint32_t)s,
                              .block_ids = bt->blocks,
                              .n_blocks = bt->n_blocks,
                              .all_logits = all != NULL,
                              .logits = all ? all + (size_t)s * V : NULL};
        if (!all && s + c == n)
            q.logits = last;
        assert_int_equal(kvf_engine_forward(r->engine, &q, 1, NULL), KVF_OK);
    }
    if (all && last)
        memcpy(last, all + (size_t)(n - 1) * V, (size_t)V * sizeof(float));
}

/* ---- the log, captured ------------------------------------------------------ */

static int saved_stderr = -1;
static FILE *captured;

void kvf_test_stderr_begin(void)
{
    fflush(stderr);
    captured = tmpfile();
    assert_non_null(captured);
    saved_stderr = dup(STDERR_FILENO);
    assert_true(saved_stderr >= 0);
    assert_true(dup2(fileno(captured), STDERR_FILENO) >= 0);
}

char *kvf_test_stderr_end(void)
{
    fflush(stderr);
    assert_true(dup2(saved_stderr, STDERR_FILENO) >= 0);
    close(saved_stderr);
    saved_stderr = -1;
    long n = ftell(captured);
    assert_true(n >= 0);
    char *text = malloc((size_t)n + 1);
    assert_non_null(text);
    rewind(captured);
    size_t got = fread(text, 1, (size_t)n, captured);
    text[got] = '\0';
    fclose(captured);
    captured = NULL;
    return text;
}
