/* Private to the model files (kvf/model.h):
 *
 *   model_config.c  config.json and generation_config.json: geometry,
 *                   RoPE scaling, special ids; validation
 *   model_load.c    the safetensors shards and the weights: the slab plan,
 *                   conversion to f32, the fingerprint; dropping weights
 *   model_write.c   a random-weight model directory (kvf_model_write_random) */
#ifndef KVF_MODEL_INTERNAL_H
#define KVF_MODEL_INTERNAL_H

#include "kvf/model.h"

#include <cjson/cJSON.h>

/* Parses a JSON file of a model directory (at most 64 MiB). A missing file
 * is KVF_ERR_NOT_FOUND and not logged (some are optional); other errors
 * are logged. On success *root_p is owned by the caller (cJSON_Delete). */
kvf_status_t kvf_model__read_json(const char *path, cJSON **root_p);

#endif
