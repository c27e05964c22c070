/* The router's prefix index: for each node, the hashes of the KV blocks it
 * reported cached (PrefixUpdate), so that route.c can send a request where
 * its prefix already is (docs/prefix-cache.md, "Routing"), and where the
 * node holds each: its pool, or its RAM or disk KV tier (PrefixUpdate's
 * tier lists; docs/kv-tiers.md, "Reports"), so that route.c can credit a
 * hit by the tier it comes from.
 *
 * A node's listing starts with a full report and continues with deltas,
 * each applied only on top of the update before it (PrefixUpdate.seq). A
 * gap (a report lost or refused on the way) empties the node's listing
 * and asks the node for a full one (PrefixResync): the index may lag, but
 * it never holds what a node did not report. A node that dies, leaves or
 * restarts takes its listing with it. The index is a hint: a node checks
 * every hit itself, so a stale entry costs a routing choice, never a
 * wrong block. */
#include <stdlib.h>
#include <string.h>

#include "kvf/clock.h"
#include "kvf/log.h"
#include "router_internal.h"

/* The fewest milliseconds between two PrefixResync to one node (the
 * node's full report may be on its way). */
#define PREFIX_RESYNC_GAP_MS 1000u
/* The most hashes the index keeps for one node (16 MiB of entries): a
 * node's reports cannot grow the router without bound. */
#define PREFIX_MAX_PER_NODE (1u << 18)

static void set_clear(kvf_node_prefix_index_t *ix)
{
    kvf_prefix_entry_t *e, *tmp;
    HASH_ITER(hh, ix->set, e, tmp)
    {
        HASH_DEL(ix->set, e);
        free(e);
    }
    ix->n = 0;
}

void kvf_router__prefix_drop(kvf_router_node_t *n)
{
    set_clear(&n->prefix);
    memset(&n->prefix, 0, sizeof(n->prefix));
}

/* hash's places become (where & ~clear) | set (KVF_PREFIX_IN_*); an
 * entry left in none is freed. */
static void set_mark(kvf_node_prefix_index_t *ix, uint64_t hash, unsigned clear, unsigned set)
{
    kvf_prefix_entry_t *e;
    HASH_FIND(hh, ix->set, &hash, sizeof(hash), e);
    if (!e && !set)
        return;
    if (!e) {
        if (ix->n >= PREFIX_MAX_PER_NODE) {
            ix->truncated = true;
            return;
        }
        e = malloc(sizeof(*e));
        if (!e)
            return; /* a hint lost: routing may miss this block, nothing else */
        e->hash = hash;
        e->where = 0;
        HASH_ADD(hh, ix->set, hash, sizeof(e->hash), e);
        ix->n++;
    }
    e->where = (uint8_t)((e->where & ~clear) | set);
    if (!e->where) {
        HASH_DEL(ix->set, e);
        free(e);
        ix->n--;
    }
}

static void set_marks(kvf_node_prefix_index_t *ix, const uint64_t *hashes, size_t n,
                      unsigned clear, unsigned set)
{
    for (size_t i = 0; i < n; i++)
        set_mark(ix, hashes[i], clear, set);
}

/* Where n holds hash (KVF_PREFIX_IN_*; 0: nowhere). */
static unsigned where(const kvf_router_node_t *n, uint64_t hash)
{
    const kvf_prefix_entry_t *e;
    HASH_FIND(hh, n->prefix.set, &hash, sizeof(hash), e);
    return e ? e->where : 0;
}

uint32_t kvf_router__prefix_hits(const kvf_router_node_t *n, const uint64_t *hashes, uint32_t count)
{
    uint32_t i = 0;
    while (i < count && (where(n, hashes[i]) & KVF_PREFIX_IN_POOL))
        i++;
    return i;
}

void kvf_router__prefix_hits_tiers(const kvf_router_node_t *n, const uint64_t *hashes,
                                   uint32_t count, kvf_prefix_hits_t *hits_p)
{
    hits_p->pool = kvf_router__prefix_hits(n, hashes, count);
    hits_p->ram = hits_p->disk = 0;
    for (uint32_t i = hits_p->pool; i < count; i++) {
        unsigned w = where(n, hashes[i]);
        if (w & KVF_PREFIX_IN_RAM)
            hits_p->ram++;
        else if (w & KVF_PREFIX_IN_DISK)
            hits_p->disk++;
        else
            break;
    }
}

/* u's tier lists (absent from a node without tiers, or an older one). */
static void apply_tiers(kvf_node_prefix_index_t *ix, const Kvf__PrefixUpdate *u)
{
    set_marks(ix, u->tier_ram, u->n_tier_ram, KVF_PREFIX_IN_TIERS, KVF_PREFIX_IN_RAM);
    set_marks(ix, u->tier_disk, u->n_tier_disk, KVF_PREFIX_IN_TIERS, KVF_PREFIX_IN_DISK);
    set_marks(ix, u->tier_gone, u->n_tier_gone, KVF_PREFIX_IN_TIERS, 0);
}

static kvf_router_node_t *node_by_id(kvf_router_t *r, const char *id)
{
    for (int i = 0; i < ROUTER_MAX_NODES; i++)
        if (r->nodes.slots[i].used && !strcmp(r->nodes.slots[i].id, id))
            return &r->nodes.slots[i];
    return NULL;
}

void kvf_router__prefix_resync(kvf_router_t *r, kvf_router_node_t *n)
{
    set_clear(&n->prefix);
    n->prefix.synced = false;
    uint64_t now = kvf_clock_ns();
    if (n->prefix.resync_asked_ns &&
        now - n->prefix.resync_asked_ns < PREFIX_RESYNC_GAP_MS * 1000000ull)
        return;
    n->prefix.resync_asked_ns = now;
    r->count.prefix_resyncs++;
    Kvf__PrefixResync m = KVF__PREFIX_RESYNC__INIT;
    m.seq_seen = n->prefix.seq;
    kvf_envelope_t env;
    kvf_envelope_init(&env, "router");
    env.body_case = KVF__ENVELOPE__BODY_PREFIX_RESYNC;
    env.prefix_resync = &m;
    kvf_router__send(r, n->inbox, &env);
}

void kvf_router__on_prefix_update(kvf_router_t *r, const Kvf__PrefixUpdate *u, const char *sender)
{
    kvf_router_node_t *n = node_by_id(r, u->node_id);
    if (!n || n->state == NODE_DEAD || strcmp(sender, u->node_id) != 0) {
        r->count.prefix_stale++;
        return; /* not a node we know alive, or not its own report */
    }
    if (u->key_id != r->hash_key_id) {
        /* Hashes under another key (an earlier router run's): useless. */
        r->count.prefix_stale++;
        return;
    }
    r->count.prefix_updates++;
    if (u->full) {
        set_clear(&n->prefix);
        n->prefix.truncated = false;
        set_marks(&n->prefix, u->added, u->n_added, 0, KVF_PREFIX_IN_POOL);
        apply_tiers(&n->prefix, u);
        n->prefix.synced = true;
        n->prefix.truncated = n->prefix.truncated || u->truncated;
        n->prefix.seq = u->seq;
        n->prefix.resync_asked_ns = 0;
        kvf_log_debug("node %s: prefix listing of %u blocks (tiers included)%s", n->id, n->prefix.n,
                      u->truncated ? " (cut)" : "");
        return;
    }
    if (!n->prefix.synced || u->seq != n->prefix.seq + 1) {
        kvf_log_debug("node %s: prefix update %llu after %llu: asking for a full listing", n->id,
                      (unsigned long long)u->seq, (unsigned long long)n->prefix.seq);
        kvf_router__prefix_resync(r, n);
        return;
    }
    set_marks(&n->prefix, u->removed, u->n_removed, KVF_PREFIX_IN_POOL, 0);
    set_marks(&n->prefix, u->added, u->n_added, 0, KVF_PREFIX_IN_POOL);
    apply_tiers(&n->prefix, u);
    n->prefix.seq = u->seq;
}
