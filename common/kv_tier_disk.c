/* Tier 2 of the KV tiers: one preallocated file of fixed-size slots, read
 * and written whole by a few I/O threads (kvf/kv_tier.h; design:
 * docs/kv-tiers.md).
 *
 * A slot is a 64-byte header, the block's token ids, then its bytes,
 * rounded up to 4096 so every O_DIRECT transfer is aligned. The header
 * names the block (hash), the slot (its own file offset) and the write
 * (a sequence number unique within this run), with the data's CRC32C and
 * a CRC32C of the header itself; a read checks all of them against what
 * the index expects, so a torn, stale, misplaced or flipped slot is
 * refused. Fields are in host byte order: the file is this process's
 * alone and discarded at the next create.
 *
 * Jobs (one buffer each, max_inflight for writes and as many for reads)
 * are the only I/O memory, allocated at create. The owner fills a job and
 * queues it; a thread runs it and moves it to the done list; the owner
 * reaps the done list (kvt_disk_reap) on every call. A slot is reused only
 * when it is unlisted and no job uses it. */
#include "kv_tier_internal.h"

#include "kvf/clock.h"
#include "kvf/crc32c.h"
#include "kvf/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define KVT_ALIGN 4096u
#define KVT_MAGIC 0x3172656974766b00ull /* "\0kvtier1" read as a little-endian u64 */

typedef struct {
    uint64_t magic;
    uint64_t hash;
    uint64_t offset; /* the slot's own file offset */
    uint64_t seq;
    uint64_t block_bytes;
    uint32_t block_tokens;
    uint32_t data_crc;   /* kvt_record_crc of hash, tokens, bytes */
    uint32_t header_crc; /* CRC32C of the fields above */
    uint32_t pad[3];
} kvt_slot_header_t;
_Static_assert(sizeof(kvt_slot_header_t) == 64, "the slot header is 64 bytes");

#define KVT_HEADER_CRC_BYTES offsetof(kvt_slot_header_t, header_crc)

static uint64_t slot_offset(const kvt_disk_t *d, uint32_t slot)
{
    return (uint64_t)slot * d->slot_bytes;
}

/* ---- the slot format ------------------------------------------------ */

static void slot_fill(const kvf_kv_tiers_t *t, uint8_t *buf, uint32_t slot, uint64_t hash,
                      uint64_t seq, const uint32_t *tokens, const void *bytes, uint32_t crc)
{
    kvt_slot_header_t h = {.magic = KVT_MAGIC,
                           .hash = hash,
                           .offset = slot_offset(&t->disk, slot),
                           .seq = seq,
                           .block_bytes = t->block_bytes,
                           .block_tokens = t->block_tokens,
                           .data_crc = crc};
    h.header_crc = kvf_crc32c(0, &h, KVT_HEADER_CRC_BYTES);
    memcpy(buf, &h, sizeof(h));
    size_t tok_bytes = (size_t)t->block_tokens * sizeof(uint32_t);
    memcpy(buf + sizeof(h), tokens, tok_bytes);
    memcpy(buf + sizeof(h) + tok_bytes, bytes, t->block_bytes);
}

/* Checks a slot read back against what the index expects; on success
 * copies its block bytes to dst. Called by the I/O threads and the owner
 * (on const state only). */
static kvf_status_t slot_check(const kvf_kv_tiers_t *t, const uint8_t *buf, uint32_t slot,
                               uint64_t hash, uint64_t seq, const uint32_t *tokens, void *dst)
{
    kvt_slot_header_t h;
    memcpy(&h, buf, sizeof(h));
    size_t tok_bytes = (size_t)t->block_tokens * sizeof(uint32_t);
    const uint8_t *bytes = buf + sizeof(h) + tok_bytes;
    if (h.header_crc != kvf_crc32c(0, &h, KVT_HEADER_CRC_BYTES) || h.magic != KVT_MAGIC ||
        h.offset != slot_offset(&t->disk, slot) || h.seq != seq || h.hash != hash ||
        h.block_bytes != t->block_bytes || h.block_tokens != t->block_tokens ||
        memcmp(buf + sizeof(h), tokens, tok_bytes) ||
        kvt_record_crc(hash, tokens, t->block_tokens, bytes, t->block_bytes) != h.data_crc) {
        kvf_log_warn("kv tiers: disk block %016llx at offset %llu failed its checks: dropped",
                     (unsigned long long)hash, (unsigned long long)slot_offset(&t->disk, slot));
        return KVF_ERR_CORRUPT;
    }
    memcpy(dst, bytes, t->block_bytes);
    return KVF_OK;
}

/* ---- the I/O threads ------------------------------------------------ */

static kvf_status_t io_full(int fd, bool write_it, uint8_t *buf, size_t len, uint64_t off)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = write_it ? pwrite(fd, buf + done, len - done, (off_t)(off + done))
                             : pread(fd, buf + done, len - done, (off_t)(off + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            kvf_log_warn("kv tiers: disk %s at offset %llu: %s", write_it ? "write" : "read",
                         (unsigned long long)off, n < 0 ? strerror(errno) : "end of file");
            return KVF_ERR_IO;
        }
        done += (size_t)n;
    }
    return KVF_OK;
}

static void job_run(kvf_kv_tiers_t *t, kvt_job_t *j)
{
    kvt_disk_t *d = &t->disk;
    uint64_t off = slot_offset(d, j->slot), start = kvf_clock_ns();
    j->status = io_full(d->fd, j->kind == KVT_JOB_WRITE, j->buf, d->slot_bytes, off);
    if (j->status == KVF_OK && j->kind == KVT_JOB_READ)
        j->status = slot_check(t, j->buf, j->slot, j->hash, j->seq, j->tokens, j->dst);
    j->done_ns = kvf_clock_ns();
    j->run_ns = j->done_ns - start;
}

static void *io_thread(void *arg)
{
    kvf_kv_tiers_t *t = arg;
    kvt_disk_t *d = &t->disk;
    pthread_mutex_lock(&d->lock);
    for (;;) {
        while (!d->stop && (d->paused || !d->q_head))
            pthread_cond_wait(&d->work, &d->lock);
        if (d->stop)
            break;
        kvt_job_t *j = d->q_head;
        d->q_head = j->next;
        if (d->q_head)
            d->q_head->prev = NULL;
        else
            d->q_tail = NULL;
        j->state = KVT_JOB_RUNNING;
        pthread_mutex_unlock(&d->lock);
        job_run(t, j);
        pthread_mutex_lock(&d->lock);
        j->state = KVT_JOB_DONE;
        j->next = d->done;
        d->done = j;
        if (--d->busy == 0)
            pthread_cond_broadcast(&d->idle);
        kvt_wake(t);
    }
    pthread_mutex_unlock(&d->lock);
    return NULL;
}

static void job_queue(kvt_disk_t *d, kvt_job_t *j)
{
    j->queued_ns = kvf_clock_ns();
    pthread_mutex_lock(&d->lock);
    j->state = KVT_JOB_QUEUED;
    j->next = NULL;
    j->prev = d->q_tail;
    if (d->q_tail)
        d->q_tail->next = j;
    else
        d->q_head = j;
    d->q_tail = j;
    d->busy++;
    pthread_cond_signal(&d->work);
    pthread_mutex_unlock(&d->lock);
}

/* Takes j out of the queue if no thread started it; true when it did. */
static bool job_cancel(kvt_disk_t *d, kvt_job_t *j)
{
    pthread_mutex_lock(&d->lock);
    bool queued = j->state == KVT_JOB_QUEUED;
    if (queued) {
        if (j->prev)
            j->prev->next = j->next;
        else
            d->q_head = j->next;
        if (j->next)
            j->next->prev = j->prev;
        else
            d->q_tail = j->prev;
        j->state = KVT_JOB_IDLE;
        if (--d->busy == 0)
            pthread_cond_broadcast(&d->idle);
    }
    pthread_mutex_unlock(&d->lock);
    return queued;
}

/* ---- slots and entries (owner) -------------------------------------- */

static void slot_free(kvt_disk_t *d, kvt_disk_entry_t *e)
{
    e->next_free = d->free_slots;
    d->free_slots = e;
}

static void write_job_free(kvt_disk_t *d, kvt_job_t *j)
{
    j->state = KVT_JOB_IDLE;
    j->next = d->free_writes;
    d->free_writes = j;
}

kvt_disk_entry_t *kvt_disk_find_hash(const kvf_kv_tiers_t *t, uint64_t hash)
{
    kvt_disk_entry_t *e;
    if (!t->disk.on)
        return NULL;
    HASH_FIND(hh, t->disk.table, &hash, sizeof(hash), e);
    return e;
}

kvt_disk_entry_t *kvt_disk_find(const kvf_kv_tiers_t *t, uint64_t hash, const uint32_t *tokens)
{
    kvt_disk_entry_t *e = kvt_disk_find_hash(t, hash);
    size_t tok_bytes = (size_t)t->block_tokens * sizeof(uint32_t);
    if (e && memcmp(t->disk.tokens + (size_t)e->slot * t->block_tokens, tokens, tok_bytes))
        return NULL;
    return e;
}

static void entry_unlist(kvf_kv_tiers_t *t, kvt_disk_entry_t *e)
{
    kvt_disk_t *d = &t->disk;
    kvt_touch(t, e->hash);
    HASH_DELETE(hh, d->table, e);
    kvt_lru_unlink(&d->lru, &e->lru);
    e->listed = false;
    d->n_listed--;
}

void kvt_disk_drop(kvf_kv_tiers_t *t, kvt_disk_entry_t *e)
{
    kvt_disk_t *d = &t->disk;
    entry_unlist(t, e);
    if (e->io && e->io->kind == KVT_JOB_WRITE && job_cancel(d, e->io)) {
        write_job_free(d, e->io);
        e->io = NULL;
    }
    if (!e->io)
        slot_free(d, e);
}

/* A free slot, dropping tier 2's least recently used idle block if none
 * is free; NULL when every slot has I/O on it. */
static kvt_disk_entry_t *slot_take(kvf_kv_tiers_t *t)
{
    kvt_disk_t *d = &t->disk;
    if (!d->free_slots) {
        for (kvt_lru_node_t *n = d->lru.lru; n; n = n->prev) {
            kvt_disk_entry_t *e = KVT_CONTAINER(n, kvt_disk_entry_t, lru);
            if (!e->io) {
                kvt_disk_drop(t, e);
                t->stats.dropped++;
                break;
            }
        }
    }
    kvt_disk_entry_t *e = d->free_slots;
    if (e)
        d->free_slots = e->next_free;
    return e;
}

/* A free write job; with every one in flight, the oldest still queued is
 * cancelled and its block dropped. NULL when all are running. */
static kvt_job_t *write_job_take(kvf_kv_tiers_t *t)
{
    kvt_disk_t *d = &t->disk;
    if (!d->free_writes) {
        kvt_job_t *oldest = NULL;
        pthread_mutex_lock(&d->lock);
        for (kvt_job_t *j = d->q_head; j && !oldest; j = j->next)
            if (j->kind == KVT_JOB_WRITE)
                oldest = j;
        pthread_mutex_unlock(&d->lock);
        /* Only the owner adds to or cancels from the queue: oldest cannot
         * be cancelled by anyone else in between, only started. */
        if (oldest && job_cancel(d, oldest)) {
            kvt_disk_entry_t *e = &d->entries[oldest->slot];
            e->io = NULL;
            if (e->listed)
                entry_unlist(t, e);
            slot_free(d, e);
            write_job_free(d, oldest);
            t->stats.demotions_dropped++;
        }
    }
    kvt_job_t *j = d->free_writes;
    if (j)
        d->free_writes = j->next;
    return j;
}

kvf_status_t kvt_disk_store(kvf_kv_tiers_t *t, uint64_t hash, const uint32_t *tokens,
                            const void *bytes, uint32_t crc)
{
    kvt_disk_t *d = &t->disk;
    kvt_job_t *j = write_job_take(t);
    if (!j) {
        t->stats.demotions_dropped++;
        return KVF_ERR_NO_SPACE;
    }
    kvt_disk_entry_t *e = slot_take(t);
    if (!e) {
        write_job_free(d, j);
        t->stats.dropped++;
        return KVF_ERR_NO_SPACE;
    }
    e->hash = hash;
    kvf_status_t st;
    KVF_HASH_ADD(d->table, hash, e, st);
    if (st != KVF_OK) {
        slot_free(d, e);
        write_job_free(d, j);
        t->stats.dropped++;
        return st;
    }
    e->seq = ++d->next_seq;
    e->listed = true;
    e->io = j;
    kvt_lru_push(&d->lru, &e->lru);
    d->n_listed++;
    kvt_touch(t, hash);
    memcpy(d->tokens + (size_t)e->slot * t->block_tokens, tokens,
           (size_t)t->block_tokens * sizeof(uint32_t));
    j->slot = e->slot;
    slot_fill(t, j->buf, e->slot, hash, e->seq, tokens, bytes, crc);
    t->stats.demotions++;
    job_queue(d, j);
    return KVF_OK;
}

kvf_status_t kvt_disk_fetch(kvf_kv_tiers_t *t, kvt_disk_entry_t *e, void *dst, uint64_t tag)
{
    kvt_disk_t *d = &t->disk;
    const uint32_t *tokens = d->tokens + (size_t)e->slot * t->block_tokens;
    if (e->io) {
        /* Still being written: the write's buffer holds the slot. */
        kvf_status_t st = slot_check(t, e->io->buf, e->slot, e->hash, e->seq, tokens, dst);
        t->stats.hits_disk++;
        if (st == KVF_OK)
            t->stats.fetched++;
        else
            t->stats.corrupt++;
        kvt_disk_drop(t, e);
        kvt_done_push(t, tag, st, 2);
        kvt_wake(t);
        return KVF_OK;
    }
    kvt_job_t *j = d->free_reads;
    if (!j)
        return KVF_ERR_AGAIN;
    d->free_reads = j->next;
    d->reads_busy++;
    j->slot = e->slot;
    j->hash = e->hash;
    j->seq = e->seq;
    memcpy(j->tokens, tokens, (size_t)t->block_tokens * sizeof(uint32_t));
    j->dst = dst;
    j->tag = tag;
    entry_unlist(t, e);
    e->io = j;
    t->stats.hits_disk++;
    job_queue(d, j);
    return KVF_OK;
}

static void reap_one(kvf_kv_tiers_t *t, kvt_job_t *j)
{
    kvt_disk_t *d = &t->disk;
    kvt_disk_entry_t *e = &d->entries[j->slot];
    e->io = NULL;
    if (j->status != KVF_ERR_IO)
        *(j->kind == KVT_JOB_WRITE ? &t->stats.bytes_written : &t->stats.bytes_read) +=
            d->slot_bytes;
    else
        t->stats.io_errors++;
    if (j->kind == KVT_JOB_WRITE) {
        if (j->status != KVF_OK && e->listed)
            entry_unlist(t, e);
        write_job_free(d, j);
    } else {
        if (j->status != KVF_ERR_IO) {
            t->stats.reads++;
            t->stats.read_ns += j->run_ns;
            t->stats.read_wait_ns += j->done_ns - j->queued_ns;
        }
        if (j->status == KVF_OK)
            t->stats.fetched++;
        else if (j->status == KVF_ERR_CORRUPT)
            t->stats.corrupt++;
        kvt_done_push(t, j->tag, j->status, 2);
        j->state = KVT_JOB_IDLE;
        j->next = d->free_reads;
        d->free_reads = j;
        d->reads_busy--;
    }
    if (!e->listed)
        slot_free(d, e);
}

void kvt_disk_reap(kvf_kv_tiers_t *t)
{
    kvt_disk_t *d = &t->disk;
    if (!d->on)
        return;
    pthread_mutex_lock(&d->lock);
    kvt_job_t *done = d->done;
    d->done = NULL;
    pthread_mutex_unlock(&d->lock);
    while (done) {
        kvt_job_t *next = done->next;
        reap_one(t, done);
        done = next;
    }
}

void kvt_disk_flush(kvf_kv_tiers_t *t)
{
    kvt_disk_t *d = &t->disk;
    if (!d->on)
        return;
    pthread_mutex_lock(&d->lock);
    d->paused = false;
    pthread_cond_broadcast(&d->work);
    while (d->busy)
        pthread_cond_wait(&d->idle, &d->lock);
    pthread_mutex_unlock(&d->lock);
}

kvf_status_t kvf_kv_tiers_test_disk_offset(const kvf_kv_tiers_t *t, uint64_t hash, uint64_t *off_p)
{
    const kvt_disk_entry_t *e = kvt_disk_find_hash(t, hash);
    if (!e)
        return KVF_ERR_NOT_FOUND;
    *off_p = slot_offset(&t->disk, e->slot);
    return KVF_OK;
}

void kvt_disk_pause(kvf_kv_tiers_t *t, bool paused)
{
    kvt_disk_t *d = &t->disk;
    if (!d->on)
        return;
    pthread_mutex_lock(&d->lock);
    d->paused = paused;
    pthread_cond_broadcast(&d->work);
    pthread_mutex_unlock(&d->lock);
}

/* ---- create and destroy --------------------------------------------- */

/* Opens, locks, truncates and preallocates the file; a probe write of
 * slot 0 turns O_DIRECT off where the filesystem refuses it. */
static kvf_status_t file_open(kvf_kv_tiers_t *t, const char *dir, char *why, size_t why_len)
{
    kvt_disk_t *d = &t->disk;
    d->fd = open(d->path, O_RDWR | O_CREAT | O_CLOEXEC | O_DIRECT, 0600);
    d->direct = d->fd >= 0;
    if (d->fd < 0 && errno == EINVAL)
        d->fd = open(d->path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (d->fd < 0) {
        int err = errno;
        snprintf(why, why_len, "kv disk tier: cannot create %s: %s%s", d->path, strerror(err),
                 err == EACCES || err == EROFS || err == EPERM ? " (read-only directory?)" : "");
        return err == ENOENT || err == ENOTDIR ? KVF_ERR_NOT_FOUND : KVF_ERR_IO;
    }
    if (flock(d->fd, LOCK_EX | LOCK_NB) < 0) {
        snprintf(why, why_len, "kv disk tier: %s is in use by another process (flock: %s)", d->path,
                 strerror(errno));
        close(d->fd);
        d->fd = -1; /* not ours to remove */
        return KVF_ERR_AGAIN;
    }
    uint64_t size = (uint64_t)d->cap * d->slot_bytes;
    int err = ftruncate(d->fd, 0) < 0 ? errno : posix_fallocate(d->fd, 0, (off_t)size);
    if (err) {
        snprintf(why, why_len, "kv disk tier: cannot reserve %llu bytes for %s in %s: %s",
                 (unsigned long long)size, KVF_KV_TIER_FILE, dir, strerror(err));
        return err == ENOSPC ? KVF_ERR_NO_SPACE : err == EFBIG ? KVF_ERR_TOO_BIG : KVF_ERR_IO;
    }
    uint8_t *probe = d->jobs[0].buf; /* zeroed: a slot no header check accepts */
    if (d->direct && pwrite(d->fd, probe, d->slot_bytes, 0) < 0 && errno == EINVAL) {
        int fl = fcntl(d->fd, F_GETFL);
        if (fl < 0 || fcntl(d->fd, F_SETFL, fl & ~O_DIRECT) < 0) {
            snprintf(why, why_len, "kv disk tier: %s: cannot turn O_DIRECT off: %s", d->path,
                     strerror(errno));
            return KVF_ERR_IO;
        }
        d->direct = false;
    }
    if (!d->direct)
        kvf_log_warn("kv disk tier: %s does not take O_DIRECT: buffered i/o (the page cache "
                     "holds a second copy of what is read and written)",
                     dir);
    if (pwrite(d->fd, probe, d->slot_bytes, 0) < 0) {
        snprintf(why, why_len, "kv disk tier: cannot write %s: %s", d->path, strerror(errno));
        return KVF_ERR_IO;
    }
    return KVF_OK;
}

static kvf_status_t jobs_create(kvf_kv_tiers_t *t, unsigned per_kind)
{
    kvt_disk_t *d = &t->disk;
    d->n_jobs = 2 * per_kind;
    d->jobs = calloc(d->n_jobs, sizeof(*d->jobs));
    if (!d->jobs)
        return KVF_ERR_NOMEM;
    for (uint32_t i = d->n_jobs; i-- > 0;) {
        kvt_job_t *j = &d->jobs[i];
        void *buf;
        if (posix_memalign(&buf, KVT_ALIGN, d->slot_bytes))
            return KVF_ERR_NOMEM;
        j->buf = buf;
        memset(j->buf, 0, d->slot_bytes);
        j->kind = i < per_kind ? KVT_JOB_WRITE : KVT_JOB_READ;
        if (j->kind == KVT_JOB_WRITE) {
            write_job_free(d, j);
        } else {
            j->tokens = malloc((size_t)t->block_tokens * sizeof(uint32_t));
            if (!j->tokens)
                return KVF_ERR_NOMEM;
            j->next = d->free_reads;
            d->free_reads = j;
        }
    }
    return KVF_OK;
}

static kvf_status_t slots_create(kvf_kv_tiers_t *t)
{
    kvt_disk_t *d = &t->disk;
    d->entries = calloc(d->cap, sizeof(*d->entries));
    d->tokens = malloc((size_t)d->cap * t->block_tokens * sizeof(uint32_t));
    if (!d->entries || !d->tokens)
        return KVF_ERR_NOMEM;
    for (uint32_t i = d->cap; i-- > 0;) {
        d->entries[i].slot = i;
        slot_free(d, &d->entries[i]);
    }
    return KVF_OK;
}

static kvf_status_t threads_start(kvf_kv_tiers_t *t, unsigned n, char *why, size_t why_len)
{
    kvt_disk_t *d = &t->disk;
    d->threads = calloc(n, sizeof(*d->threads));
    if (!d->threads)
        return KVF_ERR_NOMEM;
    for (; d->n_threads < n; d->n_threads++) {
        int err = pthread_create(&d->threads[d->n_threads], NULL, io_thread, t);
        if (err) {
            snprintf(why, why_len, "kv disk tier: cannot start an i/o thread: %s", strerror(err));
            return KVF_ERR_NOMEM;
        }
    }
    return KVF_OK;
}

kvf_status_t kvt_disk_open(kvf_kv_tiers_t *t, const kvf_kv_tiers_config_t *cfg, char *why,
                           size_t why_len)
{
    kvt_disk_t *d = &t->disk;
    struct stat sb;
    int err = stat(cfg->disk_dir, &sb) < 0 ? errno : S_ISDIR(sb.st_mode) ? 0 : ENOTDIR;
    if (err) {
        snprintf(why, why_len, "kv disk tier: %s: %s", cfg->disk_dir,
                 err == ENOENT ? "no such directory" : strerror(err));
        return err == ENOENT || err == ENOTDIR ? KVF_ERR_NOT_FOUND : KVF_ERR_IO;
    }
    size_t raw =
        sizeof(kvt_slot_header_t) + (size_t)t->block_tokens * sizeof(uint32_t) + t->block_bytes;
    d->slot_bytes = (raw + KVT_ALIGN - 1) / KVT_ALIGN * KVT_ALIGN;
    uint64_t cap = cfg->disk_bytes / d->slot_bytes;
    if (!cap) {
        snprintf(why, why_len, "kv disk tier: %llu bytes hold no block slot (%zu bytes)",
                 (unsigned long long)cfg->disk_bytes, d->slot_bytes);
        return KVF_ERR_INVAL;
    }
    d->cap = cap > UINT32_MAX - 1 ? UINT32_MAX - 1 : (uint32_t)cap;
    size_t plen = strlen(cfg->disk_dir) + sizeof(KVF_KV_TIER_FILE) + 2;
    d->path = malloc(plen);
    if (!d->path)
        return KVF_ERR_NOMEM;
    snprintf(d->path, plen, "%s/%s", cfg->disk_dir, KVF_KV_TIER_FILE);
    pthread_mutex_init(&d->lock, NULL);
    pthread_cond_init(&d->work, NULL);
    pthread_cond_init(&d->idle, NULL);
    d->on = true; /* from here close undoes what is done */
    /* The file before the index: a size no disk holds fails as no space,
     * not as no memory for its index. */
    kvf_status_t st = jobs_create(t, cfg->max_inflight ? cfg->max_inflight : 16);
    if (st != KVF_OK) {
        snprintf(why, why_len, "kv disk tier: out of memory for i/o buffers");
        return st;
    }
    st = file_open(t, cfg->disk_dir, why, why_len);
    if (st != KVF_OK)
        return st;
    st = slots_create(t);
    if (st != KVF_OK) {
        snprintf(why, why_len, "kv disk tier: out of memory for %u slots", d->cap);
        return st;
    }
    return threads_start(t, cfg->io_threads ? cfg->io_threads : 2, why, why_len);
}

void kvt_disk_close(kvf_kv_tiers_t *t)
{
    kvt_disk_t *d = &t->disk;
    if (!d->on)
        return;
    pthread_mutex_lock(&d->lock);
    d->stop = true;
    pthread_cond_broadcast(&d->work);
    pthread_mutex_unlock(&d->lock);
    for (unsigned i = 0; i < d->n_threads; i++)
        pthread_join(d->threads[i], NULL);
    if (d->fd >= 0) {
        unlink(d->path); /* while the lock is held: nobody else's file */
        close(d->fd);
    }
    for (uint32_t i = 0; d->jobs && i < d->n_jobs; i++) {
        free(d->jobs[i].buf);
        free(d->jobs[i].tokens);
    }
    HASH_CLEAR(hh, d->table);
    free(d->jobs);
    free(d->entries);
    free(d->tokens);
    free(d->threads);
    free(d->path);
    pthread_cond_destroy(&d->idle);
    pthread_cond_destroy(&d->work);
    pthread_mutex_destroy(&d->lock);
    memset(d, 0, sizeof(*d));
    d->fd = -1;
}
