/* The compute stack shared by the node roles and the kvf tool (engine.h). */
#include <string.h>
#include <unistd.h>

#include "kvf/engine.h"
#include "kvf/log.h"

/* The pool's size in blocks as the config bounds it: max_blocks, the byte
 * budget, max_full_sequences at the model's context; at most UINT32_MAX,
 * 0 when the budget holds no block. */
static uint64_t budget_blocks(const kvf_engine_stack_config_t *cfg, const kvf_model_t *model,
                              const kvf_kv_geometry_t *geo)
{
    uint64_t blocks = cfg->max_blocks ? cfg->max_blocks : UINT32_MAX;
    if (cfg->budget_bytes && cfg->budget_bytes / kvf_kv_block_bytes(geo) < blocks)
        blocks = cfg->budget_bytes / kvf_kv_block_bytes(geo);
    if (cfg->max_full_sequences) {
        uint32_t context = model->cfg.max_pos > 0 ? (uint32_t)model->cfg.max_pos : 1;
        uint64_t full = (uint64_t)cfg->max_full_sequences * kvf_kv_blocks_for_tokens(geo, context);
        if (full < blocks)
            blocks = full;
    }
    return blocks > UINT32_MAX ? UINT32_MAX : blocks;
}

/* Lowers *blocks_p to what the GPU's free memory holds (with a margin for
 * activations, cuBLAS and the graphs) and, with a host mirror, to half of
 * the host's memory. KVF_ERR_NO_SPACE when not one block fits. */
static kvf_status_t cuda_fit_blocks(kvf_engine_stack_t *s, const kvf_engine_stack_config_t *cfg,
                                    const kvf_kv_geometry_t *geo, uint64_t *blocks_p)
{
    uint64_t blocks = *blocks_p;
    size_t free_b = 0, total_b = 0;
    kvf_status_t st = kvf_backend_cuda_mem_info(&s->backend, &free_b, &total_b);
    if (st != KVF_OK)
        return st;
    uint64_t fit = (uint64_t)(free_b / 10 * 9) / kvf_kv_block_bytes(geo);
    if (fit < blocks) {
        if (cfg->budget_bytes || cfg->max_blocks)
            kvf_log_warn("kv pool: %llu blocks asked for, %llu fit in the GPU's free memory",
                         (unsigned long long)blocks, (unsigned long long)fit);
        blocks = fit;
    }
    if (cfg->kv_host_mirror) {
        /* The mirror is pinned host memory: at most half of the RAM. */
        uint64_t ram = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
        uint64_t host_fit = ram / 2 / kvf_kv_block_bytes(geo);
        if (host_fit < blocks) {
            kvf_log_info("kv pool: %llu blocks, as many as half of the host's memory mirrors",
                         (unsigned long long)host_fit);
            blocks = host_fit;
        }
    }
    if (blocks == 0) {
        kvf_log_error("kv pool: no block of %zu bytes fits in the GPU's free memory",
                      kvf_kv_block_bytes(geo));
        return KVF_ERR_NO_SPACE;
    }
    *blocks_p = blocks;
    return KVF_OK;
}

/* The CUDA backend, which takes the weights (the f32 host copy, 4 bytes a
 * parameter, then goes), and the pool in what the GPU has left. On
 * failure neither is left; the model stays. */
static kvf_status_t open_cuda(kvf_engine_stack_t *s, const kvf_engine_stack_config_t *cfg,
                              const kvf_kv_geometry_t *geo, uint64_t blocks)
{
    kvf_status_t st = kvf_backend_cuda_create(&cfg->cuda, s->model, &s->backend);
    if (st != KVF_OK)
        return st;
    kvf_model_drop_weights(s->model);
    st = cuda_fit_blocks(s, cfg, geo, &blocks);
    if (st == KVF_OK) {
        st = kvf_backend_cuda_kvpool_create(&s->backend, geo, (uint32_t)blocks, cfg->kv_host_mirror,
                                            &s->pool);
        if (st != KVF_OK)
            kvf_log_error("kv pool of %llu blocks on the GPU: %s", (unsigned long long)blocks,
                          kvf_status_str(st));
    }
    if (st != KVF_OK)
        kvf_backend_destroy(&s->backend);
    return st;
}

/* The pool in host memory and the CPU backend. On failure neither is
 * left; the model stays. */
static kvf_status_t open_cpu(kvf_engine_stack_t *s, const kvf_engine_stack_config_t *cfg,
                             const kvf_kv_geometry_t *geo, uint64_t blocks)
{
    kvf_status_t st = kvf_kvpool_create(geo, (uint32_t)blocks, &s->pool);
    if (st != KVF_OK) {
        kvf_log_error("kv pool of %llu blocks: %s", (unsigned long long)blocks, kvf_status_str(st));
        return st;
    }
    kvf_cpu_config_t cc = kvf_cpu_config_default();
    cc.n_threads = cfg->threads;
    cc.weights = cfg->cpu_weights;
    st = kvf_backend_cpu_create_cfg(&cc, &s->backend);
    if (st != KVF_OK) {
        kvf_log_error("cpu backend: %s", kvf_status_str(st));
        kvf_kvpool_destroy(s->pool);
    }
    return st;
}

kvf_status_t kvf_engine_stack_init(kvf_engine_stack_t *s, const char *model_dir,
                                   const kvf_engine_stack_config_t *cfg)
{
    memset(s, 0, sizeof(*s));
    kvf_status_t st = kvf_model_load(model_dir, &s->model);
    if (st != KVF_OK) {
        kvf_log_error("model %s: %s", model_dir, kvf_status_str(st));
        return st;
    }
    kvf_kv_geometry_t geo = kvf_engine_kv_geometry(s->model, cfg->block_size, cfg->kv_dtype);
    st = kvf_kv_geometry_validate(&geo);
    if (st != KVF_OK)
        goto fail_model;
    uint64_t blocks = budget_blocks(cfg, s->model, &geo);
    if (blocks == 0) {
        kvf_log_error("a KV budget of %llu bytes holds no block of %zu bytes",
                      (unsigned long long)cfg->budget_bytes, kvf_kv_block_bytes(&geo));
        st = KVF_ERR_NO_SPACE;
        goto fail_model;
    }
    st = cfg->backend == KVF_BACKEND_CUDA ? open_cuda(s, cfg, &geo, blocks)
                                          : open_cpu(s, cfg, &geo, blocks);
    if (st != KVF_OK)
        goto fail_model;
    st = kvf_engine_create(s->model, &s->backend, s->pool, &s->engine);
    if (st != KVF_OK) {
        kvf_log_error("engine: %s", kvf_status_str(st));
        goto fail_engine;
    }
    /* The CPU backend holds the projections in its own panels now (2
     * bytes a parameter for a bf16/f16 checkpoint): the f32 copy goes. */
    if (cfg->backend == KVF_BACKEND_CPU)
        kvf_model_drop_matrices(s->model);
    return KVF_OK;

fail_engine:
    /* The pool first: a device pool lives in the backend's GPU context. */
    kvf_kvpool_destroy(s->pool);
    kvf_backend_destroy(&s->backend);
fail_model:
    kvf_model_destroy(s->model);
    memset(s, 0, sizeof(*s));
    return st;
}

void kvf_engine_stack_fini(kvf_engine_stack_t *s)
{
    kvf_engine_destroy(s->engine);
    kvf_kvpool_destroy(s->pool); /* before the backend: a device pool lives in its context */
    kvf_backend_destroy(&s->backend);
    kvf_model_destroy(s->model);
    memset(s, 0, sizeof(*s));
}
