/* Single-process engine for the kvf tool. See local_engine.h. */
#include "local_engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kvf_status_t kvf_local_engine_init(kvf_local_engine_t *le, const char *prog,
                                   const char *model_dir, int threads,
                                   const kvf_backend_flags_t *backend, uint32_t max_positions)
{
    memset(le, 0, sizeof(*le));
    kvf_block_table_init(&le->table);
    /* One sequence of max_positions tokens, plus a block of slack. */
    kvf_engine_stack_config_t cfg = {
        .threads = threads,
        .block_size = KVF_KV_BLOCK_SIZE_DEFAULT,
        .max_blocks =
            (max_positions + KVF_KV_BLOCK_SIZE_DEFAULT - 1) / KVF_KV_BLOCK_SIZE_DEFAULT + 1,
    };
    if (backend && kvf_backend_flags_apply(backend, &cfg) != KVF_OK)
        return KVF_ERR_INVAL;
    kvf_status_t st = kvf_engine_stack_init(&le->rt, model_dir, &cfg);
    if (st != KVF_OK) {
        fprintf(stderr, "%s: cannot set up the engine for %s: %s\n", prog, model_dir,
                kvf_status_str(st));
        return st;
    }
    le->logits = malloc((size_t)le->rt.model->cfg.vocab * sizeof(float));
    if (!le->logits) {
        fprintf(stderr, "%s: out of memory\n", prog);
        kvf_engine_stack_fini(&le->rt);
        return KVF_ERR_NOMEM;
    }
    return KVF_OK;
}

kvf_status_t kvf_local_engine_feed(kvf_local_engine_t *le, const uint32_t *ids, uint32_t n)
{
    kvf_status_t st = kvf_block_table_reserve(&le->table, le->rt.pool, le->n_past + n);
    if (st != KVF_OK)
        return st;
    kvf_engine_seq_t seq = {.tokens = ids, .n_tokens = n, .start_pos = le->n_past,
                            .block_ids = le->table.blocks, .n_blocks = le->table.n_blocks,
                            .logits = le->logits};
    st = kvf_engine_forward(le->rt.engine, &seq, 1, NULL);
    if (st == KVF_OK)
        le->n_past += n;
    return st;
}

void kvf_local_engine_fini(kvf_local_engine_t *le)
{
    if (le->rt.pool)
        kvf_block_table_release(&le->table, le->rt.pool);
    kvf_block_table_fini(&le->table);
    free(le->logits);
    kvf_engine_stack_fini(&le->rt);
    memset(le, 0, sizeof(*le));
}
