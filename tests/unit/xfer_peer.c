/* kvf_xfer_peer: the receiving (decode-side) process of test_xfer. It opens
 * a pool, prints its descriptor, then runs an event loop over stdin commands
 * and the transport's fd.
 *
 * Output: "desc <hex>" first; then one reply line per command.
 * Commands (one per line):
 *   reserve REQ EPOCH LEASE_MS OFF:LEN[,OFF:LEN...]   -> "ok" | "err <status>"
 *   cancel REQ EPOCH                                  -> "ok" | "err <status>"
 *   renew REQ EPOCH    renews the lease (kvf_xfer_renew) -> "ok" | "err <status>"
 *   stats                                             -> "stats k=v ..."
 *   fill SEED          fills the pool with a pattern  -> "ok"
 *   dump OFF LEN       -> "dump LEN" then LEN raw bytes
 *   quit               -> exits 0 after closing the transport
 * Options: --pool-bytes N --head-dim N --kv-dtype NAME --checksum --grace-ms N
 *          --alloc --two-sided
 *
 * With --send HEXDESC it is a sender instead: it connects to that
 * descriptor, prints "sending" after its first batch, and posts batches of
 * request 77 epoch 1 (8 slices of 64 KiB, or --slice-bytes N) until it
 * fails or is killed. */
#include "kvf/clock.h"
#include "kvf/kv_format.h"
#include "kvf/hex.h"
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

/* The sender role (--send): connects to the descriptor in hex, then posts
 * batches until one fails. Returns the exit code. */
static int send_loop(kvf_xfer_t *x, const char *hex, uint64_t slice_bytes, uint8_t *own_pool)
{
    uint8_t *desc;
    size_t len;
    if (kvf_hex_decode(hex, strlen(hex) / 2 * 2, &desc, &len) != KVF_OK)
        return 2;
    kvf_xfer_peer_t *peer;
    kvf_status_t st = kvf_xfer_connect(x, desc, len, &peer);
    free(desc);
    kvf_xfer_slice_t s[8];
    for (int i = 0; i < 8; i++)
        s[i] = (kvf_xfer_slice_t){(uint64_t)i * 131072, (uint64_t)i * 131072,
                                  slice_bytes ? slice_bytes : 65536};
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

/* ---- the receiver: commands on stdin ----------------------------------- */

typedef struct {
    kvf_xfer_t *x;
    uint8_t *pool; /* (pool_bytes) the transport's pool */
    uint64_t pool_bytes;
    counters_t c;
    bool quit;
} peer_t;

/* cancel or renew (REQ EPOCH) */
static void do_req_op(peer_t *p, const char *args,
                      kvf_status_t (*op)(kvf_xfer_t *, uint64_t, uint64_t))
{
    uint64_t req, epoch;
    kvf_status_t st;
    if (sscanf(args, "%" SCNu64 " %" SCNu64, &req, &epoch) != 2)
        reply("err bad request id and epoch");
    else if ((st = op(p->x, req, epoch)) != KVF_OK)
        reply("err %s", kvf_status_str(st));
    else
        reply("ok");
}

static void do_stats(peer_t *p)
{
    kvf_xfer_progress(p->x);
    drain_events(p->x, &p->c);
    kvf_xfer_stats_t xs;
    kvf_xfer_stats(p->x, &xs);
    const counters_t *c = &p->c;
    reply("stats landed=%" PRIu64 " bytes=%" PRIu64 " last=%" PRIu64 " rejected=%" PRIu64
          " stale=%" PRIu64 " mismatch=%" PRIu64 " released=%" PRIu64 " expired=%" PRIu64
          " aborted=%" PRIu64 " dropped=%" PRIu64,
          c->landed, c->landed_bytes, c->landed_last, c->rejected, c->rejected_stale,
          c->rejected_mismatch, c->released, c->expired, c->aborted, xs.slices_dropped);
}

static void do_fill(peer_t *p, const char *args)
{
    uint64_t s = strtoull(args, NULL, 0) * 2654435761u + 1;
    for (uint64_t i = 0; i < p->pool_bytes; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        p->pool[i] = (uint8_t)(s >> 56);
    }
    reply("ok");
}

static void do_dump(peer_t *p, const char *args)
{
    uint64_t off, len;
    if (sscanf(args, "%" SCNu64 " %" SCNu64, &off, &len) != 2 || off > p->pool_bytes ||
        len > p->pool_bytes - off) {
        reply("err bad dump");
        return;
    }
    reply("dump %" PRIu64, len);
    (void)write_all(p->pool + off, len);
}

/* One command line, without its newline. */
static void run_command(peer_t *p, char *cmd)
{
    drain_events(p->x, &p->c);
    if (!strncmp(cmd, "reserve ", 8))
        do_reserve(p->x, cmd + 8);
    else if (!strncmp(cmd, "cancel ", 7))
        do_req_op(p, cmd + 7, kvf_xfer_cancel);
    else if (!strncmp(cmd, "renew ", 6))
        do_req_op(p, cmd + 6, kvf_xfer_renew);
    else if (!strcmp(cmd, "stats"))
        do_stats(p);
    else if (!strncmp(cmd, "fill ", 5))
        do_fill(p, cmd + 5);
    else if (!strncmp(cmd, "dump ", 5))
        do_dump(p, cmd + 5);
    else if (!strcmp(cmd, "quit"))
        p->quit = true;
    else
        reply("err unknown command");
}

/* Drives the transport until stdin is readable: busy-polls while traffic
 * flows (the bench measures latency), then sleeps on the fds. Returns
 * true when stdin has input (or hung up). */
static bool wait_for_input(peer_t *p, unsigned *idle)
{
    unsigned n = kvf_xfer_progress(p->x);
    drain_events(p->x, &p->c);
    *idle = n ? 0 : *idle + 1;
    int wait_ms = 0;
    if (*idle > 4096 && kvf_xfer_arm(p->x) == KVF_OK) {
        wait_ms = kvf_xfer_timeout_ms(p->x);
        if (wait_ms < 0 || wait_ms > 100)
            wait_ms = 100;
    }
    struct pollfd pfd[2] = {{.fd = 0, .events = POLLIN},
                            {.fd = kvf_xfer_fd(p->x), .events = POLLIN}};
    if (poll(pfd, 2, wait_ms) <= 0 || !(pfd[0].revents & (POLLIN | POLLHUP)))
        return false;
    *idle = 0;
    return true;
}

/* Reads and runs commands until "quit" or the end of stdin. */
static void command_loop(peer_t *p)
{
    char line[1 << 16];
    size_t have = 0;
    unsigned idle = 0;
    while (!p->quit) {
        if (!wait_for_input(p, &idle))
            continue;
        ssize_t r = read(0, line + have, sizeof(line) - 1 - have);
        if (r <= 0)
            break; /* the test went away */
        have += (size_t)r;
        char *nl;
        while ((nl = memchr(line, '\n', have))) {
            *nl = 0;
            run_command(p, line);
            size_t used = (size_t)(nl + 1 - line);
            memmove(line, nl + 1, have - used);
            have -= used;
        }
    }
}

/* ---- main ---------------------------------------------------------------- */

typedef struct {
    kvf_xfer_config_t cfg;
    bool alloc;           /* the transport allocates the pool */
    const char *send_to;  /* --send: the receiver's descriptor in hex */
    uint64_t slice_bytes; /* --slice-bytes: of each of a sent batch's 8 slices */
} peer_opts_t;

/* Returns 0, or 2 after naming an unknown argument. */
static int parse_args(int argc, char **argv, peer_opts_t *o)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--pool-bytes") && i + 1 < argc)
            o->cfg.pool_bytes = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--head-dim") && i + 1 < argc)
            o->cfg.geometry.head_dim = (uint32_t)strtoul(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--kv-dtype") && i + 1 < argc) {
            kvf_kv_dtype_t dt;
            if (kvf_kv_dtype_parse(argv[++i], &dt) != KVF_OK)
                return 2;
            o->cfg.geometry.dtype = (uint32_t)dt;
        } else if (!strcmp(argv[i], "--n-layers") && i + 1 < argc)
            o->cfg.geometry.n_layers = (uint32_t)strtoul(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--grace-ms") && i + 1 < argc)
            o->cfg.grace_ms = (uint32_t)strtoul(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--checksum"))
            o->cfg.checksum = true;
        else if (!strcmp(argv[i], "--alloc"))
            o->alloc = true;
        else if (!strcmp(argv[i], "--two-sided"))
            o->cfg.two_sided = true;
        else if (!strcmp(argv[i], "--send") && i + 1 < argc)
            o->send_to = argv[++i];
        else if (!strcmp(argv[i], "--slice-bytes") && i + 1 < argc)
            o->slice_bytes = strtoull(argv[++i], NULL, 0);
        else {
            fprintf(stderr, "kvf_xfer_peer: unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    return 0;
}

/* Prints "desc <hex>", the line the other process connects with. */
static kvf_status_t print_desc(kvf_xfer_t *x)
{
    uint8_t *desc;
    size_t desc_len;
    kvf_status_t st = kvf_xfer_export(x, &desc, &desc_len);
    if (st != KVF_OK)
        return st;
    char *hex = malloc(2 * desc_len + 1);
    if (!hex) {
        free(desc);
        return KVF_ERR_NOMEM;
    }
    kvf_hex_encode(desc, desc_len, hex);
    reply("desc %s", hex);
    free(hex);
    free(desc);
    return KVF_OK;
}

int main(int argc, char **argv)
{
    kvf_log_init("xfer-peer", NULL);
    peer_opts_t o = {
        .cfg = {.backend = KVF_XFER_UCX,
                .pool_bytes = 4u << 20,
                .geometry = {.block_size = 16,
                             .n_layers = 2,
                             .n_kv_heads = 2,
                             .head_dim = 64,
                             .dtype = KVF_XFER_DTYPE_F32,
                             .layout = 1}},
    };
    int rc = parse_args(argc, argv, &o);
    if (rc != 0)
        return rc;
    uint8_t *own_pool = NULL;
    if (!o.alloc) {
        own_pool = calloc(1, o.cfg.pool_bytes);
        if (!own_pool)
            return 1;
        o.cfg.pool = own_pool;
    }
    kvf_xfer_t *x;
    kvf_status_t st = kvf_xfer_create(&o.cfg, &x);
    if (st != KVF_OK) {
        reply("err %s", kvf_status_str(st));
        free(own_pool);
        return 1;
    }
    if (print_desc(x) != KVF_OK)
        return 1;
    if (o.send_to)
        return send_loop(x, o.send_to, o.slice_bytes, own_pool);
    peer_t p = {.x = x, .pool = kvf_xfer_pool(x), .pool_bytes = o.cfg.pool_bytes};
    command_loop(&p);
    kvf_xfer_destroy(x);
    free(own_pool);
    return 0;
}
