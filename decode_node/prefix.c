/* The decode node's prefix cache (docs/prefix-cache.md): the full prompt
 * blocks prefill nodes shipped here stay in the pool once their request
 * sealed, so a later request with the same leading blocks finds them and
 * the prefill node ships only the rest (KvAllocReply.cached_blocks). A
 * local prefill (--prefill-local: a PrefillRequest naming this node, e.g.
 * the router's conditional disaggregation) starts from the cached prefix
 * too and lists the prompt's full blocks it computed: a prefill here
 * writes what a prefill node writes (on a host pool; a device pool lists
 * only shipped blocks, whose host copies are whole). When a request ends
 * well, every full block of its sequence is listed, generated tokens
 * included: on the CPU backend a decode step writes the bits a prefill of
 * the same tokens writes (test_engine checks it in every KV format), so
 * the next turn of a conversation finds its previous answer cached. */
#include "decode_internal.h"

#include "kvf/log.h"

#include <stdlib.h>
#include <string.h>

/* How many of spec's prefix blocks this node can trust: the hash chain it
 * computes itself from their tokens must equal the one sent (the same
 * key, the same model and format), and at least one prompt block must be
 * left to write (the transfer's last batch lands in it). */
static uint32_t trusted_prefix(kvf_decode_t *d, const dec_admit_spec_t *spec)
{
    if (spec->local || spec->n_prefix == 0 || !kvf_node_prefix_sync(&d->pc))
        return 0;
    const uint32_t bs = d->block_size, n_prompt_blocks = (spec->n_tokens + bs - 1) / bs;
    uint32_t n = spec->n_prefix;
    if ((uint64_t)n * bs > spec->n_tokens)
        return 0;
    n = n < n_prompt_blocks - 1 ? n : n_prompt_blocks - 1;
    uint64_t h = kvf_node_prefix_root(&d->pc, spec->cache_salt, spec->cache_salt_len);
    for (uint32_t i = 0; i < n; i++) {
        h = kvf_block_hash_next(&d->pc.key, h, spec->prefix_tokens + (size_t)i * bs, bs);
        if (h != spec->prefix_hashes[i]) {
            kvf_log_warn("request %llu: prefix block %u's hash is not this node's: ignored",
                         (unsigned long long)spec->req_id, i);
            return i;
        }
    }
    return n;
}

/* Keeps spec's first n prefix hashes and tokens on r, for listing once the
 * handoff sealed. Without memory r is simply not listed. */
static void keep_prefix(kvf_decode_t *d, dec_req_t *r, const dec_admit_spec_t *spec, uint32_t n)
{
    if (n == 0)
        return;
    r->prefix_hashes = malloc((size_t)n * sizeof(uint64_t));
    r->prefix_tokens = malloc((size_t)n * d->block_size * sizeof(uint32_t));
    if (!r->prefix_hashes || !r->prefix_tokens) {
        free(r->prefix_hashes);
        free(r->prefix_tokens);
        r->prefix_hashes = NULL;
        r->prefix_tokens = NULL;
        return;
    }
    memcpy(r->prefix_hashes, spec->prefix_hashes, (size_t)n * sizeof(uint64_t));
    memcpy(r->prefix_tokens, spec->prefix_tokens, (size_t)n * d->block_size * sizeof(uint32_t));
    r->n_prefix = n;
    r->key_gen = d->pc.key_gen;
}

/* A local prefill's own chain: the hashes of its prompt's full blocks
 * (kept on r for listing once computed) and how many leading ones it may
 * take from the cache: as on a prefill node, a hit ends on a block edge
 * and leaves PREFIX_MIN_TAIL tokens to compute (docs/prefix-cache.md). */
#define PREFIX_MIN_TAIL 32
static uint32_t local_prefix(kvf_decode_t *d, dec_req_t *r, const dec_admit_spec_t *spec)
{
    const uint32_t bs = d->block_size, n_full = spec->n_tokens / bs;
    if (n_full == 0 || !kvf_node_prefix_sync(&d->pc))
        return 0;
    r->prefix_hashes = malloc((size_t)n_full * sizeof(uint64_t));
    if (!r->prefix_hashes)
        return 0; /* without memory it just runs cold */
    uint64_t root = kvf_node_prefix_root(&d->pc, spec->cache_salt, spec->cache_salt_len);
    r->n_prefix = kvf_block_hash_chain(&d->pc.key, root, r->prompt, spec->n_tokens, bs,
                                       r->prefix_hashes);
    r->key_gen = d->pc.key_gen;
    uint32_t most = spec->n_tokens > PREFIX_MIN_TAIL ? (spec->n_tokens - PREFIX_MIN_TAIL) / bs : 0;
    return most < r->n_prefix ? most : r->n_prefix;
}

kvf_status_t dec_prefix_alloc(kvf_decode_t *d, dec_req_t *r, const dec_admit_spec_t *spec,
                              uint32_t n_blocks)
{
    if (!d->pc.cache)
        return dec_req_alloc_blocks(d, r, n_blocks);
    const uint32_t n_prefix = spec->local ? local_prefix(d, r, spec) : trusted_prefix(d, spec);
    const uint64_t *hashes = spec->local ? r->prefix_hashes : spec->prefix_hashes;
    const uint32_t *tokens = spec->local ? r->prompt : spec->prefix_tokens;
    r->blocks = malloc((size_t)n_blocks * sizeof(*r->blocks));
    if (!r->blocks)
        return KVF_ERR_NOMEM;
    const uint32_t most = n_prefix < n_blocks ? n_prefix : n_blocks;
    uint32_t hit = kvf_prefix_cache_match(d->pc.cache, hashes, tokens, most, r->blocks);
    kvf_status_t st = kvf_prefix_cache_alloc(d->pc.cache, n_blocks - hit, r->blocks + hit);
    if (st != KVF_OK) {
        (void)kvf_kvpool_release(d->rt.pool, r->blocks, hit);
        free(r->blocks);
        r->blocks = NULL;
        return st;
    }
    r->n_blocks = n_blocks;
    r->cached_blocks = hit;
    d->prefix_hit_blocks += hit;
    d->prefix_query_blocks += n_prefix;
    if (!spec->local) {
        keep_prefix(d, r, spec, n_prefix);
        /* the next offered blocks may be in a KV tier: the answer to the
         * KvAlloc waits for their copies (tiers.c) */
        r->tier_good = dec_tiers_promote(d, r, hit, most);
        return KVF_OK;
    }
    /* A local prefill computes from the end of the hit, on the device copy
     * where the pool has one: the cached blocks' host copies are the
     * complete ones (only shipped blocks are listed on a device pool). */
    if (hit && (st = kvf_kvpool_upload(d->rt.pool, r->blocks, hit)) != KVF_OK) {
        (void)kvf_kvpool_release(d->rt.pool, r->blocks, n_blocks);
        free(r->blocks);
        r->blocks = NULL;
        return st;
    }
    r->prefilled = hit * d->block_size;
    /* the next blocks may be in a KV tier: r waits for their copies */
    r->tier_good = dec_tiers_promote(d, r, hit, most);
    return KVF_OK;
}

void dec_prefix_list(kvf_decode_t *d, const dec_req_t *r)
{
    if (!d->pc.cache || r->n_prefix == 0 || r->key_gen != d->pc.key_gen)
        return;
    /* A local prefill on a device pool wrote the device copy alone: the
     * host copy, which a later request's upload reads, is not its K/V. */
    if (r->local && kvf_kvpool_device_base(d->rt.pool))
        return;
    /* a local prefill lists every full block of its prompt: all computed
     * here or taken from the cache */
    const uint32_t *tokens = r->local ? r->prompt : r->prefix_tokens;
    kvf_status_t st =
        kvf_prefix_cache_insert(d->pc.cache, r->prefix_hashes, tokens, r->blocks, r->n_prefix);
    if (st != KVF_OK)
        kvf_log_debug("request %llu: prefix cache keeps only part of it: %s",
                      (unsigned long long)r->req_id, kvf_status_str(st));
}

void dec_prefix_keep_ids(dec_req_t *r, const uint32_t *ids, size_t n)
{
    free(r->seq_ids);
    r->seq_ids = NULL;
    r->n_seq_ids = r->cap_seq_ids = 0;
    if (n != r->n_tokens)
        return; /* not the sequence its blocks hold */
    uint32_t cap = r->n_tokens + (r->max_new < 64 ? r->max_new : 64);
    r->seq_ids = malloc((size_t)cap * sizeof(uint32_t));
    if (!r->seq_ids)
        return;
    memcpy(r->seq_ids, ids, n * sizeof(uint32_t));
    r->n_seq_ids = (uint32_t)n;
    r->cap_seq_ids = cap;
}

void dec_prefix_note_token(dec_req_t *r, uint32_t tok)
{
    if (!r->seq_ids)
        return;
    if (r->n_seq_ids == r->cap_seq_ids) {
        uint32_t cap = r->cap_seq_ids * 2;
        uint32_t *grown = realloc(r->seq_ids, (size_t)cap * sizeof(uint32_t));
        if (!grown) {
            free(r->seq_ids); /* listed no more: the ids are incomplete */
            r->seq_ids = NULL;
            return;
        }
        r->seq_ids = grown;
        r->cap_seq_ids = cap;
    }
    r->seq_ids[r->n_seq_ids++] = tok;
}

void dec_prefix_list_all(kvf_decode_t *d, const dec_req_t *r)
{
    const uint32_t bs = d->block_size;
    uint32_t n_full = r->kv_len / bs;
    /* a device pool's decode steps wrote its device copy alone */
    if (!d->pc.cache || !r->seq_ids || r->kv_len > r->n_seq_ids || n_full == 0 ||
        n_full > r->n_blocks || kvf_kvpool_device_base(d->rt.pool) || !kvf_node_prefix_sync(&d->pc))
        return;
    uint64_t *hashes = malloc((size_t)n_full * sizeof(uint64_t));
    if (!hashes)
        return;
    /* The prompt's leading hashes are known (checked or computed at
     * admission, under this key): the chain goes on from the last one. */
    uint32_t known = r->key_gen == d->pc.key_gen && r->n_prefix <= n_full ? r->n_prefix : 0;
    if (known)
        memcpy(hashes, r->prefix_hashes, (size_t)known * sizeof(uint64_t));
    uint64_t parent =
        known ? hashes[known - 1] : kvf_node_prefix_root(&d->pc, r->salt, r->salt_len);
    n_full = known + kvf_block_hash_chain(&d->pc.key, parent, r->seq_ids + (size_t)known * bs,
                                          r->kv_len - known * bs, bs, hashes + known);
    kvf_status_t st = kvf_prefix_cache_insert(d->pc.cache, hashes, r->seq_ids, r->blocks, n_full);
    if (st != KVF_OK)
        kvf_log_debug("request %llu: prefix cache keeps only part of it: %s",
                      (unsigned long long)r->req_id, kvf_status_str(st));
    free(hashes);
}
