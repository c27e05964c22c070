// Stand-in for <cublas_v2.h> under the CPU emulator (../emu.h,
// ../emu_runtime.h): the handle calls and cublasGemmEx, implemented in
// ../emu_cublas.cc.
//
// cublasGemmEx is column-major as documented: C(m, n) = alpha op(A) op(B)
// + beta C, op(A) (m, k) from A stored (m, k) (CUBLAS_OP_N, lda >= m) or
// (k, m) (CUBLAS_OP_T/C, lda >= k), op(B) (k, n) likewise with ldb, C with
// ldc >= m; alpha and beta read from the host when the call is made (host
// pointer mode). A and B in CUDA_R_16BF, CUDA_R_16F or CUDA_R_32F (the same
// type), C in CUDA_R_32F, f32 compute types (CUBLAS_COMPUTE_32F and its
// pedantic and fast variants): the inputs are widened to f32 exactly and
// multiplied with f32 sums (OpenBLAS sgemm), as cuBLAS' f32 accumulation
// does up to the order of the sums. With beta 0, C is not read (a NaN there
// stays out). The GEMM runs on the handle's stream like a kernel: queued,
// deferred or captured (emu_runtime.h). Anything else is
// CUBLAS_STATUS_NOT_SUPPORTED or, for bad sizes, CUBLAS_STATUS_INVALID_VALUE,
// as cuBLAS answers; A, B or C outside memory the device reaches is a fault.
#ifndef KVF_CUDA_EMU_CUBLAS_H
#define KVF_CUDA_EMU_CUBLAS_H

#include <stddef.h>

#include "../emu_runtime.h"

// The values of the real enums.
typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
    CUBLAS_STATUS_LICENSE_ERROR = 16,
} cublasStatus_t;

typedef enum {
    CUBLAS_OP_N = 0,
    CUBLAS_OP_T = 1,
    CUBLAS_OP_C = 2,
} cublasOperation_t;

typedef enum {
    CUDA_R_32F = 0,
    CUDA_R_64F = 1,
    CUDA_R_16F = 2,
    CUDA_R_16BF = 14,
} cudaDataType_t;
typedef cudaDataType_t cudaDataType;

typedef enum {
    CUBLAS_COMPUTE_16F = 64,
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_PEDANTIC = 69,
    CUBLAS_COMPUTE_32F_FAST_16F = 74,
    CUBLAS_COMPUTE_32F_FAST_16BF = 75,
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
} cublasComputeType_t;

typedef enum {
    CUBLAS_GEMM_DEFAULT = -1,
    CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99,
} cublasGemmAlgo_t;

typedef enum {
    CUBLAS_DEFAULT_MATH = 0,
    CUBLAS_TENSOR_OP_MATH = 1,
    CUBLAS_PEDANTIC_MATH = 2,
    CUBLAS_TF32_TENSOR_OP_MATH = 3,
    CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16,
} cublasMath_t;

typedef struct cublasContext *cublasHandle_t;

cublasStatus_t cublasCreate(cublasHandle_t *handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t *stream);
// workspace: device memory of bytes the library may use (the emulated GEMM
// needs none; it is checked to be device memory).
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void *workspace, size_t bytes);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType_t Atype, int lda, const void *B,
                            cudaDataType_t Btype, int ldb, const void *beta, void *C,
                            cudaDataType_t Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo);
const char *cublasGetStatusString(cublasStatus_t status);

#endif
