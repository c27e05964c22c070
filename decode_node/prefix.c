/* The decode node's prefix cache (docs/prefix-cache.md): the full prompt
 * blocks prefill nodes shipped here stay in the pool once their request
 * sealed, so a later request with the same leading blocks finds them and
 * the prefill node ships only the rest (KvAllocReply.cached_blocks). Only
 * shipped prompt blocks are listed: they hold exactly what a prefill node
 * computes. The blocks this node writes itself (generated tokens, local
 * prefills) never are. */
#include "decode_internal.h"

#include "kvf/log.h"

#include <stdlib.h>
#include <string.h>

bool dec_prefix_key_sync(kvf_decode_t *d)
{
    uint64_t k[2];
    uint32_t gen = d->cache ? kvf_node_prefix_key(d->node, k) : 0;
    if (gen == 0)
        return false;
    if (gen == d->key_gen)
        return true;
    if (d->key_gen) {
        /* Another router run, another key: start afresh (blocks requests
         * hold stay theirs). */
        kvf_prefix_cache_t *fresh = NULL;
        if (kvf_prefix_cache_create(d->rt.pool, 0, &fresh) != KVF_OK)
            return false;
        kvf_prefix_cache_destroy(d->cache);
        d->cache = fresh;
        kvf_log_info("prefix cache: the cluster's hash key changed; starting afresh");
    }
    d->hash_key = (kvf_block_hash_key_t){k[0], k[1]};
    const kvf_kv_geometry_t *g = kvf_kvpool_geometry(d->rt.pool);
    d->model_fp = strtoull(kvf_model_fingerprint(d->rt.model), NULL, 16);
    d->hash_root = kvf_block_hash_root(&d->hash_key, d->model_fp, (int)g->dtype,
                                       (uint32_t)g->block_size, NULL, 0);
    d->key_gen = gen;
    return true;
}

uint32_t dec_blocks_available(const kvf_decode_t *d)
{
    return d->cache ? kvf_prefix_cache_available(d->cache) : kvf_kvpool_free_blocks(d->rt.pool);
}

/* How many of spec's prefix blocks this node can trust: the hash chain it
 * computes itself from their tokens must equal the one sent (the same
 * key, the same model and format), and at least one prompt block must be
 * left to write (the transfer's last batch lands in it). */
static uint32_t trusted_prefix(kvf_decode_t *d, const dec_admit_spec_t *spec)
{
    if (spec->local || spec->n_prefix == 0 || !dec_prefix_key_sync(d))
        return 0;
    const uint32_t bs = d->block_size, n_prompt_blocks = (spec->n_tokens + bs - 1) / bs;
    uint32_t n = spec->n_prefix;
    if ((uint64_t)n * bs > spec->n_tokens)
        return 0;
    n = n < n_prompt_blocks - 1 ? n : n_prompt_blocks - 1;
    uint64_t h = d->hash_root;
    if (spec->cache_salt_len) {
        const kvf_kv_geometry_t *g = kvf_kvpool_geometry(d->rt.pool);
        h = kvf_block_hash_root(&d->hash_key, d->model_fp, (int)g->dtype, bs, spec->cache_salt,
                                spec->cache_salt_len);
    }
    for (uint32_t i = 0; i < n; i++) {
        h = kvf_block_hash_next(&d->hash_key, h, spec->prefix_tokens + (size_t)i * bs, bs);
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
    r->key_gen = d->key_gen;
}

kvf_status_t dec_prefix_alloc(kvf_decode_t *d, dec_req_t *r, const dec_admit_spec_t *spec,
                              uint32_t n_blocks)
{
    const uint32_t n_prefix = trusted_prefix(d, spec);
    if (!d->cache)
        return dec_req_alloc_blocks(d, r, n_blocks);
    r->blocks = malloc((size_t)n_blocks * sizeof(*r->blocks));
    if (!r->blocks)
        return KVF_ERR_NOMEM;
    const uint32_t most = n_prefix < n_blocks ? n_prefix : n_blocks;
    uint32_t hit = kvf_prefix_cache_match(d->cache, spec->prefix_hashes, spec->prefix_tokens, most,
                                          r->blocks);
    kvf_status_t st = kvf_prefix_cache_alloc(d->cache, n_blocks - hit, r->blocks + hit);
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
    keep_prefix(d, r, spec, n_prefix);
    return KVF_OK;
}

void dec_prefix_list(kvf_decode_t *d, const dec_req_t *r)
{
    if (!d->cache || r->local || r->n_prefix == 0 || r->key_gen != d->key_gen)
        return;
    kvf_status_t st = kvf_prefix_cache_insert(d->cache, r->prefix_hashes, r->prefix_tokens,
                                              r->blocks, r->n_prefix);
    if (st != KVF_OK)
        kvf_log_debug("request %llu: prefix cache keeps only part of it: %s",
                      (unsigned long long)r->req_id, kvf_status_str(st));
}
