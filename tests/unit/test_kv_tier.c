/* KV tier tests (kvf/kv_tier.h): round trips through host RAM and the
 * disk file, demotion, LRU drops, the collision check, corruption of
 * either tier (bytes flipped, a header changed, a slot copied over
 * another) caught on fetch, the bound on writes in flight, every block
 * accounted for under load, the eventfd, and the errors at create. Disk
 * files live in a mkdtemp directory under /tmp, removed after. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kvf/kv_tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define BT   4     /* tokens per block */
#define BB   1000  /* bytes per block: not a multiple of the slot alignment */
#define SLOT 4096u /* 64-byte header + 16 bytes of tokens + 1000, rounded up */

typedef struct {
    char dir[64];
} fixture_t;

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    snprintf(f->dir, sizeof(f->dir), "/tmp/kvf_kv_tier_XXXXXX");
    if (!mkdtemp(f->dir))
        return -1;
    *state = f;
    return 0;
}

/* Removes the directory: fails the test if a tiers object left a file. */
static int teardown(void **state)
{
    fixture_t *f = *state;
    int rc = rmdir(f->dir);
    free(f);
    return rc;
}

static kvf_kv_tiers_config_t config(const char *dir, uint32_t ram_blocks, uint32_t disk_slots)
{
    kvf_kv_tiers_config_t c = {.host_bytes = (uint64_t)ram_blocks * BB,
                               .disk_dir = dir,
                               .disk_bytes = (uint64_t)disk_slots * SLOT,
                               .block_bytes = BB,
                               .block_tokens = BT};
    return c;
}

static kvf_kv_tiers_t *make(const kvf_kv_tiers_config_t *c)
{
    kvf_kv_tiers_t *t;
    char why[256];
    assert_int_equal(kvf_kv_tiers_create(c, &t, why, sizeof(why)), KVF_OK);
    return t;
}

/* Block i: its hash, tokens and bytes, all functions of i. */
static uint64_t hash_of(uint32_t i)
{
    return 0x9e3779b97f4a7c15ull * (i + 1);
}

static void tokens_of(uint32_t i, uint32_t *tok)
{
    for (uint32_t k = 0; k < BT; k++)
        tok[k] = i * 100 + k;
}

static void bytes_of(uint32_t i, uint8_t *b)
{
    for (uint32_t k = 0; k < BB; k++)
        b[k] = (uint8_t)(i * 31 + k * 7 + (k >> 8));
}

static kvf_status_t put(kvf_kv_tiers_t *t, uint32_t i)
{
    uint32_t tok[BT];
    uint8_t b[BB];
    tokens_of(i, tok);
    bytes_of(i, b);
    return kvf_kv_tiers_put(t, hash_of(i), tok, b);
}

static int lookup(const kvf_kv_tiers_t *t, uint32_t i)
{
    uint32_t tok[BT];
    tokens_of(i, tok);
    return kvf_kv_tiers_lookup(t, hash_of(i), tok);
}

/* The next fetch result, waiting on the eventfd (no sleeps). */
static kvf_kv_fetch_done_t wait_done(kvf_kv_tiers_t *t)
{
    kvf_kv_fetch_done_t d;
    while (kvf_kv_tiers_poll(t, &d, 1) == 0) {
        struct pollfd p = {.fd = kvf_kv_tiers_fd(t), .events = POLLIN};
        assert_true(poll(&p, 1, -1) == 1);
    }
    return d;
}

/* Fetches block i, waits, and returns the result; on KVF_OK checks the
 * bytes are exactly block i's. */
static kvf_kv_fetch_done_t fetch(kvf_kv_tiers_t *t, uint32_t i)
{
    uint32_t tok[BT];
    uint8_t got[BB], want[BB];
    tokens_of(i, tok);
    bytes_of(i, want);
    memset(got, 0xaa, sizeof(got));
    assert_int_equal(kvf_kv_tiers_fetch(t, hash_of(i), tok, got, 1000 + i), KVF_OK);
    kvf_kv_fetch_done_t d = wait_done(t);
    assert_int_equal(d.tag, 1000 + i);
    if (d.status == KVF_OK)
        assert_memory_equal(got, want, BB);
    return d;
}

static kvf_kv_tiers_stats_t stats_of(const kvf_kv_tiers_t *t)
{
    kvf_kv_tiers_stats_t s;
    kvf_kv_tiers_stats(t, &s);
    return s;
}

/* Flips one byte of the disk file at off. */
static void flip_disk_byte(const char *dir, uint64_t off)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/%s", dir, KVF_KV_TIER_FILE);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, (off_t)off), 1);
    b ^= 0x10;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
    close(fd);
}

static uint64_t disk_offset(const kvf_kv_tiers_t *t, uint32_t i)
{
    uint64_t off;
    assert_int_equal(kvf_kv_tiers_test_disk_offset(t, hash_of(i), &off), KVF_OK);
    return off;
}

/* ---- tests ----------------------------------------------------------- */

static void test_ram_round_trip(void **state)
{
    (void)state;
    kvf_kv_tiers_config_t c = config(NULL, 4, 0);
    kvf_kv_tiers_t *t = make(&c);
    assert_false(kvf_kv_tiers_direct_io(t));
    for (uint32_t i = 0; i < 3; i++)
        assert_int_equal(put(t, i), KVF_OK);
    assert_int_equal(put(t, 1), KVF_OK); /* already held: no second copy */
    kvf_kv_tiers_stats_t s = stats_of(t);
    assert_int_equal(s.blocks_ram, 3);
    assert_int_equal(s.cap_ram, 4);
    for (uint32_t i = 0; i < 3; i++) {
        assert_int_equal(lookup(t, i), 1);
        kvf_kv_fetch_done_t d = fetch(t, i);
        assert_int_equal(d.status, KVF_OK);
        assert_int_equal(d.tier, 1);
        assert_int_equal(lookup(t, i), 0); /* promoted: out of the tier */
    }
    s = stats_of(t);
    assert_int_equal(s.blocks_ram, 0);
    assert_int_equal(s.hits_ram, 3);
    assert_int_equal(s.fetched, 3);
    /* RAM full, no disk: the LRU block is dropped. */
    for (uint32_t i = 0; i < 5; i++)
        assert_int_equal(put(t, i), KVF_OK);
    assert_int_equal(lookup(t, 0), 0);
    for (uint32_t i = 1; i < 5; i++)
        assert_int_equal(lookup(t, i), 1);
    assert_int_equal(stats_of(t).dropped, 1);
    kvf_kv_tiers_destroy(t);
}

static void test_wrong_tokens_miss(void **state)
{
    fixture_t *f = *state;
    kvf_kv_tiers_config_t c = config(f->dir, 1, 8);
    kvf_kv_tiers_t *t = make(&c);
    assert_int_equal(put(t, 0), KVF_OK); /* demoted by the next */
    assert_int_equal(put(t, 1), KVF_OK);
    kvf_kv_tiers_flush(t);
    for (uint32_t i = 0; i < 2; i++) {
        uint32_t tok[BT];
        uint8_t dst[BB];
        tokens_of(i, tok);
        tok[BT - 1] ^= 1;
        assert_int_equal(kvf_kv_tiers_lookup(t, hash_of(i), tok), 0);
        assert_int_equal(kvf_kv_tiers_fetch(t, hash_of(i), tok, dst, 0), KVF_ERR_NOT_FOUND);
        assert_int_equal(kvf_kv_tiers_lookup(t, hash_of(i) ^ 1, tok), 0);
    }
    assert_int_equal(lookup(t, 0), 2);
    assert_int_equal(lookup(t, 1), 1);
    /* Same hash, other tokens (a collision): the new block replaces it. */
    uint32_t tok[BT];
    uint8_t b[BB];
    tokens_of(7, tok);
    bytes_of(7, b);
    assert_int_equal(kvf_kv_tiers_put(t, hash_of(1), tok, b), KVF_OK);
    assert_int_equal(lookup(t, 1), 0);
    assert_int_equal(kvf_kv_tiers_lookup(t, hash_of(1), tok), 1);
    kvf_kv_tiers_destroy(t);
}

static void test_demote_to_disk(void **state)
{
    fixture_t *f = *state;
    kvf_kv_tiers_config_t c = config(f->dir, 2, 4);
    kvf_kv_tiers_t *t = make(&c);
    assert_int_equal(kvf_kv_tiers_slot_bytes(t), SLOT);
    for (uint32_t i = 0; i < 5; i++)
        assert_int_equal(put(t, i), KVF_OK);
    kvf_kv_tiers_flush(t);
    for (uint32_t i = 0; i < 3; i++)
        assert_int_equal(lookup(t, i), 2);
    for (uint32_t i = 3; i < 5; i++)
        assert_int_equal(lookup(t, i), 1);
    kvf_kv_tiers_stats_t s = stats_of(t);
    assert_int_equal(s.blocks_ram, 2);
    assert_int_equal(s.blocks_disk, 3);
    assert_int_equal(s.demotions, 3);
    assert_int_equal(s.bytes_written, 3 * SLOT);
    kvf_kv_fetch_done_t d = fetch(t, 1);
    assert_int_equal(d.status, KVF_OK);
    assert_int_equal(d.tier, 2);
    assert_int_equal(lookup(t, 1), 0);
    assert_int_equal(stats_of(t).bytes_read, SLOT);
    /* Disk full (4 slots): 0, 2, then 3..6 demoted as 7..8 come; the
     * disk's least recently written blocks (0, 2) are dropped. */
    for (uint32_t i = 5; i < 9; i++)
        assert_int_equal(put(t, i), KVF_OK);
    kvf_kv_tiers_flush(t);
    assert_int_equal(lookup(t, 0), 0);
    assert_int_equal(lookup(t, 2), 0);
    for (uint32_t i = 3; i < 7; i++)
        assert_int_equal(lookup(t, i), 2);
    for (uint32_t i = 3; i < 9; i++) {
        d = fetch(t, i);
        assert_int_equal(d.status, KVF_OK);
        assert_int_equal(d.tier, i < 7 ? 2 : 1);
    }
    s = stats_of(t);
    assert_int_equal(s.dropped, 2);
    assert_int_equal(s.blocks_disk + s.blocks_ram, 0);
    assert_int_equal(s.corrupt, 0);
    kvf_kv_tiers_destroy(t);
}

/* Sorted copy of the n hashes in list, as block indices (-1: unknown). */
static void indices(const uint64_t *list, uint32_t n, int *out)
{
    for (uint32_t k = 0; k < n; k++) {
        out[k] = -1;
        for (uint32_t i = 0; i < 64; i++)
            if (hash_of(i) == list[k])
                out[k] = (int)i;
    }
    for (uint32_t a = 0; a < n; a++)
        for (uint32_t b = a + 1; b < n; b++)
            if (out[b] < out[a]) {
                int x = out[a];
                out[a] = out[b];
                out[b] = x;
            }
}

/* The reports' changes: each hash whose tier changed is listed once, in
 * the list of where it is now; a full listing clears them; more changes
 * than report_cap are lost, and say so until a full listing. */
static void test_tier_changes(void **state)
{
    fixture_t *f = *state;
    kvf_kv_tiers_config_t c = config(f->dir, 2, 4);
    c.report_cap = 4;
    kvf_kv_tiers_t *t = make(&c);
    uint64_t ram[8], disk[8], gone[8];
    kvf_kv_tier_changes_t ch = {.ram = ram, .disk = disk, .gone = gone};
    int ix[8];
    assert_true(kvf_kv_tiers_changes(t, &ch, 8)); /* nothing listed yet */
    uint32_t n_ram, n_disk;
    assert_int_equal(kvf_kv_tiers_list(t, ram, &n_ram, disk, &n_disk, 8), 0);
    assert_false(kvf_kv_tiers_changes(t, &ch, 8));
    assert_int_equal(ch.n_ram + ch.n_disk + ch.n_gone, 0);
    /* 0..2 in: 0 demoted to disk, 1 and 2 in RAM */
    for (uint32_t i = 0; i < 3; i++)
        assert_int_equal(put(t, i), KVF_OK);
    assert_false(kvf_kv_tiers_changes(t, &ch, 8));
    assert_int_equal(ch.n_ram, 2);
    assert_int_equal(ch.n_disk, 1);
    assert_int_equal(ch.n_gone, 0);
    indices(ram, 2, ix);
    assert_int_equal(ix[0], 1);
    assert_int_equal(ix[1], 2);
    assert_true(disk[0] == hash_of(0));
    /* consumed */
    assert_false(kvf_kv_tiers_changes(t, &ch, 8));
    assert_int_equal(ch.n_ram + ch.n_disk + ch.n_gone, 0);
    /* 1 fetched (gone), 3 put: 2 stays, nothing demoted */
    assert_int_equal(fetch(t, 1).status, KVF_OK);
    assert_int_equal(put(t, 3), KVF_OK);
    assert_false(kvf_kv_tiers_changes(t, &ch, 8));
    assert_int_equal(ch.n_gone, 1);
    assert_true(gone[0] == hash_of(1));
    assert_int_equal(ch.n_ram, 1);
    assert_true(ram[0] == hash_of(3));
    /* a list of cap 1 cannot hold both moves: nothing consumed */
    assert_int_equal(put(t, 4), KVF_OK); /* 2 to disk, 4 in RAM */
    assert_true(kvf_kv_tiers_changes(t, &ch, 0));
    assert_false(kvf_kv_tiers_changes(t, &ch, 8));
    assert_int_equal(ch.n_ram, 1);
    assert_int_equal(ch.n_disk, 1);
    /* five hashes changed, room for four: lost until listed */
    for (uint32_t i = 5; i < 8; i++)
        assert_int_equal(put(t, i), KVF_OK);
    kvf_kv_tiers_flush(t);
    assert_true(kvf_kv_tiers_changes(t, &ch, 8));
    assert_true(kvf_kv_tiers_changes(t, &ch, 8));
    /* 6, 7 in RAM; four of 0, 2, 3, 4, 5 on disk (4 slots; which depends on
     * the writes done when 5 was demoted) */
    assert_int_equal(kvf_kv_tiers_list(t, ram, &n_ram, disk, &n_disk, 8), 6);
    assert_int_equal(n_ram, 2);
    assert_int_equal(n_disk, 4);
    indices(ram, 2, ix);
    assert_int_equal(ix[0], 6);
    assert_int_equal(ix[1], 7);
    indices(disk, 4, ix);
    for (int k = 0; k < 4; k++)
        assert_int_equal(lookup(t, (uint32_t)ix[k]), 2);
    assert_int_equal(kvf_kv_tiers_list(t, ram, &n_ram, disk, &n_disk, 3), 6);
    assert_int_equal(n_ram + n_disk, 3);
    assert_false(kvf_kv_tiers_changes(t, &ch, 8));
    assert_int_equal(ch.n_ram + ch.n_disk + ch.n_gone, 0);
    /* disk reads are timed */
    assert_int_equal(fetch(t, (uint32_t)ix[0]).status, KVF_OK);
    kvf_kv_tiers_stats_t s = stats_of(t);
    assert_int_equal(s.reads, 1);
    assert_true(s.read_ns > 0 && s.read_wait_ns >= s.read_ns);
    assert_int_equal(s.slot_bytes, SLOT);
    assert_int_equal(s.io_threads, 2);
    kvf_kv_tiers_destroy(t);
}

/* A counting allocator for tier 1's slab (what a GPU node's pinned one
 * stands in for here): the slab comes from it and goes back to it. */
typedef struct {
    int allocs, frees;
    size_t bytes;
    void *last;
    bool refuse;
} slab_alloc_t;

static void *slab_alloc(void *arg, size_t bytes)
{
    slab_alloc_t *a = arg;
    if (a->refuse)
        return NULL;
    a->allocs++;
    a->bytes = bytes;
    a->last = malloc(bytes);
    return a->last;
}

static void slab_free(void *arg, void *p)
{
    slab_alloc_t *a = arg;
    assert_ptr_equal(p, a->last);
    a->frees++;
    free(p);
}

static void test_ram_allocator(void **state)
{
    (void)state;
    slab_alloc_t a = {0};
    kvf_kv_tiers_config_t c = config(NULL, 3, 0);
    c.host_alloc = slab_alloc;
    c.host_free = slab_free;
    c.host_arg = &a;
    kvf_kv_tiers_t *t = make(&c);
    assert_int_equal(a.allocs, 1);
    assert_int_equal(a.bytes, 3 * BB);
    assert_int_equal(put(t, 7), KVF_OK);
    uint8_t *held = kvf_kv_tiers_test_ram_block(t, hash_of(7));
    assert_true(held >= (uint8_t *)a.last && held + BB <= (uint8_t *)a.last + a.bytes);
    assert_int_equal(fetch(t, 7).status, KVF_OK);
    kvf_kv_tiers_destroy(t);
    assert_int_equal(a.frees, 1);
    /* an allocator that cannot: plain memory, never freed through it */
    a = (slab_alloc_t){.refuse = true};
    t = make(&c);
    assert_int_equal(put(t, 8), KVF_OK);
    assert_int_equal(fetch(t, 8).status, KVF_OK);
    kvf_kv_tiers_destroy(t);
    assert_int_equal(a.frees, 0);
}

/* No tier 1: blocks go to disk at once; a fetch while the write is still
 * queued is served (checked) from the write's buffer. */
static void test_disk_only(void **state)
{
    fixture_t *f = *state;
    kvf_kv_tiers_config_t c = config(f->dir, 0, 8);
    c.io_threads = 1;
    kvf_kv_tiers_t *t = make(&c);
    kvf_kv_tiers_test_pause(t, true);
    assert_int_equal(put(t, 0), KVF_OK);
    assert_int_equal(put(t, 1), KVF_OK);
    assert_int_equal(lookup(t, 0), 2);
    kvf_kv_fetch_done_t d = fetch(t, 0);
    assert_int_equal(d.status, KVF_OK);
    assert_int_equal(d.tier, 2);
    kvf_kv_tiers_flush(t);
    kvf_kv_tiers_stats_t s = stats_of(t);
    assert_int_equal(s.bytes_written, SLOT); /* the fetched block's write was cancelled */
    d = fetch(t, 1);
    assert_int_equal(d.status, KVF_OK);
    assert_int_equal(stats_of(t).bytes_read, SLOT);
    kvf_kv_tiers_destroy(t);
}

static void expect_corrupt(kvf_kv_tiers_t *t, uint32_t i)
{
    uint64_t before = stats_of(t).corrupt;
    kvf_kv_fetch_done_t d = fetch(t, i);
    assert_int_equal(d.status, KVF_ERR_CORRUPT);
    assert_int_equal(lookup(t, i), 0); /* dropped */
    assert_int_equal(stats_of(t).corrupt, before + 1);
}

static void test_disk_corrupt(void **state)
{
    fixture_t *f = *state;
    kvf_kv_tiers_config_t c = config(f->dir, 1, 8);
    kvf_kv_tiers_t *t = make(&c);
    assert_true(kvf_kv_tiers_direct_io(t)); /* /tmp is no tmpfs on the test machines */
    for (uint32_t i = 0; i < 6; i++)
        assert_int_equal(put(t, i), KVF_OK);
    kvf_kv_tiers_flush(t);
    /* A byte of the block's data, of its tokens, of its header's hash. */
    flip_disk_byte(f->dir, disk_offset(t, 0) + 64 + BT * 4 + 500);
    flip_disk_byte(f->dir, disk_offset(t, 1) + 64 + 2);
    flip_disk_byte(f->dir, disk_offset(t, 2) + 8);
    expect_corrupt(t, 0);
    expect_corrupt(t, 1);
    expect_corrupt(t, 2);
    /* Block 4's whole slot copied over block 3's: a valid slot, in the
     * wrong place. */
    char path[128];
    snprintf(path, sizeof(path), "%s/%s", f->dir, KVF_KV_TIER_FILE);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t slot[SLOT];
    assert_int_equal(pread(fd, slot, SLOT, (off_t)disk_offset(t, 4)), SLOT);
    assert_int_equal(pwrite(fd, slot, SLOT, (off_t)disk_offset(t, 3)), SLOT);
    close(fd);
    expect_corrupt(t, 3);
    assert_int_equal(fetch(t, 4).status, KVF_OK); /* the original is fine */
    assert_int_equal(fetch(t, 5).status, KVF_OK); /* in RAM */
    kvf_kv_tiers_destroy(t);
}

static void test_ram_corrupt(void **state)
{
    (void)state;
    kvf_kv_tiers_config_t c = config(NULL, 4, 0);
    kvf_kv_tiers_t *t = make(&c);
    assert_int_equal(put(t, 0), KVF_OK);
    assert_int_equal(put(t, 1), KVF_OK);
    uint8_t *b = kvf_kv_tiers_test_ram_block(t, hash_of(0));
    assert_non_null(b);
    b[BB - 1] ^= 0x01;
    expect_corrupt(t, 0);
    assert_null(kvf_kv_tiers_test_ram_block(t, hash_of(0)));
    assert_int_equal(fetch(t, 1).status, KVF_OK);
    kvf_kv_tiers_destroy(t);
}

/* A RAM block corrupted before its demotion is caught on the disk read:
 * the CRC taken at put travels with it. */
static void test_corrupt_before_demotion(void **state)
{
    fixture_t *f = *state;
    kvf_kv_tiers_config_t c = config(f->dir, 1, 4);
    kvf_kv_tiers_t *t = make(&c);
    assert_int_equal(put(t, 0), KVF_OK);
    ((uint8_t *)kvf_kv_tiers_test_ram_block(t, hash_of(0)))[3] ^= 0x80;
    assert_int_equal(put(t, 1), KVF_OK);
    kvf_kv_tiers_flush(t);
    assert_int_equal(lookup(t, 0), 2);
    expect_corrupt(t, 0);
    kvf_kv_tiers_destroy(t);
}

/* Writes in flight stay at max_inflight: with the I/O threads held, each
 * demotion past the bound drops the oldest queued one, never waits. */
static void test_bounded_inflight(void **state)
{
    fixture_t *f = *state;
    kvf_kv_tiers_config_t c = config(f->dir, 1, 64);
    c.max_inflight = 2;
    c.io_threads = 1;
    kvf_kv_tiers_t *t = make(&c);
    kvf_kv_tiers_test_pause(t, true);
    for (uint32_t i = 0; i < 10; i++)
        assert_int_equal(put(t, i), KVF_OK);
    kvf_kv_tiers_stats_t s = stats_of(t);
    assert_int_equal(s.demotions, 9);
    assert_int_equal(s.demotions_dropped, 7);
    kvf_kv_tiers_flush(t);
    for (uint32_t i = 0; i < 7; i++)
        assert_int_equal(lookup(t, i), 0);
    assert_int_equal(lookup(t, 7), 2);
    assert_int_equal(lookup(t, 8), 2);
    assert_int_equal(lookup(t, 9), 1);
    assert_int_equal(stats_of(t).bytes_written, 2 * SLOT);
    assert_int_equal(fetch(t, 7).status, KVF_OK);
    kvf_kv_tiers_destroy(t);
}

/* Many puts and fetches with the threads running: nothing blocks, and
 * every block put is in a tier, fetched or counted as dropped. */
static void test_accounting_under_load(void **state)
{
    fixture_t *f = *state;
    kvf_kv_tiers_config_t c = config(f->dir, 8, 32);
    c.max_inflight = 4;
    kvf_kv_tiers_t *t = make(&c);
    uint32_t fetches = 0;
    for (uint32_t i = 0; i < 2000; i++) {
        assert_int_equal(put(t, i), KVF_OK);
        if (i % 7 == 0 && i >= 20 && lookup(t, i - 20)) {
            kvf_kv_fetch_done_t d = fetch(t, i - 20);
            assert_int_equal(d.status, KVF_OK);
            fetches++;
        }
    }
    kvf_kv_tiers_flush(t);
    kvf_kv_fetch_done_t d;
    assert_int_equal(kvf_kv_tiers_poll(t, &d, 1), 0);
    kvf_kv_tiers_stats_t s = stats_of(t);
    assert_int_equal(s.puts, 2000);
    assert_int_equal(s.hits_ram + s.hits_disk, fetches);
    assert_int_equal(s.fetched, fetches);
    assert_int_equal(s.blocks_ram, 8);
    assert_int_equal(s.puts, s.blocks_ram + s.blocks_disk + s.dropped + s.demotions_dropped +
                                 s.hits_ram + s.hits_disk);
    assert_true(s.blocks_disk <= 32);
    assert_int_equal(s.io_errors + s.corrupt, 0);
    kvf_kv_tiers_destroy(t);
}

/* poll returns at most max; the fd stays readable while results wait. */
static void test_poll_and_fd(void **state)
{
    (void)state;
    kvf_kv_tiers_config_t c = config(NULL, 4, 0);
    kvf_kv_tiers_t *t = make(&c);
    uint8_t dst[3][BB];
    for (uint32_t i = 0; i < 3; i++) {
        uint32_t tok[BT];
        tokens_of(i, tok);
        assert_int_equal(put(t, i), KVF_OK);
        assert_int_equal(kvf_kv_tiers_fetch(t, hash_of(i), tok, dst[i], i), KVF_OK);
    }
    struct pollfd p = {.fd = kvf_kv_tiers_fd(t), .events = POLLIN};
    for (uint32_t i = 0; i < 3; i++) {
        assert_int_equal(poll(&p, 1, 0), 1);
        kvf_kv_fetch_done_t d[2];
        assert_int_equal(kvf_kv_tiers_poll(t, d, 1), 1);
        assert_int_equal(d[0].tag, i);
    }
    assert_int_equal(poll(&p, 1, 0), 0);
    kvf_kv_tiers_destroy(t);
}

static bool dir_is_empty(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    bool empty = true;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            empty = false;
    closedir(d);
    return empty;
}

static void expect_create_error(const kvf_kv_tiers_config_t *c, kvf_status_t want,
                                const char *in_why)
{
    kvf_kv_tiers_t *t = NULL;
    char why[256];
    assert_int_equal(kvf_kv_tiers_create(c, &t, why, sizeof(why)), want);
    assert_null(t);
    assert_non_null(strstr(why, in_why));
}

static void test_create_errors(void **state)
{
    fixture_t *f = *state;
    char missing[96];
    snprintf(missing, sizeof(missing), "%s/missing", f->dir);
    kvf_kv_tiers_config_t c = config(missing, 1, 8);
    expect_create_error(&c, KVF_ERR_NOT_FOUND, "no such directory");
    c.disk_dir = "/dev/null/x";
    expect_create_error(&c, KVF_ERR_NOT_FOUND, "/dev/null/x");
    /* No filesystem reserves 4 EiB: the preallocation fails, and nothing is left. */
    c = config(f->dir, 1, 8);
    c.disk_bytes = 1ull << 62;
    kvf_kv_tiers_t *t = NULL;
    char why[256];
    kvf_status_t st = kvf_kv_tiers_create(&c, &t, why, sizeof(why));
    assert_true(st == KVF_ERR_NO_SPACE || st == KVF_ERR_TOO_BIG);
    assert_non_null(strstr(why, "cannot reserve"));
    assert_true(dir_is_empty(f->dir));
    c = config(f->dir, 1, 8);
    c.disk_bytes = SLOT - 1;
    expect_create_error(&c, KVF_ERR_INVAL, "no block slot");
    c = config(f->dir, 1, 8);
    c.block_bytes = 0;
    expect_create_error(&c, KVF_ERR_INVAL, "block_bytes");
    /* A directory another tiers object uses. */
    c = config(f->dir, 1, 8);
    t = make(&c);
    expect_create_error(&c, KVF_ERR_AGAIN, "in use");
    assert_int_equal(put(t, 0), KVF_OK); /* the first is unharmed */
    kvf_kv_tiers_destroy(t);
    /* A read-only directory (root writes through mode bits: only as others). */
    if (geteuid() != 0) {
        assert_int_equal(chmod(f->dir, 0500), 0);
        expect_create_error(&c, KVF_ERR_IO, "read-only");
        assert_int_equal(chmod(f->dir, 0700), 0);
    }
    assert_true(dir_is_empty(f->dir));
}

/* Create truncates the file: blocks of a previous run are gone. */
static void test_restart_discards(void **state)
{
    fixture_t *f = *state;
    kvf_kv_tiers_config_t c = config(f->dir, 0, 8);
    char path[128];
    snprintf(path, sizeof(path), "%s/%s", f->dir, KVF_KV_TIER_FILE);
    int fd = open(path, O_RDWR | O_CREAT, 0600); /* a previous run's file, bigger */
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 64 * SLOT), 0);
    close(fd);
    kvf_kv_tiers_t *t = make(&c);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_size, 8 * SLOT);
    assert_int_equal(lookup(t, 0), 0);
    kvf_kv_tiers_destroy(t);
    assert_int_equal(stat(path, &sb), -1); /* destroy removes it */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ram_round_trip),
        cmocka_unit_test_setup_teardown(test_wrong_tokens_miss, setup, teardown),
        cmocka_unit_test_setup_teardown(test_demote_to_disk, setup, teardown),
        cmocka_unit_test_setup_teardown(test_disk_only, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tier_changes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_disk_corrupt, setup, teardown),
        cmocka_unit_test(test_ram_corrupt),
        cmocka_unit_test_setup_teardown(test_corrupt_before_demotion, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bounded_inflight, setup, teardown),
        cmocka_unit_test_setup_teardown(test_accounting_under_load, setup, teardown),
        cmocka_unit_test(test_poll_and_fd),
        cmocka_unit_test(test_ram_allocator),
        cmocka_unit_test_setup_teardown(test_create_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restart_discards, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
