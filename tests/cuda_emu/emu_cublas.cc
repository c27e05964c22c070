// cuBLAS under the CPU emulator: the handle calls and cublasGemmEx
// (include/cublas_v2.h says what is emulated). The GEMM widens 16-bit
// inputs to f32 (exact) and runs OpenBLAS' sgemm, which sums in f32 as the
// device's f32 accumulation does, in its own order.
// The C++ library first: emu.h defines __noinline__, which its headers use.
#include <memory>
#include <vector>

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>

struct cublasContext {
    cudaStream_t stream = nullptr;
    cublasMath_t math = CUBLAS_DEFAULT_MATH;
};

namespace
{

size_t elem_size(cudaDataType_t t)
{
    switch (t) {
    case CUDA_R_32F:
        return 4;
    case CUDA_R_16F:
    case CUDA_R_16BF:
        return 2;
    default:
        return 0;
    }
}

// A stored matrix (rows, cols) with leading dimension ld, column-major, as
// f32 with leading dimension rows. f32 input is copied too, so the GEMM
// reads its operands once, as they are when it runs.
std::vector<float> widen(const void *p, cudaDataType_t t, int rows, int cols, int ld)
{
    std::vector<float> out((size_t)rows * (size_t)cols);
    for (int c = 0; c < cols; c++) {
        const size_t src = (size_t)c * (size_t)ld;
        float *dst = out.data() + (size_t)c * (size_t)rows;
        if (t == CUDA_R_32F) {
            memcpy(dst, (const float *)p + src, (size_t)rows * sizeof(float));
        } else if (t == CUDA_R_16F) {
            const __half *h = (const __half *)p + src;
            for (int r = 0; r < rows; r++)
                dst[r] = __half2float(h[r]);
        } else {
            const __nv_bfloat16 *h = (const __nv_bfloat16 *)p + src;
            for (int r = 0; r < rows; r++)
                dst[r] = __bfloat162float(h[r]);
        }
    }
    return out;
}

bool compute_ok(cublasComputeType_t c)
{
    return c == CUBLAS_COMPUTE_32F || c == CUBLAS_COMPUTE_32F_PEDANTIC ||
           c == CUBLAS_COMPUTE_32F_FAST_16F || c == CUBLAS_COMPUTE_32F_FAST_16BF ||
           c == CUBLAS_COMPUTE_32F_FAST_TF32;
}

bool op_ok(cublasOperation_t op)
{
    return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C;
}

// Bytes from the first element of a stored (rows, cols) matrix to past its
// last, leading dimension ld.
size_t extent(int rows, int cols, int ld, size_t esz)
{
    return ((size_t)(cols - 1) * (size_t)ld + (size_t)rows) * esz;
}

} // namespace

cublasStatus_t cublasCreate(cublasHandle_t *handle)
{
    if (!handle)
        return CUBLAS_STATUS_INVALID_VALUE;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        cudaGetLastError();
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    *handle = new cublasContext;
    kvf_emu::blas_handle_count(1);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    kvf_emu::blas_handle_count(-1);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t *stream)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!stream)
        return CUBLAS_STATUS_INVALID_VALUE;
    *stream = handle->stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void *workspace, size_t bytes)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    // cuBLAS wants it 256-byte aligned, in device memory.
    if (bytes > 0 &&
        ((uintptr_t)workspace % 256 != 0 || !kvf_emu::is_device_range(workspace, bytes))) {
        fprintf(stderr,
                "cuda emu: cublasSetWorkspace: %zu bytes at %p are not aligned device "
                "memory\n",
                bytes, workspace);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    int base = (int)mode & ~(int)CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    if (base < CUBLAS_DEFAULT_MATH || base > CUBLAS_TF32_TENSOR_OP_MATH)
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType_t Atype, int lda, const void *B,
                            cudaDataType_t Btype, int ldb, const void *beta, void *C,
                            cudaDataType_t Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo)
{
    (void)algo;
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!op_ok(transa) || !op_ok(transb) || m < 0 || n < 0 || k < 0 || !alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    // Stored shapes: op(A) is (m, k), op(B) (k, n).
    const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
    const int a_rows = ta ? k : m, a_cols = ta ? m : k;
    const int b_rows = tb ? n : k, b_cols = tb ? k : n;
    if (lda < (a_rows > 1 ? a_rows : 1) || ldb < (b_rows > 1 ? b_rows : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (Atype != Btype || elem_size(Atype) == 0 || Ctype != CUDA_R_32F || !compute_ok(computeType))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m == 0 || n == 0)
        return CUBLAS_STATUS_SUCCESS;
    const size_t esz = elem_size(Atype);
    if ((k > 0 &&
         (!kvf_emu::device_reachable(A, extent(a_rows, a_cols, lda, esz), "cublasGemmEx: A") ||
          !kvf_emu::device_reachable(B, extent(b_rows, b_cols, ldb, esz), "cublasGemmEx: B"))) ||
        !kvf_emu::device_reachable(C, extent(m, n, ldc, 4), "cublasGemmEx: C"))
        return CUBLAS_STATUS_EXECUTION_FAILED;
    // Host pointer mode: the scalars are read now.
    const float al = *(const float *)alpha, be = *(const float *)beta;
    float *c = (float *)C;
    cudaError_t err = kvf_emu::submit(
        handle->stream,
        [=] {
            kvf_emu::count_gemm();
            if (be == 0.0f) // C is not read: a NaN there must not reach the result
                for (int j = 0; j < n; j++)
                    memset(c + (size_t)j * (size_t)ldc, 0, (size_t)m * sizeof(float));
            if (k == 0) {
                if (be != 0.0f)
                    for (int j = 0; j < n; j++)
                        for (int i = 0; i < m; i++)
                            c[(size_t)j * (size_t)ldc + (size_t)i] *= be;
                return;
            }
            std::vector<float> a = widen(A, Atype, a_rows, a_cols, lda);
            std::vector<float> b = widen(B, Btype, b_rows, b_cols, ldb);
            cblas_sgemm(CblasColMajor, ta ? CblasTrans : CblasNoTrans,
                        tb ? CblasTrans : CblasNoTrans, m, n, k, al, a.data(), a_rows, b.data(),
                        b_rows, be == 0.0f ? 0.0f : be, c, ldc);
        },
        "cublasGemmEx");
    if (err != cudaSuccess) {
        kvf_emu::set_last_error(err);
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS:
        return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
        return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
        return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
        return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}
