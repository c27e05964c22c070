/* The KV tiers' API, tier 1 (host RAM) and the fetch results
 * (kvf/kv_tier.h; tier 2: kv_tier_disk.c; design: docs/kv-tiers.md).
 *
 * Tier 1 is one slab of ram_cap block slots, allocated at create, with
 * its entries and token ids beside it: a put allocates nothing but hash
 * buckets. Fetch results wait in a ring that each fetch first makes room
 * in (for itself and every disk read in flight), so reporting a result
 * never fails. */
#include "kv_tier_internal.h"

#include "kvf/crc32c.h"
#include "kvf/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

uint32_t kvt_record_crc(uint64_t hash, const uint32_t *tokens, uint32_t bt, const void *bytes,
                        size_t n)
{
    uint32_t crc = kvf_crc32c(0, &hash, sizeof(hash));
    crc = kvf_crc32c(crc, tokens, (size_t)bt * sizeof(*tokens));
    return kvf_crc32c(crc, bytes, n);
}

void kvt_wake(const kvf_kv_tiers_t *t)
{
    uint64_t one = 1;
    /* Fails only when the counter would overflow: it is readable then. */
    if (write(t->event_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        kvf_log_warn("kv tiers: eventfd write: %s", strerror(errno));
}

/* Room in the result ring for this fetch and every disk read in flight. */
static kvf_status_t done_reserve(kvf_kv_tiers_t *t)
{
    size_t need = t->done_len + t->disk.reads_busy + 2;
    if (need <= t->done_cap)
        return KVF_OK;
    size_t cap = t->done_cap ? t->done_cap : 16;
    while (cap < need)
        cap *= 2;
    kvf_kv_fetch_done_t *q = malloc(cap * sizeof(*q));
    if (!q)
        return KVF_ERR_NOMEM;
    for (size_t i = 0; i < t->done_len; i++)
        q[i] = t->done_q[(t->done_head + i) % t->done_cap];
    free(t->done_q);
    t->done_q = q;
    t->done_cap = cap;
    t->done_head = 0;
    return KVF_OK;
}

void kvt_done_push(kvf_kv_tiers_t *t, uint64_t tag, kvf_status_t status, int tier)
{
    KVF_ASSERT(t->done_len < t->done_cap);
    kvf_kv_fetch_done_t *d = &t->done_q[(t->done_head + t->done_len) % t->done_cap];
    d->tag = tag;
    d->status = status;
    d->tier = tier;
    t->done_len++;
}

/* ---- tier 1 ---------------------------------------------------------- */

static uint8_t *ram_bytes(const kvf_kv_tiers_t *t, const kvt_ram_entry_t *e)
{
    return t->ram_data + (size_t)e->slot * t->block_bytes;
}

static uint32_t *ram_tokens(const kvf_kv_tiers_t *t, const kvt_ram_entry_t *e)
{
    return t->ram_tokens + (size_t)e->slot * t->block_tokens;
}

static kvt_ram_entry_t *ram_find_hash(const kvf_kv_tiers_t *t, uint64_t hash)
{
    kvt_ram_entry_t *e;
    HASH_FIND(hh, t->ram_table, &hash, sizeof(hash), e);
    return e;
}

static kvt_ram_entry_t *ram_find(const kvf_kv_tiers_t *t, uint64_t hash, const uint32_t *tokens)
{
    kvt_ram_entry_t *e = ram_find_hash(t, hash);
    if (e && memcmp(ram_tokens(t, e), tokens, (size_t)t->block_tokens * sizeof(*tokens)))
        return NULL;
    return e;
}

static void ram_remove(kvf_kv_tiers_t *t, kvt_ram_entry_t *e)
{
    kvt_touch(t, e->hash);
    HASH_DELETE(hh, t->ram_table, e);
    kvt_lru_unlink(&t->ram_lru, &e->lru);
    e->next_free = t->ram_free;
    t->ram_free = e;
    t->ram_n--;
}

/* Frees tier 1's LRU slot, demoting its block to tier 2 (or dropping it). */
static void ram_demote_lru(kvf_kv_tiers_t *t)
{
    kvt_ram_entry_t *e = KVT_CONTAINER(t->ram_lru.lru, kvt_ram_entry_t, lru);
    if (t->disk.on)
        (void)kvt_disk_store(t, e->hash, ram_tokens(t, e), ram_bytes(t, e), e->crc);
    else
        t->stats.dropped++;
    ram_remove(t, e);
}

static kvf_status_t ram_put(kvf_kv_tiers_t *t, uint64_t hash, const uint32_t *tokens,
                            const void *block)
{
    if (!t->ram_free)
        ram_demote_lru(t);
    kvt_ram_entry_t *e = t->ram_free;
    e->hash = hash;
    kvf_status_t st;
    KVF_HASH_ADD(t->ram_table, hash, e, st);
    if (st != KVF_OK)
        return st;
    t->ram_free = e->next_free;
    memcpy(ram_bytes(t, e), block, t->block_bytes);
    memcpy(ram_tokens(t, e), tokens, (size_t)t->block_tokens * sizeof(*tokens));
    e->crc = kvt_record_crc(hash, tokens, t->block_tokens, block, t->block_bytes);
    kvt_lru_push(&t->ram_lru, &e->lru);
    t->ram_n++;
    kvt_touch(t, hash);
    return KVF_OK;
}

static void ram_fetch(kvf_kv_tiers_t *t, kvt_ram_entry_t *e, void *dst, uint64_t tag)
{
    kvf_status_t st = KVF_OK;
    if (kvt_record_crc(e->hash, ram_tokens(t, e), t->block_tokens, ram_bytes(t, e),
                       t->block_bytes) != e->crc) {
        kvf_log_warn("kv tiers: ram block %016llx failed its crc32c: dropped",
                     (unsigned long long)e->hash);
        st = KVF_ERR_CORRUPT;
        t->stats.corrupt++;
    } else {
        memcpy(dst, ram_bytes(t, e), t->block_bytes);
        t->stats.fetched++;
    }
    t->stats.hits_ram++;
    ram_remove(t, e);
    kvt_done_push(t, tag, st, 1);
    kvt_wake(t);
}

static kvf_status_t ram_create(kvf_kv_tiers_t *t, const kvf_kv_tiers_config_t *cfg, char *why,
                               size_t why_len)
{
    uint64_t host_bytes = cfg->host_bytes, cap = host_bytes / t->block_bytes;
    if (cap > UINT32_MAX - 1)
        cap = UINT32_MAX - 1;
    t->ram_cap = (uint32_t)cap;
    if (!cap)
        return KVF_OK;
    size_t bytes = (size_t)cap * t->block_bytes;
    if (cfg->host_alloc && cfg->host_free) {
        t->ram_data = cfg->host_alloc(cfg->host_arg, bytes);
        if (t->ram_data) {
            t->host_free = cfg->host_free;
            t->host_arg = cfg->host_arg;
        } else {
            kvf_log_warn("kv host tier: the allocator given cannot make %zu bytes: plain "
                         "memory instead", bytes);
        }
    }
    if (!t->ram_data)
        t->ram_data = malloc(bytes);
    t->ram_tokens = malloc((size_t)cap * t->block_tokens * sizeof(uint32_t));
    t->ram_entries = calloc((size_t)cap, sizeof(*t->ram_entries));
    if (!t->ram_data || !t->ram_tokens || !t->ram_entries) {
        snprintf(why, why_len, "kv host tier: cannot allocate %llu bytes",
                 (unsigned long long)host_bytes);
        return KVF_ERR_NOMEM;
    }
    for (uint32_t i = t->ram_cap; i-- > 0;) {
        t->ram_entries[i].slot = i;
        t->ram_entries[i].next_free = t->ram_free;
        t->ram_free = &t->ram_entries[i];
    }
    return KVF_OK;
}

/* ---- API ------------------------------------------------------------- */

kvf_status_t kvf_kv_tiers_create(const kvf_kv_tiers_config_t *cfg, kvf_kv_tiers_t **t_p, char *why,
                                 size_t why_len)
{
    char scratch[1];
    if (!why || !why_len) {
        why = scratch;
        why_len = sizeof(scratch);
    }
    why[0] = '\0';
    if (!cfg || !t_p || !cfg->block_bytes || !cfg->block_tokens) {
        snprintf(why, why_len, "kv tiers: block_bytes and block_tokens must be set");
        kvf_log_error("%s", why);
        return KVF_ERR_INVAL;
    }
    kvf_kv_tiers_t *t = calloc(1, sizeof(*t));
    if (!t) {
        snprintf(why, why_len, "kv tiers: out of memory");
        return KVF_ERR_NOMEM;
    }
    t->block_bytes = cfg->block_bytes;
    t->block_tokens = cfg->block_tokens;
    t->disk.fd = -1;
    kvf_status_t st = KVF_ERR_IO;
    t->event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (t->event_fd < 0) {
        snprintf(why, why_len, "kv tiers: eventfd: %s", strerror(errno));
        goto fail;
    }
    st = ram_create(t, cfg, why, why_len);
    if (st == KVF_OK && kvt_changes_init(&t->changes, cfg->report_cap) != KVF_OK) {
        snprintf(why, why_len, "kv tiers: out of memory");
        st = KVF_ERR_NOMEM;
    }
    if (st != KVF_OK)
        goto fail;
    if (cfg->disk_dir) {
        st = kvt_disk_open(t, cfg, why, why_len);
        if (st != KVF_OK)
            goto fail;
    }
    t->stats.cap_ram = t->ram_cap;
    t->stats.cap_disk = t->disk.cap;
    *t_p = t;
    return KVF_OK;
fail:
    kvf_log_error("%s", why);
    kvf_kv_tiers_destroy(t);
    return st;
}

void kvf_kv_tiers_destroy(kvf_kv_tiers_t *t)
{
    if (!t)
        return;
    kvt_disk_close(t);
    HASH_CLEAR(hh, t->ram_table);
    kvt_changes_fini(&t->changes);
    free(t->ram_entries);
    free(t->ram_tokens);
    if (t->host_free)
        t->host_free(t->host_arg, t->ram_data);
    else
        free(t->ram_data);
    free(t->done_q);
    if (t->event_fd >= 0)
        close(t->event_fd);
    free(t);
}

kvf_status_t kvf_kv_tiers_put(kvf_kv_tiers_t *t, uint64_t hash, const uint32_t *tokens,
                              const void *block)
{
    kvt_disk_reap(t);
    kvt_ram_entry_t *r = ram_find_hash(t, hash);
    if (r && !memcmp(ram_tokens(t, r), tokens, (size_t)t->block_tokens * sizeof(*tokens))) {
        kvt_lru_unlink(&t->ram_lru, &r->lru);
        kvt_lru_push(&t->ram_lru, &r->lru);
        return KVF_OK;
    }
    if (r) /* a collision: the newer block wins */
        ram_remove(t, r);
    kvt_disk_entry_t *d = kvt_disk_find_hash(t, hash);
    if (d) /* a block is in one tier at most: the top one */
        kvt_disk_drop(t, d);
    kvf_status_t st;
    if (t->ram_cap)
        st = ram_put(t, hash, tokens, block);
    else if (t->disk.on)
        st = kvt_disk_store(t, hash, tokens, block,
                            kvt_record_crc(hash, tokens, t->block_tokens, block, t->block_bytes));
    else
        st = KVF_ERR_NO_SPACE;
    if (st == KVF_OK)
        t->stats.puts++;
    return st;
}

int kvf_kv_tiers_lookup(const kvf_kv_tiers_t *t, uint64_t hash, const uint32_t *tokens)
{
    if (ram_find(t, hash, tokens))
        return 1;
    if (kvt_disk_find(t, hash, tokens))
        return 2;
    return 0;
}

kvf_status_t kvf_kv_tiers_fetch(kvf_kv_tiers_t *t, uint64_t hash, const uint32_t *tokens, void *dst,
                                uint64_t tag)
{
    kvt_disk_reap(t);
    kvt_ram_entry_t *r = ram_find(t, hash, tokens);
    kvt_disk_entry_t *d = r ? NULL : kvt_disk_find(t, hash, tokens);
    if (!r && !d)
        return KVF_ERR_NOT_FOUND;
    kvf_status_t st = done_reserve(t);
    if (st != KVF_OK)
        return st;
    if (r) {
        ram_fetch(t, r, dst, tag);
        return KVF_OK;
    }
    return kvt_disk_fetch(t, d, dst, tag);
}

size_t kvf_kv_tiers_poll(kvf_kv_tiers_t *t, kvf_kv_fetch_done_t *out, size_t max)
{
    uint64_t count;
    /* Reset first: what completes after this read makes the fd readable again. */
    if (read(t->event_fd, &count, sizeof(count)) < 0 && errno != EAGAIN)
        kvf_log_warn("kv tiers: eventfd read: %s", strerror(errno));
    kvt_disk_reap(t);
    size_t n = 0;
    while (n < max && t->done_len) {
        out[n++] = t->done_q[t->done_head];
        t->done_head = (t->done_head + 1) % t->done_cap;
        t->done_len--;
    }
    if (t->done_len) /* more than max waited: keep the fd readable */
        kvt_wake(t);
    return n;
}

int kvf_kv_tiers_fd(const kvf_kv_tiers_t *t)
{
    return t->event_fd;
}

void kvf_kv_tiers_flush(kvf_kv_tiers_t *t)
{
    kvt_disk_flush(t);
    kvt_disk_reap(t);
}

bool kvf_kv_tiers_direct_io(const kvf_kv_tiers_t *t)
{
    return t->disk.on && t->disk.direct;
}

void kvf_kv_tiers_stats(const kvf_kv_tiers_t *t, kvf_kv_tiers_stats_t *stats_p)
{
    *stats_p = t->stats;
    stats_p->blocks_ram = t->ram_n;
    stats_p->blocks_disk = t->disk.n_listed;
    stats_p->io_threads = t->disk.on ? t->disk.n_threads : 0;
    stats_p->slot_bytes = t->disk.slot_bytes;
}

size_t kvf_kv_tiers_slot_bytes(const kvf_kv_tiers_t *t)
{
    return t->disk.slot_bytes;
}

void *kvf_kv_tiers_test_ram_block(kvf_kv_tiers_t *t, uint64_t hash)
{
    kvt_ram_entry_t *e = ram_find_hash(t, hash);
    return e ? ram_bytes(t, e) : NULL;
}

void kvf_kv_tiers_test_pause(kvf_kv_tiers_t *t, bool paused)
{
    kvt_disk_pause(t, paused);
}
