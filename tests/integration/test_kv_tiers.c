/* The KV tiers through a cluster (docs/kv-tiers.md): a prefill node whose
 * pool holds two prompts' blocks (40), with a host RAM tier and a disk
 * tier, and a decode node.
 *
 * test_tiers_hit: prompts A, B, C, D (20 blocks each) evict A's and B's
 * cached blocks into RAM, and A's first blocks on to disk; A again finds
 * its 18 reusable blocks in the tiers (8 in RAM, 10 on disk), computes
 * only its last 32 tokens, and its output equals the colocated cold run.
 *
 * test_tiers_decode_local: the same on a decode node that prefills itself
 * (--prefill-local, no prefill node): A again takes its blocks back from
 * the decode node's tiers, output equal to the cold run.
 *
 * test_tiers_corrupt: a disk tier alone; A's blocks go to disk when C
 * evicts them, a byte of every block on disk is flipped, and A again is
 * computed whole (every copy fails its checks and is dropped): the output
 * still equals the cold run and nothing stays in use.
 *
 * test_tiers_decode_transfer: a decode node of 21 blocks (one request's)
 * with tiers, behind a prefill node: B evicts A's blocks into the decode
 * node's RAM tier, and A again, transferred, takes the 19 blocks its
 * KvAlloc offers back from there: the prefill node ships only the last
 * block, the output equals the cold run, no block stays in use.
 *
 * test_tiers_decode_transfer_corrupt: the same with a disk tier alone and
 * a byte of every block on the decode node's disk flipped: every copy
 * fails its checks, the KvAllocReply holds nothing cached and the whole
 * prompt is shipped; the output still equals the cold run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "kvf/clock.h"

#define VOCAB    512
#define N_PROMPT 320 /* 20 blocks of 16 tokens; a hit reuses at most 18 */
#define SLOT_MAGIC "\0kvtier1"

static char model_dir[256];

static int setup(void **state)
{
    (void)state;
    snprintf(model_dir, sizeof(model_dir), "/tmp/kvf-test-tiers-model-%d", (int)getpid());
    /* 2 layers, 2 KV heads of 16: 8 KiB a block in f32 */
    h_mkmodel(model_dir, "--layers 2 --hidden 64 --heads 4 --kv-heads 2 --inter 128 "
                         "--vocab 512 --max-pos 4096 --seed 17");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return h_rmmodel(model_dir);
}

/* Prompts A..E (seeds 1..5) and their cold references. */
static void make_prompts(h_gen_t *g, uint32_t **ref, size_t *n_ref, int n)
{
    for (int i = 0; i < n; i++)
        h_gen_random(&g[i], N_PROMPT, VOCAB, 300 + (uint64_t)i, 8, true);
    h_references(model_dir, g, (size_t)n, ref, n_ref);
}

/* Sends g[i] alone and checks its output. */
static void send_one(h_cluster_t *c, h_gen_t *g, uint32_t **ref, size_t *n_ref, int i)
{
    h_gen_t one = g[i];
    one.out = NULL;
    one.out_text = NULL;
    one.n_out = one.cap_out = one.n_text = 0;
    h_generate_many(c, &one, 1, NULL, 240000);
    h_check_outputs(c, &one, &ref[i], &n_ref[i], 1, H_FINISH_LENGTH);
    one.prompt = NULL; /* g[i] keeps it */
    h_gen_free(&one);
}

static h_cluster_t start(const char *disk_dir, const char *host_mem)
{
    h_cluster_t c;
    h_cluster_init(&c, model_dir, "sm,self");
    h_start_router(&c, NULL);
    h_start_node(&c, "decode", "decode-0", NULL);
    /* the prefill node's tiers alone: it pulls nothing from the decode
     * node, which holds every earlier prompt too */
    h_start_node(&c, "prefill", "prefill-0", "--kv-mem", "320K", "--kv-host-mem", host_mem,
                 "--kv-disk", disk_dir, "--kv-disk-size", "2M", "--no-prefix-pull", NULL);
    h_wait_nodes(&c, 2, 120000);
    return c;
}

static void test_tiers_hit(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvf-test-tiers-XXXXXX";
    assert_non_null(mkdtemp(dir));
    h_gen_t g[4];
    uint32_t *ref[4];
    size_t n_ref[4];
    make_prompts(g, ref, n_ref, 4);
    h_cluster_t c = start(dir, "384K"); /* 48 blocks of RAM */
    int pf = h_find(&c, "prefill-0");
    if (!h_log_holds(&c, pf, "kv tiers: host RAM 48 blocks, disk ")) {
        h_cluster_stop(&c, true);
        fail_msg("the prefill node does not say its tiers");
    }
    for (int i = 0; i < 4; i++)
        send_one(&c, g, ref, n_ref, i);
    h_totals_t before, after;
    h_totals(&c, &before);
    send_one(&c, g, ref, n_ref, 0);
    h_totals(&c, &after);
    /* 18 blocks back from the tiers: only the last 32 tokens computed */
    assert_int_equal(after.prefill_cached - before.prefill_cached, 18 * 16);
    assert_int_equal(after.prefill_computed - before.prefill_computed, 32);
    h_wait_no_blocks_used(&c, 30000);
    assert_int_equal(h_terminate(&c, pf, 60000), 0);
    /* RAM held A's first 8 blocks, disk the next 10 */
    if (!h_log_holds(&c, pf, ", 8 ram + 10 disk hits, 288 prompt tokens from them, 0 corrupt")) {
        h_cluster_stop(&c, true);
        fail_msg("the prefill node's tier counters are not the expected ones");
    }
    h_cluster_stop(&c, false);
    h_gens_free(g, ref, 4);
    assert_int_equal(rmdir(dir), 0); /* the node removed its file */
}

/* The RAM and disk hits of the last "kv tiers:" report in process i's log. */
static void tier_hits(const h_cluster_t *c, int i, unsigned long long *ram_p,
                      unsigned long long *disk_p)
{
    *ram_p = *disk_p = 0;
    FILE *f = fopen(c->procs[i].log, "r");
    if (!f)
        return;
    char line[2048];
    while (fgets(line, sizeof(line), f)) {
        const char *t = strstr(line, "kv tiers: ");
        unsigned a, b;
        if (t)
            (void)sscanf(t, "kv tiers: %u ram + %u disk blocks, %llu ram + %llu disk hits", &a, &b,
                         ram_p, disk_p);
    }
    fclose(f);
}

static void test_tiers_decode_local(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvf-test-tiers-XXXXXX";
    assert_non_null(mkdtemp(dir));
    h_gen_t g[4];
    uint32_t *ref[4];
    size_t n_ref[4];
    make_prompts(g, ref, n_ref, 4);
    h_cluster_t c;
    h_cluster_init(&c, model_dir, "sm,self");
    h_start_router(&c, NULL);
    int dn = h_start_node(&c, "decode", "decode-0", "--prefill-local", "--kv-mem", "344K",
                          "--kv-host-mem", "384K", "--kv-disk", dir, "--kv-disk-size", "2M",
                          NULL);
    h_wait_nodes(&c, 1, 120000);
    for (int i = 0; i < 4; i++)
        send_one(&c, g, ref, n_ref, i);
    h_totals_t before, after;
    h_totals(&c, &before);
    send_one(&c, g, ref, n_ref, 0);
    h_totals(&c, &after);
    assert_int_equal(after.prefill_cached - before.prefill_cached, 18 * 16);
    h_wait_no_blocks_used(&c, 30000);
    assert_int_equal(h_terminate(&c, dn, 60000), 0);
    unsigned long long ram = 0, disk = 0;
    tier_hits(&c, dn, &ram, &disk);
    if (ram + disk == 0) {
        h_cluster_stop(&c, true);
        fail_msg("the decode node took nothing from its tiers");
    }
    h_cluster_stop(&c, false);
    h_gens_free(g, ref, 4);
    assert_int_equal(rmdir(dir), 0);
}

/* Slots written to the tier file (its header's magic at a 4 KiB edge). */
static int slots_written(const char *path, long *offs, int max)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    char buf[8];
    int n = 0;
    for (long off = 0; n < max && fseek(f, off, SEEK_SET) == 0 && fread(buf, 1, 8, f) == 8;
         off += 4096)
        if (!memcmp(buf, SLOT_MAGIC, 8))
            offs[n++] = off;
    fclose(f);
    return n;
}

/* Waits until every block node `id` counts on its disk is written to
 * path, then flips one byte of every block's data there. */
static void flip_disk_blocks(h_cluster_t *c, const char *id, const char *path)
{
    long offs[64];
    int n = 0, want = -1;
    uint64_t give_up = kvf_clock_ns() + 60000000000ull;
    while (kvf_clock_ns() < give_up) {
        h_node_stats_t st[4];
        int k = h_stats(c, st, 4);
        for (int i = 0; i < k && i < 4; i++)
            if (!strcmp(st[i].id, id))
                want = (int)st[i].tier_disk_blocks;
        n = slots_written(path, offs, 64);
        if (want > 0 && n >= want)
            break;
        kvf_clock_sleep_ms(20);
    }
    if (want <= 0 || n < want) {
        h_cluster_stop(c, true);
        fail_msg("%d blocks written of %d on disk", n, want);
    }
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    for (int i = 0; i < n; i++) {
        unsigned char b;
        assert_int_equal(fseek(f, offs[i] + 64 + 1000, SEEK_SET), 0);
        assert_int_equal(fread(&b, 1, 1, f), 1);
        b ^= 0x5a;
        assert_int_equal(fseek(f, offs[i] + 64 + 1000, SEEK_SET), 0);
        assert_int_equal(fwrite(&b, 1, 1, f), 1);
    }
    assert_int_equal(fclose(f), 0);
}

static void test_tiers_corrupt(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvf-test-tiers-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof(path), "%s/kvf-kv-tier.bin", dir);
    h_gen_t g[3];
    uint32_t *ref[3];
    size_t n_ref[3];
    make_prompts(g, ref, n_ref, 3);
    h_cluster_t c = start(dir, "0"); /* disk only */
    int pf = h_find(&c, "prefill-0");
    for (int i = 0; i < 3; i++)
        send_one(&c, g, ref, n_ref, i);
    /* C evicted A's 20 blocks to disk (those past the writes-in-flight
     * bound dropped) */
    flip_disk_blocks(&c, "prefill-0", path);
    h_totals_t before, after;
    h_totals(&c, &before);
    send_one(&c, g, ref, n_ref, 0); /* still the cold run's output */
    h_totals(&c, &after);
    assert_int_equal(after.prefill_cached - before.prefill_cached, 0);
    if (!h_log_holds(&c, pf, "failed its checks")) {
        h_cluster_stop(&c, true);
        fail_msg("no corrupt block was reported");
    }
    h_wait_no_blocks_used(&c, 30000);
    h_cluster_stop(&c, false);
    h_gens_free(g, ref, 3);
    assert_int_equal(rmdir(dir), 0);
}

/* A decode node with room for one request (21 blocks) and the given
 * tiers, a prefill node, a router. */
static h_cluster_t start_decode_tiers(const char *disk_dir, const char *host_mem)
{
    h_cluster_t c;
    h_cluster_init(&c, model_dir, "sm,self");
    h_start_router(&c, NULL);
    h_start_node(&c, "decode", "decode-0", "--kv-mem", "168K", "--kv-host-mem", host_mem,
                 "--kv-disk", disk_dir, "--kv-disk-size", "2M", NULL);
    h_start_node(&c, "prefill", "prefill-0", NULL);
    h_wait_nodes(&c, 2, 120000);
    return c;
}

#define BLOCK_BYTES 8192 /* one block's K/V: 2 layers x K, V x 2 heads x 16 x 16 tokens x f32 */

/* A, B, then A again on start_decode_tiers's cluster: the bytes A again
 * had shipped. With corrupt_path (the decode node's tier file), every
 * block B evicted there is waited for and flipped before A again. */
static uint64_t decode_transfer_run(h_cluster_t *c, h_gen_t *g, uint32_t **ref, size_t *n_ref,
                                    const char *corrupt_path)
{
    for (int i = 0; i < 2; i++)
        send_one(c, g, ref, n_ref, i);
    if (corrupt_path)
        flip_disk_blocks(c, "decode-0", corrupt_path);
    h_totals_t before, after;
    h_totals(c, &before);
    send_one(c, g, ref, n_ref, 0); /* the cold run's output */
    h_totals(c, &after);
    h_wait_no_blocks_used(c, 30000);
    return after.kv_bytes - before.kv_bytes;
}

static void test_tiers_decode_transfer(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvf-test-tiers-XXXXXX";
    assert_non_null(mkdtemp(dir));
    h_gen_t g[2];
    uint32_t *ref[2];
    size_t n_ref[2];
    make_prompts(g, ref, n_ref, 2);
    h_cluster_t c = start_decode_tiers(dir, "384K"); /* 48 blocks of RAM */
    uint64_t shipped = decode_transfer_run(&c, g, ref, n_ref, NULL);
    int dn = h_find(&c, "decode-0");
    assert_int_equal(h_terminate(&c, dn, 60000), 0);
    /* the 19 offered blocks came back from RAM: only the last one travelled */
    if (shipped != BLOCK_BYTES ||
        !h_log_holds(&c, dn, ", 19 ram + 0 disk hits, 304 prompt tokens from them, 0 corrupt")) {
        h_cluster_stop(&c, true);
        fail_msg("A again shipped %llu bytes (one block: %d); the decode node's tier counters "
                 "are not the expected ones",
                 (unsigned long long)shipped, BLOCK_BYTES);
    }
    h_cluster_stop(&c, false);
    h_gens_free(g, ref, 2);
    assert_int_equal(rmdir(dir), 0);
}

static void test_tiers_decode_transfer_corrupt(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvf-test-tiers-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof(path), "%s/kvf-kv-tier.bin", dir);
    h_gen_t g[2];
    uint32_t *ref[2];
    size_t n_ref[2];
    make_prompts(g, ref, n_ref, 2);
    h_cluster_t c = start_decode_tiers(dir, "0"); /* disk only */
    uint64_t shipped = decode_transfer_run(&c, g, ref, n_ref, path);
    int dn = h_find(&c, "decode-0");
    if (shipped != 20 * BLOCK_BYTES || !h_log_holds(&c, dn, "failed its checks")) {
        h_cluster_stop(&c, true);
        fail_msg("A again shipped %llu bytes (the whole prompt: %d), or no corrupt block was "
                 "reported",
                 (unsigned long long)shipped, 20 * BLOCK_BYTES);
    }
    h_cluster_stop(&c, false);
    h_gens_free(g, ref, 2);
    assert_int_equal(rmdir(dir), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_tiers_hit, h_teardown),
        cmocka_unit_test_teardown(test_tiers_decode_local, h_teardown),
        cmocka_unit_test_teardown(test_tiers_corrupt, h_teardown),
        cmocka_unit_test_teardown(test_tiers_decode_transfer, h_teardown),
        cmocka_unit_test_teardown(test_tiers_decode_transfer_corrupt, h_teardown),
    };
    /* KVF_TEST_FILTER=test_name (glob) runs a subset. */
    if (getenv("KVF_TEST_FILTER"))
        cmocka_set_test_filter(getenv("KVF_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
