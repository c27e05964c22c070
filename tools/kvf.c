/* kvf: the command-line multitool. Dispatches to a subcommand. */
#include "commands.h"
#include "kvf/flags.h"
#include "kvf/log.h"

#include <stdio.h>
#include <string.h>

static const kvf_command_t kvf_commands[] = {
    {"generate", "generate a continuation (colocated, or through a router)", kvf_cmd_generate},
    {"logits", "last-position logits of a prompt as JSON", kvf_cmd_logits},
    {"tokenize", "text to token ids and back", kvf_cmd_tokenize},
    {"mkmodel", "write a random-weight model directory", kvf_cmd_mkmodel},
    {"kvcalc", "KV cache bytes per token, request and batch", kvf_cmd_kvcalc},
    {"bench", "benchmarks (engine, transfer, serve)", kvf_cmd_bench},
    {"stats", "nodes, load and requests of a running cluster", kvf_cmd_stats},
    {"simulate", "simulate a cluster under a workload (cost model, the router's policy)",
     kvf_cmd_simulate},
    {"plan", "the cheapest P:D or colocated cluster that meets the SLOs", kvf_cmd_plan},
    {"keygen", "write a new cluster key file (--cluster-key-file)", kvf_cmd_keygen},
    {NULL, NULL, NULL},
};

static void print_usage(void)
{
    printf("usage: kvf COMMAND [options]\n\n"
           "kvferry's command-line tool. Run 'kvf COMMAND --help' for a command's options.\n\n"
           "commands:\n");
    for (const kvf_command_t *c = kvf_commands; c->name; c++)
        printf("  %-12s %s\n", c->name, c->summary);
    printf("\n  --help       print this help and exit\n"
           "  --version    print the version and GPUs and exit\n");
}

int main(int argc, char **argv)
{
    kvf_log_init("kvf", NULL);
    if (argc < 2) {
        print_usage();
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        print_usage();
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        kvf_flags_print_version("kvf");
        return 0;
    }
    for (const kvf_command_t *c = kvf_commands; c->name; c++) {
        if (!strcmp(argv[1], c->name)) {
            char prog[64];
            snprintf(prog, sizeof(prog), "kvf %s", c->name);
            argv[1] = prog;
            return c->run(argc - 1, argv + 1);
        }
    }
    fprintf(stderr, "kvf: unknown command '%s' (see kvf --help)\n", argv[1]);
    return 2;
}
