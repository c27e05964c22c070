/* kvf bench tiers: writes N blocks into a disk-only KV tier, then measures,
 * on the same file: a sequential O_DIRECT read of it (1 MiB requests, one
 * thread: the device's streaming rate), `dd iflag=direct` of it when dd is
 * there, and the tier fetching every block back (its checks included). The
 * tier's read rate is reported as a fraction of the sequential one. */
#include "bench_tiers.h"

#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvf/clock.h"
#include "kvf/flags.h"
#include "kvf/kv_tier.h"

#define SEQ_CHUNK (1u << 20)

typedef struct {
    const char *dir;
    uint64_t block_bytes;
    int blocks, io_threads, inflight;
} tiers_opts_t;

static void fill_block(uint8_t *b, size_t n, uint32_t seed)
{
    uint64_t x = 0x9e3779b97f4a7c15ull * (seed + 1);
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b[i] = (uint8_t)x;
    }
}

/* Puts every block (in rounds of at most inflight, each round flushed, so
 * none is dropped at the bound); returns the seconds it took. */
static double write_blocks(kvf_kv_tiers_t *t, const tiers_opts_t *o, uint8_t *buf, uint32_t *tokens)
{
    uint64_t t0 = kvf_clock_ns();
    for (int i = 0; i < o->blocks; i++) {
        fill_block(buf, o->block_bytes, (uint32_t)i);
        tokens[0] = (uint32_t)i;
        (void)kvf_kv_tiers_put(t, (uint64_t)i + 1, tokens, buf);
        if ((i + 1) % o->inflight == 0)
            kvf_kv_tiers_flush(t);
    }
    kvf_kv_tiers_flush(t);
    return (double)(kvf_clock_ns() - t0) / 1e9;
}

/* Fetches every block back, inflight at a time; returns the seconds, and
 * the blocks that came back good in *good_p. */
static double read_blocks(kvf_kv_tiers_t *t, const tiers_opts_t *o, uint8_t *dst, uint32_t *tokens,
                          int *good_p)
{
    int next = 0, done = 0, good = 0;
    uint64_t t0 = kvf_clock_ns();
    while (done < o->blocks) {
        while (next < o->blocks && next - done < o->inflight) {
            tokens[0] = (uint32_t)next;
            void *slot = dst + (size_t)(next % o->inflight) * o->block_bytes;
            kvf_status_t st =
                kvf_kv_tiers_fetch(t, (uint64_t)next + 1, tokens, slot, (uint64_t)next);
            if (st == KVF_ERR_AGAIN)
                break; /* every read buffer busy: after a poll */
            next++;
            done += st != KVF_OK; /* not held: counted, not good */
        }
        kvf_kv_fetch_done_t res[64];
        size_t n = kvf_kv_tiers_poll(t, res, 64);
        for (size_t k = 0; k < n; k++) {
            good += res[k].status == KVF_OK;
            done++;
        }
        if (!n) {
            struct pollfd pfd = {.fd = kvf_kv_tiers_fd(t), .events = POLLIN};
            (void)poll(&pfd, 1, 10);
        }
    }
    *good_p = good;
    return (double)(kvf_clock_ns() - t0) / 1e9;
}

/* Reads the whole file sequentially with O_DIRECT; GB/s, or 0. */
static double sequential_read(const char *path, uint64_t *bytes_p)
{
    int fd = open(path, O_RDONLY | O_DIRECT);
    if (fd < 0)
        fd = open(path, O_RDONLY);
    void *buf = NULL;
    if (fd < 0 || posix_memalign(&buf, 4096, SEQ_CHUNK)) {
        if (fd >= 0)
            close(fd);
        return 0;
    }
    uint64_t total = 0, t0 = kvf_clock_ns();
    ssize_t got;
    while ((got = pread(fd, buf, SEQ_CHUNK, (off_t)total)) > 0)
        total += (uint64_t)got;
    double s = (double)(kvf_clock_ns() - t0) / 1e9;
    close(fd);
    free(buf);
    *bytes_p = total;
    return s > 0 ? (double)total / s / 1e9 : 0;
}

/* The rate at the end of dd's line ("..., 1.5 GB/s"), in GB/s; 0 if none. */
static double dd_rate(const char *line)
{
    const char *comma = strrchr(line, ',');
    double v = 0;
    char unit[8] = "";
    if (!comma || sscanf(comma + 1, "%lf %7s", &v, unit) != 2)
        return 0;
    return !strcmp(unit, "GB/s")   ? v
           : !strcmp(unit, "MB/s") ? v / 1e3
           : !strcmp(unit, "kB/s") ? v / 1e6
                                   : 0;
}

/* `dd if=path of=/dev/null bs=1M iflag=direct`: its own rate line, or
 * "(dd not run)". */
static void run_dd(const char *path, char *line, size_t len)
{
    snprintf(line, len, "(dd not run)");
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "dd if='%s' of=/dev/null bs=1M iflag=direct 2>&1", path);
    FILE *p = popen(cmd, "r");
    if (!p)
        return;
    char buf[256];
    while (fgets(buf, sizeof(buf), p))
        if (strstr(buf, "copied")) {
            buf[strcspn(buf, "\n")] = 0;
            snprintf(line, len, "%s", buf);
        }
    pclose(p);
}

static int parse_opts(int argc, char **argv, tiers_opts_t *o)
{
    *o = (tiers_opts_t){.block_bytes = 2u << 20, .blocks = 256, .io_threads = 4, .inflight = 16};
    kvf_flag_t flags[] = {
        {"dir", KVF_FLAG_STRING, &o->dir, "DIR", "directory of the tier file (required)", NULL},
        {"block-bytes", KVF_FLAG_SIZE, &o->block_bytes, "BYTES",
         "one KV block (default 2M: 16 tokens of a Llama-3-8B-shaped bf16 cache)", NULL},
        {"blocks", KVF_FLAG_INT, &o->blocks, "N", "blocks written and read back", NULL},
        {"io-threads", KVF_FLAG_INT, &o->io_threads, "N", "the tier's I/O threads", NULL},
        {"inflight", KVF_FLAG_INT, &o->inflight, "N", "disk reads and writes in flight", NULL},
    };
    kvf_flagset_t set = {
        .prog = argv[0],
        .usage = "--dir DIR [options]",
        .summary = "Disk KV tier rates: N blocks written, then read back through the tier, "
                   "against a\nsequential O_DIRECT read of the same file and dd on it, in the "
                   "same run.",
        .flags = flags,
        .n_flags = KVF_NFLAGS(flags),
    };
    int rc = kvf_flags_parse(&set, argc, argv);
    if (rc != KVF_FLAGS_RUN)
        return rc == KVF_FLAGS_EXIT ? 0 : 2;
    if (!o->dir || o->blocks < 1 || o->io_threads < 1 || o->inflight < 1 || o->block_bytes < 4096 ||
        o->block_bytes > (1ull << 30)) {
        fprintf(stderr,
                "%s: --dir is required; --blocks, --io-threads, --inflight >= 1; "
                "--block-bytes 4K..1G\n",
                argv[0]);
        return 2;
    }
    return -1;
}

int kvf_bench_tiers(int argc, char **argv)
{
    tiers_opts_t o;
    int rc = parse_opts(argc, argv, &o);
    if (rc >= 0)
        return rc;
    kvf_kv_tiers_config_t tc = {.disk_dir = o.dir,
                                .block_bytes = o.block_bytes,
                                .block_tokens = 16,
                                .io_threads = (unsigned)o.io_threads,
                                .max_inflight = (unsigned)o.inflight};
    tc.disk_bytes = (uint64_t)o.blocks * (o.block_bytes + 8192) + (1u << 20);
    kvf_kv_tiers_t *t = NULL;
    char why[256] = "";
    if (kvf_kv_tiers_create(&tc, &t, why, sizeof(why)) != KVF_OK) {
        fprintf(stderr, "%s: %s\n", argv[0], why);
        return 1;
    }
    uint8_t *buf = NULL, *dst = NULL;
    uint32_t tokens[16] = {0};
    if (posix_memalign((void **)&buf, 4096, o.block_bytes) ||
        posix_memalign((void **)&dst, 4096, o.block_bytes * (size_t)o.inflight)) {
        kvf_kv_tiers_destroy(t);
        free(buf);
        return 1;
    }
    double ws = write_blocks(t, &o, buf, tokens);
    char path[512], dd[256];
    snprintf(path, sizeof(path), "%s/%s", o.dir, KVF_KV_TIER_FILE);
    uint64_t file_bytes = 0;
    double seq = sequential_read(path, &file_bytes);
    run_dd(path, dd, sizeof(dd));
    int good = 0;
    double rs = read_blocks(t, &o, dst, tokens, &good);
    double data = (double)o.block_bytes * o.blocks;
    kvf_kv_tiers_stats_t s;
    kvf_kv_tiers_stats(t, &s);
    printf("disk tier in %s (%s), %d blocks of %llu bytes, %d I/O threads, %d in flight\n", o.dir,
           kvf_kv_tiers_direct_io(t) ? "O_DIRECT" : "buffered", o.blocks,
           (unsigned long long)o.block_bytes, o.io_threads, o.inflight);
    printf("write (through the tier)        %8.2f GB/s  (%llu blocks written)\n", data / ws / 1e9,
           (unsigned long long)(s.bytes_written / kvf_kv_tiers_slot_bytes(t)));
    printf("sequential O_DIRECT read, 1 MiB %8.2f GB/s  (%llu bytes)\n", seq,
           (unsigned long long)file_bytes);
    printf("dd iflag=direct bs=1M           %s\n", dd);
    printf("read (tier fetches, checked)    %8.2f GB/s  (%d of %d good)\n", data / rs / 1e9, good,
           o.blocks);
    /* against the faster of the two sequential reads */
    double best = dd_rate(dd) > seq ? dd_rate(dd) : seq;
    printf("tier_read_vs_sequential         %8.3f  (of the faster sequential read; target >= "
           "0.70)\n",
           best > 0 ? data / rs / 1e9 / best : 0.0);
    kvf_kv_tiers_destroy(t);
    free(buf);
    free(dst);
    return good == o.blocks ? 0 : 1;
}
