/* config.json and generation_config.json (kvf_model_config_load): the
 * architecture, geometry, RoPE scaling and special ids. See kvf/model.h. */
#include "model_internal.h"

#include "kvf/file.h"
#include "kvf/log.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVF_JSON_MAX_BYTES (64u << 20)

kvf_status_t kvf_model__read_json(const char *path, cJSON **root_p)
{
    char *text;
    size_t len;
    kvf_status_t st = kvf_file_read(path, KVF_JSON_MAX_BYTES, &text, &len);
    if (st != KVF_OK)
        return st;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root) {
        kvf_log_error("%s: not valid JSON", path);
        return KVF_ERR_FORMAT;
    }
    *root_p = root;
    return KVF_OK;
}

/* The largest integer a config field may hold. */
#define CONFIG_INT_MAX 1000000000

/* Integer field: -1 absent (keeps *v), 0 read, -2 present but not a
 * non-negative integer, -3 an integer above CONFIG_INT_MAX. */
static int json_int(const cJSON *obj, const char *key, int *v)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!it || cJSON_IsNull(it))
        return -1;
    double d = cJSON_IsNumber(it) ? it->valuedouble : -1;
    if (!(d >= 0) || d != floor(d))
        return -2;
    if (d > CONFIG_INT_MAX)
        return -3;
    *v = (int)d;
    return 0;
}

/* Logs why json_int() refused obj's key (r < -1), with the limit. */
static void log_int_error(const char *path, const cJSON *obj, const char *key, int r,
                          const char *what)
{
    if (r == -3)
        kvf_log_error("%s: \"%s\" %.0f exceeds the maximum of %d", path, key,
                      cJSON_GetObjectItemCaseSensitive(obj, key)->valuedouble, CONFIG_INT_MAX);
    else
        kvf_log_error("%s: \"%s\" must be %s", path, key, what);
}

static int json_double(const cJSON *obj, const char *key, double *v)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!it || cJSON_IsNull(it))
        return -1;
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble))
        return -2;
    *v = it->valuedouble;
    return 0;
}

static void add_eos(kvf_model_config_t *cfg, int64_t id)
{
    if (id < 0 || kvf_model_is_eos(cfg, id) || cfg->n_eos >= KVF_MODEL_MAX_EOS)
        return;
    cfg->eos_ids[cfg->n_eos++] = id;
}

/* eos_token_id: an int or a list of ints. */
static kvf_status_t parse_eos(kvf_model_config_t *cfg, const cJSON *obj, const char *path)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, "eos_token_id");
    if (!it || cJSON_IsNull(it))
        return KVF_OK;
    if (cJSON_IsNumber(it)) {
        add_eos(cfg, (int64_t)it->valuedouble);
        return KVF_OK;
    }
    if (cJSON_IsArray(it)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, it)
        {
            if (!cJSON_IsNumber(e))
                goto fail_type;
            add_eos(cfg, (int64_t)e->valuedouble);
        }
        return KVF_OK;
    }
fail_type:
    kvf_log_error("%s: eos_token_id must be an integer or a list of integers", path);
    return KVF_ERR_FORMAT;
}

bool kvf_model_is_eos(const kvf_model_config_t *cfg, int64_t id)
{
    for (int i = 0; i < cfg->n_eos; i++)
        if (cfg->eos_ids[i] == id)
            return true;
    return false;
}

/* The range of each size the model supports. */
static bool check_ranges(const kvf_model_config_t *c, const char *source)
{
    const struct {
        const char *name;
        int value, max;
    } sizes[] = {
        {"num_hidden_layers", c->n_layers, 4096},
        {"hidden_size", c->hidden, 1 << 20},
        {"head_dim", c->head_dim, 1024},
        {"intermediate_size", c->inter, 1 << 22},
        {"vocab_size", c->vocab, 1 << 24},
        {"max_position_embeddings", c->max_pos, INT32_MAX},
        {"num_attention_heads", c->n_heads, 1 << 16},
        {"num_key_value_heads", c->n_kv_heads, 1 << 16},
    };
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        if (sizes[i].value <= 0) {
            kvf_log_error("%s: %s is %d; it must be positive", source, sizes[i].name,
                          sizes[i].value);
            return false;
        }
        if (sizes[i].value > sizes[i].max) {
            kvf_log_error("%s: %s %d exceeds the maximum of %d", source, sizes[i].name,
                          sizes[i].value, sizes[i].max);
            return false;
        }
    }
    return true;
}

kvf_status_t kvf_model_config_validate(const kvf_model_config_t *c, const char *source)
{
    if (!check_ranges(c, source))
        return KVF_ERR_FORMAT;
    const char *why = NULL;
    if (c->n_heads % c->n_kv_heads != 0)
        why = "num_attention_heads must be a positive multiple of num_key_value_heads";
    else if (c->head_dim % 2 != 0)
        why = "head_dim must be even";
    else if (!(c->rope_theta > 0))
        why = "rope_theta must be positive";
    else if (!(c->rms_eps > 0))
        why = "rms_norm_eps must be positive";
    else if (c->rope_scaling != KVF_ROPE_SCALING_NONE && !(c->rope_factor > 0))
        why = "rope_scaling factor must be positive";
    if (why) {
        kvf_log_error("%s: %s", source, why);
        return KVF_ERR_FORMAT;
    }
    return KVF_OK;
}

static kvf_status_t parse_rope_scaling(kvf_model_config_t *cfg, const cJSON *root, const char *path)
{
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (!rs || cJSON_IsNull(rs))
        return KVF_OK;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!cJSON_IsString(type))
        type = cJSON_GetObjectItemCaseSensitive(rs, "type");
    if (!cJSON_IsObject(rs) || !cJSON_IsString(type)) {
        kvf_log_error("%s: rope_scaling must be null or an object with rope_type", path);
        return KVF_ERR_FORMAT;
    }
    cfg->rope_factor = 1.0;
    json_double(rs, "factor", &cfg->rope_factor);
    if (!strcmp(type->valuestring, "default")) {
        cfg->rope_scaling = KVF_ROPE_SCALING_NONE;
    } else if (!strcmp(type->valuestring, "linear")) {
        cfg->rope_scaling = KVF_ROPE_SCALING_LINEAR;
    } else if (!strcmp(type->valuestring, "llama3")) {
        cfg->rope_scaling = KVF_ROPE_SCALING_LLAMA3;
        cfg->rope_low_freq_factor = 1.0;
        cfg->rope_high_freq_factor = 4.0;
        cfg->rope_orig_max_pos = 8192;
        json_double(rs, "low_freq_factor", &cfg->rope_low_freq_factor);
        json_double(rs, "high_freq_factor", &cfg->rope_high_freq_factor);
        json_int(rs, "original_max_position_embeddings", &cfg->rope_orig_max_pos);
        if (!(cfg->rope_high_freq_factor > cfg->rope_low_freq_factor) ||
            cfg->rope_orig_max_pos <= 0) {
            kvf_log_error("%s: rope_scaling llama3: bad frequency factors", path);
            return KVF_ERR_FORMAT;
        }
    } else {
        kvf_log_error("%s: rope_scaling type '%s' is not supported (default, linear, llama3)", path,
                      type->valuestring);
        return KVF_ERR_UNSUPPORTED;
    }
    return KVF_OK;
}

/* architectures[0]: the decoder family. */
static kvf_status_t parse_arch(kvf_model_config_t *cfg, const cJSON *root, const char *path)
{
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *arch = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    if (!cJSON_IsString(arch)) {
        kvf_log_error("%s: no \"architectures\" list", path);
        return KVF_ERR_FORMAT;
    }
    snprintf(cfg->arch_name, sizeof(cfg->arch_name), "%s", arch->valuestring);
    if (!strcmp(arch->valuestring, "LlamaForCausalLM")) {
        cfg->arch = KVF_ARCH_LLAMA;
    } else if (!strcmp(arch->valuestring, "MistralForCausalLM")) {
        cfg->arch = KVF_ARCH_MISTRAL;
    } else if (!strcmp(arch->valuestring, "Qwen2ForCausalLM")) {
        cfg->arch = KVF_ARCH_QWEN2;
        cfg->qkv_bias = true;
    } else if (!strcmp(arch->valuestring, "Qwen3ForCausalLM")) {
        cfg->arch = KVF_ARCH_QWEN3; /* no biases unless attention_bias says so */
        cfg->qk_norm = true;
    } else if (!strcmp(arch->valuestring, "Gemma2ForCausalLM")) {
        cfg->arch = KVF_ARCH_GEMMA2;
        cfg->embed_scale = cfg->norm_plus_one = cfg->sandwich_norms = true;
    } else {
        kvf_log_error("%s: architecture '%s' is not supported (LlamaForCausalLM, "
                      "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                      "Gemma2ForCausalLM)",
                      path, arch->valuestring);
        return KVF_ERR_UNSUPPORTED;
    }
    return KVF_OK;
}

/* Sizes and the RoPE base and norm epsilon, with the defaults of absent
 * optional fields. */
static kvf_status_t parse_geometry(kvf_model_config_t *cfg, const cJSON *root, const char *path)
{
    static const struct {
        const char *key;
        size_t off;
        bool required;
    } ints[] = {
        {"num_hidden_layers", offsetof(kvf_model_config_t, n_layers), true},
        {"hidden_size", offsetof(kvf_model_config_t, hidden), true},
        {"num_attention_heads", offsetof(kvf_model_config_t, n_heads), true},
        {"num_key_value_heads", offsetof(kvf_model_config_t, n_kv_heads), false},
        {"head_dim", offsetof(kvf_model_config_t, head_dim), false},
        {"intermediate_size", offsetof(kvf_model_config_t, inter), true},
        {"vocab_size", offsetof(kvf_model_config_t, vocab), true},
        {"max_position_embeddings", offsetof(kvf_model_config_t, max_pos), false},
    };
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
        int r = json_int(root, ints[i].key, (int *)((char *)cfg + ints[i].off));
        if (r == -1 && ints[i].required) {
            kvf_log_error("%s: \"%s\" is missing", path, ints[i].key);
            return KVF_ERR_FORMAT;
        }
        if (r < -1) {
            log_int_error(path, root, ints[i].key, r, "a non-negative integer");
            return KVF_ERR_FORMAT;
        }
    }
    if (cfg->n_kv_heads == 0)
        cfg->n_kv_heads = cfg->n_heads;
    if (cfg->head_dim == 0 && cfg->n_heads > 0)
        cfg->head_dim = cfg->hidden / cfg->n_heads;
    if (cfg->max_pos == 0)
        cfg->max_pos = 2048;
    cfg->rope_theta = 10000.0;
    cfg->rms_eps = 1e-6;
    if (json_double(root, "rope_theta", &cfg->rope_theta) == -2 ||
        json_double(root, "rms_norm_eps", &cfg->rms_eps) == -2) {
        kvf_log_error("%s: rope_theta and rms_norm_eps must be numbers", path);
        return KVF_ERR_FORMAT;
    }
    return KVF_OK;
}

/* The MLP's activation: hidden_act, silu by default; Gemma2 reads
 * hidden_activation first (what its MLP uses), gelu_pytorch_tanh by
 * default, and takes nothing else. */
static kvf_status_t parse_activation(kvf_model_config_t *cfg, const cJSON *root, const char *path)
{
    bool gemma = cfg->arch == KVF_ARCH_GEMMA2;
    const cJSON *act = gemma ? cJSON_GetObjectItemCaseSensitive(root, "hidden_activation") : NULL;
    const char *key = "hidden_activation";
    if (!cJSON_IsString(act)) {
        act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
        key = "hidden_act";
    }
    const char *want = gemma ? "gelu_pytorch_tanh" : "silu";
    if (cJSON_IsString(act) && strcmp(act->valuestring, want) != 0) {
        kvf_log_error("%s: %s '%s' is not supported (%s)", path, key, act->valuestring, want);
        return KVF_ERR_UNSUPPORTED;
    }
    cfg->act = gemma ? KVF_ACT_GELU_TANH : KVF_ACT_SILU;
    return KVF_OK;
}

/* Gemma2's attention scalar and soft-capping values (null: no capping). */
static kvf_status_t parse_gemma2(kvf_model_config_t *cfg, const cJSON *root, const char *path)
{
    if (cfg->arch != KVF_ARCH_GEMMA2)
        return KVF_OK;
    /* Hugging Face's defaults when a field is absent; null: no capping */
    cfg->attn_scalar = 256.0;
    cfg->attn_softcap = cJSON_GetObjectItemCaseSensitive(root, "attn_logit_softcapping") ? 0 : 50.0;
    cfg->final_softcap =
        cJSON_GetObjectItemCaseSensitive(root, "final_logit_softcapping") ? 0 : 30.0;
    if (json_double(root, "query_pre_attn_scalar", &cfg->attn_scalar) == -2 ||
        json_double(root, "attn_logit_softcapping", &cfg->attn_softcap) == -2 ||
        json_double(root, "final_logit_softcapping", &cfg->final_softcap) == -2 ||
        !(cfg->attn_scalar > 0) || cfg->attn_softcap < 0 || cfg->final_softcap < 0) {
        kvf_log_error("%s: query_pre_attn_scalar must be a positive number, the soft-capping "
                      "values null or non-negative numbers",
                      path);
        return KVF_ERR_FORMAT;
    }
    /* Gemma2 ties the LM head to the embedding unless the config says not */
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
    cfg->tie_embeddings = !cJSON_IsFalse(tie);
    return KVF_OK;
}

/* Tied embeddings, biases, the activation and the checkpoint's dtype. */
static kvf_status_t parse_features(kvf_model_config_t *cfg, const cJSON *root, const char *path)
{
    cfg->tie_embeddings =
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings"));
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "attention_bias")))
        cfg->qkv_bias = true;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "mlp_bias"))) {
        kvf_log_error("%s: mlp_bias is not supported", path);
        return KVF_ERR_UNSUPPORTED;
    }
    kvf_status_t st = parse_activation(cfg, root, path);
    if (st != KVF_OK)
        return st;
    const cJSON *td = cJSON_GetObjectItemCaseSensitive(root, "torch_dtype");
    cfg->dtype = KVF_DTYPE_F32;
    if (cJSON_IsString(td))
        (void)kvf_dtype_parse(td->valuestring, &cfg->dtype);
    return KVF_OK;
}

/* Whether layer l slides under (first, period): l >= first, and with
 * period 2 an even distance from first. */
static bool layer_slides(int first, int period, int l)
{
    return l >= first && (period <= 1 || (l - first) % period == 0);
}

/* layer_types, when given: "full_attention" or "sliding_attention" per
 * layer, in one of the patterns the config holds: the sliding layers
 * last (from *first_p on, *period_p 1; n_layers when none slides), or,
 * for Gemma2 only, every other layer from *first_p on (*period_p 2).
 * Other patterns are unsupported. */
static kvf_status_t parse_layer_types(const kvf_model_config_t *cfg, const cJSON *types,
                                      const char *path, int *first_p, int *period_p)
{
    int n = cJSON_GetArraySize(types), first = cfg->n_layers, i = 0;
    bool sliding[4096];
    const cJSON *e;
    if (!cJSON_IsArray(types) || n != cfg->n_layers || n > 4096)
        goto fail_pattern;
    cJSON_ArrayForEach(e, types)
    {
        sliding[i] = cJSON_IsString(e) && !strcmp(e->valuestring, "sliding_attention");
        if (!sliding[i] && !(cJSON_IsString(e) && !strcmp(e->valuestring, "full_attention")))
            goto fail_pattern;
        if (sliding[i] && first == cfg->n_layers)
            first = i;
        i++;
    }
    for (int period = 1; period <= (cfg->arch == KVF_ARCH_GEMMA2 ? 2 : 1); period++) {
        bool match = true;
        for (int l = 0; l < n && match; l++)
            match = sliding[l] == layer_slides(first, period, l);
        if (match) {
            *first_p = first;
            *period_p = period;
            return KVF_OK;
        }
    }
fail_pattern:
    kvf_log_error("%s: layer_types must list one full_attention or sliding_attention per layer, "
                  "the sliding layers last (Gemma2: or every other one)",
                  path);
    return KVF_ERR_UNSUPPORTED;
}

/* Sliding-window attention, as Hugging Face applies it: Mistral on every
 * layer whenever sliding_window is set; Qwen2 and Qwen3 only with
 * use_sliding_window, on the layers from max_window_layers (default 28)
 * on; Gemma2 on layers 0, 2, 4, ... (sliding_window 4096 when absent);
 * or on those layer_types marks sliding_attention. */
static kvf_status_t parse_sliding_window(kvf_model_config_t *cfg, const cJSON *root,
                                         const char *path)
{
    bool gemma = cfg->arch == KVF_ARCH_GEMMA2;
    int window = gemma ? 4096 : 0, first = 0, period = gemma ? 2 : 1;
    int r = json_int(root, "sliding_window", &window);
    if (r < -1) {
        log_int_error(path, root, "sliding_window", r, "null or a non-negative integer");
        return KVF_ERR_FORMAT;
    }
    bool qwen = cfg->arch == KVF_ARCH_QWEN2 || cfg->arch == KVF_ARCH_QWEN3;
    if (gemma && r == -1 && cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(root, "sliding_window")))
        window = 0; /* an explicit null: no window */
    bool on = window > 0 &&
              ((r == 0 && cfg->arch == KVF_ARCH_MISTRAL) || gemma ||
               (r == 0 && qwen &&
                cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "use_sliding_window"))));
    if (!on)
        return KVF_OK;
    if (qwen) {
        first = 28;
        r = json_int(root, "max_window_layers", &first);
        if (r < -1) {
            log_int_error(path, root, "max_window_layers", r, "a non-negative integer");
            return KVF_ERR_FORMAT;
        }
    }
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
    if (types && !cJSON_IsNull(types)) {
        kvf_status_t st = parse_layer_types(cfg, types, path, &first, &period);
        if (st != KVF_OK)
            return st;
    }
    if (first >= cfg->n_layers)
        return KVF_OK; /* no layer slides */
    cfg->sliding_window = window;
    cfg->window_first_layer = first;
    cfg->window_period = period;
    return KVF_OK;
}

int kvf_model_layer_window(const kvf_model_config_t *cfg, int layer)
{
    bool slides = layer_slides(cfg->window_first_layer, cfg->window_period, layer);
    return cfg->sliding_window > 0 && slides ? cfg->sliding_window : 0;
}

float kvf_model_attn_scale(const kvf_model_config_t *cfg)
{
    double base = cfg->attn_scalar > 0 ? cfg->attn_scalar : (double)cfg->head_dim;
    return (float)(1.0 / sqrt(base));
}

/* bos_token_id (sets it) and eos_token_id (adds to the list), as both
 * config.json and generation_config.json give them. */
static kvf_status_t parse_special_ids(kvf_model_config_t *cfg, const cJSON *root, const char *path)
{
    const cJSON *bos = cJSON_GetObjectItemCaseSensitive(root, "bos_token_id");
    if (cJSON_IsNumber(bos))
        cfg->bos_id = (int64_t)bos->valuedouble;
    return parse_eos(cfg, root, path);
}

/* Everything config.json says, then the geometry's validation. */
static kvf_status_t parse_config_json(kvf_model_config_t *cfg, const cJSON *root, const char *path)
{
    kvf_status_t st = parse_arch(cfg, root, path);
    if (st == KVF_OK)
        st = parse_geometry(cfg, root, path);
    if (st == KVF_OK)
        st = parse_features(cfg, root, path);
    if (st == KVF_OK)
        st = parse_rope_scaling(cfg, root, path);
    if (st == KVF_OK)
        st = parse_sliding_window(cfg, root, path);
    if (st == KVF_OK)
        st = parse_gemma2(cfg, root, path);
    if (st != KVF_OK)
        return st;
    st = parse_special_ids(cfg, root, path);
    if (st != KVF_OK)
        return st;
    return kvf_model_config_validate(cfg, path);
}

kvf_status_t kvf_model_config_load(const char *dir, kvf_model_config_t *cfg_p)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    cJSON *root;
    kvf_status_t st = kvf_model__read_json(path, &root);
    if (st == KVF_ERR_NOT_FOUND)
        kvf_log_error("%s: not found (is %s a Hugging Face model directory?)", path, dir);
    if (st != KVF_OK)
        return st;
    kvf_model_config_t cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.bos_id = -1;
    st = parse_config_json(&cfg, root, path);
    cJSON_Delete(root);
    if (st != KVF_OK)
        return st;

    /* generation_config.json (optional) adds EOS ids and may set BOS. */
    snprintf(path, sizeof(path), "%s/generation_config.json", dir);
    st = kvf_model__read_json(path, &root);
    if (st == KVF_ERR_NOT_FOUND)
        st = KVF_OK;
    else if (st == KVF_OK) {
        st = parse_special_ids(&cfg, root, path);
        cJSON_Delete(root);
    }
    if (st != KVF_OK)
        return st;
    *cfg_p = cfg;
    return KVF_OK;
}
