/* Backend selection (--backend, --device) and, in a build without CUDA,
 * the CUDA backend's entry points, which say so. */
#include "kvf/backend.h"
#include "kvf/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kvf_status_t kvf_backend_kind_parse(const char *name, kvf_backend_kind_t *kind_p)
{
    if (name && strcmp(name, "cpu") == 0) {
        *kind_p = KVF_BACKEND_CPU;
        return KVF_OK;
    }
    if (name && strcmp(name, "cuda") == 0) {
        *kind_p = KVF_BACKEND_CUDA;
        return KVF_OK;
    }
    kvf_log_error("unknown backend '%s' (cpu or cuda)", name ? name : "");
    return KVF_ERR_INVAL;
}

const char *kvf_backend_kind_name(kvf_backend_kind_t kind)
{
    return kind == KVF_BACKEND_CUDA ? "cuda" : "cpu";
}

void kvf_backend_describe(const kvf_backend_t *be, char *buf, size_t size)
{
    if (kvf_backend_cpu_threads(be) > 0)
        snprintf(buf, size, "cpu (%s kernels, %d threads, %s weights)",
                 kvf_cpu_isa_name(kvf_backend_cpu_isa(be)), kvf_backend_cpu_threads(be),
                 kvf_dtype_name(kvf_backend_cpu_weights_dtype(be)));
    else
        snprintf(buf, size, "%s", be->ops ? be->ops->name : "none");
}

void *kvf_backend_host_alloc(const kvf_backend_t *be, size_t bytes)
{
    if (be && be->ops && be->ops->host_alloc)
        return be->ops->host_alloc(be->ctx, bytes);
    return malloc(bytes);
}

void *kvf_backend_host_alloc_hook(void *be, size_t bytes)
{
    return kvf_backend_host_alloc(be, bytes);
}

void kvf_backend_host_free_hook(void *be, void *p)
{
    kvf_backend_host_free(be, p);
}

void kvf_backend_host_free(const kvf_backend_t *be, void *p)
{
    if (!p)
        return;
    if (be && be->ops && be->ops->host_free)
        be->ops->host_free(be->ctx, p);
    else
        free(p);
}

kvf_cuda_config_t kvf_cuda_config_default(void)
{
    kvf_cuda_config_t c = {.device = 0, .wdtype = KVF_DTYPE_BF16, .cuda_graphs = true};
    return c;
}

#ifndef KVF_HAVE_CUDA
static kvf_status_t no_cuda(void)
{
    kvf_log_error("cuda backend: this build has no CUDA support (configure with -DKVF_CUDA=ON "
                  "where nvcc is installed)");
    return KVF_ERR_UNSUPPORTED;
}

kvf_status_t kvf_backend_cuda_create(const kvf_cuda_config_t *cfg, const struct kvf_model *model,
                                     kvf_backend_t *be_p)
{
    (void)cfg;
    (void)model;
    (void)be_p;
    return no_cuda();
}

bool kvf_backend_is_cuda(const kvf_backend_t *be)
{
    (void)be;
    return false;
}

kvf_status_t kvf_backend_cuda_kvpool_create(kvf_backend_t *be, const kvf_kv_geometry_t *geo,
                                            uint32_t num_blocks, bool host_mirror,
                                            kvf_kvpool_t **pool_p)
{
    (void)be;
    (void)geo;
    (void)num_blocks;
    (void)host_mirror;
    (void)pool_p;
    return no_cuda();
}

kvf_status_t kvf_backend_cuda_mem_info(const kvf_backend_t *be, size_t *free_p, size_t *total_p)
{
    (void)be;
    (void)free_p;
    (void)total_p;
    return no_cuda();
}

size_t kvf_backend_cuda_weight_bytes(const kvf_backend_t *be)
{
    (void)be;
    return 0;
}
#endif
