/* kvf-prefill's prefix reports with KV tiers (common/node_prefix.c,
 * common/kv_tier_report.c; docs/kv-tiers.md, "Reports"), in the rig of
 * prefill_rig.h playing the router: a node with a pool of 10 blocks serves
 * three 100-token prompts (7 blocks each, 6 full ones cached), so the
 * first prompt's cached blocks are evicted into a tier. The reports must
 * say so: the first prompt's hashes leave the pool's listing and are
 * listed in the tier (RAM, or disk when there is only a disk tier). Its
 * second run takes 4 blocks back from the tier (the reuse cap of a
 * 100-token prompt), bit for bit the cold run; the reports then list
 * those in the pool again and in no tier, and the heartbeats carry the
 * disk reads' measured time (Load.tier_disk_read_ns). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kvf/clock.h"
#include "prefill_rig.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_TOK 100

static bool in_pool(const rig_t *r, uint64_t h)
{
    for (uint32_t i = 0; i < r->prefix.n; i++)
        if (r->prefix.hashes[i] == h)
            return true;
    return false;
}

/* Whether blocks [from, to) of h are where want says: tier 1 or 2 and not
 * in the pool, or (want 0) in the pool and in no tier. */
static bool placed(const rig_t *r, const uint64_t *h, uint32_t from, uint32_t to, int want)
{
    for (uint32_t b = from; b < to; b++)
        if (prefix_view_tier(&r->prefix, h[b]) != want || in_pool(r, h[b]) != (want == 0))
            return false;
    return true;
}

/* Takes the node's reports until blocks [from, to) are placed as want. */
static void wait_placed(rig_t *r, const uint64_t *h, uint32_t from, uint32_t to, int want)
{
    uint64_t give_up = kvf_clock_ns() + 20000000000ull;
    while (!placed(r, h, from, to, want) && kvf_clock_ns() < give_up) {
        bool from_router = false;
        kvf_envelope_t *env = rig_next_msg(r, 50, &from_router);
        if (env)
            fail_msg("unexpected %s", kvf_envelope_body_name(env));
    }
    assert_true(placed(r, h, from, to, want));
}

/* Takes heartbeats until one carries a disk read time (one taken before
 * the reads may come after them). */
static void wait_disk_read_ns(rig_t *r)
{
    uint64_t give_up = kvf_clock_ns() + 20000000000ull;
    while (!r->last_disk_read_ns && kvf_clock_ns() < give_up) {
        bool from_router = false;
        kvf_envelope_t *env = rig_next_msg(r, 50, &from_router);
        if (env)
            fail_msg("unexpected %s", kvf_envelope_body_name(env));
    }
    assert_true(r->last_disk_read_ns > 0);
}

static void run(const char *const *tier_args, int tier)
{
    rig_t r;
    rig_start_args(&r, NULL, "10 blocks", "2048", tier_args);
    static uint32_t a[N_TOK], b[N_TOK], c[N_TOK];
    rig_make_prompt(a, N_TOK, 91);
    rig_make_prompt(b, N_TOK, 92);
    rig_make_prompt(c, N_TOK, 93);
    uint64_t h[8];
    assert_int_equal(rig_prompt_hashes(&r, a, N_TOK, h), 6);
    rig_prefill_round(&r, 700, a, N_TOK, 0);
    wait_placed(&r, h, 0, 6, 0);
    rig_prefill_round(&r, 701, b, N_TOK, 0);
    rig_prefill_round(&r, 702, c, N_TOK, 0);
    /* a's six cached blocks made room for b and c: in the tier now */
    wait_placed(&r, h, 0, 6, tier);
    /* a again: its first 4 blocks come back from the tier */
    rig_prefill_round(&r, 703, a, N_TOK, 64);
    wait_placed(&r, h, 0, 4, 0);
    rig_expect_no_blocks(&r);
    /* the disk reads were timed, and the heartbeats say how long one takes */
    if (tier == 2)
        wait_disk_read_ns(&r);
    else
        assert_int_equal(r.last_disk_read_ns, 0);
    rig_stop(&r);
}

static void test_reports_ram_tier(void **state)
{
    (void)state;
    const char *args[] = {"--kv-host-mem", "16M", NULL};
    run(args, 1);
}

static void test_reports_disk_tier(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvf_prefill_tiers_XXXXXX";
    assert_non_null(mkdtemp(dir));
    const char *args[] = {"--kv-disk", dir, "--kv-disk-size", "16M", NULL};
    run(args, 2);
    assert_int_equal(rmdir(dir), 0); /* the node removed its tier file */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_reports_ram_tier, rig_kill_child),
        cmocka_unit_test_teardown(test_reports_disk_tier, rig_kill_child),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
