/* The rig the transfer tests (test_xfer.c, test_xfer_failures.c) run the
 * API of kvf/xfer.h in, over UCX between two real processes: the test is
 * the sender (prefill side); kvf_xfer_peer, started with fork+exec, is the
 * receiver (decode side) and answers commands on a pipe. Everything runs on
 * 127.0.0.1 (UCX_NET_DEVICES=lo) with bounded waits. cmocka assertions: a
 * failure fails the calling test. */
#ifndef KVF_TEST_XFER_RIG_H
#define KVF_TEST_XFER_RIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvf/xfer.h"

/* The bytes of every pool, the test's and the peer's. */
#define XRIG_POOL (4u << 20)

/* The geometry of both sides: 16-token blocks, 2 layers, 2 KV heads of 64. */
extern const kvf_xfer_geometry_t xrig_geom;

/* The peer process. */
typedef struct {
    pid_t pid;
    int to, from; /* its stdin, its stdout */
    char buf[1 << 17];
    size_t have;
    uint8_t *desc; /* its transfer descriptor */
    size_t desc_len;
} xrig_peer_t;

/* The peer's counters (its "stats" reply). */
typedef struct {
    uint64_t landed, bytes, last, rejected, stale, mismatch, released, expired, aborted, dropped;
} xrig_stats_t;

/* What each test binary's main does first: logs as name, keeps UCX's TCP
 * on the loopback device, ignores SIGPIPE and takes KVF_TEST_FILTER (a
 * glob, e.g. test_tcp_*) as cmocka's test filter. */
void xrig_init(const char *name);

/* Starts kvf_xfer_peer with the NULL-terminated args (NULL: none) on *p
 * and reads the descriptor it prints first. */
void xrig_spawn(xrig_peer_t *p, const char *const *args);

/* Asks the peer to quit and checks it exited cleanly (under ASan that
 * includes LeakSanitizer finding nothing); frees what xrig_spawn made. */
void xrig_quit(xrig_peer_t *p);

/* Waits for a peer the test SIGKILLed, checks that a signal ended it, and
 * frees what xrig_spawn made. */
void xrig_reap_killed(xrig_peer_t *p);

/* Reads exactly len bytes of the peer's output (after a "dump") within
 * the reply deadline; 0, or -1 when they did not come. */
int xrig_read(xrig_peer_t *p, void *out, size_t len);

/* Sends the command fmt to the peer and reads its one-line reply into
 * reply (NUL-terminated). */
void xrig_cmd(xrig_peer_t *p, char *reply, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Sends cmd; fails unless the reply is "ok". */
void xrig_ok(xrig_peer_t *p, const char *cmd);

/* The peer's counters now. */
xrig_stats_t xrig_stats(xrig_peer_t *p);

/* Polls the peer's counters until landed >= n (or ms run out). */
xrig_stats_t xrig_wait_landed(xrig_peer_t *p, uint64_t n, int ms);

/* The peer's "fill seed" pattern, bytes long, into pool. */
void xrig_fill_pattern(uint8_t *pool, uint64_t bytes, uint64_t seed);

/* A UCX sender over pool (XRIG_POOL bytes). */
kvf_xfer_t *xrig_sender_create(uint8_t *pool, uint32_t timeout_ms, bool checksum);

/* Posts one batch of n slices for (req, epoch) and waits for it. */
kvf_status_t xrig_post_wait(kvf_xfer_peer_t *peer, uint64_t req, uint64_t epoch,
                            const kvf_xfer_slice_t *s, size_t n, uint32_t flags);

/* This process's open file descriptors. */
int xrig_count_fds(void);

/* pid's resident memory in KiB (-1 when unknown). */
long xrig_rss_kib(pid_t pid);

/* UCX_TLS for the transfer handles created next. */
void xrig_use_tls(const char *tls);

#endif
