/* Transfers when things go wrong, in the rig of xfer_rig.h: damaged
 * descriptors, slices outside a pool and a peer with another KV format
 * (refused), fencing
 * (completions without a live (req_id, epoch), cancelled reservations and
 * when their blocks come back), a receiver SIGKILLed while batches flow
 * (the sender sees an error, never hangs) and a sender SIGKILLed
 * mid-transfer (the receiver gets its blocks back). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "xfer_rig.h"

#include "kvf/clock.h"
#include "kvf/crc32c.h"
#include "kvf/hex.h"
#include "kvf/kv_format.h"
#include "kvf/log.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A descriptor's checksum (its last 4 bytes) over what it now holds. */
static void reseal(uint8_t *d, size_t len)
{
    uint32_t crc = kvf_crc32c(0, d, len - 4);
    memcpy(d + len - 4, &crc, 4);
}

/* Descriptors are untrusted: each kind of damage gets its own error. */
static void test_descriptor_checks(void **state)
{
    (void)state;
    xrig_use_tls("sm,self");
    const char *args[] = {"--head-dim", "128", NULL};
    xrig_peer_t *p = malloc(sizeof(*p));
    xrig_spawn(p, args);
    uint8_t *pool = malloc(XRIG_POOL);
    kvf_xfer_t *x = xrig_sender_create(pool, 5000, false);
    kvf_xfer_peer_t *peer = NULL;
    /* head_dim 128 there, 64 here. */
    assert_int_equal(kvf_xfer_connect(x, p->desc, p->desc_len, &peer), KVF_ERR_MISMATCH);
    assert_null(peer);

    uint8_t *d = malloc(p->desc_len);
    size_t len = p->desc_len;
    /* Make it agree on geometry, then damage one thing at a time. */
    memcpy(d, p->desc, len);
    d[44] = 64;
    d[45] = 0;
    reseal(d, len);
    assert_int_equal(kvf_xfer_check_desc(x, d, len), KVF_OK);
    assert_int_equal(kvf_xfer_check_desc(x, d, len - 1), KVF_ERR_FORMAT);
    assert_int_equal(kvf_xfer_check_desc(x, d, 3), KVF_ERR_FORMAT);
    assert_int_equal(kvf_xfer_check_desc(x, NULL, 0), KVF_ERR_FORMAT);
    d[4] = 2; /* version */
    assert_int_equal(kvf_xfer_check_desc(x, d, len), KVF_ERR_VERSION);
    d[4] = 1;
    d[len / 2] ^= 0x40; /* a flipped bit in the body */
    assert_int_equal(kvf_xfer_check_desc(x, d, len), KVF_ERR_FORMAT);
    d[len / 2] ^= 0x40;
    d[0] ^= 1; /* magic */
    assert_int_equal(kvf_xfer_check_desc(x, d, len), KVF_ERR_FORMAT);
    d[0] ^= 1;
    d[24] ^= 1; /* pool size no longer a whole number of blocks */
    reseal(d, len);
    assert_int_equal(kvf_xfer_check_desc(x, d, len), KVF_ERR_INVAL);
    d[24] ^= 1;
    d[48] = KVF_XFER_DTYPE_BF16; /* dtype */
    reseal(d, len);
    assert_int_equal(kvf_xfer_check_desc(x, d, len), KVF_ERR_MISMATCH);
    d[48] = KVF_XFER_DTYPE_F32;
    d[12] ^= 4; /* body length */
    reseal(d, len);
    assert_int_equal(kvf_xfer_check_desc(x, d, len), KVF_ERR_FORMAT);

    /* Slices outside either pool are refused before anything is sent. */
    d[12] ^= 4;
    reseal(d, len);
    assert_int_equal(kvf_xfer_connect(x, d, len, &peer), KVF_OK);
    kvf_xfer_slice_t bad[] = {{XRIG_POOL - 8, 0, 16}};
    kvf_xfer_batch_spec_t spec = {.req_id = 1, .slices = bad, .n_slices = 1};
    kvf_xfer_batch_t *b;
    assert_int_equal(kvf_xfer_post(peer, &spec, &b), KVF_ERR_INVAL);
    kvf_xfer_slice_t wrap[] = {{0, UINT64_MAX - 4, 16}};
    spec.slices = wrap;
    assert_int_equal(kvf_xfer_post(peer, &spec, &b), KVF_ERR_INVAL);

    kvf_xfer_destroy(x);
    xrig_quit(p);
    free(d);
    free(pool);
    free(p);
}

/* A block's bytes are the pool's for every KV format (fp8/int8 scales
 * counted), and a receiver whose pool has another format never pairs:
 * an int8 receiver refuses an f32 sender, and takes an int8 sender's
 * block whole, scales included. */
static void test_kv_format_pairing(void **state)
{
    (void)state;
    for (int dt = 0; dt < KVF_KV_N_DTYPES; dt++) {
        kvf_kv_geometry_t pg = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 64,
                                .block_size = 16, .dtype = (kvf_kv_dtype_t)dt};
        kvf_xfer_geometry_t xg = kvf_xfer_geometry_of_pool(&pg);
        assert_int_equal(xg.dtype, dt);
        assert_int_equal(kvf_xfer_block_bytes(&xg), kvf_kv_block_bytes(&pg));
    }
    kvf_xfer_geometry_t g8 = xrig_geom;
    g8.dtype = KVF_XFER_DTYPE_INT8;
    const uint64_t bb = kvf_xfer_block_bytes(&g8), pool_bytes = 64 * bb;
    assert_int_equal(bb, 2ull * 2 * 2 * 16 * (64 + 4));
    g8.dtype = 99;
    assert_int_equal(kvf_xfer_block_bytes(&g8), 0);
    g8.dtype = KVF_XFER_DTYPE_INT8;

    xrig_use_tls("sm,self");
    char pool_arg[32];
    snprintf(pool_arg, sizeof(pool_arg), "%" PRIu64, pool_bytes);
    const char *args[] = {"--kv-dtype", "int8", "--pool-bytes", pool_arg, NULL};
    xrig_peer_t *p = malloc(sizeof(*p));
    xrig_spawn(p, args);
    uint8_t *f32_pool = malloc(XRIG_POOL);
    kvf_xfer_t *x = xrig_sender_create(f32_pool, 5000, false);
    kvf_xfer_peer_t *peer = NULL;
    assert_int_equal(kvf_xfer_connect(x, p->desc, p->desc_len, &peer), KVF_ERR_MISMATCH);
    assert_null(peer);
    kvf_xfer_destroy(x);
    free(f32_pool);

    uint8_t *pool = malloc(pool_bytes), *got = malloc(bb);
    xrig_fill_pattern(pool, pool_bytes, 5);
    kvf_xfer_config_t cfg = {.backend = KVF_XFER_UCX, .pool = pool, .pool_bytes = pool_bytes,
                             .geometry = g8, .timeout_ms = 5000};
    assert_int_equal(kvf_xfer_create(&cfg, &x), KVF_OK);
    assert_int_equal(kvf_xfer_connect(x, p->desc, p->desc_len, &peer), KVF_OK);
    char cmd[128], reply[64];
    snprintf(cmd, sizeof(cmd), "reserve 3 1 60000 %" PRIu64 ":%" PRIu64, 7 * bb, bb);
    xrig_ok(p, cmd);
    kvf_xfer_slice_t s = {2 * bb, 7 * bb, bb}; /* block 2 here into block 7 there */
    assert_int_equal(xrig_post_wait(peer, 3, 1, &s, 1, KVF_XFER_LAST), KVF_OK);
    xrig_wait_landed(p, 1, 10000);
    xrig_cmd(p, reply, sizeof(reply), "dump %" PRIu64 " %" PRIu64, 7 * bb, bb);
    assert_int_equal(xrig_read(p, got, bb), 0);
    assert_memory_equal(got, pool + 2 * bb, bb);
    kvf_xfer_destroy(x);
    xrig_quit(p);
    free(got);
    free(pool);
    free(p);
}

/* Cancelled, then its late (last) completion arrives: rejected as stale,
 * and it is the fence point that releases the blocks. */
static void fence_late_last_completion(xrig_peer_t *p, kvf_xfer_peer_t *peer)
{
    kvf_xfer_slice_t s = {0, 0, 4096};
    xrig_ok(p, "reserve 5 1 60000 0:32768");
    xrig_ok(p, "cancel 5 1");
    xrig_stats_t ps = xrig_stats(p);
    assert_int_equal(ps.released, 0);
    assert_int_equal(xrig_post_wait(peer, 5, 1, &s, 1, KVF_XFER_LAST), KVF_OK);
    uint64_t until = kvf_clock_ns() + 5000000000ull;
    while ((ps = xrig_stats(p)).released < 1 && kvf_clock_ns() < until)
        kvf_clock_sleep_ms(2);
    assert_int_equal(ps.landed, 0);
    assert_int_equal(ps.rejected, 1);
    assert_int_equal(ps.stale, 1);
    assert_int_equal(ps.released, 1);
}

/* A completion from an older epoch is rejected, the live epoch's lands;
 * ranges outside the reservation are rejected, not landed; a finished
 * reservation is released at once on cancel, a live one is not. */
static void fence_epochs_and_ranges(xrig_peer_t *p, kvf_xfer_peer_t *peer)
{
    kvf_xfer_slice_t s = {0, 32768, 4096};
    xrig_ok(p, "reserve 6 2 60000 32768:32768");
    assert_int_equal(xrig_post_wait(peer, 6, 1, &s, 1, 0), KVF_OK);
    assert_int_equal(xrig_post_wait(peer, 6, 2, &s, 1, KVF_XFER_LAST), KVF_OK);
    xrig_stats_t ps = xrig_wait_landed(p, 1, 5000);
    assert_int_equal(ps.landed, 1);
    assert_int_equal(ps.stale, 2);
    xrig_ok(p, "reserve 8 1 60000 65536:32768");
    s.remote_off = 0;
    assert_int_equal(xrig_post_wait(peer, 8, 1, &s, 1, 0), KVF_OK);
    uint64_t until = kvf_clock_ns() + 5000000000ull;
    while ((ps = xrig_stats(p)).rejected < 3 && kvf_clock_ns() < until)
        kvf_clock_sleep_ms(2);
    assert_int_equal(ps.rejected, 3);
    assert_int_equal(ps.stale, 2);
    assert_int_equal(ps.landed, 1);
    xrig_ok(p, "cancel 6 2");
    xrig_ok(p, "cancel 8 1");
    ps = xrig_stats(p);
    assert_int_equal(ps.released, 2);
}

/* Cancelled with no completion at all: held until lease + grace (300 +
 * 100 ms); its late completion is still rejected. */
static void fence_unwritten(xrig_peer_t *p, kvf_xfer_peer_t *peer)
{
    kvf_xfer_slice_t s = {0, 0, 4096};
    uint64_t t0 = kvf_clock_ns();
    xrig_ok(p, "reserve 7 1 300 131072:32768");
    xrig_ok(p, "cancel 7 1");
    xrig_stats_t ps = xrig_stats(p);
    assert_int_equal(ps.released, 2);
    uint64_t until = kvf_clock_ns() + 5000000000ull;
    while ((ps = xrig_stats(p)).released < 3 && kvf_clock_ns() < until)
        kvf_clock_sleep_ms(5);
    double ms = (double)(kvf_clock_ns() - t0) / 1e6;
    assert_int_equal(ps.released, 3);
    assert_true(ms >= 400.0 - 5);
    assert_int_equal(xrig_post_wait(peer, 7, 1, &s, 1, KVF_XFER_LAST), KVF_OK);
    until = kvf_clock_ns() + 5000000000ull;
    while ((ps = xrig_stats(p)).rejected < 4 && kvf_clock_ns() < until)
        kvf_clock_sleep_ms(2);
    assert_int_equal(ps.stale, 3);
    assert_int_equal(ps.landed, 1);
}

/* A renewed lease does not end while it is renewed (every 100 ms for
 * three leases), nor while batches land (each one renews it); it ends one
 * lease after the last of either, and then a renewal is refused. */
static void fence_renewed(xrig_peer_t *p, kvf_xfer_peer_t *peer)
{
    const uint64_t lease_ns = 1000000000ull;
    xrig_stats_t ps0 = xrig_stats(p);
    xrig_ok(p, "reserve 11 1 1000 196608:32768");
    uint64_t t0 = kvf_clock_ns();
    while (kvf_clock_ns() - t0 < 3 * lease_ns) {
        xrig_ok(p, "renew 11 1");
        kvf_clock_sleep_ms(100);
    }
    kvf_xfer_slice_t s = {0, 196608, 4096};
    assert_int_equal(xrig_post_wait(peer, 11, 1, &s, 1, 0), KVF_OK);
    xrig_stats_t ps = xrig_wait_landed(p, ps0.landed + 1, 5000);
    uint64_t t_last = kvf_clock_ns();
    assert_int_equal(ps.landed, ps0.landed + 1);
    assert_int_equal(ps.expired, ps0.expired);
    uint64_t until = t_last + 10 * lease_ns;
    while ((ps = xrig_stats(p)).expired == ps0.expired && kvf_clock_ns() < until)
        kvf_clock_sleep_ms(5);
    assert_int_equal(ps.expired, ps0.expired + 1);
    assert_true(kvf_clock_ns() - t_last >= lease_ns - 5000000ull);
    char reply[256];
    xrig_cmd(p, reply, sizeof(reply), "renew 11 1");
    assert_true(strncmp(reply, "err", 3) == 0);
    xrig_ok(p, "cancel 11 1");
}

/* Fencing: completions without a live (req_id, epoch) are rejected and
 * counted; a cancelled reservation is released by the sender's final
 * completion (flush before it) or else only after its lease and grace.
 * The steps run in order on one receiver: each counts on the counters
 * the ones before left. */
static void test_fencing(void **state)
{
    (void)state;
    xrig_use_tls("sm,self");
    const char *args[] = {"--grace-ms", "100", NULL};
    xrig_peer_t *p = malloc(sizeof(*p));
    xrig_spawn(p, args);
    uint8_t *pool = malloc(XRIG_POOL);
    memset(pool, 3, XRIG_POOL);
    kvf_xfer_t *x = xrig_sender_create(pool, 5000, false);
    kvf_xfer_peer_t *peer;
    assert_int_equal(kvf_xfer_connect(x, p->desc, p->desc_len, &peer), KVF_OK);
    fence_late_last_completion(p, peer);
    fence_epochs_and_ranges(p, peer);
    fence_unwritten(p, peer);
    fence_renewed(p, peer);
    kvf_xfer_destroy(x);
    xrig_quit(p);
    free(pool);
    free(p);
}

/* The receiver is SIGKILLed while batches flow: the sender must see an
 * error within its timeout, never hang, and leave no fd behind. */
static void peer_killed(const char *tls)
{
    xrig_use_tls(tls);
    const uint32_t timeout_ms = 1000;
    uint8_t *pool = malloc(XRIG_POOL);
    memset(pool, 0x5a, XRIG_POOL);
    /* Warm UCX's process-wide state so the fd count compares like with like. */
    kvf_xfer_destroy(xrig_sender_create(pool, timeout_ms, false));
    int fds0 = xrig_count_fds();

    xrig_peer_t *p = malloc(sizeof(*p));
    xrig_spawn(p, NULL);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "reserve 9 1 60000 0:%u", XRIG_POOL);
    xrig_ok(p, cmd);
    kvf_xfer_t *x = xrig_sender_create(pool, timeout_ms, false);
    kvf_xfer_peer_t *peer;
    assert_int_equal(kvf_xfer_connect(x, p->desc, p->desc_len, &peer), KVF_OK);

    kvf_xfer_slice_t s[16];
    for (int i = 0; i < 16; i++)
        s[i] = (kvf_xfer_slice_t){(uint64_t)i * (XRIG_POOL / 16),
                                  (uint64_t)(15 - i) * (XRIG_POOL / 16), XRIG_POOL / 32};
    uint64_t t_kill = 0, t_err = 0;
    kvf_status_t st = KVF_OK;
    for (int i = 0;; i++) {
        if (i == 20) {
            kill(p->pid, SIGKILL);
            t_kill = kvf_clock_ns();
        }
        kvf_xfer_batch_spec_t spec = {.req_id = 9, .epoch = 1, .slices = s, .n_slices = 16};
        kvf_xfer_batch_t *b;
        st = kvf_xfer_post(peer, &spec, &b);
        if (st == KVF_OK) {
            st = kvf_xfer_wait(b, -1);
            kvf_xfer_batch_release(b);
        }
        if (st != KVF_OK) {
            t_err = kvf_clock_ns();
            break;
        }
        if (t_kill && kvf_clock_ns() - t_kill > 10ull * timeout_ms * 1000000u)
            fail_msg("%s: no error %u ms after the peer died", tls, 10 * timeout_ms);
    }
    assert_true(t_kill != 0);
    double ms = (double)(t_err - t_kill) / 1e6;
    kvf_log_info("test: %s: peer killed, sender saw '%s' after %.0f ms", tls, kvf_status_str(st),
                 ms);
    assert_true(st == KVF_ERR_PEER || st == KVF_ERR_TIMEOUT);
    assert_true(ms <= timeout_ms + 1500);
    assert_int_not_equal(kvf_xfer_peer_status(peer), KVF_OK);
    kvf_xfer_batch_spec_t spec = {.req_id = 9, .epoch = 1, .slices = s, .n_slices = 1};
    kvf_xfer_batch_t *b;
    assert_int_not_equal(kvf_xfer_post(peer, &spec, &b), KVF_OK);
    kvf_xfer_destroy(x);
    xrig_reap_killed(p);
    assert_int_equal(xrig_count_fds(), fds0);
    free(pool);
    free(p);
}

static void test_shm_peer_killed(void **state)
{
    (void)state;
    peer_killed("sm,self");
}

static void test_tcp_peer_killed(void **state)
{
    (void)state;
    peer_killed("tcp,self");
}

/* desc in hex (malloc'd, the caller's): how a peer process takes it. */
static char *hex_of(const uint8_t *desc, size_t len)
{
    char *hex = malloc(2 * len + 1);
    assert_non_null(hex);
    kvf_hex_encode(desc, len, hex);
    return hex;
}

/* The sender is SIGKILLed mid-transfer (a prefill node dying): the receiver
 * (this process) must keep running and get its blocks back. One-sided (RMA)
 * receiver: the lease expires and, once cancelled, the blocks come back
 * after lease + grace, not before. Two-sided receiver: cancel releases them
 * at once. (One-sided over TCP is not run: UCX 1.13's emulated puts can
 * abort the receiving process when the sender vanishes mid-put; TCP
 * deployments use two-sided mode.) */
static void sender_killed(const char *tls, bool two_sided)
{
    xrig_use_tls(tls);
    kvf_xfer_config_t cfg = {.backend = KVF_XFER_UCX,
                             .pool_bytes = XRIG_POOL,
                             .geometry = xrig_geom,
                             .grace_ms = 200,
                             .two_sided = two_sided};
    kvf_xfer_t *x;
    assert_int_equal(kvf_xfer_create(&cfg, &x), KVF_OK);
    kvf_xfer_range_t all = {0, XRIG_POOL};
    uint64_t t0 = kvf_clock_ns(); /* the lease runs from here */
    assert_int_equal(kvf_xfer_reserve(x, 77, 1, &all, 1, 1500), KVF_OK);
    uint8_t *desc;
    size_t len;
    assert_int_equal(kvf_xfer_export(x, &desc, &len), KVF_OK);
    char *hex = hex_of(desc, len);
    free(desc);

    /* The sending peer prints its own descriptor first, as xrig_spawn wants. */
    const char *args[] = {"--send", hex, NULL};
    xrig_peer_t *p = malloc(sizeof(*p));
    xrig_spawn(p, args);
    uint64_t until = t0 + 10000000000ull;
    uint64_t landed = 0, expired = 0, released = 0, killed_at = 0, cancelled_at = 0;
    while (kvf_clock_ns() < until && !released) {
        kvf_xfer_progress(x);
        kvf_xfer_event_t ev;
        while (kvf_xfer_poll(x, &ev) == KVF_OK) {
            landed += ev.kind == KVF_XFER_EV_LANDED;
            released += ev.kind == KVF_XFER_EV_RELEASED;
            if (ev.kind == KVF_XFER_EV_EXPIRED) {
                expired++;
                assert_int_equal(kvf_xfer_cancel(x, 77, 1), KVF_OK);
                cancelled_at = kvf_clock_ns();
            }
        }
        if (!killed_at && landed >= 20) {
            kill(p->pid, SIGKILL);
            killed_at = kvf_clock_ns();
        }
        if (two_sided && killed_at && !cancelled_at && kvf_clock_ns() - killed_at > 100000000) {
            assert_int_equal(kvf_xfer_cancel(x, 77, 1), KVF_OK);
            cancelled_at = kvf_clock_ns();
        }
    }
    double ms = (double)(kvf_clock_ns() - t0) / 1e6;
    kvf_log_info("test: %s%s: sender killed after %" PRIu64 " batches; released after %.0f ms", tls,
                 two_sided ? " two-sided" : "", landed, ms);
    assert_true(killed_at != 0);
    assert_int_equal(released, 1);
    if (two_sided) {
        assert_int_equal(expired, 0);
        assert_true(ms < 1500); /* at the cancel, before the lease would end */
    } else {
        assert_int_equal(expired, 1);
        assert_true(ms >= 1500 + 200 - 5); /* not before lease end + grace */
    }
    kvf_xfer_stats_t st;
    kvf_xfer_stats(x, &st);
    assert_int_equal(st.reservations_live, 0);
    /* The blocks can be reserved again. */
    assert_int_equal(kvf_xfer_reserve(x, 78, 1, &all, 1, 1000), KVF_OK);
    kvf_xfer_destroy(x);
    xrig_reap_killed(p);
    free(p);
    free(hex);
}

static void test_tcp_sender_killed(void **state)
{
    (void)state;
    sender_killed("tcp,self", true);
}

static void test_shm_sender_killed(void **state)
{
    (void)state;
    sender_killed("sm,self", false);
}

/* The receiver (this process) progresses until request req's batch
 * lands or ms pass; whether it landed. */
static bool landed_within(kvf_xfer_t *x, uint64_t req, int ms)
{
    uint64_t until = kvf_clock_ns() + (uint64_t)ms * 1000000ull;
    while (kvf_clock_ns() < until) {
        kvf_xfer_progress(x);
        kvf_xfer_event_t ev;
        while (kvf_xfer_poll(x, &ev) == KVF_OK)
            if (ev.kind == KVF_XFER_EV_LANDED && ev.req_id == req)
                return true;
    }
    return false;
}

/* A second sender's one batch to request req (64 KiB at 2 MiB) over desc:
 * posted and completed on its side. */
static void post_from(kvf_xfer_t *s, const uint8_t *desc, size_t len, uint64_t req)
{
    kvf_xfer_peer_t *peer;
    assert_int_equal(kvf_xfer_connect(s, desc, len, &peer), KVF_OK);
    kvf_xfer_slice_t sl = {.local_off = 0, .remote_off = 2u << 20, .len = 65536};
    kvf_xfer_batch_spec_t spec = {
        .req_id = req, .epoch = 1, .slices = &sl, .n_slices = 1, .flags = KVF_XFER_LAST};
    kvf_xfer_batch_t *b;
    assert_int_equal(kvf_xfer_post(peer, &spec, &b), KVF_OK);
    /* over shared memory the sender completes without the receiver */
    (void)kvf_xfer_wait(b, 2000);
    kvf_xfer_batch_release(b);
    kvf_xfer_disconnect(peer);
}

/* Over UCX's shared-memory transports every sender's messages go through
 * one queue of the receiver's; a sender SIGKILLed between claiming a slot
 * and filling it blocks that queue for every other sender, for good
 * (measured with plain UCX: 4 of 10 senders killed mid-stream of small
 * messages). kvf_xfer_relisten gives the receiver a new queue: a sender
 * that connects with the new descriptor lands its batch, whatever the
 * dead one left. A kill lands mid-message only sometimes, so several
 * senders are killed, each beside a receiver of its own; how many left
 * the old queue blocked is logged. */
static void test_shm_sender_killed_relisten(void **state)
{
    (void)state;
    xrig_use_tls("sm,self");
    enum { TRIALS = 6 };
    int blocked = 0;
    uint8_t *spool = calloc(1, XRIG_POOL);
    assert_non_null(spool);
    for (int t = 0; t < TRIALS; t++) {
        kvf_xfer_config_t cfg = {.backend = KVF_XFER_UCX,
                                 .pool_bytes = XRIG_POOL,
                                 .geometry = xrig_geom,
                                 .grace_ms = 200};
        kvf_xfer_t *x;
        assert_int_equal(kvf_xfer_create(&cfg, &x), KVF_OK);
        /* the killed sender writes the first MiB (xfer_peer.c, --send) */
        kvf_xfer_range_t first = {0, 1u << 20}, other = {2u << 20, 65536};
        assert_int_equal(kvf_xfer_reserve(x, 77, 1, &first, 1, 10000), KVF_OK);
        assert_int_equal(kvf_xfer_reserve(x, 78, 1, &other, 1, 10000), KVF_OK);
        assert_int_equal(kvf_xfer_reserve(x, 80, 1, &other, 1, 10000), KVF_OK);
        uint8_t *desc;
        size_t len;
        assert_int_equal(kvf_xfer_export(x, &desc, &len), KVF_OK);
        char *hex = hex_of(desc, len);
        /* small batches: most of its time goes to completion messages */
        const char *args[] = {"--send", hex, "--slice-bytes", "64", NULL};
        xrig_peer_t *p = malloc(sizeof(*p));
        assert_non_null(p);
        xrig_spawn(p, args);
        /* killed while it streams: after some batches, at a varying moment */
        uint64_t landed = 0, until = kvf_clock_ns() + 20000000000ull;
        while (landed < 20u + 7u * (unsigned)t && kvf_clock_ns() < until) {
            kvf_xfer_progress(x);
            kvf_xfer_event_t ev;
            while (kvf_xfer_poll(x, &ev) == KVF_OK)
                landed += ev.kind == KVF_XFER_EV_LANDED;
        }
        assert_true(landed >= 20);
        kill(p->pid, SIGKILL);
        xrig_reap_killed(p);
        free(p);

        /* Whether the old queue still delivers (not asserted: it depends
         * on where the kill landed): request 78's batch over it. */
        kvf_xfer_t *s = xrig_sender_create(spool, 2000, false);
        post_from(s, desc, len, 78);
        bool old_ok = landed_within(x, 78, 1000);
        blocked += !old_ok;
        kvf_xfer_destroy(s);

        /* A new queue: over the new descriptor request 80 lands, and the
         * descriptor differs from the old one. */
        assert_int_equal(kvf_xfer_relisten(x), KVF_OK);
        uint8_t *desc2;
        size_t len2;
        assert_int_equal(kvf_xfer_export(x, &desc2, &len2), KVF_OK);
        assert_true(len2 != len || memcmp(desc2, desc, len) != 0);
        s = xrig_sender_create(spool, 2000, false);
        post_from(s, desc2, len2, 80);
        assert_true(landed_within(x, 80, 10000));
        kvf_xfer_destroy(s);
        kvf_xfer_stats_t st;
        kvf_xfer_stats(x, &st);
        assert_int_equal(st.relistens, 1);
        free(desc);
        free(desc2);
        free(hex);
        kvf_xfer_destroy(x);
    }
    kvf_log_info("test: a killed sender left the old queue blocked in %d of %d trials", blocked,
                 TRIALS);
    free(spool);
}

/* The old endpoint a relisten keeps goes once it has delivered nothing
 * for one lease (none held here) plus the batch timeout, not before;
 * batches over the new one land before and after. */
static void test_relisten_retires(void **state)
{
    (void)state;
    xrig_use_tls("sm,self");
    kvf_xfer_config_t cfg = {
        .backend = KVF_XFER_UCX, .pool_bytes = XRIG_POOL, .geometry = xrig_geom, .timeout_ms = 300};
    kvf_xfer_t *x;
    assert_int_equal(kvf_xfer_create(&cfg, &x), KVF_OK);
    uint64_t t0 = kvf_clock_ns();
    assert_int_equal(kvf_xfer_relisten(x), KVF_OK);
    kvf_xfer_stats_t st;
    kvf_xfer_stats(x, &st);
    assert_int_equal(st.relistens, 1);
    assert_int_equal(st.listeners_retired, 1);
    uint8_t *desc;
    size_t len;
    assert_int_equal(kvf_xfer_export(x, &desc, &len), KVF_OK);
    uint8_t *spool = calloc(1, XRIG_POOL);
    assert_non_null(spool);
    kvf_xfer_range_t other = {2u << 20, 65536};
    for (uint64_t req = 81; req <= 82; req++) {
        /* reserved after the relisten: its lease does not keep the old
         * endpoint */
        assert_int_equal(kvf_xfer_reserve(x, req, 1, &other, 1, 10000), KVF_OK);
        kvf_xfer_t *s = xrig_sender_create(spool, 2000, false);
        post_from(s, desc, len, req);
        assert_true(landed_within(x, req, 10000));
        kvf_xfer_destroy(s);
        if (req == 81) {
            /* the old endpoint goes after 300 ms of silence */
            uint64_t until = kvf_clock_ns() + 10000000000ull;
            do {
                kvf_xfer_progress(x);
                kvf_xfer_stats(x, &st);
            } while (st.listeners_retired && kvf_clock_ns() < until);
            assert_int_equal(st.listeners_retired, 0);
            assert_true(kvf_clock_ns() - t0 >= 300000000ull);
        }
    }
    free(desc);
    free(spool);
    kvf_xfer_destroy(x);
}

int main(void)
{
    xrig_init("test_xfer_failures");
    const struct CMUnitTest tests[] = {
        /* what the transport refuses */
        cmocka_unit_test(test_descriptor_checks),
        cmocka_unit_test(test_kv_format_pairing),
        cmocka_unit_test(test_fencing),
        /* a process dies mid-transfer */
        cmocka_unit_test(test_shm_peer_killed),
        cmocka_unit_test(test_tcp_peer_killed),
        cmocka_unit_test(test_shm_sender_killed),
        cmocka_unit_test(test_shm_sender_killed_relisten),
        cmocka_unit_test(test_relisten_retires),
        cmocka_unit_test(test_tcp_sender_killed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
