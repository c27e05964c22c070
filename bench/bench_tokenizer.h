/* kvf bench tokenizer-load: how long loading a tokenizer.json takes. */
#ifndef KVF_BENCH_TOKENIZER_H
#define KVF_BENCH_TOKENIZER_H

/* The `kvf bench tokenizer-load` command; argv[0] is its program name.
 * Returns the process exit code. */
int kvf_bench_tokenizer_load(int argc, char **argv);

#endif
