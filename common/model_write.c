/* A random-weight model directory (kvf_model_write_random): config.json,
 * generation_config.json and model.safetensors, deterministic in the seed.
 * See kvf/model.h. */
#include "model_internal.h"

#include "kvf/log.h"
#include "kvf/safetensors.h"
#include "kvf/sampling.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Uniform in [-1, 1). */
static float rand_sym(uint64_t *state)
{
    return (float)((double)(kvf_splitmix64(state) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

/* A number, or null for 0 (Gemma2's "no soft-capping"). */
static void add_number_or_null(cJSON *root, const char *key, double v)
{
    if (v > 0)
        cJSON_AddNumberToObject(root, key, v);
    else
        cJSON_AddNullToObject(root, key);
}

/* Gemma2's fields: the activation, attention scalar, soft-capping and the
 * alternating layer_types (sliding on even layers). */
static void add_gemma2_config(cJSON *root, const kvf_model_config_t *c)
{
    cJSON_AddStringToObject(root, "hidden_act", "gelu_pytorch_tanh");
    cJSON_AddStringToObject(root, "hidden_activation", "gelu_pytorch_tanh");
    cJSON_AddNumberToObject(root, "query_pre_attn_scalar",
                            c->attn_scalar > 0 ? c->attn_scalar : c->head_dim);
    add_number_or_null(root, "attn_logit_softcapping", c->attn_softcap);
    add_number_or_null(root, "final_logit_softcapping", c->final_softcap);
    if (c->sliding_window <= 0) {
        cJSON_AddNullToObject(root, "sliding_window");
        return;
    }
    cJSON *types = cJSON_AddArrayToObject(root, "layer_types");
    for (int l = 0; l < c->n_layers; l++)
        cJSON_AddItemToArray(types, cJSON_CreateString(kvf_model_layer_window(c, l)
                                                           ? "sliding_attention"
                                                           : "full_attention"));
}

static kvf_status_t write_config_json(const char *dir, const kvf_model_config_t *c,
                                      kvf_dtype_t dtype)
{
    static const char *arch_names[] = {"LlamaForCausalLM", "MistralForCausalLM",
                                       "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                                       "Gemma2ForCausalLM"};
    static const char *model_types[] = {"llama", "mistral", "qwen2", "qwen3", "gemma2"};
    char path[4096];
    kvf_status_t st = KVF_OK;
    cJSON *root = cJSON_CreateObject();
    cJSON *archs = cJSON_AddArrayToObject(root, "architectures");
    cJSON_AddItemToArray(archs, cJSON_CreateString(arch_names[c->arch]));
    cJSON_AddStringToObject(root, "model_type", model_types[c->arch]);
    cJSON_AddNumberToObject(root, "num_hidden_layers", c->n_layers);
    cJSON_AddNumberToObject(root, "hidden_size", c->hidden);
    cJSON_AddNumberToObject(root, "num_attention_heads", c->n_heads);
    cJSON_AddNumberToObject(root, "num_key_value_heads", c->n_kv_heads);
    cJSON_AddNumberToObject(root, "head_dim", c->head_dim);
    cJSON_AddNumberToObject(root, "intermediate_size", c->inter);
    cJSON_AddNumberToObject(root, "vocab_size", c->vocab);
    cJSON_AddNumberToObject(root, "max_position_embeddings", c->max_pos);
    cJSON_AddNumberToObject(root, "rope_theta", c->rope_theta);
    cJSON_AddNumberToObject(root, "rms_norm_eps", c->rms_eps);
    cJSON_AddBoolToObject(root, "tie_word_embeddings", c->tie_embeddings);
    if (c->arch != KVF_ARCH_QWEN2)
        cJSON_AddBoolToObject(root, "attention_bias", c->qkv_bias);
    if (c->sliding_window > 0) {
        cJSON_AddNumberToObject(root, "sliding_window", c->sliding_window);
        if (c->arch == KVF_ARCH_QWEN2 || c->arch == KVF_ARCH_QWEN3) {
            cJSON_AddBoolToObject(root, "use_sliding_window", true);
            cJSON_AddNumberToObject(root, "max_window_layers", c->window_first_layer);
        }
    }
    if (c->arch == KVF_ARCH_GEMMA2)
        add_gemma2_config(root, c);
    else
        cJSON_AddStringToObject(root, "hidden_act", "silu");
    cJSON_AddStringToObject(root, "torch_dtype",
                            dtype == KVF_DTYPE_F32   ? "float32"
                            : dtype == KVF_DTYPE_F16 ? "float16"
                                                     : "bfloat16");
    if (c->bos_id >= 0)
        cJSON_AddNumberToObject(root, "bos_token_id", (double)c->bos_id);
    if (c->n_eos > 0)
        cJSON_AddNumberToObject(root, "eos_token_id", (double)c->eos_ids[0]);
    for (int pass = 0; pass < 2 && st == KVF_OK; pass++) {
        if (pass == 1) {
            cJSON_Delete(root);
            root = cJSON_CreateObject();
            if (c->bos_id >= 0)
                cJSON_AddNumberToObject(root, "bos_token_id", (double)c->bos_id);
            cJSON *eos = cJSON_AddArrayToObject(root, "eos_token_id");
            for (int i = 0; i < c->n_eos; i++)
                cJSON_AddItemToArray(eos, cJSON_CreateNumber((double)c->eos_ids[i]));
        }
        snprintf(path, sizeof(path), "%s/%s", dir,
                 pass == 0 ? "config.json" : "generation_config.json");
        char *text = cJSON_Print(root);
        FILE *fp = text ? fopen(path, "w") : NULL;
        if (!fp || fputs(text, fp) < 0 || fputc('\n', fp) == EOF) {
            kvf_log_error("%s: cannot write: %m", path);
            st = text ? KVF_ERR_IO : KVF_ERR_NOMEM;
        }
        if (fp && fclose(fp) != 0)
            st = KVF_ERR_IO;
        free(text);
    }
    cJSON_Delete(root);
    return st;
}

/* How a random tensor's values are drawn. */
typedef enum {
    RANDOM_MATRIX, /* uniform(-sqrt(3/cols), sqrt(3/cols)): unit-variance outputs */
    RANDOM_NORM,   /* 1 + uniform(-0.1, 0.1) */
    RANDOM_BIAS,   /* uniform(-0.1, 0.1) */
    RANDOM_EMBED,  /* uniform(-1, 1) */
} random_kind_t;

/* The tensors of a random model, filled in the file's order. */
typedef struct {
    kvf_st_write_t *t; /* (cap) */
    char (*names)[96]; /* (cap) */
    void **bufs;       /* (cap) the tensors' data */
    int n, cap;
    kvf_dtype_t dtype;
    uint64_t rng;
    kvf_model_random_opts_t opts;
} random_tensors_t;

/* One draw of a matrix element: uniform in [-1, 1), or with heavy tails a
 * Laplace draw of the same variance (1/3), from the same single draw. */
static float draw(random_tensors_t *r, random_kind_t kind)
{
    float u = rand_sym(&r->rng);
    if (kind != RANDOM_MATRIX || !r->opts.heavy_tails)
        return u;
    float m = fabsf(u) < 0.999999f ? fabsf(u) : 0.999999f;
    return copysignf(-logf(1.0f - m) / sqrtf(6.0f), u);
}

/* Appends tensor name_fmt (formatted with layer), rows x cols (cols 0: a
 * vector) of the given kind, drawing from the generator in element order;
 * row r (element r of a vector) multiplied by row_scale[r] unless that is
 * NULL. */
static kvf_status_t add_random_tensor_scaled(random_tensors_t *r, const char *name_fmt, int layer,
                                             int64_t rows, int64_t cols, random_kind_t kind,
                                             const float *row_scale)
{
    KVF_ASSERT(r->n < r->cap);
    int n = r->n;
    snprintf(r->names[n], sizeof(r->names[n]), name_fmt, layer);
    size_t cnt = (size_t)rows * (size_t)(cols ? cols : 1);
    r->bufs[n] = malloc(cnt * kvf_dtype_size(r->dtype));
    if (!r->bufs[n])
        return KVF_ERR_NOMEM;
    float scale = kind == RANDOM_MATRIX ? sqrtf(3.0f / (float)(cols ? cols : 1))
                  : kind == RANDOM_NORM ? 0.1f
                  : kind == RANDOM_BIAS ? 0.1f
                                        : 1.0f;
    for (size_t i = 0; i < cnt; i++) {
        float v = draw(r, kind) * scale + (kind == RANDOM_NORM ? 1.0f : 0.0f);
        if (row_scale)
            v *= row_scale[i / (size_t)(cols ? cols : 1)];
        if (r->dtype == KVF_DTYPE_F32)
            ((float *)r->bufs[n])[i] = v;
        else if (r->dtype == KVF_DTYPE_BF16)
            ((uint16_t *)r->bufs[n])[i] = kvf_f32_to_bf16(v);
        else
            ((uint16_t *)r->bufs[n])[i] = kvf_f32_to_f16(v);
    }
    r->t[n] = (kvf_st_write_t){.name = r->names[n],
                               .dtype = r->dtype,
                               .ndim = cols ? 2 : 1,
                               .shape = {rows, cols},
                               .data = r->bufs[n]};
    r->n++;
    return KVF_OK;
}

static kvf_status_t add_random_tensor(random_tensors_t *r, const char *name_fmt, int layer,
                                      int64_t rows, int64_t cols, random_kind_t kind)
{
    return add_random_tensor_scaled(r, name_fmt, layer, rows, cols, kind, NULL);
}

/* The row scales of K and V under opts (NULL: none). K: in every kv head,
 * the last two channels of each rotary half (the slowest-turning pairs)
 * times kv_outlier_scale and half of it; on the k_norm weight with
 * qk_norm (which would undo row scales of k_proj), else on k_proj's rows
 * (and its bias). V: every row times exp(v_channel_spread * u), u uniform
 * in [-1, 1), from a generator of its own. */
static kvf_status_t kv_row_scales(random_tensors_t *r, const kvf_model_config_t *c, int layer,
                                  float **k_p, float **v_p)
{
    const int hd = c->head_dim, kv_dim = c->n_kv_heads * hd;
    const kvf_model_random_opts_t *o = &r->opts;
    *k_p = *v_p = NULL;
    if (o->kv_outlier_scale > 0 && hd >= 8) {
        int n = c->qk_norm ? hd : kv_dim;
        float *k = malloc((size_t)n * sizeof(float));
        if (!k)
            return KVF_ERR_NOMEM;
        for (int i = 0; i < n; i++) {
            int ch = i % hd, in_half = ch % (hd / 2);
            k[i] = in_half == hd / 2 - 1   ? o->kv_outlier_scale
                   : in_half == hd / 2 - 2 ? 0.5f * o->kv_outlier_scale
                                           : 1.0f;
        }
        *k_p = k;
    }
    if (o->v_channel_spread > 0) {
        float *v = malloc((size_t)kv_dim * sizeof(float));
        if (!v)
            return KVF_ERR_NOMEM;
        uint64_t rng = 0x76726f7773ull + (uint64_t)layer; /* "vrows" */
        for (int i = 0; i < kv_dim; i++)
            v[i] = expf(o->v_channel_spread * rand_sym(&rng));
        *v_p = v;
    }
    return KVF_OK;
}

/* One decoder layer's tensors, in checkpoint order. */
static kvf_status_t add_random_layer(random_tensors_t *r, const kvf_model_config_t *c, int l)
{
    int64_t q_dim = (int64_t)c->n_heads * c->head_dim,
            kv_dim = (int64_t)c->n_kv_heads * c->head_dim;
    /* Gemma2 norms scale by 1 + w: weights near 0 */
    const random_kind_t norm = c->norm_plus_one ? RANDOM_BIAS : RANDOM_NORM;
    const struct {
        const char *fmt;
        int64_t rows, cols;
        random_kind_t kind;
        char only; /* 'b': only with qkv_bias, 'n': only with qk_norm, 's': sandwich_norms */
    } layer[] = {
        {"model.layers.%d.input_layernorm.weight", c->hidden, 0, norm, 0},
        {"model.layers.%d.self_attn.q_proj.weight", q_dim, c->hidden, RANDOM_MATRIX, 0},
        {"model.layers.%d.self_attn.k_proj.weight", kv_dim, c->hidden, RANDOM_MATRIX, 0},
        {"model.layers.%d.self_attn.v_proj.weight", kv_dim, c->hidden, RANDOM_MATRIX, 0},
        {"model.layers.%d.self_attn.q_proj.bias", q_dim, 0, RANDOM_BIAS, 'b'},
        {"model.layers.%d.self_attn.k_proj.bias", kv_dim, 0, RANDOM_BIAS, 'b'},
        {"model.layers.%d.self_attn.v_proj.bias", kv_dim, 0, RANDOM_BIAS, 'b'},
        {"model.layers.%d.self_attn.q_norm.weight", c->head_dim, 0, RANDOM_NORM, 'n'},
        {"model.layers.%d.self_attn.k_norm.weight", c->head_dim, 0, RANDOM_NORM, 'n'},
        {"model.layers.%d.self_attn.o_proj.weight", c->hidden, q_dim, RANDOM_MATRIX, 0},
        {"model.layers.%d.post_attention_layernorm.weight", c->hidden, 0, norm, 0},
        {"model.layers.%d.pre_feedforward_layernorm.weight", c->hidden, 0, norm, 's'},
        {"model.layers.%d.post_feedforward_layernorm.weight", c->hidden, 0, norm, 's'},
        {"model.layers.%d.mlp.gate_proj.weight", c->inter, c->hidden, RANDOM_MATRIX, 0},
        {"model.layers.%d.mlp.up_proj.weight", c->inter, c->hidden, RANDOM_MATRIX, 0},
        {"model.layers.%d.mlp.down_proj.weight", c->hidden, c->inter, RANDOM_MATRIX, 0},
    };
    float *k_scale, *v_scale;
    kvf_status_t st = kv_row_scales(r, c, l, &k_scale, &v_scale);
    for (size_t i = 0; i < sizeof(layer) / sizeof(layer[0]) && st == KVF_OK; i++) {
        if ((layer[i].only == 'b' && !c->qkv_bias) || (layer[i].only == 'n' && !c->qk_norm) ||
            (layer[i].only == 's' && !c->sandwich_norms))
            continue;
        const char *f = layer[i].fmt;
        bool is_k = strstr(f, c->qk_norm ? ".k_norm." : ".k_proj.") != NULL;
        bool is_v = strstr(f, ".v_proj.") != NULL;
        st = add_random_tensor_scaled(r, f, l, layer[i].rows, layer[i].cols, layer[i].kind,
                                      is_k ? k_scale : is_v ? v_scale : NULL);
    }
    free(k_scale);
    free(v_scale);
    return st;
}

/* Every tensor of the model, in checkpoint order. */
static kvf_status_t add_random_model(random_tensors_t *r, const kvf_model_config_t *c)
{
    kvf_status_t st =
        add_random_tensor(r, "model.embed_tokens.weight%.0d", 0, c->vocab, c->hidden, RANDOM_EMBED);
    for (int l = 0; l < c->n_layers && st == KVF_OK; l++)
        st = add_random_layer(r, c, l);
    if (st == KVF_OK)
        st = add_random_tensor(r, "model.norm.weight%.0d", 0, c->hidden, 0,
                               c->norm_plus_one ? RANDOM_BIAS : RANDOM_NORM);
    if (st == KVF_OK && !c->tie_embeddings)
        st = add_random_tensor(r, "lm_head.weight%.0d", 0, c->vocab, c->hidden, RANDOM_MATRIX);
    return st;
}

kvf_status_t kvf_model_write_random(const char *dir, const kvf_model_config_t *cfg,
                                    kvf_dtype_t dtype, uint64_t seed)
{
    return kvf_model_write_random_opts(dir, cfg, dtype, seed, NULL);
}

kvf_status_t kvf_model_write_random_opts(const char *dir, const kvf_model_config_t *cfg,
                                         kvf_dtype_t dtype, uint64_t seed,
                                         const kvf_model_random_opts_t *opts)
{
    kvf_status_t st = kvf_model_config_validate(cfg, dir);
    if (st != KVF_OK)
        return st;
    if (dtype == KVF_DTYPE_UNKNOWN)
        return KVF_ERR_INVAL;
    st = write_config_json(dir, cfg, dtype);
    if (st != KVF_OK)
        return st;
    random_tensors_t r = {.cap = 3 + 14 * cfg->n_layers, .dtype = dtype, .rng = seed};
    if (opts)
        r.opts = *opts;
    r.t = calloc((size_t)r.cap, sizeof(*r.t));
    r.names = calloc((size_t)r.cap, sizeof(*r.names));
    r.bufs = calloc((size_t)r.cap, sizeof(*r.bufs));
    if (!r.t || !r.names || !r.bufs)
        st = KVF_ERR_NOMEM;
    if (st == KVF_OK)
        st = add_random_model(&r, cfg);
    if (st == KVF_OK) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/model.safetensors", dir);
        st = kvf_safetensors_write(path, r.t, (size_t)r.n);
    }
    for (int i = 0; i < r.n && r.bufs; i++)
        free(r.bufs[i]);
    free(r.bufs);
    free(r.names);
    free(r.t);
    return st;
}
