/* kvf simulate --profile measure: a hardware profile of this machine,
 * from kvf bench engine (memory bandwidth, sgemm rate, and how close a
 * decode step and a prefill come to them) and kvf bench transfer (the
 * shm transport's fitted rate and fixed cost), run as child processes of
 * this kvf (docs/simulator.md, "Calibration"). */
#ifndef KVF_TOOLS_SIM_MEASURE_H
#define KVF_TOOLS_SIM_MEASURE_H

#include <stdio.h>

#include "sim.h"

/* Measures the profile of one node of `threads` CPU threads running the
 * model in model_dir, whose cost-model shape is m (the efficiencies are
 * fitted to m's FLOPs and bytes). The rates are those of CPUs the node
 * has to itself: the engine benchmark's, over the share of its CPUs it
 * got (one thread: its CPU time over its wall time, from its rusage;
 * more: taken as all); each number the median of `rounds` rounds of
 * both benchmarks (1 to KVF_SIM_MEASURE_ROUNDS_MAX; kvf simulate takes
 * three: one round the shared machine disturbs must not set it).
 * shared_host: the simulated nodes share this host (host_cpus, host_load
 * and node_threads set, as kvf bench serve runs them); else each has its
 * own. msg_latency_s is kvf_sim_probe_msg's. The benches' output goes to
 * log files in a temporary directory, removed after. Returns -1 with
 * *hw_p set, else the exit code after a message on stderr. */
#define KVF_SIM_MEASURE_ROUNDS_MAX 9

int kvf_sim_measure_profile(const char *prog, const char *model_dir, int threads, int rounds,
                            bool shared_host, const kvf_sim_model_t *m, kvf_sim_profile_t *hw_p);

/* The profile one round of the benchmarks gives: engine is kvf bench
 * engine --json's object (its ceilings, and each step's typical, median
 * repetition where it reports one, else its best), xfer kvf bench
 * transfer --json's; kv the KV format whose long-context decode sets the
 * attention's efficiency. The host terms (kvf_sim_measure_profile's
 * probe) are left 0. False when a number the profile needs is missing. */
struct cJSON;
bool kvf_sim_profile_from_bench(const struct cJSON *engine, const struct cJSON *xfer,
                                const char *kv, const kvf_sim_model_t *m, kvf_sim_profile_t *hw);

/* A measured profile's numbers on one line of f, after what, then its
 * efficiency points (kvf bench sim-check's report, kvf simulate's stderr). */
void kvf_sim_describe_profile(FILE *f, const char *what, const kvf_sim_profile_t *hw);

/* The CPU time every process of this host has used since boot, in
 * seconds (/proc/stat: all but idle and iowait), and its online CPUs.
 * False when /proc/stat cannot be read. */
bool kvf_sim_host_cpu(double *busy_s_p, double *cpus_p);

/* One control message's latency between two processes on 127.0.0.1 (half
 * the median round trip of small envelopes over the nanomsg sockets the
 * nodes and router use, kvf/msg.h): a child process echoes. */
bool kvf_sim_probe_msg(double *latency_s_p);

/* Runs this kvf (/proc/self/exe) with argv ("kvf", "bench", ...), its
 * output into the file log (NULL: this process's stdout and stderr).
 * True when it exited 0; false after a message on stderr. cpu_s_p and
 * wall_s_p (either may be NULL): the CPU time it and the children it
 * waited for used, and its wall time, in seconds. */
bool kvf_sim_run_kvf(const char *prog, char *const *argv, const char *log, double *cpu_s_p,
                     double *wall_s_p);

#endif
