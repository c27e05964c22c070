// Row gather: the rows of a batch that want logits, packed for the lm_head
// GEMM (a 2048-token prompt needs one row of 128k logits, not 2048).
#include "cuda_common.cuh"

template <typename U>
__global__ void kvf_gather_kernel(U *dst, const U *src, size_t row_elems, const int32_t *rows)
{
    const U *s = src + (size_t)rows[blockIdx.x] * row_elems;
    U *d = dst + (size_t)blockIdx.x * row_elems;
    for (size_t i = threadIdx.x; i < row_elems; i += blockDim.x)
        d[i] = s[i];
}

kvf_status_t kvf_cuda_gather_rows(cudaStream_t st, void *dst, const void *src, size_t row_bytes,
                                  const int32_t *rows, int n_rows)
{
    kvf_status_t s = kvf_cuda_check_gather(row_bytes, n_rows);
    if (s != KVF_OK || n_rows == 0)
        return s;
    if (row_bytes % 4 == 0)
        kvf_gather_kernel<uint32_t>
            <<<n_rows, 256, 0, st>>>((uint32_t *)dst, (const uint32_t *)src, row_bytes / 4, rows);
    else
        kvf_gather_kernel<uint16_t>
            <<<n_rows, 256, 0, st>>>((uint16_t *)dst, (const uint16_t *)src, row_bytes / 2, rows);
    return KVF_CUDA_LAUNCHED("gather_rows");
}
