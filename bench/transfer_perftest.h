/* ucx_perftest's ucp_put_bw as the ceiling of kvf bench transfer: two
 * ucx_perftest processes on 127.0.0.1 with the transports UCX_TLS names,
 * run right before the rows of the same size. */
#ifndef KVF_BENCH_TRANSFER_PERFTEST_H
#define KVF_BENCH_TRANSFER_PERFTEST_H

#include <stdbool.h>
#include <stdint.h>

/* GB/s (1e9 bytes) of puts of size bytes: the best of a few runs, the rate
 * of a quiet moment (a ceiling measured too low would flatter the ratio);
 * 0 when ucx_perftest could not run. quick: shorter runs. */
double kvf_bench_perftest_gbps(uint64_t size, bool quick);

#endif
