/* One-sided reads (kvf_xfer_get) in the rig of xfer_rig.h: random blocks
 * of the peer's pool read into random places of the local one (shared
 * memory, TCP), refused on a two-sided connection, a read that outlives
 * its lease ends TIMEOUT only once it wrote its last byte, and a peer
 * killed under a read ends it with an error, never a hang. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "xfer_rig.h"

#include "kvf/clock.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N_GETS = 20, N_RUN = 4 };

/* Progresses until the batch ends or ms pass; its last state. */
static kvf_status_t settle(kvf_xfer_t *x, kvf_xfer_batch_t *b, int ms)
{
    uint64_t until = kvf_clock_ns() + (uint64_t)ms * 1000000ull;
    kvf_status_t st;
    while ((st = kvf_xfer_test(b)) == KVF_ERR_AGAIN && kvf_clock_ns() < until)
        kvf_xfer_progress(x);
    return st;
}

static xrig_peer_t *spawn_filled(const char *const *args)
{
    xrig_peer_t *p = malloc(sizeof(*p));
    xrig_spawn(p, args);
    xrig_ok(p, "fill 7");
    return p;
}

/* N_GETS distinct local blocks receive random remote ones; the first
 * N_RUN are consecutive on both sides (one read after coalescing). */
static void read_random_blocks(const char *tls)
{
    xrig_use_tls(tls);
    xrig_peer_t *p = spawn_filled(NULL);
    uint8_t *pool = malloc(XRIG_POOL), *expect = malloc(XRIG_POOL), *remote = malloc(XRIG_POOL);
    xrig_fill_pattern(pool, XRIG_POOL, 99);
    xrig_fill_pattern(remote, XRIG_POOL, 7);
    memcpy(expect, pool, XRIG_POOL);
    kvf_xfer_t *x = xrig_sender_create(pool, 5000, false);
    kvf_xfer_peer_t *peer;
    assert_int_equal(kvf_xfer_connect(x, p->desc, p->desc_len, &peer), KVF_OK);

    uint64_t bb = kvf_xfer_block_bytes(&xrig_geom), nblocks = XRIG_POOL / bb;
    bool used[256] = {false};
    kvf_xfer_slice_t s[N_GETS];
    srand(777);
    for (int i = 0; i < N_GETS; i++) {
        uint64_t dst = i && i < N_RUN ? s[i - 1].local_off / bb + 1 : (uint64_t)rand() % (nblocks - N_RUN);
        while (i >= N_RUN && used[dst])
            dst = (uint64_t)rand() % nblocks;
        if (i == 0)
            for (int k = 0; k < N_RUN; k++)
                used[dst + (uint64_t)k] = true;
        used[dst] = true;
        uint64_t src = i && i < N_RUN ? s[i - 1].remote_off / bb + 1 : (uint64_t)rand() % (nblocks - N_RUN);
        s[i] = (kvf_xfer_slice_t){dst * bb, src * bb, bb};
        memcpy(expect + dst * bb, remote + src * bb, bb);
    }
    kvf_xfer_batch_spec_t spec = {.req_id = 5, .epoch = 1, .slices = s, .n_slices = N_GETS,
                                  .not_after_ns = kvf_clock_ns() + 60000000000ull};
    kvf_xfer_batch_t *b;
    assert_int_equal(kvf_xfer_get(peer, &spec, &b), KVF_OK);
    assert_int_equal(kvf_xfer_wait(b, 20000), KVF_OK);
    kvf_xfer_batch_release(b);
    kvf_xfer_stats_t st;
    kvf_xfer_stats(x, &st);
    assert_int_equal(st.bytes_read, N_GETS * bb);
    assert_int_equal(st.bytes_posted, 0);
    for (uint64_t i = 0; i < XRIG_POOL; i++)
        if (pool[i] != expect[i])
            fail_msg("%s: byte %" PRIu64 " (block %" PRIu64 ") differs", tls, i, i / bb);
    /* Reads leave the peer's pool alone, and its counters. */
    xrig_stats_t ps = xrig_stats(p);
    assert_int_equal(ps.landed + ps.rejected, 0);

    kvf_xfer_disconnect(peer);
    kvf_xfer_destroy(x);
    xrig_quit(p);
    free(pool);
    free(expect);
    free(remote);
    free(p);
}

static void test_shm_get(void **state)
{
    (void)state;
    read_random_blocks("sm,self");
}

static void test_tcp_get(void **state)
{
    (void)state;
    read_random_blocks("tcp,self");
}

/* A receiver that hands out no rkey cannot be read; slices outside the
 * pools and flags are refused before anything moves; a lease already
 * over refuses the batch. */
static void test_get_refused(void **state)
{
    (void)state;
    xrig_use_tls("tcp,self");
    const char *two[] = {"--two-sided", NULL};
    for (int two_sided = 0; two_sided < 2; two_sided++) {
        xrig_peer_t *p = spawn_filled(two_sided ? two : NULL);
        uint8_t *pool = calloc(1, XRIG_POOL);
        kvf_xfer_t *x = xrig_sender_create(pool, 5000, false);
        kvf_xfer_peer_t *peer;
        assert_int_equal(kvf_xfer_connect(x, p->desc, p->desc_len, &peer), KVF_OK);
        kvf_xfer_slice_t s = {0, 0, 4096};
        kvf_xfer_batch_spec_t spec = {.req_id = 1, .epoch = 1, .slices = &s, .n_slices = 1};
        kvf_xfer_batch_t *b = NULL;
        if (two_sided) {
            /* (a two-sided connection forms first) */
            kvf_status_t st;
            uint64_t until = kvf_clock_ns() + 10000000000ull;
            while ((st = kvf_xfer_get(peer, &spec, &b)) == KVF_ERR_AGAIN &&
                   kvf_clock_ns() < until)
                kvf_xfer_progress(x);
            assert_int_equal(st, KVF_ERR_UNSUPPORTED);
        } else {
            spec.flags = KVF_XFER_LAST;
            assert_int_equal(kvf_xfer_get(peer, &spec, &b), KVF_ERR_INVAL);
            spec.flags = 0;
            s.remote_off = XRIG_POOL - 100;
            assert_int_equal(kvf_xfer_get(peer, &spec, &b), KVF_ERR_INVAL);
            s.remote_off = 0;
            spec.not_after_ns = kvf_clock_ns() - 1;
            assert_int_equal(kvf_xfer_get(peer, &spec, &b), KVF_ERR_TIMEOUT);
            spec.not_after_ns = 0;
            assert_int_equal(kvf_xfer_get(peer, &spec, &b), KVF_OK);
            assert_int_equal(kvf_xfer_wait(b, 20000), KVF_OK);
            kvf_xfer_batch_release(b);
        }
        kvf_xfer_disconnect(peer);
        kvf_xfer_destroy(x);
        xrig_quit(p);
        free(pool);
        free(p);
    }
}

/* Over TCP a read needs the peer to answer. A stopped peer holds it past
 * its lease: the batch stays AGAIN (its bytes may still come) and the
 * connection stays up; once the peer runs again the bytes come and the
 * batch ends TIMEOUT (they may be stale). Then a read under a peer that
 * is killed ends with an error. */
static void test_get_lease_and_death(void **state)
{
    (void)state;
    xrig_use_tls("tcp,self");
    xrig_peer_t *p = spawn_filled(NULL);
    uint8_t *pool = calloc(1, XRIG_POOL);
    kvf_xfer_t *x = xrig_sender_create(pool, 30000, false);
    kvf_xfer_peer_t *peer;
    assert_int_equal(kvf_xfer_connect(x, p->desc, p->desc_len, &peer), KVF_OK);
    kvf_xfer_slice_t s = {0, 0, 1u << 20};
    kvf_xfer_batch_spec_t spec = {.req_id = 1, .epoch = 1, .slices = &s, .n_slices = 1};
    kvf_xfer_batch_t *b;
    /* the connection up first: a read that completes */
    assert_int_equal(kvf_xfer_get(peer, &spec, &b), KVF_OK);
    assert_int_equal(kvf_xfer_wait(b, 20000), KVF_OK);
    kvf_xfer_batch_release(b);

    assert_int_equal(kill(p->pid, SIGSTOP), 0);
    uint64_t lease = kvf_clock_ns() + 300000000ull;
    spec.not_after_ns = lease;
    assert_int_equal(kvf_xfer_get(peer, &spec, &b), KVF_OK);
    while (kvf_clock_ns() < lease + 200000000ull)
        assert_int_equal(settle(x, b, 10), KVF_ERR_AGAIN);
    assert_int_equal(kvf_xfer_peer_status(peer), KVF_OK);
    assert_int_equal(kill(p->pid, SIGCONT), 0);
    assert_int_equal(settle(x, b, 20000), KVF_ERR_TIMEOUT);
    kvf_xfer_batch_release(b);
    assert_int_equal(kvf_xfer_peer_status(peer), KVF_OK);

    assert_int_equal(kill(p->pid, SIGSTOP), 0);
    spec.not_after_ns = 0;
    assert_int_equal(kvf_xfer_get(peer, &spec, &b), KVF_OK);
    assert_int_equal(settle(x, b, 50), KVF_ERR_AGAIN);
    assert_int_equal(kill(p->pid, SIGKILL), 0);
    kvf_status_t st = settle(x, b, 60000);
    assert_true(st != KVF_OK && st != KVF_ERR_AGAIN);
    kvf_xfer_batch_release(b);
    xrig_reap_killed(p);
    kvf_xfer_disconnect(peer);
    kvf_xfer_destroy(x);
    free(pool);
    free(p);
}

int main(void)
{
    xrig_init("test_xfer_get");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shm_get),
        cmocka_unit_test(test_tcp_get),
        cmocka_unit_test(test_get_refused),
        cmocka_unit_test(test_get_lease_and_death),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
