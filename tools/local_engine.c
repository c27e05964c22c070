/* Single-process engine for the kvf tool. See local_engine.h. */
#include "local_engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kvf_status_t kvf_local_engine_init(kvf_local_engine_t *le, const char *prog,
                                   const char *model_dir, int threads, uint32_t max_positions)
{
    memset(le, 0, sizeof(*le));
    kvf_block_table_init(&le->table);
    kvf_status_t st = kvf_model_load(model_dir, &le->model);
    if (st != KVF_OK) {
        fprintf(stderr, "%s: cannot load the model in %s: %s\n", prog, model_dir,
                kvf_status_str(st));
        return st;
    }
    st = kvf_backend_cpu_create(threads, &le->be);
    if (st != KVF_OK)
        goto fail_backend;
    kvf_kv_geometry_t g = kvf_engine_kv_geometry(le->model, KVF_KV_BLOCK_SIZE_DEFAULT);
    st = kvf_kvpool_create(&g, kvf_kv_blocks_for_tokens(&g, max_positions) + 1, &le->pool);
    if (st != KVF_OK)
        goto fail_pool;
    st = kvf_engine_create(le->model, &le->be, le->pool, &le->engine);
    if (st != KVF_OK)
        goto fail_engine;
    le->logits = malloc((size_t)le->model->cfg.vocab * sizeof(float));
    if (!le->logits) {
        st = KVF_ERR_NOMEM;
        goto fail_logits;
    }
    return KVF_OK;

fail_logits:
    kvf_engine_destroy(le->engine);
fail_engine:
    kvf_kvpool_destroy(le->pool);
fail_pool:
    kvf_backend_destroy(&le->be);
fail_backend:
    fprintf(stderr, "%s: cannot set up the engine: %s\n", prog, kvf_status_str(st));
    kvf_model_destroy(le->model);
    memset(le, 0, sizeof(*le));
    return st;
}

kvf_status_t kvf_local_engine_feed(kvf_local_engine_t *le, const uint32_t *ids, uint32_t n)
{
    kvf_status_t st = kvf_block_table_reserve(&le->table, le->pool, le->n_past + n);
    if (st != KVF_OK)
        return st;
    kvf_engine_seq_t seq = {.tokens = ids, .n_tokens = n, .start_pos = le->n_past,
                            .block_ids = le->table.blocks, .n_blocks = le->table.n_blocks,
                            .logits = le->logits};
    st = kvf_engine_forward(le->engine, &seq, 1, NULL);
    if (st == KVF_OK)
        le->n_past += n;
    return st;
}

void kvf_local_engine_fini(kvf_local_engine_t *le)
{
    if (le->pool)
        kvf_block_table_release(&le->table, le->pool);
    kvf_block_table_fini(&le->table);
    free(le->logits);
    kvf_engine_destroy(le->engine);
    kvf_kvpool_destroy(le->pool);
    kvf_backend_destroy(&le->be);
    kvf_model_destroy(le->model);
    memset(le, 0, sizeof(*le));
}
