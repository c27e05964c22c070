/* Which instruction set the CPU backend's kernels use: the best the CPU
 * runs, or the one KVF_CPU_ISA names. See kvf/backend.h. */
#include "kvf/backend.h"
#include "kvf/log.h"

#include "cpu_kernels.h"

#include <stdlib.h>
#include <string.h>

static const char *const isa_names[KVF_CPU_ISA_COUNT] = {"scalar", "avx2", "avx512", "neon"};

const char *kvf_cpu_isa_name(kvf_cpu_isa_t isa)
{
    if (isa >= KVF_CPU_ISA_SCALAR && isa < KVF_CPU_ISA_COUNT)
        return isa_names[isa];
    return "auto";
}

kvf_status_t kvf_cpu_isa_parse(const char *name, kvf_cpu_isa_t *isa_p)
{
    for (int i = KVF_CPU_ISA_SCALAR; i < KVF_CPU_ISA_COUNT; i++) {
        if (name && !strcmp(name, isa_names[i])) {
            *isa_p = (kvf_cpu_isa_t)i;
            return KVF_OK;
        }
    }
    if (name && !strcmp(name, "auto")) {
        *isa_p = KVF_CPU_ISA_AUTO;
        return KVF_OK;
    }
    kvf_log_error("unknown CPU instruction set '%s' (scalar, avx2, avx512, neon or auto)",
                  name ? name : "");
    return KVF_ERR_INVAL;
}

bool kvf_cpu_isa_supported(kvf_cpu_isa_t isa)
{
    switch (isa) {
    case KVF_CPU_ISA_SCALAR: return true;
#if defined(KVF_CPU_X86_KERNELS)
    case KVF_CPU_ISA_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("f16c");
    case KVF_CPU_ISA_AVX512:
        __builtin_cpu_init();
        return kvf_cpu_isa_supported(KVF_CPU_ISA_AVX2) && __builtin_cpu_supports("avx512f");
#endif
#if defined(__aarch64__)
    case KVF_CPU_ISA_NEON: return true; /* part of every AArch64 CPU */
#endif
    default: return false;
    }
}

kvf_cpu_isa_t kvf_cpu_isa_best(void)
{
    if (kvf_cpu_isa_supported(KVF_CPU_ISA_NEON))
        return KVF_CPU_ISA_NEON;
    if (kvf_cpu_isa_supported(KVF_CPU_ISA_AVX512))
        return KVF_CPU_ISA_AVX512;
    if (kvf_cpu_isa_supported(KVF_CPU_ISA_AVX2))
        return KVF_CPU_ISA_AVX2;
    return KVF_CPU_ISA_SCALAR;
}

kvf_status_t kvf_cpu_isa_resolve(kvf_cpu_isa_t want, kvf_cpu_isa_t *isa_p)
{
    const char *how = "asked for";
    if (want == KVF_CPU_ISA_AUTO) {
        const char *env = getenv("KVF_CPU_ISA");
        if (!env || !env[0]) {
            *isa_p = kvf_cpu_isa_best();
            return KVF_OK;
        }
        if (kvf_cpu_isa_parse(env, &want) != KVF_OK) {
            kvf_log_error("KVF_CPU_ISA='%s' names no instruction set", env);
            return KVF_ERR_INVAL;
        }
        if (want == KVF_CPU_ISA_AUTO) {
            *isa_p = kvf_cpu_isa_best();
            return KVF_OK;
        }
        how = "forced by KVF_CPU_ISA";
    }
    if (!kvf_cpu_isa_supported(want)) {
        kvf_log_error("cpu backend: the %s kernels (%s) need instructions this CPU does not "
                      "have (best here: %s)",
                      kvf_cpu_isa_name(want), how, kvf_cpu_isa_name(kvf_cpu_isa_best()));
        return KVF_ERR_UNSUPPORTED;
    }
    *isa_p = want;
    return KVF_OK;
}

const kvf_cpu_kernels_t *kvf_cpu_kernels(kvf_cpu_isa_t isa)
{
    switch (isa) {
#if defined(KVF_CPU_X86_KERNELS)
    case KVF_CPU_ISA_AVX512: return &kvf_cpu_kernels_avx512;
    case KVF_CPU_ISA_AVX2: return &kvf_cpu_kernels_avx2;
#endif
#if defined(__aarch64__)
    case KVF_CPU_ISA_NEON: return &kvf_cpu_kernels_neon;
#endif
    default: return &kvf_cpu_kernels_scalar;
    }
}
