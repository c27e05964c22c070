/* The receiving process of kvf bench transfer. See transfer_receiver.h. */
#include "transfer_receiver.h"
#include "bench_util.h"

#include "kvf/clock.h"
#include "kvf/hex.h"

#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

const kvf_xfer_geometry_t kvf_bench_xfer_geom = {.block_size = 16,
                                                 .n_layers = 1,
                                                 .n_kv_heads = 1,
                                                 .head_dim = 64,
                                                 .dtype = KVF_XFER_DTYPE_F32,
                                                 .layout = 1};

int kvf_bench_xfer_serve(bool checksum, bool two_sided, int spin_us)
{
    kvf_xfer_config_t cfg = {.backend = KVF_XFER_UCX,
                             .pool_bytes = KVF_BENCH_XFER_POOL,
                             .geometry = kvf_bench_xfer_geom,
                             .checksum = checksum,
                             .two_sided = two_sided};
    kvf_xfer_t *x;
    if (kvf_xfer_create(&cfg, &x) != KVF_OK)
        return 1;
    kvf_xfer_range_t all = {0, KVF_BENCH_XFER_POOL};
    uint8_t *desc;
    size_t len;
    if (kvf_xfer_reserve(x, 1, 1, &all, 1, 24u * 3600u * 1000u) != KVF_OK ||
        kvf_xfer_export(x, &desc, &len) != KVF_OK) {
        kvf_xfer_destroy(x);
        return 1;
    }
    char *hex = malloc(2 * len + 1);
    if (!hex) {
        free(desc);
        kvf_xfer_destroy(x);
        return 1;
    }
    kvf_hex_encode(desc, len, hex);
    printf("desc %s\n", hex);
    fflush(stdout);
    free(hex);
    free(desc);
    uint64_t rejected = 0;
    /* Spin while traffic flows (TCP puts need this side's progress, and a
     * wake-up through the fd costs tens of microseconds), sleep on the
     * worker's fd after spin_us of quiet. */
    uint64_t active = kvf_clock_ns();
    uint64_t spin_ns = (uint64_t)spin_us * 1000;
    bool busy = false;
    for (unsigned spin = 0;; spin++) {
        busy |= kvf_xfer_progress(x) > 0;
        kvf_xfer_event_t ev;
        while (kvf_xfer_poll(x, &ev) == KVF_OK)
            rejected += ev.kind == KVF_XFER_EV_REJECTED;
        if (spin % 64)
            continue;
        uint64_t now = kvf_clock_ns();
        if (busy)
            active = now;
        busy = false;
        int wait_ms = 0;
        if (now - active > spin_ns && kvf_xfer_arm(x) == KVF_OK)
            wait_ms = 100;
        struct pollfd pfd[2] = {{.fd = 0, .events = POLLIN},
                                {.fd = kvf_xfer_fd(x), .events = POLLIN}};
        int pr = poll(pfd, 2, wait_ms);
        if (pr > 0 && pfd[0].revents)
            break; /* "quit", or the sender's end closed */
        if (pr > 0)
            active = kvf_clock_ns();
    }
    kvf_xfer_destroy(x);
    if (rejected)
        fprintf(stderr, "kvf bench transfer: receiver rejected %" PRIu64 " completions\n",
                rejected);
    return rejected ? 1 : 0;
}

int kvf_bench_receiver_start(kvf_bench_receiver_t *r, bool checksum, bool two_sided, int spin_us)
{
    char spin[16];
    snprintf(spin, sizeof(spin), "%d", spin_us);
    int to[2], from[2];
    if (pipe(to) || pipe(from))
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        dup2(to[0], 0);
        dup2(from[1], 1);
        close(to[1]);
        close(from[0]);
        char *argv[10] = {"kvf", "bench", "transfer", "--serve", "--spin-us", spin};
        int argc = 6;
        if (checksum)
            argv[argc++] = "--checksum";
        if (two_sided)
            argv[argc++] = "--two-sided";
        argv[argc] = NULL;
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    close(to[0]);
    close(from[1]);
    r->pid = pid;
    r->to = to[1];
    r->from = fdopen(from[0], "r");
    char *line = NULL;
    size_t cap = 0;
    ssize_t n = getline(&line, &cap, r->from);
    /* "desc <hex>\n" */
    int rc = -1;
    if (n >= 6 && !strncmp(line, "desc ", 5) &&
        kvf_hex_decode(line + 5, ((size_t)n - 6) / 2 * 2, &r->desc, &r->desc_len) == KVF_OK)
        rc = 0;
    free(line);
    return rc;
}

int kvf_bench_receiver_stop(kvf_bench_receiver_t *r)
{
    (void)!write(r->to, "quit\n", 5);
    close(r->to);
    int status = kvf_bench_reap(r->pid, kvf_clock_ns() + 10000000000ull, 5);
    fclose(r->from);
    free(r->desc);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}
