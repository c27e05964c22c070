// The CUDA backend: the engine's forward pass on one GPU.
//
// Weights live on the device in the configured dtype (bf16 by default, f16,
// or f32 for exact comparisons), in one slab; norms and biases stay f32.
// GEMMs are cuBLAS (tensor cores for 16-bit weights) with f32 outputs, so
// the residual stream, q/k/v and the KV pool are f32 as on the CPU
// backend: a split cluster can mix CPU and GPU nodes, and the layout and
// numbers of the KV that travels are the same. Per layer, for the batch's
// rows x (engine.c has the same math for the CPU ops):
//
//   h = rmsnorm(x += delta)          add_rmsnorm (delta: previous MLP out)
//   qkv = h . Wqkv^T                 cuBLAS
//   + b, rope(q), rope(k), kv write  qkv_rope_write (one kernel)
//   att = attention(q, pool)         attention_prefill(_tc).cu / _decode.cu
//   delta = att . Wo^T               cuBLAS
//   h = rmsnorm(x += delta)          add_rmsnorm
//   act = swiglu(h . Wgu^T)          cuBLAS + swiglu
//   delta = act . Wdown^T            cuBLAS
//
// then logits = rmsnorm(x += delta) . lm_head^T for the rows that want them,
// and a device argmax for rows that only want the greedy token.
//
// Every per-batch input (token ids, positions, block tables, rotation
// angles, tile lists) is packed on the host into one pinned buffer and
// uploaded with one copy. Decode-only batches without host copies are
// captured as CUDA graphs keyed by their shape (batch size, block-table
// width bucket, rows with logits) and replayed: one launch instead of ~15
// per layer.
//
// Thread rules: the backend belongs to one compute thread, as the engine.
//
// This file holds the context (device, streams, cuBLAS, events), the ops
// table and the kvf/backend.h entry points; cuda_backend.cuh lists the
// files of the rest.
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.cuh"
#include "device_query.h"
#include "kvf/log.h"

static kvf_status_t cuda_synchronize(void *ctx)
{
    cuda_ctx_t *c = (cuda_ctx_t *)ctx;
    TRY(cudaStreamSynchronize(c->stream), "synchronize");
    return KVF_OK;
}

static void cuda_destroy(void *ctx)
{
    cuda_ctx_t *c = (cuda_ctx_t *)ctx;
    if (!c)
        return;
    cudaSetDevice(c->cfg.device);
    if (c->stream)
        cudaStreamSynchronize(c->stream);
    if (c->copy_stream)
        cudaStreamSynchronize(c->copy_stream);
    kvf_cuda__graphs_clear(c);
    kvf_cuda__free_buffers(c);
    if (c->layer_done)
        for (int l = 0; l < c->model->cfg.n_layers; l++) {
            if (c->layer_done[l])
                cudaEventDestroy(c->layer_done[l]);
            if (c->copy_done[l])
                cudaEventDestroy(c->copy_done[l]);
        }
    free(c->layer_done);
    free(c->copy_done);
    free(c->touched);
    free(c->layers);
    kvf_cuda__dev_free(c->wslab);
    kvf_cuda__dev_free(c->blas_ws);
    if (c->blas)
        cublasDestroy(c->blas);
    if (c->stream)
        cudaStreamDestroy(c->stream);
    if (c->copy_stream)
        cudaStreamDestroy(c->copy_stream);
    free(c);
}

static void *cuda_host_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    void *p = NULL;
    if (cudaMallocHost(&p, bytes) != cudaSuccess) {
        cudaGetLastError();
        kvf_log_error("cuda: cannot allocate %zu bytes of pinned host memory", bytes);
        return NULL;
    }
    return p;
}

static void cuda_host_free(void *ctx, void *p)
{
    (void)ctx;
    cudaFreeHost(p);
}

// Positional: nvcc's C++ takes designated initializers only in order, and
// the per-op slots are unused (forward owns the whole pass).
static const kvf_backend_ops_t cuda_ops = {
    "cuda",
    NULL, // matmul
    NULL, // rmsnorm
    NULL, // head_rmsnorm: qkv_rope_write does Qwen3's q/k norms
    NULL, // rope
    NULL, // kv_write
    NULL, // attention
    NULL, // swiglu
    NULL, // geglu
    NULL, // rmsnorm_add
    kvf_cuda__forward,
    NULL, // bind_model: the weights were uploaded at creation
    NULL, // matmul_bound: forward owns the whole pass
    cuda_synchronize,
    cuda_destroy,
    cuda_host_alloc,
    cuda_host_free,
};

// ---- creation -------------------------------------------------------------

// The device exists, the weight dtype is one the kernels take, and so is
// the model's attention shape.
static kvf_status_t check_config(const kvf_cuda_config_t *cfg, const kvf_model_config_t *m)
{
    int n_dev = 0;
    cudaError_t err = cudaGetDeviceCount(&n_dev);
    if (err != cudaSuccess || n_dev == 0) {
        cudaGetLastError();
        kvf_log_error("cuda backend: no GPU (%s)",
                      err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device");
        return KVF_ERR_DEVICE;
    }
    if (cfg->device < 0 || cfg->device >= n_dev) {
        kvf_log_error("cuda backend: no device %d (%d GPU%s)", cfg->device, n_dev,
                      n_dev == 1 ? "" : "s");
        return KVF_ERR_DEVICE;
    }
    if (cfg->wdtype != KVF_DTYPE_BF16 && cfg->wdtype != KVF_DTYPE_F16 &&
        cfg->wdtype != KVF_DTYPE_F32) {
        kvf_log_error("cuda backend: weight dtype %s (bf16, f16 or f32)",
                      kvf_dtype_name(cfg->wdtype));
        return KVF_ERR_INVAL;
    }
    int group = m->n_heads / m->n_kv_heads;
    if (m->head_dim % 8 != 0 || m->head_dim > KVF_CUDA_MAX_HEAD_DIM || group > KVF_CUDA_MAX_GROUP) {
        kvf_log_error("cuda backend: head dim %d / %d query heads per kv head not supported "
                      "(a multiple of 8 up to %d; at most %d)",
                      m->head_dim, group, KVF_CUDA_MAX_HEAD_DIM, KVF_CUDA_MAX_GROUP);
        return KVF_ERR_UNSUPPORTED;
    }
    return KVF_OK;
}

// The compute and copy streams, and cuBLAS on the compute stream with a
// fixed workspace (cuBLAS must not allocate while a graph captures).
static kvf_status_t create_streams(cuda_ctx_t *c)
{
    TRY(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "stream create");
    TRY(cudaStreamCreateWithFlags(&c->copy_stream, cudaStreamNonBlocking), "stream create");
    CHECK(kvf_cuda_blas_status(cublasCreate(&c->blas), "create"));
    CHECK(kvf_cuda_blas_status(cublasSetStream(c->blas, c->stream), "set stream"));
    CHECK(kvf_cuda__dev_alloc(&c->blas_ws, BLAS_WORKSPACE_BYTES, "cublas workspace"));
    CHECK(kvf_cuda_blas_status(cublasSetWorkspace(c->blas, c->blas_ws, BLAS_WORKSPACE_BYTES),
                               "set workspace"));
    CHECK(kvf_cuda_blas_status(cublasSetMathMode(c->blas, c->wdt == KVF_DTYPE_F32
                                                              ? CUBLAS_PEDANTIC_MATH
                                                              : CUBLAS_DEFAULT_MATH),
                               "math mode"));
    return KVF_OK;
}

// The per-layer weight pointers and the per-layer events of the hooks.
static kvf_status_t create_layers(cuda_ctx_t *c, int n_layers)
{
    c->layers = (cuda_layer_t *)calloc((size_t)n_layers, sizeof(cuda_layer_t));
    c->layer_done = (cudaEvent_t *)calloc((size_t)n_layers, sizeof(cudaEvent_t));
    c->copy_done = (cudaEvent_t *)calloc((size_t)n_layers, sizeof(cudaEvent_t));
    if (!c->layers || !c->layer_done || !c->copy_done)
        return KVF_ERR_NOMEM;
    for (int l = 0; l < n_layers; l++) {
        TRY(cudaEventCreateWithFlags(&c->layer_done[l], cudaEventDisableTiming), "event create");
        TRY(cudaEventCreateWithFlags(&c->copy_done[l], cudaEventDisableTiming), "event create");
    }
    return KVF_OK;
}

static kvf_status_t create(const kvf_cuda_config_t *cfg, const kvf_model_t *model, cuda_ctx_t *c)
{
    CHECK(check_config(cfg, &model->cfg));
    TRY(cudaSetDevice(cfg->device), "set device");
    TRY(cudaDeviceGetAttribute(&c->n_sms, cudaDevAttrMultiProcessorCount, cfg->device),
        "device attribute");
    CHECK(create_streams(c));
    CHECK(create_layers(c, model->cfg.n_layers));
    return kvf_cuda__weights_create(c);
}

// The start-up line: the device, the weights and whether graphs replay.
static void log_created(const cuda_ctx_t *c)
{
    char name[128];
    int major, minor, sms;
    size_t total_mem;
    if (kvf_cuda_device_props(c->cfg.device, name, sizeof(name), &major, &minor, &total_mem,
                              &sms) == 0)
        kvf_log_info("cuda backend: %s (sm_%d%d), %.2f GB of %s weights, graphs %s", name, major,
                     minor, c->wslab_bytes / 1e9, kvf_dtype_name(c->wdt),
                     c->cfg.cuda_graphs ? "on" : "off");
}

extern "C" kvf_status_t kvf_backend_cuda_create(const kvf_cuda_config_t *cfg,
                                                const kvf_model_t *model, kvf_backend_t *be_p)
{
    const kvf_model_config_t *m = &model->cfg;
    cuda_ctx_t *c = (cuda_ctx_t *)calloc(1, sizeof(*c));
    if (!c)
        return KVF_ERR_NOMEM;
    c->cfg = *cfg;
    c->model = model;
    c->wdt = cfg->wdtype;
    c->wsz = kvf_dtype_size(cfg->wdtype);
    c->q_dim = m->n_heads * m->head_dim;
    c->kv_dim = m->n_kv_heads * m->head_dim;
    c->qkv_dim = c->q_dim + 2 * c->kv_dim;
    kvf_status_t st = create(cfg, model, c);
    if (st != KVF_OK) {
        cuda_destroy(c);
        return st;
    }
    log_created(c);
    be_p->ops = &cuda_ops;
    be_p->ctx = c;
    be_p->kv_dtypes = KVF_KV_DTYPE_BIT(KVF_KV_F32);
    return KVF_OK;
}

extern "C" bool kvf_backend_is_cuda(const kvf_backend_t *be)
{
    return be && be->ops == &cuda_ops;
}

extern "C" size_t kvf_backend_cuda_weight_bytes(const kvf_backend_t *be)
{
    return kvf_backend_is_cuda(be) ? ((const cuda_ctx_t *)be->ctx)->wslab_bytes : 0;
}

extern "C" kvf_status_t kvf_backend_cuda_mem_info(const kvf_backend_t *be, size_t *free_p,
                                                  size_t *total_p)
{
    if (!kvf_backend_is_cuda(be))
        return KVF_ERR_INVAL;
    TRY(cudaSetDevice(((const cuda_ctx_t *)be->ctx)->cfg.device), "set device");
    size_t f = 0, t = 0;
    TRY(cudaMemGetInfo(&f, &t), "memory info");
    *free_p = f;
    *total_p = t;
    return KVF_OK;
}
