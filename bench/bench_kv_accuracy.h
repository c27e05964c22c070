/* kvf bench kv-accuracy: what each KV cache format (f32, bf16, f16, fp8,
 * int8) costs in accuracy against the f32 cache, on one model. */
#ifndef KVF_BENCH_KV_ACCURACY_H
#define KVF_BENCH_KV_ACCURACY_H

/* The `kvf bench kv-accuracy` command; argv[0] is its program name.
 * Returns the process exit code. */
int kvf_bench_kv_accuracy(int argc, char **argv);

#endif
