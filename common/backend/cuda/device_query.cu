// Device discovery for kvf --version and the CUDA backend (device_query.h).
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "device_query.h"

extern "C" int kvf_cuda_device_count(void)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        cudaGetLastError(); // clear the sticky "no device" error
        return 0;
    }
    return n;
}

extern "C" int kvf_cuda_device_props(int index, char *name, size_t name_len, int *major,
                                     int *minor, size_t *total_mem, int *sms)
{
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    snprintf(name, name_len, "%s", prop.name);
    *major = prop.major;
    *minor = prop.minor;
    *total_mem = prop.totalGlobalMem;
    *sms = prop.multiProcessorCount;
    return 0;
}

extern "C" int kvf_cuda_runtime_version(void)
{
    int v = 0;
    cudaRuntimeGetVersion(&v);
    return v;
}
