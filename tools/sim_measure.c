/* See sim_measure.h. */
#include "sim_measure.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <math.h>
#include <spawn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "kvf/clock.h"
#include "kvf/file.h"

extern char **environ;

/* The decode benchmark's batch and context whose step fits the decode
 * efficiency (bench/bench_engine.c: batches 1, 8, 32 of DEC_CTX 256). */
#define MEASURE_DECODE_BATCH 32
#define MEASURE_DECODE_SMALL 8
#define MEASURE_DECODE_CTX   256
/* The batch of the engine's long-context decode the attention's time per
 * pair comes from (kv_decode). */
#define MEASURE_ATTN_BATCH 16

bool kvf_sim_run_kvf(const char *prog, char *const *argv, const char *log, double *cpu_s_p,
                     double *wall_s_p)
{
    uint64_t t0 = kvf_clock_ns();
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (log) {
        posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log, O_WRONLY | O_CREAT | O_TRUNC,
                                         0644);
        posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
    }
    pid_t pid;
    int rc = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        fprintf(stderr, "%s: cannot start kvf %s: %s\n", prog, argv[1], strerror(rc));
        return false;
    }
    int status;
    struct rusage ru;
    while (wait4(pid, &status, 0, &ru) < 0)
        ;
    if (cpu_s_p)
        *cpu_s_p = (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                   (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
    if (wall_s_p)
        *wall_s_p = (double)(kvf_clock_ns() - t0) / 1e9;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "%s: kvf %s %s failed%s%s%s\n", prog, argv[1], argv[2],
                log ? " (its output: " : "", log ? log : "", log ? ")" : "");
        return false;
    }
    return true;
}

static cJSON *read_json(const char *prog, const char *path)
{
    char *text;
    size_t len;
    if (kvf_file_read(path, 16u << 20, &text, &len) != KVF_OK) {
        fprintf(stderr, "%s: cannot read %s\n", prog, path);
        return NULL;
    }
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root)
        fprintf(stderr, "%s: %s is not JSON\n", prog, path);
    return root;
}

/* A positive number at o's key (sub: in the object at key), or 0. */
static double number(const cJSON *o, const char *key, const char *sub)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (sub)
        v = cJSON_GetObjectItemCaseSensitive(v, sub);
    return cJSON_IsNumber(v) && v->valuedouble > 0 ? v->valuedouble : 0;
}

/* The typical (median) repetition of o's key, key + "_median" (the
 * benchmark's best repetition where an older benchmark gave no median). */
static double typical(const cJSON *o, const char *key)
{
    char k[96];
    snprintf(k, sizeof(k), "%s_median", key);
    const double med = number(o, k, NULL);
    return med > 0 ? med : number(o, key, NULL);
}

static double at_most_1(double v)
{
    return v > 1 ? 1 : v;
}

/* What one round of the benchmarks measured, as rates of CPUs of the
 * benchmark's own: the ceilings and transfer numbers in hw, and the
 * rates the model's steps reached, from which the efficiencies are taken
 * once the rounds' medians are (an efficiency taken in each round
 * against that round's own ceiling would move with the ceiling's noise:
 * its median times the ceilings' median is no step time ever measured). */
typedef struct {
    kvf_sim_profile_t hw;
    double b1_bw;                 /* bytes/s the batch-1 decode step read */
    double b8_step_s, b32_step_s; /* the batch-8 and batch-32 decode steps */
    double b2_step_s, b4_step_s;  /* batch 2 and 4 (0: an older benchmark without them) */
    double attn_pair_s; /* a decode token's (query, key) pair, every layer (0: not measured) */
    int n_pf;
    double pf_tokens[KVF_SIM_EFF_POINTS_MAX], pf_rate[KVF_SIM_EFF_POINTS_MAX]; /* tokens/s */
} round_t;

/* The time of one decode (query, key) pair from the engine's long-context
 * decode (kv_decode, KV format kv, batch 16): its step over the batch-16
 * step at MEASURE_DECODE_CTX (between the batch-8 and batch-32 ones), per
 * pair the longer context adds. 0 when not measured. */
static double attn_pair_time(const cJSON *e, const char *kv, double b8_step_s, double b32_step_s)
{
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(e, "kv_decode");
    double ctx = 0, step_s = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, list)
    {
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(it, "kv");
        double c = number(it, "context", NULL), b = number(it, "batch", NULL);
        double ms = typical(it, "step_ms");
        if (cJSON_IsString(k) && !strcmp(k->valuestring, kv) && b == MEASURE_ATTN_BATCH &&
            c > ctx && ms > 0) {
            ctx = c;
            step_s = ms / 1e3;
        }
    }
    if (ctx <= MEASURE_DECODE_CTX)
        return 0;
    double short_s = b8_step_s + (b32_step_s - b8_step_s) *
                                     (MEASURE_ATTN_BATCH - MEASURE_DECODE_SMALL) /
                                     (MEASURE_DECODE_BATCH - MEASURE_DECODE_SMALL);
    double t = (step_s - short_s) / (MEASURE_ATTN_BATCH * (ctx - MEASURE_DECODE_CTX));
    return t > 0 ? t : 0;
}

/* The engine's numbers into r: the ceilings, the batch-1 and batch-32
 * decode steps, each prompt length's rate (shortest first), the decode
 * attention's time per pair over KV format kv; each step its typical
 * (median) repetition where the benchmark reports one. */
static bool from_engine(const cJSON *e, const char *kv, round_t *r)
{
    kvf_sim_profile_t *hw = &r->hw;
    hw->hbm_bw = number(e, "bandwidth_gbs", NULL) * 1e9;
    hw->dram_bw = number(e, "bandwidth_large_gbs", NULL) * 1e9;
    hw->flops = number(e, "sgemm_gflops", NULL) * 1e9;
    /* the typical steps: a serving run sees those, not the best of a few
     * (the batch-1 step's bandwidth scaled from the best step's to the
     * median's) */
    const double b1_best = number(e, "decode_b1_step_ms", NULL);
    const double b1_med = typical(e, "decode_b1_step_ms");
    r->b1_bw = number(e, "decode_b1_roofline_ratio", NULL) * hw->hbm_bw *
               (b1_best > 0 && b1_med > 0 ? b1_best / b1_med : 1);
    r->b8_step_s = typical(e, "decode_b8_step_ms") / 1e3;
    r->b32_step_s = typical(e, "decode_b32_step_ms") / 1e3;
    r->b2_step_s = typical(e, "decode_b2_step_ms") / 1e3;
    r->b4_step_s = typical(e, "decode_b4_step_ms") / 1e3;
    r->attn_pair_s = attn_pair_time(e, kv, r->b8_step_s, r->b32_step_s);
    r->n_pf = 0;
    for (const cJSON *it = e->child; it; it = it->next) {
        unsigned n;
        char tail[32];
        if (sscanf(it->string, "prefill_%u_tokens_per_%31s", &n, tail) != 2 || strcmp(tail, "s") ||
            !cJSON_IsNumber(it) || !(it->valuedouble > 0) || r->n_pf == KVF_SIM_EFF_POINTS_MAX)
            continue;
        const double rate = typical(e, it->string);
        int i = r->n_pf++;
        for (; i > 0 && r->pf_tokens[i - 1] > n; i--) {
            r->pf_tokens[i] = r->pf_tokens[i - 1];
            r->pf_rate[i] = r->pf_rate[i - 1];
        }
        r->pf_tokens[i] = n;
        r->pf_rate[i] = rate;
    }
    return hw->hbm_bw > 0 && hw->flops > 0 && r->b1_bw > 0 && r->b8_step_s > 0 &&
           r->b32_step_s > 0 && r->n_pf > 0;
}

/* One round of both benchmarks' JSON into r: the transfer's fitted rate
 * and fixed cost, then from_engine's numbers. */
static bool from_bench(const cJSON *engine, const cJSON *xfer, const char *kv, round_t *r)
{
    r->hw.net_bw = r->hw.nvlink_bw = number(xfer, "fit_gbps", "shm") * 1e9;
    r->hw.transfer_fixed_s = number(xfer, "fixed_cost_us", "shm") / 1e6;
    return from_engine(engine, kv, r) && r->hw.net_bw > 0;
}

/* The efficiencies that put m's steps where the medians of the rounds
 * measured them, against hw's (median) ceilings: mem_eff the batch-1
 * decode step's bandwidth, decode_eff the batch-2, 4, 8 and 32 steps'
 * FLOP rates (2 and 4 where measured; decode_compute_eff the batch-32
 * one's), prefill_eff each prompt length's (compute_eff the longest's).
 * (With the batch-32 rate for every batch, an AVX2 host's serving runs
 * at 3 req/s, batches of 4-9, measured 1.7-3.0x the predicted TPOT: its
 * 8-row steps reach 0.28-0.32 of sgemm where 32-row steps reach
 * 0.47-0.52. With the batch-8 rate below 8, a one-thread split decode
 * node's 4-row steps took 16.7 ms where 8 rows' rate put them at 7.3,
 * so TPOT at 3 req/s measured twice the prediction: 1-3 rows measured
 * 5.8, 8.4 and 10.1 ms, 4-6 rows 16.7-20.9 ms.) */
static void set_effs(kvf_sim_profile_t *hw, const kvf_sim_model_t *m, double b1_bw,
                     double b2_step_s, double b4_step_s, double b8_step_s, double b32_step_s,
                     double attn_pair_s, int n_pf, const double *pf_tokens, const double *pf_rate)
{
    /* A batch-1 step that reads faster than the bandwidth benchmark sets
     * the ceiling itself: on a host whose last-level cache holds the
     * weights (480 MiB, an Intel Xeon with AVX-512) one thread's batch-1
     * steps read an 8-layer model's 103 MB at 19-21 GB/s against the
     * benchmark's 16-18, and two threads' at 36 against 31. Capped at 1,
     * mem_eff put every batch-1 step a third late there (7.2 ms predicted,
     * 5.1 measured in serving). */
    if (b1_bw > hw->hbm_bw)
        hw->hbm_bw = b1_bw;
    hw->mem_eff = b1_bw / hw->hbm_bw;
    /* the attention's pairs at their own rate, when measured */
    hw->attn_eff = attn_pair_s > 0 ? at_most_1(m->attn_flops / (attn_pair_s * hw->flops)) : 0;
    const int all_batch[4] = {2, 4, MEASURE_DECODE_SMALL, MEASURE_DECODE_BATCH};
    const double all_step_s[4] = {b2_step_s, b4_step_s, b8_step_s, b32_step_s};
    int batch[4], n = 0;
    double step_s[4];
    for (int i = 0; i < 4; i++)
        if (all_step_s[i] > 0) {
            batch[n] = all_batch[i];
            step_s[n++] = all_step_s[i];
        }
    hw->n_decode_eff = n;
    for (int i = 0; i < n; i++) {
        kvf_sim_step_t dec = {.decode_seqs = (uint32_t)batch[i],
                              .decode_ctx = (uint64_t)batch[i] * MEASURE_DECODE_CTX};
        double flops = kvf_sim_step_flops(m, &dec), s = step_s[i];
        if (hw->attn_eff > 0) {
            /* the matrix products' share: the step less its attention
             * (kept whole when the attention would take most of it) */
            double attn_s = m->attn_flops * (double)dec.decode_ctx / (hw->attn_eff * hw->flops);
            if (attn_s < 0.5 * s) {
                flops -= m->attn_flops * (double)dec.decode_ctx;
                s -= attn_s;
            }
        }
        hw->decode_eff_seqs[i] = batch[i];
        hw->decode_eff[i] = at_most_1(flops / (s * hw->flops));
    }
    hw->decode_compute_eff = hw->decode_eff[n - 1];
    hw->n_prefill_eff = n_pf;
    for (int i = 0; i < n_pf; i++) {
        kvf_sim_step_t chunk = {0};
        kvf_sim_step_add_chunk(&chunk, 0, (uint32_t)pf_tokens[i], true);
        double seconds = pf_tokens[i] / pf_rate[i];
        hw->prefill_eff_tokens[i] = pf_tokens[i];
        hw->prefill_eff[i] = at_most_1(kvf_sim_step_flops(m, &chunk) / (seconds * hw->flops));
    }
    hw->compute_eff = hw->prefill_eff[n_pf - 1];
}

/* Runs both benchmarks into dir; false after a message. */
static bool measure(const char *prog, const char *dir, const char *model_dir, int threads,
                    cJSON **engine_p, cJSON **xfer_p, double *share_p)
{
    char ej[512], el[512], xj[512], xl[512], th[16];
    snprintf(ej, sizeof(ej), "%s/engine.json", dir);
    snprintf(el, sizeof(el), "%s/engine.log", dir);
    snprintf(xj, sizeof(xj), "%s/transfer.json", dir);
    snprintf(xl, sizeof(xl), "%s/transfer.log", dir);
    snprintf(th, sizeof(th), "%d", threads);
    char *engine[] = {"kvf",     "bench",  "engine", "--model", (char *)model_dir, "--threads", th,
                      "--quick", "--json", ej,       NULL};
    char *xfer[] = {"kvf", "bench", "transfer", "--tls", "shm", "--quick", "--json", xj, NULL};
    double cpu = 0, wall = 0;
    if (!kvf_sim_run_kvf(prog, engine, el, &cpu, &wall) ||
        !kvf_sim_run_kvf(prog, xfer, xl, NULL, NULL))
        return false;
    /* of its CPU, what a one-thread engine benchmark got; with more
     * threads its CPU time cannot tell (workers also wait for each other,
     * which is not a share lost to other programs), so none is taken */
    *share_p = threads == 1 && wall > 0 && cpu > 0 ? at_most_1(cpu / wall) : 1;
    *engine_p = read_json(prog, ej);
    *xfer_p = read_json(prog, xj);
    unlink(ej);
    unlink(el);
    unlink(xj);
    unlink(xl);
    return *engine_p && *xfer_p;
}

/* The host's terms of hw: its CPUs, the node's threads, a message's
 * latency (the other load is the run's: kvf bench sim-check). False
 * after a message. */
static bool probe(const char *prog, int threads, kvf_sim_profile_t *hw)
{
    double busy;
    if (!kvf_sim_host_cpu(&busy, &hw->host_cpus) || !kvf_sim_probe_msg(&hw->msg_latency_s)) {
        fprintf(stderr, "%s: cannot probe this host (its CPUs, a message's latency)\n", prog);
        return false;
    }
    hw->node_threads = threads;
    return true;
}

/* One round of both benchmarks into r; false after a message. */
static bool measure_round(const char *prog, const char *model_dir, int threads, const char *kv,
                          round_t *r)
{
    char dir[] = "/tmp/kvf-sim-measure-XXXXXX";
    if (!mkdtemp(dir)) {
        fprintf(stderr, "%s: cannot make a temporary directory: %m\n", prog);
        return false;
    }
    cJSON *engine = NULL, *xfer = NULL;
    double share = 1;
    bool ok = measure(prog, dir, model_dir, threads, &engine, &xfer, &share);
    rmdir(dir);
    kvf_sim_profile_t *hw = &r->hw;
    ok = ok && from_bench(engine, xfer, kv, r);
    /* the benchmark had this share of its CPUs: the rates of CPUs of its
     * own are higher by its inverse */
    hw->hbm_bw /= share;
    hw->dram_bw /= share;
    hw->flops /= share;
    r->b1_bw /= share;
    r->b8_step_s *= share;
    r->b32_step_s *= share;
    r->b2_step_s *= share;
    r->b4_step_s *= share;
    r->attn_pair_s *= share;
    for (int i = 0; i < r->n_pf; i++)
        r->pf_rate[i] /= share;
    if (engine && xfer && !ok)
        fprintf(stderr, "%s: the benchmarks' JSON lacks a number the profile needs\n", prog);
    cJSON_Delete(engine);
    cJSON_Delete(xfer);
    return ok;
}

/* The median over rounds r[0..n) of the double at byte offset off. */
static double mid_at(const round_t *r, int n, size_t off)
{
    double v[KVF_SIM_MEASURE_ROUNDS_MAX];
    for (int i = 0; i < n; i++)
        memcpy(&v[i], (const char *)&r[i] + off, sizeof(double));
    return kvf_bench_median(v, (size_t)n);
}

/* The median of n rounds, number by number, then the efficiencies from
 * those medians: one round the shared machine disturbed (measured: a
 * 2-thread batch-1 decode at 32% of its roofline, 96-100% in the rounds
 * around it) must not set the profile, and neither must a best round the
 * serving runs never see (taking the best of two made every prediction
 * 20-30% more optimistic). */
static void take_median(kvf_sim_profile_t *hw, const round_t *r, int n, const kvf_sim_model_t *m)
{
#define MID(f) mid_at(r, n, offsetof(round_t, f))
    hw->hbm_bw = MID(hw.hbm_bw);
    hw->flops = MID(hw.flops);
    hw->net_bw = hw->nvlink_bw = MID(hw.net_bw);
    hw->transfer_fixed_s = MID(hw.transfer_fixed_s);
    hw->dram_bw = MID(hw.dram_bw);
    /* the same prompt lengths every round (the benchmark's) */
    int n_pf = r[0].n_pf;
    double pf_tokens[KVF_SIM_EFF_POINTS_MAX], pf_rate[KVF_SIM_EFF_POINTS_MAX];
    for (int i = 0; i < n_pf; i++) {
        pf_tokens[i] = r[0].pf_tokens[i];
        pf_rate[i] = mid_at(r, n, offsetof(round_t, pf_rate) + (size_t)i * sizeof(double));
    }
    set_effs(hw, m, MID(b1_bw), MID(b2_step_s), MID(b4_step_s), MID(b8_step_s), MID(b32_step_s),
             MID(attn_pair_s), n_pf, pf_tokens, pf_rate);
#undef MID
}

bool kvf_sim_profile_from_bench(const cJSON *engine, const cJSON *xfer, const char *kv,
                                const kvf_sim_model_t *m, kvf_sim_profile_t *hw)
{
    round_t r = {.hw = {.kv_mem_fraction = 0.9}};
    if (!from_bench(engine, xfer, kv, &r))
        return false;
    *hw = r.hw;
    take_median(hw, &r, 1, m);
    return true;
}

/* The last-level cache CPU 0 sees (sysfs: the highest cache index's
 * size), in bytes; 0 when unknown. */
static double llc_bytes(void)
{
    double best = 0;
    for (int i = 0; i < 8; i++) {
        char path[96];
        snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        unsigned long v = 0;
        char unit = 0;
        if (fscanf(f, "%lu%c", &v, &unit) >= 1) {
            double b = (double)v * (unit == 'K' ? 1024.0 : unit == 'M' ? 1048576.0 : 1.0);
            best = b > best ? b : best;
        }
        fclose(f);
    }
    return best;
}

int kvf_sim_measure_profile(const char *prog, const char *model_dir, int threads, int rounds,
                            bool shared_host, const kvf_sim_model_t *m, kvf_sim_profile_t *hw_p)
{
    if (rounds < 1 || rounds > KVF_SIM_MEASURE_ROUNDS_MAX) {
        fprintf(stderr, "%s: %d measuring rounds (1 to %d)\n", prog, rounds,
                KVF_SIM_MEASURE_ROUNDS_MAX);
        return 2;
    }
    fprintf(stderr,
            "%s: measuring this machine (kvf bench engine --quick --threads %d, kvf bench "
            "transfer --quick; %s%d round%s)...\n",
            prog, threads, rounds > 1 ? "the median of " : "", rounds, rounds > 1 ? "s" : "");
    kvf_sim_profile_t hw = {.kv_mem_fraction = 0.9};
    if (!probe(prog, threads, &hw))
        return 1;
    round_t r[KVF_SIM_MEASURE_ROUNDS_MAX];
    for (int i = 0; i < rounds; i++) {
        r[i] = (round_t){.hw = hw};
        if (!measure_round(prog, model_dir, threads, kvf_kv_dtype_name(m->kv_dtype), &r[i]))
            return 1;
        if (i > 0 && r[i].n_pf != r[0].n_pf) {
            fprintf(stderr, "%s: the engine benchmark's prompt lengths changed between rounds\n",
                    prog);
            return 1;
        }
    }
    take_median(&hw, r, rounds, m);
    snprintf(hw.name, sizeof(hw.name), "measured-%dt", threads);
    hw.source = "kvf bench engine and kvf bench transfer on this machine";
    hw.hbm_bytes = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    hw.llc_bytes = llc_bytes();
    if (!shared_host)
        hw.host_cpus = hw.host_load = hw.node_threads = hw.llc_bytes = hw.dram_bw = 0;
    *hw_p = hw;
    return -1;
}

/* A profile's efficiency points, one line (none: nothing). */
static void describe_points(FILE *f, const char *label, int n, const double *xs, const double *effs)
{
    if (n <= 0)
        return;
    fprintf(f, "  %s:", label);
    for (int i = 0; i < n; i++)
        fprintf(f, " %.0f: %.2f", xs[i], effs[i]);
    fprintf(f, "\n");
}

void kvf_sim_describe_profile(FILE *f, const char *what, const kvf_sim_profile_t *hw)
{
    fprintf(f,
            "%s profile: %.1f GB/s x mem_eff %.2f, %.1f GFLOP/s x compute_eff %.2f (decode %.2f, "
            "its attention %.2f), "
            "transfer %.0f us + %.2f GB/s; host %.0f CPUs, node threads %.0f; a message %.0f us; "
            "past its %.0f MiB cache %.1f GB/s\n",
            what, hw->hbm_bw / 1e9, hw->mem_eff, hw->flops / 1e9, hw->compute_eff,
            hw->decode_compute_eff, hw->attn_eff, hw->transfer_fixed_s * 1e6, hw->net_bw / 1e9,
            hw->host_cpus, hw->node_threads, hw->msg_latency_s * 1e6, hw->llc_bytes / 1048576,
            hw->dram_bw / 1e9);
    describe_points(f, "prompt tokens' compute_eff by the tokens a step computes",
                    hw->n_prefill_eff, hw->prefill_eff_tokens, hw->prefill_eff);
    describe_points(f, "decode tokens' compute_eff by the sequences a step decodes",
                    hw->n_decode_eff, hw->decode_eff_seqs, hw->decode_eff);
}
