/* kvf bench transfer: KV block transfer bandwidth and per-batch cost over
 * the transfer API (kvf/xfer.h), against ucx_perftest in the same run. */
#ifndef KVF_BENCH_TRANSFER_H
#define KVF_BENCH_TRANSFER_H

/* The `kvf bench transfer` command; argv[0] is its program name. Returns
 * the process exit code. */
int kvf_bench_transfer(int argc, char **argv);

#endif
