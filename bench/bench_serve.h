/* kvf bench serve: a serving load generator. Poisson arrivals from a fixed
 * seed against a router's native client socket; TTFT, time per output
 * token and end-to-end latency percentiles, throughput and goodput. With
 * --compare-colocated the same trace also runs against a colocated
 * configuration (one kvf-decode --prefill-local with the same total
 * threads), and both are printed side by side. */
#ifndef KVF_BENCH_SERVE_H
#define KVF_BENCH_SERVE_H

/* The `kvf bench serve` command; argv[0] is its program name. Returns the
 * process exit code. */
int kvf_bench_serve(int argc, char **argv);

#endif
