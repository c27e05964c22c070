/* The cluster simulator (sim/; docs/simulator.md):
 * - the cost model against hand-computed cases: a prefill chunk, a
 *   decode step, a colocated step carrying both, tensor parallel, a
 *   transfer, a node's KV capacity, and a Llama-3-8B-shaped model's sizes;
 * - profiles: the built-ins, a file, a bad file, an unknown name;
 * - traces: CSV and JSONL read, malformed ones refused with file and line;
 * - runs: the same seed gives the same output, another seed another one;
 *   a split cluster ships every prompt's KV, a colocated one none; shared
 *   prefixes are computed once per node;
 * - the planner: the cheapest cluster meeting reachable SLOs, none (with
 *   the closest and its shortfall) for an unreachable one;
 * - the measured host terms: a shared host's CPU share, message latency. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "sim.h"
#include "sim_measure.h"

#include <cjson/cJSON.h>

#define DATA KVF_TEST_DATA "/sim"

/* A model small enough to count by hand: 2 layers, hidden 64, 4 heads of
 * 16 (q 64), 2 KV heads (kv 32), MLP 128, vocab 100, untied. */
static kvf_model_config_t hand_config(void)
{
    return (kvf_model_config_t){.n_layers = 2,
                                .hidden = 64,
                                .n_heads = 4,
                                .n_kv_heads = 2,
                                .head_dim = 16,
                                .inter = 128,
                                .vocab = 100};
}

static kvf_sim_profile_t unit_profile(void)
{
    kvf_sim_profile_t hw;
    char err[256];
    assert_int_equal(kvf_sim_profile_load(DATA "/profile-unit.json", &hw, err, sizeof(err)),
                     KVF_OK);
    return hw;
}

static void test_model_shape(void **state)
{
    (void)state;
    kvf_model_config_t c = hand_config();
    kvf_sim_model_t m;
    kvf_sim_model_init(&c, 2, KVF_KV_BF16, 1, &m);
    /* a layer: q 64x64 + k, v 2x64x32 + o 64x64 + MLP 3x64x128 = 36864 */
    assert_true(m.layer_flops == 2.0 * 2 * 36864);
    assert_true(m.head_flops == 2.0 * 100 * 64);
    assert_true(m.attn_flops == 4.0 * 2 * 64);
    /* 2 layers + embedding and lm_head (100 x 64 each), 2 bytes */
    assert_true(m.weight_bytes == 2.0 * (2 * 36864 + 2 * 6400));
    /* a step streams all but the (untied) input embedding table */
    assert_true(m.step_weight_bytes == 2.0 * (2 * 36864 + 6400));
    kvf_model_config_t tied = c;
    tied.tie_embeddings = true;
    kvf_sim_model_t mt;
    kvf_sim_model_init(&tied, 2, KVF_KV_BF16, 1, &mt);
    assert_true(mt.step_weight_bytes == mt.weight_bytes);
    assert_true(mt.weight_bytes == 2.0 * (2 * 36864 + 6400));
    /* K and V, 2 layers, 2 heads, 16 x 2 bytes */
    assert_true(m.kv_bytes_per_token == 256);

    kvf_model_config_t l8;
    assert_int_equal(kvf_model_config_load(DATA "/llama3-8b", &l8), KVF_OK);
    kvf_sim_model_init(&l8, 2, KVF_KV_BF16, 1, &m);
    assert_true(m.kv_bytes_per_token == 131072); /* 2 x 32 x 8 x 128 x 2 */
    double params = m.weight_bytes / 2;
    assert_true(params > 8.02e9 && params < 8.04e9); /* Llama-3-8B: 8.03 B */
}

static void test_step_times(void **state)
{
    (void)state;
    kvf_sim_profile_t hw = unit_profile(); /* 1 GFLOP/s, 0.1 GB/s, no overhead */
    kvf_model_config_t c = hand_config();
    kvf_sim_model_t m;
    kvf_sim_model_init(&c, 2, KVF_KV_BF16, 1, &m);

    /* 100 prompt tokens after 50 cached: 100 x 50 + 5050 pairs, one logit.
     * FLOPs 147456 x 100 + 12800 + 512 x 10050 = 19904000: 19.904 ms;
     * bytes 160256 (the weights but the input embedding) + 256 x 150 =
     * 198656: 1.99 ms. Compute-bound. */
    kvf_sim_step_t chunk = {0};
    kvf_sim_step_add_chunk(&chunk, 50, 100, true);
    assert_true(kvf_sim_step_flops(&m, &chunk) == 19904000.0);
    assert_true(kvf_sim_step_bytes(&m, &chunk) == 198656.0);
    assert_float_equal(kvf_sim_step_time(&hw, &m, &chunk), 19.904e-3, 1e-12);

    /* 3 sequences attending to 300 tokens: FLOPs 634368 (0.63 ms), bytes
     * 160256 + 256 x 303 = 237824: 2.37824 ms. Memory-bound. */
    kvf_sim_step_t dec = {.decode_seqs = 3, .decode_ctx = 300};
    assert_true(kvf_sim_step_flops(&m, &dec) == 634368.0);
    assert_float_equal(kvf_sim_step_time(&hw, &m, &dec), 2.37824e-3, 1e-12);

    /* A colocated step carries both: FLOPs 147456 x 103 + 12800 x 4 +
     * 512 x 10350 = 20538368; the decode sequences wait for the chunk. */
    kvf_sim_step_t both = dec;
    kvf_sim_step_add_chunk(&both, 50, 100, true);
    assert_float_equal(kvf_sim_step_time(&hw, &m, &both), 20.538368e-3, 1e-12);
    assert_true(kvf_sim_step_time(&hw, &m, &both) > 8 * kvf_sim_step_time(&hw, &m, &dec));

    /* decode tokens at half the compute efficiency of prompt tokens:
     * 634368 / 0.5 + 19904000 FLOPs at 1 GFLOP/s */
    hw.decode_compute_eff = 0.5;
    assert_float_equal(kvf_sim_step_time(&hw, &m, &both), 21.172736e-3, 1e-12);
    hw.decode_compute_eff = 1;

    /* The decode tokens' attention at an efficiency of its own: their
     * 300 pairs x 512 FLOPs = 153600 at 0.1 (1.536 ms), their matrix
     * products (634368 - 153600 = 480768) and the chunk's 19904000 at 1. */
    hw.attn_eff = 0.1;
    assert_float_equal(kvf_sim_step_time(&hw, &m, &both), 21.920768e-3, 1e-12);
    hw.attn_eff = 0;

    /* Tensor parallel 2: half the time, plus 2 all-reduces a layer of
     * 3 x 128 bytes, ring factor 1, over 0.1 GB/s: 15.36 us. */
    kvf_sim_model_init(&c, 2, KVF_KV_BF16, 2, &m);
    assert_float_equal(kvf_sim_step_time(&hw, &m, &dec), 2.37824e-3 / 2 + 15.36e-6, 1e-12);

    /* a transfer: 1 ms + 1 MB over 2 NICs of 0.1 GB/s */
    assert_float_equal(kvf_sim_transfer_time(&hw, 2, 1e6), 6e-3, 1e-12);
    /* capacity: 1 MB x 0.5 - 173056 bytes of weights, 4096-byte blocks */
    kvf_sim_model_init(&c, 2, KVF_KV_BF16, 1, &m);
    assert_int_equal(kvf_sim_capacity_blocks(&hw, &m, 16), 79);
    /* step overhead adds once */
    hw.step_overhead_s = 1e-3;
    assert_float_equal(kvf_sim_step_time(&hw, &m, &dec), 3.37824e-3, 1e-12);
    hw.step_overhead_s = 0;

    /* Prompt efficiency by step size, 0.25 at 128 tokens and 0.5 at 512,
     * interpolated in log2 (256: halfway), the ends' past them. The
     * 100-token chunk at 0.25: 19.904 ms x 4; the colocated step's
     * decode tokens keep decode_compute_eff (1): 634368 FLOPs + 4 x
     * 19904000. A decode step alone has no prompt tokens: unchanged. */
    hw.n_prefill_eff = 2;
    hw.prefill_eff_tokens[0] = 128;
    hw.prefill_eff[0] = 0.25;
    hw.prefill_eff_tokens[1] = 512;
    hw.prefill_eff[1] = 0.5;
    assert_float_equal(kvf_sim_prefill_eff(&hw, 100), 0.25, 1e-15);
    assert_float_equal(kvf_sim_prefill_eff(&hw, 256), 0.375, 1e-15);
    assert_float_equal(kvf_sim_prefill_eff(&hw, 4096), 0.5, 1e-15);
    assert_float_equal(kvf_sim_step_time(&hw, &m, &chunk), 4 * 19.904e-3, 1e-12);
    assert_float_equal(kvf_sim_step_time(&hw, &m, &both), 0.634368e-3 + 4 * 19.904e-3, 1e-12);
    assert_float_equal(kvf_sim_step_time(&hw, &m, &dec), 2.37824e-3, 1e-12);
    hw.n_prefill_eff = 0;
    assert_float_equal(kvf_sim_prefill_eff(&hw, 256), hw.compute_eff, 1e-15);

    /* Decode efficiency by batch, 0.125 at 3 sequences and 0.25 at 12,
     * interpolated in log2 (6: halfway), the ends' past them. The
     * 3-sequence step at 0.125 turns compute-bound: 634368 / 0.125 =
     * 5074944 FLOPs' time, 5.074944 ms; with the 100-token chunk (prompt
     * tokens at compute_eff 1) 24.978944 ms. */
    hw.n_decode_eff = 2;
    hw.decode_eff_seqs[0] = 3;
    hw.decode_eff[0] = 0.125;
    hw.decode_eff_seqs[1] = 12;
    hw.decode_eff[1] = 0.25;
    assert_float_equal(kvf_sim_decode_eff(&hw, 1), 0.125, 1e-15);
    assert_float_equal(kvf_sim_decode_eff(&hw, 6), 0.1875, 1e-15);
    assert_float_equal(kvf_sim_decode_eff(&hw, 100), 0.25, 1e-15);
    assert_float_equal(kvf_sim_step_time(&hw, &m, &dec), 5.074944e-3, 1e-12);
    assert_float_equal(kvf_sim_step_time(&hw, &m, &both), 24.978944e-3, 1e-12);
    hw.n_decode_eff = 0;
    assert_float_equal(kvf_sim_decode_eff(&hw, 6), hw.decode_compute_eff, 1e-15);
}

static void test_profiles(void **state)
{
    (void)state;
    kvf_sim_profile_t hw;
    assert_true(kvf_sim_profile_builtin("H200", &hw));
    assert_true(hw.hbm_bw == 4.8e12 && hw.hbm_bytes == 141e9 && hw.flops == 989.5e12);
    assert_non_null(strstr(hw.source, "datasheet"));
    assert_true(kvf_sim_profile_builtin("h100-sxm", &hw));
    assert_true(hw.hbm_bw == 3.35e12 && hw.hbm_bytes == 80e9);
    assert_true(kvf_sim_profile_builtin("a100", &hw));
    assert_true(hw.hbm_bw == 2.039e12 && hw.flops == 312e12);
    assert_true(hw.net_bw == 50e9); /* NDR 400 Gb/s */
    assert_false(kvf_sim_profile_builtin("h300", &hw));
    char err[256] = "";
    assert_int_equal(kvf_sim_profile_load(DATA "/profile-bad.json", &hw, err, sizeof(err)),
                     KVF_ERR_FORMAT);
    assert_non_null(strstr(err, "compute_eff"));
    assert_int_equal(kvf_sim_profile_load(DATA "/no-such.json", &hw, err, sizeof(err)),
                     KVF_ERR_NOT_FOUND);
    /* measured prompt efficiencies: points in order, or refused */
    assert_int_equal(kvf_sim_profile_load(DATA "/profile-prefill-eff.json", &hw, err, sizeof(err)),
                     KVF_OK);
    assert_int_equal(hw.n_prefill_eff, 2);
    assert_true(hw.prefill_eff_tokens[1] == 512 && hw.prefill_eff[1] == 0.5);
    assert_float_equal(kvf_sim_prefill_eff(&hw, 256), 0.375, 1e-15);
    assert_int_equal(
        kvf_sim_profile_load(DATA "/profile-bad-prefill-eff.json", &hw, err, sizeof(err)),
        KVF_ERR_FORMAT);
    assert_non_null(strstr(err, "prefill_eff"));
    /* and decode efficiencies by batch alike */
    assert_int_equal(kvf_sim_profile_load(DATA "/profile-prefill-eff.json", &hw, err, sizeof(err)),
                     KVF_OK);
    assert_int_equal(hw.n_decode_eff, 2);
    assert_true(hw.decode_eff_seqs[0] == 8 && hw.decode_eff[1] == 0.6);
    assert_float_equal(kvf_sim_decode_eff(&hw, 16), 0.45, 1e-15);
    assert_true(hw.attn_eff == 0.2); /* and the decode attention's */
    assert_int_equal(
        kvf_sim_profile_load(DATA "/profile-bad-decode-eff.json", &hw, err, sizeof(err)),
        KVF_ERR_FORMAT);
    assert_non_null(strstr(err, "decode_eff"));
}

static void test_traces(void **state)
{
    (void)state;
    kvf_sim_workload_t w;
    char err[512];
    assert_int_equal(kvf_sim_workload_load(DATA "/traces/good.csv", 128, &w, err, sizeof(err)),
                     KVF_OK);
    assert_int_equal(w.n, 4);
    assert_int_equal(w.reqs[1].prefix_id, 3);
    assert_int_equal(w.reqs[1].prefix_tokens, 128); /* the default */
    assert_int_equal(w.reqs[2].prefix_tokens, 64);
    assert_int_equal(w.reqs[3].prefix_id, -1);
    assert_true(w.reqs[3].at_s == 1.25 && w.reqs[3].n_output == 1);
    kvf_sim_workload_fini(&w);
    assert_int_equal(kvf_sim_workload_load(DATA "/traces/good.jsonl", 128, &w, err, sizeof(err)),
                     KVF_OK);
    assert_int_equal(w.n, 2);
    assert_int_equal(w.reqs[1].n_prompt, 200);
    kvf_sim_workload_fini(&w);

    static const struct {
        const char *file, *says;
    } bad[] = {
        {"bad-number.csv", "bad-number.csv:3: prompt_tokens must be"},
        {"bad-order.csv", "bad-order.csv:3: arrival 0.500000 s is before"},
        {"bad-fields.csv", "bad-fields.csv:1: 2 fields"},
        {"bad-key.jsonl", "bad-key.jsonl:2: no \"output_tokens\""},
        {"bad-prefix.csv", "bad-prefix.csv:1: prefix_tokens 500 is longer"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char path[512];
        snprintf(path, sizeof(path), DATA "/traces/%s", bad[i].file);
        err[0] = '\0';
        assert_int_equal(kvf_sim_workload_load(path, 128, &w, err, sizeof(err)), KVF_ERR_FORMAT);
        if (!strstr(err, bad[i].says))
            fail_msg("%s: '%s' does not say '%s'", bad[i].file, err, bad[i].says);
    }
}

/* An 8B-shaped cluster on H200 under chat-like load. */
static void chat_config(kvf_sim_config_t *cfg, int n_prefill, int n_decode, int n_colocated)
{
    *cfg = (kvf_sim_config_t){0};
    kvf_sim_config_defaults(cfg);
    assert_true(kvf_sim_profile_builtin("h200", &cfg->hw));
    assert_int_equal(kvf_model_config_load(DATA "/llama3-8b", &cfg->model_cfg), KVF_OK);
    cfg->kv_dtype = KVF_KV_BF16;
    kvf_sim_model_init(&cfg->model_cfg, 2, cfg->kv_dtype, 1, &cfg->model);
    cfg->n_prefill = n_prefill;
    cfg->n_decode = n_decode;
    cfg->n_colocated = n_colocated;
    cfg->slo_ttft_ms = 500;
    cfg->slo_tpot_ms = 20;
}

static void chat_workload(kvf_sim_workload_t *w, uint64_t seed, uint32_t n_prefixes)
{
    kvf_sim_gen_t g = {.n = 2000,
                       .seed = seed,
                       .rate = 20,
                       .prompt_len = {1024, 4096},
                       .output_len = {100, 500},
                       .n_prefixes = n_prefixes,
                       .prefix_tokens = 1024};
    assert_int_equal(kvf_sim_workload_generate(&g, w), KVF_OK);
}

static void run(const kvf_sim_config_t *cfg, const kvf_sim_workload_t *w, kvf_sim_result_t *res)
{
    char err[512];
    kvf_status_t st = kvf_sim_run(cfg, w, res, err, sizeof(err));
    if (st != KVF_OK)
        fail_msg("kvf_sim_run: %s", err);
}

/* Everything a run reports, compared bit for bit. */
static bool same_result(const kvf_sim_result_t *a, const kvf_sim_result_t *b)
{
    return a->n_done == b->n_done && a->n_refused == b->n_refused && a->steps == b->steps &&
           a->transfers == b->transfers && a->cached_tokens == b->cached_tokens &&
           !memcmp(a->ttft, b->ttft, sizeof(a->ttft)) &&
           !memcmp(a->tpot, b->tpot, sizeof(a->tpot)) && !memcmp(a->e2e, b->e2e, sizeof(a->e2e)) &&
           a->duration_s == b->duration_s && a->goodput == b->goodput &&
           a->util_prefill == b->util_prefill && a->util_decode == b->util_decode &&
           a->n_ttft == b->n_ttft && a->n_tpot == b->n_tpot &&
           !memcmp(a->ttft_ms, b->ttft_ms, a->n_ttft * sizeof(double)) &&
           !memcmp(a->tpot_ms, b->tpot_ms, a->n_tpot * sizeof(double));
}

static void test_deterministic(void **state)
{
    (void)state;
    kvf_sim_config_t cfg;
    chat_config(&cfg, 2, 4, 0);
    kvf_sim_workload_t w1, w2, w3;
    chat_workload(&w1, 7, 8);
    chat_workload(&w2, 7, 8);
    chat_workload(&w3, 8, 8);
    kvf_sim_result_t a, b, c;
    run(&cfg, &w1, &a);
    run(&cfg, &w2, &b);
    run(&cfg, &w3, &c);
    assert_int_equal(a.n_done, 2000);
    assert_true(same_result(&a, &b));
    assert_false(same_result(&a, &c)); /* another seed, another workload */
    kvf_sim_result_fini(&a);
    kvf_sim_result_fini(&b);
    kvf_sim_result_fini(&c);
    /* the router's seed alone, with the random policy: other draws */
    cfg.route = KVF_ROUTE_RANDOM;
    run(&cfg, &w1, &a);
    cfg.seed = 2;
    run(&cfg, &w1, &b);
    assert_false(same_result(&a, &b));
    kvf_sim_result_fini(&a);
    kvf_sim_result_fini(&b);
    kvf_sim_workload_fini(&w1);
    kvf_sim_workload_fini(&w2);
    kvf_sim_workload_fini(&w3);
}

static void test_split_and_colocated(void **state)
{
    (void)state;
    kvf_sim_workload_t w;
    chat_workload(&w, 3, 4);
    kvf_sim_config_t split, colo;
    chat_config(&split, 2, 4, 0);
    chat_config(&colo, 0, 0, 6);
    kvf_sim_result_t rs, rc;
    run(&split, &w, &rs);
    run(&colo, &w, &rc);
    assert_int_equal(rs.n_done, w.n);
    assert_int_equal(rc.n_done, w.n);
    assert_int_equal(rs.transfers, w.n); /* every prompt's KV to its decode node */
    assert_int_equal(rc.transfers, 0);
    /* 4 prefixes of 1024 tokens: a node computes each about once (those
     * arriving while the first is computed compute it too); the others
     * reuse at least 62 blocks of it, the reuse cap of the shortest
     * prompt (1024 tokens, the last 32 computed) */
    assert_true(rs.cached_tokens >= (w.n - 50) * 992);
    assert_true(rc.cached_tokens >= (w.n - 50) * 992);
    /* the same work done: TPOT carries the prefill chunks on colocated
     * nodes, not on decode nodes */
    assert_true(rc.tpot[2] > rs.tpot[2]);
    kvf_sim_result_fini(&rs);
    kvf_sim_result_fini(&rc);
    /* a cluster that cannot hold the model */
    kvf_sim_config_t big;
    chat_config(&big, 1, 1, 0);
    assert_int_equal(kvf_model_config_load(DATA "/llama3-70b", &big.model_cfg), KVF_OK);
    kvf_sim_model_init(&big.model_cfg, 2, big.kv_dtype, 1, &big.model);
    char err[512] = "";
    assert_int_equal(kvf_sim_run(&big, &w, &rs, err, sizeof(err)), KVF_ERR_INVAL);
    assert_non_null(strstr(err, "raise --tp"));
    kvf_sim_workload_fini(&w);
}

/* The planner: a reachable SLO gets the cheapest cluster that meets it
 * (and a smaller one of that kind does not); a TPOT below one decode
 * step of the weights (8B on H200: 16 GB / 3.84 TB/s, 4.2 ms) gets none,
 * with the closest cluster and its shortfall. */
static void test_plan(void **state)
{
    (void)state;
    kvf_sim_config_t cfg;
    chat_config(&cfg, 0, 0, 0);
    cfg.slo_ttft_ms = 500;
    cfg.slo_tpot_ms = 8;
    kvf_sim_workload_t w;
    kvf_sim_gen_t g = {
        .n = 300, .seed = 5, .rate = 10, .prompt_len = {1024, 4096}, .output_len = {100, 500}};
    assert_int_equal(kvf_sim_workload_generate(&g, &w), KVF_OK);
    kvf_sim_plan_t pl;
    char err[512];
    assert_int_equal(kvf_sim_plan(&cfg, &w, 8, &pl, err, sizeof(err)), KVF_OK);
    assert_non_null(pl.best);
    assert_true(pl.best->meets && pl.best->shortfall <= 1);
    assert_true(pl.best->ttft_p99 <= 500 && pl.best->tpot_p99 <= 8);
    assert_true(pl.best->goodput >= pl.rate * 0.99);
    /* one node fewer of the colocated kind misses */
    if (pl.colocated.meets && pl.colocated.n_colocated > 1) {
        kvf_sim_config_t smaller = cfg;
        smaller.n_colocated = pl.colocated.n_colocated - 1;
        kvf_sim_result_t r;
        run(&smaller, &w, &r);
        assert_true(r.n_done < r.n || r.ttft[2] > 500 || r.tpot[2] > 8);
        kvf_sim_result_fini(&r);
    }
    cfg.slo_tpot_ms = 3;
    assert_int_equal(kvf_sim_plan(&cfg, &w, 4, &pl, err, sizeof(err)), KVF_OK);
    assert_null(pl.best);
    assert_non_null(pl.closest);
    assert_true(pl.closest->shortfall > 4.2 / 3 && pl.closest->tpot_p99 > 4.2);
    assert_false(pl.split.meets || pl.colocated.meets);
    assert_int_equal(kvf_sim_plan(&cfg, &w, 0, &pl, err, sizeof(err)), KVF_ERR_INVAL);
    kvf_sim_workload_fini(&w);
}

/* Conditional disaggregation (the router's --local-prefill-max-tokens):
 * decode nodes holding a prompt's prefix prefill its short rest
 * themselves, so almost no KV travels; without it every prompt's does. */
static void test_local_prefill(void **state)
{
    (void)state;
    kvf_sim_workload_t w;
    kvf_sim_gen_t g = {.n = 300,
                       .seed = 9,
                       .rate = 10,
                       .prompt_len = {1100, 1400},
                       .output_len = {50, 100},
                       .n_prefixes = 2,
                       .prefix_tokens = 1024};
    assert_int_equal(kvf_sim_workload_generate(&g, &w), KVF_OK);
    kvf_sim_config_t cfg;
    chat_config(&cfg, 1, 2, 0);
    kvf_sim_result_t split, local;
    run(&cfg, &w, &split);
    cfg.local_prefill_max_tokens = 1200;
    run(&cfg, &w, &local);
    assert_int_equal(split.transfers, w.n);
    assert_true(local.transfers < w.n / 10);
    assert_int_equal(local.n_done, w.n);
    kvf_sim_result_fini(&split);
    kvf_sim_result_fini(&local);
    kvf_sim_workload_fini(&w);
}

/* The measured host terms (docs/simulator.md, "Profiles"): a node's share
 * of a shared host's CPUs, hand-computed; steps stretched by it (half a
 * CPU: twice as long); nodes that never outnumber the CPUs unaffected,
 * and slowed when they do; each message's latency added to TTFT and e2e
 * (3 messages; the split path's KvAlloc, its answer, KvAllocReply and
 * KvReady four more), TPOT unchanged. */
static void test_host_terms(void **state)
{
    (void)state;
    kvf_sim_profile_t hw = unit_profile();
    assert_true(kvf_sim_host_share(&hw, 8) == 1); /* no shared host */
    hw.host_cpus = 2;
    assert_true(kvf_sim_host_share(&hw, 2) == 1);
    hw.host_load = 1;
    assert_true(fabs(kvf_sim_host_share(&hw, 2) - 2.0 / 3) < 1e-12);
    assert_true(kvf_sim_host_share(&hw, 3) == 0.5);

    kvf_sim_req_t reqs[2] = {{.at_s = 0, .n_prompt = 1000, .n_output = 50, .prefix_id = -1},
                             {.at_s = 0.05, .n_prompt = 1000, .n_output = 50, .prefix_id = -1}};
    kvf_sim_workload_t one = {.n = 1, .reqs = reqs}, two = {.n = 2, .reqs = reqs};
    kvf_sim_config_t colo, split;
    chat_config(&colo, 0, 0, 1);
    chat_config(&split, 1, 1, 0);
    kvf_sim_result_t a, b;
    run(&colo, &one, &a);
    colo.hw.host_cpus = colo.hw.node_threads = colo.hw.host_load = 1; /* half a CPU */
    run(&colo, &one, &b);
    assert_true(fabs(b.ttft[0] - 2 * a.ttft[0]) < 1e-3);
    assert_true(fabs(b.e2e[0] - 2 * a.e2e[0]) < 1e-3);
    kvf_sim_result_fini(&b);
    colo.hw.host_cpus = colo.hw.node_threads = colo.hw.host_load = 0;
    colo.hw.msg_latency_s = 1e-3;
    run(&colo, &one, &b);
    assert_true(fabs(b.ttft[0] - (a.ttft[0] + 3)) < 1e-6);
    assert_true(fabs(b.e2e[0] - (a.e2e[0] + 3)) < 1e-6);
    assert_true(b.tpot[0] == a.tpot[0]);
    kvf_sim_result_fini(&a);
    kvf_sim_result_fini(&b);

    run(&split, &one, &a);
    split.hw.msg_latency_s = 1e-3;
    run(&split, &one, &b);
    /* and the KV allocation before the prompt: KvAlloc, its answer (a
     * message's time on the idle decode node), KvAllocReply */
    assert_true(fabs(b.ttft[0] - (a.ttft[0] + 7)) < 1e-6);
    assert_true(fabs(b.e2e[0] - (a.e2e[0] + 7)) < 1e-6);
    kvf_sim_result_fini(&a);
    kvf_sim_result_fini(&b);
    split.hw.msg_latency_s = 0;
    /* the second prompt is computed while the first decodes */
    run(&split, &two, &a);
    split.hw.host_cpus = 2;
    split.hw.node_threads = 1;
    run(&split, &two, &b);
    assert_true(same_result(&a, &b)); /* never more busy nodes than CPUs */
    kvf_sim_result_fini(&b);
    split.hw.host_cpus = 1;
    run(&split, &two, &b);
    assert_true(b.e2e[2] > a.e2e[2] * 1.05);
    kvf_sim_result_fini(&a);
    kvf_sim_result_fini(&b);
}

/* A decode node takes a landed KV between its steps: a request whose KV
 * lands while another request decodes gets its first token when that
 * step ends, later than the same request alone (whose decode node is
 * idle), by at most two steps (its KvAlloc waits for a step's end too);
 * the one that landed on an idle node is not delayed. */
static void test_join_between_steps(void **state)
{
    (void)state;
    kvf_sim_config_t cfg;
    chat_config(&cfg, 1, 1, 0);
    /* A decodes from about 0.1 s to well past B's landing (1 s + its prompt) */
    kvf_sim_req_t both[2] = {{.at_s = 0, .n_prompt = 1000, .n_output = 4000, .prefix_id = -1},
                             {.at_s = 1, .n_prompt = 1000, .n_output = 10, .prefix_id = -1}};
    kvf_sim_req_t alone[1] = {both[1]};
    kvf_sim_workload_t w2 = {.n = 2, .reqs = both}, w1 = {.n = 1, .reqs = alone};
    kvf_sim_result_t a, b;
    run(&cfg, &w1, &a);
    run(&cfg, &w2, &b);
    assert_int_equal(a.n_done, 1);
    assert_int_equal(b.n_done, 2);
    /* sorted: A's (landed on an idle node, as B alone), then B's */
    assert_true(b.ttft_ms[0] == a.ttft_ms[0]);
    assert_true(b.ttft_ms[1] > a.ttft_ms[0]);
    kvf_sim_step_t step = {.decode_seqs = 1, .decode_ctx = 1000 + 4000};
    const double step_ms = kvf_sim_step_time(&cfg.hw, &cfg.model, &step) * 1e3;
    assert_true(b.ttft_ms[1] - a.ttft_ms[0] <= 2 * step_ms);
    kvf_sim_result_fini(&a);
    kvf_sim_result_fini(&b);
}

/* A prefill node computes a prompt once its KV blocks are granted
 * (KvAllocReply), taking the granted prompts of its FIFO. Two prompts
 * that queue during another's forward send their KvAllocs when it ends:
 * an idle decode node answers one, then the other a message later, so
 * the node starts on the first alone and the second waits for the next
 * forward; a decode node mid-step answers both at the step's end, and
 * they share one forward. */
static void test_alloc_before_prompt(void **state)
{
    (void)state;
    kvf_sim_config_t cfg;
    chat_config(&cfg, 1, 1, 0);
    cfg.hw.msg_latency_s = 1e-4;
    kvf_sim_step_t one = {0};
    kvf_sim_step_add_chunk(&one, 0, 1000, true);
    const double fwd_ms = kvf_sim_step_time(&cfg.hw, &cfg.model, &one) * 1e3;
    /* idle decode node: every request has one token, which ends it at
     * its join */
    kvf_sim_req_t idle[3] = {{.at_s = 0, .n_prompt = 2000, .n_output = 1, .prefix_id = -1},
                             {.at_s = 0.001, .n_prompt = 1000, .n_output = 1, .prefix_id = -1},
                             {.at_s = 0.001, .n_prompt = 1000, .n_output = 1, .prefix_id = -1}};
    kvf_sim_workload_t w = {.n = 3, .reqs = idle};
    kvf_sim_result_t r;
    run(&cfg, &w, &r);
    assert_int_equal(r.n_done, 3);
    assert_int_equal(r.steps, 3); /* three forwards, no decode step */
    /* sorted TTFTs: B, then C a forward of its own later */
    double gap = r.ttft_ms[2] - r.ttft_ms[1];
    assert_true(gap >= 0.99 * fwd_ms && gap <= fwd_ms + 1);
    kvf_sim_result_fini(&r);
    /* busy decode node: Z decodes from early on, throughout; A's
     * KvAlloc waits for a decode step's end (at most dec), then A
     * computes (fwd_a), and B and C come in the middle of that */
    kvf_sim_step_t two = {0}, dec = {.decode_seqs = 1, .decode_ctx = 4100};
    kvf_sim_step_add_chunk(&two, 0, 2000, true);
    const double fwd_a = kvf_sim_step_time(&cfg.hw, &cfg.model, &two);
    const double mid = 0.05 + kvf_sim_step_time(&cfg.hw, &cfg.model, &dec) + fwd_a / 2;
    kvf_sim_req_t busy[4] = {{.at_s = 0, .n_prompt = 100, .n_output = 4000, .prefix_id = -1},
                             {.at_s = 0.05, .n_prompt = 2000, .n_output = 1, .prefix_id = -1},
                             {.at_s = mid, .n_prompt = 1000, .n_output = 1, .prefix_id = -1},
                             {.at_s = mid, .n_prompt = 1000, .n_output = 1, .prefix_id = -1}};
    w = (kvf_sim_workload_t){.n = 4, .reqs = busy};
    run(&cfg, &w, &r);
    assert_int_equal(r.n_done, 4);
    /* sorted TTFTs: Z, A, then B and C, one forward and their transfers
     * one after the other apart */
    gap = r.ttft_ms[3] - r.ttft_ms[2];
    assert_true(gap < 0.5 * fwd_ms);
    kvf_sim_result_fini(&r);
}

/* The host's cache: a split cluster's second prompt computed while the
 * first decodes streams both nodes' weights; past a cache smaller than
 * both, each copy keeps its share of it and reads the rest at a lower
 * bandwidth, so the decode is slower then, the more so the smaller the
 * cache; a cache that holds both, or one node alone (colocated), changes
 * nothing. */
static void test_host_cache(void **state)
{
    (void)state;
    kvf_sim_req_t reqs[2] = {{.at_s = 0, .n_prompt = 1000, .n_output = 50, .prefix_id = -1},
                             {.at_s = 0.05, .n_prompt = 1000, .n_output = 50, .prefix_id = -1}};
    kvf_sim_workload_t two = {.n = 2, .reqs = reqs};
    kvf_sim_config_t split, colo;
    chat_config(&split, 1, 1, 0);
    split.hw.host_cpus = 2;
    split.hw.node_threads = 1;
    kvf_sim_result_t a, b;
    run(&split, &two, &a);
    double w = split.model.step_weight_bytes; /* what a step streams */
    split.hw.dram_bw = split.hw.hbm_bw / 4;
    split.hw.llc_bytes = 2.5 * w; /* holds both copies */
    run(&split, &two, &b);
    assert_true(same_result(&a, &b));
    kvf_sim_result_fini(&b);
    split.hw.dram_bw = split.hw.hbm_bw / 8;
    split.hw.llc_bytes = 1.5 * w; /* one copy, not two: each keeps 3/4 of itself */
    run(&split, &two, &b);
    assert_true(b.tpot[2] > a.tpot[2] * 1.05);
    assert_true(b.ttft[0] == a.ttft[0]); /* the first prompt ran alone */
    kvf_sim_result_t c;
    split.hw.llc_bytes = 0.5 * w; /* each keeps 1/4: slower still */
    run(&split, &two, &c);
    assert_true(c.tpot[2] > b.tpot[2]); /* all or nothing: equal */
    kvf_sim_result_fini(&a);
    kvf_sim_result_fini(&b);
    kvf_sim_result_fini(&c);

    chat_config(&colo, 0, 0, 1);
    colo.hw.host_cpus = 2;
    colo.hw.node_threads = 2;
    run(&colo, &two, &a);
    colo.hw.dram_bw = colo.hw.hbm_bw / 4;
    colo.hw.llc_bytes = 1.5 * w;
    run(&colo, &two, &b);
    assert_true(same_result(&a, &b));
    kvf_sim_result_fini(&a);
    kvf_sim_result_fini(&b);
}

/* kvf bench engine's JSON for the hand model: best step times, and
 * (median > 0) each typical repetition at median x the best's time. */
static cJSON *engine_json(double median)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "bandwidth_gbs", 20);
    cJSON_AddNumberToObject(e, "bandwidth_large_gbs", 15);
    cJSON_AddNumberToObject(e, "sgemm_gflops", 100);
    cJSON_AddNumberToObject(e, "decode_b1_roofline_ratio", 0.5);
    const char *steps[5] = {"decode_b1_step_ms", "decode_b2_step_ms", "decode_b4_step_ms",
                            "decode_b8_step_ms", "decode_b32_step_ms"};
    const double ms[5] = {1, 1.5, 1.8, 2, 6};
    char key[64];
    for (int i = 0; i < 5; i++) {
        cJSON_AddNumberToObject(e, steps[i], ms[i]);
        snprintf(key, sizeof(key), "%s_median", steps[i]);
        if (median > 0)
            cJSON_AddNumberToObject(e, key, ms[i] * median);
    }
    const unsigned tokens[2] = {128, 512};
    const double rate[2] = {10000, 8000};
    for (int i = 0; i < 2; i++) {
        snprintf(key, sizeof(key), "prefill_%u_tokens_per_s", tokens[i]);
        cJSON_AddNumberToObject(e, key, rate[i]);
        snprintf(key, sizeof(key), "prefill_%u_tokens_per_s_median", tokens[i]);
        if (median > 0)
            cJSON_AddNumberToObject(e, key, rate[i] / median);
    }
    cJSON *kv = cJSON_AddArrayToObject(e, "kv_decode");
    cJSON *row = cJSON_CreateObject();
    cJSON_AddStringToObject(row, "kv", "f32");
    cJSON_AddNumberToObject(row, "context", 4096);
    cJSON_AddNumberToObject(row, "batch", 16);
    cJSON_AddNumberToObject(row, "step_ms", 40);
    if (median > 0)
        cJSON_AddNumberToObject(row, "step_ms_median", 40 * median);
    cJSON_AddItemToArray(kv, row);
    return e;
}

static bool near_half(double half, double whole)
{
    return whole > 0 && fabs(half - whole / 2) <= 1e-12 * whole;
}

/* A measured profile takes each step's typical (median) repetition, which
 * the serving runs see, where kvf bench engine reports one, and its best
 * where not: with every median twice its best, every efficiency halves.
 * The decode tokens' efficiency has a point at each batch measured: 2, 4,
 * 8 and 32 (8 and 32 alone from an older benchmark's JSON). */
static void test_profile_from_bench(void **state)
{
    (void)state;
    kvf_model_config_t c = hand_config();
    kvf_sim_model_t m;
    kvf_sim_model_init(&c, 4, KVF_KV_F32, 1, &m);
    cJSON *xfer = cJSON_Parse("{\"fit_gbps\": {\"shm\": 10}, \"fixed_cost_us\": {\"shm\": 2}}");
    cJSON *best = engine_json(0), *typ = engine_json(2);
    kvf_sim_profile_t b, t;
    assert_true(kvf_sim_profile_from_bench(best, xfer, "f32", &m, &b));
    assert_true(kvf_sim_profile_from_bench(typ, xfer, "f32", &m, &t));
    assert_true(b.hbm_bw == 20e9 && t.hbm_bw == 20e9 && t.flops == 100e9);
    assert_true(t.net_bw == 10e9 && t.transfer_fixed_s == 2e-6);
    assert_true(b.mem_eff == 0.5 && t.mem_eff == 0.25);
    assert_true(b.attn_eff > 0 && near_half(t.attn_eff, b.attn_eff));
    assert_int_equal(t.n_decode_eff, 4);
    const double seqs[4] = {2, 4, 8, 32};
    for (int i = 0; i < 4; i++) {
        assert_true(t.decode_eff_seqs[i] == seqs[i]);
        assert_true(b.decode_eff[i] > 0 && near_half(t.decode_eff[i], b.decode_eff[i]));
    }
    /* fewer rows, less work a step: each point below the next */
    for (int i = 0; i < 3; i++)
        assert_true(b.decode_eff[i] < b.decode_eff[i + 1]);
    assert_true(b.decode_compute_eff == b.decode_eff[3]);
    cJSON_DeleteItemFromObject(best, "decode_b2_step_ms");
    cJSON_DeleteItemFromObject(best, "decode_b4_step_ms");
    kvf_sim_profile_t old;
    assert_true(kvf_sim_profile_from_bench(best, xfer, "f32", &m, &old));
    assert_int_equal(old.n_decode_eff, 2);
    assert_true(old.decode_eff_seqs[0] == 8 && old.decode_eff_seqs[1] == 32);
    assert_true(old.decode_eff[0] == b.decode_eff[2] && old.decode_eff[1] == b.decode_eff[3]);
    assert_int_equal(t.n_prefill_eff, 2);
    assert_true(t.prefill_eff_tokens[0] == 128 && t.prefill_eff_tokens[1] == 512);
    for (int i = 0; i < 2; i++)
        assert_true(b.prefill_eff[i] > 0 && near_half(t.prefill_eff[i], b.prefill_eff[i]));
    /* a batch-1 step above the bandwidth benchmark's roofline (a cache
     * that holds the weights) raises the bandwidth to its own rate */
    cJSON_ReplaceItemInObject(best, "decode_b1_roofline_ratio", cJSON_CreateNumber(1.25));
    kvf_sim_profile_t fast;
    assert_true(kvf_sim_profile_from_bench(best, xfer, "f32", &m, &fast));
    assert_true(fabs(fast.hbm_bw - 25e9) <= 1e-3 && fast.mem_eff == 1);
    /* a number the profile needs missing: refused */
    cJSON_DeleteItemFromObject(typ, "sgemm_gflops");
    assert_false(kvf_sim_profile_from_bench(typ, xfer, "f32", &m, &t));
    cJSON_Delete(best);
    cJSON_Delete(typ);
    cJSON_Delete(xfer);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_shape),   cmocka_unit_test(test_step_times),
        cmocka_unit_test(test_profiles),      cmocka_unit_test(test_traces),
        cmocka_unit_test(test_deterministic), cmocka_unit_test(test_split_and_colocated),
        cmocka_unit_test(test_plan),          cmocka_unit_test(test_local_prefill),
        cmocka_unit_test(test_host_terms),    cmocka_unit_test(test_host_cache),
        cmocka_unit_test(test_join_between_steps),
        cmocka_unit_test(test_alloc_before_prompt),
        cmocka_unit_test(test_profile_from_bench),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
