/* kvf mkmodel and kvf kvcalc, run as the binaries users run. The output
 * files are checked with an independent reading of the formats: config.json
 * fields, the safetensors header (offsets contiguous, sizes = shapes x
 * dtype, file size exact), tensor shapes for GQA / tied / Qwen2 biases, and
 * the tokenizer fitted to --vocab, or copied from a published one with
 * --tokenizer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "chat.h"
#include "kvf/tokenizer.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define KVF KVF_BIN_DIR "/kvf"

/* Runs cmd; returns its exit code and its stdout in *out_p (malloc'd). */
static int run(const char *cmd, char **out_p)
{
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 4096, len = 0;
    char *out = malloc(cap);
    size_t got;
    while ((got = fread(out + len, 1, cap - len - 1, p)) > 0) {
        len += got;
        if (cap - len < 2) {
            cap *= 2;
            out = realloc(out, cap);
        }
    }
    out[len] = '\0';
    int status = pclose(p);
    if (out_p)
        *out_p = out;
    else
        free(out);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char path[512];
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        int n = snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        assert_true(n > 0 && (size_t)n < sizeof(path));
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

static char *slurp(const char *path, size_t *len_p)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    assert_int_equal(fread(buf, 1, (size_t)len, f), (size_t)len);
    buf[len] = '\0';
    fclose(f);
    if (len_p)
        *len_p = (size_t)len;
    return buf;
}

static cJSON *load_json(const char *dir, const char *name)
{
    char path[512];
    int n = snprintf(path, sizeof(path), "%s/%s", dir, name);
    assert_true(n > 0 && (size_t)n < sizeof(path));
    char *text = slurp(path, NULL);
    cJSON *root = cJSON_Parse(text);
    free(text);
    assert_non_null(root);
    return root;
}

static int json_int(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItem(obj, key);
    assert_true(cJSON_IsNumber(v));
    return v->valueint;
}

typedef struct {
    uint64_t begin, end;
} span_t;

static int cmp_span(const void *a, const void *b)
{
    const span_t *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Reads and checks the safetensors header; returns it (caller deletes). */
static cJSON *check_safetensors(const char *dir, const char *dtype, size_t elem)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    size_t size;
    char *file = slurp(path, &size);
    assert_true(size >= 8);
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; i--)
        header_len = header_len << 8 | (uint8_t)file[i];
    assert_true(8 + header_len <= size);
    cJSON *header = cJSON_ParseWithLength(file + 8, header_len);
    assert_non_null(header);
    const cJSON *meta = cJSON_GetObjectItem(header, "__metadata__");
    assert_true(!meta || cJSON_IsObject(meta));
    size_t n = 0;
    span_t spans[1024];
    for (const cJSON *t = header->child; t; t = t->next) {
        if (!strcmp(t->string, "__metadata__"))
            continue;
        assert_string_equal(cJSON_GetObjectItem(t, "dtype")->valuestring, dtype);
        uint64_t count = 1;
        for (const cJSON *d = cJSON_GetObjectItem(t, "shape")->child; d; d = d->next)
            count *= (uint64_t)d->valuedouble;
        const cJSON *off = cJSON_GetObjectItem(t, "data_offsets");
        assert_int_equal(cJSON_GetArraySize(off), 2);
        assert_true(n < 1024);
        spans[n].begin = (uint64_t)off->child->valuedouble;
        spans[n].end = (uint64_t)off->child->next->valuedouble;
        assert_int_equal(spans[n].end - spans[n].begin, count * elem);
        n++;
    }
    qsort(spans, n, sizeof(spans[0]), cmp_span);
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(spans[i].begin, at);
        at = spans[i].end;
    }
    assert_int_equal(8 + header_len + at, size);
    free(file);
    return header;
}

static void assert_shape(const cJSON *header, const char *name, int64_t rows, int64_t cols)
{
    const cJSON *t = cJSON_GetObjectItem(header, name);
    if (!t)
        fail_msg("tensor %s missing", name);
    const cJSON *shape = cJSON_GetObjectItem(t, "shape");
    assert_int_equal(cJSON_GetArraySize(shape), cols ? 2 : 1);
    assert_int_equal((int64_t)shape->child->valuedouble, rows);
    if (cols)
        assert_int_equal((int64_t)shape->child->next->valuedouble, cols);
}

/* Every id below vocab decodes to text; BOS/EOS where documented; text
 * round-trips. */
static void check_tokenizer(const char *dir, int vocab, int bos, int eos)
{
    kvf_tokenizer_t *tok;
    assert_int_equal(kvf_tokenizer_load(dir, &tok), KVF_OK);
    assert_int_equal(kvf_tokenizer_vocab_size(tok), vocab);
    assert_int_equal(kvf_tokenizer_bos_id(tok), bos);
    assert_int_equal(kvf_tokenizer_eos_id(tok), eos);
    assert_true(kvf_tokenizer_adds_bos(tok));
    for (uint32_t id = 0; id < (uint32_t)vocab; id++) {
        assert_true(kvf_tokenizer_has_id(tok, id));
        char *text;
        size_t len;
        assert_int_equal(kvf_tokenizer_decode(tok, &id, 1, &text, &len), KVF_OK);
        assert_true(len > 0);
        free(text);
    }
    const char *sample = "Hello world, the cache line is 64 bytes. Café 中文 🙂";
    uint32_t *ids;
    size_t n;
    assert_int_equal(kvf_tokenizer_encode(tok, sample, strlen(sample), true, &ids, &n), KVF_OK);
    assert_int_equal(ids[0], bos);
    for (size_t i = 0; i < n; i++)
        assert_true(ids[i] < (uint32_t)vocab);
    char *back;
    assert_int_equal(kvf_tokenizer_decode(tok, ids + 1, n - 1, &back, NULL), KVF_OK);
    assert_string_equal(back, sample);
    free(back);
    free(ids);
    kvf_tokenizer_destroy(tok);

    cJSON *gen = load_json(dir, "generation_config.json");
    const cJSON *e = cJSON_GetObjectItem(gen, "eos_token_id");
    assert_int_equal(cJSON_IsArray(e) ? e->child->valueint : e->valueint, eos);
    assert_int_equal(json_int(gen, "bos_token_id"), bos);
    cJSON_Delete(gen);
}

static char *make_dir(void)
{
    char *dir = strdup("/tmp/kvf-mkmodel-XXXXXX");
    assert_non_null(mkdtemp(dir));
    return dir;
}

static void test_llama_gqa_untied(void **state)
{
    (void)state;
    char *dir = make_dir();
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             KVF " mkmodel %s/m --layers 2 --hidden 64 --heads 4 --kv-heads 2 --inter 96 "
                 "--vocab 700 --seed 3",
             dir);
    assert_int_equal(run(cmd, NULL), 0);
    char m[512];
    snprintf(m, sizeof(m), "%s/m", dir);
    cJSON *config = load_json(m, "config.json");
    assert_string_equal(cJSON_GetObjectItem(config, "architectures")->child->valuestring,
                        "LlamaForCausalLM");
    assert_int_equal(json_int(config, "num_hidden_layers"), 2);
    assert_int_equal(json_int(config, "hidden_size"), 64);
    assert_int_equal(json_int(config, "num_attention_heads"), 4);
    assert_int_equal(json_int(config, "num_key_value_heads"), 2);
    assert_int_equal(json_int(config, "intermediate_size"), 96);
    assert_int_equal(json_int(config, "vocab_size"), 700);
    assert_int_equal(json_int(config, "bos_token_id"), 510);
    assert_false(cJSON_IsTrue(cJSON_GetObjectItem(config, "tie_word_embeddings")));
    cJSON_Delete(config);
    cJSON *h = check_safetensors(m, "F32", 4);
    assert_shape(h, "model.embed_tokens.weight", 700, 64);
    assert_shape(h, "lm_head.weight", 700, 64);
    assert_shape(h, "model.norm.weight", 64, 0);
    /* GQA: 4 heads of 16, 2 kv heads */
    static const struct {
        const char *name;
        int64_t rows, cols;
    } layer_shapes[] = {
        {"self_attn.q_proj.weight", 64, 64},        {"self_attn.k_proj.weight", 32, 64},
        {"self_attn.v_proj.weight", 32, 64},        {"self_attn.o_proj.weight", 64, 64},
        {"mlp.gate_proj.weight", 96, 64},           {"mlp.up_proj.weight", 96, 64},
        {"mlp.down_proj.weight", 64, 96},           {"input_layernorm.weight", 64, 0},
        {"post_attention_layernorm.weight", 64, 0},
    };
    for (int l = 0; l < 2; l++) {
        char name[128];
        for (size_t i = 0; i < sizeof(layer_shapes) / sizeof(layer_shapes[0]); i++) {
            snprintf(name, sizeof(name), "model.layers.%d.%s", l, layer_shapes[i].name);
            assert_shape(h, name, layer_shapes[i].rows, layer_shapes[i].cols);
        }
        snprintf(name, sizeof(name), "model.layers.%d.self_attn.q_proj.bias", l);
        assert_null(cJSON_GetObjectItem(h, name));
    }
    cJSON_Delete(h);
    check_tokenizer(m, 700, 510, 511);

    /* same seed, same bytes; another seed, other weights */
    char other[512], path_a[600], path_b[600];
    snprintf(cmd, sizeof(cmd),
             KVF " mkmodel %s/same --layers 2 --hidden 64 --heads 4 --kv-heads 2 --inter 96 "
                 "--vocab 700 --seed 3 && " KVF " mkmodel %s/other --layers 2 --hidden 64 "
                 "--heads 4 --kv-heads 2 --inter 96 --vocab 700 --seed 4",
             dir, dir);
    assert_int_equal(run(cmd, NULL), 0);
    snprintf(path_a, sizeof(path_a), "%s/model.safetensors", m);
    snprintf(path_b, sizeof(path_b), "%s/same/model.safetensors", dir);
    size_t la, lb;
    char *a = slurp(path_a, &la), *b = slurp(path_b, &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);
    free(b);
    snprintf(path_b, sizeof(path_b), "%s/other/model.safetensors", dir);
    b = slurp(path_b, &lb);
    assert_int_equal(la, lb);
    assert_true(memcmp(a, b, la) != 0);
    free(a);
    free(b);
    snprintf(other, sizeof(other), "%s/same", dir);
    remove_dir(other);
    snprintf(other, sizeof(other), "%s/other", dir);
    remove_dir(other);
    remove_dir(m);
    remove_dir(dir);
    free(dir);
}

/* The golden Qwen2 model's generator arguments are accepted as they are. */
static void test_qwen2_tied_bf16(void **state)
{
    (void)state;
    char *dir = make_dir();
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             KVF " mkmodel %s --qwen2 --layers 3 --hidden 96 --heads 6 --kv-heads 2 --inter 256 "
                 "--vocab 512 --dtype bf16 --tie --rope-theta 1000000 --seed 2",
             dir);
    assert_int_equal(run(cmd, NULL), 0);
    cJSON *config = load_json(dir, "config.json");
    assert_string_equal(cJSON_GetObjectItem(config, "architectures")->child->valuestring,
                        "Qwen2ForCausalLM");
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(config, "tie_word_embeddings")));
    assert_true(cJSON_GetObjectItem(config, "rope_theta")->valuedouble == 1e6);
    assert_int_equal(json_int(config, "head_dim"), 16);
    cJSON_Delete(config);
    cJSON *h = check_safetensors(dir, "BF16", 2);
    assert_null(cJSON_GetObjectItem(h, "lm_head.weight"));
    assert_shape(h, "model.embed_tokens.weight", 512, 96);
    for (int l = 0; l < 3; l++) {
        char name[128];
        snprintf(name, sizeof(name), "model.layers.%d.self_attn.q_proj.bias", l);
        assert_shape(h, name, 96, 0);
        snprintf(name, sizeof(name), "model.layers.%d.self_attn.k_proj.bias", l);
        assert_shape(h, name, 32, 0);
        snprintf(name, sizeof(name), "model.layers.%d.self_attn.v_proj.bias", l);
        assert_shape(h, name, 32, 0);
        snprintf(name, sizeof(name), "model.layers.%d.self_attn.o_proj.bias", l);
        assert_null(cJSON_GetObjectItem(h, name));
    }
    cJSON_Delete(h);
    /* at vocab 512 the tokenizer is the golden one */
    cJSON *mine = load_json(dir, "tokenizer.json");
    cJSON *golden = load_json(KVF_TEST_DATA "/golden/tiny-qwen2-bf16", "tokenizer.json");
    assert_true(cJSON_Compare(mine, golden, true));
    cJSON_Delete(mine);
    cJSON_Delete(golden);
    check_tokenizer(dir, 512, 510, 511);
    remove_dir(dir);
    free(dir);
}

/* The Qwen3, sliding-window and Gemma2 golden models are `kvf mkmodel`
 * with the arguments expected.json records: the same config and weights,
 * byte for byte (q_norm/k_norm, head_dim 24, the window settings, Gemma2's
 * four norms, soft-caps and layer_types included). */
static void test_qwen3_and_window_goldens(void **state)
{
    (void)state;
    const char *names[] = {"tiny-qwen3-f32", "tiny-mistral-sw-f32", "tiny-gemma2-f32"};
    cJSON *exp = load_json(KVF_TEST_DATA "/golden", "expected.json");
    for (int i = 0; i < 3; i++) {
        const cJSON *mj = cJSON_GetObjectItem(cJSON_GetObjectItem(exp, "models"), names[i]);
        const char *args = cJSON_GetObjectItem(mj, "mkmodel_args")->valuestring;
        char *dir = make_dir();
        char cmd[1024], golden[512];
        snprintf(cmd, sizeof(cmd), KVF " mkmodel %s %s", dir, args);
        assert_int_equal(run(cmd, NULL), 0);
        snprintf(golden, sizeof(golden), "%s/golden/%s", KVF_TEST_DATA, names[i]);
        snprintf(cmd, sizeof(cmd), "cmp -s %s/model.safetensors %s/model.safetensors", dir, golden);
        assert_int_equal(run(cmd, NULL), 0);
        cJSON *mine = load_json(dir, "config.json"), *theirs = load_json(golden, "config.json");
        assert_true(cJSON_Compare(mine, theirs, true));
        cJSON_Delete(mine);
        cJSON_Delete(theirs);
        if (i == 0) {
            cJSON *h = check_safetensors(dir, "F32", 4);
            assert_shape(h, "model.layers.1.self_attn.q_norm.weight", 24, 0);
            assert_shape(h, "model.layers.1.self_attn.k_norm.weight", 24, 0);
            assert_shape(h, "model.layers.0.self_attn.q_proj.weight", 96, 64);
            assert_null(cJSON_GetObjectItem(h, "model.layers.0.self_attn.q_proj.bias"));
            cJSON_Delete(h);
        }
        if (i == 2) {
            cJSON *h = check_safetensors(dir, "F32", 4);
            assert_shape(h, "model.layers.2.pre_feedforward_layernorm.weight", 64, 0);
            assert_shape(h, "model.layers.2.post_feedforward_layernorm.weight", 64, 0);
            assert_shape(h, "model.layers.0.post_attention_layernorm.weight", 64, 0);
            assert_null(cJSON_GetObjectItem(h, "lm_head.weight")); /* tied */
            cJSON_Delete(h);
            cJSON *cfg = load_json(dir, "config.json");
            const cJSON *types = cJSON_GetObjectItem(cfg, "layer_types");
            assert_string_equal(cJSON_GetArrayItem(types, 0)->valuestring, "sliding_attention");
            assert_string_equal(cJSON_GetArrayItem(types, 1)->valuestring, "full_attention");
            assert_true(cJSON_GetObjectItem(cfg, "attn_logit_softcapping")->valuedouble == 5.0);
            cJSON_Delete(cfg);
            snprintf(cmd, sizeof(cmd), KVF " mkmodel %s --arch gemma2 --query-scalar 0 2>/dev/null",
                     dir);
            assert_int_equal(run(cmd, NULL), 2);
        }
        /* a window on an architecture without one is refused */
        snprintf(cmd, sizeof(cmd), KVF " mkmodel %s --sliding-window 16 2>/dev/null", dir);
        assert_int_equal(run(cmd, NULL), 2);
        snprintf(cmd, sizeof(cmd),
                 KVF " mkmodel %s --arch mistral --sliding-window 16 --window-layers 1 2>/dev/null",
                 dir);
        assert_int_equal(run(cmd, NULL), 2);
        remove_dir(dir);
        free(dir);
    }
    cJSON_Delete(exp);
}

static void test_small_vocab_and_errors(void **state)
{
    (void)state;
    char *dir = make_dir();
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             KVF " mkmodel %s --layers 1 --hidden 32 --heads 2 --kv-heads 1 "
                 "--inter 64 --vocab 300 --tie",
             dir);
    assert_int_equal(run(cmd, NULL), 0);
    check_tokenizer(dir, 300, 298, 299);
    cJSON *h = check_safetensors(dir, "F32", 4);
    assert_shape(h, "model.embed_tokens.weight", 300, 32);
    assert_shape(h, "model.layers.0.self_attn.k_proj.weight", 16, 32); /* MQA */
    cJSON_Delete(h);
    snprintf(cmd, sizeof(cmd), KVF " mkmodel %s --vocab 258", dir);
    assert_int_equal(run(cmd, NULL), 0);
    check_tokenizer(dir, 258, 256, 257);
    snprintf(cmd, sizeof(cmd), KVF " mkmodel %s --vocab 257 2>/dev/null", dir);
    assert_int_equal(run(cmd, NULL), 2);
    snprintf(cmd, sizeof(cmd), KVF " mkmodel %s --heads 3 --kv-heads 2 --hidden 96 2>/dev/null",
             dir);
    assert_int_not_equal(run(cmd, NULL), 0);
    snprintf(cmd, sizeof(cmd), KVF " mkmodel %s --arch gpt2 2>/dev/null", dir);
    assert_int_equal(run(cmd, NULL), 2);
    remove_dir(dir);
    free(dir);
}

/* Decompresses the committed tokenizer of family into dir/family/ (the
 * tokenizer_config.json beside it copied); returns that directory. */
static void unpack_tokenizer(const char *dir, const char *family, char *out, size_t out_size)
{
    int n = snprintf(out, out_size, "%s/tok-%s", dir, family);
    assert_true(n > 0 && (size_t)n < out_size);
    char cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "mkdir -p %s && xz -dc " KVF_TEST_DATA "/tokenizers/%s/tokenizer.json.xz "
             "> %s/tokenizer.json && cp " KVF_TEST_DATA "/tokenizers/%s/tokenizer_config.json %s/",
             out, family, out, family, out);
    assert_int_equal(run(cmd, NULL), 0);
}

/* dir_a/name and dir_b/name hold the same bytes. */
static void assert_same_file(const char *dir_a, const char *dir_b, const char *name)
{
    char path[600];
    size_t la, lb;
    snprintf(path, sizeof(path), "%s/%s", dir_a, name);
    char *a = slurp(path, &la);
    snprintf(path, sizeof(path), "%s/%s", dir_b, name);
    char *b = slurp(path, &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);
    free(a);
    free(b);
}

/* --tokenizer: Qwen3's published tokenizer (no BOS, EOS <|im_end|>, 151669
 * ids with the added tokens, its chat template), copied byte for byte. */
static void test_published_tokenizer_qwen3(void **state)
{
    (void)state;
    char *dir = make_dir();
    char tok_dir[512], m[512], cmd[2048];
    unpack_tokenizer(dir, "qwen3", tok_dir, sizeof(tok_dir));
    snprintf(m, sizeof(m), "%s/m", dir);
    snprintf(cmd, sizeof(cmd),
             KVF " mkmodel %s --arch qwen3 --layers 1 --hidden 32 --heads 2 --kv-heads 1 "
                 "--inter 64 --tie --tokenizer %s",
             m, tok_dir);
    assert_int_equal(run(cmd, NULL), 0);
    assert_same_file(tok_dir, m, "tokenizer.json");
    assert_same_file(tok_dir, m, "tokenizer_config.json");
    cJSON *config = load_json(m, "config.json");
    assert_int_equal(json_int(config, "vocab_size"), 151669);
    assert_null(cJSON_GetObjectItem(config, "bos_token_id"));
    assert_int_equal(json_int(config, "eos_token_id"), 151645);
    cJSON_Delete(config);
    cJSON *gen = load_json(m, "generation_config.json");
    assert_null(cJSON_GetObjectItem(gen, "bos_token_id"));
    const cJSON *eos = cJSON_GetObjectItem(gen, "eos_token_id");
    assert_int_equal(cJSON_GetArraySize(eos), 1);
    assert_int_equal(eos->child->valueint, 151645);
    cJSON_Delete(gen);
    cJSON *h = check_safetensors(m, "F32", 4);
    assert_shape(h, "model.embed_tokens.weight", 151669, 32);
    cJSON_Delete(h);
    kvf_tokenizer_t *tok;
    assert_int_equal(kvf_tokenizer_load(m, &tok), KVF_OK);
    assert_int_equal(kvf_tokenizer_vocab_size(tok), 151669);
    assert_int_equal(kvf_tokenizer_bos_id(tok), -1);
    assert_int_equal(kvf_tokenizer_eos_id(tok), 151645);
    kvf_tokenizer_destroy(tok);
    kvf_chat_template_t chat;
    assert_int_equal(kvf_chat_template_load(m, &chat), KVF_OK);
    assert_int_equal(chat, KVF_CHAT_QWEN3);
    remove_dir(m);
    remove_dir(tok_dir);
    remove_dir(dir);
    free(dir);
}

/* --tokenizer with GPT-2's (BOS = EOS = <|endoftext|> 50256, no chat
 * template), --vocab padding it, and the errors: a --vocab below the
 * tokenizer's ids, no tokenizer.json, one that does not load. */
static void test_published_tokenizer_gpt2_and_errors(void **state)
{
    (void)state;
    char *dir = make_dir();
    char tok_dir[512], m[512], cmd[2048];
    unpack_tokenizer(dir, "gpt2", tok_dir, sizeof(tok_dir));
    snprintf(m, sizeof(m), "%s/m", dir);
    const char *geometry = "--layers 1 --hidden 32 --heads 2 --kv-heads 1 --inter 64";
    snprintf(cmd, sizeof(cmd), KVF " mkmodel %s %s --tokenizer %s", m, geometry, tok_dir);
    assert_int_equal(run(cmd, NULL), 0);
    cJSON *config = load_json(m, "config.json");
    assert_int_equal(json_int(config, "vocab_size"), 50257);
    assert_int_equal(json_int(config, "bos_token_id"), 50256);
    assert_int_equal(json_int(config, "eos_token_id"), 50256);
    cJSON_Delete(config);
    cJSON *gen = load_json(m, "generation_config.json");
    assert_int_equal(json_int(gen, "bos_token_id"), 50256);
    cJSON_Delete(gen);
    assert_same_file(tok_dir, m, "tokenizer.json");
    kvf_chat_template_t chat;
    assert_int_equal(kvf_chat_template_load(m, &chat), KVF_OK);
    assert_int_equal(chat, KVF_CHAT_NONE);
    /* a padded embedding, as GPT-2 checkpoints trained with 50304 have */
    snprintf(cmd, sizeof(cmd), KVF " mkmodel %s %s --vocab 50304 --tokenizer %s", m, geometry,
             tok_dir);
    assert_int_equal(run(cmd, NULL), 0);
    cJSON *h = check_safetensors(m, "F32", 4);
    assert_shape(h, "model.embed_tokens.weight", 50304, 32);
    assert_shape(h, "lm_head.weight", 50304, 32);
    cJSON_Delete(h);
    char *out;
    snprintf(cmd, sizeof(cmd), KVF " mkmodel %s %s --vocab 50256 --tokenizer %s 2>&1", m, geometry,
             tok_dir);
    assert_int_equal(run(cmd, &out), 2);
    assert_non_null(strstr(out, "50257"));
    free(out);
    snprintf(cmd, sizeof(cmd), KVF " mkmodel %s --tokenizer %s/none 2>&1", m, dir);
    assert_int_equal(run(cmd, &out), 2);
    assert_non_null(strstr(out, "no tokenizer.json"));
    free(out);
    snprintf(cmd, sizeof(cmd), "echo '{\"model\": {\"type\": \"Unigram\"}}' > %s/tokenizer.json",
             tok_dir);
    assert_int_equal(run(cmd, NULL), 0);
    snprintf(cmd, sizeof(cmd), KVF " mkmodel %s --tokenizer %s 2>&1", m, tok_dir);
    assert_int_equal(run(cmd, &out), 2);
    assert_non_null(strstr(out, "cannot load the tokenizer"));
    free(out);
    remove_dir(m);
    remove_dir(tok_dir);
    remove_dir(dir);
    free(dir);
}

/* Reads "<key> <number> bytes" from kvcalc's output. */
static uint64_t kvcalc_value(const char *out, const char *key)
{
    const char *p = strstr(out, key);
    if (!p)
        fail_msg("no %s in:\n%s", key, out);
    p += strlen(key);
    return strtoull(p, NULL, 10);
}

static void test_kvcalc(void **state)
{
    (void)state;
    char *out;
    assert_int_equal(run(KVF " kvcalc --layers 12 --kv-heads 4 --head-dim 64 --context 2048 "
                             "--batch 8 --kv-dtype f16",
                         &out),
                     0);
    uint64_t per_token = 2ull * 12 * 4 * 64 * 2;
    assert_int_equal(kvcalc_value(out, "kv_bytes_per_token"), per_token);
    assert_int_equal(kvcalc_value(out, "kv_bytes_per_request"), per_token * 2048);
    assert_int_equal(kvcalc_value(out, "kv_bytes_batch"), per_token * 2048 * 8);
    assert_non_null(strstr(out, "(0.187500 GiB)")); /* 12 KiB x 2048 x 8 */
    free(out);
    assert_int_equal(run(KVF " kvcalc --layers 2 --kv-heads 1 --head-dim 8 --context 10 "
                             "--kv-dtype int8",
                         &out),
                     0);
    /* 2 x 2 layers x 1 head x (8 bytes + a 4-byte scale) */
    assert_int_equal(kvcalc_value(out, "kv_bytes_per_token"), 48);
    assert_int_equal(kvcalc_value(out, "kv_bytes_batch"), 480);
    free(out);
    /* --model: geometry from config.json, weights from the safetensors */
    assert_int_equal(run(KVF " kvcalc --model " KVF_TEST_DATA "/golden/tiny-qwen2-bf16 "
                             "--context 100",
                         &out),
                     0);
    assert_int_equal(kvcalc_value(out, "kv_bytes_per_token"), 2ull * 3 * 2 * 16 * 4);
    char path[512];
    snprintf(path, sizeof(path), "%s/golden/tiny-qwen2-bf16/model.safetensors", KVF_TEST_DATA);
    size_t size;
    char *file = slurp(path, &size);
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; i--)
        header_len = header_len << 8 | (uint8_t)file[i];
    free(file);
    assert_int_equal(kvcalc_value(out, "weight_bytes"), size - 8 - header_len);
    free(out);
    /* a sharded checkpoint: the index's total_size */
    char *dir = strdup("/tmp/kvf-kvcalc-XXXXXX");
    assert_non_null(mkdtemp(dir));
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "cp " KVF_TEST_DATA "/golden/tiny-llama-f32/config.json %s/ && "
             "echo '{\"metadata\": {\"total_size\": 123456789}, \"weight_map\": {}}' "
             "> %s/model.safetensors.index.json && " KVF " kvcalc --model %s --context 4",
             dir, dir, dir);
    assert_int_equal(run(cmd, &out), 0);
    assert_int_equal(kvcalc_value(out, "weight_bytes"), 123456789);
    assert_int_equal(kvcalc_value(out, "kv_bytes_per_token"), 2ull * 2 * 2 * 16 * 4);
    free(out);
    remove_dir(dir);
    free(dir);
    assert_int_equal(run(KVF " kvcalc --layers 2 --context 10 2>/dev/null", NULL), 2);
    assert_int_equal(run(KVF " kvcalc --layers 2 --kv-heads 1 --head-dim 8 --context 10 "
                             "--kv-dtype f64 2>/dev/null",
                         NULL),
                     2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_gqa_untied),
        cmocka_unit_test(test_qwen2_tied_bf16),
        cmocka_unit_test(test_qwen3_and_window_goldens),
        cmocka_unit_test(test_small_vocab_and_errors),
        cmocka_unit_test(test_published_tokenizer_qwen3),
        cmocka_unit_test(test_published_tokenizer_gpt2_and_errors),
        cmocka_unit_test(test_kvcalc),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
