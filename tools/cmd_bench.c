/* kvf bench: benchmarks, each measuring its own ceiling in the same run
 * (docs/DESIGN.md, "Measuring performance"). The code of each lives in bench/;
 * this file only dispatches `kvf bench NAME` to it (sim-check, which needs
 * the simulator, lives in tools/cmd_simcheck.c). */
#include "bench_engine.h"
#include "bench_kv_accuracy.h"
#include "bench_serve.h"
#include "bench_tokenizer.h"
#include "bench_tiers.h"
#include "bench_transfer.h"
#include "commands.h"

#include <stdio.h>
#include <string.h>

static const kvf_command_t bench_commands[] = {
    {"engine", "decode vs memory roofline, prefill vs sgemm, KV cache vs recompute",
     kvf_bench_engine},
    {"kv-accuracy", "each KV cache format's logit error, greedy agreement, perplexity vs f32",
     kvf_bench_kv_accuracy},
    {"transfer", "KV block transfer vs ucx_perftest (shm, tcp)", kvf_bench_transfer},
    {"tiers", "disk KV tier read/write vs a sequential O_DIRECT read and dd", kvf_bench_tiers},
    {"serve", "serving load: latency, throughput, goodput (split vs colocated)", kvf_bench_serve},
    {"sim-check", "kvf simulate's prediction vs kvf bench serve on this machine",
     kvf_cmd_bench_sim_check},
    {"tokenizer-load", "tokenizer.json load time (median of N loads)", kvf_bench_tokenizer_load},
    {NULL, NULL, NULL},
};

static void print_usage(const char *prog)
{
    printf("usage: %s NAME [options]\n\nbenchmarks:\n", prog);
    for (const kvf_command_t *c = bench_commands; c->name; c++)
        printf("  %-15s %s\n", c->name, c->summary);
}

int kvf_cmd_bench(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        print_usage(argv[0]);
        return argc < 2 ? 2 : 0;
    }
    for (const kvf_command_t *c = bench_commands; c->name; c++) {
        if (!strcmp(argv[1], c->name)) {
            char prog[64];
            snprintf(prog, sizeof(prog), "%s %s", argv[0], c->name);
            argv[1] = prog;
            return c->run(argc - 1, argv + 1);
        }
    }
    fprintf(stderr, "%s: unknown benchmark '%s' (see %s --help)\n", argv[0], argv[1], argv[0]);
    return 2;
}
