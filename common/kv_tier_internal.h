/* What common/kv_tier.c (the API, tier 1, the results) and
 * common/kv_tier_disk.c (tier 2: the file, its slots, the I/O threads)
 * share. Private to them; the API is kvf/kv_tier.h, the design
 * docs/kv-tiers.md. */
#ifndef KVF_KV_TIER_INTERNAL_H
#define KVF_KV_TIER_INTERNAL_H

#include "kvf/hashmap.h"
#include "kvf/kv_tier.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* ---- LRU lists (both tiers) ---------------------------------------- */

typedef struct kvt_lru_node {
    struct kvt_lru_node *prev, *next; /* prev: more recent */
} kvt_lru_node_t;

typedef struct {
    kvt_lru_node_t *mru, *lru;
} kvt_lru_t;

static inline void kvt_lru_unlink(kvt_lru_t *l, kvt_lru_node_t *n)
{
    if (n->prev)
        n->prev->next = n->next;
    else
        l->mru = n->next;
    if (n->next)
        n->next->prev = n->prev;
    else
        l->lru = n->prev;
    n->prev = n->next = NULL;
}

/* Links n (unlinked) at the MRU end. */
static inline void kvt_lru_push(kvt_lru_t *l, kvt_lru_node_t *n)
{
    n->prev = NULL;
    n->next = l->mru;
    if (l->mru)
        l->mru->prev = n;
    else
        l->lru = n;
    l->mru = n;
}

#define KVT_CONTAINER(ptr, type, member) ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

/* ---- tier 1 ---------------------------------------------------------- */

typedef struct kvt_ram_entry {
    uint64_t hash;
    uint32_t crc;  /* kvt_record_crc of hash, tokens and bytes, at put */
    uint32_t slot; /* bytes at ram_data + slot * block_bytes, tokens at ram_tokens + slot * bt */
    kvt_lru_node_t lru;
    struct kvt_ram_entry *next_free;
    UT_hash_handle hh;
} kvt_ram_entry_t;

/* ---- change tracking (kv_tier_report.c) ----------------------------- */

/* A hash whose tier changed since the last report. */
typedef struct kvt_change {
    uint64_t hash;
    struct kvt_change *next_free;
    UT_hash_handle hh;
} kvt_change_t;

typedef struct {
    kvt_change_t *nodes; /* (cap) */
    kvt_change_t *free, *set;
    uint32_t cap;
    bool lost; /* changes were dropped: only a full listing is right */
} kvt_changes_t;

/* ---- tier 2 ---------------------------------------------------------- */

enum { KVT_JOB_WRITE, KVT_JOB_READ };
enum { KVT_JOB_IDLE, KVT_JOB_QUEUED, KVT_JOB_RUNNING, KVT_JOB_DONE }; /* under the disk lock */

/* One disk I/O of a whole slot, with its aligned buffer. */
typedef struct kvt_job {
    int kind;
    int state;
    uint32_t slot;
    uint64_t hash, seq; /* read: what the slot must say */
    uint32_t *tokens;   /* read: (bt) the tokens it must hold */
    uint8_t *buf;       /* (slot_bytes), 4096-aligned */
    void *dst;          /* read: the caller's block_bytes */
    uint64_t tag;
    kvf_status_t status;
    uint64_t queued_ns, run_ns, done_ns; /* read timing: queued at, in pread and check, done at */
    struct kvt_job *prev, *next; /* queue, done list, free lists */
} kvt_job_t;

/* A slot of the file and, while listed, the block in it. */
typedef struct kvt_disk_entry {
    uint64_t hash;
    uint64_t seq;  /* write sequence number of the block in the slot */
    uint32_t slot; /* index: file offset slot * slot_bytes, tokens at disk.tokens + slot * bt */
    bool listed;   /* in the table and the LRU list */
    kvt_job_t *io; /* the write or read using the slot, or NULL */
    kvt_lru_node_t lru;
    struct kvt_disk_entry *next_free;
    UT_hash_handle hh;
} kvt_disk_entry_t;

typedef struct {
    bool on;
    bool direct; /* O_DIRECT in effect */
    int fd;
    char *path;
    uint32_t cap;
    size_t slot_bytes;
    uint64_t next_seq;
    kvt_disk_entry_t *entries; /* (cap) */
    uint32_t *tokens;          /* (cap, bt) */
    kvt_disk_entry_t *table, *free_slots;
    kvt_lru_t lru;
    uint32_t n_listed;
    kvt_job_t *jobs; /* (n_jobs): writes first, then reads */
    uint32_t n_jobs;
    kvt_job_t *free_writes, *free_reads; /* owner only */
    uint32_t reads_busy;                 /* read jobs not free */
    pthread_t *threads;
    unsigned n_threads;
    /* The queue and done list, between the owner and the threads. */
    pthread_mutex_t lock;
    pthread_cond_t work, idle;
    kvt_job_t *q_head, *q_tail, *done;
    unsigned busy; /* jobs queued or running */
    bool stop, paused;
} kvt_disk_t;

struct kvf_kv_tiers {
    size_t block_bytes;
    uint32_t block_tokens;
    int event_fd;
    /* tier 1 */
    uint32_t ram_cap;
    uint8_t *ram_data;    /* (ram_cap, block_bytes), from host_alloc when set */
    void (*host_free)(void *host_arg, void *p);
    void *host_arg;
    uint32_t *ram_tokens; /* (ram_cap, block_tokens) */
    kvt_ram_entry_t *ram_entries, *ram_free, *ram_table;
    kvt_lru_t ram_lru;
    uint32_t ram_n;
    /* tier 2 */
    kvt_disk_t disk;
    /* fetch results not yet polled: a ring */
    kvf_kv_fetch_done_t *done_q;
    size_t done_head, done_len, done_cap;
    kvf_kv_tiers_stats_t stats;
    kvt_changes_t changes;
};

/* CRC32C of a stored block: its hash, its bt token ids, then its n bytes. */
uint32_t kvt_record_crc(uint64_t hash, const uint32_t *tokens, uint32_t bt, const void *bytes,
                        size_t n);

/* Makes the eventfd readable. */
void kvt_wake(const kvf_kv_tiers_t *t);

/* Appends a fetch result (room reserved by the fetch that started it). */
void kvt_done_push(kvf_kv_tiers_t *t, uint64_t tag, kvf_status_t status, int tier);

/* Change tracking (kv_tier_report.c). init: room for cap hashes (0: none
 * tracked, every report is a full listing). touch: hash entered or left a
 * tier (owner only). */
kvf_status_t kvt_changes_init(kvt_changes_t *c, uint32_t cap);
void kvt_changes_fini(kvt_changes_t *c);
void kvt_touch(kvf_kv_tiers_t *t, uint64_t hash);

/* Tier 2 (kv_tier_disk.c). open: creates the file and threads for cfg;
 * messages into why. close: undoes open (safe on a tier never opened). */
kvf_status_t kvt_disk_open(kvf_kv_tiers_t *t, const kvf_kv_tiers_config_t *cfg, char *why,
                           size_t why_len);
void kvt_disk_close(kvf_kv_tiers_t *t);
/* The listed entry for hash with these tokens, or NULL. */
kvt_disk_entry_t *kvt_disk_find(const kvf_kv_tiers_t *t, uint64_t hash, const uint32_t *tokens);
/* The listed entry for hash whatever its tokens, or NULL. */
kvt_disk_entry_t *kvt_disk_find_hash(const kvf_kv_tiers_t *t, uint64_t hash);
/* Unlists e; its slot is free once no I/O uses it. */
void kvt_disk_drop(kvf_kv_tiers_t *t, kvt_disk_entry_t *e);
/* Queues a write of the block (crc from kvt_record_crc) into a slot. */
kvf_status_t kvt_disk_store(kvf_kv_tiers_t *t, uint64_t hash, const uint32_t *tokens,
                            const void *bytes, uint32_t crc);
/* Starts a fetch of listed e into dst. */
kvf_status_t kvt_disk_fetch(kvf_kv_tiers_t *t, kvt_disk_entry_t *e, void *dst, uint64_t tag);
/* Finishes the I/O the threads completed (owner). */
void kvt_disk_reap(kvf_kv_tiers_t *t);
/* Waits until no I/O is queued or running; unpauses. */
void kvt_disk_flush(kvf_kv_tiers_t *t);
void kvt_disk_pause(kvf_kv_tiers_t *t, bool paused);

#endif
