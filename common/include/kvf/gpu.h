/* GPU discovery. Works in every build: without CUDA it reports that the
 * build has no GPU support; with CUDA but no device it reports "no GPU". */
#ifndef KVF_GPU_H
#define KVF_GPU_H

#include <stddef.h>

#include "kvf/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char name[128];
    int major, minor;          /* compute capability */
    size_t total_mem;          /* bytes */
    int multiprocessors;
} kvf_gpu_info_t;

/* Number of CUDA devices, 0 when there are none or the build has no CUDA.
 * Never fails: a missing driver counts as no GPU. */
int kvf_gpu_count(void);

/* Fills *info_p for device index. KVF_ERR_DEVICE when there is no such
 * device or the build has no CUDA. */
kvf_status_t kvf_gpu_info(int index, kvf_gpu_info_t *info_p);

/* Writes a one-paragraph summary ("no GPU", or one line per device) into
 * buf (always NUL-terminated). */
void kvf_gpu_describe(char *buf, size_t len);

/* Whether this build contains the CUDA backend. */
int kvf_gpu_built_with_cuda(void);

#ifdef __cplusplus
}
#endif

#endif
