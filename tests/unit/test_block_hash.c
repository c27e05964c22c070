/* Block hashes (common/block_hash.c): SipHash-2-4 against the paper's
 * vectors, the root and block encodings byte for byte, and the chain's
 * properties (what a change of root or token does to which hashes). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kvf/prefix_cache.h"

#include <stdint.h>
#include <string.h>

#define BS 4 /* tokens per block in the chain tests */

/* The paper's key: bytes 00..0f. */
static const kvf_block_hash_key_t paper_key = {0x0706050403020100ull, 0x0f0e0d0c0b0a0908ull};
/* A cluster's key. */
static const kvf_block_hash_key_t test_key = {0x243f6a8885a308d3ull, 0x13198a2e03707344ull};

/* ---- hashes --------------------------------------------------------- */

static void test_siphash_vectors(void **state)
{
    (void)state;
    /* SipHash-2-4, 64-bit output, key 00..0f, message 00..(n-1): the
     * paper's appendix and its reference vectors. */
    static const struct {
        size_t n;
        uint64_t want;
    } vectors[] = {
        {0, 0x726fdb47dd0e0e31ull},  {1, 0x74f839c593dc67fdull},  {2, 0x0d6c8009d9a94f5aull},
        {3, 0x85676696d7fb7e2dull},  {4, 0xcf2794e0277187b7ull},  {5, 0x18765564cd99a68dull},
        {6, 0xcbc9466e58fee3ceull},  {7, 0xab0200f58b01d137ull},  {8, 0x93f5f5799a932462ull},
        {15, 0xa129ca6149be45e5ull}, {16, 0x3f2acc7f57c29bdbull}, {63, 0x958a324ceb064572ull},
    };
    uint8_t msg[64];
    for (int i = 0; i < 64; i++)
        msg[i] = (uint8_t)i;
    for (size_t i = 0; i < sizeof(vectors) / sizeof(vectors[0]); i++) {
        uint64_t got = kvf_siphash24(&paper_key, msg, vectors[i].n);
        if (got != vectors[i].want)
            fail_msg("siphash24 of %zu bytes: %016llx, want %016llx", vectors[i].n,
                     (unsigned long long)got, (unsigned long long)vectors[i].want);
    }
}

static size_t put_le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
    return (size_t)bytes;
}

/* The root and block hashes are SipHash-2-4 of the encodings documented in
 * common/block_hash.c, built here byte by byte. An odd block size covers
 * the last token alone. */
static void test_hash_encoding(void **state)
{
    (void)state;
    uint8_t msg[8 + 8 + 4 + 8 + 16 + 5 * 4];
    const char salt[] = "tenant-7";
    size_t n = put_le(msg, 0x746f6f722d66766bull, 8); /* "kvf-root" */
    n += put_le(msg + n, 0x1122334455667788ull, 8);
    n += put_le(msg + n, KVF_KV_BF16, 4);
    n += put_le(msg + n, 5, 4);
    n += put_le(msg + n, 8, 8);
    memcpy(msg + n, salt, 8);
    n += 8;
    uint64_t root = kvf_siphash24(&test_key, msg, n);
    assert_true(kvf_block_hash_root(&test_key, 0x1122334455667788ull, KVF_KV_BF16, 5, salt, 8) ==
                root);

    const uint32_t tokens[5] = {7, 0x10000, 0xffffffffu, 3, 151643};
    n = put_le(msg, 0x6b636f6c622d766bull, 8); /* "kv-block" */
    n += put_le(msg + n, root, 8);
    n += put_le(msg + n, 5, 4);
    for (int i = 0; i < 5; i++)
        n += put_le(msg + n, tokens[i], 4);
    assert_true(kvf_block_hash_next(&test_key, root, tokens, 5) ==
                kvf_siphash24(&test_key, msg, n));
}

/* Every hash of a differs from every hash of b (n each), and from b's root. */
static void assert_all_differ(const uint64_t *a, const uint64_t *b, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < n; j++)
            assert_true(a[i] != b[j]);
}

static void test_chain_properties(void **state)
{
    (void)state;
    enum { N = 6 };
    uint32_t tokens[N * BS + 3]; /* a partial block at the end is not hashed */
    for (uint32_t i = 0; i < N * BS + 3; i++)
        tokens[i] = i * 7 + 1;
    const uint64_t fp = 0x5eed;
    uint64_t root = kvf_block_hash_root(&test_key, fp, KVF_KV_F32, BS, "a", 1);
    uint64_t h[N], h2[N], other[N];
    assert_int_equal(kvf_block_hash_chain(&test_key, root, tokens, N * BS + 3, BS, h), N);
    assert_int_equal(kvf_block_hash_chain(&test_key, root, tokens, N * BS, BS, h2), N);
    assert_memory_equal(h, h2, sizeof(h));
    for (int i = 0; i < N; i++)
        assert_true(h[i] != root);

    /* Another salt, fingerprint, format, block size, key: every hash differs. */
    uint64_t roots[] = {
        kvf_block_hash_root(&test_key, fp, KVF_KV_F32, BS, "b", 1),
        kvf_block_hash_root(&test_key, fp, KVF_KV_F32, BS, NULL, 0),
        kvf_block_hash_root(&test_key, fp + 1, KVF_KV_F32, BS, "a", 1),
        kvf_block_hash_root(&test_key, fp, KVF_KV_INT8, BS, "a", 1),
        kvf_block_hash_root(&test_key, fp, KVF_KV_F32, BS * 2, "a", 1),
        kvf_block_hash_root(&paper_key, fp, KVF_KV_F32, BS, "a", 1),
    };
    for (size_t r = 0; r < sizeof(roots) / sizeof(roots[0]); r++) {
        assert_true(roots[r] != root);
        const kvf_block_hash_key_t *key = r == 5 ? &paper_key : &test_key;
        kvf_block_hash_chain(key, roots[r], tokens, N * BS, BS, other);
        assert_all_differ(h, other, N);
    }
    /* A different block size cuts other blocks: no hash in common either. */
    uint64_t h8[N / 2];
    uint64_t root8 = kvf_block_hash_root(&test_key, fp, KVF_KV_F32, BS * 2, "a", 1);
    assert_int_equal(kvf_block_hash_chain(&test_key, root8, tokens, N * BS, BS * 2, h8), N / 2);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N / 2; j++)
            assert_true(h[i] != h8[j]);

    /* One token changed in block 3: blocks 0..2 keep their hashes, 3.. change. */
    for (uint32_t pos = 3 * BS; pos < 4 * BS; pos++) {
        uint32_t changed[N * BS];
        memcpy(changed, tokens, sizeof(changed));
        changed[pos] ^= 1;
        kvf_block_hash_chain(&test_key, root, changed, N * BS, BS, other);
        for (int i = 0; i < 3; i++)
            assert_true(other[i] == h[i]);
        for (int i = 3; i < N; i++)
            assert_true(other[i] != h[i]);
    }
    assert_int_equal(kvf_block_hash_chain(&test_key, root, tokens, BS - 1, BS, other), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_siphash_vectors),
        cmocka_unit_test(test_hash_encoding),
        cmocka_unit_test(test_chain_properties),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
