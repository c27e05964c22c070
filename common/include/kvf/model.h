/* Llama-family decoder models from a Hugging Face model directory.
 *
 * Reads config.json, generation_config.json (EOS ids) and the weights in
 * model.safetensors or the shards named by model.safetensors.index.json.
 * Architectures: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM
 * (q/k/v biases), Qwen3ForCausalLM (per-head RMSNorm of q and k before
 * RoPE), with GQA/MQA, an explicit head_dim, tied embeddings, rope_scaling
 * "linear" or "llama3" and sliding-window attention (Mistral's
 * sliding_window; Qwen2/Qwen3 use_sliding_window for the layers from
 * max_window_layers on), and Gemma2ForCausalLM (embeddings scaled by
 * sqrt(hidden_size), RMSNorm weights applied as 1 + w, a norm after the
 * attention and after the MLP as well as before each, a GeGLU MLP, the
 * attention scaled by query_pre_attn_scalar^-0.5, soft-capped attention
 * and final logits, the sliding window on every other layer from layer 0,
 * tied embeddings). Weights (F32, F16, BF16) are converted
 * to f32 once, into two slab allocations that every tensor points into:
 * the projections in one (which a backend holding its own copy drops), the
 * embedding, norms and biases in the other.
 *
 * A loaded model is immutable: any number of threads may read it. */
#ifndef KVF_MODEL_H
#define KVF_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvf/dtype.h"
#include "kvf/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KVF_ARCH_LLAMA = 0,
    KVF_ARCH_MISTRAL = 1,
    KVF_ARCH_QWEN2 = 2,
    KVF_ARCH_QWEN3 = 3,
    KVF_ARCH_GEMMA2 = 4,
} kvf_arch_t;

/* The MLP's activation: silu(gate) * up or gelu_tanh(gate) * up. */
typedef enum {
    KVF_ACT_SILU = 0,      /* hidden_act "silu": SwiGLU */
    KVF_ACT_GELU_TANH = 1, /* "gelu_pytorch_tanh": GeGLU with the tanh gelu (Gemma2) */
} kvf_act_t;

#define KVF_MODEL_MAX_EOS 8

typedef enum {
    KVF_ROPE_SCALING_NONE = 0,
    KVF_ROPE_SCALING_LINEAR = 1, /* positions divided by factor */
    KVF_ROPE_SCALING_LLAMA3 = 2, /* Llama 3.1 frequency-dependent scaling */
} kvf_rope_scaling_t;

/* Geometry and special ids: what config.json and generation_config.json
 * say. Plain data; the router loads only this (kvf_model_config_load). */
typedef struct {
    kvf_arch_t arch;
    char arch_name[64];      /* "LlamaForCausalLM", ... */
    int n_layers;            /* num_hidden_layers */
    int hidden;              /* hidden_size */
    int n_heads;             /* num_attention_heads */
    int n_kv_heads;          /* num_key_value_heads (= n_heads when absent) */
    int head_dim;            /* head_dim (= hidden / n_heads when absent) */
    int inter;               /* intermediate_size */
    int vocab;               /* vocab_size */
    int max_pos;             /* max_position_embeddings */
    double rope_theta;
    double rms_eps;          /* rms_norm_eps */
    kvf_rope_scaling_t rope_scaling;
    double rope_factor;      /* linear and llama3 */
    double rope_low_freq_factor, rope_high_freq_factor; /* llama3 */
    int rope_orig_max_pos;   /* llama3: original_max_position_embeddings */
    bool tie_embeddings;     /* tie_word_embeddings: lm_head = embed_tokens */
    bool qkv_bias;           /* Qwen2, or attention_bias */
    bool qk_norm;            /* Qwen3: q_norm / k_norm (head_dim) on each head before RoPE */
    int sliding_window;      /* 0: none; else a query at p sees keys > p - sliding_window */
    int window_first_layer;  /* the window applies to layers >= this (Qwen max_window_layers) */
    int window_period;       /* 0 or 1: to every layer from window_first_layer on; 2: to every
                                other one (Gemma2: layers 0, 2, 4, ...) */
    kvf_act_t act;           /* hidden_act (Gemma2: hidden_activation) */
    bool embed_scale;        /* Gemma2: embeddings times sqrt(hidden_size), rounded to float */
    bool norm_plus_one;      /* Gemma2: RMSNorms multiply by 1 + weight (folded in at load) */
    bool sandwich_norms;     /* Gemma2: post_attention_layernorm on the attention output and
                                post_feedforward_layernorm on the MLP's, before each residual add */
    double attn_scalar;      /* query_pre_attn_scalar: scores scaled by its -1/2; 0: head_dim */
    double attn_softcap;     /* attn_logit_softcapping: scores cap * tanh(s / cap); 0: none */
    double final_softcap;    /* final_logit_softcapping: logits alike; 0: none */
    kvf_dtype_t dtype;       /* torch_dtype, informational */
    int64_t bos_id;          /* -1 when none */
    int64_t eos_ids[KVF_MODEL_MAX_EOS]; /* config.json and generation_config.json, merged */
    int n_eos;
} kvf_model_config_t;

/* One decoder layer. Every pointer points into the model's slab. q, k and v
 * rows are adjacent (one matrix wqkv), so are gate and up (wgu). */
typedef struct {
    float *attn_norm; /* (hidden) input_layernorm */
    float *wqkv;      /* (q_dim + 2*kv_dim, hidden): rows of wq, then wk, then wv */
    float *wq;        /* (q_dim, hidden), q_dim = n_heads * head_dim; = wqkv */
    float *wk;        /* (kv_dim, hidden), kv_dim = n_kv_heads * head_dim */
    float *wv;        /* (kv_dim, hidden) */
    float *bqkv;      /* (q_dim + 2*kv_dim) q/k/v biases, NULL without qkv_bias */
    float *q_norm;    /* (head_dim) self_attn.q_norm, NULL without qk_norm */
    float *k_norm;    /* (head_dim) self_attn.k_norm, NULL without qk_norm */
    float *wo;        /* (hidden, q_dim) o_proj */
    float *post_attn_norm; /* (hidden) Gemma2 post_attention_layernorm, else NULL */
    float *ffn_norm;  /* (hidden) post_attention_layernorm (Gemma2: pre_feedforward_layernorm) */
    float *post_ffn_norm; /* (hidden) Gemma2 post_feedforward_layernorm, else NULL */
    float *wgu;       /* (2*inter, hidden): rows of gate_proj, then up_proj */
    float *wdown;     /* (hidden, inter) down_proj */
} kvf_layer_weights_t;

typedef struct kvf_model {
    kvf_model_config_t cfg;
    float *slab;              /* embedding, norms, biases: f32, one allocation */
    size_t slab_bytes;
    float *mslab;             /* projections (wqkv, wo, wgu, wdown, an untied lm_head) */
    size_t mslab_bytes;
    kvf_dtype_t matrix_dtype; /* the projections' type in the files (f32 if mixed) */
    bool matrices_dropped;    /* kvf_model_drop_matrices() ran */
    float *embed;             /* (vocab, hidden) embed_tokens */
    kvf_layer_weights_t *layers; /* (n_layers) */
    float *final_norm;        /* (hidden) model.norm */
    float *lm_head;           /* (vocab, hidden); = embed when tied */
    double *rope_inv_freq;    /* (head_dim / 2) rotation angle per position, per pair */
    char fingerprint[17];     /* 16 hex digits, NUL-terminated */
} kvf_model_t;

/* Reads <dir>/config.json and <dir>/generation_config.json (optional) into
 * *cfg_p: no weights. Unknown architectures are KVF_ERR_UNSUPPORTED, bad
 * files KVF_ERR_FORMAT / KVF_ERR_NOT_FOUND, logged with the file name. */
kvf_status_t kvf_model_config_load(const char *dir, kvf_model_config_t *cfg_p);

/* Checks a config's geometry (positive sizes, heads divisible by kv heads,
 * even head_dim, ...). Logs what is wrong, naming source (a file name). */
kvf_status_t kvf_model_config_validate(const kvf_model_config_t *cfg, const char *source);

/* Loads config and weights. A missing tensor, wrong shape or dtype, or a
 * truncated file is an error naming the file and the tensor. Logs progress
 * when stderr is a terminal and the model is large. On success *model_p is
 * owned by the caller: kvf_model_destroy(). */
kvf_status_t kvf_model_load(const char *dir, kvf_model_t **model_p);

/* Frees the model; NULL is a no-op. */
void kvf_model_destroy(kvf_model_t *model);

/* Frees the host copy of the weights once a backend holds its own (the
 * CUDA backend after its upload): config, rotation frequencies and
 * fingerprint stay; every weight pointer becomes NULL and the weight bytes
 * 0. Nothing may compute on the model's host weights afterwards. */
void kvf_model_drop_weights(kvf_model_t *model);

/* Frees the f32 projections once a backend holds its own copy (the CPU
 * backend's panels, after kvf_engine_create bound the model): every
 * projection pointer becomes NULL, and so does lm_head unless it is the
 * embedding; the embedding, norms and biases stay. Only a backend with
 * bind_model may compute on the model afterwards. */
void kvf_model_drop_matrices(kvf_model_t *model);

/* 16 hex digits identifying the model: a hash of the config geometry and
 * every safetensors header. Nodes compare fingerprints to be sure they
 * serve the same weights. Owned by the model. */
const char *kvf_model_fingerprint(const kvf_model_t *model);

/* The attention window of layer l: 0 for full causal attention, else W
 * (a query at position p attends to keys at positions p - W + 1 .. p). */
int kvf_model_layer_window(const kvf_model_config_t *cfg, int layer);

/* The factor attention scores are multiplied by: query_pre_attn_scalar^-1/2
 * when the config has one, else head_dim^-1/2 (in double, then float). */
float kvf_model_attn_scale(const kvf_model_config_t *cfg);

/* True when id is one of the config's EOS ids. */
bool kvf_model_is_eos(const kvf_model_config_t *cfg, int64_t id);

/* Bytes of f32 weights the model holds (both slabs). */
size_t kvf_model_weight_bytes(const kvf_model_t *model);

/* Writes config.json, generation_config.json and model.safetensors with
 * random weights (N(0, scale^2)-ish uniform values, norms near 1) for cfg
 * into dir, which must exist. Deterministic in seed. For tests, demos and
 * benchmarks. dtype: F32, F16 or BF16 weights. */
kvf_status_t kvf_model_write_random(const char *dir, const kvf_model_config_t *cfg,
                                    kvf_dtype_t dtype, uint64_t seed);

/* Weight statistics closer to a trained model's, for measurements that
 * depend on them (KV cache quantization); all zero: the plain random
 * weights above. */
typedef struct {
    bool heavy_tails;       /* matrices: Laplace draws (kurtosis 6) of the same
                               variance instead of uniform ones */
    float kv_outlier_scale; /* > 0: in every kv head, K's two slowest rotary
                               pairs' channels scaled by this and by half of it
                               (trained models' K holds a few large channels) */
    float v_channel_spread; /* > 0: every V channel scaled by exp(spread * u),
                               u uniform in [-1, 1) */
} kvf_model_random_opts_t;

/* kvf_model_write_random with opts (NULL: none). */
kvf_status_t kvf_model_write_random_opts(const char *dir, const kvf_model_config_t *cfg,
                                         kvf_dtype_t dtype, uint64_t seed,
                                         const kvf_model_random_opts_t *opts);

#ifdef __cplusplus
}
#endif

#endif
