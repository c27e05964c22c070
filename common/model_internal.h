/* Private to the model files (kvf/model.h):
 *
 *   model_config.c  config.json and generation_config.json: geometry,
 *                   RoPE scaling, special ids; validation
 *   model_load.c    the safetensors shards and the weights: the slab plan,
 *                   conversion to f32, the fingerprint; dropping weights
 *   model_check.c   the tensors of a checkpoint the config does not account for
 *   model_write.c   a random-weight model directory (kvf_model_write_random) */
#ifndef KVF_MODEL_INTERNAL_H
#define KVF_MODEL_INTERNAL_H

#include "kvf/model.h"
#include "kvf/safetensors.h"

#include <cjson/cJSON.h>

/* Parses a JSON file of a model directory (at most 64 MiB). A missing file
 * is KVF_ERR_NOT_FOUND and not logged (some are optional); other errors
 * are logged. On success *root_p is owned by the caller (cJSON_Delete). */
kvf_status_t kvf_model__read_json(const char *path, cJSON **root_p);

/* Refuses a checkpoint holding tensors the model does not use: of layers
 * beyond cfg's n_layers, or any other besides the used ones (n_used, from
 * any of the n_shards shards) but RoPE tables and a tied LM head. Each
 * kind is logged once, naming the first few tensors and counting them:
 * KVF_ERR_FORMAT. KVF_OK when every tensor is accounted for. */
kvf_status_t kvf_model__check_unused(kvf_safetensors_t *const *shards, int n_shards,
                                     const kvf_st_tensor_t *const *used, int n_used,
                                     const kvf_model_config_t *cfg, const char *dir);

#endif
