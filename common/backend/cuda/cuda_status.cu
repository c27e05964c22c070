// CUDA and cuBLAS errors to kvf statuses: the one place the backend converts them.
#include "cuda_ops.h"

#include <cublas_v2.h>

#include "kvf/log.h"

kvf_status_t kvf_cuda_status(cudaError_t err, const char *what, const char *file, int line)
{
    if (err == cudaSuccess)
        return KVF_OK;
    kvf_log_error("cuda: %s failed at %s:%d: %s (%s)", what, file, line, cudaGetErrorString(err),
                  cudaGetErrorName(err));
    switch (err) {
    case cudaErrorMemoryAllocation:
        return KVF_ERR_NOMEM;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
        return KVF_ERR_INVAL;
    default:
        return KVF_ERR_DEVICE;
    }
}

kvf_status_t kvf_cuda_blas_status(int status, const char *what)
{
    cublasStatus_t s = (cublasStatus_t)status;
    if (s == CUBLAS_STATUS_SUCCESS)
        return KVF_OK;
    kvf_log_error("cublas: %s failed: %s", what, cublasGetStatusString(s));
    return s == CUBLAS_STATUS_ALLOC_FAILED ? KVF_ERR_NOMEM : KVF_ERR_DEVICE;
}
