/* kvf bench engine: decode latency against the memory roofline, prefill
 * against the sgemm rate, and the KV-cache experiment, each ceiling
 * measured in the same run. */
#ifndef KVF_BENCH_ENGINE_H
#define KVF_BENCH_ENGINE_H

/* The `kvf bench engine` command; argv[0] is its program name. Returns the
 * process exit code. */
int kvf_bench_engine(int argc, char **argv);

#endif
