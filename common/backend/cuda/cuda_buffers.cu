// Device memory of the CUDA backend: allocation, and the activation buffers
// that grow with the batch (cuda_backend.cuh).
#include <string.h>

#include "cuda_backend.cuh"
#include "kvf/log.h"

void kvf_cuda__dev_free(void *p)
{
    if (p)
        cudaFree(p);
}

kvf_status_t kvf_cuda__dev_alloc(void **p, size_t bytes, const char *what)
{
    *p = NULL;
    if (bytes == 0)
        bytes = 256;
    cudaError_t err = cudaMalloc(p, bytes);
    if (err != cudaSuccess) {
        cudaGetLastError();
        kvf_log_error("cuda: cannot allocate %zu bytes of device memory for %s: %s", bytes, what,
                      cudaGetErrorString(err));
        *p = NULL;
        return KVF_ERR_NOMEM;
    }
    return KVF_OK;
}

static void free_token_buffers(cuda_ctx_t *c)
{
    kvf_cuda__dev_free(c->x);
    kvf_cuda__dev_free(c->delta);
    kvf_cuda__dev_free(c->qkv);
    kvf_cuda__dev_free(c->gu);
    kvf_cuda__dev_free(c->h);
    kvf_cuda__dev_free(c->att);
    kvf_cuda__dev_free(c->act);
    c->x = c->delta = c->qkv = c->gu = NULL;
    c->h = c->att = c->act = NULL;
    c->cap_tokens = 0;
}

static void free_out_buffers(cuda_ctx_t *c)
{
    kvf_cuda__dev_free(c->hout);
    kvf_cuda__dev_free(c->logits);
    kvf_cuda__dev_free(c->ids);
    if (c->ids_host)
        cudaFreeHost(c->ids_host);
    c->hout = NULL;
    c->logits = NULL;
    c->ids = c->ids_host = NULL;
    c->cap_out = 0;
}

// Rows of every token of the batch: residual stream, qkv, MLP and the
// act-typed GEMM inputs.
static kvf_status_t reserve_tokens(cuda_ctx_t *c, int n_tokens)
{
    const kvf_model_config_t *m = &c->model->cfg;
    size_t asz = c->wsz;
    kvf_cuda__graphs_clear(c);
    free_token_buffers(c);
    // Round up so a growing batch does not reallocate every step.
    int cap = n_tokens < 64 ? 64 : n_tokens;
    size_t n = (size_t)cap;
    if (kvf_cuda__dev_alloc((void **)&c->x, n * m->hidden * sizeof(float), "activations") ||
        kvf_cuda__dev_alloc((void **)&c->delta, n * m->hidden * sizeof(float), "activations") ||
        kvf_cuda__dev_alloc((void **)&c->qkv, n * c->qkv_dim * sizeof(float), "activations") ||
        kvf_cuda__dev_alloc((void **)&c->gu, n * 2 * m->inter * sizeof(float), "activations") ||
        kvf_cuda__dev_alloc(&c->h, n * m->hidden * asz, "activations") ||
        kvf_cuda__dev_alloc(&c->att, n * c->q_dim * asz, "activations") ||
        kvf_cuda__dev_alloc(&c->act, n * m->inter * asz, "activations")) {
        free_token_buffers(c);
        return KVF_ERR_NOMEM;
    }
    c->cap_tokens = cap;
    return KVF_OK;
}

// Rows that want logits or a greedy id.
static kvf_status_t reserve_out(cuda_ctx_t *c, int n_out)
{
    const kvf_model_config_t *m = &c->model->cfg;
    kvf_cuda__graphs_clear(c);
    free_out_buffers(c);
    int cap = n_out < 64 ? 64 : n_out;
    size_t n = (size_t)cap;
    if (kvf_cuda__dev_alloc(&c->hout, n * m->hidden * c->wsz, "logits") ||
        kvf_cuda__dev_alloc((void **)&c->logits, n * m->vocab * sizeof(float), "logits") ||
        kvf_cuda__dev_alloc((void **)&c->ids, n * sizeof(int32_t), "logits") ||
        KVF_CUDA_TRY(cudaMallocHost((void **)&c->ids_host, n * sizeof(int32_t)), "pinned ids")) {
        free_out_buffers(c);
        return KVF_ERR_NOMEM;
    }
    c->cap_out = cap;
    return KVF_OK;
}

// The decode splits' partial results: ws floats, and half as many again.
static kvf_status_t reserve_decode_ws(cuda_ctx_t *c, size_t ws)
{
    kvf_cuda__graphs_clear(c);
    kvf_cuda__dev_free(c->dec_ws);
    c->dec_ws = NULL;
    c->cap_ws = 0;
    ws += ws / 2;
    CHECK(kvf_cuda__dev_alloc((void **)&c->dec_ws, ws * sizeof(float), "decode workspace"));
    c->cap_ws = ws;
    return KVF_OK;
}

// The per-batch inputs on the device and their pinned host copy: total
// bytes, and half as many again.
static kvf_status_t reserve_meta(cuda_ctx_t *c, size_t total)
{
    kvf_cuda__graphs_clear(c);
    kvf_cuda__dev_free(c->meta_dev);
    if (c->meta_host)
        cudaFreeHost(c->meta_host);
    c->meta_dev = c->meta_host = NULL;
    c->cap_meta = 0;
    size_t bytes = total + total / 2;
    CHECK(kvf_cuda__dev_alloc(&c->meta_dev, bytes, "batch inputs"));
    CHECK(KVF_CUDA_TRY(cudaMallocHost(&c->meta_host, bytes), "pinned batch inputs"));
    c->cap_meta = bytes;
    return KVF_OK;
}

kvf_status_t kvf_cuda__reserve(cuda_ctx_t *c, const batch_plan_t *p)
{
    const kvf_model_config_t *m = &c->model->cfg;
    if (p->n > c->cap_tokens)
        CHECK(reserve_tokens(c, p->n));
    if (p->n_out > c->cap_out)
        CHECK(reserve_out(c, p->n_out));
    size_t ws = kvf_cuda_decode_ws_floats(p->n_dec, m->n_heads, p->n_splits, m->head_dim);
    if (ws > c->cap_ws)
        CHECK(reserve_decode_ws(c, ws));
    if (p->ml.total > c->cap_meta)
        CHECK(reserve_meta(c, p->ml.total));
    return KVF_OK;
}

void kvf_cuda__free_buffers(cuda_ctx_t *c)
{
    free_token_buffers(c);
    free_out_buffers(c);
    kvf_cuda__dev_free(c->dec_ws);
    kvf_cuda__dev_free(c->meta_dev);
    if (c->meta_host)
        cudaFreeHost(c->meta_host);
}
