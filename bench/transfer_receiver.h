/* The receiving process of kvf bench transfer: this same binary started
 * again as `kvf bench transfer --serve`, which exports a pool, prints
 * "desc <hex>" (its descriptor) and drives its transport until its stdin
 * says "quit" or closes. */
#ifndef KVF_BENCH_TRANSFER_RECEIVER_H
#define KVF_BENCH_TRANSFER_RECEIVER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "kvf/xfer.h"

/* The receiver's pool, and the geometry both sides open with. */
#define KVF_BENCH_XFER_POOL (256ull << 20)
extern const kvf_xfer_geometry_t kvf_bench_xfer_geom;

/* The --serve role: the receiver itself, with CRC32C required when
 * checksum, two-sided when two_sided, busy-polling spin_us after the last
 * traffic. Returns the exit code (1 when it rejected completions). */
int kvf_bench_xfer_serve(bool checksum, bool two_sided, int spin_us);

/* A receiver process as the sender holds it. */
typedef struct {
    pid_t pid;
    int to;        /* its stdin */
    FILE *from;    /* its stdout */
    uint8_t *desc; /* (desc_len) its descriptor, to connect to */
    size_t desc_len;
} kvf_bench_receiver_t;

/* Starts the receiver and reads its descriptor. Returns 0, or -1 when it
 * did not start. */
int kvf_bench_receiver_start(kvf_bench_receiver_t *r, bool checksum, bool two_sided, int spin_us);

/* Tells it to quit and reaps it (killed after 10 s). Returns 0, or -1 when
 * it did not exit 0. */
int kvf_bench_receiver_stop(kvf_bench_receiver_t *r);

#endif
