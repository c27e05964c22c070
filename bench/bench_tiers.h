/* kvf bench tiers: the disk KV tier's read and write rates (kvf/kv_tier.h)
 * against a sequential O_DIRECT read of the same file and `dd` on it, in
 * the same run. */
#ifndef KVF_BENCH_TIERS_H
#define KVF_BENCH_TIERS_H

/* The `kvf bench tiers` command; argv[0] is its program name. Returns the
 * process exit code. */
int kvf_bench_tiers(int argc, char **argv);

#endif
