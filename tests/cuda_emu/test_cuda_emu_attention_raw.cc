// Attention against a loop in double, with ids outside the pool: the cases
// of the first emulator harness. Random pool contents and tables with ids
// outside the pool (or a position past the table), which the kernels read
// as zero K and V; the CPU backend cannot take those, so the reference is a
// loop in double.
#include <cuda_runtime.h>

#include "cuda_ops.h"
#include "test_cuda_emu_kv.h"

namespace kvf_emu_test
{
namespace
{

struct raw_batch {
    geometry g;
    int n_layers = 2, layer = 1, n_blocks = 0, bt_stride = 0, n_seqs = 0, n_tokens = 0;
    long long block_stride = 0;
    std::vector<float> pool;
    std::vector<int32_t> bt, pos, seq; // bt (n_seqs, bt_stride)
    std::vector<float> q;
    int ld_q = 0, ld_out = 0;
    std::vector<double> ref; // (n_tokens, n_heads * head_dim)
};

// b.ref: softmax(q K^T / sqrt(head_dim)) V per token and head, in double,
// rows of ids outside the pool read as zeros.
void raw_reference(raw_batch &b)
{
    const geometry &g = b.g;
    const int q_dim = g.n_heads * g.head_dim, group = g.n_heads / g.n_kv_heads;
    b.ref.assign((size_t)b.n_tokens * q_dim, 0);
    for (int t = 0; t < b.n_tokens; t++)
        for (int h = 0; h < g.n_heads; h++) {
            const int kvh = h / group, last = b.pos[(size_t)t];
            // K (kv = 0) or V (1) row of position p; nullptr: reads as zeros.
            auto row = [&](int p, int kv) -> const float * {
                int blk = b.bt[(size_t)b.seq[(size_t)t] * b.bt_stride + p / g.block_size];
                if (blk < 0 || blk >= b.n_blocks)
                    return nullptr;
                return b.pool.data() + (size_t)blk * b.block_stride +
                       (size_t)b.layer * 2 * g.n_kv_heads * g.block_size * g.head_dim +
                       (size_t)kv * g.n_kv_heads * g.block_size * g.head_dim +
                       ((size_t)kvh * g.block_size + p % g.block_size) * g.head_dim;
            };
            std::vector<double> sc((size_t)last + 1);
            double mx = -INFINITY;
            for (int p = 0; p <= last; p++) {
                const float *kr = row(p, 0);
                double d = 0;
                for (int j = 0; j < g.head_dim; j++)
                    d += (double)b.q[(size_t)t * b.ld_q + h * g.head_dim + j] * (kr ? kr[j] : 0.0);
                sc[(size_t)p] = d / sqrt((double)g.head_dim);
                mx = std::max(mx, sc[(size_t)p]);
            }
            double l = 0;
            std::vector<double> o((size_t)g.head_dim, 0);
            for (int p = 0; p <= last; p++) {
                double e = exp(sc[(size_t)p] - mx);
                l += e;
                if (const float *vr = row(p, 1))
                    for (int j = 0; j < g.head_dim; j++)
                        o[(size_t)j] += e * vr[j];
            }
            for (int j = 0; j < g.head_dim; j++)
                b.ref[(size_t)t * q_dim + h * g.head_dim + j] = o[(size_t)j] / l;
        }
}

// rows[s] = (first position, count) of sequence s's tokens in the batch;
// bad_ids table entries are replaced with ids outside the pool.
raw_batch make_raw_batch(geometry g, const std::vector<std::pair<int, int>> &rows, int bad_ids)
{
    raw_batch b;
    b.g = g;
    b.n_seqs = (int)rows.size();
    auto blocks_of = [&](const std::pair<int, int> &r) {
        return (r.first + r.second - 1) / g.block_size + 1;
    };
    int need = 0, widest = 0;
    for (auto &r : rows) {
        need += blocks_of(r);
        widest = std::max(widest, blocks_of(r));
    }
    b.bt_stride = widest + 2;
    b.n_blocks = need + 3;
    b.block_stride = (long long)b.n_layers * 2 * g.n_kv_heads * g.block_size * g.head_dim;
    b.pool = random_floats((size_t)b.n_blocks * b.block_stride);
    std::vector<int> perm((size_t)b.n_blocks);
    for (int i = 0; i < b.n_blocks; i++)
        perm[(size_t)i] = i;
    std::shuffle(perm.begin(), perm.end(), g_rng);
    b.bt.assign((size_t)b.n_seqs * b.bt_stride, -7);
    int k = 0;
    for (int s = 0; s < b.n_seqs; s++)
        for (int i = 0; i < blocks_of(rows[(size_t)s]); i++)
            b.bt[(size_t)s * b.bt_stride + i] = perm[(size_t)k++];
    for (int i = 0; i < bad_ids; i++) {
        int s = (int)(g_rng() % (unsigned)b.n_seqs);
        int at = (int)(g_rng() % (unsigned)blocks_of(rows[(size_t)s]));
        b.bt[(size_t)s * b.bt_stride + at] = (i & 1) ? -3 : b.n_blocks + (int)(g_rng() % 5);
    }
    for (int s = 0; s < b.n_seqs; s++)
        for (int i = 0; i < rows[(size_t)s].second; i++) {
            b.pos.push_back(rows[(size_t)s].first + i);
            b.seq.push_back(s);
        }
    b.n_tokens = (int)b.pos.size();
    const int q_dim = g.n_heads * g.head_dim;
    b.ld_q = q_dim + 8;
    b.ld_out = q_dim + 4;
    b.q = random_floats((size_t)b.n_tokens * b.ld_q, -3, 3);
    raw_reference(b);
    return b;
}

kvf_cuda_attn_t raw_attn(raw_batch &b, void *out, kvf_dtype_t adt)
{
    kvf_cuda_attn_t a{};
    a.kv_layer =
        b.pool.data() + (size_t)b.layer * 2 * b.g.n_kv_heads * b.g.block_size * b.g.head_dim;
    a.block_stride = b.block_stride * (long long)sizeof(float); // bytes
    a.n_pool_blocks = b.n_blocks;
    a.n_heads = b.g.n_heads;
    a.n_kv_heads = b.g.n_kv_heads;
    a.head_dim = b.g.head_dim;
    a.block_size = b.g.block_size;
    a.scale = (float)(1.0 / sqrt((double)b.g.head_dim));
    a.q = b.q.data();
    a.ld_q = b.ld_q;
    a.out = out;
    a.ld_out = b.ld_out;
    a.adt = adt;
    a.n_tokens = b.n_tokens;
    a.pos = b.pos.data();
    a.seq = b.seq.data();
    a.block_tables = b.bt.data();
    a.bt_stride = b.bt_stride;
    a.n_seqs = b.n_seqs;
    return a;
}

// written[t]: row t must hold a result; other rows keep the sentinel.
void compare_raw(check &c, raw_batch &b, const std::vector<unsigned char> &out, kvf_dtype_t adt,
                 const std::vector<char> &written)
{
    const int q_dim = b.g.n_heads * b.g.head_dim;
    int shown = 0;
    for (int t = 0; t < b.n_tokens; t++)
        for (int j = 0; j < b.ld_out; j++) {
            size_t i = (size_t)t * b.ld_out + j;
            if (!written[(size_t)t] || j >= q_dim) {
                if (!is_sentinel(out, adt, i) && shown++ < 3)
                    c.fail("row %d column %d written", t, j);
                continue;
            }
            double w = b.ref[(size_t)t * q_dim + j];
            double tol = 2e-5 * (1 + fabs(w)) + half_ulp(adt, w) * 1.0001;
            float gv = act_get(out.data(), adt, i);
            if (!c.near(gv, w, tol) && shown++ < 3)
                c.fail("row %d column %d: %.9g, want %.9g", t, j, gv, w);
        }
}

// tile_cap > 0: tiles of at most that many tokens.
void raw_prefill(geometry g, std::vector<std::pair<int, int>> rows, int bad_ids, kvf_dtype_t adt,
                 int tile_cap)
{
    raw_batch b = make_raw_batch(g, rows, bad_ids);
    int tt = kvf_cuda_prefill_tile_tokens(g.n_heads / g.n_kv_heads);
    if (tile_cap > 0 && tile_cap < tt)
        tt = tile_cap;
    std::vector<int32_t> tiles;
    int max_pos = 0;
    for (int t = 0; t < b.n_tokens;) {
        int e = t + 1;
        while (e < b.n_tokens && e - t < tt && b.seq[(size_t)e] == b.seq[(size_t)t])
            e++;
        tiles.push_back(t);
        tiles.push_back(e - t);
        max_pos = std::max(max_pos, b.pos[(size_t)e - 1]);
        t = e;
    }
    check c(fmt("prefill (double ref) h%d/%d hd%d bs%d %zu tiles %s, %d ids outside the pool",
                g.n_heads, g.n_kv_heads, g.head_dim, g.block_size, tiles.size() / 2,
                kvf_dtype_name(adt), bad_ids));
    auto out = both_orders(c, [&] {
        auto o = sentinel_buffer((size_t)b.n_tokens * b.ld_out, adt);
        kvf_cuda_attn_t a = raw_attn(b, o.data(), adt);
        kvf_cuda_prefill_tiles_t pt = {tiles.data(), (int)tiles.size() / 2, max_pos};
        launch_ok(c, "attention_prefill",
                  [&] { return kvf_cuda_attention_prefill(nullptr, &a, &pt); });
        return o;
    });
    compare_raw(c, b, out, adt, std::vector<char>((size_t)b.n_tokens, 1));
}

// Decode tokens: the last row of each sequence and every third row, in
// reverse batch order. split_keys 0: the default for the geometry.
void raw_decode(geometry g, std::vector<std::pair<int, int>> rows, int bad_ids, kvf_dtype_t adt,
                int split_keys, int extra_splits)
{
    raw_batch b = make_raw_batch(g, rows, bad_ids);
    if (split_keys <= 0)
        split_keys = kvf_cuda_decode_split_keys(g.n_heads / g.n_kv_heads, g.block_size);
    std::vector<int32_t> toks;
    std::vector<char> written((size_t)b.n_tokens, 0);
    int max_pos = 0;
    for (int t = 0; t < b.n_tokens; t++)
        if (t % 3 == 0 || t + 1 == b.n_tokens || b.seq[(size_t)t + 1] != b.seq[(size_t)t]) {
            toks.push_back(t);
            written[(size_t)t] = 1;
            max_pos = std::max(max_pos, b.pos[(size_t)t]);
        }
    std::reverse(toks.begin(), toks.end());
    int n_splits = (max_pos + 1 + split_keys - 1) / split_keys + extra_splits;
    while ((long long)n_splits * split_keys > (long long)b.bt_stride * g.block_size + split_keys)
        n_splits--;
    check c(fmt("decode (double ref) h%d/%d hd%d bs%d %zu tokens x %d splits of %d %s, %d ids "
                "outside the pool",
                g.n_heads, g.n_kv_heads, g.head_dim, g.block_size, toks.size(), n_splits,
                split_keys, kvf_dtype_name(adt), bad_ids));
    auto out = both_orders(c, [&] {
        std::vector<float> ws(
            kvf_cuda_decode_ws_floats((int)toks.size(), g.n_heads, n_splits, g.head_dim), NAN);
        auto o = sentinel_buffer((size_t)b.n_tokens * b.ld_out, adt);
        kvf_cuda_attn_t a = raw_attn(b, o.data(), adt);
        kvf_cuda_decode_plan_t p = {toks.data(), (int)toks.size(), n_splits, split_keys, ws.data()};
        launch_ok(c, "attention_decode",
                  [&] { return kvf_cuda_attention_decode(nullptr, &a, &p); });
        return o;
    });
    compare_raw(c, b, out, adt, written);
}

} // namespace

void test_attention_raw()
{
    const kvf_dtype_t f32 = KVF_DTYPE_F32, bf16 = KVF_DTYPE_BF16, f16 = KVF_DTYPE_F16;
    // Chunked prefill (nonzero start), several sequences, partial tiles.
    raw_prefill({4, 2, 16, 16}, {{0, 20}, {37, 9}, {5, 1}}, 0, f32, 0);
    raw_prefill({2, 2, 8, 3}, {{0, 7}, {10, 40}}, 0, f32, 0);
    raw_prefill({7, 1, 24, 5}, {{3, 12}, {0, 2}}, 0, bf16, 0);
    raw_prefill({32, 1, 16, 16}, {{0, 3}, {70, 4}}, 0, f32, 0);
    raw_prefill({8, 2, 64, 16}, {{0, 20}, {100, 17}}, 0, f16, 0);
    raw_prefill({4, 4, 128, 16}, {{40, 70}}, 0, f32, 0);
    raw_prefill({2, 1, 136, 4}, {{0, 5}, {30, 33}}, 0, f32, 0);
    raw_prefill({4, 2, 256, 16}, {{0, 3}, {45, 20}}, 0, f32, 0);
    raw_prefill({4, 2, 32, 1}, {{0, 70}}, 0, f32, 5);
    raw_prefill({4, 2, 16, 16}, {{0, 40}, {60, 30}}, 3, f32, 0);
    raw_prefill({6, 3, 48, 7}, {{13, 11}}, 2, f32, 0);
    raw_prefill({32, 1, 256, 16}, {{0, 5}, {40, 3}}, 0, bf16, 0);
    raw_prefill({64, 2, 8, 2}, {{0, 9}}, 1, f32, 0);
    raw_prefill({4, 2, 96, 16}, {{0, 9}, {30, 12}}, 2, f32, 0);
    raw_prefill({4, 1, 80, 8}, {{5, 20}}, 1, bf16, 0);

    raw_decode({4, 2, 16, 16}, {{0, 20}, {37, 9}, {5, 1}}, 0, f32, 0, 0);
    raw_decode({4, 2, 16, 16}, {{0, 20}, {37, 9}, {5, 1}}, 0, f32, 16, 2);
    raw_decode({2, 2, 8, 3}, {{0, 7}, {10, 40}}, 0, f32, 6, 1);
    raw_decode({7, 1, 24, 5}, {{3, 12}, {0, 2}}, 0, bf16, 10, 1);
    raw_decode({32, 1, 16, 16}, {{0, 3}, {70, 4}}, 0, f32, 32, 0);
    raw_decode({8, 2, 64, 16}, {{0, 20}, {100, 17}}, 0, f16, 48, 1);
    raw_decode({4, 4, 128, 16}, {{40, 70}}, 0, f32, 32, 0);
    raw_decode({2, 1, 136, 4}, {{0, 5}, {30, 33}}, 0, f32, 8, 2);
    raw_decode({4, 2, 256, 16}, {{0, 3}, {45, 20}}, 0, f32, 0, 0);
    raw_decode({4, 2, 256, 16}, {{0, 3}, {45, 20}}, 0, f32, 16, 1);
    raw_decode({32, 2, 256, 16}, {{300, 3}}, 0, f32, 128, 0);
    raw_decode({4, 2, 32, 1}, {{0, 70}}, 0, f32, 7, 1);
    raw_decode({4, 2, 16, 16}, {{0, 40}, {60, 30}}, 3, f32, 16, 1);
    raw_decode({6, 3, 48, 7}, {{13, 11}}, 2, f32, 7, 0);
    raw_decode({32, 1, 256, 16}, {{200, 2}, {0, 1}}, 0, f32, 128, 1);
    raw_decode({64, 2, 8, 2}, {{0, 9}}, 1, f32, 64, 0);
    raw_decode({4, 2, 96, 16}, {{0, 9}, {30, 12}}, 2, f32, 16, 2);
    raw_decode({4, 1, 80, 8}, {{5, 20}}, 1, bf16, 24, 1);
    // head_dim 200: a second column pass of 72, again n_kg == 1.
    raw_decode({2, 1, 200, 16}, {{0, 6}, {50, 4}}, 0, f32, 32, 1);
}

} // namespace kvf_emu_test
