/* Content hashes of KV blocks: SipHash-2-4 and the block chain over it.
 * See kvf/prefix_cache.h; design: docs/prefix-cache.md.
 *
 * SipHash-2-4 (Aumasson and Bernstein, "SipHash: a fast short-input PRF",
 * 2012) is written here from the algorithm's description: four 64-bit
 * words of state initialised from the 128-bit key, the message absorbed
 * as little-endian 64-bit words with two rounds each, the last word
 * carrying the message length mod 256 in its top byte, then four
 * finalisation rounds. It is an incremental hasher (init, absorb, final)
 * so the chain encodes its fields without building a message buffer.
 *
 * Byte encodings (every integer little-endian, whatever the host):
 *
 *   root:  u64 tag 0x746f6f722d66766b ("kvf-root" as bytes)
 *          u64 model fingerprint
 *          u32 KV format (kvf_kv_dtype_t)
 *          u32 block size in tokens
 *          u64 salt length in bytes
 *          the salt's bytes
 *
 *   block: u64 tag 0x6b636f6c622d766b ("kv-block" as bytes)
 *          u64 parent hash (the root for a sequence's first block)
 *          u32 block size in tokens
 *          block size x u32 token ids, in position order
 *
 * The two tags differ in the first eight bytes, so the message of a root
 * is never the message of a block, whatever the fields: a root equals a
 * block's hash only by a collision of the PRF itself (2^-64), not by
 * some choice of tokens. The salt's length comes before its bytes, so no
 * two (salt, rest) splits encode alike. */
#include "kvf/prefix_cache.h"

#include <string.h>

#define ROOT_TAG  0x746f6f722d66766bull /* "kvf-root" */
#define BLOCK_TAG 0x6b636f6c622d766bull /* "kv-block" */
#define KEY_ID_TAG 0x6469656b2d66766bull /* "kvf-keid": a key's public name */

typedef struct {
    uint64_t v0, v1, v2, v3;
    uint8_t tail[8]; /* bytes not yet forming a whole word */
    size_t n_tail;
    uint64_t len; /* bytes absorbed so far */
} sip_state_t;

static inline uint64_t rotl64(uint64_t x, int b)
{
    return (x << b) | (x >> (64 - b));
}

static inline uint64_t load_le64(const uint8_t *p)
{
    uint64_t w = 0;
    for (int i = 7; i >= 0; i--)
        w = (w << 8) | p[i];
    return w;
}

static inline void sip_round(sip_state_t *s)
{
    s->v0 += s->v1;
    s->v1 = rotl64(s->v1, 13);
    s->v1 ^= s->v0;
    s->v0 = rotl64(s->v0, 32);
    s->v2 += s->v3;
    s->v3 = rotl64(s->v3, 16);
    s->v3 ^= s->v2;
    s->v0 += s->v3;
    s->v3 = rotl64(s->v3, 21);
    s->v3 ^= s->v0;
    s->v2 += s->v1;
    s->v1 = rotl64(s->v1, 17);
    s->v1 ^= s->v2;
    s->v2 = rotl64(s->v2, 32);
}

/* One message word: two compression rounds. */
static inline void sip_word(sip_state_t *s, uint64_t m)
{
    s->v3 ^= m;
    sip_round(s);
    sip_round(s);
    s->v0 ^= m;
}

static void sip_init(sip_state_t *s, const kvf_block_hash_key_t *key)
{
    /* The constants are "somepseudorandomlygeneratedbytes" as four words. */
    s->v0 = key->k0 ^ 0x736f6d6570736575ull;
    s->v1 = key->k1 ^ 0x646f72616e646f6dull;
    s->v2 = key->k0 ^ 0x6c7967656e657261ull;
    s->v3 = key->k1 ^ 0x7465646279746573ull;
    s->n_tail = 0;
    s->len = 0;
}

static void sip_absorb(sip_state_t *s, const void *data, size_t len)
{
    const uint8_t *p = data;
    s->len += len;
    if (s->n_tail) {
        while (s->n_tail < 8 && len) {
            s->tail[s->n_tail++] = *p++;
            len--;
        }
        if (s->n_tail < 8)
            return;
        sip_word(s, load_le64(s->tail));
        s->n_tail = 0;
    }
    for (; len >= 8; p += 8, len -= 8)
        sip_word(s, load_le64(p));
    memcpy(s->tail, p, len);
    s->n_tail = len;
}

static uint64_t sip_final(sip_state_t *s)
{
    uint64_t last = (s->len & 0xff) << 56;
    for (size_t i = 0; i < s->n_tail; i++)
        last |= (uint64_t)s->tail[i] << (8 * i);
    sip_word(s, last);
    s->v2 ^= 0xff;
    for (int i = 0; i < 4; i++)
        sip_round(s);
    return s->v0 ^ s->v1 ^ s->v2 ^ s->v3;
}

static void absorb_u64(sip_state_t *s, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    sip_absorb(s, b, sizeof(b));
}

static void absorb_u32(sip_state_t *s, uint32_t v)
{
    uint8_t b[4];
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    sip_absorb(s, b, sizeof(b));
}

uint64_t kvf_siphash24(const kvf_block_hash_key_t *key, const void *data, size_t len)
{
    sip_state_t s;
    sip_init(&s, key);
    sip_absorb(&s, data, len);
    return sip_final(&s);
}

uint64_t kvf_block_hash_key_id(const kvf_block_hash_key_t *key)
{
    sip_state_t s;
    sip_init(&s, key);
    absorb_u64(&s, KEY_ID_TAG);
    return sip_final(&s);
}

uint64_t kvf_block_hash_root(const kvf_block_hash_key_t *key, uint64_t model_fp, int kv_dtype,
                             uint32_t block_size, const void *salt, size_t salt_len)
{
    sip_state_t s;
    sip_init(&s, key);
    absorb_u64(&s, ROOT_TAG);
    absorb_u64(&s, model_fp);
    absorb_u32(&s, (uint32_t)kv_dtype);
    absorb_u32(&s, block_size);
    absorb_u64(&s, (uint64_t)salt_len);
    if (salt_len)
        sip_absorb(&s, salt, salt_len);
    return sip_final(&s);
}

uint64_t kvf_block_hash_next(const kvf_block_hash_key_t *key, uint64_t parent,
                             const uint32_t *tokens, uint32_t block_size)
{
    sip_state_t s;
    sip_init(&s, key);
    absorb_u64(&s, BLOCK_TAG);
    absorb_u64(&s, parent);
    absorb_u32(&s, block_size);
    /* Token ids two at a time as one word: the same bytes as absorbing
     * each little-endian u32 in turn, in fewer calls. */
    uint32_t i = 0;
    for (; i + 2 <= block_size; i += 2)
        absorb_u64(&s, (uint64_t)tokens[i] | (uint64_t)tokens[i + 1] << 32);
    if (i < block_size)
        absorb_u32(&s, tokens[i]);
    return sip_final(&s);
}

uint32_t kvf_block_hash_chain(const kvf_block_hash_key_t *key, uint64_t root,
                              const uint32_t *tokens, uint32_t n_tokens, uint32_t block_size,
                              uint64_t *hashes_p)
{
    if (block_size == 0)
        return 0;
    uint32_t n_blocks = n_tokens / block_size;
    uint64_t h = root;
    for (uint32_t b = 0; b < n_blocks; b++) {
        h = kvf_block_hash_next(key, h, tokens + (size_t)b * block_size, block_size);
        hashes_p[b] = h;
    }
    return n_blocks;
}
