/* kvf bench engine: decode latency against the memory roofline, prefill
 * against the sgemm rate, and the KV-cache experiment, each ceiling
 * measured in the same run. */
#ifndef KVF_BENCH_ENGINE_H
#define KVF_BENCH_ENGINE_H

/* The `kvf bench engine` command; argv[0] is its program name. Returns the
 * process exit code. */
int kvf_bench_engine(int argc, char **argv);

/* The same command with --backend cuda (kvf_bench_engine hands over when
 * argv has it): the CUDA engine against the GPU's copy bandwidth and GEMM
 * rate (bench_engine_cuda.c). Exits 1 with one line on stderr in a build
 * without CUDA or on a machine without a GPU. */
int kvf_bench_engine_cuda(int argc, char **argv);

#endif
