/* The backend flags of the commands that run an engine (kvf/backend_flags.h). */
#include "kvf/backend_flags.h"
#include "kvf/backend.h"
#include "kvf/dtype.h"
#include "kvf/kv_format.h"
#include "kvf/log.h"

kvf_status_t kvf_backend_flags_apply(const kvf_backend_flags_t *f, kvf_engine_stack_config_t *cfg)
{
    kvf_backend_kind_t kind = KVF_BACKEND_CPU;
    if (f->backend && kvf_backend_kind_parse(f->backend, &kind) != KVF_OK)
        return KVF_ERR_INVAL;
    kvf_cuda_config_t cc = kvf_cuda_config_default();
    if (f->gpu_dtype &&
        (kvf_dtype_parse(f->gpu_dtype, &cc.wdtype) != KVF_OK || cc.wdtype == KVF_DTYPE_UNKNOWN)) {
        kvf_log_error("unknown --gpu-dtype '%s' (bf16, f16 or f32)", f->gpu_dtype);
        return KVF_ERR_INVAL;
    }
    if (f->device < 0) {
        kvf_log_error("--device %d: a CUDA device index is 0 or more", f->device);
        return KVF_ERR_INVAL;
    }
    kvf_cpu_weights_t cw = KVF_CPU_WEIGHTS_NATIVE;
    if (f->cpu_dtype && kvf_cpu_weights_parse(f->cpu_dtype, &cw) != KVF_OK)
        return KVF_ERR_INVAL;
    kvf_kv_dtype_t kv =
        kind == KVF_BACKEND_CUDA ? KVF_KV_DTYPE_DEFAULT_CUDA : KVF_KV_DTYPE_DEFAULT_CPU;
    if (f->kv_dtype && kvf_kv_dtype_parse(f->kv_dtype, &kv) != KVF_OK) {
        kvf_log_error("unknown --kv-dtype '%s' (f32, bf16, f16, fp8 or int8)", f->kv_dtype);
        return KVF_ERR_INVAL;
    }
    cfg->cpu_weights = cw;
    cfg->kv_dtype = kv;
    cc.device = f->device;
    cc.cuda_graphs = !f->no_graphs;
    cfg->backend = kind;
    cfg->cuda = cc;
    return KVF_OK;
}
