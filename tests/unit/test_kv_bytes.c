/* The KV bytes per token of every format, three ways that must agree: a
 * pool's real memory (kvf_kvpool_bytes, with the last scale of the last
 * row inside it), kvf_kv_bytes_per_token, and the number `kvf kvcalc
 * --model` prints (run as the binary users run). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kvf/engine.h"
#include "kvf/kv_format.h"
#include "kvf/kvcache.h"
#include "kvf/model.h"
#include "support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#define MODEL_NAME "tiny-llama-f32"
#define POOL_BLOCKS 3

/* kvf kvcalc's kv_bytes_per_token for the model in dtype. */
static uint64_t kvcalc_per_token(const char *dtype)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             KVF_BIN_DIR "/kvf kvcalc --model " KVF_TEST_DATA "/golden/" MODEL_NAME
                         " --context 7 --kv-dtype %s",
             dtype);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char line[512];
    uint64_t v = 0;
    bool found = false;
    while (fgets(line, sizeof(line), p)) {
        const char *key = "kv_bytes_per_token";
        if (!strncmp(line, key, strlen(key))) {
            v = strtoull(line + strlen(key), NULL, 10);
            found = true;
        }
    }
    int status = pclose(p);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_true(found);
    return v;
}

/* Bytes per token a pool of geo really holds: its memory over its slots,
 * and the end of the last row of the last block's last layer (data, or
 * the V scale for a scaled format) is the end of the pool. */
static uint64_t pool_per_token(const kvf_kv_geometry_t *geo)
{
    kvf_kvpool_t *pool = NULL;
    assert_int_equal(kvf_kvpool_create(geo, POOL_BLOCKS, &pool), KVF_OK);
    size_t bytes = kvf_kvpool_bytes(pool);
    const uint8_t *base = kvf_kvpool_base(pool);
    uint32_t last = POOL_BLOCKS - 1;
    int layer = geo->n_layers - 1, head = geo->n_kv_heads - 1;
    const uint8_t *end;
    if (kvf_kv_scaled(geo->dtype))
        end = (const uint8_t *)(kvf_kvpool_head_scales(pool, last, layer, 1, head) +
                                geo->block_size);
    else
        end = (const uint8_t *)kvf_kvpool_head_data(pool, last, layer, 1, head) +
              (size_t)geo->block_size * geo->head_dim * kvf_kv_elem_bytes(geo->dtype);
    assert_int_equal((size_t)(end - base), bytes);
    kvf_kvpool_destroy(pool);
    assert_int_equal(bytes % ((size_t)POOL_BLOCKS * geo->block_size), 0);
    return bytes / ((size_t)POOL_BLOCKS * geo->block_size);
}

static void test_every_dtype(void **state)
{
    (void)state;
    kvf_model_t *model = kvf_test_load_golden(KVF_TEST_DATA, MODEL_NAME);
    const kvf_model_config_t *c = &model->cfg;
    for (int dt = 0; dt < KVF_KV_N_DTYPES; dt++) {
        kvf_kv_geometry_t geo = kvf_engine_kv_geometry(model, 16, (kvf_kv_dtype_t)dt);
        uint64_t want = 2ull * (uint64_t)c->n_layers * (uint64_t)c->n_kv_heads *
                        ((uint64_t)c->head_dim * kvf_kv_elem_bytes((kvf_kv_dtype_t)dt) +
                         (kvf_kv_scaled((kvf_kv_dtype_t)dt) ? 4 : 0));
        uint64_t pool = pool_per_token(&geo);
        uint64_t calc = kvcalc_per_token(kvf_kv_dtype_name((kvf_kv_dtype_t)dt));
        printf("%-5s pool %llu, kvcalc %llu bytes per token\n",
               kvf_kv_dtype_name((kvf_kv_dtype_t)dt), (unsigned long long)pool,
               (unsigned long long)calc);
        assert_int_equal(pool, want);
        assert_int_equal(kvf_kv_bytes_per_token(&geo), want);
        assert_int_equal(calc, want);
    }
    kvf_model_destroy(model);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_dtype),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
