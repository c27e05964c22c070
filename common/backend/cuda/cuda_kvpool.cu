// KV pools in the CUDA backend's device memory (kvf/backend.h:
// kvf_backend_cuda_kvpool_create), with an optional pinned host mirror.
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.cuh"

typedef struct {
    int device;
    cudaStream_t stream; // the backend's: uploads are ordered with compute
    void *dev, *host;
} pool_mem_t;

// Queued on the backend's stream, the one every forward runs on: a
// forward queued later reads the blocks uploaded. The mirror is pinned,
// so the copy is a DMA that does not wait for the host.
static kvf_status_t pool_upload_queued(void *arg, size_t off, size_t bytes)
{
    pool_mem_t *pm = (pool_mem_t *)arg;
    TRY(cudaSetDevice(pm->device), "set device");
    TRY(cudaMemcpyAsync((uint8_t *)pm->dev + off, (const uint8_t *)pm->host + off, bytes,
                        cudaMemcpyHostToDevice, pm->stream),
        "kv upload");
    return KVF_OK;
}

static kvf_status_t pool_upload(void *arg, size_t off, size_t bytes)
{
    kvf_status_t st = pool_upload_queued(arg, off, bytes);
    if (st != KVF_OK)
        return st;
    TRY(cudaStreamSynchronize(((pool_mem_t *)arg)->stream), "kv upload");
    return KVF_OK;
}

static void pool_release(void *arg)
{
    pool_mem_t *pm = (pool_mem_t *)arg;
    cudaSetDevice(pm->device);
    if (pm->dev)
        cudaFree(pm->dev);
    if (pm->host)
        cudaFreeHost(pm->host);
    free(pm);
}

extern "C" kvf_status_t kvf_backend_cuda_kvpool_create(kvf_backend_t *be,
                                                       const kvf_kv_geometry_t *geo,
                                                       uint32_t num_blocks, bool host_mirror,
                                                       kvf_kvpool_t **pool_p)
{
    if (!kvf_backend_is_cuda(be))
        return KVF_ERR_INVAL;
    cuda_ctx_t *c = (cuda_ctx_t *)be->ctx;
    kvf_status_t st = kvf_kv_geometry_validate(geo);
    if (st != KVF_OK)
        return st;
    if (num_blocks == 0)
        return KVF_ERR_INVAL;
    size_t bytes = kvf_kv_block_bytes(geo) * (size_t)num_blocks;
    TRY(cudaSetDevice(c->cfg.device), "set device");
    pool_mem_t *pm = (pool_mem_t *)calloc(1, sizeof(*pm));
    if (!pm)
        return KVF_ERR_NOMEM;
    pm->device = c->cfg.device;
    pm->stream = c->stream;
    st = kvf_cuda__dev_alloc(&pm->dev, bytes, "kv pool");
    // On the backend's stream: its non-blocking streams do not wait for the
    // legacy stream a plain cudaMemset uses, so that clear could land after
    // the first forward's K/V.
    if (st == KVF_OK)
        st = KVF_CUDA_TRY(cudaMemsetAsync(pm->dev, 0, bytes, pm->stream), "kv pool clear");
    if (st == KVF_OK && host_mirror) {
        st = KVF_CUDA_TRY(cudaHostAlloc(&pm->host, bytes, cudaHostAllocPortable),
                          "kv pool host mirror");
        if (st == KVF_OK)
            memset(pm->host, 0, bytes);
        else
            pm->host = NULL;
    }
    if (st != KVF_OK) {
        pool_release(pm);
        return st;
    }
    kvf_kvpool_memory_t mem;
    mem.host_base = pm->host;
    mem.device_base = pm->dev;
    mem.arg = pm;
    mem.upload = pool_upload;
    mem.upload_queued = pool_upload_queued;
    mem.release = pool_release;
    st = kvf_kvpool_create_on(geo, num_blocks, &mem, pool_p);
    if (st != KVF_OK)
        pool_release(pm);
    return st;
}
