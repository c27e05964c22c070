// Decode steps as CUDA graphs (cuda_backend.cuh): a decode-only batch
// without host copies is captured once per shape (batch size, block-table
// width bucket, rows with logits, decode splits) and pool, and replayed:
// one launch instead of ~15 per layer. At most GRAPH_CACHE graphs are
// kept, the least recently used evicted first.
#include <string.h>

#include "cuda_backend.cuh"

void kvf_cuda__graphs_clear(cuda_ctx_t *c)
{
    for (int i = 0; i < GRAPH_CACHE; i++) {
        if (c->graphs[i].used)
            cudaGraphExecDestroy(c->graphs[i].exec);
        memset(&c->graphs[i], 0, sizeof(c->graphs[i]));
    }
}

graph_entry_t *kvf_cuda__graph_find(cuda_ctx_t *c, const kvf_kvpool_t *pool, const batch_plan_t *p)
{
    const void *dev = kvf_kvpool_device_base(pool);
    uint32_t blocks = kvf_kvpool_num_blocks(pool);
    int block_size = kvf_kvpool_geometry(pool)->block_size;
    for (int i = 0; i < GRAPH_CACHE; i++) {
        graph_entry_t *e = &c->graphs[i];
        if (e->used && e->n == p->n && e->bt_stride == p->bt_stride && e->n_out == p->n_out &&
            e->n_splits == p->n_splits && e->split_keys == p->split_keys && e->pool_dev == dev &&
            e->pool_blocks == blocks && e->pool_block_size == block_size)
            return e;
    }
    return NULL;
}

// A free cache entry, or the least recently used one emptied.
static graph_entry_t *graph_slot(cuda_ctx_t *c)
{
    for (int i = 0; i < GRAPH_CACHE; i++)
        if (!c->graphs[i].used)
            return &c->graphs[i];
    graph_entry_t *e = &c->graphs[0];
    for (int i = 1; i < GRAPH_CACHE; i++)
        if (c->graphs[i].last_use < e->last_use)
            e = &c->graphs[i];
    cudaGraphExecDestroy(e->exec);
    memset(e, 0, sizeof(*e));
    return e;
}

kvf_status_t kvf_cuda__graph_capture(cuda_ctx_t *c, kvf_kvpool_t *pool, const batch_plan_t *p,
                                     graph_entry_t **e_p)
{
    graph_entry_t *e = graph_slot(c);
    TRY(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal), "graph capture");
    kvf_status_t st = kvf_cuda__enqueue_forward(c, pool, p, 0, false);
    cudaGraph_t graph = NULL;
    cudaError_t err = cudaStreamEndCapture(c->stream, &graph);
    if (st != KVF_OK || err != cudaSuccess) {
        if (graph)
            cudaGraphDestroy(graph);
        cudaGetLastError();
        if (st == KVF_OK)
            st = KVF_CUDA_TRY(err, "graph capture");
        return st;
    }
    err = cudaGraphInstantiate(&e->exec, graph, 0);
    cudaGraphDestroy(graph);
    TRY(err, "graph instantiate");
    e->used = true;
    e->n = p->n;
    e->bt_stride = p->bt_stride;
    e->n_out = p->n_out;
    e->n_splits = p->n_splits;
    e->split_keys = p->split_keys;
    e->pool_dev = kvf_kvpool_device_base(pool);
    e->pool_blocks = kvf_kvpool_num_blocks(pool);
    e->pool_block_size = kvf_kvpool_geometry(pool)->block_size;
    *e_p = e;
    return KVF_OK;
}
