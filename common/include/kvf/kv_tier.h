/* The KV tiers below a node's pool: host RAM (tier 1) and a local disk
 * file (tier 2), holding prefix-cache blocks the pool evicted, checked on
 * every read (common/kv_tier.c, common/kv_tier_disk.c; design:
 * docs/kv-tiers.md).
 *
 * A block is identified as in the prefix cache (kvf/prefix_cache.h): its
 * 64-bit content hash, with its block_tokens token ids kept beside it so
 * an accidental hash collision is a miss, never a wrong block. A block is
 * in at most one tier. put() copies a block leaving the pool into tier 1;
 * tier 1 full, its least recently used block is demoted to tier 2 (an
 * asynchronous write); tier 2 full, its least recently used block is
 * dropped. fetch() copies a block back into a caller's buffer and takes it
 * out of its tier (it is promoted: the caller lists it in its pool cache).
 *
 * Integrity: each stored block carries a CRC32C over its hash, token ids
 * and bytes, computed at put and checked on every fetch, from either tier;
 * a disk slot also carries a header with the hash, its own file offset and
 * a write sequence number, so a slot read from the wrong place, or a slot
 * rewritten since, fails the check. A block failing a check is dropped and
 * reported KVF_ERR_CORRUPT, never copied out as good.
 *
 * Disk I/O: O_DIRECT pread/pwrite of whole 4096-aligned slots on a small
 * pool of threads (io_threads). Chosen over io_uring: liburing is no
 * dependency of the project, and a few threads each with one block-sized
 * request (hundreds of KiB to MiBs) should keep a local NVMe SSD busy; the kernel
 * queues them as deep as the threads go. A filesystem that refuses
 * O_DIRECT (tmpfs) gets buffered I/O, with a warning.
 *
 * Restart: the disk file is reinitialised at create, its old contents
 * discarded. Blocks are keyed by the cluster's hash key, which changes with
 * each router run, so a previous run's blocks could never be hit anyway;
 * rebuilding an index from them would cost a full read for nothing.
 *
 * Thread rules: one owner thread (the node's event loop) calls every
 * function; the disk I/O threads are internal. */
#ifndef KVF_KV_TIER_H
#define KVF_KV_TIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvf/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvf_kv_tiers kvf_kv_tiers_t;

typedef struct {
    uint64_t host_bytes;   /* tier 1 capacity: host_bytes / block_bytes blocks; 0: no tier 1 */
    const char *disk_dir;  /* tier 2 directory (must exist); NULL: no tier 2 */
    uint64_t disk_bytes;   /* tier 2 file size, preallocated; disk_bytes / slot size blocks */
    size_t block_bytes;    /* bytes of one KV block (kvf_kv_block_bytes) */
    uint32_t block_tokens; /* token ids per block (kept for the collision check) */
    unsigned io_threads;   /* disk I/O threads (0: 2) */
    unsigned max_inflight; /* disk writes in flight at most, and reads (0: 16 each) */
    uint32_t report_cap;   /* hashes whose tier changed kept for kvf_kv_tiers_changes (0: none) */
    /* Where tier 1's slab comes from (NULL: malloc and free): a GPU
     * node's pinned host memory (kvf_backend_host_alloc_hook), which the
     * device copies to and from by DMA; host_arg is given to both. */
    void *(*host_alloc)(void *host_arg, size_t bytes);
    void (*host_free)(void *host_arg, void *p);
    void *host_arg;
} kvf_kv_tiers_config_t;

/* The name of the tier 2 file in disk_dir. One tiers object uses a
 * directory at a time: create locks the file (flock), so a second node
 * pointed at the same directory fails with a message instead of
 * clobbering the first's blocks. */
#define KVF_KV_TIER_FILE "kvf-kv-tier.bin"

typedef struct {
    uint32_t blocks_ram, blocks_disk;   /* blocks held now (disk: written or being written) */
    uint32_t cap_ram, cap_disk;         /* blocks each tier holds at most */
    uint64_t puts;                      /* kvf_kv_tiers_put calls that stored a block */
    uint64_t hits_ram, hits_disk;       /* fetches started, per tier */
    uint64_t fetched;                   /* fetches completed good */
    uint64_t corrupt;                   /* blocks that failed a check on fetch (dropped) */
    uint64_t demotions;                 /* tier 1 -> tier 2 writes queued */
    uint64_t demotions_dropped;         /* demotions dropped: writes in flight at the bound */
    uint64_t dropped;                   /* blocks dropped at the bottom tier (LRU, or no tier 2) */
    uint64_t io_errors;                 /* failed disk reads or writes (blocks dropped) */
    uint64_t bytes_written, bytes_read; /* disk bytes, whole slots */
    /* Disk reads completed (good or not, I/O errors aside): their time in
     * pread and the check (read_ns), and from queued to checked
     * (read_wait_ns: behind other I/O too), summed. */
    uint64_t reads, read_ns, read_wait_ns;
    unsigned io_threads; /* disk reads run at once at most (0: no tier 2) */
    size_t slot_bytes;   /* bytes one disk read moves */
} kvf_kv_tiers_stats_t;

/* One fetch's result, from kvf_kv_tiers_poll. status: KVF_OK (dst holds
 * the block), KVF_ERR_CORRUPT (a check failed: the block is dropped, dst
 * holds nothing usable) or KVF_ERR_IO (the read failed, block dropped).
 * tier: where the block was, 1 or 2. */
typedef struct {
    uint64_t tag;
    kvf_status_t status;
    int tier;
} kvf_kv_fetch_done_t;

/* Creates the tiers of cfg (copied; disk_dir is not kept). With disk_dir:
 * creates or truncates disk_dir/KVF_KV_TIER_FILE and preallocates it
 * (posix_fallocate). A missing directory (KVF_ERR_NOT_FOUND), one that
 * cannot be written (KVF_ERR_IO), a file in use by another process
 * (KVF_ERR_AGAIN) or too little space (KVF_ERR_NO_SPACE / KVF_ERR_TOO_BIG)
 * fail with a one-line reason in why (why_len bytes, may be 0); nothing is
 * left behind (the node may retry without disk_dir: RAM only). On success
 * *t_p is the caller's: kvf_kv_tiers_destroy(). */
kvf_status_t kvf_kv_tiers_create(const kvf_kv_tiers_config_t *cfg, kvf_kv_tiers_t **t_p, char *why,
                                 size_t why_len);

/* Stops the I/O threads (queued I/O is abandoned, running I/O finishes),
 * removes the disk file and frees everything. Fetches not yet reported
 * never are: their dst buffers are the caller's again once this returns.
 * NULL is a no-op. */
void kvf_kv_tiers_destroy(kvf_kv_tiers_t *t);

/* Stores a block leaving the pool: block (block_bytes, borrowed for the
 * call only) and tokens (block_tokens ids) are copied now. A hash held
 * already with these tokens is only marked most recently used; with other
 * tokens (a collision) the new block replaces it. Tier 1 full: its LRU
 * block is demoted to tier 2 (with disk writes at max_inflight, the oldest
 * queued demotion is dropped instead of waiting); no tier 2: dropped. With
 * no tier 1 the block goes to tier 2 directly. KVF_ERR_NO_SPACE when there
 * is no tier at all, or no tier 2 slot is free of I/O (block dropped). */
kvf_status_t kvf_kv_tiers_put(kvf_kv_tiers_t *t, uint64_t hash, const uint32_t *tokens,
                              const void *block);

/* Which tier holds hash with these tokens: 0 none, 1 RAM, 2 disk. No I/O,
 * no LRU change. */
int kvf_kv_tiers_lookup(const kvf_kv_tiers_t *t, uint64_t hash, const uint32_t *tokens);

/* Starts copying hash's block (with these tokens) into dst (block_bytes;
 * the caller's, not touched by it until the fetch is reported), to be
 * reported by kvf_kv_tiers_poll with tag. A RAM fetch copies at once but
 * is still reported by poll. The block leaves its tier now, whatever the
 * outcome. KVF_ERR_NOT_FOUND: not held (lookup 0); KVF_ERR_AGAIN: every
 * disk read buffer busy (nothing changed: retry after a poll). */
kvf_status_t kvf_kv_tiers_fetch(kvf_kv_tiers_t *t, uint64_t hash, const uint32_t *tokens, void *dst,
                                uint64_t tag);

/* Finishes completed disk I/O and writes up to max fetch results to out;
 * returns how many. Never blocks. */
size_t kvf_kv_tiers_poll(kvf_kv_tiers_t *t, kvf_kv_fetch_done_t *out, size_t max);

/* An eventfd, readable when poll has work (a fetch result or finished
 * disk I/O): for the owner's event loop. Owned by t. */
int kvf_kv_tiers_fd(const kvf_kv_tiers_t *t);

/* Lets paused I/O threads go (kvf_kv_tiers_test_pause) and blocks until
 * no disk I/O is queued or running, then finishes it: the stats count it,
 * and poll reports every fetch started before. For shutdown paths and
 * tests. */
void kvf_kv_tiers_flush(kvf_kv_tiers_t *t);

/* Whether tier 2 uses O_DIRECT (false: buffered fallback, or no tier 2). */
bool kvf_kv_tiers_direct_io(const kvf_kv_tiers_t *t);

void kvf_kv_tiers_stats(const kvf_kv_tiers_t *t, kvf_kv_tiers_stats_t *stats_p);

/* ---- reports: which hashes are where (common/kv_tier_report.c) ------- */

/* Where hashes are now: ram, disk and gone (in neither tier), caller's
 * arrays of cap hashes each, filled to n_*. */
typedef struct {
    uint64_t *ram, *disk, *gone;
    uint32_t n_ram, n_disk, n_gone;
} kvf_kv_tier_changes_t;

/* The hashes whose tier changed since the last call (or list), each in
 * the list of the tier that holds it now, up to cap per list. Returns true
 * when some were lost (more changed than report_cap, or a list outgrew
 * cap, or no report_cap): the caller then lists everything
 * (kvf_kv_tiers_list); nothing is consumed. False consumes them. A hash
 * that moved and came back is reported where it is (a harmless repeat). */
bool kvf_kv_tiers_changes(kvf_kv_tiers_t *t, kvf_kv_tier_changes_t *ch, uint32_t cap);

/* Every hash tier 1 holds into ram_p and tier 2 into disk_p, up to cap in
 * all (RAM first); *n_ram_p / *n_disk_p their counts. Returns how many the
 * tiers hold in total (may exceed cap). Clears the pending changes. */
uint32_t kvf_kv_tiers_list(kvf_kv_tiers_t *t, uint64_t *ram_p, uint32_t *n_ram_p,
                           uint64_t *disk_p, uint32_t *n_disk_p, uint32_t cap);

/* ---- test hooks ------------------------------------------------------ */

/* The bytes tier 1 stores for hash (block_bytes), or NULL when tier 1
 * does not hold it: lets a test corrupt a RAM block. */
void *kvf_kv_tiers_test_ram_block(kvf_kv_tiers_t *t, uint64_t hash);

/* The file offset of hash's tier 2 slot into *off_p: KVF_ERR_NOT_FOUND
 * when tier 2 does not hold it. Lets a test corrupt a disk block. */
kvf_status_t kvf_kv_tiers_test_disk_offset(const kvf_kv_tiers_t *t, uint64_t hash, uint64_t *off_p);

/* Bytes of one tier 2 slot (a multiple of 4096). */
size_t kvf_kv_tiers_slot_bytes(const kvf_kv_tiers_t *t);

/* Holds the I/O threads (paused: they start no queued I/O) or lets them
 * go, so a test can fill the write queue deterministically. */
void kvf_kv_tiers_test_pause(kvf_kv_tiers_t *t, bool paused);

#ifdef __cplusplus
}
#endif

#endif
