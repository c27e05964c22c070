/* kvf-prefill's batched forward: which chunks of which prompts go into the
 * next forward (plan.h), the engine's per-layer hook that posts the layer's
 * completed K/V slices to the decode nodes while later layers compute, and
 * the first token sampled from a prompt's last logits. */
#include "prefill_internal.h"
#include "plan.h"

#include "kvf/array.h"
#include "kvf/clock.h"
#include "kvf/log.h"
#include "kvf/model.h"
#include "kvf/sampling.h"

#include <stdlib.h>
#include <string.h>

/* Chunk shapes (plan.h): chunks end on multiples of the CPU backend's
 * attention tile (16 query tokens) and leave no tail shorter than two
 * tiles, so a chunked prefill writes the bits a one-forward prefill would. */
#define PF_CHUNK_ALIGN    16
#define PF_CHUNK_MIN_TAIL 32
/* Forwards of at most this many tokens run the CPU backend's few-row
 * projection kernels (KVF_CPU_GEMV_MAX_M, private to the backend), larger
 * ones BLAS; the two round differently, so pick_forward keeps prompts on
 * the kernels their one-forward prefill would use. */
#define PF_FEW_ROWS 8

/* ---- scratch ---- */

static kvf_status_t fwd_reserve(pf_forward_t *f, size_t n)
{
    if (n <= f->cap)
        return KVF_OK;
    size_t cap = kvf_array_grow_cap(f->cap, n, 16);
    if (kvf_array_resize(&f->reqs, cap, sizeof(*f->reqs)) != KVF_OK ||
        kvf_array_resize(&f->seqs, cap, sizeof(*f->seqs)) != KVF_OK ||
        kvf_array_resize(&f->remaining, cap, sizeof(*f->remaining)) != KVF_OK ||
        kvf_array_resize(&f->take, cap, sizeof(*f->take)) != KVF_OK)
        return KVF_ERR_NOMEM;
    f->cap = cap;
    return KVF_OK;
}

static kvf_status_t fwd_reserve_slices(pf_forward_t *f, size_t n)
{
    if (n <= f->cap_slices)
        return KVF_OK;
    kvf_xfer_slice_t *sl = realloc(f->slices, n * sizeof(*sl));
    if (!sl)
        return KVF_ERR_NOMEM;
    f->slices = sl;
    f->cap_slices = n;
    return KVF_OK;
}

void pf_forward_fini(pf_forward_t *f)
{
    free(f->reqs);
    free(f->seqs);
    free(f->remaining);
    free(f->take);
    free(f->slices);
    memset(f, 0, sizeof(*f));
}

/* ---- choosing the forward ---- */

/* Whether r's connection to its decode node is set up: a forward never
 * waits on one being set up between its layers. */
static bool peer_ready(const pf_req_t *r)
{
    return r->peer && r->peer->xp && kvf_xfer_peer_ready(r->peer->xp);
}

uint32_t pf_blocks_available(const kvf_prefill_t *p)
{
    return kvf_node_prefix_available(&p->pc);
}

bool pf_forward_possible(const kvf_prefill_t *p)
{
    /* Counting evictable blocks walks the cache: once per call, and only
     * when a waiting prompt needs it. */
    int64_t available = -1;
    for (const pf_req_t *r = p->head; r; r = r->next) {
        if (r->state != REQ_READY || !peer_ready(r) || r->tier_pending || r->pull)
            continue;
        if (r->done > 0 || r->local.n_blocks)
            return true;
        if (available < 0)
            available = pf_blocks_available(p);
        if (kvf_kv_blocks_for_tokens(&p->geo, r->n_prompt) <= (uint64_t)available)
            return true;
    }
    return false;
}

/* r's local blocks from the prefix cache: the longest cached run of its
 * prompt's leading full blocks that leaves at least PF_CHUNK_MIN_TAIL
 * tokens to compute, then fresh blocks, evicting cached ones nobody uses
 * where the pool is short. A hit ends on a block boundary (a multiple of
 * PF_CHUNK_ALIGN) and leaves a tail chunked prefill accepts, so the suffix
 * is computed with the bits a one-forward cold prefill gives it: it is a
 * chunked prefill whose first chunks ran earlier (docs/prefix-cache.md). */
static bool take_local_cached(kvf_prefill_t *p, pf_req_t *r)
{
    const uint32_t bs = (uint32_t)p->geo.block_size;
    const uint32_t need = kvf_kv_blocks_for_tokens(&p->geo, r->n_prompt);
    uint32_t *ids = malloc((size_t)need * sizeof(uint32_t));
    if (!ids)
        return false;
    _Static_assert(KVF_KV_BLOCK_SIZE_DEFAULT % PF_CHUNK_ALIGN == 0, "hits end on chunk edges");
    uint32_t most = 0;
    if (bs % PF_CHUNK_ALIGN == 0 && r->n_prompt > PF_CHUNK_MIN_TAIL)
        most = (r->n_prompt - PF_CHUNK_MIN_TAIL) / bs;
    most = most < r->n_full ? most : r->n_full;
    uint32_t hit = kvf_prefix_cache_match(p->pc.cache, r->hashes, r->pr->token_ids, most, ids);
    bool ok = kvf_prefix_cache_alloc(p->pc.cache, need - hit, ids + hit) == KVF_OK;
    if (ok && kvf_block_table_append(&r->local, ids, need) != KVF_OK) {
        (void)kvf_kvpool_release(p->rt.pool, ids + hit, need - hit);
        ok = false;
    }
    if (!ok)
        (void)kvf_kvpool_release(p->rt.pool, ids, hit);
    free(ids);
    if (!ok)
        return false;
    p->count.prompt_tokens += r->n_prompt;
    r->cached_blocks = hit;
    r->hit_most = most;
    /* the next blocks may be in a KV tier: r waits for their copies (and
     * then perhaps for a pull of the decode node's) */
    r->tier_good = pf_tiers_promote(p, r, hit, most);
    if (!r->tier_pending)
        pf_req_reuse(p, r, hit);
    return true;
}

void pf_req_set_cached(kvf_prefill_t *p, pf_req_t *r, uint32_t n)
{
    r->cached_blocks = n;
    r->done = n * (uint32_t)p->geo.block_size;
    p->count.prefix_hit_tokens += r->done;
    if (n)
        kvf_log_debug("request %llu epoch %llu: %u of %u prompt tokens reused",
                      (unsigned long long)r->req_id, (unsigned long long)r->epoch, r->done,
                      r->n_prompt);
}

/* Gives a waiting request its local blocks; false when the pool is short. */
static bool req_take_local(kvf_prefill_t *p, pf_req_t *r)
{
    if (r->local.n_blocks)
        return true;
    if (p->pc.cache && r->hashes && r->key_gen == p->pc.key_gen)
        return take_local_cached(p, r);
    p->count.prompt_tokens += r->n_prompt;
    return kvf_block_table_reserve(&r->local, p->rt.pool, r->n_prompt) == KVF_OK;
}

/* Picks the requests of the next forward into p->fwd (their remaining
 * tokens, then the plan's takes); returns how many. */
static size_t pick_forward(kvf_prefill_t *p)
{
    pf_forward_t *f = &p->fwd;
    uint64_t now = kvf_clock_ns();
    uint64_t budget = (uint64_t)p->cfg.max_batch_tokens, wanted = 0;
    size_t n = 0;
    int few_rows = -1; /* the forward's kind, set by its first request */
    /* Chunks already under way first (they hold blocks), then new prompts
     * in arrival order, stopping at the first the local pool cannot hold
     * (first come, first served; it waits for blocks to free up). */
    for (int pass = 0; pass < 2; pass++) {
        pf_req_t *next;
        for (pf_req_t *r = p->head; r && wanted < budget; r = next) {
            next = r->next;
            if (r->state != REQ_READY || (pass == 0) != (r->done > 0) || !peer_ready(r) ||
                r->tier_pending || r->pull)
                continue;
            /* A prompt short enough that one forward over it alone (the
             * colocated prefill) takes the few-row kernels shares forwards
             * only with such prompts, within that size; the others never
             * join them. Its bits then match the colocated ones. */
            int few = r->n_prompt <= PF_FEW_ROWS;
            if (few_rows < 0) {
                few_rows = few;
                if (few && budget > PF_FEW_ROWS)
                    budget = PF_FEW_ROWS;
            }
            if (few != few_rows || (few && wanted + r->n_prompt - r->done > budget))
                continue; /* a later forward of its kind */
            if (pass == 1) {
                if (pf_lease_ending(r, now)) {
                    pf_req_fail(p, r, KVF_ERR_TIMEOUT, "lease ended while queued");
                    continue;
                }
                if (!req_take_local(p, r))
                    goto picked;
                if (r->tier_pending || r->pull)
                    continue; /* a later forward, once its blocks are here */
            }
            if (fwd_reserve(f, n + 1) != KVF_OK)
                goto picked;
            f->reqs[n] = r;
            f->remaining[n] = r->n_prompt - r->done;
            wanted += f->remaining[n];
            n++;
        }
    }
picked:
    return kvf_prefill_plan_forward(f->remaining, n, (uint32_t)budget, PF_CHUNK_ALIGN,
                                    PF_CHUNK_MIN_TAIL, f->take);
}

/* ---- running it ---- */

/* Sets up r's chunk of `take` tokens as engine sequence s: which blocks it
 * ships, and on its final chunk where the logits go. Returns how many
 * blocks it ships. */
static uint32_t chunk_prepare(kvf_prefill_t *p, pf_req_t *r, uint32_t take, uint64_t start_ns,
                              kvf_engine_seq_t *s)
{
    r->chunk_start = r->done;
    r->chunk_len = take;
    r->hook_status = KVF_OK;
    kvf_prefill_plan_blocks((uint32_t)p->geo.block_size, r->chunk_start, r->chunk_len, r->n_prompt,
                            &r->ship_first, &r->ship_end);
    /* The first chunk after a cache hit also ships the cached blocks (all
     * their layers are there already); no chunk ships a block the decode
     * node holds (below ship_from). The final chunk always ships the last
     * block, which the decode node never holds. */
    if (r->chunk_start == r->cached_blocks * (uint32_t)p->geo.block_size)
        r->ship_first = 0;
    if (r->ship_first < r->ship_from)
        r->ship_first = r->ship_from < r->ship_end ? r->ship_from : r->ship_end;
    bool final = r->chunk_start + r->chunk_len == r->n_prompt;
    if (final && !r->logits) {
        r->logits = malloc((size_t)p->rt.model->cfg.vocab * sizeof(float));
        if (!r->logits)
            r->hook_status = KVF_ERR_NOMEM; /* ships nothing; failed below */
    }
    if (r->chunk_start == 0)
        r->compute_start_ns = start_ns;
    memset(s, 0, sizeof(*s));
    s->tokens = r->pr->token_ids + r->chunk_start;
    s->n_tokens = r->chunk_len;
    s->start_pos = r->chunk_start;
    s->block_ids = r->local.blocks;
    s->n_blocks = r->local.n_blocks;
    s->logits = final ? r->logits : NULL;
    return r->ship_end - r->ship_first;
}

/* Ships layer `layer` of every chunk in the forward that completes blocks;
 * keeps heartbeats and transfers moving while the next layers compute.
 * Runs on the loop's thread, inside kvf_engine_forward. */
static void on_layer_done(void *arg, int layer)
{
    kvf_prefill_t *p = arg;
    pf_forward_t *f = &p->fwd;
    bool last_layer = layer == p->geo.n_layers - 1;
    for (size_t i = 0; i < f->n; i++) {
        pf_req_t *r = f->reqs[i];
        if (r->hook_status != KVF_OK || r->state != REQ_READY || r->ship_first == r->ship_end)
            continue;
        bool final = r->chunk_start + r->chunk_len == r->n_prompt;
        size_t n = kvf_prefill_plan_slices(p->rt.pool, layer, r->local.blocks, r->remote_blocks,
                                           r->ship_first, r->ship_end, f->slices);
        uint32_t flags = final && last_layer ? KVF_XFER_LAST : 0;
        kvf_status_t st = pf_req_post(p, r, f->slices, n, flags);
        if (st != KVF_OK) {
            kvf_log_warn("request %llu: layer %d batch not posted: %s",
                         (unsigned long long)r->req_id, layer, kvf_status_str(st));
            r->hook_status = st;
            continue;
        }
        r->kv_bytes += (uint64_t)n * kvf_kvpool_slice_bytes(p->rt.pool);
        if (flags & KVF_XFER_LAST)
            r->last_posted = true;
    }
    /* The layer's batches on their way before the next layer computes. */
    kvf_xfer_progress_for(p->xfer, PF_PROGRESS_BUDGET_MS);
    pf_inbox_during_forward(p);
    (void)kvf_node_tick(p->node); /* a refusal is seen by the loop's own tick */
}

/* The first token, from the last prompt position's logits, with the
 * sampler's state continued from an earlier epoch's (rng_state) when it
 * generated tokens already. */
static kvf_status_t sample_first_token(kvf_prefill_t *p, pf_req_t *r)
{
    const Kvf__PrefillRequest *pr = r->pr;
    kvf_sampler_t sampler;
    kvf_status_t st = kvf_sampler_init(&sampler, &r->sampling, p->rt.model->cfg.vocab);
    if (st != KVF_OK)
        return st;
    if (pr->n_generated > 0)
        kvf_sampler_set_state(&sampler, pr->rng_state);
    r->first_token = kvf_sampler_sample(&sampler, r->logits);
    r->rng_after = kvf_sampler_state(&sampler);
    kvf_sampler_fini(&sampler);
    free(r->logits);
    r->logits = NULL;
    return KVF_OK;
}

/* The forward ended with status st: each request's chunk is computed (and
 * on its final chunk the first token sampled) or the request fails. */
static void chunks_done(kvf_prefill_t *p, size_t n, kvf_status_t st, uint64_t end_ns)
{
    for (size_t i = 0; i < n; i++) {
        pf_req_t *r = p->fwd.reqs[i];
        if (st != KVF_OK) {
            pf_req_fail(p, r, st, "forward failed");
            continue;
        }
        if (r->hook_status != KVF_OK) {
            pf_req_fail(p, r, r->hook_status == KVF_ERR_NOMEM ? KVF_ERR_NOMEM : KVF_ERR_TRANSPORT,
                        "kv transfer failed");
            continue;
        }
        r->done += r->chunk_len;
        if (r->done < r->n_prompt)
            continue;
        if (sample_first_token(p, r) != KVF_OK) {
            pf_req_fail(p, r, KVF_ERR_NOMEM, "out of memory");
            continue;
        }
        r->compute_end_ns = end_ns;
        r->state = REQ_SHIPPING;
    }
}

/* Runs the forward of the n requests pick_forward chose. */
static void run_forward(kvf_prefill_t *p, size_t n)
{
    pf_forward_t *f = &p->fwd;
    uint64_t start_ns = kvf_clock_ns(), cpu_ns = kvf_clock_cpu_ns();
    size_t max_ship = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t ship = chunk_prepare(p, f->reqs[i], f->take[i], start_ns, &f->seqs[i]);
        if (ship > max_ship)
            max_ship = ship;
    }
    if (fwd_reserve_slices(f, max_ship) != KVF_OK) {
        for (size_t i = 0; i < n; i++)
            pf_req_fail(p, f->reqs[i], KVF_ERR_NOMEM, "out of memory");
        return;
    }
    f->n = n;
    kvf_engine_hooks_t hooks = {.on_layer_done = on_layer_done, .arg = p, .kv_to_host = true};
    kvf_status_t st = kvf_engine_forward(p->rt.engine, f->seqs, (int)n, &hooks);
    f->n = 0;
    uint64_t end_ns = kvf_clock_ns();
    /* the CPU time says how much of its cores the node got meanwhile */
    kvf_log_debug("forward: %zu sequences in %llu us, cpu %llu us", n,
                  (unsigned long long)pf_us_between(start_ns, end_ns),
                  (unsigned long long)((kvf_clock_cpu_ns() - cpu_ns) / 1000));
    chunks_done(p, n, st, end_ns);
}

bool pf_forward_step(kvf_prefill_t *p)
{
    size_t n = pf_forward_possible(p) ? pick_forward(p) : 0;
    if (n == 0)
        return false;
    run_forward(p, n);
    return true;
}
