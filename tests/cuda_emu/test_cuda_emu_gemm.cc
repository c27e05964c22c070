// cublasGemmEx (include/cublas_v2.h, emu_cublas.cc) against a double loop:
// every transpose, f32/f16/bf16, padded leading dimensions, beta 0 not
// reading C; and cuBLAS' answers to bad arguments.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "test_cuda_emu.h"

namespace kvf_emu_test
{
namespace
{

// One GEMM: C (m, n) = alpha op(A) op(B) + beta C, op(A) (m, k), op(B)
// (k, n), every matrix column-major with padded leading dimensions.
struct gemm_shape {
    cudaDataType_t t;
    bool ta, tb;
    int m, n, k;
    int a_rows, a_cols, b_rows, b_cols;
    int lda, ldb, ldc;
};

gemm_shape gemm_shape_of(cudaDataType_t t, int ta, int tb)
{
    gemm_shape g;
    g.t = t;
    g.ta = ta != 0;
    g.tb = tb != 0;
    g.m = 37;
    g.n = 5;
    g.k = 70;
    g.a_rows = ta ? g.k : g.m;
    g.a_cols = ta ? g.m : g.k;
    g.b_rows = tb ? g.n : g.k;
    g.b_cols = tb ? g.k : g.n;
    g.lda = g.a_rows + 3;
    g.ldb = g.b_rows + 1;
    g.ldc = g.m + 2;
    return g;
}

// f stored in type t into b, and f set to what b holds: the exact inputs.
void store_as(cudaDataType_t t, std::vector<float> &f, std::vector<unsigned char> &b)
{
    for (size_t i = 0; i < f.size(); i++) {
        if (t == CUDA_R_32F) {
            memcpy(&b[4 * i], &f[i], 4);
            continue;
        }
        uint16_t x = t == CUDA_R_16F ? kvf_f32_to_f16(f[i]) : kvf_f32_to_bf16(f[i]);
        memcpy(&b[2 * i], &x, 2);
        f[i] = t == CUDA_R_16F ? kvf_f16_to_f32(x) : kvf_bf16_to_f32(x);
    }
}

// got (C after the GEMM) against the double loop on af, bf and c0; the
// padding rows of C must be untouched.
void compare_gemm(check &c, const gemm_shape &g, float alpha, float beta,
                  const std::vector<float> &af, const std::vector<float> &bf,
                  const std::vector<float> &c0, const std::vector<float> &got)
{
    int shown = 0;
    for (int j = 0; j < g.n; j++)
        for (int i = 0; i < g.ldc; i++) {
            size_t at = (size_t)j * g.ldc + i;
            if (i >= g.m) { // padding rows of C: untouched
                if (memcmp(&got[at], &c0[at], 4) != 0 && shown++ < 3)
                    c.fail("C(%d, %d) past m was written", i, j);
                continue;
            }
            double acc = 0;
            for (int l = 0; l < g.k; l++) {
                double a = g.ta ? af[(size_t)i * g.lda + l] : af[(size_t)l * g.lda + i];
                double b = g.tb ? bf[(size_t)l * g.ldb + j] : bf[(size_t)j * g.ldb + l];
                acc += a * b;
            }
            double want = alpha * acc + (beta != 0.0f ? beta * c0[at] : 0.0);
            if (!c.near(got[at], want, 1e-5 * (1 + fabs(want))) && shown++ < 3)
                c.fail("C(%d, %d) = %.9g, want %.9g", i, j, got[at], want);
        }
}

// C = alpha op(A) op(B) + beta C against a double loop, column-major as
// cuBLAS documents it.
void gemm_case(cublasHandle_t h, cudaStream_t s, cudaDataType_t t, int ta, int tb, float beta)
{
    const char *tn = t == CUDA_R_32F ? "f32" : t == CUDA_R_16F ? "f16" : "bf16";
    check c(fmt("cublasGemmEx %s op(A)=%s op(B)=%s beta %g", tn, ta ? "T" : "N", tb ? "T" : "N",
                (double)beta));
    const gemm_shape g = gemm_shape_of(t, ta, tb);
    const size_t esz = t == CUDA_R_32F ? 4 : 2;
    std::vector<float> af = random_floats((size_t)g.lda * g.a_cols);
    std::vector<float> bf = random_floats((size_t)g.ldb * g.b_cols);
    std::vector<float> c0 = random_floats((size_t)g.ldc * g.n);
    // Stored in the type, and read back as the exact inputs.
    std::vector<unsigned char> ab(af.size() * esz), bb(bf.size() * esz);
    store_as(t, af, ab);
    store_as(t, bf, bb);
    if (beta == 0.0f) // not read: a NaN must not reach the result
        for (int j = 0; j < g.n; j++)
            c0[(size_t)j * g.ldc + 3] = NAN;
    void *da = nullptr, *db = nullptr;
    float *dc = nullptr;
    cudaMalloc(&da, ab.size());
    cudaMalloc(&db, bb.size());
    cudaMalloc(&dc, c0.size() * sizeof(float));
    cudaMemcpy(da, ab.data(), ab.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(db, bb.data(), bb.size(), cudaMemcpyHostToDevice);
    upload(dc, c0);
    const float alpha = 1.5f;
    cublasStatus_t st =
        cublasGemmEx(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, g.m, g.n,
                     g.k, &alpha, da, t, g.lda, db, t, g.ldb, &beta, dc, CUDA_R_32F, g.ldc,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS)
        c.fail("cublasGemmEx: %s", cublasGetStatusString(st));
    cudaStreamSynchronize(s);
    compare_gemm(c, g, alpha, beta, af, bf, c0, download(dc, c0.size()));
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
}

// Refused as cuBLAS refuses them; a host operand is a fault.
void gemm_bad_arguments(check &c, cublasHandle_t h, cudaStream_t s)
{
    float *dev = nullptr;
    cudaMalloc(&dev, 64 * sizeof(float));
    std::vector<float> host(64);
    const float one = 1.0f, zero = 0.0f;
    auto gemm = [&](int m, int lda, const void *a, cudaDataType_t at, cudaDataType_t ct) {
        return cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, 4, 4, &one, a, at, lda, dev, at, 4,
                            &zero, dev, ct, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    };
    if (gemm(4, 4, dev, CUDA_R_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS)
        c.fail("a good call was refused");
    if (gemm(8, 4, dev, CUDA_R_32F, CUDA_R_32F) != CUBLAS_STATUS_INVALID_VALUE)
        c.fail("lda below m was accepted");
    if (gemm(4, 4, dev, CUDA_R_32F, CUDA_R_16F) != CUBLAS_STATUS_NOT_SUPPORTED)
        c.fail("an f16 output was accepted");
    if (cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, dev, CUDA_R_16F, 4, dev,
                     CUDA_R_32F, 4, &zero, dev, CUDA_R_32F, 4, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_NOT_SUPPORTED)
        c.fail("mixed input types were accepted");
    unsigned long long faults = kvf_emu::faults();
    printf("      (1 emulator fault message expected below)\n");
    if (gemm(4, 4, host.data(), CUDA_R_32F, CUDA_R_32F) != CUBLAS_STATUS_EXECUTION_FAILED ||
        kvf_emu::faults() != faults + 1)
        c.fail("a host operand was not a fault");
    cudaGetLastError();
    cudaStreamSynchronize(s);
    cudaFree(dev);
}

// Once the runtime tests and the GEMMs are done, nothing they made is left.
void runtime_resources_gone(check &c)
{
    kvf_emu::runtime_stats rs = kvf_emu::get_runtime_stats();
    if (rs.blas_handles != 0 || rs.streams != 0 || rs.device_allocations != 0 || rs.events != 0 ||
        rs.graphs != 0 || rs.graph_execs != 0)
        c.fail("resources left after the runtime tests");
}

} // namespace

void test_gemm()
{
    const cudaDataType_t types[] = {CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF};
    cublasHandle_t h = nullptr;
    cudaStream_t s = nullptr;
    cublasCreate(&h);
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cublasSetStream(h, s);
    for (cudaDataType_t t : types)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (float beta : {0.0f, 0.5f})
                    gemm_case(h, s, t, ta, tb, beta);
    check c("cublasGemmEx: bad arguments refused as cuBLAS does, host operands a fault");
    gemm_bad_arguments(c, h, s);
    cublasDestroy(h);
    cudaStreamDestroy(s);
    runtime_resources_gone(c);
}

} // namespace kvf_emu_test
