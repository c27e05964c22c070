// Embedding gather: x(n_tokens, hidden) f32 = rows of the weight table.
#include "cuda_common.cuh"

template <typename W>
__global__ void kvf_embed_kernel(float *x, const W *embed, const int32_t *tokens, int hidden)
{
    int t = blockIdx.x;
    const W *row = embed + (size_t)tokens[t] * (size_t)hidden;
    float *out = x + (size_t)t * (size_t)hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x)
        out[i] = kvf_to_f32(row[i]);
}

kvf_status_t kvf_cuda_embed(cudaStream_t st, float *x, const void *embed, kvf_dtype_t wdt,
                            const int32_t *tokens, int n_tokens, int hidden, int vocab)
{
    kvf_status_t s = kvf_cuda_check_embed(n_tokens, hidden, vocab);
    if (s != KVF_OK || n_tokens == 0)
        return s;
    // Token ids were checked against vocab by the engine before upload.
    KVF_DISPATCH_ADT(
        wdt, W, kvf_embed_kernel<W><<<n_tokens, 256, 0, st>>>(x, (const W *)embed, tokens, hidden));
    return KVF_CUDA_LAUNCHED("embed");
}
