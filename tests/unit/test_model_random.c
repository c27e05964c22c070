/* kvf_model_write_random_opts: the weight statistics of the trained-like
 * options (kvf/model.h), read back from model.safetensors. Heavy tails give
 * the matrices a kurtosis near a Laplace's (6) instead of a uniform's
 * (1.8); K's outlier channels are the two slowest rotary pairs of every kv
 * head, at the scale asked and half of it (on the k_norm weight with
 * qk_norm); V's channels spread; no options write the plain model, and the
 * models load. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kvf/log.h"
#include "kvf/model.h"
#include "kvf/safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HD 32

static char g_dir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof(g_dir), "/tmp/kvf_test_model_random_XXXXXX");
    kvf_log_set_level(KVF_LOG_OFF);
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static kvf_model_config_t config(kvf_arch_t arch)
{
    kvf_model_config_t c;
    memset(&c, 0, sizeof(c));
    c.arch = arch;
    snprintf(c.arch_name, sizeof(c.arch_name), "%s",
             arch == KVF_ARCH_QWEN3 ? "Qwen3ForCausalLM" : "LlamaForCausalLM");
    c.qk_norm = arch == KVF_ARCH_QWEN3;
    c.n_layers = 1;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = HD;
    c.hidden = 128;
    c.inter = 256;
    c.vocab = 300;
    c.max_pos = 64;
    c.rope_theta = 10000;
    c.rms_eps = 1e-5;
    c.bos_id = 1;
    c.eos_ids[0] = 2;
    c.n_eos = 1;
    c.dtype = KVF_DTYPE_F32;
    return c;
}

/* Writes the model with opts into g_dir and opens its weights. */
static kvf_safetensors_t *write_and_open(kvf_arch_t arch, const kvf_model_random_opts_t *opts)
{
    kvf_model_config_t c = config(arch);
    assert_int_equal(kvf_model_write_random_opts(g_dir, &c, KVF_DTYPE_F32, 7, opts), KVF_OK);
    kvf_model_t *m;
    assert_int_equal(kvf_model_load(g_dir, &m), KVF_OK);
    kvf_model_destroy(m);
    char path[128];
    snprintf(path, sizeof(path), "%s/model.safetensors", g_dir);
    kvf_safetensors_t *st;
    assert_int_equal(kvf_safetensors_open(path, &st), KVF_OK);
    return st;
}

static const float *tensor(const kvf_safetensors_t *st, const char *name, size_t *n_p)
{
    const kvf_st_tensor_t *t = kvf_safetensors_find(st, name);
    assert_non_null(t);
    assert_int_equal(t->dtype, KVF_DTYPE_F32);
    *n_p = t->nbytes / sizeof(float);
    return t->data;
}

static double kurtosis(const float *x, size_t n)
{
    double m2 = 0, m4 = 0;
    for (size_t i = 0; i < n; i++) {
        m2 += (double)x[i] * x[i];
        m4 += (double)x[i] * x[i] * x[i] * x[i];
    }
    m2 /= (double)n;
    return m4 / (double)n / (m2 * m2);
}

static double row_rms(const float *x, size_t cols, size_t row)
{
    double s = 0;
    for (size_t i = 0; i < cols; i++)
        s += (double)x[row * cols + i] * x[row * cols + i];
    return sqrt(s / (double)cols);
}

/* Mean RMS of k_proj's rows at channel ch of every kv head. */
static double channel_rms(const float *k, size_t cols, int n_kv, int ch)
{
    double s = 0;
    for (int h = 0; h < n_kv; h++)
        s += row_rms(k, cols, (size_t)(h * HD + ch));
    return s / n_kv;
}

static void test_plain_and_trained_like(void **state)
{
    (void)state;
    size_t n, nk, nv;
    kvf_safetensors_t *plain = write_and_open(KVF_ARCH_LLAMA, NULL);
    const float *q = tensor(plain, "model.layers.0.self_attn.q_proj.weight", &n);
    double kurt_plain = kurtosis(q, n);
    assert_true(kurt_plain > 1.6 && kurt_plain < 2.0);
    const float *k = tensor(plain, "model.layers.0.self_attn.k_proj.weight", &nk);
    double ratio_plain = channel_rms(k, 128, 2, HD - 1) / channel_rms(k, 128, 2, 3);
    assert_true(ratio_plain > 0.8 && ratio_plain < 1.25);
    kvf_safetensors_close(plain);

    const kvf_model_random_opts_t o = {.heavy_tails = true, .kv_outlier_scale = 8,
                                       .v_channel_spread = 0.7f};
    kvf_safetensors_t *st = write_and_open(KVF_ARCH_LLAMA, &o);
    q = tensor(st, "model.layers.0.self_attn.q_proj.weight", &n);
    double kurt = kurtosis(q, n);
    assert_true(kurt > 5.0 && kurt < 7.5);
    k = tensor(st, "model.layers.0.self_attn.k_proj.weight", &nk);
    double base = 0;
    for (int ch = 0; ch < HD / 2 - 2; ch++)
        base += channel_rms(k, 128, 2, ch) / (HD / 2 - 2);
    for (int half = 0; half < 2; half++) {
        double big = channel_rms(k, 128, 2, half * HD / 2 + HD / 2 - 1) / base;
        double mid = channel_rms(k, 128, 2, half * HD / 2 + HD / 2 - 2) / base;
        assert_true(big > 6.0 && big < 10.0);
        assert_true(mid > 3.0 && mid < 5.0);
    }
    const float *v = tensor(st, "model.layers.0.self_attn.v_proj.weight", &nv);
    double lo = 1e30, hi = 0;
    for (size_t r = 0; r < 2 * HD; r++) {
        double x = row_rms(v, 128, r);
        lo = x < lo ? x : lo;
        hi = x > hi ? x : hi;
    }
    assert_true(hi / lo > 2.5);
    kvf_safetensors_close(st);
}

/* With qk_norm the outliers sit on k_norm's weight (k_proj's row scales
 * would be normalized away). */
static void test_qk_norm_outliers(void **state)
{
    (void)state;
    const kvf_model_random_opts_t o = {.kv_outlier_scale = 8};
    kvf_safetensors_t *st = write_and_open(KVF_ARCH_QWEN3, &o);
    size_t n;
    const float *w = tensor(st, "model.layers.0.self_attn.k_norm.weight", &n);
    assert_int_equal(n, HD);
    for (int ch = 0; ch < HD; ch++) {
        int in_half = ch % (HD / 2);
        double want = in_half == HD / 2 - 1 ? 8 : in_half == HD / 2 - 2 ? 4 : 1;
        assert_true(w[ch] > 0.85 * want && w[ch] < 1.15 * want);
    }
    const float *qn = tensor(st, "model.layers.0.self_attn.q_norm.weight", &n);
    for (int ch = 0; ch < HD; ch++)
        assert_true(qn[ch] > 0.85f && qn[ch] < 1.15f);
    kvf_safetensors_close(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_and_trained_like),
        cmocka_unit_test(test_qk_norm_outliers),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
