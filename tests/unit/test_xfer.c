/* Transfer API (kvf/xfer.h) over UCX, in the rig of xfer_rig.h: random
 * blocks layer by layer and coalesced (shared memory, TCP, two-sided),
 * 10,000 small batches without growth, the transport's capabilities, and
 * an NCCL pair on two GPUs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "xfer_rig.h"

#include "kvf/clock.h"
#include "kvf/gpu.h"
#include "kvf/log.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef KVF_HAVE_NCCL
#include <cuda_runtime.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define KVF_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVF_TEST_ASAN 1
#endif
#endif

/* ---- random blocks -------------------------------------------------------- */

enum {
    N_PAIRS = 24, /* (source, destination) block pairs */
    N_RUN = 4,    /* pairs 0..N_RUN-1: consecutive runs on both sides */
};

/* Which of the sender's blocks go to which of the receiver's. */
typedef struct {
    uint64_t bb, layer; /* bytes of a block, of one layer's slice of it */
    uint32_t src[N_PAIRS], dst[N_PAIRS];
    bool used[256]; /* the receiver's blocks that are destinations */
} ship_plan_t;

/* Starts the receiver (two-sided, and checksummed, as asked) with its
 * pool filled with its own pattern. */
static xrig_peer_t *spawn_receiver(bool checksum, bool two_sided)
{
    const char *args[3] = {NULL};
    int na = 0;
    if (checksum)
        args[na++] = "--checksum";
    if (two_sided)
        args[na++] = "--two-sided";
    xrig_peer_t *p = malloc(sizeof(*p));
    xrig_spawn(p, args);
    xrig_ok(p, "fill 7");
    return p;
}

/* Distinct random destinations, random sources; the first N_RUN pairs are
 * consecutive runs on both sides (coalescable). */
static void plan_blocks(ship_plan_t *pl)
{
    pl->bb = kvf_xfer_block_bytes(&xrig_geom);
    pl->layer = pl->bb / xrig_geom.n_layers;
    uint64_t nblocks = XRIG_POOL / pl->bb;
    srand(12345);
    for (int i = 0; i < N_PAIRS; i++) {
        uint32_t d;
        do
            d = (uint32_t)(rand() % (int)(nblocks - 1));
        while (pl->used[d] || (i < N_RUN && pl->used[d + 1]));
        if (i > 0 && i < N_RUN)
            d = pl->dst[i - 1] + 1;
        pl->used[d] = true;
        pl->dst[i] = d;
        pl->src[i] = i < N_RUN ? 100 + (uint32_t)i : (uint32_t)(rand() % (int)nblocks);
    }
}

/* The receiver reserves every destination block for request 42, epoch 3. */
static void reserve_plan(xrig_peer_t *p, const ship_plan_t *pl)
{
    char cmd[4096];
    int n = snprintf(cmd, sizeof(cmd), "reserve 42 3 60000 ");
    for (int i = 0; i < N_PAIRS; i++)
        n += snprintf(cmd + n, sizeof(cmd) - (size_t)n, "%s%" PRIu64 ":%" PRIu64, i ? "," : "",
                      pl->dst[i] * pl->bb, pl->bb);
    xrig_ok(p, cmd);
}

/* Two-sided: a slice of a request without a reservation, into a block
 * that is no destination, which the receiver drops (the byte comparison
 * proves the block untouched). */
static void send_unreserved(kvf_xfer_peer_t *peer, const ship_plan_t *pl)
{
    uint32_t free_blk = 0;
    while (pl->used[free_blk])
        free_blk++;
    kvf_xfer_slice_t stale = {0, free_blk * pl->bb, pl->bb};
    assert_int_equal(xrig_post_wait(peer, 999, 1, &stale, 1, KVF_XFER_LAST), KVF_OK);
}

/* The slices of pair i's layer l. */
static kvf_xfer_slice_t pair_slice(const ship_plan_t *pl, int i, uint32_t l)
{
    return (kvf_xfer_slice_t){pl->src[i] * pl->bb + l * pl->layer,
                              pl->dst[i] * pl->bb + l * pl->layer, pl->layer};
}

/* The layers of pairs N_RUN.. one batch per layer (the prefill pattern),
 * then the whole blocks of the runs as (block, layer) slices in a LAST
 * batch, which coalesce into one put. */
static void ship_plan(kvf_xfer_t *x, kvf_xfer_peer_t *peer, const ship_plan_t *pl)
{
    kvf_xfer_stats_t st0, st1;
    kvf_xfer_stats(x, &st0);
    kvf_xfer_slice_t s[N_PAIRS];
    for (uint32_t l = 0; l < xrig_geom.n_layers; l++) {
        for (int i = N_RUN; i < N_PAIRS; i++)
            s[i - N_RUN] = pair_slice(pl, i, l);
        assert_int_equal(xrig_post_wait(peer, 42, 3, s, N_PAIRS - N_RUN, 0), KVF_OK);
    }
    int k = 0;
    for (int i = 0; i < N_RUN; i++)
        for (uint32_t l = 0; l < xrig_geom.n_layers; l++)
            s[k++] = pair_slice(pl, i, l);
    assert_int_equal(xrig_post_wait(peer, 42, 3, s, (size_t)k, KVF_XFER_LAST), KVF_OK);
    kvf_xfer_stats(x, &st1);
    assert_int_equal(st1.batches_ok - st0.batches_ok, 3);
    assert_int_equal(st1.puts_issued - st0.puts_issued, 2 * (N_PAIRS - N_RUN) + 1);
}

/* The receiver's pool holds exactly the sent bytes in the destination
 * blocks and its own pattern elsewhere. */
static void check_receiver_pool(xrig_peer_t *p, const uint8_t *pool, const ship_plan_t *pl,
                                const char *tls)
{
    uint8_t *expect = malloc(XRIG_POOL), *got = malloc(XRIG_POOL);
    xrig_fill_pattern(expect, XRIG_POOL, 7);
    for (int i = 0; i < N_PAIRS; i++)
        memcpy(expect + pl->dst[i] * pl->bb, pool + pl->src[i] * pl->bb, pl->bb);
    char reply[64];
    xrig_cmd(p, reply, sizeof(reply), "dump 0 %u", XRIG_POOL);
    assert_int_equal(xrig_read(p, got, XRIG_POOL), 0);
    for (uint64_t i = 0; i < XRIG_POOL; i++)
        if (got[i] != expect[i])
            fail_msg("%s: byte %" PRIu64 " (block %" PRIu64 ") differs", tls, i, i / pl->bb);
    free(expect);
    free(got);
}

/* Random blocks, layer by layer, then whole blocks through the coalescing
 * path, into a reservation on the receiver. */
static void ship_random_blocks(const char *tls, bool checksum, bool two_sided)
{
    xrig_use_tls(tls);
    xrig_peer_t *p = spawn_receiver(checksum, two_sided);
    uint8_t *pool = malloc(XRIG_POOL);
    xrig_fill_pattern(pool, XRIG_POOL, 99);
    kvf_xfer_t *x = xrig_sender_create(pool, 5000, false);
    kvf_xfer_peer_t *peer;
    assert_int_equal(kvf_xfer_connect(x, p->desc, p->desc_len, &peer), KVF_OK);
    ship_plan_t pl = {0};
    plan_blocks(&pl);
    reserve_plan(p, &pl);
    if (two_sided)
        send_unreserved(peer, &pl);
    ship_plan(x, peer, &pl);

    xrig_stats_t ps = xrig_wait_landed(p, 3, 10000);
    assert_int_equal(ps.landed, 3);
    assert_int_equal(ps.last, 1);
    assert_int_equal(ps.rejected, two_sided ? 1 : 0);
    assert_int_equal(ps.dropped, two_sided ? 1 : 0);
    assert_int_equal(ps.bytes, (uint64_t)N_PAIRS * pl.bb);
    check_receiver_pool(p, pool, &pl, tls);

    kvf_xfer_disconnect(peer);
    kvf_xfer_destroy(x);
    xrig_quit(p);
    free(pool);
    free(p);
}

static void test_shm_random_blocks(void **state)
{
    (void)state;
    ship_random_blocks("sm,self", true, false);
}

static void test_tcp_random_blocks(void **state)
{
    (void)state;
    ship_random_blocks("tcp,self", false, false);
}

/* Two-sided mode (the receiver places every slice) over TCP, checksummed. */
static void test_tcp_two_sided_blocks(void **state)
{
    (void)state;
    ship_random_blocks("tcp,self", true, true);
}

/* ---- growth, capabilities ------------------------------------------------- */

/* 10,000 small batches: neither process grows in memory, nor this one in
 * file descriptors. */
static void test_many_small_batches(void **state)
{
    (void)state;
    xrig_use_tls("sm,self");
    xrig_peer_t *p = malloc(sizeof(*p));
    xrig_spawn(p, NULL);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "reserve 1 1 600000 0:%u", XRIG_POOL);
    xrig_ok(p, cmd);
    uint8_t *pool = malloc(XRIG_POOL);
    memset(pool, 1, XRIG_POOL);
    kvf_xfer_t *x = xrig_sender_create(pool, 5000, false);
    kvf_xfer_peer_t *peer;
    assert_int_equal(kvf_xfer_connect(x, p->desc, p->desc_len, &peer), KVF_OK);
    long rss0 = 0, prss0 = 0;
    int fds0 = 0;
    enum { WARM = 1000, TOTAL = 10000 };
    for (int i = 0; i < TOTAL; i++) {
        if (i == WARM) {
            xrig_wait_landed(p, WARM, 10000);
            rss0 = xrig_rss_kib(getpid());
            prss0 = xrig_rss_kib(p->pid);
            fds0 = xrig_count_fds();
        }
        kvf_xfer_slice_t s = {(uint64_t)(i % 1024) * 4096, (uint64_t)((i * 7) % 1024) * 4096, 4096};
        assert_int_equal(xrig_post_wait(peer, 1, 1, &s, 1, 0), KVF_OK);
    }
    xrig_stats_t ps = xrig_wait_landed(p, TOTAL, 20000);
    long rss1 = xrig_rss_kib(getpid()), prss1 = xrig_rss_kib(p->pid);
    int fds1 = xrig_count_fds();
    kvf_log_info("test: %d batches: rss %ld -> %ld KiB, peer rss %ld -> %ld KiB, fds %d -> %d",
                 TOTAL, rss0, rss1, prss0, prss1, fds0, fds1);
    assert_int_equal(ps.landed, TOTAL);
    assert_int_equal(ps.rejected, 0);
    assert_int_equal(fds1, fds0);
#ifndef KVF_TEST_ASAN
    /* (ASan's quarantine holds freed memory back, so RSS says nothing
     * there; LeakSanitizer checks both processes at exit instead.) */
    assert_true(rss1 - rss0 < 1024);
    assert_true(prss1 - prss0 < 1024);
#endif
    kvf_xfer_destroy(x);
    xrig_quit(p);
    free(pool);
    free(p);
}

/* The transport answers what a node used to work out from UCX_TLS itself:
 * a one-sided receiver survives a dying sender only where TCP cannot carry
 * the puts; UCX's fd does not wake for shared-memory traffic. */
static void test_caps(void **state)
{
    (void)state;
    const struct {
        const char *tls; /* NULL: unset */
        bool survives;
    } cases[] = {
        {NULL, false},     {"", false},    {"tcp", false},     {"tcp,self", false}, {"all", false},
        {"sm,self", true}, {"^tcp", true}, {"^sm,cma", false}, {"rc,sm", true},
    };
    kvf_xfer_config_t cfg = {.backend = KVF_XFER_UCX};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (cases[i].tls)
            xrig_use_tls(cases[i].tls);
        else
            unsetenv("UCX_TLS");
        kvf_xfer_caps_t caps;
        assert_int_equal(kvf_xfer_caps(&cfg, &caps), KVF_OK);
        assert_true(caps.one_sided);
        if (caps.one_sided_survives_sender_death != cases[i].survives)
            fail_msg("UCX_TLS=%s: survives %d, expected %d",
                     cases[i].tls ? cases[i].tls : "(unset)", caps.one_sided_survives_sender_death,
                     cases[i].survives);
        assert_false(caps.fd_wakes_on_data);
        assert_true(caps.poll_ms > 0);
    }
    cfg.backend = KVF_XFER_NCCL;
    kvf_xfer_caps_t caps;
    kvf_status_t st = kvf_xfer_caps(&cfg, &caps);
#ifdef KVF_HAVE_NCCL
    assert_int_equal(st, KVF_OK);
    assert_false(caps.one_sided);
    assert_true(caps.one_sided_survives_sender_death);
    assert_false(caps.fd_wakes_on_data); /* no fd at all */
    assert_true(caps.poll_ms > 0);
#else
    assert_int_equal(st, KVF_ERR_UNSUPPORTED);
#endif
    cfg.backend = (kvf_xfer_backend_t)99;
    assert_int_equal(kvf_xfer_caps(&cfg, &caps), KVF_ERR_UNSUPPORTED);
}

/* ---- NCCL ----------------------------------------------------------------- */

#ifdef KVF_HAVE_NCCL
/* Both ranks of the pair in this process, each on its own GPU. */
typedef struct {
    kvf_xfer_t *tx, *rx; /* on GPU 0, on GPU 1 */
    kvf_xfer_peer_t *to_rx, *from_tx;
    uint8_t *desc, *token;
    kvf_xfer_batch_t *stale, *good; /* the batches nccl_ship posts */
} nccl_pair_t;

/* Creates both handles, connects tx to rx's descriptor and has rx accept
 * the connection's token. */
static void nccl_pair_open(nccl_pair_t *np)
{
    kvf_xfer_config_t cfg = {.backend = KVF_XFER_NCCL,
                             .mem_type = KVF_XFER_MEM_CUDA,
                             .pool_bytes = XRIG_POOL,
                             .geometry = xrig_geom,
                             .timeout_ms = 20000};
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(kvf_xfer_create(&cfg, &np->tx), KVF_OK);
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    assert_int_equal(kvf_xfer_create(&cfg, &np->rx), KVF_OK);
    size_t desc_len, token_len;
    assert_int_equal(kvf_xfer_export(np->rx, &np->desc, &desc_len), KVF_OK);
    assert_int_equal(kvf_xfer_connect(np->tx, np->desc, desc_len, &np->to_rx), KVF_OK);
    assert_int_equal(kvf_xfer_peer_token(np->to_rx, &np->token, &token_len), KVF_OK);
    assert_int_equal(kvf_xfer_accept(np->rx, np->token, token_len, &np->from_tx), KVF_OK);
}

static void nccl_pair_close(nccl_pair_t *np)
{
    kvf_xfer_batch_release(np->stale);
    kvf_xfer_batch_release(np->good);
    kvf_xfer_destroy(np->tx);
    kvf_xfer_destroy(np->rx);
    free(np->desc);
    free(np->token);
}

/* GPU 0's pool from host, GPU 1's zeroed. */
static void nccl_load_pools(nccl_pair_t *np, const uint8_t *host)
{
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(cudaMemcpy(kvf_xfer_pool(np->tx), host, XRIG_POOL, cudaMemcpyHostToDevice),
                     cudaSuccess);
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    assert_int_equal(cudaMemset(kvf_xfer_pool(np->rx), 0, XRIG_POOL), cudaSuccess);
}

/* A stale batch (request 9, into block 20: outside the reservation), then
 * blocks 40..47 into 10..17 reversed as request 3's LAST batch, driving
 * both handles until the good batch is done, has landed and the stale one
 * was rejected. */
static void nccl_ship(nccl_pair_t *np, uint64_t bb)
{
    kvf_xfer_slice_t s[8];
    for (int i = 0; i < 8; i++)
        s[i] = (kvf_xfer_slice_t){(uint64_t)(47 - i) * bb, (uint64_t)(10 + i) * bb, bb};
    kvf_xfer_slice_t stale = {0, 20 * bb, bb};
    kvf_xfer_batch_spec_t bad = {.req_id = 9, .epoch = 1, .slices = &stale, .n_slices = 1};
    kvf_xfer_batch_spec_t good = {
        .req_id = 3, .epoch = 1, .slices = s, .n_slices = 8, .flags = KVF_XFER_LAST};
    kvf_xfer_batch_t *b1 = NULL, *b2 = NULL;
    uint64_t until = kvf_clock_ns() + 60000000000ull;
    int landed = 0, rejected = 0;
    while ((!b2 || kvf_xfer_test(b2) == KVF_ERR_AGAIN || !landed || !rejected) &&
           kvf_clock_ns() < until) {
        kvf_xfer_progress(np->tx);
        kvf_xfer_progress(np->rx);
        if (!b1 && kvf_xfer_post(np->to_rx, &bad, &b1) != KVF_ERR_AGAIN)
            assert_non_null(b1);
        if (b1 && !b2)
            assert_int_equal(kvf_xfer_post(np->to_rx, &good, &b2), KVF_OK);
        kvf_xfer_event_t ev;
        while (kvf_xfer_poll(np->rx, &ev) == KVF_OK) {
            landed += ev.kind == KVF_XFER_EV_LANDED && ev.req_id == 3 && ev.last;
            rejected += ev.kind == KVF_XFER_EV_REJECTED && ev.status == KVF_ERR_STALE;
        }
    }
    np->stale = b1;
    np->good = b2;
    assert_int_equal(landed, 1);
    assert_int_equal(rejected, 1);
    assert_int_equal(kvf_xfer_test(b1), KVF_OK);
    assert_int_equal(kvf_xfer_test(b2), KVF_OK);
}

/* GPU 1's pool: blocks 10..17 hold GPU 0's 47..40, every other byte is 0
 * (the stale batch touched nothing). */
static void nccl_check_pool(nccl_pair_t *np, const uint8_t *host, uint64_t bb)
{
    uint8_t *back = malloc(XRIG_POOL);
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    assert_int_equal(cudaMemcpy(back, kvf_xfer_pool(np->rx), XRIG_POOL, cudaMemcpyDeviceToHost),
                     cudaSuccess);
    for (uint64_t blk = 0; blk < XRIG_POOL / bb; blk++) {
        bool in = blk >= 10 && blk < 18;
        for (uint64_t i = 0; i < bb; i++) {
            uint8_t want = in ? host[(47 - (blk - 10)) * bb + i] : 0;
            if (back[blk * bb + i] != want)
                fail_msg("nccl: block %" PRIu64 " byte %" PRIu64 " differs", blk, i);
        }
    }
    free(back);
}
#endif

/* NCCL pair: one process drives both ranks, each handle on its own GPU
 * (NCCL refuses two ranks of a communicator on one GPU). Random blocks go
 * from GPU 0's pool into a reservation on GPU 1's, compared byte for byte;
 * a stale batch's data must not touch GPU 1's pool. */
static void test_nccl_pair(void **state)
{
    (void)state;
#ifndef KVF_HAVE_NCCL
    kvf_log_info("test: skipped: this build has no NCCL backend");
    skip();
#else
    if (kvf_gpu_count() < 2) {
        kvf_log_info("test: skipped: the NCCL pair test needs 2 GPUs, this machine has %d",
                     kvf_gpu_count());
        skip();
    }
    nccl_pair_t np = {0};
    nccl_pair_open(&np);
    uint8_t *host = malloc(XRIG_POOL);
    xrig_fill_pattern(host, XRIG_POOL, 5);
    nccl_load_pools(&np, host);
    uint64_t bb = kvf_xfer_block_bytes(&xrig_geom);
    kvf_xfer_range_t r = {10 * bb, 8 * bb};
    assert_int_equal(kvf_xfer_reserve(np.rx, 3, 1, &r, 1, 60000), KVF_OK);
    nccl_ship(&np, bb);
    nccl_check_pool(&np, host, bb);
    nccl_pair_close(&np);
    free(host);
#endif
}

int main(void)
{
    xrig_init("test_xfer");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shm_random_blocks),
        cmocka_unit_test(test_tcp_random_blocks),
        cmocka_unit_test(test_tcp_two_sided_blocks),
        cmocka_unit_test(test_many_small_batches),
        cmocka_unit_test(test_caps),
        cmocka_unit_test(test_nccl_pair),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
