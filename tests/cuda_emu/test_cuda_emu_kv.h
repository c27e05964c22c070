// Paged-KV batches for test_cuda_emu's KV and attention cases: a batch of
// sequences over two identical pools, one for the CPU backend and one for
// the emulated kernels (test_cuda_emu_kv.cc).
#ifndef KVF_TEST_CUDA_EMU_KV_H
#define KVF_TEST_CUDA_EMU_KV_H

#include "kvf/kvcache.h"
#include "test_cuda_emu.h"

namespace kvf_emu_test
{

struct geometry {
    int n_heads, n_kv_heads, head_dim, block_size;
};

struct seq_spec {
    int start_pos, n_tokens; // tokens start_pos .. start_pos + n_tokens - 1 in this batch
};

// A batch over two identical pools: the CPU backend works on one, the
// emulated kernels on the other.
struct kv_batch {
    geometry g;
    kvf_kv_geometry_t geo;
    int layer = 1; // of 2: a nonzero layer offset
    uint32_t n_blocks = 0;
    kvf_kvpool_t *cpu_pool = nullptr, *emu_pool = nullptr;
    std::vector<seq_spec> seqs;
    std::vector<std::vector<uint32_t>> tables; // per sequence, block ids in position order
    int bt_stride = 0;
    std::vector<int32_t> bt;                  // (n_seqs, bt_stride), what the kernels read
    std::vector<int32_t> pos, seq, tok_block; // per token
    int n_tokens = 0;
    int window = 0; // the attention's sliding window (0: none)
    float scale = 0;   // the scores' scale (0: 1 / sqrt(head_dim))
    float softcap = 0; // Gemma2's soft-cap of the scores (0: none)

    // Pools of random K/V (the same in both), shuffled block tables.
    kv_batch(geometry geom, std::vector<seq_spec> specs);
    ~kv_batch();
    kv_batch(const kv_batch &) = delete;
    kv_batch &operator=(const kv_batch &) = delete;

    std::vector<const uint32_t *> table_ptrs() const
    {
        std::vector<const uint32_t *> p;
        for (auto &t : tables)
            p.push_back(t.data());
        return p;
    }
    kvf_batch_layout_t layout(const std::vector<const uint32_t *> &ptrs) const
    {
        return kvf_batch_layout_t{n_tokens,    pos.data(), seq.data(), (int)seqs.size(),
                                  ptrs.data(), window,     scale,      softcap};
    }
    // Bytes from one block to the next, and to the case's layer.
    int64_t block_stride() const
    {
        return (int64_t)kvf_kv_block_bytes(&geo);
    }
    int64_t layer_off() const
    {
        return (int64_t)layer * (int64_t)kvf_kvpool_slice_bytes(emu_pool);
    }
    unsigned char *emu_base() const
    {
        return (unsigned char *)kvf_kvpool_base(emu_pool);
    }
    std::vector<unsigned char> emu_pool_bytes() const
    {
        const unsigned char *p = (const unsigned char *)kvf_kvpool_base(emu_pool);
        return std::vector<unsigned char>(p, p + kvf_kvpool_bytes(emu_pool));
    }
    void reset_emu_pool(const std::vector<unsigned char> &bytes) const
    {
        memcpy(kvf_kvpool_base(emu_pool), bytes.data(), bytes.size());
    }
    std::string describe() const;
};

// Pools compared as floats (rel 0: bit for bit).
void compare_pools(check &c, const kv_batch &b, const std::vector<unsigned char> &emu, double rel);

// A pool of format dt with b's geometry and block count, every row random
// values encoded by kvf_kv_encode_row.
kvf_kvpool_t *random_format_pool(const kv_batch &b, kvf_kv_dtype_t dt);

// The rows of pool src (any format) decoded into dst, an f32 pool of the
// same shape (kvf_kv_decode_row).
void decode_pool(const kvf_kvpool_t *src, kvf_kvpool_t *dst);

// Every row of pool src (f32) encoded into dst (format dt, same shape) at
// the slots tokens of b were written to; the other rows left as they are.
void encode_batch_rows(const kv_batch &b, const std::vector<unsigned char> &src_f32,
                       kvf_kvpool_t *dst);

// The KV formats past f32, for the cases that run each.
extern const kvf_kv_dtype_t k_kv_formats[4];

} // namespace kvf_emu_test

#endif
