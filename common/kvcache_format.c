/* Names of the KV cache's element formats (kvf/kv_format.h). */
#include "kvf/kv_format.h"

#include <strings.h>

static const char *const NAMES[KVF_KV_N_DTYPES] = {"f32", "f16", "bf16", "fp8", "int8"};

const char *kvf_kv_dtype_name(kvf_kv_dtype_t dtype)
{
    return (unsigned)dtype < KVF_KV_N_DTYPES ? NAMES[dtype] : "?";
}

kvf_status_t kvf_kv_dtype_parse(const char *name, kvf_kv_dtype_t *dtype_p)
{
    static const struct {
        const char *name;
        kvf_kv_dtype_t dtype;
    } aliases[] = {{"float32", KVF_KV_F32},
                   {"float16", KVF_KV_F16},
                   {"bfloat16", KVF_KV_BF16},
                   {"e4m3", KVF_KV_FP8},
                   {"fp8_e4m3", KVF_KV_FP8}};
    if (!name)
        return KVF_ERR_INVAL;
    for (int i = 0; i < KVF_KV_N_DTYPES; i++) {
        if (!strcasecmp(name, NAMES[i])) {
            *dtype_p = (kvf_kv_dtype_t)i;
            return KVF_OK;
        }
    }
    for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]); i++) {
        if (!strcasecmp(name, aliases[i].name)) {
            *dtype_p = aliases[i].dtype;
            return KVF_OK;
        }
    }
    return KVF_ERR_INVAL;
}
