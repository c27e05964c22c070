/* kvf simulate --profile measure: a hardware profile of this machine,
 * from kvf bench engine (memory bandwidth, sgemm rate, and how close a
 * decode step and a prefill come to them) and kvf bench transfer (the
 * shm transport's fitted rate and fixed cost), run as child processes of
 * this kvf (docs/simulator.md, "Calibration"). */
#ifndef KVF_TOOLS_SIM_MEASURE_H
#define KVF_TOOLS_SIM_MEASURE_H

#include "sim.h"

/* Measures the profile of one node of `threads` CPU threads running the
 * model in model_dir, whose cost-model shape is m (the efficiencies are
 * fitted to m's FLOPs and bytes). The benches' output goes to log files
 * in a temporary directory, removed after. Returns -1 with *hw_p set,
 * else the exit code after a message on stderr. */
int kvf_sim_measure_profile(const char *prog, const char *model_dir, int threads,
                            const kvf_sim_model_t *m, kvf_sim_profile_t *hw_p);

/* Runs this kvf (/proc/self/exe) with argv ("kvf", "bench", ...), its
 * output into the file log (NULL: this process's stdout and stderr).
 * True when it exited 0; false after a message on stderr. */
bool kvf_sim_run_kvf(const char *prog, char *const *argv, const char *log);

#endif
