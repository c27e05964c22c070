/* The transfer test rig (xfer_rig.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "xfer_rig.h"

#include "kvf/clock.h"
#include "kvf/hex.h"
#include "kvf/log.h"

#include <dirent.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define PEER_BIN KVF_BIN_DIR "/kvf_xfer_peer"
#define REPLY_MS 20000

const kvf_xfer_geometry_t xrig_geom = {.block_size = 16,
                                       .n_layers = 2,
                                       .n_kv_heads = 2,
                                       .head_dim = 64,
                                       .dtype = KVF_XFER_DTYPE_F32,
                                       .layout = 1};

void xrig_init(const char *name)
{
    kvf_log_init(name, NULL);
    /* TCP only on the loopback device; no UCX transport outside this host. */
    setenv("UCX_NET_DEVICES", "lo", 1);
    signal(SIGPIPE, SIG_IGN);
    if (getenv("KVF_TEST_FILTER")) /* e.g. KVF_TEST_FILTER=test_tcp_* */
        cmocka_set_test_filter(getenv("KVF_TEST_FILTER"));
}

/* ---- the peer process ---------------------------------------------------- */

/* Reads exactly len bytes (buffered data first) within the reply deadline. */
int xrig_read(xrig_peer_t *p, void *out, size_t len)
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
static int xrig_line(xrig_peer_t *p, char *line, size_t cap)
{
    size_t n = 0;
    for (;;) {
        char c;
        if (xrig_read(p, &c, 1) != 0)
            return -1;
        if (c == '\n')
            break;
        if (n + 1 < cap)
            line[n++] = c;
    }
    line[n] = 0;
    return 0;
}

void xrig_cmd(xrig_peer_t *p, char *reply, size_t cap, const char *fmt, ...)
{
    char line[1 << 16];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
    va_end(ap);
    assert_true(n > 0 && (size_t)n < sizeof(line) - 1);
    line[n++] = '\n';
    assert_int_equal(write(p->to, line, (size_t)n), n);
    assert_int_equal(xrig_line(p, reply, cap), 0);
}

void xrig_ok(xrig_peer_t *p, const char *cmd)
{
    char reply[256];
    xrig_cmd(p, reply, sizeof(reply), "%s", cmd);
    if (strcmp(reply, "ok"))
        fail_msg("peer: '%s' -> '%s'", cmd, reply);
}

xrig_stats_t xrig_stats(xrig_peer_t *p)
{
    char reply[512];
    xrig_cmd(p, reply, sizeof(reply), "stats");
    xrig_stats_t s;
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
xrig_stats_t xrig_wait_landed(xrig_peer_t *p, uint64_t n, int ms)
{
    uint64_t until = kvf_clock_ns() + (uint64_t)ms * 1000000u;
    xrig_stats_t s;
    while ((s = xrig_stats(p)).landed < n && kvf_clock_ns() < until)
        kvf_clock_sleep_ms(5);
    return s;
}

void xrig_spawn(xrig_peer_t *p, const char *const *args)
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
    assert_int_equal(xrig_line(p, line, 1 << 16), 0);
    assert_memory_equal(line, "desc ", 5);
    assert_int_equal(kvf_hex_decode(line + 5, strlen(line + 5), &p->desc, &p->desc_len), KVF_OK);
    free(line);
}

/* Asks the peer to quit and checks it exited cleanly (under ASan that
 * includes LeakSanitizer finding nothing). */
void xrig_quit(xrig_peer_t *p)
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

void xrig_reap_killed(xrig_peer_t *p)
{
    int status;
    waitpid(p->pid, &status, 0);
    assert_true(WIFSIGNALED(status));
    close(p->to);
    close(p->from);
    free(p->desc);
}

/* ---- helpers ------------------------------------------------------------- */

void xrig_fill_pattern(uint8_t *pool, uint64_t bytes, uint64_t seed)
{
    uint64_t s = seed * 2654435761u + 1; /* the same generator as the peer's "fill" */
    for (uint64_t i = 0; i < bytes; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        pool[i] = (uint8_t)(s >> 56);
    }
}

kvf_xfer_t *xrig_sender_create(uint8_t *pool, uint32_t timeout_ms, bool checksum)
{
    kvf_xfer_config_t cfg = {
        .backend = KVF_XFER_UCX,
        .pool = pool,
        .pool_bytes = XRIG_POOL,
        .geometry = xrig_geom,
        .timeout_ms = timeout_ms,
        .checksum = checksum,
    };
    kvf_xfer_t *x = NULL;
    assert_int_equal(kvf_xfer_create(&cfg, &x), KVF_OK);
    return x;
}

kvf_status_t xrig_post_wait(kvf_xfer_peer_t *peer, uint64_t req, uint64_t epoch,
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

int xrig_count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the DIR's own */
}

long xrig_rss_kib(pid_t pid)
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

void xrig_use_tls(const char *tls)
{
    setenv("UCX_TLS", tls, 1);
}
