#include "kvf/gpu.h"

#include <stdio.h>
#include <string.h>

#ifdef KVF_HAVE_CUDA
#include "backend/cuda/device_query.h"
#endif

int kvf_gpu_built_with_cuda(void)
{
#ifdef KVF_HAVE_CUDA
    return 1;
#else
    return 0;
#endif
}

int kvf_gpu_count(void)
{
#ifdef KVF_HAVE_CUDA
    return kvf_cuda_device_count();
#else
    return 0;
#endif
}

kvf_status_t kvf_gpu_info(int index, kvf_gpu_info_t *info_p)
{
#ifdef KVF_HAVE_CUDA
    kvf_gpu_info_t info;
    memset(&info, 0, sizeof(info));
    if (index < 0 || index >= kvf_cuda_device_count())
        return KVF_ERR_DEVICE;
    if (kvf_cuda_device_props(index, info.name, sizeof(info.name), &info.major, &info.minor,
                              &info.total_mem, &info.multiprocessors) != 0)
        return KVF_ERR_DEVICE;
    *info_p = info;
    return KVF_OK;
#else
    (void)index;
    (void)info_p;
    return KVF_ERR_DEVICE;
#endif
}

void kvf_gpu_describe(char *buf, size_t len)
{
    if (len == 0)
        return;
    buf[0] = '\0';
#ifdef KVF_HAVE_CUDA
    int n = kvf_cuda_device_count();
    int rt = kvf_cuda_runtime_version();
    if (n == 0) {
        snprintf(buf, len, "CUDA runtime %d.%d: no GPU", rt / 1000, (rt % 1000) / 10);
        return;
    }
    size_t off = 0;
    for (int i = 0; i < n && off < len; i++) {
        kvf_gpu_info_t info;
        if (kvf_gpu_info(i, &info) != KVF_OK)
            continue;
        int w = snprintf(buf + off, len - off, "%sGPU %d: %s (sm_%d%d, %.1f GiB, %d SMs)",
                         i ? "\n" : "", i, info.name, info.major, info.minor,
                         (double)info.total_mem / (1024.0 * 1024.0 * 1024.0),
                         info.multiprocessors);
        if (w < 0)
            break;
        off += (size_t)w;
    }
#else
    snprintf(buf, len, "built without CUDA: no GPU");
#endif
}
