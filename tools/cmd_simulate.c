/* kvf simulate: a discrete-event simulation of a kvferry cluster under a
 * workload (sim/sim.h, docs/simulator.md): the router's own routing code
 * placing requests on simulated prefill, decode or colocated nodes whose
 * steps take a cost model's times on a hardware profile. */
#include <stdio.h>

#include "commands.h"
#include "kvf/flags.h"
#include "sim_opts.h"

typedef struct {
    kvf_sim_opts_t sim;
    int prefill, decode, colocated;
    const char *json, *plot;
} simulate_opts_t;

/* Returns -1 to run, else the exit code. */
static int parse(int argc, char **argv, simulate_opts_t *o)
{
    kvf_flag_t flags[KVF_SIM_OPTS_MAX_FLAGS + 8];
    size_t n = kvf_sim_opts_flags(&o->sim, flags);
    o->prefill = o->decode = o->colocated = 0;
    o->json = o->plot = NULL;
    const kvf_flag_t own[] = {
        {"prefill", KVF_FLAG_INT, &o->prefill, "N", "prefill nodes (with --decode)", NULL},
        {"decode", KVF_FLAG_INT, &o->decode, "M", "decode nodes (with --prefill)", NULL},
        {"colocated", KVF_FLAG_INT, &o->colocated, "N",
         "or N nodes that prefill and decode (chunked prefill beside the decode batch)", NULL},
        {"json", KVF_FLAG_STRING, &o->json, "FILE", "write the results as JSON", NULL},
        {"plot", KVF_FLAG_STRING, &o->plot, "FILE.svg", "write the TTFT and TPOT CDFs", NULL},
    };
    for (size_t i = 0; i < sizeof(own) / sizeof(own[0]); i++)
        flags[n++] = own[i];
    kvf_flagset_t set = {
        .prog = argv[0],
        .usage = "--model DIR (--prefill N --decode M | --colocated N) [options]",
        .summary = "Simulates a kvferry cluster: the router's own routing code places each "
                   "request of the workload (kvf bench serve's generator, or --trace) on "
                   "simulated nodes whose steps and KV transfers take a cost model's times on "
                   "a hardware profile. Prints TTFT, TPOT and end-to-end percentiles, goodput "
                   "under the SLOs and each pool's utilisation. The same inputs and seed give "
                   "the same output. See docs/simulator.md.",
        .flags = flags,
        .n_flags = n,
    };
    int rc = kvf_flags_parse(&set, argc, argv);
    if (rc == KVF_FLAGS_EXIT)
        return 0;
    return rc < 0 ? 2 : -1;
}

int kvf_cmd_simulate(int argc, char **argv)
{
    simulate_opts_t o;
    int rc = parse(argc, argv, &o);
    if (rc >= 0)
        return rc;
    kvf_sim_config_t cfg;
    kvf_sim_workload_t w = {0};
    rc = kvf_sim_opts_resolve(argv[0], &o.sim, &cfg, &w);
    if (rc >= 0)
        return rc;
    cfg.n_prefill = o.prefill;
    cfg.n_decode = o.decode;
    cfg.n_colocated = o.colocated;
    kvf_sim_result_t res;
    char err[512];
    if (kvf_sim_run(&cfg, &w, &res, err, sizeof(err)) != KVF_OK) {
        fprintf(stderr, "%s: %s\n", argv[0], err);
        kvf_sim_workload_fini(&w);
        return 2;
    }
    kvf_sim_report_print(&cfg, &res);
    rc = 0;
    if (o.json)
        rc |= kvf_sim_report_json(&cfg, &res, o.json, argv[0]);
    if (o.plot)
        rc |= kvf_sim_report_svg(&cfg, &res, o.plot, argv[0]);
    kvf_sim_result_fini(&res);
    kvf_sim_workload_fini(&w);
    return rc;
}
