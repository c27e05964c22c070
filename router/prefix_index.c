/* The router's prefix index: for each node, the hashes of the KV blocks it
 * reported cached (PrefixUpdate), so that route.c can send a request where
 * its prefix already is (docs/prefix-cache.md, "Routing").
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

static void set_add(kvf_node_prefix_index_t *ix, uint64_t hash)
{
    kvf_prefix_entry_t *e;
    HASH_FIND(hh, ix->set, &hash, sizeof(hash), e);
    if (e)
        return;
    if (ix->n >= PREFIX_MAX_PER_NODE) {
        ix->truncated = true;
        return;
    }
    e = malloc(sizeof(*e));
    if (!e)
        return; /* a hint lost: routing may miss this block, nothing else */
    e->hash = hash;
    HASH_ADD(hh, ix->set, hash, sizeof(e->hash), e);
    ix->n++;
}

static void set_remove(kvf_node_prefix_index_t *ix, uint64_t hash)
{
    kvf_prefix_entry_t *e;
    HASH_FIND(hh, ix->set, &hash, sizeof(hash), e);
    if (!e)
        return;
    HASH_DEL(ix->set, e);
    free(e);
    ix->n--;
}

uint32_t kvf_router__prefix_hits(const kvf_router_node_t *n, const uint64_t *hashes, uint32_t count)
{
    uint32_t i = 0;
    for (; i < count; i++) {
        const kvf_prefix_entry_t *e;
        HASH_FIND(hh, n->prefix.set, &hashes[i], sizeof(hashes[i]), e);
        if (!e)
            break;
    }
    return i;
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
        for (size_t i = 0; i < u->n_added; i++)
            set_add(&n->prefix, u->added[i]);
        n->prefix.synced = true;
        n->prefix.truncated = u->truncated;
        n->prefix.seq = u->seq;
        n->prefix.resync_asked_ns = 0;
        kvf_log_debug("node %s: prefix listing of %u blocks%s", n->id, n->prefix.n,
                      u->truncated ? " (cut)" : "");
        return;
    }
    if (!n->prefix.synced || u->seq != n->prefix.seq + 1) {
        kvf_log_debug("node %s: prefix update %llu after %llu: asking for a full listing", n->id,
                      (unsigned long long)u->seq, (unsigned long long)n->prefix.seq);
        kvf_router__prefix_resync(r, n);
        return;
    }
    for (size_t i = 0; i < u->n_removed; i++)
        set_remove(&n->prefix, u->removed[i]);
    for (size_t i = 0; i < u->n_added; i++)
        set_add(&n->prefix, u->added[i]);
    n->prefix.seq = u->seq;
}
