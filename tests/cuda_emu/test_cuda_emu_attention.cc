// kvf_cuda_attention_prefill, kvf_cuda_attention_prefill_tc and
// kvf_cuda_attention_decode against the CPU backend's attention, over pools
// filled by qkv_rope_write and the CPU kv_write: mixed batches of prefill
// tiles and decode tokens, as the engine builds them. And the launchers'
// shape checks: bad shapes refused, empty batches launch nothing, a launch
// the device would refuse comes back as an error.
#include <cuda_runtime.h>

#include "cuda_ops.h"
#include "test_cuda_emu_kv.h"

namespace kvf_emu_test
{
namespace
{

// ---- attention against the CPU backend -------------------------------------------

// Prefill tiles on CUDA cores (attention_prefill.cu) or tensor cores
// (attention_prefill_tc.cu, bf16/f16 and head dims of 16 k up to 128).
enum class prefill_kernel { cores, tensor_cores };

// Where a case's rows are: q|k|v rows of ld_qkv floats (q_dim, then kv_dim
// each), output rows of ld_out activations.
struct attention_rows {
    int hd, q_dim, kv_dim, ld_qkv, ld_out;
};

// How a mixed batch splits between the two attentions: tiles as (first
// token, count) pairs, decode tokens, and the decode's splits.
struct attention_plan {
    std::vector<int32_t> tiles, dec;
    int max_tile_pos = 0, max_dec_pos = 0;
    int split_keys = 0, n_splits = 0;
};

// Sequences of several tokens (prefill, chunked when start_pos > 0) go to
// prefill tiles, single tokens to decode. split_keys 0:
// kvf_cuda_decode_split_keys(); extra_splits: splits past every context.
attention_plan plan_attention(const kv_batch &b, int split_keys, int extra_splits)
{
    const geometry &g = b.g;
    const int group = g.n_heads / g.n_kv_heads;
    attention_plan p;
    p.split_keys = split_keys > 0 ? split_keys : kvf_cuda_decode_split_keys(group, g.block_size);
    const int tile = kvf_cuda_prefill_tile_tokens(group);
    int t = 0;
    for (auto &s : b.seqs) {
        if (s.n_tokens == 1) {
            p.dec.push_back(t);
            p.max_dec_pos = std::max(p.max_dec_pos, s.start_pos);
        } else {
            for (int i = 0; i < s.n_tokens; i += tile) {
                p.tiles.push_back(t + i);
                p.tiles.push_back(std::min(tile, s.n_tokens - i));
            }
            p.max_tile_pos = std::max(p.max_tile_pos, s.start_pos + s.n_tokens - 1);
        }
        t += s.n_tokens;
    }
    p.n_splits = (p.max_dec_pos + 1 + p.split_keys - 1) / p.split_keys + extra_splits;
    while ((long long)p.n_splits * p.split_keys >
           (long long)b.bt_stride * g.block_size + p.split_keys)
        p.n_splits--;
    return p;
}

// The kernels' view of the batch: q from q, out into out, K/V from the
// emulated pool.
kvf_cuda_attn_t attn_of(const kv_batch &b, const attention_rows &r, const float *q, void *out,
                        kvf_dtype_t adt)
{
    kvf_cuda_attn_t a{};
    a.kv_layer = b.emu_base() + b.layer_off();
    a.block_stride = b.block_stride();
    a.kv_dtype = b.geo.dtype;
    a.n_pool_blocks = (int)b.n_blocks;
    a.n_heads = b.g.n_heads;
    a.n_kv_heads = b.g.n_kv_heads;
    a.head_dim = r.hd;
    a.block_size = b.g.block_size;
    a.scale = b.scale > 0 ? b.scale : 1.0f / sqrtf((float)r.hd);
    a.softcap = b.softcap;
    a.q = q;
    a.ld_q = r.ld_qkv;
    a.out = out;
    a.ld_out = r.ld_out;
    a.adt = adt;
    a.n_tokens = b.n_tokens;
    a.pos = b.pos.data();
    a.seq = b.seq.data();
    a.block_tables = b.bt.data();
    a.bt_stride = b.bt_stride;
    a.n_seqs = (int)b.seqs.size();
    a.window = b.window;
    return a;
}

// One run of the emulated kernels (both_orders makes two): the pool reset
// to start, K/V of the batch written by qkv_rope_write with the rotation
// table identity, then the prefill tiles and the decode tokens. Returns the
// output rows followed by the pool.
std::vector<unsigned char> run_emulated(check &c, kv_batch &b, const attention_plan &p,
                                        const attention_rows &r, const std::vector<float> &qkv,
                                        const std::vector<float> &identity, kvf_dtype_t adt,
                                        bool tc, const std::vector<unsigned char> &start)
{
    const geometry &g = b.g;
    b.reset_emu_pool(start);
    std::vector<float> qkv_dev = qkv;
    launch_ok(c, "qkv_rope_write", [&] {
        return kvf_cuda_qkv_rope_write(nullptr, qkv_dev.data(), r.ld_qkv, nullptr, nullptr, nullptr,
                                       0.0f, identity.data(),
                                       b.emu_base(), b.block_stride(), b.layer_off(),
                                       b.geo.dtype, b.tok_block.data(), b.pos.data(), b.n_tokens, g.n_heads,
                                       g.n_kv_heads, r.hd, g.block_size, (int)b.n_blocks);
    });
    if (qkv_dev != qkv)
        c.fail("a rotation by 0 changed q");
    auto out = sentinel_buffer((size_t)b.n_tokens * r.ld_out, adt);
    kvf_cuda_attn_t a = attn_of(b, r, qkv.data(), out.data(), adt);
    if (!p.tiles.empty()) {
        kvf_cuda_prefill_tiles_t pt = {p.tiles.data(), (int)p.tiles.size() / 2, p.max_tile_pos};
        if (tc && !kvf_cuda_prefill_tc_ok(&a))
            c.fail("kvf_cuda_prefill_tc_ok() refuses a tensor-core case");
        launch_ok(c, "attention_prefill", [&] {
            return tc ? kvf_cuda_attention_prefill_tc(nullptr, &a, &pt)
                      : kvf_cuda_attention_prefill(nullptr, &a, &pt);
        });
    }
    if (!p.dec.empty()) {
        // The workspace starts as NaN: nothing may read what no split wrote.
        std::vector<float> ws(
            kvf_cuda_decode_ws_floats((int)p.dec.size(), g.n_heads, p.n_splits, r.hd), NAN);
        kvf_cuda_decode_plan_t dp = {p.dec.data(), (int)p.dec.size(), p.n_splits, p.split_keys,
                                     ws.data()};
        launch_ok(c, "attention_decode",
                  [&] { return kvf_cuda_attention_decode(nullptr, &a, &dp); });
    }
    append(out, kvf_kvpool_base(b.emu_pool), kvf_kvpool_bytes(b.emu_pool));
    return out;
}

// Tensor cores take q, K, V and the probabilities in the 16-bit type: each
// rounding is half an ulp (2^-9 bf16, 2^-12 f16) of an input, and the
// outputs (averages of V rows within [-1, 1]) move by a few of them. Decode
// rows stay on CUDA cores in f32.
void compare_tc_rows(check &c, const kv_batch &b, const attention_plan &p, const attention_rows &r,
                     const std::vector<unsigned char> &got, const std::vector<float> &want,
                     kvf_dtype_t adt)
{
    const double tc_rel = adt == KVF_DTYPE_BF16 ? 1.2e-2 : 1.5e-3;
    std::vector<char> is_dec((size_t)b.n_tokens, 0);
    for (int32_t d : p.dec)
        is_dec[(size_t)d] = 1;
    for (int t = 0; t < b.n_tokens; t++) {
        std::vector<unsigned char> row(
            got.begin() + (long)((size_t)t * r.ld_out * kvf_dtype_size(adt)),
            got.begin() + (long)((size_t)(t + 1) * r.ld_out * kvf_dtype_size(adt)));
        compare_rows(c, is_dec[(size_t)t] ? "decode out" : "prefill out", row, adt, 1, r.q_dim,
                     r.ld_out, want.data() + (size_t)t * r.q_dim, r.q_dim,
                     is_dec[(size_t)t] ? 2e-5 : tc_rel);
    }
}

// The CPU backend on the other pool: kv_write, then attention. got (the
// output rows, then the pool) must hold the same pool bit for bit and the
// same outputs within the kernels' tolerance.
void compare_with_cpu(check &c, kv_batch &b, const attention_plan &p, const attention_rows &r,
                      const std::vector<float> &qkv, std::vector<unsigned char> got,
                      kvf_dtype_t adt, bool tc)
{
    const float *q = qkv.data(), *k = q + r.q_dim, *v = k + r.kv_dim;
    auto ptrs = b.table_ptrs();
    kvf_batch_layout_t lay = b.layout(ptrs);
    g_cpu.ops->kv_write(g_cpu.ctx, b.cpu_pool, b.layer, k, v, r.ld_qkv, &lay);
    std::vector<float> want((size_t)b.n_tokens * r.q_dim);
    kvf_status_t s = g_cpu.ops->attention(g_cpu.ctx, want.data(), q, r.ld_qkv, b.cpu_pool, b.layer,
                                          b.g.n_heads, &lay);
    if (s != KVF_OK)
        c.fail("the CPU backend's attention returned %s", kvf_status_str(s));
    const size_t out_bytes = (size_t)b.n_tokens * r.ld_out * kvf_dtype_size(adt);
    std::vector<unsigned char> pool(got.begin() + (long)out_bytes, got.end());
    got.resize(out_bytes);
    compare_pools(c, b, pool, 0);
    if (!tc)
        compare_rows(c, "out", got, adt, b.n_tokens, r.q_dim, r.ld_out, want.data(), r.q_dim, 2e-5);
    else
        compare_tc_rows(c, b, p, r, got, want, adt);
}

// A mixed batch as the engine builds one (plan_attention). K/V of the
// batch is written into both pools first, then both attentions read their
// pool.
// A pool of format dt (not f32) for the emulated kernels: K/V written by
// qkv_rope_write in dt, then the attentions decoding it. The reference is
// the CPU backend's attention over that pool decoded to f32 (exact), with
// the kernels' tolerances; for int8 on CUDA cores, which score from the
// integers as the CPU backend does on an int8 pool (kvf/kv_format.h), the
// CPU backend's attention over the int8 pool itself.
void compare_format_with_cpu(check &c, kv_batch &b, const attention_plan &p,
                             const attention_rows &r, const std::vector<float> &qkv,
                             std::vector<unsigned char> got, kvf_dtype_t adt, bool tc)
{
    const size_t out_bytes = (size_t)b.n_tokens * r.ld_out * kvf_dtype_size(adt);
    b.reset_emu_pool(std::vector<unsigned char>(got.begin() + (long)out_bytes, got.end()));
    got.resize(out_bytes);
    const bool own = b.geo.dtype == KVF_KV_INT8 && !tc;
    if (!own)
        decode_pool(b.emu_pool, b.cpu_pool);
    auto ptrs = b.table_ptrs();
    kvf_batch_layout_t lay = b.layout(ptrs);
    std::vector<float> want((size_t)b.n_tokens * r.q_dim);
    kvf_status_t s =
        g_cpu.ops->attention(g_cpu.ctx, want.data(), qkv.data(), r.ld_qkv,
                             own ? b.emu_pool : b.cpu_pool, b.layer, b.g.n_heads, &lay);
    if (s != KVF_OK)
        c.fail("the CPU backend's attention returned %s", kvf_status_str(s));
    if (!tc)
        compare_rows(c, "out", got, adt, b.n_tokens, r.q_dim, r.ld_out, want.data(), r.q_dim, 2e-5);
    else
        compare_tc_rows(c, b, p, r, got, want, adt);
}

void attention_case(geometry g, std::vector<seq_spec> specs, kvf_dtype_t adt, int split_keys,
                    int extra_splits, prefill_kernel pk = prefill_kernel::cores, int window = 0,
                    float softcap = 0, kvf_kv_dtype_t kv_dt = KVF_KV_F32)
{
    kv_batch b(g, std::move(specs));
    b.window = window;
    b.softcap = softcap;
    b.scale = softcap > 0 ? 0.4f : 0; // Gemma2: a scale of its own with the cap
    const int hd = g.head_dim, q_dim = g.n_heads * hd, kv_dim = g.n_kv_heads * hd;
    const attention_rows r = {hd, q_dim, kv_dim, q_dim + 2 * kv_dim + 8, q_dim + 4};
    const attention_plan p = plan_attention(b, split_keys, extra_splits);
    const bool tc = pk == prefill_kernel::tensor_cores;
    check c(fmt("attention %s %s, %s KV: %zu tiles%s, %zu decode x %d splits of %d, window %d, "
                "cap %g",
                b.describe().c_str(), kvf_dtype_name(adt), kvf_kv_dtype_name(kv_dt),
                p.tiles.size() / 2, tc ? " on tensor cores" : "", p.dec.size(), p.n_splits,
                p.split_keys, window, (double)softcap));
    kvf_kvpool_t *f32_pool = b.emu_pool;
    if (kv_dt != KVF_KV_F32) {
        b.emu_pool = random_format_pool(b, kv_dt);
        b.geo.dtype = kv_dt;
    }
    std::vector<float> qkv = random_floats((size_t)b.n_tokens * r.ld_qkv);
    for (int t = 0; t < b.n_tokens; t++) // sharper softmax than uniform q
        for (int j = 0; j < q_dim; j++)
            qkv[(size_t)t * r.ld_qkv + j] *= 3.0f;
    // K/V go into the pool through qkv_rope_write with a rotation by 0 (cos
    // 1, sin 0: x * 1 - y * 0 is x exactly, FMA or not), so the pool holds
    // the k and v rows as the CPU backend's kv_write stores them and q keeps
    // its bits.
    std::vector<float> identity((size_t)b.n_tokens * hd, 0.0f);
    for (int t = 0; t < b.n_tokens; t++)
        std::fill_n(identity.begin() + (long)t * hd, hd / 2, 1.0f);

    const auto start = b.emu_pool_bytes();
    auto got =
        both_orders(c, [&] { return run_emulated(c, b, p, r, qkv, identity, adt, tc, start); });
    if (kv_dt == KVF_KV_F32) {
        compare_with_cpu(c, b, p, r, qkv, std::move(got), adt, tc);
        return;
    }
    compare_format_with_cpu(c, b, p, r, qkv, std::move(got), adt, tc);
    kvf_kvpool_destroy(b.emu_pool);
    b.emu_pool = f32_pool;
    b.geo.dtype = KVF_KV_F32;
}

// ---- the launchers' shape checks ---------------------------------------------------

// A one-token batch the checks accept, over small buffers; the cases change
// one field of ok at a time.
struct shape_rig {
    float pool[64] = {0}, q[64] = {0}, ws[64];
    unsigned char out[256];
    int32_t pos[1] = {0}, seq[1] = {0}, bt[1] = {0}, tiles[2] = {0, 1}, toks[1] = {0};
    kvf_cuda_attn_t ok{};
    kvf_cuda_prefill_tiles_t pt = {tiles, 1, 0};
    kvf_cuda_decode_plan_t dp = {toks, 1, 1, 1, ws};

    shape_rig()
    {
        ok.kv_layer = pool;
        ok.block_stride = 2 * 16 * 4; // bytes of f32
        ok.n_pool_blocks = 1;
        ok.n_heads = ok.n_kv_heads = 1;
        ok.head_dim = 16;
        ok.block_size = 1;
        ok.scale = 0.25f;
        ok.q = q;
        ok.ld_q = 16;
        ok.out = out;
        ok.ld_out = 16;
        ok.adt = KVF_DTYPE_F32;
        ok.n_tokens = 1;
        ok.pos = pos;
        ok.seq = seq;
        ok.block_tables = bt;
        ok.bt_stride = 1;
        ok.n_seqs = 1;
    }
    shape_rig(const shape_rig &) = delete;
    shape_rig &operator=(const shape_rig &) = delete;
};

// Geometries neither prefill nor decode takes.
void refuse_bad_geometry(check &c, shape_rig &r)
{
    auto both = [&](const char *what, kvf_status_t want, kvf_cuda_attn_t a) {
        refused(c, what, want, [&] { return kvf_cuda_attention_prefill(nullptr, &a, &r.pt); });
        refused(c, what, want, [&] { return kvf_cuda_attention_decode(nullptr, &a, &r.dp); });
    };
    kvf_cuda_attn_t a = r.ok;
    a.head_dim = 12;
    a.ld_q = a.ld_out = 12;
    both("head_dim 12", KVF_ERR_UNSUPPORTED, a);
    a = r.ok;
    a.n_heads = 33;
    a.ld_q = a.ld_out = 33 * 16;
    both("group 33", KVF_ERR_UNSUPPORTED, a);
    a = r.ok;
    a.q = nullptr;
    both("no q", KVF_ERR_INVAL, a);
    a = r.ok;
    a.block_stride = 8;
    both("block stride below a slice", KVF_ERR_INVAL, a);
    a = r.ok;
    a.kv_dtype = KVF_KV_INT8;
    a.block_stride = 2 * (16 + 4) - 1; // int8 rows and their scales need 40 bytes
    both("block stride below an int8 slice", KVF_ERR_INVAL, a);
    a = r.ok;
    a.kv_dtype = (kvf_kv_dtype_t)KVF_KV_N_DTYPES;
    both("unknown KV format", KVF_ERR_INVAL, a);
    a = r.ok;
    a.adt = KVF_DTYPE_UNKNOWN;
    both("unknown dtype", KVF_ERR_INVAL, a);
}

// Tiles and decode plans the batch's tables or buffers cannot take.
void refuse_bad_plans(check &c, shape_rig &r)
{
    kvf_cuda_prefill_tiles_t far = {r.tiles, 1, 5}; // position 5 past a 1-block table
    refused(c, "tile past the table", KVF_ERR_INVAL,
            [&] { return kvf_cuda_attention_prefill(nullptr, &r.ok, &far); });
    kvf_cuda_attn_t a2 = r.ok;
    a2.block_size = 2;
    a2.block_stride = 2 * 2 * 16 * 4;
    kvf_cuda_decode_plan_t odd = {r.toks, 1, 1, 3, r.ws}; // 3 keys: not a multiple of 2
    refused(c, "split not a multiple of the block", KVF_ERR_INVAL,
            [&] { return kvf_cuda_attention_decode(nullptr, &a2, &odd); });
    kvf_cuda_decode_plan_t wide = {r.toks, 1, 1, 8192, r.ws}; // past the score buffer
    refused(c, "split past the score buffer", KVF_ERR_INVAL,
            [&] { return kvf_cuda_attention_decode(nullptr, &r.ok, &wide); });
}

// Tensor cores: 16-bit activations and head dims of 16 k up to 128 only.
void refuse_tensor_core_shapes(check &c, shape_rig &r)
{
    refused(c, "tensor cores, f32", KVF_ERR_UNSUPPORTED,
            [&] { return kvf_cuda_attention_prefill_tc(nullptr, &r.ok, &r.pt); });
    kvf_cuda_attn_t a;
    for (int hd : {24, 136}) {
        a = r.ok;
        a.adt = KVF_DTYPE_BF16;
        a.head_dim = hd;
        a.ld_q = a.ld_out = hd;
        a.block_stride = 2 * hd * 4;
        refused(c, "tensor cores, head dim not 16 k up to 128", KVF_ERR_UNSUPPORTED,
                [&] { return kvf_cuda_attention_prefill_tc(nullptr, &a, &r.pt); });
    }
    a = r.ok;
    a.head_dim = 12;
    a.ld_q = a.ld_out = 12;
    refused(c, "tensor cores, head_dim 12", KVF_ERR_UNSUPPORTED,
            [&] { return kvf_cuda_attention_prefill_tc(nullptr, &a, &r.pt); });
}

void empty_batches(check &c, shape_rig &r)
{
    kvf_cuda_prefill_tiles_t none = {r.tiles, 0, 0};
    empty_ok(c, "attention_prefill",
             [&] { return kvf_cuda_attention_prefill(nullptr, &r.ok, &none); });
    kvf_cuda_attn_t ok16 = r.ok;
    ok16.adt = KVF_DTYPE_F16;
    empty_ok(c, "attention_prefill_tc",
             [&] { return kvf_cuda_attention_prefill_tc(nullptr, &ok16, &none); });
    kvf_cuda_decode_plan_t nodec = {r.toks, 0, 1, 1, r.ws};
    empty_ok(c, "attention_decode",
             [&] { return kvf_cuda_attention_decode(nullptr, &r.ok, &nodec); });
}

// A shape the checks pass but the device cannot launch: 70000 kv heads
// make grid.y too large. The launch is refused before any thread runs (so
// the small buffers are never read) and the launcher reports it.
void launch_refusal_surfaces(check &c, shape_rig &r)
{
    kvf_cuda_attn_t a = r.ok;
    a.n_heads = a.n_kv_heads = 70000;
    a.ld_q = a.ld_out = 70000 * 16;
    a.block_stride = 2LL * 70000 * 16 * 4;
    unsigned long long ctas = kvf_emu::get_stats().ctas;
    printf("      (2 refused launches expected below)\n");
    kvf_log_set_level(KVF_LOG_OFF);
    kvf_status_t s1 = kvf_cuda_attention_prefill(nullptr, &a, &r.pt);
    kvf_status_t s2 = kvf_cuda_attention_decode(nullptr, &a, &r.dp);
    kvf_log_set_level(KVF_LOG_ERROR);
    if (s1 != KVF_ERR_INVAL || s2 != KVF_ERR_INVAL)
        c.fail("a refused launch returned %s and %s, want %s", kvf_status_str(s1),
               kvf_status_str(s2), kvf_status_str(KVF_ERR_INVAL));
    if (kvf_emu::get_stats().ctas != ctas)
        c.fail("a refused launch ran CTAs");
    if (cudaGetLastError() != cudaSuccess)
        c.fail("the launcher left the launch error behind");
}

} // namespace

void test_attention_shapes()
{
    check c("attention: bad shapes refused, empty batches launch nothing, launch errors surface");
    shape_rig r;
    refuse_bad_geometry(c, r);
    refuse_bad_plans(c, r);
    refuse_tensor_core_shapes(c, r);
    empty_batches(c, r);
    launch_refusal_surfaces(c, r);
}

void test_attention_vs_cpu()
{
    // Every KV format: prefill (CUDA cores, f32 activations, and tensor
    // cores in bf16 and f16, which copy a pool of their own 16-bit format)
    // and decode, with several splits, GQA and a head dim the decode CTA's
    // threads do not divide.
    const prefill_kernel tcores = prefill_kernel::tensor_cores;
    for (kvf_kv_dtype_t kdt : k_kv_formats) {
        attention_case({4, 2, 16, 16}, {{0, 20}, {37, 9}, {5, 1}, {60, 1}}, KVF_DTYPE_F32, 16, 1,
                       prefill_kernel::cores, 0, 0, kdt);
        attention_case({8, 2, 64, 16}, {{0, 30}, {100, 17}, {150, 1}}, KVF_DTYPE_BF16, 0, 0,
                       tcores, 0, 0, kdt);
        attention_case({4, 2, 16, 16}, {{0, 20}, {37, 9}, {5, 1}}, KVF_DTYPE_F16, 0, 0, tcores,
                       0, 0, kdt);
        attention_case({4, 2, 96, 16}, {{0, 5}, {200, 1}, {33, 1}}, KVF_DTYPE_F32, 32, 2,
                       prefill_kernel::cores, 0, 0, kdt);
    }

    // The golden models' head_dim 16: fresh and chunked prefill, decode.
    for (kvf_dtype_t adt : k_adts)
        attention_case({4, 2, 16, 16}, {{0, 20}, {37, 9}, {5, 1}, {60, 1}}, adt, 0, 0);
    // Llama 1B's head_dim 64 with group 4; long prefill over several tiles.
    attention_case({8, 2, 64, 16}, {{0, 30}, {100, 17}, {150, 1}, {20, 1}}, KVF_DTYPE_BF16, 0, 0);
    attention_case({8, 2, 64, 16}, {{150, 1}, {20, 1}, {7, 1}}, KVF_DTYPE_F32, 32, 2);
    // head_dim 128, group 1.
    attention_case({4, 4, 128, 16}, {{40, 30}, {130, 1}}, KVF_DTYPE_F32, 64, 1);
    attention_case({4, 4, 128, 16}, {{0, 6}, {77, 1}}, KVF_DTYPE_F16, 0, 0);
    // head_dim 96 and 80 do not divide the decode CTA's 128 threads: threads
    // past the columns must stay out of the store (the n_kg == 1 race).
    for (kvf_dtype_t adt : k_adts)
        attention_case({4, 2, 96, 16}, {{0, 5}, {200, 1}, {33, 1}}, adt, 32, 2);
    attention_case({4, 1, 80, 16}, {{0, 12}, {50, 1}, {7, 1}}, KVF_DTYPE_F16, 16, 1);
    attention_case({6, 3, 80, 16}, {{20, 8}, {90, 1}}, KVF_DTYPE_F32, 0, 0);
    // Block sizes 1 and 256.
    attention_case({4, 2, 16, 1}, {{0, 9}, {20, 1}, {3, 1}}, KVF_DTYPE_F32, 8, 1);
    attention_case({4, 2, 64, 256}, {{0, 40}, {280, 1}, {600, 2}}, KVF_DTYPE_BF16, 256, 1);
    // Group 16 (a GCAP of its own) and 32, the largest.
    attention_case({16, 1, 32, 16}, {{0, 5}, {70, 1}}, KVF_DTYPE_F32, 0, 0);
    attention_case({32, 1, 16, 8}, {{10, 4}, {45, 1}}, KVF_DTYPE_F32, 0, 1);

    // Prefill on tensor cores, as the backend runs bf16/f16 head dims of
    // 16 k: over a chunk of 64 keys, several chunks, chunked prefill, the
    // head dims above, masked rows of a partial tile.
    const prefill_kernel tc = prefill_kernel::tensor_cores;
    attention_case({4, 2, 16, 16}, {{0, 20}, {37, 9}, {5, 1}}, KVF_DTYPE_BF16, 0, 0, tc);
    attention_case({4, 2, 16, 16}, {{0, 20}, {37, 9}, {5, 1}}, KVF_DTYPE_F16, 0, 0, tc);
    attention_case({8, 2, 64, 16}, {{0, 30}, {100, 17}, {150, 1}}, KVF_DTYPE_BF16, 0, 0, tc);
    attention_case({4, 4, 128, 16}, {{40, 30}, {130, 1}}, KVF_DTYPE_F16, 64, 1, tc);
    attention_case({4, 2, 96, 1}, {{0, 5}, {70, 1}}, KVF_DTYPE_F16, 32, 1, tc);
    attention_case({4, 1, 80, 256}, {{0, 12}, {250, 9}}, KVF_DTYPE_BF16, 0, 0, tc);
    attention_case({32, 1, 16, 16}, {{10, 4}, {45, 1}}, KVF_DTYPE_F16, 0, 0, tc);

    // Sliding windows: 16 (a block), 5 (inside one prefill chunk) and 40
    // (across decode splits and prefill chunks), on both prefill kernels
    // and decode; chunked prefill past the window, a window larger than
    // the context.
    const prefill_kernel cores = prefill_kernel::cores;
    for (kvf_dtype_t adt : k_adts)
        attention_case({4, 2, 16, 16}, {{0, 40}, {37, 9}, {5, 1}, {60, 1}}, adt, 0, 0, cores, 16);
    attention_case({4, 2, 16, 16}, {{0, 20}, {70, 30}, {90, 1}}, KVF_DTYPE_F32, 16, 2, cores, 5);
    attention_case({8, 2, 64, 16}, {{0, 90}, {150, 1}, {20, 1}}, KVF_DTYPE_F32, 32, 1, cores, 40);
    attention_case({4, 2, 24, 16}, {{0, 30}, {33, 1}}, KVF_DTYPE_F32, 0, 0, cores, 500);
    attention_case({4, 2, 16, 16}, {{0, 40}, {37, 9}, {5, 1}}, KVF_DTYPE_BF16, 0, 0, tc, 16);
    attention_case({8, 2, 64, 16}, {{0, 90}, {100, 17}}, KVF_DTYPE_F16, 0, 0, tc, 40);

    // Gemma2: scores scaled by 0.4 and soft-capped at 2 (well inside the
    // scores' range, so the cap bites), with and without a window, on both
    // prefill kernels and decode.
    for (kvf_dtype_t adt : k_adts)
        attention_case({4, 2, 16, 16}, {{0, 40}, {37, 9}, {5, 1}, {60, 1}}, adt, 0, 0, cores, 16,
                       2.0f);
    attention_case({8, 2, 64, 16}, {{0, 30}, {100, 17}, {150, 1}}, KVF_DTYPE_F32, 32, 1, cores, 0,
                   2.0f);
    attention_case({4, 2, 16, 16}, {{0, 40}, {37, 9}, {5, 1}}, KVF_DTYPE_BF16, 0, 0, tc, 16, 2.0f);
    attention_case({8, 2, 64, 16}, {{0, 30}, {100, 17}}, KVF_DTYPE_F16, 0, 0, tc, 0, 2.0f);
}

} // namespace kvf_emu_test
