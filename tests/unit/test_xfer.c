/* Transfer API (kvf/xfer.h) over UCX, between two real processes: this test
 * is the sender (prefill side); kvf_xfer_peer, started with fork+exec, is
 * the receiver (decode side) and answers commands on a pipe. Everything runs
 * on 127.0.0.1 (UCX_NET_DEVICES=lo) with bounded waits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kvf/clock.h"
#include "kvf/crc32c.h"
#include "kvf/gpu.h"
#include "kvf/log.h"
#include "kvf/xfer.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
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

#define PEER_BIN KVF_BIN_DIR "/kvf_xfer_peer"
#define REPLY_MS 20000
#define POOL     (4u << 20)

static const kvf_xfer_geometry_t geom = {.block_size = 16,
                                         .n_layers = 2,
                                         .n_kv_heads = 2,
                                         .head_dim = 64,
                                         .dtype = KVF_XFER_DTYPE_F32,
                                         .layout = 1};

/* ---- the peer process ---------------------------------------------------- */

typedef struct {
    pid_t pid;
    int to, from; /* its stdin, its stdout */
    char buf[1 << 17];
    size_t have;
    uint8_t *desc;
    size_t desc_len;
} peer_t;

typedef struct {
    uint64_t landed, bytes, last, rejected, stale, mismatch, released, expired, aborted, dropped;
} peer_stats_t;

/* Reads exactly len bytes (buffered data first) within the reply deadline. */
static int peer_read(peer_t *p, void *out, size_t len)
{
    uint8_t *o = out;
    uint64_t until = kvf_clock_ns() + (uint64_t)REPLY_MS * 1000000u;
    while (len) {
        if (p->have) {
            size_t n = p->have < len ? p->have : len;
            memcpy(o, p->buf, n);
            memmove(p->buf, p->buf + n, p->have - n);
            p->have -= n;
            o += n;
            len -= n;
            continue;
        }
        struct pollfd pfd = {.fd = p->from, .events = POLLIN};
        if (poll(&pfd, 1, kvf_clock_ms_until(until)) <= 0)
            return -1;
        ssize_t r = read(p->from, p->buf, sizeof(p->buf));
        if (r <= 0)
            return -1;
        p->have = (size_t)r;
    }
    return 0;
}

/* Reads one reply line into line (NUL-terminated, without the newline). */
static int peer_line(peer_t *p, char *line, size_t cap)
{
    size_t n = 0;
    for (;;) {
        char c;
        if (peer_read(p, &c, 1) != 0)
            return -1;
        if (c == '\n')
            break;
        if (n + 1 < cap)
            line[n++] = c;
    }
    line[n] = 0;
    return 0;
}

static void peer_cmd(peer_t *p, char *reply, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void peer_cmd(peer_t *p, char *reply, size_t cap, const char *fmt, ...)
{
    char line[1 << 16];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
    va_end(ap);
    assert_true(n > 0 && (size_t)n < sizeof(line) - 1);
    line[n++] = '\n';
    assert_int_equal(write(p->to, line, (size_t)n), n);
    assert_int_equal(peer_line(p, reply, cap), 0);
}

static void peer_ok(peer_t *p, const char *cmd)
{
    char reply[256];
    peer_cmd(p, reply, sizeof(reply), "%s", cmd);
    if (strcmp(reply, "ok"))
        fail_msg("peer: '%s' -> '%s'", cmd, reply);
}

static peer_stats_t peer_stats(peer_t *p)
{
    char reply[512];
    peer_cmd(p, reply, sizeof(reply), "stats");
    peer_stats_t s;
    int n = sscanf(reply,
                   "stats landed=%" SCNu64 " bytes=%" SCNu64 " last=%" SCNu64 " rejected=%" SCNu64
                   " stale=%" SCNu64 " mismatch=%" SCNu64 " released=%" SCNu64 " expired=%" SCNu64
                   " aborted=%" SCNu64 " dropped=%" SCNu64,
                   &s.landed, &s.bytes, &s.last, &s.rejected, &s.stale, &s.mismatch, &s.released,
                   &s.expired, &s.aborted, &s.dropped);
    if (n != 10)
        fail_msg("peer: bad stats reply '%s'", reply);
    return s;
}

/* Polls the peer's counters until landed >= n (or the time runs out). */
static peer_stats_t peer_wait_landed(peer_t *p, uint64_t n, int ms)
{
    uint64_t until = kvf_clock_ns() + (uint64_t)ms * 1000000u;
    peer_stats_t s;
    while ((s = peer_stats(p)).landed < n && kvf_clock_ns() < until)
        kvf_clock_sleep_ms(5);
    return s;
}

static int hexval(char c)
{
    return c <= '9' ? c - '0' : c - 'a' + 10;
}

static void peer_spawn(peer_t *p, const char *const *args)
{
    int to[2], from[2];
    assert_int_equal(pipe(to), 0);
    assert_int_equal(pipe(from), 0);
    const char *argv[16] = {PEER_BIN};
    int argc = 1;
    for (; args && args[argc - 1] && argc < 15; argc++)
        argv[argc] = args[argc - 1];
    argv[argc] = NULL;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(to[0], 0);
        dup2(from[1], 1);
        close(to[0]);
        close(to[1]);
        close(from[0]);
        close(from[1]);
        execv(PEER_BIN, (char *const *)argv);
        _exit(127);
    }
    close(to[0]);
    close(from[1]);
    memset(p, 0, sizeof(*p));
    p->pid = pid;
    p->to = to[1];
    p->from = from[0];
    char *line = malloc(1 << 16);
    assert_non_null(line);
    assert_int_equal(peer_line(p, line, 1 << 16), 0);
    assert_memory_equal(line, "desc ", 5);
    size_t hl = strlen(line + 5);
    p->desc_len = hl / 2;
    p->desc = malloc(p->desc_len);
    for (size_t i = 0; i < p->desc_len; i++)
        p->desc[i] = (uint8_t)(hexval(line[5 + 2 * i]) << 4 | hexval(line[6 + 2 * i]));
    free(line);
}

/* Asks the peer to quit and checks it exited cleanly (under ASan that
 * includes LeakSanitizer finding nothing). */
static void peer_quit(peer_t *p)
{
    assert_int_equal(write(p->to, "quit\n", 5), 5);
    int status = 0;
    uint64_t until = kvf_clock_ns() + 20000000000ull;
    pid_t r;
    while ((r = waitpid(p->pid, &status, WNOHANG)) == 0 && kvf_clock_ns() < until)
        kvf_clock_sleep_ms(5);
    if (r == 0) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, &status, 0);
        fail_msg("peer did not exit");
    }
    close(p->to);
    close(p->from);
    free(p->desc);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* ---- helpers ------------------------------------------------------------- */

static void fill_pattern(uint8_t *pool, uint64_t bytes, uint64_t seed)
{
    uint64_t s = seed * 2654435761u + 1; /* the same generator as the peer's "fill" */
    for (uint64_t i = 0; i < bytes; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        pool[i] = (uint8_t)(s >> 56);
    }
}

static kvf_xfer_t *sender_create(uint8_t *pool, uint32_t timeout_ms, bool checksum)
{
    kvf_xfer_config_t cfg = {
        .backend = KVF_XFER_UCX,
        .pool = pool,
        .pool_bytes = POOL,
        .geometry = geom,
        .timeout_ms = timeout_ms,
        .checksum = checksum,
    };
    kvf_xfer_t *x = NULL;
    assert_int_equal(kvf_xfer_create(&cfg, &x), KVF_OK);
    return x;
}

static kvf_status_t post_wait(kvf_xfer_peer_t *peer, uint64_t req, uint64_t epoch,
                              const kvf_xfer_slice_t *s, size_t n, uint32_t flags)
{
    kvf_xfer_batch_spec_t spec = {
        .req_id = req, .epoch = epoch, .slices = s, .n_slices = n, .flags = flags};
    kvf_xfer_batch_t *b;
    kvf_status_t st = kvf_xfer_post(peer, &spec, &b);
    if (st != KVF_OK)
        return st;
    st = kvf_xfer_wait(b, -1);
    kvf_xfer_batch_release(b);
    return st;
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the DIR's own */
}

static long rss_kib(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/statm", (int)pid);
    FILE *f = fopen(path, "r");
    long size = 0, res = 0;
    if (!f)
        return -1;
    if (fscanf(f, "%ld %ld", &size, &res) != 2)
        res = -1;
    fclose(f);
    return res * (sysconf(_SC_PAGESIZE) / 1024);
}

static void use_tls(const char *tls)
{
    setenv("UCX_TLS", tls, 1);
}

/* ---- tests --------------------------------------------------------------- */

/* Random blocks, layer by layer (the prefill pattern), then whole blocks
 * through the coalescing path; the receiver's pool must then hold exactly
 * the sent bytes in the reserved blocks and its own pattern elsewhere. */
static void ship_random_blocks(const char *tls, bool checksum, bool two_sided)
{
    use_tls(tls);
    const char *args[3] = {NULL};
    int na = 0;
    if (checksum)
        args[na++] = "--checksum";
    if (two_sided)
        args[na++] = "--two-sided";
    peer_t *p = malloc(sizeof(*p));
    peer_spawn(p, args);
    peer_ok(p, "fill 7");

    uint8_t *pool = malloc(POOL);
    fill_pattern(pool, POOL, 99);
    kvf_xfer_t *x = sender_create(pool, 5000, false);
    kvf_xfer_peer_t *peer;
    assert_int_equal(kvf_xfer_connect(x, p->desc, p->desc_len, &peer), KVF_OK);

    uint64_t bb = kvf_xfer_block_bytes(&geom), nblocks = POOL / bb;
    uint64_t layer = bb / geom.n_layers;
    enum { N = 24 };
    uint32_t src[N], dst[N];
    bool used[256] = {0};
    srand(12345);
    /* Pairs 0..3 are consecutive runs on both sides (coalescable). */
    for (int i = 0; i < N; i++) {
        uint32_t d;
        do
            d = (uint32_t)(rand() % (int)(nblocks - 1));
        while (used[d] || (i < 4 && used[d + 1]));
        if (i > 0 && i < 4)
            d = dst[i - 1] + 1;
        used[d] = true;
        dst[i] = d;
        src[i] = i < 4 ? 100 + (uint32_t)i : (uint32_t)(rand() % (int)nblocks);
    }
    char cmd[4096];
    int n = snprintf(cmd, sizeof(cmd), "reserve 42 3 60000 ");
    for (int i = 0; i < N; i++)
        n += snprintf(cmd + n, sizeof(cmd) - (size_t)n, "%s%" PRIu64 ":%" PRIu64, i ? "," : "",
                      dst[i] * bb, bb);
    peer_ok(p, cmd);

    /* Two-sided: a slice of a request without a reservation is dropped by
     * the receiver (the byte comparison below proves the block untouched). */
    if (two_sided) {
        uint32_t free_blk = 0;
        while (used[free_blk])
            free_blk++;
        kvf_xfer_slice_t stale = {0, free_blk * bb, bb};
        assert_int_equal(post_wait(peer, 999, 1, &stale, 1, KVF_XFER_LAST), KVF_OK);
    }
    kvf_xfer_stats_t st0, st1;
    kvf_xfer_stats(x, &st0);
    kvf_xfer_slice_t s[N];
    /* Layers of pairs 4..N-1, one batch per layer. */
    for (uint32_t l = 0; l < geom.n_layers; l++) {
        for (int i = 4; i < N; i++)
            s[i - 4] = (kvf_xfer_slice_t){src[i] * bb + l * layer, dst[i] * bb + l * layer, layer};
        assert_int_equal(post_wait(peer, 42, 3, s, N - 4, 0), KVF_OK);
    }
    /* Whole blocks of pairs 0..3 as (block, layer) slices: 8 slices that
     * coalesce into one put. */
    int k = 0;
    for (int i = 0; i < 4; i++)
        for (uint32_t l = 0; l < geom.n_layers; l++)
            s[k++] = (kvf_xfer_slice_t){src[i] * bb + l * layer, dst[i] * bb + l * layer, layer};
    assert_int_equal(post_wait(peer, 42, 3, s, (size_t)k, KVF_XFER_LAST), KVF_OK);
    kvf_xfer_stats(x, &st1);
    assert_int_equal(st1.batches_ok - st0.batches_ok, 3);
    assert_int_equal(st1.puts_issued - st0.puts_issued, 2 * (N - 4) + 1);

    peer_stats_t ps = peer_wait_landed(p, 3, 10000);
    assert_int_equal(ps.landed, 3);
    assert_int_equal(ps.last, 1);
    assert_int_equal(ps.rejected, two_sided ? 1 : 0);
    assert_int_equal(ps.dropped, two_sided ? 1 : 0);
    assert_int_equal(ps.bytes, (uint64_t)N * bb);

    uint8_t *expect = malloc(POOL), *got = malloc(POOL);
    fill_pattern(expect, POOL, 7);
    for (int i = 0; i < N; i++)
        memcpy(expect + dst[i] * bb, pool + src[i] * bb, bb);
    char reply[64];
    peer_cmd(p, reply, sizeof(reply), "dump 0 %u", POOL);
    assert_int_equal(peer_read(p, got, POOL), 0);
    for (uint64_t i = 0; i < POOL; i++)
        if (got[i] != expect[i])
            fail_msg("%s: byte %" PRIu64 " (block %" PRIu64 ") differs", tls, i, i / bb);

    kvf_xfer_disconnect(peer);
    kvf_xfer_destroy(x);
    peer_quit(p);
    free(expect);
    free(got);
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

/* Descriptors are untrusted: each kind of damage gets its own error. */
static void test_descriptor_checks(void **state)
{
    (void)state;
    use_tls("sm,self");
    const char *args[] = {"--head-dim", "128", NULL};
    peer_t *p = malloc(sizeof(*p));
    peer_spawn(p, args);
    uint8_t *pool = malloc(POOL);
    kvf_xfer_t *x = sender_create(pool, 5000, false);
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
    uint32_t crc = kvf_crc32c(0, d, len - 4);
    memcpy(d + len - 4, &crc, 4);
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
    crc = kvf_crc32c(0, d, len - 4);
    memcpy(d + len - 4, &crc, 4);
    assert_int_equal(kvf_xfer_check_desc(x, d, len), KVF_ERR_INVAL);
    d[24] ^= 1;
    d[48] = KVF_XFER_DTYPE_BF16; /* dtype */
    crc = kvf_crc32c(0, d, len - 4);
    memcpy(d + len - 4, &crc, 4);
    assert_int_equal(kvf_xfer_check_desc(x, d, len), KVF_ERR_MISMATCH);
    d[48] = KVF_XFER_DTYPE_F32;
    d[12] ^= 4; /* body length */
    crc = kvf_crc32c(0, d, len - 4);
    memcpy(d + len - 4, &crc, 4);
    assert_int_equal(kvf_xfer_check_desc(x, d, len), KVF_ERR_FORMAT);

    /* Slices outside either pool are refused before anything is sent. */
    d[12] ^= 4;
    crc = kvf_crc32c(0, d, len - 4);
    memcpy(d + len - 4, &crc, 4);
    assert_int_equal(kvf_xfer_connect(x, d, len, &peer), KVF_OK);
    kvf_xfer_slice_t bad[] = {{POOL - 8, 0, 16}};
    kvf_xfer_batch_spec_t spec = {.req_id = 1, .slices = bad, .n_slices = 1};
    kvf_xfer_batch_t *b;
    assert_int_equal(kvf_xfer_post(peer, &spec, &b), KVF_ERR_INVAL);
    kvf_xfer_slice_t wrap[] = {{0, UINT64_MAX - 4, 16}};
    spec.slices = wrap;
    assert_int_equal(kvf_xfer_post(peer, &spec, &b), KVF_ERR_INVAL);

    kvf_xfer_destroy(x);
    peer_quit(p);
    free(d);
    free(pool);
    free(p);
}

/* The receiver is SIGKILLed while batches flow: the sender must see an
 * error within its timeout, never hang, and leave no fd behind. */
static void peer_killed(const char *tls)
{
    use_tls(tls);
    const uint32_t timeout_ms = 1000;
    uint8_t *pool = malloc(POOL);
    memset(pool, 0x5a, POOL);
    /* Warm UCX's process-wide state so the fd count compares like with like. */
    kvf_xfer_destroy(sender_create(pool, timeout_ms, false));
    int fds0 = count_fds();

    peer_t *p = malloc(sizeof(*p));
    peer_spawn(p, NULL);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "reserve 9 1 60000 0:%u", POOL);
    peer_ok(p, cmd);
    kvf_xfer_t *x = sender_create(pool, timeout_ms, false);
    kvf_xfer_peer_t *peer;
    assert_int_equal(kvf_xfer_connect(x, p->desc, p->desc_len, &peer), KVF_OK);

    kvf_xfer_slice_t s[16];
    for (int i = 0; i < 16; i++)
        s[i] = (kvf_xfer_slice_t){(uint64_t)i * (POOL / 16), (uint64_t)(15 - i) * (POOL / 16),
                                  POOL / 32};
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
    int status;
    waitpid(p->pid, &status, 0);
    assert_true(WIFSIGNALED(status));
    close(p->to);
    close(p->from);
    free(p->desc);
    assert_int_equal(count_fds(), fds0);
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

/* 10,000 small batches: neither process grows in memory, nor this one in
 * file descriptors. */
static void test_many_small_batches(void **state)
{
    (void)state;
    use_tls("sm,self");
    peer_t *p = malloc(sizeof(*p));
    peer_spawn(p, NULL);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "reserve 1 1 600000 0:%u", POOL);
    peer_ok(p, cmd);
    uint8_t *pool = malloc(POOL);
    memset(pool, 1, POOL);
    kvf_xfer_t *x = sender_create(pool, 5000, false);
    kvf_xfer_peer_t *peer;
    assert_int_equal(kvf_xfer_connect(x, p->desc, p->desc_len, &peer), KVF_OK);
    long rss0 = 0, prss0 = 0;
    int fds0 = 0;
    enum { WARM = 1000, TOTAL = 10000 };
    for (int i = 0; i < TOTAL; i++) {
        if (i == WARM) {
            peer_wait_landed(p, WARM, 10000);
            rss0 = rss_kib(getpid());
            prss0 = rss_kib(p->pid);
            fds0 = count_fds();
        }
        kvf_xfer_slice_t s = {(uint64_t)(i % 1024) * 4096, (uint64_t)((i * 7) % 1024) * 4096, 4096};
        assert_int_equal(post_wait(peer, 1, 1, &s, 1, 0), KVF_OK);
    }
    peer_stats_t ps = peer_wait_landed(p, TOTAL, 20000);
    long rss1 = rss_kib(getpid()), prss1 = rss_kib(p->pid);
    int fds1 = count_fds();
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
    peer_quit(p);
    free(pool);
    free(p);
}

/* Fencing: completions without a live (req_id, epoch) are rejected and
 * counted; a cancelled reservation is released by the sender's final
 * completion (flush before it) or else only after its lease and grace. */
static void test_fencing(void **state)
{
    (void)state;
    use_tls("sm,self");
    const char *args[] = {"--grace-ms", "100", NULL};
    peer_t *p = malloc(sizeof(*p));
    peer_spawn(p, args);
    uint8_t *pool = malloc(POOL);
    memset(pool, 3, POOL);
    kvf_xfer_t *x = sender_create(pool, 5000, false);
    kvf_xfer_peer_t *peer;
    assert_int_equal(kvf_xfer_connect(x, p->desc, p->desc_len, &peer), KVF_OK);
    kvf_xfer_slice_t s = {0, 0, 4096};

    /* Cancelled, then its late (last) completion arrives: rejected as
     * stale, and it is the fence point that releases the blocks. */
    peer_ok(p, "reserve 5 1 60000 0:32768");
    peer_ok(p, "cancel 5 1");
    peer_stats_t ps = peer_stats(p);
    assert_int_equal(ps.released, 0);
    assert_int_equal(post_wait(peer, 5, 1, &s, 1, KVF_XFER_LAST), KVF_OK);
    uint64_t until = kvf_clock_ns() + 5000000000ull;
    while ((ps = peer_stats(p)).released < 1 && kvf_clock_ns() < until)
        kvf_clock_sleep_ms(2);
    assert_int_equal(ps.landed, 0);
    assert_int_equal(ps.rejected, 1);
    assert_int_equal(ps.stale, 1);
    assert_int_equal(ps.released, 1);

    /* A completion from an older epoch is rejected; the live epoch's lands. */
    peer_ok(p, "reserve 6 2 60000 32768:32768");
    s.remote_off = 32768;
    assert_int_equal(post_wait(peer, 6, 1, &s, 1, 0), KVF_OK);
    assert_int_equal(post_wait(peer, 6, 2, &s, 1, KVF_XFER_LAST), KVF_OK);
    ps = peer_wait_landed(p, 1, 5000);
    assert_int_equal(ps.landed, 1);
    assert_int_equal(ps.stale, 2);
    /* Ranges outside the reservation are rejected, not landed. */
    peer_ok(p, "reserve 8 1 60000 65536:32768");
    s.remote_off = 0;
    assert_int_equal(post_wait(peer, 8, 1, &s, 1, 0), KVF_OK);
    until = kvf_clock_ns() + 5000000000ull;
    while ((ps = peer_stats(p)).rejected < 3 && kvf_clock_ns() < until)
        kvf_clock_sleep_ms(2);
    assert_int_equal(ps.rejected, 3);
    assert_int_equal(ps.stale, 2);
    assert_int_equal(ps.landed, 1);
    /* A finished reservation is released at once on cancel; a live one
     * is not. */
    peer_ok(p, "cancel 6 2");
    peer_ok(p, "cancel 8 1");
    ps = peer_stats(p);
    assert_int_equal(ps.released, 2);

    /* Cancelled with no completion at all: held until lease + grace. */
    uint64_t t0 = kvf_clock_ns();
    peer_ok(p, "reserve 7 1 300 131072:32768");
    peer_ok(p, "cancel 7 1");
    ps = peer_stats(p);
    assert_int_equal(ps.released, 2);
    until = kvf_clock_ns() + 5000000000ull;
    while ((ps = peer_stats(p)).released < 3 && kvf_clock_ns() < until)
        kvf_clock_sleep_ms(5);
    double ms = (double)(kvf_clock_ns() - t0) / 1e6;
    assert_int_equal(ps.released, 3);
    assert_true(ms >= 400.0 - 5);
    /* Its late completion is still rejected. */
    assert_int_equal(post_wait(peer, 7, 1, &s, 1, KVF_XFER_LAST), KVF_OK);
    until = kvf_clock_ns() + 5000000000ull;
    while ((ps = peer_stats(p)).rejected < 4 && kvf_clock_ns() < until)
        kvf_clock_sleep_ms(2);
    assert_int_equal(ps.stale, 3);
    assert_int_equal(ps.landed, 1);

    kvf_xfer_destroy(x);
    peer_quit(p);
    free(pool);
    free(p);
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
    use_tls(tls);
    kvf_xfer_config_t cfg = {.backend = KVF_XFER_UCX,
                             .pool_bytes = POOL,
                             .geometry = geom,
                             .grace_ms = 200,
                             .two_sided = two_sided};
    kvf_xfer_t *x;
    assert_int_equal(kvf_xfer_create(&cfg, &x), KVF_OK);
    kvf_xfer_range_t all = {0, POOL};
    uint64_t t0 = kvf_clock_ns(); /* the lease runs from here */
    assert_int_equal(kvf_xfer_reserve(x, 77, 1, &all, 1, 1500), KVF_OK);
    uint8_t *desc;
    size_t len;
    assert_int_equal(kvf_xfer_export(x, &desc, &len), KVF_OK);
    char *hex = malloc(2 * len + 1);
    for (size_t i = 0; i < len; i++)
        sprintf(hex + 2 * i, "%02x", desc[i]);
    free(desc);

    /* The sending peer prints its own descriptor first, as peer_spawn wants. */
    const char *args[] = {"--send", hex, NULL};
    peer_t *p = malloc(sizeof(*p));
    peer_spawn(p, args);
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
    int status;
    waitpid(p->pid, &status, 0);
    assert_true(WIFSIGNALED(status));
    close(p->to);
    close(p->from);
    free(p->desc);
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
            use_tls(cases[i].tls);
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
    kvf_xfer_config_t cfg = {.backend = KVF_XFER_NCCL,
                             .mem_type = KVF_XFER_MEM_CUDA,
                             .pool_bytes = POOL,
                             .geometry = geom,
                             .timeout_ms = 20000};
    kvf_xfer_t *tx, *rx;
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(kvf_xfer_create(&cfg, &tx), KVF_OK);
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    assert_int_equal(kvf_xfer_create(&cfg, &rx), KVF_OK);
    uint8_t *desc, *token;
    size_t desc_len, token_len;
    assert_int_equal(kvf_xfer_export(rx, &desc, &desc_len), KVF_OK);
    kvf_xfer_peer_t *to_rx, *from_tx;
    assert_int_equal(kvf_xfer_connect(tx, desc, desc_len, &to_rx), KVF_OK);
    assert_int_equal(kvf_xfer_peer_token(to_rx, &token, &token_len), KVF_OK);
    assert_int_equal(kvf_xfer_accept(rx, token, token_len, &from_tx), KVF_OK);

    uint8_t *host = malloc(POOL), *back = malloc(POOL);
    fill_pattern(host, POOL, 5);
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(cudaMemcpy(kvf_xfer_pool(tx), host, POOL, cudaMemcpyHostToDevice),
                     cudaSuccess);
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    assert_int_equal(cudaMemset(kvf_xfer_pool(rx), 0, POOL), cudaSuccess);
    uint64_t bb = kvf_xfer_block_bytes(&geom);
    kvf_xfer_range_t r = {10 * bb, 8 * bb};
    assert_int_equal(kvf_xfer_reserve(rx, 3, 1, &r, 1, 60000), KVF_OK);

    kvf_xfer_slice_t s[8];
    for (int i = 0; i < 8; i++) /* blocks 40..47 -> 10..17, reversed pairs */
        s[i] = (kvf_xfer_slice_t){(uint64_t)(47 - i) * bb, (uint64_t)(10 + i) * bb, bb};
    kvf_xfer_slice_t stale = {0, 20 * bb, bb}; /* outside the reservation */
    kvf_xfer_batch_spec_t bad = {.req_id = 9, .epoch = 1, .slices = &stale, .n_slices = 1};
    kvf_xfer_batch_spec_t good = {
        .req_id = 3, .epoch = 1, .slices = s, .n_slices = 8, .flags = KVF_XFER_LAST};
    kvf_xfer_batch_t *b1 = NULL, *b2 = NULL;
    uint64_t until = kvf_clock_ns() + 60000000000ull;
    int landed = 0, rejected = 0;
    while ((!b2 || kvf_xfer_test(b2) == KVF_ERR_AGAIN || !landed || !rejected) &&
           kvf_clock_ns() < until) {
        kvf_xfer_progress(tx);
        kvf_xfer_progress(rx);
        if (!b1 && kvf_xfer_post(to_rx, &bad, &b1) != KVF_ERR_AGAIN)
            assert_non_null(b1);
        if (b1 && !b2)
            assert_int_equal(kvf_xfer_post(to_rx, &good, &b2), KVF_OK);
        kvf_xfer_event_t ev;
        while (kvf_xfer_poll(rx, &ev) == KVF_OK) {
            landed += ev.kind == KVF_XFER_EV_LANDED && ev.req_id == 3 && ev.last;
            rejected += ev.kind == KVF_XFER_EV_REJECTED && ev.status == KVF_ERR_STALE;
        }
    }
    assert_int_equal(landed, 1);
    assert_int_equal(rejected, 1);
    assert_int_equal(kvf_xfer_test(b1), KVF_OK);
    assert_int_equal(kvf_xfer_test(b2), KVF_OK);
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    assert_int_equal(cudaMemcpy(back, kvf_xfer_pool(rx), POOL, cudaMemcpyDeviceToHost),
                     cudaSuccess);
    for (uint64_t blk = 0; blk < POOL / bb; blk++) {
        bool in = blk >= 10 && blk < 18;
        for (uint64_t i = 0; i < bb; i++) {
            uint8_t want = in ? host[(47 - (blk - 10)) * bb + i] : 0;
            if (back[blk * bb + i] != want)
                fail_msg("nccl: block %" PRIu64 " byte %" PRIu64 " differs", blk, i);
        }
    }
    kvf_xfer_batch_release(b1);
    kvf_xfer_batch_release(b2);
    kvf_xfer_destroy(tx);
    kvf_xfer_destroy(rx);
    free(desc);
    free(token);
    free(host);
    free(back);
#endif
}

int main(void)
{
    kvf_log_init("test_xfer", NULL);
    /* TCP only on the loopback device; no UCX transport outside this host. */
    setenv("UCX_NET_DEVICES", "lo", 1);
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shm_random_blocks),
        cmocka_unit_test(test_tcp_random_blocks),
        cmocka_unit_test(test_tcp_two_sided_blocks),
        cmocka_unit_test(test_descriptor_checks),
        cmocka_unit_test(test_fencing),
        cmocka_unit_test(test_many_small_batches),
        cmocka_unit_test(test_shm_peer_killed),
        cmocka_unit_test(test_tcp_peer_killed),
        cmocka_unit_test(test_shm_sender_killed),
        cmocka_unit_test(test_tcp_sender_killed),
        cmocka_unit_test(test_caps),
        cmocka_unit_test(test_nccl_pair),
    };
    if (getenv("KVF_TEST_FILTER")) /* e.g. KVF_TEST_FILTER=test_tcp_* */
        cmocka_set_test_filter(getenv("KVF_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
