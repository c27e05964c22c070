/* Which hashes the KV tiers hold where, for the node's prefix reports to
 * the router (kvf/kv_tier.h, "reports"; docs/kv-tiers.md, "Reports").
 *
 * Every change of a hash's tier (a put, a demotion, a drop, a fetch)
 * touches it: it joins a set of changed hashes drawn from a slab of
 * report_cap nodes, allocated at create. A report reads each changed
 * hash's tier as it is now, so a hash that moved twice between two reports
 * is reported once, where it is; the set never needs the moves in order.
 * The set full, it is dropped and marked lost: the next report is a full
 * listing. */
#include "kv_tier_internal.h"

#include <stdlib.h>

kvf_status_t kvt_changes_init(kvt_changes_t *c, uint32_t cap)
{
    c->cap = cap;
    c->lost = true; /* nothing reported yet: the first report lists */
    if (!cap)
        return KVF_OK;
    c->nodes = calloc(cap, sizeof(*c->nodes));
    if (!c->nodes)
        return KVF_ERR_NOMEM;
    for (uint32_t i = cap; i-- > 0;) {
        c->nodes[i].next_free = c->free;
        c->free = &c->nodes[i];
    }
    return KVF_OK;
}

static void changes_clear(kvt_changes_t *c)
{
    kvt_change_t *e, *tmp;
    HASH_ITER(hh, c->set, e, tmp)
    {
        HASH_DELETE(hh, c->set, e);
        e->next_free = c->free;
        c->free = e;
    }
}

void kvt_changes_fini(kvt_changes_t *c)
{
    HASH_CLEAR(hh, c->set);
    free(c->nodes);
    c->nodes = c->free = NULL;
}

void kvt_touch(kvf_kv_tiers_t *t, uint64_t hash)
{
    kvt_changes_t *c = &t->changes;
    if (c->lost)
        return;
    kvt_change_t *e;
    HASH_FIND(hh, c->set, &hash, sizeof(hash), e);
    if (e)
        return;
    e = c->free;
    kvf_status_t st = KVF_ERR_NO_SPACE;
    if (e) {
        e->hash = hash;
        KVF_HASH_ADD(c->set, hash, e, st);
    }
    if (st != KVF_OK) {
        changes_clear(c);
        c->lost = true;
        return;
    }
    c->free = e->next_free;
}

/* 1, 2, or 0: where hash is now, whatever its tokens. */
static int tier_of(const kvf_kv_tiers_t *t, uint64_t hash)
{
    kvt_ram_entry_t *r;
    HASH_FIND(hh, t->ram_table, &hash, sizeof(hash), r);
    if (r)
        return 1;
    return kvt_disk_find_hash(t, hash) ? 2 : 0;
}

bool kvf_kv_tiers_changes(kvf_kv_tiers_t *t, kvf_kv_tier_changes_t *ch, uint32_t cap)
{
    kvt_disk_reap(t);
    kvt_changes_t *c = &t->changes;
    ch->n_ram = ch->n_disk = ch->n_gone = 0;
    if (c->lost)
        return true;
    for (const kvt_change_t *e = c->set; e; e = e->hh.next) {
        int tier = tier_of(t, e->hash);
        uint64_t *list = tier == 1 ? ch->ram : tier == 2 ? ch->disk : ch->gone;
        uint32_t *n = tier == 1 ? &ch->n_ram : tier == 2 ? &ch->n_disk : &ch->n_gone;
        if (*n == cap) {
            ch->n_ram = ch->n_disk = ch->n_gone = 0;
            return true;
        }
        list[(*n)++] = e->hash;
    }
    changes_clear(c);
    return false;
}

uint32_t kvf_kv_tiers_list(kvf_kv_tiers_t *t, uint64_t *ram_p, uint32_t *n_ram_p,
                           uint64_t *disk_p, uint32_t *n_disk_p, uint32_t cap)
{
    kvt_disk_reap(t);
    uint32_t n = 0, total = 0;
    for (const kvt_ram_entry_t *e = t->ram_table; e; e = e->hh.next, total++)
        if (n < cap)
            ram_p[n++] = e->hash;
    *n_ram_p = n;
    uint32_t m = 0;
    if (t->disk.on)
        for (const kvt_disk_entry_t *e = t->disk.table; e; e = e->hh.next, total++)
            if (n + m < cap)
                disk_p[m++] = e->hash;
    *n_disk_p = m;
    changes_clear(&t->changes);
    t->changes.lost = !t->changes.cap;
    return total;
}
