/* kvf_xfer_peer: the receiving (decode-side) process of test_xfer and of
 * `kvf bench transfer`. It opens a pool, prints its descriptor, then runs an
 * event loop over stdin commands and the transport's fd.
 *
 * Output: "desc <hex>" first; then one reply line per command.
 * Commands (one per line):
 *   reserve REQ EPOCH LEASE_MS OFF:LEN[,OFF:LEN...]   -> "ok" | "err <status>"
 *   cancel REQ EPOCH                                  -> "ok" | "err <status>"
 *   stats                                             -> "stats k=v ..."
 *   fill SEED          fills the pool with a pattern  -> "ok"
 *   dump OFF LEN       -> "dump LEN" then LEN raw bytes
 *   quit               -> exits 0 after closing the transport
 * Options: --pool-bytes N --head-dim N --checksum --grace-ms N --alloc
 *          --two-sided
 *
 * With --send HEXDESC it is a sender instead: it connects to that
 * descriptor, prints "sending" after its first batch, and posts batches of
 * request 77 epoch 1 (8 slices of 64 KiB) until it fails or is killed. */
#include "kvf/clock.h"
#include "kvf/log.h"
#include "kvf/xfer.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    uint64_t landed, landed_bytes, landed_last, rejected, rejected_stale, rejected_mismatch,
        released, expired, aborted;
} counters_t;

static void drain_events(kvf_xfer_t *x, counters_t *c)
{
    kvf_xfer_event_t ev;
    while (kvf_xfer_poll(x, &ev) == KVF_OK) {
        switch (ev.kind) {
        case KVF_XFER_EV_LANDED:
            c->landed++;
            c->landed_bytes += ev.bytes;
            c->landed_last += ev.last;
            break;
        case KVF_XFER_EV_REJECTED:
            c->rejected++;
            c->rejected_stale += ev.status == KVF_ERR_STALE;
            c->rejected_mismatch += ev.status == KVF_ERR_MISMATCH;
            break;
        case KVF_XFER_EV_RELEASED:
            c->released++;
            break;
        case KVF_XFER_EV_EXPIRED:
            c->expired++;
            break;
        case KVF_XFER_EV_ABORTED:
            c->aborted++;
            break;
        }
    }
}

static int write_all(const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t n = write(1, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static void reply(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void reply(const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof(line) - 2)
        n = sizeof(line) - 2;
    line[n++] = '\n';
    (void)write_all(line, (size_t)n);
}

static void do_reserve(kvf_xfer_t *x, char *args)
{
    uint64_t req, epoch;
    unsigned lease;
    int used = 0;
    if (sscanf(args, "%" SCNu64 " %" SCNu64 " %u %n", &req, &epoch, &lease, &used) != 3) {
        reply("err bad reserve");
        return;
    }
    kvf_xfer_range_t ranges[4096];
    size_t n = 0;
    for (char *tok = strtok(args + used, ","); tok && n < 4096; tok = strtok(NULL, ",")) {
        if (sscanf(tok, "%" SCNu64 ":%" SCNu64, &ranges[n].off, &ranges[n].len) != 2) {
            reply("err bad range");
            return;
        }
        n++;
    }
    kvf_status_t st = kvf_xfer_reserve(x, req, epoch, ranges, n, lease);
    if (st == KVF_OK)
        reply("ok");
    else
        reply("err %s", kvf_status_str(st));
}

static int send_loop(kvf_xfer_t *x, const char *hex, uint8_t *own_pool)
{
    size_t len = strlen(hex) / 2;
    uint8_t *desc = malloc(len);
    for (size_t i = 0; i < len; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1)
            return 2;
        desc[i] = (uint8_t)v;
    }
    kvf_xfer_peer_t *peer;
    kvf_status_t st = kvf_xfer_connect(x, desc, len, &peer);
    free(desc);
    kvf_xfer_slice_t s[8];
    for (int i = 0; i < 8; i++)
        s[i] = (kvf_xfer_slice_t){(uint64_t)i * 131072, (uint64_t)i * 131072, 65536};
    kvf_xfer_batch_spec_t spec = {.req_id = 77, .epoch = 1, .slices = s, .n_slices = 8};
    for (int n = 0; st == KVF_OK; n++) {
        kvf_xfer_batch_t *b;
        st = kvf_xfer_post(peer, &spec, &b);
        if (st != KVF_OK)
            break;
        st = kvf_xfer_wait(b, -1);
        kvf_xfer_batch_release(b);
        if (n == 0 && st == KVF_OK)
            reply("sending");
    }
    reply("err %s", kvf_status_str(st));
    kvf_xfer_destroy(x);
    free(own_pool);
    return 1;
}

int main(int argc, char **argv)
{
    kvf_log_init("xfer-peer", NULL);
    kvf_xfer_config_t cfg = {
        .backend = KVF_XFER_UCX,
        .pool_bytes = 4u << 20,
        .geometry = {.block_size = 16,
                     .n_layers = 2,
                     .n_kv_heads = 2,
                     .head_dim = 64,
                     .dtype = KVF_XFER_DTYPE_F32,
                     .layout = 1},
    };
    bool alloc = false;
    const char *send_to = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--pool-bytes") && i + 1 < argc)
            cfg.pool_bytes = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--head-dim") && i + 1 < argc)
            cfg.geometry.head_dim = (uint32_t)strtoul(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--n-layers") && i + 1 < argc)
            cfg.geometry.n_layers = (uint32_t)strtoul(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--grace-ms") && i + 1 < argc)
            cfg.grace_ms = (uint32_t)strtoul(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--checksum"))
            cfg.checksum = true;
        else if (!strcmp(argv[i], "--alloc"))
            alloc = true;
        else if (!strcmp(argv[i], "--two-sided"))
            cfg.two_sided = true;
        else if (!strcmp(argv[i], "--send") && i + 1 < argc)
            send_to = argv[++i];
        else {
            fprintf(stderr, "kvf_xfer_peer: unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    uint8_t *own_pool = NULL;
    if (!alloc) {
        own_pool = calloc(1, cfg.pool_bytes);
        if (!own_pool)
            return 1;
        cfg.pool = own_pool;
    }
    kvf_xfer_t *x;
    kvf_status_t st = kvf_xfer_create(&cfg, &x);
    if (st != KVF_OK) {
        reply("err %s", kvf_status_str(st));
        free(own_pool);
        return 1;
    }
    uint8_t *pool = kvf_xfer_pool(x);
    uint8_t *desc;
    size_t desc_len;
    if (kvf_xfer_export(x, &desc, &desc_len) != KVF_OK)
        return 1;
    char *hex = malloc(2 * desc_len + 1);
    for (size_t i = 0; i < desc_len; i++)
        sprintf(hex + 2 * i, "%02x", desc[i]);
    reply("desc %s", hex);
    free(hex);
    free(desc);
    if (send_to)
        return send_loop(x, send_to, own_pool);

    counters_t c = {0};
    char line[1 << 16];
    size_t have = 0;
    bool quit = false;
    unsigned idle = 0;
    while (!quit) {
        unsigned n = kvf_xfer_progress(x);
        drain_events(x, &c);
        idle = n ? 0 : idle + 1;
        /* Busy-poll while traffic flows (the bench measures latency), then
         * sleep on the fds. */
        int wait_ms = 0;
        if (idle > 4096 && kvf_xfer_arm(x) == KVF_OK) {
            wait_ms = kvf_xfer_timeout_ms(x);
            if (wait_ms < 0 || wait_ms > 100)
                wait_ms = 100;
        }
        struct pollfd pfd[2] = {{.fd = 0, .events = POLLIN},
                                {.fd = kvf_xfer_fd(x), .events = POLLIN}};
        if (poll(pfd, 2, wait_ms) <= 0 || !(pfd[0].revents & (POLLIN | POLLHUP)))
            continue;
        idle = 0;
        ssize_t r = read(0, line + have, sizeof(line) - 1 - have);
        if (r <= 0)
            break; /* the test went away */
        have += (size_t)r;
        char *nl;
        while ((nl = memchr(line, '\n', have))) {
            *nl = 0;
            char *cmd = line;
            drain_events(x, &c);
            if (!strncmp(cmd, "reserve ", 8)) {
                do_reserve(x, cmd + 8);
            } else if (!strncmp(cmd, "cancel ", 7)) {
                uint64_t req, epoch;
                if (sscanf(cmd + 7, "%" SCNu64 " %" SCNu64, &req, &epoch) != 2)
                    reply("err bad cancel");
                else if ((st = kvf_xfer_cancel(x, req, epoch)) != KVF_OK)
                    reply("err %s", kvf_status_str(st));
                else
                    reply("ok");
            } else if (!strcmp(cmd, "stats")) {
                kvf_xfer_progress(x);
                drain_events(x, &c);
                kvf_xfer_stats_t xs;
                kvf_xfer_stats(x, &xs);
                reply("stats landed=%" PRIu64 " bytes=%" PRIu64 " last=%" PRIu64
                      " rejected=%" PRIu64 " stale=%" PRIu64 " mismatch=%" PRIu64
                      " released=%" PRIu64 " expired=%" PRIu64 " aborted=%" PRIu64
                      " dropped=%" PRIu64,
                      c.landed, c.landed_bytes, c.landed_last, c.rejected, c.rejected_stale,
                      c.rejected_mismatch, c.released, c.expired, c.aborted, xs.slices_dropped);
            } else if (!strncmp(cmd, "fill ", 5)) {
                uint64_t s = strtoull(cmd + 5, NULL, 0) * 2654435761u + 1;
                for (uint64_t i = 0; i < cfg.pool_bytes; i++) {
                    s = s * 6364136223846793005ull + 1442695040888963407ull;
                    pool[i] = (uint8_t)(s >> 56);
                }
                reply("ok");
            } else if (!strncmp(cmd, "dump ", 5)) {
                uint64_t off, len;
                if (sscanf(cmd + 5, "%" SCNu64 " %" SCNu64, &off, &len) != 2 ||
                    off > cfg.pool_bytes || len > cfg.pool_bytes - off) {
                    reply("err bad dump");
                } else {
                    reply("dump %" PRIu64, len);
                    (void)write_all(pool + off, len);
                }
            } else if (!strcmp(cmd, "quit")) {
                quit = true;
            } else {
                reply("err unknown command");
            }
            size_t used = (size_t)(nl + 1 - line);
            memmove(line, nl + 1, have - used);
            have -= used;
        }
    }
    kvf_xfer_destroy(x);
    free(own_pool);
    return 0;
}
