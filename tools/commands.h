/* Subcommands of the kvf multitool. Each lives in tools/cmd_<name>.c and
 * is listed in kvf_commands[] (tools/kvf.c). A command receives argv with
 * argv[0] = "kvf <name>" and returns the process exit code. */
#ifndef KVF_TOOLS_COMMANDS_H
#define KVF_TOOLS_COMMANDS_H

typedef struct {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
} kvf_command_t;

int kvf_cmd_tokenize(int argc, char **argv);
int kvf_cmd_mkmodel(int argc, char **argv);
int kvf_cmd_kvcalc(int argc, char **argv);
int kvf_cmd_bench(int argc, char **argv);
int kvf_cmd_stats(int argc, char **argv);
int kvf_cmd_generate(int argc, char **argv);
int kvf_cmd_logits(int argc, char **argv);
int kvf_cmd_keygen(int argc, char **argv);
int kvf_cmd_simulate(int argc, char **argv);
int kvf_cmd_plan(int argc, char **argv);
/* kvf bench sim-check (tools/cmd_simcheck.c): the simulator against kvf bench serve. */
int kvf_cmd_bench_sim_check(int argc, char **argv);

#endif
