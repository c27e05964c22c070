/* Picking a request's nodes (docs/prefix-cache.md, "Routing"): the
 * policies (kv, load, random), the kv policy's cost over the prefix index
 * (prefix_index.c) and the nodes' load, and conditional disaggregation
 * (a decode node prefilling a short uncached suffix itself). See
 * router_internal.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvf/clock.h"
#include "kvf/log.h"
#include "kvf/sampling.h"
#include "router_internal.h"

/* A prefix hit leaves at least this many prompt tokens to compute, on
 * every node (the prefill nodes' rule, prefill_node/forward.c): the
 * index's hits are counted the way the nodes will use them. */
#define ROUTE_MIN_TAIL 32
/* The running averages' weight of a new observation: 1 / 2^shift. */
#define ROUTE_RATE_SHIFT 2
/* A new break-even is logged when it moved by more than 1 / 2^shift. */
#define ROUTE_LOG_SHIFT 2

static const char *const policy_names[] = {"kv", "load", "random"};

bool kvf_route_policy_parse(const char *name, kvf_route_policy_t *policy_p)
{
    for (int i = 0; i < 3; i++)
        if (!strcmp(name, policy_names[i])) {
            *policy_p = (kvf_route_policy_t)i;
            return true;
        }
    return false;
}

const char *kvf_route_policy_name(kvf_route_policy_t policy)
{
    return (unsigned)policy < 3 ? policy_names[policy] : "?";
}

uint32_t kvf_router__blocks_for(uint32_t tokens, uint32_t block_size)
{
    return block_size ? (tokens + block_size - 1) / block_size : tokens;
}

uint32_t kvf_router__tokens_needed(const kvf_router_req_t *q)
{
    return q->ask.n_prompt + q->ask.sampling->max_tokens;
}

static uint32_t attempt_tokens(const kvf_router_req_t *q)
{
    return q->ask.n_prompt + q->out.n;
}

uint32_t kvf_router__reuse_cap(uint32_t n_tokens, uint32_t block_size)
{
    return n_tokens > ROUTE_MIN_TAIL && block_size ? (n_tokens - ROUTE_MIN_TAIL) / block_size : 0;
}

void kvf_router__req_hashes(kvf_router_t *r, kvf_router_req_t *q)
{
    uint32_t bs = r->nodes.have_geometry ? r->nodes.geometry.block_size : 0;
    if (q->ask.hashes || !bs || q->ask.n_prompt < bs)
        return;
    q->ask.hashes = malloc((size_t)(q->ask.n_prompt / bs) * sizeof(uint64_t));
    if (!q->ask.hashes)
        return;
    uint64_t root = kvf_block_hash_root(
        &r->hash_key, strtoull(r->nodes.fingerprint, NULL, 16), (int)r->nodes.geometry.dtype, bs,
        q->ask.cache_salt, q->ask.cache_salt_len);
    q->ask.n_hashes =
        kvf_block_hash_chain(&r->hash_key, root, q->ask.prompt, q->ask.n_prompt, bs, q->ask.hashes);
}

/* n's leading blocks of q it holds, at most cap. */
static uint32_t hits(const kvf_router_node_t *n, const kvf_router_req_t *q, uint32_t cap)
{
    uint32_t count = q->ask.n_hashes < cap ? q->ask.n_hashes : cap;
    return q->ask.hashes ? kvf_router__prefix_hits(n, q->ask.hashes, count) : 0;
}

static bool excluded(const kvf_router_t *r, const kvf_router_req_t *q, const kvf_router_node_t *n)
{
    kvf_node_ref_t ref = kvf_router__node_ref(r, n);
    for (int i = 0; i < q->place.n_excluded; i++)
        if (q->place.excluded[i] == ref)
            return true;
    return false;
}

/* The blocks of n's last heartbeat the requests that ended since gave
 * back (at most those it counted in use). */
static uint32_t node_finished_blocks(const kvf_router_node_t *n)
{
    uint32_t used = n->blocks_total - n->blocks_free;
    return n->finished_blocks < used ? n->finished_blocks : used;
}

/* n's running sequences: its heartbeat's, less those ended since. */
static uint32_t node_running(const kvf_router_node_t *n)
{
    return n->finished_running < n->running ? n->running - n->finished_running : 0;
}

/* Whether decode node n can take q now; *room_p its free blocks after. */
static bool decode_fits(kvf_router_t *r, const kvf_router_req_t *q, const kvf_router_node_t *n,
                        int64_t *room_p)
{
    if (!n->used || n->role != KVF__ROLE__ROLE_DECODE || n->state != NODE_LIVE ||
        n->suspect_since_ns || excluded(r, q, n))
        return false;
    uint32_t tokens = kvf_router__tokens_needed(q);
    if (n->max_context && tokens > n->max_context)
        return false;
    *room_p = (int64_t)n->blocks_free + (int64_t)node_finished_blocks(n) - n->pending_blocks -
              kvf_router__blocks_for(tokens, n->block_size);
    if (*room_p < 0)
        return false;
    return !n->max_running || node_running(n) + n->pending_running < n->max_running;
}

static bool prefill_usable(const kvf_router_node_t *n)
{
    return n->used && n->role == KVF__ROLE__ROLE_PREFILL && n->state == NODE_LIVE;
}

static uint32_t draw(kvf_router_t *r, uint32_t below)
{
    return (uint32_t)(kvf_splitmix64(&r->route_rng) % below);
}

/* The cluster's measured prefill compute per token: the fastest prefill
 * node's running average; 0 before any reported. */
static uint64_t cluster_prefill_ns(const kvf_router_t *r)
{
    uint64_t best = 0;
    for (int i = 0; i < ROUTER_MAX_NODES; i++) {
        const kvf_router_node_t *n = &r->nodes.slots[i];
        if (prefill_usable(n) && n->prefill_ns_per_token &&
            (!best || n->prefill_ns_per_token < best))
            best = n->prefill_ns_per_token;
    }
    return best;
}

/* n's measured prefill compute per token: a prefill node's own, a decode
 * node's local prefills', the cluster's before either is measured. */
static uint64_t node_prefill_ns(const kvf_router_t *r, const kvf_router_node_t *n)
{
    uint64_t own = n->role == KVF__ROLE__ROLE_DECODE ? n->local_ns_per_token
                                                      : n->prefill_ns_per_token;
    return own ? own : cluster_prefill_ns(r);
}

/* A disk hit of n blocks: the first arrives one read after the request
 * asks (read_ns, queued behind the node's other I/O included), each next
 * one a read's pread time later divided among the reads run at once; they
 * cost the request less than computing them (n * block_size * per) from
 * n = (read_ns - step) / (block_size * per - step) blocks on, and never
 * when a step is as long as computing a block. */
uint32_t kvf_router__disk_break_even(const kvf_router_t *r, const kvf_router_node_t *n)
{
    uint64_t per = node_prefill_ns(r, n), bs = n->block_size;
    if (!per || !n->disk_read_ns || !bs)
        return 0;
    uint64_t step = n->disk_read_busy_ns / (n->disk_io_threads ? n->disk_io_threads : 1);
    if (step >= bs * per)
        return UINT32_MAX;
    uint64_t first = n->disk_read_ns > step ? n->disk_read_ns - step : 0;
    uint64_t blocks = (first + bs * per - step - 1) / (bs * per - step);
    uint64_t tokens = (blocks ? blocks : 1) * bs;
    return tokens >= UINT32_MAX ? UINT32_MAX - 1 : (uint32_t)tokens;
}

/* q's leading blocks n holds, pool then tiers, at most cap. */
static void tier_hits(const kvf_router_node_t *n, const kvf_router_req_t *q, uint32_t cap,
                      kvf_prefix_hits_t *h_p)
{
    uint32_t count = q->ask.n_hashes < cap ? q->ask.n_hashes : cap;
    *h_p = (kvf_prefix_hits_t){0, 0, 0};
    if (q->ask.hashes)
        kvf_router__prefix_hits_tiers(n, q->ask.hashes, count, h_p);
}

/* Whether n's disk hits of h count: they reach n's break-even, or it is
 * not measured yet (then the weight alone rates them). */
static bool disk_pays(const kvf_router_t *r, const kvf_router_node_t *n,
                      const kvf_prefix_hits_t *h)
{
    uint32_t be = kvf_router__disk_break_even(r, n);
    return h->disk && (!be || (uint64_t)h->disk * n->block_size >= be);
}

/* The blocks of h n need not compute, weighed by where they are: a pool
 * hit 1, a RAM tier hit tier_ram_weight, a disk tier hit tier_disk_weight
 * when the disk run pays. */
static double hit_credit(const kvf_router_t *r, const kvf_router_node_t *n,
                         const kvf_prefix_hits_t *h)
{
    double credit = (double)h->pool + r->cfg.tier_ram_weight * h->ram;
    if (disk_pays(r, n, h))
        credit += r->cfg.tier_disk_weight * h->disk;
    return credit;
}

/* The cost of q on decode node n under the kv policy: the blocks its
 * sequences hold once q joined them (q's own less those it shares with
 * the cached prefix n's pool holds), less a credit for the blocks of q it
 * would not need shipped: its pool hits, and its tier hits weighed as a
 * prefill node's are (a KvAlloc takes them back from the tiers,
 * decode_node/tiers.c). A tier hit comes back into q's own blocks: it
 * saves the transfer, not the room. */
static double decode_cost(const kvf_router_t *r, const kvf_router_req_t *q,
                          const kvf_router_node_t *n)
{
    uint32_t nb = kvf_router__blocks_for(attempt_tokens(q), n->block_size);
    uint32_t need = kvf_router__blocks_for(kvf_router__tokens_needed(q), n->block_size);
    kvf_prefix_hits_t h;
    tier_hits(n, q, nb ? nb - 1 : 0, &h); /* the last block always travels */
    double load = (double)(n->blocks_total - n->blocks_free - node_finished_blocks(n)) +
                  n->pending_blocks + need - h.pool;
    return r->cfg.decode_weight * load - r->cfg.transfer_weight * hit_credit(r, n, &h);
}

/* The cost of q on prefill node n under the kv policy: q's blocks it must
 * compute (after its cached prefix, pool and tier hits credited by tier,
 * and where n pulls, the further blocks of q decode node d's pool holds,
 * credited pull_weight each) and the blocks queued before them. */
static double prefill_cost(const kvf_router_t *r, const kvf_router_req_t *q,
                           const kvf_router_node_t *n, const kvf_router_node_t *d)
{
    uint32_t bs = n->block_size, tokens = attempt_tokens(q), cap = kvf_router__reuse_cap(tokens, bs);
    kvf_prefix_hits_t h;
    tier_hits(n, q, cap, &h);
    double credit = hit_credit(r, n, &h);
    if (n->prefix_pull && d && d != n) {
        double held = hits(d, q, cap);
        if (held > credit)
            credit += r->cfg.pull_weight * (held - credit);
    }
    double to_compute = (double)kvf_router__blocks_for(tokens, bs) - credit;
    double queued = kvf_router__blocks_for((uint32_t)(n->queued_tokens + n->pending_tokens), bs);
    return r->cfg.prefill_weight * (to_compute + queued);
}

/* Scores every node that qualifies and keeps the best: lower is better
 * for kv, higher for load (room). */
static kvf_router_node_t *pick_decode(kvf_router_t *r, const kvf_router_req_t *q)
{
    kvf_router_node_t *best = NULL;
    double best_score = 0;
    uint32_t n_fit = 0;
    kvf_router_node_t *fit[ROUTER_MAX_NODES];
    for (int i = 0; i < ROUTER_MAX_NODES; i++) {
        kvf_router_node_t *n = &r->nodes.slots[i];
        int64_t room;
        if (!decode_fits(r, q, n, &room))
            continue;
        fit[n_fit++] = n;
        /* load: free room first, among equals fewer sequences; kv: cost,
         * among equals (to a block) the one with more room */
        double score = r->cfg.route == KVF_ROUTE_KV
                           ? decode_cost(r, q, n) - (double)room / (1u << 20)
                           : -((double)room * 1024 - (node_running(n) + n->pending_running));
        if (!best || score < best_score) {
            best = n;
            best_score = score;
        }
    }
    if (r->cfg.route == KVF_ROUTE_RANDOM && n_fit)
        return fit[draw(r, n_fit)];
    return best;
}

/* A prefill node that failed an earlier attempt of q is taken only when
 * no other can prefill (a slow node must not strand the request). */
static kvf_router_node_t *pick_prefill(kvf_router_t *r, const kvf_router_req_t *q,
                                       const kvf_router_node_t *d)
{
    bool others = false;
    for (int i = 0; i < ROUTER_MAX_NODES && !others; i++)
        others = prefill_usable(&r->nodes.slots[i]) && !excluded(r, q, &r->nodes.slots[i]);
    kvf_router_node_t *best = NULL;
    double best_score = 0;
    uint32_t n_usable = 0;
    kvf_router_node_t *usable[ROUTER_MAX_NODES];
    for (int i = 0; i < ROUTER_MAX_NODES; i++) {
        kvf_router_node_t *n = &r->nodes.slots[i];
        if (!prefill_usable(n) || (others && excluded(r, q, n)))
            continue;
        usable[n_usable++] = n;
        double score = r->cfg.route == KVF_ROUTE_KV ? prefill_cost(r, q, n, d)
                                                    : (double)(n->queued_tokens + n->pending_tokens);
        if (!best || score < best_score) {
            best = n;
            best_score = score;
        }
    }
    if (r->cfg.route == KVF_ROUTE_RANDOM && n_usable)
        return usable[draw(r, n_usable)];
    return best;
}

/* The break-even of a local prefill on decode node d, in tokens: the
 * suffix d computes in the time the split path spends on a request beyond
 * its prefill compute (messages, the prefill node's queue, the transfer).
 * A longer local prefill would stall d's running sequences longer than
 * the split path's overhead it saves the request. d's own local rate once
 * measured, the cluster's prefill rate before; 0 while either is unknown. */
static uint32_t break_even(const kvf_router_t *r, const kvf_router_node_t *d)
{
    uint64_t per = node_prefill_ns(r, d);
    if (!per || !r->remote_overhead_ns)
        return 0;
    uint64_t tokens = r->remote_overhead_ns / per;
    return tokens > UINT32_MAX ? UINT32_MAX : (uint32_t)tokens;
}

/* Conditional disaggregation: whether decode node d prefills q itself
 * (it can, holds q's prefix, and what is left to compute is short). */
static bool prefill_here(const kvf_router_t *r, const kvf_router_req_t *q,
                         const kvf_router_node_t *d)
{
    if (!d->prefill_local || (!r->cfg.local_prefill_max_tokens && !r->cfg.local_prefill_auto))
        return false;
    uint32_t tokens = attempt_tokens(q), bs = d->block_size;
    kvf_prefix_hits_t h; /* a local prefill takes tier hits too (decode_node/tiers.c) */
    tier_hits(d, q, kvf_router__reuse_cap(tokens, bs), &h);
    uint32_t held = h.pool + h.ram + (disk_pays(r, d, &h) ? h.disk : 0);
    if (held == 0)
        return false;
    uint32_t left = tokens - held * bs;
    uint32_t most = r->cfg.local_prefill_auto ? break_even(r, d) : r->cfg.local_prefill_max_tokens;
    return left <= most;
}

bool kvf_router__pick(kvf_router_t *r, kvf_router_req_t *q, kvf_router_node_t **p_p,
                      kvf_router_node_t **d_p)
{
    kvf_router__req_hashes(r, q);
    kvf_router_node_t *d = pick_decode(r, q);
    if (!d)
        return false;
    kvf_router_node_t *p = NULL;
    q->place.local = prefill_here(r, q, d);
    if (!q->place.local)
        p = pick_prefill(r, q, d);
    if (!p && d->prefill_local) {
        p = d; /* no prefill node: the colocated way */
        q->place.local = true;
    }
    if (!p)
        return false;
    kvf_log_debug("request %llu: %s holds %u of %u blocks, %s %u%s", (unsigned long long)q->id,
                  d->id, hits(d, q, q->ask.n_hashes), q->ask.n_hashes, p->id,
                  hits(p, q, q->ask.n_hashes), q->place.local ? " (local prefill)" : "");
    *p_p = p;
    *d_p = d;
    return true;
}

/* avg += (v - avg) / 2^ROUTE_RATE_SHIFT; the first observation sets it. */
static void average(uint64_t *avg, uint64_t v)
{
    if (!*avg)
        *avg = v;
    else
        *avg += ((int64_t)v - (int64_t)*avg) / (1 << ROUTE_RATE_SHIFT);
}

static void log_break_even(kvf_router_t *r, const kvf_router_node_t *d)
{
    if (!r->cfg.local_prefill_auto)
        return;
    uint64_t be = break_even(r, d), last = r->break_even_logged;
    uint64_t moved = be > last ? be - last : last - be;
    if (!be || (last && moved <= (last >> ROUTE_LOG_SHIFT)))
        return;
    r->break_even_logged = be;
    uint64_t per = node_prefill_ns(r, d);
    kvf_log_info("conditional disaggregation: break-even %llu tokens on %s (split path overhead "
                 "%.2f ms, %s prefill %.1f us/token)",
                 (unsigned long long)be, d->id, (double)r->remote_overhead_ns / 1e6,
                 d->local_ns_per_token ? "local" : "cluster", (double)per / 1e3);
}

void kvf_router__observe_prefill_done(kvf_router_t *r, kvf_router_req_t *q,
                                      const Kvf__PrefillDone *pd)
{
    /* the attempt's tokens as dispatched: its first tokens may have come
     * before its PrefillDone */
    uint32_t tokens = q->place.n_tokens;
    uint32_t cached = pd->cached_tokens < tokens ? pd->cached_tokens : tokens;
    uint32_t computed = tokens - cached;
    r->count.prefill_computed += computed;
    r->count.prefill_cached += cached;
    r->count.kv_bytes += pd->kv_bytes;
    r->count.kv_bytes_pulled += pd->kv_bytes_pulled;
    kvf_router_node_t *p = kvf_router__node_get(r, q->place.prefill);
    if (!p || !computed || !pd->prefill_compute_us)
        return;
    uint64_t per = pd->prefill_compute_us * 1000u / computed;
    if (q->place.local) {
        r->count.local_prefills++;
        average(&p->local_ns_per_token, per);
        log_break_even(r, p);
        return;
    }
    average(&p->prefill_ns_per_token, per);
    uint64_t took = kvf_clock_ns() - q->place.dispatched_ns, compute = pd->prefill_compute_us * 1000u;
    if (q->place.dispatched_ns && took > compute) {
        average(&r->remote_overhead_ns, took - compute);
        kvf_router_node_t *d = kvf_router__node_get(r, q->place.decode);
        if (d && d->prefill_local)
            log_break_even(r, d);
    }
}

void kvf_router__route_describe(const kvf_router_t *r)
{
    char local[96] = "off";
    if (r->cfg.local_prefill_auto)
        snprintf(local, sizeof(local), "auto (the break-even is measured on the first requests)");
    else if (r->cfg.local_prefill_max_tokens)
        snprintf(local, sizeof(local), "up to %u tokens", r->cfg.local_prefill_max_tokens);
    kvf_log_info("routing: %s (prefill weight %.2f, decode weight %.2f, transfer weight %.2f, "
                 "KV tier hits: RAM %.2f, disk %.2f of a pool hit, pulls %.2f); conditional "
                 "disaggregation (decode nodes with --prefill-local): %s",
                 kvf_route_policy_name(r->cfg.route), r->cfg.prefill_weight, r->cfg.decode_weight,
                 r->cfg.transfer_weight, r->cfg.tier_ram_weight, r->cfg.tier_disk_weight,
                 r->cfg.pull_weight, local);
}

void kvf_router__observe_disk_reads(kvf_router_t *r, kvf_router_node_t *n)
{
    uint32_t be = kvf_router__disk_break_even(r, n), last = n->disk_break_even_logged;
    uint32_t moved = be > last ? be - last : last - be;
    if (!be || be == last || (last && last != UINT32_MAX && moved <= (last >> ROUTE_LOG_SHIFT)))
        return;
    n->disk_break_even_logged = be;
    char what[64];
    if (be == UINT32_MAX)
        snprintf(what, sizeof(what), "none: its reads bring blocks slower than computing them");
    else
        snprintf(what, sizeof(what), "%u tokens", be);
    double mbps = n->disk_read_busy_ns ? (double)n->disk_read_bytes * 1e3 / n->disk_read_busy_ns
                                       : 0;
    kvf_log_info("kv tiers: %s's disk hit break-even %s (a read %.3f ms queued to checked, "
                 "%.0f MB/s each, %u at once; prefill %.1f us/token)",
                 n->id, what, (double)n->disk_read_ns / 1e6, mbps, n->disk_io_threads,
                 (double)node_prefill_ns(r, n) / 1e3);
}
