// The elementwise and row kernels against the CPU backend or an exact
// reference, in every activation type:
//
//   kvf_cuda_embed         dtype.c's conversions (exact)
//   kvf_cuda_add_rmsnorm   CPU backend rmsnorm after x += delta
//   kvf_cuda_swiglu        CPU backend swiglu
//   kvf_cuda_geglu         CPU backend geglu (Gemma2)
//   kvf_cuda_scale, kvf_cuda_softcap   x * s exactly; kvf_det_softcap
//   kvf_cuda_argmax        kvf_sample_argmax (ties, NaN, infinities)
//   kvf_cuda_gather_rows   memcpy (exact)
//
// with each launcher's bad shapes and an empty batch.
#include <cuda_runtime.h>

#include "cuda_ops.h"
#include "test_cuda_emu.h"
extern "C" {
#include "kvf/detmath.h"
#include "kvf/sampling.h"
}

namespace kvf_emu_test
{

void test_embed()
{
    const int vocab = 50, n = 7;
    const int32_t tokens[n] = {3, 0, 49, 3, 17, 17, 8};
    for (kvf_dtype_t wdt : k_adts)
        for (int hidden : {64, 300}) {
            check c(fmt("embed %s hidden %d", kvf_dtype_name(wdt), hidden));
            std::vector<float> table = random_floats((size_t)vocab * hidden, -4, 4);
            std::vector<unsigned char> w((size_t)vocab * hidden * kvf_dtype_size(wdt));
            for (size_t i = 0; i < table.size(); i++) {
                if (wdt == KVF_DTYPE_F32) {
                    memcpy(&w[4 * i], &table[i], 4);
                } else {
                    uint16_t h = wdt == KVF_DTYPE_BF16 ? kvf_f32_to_bf16(table[i])
                                                       : kvf_f32_to_f16(table[i]);
                    memcpy(&w[2 * i], &h, 2);
                }
            }
            // One row more than the batch: it must keep the sentinel.
            auto x = both_orders(c, [&] {
                auto out = sentinel_buffer((size_t)(n + 1) * hidden, KVF_DTYPE_F32);
                launch_ok(c, "embed", [&] {
                    return kvf_cuda_embed(nullptr, (float *)out.data(), w.data(), wdt, tokens, n,
                                          hidden, vocab);
                });
                return out;
            });
            std::vector<float> want((size_t)(n + 1) * hidden);
            for (int t = 0; t < n; t++)
                kvf_dtype_to_f32(&want[(size_t)t * hidden],
                                 &w[(size_t)tokens[t] * hidden * kvf_dtype_size(wdt)], wdt,
                                 (size_t)hidden);
            compare_rows(c, "x", x, KVF_DTYPE_F32, n, hidden, hidden, want.data(), hidden, 0);
            for (size_t i = (size_t)n * hidden; i < (size_t)(n + 1) * hidden; i++)
                if (!is_sentinel(x, KVF_DTYPE_F32, i)) {
                    c.fail("wrote past the batch's rows");
                    break;
                }
        }
    check c("embed: bad shapes refused, empty batch launches nothing");
    float x[4];
    float table[4];
    int32_t tok[1] = {0};
    refused(c, "hidden 0", KVF_ERR_INVAL,
            [&] { return kvf_cuda_embed(nullptr, x, table, KVF_DTYPE_F32, tok, 1, 0, 4); });
    refused(c, "-1 tokens", KVF_ERR_INVAL,
            [&] { return kvf_cuda_embed(nullptr, x, table, KVF_DTYPE_F32, tok, -1, 4, 4); });
    refused(c, "vocab 0", KVF_ERR_INVAL,
            [&] { return kvf_cuda_embed(nullptr, x, table, KVF_DTYPE_F32, tok, 1, 4, 0); });
    refused(c, "unknown dtype", KVF_ERR_INVAL,
            [&] { return kvf_cuda_embed(nullptr, x, table, KVF_DTYPE_UNKNOWN, tok, 1, 4, 4); });
    empty_ok(c, "embed",
             [&] { return kvf_cuda_embed(nullptr, x, table, KVF_DTYPE_F32, tok, 0, 4, 4); });
}

void test_add_rmsnorm()
{
    const int m = 3;
    const float eps = 1e-5f;
    for (int dim : {64, 300, 2048})
        for (kvf_dtype_t adt : k_adts)
            for (bool with_delta : {false, true}) {
                if (dim == 2048 && !with_delta)
                    continue; // the large row once per dtype is enough
                check c(fmt("add_rmsnorm %s dim %d %s", kvf_dtype_name(adt), dim,
                            with_delta ? "with delta" : "no delta"));
                const int ld_out = dim + 5;
                std::vector<float> x0 = random_floats((size_t)m * dim, -3, 3);
                std::vector<float> delta = random_floats((size_t)m * dim, -1, 1);
                std::vector<float> w = random_floats((size_t)dim, 0.5f, 1.5f);
                std::vector<float> x_after;
                auto out = both_orders(c, [&] {
                    std::vector<float> x = x0;
                    auto o = sentinel_buffer((size_t)m * ld_out, adt);
                    launch_ok(c, "add_rmsnorm", [&] {
                        return kvf_cuda_add_rmsnorm(nullptr, x.data(),
                                                    with_delta ? delta.data() : nullptr, w.data(),
                                                    o.data(), ld_out, adt, m, dim, eps);
                    });
                    x_after = x;
                    append(o, x.data(), x.size() * sizeof(float));
                    return o;
                });
                // x += delta is one f32 add: exact. Then the CPU backend's norm.
                std::vector<float> x_want = x0, y((size_t)m * dim);
                if (with_delta)
                    for (size_t i = 0; i < x_want.size(); i++)
                        x_want[i] += delta[i];
                if (x_after != x_want)
                    c.fail("x after the residual add differs");
                g_cpu.ops->rmsnorm(g_cpu.ctx, y.data(), x_want.data(), w.data(), m, dim, eps);
                out.resize((size_t)m * ld_out * kvf_dtype_size(adt));
                compare_rows(c, "out", out, adt, m, dim, ld_out, y.data(), dim, 1e-5);
            }
    check c("add_rmsnorm: bad shapes refused, empty batch launches nothing");
    float x[8] = {0}, w[8] = {0}, o[8];
    refused(c, "ld_out < dim", KVF_ERR_INVAL, [&] {
        return kvf_cuda_add_rmsnorm(nullptr, x, nullptr, w, o, 7, KVF_DTYPE_F32, 1, 8, 1e-5f);
    });
    refused(c, "eps 0", KVF_ERR_INVAL, [&] {
        return kvf_cuda_add_rmsnorm(nullptr, x, nullptr, w, o, 8, KVF_DTYPE_F32, 1, 8, 0.0f);
    });
    refused(c, "unknown dtype", KVF_ERR_INVAL, [&] {
        return kvf_cuda_add_rmsnorm(nullptr, x, nullptr, w, o, 8, KVF_DTYPE_UNKNOWN, 1, 8, 1e-5f);
    });
    empty_ok(c, "add_rmsnorm", [&] {
        return kvf_cuda_add_rmsnorm(nullptr, x, nullptr, w, o, 8, KVF_DTYPE_F32, 0, 8, 1e-5f);
    });
}

void test_swiglu()
{
    const int m = 3;
    for (int n : {96, 300, 8192})
        for (kvf_dtype_t adt : k_adts) {
            if (n == 8192 && adt != KVF_DTYPE_BF16)
                continue; // Llama 1B's width once
            check c(fmt("swiglu %s %d x %d", kvf_dtype_name(adt), m, n));
            std::vector<float> gu = random_floats((size_t)m * 2 * n, -8, 8);
            auto got = both_orders(c, [&] {
                auto out = sentinel_buffer((size_t)m * n + 7, adt);
                launch_ok(c, "swiglu", [&] {
                    return kvf_cuda_swiglu(nullptr, out.data(), adt, gu.data(), m, n);
                });
                return out;
            });
            std::vector<float> want((size_t)m * n);
            g_cpu.ops->swiglu(g_cpu.ctx, want.data(), gu.data(), m, n);
            compare_rows(c, "out", got, adt, 1, m * n, m * n + 7, want.data(), m * n, 1e-5);
        }
    check c("swiglu: bad shapes refused, empty batch launches nothing");
    float gu[16] = {0}, out[8];
    refused(c, "n 0", KVF_ERR_INVAL,
            [&] { return kvf_cuda_swiglu(nullptr, out, KVF_DTYPE_F32, gu, 1, 0); });
    refused(c, "unknown dtype", KVF_ERR_INVAL,
            [&] { return kvf_cuda_swiglu(nullptr, out, KVF_DTYPE_UNKNOWN, gu, 1, 8); });
    empty_ok(c, "swiglu", [&] { return kvf_cuda_swiglu(nullptr, out, KVF_DTYPE_F32, gu, 0, 8); });
}

void test_geglu()
{
    const int m = 3;
    for (int n : {96, 300})
        for (kvf_dtype_t adt : k_adts) {
            check c(fmt("geglu %s %d x %d", kvf_dtype_name(adt), m, n));
            std::vector<float> gu = random_floats((size_t)m * 2 * n, -8, 8);
            auto got = both_orders(c, [&] {
                auto out = sentinel_buffer((size_t)m * n + 7, adt);
                launch_ok(c, "geglu", [&] {
                    return kvf_cuda_geglu(nullptr, out.data(), adt, gu.data(), m, n);
                });
                return out;
            });
            std::vector<float> want((size_t)m * n);
            g_cpu.ops->geglu(g_cpu.ctx, want.data(), gu.data(), m, n);
            compare_rows(c, "out", got, adt, 1, m * n, m * n + 7, want.data(), m * n, 1e-5);
        }
    check c("geglu: bad shapes refused, empty batch launches nothing");
    float gu[16] = {0}, out[8];
    refused(c, "n 0", KVF_ERR_INVAL,
            [&] { return kvf_cuda_geglu(nullptr, out, KVF_DTYPE_F32, gu, 1, 0); });
    empty_ok(c, "geglu", [&] { return kvf_cuda_geglu(nullptr, out, KVF_DTYPE_F32, gu, 0, 8); });
}

void test_scale_softcap()
{
    check c("scale (exact) and softcap (kvf_det_softcap within 2e-6 of the cap)");
    const size_t n = 1000;
    std::vector<float> x = random_floats(n, -40, 40), y = x;
    launch_ok(c, "scale", [&] { return kvf_cuda_scale(nullptr, y.data(), n, 8.0f); });
    for (size_t i = 0; i < n; i++)
        if (y[i] != x[i] * 8.0f)
            c.fail("scale: %zu: %g, want %g", i, (double)y[i], (double)(x[i] * 8.0f));
    y = x;
    launch_ok(c, "softcap", [&] { return kvf_cuda_softcap(nullptr, y.data(), n, 10.0f); });
    for (size_t i = 0; i < n; i++) {
        float want = kvf_det_softcap(x[i], 10.0f);
        if (fabsf(y[i] - want) > 2e-6f * 10.0f)
            c.fail("softcap: %zu: %g, want %g", i, (double)y[i], (double)want);
    }
    float z[4] = {0};
    refused(c, "cap 0", KVF_ERR_INVAL, [&] { return kvf_cuda_softcap(nullptr, z, 4, 0.0f); });
    empty_ok(c, "softcap", [&] { return kvf_cuda_softcap(nullptr, z, 0, 1.0f); });
}

void test_argmax()
{
    for (int n : {1, 7, 1000, 1025, 32000, 128256}) {
        check c(fmt("argmax rows of %d (ties, NaN, infinities)", n));
        std::vector<std::vector<float>> rows;
        auto add = [&](std::vector<float> r) { rows.push_back(std::move(r)); };
        add(random_floats((size_t)n, -10, 10));
        {
            // The largest value at several indices, the lowest of which sits
            // in a later thread and warp than another copy.
            std::vector<float> r = random_floats((size_t)n, -10, 10);
            for (int i : {n - 1, n / 2, 1500, 40000, 5})
                if (i >= 0 && i < n)
                    r[(size_t)i] = 50.0f;
            add(r);
        }
        {
            std::vector<float> r = random_floats((size_t)n, -10, 10);
            for (int i : {0, 3, n / 3, n - 1})
                if (i < n)
                    r[(size_t)i] = NAN;
            if (n > 4)
                r[(size_t)n / 2] = 20.0f;
            add(r);
        }
        add(std::vector<float>((size_t)n, NAN));
        add(std::vector<float>((size_t)n, -INFINITY));
        add(std::vector<float>((size_t)n, 0.25f));
        {
            std::vector<float> r((size_t)n, -INFINITY);
            r[(size_t)n - 1] = INFINITY;
            if (n > 2)
                r[(size_t)n / 2] = NAN;
            add(r);
        }
        {
            std::vector<float> r = random_floats((size_t)n, -5, -1);
            r[(size_t)n - 1] = -0.5f; // the last index
            add(r);
        }
        {
            // One -inf among NaNs: it wins, also over the threads that saw
            // no element (n < 1024) and hold -inf as their empty value.
            std::vector<float> r((size_t)n, NAN);
            r[(size_t)(n / 2 + 1) % (size_t)n] = -INFINITY;
            add(r);
        }
        const int m = (int)rows.size();
        std::vector<float> x;
        for (auto &r : rows)
            x.insert(x.end(), r.begin(), r.end());
        auto got = both_orders(c, [&] {
            std::vector<int32_t> ids((size_t)m + 1, -7);
            launch_ok(c, "argmax",
                      [&] { return kvf_cuda_argmax(nullptr, ids.data(), x.data(), m, n); });
            return bytes_of(ids);
        });
        const int32_t *ids = (const int32_t *)got.data();
        for (int r = 0; r < m; r++) {
            int32_t want = (int32_t)kvf_sample_argmax(&x[(size_t)r * n], n);
            if (ids[r] != want)
                c.fail("row %d: %d, kvf_sample_argmax %d", r, ids[r], want);
        }
        if (ids[m] != -7)
            c.fail("wrote past the ids");
    }
    check c("argmax: bad shapes refused, empty batch launches nothing");
    float x[4] = {0};
    int32_t ids[1];
    refused(c, "n 0", KVF_ERR_INVAL, [&] { return kvf_cuda_argmax(nullptr, ids, x, 1, 0); });
    refused(c, "-1 rows", KVF_ERR_INVAL, [&] { return kvf_cuda_argmax(nullptr, ids, x, -1, 4); });
    empty_ok(c, "argmax", [&] { return kvf_cuda_argmax(nullptr, ids, x, 0, 4); });
}

void test_gather()
{
    const int32_t rows[] = {4, 0, 4, 2, 1};
    const int n_rows = 5, n_src = 6;
    // 1200 bytes: the 4-byte path; 66 bytes (33 bf16): the 2-byte path.
    for (size_t row_bytes : {(size_t)1200, (size_t)66}) {
        check c(fmt("gather_rows %d rows of %zu bytes", n_rows, row_bytes));
        std::vector<unsigned char> src((size_t)n_src * row_bytes);
        for (auto &b : src)
            b = (unsigned char)g_rng();
        auto got = both_orders(c, [&] {
            std::vector<unsigned char> dst((size_t)(n_rows + 1) * row_bytes, k_sentinel);
            launch_ok(c, "gather_rows", [&] {
                return kvf_cuda_gather_rows(nullptr, dst.data(), src.data(), row_bytes, rows,
                                            n_rows);
            });
            return dst;
        });
        std::vector<unsigned char> want((size_t)(n_rows + 1) * row_bytes, k_sentinel);
        for (int i = 0; i < n_rows; i++)
            memcpy(&want[(size_t)i * row_bytes], &src[(size_t)rows[i] * row_bytes], row_bytes);
        if (got != want)
            c.fail("gathered rows differ from memcpy");
    }
    check c("gather_rows: bad shapes refused, empty batch launches nothing");
    unsigned char buf[16];
    int32_t r[1] = {0};
    refused(c, "odd row size", KVF_ERR_INVAL,
            [&] { return kvf_cuda_gather_rows(nullptr, buf, buf, 7, r, 1); });
    refused(c, "row size 0", KVF_ERR_INVAL,
            [&] { return kvf_cuda_gather_rows(nullptr, buf, buf, 0, r, 1); });
    refused(c, "-1 rows", KVF_ERR_INVAL,
            [&] { return kvf_cuda_gather_rows(nullptr, buf, buf, 8, r, -1); });
    empty_ok(c, "gather_rows", [&] { return kvf_cuda_gather_rows(nullptr, buf, buf, 8, r, 0); });
}

} // namespace kvf_emu_test
