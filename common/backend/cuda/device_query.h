/* Device discovery (device_query.cu): plain C ABI, so that the C side
 * (gpu.c, for kvf --version and kvf/gpu.h) needs no CUDA headers. Part of
 * the CUDA library: only a build with CUDA has these. */
#ifndef KVF_CUDA_DEVICE_QUERY_H
#define KVF_CUDA_DEVICE_QUERY_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CUDA devices visible; 0 when there is none or no driver (never fails). */
int kvf_cuda_device_count(void);

/* Fills the device's name (NUL-terminated, truncated to name_len), compute
 * capability, memory in bytes and multiprocessors. 0, or -1 when the
 * runtime has no such device. */
int kvf_cuda_device_props(int index, char *name, size_t name_len, int *major, int *minor,
                          size_t *total_mem, int *sms);

/* The CUDA runtime's version (1000 * major + 10 * minor). */
int kvf_cuda_runtime_version(void);

#ifdef __cplusplus
}
#endif

#endif
