// Paged-KV batches (test_cuda_emu_kv.h), and kvf_cuda_qkv_rope_write against
// a loop for the bias, then the CPU backend's rope and kv_write: the pool
// and q, with tokens whose blocks are outside the pool, and the launcher's
// bad shapes.
#include <cuda_runtime.h>

#include "cuda_ops.h"
#include "test_cuda_emu_kv.h"

#include <stdlib.h>

namespace kvf_emu_test
{

// ---- paged KV: a batch of sequences over a pool --------------------------------

kv_batch::kv_batch(geometry geom, std::vector<seq_spec> specs) : g(geom), seqs(std::move(specs))
{
    geo = kvf_kv_geometry_t{2, g.n_kv_heads, g.head_dim, g.block_size, KVF_KV_F32};
    for (auto &s : seqs) {
        int nb = (s.start_pos + s.n_tokens + g.block_size - 1) / g.block_size;
        n_blocks += (uint32_t)nb;
        bt_stride = std::max(bt_stride, nb);
    }
    n_blocks += 3;  // blocks no sequence uses
    bt_stride += 1; // padding past every table, as the backend's buckets leave
    if (kvf_kvpool_create(&geo, n_blocks, &cpu_pool) != KVF_OK ||
        kvf_kvpool_create(&geo, n_blocks, &emu_pool) != KVF_OK) {
        fprintf(stderr, "test_cuda_emu: cannot create a KV pool\n");
        exit(1);
    }
    // Earlier context: random K/V in every block, the same in both pools.
    float *a = (float *)kvf_kvpool_base(cpu_pool);
    size_t n = kvf_kvpool_bytes(cpu_pool) / sizeof(float);
    for (size_t i = 0; i < n; i++)
        a[i] = urand();
    memcpy(kvf_kvpool_base(emu_pool), a, n * sizeof(float));
    // Tables: a shuffled assignment, so no sequence has consecutive blocks.
    std::vector<uint32_t> ids(n_blocks);
    for (uint32_t i = 0; i < n_blocks; i++)
        ids[i] = i;
    std::shuffle(ids.begin(), ids.end(), g_rng);
    bt.assign(seqs.size() * (size_t)bt_stride, 0); // padding is never read
    size_t k = 0;
    for (size_t s = 0; s < seqs.size(); s++) {
        int nb = (seqs[s].start_pos + seqs[s].n_tokens + g.block_size - 1) / g.block_size;
        tables.emplace_back(ids.begin() + (long)k, ids.begin() + (long)k + nb);
        for (int b = 0; b < nb; b++)
            bt[s * bt_stride + b] = (int32_t)ids[k + b];
        k += (size_t)nb;
        for (int i = 0; i < seqs[s].n_tokens; i++) {
            int p = seqs[s].start_pos + i;
            pos.push_back(p);
            seq.push_back((int32_t)s);
            tok_block.push_back((int32_t)tables[s][(size_t)(p / g.block_size)]);
        }
    }
    n_tokens = (int)pos.size();
}

kv_batch::~kv_batch()
{
    kvf_kvpool_destroy(cpu_pool);
    kvf_kvpool_destroy(emu_pool);
}

std::string kv_batch::describe() const
{
    std::string s = fmt("h%d/%d hd%d bs%d", g.n_heads, g.n_kv_heads, g.head_dim, g.block_size);
    for (auto &q : seqs)
        s += q.n_tokens == 1 ? fmt(" [dec %d]", q.start_pos)
                             : fmt(" [%d+%d]", q.start_pos, q.n_tokens);
    return s;
}

// Pools compared as floats (rel 0: bit for bit).
void compare_pools(check &c, const kv_batch &b, const std::vector<unsigned char> &emu, double rel)
{
    const float *want = (const float *)kvf_kvpool_base(b.cpu_pool);
    const float *got = (const float *)emu.data();
    size_t n = emu.size() / sizeof(float);
    int shown = 0;
    for (size_t i = 0; i < n; i++)
        if (!c.near(got[i], want[i], rel * std::max(1.0f, fabsf(want[i]))) && shown++ < 3)
            c.fail("pool float %zu is %.9g, the CPU backend's %.9g", i, got[i], want[i]);
}

// ---- pools of the other formats ---------------------------------------------------

const kvf_kv_dtype_t k_kv_formats[4] = {KVF_KV_F16, KVF_KV_BF16, KVF_KV_FP8, KVF_KV_INT8};

namespace
{

// fn(block, layer, kv, head) for every row set of a pool.
template <typename F> void each_head(const kvf_kvpool_t *pool, F fn)
{
    const kvf_kv_geometry_t *g = kvf_kvpool_geometry(pool);
    for (uint32_t blk = 0; blk < kvf_kvpool_num_blocks(pool); blk++)
        for (int l = 0; l < g->n_layers; l++)
            for (int kv = 0; kv < 2; kv++)
                for (int h = 0; h < g->n_kv_heads; h++)
                    fn(blk, l, kv, h);
}

} // namespace

kvf_kvpool_t *random_format_pool(const kv_batch &b, kvf_kv_dtype_t dt)
{
    kvf_kv_geometry_t geo = b.geo;
    geo.dtype = dt;
    kvf_kvpool_t *pool = nullptr;
    if (kvf_kvpool_create(&geo, b.n_blocks, &pool) != KVF_OK) {
        fprintf(stderr, "test_cuda_emu: cannot create a %s KV pool\n", kvf_kv_dtype_name(dt));
        exit(1);
    }
    const int hd = geo.head_dim;
    const size_t eb = kvf_kv_elem_bytes(dt);
    each_head(pool, [&](uint32_t blk, int l, int kv, int h) {
        unsigned char *d = (unsigned char *)kvf_kvpool_head_data(pool, blk, l, kv, h);
        float *sc = kvf_kvpool_head_scales(pool, blk, l, kv, h);
        for (int slot = 0; slot < geo.block_size; slot++) {
            // Within [-1, 1], as the f32 pools (the kernels' tolerances
            // assume it), with a range of its own so that scales differ
            // from row to row.
            std::vector<float> x = random_floats((size_t)hd);
            float m = urand(0.25f, 1.0f);
            for (float &v : x)
                v *= m;
            kvf_kv_encode_row(dt, x.data(), hd, d + (size_t)slot * hd * eb, sc ? sc + slot : nullptr);
        }
    });
    return pool;
}

void decode_pool(const kvf_kvpool_t *src, kvf_kvpool_t *dst)
{
    const kvf_kv_geometry_t *g = kvf_kvpool_geometry(src);
    const kvf_kv_dtype_t dt = g->dtype;
    const int hd = g->head_dim;
    const size_t eb = kvf_kv_elem_bytes(dt);
    each_head(src, [&](uint32_t blk, int l, int kv, int h) {
        const unsigned char *d = (const unsigned char *)kvf_kvpool_head_data(src, blk, l, kv, h);
        const float *sc = kvf_kvpool_head_scales(src, blk, l, kv, h);
        float *out = (float *)kvf_kvpool_head_data(dst, blk, l, kv, h);
        for (int slot = 0; slot < g->block_size; slot++)
            kvf_kv_decode_row(dt, d + (size_t)slot * hd * eb, sc ? sc[slot] : 1.0f, hd,
                              out + (size_t)slot * hd);
    });
}

void encode_batch_rows(const kv_batch &b, const std::vector<unsigned char> &src_f32,
                       kvf_kvpool_t *dst)
{
    const kvf_kv_geometry_t *g = kvf_kvpool_geometry(dst);
    const kvf_kv_dtype_t dt = g->dtype;
    const int hd = g->head_dim, bs = g->block_size;
    const size_t eb = kvf_kv_elem_bytes(dt);
    const size_t f32_block = kvf_kv_block_bytes(&b.geo), f32_slice = kvf_kv_slice_bytes(&b.geo);
    for (int t = 0; t < b.n_tokens; t++) {
        const uint32_t blk = (uint32_t)b.tok_block[(size_t)t];
        const int slot = b.pos[(size_t)t] % bs;
        for (int kv = 0; kv < 2; kv++)
            for (int h = 0; h < g->n_kv_heads; h++) {
                const float *x =
                    (const float *)(src_f32.data() + blk * f32_block + (size_t)b.layer * f32_slice +
                                    kvf_kv_data_offset(KVF_KV_F32, g->n_kv_heads, bs, hd, kv, h)) +
                    (size_t)slot * hd;
                unsigned char *d = (unsigned char *)kvf_kvpool_head_data(dst, blk, b.layer, kv, h);
                float *sc = kvf_kvpool_head_scales(dst, blk, b.layer, kv, h);
                kvf_kv_encode_row(dt, x, hd, d + (size_t)slot * hd * eb, sc ? sc + slot : nullptr);
            }
    }
}

// ---- qkv_rope_write --------------------------------------------------------------

namespace
{

// cos|sin rows of the rotation angles pos * theta^(-2d / head_dim), computed
// in double as the engine and the CUDA backend do.
std::vector<float> rope_table(const std::vector<int32_t> &pos, int hd)
{
    int half = hd / 2;
    std::vector<float> cs(pos.size() * (size_t)hd);
    for (size_t t = 0; t < pos.size(); t++)
        for (int d = 0; d < half; d++) {
            double a = (double)pos[t] * pow(500000.0, -2.0 * d / hd);
            cs[t * hd + d] = (float)cos(a);
            cs[t * hd + half + d] = (float)sin(a);
        }
    return cs;
}

struct qkv_case {
    geometry g;
    std::vector<seq_spec> seqs;
    bool bias;
    bool norm; // Qwen3's per-head q/k RMSNorm
};

// q, rotated in place, against want; the padding past q|k|v untouched.
void compare_q(check &c, const kv_batch &b, int n_rows, int ld, const std::vector<float> &q_after,
               const std::vector<float> &want, const std::vector<float> &qkv0, double rel)
{
    const int q_dim = b.g.n_heads * b.g.head_dim, kv_dim = b.g.n_kv_heads * b.g.head_dim;
    int shown = 0;
    for (int t = 0; t < n_rows; t++) {
        for (int j = 0; j < q_dim; j++) {
            size_t i = (size_t)t * ld + j;
            if (!c.near(q_after[i], want[i], rel * std::max(1.0f, fabsf(want[i]))) && shown++ < 3)
                c.fail("q row %d column %d: %.9g, want %.9g", t, j, q_after[i], want[i]);
        }
        for (int j = q_dim + 2 * kv_dim; j < ld; j++)
            if (q_after[(size_t)t * ld + j] != qkv0[(size_t)t * ld + j] && shown++ < 3)
                c.fail("row %d: padding column %d written", t, j);
    }
}

void qkv_rope_write_case(const qkv_case &qc)
{
    kv_batch b(qc.g, qc.seqs);
    check c("qkv_rope_write " + b.describe() + (qc.bias ? " bias" : "") + (qc.norm ? " qk-norm" : ""));
    const int hd = b.g.head_dim, q_dim = b.g.n_heads * hd, kv_dim = b.g.n_kv_heads * hd;
    const int ld = q_dim + 2 * kv_dim + 3;
    // Two more tokens whose blocks are outside the pool: their q is
    // rotated, their k and v are never written.
    std::vector<int32_t> tok_block = b.tok_block, pos = b.pos;
    tok_block.push_back(-1);
    tok_block.push_back((int32_t)b.n_blocks);
    pos.push_back(3);
    pos.push_back(b.g.block_size + 1);
    const int n_rows = b.n_tokens + 2;
    std::vector<float> qkv0 = random_floats((size_t)n_rows * ld, -2, 2);
    std::vector<float> bias = random_floats((size_t)(q_dim + 2 * kv_dim));
    std::vector<float> cs = rope_table(pos, hd);
    std::vector<float> q_norm = random_floats((size_t)hd, 0.5f, 1.5f);
    std::vector<float> k_norm = random_floats((size_t)hd, 0.5f, 1.5f);
    const float eps = 1e-6f;
    const auto start = b.emu_pool_bytes();
    std::vector<float> q_after;
    auto got = both_orders(c, [&] {
        b.reset_emu_pool(start);
        std::vector<float> qkv = qkv0;
        launch_ok(c, "qkv_rope_write", [&] {
            return kvf_cuda_qkv_rope_write(nullptr, qkv.data(), ld, qc.bias ? bias.data() : nullptr,
                                           qc.norm ? q_norm.data() : nullptr,
                                           qc.norm ? k_norm.data() : nullptr, eps, cs.data(),
                                           b.emu_base(), b.block_stride(), b.layer_off(),
                                           KVF_KV_F32, tok_block.data(), pos.data(), n_rows, b.g.n_heads,
                                           b.g.n_kv_heads, hd, b.g.block_size, (int)b.n_blocks);
        });
        q_after = qkv;
        auto out = b.emu_pool_bytes();
        append(out, qkv.data(), qkv.size() * sizeof(float));
        return out;
    });
    // The reference: bias (a loop), then the CPU backend's head_rmsnorm,
    // rope and kv_write.
    std::vector<float> want = qkv0;
    if (qc.bias)
        for (int t = 0; t < n_rows; t++)
            for (int j = 0; j < q_dim + 2 * kv_dim; j++)
                want[(size_t)t * ld + j] += bias[j];
    if (qc.norm) {
        g_cpu.ops->head_rmsnorm(g_cpu.ctx, want.data(), ld, q_norm.data(), n_rows, b.g.n_heads, hd,
                                eps);
        g_cpu.ops->head_rmsnorm(g_cpu.ctx, want.data() + q_dim, ld, k_norm.data(), n_rows,
                                b.g.n_kv_heads, hd, eps);
    }
    g_cpu.ops->rope(g_cpu.ctx, want.data(), ld, cs.data(), n_rows, b.g.n_heads, hd);
    g_cpu.ops->rope(g_cpu.ctx, want.data() + q_dim, ld, cs.data(), n_rows, b.g.n_kv_heads, hd);
    auto ptrs = b.table_ptrs();
    kvf_batch_layout_t lay = b.layout(ptrs);
    g_cpu.ops->kv_write(g_cpu.ctx, b.cpu_pool, b.layer, want.data() + q_dim,
                        want.data() + q_dim + kv_dim, ld, &lay);
    got.resize(kvf_kvpool_bytes(b.emu_pool));
    // The norm's sum of squares is f32 in warp order on the device, f64 on
    // the CPU: a few ulps apart.
    const double rel = qc.norm ? 2e-6 : 3e-7;
    compare_pools(c, b, got, rel);
    compare_q(c, b, n_rows, ld, q_after, want, qkv0, rel);

    // Every other format: the same launch into a pool of it writes, bit for
    // bit, kvf_kv_encode_row of the f32 rows above, and nothing else.
    for (kvf_kv_dtype_t dt : k_kv_formats) {
        kvf_kvpool_t *pool = random_format_pool(b, dt), *want_pool = random_format_pool(b, dt);
        const size_t bytes = kvf_kvpool_bytes(pool);
        memcpy(kvf_kvpool_base(want_pool), kvf_kvpool_base(pool), bytes);
        encode_batch_rows(b, got, want_pool);
        std::vector<float> qkv = qkv0;
        launch_ok(c, "qkv_rope_write", [&] {
            return kvf_cuda_qkv_rope_write(
                nullptr, qkv.data(), ld, qc.bias ? bias.data() : nullptr,
                qc.norm ? q_norm.data() : nullptr, qc.norm ? k_norm.data() : nullptr, eps,
                cs.data(), kvf_kvpool_base(pool), (int64_t)kvf_kv_block_bytes(kvf_kvpool_geometry(pool)),
                (int64_t)b.layer * (int64_t)kvf_kvpool_slice_bytes(pool), dt, tok_block.data(),
                pos.data(), n_rows, b.g.n_heads, b.g.n_kv_heads, hd, b.g.block_size,
                (int)b.n_blocks);
        });
        const unsigned char *gp = (const unsigned char *)kvf_kvpool_base(pool);
        const unsigned char *wp = (const unsigned char *)kvf_kvpool_base(want_pool);
        for (size_t i = 0; i < bytes; i++)
            if (gp[i] != wp[i]) {
                c.fail("%s pool byte %zu is 0x%02x, kvf_kv_encode_row's 0x%02x",
                       kvf_kv_dtype_name(dt), i, gp[i], wp[i]);
                break;
            }
        for (int t = 0; t < n_rows; t++)
            if (memcmp(&qkv[(size_t)t * ld], &q_after[(size_t)t * ld], (size_t)q_dim * 4) != 0) {
                c.fail("%s: q row %d differs from the f32 pool's launch", kvf_kv_dtype_name(dt), t);
                break;
            }
        kvf_kvpool_destroy(pool);
        kvf_kvpool_destroy(want_pool);
    }
}

void qkv_rope_write_shapes()
{
    check c("qkv_rope_write: bad shapes refused, empty batch launches nothing");
    float qkv[64] = {0}, cs[16] = {0}, pool[64] = {0};
    int32_t ids[1] = {0}, pos[1] = {0};
    refused(c, "odd head_dim", KVF_ERR_INVAL, [&] {
        return kvf_cuda_qkv_rope_write(nullptr, qkv, 64, nullptr, nullptr, nullptr, 0.0f, cs, pool,
                                       256, 0, KVF_KV_F32, ids, pos, 1, 1, 1, 15, 1, 1);
    });
    refused(c, "row shorter than q|k|v", KVF_ERR_INVAL, [&] {
        return kvf_cuda_qkv_rope_write(nullptr, qkv, 40, nullptr, nullptr, nullptr, 0.0f, cs, pool,
                                       256, 0, KVF_KV_F32, ids, pos, 1, 1, 1, 16, 1, 1);
    });
    empty_ok(c, "qkv_rope_write", [&] {
        return kvf_cuda_qkv_rope_write(nullptr, qkv, 64, nullptr, nullptr, nullptr, 0.0f, cs, pool,
                                       256, 0, KVF_KV_F32, ids, pos, 0, 1, 1, 16, 1, 1);
    });
    refused(c, "unknown KV format", KVF_ERR_INVAL, [&] {
        return kvf_cuda_qkv_rope_write(nullptr, qkv, 64, nullptr, nullptr, nullptr, 0.0f, cs, pool,
                                       256, 0, (kvf_kv_dtype_t)KVF_KV_N_DTYPES, ids, pos, 1, 1,
                                       1, 16, 1, 1);
    });
}

} // namespace

void test_qkv_rope_write()
{
    const qkv_case cases[] = {
        {{4, 2, 16, 16}, {{0, 20}, {37, 9}, {5, 1}}, false, false},
        {{8, 2, 64, 16}, {{100, 17}, {3, 1}}, true, false},
        {{4, 4, 128, 1}, {{0, 4}, {9, 1}}, true, false},
        {{6, 2, 96, 256}, {{250, 12}, {0, 2}}, false, false},
        {{4, 1, 80, 16}, {{30, 5}}, true, false},
        // Qwen3: per-head q/k norms, head_dim 24 (hidden / heads would differ),
        // with and without biases; 128 threads over 6 + 2 heads of 128.
        {{4, 2, 24, 16}, {{0, 20}, {37, 9}, {5, 1}}, false, true},
        {{6, 2, 128, 16}, {{10, 7}, {3, 1}}, true, true},
    };
    for (const qkv_case &qc : cases)
        qkv_rope_write_case(qc);
    qkv_rope_write_shapes();
}

} // namespace kvf_emu_test
