/* Model loading tests: the golden configs, sharded checkpoints, F16/BF16,
 * fingerprints, config-only loads, and malformed models (truncated file,
 * missing tensor, wrong shape, unknown architecture, bad header), which
 * must fail with an error, never crash. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kvf/log.h"
#include "kvf/model.h"
#include "kvf/safetensors.h"
#include "support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[64];

static int make_dir(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof(g_dir), "/tmp/kvf_test_model_XXXXXX");
    if (!mkdtemp(g_dir))
        return -1;
    kvf_log_set_level(KVF_LOG_OFF);
    return 0;
}

static int remove_dir(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static kvf_model_config_t small_config(void)
{
    kvf_model_config_t c;
    memset(&c, 0, sizeof(c));
    c.arch = KVF_ARCH_LLAMA;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 8;
    c.hidden = 32;
    c.inter = 48;
    c.vocab = 64;
    c.max_pos = 128;
    c.rope_theta = 10000;
    c.rms_eps = 1e-5;
    c.bos_id = 1;
    c.eos_ids[0] = 2;
    c.eos_ids[1] = 3;
    c.n_eos = 2;
    return c;
}

static void write_text(const char *name, const char *text)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", g_dir, name);
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
}

static void test_golden_configs(void **state)
{
    (void)state;
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/golden/tiny-qwen2-bf16", KVF_TEST_DATA);
    kvf_model_config_t c;
    assert_int_equal(kvf_model_config_load(dir, &c), KVF_OK);
    assert_int_equal(c.arch, KVF_ARCH_QWEN2);
    assert_true(c.qkv_bias);
    assert_true(c.tie_embeddings);
    assert_int_equal(c.n_layers, 3);
    assert_int_equal(c.hidden, 96);
    assert_int_equal(c.n_heads, 6);
    assert_int_equal(c.n_kv_heads, 2);
    assert_int_equal(c.head_dim, 16);
    assert_int_equal(c.bos_id, 510);
    assert_int_equal(c.n_eos, 1);
    assert_int_equal(c.eos_ids[0], 511);
    assert_true(c.rope_theta == 1e6);
    kvf_model_t *m;
    assert_int_equal(kvf_model_load(dir, &m), KVF_OK);
    assert_ptr_equal(m->lm_head, m->embed);
    assert_non_null(m->layers[0].bqkv);
    assert_int_equal(strlen(kvf_model_fingerprint(m)), 16);
    kvf_model_t *m2;
    assert_int_equal(kvf_model_load(dir, &m2), KVF_OK);
    assert_string_equal(kvf_model_fingerprint(m), kvf_model_fingerprint(m2));
    snprintf(dir, sizeof(dir), "%s/golden/tiny-llama-f32", KVF_TEST_DATA);
    kvf_model_t *m3;
    assert_int_equal(kvf_model_load(dir, &m3), KVF_OK);
    assert_string_not_equal(kvf_model_fingerprint(m), kvf_model_fingerprint(m3));
    assert_true(m3->lm_head != m3->embed);
    assert_null(m3->layers[1].bqkv);
    kvf_model_destroy(m);
    kvf_model_destroy(m2);
    kvf_model_destroy(m3);
}

/* Same weights in F32, BF16-exact values and F16-exact values, and split
 * into two shards with an index, load to the same f32 tensors. */
static void test_dtypes_and_shards(void **state)
{
    (void)state;
    kvf_model_config_t c = small_config();
    assert_int_equal(kvf_model_write_random(g_dir, &c, KVF_DTYPE_BF16, 5), KVF_OK);
    kvf_model_t *bf;
    assert_int_equal(kvf_model_load(g_dir, &bf), KVF_OK);
    assert_int_equal(bf->cfg.n_eos, 2);
    /* reshard: each tensor of the bf16 file goes to one of two shards */
    char path[256];
    snprintf(path, sizeof(path), "%s/model.safetensors", g_dir);
    kvf_safetensors_t *st;
    assert_int_equal(kvf_safetensors_open(path, &st), KVF_OK);
    size_t n = kvf_safetensors_count(st);
    kvf_st_write_t *w = calloc(n, sizeof(*w));
    for (size_t i = 0; i < n; i++) {
        const kvf_st_tensor_t *t = kvf_safetensors_tensor(st, i);
        w[i].name = t->name;
        w[i].dtype = t->dtype;
        w[i].ndim = t->ndim;
        memcpy(w[i].shape, t->shape, sizeof(t->shape));
        w[i].data = t->data;
    }
    char index[8192];
    size_t len = (size_t)snprintf(index, sizeof(index), "{\"metadata\": {}, \"weight_map\": {");
    size_t half = n / 2;
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(
            index + len, sizeof(index) - len, "%s\"%s\": \"%s\"", i ? ", " : "", w[i].name,
            i < half ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors");
    snprintf(index + len, sizeof(index) - len, "}}");
    snprintf(path, sizeof(path), "%s/model-00001-of-00002.safetensors", g_dir);
    assert_int_equal(kvf_safetensors_write(path, w, half), KVF_OK);
    snprintf(path, sizeof(path), "%s/model-00002-of-00002.safetensors", g_dir);
    assert_int_equal(kvf_safetensors_write(path, w + half, n - half), KVF_OK);
    kvf_safetensors_close(st);
    free(w);
    snprintf(path, sizeof(path), "%s/model.safetensors", g_dir);
    unlink(path);
    write_text("model.safetensors.index.json", index);
    kvf_model_t *sh;
    assert_int_equal(kvf_model_load(g_dir, &sh), KVF_OK);
    assert_int_equal(sh->slab_bytes, bf->slab_bytes);
    assert_memory_equal(sh->slab, bf->slab, bf->slab_bytes);
    assert_int_equal(sh->mslab_bytes, bf->mslab_bytes);
    assert_memory_equal(sh->mslab, bf->mslab, bf->mslab_bytes);
    kvf_model_destroy(sh);
    kvf_model_destroy(bf);
    snprintf(path, sizeof(path), "%s/model-00001-of-00002.safetensors", g_dir);
    unlink(path);
    snprintf(path, sizeof(path), "%s/model-00002-of-00002.safetensors", g_dir);
    unlink(path);
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", g_dir);
    unlink(path);
    /* f16 */
    assert_int_equal(kvf_model_write_random(g_dir, &c, KVF_DTYPE_F16, 5), KVF_OK);
    kvf_model_t *h;
    assert_int_equal(kvf_model_load(g_dir, &h), KVF_OK);
    assert_true(h->embed[0] != 0);
    kvf_model_destroy(h);
}

static void expect_load_error(kvf_status_t want)
{
    kvf_model_t *m = NULL;
    kvf_status_t st = kvf_model_load(g_dir, &m);
    assert_int_equal(st, want);
    assert_null(m);
}

/* Rewrites model.safetensors without the named tensor or with one dim
 * changed. */
static void rewrite_weights(const char *drop, const char *reshape)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/model.safetensors", g_dir);
    kvf_model_config_t c = small_config();
    assert_int_equal(kvf_model_write_random(g_dir, &c, KVF_DTYPE_F32, 1), KVF_OK);
    kvf_safetensors_t *st;
    assert_int_equal(kvf_safetensors_open(path, &st), KVF_OK);
    size_t n = kvf_safetensors_count(st), k = 0;
    kvf_st_write_t *w = calloc(n, sizeof(*w));
    char **copies = calloc(n, sizeof(*copies));
    for (size_t i = 0; i < n; i++) {
        const kvf_st_tensor_t *t = kvf_safetensors_tensor(st, i);
        if (drop && !strcmp(t->name, drop))
            continue;
        copies[k] = malloc(t->nbytes + 4);
        memcpy(copies[k], t->data, t->nbytes);
        w[k].name = t->name;
        w[k].dtype = t->dtype;
        w[k].ndim = t->ndim;
        memcpy(w[k].shape, t->shape, sizeof(t->shape));
        if (reshape && !strcmp(t->name, reshape))
            w[k].shape[0] = 1; /* fewer rows: same data, a prefix of it */
        w[k].data = copies[k];
        k++;
    }
    snprintf(path, sizeof(path), "%s/model.tmp", g_dir);
    assert_int_equal(kvf_safetensors_write(path, w, k), KVF_OK);
    kvf_safetensors_close(st);
    char final[256];
    snprintf(final, sizeof(final), "%s/model.safetensors", g_dir);
    rename(path, final);
    for (size_t i = 0; i < k; i++)
        free(copies[i]);
    free(copies);
    free(w);
}

static void test_malformed(void **state)
{
    (void)state;
    char path[256];
    snprintf(path, sizeof(path), "%s/model.safetensors", g_dir);
    kvf_model_config_t c = small_config();
    assert_int_equal(kvf_model_write_random(g_dir, &c, KVF_DTYPE_F32, 1), KVF_OK);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    /* truncated: every cut point of interest (mid-data, mid-header, tiny) */
    off_t cuts[] = {sb.st_size - 1, sb.st_size / 2, 100, 9, 3, 0};
    for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
        assert_int_equal(kvf_model_write_random(g_dir, &c, KVF_DTYPE_F32, 1), KVF_OK);
        assert_int_equal(truncate(path, cuts[i]), 0);
        expect_load_error(KVF_ERR_FORMAT);
    }
    /* missing tensor, wrong shape */
    rewrite_weights("model.layers.1.mlp.up_proj.weight", NULL);
    expect_load_error(KVF_ERR_NOT_FOUND);
    rewrite_weights(NULL, "model.layers.0.self_attn.k_proj.weight");
    expect_load_error(KVF_ERR_FORMAT);
    /* a header that lies: offsets beyond the data, garbage JSON, huge length */
    FILE *fp = fopen(path, "wb");
    const char *hdr = "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,1600]}}";
    uint64_t hl = strlen(hdr);
    fwrite(&hl, 8, 1, fp);
    fwrite(hdr, 1, hl, fp);
    fwrite("0123456789abcdef", 1, 16, fp);
    fclose(fp);
    kvf_safetensors_t *st = NULL;
    assert_int_equal(kvf_safetensors_open(path, &st), KVF_ERR_FORMAT);
    fp = fopen(path, "wb");
    hdr = "{not json";
    hl = strlen(hdr);
    fwrite(&hl, 8, 1, fp);
    fwrite(hdr, 1, hl, fp);
    fclose(fp);
    assert_int_equal(kvf_safetensors_open(path, &st), KVF_ERR_FORMAT);
    fp = fopen(path, "wb");
    hl = ~0ull;
    fwrite(&hl, 8, 1, fp);
    fclose(fp);
    assert_int_equal(kvf_safetensors_open(path, &st), KVF_ERR_FORMAT);
    /* shape/offset disagreement */
    fp = fopen(path, "wb");
    hdr = "{\"a\":{\"dtype\":\"F32\",\"shape\":[5],\"data_offsets\":[0,16]}}";
    hl = strlen(hdr);
    fwrite(&hl, 8, 1, fp);
    fwrite(hdr, 1, hl, fp);
    fwrite("0123456789abcdef", 1, 16, fp);
    fclose(fp);
    assert_int_equal(kvf_safetensors_open(path, &st), KVF_ERR_FORMAT);
    /* unknown architecture; missing config; bad geometry */
    assert_int_equal(kvf_model_write_random(g_dir, &c, KVF_DTYPE_F32, 1), KVF_OK);
    write_text("config.json", "{\"architectures\": [\"GPT2LMHeadModel\"], \"hidden_size\": 32}");
    expect_load_error(KVF_ERR_UNSUPPORTED);
    write_text("config.json", "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 32, "
                              "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                              "\"num_key_value_heads\": 3, \"intermediate_size\": 48, "
                              "\"vocab_size\": 64}");
    expect_load_error(KVF_ERR_FORMAT);
    write_text("config.json", "[1, 2");
    expect_load_error(KVF_ERR_FORMAT);
    snprintf(path, sizeof(path), "%s/config.json", g_dir);
    unlink(path);
    expect_load_error(KVF_ERR_NOT_FOUND);
    kvf_model_config_t cfg;
    assert_int_equal(kvf_model_config_load(g_dir, &cfg), KVF_ERR_NOT_FOUND);
}

/* Loads g_dir, which must fail with want; returns the error log
 * (malloc'd). */
static char *load_error_log(kvf_status_t want)
{
    kvf_log_set_level(KVF_LOG_ERROR);
    kvf_test_stderr_begin();
    kvf_model_t *m = NULL;
    kvf_status_t st = kvf_model_load(g_dir, &m);
    char *log = kvf_test_stderr_end();
    kvf_log_set_level(KVF_LOG_OFF);
    if (st != want)
        fail_msg("status %s, want %s; log: %s", kvf_status_str(st), kvf_status_str(want), log);
    assert_null(m);
    return log;
}

static void expect_log(const char *log, const char *text)
{
    if (!strstr(log, text))
        fail_msg("the log lacks \"%s\": %s", text, log);
}

/* A config whose limits are crossed names the field, the value and the
 * limit. */
static void test_config_limits(void **state)
{
    (void)state;
    kvf_model_config_t c = small_config();
    assert_int_equal(kvf_model_write_random(g_dir, &c, KVF_DTYPE_F32, 1), KVF_OK);
    static const char *const head = "{\"architectures\": [\"LlamaForCausalLM\"], "
                                    "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                                    "\"intermediate_size\": 48, ";
    char text[512];
    snprintf(text, sizeof(text), "%s\"hidden_size\": 32, \"vocab_size\": 1099511627776}", head);
    write_text("config.json", text);
    char *log = load_error_log(KVF_ERR_FORMAT);
    expect_log(log, "\"vocab_size\" 1099511627776 exceeds the maximum of 1000000000");
    free(log);
    snprintf(text, sizeof(text), "%s\"hidden_size\": 32, \"vocab_size\": 16777217}", head);
    write_text("config.json", text);
    log = load_error_log(KVF_ERR_FORMAT);
    expect_log(log, "vocab_size 16777217 exceeds the maximum of 16777216");
    free(log);
    snprintf(text, sizeof(text), "%s\"hidden_size\": 32, \"vocab_size\": -4}", head);
    write_text("config.json", text);
    log = load_error_log(KVF_ERR_FORMAT);
    expect_log(log, "\"vocab_size\" must be a non-negative integer");
    free(log);
    snprintf(text, sizeof(text), "%s\"hidden_size\": 32, \"vocab_size\": 0}", head);
    write_text("config.json", text);
    log = load_error_log(KVF_ERR_FORMAT);
    expect_log(log, "vocab_size is 0; it must be positive");
    free(log);
    snprintf(text, sizeof(text),
             "%s\"hidden_size\": 32, \"vocab_size\": 64, "
             "\"head_dim\": 2048}",
             head);
    write_text("config.json", text);
    log = load_error_log(KVF_ERR_FORMAT);
    expect_log(log, "head_dim 2048 exceeds the maximum of 1024");
    free(log);
}

/* Sets config.json's num_hidden_layers to n. */
static void set_config_layers(int n)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/config.json", g_dir);
    FILE *fp = fopen(path, "r");
    assert_non_null(fp);
    char buf[8192];
    size_t len = fread(buf, 1, sizeof(buf) - 1, fp);
    fclose(fp);
    buf[len] = '\0';
    cJSON *root = cJSON_Parse(buf);
    assert_non_null(root);
    cJSON_ReplaceItemInObject(root, "num_hidden_layers", cJSON_CreateNumber(n));
    char *text = cJSON_Print(root);
    write_text("config.json", text);
    free(text);
    cJSON_Delete(root);
}

/* Tensors the config does not account for: a checkpoint of more layers
 * than config.json says is refused, as is any other tensor the model
 * would not use, each named (the first few, then a count); RoPE tables
 * and a tied LM head are no weights and load. */
static void test_unused_tensors(void **state)
{
    (void)state;
    kvf_model_config_t c = small_config();
    c.n_layers = 4;
    assert_int_equal(kvf_model_write_random(g_dir, &c, KVF_DTYPE_F32, 1), KVF_OK);
    set_config_layers(2);
    char *log = load_error_log(KVF_ERR_FORMAT);
    expect_log(log, "the checkpoint holds tensors of 4 layers, config.json's num_hidden_layers "
                    "says 2: model.layers.2.");
    expect_log(log, "(18 in all)"); /* 9 tensors a layer, 2 layers */
    free(log);
    set_config_layers(4);
    kvf_model_t *m = NULL;
    assert_int_equal(kvf_model_load(g_dir, &m), KVF_OK);
    kvf_model_destroy(m);
    /* a second shard beside it */
    char from[256], to[256];
    snprintf(from, sizeof(from), "%s/model.safetensors", g_dir);
    snprintf(to, sizeof(to), "%s/model-00001-of-00002.safetensors", g_dir);
    assert_int_equal(rename(from, to), 0);
    snprintf(to, sizeof(to), "%s/model-00002-of-00002.safetensors", g_dir);
    static const float zeros[32];
    kvf_st_write_t extra[] = {
        {"model.layers.0.self_attn.rotary_emb.inv_freq", KVF_DTYPE_F32, 1, {4}, zeros},
        {"lm_head.weight", KVF_DTYPE_F32, 1, {4}, zeros},
        {"model.layers.1.self_attn.q_proj.bias", KVF_DTYPE_F32, 1, {32}, zeros},
    };
    /* not tied: lm_head.weight is in the first shard, this one is extra */
    assert_int_equal(kvf_safetensors_write(to, extra, 3), KVF_OK);
    log = load_error_log(KVF_ERR_FORMAT);
    expect_log(log, "2 tensors that config.json does not account for");
    expect_log(log, "lm_head.weight");
    expect_log(log, "model.layers.1.self_attn.q_proj.bias");
    if (strstr(log, "inv_freq"))
        fail_msg("a RoPE table was refused: %s", log);
    free(log);
    assert_int_equal(kvf_safetensors_write(to, extra, 1), KVF_OK);
    assert_int_equal(kvf_model_load(g_dir, &m), KVF_OK);
    kvf_model_destroy(m);
    assert_int_equal(unlink(to), 0);
    snprintf(to, sizeof(to), "%s/model-00001-of-00002.safetensors", g_dir);
    assert_int_equal(rename(to, from), 0);
}

/* The window of each layer of a 3-layer config: extra is spliced into
 * config.json after the architecture. Returns the load status. */
static kvf_status_t window_config(const char *arch, const char *extra, kvf_model_config_t *c)
{
    char text[1024];
    snprintf(text, sizeof(text),
             "{\"architectures\": [\"%s\"], %s \"hidden_size\": 32, \"num_hidden_layers\": 3, "
             "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 48, "
             "\"vocab_size\": 64}",
             arch, extra);
    write_text("config.json", text);
    return kvf_model_config_load(g_dir, c);
}

static void expect_windows(const kvf_model_config_t *c, int w0, int w1, int w2)
{
    assert_int_equal(kvf_model_layer_window(c, 0), w0);
    assert_int_equal(kvf_model_layer_window(c, 1), w1);
    assert_int_equal(kvf_model_layer_window(c, 2), w2);
}

/* Qwen3: q/k norms, no biases unless attention_bias; its q_norm/k_norm
 * tensors load. Which layers get a sliding window, as HF decides it. */
static void test_qwen3_and_windows(void **state)
{
    (void)state;
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/golden/tiny-qwen3-f32", KVF_TEST_DATA);
    kvf_model_t *m;
    assert_int_equal(kvf_model_load(dir, &m), KVF_OK);
    assert_int_equal(m->cfg.arch, KVF_ARCH_QWEN3);
    assert_true(m->cfg.qk_norm);
    assert_false(m->cfg.qkv_bias);
    assert_int_equal(m->cfg.head_dim, 24);
    assert_non_null(m->layers[1].q_norm);
    assert_non_null(m->layers[1].k_norm);
    assert_null(m->layers[0].bqkv);
    assert_int_equal(kvf_model_layer_window(&m->cfg, 0), 0);
    assert_int_equal(kvf_model_layer_window(&m->cfg, 1), 20);
    kvf_model_destroy(m);

    kvf_model_config_t c;
    write_text("generation_config.json", "{\"eos_token_id\": 2}");
    assert_int_equal(window_config("Qwen3ForCausalLM", "\"attention_bias\": true,", &c), KVF_OK);
    assert_true(c.qk_norm && c.qkv_bias);
    /* Mistral: every layer whenever sliding_window is set */
    assert_int_equal(window_config("MistralForCausalLM", "\"sliding_window\": 8,", &c), KVF_OK);
    expect_windows(&c, 8, 8, 8);
    assert_int_equal(window_config("MistralForCausalLM", "\"sliding_window\": null,", &c), KVF_OK);
    expect_windows(&c, 0, 0, 0);
    /* Qwen2/Qwen3: only with use_sliding_window, from max_window_layers on (default 28) */
    assert_int_equal(window_config("Qwen2ForCausalLM", "\"sliding_window\": 8,", &c), KVF_OK);
    expect_windows(&c, 0, 0, 0);
    assert_int_equal(window_config("Qwen2ForCausalLM",
                                   "\"sliding_window\": 8, \"use_sliding_window\": true,", &c),
                     KVF_OK);
    expect_windows(&c, 0, 0, 0);
    assert_int_equal(window_config("Qwen3ForCausalLM",
                                   "\"sliding_window\": 8, \"use_sliding_window\": true, "
                                   "\"max_window_layers\": 1,",
                                   &c),
                     KVF_OK);
    expect_windows(&c, 0, 8, 8);
    assert_int_equal(window_config("Qwen3ForCausalLM",
                                   "\"sliding_window\": 8, \"use_sliding_window\": true, "
                                   "\"layer_types\": [\"full_attention\", \"full_attention\", "
                                   "\"sliding_attention\"],",
                                   &c),
                     KVF_OK);
    expect_windows(&c, 0, 0, 8);
    /* Llama has no window */
    assert_int_equal(window_config("LlamaForCausalLM", "\"sliding_window\": 8,", &c), KVF_OK);
    expect_windows(&c, 0, 0, 0);
    /* a pattern the config cannot hold, a bad window */
    assert_int_equal(
        window_config("MistralForCausalLM",
                      "\"sliding_window\": 8, \"layer_types\": [\"sliding_attention\", "
                      "\"full_attention\", \"sliding_attention\"],",
                      &c),
        KVF_ERR_UNSUPPORTED);
    assert_int_equal(window_config("MistralForCausalLM", "\"sliding_window\": -3,", &c),
                     KVF_ERR_FORMAT);
}

/* Gemma2: the golden model's config, its four norms per layer loaded with
 * 1 + w folded in, the tied head; defaults and refusals of the config. */
static void test_gemma2(void **state)
{
    (void)state;
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/golden/tiny-gemma2-f32", KVF_TEST_DATA);
    kvf_model_t *m;
    assert_int_equal(kvf_model_load(dir, &m), KVF_OK);
    const kvf_model_config_t *c = &m->cfg;
    assert_int_equal(c->arch, KVF_ARCH_GEMMA2);
    assert_int_equal(c->act, KVF_ACT_GELU_TANH);
    assert_true(c->embed_scale && c->norm_plus_one && c->sandwich_norms && c->tie_embeddings);
    assert_true(c->attn_scalar == 24.0 && c->attn_softcap == 5.0 && c->final_softcap == 10.0);
    assert_true(kvf_model_attn_scale(c) == (float)(1.0 / sqrt(24.0)));
    expect_windows(c, 16, 0, 16);
    assert_true(m->lm_head == m->embed);
    kvf_safetensors_t *st;
    char path[600];
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    assert_int_equal(kvf_safetensors_open(path, &st), KVF_OK);
    const char *names[4] = {"input_layernorm", "post_attention_layernorm",
                            "pre_feedforward_layernorm", "post_feedforward_layernorm"};
    for (int i = 0; i < 4; i++) {
        char name[128];
        snprintf(name, sizeof(name), "model.layers.2.%s.weight", names[i]);
        const kvf_st_tensor_t *t = kvf_safetensors_find(st, name);
        assert_non_null(t);
        const float *file = t->data;
        const kvf_layer_weights_t *L = &m->layers[2];
        const float *loaded[4] = {L->attn_norm, L->post_attn_norm, L->ffn_norm, L->post_ffn_norm};
        for (int d = 0; d < c->hidden; d++)
            assert_true(loaded[i][d] == 1.0f + file[d]);
    }
    kvf_safetensors_close(st);
    kvf_model_destroy(m);

    kvf_model_config_t g;
    write_text("generation_config.json", "{\"eos_token_id\": 2}");
    /* HF's defaults: scalar 256, caps 50 and 30, window 4096 on even layers, tied */
    assert_int_equal(window_config("Gemma2ForCausalLM", "", &g), KVF_OK);
    assert_true(g.attn_scalar == 256.0 && g.attn_softcap == 50.0 && g.final_softcap == 30.0);
    assert_true(g.tie_embeddings);
    expect_windows(&g, 4096, 0, 4096);
    assert_int_equal(window_config("Gemma2ForCausalLM",
                                   "\"sliding_window\": null, \"attn_logit_softcapping\": 7.5, "
                                   "\"final_logit_softcapping\": null, "
                                   "\"tie_word_embeddings\": false,",
                                   &g),
                     KVF_OK);
    expect_windows(&g, 0, 0, 0);
    assert_true(g.attn_softcap == 7.5 && g.final_softcap == 0 && !g.tie_embeddings);
    assert_int_equal(window_config("Gemma2ForCausalLM",
                                   "\"sliding_window\": 8, \"layer_types\": [\"full_attention\", "
                                   "\"sliding_attention\", \"full_attention\"],",
                                   &g),
                     KVF_OK);
    expect_windows(&g, 0, 8, 0);
    assert_int_equal(window_config("Gemma2ForCausalLM", "\"hidden_activation\": \"gelu\",", &g),
                     KVF_ERR_UNSUPPORTED);
    assert_int_equal(window_config("Gemma2ForCausalLM", "\"query_pre_attn_scalar\": 0,", &g),
                     KVF_ERR_FORMAT);
    assert_int_equal(
        window_config("Gemma2ForCausalLM",
                      "\"sliding_window\": 8, \"layer_types\": [\"sliding_attention\", "
                      "\"sliding_attention\", \"full_attention\"],",
                      &g),
        KVF_ERR_UNSUPPORTED);
}

/* generation_config.json eos lists merge with config.json's. */
static void test_eos_lists(void **state)
{
    (void)state;
    kvf_model_config_t c = small_config();
    assert_int_equal(kvf_model_write_random(g_dir, &c, KVF_DTYPE_F32, 1), KVF_OK);
    write_text("generation_config.json", "{\"eos_token_id\": [7, 2, 9], \"bos_token_id\": 4}");
    kvf_model_config_t got;
    assert_int_equal(kvf_model_config_load(g_dir, &got), KVF_OK);
    assert_int_equal(got.bos_id, 4);
    assert_true(kvf_model_is_eos(&got, 2));
    assert_true(kvf_model_is_eos(&got, 7));
    assert_true(kvf_model_is_eos(&got, 9));
    assert_false(kvf_model_is_eos(&got, 3));
    write_text("generation_config.json", "{\"eos_token_id\": \"x\"}");
    assert_int_equal(kvf_model_config_load(g_dir, &got), KVF_ERR_FORMAT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_configs), cmocka_unit_test(test_dtypes_and_shards),
        cmocka_unit_test(test_malformed),      cmocka_unit_test(test_config_limits),
        cmocka_unit_test(test_unused_tensors), cmocka_unit_test(test_eos_lists),
        cmocka_unit_test(test_gemma2),         cmocka_unit_test(test_qwen3_and_windows),
    };
    return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
